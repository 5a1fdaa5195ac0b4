/* AVX-512 loops for the hot elementwise ops over contiguous float arrays: the
 * 16-lane versions of elementwise_avx2.c, op for op the same arithmetic, so
 * each element is bitwise what the AVX2 loop gives (tests/test_isa_kernels.c
 * checks it). Tails use mask registers: every element goes through the same
 * math whatever the chunking. Non-temporal stores need 64-byte alignment here,
 * so a stream request on an output that is only 32-byte aligned stores
 * normally. */
#include <math.h>

#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/simd_avx512.h"

static const float k_sqrt2_pi = 0.79788456080286536f, k_inv_sqrt_2pi = 0.3989422804014327f;

static inline __m512 dgelu_v(__m512 x) {
    __m512 gauss, cdf = fm_normcdf_gauss512(x, &gauss);
    return _mm512_fmadd_ps(_mm512_mul_ps(x, _mm512_set1_ps(k_inv_sqrt_2pi)), gauss, cdf);
}
static inline __m512 dgelu_tanh_v(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 x2 = _mm512_min_ps(_mm512_set1_ps(400.0f), _mm512_mul_ps(x, x));
    __m512 xk = _mm512_mul_ps(x, _mm512_set1_ps(2.0f * k_sqrt2_pi));
    __m512 two_u = _mm512_mul_ps(xk, _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x2, one));
    __m512 e = fm_exp512(_mm512_xor_ps(two_u, _mm512_set1_ps(-0.0f)));
    __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    __m512 q = _mm512_min_ps(_mm512_mul_ps(e, s), one);
    __m512 du = _mm512_mul_ps(xk, _mm512_fmadd_ps(_mm512_set1_ps(3 * 0.044715f), x2, one));
    return _mm512_mul_ps(s, _mm512_fmadd_ps(q, du, one));
}
static inline __m512 dsilu_v(__m512 x) {
    __m512 s = fm_sigmoid512(x);
    return _mm512_mul_ps(s, _mm512_fmadd_ps(x, _mm512_sub_ps(_mm512_set1_ps(1.0f), s), _mm512_set1_ps(1.0f)));
}
/* NaN in either operand gives NaN: all bits set, as elementwise_avx2.c's or() with the compare mask */
static inline __m512 max_nan(__m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), _mm512_max_ps(a, b),
                                _mm512_castsi512_ps(_mm512_set1_epi32(-1)));
}
static inline __m512 min_nan(__m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), _mm512_min_ps(a, b),
                                _mm512_castsi512_ps(_mm512_set1_epi32(-1)));
}
/* v <= 0 ? v * k : v (NaN is not <= 0 and stays) */
static inline __m512 below0(__m512 v, __m512 k) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LE_OQ), v, _mm512_mul_ps(v, k));
}

#define UNARY_LOOP(EXPR)                                                      \
    do {                                                                      \
        int64_t i = 0;                                                        \
        for (; i + 16 <= n; i += 16) {                                        \
            __m512 v = _mm512_loadu_ps(x + i);                                \
            fm_store16(y + i, (EXPR), stream);                                \
        }                                                                     \
        if (i < n) {                                                          \
            __mmask16 m_ = fm_tail16(n - i);                                  \
            __m512 v = _mm512_maskz_loadu_ps(m_, x + i);                      \
            _mm512_mask_storeu_ps(y + i, m_, (EXPR));                         \
        }                                                                     \
    } while (0)

bool fm_ew_unary_f32_avx512(fm_op_id op, const fm_unary_attrs *at, const float *x, float *y, int64_t n, bool stream) {
    const __m512 zero = _mm512_setzero_ps(), sign = _mm512_set1_ps(-0.0f);
    const __m512 slope = _mm512_set1_ps((float)at->a), lo = _mm512_set1_ps((float)at->a), hi = _mm512_set1_ps((float)at->b);
    stream = stream && ((uintptr_t)y & 63) == 0;
    switch (op) {
    case FM_OP_NEG: UNARY_LOOP(_mm512_xor_ps(v, sign)); break;
    case FM_OP_ABS: UNARY_LOOP(_mm512_andnot_ps(sign, v)); break;
    case FM_OP_EXP: UNARY_LOOP(fm_exp512(v)); break;
    case FM_OP_SQRT: UNARY_LOOP(_mm512_sqrt_ps(v)); break;
    case FM_OP_RSQRT: UNARY_LOOP(_mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(v))); break;
    case FM_OP_TANH: UNARY_LOOP(fm_tanh512(v)); break;
    case FM_OP_SIGMOID: UNARY_LOOP(fm_sigmoid512(v)); break;
    /* NaN stays (ordered compare false), -inf gives 0 (not 0 * -inf) */
    case FM_OP_RELU: UNARY_LOOP(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, zero, _CMP_LE_OQ), v, zero)); break;
    case FM_OP_LEAKY_RELU: UNARY_LOOP(below0(v, slope)); break;
    case FM_OP_GELU: UNARY_LOOP(fm_gelu512(v)); break;
    case FM_OP_GELU_TANH: UNARY_LOOP(fm_gelu_tanh512(v)); break;
    case FM_OP_SILU: UNARY_LOOP(_mm512_mul_ps(v, fm_sigmoid512(v))); break;
    case FM_OP_CLAMP:
        UNARY_LOOP(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                        _mm512_min_ps(_mm512_max_ps(v, lo), hi), v));
        break;
    case FM_OP_COPY: UNARY_LOOP(v); break;
    default: return false;
    }
    if (stream) _mm_sfence();
    return true;
}

