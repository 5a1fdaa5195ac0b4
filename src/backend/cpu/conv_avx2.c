/* AVX2 helpers for the batch-norm, max-pool and conv bias-gradient kernels
 * (batchnorm_cpu.c, pool_cpu.c, conv2d_cpu.c; f32).
 *
 * The portable loops there accumulate in one double per channel, which is a
 * serial chain of dependent adds (about 4 cycles per element), and the 2x2 max
 * pool branches on every element; in a profile of the fashion-cnn train step
 * these took a third of the time. Here each contiguous run (one plane row of a
 * channel) is summed in 32 float lanes, and the run total is added to the
 * caller's double, so a channel's statistics are still exact to far below f32
 * resolution and do not depend on the thread count (the caller's split is per
 * channel). Entered only when fm_cpu_use_avx2() is true. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/conv_avx2.h"
#include "backend/cpu/simd_avx2.h"

static inline double hsum_pd(__m256 v) {
    __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    __m256d s = _mm256_add_pd(a, b);
    __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
}

double fm_avx2_sum_f32(const float *x, int64_t n) {
    int64_t i;
    double s = hsum_pd(fm_sum_lanes256(x, n, &i));
    for (; i < n; i++) s += (double)x[i];
    return s;
}

double fm_avx2_sqdev_f32(const float *x, int64_t n, float mean) {
    int64_t i;
    double s = hsum_pd(fm_sqdev_lanes256(x, n, mean, &i));
    for (; i < n; i++) { double d = (double)x[i] - (double)mean; s += d * d; }
    return s;
}

void fm_avx2_sum_dydev_f32(const float *dy, const float *x, int64_t n, float mean, double *sum, double *sum_dev) {
    __m256 m = _mm256_set1_ps(mean), s0 = _mm256_setzero_ps(), s1 = s0, p0 = s0, p1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 g0 = _mm256_loadu_ps(dy + i), g1 = _mm256_loadu_ps(dy + i + 8);
        s0 = _mm256_add_ps(s0, g0);
        s1 = _mm256_add_ps(s1, g1);
        p0 = _mm256_fmadd_ps(g0, _mm256_sub_ps(_mm256_loadu_ps(x + i), m), p0);
        p1 = _mm256_fmadd_ps(g1, _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), m), p1);
    }
    double s = hsum_pd(_mm256_add_ps(s0, s1)), p = hsum_pd(_mm256_add_ps(p0, p1));
    for (; i < n; i++) { s += (double)dy[i]; p += (double)dy[i] * ((double)x[i] - (double)mean); }
    *sum += s;
    *sum_dev += p;
}

/* The batch-norm passes' elementwise rows. The product and the sum are separate
 * instructions, in the portable loop's order (this file, like the rest, builds
 * with -std=c11, so nothing is contracted into an FMA): the same bits as the
 * portable loop, on every ISA level. */
void fm_avx2_affine_f32(const float *x, float *y, int64_t n, float sc, float sh) {
    const __m256 a = _mm256_set1_ps(sc), b = _mm256_set1_ps(sh);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), a), b));
        _mm256_storeu_ps(y + i + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), a), b));
    }
    for (; i < n; i++) y[i] = x[i] * sc + sh;
}

void fm_avx2_affine2_f32(const float *dy, const float *x, float *dx, int64_t n, float a, float b, float k) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vk = _mm256_set1_ps(k);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 t = _mm256_add_ps(_mm256_mul_ps(va, _mm256_loadu_ps(dy + i)), _mm256_mul_ps(vb, _mm256_loadu_ps(x + i)));
        _mm256_storeu_ps(dx + i, _mm256_add_ps(t, vk));
    }
    for (; i < n; i++) dx[i] = a * dy[i] + b * x[i] + k;
}

/* Even and odd elements of 16 consecutive floats (lo, hi), each in order. */
static inline void deinterleave(__m256 lo, __m256 hi, __m256 *even, __m256 *odd) {
    __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)), o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* Lanes [0, n) set, n in [0, 8]. */
