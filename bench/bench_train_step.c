/* Train-step benchmark for bench/bench_train.py: times one optimizer step
 * (forward, cross-entropy, backward, update, zero_grad) of the fashion-mlp
 * (784-1024-1024-10, batch 128, SGD momentum) and fashion-cnn (batch 64, Adam)
 * models on a fixed random batch, and prints one JSON line per model.
 * --precision bf16 runs the forward under bf16 autocast (as `fathom train --precision bf16`).
 * Usage: bench_train_step [mlp|cnn|all] [--steps N] [--warmup N] [--threads N] [--precision fp32|bf16] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "core/parallel.h" /* fm_set_num_threads */
#include "fathom/amp.h"
#include "fathom/autograd.h"
#include "fathom/memory.h"
#include "fathom/optim.h"
#include "fathom/profile.h"

static fm_module *build(const char *which, fm_rng *rng) {
    fm_module *m = fm_nn_sequential();
    if (!strcmp(which, "mlp")) {
        fm_sequential_add(m, fm_nn_simple(FM_MOD_FLATTEN));
        fm_sequential_add(m, fm_nn_linear(784, 1024, true, rng));
        fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
        fm_sequential_add(m, fm_nn_linear(1024, 1024, true, rng));
        fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
        fm_sequential_add(m, fm_nn_linear(1024, 10, true, rng));
    } else {
        fm_sequential_add(m, fm_nn_conv2d(1, 32, 3, 1, 1, true, rng));
        fm_sequential_add(m, fm_nn_batchnorm2d(32, 1e-5, 0.1));
        fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
        fm_sequential_add(m, fm_nn_maxpool2d(2, 0, 0));
        fm_sequential_add(m, fm_nn_conv2d(32, 64, 3, 1, 1, true, rng));
        fm_sequential_add(m, fm_nn_batchnorm2d(64, 1e-5, 0.1));
        fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
        fm_sequential_add(m, fm_nn_maxpool2d(2, 0, 0));
        fm_sequential_add(m, fm_nn_simple(FM_MOD_FLATTEN));
        fm_sequential_add(m, fm_nn_linear(3136, 128, true, rng));
        fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
        fm_sequential_add(m, fm_nn_dropout(0.25, rng));
        fm_sequential_add(m, fm_nn_linear(128, 10, true, rng));
    }
    return m;
}

static int run(const char *which, int steps, int warmup, int threads, fm_dtype prec) {
    fm_rng rng;
    fm_rng_init(&rng, 0);
    bool mlp = !strcmp(which, "mlp");
    int64_t B = mlp ? 128 : 64;
    fm_module *m = build(which, &rng);
    fm_optim_config c = fm_optim_default_config(mlp ? FM_OPTIM_SGD : FM_OPTIM_ADAM);
    if (mlp) { c.lr = 0.01; c.momentum = 0.9; }
    fm_optim *o = fm_optim_new(&c);
    if (!m || !o || fm_optim_add_params(o, m) != FM_OK) { fprintf(stderr, "bench: %s\n", fm_last_error()); return 1; }
    fm_tensor *x = fm_tensor_randn(4, (int64_t[]){B, 1, 28, 28}, FM_F32, &rng);
    int64_t *lab = malloc((size_t)B * sizeof *lab);
    for (int64_t i = 0; i < B; i++) lab[i] = i % 10;
    fm_tensor *y = fm_tensor_from_data(lab, 1, &B, FM_I64);
    free(lab);
    double best = 1e30, total = 0;
    double loss_v = 0;
    double *dts = calloc((size_t)(steps > 0 ? steps : 1), sizeof *dts);
    const char *trace = getenv("FATHOM_BENCH_TRACE"); /* a Chrome trace of the timed steps */
    for (int s = 0; s < warmup + steps; s++) {
        if (trace && *trace && s == warmup && fm_profiler_start(trace) != FM_OK) {
            fprintf(stderr, "bench: %s\n", fm_last_error());
            return 1;
        }
        double t0 = bench_now_s();
        fm_dtype prev = fm_autocast_set(prec);
        fm_tensor *logits = fm_module_forward(m, x);
        fm_autocast_set(prev);
        fm_tensor *loss = fm_cross_entropy(logits, y, -100, 0.0, FM_REDUCE_MEAN);
        if (!loss || fm_backward(loss, NULL, false) != FM_OK || fm_optim_step(o) != FM_OK) {
            fprintf(stderr, "bench: %s\n", fm_last_error());
            return 1;
        }
        fm_optim_zero_grad(o);
        loss_v = fm_tensor_item(loss);
        fm_tensor_release_n(2, logits, loss);
        double dt = bench_now_s() - t0;
        if (s >= warmup) { total += dt; if (dt < best) best = dt; if (dts) dts[s - warmup] = dt; }
    }
    if (trace && *trace) fm_profiler_stop();
    double med = dts && steps > 0 ? bench_median(dts, steps) : 0;
    free(dts);
    fm_memory_stats ms;
    fm_memory_stats_get(FM_CPU, &ms);
    printf("{\"bench\":\"%s_train_step\",\"precision\":\"%s\",\"metric\":\"ms\",\"fathom\":%.3f,\"fathom_min\":%.3f,\"fathom_median\":%.3f,\"steps\":%d,"
           "\"batch\":%lld,\"threads\":%d,\"loss\":%.4f,\"peak_bytes\":%zu}\n",
           which, prec == FM_BF16 ? "bf16" : "fp32", 1e3 * total / steps, 1e3 * best, 1e3 * med, steps, (long long)B, threads, loss_v, ms.allocated_peak);
    fflush(stdout);
    fm_tensor_release_n(2, x, y);
    fm_optim_free(o);
    fm_module_free(m);
    return 0;
}

int main(int argc, char **argv) {
    const char *which = "all";
    int steps = 30, warmup = 5, threads = 2;
    fm_dtype prec = FM_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            if (strcmp(p, "fp32") && strcmp(p, "bf16")) {
                fprintf(stderr, "bench_train_step: --precision takes fp32 or bf16, not '%s'\n", p);
                return 2;
            }
            prec = strcmp(p, "bf16") ? FM_F32 : FM_BF16;
        }
        else which = argv[i];
    }
    if (steps < 1) steps = 1;
    fm_set_num_threads(threads);
    int rc = 0;
    if (!strcmp(which, "mlp") || !strcmp(which, "all")) rc |= run("mlp", steps, warmup, threads, prec);
    if (!strcmp(which, "cnn") || !strcmp(which, "all")) rc |= run("cnn", steps, warmup, threads, prec);
    fm_parallel_shutdown();
    return rc;
}
