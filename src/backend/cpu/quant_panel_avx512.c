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

#include "backend/cpu/quant_epilogue_avx512.h"

#define VNNI __attribute__((target("avx512vnni")))

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
    const q8_ep x = q8_ep_copy(g);
#pragma GCC unroll 4
    for (int j = 0; j < np; j++) {
        const col16 c = col_terms(&x, 16 * (p + j));
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) store16(&x, m + i, 16 * (p + j), &c, acc[i][j]);
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
