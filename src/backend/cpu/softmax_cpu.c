/* CPU kernels for softmax, log_softmax, fused cross-entropy and MSE (+ backward).
 *
 * Rows are independent, so every kernel splits rows over the thread pool; each
 * row is computed by one thread in a fixed order, so results do not depend on
 * the thread count. Reductions across rows (loss means) are summed serially in
 * row order from a per-row buffer for the same reason. f32 rows go through the
 * AVX2 kernels in softmax_avx2.c when the CPU has them; the scalar templates
 * below serve f64 (gradient checks) and CPUs without AVX2.
 * Cross-entropy never stores probabilities: forward needs only max, sum(exp)
 * and sum(x) per row, and backward recomputes exp on the fly (once per element on
 * the AVX2 level, whose row keeps the exps of its sum; twice on AVX-512's). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* softmax_avx2.c */
void fm_softmax_row_f32_avx2(const float *x, float *y, int64_t n, int log_mode, int stream);
void fm_softmax_bwd_row_f32_avx2(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream);
void fm_ce_row_stats_f32_avx2(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out);
void fm_ce_bwd_row_f32_avx2(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream);
void fm_ce_bwd_fused_row_f32_avx2(const float *x, float *dx, int64_t n, double g, float shift, int stream);
/* softmax_avx512.c: the same rows at 16 lanes */
void fm_softmax_row_f32_avx512(const float *x, float *y, int64_t n, int log_mode, int stream);
void fm_softmax_bwd_row_f32_avx512(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream);
void fm_ce_row_stats_f32_avx512(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out);
void fm_ce_bwd_row_f32_avx512(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream);
void fm_ce_bwd_fused_row_f32_avx512(const float *x, float *dx, int64_t n, double g, float shift, int stream);

/* The SIMD row kernels of the level in use (called where `simd` is set). */
typedef struct simd_rows {
    void (*row)(const float *x, float *y, int64_t n, int log_mode, int stream);
    void (*bwd)(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream);
    void (*ce_stats)(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out);
    void (*ce_bwd)(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream);
    /* the whole backward row, one exp per element (NULL: ce_stats then ce_bwd) */
    void (*ce_bwd_fused)(const float *x, float *dx, int64_t n, double g, float shift, int stream);
} simd_rows;
static const simd_rows rows_avx2 = {fm_softmax_row_f32_avx2, fm_softmax_bwd_row_f32_avx2, fm_ce_row_stats_f32_avx2,
                                    fm_ce_bwd_row_f32_avx2, fm_ce_bwd_fused_row_f32_avx2};
static const simd_rows rows_avx512 = {fm_softmax_row_f32_avx512, fm_softmax_bwd_row_f32_avx512,
                                      fm_ce_row_stats_f32_avx512, fm_ce_bwd_row_f32_avx512, fm_ce_bwd_fused_row_f32_avx512};
static const simd_rows *simd(void) { return fm_cpu_use_avx512() ? &rows_avx512 : &rows_avx2; }

