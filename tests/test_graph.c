/* The inference graph (fathom/graph.h): building, checking, running against
 * the same ops called directly, saving and loading, dynamic dims, and the
 * refusals (bad graphs, bad files, bad inputs) with their messages. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fathom/fathom.h"
#include "fathom/graph.h"
#include "fathom/gpt.h"
#include "fathom/io.h"
#include "fathom/nn.h"
#include "fathom/quant.h"
#include "fuzz/graph_weights.h"
#include "graph/graph_internal.h" /* a rewritten node's attributes */
#include "test_util.h"

static char g_tmp[256];

static fm_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(ndim, shape, FM_F32, &r);
}

static double max_abs_diff(const fm_tensor *a, const fm_tensor *b) {
    if (!a || !b || a->ndim != b->ndim || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim)) return 1e30;
    double m = 0;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) {
        double d = fabs(fm_tensor_get(a, i) - fm_tensor_get(b, i));
        if (d > m || d != d) m = d != d ? 1e30 : d;
    }
    return m;
}

/* x [batch, 8] -> linear(8->16) -> gelu -> linear(16->4) -> softmax */
static fm_graph *mlp_graph(fm_tensor **w1, fm_tensor **b1, fm_tensor **w2) {
    *w1 = randn(2, (int64_t[]){16, 8}, 1);
    *b1 = randn(1, (int64_t[]){16}, 2);
    *w2 = randn(2, (int64_t[]){4, 16}, 3);
    fm_graph *g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 8}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "fc1.weight", *w1) == FM_OK);
    CHECK(fm_graph_add_const(g, "fc1.bias", *b1) == FM_OK);
    CHECK(fm_graph_add_const(g, "fc2.weight", *w2) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", "fc1", 3, (const char *[]){"x", "fc1.weight", "fc1.bias"}, 1, (const char *[]){"h"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "gelu", NULL, 1, (const char *[]){"h"}, 1, (const char *[]){"a"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", "fc2", 3, (const char *[]){"a", "fc2.weight", ""}, 1, (const char *[]){"logits"}, 0, NULL) == FM_OK);
    fm_graph_attr ax = fm_graph_attr_int("axis", -1);
    CHECK(fm_graph_add_node(g, "softmax", NULL, 1, (const char *[]){"logits"}, 1, (const char *[]){"probs"}, 1, &ax) == FM_OK);
    CHECK(fm_graph_add_output(g, "probs") == FM_OK);
    CHECK(fm_graph_add_output(g, "logits") == FM_OK);
    return g;
}

static fm_tensor *mlp_eager(fm_tensor *x, fm_tensor *w1, fm_tensor *b1, fm_tensor *w2) {
    fm_tensor *h = fm_linear(x, w1, b1), *a = fm_gelu(h), *l = fm_linear(a, w2, NULL), *p = fm_softmax(l, -1);
    fm_tensor_release_n(3, h, a, l);
    return p;
}

static void test_mlp_build_run_save_load(void) {
    fm_tensor *w1, *b1, *w2;
    fm_graph *g = mlp_graph(&w1, &b1, &w2);
    CHECK(fm_graph_validate(g) == FM_OK);
    fm_graph_io io;
    CHECK(fm_graph_input_info(g, 0, &io) == FM_OK && io.shape[0] == FM_DIM_DYNAMIC && io.shape[1] == 8 && !strcmp(io.dim_names[0], "batch"));
    CHECK(fm_graph_output_info(g, 0, &io) == FM_OK && io.ndim == 2 && io.shape[0] == FM_DIM_DYNAMIC && io.shape[1] == 4);
    CHECK(io.dim_names[0] && !strcmp(io.dim_names[0], "batch"));
    char dir[300];
    snprintf(dir, sizeof dir, "%s/mlp", g_tmp);
    CHECK(fm_graph_save(g, dir) == FM_OK);
    fm_graph *g2 = fm_graph_load(dir);
    CHECK_MSG(g2 != NULL, "%s", fm_last_error());
    for (int64_t batch = 1; batch <= 5 && g2; batch += 4) { /* the batch size is dynamic */
        fm_tensor *x = randn(2, (int64_t[]){batch, 8}, 10 + (uint64_t)batch), *out[2] = {0}, *out2[2] = {0};
        fm_tensor *ref = mlp_eager(x, w1, b1, w2);
        CHECK(fm_graph_run(g, &x, out) == FM_OK);
        CHECK(fm_graph_run(g2, &x, out2) == FM_OK);
        CHECK(max_abs_diff(out[0], ref) == 0); /* the same ops in the same order: bitwise */
        CHECK(max_abs_diff(out2[0], ref) == 0);
        CHECK(out[1] && out[1]->shape[0] == batch && out[1]->shape[1] == 4);
        fm_tensor *only = NULL;
        CHECK(fm_graph_run_named(g2, 1, (const char *[]){"x"}, &x, 1, (const char *[]){"logits"}, &only) == FM_OK);
        CHECK(max_abs_diff(only, out2[1]) == 0);
        fm_tensor_release_n(7, x, ref, out[0], out[1], out2[0], out2[1], only);
    }
    /* saving over an existing graph directory replaces it; over anything else is refused */
    CHECK(fm_graph_save(g2, dir) == FM_OK);
    char other[300];
    snprintf(other, sizeof other, "%s/notgraph", g_tmp);
    mkdir(other, 0755);
    char f[340];
    snprintf(f, sizeof f, "%s/model.safetensors", other);
    FILE *fp = fopen(f, "w");
    if (fp) { fputs("x", fp); fclose(fp); }
    CHECK(fm_graph_save(g2, other) != FM_OK);
    CHECK_ERR_CONTAINS("not a graph directory");
    CHECK(fm_graph_load(other) == NULL);
    CHECK_ERR_CONTAINS("trained model");
    fm_graph_free(g);
    fm_graph_free(g2);
    fm_tensor_release_n(3, w1, b1, w2);
}

static void test_bad_inputs_at_run(void) {
    fm_tensor *w1, *b1, *w2;
    fm_graph *g = mlp_graph(&w1, &b1, &w2);
    CHECK(fm_graph_validate(g) == FM_OK);
    fm_tensor *x = randn(2, (int64_t[]){3, 7}, 4), *out[2] = {0};
    CHECK(fm_graph_run(g, &x, out) != FM_OK && !out[0]);
    CHECK_ERR_CONTAINS("input 'x' has shape [3, 7]");
    fm_tensor *xi = fm_tensor_zeros(2, (int64_t[]){3, 8}, FM_I64, FM_CPU);
    CHECK(fm_graph_run(g, &xi, out) != FM_OK);
    CHECK_ERR_CONTAINS("must be f32, got i64");
    fm_tensor *y = NULL;
    CHECK(fm_graph_run_named(g, 1, (const char *[]){"nope"}, &x, 1, (const char *[]){"probs"}, &y) != FM_OK);
    CHECK_ERR_CONTAINS("no input named 'nope'");
    fm_tensor_release_n(5, x, xi, w1, b1, w2);
    fm_graph_free(g);
}

static void test_bad_graphs(void) {
    fm_graph *g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 8}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_node(g, "frobnicate", NULL, 1, (const char *[]){"x"}, 1, (const char *[]){"y"}, 0, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("unknown op 'frobnicate'");
    CHECK(fm_graph_add_node(g, "relu", NULL, 1, (const char *[]){"q"}, 1, (const char *[]){"y"}, 0, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("reads 'q'");
    CHECK(fm_graph_add_node(g, "relu", NULL, 1, (const char *[]){"x"}, 1, (const char *[]){"x"}, 0, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("defined twice");
    fm_graph_free(g);

    /* a shape error is found at validation and names the node */
    g = fm_graph_new();
    fm_tensor *w = randn(2, (int64_t[]){4, 9}, 1);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 8}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", "fc", 2, (const char *[]){"x", "w"}, 1, (const char *[]){"y"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK);
    CHECK(fm_graph_validate(g) != FM_OK);
    CHECK_ERR_CONTAINS("node 'fc' (linear): input [2, 8] does not match weight [4, 9]");
    fm_tensor *x = randn(2, (int64_t[]){2, 8}, 2), *y = NULL;
    CHECK(fm_graph_run(g, &x, &y) != FM_OK); /* never runs unchecked */
    fm_graph_free(g);

    /* an unknown attribute, and a reshape that only works at one batch size */
    g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 8}, (const char *[]){"batch", NULL}) == FM_OK);
    fm_graph_attr bad = fm_graph_attr_int("axes", 1);
    CHECK(fm_graph_add_node(g, "softmax", "sm", 1, (const char *[]){"x"}, 1, (const char *[]){"y"}, 1, &bad) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK);
    CHECK(fm_graph_validate(g) != FM_OK);
    CHECK_ERR_CONTAINS("unknown attribute 'axes'");
    fm_graph_free(g);
    g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 8}, (const char *[]){"batch", NULL}) == FM_OK);
    fm_graph_attr fixed = fm_graph_attr_ints("shape", 2, (int64_t[]){4, 4});
    CHECK(fm_graph_add_node(g, "reshape", "r", 1, (const char *[]){"x"}, 1, (const char *[]){"y"}, 1, &fixed) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK);
    CHECK(fm_graph_validate(g) != FM_OK); /* fits batch 2 (the probe) but not batch 3 */
    CHECK_ERR_CONTAINS("node 'r' (reshape)");
    fm_graph_free(g);
    fm_tensor_release_n(2, w, x);
}

