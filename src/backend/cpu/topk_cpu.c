/* CPU kernel for topk: the k first elements of every line along the axis, in the output's
 * order (larger or smaller first; NaN above every number; equal values lower index first).
 *
 * A line's candidates are keyed exactly (float dtypes as f64, integers as i64). Small k keeps
 * a heap of the k best seen so far (n log k), then sorts those; k near n sorts the line. The
 * order is total (value, then index), so every method and thread count gives one answer. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/dtype_internal.h"
#include "core/parallel.h"

typedef struct tk_item {
    union { double f; int64_t n; } v;
    int64_t i; /* position along the axis */
} tk_item;

/* > 0 when a ranks above b (NaN above every number, NaNs equal). */
static inline int rank_f(double a, double b) {
    bool na = a != a, nb = b != b;
    if (na || nb) return (int)na - (int)nb;
    return (a > b) - (a < b);
}
static inline int by_index(const tk_item *a, const tk_item *b) { return (a->i > b->i) - (a->i < b->i); }

/* qsort orders: negative when a comes first in the output. */
static int first_fl(const void *p, const void *q) { /* floats, largest first */
    int r = rank_f(((const tk_item *)p)->v.f, ((const tk_item *)q)->v.f);
    return r ? -r : by_index(p, q);
}
static int first_fs(const void *p, const void *q) { /* floats, smallest first */
    int r = rank_f(((const tk_item *)p)->v.f, ((const tk_item *)q)->v.f);
    return r ? r : by_index(p, q);
}
static int first_il(const void *p, const void *q) { /* integers, largest first */
    int64_t a = ((const tk_item *)p)->v.n, b = ((const tk_item *)q)->v.n;
    return a != b ? (a < b) - (a > b) : by_index(p, q);
}
static int first_is(const void *p, const void *q) { /* integers, smallest first */
    int64_t a = ((const tk_item *)p)->v.n, b = ((const tk_item *)q)->v.n;
    return a != b ? (a > b) - (a < b) : by_index(p, q);
}

typedef int (*tk_cmp)(const void *, const void *);

typedef struct topk_job {
    const char *x;
    char *val;
    int64_t *idx;
    fm_dtype dt;
    size_t es;
    bool fl;
    int64_t n, k, inner;
    tk_cmp cmp;
    atomic_int oom; /* a task could not allocate its line buffer */
} topk_job;

static inline tk_item load_item(const topk_job *j, const char *p, int64_t i) {
    tk_item t = {.i = i};
    if (j->fl) t.v.f = fm_load_f64(p, j->dt);
    else t.v.n = fm_load_i64(p, j->dt);
    return t;
}

/* The heap holds the k best so far with the one that comes last on top. */
static void heap_up(tk_item *h, int64_t c, tk_cmp cmp) {
    while (c > 0) {
        int64_t p = (c - 1) / 2;
        if (cmp(&h[p], &h[c]) >= 0) return;
        tk_item t = h[p];
        h[p] = h[c], h[c] = t, c = p;
    }
}
static void heap_down(tk_item *h, int64_t m, tk_cmp cmp) {
    for (int64_t p = 0;;) {
        int64_t c = 2 * p + 1;
        if (c >= m) return;
        if (c + 1 < m && cmp(&h[c], &h[c + 1]) < 0) c++;
        if (cmp(&h[p], &h[c]) >= 0) return;
        tk_item t = h[p];
        h[p] = h[c], h[c] = t, p = c;
    }
}

/* Line L's k first items into buf[0, k), in order. */
static void select_line(const topk_job *j, int64_t L, tk_item *buf) {
    const int64_t o = L / j->inner, in = L % j->inner, st = j->inner;
    const char *x = j->x + (size_t)(o * j->n * st + in) * j->es;
    if (j->k * 4 >= j->n) { /* most of the line: sort it whole */
        for (int64_t i = 0; i < j->n; i++) buf[i] = load_item(j, x + (size_t)(i * st) * j->es, i);
        qsort(buf, (size_t)j->n, sizeof *buf, j->cmp);
        return;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < j->n; i++) {
        tk_item t = load_item(j, x + (size_t)(i * st) * j->es, i);
        if (m < j->k) {
            buf[m] = t;
            heap_up(buf, m++, j->cmp);
        } else if (j->cmp(&t, &buf[0]) < 0) {
            buf[0] = t;
            heap_down(buf, m, j->cmp);
        }
    }
    qsort(buf, (size_t)m, sizeof *buf, j->cmp);
}

static void topk_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    topk_job *j = ctx;
    const int64_t st = j->inner;
    tk_item *buf = malloc(sizeof(tk_item) * (size_t)(j->n > 0 ? j->n : 1));
    if (!buf) {
        atomic_store(&j->oom, 1);
        return;
    }
    for (int64_t L = b; L < e; L++) {
        select_line(j, L, buf);
        const int64_t o = L / st, in = L % st;
        const char *x = j->x + (size_t)(o * j->n * st + in) * j->es;
        for (int64_t r = 0; r < j->k; r++) {
            int64_t to = (o * j->k + r) * st + in;
            memcpy(j->val + (size_t)to * j->es, x + (size_t)(buf[r].i * st) * j->es, j->es);
            j->idx[to] = buf[r].i;
        }
    }
    free(buf);
}

/* in = {x (contiguous)}, out = {values, indices i64}. */
static fm_status topk_kernel(const fm_op_call *c) {
    const fm_topk_attrs *a = c->attrs;
    fm_tensor *x = c->in[0];
    topk_job j = {.x = fm_tensor_data(x), .val = fm_tensor_data(c->out[0]), .idx = fm_tensor_data(c->out[1]), .dt = x->dtype,
                  .es = fm_dtype_size(x->dtype), .fl = fm_dtype_is_float(x->dtype), .n = x->shape[a->axis], .k = a->k, .inner = 1};
    for (int d = a->axis + 1; d < x->ndim; d++) j.inner *= x->shape[d];
    j.cmp = j.fl ? (a->largest ? first_fl : first_fs) : (a->largest ? first_il : first_is);
    int64_t lines = j.n ? fm_tensor_numel(x) / j.n : 0;
    if (!j.k || !lines) return FM_OK;
    atomic_init(&j.oom, 0);
    fm_parallel_for(lines, j.n * lines >= 32768 ? 1 : lines, topk_task, &j);
    if (atomic_load(&j.oom)) return fm_set_error(FM_ERR_OOM, "topk: out of host memory for a line of %lld elements", (long long)j.n);
    return FM_OK;
}

void fm_cpu_kernels_topk(fm_backend *b) { b->kernels[FM_OP_TOPK] = topk_kernel; }
