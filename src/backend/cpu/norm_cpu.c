/* CPU kernels for layer norm, RMS norm, embedding and dropout (+ backward).
 *
 * Norms work on rows of a contiguous [M, N] view (M = number of statistics the
 * front end allocated, N = numel / M). Rows are split over the thread pool;
 * weight/bias gradients, which sum over rows, are accumulated per fixed-size
 * chunk of rows (the chunk size depends only on M) and the chunks are then
 * added in order, so the result is the same for any thread count. f32 rows use
 * norm_avx2.c when the CPU has AVX2/FMA; the scalar templates serve f64 and
 * other CPUs. Index checks (embedding) run serially before the parallel part
 * because error messages are thread-local. Dropout draws its keep mask from
 * Philox at (seed, offset + i/4, lane i%4), the layout rng.c uses, so the mask
 * is a function of (seed, offset, i) only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* norm_avx2.c */
void fm_layernorm_row_f32_avx2(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                               float *mean_out, float *rstd_out, int stream);
void fm_layernorm_bwd_row_f32_avx2(const float *dy, const float *x, const float *w, float mean, float rstd,
                                   float *dx, float *dw_acc, float *db_acc, int64_t n, int stream);
void fm_rmsnorm_row_f32_avx2(const float *x, const float *w, float *y, int64_t n, float eps, float *rstd_out,
                             int stream);
void fm_rmsnorm_bwd_row_f32_avx2(const float *dy, const float *x, const float *w, float rstd, float *dx,
                                 float *dw_acc, int64_t n, int stream);
/* norm_avx512.c: the same rows at 16 lanes */
void fm_layernorm_row_f32_avx512(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                                 float *mean_out, float *rstd_out, int stream);
void fm_layernorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                     float *dx, float *dw_acc, float *db_acc, int64_t n, int stream);
void fm_rmsnorm_row_f32_avx512(const float *x, const float *w, float *y, int64_t n, float eps, float *rstd_out,
                               int stream);
void fm_rmsnorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float rstd, float *dx,
                                   float *dw_acc, int64_t n, int stream);

/* The SIMD row kernels of the level in use (called where `simd` is set). */
typedef struct simd_rows {
    void (*ln)(const float *, const float *, const float *, float *, int64_t, float, float *, float *, int);
    void (*ln_bwd)(const float *, const float *, const float *, float, float, float *, float *, float *, int64_t, int);
    void (*rms)(const float *, const float *, float *, int64_t, float, float *, int);
    void (*rms_bwd)(const float *, const float *, const float *, float, float *, float *, int64_t, int);
} simd_rows;
static const simd_rows rows_avx2 = {fm_layernorm_row_f32_avx2, fm_layernorm_bwd_row_f32_avx2, fm_rmsnorm_row_f32_avx2,
                                    fm_rmsnorm_bwd_row_f32_avx2};
static const simd_rows rows_avx512 = {fm_layernorm_row_f32_avx512, fm_layernorm_bwd_row_f32_avx512,
                                      fm_rmsnorm_row_f32_avx512, fm_rmsnorm_bwd_row_f32_avx512};
static const simd_rows *simd(void) { return fm_cpu_use_avx512() ? &rows_avx512 : &rows_avx2; }

