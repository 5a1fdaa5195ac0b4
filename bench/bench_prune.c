/* A model against its pruned version: forward time (no grad) at batch 1 and
 * 32, eager (the model's own forward) and compiled (the traced graph after
 * `fathom compile`'s passes), for two model directories (e.g. fashion-cnn and
 * `fathom prune --structured channels` of it). The four sides run in
 * alternating rounds so machine load hits all alike; the median of each is
 * printed as one JSON line per batch with the speed-ups of the pruned model.
 * Usage: bench_prune ORIGINAL_DIR PRUNED_DIR [--rounds N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fathom/autograd.h"
#include "fathom/graph.h"
#include "fathom/recipe.h"

typedef struct side { fm_recipe r; fm_module *m; fm_graph *c; int64_t params; } side;

static void die(const char *what) {
    fprintf(stderr, "bench_prune: %s: %s\n", what, fm_last_error());
    exit(1);
}

static void load(const char *dir, side *s) {
    if (fm_model_load(dir, &s->r, &s->m)) die(dir);
    s->params = fm_module_num_params(s->m);
    int64_t sh[FM_MAX_DIMS] = {2};
    for (int i = 0; i < s->r.input_ndim; i++) sh[i + 1] = s->r.input_shape[i];
    fm_rng rng;
    fm_rng_init(&rng, 1);
    fm_tensor *ex = fm_tensor_randn(s->r.input_ndim + 1, sh, FM_F32, &rng);
    fm_graph *g = fm_graph_trace_module(s->m, ex);
    fm_compile_report rep;
    s->c = g ? fm_graph_compile(g, &rep) : NULL;
    if (!s->c) die(dir);
    fm_graph_free(g);
    fm_tensor_release(ex);
}

static double run(side *s, int compiled, fm_tensor *x) {
    double t0 = bench_now_s();
    fm_tensor *y = compiled ? fm_graph_run1(s->c, x) : fm_module_forward(s->m, x);
    if (!y) die("forward");
    fm_tensor_release(y);
    return bench_now_s() - t0;
}

int main(int argc, char **argv) {
    const char *dirs[2] = {NULL, NULL};
    int rounds = 15, nd = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (nd < 2) dirs[nd++] = argv[i];
    }
    if (nd != 2 || rounds < 1 || rounds > 200) {
        fprintf(stderr, "usage: bench_prune ORIGINAL_DIR PRUNED_DIR [--rounds N (1..200)]\n");
        return 2;
    }
    fm_set_grad_enabled(false);
    side s[2];
    memset(s, 0, sizeof s);
    load(dirs[0], &s[0]);
    load(dirs[1], &s[1]);
    int64_t batches[2] = {1, 32};
    static double t[4][200];
    for (int b = 0; b < 2; b++) {
        int64_t sh[FM_MAX_DIMS] = {batches[b]};
        for (int i = 0; i < s[0].r.input_ndim; i++) sh[i + 1] = s[0].r.input_shape[i];
        fm_rng rng;
        fm_rng_init(&rng, 2);
        fm_tensor *x = fm_tensor_randn(s[0].r.input_ndim + 1, sh, FM_F32, &rng);
        for (int k = 0; k < 4; k++) run(&s[k / 2], k % 2, x); /* warm-up */
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < 4; k++) t[k][r] = run(&s[k / 2], k % 2, x);
        double m[4];
        for (int k = 0; k < 4; k++) m[k] = 1e3 * bench_median(t[k], rounds);
        printf("{\"batch\": %lld, \"original_params\": %lld, \"pruned_params\": %lld, \"original_eager_ms\": %.3f, "
               "\"original_compiled_ms\": %.3f, \"pruned_eager_ms\": %.3f, \"pruned_compiled_ms\": %.3f, "
               "\"speedup_eager\": %.2f, \"speedup_compiled\": %.2f, \"rounds\": %d}\n",
               (long long)batches[b], (long long)s[0].params, (long long)s[1].params, m[0], m[1], m[2], m[3], m[0] / m[2],
               m[1] / m[3], rounds);
        fflush(stdout);
        fm_tensor_release(x);
    }
    for (int k = 0; k < 2; k++) {
        fm_graph_free(s[k].c);
        fm_module_free(s[k].m);
        fm_recipe_free(&s[k].r);
    }
    return 0;
}
