/* CPU kernels for conv2d, max/avg pool2d and batch norm (and their backwards).
 *
 * conv2d lowers to GEMM (OpenBLAS): NCHW builds im2col columns [K, n*P] for a
 * chunk of samples (K = Cin/g*kH*kW, P = Ho*Wo), then runs per group either one
 * GEMM per sample straight into y (P >= 256) or one GEMM over the chunk plus a
 * scatter into y (small images, where per-sample GEMMs get too narrow);
 * NHWC builds rows [n*P, K] (each (kh, kw) tap copies a contiguous Cin/g run)
 * and writes the output [n*P, Cout] in place through ldc. Unpadded 1x1 stride-1
 * convs use the input itself as the GEMM operand. Chunks of samples are sized
 * by a fixed scratch budget (see conv_chunk), never by the thread count, so the
 * results do not depend on it. Pools and batch norm are direct loops over
 * planes (NCHW) or rows with channels innermost (NHWC).
 *
 * GEMMs go through fm_cpu_gemm (gemm_cpu.c), which splits them over the pool. */
#include <math.h>
#include <string.h>

#include "backend/cpu/conv_avx2.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* -------------------------------------------------------------- geometry */

typedef struct conv_geom {
    int64_t N, C, H, W;           /* input */
    int64_t O, Ho, Wo;            /* output channels and size */
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t G, Cg, Og;            /* groups, input/output channels per group */
    int64_t K, P;                 /* GEMM inner size per group, output pixels per sample */
    bool nhwc, pointwise;         /* pointwise: 1x1, stride 1, no padding */
} conv_geom;

static conv_geom conv_geometry(const fm_conv2d_params *p, const fm_tensor *x, const fm_tensor *w,
                               const fm_tensor *y) {
    conv_geom g;
    g.nhwc = p->layout == FM_NHWC;
    g.N = x->shape[0];
    g.C = g.nhwc ? x->shape[3] : x->shape[1];
    g.H = g.nhwc ? x->shape[1] : x->shape[2];
    g.W = g.nhwc ? x->shape[2] : x->shape[3];
    g.O = w->shape[0];
    g.Ho = g.nhwc ? y->shape[1] : y->shape[2];
    g.Wo = g.nhwc ? y->shape[2] : y->shape[3];
    g.kh = w->shape[2]; g.kw = w->shape[3];
    g.sh = p->stride[0]; g.sw = p->stride[1];
    g.ph = p->padding[0]; g.pw = p->padding[1];
    g.dh = p->dilation[0]; g.dw = p->dilation[1];
    g.G = p->groups; g.Cg = g.C / g.G; g.Og = g.O / g.G;
    g.K = g.Cg * g.kh * g.kw;
    g.P = g.Ho * g.Wo;
    g.pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
    return g;
}

/* Samples per chunk: the im2col scratch is bounded by about 1 MiB, so it is
 * still in L2 when the GEMM reads it. Measured single-threaded (CPU ms, f32,
 * N=64 3x3 pad 1, fwd+bwd), budgets of 1 sample / 1 MiB / 16 MiB:
 *   NCHW 32->64 @28x28: 118 / 122 / 171; @14x14: 41 / 40 / 42
 *   NHWC 32->64 @28x28: 145 / 109 / 181; @14x14: 34 / 33 / 52
 * With one sample per chunk (NCHW) the GEMM writes y and reads dy in place. */
static int64_t conv_chunk(const conv_geom *g, size_t es) {
    int64_t per = g->K * g->P > 0 ? g->K * g->P : 1;
    int64_t nc = (int64_t)((1u << 20) / es) / per;
    if (nc < 1) nc = 1;
    if (nc > g->N) nc = g->N;
    return nc;
}

/* NCHW: per-sample GEMMs reading/writing y and dy in place beat one GEMM over
 * the chunk plus a scatter/gather copy unless images are small (P < 256), where
 * the per-sample GEMMs get too narrow (fashion-cnn step, single thread: the copy
 * was 8% of the step). */
static bool conv_direct(const conv_geom *g, int64_t nb) { return nb == 1 || g->P >= 256; }

/* Work shared by the parallel helpers below. `n0` is the first sample of the
 * chunk, `c0`/`o0` the group's first input/output channel. */
typedef struct conv_job {
    const conv_geom *g;
    int64_t n0, nb, c0, o0;
    const void *x; void *cols; int64_t ldc; /* NCHW cols: [K, nb*P] with ld = nb*P */
    void *dx;
    const void *tmp; void *y; const void *bias;
    const void *dy; void *dyt;
} conv_job;

static inline int64_t grain_for(int64_t items, int64_t work_per_item) {
    int64_t g = ((int64_t)1 << 14) / (work_per_item > 0 ? work_per_item : 1);
    (void)items;
    return g < 1 ? 1 : g;
}

