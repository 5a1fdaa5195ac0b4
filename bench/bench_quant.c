/* fathom quantize, measured (docs/QUANTIZE.md has the table):
 *   1. fashion-mlp (784-1024-1024-10, ReLU) at batch 128: fp32 graph vs int8
 *      dynamic vs int8 static (GEMM-bound; goal int8 >= 2x fp32);
 *   2. the kjv-gpt shape (4 layers x 128, vocab 512): a 64-token prompt at
 *      batch 8 (prefill), fp32 vs int8 dynamic;
 *   3. decode steps (batch 1, 64 cached tokens) of the kjv-gpt shape and of a
 *      GPT-2-small shape (12 x 768, vocab 8192): tokens/s for fp32, int8 and
 *      int4 g32/64/128, with the bytes of weights each step reads and the bound
 *      those bytes set at the measured read bandwidth (read_bandwidth: the
 *      decode's thread count streaming a 512 MiB array; goal int4 >= 1.8x fp32
 *      and >= 80% of the bound);
 *   4. with --ort PYTHON: ONNX Runtime on the same MLP (fp32, quantize_dynamic,
 *      quantize_static), bench/bench_quant_ort.py, in this invocation;
 *   5. with --ppl MODEL_DIR (a kjv-gpt trained by fathom train, with its
 *      tokens.bin): the validation perplexity (the last 10% of the tokens, as
 *      training holds out, in windows of the block size) of its graph in fp32,
 *      int8 dynamic and int4 g32/64/128 (symmetric and with min), as llama.cpp
 *      reports its quantization types.
 * Weights are random (speed does not depend on them); the sides run in
 * alternating rounds so that machine load hits all alike; medians and, for a
 * loaded machine, the best round of each side ("best_*"). JSON lines.
 * With --kernels: only the GEMMs, fp32 linear vs int8 on packed panels, in GFLOP/s,
 * and the one-row GEMVs, fp32 vs int4, in GB/s of weights read.
 * With --cpu-time: process CPU time instead of the wall clock (see now_s).
 * With --cnn MODEL_DIR|MODEL.onnx [--batches B,B,...]: only a CNN (a trained fashion-cnn, or an
 * image classifier exported to ONNX), compiled, against its int8 forms (bench_cnn), and with
 * --ort ONNX Runtime's on the same model.
 * With --xl: only the decode table, on a 24 x 2048 shape (1.2B parameters: 4.8 GB fp32, about
 * 0.65 GB int4), whose weights are several times any L3, so the bandwidth bound applies
 * (GPT-2-small's int8/int4 weights fit in a 260 MB L3). Needs about 14 GB of memory.
 * With --generate: only the decode loop table (bench_generate: generation's steps, the caches
 * concatenated and appended in place; the decode figure of docs/QUANTIZE.md).
 * With --profile-prefill fp32|int8|int8-7bit: only that side of the prefill (2), run 10 x rounds times (for perf record;
 * FATHOM_BENCH_TRACE=FILE also writes fathom's profiler trace of the runs, for `fathom profile FILE`).
 * With --profile-decode fp32|int8|int4-gN: only that side's decode loop, `rounds` loops (for perf record;
 * FATHOM_BENCH_TRACE=FILE traces the loops after the first).
 * With --compiled: the GPT rows (2, 3) start from the compiled graph, fp32 and quantized alike, as
 * `fathom compile` and `fathom quantize` make them (fused linears, bias+GELU, residual+norm).
 * Usage: bench_quant [--rounds N] [--ort PYTHON] [--skip-large] [--xl] [--kernels] [--cpu-time] [--ppl MODEL_DIR [--ppl-windows N]]
 *                    [--cnn MODEL_DIR|MODEL.onnx [--batches B,...]]
 *                    [--profile-prefill fp32|int8] [--profile-decode fp32|int8|int4-gN] [--generate] [--compiled] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "bench_util.h"
#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/profile.h"
#include "fathom/graph.h"
#include "fathom/onnx.h"
#include "fathom/quant.h"

#define MAX_SIDES 6

/* --cpu-time: the process's CPU time instead of the wall clock. On a machine
 * shared with other jobs a process gets a fraction of the cores at random
 * moments, which the wall clock counts and CPU time does not; meaningful with
 * one thread (FATHOM_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1), where CPU time is
 * the time the work ran. */
static bool g_cpu_time;
static bool g_compiled; /* --compiled: the GPT sides start from the compiled graph (fathom compile's) */
static double now_s(void) {
    if (!g_cpu_time) return bench_now_s();
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
typedef struct { const char *name; const fm_graph *g; double t[64]; } side;

static void die(const char *what) {
    fprintf(stderr, "bench_quant: %s: %s\n", what, fm_last_error());
    exit(1);
}

/* Decode steps append to their caches in place (fm_graph_generate's way). */
static const fm_graph_run_options g_decode_opts = {.kv_append = true, .kv_capacity = 64 + 128}; /* the decode loops' prompt + steps */
static const fm_graph_run_options g_decode_opts16 = {.kv_append = true, .kv_capacity = 64 + 128, .kv_dtype = FM_F16}; /* the same, f16 caches */

/* Alternating rounds over the sides, each running its graph on the same inputs. */
static void time_sides(side *s, int n, fm_tensor *const *in, int n_out, int rounds, const fm_graph_run_options *opt) {
    fm_tensor *out[64];
    for (int r = -1; r < rounds; r++) /* round -1: warm-up */
        for (int i = 0; i < n; i++) {
            double t0 = now_s();
            if (fm_graph_run_ex(s[i].g, in, out, opt) != FM_OK) die(s[i].name);
            if (r >= 0) s[i].t[r] = now_s() - t0;
            for (int k = 0; k < n_out; k++) fm_tensor_release(out[k]);
        }
}

static double best_of(const double *t, int n) {
    double b = t[0];
    for (int i = 1; i < n; i++) b = fmin(b, t[i]);
    return b;
}

static fm_tensor *randn(int nd, const int64_t *shape, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(nd, shape, FM_F32, &r);
}

/* rr: 7-bit int8 weights (fathom quantize --reduce-range) */
static fm_graph *quantize_rr(const fm_graph *g, fm_quant_mode m, int group, const fm_tensor *calib, bool rr) {
    fm_quant_options o;
    fm_quant_options_init(&o);
    o.mode = m;
    o.group = group;
    o.calib = calib;
    o.reduce_range = rr;
    fm_graph *q = fm_graph_quantize(g, &o, NULL);
    if (!q) die("quantize");
    return q;
}

static fm_graph *quantize(const fm_graph *g, fm_quant_mode m, int group, const fm_tensor *calib) { return quantize_rr(g, m, group, calib, false); }

static size_t weight_bytes(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/weights.safetensors", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return (size_t)n;
}

/* .npy of an f32 tensor (C order) for the ONNX Runtime side */
static void write_npy(const char *path, const fm_tensor *t) {
    FILE *f = fopen(path, "wb");
    if (!f) die(path);
    char hdr[160], dims[96] = "";
    for (int i = 0; i < t->ndim; i++) {
        size_t l = strlen(dims);
        snprintf(dims + l, sizeof dims - l, "%lld,%s", (long long)t->shape[i], i + 1 < t->ndim ? " " : "");
    }
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    while ((10 + n + 1) % 64) hdr[n++] = ' ';
    hdr[n++] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 255), (unsigned char)(n >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, (size_t)n, f);
    fwrite(fm_tensor_data(t), 4, (size_t)fm_tensor_numel(t), f);
    fclose(f);
}

