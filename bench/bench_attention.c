/* Benchmark of scaled_dot_product_attention, forward and backward (f32).
 *
 *   bench_attention [B H T D reps]      (default 8 8 512 64 7)
 *
 * FATHOM_BENCH_DTYPE=bf16: the same f32 tensors through the bf16-product kernel
 * (fm_scaled_dot_product_attention_mixed, what bf16 training runs; rows say
 * "dtype":"bf16"); where the CPU has no fast bf16 dot product it runs f32.
 *
 * Prints one JSON line per measurement (median ms over reps after a warm-up),
 * causal and non-causal. bench/bench_attention.py runs this binary and the
 * PyTorch equivalent side by side and prints the ratio table. Threads come from
 * FATHOM_NUM_THREADS (the script sets 2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "core/parallel.h" /* fm_num_threads, fm_parallel_shutdown */
#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "ops/ops_internal.h" /* fm_scaled_dot_product_attention_mixed */

static bool g_bf16;

static fm_tensor *attend(fm_tensor *q, fm_tensor *k, fm_tensor *v, bool causal) {
    return g_bf16 ? fm_scaled_dot_product_attention_mixed(q, k, v, causal, 0, FM_BF16)
                  : fm_scaled_dot_product_attention(q, k, v, causal, 0);
}

int main(int argc, char **argv) {
    int64_t B = 8, H = 8, T = 512, D = 64;
    int reps = 7;
    if (argc >= 5) {
        B = atoll(argv[1]); H = atoll(argv[2]); T = atoll(argv[3]); D = atoll(argv[4]);
    }
    if (argc >= 6) reps = atoi(argv[5]);
    if (B <= 0 || H <= 0 || T <= 0 || D <= 0 || reps <= 0 || reps > 1000) {
        fprintf(stderr, "usage: %s [B H T D reps]\n", argv[0]);
        return 2;
    }
    const char *dtype = getenv("FATHOM_BENCH_DTYPE");
    g_bf16 = dtype && !strcmp(dtype, "bf16");
    if (dtype && *dtype && !g_bf16 && strcmp(dtype, "f32")) {
        fprintf(stderr, "bench_attention: FATHOM_BENCH_DTYPE is f32 or bf16, not '%s'\n", dtype);
        return 2;
    }
    fm_rng r;
    fm_rng_init(&r, 1);
    int64_t shape[4] = {B, H, T, D};
    fm_tensor *q = fm_tensor_randn(4, shape, FM_F32, &r), *k = fm_tensor_randn(4, shape, FM_F32, &r);
    fm_tensor *v = fm_tensor_randn(4, shape, FM_F32, &r), *dO = fm_tensor_randn(4, shape, FM_F32, &r);
    if (!q || !k || !v || !dO) {
        fprintf(stderr, "bench_attention: %s\n", fm_last_error());
        return 1;
    }
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int causal = 0; causal < 2; causal++) {
        /* forward, no grad */
        bool prev = fm_set_grad_enabled(false);
        for (int i = -1; i < reps; i++) {
            double t0 = bench_now_ms();
            fm_tensor *o = attend(q, k, v, causal);
            double dt = bench_now_ms() - t0;
            if (!o) { fprintf(stderr, "bench_attention: %s\n", fm_last_error()); return 1; }
            fm_tensor_release(o);
            if (i >= 0) t[i] = dt;
        }
        fm_set_grad_enabled(prev);
        printf("{\"bench\":\"sdpa_fwd\",\"causal\":%s,\"B\":%lld,\"H\":%lld,\"T\":%lld,\"D\":%lld,\"dtype\":\"%s\","
               "\"threads\":%d,\"metric\":\"ms\",\"fathom\":%.3f}\n",
               causal ? "true" : "false", (long long)B, (long long)H, (long long)T, (long long)D, g_bf16 ? "bf16" : "f32", fm_num_threads(),
               bench_median(t, reps));
        fflush(stdout);
        /* backward: the forward runs untimed each rep */
        fm_tensor *in[3] = {q, k, v};
        for (int j = 0; j < 3; j++) fm_tensor_requires_grad_(in[j], true);
        for (int i = -1; i < reps; i++) {
            for (int j = 0; j < 3; j++) fm_tensor_zero_grad(in[j]);
            fm_tensor *o = attend(q, k, v, causal);
            if (!o) { fprintf(stderr, "bench_attention: %s\n", fm_last_error()); return 1; }
            double t0 = bench_now_ms();
            fm_status st = fm_backward(o, dO, false);
            double dt = bench_now_ms() - t0;
            fm_tensor_release(o);
            if (st != FM_OK) { fprintf(stderr, "bench_attention: %s\n", fm_last_error()); return 1; }
            if (i >= 0) t[i] = dt;
        }
        for (int j = 0; j < 3; j++) {
            fm_tensor_zero_grad(in[j]);
            fm_tensor_requires_grad_(in[j], false);
        }
        printf("{\"bench\":\"sdpa_bwd\",\"causal\":%s,\"B\":%lld,\"H\":%lld,\"T\":%lld,\"D\":%lld,\"dtype\":\"%s\","
               "\"threads\":%d,\"metric\":\"ms\",\"fathom\":%.3f}\n",
               causal ? "true" : "false", (long long)B, (long long)H, (long long)T, (long long)D, g_bf16 ? "bf16" : "f32", fm_num_threads(),
               bench_median(t, reps));
        fflush(stdout);
    }
    free(t);
    fm_tensor_release_n(4, q, k, v, dO);
    fm_parallel_shutdown();
    return 0;
}
