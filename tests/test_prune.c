/* Pruning (fathom/prune.h) on a small CNN trained here on synthetic 8x8 images:
 *  - channels: the shrunk model (conv channels, batch norm entries, the next
 *    conv's and the flattened linear's inputs, MLP neurons removed) gives the
 *    outputs of the masked original (the same channels zeroed) within 1e-6, per
 *    layer and global; its recipe names the new sizes and it reloads from disk;
 *  - unstructured: exactly round(S * n) weights of each layer (or of all, global)
 *    are zero and the masks say which;
 *  - masks survive fine-tuning: after fm_prune_dir --finetune and a further
 *    `train --resume`, every masked weight is still exactly zero while the
 *    others moved;
 *  - bad input: sparsity outside [0, 1), output over the input or over a
 *    non-empty directory, a GPT directory, a graph directory, a model without a
 *    prunable layer: a clear error and nothing written. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "fathom/autograd.h"
#include "fathom/io.h"
#include "fathom/prune.h"

#include "synth_idx.h"

static char dir[256];

/* 4 classes of 8x8 images: a bright 4x4 quadrant (the class) on noise. */
static void make_split(const char *name, int n, uint32_t seed) { synth_quadrants(dir, name, n, seed); }

static char recipe_text[4096];

static void make_recipe(const char *layers) {
    snprintf(recipe_text, sizeof recipe_text,
             "[data]\ndataset = idx\ntrain_images = %s/train-images\ntrain_labels = %s/train-labels\n"
             "test_images = %s/test-images\ntest_labels = %s/test-labels\nnormalize = 0.3 0.25\nworkers = 1\n"
             "[model]\ninput = 1 8 8\n%s"
             "[train]\nepochs = 1\nbatch = 32\nseed = 5\n[optimizer]\nname = adamw\nlr = 0.01\n",
             dir, dir, dir, dir, layers);
}

static const char *cnn_layers =
    "layer = conv2d 8 3 padding=1\n"
    "layer = batchnorm2d\n"
    "layer = relu\n"
    "layer = conv2d 8 3 padding=1\n"
    "layer = batchnorm2d\n"
    "layer = relu\n"
    "layer = maxpool2d 2\n"
    "layer = flatten\n"
    "layer = linear 12\n"
    "layer = relu\n"
    "layer = dropout 0.1\n"
    "layer = linear 4\n";

/* Trains the recipe for `steps` into dir/<name> (BatchNorm statistics and weights away from their init). */
static void train_model(const char *name, int steps) {
    fm_recipe r;
    CHECK(fm_recipe_parse(recipe_text, "prune-test.ini", &r) == FM_OK);
    fm_train_options o;
    fm_train_options_init(&o);
    char out[300];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    o.out_dir = out;
    o.steps = steps;
    o.skip_eval = true;
    fm_train_result res;
    CHECK_MSG(fm_train(&r, &o, &res) == FM_OK, "%s", fm_last_error());
    fm_train_result_free(&res);
    fm_recipe_free(&r);
}

static fm_tensor *forward(fm_module *m, fm_tensor *x) {
    bool prev = fm_set_grad_enabled(false);
    fm_module_train(m, false);
    fm_tensor *y = fm_module_forward(m, x);
    fm_set_grad_enabled(prev);
    return y;
}

static double max_abs_diff(fm_tensor *a, fm_tensor *b, double *scale) {
    double d = 0;
    *scale = 0;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) {
        d = fmax(d, fabs(fm_tensor_get(a, i) - fm_tensor_get(b, i)));
        *scale = fmax(*scale, fabs(fm_tensor_get(a, i)));
    }
    return d;
}

static fm_tensor *state_tensor(fm_module *m, const char *name) {
    fm_named_list s;
    fm_tensor *t = NULL;
    if (fm_module_state(m, &s) == FM_OK) {
        int k = fm_named_list_find(&s, name);
        if (k >= 0) t = s.items[k].tensor;
        fm_named_list_free(&s);
    }
    return t;
}

