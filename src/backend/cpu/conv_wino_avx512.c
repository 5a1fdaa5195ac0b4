/* Winograd F(2x2, 3x3) with the 2x2 max pool, bias and ReLU on AVX-512
 * (conv_wino.h has the scheme and the layouts). The weights are transformed by
 * conv_wino_avx2.c's fm_conv_wino_weights_avx2 at both levels (once, at pack time).
 *
 * B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
 * A^T = [1 1 1 0; 0 1 -1 -1]. */
#include <immintrin.h>
#include <stdlib.h>

#include "backend/cpu/conv_lanes.h"
#include "backend/cpu/conv_wino.h"

/* B^T d B for tile rows [r0, r1) of sample n into V [16][C][nt]: per channel and
 * tile row, 7 tiles at a time (16 input columns in one vector). */
static void input_transform(const fm_conv_wino *d, int64_t n, int64_t r0, int64_t r1, float *V, int64_t nt) {
    const __m512i i0 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i1 = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i2 = _mm512_setr_epi32(2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i3 = _mm512_setr_epi32(3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const int64_t CT = d->C * nt;
    for (int64_t c = 0; c < d->C; c++) {
        const float *plane = d->x ? d->x + (n * d->C + c) * d->H * d->W : d->xp + (n * d->C + c) * d->Hp * d->WS;
        for (int64_t ti = r0; ti < r1; ti++)
            for (int64_t tj0 = 0; tj0 < d->Wy; tj0 += 7) {
                const int64_t ntj = d->Wy - tj0 < 7 ? d->Wy - tj0 : 7;
                const __mmask16 lm = (__mmask16)((1u << (2 * ntj + 2)) - 1), sm = (__mmask16)((1u << ntj) - 1);
                __m512 dr[4];
                if (d->x) {
                    /* lane l holds padded column 2 tj0 + l = input column ic0 + l; the lanes inside
                     * the row, [lo, hi), are expand-loaded from the row's first one (never before it) */
                    const int64_t ic0 = 2 * tj0 - d->pw, lo = ic0 < 0 ? -ic0 : 0, hi = d->W - ic0 < 16 ? d->W - ic0 : 16;
                    const __mmask16 cm = hi > lo ? (__mmask16)(lm & ((1u << hi) - 1) & ~((1u << lo) - 1)) : 0;
                    for (int k = 0; k < 4; k++) {
                        const int64_t ir = 2 * ti + k - d->ph;
                        dr[k] = ir >= 0 && ir < d->H && cm ? _mm512_maskz_expandloadu_ps(cm, plane + ir * d->W + ic0 + lo) : _mm512_setzero_ps();
                    }
                } else {
                    const float *row = plane + 2 * ti * d->WS + 2 * tj0;
                    for (int k = 0; k < 4; k++) dr[k] = _mm512_maskz_loadu_ps(lm, row + k * d->WS);
                }
                const __m512 d0 = dr[0], d1 = dr[1], d2 = dr[2], d3 = dr[3];
                const __m512 t[4] = {_mm512_sub_ps(d0, d2), _mm512_add_ps(d1, d2), _mm512_sub_ps(d2, d1), _mm512_sub_ps(d1, d3)};
                float *dst = V + c * nt + (ti - r0) * d->Wy + tj0;
                for (int k = 0; k < 4; k++) {
                    const __m512 e0 = _mm512_permutexvar_ps(i0, t[k]), e1 = _mm512_permutexvar_ps(i1, t[k]);
                    const __m512 e2 = _mm512_permutexvar_ps(i2, t[k]), e3 = _mm512_permutexvar_ps(i3, t[k]);
                    float *dk = dst + 4 * k * CT;
                    _mm512_mask_storeu_ps(dk, sm, _mm512_sub_ps(e0, e2));
                    _mm512_mask_storeu_ps(dk + CT, sm, _mm512_add_ps(e1, e2));
                    _mm512_mask_storeu_ps(dk + 2 * CT, sm, _mm512_sub_ps(e2, e1));
                    _mm512_mask_storeu_ps(dk + 3 * CT, sm, _mm512_sub_ps(e1, e3));
                }
            }
    }
}

/* M[p][16 j..] = sum over c of V[c][p] U[c][16 j..], GC tiles x NZ vectors of 16 channels */
static inline __attribute__((always_inline)) void gemm_tile(const int NZ, const int GC, const float *v, int64_t nt, const float *u,
                                                            int64_t O, int64_t C, float *m) {
    __m512 acc[4][6];
#pragma GCC unroll 4
    for (int j = 0; j < NZ; j++)
#pragma GCC unroll 6
        for (int p = 0; p < GC; p++) acc[j][p] = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; c++, v += nt, u += O) {
        __m512 w[4];
#pragma GCC unroll 4
        for (int j = 0; j < NZ; j++) w[j] = _mm512_loadu_ps(u + 16 * j);
#pragma GCC unroll 6
        for (int p = 0; p < GC; p++) {
            const __m512 xv = _mm512_set1_ps(v[p]);
#pragma GCC unroll 4
            for (int j = 0; j < NZ; j++) acc[j][p] = _mm512_fmadd_ps(w[j], xv, acc[j][p]);
        }
    }
#pragma GCC unroll 6
    for (int p = 0; p < GC; p++)
#pragma GCC unroll 4
        for (int j = 0; j < NZ; j++) _mm512_storeu_ps(m + p * O + 16 * j, acc[j][p]);
}

typedef void (*tile_fn)(const float *v, int64_t nt, const float *u, int64_t O, int64_t C, float *m);
#define TILE(NZ, GC)                                                                                                   \
    static void t##NZ##_##GC(const float *v, int64_t nt, const float *u, int64_t O, int64_t C, float *m) {             \
        gemm_tile(NZ, GC, v, nt, u, O, C, m);                                                                          \
    }
