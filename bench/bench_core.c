/* Core benchmarks: f32 GEMM through fm_matmul against OpenBLAS's own sgemm in
 * the same process, and elementwise ops (add, GELU erf and tanh forms) forward and backward over 4M
 * elements, and bf16 GEMM through fm_matmul against f32 fm_matmul. Prints one JSON line per measurement (median of the repetitions);
 * bench/bench_core.py runs the PyTorch side and forms the ratios. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/openblas_load.h"
#include "bench_util.h"
#include "core/parallel.h"
#include "fathom/fathom.h"

/* the upper median (v[n/2] for even n), which the published bench_core rows used */
static double median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, bench_cmp_d); return v[n / 2]; }

static void bench_gemm(int64_t M, int64_t N, int64_t K, int reps) {
    int64_t sa[2] = {M, K}, sb[2] = {K, N};
    fm_tensor *a = fm_tensor_randn(2, sa, FM_F32, NULL), *b = fm_tensor_randn(2, sb, FM_F32, NULL);
    double t_fm[64], t_blas[64];
    float *c = malloc((size_t)(M * N) * sizeof(float));
    /* fathom runs OpenBLAS single-threaded under its own pool (docs/ARCHITECTURE.md);
     * the reference is OpenBLAS driving the same number of threads itself. Blocks of
     * repetitions rather than alternating calls, so that neither side runs while the
     * other's idle threads are still spinning; two rounds of each against drift.
     * The reference calls the library fathom loaded (fm_openblas), not one linked
     * into this program: a linked OpenBLAS is initialized before fathom can choose
     * its kernels, and on a CPU it does not know both sides would run its generic ones. */
    const fm_openblas_fns *ob = fm_openblas();
    if (!ob) { fprintf(stderr, "bench_core: OpenBLAS is not loaded, no reference to compare with\n"); exit(1); }
    int half = reps / 2 > 0 ? reps / 2 : 1, nf = 0, nb = 0;
    for (int round = 0; round < 2; round++) {
        ob->set_num_threads(1);
        for (int r = -1; r < half && nf < 64; r++) {
            double t0 = bench_now_ms();
            fm_tensor *y = fm_matmul(a, b);
            double t1 = bench_now_ms();
            fm_tensor_release(y);
            if (r >= 0) t_fm[nf++] = t1 - t0;
        }
        ob->set_num_threads(fm_num_threads());
        for (int r = -1; r < half && nb < 64; r++) {
            double t2 = bench_now_ms();
            ob->sgemm(101 /* row major */, 111, 111 /* no transposes */, (int)M, (int)N, (int)K, 1.0f, fm_tensor_data(a), (int)K,
                        fm_tensor_data(b), (int)N, 0.0f, c, (int)N);
            double t3 = bench_now_ms();
            if (r >= 0) t_blas[nb++] = t3 - t2;
        }
        ob->set_num_threads(1);
    }
    reps = nf < nb ? nf : nb;
    double flops = 2.0 * M * N * K, mf = median(t_fm, reps), mb = median(t_blas, reps);
    printf("{\"bench\":\"matmul_f32\",\"shape\":[%lld,%lld,%lld],\"fathom_ms\":%.3f,\"openblas_ms\":%.3f,"
           "\"fathom_gflops\":%.1f,\"openblas_gflops\":%.1f,\"fraction_of_openblas\":%.3f,\"threads\":%d}\n",
           (long long)M, (long long)N, (long long)K, mf, mb, flops / mf / 1e6, flops / mb / 1e6, mb / mf, fm_num_threads());
    fflush(stdout);
    free(c);
    fm_tensor_release_n(2, a, b);
}

/* bf16 GEMM through fm_matmul (the CPU's bf16 hardware via oneDNN where there is
 * one, else widened to f32) against fm_matmul in f32 on the same values, blocks of
 * repetitions in two rounds as above. tb: B is the transposed view of an [N, K]
 * tensor (as a linear's weight), on both sides. */
