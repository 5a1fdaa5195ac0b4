/* The AVX-512 kernels of the non-GEMM families against their AVX2 twins, called
 * directly and alternated round by round (A B A B ...) in one process, so that
 * load from other processes falls on both alike. One thread; run it with
 * FATHOM_BENCH_CLOCK=cpu on a shared machine (CPU time, bench_util.h).
 *
 *   FATHOM_BENCH_CLOCK=cpu build/bench_isa_kernels [--rounds N] [--only gemv|linear|conv|wino|mobile]
 *
 * gemv: y = W x for a linear's [N, K] weight (the decode step), "hot" on one
 * weight (in L2 when it fits) and "cold" cycling over enough copies of it to
 * pass 64 MiB (from L3 / memory, as a model's layers one after the other).
 * linear: the packed linear of linear_fused (linear_packed.h) with bias and ReLU
 * on the compiled graphs' shapes.
 * conv: conv2d_fused's direct kernels (bias, ReLU, 2x2 pool in the epilogue) on
 * fashion-cnn's layers: the lanes kernel (conv_lanes.h) at AVX2 and AVX-512, and
 * the AVX-512 pixel tile (conv_direct.h), all tasks on one thread, on inputs
 * padded and weights packed beforehand. Each line prints the median time per call of
 * both, the ratio avx2/avx512 and whether the outputs are bitwise equal.
 * wino (runs on an AVX2-only CPU too): for 3x3 stride-1 convs, the lanes kernel against
 * the Winograd F(2x2, 3x3) kernel (conv_wino.h) at the AVX2 level, and at AVX-512 where
 * the CPU has it, on fashion-cnn's conv2 and the 3x3 layers of ResNet-18 and
 * SqueezeNet 1.0 at batch 1 and 8: which kernel conv2d_fused should pick.
 * mobile (AVX2 level): MobileNetV2's layers at batch 8 (224x224 input) on one pool
 * thread: each 1x1 conv through conv_pw.h's kernel (bias and ReLU6 in it) against the
 * route it replaced at the AVX2 level (fm_cpu_gemm per sample, then a bias and clamp
 * pass), with the largest difference between the two; then each depthwise 3x3 conv
 * (conv_dw.h) at the level in use, in GFLOP/s. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_direct.h"
#include "backend/cpu/conv_dw.h"
#include "backend/cpu/conv_lanes.h"
#include "backend/cpu/conv_pw.h"
#include "backend/cpu/conv_wino.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemv_avx2.h"
#include "backend/cpu/linear_packed.h"
#include "bench_util.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

static void fill(float *p, size_t n, unsigned s) {
    for (size_t i = 0; i < n; i++) { s = s * 1103515245u + 12345u; p[i] = (float)((s >> 9) & 0xFFFF) / 65536.0f - 0.5f; }
}

static void *xalloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) { fprintf(stderr, "bench_isa_kernels: out of memory\n"); exit(1); }
    return p;
}

typedef void (*gemv_fn)(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, float beta, float *y);

static void bench_gemv(int rounds) {
    typedef struct { const char *what; int N, K; } shp;
    const shp shapes[] = {{"kjv qkv", 384, 128},     {"kjv proj", 128, 128},    {"kjv fc", 512, 128},
                          {"kjv fc2", 128, 512},     {"gpt-6x384 qkv", 1152, 384}, {"gpt-6x384 fc2", 384, 1536},
                          {"gpt2 qkv", 2304, 768},   {"gpt2 fc", 3072, 768},    {"gpt2 fc2", 768, 3072},
                          {"tail 131x67", 131, 67}};
    printf("%-14s %5s %5s %4s %7s %10s %10s %7s %8s %8s\n", "gemv", "N", "K", "mode", "copies", "avx2 us", "avx512 us",
           "ratio", "GB/s 512", "bitwise");
    double *ta = malloc(sizeof(double) * (size_t)rounds), *tb = malloc(sizeof(double) * (size_t)rounds);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, K = shapes[s].K;
        const size_t wn = (size_t)N * (size_t)K;
        for (int cold = 0; cold < 2; cold++) {
            const int copies = cold ? (int)((64u << 20) / (wn * 4) + 1) : 1;
            float *W = xalloc(sizeof(float) * wn * (size_t)copies), *x = xalloc(sizeof(float) * (size_t)K);
            float *y2 = xalloc(sizeof(float) * (size_t)N), *y5 = xalloc(sizeof(float) * (size_t)N);
            fill(W, wn * (size_t)copies, 1);
            fill(x, (size_t)K, 2);
            /* calls per timing: about 1 ms of work at 20 GB/s */
            const int inner = cold ? copies : (int)(20e6 / (double)(wn * 4) * 1.0) + 1;
            int c2 = 0, c5 = 0;
            for (int r = 0; r < rounds; r++) {
                for (int side = 0; side < 2; side++) {
                    const gemv_fn f = side ? fm_gemv_rows_f32_avx512 : fm_gemv_rows_f32_avx2;
                    float *y = side ? y5 : y2;
                    int *c = side ? &c5 : &c2;
                    double t0 = bench_now_s();
                    for (int i = 0; i < inner; i++, *c = (*c + 1) % copies) f(N, K, W + wn * (size_t)*c, K, x, 0.0f, y);
                    (side ? tb : ta)[r] = (bench_now_s() - t0) / inner;
                }
            }
            fm_gemv_rows_f32_avx2(N, K, W, K, x, 0.0f, y2);
            fm_gemv_rows_f32_avx512(N, K, W, K, x, 0.0f, y5);
            const int same = !memcmp(y2, y5, sizeof(float) * (size_t)N);
            const double a = bench_median(ta, rounds), b = bench_median(tb, rounds);
            printf("%-14s %5d %5d %4s %7d %10.2f %10.2f %7.2f %8.1f %8s\n", shapes[s].what, N, K, cold ? "cold" : "hot",
                   copies, a * 1e6, b * 1e6, a / b, (double)wn * 4 / b * 1e-9, same ? "yes" : "NO");
            fflush(stdout);
            free(W), free(x), free(y2), free(y5);
        }
    }
    free(ta), free(tb);
}

