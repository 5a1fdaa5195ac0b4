/* AVX2/FMA loops for the hot elementwise ops over contiguous float arrays.
 * Each op gets a loop of its own (the LOOP macros below), so the op is chosen
 * once per call rather than once per vector, and the compiler keeps that op's
 * constants in registers. The tail (n % 8) uses masked loads/stores, so every
 * element goes through the same math, which keeps results independent of how
 * the array was chunked. */
#include <math.h>

#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/simd_avx2.h"

static inline __m256i tail_mask(int64_t r) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Non-temporal stores for outputs too big to stay in cache (the caller decides,
 * and passes 32-byte aligned arrays): they skip the read-for-ownership of each
 * output line, a quarter of the traffic of a two-input op. */

static const float k_sqrt2_pi = 0.79788456080286536f, k_inv_sqrt_2pi = 0.3989422804014327f;

/* Phi(x) + x phi(x), both from the one exp inside the CDF */
static inline __m256 dgelu_v(__m256 x) {
    __m256 gauss, cdf = fm_normcdf_gauss256(x, &gauss);
    return _mm256_fmadd_ps(_mm256_mul_ps(x, _mm256_set1_ps(k_inv_sqrt_2pi)), gauss, cdf);
}
/* tanh GELU: forward fm_gelu_tanh256 (simd_avx2.h); its derivative */
static inline __m256 dgelu_tanh_v(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    /* x^2 capped at 400 (|x| = 20, where s is already 0 or 1): past it x^2 = inf would
     * make the u' term inf * 0; written min(400, x^2) so NaN still passes */
    __m256 x2 = _mm256_min_ps(_mm256_set1_ps(400.0f), _mm256_mul_ps(x, x));
    __m256 xk = _mm256_mul_ps(x, _mm256_set1_ps(2.0f * k_sqrt2_pi));
    __m256 two_u = _mm256_mul_ps(xk, _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x2, one));
    __m256 e = fm_exp256(_mm256_xor_ps(two_u, _mm256_set1_ps(-0.0f)));
    __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    __m256 q = _mm256_min_ps(_mm256_mul_ps(e, s), one); /* e = inf: inf * 0 is NaN, and min() gives 1 */
    __m256 du = _mm256_mul_ps(xk, _mm256_fmadd_ps(_mm256_set1_ps(3 * 0.044715f), x2, one));
    return _mm256_mul_ps(s, _mm256_fmadd_ps(q, du, one));
}
static inline __m256 dsilu_v(__m256 x) {
    __m256 s = fm_sigmoid256(x);
    return _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(_mm256_set1_ps(1.0f), s), _mm256_set1_ps(1.0f)));
}
/* NaN in either operand gives NaN (max/min alone return the second operand) */
static inline __m256 max_nan(__m256 a, __m256 b) { return _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q)); }
static inline __m256 min_nan(__m256 a, __m256 b) { return _mm256_or_ps(_mm256_min_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q)); }

/* y = EXPR(v), v = x[i..i+8) */
#define UNARY_LOOP(EXPR)                                                              \
    do {                                                                              \
        int64_t i = 0;                                                                \
        for (; i + 8 <= n; i += 8) {                                                  \
            __m256 v = _mm256_loadu_ps(x + i);                                        \
            fm_store8(y + i, (EXPR), stream);                                            \
        }                                                                             \
        if (i < n) {                                                                  \
            __m256i m_ = tail_mask(n - i);                                            \
            __m256 v = _mm256_maskload_ps(x + i, m_);                                 \
            _mm256_maskstore_ps(y + i, m_, (EXPR));                                   \
        }                                                                             \
    } while (0)

bool fm_ew_unary_f32_avx2(fm_op_id op, const fm_unary_attrs *at, const float *x, float *y, int64_t n, bool stream) {
    const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    const __m256 slope = _mm256_set1_ps((float)at->a), lo = _mm256_set1_ps((float)at->a), hi = _mm256_set1_ps((float)at->b);
    switch (op) {
    case FM_OP_NEG: UNARY_LOOP(_mm256_xor_ps(v, sign)); break;
    case FM_OP_ABS: UNARY_LOOP(_mm256_andnot_ps(sign, v)); break;
    case FM_OP_EXP: UNARY_LOOP(fm_exp256(v)); break;
    case FM_OP_SQRT: UNARY_LOOP(_mm256_sqrt_ps(v)); break;
    case FM_OP_RSQRT: UNARY_LOOP(_mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(v))); break;
    case FM_OP_TANH: UNARY_LOOP(fm_tanh256(v)); break;
    case FM_OP_SIGMOID: UNARY_LOOP(fm_sigmoid256(v)); break;
    /* relu keeps NaN (an ordered compare is false for it, so v stays) and gives 0,
     * not 0 * x, for -inf: max(x, 0) would return 0 for NaN in that operand order */
    case FM_OP_RELU: UNARY_LOOP(_mm256_blendv_ps(v, zero, _mm256_cmp_ps(v, zero, _CMP_LE_OQ))); break;
    case FM_OP_LEAKY_RELU:
        UNARY_LOOP(_mm256_blendv_ps(v, _mm256_mul_ps(v, slope), _mm256_cmp_ps(v, zero, _CMP_LE_OQ)));
        break;
    case FM_OP_GELU: UNARY_LOOP(fm_gelu256(v)); break;
    case FM_OP_GELU_TANH: UNARY_LOOP(fm_gelu_tanh256(v)); break;
    case FM_OP_SILU: UNARY_LOOP(_mm256_mul_ps(v, fm_sigmoid256(v))); break;
    case FM_OP_CLAMP:
        UNARY_LOOP(_mm256_blendv_ps(_mm256_min_ps(_mm256_max_ps(v, lo), hi), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        break;
    case FM_OP_COPY: UNARY_LOOP(v); break;
    default: return false;
    }
    if (stream) _mm_sfence();
    return true;
}

/* dx = dy * DERIV, DERIV in terms of v = x[i..] and t = y[i..] (each loaded only if used) */
#define BWD_LOOP(USE_X, USE_Y, DERIV)                                                 \
    do {                                                                              \
        int64_t i = 0;                                                                \
        for (; i + 8 <= n; i += 8) {                                                  \
            __m256 v = USE_X ? _mm256_loadu_ps(x + i) : zero;                         \
            __m256 t = USE_Y ? _mm256_loadu_ps(y + i) : zero;                         \
            (void)v; (void)t;                                                         \
            fm_store8(dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), (DERIV)), stream);   \
        }                                                                             \
        if (i < n) {                                                                  \
            __m256i m_ = tail_mask(n - i);                                            \
            __m256 v = USE_X ? _mm256_maskload_ps(x + i, m_) : zero;                  \
            __m256 t = USE_Y ? _mm256_maskload_ps(y + i, m_) : zero;                  \
            (void)v; (void)t;                                                         \
            _mm256_maskstore_ps(dx + i, m_, _mm256_mul_ps(_mm256_maskload_ps(dy + i, m_), (DERIV))); \
        }                                                                             \
    } while (0)