static void test_channels(bool global) {
    char path[300];
    snprintf(path, sizeof path, "%s/base", dir);
    fm_recipe r, pr, mr;
    fm_module *m = NULL, *shrunk = NULL, *masked = NULL;
    CHECK(fm_model_load(path, &r, &m) == FM_OK);
    fm_prune_options o;
    fm_prune_options_init(&o);
    o.kind = FM_PRUNE_CHANNELS;
    o.sparsity = 0.5;
    o.global = global;
    fm_prune_report rep, rep2;
    fm_named_list masks, masks2;
    CHECK_MSG(fm_prune_classifier(&r, m, &o, &pr, &shrunk, &masks, &rep) == FM_OK, "%s", fm_last_error());
    o.keep_shape = true;
    CHECK(fm_prune_classifier(&r, m, &o, &mr, &masked, &masks2, &rep2) == FM_OK);
    if (!shrunk || !masked) return;
    CHECK(masks.n == 0 && masks2.n == 0);
    /* three groups: conv0 -> conv3, conv3 -> (flatten) linear8, linear8 -> linear11 */
    CHECK_MSG(rep.n_layers == 3, "%d groups", rep.n_layers);
    int64_t kept = 0;
    for (int i = 0; i < rep.n_layers; i++) kept += rep.layers[i].after;
    if (!global)
        for (int i = 0; i < rep.n_layers; i++) CHECK(rep.layers[i].after * 2 == rep.layers[i].before);
    else
        CHECK_MSG(kept == 14, "global: kept %lld of 28", (long long)kept); /* round(0.5 * 28) removed */
    CHECK(rep.params_after < rep.params_before / 2 + 200);
    CHECK(rep2.params_after == rep2.params_before); /* masked: same shapes */
    fm_tensor *w0 = state_tensor(shrunk, "0.weight"), *bn = state_tensor(shrunk, "1.running_var"),
              *w8 = state_tensor(shrunk, "8.weight");
    CHECK(w0 && w0->shape[0] == rep.layers[0].after && w0->shape[1] == 1);
    CHECK(bn && bn->shape[0] == rep.layers[0].after);
    /* the linear after flatten reads 4x4 features per kept channel of conv3 */
    CHECK(w8 && w8->shape[0] == rep.layers[2].after && w8->shape[1] == rep.layers[1].after * 16);
    CHECK(strstr(pr.text, "; pruned: was conv2d 8 3 padding=1") != NULL);

    /* outputs: shrunk == masked original, and both differ from the unpruned model */
    int64_t xs[4] = {5, 1, 8, 8};
    fm_rng g;
    fm_rng_init(&g, 3);
    fm_tensor *x = fm_tensor_randn(4, xs, FM_F32, &g);
    fm_tensor *ya = forward(shrunk, x), *yb = forward(masked, x), *yo = forward(m, x);
    double scale, d = max_abs_diff(ya, yb, &scale), s2, d0 = max_abs_diff(yo, yb, &s2);
    CHECK_MSG(d <= 1e-6 * fmax(1, scale), "shrunk vs masked: max diff %g (scale %g)", d, scale);
    CHECK_MSG(d0 > 1e-3, "pruning changed nothing? %g", d0);

    /* written and loaded back: the same model (eval/predict/compile go through fm_model_load) */
    snprintf(path, sizeof path, "%s/shrunk-%d", dir, global);
    CHECK_MSG(fm_prune_save(path, &pr, shrunk, &masks) == FM_OK, "%s", fm_last_error());
    fm_recipe lr;
    fm_module *lm = NULL;
    CHECK_MSG(fm_model_load(path, &lr, &lm) == FM_OK, "%s", fm_last_error());
    if (lm) {
        fm_tensor *yl = forward(lm, x);
        CHECK(max_abs_diff(ya, yl, &scale) == 0);
        fm_tensor_release(yl);
        fm_module_free(lm);
        fm_recipe_free(&lr);
    }
    fm_tensor_release_n(4, x, ya, yb, yo);
    fm_module_free(shrunk);
    fm_module_free(masked);
    fm_module_free(m);
    fm_recipe_free(&pr);
    fm_recipe_free(&mr);
    fm_recipe_free(&r);
}

