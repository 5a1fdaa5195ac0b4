/* Winograd F(2x2, 3x3) for conv2d_fused's 3x3 stride-1 convs, with the 2x2 max
 * pool after them or without a pool (conv_fused_cpu.c), on AVX-512 and AVX2.
 *
 * A 2x2 output tile of a 3x3 stride-1 conv is A^T [(G g G^T) .* (B^T d B)] A
 * for the 4x4 input patch d and the 3x3 filter g: per tile and channel pair, 16
 * multiplies instead of 36 (2.25x fewer), the transforms being additions. With a
 * 2x2 pool after the conv, a tile is exactly one pool window, so the output
 * transform ends in the max, bias and ReLU and only the pooled value is stored.
 * Without a pool (ResNet's and VGG's 3x3 layers) the tiles cover the output, the
 * last row and column of tiles cut short when Ho or Wo is odd, and each tile's
 * four outputs are stored (bias and ReLU applied).
 *
 * Layouts: U = the transformed weights [16][C][O] (xi = 4 * row + column of the
 * 4x4 transform; O a multiple of 16; the 16 matrices fm_conv_wino_u_stride floats
 * apart, one cache line more than C * O, so that the weight transform's 16
 * stores a step do not all map to one L1 set when C * O * 4 is a multiple of 4
 * KB), from conv_lanes.h's packed weights. The
 * input is conv_direct.h's zero-padded copy [N][C][Hp][WS] (Hp >= 2 Hy + 2, WS >=
 * 2 Wy + 2). A task is one sample and a run of tile rows (tiles = pooled
 * outputs, row-major); in a per-thread workspace it writes V [16][C][tiles] (the
 * input transform, 7 tiles of a row per vector), M [16][tiles][O] (16 GEMMs
 * [tiles x C] x [C x O], 64 channels in 4 zmm x up to 6 tiles: 24
 * accumulators, each broadcast of V feeding 4 FMAs) and then the output
 * transform, pool, bias and ReLU, scattered to NCHW (16 channels' planes a
 * scatter: a plane's index times 16 must fit in int32, hence the size limit).
 *
 * The outputs are not the direct kernels' bit for bit: the transforms round
 * differently. Against a double reference the error stays within a small
 * multiple of the direct sum's (tests/test_isa_kernels.c states the bound). */
#ifndef FATHOM_CONV_WINO_H
#define FATHOM_CONV_WINO_H
#include <stdint.h>

typedef struct fm_conv_wino {
    const float *xp;   /* padded input [N][C][Hp][WS] */
    const float *u;    /* transformed weights [16][C][O], fm_conv_wino_u_stride apart */
    const float *bias; /* [O] or NULL */
    float *y;          /* [N][O][Hy][Wy] pooled, or [N][O][Ho][Wo] */
    int64_t N, C, O, Hp, WS, Hy, Wy; /* Hy x Wy: the tiles (the pooled size, or Ho, Wo halved rounding up) */
    int relu, pool;    /* pool 2 (tiles pooled) or 0 */
    int64_t Ho, Wo;    /* pool 0: the output's size */
    int64_t nblk;      /* tile-row runs per sample (fm_conv_wino_plan) */
    int64_t nob;       /* output-channel runs per tile-row run (AVX2: fm_conv_wino_split_channels; else 1) */
    /* When x is set, the input is read from it unpadded instead of from xp: [N][C][H][W]
     * with ph, pw zero rows and columns around it (rows and columns outside read as
     * zeros through the load masks), so the caller skips the padded copy. */
    const float *x;
    int64_t H, W, ph, pw;
} fm_conv_wino;

/* Whether the kernel takes this conv (3x3, stride 1, then a 2x2 pool or none; Hy x Wy
 * its output): O in whole 16-channel vectors and enough input channels for the GEMMs to
 * pay for the transforms; a plane's index times 16 within int32 (the scatters). */
static inline int fm_conv_wino_fits(int64_t C, int64_t O, int64_t KH, int64_t KW, int pool, int64_t Hy, int64_t Wy) {
    return KH == 3 && KW == 3 && (pool == 2 || pool == 0) && O % 16 == 0 && C >= 8 && Hy > 0 && Wy > 0 &&
           Hy * Wy < ((int64_t)1 << 26);
}

