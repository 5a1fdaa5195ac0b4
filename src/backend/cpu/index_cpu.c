/* CPU kernels for cat, gather, scatter_add, scatter, scatter_nd, index_select, index_add and one_hot.
 *
 * Data movement (cat, gather, index_select) works for every dtype by element
 * size. The accumulating backwards (scatter_add, index_add) split work so that
 * each output element is owned by one task and sums in index order, so their
 * results do not depend on the thread count. Indices are validated in a serial
 * pass before anything is written. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/scalar_math.h"
#include "backend/scatter_nd.h"
#include "core/dtype_internal.h"
#include "core/parallel.h"

static fm_status index_error(const char *op, int64_t v, int axis, int64_t size) {
    return fm_set_error(FM_ERR_INVALID, "%s: index %" PRId64 " is out of range for axis %d with size %" PRId64
                        " (valid: 0..%" PRId64 ")", op, v, axis, size, size - 1);
}

static inline int64_t load_index(const void *p, fm_dtype dt, int64_t i) {
    switch (dt) {
    case FM_I64: return ((const int64_t *)p)[i];
    case FM_I32: return ((const int32_t *)p)[i];
    case FM_I8: return ((const int8_t *)p)[i];
    case FM_U8: return ((const uint8_t *)p)[i];
    default: return -1;
    }
}

/* First out-of-range index in [0, n), or -1 when all are in [0, size). */
static int64_t find_bad_index(const fm_tensor *idx, int64_t size) {
    int64_t n = fm_tensor_numel(idx);
    const void *p = fm_tensor_data(idx);
    if (idx->dtype == FM_I64) {
        const int64_t *q = p;
        for (int64_t i = 0; i < n; i++)
            if ((uint64_t)q[i] >= (uint64_t)size) return i;
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = load_index(p, idx->dtype, i);
        if (v < 0 || v >= size) return i;
    }
    return -1;
}

static inline void copy_elem(char *dst, const char *src, size_t es) {
    switch (es) {
    case 1: *dst = *src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, es); break;
    }
}

/* ------------------------------------------------------------------- cat */

typedef struct cat_job {
    const fm_op_call *c;
    int ax;
    int64_t outer;        /* product of dims before the axis */
    int64_t out_block;    /* out elements per outer index: out.shape[ax] * inner */
    int64_t inner;        /* product of dims after the axis */
    const int64_t *offs;  /* per input: start along the axis */
    size_t es;
} cat_job;

/* Copies one input's sub-block (dims ax..ndim-1 at outer index o) row-major to dst. The
 * destination is contiguous: inputs match the output in every dim after the axis. */
static void cat_copy_block(const fm_tensor *t, int ax, int64_t o, char *dst, size_t es) {
    int nd = t->ndim;
    const char *base = (const char *)fm_tensor_data(t);
    int64_t roff = 0, rem = o;
    for (int d = ax - 1; d >= 0; d--) { roff += (rem % t->shape[d]) * t->strides[d]; rem /= t->shape[d]; }
    int64_t last = t->shape[nd - 1], ls = t->strides[nd - 1], rows = 1;
    for (int d = ax; d < nd - 1; d++) rows *= t->shape[d];
    int64_t cnt[FM_MAX_DIMS] = {0};
    for (int64_t r = 0; r < rows; r++, dst += last * (int64_t)es) {
        const char *sp = base + roff * (int64_t)es;
        if (ls == 1) memcpy(dst, sp, (size_t)last * es);
        else
            for (int64_t k = 0; k < last; k++) copy_elem(dst + k * (int64_t)es, sp + k * ls * (int64_t)es, es);
        for (int d = nd - 2; d >= ax; d--) { /* advance the row counter over dims ax..nd-2 */
            roff += t->strides[d];
            if (++cnt[d] < t->shape[d]) break;
            roff -= cnt[d] * t->strides[d];
            cnt[d] = 0;
        }
    }
}

