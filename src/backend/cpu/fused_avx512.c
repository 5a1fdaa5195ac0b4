/* AVX-512 row kernels of the fused bias + GELU(tanh), forward and backward: the
 * 16-lane twins of fused_avx2.c's, operation for operation (fm_exp512 is
 * fm_exp256's twin), so every element is bitwise the AVX2 result
 * (tests/test_isa_kernels.c compares them). Entered from fused_cpu.c when
 * fm_cpu_use_avx512() is true. The GELU is the compute-bound part of the
 * kjv-gpt MLP's non-GEMM work (docs/PERFORMANCE.md), so half the instructions
 * per element pay here.
 *
 * Residual add + layer norm: the sum row is stored, then normalized by
 * norm_avx512.c's layer norm row kernel, so the statistics and outputs are
 * bitwise that kernel's over the stored sum, with or without the add (a
 * checkpointed forward recomputes the norm over the sum alone and must get the
 * same numbers, as in fused_avx2.c). The backward is that kernel's backward, then
 * the gradient that reached the sum added to the rounded result (as autograd's
 * separate accumulation would). A row of kjv-gpt (128 floats) is in L1 for each
 * pass; the AVX2 kernels fuse the add into the first pass instead. */
#include <stdint.h>

#include "backend/cpu/simd_avx512.h"

void fm_bias_gelu_row_f32_avx512(const float *x, const float *b, float *y, int64_t n);
void fm_bias_gelu_bwd_row_f32_avx512(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                     int64_t n);

void fm_add_ln_row_f32_avx512(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                              int64_t n, float eps, float *mean_out, float *rstd_out);
void fm_add_ln_bwd_row_f32_avx512(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                  float rstd, float *g, float *dw_acc, float *db_acc, int64_t n);
/* norm_avx512.c */
void fm_layernorm_row_f32_avx512(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                                 float *mean_out, float *rstd_out, int stream);
void fm_layernorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                     float *dx, float *dw_acc, float *db_acc, int64_t n, int stream);

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

void fm_add_ln_row_f32_avx512(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                              int64_t n, float eps, float *mean_out, float *rstd_out) {
    if (h) {
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(h + i)));
        if (i < n) {
            __mmask16 m = fm_tail16(n - i);
            _mm512_mask_storeu_ps(s + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, h + i)));
        }
    }
    fm_layernorm_row_f32_avx512(h ? s : x, w, b, y, n, eps, mean_out, rstd_out, 0);
}

/* g = dsum + layer norm backward(dy) over the stored sum s; dy == NULL: g = dsum (or 0) */
void fm_add_ln_bwd_row_f32_avx512(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                  float rstd, float *g, float *dw_acc, float *db_acc, int64_t n) {
    int64_t i = 0;
    if (!dy) {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(g + i, dsum ? _mm512_loadu_ps(dsum + i) : _mm512_setzero_ps());
        if (i < n) _mm512_mask_storeu_ps(g + i, fm_tail16(n - i), dsum ? _mm512_maskz_loadu_ps(fm_tail16(n - i), dsum + i)
                                                                        : _mm512_setzero_ps());
        return;
    }
    fm_layernorm_bwd_row_f32_avx512(dy, s, w, mean, rstd, g, dw_acc, db_acc, n, 0);
    if (!dsum) return;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(g + i, _mm512_add_ps(_mm512_loadu_ps(g + i), _mm512_loadu_ps(dsum + i)));
    if (i < n) {
        __mmask16 m = fm_tail16(n - i);
        _mm512_mask_storeu_ps(g + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, dsum + i)));
    }
}
