/* Data parallel: gradient buckets all-reduced while backward goes on.
 *
 * Parameters are packed into buckets of about bucket_bytes, last parameters
 * first: backward produces their gradients first, so the first bucket fills while
 * most of backward is still ahead. Autograd hands a leaf its gradient as soon as
 * its last contribution is in (src/autograd/engine.c); the post-accumulate hook
 * copies it into the bucket, and the bucket's all-reduce is started when its last
 * gradient arrives. Each hook also polls the all-reduces in flight (MPI progresses
 * non-blocking transfers inside MPI calls). fm_ddp_sync waits for the rest and
 * copies the averages back into the parameters' .grad.
 *
 * A gradient that arrives again after its bucket was started (a parameter used
 * inside and outside a checkpointed segment gets two hand-overs) marks the bucket
 * late; fm_ddp_sync then reduces that bucket again from the final gradients.
 *
 * Parameters on a device: with NCCL (CUDA, fm_dist_use_device) each bucket is a
 * buffer on the GPU, gradients are copied into it on the compute stream and its
 * all-reduce is queued on NCCL's stream behind them (nccl.c); on any other device
 * (the check device) the bucket stays on the host and the gradients go through
 * the backend's copies, so the result is the CPU path's bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "fathom/autograd.h"
#include "fathom/ops.h" /* fm_contiguous */

typedef struct ddp_param {
    struct fm_ddp *owner;
    fm_tensor *p;
    int bucket;
    int64_t offset, numel; /* in the bucket's buffer */
    bool ready;
} ddp_param;

typedef struct ddp_bucket {
    float *buf;       /* the bucket in host memory (MPI), or NULL under NCCL */
    fm_tensor *dbuf;  /* NCCL: the bucket on the parameters' GPU */
    void *done;       /* NCCL: the event after its all-reduce */
    int64_t n;
    int n_params, n_ready;
    bool started, late;
    char name[48];
    dist_work w;
} ddp_bucket;

struct fm_ddp {
    fm_dist *d;
    int n, nb;
    ddp_param *params;
    ddp_bucket *buckets;
    bool overlap;
    fm_status deferred; /* an error inside a hook, reported by fm_ddp_sync */
    char deferred_msg[512];
    fm_ddp_stats stats;
};

static void ddp_hook(fm_tensor *t, void *ctx);

static fm_status plan_buckets(fm_ddp *p, size_t bucket_bytes) {
    int64_t cap = (int64_t)(bucket_bytes / sizeof(float)), fill = 0;
    if (cap < 1) cap = 1;
    p->buckets = calloc((size_t)p->n, sizeof *p->buckets);
    if (!p->buckets) return fm_set_error(FM_ERR_OOM, "ddp: out of memory");
    p->nb = 0;
    for (int i = p->n - 1; i >= 0; i--) { /* last parameters first */
        if (p->nb == 0 || fill >= cap) { p->nb++; fill = 0; }
        ddp_bucket *b = &p->buckets[p->nb - 1];
        ddp_param *q = &p->params[i];
        q->bucket = p->nb - 1;
        q->offset = b->n;
        b->n += q->numel;
        b->n_params++;
        fill += q->numel;
    }
    fm_device dev = fm_tensor_device(p->params[0].p);
    bool nccl = dev.type == FM_DEV_CUDA && p->d->nccl;
    for (int k = 0; k < p->nb; k++) {
        ddp_bucket *b = &p->buckets[k];
        snprintf(b->name, sizeof b->name, "all-reduce of bucket %d", k);
        if (nccl) {
            int64_t len = b->n ? b->n : 1;
            if (!(b->dbuf = fm_tensor_empty(1, &len, FM_F32, dev))) return fm_last_status();
            continue;
        }
        b->buf = malloc(sizeof(float) * (size_t)(b->n ? b->n : 1));
        if (!b->buf) return fm_set_error(FM_ERR_OOM, "ddp: out of memory for a bucket of %lld values", (long long)b->n);
    }
    return FM_OK;
}

