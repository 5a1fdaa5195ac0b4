/* The int4 rows on int8 x (quant_kernels.h), shared by the AVX2 kernel
 * (quant_avx2.c: vpmaddubsw + vpmaddwd) and the AVX-512 VNNI one
 * (quant_avx512.c: vpdpbusd). They differ only in dot64, the integer sums of
 * one pair of blocks, which both return as the same 8 int32 lanes (lane j:
 * bytes 4j..4j+3 of the low and of the high nibbles, an exact integer), so the
 * two give bitwise the same results. Include from a file compiled for AVX2
 * (or above) with FMA and F16C. */
#ifndef FATHOM_QUANT_Q4_ROWS_H
#define FATHOM_QUANT_Q4_ROWS_H
#include <immintrin.h>

#include "backend/cpu/quant_kernels.h"

/* 64 weights (32 bytes: two blocks' nibbles) against their x codes (64 bytes in
 * the pair layout), added to acc: 8 int32 lanes, 0-3 the first block, 4-7 the
 * second */
typedef __m256i (*q4_dot64_fn)(__m256i acc, const uint8_t *w, const int8_t *qx);
/* the same on the 64 weights already split into low and high nibbles */
typedef __m256i (*q4_dot64n_fn)(__m256i acc, __m256i lo, __m256i hi, const int8_t *qx);

static inline float q4_hsum8f(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[m, col] = the row's scaled integer sums plus its offset term (off times -8
 * for symmetric weights, times 1 with a min table), plus the bias */
static inline void q4_store(const fm_q4_gemm *g, int64_t m, int64_t col, float sums, float off) {
    const float y = sums + (g->min ? 1.0f : -8.0f) * off;
    g->y[m * g->ldy + col] = g->bias ? y + g->bias[col] : y;
}

/* the same for one block (an odd last one): 4 int32 lanes */
static inline __m128i q4_dot32(const uint8_t *w, const int8_t *qx) {
    const __m128i m4 = _mm_set1_epi8(15), ones = _mm_set1_epi16(1);
    __m128i W = _mm_loadu_si128((const __m128i *)w);
    __m128i lo = _mm_and_si128(W, m4), hi = _mm_and_si128(_mm_srli_epi16(W, 4), m4);
    __m128i s = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128((const __m128i *)qx)), _mm_maddubs_epi16(hi, _mm_loadu_si128((const __m128i *)(qx + 16))));
    return _mm_madd_epi16(s, ones);
}

/* The f16 values of four groups from sp (gn <= 4 of them; only those are read, the
 * other lanes 0), as f32 */
static inline __m128 q4_h4(const uint16_t *sp, int64_t gn) {
    if (gn == 4) return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)sp));
    return _mm_cvtph_ps(_mm_setr_epi16((short)sp[0], gn > 1 ? (short)sp[1] : 0, gn > 2 ? (short)sp[2] : 0, 0, 0, 0, 0, 0));
}

/* The f16 values of a quad of pairs of blocks from sp, two per pair (pn <= 4 pairs;
 * only those are read, lane by lane, the other lanes 0), as f32 */
static inline __m256 q4_h8(const uint16_t *sp, const int pn) {
    if (pn == 4) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sp));
    return _mm256_cvtph_ps(_mm_setr_epi16((short)sp[0], (short)sp[1], pn > 1 ? (short)sp[2] : 0, pn > 1 ? (short)sp[3] : 0,
                                          pn > 2 ? (short)sp[4] : 0, pn > 2 ? (short)sp[5] : 0, 0, 0));
}

/* x's block scales and sums of four groups from g0 (gn of them, the other lanes 0;
 * the sums of the lanes below o zeroed: groups already counted) */
static inline void q4_x4(const float *dx, const float *xs, const int ppg, int64_t g0, int64_t gn, int o, __m128 *dxq, __m128 *xsq) {
    /* lane by lane: stores then a vector load of them would stall it */
    *dxq = _mm_setr_ps(dx[8 * g0 * ppg], gn > 1 ? dx[8 * (g0 + 1) * ppg] : 0.0f, gn > 2 ? dx[8 * (g0 + 2) * ppg] : 0.0f,
                       gn > 3 ? dx[8 * (g0 + 3) * ppg] : 0.0f);
    *xsq = gn == 4 ? _mm_loadu_ps(xs + g0) : _mm_setr_ps(xs[g0], gn > 1 ? xs[g0 + 1] : 0.0f, gn > 2 ? xs[g0 + 2] : 0.0f, 0.0f);
    if (o) *xsq = _mm_and_ps(*xsq, _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32(o - 1))));
}

