/* AVX-512 building blocks for float math: the 16-lane twins of simd_avx2.h's
 * exp, sigmoid, tanh and normal CDF. Same constants, same operations in the
 * same order, so each lane gives bitwise the result of the AVX2 version (the
 * tests compare them); see simd_avx2.h for the derivations and accuracy.
 * Include only from *_avx512.c files (compiled with -mavx512f/dq/bw/vl). */
#ifndef FATHOM_SIMD_AVX512_H
#define FATHOM_SIMD_AVX512_H
#include <immintrin.h>
#include <stdint.h>

static inline __m512 fm_exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.336544f), _mm512_min_ps(_mm512_set1_ps(88.75f), x));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 kf = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    __m512 n = _mm512_sub_ps(kf, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(2.773471875e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.673751138e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333498985e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(3.333304226e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.999999404e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(kf), _mm512_set1_epi32(126)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* 2^x for x <= 0 (the only range the attention softmax needs); x < -126 (and -inf)
 * gives 0. attention_avx2.c's polynomial and steps, lane for lane (same results);
 * used by attention_avx512.c and attention_avx512bf16.c. */
static inline __m512 fm_exp2_neg512(__m512 x) {
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

/* GELU in its tanh form, x / (1 + e^{-2u}) with u = sqrt(2/pi) (x + 0.044715 x^3): the
 * logistic form has no 1 + tanh cancellation in the left tail. The elementwise op, the
 * fused bias + GELU and the int8 product's epilogue all call this one, so a GELU fused
 * into another op is bitwise the separate one; fm_gelu_tanh256 is its 8-lane twin. */
static inline __m512 fm_gelu_tanh512(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 two_u = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.5957691216057308f)),
                                 _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), _mm512_mul_ps(x, x), one));
    __m512 e = fm_exp512(_mm512_sub_ps(_mm512_setzero_ps(), two_u));
    return _mm512_div_ps(x, _mm512_add_ps(one, e));
}

static inline __m512 fm_sigmoid512(__m512 x) {
    __m512 e = fm_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static inline __m512 fm_tanh512(__m512 x) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 ax = _mm512_andnot_ps(sign, x);
    __m512 e = fm_exp512(_mm512_add_ps(ax, ax));
    __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    big = _mm512_or_ps(big, _mm512_and_ps(x, sign));
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(62.0f / 2835.0f);
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), x, x);
    __mmask16 use_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.3f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(use_small, big, small);
}

static inline __m512 fm_normcdf_gauss512(__m512 x, __m512 *gauss) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 a = _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);
    __m512 hi = _mm512_mul_ps(a, a);
    __m512 lo = _mm512_fmsub_ps(a, a, hi);
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 kf = _mm512_fmadd_ps(hi, _mm512_set1_ps(-0.72134752044448170f), magic);
    __m512 n = _mm512_sub_ps(kf, magic);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(1.38671875f), hi);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-4.2438888e-4f), r);
    r = _mm512_add_ps(r, lo);
    __m512 p = _mm512_set1_ps(2.166774902e-05f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(-2.615236153e-04f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.604218433e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(-2.083315141e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.249999925e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(-0.5f));
    p = _mm512_fmadd_ps(p, r, one);
    __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(kf), _mm512_set1_epi32(127)), 23);
    __mmask16 keep = _mm512_cmp_ps_mask(a, _mm512_set1_ps(13.0f), _CMP_LT_OQ);
    __m512 g = _mm512_maskz_mov_ps(keep, _mm512_mul_ps(p, _mm512_castsi512_ps(scale)));
    __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.3f), a, one));
    __m512 q = _mm512_set1_ps(3.582004830e-02f);
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-1.577464640e-01f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(2.071839124e-01f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-5.434970558e-02f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.288613081e-01f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(9.983868897e-02f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.207634434e-01f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.196288392e-01f));
    __m512 lower = _mm512_mul_ps(_mm512_mul_ps(t, q), g);
    *gauss = g;
    __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    return _mm512_mask_blend_ps(pos, lower, _mm512_sub_ps(one, lower));
}

static inline __m512 fm_normcdf512(__m512 x) {
    __m512 g;
    return fm_normcdf_gauss512(x, &g);
}

/* exact GELU x Phi(x): the elementwise op's and the int8 epilogue's (fm_gelu256 its twin) */
static inline __m512 fm_gelu512(__m512 x) { return _mm512_mul_ps(x, fm_normcdf512(x)); }

/* 16 floats to p, non-temporal when stream (p 64-byte aligned then); a
 * streaming kernel ends with _mm_sfence(). */
static inline void fm_store16(float *p, __m512 v, int stream) {
    if (stream) _mm512_stream_ps(p, v);
    else _mm512_storeu_ps(p, v);
}

/* the first r (< 16) lanes */
static inline __mmask16 fm_tail16(int64_t r) { return (__mmask16)((1u << r) - 1u); }
/* In-place transpose of a 16x16 matrix of 32-bit elements held in r[0..15]
 * (gemm_amx.c packs bf16 pairs with it, gemm_f32_avx512.c f32 panels). */
static inline void fm_transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* u[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3 */
    for (int c = 0; c < 4; c++) {
        __m512i w0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        __m512i w2 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE), w3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(w0, w1, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(w0, w1, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(w2, w3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(w2, w3, 0xDD);
    }
}


/* Sum of (x - c)^2 when sq, else of x, in four 16-lane accumulators (the layer and
 * RMS norm rows, norm_avx512.c; fused_avx512.c's add + layer norm). */
static inline float fm_row_reduce512(const float *x, int64_t n, float c, int sq) {
    __m512 vc = _mm512_set1_ps(c), a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define FM_RR_TERM(v) (sq ? _mm512_sub_ps((v), vc) : (v))
#define FM_RR_ACC(a, v) a = sq ? _mm512_fmadd_ps(FM_RR_TERM(v), FM_RR_TERM(v), a) : _mm512_add_ps(a, (v))
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        FM_RR_ACC(a0, _mm512_loadu_ps(x + i));
        FM_RR_ACC(a1, _mm512_loadu_ps(x + i + 16));
        FM_RR_ACC(a2, _mm512_loadu_ps(x + i + 32));
        FM_RR_ACC(a3, _mm512_loadu_ps(x + i + 48));
    }
    for (; i + 16 <= n; i += 16) FM_RR_ACC(a0, _mm512_loadu_ps(x + i));
    if (i < n) { /* masked-off lanes read as c: (c - c)^2 = 0 */
        __m512 v = _mm512_mask_loadu_ps(sq ? vc : _mm512_setzero_ps(), fm_tail16(n - i), x + i);
        FM_RR_ACC(a1, v);
    }
#undef FM_RR_ACC
#undef FM_RR_TERM
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

#endif