static void bench_linear(int rounds) {
    typedef struct { const char *what; int64_t M, N, K; } shp;
    const shp shapes[] = {
        {"cnn fc1", 1, 128, 3136},       {"cnn fc1", 32, 128, 3136},    {"cnn fc2", 32, 10, 128},
        {"mlp fc1", 1, 1024, 784},       {"mlp fc1", 32, 1024, 784},    {"mlp fc2", 32, 1024, 1024},
        {"mlp fc2", 128, 1024, 1024},    {"kjv qkv", 2048, 384, 128},   {"kjv fc", 2048, 512, 128},
        {"kjv fc2", 2048, 128, 512},     {"kjv qkv", 64, 384, 128},     {"kjv qkv decode", 1, 384, 128},
        {"kjv fc2 decode", 1, 128, 512}, {"kjv qkv 2 rows", 2, 384, 128}, {"tail", 7, 37, 300},
    };
    printf("\n%-15s %5s %5s %5s %10s %10s %7s %9s %8s\n", "linear packed", "M", "N", "K", "avx2 us", "avx512 us", "ratio",
           "GF/s 512", "bitwise");
    double *ta = malloc(sizeof(double) * (size_t)rounds), *tb = malloc(sizeof(double) * (size_t)rounds);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
        float *x = xalloc(sizeof(float) * (size_t)(M * K)), *w = xalloc(sizeof(float) * (size_t)(N * K));
        float *wp = xalloc(sizeof(float) * (size_t)fm_linear_packed_numel(N, K)), *b = xalloc(sizeof(float) * (size_t)N);
        float *y2 = xalloc(sizeof(float) * (size_t)(M * N)), *y5 = xalloc(sizeof(float) * (size_t)(M * N));
        fill(x, (size_t)(M * K), 3), fill(w, (size_t)(N * K), 4), fill(b, (size_t)N, 5);
        fm_linear_pack_f32(w, wp, N, K);
        fm_linear_packed d2 = {x, wp, b, y2, M, N, K, K, N, 1}, d5 = d2;
        d5.y = y5;
        const double flop = 2.0 * (double)(M * N * K);
        const int inner = (int)(2e7 / flop) + 1; /* about 1 ms at 20 GFLOP/s */
        for (int r = 0; r < rounds; r++) {
            double t0 = bench_now_s();
            for (int i = 0; i < inner; i++) fm_linear_packed_f32_avx2(&d2, 0, M, 0, fm_linear_panels(N));
            double t1 = bench_now_s();
            for (int i = 0; i < inner; i++) fm_linear_packed_f32_avx512(&d5, 0, M, 0, fm_linear_panels(N));
            double t2 = bench_now_s();
            ta[r] = (t1 - t0) / inner, tb[r] = (t2 - t1) / inner;
        }
        const int same = !memcmp(y2, y5, sizeof(float) * (size_t)(M * N));
        const double a = bench_median(ta, rounds), bb = bench_median(tb, rounds);
        printf("%-15s %5lld %5lld %5lld %10.2f %10.2f %7.2f %9.1f %8s\n", shapes[s].what, (long long)M, (long long)N,
               (long long)K, a * 1e6, bb * 1e6, a / bb, flop / bb * 1e-9, same ? "yes" : "NO");
        fflush(stdout);
        free(x), free(w), free(wp), free(b), free(y2), free(y5);
    }
    free(ta), free(tb);
}

