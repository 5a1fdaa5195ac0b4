/* Benchmark of the softmax / norm / loss kernels, forward and backward.
 *
 * Prints one JSON line per measurement (median of --reps timed runs after
 * warm-up). Forward runs go through the public ops (grad mode off); backward
 * runs dispatch the op's backward kernel directly with freshly allocated
 * outputs, which is what PyTorch's aten backward kernels are timed doing in
 * bench_ops_nn.py, so the two columns compare kernel against kernel.
 * Usage: bench_ops_nn [--reps N] [--threads T] [--rows M] [--cols N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dispatch/dispatch.h"  /* fm_dispatch for the backward kernels */
#include "core/parallel.h" /* fm_set_num_threads */
#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "backend/kernel.h" /* attrs of the backward kernels */

typedef struct bench_env {
    fm_tensor *x, *dy, *w, *b, *y_sm, *y_lsm, *mean, *rstd, *rstd_rms, *target, *g_scalar;
    int64_t M, N;
} bench_env;

static fm_tensor *empty_like(const fm_tensor *t) { return fm_tensor_empty(t->ndim, t->shape, t->dtype, FM_CPU); }

/* One run of the named measurement; returns 0 on success. */
static int run_once(const char *name, bench_env *e) {
    fm_tensor *r = NULL;
    if (!strcmp(name, "softmax_fwd")) r = fm_softmax(e->x, -1);
    else if (!strcmp(name, "log_softmax_fwd")) r = fm_log_softmax(e->x, -1);
    else if (!strcmp(name, "layer_norm_fwd")) r = fm_layer_norm(e->x, 1, e->w, e->b, 1e-5);
    else if (!strcmp(name, "rms_norm_fwd")) r = fm_rms_norm(e->x, e->w, 1e-6);
    else if (!strcmp(name, "cross_entropy_fwd")) r = fm_cross_entropy(e->x, e->target, -100, 0.0, FM_REDUCE_MEAN);
    if (r) { fm_tensor_release(r); return 0; }
    fm_op_call c;
    memset(&c, 0, sizeof c);
    fm_softmax_attrs sa = {1};
    fm_norm_attrs na = {1e-5};
    fm_ce_attrs ca = {-100, 0.0, FM_REDUCE_MEAN};
    if (!strcmp(name, "softmax_bwd") || !strcmp(name, "log_softmax_bwd")) {
        int lg = name[0] == 'l';
        c.op = lg ? FM_OP_LOG_SOFTMAX_BACKWARD : FM_OP_SOFTMAX_BACKWARD;
        c.n_in = 2; c.n_out = 1;
        c.in[0] = e->dy; c.in[1] = lg ? e->y_lsm : e->y_sm;
        c.out[0] = empty_like(e->x);
        c.attrs = &sa;
    } else if (!strcmp(name, "layer_norm_bwd")) {
        c.op = FM_OP_LAYER_NORM_BACKWARD;
        c.n_in = 5; c.n_out = 3;
        c.in[0] = e->dy; c.in[1] = e->x; c.in[2] = e->w; c.in[3] = e->mean; c.in[4] = e->rstd;
        c.out[0] = empty_like(e->x); c.out[1] = empty_like(e->w); c.out[2] = empty_like(e->b);
        c.attrs = &na;
    } else if (!strcmp(name, "rms_norm_bwd")) {
        c.op = FM_OP_RMS_NORM_BACKWARD;
        c.n_in = 4; c.n_out = 2;
        c.in[0] = e->dy; c.in[1] = e->x; c.in[2] = e->w; c.in[3] = e->rstd_rms;
        c.out[0] = empty_like(e->x); c.out[1] = empty_like(e->w);
        c.attrs = &na;
    } else if (!strcmp(name, "cross_entropy_bwd")) {
        c.op = FM_OP_CROSS_ENTROPY_BACKWARD;
        c.n_in = 3; c.n_out = 1;
        c.in[0] = e->g_scalar; c.in[1] = e->x; c.in[2] = e->target;
        c.out[0] = empty_like(e->x);
        c.attrs = &ca;
    } else {
        fprintf(stderr, "bench_ops_nn: unknown measurement %s or forward failed: %s\n", name, fm_last_error());
        return 1;
    }
    fm_status st = fm_dispatch(&c);
    for (int i = 0; i < c.n_out; i++) fm_tensor_release(c.out[i]);
    if (st != FM_OK) { fprintf(stderr, "bench_ops_nn: %s: %s\n", name, fm_last_error()); return 1; }
    return 0;
}

