/* AVX2 column sums for reduce_cpu.c's col_range: 32 columns' double
 * accumulators in eight ymm registers across the pass over the rows. Each
 * column is summed in double over k = 0..R-1 in order, as the scalar loop
 * does, so the results are bitwise the same. */
#include <immintrin.h>
#include <stdint.h>

void fm_colsum_f32_avx2(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);

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
