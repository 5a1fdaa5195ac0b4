/* The scalar reference of the small-M product (gemm_smallm.h): one output at a
 * time, with the SIMD kernels' 16 partial sums and reduction tree written out,
 * so the tests can ask for bitwise equality. Below AVX2 (FATHOM_ISA=scalar)
 * gemm_cpu.c runs it for one-row and small-M linears, for the same bits a row
 * gets alone and in a batch, not for speed. */
#include <math.h>

#include "backend/cpu/gemm_smallm.h"

static float dot(const float *w, const float *x, int64_t K) {
    /* lanes 0-7: the even 8-wide chunks of K, lanes 8-15: the odd ones */
    float acc[16] = {0};
    const int64_t k16 = K & ~(int64_t)15, k8 = K & ~(int64_t)7;
    int64_t k = 0;
    for (; k < k16; k += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(w[k + l], x[k + l], acc[l]);
    if (k < k8)
        for (int l = 0; l < 8; l++) acc[l] = fmaf(w[k + l], x[k + l], acc[l]);
    float v[8], s[4];
    for (int i = 0; i < 8; i++) v[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s[i] = v[i] + v[i + 4];
    float r = (s[0] + s[2]) + (s[1] + s[3]);
    for (k = k8; k < K; k++) r = fmaf(w[k], x[k], r);
    return r;
}

void fm_gemm_smallm_f32_scalar(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *W, int64_t ldw,
                               float beta, float *C, int64_t ldc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float r = dot(W + n * ldw, A + m * lda, K), *c = C + m * ldc + n;
            *c = beta == 0.0f ? r : fmaf(beta, *c, r);
        }
}
