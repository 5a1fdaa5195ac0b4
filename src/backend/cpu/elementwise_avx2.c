/* AVX2/FMA loops for the hot elementwise ops over contiguous float arrays.
 * Tails (n % 8) use masked loads/stores so every element goes through the same
 * math, which keeps results independent of how the array was chunked. */
#include <math.h>

#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/simd_avx2.h"

static inline __m256i tail_mask(int64_t r) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256 loadm(const float *p, int64_t r) { return r >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(r)); }
static inline void storem(float *p, __m256 v, int64_t r) {
    if (r >= 8) _mm256_storeu_ps(p, v); else _mm256_maskstore_ps(p, tail_mask(r), v);
}

static const float k_sqrt2_pi = 0.79788456080286536f, k_inv_sqrt_2pi = 0.3989422804014327f;

static inline __m256 gelu_v(__m256 x) { return _mm256_mul_ps(x, fm_normcdf256(x)); }
/* 0.5 x (1 + tanh u) = x sigmoid(2u): no cancellation in the left tail */
static inline __m256 gelu_tanh_v(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(2.0f * k_sqrt2_pi), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
    return _mm256_mul_ps(x, fm_sigmoid256(u));
}

bool fm_ew_unary_f32_avx2(fm_op_id op, const fm_unary_attrs *at, const float *x, float *y, int64_t n) {
    const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    switch (op) {
    case FM_OP_NEG: case FM_OP_ABS: case FM_OP_EXP: case FM_OP_SQRT: case FM_OP_RSQRT: case FM_OP_TANH:
    case FM_OP_SIGMOID: case FM_OP_RELU: case FM_OP_LEAKY_RELU: case FM_OP_GELU: case FM_OP_GELU_TANH:
    case FM_OP_SILU: case FM_OP_CLAMP: case FM_OP_COPY: break;
    default: return false;
    }
    const __m256 slope = _mm256_set1_ps((float)at->a), lo = _mm256_set1_ps((float)at->a), hi = _mm256_set1_ps((float)at->b);
    for (int64_t i = 0; i < n; i += 8) {
        int64_t r = n - i;
        __m256 v = loadm(x + i, r), o;
        switch (op) {
        case FM_OP_NEG: o = _mm256_xor_ps(v, sign); break;
        case FM_OP_ABS: o = _mm256_andnot_ps(sign, v); break;
        case FM_OP_EXP: o = fm_exp256(v); break;
        case FM_OP_SQRT: o = _mm256_sqrt_ps(v); break;
        case FM_OP_RSQRT: o = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(v)); break;
        case FM_OP_TANH: o = fm_tanh256(v); break;
        case FM_OP_SIGMOID: o = fm_sigmoid256(v); break;
        /* relu keeps NaN: max(x, 0) would return 0 for NaN in the second operand order */
        case FM_OP_RELU: o = _mm256_blendv_ps(v, _mm256_mul_ps(v, zero), _mm256_cmp_ps(v, zero, _CMP_LE_OQ)); break;
        case FM_OP_LEAKY_RELU: o = _mm256_blendv_ps(v, _mm256_mul_ps(v, slope), _mm256_cmp_ps(v, zero, _CMP_LE_OQ)); break;
        case FM_OP_GELU: o = gelu_v(v); break;
        case FM_OP_GELU_TANH: o = gelu_tanh_v(v); break;
        case FM_OP_SILU: o = _mm256_mul_ps(v, fm_sigmoid256(v)); break;
        case FM_OP_CLAMP: {
            __m256 c = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            o = _mm256_blendv_ps(c, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            break;
        }
        default: o = v; break; /* COPY */
        }
        storem(y + i, o, r);
    }
    return true;
}