static int64_t zeros_of(fm_tensor *t) {
    int64_t z = 0;
    for (int64_t i = 0; i < fm_tensor_numel(t); i++) z += fm_tensor_get(t, i) == 0;
    return z;
}

static void test_unstructured(bool global) {
    char path[300];
    snprintf(path, sizeof path, "%s/base", dir);
    fm_recipe r, pr;
    fm_module *m = NULL, *p = NULL;
    CHECK(fm_model_load(path, &r, &m) == FM_OK);
    fm_prune_options o;
    fm_prune_options_init(&o);
    o.sparsity = 0.3;
    o.global = global;
    fm_prune_report rep;
    fm_named_list masks;
    CHECK_MSG(fm_prune_classifier(&r, m, &o, &pr, &p, &masks, &rep) == FM_OK, "%s", fm_last_error());
    if (!p) return;
    static const char *const names[] = {"0.weight", "3.weight", "8.weight", "11.weight"};
    CHECK(masks.n == 4);
    int64_t total = 0, zeros = 0;
    double max_pruned = 0, min_kept = INFINITY;
    for (int i = 0; i < 4; i++) {
        fm_tensor *w = state_tensor(p, names[i]), *w0 = state_tensor(m, names[i]);
        int k = fm_named_list_find(&masks, names[i]);
        CHECK(w && w0 && k >= 0);
        if (!w || !w0 || k < 0) continue;
        fm_tensor *mk = masks.items[k].tensor;
        int64_t n = fm_tensor_numel(w), z = zeros_of(w);
        CHECK(zeros_of(mk) == z); /* the mask says which are zero */
        if (!global) CHECK_MSG(z == (int64_t)llround(0.3 * (double)n), "%s: %lld zeros of %lld", names[i], (long long)z, (long long)n);
        for (int64_t j = 0; j < n; j++) {
            double a = fabs(fm_tensor_get(w0, j));
            if (fm_tensor_get(mk, j) == 0) { max_pruned = fmax(max_pruned, a); CHECK(fm_tensor_get(w, j) == 0); }
            else { min_kept = fmin(min_kept, a); CHECK(fm_tensor_get(w, j) == fm_tensor_get(w0, j)); }
        }
        total += n;
        zeros += z;
    }
    if (global) CHECK_MSG(zeros == (int64_t)llround(0.3 * (double)total), "%lld zeros of %lld", (long long)zeros, (long long)total);
    if (global) CHECK(max_pruned <= min_kept); /* one threshold over every layer */
    CHECK(rep.zeros_after - rep.zeros_before == zeros);
    fm_named_list_free(&masks);
    fm_module_free(p);
    fm_module_free(m);
    fm_recipe_free(&pr);
    fm_recipe_free(&r);
}