/* x [batch, seq, 6] -> reshape to [batch*seq, 6] (a dim expression) -> layer_norm
 * -> reshape back to [batch, seq, 2, 3] -> permute -> sum over the last axis. */
static void test_dim_expressions(void) {
    fm_graph *g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 3, (int64_t[]){-1, -1, 6}, (const char *[]){"batch", "seq", NULL}) == FM_OK);
    fm_graph_attr a1 = {.name = "shape", .type = FM_ATTR_INTS, .n = 2, .ints = (int64_t[]){0, 6}, .dims = (const char *[]){"batch*seq", NULL}};
    CHECK(fm_graph_add_node(g, "reshape", NULL, 1, (const char *[]){"x"}, 1, (const char *[]){"x2"}, 1, &a1) == FM_OK);
    CHECK(fm_graph_add_node(g, "layer_norm", NULL, 1, (const char *[]){"x2"}, 1, (const char *[]){"n"}, 0, NULL) == FM_OK);
    fm_graph_attr a2 = {.name = "shape", .type = FM_ATTR_INTS, .n = 4, .ints = (int64_t[]){0, 0, 2, 3}, .dims = (const char *[]){"batch", "seq", NULL, NULL}};
    CHECK(fm_graph_add_node(g, "reshape", NULL, 1, (const char *[]){"n"}, 1, (const char *[]){"n4"}, 1, &a2) == FM_OK);
    fm_graph_attr p = fm_graph_attr_ints("perm", 4, (int64_t[]){0, 2, 1, 3});
    CHECK(fm_graph_add_node(g, "permute", NULL, 1, (const char *[]){"n4"}, 1, (const char *[]){"t"}, 1, &p) == FM_OK);
    fm_graph_attr s[2] = {fm_graph_attr_ints("axes", 1, (int64_t[]){-1}), fm_graph_attr_int("keepdim", 0)};
    CHECK(fm_graph_add_node(g, "sum", NULL, 1, (const char *[]){"t"}, 1, (const char *[]){"y"}, 2, s) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK);
    CHECK(fm_graph_set_dim_hint(g, "seq", 4) == FM_OK);
    CHECK_MSG(fm_graph_validate(g) == FM_OK, "%s", fm_last_error());
    fm_graph_io io;
    CHECK(fm_graph_output_info(g, 0, &io) == FM_OK && io.ndim == 3 && io.shape[0] == -1 && io.shape[1] == 2 && io.shape[2] == -1);
    CHECK(io.dim_names[2] && !strcmp(io.dim_names[2], "seq"));
    char dir[300];
    snprintf(dir, sizeof dir, "%s/expr", g_tmp);
    CHECK(fm_graph_save(g, dir) == FM_OK);
    fm_graph *g2 = fm_graph_load(dir);
    CHECK_MSG(g2 != NULL, "%s", fm_last_error());
    fm_tensor *x = randn(3, (int64_t[]){3, 5, 6}, 7), *y = NULL;
    CHECK(g2 && fm_graph_run(g2, &x, &y) == FM_OK);
    fm_tensor *x2 = fm_reshape(x, 2, (int64_t[]){15, 6}), *n = fm_layer_norm(x2, 1, NULL, NULL, 1e-5);
    fm_tensor *n4 = fm_reshape(n, 4, (int64_t[]){3, 5, 2, 3}), *t = fm_permute(n4, (int[]){0, 2, 1, 3});
    fm_tensor *ref = fm_sum(t, 1, (int[]){-1}, false);
    CHECK(max_abs_diff(y, ref) == 0);
    fm_tensor_release_n(7, x, y, x2, n, n4, t, ref);
    /* an expression over a name no input declares is refused */
    fm_graph *g3 = fm_graph_new();
    CHECK(fm_graph_add_input(g3, "x", FM_F32, 2, (int64_t[]){-1, 6}, (const char *[]){"batch", NULL}) == FM_OK);
    fm_graph_attr a3 = {.name = "shape", .type = FM_ATTR_INTS, .n = 1, .ints = (int64_t[]){0}, .dims = (const char *[]){"batch*tokens"}};
    CHECK(fm_graph_add_node(g3, "reshape", NULL, 1, (const char *[]){"x"}, 1, (const char *[]){"y"}, 1, &a3) == FM_OK);
    CHECK(fm_graph_add_output(g3, "y") == FM_OK);
    CHECK(fm_graph_validate(g3) != FM_OK);
    CHECK_ERR_CONTAINS("'tokens' is not a dynamic dim");
    fm_graph_free(g);
    fm_graph_free(g2);
    fm_graph_free(g3);
}

