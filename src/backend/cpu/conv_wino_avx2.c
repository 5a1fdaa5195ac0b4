/* Winograd F(2x2, 3x3) with the 2x2 max pool (or none), bias and ReLU on AVX2
 * (conv_wino.h has the scheme and the layouts; conv_wino_avx512.c is the same
 * kernel on 16 lanes).
 *
 * The same arithmetic as the AVX-512 kernel in the same order: the transforms'
 * additions, the GEMMs' FMAs over the input channels in turn, the output
 * transform, so the two levels give bitwise equal outputs (tests/test_isa_kernels.c
 * checks it where both run). What differs is how the data moves, for want of
 * AVX-512's masked loads, expand-loads and scatters:
 * - the input is always the zero-padded copy, padded to fm_conv_wino_avx2_geometry's
 *   rows and columns, so that a step of 8 tiles reads its 18 columns with plain
 *   loads (columns past the tiles read the copy's zeros or the next row);
 * - V's rows are fm_conv_wino_v_stride apart, so a step's 8-lane stores may run past
 *   the last tile of a row into the slack instead of needing masks;
 * - the outputs go through 8x8 transposes to whole-vector stores (channel planes'
 *   runs of 8 pixels), with scalar stores only for a run's tail.
 *
 * B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
 * A^T = [1 1 1 0; 0 1 -1 -1]. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/conv_lanes.h"
#include "backend/cpu/conv_wino.h"

void fm_conv_wino_weights_avx2(const float *wp, float *u, int64_t O, int64_t C) {
    const int64_t per = C * 9, lanes = fm_conv_lanes_vectors(O) * 8;
    const __m256 half = _mm256_set1_ps(0.5f);
    const int64_t us = fm_conv_wino_u_stride(C, O);
    for (int64_t o0 = 0; o0 < O; o0 += 8) {
        /* o0's 8 channels in the lanes packing: block o0 / 32, width 32 (less for a last block) */
        const int64_t bi = o0 / 32, width = lanes - bi * 32 < 32 ? lanes - bi * 32 : 32;
        const float *base = wp + bi * 32 * per + o0 % 32;
        for (int64_t c = 0; c < C; c++) {
            __m256 g[9], t[4][3];
            for (int k = 0; k < 9; k++) g[k] = _mm256_loadu_ps(base + (c * 9 + k) * width);
            for (int j = 0; j < 3; j++) { /* G g: the rows */
                const __m256 ac = _mm256_add_ps(g[j], g[6 + j]);
                t[0][j] = g[j];
                t[1][j] = _mm256_mul_ps(half, _mm256_add_ps(ac, g[3 + j]));
                t[2][j] = _mm256_mul_ps(half, _mm256_sub_ps(ac, g[3 + j]));
                t[3][j] = g[6 + j];
            }
            for (int i = 0; i < 4; i++) { /* (G g) G^T: the columns */
                const __m256 ac = _mm256_add_ps(t[i][0], t[i][2]);
                float *dst = u + 4 * i * us + c * O + o0;
                _mm256_storeu_ps(dst, t[i][0]);
                _mm256_storeu_ps(dst + us, _mm256_mul_ps(half, _mm256_add_ps(ac, t[i][1])));
                _mm256_storeu_ps(dst + 2 * us, _mm256_mul_ps(half, _mm256_sub_ps(ac, t[i][1])));
                _mm256_storeu_ps(dst + 3 * us, t[i][2]);
            }
        }
    }
}

/* The even and the odd columns of a, b (16 consecutive columns), in order. */
static inline __m256 evens(__m256 a, __m256 b) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
}
static inline __m256 odds(__m256 a, __m256 b) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

/* B^T d B for tile rows [r0, r1) of sample n into V [16][C][vs]: per channel and
 * tile row, 8 tiles a step (lane j: tile tj0 + j, whose patch starts at padded
 * column 2 (tj0 + j)). */
