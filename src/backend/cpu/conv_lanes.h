/* The AVX2 direct convolution of conv2d_fused (conv_fused_cpu.c) with output
 * channels along the vector lanes, as in a channel-blocked (NCHW8c) conv, but
 * reading and writing plain NCHW.
 *
 * For f32 NCHW, stride 1, dilation 1, one group, any channel counts. One
 * step of the tile broadcasts the input at 3 adjacent output pixels of one row
 * and multiplies it by 4 vectors of 8 output channels' weights (32 channels x
 * 3 pixels = 12 accumulators; each weight vector is loaded once per step and
 * used for 3 FMAs). Against the 6-channel x 2-row tile (weights broadcast,
 * pixels along the lanes) this loads 7 values per 12 FMAs instead of 8, wastes
 * no lanes when a row's width is not a multiple of 8, and keeps its 12
 * accumulators and their 3 + 1 operands in the 16 registers (measured on Zen 3:
 * 85-92 GFLOP/s in L1, against 54 for 12-accumulator shapes that spilled).
 *
 * A task is one sample, one block of up to 4 channel vectors, a group of
 * output row pairs and up to FM_CONV_LANES_COLS columns. The task's output
 * pixels (its rows' columns, row after row) are cut into groups of 3 that may
 * span two rows, so a 14-wide row pair is 9 groups of 3 and one of 1 rather
 * than 8 of 3 and 2 of 2 (a 2-pixel group has 8 accumulators, too few to hide
 * the FMA latency). Their sums go to a buffer [pixel][block width] (L1), the
 * input channels in passes of `cc` so that a pass's weights stay in L1; then
 * the 2x2 max pool, bias and ReLU run on the buffer in place, and the results
 * go to NCHW 8 positions at a time through an 8x8 register transpose (one
 * vector store per channel instead of 8 scalar ones per position). A group of
 * row pairs is as many as make each channel's run of outputs at least 8 long
 * (when a row is one column chunk, a task's outputs of one channel are one
 * contiguous run), so fashion-cnn's 7-wide 32->64 layer takes 2-3 pairs a task.
 * The input is the zero-padded copy of conv_direct.h ([N][C][Hp][WS],
 * WS >= Wo + kW - 1), so the inner loop has no bounds checks. Weights are
 * packed by fm_conv_lanes_pack: O rounded up to vectors of 8 (zeros past O), in
 * blocks of up to 4 vectors, each block [C][kH][kW][block width] from its
 * first vector times 8*C*kH*kW. */
#ifndef FATHOM_CONV_LANES_H
#define FATHOM_CONV_LANES_H
#include <stdint.h>

#define FM_CONV_LANES_NV 4    /* channel vectors per block */
#define FM_CONV_LANES_COLS 48 /* output columns per task (even) */
#define FM_CONV_LANES_PIX 96  /* most conv output pixels per task (the buffer) */

typedef struct fm_conv_lanes {
    const float *xp;   /* padded input [N][C][Hp][WS] */
    const float *wp;   /* packed weights (fm_conv_lanes_pack) */
    const float *bias; /* [O] or NULL */
    float *y;          /* [N][O][Hy][Wy]: the conv output, or pooled */
    int64_t N, C, O, KH, KW, Hp, WS, Ho, Wo, Hy, Wy;
    int relu, pool;    /* pool: 0 none, 2: 2x2 stride 2 */
    int64_t cc;        /* input channels per pass */
    int64_t ngroups;   /* row-pair groups per sample (fm_conv_lanes_plan) */
} fm_conv_lanes;

/* Vectors of 8 channels, and blocks of up to FM_CONV_LANES_NV of them. */
static inline int64_t fm_conv_lanes_vectors(int64_t O) { return (O + 7) / 8; }
static inline int64_t fm_conv_lanes_blocks(int64_t O) { return (fm_conv_lanes_vectors(O) + FM_CONV_LANES_NV - 1) / FM_CONV_LANES_NV; }
/* The packed size in floats for O channels of `per` = C*kH*kW weights each. */
static inline int64_t fm_conv_lanes_packed_numel(int64_t O, int64_t per) { return fm_conv_lanes_vectors(O) * 8 * per; }

