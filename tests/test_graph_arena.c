/* The runner's arena (src/graph/graph_arena.c): a shape's second run places its
 * intermediates at the memory plan's offsets in one block. Checked here: the
 * outputs are bitwise those of a run without the arena; the second run makes
 * fewer allocations than the first and its peak stays within the plan plus its
 * outputs; a value kept alive past its planned last reader by a view is not
 * overwritten by the values planned over it; an output that is a view of an
 * intermediate does not change when later runs reuse the memory; the arena comes
 * back to the allocator when the run ends; two threads running one graph agree
 * with one; and a compiled GPT graph gives the same logits with and without. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/fathom.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/memory.h"
#include "tensor_compare.h"
#include "test_util.h"

static fm_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(ndim, shape, FM_F32, &r);
}


static fm_tensor *run1(const fm_graph *g, fm_tensor *x, bool no_arena) {
    fm_graph_run_options o = {.no_arena = no_arena};
    fm_tensor *y = NULL;
    CHECK_MSG(fm_graph_run_ex(g, &x, &y, &o) == FM_OK, "run: %s", fm_last_error());
    return y;
}

static void add(fm_graph *g, const char *op, const char *a, const char *b, const char *out) {
    const char *in[2] = {a, b};
    CHECK_MSG(fm_graph_add_node(g, op, NULL, b ? 2 : 1, in, 1, &out, 0, NULL) == FM_OK, "%s: %s", op, fm_last_error());
}

/* x [batch, 4096] -> relu -> neg -> exp -> tanh -> neg: one output, four intermediates. */
static void test_chain(void) {
    fm_graph *g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 4096}, (const char *[]){"batch", NULL}) == FM_OK);
    add(g, "relu", "x", NULL, "a");
    add(g, "neg", "a", NULL, "b");
    add(g, "exp", "b", NULL, "c");
    add(g, "tanh", "c", NULL, "d");
    add(g, "neg", "d", NULL, "y");
    CHECK(fm_graph_add_output(g, "y") == FM_OK && fm_graph_validate(g) == FM_OK);
    fm_tensor *x = randn(2, (int64_t[]){16, 4096}, 1);
    fm_tensor *ref = run1(g, x, true);
    fm_memory_stats s0, s1, s2;
    fm_memory_stats_get(FM_CPU, &s0);
    fm_tensor *y1 = run1(g, x, false); /* first sighting of batch 16: no plan yet */
    fm_memory_stats_get(FM_CPU, &s1);
    fm_memory_reset_peak(FM_CPU);
    fm_memory_stats_get(FM_CPU, &s1);
    size_t base = s1.allocated;
    fm_tensor *y2 = run1(g, x, false); /* planned */
    fm_memory_stats_get(FM_CPU, &s2);
    uint64_t first = s1.n_allocs - s0.n_allocs, second = s2.n_allocs - s1.n_allocs;
    CHECK_MSG(t_same_bits(ref, y1) && t_same_bits(ref, y2), "chain: the outputs differ with the arena");
    /* first: 4 intermediates + the output; second: the block + the output */
    CHECK_MSG(first >= 5 && second == 2, "chain: %llu allocations in the first run, %llu in the planned one (5 and 2 expected)",
              (unsigned long long)first, (unsigned long long)second);
    fm_memory_plan plan;
    CHECK(fm_graph_plan_memory(g, 16, &plan) == FM_OK);
    const size_t out_bytes = 16 * 4096 * 4, peak = s2.allocated_peak - base;
    /* the block: two of the four intermediates at a time; the output on its own */
    CHECK_MSG(plan.run_arena_bytes == 2 * out_bytes && plan.output_bytes == out_bytes, "chain: plan: block %zu, outputs %zu",
              plan.run_arena_bytes, plan.output_bytes);
    CHECK_MSG(peak == plan.run_arena_bytes + plan.output_bytes, "chain: peak %zu, not the plan's block %zu + outputs %zu", peak,
              plan.run_arena_bytes, plan.output_bytes);
    CHECK_MSG(s2.allocated - base == out_bytes, "chain: %zu bytes still allocated after the run (the output's %zu expected)",
              s2.allocated - base, out_bytes);
    /* another batch size runs without a plan first, and right */
    fm_tensor *x3 = randn(2, (int64_t[]){3, 4096}, 2), *r3 = run1(g, x3, true), *y3 = run1(g, x3, false), *z3 = run1(g, x3, false);
    CHECK(t_same_bits(r3, y3) && t_same_bits(r3, z3));
    fm_tensor_release_n(8, x, ref, y1, y2, x3, r3, y3, z3);
    fm_graph_free(g);
}

/* A view keeps a value alive past its last reader in the plan: v = reshape(relu(x)) is
 * read at the end, while neg, exp and tanh of x run in between (the plan may put them
 * where relu's output was). And an output that is a view of an intermediate. */