/* ---- scalar row templates (T = float or double; sums in double) ---- */
#define DEFINE_ROWS(T, SFX, EXPF, LOGF)                                                            \
    static void softmax_row_##SFX(const T *x, T *y, int64_t n, int log_mode) {                     \
        T m = -INFINITY;                                                                           \
        for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;                                   \
        if (m == -INFINITY) m = 0;                                                                 \
        double s = 0;                                                                              \
        if (log_mode) {                                                                            \
            for (int64_t i = 0; i < n; i++) s += EXPF(x[i] - m);                                   \
            T ls = LOGF((T)s);                                                                     \
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) - ls;                                \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) { y[i] = EXPF(x[i] - m); s += y[i]; }                  \
            T inv = (T)(1.0 / s);                                                                  \
            for (int64_t i = 0; i < n; i++) y[i] *= inv;                                           \
        }                                                                                          \
    }                                                                                              \
    static void softmax_bwd_row_##SFX(const T *dy, const T *y, T *dx, int64_t n, int log_mode) {   \
        double s = 0;                                                                              \
        if (log_mode) {                                                                            \
            for (int64_t i = 0; i < n; i++) s += dy[i];                                            \
            for (int64_t i = 0; i < n; i++) dx[i] = dy[i] - EXPF(y[i]) * (T)s;                     \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) s += (double)dy[i] * y[i];                             \
            for (int64_t i = 0; i < n; i++) dx[i] = y[i] * (dy[i] - (T)s);                         \
        }                                                                                          \
    }                                                                                              \
    static void ce_row_stats_##SFX(const T *x, int64_t n, double *m_out, double *se, double *sx) { \
        T m = -INFINITY;                                                                           \
        double s = 0, a = 0;                                                                       \
        for (int64_t i = 0; i < n; i++) { m = x[i] > m ? x[i] : m; a += x[i]; }                    \
        if (m == -INFINITY) m = 0;                                                                 \
        for (int64_t i = 0; i < n; i++) s += EXPF(x[i] - m);                                       \
        *m_out = m; *se = s; *sx = a;                                                              \
    }                                                                                              \
    static void ce_bwd_row_##SFX(const T *x, T *dx, int64_t n, T m, T scale, T shift) {            \
        for (int64_t i = 0; i < n; i++) dx[i] = EXPF(x[i] - m) * scale - shift;                    \
    }
DEFINE_ROWS(float, f32, expf, logf)
DEFINE_ROWS(double, f64, exp, log)