static void cat_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const cat_job *j = ctx;
    int n = j->c->n_in;
    for (int64_t it = b; it < e; it++) {
        int64_t o = it / n;
        int i = (int)(it % n);
        const fm_tensor *t = j->c->var_in[i];
        if (fm_tensor_numel(t) == 0) continue;
        char *dst = (char *)fm_tensor_data(j->c->out[0]) + (o * j->out_block + j->offs[i] * j->inner) * (int64_t)j->es;
        if (fm_tensor_is_contiguous(t)) {
            int64_t len = t->shape[j->ax] * j->inner;
            memcpy(dst, (const char *)fm_tensor_data(t) + o * len * (int64_t)j->es, (size_t)len * j->es);
        } else {
            cat_copy_block(t, j->ax, o, dst, j->es);
        }
    }
}

static fm_status cat_kernel(const fm_op_call *c) {
    const fm_axis_attrs *a = c->attrs;
    fm_tensor *y = c->out[0];
    int ax = a->axis, n = c->n_in;
    int64_t offs_small[64], *offs = offs_small;
    fm_tensor *offs_t = NULL;
    if (n > 64) {
        int64_t sh = n;
        if (!(offs_t = fm_tensor_empty(1, &sh, FM_I64, FM_CPU))) return fm_last_status();
        offs = fm_tensor_data(offs_t);
    }
    int64_t acc = 0;
    for (int i = 0; i < n; i++) { offs[i] = acc; acc += c->var_in[i]->shape[ax]; }
    cat_job j = {.c = c, .ax = ax, .offs = offs, .es = fm_dtype_size(y->dtype), .outer = 1, .inner = 1};
    for (int d = 0; d < ax; d++) j.outer *= y->shape[d];
    for (int d = ax + 1; d < y->ndim; d++) j.inner *= y->shape[d];
    j.out_block = y->shape[ax] * j.inner;
    int64_t per_item = j.out_block / (n ? n : 1);
    int64_t grain = ((int64_t)1 << 15) / (per_item > 0 ? per_item : 1);
    if (fm_tensor_numel(y) > 0) fm_parallel_for(j.outer * n, grain < 1 ? 1 : grain, cat_task, &j);
    fm_tensor_release(offs_t);
    return FM_OK;
}

/* ------------------------------------------------- gather / scatter_add */

/* Geometry of a "line": all elements sharing every coordinate but the axis.
 * idx/src/out-of-gather use the index's shape; the input (or scatter target)
 * its own shape. Both are contiguous (these ops are not FM_OPF_STRIDED). */
typedef struct line_geom {
    int ndim, ax;
    const int64_t *ishape, *tshape;
    int64_t tstride[FM_MAX_DIMS];
    int64_t inner;          /* product of index dims after the axis */
    int64_t A;              /* index size along the axis */
    int64_t T;              /* input size along the axis */
} line_geom;

static void line_geom_init(line_geom *g, const fm_tensor *t, const fm_tensor *idx, int ax) {
    g->ndim = idx->ndim;
    g->ax = ax;
    g->ishape = idx->shape;
    g->tshape = t->shape;
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) { g->tstride[d] = s; s *= t->shape[d]; }
    g->inner = 1;
    for (int d = ax + 1; d < idx->ndim; d++) g->inner *= idx->shape[d];
    g->A = idx->ndim ? idx->shape[ax] : 1;
    g->T = t->ndim ? t->shape[ax] : 1;
}

/* Offsets of line L's first element: in index-shaped arrays and in the input. */
static void line_offsets(const line_geom *g, int64_t L, int64_t *ioff, int64_t *toff) {
    int64_t o = L / g->inner, r = L % g->inner;
    int64_t ti = 0;
    for (int d = g->ndim - 1; d > g->ax; d--) { ti += (r % g->ishape[d]) * g->tstride[d]; r /= g->ishape[d]; }
    for (int d = g->ax - 1; d >= 0; d--) { ti += (o % g->ishape[d]) * g->tstride[d]; o /= g->ishape[d]; }
    *ioff = (L / g->inner) * g->A * g->inner + L % g->inner;
    *toff = ti;
}