static void test_views(void) {
    fm_graph *g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 2048}, (const char *[]){"batch", NULL}) == FM_OK);
    fm_graph_attr flat = fm_graph_attr_ints("shape", 1, (int64_t[]){-1});
    fm_graph_attr back = fm_graph_attr_ints("shape", 2, (int64_t[]){-1, 2048});
    add(g, "relu", "x", NULL, "a");
    CHECK(fm_graph_add_node(g, "reshape", NULL, 1, (const char *[]){"a"}, 1, (const char *[]){"v"}, 1, &flat) == FM_OK);
    add(g, "neg", "x", NULL, "b");
    add(g, "exp", "b", NULL, "c");
    add(g, "tanh", "c", NULL, "d");
    CHECK(fm_graph_add_node(g, "reshape", NULL, 1, (const char *[]){"v"}, 1, (const char *[]){"v2"}, 1, &back) == FM_OK);
    add(g, "add", "v2", "d", "y");
    add(g, "sigmoid", "y", NULL, "s");
    CHECK(fm_graph_add_node(g, "reshape", NULL, 1, (const char *[]){"s"}, 1, (const char *[]){"sv"}, 1, &flat) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK && fm_graph_add_output(g, "sv") == FM_OK && fm_graph_validate(g) == FM_OK);
    fm_tensor *x = randn(2, (int64_t[]){8, 2048}, 3), *x2 = randn(2, (int64_t[]){8, 2048}, 4);
    fm_tensor *in[1] = {x}, *ref[2] = {0}, *out[2] = {0}, *out2[2] = {0};
    fm_graph_run_options off = {.no_arena = true};
    CHECK(fm_graph_run_ex(g, in, ref, &off) == FM_OK);
    fm_memory_stats s0, s1;
    for (int r = 0; r < 2; r++) { /* the second run is planned */
        for (int k = 0; k < 2; k++) fm_tensor_release(out[k]);
        fm_memory_stats_get(FM_CPU, &s0);
        CHECK(fm_graph_run(g, in, out) == FM_OK);
        fm_memory_stats_get(FM_CPU, &s1);
    }
    /* the view output sv was copied out: the run's block went back when it ended */
    CHECK_MSG(s1.allocated - s0.allocated == 2 * 8 * 2048 * 4, "views: %zu bytes held after the run (the two outputs' %d expected)",
              s1.allocated - s0.allocated, 2 * 8 * 2048 * 4);
    CHECK_MSG(t_same_bits(ref[0], out[0]) && t_same_bits(ref[1], out[1]), "views: the outputs differ with the arena");
    bool exact = true; /* y = relu(x) + tanh(exp(-x)), as the ops compute it */
    for (int64_t i = 0; i < 8 * 2048 && exact; i++) {
        float xi = (float)fm_tensor_get(x, i), e = expf(-xi);
        exact = (float)fm_tensor_get(out[0], i) == (xi > 0 ? xi : 0) + tanhf(e) || fabs(fm_tensor_get(out[0], i) - ((xi > 0 ? xi : 0) + tanhf(e))) < 1e-6;
    }
    CHECK_MSG(exact, "views: y is not relu(x) + tanh(exp(-x))");
    in[0] = x2; /* reuses the memory the first runs' arenas had */
    CHECK(fm_graph_run(g, in, out2) == FM_OK);
    CHECK_MSG(t_same_bits(ref[1], out[1]), "views: an earlier output changed when the graph ran again");
    CHECK(!t_same_bits(out[1], out2[1]));
    for (int k = 0; k < 2; k++) fm_tensor_release_n(3, ref[k], out[k], out2[k]);
    fm_tensor_release_n(2, x, x2);
    fm_graph_free(g);
}

typedef struct { const fm_graph *g; fm_tensor *x, *y; } job;

static void *run_job(void *p) {
    job *j = p;
    for (int r = 0; r < 20; r++) {
        fm_tensor_release(j->y);
        j->y = NULL;
        if (fm_graph_run(j->g, &j->x, &j->y) != FM_OK) break;
    }
    return NULL;
}