/* conv2d -> batch_norm -> relu -> max_pool2d -> flatten -> linear, batch dynamic */
static void test_cnn(void) {
    fm_tensor *cw = randn(4, (int64_t[]){4, 1, 3, 3}, 1), *cb = randn(1, (int64_t[]){4}, 2);
    fm_tensor *g1 = randn(1, (int64_t[]){4}, 3), *b1 = randn(1, (int64_t[]){4}, 4), *m = randn(1, (int64_t[]){4}, 5);
    fm_tensor *v = fm_tensor_full(1, (int64_t[]){4}, 0.7, FM_F32, FM_CPU), *lw = randn(2, (int64_t[]){3, 4 * 4 * 4}, 6);
    fm_graph *g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "img", FM_F32, 4, (int64_t[]){-1, 1, 8, 8}, (const char *[]){"batch", NULL, NULL, NULL}) == FM_OK);
    const char *names[] = {"cw", "cb", "g", "b", "m", "v", "lw"};
    fm_tensor *ts[] = {cw, cb, g1, b1, m, v, lw};
    for (int i = 0; i < 7; i++) CHECK(fm_graph_add_const(g, names[i], ts[i]) == FM_OK);
    fm_graph_attr ca = fm_graph_attr_ints("padding", 2, (int64_t[]){1, 1});
    CHECK(fm_graph_add_node(g, "conv2d", NULL, 3, (const char *[]){"img", "cw", "cb"}, 1, (const char *[]){"c"}, 1, &ca) == FM_OK);
    fm_graph_attr be = fm_graph_attr_float("eps", 1e-5);
    CHECK(fm_graph_add_node(g, "batch_norm", NULL, 5, (const char *[]){"c", "g", "b", "m", "v"}, 1, (const char *[]){"bn"}, 1, &be) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", NULL, 1, (const char *[]){"bn"}, 1, (const char *[]){"r"}, 0, NULL) == FM_OK);
    fm_graph_attr pk = fm_graph_attr_ints("kernel", 1, (int64_t[]){2});
    CHECK(fm_graph_add_node(g, "max_pool2d", NULL, 1, (const char *[]){"r"}, 1, (const char *[]){"p"}, 1, &pk) == FM_OK);
    fm_graph_attr fs = fm_graph_attr_int("start", 1);
    CHECK(fm_graph_add_node(g, "flatten", NULL, 1, (const char *[]){"p"}, 1, (const char *[]){"f"}, 1, &fs) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", NULL, 2, (const char *[]){"f", "lw"}, 1, (const char *[]){"y"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK);
    CHECK_MSG(fm_graph_validate(g) == FM_OK, "%s", fm_last_error());
    fm_tensor *x = randn(4, (int64_t[]){3, 1, 8, 8}, 9), *y = NULL;
    CHECK(fm_graph_run(g, &x, &y) == FM_OK);
    fm_conv2d_params cp = fm_conv2d_default_params();
    cp.padding[0] = cp.padding[1] = 1;
    fm_pool2d_params pp = {.kernel = {2, 2}, .stride = {2, 2}, .count_include_pad = true, .layout = FM_NCHW};
    fm_tensor *c = fm_conv2d(x, cw, cb, &cp), *bn = fm_batch_norm(c, g1, b1, m, v, false, 0.1, 1e-5, FM_NCHW), *r = fm_relu(bn);
    fm_tensor *p = fm_max_pool2d(r, &pp), *f = fm_flatten(p, 1, -1), *ref = fm_linear(f, lw, NULL);
    CHECK(max_abs_diff(y, ref) == 0);
    fm_tensor_release_n(8, x, y, c, bn, r, p, f, ref);
    for (int i = 0; i < 7; i++) fm_tensor_release(ts[i]);
    fm_graph_free(g);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

/* A saved graph.json edited by hand: each corruption is refused with its reason. */
static void test_corrupt_files(void) {
    fm_tensor *w1, *b1, *w2;
    fm_graph *g = mlp_graph(&w1, &b1, &w2);
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/corrupt", g_tmp);
    CHECK(fm_graph_save(g, dir) == FM_OK);
    snprintf(path, sizeof path, "%s/graph.json", dir);
    FILE *f = fopen(path, "r");
    static char orig[1 << 16];
    size_t n = f ? fread(orig, 1, sizeof orig - 1, f) : 0;
    if (f) fclose(f);
    orig[n] = 0;
    struct { const char *from, *to, *needle; } cases[] = {
        {"\"op\": \"gelu\"", "\"op\": \"gelu2\"", "unknown op 'gelu2'"},
        {"\"fathom-graph\"", "\"other\"", "expected 'fathom-graph'"},
        {"\"a\"", "\"zz\"", "reads 'a'"},
        {"\"axis\": -1", "\"axis\": 7", "axis 7 is out of range"},
        {"\"axis\": -1", "\"axis\": \"x\"", "'axis' must be an integer"},
        {"\"fc2.weight\", \"dtype\": \"f32\"", "\"fc2.weight\", \"dtype\": \"f16\"", "declares f16"},
        {"\"shape\": [\"batch\", 16]", "\"shape\": [\"batch\", 17]", "declares f32 [\"batch\", 17]"},
        {"\"nodes\"", "\"nodez\"", "'nodes' must be an array"},
        {"{", "[", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *p = strstr(orig, cases[i].from);
        CHECK_MSG(p != NULL, "case %zu: '%s' not in graph.json", i, cases[i].from);
        if (!p) continue;
        static char mod[1 << 16];
        snprintf(mod, sizeof mod, "%.*s%s%s", (int)(p - orig), orig, cases[i].to, p + strlen(cases[i].from));
        write_text(path, mod);
        fm_graph *bad = fm_graph_load(dir);
        CHECK_MSG(bad == NULL, "case %zu loaded", i);
        CHECK_ERR_CONTAINS(cases[i].needle);
        fm_graph_free(bad);
    }
    write_text(path, orig);
    fm_graph *ok = fm_graph_load(dir);
    CHECK_MSG(ok != NULL, "%s", fm_last_error());
    fm_graph_free(ok);
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    unlink(path);
    CHECK(fm_graph_load(dir) == NULL);
    CHECK_ERR_CONTAINS("weights.safetensors");
    fm_graph_free(g);
    fm_tensor_release_n(3, w1, b1, w2);
}

/* The fuzzer's seed graphs (tests/data/graph) load and run with its fixed weights. */
static void test_seed_files(void) {
    const char *seeds[] = {"mlp.json", "seq.json", "quant.json", "fused.json", "quant8.json", "pad.json"};
    char dir[300], path[400], cmd[800];
    snprintf(dir, sizeof dir, "%s/seed", g_tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    CHECK(graph_weights_save(path) == FM_OK); /* the fuzzer's */
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        snprintf(cmd, sizeof cmd, "cp tests/data/graph/%s %s/graph.json", seeds[i], dir);
        CHECK(system(cmd) == 0);
        fm_graph *g = fm_graph_load(dir);
        CHECK_MSG(g != NULL, "%s: %s", seeds[i], fm_last_error());
        if (!g) continue;
        fm_tensor *in[8] = {0}, *out[8] = {0};
        CHECK(fm_graph_num_inputs(g) <= 8 && fm_graph_num_outputs(g) <= 8);
        for (int k = 0; k < fm_graph_num_inputs(g) && k < 8; k++) {
            fm_graph_io io;
            int64_t sh[FM_MAX_DIMS];
            CHECK(fm_graph_input_info(g, k, &io) == FM_OK);
            for (int d = 0; d < io.ndim; d++) sh[d] = io.shape[d] < 0 ? 3 + d : io.shape[d];
            in[k] = randn(io.ndim, sh, 5 + (uint64_t)k);
        }
        CHECK_MSG(fm_graph_run(g, in, out) == FM_OK, "%s: %s", seeds[i], fm_last_error());
        for (int k = 0; k < 8; k++) fm_tensor_release_n(2, in[k], out[k]);
        fm_graph_free(g);
    }
}

/* A recipe-style model traced layer by layer; the graph runs at any batch size
 * and gives the module's output exactly. */
static void test_trace_module(void) {
    fm_manual_seed(3);
    fm_module *m = fm_sequential(0);
    fm_sequential_add(m, fm_nn_conv2d(1, 4, 3, 1, 1, true, NULL));
    fm_sequential_add(m, fm_nn_batchnorm2d(4, 1e-5, 0.1));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
    fm_sequential_add(m, fm_nn_maxpool2d(2, 2, 0));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_FLATTEN));
    fm_sequential_add(m, fm_nn_dropout(0.5, NULL));
    fm_sequential_add(m, fm_nn_linear(64, 10, true, NULL));
    fm_tensor *ex = randn(4, (int64_t[]){2, 1, 8, 8}, 1);
    fm_graph *g = fm_graph_trace_module(m, ex);
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    if (g) {
        CHECK(fm_graph_num_nodes(g) == 8 && fm_graph_num_consts(g) == 8);
        fm_module_train(m, false);
        fm_tensor *x = randn(4, (int64_t[]){5, 1, 8, 8}, 2), *y = fm_graph_run1(g, x), *ref = fm_module_forward(m, x);
        CHECK(max_abs_diff(y, ref) == 0);
        fm_tensor_release_n(3, x, y, ref);
    }
    fm_graph_free(g);
    fm_tensor_release(ex);
    fm_module_free(m);
}

/* GPT-2 and Llama (grouped-query) graphs: fm_graph_from_gpt checks a prompt and
 * a decode step itself; here greedy generation through the graph (prompt, then
 * one token per step with the cache fed back) gives the model's tokens. */
static void test_gpt_graph(void) {
    for (int arch = 0; arch < 2; arch++) {
        fm_gpt_config c = fm_gpt_config_default(arch ? FM_GPT_LLAMA : FM_GPT_GPT2);
        c.n_layer = 2;
        c.n_head = 4;
        c.n_kv_head = arch ? 2 : 4;
        c.n_embd = 32;
        c.ffn_hidden = arch ? 48 : 128;
        c.block_size = 24;
        c.vocab_size = 50;
        c.dropout = 0;
        fm_rng r;
        fm_rng_init(&r, 7);
        fm_gpt *m = fm_gpt_new(&c, &r);
        CHECK_MSG(m != NULL, "%s", fm_last_error());
        if (!m) continue;
        fm_graph *g = fm_graph_from_gpt(m);
        CHECK_MSG(g != NULL, "arch %d: %s", arch, fm_last_error());
        char dir[300];
        snprintf(dir, sizeof dir, "%s/gpt%d", g_tmp, arch);
        CHECK(g && fm_graph_save(g, dir) == FM_OK);
        fm_graph *g2 = g ? fm_graph_load(dir) : NULL;
        CHECK_MSG(g2 != NULL, "%s", fm_last_error());
        int32_t prompt[3] = {1, 5, 9}, a[12], b[12];
        int na = 0, nb = 0;
        fm_gpt_sample_params sp = {0, 0, 1.0, 0};
        CHECK(fm_gpt_generate(m, prompt, 3, 12, &sp, true, a, &na, NULL, NULL, NULL) == FM_OK);
        CHECK_MSG(g2 && fm_graph_generate(g2, prompt, 3, 12, &sp, b, &nb, NULL, NULL, NULL) == FM_OK, "%s", fm_last_error());
        CHECK(na == 12 && nb == 12 && !memcmp(a, b, sizeof a));
        fm_graph_free(g);
        fm_graph_free(g2);
        fm_gpt_free(m);
    }
}

static int count_op(const fm_graph *g, const char *op) {
    /* graph.json lists the nodes; count them through a save-free path: the ops by name */
    int n = 0;
    for (int i = 0; i < fm_graph_num_nodes(g); i++) n += !strcmp(fm_graph_node_op(g, i), op);
    return n;
}

/* Each pass on its own: the graph after it computes what the graph before it did
 * (exactly for dce/fold/cse, which run the same ops on the same numbers; 1e-5
 * relative for the fusions, which change the rounding), and it did its job. */
/* The by-hand pass tests' common end: g's dim hinted, g validated, the pass run on it and the
 * outputs compared before and after (fm_graph_compare, random inputs at the hints) within tol;
 * the rewritten graph (free it; NULL on failure) and the pass's note. */
static fm_graph *pass_by_hand(fm_graph *g, const char *dim, int64_t hint, const char *pass, double tol, char *note, size_t nn) {
    CHECK(fm_graph_set_dim_hint(g, dim, hint) == FM_OK);
    CHECK_MSG(fm_graph_validate(g) == FM_OK, "%s", fm_last_error());
    fm_graph *p = fm_graph_pass(g, pass, note, nn);
    double d = 1;
    CHECK_MSG(p && fm_graph_compare(g, p, &d) == FM_OK && d <= tol, "%s by hand: diff %g %s", pass, d, fm_last_error());
    return p;
}

/* fuse-conv-act on a built graph: pool then relu (either order fuses), a conv
 * whose output is also a graph output (its relu stays; the conv alone becomes
 * conv2d_fused without ReLU, for the direct kernels), and a strided conv alone (it
 * stays conv2d); compared before/after by fm_graph_compare (random inputs at the
 * dim hints). */
static void test_fuse_conv_act_by_hand(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(4, (int64_t[]){8, 3, 3, 3}, 11), *b = randn(1, (int64_t[]){8}, 12);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 4, (int64_t[]){-1, 3, 9, 10}, (const char *[]){"batch", NULL, NULL, NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK && fm_graph_add_const(g, "b", b) == FM_OK);
    fm_graph_attr pad = fm_graph_attr_int("padding", 1), k2 = fm_graph_attr_ints("kernel", 2, (int64_t[]){2, 2});
    CHECK(fm_graph_add_node(g, "conv2d", "c1", 3, (const char *[]){"x", "w", "b"}, 1, (const char *[]){"h1"}, 1, &pad) == FM_OK);
    CHECK(fm_graph_add_node(g, "max_pool2d", "p1", 1, (const char *[]){"h1"}, 1, (const char *[]){"q1"}, 1, &k2) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", "r1", 1, (const char *[]){"q1"}, 1, (const char *[]){"y1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "conv2d", "c2", 2, (const char *[]){"x", "w"}, 1, (const char *[]){"h2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", "r2", 1, (const char *[]){"h2"}, 1, (const char *[]){"y2"}, 0, NULL) == FM_OK);
    fm_graph_attr s2 = fm_graph_attr_int("stride", 2);
    CHECK(fm_graph_add_node(g, "conv2d", "c3", 2, (const char *[]){"x", "w"}, 1, (const char *[]){"y3"}, 1, &s2) == FM_OK);
    /* ReLU6 (clamp 0..6) fuses as relu 1, max 6; a clamp from 0.25 stays */
    fm_graph_attr r6[2] = {fm_graph_attr_float("min", 0), fm_graph_attr_float("max", 0.75)};
    fm_graph_attr c25[2] = {fm_graph_attr_float("min", 0.25), fm_graph_attr_float("max", 6)};
    CHECK(fm_graph_add_node(g, "conv2d", "c4", 3, (const char *[]){"x", "w", "b"}, 1, (const char *[]){"h4"}, 1, &s2) == FM_OK);
    CHECK(fm_graph_add_node(g, "clamp", "k4", 1, (const char *[]){"h4"}, 1, (const char *[]){"y4"}, 2, r6) == FM_OK);
    CHECK(fm_graph_add_node(g, "conv2d", "c5", 2, (const char *[]){"x", "w"}, 1, (const char *[]){"h5"}, 1, &s2) == FM_OK);
    CHECK(fm_graph_add_node(g, "clamp", "k5", 1, (const char *[]){"h5"}, 1, (const char *[]){"y5"}, 2, c25) == FM_OK);
    CHECK(fm_graph_add_output(g, "y1") == FM_OK && fm_graph_add_output(g, "y2") == FM_OK && fm_graph_add_output(g, "h2") == FM_OK);
    CHECK(fm_graph_add_output(g, "y3") == FM_OK && fm_graph_add_output(g, "y4") == FM_OK && fm_graph_add_output(g, "y5") == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 3, "fuse-conv-act", 1e-5, note, sizeof note);
    CHECK_MSG(p && count_op(p, "conv2d_fused") == 3 && count_op(p, "conv2d") == 2 && count_op(p, "relu") == 1 && count_op(p, "clamp") == 1,
              "fuse-conv-act by hand: %s", note);
    fm_graph_free(p);
    fm_graph_free(g);
    fm_tensor_release_n(2, w, b);
}

/* matmul-to-linear on a built graph: x [batch, 5, 40] @ a constant W [40, 70] then
 * + b [70] (bias first, as ONNX exports it) becomes one linear with W transposed and
 * the bias; a matmul by a constant whose output is read twice becomes a linear
 * without the bias and keeps its add; a matmul of two inputs stays. */
static void test_matmul_to_linear_by_hand(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(2, (int64_t[]){40, 70}, 31), *b = randn(1, (int64_t[]){70}, 32);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 3, (int64_t[]){-1, 5, 40}, (const char *[]){"batch", NULL, NULL}) == FM_OK);
    CHECK(fm_graph_add_input(g, "v", FM_F32, 2, (int64_t[]){40, 70}, NULL) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK && fm_graph_add_const(g, "b", b) == FM_OK);
    CHECK(fm_graph_add_node(g, "matmul", "m1", 2, (const char *[]){"x", "w"}, 1, (const char *[]){"h1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "add", "a1", 2, (const char *[]){"b", "h1"}, 1, (const char *[]){"y1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "matmul", "m2", 2, (const char *[]){"x", "w"}, 1, (const char *[]){"h2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "add", "a2", 2, (const char *[]){"h2", "b"}, 1, (const char *[]){"y2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "matmul", "m3", 2, (const char *[]){"x", "v"}, 1, (const char *[]){"y3"}, 0, NULL) == FM_OK);
    const char *outs[4] = {"y1", "y2", "h2", "y3"};
    for (int i = 0; i < 4; i++) CHECK(fm_graph_add_output(g, outs[i]) == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 3, "matmul-to-linear", 1e-5, note, sizeof note);
    CHECK_MSG(p && count_op(p, "linear") == 2 && count_op(p, "matmul") == 1 && count_op(p, "add") == 1, "matmul-to-linear by hand: %s", note);
    fm_graph_free(p);
    fm_graph_free(g);
    fm_tensor_release_n(2, w, b);
}

/* fuse-silu on a built graph: mul(x, sigmoid(x)) and mul(sigmoid(x), x) become silu;
 * a sigmoid whose output is also read elsewhere (a graph output), and a mul of the
 * sigmoid by another value, stay as they are. Compared before/after. */
static void test_fuse_silu_by_hand(void) {
    fm_graph *g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 37}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_input(g, "z", FM_F32, 2, (int64_t[]){-1, 37}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_node(g, "sigmoid", "s1", 1, (const char *[]){"x"}, 1, (const char *[]){"h1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "mul", "m1", 2, (const char *[]){"x", "h1"}, 1, (const char *[]){"y1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "sigmoid", "s2", 1, (const char *[]){"y1"}, 1, (const char *[]){"h2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "mul", "m2", 2, (const char *[]){"h2", "y1"}, 1, (const char *[]){"y2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "sigmoid", "s3", 1, (const char *[]){"y2"}, 1, (const char *[]){"h3"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "mul", "m3", 2, (const char *[]){"y2", "h3"}, 1, (const char *[]){"y3"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "sigmoid", "s4", 1, (const char *[]){"y3"}, 1, (const char *[]){"h4"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "mul", "m4", 2, (const char *[]){"z", "h4"}, 1, (const char *[]){"y4"}, 0, NULL) == FM_OK);
    const char *outs[3] = {"y3", "h3", "y4"};
    for (int i = 0; i < 3; i++) CHECK(fm_graph_add_output(g, outs[i]) == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 5, "fuse-silu", 1e-6, note, sizeof note);
    CHECK_MSG(p && count_op(p, "silu") == 2 && count_op(p, "sigmoid") == 2 && count_op(p, "mul") == 2, "fuse-silu by hand: %s", note);
    fm_graph_free(p);
    fm_graph_free(g);
}

/* fuse-masked-attention on a built graph: attention written op by op as transformers'
 * exports write it, batch and sequence dynamic. Block 1: q and k^T (a permute [0, 2, 3, 1]
 * of the key projection) each scaled by a constant, their product plus the additive mask
 * where(keep, 0, -inf) [b, 1, 1, s], softmax, the NaN guard where(ne(p, p), 0, p), times v.
 * Block 2: k^T by transpose(2, 3), the scores divided by a constant, no mask, no guard.
 * Both become sdpa_mask (the first with the mask, the second with a zero one); a third
 * block whose scores are also a graph output stays, and so does a fourth whose mask is
 * where(keep, 0, -1e4) (moderate values: not fused). Compared on random inputs at the dim
 * hints, and with the second batch row keeping no key: both graphs give 0 there. */
static void test_fuse_masked_attention_by_hand(void) {
    fm_graph *g = fm_graph_new();
    const char *bs[3] = {"batch", "seq", NULL};
    CHECK(fm_graph_add_input(g, "x", FM_F32, 3, (int64_t[]){-1, -1, 16}, bs) == FM_OK);
    CHECK(fm_graph_add_input(g, "keep", FM_BOOL, 4, (int64_t[]){-1, 1, 1, -1}, (const char *[]){"batch", NULL, NULL, "seq"}) == FM_OK);
    fm_tensor *c1 = fm_tensor_scalar(0.5, FM_F32), *c2 = fm_tensor_scalar(0.7, FM_F32), *z = fm_tensor_scalar(0, FM_F32);
    fm_tensor *ninf = fm_tensor_scalar(-INFINITY, FM_F32), *moderate = fm_tensor_scalar(-1e4, FM_F32);
    CHECK(fm_graph_add_const(g, "c1", c1) == FM_OK && fm_graph_add_const(g, "c2", c2) == FM_OK && fm_graph_add_const(g, "zero", z) == FM_OK);
    CHECK(fm_graph_add_const(g, "ninf", ninf) == FM_OK && fm_graph_add_const(g, "moderate", moderate) == FM_OK);
    fm_graph_attr heads = fm_graph_attr_ints("shape", 4, (int64_t[]){0, 0, 2, 8}), p0213 = fm_graph_attr_ints("perm", 4, (int64_t[]){0, 2, 1, 3});
    fm_graph_attr p0231 = fm_graph_attr_ints("perm", 4, (int64_t[]){0, 2, 3, 1}), sm = fm_graph_attr_int("axis", -1);
    fm_graph_attr tr[2] = {fm_graph_attr_int("dim0", 2), fm_graph_attr_int("dim1", 3)};
    struct { const char *op, *in[3]; int n_in; const char *out; const fm_graph_attr *a; int na; } k_nodes[] = {
        {"reshape", {"x"}, 1, "xh", &heads, 1},           {"permute", {"xh"}, 1, "q", &p0213, 1},
        {"permute", {"xh"}, 1, "kt", &p0231, 1},          {"neg", {"q"}, 1, "v", NULL, 0},
        {"where", {"keep", "zero", "ninf"}, 3, "m", NULL, 0}, {"where", {"keep", "zero", "moderate"}, 3, "m4", NULL, 0},
        {"mul", {"q", "c1"}, 2, "qs", NULL, 0},           {"mul", {"c2", "kt"}, 2, "kts", NULL, 0},
        {"matmul", {"qs", "kts"}, 2, "s", NULL, 0},       {"add", {"s", "m"}, 2, "sm", NULL, 0},
        {"softmax", {"sm"}, 1, "p", &sm, 1},              {"ne", {"p", "p"}, 2, "nan", NULL, 0},
        {"where", {"nan", "zero", "p"}, 3, "pg", NULL, 0}, {"matmul", {"pg", "v"}, 2, "y1", NULL, 0},
        {"transpose", {"v"}, 1, "vt", tr, 2},             {"matmul", {"y1", "vt"}, 2, "s2", NULL, 0},
        {"div", {"s2", "c1"}, 2, "s2d", NULL, 0},         {"softmax", {"s2d"}, 1, "p2", &sm, 1},
        {"matmul", {"p2", "y1"}, 2, "y2", NULL, 0},       {"matmul", {"y2", "kt"}, 2, "s3", NULL, 0},
        {"softmax", {"s3"}, 1, "p3", &sm, 1},             {"matmul", {"p3", "q"}, 2, "y3", NULL, 0},
        {"matmul", {"y3", "kt"}, 2, "s4", NULL, 0},       {"add", {"s4", "m4"}, 2, "s4m", NULL, 0},
        {"softmax", {"s4m"}, 1, "p4", &sm, 1},            {"matmul", {"p4", "v"}, 2, "y4", NULL, 0},
    };
    for (size_t i = 0; i < sizeof k_nodes / sizeof k_nodes[0]; i++)
        CHECK_MSG(fm_graph_add_node(g, k_nodes[i].op, NULL, k_nodes[i].n_in, k_nodes[i].in, 1, &k_nodes[i].out, k_nodes[i].na, k_nodes[i].a) == FM_OK,
                  "%s: %s", k_nodes[i].out, fm_last_error());
    CHECK(fm_graph_add_output(g, "y2") == FM_OK && fm_graph_add_output(g, "y4") == FM_OK && fm_graph_add_output(g, "s3") == FM_OK);
    CHECK(fm_graph_set_dim_hint(g, "seq", 7) == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 2, "fuse-masked-attention", 1e-5, note, sizeof note);
    CHECK_MSG(p && count_op(p, "sdpa_mask") == 2 && count_op(p, "softmax") == 2 && count_op(p, "ne") == 0, "fuse-masked-attention by hand: %s",
              note);
    /* batch 2, seq 70 (two query tiles); the second row's keys all masked */
    fm_tensor *in[2] = {randn(3, (int64_t[]){2, 70, 16}, 61), fm_tensor_zeros(4, (int64_t[]){2, 1, 1, 70}, FM_BOOL, FM_CPU)}, *oa[3] = {0}, *ob[3] = {0};
    for (int64_t j = 0; j < 70; j++) fm_tensor_set(in[1], j, j % 9 != 4);
    CHECK_MSG(p && fm_graph_run(g, in, oa) == FM_OK && fm_graph_run(p, in, ob) == FM_OK, "masked rows: %s", fm_last_error());
    double worst = 0, big = 1e-30, row2 = 0;
    const int64_t half = oa[0] ? fm_tensor_numel(oa[0]) / 2 : 0;
    for (int64_t e = 0; oa[0] && ob[0] && e < fm_tensor_numel(oa[0]); e++) {
        worst = fmax(worst, fabs(fm_tensor_get(oa[0], e) - fm_tensor_get(ob[0], e)));
        big = fmax(big, fabs(fm_tensor_get(oa[0], e)));
        if (e >= half) row2 = fmax(row2, fabs(fm_tensor_get(ob[0], e)));
    }
    CHECK_MSG(oa[0] && worst / big <= 1e-5 && row2 == 0, "fully masked rows: diff %g, the masked batch's largest output %g", worst / big, row2);
    for (int i = 0; i < 3; i++) fm_tensor_release_n(2, oa[i], ob[i]);
    fm_tensor_release_n(7, in[0], in[1], c1, c2, z, ninf, moderate);
    fm_graph_free(p);
    fm_graph_free(g);
}

/* fold-reshape on a built graph: a 1-D conv net as the ONNX import writes it (each conv a 2-D
 * one between reshapes to [N, C, 1, L] and back), with ReLU, a batch norm and tanh between
 * two convs, the batch and the length dynamic: the reshapes move past the three ops and the
 * pair cancels. A reshape to [N, 4L] and back around a ReLU cancels too; a reshape whose 0
 * entry copies a dim that the reshape before it changed is not composed (its output has that
 * reshape's shape: bypassed). Then the memory plan: a node's output is live while it runs
 * (with its inputs): x -> relu -> neg -> exp on [2, 256] f32 peaks at two 2 KiB values. */
static void test_fold_reshape_by_hand(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(4, (int64_t[]){4, 4, 1, 3}, 51), *w2 = randn(4, (int64_t[]){4, 4, 1, 3}, 52), *bn[4];
    for (int k = 0; k < 4; k++) bn[k] = randn(1, (int64_t[]){4}, 53 + k);
    fm_tensor *var = fm_abs(bn[3]);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 3, (int64_t[]){-1, 4, -1}, (const char *[]){"batch", NULL, "len"}) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK && fm_graph_add_const(g, "w2", w2) == FM_OK && fm_graph_add_const(g, "g", bn[0]) == FM_OK);
    CHECK(fm_graph_add_const(g, "b", bn[1]) == FM_OK && fm_graph_add_const(g, "m", bn[2]) == FM_OK && fm_graph_add_const(g, "v", var) == FM_OK);
    fm_graph_attr up = fm_graph_attr_ints("shape", 4, (int64_t[]){0, 0, 1, -1}), down = fm_graph_attr_ints("shape", 3, (int64_t[]){0, 0, -1});
    fm_graph_attr pad = fm_graph_attr_ints("padding", 2, (int64_t[]){0, 1}), flat = fm_graph_attr_ints("shape", 2, (int64_t[]){0, -1});
    fm_graph_attr back = fm_graph_attr_ints("shape", 3, (int64_t[]){0, 4, -1}), pairs = fm_graph_attr_ints("shape", 3, (int64_t[]){0, -1, 2});
    struct { const char *op, *name, *in[5]; int n_in; const char *out; const fm_graph_attr *a; } k_nodes[] = {
        {"reshape", "r1", {"x"}, 1, "x4", &up},        {"conv2d", "c1", {"x4", "w"}, 2, "h4", &pad},
        {"reshape", "r2", {"h4"}, 1, "h", &down},      {"relu", "u1", {"h"}, 1, "a", NULL},
        {"batch_norm", "n1", {"a", "g", "b", "m", "v"}, 5, "bn", NULL}, {"tanh", "t1", {"bn"}, 1, "t", NULL},
        {"reshape", "r3", {"t"}, 1, "t4", &up},        {"conv2d", "c2", {"t4", "w2"}, 2, "y4", &pad},
        {"reshape", "r4", {"y4"}, 1, "y", &down},      {"reshape", "q1", {"x"}, 1, "xf", &flat},
        {"relu", "u2", {"xf"}, 1, "rf", NULL},         {"reshape", "q2", {"rf"}, 1, "rb", &back},
        {"neg", "e2", {"rb"}, 1, "y2", NULL},          {"reshape", "p1", {"x"}, 1, "xp", &pairs},
        {"reshape", "p2", {"xp"}, 1, "xq", &down},     {"neg", "e3", {"xq"}, 1, "y3", NULL},
    };
    for (size_t i = 0; i < sizeof k_nodes / sizeof k_nodes[0]; i++)
        CHECK_MSG(fm_graph_add_node(g, k_nodes[i].op, k_nodes[i].name, k_nodes[i].n_in, k_nodes[i].in, 1, &k_nodes[i].out, k_nodes[i].a ? 1 : 0,
                                    k_nodes[i].a) == FM_OK, "%s: %s", k_nodes[i].name, fm_last_error());
    const char *outs[3] = {"y", "y2", "y3"};
    for (int i = 0; i < 3; i++) CHECK(fm_graph_add_output(g, outs[i]) == FM_OK);
    CHECK(fm_graph_set_dim_hint(g, "len", 12) == FM_OK);
    char note[256] = "", n2[256];
    fm_graph *p = pass_by_hand(g, "batch", 3, "fold-reshape", 1e-6, note, sizeof note);
    fm_graph *q = p ? fm_graph_pass(p, "dce", n2, sizeof n2) : NULL;
    CHECK_MSG(q && count_op(g, "reshape") == 8 && count_op(q, "reshape") == 3 && count_op(q, "batch_norm") == 1 && count_op(q, "relu") == 2,
              "fold-reshape by hand: %d reshapes left (3 expected): %s", q ? count_op(q, "reshape") : -1, note);
    fm_graph_free(q);
    fm_graph_free(p);
    fm_graph_free(g);
    fm_tensor_release_n(7, var, w, w2, bn[0], bn[1], bn[2], bn[3]);

    g = fm_graph_new();
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){2, 256}, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", NULL, 1, (const char *[]){"x"}, 1, (const char *[]){"a"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "neg", NULL, 1, (const char *[]){"a"}, 1, (const char *[]){"b"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "exp", NULL, 1, (const char *[]){"b"}, 1, (const char *[]){"c"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_output(g, "c") == FM_OK && fm_graph_validate(g) == FM_OK);
    fm_memory_plan plan;
    CHECK(fm_graph_plan_memory(g, 0, &plan) == FM_OK);
    CHECK_MSG(plan.live_peak_bytes == 4096 && plan.planned_bytes == 4096 && plan.naive_bytes == 3 * 2048,
              "plan: live peak %zu, arena %zu, all %zu (4096, 4096, 6144 expected)", plan.live_peak_bytes, plan.planned_bytes, plan.naive_bytes);
    fm_graph_free(g);
}

/* fuse-elementwise on a built graph: HardSwish as exported (mul by 1/6, add 0.5, clamp
 * 0..1, mul by x) becomes one ew_chain; a chain whose first value is also a graph output
 * stops there; an add of a [37] constant (broadcast, not a scalar) is no step. */
static void test_fuse_elementwise_by_hand(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *c6 = fm_tensor_full(0, NULL, 1.0 / 6, FM_F32, FM_CPU), *ch = fm_tensor_full(0, NULL, 0.5, FM_F32, FM_CPU);
    fm_tensor *bv = randn(1, (int64_t[]){37}, 41);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 37}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "c6", c6) == FM_OK && fm_graph_add_const(g, "ch", ch) == FM_OK && fm_graph_add_const(g, "bv", bv) == FM_OK);
    fm_graph_attr cl[2] = {fm_graph_attr_float("min", 0), fm_graph_attr_float("max", 1)};
    CHECK(fm_graph_add_node(g, "mul", "m1", 2, (const char *[]){"x", "c6"}, 1, (const char *[]){"h1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "add", "a1", 2, (const char *[]){"ch", "h1"}, 1, (const char *[]){"h2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "clamp", "k1", 1, (const char *[]){"h2"}, 1, (const char *[]){"h3"}, 2, cl) == FM_OK);
    CHECK(fm_graph_add_node(g, "mul", "m2", 2, (const char *[]){"h3", "x"}, 1, (const char *[]){"y1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "sigmoid", "s1", 1, (const char *[]){"x"}, 1, (const char *[]){"s"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "tanh", "t1", 1, (const char *[]){"s"}, 1, (const char *[]){"y2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "add", "a3", 2, (const char *[]){"y2", "bv"}, 1, (const char *[]){"y3"}, 0, NULL) == FM_OK);
    const char *outs[3] = {"y1", "s", "y3"};
    for (int i = 0; i < 3; i++) CHECK(fm_graph_add_output(g, outs[i]) == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 5, "fuse-elementwise", 1e-5, note, sizeof note);
    CHECK_MSG(p && count_op(p, "ew_chain") == 1 && count_op(p, "clamp") == 0 && count_op(p, "mul") == 0 && count_op(p, "sigmoid") == 1 &&
                  count_op(p, "tanh") == 1 && count_op(p, "add") == 1,
              "fuse-elementwise by hand: %s", note);
    fm_graph_free(p);
    fm_graph_free(g);
    fm_tensor_release_n(3, c6, ch, bv);
}

/* fold-pad-conv on a built graph: a zero pad with as much before as after each spatial dim,
 * read only by a conv2d, becomes that conv's padding (1 -> 3 and 2 on H and W); an uneven
 * pad, a pad of 0.5, a reflect pad and a pad that a graph output reads too stay pads. */
static void test_fold_pad_conv_by_hand(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(4, (int64_t[]){4, 3, 3, 3}, 51);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 4, (int64_t[]){-1, 3, 7, 6}, (const char *[]){"batch", NULL, NULL, NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK);
    const int64_t even[8] = {0, 0, 2, 1, 0, 0, 2, 1}, uneven[8] = {0, 0, 0, 1, 0, 0, 1, 1};
    fm_graph_attr pe = fm_graph_attr_ints("pads", 8, even), pu = fm_graph_attr_ints("pads", 8, uneven), p1 = fm_graph_attr_int("padding", 1);
    fm_graph_attr half[2] = {pe, fm_graph_attr_float("value", 0.5)}, refl[2] = {pe, fm_graph_attr_string("mode", "reflect")};
    const struct { const char *name; const fm_graph_attr *a; int na; } pads[5] = {{"e", &pe, 1}, {"u", &pu, 1}, {"h", half, 2}, {"r", refl, 2}, {"o", &pe, 1}};
    for (int k = 0; k < 5; k++) {
        char pn[8], cn[8], po[8], y[8];
        snprintf(pn, sizeof pn, "p%s", pads[k].name), snprintf(cn, sizeof cn, "c%s", pads[k].name);
        snprintf(po, sizeof po, "x%s", pads[k].name), snprintf(y, sizeof y, "y%s", pads[k].name);
        CHECK(fm_graph_add_node(g, "pad", pn, 1, (const char *[]){"x"}, 1, (const char *[]){po}, pads[k].na, pads[k].a) == FM_OK);
        CHECK(fm_graph_add_node(g, "conv2d", cn, 2, (const char *[]){po, "w"}, 1, (const char *[]){y}, 1, &p1) == FM_OK);
        CHECK(fm_graph_add_output(g, y) == FM_OK);
    }
    CHECK(fm_graph_add_output(g, "xo") == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 3, "fold-pad-conv", 1e-5, note, sizeof note);
    CHECK_MSG(p && count_op(p, "pad") == 4 && count_op(p, "conv2d") == 5 && strstr(note, "1 zero pads folded"), "fold-pad-conv by hand: %s", note);
    bool folded = false;
    for (int i = 0; p && i < p->n_nodes; i++)
        if (!strcmp(p->nodes[i].op, "conv2d") && !strcmp(p->nodes[i].name, "ce")) {
            const gattr *a = g_node_attr(&p->nodes[i], "padding");
            folded = a && a->type == FM_ATTR_INTS && a->n == 2 && a->ints[0].v == 3 && a->ints[1].v == 2;
        }
    CHECK_MSG(folded, "fold-pad-conv: conv 'ce' has padding (3, 2)");
    fm_graph_free(p);
    fm_graph_free(g);
    fm_tensor_release(w);
}

/* fuse-linear-act on a built graph: linear + relu fuses (relu = 1); a linear alone
 * with a constant weight becomes linear_fused (relu = 0, packed weights); a linear
 * whose output is also a graph output keeps its relu node; a linear whose weight is
 * a graph input stays linear. Compared before/after with fm_graph_compare at a
 * batch that needs several of the packed kernel's 6-row tiles and a tail panel. */
static void test_fuse_linear_act_by_hand(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w1 = randn(2, (int64_t[]){70, 40}, 21), *b1 = randn(1, (int64_t[]){70}, 22), *w2 = randn(2, (int64_t[]){10, 70}, 23);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 40}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_input(g, "wx", FM_F32, 2, (int64_t[]){70, 40}, NULL) == FM_OK);
    CHECK(fm_graph_add_const(g, "w1", w1) == FM_OK && fm_graph_add_const(g, "b1", b1) == FM_OK && fm_graph_add_const(g, "w2", w2) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", "l1", 3, (const char *[]){"x", "w1", "b1"}, 1, (const char *[]){"h1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", "r1", 1, (const char *[]){"h1"}, 1, (const char *[]){"y1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", "l2", 2, (const char *[]){"y1", "w2"}, 1, (const char *[]){"y2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", "l3", 3, (const char *[]){"x", "w1", "b1"}, 1, (const char *[]){"h3"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", "r3", 1, (const char *[]){"h3"}, 1, (const char *[]){"y3"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", "l4", 3, (const char *[]){"x", "wx", "b1"}, 1, (const char *[]){"y4"}, 0, NULL) == FM_OK);
    const char *outs[4] = {"y2", "y3", "h3", "y4"};
    for (int i = 0; i < 4; i++) CHECK(fm_graph_add_output(g, outs[i]) == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 13, "fuse-linear-act", 1e-5, note, sizeof note);
    CHECK_MSG(p && count_op(p, "linear_fused") == 3 && count_op(p, "linear") == 1 && count_op(p, "relu") == 1, "fuse-linear-act by hand: %s", note);
    fm_graph_free(p);
    fm_graph_free(g);
    fm_tensor_release_n(3, w1, b1, w2);
}

/* fuse-linear-act with the other activations: linear + gelu, + silu (fuse-silu's), +
 * sigmoid, + tanh, + gelu_tanh on a linear without bias each become one linear_fused with
 * act; the result matches the unfused graph. Then the quantizer keeps each activation:
 * int8 (dynamic) takes the GELUs into its epilogue and puts silu, sigmoid and tanh after
 * as nodes; int4 puts every one after as a node; both compute what the unfused graph
 * quantized the same way computes. And the act
 * attribute is checked at load: an unknown name, or act beside relu = 1, is refused. */
/* fuse-bias-gelu on a linear whose weight is a graph input (one with a constant weight is
 * fuse-linear-act's): linear without bias, then bias_gelu_tanh. */
static void test_fuse_bias_gelu_by_hand(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *b = randn(1, (int64_t[]){24}, 71);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 16}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_input(g, "w", FM_F32, 2, (int64_t[]){24, 16}, NULL) == FM_OK && fm_graph_add_const(g, "b", b) == FM_OK);
    CHECK(fm_graph_add_node(g, "linear", NULL, 3, (const char *[]){"x", "w", "b"}, 1, (const char *[]){"h"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "gelu_tanh", NULL, 1, (const char *[]){"h"}, 1, (const char *[]){"y"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 9, "fuse-bias-gelu", 1e-5, note, sizeof note);
    CHECK_MSG(p && count_op(p, "bias_gelu_tanh") == 1 && count_op(p, "gelu_tanh") == 0, "fuse-bias-gelu by hand: %s", note);
    fm_graph_free(p);
    fm_graph_free(g);
    fm_tensor_release(b);
}

static void test_fuse_linear_acts_by_hand(void) {
    static const char *const acts[] = {"gelu", "silu", "sigmoid", "tanh", "gelu_tanh"};
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(2, (int64_t[]){64, 64}, 61), *b = randn(1, (int64_t[]){64}, 62);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 64}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK && fm_graph_add_const(g, "b", b) == FM_OK);
    char cur[32] = "x", h[32], y[32];
    for (int i = 0; i < 5; i++) {
        snprintf(h, sizeof h, "h%d", i), snprintf(y, sizeof y, "y%d", i);
        const char *ins[3] = {cur, "w", "b"}, *ho = h, *yo = y, *hi = h;
        CHECK(fm_graph_add_node(g, "linear", NULL, i == 4 ? 2 : 3, ins, 1, &ho, 0, NULL) == FM_OK);
        CHECK_MSG(fm_graph_add_node(g, acts[i], NULL, 1, &hi, 1, &yo, 0, NULL) == FM_OK, "%s", fm_last_error());
        snprintf(cur, sizeof cur, "%s", y);
    }
    CHECK(fm_graph_add_output(g, cur) == FM_OK);
    char note[256] = "";
    fm_graph *p = pass_by_hand(g, "batch", 70, "fuse-linear-act", 1e-5, note, sizeof note);
    int with_act = 0;
    for (int i = 0; p && i < p->n_nodes; i++) {
        const gattr *a = g_node_attr(&p->nodes[i], "act");
        with_act += !strcmp(p->nodes[i].op, "linear_fused") && a && a->type == FM_ATTR_STRING && !strcmp(a->s, acts[with_act]);
    }
    CHECK_MSG(p && p->n_nodes == 5 && with_act == 5 && strstr(note, "5 with another activation"), "fuse-linear-act, other activations: %s", note);
    const fm_quant_mode modes[2] = {FM_QUANT_INT8_DYNAMIC, FM_QUANT_INT4};
    for (int m = 0; m < 2 && p; m++) {
        fm_quant_options o;
        fm_quant_options_init(&o);
        o.mode = modes[m];
        fm_graph *q = fm_graph_quantize(p, &o, NULL), *qu = fm_graph_quantize(g, &o, NULL); /* fused, and unfused as traced */
        double d = 1;
        CHECK_MSG(q && qu && fm_graph_compare(qu, q, &d) == FM_OK && d < 1e-5, "quantized linear_fused with act (%s): %g from the unfused graph quantized %s",
                  m ? "int4" : "int8", d, fm_last_error());
        fm_graph_free(qu);
        const int after = m ? 5 : 3; /* int8: silu, sigmoid, tanh as nodes; int4: all five */
        int nodes = 0;
        for (int i = 0; i < 5; i++) nodes += q ? count_op(q, acts[i]) : 0;
        CHECK_MSG(nodes == after, "quantized linear_fused with act (%s): %d activation nodes, %d expected", m ? "int4" : "int8", nodes, after);
        fm_graph_free(q);
    }
    fm_graph_free(p);
    fm_graph_free(g);
    const char *bad[2][2] = {{"act", "swish"}, {"relu", "gelu"}};
    for (int k = 0; k < 2; k++) {
        fm_graph *e = fm_graph_new();
        CHECK(fm_graph_add_input(e, "x", FM_F32, 2, (int64_t[]){3, 64}, NULL) == FM_OK && fm_graph_add_const(e, "w", w) == FM_OK);
        fm_graph_attr at[2] = {fm_graph_attr_string("act", bad[k][1]), fm_graph_attr_int("relu", 1)};
        CHECK(fm_graph_add_node(e, "linear_fused", "lf", 2, (const char *[]){"x", "w"}, 1, (const char *[]){"y"}, k + 1, at) == FM_OK);
        CHECK(fm_graph_add_output(e, "y") == FM_OK);
        CHECK(fm_graph_validate(e) != FM_OK);
        CHECK_ERR_CONTAINS(k ? "'relu' and 'act' both give an activation" : "unknown activation 'swish'");
        fm_graph_free(e);
    }
    fm_tensor_release_n(2, w, b);
}