/* ---- 0. the GEMMs alone: fp32 linear (the GEMM provider) vs int8 on panels ----
 * GFLOP/s counts 2 M N K per product for both (int8: multiply-adds of bytes),
 * the int8 side including its activation quantization (static scale). */
static void bench_kernels(int rounds) {
    const int64_t shapes[][3] = {{128, 1024, 784}, {128, 1024, 1024}, {512, 512, 128}, {512, 128, 512}, {512, 384, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
        fm_tensor *x = randn(2, (int64_t[]){M, K}, 5), *w = randn(2, (int64_t[]){N, K}, 6), *q = NULL, *sc = NULL, *p = NULL, *u = NULL;
        fm_tensor *q7 = NULL, *sc7 = NULL, *p7 = NULL, *u7 = NULL; /* 7-bit weights (--reduce-range) */
        if (fm_quantize_weight_int8(w, &q, &sc) || fm_pack_weight_int8(q, &p, &u)) die("pack");
        if (fm_quantize_weight_int8_range(w, 63, &q7, &sc7) || fm_pack_weight_int8(q7, &p7, &u7)) die("pack");
        const int reps = (int)(2e8 / (double)(M * N * K)) + 1;
        double t[3][64];
        for (int r = -1; r < rounds; r++)
            for (int side = 0; side < 3; side++) {
                double t0 = now_s();
                for (int k = 0; k < reps; k++) {
                    fm_tensor *y = side == 2 ? fm_qlinear_int8_packed(x, p7, sc7, u7, NULL, 0.02, 128, false)
                                   : side ? fm_qlinear_int8_packed(x, p, sc, u, NULL, 0.02, 128, false) : fm_linear(x, w, NULL);
                    if (!y) die("kernel");
                    fm_tensor_release(y);
                }
                if (r >= 0) t[side][r] = (now_s() - t0) / reps;
            }
        double f = 2.0 * (double)(M * N * K), m0 = bench_median(t[0], rounds), m1 = bench_median(t[1], rounds);
        double b0 = best_of(t[0], rounds), b1 = best_of(t[1], rounds), m2 = bench_median(t[2], rounds), b2 = best_of(t[2], rounds);
        printf("{\"gemm\": [%lld, %lld, %lld], \"fp32_gflops\": %.1f, \"int8_panels_gops\": %.1f, \"ratio\": %.2f, \"best_fp32_gflops\": %.1f, "
               "\"best_int8_gops\": %.1f, \"best_ratio\": %.2f, \"int8_7bit_gops\": %.1f, \"ratio_7bit\": %.2f, \"best_ratio_7bit\": %.2f}\n",
               (long long)M, (long long)N, (long long)K, f / m0 / 1e9, f / m1 / 1e9, m0 / m1, f / b0 / 1e9, f / b1 / 1e9, b0 / b1, f / m2 / 1e9,
               m0 / m2, b0 / b2);
        fflush(stdout);
        fm_tensor_release_n(10, x, w, q, sc, p, u, q7, sc7, p7, u7);
    }
}

/* One row x [1, K] through an [N, K] weight: fp32 linear (the one-row GEMV
 * kernel) vs int4 (fm_qlinear_int4, groups of 32/64/128), GB/s of weight bytes
 * read (f32: 4 N K; int4: N K / 2 + 2 N K / G of f16 scales). */
static void bench_gemv(int rounds) {
    const int64_t shapes[][2] = {{768, 768}, {3072, 768}, {768, 3072}, {8192, 768}, {4096, 4096}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t N = shapes[i][0], K = shapes[i][1];
        fm_tensor *x = randn(2, (int64_t[]){1, K}, 7), *w = randn(2, (int64_t[]){N, K}, 8);
        for (int G = 32; G <= 128; G *= 2) {
            fm_tensor *p = NULL, *sc = NULL, *mn = NULL;
            if (fm_quantize_weight_int4(w, G, false, &p, &sc, &mn)) die("int4");
            const int reps = (int)(3e7 / (double)(N * K)) + 1;
            double t[2][64];
            for (int r = -1; r < rounds; r++)
                for (int side = 0; side < 2; side++) {
                    double t0 = now_s();
                    for (int k = 0; k < reps; k++) {
                        fm_tensor *y = side ? fm_qlinear_int4(x, p, sc, NULL, NULL, G) : fm_linear(x, w, NULL);
                        if (!y) die("gemv");
                        fm_tensor_release(y);
                    }
                    if (r >= 0) t[side][r] = (now_s() - t0) / reps;
                }
            double b32 = 4.0 * (double)(N * K), b4 = (double)(N * K) / 2 + 2.0 * (double)(N * K / G);
            double m0 = bench_median(t[0], rounds), m1 = bench_median(t[1], rounds), bb0 = best_of(t[0], rounds), bb1 = best_of(t[1], rounds);
            printf("{\"gemv\": [1, %lld, %lld], \"group\": %d, \"fp32_us\": %.1f, \"int4_us\": %.1f, \"ratio\": %.2f, \"fp32_gb_s\": %.2f, \"int4_gb_s\": %.2f, "
                   "\"best_ratio\": %.2f, \"best_fp32_gb_s\": %.2f, \"best_int4_gb_s\": %.2f}\n", (long long)N, (long long)K, G, 1e6 * m0, 1e6 * m1,
                   m0 / m1, b32 / m0 / 1e9, b4 / m1 / 1e9, bb0 / bb1, b32 / bb0 / 1e9, b4 / bb1 / 1e9);
            fflush(stdout);
            fm_tensor_release_n(2, p, sc);
        }
        fm_tensor_release_n(2, x, w);
    }
}

/* ---- 1. fashion-mlp at batch 128 ---- */
static fm_graph *mlp_graph(void) {
    fm_graph *g = fm_graph_new();
    const int64_t dims[4] = {784, 1024, 1024, 10};
    fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 784}, (const char *[]){"batch", NULL});
    const char *prev = "x";
    char names[3][4][32];
    for (int l = 0; l < 3; l++) {
        fm_tensor *w = randn(2, (int64_t[]){dims[l + 1], dims[l]}, 10 + (uint64_t)l), *b = randn(1, &dims[l + 1], 20 + (uint64_t)l);
        fm_tensor *ws = fm_mul_scalar(w, 1.0 / 28.0); /* ~ Kaiming scale: activations stay O(1) */
        snprintf(names[l][0], 32, "fc%d.weight", l);
        snprintf(names[l][1], 32, "fc%d.bias", l);
        snprintf(names[l][2], 32, "h%d", l);
        snprintf(names[l][3], 32, "r%d", l);
        fm_graph_add_const(g, names[l][0], ws);
        fm_graph_add_const(g, names[l][1], b);
        fm_graph_add_node(g, "linear", NULL, 3, (const char *[]){prev, names[l][0], names[l][1]}, 1, (const char *[]){names[l][2]}, 0, NULL);
        prev = names[l][2];
        if (l < 2) {
            fm_graph_add_node(g, "relu", NULL, 1, (const char *[]){prev}, 1, (const char *[]){names[l][3]}, 0, NULL);
            prev = names[l][3];
        }
        fm_tensor_release_n(3, w, b, ws);
    }
    fm_graph_add_output(g, prev);
    if (fm_graph_validate(g) != FM_OK) die("mlp graph");
    return g;
}

