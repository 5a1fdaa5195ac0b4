/* AVX2 column sums for reduce_cpu.c's col_range: 32 columns' double
 * accumulators in eight ymm registers across the pass over the rows. Each
 * column is summed in double over k = 0..R-1 in order, as the scalar loop
 * does, so the results are bitwise the same. */
#include <immintrin.h>
#include <stdint.h>

void fm_colsum_f32_avx2(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);
double fm_rowsum_f32_avx2(const float *p, int64_t n);

/* reduce_cpu.c's row sum (as fm_rowsum_f32_avx512): partial k mod 32 in eight ymm of 4, the
 * tail's missing lanes adding +0.0; the tree over the partials in scalar code. */
double fm_rowsum_f32_avx2(const float *p, int64_t n) {
    __m256d a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_pd();
    int64_t k = 0;
    for (; k + 32 <= n; k += 32)
        for (int j = 0; j < 8; j++) a[j] = _mm256_add_pd(a[j], _mm256_cvtps_pd(_mm_loadu_ps(p + k + 4 * j)));
    static const int32_t lanes[8] = {-1, -1, -1, -1, 0, 0, 0, 0};
    for (int j = 0; k < n && j < 8; j++) {
        const int64_t left = n - k - 4 * j;
        if (left <= 0) break;
        const __m128i m = _mm_loadu_si128((const __m128i *)(const void *)(lanes + 4 - (left >= 4 ? 4 : left)));
        a[j] = _mm256_add_pd(a[j], _mm256_cvtps_pd(_mm_maskload_ps(p + k + 4 * j, m)));
    }
    double s[32], t[8];
    for (int j = 0; j < 8; j++) _mm256_storeu_pd(s + 4 * j, a[j]);
    for (int j = 0; j < 8; j++) t[j] = (s[j] + s[j + 8]) + (s[j + 16] + s[j + 24]);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

void fm_colsum_f32_avx2(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc) {
    int64_t c = 0;
    for (; c + 32 <= nc; c += 32) {
        __m256d a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm256_loadu_pd(acc + c + 4 * j);
        const float *p = x + c;
        for (int64_t k = 0; k < R; k++, p += ld)
            for (int j = 0; j < 8; j++) a[j] = _mm256_add_pd(a[j], _mm256_cvtps_pd(_mm_loadu_ps(p + 4 * j)));
        for (int j = 0; j < 8; j++) _mm256_storeu_pd(acc + c + 4 * j, a[j]);
    }
    for (; c + 4 <= nc; c += 4) {
        __m256d a = _mm256_loadu_pd(acc + c);
        const float *p = x + c;
        for (int64_t k = 0; k < R; k++, p += ld) a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(p)));
        _mm256_storeu_pd(acc + c, a);
    }
    for (; c < nc; c++) {
        double a = acc[c];
        const float *p = x + c;
        for (int64_t k = 0; k < R; k++, p += ld) a += *p;
        acc[c] = a;
    }
}
