/* The 1x1 convolution's AVX2 kernel and its runner (conv_pw.h says why it exists
 * and how the work is laid out). */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_pw.h"
#include "core/parallel.h"

enum { MR = 6, NR = 16, PW_GROUP = 4 }; /* PW_GROUP: 6-row panels run over a column tile before the next tile */

typedef struct pw_job {
    const fm_conv_pw *d;
    float *bufs;         /* per pool thread: nb packed column tiles [C][NR], then a [MR][NR] tile */
    int64_t per;         /* floats per thread */
    int64_t ntiles, nb;  /* 16-column tiles; tiles per block */
    int64_t nop;         /* 6-row panels of the output channels */
    int64_t split, opc;  /* output-channel chunks per block, panels per chunk */
    bool clamp;
} pw_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The 16 columns from q0 (a pixel of the whole batch, n * P + p) of every input
 * channel into b [C][NR]: straight copies when they lie in one sample, else piece by
 * piece, with zeros past the batch's last pixel. */
static void pack_columns(const fm_conv_pw *d, int64_t q0, float *b) {
    const int64_t C = d->C, P = d->P;
    int64_t n = q0 / P, p = q0 % P;
    if (p + NR <= P) {
        const float *src = d->x + n * d->x_stride + p;
        for (int64_t k = 0; k < C; k++, src += d->ldx) {
            _mm256_store_ps(b + k * NR, _mm256_loadu_ps(src));
            _mm256_store_ps(b + k * NR + 8, _mm256_loadu_ps(src + 8));
        }
        return;
    }
    for (int64_t j = 0; j < NR; n++, p = 0) {
        if (n >= d->N) {
            for (int64_t k = 0; k < C; k++) memset(b + k * NR + j, 0, (size_t)(NR - j) * sizeof(float));
            return;
        }
        const int64_t len = min64(NR - j, P - p);
        const float *src = d->x + n * d->x_stride + p;
        for (int64_t k = 0; k < C; k++) memcpy(b + k * NR + j, src + k * d->ldx, (size_t)len * sizeof(float));
        j += len;
    }
}

/* The same for a conv's input (d->conv): the 16 output pixels from q0, run by run of
 * pixels in one output row, each row k = (c, i, j) of the product gathered from input row
 * ih = oh * sh - ph + i * dh, columns iw = ow * sw - pw + j * dw (zeros outside the input). */
static void pack_conv(const fm_conv_pw *d, int64_t q0, float *b) {
    const fm_conv_pw_geom *g = d->conv;
    const int64_t P = d->P, H = g->H, W = g->W, sw = g->sw;
    int64_t n = q0 / P, p = q0 % P;
    for (int64_t j = 0; j < NR;) {
        if (n >= d->N) {
            for (int64_t k = 0; k < d->C; k++) memset(b + k * NR + j, 0, (size_t)(NR - j) * sizeof(float));
            return;
        }
        const int64_t oh = p / g->Wo, ow = p % g->Wo, len = min64(NR - j, g->Wo - ow);
        for (int64_t c = 0; c < g->Cin; c++)
            for (int64_t i = 0; i < g->kh; i++) {
                const int64_t ih = oh * g->sh - g->ph + i * g->dh;
                const bool row_in = ih >= 0 && ih < H; /* else the row is zeros and src is not formed */
                const float *src = row_in ? d->x + n * d->x_stride + (c * H + ih) * W : d->x;
                for (int64_t jj = 0; jj < g->kw; jj++) {
                    float *dst = b + ((c * g->kh + i) * g->kw + jj) * NR + j;
                    const int64_t iw0 = ow * sw - g->pw + jj * g->dw;
                    /* t in [lo, hi): iw0 + t * sw inside the row */
                    int64_t lo = iw0 < 0 ? (-iw0 + sw - 1) / sw : 0, hi = iw0 < W ? (W - iw0 + sw - 1) / sw : 0;
                    if (!row_in) lo = hi = 0;
                    if (hi > len) hi = len;
                    if (lo > hi) lo = hi;
                    for (int64_t t = 0; t < lo; t++) dst[t] = 0.0f;
                    if (sw == 2)
                        for (int64_t t = lo; t < hi; t++) dst[t] = src[iw0 + 2 * t];
                    else
                        for (int64_t t = lo; t < hi; t++) dst[t] = src[iw0 + t * sw];
                    for (int64_t t = hi; t < len; t++) dst[t] = 0.0f;
                }
            }
        j += len, p += len;
        if (p == P) n++, p = 0;
    }
}