/* plane [H][W] -> [Hp][WS] with the input at (ph, pw), zeros elsewhere */
static void pad_plane(const float *x, float *xp, int64_t H, int64_t W, int64_t Hp, int64_t WS, int64_t ph, int64_t pw) {
    memset(xp, 0, sizeof(float) * (size_t)(Hp * WS));
    for (int64_t h = 0; h < H; h++) memcpy(xp + (h + ph) * WS + pw, x + h * W, sizeof(float) * (size_t)W);
}

static void bench_conv(int rounds) {
    typedef struct { const char *what; int64_t N, C, O, H, W, k, pad; int pool; } shp;
    const shp shapes[] = {
        {"cnn conv1", 1, 1, 32, 28, 28, 3, 1, 2},  {"cnn conv2", 1, 32, 64, 14, 14, 3, 1, 2},
        {"cnn conv1", 32, 1, 32, 28, 28, 3, 1, 2}, {"cnn conv2", 32, 32, 64, 14, 14, 3, 1, 2},
        {"3x3 64->64", 8, 64, 64, 28, 28, 3, 1, 0}, {"tail 5x5", 3, 5, 24, 11, 13, 5, 2, 0},
        {"3x3 16->16", 8, 16, 16, 28, 28, 3, 1, 2}, {"3x3 32->48", 8, 32, 48, 14, 14, 3, 1, 0},
        {"3x3 64->96", 8, 64, 96, 7, 7, 3, 1, 0},   {"3x3 3->10", 8, 3, 10, 30, 30, 3, 0, 2},
    };
    printf("\n%-11s %3s %3s %3s %5s %2s %4s %10s %10s %10s %7s %7s %8s\n", "conv fused", "N", "C", "O", "HxW", "k", "pool",
           "lanes2 us", "lanes5 us", "direct5 us", "l2/l5", "d5/l5", "bitwise");
    double *t2 = malloc(sizeof(double) * (size_t)rounds), *t5 = malloc(sizeof(double) * (size_t)rounds),
           *td = malloc(sizeof(double) * (size_t)rounds);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shp *h = &shapes[s];
        const int64_t per = h->C * h->k * h->k, Ho = h->H + 2 * h->pad - h->k + 1, Wo = h->W + 2 * h->pad - h->k + 1;
        const int64_t Hy = h->pool ? Ho / 2 : Ho, Wy = h->pool ? Wo / 2 : Wo;
        float *x = xalloc(sizeof(float) * (size_t)(h->N * h->C * h->H * h->W)), *w = xalloc(sizeof(float) * (size_t)(h->O * per));
        float *b = xalloc(sizeof(float) * (size_t)h->O);
        fill(x, (size_t)(h->N * h->C * h->H * h->W), 6), fill(w, (size_t)(h->O * per), 7), fill(b, (size_t)h->O, 8);
        const size_t ny = (size_t)(h->N * h->O * Hy * Wy);
        float *y2 = xalloc(sizeof(float) * ny), *y5 = xalloc(sizeof(float) * ny), *yd = xalloc(sizeof(float) * ny);
        /* the lanes kernels: as run_lanes in conv_fused_cpu.c */
        fm_conv_lanes d;
        memset(&d, 0, sizeof d);
        d.N = h->N, d.C = h->C, d.O = h->O, d.KH = d.KW = h->k, d.Ho = Ho, d.Wo = Wo, d.Hy = Hy, d.Wy = Wy, d.relu = 1,
        d.pool = h->pool ? 2 : 0, d.Hp = h->H + 2 * h->pad, d.WS = h->W + 2 * h->pad;
        const int64_t fit = 4096 / (d.KH * d.KW * 8 * FM_CONV_LANES_NV), passes = fit < 1 ? d.C : (d.C + fit - 1) / fit;
        d.cc = (d.C + passes - 1) / passes;
        float *xl = xalloc(sizeof(float) * (size_t)(h->N * h->C * d.Hp * d.WS)), *wl = xalloc(sizeof(float) * (size_t)fm_conv_lanes_packed_numel(h->O, per));
        for (int64_t p = 0; p < h->N * h->C; p++) pad_plane(x + p * h->H * h->W, xl + p * d.Hp * d.WS, h->H, h->W, d.Hp, d.WS, h->pad, h->pad);
        fm_conv_lanes_pack(w, wl, h->O, per);
        d.xp = xl, d.wp = wl, d.bias = b, d.y = y2;
        fm_conv_lanes_plan(&d);
        fm_conv_lanes d5 = d;
        d5.y = y5;
        const int64_t tasks = fm_conv_lanes_tasks(&d);
        /* the pixel tile: as run_direct, when O is a multiple of its block */
        const bool direct = h->O % FM_CONV_DIRECT_OBS_AVX512 == 0;
        fm_conv_direct dd;
        memset(&dd, 0, sizeof dd);
        float *xd = NULL, *wd = NULL;
        int64_t dtasks = 0;
        if (direct) {
            const int64_t VL = FM_CONV_DIRECT_VL_AVX512, cols = h->pool ? 2 * Wy : Wo, blocks = (cols + VL - 1) / VL;
            dd.N = h->N, dd.C = h->C, dd.O = h->O, dd.KH = dd.KW = h->k, dd.Ho = Ho, dd.Wo = Wo, dd.Hy = Hy, dd.Wy = Wy, dd.relu = 1,
            dd.pool = h->pool ? 2 : 0;
            dd.WS = (blocks * VL + dd.KW - 1 + 15) / 16 * 16, dd.Hp = h->H + 2 * h->pad + 1;
            xd = xalloc(sizeof(float) * (size_t)(h->N * h->C * dd.Hp * dd.WS)), wd = xalloc(sizeof(float) * (size_t)(h->O * per));
            for (int64_t p = 0; p < h->N * h->C; p++) pad_plane(x + p * h->H * h->W, xd + p * dd.Hp * dd.WS, h->H, h->W, dd.Hp, dd.WS, h->pad, h->pad);
            fm_conv_direct_pack(w, wd, h->O, per, FM_CONV_DIRECT_OB_AVX512, FM_CONV_DIRECT_OBS_AVX512);
            int64_t nblocks;
            dd.n_big = fm_conv_direct_split(h->O, FM_CONV_DIRECT_OB_AVX512, FM_CONV_DIRECT_OBS_AVX512, &nblocks);
            dd.xp = xd, dd.wp = wd, dd.bias = b, dd.y = yd;
            dtasks = h->N * nblocks * (dd.pool ? Hy : (Ho + 1) / 2);
        }
        const double flop = 2.0 * (double)(h->N * h->O * Ho * Wo * per);
        const int inner = (int)(2e7 / flop) + 1;
        for (int r = 0; r < rounds; r++) {
            double t0 = bench_now_s();
            for (int i = 0; i < inner; i++) fm_conv_lanes_rows_avx2(&d, 0, tasks);
            double t1 = bench_now_s();
            for (int i = 0; i < inner; i++) fm_conv_lanes_rows_avx512(&d5, 0, tasks);
            double t3 = bench_now_s();
            for (int i = 0; direct && i < inner; i++) fm_conv_direct_rows_avx512(&dd, 0, dtasks);
            double t4 = bench_now_s();
            t2[r] = (t1 - t0) / inner, t5[r] = (t3 - t1) / inner, td[r] = (t4 - t3) / inner;
        }
        const int same = !memcmp(y2, y5, sizeof(float) * ny);
        const double a = bench_median(t2, rounds), c5 = bench_median(t5, rounds), dm = bench_median(td, rounds);
        char hw[16];
        snprintf(hw, sizeof hw, "%lldx%lld", (long long)h->H, (long long)h->W);
        printf("%-11s %3lld %3lld %3lld %5s %2lld %4s %10.1f %10.1f %10.1f %7.2f %7.2f %8s   (%.1f GFLOP/s lanes5)\n", h->what,
               (long long)h->N, (long long)h->C, (long long)h->O, hw, (long long)h->k, h->pool ? "2x2" : "-", a * 1e6, c5 * 1e6,
               direct ? dm * 1e6 : 0.0, a / c5, direct ? dm / c5 : 0.0, same ? "yes" : "NO", flop / c5 * 1e-9);
        fflush(stdout);
        free(x), free(w), free(b), free(y2), free(y5), free(yd), free(xl), free(wl), free(xd), free(wd);
    }
    free(t2), free(t5), free(td);
}

