/* The trainers' data-parallel layer: fm_ddp (gradient buckets) or fm_zero (ZeRO-1)
 * wired into fm_train_step through its hooks.
 *
 * Plain data parallel: each rank runs forward and backward on its part of the batch;
 * the buckets' post-accumulate hooks start their all-reduces during the backward of
 * the last micro-batch only (earlier micro-batches only accumulate: reducing them
 * would move the gradients grad_accum times), and after_backward waits for the rest,
 * so every rank clips and steps with the same averaged gradients.
 *
 * ZeRO-1: after_backward reduce-scatters the gradients into the sharded optimizer
 * (which then clips with the global norm and steps its part), after_update
 * all-gathers the parameters. The reduce-scatter is blocking: it starts once
 * backward is over, so none of it overlaps. The step's parameter list (what the fp16
 * loss scaler unscales) becomes the sharded optimizer's views: the full gradients are
 * gone after the reduce-scatter, this rank's part of the averaged one is in them.
 *
 * fp16: grads_ready sums the ranks' found-inf flags, so that every rank skips the same
 * steps (under ZeRO-1 each checks only its own shard of the gradient). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "fathom/autograd.h"
#include "fathom/nn.h"
#include "fathom/ops.h"

struct fm_dist_trainer {
    fm_dist *d;
    fm_train_step *ts;
    int zero;
    fm_ddp *ddp;
    fm_zero *z;
    fm_optim *full;              /* ts's optimizer before ZeRO replaced it */
    fm_tensor *const *full_params; /* and its parameter list */
    int full_n;
    fm_tensor **views;           /* ZeRO-1: the sharded optimizer's parameters (ts's list) */
    fm_train_hooks hooks;        /* ours, on ts */
    const fm_train_hooks *inner; /* what ts had */
    int64_t grad_bytes, zero_steps;
    double zero_comm_s;
    int64_t zero_sent;
};

static fm_status dt_micro_begin(void *user, int k, int n) {
    fm_dist_trainer *t = user;
    if (t->ddp) fm_ddp_set_overlap(t->ddp, k == n - 1);
    return t->inner && t->inner->micro_begin ? t->inner->micro_begin(t->inner->user, k, n) : FM_OK;
}

static fm_status dt_to_device(void *user, fm_tensor **x, fm_tensor **y) {
    fm_dist_trainer *t = user;
    return t->inner && t->inner->to_device ? t->inner->to_device(t->inner->user, x, y) : FM_OK;
}

/* The ZeRO collectives' time and bytes, from the communicator's totals. */
static fm_status zero_timed(fm_dist_trainer *t, fm_status (*fn)(fm_zero *)) {
    fm_dist_stats a, b;
    fm_dist_stats_get(t->d, &a);
    double t0 = dist_now();
    fm_status st = fn(t->z);
    t->zero_comm_s += dist_now() - t0;
    fm_dist_stats_get(t->d, &b);
    t->zero_sent += b.bytes_sent - a.bytes_sent;
    return st;
}

static fm_status dt_after_backward(void *user, fm_optim *opt) {
    fm_dist_trainer *t = user;
    fm_status st = t->ddp ? fm_ddp_sync(t->ddp) : zero_timed(t, fm_zero_reduce_grads);
    if (st == FM_OK && t->inner && t->inner->after_backward) st = t->inner->after_backward(t->inner->user, opt);
    return st;
}

static fm_status dt_grads_ready(void *user, fm_optim *opt) {
    fm_dist_trainer *t = user;
    if (t->ts->scaler.enabled) { /* fp16: skipped by every rank or by none */
        double inf = t->ts->scaler.found_inf ? 1 : 0;
        if (fm_dist_allreduce_sum_f64(t->d, &inf, 1) != FM_OK) return fm_last_status();
        t->ts->scaler.found_inf = inf > 0;
    }
    return t->inner && t->inner->grads_ready ? t->inner->grads_ready(t->inner->user, opt) : FM_OK;
}

static fm_status dt_after_update(void *user, fm_optim *opt, bool stepped) {
    fm_dist_trainer *t = user;
    fm_status st = FM_OK;
    if (t->z) {
        /* a step skipped (fp16's scaler, the same on every rank) leaves the parameters as they
         * were on every rank: gather anyway, the same on all ranks */
        st = zero_timed(t, fm_zero_gather_params);
        t->zero_steps++;
    }
    if (st == FM_OK && t->inner && t->inner->after_update) st = t->inner->after_update(t->inner->user, opt, stepped);
    return st;
}

