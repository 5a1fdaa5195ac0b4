/* AVX2/FMA building blocks for float math: exp, tanh, sigmoid, normal CDF.
 * Include only from *_avx2.c files (compiled with -mavx2 -mfma -mf16c).
 * Accuracy: exp about 1 ulp over its range (see fm_exp256), normal CDF 6e-7
 * relative including the left tail (see fm_normcdf_gauss256), tanh 2e-7
 * relative (odd polynomial near 0, exp elsewhere). */
#ifndef FATHOM_SIMD_AVX2_H
#define FATHOM_SIMD_AVX2_H
#include <immintrin.h>
#include <stdint.h>

/* e^x: n = round(x / ln2) read from the low mantissa bits of x log2e + 1.5*2^23,
 * r = x - n ln2 in two pieces, a degree-6 minimax polynomial for 2 e^r (5e-9
 * relative), times 2^(n-1) built in the exponent field. The factor 2 keeps
 * 2^(n-1) representable up to n = 128, so results up to FLT_MAX are finite and
 * larger ones inf; results below 2^-125 (x < -86.99) flush to 0. NaN passes
 * through (the clamps are written with x as the second operand of min/max,
 * which is the one they return for NaN). */
static inline __m256 fm_exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.336544f), _mm256_min_ps(_mm256_set1_ps(88.75f), x));
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 kf = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
    __m256 n = _mm256_sub_ps(kf, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(2.773471875e-03f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.673751138e-02f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333498985e-02f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(3.333304226e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.999999404e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(kf), _mm256_set1_epi32(126)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* GELU in its tanh form, x / (1 + e^{-2u}), u = sqrt(2/pi) (x + 0.044715 x^3): the one
 * the elementwise op, the fused bias + GELU and the int8 epilogue share (fm_gelu_tanh512). */
static inline __m256 fm_gelu_tanh256(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 two_u = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.5957691216057308f)),
                                 _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), _mm256_mul_ps(x, x), one));
    __m256 e = fm_exp256(_mm256_sub_ps(_mm256_setzero_ps(), two_u));
    return _mm256_div_ps(x, _mm256_add_ps(one, e));
}

static inline __m256 fm_sigmoid256(__m256 x) {
    /* 1 / (1 + e^-x); for large -x, e^-x = inf gives 0, as it should */
    __m256 e = fm_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 fm_tanh256(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    /* large |x|: 1 - 2/(e^{2|x|}+1) */
    __m256 e = fm_exp256(_mm256_add_ps(ax, ax));
    __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    big = _mm256_or_ps(big, _mm256_and_ps(x, sign));
    /* small |x|: x + x^3 P(x^2) */
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(62.0f / 2835.0f);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
    __m256 use_small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.3f), _CMP_LT_OQ);
    return _mm256_blendv_ps(big, small, use_small);
}

/* Standard normal CDF and density kernel together: returns Phi(x) and sets
 * *gauss = exp(-x^2/2) (so phi(x) = gauss / sqrt(2 pi)), for GELU forward and
 * backward from one exp.
 *
 * Phi(-a) = exp(-a^2/2) t Q(t), a = |x|, t = 1/(1 + 0.3 a): the Mills ratio
 * written as t Q(t), Q a degree-7 polynomial fitted for relative error (2e-7 on
 * a in [0, 13]). The left tail so keeps its relative accuracy (no 1 + erf
 * cancellation), the exp argument is exact (a^2 split into hi + lo with an FMA,
 * which matters out to |x| = 13 where a^2/2 is ~85), and there is one division
 * and no erf/erfc call. For |x| >= 13 Phi(-|x|) < 1e-38 is returned as 0.
 * Measured against double erfc over a dense sweep of [-10, 10] (tests/ops and
 * docs/PERFORMANCE.md): Phi(-a) within 6e-7 relative, x Phi(x) within 6e-7
 * relative and 4e-7 absolute. NaN propagates; Phi(+inf) = 1, Phi(-inf) = 0:
 * for a = inf or NaN the exp lanes turn NaN but are masked to 0 (keep), and
 * t = 0 or NaN, so no clamp of a is needed (measured 7% of the cost). */
