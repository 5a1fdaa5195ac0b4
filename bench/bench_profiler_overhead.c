/* Profiler overhead, off and on, measured three ways in one process.
 *
 * 1. Paired, interleaved rounds of a training step (an MLP with plain SGD
 *    written here): per repetition one round each of
 *      off-A  profiler never running during the round,
 *      on     profiler running (a "step" span around each step, as fathom train does),
 *      off-B  the same as off-A,
 *    in a rotating order (A-on-B, on-B-A, B-A-on) so no mode always runs first.
 *    Per repetition: on/off - 1 (off = mean of A and B) and B/A - 1. The B/A
 *    spread is the A/A noise floor: the smallest difference this machine can
 *    resolve between two identical configurations, and so the resolution of any
 *    empirical "off vs not compiled in" comparison.
 * 2. What "off" actually costs, measured directly: when not started, each op's
 *    fm_dispatch does one load of a global (its hook pointer, NULL while no
 *    profiler is attached) and a not-taken branch,
 *    and each fm_profile_push/pop (the training loop makes a few per step, the
 *    backward pass one) is a call that does the same. The bench times a loop of
 *    that load + branch against the same loop without it, and a loop of
 *    push/pop pairs, then multiplies by the dispatches and push/pop pairs per
 *    step (counted from a trace of the same step) and divides by the step time.
 * 3. The "on" cost per op: (on - off) step time / ops per step.
 *
 *   bench_profiler_overhead [--reps N] [--steps N] [--trace PATH] [--only tiny|mlp]
 *
 * Two workloads: "mlp" (784-1024-1024-10, batch 128: GEMM-bound) and "tiny"
 * (64-64-64-10, batch 16: dispatch-bound, the worst case for per-op hooks).
 * Process CPU time per step (less sensitive to other load than wall time) and
 * wall time are both recorded; the CPU figures are the ones summarized. Prints
 * a human-readable report and one JSON line per workload. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/parallel.h"
#include "fathom/fathom.h"
#include "fathom/observe.h"
#include "fathom/profile.h"

/* src/profile/profiler.c: the flag fm_profile_push/pop test; loaded here as a
 * stand-in for fm_dispatch's hook pointer (one global load, same branch). */
extern int fm_profiler_on;

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
/* q-quantile of n values (sorts a copy) */
static double quantile(const double *v, int n, double q) {
    double *c = malloc(sizeof(double) * (size_t)n);
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_d);
    double pos = q * (n - 1);
    int i = (int)pos;
    double r = i + 1 < n ? c[i] + (pos - i) * (c[i + 1] - c[i]) : c[i];
    free(c);
    return r;
}

typedef struct mlp {
    fm_tensor *w[3], *b[3], *x, *y;
} mlp;

static void mlp_init(mlp *m, const int64_t dims[4], int64_t batch, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    for (int i = 0; i < 3; i++) {
        int64_t sw[2] = {dims[i + 1], dims[i]}, sb[1] = {dims[i + 1]};
        fm_tensor *t = fm_tensor_randn(2, sw, FM_F32, &r);
        m->w[i] = fm_mul_scalar(t, 0.03);
        fm_tensor_release(t);
        m->b[i] = fm_tensor_zeros(1, sb, FM_F32, FM_CPU);
        fm_tensor_requires_grad_(m->w[i], true);
        fm_tensor_requires_grad_(m->b[i], true);
    }
    int64_t sx[2] = {batch, dims[0]}, sy[1] = {batch};
    m->x = fm_tensor_rand(2, sx, FM_F32, &r);
    fm_tensor *yf = fm_tensor_rand(1, sy, FM_F32, &r), *y10 = fm_mul_scalar(yf, 9.99);
    m->y = fm_to_dtype(y10, FM_I64);
    fm_tensor_release_n(2, yf, y10);
}

static void mlp_free(mlp *m) {
    for (int i = 0; i < 3; i++) fm_tensor_release_n(2, m->w[i], m->b[i]);
    fm_tensor_release_n(2, m->x, m->y);
}