static int64_t last_dim(const fm_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
/* Rows per task so one task is a few tens of KB of work. */
static int64_t row_grain(int64_t n) { return n >= 8192 ? 1 : 8192 / (n ? n : 1); }

/* ---- softmax / log_softmax ---- */
typedef struct sm_ctx {
    const void *x, *dy;
    void *y;
    int64_t n;
    int log_mode, simd, stream;
    fm_dtype dt;
} sm_ctx;

static void softmax_rows(void *vc, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    sm_ctx *c = vc;
    for (int64_t r = r0; r < r1; r++) {
        if (c->dt == FM_F64) {
            softmax_row_f64((const double *)c->x + r * c->n, (double *)c->y + r * c->n, c->n, c->log_mode);
        } else if (c->simd) {
            simd()->row((const float *)c->x + r * c->n, (float *)c->y + r * c->n, c->n, c->log_mode,
                                    c->stream);
        } else {
            softmax_row_f32((const float *)c->x + r * c->n, (float *)c->y + r * c->n, c->n, c->log_mode);
        }
    }
}

static void softmax_bwd_rows(void *vc, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    sm_ctx *c = vc; /* x holds y (the forward output) here */
    int64_t n = c->n;
    for (int64_t r = r0; r < r1; r++) {
        if (c->dt == FM_F64) {
            softmax_bwd_row_f64((const double *)c->dy + r * n, (const double *)c->x + r * n, (double *)c->y + r * n,
                                n, c->log_mode);
        } else if (c->simd) {
            simd()->bwd((const float *)c->dy + r * n, (const float *)c->x + r * n,
                                        (float *)c->y + r * n, n, c->log_mode, c->stream);
        } else {
            softmax_bwd_row_f32((const float *)c->dy + r * n, (const float *)c->x + r * n, (float *)c->y + r * n,
                                n, c->log_mode);
        }
    }
}

static fm_status softmax_common(const fm_op_call *call, int log_mode, int backward) {
    const fm_tensor *x = call->in[0];
    fm_dtype dt = x->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    int64_t n = last_dim(x), numel = fm_tensor_numel(x);
    if (n == 0 || numel == 0) return FM_OK;
    sm_ctx c = {0};
    c.n = n;
    c.log_mode = log_mode;
    c.simd = dt == FM_F32 && fm_cpu_use_avx2();
    c.dt = dt;
    if (backward) { /* in = {dy, y} */
        c.dy = fm_tensor_data(call->in[0]);
        c.x = fm_tensor_data(call->in[1]);
    } else {
        c.x = fm_tensor_data(x);
    }
    c.y = fm_tensor_data(call->out[0]);
    c.stream = c.simd && fm_cpu_stream_rows(c.y, n, numel);
    fm_parallel_for(numel / n, row_grain(n), backward ? softmax_bwd_rows : softmax_rows, &c);
    return FM_OK;
}

static fm_status softmax_kernel(const fm_op_call *c) { return softmax_common(c, 0, 0); }
static fm_status log_softmax_kernel(const fm_op_call *c) { return softmax_common(c, 1, 0); }
static fm_status softmax_bwd_kernel(const fm_op_call *c) { return softmax_common(c, 0, 1); }
static fm_status log_softmax_bwd_kernel(const fm_op_call *c) { return softmax_common(c, 1, 1); }

/* ---- cross-entropy ---- */
static int64_t target_at(const fm_tensor *t, const void *data, int64_t i) {
    return t->dtype == FM_I64 ? ((const int64_t *)data)[i] : (int64_t)((const int32_t *)data)[i];
}

/* Serial pre-check: errors are thread-local, so report them from the caller's thread. */
static fm_status check_targets(const fm_op_call *call, const fm_tensor *tg, int64_t rows, int64_t C, int64_t ignore,
                               int64_t *count) {
    const char *name = fm_op_get_info(call->op)->name;
    if (tg->dtype != FM_I64 && tg->dtype != FM_I32)
        return fm_set_error(FM_ERR_INVALID, "%s: target dtype %s must be i64 or i32", name, fm_dtype_name(tg->dtype));
    const void *td = fm_tensor_data(tg);
    int64_t k = 0;
    for (int64_t i = 0; i < rows; i++) {
        int64_t t = target_at(tg, td, i);
        if (t == ignore) continue;
        if (t < 0 || t >= C)
            return fm_set_error(FM_ERR_INVALID, "%s: target %lld at position %lld is out of range [0, %lld)", name,
                                (long long)t, (long long)i, (long long)C);
        k++;
    }
    *count = k;
    return FM_OK;
}

typedef struct ce_ctx {
    const void *x, *tg, *g;
    void *dx;
    double *row_loss;
    const fm_tensor *tgt;
    int64_t C;
    const fm_ce_attrs *a;
    int simd, g_per_row, stream;
    double g_scale; /* forward: unused; backward: multiplies the upstream gradient */
    fm_dtype dt;
} ce_ctx;

static void ce_fwd_rows(void *vc, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    ce_ctx *c = vc;
    double eps = c->a->label_smoothing;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = target_at(c->tgt, c->tg, r);
        if (t == c->a->ignore_index) { c->row_loss[r] = 0; continue; }
        double m, se, sx, xt;
        if (c->dt == FM_F64) {
            const double *x = (const double *)c->x + r * c->C;
            ce_row_stats_f64(x, c->C, &m, &se, &sx);
            xt = x[t];
        } else {
            const float *x = (const float *)c->x + r * c->C;
            if (c->simd) {
                float fm, fs, fx;
                simd()->ce_stats(x, c->C, &fm, &fs, &fx);
                m = fm; se = fs; sx = fx;
            } else {
                ce_row_stats_f32(x, c->C, &m, &se, &sx);
            }
            xt = x[t];
        }
        double lse = m + log(se);
        /* (1-eps) * nll + eps * mean_c(-log p_c), with -log p_c = lse - x_c */
        c->row_loss[r] = (1 - eps) * (lse - xt) + eps * (lse - sx / (double)c->C);
    }
}

