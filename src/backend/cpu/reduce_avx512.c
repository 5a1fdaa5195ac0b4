/* AVX-512 column sums for reduce_cpu.c's col_range (the bias gradient of a
 * linear layer: a [R, inner] block summed over its rows). Each column is
 * still summed in double over k = 0..R-1 in order, exactly the scalar loop's
 * sequence, so results are bitwise those of the scalar and AVX2 paths; what
 * changes is that 64 columns' accumulators stay in eight zmm registers for
 * the whole pass over the rows instead of being loaded and stored per row. */
#include <immintrin.h>
#include <stdint.h>

void fm_colsum_f32_avx512(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);
double fm_rowsum_f32_avx512(const float *p, int64_t n);

/* reduce_cpu.c's row sum (rowsum_f32, the scalar definition of the order): element k added
 * in order to partial k mod 32, four zmm of 8 partials (independent chains of adds), the
 * tail's missing lanes adding +0.0 (a partial that starts at +0.0 never becomes -0.0, so
 * that changes no bit); then the partials' fixed tree, lane-wise and by two swaps. */
double fm_rowsum_f32_avx512(const float *p, int64_t n) {
    __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
    int64_t k = 0;
    for (; k + 32 <= n; k += 32)
        for (int j = 0; j < 4; j++) a[j] = _mm512_add_pd(a[j], _mm512_cvtps_pd(_mm256_loadu_ps(p + k + 8 * j)));
    for (int j = 0; k < n && j < 4; j++) {
        const int64_t left = n - k - 8 * j;
        if (left <= 0) break;
        const __mmask8 m = left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1);
        a[j] = _mm512_add_pd(a[j], _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p + k + 8 * j)));
    }
    const __m512d t = _mm512_add_pd(_mm512_add_pd(a[0], a[1]), _mm512_add_pd(a[2], a[3])); /* s[j] + s[j+8] ... */
    const __m512d v = _mm512_add_pd(t, _mm512_permute_pd(t, 0x55));                       /* lane 2i: t[2i] + t[2i+1] */
    const __m512d w = _mm512_add_pd(v, _mm512_permutex_pd(v, 0x4E));                      /* lanes 0 and 4: the pairs' sums */
    return _mm512_cvtsd_f64(w) + _mm256_cvtsd_f64(_mm512_extractf64x4_pd(w, 1));
}

void fm_colsum_f32_avx512(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc) {
    int64_t c = 0;
    for (; c + 64 <= nc; c += 64) {
        __m512d a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm512_loadu_pd(acc + c + 8 * j);
        const float *p = x + c;
        for (int64_t k = 0; k < R; k++, p += ld)
            for (int j = 0; j < 8; j++) a[j] = _mm512_add_pd(a[j], _mm512_cvtps_pd(_mm256_loadu_ps(p + 8 * j)));
        for (int j = 0; j < 8; j++) _mm512_storeu_pd(acc + c + 8 * j, a[j]);
    }
    for (; c < nc; c += 8) { /* 8 columns at a time, the last ones masked */
        int64_t left = nc - c;
        __mmask8 m = left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1);
        __m512d a = _mm512_maskz_loadu_pd(m, acc + c);
        const float *p = x + c;
        for (int64_t k = 0; k < R; k++, p += ld) a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p)));
        _mm512_mask_storeu_pd(acc + c, m, a);
    }
}