/* About FM_CONV_WINO_TASK_TILES tiles a task or more (a sample's rows split evenly), so
 * batch 1 still splits. */
enum { FM_CONV_WINO_TASK_TILES = 24 };
static inline void fm_conv_wino_plan(fm_conv_wino *d) {
    int64_t nb = d->Hy * d->Wy / FM_CONV_WINO_TASK_TILES;
    d->nblk = nb < 1 ? 1 : nb > d->Hy ? d->Hy : nb;
    d->nob = 1;
}
/* The AVX2 kernel only: when the samples' tile-row runs are fewer than threads (a small
 * output at batch 1: ResNet-18's 7x7 layers are one run), split each run's output channels
 * into runs of whole 16-channel blocks as well, so that every thread gets a task; each such
 * task transforms its input itself. */
static inline void fm_conv_wino_split_channels(fm_conv_wino *d, int threads) {
    const int64_t runs = d->N * d->nblk, blocks = d->O / 16;
    if (runs >= threads) return;
    const int64_t want = (threads + runs - 1) / runs;
    d->nob = want < blocks ? want : blocks;
}
static inline int64_t fm_conv_wino_tasks(const fm_conv_wino *d) { return d->N * d->nblk * d->nob; }
/* The most tiles of a task, and one workspace's size in floats (V, M). */
static inline int64_t fm_conv_wino_max_tiles(const fm_conv_wino *d) { return (d->Hy + d->nblk - 1) / d->nblk * d->Wy; }
/* V's rows (one per transform position and input channel) for nt tiles: the AVX2 kernel
 * stores 8 tiles a step and lets a row's last step run into this slack. */
static inline int64_t fm_conv_wino_v_stride(int64_t nt) { return nt + 8; }
static inline int64_t fm_conv_wino_ws_floats(const fm_conv_wino *d) {
    const int64_t t = fm_conv_wino_max_tiles(d);
    return 16 * d->C * fm_conv_wino_v_stride(t) + 16 * t * d->O + 16;
}
/* The padded copy the AVX2 kernel reads (xp; it has no unpadded path): at least the
 * conv's own padding, rows for every tile's 4x4 patch (2 Hy + 2), and columns for its
 * steps of 8 tiles (16 columns and 2 more a step) read with whole-vector loads. */
static inline void fm_conv_wino_avx2_geometry(int64_t H, int64_t W, int64_t ph, int64_t pw, int64_t Hy, int64_t Wy, int64_t *Hp,
                                              int64_t *WS) {
    const int64_t rows = 2 * Hy + 2, cols = 16 * ((Wy + 7) / 8) + 2;
    *Hp = H + 2 * ph > rows ? H + 2 * ph : rows;
    *WS = W + 2 * pw > cols ? W + 2 * pw : cols;
}

static inline int64_t fm_conv_wino_u_stride(int64_t C, int64_t O) { return C * O + 16; }
static inline int64_t fm_conv_wino_u_floats(int64_t C, int64_t O) { return 16 * fm_conv_wino_u_stride(C, O); }

/* Runs tasks [begin, end) in the workspace ws (fm_conv_wino_ws_floats floats), d->nob
 * being 1. Call only when fm_cpu_use_avx512() is true. */
void fm_conv_wino_rows_avx512(const fm_conv_wino *d, int64_t begin, int64_t end, float *ws);
/* Packed lanes weights (fm_conv_lanes_pack of [O][C][3][3]) -> U [16][C][O], for both
 * levels (conv_wino_avx2.c). Call only when fm_cpu_use_avx2() is true. */
void fm_conv_wino_weights_avx2(const float *wp, float *u, int64_t O, int64_t C);
/* The same tasks on AVX2 (conv_wino_avx2.c), bitwise the AVX-512 outputs, the input from
 * xp only, padded to fm_conv_wino_avx2_geometry (d->x is ignored). Call only when
 * fm_cpu_use_avx2() is true. */
void fm_conv_wino_rows_avx2(const fm_conv_wino *d, int64_t begin, int64_t end, float *ws);
#endif
