/* GEMM for the CPU kernels (matmul, linear, conv): OpenBLAS does the math,
 * single-threaded; fathom's pool splits C into column panels or row blocks.
 *
 * Why not OpenBLAS's own threads: its pthreads build keeps its workers
 * spinning (sched_yield) for a while after every call, so the elementwise,
 * reduction and optimizer kernels that follow a GEMM run on fathom's pool
 * while OpenBLAS's idle workers compete for the same cores. A profile of the
 * MLP training step showed ~22% of samples in sched_yield. PyTorch avoids the
 * same trap by running MKL and its own kernels on one OpenMP team; one pool
 * for everything is fathom's version of that. FATHOM_GEMM_THREADS=openblas
 * restores OpenBLAS's threads (for comparisons).
 *
 * Which dimension is split: each part packs the operand it does not split in
 * full, so the split goes along N when A (M x K) is the smaller operand and
 * along M otherwise. Each element of C is still one dot product over K in
 * OpenBLAS's K blocking, so the result does not depend on the thread count. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_smallm.h"
#include "backend/cpu/gemv_avx2.h"
#include "backend/cpu/openblas_load.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* Products of 2..FM_SMALLM_MAX rows against a linear's [N, K] weight read the
 * weight in place (gemm_smallm.h) instead of having OpenBLAS pack it per call.
 * The bound is where OpenBLAS's packed kernel overtakes the unpacked one
 * (bench_gemm_smallm on kjv-gpt and GPT-2-small shapes). */
#define FM_SMALLM_MAX 16

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_blas_threads;
static int64_t g_smallm_max; /* largest M for gemm_smallm.h; FATHOM_SMALLM_MAX overrides, 0 = off */
static const fm_openblas_fns *g_blas; /* NULL: the portable loops */

static void choose_driver(void) {
    g_blas = fm_openblas();
    const char *e = getenv("FATHOM_GEMM_THREADS");
    g_blas_threads = g_blas && e && !strcmp(e, "openblas");
    if (g_blas && !g_blas_threads) g_blas->set_num_threads(1);
    const char *sm = getenv("FATHOM_SMALLM_MAX");
    g_smallm_max = sm && *sm ? strtol(sm, NULL, 10) : FM_SMALLM_MAX;
}

void fm_cpu_gemm_init(void) { pthread_once(&g_once, choose_driver); }

/* C[i0:i1, j0:j1] = bias[j0:j1] in every row, so that a beta = 1 GEMM adds the
 * product to it: linear's y = x w^T + b in one pass over C. OpenBLAS clears C
 * in a pass of its own when beta = 0, so the fill replaces that pass and the
 * separate bias add (a read and a write of all of C) disappears. */
static void fill_bias(const fm_cpu_gemm_args *g, const void *bias, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    size_t es = g->dt == FM_F32 ? sizeof(float) : sizeof(double);
    for (int64_t i = i0; i < i1; i++)
        memcpy((char *)g->C + (size_t)(i * g->ldc + j0) * es, (const char *)bias + (size_t)j0 * es, (size_t)(j1 - j0) * es);
}

