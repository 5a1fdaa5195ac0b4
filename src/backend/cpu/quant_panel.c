/* The int8 product on weights packed in panels (quant_kernels.h, layout
 * "vnni16x4"): the scalar reference and the driver that splits the product
 * over the thread pool. */
#include <stdlib.h>

#include "backend/cpu/quant_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

void fm_q8_pgemm_tile_ref(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    const int64_t Kq = (g->K + 3) / 4, n1 = 16 * p1 < g->N ? 16 * p1 : g->N;
    for (int64_t m = m0; m < m1; m++)
        for (int64_t n = 16 * p0; n < n1; n++) {
            int32_t acc = 0;
            for (int64_t k = 0; k < g->K; k++) acc += (int32_t)g->A[m * g->lda + k] * (int32_t)g->P[fm_q8_panel_index(Kq, n, k)];
            if (g->ep) {
                fm_q8_gemm q = {g->M, g->N, g->K, NULL, 0, NULL, 0, NULL, 0, g->ep};
                fm_q8_store(&q, m, n, acc);
            } else {
                g->C[m * g->ldc + n] = acc;
            }
        }
}

typedef struct {
    const fm_q8_pgemm *g;
    fm_q8_impl impl;
    int64_t n_mb;
} pjob;

/* A task is 4 panels (64 columns) x up to Q8_MB rows: the 64 x K weight bytes
 * stay in L2 while the rows stream past them in register blocks. The pool's
 * threads claim tasks as they go (fm_parallel_for_dynamic): with one static chunk
 * per thread the second thread sat idle for 12% of a 512 x 384 x 128 product
 * (perf). Each task writes its own outputs, so which thread runs it changes no value. */
#define Q8_NP 4
#define Q8_MB 96
static void ptask(void *ctx, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    const pjob *j = ctx;
    const fm_q8_pgemm *g = j->g;
    const int64_t Np = (g->N + 15) / 16;
    for (int64_t b = b0; b < b1; b++) {
        int64_t nb = b / j->n_mb, mb = b % j->n_mb;
        int64_t p0 = nb * Q8_NP, p1 = p0 + Q8_NP < Np ? p0 + Q8_NP : Np;
        int64_t m0 = mb * Q8_MB, m1 = m0 + Q8_MB < g->M ? m0 + Q8_MB : g->M;
        if (j->impl == FM_Q8_AMX && fm_q8_pgemm_tile_amx(g, m0, m1, p0, p1)) continue;
        if (j->impl == FM_Q8_VNNI || j->impl == FM_Q8_AMX) fm_q8_pgemm_tile_vnni(g, m0, m1, p0, p1);
        else if (j->impl == FM_Q8_AVX2) fm_q8_pgemm_tile_avx2(g, m0, m1, p0, p1);
        else fm_q8_pgemm_tile_ref(g, m0, m1, p0, p1);
    }
}

/* AMX (and VNNI on Intel): a task is a block of about Q8_MB rows across every panel, the blocks split
 * statically (first half to the calling thread, as the activation codes were:
 * quant_cpu.c's codes pass splits the rows the same way). With the dynamic tasks
 * above, each thread took row blocks whose codes the other core had just written, and
 * the tile loads of A waited on the other core's cache (a fifth of the tile's samples,
 * perf). On the Intel Xeon with AMX, 2 threads, alternated three times: the kjv-gpt
 * int8 prefill 1.66-1.69 -> 1.36-1.39 ms, fashion-mlp batch 128 0.30-0.31 -> 0.25-0.27
 * ms (bench_quant). The VNNI kernel gains from it on that Intel core too, so on Intel
 * CPUs it splits the same way (FATHOM_ISA=avx512, alternated three times: prefill
 * 2.03-2.04 -> 1.65-1.83 ms, 1.57-1.65x -> 1.78-1.85x fp32; fashion-mlp 0.43-0.47 ->
 * 0.35-0.38 ms); AMD CPUs keep the dynamic tasks, chosen on the AMD EPYC Zen 4 against
 * a static split (a late-starting thread held a 512 x 384 x 128 product up by 12%; its
 * cores share an L3 per CCX, where the other core's fresh codes cost less to reach).
 * Below 64 rows per thread the tiles would not fill: the dynamic column tasks.
 * Each thread takes one contiguous part of the rows, as even as the tiles allow, and
 * walks it in blocks of at most Q8_MB rows. Blocks of Q8_MB dealt out evenly had split
 * the 512-row prefill 288 / 224 (three blocks of 96 against two and a 32): the second
 * thread then waited for the first for a tenth of the int8 prefill (perf, VNNI). */
typedef struct {
    const fm_q8_pgemm *g;
    int64_t part;  /* rows per thread: a multiple of the tiles' 32 on AMX */
    int64_t align; /* 32 on AMX (whole tile blocks), else 1 */
    bool amx;      /* AMX tiles (else the VNNI kernel) */
} rows_job;

