/* The AVX2/FMA micro-kernel of the packed f32 linear (linear_packed.h). */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/linear_packed.h"

/* MR rows x NP panels of 16 columns over k in [0, kc): x at the block's first row
 * and k, w at the first panel's k-block ([kc][16]; the next panel ws floats on),
 * y at the tile (rows ldy apart; 16 NP columns readable and writable: the caller
 * passes a buffer for a panel past N). The sums start at 0 when `first`, else
 * from y; when `last`, bias (16 NP values or NULL) and ReLU are applied before the
 * store. Inlined with constant MR and NP, so the loops unroll and the 2 MR NP
 * accumulators stay in registers. Several panels at once are for 1-2 rows, where
 * one panel's 2-4 accumulators would leave the FMAs waiting on their latency. */
static inline __attribute__((always_inline)) void tile(const int MR, const int NP, const float *x, int64_t ldx, const float *w,
                                                       int64_t ws, int64_t kc, float *y, int64_t ldy, int first, int last,
                                                       const float *bias, int relu) {
    __m256 c[4][FM_LINEAR_MR][2];
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++)
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) c[j][r][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * ldy + 16 * j + 8 * h);
    const float *xr[FM_LINEAR_MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) xr[r] = x + r * ldx;
#pragma GCC unroll 4
    for (int64_t k = 0; NP == 1 && k < kc; k++) { /* one panel: 2 weight vectors, then a broadcast per row (15 registers) */
        const __m256 b0 = _mm256_loadu_ps(w + k * FM_LINEAR_NR), b1 = _mm256_loadu_ps(w + k * FM_LINEAR_NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m256 a = _mm256_broadcast_ss(xr[r] + k);
            c[0][r][0] = _mm256_fmadd_ps(a, b0, c[0][r][0]);
            c[0][r][1] = _mm256_fmadd_ps(a, b1, c[0][r][1]);
        }
    }
#pragma GCC unroll 4
    for (int64_t k = 0; NP > 1 && k < kc; k++) { /* 1-2 rows: their broadcasts, then the panels */
        __m256 a[FM_LINEAR_MR];
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) a[r] = _mm256_broadcast_ss(xr[r] + k);
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++) {
            const __m256 b0 = _mm256_loadu_ps(w + j * ws + k * FM_LINEAR_NR), b1 = _mm256_loadu_ps(w + j * ws + k * FM_LINEAR_NR + 8);
#pragma GCC unroll 6
            for (int r = 0; r < MR; r++) {
                c[j][r][0] = _mm256_fmadd_ps(a[r], b0, c[j][r][0]);
                c[j][r][1] = _mm256_fmadd_ps(a[r], b1, c[j][r][1]);
            }
        }
    }
    const __m256 z = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++)
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 v = c[j][r][h];
                if (last && bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + 16 * j + 8 * h));
                if (last && relu) v = _mm256_max_ps(z, v); /* NaN stays NaN, as relu */
                _mm256_storeu_ps(y + r * ldy + 16 * j + 8 * h, v);
            }
}

typedef void (*tile_fn)(const float *x, int64_t ldx, const float *w, int64_t ws, int64_t kc, float *y, int64_t ldy, int first,
                        int last, const float *bias, int relu);
#define TILE(MR, NP)                                                                                                   \
    static void tile##MR##x##NP(const float *x, int64_t ldx, const float *w, int64_t ws, int64_t kc, float *y,         \
                                int64_t ldy, int first, int last, const float *bias, int relu) {                       \
        tile(MR, NP, x, ldx, w, ws, kc, y, ldy, first, last, bias, relu);                                              \
    }
TILE(1, 1)
TILE(2, 1)
TILE(3, 1)
TILE(4, 1)
TILE(5, 1)
TILE(6, 1)
TILE(1, 2)
TILE(1, 4)
TILE(2, 2)
static const tile_fn tiles[FM_LINEAR_MR] = {tile1x1, tile2x1, tile3x1, tile4x1, tile5x1, tile6x1};