/* The helpers are written once per element type. */
#define CONV_HELPERS(T, SFX)                                                                           \
    /* NCHW im2col: item = (sample in chunk, channel in group) */                                    \
    static void im2col_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                          \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t nn = it / g->Cg, c = it % g->Cg;                                                  \
            const T *xc = (const T *)j->x + ((j->n0 + nn) * g->C + j->c0 + c) * g->H * g->W;         \
            for (int64_t ki = 0; ki < g->kh; ki++)                                                    \
                for (int64_t kj = 0; kj < g->kw; kj++) {                                              \
                    T *row = (T *)j->cols + ((c * g->kh + ki) * g->kw + kj) * j->ldc + nn * g->P;     \
                    int64_t iw0 = kj * g->dw - g->pw;                                                 \
                    if (g->sh == 1 && g->sw == 1 && g->W == g->Wo) {                                  \
                        /* "same" width, stride 1: the tap's rows are one contiguous run of the     \
                         * plane shifted by (ih0 - oh) * W + iw0, so copy them in one go and zero   \
                         * the padding columns after (a copy per 14-float row cost 10% of a step) */ \
                        int64_t dr = ki * g->dh - g->ph, oh0 = dr < 0 ? -dr : 0, oh1 = g->H - dr;    \
                        if (oh1 > g->Ho) oh1 = g->Ho;                                                 \
                        if (oh0 > oh1) oh0 = oh1;                                                     \
                        int64_t lo = iw0 < 0 ? -iw0 : 0, hi = g->W - iw0;                             \
                        if (hi > g->Wo) hi = g->Wo;                                                   \
                        if (lo > hi) lo = hi;                                                         \
                        for (int64_t q = 0; q < oh0 * g->Wo; q++) row[q] = (T)0;                      \
                        for (int64_t q = oh1 * g->Wo; q < g->P; q++) row[q] = (T)0;                   \
                        int64_t k0 = oh0 * g->Wo + lo, k1 = oh1 > oh0 ? (oh1 - 1) * g->Wo + hi : k0;  \
                        if (k1 > k0) memcpy(row + k0, xc + k0 + dr * g->W + iw0, (size_t)(k1 - k0) * sizeof(T)); \
                        for (int64_t oh = oh0; oh < oh1; oh++) {                                      \
                            T *d = row + oh * g->Wo;                                                  \
                            for (int64_t ow = 0; ow < lo; ow++) d[ow] = (T)0;                         \
                            for (int64_t ow = hi; ow < g->Wo; ow++) d[ow] = (T)0;                     \
                        }                                                                             \
                        continue;                                                                     \
                    }                                                                                 \
                    for (int64_t oh = 0; oh < g->Ho; oh++) {                                          \
                        T *dst = row + oh * g->Wo;                                                    \
                        int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                 \
                        if (ih < 0 || ih >= g->H) { memset(dst, 0, (size_t)g->Wo * sizeof(T)); continue; } \
                        const T *src = xc + ih * g->W;                                                \
                        if (g->sw == 1) {                                                             \
                            int64_t lo = iw0 < 0 ? -iw0 : 0, hi = g->W - iw0;                         \
                            if (hi > g->Wo) hi = g->Wo;                                               \
                            if (lo > g->Wo) lo = g->Wo;                                               \
                            if (hi < lo) hi = lo;                                                     \
                            /* rows are short (a few dozen elements): inline loops beat a         \
                             * memcpy/memset call per row (7% of the CNN step was in those calls) */ \
                            const T *sp = src + iw0;                                                  \
                            for (int64_t ow = 0; ow < lo; ow++) dst[ow] = (T)0;                       \
                            for (int64_t ow = lo; ow < hi; ow++) dst[ow] = sp[ow];                    \
                            for (int64_t ow = hi; ow < g->Wo; ow++) dst[ow] = (T)0;                   \
                        } else {                                                                      \
                            for (int64_t ow = 0; ow < g->Wo; ow++) {                                  \
                                int64_t iw = ow * g->sw + iw0;                                        \
                                dst[ow] = (iw >= 0 && iw < g->W) ? src[iw] : (T)0;                    \
                            }                                                                         \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
        }                                                                                             \
    }                                                                                                 \
    /* NCHW col2im: item = (sample, channel); zeroes then accumulates its own plane */              \
    static void col2im_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                          \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t nn = it / g->Cg, c = it % g->Cg;                                                  \
            T *xc = (T *)j->dx + ((j->n0 + nn) * g->C + j->c0 + c) * g->H * g->W;                    \
            memset(xc, 0, (size_t)(g->H * g->W) * sizeof(T));                                         \
            for (int64_t ki = 0; ki < g->kh; ki++)                                                    \
                for (int64_t kj = 0; kj < g->kw; kj++) {                                              \
                    const T *row = (const T *)j->cols + ((c * g->kh + ki) * g->kw + kj) * j->ldc + nn * g->P; \
                    int64_t iw0 = kj * g->dw - g->pw;                                                 \
                    for (int64_t oh = 0; oh < g->Ho; oh++) {                                          \
                        int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                 \
                        if (ih < 0 || ih >= g->H) continue;                                           \
                        const T *src = row + oh * g->Wo;                                              \
                        T *dst = xc + ih * g->W;                                                      \
                        if (g->sw == 1) {                                                             \
                            int64_t lo = iw0 < 0 ? -iw0 : 0, hi = g->W - iw0;                         \
                            if (hi > g->Wo) hi = g->Wo;                                               \
                            T *d = dst + iw0;                                                         \
                            for (int64_t ow = lo; ow < hi; ow++) d[ow] += src[ow];                    \
                        } else {                                                                      \
                            for (int64_t ow = 0; ow < g->Wo; ow++) {                                  \
                                int64_t iw = ow * g->sw + iw0;                                        \
                                if (iw >= 0 && iw < g->W) dst[iw] += src[ow];                         \
                            }                                                                         \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
        }                                                                                             \
    }                                                                                                 \
    /* NCHW: tmp [Og, nb*P] -> y[n, o0+o, :] (+ bias). item = (sample, out channel) */              \
    static void scatter_out_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                     \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t nn = it / g->Og, o = it % g->Og;                                                  \
            const T *src = (const T *)j->tmp + o * j->ldc + nn * g->P;                                \
            T *dst = (T *)j->y + ((j->n0 + nn) * g->O + j->o0 + o) * g->P;                           \
            T bv = j->bias ? ((const T *)j->bias)[j->o0 + o] : (T)0;                                  \
            for (int64_t q = 0; q < g->P; q++) dst[q] = src[q] + bv;                                  \
        }                                                                                             \
    }                                                                                                 \
    /* NCHW: dy[n, o0+o, :] -> dyt [Og, nb*P] */                                                     \
    static void gather_dy_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                       \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t nn = it / g->Og, o = it % g->Og;                                                  \
            memcpy((T *)j->dyt + o * j->ldc + nn * g->P,                                              \
                   (const T *)j->dy + ((j->n0 + nn) * g->O + j->o0 + o) * g->P, (size_t)g->P * sizeof(T)); \
        }                                                                                             \
    }                                                                                                 \
    /* NCHW db[o] = sum over n, p of dy. item = o */                                                 \
    static void db_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                              \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        bool simd = sizeof(T) == 4 && fm_cpu_use_avx2();                                               \
        for (int64_t o = b; o < e; o++) {                                                             \
            double s = 0;                                                                             \
            for (int64_t n = 0; n < g->N; n++) {                                                      \
                const T *src = (const T *)j->dy + (n * g->O + o) * g->P;                              \
                if (simd) { s += fm_avx2_sum_f32((const float *)(const void *)src, g->P); continue; } \
                T part = 0;                                                                           \
                for (int64_t q = 0; q < g->P; q++) part += src[q];                                    \
                s += (double)part;                                                                    \
            }                                                                                         \
            ((T *)j->y)[o] = (T)s;                                                                    \
        }                                                                                             \
    }                                                                                                 \
    /* NHWC im2col: item = (sample in chunk, output row); rows [nb*P, K] in (kh, kw, c) order.  \
     * Taps are visited per (kh, kw) so the row check is hoisted; one input channel (a first     \
     * layer) gets its own loop, since a copy call per single-element tap dominates otherwise */ \
    static void im2col_nhwc_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                        \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t nn = it / g->Ho, oh = it % g->Ho;                                                 \
            const T *xn = (const T *)j->x + (j->n0 + nn) * g->H * g->W * g->C + j->c0;               \
            T *dst0 = (T *)j->cols + (nn * g->P + oh * g->Wo) * g->K;                                 \
            for (int64_t ki = 0; ki < g->kh; ki++) {                                                  \
                int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                         \
                bool rv = ih >= 0 && ih < g->H;                                                       \
                const T *xrow = xn + (rv ? ih : 0) * g->W * g->C;                                     \
                for (int64_t kj = 0; kj < g->kw; kj++) {                                              \
                    int64_t iw0 = kj * g->dw - g->pw;                                                 \
                    T *d = dst0 + (ki * g->kw + kj) * g->Cg;                                          \
                    if (!rv) {                                                                        \
                        for (int64_t ow = 0; ow < g->Wo; ow++)                                        \
                            for (int64_t c = 0; c < g->Cg; c++) d[ow * g->K + c] = 0;                 \
                    } else if (g->Cg == 1) {                                                          \
                        for (int64_t ow = 0; ow < g->Wo; ow++) {                                      \
                            int64_t iw = ow * g->sw + iw0;                                            \
                            d[ow * g->K] = (iw >= 0 && iw < g->W) ? xrow[iw * g->C] : (T)0;           \
                        }                                                                             \
                    } else {                                                                          \
                        for (int64_t ow = 0; ow < g->Wo; ow++) {                                      \
                            int64_t iw = ow * g->sw + iw0;                                            \
                            T *dd = d + ow * g->K;                                                    \
                            if (iw < 0 || iw >= g->W) {                                               \
                                for (int64_t c = 0; c < g->Cg; c++) dd[c] = 0;                        \
                            } else if (g->Cg < 16) {                                                  \
                                const T *src = xrow + iw * g->C;                                      \
                                for (int64_t c = 0; c < g->Cg; c++) dd[c] = src[c];                   \
                            } else {                                                                  \
                                memcpy(dd, xrow + iw * g->C, (size_t)g->Cg * sizeof(T));              \
                            }                                                                         \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    /* NHWC col2im: item = sample (taps of neighbouring rows overlap, samples never do); dx must    \
     * be zero beforehand */                                                                          \
    static void col2im_nhwc_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                          \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        for (int64_t nn = b; nn < e; nn++) {                                                          \
            T *xn = (T *)j->dx + (j->n0 + nn) * g->H * g->W * g->C + j->c0;                          \
            const T *src = (const T *)j->cols + nn * g->P * g->K;                                     \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                    \
                for (int64_t ow = 0; ow < g->Wo; ow++)                                                \
                    for (int64_t ki = 0; ki < g->kh; ki++) {                                          \
                        int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                 \
                        for (int64_t kj = 0; kj < g->kw; kj++, src += g->Cg) {                        \
                            int64_t iw = ow * g->sw - g->pw + kj * g->dw;                             \
                            if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;               \
                            T *d = xn + (ih * g->W + iw) * g->C;                                      \
                            for (int64_t c = 0; c < g->Cg; c++) d[c] += src[c];                       \
                        }                                                                             \
                    }                                                                                 \
        }                                                                                             \
    }                                                                                                 \
    /* NHWC db: fixed blocks of 256 rows, partial sums per block (summed in order afterwards) */   \
    static void db_rows_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                              \
        (void)tid;                                                                                    \
        const conv_job *j = ctx; const conv_geom *g = j->g;                                          \
        int64_t R = g->N * g->P;                                                                      \
        for (int64_t blk = b; blk < e; blk++) {                                                       \
            double *acc = (double *)j->cols + blk * g->O;                                             \
            for (int64_t o = 0; o < g->O; o++) acc[o] = 0;                                            \
            int64_t r1 = (blk + 1) * 256 < R ? (blk + 1) * 256 : R;                                   \
            for (int64_t r = blk * 256; r < r1; r++) {                                                \
                const T *src = (const T *)j->dy + r * g->O;                                           \
                for (int64_t o = 0; o < g->O; o++) acc[o] += (double)src[o];                          \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    /* weight [O, Cg, kh, kw] <-> [O, kh, kw, Cg] (NHWC GEMM operand); dir 0: to, 1: back */       \
    static void reorder_w_##SFX(const conv_geom *g, const T *src, T *dst, int dir) {                   \
        int64_t khw = g->kh * g->kw;                                                                  \
        for (int64_t o = 0; o < g->O; o++)                                                            \
            for (int64_t c = 0; c < g->Cg; c++)                                                       \
                for (int64_t k = 0; k < khw; k++) {                                                   \
                    int64_t a = (o * g->Cg + c) * khw + k, r = (o * khw + k) * g->Cg + c;             \
                    if (dir == 0) dst[r] = src[a]; else dst[a] = src[r];                              \
                }                                                                                     \
    }

CONV_HELPERS(float, f32)
CONV_HELPERS(double, f64)

typedef void (*conv_task_fn)(void *, int64_t, int64_t, int);
typedef struct conv_fns {
    conv_task_fn im2col_nchw, col2im_nchw, scatter_out_nchw, gather_dy_nchw, db_nchw;
    conv_task_fn im2col_nhwc, col2im_nhwc, db_rows;
    void (*reorder_w)(const conv_geom *, const void *, void *, int);
} conv_fns;

static void reorder_w_f32_v(const conv_geom *g, const void *s, void *d, int dir) { reorder_w_f32(g, s, d, dir); }
static void reorder_w_f64_v(const conv_geom *g, const void *s, void *d, int dir) { reorder_w_f64(g, s, d, dir); }

static const conv_fns conv_fns_f32 = {im2col_nchw_f32, col2im_nchw_f32, scatter_out_nchw_f32, gather_dy_nchw_f32,
                                      db_nchw_f32, im2col_nhwc_f32, col2im_nhwc_f32,
                                      db_rows_f32, reorder_w_f32_v};
static const conv_fns conv_fns_f64 = {im2col_nchw_f64, col2im_nchw_f64, scatter_out_nchw_f64, gather_dy_nchw_f64,
                                      db_nchw_f64, im2col_nhwc_f64, col2im_nhwc_f64,
                                      db_rows_f64, reorder_w_f64_v};

static fm_tensor *scratch(int64_t n, fm_dtype dt) {
    int64_t shape[1] = {n > 0 ? n : 1};
    return fm_tensor_empty(1, shape, dt, FM_CPU);
}

static inline const char *cp(const void *p, int64_t elems, size_t es) { return (const char *)p + elems * (int64_t)es; }
static inline char *mp(void *p, int64_t elems, size_t es) { return (char *)p + elems * (int64_t)es; }

/* Prefills a GEMM output block with the bias so the GEMM runs with beta = 1:
 * that replaces OpenBLAS's zeroing pass and a later pass over y. Row r, column c
 * of the [rows, cols] block (leading dim ld) gets bias[r] (per_row) or bias[c]. */
static void fill_bias(fm_dtype dt, void *dst, int64_t rows, int64_t cols, int64_t ld, const void *bias, bool per_row) {
    for (int64_t r = 0; r < rows; r++) {
        if (dt == FM_F32) {
            float *d = (float *)dst + r * ld;
            const float *bv = bias;
            if (per_row) for (int64_t c = 0; c < cols; c++) d[c] = bv[r];
            else memcpy(d, bv, (size_t)cols * sizeof(float));
        } else {
            double *d = (double *)dst + r * ld;
            const double *bv = bias;
            if (per_row) for (int64_t c = 0; c < cols; c++) d[c] = bv[r];
            else memcpy(d, bv, (size_t)cols * sizeof(double));
        }
    }
}

/* ---------------------------------------------------------- conv forward */

typedef struct direct_fwd {
    const conv_geom *g;
    fm_dtype dt;
    int64_t gi, o0, n0, nb;
    const void *w, *cols, *bias;
    void *y;
} direct_fwd;

static void direct_fwd_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const direct_fwd *d = ctx;
    const conv_geom *g = d->g;
    size_t es = fm_dtype_size(d->dt);
    for (int64_t nn = b; nn < e; nn++) {
        void *yb = mp(d->y, ((d->n0 + nn) * g->O + d->o0) * g->P, es);
        if (d->bias) fill_bias(d->dt, yb, g->Og, g->P, g->P, cp(d->bias, d->o0, es), true);
        fm_cpu_gemm(&(fm_cpu_gemm_args){d->dt, false, false, g->Og, g->P, g->K, cp(d->w, d->gi * g->Og * g->K, es), g->K,
                                        cp(d->cols, nn * g->P, es), d->nb * g->P, d->bias ? 1.0 : 0.0, yb, g->P});
    }
}

static fm_status conv2d_fwd_nchw(const conv_geom *g, const conv_fns *f, fm_dtype dt, const void *x,
                                 const void *w, const void *bias, void *y) {
    size_t es = fm_dtype_size(dt);
    if (g->pointwise) {
        for (int64_t n = 0; n < g->N; n++) {
            if (bias) fill_bias(dt, mp(y, n * g->O * g->P, es), g->O, g->P, g->P, bias, true);
            for (int64_t gi = 0; gi < g->G; gi++)
                fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, false, g->Og, g->P, g->Cg, cp(w, gi * g->Og * g->K, es), g->K,
                                      cp(x, (n * g->C + gi * g->Cg) * g->P, es), g->P, bias ? 1.0 : 0.0,
                                      mp(y, (n * g->O + gi * g->Og) * g->P, es), g->P});
        }
        return FM_OK;
    }
    int64_t nc = conv_chunk(g, es);
    fm_tensor *cols = scratch(g->K * nc * g->P, dt), *tmp = conv_direct(g, nc) ? NULL : scratch(g->Og * nc * g->P, dt);
    if (!cols || (!tmp && !conv_direct(g, nc))) { fm_tensor_release_n(2, cols, tmp); return fm_last_status(); }
    for (int64_t n0 = 0; n0 < g->N; n0 += nc) {
        int64_t nb = g->N - n0 < nc ? g->N - n0 : nc;
        for (int64_t gi = 0; gi < g->G; gi++) {
            conv_job j = {.g = g, .n0 = n0, .nb = nb, .c0 = gi * g->Cg, .o0 = gi * g->Og, .x = x,
                          .cols = fm_tensor_data(cols), .ldc = nb * g->P, .tmp = tmp ? fm_tensor_data(tmp) : NULL,
                          .y = y, .bias = bias};
            fm_parallel_for(nb * g->Cg, grain_for(nb * g->Cg, g->K / g->Cg * g->P), f->im2col_nchw, &j);
            if (conv_direct(g, nb)) { /* one GEMM per sample, straight into y: no scatter */
                direct_fwd df = {g, dt, gi, j.o0, n0, nb, w, j.cols, bias, y};
                /* samples in parallel: a first layer's per-sample GEMM (e.g. 32x784x9) is too
                 * small for fm_cpu_gemm to split, so a serial loop would leave a core idle */
                fm_parallel_for(nb, 1, direct_fwd_task, &df);
                continue;
            }
            fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, false, g->Og, nb * g->P, g->K, cp(w, gi * g->Og * g->K, es), g->K,
                                  j.cols, nb * g->P, 0.0, fm_tensor_data(tmp), nb * g->P});
            fm_parallel_for(nb * g->Og, grain_for(nb * g->Og, g->P), f->scatter_out_nchw, &j);
        }
    }
    fm_tensor_release_n(2, cols, tmp);
    return FM_OK;
}