/* ---- scalar row templates; statistics accumulate in double ---- */
#define DEFINE_NORM_ROWS(T, SFX)                                                                    \
    static void ln_row_##SFX(const T *x, const T *w, const T *b, T *y, int64_t n, double eps, T *mo, \
                             T *ro) {                                                               \
        double s = 0, v = 0;                                                                        \
        for (int64_t i = 0; i < n; i++) s += x[i];                                                  \
        double mean = s / (double)n;                                                                \
        for (int64_t i = 0; i < n; i++) { double d = x[i] - mean; v += d * d; }                     \
        double rstd = 1.0 / sqrt(v / (double)n + eps);                                              \
        *mo = (T)mean; *ro = (T)rstd;                                                               \
        for (int64_t i = 0; i < n; i++) {                                                           \
            T h = (T)((x[i] - mean) * rstd);                                                        \
            if (w) h *= w[i];                                                                       \
            if (b) h += b[i];                                                                       \
            y[i] = h;                                                                               \
        }                                                                                           \
    }                                                                                               \
    static void ln_bwd_row_##SFX(const T *dy, const T *x, const T *w, T mean, T rstd, T *dx, T *dwa,  \
                                 T *dba, int64_t n) {                                               \
        double sg = 0, sgx = 0;                                                                     \
        for (int64_t i = 0; i < n; i++) {                                                           \
            T h = (x[i] - mean) * rstd, g = w ? dy[i] * w[i] : dy[i];                               \
            sg += g; sgx += (double)g * h;                                                          \
            if (dwa) dwa[i] += dy[i] * h;                                                           \
            if (dba) dba[i] += dy[i];                                                               \
        }                                                                                           \
        T a = (T)(sg / (double)n), c = (T)(sgx / (double)n);                                        \
        for (int64_t i = 0; i < n; i++) {                                                           \
            T h = (x[i] - mean) * rstd, g = w ? dy[i] * w[i] : dy[i];                               \
            dx[i] = rstd * (g - a - h * c);                                                         \
        }                                                                                           \
    }                                                                                               \
    static void rms_row_##SFX(const T *x, const T *w, T *y, int64_t n, double eps, T *ro) {         \
        double ss = 0;                                                                              \
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];                                  \
        T rstd = (T)(1.0 / sqrt(ss / (double)n + eps));                                             \
        *ro = rstd;                                                                                 \
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * rstd * (w ? w[i] : (T)1);                     \
    }                                                                                               \
    static void rms_bwd_row_##SFX(const T *dy, const T *x, const T *w, T rstd, T *dx, T *dwa,         \
                                  int64_t n) {                                                      \
        double sgx = 0;                                                                             \
        for (int64_t i = 0; i < n; i++) {                                                           \
            T h = x[i] * rstd, g = w ? dy[i] * w[i] : dy[i];                                        \
            sgx += (double)g * h;                                                                   \
            if (dwa) dwa[i] += dy[i] * h;                                                           \
        }                                                                                           \
        T c = (T)(sgx / (double)n);                                                                 \
        for (int64_t i = 0; i < n; i++) {                                                           \
            T h = x[i] * rstd, g = w ? dy[i] * w[i] : dy[i];                                        \
            dx[i] = rstd * (g - h * c);                                                             \
        }                                                                                           \
    }
DEFINE_NORM_ROWS(float, f32)
DEFINE_NORM_ROWS(double, f64)

static const void *data_or_null(const fm_tensor *t) { return t ? fm_tensor_data(t) : NULL; }
static int64_t row_grain(int64_t n) { return n >= 8192 ? 1 : 8192 / (n ? n : 1); }

typedef struct norm_ctx {
    const void *x, *w, *b, *dy;
    void *y, *mean, *rstd, *dx;
    void *dw_part, *db_part; /* [n_chunks, N] accumulators (backward) */
    int64_t M, N, rows_per_chunk;
    double eps;
    int rms, simd, stream;
    fm_dtype dt;
} norm_ctx;

static void norm_fwd_rows(void *vc, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    norm_ctx *c = vc;
    int64_t N = c->N;
    for (int64_t r = r0; r < r1; r++) {
        if (c->dt == FM_F64) {
            const double *x = (const double *)c->x + r * N;
            double *y = (double *)c->y + r * N, *rs = (double *)c->rstd + r;
            if (c->rms) rms_row_f64(x, c->w, y, N, c->eps, rs);
            else ln_row_f64(x, c->w, c->b, y, N, c->eps, (double *)c->mean + r, rs);
        } else {
            const float *x = (const float *)c->x + r * N;
            float *y = (float *)c->y + r * N, *rs = (float *)c->rstd + r;
            if (c->simd) {
                if (c->rms) simd()->rms(x, c->w, y, N, (float)c->eps, rs, c->stream);
                else simd()->ln(x, c->w, c->b, y, N, (float)c->eps, (float *)c->mean + r, rs, c->stream);
            } else {
                if (c->rms) rms_row_f32(x, c->w, y, N, c->eps, rs);
                else ln_row_f32(x, c->w, c->b, y, N, c->eps, (float *)c->mean + r, rs);
            }
        }
    }
}

