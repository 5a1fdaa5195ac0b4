/* f32 products with a few rows, C[M, N] = A[M, K] W[N, K]^T (+ beta C): the
 * linear layers of batched decoding (one row per sequence in the step) and of
 * small served batches. OpenBLAS packs (copies) the whole weight into its
 * panel layout on every call, which for 2-16 rows costs as much as the product
 * (18% of a batched decode step was sgemm_incopy); these kernels read W in
 * place, each weight row once per group of A rows.
 *
 * Every output is the same dot product in the same order as the one-row GEMV
 * (gemv_avx2.c): 8-lane partial sums over even and odd 8-wide chunks of K, the
 * same reduction tree, then fmaf over the K % 8 tail, then beta. So a row of C
 * is bitwise what that row alone would give (batch size, grouping, the ISA
 * level and the thread split do not change it): a request's text does not
 * depend on which others share its decode step. The scalar version is the
 * reference the tests hold the SIMD ones to. lda, ldw, ldc in elements. */
#ifndef FATHOM_GEMM_SMALLM_H
#define FATHOM_GEMM_SMALLM_H
#include <stdint.h>

void fm_gemm_smallm_f32_scalar(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *W, int64_t ldw,
                               float beta, float *C, int64_t ldc);
/* AVX2/FMA: call only when fm_cpu_use_avx2() */
void fm_gemm_smallm_f32_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *W, int64_t ldw,
                             float beta, float *C, int64_t ldc);
/* AVX-512F: call only when fm_cpu_use_avx512() */
void fm_gemm_smallm_f32_avx512(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *W,
                               int64_t ldw, float beta, float *C, int64_t ldc);
#endif
