/* fathom's own f32 AVX-512 GEMM (gemm_f32_avx512.c) against oneDNN's f32 matmul
 * (gemm_bf16.c), both under fathom's pool, in one process and paired call by call:
 * on a shared machine whose speed drifts by 10% between minutes, only calls made
 * side by side compare two kernels that differ by a few percent.
 *
 *     FATHOM_NUM_THREADS=2 build/bench_gemm_pair M N K [pairs]
 *
 * Prints one JSON line: each side's median and best GFLOP/s and the ratio of the
 * medians (own / oneDNN, > 1: fathom's kernel faster). Exits 2 where either path is
 * missing (no AVX-512, or oneDNN not loaded or not chosen for f32). */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "bench_util.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

#define MAX_PAIRS 256

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_gemm_pair M N K [pairs (default 40)]\n");
        return 2;
    }
    int64_t M = atoll(argv[1]), N = atoll(argv[2]), K = atoll(argv[3]);
    int pairs = argc > 4 ? atoi(argv[4]) : 40;
    if (M < 1 || N < 1 || K < 1 || pairs < 1 || pairs > MAX_PAIRS) {
        fprintf(stderr, "bench_gemm_pair: M, N, K must be >= 1 and pairs 1..%d\n", MAX_PAIRS);
        return 2;
    }
    if (!fm_cpu_use_avx512()) {
        fprintf(stderr, "bench_gemm_pair: the kernel level is %s, below avx512: no own f32 kernel here\n",
                fm_isa_name(fm_cpu_isa()));
        return 2;
    }
    float *A = malloc((size_t)(M * K) * sizeof(float)), *B = malloc((size_t)(K * N) * sizeof(float));
    float *C = malloc((size_t)(M * N) * sizeof(float));
    if (!A || !B || !C) {
        fprintf(stderr, "bench_gemm_pair: out of memory for %lldx%lldx%lld\n", (long long)M, (long long)N, (long long)K);
        return 1;
    }
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)((i * 7919) % 1000) / 1000.f - 0.5f;
    for (int64_t i = 0; i < K * N; i++) B[i] = (float)((i * 104729) % 1000) / 1000.f - 0.5f;
    fm_cpu_gemm_args g = {FM_F32, false, false, M, N, K, A, K, B, N, 0.0, C, N};
    if (!fm_cpu_gemm_f32_dnnl(&g, NULL)) {
        fm_f32_gemm_info fi;
        fm_f32_gemm_info_get(&fi);
        fprintf(stderr, "bench_gemm_pair: oneDNN does not run this f32 product (%s)\n", fi.onednn ? "too small" : fi.note);
        return 2;
    }
    double own[MAX_PAIRS], dnnl[MAX_PAIRS];
    for (int r = -2; r < pairs; r++) { /* two warm-up pairs; the order alternates */
        double t[2];
        for (int side = 0; side < 2; side++) {
            bool first_own = (r & 1) == 0, run_own = (side == 0) == first_own;
            double t0 = bench_now_ms();
            bool ok = run_own ? fm_cpu_gemm_f32_avx512(&g, NULL) : fm_cpu_gemm_f32_dnnl(&g, NULL);
            t[run_own ? 0 : 1] = bench_now_ms() - t0;
            if (!ok) {
                fprintf(stderr, "bench_gemm_pair: the %s path refused the product\n", run_own ? "own" : "oneDNN");
                return 1;
            }
        }
        if (r >= 0) {
            own[r] = t[0];
            dnnl[r] = t[1];
        }
    }
    qsort(own, (size_t)pairs, sizeof *own, bench_cmp_d);
    qsort(dnnl, (size_t)pairs, sizeof *dnnl, bench_cmp_d);
    double f = 2.0 * (double)M * (double)N * (double)K / 1e6;
    printf("{\"bench\":\"gemm_pair\",\"shape\":[%lld,%lld,%lld],\"threads\":%d,\"pairs\":%d,\"own_gflops\":%.1f,"
           "\"own_best\":%.1f,\"onednn_gflops\":%.1f,\"onednn_best\":%.1f,\"own_over_onednn\":%.3f,\"cpu\":\"%s\"}\n",
           (long long)M, (long long)N, (long long)K, fm_num_threads(), pairs, f / own[pairs / 2], f / own[0],
           f / dnnl[pairs / 2], f / dnnl[0], dnnl[pairs / 2] / own[pairs / 2], fm_cpu_get_features()->model);
    free(A);
    free(B);
    free(C);
    fm_parallel_shutdown();
    return 0;
}
