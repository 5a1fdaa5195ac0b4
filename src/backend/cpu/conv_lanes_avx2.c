/* The output-channels-along-lanes direct conv for AVX2/FMA (conv_lanes.h). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/conv_lanes.h"

enum { NVMAX = FM_CONV_LANES_NV, GCMAX = 3 };

/* One row's sums at GC adjacent output columns for NV channel vectors, over the
 * input channels [0, cc) of a pass: x at the pass's first channel, the row's
 * first tap row and the first column; w at the pass's weights; buf at the first
 * column ([column][NV*8]), loaded first unless `first`. KWC: kW when it is a
 * compile-time constant, else 0 (kw from the argument). Inlined into the
 * instances below with constant NV, GC and KWC, so the loops unroll and the
 * NV*GC accumulators, GC broadcasts and one weight vector stay in registers. */
static inline __attribute__((always_inline)) void group(const int NV, const int GC, const int64_t KWC, const float *x, int64_t WS,
                                                        int64_t HpWS, const float *w, int64_t cc, int64_t KH, int64_t kw_arg,
                                                        float *buf, int first) {
    __m256 acc[NVMAX][GCMAX];
    const int64_t KW = KWC ? KWC : kw_arg;
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
#pragma GCC unroll 3
        for (int p = 0; p < GC; p++) acc[j][p] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(buf + p * NV * 8 + 8 * j);
    for (int64_t ic = 0; ic < cc; ic++, x += HpWS)
        for (int64_t kh = 0; kh < KH; kh++, w += KW * NV * 8) {
            const float *xr = x + kh * WS;
#pragma GCC unroll 8
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *wk = w + kw * NV * 8;
                __m256 xv[GCMAX];
#pragma GCC unroll 3
                for (int p = 0; p < GC; p++) xv[p] = _mm256_broadcast_ss(xr + kw + p);
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

typedef void (*group_fn)(const float *x, int64_t WS, int64_t HpWS, const float *w, int64_t cc, int64_t KH, int64_t KW, float *buf, int first);

#define GROUP(NV, GC, KWC, name)                                                                                                       \
    static void name(const float *x, int64_t WS, int64_t HpWS, const float *w, int64_t cc, int64_t KH, int64_t KW, float *buf, int first) { \
        group(NV, GC, KWC, x, WS, HpWS, w, cc, KH, KW, buf, first);                                                                    \
    }
#define GROUPS(NV)                                                                                                                     \
    GROUP(NV, 3, 3, g##NV##_3_k3) GROUP(NV, 2, 3, g##NV##_2_k3) GROUP(NV, 1, 3, g##NV##_1_k3)                                          \
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

/* max with NaN kept from either side, as max_pool2d */
static inline __m256 nanmax(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

/* The 8 lanes of v to p[0], p[stride], ... (the first n of them). */
static inline void scatter(float *p, int64_t stride, __m256 v, int64_t n) {
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int64_t l = 0; l < n; l++) p[l * stride] = t[l];
}

void fm_conv_lanes_rows_avx2(const fm_conv_lanes *d, int64_t begin, int64_t end) {
    const int64_t nvec = fm_conv_lanes_vectors(d->O), nblk = fm_conv_lanes_blocks(d->O);
    const int64_t per = d->C * d->KH * d->KW, HW = d->Hy * d->Wy, HpWS = d->Hp * d->WS;
    const int64_t cols = d->pool == 2 ? 2 * d->Wy : d->Wo, nchunk = (cols + FM_CONV_LANES_COLS - 1) / FM_CONV_LANES_COLS;
    const int64_t pairs = d->pool == 2 ? d->Hy : (d->Ho + 1) / 2;
    const int k3 = d->KW == 3;
    float buf[2][FM_CONV_LANES_COLS * NVMAX * 8];
    for (int64_t t = begin; t < end; t++) {
        const int64_t bi = t % nblk, ci = t / nblk % nchunk, pr = t / (nblk * nchunk) % pairs, n = t / (nblk * nchunk * pairs);
        const int64_t v0 = bi * NVMAX, nv = nvec - v0 < NVMAX ? nvec - v0 : NVMAX, width = nv * 8;
        const int64_t c0 = ci * FM_CONV_LANES_COLS, nc = cols - c0 < FM_CONV_LANES_COLS ? cols - c0 : FM_CONV_LANES_COLS;
        const int64_t oh = 2 * pr, rows = oh + 1 < d->Ho ? 2 : 1;
        for (int64_t ic0 = 0; ic0 < d->C; ic0 += d->cc) {
            const int64_t cc = d->C - ic0 < d->cc ? d->C - ic0 : d->cc;
            const float *w = d->wp + v0 * 8 * per + ic0 * d->KH * d->KW * width;
            for (int64_t r = 0; r < rows; r++) {
                const float *x = d->xp + ((n * d->C + ic0) * d->Hp + oh + r) * d->WS + c0;
                for (int64_t c = 0; c < nc; c += GCMAX) {
                    const int64_t gc = nc - c < GCMAX ? nc - c : GCMAX;
                    groups[k3][nv - 1][gc - 1](x + c, d->WS, HpWS, w, cc, d->KH, d->KW, buf[r] + c * width, ic0 == 0);
                }
            }
        }
        for (int64_t j = 0; j < nv; j++) { /* bias and ReLU commute with the max: pool, then bias, ReLU */
            const int64_t o0 = (v0 + j) * 8, nl = d->O - o0 < 8 ? d->O - o0 : 8;
            float bt[8] = {0};
            if (d->bias) memcpy(bt, d->bias + o0, sizeof(float) * (size_t)nl);
            const __m256 bv = _mm256_loadu_ps(bt), zero = _mm256_setzero_ps();
            float *yb = d->y + (n * d->O + o0) * HW;
            if (d->pool == 2)
                for (int64_t q = 0; q < nc / 2; q++) {
                    const float *a = buf[0] + 2 * q * width + 8 * j, *b = buf[1] + 2 * q * width + 8 * j;
                    __m256 m = nanmax(nanmax(_mm256_loadu_ps(a), _mm256_loadu_ps(a + width)), nanmax(_mm256_loadu_ps(b), _mm256_loadu_ps(b + width)));
                    m = _mm256_add_ps(m, bv);
                    if (d->relu) m = _mm256_max_ps(zero, m);
                    scatter(yb + pr * d->Wy + c0 / 2 + q, HW, m, nl);
                }
            else
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t q = 0; q < nc; q++) {
                        __m256 m = _mm256_add_ps(_mm256_loadu_ps(buf[r] + q * width + 8 * j), bv);
                        if (d->relu) m = _mm256_max_ps(zero, m);
                        scatter(yb + (oh + r) * d->Wy + c0 + q, HW, m, nl);
                    }
        }
    }
}
