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
#include <string.h>

#include "backend/cpu/quant_kernels.h"

/* 64 weights (32 bytes: two blocks' nibbles) against their x codes (64 bytes in
 * the pair layout): 8 int32 lanes, 0-3 the first block, 4-7 the second */
typedef __m256i (*q4_dot64_fn)(const uint8_t *w, const int8_t *qx);

static inline float q4_hsum8f(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* sum_g m_g xsum_g of one weight row (m = -8 d when there is no min table) */
static inline float q4_offset_sum(const uint16_t *t, const float *xs, int64_t ng, float mul) {
    __m256 acc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8) acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + g))), _mm256_loadu_ps(xs + g), acc);
    float s = q4_hsum8f(acc);
    for (; g < ng; g++) s += _cvtsh_ss(t[g]) * xs[g];
    return mul * s;
}

/* the same for one block (an odd last one): 4 int32 lanes */
static inline __m128i q4_dot32(const uint8_t *w, const int8_t *qx) {
    const __m128i m4 = _mm_set1_epi8(15), ones = _mm_set1_epi16(1);
    __m128i W = _mm_loadu_si128((const __m128i *)w);
    __m128i lo = _mm_and_si128(W, m4), hi = _mm_and_si128(_mm_srli_epi16(W, 4), m4);
    __m128i s = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128((const __m128i *)qx)), _mm_maddubs_epi16(hi, _mm_loadu_si128((const __m128i *)(qx + 16))));
    return _mm_madd_epi16(s, ones);
}

/* One x row against nn (<= 4) weight rows n, n + stride, ...: independent
 * chains per row. Groups of 32 and 64: each pair of blocks is scaled by its
 * [d0 x4, d1 x4] (two f16s; one for 64) times the x scales; groups of 128
 * hold two pairs, summed at the x scales, then scaled once by d. */
static inline __attribute__((always_inline)) void q4_rows4(const fm_q4_gemm *g, int64_t m, int64_t n, int64_t stride, const int nn,
                                                           q4_dot64_fn dot64) {
    const int64_t K = g->K, ng = K / g->G, nb = K / 32, np = nb / 2, ppg = g->G / 64;
    const int8_t *qx = g->qx + m * K;
    const float *dx = g->dxv + m * (K / 8);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) acc[r] = _mm256_setzero_ps();
    if (g->G <= 64) {
        /* the weight scales of four pairs converted at once per row (8 f16 for g32, 4 for
         * g64), each pair's [d0 x4, d1 x4] (g32) or [d x8] (g64) then one permute of them:
         * the same floats as converting each pair's own, at a quarter of the conversions */
        const int64_t gs = g->G / 32; /* the scale of pair p: g32 at 2p (and 2p + 1), g64 at p */
        const __m256i spread[4] = {
            gs == 1 ? _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1) : _mm256_set1_epi32(0),
            gs == 1 ? _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3) : _mm256_set1_epi32(1),
            gs == 1 ? _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5) : _mm256_set1_epi32(2),
            gs == 1 ? _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7) : _mm256_set1_epi32(3)};
        for (int64_t p0 = 0; p0 < np; p0 += 4) {
            const int64_t pn = np - p0 < 4 ? np - p0 : 4;
            __m256 ds[4];
#pragma GCC unroll 4
            for (int r = 0; r < nn; r++) {
                const uint16_t *sp = g->scale + (n + r * stride) * ng + (gs == 1 ? 2 * p0 : p0);
                __m128i h;
                if (pn == 4) h = gs == 1 ? _mm_loadu_si128((const __m128i *)sp) : _mm_loadl_epi64((const __m128i *)sp);
                else { /* the last pairs: only their scales are read */
                    uint16_t t[8] = {0};
                    memcpy(t, sp, sizeof(uint16_t) * (size_t)(gs == 1 ? 2 * pn : pn));
                    h = _mm_loadu_si128((const __m128i *)t);
                }
                ds[r] = _mm256_cvtph_ps(h);
            }
#pragma GCC unroll 4
            for (int64_t j = 0; j < pn; j++) {
                const int64_t p = p0 + j;
                __m256 dxp = _mm256_loadu_ps(dx + 8 * p);
#pragma GCC unroll 4
                for (int r = 0; r < nn; r++) {
                    _mm_prefetch((const char *)(g->w + (n + r * stride + 2) * (K / 2) + 32 * p), _MM_HINT_T0); /* two rows on in this stream */
                    __m256 d = _mm256_permutevar8x32_ps(ds[r], spread[j]);
                    __m256 f = _mm256_cvtepi32_ps(dot64(g->w + (n + r * stride) * (K / 2) + 32 * p, qx + 64 * p));
                    acc[r] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, dxp), acc[r]);
                }
            }
        }
        if (nb % 2) { /* the odd last block, in the low half */
#pragma GCC unroll 4
            for (int r = 0; r < nn; r++) {
                __m128 f = _mm_cvtepi32_ps(q4_dot32(g->w + (n + r * stride) * (K / 2) + 32 * np, qx + 64 * np));
                __m128 d = _mm_set1_ps(_cvtsh_ss(g->scale[(n + r * stride) * ng + nb - 1]));
                __m128 v = _mm_mul_ps(f, _mm_mul_ps(d, _mm_loadu_ps(dx + 8 * np)));
                acc[r] = _mm256_add_ps(acc[r], _mm256_insertf128_ps(_mm256_setzero_ps(), v, 0));
            }
        }
    } else {
        for (int64_t gi = 0; gi < ng; gi++) {
            __m256 part[4];
#pragma GCC unroll 4
            for (int r = 0; r < nn; r++) part[r] = _mm256_setzero_ps();
            for (int64_t p = gi * ppg; p < (gi + 1) * ppg; p++) {
                __m256 dxp = _mm256_loadu_ps(dx + 8 * p);
#pragma GCC unroll 4
                for (int r = 0; r < nn; r++) {
                    _mm_prefetch((const char *)(g->w + (n + r * stride + 2) * (K / 2) + 32 * p), _MM_HINT_T0);
                    part[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot64(g->w + (n + r * stride) * (K / 2) + 32 * p, qx + 64 * p)), dxp, part[r]);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < nn; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(g->scale[(n + r * stride) * ng + gi])), part[r], acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nn; r++) {
        const uint16_t *t = g->min ? g->min + (n + r * stride) * ng : g->scale + (n + r * stride) * ng;
        float y = q4_hsum8f(acc[r]) + q4_offset_sum(t, g->xsum + m * ng, ng, g->min ? 1.0f : -8.0f);
        g->y[m * g->ldy + n + r * stride] = g->bias ? y + g->bias[n + r * stride] : y;
    }
}


/* q4_rows: the rows are split into four contiguous quarters walked side by side (as
 * gemv_avx2.c does for f32): four long sequential streams, each in its own
 * pages, which the hardware prefetcher follows better than four adjacent rows. */
static inline __attribute__((always_inline)) void q4_rows(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                                                          q4_dot64_fn dot64) {
    const int64_t q = (n1 - n0) / 4;
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t n = n0; n < n0 + q; n++) q4_rows4(g, m, n, q, 4, dot64);
        for (int64_t n = n0 + 4 * q; n < n1; n++) q4_rows4(g, m, n, 0, 1, dot64);
    }
}
#endif