static void input_transform(const fm_conv_wino *d, int64_t n, int64_t r0, int64_t r1, float *V, int64_t vs) {
    const int64_t CV = d->C * vs;
    for (int64_t c = 0; c < d->C; c++) {
        const float *plane = d->xp + (n * d->C + c) * d->Hp * d->WS;
        for (int64_t ti = r0; ti < r1; ti++)
            for (int64_t tj0 = 0; tj0 < d->Wy; tj0 += 8) {
                const float *row = plane + 2 * ti * d->WS + 2 * tj0;
                __m256 e[4][4]; /* row k of the patches, column offset j */
                for (int k = 0; k < 4; k++) {
                    const float *r = row + k * d->WS;
                    const __m256 a = _mm256_loadu_ps(r), b = _mm256_loadu_ps(r + 8);
                    const __m256 a2 = _mm256_loadu_ps(r + 2), b2 = _mm256_loadu_ps(r + 10);
                    e[k][0] = evens(a, b), e[k][1] = odds(a, b), e[k][2] = evens(a2, b2), e[k][3] = odds(a2, b2);
                }
                float *dst = V + c * vs + (ti - r0) * d->Wy + tj0;
                for (int k = 0; k < 4; k++) {
                    __m256 t[4]; /* the rows' combination k at each column offset */
                    for (int j = 0; j < 4; j++) {
                        const __m256 d0 = e[0][j], d1 = e[1][j], d2 = e[2][j], d3 = e[3][j];
                        t[j] = k == 0 ? _mm256_sub_ps(d0, d2) : k == 1 ? _mm256_add_ps(d1, d2) : k == 2 ? _mm256_sub_ps(d2, d1) : _mm256_sub_ps(d1, d3);
                    }
                    float *dk = dst + 4 * k * CV;
                    _mm256_storeu_ps(dk, _mm256_sub_ps(t[0], t[2]));
                    _mm256_storeu_ps(dk + CV, _mm256_add_ps(t[1], t[2]));
                    _mm256_storeu_ps(dk + 2 * CV, _mm256_sub_ps(t[2], t[1]));
                    _mm256_storeu_ps(dk + 3 * CV, _mm256_sub_ps(t[1], t[3]));
                }
            }
    }
}

/* M[p][16 channels] = sum over c of V[c][p] U[c][16 channels], GC tiles (12 accumulators at 6) */
static inline __attribute__((always_inline)) void gemm_tile(const int GC, const float *v, int64_t vs, const float *u, int64_t O, int64_t C,
                                                            float *m) {
    __m256 acc[2][6];
#pragma GCC unroll 6
    for (int p = 0; p < GC; p++) acc[0][p] = _mm256_setzero_ps(), acc[1][p] = _mm256_setzero_ps();
    for (int64_t c = 0; c < C; c++, v += vs, u += O) {
        const __m256 w0 = _mm256_loadu_ps(u), w1 = _mm256_loadu_ps(u + 8);
#pragma GCC unroll 6
        for (int p = 0; p < GC; p++) {
            const __m256 xv = _mm256_broadcast_ss(v + p);
            acc[0][p] = _mm256_fmadd_ps(w0, xv, acc[0][p]);
            acc[1][p] = _mm256_fmadd_ps(w1, xv, acc[1][p]);
        }
    }
#pragma GCC unroll 6
    for (int p = 0; p < GC; p++) _mm256_storeu_ps(m + p * O, acc[0][p]), _mm256_storeu_ps(m + p * O + 8, acc[1][p]);
}

typedef void (*tile_fn)(const float *v, int64_t vs, const float *u, int64_t O, int64_t C, float *m);
#define TILE(GC)                                                                                                       \
    static void t##GC(const float *v, int64_t vs, const float *u, int64_t O, int64_t C, float *m) { gemm_tile(GC, v, vs, u, O, C, m); }
TILE(1)
TILE(2)
TILE(3)
TILE(4)
TILE(5)
TILE(6)
static const tile_fn tiles[6] = {t1, t2, t3, t4, t5, t6};

/* max with NaN kept from either side, as max_pool2d (max_ps returns its second operand on a NaN) */
static inline __m256 nanmax(__m256 a, __m256 b) { return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)); }