static void bench_mlp(int rounds, const char *ort_python) {
    fm_graph *g = mlp_graph();
    fm_tensor *calib = randn(2, (int64_t[]){256, 784}, 3), *x = randn(2, (int64_t[]){128, 784}, 4);
    fm_graph *qd = quantize(g, FM_QUANT_INT8_DYNAMIC, 0, NULL), *qs = quantize(g, FM_QUANT_INT8_STATIC, 0, calib);
    fm_graph *qd7 = quantize_rr(g, FM_QUANT_INT8_DYNAMIC, 0, NULL, true), *qs7 = quantize_rr(g, FM_QUANT_INT8_STATIC, 0, calib, true);
    side s[5] = {{"fp32", g, {0}}, {"int8 dynamic", qd, {0}}, {"int8 static", qs, {0}}, {"int8 dynamic 7-bit", qd7, {0}}, {"int8 static 7-bit", qs7, {0}}};
    time_sides(s, 5, &x, 1, rounds, NULL);
    double m[5], b[5];
    for (int i = 0; i < 5; i++) { b[i] = best_of(s[i].t, rounds); m[i] = bench_median(s[i].t, rounds); }
    printf("{\"model\": \"fashion-mlp (784-1024-1024-10)\", \"batch\": 128, \"fp32_ms\": %.3f, \"int8_dynamic_ms\": %.3f, \"int8_static_ms\": %.3f, "
           "\"int8_dynamic_speedup\": %.2f, \"int8_static_speedup\": %.2f, \"best_fp32_ms\": %.3f, \"best_int8_dynamic_ms\": %.3f, "
           "\"best_int8_static_ms\": %.3f, \"best_dynamic_speedup\": %.2f, \"best_static_speedup\": %.2f, \"int8_dynamic_7bit_ms\": %.3f, "
           "\"int8_static_7bit_ms\": %.3f, \"int8_dynamic_7bit_speedup\": %.2f, \"int8_static_7bit_speedup\": %.2f, \"best_dynamic_7bit_speedup\": %.2f, "
           "\"best_static_7bit_speedup\": %.2f}\n", 1e3 * m[0], 1e3 * m[1], 1e3 * m[2], m[0] / m[1], m[0] / m[2], 1e3 * b[0], 1e3 * b[1], 1e3 * b[2],
           b[0] / b[1], b[0] / b[2], 1e3 * m[3], 1e3 * m[4], m[0] / m[3], m[0] / m[4], b[0] / b[3], b[0] / b[4]);
    fflush(stdout);
    if (ort_python) { /* the same model through ONNX Runtime: exported here, quantized by ORT there */
        char dir[256], onnx[300], np[300], cmd[1200];
        snprintf(dir, sizeof dir, "/tmp/bench_quant_%d", (int)getpid());
        snprintf(onnx, sizeof onnx, "%s.onnx", dir);
        snprintf(np, sizeof np, "%s.calib.npy", dir);
        if (fm_graph_export_onnx(g, onnx) != FM_OK) die("export");
        write_npy(np, calib); /* the calibration samples */
        snprintf(cmd, sizeof cmd, "%s bench/bench_quant_ort.py %s %s %d", ort_python, onnx, np, rounds);
        if (system(cmd) != 0) fprintf(stderr, "bench_quant: the ONNX Runtime side failed (%s)\n", cmd);
        remove(onnx);
        remove(np);
    }
    fm_tensor_release_n(2, calib, x);
    fm_graph_free(qd);
    fm_graph_free(qs);
    fm_graph_free(qd7);
    fm_graph_free(qs7);
    fm_graph_free(g);
}