#define BWD_LOOP(USE_X, USE_Y, DERIV)                                                              \
    do {                                                                                           \
        int64_t i = 0;                                                                             \
        for (; i + 16 <= n; i += 16) {                                                             \
            __m512 v = USE_X ? _mm512_loadu_ps(x + i) : zero;                                      \
            __m512 t = USE_Y ? _mm512_loadu_ps(y + i) : zero;                                      \
            (void)v; (void)t;                                                                      \
            fm_store16(dx + i, _mm512_mul_ps(_mm512_loadu_ps(dy + i), (DERIV)), stream);           \
        }                                                                                          \
        if (i < n) {                                                                               \
            __mmask16 m_ = fm_tail16(n - i);                                                       \
            __m512 v = USE_X ? _mm512_maskz_loadu_ps(m_, x + i) : zero;                            \
            __m512 t = USE_Y ? _mm512_maskz_loadu_ps(m_, y + i) : zero;                            \
            (void)v; (void)t;                                                                      \
            _mm512_mask_storeu_ps(dx + i, m_, _mm512_mul_ps(_mm512_maskz_loadu_ps(m_, dy + i), (DERIV))); \
        }                                                                                          \
    } while (0)

bool fm_ew_unary_bwd_f32_avx512(fm_op_id fwd, const fm_unary_attrs *at, const float *dy, const float *x,
                                const float *y, float *dx, int64_t n, bool stream) {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    const __m512 slope = _mm512_set1_ps((float)at->a);
    stream = stream && ((uintptr_t)dx & 63) == 0;
    switch (fwd) {
    case FM_OP_SIGMOID: case FM_OP_TANH: case FM_OP_EXP: if (!y) return false; break;
    case FM_OP_RELU: case FM_OP_LEAKY_RELU: case FM_OP_GELU: case FM_OP_GELU_TANH: case FM_OP_SILU:
        if (!x) return false;
        break;
    default: break;
    }
    switch (fwd) {
    case FM_OP_RELU: BWD_LOOP(1, 0, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ), one)); break;
    case FM_OP_LEAKY_RELU:
        BWD_LOOP(1, 0, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ), slope, one));
        break;
    case FM_OP_GELU: BWD_LOOP(1, 0, dgelu_v(v)); break;
    case FM_OP_GELU_TANH: BWD_LOOP(1, 0, dgelu_tanh_v(v)); break;
    case FM_OP_SILU: BWD_LOOP(1, 0, dsilu_v(v)); break;
    case FM_OP_SIGMOID: BWD_LOOP(0, 1, _mm512_mul_ps(t, _mm512_sub_ps(one, t))); break;
    case FM_OP_TANH: BWD_LOOP(0, 1, _mm512_fnmadd_ps(t, t, one)); break;
    case FM_OP_EXP: BWD_LOOP(0, 1, t); break;
    case FM_OP_NEG: BWD_LOOP(0, 0, _mm512_set1_ps(-1.0f)); break;
    default: return false;
    }
    if (stream) _mm_sfence();
    return true;
}

#define BINARY_LOOP(EXPR)                                                                    \
    do {                                                                                     \
        int64_t i = 0;                                                                       \
        for (; i + 16 <= n; i += 16) {                                                       \
            __m512 va = _mm512_loadu_ps(a + i), vb = _mm512_loadu_ps(b + i);                 \
            fm_store16(y + i, (EXPR), stream);                                               \
        }                                                                                    \
        if (i < n) {                                                                         \
            __mmask16 m_ = fm_tail16(n - i);                                                 \
            __m512 va = _mm512_maskz_loadu_ps(m_, a + i), vb = _mm512_maskz_loadu_ps(m_, b + i); \
            _mm512_mask_storeu_ps(y + i, m_, (EXPR));                                        \
        }                                                                                    \
    } while (0)

bool fm_ew_binary_f32_avx512(fm_op_id op, const float *a, const float *b, float *y, int64_t n, bool stream) {
    stream = stream && ((uintptr_t)y & 63) == 0;
    switch (op) {
    case FM_OP_ADD: BINARY_LOOP(_mm512_add_ps(va, vb)); break;
    case FM_OP_SUB: BINARY_LOOP(_mm512_sub_ps(va, vb)); break;
    case FM_OP_MUL: BINARY_LOOP(_mm512_mul_ps(va, vb)); break;
    case FM_OP_DIV: BINARY_LOOP(_mm512_div_ps(va, vb)); break;
    case FM_OP_MAXIMUM: BINARY_LOOP(max_nan(va, vb)); break;
    case FM_OP_MINIMUM: BINARY_LOOP(min_nan(va, vb)); break;
    default: return false;
    }
    if (stream) _mm_sfence();
    return true;
}

bool fm_ew_where_f32_avx512(const float *c, const float *a, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(c + i), _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_storeu_ps(y + i, _mm512_mask_blend_ps(m, _mm512_loadu_ps(b + i), _mm512_loadu_ps(a + i)));
    }
    if (i < n) {
        __mmask16 t = fm_tail16(n - i);
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(t, c + i), _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_mask_storeu_ps(y + i, t, _mm512_mask_blend_ps(m, _mm512_maskz_loadu_ps(t, b + i), _mm512_maskz_loadu_ps(t, a + i)));
    }
    return true;
}
