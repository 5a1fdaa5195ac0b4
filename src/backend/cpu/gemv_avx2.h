/* f32 GEMV for one-row products (batch-1 decoding): y = W x + beta * y with W
 * [N, K] row-major, the layout of every linear weight ([out, in]). Compiled
 * with AVX2/FMA (gemv_avx2.c); call only when fm_cpu_use_avx2(). */
#ifndef FATHOM_GEMV_AVX2_H
#define FATHOM_GEMV_AVX2_H
#include <stdint.h>
#include <string.h>

/* Row n of a [N, ldw] weight of f32 elements, or of bf16 ones when bf16 (a constant
 * at each kernel's entry point, so each compiles its own loop), and element k of
 * such a row as f32 (a bf16 value is the high half of an f32: widening is exact). */
static inline const void *fm_gemv_wrow(const void *W, int64_t n, int64_t ldw, const int bf16) {
    return bf16 ? (const void *)((const uint16_t *)W + n * ldw) : (const void *)((const float *)W + n * ldw);
}
static inline float fm_gemv_w1(const void *w, int64_t k, const int bf16) {
    if (!bf16) return ((const float *)w)[k];
    uint32_t u = (uint32_t)((const uint16_t *)w)[k] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* rows [0, N) of W (row stride ldw) dotted with the contiguous x[K] */
void fm_gemv_rows_f32_avx2(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y);
/* the same on AVX-512 (gemv_avx512.c), bitwise the AVX2 result; call only when fm_cpu_use_avx512() */
void fm_gemv_rows_f32_avx512(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y);
/* W in bf16 (each element widened to f32 exactly), x and y f32: the same sums as the
 * f32 kernels on the widened weights, AVX2 and AVX-512 bitwise alike */
void fm_gemv_rows_bf16_avx2(int64_t N, int64_t K, const uint16_t *W, int64_t ldw, const float *x, float beta, float *y);
void fm_gemv_rows_bf16_avx512(int64_t N, int64_t K, const uint16_t *W, int64_t ldw, const float *x, float beta, float *y);
#endif