static void rows_task(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    const fm_q8_pgemm *g = j->g;
    const int64_t Np = (g->N + 15) / 16;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t a = t * j->part, e = a + j->part < g->M ? a + j->part : g->M;
        if (a >= e) continue;
        const int64_t nblk = (e - a + Q8_MB - 1) / Q8_MB, rows = ((e - a + nblk - 1) / nblk + j->align - 1) / j->align * j->align;
        for (int64_t m0 = a; m0 < e; m0 += rows) {
            const int64_t m1 = m0 + rows < e ? m0 + rows : e;
            if (!j->amx || !fm_q8_pgemm_tile_amx(g, m0, m1, 0, Np)) fm_q8_pgemm_tile_vnni(g, m0, m1, 0, Np);
        }
    }
}

/* The codes as the AVX2 tiles read them (quant_panel_avx2.c): a - 128 as s8, one xor per code into a copy that
 * *g points to after (freed by the caller: the return value); out of memory, *impl becomes
 * the reference (slower, the same integers). Narrow panels (every weight in [-64, 64]; looked
 * for from FM_Q8_NARROW_MIN_M rows, once per call, so a weight changed between calls is seen)
 * take the codes as they are: *g becomes a copy with narrow set, and nothing is allocated.
 * Other levels: nothing to do, NULL. */
static uint8_t *avx2_codes(const fm_q8_pgemm **g, fm_q8_pgemm *own, fm_q8_impl *impl) {
    if (*impl != FM_Q8_AVX2) return NULL;
    if ((*g)->M >= FM_Q8_NARROW_MIN_M && fm_q8_panels_narrow_avx2((*g)->P, ((*g)->N + 15) / 16 * (((*g)->K + 3) / 4) * 64)) {
        *own = **g;
        own->narrow = true;
        *g = own;
        return NULL;
    }
    const int64_t n = ((*g)->M - 1) * (*g)->lda + 4 * (((*g)->K + 3) / 4);
    uint8_t *as = malloc((size_t)n);
    if (!as) { *impl = FM_Q8_REF; return NULL; }
    /* through restrict locals: a byte store may alias (*g)->A (char types alias all), so the
     * loop reloaded the pointer after every store and stayed scalar: 20% of an int8 CNN's
     * batch at the AVX2 level (perf, FATHOM_ISA=avx2, fashion-cnn batch 32) */
    const uint8_t *restrict src = (*g)->A;
    uint8_t *restrict dst = as;
    for (int64_t i = 0; i < n; i++) dst[i] = src[i] ^ 0x80;
    *own = **g;
    own->A = as;
    *g = own;
    return as;
}

void fm_q8_pgemm_serial(const fm_q8_pgemm *g, fm_q8_impl impl) {
    if (g->M <= 0 || g->N <= 0) return;
    fm_q8_pgemm own;
    uint8_t *as = avx2_codes(&g, &own, &impl);
    const int64_t Np = (g->N + 15) / 16, n_nb = (Np + Q8_NP - 1) / Q8_NP;
    pjob j = {g, impl, (g->M + Q8_MB - 1) / Q8_MB};
    ptask(&j, 0, n_nb * j.n_mb, 0);
    free(as);
}

void fm_q8_pgemm_run(const fm_q8_pgemm *g, fm_q8_impl impl) {
    if (g->M <= 0 || g->N <= 0) return;
    const int nt = fm_num_threads();
    bool vnni_rows = impl == FM_Q8_VNNI && fm_cpu_get_features()->intel;
    if ((impl == FM_Q8_AMX || vnni_rows) && g->M >= 64 * (int64_t)nt) {
        const int64_t align = impl == FM_Q8_AMX ? 32 : 1;
        rows_job j = {g, ((g->M + nt - 1) / nt + align - 1) / align * align, align, impl == FM_Q8_AMX};
        fm_parallel_for(nt, 1, rows_task, &j);
        return;
    }
    fm_q8_pgemm own;
    uint8_t *as = avx2_codes(&g, &own, &impl);
    const int64_t Np = (g->N + 15) / 16, n_nb = (Np + Q8_NP - 1) / Q8_NP;
    pjob j = {g, impl, (g->M + Q8_MB - 1) / Q8_MB};
    /* below ~2^18 multiply-adds a thread hand-off costs more than it saves */
    int64_t rows = g->M < Q8_MB ? g->M : Q8_MB, work = rows * g->K * 16 * Q8_NP;
    int64_t grain = work >= (1 << 18) ? 1 : ((1 << 18) + work - 1) / work;
    fm_parallel_for_dynamic(n_nb * j.n_mb, grain, ptask, &j);
    free(as);
}
