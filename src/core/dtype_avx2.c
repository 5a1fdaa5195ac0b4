/* F16C/AVX2 bulk conversions (compiled with -mavx2 -mfma -mf16c; entered only
 * after run-time detection). F16C's _MM_FROUND_TO_NEAREST_INT is round-to-nearest-even. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "fathom/tensor.h"

void fm_convert_f32_to_f16_avx2(const float *src, uint16_t *dst, size_t n);
void fm_convert_f16_to_f32_avx2(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n);
void fm_convert_bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n);

void fm_convert_f32_to_f16_avx2(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = fm_f32_to_f16(src[i]);
}

void fm_convert_f16_to_f32_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = fm_f16_to_f32(src[i]);
}

void fm_convert_f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m256i x = _mm256_castps_si256(v);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
        /* NaN stays NaN (quieted) */
        __m256 isnan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
        r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(isnan));
        __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi32(lo, hi));
    }
    for (; i < n; i++) dst[i] = fm_f32_to_bf16(src[i]);
}

void fm_convert_bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
    }
    for (; i < n; i++) dst[i] = fm_bf16_to_f32(src[i]);
}