static void gemm_block(const fm_cpu_gemm_args *g, const void *bias, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    int ta = g->ta ? FM_CBLAS_TRANS : FM_CBLAS_NO_TRANS, tb = g->tb ? FM_CBLAS_TRANS : FM_CBLAS_NO_TRANS;
    int64_t aoff = g->ta ? i0 : i0 * g->lda, boff = g->tb ? j0 * g->ldb : j0, coff = i0 * g->ldc + j0;
    double beta = g->beta;
    if (bias) { fill_bias(g, bias, i0, i1, j0, j1); beta = 1.0; }
    if (!g_blas && g->dt == FM_F32)
        fm_gemm_portable_f32(g->ta, g->tb, (int)(i1 - i0), (int)(j1 - j0), (int)g->K, (const float *)g->A + aoff,
                             (int)g->lda, (const float *)g->B + boff, (int)g->ldb, (float)beta, (float *)g->C + coff,
                             (int)g->ldc);
    else if (!g_blas)
        fm_gemm_portable_f64(g->ta, g->tb, (int)(i1 - i0), (int)(j1 - j0), (int)g->K, (const double *)g->A + aoff,
                             (int)g->lda, (const double *)g->B + boff, (int)g->ldb, beta, (double *)g->C + coff,
                             (int)g->ldc);
    else if (g->dt == FM_F32)
        g_blas->sgemm(FM_CBLAS_ROW_MAJOR, ta, tb, (int)(i1 - i0), (int)(j1 - j0), (int)g->K, 1.0f, (const float *)g->A + aoff,
                    (int)g->lda, (const float *)g->B + boff, (int)g->ldb, (float)beta, (float *)g->C + coff,
                    (int)g->ldc);
    else
        g_blas->dgemm(FM_CBLAS_ROW_MAJOR, ta, tb, (int)(i1 - i0), (int)(j1 - j0), (int)g->K, 1.0, (const double *)g->A + aoff,
                    (int)g->lda, (const double *)g->B + boff, (int)g->ldb, beta, (double *)g->C + coff,
                    (int)g->ldc);
}

/* C[1, j0:j1] for M == 1 (batch-1 decoding): a GEMV streams the weights once,
 * where GEMM would first copy (pack) the whole of B for a single row of A. */
static void gemv_cols(const fm_cpu_gemm_args *g, int64_t j0, int64_t j1) {
    int incx = (int)(g->ta ? g->lda : 1);
    /* op(B) = B^T: B is [N, K], rows j0..j1 give those outputs; else B is [K, N], columns j0..j1 */
    int t = g->tb ? FM_CBLAS_NO_TRANS : FM_CBLAS_TRANS;
    int rows = (int)(g->tb ? j1 - j0 : g->K), cols = (int)(g->tb ? g->K : j1 - j0);
    int64_t boff = g->tb ? j0 * g->ldb : j0;
    if (g->dt == FM_F32 && g->tb && incx == 1) { /* a linear's [out, in] weight */
        if (fm_cpu_use_avx2())
            (fm_cpu_use_avx512() ? fm_gemv_rows_f32_avx512 : fm_gemv_rows_f32_avx2)(
                j1 - j0, g->K, (const float *)g->B + boff, g->ldb, (const float *)g->A, (float)g->beta, (float *)g->C + j0);
        else /* the small-M product's reference: one row of it is the same bits as that row in an M-row call */
            fm_gemm_smallm_f32_scalar(1, j1 - j0, g->K, g->A, g->lda, (const float *)g->B + boff, g->ldb, (float)g->beta,
                                      (float *)g->C + j0, g->ldc);
        return;
    }
    if (!g_blas) {
        gemm_block(g, NULL, 0, 1, j0, j1);
        return;
    }
    if (g->dt == FM_F32)
        g_blas->sgemv(FM_CBLAS_ROW_MAJOR, t, rows, cols, 1.0f, (const float *)g->B + boff, (int)g->ldb, (const float *)g->A,
                    incx, (float)g->beta, (float *)g->C + j0, 1);
    else
        g_blas->dgemv(FM_CBLAS_ROW_MAJOR, t, rows, cols, 1.0, (const double *)g->B + boff, (int)g->ldb, (const double *)g->A,
                    incx, g->beta, (double *)g->C + j0, 1);
}

/* GEMV row blocks are handed out one at a time from a shared counter rather than
 * as one fixed half per thread: a GEMV is memory-bound and short (tens of us),
 * and when another process holds one of the cores, a fixed split makes every
 * decoded token wait for the descheduled thread's half; here the running
 * thread takes the remaining blocks. Block boundaries are fixed (multiples of
 * GEMV_BLOCK rows), and the kernel gives each row the same result whoever
 * computes it, so results do not depend on the scheduling. */
#define GEMV_BLOCK 128

typedef struct gemv_ctx {
    const fm_cpu_gemm_args *g;
    _Atomic int64_t next;
    void (*cols)(const fm_cpu_gemm_args *g, int64_t j0, int64_t j1);
} gemv_ctx;