static fm_status conv2d_fwd_nhwc(const conv_geom *g, const conv_fns *f, fm_dtype dt, const void *x,
                                 const void *w, const void *bias, void *y) {
    size_t es = fm_dtype_size(dt);
    fm_tensor *wr = scratch(g->O * g->K, dt), *cols = NULL;
    if (!wr) return fm_last_status();
    f->reorder_w(g, w, fm_tensor_data(wr), 0);
    const void *wrp = fm_tensor_data(wr);
    if (g->pointwise) {
        if (bias) fill_bias(dt, y, g->N * g->P, g->O, g->O, bias, false);
        for (int64_t gi = 0; gi < g->G; gi++)
            fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, true, g->N * g->P, g->Og, g->Cg, cp(x, gi * g->Cg, es), g->C,
                                  cp(wrp, gi * g->Og * g->K, es), g->K, bias ? 1.0 : 0.0, mp(y, gi * g->Og, es), g->O});
    } else {
        int64_t nc = conv_chunk(g, es);
        cols = scratch(nc * g->P * g->K, dt);
        if (!cols) { fm_tensor_release(wr); return fm_last_status(); }
        for (int64_t n0 = 0; n0 < g->N; n0 += nc) {
            int64_t nb = g->N - n0 < nc ? g->N - n0 : nc;
            if (bias) fill_bias(dt, mp(y, n0 * g->P * g->O, es), nb * g->P, g->O, g->O, bias, false);
            for (int64_t gi = 0; gi < g->G; gi++) {
                conv_job j = {.g = g, .n0 = n0, .nb = nb, .c0 = gi * g->Cg, .x = x, .cols = fm_tensor_data(cols)};
                fm_parallel_for(nb * g->Ho, grain_for(nb * g->Ho, g->Wo * g->K), f->im2col_nhwc, &j);
                fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, true, nb * g->P, g->Og, g->K, j.cols, g->K,
                                      cp(wrp, gi * g->Og * g->K, es), g->K, bias ? 1.0 : 0.0,
                                      mp(y, n0 * g->P * g->O + gi * g->Og, es), g->O});
            }
        }
    }
    fm_tensor_release_n(2, wr, cols);
    return FM_OK;
}