typedef struct gather_job {
    line_geom g;
    const void *idx; fm_dtype idt;
    const char *src; char *dst; size_t es;
    fm_dtype dt;
} gather_job;

static void gather_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const gather_job *j = ctx;
    int64_t ts = j->g.ndim ? j->g.tstride[j->g.ax] : 1, es = (int64_t)j->es;
    for (int64_t L = b; L < e; L++) {
        int64_t io, to;
        line_offsets(&j->g, L, &io, &to);
        for (int64_t a = 0; a < j->g.A; a++, io += j->g.inner) {
            int64_t v = load_index(j->idx, j->idt, io);
            copy_elem(j->dst + io * es, j->src + (to + v * ts) * es, j->es);
        }
    }
}

static fm_status gather_kernel(const fm_op_call *c) {
    const fm_axis_attrs *a = c->attrs;
    fm_tensor *t = c->in[0], *idx = c->in[1], *y = c->out[0];
    line_geom g;
    line_geom_init(&g, t, idx, a->axis);
    int64_t bad = find_bad_index(idx, g.T);
    if (bad >= 0) return index_error("gather", load_index(fm_tensor_data(idx), idx->dtype, bad), a->axis, g.T);
    gather_job j = {.g = g, .idx = fm_tensor_data(idx), .idt = idx->dtype, .src = fm_tensor_data(t),
                    .dst = fm_tensor_data(y), .es = fm_dtype_size(t->dtype)};
    int64_t lines = g.A ? fm_tensor_numel(idx) / g.A : 0;
    int64_t grain = 4096 / (g.A > 0 ? g.A : 1);
    if (lines > 0) fm_parallel_for(lines, grain < 1 ? 1 : grain, gather_task, &j);
    return FM_OK;
}

#define SCATTER_ADD_TASK(T, SFX)                                                                       \
    static void scatter_add_task_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                     \
        (void)tid;                                                                                    \
        const gather_job *j = ctx;                                                                    \
        int64_t ts = j->g.ndim ? j->g.tstride[j->g.ax] : 1;                                           \
        const T *src = (const T *)j->src; T *dst = (T *)j->dst;                                       \
        for (int64_t L = b; L < e; L++) {                                                             \
            int64_t io, to;                                                                           \
            line_offsets(&j->g, L, &io, &to);                                                         \
            for (int64_t a = 0; a < j->g.A; a++, io += j->g.inner)                                    \
                dst[to + load_index(j->idx, j->idt, io) * ts] += src[io];                             \
        }                                                                                             \
    }
SCATTER_ADD_TASK(float, f32)
SCATTER_ADD_TASK(double, f64)

/* in = {base, index, src}: out = base, then out[.., index[i..], ..] += src[i..]. Lines own
 * disjoint parts of out (they differ in a coordinate other than the axis). */
static fm_status scatter_add_kernel(const fm_op_call *c) {
    const fm_axis_attrs *a = c->attrs;
    fm_tensor *base = c->in[0], *idx = c->in[1], *src = c->in[2], *y = c->out[0];
    if (y->dtype != FM_F32 && y->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, y->dtype);
    line_geom g;
    line_geom_init(&g, base, idx, a->axis);
    int64_t bad = find_bad_index(idx, g.T);
    if (bad >= 0) return index_error("scatter_add", load_index(fm_tensor_data(idx), idx->dtype, bad), a->axis, g.T);
    if (fm_tensor_data(y) != fm_tensor_data(base))
        memcpy(fm_tensor_data(y), fm_tensor_data(base), fm_tensor_nbytes(y));
    gather_job j = {.g = g, .idx = fm_tensor_data(idx), .idt = idx->dtype, .src = fm_tensor_data(src),
                    .dst = fm_tensor_data(y), .es = fm_dtype_size(y->dtype)};
    int64_t lines = g.A ? fm_tensor_numel(idx) / g.A : 0;
    int64_t grain = 4096 / (g.A > 0 ? g.A : 1);
    if (lines > 0)
        fm_parallel_for(lines, grain < 1 ? 1 : grain, y->dtype == FM_F32 ? scatter_add_task_f32 : scatter_add_task_f64, &j);
    return FM_OK;
}