static void gemv_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)b; (void)e; (void)tid;
    gemv_ctx *c = vctx;
    const int64_t N = c->g->N;
    for (int64_t j0; (j0 = atomic_fetch_add_explicit(&c->next, GEMV_BLOCK, memory_order_relaxed)) < N;)
        c->cols(c->g, j0, j0 + GEMV_BLOCK < N ? j0 + GEMV_BLOCK : N);
}

/* Below AVX2 (FATHOM_ISA=scalar, or such a CPU) the scalar reference runs these
 * products too, and the one-row products above: slower than OpenBLAS, but every
 * row of a batched decode step is then the same bits as that row alone, as at
 * the SIMD levels (with OpenBLAS, sgemv and sgemm rounded differently, and the
 * paged decoder's text depended on which sequences shared its step). */
static bool smallm_applies(const fm_cpu_gemm_args *g) {
    return g->dt == FM_F32 && g->tb && !g->ta && g->M >= 2 && g->M <= g_smallm_max && !g_blas_threads;
}

static void smallm_cols(const fm_cpu_gemm_args *g, int64_t j0, int64_t j1) {
    const float *W = (const float *)g->B + j0 * g->ldb;
    float *C = (float *)g->C + j0;
    if (!fm_cpu_use_avx2())
        fm_gemm_smallm_f32_scalar(g->M, j1 - j0, g->K, g->A, g->lda, W, g->ldb, (float)g->beta, C, g->ldc);
    else if (fm_cpu_use_avx512())
        fm_gemm_smallm_f32_avx512(g->M, j1 - j0, g->K, g->A, g->lda, W, g->ldb, (float)g->beta, C, g->ldc);
    else
        fm_gemm_smallm_f32_avx2(g->M, j1 - j0, g->K, g->A, g->lda, W, g->ldb, (float)g->beta, C, g->ldc);
}

/* M == 1 (GEMV) and small M: blocks of output columns handed out from a counter.
 * Below `serial` multiply-adds the call runs on the calling thread: a GEMV
 * streams 4 bytes of weight per multiply-add (2^16 of them: ~17 us at the
 * 15 GB/s it reaches), a small-M product reuses each weight M times from L1
 * (~25 GFLOP/s here), so the same wake-up cost needs 2^19 of its. */
static void rows_streamed(const fm_cpu_gemm_args *g, const void *bias,
                          void (*cols)(const fm_cpu_gemm_args *, int64_t, int64_t), int64_t serial) {
    fm_cpu_gemm_args gb = *g;
    if (bias) { fill_bias(g, bias, 0, g->M, 0, g->N); gb.beta = 1.0; g = &gb; }
    int nt = fm_num_threads();
    int64_t blocks = (g->N + GEMV_BLOCK - 1) / GEMV_BLOCK;
    if (nt <= 1 || blocks < 2 || g->M * g->N * g->K < serial) {
        cols(g, 0, g->N);
    } else {
        gemv_ctx c = {g, 0, cols};
        fm_parallel_for(blocks < nt ? blocks : nt, 1, gemv_task, &c);
    }
}

/* ---- bf16 weights, f32 output, few rows: the mixed linear of a decode step ----
 * (`--precision bf16` generation with the weights kept in bf16: a token's step
 * streams half the bytes an f32 weight would). A's rows are widened to f32 once
 * (bf16 -> f32 is exact), then each output column is one row of B (a linear's
 * [out, in] weight) dotted with them: the same streamed split as the f32 GEMV. */
#define BF16_GEMV_MAX_M 4