/* Masks through fine-tuning and a later resume: pruned weights stay exactly zero. */
static void test_finetune_keeps_masks(void) {
    char in[300], out[300];
    snprintf(in, sizeof in, "%s/base", dir);
    snprintf(out, sizeof out, "%s/sparse-ft", dir);
    fm_prune_options o;
    fm_prune_options_init(&o);
    o.sparsity = 0.6;
    fm_train_options to;
    fm_train_options_init(&to);
    to.skip_eval = false;
    fm_prune_report rep;
    fm_train_result tr;
    CHECK_MSG(fm_prune_dir(in, out, &o, 8, &to, &rep, &tr) == FM_OK, "%s", fm_last_error());
    CHECK(tr.steps == 8 && tr.test_accuracy >= 0);
    fm_train_result_free(&tr);
    fm_named_list masks;
    bool found = false;
    CHECK(fm_masks_load(out, &masks, &found) == FM_OK && found && masks.n == 4);
    /* and 8 more steps with `train --resume` (the masks come from the directory) */
    fm_recipe r, r0;
    fm_module *m = NULL, *m0 = NULL;
    CHECK(fm_model_load(out, &r, &m) == FM_OK && fm_model_load(in, &r0, &m0) == FM_OK);
    fm_train_options ro;
    fm_train_options_init(&ro);
    ro.resume_dir = out;
    ro.steps = 16;
    ro.skip_eval = true;
    CHECK_MSG(fm_train(&r, &ro, &tr) == FM_OK, "%s", fm_last_error());
    CHECK(tr.steps == 16);
    fm_train_result_free(&tr);
    fm_module *m2 = NULL;
    fm_recipe r2;
    CHECK(fm_model_load(out, &r2, &m2) == FM_OK);
    int64_t masked = 0, moved = 0, kept = 0;
    for (int i = 0; m2 && m0 && i < masks.n; i++) {
        fm_tensor *mk = masks.items[i].tensor, *w = state_tensor(m2, masks.items[i].name),
                  *w0 = state_tensor(m0, masks.items[i].name);
        for (int64_t j = 0; w && w0 && j < fm_tensor_numel(w); j++) {
            if (fm_tensor_get(mk, j) == 0) { masked++; CHECK(fm_tensor_get(w, j) == 0); }
            else { kept++; moved += fm_tensor_get(w, j) != fm_tensor_get(w0, j); }
        }
    }
    CHECK(masked > 0 && kept > 0);
    CHECK_MSG(moved > kept / 2, "fine-tuning moved %lld of %lld kept weights", (long long)moved, (long long)kept);
    fm_named_list_free(&masks);
    fm_module_free(m);
    fm_module_free(m0);
    fm_module_free(m2);
    if (m) fm_recipe_free(&r);
    if (m0) fm_recipe_free(&r0);
    if (m2) fm_recipe_free(&r2);

    /* channels + fine-tuning: a smaller model that trains and reloads */
    snprintf(out, sizeof out, "%s/small-ft", dir);
    o.kind = FM_PRUNE_CHANNELS;
    o.sparsity = 0.5;
    CHECK_MSG(fm_prune_dir(in, out, &o, 6, &to, &rep, &tr) == FM_OK, "%s", fm_last_error());
    CHECK(tr.steps == 6 && tr.num_params == rep.params_after);
    fm_train_result_free(&tr);
    CHECK(fm_model_load(out, &r, &m) == FM_OK);
    if (m) { CHECK(fm_module_num_params(m) == rep.params_after); fm_module_free(m); fm_recipe_free(&r); }
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void test_bad_input(void) {
    char in[300], out[300], p[400];
    snprintf(in, sizeof in, "%s/base", dir);
    snprintf(out, sizeof out, "%s/never", dir);
    fm_prune_options o;
    fm_prune_options_init(&o);
    fm_prune_report rep;
    double bad[] = {1.0, -0.1, NAN, 2};
    for (int i = 0; i < 4; i++) {
        o.sparsity = bad[i];
        CHECK(fm_prune_dir(in, out, &o, 0, NULL, &rep, NULL) != FM_OK);
        CHECK_ERR_CONTAINS("outside [0, 1)");
        CHECK(!exists(out));
    }
    o.sparsity = 0.5;
    CHECK(fm_prune_dir(in, in, &o, 0, NULL, &rep, NULL) != FM_OK); /* over the input */
    CHECK_ERR_CONTAINS("is the input model");
    snprintf(p, sizeof p, "%s/model.safetensors", in);
    CHECK(exists(p));
    snprintf(out, sizeof out, "%s/sparse-ft", dir); /* a directory with files */
    CHECK(fm_prune_dir(in, out, &o, 0, NULL, &rep, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("not an empty directory");
    /* a GPT directory and a graph directory */
    snprintf(p, sizeof p, "%s/gpt", dir);
    mkdir(p, 0755);
    snprintf(out, sizeof out, "%s/gpt/config.json", dir);
    FILE *f = fopen(out, "w");
    if (f) { fputs("{}", f); fclose(f); }
    snprintf(out, sizeof out, "%s/never", dir);
    CHECK(fm_prune_dir(p, out, &o, 0, NULL, &rep, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("GPT model");
    snprintf(p, sizeof p, "%s/graph", dir);
    mkdir(p, 0755);
    snprintf(out, sizeof out, "%s/graph/graph.json", dir);
    f = fopen(out, "w");
    if (f) { fputs("{}", f); fclose(f); }
    snprintf(out, sizeof out, "%s/never", dir);
    CHECK(fm_prune_dir(p, out, &o, 0, NULL, &rep, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("inference graph");
    snprintf(p, sizeof p, "%s/missing", dir);
    CHECK(fm_prune_dir(p, out, &o, 0, NULL, &rep, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("no such model directory");
    /* a model whose only linear layer is the classifier: no channel can go */
    make_recipe("layer = flatten\nlayer = linear 4\n");
    train_model("linear", 2);
    snprintf(p, sizeof p, "%s/linear", dir);
    o.kind = FM_PRUNE_CHANNELS;
    CHECK(fm_prune_dir(p, out, &o, 0, NULL, &rep, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("no layer's channels can be removed");
    /* channel pruning of a model that already carries unstructured masks */
    snprintf(p, sizeof p, "%s/sparse-ft", dir);
    CHECK(fm_prune_dir(p, out, &o, 0, NULL, &rep, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("unstructured masks");
    CHECK(!exists(out));
    snprintf(p, sizeof p, "%s/never.tmp.%ld", dir, (long)getpid());
    CHECK(!exists(p));
}

/* ---- GPT heads and MLP neurons ---- */

static fm_tensor *gpt_param(fm_gpt *m, const char *name) {
    const fm_named_list *ps = fm_gpt_parameters(m);
    int k = fm_named_list_find(ps, name);
    return k >= 0 ? ps->items[k].tensor : NULL;
}

/* zero columns [c0, c0 + n) of every block's `what` weight (a [rows, cols] parameter) */
static void zero_cols(fm_gpt *m, const char *what, int64_t c0, int64_t n) {
    char name[96];
    for (int l = 0; l < fm_gpt_get_config(m)->n_layer; l++) {
        snprintf(name, sizeof name, "h.%d.%s", l, what);
        fm_tensor *w = gpt_param(m, name);
        CHECK(w != NULL);
        if (!w) continue;
        fm_tensor *cols = fm_narrow(w, 1, c0, n);
        CHECK(cols && fm_fill_(cols, 0.0) == FM_OK);
        fm_tensor_release(cols);
    }
}

static double logits_rel_err(fm_gpt *a, fm_gpt *b) {
    int64_t ids[2 * 10], shape[2] = {2, 10};
    for (int i = 0; i < 20; i++) ids[i] = (i * 5 + 1) % 48;
    fm_tensor *x = fm_tensor_from_data(ids, 2, shape, FM_I64);
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *la = fm_gpt_forward(a, x, NULL, NULL), *lb = fm_gpt_forward(b, x, NULL, NULL);
    fm_set_grad_enabled(prev);
    double num = 0, den = 0;
    int64_t n = la && lb && fm_tensor_numel(la) == fm_tensor_numel(lb) ? fm_tensor_numel(la) : 0;
    float *pa = malloc(sizeof(float) * (size_t)(n + 1)), *pb = malloc(sizeof(float) * (size_t)(n + 1));
    if (n) { fm_tensor_copy_to_host(la, pa, FM_F32); fm_tensor_copy_to_host(lb, pb, FM_F32); }
    for (int64_t i = 0; i < n; i++) { num += (pa[i] - pb[i]) * (double)(pa[i] - pb[i]); den += (double)pa[i] * pa[i]; }
    free(pa);
    free(pb);
    fm_tensor_release_n(3, x, la, lb);
    return n && den > 0 ? sqrt(num / den) : 1e9;
}

/* A head (GPT-2) or kv group (Llama) whose output-projection columns are zero scores 0, so
 * pruning one of four (one of two groups) removes exactly it: the pruned model computes
 * the same logits. The same for MLP neurons whose output columns are zero. */
/* qkv_bias: a Llama with biases on q, k and v (Qwen2's), random like the rest */
static void test_gpt(fm_gpt_arch arch, bool qkv_bias) {
    const bool llama = arch == FM_GPT_LLAMA;
    fm_gpt_config c = fm_gpt_config_default(arch);
    c.qkv_bias = qkv_bias;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = llama ? 2 : 4;
    c.n_embd = 32;
    c.block_size = 16;
    c.vocab_size = 48;
    c.ffn_hidden = 64;
    fm_rng r;
    fm_rng_init(&r, 5);
    fm_gpt *m = fm_gpt_new(&c, &r);
    CHECK(m != NULL);
    if (!m) return;
    const fm_named_list *ps = fm_gpt_parameters(m);
    for (int i = 0; i < ps->n; i++) fm_tensor_normal_(ps->items[i].tensor, 0, 0.2, &r); /* biases too */
    zero_cols(m, "attn.proj.weight", llama ? 16 : 8, llama ? 16 : 8); /* head 1 / kv group 1 (heads 2, 3) */
    zero_cols(m, "mlp.proj.weight", 16, 16);                            /* neurons 16..31 */
    fm_prune_options o;
    fm_prune_options_init(&o);
    o.kind = FM_PRUNE_HEADS;
    o.sparsity = llama ? 0.5 : 0.25;
    fm_gpt *p = NULL;
    fm_prune_report rep;
    CHECK_MSG(fm_prune_gpt(m, &o, &p, &rep) == FM_OK, "%s", fm_last_error());
    if (p) {
        const fm_gpt_config *pc = fm_gpt_get_config(p);
        CHECK(pc->n_head == (llama ? 2 : 3) && pc->n_kv_head == (llama ? 1 : 3) && fm_gpt_head_dim(pc) == 8);
        CHECK(rep.n_layers == 2 && rep.layers[1].before == 4 && rep.layers[1].after == pc->n_head);
        CHECK(rep.params_after == fm_gpt_num_params(p) && rep.params_after < rep.params_before);
        double e = logits_rel_err(m, p);
        CHECK_MSG(e < 1e-5, "%s heads: the pruned model's logits differ by %g", llama ? "llama" : "gpt2", e);
        fm_gpt_free(p);
    }
    o.kind = FM_PRUNE_CHANNELS;
    o.sparsity = 0.25;
    CHECK_MSG(fm_prune_gpt(m, &o, &p, &rep) == FM_OK, "%s", fm_last_error());
    if (p) {
        CHECK(fm_gpt_get_config(p)->ffn_hidden == 48 && rep.layers[0].after == 48);
        double e = logits_rel_err(m, p);
        CHECK_MSG(e < 1e-5, "%s neurons: the pruned model's logits differ by %g", llama ? "llama" : "gpt2", e);
        fm_gpt_free(p);
    }
    /* pruning live units does change the function (the checks above can fail): half the
     * heads of GPT-2 (one of them live), half the neurons (16 of them live) */
    o.kind = llama ? FM_PRUNE_CHANNELS : FM_PRUNE_HEADS;
    o.sparsity = 0.5;
    CHECK(fm_prune_gpt(m, &o, &p, NULL) == FM_OK && p);
    if (p) { CHECK(logits_rel_err(m, p) > 1e-3); fm_gpt_free(p); }
    /* what cannot be done is refused by name */
    o.kind = FM_PRUNE_UNSTRUCTURED;
    CHECK(fm_prune_gpt(m, &o, &p, NULL) != FM_OK && !p);
    CHECK_ERR_CONTAINS("unstructured pruning of GPT models is not built");
    o.kind = FM_PRUNE_HEADS;
    o.global = true;
    CHECK(fm_prune_gpt(m, &o, &p, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("--global is not possible for a GPT");
    fm_gpt_free(m);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fathom_test_prune_%ld", (long)getpid());
    mkdir(dir, 0755);
    make_split("train", 128, 1);
    make_split("test", 64, 2);
    make_recipe(cnn_layers);
    train_model("base", 12);
    test_channels(false);
    test_channels(true);
    test_unstructured(false);
    test_unstructured(true);
    test_finetune_keeps_masks();
    test_bad_input();
    test_gpt(FM_GPT_GPT2, false);
    test_gpt(FM_GPT_LLAMA, false);
    test_gpt(FM_GPT_LLAMA, true);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    TEST_DONE();
}
