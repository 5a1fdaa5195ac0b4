/* CPU kernel of qconv2d_int8 (ops.def QCONV2D_INT8; fm_qconv2d_int8): an int8
 * convolution as an integer GEMM on the int8 panels (quant_kernels.h), the one
 * qlinear_int8 runs, so every ISA level (scalar, AVX2, AVX-512 VNNI, AMX-INT8)
 * comes with it.
 *
 *   1. x f32 NCHW -> u8 codes (static scale and zero point, or this x's range),
 *      the same codes as qlinear_int8's activations (fm_q8_quantize_rows);
 *   2. the codes NCHW -> NHWC with the padding around them, so that a window row
 *      (kx = 0..kw-1, every channel) is kw C contiguous bytes: the weight's K runs
 *      (ky, kx, c) to match (fm_quantize_conv_weight_int8), and im2col is one
 *      copy per (position, ky) where the dilation in width is 1, with no bounds
 *      to test; a 1x1 stride-1 unpadded convolution over C % 4 == 0 channels reads
 *      the NHWC codes as they are, with no im2col at all (where C is the panels' K:
 *      a multiple of 4 below 64, of 64 from 64 on). The padding cells hold
 *      the zero point (the code of 0.0: a padded cell adds a_zero w, which the
 *      epilogue's a_zero w_sum takes back, exactly a zero input);
 *   3. im2col rows [positions, Kp] (zeros from K on; Kp = fm_qconv_panel_k(K), a
 *      multiple of 64 from 64 on, so that AMX tiles take the whole product);
 *   4. the panels' GEMM with the epilogue fused (scales, bias, ReLU), out
 *      [positions, O] f32, then that block into NCHW: the max pool when there is one
 *      (conv2d_fused's, which fathom quantize carries over), the cap, the transpose.
 * With at least as many samples as threads (and a sample's scratch under 1 MiB), each
 * sample runs 1-4 start to end in one task, in that thread's caches, with steps 1-2 in one
 * pass at the AVX-512 level (fm_qconv_codes_nhwc_avx512); otherwise each step runs over the
 * pool, samples in chunks whose columns and staging stay under QCONV_CHUNK_BYTES.
 *
 * Why by hand: oneDNN has int8 convolutions, but fathom's int8 weights, codes
 * and rounding are its own (docs/QUANTIZE.md), and the panels' GEMM already
 * exists at every level; the new work here is data movement only. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/conv_geom.h" /* fm_cpu_qconv8_scratch */
#include "backend/cpu/qconv.h"
#include "core/cpu_features.h"
#include "backend/cpu/quant_kernels.h"
#include "core/parallel.h"

#define QCONV_CHUNK_BYTES (8 << 20)

typedef struct qconv_job {
    const fm_qconv8_attrs *at;
    int64_t N, C, H, W, Ho, Wo, P, O, K, lda;
    int64_t Hpad, Wpad, img; /* the NHWC codes with the padding around them (cells of the zero point), bytes a sample */
    bool direct;       /* 1x1, stride 1, unpadded, C % 4 == 0: the NHWC codes are the GEMM's rows */
    const float *x;    /* [N, C, H, W] */
    float scale;
    int32_t zero;
    uint8_t zb;        /* the zero point as a code: what a padded cell holds */
    fm_q8_impl impl;
    const fm_q8_epilogue *ep; /* scales, sums, bias, act; y set per GEMM */
    const int8_t *panels;
    float *y;          /* [N, O, Hp, Wp] */
    fm_qconv_out out;  /* the output pass: the pool (1: none), the cap, the output's size */
    bool out512;       /* its AVX-512 version */
    /* the chunked path: the whole batch's codes, one chunk's columns and GEMM out */
    const uint8_t *xq; /* [N, C, H, W] codes */
    uint8_t *xh;       /* [N, H, W, C] codes */
    uint8_t *col;      /* [nb P, lda] */
    float *yt;         /* [nb P, O] */
    int64_t n0;        /* the chunk's first sample */
    /* the per-sample path: each pool thread's scratch, the sizes of one sample's */
    uint8_t *scratch8;
    float *scratch32;
    int64_t s8, s32;
} qconv_job;