/* Rows 1-2 over a group of full panels (4 for one row, 2 for two) */
static void small_rows(const fm_linear_packed *d, int64_t i, int mr, int64_t p, int np, int64_t kb, int64_t kc, int first, int last) {
    const float *x = d->x + i * d->ldx + kb, *w = d->wp + p * FM_LINEAR_NR * d->K + kb * FM_LINEAR_NR;
    const float *bias = d->bias ? d->bias + p * FM_LINEAR_NR : NULL;
    float *y = d->y + i * d->ldy + p * FM_LINEAR_NR;
    const int64_t ws = FM_LINEAR_NR * d->K;
    if (mr == 1 && np == 4) tile1x4(x, d->ldx, w, ws, kc, y, d->ldy, first, last, bias, d->relu);
    else if (mr == 1) tile1x2(x, d->ldx, w, ws, kc, y, d->ldy, first, last, bias, d->relu);
    else tile2x2(x, d->ldx, w, ws, kc, y, d->ldy, first, last, bias, d->relu);
}

void fm_linear_packed_f32_avx2(const fm_linear_packed *d, int64_t i0, int64_t i1, int64_t p0, int64_t p1) {
    const int64_t K = d->K, N = d->N;
    float buf[FM_LINEAR_MR * FM_LINEAR_NR] = {0}, bb[FM_LINEAR_NR];
    for (int64_t ib = i0; ib < i1; ib += FM_LINEAR_MC) {
        const int64_t ie = ib + FM_LINEAR_MC < i1 ? ib + FM_LINEAR_MC : i1;
        /* one row reads each weight once: no K blocks, so each panel group is read as long streams */
        const int64_t KC = ie - ib == 1 ? (K > 0 ? K : 1) : FM_LINEAR_KC;
        for (int64_t kb = 0; kb < K || (kb == 0 && K == 0); kb += KC) {
            const int64_t kc = kb + KC < K ? KC : K - kb;
            const int first = kb == 0, last = kb + kc >= K;
            for (int64_t p = p0, np = 1; p < p1; p += np) {
                const int64_t n0 = p * FM_LINEAR_NR, nv = N - n0 < FM_LINEAR_NR ? N - n0 : FM_LINEAR_NR;
                const int64_t full = (N / FM_LINEAR_NR < p1 ? N / FM_LINEAR_NR : p1) - p; /* full panels from p in range */
                np = ie - ib == 1 && full >= 4 ? 4 : ie - ib <= 2 && full >= 2 ? 2 : 1;
                if (np > 1) {
                    small_rows(d, ib, (int)(ie - ib), p, (int)np, kb, kc, first, last);
                    continue;
                }
                const float *w = d->wp + n0 * K + kb * FM_LINEAR_NR, *bias = d->bias ? d->bias + n0 : NULL;
                if (bias && nv < FM_LINEAR_NR) { /* the last panel: bias through a full-width copy */
                    memset(bb, 0, sizeof bb);
                    memcpy(bb, bias, sizeof(float) * (size_t)nv);
                    bias = bb;
                }
                for (int64_t i = ib; i < ie; i += FM_LINEAR_MR) {
                    const int mr = (int)(ie - i < FM_LINEAR_MR ? ie - i : FM_LINEAR_MR);
                    const float *x = d->x + i * d->ldx + kb;
                    float *y = d->y + i * d->ldy + n0;
                    if (nv == FM_LINEAR_NR) {
                        tiles[mr - 1](x, d->ldx, w, 0, kc, y, d->ldy, first, last, bias, d->relu);
                        continue;
                    }
                    /* a panel past N: the tile works on a buffer; only nv columns are y's */
                    for (int r = 0; r < mr && !first; r++) memcpy(buf + r * FM_LINEAR_NR, y + r * d->ldy, sizeof(float) * (size_t)nv);
                    tiles[mr - 1](x, d->ldx, w, 0, kc, buf, FM_LINEAR_NR, first, last, bias, d->relu);
                    for (int r = 0; r < mr; r++) memcpy(y + r * d->ldy, buf + r * FM_LINEAR_NR, sizeof(float) * (size_t)nv);
                }
            }
            if (K == 0) break;
        }
    }
}