/* ---- --cnn MODEL_DIR|MODEL.onnx [--batches B,B,...]: a trained fashion-cnn (fathom train fashion-cnn),
 * or an image classifier exported to ONNX (a torchvision ResNet-18), compiled as fathom
 * compile does, against its int8 forms as fathom quantize makes them (its convolutions as
 * qconv2d_int8 with their ReLU and pool, its linears as qlinear_int8), at batches 1, 32 and
 * 256 (--batches) on N(0,1) images; the static side calibrated on 256 N(0,1) images (the scales change the
 * values, not the work). With --ort: ONNX Runtime on the same compiled graph exported (an ONNX
 * input: on the file itself), fp32,
 * quantize_dynamic and quantize_static (QDQ, per channel), at the same batches. ---- */
static void bench_cnn(const char *dir, int rounds, const char *ort_python, const int *batches, int n_batches) {
    const size_t len = strlen(dir);
    const bool onnx = len > 5 && !strcmp(dir + len - 5, ".onnx"); /* a model from elsewhere (an image classifier exported to ONNX) */
    fm_onnx_model *om = onnx ? fm_onnx_load(dir) : NULL;
    if (onnx && !om) die(dir);
    fm_graph *m = om ? fm_onnx_to_graph(om) : fm_graph_from_model_dir(dir);
    fm_onnx_free(om);
    if (!m) die(dir);
    fm_compile_report rep;
    fm_graph *g = fm_graph_compile(m, &rep);
    if (!g) die("compile");
    fm_graph_io in;
    if (fm_graph_input_info(g, 0, &in) != FM_OK || in.ndim != 4) die("the model's input is not an image batch [N, C, H, W]");
    int64_t shape[4] = {256, in.shape[1], in.shape[2], in.shape[3]};
    fm_tensor *calib = randn(4, shape, 3);
    fm_graph *qd = quantize(g, FM_QUANT_INT8_DYNAMIC, 0, NULL), *qs = quantize(g, FM_QUANT_INT8_STATIC, 0, calib);
    fm_graph *qs7 = quantize_rr(g, FM_QUANT_INT8_STATIC, 0, calib, true); /* 7-bit weights (--reduce-range) */
    for (int bi = 0; bi < n_batches; bi++) {
        shape[0] = batches[bi];
        fm_tensor *x = randn(4, shape, 4);
        side s[4] = {{"fp32", g, {0}}, {"int8 dynamic", qd, {0}}, {"int8 static", qs, {0}}, {"int8 static 7-bit", qs7, {0}}};
        time_sides(s, 4, &x, 1, rounds, NULL);
        double md[4], b[4];
        for (int i = 0; i < 4; i++) { b[i] = best_of(s[i].t, rounds); md[i] = bench_median(s[i].t, rounds); }
        printf("{\"model\": \"%s (compiled)\", \"batch\": %d, \"fp32_ms\": %.4f, \"int8_dynamic_ms\": %.4f, \"int8_static_ms\": %.4f, "
               "\"int8_dynamic_speedup\": %.2f, \"int8_static_speedup\": %.2f, \"best_fp32_ms\": %.4f, \"best_int8_dynamic_ms\": %.4f, "
               "\"best_int8_static_ms\": %.4f, \"int8_static_7bit_ms\": %.4f, \"int8_static_7bit_speedup\": %.2f}\n", dir, batches[bi], 1e3 * md[0],
               1e3 * md[1], 1e3 * md[2], md[0] / md[1], md[0] / md[2], 1e3 * b[0], 1e3 * b[1], 1e3 * b[2], 1e3 * md[3], md[0] / md[3]);
        fflush(stdout);
        fm_tensor_release(x);
    }
    if (ort_python) {
        char base[256], onnx_path[300], np[300], cmd[1400];
        snprintf(base, sizeof base, "/tmp/bench_quant_cnn_%d", (int)getpid());
        snprintf(onnx_path, sizeof onnx_path, "%s.onnx", base);
        snprintf(np, sizeof np, "%s.calib.npy", base);
        if (!onnx && fm_graph_export_onnx(g, onnx_path) != FM_OK) die("export"); /* an ONNX input: ORT takes the file itself */
        write_npy(np, calib);
        for (int bi = 0; bi < n_batches; bi++) {
            snprintf(cmd, sizeof cmd, "%s bench/bench_quant_ort.py %s %s %d %d '%s (%s)'", ort_python, onnx ? dir : onnx_path, np, rounds,
                     batches[bi], dir, onnx ? "the file" : "compiled, exported");
            if (system(cmd) != 0) fprintf(stderr, "bench_quant: the ONNX Runtime side failed (%s)\n", cmd);
        }
        remove(onnx_path);
        remove(np);
    }
    fm_tensor_release(calib);
    fm_graph_free(qd);
    fm_graph_free(qs);
    fm_graph_free(qs7);
    fm_graph_free(g);
    fm_graph_free(m);
}

/* ---- 2 and 3: GPT prefill and decode ---- */
typedef struct { const char *name; int n_layer, n_embd, vocab; } gpt_shape;

static fm_graph *gpt_graph(const gpt_shape *sh) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = sh->n_layer, c.n_head = sh->n_embd / 64 > 4 ? sh->n_embd / 64 : 4, c.n_embd = sh->n_embd, c.ffn_hidden = 4 * sh->n_embd;
    c.n_kv_head = c.n_head, c.block_size = 256, c.vocab_size = sh->vocab, c.dropout = 0;
    fm_rng rng;
    fm_rng_init(&rng, 2);
    fm_gpt *m = fm_gpt_new(&c, &rng);
    fm_graph *g = m ? fm_graph_from_gpt(m) : NULL;
    fm_gpt_free(m);
    if (!g) die("gpt graph");
    return g;
}

/* inputs: tokens [B, T] and the 2 L pasts [B, H, past, D]; with spare > 0 each
 * past is the first `past` rows of a cache of past + spare rows per head, as a
 * decode loop's caches are (kv_append writes the step's row past them in place:
 * every run then does what a generation step does at that context) */