/* The odd last block of x row m against weight row n (K / 32 odd), in the low half:
 * its scaled sums into acc, its offset term into off's lane 0 */
static inline __attribute__((always_inline)) void q4_odd_block(const fm_q4_gemm *g, int64_t m, int64_t n, __m256 *acc, __m256 *off) {
    const int64_t K = g->K, ng = K / 32, nb = K / 32, np = nb / 2;
    const float *dx = g->dxv + m * (K / 8);
    __m128 f = _mm_cvtepi32_ps(q4_dot32(g->w + n * (K / 2) + 32 * np, g->qx + m * K + 64 * np));
    __m128 d = _mm_set1_ps(_cvtsh_ss(g->scale[n * ng + nb - 1]));
    __m128 v = _mm_mul_ps(f, _mm_mul_ps(d, _mm_loadu_ps(dx + 8 * np)));
    *acc = _mm256_add_ps(*acc, _mm256_insertf128_ps(_mm256_setzero_ps(), v, 0));
    const uint16_t *t = g->min ? g->min : g->scale;
    const float o = _cvtsh_ss(t[n * ng + nb - 1]) * g->xsum[m * ng + nb - 1];
    *off = _mm256_add_ps(*off, _mm256_setr_ps(o, 0, 0, 0, 0, 0, 0, 0));
}

/* Groups of 64 (ppg 1 pair) and 128 (ppg 2): x was rounded at one scale per
 * group (fm_q4_quantize_x with xb = G), so a group's integer sums accumulate in
 * the lanes across its pairs (vpdpbusd adds into them) and take one conversion
 * and one multiply-add by d_g dx_g. */
static inline __attribute__((always_inline)) void q4_group(const fm_q4_gemm *g, const int8_t *qx, int64_t n, int64_t stride, const int nn,
                                                           q4_dot64_fn dot64, const int ppg, int64_t gi, const __m256 *ds, const int j, __m256 *acc) {
    const int64_t K = g->K;
    __m256i ia[4];
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) ia[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int pp = 0; pp < ppg; pp++) {
        const int64_t p = gi * ppg + pp;
#pragma GCC unroll 4
        for (int r = 0; r < nn; r++) {
            if (pp == 0) _mm_prefetch((const char *)(g->w + (n + r * stride + 2) * (K / 2) + 32 * p), _MM_HINT_T0); /* two rows on in this stream */
            ia[r] = dot64(ia[r], g->w + (n + r * stride) * (K / 2) + 32 * p, qx + 64 * p);
        }
    }
    const __m256i sel = _mm256_set1_epi32(j);
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), _mm256_permutevar8x32_ps(ds[r], sel), acc[r]);
}

/* The scales of four groups are converted and multiplied by their x scales at
 * once per row (lanes 0-3 of ds), then spread with one permute per group. The
 * offset term of the four, m_g sum_k x_k (m_g the min, or d_g and the caller's
 * -8), is added to off in the same pass: lanes below o are groups already
 * counted (xsq zero there). */
static inline __attribute__((always_inline)) void q4_scales4(const fm_q4_gemm *g, const float *dx, const float *xs, int64_t n, int64_t stride,
                                                             const int nn, const int ppg, int64_t g0, int64_t gn, int o, __m256 *ds, __m128 *off) {
    const int64_t ng = g->K / g->G;
    __m128 dxq, xsq;
    q4_x4(dx, xs, ppg, g0, gn, o, &dxq, &xsq);
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) {
        const int64_t at = (n + r * stride) * ng + g0;
        const __m128 d = q4_h4(g->scale + at, gn); /* a row of fewer than four groups: only its scales are read */
        ds[r] = _mm256_castps128_ps256(_mm_mul_ps(d, dxq));
        off[r] = _mm_fmadd_ps(g->min ? q4_h4(g->min + at, gn) : d, xsq, off[r]);
    }
}

