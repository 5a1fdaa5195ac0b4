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
 * FMA units busy; R = 8 is what measured fastest (bench_isa_kernels). */
#include <immintrin.h>

#include "backend/cpu/gemv_avx2.h"

static inline float row_finish(__m512 acc, const float *w, const float *x, int64_t k8, int64_t K) {
    __m256 v = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (int64_t k = k8; k < K; k++) r = __builtin_fmaf(w[k], x[k], r);
    return r;
}

static inline void store(float *y, float s, float beta) { *y = beta == 0.0f ? s : __builtin_fmaf(beta, *y, s); }

/* rows n, n + q, ..., n + (R-1) q */
static inline __attribute__((always_inline)) void rows(const int R, int64_t n, int64_t q, int64_t K, const float *W,
                                                        int64_t ldw, const float *x, float beta, float *y) {
    const int64_t k16 = K & ~(int64_t)15, k8 = K & ~(int64_t)7;
    const float *w[8];
    __m512 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) w[r] = W + (n + r * q) * ldw, a[r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k < k16; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + k), xv, a[r]);
    }
    if (k < k8) {
        const __mmask16 lo = 0xFF;
        const __m512 xv = _mm512_maskz_loadu_ps(lo, x + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) a[r] = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(lo, w[r] + k), xv, a[r], lo);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) store(y + n + r * q, row_finish(a[r], w[r], x, k8, K), beta);
}

#ifndef FM_GEMV512_R
#define FM_GEMV512_R 8
#endif

void fm_gemv_rows_f32_avx512(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y) {
    const int64_t q = N / FM_GEMV512_R;
    for (int64_t n = 0; n < q; n++) rows(FM_GEMV512_R, n, q, K, W, ldw, x, beta, y);
    int64_t n = FM_GEMV512_R * q;
    for (; n + 4 <= N; n += 4) rows(4, n, 1, K, W, ldw, x, beta, y);
    for (; n < N; n++) rows(1, n, 1, K, W, ldw, x, beta, y);
}