static fm_tensor **gpt_inputs(const fm_graph *g, int64_t B, int64_t T, int64_t past, int64_t spare) {
    int n = fm_graph_num_inputs(g);
    fm_tensor **in = calloc((size_t)n, sizeof *in);
    in[0] = fm_tensor_zeros(2, (int64_t[]){B, T}, FM_I64, FM_CPU);
    for (int i = 1; i < n; i++) {
        fm_graph_io io;
        fm_graph_input_info(g, i, &io);
        fm_tensor *cache = fm_tensor_zeros(4, (int64_t[]){B, io.shape[1], past + spare, io.shape[3]}, FM_F32, FM_CPU);
        in[i] = spare ? fm_narrow(cache, 2, 0, past) : fm_tensor_retain(cache);
        fm_tensor_release(cache);
        if (!in[i]) die("decode inputs");
    }
    return in;
}

static void free_inputs(fm_tensor **in, int n) {
    for (int i = 0; i < n; i++) fm_tensor_release(in[i]);
    free(in);
}

static double copy_bandwidth(void) { /* bytes read + written per second, a 256 MiB memcpy, best of 5 */
    const size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = bench_now_s();
        memcpy(b, a, n);
        best = fmin(best, bench_now_s() - t0);
    }
    free(a);
    free(b);
    return 2.0 * (double)n / best;
}

/* Stream-like read bandwidth, the bound a decode step's weight reads meet:
 * `threads` threads (FATHOM_NUM_THREADS, as the decode runs) each sum their
 * share of a 512 MiB array of u64 (xor, so the loop vectorizes and the loads
 * are the bound), all started together; bytes read / the slowest thread's
 * time, best of 7 rounds. */
typedef struct { const uint64_t *a; size_t n; uint64_t out; double t, cpu; } bw_part;

static double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *bw_read(void *arg) {
    bw_part *p = arg;
    double t0 = bench_now_s(), c0 = thread_cpu_s();
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= p->n; i += 4) { s0 ^= p->a[i]; s1 ^= p->a[i + 1]; s2 ^= p->a[i + 2]; s3 ^= p->a[i + 3]; }
    p->out = s0 ^ s1 ^ s2 ^ s3;
    p->t = bench_now_s() - t0;
    p->cpu = thread_cpu_s() - c0;
    return NULL;
}

/* *cpu_bw: the same bytes over the slowest thread's CPU time (a loaded
 * machine's stand-in: what the memory delivered while the threads ran). */
static double read_bandwidth(int threads, double *cpu_bw) {
    const size_t n = ((size_t)512 << 20) / 8;
    uint64_t *a = malloc(n * 8);
    if (!a) return 0;
    for (size_t i = 0; i < n; i++) a[i] = i; /* touch every page before timing */
    double best = 0;
    *cpu_bw = 0;
    for (int r = 0; r < 7; r++) {
        bw_part parts[64];
        pthread_t th[64];
        double slowest = 0, slowest_cpu = 0;
        for (int i = 0; i < threads; i++) {
            parts[i] = (bw_part){a + n / (size_t)threads * (size_t)i, n / (size_t)threads, 0, 0, 0};
            if (pthread_create(&th[i], NULL, bw_read, &parts[i]) != 0) { free(a); return 0; }
        }
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            slowest = fmax(slowest, parts[i].t);
            slowest_cpu = fmax(slowest_cpu, parts[i].cpu);
            if (parts[i].out == 1) fprintf(stderr, "."); /* keeps the sums alive */
        }
        best = fmax(best, (double)(n * 8) / slowest);
        *cpu_bw = fmax(*cpu_bw, (double)(n * 8) / slowest_cpu);
    }
    free(a);
    return best;
}

/* the weights' bytes as stored (the graph saved to a scratch directory, then removed) */
static size_t stored_weight_bytes(const fm_graph *g) {
    char dir[256], cmd[300];
    snprintf(dir, sizeof dir, "/tmp/bench_quant_w_%d", (int)getpid());
    size_t bytes = fm_graph_save((fm_graph *)g, dir) == FM_OK ? weight_bytes(dir) : 0;
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_quant: could not remove %s\n", dir);
    return bytes;
}

/* the shape's GPT graph compiled, as `fathom quantize` compiles a trained GPT first */
static fm_graph *compiled_gpt_graph(const gpt_shape *sh) {
    fm_graph *g0 = gpt_graph(sh), *g;
    fm_compile_report crep;
    if (!(g = fm_graph_compile(g0, &crep))) die("compile");
    fm_graph_free(g0);
    return g;
}

static void bench_gpt(const gpt_shape *sh, int rounds, bool prefill, double bw) {
    fm_graph *g = g_compiled ? compiled_gpt_graph(sh) : gpt_graph(sh);
    fm_graph *q[6] = {g, quantize(g, FM_QUANT_INT8_DYNAMIC, 0, NULL), NULL, NULL, NULL, NULL};
    const char *names[6] = {"fp32", "int8", "int4-g32", "int4-g64", "int4-g128", "int8 7-bit"};
    int n = 2;
    if (!prefill)
        for (int k = 0; k < 3; k++) q[n++] = quantize(g, FM_QUANT_INT4, 32 << k, NULL);
    else
        names[n] = names[5], q[n++] = quantize_rr(g, FM_QUANT_INT8_DYNAMIC, 0, NULL, true); /* the prefill's rows: the 7-bit tile */
    side s[6];
    for (int i = 0; i < n; i++) s[i] = (side){names[i], q[i], {0}};
    const int n_in = fm_graph_num_inputs(g);
    fm_tensor **in = prefill ? gpt_inputs(g, 8, 64, 0, 0) : gpt_inputs(g, 1, 1, 64, 0);
    time_sides(s, n, in, n_in, rounds, NULL);
    double fp32 = bench_median(s[0].t, rounds), fp32b = best_of(s[0].t, rounds);
    for (int i = 0; i < n; i++) {
        double t = i ? bench_median(s[i].t, rounds) : fp32, tb = best_of(s[i].t, rounds);
        const size_t bytes = stored_weight_bytes(q[i]);
        if (prefill)
            printf("{\"model\": \"%s\", \"workload\": \"prefill 8 x 64 tokens\", \"side\": \"%s\", \"ms\": %.3f, \"tokens_per_s\": %.0f, \"vs_fp32\": %.2f, "
                   "\"best_ms\": %.3f, \"best_vs_fp32\": %.2f}\n", sh->name, names[i], 1e3 * t, 512 / t, fp32 / t, 1e3 * tb, fp32b / tb);
        else
            printf("{\"model\": \"%s\", \"workload\": \"decode, 64 cached\", \"side\": \"%s\", \"ms\": %.3f, \"tokens_per_s\": %.1f, \"vs_fp32\": %.2f, "
                   "\"weight_bytes\": %zu, \"bound_tokens_per_s\": %.1f, \"of_bound\": %.2f, \"best_ms\": %.3f, \"best_vs_fp32\": %.2f}\n",
                   sh->name, names[i], 1e3 * t, 1 / t, fp32 / t, bytes, bw / (double)bytes, (1 / t) / (bw / (double)bytes), 1e3 * tb, fp32b / tb);
        fflush(stdout);
    }
    free_inputs(in, n_in);
    for (int i = 1; i < n; i++) fm_graph_free(q[i]);
    fm_graph_free(g);
}

