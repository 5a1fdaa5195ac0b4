/* CPU kernels of the fused transformer helpers (src/ops/fused.c).
 *
 * qkv_split_heads is pure data movement, so one byte-copy kernel serves every
 * dtype; rows (b, t) are independent, so threads split them with no effect on
 * the result.
 *
 * bias_gelu_tanh and add_layer_norm work on rows of a contiguous [M, N] view.
 * f32 rows use fused_avx2.c when the CPU has AVX2/FMA; the scalar templates
 * below serve f64 (gradient checks) and other CPUs, with statistics in double.
 * Gradients of the [N] vectors (bias, norm weight and bias) are summed per
 * fixed-size chunk of rows, and the chunks are then added in order, so results
 * do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_features.h"
#include "core/parallel.h"
#include "backend/scalar_math.h"
#include "cpu_kernels.h"

/* fused_avx2.c */
void fm_bias_gelu_row_f32_avx2(const float *x, const float *b, float *y, int64_t n);
void fm_bias_gelu_bwd_row_f32_avx2(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                   int64_t n);
void fm_add_ln_row_f32_avx2(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                            int64_t n, float eps, float *mean_out, float *rstd_out);
void fm_add_ln_bwd_row_f32_avx2(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                float rstd, float *g, float *dw_acc, float *db_acc, int64_t n);

/* fused_avx512.c: bias + GELU(tanh) rows, bitwise the AVX2 ones; add + layer norm rows */
void fm_bias_gelu_row_f32_avx512(const float *x, const float *b, float *y, int64_t n);
void fm_add_ln_row_f32_avx512(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                              int64_t n, float eps, float *mean_out, float *rstd_out);
void fm_bias_gelu_bwd_row_f32_avx512(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                     int64_t n);
void fm_add_ln_bwd_row_f32_avx512(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                  float rstd, float *g, float *dw_acc, float *db_acc, int64_t n);

typedef struct {
    const fm_op_call *c;
    int64_t T, H, KV, D;
    size_t es;
} split_ctx;

static void split_fwd_range(void *ctx, int64_t begin, int64_t end, int tid) {
    const split_ctx *s = ctx;
    const int64_t T = s->T, H = s->H, KV = s->KV, D = s->D, W = (H + 2 * KV) * D;
    const size_t es = s->es, row = (size_t)D * es;
    const char *x = fm_tensor_data(s->c->in[0]);
    char *q = fm_tensor_data(s->c->out[0]), *k = fm_tensor_data(s->c->out[1]), *v = fm_tensor_data(s->c->out[2]);
    for (int64_t r = begin; r < end; r++) {
        const int64_t b = r / T, t = r % T;
        const char *src = x + (size_t)(r * W) * es;
        for (int64_t h = 0; h < H; h++) memcpy(q + (size_t)(((b * H + h) * T + t) * D) * es, src + (size_t)(h * D) * es, row);
        for (int64_t h = 0; h < KV; h++) {
            memcpy(k + (size_t)(((b * KV + h) * T + t) * D) * es, src + (size_t)((H + h) * D) * es, row);
            memcpy(v + (size_t)(((b * KV + h) * T + t) * D) * es, src + (size_t)((H + KV + h) * D) * es, row);
        }
    }
}

static void split_bwd_range(void *ctx, int64_t begin, int64_t end, int tid) {
    const split_ctx *s = ctx;
    const int64_t T = s->T, H = s->H, KV = s->KV, D = s->D, W = (H + 2 * KV) * D;
    const size_t es = s->es, row = (size_t)D * es;
    const fm_tensor *g[3] = {s->c->in[0], s->c->in[1], s->c->in[2]};
    const char *gq = g[0] ? fm_tensor_data(g[0]) : NULL, *gk = g[1] ? fm_tensor_data(g[1]) : NULL,
               *gv = g[2] ? fm_tensor_data(g[2]) : NULL;
    char *dx = fm_tensor_data(s->c->out[0]);
    for (int64_t r = begin; r < end; r++) {
        const int64_t b = r / T, t = r % T;
        char *dst = dx + (size_t)(r * W) * es;
        for (int64_t h = 0; h < H; h++) {
            char *d = dst + (size_t)(h * D) * es;
            if (gq) memcpy(d, gq + (size_t)(((b * H + h) * T + t) * D) * es, row);
            else memset(d, 0, row); /* all-zero bits are 0.0 in every float format */
        }
        for (int64_t h = 0; h < KV; h++) {
            char *dk = dst + (size_t)((H + h) * D) * es, *dv = dst + (size_t)((H + KV + h) * D) * es;
            if (gk) memcpy(dk, gk + (size_t)(((b * KV + h) * T + t) * D) * es, row);
            else memset(dk, 0, row);
            if (gv) memcpy(dv, gv + (size_t)(((b * KV + h) * T + t) * D) * es, row);
            else memset(dv, 0, row);
        }
    }
}