/* One training step as fathom train instruments it: step and optimizer spans. */
static void step(mlp *m) {
    fm_profile_push("step", "step");
    fm_tensor *h1 = fm_linear(m->x, m->w[0], m->b[0]), *a1 = fm_relu(h1);
    fm_tensor *h2 = fm_linear(a1, m->w[1], m->b[1]), *a2 = fm_relu(h2);
    fm_tensor *lo = fm_linear(a2, m->w[2], m->b[2]);
    fm_tensor *loss = fm_cross_entropy(lo, m->y, -100, 0.0, FM_REDUCE_MEAN);
    fm_backward(loss, NULL, false);
    bool prev = fm_set_grad_enabled(false);
    fm_profile_push("optimizer", "optimizer");
    for (int i = 0; i < 3; i++) {
        fm_tensor *ps[2] = {m->w[i], m->b[i]};
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
    fm_profile_pop();
}

/* One round: steps steps, returns CPU ms per step (wall ms in *wall). */
static double round_ms(mlp *m, int steps, bool on, const char *trace, double *wall) {
    if (on && fm_profiler_start(trace) != FM_OK) { fprintf(stderr, "%s\n", fm_last_error()); exit(1); }
    double c0 = cpu_ms(), w0 = wall_ms();
    for (int s = 0; s < steps; s++) step(m);
    double c = (cpu_ms() - c0) / steps;
    *wall = (wall_ms() - w0) / steps;
    if (on) fm_profiler_stop();
    return c;
}

/* ---- the cost of the disabled hooks, directly ---- */

/* ns per iteration of a loop doing `with` (1: a global load and not-taken
 * branch, as the dispatcher's hook check; 0: nothing) around an opaque increment. */
static double __attribute__((noinline)) flag_loop_ns(long iters, int with) {
    volatile long sink = 0;
    double t0 = wall_ms();
    for (long i = 0; i < iters; i++) {
        if (with && __builtin_expect(__atomic_load_n(&fm_profiler_on, __ATOMIC_RELAXED), 0)) sink += 7;
        sink += 1;
        __asm__ volatile("" ::: "memory"); /* keep the load inside the loop, as it is in fm_dispatch */
    }
    return (wall_ms() - t0) * 1e6 / (double)iters;
}

static double push_pop_ns(long iters) {
    double t0 = wall_ms();
    for (long i = 0; i < iters; i++) {
        fm_profile_push("x", "x");
        fm_profile_pop();
    }
    return (wall_ms() - t0) * 1e6 / (double)iters;
}

typedef struct counts {
    double ops_per_step, push_pops_per_step;
} counts;

/* Dispatches per step = op spans in a trace of `n` steps / n; push/pop pairs =
 * the other spans (step, optimizer, the backward pass's "backward"). */
static counts count_per_step(mlp *m, const char *trace) {
    const int n = 4;
    double wall;
    round_ms(m, n, true, trace, &wall);
    fm_trace_summary s;
    counts c = {0, 0};
    if (fm_trace_summarize(trace, 0, &s) != FM_OK) { fprintf(stderr, "%s\n", fm_last_error()); exit(1); }
    double calls = 0;
    for (int i = 0; i < s.n_ops; i++) calls += (double)s.ops[i].calls;
    c.ops_per_step = calls / n;
    fm_trace_summary_free(&s);
    c.push_pops_per_step = 3; /* step, optimizer (here), backward (fm_backward) */
    return c;
}

static void run(const char *name, const int64_t dims[4], int64_t batch, int reps, int steps, const char *trace,
                double flag_ns, double pp_ns) {
    mlp m;
    mlp_init(&m, dims, batch, 1);
    double wall;
    for (int i = 0; i < 3; i++) round_ms(&m, steps, false, trace, &wall); /* warm-up: caches, allocator, BLAS threads */
    round_ms(&m, steps, true, trace, &wall);
    counts cn = count_per_step(&m, trace);
    double *on_rel = calloc((size_t)reps, sizeof(double)), *aa_rel = calloc((size_t)reps, sizeof(double));
    double *off_ms = calloc((size_t)reps, sizeof(double)), *on_ms = calloc((size_t)reps, sizeof(double));
    double *on_us_op = calloc((size_t)reps, sizeof(double)), *wall_on_rel = calloc((size_t)reps, sizeof(double));
    for (int r = 0; r < reps; r++) {
        double a = 0, b = 0, o = 0, wa = 0, wb = 0, wo = 0;
        for (int k = 0; k < 3; k++) {
            int mode = (k + r) % 3; /* 0: off-A, 1: on, 2: off-B */
            double w;
            double c = round_ms(&m, steps, mode == 1, trace, &w);
            if (mode == 0) { a = c; wa = w; }
            else if (mode == 1) { o = c; wo = w; }
            else { b = c; wb = w; }
        }
        double off = (a + b) / 2;
        on_rel[r] = 100.0 * (o / off - 1.0);
        aa_rel[r] = 100.0 * (b / a - 1.0);
        wall_on_rel[r] = 100.0 * (wo / ((wa + wb) / 2) - 1.0);
        off_ms[r] = off;
        on_ms[r] = o;
        on_us_op[r] = (o - off) * 1e3 / cn.ops_per_step;
    }
    double off_med = quantile(off_ms, reps, 0.5);
    double off_cost_ms = (cn.ops_per_step * flag_ns + cn.push_pops_per_step * pp_ns) * 1e-6;
    double off_pct = 100.0 * off_cost_ms / off_med;
    printf("%s (%lld-%lld-%lld-%lld, batch %lld): %d reps x 3 rounds x %d steps, %.0f ops + %.0f push/pop pairs per step\n",
           name, (long long)dims[0], (long long)dims[1], (long long)dims[2], (long long)dims[3], (long long)batch, reps,
           steps, cn.ops_per_step, cn.push_pops_per_step);
    printf("  step CPU time off: median %.3f ms (p25 %.3f, p75 %.3f); on: median %.3f ms\n", off_med,
           quantile(off_ms, reps, 0.25), quantile(off_ms, reps, 0.75), quantile(on_ms, reps, 0.5));
    printf("  on vs off (paired):   median %+.2f%%  (p25 %+.2f%%, p75 %+.2f%%, min %+.2f%%, max %+.2f%%); wall time median %+.2f%%\n",
           quantile(on_rel, reps, 0.5), quantile(on_rel, reps, 0.25), quantile(on_rel, reps, 0.75),
           quantile(on_rel, reps, 0), quantile(on_rel, reps, 1), quantile(wall_on_rel, reps, 0.5));
    printf("  on, per op:           median %.2f us\n", quantile(on_us_op, reps, 0.5));
    printf("  off-B vs off-A (A/A): median %+.2f%%  (p25 %+.2f%%, p75 %+.2f%%): the noise floor of a paired comparison\n",
           quantile(aa_rel, reps, 0.5), quantile(aa_rel, reps, 0.25), quantile(aa_rel, reps, 0.75));
    printf("  off, direct:          %.0f ops x %.3f ns + %.0f push/pop x %.2f ns = %.3f us per step = %.5f%% of the step\n",
           cn.ops_per_step, flag_ns, cn.push_pops_per_step, pp_ns, off_cost_ms * 1e3, off_pct);
    printf("  off, at a conservative 1 ns per op (3 cycles, if the branch were not free): %.5f%%\n",
           100.0 * (cn.ops_per_step * 1.0 + cn.push_pops_per_step * pp_ns) * 1e-6 / off_med);
    printf("{\"bench\":\"profiler_overhead\",\"workload\":\"%s\",\"reps\":%d,\"steps\":%d,\"threads\":%d,\"ops_per_step\":%.0f,"
           "\"step_cpu_ms_off\":%.4f,\"step_cpu_ms_on\":%.4f,\"on_percent_median\":%.3f,\"on_percent_p25\":%.3f,"
           "\"on_percent_p75\":%.3f,\"on_us_per_op\":%.3f,\"aa_percent_median\":%.3f,\"aa_percent_p25\":%.3f,"
           "\"aa_percent_p75\":%.3f,\"off_flag_ns\":%.4f,\"off_push_pop_ns\":%.3f,\"off_percent_direct\":%.6f}\n",
           name, reps, steps, fm_num_threads(), cn.ops_per_step, off_med, quantile(on_ms, reps, 0.5),
           quantile(on_rel, reps, 0.5), quantile(on_rel, reps, 0.25), quantile(on_rel, reps, 0.75),
           quantile(on_us_op, reps, 0.5), quantile(aa_rel, reps, 0.5), quantile(aa_rel, reps, 0.25),
           quantile(aa_rel, reps, 0.75), flag_ns, pp_ns, off_pct);
    fflush(stdout);
    free(on_rel); free(aa_rel); free(off_ms); free(on_ms); free(on_us_op); free(wall_on_rel);
    mlp_free(&m);
}

int main(int argc, char **argv) {
    const char *trace = "/tmp/fathom_overhead_trace.json";
    int reps = 15, steps = 5;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else { fprintf(stderr, "usage: bench_profiler_overhead [--reps N] [--steps N] [--trace PATH] [--only tiny|mlp]\n"); return 2; }
    }
    if (reps < 3 || steps < 1) { fprintf(stderr, "--reps must be >= 3 and --steps >= 1\n"); return 2; }
    /* the disabled hooks on their own: 9 alternating runs of each loop, medians */
    const long iters = 50 * 1000 * 1000;
    double with[9], without[9], pp[9];
    for (int i = 0; i < 9; i++) {
        without[i] = flag_loop_ns(iters, 0);
        with[i] = flag_loop_ns(iters, 1);
        pp[i] = push_pop_ns(iters / 10);
    }
    double flag_ns = quantile(with, 9, 0.5) - quantile(without, 9, 0.5);
    if (flag_ns < 0) flag_ns = 0;
    double pp_ns = quantile(pp, 9, 0.5);
    printf("disabled hooks: flag load + branch %.3f ns (loop %.3f vs %.3f ns/iter), push+pop pair %.2f ns\n", flag_ns,
           quantile(with, 9, 0.5), quantile(without, 9, 0.5), pp_ns);
    if (!only || !strcmp(only, "tiny")) run("tiny", (const int64_t[]){64, 64, 64, 10}, 16, reps * 4, steps * 20, trace, flag_ns, pp_ns);
    if (!only || !strcmp(only, "mlp")) run("mlp", (const int64_t[]){784, 1024, 1024, 10}, 128, reps, steps, trace, flag_ns, pp_ns);
    remove(trace);
    fm_parallel_shutdown();
    return 0;
}