/* --profile-prefill SIDE: only SIDE's (fp32, int8 or int8-7bit: --reduce-range's weights) prefill of
 * the kjv-gpt shape, 10 x rounds runs, for `perf record` (the profile in docs/QUANTIZE.md) */
static void profile_prefill(const char *side, int rounds) {
    const gpt_shape kjv = {"kjv-gpt shape (4 x 128, vocab 512)", 4, 128, 512};
    const bool i8 = !strcmp(side, "int8"), i7 = !strcmp(side, "int8-7bit");
    if (!i8 && !i7 && strcmp(side, "fp32")) die("--profile-prefill takes fp32, int8 or int8-7bit");
    fm_graph *g = g_compiled ? compiled_gpt_graph(&kjv) : gpt_graph(&kjv), *q = i8 || i7 ? quantize_rr(g, FM_QUANT_INT8_DYNAMIC, 0, NULL, i7) : NULL;
    const int n_in = fm_graph_num_inputs(g);
    fm_tensor **in = gpt_inputs(g, 8, 64, 0, 0), *out[64];
    const char *trace = getenv("FATHOM_BENCH_TRACE"); /* a Chrome trace of the runs after the first (fathom profile) */
    double t0 = now_s();
    for (int r = 0; r < 10 * rounds; r++) {
        if (trace && *trace && r == 1 && fm_profiler_start(trace) != FM_OK) die("profiler");
        if (fm_graph_run(q ? q : g, in, out) != FM_OK) die("prefill");
        for (int k = 0; k < n_in; k++) fm_tensor_release(out[k]);
    }
    if (trace && *trace && fm_profiler_stop() != FM_OK) die("profiler");
    printf("{\"model\": \"%s\", \"workload\": \"prefill 8 x 64 tokens\", \"side\": \"%s\", \"runs\": %d, \"ms\": %.3f}\n", kjv.name,
           side, 10 * rounds, 1e3 * (now_s() - t0) / (10 * rounds));
    free_inputs(in, n_in);
    if (q) fm_graph_free(q);
    fm_graph_free(g);
}

/* One decode loop as fm_graph_generate runs it: a prompt of `prompt` tokens, then
 * `steps` steps each feeding the presents back as the next pasts (token 0 each
 * time: the work does not depend on the ids). Returns the mean seconds of a step
 * (the prompt untimed). opt NULL: each step concatenates the whole past into new
 * presents; kv_append: appended in place. */
static double decode_loop(const fm_graph *g, int prompt, int steps, const fm_graph_run_options *opt) {
    const int n_in = fm_graph_num_inputs(g);
    fm_tensor **in = gpt_inputs(g, 1, prompt, 0, 0), *out[64];
    double t0 = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) t0 = now_s();
        if (fm_graph_run_ex(g, in, out, opt) != FM_OK) die("decode loop");
        fm_tensor_release(out[0]);
        fm_tensor_release(in[0]);
        in[0] = fm_tensor_zeros(2, (int64_t[]){1, 1}, FM_I64, FM_CPU);
        for (int k = 1; k < n_in; k++) {
            fm_tensor_release(in[k]);
            in[k] = out[k];
        }
    }
    double t = (now_s() - t0) / steps;
    free_inputs(in, n_in);
    return t;
}

/* --profile-decode SIDE: only SIDE's (fp32, int8, int4-g32|64|128, each optionally with
 * -kv16: f16 caches) decode loop of the
 * compiled GPT-2-small shape (prompt 64, 128 steps, caches appended in place), `rounds`
 * loops, for `perf record` */
static void profile_decode(const char *arg, int rounds) {
    const gpt_shape big = {"gpt2-small shape (12 x 768, vocab 8192)", 12, 768, 8192};
    char side[32];
    snprintf(side, sizeof side, "%s", arg);
    const size_t sl = strlen(side);
    const bool kv16 = sl > 5 && !strcmp(side + sl - 5, "-kv16"); /* SIDE-kv16: the f16 caches */
    if (kv16) side[sl - 5] = 0;
    fm_graph *g = compiled_gpt_graph(&big), *q = NULL; /* as --generate's */
    if (!strcmp(side, "int8")) q = quantize(g, FM_QUANT_INT8_DYNAMIC, 0, NULL);
    else if (!strncmp(side, "int4-g", 6)) q = quantize(g, FM_QUANT_INT4, atoi(side + 6), NULL);
    else if (strcmp(side, "fp32")) die("--profile-decode takes fp32, int8, int4-g32, int4-g64 or int4-g128");
    const char *trace = getenv("FATHOM_BENCH_TRACE"); /* a Chrome trace of the loops after the first (fathom profile) */
    double t = 0;
    for (int r = 0; r < rounds; r++) {
        if (trace && *trace && r == 1 && fm_profiler_start(trace) != FM_OK) die("profiler");
        t += decode_loop(q ? q : g, 64, 128, kv16 ? &g_decode_opts16 : &g_decode_opts);
    }
    if (trace && *trace && rounds > 1 && fm_profiler_stop() != FM_OK) die("profiler");
    printf("{\"model\": \"%s\", \"workload\": \"decode loop, prompt 64, 128 steps\", \"side\": \"%s\", \"loops\": %d, \"ms\": %.3f}\n", big.name,
           arg, rounds, 1e3 * t / rounds);
    if (q) fm_graph_free(q);
    fm_graph_free(g);
}