static fm_status qkv_split(const fm_op_call *c, bool bwd) {
    const fm_qkv_split_attrs *a = c->attrs;
    const fm_tensor *x = bwd ? c->out[0] : c->in[0];
    split_ctx s = {c, x->shape[1], a->n_head, a->n_kv_head, a->head_dim, fm_dtype_size(x->dtype)};
    const int64_t rows = x->shape[0] * x->shape[1];
    /* each row moves (H+2KV)*D elements: aim for ~16 KiB per task */
    int64_t bytes = (a->n_head + 2 * a->n_kv_head) * a->head_dim * (int64_t)s.es, grain = 16384 / (bytes ? bytes : 1);
    fm_parallel_for(rows, grain < 1 ? 1 : grain, bwd ? split_bwd_range : split_fwd_range, &s);
    return FM_OK;
}

static fm_status qkv_split_kernel(const fm_op_call *c) { return qkv_split(c, false); }
static fm_status qkv_split_bwd_kernel(const fm_op_call *c) { return qkv_split(c, true); }

/* ---------------- scalar rows (tanh GELU from backend/scalar_math.h) ---------------- */

#define DEFINE_FUSED_ROWS(T, SFX)                                                                      \
    static void bg_row_##SFX(const T *x, const T *b, T *y, int64_t n) {                                \
        for (int64_t i = 0; i < n; i++) y[i] = (T)fm_gelu_tanh_d((double)(T)(x[i] + b[i]));             \
    }                                                                                                  \
    static void bg_bwd_row_##SFX(const T *dy, const T *x, const T *b, T *dx, T *dba, int64_t n) {      \
        for (int64_t i = 0; i < n; i++) {                                                              \
            T d = (T)(dy[i] * (T)fm_gelu_tanh_deriv_d((double)(T)(x[i] + b[i])));                      \
            dx[i] = d;                                                                                 \
            if (dba) dba[i] += d;                                                                      \
        }                                                                                              \
    }                                                                                                  \
    static void aln_row_##SFX(const T *x, const T *h, const T *w, const T *b, T *s, T *y, int64_t n,   \
                              double eps, T *mo, T *ro) {                                              \
        double sum = 0, var = 0;                                                                       \
        for (int64_t i = 0; i < n; i++) {                                                              \
            T v = h ? (T)(x[i] + h[i]) : x[i];                                                         \
            if (h) s[i] = v;                                                                           \
            sum += v;                                                                                  \
        }                                                                                              \
        const T *src = h ? s : x;                                                                      \
        double mean = sum / (double)n;                                                                 \
        for (int64_t i = 0; i < n; i++) { double d = src[i] - mean; var += d * d; }                     \
        double rstd = 1.0 / sqrt(var / (double)n + eps);                                               \
        *mo = (T)mean;                                                                                 \
        *ro = (T)rstd;                                                                                 \
        for (int64_t i = 0; i < n; i++) {                                                              \
            T t = (T)((src[i] - mean) * rstd);                                                         \
            if (w) t *= w[i];                                                                          \
            if (b) t += b[i];                                                                          \
            y[i] = t;                                                                                  \
        }                                                                                              \
    }                                                                                                  \
    static void aln_bwd_row_##SFX(const T *dy, const T *ds, const T *s, const T *w, T mean, T rstd,    \
                                  T *g, T *dwa, T *dba, int64_t n) {                                   \
        if (!dy) {                                                                                     \
            for (int64_t i = 0; i < n; i++) g[i] = ds ? ds[i] : (T)0;                                  \
            return;                                                                                    \
        }                                                                                              \
        double sg = 0, sgx = 0;                                                                        \
        for (int64_t i = 0; i < n; i++) {                                                              \
            T xh = (s[i] - mean) * rstd, gw = w ? dy[i] * w[i] : dy[i];                                \
            sg += gw;                                                                                  \
            sgx += (double)gw * xh;                                                                    \
            if (dwa) dwa[i] += dy[i] * xh;                                                             \
            if (dba) dba[i] += dy[i];                                                                  \
        }                                                                                              \
        T a = (T)(sg / (double)n), c = (T)(sgx / (double)n);                                           \
        for (int64_t i = 0; i < n; i++) {                                                              \
            T xh = (s[i] - mean) * rstd, gw = w ? dy[i] * w[i] : dy[i];                                \
            T dx = rstd * (gw - a - xh * c);                                                           \
            g[i] = ds ? (T)(dx + ds[i]) : dx;                                                          \
        }                                                                                              \
    }
