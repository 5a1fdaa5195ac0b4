/* The small-M product on AVX2/FMA (gemm_smallm.h): tiles of 2 weight rows by
 * up to 2 rows of A, each output in the GEMV's two 8-lane accumulators (even
 * and odd 8-wide chunks of K) finished with the same fm_hsum256, so each
 * output is bitwise the GEMV's (gemv_avx2.c). 8 accumulators and 4 loads per
 * 16 columns fit the 16 ymm registers. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/gemm_smallm.h"
#include "backend/cpu/simd_avx2.h"

static inline __attribute__((always_inline)) void tile(int R, const float *const w[2], int nv, const float *A, int64_t lda,
                                                       int64_t K, float beta, float *C, int64_t ldc) {
    const int64_t k16 = K & ~(int64_t)15, k8 = K & ~(int64_t)7;
    __m256 ea[2][2], oa[2][2]; /* [row of A][weight row]: even and odd chunks */
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 2; j++) ea[r][j] = oa[r][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k < k16; k += 16) {
        __m256 we[2], wo[2];
        for (int j = 0; j < 2; j++) { we[j] = _mm256_loadu_ps(w[j] + k); wo[j] = _mm256_loadu_ps(w[j] + k + 8); }
        for (int r = 0; r < R; r++) {
            __m256 xe = _mm256_loadu_ps(A + r * lda + k), xo = _mm256_loadu_ps(A + r * lda + k + 8);
            for (int j = 0; j < 2; j++) {
                ea[r][j] = _mm256_fmadd_ps(we[j], xe, ea[r][j]);
                oa[r][j] = _mm256_fmadd_ps(wo[j], xo, oa[r][j]);
            }
        }
    }
    if (k < k8)
        for (int r = 0; r < R; r++) {
            __m256 xe = _mm256_loadu_ps(A + r * lda + k);
            for (int j = 0; j < 2; j++) ea[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(w[j] + k), xe, ea[r][j]);
        }
    for (int r = 0; r < R; r++) {
        const float *x = A + r * lda;
        float *c = C + r * ldc;
        for (int j = 0; j < nv; j++) {
            float v = fm_hsum256(_mm256_add_ps(ea[r][j], oa[r][j]));
            for (int64_t t = k8; t < K; t++) v = fmaf(w[j][t], x[t], v);
            c[j] = beta == 0.0f ? v : fmaf(beta, c[j], v);
        }
    }
}

void fm_gemm_smallm_f32_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *W, int64_t ldw,
                             float beta, float *C, int64_t ldc) {
    for (int64_t n0 = 0; n0 < N; n0 += 2) {
        int nv = N - n0 < 2 ? 1 : 2;
        const float *w[2] = {W + n0 * ldw, W + (n0 + nv - 1) * ldw};
        int64_t m = 0;
        for (; m + 2 <= M; m += 2) tile(2, w, nv, A + m * lda, lda, K, beta, C + m * ldc + n0, ldc);
        if (m < M) tile(1, w, nv, A + m * lda, lda, K, beta, C + m * ldc + n0, ldc);
    }
}
