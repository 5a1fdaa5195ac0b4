/* The AVX-512 micro-kernel of the packed f32 linear (linear_packed.h). A panel
 * of 16 output columns is one zmm, so a tile of MR rows x NP panels keeps MR NP
 * accumulators; each output is still one sum over k in order in one lane, the
 * same FMAs as the AVX2 kernel's, so the result is bitwise the AVX2 one (the
 * tests compare them). Rows 3-6 run 6 x FM_LINEAR512_NP panels (24 accumulators
 * for 4: 4 weight loads and 6 broadcasts per 24 FMAs, where the AVX2 tile needs
 * 2 loads and 6 broadcasts per 12), one row FM_LINEAR512_NP1 panels and two rows
 * FM_LINEAR512_NP panels, so that enough independent sums hide the FMA latency.
 * A panel past N is written through a 16-lane mask instead of a buffer.
 * Two choices differ from the AVX2 kernel's (neither changes a sum's order):
 * - k blocks of FM_LINEAR512_KC = 128, not 256: a 4-panel group's block is then
 *   32 KB and stays in the 48 KB L1 while every row tile of the block passes over
 *   it (256: 64 KB, re-read from L2 by each tile);
 * - a row block's rows in tiles as even as they come (32 rows: 5,5,5,6,5,6, not
 *   6,6,6,6,6,2: a 2-row tile has 8 accumulators, too few for the FMA latency).
 * Measured on an Intel Xeon (model 207), one thread, CPU time, fashion-mlp's
 * compiled graph at batch 32 (bench/bench_graph_ort.py --model mlp --base): KC 128
 * alone 1.04-1.07x, with the even rows 1.03-1.16x (KC 64: 0.88-1.00x). */
#include <immintrin.h>

#include "backend/cpu/linear_packed.h"

#ifndef FM_LINEAR512_NP
#define FM_LINEAR512_NP 4 /* panels per tile, 2-6 rows */
#endif
#ifndef FM_LINEAR512_NP1
#define FM_LINEAR512_NP1 8 /* panels per tile, one row */
#endif
#ifndef FM_LINEAR512_KC
#define FM_LINEAR512_KC 128 /* k per block, rows 2-6 */
#endif
#define NPMAX 8
_Static_assert(FM_LINEAR512_NP >= 1 && FM_LINEAR512_NP <= 4 && FM_LINEAR512_NP1 >= 1 && FM_LINEAR512_NP1 <= NPMAX,
               "tile shapes outside the table");

/* MR rows x NP panels over k in [0, kc): x at the tile's first row and k, w at the
 * first panel's k-block ([kc][16]; the next panel ws floats on), y at the tile
 * (rows ldy apart). The last panel's columns are the lanes of `tail` (all 16 for a
 * full panel); y and bias are read and written only there. The sums start at 0
 * when `first`, else from y; when `last`, bias (NULL or 16 NP values, tail-masked
 * in the last panel) and ReLU are applied before the store. */
static inline __attribute__((always_inline)) void tile(const int MR, const int NP, const float *x, int64_t ldx, const float *w,
                                                       int64_t ws, int64_t kc, float *y, int64_t ldy, int first, int last,
                                                       const float *bias, int relu, __mmask16 tail) {
    __m512 c[FM_LINEAR_MR][NPMAX];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int j = 0; j < NP; j++) {
            const __mmask16 m = j == NP - 1 ? tail : 0xFFFF;
            c[r][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y + r * ldy + 16 * j);
        }
    const float *xr[FM_LINEAR_MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) xr[r] = x + r * ldx;
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m512 b[NPMAX];
#pragma GCC unroll 8
        for (int j = 0; j < NP; j++) b[j] = _mm512_loadu_ps(w + j * ws + k * FM_LINEAR_NR);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m512 a = _mm512_set1_ps(xr[r][k]);
#pragma GCC unroll 8
            for (int j = 0; j < NP; j++) c[r][j] = _mm512_fmadd_ps(a, b[j], c[r][j]);
        }
    }
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int j = 0; j < NP; j++) {
            const __mmask16 m = j == NP - 1 ? tail : 0xFFFF;
            __m512 v = c[r][j];
            if (last && bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + 16 * j));
            if (last && relu) v = _mm512_max_ps(z, v); /* NaN stays NaN, as relu */
            _mm512_mask_storeu_ps(y + r * ldy + 16 * j, m, v);
        }
}