/* --generate: the GPT-2-small shape's decode loop, prompt 64 and 128 steps (contexts
 * 65-192), on the compiled graph (fused attention_kv, add + layer norm, bias + GELU)
 * and its int8 and int4 forms, as `fathom quantize` writes them; each side with the caches concatenated each step and appended in place
 * (fm_graph_generate's way), alternated over rounds: median ms a step each way, the
 * in-place tokens/s, its ratio to fp32's, and its fraction of the two bounds (the
 * weights' bytes a token over the copy bandwidth, the issue's, and over the read
 * bandwidth; the KV cache's reads, 9.4 MB a token at the mean context, not counted);
 * and a third way, appended in place to f16 caches (fm_graph_run_options.kv_dtype:
 * the reads 4.7 MB a token): ms_kv16, its speed-up over the f32 caches, and its
 * fraction of the copy bound. A line before each side's gives the copy bound over all the bytes
 * a step reads, the weights and the KV cache (of_copy_bound_with_kv, and _kv16_ for the f16 caches). */
static void bench_generate(int rounds, double bw, double cbw) {
    const gpt_shape big = {"gpt2-small shape (12 x 768, vocab 8192)", 12, 768, 8192};
    fm_graph *g = compiled_gpt_graph(&big); /* then quantized: what `fathom quantize` makes of a trained GPT */
    const fm_graph *q[5] = {g, quantize(g, FM_QUANT_INT8_DYNAMIC, 0, NULL), quantize(g, FM_QUANT_INT4, 32, NULL), quantize(g, FM_QUANT_INT4, 64, NULL),
                            quantize(g, FM_QUANT_INT4, 128, NULL)};
    const char *names[5] = {"fp32", "int8", "int4-g32", "int4-g64", "int4-g128"};
    double t[5][3][64], fp32 = 0;
    for (int r = -1; r < rounds; r++)
        for (int i = 0; i < 5; i++)
            for (int m = 0; m < 3; m++) {
                double x = decode_loop(q[i], 64, 128, m == 2 ? &g_decode_opts16 : m ? &g_decode_opts : NULL);
                if (r >= 0) t[i][m][r] = x;
            }
    /* what a step reads besides the weights: the past keys and values of every layer, at the
     * mean past length of the 128 steps (64 + 64.5 positions), 4 bytes an element (2 in f16) */
    const double kv_elems = 2.0 * big.n_layer * big.n_embd * (64 + 64.5);
    for (int i = 0; i < 5; i++) {
        const size_t bytes = stored_weight_bytes(q[i]);
        double cat = bench_median(t[i][0], rounds), app = bench_median(t[i][1], rounds), h = bench_median(t[i][2], rounds);
        if (!i) fp32 = app;
        printf("{\"model\": \"%s\", \"side\": \"%s\", \"note\": \"all bytes a step reads: weights + KV cache\", "
               "\"kv_bytes_f32\": %.0f, \"of_copy_bound_with_kv\": %.2f, \"kv_bytes_f16\": %.0f, \"of_copy_bound_kv16_with_kv\": %.2f}\n",
               big.name, names[i], 4 * kv_elems, (1 / app) / (cbw / ((double)bytes + 4 * kv_elems)), 2 * kv_elems,
               (1 / h) / (cbw / ((double)bytes + 2 * kv_elems)));
        printf("{\"model\": \"%s\", \"workload\": \"decode loop, prompt 64, 128 steps\", \"side\": \"%s\", \"ms_concat\": %.3f, "
               "\"ms_in_place\": %.3f, \"in_place_speedup\": %.2f, \"tokens_per_s\": %.1f, \"vs_fp32\": %.2f, \"weight_bytes\": %zu, "
               "\"of_copy_bound\": %.2f, \"of_read_bound\": %.2f, \"ms_kv16\": %.3f, \"kv16_speedup\": %.2f, \"tokens_per_s_kv16\": %.1f, "
               "\"of_copy_bound_kv16\": %.2f}\n",
               big.name, names[i], 1e3 * cat, 1e3 * app, cat / app, 1 / app, fp32 / app, bytes, (1 / app) / (cbw / (double)bytes),
               (1 / app) / (bw / (double)bytes), 1e3 * h, app / h, 1 / h, (1 / h) / (cbw / (double)bytes));
        fflush(stdout);
    }
    for (int i = 1; i < 5; i++) fm_graph_free((fm_graph *)q[i]);
    fm_graph_free(g);
}

/* mean cross-entropy of g over the validation windows (prompt-only runs, past = 0) */
static double val_loss(const fm_graph *g, const fm_token_data *d, int64_t T, int64_t windows) {
    const int64_t lo = (int64_t)((double)d->n * 0.9), n_in = fm_graph_num_inputs(g);
    double sum = 0;
    int64_t count = 0;
    for (int64_t w = 0; w < windows; w++) {
        fm_tensor *x = NULL, *y = NULL;
        if (fm_gpt_batch_eval(d, lo, d->n, 1, (int)T, w, &x, &y) != FM_OK) break; /* past the end of the split */
        fm_tensor **in = gpt_inputs(g, 1, T, 0, 0), *out[64] = {0};
        fm_tensor_release(in[0]);
        in[0] = x;
        if (fm_graph_run(g, in, out) != FM_OK) die("ppl run");
        fm_tensor *lg = fm_reshape(out[0], 2, (int64_t[]){T, out[0]->shape[2]}), *yy = fm_reshape(y, 1, &T);
        fm_tensor *ce = fm_cross_entropy(lg, yy, -100, 0.0, FM_REDUCE_SUM);
        if (!ce) die("ppl loss");
        sum += fm_tensor_item(ce);
        count += T;
        fm_tensor_release_n(4, lg, yy, ce, y);
        for (int k = 0; k < n_in; k++) fm_tensor_release(out[k]);
        in[0] = NULL;
        free_inputs(in, (int)n_in);
        fm_tensor_release(x);
    }
    return count ? sum / (double)count : NAN;
}

