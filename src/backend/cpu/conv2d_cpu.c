/* CPU kernels for conv2d and its backward.
 *
 * conv2d lowers to GEMM (OpenBLAS): NCHW builds im2col columns [K, n*P] for a
 * chunk of samples (K = Cin/g*kH*kW, P = Ho*Wo), then runs per group either one
 * GEMM per sample straight into y (P >= 256) or one GEMM over the chunk plus a
 * scatter into y (small images, where per-sample GEMMs get too narrow);
 * NHWC builds rows [n*P, K] (each (kh, kw) tap copies a contiguous Cin/g run)
 * and writes the output [n*P, Cout] in place through ldc. Unpadded 1x1 stride-1
 * convs use the input itself as the GEMM operand. Chunks of samples are sized
 * by a fixed scratch budget (see conv_chunk), never by the thread count, so the
 * results do not depend on it. The per-element-type loops (im2col, col2im, ...)
 * are in conv2d_loops.h; pools are in pool_cpu.c, batch norm in batchnorm_cpu.c.
 *
 * GEMMs go through fm_cpu_gemm (gemm_cpu.c), which splits them over the pool.
 *
 * Under bf16 autocast the nn modules' convolutions run with attrs->lowp ==
 * FM_BF16 (fm_conv2d_mixed): f32 activations, products in bf16 ("bf16 products"
 * below). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_avx2.h"
#include "backend/cpu/conv_dw.h"
#include "backend/cpu/conv_pw.h"
#include "backend/cpu/conv_shared.h"
#include "backend/conv_geom.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* -------------------------------------------------------------- geometry */

/* fm_conv_geom, fm_conv_geometry: backend/conv_geom.h */

/* Samples per chunk: the im2col scratch is bounded by about 1 MiB, so it is
 * still in L2 when the GEMM reads it. Measured single-threaded (CPU ms, f32,
 * N=64 3x3 pad 1, fwd+bwd), budgets of 1 sample / 1 MiB / 16 MiB:
 *   NCHW 32->64 @28x28: 118 / 122 / 171; @14x14: 41 / 40 / 42
 *   NHWC 32->64 @28x28: 145 / 109 / 181; @14x14: 34 / 33 / 52
 * With one sample per chunk (NCHW) the GEMM writes y and reads dy in place. */