/* the lanes kernel against Winograd, per level (see the top) */
static void bench_wino(int rounds) {
    typedef struct { const char *what; int64_t N, C, O, H, W; int pool; } shp;
    const shp shapes[] = {
        {"cnn conv2", 1, 32, 64, 14, 14, 2},    {"cnn conv2", 32, 32, 64, 14, 14, 2},  {"r18 64@56", 1, 64, 64, 56, 56, 0},
        {"r18 64@56", 8, 64, 64, 56, 56, 0},    {"r18 128@28", 1, 128, 128, 28, 28, 0}, {"r18 128@28", 8, 128, 128, 28, 28, 0},
        {"r18 256@14", 1, 256, 256, 14, 14, 0}, {"r18 256@14", 8, 256, 256, 14, 14, 0}, {"r18 512@7", 1, 512, 512, 7, 7, 0},
        {"r18 512@7", 8, 512, 512, 7, 7, 0},    {"sq 16->64@55", 8, 16, 64, 55, 55, 0}, {"sq 48->192@13", 8, 48, 192, 13, 13, 0},
    };
    const bool w512 = fm_cpu_use_avx512();
    printf("\n%-13s %3s %3s %3s %5s %4s %10s %10s %10s %8s %8s %8s\n", "3x3 conv", "N", "C", "O", "HxW", "pool", "lanes us",
           "wino2 us", "wino5 us", "lanes/w2", "GFLOP/s", "bitwise");
    double *tl = malloc(sizeof(double) * (size_t)rounds), *t2 = malloc(sizeof(double) * (size_t)rounds), *t5 = malloc(sizeof(double) * (size_t)rounds);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shp *h = &shapes[s];
        const int64_t per = h->C * 9, Ho = h->H, Wo = h->W; /* pad 1 */
        const int64_t Hy = h->pool ? Ho / 2 : Ho, Wy = h->pool ? Wo / 2 : Wo, nx = h->N * h->C * h->H * h->W;
        float *x = xalloc(sizeof(float) * (size_t)nx), *w = xalloc(sizeof(float) * (size_t)(h->O * per)), *b = xalloc(sizeof(float) * (size_t)h->O);
        fill(x, (size_t)nx, 6), fill(w, (size_t)(h->O * per), 7), fill(b, (size_t)h->O, 8);
        const size_t ny = (size_t)(h->N * h->O * Hy * Wy);
        float *yl = xalloc(sizeof(float) * ny), *y2 = xalloc(sizeof(float) * ny), *y5 = xalloc(sizeof(float) * ny);
        fm_conv_lanes d;
        memset(&d, 0, sizeof d);
        d.N = h->N, d.C = h->C, d.O = h->O, d.KH = d.KW = 3, d.Ho = Ho, d.Wo = Wo, d.Hy = Hy, d.Wy = Wy, d.relu = 1, d.pool = h->pool,
        d.Hp = h->H + 2, d.WS = h->W + 2;
        const int64_t fit = 4096 / (9 * 8 * FM_CONV_LANES_NV), passes = fit < 1 ? d.C : (d.C + fit - 1) / fit;
        d.cc = (d.C + passes - 1) / passes;
        float *xl = xalloc(sizeof(float) * (size_t)(h->N * h->C * d.Hp * d.WS)), *wl = xalloc(sizeof(float) * (size_t)fm_conv_lanes_packed_numel(h->O, per));
        for (int64_t p = 0; p < h->N * h->C; p++) pad_plane(x + p * h->H * h->W, xl + p * d.Hp * d.WS, h->H, h->W, d.Hp, d.WS, 1, 1);
        fm_conv_lanes_pack(w, wl, h->O, per);
        d.xp = xl, d.wp = wl, d.bias = b, d.y = yl;
        fm_conv_lanes_plan(&d);
        const int64_t tasks = fm_conv_lanes_tasks(&d);
        /* Winograd: as run_wino in conv_fused_cpu.c (tiles: the pooled outputs, or the output halved) */
        fm_conv_wino g;
        memset(&g, 0, sizeof g);
        g.N = h->N, g.C = h->C, g.O = h->O, g.pool = h->pool, g.relu = 1, g.bias = b, g.H = h->H, g.W = h->W, g.ph = g.pw = 1;
        g.Hy = h->pool ? Hy : (Ho + 1) / 2, g.Wy = h->pool ? Wy : (Wo + 1) / 2, g.Ho = Ho, g.Wo = Wo;
        fm_conv_wino_avx2_geometry(h->H, h->W, 1, 1, g.Hy, g.Wy, &g.Hp, &g.WS);
        fm_conv_wino_plan(&g);
        float *xg = xalloc(sizeof(float) * (size_t)(h->N * h->C * g.Hp * g.WS)), *u = xalloc(sizeof(float) * (size_t)fm_conv_wino_u_floats(h->C, h->O));
        float *ws = xalloc(sizeof(float) * (size_t)fm_conv_wino_ws_floats(&g));
        for (int64_t p = 0; p < h->N * h->C; p++) pad_plane(x + p * h->H * h->W, xg + p * g.Hp * g.WS, h->H, h->W, g.Hp, g.WS, 1, 1);
        fm_conv_wino_weights_avx2(wl, u, h->O, h->C);
        g.xp = xg, g.u = u;
        fm_conv_wino g5 = g;
        g.y = y2, g5.y = y5, g5.x = x; /* AVX-512 reads the input unpadded, as conv2d_fused runs it */
        const int64_t wt = fm_conv_wino_tasks(&g);
        const double flop = 2.0 * (double)(h->N * h->O * Ho * Wo * per);
        const int inner = (int)(2e7 / flop) + 1;
        for (int r = 0; r < rounds; r++) {
            double t0 = bench_now_s();
            for (int i = 0; i < inner; i++) {
                if (w512) fm_conv_lanes_rows_avx512(&d, 0, tasks);
                else fm_conv_lanes_rows_avx2(&d, 0, tasks);
            }
            double t1 = bench_now_s();
            for (int i = 0; i < inner; i++) fm_conv_wino_rows_avx2(&g, 0, wt, ws);
            double t3 = bench_now_s();
            for (int i = 0; w512 && i < inner; i++) fm_conv_wino_rows_avx512(&g5, 0, wt, ws);
            double t4 = bench_now_s();
            tl[r] = (t1 - t0) / inner, t2[r] = (t3 - t1) / inner, t5[r] = (t4 - t3) / inner;
        }
        const double a = bench_median(tl, rounds), c2 = bench_median(t2, rounds), c5 = bench_median(t5, rounds);
        char hw[16];
        snprintf(hw, sizeof hw, "%lldx%lld", (long long)h->H, (long long)h->W);
        printf("%-13s %3lld %3lld %3lld %5s %4s %10.1f %10.1f %10.1f %8.2f %8.1f %8s\n", h->what, (long long)h->N, (long long)h->C,
               (long long)h->O, hw, h->pool ? "2x2" : "-", a * 1e6, c2 * 1e6, w512 ? c5 * 1e6 : 0.0, a / c2, flop / c2 * 1e-9,
               !w512 ? "-" : !memcmp(y2, y5, sizeof(float) * ny) ? "yes" : "NO");
        fflush(stdout);
        free(x), free(w), free(b), free(yl), free(y2), free(y5), free(xl), free(wl), free(xg), free(u), free(ws);
    }
    free(tl), free(t2), free(t5);
}

