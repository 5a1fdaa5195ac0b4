/* GPU micro-benchmarks of the CUDA backend, one JSON line each (bench/bench_gpu.py
 * prints PyTorch's figures for the same shapes; tools/gpu-check.sh runs both and
 * prints the ratios). Kernels are called through fm_dispatch on preallocated
 * outputs, so the figures are the kernels', not the allocator's. Without a
 * CUDA device it says why and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_backend.h"
#include "dispatch/dispatch.h"
#include "fathom/fathom.h"
#include "backend/kernel.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const fm_backend *g_b;

/* Seconds per call of `c`, after warm-up. */
static double time_call(fm_op_call *c, int iters) {
    for (int i = 0; i < 3; i++) if (fm_dispatch(c)) return -1;
    g_b->synchronize(0);
    double t0 = now();
    for (int i = 0; i < iters; i++) fm_dispatch(c);
    if (g_b->synchronize(0)) return -1;
    return (now() - t0) / iters;
}

static fm_tensor *dev_rand(int nd, const int64_t *shape, fm_dtype dt) {
    fm_tensor *h = fm_tensor_rand(nd, shape, FM_F32, NULL), *c = fm_to_dtype(h, dt);
    fm_tensor *d = fm_tensor_to(c, (fm_device){FM_DEV_CUDA, 0});
    fm_tensor_release_n(2, h, c);
    return d;
}