static fm_status conv2d_kernel(const fm_op_call *c) {
    const fm_conv2d_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *y = c->out[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    conv_geom g = conv_geometry(&a->p, x, w, y);
    const conv_fns *f = x->dtype == FM_F32 ? &conv_fns_f32 : &conv_fns_f64;
    if (fm_tensor_numel(y) == 0) return FM_OK;
    const void *bias = b ? fm_tensor_data(b) : NULL;
    if (g.nhwc) return conv2d_fwd_nhwc(&g, f, x->dtype, fm_tensor_data(x), fm_tensor_data(w), bias, fm_tensor_data(y));
    return conv2d_fwd_nchw(&g, f, x->dtype, fm_tensor_data(x), fm_tensor_data(w), bias, fm_tensor_data(y));
}

/* --------------------------------------------------------- conv backward */

static fm_status conv2d_bwd_nchw(const conv_geom *g, const conv_fns *f, fm_dtype dt, const void *dy,
                                 const void *x, const void *w, void *dx, void *dw) {
    size_t es = fm_dtype_size(dt);
    if (g->pointwise) {
        for (int64_t n = 0; n < g->N; n++)
            for (int64_t gi = 0; gi < g->G; gi++) {
                const void *dyg = cp(dy, (n * g->O + gi * g->Og) * g->P, es);
                if (dw) /* dW_g += dY_g [Og, P] . X_g^T [P, Cg] */
                    fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, true, g->Og, g->Cg, g->P, dyg, g->P,
                                          cp(x, (n * g->C + gi * g->Cg) * g->P, es), g->P, n ? 1.0 : 0.0,
                                          mp(dw, gi * g->Og * g->K, es), g->K});
                if (dx) /* dX_g = W_g^T [Cg, Og] . dY_g */
                    fm_cpu_gemm(&(fm_cpu_gemm_args){dt, true, false, g->Cg, g->P, g->Og, cp(w, gi * g->Og * g->K, es), g->K,
                                          dyg, g->P, 0.0, mp(dx, (n * g->C + gi * g->Cg) * g->P, es), g->P});
            }
        return FM_OK;
    }
    int64_t nc = conv_chunk(g, es);
    fm_tensor *cols = scratch(g->K * nc * g->P, dt), *dyt = conv_direct(g, nc) ? NULL : scratch(g->Og * nc * g->P, dt);
    if (!cols || (!dyt && !conv_direct(g, nc))) { fm_tensor_release_n(2, cols, dyt); return fm_last_status(); }
    for (int64_t n0 = 0; n0 < g->N; n0 += nc) {
        int64_t nb = g->N - n0 < nc ? g->N - n0 : nc;
        for (int64_t gi = 0; gi < g->G; gi++) {
            conv_job j = {.g = g, .n0 = n0, .nb = nb, .c0 = gi * g->Cg, .o0 = gi * g->Og, .x = x,
                          .cols = fm_tensor_data(cols), .ldc = nb * g->P, .dx = dx, .dy = dy,
                          .dyt = dyt ? fm_tensor_data(dyt) : NULL};
            bool direct = conv_direct(g, nb);
            if (!direct) fm_parallel_for(nb * g->Og, grain_for(nb * g->Og, g->P), f->gather_dy_nchw, &j);
            if (dw) { /* dW_g [Og, K] (+)= dY [Og, nb*P] . cols^T [nb*P, K], per sample when direct */
                fm_parallel_for(nb * g->Cg, grain_for(nb * g->Cg, g->K / g->Cg * g->P), f->im2col_nchw, &j);
                if (direct)
                    for (int64_t nn = 0; nn < nb; nn++)
                        fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, true, g->Og, g->K, g->P, cp(dy, ((n0 + nn) * g->O + j.o0) * g->P, es),
                                              g->P, cp(j.cols, nn * g->P, es), nb * g->P, (n0 || nn) ? 1.0 : 0.0,
                                              mp(dw, gi * g->Og * g->K, es), g->K});
                else
                    fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, true, g->Og, g->K, nb * g->P, j.dyt, nb * g->P, j.cols, nb * g->P,
                                          n0 ? 1.0 : 0.0, mp(dw, gi * g->Og * g->K, es), g->K});
            }
            if (dx) { /* dcols [K, nb*P] = W_g^T [K, Og] . dY, then col2im */
                if (direct)
                    for (int64_t nn = 0; nn < nb; nn++)
                        fm_cpu_gemm(&(fm_cpu_gemm_args){dt, true, false, g->K, g->P, g->Og, cp(w, gi * g->Og * g->K, es), g->K,
                                              cp(dy, ((n0 + nn) * g->O + j.o0) * g->P, es), g->P, 0.0,
                                              mp(j.cols, nn * g->P, es), nb * g->P});
                else
                    fm_cpu_gemm(&(fm_cpu_gemm_args){dt, true, false, g->K, nb * g->P, g->Og, cp(w, gi * g->Og * g->K, es), g->K,
                                          j.dyt, nb * g->P, 0.0, j.cols, nb * g->P});
                fm_parallel_for(nb * g->Cg, grain_for(nb * g->Cg, g->K / g->Cg * g->P), f->col2im_nchw, &j);
            }
        }
    }
    fm_tensor_release_n(2, cols, dyt);
    return FM_OK;
}

static fm_status conv2d_bwd_nhwc(const conv_geom *g, const conv_fns *f, fm_dtype dt, const void *dy,
                                 const void *x, const void *w, void *dx, void *dw) {
    size_t es = fm_dtype_size(dt);
    fm_tensor *wr = scratch(g->O * g->K, dt), *dwr = scratch(g->O * g->K, dt), *cols = NULL;
    if (!wr || !dwr) { fm_tensor_release_n(2, wr, dwr); return fm_last_status(); }
    f->reorder_w(g, w, fm_tensor_data(wr), 0);
    const void *wrp = fm_tensor_data(wr);
    void *dwrp = fm_tensor_data(dwr);
    if (g->pointwise) {
        for (int64_t gi = 0; gi < g->G; gi++) {
            if (dw) /* dW_g [Og, Cg] = dY_g^T [Og, R] . X_g [R, Cg] */
                fm_cpu_gemm(&(fm_cpu_gemm_args){dt, true, false, g->Og, g->Cg, g->N * g->P, cp(dy, gi * g->Og, es), g->O,
                                      cp(x, gi * g->Cg, es), g->C, 0.0, mp(dwrp, gi * g->Og * g->K, es), g->K});
            if (dx) /* dX_g [R, Cg] = dY_g [R, Og] . W_g [Og, Cg] */
                fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, false, g->N * g->P, g->Cg, g->Og, cp(dy, gi * g->Og, es), g->O,
                                      cp(wrp, gi * g->Og * g->K, es), g->K, 0.0, mp(dx, gi * g->Cg, es), g->C});
        }
    } else {
        int64_t nc = conv_chunk(g, es);
        cols = scratch(nc * g->P * g->K, dt);
        if (!cols) { fm_tensor_release_n(2, wr, dwr); return fm_last_status(); }
        if (dx) memset(dx, 0, (size_t)(g->N * g->H * g->W * g->C) * es);
        for (int64_t n0 = 0; n0 < g->N; n0 += nc) {
            int64_t nb = g->N - n0 < nc ? g->N - n0 : nc;
            for (int64_t gi = 0; gi < g->G; gi++) {
                conv_job j = {.g = g, .n0 = n0, .nb = nb, .c0 = gi * g->Cg, .x = x, .cols = fm_tensor_data(cols),
                              .dx = dx};
                const void *dyg = cp(dy, n0 * g->P * g->O + gi * g->Og, es);
                if (dw) { /* dWr_g [Og, K] (+)= dY_g^T [Og, nb*P] . cols [nb*P, K] */
                    fm_parallel_for(nb * g->Ho, grain_for(nb * g->Ho, g->Wo * g->K), f->im2col_nhwc, &j);
                    fm_cpu_gemm(&(fm_cpu_gemm_args){dt, true, false, g->Og, g->K, nb * g->P, dyg, g->O, j.cols, g->K,
                                          n0 ? 1.0 : 0.0, mp(dwrp, gi * g->Og * g->K, es), g->K});
                }
                if (dx) { /* dcols [nb*P, K] = dY_g [nb*P, Og] . Wr_g [Og, K], then col2im */
                    fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, false, nb * g->P, g->K, g->Og, dyg, g->O,
                                          cp(wrp, gi * g->Og * g->K, es), g->K, 0.0, j.cols, g->K});
                    fm_parallel_for(nb, 1, f->col2im_nhwc, &j);
                }
            }
        }
    }
    if (dw) f->reorder_w(g, dwrp, dw, 1);
    fm_tensor_release_n(3, wr, dwr, cols);
    return FM_OK;
}

