/* linear_fused with packed weights (the compiled graph's linear) against the path it
 * replaces (linear: OpenBLAS, or the GEMV / small-M kernels, with the bias; then a
 * ReLU pass), on the linear layers of fashion-cnn, fashion-mlp and kjv-gpt. The two
 * sides alternate in rounds; each reports the median time per call and GFLOP/s.
 * Run it at one thread with FATHOM_BENCH_CLOCK=cpu for CPU time on a shared machine:
 *   FATHOM_NUM_THREADS=1 FATHOM_BENCH_CLOCK=cpu build/bench_graph_linear [--rounds 15]
 * Also prints the largest difference between the two (relative to the output's
 * largest magnitude). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fathom/autograd.h"
#include "fathom/fathom.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_num_threads */

typedef struct shape { const char *what; int64_t M, N, K; int relu; } shape;

static double max_rel(const fm_tensor *a, const fm_tensor *b) {
    const float *pa = fm_tensor_data(a), *pb = fm_tensor_data(b);
    double d = 0, m = 0;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) d = fmax(d, fabs((double)pa[i] - pb[i])), m = fmax(m, fabs((double)pb[i]));
    return d / (m > 0 ? m : 1);
}

int main(int argc, char **argv) {
    int rounds = 15;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else { fprintf(stderr, "usage: bench_graph_linear [--rounds N]\n"); return 2; }
    }
    if (rounds < 1 || rounds > 1000) { fprintf(stderr, "bench_graph_linear: --rounds must be in [1, 1000]\n"); return 2; }
    const shape shapes[] = {
        {"fashion-cnn fc1 (3136->128, relu)", 1, 128, 3136, 1},  {"fashion-cnn fc1", 32, 128, 3136, 1},
        {"fashion-cnn fc2 (128->10)", 1, 10, 128, 0},             {"fashion-cnn fc2", 32, 10, 128, 0},
        {"fashion-mlp fc1 (784->1024, relu)", 1, 1024, 784, 1},  {"fashion-mlp fc1", 32, 1024, 784, 1},
        {"fashion-mlp fc2 (1024->1024, relu)", 32, 1024, 1024, 1}, {"fashion-mlp fc2", 128, 1024, 1024, 1},
        {"kjv-gpt qkv (128->384), 64 tokens x 32", 2048, 384, 128, 0}, {"kjv-gpt mlp fc (128->512)", 2048, 512, 128, 0},
        {"kjv-gpt mlp proj (512->128)", 2048, 128, 512, 0},   {"kjv-gpt lm_head (128->512), decode", 1, 512, 128, 0},
        {"kjv-gpt qkv, decode", 1, 384, 128, 0}, {"kjv-gpt attn proj (128->128), decode", 1, 128, 128, 0},
        {"kjv-gpt mlp proj (512->128), decode", 1, 128, 512, 0},
        {"kjv-gpt qkv, 64 tokens x 1", 64, 384, 128, 0},
    };
    fm_set_grad_enabled(false);
    fm_rng r;
    fm_rng_init(&r, 1);
    printf("# linear_fused (packed weights) vs linear + relu, %d threads, median of %d rounds\n", fm_num_threads(), rounds);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        fm_tensor *x = fm_tensor_randn(2, (int64_t[]){sh->M, sh->K}, FM_F32, &r), *w = fm_tensor_randn(2, (int64_t[]){sh->N, sh->K}, FM_F32, &r);
        fm_tensor *b = fm_tensor_randn(1, &sh->N, FM_F32, &r), *pk = fm_linear_fused_pack(w);
        if (!x || !w || !b || !pk) { fprintf(stderr, "bench_graph_linear: %s\n", fm_last_error()); return 1; }
        const double flop = 2.0 * (double)(sh->M * sh->N * sh->K);
        const int inner = flop > 1e8 ? 1 : flop > 1e7 ? 8 : flop > 1e6 ? 64 : 512;
        double *ta = malloc(sizeof(double) * (size_t)rounds), *tb = malloc(sizeof(double) * (size_t)rounds), diff = 0;
        for (int k = 0; k < rounds; k++) {
            double t0 = bench_now_s();
            for (int i = 0; i < inner; i++) {
                fm_tensor *y = fm_linear(x, w, b), *z = sh->relu && y ? fm_relu(y) : NULL;
                fm_tensor_release_n(2, y, z);
            }
            double t1 = bench_now_s();
            for (int i = 0; i < inner; i++) fm_tensor_release(fm_linear_fused(x, w, b, pk, sh->relu));
            double t2 = bench_now_s();
            ta[k] = (t1 - t0) / inner, tb[k] = (t2 - t1) / inner;
        }
        fm_tensor *y = fm_linear(x, w, b), *z = sh->relu ? fm_relu(y) : fm_tensor_retain(y), *f = fm_linear_fused(x, w, b, pk, sh->relu);
        if (z && f) diff = max_rel(f, z);
        double ma = bench_median(ta, rounds), mb = bench_median(tb, rounds);
        printf("{\"shape\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"linear_relu_ms\": %.4f, \"linear_fused_ms\": %.4f, "
               "\"speedup\": %.3f, \"linear_gflops\": %.1f, \"fused_gflops\": %.1f, \"max_rel_diff\": %.2e}\n",
               sh->what, (long long)sh->M, (long long)sh->N, (long long)sh->K, 1e3 * ma, 1e3 * mb, ma / mb, flop / ma * 1e-9, flop / mb * 1e-9, diff);
        fflush(stdout);
        fm_tensor_release_n(7, x, w, b, pk, y, z, f);
        free(ta), free(tb);
    }
    return 0;
}