#define TILES(NZ) TILE(NZ, 1) TILE(NZ, 2) TILE(NZ, 3) TILE(NZ, 4) TILE(NZ, 5) TILE(NZ, 6)
TILES(1)
TILES(2)
TILES(3)
TILES(4)
#define TROW(NZ) {t##NZ##_1, t##NZ##_2, t##NZ##_3, t##NZ##_4, t##NZ##_5, t##NZ##_6}
static const tile_fn tiles[4][6] = {TROW(1), TROW(2), TROW(3), TROW(4)};

/* max with NaN kept from either side, as max_pool2d */
static inline __m512 nanmax(__m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
}

/* A^T m A of tile t's 16 channels (m at M + t O + o0; S floats between the 16 products):
 * the tile's four outputs y00, y01 (its first row), y10, y11. */
static inline void tile_outputs(const float *mm, int64_t S, __m512 y[4]) {
    __m512 s0[4], s1[4];
    for (int k = 0; k < 4; k++) {
        const __m512 a = _mm512_loadu_ps(mm + k * S), b = _mm512_loadu_ps(mm + (4 + k) * S);
        const __m512 c = _mm512_loadu_ps(mm + (8 + k) * S), e = _mm512_loadu_ps(mm + (12 + k) * S);
        s0[k] = _mm512_add_ps(_mm512_add_ps(a, b), c);
        s1[k] = _mm512_sub_ps(_mm512_sub_ps(b, c), e);
    }
    y[0] = _mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]), y[1] = _mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3]);
    y[2] = _mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]), y[3] = _mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3]);
}

/* r[j] (16 lanes) -> r[c] holding lane c of every r[j] in lane j: unpacks within the
 * 128-bit lanes, then 128-bit shuffles across the registers. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]), t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    for (int b = 0; b < 4; b++) { /* u[4b + k], 128-bit lane L: column 4L + k of rows 4b .. 4b + 3 */
        u[4 * b] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0x44), u[4 * b + 1] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0xEE);
        u[4 * b + 2] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0x44), u[4 * b + 3] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        const __m512 p0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), p1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
        const __m512 q0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44), q1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
        r[k] = _mm512_shuffle_f32x4(p0, q0, 0x88), r[4 + k] = _mm512_shuffle_f32x4(p0, q0, 0xDD);
        r[8 + k] = _mm512_shuffle_f32x4(p1, q1, 0x88), r[12 + k] = _mm512_shuffle_f32x4(p1, q1, 0xDD);
    }
}

/* Without a pool: 8 tiles of a tile row at a time (16 output columns), per 16 channels:
 * bias and ReLU on the tiles' outputs, then a 16 x 16 transpose of each output row's
 * values (tiles' outputs by channel -> channels' 16 columns) and one masked vector store
 * per channel and row, where the row and columns lie inside the Ho x Wo output. This
 * replaced a scatter of every output to its 16 channel planes (4 per tile, 16 lanes
 * each), 13% of SqueezeNet's compiled graph at batch 8 on an AMD EPYC Zen 5. */