fm_ddp *fm_ddp_new(fm_dist *d, int n_params, fm_tensor *const *params, size_t bucket_bytes) {
    if (!d || n_params < 1 || !params) { fm_set_error(FM_ERR_INVALID, "ddp: need a communicator and parameters"); return NULL; }
    for (int i = 0; i < n_params; i++) {
        if (!params[i] || params[i]->dtype != FM_F32 || !fm_tensor_is_contiguous(params[i]) ||
            !fm_tensor_is_leaf(params[i]) || !params[i]->requires_grad) {
            fm_set_error(FM_ERR_UNSUPPORTED, "ddp: parameter %d must be a contiguous f32 leaf that requires grad", i);
            return NULL;
        }
        if (!fm_device_eq(fm_tensor_device(params[i]), fm_tensor_device(params[0]))) {
            fm_set_error(FM_ERR_UNSUPPORTED, "ddp: parameters 0 and %d are on different devices", i);
            return NULL;
        }
    }
    fm_ddp *p = calloc(1, sizeof *p);
    if (!p) { fm_set_error(FM_ERR_OOM, "ddp: out of memory"); return NULL; }
    p->d = d;
    p->n = n_params;
    p->overlap = true;
    p->params = calloc((size_t)n_params, sizeof *p->params);
    if (!p->params) { free(p); fm_set_error(FM_ERR_OOM, "ddp: out of memory"); return NULL; }
    for (int i = 0; i < n_params; i++) {
        p->params[i].owner = p;
        p->params[i].p = fm_tensor_retain(params[i]);
        p->params[i].numel = fm_tensor_numel(params[i]);
    }
    fm_status st = plan_buckets(p, bucket_bytes ? bucket_bytes : (size_t)25 << 20);
    int hooked = 0;
    for (; st == FM_OK && hooked < n_params; hooked++)
        st = fm_tensor_register_post_accumulate_hook(params[hooked], ddp_hook, &p->params[hooked]);
    if (st != FM_OK) {
        for (int i = 0; i < hooked; i++) fm_tensor_remove_post_accumulate_hook(params[i], ddp_hook, &p->params[i]);
        p->n = hooked = 0;
        for (int i = 0; i < n_params; i++) fm_tensor_release(p->params[i].p);
        fm_ddp_free(p);
        return NULL;
    }
    return p;
}

void fm_ddp_free(fm_ddp *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        fm_tensor_remove_post_accumulate_hook(p->params[i].p, ddp_hook, &p->params[i]);
        fm_tensor_release(p->params[i].p);
    }
    bool broken = p->d && p->d->broken; /* MPI may still write into pending buffers */
    for (int k = 0; k < p->nb && p->buckets && !broken; k++) {
        dist_work_free(&p->buckets[k].w);
        free(p->buckets[k].buf);
        dist_nccl_event_free(p->buckets[k].done);
        fm_tensor_release(p->buckets[k].dbuf);
    }
    if (!broken) free(p->buckets);
    free(p->params);
    free(p);
}

void fm_ddp_set_overlap(fm_ddp *p, bool on) {
    if (p) p->overlap = on;
}
int fm_ddp_bucket_count(const fm_ddp *p) { return p ? p->nb : 0; }

/* A gradient on a device: into the device bucket (NCCL) or copied to the host one. */
static fm_status copy_grad_in_device(ddp_bucket *b, ddp_param *q) {
    fm_tensor *g = q->p->grad;
    if (!b->dbuf) {
        if (g && fm_tensor_numel(g) == q->numel) return fm_tensor_copy_to_host(g, b->buf + q->offset, FM_F32);
        memset(b->buf + q->offset, 0, sizeof(float) * (size_t)q->numel);
        return FM_OK;
    }
    fm_tensor *dst = fm_narrow(b->dbuf, 0, q->offset, q->numel), *src = NULL;
    fm_status st = !dst ? fm_last_status() : FM_OK;
    if (st == FM_OK && g && fm_tensor_numel(g) == q->numel) {
        src = fm_reshape(g, 1, &q->numel);
        st = src ? fm_copy_(dst, src) : fm_last_status();
    } else if (st == FM_OK) {
        st = fm_zero_(dst);
    }
    fm_tensor_release_n(2, dst, src);
    return st;
}