typedef void (*tile_fn)(const float *x, int64_t ldx, const float *w, int64_t ws, int64_t kc, float *y, int64_t ldy, int first,
                        int last, const float *bias, int relu, __mmask16 tail);
#define TILE(MR, NP)                                                                                                   \
    static void tile##MR##x##NP(const float *x, int64_t ldx, const float *w, int64_t ws, int64_t kc, float *y,         \
                                int64_t ldy, int first, int last, const float *bias, int relu, __mmask16 tail) {       \
        tile(MR, NP, x, ldx, w, ws, kc, y, ldy, first, last, bias, relu, tail);                                        \
    }
#define TILES_NP(NP) TILE(1, NP) TILE(2, NP) TILE(3, NP) TILE(4, NP) TILE(5, NP) TILE(6, NP)
TILES_NP(1)
TILES_NP(2)
TILES_NP(3)
TILES_NP(4)
TILE(1, 5)
TILE(1, 6)
TILE(1, 7)
TILE(1, 8)
/* tiles[MR - 1][NP - 1]; rows 2-6 take at most 4 panels */
static const tile_fn tiles[FM_LINEAR_MR][NPMAX] = {
    {tile1x1, tile1x2, tile1x3, tile1x4, tile1x5, tile1x6, tile1x7, tile1x8},
    {tile2x1, tile2x2, tile2x3, tile2x4}, {tile3x1, tile3x2, tile3x3, tile3x4}, {tile4x1, tile4x2, tile4x3, tile4x4},
    {tile5x1, tile5x2, tile5x3, tile5x4}, {tile6x1, tile6x2, tile6x3, tile6x4},
};

void fm_linear_packed_f32_avx512(const fm_linear_packed *d, int64_t i0, int64_t i1, int64_t p0, int64_t p1) {
    const int64_t K = d->K, N = d->N, ws = FM_LINEAR_NR * K;
    for (int64_t ib = i0; ib < i1; ib += FM_LINEAR_MC) {
        const int64_t ie = ib + FM_LINEAR_MC < i1 ? ib + FM_LINEAR_MC : i1;
        /* one row reads each weight once: no K blocks, so each panel group is read as long streams */
        const int64_t KC = ie - ib == 1 ? (K > 0 ? K : 1) : FM_LINEAR512_KC;
        const int64_t npmax = ie - ib == 1 ? FM_LINEAR512_NP1 : FM_LINEAR512_NP;
        for (int64_t kb = 0; kb < K || (kb == 0 && K == 0); kb += KC) {
            const int64_t kc = kb + KC < K ? KC : K - kb;
            const int first = kb == 0, last = kb + kc >= K;
            for (int64_t p = p0, np; p < p1; p += np) {
                np = p1 - p < npmax ? p1 - p : npmax;
                const int64_t n0 = p * FM_LINEAR_NR, nend = (p + np) * FM_LINEAR_NR;
                const int64_t nv = nend <= N ? FM_LINEAR_NR : N - (nend - FM_LINEAR_NR); /* columns of the last panel */
                const __mmask16 tail = (__mmask16)((1u << nv) - 1u);
                const float *w = d->wp + n0 * K + kb * FM_LINEAR_NR, *bias = d->bias ? d->bias + n0 : NULL;
                /* the block's rows in tiles as even as they come (32: 5,5,5,6,5,6, not 6,6,6,6,6,2) */
                const int64_t nrt = (ie - ib + FM_LINEAR_MR - 1) / FM_LINEAR_MR;
                for (int64_t t = 0, i = ib; t < nrt; t++) {
                    const int mr = (int)(ib + (t + 1) * (ie - ib) / nrt - i);
                    tiles[mr - 1][np - 1](d->x + i * d->ldx + kb, d->ldx, w, ws, kc, d->y + i * d->ldy + n0, d->ldy, first,
                                          last, bias, d->relu, tail);
                    i += mr;
                }
            }
            if (K == 0) break;
        }
    }
}