DEFINE_FUSED_ROWS(float, f32)
DEFINE_FUSED_ROWS(double, f64)

/* ---------------- shared row plumbing ---------------- */

typedef struct rows_ctx {
    const fm_op_call *c;
    const void *in[6]; /* data pointers of the call's tensors (NULL where absent), looked up once */
    void *out[4];
    int64_t M, N, rows_per_chunk;
    fm_dtype dt;
    int simd; /* 0 scalar, 1 AVX2, 2 AVX-512 (bias + GELU and the add + norm forward; the norm's backward stays AVX2) */
    double eps;
    void *part_a, *part_b; /* [n_chunks, N] gradient partials (backward) */
} rows_ctx;

static const void *dp(const fm_tensor *t) { return t ? fm_tensor_data(t) : NULL; }
static void *dpo(fm_tensor *t) { return t ? fm_tensor_data(t) : NULL; }
static int64_t grain_for(int64_t n) { return n >= 8192 ? 1 : 8192 / (n ? n : 1); }

/* the chunk size depends only on M, so partial sums do not depend on the thread count */
static int64_t chunk_rows(int64_t M) {
    int64_t r = (M + 63) / 64;
    return r < 32 ? 32 : r;
}

static fm_status check_dt(const fm_op_call *c, const fm_tensor *t, fm_dtype dt) {
    return t && t->dtype != dt ? fm_cpu_unsupported_dtype(c, t->dtype) : FM_OK;
}

/* Column sums of the partials, chunks in order. */
typedef struct { const void *part; void *out; int64_t n_chunks, N; fm_dtype dt; } csum_ctx;
static void csum_range(void *vc, int64_t j0, int64_t j1, int tid) {
    (void)tid;
    const csum_ctx *c = vc;
    for (int64_t j = j0; j < j1; j++) {
        double t = 0;
        if (c->dt == FM_F64)
            for (int64_t k = 0; k < c->n_chunks; k++) t += ((const double *)c->part)[k * c->N + j];
        else
            for (int64_t k = 0; k < c->n_chunks; k++) t += ((const float *)c->part)[k * c->N + j];
        if (c->dt == FM_F64) ((double *)c->out)[j] = t;
        else ((float *)c->out)[j] = (float)t;
    }
}
static void finish_partials(const void *part, fm_tensor *out, int64_t n_chunks, int64_t N, fm_dtype dt) {
    if (!out) return;
    csum_ctx cs = {part, fm_tensor_data(out), n_chunks, N, dt};
    fm_parallel_for(N, N < 256 ? (N ? N : 1) : 256, csum_range, &cs);
}

/* Allocates zeroed partials for the wanted gradients; the caller frees both. */
static fm_status alloc_partials(const fm_op_call *c, rows_ctx *r, bool want_a, bool want_b, int64_t *n_chunks) {
    size_t es = r->dt == FM_F64 ? 8 : 4;
    r->rows_per_chunk = chunk_rows(r->M);
    *n_chunks = (r->M + r->rows_per_chunk - 1) / r->rows_per_chunk;
    r->part_a = want_a ? calloc((size_t)(*n_chunks * r->N), es) : NULL;
    r->part_b = want_b ? calloc((size_t)(*n_chunks * r->N), es) : NULL;
    if ((want_a && !r->part_a) || (want_b && !r->part_b)) {
        free(r->part_a);
        free(r->part_b);
        r->part_a = r->part_b = NULL;
        return fm_set_error(FM_ERR_OOM, "%s: out of host memory for gradient partials", fm_op_get_info(c->op)->name);
    }
    return FM_OK;
}

/* ---------------- bias + GELU(tanh) ---------------- */

static void bg_fwd_rows(void *vc, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const rows_ctx *r = vc;
    const int64_t N = r->N;
    for (int64_t i = r0; i < r1; i++) {
        if (r->dt == FM_F64) {
            bg_row_f64((const double *)r->in[0] + i * N, r->in[1], (double *)r->out[0] + i * N, N);
        } else {
            const float *x = (const float *)r->in[0] + i * N;
            float *y = (float *)r->out[0] + i * N;
            if (r->simd > 1) fm_bias_gelu_row_f32_avx512(x, r->in[1], y, N);
            else if (r->simd) fm_bias_gelu_row_f32_avx2(x, r->in[1], y, N);
            else bg_row_f32(x, r->in[1], y, N);
        }
    }
}