static int64_t conv_chunk(const fm_conv_geom *g, size_t es) {
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
static bool conv_direct(const fm_conv_geom *g, int64_t nb) { return nb == 1 || g->P >= 256; }

/* Work shared by the parallel helpers below. `n0` is the first sample of the
 * chunk, `c0`/`o0` the group's first input/output channel. */
typedef struct conv_job {
    const fm_conv_geom *g;
    int64_t n0, nb, c0, o0;
    const void *x; void *cols; int64_t ldc; /* NCHW cols: [K, nb*P] with ld = nb*P */
    void *dx;
    const void *tmp; void *y; const void *bias;
    const void *dy; void *dyt;
} conv_job;

/* The loops, once per element type (conv2d_loops.h). */
#define T float
#define SFX(name) name##_f32
#include "backend/cpu/conv2d_loops.h"
#undef T
#undef SFX
#define T double
#define SFX(name) name##_f64
#include "backend/cpu/conv2d_loops.h"
#undef T
#undef SFX

typedef struct conv_fns {
    fm_range_fn im2col_nchw, col2im_nchw, scatter_out_nchw, gather_dy_nchw, db_nchw;
    fm_range_fn im2col_nhwc, col2im_nhwc, db_rows;
    void (*reorder_w)(const fm_conv_geom *, const void *, void *, int);
} conv_fns;

static void reorder_w_f32_v(const fm_conv_geom *g, const void *s, void *d, int dir) { reorder_w_f32(g, s, d, dir); }
static void reorder_w_f64_v(const fm_conv_geom *g, const void *s, void *d, int dir) { reorder_w_f64(g, s, d, dir); }

static const conv_fns conv_fns_f32 = {im2col_nchw_f32, col2im_nchw_f32, scatter_out_nchw_f32, gather_dy_nchw_f32,
                                      db_nchw_f32, im2col_nhwc_f32, col2im_nhwc_f32,
                                      db_rows_f32, reorder_w_f32_v};
static const conv_fns conv_fns_f64 = {im2col_nchw_f64, col2im_nchw_f64, scatter_out_nchw_f64, gather_dy_nchw_f64,
                                      db_nchw_f64, im2col_nhwc_f64, col2im_nhwc_f64,
                                      db_rows_f64, reorder_w_f64_v};

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

/* The forward's epilogue on a contiguous [rows, cols] block of y, after a GEMM with
 * beta 0: bias[r] added to row r (bias may be NULL), then the outputs clamped to
 * [lo, hi] (ReLU: [0, inf]; none: [-inf, inf]; NaN stays). beta 0 lets the products
 * go to whichever provider is fastest (oneDNN takes only beta 0; a bias prefill
 * needed beta 1): ResNet-18 and MobileNetV2 at batch 1 ran 1.2-1.35x faster through
 * this than with the prefill (Intel Xeon model 167). Rows split over the pool (serial
 * when called from a pool task). */
typedef struct conv_act { double lo, hi; } conv_act; /* the clamp after the conv */
static const conv_act k_no_act = {-INFINITY, INFINITY};
static bool act_none(conv_act a) { return a.lo == -INFINITY && a.hi == INFINITY; }

typedef struct epi_rows_job { fm_dtype dt; void *dst; int64_t cols; const void *bias; conv_act act; } epi_rows_job;

/* Cloned per vector width (as gpt_sample.c's exp): an add and two compares per
 * element, the same bits at every width, so no FATHOM_ISA level needs its own copy;
 * the plain build's SSE loop was 12% of MobileNetV2 at batch 8 (Xeon model 167). */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void epi_rows_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const epi_rows_job *j = ctx;
    const int64_t n = j->cols; /* locals: under -fno-strict-aliasing the stores would reload j's fields */
    const bool clamp = !act_none(j->act);
    for (int64_t r = b; r < e; r++) {
        if (j->dt == FM_F32) {
            float *restrict d = (float *)j->dst + r * n;
            const float bv = j->bias ? ((const float *)j->bias)[r] : 0.0f, lo = (float)j->act.lo, hi = (float)j->act.hi;
            if (clamp)
                for (int64_t c = 0; c < n; c++) {
                    const float v = d[c] + bv;
                    d[c] = v < lo ? lo : v > hi ? hi : v;
                }
            else
                for (int64_t c = 0; c < n; c++) d[c] += bv;
        } else {
            double *restrict d = (double *)j->dst + r * n;
            const double bv = j->bias ? ((const double *)j->bias)[r] : 0.0, lo = j->act.lo, hi = j->act.hi;
            if (clamp)
                for (int64_t c = 0; c < n; c++) {
                    const double v = d[c] + bv;
                    d[c] = v < lo ? lo : v > hi ? hi : v;
                }
            else
                for (int64_t c = 0; c < n; c++) d[c] += bv;
        }
    }
}

static void epi_rows(fm_dtype dt, void *dst, int64_t rows, int64_t cols, const void *bias, conv_act act) {
    if (!bias && act_none(act)) return;
    epi_rows_job j = {dt, dst, cols, bias, act};
    fm_parallel_for(rows, grain_for(rows, cols), epi_rows_task, &j);
}

/* ---------------------------------------------------------- conv forward */

typedef struct direct_fwd {
    const fm_conv_geom *g;
    fm_dtype dt;
    int64_t gi, o0, n0, nb;
    const void *w, *cols, *bias;
    void *y;
    conv_act act;
} direct_fwd;

static void direct_fwd_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const direct_fwd *d = ctx;
    const fm_conv_geom *g = d->g;
    size_t es = fm_dtype_size(d->dt);
    for (int64_t nn = b; nn < e; nn++) {
        void *yb = mp(d->y, ((d->n0 + nn) * g->O + d->o0) * g->P, es);
        fm_cpu_gemm(&(fm_cpu_gemm_args){d->dt, false, false, g->Og, g->P, g->K, cp(d->w, d->gi * g->Og * g->K, es), g->K,
                                        cp(d->cols, nn * g->P, es), d->nb * g->P, 0.0, yb, g->P});
        epi_rows(d->dt, yb, g->Og, g->P, d->bias ? cp(d->bias, d->o0, es) : NULL, d->act);
    }
}

/* Unpadded 1x1 stride-1 convs: per sample and group one GEMM on the input as it is.
 * Samples [b, e) of the batch; called over the pool when there are at least as many
 * samples as threads (each product then runs on one thread: MobileNetV2's 1x1 layers
 * at 7x7-28x28 are too small to split well), else directly (each product split). */
