/* f32 GEMV for one-row products (batch-1 decoding): y = W x + beta * y with W
 * [N, K] row-major, the layout of every linear weight ([out, in]). Compiled
 * with AVX2/FMA (gemv_avx2.c); call only when fm_cpu_use_avx2(). */
#ifndef FATHOM_GEMV_AVX2_H
#define FATHOM_GEMV_AVX2_H
#include <stdint.h>

/* rows [0, N) of W (row stride ldw) dotted with the contiguous x[K] */
void fm_gemv_rows_f32_avx2(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y);
/* the same on AVX-512 (gemv_avx512.c), bitwise the AVX2 result; call only when fm_cpu_use_avx512() */
void fm_gemv_rows_f32_avx512(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y);
/* W in bf16 (each element widened to f32 exactly), x and y f32: the same sums as the
 * f32 kernels on the widened weights, AVX2 and AVX-512 bitwise alike */
void fm_gemv_rows_bf16_avx2(int64_t N, int64_t K, const uint16_t *W, int64_t ldw, const float *x, float beta, float *y);
void fm_gemv_rows_bf16_avx512(int64_t N, int64_t K, const uint16_t *W, int64_t ldw, const float *x, float beta, float *y);
#endif