/* Bytes past the end of every buffer the fast copies read or write: they move up to 127 bytes
 * more than asked where the room allows (copy_run). */
#define QCONV_SLACK 128

/* The padding cells of one sample's padded NHWC codes dst [Hpad, Wpad, C] around image rows
 * [h0, h1): the zero point (the first and last rows write the top and bottom padding too). */
static void pad_cells(const qconv_job *j, uint8_t *dst, int64_t h0, int64_t h1) {
    const int64_t C = j->C, H = j->H, W = j->W, ph = j->at->padding[0], pw = j->at->padding[1], Wpad = j->Wpad;
    if (h0 == 0 && ph) memset(dst, j->zb, (size_t)(ph * Wpad * C));
    if (h1 == H && ph) memset(dst + (ph + H) * Wpad * C, j->zb, (size_t)(ph * Wpad * C));
    for (int64_t h = h0; pw && h < h1; h++) {
        uint8_t *row = dst + (h + ph) * Wpad * C;
        memset(row, j->zb, (size_t)(pw * C));
        memset(row + (pw + W) * C, j->zb, (size_t)(pw * C));
    }
}

/* One sample's NHWC codes, padded: rows [h0, h1) of the image from NCHW codes src into dst
 * [Hpad, Wpad, C], with their padding cells */
static void nhwc_rows(const qconv_job *j, const uint8_t *restrict src, uint8_t *restrict dst, int64_t h0, int64_t h1) {
    const int64_t C = j->C, H = j->H, W = j->W, ph = j->at->padding[0], pw = j->at->padding[1], Wpad = j->Wpad;
    pad_cells(j, dst, h0, h1);
    for (int64_t h = h0; h < h1; h++) {
        uint8_t *restrict row = dst + ((h + ph) * Wpad + pw) * C;
        if (C == 1) {
            memcpy(row, src + h * W, (size_t)W);
            continue;
        }
        for (int64_t c = 0; c < C; c++)
            for (int64_t w = 0; w < W; w++) row[w * C + c] = src[(c * H + h) * W + w];
    }
}

/* n bytes s -> d as one fixed-size copy of 16, 32, 64 or 128 bytes when room (the bytes d may
 * take, slack included) holds it: the short runs of a small C (3 bytes for fashion-cnn's first
 * conv, 96 for its second) cost a memcpy call each otherwise. (A loop of 16-byte blocks became
 * a memmove call again: GCC turns such loops into library calls.) The bytes past n are ones a
 * later copy or the zero tail rewrites. */
static inline void copy_run(uint8_t *restrict d, const uint8_t *restrict s, int64_t n, int64_t room) {
    if (n <= 16 && room >= 16) memcpy(d, s, 16);
    else if (n <= 32 && room >= 32) memcpy(d, s, 32);
    else if (n <= 64 && room >= 64) memcpy(d, s, 64);
    else if (n <= 128 && room >= 128) {
        memcpy(d, s, 64);
        memcpy(d + 64, s + 64, 64);
    } else {
        memcpy(d, s, (size_t)n);
    }
}

/* im2col rows [p0, p1) of one sample (its padded NHWC codes xh) into col (row p at p lda).
 * A window row is kw C contiguous bytes where the dilation in width is 1. The copies may run
 * past a row into the next ones, which this call writes after: not past row p1 - 1 (another
 * thread's rows follow in the chunked path), unless col has the slack after and nothing
 * follows (tail). */