/* The fused attention against the unfused graph at a prompt (no past), a decode
 * step and a chunk after a past (the three paths of attention_kv), every output. */
static void check_attention_paths(const fm_graph *g, const fm_graph *p, int n_layer, int64_t kv, int64_t D, int64_t vocab) {
    const int64_t cases[3][2] = {{0, 3}, {2, 1}, {2, 3}}; /* past, seq */
    const int n_io = 1 + 2 * n_layer;
    for (int c = 0; c < 3; c++) {
        fm_tensor *in[16] = {0}, *oa[16] = {0}, *ob[16] = {0};
        int64_t ids[3] = {1 % vocab, 8 % vocab, 15 % vocab};
        in[0] = fm_tensor_from_data(ids, 2, (int64_t[]){1, cases[c][1]}, FM_I64);
        for (int i = 1; i < n_io; i++) in[i] = randn(4, (int64_t[]){1, kv, cases[c][0], D}, 40 + (uint64_t)i);
        CHECK_MSG(fm_graph_run(g, in, oa) == FM_OK && fm_graph_run(p, in, ob) == FM_OK, "attention paths: %s", fm_last_error());
        double worst = 0;
        for (int j = 0; oa[0] && ob[0] && j < n_io; j++) {
            double scale = 1e-30, diff = 0;
            CHECK(fm_tensor_numel(oa[j]) == fm_tensor_numel(ob[j]));
            for (int64_t e = 0; e < fm_tensor_numel(oa[j]); e++) {
                scale = fmax(scale, fabs(fm_tensor_get(oa[j], e)));
                diff = fmax(diff, fabs(fm_tensor_get(oa[j], e) - fm_tensor_get(ob[j], e)));
            }
            worst = fmax(worst, diff / scale);
        }
        CHECK_MSG(worst <= 1e-5, "fuse-attention, past %lld seq %lld: diff %g", (long long)cases[c][0], (long long)cases[c][1], worst);
        for (int i = 0; i < n_io; i++) fm_tensor_release_n(3, in[i], oa[i], ob[i]);
    }
}