static fm_status check_float(const fm_op_call *call, const fm_tensor *t, fm_dtype dt) {
    if (t && t->dtype != dt) return fm_cpu_unsupported_dtype(call, t->dtype);
    return FM_OK;
}

static fm_status norm_fwd(const fm_op_call *call, int rms) {
    const fm_tensor *x = call->in[0], *w = call->in[1], *b = rms ? NULL : call->in[2];
    fm_dtype dt = x->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    const fm_tensor *rstd_t = call->out[rms ? 1 : 2];
    if (check_float(call, w, dt) || check_float(call, b, dt) || check_float(call, rstd_t, dt))
        return fm_last_status();
    norm_ctx c = {0};
    c.M = fm_tensor_numel(rstd_t);
    if (c.M == 0) return FM_OK;
    c.N = fm_tensor_numel(x) / c.M;
    if (c.N == 0) return FM_OK;
    c.x = fm_tensor_data(x); c.w = data_or_null(w); c.b = data_or_null(b);
    c.y = fm_tensor_data(call->out[0]);
    c.mean = rms ? NULL : fm_tensor_data(call->out[1]);
    c.rstd = fm_tensor_data(rstd_t);
    c.eps = ((const fm_norm_attrs *)call->attrs)->eps;
    c.rms = rms; c.dt = dt; c.simd = dt == FM_F32 && fm_cpu_use_avx2();
    c.stream = c.simd && fm_cpu_stream_rows(c.y, c.N, c.M * c.N);
    fm_parallel_for(c.M, row_grain(c.N), norm_fwd_rows, &c);
    return FM_OK;
}

static void norm_bwd_chunks(void *vc, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    norm_ctx *c = vc;
    int64_t N = c->N;
    size_t es = c->dt == FM_F64 ? 8 : 4;
    for (int64_t k = k0; k < k1; k++) {
        int64_t r0 = k * c->rows_per_chunk, r1 = r0 + c->rows_per_chunk < c->M ? r0 + c->rows_per_chunk : c->M;
        void *dwa = c->dw_part ? (char *)c->dw_part + (size_t)(k * N) * es : NULL;
        void *dba = c->db_part ? (char *)c->db_part + (size_t)(k * N) * es : NULL;
        for (int64_t r = r0; r < r1; r++) {
            if (c->dt == FM_F64) {
                const double *dy = (const double *)c->dy + r * N, *x = (const double *)c->x + r * N;
                double *dx = (double *)c->dx + r * N, rs = ((const double *)c->rstd)[r];
                if (c->rms) rms_bwd_row_f64(dy, x, c->w, rs, dx, dwa, N);
                else ln_bwd_row_f64(dy, x, c->w, ((const double *)c->mean)[r], rs, dx, dwa, dba, N);
            } else {
                const float *dy = (const float *)c->dy + r * N, *x = (const float *)c->x + r * N;
                float *dx = (float *)c->dx + r * N, rs = ((const float *)c->rstd)[r];
                float mu = c->rms ? 0 : ((const float *)c->mean)[r];
                if (c->simd) {
                    if (c->rms) simd()->rms_bwd(dy, x, c->w, rs, dx, dwa, N, c->stream);
                    else simd()->ln_bwd(dy, x, c->w, mu, rs, dx, dwa, dba, N, c->stream);
                } else {
                    if (c->rms) rms_bwd_row_f32(dy, x, c->w, rs, dx, dwa, N);
                    else ln_bwd_row_f32(dy, x, c->w, mu, rs, dx, dwa, dba, N);
                }
            }
        }
    }
}

/* Sums the per-chunk partials column by column, chunks in order. */
typedef struct colsum_ctx {
    const void *part;
    void *out;
    int64_t n_chunks, N;
    fm_dtype dt;
} colsum_ctx;