/* A^T m A of one tile's 8 channels (S floats between the 16 products): y00, y01, y10, y11. */
static inline void tile_outputs(const float *mm, int64_t S, __m256 y[4]) {
    __m256 s0[4], s1[4];
    for (int k = 0; k < 4; k++) {
        const __m256 a = _mm256_loadu_ps(mm + k * S), b = _mm256_loadu_ps(mm + (4 + k) * S);
        const __m256 c = _mm256_loadu_ps(mm + (8 + k) * S), e = _mm256_loadu_ps(mm + (12 + k) * S);
        s0[k] = _mm256_add_ps(_mm256_add_ps(a, b), c);
        s1[k] = _mm256_sub_ps(_mm256_sub_ps(b, c), e);
    }
    y[0] = _mm256_add_ps(_mm256_add_ps(s0[0], s0[1]), s0[2]), y[1] = _mm256_sub_ps(_mm256_sub_ps(s0[1], s0[2]), s0[3]);
    y[2] = _mm256_add_ps(_mm256_add_ps(s1[0], s1[1]), s1[2]), y[3] = _mm256_sub_ps(_mm256_sub_ps(s1[1], s1[2]), s1[3]);
}

/* r[j] (8 lanes) -> r[c] holding lane c of every r[j] in lane j. */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]), t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    for (int b = 0; b < 2; b++) { /* s[4b + k], 128-bit lane L: column 4L + k of rows 4b .. 4b + 3 */
        s[4 * b] = _mm256_shuffle_ps(t[4 * b], t[4 * b + 2], 0x44), s[4 * b + 1] = _mm256_shuffle_ps(t[4 * b], t[4 * b + 2], 0xEE);
        s[4 * b + 2] = _mm256_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0x44), s[4 * b + 3] = _mm256_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) r[k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x20), r[4 + k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x31);
}

/* The first n (<= 8) lanes of v to dst. */
static inline void store_n(float *dst, __m256 v, int64_t n) {
    if (n == 8) {
        _mm256_storeu_ps(dst, v);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    memcpy(dst, tmp, sizeof(float) * (size_t)n);
}

static inline __m256 bias_relu(const fm_conv_wino *d, __m256 v, __m256 bias) {
    v = _mm256_add_ps(v, bias);
    return d->relu ? _mm256_max_ps(_mm256_setzero_ps(), v) : v; /* NaN stays (the second operand) */
}

/* Without a pool: 4 tiles of a tile row at a time (8 output columns), per 8
 * channels: bias and ReLU on the tiles' outputs, an 8x8 transpose of each output
 * row's values, one store per channel and row inside the Ho x Wo output. */
static void store_rows(const fm_conv_wino *d, const float *M, int64_t nt, float *y, int64_t HW, int64_t t0, int64_t olo, int64_t ohi) {
    const int64_t O = d->O, S = nt * O, Wy = d->Wy, g0 = t0 / Wy; /* a task holds whole tile rows */
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t rr = 0; rr < nt / Wy; rr++) {
        const int64_t oh = 2 * (g0 + rr);
        for (int64_t o0 = olo; o0 < ohi; o0 += 8) {
            const __m256 bias = d->bias ? _mm256_loadu_ps(d->bias + o0) : zero;
            for (int64_t gc0 = 0; gc0 < Wy; gc0 += 4) {
                const int64_t n4 = Wy - gc0 < 4 ? Wy - gc0 : 4, cols = d->Wo - 2 * gc0 < 8 ? d->Wo - 2 * gc0 : 8;
                __m256 r0[8], r1[8];
                for (int64_t q = 0; q < 4; q++) {
                    __m256 v[4] = {zero, zero, zero, zero};
                    if (q < n4) tile_outputs(M + (rr * Wy + gc0 + q) * O + o0, S, v);
                    for (int k = 0; k < 4; k++) v[k] = bias_relu(d, v[k], bias);
                    r0[2 * q] = v[0], r0[2 * q + 1] = v[1], r1[2 * q] = v[2], r1[2 * q + 1] = v[3];
                }
                float *yc = y + o0 * HW + oh * d->Wo + 2 * gc0;
                transpose8(r0);
                for (int c = 0; c < 8; c++) store_n(yc + c * HW, r0[c], cols);
                if (oh + 1 >= d->Ho) continue;
                transpose8(r1);
                for (int c = 0; c < 8; c++) store_n(yc + c * HW + d->Wo, r1[c], cols);
            }
        }
    }
}

