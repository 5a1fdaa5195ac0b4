/* One-row products y = W x (+ beta y), W [N, K] row-major: batch-1 decoding's
 * linear layers, which stream every weight once per token and so are bound by
 * memory bandwidth. OpenBLAS's sgemv on these shapes (K = 384..1536) read the
 * weights at 7-8 GB/s where a copy moves 2x that (bench_gpt_generate's "gemv"
 * lines). The cause is the access pattern, not the arithmetic: four adjacent
 * rows of 1.5 KiB at a time (OpenBLAS's and a plain 4-row kernel's order) put
 * four interleaved streams into one 4 KiB page, which the hardware prefetcher
 * follows poorly, and one row at a time is a single stream. Here the rows are
 * split into four contiguous quarters walked side by side: four long
 * sequential streams, each in its own pages. Measured on one core (shapes of
 * gpt-6x384): 13-18 GB/s against OpenBLAS's 7-8 (K = 384) and 11-12 (K = 1536).
 *
 * Every row goes through the same operations in the same order whether it is
 * computed in a group of four or alone (row_finish is shared), so a row's
 * result does not depend on N, on where a caller's split falls, or on the
 * thread count.
 *
 * The same kernel reads bf16 weights (fm_gemv_rows_bf16_avx2: a bf16 weight is the
 * top half of an f32, so widening is a shift) for `--precision bf16` decoding,
 * which streams half the bytes; the sums are the same FMAs on the widened values. */
#include <immintrin.h>

#include "backend/cpu/gemv_avx2.h"
#include "backend/cpu/simd_avx2.h"

/* eight weights of a row from k, as f32 (gemv_avx2.h: f32, or bf16 widened) */
static inline __m256 ld8(const void *w, int64_t k, const int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)w + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* acc0 holds the even 8-wide chunks, acc1 the odd ones; k8 = K rounded down to 8 */
static inline float row_finish(__m256 acc0, __m256 acc1, const void *w, const float *x, int64_t k8, int64_t K, const int bf16) {
    float s = fm_hsum256(_mm256_add_ps(acc0, acc1));
    for (int64_t k = k8; k < K; k++) s = __builtin_fmaf(fm_gemv_w1(w, k, bf16), x[k], s);
    return s;
}

static inline void store(float *y, float s, float beta) { *y = beta == 0.0f ? s : __builtin_fmaf(beta, *y, s); }

static inline __attribute__((always_inline)) void gemv(int64_t N, int64_t K, const void *W, int64_t ldw, const float *x,
                                                        float beta, float *y, const int bf16) {
    const int64_t k16 = K & ~(int64_t)15, k8 = K & ~(int64_t)7, q = N / 4;
    for (int64_t n = 0; n < q; n++) {
        const void *w0 = fm_gemv_wrow(W, n, ldw, bf16), *w1 = fm_gemv_wrow(W, n + q, ldw, bf16);
        const void *w2 = fm_gemv_wrow(W, n + 2 * q, ldw, bf16), *w3 = fm_gemv_wrow(W, n + 3 * q, ldw, bf16);
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        int64_t k = 0;
        for (; k < k16; k += 16) {
            __m256 xa = _mm256_loadu_ps(x + k), xb = _mm256_loadu_ps(x + k + 8);
            a0 = _mm256_fmadd_ps(ld8(w0, k, bf16), xa, a0);
            b0 = _mm256_fmadd_ps(ld8(w0, k + 8, bf16), xb, b0);
            a1 = _mm256_fmadd_ps(ld8(w1, k, bf16), xa, a1);
            b1 = _mm256_fmadd_ps(ld8(w1, k + 8, bf16), xb, b1);
            a2 = _mm256_fmadd_ps(ld8(w2, k, bf16), xa, a2);
            b2 = _mm256_fmadd_ps(ld8(w2, k + 8, bf16), xb, b2);
            a3 = _mm256_fmadd_ps(ld8(w3, k, bf16), xa, a3);
            b3 = _mm256_fmadd_ps(ld8(w3, k + 8, bf16), xb, b3);
        }
        if (k < k8) {
            __m256 xa = _mm256_loadu_ps(x + k);
            a0 = _mm256_fmadd_ps(ld8(w0, k, bf16), xa, a0);
            a1 = _mm256_fmadd_ps(ld8(w1, k, bf16), xa, a1);
            a2 = _mm256_fmadd_ps(ld8(w2, k, bf16), xa, a2);
            a3 = _mm256_fmadd_ps(ld8(w3, k, bf16), xa, a3);
        }
        store(y + n, row_finish(a0, b0, w0, x, k8, K, bf16), beta);
        store(y + n + q, row_finish(a1, b1, w1, x, k8, K, bf16), beta);
        store(y + n + 2 * q, row_finish(a2, b2, w2, x, k8, K, bf16), beta);
        store(y + n + 3 * q, row_finish(a3, b3, w3, x, k8, K, bf16), beta);
    }
    for (int64_t n = 4 * q; n < N; n++) {
        const void *w0 = fm_gemv_wrow(W, n, ldw, bf16);
        __m256 a0 = _mm256_setzero_ps(), b0 = a0;
        int64_t k = 0;
        for (; k < k16; k += 16) {
            a0 = _mm256_fmadd_ps(ld8(w0, k, bf16), _mm256_loadu_ps(x + k), a0);
            b0 = _mm256_fmadd_ps(ld8(w0, k + 8, bf16), _mm256_loadu_ps(x + k + 8), b0);
        }
        if (k < k8) a0 = _mm256_fmadd_ps(ld8(w0, k, bf16), _mm256_loadu_ps(x + k), a0);
        store(y + n, row_finish(a0, b0, w0, x, k8, K, bf16), beta);
    }
}

void fm_gemv_rows_f32_avx2(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y) {
    gemv(N, K, W, ldw, x, beta, y, 0);
}

void fm_gemv_rows_bf16_avx2(int64_t N, int64_t K, const uint16_t *W, int64_t ldw, const float *x, float beta, float *y) {
    gemv(N, K, W, ldw, x, beta, y, 1);
}