/* A finished tile's rows [0, rows) from t [MR][NR] to the samples its columns belong to. */
static void scatter_tile(const fm_conv_pw *d, const float *t, int64_t rows, int64_t o0, int64_t q0) {
    const int64_t P = d->P;
    int64_t n = q0 / P, p = q0 % P;
    for (int64_t j = 0; j < NR && n < d->N; n++, p = 0) {
        const int64_t len = min64(NR - j, P - p);
        float *dst = d->y + n * d->y_stride + o0 * P + p;
        for (int64_t r = 0; r < rows; r++) memcpy(dst + r * P, t + r * NR + j, (size_t)len * sizeof(float));
        j += len;
    }
}

/* Output channels [o0, o0 + R) (those below O) at the 16 packed columns b from q0:
 * 2 R accumulators over the C input channels, then the bias and the clamp (max(lo, v)
 * and min(hi, v) keep a NaN sum), stored into y when the columns are 16 of one sample,
 * else through t. Rows past O read the last row's weights (in bounds) and are not
 * stored. R is 6, or 4 or 2 for a last panel of fewer rows (an 8-channel group: 6 + 2,
 * not 6 + 6). */
static inline __attribute__((always_inline)) void tile_rows(const int R, const pw_job *j, const float *b, int64_t o0,
                                                             int64_t q0, float *t) {
    const fm_conv_pw *d = j->d;
    const int64_t C = d->C, O = d->O, rows = min64(R, O - o0);
    const float *a[MR];
    __m256 c[MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) a[r] = d->w + min64(o0 + r, O - 1) * C, c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < C; k++) {
        const __m256 b0 = _mm256_load_ps(b + k * NR), b1 = _mm256_load_ps(b + k * NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 av = _mm256_broadcast_ss(a[r] + k);
            c[r][0] = _mm256_fmadd_ps(av, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(av, b1, c[r][1]);
        }
    }
    const int64_t n = q0 / d->P, p = q0 % d->P;
    const bool direct = p + NR <= d->P;
    float *dst = direct ? d->y + n * d->y_stride + o0 * d->P + p : t;
    const int64_t ld = direct ? d->P : NR;
    const __m256 lo = _mm256_set1_ps(d->lo), hi = _mm256_set1_ps(d->hi);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        if (r >= rows) break;
        const __m256 bv = _mm256_set1_ps(d->bias ? d->bias[o0 + r] : 0.0f);
        __m256 v0 = _mm256_add_ps(c[r][0], bv), v1 = _mm256_add_ps(c[r][1], bv);
        if (j->clamp) {
            v0 = _mm256_min_ps(hi, _mm256_max_ps(lo, v0));
            v1 = _mm256_min_ps(hi, _mm256_max_ps(lo, v1));
        }
        _mm256_storeu_ps(dst + r * ld, v0);
        _mm256_storeu_ps(dst + r * ld + 8, v1);
    }
    if (!direct) scatter_tile(d, t, rows, o0, q0);
}

static void tile(const pw_job *j, const float *b, int64_t o0, int64_t q0, float *t) {
    const int64_t rows = j->d->O - o0;
    if (rows > 4) tile_rows(6, j, b, o0, q0, t);
    else if (rows > 2) tile_rows(4, j, b, o0, q0, t);
    else tile_rows(2, j, b, o0, q0, t);
}

/* Items [b, e): item i is block i / split of nb column tiles and its output-channel
 * chunk i % split. A run of items on one block packs its columns once. Groups of
 * PW_GROUP 6-row panels run over the block's tiles one group after the other, so
 * that 24 rows of the output are written at a time, 16 * nb columns each: all the
 * panels over one tile before the next wrote 6 * nop rows at once (96 streams of
 * 64-byte stores at 96 channels: MobileNetV2's 16 -> 96 layer at 112x112 ran at 35
 * GFLOP/s, one thread of an AMD EPYC Zen 3, against 65 now), and one panel over the
 * whole block read each tile's columns from L2 instead of L1 (its 144 -> 24 layer at
 * 56x56: 47 GFLOP/s against 64 with the groups). */