static void bg_bwd_chunks(void *vc, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const rows_ctx *r = vc;
    const int64_t N = r->N;
    for (int64_t k = k0; k < k1; k++) {
        int64_t i0 = k * r->rows_per_chunk, i1 = i0 + r->rows_per_chunk < r->M ? i0 + r->rows_per_chunk : r->M;
        for (int64_t i = i0; i < i1; i++) {
            if (r->dt == FM_F64) {
                double *dba = r->part_a ? (double *)r->part_a + k * N : NULL;
                bg_bwd_row_f64((const double *)r->in[0] + i * N, (const double *)r->in[1] + i * N, r->in[2],
                               (double *)r->out[0] + i * N, dba, N);
            } else {
                float *dba = r->part_a ? (float *)r->part_a + k * N : NULL;
                const float *dy = (const float *)r->in[0] + i * N, *x = (const float *)r->in[1] + i * N;
                float *dx = (float *)r->out[0] + i * N;
                if (r->simd > 1) fm_bias_gelu_bwd_row_f32_avx512(dy, x, r->in[2], dx, dba, N);
                else if (r->simd) fm_bias_gelu_bwd_row_f32_avx2(dy, x, r->in[2], dx, dba, N);
                else bg_bwd_row_f32(dy, x, r->in[2], dx, dba, N);
            }
        }
    }
}

static fm_status rows_setup(const fm_op_call *c, const fm_tensor *x, int64_t N, rows_ctx *r) {
    memset(r, 0, sizeof *r);
    r->c = c;
    r->dt = x->dtype;
    if (r->dt != FM_F32 && r->dt != FM_F64) return fm_cpu_unsupported_dtype(c, r->dt);
    r->N = N;
    r->M = N ? fm_tensor_numel(x) / N : 0;
    r->simd = r->dt != FM_F32 ? 0 : fm_cpu_use_avx512() ? 2 : fm_cpu_use_avx2() ? 1 : 0;
    for (int i = 0; i < c->n_in && i < 6; i++) r->in[i] = dp(c->in[i]);
    for (int i = 0; i < c->n_out && i < 4; i++) r->out[i] = dpo(c->out[i]);
    return FM_OK;
}

/* BIAS_GELU_TANH: in = {x, b}, out = {y} */
static fm_status bias_gelu_kernel(const fm_op_call *c) {
    rows_ctx r;
    const fm_tensor *x = c->in[0];
    fm_status st = rows_setup(c, x, x->shape[x->ndim - 1], &r);
    if (st || check_dt(c, c->in[1], r.dt)) return st ? st : fm_last_status();
    if (r.M && r.N) fm_parallel_for(r.M, grain_for(r.N), bg_fwd_rows, &r);
    return FM_OK;
}

/* BIAS_GELU_TANH_BACKWARD: in = {dy, x, b}, out = {dx, db|NULL} */
static fm_status bias_gelu_bwd_kernel(const fm_op_call *c) {
    rows_ctx r;
    const fm_tensor *x = c->in[1];
    fm_tensor *db = c->n_out > 1 ? c->out[1] : NULL;
    fm_status st = rows_setup(c, x, x->shape[x->ndim - 1], &r);
    if (st || check_dt(c, c->in[0], r.dt) || check_dt(c, c->in[2], r.dt)) return st ? st : fm_last_status();
    if (!c->in[0]) return fm_set_error(FM_ERR_INTERNAL, "bias_gelu_tanh_backward: no incoming gradient");
    if (r.M == 0 || r.N == 0) {
        if (db) memset(fm_tensor_data(db), 0, (size_t)fm_tensor_numel(db) * fm_dtype_size(r.dt));
        return FM_OK;
    }
    int64_t n_chunks;
    if ((st = alloc_partials(c, &r, db != NULL, false, &n_chunks))) return st;
    fm_parallel_for(n_chunks, 1, bg_bwd_chunks, &r);
    finish_partials(r.part_a, db, n_chunks, r.N, r.dt);
    free(r.part_a);
    return FM_OK;
}

/* ---------------- residual add + layer norm ---------------- */