/* A small CNN, compiled: conv, batch norm, ReLU, pool, linear; two threads at once. */
static void test_cnn_threads(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(4, (int64_t[]){8, 3, 3, 3}, 5), *lw = randn(2, (int64_t[]){10, 8 * 8 * 8}, 6), *bn[4];
    for (int k = 0; k < 4; k++) bn[k] = randn(1, (int64_t[]){8}, 7 + k);
    fm_tensor *var = fm_abs(bn[3]);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 4, (int64_t[]){-1, 3, 16, 16}, (const char *[]){"batch", NULL, NULL, NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK && fm_graph_add_const(g, "lw", lw) == FM_OK && fm_graph_add_const(g, "g", bn[0]) == FM_OK);
    CHECK(fm_graph_add_const(g, "b", bn[1]) == FM_OK && fm_graph_add_const(g, "m", bn[2]) == FM_OK && fm_graph_add_const(g, "v", var) == FM_OK);
    fm_graph_attr pad = fm_graph_attr_ints("padding", 2, (int64_t[]){1, 1}), k2 = fm_graph_attr_ints("kernel", 2, (int64_t[]){2, 2});
    fm_graph_attr flat = fm_graph_attr_ints("shape", 2, (int64_t[]){0, -1});
    CHECK(fm_graph_add_node(g, "conv2d", NULL, 2, (const char *[]){"x", "w"}, 1, (const char *[]){"c"}, 1, &pad) == FM_OK);
    CHECK(fm_graph_add_node(g, "batch_norm", NULL, 5, (const char *[]){"c", "g", "b", "m", "v"}, 1, (const char *[]){"n"}, 0, NULL) == FM_OK);
    add(g, "relu", "n", NULL, "r");
    CHECK(fm_graph_add_node(g, "max_pool2d", NULL, 1, (const char *[]){"r"}, 1, (const char *[]){"p"}, 1, &k2) == FM_OK);
    CHECK(fm_graph_add_node(g, "reshape", NULL, 1, (const char *[]){"p"}, 1, (const char *[]){"f"}, 1, &flat) == FM_OK);
    add(g, "linear", "f", "lw", "y");
    CHECK(fm_graph_add_output(g, "y") == FM_OK && fm_graph_set_dim_hint(g, "batch", 4) == FM_OK && fm_graph_validate(g) == FM_OK);
    fm_compile_report rep;
    fm_graph *cg = fm_graph_compile(g, &rep);
    CHECK_MSG(cg, "compile: %s", fm_last_error());
    const fm_graph *gs[2] = {g, cg};
    for (int k = 0; k < 2 && cg; k++) {
        fm_tensor *x = randn(4, (int64_t[]){5, 3, 16, 16}, 20 + (uint64_t)k), *ref = run1(gs[k], x, true);
        job j[2] = {{gs[k], x, NULL}, {gs[k], x, NULL}};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, run_job, &j[1]) == 0);
        run_job(&j[0]);
        pthread_join(t, NULL);
        CHECK_MSG(t_same_bits(ref, j[0].y) && t_same_bits(ref, j[1].y), "%s CNN: two threads' outputs differ from one run without the arena",
                  k ? "compiled" : "traced");
        fm_tensor_release_n(4, x, ref, j[0].y, j[1].y);
    }
    fm_graph_free(cg);
    fm_graph_free(g);
    fm_tensor_release_n(7, w, lw, var, bn[0], bn[1], bn[2], bn[3]);
}

/* A GPT graph, traced and compiled: a prompt's logits at its first run (no plan yet) and
 * at three planned runs. */
static void test_gpt(void) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.ffn_hidden = 128, c.block_size = 32, c.vocab_size = 40, c.dropout = 0;
    fm_rng r;
    fm_rng_init(&r, 31);
    fm_gpt *m = fm_gpt_new(&c, &r);
    fm_graph *g = m ? fm_graph_from_gpt(m) : NULL;
    fm_compile_report rep;
    fm_graph *cg = g ? fm_graph_compile(g, &rep) : NULL;
    CHECK_MSG(cg, "gpt graph: %s", fm_last_error());
    fm_tensor *tok = fm_tensor_zeros(2, (int64_t[]){2, 12}, FM_I64, FM_CPU);
    for (int64_t i = 0; i < 24; i++) fm_tensor_set(tok, i, (double)((i * 7) % 40));
    for (int k = 0; k < 2 && cg; k++) {
        const fm_graph *gg = k ? cg : g;
        fm_tensor *ref = fm_graph_gpt_forward(gg, tok); /* the shape's first run: no plan yet */
        for (int rep_i = 0; rep_i < 3 && ref; rep_i++) {
            fm_tensor *y = fm_graph_gpt_forward(gg, tok);
            CHECK_MSG(t_same_bits(ref, y), "%s GPT graph: run %d's logits differ", k ? "compiled" : "traced", rep_i);
            fm_tensor_release(y);
        }
        fm_tensor_release(ref);
    }
    fm_tensor_release(tok);
    fm_graph_free(cg);
    fm_graph_free(g);
    fm_gpt_free(m);
}

int main(void) {
    unsetenv("FATHOM_GRAPH_ARENA"); /* the counts above are the default's: plan at the second run */
    test_chain();
    test_views();
    test_cnn_threads();
    test_gpt();
    TEST_DONE();
}
