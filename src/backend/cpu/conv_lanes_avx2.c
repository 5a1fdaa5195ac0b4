/* The output-channels-along-lanes direct conv for AVX2/FMA (conv_lanes.h). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/conv_lanes.h"
#include "backend/cpu/conv_lanes_epilogue.h"

enum { NVMAX = FM_CONV_LANES_NV, GCMAX = 3 };

/* The sums at GC output pixels for NV channel vectors, over the input channels
 * [0, cc) of a pass: pixel p reads the input at x + off[p] (x at the pass's
 * first channel, the task's first row and column; off[p] = row * WS + column,
 * so the pixels of a group may lie in two rows); w at the pass's weights; buf at
 * the group's first pixel ([pixel][NV*8]), loaded first unless `first`. KWC: kW
 * when it is a compile-time constant, else 0 (kw from the argument). Inlined
 * into the instances below with constant NV, GC and KWC, so the loops unroll and
 * the NV*GC accumulators, GC broadcasts and one weight vector stay in registers. */
static inline __attribute__((always_inline)) void group(const int NV, const int GC, const int64_t KWC, const float *x,
                                                        const int64_t *off, int64_t WS, int64_t HpWS, const float *w,
                                                        int64_t cc, int64_t KH, int64_t kw_arg, float *buf, int first) {
    __m256 acc[NVMAX][GCMAX];
    const int64_t KW = KWC ? KWC : kw_arg;
    const float *xp[GCMAX];
#pragma GCC unroll 3
    for (int p = 0; p < GC; p++) xp[p] = x + off[p];
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
#pragma GCC unroll 3
        for (int p = 0; p < GC; p++) acc[j][p] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(buf + p * NV * 8 + 8 * j);
    for (int64_t ic = 0; ic < cc; ic++)
        for (int64_t kh = 0; kh < KH; kh++, w += KW * NV * 8) {
            const int64_t ro = ic * HpWS + kh * WS;
#pragma GCC unroll 8
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *wk = w + kw * NV * 8;
                __m256 xv[GCMAX];
#pragma GCC unroll 3
                for (int p = 0; p < GC; p++) xv[p] = _mm256_broadcast_ss(xp[p] + ro + kw);
#pragma GCC unroll 4
                for (int j = 0; j < NV; j++) {
                    const __m256 wv = _mm256_loadu_ps(wk + 8 * j);
#pragma GCC unroll 3
                    for (int p = 0; p < GC; p++) acc[j][p] = _mm256_fmadd_ps(wv, xv[p], acc[j][p]);
                }
            }
        }
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
#pragma GCC unroll 3
        for (int p = 0; p < GC; p++) _mm256_storeu_ps(buf + p * NV * 8 + 8 * j, acc[j][p]);
}

typedef void (*group_fn)(const float *x, const int64_t *off, int64_t WS, int64_t HpWS, const float *w, int64_t cc, int64_t KH,
                         int64_t KW, float *buf, int first);

#define GROUP(NV, GC, KWC, name)                                                                                       \
    static void name(const float *x, const int64_t *off, int64_t WS, int64_t HpWS, const float *w, int64_t cc,          \
                     int64_t KH, int64_t KW, float *buf, int first) {                                                   \
        group(NV, GC, KWC, x, off, WS, HpWS, w, cc, KH, KW, buf, first);                                                \
    }