int main(void) {
    fm_cuda_info ci;
    fm_cuda_query(&ci);
    if (!ci.n_devices) { printf("{\"bench\":\"gpu\",\"skipped\":\"%s\"}\n", ci.reason); return 0; }
    g_b = fm_backend_get(FM_DEV_CUDA);
    fm_device cu = {FM_DEV_CUDA, 0};
    int64_t sizes[] = {4096, 8192};
    for (int s = 0; s < 2; s++) {
        int64_t n = sizes[s], sh[2] = {n, n};
        fm_tensor *a = dev_rand(2, sh, FM_BF16), *b = dev_rand(2, sh, FM_BF16), *y = fm_tensor_empty(2, sh, FM_BF16, cu);
        fm_op_call c = {.op = FM_OP_MATMUL, .n_in = 2, .n_out = 1, .in = {a, b}, .out = {y}};
        double t = time_call(&c, s ? 10 : 30);
        printf("{\"bench\":\"matmul_bf16_%lld\",\"metric\":\"TFLOP/s\",\"fathom\":%.1f}\n", (long long)n, 2.0 * n * n * n / t / 1e12);
        fm_tensor_release_n(3, a, b, y);
    }
    {
        int64_t B = 8, H = 12, T = 1024, D = 64, sh[4] = {B, H, T, D}, ls[3] = {B, H, T};
        fm_tensor *q = dev_rand(4, sh, FM_BF16), *k = dev_rand(4, sh, FM_BF16), *v = dev_rand(4, sh, FM_BF16);
        fm_tensor *o = fm_tensor_empty(4, sh, FM_BF16, cu), *lse = fm_tensor_empty(3, ls, FM_F32, cu);
        fm_sdpa_attrs at = {1, 0, FM_F32};
        fm_op_call f = {.op = FM_OP_SDPA, .n_in = 3, .n_out = 2, .in = {q, k, v}, .out = {o, lse}, .attrs = &at};
        fm_tensor *dq = fm_tensor_empty(4, sh, FM_BF16, cu), *dk = fm_tensor_empty(4, sh, FM_BF16, cu), *dv = fm_tensor_empty(4, sh, FM_BF16, cu);
        fm_op_call bw = {.op = FM_OP_SDPA_BACKWARD, .n_in = 6, .n_out = 3, .in = {o, q, k, v, o, lse}, .out = {dq, dk, dv}, .attrs = &at};
        double flops = 4.0 * B * H * T * T * D / 2; /* causal: half the matrix */
        /* the default kernels (tiled, CUDA cores), then the tensor-core ones (attention_mma.cu) */
        static const char *const suffix[2] = {"", "_mma"};
        for (int m = 0; m < 2; m++) {
            fm_cuda_attention_set_tiled(m ? 2 : 1);
            double tf = time_call(&f, 5);
            printf("{\"bench\":\"sdpa_fwd_bf16_causal_B8_H12_T1024_D64%s\",\"metric\":\"ms\",\"fathom\":%.3f,\"tflops\":%.1f}\n", suffix[m],
                   tf * 1e3, flops / tf / 1e12);
            double tb = time_call(&bw, 3);
            printf("{\"bench\":\"sdpa_bwd_bf16_causal_B8_H12_T1024_D64%s\",\"metric\":\"ms\",\"fathom\":%.3f,\"tflops\":%.1f}\n", suffix[m],
                   tb * 1e3, 2.5 * flops / tb / 1e12);
        }
        fm_cuda_attention_set_tiled(1);
        fm_tensor_release_n(8, q, k, v, o, lse, dq, dk, dv);
    }
    {
        int64_t n = 1 << 26;
        fm_tensor *a = dev_rand(1, &n, FM_F32), *b = dev_rand(1, &n, FM_F32), *y = fm_tensor_empty(1, &n, FM_F32, cu);
        fm_op_call c = {.op = FM_OP_ADD, .n_in = 2, .n_out = 1, .in = {a, b}, .out = {y}};
        double t = time_call(&c, 50);
        printf("{\"bench\":\"add_f32_64M\",\"metric\":\"GB/s\",\"fathom\":%.0f}\n", 3.0 * 4 * n / t / 1e9);
        fm_tensor *ab = fm_to_dtype(a, FM_BF16), *yb = fm_tensor_empty(1, &n, FM_BF16, cu);
        fm_op_call g = {.op = FM_OP_GELU, .n_in = 1, .n_out = 1, .in = {ab}, .out = {yb}};
        t = time_call(&g, 50);
        printf("{\"bench\":\"gelu_bf16_64M\",\"metric\":\"GB/s\",\"fathom\":%.0f}\n", 2.0 * 2 * n / t / 1e9);
        fm_tensor_release_n(5, a, b, y, ab, yb);
    }
    {
        int64_t N = 8192, C = 50304, sh[2] = {N, C};
        fm_tensor *x = dev_rand(2, sh, FM_BF16);
        fm_tensor *ht = fm_tensor_zeros(1, &N, FM_I64, FM_CPU), *t = fm_tensor_to(ht, cu);
        fm_tensor *loss = fm_tensor_empty(0, NULL, FM_BF16, cu), *dx = fm_tensor_empty(2, sh, FM_BF16, cu);
        fm_tensor *g = fm_tensor_ones(0, NULL, FM_BF16, cu);
        fm_ce_attrs at = {-100, 0, FM_REDUCE_MEAN};
        fm_op_call f = {.op = FM_OP_CROSS_ENTROPY, .n_in = 2, .n_out = 1, .in = {x, t}, .out = {loss}, .attrs = &at};
        fm_op_call b = {.op = FM_OP_CROSS_ENTROPY_BACKWARD, .n_in = 3, .n_out = 1, .in = {g, x, t}, .out = {dx}, .attrs = &at};
        printf("{\"bench\":\"cross_entropy_fwd_bf16_8192x50304\",\"metric\":\"ms\",\"fathom\":%.3f}\n", time_call(&f, 10) * 1e3);
        printf("{\"bench\":\"cross_entropy_bwd_bf16_8192x50304\",\"metric\":\"ms\",\"fathom\":%.3f}\n", time_call(&b, 10) * 1e3);
        fm_tensor_release_n(6, x, ht, t, loss, dx, g);
    }
    {   /* fashion-cnn's middle layer, larger batch: conv 32->64 3x3 pad 1 on 28x28, NCHW (im2col + cuBLASLt) */
        int64_t N = 256, xs[4] = {N, 32, 28, 28}, ws[4] = {64, 32, 3, 3}, ys[4] = {N, 64, 28, 28}, bs = 64;
        fm_dtype dts[2] = {FM_F32, FM_BF16};
        for (int k = 0; k < 2; k++) {
            fm_dtype dt = dts[k];
            fm_tensor *x = dev_rand(4, xs, dt), *w = dev_rand(4, ws, dt), *b = dev_rand(1, &bs, dt);
            fm_tensor *y = fm_tensor_empty(4, ys, dt, cu), *dx = fm_tensor_empty(4, xs, dt, cu);
            fm_tensor *dw = fm_tensor_empty(4, ws, dt, cu), *db = fm_tensor_empty(1, &bs, dt, cu);
            fm_conv2d_attrs ca;
            memset(&ca, 0, sizeof ca);
            ca.p = fm_conv2d_default_params();
            ca.p.padding[0] = ca.p.padding[1] = 1;
            fm_op_call f = {.op = FM_OP_CONV2D, .n_in = 3, .n_out = 1, .in = {x, w, b}, .out = {y}, .attrs = &ca};
            fm_op_call bw = {.op = FM_OP_CONV2D_BACKWARD, .n_in = 3, .n_out = 3, .in = {y, x, w}, .out = {dx, dw, db}, .attrs = &ca};
            double flops = 2.0 * N * 64 * 28 * 28 * 32 * 9;
            double tf = time_call(&f, 10), tb = time_call(&bw, 5);
            printf("{\"bench\":\"conv2d_fwd_%s_N256_32to64_28x28_k3\",\"metric\":\"ms\",\"fathom\":%.3f,\"tflops\":%.1f}\n",
                   fm_dtype_name(dt), tf * 1e3, flops / tf / 1e12);
            printf("{\"bench\":\"conv2d_bwd_%s_N256_32to64_28x28_k3\",\"metric\":\"ms\",\"fathom\":%.3f,\"tflops\":%.1f}\n",
                   fm_dtype_name(dt), tb * 1e3, 2 * flops / tb / 1e12);
            if (dt == FM_F32) {
                int64_t C = 64;
                fm_tensor *rm = fm_tensor_zeros(1, &C, dt, cu), *rv = fm_tensor_ones(1, &C, dt, cu);
                fm_tensor *sm = fm_tensor_empty(1, &C, dt, cu), *sr = fm_tensor_empty(1, &C, dt, cu), *by = fm_tensor_empty(4, ys, dt, cu);
                fm_bn_attrs ba = {1, 0.1, 1e-5, FM_NCHW};
                fm_op_call bn = {.op = FM_OP_BATCH_NORM, .n_in = 5, .n_out = 3, .in = {y, NULL, NULL, rm, rv}, .out = {by, sm, sr}, .attrs = &ba};
                printf("{\"bench\":\"batch_norm_train_f32_N256_C64_28x28\",\"metric\":\"ms\",\"fathom\":%.3f}\n", time_call(&bn, 10) * 1e3);
                int64_t ps[4] = {N, 64, 14, 14};
                fm_tensor *py = fm_tensor_empty(4, ps, dt, cu), *pi = fm_tensor_empty(4, ps, FM_I64, cu);
                fm_pool2d_attrs pa;
                memset(&pa, 0, sizeof pa);
                pa.p.kernel[0] = pa.p.kernel[1] = 2;
                pa.p.stride[0] = pa.p.stride[1] = 2;
                fm_op_call mp = {.op = FM_OP_MAX_POOL2D, .n_in = 1, .n_out = 2, .in = {y}, .out = {py, pi}, .attrs = &pa};
                printf("{\"bench\":\"max_pool2d_f32_N256_C64_28x28_k2\",\"metric\":\"ms\",\"fathom\":%.3f}\n", time_call(&mp, 10) * 1e3);
                fm_tensor_release_n(7, rm, rv, sm, sr, by, py, pi);
            }
            fm_tensor_release_n(7, x, w, b, y, dx, dw, db);
        }
    }
    {   /* batch upload: 64 MiB from pinned memory (copy stream) against pageable memory */
        int64_t n = 1 << 24;
        fm_tensor *pin = fm_cuda_pinned_empty(1, &n, FM_F32), *pag = fm_tensor_zeros(1, &n, FM_F32, FM_CPU);
        if (pin) memset(fm_tensor_data(pin), 0, (size_t)n * 4);
        fm_tensor *srcs[2] = {pin, pag};
        const char *names[2] = {"h2d_pinned_64MiB", "h2d_pageable_64MiB"};
        for (int k = 0; k < 2; k++) {
            if (!srcs[k]) continue;
            fm_tensor *warm = fm_tensor_to(srcs[k], cu);
            fm_tensor_release(warm);
            g_b->synchronize(0);
            double t0 = now();
            for (int i = 0; i < 10; i++) { fm_tensor *d = fm_tensor_to(srcs[k], cu); fm_tensor_release(d); }
            g_b->synchronize(0);
            double t = (now() - t0) / 10;
            printf("{\"bench\":\"%s\",\"metric\":\"GB/s\",\"fathom\":%.1f}\n", names[k], 4.0 * n / t / 1e9);
        }
        fm_tensor_release_n(2, pin, pag);
    }
    fm_memory_stats st;
    fm_allocator *al = g_b->allocator(0);
    al->get_stats(al, &st);
    printf("{\"bench\":\"allocator\",\"reserved_peak_MiB\":%.0f,\"allocated_peak_MiB\":%.0f,\"system_allocs\":%llu,\"cache_hits\":%llu}\n",
           st.reserved_peak / 1048576.0, st.allocated_peak / 1048576.0, (unsigned long long)st.n_system_allocs,
           (unsigned long long)st.n_cache_hits);
    return 0;
}