static void bf16w_cols(const fm_cpu_gemm_args *g, int64_t j0, int64_t j1) {
    const uint16_t *W = (const uint16_t *)g->B + j0 * g->ldb;
    for (int64_t m = 0; m < g->M; m++) {
        const float *x = (const float *)g->A + m * g->lda;
        float *y = (float *)g->C + m * g->ldc + j0;
        if (fm_cpu_use_avx512()) fm_gemv_rows_bf16_avx512(j1 - j0, g->K, W, g->ldb, x, (float)g->beta, y);
        else if (fm_cpu_use_avx2()) fm_gemv_rows_bf16_avx2(j1 - j0, g->K, W, g->ldb, x, (float)g->beta, y);
        else
            for (int64_t j = 0; j < j1 - j0; j++) { /* the scalar level: one FMA chain a column */
                float acc = 0.0f;
                for (int64_t k = 0; k < g->K; k++) acc = __builtin_fmaf(fm_gemv_w1(W + j * g->ldb, k, 1), x[k], acc);
                y[j] = g->beta == 0.0 ? acc : __builtin_fmaf((float)g->beta, y[j], acc);
            }
    }
}

bool fm_cpu_gemv_bf16(const fm_cpu_gemm_args *g, const float *bias) {
    if (g->dt != FM_BF16 || g->M < 1 || g->M > BF16_GEMV_MAX_M || !g->tb || g->ta || g->N < 1 || g->K < 1) return false;
    float *xf = malloc(sizeof(float) * (size_t)(g->M * g->K));
    if (!xf) return false; /* the caller's path runs it */
    for (int64_t m = 0; m < g->M; m++) fm_convert_bf16_to_f32((const uint16_t *)g->A + m * g->lda, xf + m * g->K, (size_t)g->K);
    fm_cpu_gemm_args gf = *g;
    gf.dt = FM_F32; /* C and the bias are f32 (rows_streamed's fill); B stays bf16, read by bf16w_cols */
    gf.A = xf;
    gf.lda = g->K;
    rows_streamed(&gf, bias, bf16w_cols, (int64_t)1 << 17); /* 2 bytes of weight a multiply-add: twice the f32 GEMV's */
    free(xf);
    return true;
}

/* FATHOM_GEMM_F32, read once for gemm_bf16.c's oneDNN choice and own_decide below (cpu_kernels.h) */
static pthread_once_t g_asked_once = PTHREAD_ONCE_INIT;
static fm_f32_provider g_asked;

static void read_asked(void) {
    const char *e = getenv("FATHOM_GEMM_F32");
    if (!e || !*e) g_asked = FM_F32_PROVIDER_DEFAULT;
    else if (!strcmp(e, "openblas")) g_asked = FM_F32_PROVIDER_OPENBLAS;
    else if (!strcmp(e, "onednn")) g_asked = FM_F32_PROVIDER_ONEDNN;
    else if (!strcmp(e, "fathom")) g_asked = FM_F32_PROVIDER_FATHOM;
    else {
        fprintf(stderr, "fathom: warning: FATHOM_GEMM_F32=%s names no provider (openblas, onednn or fathom); the default is used\n", e);
        g_asked = FM_F32_PROVIDER_DEFAULT;
    }
}

fm_f32_provider fm_cpu_gemm_f32_asked(void) {
    pthread_once(&g_asked_once, read_asked);
    return g_asked;
}

/* Which f32 products gemm_f32_avx512.c's kernel takes (decided once; here, not there,
 * because that file is compiled for AVX-512 and this runs on every CPU):
 * FATHOM_GEMM_F32=fathom every product of >= 2M multiply-adds; =openblas or =onednn
 * none; unset: on an Intel CPU with AVX-512 the large ones (M and N >= 1024, K >=
 * 512) when fathom runs one thread. There it measured 1.06-1.14x oneDNN 2.6.3 (Intel
 * Xeon model 167, paired in one process: bench/bench_gemm_pair.c), but on two threads
 * 0.95-1.01x, so oneDNN keeps the products of two or more threads; below that size
 * oneDNN led (512^3 by 25%, 2048x512x512 and 1024x1024x256 by 5-10%: each packed
 * panel of A meets too few columns). AMD Zen 4 runs 512-bit FMAs as two halves and
 * was not measured with it. */
static pthread_once_t g_own_once = PTHREAD_ONCE_INIT;
static int g_own_mode; /* 0 none, 1 the large products, 2 every product */

