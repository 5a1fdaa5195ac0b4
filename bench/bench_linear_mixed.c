/* The GPT's linears under --precision bf16 (fm_linear_mixed: bf16 GEMMs on f32
 * activations) against the f32 linear (fm_linear), forward + backward, on the
 * kjv-gpt shapes (2048 tokens a step: [2048, in] @ [out, in]^T + b).
 *
 *   FATHOM_NUM_THREADS=1 FATHOM_BENCH_CLOCK=cpu build/bench_linear_mixed [rounds]
 *
 * Rounds alternate the two (blocks of 9 repetitions each), so load from other
 * processes falls on both; the figure is the median over all repetitions. Which
 * path the bf16 products take (oneDNN or widened to f32: `fathom info`) is
 * decided once per process: run it again with FATHOM_DNNL=on or off to compare. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h" /* fm_bf16_gemm_info_get */
#include "bench_util.h"
#include "core/parallel.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "ops/ops_internal.h" /* fm_linear_mixed */

#define REPS 9

/* one forward + backward; false on an error (printed) */
static bool step(bool mixed, fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *gy) {
    fm_tensor *y = mixed ? fm_linear_mixed(x, w, b, FM_BF16) : fm_linear(x, w, b);
    bool ok = y && fm_backward(y, gy, false) == FM_OK;
    if (!ok) fprintf(stderr, "bench_linear_mixed: %s\n", fm_last_error());
    fm_tensor_release(y);
    fm_tensor_zero_grad(x);
    fm_tensor_zero_grad(w);
    fm_tensor_zero_grad(b);
    return ok;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (rounds < 1 || rounds > 100) {
        fprintf(stderr, "usage: %s [rounds 1-100]\n", argv[0]);
        return 2;
    }
    fm_manual_seed(1);
    fm_bf16_gemm_info bi;
    fm_bf16_gemm_info_get(&bi);
    static const int64_t shapes[][2] = {{128, 384}, {128, 128}, {128, 512}, {512, 128}}; /* in, out */
    const int64_t R = 2048;
    double *t32 = malloc(sizeof(double) * (size_t)(rounds * REPS)), *t16 = malloc(sizeof(double) * (size_t)(rounds * REPS));
    double sum32 = 0, sum16 = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t in = shapes[s][0], out = shapes[s][1];
        fm_tensor *x = fm_tensor_randn(2, (int64_t[]){R, in}, FM_F32, NULL);
        fm_tensor *w = fm_tensor_randn(2, (int64_t[]){out, in}, FM_F32, NULL);
        fm_tensor *b = fm_tensor_randn(1, (int64_t[]){out}, FM_F32, NULL);
        fm_tensor *gy = fm_tensor_randn(2, (int64_t[]){R, out}, FM_F32, NULL);
        fm_tensor_requires_grad_(x, true);
        fm_tensor_requires_grad_(w, true);
        fm_tensor_requires_grad_(b, true);
        int n = 0;
        for (int r = 0; r < rounds; r++)
            for (int mixed = 0; mixed < 2; mixed++)
                for (int k = -1; k < REPS; k++) { /* k = -1: warm-up, not kept */
                    double t0 = bench_now_ms();
                    if (!step(mixed, x, w, b, gy)) return 1;
                    double dt = bench_now_ms() - t0;
                    if (k >= 0) (mixed ? t16 : t32)[n + k] = dt;
                    if (mixed && k == REPS - 1) n += REPS;
                }
        double m32 = bench_median(t32, n), m16 = bench_median(t16, n);
        sum32 += m32;
        sum16 += m16;
        printf("{\"bench\":\"linear_mixed\",\"rows\":%lld,\"in\":%lld,\"out\":%lld,\"f32_ms\":%.3f,\"bf16_mixed_ms\":%.3f,"
               "\"f32_over_bf16\":%.2f,\"bf16_path\":\"%s\",\"threads\":%d}\n",
               (long long)R, (long long)in, (long long)out, m32, m16, m32 / m16, bi.loaded ? "onednn" : "widen-f32",
               fm_num_threads());
        fflush(stdout);
        fm_tensor_release_n(4, x, w, b, gy);
    }
    printf("{\"bench\":\"linear_mixed_sum\",\"f32_ms\":%.3f,\"bf16_mixed_ms\":%.3f,\"f32_over_bf16\":%.2f}\n", sum32, sum16,
           sum32 / sum16);
    free(t32);
    free(t16);
    fm_parallel_shutdown();
    return 0;
}