static inline __m256i first_lanes(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 outputs from input columns [2*ow, 2*ow + 16); only the first `valid`
 * outputs are read and written (masked loads never touch memory past them).
 * Returns false, writing nothing, if a valid window holds a NaN. */
static inline bool pool8(const float *r0, const float *r1, int64_t ow, int64_t valid, int64_t W, int64_t row0,
                         float *y, int64_t *idx) {
    const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2), three = _mm256_set1_epi32(3);
    __m256 a, b, c, d;
    __m256i mo = first_lanes(valid);
    if (valid == 8) {
        deinterleave(_mm256_loadu_ps(r0 + 2 * ow), _mm256_loadu_ps(r0 + 2 * ow + 8), &a, &b);
        deinterleave(_mm256_loadu_ps(r1 + 2 * ow), _mm256_loadu_ps(r1 + 2 * ow + 8), &c, &d);
    } else {
        __m256i mlo = first_lanes(2 * valid > 8 ? 8 : 2 * valid), mhi = first_lanes(2 * valid > 8 ? 2 * valid - 8 : 0);
        deinterleave(_mm256_maskload_ps(r0 + 2 * ow, mlo), _mm256_maskload_ps(r0 + 2 * ow + 8, mhi), &a, &b);
        deinterleave(_mm256_maskload_ps(r1 + 2 * ow, mlo), _mm256_maskload_ps(r1 + 2 * ow + 8, mhi), &c, &d);
    }
    __m256 nan = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q));
    if (_mm256_movemask_ps(_mm256_and_ps(nan, _mm256_castsi256_ps(mo)))) return false;
    /* the first maximum in window order a, b, c, d (strictly greater replaces) */
    __m256 best = a;
    __m256i k = _mm256_setzero_si256();
    __m256 gt = _mm256_cmp_ps(b, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, b, gt);
    k = _mm256_blendv_epi8(k, one, _mm256_castps_si256(gt));
    gt = _mm256_cmp_ps(c, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, c, gt);
    k = _mm256_blendv_epi8(k, two, _mm256_castps_si256(gt));
    gt = _mm256_cmp_ps(d, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, d, gt);
    k = _mm256_blendv_epi8(k, three, _mm256_castps_si256(gt));
    /* index = row0 + (k >> 1) * W + 2 * ow + 2 * lane + (k & 1), row0 = 2 * oh * W */
    __m256i col = _mm256_add_epi32(_mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), _mm256_set1_epi32((int)(2 * ow)));
    __m256i rel = _mm256_add_epi32(_mm256_add_epi32(col, _mm256_and_si256(k, one)),
                                   _mm256_mullo_epi32(_mm256_srli_epi32(k, 1), _mm256_set1_epi32((int)W)));
    __m256i base = _mm256_set1_epi64x(row0);
    __m256i i0 = _mm256_add_epi64(base, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(rel)));
    __m256i i1 = _mm256_add_epi64(base, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(rel, 1)));
    if (valid == 8) {
        _mm256_storeu_ps(y + ow, best);
        _mm256_storeu_si256((__m256i *)(idx + ow), i0);
        _mm256_storeu_si256((__m256i *)(idx + ow + 4), i1);
    } else {
        _mm256_maskstore_ps(y + ow, mo, best);
        _mm256_maskstore_epi64((long long *)(idx + ow), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(mo)), i0);
        _mm256_maskstore_epi64((long long *)(idx + ow + 4), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(mo, 1)), i1);
    }
    return true;
}

int64_t fm_avx2_maxpool2x2_row_f32(const float *r0, const float *r1, int64_t Wo, int64_t W, int64_t row0,
                                   float *y, int64_t *idx) {
    int64_t ow = 0;
    for (; ow < Wo; ow += 8)
        if (!pool8(r0, r1, ow, Wo - ow < 8 ? Wo - ow : 8, W, row0, y, idx)) break;
    return ow < Wo ? ow : Wo;
}
