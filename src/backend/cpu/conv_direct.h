/* The AVX-512 direct (no im2col) f32 convolution of conv2d_fused
 * (conv_fused_cpu.c), for NCHW, stride 1, dilation 1, one group, output channels
 * a multiple of the tile's channel block: the CNN layers of fashion-cnn and most
 * 3x3 stacks. (AVX2 runs conv_lanes.h instead, channels along the lanes.)
 *
 * Output pixels run along the vector lanes (so NCHW needs no layout change):
 * one tile is OB output channels x 2 output rows x one vector of columns, held in
 * 2*OB accumulators; each step loads two input rows shifted by the tap and
 * broadcasts OB weights. The input is first copied into a zero-padded buffer
 * (row stride WS >= the column blocks + kW - 1, one extra zero row), so the inner
 * loop has no bounds checks. Bias, ReLU and a 2x2 stride-2 max pool run on the
 * accumulators before anything is stored (the pool pairs the tile's two rows),
 * so the conv output is written once, pooled. Weights are packed to
 * [block][C][kH][kW][block width] once by conv2d_fused_pack (a graph does it at
 * load) or else per call (about 5% of a fashion-cnn forward at batch 1). */
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
    int64_t n_big;     /* channel blocks: n_big of the level's big block, then small ones to O */
} fm_conv_direct;

/* The tile's channel blocks and vector width (the packing depends on them). O
 * must be a multiple of the small block; the first blocks are big, the rest
 * small (fm_conv_direct_split; at AVX-512 both are 8). */
#define FM_CONV_DIRECT_OB_AVX512 8
#define FM_CONV_DIRECT_OBS_AVX512 8
#define FM_CONV_DIRECT_VL_AVX512 16

/* The number of big blocks for O channels (O a multiple of obs): as many as leave
 * a multiple of obs; the number of blocks in all goes to *n_blocks. */
static inline int64_t fm_conv_direct_split(int64_t O, int64_t ob, int64_t obs, int64_t *n_blocks) {
    int64_t nb = O / ob;
    while (nb > 0 && (O - nb * ob) % obs) nb--;
    *n_blocks = nb + (O - nb * ob) / obs;
    return nb;
}

/* Block bi's first channel and width. */
static inline int64_t fm_conv_direct_block(int64_t bi, int64_t n_big, int64_t ob, int64_t obs, int64_t *width) {
    *width = bi < n_big ? ob : obs;
    return bi < n_big ? bi * ob : n_big * ob + (bi - n_big) * obs;
}

/* Weights [O][C*KH*KW] -> the packed form: block by block, [C*KH*KW][width]
 * starting at the block's first channel times C*KH*KW. */
static inline void fm_conv_direct_pack(const float *w, float *wp, int64_t O, int64_t per, int64_t ob, int64_t obs) {
    int64_t nblk, nb = fm_conv_direct_split(O, ob, obs, &nblk);
    for (int64_t bi = 0; bi < nblk; bi++) {
        int64_t width, o0 = fm_conv_direct_block(bi, nb, ob, obs, &width);
        for (int64_t j = 0; j < width; j++)
            for (int64_t k = 0; k < per; k++) wp[o0 * per + k * width + j] = w[(o0 + j) * per + k];
    }
}

/* Tasks: N x channel blocks x row pairs, in [begin, end), in the order (sample,
 * block, pair); all column blocks each. Call only when fm_cpu_use_avx512() is true. */
void fm_conv_direct_rows_avx512(const fm_conv_direct *d, int64_t begin, int64_t end);
#endif
