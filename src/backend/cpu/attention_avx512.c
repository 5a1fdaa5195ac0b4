/* Flash-style scaled-dot-product attention for f32 with AVX-512 (compiled with
 * the *_avx512.c flags; entered only when fm_cpu_use_avx512() says the CPU and
 * FATHOM_ISA allow it): the loops are attention_simd.h at 16 floats a vector,
 * so a 6 x 32 register tile per micro-kernel step (12 of the 32 zmm registers). */
#include <immintrin.h>

/* 2^x for x <= 0 (the only range softmax needs); x < -126 (and -inf) gives 0.
 * The AVX2 file's polynomial and steps, lane for lane (same results). */
static inline __m512 exp2_neg(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-126.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5353362e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6180709e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503393e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022652e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 r = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~under, r);
}

#define VEC __m512
#define VW 16
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_STOREU(p, v) _mm512_storeu_ps(p, v)
#define V_FMADD(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_BCAST(p) _mm512_set1_ps(*(p))
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_EXP2_NEG(x) exp2_neg(x)
#define SDPA_FORWARD fm_sdpa_f32_avx512_forward
#define SDPA_BACKWARD fm_sdpa_f32_avx512_backward
#include "backend/cpu/attention_simd.h"
