/* CPU reduction kernels. The front end hands over a contiguous input whose
 * reduced axes form one block, so every reduction is [outer, R, inner] -> [outer, inner].
 * Sums accumulate in double. Partial results use a fixed block size, not a
 * per-thread split, so values do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/dtype_internal.h"
#include "core/parallel.h"

typedef struct red {
    fm_op_id op;
    const char *x;
    fm_dtype dt;
    int64_t outer, R, inner;
    int correction;
    fm_tensor *out, *idx;
} red;

static void block_of(const fm_tensor *x, unsigned mask, int64_t *outer, int64_t *R, int64_t *inner) {
    *outer = *R = *inner = 1;
    int first = -1, last = -1;
    for (int i = 0; i < x->ndim; i++)
        if (mask >> i & 1) { if (first < 0) first = i; last = i; }
    for (int i = 0; i < x->ndim; i++) {
        if (first < 0 || i < first) *outer *= x->shape[i];
        else if (i <= last) *R *= x->shape[i];
        else *inner *= x->shape[i];
    }
}

static inline double ld(const red *r, int64_t i) {
    if (r->dt == FM_F32) return ((const float *)r->x)[i];
    if (r->dt == FM_F64) return ((const double *)r->x)[i];
    return fm_load_f64(r->x + i * (int64_t)fm_dtype_size(r->dt), r->dt);
}

static void store(fm_tensor *t, int64_t i, double v) {
    fm_store_f64((char *)t->storage->data + (t->offset + i) * (int64_t)fm_dtype_size(t->dtype), t->dtype, v);
}

/* reduce_avx2.c / reduce_avx512.c: rowsum_f32, bitwise */
double fm_rowsum_f32_avx2(const float *p, int64_t n);
double fm_rowsum_f32_avx512(const float *p, int64_t n);

/* The sum of a contiguous f32 row in double: element k goes to partial k mod 32 (in order),
 * and the partials are combined in one fixed tree, so every ISA level gives the same bits and
 * the vector levels keep independent chains of adds (the 4 partials before were a scalar loop:
 * the global average pool of EfficientNet's SE blocks ran at a quarter of torch.mean's speed,
 * 2 threads, AMD EPYC Zen 5). */
static double rowsum_f32(const float *p, int64_t n) {
    if (fm_cpu_use_avx512()) return fm_rowsum_f32_avx512(p, n);
    if (fm_cpu_use_avx2()) return fm_rowsum_f32_avx2(p, n);
    double s[32] = {0};
    for (int64_t k = 0; k < n; k++) s[k & 31] += p[k];
    double t[8];
    for (int j = 0; j < 8; j++) t[j] = (s[j] + s[j + 8]) + (s[j + 16] + s[j + 24]);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

/* One output element: reduce x[o, 0..R, i]. */
static double reduce_one(const red *r, int64_t o, int64_t in, int64_t *arg) {
    int64_t base = o * r->R * r->inner + in, st = r->inner, R = r->R;
    switch (r->op) {
    case FM_OP_SUM:
    case FM_OP_MEAN: {
        double s = 0;
        if (r->dt == FM_F32 && st == 1) {
            s = rowsum_f32((const float *)r->x + base, R);
        } else {
            for (int64_t k = 0; k < R; k++) s += ld(r, base + k * st);
        }
        return r->op == FM_OP_MEAN ? s / (double)R : s;
    }
    case FM_OP_AMAX: case FM_OP_MAX_DIM: case FM_OP_ARGMAX:
    case FM_OP_AMIN: case FM_OP_MIN_DIM: {
        bool mx = r->op == FM_OP_AMAX || r->op == FM_OP_MAX_DIM || r->op == FM_OP_ARGMAX;
        double best = ld(r, base);
        int64_t bi = 0;
        for (int64_t k = 1; k < R && best == best; k++) {
            double v = ld(r, base + k * st);
            if (v != v || (mx ? v > best : v < best)) { best = v; bi = k; } /* NaN wins, first occurrence */
        }
        if (arg) *arg = bi;
        return best;
    }
    case FM_OP_VAR: case FM_OP_STD: {
        double mean = 0, m2 = 0;
        for (int64_t k = 0; k < R; k++) { /* Welford: stable for large offsets */
            double v = ld(r, base + k * st), d = v - mean;
            mean += d / (double)(k + 1);
            m2 += d * (v - mean);
        }
        double den = (double)(R - r->correction);
        double var = den > 0 ? m2 / den : NAN;
        return r->op == FM_OP_STD ? sqrt(var) : var;
    }
    case FM_OP_PROD: {
        double s = 1;
        for (int64_t k = 0; k < R; k++) s *= ld(r, base + k * st);
        return s;
    }
    case FM_OP_LOGSUMEXP: {
        double m = -INFINITY;
        for (int64_t k = 0; k < R; k++) { double v = ld(r, base + k * st); if (v > m || v != v) m = v; }
        if (m == -INFINITY || m != m || m == INFINITY) return m;
        double s = 0;
        for (int64_t k = 0; k < R; k++) s += exp(ld(r, base + k * st) - m);
        return m + log(s);
    }
    default: return NAN;
    }
}

static void red_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const red *r = vctx;
    for (int64_t j = b; j < e; j++) {
        int64_t o = j / r->inner, in = j % r->inner, arg = 0;
        double v = reduce_one(r, o, in, &arg);
        if (r->op == FM_OP_ARGMAX) { ((int64_t *)r->out->storage->data)[r->out->offset + j] = arg; continue; }
        store(r->out, j, v);
        if (r->idx) ((int64_t *)r->idx->storage->data)[r->idx->offset + j] = arg;
    }
}

