/* The int8 product on packed panels with AVX-512 VNNI (quant_kernels.h).
 *
 * Register block: up to 6 activation rows x 4 panels (64 columns) = 24 zmm
 * accumulators. Each step of 4 k loads the 4 panels' 64-byte slices once and
 * broadcasts each row's 4 activation bytes; vpdpbusd adds the 4 u8 x s8
 * products of every lane into its 32-bit sum, so a lane is one output and the
 * tile ends with no horizontal sums. 24 vpdpbusd per 10 loads keep the (one
 * per cycle on Zen 4) vpdpbusd unit the bound rather than the loads.
 *
 * The epilogue runs on whole vectors with the scalar one's arithmetic
 * (fm_q8_store): (a_scale * w_scale) * f32(acc - zero * w_sum), then + bias,
 * then max(., 0) for a fused ReLU; no FMA, so the floats equal the reference's.
 * Its column terms are computed once per panel of a tile (col_terms). */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"

#define VNNI __attribute__((target("avx512vnni")))

static inline __mmask16 lanes(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* A panel's column terms of the epilogue, the same for every row of a tile: computed once per
 * tile instead of once per row (at K = 128 the per-row form was about a fifth of the tile) */
typedef struct col16 {
    __mmask16 k;
    __m512i zs; /* a_zero * w_sum */
    __m512 s;   /* a_scale * w_scale */
    __m512 b;   /* bias (0 without) */
    __m512i ws; /* w_sum and w_scale, for per-row scales (ep->row_scale) */
    __m512 wsc;
} col16;

static inline col16 col_terms(const fm_q8_pgemm *g, int64_t n) {
    col16 c;
    c.k = lanes(g->N - n);
    const fm_q8_epilogue *e = g->ep;
    if (!e) return c;
    c.ws = _mm512_maskz_loadu_epi32(c.k, e->w_sum + n);
    c.wsc = _mm512_maskz_loadu_ps(c.k, e->w_scale + n);
    c.zs = _mm512_mullo_epi32(_mm512_set1_epi32(e->a_zero), c.ws);
    c.s = _mm512_mul_ps(_mm512_set1_ps(e->a_scale), c.wsc);
    c.b = e->bias ? _mm512_maskz_loadu_ps(c.k, e->bias + n) : _mm512_setzero_ps();
    return c;
}

/* 16 outputs of row m from column n (n0 + 16 * j), the lanes of c.k valid */
static inline void store16(const fm_q8_pgemm *g, int64_t m, int64_t n, const col16 *c, __m512i acc) {
    const fm_q8_epilogue *e = g->ep;
    if (!e) { _mm512_mask_storeu_epi32(g->C + m * g->ldc + n, c->k, acc); return; }
    __m512 y;
    if (e->row_scale) /* the same arithmetic with row m's scale and zero point */
        y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(e->row_scale[m]), c->wsc),
                          _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(e->row_zero[m]), c->ws))));
    else y = _mm512_mul_ps(c->s, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, c->zs)));
    if (e->bias) y = _mm512_add_ps(y, c->b);
    if (e->relu) y = _mm512_max_ps(y, _mm512_setzero_ps());
    _mm512_mask_storeu_ps(e->y + m * e->ldy + n, c->k, y);
}

VNNI static inline __attribute__((always_inline)) void micro(const fm_q8_pgemm *g, int64_t m, int64_t p, const int mr, const int np) {
    const int64_t Kq = (g->K + 3) / 4;
    __m512i acc[6][4]; /* every loop over i and j fully unrolled, or GCC keeps acc in memory */
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) acc[i][j] = _mm512_setzero_si512();
    const int8_t *b = g->P + p * Kq * 64;
    const uint8_t *a = g->A + m * g->lda;
    for (int64_t s = 0; s < Kq; s++) {
        __m512i bv[4];
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) bv[j] = _mm512_loadu_si512(b + (j * Kq + s) * 64);
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) {
            int32_t a4;
            memcpy(&a4, a + i * g->lda + 4 * s, 4);
            __m512i av = _mm512_set1_epi32(a4);
#pragma GCC unroll 4
            for (int j = 0; j < np; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, bv[j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < np; j++) {
        const col16 c = col_terms(g, 16 * (p + j));
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) store16(g, m + i, 16 * (p + j), &c, acc[i][j]);
    }
}

typedef void (*micro_fn)(const fm_q8_pgemm *g, int64_t m, int64_t p);
#define MICRO(MR, NP) \
    VNNI static void micro_##MR##_##NP(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, MR, NP); }
#define MICRO_ROW(MR) MICRO(MR, 1) MICRO(MR, 2) MICRO(MR, 3) MICRO(MR, 4)
MICRO_ROW(1) MICRO_ROW(2) MICRO_ROW(3) MICRO_ROW(4) MICRO_ROW(5) MICRO_ROW(6)
#define ROW(MR) {micro_##MR##_1, micro_##MR##_2, micro_##MR##_3, micro_##MR##_4}
static const micro_fn g_micro[6][4] = {ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6)};

void fm_q8_pgemm_tile_vnni(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p += 4) {
        int np = p1 - p < 4 ? (int)(p1 - p) : 4;
        for (int64_t m = m0; m < m1; m += 6) g_micro[(m1 - m < 6 ? m1 - m : 6) - 1][np - 1](g, m, p);
    }
}
