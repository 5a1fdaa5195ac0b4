/* fm_graph_quantize (fathom/quant.h): a small MLP graph quantized each way
 * runs, saves and loads, and stays within a stated distance of the fp32 graph
 * on its inputs; a GPT graph quantized to int4 and int8 generates; bad input
 * (a group that does not divide a layer, calibration data of the wrong shape
 * or type, a graph that cannot be calibrated) is an error naming it; the
 * loader refuses quantized nodes with bad attributes or tables.
 *
 * Error bounds vs fp32 (max |diff| / max |fp32 output| over the outputs):
 *   int8 dynamic / static 0.03; entropy 0.25: it clips tails by design (here the
 *   relu output at 15.7 of its 31.9 maximum, so the largest test outputs clip); int4 g32 0.3: random
 *   N(0,1) weights are int4's worst case (16 levels per group of 32: rounding
 *   noise ~8% of the weights' spread per layer, three layers, max over outputs;
 *   0.21 symmetric and 0.16 with min measured). The GPT: int8 0.05, int4 0.15. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/parallel.h"
#include "fathom/fathom.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/quant.h"
#include "test_util.h"
#include "graph_roundtrip.h"
#include "test_isa_env.h"

static char g_tmp[256];

static fm_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(ndim, shape, FM_F32, &r);
}

/* x [batch, 64] -> linear 64->96 -> relu -> matmul by a [96, 32] constant -> linear 32->10 */
static fm_graph *mlp(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w1 = randn(2, (int64_t[]){96, 64}, 1), *b1 = randn(1, (int64_t[]){96}, 2), *w2 = randn(2, (int64_t[]){96, 32}, 3);
    fm_tensor *w3 = randn(2, (int64_t[]){10, 32}, 4);
    fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 64}, (const char *[]){"batch", NULL});
    fm_graph_add_const(g, "fc1.weight", w1);
    fm_graph_add_const(g, "fc1.bias", b1);
    fm_graph_add_const(g, "proj", w2);
    fm_graph_add_const(g, "fc3.weight", w3);
    fm_graph_add_node(g, "linear", "fc1", 3, (const char *[]){"x", "fc1.weight", "fc1.bias"}, 1, (const char *[]){"h1"}, 0, NULL);
    fm_graph_add_node(g, "relu", "act", 1, (const char *[]){"h1"}, 1, (const char *[]){"r1"}, 0, NULL);
    fm_graph_add_node(g, "matmul", "mm", 2, (const char *[]){"r1", "proj"}, 1, (const char *[]){"h2"}, 0, NULL);
    fm_graph_add_node(g, "linear", "fc3", 2, (const char *[]){"h2", "fc3.weight"}, 1, (const char *[]){"y"}, 0, NULL);
    fm_graph_add_output(g, "y");
    fm_tensor_release_n(4, w1, b1, w2, w3);
    CHECK_MSG(fm_graph_validate(g) == FM_OK, "%s", fm_last_error());
    return g;
}

/* max |a - b| / max |a| on one input */
static double rel_diff(const fm_graph *a, const fm_graph *b, fm_tensor *x) {
    fm_tensor *ya = fm_graph_run1(a, x), *yb = fm_graph_run1(b, x);
    double num = 0, den = 0;
    for (int64_t i = 0; ya && yb && i < fm_tensor_numel(ya); i++) {
        num = fmax(num, fabs(fm_tensor_get(ya, i) - fm_tensor_get(yb, i)));
        den = fmax(den, fabs(fm_tensor_get(ya, i)));
    }
    bool ok = ya && yb;
    fm_tensor_release_n(2, ya, yb);
    return ok && den > 0 ? num / den : INFINITY;
}

static int count_op(const fm_graph *g, const char *op) {
    int n = 0;
    for (int i = 0; i < fm_graph_num_nodes(g); i++) n += !strcmp(fm_graph_node_op(g, i), op);
    return n;
}

