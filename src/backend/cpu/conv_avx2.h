/* AVX2 helpers for the batch-norm (batchnorm_cpu.c), max-pool (pool_cpu.c) and conv
 * bias-gradient (conv2d_cpu.c) kernels; defined in conv_avx2.c.
 * Call only when fm_cpu_use_avx2() is true. */
#ifndef FATHOM_CONV_AVX2_H
#define FATHOM_CONV_AVX2_H
#include <stdint.h>

/* Sum of x[0..n). */
double fm_avx2_sum_f32(const float *x, int64_t n);
/* Sum of (x - mean)^2 over x[0..n). */
double fm_avx2_sqdev_f32(const float *x, int64_t n, float mean);
/* *sum += sum dy; *sum_dev += sum dy * (x - mean). */
void fm_avx2_sum_dydev_f32(const float *dy, const float *x, int64_t n, float mean, double *sum, double *sum_dev);
/* y[i] = x[i] * sc + sh over [0, n), in that order (the portable loop's bits). */
void fm_avx2_affine_f32(const float *x, float *y, int64_t n, float sc, float sh);
/* dx[i] = a * dy[i] + b * x[i] + k over [0, n), in that order (the portable loop's bits). */
void fm_avx2_affine2_f32(const float *dy, const float *x, float *dx, int64_t n, float a, float b, float k);
/* One output row of a 2x2 stride-2 unpadded max pool from input rows r0, r1:
 * y[ow] and idx[ow] = row0 + offset in the plane, for ow from 0 until the
 * return value: Wo, or earlier (a multiple of 8) at a block holding a NaN, so
 * that the caller's scalar loop applies PyTorch's NaN rule to the rest. Reads
 * only the 2*Wo columns of each row. W < 2^30. */
int64_t fm_avx2_maxpool2x2_row_f32(const float *r0, const float *r1, int64_t Wo, int64_t W, int64_t row0,
                                   float *y, int64_t *idx);
#endif
