/* The int8 product on packed panels with AVX2 (quant_kernels.h): a panel's
 * 64-byte slice is two ymm halves of 8 columns x 4 k. vpmaddubsw would
 * saturate on full u8 x s8 pairs, so each broadcast activation group is split
 * into its low 7 bits and its top bit (the header's bounds): the low products
 * are widened by vpmaddwd with 1, the top-bit ones with 128, and both land in
 * the same 32-bit lane, one output each. Register block: 4 rows x 1 panel (8
 * accumulators). The epilogue goes through fm_q8_store, so its floats are the
 * reference's. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"

static inline __attribute__((always_inline)) void micro(const fm_q8_pgemm *g, int64_t m, int64_t p, const int mr) {
    const int64_t Kq = (g->K + 3) / 4;
    const __m256i ones = _mm256_set1_epi16(1), c128 = _mm256_set1_epi16(128);
    __m256i acc[4][2]; /* the loops over i fully unrolled, or GCC keeps acc in memory */
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    const int8_t *b = g->P + p * Kq * 64;
    const uint8_t *a = g->A + m * g->lda;
    for (int64_t s = 0; s < Kq; s++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + s * 64)), b1 = _mm256_loadu_si256((const __m256i *)(b + s * 64 + 32));
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            uint32_t a4;
            memcpy(&a4, a + i * g->lda + 4 * s, 4);
            __m256i lo = _mm256_set1_epi32((int32_t)(a4 & 0x7F7F7F7Fu)), hi = _mm256_set1_epi32((int32_t)((a4 >> 7) & 0x01010101u));
            acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, b0), ones),
                                                                     _mm256_madd_epi16(_mm256_maddubs_epi16(hi, b0), c128)));
            acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, b1), ones),
                                                                     _mm256_madd_epi16(_mm256_maddubs_epi16(hi, b1), c128)));
        }
    }
    const int64_t n0 = 16 * p, left = g->N - n0 < 16 ? g->N - n0 : 16;
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        int32_t s[16];
        _mm256_storeu_si256((__m256i *)s, acc[i][0]);
        _mm256_storeu_si256((__m256i *)(s + 8), acc[i][1]);
        if (!g->ep) {
            memcpy(g->C + (m + i) * g->ldc + n0, s, sizeof(int32_t) * (size_t)left);
            continue;
        }
        fm_q8_gemm q = {g->M, g->N, g->K, NULL, 0, NULL, 0, NULL, 0, g->ep};
        for (int64_t j = 0; j < left; j++) fm_q8_store(&q, m + i, n0 + j, s[j]);
    }
}

static void micro1(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 1); }
static void micro2(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 2); }
static void micro3(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 3); }
static void micro4(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 4); }

void fm_q8_pgemm_tile_avx2(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    void (*const fn[4])(const fm_q8_pgemm *, int64_t, int64_t) = {micro1, micro2, micro3, micro4};
    for (int64_t p = p0; p < p1; p++)
        for (int64_t m = m0; m < m1; m += 4) fn[(m1 - m < 4 ? m1 - m : 4) - 1](g, m, p);
}
