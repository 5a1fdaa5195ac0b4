/* The quantized kernels' scalar references and their drivers
 * (quant_kernels.h): which implementation runs, and the split over the pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "fathom/tensor.h"

void fm_q8_gemm_tile_ref(const fm_q8_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t m = m0; m < m1; m++) {
        const uint8_t *a = g->A + m * g->lda;
        for (int64_t n = n0; n < n1; n++) {
            const int8_t *b = g->B + n * g->ldb;
            int32_t acc = 0;
            for (int64_t k = 0; k < g->K; k++) acc += (int32_t)a[k] * (int32_t)b[k];
            fm_q8_store(g, m, n, acc);
        }
    }
}

fm_q8_impl fm_q8_impl_best(void) {
    if (fm_cpu_use_amx() && fm_cpu_get_features()->amx_int8 && fm_cpu_get_features()->avx512_vnni) return FM_Q8_AMX;
    if (fm_cpu_use_avx512() && fm_cpu_get_features()->avx512_vnni) return FM_Q8_VNNI;
    return fm_cpu_use_avx2() ? FM_Q8_AVX2 : FM_Q8_REF;
}

const char *fm_q8_impl_name(fm_q8_impl i) {
    return i == FM_Q8_AMX    ? "amx-int8 tiles (tdpbusd; vpdpbusd where tiles do not fit)"
           : i == FM_Q8_VNNI ? "avx512-vnni (vpdpbusd)"
           : i == FM_Q8_AVX2 ? "avx2 (vpmaddubsw split)" : "scalar";
}

typedef struct { const fm_q8_gemm *g; fm_q8_impl impl; int64_t nb; } q8_job;

/* Tasks are blocks of 16 output columns, each over all rows: the block's
 * weights (16 x K bytes) stay in L1 while the activations stream from L2. */
#define Q8_NB 16
static void q8_task(void *ctx, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    const q8_job *j = ctx;
    int64_t n0 = b0 * Q8_NB, n1 = b1 * Q8_NB < j->g->N ? b1 * Q8_NB : j->g->N;
    if (j->impl == FM_Q8_VNNI || j->impl == FM_Q8_AMX) fm_q8_gemm_tile_vnni(j->g, 0, j->g->M, n0, n1); /* rows: no tiles */
    else if (j->impl == FM_Q8_AVX2) fm_q8_gemm_tile_avx2(j->g, 0, j->g->M, n0, n1);
    else fm_q8_gemm_tile_ref(j->g, 0, j->g->M, n0, n1);
}

void fm_q8_gemm_run(const fm_q8_gemm *g, fm_q8_impl impl) {
    if (g->M <= 0 || g->N <= 0) return;
    q8_job j = {g, impl, (g->N + Q8_NB - 1) / Q8_NB};
    /* below ~2^18 multiply-adds a thread hand-off costs more than it saves */
    int64_t work = g->M * g->K * Q8_NB, grain = work >= (1 << 18) ? 1 : ((1 << 18) + work - 1) / work;
    fm_parallel_for(j.nb, grain, q8_task, &j);
}

void fm_q8_range(const float *x, int64_t n, float *mn, float *mx) {
    float lo = 0.0f, hi = 0.0f; /* the range always holds 0, so zero stays exact */
    for (int64_t i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *mn = lo;
    *mx = hi;
}

void fm_q8_params(float mn, float mx, float *scale, int32_t *zero) {
    if (mn > 0) mn = 0;
    if (mx < 0) mx = 0;
    float s = (mx - mn) / 255.0f;
    if (!(s > 0) || !isfinite(s)) { *scale = 1.0f; *zero = 0; return; }
    float z = nearbyintf(-mn / s);
    *scale = s;
    *zero = (int32_t)(z < 0 ? 0 : z > 255 ? 255 : z);
}

void fm_q8_quantize(const float *x, int64_t n, float scale, int32_t zero, uint8_t *q) {
    float inv = 1.0f / scale;
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] * inv) + (float)zero;
        q[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
}

/* ---- int4 ---- */

void fm_q4_dequant_row(const uint8_t *w, const uint16_t *scale, const uint16_t *min, int64_t K, int64_t G, float *out) {
    for (int64_t k = 0; k < K; k++) {
        int64_t c = k / 32, j = k % 32, gi = k / G;
        uint8_t byte = w[c * 16 + (j & 15)];
        int q = j < 16 ? (byte & 15) : (byte >> 4);
        float d = fm_f16_to_f32(scale[gi]), m = min ? fm_f16_to_f32(min[gi]) : -8.0f * d;
        out[k] = (float)q * d + m;
    }
}