static void bench_ppl(const char *dir, int64_t windows) {
    fm_graph *g = fm_graph_from_model_dir(dir);
    if (!g) die("ppl model");
    char path[600];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    fm_token_data d;
    if (fm_token_file_read(path, 0, &d) != FM_OK) die("tokens.bin");
    const int64_t T = 128; /* the kjv-gpt block size */
    struct { const char *name; fm_quant_mode m; int group; bool wm; } sides[] = {
        {"fp32", FM_QUANT_INT8_DYNAMIC, 0, false}, {"int8 dynamic", FM_QUANT_INT8_DYNAMIC, 0, false},
        {"int4-g32", FM_QUANT_INT4, 32, false}, {"int4-g64", FM_QUANT_INT4, 64, false}, {"int4-g128", FM_QUANT_INT4, 128, false},
        {"int4-g32 with min", FM_QUANT_INT4, 32, true}, {"int4-g128 with min", FM_QUANT_INT4, 128, true}};
    double base = 0;
    for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
        fm_graph *q = g;
        if (i) {
            fm_quant_options o;
            fm_quant_options_init(&o);
            o.mode = sides[i].m;
            o.group = sides[i].group ? sides[i].group : 32;
            o.with_min = sides[i].wm;
            q = fm_graph_quantize(g, &o, NULL);
            if (!q) die("ppl quantize");
        }
        double l = val_loss(q, &d, T, windows);
        if (!i) base = l;
        printf("{\"model\": \"%s\", \"side\": \"%s\", \"val_tokens\": %lld, \"val_loss\": %.5f, \"perplexity\": %.4f, \"ppl_change\": %+.4f}\n",
               dir, sides[i].name, (long long)(windows * T), l, exp(l), exp(l) - exp(base));
        fflush(stdout);
        if (q != g) fm_graph_free(q);
    }
    fm_token_data_free(&d);
    fm_graph_free(g);
}

int main(int argc, char **argv) {
    int rounds = 9;
    const char *ort = NULL, *ppl = NULL, *prof = NULL, *prof_dec = NULL, *cnn = NULL;
    int batches[8] = {1, 32, 256}, n_batches = 3;
    bool large = true, kernels_only = false, xl = false, gen = false;
    long windows = 40;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ppl") && i + 1 < argc) { ppl = argv[++i]; continue; }
        if (!strcmp(argv[i], "--ppl-windows") && i + 1 < argc) { windows = atol(argv[++i]); continue; }
        if (!strcmp(argv[i], "--profile-prefill") && i + 1 < argc) { prof = argv[++i]; continue; }
        if (!strcmp(argv[i], "--profile-decode") && i + 1 < argc) { prof_dec = argv[++i]; continue; }
        if (!strcmp(argv[i], "--cnn") && i + 1 < argc) { cnn = argv[++i]; continue; }
        if (!strcmp(argv[i], "--batches") && i + 1 < argc) { /* --cnn's batch sizes */
            n_batches = 0;
            for (char *t = strtok(argv[++i], ","); t && n_batches < 8; t = strtok(NULL, ",")) batches[n_batches++] = atoi(t);
            continue;
        }
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ort") && i + 1 < argc) ort = argv[++i];
        else if (!strcmp(argv[i], "--skip-large")) large = false;
        else if (!strcmp(argv[i], "--kernels")) kernels_only = true;
        else if (!strcmp(argv[i], "--xl")) xl = true;
        else if (!strcmp(argv[i], "--generate")) gen = true;
        else if (!strcmp(argv[i], "--cpu-time")) g_cpu_time = true;
        else if (!strcmp(argv[i], "--compiled")) g_compiled = true;
    }
    if (rounds < 1 || rounds > 64) rounds = 9;
    fm_set_grad_enabled(false);
    if (ppl) { /* only the perplexity table */
        bench_ppl(ppl, windows > 0 ? windows : 40);
        return 0;
    }
    if (cnn) { /* only the CNN table */
        for (int i = 0; i < n_batches; i++)
            if (batches[i] < 1 || batches[i] > 4096) { fprintf(stderr, "bench_quant: --batches takes sizes in [1, 4096]\n"); return 2; }
        bench_cnn(cnn, rounds, ort, batches, n_batches);
        return 0;
    }
    if (prof) {
        profile_prefill(prof, rounds);
        return 0;
    }
    if (prof_dec) {
        profile_decode(prof_dec, rounds);
        return 0;
    }
    if (kernels_only) {
        bench_kernels(rounds);
        bench_gemv(rounds);
        return 0;
    }
    const char *nt = getenv("FATHOM_NUM_THREADS");
    int threads = nt && atoi(nt) > 0 && atoi(nt) <= 64 ? atoi(nt) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    double cbw = copy_bandwidth(), cpu_bw = 0, bw = read_bandwidth(threads > 64 ? 64 : threads, &cpu_bw);
    double wall_bw = bw;
    if (g_cpu_time) bw = cpu_bw; /* the decode is timed in CPU time too: the bound in the same units */
    printf("{\"copy_bandwidth_gb_s\": %.2f, \"read_bandwidth_gb_s\": %.2f, \"read_bandwidth_cpu_time_gb_s\": %.2f, \"read_threads\": %d, \"note\": "
           "\"copy: bytes read + written per second by a 256 MiB memcpy; read: bytes per second that %d threads read from a 512 MiB array, "
           "over the wall clock and over the slowest thread's CPU time (the decode bound uses the one its timing uses)\"}\n",
           cbw / 1e9, wall_bw / 1e9, cpu_bw / 1e9, threads, threads);
    if (gen) {
        bench_generate(rounds, bw, cbw);
        return 0;
    }
    if (xl) { /* weights several times a large L3 (260 MB on the Xeon of docs/QUANTIZE.md): the decode bound's case */
        const gpt_shape huge = {"gpt2-xl-like shape (24 x 2048, vocab 8192)", 24, 2048, 8192};
        bench_gpt(&huge, rounds, false, bw);
        return 0;
    }
    bench_mlp(rounds, ort);
    const gpt_shape kjv = {"kjv-gpt shape (4 x 128, vocab 512)", 4, 128, 512}, big = {"gpt2-small shape (12 x 768, vocab 8192)", 12, 768, 8192};
    bench_gpt(&kjv, rounds, true, bw);
    bench_gpt(&kjv, rounds, false, bw);
    if (large) bench_gpt(&big, rounds, false, bw);
    return 0;
}
