/* The meta (shape-only) device: tensors with shapes and no data, and an
 * allocator that counts what the CPU's would. The point of it is that a
 * training step run on meta reports the same memory as the same step run on
 * the CPU, byte for byte; so the main check here trains fashion-mlp,
 * fashion-cnn and a small GPT (fp32 and bf16 autocast, with and without
 * checkpointing, with accumulation) on both and compares the resident bytes,
 * the peak, every category's peak, where the peak is reached and what is left
 * at the end. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fathom/fathom.h"
#include "fathom/graph.h"
#include "fathom/quant.h"
#include "backend/meta/meta_scratch.h"
#include "plan/plan_step.h"
#include "test_util.h"

static const fm_device META = {FM_DEV_META, 0};

static void test_device(void) {
    fm_device d;
    CHECK(fm_device_parse("meta", &d) == FM_OK && d.type == FM_DEV_META && d.index == 0);
    CHECK(fm_device_count(FM_DEV_META, NULL) == 1);
    CHECK(fm_device_validate((fm_device){FM_DEV_META, 1}) == FM_ERR_INVALID);
    char b[32];
    CHECK(!strcmp(fm_device_name(META, b, sizeof b), "meta:0"));
}

/* Shapes, dtypes and errors come from the op front ends; values read back are zeros. */
static void test_ops(void) {
    fm_memory_stats s0, s1;
    CHECK(fm_memory_stats_get(META, &s0) == FM_OK);
    fm_tensor *a = fm_tensor_empty(2, (int64_t[]){3, 5}, FM_F32, META), *w = fm_tensor_empty(2, (int64_t[]){4, 5}, FM_F32, META);
    fm_tensor *y = fm_linear(a, w, NULL);
    CHECK(y && y->ndim == 2 && y->shape[0] == 3 && y->shape[1] == 4 && fm_tensor_device(y).type == FM_DEV_META);
    fm_tensor *bad = fm_matmul(a, a);
    CHECK(!bad);
    CHECK_ERR_CONTAINS("matmul");
    fm_tensor *h = y ? fm_tensor_to(y, FM_CPU) : NULL;
    CHECK(h && ((float *)fm_tensor_data(h))[0] == 0.0f && ((float *)fm_tensor_data(h))[11] == 0.0f);
    fm_tensor *b16 = fm_to_dtype(a, FM_BF16);
    CHECK(b16 && b16->dtype == FM_BF16);
    CHECK(fm_memory_stats_get(META, &s1) == FM_OK);
    /* the CPU's block sizes: 3x5 f32 = 60 B -> 64, 4x5 -> 80 -> 128, 3x4 -> 48 -> 64, 15 bf16 -> 64 */
    CHECK_MSG(s1.allocated - s0.allocated == 64 + 128 + 64 + 64, "allocated %zu", s1.allocated - s0.allocated);
    fm_tensor_release_n(5, a, w, y, h, b16);
    CHECK(fm_memory_stats_get(META, &s1) == FM_OK && s1.allocated == s0.allocated);
}

/* The peak bytes one conv2d call holds on dev (inputs, output and the kernel's scratch). */
static size_t conv_peak(fm_device dev, int64_t C, int64_t O, int64_t groups, int64_t k, int s) {
    fm_tensor *x = fm_tensor_zeros(4, (int64_t[]){2, C, 30, 33}, FM_F32, dev);
    fm_tensor *w = fm_tensor_zeros(4, (int64_t[]){O, C / groups, k, k}, FM_F32, dev);
    fm_memory_stats s0, s1;
    fm_memory_reset_peak(dev);
    CHECK(fm_memory_stats_get(dev, &s0) == FM_OK);
    fm_conv2d_params p = fm_conv2d_default_params();
    p.groups = (int)groups, p.stride[0] = p.stride[1] = s, p.padding[0] = p.padding[1] = (int)(k / 2);
    fm_tensor *y = fm_conv2d(x, w, NULL, &p);
    CHECK_MSG(y != NULL, "conv2d: %s", fm_last_error());
    CHECK(fm_memory_stats_get(dev, &s1) == FM_OK);
    fm_tensor_release_n(3, x, w, y);
    return s1.allocated_peak - s0.allocated;
}