static inline __attribute__((always_inline)) void q4_groups(const fm_q4_gemm *g, const int8_t *qx, const float *dx, const float *xs, int64_t n,
                                                            int64_t stride, const int nn, q4_dot64_fn dot64, const int ppg, __m256 *acc, __m128 *off) {
    const int64_t ng = g->K / g->G;
    __m256 ds[4];
    int64_t g0 = 0;
    for (; g0 + 4 <= ng; g0 += 4) {
        q4_scales4(g, dx, xs, n, stride, nn, ppg, g0, 4, 0, ds, off);
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0, ds, 0, acc);
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0 + 1, ds, 1, acc);
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0 + 2, ds, 2, acc);
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0 + 3, ds, 3, acc);
    }
    /* one to three groups left, each call with its lane a constant (a loop over the
     * lanes would keep acc in memory): with four groups or more in the row, the
     * scales of the last four are read and the left ones are lanes 4 - left .. 3 */
    const int64_t left = ng - g0;
    if (left == 0) return;
    const int o = ng >= 4 ? (int)(4 - left) : 0;
    q4_scales4(g, dx, xs, n, stride, nn, ppg, ng >= 4 ? ng - 4 : 0, ng >= 4 ? 4 : ng, o, ds, off);
    if (left == 3) {
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0, ds, o == 1 ? 1 : 0, acc);
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0 + 1, ds, o == 1 ? 2 : 1, acc);
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0 + 2, ds, o == 1 ? 3 : 2, acc);
    } else if (left == 2) {
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0, ds, o == 2 ? 2 : 0, acc);
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0 + 1, ds, o == 2 ? 3 : 1, acc);
    } else {
        q4_group(g, qx, n, stride, nn, dot64, ppg, g0, ds, o == 3 ? 3 : 0, acc);
    }
}

/* Groups of 32: pn (<= 4) pairs from p0 for nn rows. The weight scales of the
 * four pairs (8 f16) are converted at once per row and multiplied by the 8
 * blocks' x scales, then each pair takes its [d0 dx0 x4, d1 dx1 x4] with one
 * permute (the same products as scaling each pair's sums by d and dx apart).
 * The offset term of the 8 groups (m_g, or d_g and the caller's -8, times the
 * f32 sums of x) is added to off in the same pass. Full quads are called with
 * pn the constant 4. */
static inline __attribute__((always_inline)) void q4_pairs32(const fm_q4_gemm *g, const int8_t *qx, const float *dx, const float *dq,
                                                             const float *xs, int64_t n, int64_t stride, const int nn, q4_dot64_fn dot64,
                                                             int64_t p0, const int pn, __m256 *acc, __m256 *off) {
    const int64_t K = g->K, ng = K / 32;
    const __m256i spread[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                               _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
    const float *d8 = dx + 8 * p0; /* blocks 2 p0 + i: dx at d8[4 i] */
    const __m256 dxq = dq ? _mm256_loadu_ps(dq + 2 * p0) /* the same 8 values, gathered once per row */
                          : _mm256_setr_ps(d8[0], d8[4], pn > 1 ? d8[8] : 0.0f, pn > 1 ? d8[12] : 0.0f, pn > 2 ? d8[16] : 0.0f,
                                           pn > 2 ? d8[20] : 0.0f, pn > 3 ? d8[24] : 0.0f, pn > 3 ? d8[28] : 0.0f);
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * pn), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 xsq = pn == 4 ? _mm256_loadu_ps(xs + 2 * p0) : _mm256_maskload_ps(xs + 2 * p0, live);
    __m256 ds[4];
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) {
        const int64_t at = (n + r * stride) * ng + 2 * p0;
        const __m256 d = q4_h8(g->scale + at, pn);
        ds[r] = _mm256_mul_ps(d, dxq);
        off[r] = _mm256_fmadd_ps(g->min ? q4_h8(g->min + at, pn) : d, xsq, off[r]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < pn; j++) {
        const int64_t p = p0 + j;
#pragma GCC unroll 4
        for (int r = 0; r < nn; r++) {
            _mm_prefetch((const char *)(g->w + (n + r * stride + 2) * (K / 2) + 32 * p), _MM_HINT_T0); /* two rows on in this stream */
            const __m256 f = _mm256_cvtepi32_ps(dot64(_mm256_setzero_si256(), g->w + (n + r * stride) * (K / 2) + 32 * p, qx + 64 * p));
            acc[r] = _mm256_fmadd_ps(f, _mm256_permutevar8x32_ps(ds[r], spread[j]), acc[r]);
        }
    }
}

