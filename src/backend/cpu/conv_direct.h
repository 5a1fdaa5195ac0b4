/* The direct (no im2col) f32 convolution of conv2d_fused (conv_fused_cpu.c), for
 * NCHW, stride 1, dilation 1, one group, output channels a multiple of the tile's
 * channel block: the CNN layers of fashion-cnn and most 3x3 stacks.
 *
 * Output pixels run along the vector lanes (so NCHW needs no layout change):
 * one tile is OB output channels x 2 output rows x one vector of columns, held in
 * 2*OB accumulators; each step loads two input rows shifted by the tap and
 * broadcasts OB weights. The input is first copied into a zero-padded buffer
 * (row stride WS >= the column blocks + kW - 1, one extra zero row), so the inner
 * loop has no bounds checks. Bias, ReLU and a 2x2 stride-2 max pool run on the
 * accumulators before anything is stored (the pool pairs the tile's two rows),
 * so the conv output is written once, pooled. Weights are repacked per call to
 * [O/OB][C][kH][kW][OB] (about 5 us for a 64x32x3x3 conv). */
#ifndef FATHOM_CONV_DIRECT_H
#define FATHOM_CONV_DIRECT_H
#include <stdbool.h>
#include <stdint.h>

typedef struct fm_conv_direct {
    const float *xp;   /* padded input [N][C][Hp][WS] */
    const float *wp;   /* packed weights [O/OB][C][KH][KW][OB] */
    const float *bias; /* [O] or NULL */
    float *y;          /* [N][O][Hy][Wy]: the conv output, or pooled */
    int64_t N, C, O, KH, KW, Hp, WS, Ho, Wo, Hy, Wy;
    int relu, pool;    /* pool: 0/1 none, 2: 2x2 stride 2 */
} fm_conv_direct;

/* The tile's channel block and vector width per level (the packing depends on OB). */
#define FM_CONV_DIRECT_OB_AVX512 8
#define FM_CONV_DIRECT_VL_AVX512 16
#define FM_CONV_DIRECT_OB_AVX2 4
#define FM_CONV_DIRECT_VL_AVX2 8

/* Tasks: (sample, channel block, row pair) in [begin, end); all column blocks each.
 * Call only when fm_cpu_use_avx512() / fm_cpu_use_avx2() is true. */
void fm_conv_direct_rows_avx512(const fm_conv_direct *d, int64_t begin, int64_t end);
void fm_conv_direct_rows_avx2(const fm_conv_direct *d, int64_t begin, int64_t end);
#endif