/* The conv kernels' scratch (im2col columns; the depthwise kernel's padded planes
 * and tap offsets, per pool thread) is replayed byte for byte. */
static void test_conv_scratch(void) {
    const int64_t shapes[][5] = {{8, 16, 1, 3, 1}, {12, 12, 12, 3, 2}, {6, 12, 6, 5, 1}};
    for (int i = 0; i < 3; i++) {
        const int64_t *h = shapes[i];
        const size_t c = conv_peak(FM_CPU, h[0], h[1], h[2], h[3], (int)h[4]), m = conv_peak(META, h[0], h[1], h[2], h[3], (int)h[4]);
        CHECK_MSG(c == m && c > 0, "conv C%lld O%lld groups %lld: peak %zu on the CPU, %zu on meta", (long long)h[0],
                  (long long)h[1], (long long)h[2], c, m);
    }
}

/* Nothing is backed: a host read of meta memory faults at once. */
static void test_no_backing(void) {
    if (getenv("FATHOM_UNDER_VALGRIND")) { TEST_SKIP("the deliberate fault: valgrind reports it itself"); return; }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fm_tensor *t = fm_tensor_empty(1, (int64_t[]){16}, FM_F32, META);
        volatile float v = ((float *)fm_tensor_data(t))[3];
        (void)v;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    /* a SIGSEGV, or under a sanitizer its report and then a failing exit or, with
     * abort_on_error (as CI sets it), SIGABRT; the child exits 0 if the read works */
    CHECK_MSG((WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGABRT)) || (WIFEXITED(st) && WEXITSTATUS(st) != 0),
              "status %d", st);
}

static void same(const char *what, const plan_step_mem *c, const plan_step_mem *m) {
    CHECK_MSG(c->resident == m->resident, "%s: resident cpu %zu meta %zu", what, c->resident, m->resident);
    CHECK_MSG(c->peak == m->peak && c->peak > c->resident, "%s: peak cpu %zu meta %zu (resident %zu)", what, c->peak,
              m->peak, c->resident);
    for (int i = 0; i < FM_MEM_CAT_COUNT; i++)
        CHECK_MSG(c->peak_cat[i] == m->peak_cat[i], "%s: %s peak cpu %zu meta %zu", what, fm_mem_category_name(i),
                  c->peak_cat[i], m->peak_cat[i]);
    CHECK_MSG(c->end == 0 && m->end == 0, "%s: left at the end: cpu %zu meta %zu", what, c->end, m->end);
    CHECK_MSG(!strcmp(c->peak_at, m->peak_at), "%s: peak at '%s' (cpu) and '%s' (meta)", what, c->peak_at, m->peak_at);
    fprintf(stderr, "%-34s resident %9zu  peak %9zu  (at %s)\n", what, m->resident, m->peak, m->peak_at);
}

/* One conv layer on a batch of 64, pooled to a small head: the im2col columns
 * of its kernels are at the step's peak. */
static const char *k_conv_only =
    "[data]\ndataset = fashion-mnist\n[model]\ninput = 1 28 28\nlayer = conv2d 8 3\nlayer = avgpool2d 13\nlayer = flatten\n"
    "layer = linear 10\n[train]\nbatch = 64\n[optimizer]\nname = sgd\n";

static void recipe_case(const char *name, fm_dtype prec, fm_checkpointing ck, int accum) {
    fm_recipe r;
    fm_status ls = strcmp(name, "conv-only") ? fm_recipe_load(name, &r) : fm_recipe_parse(k_conv_only, "conv-only", &r);
    if (ls != FM_OK) { CHECK_MSG(0, "%s: %s", name, fm_last_error()); return; }
    plan_step_opts o;
    plan_step_defaults(&o);
    o.batch = r.batch_size;
    o.precision = prec;
    o.checkpointing = ck;
    o.grad_accum = accum;
    plan_step_mem c, m;
    char what[96], err[512];
    fm_status sc = plan_step_recipe(&r, &o, &c);
    snprintf(err, sizeof err, "%s", sc ? fm_last_error() : "");
    o.dev = META;
    fm_status sm = plan_step_recipe(&r, &o, &m);
    if (sc || sm) { /* what the CPU refuses, meta refuses with the same words */
        CHECK_MSG(sc == sm && !strcmp(err, fm_last_error()), "%s: cpu '%s', meta '%s'", name, err, sm ? fm_last_error() : "");
        fprintf(stderr, "%-34s refused on both: %s\n", name, err);
        fm_recipe_free(&r);
        return;
    }
    snprintf(what, sizeof what, "%s %s%s accum %d", name, fm_dtype_name(prec), ck ? " blocks" : "", accum);
    same(what, &c, &m);
    fm_recipe_free(&r);
}