bool fm_ew_unary_bwd_f32_avx2(fm_op_id fwd, const fm_unary_attrs *at, const float *dy, const float *x,
                              const float *y, float *dx, int64_t n, bool stream) {
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    const __m256 slope = _mm256_set1_ps((float)at->a);
    switch (fwd) {
    case FM_OP_SIGMOID: case FM_OP_TANH: case FM_OP_EXP: if (!y) return false; break;
    case FM_OP_RELU: case FM_OP_LEAKY_RELU: case FM_OP_GELU: case FM_OP_GELU_TANH: case FM_OP_SILU:
        if (!x) return false;
        break;
    default: break;
    }
    switch (fwd) {
    case FM_OP_RELU: BWD_LOOP(1, 0, _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_GT_OQ), one)); break;
    case FM_OP_LEAKY_RELU: BWD_LOOP(1, 0, _mm256_blendv_ps(slope, one, _mm256_cmp_ps(v, zero, _CMP_GT_OQ))); break;
    case FM_OP_GELU: BWD_LOOP(1, 0, dgelu_v(v)); break;
    case FM_OP_GELU_TANH: BWD_LOOP(1, 0, dgelu_tanh_v(v)); break;
    case FM_OP_SILU: BWD_LOOP(1, 0, dsilu_v(v)); break;
    case FM_OP_SIGMOID: BWD_LOOP(0, 1, _mm256_mul_ps(t, _mm256_sub_ps(one, t))); break;
    case FM_OP_TANH: BWD_LOOP(0, 1, _mm256_fnmadd_ps(t, t, one)); break;
    case FM_OP_EXP: BWD_LOOP(0, 1, t); break;
    case FM_OP_NEG: BWD_LOOP(0, 0, _mm256_set1_ps(-1.0f)); break;
    default: return false;
    }
    if (stream) _mm_sfence();
    return true;
}

/* y = EXPR(va, vb) */
#define BINARY_LOOP(EXPR)                                                             \
    do {                                                                              \
        int64_t i = 0;                                                                \
        for (; i + 8 <= n; i += 8) {                                                  \
            __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);          \
            fm_store8(y + i, (EXPR), stream);                                            \
        }                                                                             \
        if (i < n) {                                                                  \
            __m256i m_ = tail_mask(n - i);                                            \
            __m256 va = _mm256_maskload_ps(a + i, m_), vb = _mm256_maskload_ps(b + i, m_); \
            _mm256_maskstore_ps(y + i, m_, (EXPR));                                   \
        }                                                                             \
    } while (0)

bool fm_ew_binary_f32_avx2(fm_op_id op, const float *a, const float *b, float *y, int64_t n, bool stream) {
    switch (op) {
    case FM_OP_ADD: BINARY_LOOP(_mm256_add_ps(va, vb)); break;
    case FM_OP_SUB: BINARY_LOOP(_mm256_sub_ps(va, vb)); break;
    case FM_OP_MUL: BINARY_LOOP(_mm256_mul_ps(va, vb)); break;
    case FM_OP_DIV: BINARY_LOOP(_mm256_div_ps(va, vb)); break;
    case FM_OP_MAXIMUM: BINARY_LOOP(max_nan(va, vb)); break;
    case FM_OP_MINIMUM: BINARY_LOOP(min_nan(va, vb)); break;
    default: return false;
    }
    if (stream) _mm_sfence();
    return true;
}

bool fm_ew_where_f32_avx2(const float *c, const float *a, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 m = _mm256_cmp_ps(_mm256_loadu_ps(c + i), _mm256_setzero_ps(), _CMP_NEQ_UQ);
        _mm256_storeu_ps(y + i, _mm256_blendv_ps(_mm256_loadu_ps(b + i), _mm256_loadu_ps(a + i), m));
    }
    if (i < n) {
        __m256i m_ = tail_mask(n - i);
        __m256 m = _mm256_cmp_ps(_mm256_maskload_ps(c + i, m_), _mm256_setzero_ps(), _CMP_NEQ_UQ);
        _mm256_maskstore_ps(y + i, m_, _mm256_blendv_ps(_mm256_maskload_ps(b + i, m_), _mm256_maskload_ps(a + i, m_), m));
    }
    return true;
}