static void test_modes(void) {
    fm_graph *g = mlp();
    fm_tensor *x = randn(2, (int64_t[]){32, 64}, 9), *calib = randn(2, (int64_t[]){200, 64}, 10);
    const struct { fm_quant_mode m; fm_calib_method c; int group; bool wm; double tol; const char *op; } cases[] = {
        {FM_QUANT_INT8_DYNAMIC, 0, 0, false, 0.03, "qlinear_int8"}, {FM_QUANT_INT8_STATIC, FM_CALIB_MINMAX, 0, false, 0.03, "qlinear_int8"},
        {FM_QUANT_INT8_STATIC, FM_CALIB_PERCENTILE, 0, false, 0.03, "qlinear_int8"},
        {FM_QUANT_INT8_STATIC, FM_CALIB_ENTROPY, 0, false, 0.25, "qlinear_int8"},
        {FM_QUANT_INT4, 0, 32, false, 0.3, "qlinear_int4"}, {FM_QUANT_INT4, 0, 32, true, 0.3, "qlinear_int4"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fm_quant_options o;
        fm_quant_options_init(&o);
        o.mode = cases[i].m;
        o.method = cases[i].c;
        o.group = cases[i].group ? cases[i].group : 32;
        o.with_min = cases[i].wm;
        o.calib = calib;
        fm_quant_report rep;
        fm_graph *q = fm_graph_quantize(g, &o, &rep);
        CHECK_MSG(q != NULL, "case %zu: %s", i, fm_last_error());
        if (!q) continue;
        /* int8: the relu runs in fc1's epilogue (its node is gone); int4 keeps it in fp32 */
        const bool i4 = o.mode == FM_QUANT_INT4;
        CHECK_MSG(rep.n_quantized == 3 && count_op(q, cases[i].op) == 3 && count_op(q, "relu") == (i4 ? 1 : 0), "case %zu: %d quantized", i,
                  rep.n_quantized);
        CHECK_MSG(rep.n_nodes == 4 && !rep.nodes[1].quantized && strstr(rep.nodes[1].how, i4 ? "fp32" : "fused into 'fc1'"), "case %zu: %s", i,
                  rep.nodes[1].how);
        CHECK(rep.bytes_after < rep.bytes_before / (o.mode == FM_QUANT_INT4 ? 4 : 2));
        double d = rel_diff(g, q, x);
        for (int k = 0; getenv("QDEBUG") && k < rep.n_nodes; k++) printf("  %s: %s\n", rep.nodes[k].node, rep.nodes[k].how);
        CHECK_MSG(d < cases[i].tol, "case %zu (mode %d method %d min %d): relative difference %g, bound %g", i, cases[i].m, cases[i].c,
                  cases[i].wm, d, cases[i].tol);
        printf("case %zu: mode %d method %d with_min %d: max rel diff vs fp32 %.4g\n", i, cases[i].m, cases[i].c, cases[i].wm, d);
        /* a saved and loaded quantized graph computes the same bits */
        char dir[300];
        snprintf(dir, sizeof dir, "%s/q%zu", g_tmp, i);
        graph_roundtrip_same(q, dir, x);
        fm_graph_free(q);
        fm_quant_report_free(&rep);
    }
    fm_tensor_release_n(2, x, calib);
    fm_graph_free(g);
}

static void test_bad_input(void) {
    fm_graph *g = mlp();
    fm_quant_options o;
    fm_quant_options_init(&o);
    o.mode = FM_QUANT_INT4;
    o.group = 128; /* 64 and 32 input features: 128 divides neither */
    CHECK(fm_graph_quantize(g, &o, NULL) == NULL);
    CHECK_ERR_CONTAINS("node 'fc1' (linear): --group 128 does not divide its 64 input features");
    o.group = 48;
    CHECK(fm_graph_quantize(g, &o, NULL) == NULL);
    CHECK_ERR_CONTAINS("--group 48 must be 32, 64 or 128");
    o.mode = FM_QUANT_INT8_STATIC;
    o.calib = NULL;
    CHECK(fm_graph_quantize(g, &o, NULL) == NULL);
    CHECK_ERR_CONTAINS("static int8 needs calibration data");
    fm_tensor *wrong = randn(2, (int64_t[]){10, 63}, 1), *ints = fm_tensor_zeros(2, (int64_t[]){10, 64}, FM_I64, FM_CPU);
    o.calib = wrong;
    CHECK(fm_graph_quantize(g, &o, NULL) == NULL);
    CHECK_ERR_CONTAINS("calibration data [10, 63] does not fit the graph's input 'x' [\"batch\", 64]");
    o.calib = ints;
    CHECK(fm_graph_quantize(g, &o, NULL) == NULL);
    CHECK_ERR_CONTAINS("calibration data must be f32 samples on the host, got i64");
    /* nothing to quantize is an error, not a silent copy */
    fm_graph *r = fm_graph_new();
    fm_graph_add_input(r, "x", FM_F32, 1, (int64_t[]){4}, NULL);
    fm_graph_add_node(r, "relu", NULL, 1, (const char *[]){"x"}, 1, (const char *[]){"y"}, 0, NULL);
    fm_graph_add_output(r, "y");
    o.mode = FM_QUANT_INT8_DYNAMIC;
    CHECK(fm_graph_quantize(r, &o, NULL) == NULL);
    CHECK_ERR_CONTAINS("no node of this graph can be quantized");
    fm_tensor_release_n(2, wrong, ints);
    fm_graph_free(r);
    fm_graph_free(g);
}

/* graph.json edits the loader must refuse, naming the node */
static void test_loader_checks(void) {
    fm_graph *g = mlp();
    fm_quant_options o;
    fm_quant_options_init(&o);
    o.mode = FM_QUANT_INT8_STATIC;
    fm_tensor *calib = randn(2, (int64_t[]){50, 64}, 3);
    o.calib = calib;
    fm_graph *q = fm_graph_quantize(g, &o, NULL);
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/edit", g_tmp);
    CHECK(q && fm_graph_save(q, dir) == FM_OK);
    snprintf(path, sizeof path, "%s/graph.json", dir);
    FILE *f = fopen(path, "rb");
    char *text = calloc(1 << 20, 1);
    size_t n = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    CHECK(n > 0);
    const struct { const char *from, *to, *err; } edits[] = {
        {"\"a_zero\": ", "\"a_zero\": 3000", "a_zero 3000"},
        {"\"a_scale\": ", "\"a_scale\": -1", "a_scale -1"},
        {"[\"x\", \"fc1.weight.int8_panels\"", "[\"x\", \"fc1.weight.int8_scale\"", "weight (layout vnni16x4) must be i8, got f32"},
        {"\"fc3.weight.int8_scale\", \"\", \"fc3.weight.int8_sum\"]", "\"fc1.weight.int8_scale\", \"\", \"fc3.weight.int8_sum\"]",
         "weight (layout vnni16x4) has shape [1, 8, 16, 4], expected [6, 8, 16, 4]"},
        {"\"fc3.weight.int8_sum\"]", "\"fc1.weight.int8_sum\"]", "row sums (layout vnni16x4) has shape [96], expected [10]"},
        {"\"fc3.weight.int8_scale\", \"\", \"fc3.weight.int8_sum\"]", "\"fc3.weight.int8_scale\"]", "row sums (layout vnni16x4) is required"},
        {"\"layout\": \"vnni16x4\"", "\"layout\": \"rows\"", "weight must be a 2-D i8 tensor [out, in] (layout rows), got i8 [6, 16, 16, 4]"},
        {"\"layout\": \"vnni16x4\"", "\"layout\": \"vnni32x4\"", "layout 'vnni32x4' is not one this fathom knows (rows, vnni16x4)"},
    };
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char *at = strstr(text, edits[e].from), *t2 = calloc(1 << 20, 1);
        CHECK_MSG(at != NULL, "edit %zu: '%s' not in graph.json", e, edits[e].from);
        if (!at) { free(t2); continue; }
        /* replace the matched text (and, for numbers, the number after it) */
        size_t pre = (size_t)(at - text), skip = strlen(edits[e].from);
        if (edits[e].from[strlen(edits[e].from) - 1] == ' ')
            while (at[skip] && at[skip] != ',' && at[skip] != '}') skip++;
        memcpy(t2, text, pre);
        strcat(t2, edits[e].to);
        strcat(t2, at + skip);
        f = fopen(path, "wb");
        fputs(t2, f);
        fclose(f);
        fm_graph *l = fm_graph_load(dir);
        CHECK_MSG(l == NULL, "edit %zu loaded", e);
        if (!l) CHECK_ERR_CONTAINS(edits[e].err);
        fm_graph_free(l);
        free(t2);
    }
    free(text);
    fm_tensor_release(calib);
    fm_graph_free(q);
    fm_graph_free(g);
}