static void gpt_case(fm_dtype prec, fm_checkpointing ck, int accum) {
    fm_gpt_train_opts go = fm_gpt_train_defaults();
    go.model = fm_gpt_config_default(FM_GPT_GPT2);
    go.model.n_layer = 2;
    go.model.n_head = 2;
    go.model.n_embd = 64;
    go.model.ffn_hidden = 256;
    go.model.block_size = 32;
    go.model.vocab_size = 96;
    go.model.dropout = 0.1;
    plan_step_opts o;
    plan_step_defaults(&o);
    o.batch = 4;
    o.precision = prec;
    o.checkpointing = ck;
    o.grad_accum = accum;
    o.finish = true;
    plan_step_mem c, m;
    CHECK_MSG(plan_step_gpt(&go, &o, &c) == FM_OK, "gpt cpu: %s", fm_last_error());
    o.dev = META;
    CHECK_MSG(plan_step_gpt(&go, &o, &m) == FM_OK, "gpt meta: %s", fm_last_error());
    static const char *ckn[] = {"", " blocks", " selective"};
    char what[96];
    snprintf(what, sizeof what, "gpt %s%s accum %d", fm_dtype_name(prec), ckn[ck], accum);
    same(what, &c, &m);
}

/* An inference graph (fashion-cnn traced, and compiled: conv2d_fused with its kernels'
 * scratch replayed, linear_fused, the packed weights) run by plan_step_graph on the CPU and
 * on meta: the run's peak above what it starts with, where it falls, the FLOPs and bytes its
 * kernels count and the outputs' bytes are the same (`fathom plan --model GRAPH` reports the
 * meta run). */
/* The graph cases: traced, compiled, and the compiled graph quantized (int8 dynamic: qconv2d_int8
 * and qlinear_int8 with their activation codes' scratch; int8 static; int4 weights). */
enum { G_TRACED, G_COMPILED, G_INT8_DYNAMIC, G_INT8_STATIC, G_INT4 };
static const char *const k_graph_case[] = {"fashion-cnn graph", "fashion-cnn graph, compiled", "fashion-cnn graph, int8 dynamic",
                                           "fashion-cnn graph, int8 static", "fashion-cnn graph, int4"};

static fm_graph *quantized(fm_graph *g, int mode) {
    fm_quant_options o;
    fm_quant_options_init(&o);
    o.mode = mode == G_INT8_DYNAMIC ? FM_QUANT_INT8_DYNAMIC : mode == G_INT8_STATIC ? FM_QUANT_INT8_STATIC : FM_QUANT_INT4;
    fm_rng rng;
    fm_rng_init(&rng, 3);
    fm_tensor *cal = mode == G_INT8_STATIC ? fm_tensor_randn(4, (int64_t[]){8, 1, 28, 28}, FM_F32, &rng) : NULL;
    o.calib = cal;
    fm_graph *q = fm_graph_quantize(g, &o, NULL);
    fm_tensor_release(cal);
    fm_graph_free(g);
    return q;
}

