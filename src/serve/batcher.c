/* Dynamic batching: see batcher.h. One mutex per model version guards the queue
 * and every request's state; each request waits on its own condition variable. */
#include "serve/batcher.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fathom/ops.h"

enum { ST_QUEUED = 0, ST_RUNNING, ST_DONE };
#define MAX_TAKE 256 /* requests in one batch */

struct fm_batcher {
    fm_model_config cfg;
    fm_serve_stats *stats;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    fm_serve_req *head, *tail;
    int64_t queued;
    bool stop;
    bool lone; /* the last batch that waited out the delay held one request: the next ones do not wait */
    int n;
    fm_servable *inst[64];
    pthread_t th[64];
    bool started[64];
};

typedef struct inst_arg { fm_batcher *b; int i; } inst_arg;

int64_t fm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static struct timespec abs_ts(int64_t ns) {
    return (struct timespec){.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
}

static void cond_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

static void pending_add(fm_serve_stats *s, int64_t d) {
    pthread_mutex_lock(&s->mu);
    s->pending += d;
    pthread_mutex_unlock(&s->mu);
}

/* Under b->mu. */
static void finish(fm_serve_req *r, int status, const char *msg) {
    r->status = status;
    if (msg) snprintf(r->err, sizeof r->err, "%s", msg);
    r->state = ST_DONE;
    pthread_cond_broadcast(&r->cv);
}

/* Under b->mu: removes r (queued) from the queue. */
static void unlink_req(fm_batcher *b, fm_serve_req *r) {
    fm_serve_req **pp = &b->head, *prev = NULL;
    while (*pp && *pp != r) { prev = *pp; pp = &(*pp)->next; }
    if (!*pp) return;
    *pp = r->next;
    if (b->tail == r) b->tail = prev;
    b->queued--;
    pending_add(b->stats, -1);
}

static bool is_preferred(const fm_model_config *c, int64_t rows) {
    for (int i = 0; i < c->n_preferred; i++)
        if (c->preferred[i] == rows) return true;
    return false;
}

/* Whether r's inputs have q's per-sample shapes (every dim after the batch): requests
 * joined into one batch must, and with a model whose other dims are dynamic too (a
 * sequence length) they need not. */
static bool same_samples(const fm_serve_req *q, const fm_serve_req *r) {
    for (int i = 0; i < FM_SERVE_MAX_IO; i++) {
        const fm_tensor *a = q->in[i], *x = r->in[i];
        if (!a || !x) { if (a != x) return false; continue; }
        if (a->ndim != x->ndim || a->dtype != x->dtype) return false;
        for (int d = 1; d < a->ndim; d++)
            if (a->shape[d] != x->shape[d]) return false;
    }
    return true;
}

/* Under b->mu: how many requests from the head to run now (0: wait until *wake_ns).
 *
 * The wait for company is adaptive. A lone closed-loop client never has
 * company, so waiting the full delay only adds it to every request (p50 1.1 ms
 * against 0.5 ms without batching at a 500 us delay). So once a wait has ended
 * with one request, later requests run at once (b->lone); the waiting resumes
 * as soon as a batch of two or more forms, which happens without any wait when
 * requests queue up behind a running batch: with several clients the batches
 * come back by themselves, with one the delay is never paid again. */
static int choose(fm_batcher *b, int64_t now, int64_t *wake_ns) {
    const fm_model_config *c = &b->cfg;
    if (!c->dynamic_batching) return 1;
    int64_t rows = 0;
    int take = 0, best_pref = 0;
    bool full = false;
    for (fm_serve_req *r = b->head; r; r = r->next) {
        /* the first request of other per-sample shapes ends the batch (it heads the next: order kept) */
        if (take && !same_samples(b->head, r)) { full = true; break; }
        if (rows + r->rows > c->max_batch_size) { full = true; break; }
        rows += r->rows;
        take++;
        if (is_preferred(c, rows)) best_pref = take;
    }
    if (rows == c->max_batch_size) full = true;
    if (full) return take;
    if (best_pref) return best_pref;
    int64_t due = b->head->t_enqueue_ns + c->max_queue_delay_us * 1000;
    if (b->stop || now >= due || (b->lone && take == 1)) {
        if (take == 1 && !b->stop && c->max_queue_delay_us > 0) b->lone = true;
        return take;
    }
    *wake_ns = due;
    return 0;
}

/* Under b->mu: fails queued requests whose deadline has passed. */
static void expire(fm_batcher *b, int64_t now) {
    for (fm_serve_req *r = b->head, *nx; r; r = nx) {
        nx = r->next;
        if (r->deadline_ns && now >= r->deadline_ns) {
            unlink_req(b, r);
            finish(r, 503, "request timeout expired while queued");
        }
    }
}

static void fail_all(fm_serve_req **rs, int n, int status, const char *msg) {
    for (int i = 0; i < n; i++) finish(rs[i], status, msg);
}

/* Runs rs[0..n) as one batch (without b->mu); returns a message on failure. */
static const char *run_batch(fm_batcher *b, fm_servable *s, fm_serve_req **rs, int n, char *err, size_t errn) {
    int64_t t0 = fm_now_ns(), rows = 0;
    fm_tensor *in[FM_SERVE_MAX_IO] = {0}, *out[FM_SERVE_MAX_IO] = {0};
    fm_tensor *parts[MAX_TAKE];
    bool ok = true;
    for (int k = 0; k < n; k++) rows += rs[k]->rows;
    for (int i = 0; i < s->n_inputs && ok; i++) {
        if (n == 1) {
            in[i] = fm_tensor_retain(rs[0]->in[i]);
        } else {
            for (int k = 0; k < n; k++) parts[k] = rs[k]->in[i];
            in[i] = fm_cat(n, parts, 0);
        }
        ok = in[i] != NULL;
    }
    int64_t t1 = fm_now_ns();
    ok = ok && s->run(s, in, out) == FM_OK;
    int64_t t2 = fm_now_ns();
    const bool whole = b->cfg.max_batch_size == 0; /* unbatched: one request, its outputs whole */
    for (int j = 0; j < s->n_outputs && ok; j++)
        if (!out[j] || (!whole && (out[j]->ndim < 1 || out[j]->shape[0] != rows))) {
            fm_set_error(FM_ERR_INTERNAL, "output '%s' has %lld rows for a batch of %lld", s->outputs[j].name,
                         out[j] && out[j]->ndim ? (long long)out[j]->shape[0] : 0LL, (long long)rows);
            ok = false;
        }
    const char *msg = NULL;
    if (!ok) {
        snprintf(err, errn, "model execution failed: %s", fm_last_error());
        msg = err;
    } else {
        int64_t off = 0;
        for (int k = 0; k < n; k++) {
            for (int j = 0; j < s->n_outputs; j++)
                rs[k]->out[j] = whole ? fm_tensor_retain(out[j]) : fm_narrow(out[j], 0, off, rs[k]->rows);
            off += rs[k]->rows;
        }
    }
    for (int i = 0; i < FM_SERVE_MAX_IO; i++) fm_tensor_release_n(2, in[i], out[i]);
    int64_t t3 = fm_now_ns();
    if (ok) fm_serve_stats_exec(b->stats, (uint64_t)rows, (uint64_t)n, (uint64_t)(t1 - t0) / 1000, (uint64_t)(t2 - t1) / 1000,
                                (uint64_t)(t3 - t2) / 1000);
    return msg;
}

static void *instance_main(void *arg) {
    inst_arg *a = arg;
    fm_batcher *b = a->b;
    fm_servable *s = b->inst[a->i];
    free(a);
    fm_serve_req *rs[MAX_TAKE];
    char err[256];
    pthread_mutex_lock(&b->mu);
    for (;;) {
        int64_t now = fm_now_ns(), wake = 0;
        expire(b, now);
        if (!b->head) {
            if (b->stop) break;
            pthread_cond_wait(&b->cv_work, &b->mu);
            continue;
        }
        int n = choose(b, now, &wake);
        if (n == 0) {
            for (fm_serve_req *r = b->head; r; r = r->next)
                if (r->deadline_ns && r->deadline_ns < wake) wake = r->deadline_ns;
            struct timespec ts = abs_ts(wake);
            pthread_cond_timedwait(&b->cv_work, &b->mu, &ts);
            continue;
        }
        if (n > MAX_TAKE) n = MAX_TAKE;
        if (n >= 2) b->lone = false;
        for (int k = 0; k < n; k++) {
            rs[k] = b->head;
            b->head = rs[k]->next;
            rs[k]->state = ST_RUNNING;
            rs[k]->t_start_ns = now;
        }
        if (!b->head) b->tail = NULL;
        b->queued -= n;
        pending_add(b->stats, -n);
        pthread_mutex_unlock(&b->mu);
        const char *msg = run_batch(b, s, rs, n, err, sizeof err);
        pthread_mutex_lock(&b->mu);
        if (msg) fail_all(rs, n, 500, msg);
        else fail_all(rs, n, 200, NULL);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

fm_batcher *fm_batcher_start(const fm_model_config *c, fm_servable **instances, int n, fm_serve_stats *stats) {
    fm_batcher *b = calloc(1, sizeof *b);
    if (!b || n < 1 || n > 64) {
        for (int i = 0; i < n; i++) fm_servable_free(instances[i]);
        free(b);
        fm_set_error(FM_ERR_INVALID, "serve: cannot start a batcher with %d instances", n);
        return NULL;
    }
    b->cfg = *c;
    b->stats = stats;
    b->n = n;
    pthread_mutex_init(&b->mu, NULL);
    cond_init_mono(&b->cv_work);
    for (int i = 0; i < n; i++) b->inst[i] = instances[i];
    for (int i = 0; i < n; i++) {
        inst_arg *a = malloc(sizeof *a);
        if (a) *a = (inst_arg){b, i};
        b->started[i] = a && pthread_create(&b->th[i], NULL, instance_main, a) == 0;
        if (!b->started[i]) {
            free(a);
            fm_set_error(FM_ERR_INTERNAL, "serve: could not start instance thread %d", i);
            fm_batcher_stop(b);
            return NULL;
        }
    }
    return b;
}

int fm_batcher_submit(fm_batcher *b, fm_serve_req *r) {
    cond_init_mono(&r->cv);
    r->state = ST_QUEUED;
    r->next = NULL;
    r->t_enqueue_ns = fm_now_ns();
    pthread_mutex_lock(&b->mu);
    if (b->stop) {
        finish(r, 503, "the model version is unloading");
    } else if (b->cfg.max_queue_size > 0 && b->queued >= b->cfg.max_queue_size) {
        char m[96];
        snprintf(m, sizeof m, "Exceeds maximum queue size (%lld)", (long long)b->cfg.max_queue_size);
        finish(r, 503, m);
    } else {
        if (b->tail) b->tail->next = r;
        else b->head = r;
        b->tail = r;
        b->queued++;
        pending_add(b->stats, 1);
        pthread_cond_signal(&b->cv_work);
    }
    while (r->state != ST_DONE) {
        if (r->deadline_ns && r->state == ST_QUEUED) {
            struct timespec ts = abs_ts(r->deadline_ns);
            pthread_cond_timedwait(&r->cv, &b->mu, &ts);
            if (r->state == ST_QUEUED && fm_now_ns() >= r->deadline_ns) {
                unlink_req(b, r);
                finish(r, 503, "request timeout expired while queued");
            }
        } else {
            pthread_cond_wait(&r->cv, &b->mu);
        }
    }
    pthread_mutex_unlock(&b->mu);
    pthread_cond_destroy(&r->cv);
    return r->status;
}

void fm_batcher_stop(fm_batcher *b) {
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv_work);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n; i++)
        if (b->started[i]) pthread_join(b->th[i], NULL);
    for (int i = 0; i < b->n; i++) fm_servable_free(b->inst[i]);
    pthread_cond_destroy(&b->cv_work);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
