/* The direct conv tile (conv_direct_simd.h) with AVX-512: 16 columns per vector,
 * 8 output channels per tile (16 accumulators of the 32 registers). */
#include <immintrin.h>

#include "backend/cpu/conv_direct.h"

#define V __m512
#define VL FM_CONV_DIRECT_VL_AVX512
#define OB FM_CONV_DIRECT_OB_AVX512
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSET1(f) _mm512_set1_ps(f)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VISNAN_SEL(m, a) _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a)
#define VSTORE_N(p, v, n) _mm512_mask_storeu_ps(p, (__mmask16)((1u << (n)) - 1u), v)
#define FN(name) name##_avx512

static inline __m512 pairmax512(__m512 v) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
    __m512 a = _mm512_permutexvar_ps(ev, v), b = _mm512_permutexvar_ps(od, v);
    return VISNAN_SEL(_mm512_max_ps(a, b), a);
}
#define VPAIRMAX(v) pairmax512(v)

#include "backend/cpu/conv_direct_simd.h"
