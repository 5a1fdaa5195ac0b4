/* Compiled graph vs eager: fashion-cnn (forward at batch 1 and 32) and the
 * kjv-gpt shape (a 64-token prompt at batch 1 and 32; one decode step after a
 * 64-token cache at batch 1). Weights are random (speed does not depend on
 * them). Three sides, as alternating rounds so machine load hits all alike:
 * the model's own eager forward (no grad), the traced graph, and the graph
 * after `fathom compile`'s passes. Median per side, plus the measured peak of
 * allocated bytes during one run of each and (fashion-cnn) the compiled graph's
 * memory plan; the GPT's plan would bind only batch (seq and past stay at their
 * hints), so it is not printed for those rows (0).
 * Usage: bench_graph [--rounds N] [--model cnn|gpt|llama] [--only eager|graph|compiled] [--batch 1|32] [--save-gpt DIR | --save-llama DIR] [--cold]
 * (--batch: the fashion-cnn rows at that batch only, for a profiler)
 * (--cold flushes the caches before every timed run, 64 MiB written and read;
 * --only runs one side alone, for a profiler: its JSON row gives 0 for the others;
 * --save-gpt writes the kjv-gpt-shaped graph to DIR/graph and compiled to DIR/compiled
 * and exits, for bench_graph_ort.py) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/memory.h"
#include "fathom/recipe.h"
#include "gpt/gpt_internal.h" /* the cache length, rewound between rounds */

typedef struct side { const char *name; double t[1024]; size_t peak; } side;
typedef fm_status (*run_fn)(void *ctx, int which); /* which: 0 eager, 1 graph, 2 compiled */
static int g_only = -1; /* --only: the one side to run, or -1 for all three */
static const char *g_save_gpt; /* --save-gpt DIR, --save-llama DIR */
static int g_cold; /* --cold: every timed run starts with the caches flushed */

/* Writes and reads 64 MiB (more than this machine's caches) so that the next run starts cold. */
static void flush_caches(void) {
    static unsigned char *buf;
    static volatile unsigned sink;
    const size_t n = (size_t)64 << 20;
    if (!buf && !(buf = malloc(n))) return;
    memset(buf, (int)(sink & 0xff) + 1, n);
    unsigned s = 0;
    for (size_t i = 0; i < n; i += 64) s += buf[i];
    sink = s;
}

static void measure(const char *model, int64_t batch, const char *what, run_fn f, void *ctx, int rounds, const fm_graph *cg) {
    side s[3] = {{"eager", {0}, 0}, {"graph", {0}, 0}, {"compiled", {0}, 0}};
    for (int w = 0; w < 3; w++) { /* warm-up (a graph plans its arena at a shape's second run), and the peak of one run */
        if (g_only >= 0 && w != g_only) continue;
        if (f(ctx, w) != FM_OK) { fprintf(stderr, "bench_graph: %s\n", fm_last_error()); exit(1); }
        fm_memory_stats a, b;
        fm_memory_stats_get(FM_CPU, &a);
        fm_memory_reset_peak(FM_CPU);
        if (f(ctx, w) != FM_OK) { fprintf(stderr, "bench_graph: %s\n", fm_last_error()); exit(1); }
        fm_memory_stats_get(FM_CPU, &b);
        s[w].peak = b.allocated_peak > a.allocated ? b.allocated_peak - a.allocated : 0;
    }
    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < 3; w++) {
            if (g_only >= 0 && w != g_only) continue;
            if (g_cold) flush_caches();
            double t0 = bench_now_s();
            if (f(ctx, w) != FM_OK) { fprintf(stderr, "bench_graph: %s\n", fm_last_error()); exit(1); }
            s[w].t[r] = bench_now_s() - t0;
        }
    double med[3];
    for (int w = 0; w < 3; w++) med[w] = bench_median(s[w].t, rounds);
    fm_memory_plan p = {0};
    if (cg) fm_graph_plan_memory(cg, batch, &p); /* plans bind only "batch": other dims stay at their hints */
    printf("{\"model\": \"%s\", \"batch\": %lld, \"workload\": \"%s\", \"eager_ms\": %.3f, \"graph_ms\": %.3f, \"compiled_ms\": %.3f, "
           "\"compiled_vs_eager\": %.3f, \"eager_peak_bytes\": %zu, \"graph_peak_bytes\": %zu, \"compiled_peak_bytes\": %zu, "
           "\"planned_arena_bytes\": %zu, \"planned_live_peak_bytes\": %zu, \"run_arena_bytes\": %zu, \"output_bytes\": %zu, \"run_uses_arena\": %s}\n",
           model, (long long)batch, what, 1e3 * med[0], 1e3 * med[1], 1e3 * med[2], med[0] > 0 && med[2] > 0 ? med[0] / med[2] : 0.0, s[0].peak, s[1].peak, s[2].peak,
           p.planned_bytes, p.live_peak_bytes, p.run_arena_bytes, p.output_bytes, p.run_uses_arena ? "true" : "false");
    fflush(stdout);
}