/* A graph in the layout written before the panels (qlinear_int8 on i8 [N, K]
 * rows, no layout tag, no row sums) still loads and runs, and gives the same
 * bits as the panels, whose integers and epilogue are the same. */
static void test_rows_layout(void) {
    fm_tensor *w = randn(2, (int64_t[]){40, 70}, 21), *b = randn(1, (int64_t[]){40}, 22), *x = randn(2, (int64_t[]){9, 70}, 23);
    fm_tensor *q = NULL, *s = NULL, *p = NULL, *u = NULL;
    CHECK(fm_quantize_weight_int8(w, &q, &s) == FM_OK && fm_pack_weight_int8(q, &p, &u) == FM_OK);
    fm_graph *g = fm_graph_new();
    fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 70}, (const char *[]){"batch", NULL});
    fm_graph_add_const(g, "w.int8", q);
    fm_graph_add_const(g, "w.int8_scale", s);
    fm_graph_add_const(g, "b", b);
    fm_graph_attr a[2] = {fm_graph_attr_float("a_scale", 0.03), fm_graph_attr_int("a_zero", 100)};
    fm_graph_add_node(g, "qlinear_int8", "fc", 4, (const char *[]){"x", "w.int8", "w.int8_scale", "b"}, 1, (const char *[]){"y"}, 2, a);
    fm_graph_add_output(g, "y");
    char dir[300];
    snprintf(dir, sizeof dir, "%s/rows", g_tmp);
    CHECK_MSG(fm_graph_save(g, dir) == FM_OK, "%s", fm_last_error());
    fm_graph *l = fm_graph_load(dir);
    CHECK_MSG(l != NULL, "a rows-layout graph must still load: %s", fm_last_error());
    fm_tensor *y0 = l ? fm_graph_run1(l, x) : NULL, *y1 = fm_qlinear_int8_packed(x, p, s, u, b, 0.03, 100, false);
    CHECK(y0 && y1 && fm_tensor_numel(y0) == 9 * 40);
    bool same = y0 && y1;
    for (int64_t i = 0; same && i < 9 * 40; i++) same = ((const float *)fm_tensor_data(y0))[i] == ((const float *)fm_tensor_data(y1))[i];
    CHECK_MSG(same, "rows and panels differ");
    /* relu fused on panels == relu after the rows */
    fm_tensor *r0 = y0 ? fm_relu(y0) : NULL, *r1 = fm_qlinear_int8_packed(x, p, s, u, b, 0.03, 100, true);
    same = r0 && r1;
    for (int64_t i = 0; same && i < 9 * 40; i++) same = ((const float *)fm_tensor_data(r0))[i] == ((const float *)fm_tensor_data(r1))[i];
    CHECK_MSG(same, "fused relu differs from relu after the op");
    /* tanh GELU fused on panels == the op without bias, then the fused bias + GELU op (bitwise, at
     * every ISA level: ctest runs this file's cases at each, test_quant_isa_*); dynamic and static */
    for (int dyn = 0; dyn < 2; dyn++) {
        const double as = dyn ? 0.0 : 0.03;
        fm_tensor *h0 = fm_qlinear_int8_packed(x, p, s, u, NULL, as, 100, FM_QACT_NONE);
        fm_tensor *g0 = h0 ? fm_bias_gelu_tanh(h0, b) : NULL, *g1 = fm_qlinear_int8_packed(x, p, s, u, b, as, 100, FM_QACT_GELU_TANH);
        fm_tensor *hb = fm_qlinear_int8_packed(x, p, s, u, b, as, 100, FM_QACT_NONE), *e0 = hb ? fm_gelu(hb) : NULL;
        fm_tensor *e1 = fm_qlinear_int8_packed(x, p, s, u, b, as, 100, FM_QACT_GELU);
        same = g0 && g1;
        int64_t at = -1;
        for (int64_t i = 0; same && i < 9 * 40; i++)
            if (memcmp((const float *)fm_tensor_data(g0) + i, (const float *)fm_tensor_data(g1) + i, 4)) same = false, at = i;
        CHECK_MSG(same, "fused tanh GELU (%s) differs from bias_gelu_tanh after the op at %lld", dyn ? "dynamic" : "static", (long long)at);
        same = e0 && e1;
        for (int64_t i = 0; same && i < 9 * 40; i++)
            if (memcmp((const float *)fm_tensor_data(e0) + i, (const float *)fm_tensor_data(e1) + i, 4)) same = false, at = i;
        CHECK_MSG(same, "fused exact GELU (%s) differs from gelu after the op at %lld", dyn ? "dynamic" : "static", (long long)at);
        fm_tensor_release_n(6, h0, g0, g1, hb, e0, e1);
    }
    CHECK(fm_qlinear_int8_packed(x, p, s, u, b, 0.03, 100, 4) == NULL);
    CHECK_ERR_CONTAINS("activation 4 is not one of FM_QACT_NONE (0), FM_QACT_RELU (1), FM_QACT_GELU_TANH (2), FM_QACT_GELU (3)");
    /* the front end names a panel tensor that does not fit */
    CHECK(fm_qlinear_int8_packed(x, q, s, u, b, 0.03, 100, false) == NULL);
    CHECK_ERR_CONTAINS("panels must be i8 [3, 18, 16, 4] for 40 outputs and 70 input features");
    fm_tensor_release_n(2, p, u); /* the refused call below sets them to NULL */
    CHECK(fm_pack_weight_int8(w, &p, &u) != FM_OK); /* f32: not quantized */
    CHECK_ERR_CONTAINS("weight must be a 2-D i8 host tensor, got f32");
    ((int8_t *)fm_tensor_data(q))[3 * 70 + 5] = -128; /* outside the panels' [-127, 127] */
    CHECK(fm_pack_weight_int8(q, &p, &u) != FM_OK && p == NULL && u == NULL);
    CHECK_ERR_CONTAINS("weight [3, 5] is -128; the panels hold codes in [-127, 127]");
    fm_tensor_release_n(8, w, b, x, q, s, y0, y1, r0);
    fm_tensor_release(r1);
    fm_graph_free(l);
    fm_graph_free(g);
}

