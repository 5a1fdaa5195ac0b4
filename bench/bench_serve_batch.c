/* What dynamic batching can win on a served model, without HTTP: the servable's
 * run() (what a batcher instance calls) at batch 1, 2, 4, ... 64, the sizes
 * interleaved round by round (1 2 4 ... 64, 1 2 4 ... 64, ...) so that load
 * from other processes falls on all of them. Per size: the median wall time
 * and the median CPU time of this process per sample (CPU time counts every
 * thread of the pool and is not inflated by being descheduled, so on a loaded
 * machine it is the steadier figure). If the per-sample cost falls with the
 * batch, batching can raise throughput by that factor at most; if it is flat,
 * the model's arithmetic is the limit and batching only saves the per-request
 * part of serving (HTTP, decoding, the hand-off to the instance).
 *
 *   bench_serve_batch VERSION_DIR [rounds]   (a model folder the server serves, e.g. brepo/fashion-cnn/1)
 * Set FATHOM_NUM_THREADS=1 to see one core's figures. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"
#include "core/parallel.h"
#include "fathom/tensor.h"
#include "serve/servable.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { N_SIZES = 7, MAX_ROUNDS = 64 };

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bench_serve_batch VERSION_DIR [rounds]\n"); return 2; }
    int rounds = argc > 2 ? atoi(argv[2]) : 15;
    if (rounds < 1 || rounds > MAX_ROUNDS) { fprintf(stderr, "bench_serve_batch: rounds must be 1-%d\n", MAX_ROUNDS); return 2; }
    fm_servable *s = fm_servable_open(argv[1], (fm_device){FM_DEV_CPU, 0}, NULL, NULL, NULL, 0, false);
    if (!s) { fprintf(stderr, "bench_serve_batch: %s\n", fm_last_error()); return 1; }
    const int sizes[N_SIZES] = {1, 2, 4, 8, 16, 32, 64};
    fm_tensor *in[N_SIZES][FM_SERVE_MAX_IO] = {{0}};
    for (int b = 0; b < N_SIZES; b++)
        for (int i = 0; i < s->n_inputs; i++) {
            int64_t shape[FM_MAX_DIMS];
            shape[0] = sizes[b];
            for (int d = 0; d < s->inputs[i].ndim; d++) shape[d + 1] = s->inputs[i].dims[d] > 0 ? s->inputs[i].dims[d] : 1;
            if (s->inputs[i].dtype != FM_F32) { fprintf(stderr, "bench_serve_batch: input %d is not FP32\n", i); return 1; }
            fm_rng rng;
            fm_rng_init(&rng, 7);
            in[b][i] = fm_tensor_rand(s->inputs[i].ndim + 1, shape, FM_F32, &rng);
            if (!in[b][i]) { fprintf(stderr, "bench_serve_batch: %s\n", fm_last_error()); return 1; }
        }
    static double wall[N_SIZES][MAX_ROUNDS], cpu[N_SIZES][MAX_ROUNDS];
    for (int r = -2; r < rounds; r++) /* two warm-up rounds */
        for (int b = 0; b < N_SIZES; b++) {
            fm_tensor *out[FM_SERVE_MAX_IO] = {0};
            /* enough calls per timing that batch 1 is not a single sub-ms call */
            int calls = 64 / sizes[b];
            double w0 = bench_now_s(), c0 = cpu_s();
            for (int k = 0; k < calls; k++) {
                if (s->run(s, in[b], out) != FM_OK) { fprintf(stderr, "bench_serve_batch: %s\n", fm_last_error()); return 1; }
                for (int j = 0; j < s->n_outputs; j++) { fm_tensor_release(out[j]); out[j] = NULL; }
            }
            if (r >= 0) {
                wall[b][r] = (bench_now_s() - w0) / 64 * 1e6;
                cpu[b][r] = (cpu_s() - c0) / 64 * 1e6;
            }
        }
    printf("model %s (%s), %d threads, median of %d interleaved rounds of 64 samples\n", argv[1], s->platform,
           fm_num_threads(), rounds);
    printf("%6s %16s %15s %14s\n", "batch", "wall us/sample", "CPU us/sample", "CPU vs batch 1");
    double c1 = 0;
    for (int b = 0; b < N_SIZES; b++) {
        double w = bench_median(wall[b], rounds), c = bench_median(cpu[b], rounds);
        if (b == 0) c1 = c;
        printf("%6d %16.1f %15.1f %13.2fx\n", sizes[b], w, c, c1 / c);
    }
    for (int b = 0; b < N_SIZES; b++)
        for (int i = 0; i < s->n_inputs; i++) fm_tensor_release(in[b][i]);
    fm_servable_free(s);
    fm_parallel_shutdown();
    return 0;
}
