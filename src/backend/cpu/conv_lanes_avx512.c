/* The output-channels-along-lanes direct conv (conv_lanes.h) on AVX-512: the
 * same tasks, packed weights, passes and epilogue as the AVX2 kernel, with a
 * channel block (up to 32 channels) in 1-2 zmm vectors instead of 1-4 ymm ones,
 * and groups of up to 12 consecutive output pixels of one row instead of 3
 * that may span two rows: 2 x 12 = 24 accumulators of the 32 registers, 2
 * weight loads and 12 broadcasts per 24 FMAs (AVX2: 4 + 3 per 12 in 8-wide
 * vectors). A row's pixels are cut into groups as even as they come (14: 7 + 7,
 * 28: 10 + 9 + 9), and every broadcast of a group is at a constant offset from
 * one pointer, so the group's addresses need no registers of their own
 * (pixels spanning rows, as in the AVX2 kernel, need a pointer each: 12 did not
 * fit in the 16 general registers). Measured on an Intel Xeon (model 207), one
 * thread: groups of 12 ran 2x faster than groups of 14 (28 accumulators
 * spill), and the row-aligned groups beat 12 pixels spanning rows on the thin
 * blocks (bench_isa_kernels --only conv). Two full blocks that follow each
 * other in a thread's range run together (group2: 64 channels in 4 zmm x up to 6
 * pixels, 24 accumulators, each input broadcast used 4 times): 1.15-1.25x over
 * one block at a time on 32->64 and 64->64 layers, same machine and bench. A block of 8 or 24 channels runs its
 * last vector under an 8-lane mask. Each output is the same sum over (input
 * channel, kh, kw) in the same order as the AVX2 kernel's, through the same
 * buffer between passes, so the outputs are bitwise the AVX2 ones. */
#include <immintrin.h>

#include "backend/cpu/conv_lanes.h"
#include "backend/cpu/conv_lanes_epilogue.h"

enum { NZMAX = 2, GCMAX = 12 }; /* zmm vectors of a block, most pixels in a group */
_Static_assert(FM_CONV_LANES_NV * 8 == NZMAX * 16, "a block is two zmm vectors");

/* The sums at GC output pixels for NZ zmm vectors of channels (the last under
 * `last`), over the input channels [0, cc) of a pass: as group() in
 * conv_lanes_avx2.c, with the block's weights `width` floats a tap. */
static inline __attribute__((always_inline)) void group(const int NZ, const int GC, const int64_t KWC, const float *x,
                                                        int64_t WS, int64_t HpWS, const float *w,
                                                        int64_t width, __mmask16 last, int64_t cc, int64_t KH, int64_t kw_arg,
                                                        float *buf, int first) {
    __m512 acc[NZMAX][GCMAX];
    const int64_t KW = KWC ? KWC : kw_arg;
#pragma GCC unroll 2
    for (int j = 0; j < NZ; j++)
#pragma GCC unroll 12
        for (int p = 0; p < GC; p++)
            acc[j][p] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(j == NZ - 1 ? last : 0xFFFF, buf + p * width + 16 * j);
    for (int64_t ic = 0; ic < cc; ic++)
        for (int64_t kh = 0; kh < KH; kh++, w += KW * width) {
            const int64_t ro = ic * HpWS + kh * WS;
#pragma GCC unroll 8
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *wk = w + kw * width;
                __m512 wv[NZMAX];
#pragma GCC unroll 2
                for (int j = 0; j < NZ; j++) wv[j] = _mm512_maskz_loadu_ps(j == NZ - 1 ? last : 0xFFFF, wk + 16 * j);
#pragma GCC unroll 12
                for (int p = 0; p < GC; p++) {
                    const __m512 xv = _mm512_set1_ps(x[ro + kw + p]);
#pragma GCC unroll 2
                    for (int j = 0; j < NZ; j++) acc[j][p] = _mm512_fmadd_ps(wv[j], xv, acc[j][p]);
                }
            }
        }
#pragma GCC unroll 2
    for (int j = 0; j < NZ; j++)
#pragma GCC unroll 12
        for (int p = 0; p < GC; p++) _mm512_mask_storeu_ps(buf + p * width + 16 * j, j == NZ - 1 ? last : 0xFFFF, acc[j][p]);
}

typedef void (*group_fn)(const float *x, int64_t WS, int64_t HpWS, const float *w, int64_t width, __mmask16 last, int64_t cc,
                         int64_t KH, int64_t KW, float *buf, int first);

#define GROUP(NZ, GC, KWC, name)                                                                                       \
    static void name(const float *x, int64_t WS, int64_t HpWS, const float *w, int64_t width, __mmask16 last,          \
                     int64_t cc, int64_t KH, int64_t KW, float *buf, int first) {                                       \
        group(NZ, GC, KWC, x, WS, HpWS, w, width, last, cc, KH, KW, buf, first);                                        \
    }