static fm_status conv2d_backward_kernel(const fm_op_call *c) {
    const fm_conv2d_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
    fm_tensor *dx = c->out[0], *dw = c->out[1], *db = c->out[2];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    conv_geom g = conv_geometry(&a->p, x, w, dy);
    const conv_fns *f = x->dtype == FM_F32 ? &conv_fns_f32 : &conv_fns_f64;
    size_t es = fm_dtype_size(x->dtype);
    if (fm_tensor_numel(dy) == 0) { /* nothing flows back */
        if (dx) memset(fm_tensor_data(dx), 0, fm_tensor_numel(dx) * es);
        if (dw) memset(fm_tensor_data(dw), 0, fm_tensor_numel(dw) * es);
        if (db) memset(fm_tensor_data(db), 0, fm_tensor_numel(db) * es);
        return FM_OK;
    }
    if (db) {
        if (g.nhwc) {
            int64_t R = g.N * g.P, nblk = (R + 255) / 256;
            fm_tensor *acc = scratch(nblk * g.O, FM_F64);
            if (!acc) return fm_last_status();
            conv_job j = {.g = &g, .dy = fm_tensor_data(dy), .cols = fm_tensor_data(acc)};
            fm_parallel_for(nblk, 1, f->db_rows, &j);
            const double *ap = fm_tensor_data(acc);
            for (int64_t o = 0; o < g.O; o++) {
                double s = 0;
                for (int64_t blk = 0; blk < nblk; blk++) s += ap[blk * g.O + o];
                if (x->dtype == FM_F32) ((float *)fm_tensor_data(db))[o] = (float)s;
                else ((double *)fm_tensor_data(db))[o] = s;
            }
            fm_tensor_release(acc);
        } else {
            conv_job j = {.g = &g, .dy = fm_tensor_data(dy), .y = fm_tensor_data(db)};
            fm_parallel_for(g.O, grain_for(g.O, g.N * g.P), f->db_nchw, &j);
        }
    }
    if (!dx && !dw) return FM_OK;
    void *dxp = dx ? fm_tensor_data(dx) : NULL, *dwp = dw ? fm_tensor_data(dw) : NULL;
    if (g.nhwc)
        return conv2d_bwd_nhwc(&g, f, x->dtype, fm_tensor_data(dy), fm_tensor_data(x), fm_tensor_data(w), dxp, dwp);
    return conv2d_bwd_nchw(&g, f, x->dtype, fm_tensor_data(dy), fm_tensor_data(x), fm_tensor_data(w), dxp, dwp);
}

/* ----------------------------------------------------------------- pools */

typedef struct pool_geom {
    int64_t N, C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
    bool nhwc, include_pad;
} pool_geom;

static pool_geom pool_geometry(const fm_pool2d_params *p, const fm_tensor *x, const fm_tensor *y) {
    pool_geom g;
    g.nhwc = p->layout == FM_NHWC;
    g.N = x->shape[0];
    g.C = g.nhwc ? x->shape[3] : x->shape[1];
    g.H = g.nhwc ? x->shape[1] : x->shape[2];
    g.W = g.nhwc ? x->shape[2] : x->shape[3];
    g.Ho = g.nhwc ? y->shape[1] : y->shape[2];
    g.Wo = g.nhwc ? y->shape[2] : y->shape[3];
    g.kh = p->kernel[0]; g.kw = p->kernel[1];
    g.sh = p->stride[0] > 0 ? p->stride[0] : p->kernel[0];
    g.sw = p->stride[1] > 0 ? p->stride[1] : p->kernel[1];
    g.ph = p->padding[0]; g.pw = p->padding[1];
    g.include_pad = p->count_include_pad;
    return g;
}

typedef struct pool_job {
    const pool_geom *g;
    const void *x; void *y; int64_t *idx; const int64_t *cidx;
    const void *dy; void *dx;
} pool_job;

/* Window bounds clipped to the input; `lo` may start negative through padding. */
#define POOL_WINDOW(g, oh, ow)                                                                       \
    int64_t h0 = (oh) * (g)->sh - (g)->ph, w0 = (ow) * (g)->sw - (g)->pw;                            \
    int64_t h1 = h0 + (g)->kh, w1 = w0 + (g)->kw;                                                    \
    int64_t hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;                                              \
    int64_t he = h1 > (g)->H ? (g)->H : h1, we = w1 > (g)->W ? (g)->W : w1;                          \
    int64_t cnt = (g)->include_pad ? (g)->kh * (g)->kw : (he - hs) * (we - ws);                      \
    (void)cnt