static void colsum_range(void *vc, int64_t j0, int64_t j1, int tid) {
    (void)tid;
    colsum_ctx *c = vc;
    if (c->dt == FM_F64) {
        const double *p = c->part;
        double *o = c->out;
        for (int64_t j = j0; j < j1; j++) o[j] = 0;
        for (int64_t k = 0; k < c->n_chunks; k++)
            for (int64_t j = j0; j < j1; j++) o[j] += p[k * c->N + j];
    } else {
        const float *p = c->part;
        float *o = c->out;
        for (int64_t j = j0; j < j1; j++) o[j] = 0;
        for (int64_t k = 0; k < c->n_chunks; k++)
            for (int64_t j = j0; j < j1; j++) o[j] += p[k * c->N + j];
    }
}

/* LAYER_NORM_BACKWARD in = {dy, x, w|NULL, mean, rstd}, out = {dx, dw|NULL, db|NULL};
 * RMS_NORM_BACKWARD in = {dy, x, w|NULL, rstd}, out = {dx, dw|NULL}. */
static fm_status norm_bwd(const fm_op_call *call, int rms) {
    const fm_tensor *dy = call->in[0], *x = call->in[1], *w = call->in[2];
    const fm_tensor *mean = rms ? NULL : call->in[3], *rstd = call->in[rms ? 3 : 4];
    fm_tensor *dx = call->out[0], *dw = call->n_out > 1 ? call->out[1] : NULL;
    fm_tensor *db = !rms && call->n_out > 2 ? call->out[2] : NULL;
    fm_dtype dt = x->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    if (check_float(call, dy, dt) || check_float(call, w, dt) || check_float(call, rstd, dt) ||
        check_float(call, mean, dt))
        return fm_last_status();
    if (dw && !w) return fm_set_error(FM_ERR_INTERNAL, "%s: dweight requested without weight", fm_op_get_info(call->op)->name);
    norm_ctx c = {0};
    c.M = fm_tensor_numel(rstd);
    c.N = c.M ? fm_tensor_numel(x) / c.M : 0;
    size_t es = dt == FM_F64 ? 8 : 4;
    if (c.M == 0 || c.N == 0) { /* nothing normalized: weight/bias gradients are zero */
        if (dw) memset(fm_tensor_data(dw), 0, (size_t)fm_tensor_numel(dw) * es);
        if (db) memset(fm_tensor_data(db), 0, (size_t)fm_tensor_numel(db) * es);
        return FM_OK;
    }
    c.rows_per_chunk = (c.M + 63) / 64;
    if (c.rows_per_chunk < 32) c.rows_per_chunk = 32;
    int64_t n_chunks = (c.M + c.rows_per_chunk - 1) / c.rows_per_chunk;
    /* partials from the caching allocator: calloc would mmap (and page-fault) them afresh on every call */
    int64_t part_n = n_chunks * c.N;
    fm_tensor *dw_t = dw ? fm_tensor_empty(1, &part_n, dt, FM_CPU) : NULL;
    fm_tensor *db_t = db ? fm_tensor_empty(1, &part_n, dt, FM_CPU) : NULL;
    if ((dw && !dw_t) || (db && !db_t)) {
        fm_tensor_release_n(2, dw_t, db_t);
        return fm_set_error(FM_ERR_OOM, "%s: out of memory for gradient partials", fm_op_get_info(call->op)->name);
    }
    if (dw_t) c.dw_part = memset(fm_tensor_data(dw_t), 0, (size_t)part_n * es);
    if (db_t) c.db_part = memset(fm_tensor_data(db_t), 0, (size_t)part_n * es);
    c.dy = fm_tensor_data(dy); c.x = fm_tensor_data(x); c.w = data_or_null(w);
    c.mean = mean ? fm_tensor_data(mean) : NULL;
    c.rstd = fm_tensor_data(rstd); c.dx = fm_tensor_data(dx);
    c.rms = rms; c.dt = dt; c.simd = dt == FM_F32 && fm_cpu_use_avx2();
    c.stream = c.simd && fm_cpu_stream_rows(c.dx, c.N, c.M * c.N);
    fm_parallel_for(n_chunks, 1, norm_bwd_chunks, &c);
    int64_t cgrain = c.N < 256 ? c.N : 256;
    if (dw) {
        colsum_ctx cs = {c.dw_part, fm_tensor_data(dw), n_chunks, c.N, dt};
        fm_parallel_for(c.N, cgrain, colsum_range, &cs);
    }
    if (db) {
        colsum_ctx cs = {c.db_part, fm_tensor_data(db), n_chunks, c.N, dt};
        fm_parallel_for(c.N, cgrain, colsum_range, &cs);
    }
    fm_tensor_release_n(2, dw_t, db_t);
    return FM_OK;
}