static fm_status ce_kernel(const fm_op_call *call) {
    const fm_tensor *x = call->in[0], *tg = call->in[1];
    const fm_ce_attrs *a = call->attrs;
    fm_dtype dt = x->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    int64_t C = last_dim(x), rows = fm_tensor_numel(tg), count = 0;
    fm_status st = check_targets(call, tg, rows, C, a->ignore_index, &count);
    if (st != FM_OK) return st;
    double *row_loss = malloc((size_t)(rows ? rows : 1) * sizeof(double));
    if (!row_loss) return fm_set_error(FM_ERR_OOM, "cross_entropy: out of host memory for %lld row losses", (long long)rows);
    ce_ctx c = {fm_tensor_data(x), fm_tensor_data(tg), NULL, NULL, row_loss, tg, C, a,
                dt == FM_F32 && fm_cpu_use_avx2(), 0, 0, 1.0, dt};
    fm_parallel_for(rows, row_grain(C), ce_fwd_rows, &c);
    void *out = fm_tensor_data(call->out[0]);
    if (a->reduction == FM_REDUCE_NONE) {
        for (int64_t r = 0; r < rows; r++) {
            if (dt == FM_F64) ((double *)out)[r] = row_loss[r];
            else ((float *)out)[r] = (float)row_loss[r];
        }
    } else {
        double s = 0;
        for (int64_t r = 0; r < rows; r++) s += row_loss[r];
        if (a->reduction == FM_REDUCE_MEAN) s /= (double)count; /* all ignored: 0/0 = NaN, as PyTorch */
        if (dt == FM_F64) *(double *)out = s;
        else *(float *)out = (float)s;
    }
    free(row_loss);
    return FM_OK;
}

static void ce_bwd_rows(void *vc, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    ce_ctx *c = vc;
    double eps = c->a->label_smoothing;
    int64_t C = c->C;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = target_at(c->tgt, c->tg, r);
        double g;
        if (c->dt == FM_F64) g = ((const double *)c->g)[c->g_per_row ? r : 0];
        else g = ((const float *)c->g)[c->g_per_row ? r : 0];
        g *= c->g_scale;
        if (t == c->a->ignore_index) g = 0;
        /* dx_c = g * (p_c - (1-eps)[c==t] - eps/C) */
        double shift = g * eps / (double)C;
        if (c->dt == FM_F64) {
            const double *x = (const double *)c->x + r * C;
            double *dx = (double *)c->dx + r * C, m, se, sx;
            ce_row_stats_f64(x, C, &m, &se, &sx);
            ce_bwd_row_f64(x, dx, C, m, g / se, shift);
            if (t != c->a->ignore_index) dx[t] -= g * (1 - eps);
        } else {
            const float *x = (const float *)c->x + r * C;
            float *dx = (float *)c->dx + r * C;
            if (c->simd && simd()->ce_bwd_fused) {
                simd()->ce_bwd_fused(x, dx, C, g, (float)shift, c->stream);
            } else if (c->simd) {
                float fm, fs, fx;
                simd()->ce_stats(x, C, &fm, &fs, &fx);
                simd()->ce_bwd(x, dx, C, fm, (float)(g / fs), (float)shift, c->stream);
            } else {
                double m, se, sx;
                ce_row_stats_f32(x, C, &m, &se, &sx);
                ce_bwd_row_f32(x, dx, C, (float)m, (float)(g / se), (float)shift);
            }
            if (t != c->a->ignore_index) dx[t] -= (float)(g * (1 - eps));
        }
    }
}