/* Whole-tensor sums of large inputs: fixed-size blocks summed in parallel, then in order. */
#define BLOCK 65536
typedef struct full_sum { const red *r; double *partial; } full_sum;
static void full_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    full_sum *f = vctx;
    for (int64_t blk = b; blk < e; blk++) {
        red sub = *f->r;
        int64_t start = blk * BLOCK, n = f->r->R - start < BLOCK ? f->r->R - start : BLOCK;
        sub.x = f->r->x + start * (int64_t)fm_dtype_size(f->r->dt);
        sub.R = n;
        sub.op = FM_OP_SUM;
        f->partial[blk] = reduce_one(&sub, 0, 0, NULL);
    }
}

/* Sums over a non-innermost axis ([outer, R, inner], inner > 1: the bias
 * gradient of a linear layer, batch-norm statistics): each work unit adds R
 * contiguous rows of up to COLS columns into a double accumulator, so loads are
 * unit-stride and vectorize. Each column is still summed over k = 0..R-1 in
 * order, the same sequence as reduce_one's strided loop. */
#define COLS 256
/* reduce_avx2.c / reduce_avx512.c: the f32 rows into acc, bitwise this file's loop */
void fm_colsum_f32_avx2(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);
void fm_colsum_f32_avx512(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);

static void col_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const red *r = vctx;
    int64_t nblk = (r->inner + COLS - 1) / COLS;
    double acc[COLS];
    for (int64_t u = b; u < e; u++) {
        int64_t o = u / nblk, c0 = (u % nblk) * COLS, nc = r->inner - c0 < COLS ? r->inner - c0 : COLS;
        for (int64_t c = 0; c < nc; c++) acc[c] = 0;
        if (r->dt == FM_F32 && fm_cpu_use_avx2()) {
            const float *p = (const float *)r->x + o * r->R * r->inner + c0;
            if (fm_cpu_use_avx512()) fm_colsum_f32_avx512(p, r->R, r->inner, nc, acc);
            else fm_colsum_f32_avx2(p, r->R, r->inner, nc, acc);
        } else {
            for (int64_t k = 0; k < r->R; k++) {
                int64_t row = (o * r->R + k) * r->inner + c0;
                if (r->dt == FM_F32) {
                    const float *p = (const float *)r->x + row;
                    for (int64_t c = 0; c < nc; c++) acc[c] += p[c];
                } else if (r->dt == FM_BF16 || r->dt == FM_F16) { /* exact widening: the strided loop's sums */
                    const uint16_t *p = (const uint16_t *)r->x + row;
                    if (r->dt == FM_BF16) for (int64_t c = 0; c < nc; c++) acc[c] += fm_bf16_to_f32(p[c]);
                    else for (int64_t c = 0; c < nc; c++) acc[c] += fm_f16_to_f32(p[c]);
                } else {
                    const double *p = (const double *)r->x + row;
                    for (int64_t c = 0; c < nc; c++) acc[c] += p[c];
                }
            }
        }
        double scale = r->op == FM_OP_MEAN ? (double)r->R : 1.0;
        for (int64_t c = 0; c < nc; c++) store(r->out, o * r->inner + c0 + c, r->op == FM_OP_MEAN ? acc[c] / scale : acc[c]);
    }
}