static void im2col_rows(const qconv_job *j, const uint8_t *xh, uint8_t *col, int64_t p0, int64_t p1, bool tail) {
    const fm_qconv8_attrs *a = j->at;
    const int64_t C = j->C, kh = a->kh, kw = a->kw, rowb = kw * C, lda = j->lda, K = j->K, Wpad = j->Wpad;
    const int64_t sh = a->stride[0], sw = a->stride[1], dh = a->dilation[0], dw = a->dilation[1];
    for (int64_t p = p0; p < p1; p++) {
        const int64_t oy = p / j->Wo, ox = p % j->Wo, ours = (p1 - p) * lda; /* to the end of row p1 - 1 */
        const int64_t room = tail ? lda + QCONV_SLACK : ours < lda + QCONV_SLACK ? ours : lda + QCONV_SLACK;
        uint8_t *dst = col + p * lda;
        for (int64_t ky = 0; ky < kh; ky++) {
            const uint8_t *src = xh + ((oy * sh + ky * dh) * Wpad + ox * sw) * C;
            uint8_t *d = dst + ky * rowb;
            if (dw == 1) copy_run(d, src, rowb, room - ky * rowb);
            else
                for (int64_t kx = 0; kx < kw; kx++) copy_run(d + kx * C, src + kx * dw * C, C, room - ky * rowb - kx * C);
        }
        for (int64_t k = K; k < lda; k++) dst[k] = 0;
    }
}

/* The output pass of one sample (qconv.h): (pooled) positions [q0, q1). The generic loop in
 * blocks of QCONV_TBLOCK positions: each output the max over its window of GEMM rows, taken
 * across 64 channels at a time (contiguous in a row, so the max vectorizes), then the cap
 * (min commutes with max), then the block written channel by channel. */
#define QCONV_TBLOCK 32
#define QCONV_TCH 64
__attribute__((target_clones("avx2", "default")))
static void out_block(const fm_qconv_out *a, const float *restrict src, float *restrict dst, int64_t q0, int64_t q1) {
    const int64_t O = a->O, Wo = a->Wo, k = a->pool, Wp = a->Wp, Pp = a->Pp;
    const float hi = a->hi;
    float buf[QCONV_TBLOCK][QCONV_TCH];
    for (int64_t o0 = 0; o0 < O; o0 += QCONV_TCH) {
        const int64_t no = O - o0 < QCONV_TCH ? O - o0 : QCONV_TCH;
        for (int64_t q = q0; q < q1; q++) {
            const int64_t py = q / Wp, px = q % Wp;
            float *restrict b = buf[q - q0];
            const float *restrict r0 = src + ((py * k) * Wo + px * k) * O + o0;
            for (int64_t o = 0; o < no; o++) b[o] = r0[o];
            for (int64_t dy = 0; dy < k; dy++)
                for (int64_t dx = dy ? 0 : 1; dx < k; dx++) {
                    const float *restrict r = r0 + (dy * Wo + dx) * O;
                    for (int64_t o = 0; o < no; o++) {
                        const float v = r[o], m = b[o];
                        b[o] = ((v > m) | (v != v)) ? v : m; /* NaN wins, as max_pool2d */
                    }
                }
            for (int64_t o = 0; o < no; o++) b[o] = b[o] > hi ? hi : b[o];
        }
        for (int64_t o = 0; o < no; o++)
            for (int64_t q = q0; q < q1; q++) dst[(o0 + o) * Pp + q] = buf[q - q0][o];
    }
}

static void out_rows(const qconv_job *j, const float *src, float *dst, int64_t q0, int64_t q1) {
    if (j->out512) { fm_qconv_out_avx512(&j->out, src, dst, q0, q1); return; }
    for (int64_t q = q0; q < q1; q += QCONV_TBLOCK) out_block(&j->out, src, dst, q, q + QCONV_TBLOCK < q1 ? q + QCONV_TBLOCK : q1);
}

/* ---- the chunked path (fewer samples than threads): each step over the pool ---- */

/* Image rows [h0, h1) of sample n into its padded NHWC codes xh: at the AVX-512 level codes
 * and layout in one pass from x; else from the NCHW codes xq, made before */
static void codes_nhwc(const qconv_job *j, int64_t n, const uint8_t *xq, uint8_t *xh, int64_t h0, int64_t h1) {
    if (!j->out512) { nhwc_rows(j, xq, xh, h0, h1); return; }
    pad_cells(j, xh, h0, h1);
    fm_qconv_codes_nhwc_avx512(j->x + n * j->C * j->H * j->W, j->C, j->H, j->W, h0, h1, 1.0f / j->scale, j->zero, xh, j->Wpad,
                               j->at->padding[0], j->at->padding[1]);
}

