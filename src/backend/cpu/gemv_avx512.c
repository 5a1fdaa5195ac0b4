/* The one-row product y = W x (+ beta y) on AVX-512 (gemv_avx2.h). Each row's
 * sum is bitwise the AVX2 kernel's: one zmm accumulator is that kernel's two
 * 8-lane ones side by side (lanes 0-7 the even 8-wide chunks of K, lanes 8-15
 * the odd), a K % 16 >= 8 remainder is one more even chunk on lanes 0-7, and
 * the reduction is its tree: lanes 0-7 + lanes 8-15, then fm_hsum256's pairs,
 * then fmaf over the K % 8 tail, then beta. So the ISA level, like the batch
 * and the thread split, does not change a decoded token.
 *
 * One accumulator per row means a row's FMAs form one dependency chain, so the
 * rows go R at a time (8 or 4 long streams, each a contiguous eighth or
 * quarter of the rows, as gemv_avx2.c splits them into quarters) to keep the
 * FMA units busy; R = 8 is what measured fastest (bench_isa_kernels). The bf16
 * entry point runs the same loop on weights widened from bf16 as they load. */
#include <immintrin.h>

#include "backend/cpu/gemv_avx2.h"

/* sixteen weights of a row from k (lanes m), as f32 (gemv_avx2.h: f32, or bf16 widened) */
static inline __m512 ld16(const void *w, int64_t k, const __mmask16 m, const int bf16) {
    if (!bf16) return m == 0xFFFF ? _mm512_loadu_ps((const float *)w + k) : _mm512_maskz_loadu_ps(m, (const float *)w + k);
    __m256i h = m == 0xFFFF ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k))
                            : _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline float row_finish(__m512 acc, const void *w, const float *x, int64_t k8, int64_t K, const int bf16) {
    __m256 v = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (int64_t k = k8; k < K; k++) r = __builtin_fmaf(fm_gemv_w1(w, k, bf16), x[k], r);
    return r;
}

static inline void store(float *y, float s, float beta) { *y = beta == 0.0f ? s : __builtin_fmaf(beta, *y, s); }

/* rows n, n + q, ..., n + (R-1) q */
static inline __attribute__((always_inline)) void rows(const int R, int64_t n, int64_t q, int64_t K, const void *W,
                                                        int64_t ldw, const float *x, float beta, float *y, const int bf16) {
    const int64_t k16 = K & ~(int64_t)15, k8 = K & ~(int64_t)7;
    const void *w[8];
    __m512 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) w[r] = fm_gemv_wrow(W, n + r * q, ldw, bf16), a[r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k < k16; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) a[r] = _mm512_fmadd_ps(ld16(w[r], k, 0xFFFF, bf16), xv, a[r]);
    }
    if (k < k8) {
        const __mmask16 lo = 0xFF;
        const __m512 xv = _mm512_maskz_loadu_ps(lo, x + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) a[r] = _mm512_mask3_fmadd_ps(ld16(w[r], k, lo, bf16), xv, a[r], lo);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) store(y + n + r * q, row_finish(a[r], w[r], x, k8, K, bf16), beta);
}

#ifndef FM_GEMV512_R
#define FM_GEMV512_R 8
#endif

static inline __attribute__((always_inline)) void gemv(int64_t N, int64_t K, const void *W, int64_t ldw, const float *x,
                                                        float beta, float *y, const int bf16) {
    const int64_t q = N / FM_GEMV512_R;
    for (int64_t n = 0; n < q; n++) rows(FM_GEMV512_R, n, q, K, W, ldw, x, beta, y, bf16);
    int64_t n = FM_GEMV512_R * q;
    for (; n + 4 <= N; n += 4) rows(4, n, 1, K, W, ldw, x, beta, y, bf16);
    for (; n < N; n++) rows(1, n, 1, K, W, ldw, x, beta, y, bf16);
}

void fm_gemv_rows_f32_avx512(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y) {
    gemv(N, K, W, ldw, x, beta, y, 0);
}

void fm_gemv_rows_bf16_avx512(int64_t N, int64_t K, const uint16_t *W, int64_t ldw, const float *x, float beta, float *y) {
    gemv(N, K, W, ldw, x, beta, y, 1);
}