static fm_status layer_norm_kernel(const fm_op_call *c) { return norm_fwd(c, 0); }
static fm_status rms_norm_kernel(const fm_op_call *c) { return norm_fwd(c, 1); }
static fm_status layer_norm_bwd_kernel(const fm_op_call *c) { return norm_bwd(c, 0); }
static fm_status rms_norm_bwd_kernel(const fm_op_call *c) { return norm_bwd(c, 1); }

/* ---- embedding ---- */
static int64_t index_at(const fm_tensor *t, const void *d, int64_t i) {
    return t->dtype == FM_I64 ? ((const int64_t *)d)[i] : (int64_t)((const int32_t *)d)[i];
}

static fm_status check_indices(const fm_op_call *call, const fm_tensor *idx, int64_t V) {
    const char *name = fm_op_get_info(call->op)->name;
    if (idx->dtype != FM_I64 && idx->dtype != FM_I32)
        return fm_set_error(FM_ERR_INVALID, "%s: indices dtype %s must be i64 or i32", name, fm_dtype_name(idx->dtype));
    const void *d = fm_tensor_data(idx);
    int64_t n = fm_tensor_numel(idx);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = index_at(idx, d, i);
        if (v < 0 || v >= V)
            return fm_set_error(FM_ERR_INVALID, "%s: index %lld at position %lld is out of range [0, %lld)", name,
                                (long long)v, (long long)i, (long long)V);
    }
    return FM_OK;
}

typedef struct emb_ctx {
    const fm_tensor *idx;
    const void *idx_data, *src;
    void *dst;
    int64_t n_idx, D;
    size_t es;
    fm_dtype dt;
} emb_ctx;

static void emb_fwd_range(void *vc, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    emb_ctx *c = vc;
    size_t row = (size_t)c->D * c->es;
    for (int64_t i = i0; i < i1; i++)
        memcpy((char *)c->dst + (size_t)i * row, (const char *)c->src + (size_t)index_at(c->idx, c->idx_data, i) * row,
               row);
}

static fm_status embedding_kernel(const fm_op_call *call) {
    const fm_tensor *w = call->in[0], *idx = call->in[1];
    if (w->ndim != 2) return fm_set_error(FM_ERR_INVALID, "embedding: weight must be 2-D [V, D]");
    fm_status st = check_indices(call, idx, w->shape[0]);
    if (st != FM_OK) return st;
    emb_ctx c = {idx, fm_tensor_data(idx), fm_tensor_data(w), fm_tensor_data(call->out[0]), fm_tensor_numel(idx),
                 w->shape[1], fm_dtype_size(w->dtype), w->dtype};
    fm_parallel_for(c.n_idx, row_grain(c.D), emb_fwd_range, &c);
    return FM_OK;
}

/* Each thread owns a column slice of dweight and walks every index: no races,
 * and each element's additions happen in index order whatever the thread count. */