/* the epilogue with this call's activation scale, storing into y */
static fm_q8_epilogue epilogue_into(const qconv_job *j, float *y) {
    fm_q8_epilogue ep = *j->ep;
    ep.a_scale = j->scale;
    ep.a_zero = j->zero;
    ep.y = y;
    return ep;
}

static void nhwc_task(void *ctx, int64_t b, int64_t e, int tid) { /* rows (n, h) */
    (void)tid;
    const qconv_job *j = ctx;
    for (int64_t r = b; r < e; r++) {
        const int64_t n = r / j->H, h = r % j->H;
        codes_nhwc(j, n, j->xq + n * j->C * j->H * j->W, j->xh + n * j->img, h, h + 1);
    }
}

static void im2col_task(void *ctx, int64_t b, int64_t e, int tid) { /* rows m of the chunk */
    (void)tid;
    const qconv_job *j = ctx;
    for (int64_t m = b; m < e;) {
        const int64_t s = m / j->P, p0 = m % j->P, p1 = e - s * j->P < j->P ? e - s * j->P : j->P;
        im2col_rows(j, j->xh + (j->n0 + s) * j->img, j->col + s * j->P * j->lda, p0, p1, false);
        m = s * j->P + p1;
    }
}

static void out_task(void *ctx, int64_t b, int64_t e, int tid) { /* blocks of one sample's outputs */
    (void)tid;
    const qconv_job *j = ctx;
    const int64_t Pp = j->out.Pp, nblk = (Pp + QCONV_TBLOCK - 1) / QCONV_TBLOCK;
    for (int64_t t = b; t < e; t++) {
        const int64_t s = t / nblk, q0 = (t % nblk) * QCONV_TBLOCK;
        out_rows(j, j->yt + s * j->P * j->O, j->y + (j->n0 + s) * j->O * Pp, q0, q0 + QCONV_TBLOCK < Pp ? q0 + QCONV_TBLOCK : Pp);
    }
}

/* The activations' scale and zero point: static, or this x's range (qlinear_int8's rule) */
static void q8_scale_of(qconv_job *j) {
    fm_q8_scale_of(j->x, j->N * j->C, j->H * j->W, j->at->a_scale, j->at->a_zero, &j->scale, &j->zero);
    j->zb = (uint8_t)j->zero;
}

/* The chunked path's blocks: the codes (u8), NHWC codes (u8), columns (u8), staging (f32)
 * element counts, and the samples a chunk. */
static int64_t chunked_sizes(const qconv_job *j, int64_t n[4]) {
    const int64_t N = j->N;
    int64_t nb = QCONV_CHUNK_BYTES / (j->P * (j->direct ? 0 : j->lda) + j->P * j->O * (int64_t)sizeof(float));
    nb = nb < 1 ? 1 : nb > N ? N : nb;
    n[0] = j->out512 ? 1 : N * j->C * j->H * j->W;
    n[1] = N * j->img + QCONV_SLACK;
    n[2] = j->direct ? 1 : nb * j->P * j->lda + QCONV_SLACK;
    n[3] = nb * j->P * j->O;
    return nb;
}