typedef struct pw_job {
    const fm_conv_geom *g;
    fm_dtype dt;
    const void *x, *w, *bias;
    void *y;
    conv_act act;
} pw_job;

static void pointwise_samples(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pw_job *j = ctx;
    const fm_conv_geom *g = j->g;
    const size_t es = fm_dtype_size(j->dt);
    for (int64_t n = b; n < e; n++) {
        for (int64_t gi = 0; gi < g->G; gi++)
            fm_cpu_gemm(&(fm_cpu_gemm_args){j->dt, false, false, g->Og, g->P, g->Cg, cp(j->w, gi * g->Og * g->K, es), g->K,
                                            cp(j->x, (n * g->C + gi * g->Cg) * g->P, es), g->P, 0.0,
                                            mp(j->y, (n * g->O + gi * g->Og) * g->P, es), g->P});
        epi_rows(j->dt, mp(j->y, n * g->O * g->P, es), g->O, g->P, j->bias, j->act);
    }
}

/* At the AVX2 level (fm_conv_pw_level: backend/conv_geom.h) an f32 conv's products run
 * conv_pw.h's kernel, bias and clamp included: a 1x1 conv's on its input
 * (pointwise_avx2, one group after another), a grouped conv's per sample and group
 * (grouped_avx2), a strided one's gathering its columns from the input (strided_avx2),
 * any other's on the im2col columns of nb samples from n0 and group gi (columns_avx2).
 * Each is false when not taken or its buffers could not be had (the sgemm route then
 * runs). */
static bool columns_avx2(const fm_conv_geom *g, fm_dtype dt, const void *cols, int64_t n0, int64_t nb, int64_t gi,
                         const void *w, const void *bias, void *y, conv_act act) {
    if (!fm_conv_pw_level(g, dt)) return false;
    const fm_conv_pw d = {cols, (const float *)w + gi * g->Og * g->K, bias ? (const float *)bias + gi * g->Og : NULL,
                          (float *)y + (n0 * g->O + gi * g->Og) * g->P, nb, g->K, g->Og, g->P, g->P, g->O * g->P,
                          nb * g->P, (float)act.lo, (float)act.hi, NULL};
    return fm_conv_pw_run_avx2(&d);
}

static bool pointwise_avx2(const fm_conv_geom *g, fm_dtype dt, const void *x, const void *w, const void *bias, void *y,
                           conv_act act) {
    if (!fm_conv_pw_level(g, dt)) return false;
    for (int64_t gi = 0; gi < g->G; gi++) {
        const fm_conv_pw d = {(const float *)x + gi * g->Cg * g->P, (const float *)w + gi * g->Og * g->Cg,
                              bias ? (const float *)bias + gi * g->Og : NULL, (float *)y + gi * g->Og * g->P,
                              g->N, g->Cg, g->Og, g->P, g->C * g->P, g->O * g->P, g->P, (float)act.lo, (float)act.hi,
                              NULL};
        if (!fm_conv_pw_run_avx2(&d)) return false; /* the sgemm route redoes every group */
    }
    return true;
}

/* fm_conv_grouped_avx2's route: items (sample, group), each im2col of the group's input
 * channels for the sample into its thread's buffer, then the group's product on this
 * thread. RegNetY-400MF's 3x3 convs of 8-channel groups (26-55 groups) ran one im2col and
 * one product per group over the whole pool, two waits each, and a 6-row panel's rows
 * two thirds used. */
typedef struct grp_job {
    const fm_conv_geom *g;
    const float *x, *w, *bias;
    float *y, *bufs;
    int64_t per, pwoff; /* floats per thread; where the product's buffer starts in it */
    conv_act act;
} grp_job;

static void grouped_task(void *ctx, int64_t b, int64_t e, int tid) {
    const grp_job *q = ctx;
    const fm_conv_geom *g = q->g;
    float *cols = q->bufs + tid * q->per;
    for (int64_t it = b; it < e; it++) {
        const int64_t n = it / g->G, gi = it % g->G;
        conv_job j = {.g = g, .n0 = n, .nb = 1, .c0 = gi * g->Cg, .x = q->x, .cols = cols, .ldc = g->P};
        im2col_nchw_f32(&j, 0, g->Cg, tid);
        const fm_conv_pw d = {cols, q->w + gi * g->Og * g->K, q->bias ? q->bias + gi * g->Og : NULL,
                              q->y + (n * g->O + gi * g->Og) * g->P, 1, g->K, g->Og, g->P, g->P, g->O * g->P, g->P,
                              (float)q->act.lo, (float)q->act.hi, NULL};
        fm_conv_pw_serial_avx2(&d, cols + q->pwoff);
    }
}

