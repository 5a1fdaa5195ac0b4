/* The lanes kernels' epilogue (conv_lanes.h), shared by conv_lanes_avx2.c and
 * conv_lanes_avx512.c (both compiled with AVX2): the task's sums in the buffer
 * [pixel][block width] -> the 2x2 max pool, bias, ReLU -> NCHW through 8x8
 * register transposes. Both levels leave the same sums in the buffer, so they
 * give the same outputs bit for bit. Include only from files compiled with
 * AVX2 (-mavx2 -mfma). */
#ifndef FATHOM_CONV_LANES_EPILOGUE_H
#define FATHOM_CONV_LANES_EPILOGUE_H
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/conv_lanes.h"

/* max with NaN kept from either side, as max_pool2d */
static inline __m256 nanmax(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

/* r[k] (position k, lane = channel) -> r[l] (channel l, lane = position). */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
    for (int k = 0; k < 8; k += 2) t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]), t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    for (int k = 0; k < 8; k += 4) {
        s[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44), s[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
        s[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44), s[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
    }
    for (int l = 0; l < 4; l++) r[l] = _mm256_permute2f128_ps(s[l], s[l + 4], 0x20), r[l + 4] = _mm256_permute2f128_ps(s[l], s[l + 4], 0x31);
}

/* One channel vector's run of L outputs: position k's 8 channels at src + k *
 * stride, channel l's run at y + l * HW (nl channels). Runs of 8 or more go 8
 * positions at a time, the last 8 overlapping the one before (the same values
 * written twice by this task); shorter ones lane by lane. */
static inline void store_run(float *y, int64_t HW, const float *src, int64_t stride, int64_t L, int64_t nl) {
    if (L < 8) {
        for (int64_t l = 0; l < nl; l++)
            for (int64_t k = 0; k < L; k++) y[l * HW + k] = src[k * stride + l];
        return;
    }
    for (int64_t s = 0;; s += 8) {
        if (s + 8 > L) s = L - 8;
        __m256 r[8];
        for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(src + (s + k) * stride);
        transpose8(r);
        for (int64_t l = 0; l < nl; l++) _mm256_storeu_ps(y + l * HW + s, r[l]);
        if (s + 8 == L) break;
    }
}

/* The task's sums in buf [pixel][width] -> the pool (into `pooled`; without a
 * pool in place), bias, ReLU -> NCHW. */
static inline void fm_conv_lanes_epilogue(const fm_conv_lanes *d, float *buf, float *pooled, int64_t n, int64_t v0, int64_t nv, int64_t p0, int64_t p1,
                     int64_t nrows, int64_t c0, int64_t nc, int64_t nchunk) {
    const int64_t width = nv * 8, HW = d->Hy * d->Wy;
    /* outputs of the task: orows rows of ocols, the first at (orow0, ocol0) */
    const int64_t orows = d->pool == 2 ? p1 - p0 : nrows, ocols = d->pool == 2 ? nc / 2 : nc;
    const int64_t orow0 = d->pool == 2 ? p0 : 2 * p0, ocol0 = d->pool == 2 ? c0 / 2 : c0;
    for (int64_t j = 0; j < nv; j++) {
        const int64_t o0 = (v0 + j) * 8, nl = d->O - o0 < 8 ? d->O - o0 : 8;
        float bt[8] = {0};
        if (d->bias) memcpy(bt, d->bias + o0, sizeof(float) * (size_t)nl);
        const __m256 bv = _mm256_loadu_ps(bt), zero = _mm256_setzero_ps();
        float *bj = buf + 8 * j, *oj = d->pool == 2 ? pooled + 8 * j : bj; /* without a pool, in place */
        for (int64_t r = 0; r < orows; r++)
            for (int64_t q = 0; q < ocols; q++) {
                __m256 m;
                if (d->pool == 2) { /* bias and ReLU commute with the max: pool, then bias, ReLU */
                    const float *a = bj + (2 * r * nc + 2 * q) * width, *b = a + nc * width;
                    m = nanmax(nanmax(_mm256_loadu_ps(a), _mm256_loadu_ps(a + width)), nanmax(_mm256_loadu_ps(b), _mm256_loadu_ps(b + width)));
                } else
                    m = _mm256_loadu_ps(bj + (r * nc + q) * width);
                m = _mm256_add_ps(m, bv);
                if (d->relu) m = _mm256_max_ps(zero, m);
                _mm256_storeu_ps(oj + (r * ocols + q) * width, m);
            }
        float *yb = d->y + (n * d->O + o0) * HW;
        if (nchunk == 1) /* the task's rows are whole rows: one run per channel */
            store_run(yb + orow0 * d->Wy, HW, oj, width, orows * ocols, nl);
        else
            for (int64_t r = 0; r < orows; r++) store_run(yb + (orow0 + r) * d->Wy + ocol0, HW, oj + r * ocols * width, width, ocols, nl);
    }
}
#endif