/* ---- fashion-cnn ---- */
static int64_t g_batch; /* --batch: only this batch (0: 1 and 32) */
typedef struct cnn { fm_module *m; fm_graph *g, *c; fm_tensor *x; } cnn;

static fm_status cnn_run(void *ctx, int which) {
    cnn *k = ctx;
    fm_tensor *y = which == 0 ? fm_module_forward(k->m, k->x) : fm_graph_run1(which == 1 ? k->g : k->c, k->x);
    fm_status st = y ? FM_OK : fm_last_status();
    fm_tensor_release(y);
    return st;
}

static void bench_cnn(int rounds) {
    fm_recipe r;
    fm_rng rng;
    fm_rng_init(&rng, 1);
    if (fm_recipe_load("fashion-cnn", &r)) { fprintf(stderr, "bench_graph: %s\n", fm_last_error()); exit(1); }
    cnn k = {fm_recipe_build_model(&r, &rng), NULL, NULL, NULL};
    fm_module_train(k.m, false);
    int64_t sh[FM_MAX_DIMS] = {2};
    for (int i = 0; i < r.input_ndim; i++) sh[i + 1] = r.input_shape[i];
    fm_tensor *ex = fm_tensor_randn(r.input_ndim + 1, sh, FM_F32, &rng);
    k.g = fm_graph_trace_module(k.m, ex);
    fm_compile_report rep;
    k.c = k.g ? fm_graph_compile(k.g, &rep) : NULL;
    if (!k.c) { fprintf(stderr, "bench_graph: %s\n", fm_last_error()); exit(1); }
    int64_t batches[2] = {1, 32};
    for (int b = 0; b < 2; b++) {
        if (g_batch && batches[b] != g_batch) continue;
        sh[0] = batches[b];
        k.x = fm_tensor_randn(r.input_ndim + 1, sh, FM_F32, &rng);
        measure("fashion-cnn", batches[b], "forward", cnn_run, &k, rounds, k.c);
        fm_tensor_release(k.x);
    }
    fm_tensor_release(ex);
    fm_graph_free(k.g);
    fm_graph_free(k.c);
    fm_module_free(k.m);
    fm_recipe_free(&r);
}

/* ---- the kjv-gpt shape ---- */
typedef struct gptb { fm_gpt *m; fm_graph *g, *c; fm_tensor *idx; fm_tensor **in; int n_in; fm_gpt_kv_cache *kv; bool decode; } gptb;

static fm_status gpt_run(void *ctx, int which) {
    gptb *k = ctx;
    if (which == 0 && k->decode) { /* one step on a cache of 64 tokens: its length is set back to 64 each time */
        k->kv->len = 64;
        fm_tensor *y = fm_gpt_forward_cached(k->m, k->idx, k->kv);
        fm_status st = y ? FM_OK : fm_last_status();
        fm_tensor_release(y);
        return st;
    }
    if (which == 0) {
        fm_tensor *y = fm_gpt_forward(k->m, k->idx, NULL, NULL);
        fm_status st = y ? FM_OK : fm_last_status();
        fm_tensor_release(y);
        return st;
    }
    fm_tensor **out = calloc((size_t)k->n_in, sizeof *out);
    k->in[0] = k->idx;
    fm_status st = fm_graph_run(which == 1 ? k->g : k->c, k->in, out);
    for (int i = 0; st == FM_OK && i < k->n_in; i++) fm_tensor_release(out[i]);
    free(out);
    return st;
}

/* kjv-gpt's shape (4 layers of width 128, 4 heads, MLP 512, vocab 512); llama: the same as a
 * Llama (RMSNorm, RoPE, SwiGLU with 512 hidden, 2 KV heads). */