#define GROUPS_GC(GC) GROUP(1, GC, 3, g1_##GC##_k3) GROUP(2, GC, 3, g2_##GC##_k3) GROUP(1, GC, 0, g1_##GC##_kn) GROUP(2, GC, 0, g2_##GC##_kn)
GROUPS_GC(1)
GROUPS_GC(2)
GROUPS_GC(3)
GROUPS_GC(4)
GROUPS_GC(5)
GROUPS_GC(6)
GROUPS_GC(7)
GROUPS_GC(8)
GROUPS_GC(9)
GROUPS_GC(10)
GROUPS_GC(11)
GROUPS_GC(12)
#define ROW(NZ, K)                                                                                                     \
    {g##NZ##_1_##K, g##NZ##_2_##K,  g##NZ##_3_##K,  g##NZ##_4_##K,  g##NZ##_5_##K,  g##NZ##_6_##K,  g##NZ##_7_##K,      \
     g##NZ##_8_##K, g##NZ##_9_##K, g##NZ##_10_##K, g##NZ##_11_##K, g##NZ##_12_##K}

/* [kW is 3][NZ - 1][GC - 1] */
static const group_fn groups[2][NZMAX][GCMAX] = {{ROW(1, kn), ROW(2, kn)}, {ROW(1, k3), ROW(2, k3)}};

/* Two full blocks at once (64 channels in 4 zmm, block 1's weights at w1) over GC <= PGMAX
 * pixels: 4 GC accumulators, 4 weight loads and GC broadcasts per 4 GC FMAs. Each
 * block's sums go to its own buffer, in the order group() would give them. */
enum { PGMAX = 6 };
static inline __attribute__((always_inline)) void group2(const int GC, const int64_t KWC, const float *x, int64_t WS,
                                                         int64_t HpWS, const float *w0, const float *w1, int64_t cc,
                                                         int64_t KH, int64_t kw_arg, float *buf0, float *buf1, int first) {
    __m512 acc[4][PGMAX];
    const int64_t KW = KWC ? KWC : kw_arg;
#pragma GCC unroll 6
    for (int p = 0; p < GC; p++) {
        acc[0][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(buf0 + p * 32);
        acc[1][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(buf0 + p * 32 + 16);
        acc[2][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(buf1 + p * 32);
        acc[3][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(buf1 + p * 32 + 16);
    }
    for (int64_t ic = 0; ic < cc; ic++)
        for (int64_t kh = 0; kh < KH; kh++, w0 += KW * 32, w1 += KW * 32) {
            const int64_t ro = ic * HpWS + kh * WS;
#pragma GCC unroll 8
            for (int64_t kw = 0; kw < KW; kw++) {
                const __m512 a = _mm512_loadu_ps(w0 + kw * 32), b = _mm512_loadu_ps(w0 + kw * 32 + 16);
                const __m512 e = _mm512_loadu_ps(w1 + kw * 32), f = _mm512_loadu_ps(w1 + kw * 32 + 16);
#pragma GCC unroll 6
                for (int p = 0; p < GC; p++) {
                    const __m512 xv = _mm512_set1_ps(x[ro + kw + p]);
                    acc[0][p] = _mm512_fmadd_ps(a, xv, acc[0][p]);
                    acc[1][p] = _mm512_fmadd_ps(b, xv, acc[1][p]);
                    acc[2][p] = _mm512_fmadd_ps(e, xv, acc[2][p]);
                    acc[3][p] = _mm512_fmadd_ps(f, xv, acc[3][p]);
                }
            }
        }
#pragma GCC unroll 6
    for (int p = 0; p < GC; p++) {
        _mm512_storeu_ps(buf0 + p * 32, acc[0][p]);
        _mm512_storeu_ps(buf0 + p * 32 + 16, acc[1][p]);
        _mm512_storeu_ps(buf1 + p * 32, acc[2][p]);
        _mm512_storeu_ps(buf1 + p * 32 + 16, acc[3][p]);
    }
}

typedef void (*group2_fn)(const float *x, int64_t WS, int64_t HpWS, const float *w0, const float *w1, int64_t cc, int64_t KH,
                          int64_t KW, float *buf0, float *buf1, int first);
#define GROUP2(GC, KWC, name)                                                                                          \
    static void name(const float *x, int64_t WS, int64_t HpWS, const float *w0, const float *w1, int64_t cc, int64_t KH, \
                     int64_t KW, float *buf0, float *buf1, int first) {                                                 \
        group2(GC, KWC, x, WS, HpWS, w0, w1, cc, KH, KW, buf0, buf1, first);                                            \
    }
#define GROUPS2(GC) GROUP2(GC, 3, p##GC##_k3) GROUP2(GC, 0, p##GC##_kn)
GROUPS2(1)
GROUPS2(2)
GROUPS2(3)
GROUPS2(4)
GROUPS2(5)
GROUPS2(6)
static const group2_fn groups2[2][PGMAX] = {{p1_kn, p2_kn, p3_kn, p4_kn, p5_kn, p6_kn}, {p1_k3, p2_k3, p3_k3, p4_k3, p5_k3, p6_k3}};

#ifndef FM_LANES512_PAIR
#define FM_LANES512_PAIR 1
#endif

void fm_conv_lanes_rows_avx512(const fm_conv_lanes *d, int64_t begin, int64_t end) {
    const int64_t nvec = fm_conv_lanes_vectors(d->O), nblk = fm_conv_lanes_blocks(d->O);
    const int64_t per = d->C * d->KH * d->KW, HpWS = d->Hp * d->WS;
    const int64_t cols = fm_conv_lanes_cols(d), nchunk = fm_conv_lanes_chunks(d), pairs = fm_conv_lanes_pairs(d);
    const int k3 = d->KW == 3;
    float buf[FM_CONV_LANES_PIX * FM_CONV_LANES_NV * 8], buf1[FM_CONV_LANES_PIX * FM_CONV_LANES_NV * 8];
    float pooled[FM_CONV_LANES_PIX / 4 * FM_CONV_LANES_NV * 8];
    /* task t = ((n * ngroups + gi) * nchunk + ci) * nblk + bi, counted up without divisions */
    int64_t bi = begin % nblk, ci = begin / nblk % nchunk, gi = begin / (nblk * nchunk) % d->ngroups, n = begin / (nblk * nchunk * d->ngroups);
    for (int64_t t = begin; t < end; t++) {
        const int64_t v0 = bi * FM_CONV_LANES_NV, nv = nvec - v0 < FM_CONV_LANES_NV ? nvec - v0 : FM_CONV_LANES_NV, width = nv * 8;
        const int nz = (int)((nv + 1) / 2);
        const __mmask16 last = nv % 2 ? 0x00FF : 0xFFFF;
        const int64_t c0 = ci * FM_CONV_LANES_COLS, nc = cols - c0 < FM_CONV_LANES_COLS ? cols - c0 : FM_CONV_LANES_COLS;
        const int64_t p0 = gi * pairs / d->ngroups, p1 = (gi + 1) * pairs / d->ngroups;
        const int64_t row_end = d->pool == 2 ? 2 * p1 : (2 * p1 < d->Ho ? 2 * p1 : d->Ho), nrows = row_end - 2 * p0;
        if (FM_LANES512_PAIR && nv == FM_CONV_LANES_NV && bi + 1 < nblk && t + 1 < end && nvec - v0 >= 2 * FM_CONV_LANES_NV) {
            /* this block and the next, both full: one pass over the pixels for 64 channels */
            for (int64_t ic0 = 0; ic0 < d->C; ic0 += d->cc) {
                const int64_t cc = d->C - ic0 < d->cc ? d->C - ic0 : d->cc;
                const float *w0 = d->wp + v0 * 8 * per + ic0 * d->KH * d->KW * 32, *w1 = w0 + 32 * per;
                const float *x = d->xp + ((n * d->C + ic0) * d->Hp + 2 * p0) * d->WS + c0;
                const int64_t ng = (nc + PGMAX - 1) / PGMAX;
                for (int64_t r = 0; r < nrows; r++)
                    for (int64_t g = 0, c = 0; g < ng; g++) {
                        const int64_t ce = (g + 1) * nc / ng, gc = ce - c;
                        groups2[k3][gc - 1](x + r * d->WS + c, d->WS, HpWS, w0, w1, cc, d->KH, d->KW, buf + (r * nc + c) * 32,
                                            buf1 + (r * nc + c) * 32, ic0 == 0);
                        c = ce;
                    }
            }
            fm_conv_lanes_epilogue(d, buf, pooled, n, v0, nv, p0, p1, nrows, c0, nc, nchunk);
            fm_conv_lanes_epilogue(d, buf1, pooled, n, v0 + FM_CONV_LANES_NV, FM_CONV_LANES_NV, p0, p1, nrows, c0, nc, nchunk);
            t++;
            bi += 2;
            if (bi == nblk && (bi = 0, ++ci == nchunk) && (ci = 0, ++gi == d->ngroups)) gi = 0, n++;
            continue;
        }
        for (int64_t ic0 = 0; ic0 < d->C; ic0 += d->cc) {
            const int64_t cc = d->C - ic0 < d->cc ? d->C - ic0 : d->cc;
            const float *w = d->wp + v0 * 8 * per + ic0 * d->KH * d->KW * width;
            const float *x = d->xp + ((n * d->C + ic0) * d->Hp + 2 * p0) * d->WS + c0;
            /* each row's nc pixels in ng groups of consecutive pixels, as even as they come */
            const int64_t ng = (nc + GCMAX - 1) / GCMAX;
            for (int64_t r = 0; r < nrows; r++)
                for (int64_t g = 0, c = 0; g < ng; g++) {
                    const int64_t ce = (g + 1) * nc / ng, gc = ce - c;
                    groups[k3][nz - 1][gc - 1](x + r * d->WS + c, d->WS, HpWS, w, width, last, cc, d->KH, d->KW,
                                               buf + (r * nc + c) * width, ic0 == 0);
                    c = ce;
                }
        }
        fm_conv_lanes_epilogue(d, buf, pooled, n, v0, nv, p0, p1, nrows, c0, nc, nchunk);
        if (++bi == nblk && (bi = 0, ++ci == nchunk) && (ci = 0, ++gi == d->ngroups)) gi = 0, n++;
    }
}