/* One x row against nn (<= 4) weight rows n, n + stride, ...: independent
 * chains per row. Groups of 32: each pair of blocks is scaled by its
 * [d0 dx0 x4, d1 dx1 x4]; groups of 64 and 128 sum their pairs as integers
 * and are scaled once by d dx. */
static inline __attribute__((always_inline)) void q4_rows4(const fm_q4_gemm *g, int64_t m, int64_t n, int64_t stride, const int nn,
                                                           q4_dot64_fn dot64) {
    const int64_t K = g->K, ng = K / g->G, nb = K / 32, np = nb / 2;
    const int8_t *qx = g->qx + m * K;
    const float *dx = g->dxv + m * (K / 8);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) acc[r] = _mm256_setzero_ps();
    if (g->G == 32) {
        __m256 off[4];
#pragma GCC unroll 4
        for (int r = 0; r < nn; r++) off[r] = _mm256_setzero_ps();
        int64_t p0 = 0;
        const float *dq = g->dx8 ? g->dx8 + m * 8 * ((np + 3) / 4) : NULL;
        for (; p0 + 4 <= np; p0 += 4) q4_pairs32(g, qx, dx, dq, g->xsum + m * ng, n, stride, nn, dot64, p0, 4, acc, off);
        if (p0 < np) q4_pairs32(g, qx, dx, dq, g->xsum + m * ng, n, stride, nn, dot64, p0, (int)(np - p0), acc, off);
        if (nb % 2) /* the odd last block */
#pragma GCC unroll 4
            for (int r = 0; r < nn; r++) q4_odd_block(g, m, n + r * stride, &acc[r], &off[r]);
#pragma GCC unroll 4
        for (int r = 0; r < nn; r++) q4_store(g, m, n + r * stride, q4_hsum8f(acc[r]), q4_hsum8f(off[r]));
        return;
    }
    __m128 off[4];
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) off[r] = _mm_setzero_ps();
    if (g->G == 64) q4_groups(g, qx, dx, g->xsum + m * ng, n, stride, nn, dot64, 1, acc, off);
    else q4_groups(g, qx, dx, g->xsum + m * ng, n, stride, nn, dot64, 2, acc, off);
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) {
        __m128 t = _mm_add_ps(off[r], _mm_movehl_ps(off[r], off[r]));
        t = _mm_add_ss(t, _mm_movehdup_ps(t));
        q4_store(g, m, n + r * stride, q4_hsum8f(acc[r]), _mm_cvtss_f32(t));
    }
}


/* Groups of 32, MM (<= 4) x rows from m against weight row n. Per (x row, weight
 * row) these are q4_rows4's operations in its order, so its bits: the integer sums
 * are exact however they are formed, and each pair's scaled sums and each quad's
 * offset terms go into the same accumulators in the same order. What changes is
 * the sharing: each pair of weight blocks is loaded and split into nibbles once for
 * the MM rows, and the weight scales converted once, where q4_rows4 does both per
 * row (a batched decode step's rows each paid the whole matrix-vector cost). */