static fm_status k_reduce(const fm_op_call *c) {
    fm_tensor *x = c->in[0];
    red r = {.op = c->op, .x = (const char *)fm_tensor_data(x), .dt = x->dtype, .out = c->out[0],
             .idx = c->n_out > 1 ? c->out[1] : NULL};
    if (c->op == FM_OP_MAX_DIM || c->op == FM_OP_MIN_DIM || c->op == FM_OP_ARGMAX) {
        int ax = ((const fm_dim_attrs *)c->attrs)->axis;
        block_of(x, 1u << ax, &r.outer, &r.R, &r.inner);
    } else {
        const fm_reduce_attrs *a = c->attrs;
        block_of(x, a->axes_mask, &r.outer, &r.R, &r.inner);
        r.correction = a->correction;
    }
    if (x->dtype == FM_BOOL && c->op != FM_OP_SUM && c->op != FM_OP_AMAX && c->op != FM_OP_AMIN)
        return fm_cpu_unsupported_dtype(c, x->dtype);
    int64_t nout = r.outer * r.inner;
    if (r.R == 0) {
        if (c->op == FM_OP_SUM) { for (int64_t j = 0; j < nout; j++) store(r.out, j, 0); return FM_OK; }
        if (c->op == FM_OP_MEAN || c->op == FM_OP_VAR || c->op == FM_OP_STD) { for (int64_t j = 0; j < nout; j++) store(r.out, j, NAN); return FM_OK; }
        if (c->op == FM_OP_LOGSUMEXP) { for (int64_t j = 0; j < nout; j++) store(r.out, j, -INFINITY); return FM_OK; }
        if (c->op == FM_OP_PROD) { for (int64_t j = 0; j < nout; j++) store(r.out, j, 1); return FM_OK; }
        return fm_set_error(FM_ERR_INVALID, "%s: cannot reduce over an empty dimension", fm_op_get_info(c->op)->name);
    }
    if (nout == 1 && r.R > 2 * BLOCK && (c->op == FM_OP_SUM || c->op == FM_OP_MEAN)) {
        int64_t nb = (r.R + BLOCK - 1) / BLOCK;
        double *partial = malloc((size_t)nb * sizeof *partial);
        if (!partial) return fm_set_error(FM_ERR_OOM, "sum: out of memory");
        full_sum f = {&r, partial};
        fm_parallel_for(nb, 1, full_range, &f);
        double s = 0;
        for (int64_t b = 0; b < nb; b++) s += partial[b];
        free(partial);
        store(r.out, 0, c->op == FM_OP_MEAN ? s / (double)r.R : s);
        return FM_OK;
    }
    if ((c->op == FM_OP_SUM || c->op == FM_OP_MEAN) && r.inner > 1 &&
        (x->dtype == FM_F32 || x->dtype == FM_F64 || x->dtype == FM_BF16 || x->dtype == FM_F16)) {
        int64_t units = r.outer * ((r.inner + COLS - 1) / COLS), per = r.R * COLS;
        fm_parallel_for(units, per >= 32768 ? 1 : 32768 / per + 1, col_range, &r);
        return FM_OK;
    }
    int64_t grain = r.R >= 4096 ? 1 : 4096 / r.R + 1;
    fm_parallel_for(nout, grain, red_range, &r);
    return FM_OK;
}

/* ---- CUMSUM: one line (a fixed outer index and inner index) per item, run down the axis;
 * floats accumulate in double, integers in int64 (wrapping, as numpy and ONNX Runtime). ---- */
typedef struct scan {
    const char *x;
    char *y;
    fm_dtype dt;
    int64_t n, inner;
    bool exclusive, reverse;
} scan;

static void scan_range(void *ctx, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const scan *s = ctx;
    const int64_t es = (int64_t)fm_dtype_size(s->dt);
    const bool integer = !fm_dtype_is_float(s->dt);
    for (int64_t l = begin; l < end; l++) {
        const int64_t base = l / s->inner * s->n * s->inner + l % s->inner;
        double acc = 0;
        uint64_t iacc = 0;
        for (int64_t k = 0; k < s->n; k++) {
            const int64_t at = (base + (s->reverse ? s->n - 1 - k : k) * s->inner) * es;
            if (integer) {
                const uint64_t v = (uint64_t)fm_load_i64(s->x + at, s->dt);
                if (!s->exclusive) iacc += v;
                int64_t w = (int64_t)iacc; /* two's complement: the low bits are the wrapped sum */
                switch (s->dt) {
                case FM_I64: memcpy(s->y + at, &w, 8); break;
                case FM_I32: { int32_t t = (int32_t)(uint32_t)iacc; memcpy(s->y + at, &t, 4); break; }
                case FM_I8: { int8_t t = (int8_t)(uint8_t)iacc; memcpy(s->y + at, &t, 1); break; }
                default: { uint8_t t = (uint8_t)iacc; memcpy(s->y + at, &t, 1); break; }
                }
                if (s->exclusive) iacc += v;
            } else {
                const double v = s->dt == FM_F32 ? (double)((const float *)s->x)[at / 4] : fm_load_f64(s->x + at, s->dt);
                if (!s->exclusive) acc += v;
                fm_store_f64(s->y + at, s->dt, acc);
                if (s->exclusive) acc += v;
            }
        }
    }
}

static fm_status k_cumsum(const fm_op_call *c) {
    const fm_cumsum_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0];
    if (x->dtype == FM_BOOL) return fm_cpu_unsupported_dtype(c, x->dtype);
    int64_t outer = 1, n = x->ndim ? x->shape[a->axis] : 1, inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < a->axis) outer *= x->shape[i];
        else if (i > a->axis) inner *= x->shape[i];
    }
    scan s = {(const char *)fm_tensor_data(x), (char *)fm_tensor_data(c->out[0]), x->dtype, n, inner, a->exclusive, a->reverse};
    if (outer * inner * n == 0) return FM_OK;
    fm_parallel_for(outer * inner, n >= 4096 ? 1 : 4096 / n + 1, scan_range, &s);
    return FM_OK;
}

/* Every op of the REDUCE group of ops.def, and CUMSUM. */
void fm_cpu_kernels_reduce(fm_backend *b) {
    for (int op = 0; op < FM_OP_COUNT; op++)
        if (fm_op_get_info((fm_op_id)op)->group == FM_GROUP_REDUCE) b->kernels[op] = k_reduce;
    b->kernels[FM_OP_CUMSUM] = k_cumsum;
}