static bool grouped_avx2(const fm_conv_geom *g, fm_dtype dt, const void *x, const void *w, const void *bias, void *y,
                         conv_act act) {
    if (!fm_conv_grouped_avx2(g, dt)) return false;
    const fm_conv_pw one = {NULL, NULL, NULL, NULL, 1, g->K, g->Og, g->P, g->P, g->O * g->P, g->P, 0.0f, 0.0f, NULL};
    const int nt = fm_num_threads() < 1 ? 1 : fm_num_threads();
    grp_job q = {g, x, w, bias, y, NULL, 0, (g->K * g->P + 15) / 16 * 16, act};
    q.per = q.pwoff + fm_conv_pw_serial_floats(&one);
    const size_t bytes = (size_t)(q.per * nt) * sizeof(float);
    if (!(q.bufs = aligned_alloc(64, (bytes + 63) / 64 * 64))) return false;
    fm_parallel_for_dynamic(g->N * g->G, 1, grouped_task, &q);
    free(q.bufs);
    return true;
}

/* fm_conv_strided_avx2's route: the product with the conv's geometry, no im2col. */
static bool strided_avx2(const fm_conv_geom *g, fm_dtype dt, const void *x, const void *w, const void *bias, void *y,
                         conv_act act) {
    if (!fm_conv_strided_avx2(g, dt)) return false;
    const fm_conv_pw_geom cg = {g->C, g->H, g->W, g->Wo, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw};
    const fm_conv_pw d = {x, w, bias, y, g->N, g->K, g->O, g->P, g->C * g->H * g->W, g->O * g->P, 0,
                          (float)act.lo, (float)act.hi, &cg};
    return fm_conv_pw_run_avx2(&d);
}

static fm_status conv2d_fwd_nchw(const fm_conv_geom *g, const conv_fns *f, fm_dtype dt, const void *x,
                                 const void *w, const void *bias, void *y, conv_act act) {
    size_t es = fm_dtype_size(dt);
    if (g->pointwise && pointwise_avx2(g, dt, x, w, bias, y, act)) return FM_OK;
    if (grouped_avx2(g, dt, x, w, bias, y, act) || strided_avx2(g, dt, x, w, bias, y, act)) return FM_OK;
    if (g->pointwise) {
        pw_job j = {g, dt, x, w, bias, y, act};
        if (g->N >= fm_num_threads() && g->N > 1) fm_parallel_for(g->N, 1, pointwise_samples, &j);
        else pointwise_samples(&j, 0, g->N, 0);
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
            if (columns_avx2(g, dt, j.cols, n0, nb, gi, w, bias, y, act)) continue;
            if (conv_direct(g, nb)) { /* one GEMM per sample, straight into y: no scatter */
                direct_fwd df = {g, dt, gi, j.o0, n0, nb, w, j.cols, bias, y, act};
                /* samples in parallel: a first layer's per-sample GEMM (e.g. 32x784x9) is too
                 * small for fm_cpu_gemm to split, so a serial loop would leave a core idle */
                fm_parallel_for(nb, 1, direct_fwd_task, &df);
                continue;
            }
            fm_cpu_gemm(&(fm_cpu_gemm_args){dt, false, false, g->Og, nb * g->P, g->K, cp(w, gi * g->Og * g->K, es), g->K,
                                  j.cols, nb * g->P, 0.0, fm_tensor_data(tmp), nb * g->P});
            fm_parallel_for(nb * g->Og, grain_for(nb * g->Og, g->P), f->scatter_out_nchw, &j); /* adds the bias */
            for (int64_t nn = 0; !act_none(act) && nn < nb; nn++)
                epi_rows(dt, mp(y, ((n0 + nn) * g->O + j.o0) * g->P, es), g->Og, g->P, NULL, act);
        }
    }
    fm_tensor_release_n(2, cols, tmp);
    return FM_OK;
}