static void bench_gpt(int rounds, bool llama) {
    fm_gpt_config c = fm_gpt_config_default(llama ? FM_GPT_LLAMA : FM_GPT_GPT2);
    c.n_layer = 4, c.n_head = 4, c.n_kv_head = llama ? 2 : 4, c.n_embd = 128, c.ffn_hidden = 512, c.block_size = 128, c.vocab_size = 512, c.dropout = 0;
    const char *name = llama ? "kjv-llama" : "kjv-gpt";
    fm_rng rng;
    fm_rng_init(&rng, 2);
    gptb k = {fm_gpt_new(&c, &rng), NULL, NULL, NULL, NULL, 1 + 2 * c.n_layer, NULL, false};
    k.g = k.m ? fm_graph_from_gpt(k.m) : NULL;
    fm_compile_report rep;
    k.c = k.g ? fm_graph_compile(k.g, &rep) : NULL;
    if (!k.c) { fprintf(stderr, "bench_graph: %s\n", fm_last_error()); exit(1); }
    if (g_save_gpt) {
        char d1[512], d2[512];
        snprintf(d1, sizeof d1, "%s/graph", g_save_gpt);
        snprintf(d2, sizeof d2, "%s/compiled", g_save_gpt);
        if (fm_graph_save(k.g, d1) || fm_graph_save(k.c, d2)) { fprintf(stderr, "bench_graph: %s\n", fm_last_error()); exit(1); }
        fm_graph_free(k.g), fm_graph_free(k.c), fm_gpt_free(k.m);
        return;
    }
    fm_gpt_train_mode(k.m, false);
    k.in = calloc((size_t)k.n_in, sizeof *k.in);
    const int64_t D = c.n_embd / c.n_head;
    int64_t batches[2] = {1, 32};
    for (int b = 0; b < 2; b++) {
        for (int i = 1; i < k.n_in; i++) k.in[i] = fm_tensor_zeros(4, (int64_t[]){batches[b], c.n_kv_head, 0, D}, FM_F32, FM_CPU);
        k.idx = fm_tensor_zeros(2, (int64_t[]){batches[b], 64}, FM_I64, FM_CPU);
        measure(name, batches[b], "prompt of 64 tokens", gpt_run, &k, rounds, NULL);
        fm_tensor_release(k.idx);
        for (int i = 1; i < k.n_in; i++) fm_tensor_release(k.in[i]);
    }
    /* decode: one token after 64 cached */
    k.decode = true;
    k.kv = fm_gpt_kv_cache_new(k.m, 1);
    fm_tensor *pre = fm_tensor_zeros(2, (int64_t[]){1, 64}, FM_I64, FM_CPU), *pre_out = fm_gpt_forward_cached(k.m, pre, k.kv);
    fm_tensor_release_n(2, pre, pre_out);
    for (int i = 1; i < k.n_in; i++) k.in[i] = fm_tensor_zeros(4, (int64_t[]){1, c.n_kv_head, 64, D}, FM_F32, FM_CPU);
    k.idx = fm_tensor_zeros(2, (int64_t[]){1, 1}, FM_I64, FM_CPU);
    measure(name, 1, "decode step after 64 cached tokens", gpt_run, &k, rounds, NULL);
    fm_tensor_release(k.idx);
    for (int i = 1; i < k.n_in; i++) fm_tensor_release(k.in[i]);
    fm_gpt_kv_cache_free(k.kv);
    free(k.in);
    fm_graph_free(k.g);
    fm_graph_free(k.c);
    fm_gpt_free(k.m);
}

int main(int argc, char **argv) {
    int rounds = 15;
    g_batch = 0;
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) g_batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--save-gpt") && i + 1 < argc) g_save_gpt = argv[++i], model = "gpt";
        else if (!strcmp(argv[i], "--save-llama") && i + 1 < argc) g_save_gpt = argv[++i], model = "llama";
        else if (!strcmp(argv[i], "--cold")) g_cold = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            const char *o = argv[++i];
            g_only = !strcmp(o, "eager") ? 0 : !strcmp(o, "graph") ? 1 : !strcmp(o, "compiled") ? 2 : -2;
        } else g_only = -2;
    }
    if (g_only == -2 || (model && strcmp(model, "cnn") && strcmp(model, "gpt") && strcmp(model, "llama")) || (g_batch != 0 && g_batch != 1 && g_batch != 32)) {
        fprintf(stderr, "usage: bench_graph [--rounds N] [--model cnn|gpt|llama] [--only eager|graph|compiled] [--batch 1|32 (cnn)] [--save-gpt DIR | --save-llama DIR] [--cold]\n");
        return 2;
    }
    if (rounds < 1 || rounds > 1024) rounds = 15;
    fm_set_grad_enabled(false);
    if (!model || !strcmp(model, "cnn")) bench_cnn(rounds);
    if (!model || !strcmp(model, "gpt")) bench_gpt(rounds, false);
    if (model && !strcmp(model, "llama")) bench_gpt(rounds, true);
    return 0;
}