static fm_status broadcast_params(fm_dist_trainer *t) {
    for (int i = 0; i < t->ts->n_params; i++) {
        fm_tensor *p = t->ts->params[i];
        if (p->dtype != FM_F32 || !fm_tensor_is_contiguous(p))
            return fm_set_error(FM_ERR_UNSUPPORTED, "data parallel: parameter %d is not a contiguous f32 tensor", i);
        if (fm_tensor_device(p).type == FM_DEV_CUDA && !fm_dist_uses_nccl(t->d) && !t->d->staged)
            return fm_set_error(FM_ERR_UNSUPPORTED, "data parallel: parameter %d is on a GPU but the ranks have no NCCL "
                                "communicator (fm_dist_use_device; FATHOM_DIST_NCCL=0 sends its collectives "
                                "through host copies instead)", i);
        if (fm_dist_broadcast_tensor(t->d, p, 0) != FM_OK) return fm_last_status();
    }
    return FM_OK;
}

/* ZeRO-1: ts steps the sharded optimizer, and its parameter list is that optimizer's views. */
static fm_status zero_views(fm_dist_trainer *t) {
    fm_optim *o = fm_zero_optim(t->z);
    const int n = fm_optim_param_count(o);
    if (!(t->views = calloc((size_t)n + 1, sizeof *t->views))) return fm_set_error(FM_ERR_OOM, "zero: out of memory");
    for (int i = 0; i < n; i++)
        if (fm_optim_param_at(o, i, NULL, &t->views[i], NULL) != FM_OK) return fm_last_status();
    t->ts->opt = o;
    t->ts->params = t->views;
    t->ts->n_params = n;
    return FM_OK;
}

fm_dist_trainer *fm_dist_trainer_new(fm_dist *d, fm_train_step *ts, int zero, size_t bucket_bytes) {
    if (!d || !ts || !ts->opt || ts->n_params < 1) {
        fm_set_error(FM_ERR_INVALID, "data parallel: need a communicator and an initialized train step");
        return NULL;
    }
    if (zero != 0 && zero != 1) {
        fm_set_error(FM_ERR_INVALID, "--zero %d: only stage 1 (optimizer state sharding) or 0 (off) exist", zero);
        return NULL;
    }
    fm_dist_trainer *t = calloc(1, sizeof *t);
    if (!t) { fm_set_error(FM_ERR_OOM, "data parallel: out of memory"); return NULL; }
    t->d = d;
    t->ts = ts;
    t->zero = zero;
    t->full = ts->opt;
    t->full_params = ts->params;
    t->full_n = ts->n_params;
    for (int i = 0; i < ts->n_params; i++) t->grad_bytes += fm_tensor_numel(ts->params[i]) * (int64_t)sizeof(float);
    fm_status st = broadcast_params(t); /* the same start on every rank, whatever each one's init did */
    if (st == FM_OK && zero) {
        if (!(t->z = fm_zero_new(d, ts->opt))) st = fm_last_status();
        else st = zero_views(t);
    } else if (st == FM_OK && !(t->ddp = fm_ddp_new(d, ts->n_params, ts->params, bucket_bytes))) {
        st = fm_last_status();
    }
    if (st != FM_OK) { fm_dist_trainer_free(t); return NULL; }
    t->inner = ts->hooks;
    t->hooks = (fm_train_hooks){.user = t, .to_device = dt_to_device, .micro_begin = dt_micro_begin,
                                .after_backward = dt_after_backward, .grads_ready = dt_grads_ready,
                                .after_update = dt_after_update};
    ts->hooks = &t->hooks;
    return t;
}

void fm_dist_trainer_free(fm_dist_trainer *t) {
    if (!t) return;
    if (t->ts && t->ts->hooks == &t->hooks) t->ts->hooks = t->inner;
    if (t->z && t->ts && t->ts->opt == fm_zero_optim(t->z)) t->ts->opt = t->full;
    if (t->views && t->ts && t->ts->params == (fm_tensor *const *)t->views) {
        t->ts->params = t->full_params;
        t->ts->n_params = t->full_n;
    }
    free(t->views);
    fm_ddp_free(t->ddp);
    fm_zero_free(t->z);
    free(t);
}