/* Forward statistics the backward kernels read (mean/rstd), computed once. */
static int norm_stats(bench_env *e, int rms) {
    fm_op_call c;
    memset(&c, 0, sizeof c);
    fm_norm_attrs na = {rms ? 1e-6 : 1e-5};
    fm_tensor *y = empty_like(e->x);
    fm_tensor **rs = rms ? &e->rstd_rms : &e->rstd;
    *rs = fm_tensor_empty(1, &e->M, FM_F32, FM_CPU);
    c.op = rms ? FM_OP_RMS_NORM : FM_OP_LAYER_NORM;
    c.in[0] = e->x; c.in[1] = e->w; c.out[0] = y;
    if (rms) { c.n_in = 2; c.n_out = 2; c.out[1] = *rs; }
    else {
        e->mean = fm_tensor_empty(1, &e->M, FM_F32, FM_CPU);
        c.n_in = 3; c.n_out = 3; c.in[2] = e->b; c.out[1] = e->mean; c.out[2] = *rs;
    }
    c.attrs = &na;
    fm_status st = fm_dispatch(&c);
    fm_tensor_release(y);
    return st == FM_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    int reps = 30, threads = 2;
    int64_t M = 4096, N = 1024;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) M = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) N = atoll(argv[i + 1]);
        else { fprintf(stderr, "usage: %s [--reps N] [--threads T] [--rows M] [--cols N]\n", argv[0]); return 2; }
    }
    if (reps < 1 || threads < 1 || M < 1 || N < 1) { fprintf(stderr, "bench_ops_nn: bad arguments\n"); return 2; }
    fm_set_num_threads(threads);
    fm_set_grad_enabled(false);
    bench_env e;
    memset(&e, 0, sizeof e);
    e.M = M; e.N = N;
    fm_rng r;
    fm_rng_init(&r, 1);
    int64_t shape[2] = {M, N};
    e.x = fm_tensor_randn(2, shape, FM_F32, &r);
    e.dy = fm_tensor_randn(2, shape, FM_F32, &r);
    e.w = fm_tensor_randn(1, &N, FM_F32, &r);
    e.b = fm_tensor_randn(1, &N, FM_F32, &r);
    e.g_scalar = fm_tensor_scalar(1.0, FM_F32);
    e.target = fm_tensor_empty(1, &M, FM_I64, FM_CPU);
    for (int64_t i = 0; e.target && i < M; i++) fm_tensor_set(e.target, i, (double)((i * 7919) % N));
    e.y_sm = fm_softmax(e.x, -1);
    e.y_lsm = fm_log_softmax(e.x, -1);
    if (!e.x || !e.dy || !e.w || !e.b || !e.g_scalar || !e.target || !e.y_sm || !e.y_lsm || norm_stats(&e, 0) ||
        norm_stats(&e, 1)) {
        fprintf(stderr, "bench_ops_nn: setup failed: %s\n", fm_last_error());
        return 1;
    }
    const char *names[] = {"softmax_fwd", "softmax_bwd", "log_softmax_fwd", "log_softmax_bwd", "layer_norm_fwd",
                           "layer_norm_bwd", "rms_norm_fwd", "rms_norm_bwd", "cross_entropy_fwd", "cross_entropy_bwd"};
    double *t = malloc(sizeof(double) * (size_t)reps);
    int rc = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0] && !rc; k++) {
        for (int i = 0; i < 3 && !rc; i++) rc = run_once(names[k], &e);
        for (int i = 0; i < reps && !rc; i++) {
            double t0 = bench_now_ms();
            rc = run_once(names[k], &e);
            t[i] = bench_now_ms() - t0;
        }
        if (rc) break;
        qsort(t, (size_t)reps, sizeof(double), bench_cmp_d);
        /* min beside the median: on a shared machine the fastest run is the steadier A/B figure */
        printf("{\"bench\":\"%s\",\"shape\":[%lld,%lld],\"dtype\":\"f32\",\"threads\":%d,\"reps\":%d,\"fathom_ms\":%.4f,"
               "\"fathom_min_ms\":%.4f}\n",
               names[k], (long long)M, (long long)N, threads, reps, t[reps / 2], t[0]);
        fflush(stdout);
    }
    free(t);
    fm_tensor *all[] = {e.x, e.dy, e.w, e.b, e.y_sm, e.y_lsm, e.mean, e.rstd, e.rstd_rms, e.target, e.g_scalar};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fm_tensor_release(all[i]);
    fm_parallel_shutdown();
    return rc;
}
