/* AVX-512 row kernels of the fused bias + GELU(tanh), forward and backward: the
 * 16-lane twins of fused_avx2.c's, operation for operation (fm_exp512 is
 * fm_exp256's twin), so every element is bitwise the AVX2 result
 * (tests/test_isa_kernels.c compares them). Entered from fused_cpu.c when
 * fm_cpu_use_avx512() is true. The GELU is the compute-bound part of the
 * kjv-gpt MLP's non-GEMM work (docs/PERFORMANCE.md), so half the instructions
 * per element pay here; add + layer norm stays AVX2 (memory-bound). */
#include <stdint.h>

#include "backend/cpu/simd_avx512.h"

void fm_bias_gelu_row_f32_avx512(const float *x, const float *b, float *y, int64_t n);
void fm_bias_gelu_bwd_row_f32_avx512(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                     int64_t n);

static const float k_2sqrt2_pi = 1.5957691216057308f; /* 2 sqrt(2/pi) */
static const float k_cubic = 0.044715f;

/* gelu_tanh(v) = v / (1 + e^{-2u}), u = sqrt(2/pi) (v + 0.044715 v^3) */
static inline __m512 gelu16(__m512 v) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 two_u = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(k_2sqrt2_pi)),
                                 _mm512_fmadd_ps(_mm512_set1_ps(k_cubic), _mm512_mul_ps(v, v), one));
    __m512 e = fm_exp512(_mm512_sub_ps(_mm512_setzero_ps(), two_u));
    return _mm512_div_ps(v, _mm512_add_ps(one, e));
}

/* d/dv = s (1 + q 2u'), s = 1/(1+e), q = min(e s, 1) */
static inline __m512 dgelu16(__m512 v) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 v2 = _mm512_mul_ps(v, v), kv = _mm512_mul_ps(v, _mm512_set1_ps(k_2sqrt2_pi));
    __m512 two_u = _mm512_mul_ps(kv, _mm512_fmadd_ps(_mm512_set1_ps(k_cubic), v2, one));
    __m512 e = fm_exp512(_mm512_sub_ps(_mm512_setzero_ps(), two_u));
    __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    __m512 q = _mm512_min_ps(_mm512_mul_ps(e, s), one);
    __m512 du = _mm512_mul_ps(kv, _mm512_fmadd_ps(_mm512_set1_ps(3.0f * k_cubic), v2, one));
    return _mm512_mul_ps(s, _mm512_fmadd_ps(q, du, one));
}

void fm_bias_gelu_row_f32_avx512(const float *x, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, gelu16(_mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(b + i))));
    if (i < n) {
        __mmask16 m = fm_tail16(n - i);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, b + i));
        _mm512_mask_storeu_ps(y + i, m, gelu16(v));
    }
}

void fm_bias_gelu_bwd_row_f32_avx512(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                     int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(b + i));
        __m512 d = _mm512_mul_ps(_mm512_loadu_ps(dy + i), dgelu16(v));
        _mm512_storeu_ps(dx + i, d);
        if (db_acc) _mm512_storeu_ps(db_acc + i, _mm512_add_ps(_mm512_loadu_ps(db_acc + i), d));
    }
    if (i < n) {
        __mmask16 m = fm_tail16(n - i);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, b + i));
        __m512 d = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dy + i), dgelu16(v));
        _mm512_mask_storeu_ps(dx + i, m, d);
        if (db_acc) _mm512_mask_storeu_ps(db_acc + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, db_acc + i), d));
    }
}