/* conv2d's 1x1 route before conv_pw.h, as conv2d_cpu.c ran it: per sample one GEMM
 * (beta 0), then the bias and the clamp over the output */
static void pw_by_gemm(const fm_conv_pw *d) {
    for (int64_t n = 0; n < d->N; n++) {
        float *y = d->y + n * d->y_stride;
        fm_cpu_gemm(&(fm_cpu_gemm_args){FM_F32, false, false, d->O, d->P, d->C, d->w, d->C, d->x + n * d->x_stride, d->P, 0.0, y,
                                        d->P});
        for (int64_t o = 0; o < d->O; o++)
            for (int64_t p = 0; p < d->P; p++) {
                const float v = y[o * d->P + p] + d->bias[o];
                y[o * d->P + p] = v < d->lo ? d->lo : v > d->hi ? d->hi : v;
            }
    }
}

/* MobileNetV2's 1x1 and depthwise layers (see the top) */
static void bench_mobile(int rounds) {
    typedef struct { int64_t C, O, HW; int relu6; } pws;
    const pws pw[] = {{32, 16, 112, 0},  {16, 96, 112, 1},  {96, 24, 56, 0},   {24, 144, 56, 1},  {144, 24, 56, 0},
                      {144, 32, 28, 0},  {32, 192, 28, 1},  {192, 32, 28, 0},  {192, 64, 14, 0},  {64, 384, 14, 1},
                      {384, 64, 14, 0},  {384, 96, 14, 0},  {96, 576, 14, 1},  {576, 96, 14, 0},  {576, 160, 7, 0},
                      {160, 960, 7, 1},  {960, 160, 7, 0},  {960, 320, 7, 0},  {320, 1280, 7, 1}};
    const int64_t N = 8;
    printf("\n%-9s %4s %5s %7s %10s %10s %7s %9s %9s\n", "1x1 conv", "C", "O", "HxW", "pw us", "gemm us", "gemm/pw",
           "GFLOP/s", "max diff");
    double *ta = malloc(sizeof(double) * (size_t)rounds), *tb = malloc(sizeof(double) * (size_t)rounds);
    for (size_t s = 0; s < sizeof pw / sizeof pw[0]; s++) {
        const pws *h = &pw[s];
        const int64_t P = h->HW * h->HW;
        float *x = xalloc(sizeof(float) * (size_t)(N * h->C * P)), *w = xalloc(sizeof(float) * (size_t)(h->O * h->C));
        float *b = xalloc(sizeof(float) * (size_t)h->O), *y1 = xalloc(sizeof(float) * (size_t)(N * h->O * P)),
              *y2 = xalloc(sizeof(float) * (size_t)(N * h->O * P));
        fill(x, (size_t)(N * h->C * P), 11), fill(w, (size_t)(h->O * h->C), 12), fill(b, (size_t)h->O, 13);
        fm_conv_pw d = {x, w, b, y1, N, h->C, h->O, P, h->C * P, h->O * P, P, h->relu6 ? 0.0f : -INFINITY, h->relu6 ? 6.0f : INFINITY, NULL},
                   d2 = d;
        d2.y = y2;
        const double flop = 2.0 * (double)(N * h->O * h->C * P);
        const int inner = (int)(2e8 / flop) + 1;
        for (int r = 0; r < rounds; r++) {
            double t0 = bench_now_s();
            for (int i = 0; i < inner; i++) fm_conv_pw_run_avx2(&d);
            double t1 = bench_now_s();
            for (int i = 0; i < inner; i++) pw_by_gemm(&d2);
            double t2 = bench_now_s();
            ta[r] = (t1 - t0) / inner, tb[r] = (t2 - t1) / inner;
        }
        double diff = 0;
        for (int64_t i = 0; i < N * h->O * P; i++) diff = fabs(y1[i] - y2[i]) > diff ? fabs(y1[i] - y2[i]) : diff;
        const double a = bench_median(ta, rounds), c = bench_median(tb, rounds);
        char hw[16];
        snprintf(hw, sizeof hw, "%lldx%lld", (long long)h->HW, (long long)h->HW);
        printf("%-9s %4lld %5lld %7s %10.1f %10.1f %7.2f %9.1f %9.2g\n", h->relu6 ? "relu6" : "-", (long long)h->C,
               (long long)h->O, hw, a * 1e6, c * 1e6, c / a, flop / a * 1e-9, diff);
        fflush(stdout);
        free(x), free(w), free(b), free(y1), free(y2);
    }
    typedef struct { int64_t C, HW, s; } dws;
    const dws dw[] = {{32, 112, 1}, {96, 112, 2}, {144, 56, 1}, {144, 56, 2}, {192, 28, 1},
                      {192, 28, 2}, {384, 14, 1}, {576, 14, 1}, {576, 14, 2}, {960, 7, 1}};
    printf("\n%-9s %4s %7s %2s %10s %9s\n", "3x3 dw", "C", "HxW", "s", "us", "GFLOP/s");
    for (size_t s = 0; s < sizeof dw / sizeof dw[0]; s++) {
        const dws *h = &dw[s];
        const int64_t Ho = (h->HW + 2 - 3) / h->s + 1;
        float *x = xalloc(sizeof(float) * (size_t)(N * h->C * h->HW * h->HW)), *w = xalloc(sizeof(float) * (size_t)(h->C * 9));
        float *b = xalloc(sizeof(float) * (size_t)h->C), *y = xalloc(sizeof(float) * (size_t)(N * h->C * Ho * Ho));
        fill(x, (size_t)(N * h->C * h->HW * h->HW), 14), fill(w, (size_t)(h->C * 9), 15), fill(b, (size_t)h->C, 16);
        const fm_conv_dw d = {x, w, b, y, N, h->C, h->HW, h->HW, h->C, Ho, Ho, 3, 3, h->s, h->s, 1, 1, 0.0f, 6.0f};
        const double flop = 2.0 * (double)(N * h->C * Ho * Ho * 9);
        const int inner = (int)(5e7 / flop) + 1;
        for (int r = 0; r < rounds; r++) {
            double t0 = bench_now_s();
            for (int i = 0; i < inner; i++)
                if (fm_conv_dw_run(&d) != FM_OK) { fprintf(stderr, "bench_isa_kernels: %s\n", fm_last_error()); exit(1); }
            ta[r] = (bench_now_s() - t0) / inner;
        }
        const double a = bench_median(ta, rounds);
        char hw[16];
        snprintf(hw, sizeof hw, "%lldx%lld", (long long)h->HW, (long long)h->HW);
        printf("%-9s %4lld %7s %2lld %10.1f %9.1f\n", "relu6", (long long)h->C, hw, (long long)h->s, a * 1e6, flop / a * 1e-9);
        fflush(stdout);
        free(x), free(w), free(b), free(y);
    }
    free(ta), free(tb);
}