#define GROUPS(NV)                                                                                                     \
    GROUP(NV, 3, 3, g##NV##_3_k3) GROUP(NV, 2, 3, g##NV##_2_k3) GROUP(NV, 1, 3, g##NV##_1_k3)                          \
    GROUP(NV, 3, 0, g##NV##_3_kn) GROUP(NV, 2, 0, g##NV##_2_kn) GROUP(NV, 1, 0, g##NV##_1_kn)
GROUPS(1)
GROUPS(2)
GROUPS(3)
GROUPS(4)

/* [kW is 3][NV - 1][GC - 1] */
static const group_fn groups[2][NVMAX][GCMAX] = {
    {{g1_1_kn, g1_2_kn, g1_3_kn}, {g2_1_kn, g2_2_kn, g2_3_kn}, {g3_1_kn, g3_2_kn, g3_3_kn}, {g4_1_kn, g4_2_kn, g4_3_kn}},
    {{g1_1_k3, g1_2_k3, g1_3_k3}, {g2_1_k3, g2_2_k3, g2_3_k3}, {g3_1_k3, g3_2_k3, g3_3_k3}, {g4_1_k3, g4_2_k3, g4_3_k3}},
};

void fm_conv_lanes_pad_avx2(const float *x, float *xp, int64_t H, int64_t W, int64_t Hp, int64_t WS, int64_t ph, int64_t pw) {
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t h = 0; h < Hp; h++) {
        float *r = xp + h * WS;
        int64_t i = 0;
        for (; i + 8 <= WS; i += 8) _mm256_storeu_ps(r + i, zero);
        for (; i < WS; i++) r[i] = 0.0f;
        if (h < ph || h >= ph + H) continue;
        const float *s = x + (h - ph) * W;
        float *d = r + pw;
        if (W < 8) {
            for (i = 0; i < W; i++) d[i] = s[i];
            continue;
        }
        for (i = 0; i + 8 <= W; i += 8) _mm256_storeu_ps(d + i, _mm256_loadu_ps(s + i));
        if (i < W) _mm256_storeu_ps(d + W - 8, _mm256_loadu_ps(s + W - 8)); /* the last 8, overlapping */
    }
}

void fm_conv_lanes_rows_avx2(const fm_conv_lanes *d, int64_t begin, int64_t end) {
    const int64_t nvec = fm_conv_lanes_vectors(d->O), nblk = fm_conv_lanes_blocks(d->O);
    const int64_t per = d->C * d->KH * d->KW, HpWS = d->Hp * d->WS;
    const int64_t cols = fm_conv_lanes_cols(d), nchunk = fm_conv_lanes_chunks(d), pairs = fm_conv_lanes_pairs(d);
    const int k3 = d->KW == 3;
    float buf[FM_CONV_LANES_PIX * NVMAX * 8], pooled[FM_CONV_LANES_PIX / 4 * NVMAX * 8];
    /* task t = ((n * ngroups + gi) * nchunk + ci) * nblk + bi, counted up without divisions */
    int64_t bi = begin % nblk, ci = begin / nblk % nchunk, gi = begin / (nblk * nchunk) % d->ngroups, n = begin / (nblk * nchunk * d->ngroups);
    for (int64_t t = begin; t < end; t++) {
        const int64_t v0 = bi * NVMAX, nv = nvec - v0 < NVMAX ? nvec - v0 : NVMAX, width = nv * 8;
        const int64_t c0 = ci * FM_CONV_LANES_COLS, nc = cols - c0 < FM_CONV_LANES_COLS ? cols - c0 : FM_CONV_LANES_COLS;
        const int64_t p0 = gi * pairs / d->ngroups, p1 = (gi + 1) * pairs / d->ngroups;
        const int64_t row_end = d->pool == 2 ? 2 * p1 : (2 * p1 < d->Ho ? 2 * p1 : d->Ho), nrows = row_end - 2 * p0;
        const int64_t npix = nrows * nc;
        for (int64_t ic0 = 0; ic0 < d->C; ic0 += d->cc) {
            const int64_t cc = d->C - ic0 < d->cc ? d->C - ic0 : d->cc;
            const float *w = d->wp + v0 * 8 * per + ic0 * d->KH * d->KW * width;
            const float *x = d->xp + ((n * d->C + ic0) * d->Hp + 2 * p0) * d->WS + c0;
            int64_t r = 0, c = 0; /* pixel i's row and column in the task */
            for (int64_t i = 0; i < npix; i += GCMAX) {
                const int64_t gc = npix - i < GCMAX ? npix - i : GCMAX;
                int64_t off[GCMAX] = {0, 0, 0};
                for (int64_t p = 0; p < gc; p++) {
                    off[p] = r * d->WS + c;
                    if (++c == nc) c = 0, r++;
                }
                groups[k3][nv - 1][gc - 1](x, off, d->WS, HpWS, w, cc, d->KH, d->KW, buf + i * width, ic0 == 0);
            }
        }
        fm_conv_lanes_epilogue(d, buf, pooled, n, v0, nv, p0, p1, nrows, c0, nc, nchunk);
        if (++bi == nblk && (bi = 0, ++ci == nchunk) && (ci = 0, ++gi == d->ngroups)) gi = 0, n++;
    }
}