/* Weights [O][per] -> the packed form (fm_conv_lanes_packed_numel floats). */
static inline void fm_conv_lanes_pack(const float *w, float *wp, int64_t O, int64_t per) {
    const int64_t nvec = fm_conv_lanes_vectors(O);
    for (int64_t v0 = 0; v0 < nvec; v0 += FM_CONV_LANES_NV) {
        const int64_t width = 8 * (nvec - v0 < FM_CONV_LANES_NV ? nvec - v0 : FM_CONV_LANES_NV);
        float *dst = wp + v0 * 8 * per;
        for (int64_t k = 0; k < per; k++)
            for (int64_t l = 0; l < width; l++) {
                const int64_t o = v0 * 8 + l;
                dst[k * width + l] = o < O ? w[o * per + k] : 0.0f;
            }
    }
}

/* Row pairs (pooled rows, or pairs of conv rows), column chunks and columns of a chunk. */
static inline int64_t fm_conv_lanes_pairs(const fm_conv_lanes *d) { return d->pool == 2 ? d->Hy : (d->Ho + 1) / 2; }
static inline int64_t fm_conv_lanes_cols(const fm_conv_lanes *d) { return d->pool == 2 ? 2 * d->Wy : d->Wo; }
static inline int64_t fm_conv_lanes_chunks(const fm_conv_lanes *d) { return (fm_conv_lanes_cols(d) + FM_CONV_LANES_COLS - 1) / FM_CONV_LANES_COLS; }

/* Sets d->ngroups from the geometry: G pairs per group so that a channel's run of
 * outputs in a task is >= 8 long where one chunk spans the row, fewer where the
 * buffer would overflow (a group holds G to 2G - 1 pairs). */
static inline void fm_conv_lanes_plan(fm_conv_lanes *d) {
    const int64_t pairs = fm_conv_lanes_pairs(d), cols = fm_conv_lanes_cols(d), nchunk = fm_conv_lanes_chunks(d);
    const int64_t nc = nchunk == 1 ? cols : FM_CONV_LANES_COLS, per_pair = d->pool == 2 ? nc / 2 : 2 * nc;
    int64_t G = nchunk == 1 && per_pair > 0 && per_pair < 8 ? (8 + per_pair - 1) / per_pair : 1;
    while (G > 1 && (2 * G - 1) * 2 * nc > FM_CONV_LANES_PIX) G--;
    d->ngroups = pairs / G < 1 ? 1 : pairs / G;
}

/* The tasks: N x pair groups x chunks x blocks, in that order (a group's input
 * rows stay in L1 while the blocks' weights stream through). */
static inline int64_t fm_conv_lanes_tasks(const fm_conv_lanes *d) {
    return d->N * d->ngroups * fm_conv_lanes_chunks(d) * fm_conv_lanes_blocks(d->O);
}

/* One plane [H][W] -> its zero-padded copy [Hp][WS] (rows ph.. and columns pw..
 * hold the input), with vector stores instead of a memcpy and two memsets a
 * row. Call only when fm_cpu_use_avx2() is true. */
void fm_conv_lanes_pad_avx2(const float *x, float *xp, int64_t H, int64_t W, int64_t Hp, int64_t WS, int64_t ph, int64_t pw);

/* Runs tasks [begin, end). Call only when fm_cpu_use_avx2() is true. */
void fm_conv_lanes_rows_avx2(const fm_conv_lanes *d, int64_t begin, int64_t end);
/* The same on AVX-512 (conv_lanes_avx512.c: a block in 2 zmm vectors, 8 pixels a
 * group), bitwise the AVX2 outputs. Call only when fm_cpu_use_avx512() is true. */
void fm_conv_lanes_rows_avx512(const fm_conv_lanes *d, int64_t begin, int64_t end);
#endif