static fm_status ce_bwd_kernel(const fm_op_call *call) {
    const fm_tensor *g = call->in[0], *x = call->in[1], *tg = call->in[2];
    const fm_ce_attrs *a = call->attrs;
    fm_dtype dt = x->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    if (g->dtype != dt) return fm_cpu_unsupported_dtype(call, g->dtype);
    int64_t C = last_dim(x), rows = fm_tensor_numel(tg), count = 0;
    fm_status st = check_targets(call, tg, rows, C, a->ignore_index, &count);
    if (st != FM_OK) return st;
    ce_ctx c = {fm_tensor_data(x), fm_tensor_data(tg), fm_tensor_data(g), fm_tensor_data(call->out[0]), NULL, tg, C, a,
                dt == FM_F32 && fm_cpu_use_avx2(), a->reduction == FM_REDUCE_NONE, 0, 1.0, dt};
    c.stream = c.simd && fm_cpu_stream_rows(c.dx, C, fm_tensor_numel(x));
    if (a->reduction == FM_REDUCE_MEAN) c.g_scale = 1.0 / (double)count;
    fm_parallel_for(rows, row_grain(C), ce_bwd_rows, &c);
    return FM_OK;
}

/* ---- MSE: fixed-size blocks of partial sums keep the total independent of threads ---- */
#define MSE_BLOCK 16384
typedef struct mse_ctx {
    const void *a, *b;
    void *out;
    double *partial;
    int64_t n;
    int none;
    fm_dtype dt;
} mse_ctx;

static void mse_blocks(void *vc, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    mse_ctx *c = vc;
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t i0 = blk * MSE_BLOCK, i1 = i0 + MSE_BLOCK < c->n ? i0 + MSE_BLOCK : c->n;
        double s = 0;
        if (c->dt == FM_F64) {
            const double *a = c->a, *b = c->b;
            double *o = c->out;
            for (int64_t i = i0; i < i1; i++) {
                double d = a[i] - b[i];
                if (c->none) o[i] = d * d;
                else s += d * d;
            }
        } else {
            const float *a = c->a, *b = c->b;
            float *o = c->out;
            float fs = 0; /* f32 accumulation within a block; blocks are summed in double */
            for (int64_t i = i0; i < i1; i++) {
                float d = a[i] - b[i];
                if (c->none) o[i] = d * d;
                else fs += d * d;
            }
            s = fs;
        }
        if (!c->none) c->partial[blk] = s;
    }
}

static fm_status mse_kernel(const fm_op_call *call) {
    const fm_tensor *a = call->in[0], *b = call->in[1];
    const fm_mse_attrs *at = call->attrs;
    fm_dtype dt = a->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    int64_t n = fm_tensor_numel(a), nblk = (n + MSE_BLOCK - 1) / MSE_BLOCK;
    mse_ctx c = {fm_tensor_data(a), fm_tensor_data(b), fm_tensor_data(call->out[0]), NULL, n,
                 at->reduction == FM_REDUCE_NONE, dt};
    if (!c.none) {
        c.partial = calloc((size_t)(nblk ? nblk : 1), sizeof(double));
        if (!c.partial) return fm_set_error(FM_ERR_OOM, "mse_loss: out of host memory");
    }
    fm_parallel_for(nblk, 1, mse_blocks, &c);
    if (!c.none) {
        double s = 0;
        for (int64_t k = 0; k < nblk; k++) s += c.partial[k];
        if (at->reduction == FM_REDUCE_MEAN) s /= (double)n;
        if (dt == FM_F64) *(double *)c.out = s;
        else *(float *)c.out = (float)s;
        free(c.partial);
    }
    return FM_OK;
}

void fm_cpu_kernels_softmax(fm_backend *b) {
    b->kernels[FM_OP_SOFTMAX] = softmax_kernel;
    b->kernels[FM_OP_LOG_SOFTMAX] = log_softmax_kernel;
    b->kernels[FM_OP_SOFTMAX_BACKWARD] = softmax_bwd_kernel;
    b->kernels[FM_OP_LOG_SOFTMAX_BACKWARD] = log_softmax_bwd_kernel;
    b->kernels[FM_OP_CROSS_ENTROPY] = ce_kernel;
    b->kernels[FM_OP_CROSS_ENTROPY_BACKWARD] = ce_bwd_kernel;
    b->kernels[FM_OP_MSE_LOSS] = mse_kernel;
}