/* x -> linear (bias) -> ACT -> y; with `tap`, the linear's output is a graph output too,
 * so the activation cannot be fused (two readers) */
static fm_graph *linear_act(const char *act, bool tap) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w = randn(2, (int64_t[]){40, 70}, 31), *b = randn(1, (int64_t[]){40}, 32);
    fm_graph_add_input(g, "x", FM_F32, 2, (int64_t[]){-1, 70}, (const char *[]){"batch", NULL});
    fm_graph_add_const(g, "fc.weight", w);
    fm_graph_add_const(g, "fc.bias", b);
    fm_graph_add_node(g, "linear", "fc", 3, (const char *[]){"x", "fc.weight", "fc.bias"}, 1, (const char *[]){"h"}, 0, NULL);
    fm_graph_add_node(g, act, "act", 1, (const char *[]){"h"}, 1, (const char *[]){"y"}, 0, NULL);
    fm_graph_add_output(g, "y");
    if (tap) fm_graph_add_output(g, "h");
    fm_tensor_release_n(2, w, b);
    CHECK_MSG(fm_graph_validate(g) == FM_OK, "%s", fm_last_error());
    return g;
}

/* fathom quantize folds a gelu / gelu_tanh after a linear into the int8 node (one node
 * left), and the fused graph's output is bitwise the unfused one's (the same quantized
 * product, then the activation op) */