static void own_decide(void) {
    const fm_cpu_features *f = fm_cpu_get_features();
    fm_f32_provider asked = fm_cpu_gemm_f32_asked();
    if (asked == FM_F32_PROVIDER_FATHOM) g_own_mode = 2;
    else if (asked != FM_F32_PROVIDER_DEFAULT) g_own_mode = 0;
    else g_own_mode = f->intel && fm_isa_max_for(f) >= FM_ISA_AVX512;
}

bool fm_cpu_gemm_f32_avx512_takes(const fm_cpu_gemm_args *g) {
    pthread_once(&g_own_once, own_decide);
    if (!g_own_mode || g->dt != FM_F32 || !fm_cpu_use_avx512() || g->M * g->N * g->K < ((int64_t)1 << 21)) return false;
    return g_own_mode == 2 || (g->M >= 1024 && g->N >= 1024 && g->K >= 512 && fm_num_threads() == 1);
}

const char *fm_cpu_gemm_f32_avx512_note(void) {
    pthread_once(&g_own_once, own_decide);
    return g_own_mode == 2   ? "every product of >= 2M multiply-adds (FATHOM_GEMM_F32=fathom)"
           : g_own_mode == 1 ? "on one thread, products with M, N >= 1024 and K >= 512 (FATHOM_GEMM_F32=fathom: every product)"
                         : NULL;
}

#define COL_PANEL 64
#define ROW_BLOCK 32

typedef struct split_ctx {
    const fm_cpu_gemm_args *g;
    const void *bias;
    bool by_cols;
} split_ctx;

static void split_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const split_ctx *s = vctx;
    const fm_cpu_gemm_args *g = s->g;
    if (s->by_cols) gemm_block(g, s->bias, 0, g->M, b * COL_PANEL, e * COL_PANEL < g->N ? e * COL_PANEL : g->N);
    else gemm_block(g, s->bias, b * ROW_BLOCK, e * ROW_BLOCK < g->M ? e * ROW_BLOCK : g->M, 0, g->N);
}

void fm_cpu_gemm_bias(const fm_cpu_gemm_args *g, const void *bias) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0 && bias) { fill_bias(g, bias, 0, g->M, 0, g->N); return; }
    if (g->K <= 0) { /* C = beta * C: nothing to multiply */
        for (int64_t i = 0; i < g->M; i++)
            for (int64_t j = 0; j < g->N; j++) {
                if (g->dt == FM_F32) { float *c = (float *)g->C + i * g->ldc + j; *c = g->beta == 0 ? 0.f : *c * (float)g->beta; }
                else { double *c = (double *)g->C + i * g->ldc + j; *c = g->beta == 0 ? 0.0 : *c * g->beta; }
            }
        return;
    }
    fm_cpu_gemm_init();
    int nt = fm_num_threads();
    if (g->M == 1 && !g_blas_threads) { rows_streamed(g, bias, gemv_cols, (int64_t)1 << 16); return; }
    if (smallm_applies(g)) { rows_streamed(g, bias, smallm_cols, (int64_t)1 << 19); return; }
    if (!g_blas_threads && fm_cpu_gemm_f32_avx512_takes(g) && fm_cpu_gemm_f32_avx512(g, bias)) return;
    if (!g_blas_threads && fm_cpu_gemm_f32_dnnl(g, bias)) return;
    bool by_cols = g->M <= g->N;
    int64_t units = by_cols ? (g->N + COL_PANEL - 1) / COL_PANEL : (g->M + ROW_BLOCK - 1) / ROW_BLOCK;
    /* below ~2^18 multiply-adds a call costs about as much as waking a thread */
    if (g_blas_threads || nt <= 1 || units < 2 || g->M * g->N * g->K < ((int64_t)1 << 18)) {
        gemm_block(g, bias, 0, g->M, 0, g->N);
        return;
    }
    split_ctx s = {g, bias, by_cols};
    fm_parallel_for(units, (units + nt - 1) / nt, split_task, &s);
}

void fm_cpu_gemm(const fm_cpu_gemm_args *g) { fm_cpu_gemm_bias(g, NULL); }