void fm_q4_rows_ref(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    int64_t ng = g->K / g->G;
    for (int64_t m = m0; m < m1; m++) {
        const float *x = g->x + m * g->ldx;
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *w = g->w + n * (g->K / 2);
            const uint16_t *sc = g->scale + n * ng, *mi = g->min ? g->min + n * ng : NULL;
            float acc = 0.0f;
            for (int64_t gi = 0; gi < ng; gi++) {
                float s = 0.0f;
                for (int64_t k = gi * g->G; k < (gi + 1) * g->G; k++) {
                    uint8_t byte = w[(k / 32) * 16 + (k % 32 & 15)];
                    s += (float)(k % 32 < 16 ? byte & 15 : byte >> 4) * x[k];
                }
                float d = fm_f16_to_f32(sc[gi]), mn = mi ? fm_f16_to_f32(mi[gi]) : -8.0f * d;
                acc += d * s + mn * g->xsum[m * ng + gi];
            }
            g->y[m * g->ldy + n] = g->bias ? acc + g->bias[n] : acc;
        }
    }
}

/* Where code k of block b lies in a row's pair layout (quant_kernels.h). */
static inline int64_t q4x_pos(int64_t nb, int64_t b, int64_t k) {
    int64_t p = b / 2, h = b % 2;
    if (b == nb - 1 && nb % 2) return 64 * p + k; /* an odd last block: in order */
    return 64 * p + (k < 16 ? 16 * h + k : 32 + 16 * h + (k - 16));
}

void fm_q4_quantize_x(const float *x, int64_t K, int64_t xb, int8_t *qx, float *dxv) {
    const int64_t nb = K / 32, bpx = xb / 32;
    for (int64_t b0 = 0; b0 < nb; b0 += bpx) {
        const float *xs = x + 32 * b0;
        float amax = 0.0f;
        bool nan = false;
        for (int64_t k = 0; k < xb; k++) {
            float a = fabsf(xs[k]);
            nan |= a != a;
            amax = a > amax ? a : amax;
        }
        if (nan) amax = NAN; /* the block's scale carries the NaN into y */
        float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t b = b0; b < b0 + bpx; b++) {
            for (int k = 0; k < 32; k++) {
                float v = nearbyintf(x[32 * b + k] * inv);
                v = v > -127.0f ? v : -127.0f; /* a NaN becomes -127, as the vector max does */
                v = v < 127.0f ? v : 127.0f;
                qx[q4x_pos(nb, b, k)] = (int8_t)v;
            }
            int64_t p = b / 2, h = b == nb - 1 && nb % 2 ? 0 : b % 2;
            for (int j = 0; j < 4; j++) dxv[8 * p + 4 * h + j] = d;
        }
    }
}

void fm_q4_rows_q8_ref(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const int64_t ng = g->K / g->G, nb = g->K / 32;
    for (int64_t m = m0; m < m1; m++) {
        const int8_t *qx = g->qx + m * g->K;
        const float *dx = g->dxv + m * (g->K / 8);
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *w = g->w + n * (g->K / 2);
            const uint16_t *sc = g->scale + n * ng, *mi = g->min ? g->min + n * ng : NULL;
            float acc = 0.0f;
            const int64_t bpg = g->G / 32; /* blocks per group: above 1, x has one scale per group and its sums add as integers */
            for (int64_t b0 = 0; b0 < nb; b0 += bpg) {
                int32_t s = 0;
                for (int64_t b = b0; b < b0 + bpg; b++)
                    for (int64_t k = 0; k < 32; k++) {
                        uint8_t byte = w[16 * b + (k & 15)];
                        s += (k < 16 ? byte & 15 : byte >> 4) * (int32_t)qx[q4x_pos(nb, b, k)];
                    }
                int64_t h = b0 == nb - 1 && nb % 2 ? 0 : b0 % 2;
                acc += fm_f16_to_f32(sc[b0 / bpg]) * dx[8 * (b0 / 2) + 4 * h] * (float)s;
            }
            for (int64_t gi = 0; gi < ng; gi++)
                acc += (mi ? fm_f16_to_f32(mi[gi]) : -8.0f * fm_f16_to_f32(sc[gi])) * g->xsum[m * ng + gi];
            g->y[m * g->ldy + n] = g->bias ? acc + g->bias[n] : acc;
        }
    }
}