/* A^T m A of each tile, then with the pool the max of its 4 outputs, bias, ReLU;
 * 8 tiles (consecutive pooled pixels) x 8 channels transposed to runs of 8 pixels
 * in each channel's plane (y at plane o0 = 0, HW floats a plane); without, store_rows.
 * t0: the task's first tile; [olo, ohi): its output channels. */
static void output_transform(const fm_conv_wino *d, const float *M, int64_t nt, float *y, int64_t HW, int64_t t0, int64_t olo,
                             int64_t ohi) {
    if (!d->pool) {
        store_rows(d, M, nt, y, HW, t0, olo, ohi);
        return;
    }
    const int64_t O = d->O, S = nt * O;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t o0 = olo; o0 < ohi; o0 += 8) {
        const __m256 bias = d->bias ? _mm256_loadu_ps(d->bias + o0) : zero;
        for (int64_t t = 0; t < nt; t += 8) {
            const int64_t n8 = nt - t < 8 ? nt - t : 8;
            __m256 r[8];
            for (int64_t q = 0; q < 8; q++) {
                if (q >= n8) {
                    r[q] = zero;
                    continue;
                }
                __m256 v[4];
                tile_outputs(M + (t + q) * O + o0, S, v);
                r[q] = bias_relu(d, nanmax(nanmax(v[0], v[1]), nanmax(v[2], v[3])), bias); /* bias and ReLU commute with the max */
            }
            transpose8(r);
            for (int c = 0; c < 8; c++) store_n(y + (o0 + c) * HW + t0 + t, r[c], n8);
        }
    }
}

static void task(const fm_conv_wino *d, int64_t n, int64_t r0, int64_t r1, int64_t olo, int64_t ohi, float *ws) {
    const int64_t nt = (r1 - r0) * d->Wy, C = d->C, O = d->O, vs = fm_conv_wino_v_stride(nt);
    float *V = ws, *M = V + 16 * C * vs;
    input_transform(d, n, r0, r1, V, vs);
    /* Per transform position: the 16-channel column blocks of U outside, the groups of up to 6
     * tiles inside, so that a block (C x 16 floats) is read from memory once a task and then
     * from L1 while V (C x vs floats) stays in L2. Groups outside re-read all of U for every
     * group: ResNet-18's 512-channel layer (U 16 MB, 16 tiles) ran at 0.75x the lanes kernel
     * that way, Zen 3 (bench_isa_kernels --only wino). */
    const int64_t ng = (nt + 5) / 6;
    for (int xi = 0; xi < 16; xi++) {
        const float *Vx = V + xi * C * vs, *Ux = d->u + xi * fm_conv_wino_u_stride(C, O);
        float *Mx = M + xi * nt * O;
        for (int64_t o0 = olo; o0 < ohi; o0 += 16)
            for (int64_t g = 0, t = 0; g < ng; g++) {
                const int64_t te = (g + 1) * nt / ng;
                tiles[te - t - 1](Vx + t, vs, Ux + o0, O, C, Mx + t * O + o0);
                t = te;
            }
    }
    const int64_t HW = d->pool ? d->Hy * d->Wy : d->Ho * d->Wo;
    output_transform(d, M, nt, d->y + n * O * HW, HW, r0 * d->Wy, olo, ohi);
}

void fm_conv_wino_rows_avx2(const fm_conv_wino *d, int64_t begin, int64_t end, float *ws) {
    const int64_t nob = d->nob > 0 ? d->nob : 1, per = d->nblk * nob, blocks = d->O / 16;
    for (int64_t k = begin; k < end; k++) {
        const int64_t n = k / per, b = k % per / nob, ob = k % nob;
        task(d, n, b * d->Hy / d->nblk, (b + 1) * d->Hy / d->nblk, ob * blocks / nob * 16, (ob + 1) * blocks / nob * 16, ws);
    }
}
