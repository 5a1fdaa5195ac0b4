/* Flash-style scaled-dot-product attention for f32 with AVX2/FMA (compiled with
 * -mavx2 -mfma; entered only when fm_cpu_use_avx2() says the CPU has them): the
 * loops are attention_simd.h at 8 floats a vector. */
#include <immintrin.h>

/* 2^x for x <= 0 (the only range softmax needs); x < -126 (and -inf) gives 0.
 * Degree-6 polynomial on [-0.5, 0.5]: relative error about 2e-7. */
static inline __m256 exp2_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-126.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5353362e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3398874e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6180709e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503393e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022652e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, r);
}

#define VEC __m256
#define VW 8
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_STOREU(p, v) _mm256_storeu_ps(p, v)
#define V_FMADD(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_BCAST(p) _mm256_broadcast_ss(p)
#define V_SET1(x) _mm256_set1_ps(x)
#define V_ZERO() _mm256_setzero_ps()
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_EXP2_NEG(x) exp2_neg(x)
#define SDPA_FORWARD fm_sdpa_f32_avx2_forward
#define SDPA_BACKWARD fm_sdpa_f32_avx2_backward
#include "backend/cpu/attention_simd.h"