static void emb_bwd_cols(void *vc, int64_t j0, int64_t j1, int tid) {
    (void)tid;
    emb_ctx *c = vc; /* src = dy [n_idx, D], dst = dweight [V, D] */
    int64_t D = c->D;
    for (int64_t i = 0; i < c->n_idx; i++) {
        int64_t v = index_at(c->idx, c->idx_data, i);
        if (c->dt == FM_F64) {
            const double *s = (const double *)c->src + i * D;
            double *d = (double *)c->dst + v * D;
            for (int64_t j = j0; j < j1; j++) d[j] += s[j];
        } else {
            const float *s = (const float *)c->src + i * D;
            float *d = (float *)c->dst + v * D;
            for (int64_t j = j0; j < j1; j++) d[j] += s[j];
        }
    }
}

static fm_status embedding_bwd_kernel(const fm_op_call *call) {
    const fm_tensor *dy = call->in[0], *idx = call->in[1];
    fm_tensor *dw = call->out[0];
    fm_dtype dt = dw->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    if (dy->dtype != dt) return fm_cpu_unsupported_dtype(call, dy->dtype);
    fm_status st = check_indices(call, idx, dw->shape[0]);
    if (st != FM_OK) return st;
    memset(fm_tensor_data(dw), 0, fm_tensor_nbytes(dw));
    emb_ctx c = {idx, fm_tensor_data(idx), fm_tensor_data(dy), fm_tensor_data(dw), fm_tensor_numel(idx), dw->shape[1],
                 fm_dtype_size(dt), dt};
    fm_parallel_for(c.D, 64, emb_bwd_cols, &c);
    return FM_OK;
}

/* ---- dropout ---- */
typedef struct drop_ctx {
    const void *x;
    void *y;
    uint8_t *mask;
    int64_t n;
    double keep_thresh, scale; /* keep when (r >> 8) < keep_thresh */
    uint64_t seed, offset;
    fm_dtype dt;
} drop_ctx;

static void dropout_groups(void *vc, int64_t g0, int64_t g1, int tid) {
    (void)tid;
    drop_ctx *c = vc;
    for (int64_t g = g0; g < g1; g++) {
        uint32_t r[4];
        fm_philox4x32(c->seed, 0, c->offset + (uint64_t)g, r);
        for (int k = 0; k < 4; k++) {
            int64_t i = g * 4 + k;
            if (i >= c->n) break;
            uint8_t keep = (double)(r[k] >> 8) < c->keep_thresh;
            c->mask[i] = keep;
            if (c->dt == FM_F64) ((double *)c->y)[i] = keep ? ((const double *)c->x)[i] * c->scale : 0.0;
            else ((float *)c->y)[i] = keep ? ((const float *)c->x)[i] * (float)c->scale : 0.0f;
        }
    }
}

static fm_status dropout_kernel(const fm_op_call *call) {
    const fm_tensor *x = call->in[0];
    const fm_dropout_attrs *a = call->attrs;
    fm_dtype dt = x->dtype;
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    if (call->out[1]->dtype != FM_U8 && call->out[1]->dtype != FM_BOOL)
        return fm_cpu_unsupported_dtype(call, call->out[1]->dtype);
    int64_t n = fm_tensor_numel(x);
    drop_ctx c = {fm_tensor_data(x), fm_tensor_data(call->out[0]), fm_tensor_data(call->out[1]), n,
                  (1.0 - a->p) * 16777216.0, a->p < 1 ? 1.0 / (1.0 - a->p) : 0.0, a->seed, a->offset, dt};
    fm_parallel_for((n + 3) / 4, 2048, dropout_groups, &c);
    return FM_OK;
}

void fm_cpu_kernels_norm(fm_backend *b) {
    b->kernels[FM_OP_LAYER_NORM] = layer_norm_kernel;
    b->kernels[FM_OP_LAYER_NORM_BACKWARD] = layer_norm_bwd_kernel;
    b->kernels[FM_OP_RMS_NORM] = rms_norm_kernel;
    b->kernels[FM_OP_RMS_NORM_BACKWARD] = rms_norm_bwd_kernel;
    b->kernels[FM_OP_EMBEDDING] = embedding_kernel;
    b->kernels[FM_OP_EMBEDDING_BACKWARD] = embedding_bwd_kernel;
    b->kernels[FM_OP_DROPOUT] = dropout_kernel;
}