#define POOL_HELPERS(T, SFX)                                                                           \
    /* max pool, NCHW: item = plane; NaN wins (as PyTorch), index = ih*W + iw */                    \
    static void maxpool_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                         \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t pl = b; pl < e; pl++) {                                                          \
            const T *xp = (const T *)j->x + pl * g->H * g->W;                                         \
            T *yp = (T *)j->y + pl * g->Ho * g->Wo;                                                   \
            int64_t *ip = j->idx + pl * g->Ho * g->Wo;                                                \
            if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0) {   \
                /* the common 2x2/2 pool without the generic window bookkeeping */                    \
                bool simd = sizeof(T) == 4 && fm_cpu_use_avx2() && g->W < ((int64_t)1 << 30);         \
                for (int64_t oh = 0; oh < g->Ho; oh++) {                                              \
                    const T *r0 = xp + 2 * oh * g->W, *r1 = r0 + g->W;                                \
                    int64_t ow0 = !simd ? 0 : fm_avx2_maxpool2x2_row_f32((const float *)(const void *)r0, \
                        (const float *)(const void *)r1, g->Wo, g->W, 2 * oh * g->W,                  \
                        (float *)(void *)(yp + oh * g->Wo), ip + oh * g->Wo);                         \
                    for (int64_t ow = ow0; ow < g->Wo; ow++) {                                        \
                        T v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};            \
                        T best = v[0]; int k = 0;                                                     \
                        for (int q = 1; q < 4; q++)                                                   \
                            if (!isnan(best) && (v[q] > best || isnan(v[q]))) { best = v[q]; k = q; } \
                        yp[oh * g->Wo + ow] = best;                                                   \
                        ip[oh * g->Wo + ow] = (2 * oh + (k >> 1)) * g->W + 2 * ow + (k & 1);          \
                    }                                                                                 \
                }                                                                                     \
                continue;                                                                             \
            }                                                                                         \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                    \
                for (int64_t ow = 0; ow < g->Wo; ow++) {                                              \
                    POOL_WINDOW(g, oh, ow);                                                           \
                    T best = (T)-INFINITY; int64_t bi = hs * g->W + ws;                               \
                    for (int64_t ih = hs; ih < he; ih++)                                              \
                        for (int64_t iw = ws; iw < we; iw++) {                                        \
                            T v = xp[ih * g->W + iw];                                                 \
                            if (v > best || isnan(v)) { best = v; bi = ih * g->W + iw; if (isnan(v)) goto done_##SFX; } \
                        }                                                                             \
                    done_##SFX:                                                                         \
                    yp[oh * g->Wo + ow] = best; ip[oh * g->Wo + ow] = bi;                             \
                }                                                                                     \
        }                                                                                             \
    }                                                                                                 \
    /* max pool, NHWC: item = (n, oh); channels innermost */                                         \
    static void maxpool_nhwc_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                         \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t n = it / g->Ho, oh = it % g->Ho;                                                  \
            const T *xn = (const T *)j->x + n * g->H * g->W * g->C;                                   \
            for (int64_t ow = 0; ow < g->Wo; ow++) {                                                  \
                POOL_WINDOW(g, oh, ow);                                                               \
                T *yp = (T *)j->y + ((n * g->Ho + oh) * g->Wo + ow) * g->C;                           \
                int64_t *ip = j->idx + ((n * g->Ho + oh) * g->Wo + ow) * g->C;                        \
                for (int64_t c = 0; c < g->C; c++) { yp[c] = (T)-INFINITY; ip[c] = hs * g->W + ws; }  \
                for (int64_t ih = hs; ih < he; ih++)                                                  \
                    for (int64_t iw = ws; iw < we; iw++) {                                            \
                        const T *xp = xn + (ih * g->W + iw) * g->C;                                   \
                        int64_t pos = ih * g->W + iw;                                                 \
                        for (int64_t c = 0; c < g->C; c++) {                                          \
                            T v = xp[c];                                                              \
                            if ((v > yp[c] || isnan(v)) && !isnan(yp[c])) { yp[c] = v; ip[c] = pos; } \
                        }                                                                             \
                    }                                                                                 \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    /* max pool backward NCHW: item = plane (indices stay inside their plane) */                    \
    static void maxpool_bwd_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                     \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t pl = b; pl < e; pl++) {                                                          \
            T *dxp = (T *)j->dx + pl * g->H * g->W;                                                   \
            const T *dyp = (const T *)j->dy + pl * g->Ho * g->Wo;                                     \
            const int64_t *ip = j->cidx + pl * g->Ho * g->Wo;                                         \
            memset(dxp, 0, (size_t)(g->H * g->W) * sizeof(T));                                        \
            for (int64_t q = 0; q < g->Ho * g->Wo; q++) dxp[ip[q]] += dyp[q];                         \
        }                                                                                             \
    }                                                                                                 \
    /* max pool backward NHWC: item = sample */                                                      \
    static void maxpool_bwd_nhwc_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                     \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t n = b; n < e; n++) {                                                             \
            T *dxn = (T *)j->dx + n * g->H * g->W * g->C;                                             \
            memset(dxn, 0, (size_t)(g->H * g->W * g->C) * sizeof(T));                                 \
            const T *dyp = (const T *)j->dy + n * g->Ho * g->Wo * g->C;                               \
            const int64_t *ip = j->cidx + n * g->Ho * g->Wo * g->C;                                   \
            for (int64_t q = 0; q < g->Ho * g->Wo; q++)                                               \
                for (int64_t c = 0; c < g->C; c++) dxn[ip[q * g->C + c] * g->C + c] += dyp[q * g->C + c]; \
        }                                                                                             \
    }                                                                                                 \
    /* avg pool NCHW: item = plane */                                                                \
    static void avgpool_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                         \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t pl = b; pl < e; pl++) {                                                          \
            const T *xp = (const T *)j->x + pl * g->H * g->W;                                         \
            T *yp = (T *)j->y + pl * g->Ho * g->Wo;                                                   \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                    \
                for (int64_t ow = 0; ow < g->Wo; ow++) {                                              \
                    POOL_WINDOW(g, oh, ow);                                                           \
                    T s = 0;                                                                          \
                    for (int64_t ih = hs; ih < he; ih++)                                              \
                        for (int64_t iw = ws; iw < we; iw++) s += xp[ih * g->W + iw];                 \
                    yp[oh * g->Wo + ow] = cnt > 0 ? s / (T)cnt : (T)0;                                \
                }                                                                                     \
        }                                                                                             \
    }                                                                                                 \
    /* avg pool NHWC: item = (n, oh) */                                                              \
    static void avgpool_nhwc_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                         \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t n = it / g->Ho, oh = it % g->Ho;                                                  \
            const T *xn = (const T *)j->x + n * g->H * g->W * g->C;                                   \
            for (int64_t ow = 0; ow < g->Wo; ow++) {                                                  \
                POOL_WINDOW(g, oh, ow);                                                               \
                T *yp = (T *)j->y + ((n * g->Ho + oh) * g->Wo + ow) * g->C;                           \
                for (int64_t c = 0; c < g->C; c++) yp[c] = 0;                                         \
                for (int64_t ih = hs; ih < he; ih++)                                                  \
                    for (int64_t iw = ws; iw < we; iw++) {                                            \
                        const T *xp = xn + (ih * g->W + iw) * g->C;                                   \
                        for (int64_t c = 0; c < g->C; c++) yp[c] += xp[c];                            \
                    }                                                                                 \
                T inv = cnt > 0 ? (T)1 / (T)cnt : (T)0;                                               \
                for (int64_t c = 0; c < g->C; c++) yp[c] *= inv;                                      \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    /* avg pool backward NCHW: item = plane */                                                       \
    static void avgpool_bwd_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                     \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t pl = b; pl < e; pl++) {                                                          \
            T *dxp = (T *)j->dx + pl * g->H * g->W;                                                   \
            const T *dyp = (const T *)j->dy + pl * g->Ho * g->Wo;                                     \
            memset(dxp, 0, (size_t)(g->H * g->W) * sizeof(T));                                        \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                    \
                for (int64_t ow = 0; ow < g->Wo; ow++) {                                              \
                    POOL_WINDOW(g, oh, ow);                                                           \
                    if (cnt <= 0) continue;                                                           \
                    T v = dyp[oh * g->Wo + ow] / (T)cnt;                                              \
                    for (int64_t ih = hs; ih < he; ih++)                                              \
                        for (int64_t iw = ws; iw < we; iw++) dxp[ih * g->W + iw] += v;                \
                }                                                                                     \
        }                                                                                             \
    }                                                                                                 \
    /* avg pool backward NHWC: item = sample */                                                      \
    static void avgpool_bwd_nhwc_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                     \
        (void)tid;                                                                                    \
        const pool_job *j = ctx; const pool_geom *g = j->g;                                          \
        for (int64_t n = b; n < e; n++) {                                                             \
            T *dxn = (T *)j->dx + n * g->H * g->W * g->C;                                             \
            memset(dxn, 0, (size_t)(g->H * g->W * g->C) * sizeof(T));                                 \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                    \
                for (int64_t ow = 0; ow < g->Wo; ow++) {                                              \
                    POOL_WINDOW(g, oh, ow);                                                           \
                    if (cnt <= 0) continue;                                                           \
                    const T *dyp = (const T *)j->dy + ((n * g->Ho + oh) * g->Wo + ow) * g->C;         \
                    T inv = (T)1 / (T)cnt;                                                            \
                    for (int64_t ih = hs; ih < he; ih++)                                              \
                        for (int64_t iw = ws; iw < we; iw++) {                                        \
                            T *d = dxn + (ih * g->W + iw) * g->C;                                     \
                            for (int64_t c = 0; c < g->C; c++) d[c] += dyp[c] * inv;                  \
                        }                                                                             \
                }                                                                                     \
        }                                                                                             \
    }

POOL_HELPERS(float, f32)
POOL_HELPERS(double, f64)

static fm_status max_pool2d_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *y = c->out[0], *idx = c->out[1];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    pool_geom g = pool_geometry(&a->p, x, y);
    pool_job j = {.g = &g, .x = fm_tensor_data(x), .y = fm_tensor_data(y), .idx = fm_tensor_data(idx)};
    bool f32 = x->dtype == FM_F32;
    if (g.nhwc)
        fm_parallel_for(g.N * g.Ho, grain_for(0, g.Wo * g.C * g.kh * g.kw), f32 ? maxpool_nhwc_f32 : maxpool_nhwc_f64, &j);
    else
        fm_parallel_for(g.N * g.C, grain_for(0, g.Ho * g.Wo * g.kh * g.kw), f32 ? maxpool_nchw_f32 : maxpool_nchw_f64, &j);
    return FM_OK;
}

static fm_status max_pool2d_backward_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1], *idx = c->in[2], *dx = c->out[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    pool_geom g = pool_geometry(&a->p, x, dy);
    pool_job j = {.g = &g, .dy = fm_tensor_data(dy), .dx = fm_tensor_data(dx), .cidx = fm_tensor_data(idx)};
    bool f32 = x->dtype == FM_F32;
    if (g.nhwc)
        fm_parallel_for(g.N, 1, f32 ? maxpool_bwd_nhwc_f32 : maxpool_bwd_nhwc_f64, &j);
    else
        fm_parallel_for(g.N * g.C, grain_for(0, g.H * g.W), f32 ? maxpool_bwd_nchw_f32 : maxpool_bwd_nchw_f64, &j);
    return FM_OK;
}

static fm_status avg_pool2d_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *y = c->out[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    pool_geom g = pool_geometry(&a->p, x, y);
    pool_job j = {.g = &g, .x = fm_tensor_data(x), .y = fm_tensor_data(y)};
    bool f32 = x->dtype == FM_F32;
    if (g.nhwc)
        fm_parallel_for(g.N * g.Ho, grain_for(0, g.Wo * g.C * g.kh * g.kw), f32 ? avgpool_nhwc_f32 : avgpool_nhwc_f64, &j);
    else
        fm_parallel_for(g.N * g.C, grain_for(0, g.Ho * g.Wo * g.kh * g.kw), f32 ? avgpool_nchw_f32 : avgpool_nchw_f64, &j);
    return FM_OK;
}

static fm_status avg_pool2d_backward_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *dx = c->out[0];
    if (dy->dtype != FM_F32 && dy->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, dy->dtype);
    pool_geom g = pool_geometry(&a->p, dx, dy);
    pool_job j = {.g = &g, .dy = fm_tensor_data(dy), .dx = fm_tensor_data(dx)};
    bool f32 = dy->dtype == FM_F32;
    if (g.nhwc)
        fm_parallel_for(g.N, 1, f32 ? avgpool_bwd_nhwc_f32 : avgpool_bwd_nhwc_f64, &j);
    else
        fm_parallel_for(g.N * g.C, grain_for(0, g.H * g.W), f32 ? avgpool_bwd_nchw_f32 : avgpool_bwd_nchw_f64, &j);
    return FM_OK;
}

/* ------------------------------------------------------------ batch norm */

/* x viewed as [outer, C, inner]: NCHW [N, C, *] has outer = N; NHWC (channels
 * last) has inner = 1. Per-channel sums are accumulated in double. For inner == 1
 * the rows are split into fixed 256-row blocks whose partial sums are added in
 * order, so the result is the same for any thread count. */
typedef struct bn_job {
    int64_t outer, C, inner;
    const void *x, *w, *b, *dy;
    void *y, *dx;
    const double *mean, *rstd;      /* per channel, double copies */
    double *part;                   /* [nblk, 2, C] partial sums (inner == 1) */
    const double *coef;             /* backward per-channel coefficients [3, C] */
} bn_job;