static void test_gelu_fusion(void) {
    const char *acts[2] = {"gelu", "gelu_tanh"};
    fm_tensor *x = randn(2, (int64_t[]){9, 70}, 33);
    for (int a = 0; a < 2; a++) {
        fm_graph *g0 = linear_act(acts[a], false), *g1 = linear_act(acts[a], true);
        fm_quant_options o;
        fm_quant_options_init(&o);
        fm_graph *q0 = fm_graph_quantize(g0, &o, NULL), *q1 = fm_graph_quantize(g1, &o, NULL);
        CHECK_MSG(q0 && q1, "%s", fm_last_error());
        CHECK_MSG(q0 && count_op(q0, acts[a]) == 0 && count_op(q0, "qlinear_int8") == 1, "%s not fused", acts[a]);
        CHECK_MSG(q1 && count_op(q1, acts[a]) == 1, "%s fused although the linear's output is read twice", acts[a]);
        fm_tensor *y0 = q0 ? fm_graph_run1(q0, x) : NULL, *in[1] = {x}, *out[2] = {NULL, NULL};
        CHECK(q1 && fm_graph_run(q1, in, out) == FM_OK);
        bool same = y0 && out[0] && fm_tensor_numel(y0) == fm_tensor_numel(out[0]);
        for (int64_t i = 0; same && i < fm_tensor_numel(y0); i++) same = fm_tensor_get(y0, i) == fm_tensor_get(out[0], i);
        CHECK_MSG(same, "%s fused into the int8 epilogue differs from the separate op", acts[a]);
        fm_tensor_release_n(3, y0, out[0], out[1]);
        fm_graph_free(q0);
        fm_graph_free(q1);
        fm_graph_free(g0);
        fm_graph_free(g1);
    }
    fm_tensor_release(x);
}