fm_zero *fm_dist_trainer_zero(fm_dist_trainer *t) { return t ? t->z : NULL; }

fm_optim *fm_dist_trainer_optim(fm_dist_trainer *t) { return t ? (t->z ? fm_zero_optim(t->z) : t->full) : NULL; }

void fm_dist_trainer_begin_step(fm_dist_trainer *t, int64_t local_rows, int64_t global_rows) {
    if (!t) return;
    /* (N * local / global) * mean over local = N * (sum over local) / global; the average over
     * ranks then divides by N. Exactly 1 when the batch splits evenly. */
    int64_t num = (int64_t)t->d->size * local_rows;
    t->ts->loss_weight = global_rows > 0 && num != global_rows ? (double)num / (double)global_rows : 1.0;
}

fm_status fm_dist_trainer_reduce_loss(fm_dist_trainer *t, double *loss, int64_t local_rows, int64_t global_rows) {
    if (!t || !loss || global_rows < 1) return fm_set_error(FM_ERR_INVALID, "data parallel: bad loss reduction arguments");
    double v = local_rows > 0 ? *loss * (double)local_rows : 0.0;
    if (fm_dist_allreduce_sum_f64(t->d, &v, 1) != FM_OK) return fm_last_status();
    *loss = v / (double)global_rows;
    return FM_OK;
}

fm_status fm_dist_trainer_full_state(fm_dist_trainer *t, fm_named_list *out) {
    if (!t || !out) return fm_set_error(FM_ERR_INVALID, "data parallel: NULL state argument");
    if (t->z) return fm_zero_full_state(t->z, out);
    fm_status st = fm_optim_init_state(t->full);
    return st ? st : fm_optim_state(t->full, out);
}

fm_status fm_dist_trainer_load_full_state(fm_dist_trainer *t, const fm_named_list *full) {
    if (!t || !full) return fm_set_error(FM_ERR_INVALID, "data parallel: NULL state argument");
    if (t->z) return fm_zero_load_full_state(t->z, full);
    fm_named_list mine;
    fm_status st = fm_optim_init_state(t->full);
    if (st == FM_OK) st = fm_optim_state(t->full, &mine);
    if (st) return st;
    for (int i = 0; i < mine.n && st == FM_OK; i++) {
        int k = fm_named_list_find(full, mine.items[i].name);
        if (k < 0) st = fm_set_error(FM_ERR_FORMAT, "optimizer state '%s' is missing", mine.items[i].name);
        else if (fm_tensor_numel(full->items[k].tensor) != fm_tensor_numel(mine.items[i].tensor))
            st = fm_set_error(FM_ERR_FORMAT, "optimizer state '%s' does not match its parameter", mine.items[i].name);
        else if (fm_tensor_data(full->items[k].tensor) != fm_tensor_data(mine.items[i].tensor)) /* not itself */
            st = fm_copy_(mine.items[i].tensor, full->items[k].tensor);
    }
    fm_named_list_free(&mine);
    return st;
}

void fm_dist_trainer_report(fm_dist_trainer *t, fm_dist_report *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    out->world_size = 1;
    if (!t) return;
    out->world_size = t->d->size;
    out->zero = t->zero;
    out->grad_bytes = t->grad_bytes;
    if (t->ddp) {
        fm_ddp_stats s;
        fm_ddp_stats_get(t->ddp, &s);
        out->buckets = fm_ddp_bucket_count(t->ddp);
        out->steps = s.steps;
        out->comm_seconds = s.comm_seconds;
        out->exposed_seconds = s.exposed_seconds;
        out->overlapped_fraction = s.overlapped_fraction;
        out->bytes_sent = s.bytes_sent;
    } else {
        out->steps = t->zero_steps;
        out->comm_seconds = out->exposed_seconds = t->zero_comm_s;
        out->bytes_sent = t->zero_sent;
    }
    fm_named_list l;
    fm_optim *o = fm_dist_trainer_optim(t);
    if (fm_optim_state(o, &l) == FM_OK) {
        for (int i = 0; i < l.n; i++) out->optimizer_state_bytes += fm_tensor_numel(l.items[i].tensor) *
                                                                  (int64_t)fm_dtype_size(l.items[i].tensor->dtype);
        fm_named_list_free(&l);
    }
}