/* ------------------------------------------------- scatter / scatter_nd */

/* One update: moved as raw bytes (none: every dtype) or combined in f64 (exact for every
 * dtype but integers beyond 2^53, which the reductions round as the other integer ops do). */
static inline void scatter_elem(char *dst, const char *src, fm_dtype dt, size_t es, int reduce) {
    if (reduce == FM_SCATTER_NONE) copy_elem(dst, src, es);
    else fm_store_f64(dst, dt, fm_scatter_combine_d(reduce, fm_load_f64(dst, dt), fm_load_f64(src, dt)));
}

typedef struct scatter_job {
    gather_job j;
    int reduce;
} scatter_job;

static void scatter_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const scatter_job *s = ctx;
    const gather_job *j = &s->j;
    int64_t ts = j->g.ndim ? j->g.tstride[j->g.ax] : 1, es = (int64_t)j->es;
    for (int64_t L = b; L < e; L++) {
        int64_t io, to;
        line_offsets(&j->g, L, &io, &to);
        for (int64_t a = 0; a < j->g.A; a++, io += j->g.inner)
            scatter_elem(j->dst + (to + load_index(j->idx, j->idt, io) * ts) * es, j->src + io * es, j->dt, j->es, s->reduce);
    }
}

/* in = {t, index, src (index's shape)}: out = t, then each src element replaces or combines
 * with out's element at its index along the axis. Lines own disjoint parts of out and walk
 * the index in order, so duplicates apply in index order whatever the thread count. */
static fm_status scatter_kernel(const fm_op_call *c) {
    const fm_scatter_attrs *a = c->attrs;
    fm_tensor *t = c->in[0], *idx = c->in[1], *src = c->in[2], *y = c->out[0];
    line_geom g;
    line_geom_init(&g, t, idx, a->axis);
    int64_t bad = find_bad_index(idx, g.T);
    if (bad >= 0) return index_error("scatter", load_index(fm_tensor_data(idx), idx->dtype, bad), a->axis, g.T);
    if (fm_tensor_data(y) != fm_tensor_data(t)) memcpy(fm_tensor_data(y), fm_tensor_data(t), fm_tensor_nbytes(y));
    scatter_job s = {.j = {.g = g, .idx = fm_tensor_data(idx), .idt = idx->dtype, .src = fm_tensor_data(src),
                           .dst = fm_tensor_data(y), .es = fm_dtype_size(t->dtype), .dt = t->dtype},
                     .reduce = a->reduce};
    int64_t lines = g.A ? fm_tensor_numel(idx) / g.A : 0;
    int64_t grain = 4096 / (g.A > 0 ? g.A : 1);
    if (lines > 0) fm_parallel_for(lines, grain < 1 ? 1 : grain, scatter_task, &s);
    return FM_OK;
}

typedef struct scatter_nd_job {
    const int64_t *off;   /* each update's first element in the output */
    int64_t m, slice, colblk;
    const char *src; char *dst; size_t es;
    fm_dtype dt;
    int reduce;
} scatter_nd_job;

/* Tasks own column blocks of the slices and apply the m updates to them in order. */
static void scatter_nd_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const scatter_nd_job *j = ctx;
    for (int64_t blk = b; blk < e; blk++) {
        int64_t c0 = blk * j->colblk, c1 = c0 + j->colblk < j->slice ? c0 + j->colblk : j->slice;
        for (int64_t i = 0; i < j->m; i++) {
            if (j->reduce == FM_SCATTER_NONE) {
                memcpy(j->dst + (j->off[i] + c0) * j->es, j->src + (i * j->slice + c0) * j->es, (size_t)(c1 - c0) * j->es);
                continue;
            }
            for (int64_t k = c0; k < c1; k++)
                scatter_elem(j->dst + (j->off[i] + k) * j->es, j->src + (i * j->slice + k) * j->es, j->dt, j->es, j->reduce);
        }
    }
}

/* in = {t, indices [..., k], updates}: every index tuple (negative from the end) is checked and
 * turned into an offset first, then the updates are applied in order. */