static fm_status copy_grad_in(ddp_bucket *b, ddp_param *q) {
    if (b->dbuf || fm_tensor_device(q->p).type != FM_DEV_CPU) return copy_grad_in_device(b, q);
    float *dst = b->buf + q->offset;
    fm_tensor *g = q->p->grad;
    if (!g) { memset(dst, 0, sizeof(float) * (size_t)q->numel); return FM_OK; }
    fm_tensor *c = fm_tensor_is_contiguous(g) ? fm_tensor_retain(g) : fm_contiguous(g);
    if (c && c->dtype == FM_F32 && fm_tensor_numel(c) == q->numel) memcpy(dst, fm_tensor_data(c), sizeof(float) * (size_t)q->numel);
    else memset(dst, 0, sizeof(float) * (size_t)q->numel);
    fm_tensor_release(c);
    return FM_OK;
}

static fm_status start_bucket(fm_ddp *p, ddp_bucket *b) {
    dist_work_free(&b->w);
    memset(&b->w, 0, sizeof b->w);
    b->w.kind = DIST_ALLREDUCE;
    b->w.average = true;
    b->w.what = b->name;
    b->started = true;
    /* each rank sends its N-1 foreign chunks, then its reduced chunk to N-1 peers */
    if (p->d->size > 1) p->stats.bytes_sent += 2 * (int64_t)(p->d->size - 1) * ((b->n + p->d->size - 1) / p->d->size) * 4;
    if (!b->dbuf) return dist_work_start(&b->w, p->d, b->buf, b->buf, b->n);
    /* NCCL: queued after the gradients on the compute stream; w keeps the timing only */
    dist_nccl_event_free(b->done);
    b->done = NULL;
    b->w.t_start = dist_now();
    b->w.phase = 1;
    return dist_nccl_allreduce_avg_start(p->d, fm_tensor_data(b->dbuf), b->n, b->name, &b->done);
}

static bool bucket_test(fm_ddp *p, ddp_bucket *b) {
    if (!b->dbuf) return dist_work_test(&b->w);
    if (b->w.phase < 3 && dist_nccl_test(p->d, b->done)) {
        b->w.phase = 3;
        b->w.t_done = dist_now();
    }
    return b->w.phase == 3;
}

static fm_status bucket_wait(fm_ddp *p, ddp_bucket *b) {
    if (!b->dbuf) return dist_work_wait(&b->w);
    fm_status st = dist_nccl_wait(p->d, b->done, b->name);
    if (st == FM_OK && b->w.phase < 3) {
        b->w.phase = 3;
        b->w.t_done = dist_now();
    }
    return st;
}

static void poll_buckets(fm_ddp *p) {
    for (int k = 0; k < p->nb; k++)
        if (p->buckets[k].started && p->buckets[k].w.phase < 3) bucket_test(p, &p->buckets[k]);
}

static void ddp_hook(fm_tensor *t, void *ctx) {
    (void)t;
    ddp_param *q = ctx;
    fm_ddp *p = q->owner;
    if (!p->overlap || p->deferred != FM_OK) return;
    ddp_bucket *b = &p->buckets[q->bucket];
    if (q->ready) { /* a second hand-over in one backward */
        if (b->started) b->late = true;
        else if (copy_grad_in(b, q) != FM_OK) goto fail;
        return;
    }
    q->ready = true;
    if (copy_grad_in(b, q) != FM_OK) goto fail;
    if (++b->n_ready == b->n_params && start_bucket(p, b) != FM_OK) {
        p->deferred = fm_last_status();
        snprintf(p->deferred_msg, sizeof p->deferred_msg, "%s", fm_last_error());
    }
    poll_buckets(p);
    return;
fail:
    p->deferred = fm_last_status();
    snprintf(p->deferred_msg, sizeof p->deferred_msg, "%s", fm_last_error());
}