static void aln_fwd_rows(void *vc, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const rows_ctx *r = vc;
    const fm_op_call *c = r->c;
    const int64_t N = r->N;
    const bool has_h = c->in[1] != NULL;
    for (int64_t i = r0; i < r1; i++) {
        if (r->dt == FM_F64) {
            aln_row_f64((const double *)r->in[0] + i * N, has_h ? (const double *)r->in[1] + i * N : NULL,
                        r->in[2], r->in[3], has_h ? (double *)r->out[0] + i * N : NULL,
                        (double *)r->out[1] + i * N, N, r->eps, (double *)r->out[2] + i,
                        (double *)r->out[3] + i);
        } else {
            const float *x = (const float *)r->in[0] + i * N, *h = has_h ? (const float *)r->in[1] + i * N : NULL;
            float *s = has_h ? (float *)r->out[0] + i * N : NULL, *y = (float *)r->out[1] + i * N;
            float *mo = (float *)r->out[2] + i, *ro = (float *)r->out[3] + i;
            if (r->simd > 1) fm_add_ln_row_f32_avx512(x, h, r->in[2], r->in[3], s, y, N, (float)r->eps, mo, ro);
            else if (r->simd) fm_add_ln_row_f32_avx2(x, h, r->in[2], r->in[3], s, y, N, (float)r->eps, mo, ro);
            else aln_row_f32(x, h, r->in[2], r->in[3], s, y, N, r->eps, mo, ro);
        }
    }
}

static void aln_bwd_chunks(void *vc, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const rows_ctx *r = vc;
    const fm_op_call *c = r->c;
    const int64_t N = r->N;
    const fm_tensor *dy = c->in[0], *ds = c->in[1];
    for (int64_t k = k0; k < k1; k++) {
        int64_t i0 = k * r->rows_per_chunk, i1 = i0 + r->rows_per_chunk < r->M ? i0 + r->rows_per_chunk : r->M;
        for (int64_t i = i0; i < i1; i++) {
            if (r->dt == FM_F64) {
                double mu = ((const double *)r->in[4])[i], rs = ((const double *)r->in[5])[i];
                aln_bwd_row_f64(dy ? (const double *)r->in[0] + i * N : NULL, ds ? (const double *)r->in[1] + i * N : NULL,
                                (const double *)r->in[2] + i * N, r->in[3], mu, rs,
                                (double *)r->out[0] + i * N, r->part_a ? (double *)r->part_a + k * N : NULL,
                                r->part_b ? (double *)r->part_b + k * N : NULL, N);
            } else {
                float mu = ((const float *)r->in[4])[i], rs = ((const float *)r->in[5])[i];
                const float *pdy = dy ? (const float *)r->in[0] + i * N : NULL, *pds = ds ? (const float *)r->in[1] + i * N : NULL;
                const float *s = (const float *)r->in[2] + i * N;
                float *g = (float *)r->out[0] + i * N;
                float *dwa = r->part_a ? (float *)r->part_a + k * N : NULL, *dba = r->part_b ? (float *)r->part_b + k * N : NULL;
                if (r->simd > 1) fm_add_ln_bwd_row_f32_avx512(pdy, pds, s, r->in[3], mu, rs, g, dwa, dba, N);
                else if (r->simd) fm_add_ln_bwd_row_f32_avx2(pdy, pds, s, r->in[3], mu, rs, g, dwa, dba, N);
                else aln_bwd_row_f32(pdy, pds, s, r->in[3], mu, rs, g, dwa, dba, N);
            }
        }
    }
}

/* ADD_LAYER_NORM: in = {x, h|NULL, w|NULL, b|NULL}, out = {sum (NULL when h is), y, mean, rstd} */
static fm_status add_ln_kernel(const fm_op_call *c) {
    rows_ctx r;
    const fm_tensor *x = c->in[0];
    fm_status st = rows_setup(c, x, x->shape[x->ndim - 1], &r);
    if (st) return st;
    for (int i = 1; i < 4; i++)
        if ((st = check_dt(c, c->in[i], r.dt))) return st;
    if ((st = check_dt(c, c->out[2], r.dt))) return st;
    r.eps = ((const fm_norm_attrs *)c->attrs)->eps;
    if (r.M && r.N) fm_parallel_for(r.M, grain_for(r.N), aln_fwd_rows, &r);
    return FM_OK;
}