static fm_status conv2d_fwd_nhwc(const fm_conv_geom *g, const conv_fns *f, fm_dtype dt, const void *x,
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

/* ------------------------------------------------------- bf16 products */

/* conv2d under bf16 autocast (fm_conv2d_mixed: attrs->lowp == FM_BF16), NCHW:
 * f32 activations in and out, as fm_linear_mixed for a linear, and the three
 * products (y, dW, dX) in bf16 with f32 accumulation. The im2col columns are
 * written as bf16 straight from the f32 input (rounded to nearest even as they
 * are copied), the weights once per call and dy once per chunk. Each product
 * goes to the bf16 hardware (fm_cpu_gemm_bf16: oneDNN) or, where that path is
 * not taken (no AVX512-BF16/AMX or no oneDNN, or a product too small to be
 * worth a oneDNN call), the same bf16 values are widened to f32 for sgemm: the
 * same products either way (a bf16 x bf16 product is exact in f32) with f32
 * sums. Why not the op-by-op autocast (bf16 tensors between ops, the f32 conv
 * widening them): its casts and widenings cost more than bf16 saved (fashion-cnn
 * step 0.93-0.96x fp32 on an AMD EPYC Zen 4, docs/PERFORMANCE.md). The forward
 * always takes the chunk form (one product over nb samples, then the scatter
 * that adds the bias), so each product of a call is Og x K x nb*P. */
#define T float
#define TC uint16_t
#define COL_ONE(v) fm_f32_to_bf16(v)
#define COL_RUN(dst, src, n) fm_convert_f32_to_bf16((src), (dst), (size_t)(n))
#define SFX(name) name##_bf16
#define CONV_LOOPS_IM2COL_ONLY
#include "backend/cpu/conv2d_loops.h"
#undef CONV_LOOPS_IM2COL_ONLY
#undef T
#undef TC
#undef COL_ONE
#undef COL_RUN
#undef SFX

/* C (f32, beta 0) = op(A) op(B) for bf16 A and B (g->dt == FM_BF16). */
static fm_status lowp_gemm(const fm_cpu_gemm_args *g) {
    if (fm_cpu_gemm_bf16(g, NULL, false)) return FM_OK;
    /* the stored extents: rows of ld elements, the last one only as long as it is read */
    int64_t ra = g->ta ? g->K : g->M, ca = g->ta ? g->M : g->K, rb = g->tb ? g->N : g->K, cb = g->tb ? g->K : g->N;
    size_t na = (size_t)((ra - 1) * g->lda + ca), nb = (size_t)((rb - 1) * g->ldb + cb);
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        return fm_set_error(FM_ERR_OOM, "conv2d: out of memory widening a %lldx%lldx%lld bf16 product to f32",
                            (long long)g->M, (long long)g->N, (long long)g->K);
    }
    fm_convert_bf16_to_f32(g->A, a, na);
    fm_convert_bf16_to_f32(g->B, b, nb);
    fm_cpu_gemm(&(fm_cpu_gemm_args){FM_F32, g->ta, g->tb, g->M, g->N, g->K, a, g->lda, b, g->ldb, 0.0, g->C, g->ldc});
    free(a);
    free(b);
    return FM_OK;
}

/* dy[n, o0+o, :] (f32) -> dyt [Og, nb*P] (bf16). item = (sample, out channel) */
static void gather_dy_bf16(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx;
    const fm_conv_geom *g = j->g;
    for (int64_t it = b; it < e; it++) {
        int64_t nn = it / g->Og, o = it % g->Og;
        fm_convert_f32_to_bf16((const float *)j->dy + ((j->n0 + nn) * g->O + j->o0 + o) * g->P,
                               (uint16_t *)j->dyt + o * j->ldc + nn * g->P, (size_t)g->P);
    }
}