static inline __attribute__((always_inline)) void q4_tile32(const fm_q4_gemm *g, int64_t m, int64_t n, const int MM, q4_dot64n_fn dotn) {
    const int64_t K = g->K, ng = K / 32, nb = K / 32, np = nb / 2, nq = (np + 3) / 4;
    const __m256i spread[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                               _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *wr = g->w + n * (K / 2);
    const uint16_t *sr = g->scale + n * ng, *mr = g->min ? g->min + n * ng : NULL;
    __m256 acc[4], off[4], ds[4];
#pragma GCC unroll 4
    for (int r = 0; r < MM; r++) acc[r] = off[r] = _mm256_setzero_ps();
    for (int64_t q = 0; q < nq; q++) {
        const int64_t p0 = 4 * q;
        const int pn = np - p0 >= 4 ? 4 : (int)(np - p0);
        const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * pn), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 d = q4_h8(sr + 2 * p0, pn), dm = mr ? q4_h8(mr + 2 * p0, pn) : d;
#pragma GCC unroll 4
        for (int r = 0; r < MM; r++) {
            const float *xs = g->xsum + (m + r) * ng + 2 * p0;
            const __m256 xsq = pn == 4 ? _mm256_loadu_ps(xs) : _mm256_maskload_ps(xs, live);
            ds[r] = _mm256_mul_ps(d, _mm256_loadu_ps(g->dx8 + ((m + r) * nq + q) * 8));
            off[r] = _mm256_fmadd_ps(dm, xsq, off[r]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            if (j >= pn) break;
            const int64_t p = p0 + j;
            _mm_prefetch((const char *)(wr + K + 32 * p), _MM_HINT_T0); /* two weight rows on: the first x rows meet it in memory */
            const __m256i W = _mm256_loadu_si256((const __m256i *)(wr + 32 * p));
            const __m256i lo = _mm256_and_si256(W, m4), hi = _mm256_and_si256(_mm256_srli_epi16(W, 4), m4);
#pragma GCC unroll 4
            for (int r = 0; r < MM; r++) {
                const __m256 f = _mm256_cvtepi32_ps(dotn(_mm256_setzero_si256(), lo, hi, g->qx + (m + r) * K + 64 * p));
                acc[r] = _mm256_fmadd_ps(f, _mm256_permutevar8x32_ps(ds[r], spread[j]), acc[r]);
            }
        }
    }
    if (nb % 2) /* the odd last block */
#pragma GCC unroll 4
        for (int r = 0; r < MM; r++) q4_odd_block(g, m + r, n, &acc[r], &off[r]);
#pragma GCC unroll 4
    for (int r = 0; r < MM; r++) q4_store(g, m + r, n, q4_hsum8f(acc[r]), q4_hsum8f(off[r]));
}

/* q4_scales4 for MM x rows from m against weight row n (q4_tileg): the weight
 * scales converted once, each row's x scales and sums as q4_scales4 reads them */
static inline __attribute__((always_inline)) void q4_tile_scales4(const fm_q4_gemm *g, int64_t m, int64_t n, const int MM, const int ppg,
                                                                  int64_t g0, int64_t gn, int o, __m256 *ds, __m128 *off) {
    const int64_t K = g->K, ng = K / g->G, at = n * ng + g0;
    const __m128 d = q4_h4(g->scale + at, gn), dm = g->min ? q4_h4(g->min + at, gn) : d;
#pragma GCC unroll 4
    for (int r = 0; r < MM; r++) {
        __m128 dxq, xsq;
        q4_x4(g->dxv + (m + r) * (K / 8), g->xsum + (m + r) * ng, ppg, g0, gn, o, &dxq, &xsq);
        ds[r] = _mm256_castps128_ps256(_mm_mul_ps(d, dxq));
        off[r] = _mm_fmadd_ps(dm, xsq, off[r]);
    }
}

/* q4_group for MM x rows against weight row n: each pair of blocks split once */
static inline __attribute__((always_inline)) void q4_tile_group(const fm_q4_gemm *g, int64_t m, const uint8_t *wr, const int MM,
                                                                q4_dot64n_fn dotn, const int ppg, int64_t gi, const __m256 *ds, const int j,
                                                                __m256 *acc) {
    const int64_t K = g->K;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i ia[4];
#pragma GCC unroll 4
    for (int r = 0; r < MM; r++) ia[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int pp = 0; pp < ppg; pp++) {
        const int64_t p = gi * ppg + pp;
        _mm_prefetch((const char *)(wr + K + 32 * p), _MM_HINT_T0); /* two weight rows on */
        const __m256i W = _mm256_loadu_si256((const __m256i *)(wr + 32 * p));
        const __m256i lo = _mm256_and_si256(W, m4), hi = _mm256_and_si256(_mm256_srli_epi16(W, 4), m4);
#pragma GCC unroll 4
        for (int r = 0; r < MM; r++) ia[r] = dotn(ia[r], lo, hi, g->qx + (m + r) * K + 64 * p);
    }
    const __m256i sel = _mm256_set1_epi32(j);
#pragma GCC unroll 4
    for (int r = 0; r < MM; r++) acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), _mm256_permutevar8x32_ps(ds[r], sel), acc[r]);
}

/* Groups of 64 and 128, MM (<= 4) x rows from m against weight row n: q4_groups'
 * operations per (x row, weight row) in its order (its bits), each pair of weight
 * blocks split into nibbles once for the MM rows (as q4_tile32). */