static fm_status scatter_nd_kernel(const fm_op_call *c) {
    const fm_scatter_attrs *a = c->attrs;
    fm_tensor *t = c->in[0], *idx = c->in[1], *up = c->in[2], *y = c->out[0];
    const int k = (int)idx->shape[idx->ndim - 1];
    int64_t m = k ? fm_tensor_numel(idx) / k : 0, slice = 1;
    for (int d = k; d < t->ndim; d++) slice *= t->shape[d];
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(m > 0 ? m : 1));
    if (!off) return fm_set_error(FM_ERR_OOM, "scatter_nd: out of host memory for %" PRId64 " offsets", m);
    fm_status st = fm_scatter_nd_offsets(fm_tensor_data(idx), idx->dtype, m, k, t->shape, slice, off);
    if (st) { free(off); return st; }
    if (fm_tensor_data(y) != fm_tensor_data(t)) memcpy(fm_tensor_data(y), fm_tensor_data(t), fm_tensor_nbytes(y));
    scatter_nd_job j = {.off = off, .m = m, .slice = slice, .src = fm_tensor_data(up), .dst = fm_tensor_data(y),
                        .es = fm_dtype_size(t->dtype), .dt = t->dtype, .reduce = a->reduce};
    j.colblk = slice < 1024 ? (slice > 0 ? slice : 1) : 1024;
    int64_t blocks = (slice + j.colblk - 1) / j.colblk;
    if (m > 0 && blocks > 0) fm_parallel_for(blocks, m * j.colblk >= 65536 ? 1 : blocks, scatter_nd_task, &j);
    free(off);
    return FM_OK;
}

/* ----------------------------------------------- index_select / index_add */

typedef struct isel_job {
    int64_t outer, S, L, inner;   /* input [outer, S, inner], selection [outer, L, inner] */
    const void *idx; fm_dtype idt;
    const char *src; char *dst; size_t es;
    int64_t colblk;               /* index_add: inner columns per task */
} isel_job;

static void index_select_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const isel_job *j = ctx;
    size_t row = (size_t)j->inner * j->es;
    for (int64_t it = b; it < e; it++) {
        int64_t o = it / j->L, l = it % j->L;
        int64_t v = load_index(j->idx, j->idt, l);
        memcpy(j->dst + it * (int64_t)row, j->src + (o * j->S + v) * (int64_t)row, row);
    }
}

static fm_status index_select_kernel(const fm_op_call *c) {
    const fm_axis_attrs *a = c->attrs;
    fm_tensor *t = c->in[0], *idx = c->in[1], *y = c->out[0];
    isel_job j = {.outer = 1, .S = t->shape[a->axis], .L = fm_tensor_numel(idx), .inner = 1, .idx = fm_tensor_data(idx),
                  .idt = idx->dtype, .src = fm_tensor_data(t), .dst = fm_tensor_data(y), .es = fm_dtype_size(t->dtype)};
    for (int d = 0; d < a->axis; d++) j.outer *= t->shape[d];
    for (int d = a->axis + 1; d < t->ndim; d++) j.inner *= t->shape[d];
    int64_t bad = find_bad_index(idx, j.S);
    if (bad >= 0) return index_error("index_select", load_index(j.idx, j.idt, bad), a->axis, j.S);
    int64_t grain = 8192 / (j.inner > 0 ? j.inner : 1);
    if (fm_tensor_numel(y) > 0) fm_parallel_for(j.outer * j.L, grain < 1 ? 1 : grain, index_select_task, &j);
    return FM_OK;
}