/* Starts every bucket not started yet (gradients that never came count as zeros),
 * in bucket order, which is the same on every rank. */
static fm_status start_rest(fm_ddp *p) {
    for (int k = 0; k < p->nb; k++) {
        ddp_bucket *b = &p->buckets[k];
        if (b->started && !b->late) continue;
        if (b->started && bucket_wait(p, b) != FM_OK) return fm_last_status();
        for (int i = 0; i < p->n; i++)
            if (p->params[i].bucket == k && (!p->params[i].ready || b->late) && copy_grad_in(b, &p->params[i]) != FM_OK)
                return fm_last_status();
        b->late = false;
        if (start_bucket(p, b) != FM_OK) return fm_last_status();
    }
    return FM_OK;
}

static fm_status copy_back(fm_ddp *p) {
    for (int i = 0; i < p->n; i++) {
        ddp_param *q = &p->params[i];
        ddp_bucket *b = &p->buckets[q->bucket];
        fm_tensor *g = q->p->grad;
        if (!g || !fm_tensor_is_contiguous(g) || g->dtype != FM_F32 || g->storage->refcount > 1) {
            fm_tensor *ng = fm_tensor_empty_like(q->p);
            if (!ng) return fm_last_status();
            fm_tensor_release(q->p->grad);
            q->p->grad = g = ng;
        }
        fm_status st = FM_OK;
        if (b->dbuf) { /* NCCL: device to device, queued after the all-reduce (dist_nccl_wait) */
            fm_tensor *src = fm_narrow(b->dbuf, 0, q->offset, q->numel), *dst = src ? fm_view(g, 1, &q->numel) : NULL;
            st = dst ? fm_copy_(dst, src) : fm_last_status();
            fm_tensor_release_n(2, src, dst);
        } else if (fm_tensor_device(g).type != FM_DEV_CPU) {
            st = dist_from_host(g, b->buf + q->offset, FM_F32);
        } else {
            memcpy(fm_tensor_data(g), b->buf + q->offset, sizeof(float) * (size_t)q->numel);
        }
        if (st != FM_OK) return st;
    }
    return FM_OK;
}

fm_status fm_ddp_sync(fm_ddp *p) {
    if (!p) return fm_set_error(FM_ERR_INVALID, "ddp sync: NULL");
    double t0 = dist_now();
    fm_status st = p->deferred;
    if (st != FM_OK) fm_set_error(st, "%s", p->deferred_msg);
    if (st == FM_OK) st = start_rest(p);
    for (int k = 0; k < p->nb && st == FM_OK; k++) st = bucket_wait(p, &p->buckets[k]);
    double t1 = dist_now();
    if (st == FM_OK) st = copy_back(p);
    for (int k = 0; k < p->nb; k++) {
        ddp_bucket *b = &p->buckets[k];
        if (b->started && b->w.t_done > 0) p->stats.comm_seconds += b->w.t_done - b->w.t_start;
        p->stats.bytes_reduced += b->n * (int64_t)sizeof(float);
        b->started = b->late = false;
        b->n_ready = 0;
    }
    for (int i = 0; i < p->n; i++) p->params[i].ready = false;
    p->deferred = FM_OK;
    p->stats.exposed_seconds += t1 - t0;
    p->stats.steps++;
    return st;
}

fm_status fm_ddp_broadcast_params(fm_ddp *p) {
    if (!p) return fm_set_error(FM_ERR_INVALID, "ddp broadcast: NULL");
    for (int i = 0; i < p->n; i++)
        if (fm_dist_broadcast_tensor(p->d, p->params[i].p, 0) != FM_OK) return fm_last_status();
    return FM_OK;
}

void fm_ddp_stats_get(const fm_ddp *p, fm_ddp_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!p) return;
    *out = p->stats;
    double f = p->stats.comm_seconds > 0 ? 1.0 - p->stats.exposed_seconds / p->stats.comm_seconds : 0;
    out->overlapped_fraction = f < 0 ? 0 : f > 1 ? 1 : f;
}