static void pw_task(void *ctx, int64_t b, int64_t e, int tid) {
    const pw_job *j = ctx;
    const int64_t C = j->d->C;
    float *cols = j->bufs + tid * j->per, *t = cols + C * NR * j->nb;
    int64_t packed = -1;
    for (int64_t i = b; i < e; i++) {
        const int64_t blk = i / j->split, oc = i % j->split, t0 = blk * j->nb, t1 = min64(j->ntiles, t0 + j->nb);
        if (blk != packed)
            for (int64_t ti = t0; ti < t1; ti++) {
                if (j->d->conv) pack_conv(j->d, ti * NR, cols + (ti - t0) * C * NR);
                else pack_columns(j->d, ti * NR, cols + (ti - t0) * C * NR);
            }
        packed = blk;
        const int64_t op_end = min64(j->nop, (oc + 1) * j->opc);
        for (int64_t og = oc * j->opc; og < op_end; og += PW_GROUP)
            for (int64_t ti = t0; ti < t1; ti++)
                for (int64_t op = og; op < min64(op_end, og + PW_GROUP); op++) tile(j, cols + (ti - t0) * C * NR, op * MR, ti * NR, t);
    }
}

/* The job for d on nt threads (bufs unset); its items. */
static int64_t plan(const fm_conv_pw *d, int nt, pw_job *j) {
    const int64_t Q = d->N * d->P, nop = (d->O + MR - 1) / MR;
    *j = (pw_job){.d = d, .ntiles = (Q + NR - 1) / NR, .nop = nop, .split = 1,
                  .clamp = !(d->lo == -INFINITY && d->hi == INFINITY)};
    /* up to 16 tiles a block, their packed columns within 128 KiB (half a Zen 3 L2) */
    j->nb = d->C > 0 ? min64(16, 2048 / d->C) : 16;
    if (j->nb < 1) j->nb = 1;
    if (j->nb > j->ntiles) j->nb = j->ntiles;
    const int64_t nblk = (j->ntiles + j->nb - 1) / j->nb;
    /* at least 4 items per thread when the blocks alone give fewer (batch 1 at 7x7) */
    if (nt > 1 && nblk < 4 * nt) j->split = min64(nop, (4 * nt + nblk - 1) / nblk);
    j->opc = (nop + j->split - 1) / j->split;
    j->split = (nop + j->opc - 1) / j->opc;
    j->per = (d->C * j->nb + MR) * NR;
    return nblk * j->split;
}

bool fm_conv_pw_run_avx2(const fm_conv_pw *d) {
    if (d->N * d->P == 0 || d->O == 0) return true;
    const int nt = fm_num_threads() < 1 ? 1 : fm_num_threads();
    pw_job j;
    const int64_t items = plan(d, nt, &j);
    const size_t bytes = (size_t)(j.per * nt) * sizeof(float);
    j.bufs = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!j.bufs) return false;
    /* about 64k multiply-adds per claim (a 6 x 16 tile step is 96); with C == 0 every
     * output is its bias, clamped */
    const int64_t per_item = j.opc * d->C * MR * NR * j.nb, grain = per_item >= 65536 ? 1 : 65536 / (per_item > 0 ? per_item : 1);
    fm_parallel_for_dynamic(items, grain, pw_task, &j);
    free(j.bufs);
    return true;
}

int64_t fm_conv_pw_serial_floats(const fm_conv_pw *d) {
    pw_job j;
    plan(d, 1, &j);
    return (j.per + 15) / 16 * 16;
}

void fm_conv_pw_serial_avx2(const fm_conv_pw *d, float *buf) {
    if (d->N * d->P == 0 || d->O == 0) return;
    pw_job j;
    const int64_t items = plan(d, 1, &j);
    j.bufs = buf;
    pw_task(&j, 0, items, 0);
}