#define INDEX_ADD_TASK(T, SFX)                                                                         \
    static void index_add_task_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                       \
        (void)tid;                                                                                    \
        const isel_job *j = ctx;                                                                      \
        int64_t nblk = (j->inner + j->colblk - 1) / j->colblk;                                        \
        const T *src = (const T *)j->src; T *dst = (T *)j->dst;                                       \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t o = it / nblk, c0 = (it % nblk) * j->colblk;                                      \
            int64_t c1 = c0 + j->colblk < j->inner ? c0 + j->colblk : j->inner;                       \
            for (int64_t l = 0; l < j->L; l++) {                                                      \
                int64_t v = load_index(j->idx, j->idt, l);                                            \
                T *dp = dst + (o * j->S + v) * j->inner;                                              \
                const T *sp = src + (o * j->L + l) * j->inner;                                        \
                for (int64_t k = c0; k < c1; k++) dp[k] += sp[k];                                     \
            }                                                                                         \
        }                                                                                             \
    }
INDEX_ADD_TASK(float, f32)
INDEX_ADD_TASK(double, f64)

/* in = {base [outer, S, inner], index [L], src [outer, L, inner]}: out = base with src rows added
 * at the indexed positions. Tasks own (outer, column block) pairs and walk the index in order. */
static fm_status index_add_kernel(const fm_op_call *c) {
    const fm_axis_attrs *a = c->attrs;
    fm_tensor *base = c->in[0], *idx = c->in[1], *src = c->in[2], *y = c->out[0];
    if (y->dtype != FM_F32 && y->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, y->dtype);
    isel_job j = {.outer = 1, .S = base->shape[a->axis], .L = fm_tensor_numel(idx), .inner = 1,
                  .idx = fm_tensor_data(idx), .idt = idx->dtype, .src = fm_tensor_data(src), .dst = fm_tensor_data(y),
                  .es = fm_dtype_size(y->dtype), .colblk = 256};
    for (int d = 0; d < a->axis; d++) j.outer *= base->shape[d];
    for (int d = a->axis + 1; d < base->ndim; d++) j.inner *= base->shape[d];
    int64_t bad = find_bad_index(idx, j.S);
    if (bad >= 0) return index_error("index_add", load_index(j.idx, j.idt, bad), a->axis, j.S);
    if (fm_tensor_data(y) != fm_tensor_data(base))
        memcpy(fm_tensor_data(y), fm_tensor_data(base), fm_tensor_nbytes(y));
    if (j.inner == 0 || j.outer == 0) return FM_OK;
    int64_t nblk = (j.inner + j.colblk - 1) / j.colblk;
    fm_parallel_for(j.outer * nblk, 1, y->dtype == FM_F32 ? index_add_task_f32 : index_add_task_f64, &j);
    return FM_OK;
}

/* --------------------------------------------------------------- one_hot */

static fm_status one_hot_kernel(const fm_op_call *c) {
    const fm_one_hot_attrs *a = c->attrs;
    fm_tensor *idx = c->in[0], *y = c->out[0];
    int64_t n = fm_tensor_numel(idx), K = a->num_classes;
    int64_t bad = find_bad_index(idx, K);
    if (bad >= 0) {
        int64_t v = load_index(fm_tensor_data(idx), idx->dtype, bad);
        return fm_set_error(FM_ERR_INVALID, "one_hot: index %" PRId64 " is out of range for num_classes %" PRId64
                            " (valid: 0..%" PRId64 ")", v, K, K - 1);
    }
    float *yp = fm_tensor_data(y);
    memset(yp, 0, (size_t)(n * K) * sizeof(float));
    const void *ip = fm_tensor_data(idx);
    for (int64_t i = 0; i < n; i++) yp[i * K + load_index(ip, idx->dtype, i)] = 1.0f;
    return FM_OK;
}

void fm_cpu_kernels_index(fm_backend *b) {
    b->kernels[FM_OP_CAT] = cat_kernel;
    b->kernels[FM_OP_GATHER] = gather_kernel;
    b->kernels[FM_OP_SCATTER_ADD] = scatter_add_kernel;
    b->kernels[FM_OP_SCATTER] = scatter_kernel;
    b->kernels[FM_OP_SCATTER_ND] = scatter_nd_kernel;
    b->kernels[FM_OP_INDEX_SELECT] = index_select_kernel;
    b->kernels[FM_OP_INDEX_ADD] = index_add_kernel;
    b->kernels[FM_OP_ONE_HOT] = one_hot_kernel;
}
