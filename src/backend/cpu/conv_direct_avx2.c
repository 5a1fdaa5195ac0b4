/* The direct conv tile (conv_direct_simd.h) with AVX2/FMA: 8 columns per vector,
 * 4 output channels per tile (8 accumulators: AVX2 has 16 registers). */
#include <immintrin.h>

#include "backend/cpu/conv_direct.h"

#define V __m256
#define VL FM_CONV_DIRECT_VL_AVX2
#define OB FM_CONV_DIRECT_OB_AVX2
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSET1(f) _mm256_set1_ps(f)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VISNAN_SEL(m, a) _mm256_blendv_ps(m, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q))
#define FN(name) name##_avx2

static inline void store_n(float *p, __m256 v, int64_t n) {
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(p, m, v);
}
#define VSTORE_N(p, v, n) store_n(p, v, n)

static inline __m256 pairmax256(__m256 v) {
    const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), od = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    __m256 a = _mm256_permutevar8x32_ps(v, ev), b = _mm256_permutevar8x32_ps(v, od);
    return VISNAN_SEL(_mm256_max_ps(a, b), a);
}
#define VPAIRMAX(v) pairmax256(v)

#include "backend/cpu/conv_direct_simd.h"