/* ADD_LAYER_NORM_BACKWARD: in = {dy|NULL, dsum|NULL, sum, w|NULL, mean, rstd}, out = {g, dw|NULL, db|NULL} */
static fm_status add_ln_bwd_kernel(const fm_op_call *c) {
    rows_ctx r;
    const fm_tensor *s = c->in[2];
    fm_tensor *dw = c->n_out > 1 ? c->out[1] : NULL, *db = c->n_out > 2 ? c->out[2] : NULL;
    fm_status st = rows_setup(c, s, s->shape[s->ndim - 1], &r);
    if (st) return st;
    for (int i = 0; i < 6; i++)
        if (i != 2 && (st = check_dt(c, c->in[i], r.dt))) return st;
    if (dw && !c->in[3]) return fm_set_error(FM_ERR_INTERNAL, "add_layer_norm_backward: dweight requested without weight");
    const size_t es = fm_dtype_size(r.dt);
    const bool lnpart = c->in[0] != NULL; /* no dy: the norm contributes nothing */
    if (r.M == 0 || r.N == 0 || !lnpart) {
        if (dw) memset(fm_tensor_data(dw), 0, (size_t)fm_tensor_numel(dw) * es);
        if (db) memset(fm_tensor_data(db), 0, (size_t)fm_tensor_numel(db) * es);
        if (r.M == 0 || r.N == 0) return FM_OK;
    }
    int64_t n_chunks;
    if ((st = alloc_partials(c, &r, lnpart && dw, lnpart && db, &n_chunks))) return st;
    fm_parallel_for(n_chunks, 1, aln_bwd_chunks, &r);
    if (lnpart) {
        finish_partials(r.part_a, dw, n_chunks, r.N, r.dt);
        finish_partials(r.part_b, db, n_chunks, r.N, r.dt);
    }
    free(r.part_a);
    free(r.part_b);
    return FM_OK;
}

/* ---- rope: y = x * cos + rotate_half(x) * sin (inverse: the transpose, dx from dy: each half's
 * sin from the other half, negated), row by row; the
 * products and the sum rounded as the composition's mul, mul and add (no FMA at this ISA
 * level), so the fused graph equals the unfused one bit for bit ---- */
typedef struct rope_job { const char *x, *c, *s; char *y; int64_t T, D; bool f64; bool inverse; } rope_job;

#define ROPE_ROW(TY)                                                                                        \
    do {                                                                                                    \
        const TY *x = (const TY *)j->x + r * D, *c = (const TY *)j->c + t * D, *s = (const TY *)j->s + t * D; \
        TY *y = (TY *)j->y + r * D;                                                                         \
        for (int64_t i = 0; i < h; i++) {                                                                   \
            const TY si = j->inverse ? -s[i + h] : s[i], sh = j->inverse ? -s[i] : s[i + h];                \
            const TY lo = x[i] * c[i], hi = x[i + h] * c[i + h], rl = -x[i + h] * si, rh = x[i] * sh;       \
            y[i] = lo + rl;                                                                                 \
            y[i + h] = hi + rh;                                                                             \
        }                                                                                                   \
    } while (0)

static void rope_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const rope_job *j = ctx;
    const int64_t D = j->D, h = D / 2;
    for (int64_t r = b; r < e; r++) {
        const int64_t t = r % j->T;
        if (j->f64) ROPE_ROW(double);
        else ROPE_ROW(float);
    }
}

static fm_status rope_kernel(const fm_op_call *c) {
    const fm_rope_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    rope_job j = {fm_tensor_data(x), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]), fm_tensor_data(c->out[0]), x->shape[x->ndim - 2],
                  x->shape[x->ndim - 1], x->dtype == FM_F64, a->inverse != 0};
    const int64_t rows = j.D ? fm_tensor_numel(x) / j.D : 0, grain = 8192 / (j.D > 0 ? j.D : 1);
    if (rows > 0) fm_parallel_for(rows, grain < 1 ? 1 : grain, rope_task, &j);
    return FM_OK;
}

void fm_cpu_kernels_fused(fm_backend *b) {
    b->kernels[FM_OP_ROPE] = rope_kernel;
    b->kernels[FM_OP_QKV_SPLIT_HEADS] = qkv_split_kernel;
    b->kernels[FM_OP_QKV_SPLIT_HEADS_BACKWARD] = qkv_split_bwd_kernel;
    b->kernels[FM_OP_BIAS_GELU_TANH] = bias_gelu_kernel;
    b->kernels[FM_OP_BIAS_GELU_TANH_BACKWARD] = bias_gelu_bwd_kernel;
    b->kernels[FM_OP_ADD_LAYER_NORM] = add_ln_kernel;
    b->kernels[FM_OP_ADD_LAYER_NORM_BACKWARD] = add_ln_bwd_kernel;
}