fm_q4_impl fm_q4_impl_best(void) {
    /* AVX512: the AVX2 rows with vpdpbusd (VNNI), bitwise the same results */
    if (fm_cpu_use_avx512() && fm_cpu_get_features()->avx512_vnni) return FM_Q4_AVX512;
    return fm_cpu_use_avx2() ? FM_Q4_AVX2 : FM_Q4_REF;
}

typedef struct { const fm_q4_gemm *g; fm_q4_impl impl; } q4_job;

#define Q4_NB 8
static void q4_task(void *ctx, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    const q4_job *j = ctx;
    const fm_q4_gemm *g = j->g;
    int64_t n0 = b0 * Q4_NB, n1 = b1 * Q4_NB < g->N ? b1 * Q4_NB : g->N;
    for (int64_t m = 0; m < g->M; m += 4) { /* 4 rows share each unpacked weight group */
        int64_t me = m + 4 < g->M ? m + 4 : g->M;
        if (j->impl == FM_Q4_AVX512) fm_q4_rows_avx512(g, m, me, n0, n1);
        else if (j->impl == FM_Q4_AVX2) fm_q4_rows_avx2(g, m, me, n0, n1);
        else fm_q4_rows_ref(g, m, me, n0, n1);
    }
}

/* FATHOM_Q4_TILE=0: no dx8, so no 4-row tiles and the rows gather x's scales per
 * use (the kernel before them, for comparisons; the same results) */
static bool q4_tiles_on(void) {
    static _Atomic int on = -1;
    if (on < 0) {
        const char *e = getenv("FATHOM_Q4_TILE");
        on = !(e && !strcmp(e, "0"));
    }
    return on != 0;
}

void fm_q4_gemm_run(const fm_q4_gemm *g, fm_q4_impl impl) {
    if (g->M <= 0 || g->N <= 0) return;
    fm_q4_gemm gq;
    int8_t *qx = NULL;
    float *dxv = NULL, *dx8 = NULL;
    if (impl == FM_Q4_AVX2 || impl == FM_Q4_AVX512) { /* x as int8 per group (one scale per weight group), once per call */
        const int64_t np = g->K / 64, nq = (np + 3) / 4;
        qx = malloc((size_t)(g->M * g->K));
        dxv = malloc(sizeof(float) * (size_t)(g->M * (g->K / 8)));
        dx8 = g->G == 32 && q4_tiles_on() ? calloc((size_t)(g->M * nq * 8 + 1), sizeof(float)) : NULL;
        if (!qx || !dxv) impl = FM_Q4_REF; /* slower, f32 x */
        else {
            for (int64_t m = 0; m < g->M; m++) {
                fm_q4_quantize_x_avx2(g->x + m * g->ldx, g->K, g->G, qx + m * g->K, dxv + m * (g->K / 8));
                /* per quad of pairs, its blocks' scales in a row (fm_q4_gemm.dx8); left NULL
                 * if its allocation failed: the rows then gather them per use */
                for (int64_t p = 0; dx8 && p < np; p++) {
                    dx8[(m * nq + p / 4) * 8 + 2 * (p % 4)] = dxv[m * (g->K / 8) + 8 * p];
                    dx8[(m * nq + p / 4) * 8 + 2 * (p % 4) + 1] = dxv[m * (g->K / 8) + 8 * p + 4];
                }
            }
            gq = *g;
            gq.qx = qx;
            gq.dxv = dxv;
            gq.dx8 = dx8;
            gq.tiles = q4_tiles_on() && (g->G != 32 || dx8);
            g = &gq;
        }
    }
    q4_job j = {g, impl};
    int64_t nb = (g->N + Q4_NB - 1) / Q4_NB, work = g->M * g->K * Q4_NB;
    /* claimed as the threads go: a decoded token waits for the slowest half otherwise */
    int64_t grain = work >= (1 << 16) ? 1 : ((1 << 16) + work - 1) / work;
    if (g->M <= 4) {
        /* a GEMV (one pass over the weights): about four claims per thread, so that each
         * claim's four quarter streams are long enough for the hardware prefetcher (88-row
         * claims, 34 KB at K = 768, left the GPT-2-small-shape int4 decode 1.2x slower) */
        const int64_t c = 4 * (int64_t)fm_num_threads(), per = (nb + c - 1) / c;
        grain = per > grain ? per : grain;
    }
    fm_parallel_for_dynamic(nb, grain, q4_task, &j);
    free(qx);
    free(dxv);
    free(dx8);
}
