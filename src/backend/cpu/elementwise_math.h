/* Shared between elementwise_cpu.c (scalar reference), elementwise_avx2.c and elementwise_avx512.c. */
#ifndef FATHOM_ELEMENTWISE_MATH_H
#define FATHOM_ELEMENTWISE_MATH_H
#include <stdbool.h>
#include <stdint.h>
#include "backend/kernel.h"

double fm_ew_unary_scalar(fm_op_id op, const fm_unary_attrs *at, double x);
double fm_ew_unary_deriv_scalar(fm_op_id op, const fm_unary_attrs *at, double x, double y);
double fm_ew_binary_scalar(fm_op_id op, double a, double b);
/* AVX2 loops over contiguous float arrays; return false if the op has no SIMD version.
 * stream: write the output with non-temporal stores (the output must be 32-byte aligned). */
bool fm_ew_unary_f32_avx2(fm_op_id op, const fm_unary_attrs *at, const float *x, float *y, int64_t n, bool stream);
bool fm_ew_unary_bwd_f32_avx2(fm_op_id fwd, const fm_unary_attrs *at, const float *dy, const float *x,
                              const float *y, float *dx, int64_t n, bool stream);
bool fm_ew_binary_f32_avx2(fm_op_id op, const float *a, const float *b, float *y, int64_t n, bool stream);
bool fm_ew_where_f32_avx2(const float *c, const float *a, const float *b, float *y, int64_t n);
/* The AVX-512 versions (same ops, bitwise the same results); call only when fm_cpu_use_avx512(). */
bool fm_ew_unary_f32_avx512(fm_op_id op, const fm_unary_attrs *at, const float *x, float *y, int64_t n, bool stream);
bool fm_ew_unary_bwd_f32_avx512(fm_op_id fwd, const fm_unary_attrs *at, const float *dy, const float *x,
                                const float *y, float *dx, int64_t n, bool stream);
bool fm_ew_binary_f32_avx512(fm_op_id op, const float *a, const float *b, float *y, int64_t n, bool stream);
bool fm_ew_where_f32_avx512(const float *c, const float *a, const float *b, float *y, int64_t n);
#endif