/* A Llama graph (grouped-query): fuse-rope alone (after cse, which merges the two ropes' table
 * slices) makes a rope of each block's q and k, equal to the unfused graph bit for bit; then
 * fuse-attention takes each block's ropes into its attention_kv, checked on its three paths. */
static void test_rope_passes(void) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_LLAMA);
    c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.ffn_hidden = 48, c.block_size = 16, c.vocab_size = 20, c.dropout = 0;
    fm_gpt *gm = fm_gpt_new(&c, NULL);
    fm_graph *g = gm ? fm_graph_from_gpt(gm) : NULL, *s = g ? fm_graph_pass(g, "cse", NULL, 0) : NULL;
    fm_graph *r = s ? fm_graph_pass(s, "fuse-rope", NULL, 0) : NULL, *a = r ? fm_graph_pass(r, "fuse-attention", NULL, 0) : NULL;
    CHECK_MSG(a != NULL, "llama passes: %s", fm_last_error());
    double d = 1;
    CHECK_MSG(r && fm_graph_compare(s, r, &d) == FM_OK && d == 0, "fuse-rope: diff %g %s", d, fm_last_error());
    CHECK_MSG(r && count_op(r, "rope") == 2 * c.n_layer && count_op(r, "neg") == 0 && count_op(r, "cat") == 2 * c.n_layer,
              "fuse-rope: %d ropes, %d negs, %d cats", r ? count_op(r, "rope") : -1, r ? count_op(r, "neg") : -1, r ? count_op(r, "cat") : -1);
    CHECK_MSG(a && count_op(a, "attention_kv") == c.n_layer && count_op(a, "rope") == 0, "fuse-attention on ropes: %d attention_kv, %d ropes",
              a ? count_op(a, "attention_kv") : -1, a ? count_op(a, "rope") : -1);
    if (a) check_attention_paths(g, a, c.n_layer, c.n_kv_head, c.n_embd / c.n_head, c.vocab_size);
    fm_graph_free(a);
    fm_graph_free(r);
    fm_graph_free(s);
    fm_graph_free(g);
    fm_gpt_free(gm);
}