static fm_status run_chunked(qconv_job *j) {
    const int64_t N = j->N;
    int64_t sz[4];
    const int64_t nb = chunked_sizes(j, sz), nx = sz[0], nh = sz[1], ncol = sz[2], nyt = sz[3];
    fm_tensor *tq = fm_tensor_empty(1, &nx, FM_U8, FM_CPU), *th = fm_tensor_empty(1, &nh, FM_U8, FM_CPU);
    fm_tensor *tc = fm_tensor_empty(1, &ncol, FM_U8, FM_CPU), *ty = fm_tensor_empty(1, &nyt, FM_F32, FM_CPU);
    if (!tq || !th || !tc || !ty) {
        fm_tensor_release_n(4, tq, th, tc, ty);
        return fm_set_error(FM_ERR_OOM, "qconv2d_int8: out of host memory for the activation codes and columns (%lld samples a chunk)",
                            (long long)nb);
    }
    j->xq = fm_tensor_data(tq);
    j->xh = fm_tensor_data(th);
    j->col = fm_tensor_data(tc);
    j->yt = fm_tensor_data(ty);
    if (j->out512) { /* the scale: static, or this x's range (the codes come with the NHWC pass) */
        q8_scale_of(j);
    } else {
        fm_q8_quantize_rows(j->x, N * j->C, j->H * j->W, j->H * j->W, j->at->a_scale, j->at->a_zero, &j->scale, &j->zero, (uint8_t *)j->xq);
        j->zb = (uint8_t)j->zero;
    }
    fm_parallel_for(N * j->H, 16, nhwc_task, j);
    const fm_q8_epilogue ep = epilogue_into(j, j->yt);
    for (j->n0 = 0; j->n0 < N; j->n0 += nb) {
        const int64_t cnt = N - j->n0 < nb ? N - j->n0 : nb, M = cnt * j->P;
        if (!j->direct) fm_parallel_for(M, 64, im2col_task, j);
        fm_q8_pgemm g = {M, j->O, j->lda, j->direct ? j->xh + j->n0 * j->P * j->C : j->col, j->direct ? j->C : j->lda, j->panels, NULL, 0, &ep, false};
        fm_q8_pgemm_run(&g, j->impl);
        fm_parallel_for(cnt * ((j->out.Pp + QCONV_TBLOCK - 1) / QCONV_TBLOCK), 4, out_task, j);
    }
    fm_tensor_release_n(4, tq, th, tc, ty);
    return FM_OK;
}

/* ---- the per-sample path (at least as many samples as threads): one task a sample ---- */

/* One sample start to end in this thread's scratch, which stays in its core's caches:
 * codes, NHWC, columns, the GEMM on this thread, the output pass. */
static void sample_task(void *ctx, int64_t b, int64_t e, int tid) {
    const qconv_job *j = ctx;
    const int64_t CHW = j->C * j->H * j->W, Pp = j->out.Pp;
    uint8_t *xq = j->scratch8 + tid * j->s8, *xh = xq + CHW, *col = xh + j->img + QCONV_SLACK;
    float *yt = j->scratch32 + tid * j->s32;
    const fm_q8_epilogue ep = epilogue_into(j, yt);
    for (int64_t n = b; n < e; n++) {
        if (!j->out512) fm_q8_codes_at_level(j->x + n * CHW, CHW, j->scale, j->zero, xq);
        codes_nhwc(j, n, xq, xh, 0, j->H);
        if (!j->direct) im2col_rows(j, xh, col, 0, j->P, true);
        fm_q8_pgemm g = {j->P, j->O, j->lda, j->direct ? xh : col, j->direct ? j->C : j->lda, j->panels, NULL, 0, &ep, false};
        fm_q8_pgemm_serial(&g, j->impl);
        out_rows(j, yt, j->y + n * j->O * Pp, 0, Pp);
    }
}

/* The per-sample path's per-thread block sizes (u8 codes, NHWC codes and columns; f32 staging). */
static void sample_sizes(qconv_job *j) {
    j->s8 = j->C * j->H * j->W + j->img + (j->direct ? 0 : j->P * j->lda) + 2 * QCONV_SLACK + 64;
    j->s32 = j->P * j->O + 16;
}

static fm_status run_per_sample(qconv_job *j, int nt) {
    sample_sizes(j);
    const int64_t n8 = nt * j->s8, n32 = nt * j->s32;
    fm_tensor *t8 = fm_tensor_empty(1, &n8, FM_U8, FM_CPU), *t32 = fm_tensor_empty(1, &n32, FM_F32, FM_CPU);
    if (!t8 || !t32) {
        fm_tensor_release_n(2, t8, t32);
        return fm_set_error(FM_ERR_OOM, "qconv2d_int8: out of host memory for %d threads' activation codes and columns", nt);
    }
    j->scratch8 = fm_tensor_data(t8);
    j->scratch32 = fm_tensor_data(t32);
    q8_scale_of(j);
    fm_parallel_for(j->N, 1, sample_task, j);
    fm_tensor_release_n(2, t8, t32);
    return FM_OK;
}