static inline __attribute__((always_inline)) void q4_tileg(const fm_q4_gemm *g, int64_t m, int64_t n, const int MM, q4_dot64n_fn dotn,
                                                           const int ppg) {
    const int64_t K = g->K, ng = K / g->G;
    const uint8_t *wr = g->w + n * (K / 2);
    __m256 acc[4], ds[4];
    __m128 off[4];
#pragma GCC unroll 4
    for (int r = 0; r < MM; r++) {
        acc[r] = _mm256_setzero_ps();
        off[r] = _mm_setzero_ps();
    }
    int64_t g0 = 0;
    for (; g0 + 4 <= ng; g0 += 4) {
        q4_tile_scales4(g, m, n, MM, ppg, g0, 4, 0, ds, off);
        q4_tile_group(g, m, wr, MM, dotn, ppg, g0, ds, 0, acc);
        q4_tile_group(g, m, wr, MM, dotn, ppg, g0 + 1, ds, 1, acc);
        q4_tile_group(g, m, wr, MM, dotn, ppg, g0 + 2, ds, 2, acc);
        q4_tile_group(g, m, wr, MM, dotn, ppg, g0 + 3, ds, 3, acc);
    }
    const int64_t left = ng - g0;
    if (left) { /* as q4_groups */
        const int o = ng >= 4 ? (int)(4 - left) : 0;
        q4_tile_scales4(g, m, n, MM, ppg, ng >= 4 ? ng - 4 : 0, ng >= 4 ? 4 : ng, o, ds, off);
        if (left == 3) {
            q4_tile_group(g, m, wr, MM, dotn, ppg, g0, ds, o == 1 ? 1 : 0, acc);
            q4_tile_group(g, m, wr, MM, dotn, ppg, g0 + 1, ds, o == 1 ? 2 : 1, acc);
            q4_tile_group(g, m, wr, MM, dotn, ppg, g0 + 2, ds, o == 1 ? 3 : 2, acc);
        } else if (left == 2) {
            q4_tile_group(g, m, wr, MM, dotn, ppg, g0, ds, o == 2 ? 2 : 0, acc);
            q4_tile_group(g, m, wr, MM, dotn, ppg, g0 + 1, ds, o == 2 ? 3 : 1, acc);
        } else {
            q4_tile_group(g, m, wr, MM, dotn, ppg, g0, ds, o == 3 ? 3 : 0, acc);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MM; r++) {
        __m128 t = _mm_add_ps(off[r], _mm_movehl_ps(off[r], off[r]));
        t = _mm_add_ss(t, _mm_movehdup_ps(t));
        q4_store(g, m + r, n, q4_hsum8f(acc[r]), _mm_cvtss_f32(t));
    }
}

/* MM x rows from m against weight row n, by group size */
static inline __attribute__((always_inline)) void q4_tile(const fm_q4_gemm *g, int64_t m, int64_t n, const int MM, q4_dot64n_fn dotn) {
    if (g->G == 32) q4_tile32(g, m, n, MM, dotn);
    else if (g->G == 64) q4_tileg(g, m, n, MM, dotn, 1);
    else q4_tileg(g, m, n, MM, dotn, 2);
}

/* q4_rows: the rows are split into four contiguous quarters walked side by side (as
 * gemv_avx2.c does for f32): four long sequential streams, each in its own
 * pages, which the hardware prefetcher follows better than four adjacent rows.
 * Two or more x rows go through the tiles instead (q4_tile32, q4_tileg), four rows
 * of x against one weight row at a time (the weights then come from the cache for
 * the later rows): bitwise the same results. */
static inline __attribute__((always_inline)) void q4_rows(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                                                          q4_dot64_fn dot64, q4_dot64n_fn dotn) {
    if (g->tiles && (g->G != 32 || g->dx8) && m1 - m0 >= 2) {
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4)
            for (int64_t n = n0; n < n1; n++) q4_tile(g, m, n, 4, dotn);
        const int64_t left = m1 - m;
        for (int64_t n = n0; n < n1 && left; n++) {
            if (left == 3) q4_tile(g, m, n, 3, dotn);
            else if (left == 2) q4_tile(g, m, n, 2, dotn);
            else q4_tile(g, m, n, 1, dotn);
        }
        return;
    }
    const int64_t q = (n1 - n0) / 4;
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t n = n0; n < n0 + q; n++) q4_rows4(g, m, n, q, 4, dot64);
        for (int64_t n = n0 + 4 * q; n < n1; n++) q4_rows4(g, m, n, 0, 1, dot64);
    }
}
#endif