static fm_status conv2d_fwd_lowp(const fm_conv_geom *g, const float *x, const float *w, const float *bias, float *y) {
    int64_t nc = conv_chunk(g, sizeof(float));
    fm_tensor *wl = scratch(g->O * g->K, FM_BF16), *cols = wl ? scratch(g->K * nc * g->P, FM_BF16) : NULL;
    fm_tensor *tmp = cols ? scratch(g->Og * nc * g->P, FM_F32) : NULL;
    fm_status st = tmp ? FM_OK : fm_last_status();
    const uint16_t *wp = wl ? fm_tensor_data(wl) : NULL;
    if (st == FM_OK) fm_convert_f32_to_bf16(w, fm_tensor_data(wl), (size_t)(g->O * g->K));
    for (int64_t n0 = 0; n0 < g->N && st == FM_OK; n0 += nc) {
        int64_t nb = g->N - n0 < nc ? g->N - n0 : nc;
        for (int64_t gi = 0; gi < g->G && st == FM_OK; gi++) {
            conv_job j = {.g = g, .n0 = n0, .nb = nb, .c0 = gi * g->Cg, .o0 = gi * g->Og, .x = x,
                          .cols = fm_tensor_data(cols), .ldc = nb * g->P, .tmp = fm_tensor_data(tmp), .y = y, .bias = bias};
            fm_parallel_for(nb * g->Cg, grain_for(nb * g->Cg, g->K / g->Cg * g->P), im2col_nchw_bf16, &j);
            st = lowp_gemm(&(fm_cpu_gemm_args){FM_BF16, false, false, g->Og, nb * g->P, g->K, wp + gi * g->Og * g->K, g->K,
                                               j.cols, nb * g->P, 0.0, fm_tensor_data(tmp), nb * g->P});
            if (st == FM_OK) fm_parallel_for(nb * g->Og, grain_for(nb * g->Og, g->P), scatter_out_nchw_f32, &j);
        }
    }
    fm_tensor_release_n(3, wl, cols, tmp);
    return st;
}

/* The backward's scratch, in this order (the meta device replays it):
 * wl [O*K] bf16 (dx), cols [K*nc*P] bf16 (dw), dyt [Og*nc*P] bf16,
 * dcols [K*nc*P] f32 (dx), dwt [Og*K] f32 (dw, more than one chunk). */
static fm_status conv2d_bwd_lowp(const fm_conv_geom *g, const float *dy, const float *x, const float *w, float *dx, float *dw) {
    int64_t nc = conv_chunk(g, sizeof(float));
    fm_tensor *t[5] = {0};
    const int64_t n[5] = {dx ? g->O * g->K : -1, dw ? g->K * nc * g->P : -1, g->Og * nc * g->P, dx ? g->K * nc * g->P : -1,
                          dw && nc < g->N ? g->Og * g->K : -1};
    const fm_dtype dt[5] = {FM_BF16, FM_BF16, FM_BF16, FM_F32, FM_F32};
    fm_status st = FM_OK;
    for (int i = 0; i < 5 && st == FM_OK; i++)
        if (n[i] >= 0 && !(t[i] = scratch(n[i], dt[i]))) st = fm_last_status();
    uint16_t *wp = t[0] ? fm_tensor_data(t[0]) : NULL;
    float *dcols = t[3] ? fm_tensor_data(t[3]) : NULL, *dwt = t[4] ? fm_tensor_data(t[4]) : NULL;
    if (st == FM_OK && wp) fm_convert_f32_to_bf16(w, wp, (size_t)(g->O * g->K));
    for (int64_t n0 = 0; n0 < g->N && st == FM_OK; n0 += nc) {
        int64_t nb = g->N - n0 < nc ? g->N - n0 : nc, R = nb * g->P;
        for (int64_t gi = 0; gi < g->G && st == FM_OK; gi++) {
            conv_job j = {.g = g, .n0 = n0, .nb = nb, .c0 = gi * g->Cg, .o0 = gi * g->Og, .x = x,
                          .cols = t[1] ? fm_tensor_data(t[1]) : NULL, .ldc = R, .dx = dx, .dy = dy, .dyt = fm_tensor_data(t[2])};
            fm_parallel_for(nb * g->Og, grain_for(nb * g->Og, g->P), gather_dy_bf16, &j);
            if (dw) { /* dW_g [Og, K] (+)= dY [Og, R] . cols^T [R, K] */
                fm_parallel_for(nb * g->Cg, grain_for(nb * g->Cg, g->K / g->Cg * g->P), im2col_nchw_bf16, &j);
                float *dwg = dw + gi * g->Og * g->K;
                st = lowp_gemm(&(fm_cpu_gemm_args){FM_BF16, false, true, g->Og, g->K, R, j.dyt, R, j.cols, R, 0.0,
                                                   n0 ? dwt : dwg, g->K});
                if (st == FM_OK && n0)
                    for (int64_t i = 0; i < g->Og * g->K; i++) dwg[i] += dwt[i];
            }
            if (dx && st == FM_OK) { /* dcols [K, R] = W_g^T [K, Og] . dY, then col2im */
                st = lowp_gemm(&(fm_cpu_gemm_args){FM_BF16, true, false, g->K, R, g->Og, wp + gi * g->Og * g->K, g->K, j.dyt,
                                                   R, 0.0, dcols, R});
                j.cols = dcols;
                if (st == FM_OK) fm_parallel_for(nb * g->Cg, grain_for(nb * g->Cg, g->K / g->Cg * g->P), col2im_nchw_f32, &j);
            }
        }
    }
    for (int i = 0; i < 5; i++) fm_tensor_release(t[i]);
    return st;
}