/* q generates 12 tokens greedily, and its logits are within tol of g's; returns the difference */
static double gpt_generates_near(const fm_graph *g, const fm_graph *q, double tol, const char *what) {
    int32_t prompt[3] = {1, 5, 9}, out[12];
    int no = 0;
    fm_gpt_sample_params sp = {0, 0, 1.0, 0};
    CHECK_MSG(fm_graph_generate(q, prompt, 3, 12, &sp, out, &no, NULL, NULL, NULL) == FM_OK && no == 12, "%s: %s", what, fm_last_error());
    double d = 0;
    CHECK(fm_graph_compare(g, q, &d) == FM_OK);
    CHECK_MSG(d < tol, "%s: logits differ by %g relative", what, d);
    return d;
}

/* A GPT-2 graph quantized: int4 (embedding and linears, the tied head shares the
 * table) and int8 dynamic generate 12 tokens; the logits stay near fp32. Then the
 * compiled graph (bias + GELU fused by fathom compile: a linear_fused with act
 * gelu_tanh) in int8: the GELU goes into the MLP's first qlinear_int8 (its epilogue),
 * and the logits stay near. */
static void test_gpt(void) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = 2; c.n_head = 4; c.n_kv_head = 4; c.n_embd = 64; c.ffn_hidden = 256; c.block_size = 24; c.vocab_size = 50; c.dropout = 0;
    fm_rng r;
    fm_rng_init(&r, 7);
    fm_gpt *m = fm_gpt_new(&c, &r);
    fm_graph *g = m ? fm_graph_from_gpt(m) : NULL;
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    for (int mode = 0; g && mode < 2; mode++) {
        fm_quant_options o;
        fm_quant_options_init(&o);
        o.mode = mode ? FM_QUANT_INT4 : FM_QUANT_INT8_DYNAMIC;
        fm_quant_report rep;
        fm_graph *q = fm_graph_quantize(g, &o, &rep);
        CHECK_MSG(q != NULL, "%s", fm_last_error());
        if (!q) continue;
        CHECK(count_op(q, mode ? "qembedding_int4" : "qembedding_int8") == 1 && count_op(q, "embedding") == 0);
        /* the tied head and the table share one quantized copy: about a quarter (int8) of the f32 bytes */
        CHECK_MSG(rep.bytes_after * (mode ? 5 : 3) < rep.bytes_before, "gpt mode %d: %zu -> %zu bytes", mode, rep.bytes_before, rep.bytes_after);
        CHECK(count_op(q, mode ? "qlinear_int4" : "qlinear_int8") == 4 * c.n_layer + 1);
        CHECK(count_op(q, "linear") == 0);
        double d = gpt_generates_near(g, q, mode ? 0.15 : 0.05, mode ? "gpt int4" : "gpt int8");
        printf("gpt %s: %d nodes quantized, constants %zu -> %zu bytes, max rel diff %.4g\n", mode ? "int4 g32" : "int8 dynamic",
               rep.n_quantized, rep.bytes_before, rep.bytes_after, d);
        fm_quant_report_free(&rep);
        fm_graph_free(q);
    }
    fm_compile_report crep;
    fm_graph *gc = g ? fm_graph_compile(g, &crep) : NULL;
    CHECK_MSG(!g || gc, "%s", fm_last_error());
    if (gc) {
        CHECK(count_op(gc, "bias_gelu_tanh") == 0 && count_op(gc, "gelu_tanh") == 0); /* linear_fused with act gelu_tanh */
        fm_quant_options o;
        fm_quant_options_init(&o);
        fm_quant_report rep;
        fm_graph *q = fm_graph_quantize(gc, &o, &rep);
        CHECK_MSG(q != NULL, "%s", fm_last_error());
        if (q) {
            CHECK(count_op(q, "bias_gelu_tanh") == 0 && count_op(q, "qlinear_int8") == 4 * c.n_layer + 1);
            int fused = 0;
            for (int i = 0; i < rep.n_nodes; i++) fused += strstr(rep.nodes[i].how, "+ its gelu_tanh") != NULL;
            CHECK_MSG(fused == c.n_layer && count_op(q, "gelu_tanh") == 0, "%d nodes say they took their gelu_tanh into the epilogue", fused);
            gpt_generates_near(g, q, 0.05, "compiled gpt int8");
            fm_quant_report_free(&rep);
            fm_graph_free(q);
        }
        fm_graph_free(gc);
    }
    fm_graph_free(g);
    fm_gpt_free(m);
}