static void test_passes(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(2, (int64_t[]){8, 6}, 1);
    CHECK(fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 6}, (const char *[]){"batch", NULL}) == FM_OK);
    CHECK(fm_graph_add_const(g, "w", w) == FM_OK);
    fm_graph_attr tr[2] = {fm_graph_attr_int("dim0", 0), fm_graph_attr_int("dim1", 1)};
    CHECK(fm_graph_add_node(g, "transpose", NULL, 1, (const char *[]){"w"}, 1, (const char *[]){"wt"}, 2, tr) == FM_OK);
    CHECK(fm_graph_add_node(g, "matmul", NULL, 2, (const char *[]){"x", "wt"}, 1, (const char *[]){"h"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", NULL, 1, (const char *[]){"h"}, 1, (const char *[]){"r1"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "relu", NULL, 1, (const char *[]){"h"}, 1, (const char *[]){"r2"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "tanh", NULL, 1, (const char *[]){"h"}, 1, (const char *[]){"dead"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "identity", NULL, 1, (const char *[]){"r2"}, 1, (const char *[]){"r2i"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_node(g, "add", NULL, 2, (const char *[]){"r1", "r2i"}, 1, (const char *[]){"y"}, 0, NULL) == FM_OK);
    CHECK(fm_graph_add_output(g, "y") == FM_OK);
    CHECK(fm_graph_validate(g) == FM_OK);
    struct { const char *pass; const char *gone; int nodes; } cases[] = {
        {"dce", "tanh", 6}, {"fold", "transpose", 6}, {"cse", NULL, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char note[256];
        fm_graph *p = fm_graph_pass(g, cases[i].pass, note, sizeof note);
        CHECK_MSG(p != NULL, "%s: %s", cases[i].pass, fm_last_error());
        if (!p) continue;
        double d = 1;
        CHECK(fm_graph_compare(g, p, &d) == FM_OK && d == 0);
        if (cases[i].gone) CHECK_MSG(count_op(p, cases[i].gone) == 0, "%s left a %s (%s)", cases[i].pass, cases[i].gone, note);
        if (!strcmp(cases[i].pass, "cse")) CHECK_MSG(count_op(p, "relu") == 1, "cse: %s", note);
        if (!strcmp(cases[i].pass, "dce")) CHECK_MSG(count_op(p, "identity") == 0 && fm_graph_num_nodes(p) == 5, "dce: %s", note);
        fm_graph_free(p);
    }
    fm_graph_free(g);
    fm_tensor_release(w);

    /* conv + batch norm folded: from a traced CNN */
    fm_module *m = fm_sequential(0);
    fm_sequential_add(m, fm_nn_conv2d(1, 4, 3, 1, 1, true, NULL));
    fm_sequential_add(m, fm_nn_batchnorm2d(4, 1e-5, 0.1));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
    fm_named_list st;
    CHECK(fm_module_state(m, &st) == FM_OK);
    for (int i = 0; i < st.n; i++) /* non-trivial statistics */
        if (strstr(st.items[i].name, "running") || strstr(st.items[i].name, "1.weight") || strstr(st.items[i].name, "1.bias"))
            fm_tensor_uniform_(st.items[i].tensor, 0.5, 1.5, NULL);
    fm_named_list_free(&st);
    fm_tensor *ex = randn(4, (int64_t[]){2, 1, 6, 6}, 3);
    g = fm_graph_trace_module(m, ex);
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    fm_graph *p = g ? fm_graph_pass(g, "fuse-conv-bn", NULL, 0) : NULL;
    double d = 1;
    CHECK(p && fm_graph_compare(g, p, &d) == FM_OK && d <= 1e-5 && count_op(p, "batch_norm") == 0 && count_op(p, "conv2d") == 1);
    /* then conv + relu + max pool into conv2d_fused (the model gains a pool) */
    fm_graph_free(p);
    fm_graph_free(g);
    fm_sequential_add(m, fm_nn_maxpool2d(2, 2, 0));
    g = fm_graph_trace_module(m, ex);
    fm_graph *q = g ? fm_graph_pass(g, "fuse-conv-bn", NULL, 0) : NULL;
    char note[256] = "";
    p = q ? fm_graph_pass(q, "fuse-conv-act", note, sizeof note) : NULL;
    d = 1;
    CHECK_MSG(p && fm_graph_compare(q, p, &d) == FM_OK && d <= 1e-5, "fuse-conv-act: diff %g %s", d, fm_last_error());
    CHECK_MSG(p && count_op(p, "conv2d_fused") == 1 && count_op(p, "relu") + count_op(p, "max_pool2d") + count_op(p, "conv2d") == 0,
              "fuse-conv-act: %s", note);
    fm_graph_free(p);
    fm_graph_free(q);
    fm_graph_free(g);
    fm_tensor_release(ex);
    fm_module_free(m);
    test_fuse_conv_act_by_hand();
    test_fuse_linear_act_by_hand();
    test_fuse_linear_acts_by_hand();
    test_fuse_bias_gelu_by_hand();
    test_fold_pad_conv_by_hand();
    test_matmul_to_linear_by_hand();
    test_fuse_silu_by_hand();
    test_fuse_elementwise_by_hand();
    test_fold_reshape_by_hand();
    test_fuse_masked_attention_by_hand();

    /* add + layer_norm and linear bias + gelu_tanh: from a GPT-2 graph; then everything */
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = 2, c.n_head = 2, c.n_kv_head = 2, c.n_embd = 16, c.ffn_hidden = 32, c.block_size = 16, c.vocab_size = 20, c.dropout = 0;
    fm_gpt *gm = fm_gpt_new(&c, NULL);
    g = gm ? fm_graph_from_gpt(gm) : NULL;
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    /* fuse-bias-gelu leaves linears with constant weights to fuse-linear-act (linear_fused
     * applies bias and GELU as it stores): on the GPT it fuses none, and the compiled graph
     * has one linear_fused with act gelu_tanh per block */
    const char *fusions[4][2] = {{"fuse-add-layer-norm", "add_layer_norm"}, {"fuse-bias-gelu", "bias_gelu_tanh"},
                                 {"fuse-attention", "attention_kv"}, {"fuse-linear-act", "linear_fused"}};
    for (int i = 0; g && i < 4; i++) {
        p = fm_graph_pass(g, fusions[i][0], NULL, 0);
        d = 1;
        CHECK_MSG(p && fm_graph_compare(g, p, &d) == FM_OK && d <= 1e-5, "%s: diff %g %s", fusions[i][0], d, fm_last_error());
        CHECK_MSG(p && (i == 1 ? count_op(p, fusions[i][1]) == 0 : count_op(p, fusions[i][1]) >= 2), "%s: %d %s", fusions[i][0],
                  p ? count_op(p, fusions[i][1]) : -1, fusions[i][1]);
        if (p && i == 2) check_attention_paths(g, p, c.n_layer, c.n_kv_head, c.n_embd / c.n_head, c.vocab_size);
        fm_graph_free(p);
    }
    test_rope_passes();
    fm_compile_report rep;
    p = g ? fm_graph_compile(g, &rep) : NULL;
    CHECK_MSG(p != NULL, "%s", fm_last_error());
    CHECK(p && rep.max_rel_diff <= 1e-4 && fm_graph_num_nodes(p) < fm_graph_num_nodes(g));
    int gelu_fused = 0;
    for (int i = 0; p && i < p->n_nodes; i++) {
        const gattr *a = g_node_attr(&p->nodes[i], "act");
        gelu_fused += !strcmp(p->nodes[i].op, "linear_fused") && a && a->type == FM_ATTR_STRING && !strcmp(a->s, "gelu_tanh");
    }
    CHECK_MSG(gelu_fused == c.n_layer && count_op(p, "bias_gelu_tanh") == 0, "compiled GPT: %d linear_fused with gelu_tanh", gelu_fused);
    CHECK(rep.plan_after.planned_bytes >= rep.plan_after.live_peak_bytes && rep.plan_after.naive_bytes >= rep.plan_after.live_peak_bytes);
    CHECK(rep.plan_after.live_peak_bytes > 0);
    fm_graph_free(p);
    fm_graph_free(g);
    fm_gpt_free(gm);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/fathom_test_graph_%ld", (long)getpid());
    mkdir(g_tmp, 0755);
    test_mlp_build_run_save_load();
    test_bad_inputs_at_run();
    test_bad_graphs();
    test_dim_expressions();
    test_cnn();
    test_corrupt_files();
    test_seed_files();
    test_trace_module();
    test_gpt_graph();
    test_passes();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (!getenv("FATHOM_TEST_KEEP") && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    TEST_DONE();
}