static void bench_gemm_bf16_t(int64_t M, int64_t N, int64_t K, int reps, bool tb) {
    int64_t sa[2] = {M, K}, sb[2] = {K, N}, sbt[2] = {N, K};
    fm_tensor *a = fm_tensor_randn(2, sa, FM_F32, NULL), *ab = fm_to_dtype(a, FM_BF16), *b, *bb;
    if (tb) {
        fm_tensor *bt = fm_tensor_randn(2, sbt, FM_F32, NULL), *bbt = fm_to_dtype(bt, FM_BF16);
        b = fm_transpose(bt, 0, 1);
        bb = fm_transpose(bbt, 0, 1);
        fm_tensor_release_n(2, bt, bbt);
    } else {
        b = fm_tensor_randn(2, sb, FM_F32, NULL);
        bb = fm_to_dtype(b, FM_BF16);
    }
    double t16[64], t32[64];
    int half = reps / 2 > 0 ? reps / 2 : 1, n16 = 0, n32 = 0;
    for (int round = 0; round < 2; round++) {
        for (int r = -1; r < half && n16 < 64; r++) {
            double t0 = bench_now_ms();
            fm_tensor_release(fm_matmul(ab, bb));
            if (r >= 0) t16[n16++] = bench_now_ms() - t0;
        }
        for (int r = -1; r < half && n32 < 64; r++) {
            double t0 = bench_now_ms();
            fm_tensor_release(fm_matmul(a, b));
            if (r >= 0) t32[n32++] = bench_now_ms() - t0;
        }
    }
    double flops = 2.0 * M * N * K, m16 = median(t16, n16), m32 = median(t32, n32);
    printf("{\"bench\":\"matmul_bf16\",\"shape\":[%lld,%lld,%lld],%s\"fathom_bf16_gflops\":%.1f,\"fathom_f32_gflops\":%.1f,"
           "\"bf16_over_f32\":%.2f,\"threads\":%d}\n",
           (long long)M, (long long)N, (long long)K, tb ? "\"b_transposed\":true," : "", flops / m16 / 1e6, flops / m32 / 1e6,
           m32 / m16, fm_num_threads());
    fflush(stdout);
    fm_tensor_release_n(4, a, b, ab, bb);
}

static void bench_gemm_bf16(int64_t M, int64_t N, int64_t K, int reps) { bench_gemm_bf16_t(M, N, K, reps, false); }

typedef fm_tensor *(*unary_fn)(fm_tensor *);

static void bench_elementwise(const char *name, int64_t n, int reps) {
    fm_tensor *a = fm_tensor_randn(1, &n, FM_F32, NULL), *b = fm_tensor_randn(1, &n, FM_F32, NULL);
    fm_tensor *g = fm_tensor_randn(1, &n, FM_F32, NULL);
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    double tf[64], tb[64];
    for (int r = -2; r < reps; r++) {
        double t0 = bench_now_ms();
        fm_tensor *y = !strcmp(name, "add") ? fm_add(a, b) : !strcmp(name, "gelu") ? fm_gelu(a) : fm_gelu_tanh(a);
        double t1 = bench_now_ms();
        fm_backward(y, g, false);
        double t2 = bench_now_ms();
        fm_tensor_release(y);
        fm_tensor_zero_grad(a);
        fm_tensor_zero_grad(b);
        if (r >= 0) { tf[r] = t1 - t0; tb[r] = t2 - t1; }
    }
    double mf = median(tf, reps), mb = median(tb, reps); /* sorts: [0] is then the fastest run */
    printf("{\"bench\":\"%s\",\"n\":%lld,\"fathom_fwd_ms\":%.3f,\"fathom_bwd_ms\":%.3f,\"fathom_fwd_min_ms\":%.3f,"
           "\"fathom_bwd_min_ms\":%.3f,\"threads\":%d}\n", name, (long long)n, mf, mb, tf[0], tb[0], fm_num_threads());
    fflush(stdout);
    fm_tensor_release_n(3, a, b, g);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : "all"; /* all, matmul, elementwise, gpt, f32 M N K or bf16 M N K [tb] (not in all) */
    fm_manual_seed(1);
    if (!strcmp(only, "all") || !strcmp(only, "matmul")) {
        bench_gemm(1024, 1024, 1024, 15);
        bench_gemm(4096, 1024, 1024, 7);
        bench_gemm_bf16(1024, 1024, 1024, 15);
        bench_gemm_bf16(2048, 2048, 2048, 5);
    }
    if (!strcmp(only, "bf16") && (argc == 5 || argc == 6)) /* one bf16 product: bf16 M N K [tb] */
        bench_gemm_bf16_t(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), 41, argc == 6 && !strcmp(argv[5], "tb"));
    if (!strcmp(only, "f32") && argc == 5) /* one f32 product: f32 M N K */
        bench_gemm(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), 15);
    if (!strcmp(only, "gpt")) { /* the kjv-gpt linears' products (2048 tokens a step) */
        bench_gemm_bf16(2048, 384, 128, 41);
        bench_gemm_bf16(2048, 128, 128, 41);
        bench_gemm_bf16(2048, 512, 128, 41);
        bench_gemm_bf16(2048, 128, 512, 41);
    }
    if (!strcmp(only, "all") || !strcmp(only, "elementwise")) {
        bench_elementwise("add", 4 << 20, 25);
        bench_elementwise("gelu", 4 << 20, 25);
        bench_elementwise("gelu_tanh", 4 << 20, 25);
    }
    fm_parallel_shutdown();
    return 0;
}