static void graph_case(int mode) {
    const bool compiled = mode != G_TRACED;
    fm_recipe r;
    if (fm_recipe_load("fashion-cnn", &r) != FM_OK) { CHECK_MSG(0, "fashion-cnn: %s", fm_last_error()); return; }
    fm_rng rng;
    fm_rng_init(&rng, 1);
    fm_module *m = fm_recipe_build_model(&r, &rng);
    fm_tensor *ex = fm_tensor_zeros(4, (int64_t[]){2, 1, 28, 28}, FM_F32, FM_CPU);
    fm_graph *g[2] = {0};
    for (int d = 0; d < 2 && m; d++) {
        fm_module_train(m, false);
        fm_graph *t = fm_graph_trace_module(m, ex);
        fm_compile_report rep;
        g[d] = compiled && t && fm_graph_validate(t) == FM_OK ? fm_graph_compile(t, &rep) : t;
        if (compiled) fm_graph_free(t);
        if (g[d] && mode > G_COMPILED) g[d] = quantized(g[d], mode);
    }
    CHECK_MSG(g[0] && g[1], "fashion-cnn graph: %s", fm_last_error());
    const int64_t shapes[1][FM_MAX_DIMS] = {{16, 1, 28, 28}};
    plan_step_mem c, mm;
    double fc = 0, bc = 0, fmeta = 0, bmeta = 0;
    size_t oc = 0, om = 0;
    plan_step_opts o;
    plan_step_defaults(&o);
    if (g[0] && g[1]) {
        CHECK_MSG(plan_step_graph(g[0], shapes, &o, &c, &fc, &bc, &oc) == FM_OK, "graph cpu: %s", fm_last_error());
        o.dev = META;
        CHECK_MSG(plan_step_graph(g[1], shapes, &o, &mm, &fmeta, &bmeta, &om) == FM_OK, "graph meta: %s", fm_last_error());
        const size_t rc = c.peak - c.resident, rm = mm.peak - mm.resident;
        CHECK_MSG(rc == rm && rc > 0, "%s: run peak cpu %zu meta %zu", k_graph_case[mode], rc, rm);
        CHECK_MSG(!strcmp(c.peak_at, mm.peak_at), "graph: peak at '%s' (cpu) and '%s' (meta)", c.peak_at, mm.peak_at);
        CHECK_MSG(fc == fmeta && bc == bmeta && fc > 2.0 * 16 * 400000, "%s: flops cpu %.0f meta %.0f, bytes cpu %.0f meta %.0f",
                  k_graph_case[mode], fc, fmeta, bc, bmeta);
        /* at the end meta still holds the weights the graph moved there; nothing else is left */
        CHECK_MSG(oc == om && oc > 0 && c.end == 0 && mm.end == mm.resident - mm.batch, "graph: outputs cpu %zu meta %zu, left %zu / %zu",
                  oc, om, c.end, mm.end);
        fprintf(stderr, "%-34s run peak %9zu meta, %9zu cpu  (at %s), %.3g GFLOP\n", k_graph_case[mode], rm, rc, mm.peak_at, fmeta / 1e9);
    }
    fm_graph_free(g[0]);
    fm_graph_free(g[1]);
    fm_tensor_release(ex);
    fm_module_free(m);
    fm_recipe_free(&r);
}

/* Without the kernels' scratch the peaks differ: the comparison above can fail,
 * and the scratch replay is what makes it pass (conv's im2col columns; bf16
 * attention's f32 copies). */
static void test_scratch_matters(void) {
    fm_meta_count_scratch(false);
    EXPECT_CHECK_FAILS(recipe_case("conv-only", FM_F32, FM_CKPT_NONE, 1));
    EXPECT_CHECK_FAILS(gpt_case(FM_BF16, FM_CKPT_SELECTIVE, 1));
    fm_meta_count_scratch(true);
}

int main(void) {
    test_device();
    test_ops();
    test_conv_scratch();
    test_no_backing();
    recipe_case("fashion-mlp", FM_F32, FM_CKPT_NONE, 1);
    recipe_case("fashion-mlp", FM_BF16, FM_CKPT_NONE, 2);
    recipe_case("fashion-cnn", FM_F32, FM_CKPT_NONE, 1);
    recipe_case("conv-only", FM_F32, FM_CKPT_NONE, 1);
    recipe_case("fashion-cnn", FM_BF16, FM_CKPT_NONE, 1);
    recipe_case("fashion-cnn", FM_F32, FM_CKPT_BLOCKS, 2);
    for (int p = 0; p < 2; p++)
        for (int ck = 0; ck < 3; ck++) gpt_case(p ? FM_BF16 : FM_F32, (fm_checkpointing)ck, 1);
    gpt_case(FM_BF16, FM_CKPT_NONE, 2);
    for (int mode = G_TRACED; mode <= G_INT4; mode++) graph_case(mode);
    test_scratch_matters();
    TEST_DONE();
}