bool fm_ew_unary_bwd_f32_avx2(fm_op_id fwd, const fm_unary_attrs *at, const float *dy, const float *x,
                              const float *y, float *dx, int64_t n) {
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    switch (fwd) {
    case FM_OP_RELU: case FM_OP_LEAKY_RELU: case FM_OP_GELU: case FM_OP_GELU_TANH: case FM_OP_SILU:
    case FM_OP_SIGMOID: case FM_OP_TANH: case FM_OP_EXP: case FM_OP_NEG: break;
    default: return false;
    }
    if ((fwd == FM_OP_SIGMOID || fwd == FM_OP_TANH || fwd == FM_OP_EXP) && !y) return false;
    const __m256 slope = _mm256_set1_ps((float)at->a);
    for (int64_t i = 0; i < n; i += 8) {
        int64_t r = n - i;
        __m256 g = loadm(dy + i, r), d;
        __m256 v = x ? loadm(x + i, r) : zero;
        switch (fwd) {
        case FM_OP_RELU: d = _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_GT_OQ), one); break;
        case FM_OP_LEAKY_RELU: d = _mm256_blendv_ps(slope, one, _mm256_cmp_ps(v, zero, _CMP_GT_OQ)); break;
        case FM_OP_GELU: {
            __m256 cdf = fm_normcdf256(v);
            __m256 pdf = _mm256_mul_ps(_mm256_set1_ps(k_inv_sqrt_2pi), fm_exp256(_mm256_mul_ps(_mm256_set1_ps(-0.5f), _mm256_mul_ps(v, v))));
            d = _mm256_fmadd_ps(v, pdf, cdf);
            break;
        }
        case FM_OP_GELU_TANH: {
            __m256 x2 = _mm256_mul_ps(v, v);
            __m256 u = _mm256_mul_ps(_mm256_set1_ps(k_sqrt2_pi), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x2), v, v));
            __m256 t = fm_tanh256(u);
            __m256 du = _mm256_mul_ps(_mm256_set1_ps(k_sqrt2_pi), _mm256_fmadd_ps(_mm256_set1_ps(3 * 0.044715f), x2, one));
            __m256 left = _mm256_mul_ps(half, _mm256_add_ps(one, t));
            __m256 right = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_fnmadd_ps(t, t, one)), du);
            d = _mm256_add_ps(left, right);
            break;
        }
        case FM_OP_SILU: {
            __m256 s = fm_sigmoid256(v);
            d = _mm256_mul_ps(s, _mm256_fmadd_ps(v, _mm256_sub_ps(one, s), one));
            break;
        }
        case FM_OP_SIGMOID: { __m256 s = loadm(y + i, r); d = _mm256_mul_ps(s, _mm256_sub_ps(one, s)); break; }
        case FM_OP_TANH: { __m256 t = loadm(y + i, r); d = _mm256_fnmadd_ps(t, t, one); break; }
        case FM_OP_EXP: d = loadm(y + i, r); break;
        default: d = _mm256_set1_ps(-1.0f); break; /* NEG */
        }
        storem(dx + i, _mm256_mul_ps(g, d), r);
    }
    return true;
}

bool fm_ew_binary_f32_avx2(fm_op_id op, const float *a, const float *b, float *y, int64_t n) {
    switch (op) {
    case FM_OP_ADD: case FM_OP_SUB: case FM_OP_MUL: case FM_OP_DIV: case FM_OP_MAXIMUM: case FM_OP_MINIMUM: break;
    default: return false;
    }
    for (int64_t i = 0; i < n; i += 8) {
        int64_t r = n - i;
        __m256 va = loadm(a + i, r), vb = loadm(b + i, r), o;
        switch (op) {
        case FM_OP_ADD: o = _mm256_add_ps(va, vb); break;
        case FM_OP_SUB: o = _mm256_sub_ps(va, vb); break;
        case FM_OP_MUL: o = _mm256_mul_ps(va, vb); break;
        case FM_OP_DIV: o = _mm256_div_ps(va, vb); break;
        case FM_OP_MAXIMUM: {
            __m256 nan = _mm256_cmp_ps(va, vb, _CMP_UNORD_Q);
            o = _mm256_or_ps(_mm256_max_ps(va, vb), nan); /* NaN in either gives NaN */
            break;
        }
        default: {
            __m256 nan = _mm256_cmp_ps(va, vb, _CMP_UNORD_Q);
            o = _mm256_or_ps(_mm256_min_ps(va, vb), nan);
            break;
        }
        }
        storem(y + i, o, r);
    }
    return true;
}

bool fm_ew_where_f32_avx2(const float *c, const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        int64_t r = n - i;
        __m256 m = _mm256_cmp_ps(loadm(c + i, r), _mm256_setzero_ps(), _CMP_NEQ_UQ);
        storem(y + i, _mm256_blendv_ps(loadm(b + i, r), loadm(a + i, r), m), r);
    }
    return true;
}