/* Dynamic activation quantization over many rows runs on the pool in row blocks
 * (src/backend/cpu/quant_cpu.c): its range must be the whole x's, so a dynamic
 * qlinear equals a static one given the range computed here in one pass (the scale
 * and zero of fm_q8_params: (max - min) / 255, rint(-min / scale)), bit for bit, at
 * 1 and 2 threads, with the minimum in the last block and the maximum in the first. */
static void test_dynamic_blocks(void) {
    const int64_t M = 300, K = 200, N = 40; /* 60,000 values: several blocks of 16,384 */
    fm_rng r;
    fm_rng_init(&r, 17);
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){M, K}, FM_F32, &r), *w = fm_tensor_randn(2, (int64_t[]){N, K}, FM_F32, &r);
    fm_tensor *q = NULL, *sc = NULL, *p = NULL, *u = NULL;
    CHECK(fm_quantize_weight_int8(w, &q, &sc) == FM_OK && fm_pack_weight_int8(q, &p, &u) == FM_OK);
    float *xv = fm_tensor_data(x);
    xv[3] = 9.5f;                 /* the maximum, in the first block */
    xv[(M - 1) * K + 7] = -6.25f; /* the minimum, in the last */
    float mn = 0.0f, mx = 0.0f;
    for (int64_t i = 0; i < M * K; i++) {
        mn = xv[i] < mn ? xv[i] : mn;
        mx = xv[i] > mx ? xv[i] : mx;
    }
    const float s = (mx - mn) / 255.0f;
    const int z = (int)nearbyintf(-mn / s);
    const int saved = fm_num_threads();
    fm_tensor *ys = fm_qlinear_int8_packed(x, p, sc, u, NULL, s, z, false);
    for (int t = 1; t <= 2; t++) {
        fm_set_num_threads(t);
        fm_tensor *yd = fm_qlinear_int8_packed(x, p, sc, u, NULL, 0.0, 0, false);
        CHECK_MSG(ys && yd && !memcmp(fm_tensor_data(ys), fm_tensor_data(yd), sizeof(float) * (size_t)(M * N)),
                  "dynamic int8 at %d threads differs from static with the whole x's range (scale %g, zero %d)", t, s, z);
        fm_tensor_release(yd);
    }
    fm_set_num_threads(saved);
    fm_tensor_release_n(7, x, w, q, sc, p, u, ys);
}

/* 7-bit weights (fm_quantize_weight_int8_range with 63, `fathom quantize --reduce-range`): codes
 * in [-63, 63], each row reaching 63 at its largest weight, scale = max |w| / 63; on panels, from
 * FM_Q8_NARROW_MIN_M rows (the AVX2 level's narrow tile), bitwise the rows layout's product
 * (another kernel: fm_q8_gemm's tiles), dynamic and static, with a bias and ReLU; a code range
 * outside [1, 127] is refused. */
static void test_reduce_range(void) {
    fm_rng r;
    fm_rng_init(&r, 31);
    const int64_t M = 40, N = 37, K = 301;
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){M, K}, FM_F32, &r), *w = fm_tensor_randn(2, (int64_t[]){N, K}, FM_F32, &r);
    fm_tensor *b = fm_tensor_randn(1, (int64_t[]){N}, FM_F32, &r), *q = NULL, *sc = NULL, *p = NULL, *u = NULL;
    CHECK(fm_quantize_weight_int8_range(w, 63, &q, &sc) == FM_OK && fm_pack_weight_int8(q, &p, &u) == FM_OK);
    bool in_range = q && sc;
    for (int64_t n = 0; in_range && n < N; n++) {
        const int8_t *row = (const int8_t *)fm_tensor_data(q) + n * K;
        const float *wr = (const float *)fm_tensor_data(w) + n * K;
        int big = 0;
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            big = abs(row[k]) > big ? abs(row[k]) : big;
            amax = fabsf(wr[k]) > amax ? fabsf(wr[k]) : amax;
        }
        in_range = big == 63 && ((const float *)fm_tensor_data(sc))[n] == amax / 63.0f;
    }
    CHECK_MSG(in_range, "7-bit codes: every row's largest code must be 63 with scale max |w| / 63");
    for (int relu = 0; relu < 2; relu++)
        for (int st = 0; st < 2; st++) {
            const double as = st ? 0.02 : 0.0;
            const int az = st ? 120 : 0;
            fm_tensor *y0 = fm_qlinear_int8_packed(x, p, sc, u, b, as, az, relu), *y1 = fm_qlinear_int8(x, q, sc, b, as, az);
            fm_tensor *y1r = relu && y1 ? fm_relu(y1) : NULL, *ref = relu ? y1r : y1;
            CHECK_MSG(y0 && ref && !memcmp(fm_tensor_data(y0), fm_tensor_data(ref), sizeof(float) * (size_t)(M * N)),
                      "7-bit panels (relu %d, %s) differ from the rows layout's product", relu, st ? "static" : "dynamic");
            fm_tensor_release_n(3, y0, y1, y1r);
        }
    fm_tensor *q2 = NULL, *s2 = NULL;
    CHECK(fm_quantize_weight_int8_range(w, 128, &q2, &s2) != FM_OK && !q2 && !s2);
    CHECK_ERR_CONTAINS("must be in [1, 127]");
    CHECK(fm_quantize_weight_int8_range(w, 0, &q2, &s2) != FM_OK && !q2 && !s2);
    fm_tensor_release_n(7, x, w, b, q, sc, p, u);
}

