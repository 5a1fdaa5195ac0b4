/* AVX-512 row kernels of the fused bias + GELU(tanh), forward and backward: the
 * 16-lane twins of fused_avx2.c's, operation for operation (fm_exp512 is
 * fm_exp256's twin), so every element is bitwise the AVX2 result
 * (tests/test_isa_kernels.c compares them). Entered from fused_cpu.c when
 * fm_cpu_use_avx512() is true. The GELU is the compute-bound part of the
 * kjv-gpt MLP's non-GEMM work (docs/PERFORMANCE.md), so half the instructions
 * per element pay here.
 *
 * The residual add + layer norm row: the sum x + h stored as it is summed, in the
 * order of norm_avx512.c's row reduction (fm_row_reduce512), then that row's
 * variance and outputs, so it is bitwise the AVX-512 add followed by the AVX-512
 * layer norm (16-lane sums: not the AVX2 row's bits). On the Intel Xeon with AMX it
 * had stayed AVX2 and was 5% of the int8 prefill's samples.
 *
 * Its backward is norm_avx512.c's layer norm backward row with the gradient that
 * reached the sum added to each rounded output: bitwise the AVX-512 layer norm
 * backward followed by autograd's separate accumulation (test_isa_kernels). It had
 * stayed AVX2 too (1.6% of a kjv-gpt training profile). */
#include <math.h>
#include <stdint.h>

#include "backend/cpu/simd_avx512.h"

void fm_bias_gelu_row_f32_avx512(const float *x, const float *b, float *y, int64_t n);
void fm_add_ln_row_f32_avx512(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                              int64_t n, float eps, float *mean_out, float *rstd_out);
void fm_bias_gelu_bwd_row_f32_avx512(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                     int64_t n);
void fm_add_ln_bwd_row_f32_avx512(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                  float rstd, float *g, float *dw_acc, float *db_acc, int64_t n);
/* norm_avx512.c */
void fm_layernorm_bwd_add_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                         float *dx, float *dw_acc, float *db_acc, int64_t n, const float *dsum);

static const float k_2sqrt2_pi = 1.5957691216057308f; /* 2 sqrt(2/pi) */
static const float k_cubic = 0.044715f;

/* the forward GELU is simd_avx512.h's fm_gelu_tanh512, the elementwise op's */
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
        _mm512_storeu_ps(y + i, fm_gelu_tanh512(_mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(b + i))));
    if (i < n) {
        __mmask16 m = fm_tail16(n - i);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, b + i));
        _mm512_mask_storeu_ps(y + i, m, fm_gelu_tanh512(v));
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

/* sum of x + h over the row, each sum stored to s; fm_row_reduce512's order */
static float add_sum_row(const float *x, const float *h, float *s, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define SUM_AT(a, k)                                                          \
    do {                                                                      \
        __m512 v_ = _mm512_add_ps(_mm512_loadu_ps(x + (k)), _mm512_loadu_ps(h + (k))); \
        _mm512_storeu_ps(s + (k), v_);                                        \
        a = _mm512_add_ps(a, v_);                                             \
    } while (0)
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        SUM_AT(a0, i);
        SUM_AT(a1, i + 16);
        SUM_AT(a2, i + 32);
        SUM_AT(a3, i + 48);
    }
    for (; i + 16 <= n; i += 16) SUM_AT(a0, i);
#undef SUM_AT
    if (i < n) {
        __mmask16 m = fm_tail16(n - i);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, h + i));
        _mm512_mask_storeu_ps(s + i, m, v);
        a1 = _mm512_add_ps(a1, v);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* h NULL: the sum is x itself (s unused) */
void fm_add_ln_row_f32_avx512(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                              int64_t n, float eps, float *mean_out, float *rstd_out) {
    const float *src = h ? s : x;
    float mean = (h ? add_sum_row(x, h, s, n) : fm_row_reduce512(x, n, 0, 0)) / (float)n;
    float rstd = 1.0f / sqrtf(fm_row_reduce512(src, n, mean, 1) / (float)n + eps);
    *mean_out = mean;
    *rstd_out = rstd;
    const __m512 vr = _mm512_set1_ps(rstd), vo = _mm512_set1_ps(-mean * rstd);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 t = n - i >= 16 ? (__mmask16)0xffff : fm_tail16(n - i);
        __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(t, src + i), vr, vo);
        if (w && b) v = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(t, w + i), _mm512_maskz_loadu_ps(t, b + i));
        else if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(t, w + i));
        else if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(t, b + i));
        _mm512_mask_storeu_ps(y + i, t, v);
    }
}

/* g = dsum + the layer norm's input gradient (dy NULL: g = dsum, or 0 without it);
 * the weight and bias gradients accumulate into dw_acc / db_acc where given */
void fm_add_ln_bwd_row_f32_avx512(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                  float rstd, float *g, float *dw_acc, float *db_acc, int64_t n) {
    if (dy) {
        fm_layernorm_bwd_add_row_f32_avx512(dy, s, w, mean, rstd, g, dw_acc, db_acc, n, dsum);
        return;
    }
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 t = n - i >= 16 ? (__mmask16)0xffff : fm_tail16(n - i);
        _mm512_mask_storeu_ps(g + i, t, dsum ? _mm512_maskz_loadu_ps(t, dsum + i) : _mm512_setzero_ps());
    }
}
