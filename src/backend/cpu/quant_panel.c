/* The int8 product on weights packed in panels (quant_kernels.h, layout
 * "vnni16x4"): the scalar reference and the driver that splits the product
 * over the thread pool. */
#include <stdatomic.h>
#include <stdlib.h>

#include "backend/cpu/quant_kernels.h"
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
    int64_t n_mb, n_tasks, grain;
    _Atomic int64_t next; /* the next task not yet claimed */
} pjob;

/* A task is 4 panels (64 columns) x up to Q8_MB rows: the 64 x K weight bytes
 * stay in L2 while the rows stream past them in register blocks. */
#define Q8_NP 4
#define Q8_MB 96
static void run_tasks(const pjob *j, int64_t b0, int64_t b1) {
    const fm_q8_pgemm *g = j->g;
    const int64_t Np = (g->N + 15) / 16;
    for (int64_t b = b0; b < b1; b++) {
        int64_t nb = b / j->n_mb, mb = b % j->n_mb;
        int64_t p0 = nb * Q8_NP, p1 = p0 + Q8_NP < Np ? p0 + Q8_NP : Np;
        int64_t m0 = mb * Q8_MB, m1 = m0 + Q8_MB < g->M ? m0 + Q8_MB : g->M;
        if (j->impl == FM_Q8_VNNI) fm_q8_pgemm_tile_vnni(g, m0, m1, p0, p1);
        else if (j->impl == FM_Q8_AVX2) fm_q8_pgemm_tile_avx2(g, m0, m1, p0, p1);
        else fm_q8_pgemm_tile_ref(g, m0, m1, p0, p1);
    }
}

/* Each pool thread claims `grain` tasks at a time until none is left, so a thread
 * that starts late (woken from sleep, or descheduled) takes fewer, instead of the
 * others waiting for its fixed half: with one static chunk per thread the pool's
 * second thread sat idle for 12% of a 512 x 384 x 128 product (perf). Each task
 * writes its own outputs, so which thread runs it changes no value. */
static void ptask(void *ctx, int64_t b0, int64_t b1, int tid) {
    (void)b0, (void)b1, (void)tid;
    pjob *j = ctx;
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&j->next, j->grain, memory_order_relaxed);
        if (b >= j->n_tasks) return;
        run_tasks(j, b, b + j->grain < j->n_tasks ? b + j->grain : j->n_tasks);
    }
}

void fm_q8_pgemm_run(const fm_q8_pgemm *g, fm_q8_impl impl) {
    if (g->M <= 0 || g->N <= 0) return;
    fm_q8_pgemm flipped;
    uint8_t *as = NULL;
    if (impl == FM_Q8_AVX2) { /* its tiles read a - 128 as s8 (quant_panel_avx2.c): one xor per code, here */
        const int64_t n = (g->M - 1) * g->lda + 4 * ((g->K + 3) / 4);
        as = malloc((size_t)n);
        if (!as) impl = FM_Q8_REF; /* slower, same integers */
        else {
            for (int64_t i = 0; i < n; i++) as[i] = g->A[i] ^ 0x80;
            flipped = *g;
            flipped.A = as;
            g = &flipped;
        }
    }
    const int64_t Np = (g->N + 15) / 16, n_nb = (Np + Q8_NP - 1) / Q8_NP;
    pjob j = {.g = g, .impl = impl, .n_mb = (g->M + Q8_MB - 1) / Q8_MB};
    j.n_tasks = n_nb * j.n_mb;
    /* below ~2^18 multiply-adds a thread hand-off costs more than it saves */
    int64_t rows = g->M < Q8_MB ? g->M : Q8_MB, work = rows * g->K * 16 * Q8_NP;
    j.grain = work >= (1 << 18) ? 1 : ((1 << 18) + work - 1) / work;
    atomic_init(&j.next, 0);
    int64_t threads = (j.n_tasks + j.grain - 1) / j.grain, nt = fm_num_threads();
    if (threads > nt) threads = nt;
    if (threads <= 1) run_tasks(&j, 0, j.n_tasks);
    else fm_parallel_for(threads, 1, ptask, &j);
    free(as);
}
