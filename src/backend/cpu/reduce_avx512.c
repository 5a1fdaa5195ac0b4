/* AVX-512 column sums for reduce_cpu.c's col_range (the bias gradient of a
 * linear layer: a [R, inner] block summed over its rows). Each column is
 * still summed in double over k = 0..R-1 in order, exactly the scalar loop's
 * sequence, so results are bitwise those of the scalar and AVX2 paths; what
 * changes is that 64 columns' accumulators stay in eight zmm registers for
 * the whole pass over the rows instead of being loaded and stored per row. */
#include <immintrin.h>
#include <stdint.h>

void fm_colsum_f32_avx512(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);

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
