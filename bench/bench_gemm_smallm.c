/* The small-M product (gemm_smallm.h) against OpenBLAS's sgemm on the shapes of
 * batched decoding: C[M, N] = A[M, K] W[N, K]^T for a linear's [out, in]
 * weight, one thread each, the two interleaved call by call (A B A B ...) so
 * that load from other processes falls on both alike. Prints the median time
 * per call and the ratio; the crossover sets FM_SMALLM_MAX in gemm_cpu.c.
 *
 *   ./build/bench_gemm_smallm [reps]      (default 200 calls per side) */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/gemm_smallm.h"
#include "backend/cpu/openblas_load.h"
#include "bench_util.h"
#include "core/cpu_features.h"

typedef struct shp { const char *what; int N, K; } shp;

static void fill(float *p, size_t n, unsigned s) {
    for (size_t i = 0; i < n; i++) { s = s * 1103515245u + 12345u; p[i] = (float)((s >> 9) & 0xFFFF) / 65536.0f - 0.5f; }
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    if (reps < 3) reps = 3;
    const fm_openblas_fns *blas = fm_openblas();
    if (!blas || !fm_cpu_use_avx2()) { fprintf(stderr, "bench_gemm_smallm: needs OpenBLAS and AVX2\n"); return 77; }
    blas->set_num_threads(1);
    const shp shapes[] = {{"kjv qkv", 384, 128}, {"kjv proj", 128, 128}, {"kjv fc", 512, 128}, {"kjv fc2", 128, 512},
                          {"gpt2 qkv", 2304, 768}, {"gpt2 fc", 3072, 768}, {"gpt2 fc2", 768, 3072}};
    const int Ms[] = {2, 4, 8, 12, 16, 24, 32};
    const bool z = fm_cpu_use_avx512();
    printf("CPU: %s; kernel: %s; one thread; median of %d interleaved calls\n", fm_cpu_get_features()->model,
           z ? "avx512" : "avx2", reps);
    printf("%-9s %5s %5s %3s %10s %10s %7s\n", "shape", "N", "K", "M", "smallm us", "sgemm us", "sgemm/s");
    double *ta = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, K = shapes[s].K;
        float *W = malloc(sizeof(float) * (size_t)N * (size_t)K), *A = malloc(sizeof(float) * 32 * (size_t)K);
        float *C = malloc(sizeof(float) * 32 * (size_t)N);
        if (!W || !A || !C || !ta || !tb) { fprintf(stderr, "out of memory\n"); return 1; }
        fill(W, (size_t)N * (size_t)K, 1);
        fill(A, 32 * (size_t)K, 2);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi];
            for (int r = 0; r < reps; r++) {
                double t0 = bench_now_s();
                if (z) fm_gemm_smallm_f32_avx512(M, N, K, A, K, W, K, 0.0f, C, N);
                else fm_gemm_smallm_f32_avx2(M, N, K, A, K, W, K, 0.0f, C, N);
                double t1 = bench_now_s();
                blas->sgemm(FM_CBLAS_ROW_MAJOR, FM_CBLAS_NO_TRANS, FM_CBLAS_TRANS, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N);
                double t2 = bench_now_s();
                ta[r] = t1 - t0;
                tb[r] = t2 - t1;
            }
            double a = bench_median(ta, reps) * 1e6, b = bench_median(tb, reps) * 1e6;
            printf("%-9s %5d %5d %3d %10.2f %10.2f %7.2f\n", shapes[s].what, N, K, M, a, b, b / a);
        }
        free(W); free(A); free(C);
    }
    free(ta); free(tb);
    return 0;
}