#define BN_ROWS 256

#define BN_HELPERS(T, SFX)                                                                             \
    /* NCHW statistics: item = channel; part[c] = mean, part[C + c] = biased var */                 \
    static void bn_stats_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                        \
        (void)tid;                                                                                    \
        const bn_job *j = ctx;                                                                        \
        double M = (double)(j->outer * j->inner);                                                     \
        bool simd = sizeof(T) == 4 && fm_cpu_use_avx2();                                               \
        for (int64_t c = b; c < e; c++) {                                                             \
            double s = 0, ss = 0;                                                                     \
            if (simd) {                                                                               \
                for (int64_t o = 0; o < j->outer; o++)                                                \
                    s += fm_avx2_sum_f32((const float *)j->x + (o * j->C + c) * j->inner, j->inner);  \
                double mean = s / M;                                                                  \
                float mf = (float)mean;                                                               \
                for (int64_t o = 0; o < j->outer; o++)                                                \
                    ss += fm_avx2_sqdev_f32((const float *)j->x + (o * j->C + c) * j->inner, j->inner, mf); \
                /* sum (x - mf)^2 = sum (x - mean)^2 + M (mean - mf)^2 */                             \
                ss -= M * (mean - mf) * (mean - mf);                                                  \
                j->part[c] = mean; j->part[j->C + c] = (ss > 0 ? ss : 0) / M;                         \
                continue;                                                                             \
            }                                                                                         \
            for (int64_t o = 0; o < j->outer; o++) {                                                  \
                const T *xp = (const T *)j->x + (o * j->C + c) * j->inner;                            \
                for (int64_t i = 0; i < j->inner; i++) s += (double)xp[i];                            \
            }                                                                                         \
            double mean = s / M;                                                                      \
            for (int64_t o = 0; o < j->outer; o++) {                                                  \
                const T *xp = (const T *)j->x + (o * j->C + c) * j->inner;                            \
                for (int64_t i = 0; i < j->inner; i++) { double d = (double)xp[i] - mean; ss += d * d; } \
            }                                                                                         \
            j->part[c] = mean; j->part[j->C + c] = ss / M;                                            \
        }                                                                                             \
    }                                                                                                 \
    /* channels-last partial sums: pass 0 sums x, pass 1 sums (x - mean)^2 (mean = j->mean) */      \
    static void bn_rows_sum_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                          \
        (void)tid;                                                                                    \
        const bn_job *j = ctx;                                                                        \
        for (int64_t blk = b; blk < e; blk++) {                                                       \
            double *acc = j->part + blk * j->C;                                                       \
            for (int64_t c = 0; c < j->C; c++) acc[c] = 0;                                            \
            int64_t r1 = (blk + 1) * BN_ROWS < j->outer ? (blk + 1) * BN_ROWS : j->outer;             \
            for (int64_t r = blk * BN_ROWS; r < r1; r++) {                                            \
                const T *xp = (const T *)j->x + r * j->C;                                             \
                if (!j->mean) for (int64_t c = 0; c < j->C; c++) acc[c] += (double)xp[c];             \
                else for (int64_t c = 0; c < j->C; c++) { double d = (double)xp[c] - j->mean[c]; acc[c] += d * d; } \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    /* y = (x - mean) * rstd * w + b. item = (outer, channel) row of `inner` elements */            \
    static void bn_apply_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                             \
        (void)tid;                                                                                    \
        const bn_job *j = ctx;                                                                        \
        const T *w = j->w, *bb = j->b;                                                                \
        if (j->inner == 1) { /* item = row of C channels */                                          \
            for (int64_t r = b; r < e; r++) {                                                         \
                const T *xp = (const T *)j->x + r * j->C; T *yp = (T *)j->y + r * j->C;               \
                for (int64_t c = 0; c < j->C; c++) {                                                  \
                    double sc = j->rstd[c] * (w ? (double)w[c] : 1.0);                                \
                    yp[c] = (T)(((double)xp[c] - j->mean[c]) * sc + (bb ? (double)bb[c] : 0.0));      \
                }                                                                                     \
            }                                                                                         \
            return;                                                                                   \
        }                                                                                             \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t c = it % j->C;                                                                    \
            T sc = (T)(j->rstd[c] * (w ? (double)w[c] : 1.0));                                        \
            T sh = (T)((bb ? (double)bb[c] : 0.0) - j->mean[c] * (double)sc);                         \
            const T *xp = (const T *)j->x + it * j->inner; T *yp = (T *)j->y + it * j->inner;         \
            for (int64_t i = 0; i < j->inner; i++) yp[i] = xp[i] * sc + sh;                           \
        }                                                                                             \
    }                                                                                                 \
    /* backward sums per channel: part[c] = sum dy, part[C + c] = sum dy * xhat. NCHW: item = c */ \
    static void bn_bsum_nchw_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                         \
        (void)tid;                                                                                    \
        const bn_job *j = ctx;                                                                        \
        bool simd = sizeof(T) == 4 && fm_cpu_use_avx2();                                               \
        for (int64_t c = b; c < e; c++) {                                                             \
            double s = 0, sx = 0;                                                                     \
            if (simd) {                                                                               \
                float mf = (float)j->mean[c];                                                         \
                for (int64_t o = 0; o < j->outer; o++)                                                \
                    fm_avx2_sum_dydev_f32((const float *)j->dy + (o * j->C + c) * j->inner,           \
                                          (const float *)j->x + (o * j->C + c) * j->inner, j->inner, mf, &s, &sx); \
                /* sum dy (x - mf) = sum dy (x - mean) + (mean - mf) sum dy */                        \
                sx -= (j->mean[c] - (double)mf) * s;                                                  \
                j->part[c] = s; j->part[j->C + c] = sx * j->rstd[c];                                  \
                continue;                                                                             \
            }                                                                                         \
            for (int64_t o = 0; o < j->outer; o++) {                                                  \
                const T *xp = (const T *)j->x + (o * j->C + c) * j->inner;                            \
                const T *gp = (const T *)j->dy + (o * j->C + c) * j->inner;                           \
                for (int64_t i = 0; i < j->inner; i++) {                                              \
                    s += (double)gp[i]; sx += (double)gp[i] * ((double)xp[i] - j->mean[c]);           \
                }                                                                                     \
            }                                                                                         \
            j->part[c] = s; j->part[j->C + c] = sx * j->rstd[c];                                      \
        }                                                                                             \
    }                                                                                                 \
    /* channels last: per 256-row block, [2, C] partials (dy sum, dy*(x-mean) sum) */              \
    static void bn_bsum_rows_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                         \
        (void)tid;                                                                                    \
        const bn_job *j = ctx;                                                                        \
        for (int64_t blk = b; blk < e; blk++) {                                                       \
            double *acc = j->part + blk * 2 * j->C;                                                   \
            for (int64_t c = 0; c < 2 * j->C; c++) acc[c] = 0;                                        \
            int64_t r1 = (blk + 1) * BN_ROWS < j->outer ? (blk + 1) * BN_ROWS : j->outer;             \
            for (int64_t r = blk * BN_ROWS; r < r1; r++) {                                            \
                const T *xp = (const T *)j->x + r * j->C, *gp = (const T *)j->dy + r * j->C;          \
                for (int64_t c = 0; c < j->C; c++) {                                                  \
                    acc[c] += (double)gp[c];                                                          \
                    acc[j->C + c] += (double)gp[c] * ((double)xp[c] - j->mean[c]);                    \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    /* dx = a*dy + b*(x - mean) + k with per-channel coef a = coef[c], b = coef[C+c], k = coef[2C+c] */ \
    static void bn_dx_##SFX(void *ctx, int64_t b, int64_t e, int tid) {                                \
        (void)tid;                                                                                    \
        const bn_job *j = ctx;                                                                        \
        const double *A = j->coef, *B = j->coef + j->C, *Kc = j->coef + 2 * j->C;                     \
        if (j->inner == 1) {                                                                          \
            for (int64_t r = b; r < e; r++) {                                                         \
                const T *xp = (const T *)j->x + r * j->C, *gp = (const T *)j->dy + r * j->C;          \
                T *dp = (T *)j->dx + r * j->C;                                                        \
                for (int64_t c = 0; c < j->C; c++)                                                    \
                    dp[c] = (T)(A[c] * (double)gp[c] + B[c] * ((double)xp[c] - j->mean[c]) + Kc[c]);  \
            }                                                                                         \
            return;                                                                                   \
        }                                                                                             \
        for (int64_t it = b; it < e; it++) {                                                          \
            int64_t c = it % j->C;                                                                    \
            T a = (T)A[c], bc = (T)B[c], k = (T)(Kc[c] - B[c] * j->mean[c]);                         \
            const T *xp = (const T *)j->x + it * j->inner, *gp = (const T *)j->dy + it * j->inner;    \
            T *dp = (T *)j->dx + it * j->inner;                                                       \
            for (int64_t i = 0; i < j->inner; i++) dp[i] = a * gp[i] + bc * xp[i] + k;                \
        }                                                                                             \
    }

BN_HELPERS(float, f32)
BN_HELPERS(double, f64)

static void bn_shape(const fm_tensor *x, fm_layout layout, int64_t *outer, int64_t *C, int64_t *inner) {
    if (layout == FM_NHWC) {
        *C = x->shape[x->ndim - 1];
        *inner = 1;
        *outer = *C ? fm_tensor_numel(x) / *C : 0;
    } else {
        *outer = x->shape[0];
        *C = x->shape[1];
        *inner = 1;
        for (int d = 2; d < x->ndim; d++) *inner *= x->shape[d];
    }
}

static double getd(const fm_tensor *t, int64_t i) {
    return t->dtype == FM_F32 ? (double)((const float *)fm_tensor_data(t))[i] : ((const double *)fm_tensor_data(t))[i];
}
static void setd(fm_tensor *t, int64_t i, double v) {
    if (t->dtype == FM_F32) ((float *)fm_tensor_data(t))[i] = (float)v;
    else ((double *)fm_tensor_data(t))[i] = v;
}

/* Per-channel sums over [outer, C, inner] into part[0..C) and part[C..2C): for
 * pass "stats" (dy == NULL) mean and biased variance; for "bsum" sum(dy) and
 * sum(dy * xhat). `mean`/`rstd` are needed by the second kind. */
static fm_status bn_reduce(bn_job *j, bool f32, bool backward, double *out2c) {
    j->part = out2c;
    if (j->inner != 1 || j->outer == 0) {
        if (j->inner == 0 || j->outer == 0) { memset(out2c, 0, (size_t)(2 * j->C) * sizeof(double)); return FM_OK; }
        conv_task_fn fn = backward ? (f32 ? bn_bsum_nchw_f32 : bn_bsum_nchw_f64) : (f32 ? bn_stats_nchw_f32 : bn_stats_nchw_f64);
        fm_parallel_for(j->C, grain_for(0, j->outer * j->inner), fn, j);
        return FM_OK;
    }
    int64_t nblk = (j->outer + BN_ROWS - 1) / BN_ROWS;
    fm_tensor *pt = scratch(nblk * 2 * j->C, FM_F64);
    if (!pt) return fm_last_status();
    double *p = fm_tensor_data(pt);
    j->part = p;
    double M = (double)j->outer;
    if (backward) {
        fm_parallel_for(nblk, 1, f32 ? bn_bsum_rows_f32 : bn_bsum_rows_f64, j);
        for (int64_t c = 0; c < 2 * j->C; c++) {
            double s = 0;
            for (int64_t blk = 0; blk < nblk; blk++) s += p[blk * 2 * j->C + c];
            out2c[c] = s;
        }
        for (int64_t c = 0; c < j->C; c++) out2c[j->C + c] *= j->rstd[c];
    } else {
        const double *saved_mean = j->mean;
        j->mean = NULL;
        fm_parallel_for(nblk, 1, f32 ? bn_rows_sum_f32 : bn_rows_sum_f64, j);
        for (int64_t c = 0; c < j->C; c++) {
            double s = 0;
            for (int64_t blk = 0; blk < nblk; blk++) s += p[blk * j->C + c];
            out2c[c] = s / M;
        }
        j->mean = out2c;
        fm_parallel_for(nblk, 1, f32 ? bn_rows_sum_f32 : bn_rows_sum_f64, j);
        for (int64_t c = 0; c < j->C; c++) {
            double s = 0;
            for (int64_t blk = 0; blk < nblk; blk++) s += p[blk * j->C + c];
            out2c[j->C + c] = s / M;
        }
        j->mean = saved_mean;
    }
    j->part = out2c;
    fm_tensor_release(pt);
    return FM_OK;
}

static fm_status batch_norm_kernel(const fm_op_call *c) {
    const fm_bn_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *rm = c->in[3], *rv = c->in[4];
    fm_tensor *y = c->out[0], *smean = c->out[1], *srstd = c->out[2];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    bool f32 = x->dtype == FM_F32;
    bn_job j = {.x = fm_tensor_data(x), .w = w ? fm_tensor_data(w) : NULL, .b = b ? fm_tensor_data(b) : NULL,
                .y = fm_tensor_data(y)};
    bn_shape(x, a->layout, &j.outer, &j.C, &j.inner);
    fm_tensor *st = scratch(4 * j.C, FM_F64); /* mean, var, rstd, spare */
    if (!st) return fm_last_status();
    double *mean = fm_tensor_data(st), *var = mean + j.C, *rstd = mean + 2 * j.C;
    if (a->training) {
        fm_status s = bn_reduce(&j, f32, false, mean);
        if (s != FM_OK) { fm_tensor_release(st); return s; }
        double M = (double)(j.outer * j.inner);
        for (int64_t ch = 0; ch < j.C; ch++) {
            if (rm) setd(rm, ch, (1 - a->momentum) * getd(rm, ch) + a->momentum * mean[ch]);
            if (rv) setd(rv, ch, (1 - a->momentum) * getd(rv, ch) + a->momentum * var[ch] * M / (M - 1));
        }
    } else {
        for (int64_t ch = 0; ch < j.C; ch++) { mean[ch] = getd(rm, ch); var[ch] = getd(rv, ch); }
    }
    for (int64_t ch = 0; ch < j.C; ch++) {
        rstd[ch] = 1.0 / sqrt(var[ch] + a->eps);
        setd(smean, ch, mean[ch]);
        setd(srstd, ch, rstd[ch]);
    }
    j.mean = mean; j.rstd = rstd;
    int64_t items = j.inner == 1 ? j.outer : j.outer * j.C;
    fm_parallel_for(items, grain_for(0, j.inner == 1 ? j.C : j.inner), f32 ? bn_apply_f32 : bn_apply_f64, &j);
    fm_tensor_release(st);
    return FM_OK;
}

static fm_status batch_norm_backward_kernel(const fm_op_call *c) {
    const fm_bn_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2], *smean = c->in[3], *srstd = c->in[4];
    fm_tensor *dx = c->out[0], *dw = c->out[1], *db = c->out[2];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    bool f32 = x->dtype == FM_F32;
    bn_job j = {.x = fm_tensor_data(x), .dy = fm_tensor_data(dy), .dx = dx ? fm_tensor_data(dx) : NULL};
    bn_shape(x, a->layout, &j.outer, &j.C, &j.inner);
    fm_tensor *st = scratch(7 * j.C, FM_F64); /* mean, rstd, sums[2C], coef[3C] */
    if (!st) return fm_last_status();
    double *mean = fm_tensor_data(st), *rstd = mean + j.C, *sums = mean + 2 * j.C, *coef = mean + 4 * j.C;
    for (int64_t ch = 0; ch < j.C; ch++) { mean[ch] = getd(smean, ch); rstd[ch] = getd(srstd, ch); }
    j.mean = mean; j.rstd = rstd;
    fm_status s = bn_reduce(&j, f32, true, sums);
    if (s != FM_OK) { fm_tensor_release(st); return s; }
    double M = (double)(j.outer * j.inner);
    for (int64_t ch = 0; ch < j.C; ch++) {
        if (dw) setd(dw, ch, sums[j.C + ch]);
        if (db) setd(db, ch, sums[ch]);
        double wc = w ? getd(w, ch) : 1.0, r = rstd[ch];
        if (a->training) { /* dx = w*r*(dy - mean(dy) - xhat*mean(dy*xhat)) */
            coef[ch] = wc * r;
            coef[j.C + ch] = -wc * r * r * sums[j.C + ch] / M;
            coef[2 * j.C + ch] = -wc * r * sums[ch] / M;
        } else {
            coef[ch] = wc * r; coef[j.C + ch] = 0; coef[2 * j.C + ch] = 0;
        }
    }
    j.coef = coef;
    if (dx) {
        int64_t items = j.inner == 1 ? j.outer : j.outer * j.C;
        fm_parallel_for(items, grain_for(0, j.inner == 1 ? j.C : j.inner), f32 ? bn_dx_f32 : bn_dx_f64, &j);
    }
    fm_tensor_release(st);
    return FM_OK;
}

void fm_cpu_kernels_conv(fm_backend *b) {
    b->kernels[FM_OP_CONV2D] = conv2d_kernel;
    b->kernels[FM_OP_CONV2D_BACKWARD] = conv2d_backward_kernel;
    b->kernels[FM_OP_MAX_POOL2D] = max_pool2d_kernel;
    b->kernels[FM_OP_MAX_POOL2D_BACKWARD] = max_pool2d_backward_kernel;
    b->kernels[FM_OP_AVG_POOL2D] = avg_pool2d_kernel;
    b->kernels[FM_OP_AVG_POOL2D_BACKWARD] = avg_pool2d_backward_kernel;
    b->kernels[FM_OP_BATCH_NORM] = batch_norm_kernel;
    b->kernels[FM_OP_BATCH_NORM_BACKWARD] = batch_norm_backward_kernel;
}