int main(int argc, char **argv) {
    int rounds = 21;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else { fprintf(stderr, "usage: bench_isa_kernels [--rounds N] [--only gemv|linear|conv|wino|mobile]\n"); return 2; }
    }
    if (rounds < 1 || rounds > 10000) { fprintf(stderr, "bench_isa_kernels: --rounds must be in [1, 10000]\n"); return 2; }
    if (only && strcmp(only, "gemv") && strcmp(only, "linear") && strcmp(only, "conv") && strcmp(only, "wino") &&
        strcmp(only, "mobile")) {
        fprintf(stderr, "bench_isa_kernels: --only takes gemv, linear, conv, wino or mobile, not '%s'\n", only);
        return 2;
    }
    if (only && !strcmp(only, "wino")) {
        if (!fm_cpu_use_avx2()) { fprintf(stderr, "bench_isa_kernels: --only wino needs the AVX2 level (FATHOM_ISA unset)\n"); return 77; }
        printf("CPU: %s; one thread; median of %d alternating rounds; clock: %s\n", fm_cpu_get_features()->model, rounds,
               getenv("FATHOM_BENCH_CLOCK") ? getenv("FATHOM_BENCH_CLOCK") : "wall");
        bench_wino(rounds);
        return 0;
    }
    if (only && !strcmp(only, "mobile")) {
        if (!fm_cpu_use_avx2()) { fprintf(stderr, "bench_isa_kernels: --only mobile needs the AVX2 level\n"); return 77; }
        fm_set_num_threads(1);
        printf("CPU: %s; one thread; median of %d alternating rounds; clock: %s\n", fm_cpu_get_features()->model, rounds,
               getenv("FATHOM_BENCH_CLOCK") ? getenv("FATHOM_BENCH_CLOCK") : "wall");
        bench_mobile(rounds);
        fm_parallel_shutdown();
        return 0;
    }
    if (!fm_cpu_use_avx512()) { fprintf(stderr, "bench_isa_kernels: needs the AVX-512 level (FATHOM_ISA unset)\n"); return 77; }
    printf("CPU: %s; one thread; median of %d alternating rounds; clock: %s\n", fm_cpu_get_features()->model, rounds,
           getenv("FATHOM_BENCH_CLOCK") ? getenv("FATHOM_BENCH_CLOCK") : "wall");
    if (!only || !strcmp(only, "gemv")) bench_gemv(rounds);
    if (!only || !strcmp(only, "linear")) bench_linear(rounds);
    if (!only || !strcmp(only, "conv")) bench_conv(rounds);
    return 0;
}
