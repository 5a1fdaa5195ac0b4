/* Profiler overhead: an MLP training step (784-1024-1024-10, batch 128, plain
 * SGD written here) timed with the profiler off and on, alternating rounds in one
 * process, process CPU time per step (less sensitive to other load than wall time).
 * When off, each op pays one predictable branch on a global flag in fm_dispatch.
 * Prints one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/parallel.h"
#include "fathom/fathom.h"
#include "fathom/profile.h"

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

static fm_tensor *w[3], *bias[3];

static void step(fm_tensor *x, fm_tensor *y) {
    fm_tensor *h1 = fm_linear(x, w[0], bias[0]), *a1 = fm_relu(h1);
    fm_tensor *h2 = fm_linear(a1, w[1], bias[1]), *a2 = fm_relu(h2);
    fm_tensor *lo = fm_linear(a2, w[2], bias[2]);
    fm_tensor *loss = fm_cross_entropy(lo, y, -100, 0.0, FM_REDUCE_MEAN);
    fm_backward(loss, NULL, false);
    bool prev = fm_set_grad_enabled(false);
    fm_profile_push("optimizer", "optimizer");
    for (int i = 0; i < 3; i++) {
        fm_tensor *ps[2] = {w[i], bias[i]};
        for (int k = 0; k < 2; k++) {
            fm_tensor *d = fm_mul_scalar(ps[k]->grad, -0.01), *n = fm_add(ps[k], d);
            fm_copy_(ps[k], n);
            fm_tensor_release_n(2, d, n);
            fm_tensor_zero_grad(ps[k]);
        }
    }
    fm_profile_pop();
    fm_set_grad_enabled(prev);
    fm_tensor_release_n(6, h1, a1, h2, a2, lo, loss);
}

int main(int argc, char **argv) {
    const char *trace = argc > 1 ? argv[1] : "/tmp/fathom_overhead_trace.json";
    int64_t dims[4] = {784, 1024, 1024, 10};
    fm_rng r;
    fm_rng_init(&r, 1);
    for (int i = 0; i < 3; i++) {
        int64_t sw[2] = {dims[i + 1], dims[i]}, sb[1] = {dims[i + 1]};
        fm_tensor *t = fm_tensor_randn(2, sw, FM_F32, &r);
        w[i] = fm_mul_scalar(t, 0.03);
        fm_tensor_release(t);
        bias[i] = fm_tensor_zeros(1, sb, FM_F32, FM_CPU);
        fm_tensor_requires_grad_(w[i], true);
        fm_tensor_requires_grad_(bias[i], true);
    }
    int64_t sx[2] = {128, 784}, sy[1] = {128};
    fm_tensor *x = fm_tensor_rand(2, sx, FM_F32, &r), *yf = fm_tensor_rand(1, sy, FM_F32, &r);
    fm_tensor *y10 = fm_mul_scalar(yf, 9.99), *y = fm_to_dtype(y10, FM_I64);
    enum { ROUNDS = 5, STEPS = 10 };
    double off[ROUNDS], on[ROUNDS];
    for (int i = 0; i < 3; i++) step(x, y); /* warm-up */
    for (int rd = 0; rd < ROUNDS; rd++) {
        double t0 = cpu_ms();
        for (int s = 0; s < STEPS; s++) step(x, y);
        off[rd] = (cpu_ms() - t0) / STEPS;
        if (fm_profiler_start(trace) != FM_OK) { fprintf(stderr, "%s\n", fm_last_error()); return 1; }
        t0 = cpu_ms();
        for (int s = 0; s < STEPS; s++) {
            fm_profile_push("step", "step");
            step(x, y);
            fm_profile_pop();
        }
        on[rd] = (cpu_ms() - t0) / STEPS;
        fm_profiler_stop();
    }
    qsort(off, ROUNDS, sizeof(double), cmp_d);
    qsort(on, ROUNDS, sizeof(double), cmp_d);
    printf("{\"bench\":\"profiler_overhead\",\"step_cpu_ms_off\":%.3f,\"step_cpu_ms_on\":%.3f,\"overhead_on_percent\":%.2f,"
           "\"threads\":%d}\n", off[ROUNDS / 2], on[ROUNDS / 2], 100.0 * (on[ROUNDS / 2] / off[ROUNDS / 2] - 1.0),
           fm_num_threads());
    for (int i = 0; i < 3; i++) fm_tensor_release_n(2, w[i], bias[i]);
    fm_tensor_release_n(4, x, yf, y10, y);
    fm_parallel_shutdown();
    return 0;
}