/* The job's geometry for call c (no data pointers or epilogue); false when there is no work. */
static bool qconv_setup(const fm_op_call *c, qconv_job *jp) {
    const fm_qconv8_attrs *at = c->attrs;
    const fm_tensor *x = c->in[0], *y = c->out[0];
    qconv_job j = {.at = at, .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .O = y->shape[1]};
    j.Ho = fm_conv2d_out_size(j.H, at->kh, at->stride[0], at->padding[0], at->dilation[0]);
    j.Wo = fm_conv2d_out_size(j.W, at->kw, at->stride[1], at->padding[1], at->dilation[1]);
    j.P = j.Ho * j.Wo;
    j.K = (int64_t)at->kh * at->kw * j.C;
    j.lda = fm_qconv_panel_k(j.K); /* the panels' K: the GEMM runs over it, zeros past K on both sides */
    j.out = (fm_qconv_out){j.O, j.Wo, at->pool > 1 ? at->pool : 1, y->shape[3], y->shape[2] * y->shape[3], (float)at->hi};
    j.out512 = fm_cpu_use_avx512();
    j.Hpad = j.H + 2 * (int64_t)at->padding[0];
    j.Wpad = j.W + 2 * (int64_t)at->padding[1];
    j.img = j.Hpad * j.Wpad * j.C;
    j.direct = at->kh == 1 && at->kw == 1 && at->stride[0] == 1 && at->stride[1] == 1 && at->padding[0] == 0 && at->padding[1] == 0 && j.lda == j.C;
    *jp = j;
    return j.N != 0 && j.P != 0 && j.O != 0;
}

/* one sample a task when every thread gets one and a sample's scratch fits a core's L2 */
static bool per_sample(const qconv_job *j, int nt) {
    const int64_t per = j->C * j->H * j->W + j->img + j->P * j->lda + 4 * j->P * j->O;
    return j->N >= nt && nt > 1 && per <= (1 << 20);
}

int fm_cpu_qconv8_scratch(const fm_op_call *c, int64_t n[4], fm_dtype dt[4]) {
    qconv_job j;
    if (!qconv_setup(c, &j)) return 0;
    const int nt = fm_num_threads();
    if (per_sample(&j, nt)) {
        sample_sizes(&j);
        n[0] = nt * j.s8, n[1] = nt * j.s32, dt[0] = FM_U8, dt[1] = FM_F32;
        return 2;
    }
    chunked_sizes(&j, n);
    dt[0] = dt[1] = dt[2] = FM_U8, dt[3] = FM_F32;
    return 4;
}

/* QCONV2D_INT8: in = {x, panels, w_scale, bias|NULL, w_sum} (backend/kernel_attrs.h) */
static fm_status qconv8_kernel(const fm_op_call *c) {
    const fm_qconv8_attrs *at = c->attrs;
    qconv_job j;
    if (!qconv_setup(c, &j)) return FM_OK;
    j.x = fm_tensor_data(c->in[0]), j.panels = fm_tensor_data(c->in[1]), j.y = fm_tensor_data(c->out[0]), j.impl = fm_q8_impl_best();
    fm_q8_epilogue ep = {0.0f, 0, fm_tensor_data(c->in[2]), fm_tensor_data(c->in[4]), c->in[3] ? fm_tensor_data(c->in[3]) : NULL,
                         NULL, j.O, at->relu ? FM_QACT_RELU : FM_QACT_NONE, NULL, NULL};
    j.ep = &ep;
    const int nt = fm_num_threads();
    return per_sample(&j, nt) ? run_per_sample(&j, nt) : run_chunked(&j);
}

void fm_cpu_kernels_qconv(fm_backend *b) { b->kernels[FM_OP_QCONV2D_INT8] = qconv8_kernel; }