static void store_rows(const fm_conv_wino *d, const float *M, int64_t nt, float *y, int64_t HW, int64_t t0) {
    const int64_t O = d->O, S = nt * O, Wy = d->Wy, g0 = t0 / Wy; /* a task holds whole tile rows */
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t rr = 0; rr < nt / Wy; rr++) {
        const int64_t oh = 2 * (g0 + rr);
        for (int64_t o0 = 0; o0 < O; o0 += 16) {
            const __m512 bias = d->bias ? _mm512_loadu_ps(d->bias + o0) : zero;
            for (int64_t gc0 = 0; gc0 < Wy; gc0 += 8) {
                const int64_t n8 = Wy - gc0 < 8 ? Wy - gc0 : 8, cols = d->Wo - 2 * gc0 < 16 ? d->Wo - 2 * gc0 : 16;
                __m512 r0[16], r1[16];
                for (int64_t q = 0; q < 8; q++) {
                    __m512 v[4] = {zero, zero, zero, zero};
                    if (q < n8) tile_outputs(M + (rr * Wy + gc0 + q) * O + o0, S, v);
                    for (int k = 0; k < 4; k++) {
                        v[k] = _mm512_add_ps(v[k], bias);
                        if (d->relu) v[k] = _mm512_max_ps(zero, v[k]); /* NaN stays (the second operand) */
                    }
                    r0[2 * q] = v[0], r0[2 * q + 1] = v[1], r1[2 * q] = v[2], r1[2 * q + 1] = v[3];
                }
                const __mmask16 m = (__mmask16)((1u << cols) - 1);
                float *yc = y + o0 * HW + oh * d->Wo + 2 * gc0;
                transpose16(r0);
                for (int c = 0; c < 16; c++) _mm512_mask_storeu_ps(yc + c * HW, m, r0[c]);
                if (oh + 1 >= d->Ho) continue;
                transpose16(r1);
                for (int c = 0; c < 16; c++) _mm512_mask_storeu_ps(yc + c * HW + d->Wo, m, r1[c]);
            }
        }
    }
}

/* A^T m A of each tile, then with the pool the max of its 4 outputs, bias, ReLU,
 * scattered to the 16 channels' NCHW planes (y at plane o0 = 0, HW floats a plane);
 * without, store_rows. t0: the task's first tile. */
static void output_transform(const fm_conv_wino *d, const float *M, int64_t nt, float *y, int64_t HW, int64_t t0) {
    if (!d->pool) {
        store_rows(d, M, nt, y, HW, t0);
        return;
    }
    const int64_t O = d->O, S = nt * O;
    const __m512 zero = _mm512_setzero_ps();
    const __m512i planes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32((int)HW));
    for (int64_t t = 0; t < nt; t++)
        for (int64_t o0 = 0; o0 < O; o0 += 16) {
            __m512 v[4];
            tile_outputs(M + t * O + o0, S, v);
            __m512 r = nanmax(nanmax(v[0], v[1]), nanmax(v[2], v[3])); /* bias and ReLU commute with the max */
            if (d->bias) r = _mm512_add_ps(r, _mm512_loadu_ps(d->bias + o0));
            if (d->relu) r = _mm512_max_ps(zero, r); /* NaN stays (the second operand) */
            _mm512_i32scatter_ps(y + o0 * HW + t0 + t, planes, r, 4);
        }
}

static void task(const fm_conv_wino *d, int64_t n, int64_t r0, int64_t r1, float *ws) {
    const int64_t nt = (r1 - r0) * d->Wy, C = d->C, O = d->O;
    float *V = ws, *M = V + 16 * C * nt;
    input_transform(d, n, r0, r1, V, nt);
    const int64_t ng = (nt + 5) / 6;
    for (int xi = 0; xi < 16; xi++) {
        const float *Vx = V + xi * C * nt, *Ux = d->u + xi * fm_conv_wino_u_stride(C, O);
        float *Mx = M + xi * nt * O;
        for (int64_t g = 0, t = 0; g < ng; g++) {
            const int64_t te = (g + 1) * nt / ng, gc = te - t;
            for (int64_t o0 = 0; o0 < O; o0 += 64) {
                const int64_t nz = (O - o0) / 16 < 4 ? (O - o0) / 16 : 4;
                tiles[nz - 1][gc - 1](Vx + t, nt, Ux + o0, O, C, Mx + t * O + o0);
            }
            t = te;
        }
    }
    const int64_t HW = d->pool ? d->Hy * d->Wy : d->Ho * d->Wo;
    output_transform(d, M, nt, d->y + n * O * HW, HW, r0 * d->Wy);
}

void fm_conv_wino_rows_avx512(const fm_conv_wino *d, int64_t begin, int64_t end, float *ws) {
    for (int64_t k = begin; k < end; k++) {
        const int64_t n = k / d->nblk, b = k % d->nblk;
        task(d, n, b * d->Hy / d->nblk, (b + 1) * d->Hy / d->nblk, ws);
    }
}