/* conv2d's forward, then the outputs clamped to [lo, hi] (conv2d_fused's reference
 * path: ReLU, ReLU6): in the epilogue of the NCHW GEMM and depthwise paths, in a pass
 * of its own elsewhere. */
static fm_status conv2d_forward(const fm_conv2d_attrs *a, fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *y, conv_act act) {
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_set_error(FM_ERR_UNSUPPORTED, "conv2d: no CPU kernel for %s", fm_dtype_name(x->dtype));
    fm_conv_geom g = fm_conv_geometry(&a->p, x, w, y);
    const conv_fns *f = x->dtype == FM_F32 ? &conv_fns_f32 : &conv_fns_f64;
    if (fm_tensor_numel(y) == 0) return FM_OK;
    const void *bias = b ? fm_tensor_data(b) : NULL;
    fm_status st;
    if (fm_conv_dw_direct(&g, x->dtype) && !fm_conv2d_lowp_products(a, x->dtype, g.K)) { /* conv_dw.h: not one thin GEMM per group */
        fm_conv_dw d = {fm_tensor_data(x), fm_tensor_data(w), bias, fm_tensor_data(y), g.N, g.C, g.H, g.W, g.O,
                        g.Ho, g.Wo, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, (float)act.lo, (float)act.hi};
        return fm_conv_dw_run(&d);
    }
    if (!g.nhwc && !fm_conv2d_lowp_products(a, x->dtype, g.K))
        return conv2d_fwd_nchw(&g, f, x->dtype, fm_tensor_data(x), fm_tensor_data(w), bias, fm_tensor_data(y), act);
    if (fm_conv2d_lowp_products(a, x->dtype, g.K))
        st = conv2d_fwd_lowp(&g, fm_tensor_data(x), fm_tensor_data(w), bias, fm_tensor_data(y));
    else
        st = conv2d_fwd_nhwc(&g, f, x->dtype, fm_tensor_data(x), fm_tensor_data(w), bias, fm_tensor_data(y));
    if (st == FM_OK) epi_rows(x->dtype, fm_tensor_data(y), 1, fm_tensor_numel(y), NULL, act);
    return st;
}

static fm_status conv2d_kernel(const fm_op_call *c) {
    const fm_conv2d_attrs *a = c->attrs;
    if (c->in[0]->dtype != FM_F32 && c->in[0]->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, c->in[0]->dtype);
    return conv2d_forward(a, c->in[0], c->in[1], c->in[2], c->out[0], k_no_act);
}

fm_status fm_cpu_conv2d_forward(const fm_conv2d_params *p, fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *y, double lo, double hi) {
    fm_conv2d_attrs a = {*p, FM_F32};
    return conv2d_forward(&a, x, w, b, y, (conv_act){lo, hi});
}

/* --------------------------------------------------------- conv backward */

static fm_status conv2d_bwd_nchw(const fm_conv_geom *g, const conv_fns *f, fm_dtype dt, const void *dy,
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

static fm_status conv2d_bwd_nhwc(const fm_conv_geom *g, const conv_fns *f, fm_dtype dt, const void *dy,
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
    fm_conv_geom g = fm_conv_geometry(&a->p, x, w, dy);
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
    if (fm_conv2d_lowp_products(a, x->dtype, g.K))
        return conv2d_bwd_lowp(&g, fm_tensor_data(dy), fm_tensor_data(x), fm_tensor_data(w), dxp, dwp);
    if (g.nhwc)
        return conv2d_bwd_nhwc(&g, f, x->dtype, fm_tensor_data(dy), fm_tensor_data(x), fm_tensor_data(w), dxp, dwp);
    return conv2d_bwd_nchw(&g, f, x->dtype, fm_tensor_data(dy), fm_tensor_data(x), fm_tensor_data(w), dxp, dwp);
}

void fm_cpu_kernels_conv(fm_backend *b) {
    b->kernels[FM_OP_CONV2D] = conv2d_kernel;
    b->kernels[FM_OP_CONV2D_BACKWARD] = conv2d_backward_kernel;
}