/* FM_QLINEAR_INT8_PER_ROW: each row is bitwise the per-call dynamic product of that
 * row alone (the same range, codes and epilogue), whatever rows share the call, with
 * a bias and a ReLU; a row of zeros beside large rows keeps its own (zero) range. */
static void test_per_row(void) {
    fm_rng r;
    fm_rng_init(&r, 23);
    const int64_t M = 7, N = 37, Ks[2] = {100, 301};
    for (int f = 0; f < 2; f++) {
        const int64_t K = Ks[f];
        fm_tensor *x = fm_tensor_randn(2, (int64_t[]){M, K}, FM_F32, &r), *w = fm_tensor_randn(2, (int64_t[]){N, K}, FM_F32, &r);
        fm_tensor *b = fm_tensor_randn(1, (int64_t[]){N}, FM_F32, &r), *q = NULL, *sc = NULL, *p = NULL, *u = NULL;
        CHECK(fm_quantize_weight_int8(w, &q, &sc) == FM_OK && fm_pack_weight_int8(q, &p, &u) == FM_OK);
        float *xv = fm_tensor_data(x);
        for (int64_t k = 0; k < K; k++) { xv[2 * K + k] = 0.0f; xv[5 * K + k] *= 40.0f; } /* row 2 zeros, row 5 large */
        for (int relu = 0; relu < 2; relu++) {
            fm_tensor *y = fm_qlinear_int8_packed(x, p, sc, u, b, FM_QLINEAR_INT8_PER_ROW, 0, relu);
            bool same = y != NULL;
            for (int64_t m = 0; m < M && same; m++) {
                fm_tensor *xr = fm_narrow(x, 0, m, 1), *xc = xr ? fm_contiguous(xr) : NULL;
                fm_tensor *y1 = xc ? fm_qlinear_int8_packed(xc, p, sc, u, b, 0.0, 0, relu) : NULL;
                same = y1 && !memcmp(fm_tensor_data(y1), (float *)fm_tensor_data(y) + m * N, sizeof(float) * (size_t)N);
                fm_tensor_release_n(3, xr, xc, y1);
            }
            CHECK_MSG(same, "per-row int8 (panels, relu %d): a row differs from the per-call product of that row alone", relu);
            fm_tensor_release(y);
        }
        fm_tensor_release_n(7, x, w, b, q, sc, p, u);
    }
    /* a scale that is neither >= 0 nor the per-row value is refused */
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){2, 8}, FM_F32, &r), *w = fm_tensor_randn(2, (int64_t[]){4, 8}, FM_F32, &r);
    fm_tensor *q = NULL, *sc = NULL, *p = NULL, *u = NULL;
    CHECK(fm_quantize_weight_int8(w, &q, &sc) == FM_OK && fm_pack_weight_int8(q, &p, &u) == FM_OK);
    CHECK(fm_qlinear_int8_packed(x, p, sc, u, NULL, -2.0, 0, false) == NULL);
    CHECK_ERR_CONTAINS("FM_QLINEAR_INT8_PER_ROW");
    fm_tensor_release_n(6, x, w, q, sc, p, u);
}

int main(void) {
    const int isa = test_isa_env();
    if (isa) return isa;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/fathom_test_quant.%d", (int)getpid());
    mkdir(g_tmp, 0700);
    test_modes();
    test_bad_input();
    test_loader_checks();
    test_rows_layout();
    test_dynamic_blocks();
    test_per_row();
    test_reduce_range();
    test_gpt();
    test_gelu_fusion();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    TEST_DONE();
}