static inline __m256 fm_normcdf_gauss256(__m256 x, __m256 *gauss) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    __m256 hi = _mm256_mul_ps(a, a);
    __m256 lo = _mm256_fmsub_ps(a, a, hi);
    /* exp(-(hi + lo)/2) = 2^n exp(-r/2), r = hi + lo + 2 n ln2 in [-ln2, ln2]; the
     * integer n is read from the low mantissa bits of kf (1.5 * 2^23 trick) */
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 kf = _mm256_fmadd_ps(hi, _mm256_set1_ps(-0.72134752044448170f), magic);
    __m256 n = _mm256_sub_ps(kf, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(1.38671875f), hi); /* exact: 2 ln2 to 9 bits */
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-4.2438888e-4f), r);
    r = _mm256_add_ps(r, lo);
    __m256 p = _mm256_set1_ps(2.166774902e-05f); /* exp(-r/2), minimax, 4e-9 relative */
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(-2.615236153e-04f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.604218433e-03f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(-2.083315141e-02f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.249999925e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(-0.5f));
    p = _mm256_fmadd_ps(p, r, one);
    __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(kf), _mm256_set1_epi32(127)), 23);
    __m256 keep = _mm256_cmp_ps(a, _mm256_set1_ps(13.0f), _CMP_LT_OQ); /* 2^n leaves the normal range past 13 */
    __m256 g = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(scale)), keep);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3f), a, one));
    /* Horner measured faster than Estrin here (fewer multiplies; the loop is throughput-bound) */
    __m256 q = _mm256_set1_ps(3.582004830e-02f);
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-1.577464640e-01f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(2.071839124e-01f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-5.434970558e-02f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.288613081e-01f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(9.983868897e-02f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.207634434e-01f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.196288392e-01f));
    __m256 lower = _mm256_mul_ps(_mm256_mul_ps(t, q), g); /* Phi(-a) */
    *gauss = g;
    return _mm256_blendv_ps(lower, _mm256_sub_ps(one, lower), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ));
}

static inline __m256 fm_normcdf256(__m256 x) {
    __m256 g;
    return fm_normcdf_gauss256(x, &g);
}

/* exact GELU x Phi(x): the elementwise op's and the int8 epilogue's (fm_gelu512 its twin) */
static inline __m256 fm_gelu256(__m256 x) { return _mm256_mul_ps(x, fm_normcdf256(x)); }

static inline float fm_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float fm_hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* 8 floats to p, non-temporal when stream (p 32-byte aligned then): large
 * outputs skip the read-for-ownership of each line. A streaming kernel ends
 * with _mm_sfence(). */
static inline void fm_store8(float *p, __m256 v, int stream) {
    if (stream) _mm256_stream_ps(p, v);
    else _mm256_storeu_ps(p, v);
}

/* Lane sums of x[0..*done) with four independent accumulators (the adds of one
 * accumulator depend on each other; four keep the FP adder busy). *done is the
 * multiple of 8 covered; the caller reduces the lanes (float or double) and adds
 * the tail. Shared by the norm and batch-norm/conv-bias sums. */
static inline __m256 fm_sum_lanes256(const float *x, int64_t n, int64_t *done) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    *done = i;
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* Lane sums of (x - c)^2, as fm_sum_lanes256. */
static inline __m256 fm_sqdev_lanes256(const float *x, int64_t n, float c, int64_t *done) {
    __m256 vc = _mm256_set1_ps(c), a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), vc), d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vc);
        __m256 d2 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 16), vc), d3 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 24), vc);
        a0 = _mm256_fmadd_ps(d0, d0, a0);
        a1 = _mm256_fmadd_ps(d1, d1, a1);
        a2 = _mm256_fmadd_ps(d2, d2, a2);
        a3 = _mm256_fmadd_ps(d3, d3, a3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vc);
        a0 = _mm256_fmadd_ps(d, d, a0);
    }
    *done = i;
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}
#endif
