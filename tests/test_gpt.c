/* GPT tests: fathom's transformer against PyTorch step by step (fixtures from
 * tools/make_gpt_fixtures.py: logits, loss, every gradient at step 0 and the
 * losses of 10 AdamW steps, for the GPT-2 and the Llama variant), Hugging Face
 * weight round trips, KV-cache generation equal to uncached generation, token
 * files and the bad-input errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/io.h"
#include "fathom/optim.h"
#include "fathom/profile.h" /* which ops the fused forward runs */
#include "gpt/gpt_internal.h" /* the HF name table, to lay gradients out as PyTorch does */
#include "test_util.h"

static const char *fixture(const char *name, char *buf, size_t n) {
    const char *root = getenv("FATHOM_SOURCE_DIR");
    snprintf(buf, n, "%s/tests/fixtures/gpt/%s", root ? root : ".", name);
    return buf;
}

/* ||a - b|| / ||b|| over the whole tensor (both read as f64). */
static double rel_err(const fm_tensor *a, const fm_tensor *b) {
    int64_t n = fm_tensor_numel(b);
    if (fm_tensor_numel(a) != n) return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fm_tensor_get(a, i), y = fm_tensor_get(b, i);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
}

static fm_gpt_config tiny_config(fm_gpt_arch arch) {
    fm_gpt_config c = fm_gpt_config_default(arch);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 32;
    c.block_size = 16;
    c.vocab_size = 64;
    c.ffn_hidden = arch == FM_GPT_LLAMA ? 96 : 128;
    c.n_kv_head = arch == FM_GPT_LLAMA ? 2 : 4;
    c.dropout = 0;
    return c;
}

static fm_tensor *hf_grad_view(const gpt_hf_entry *e) {
    if (!e->t->grad) return NULL;
    fm_tensor *t = fm_narrow(e->t->grad, 0, e->row0, e->rows);
    if (t && e->transpose) {
        fm_tensor *tt = fm_transpose(t, 0, 1);
        fm_tensor_release(t);
        t = tt;
    }
    return t;
}

static const fm_tensor *ref_get(const fm_named_list *l, const char *name) {
    int i = fm_named_list_find(l, name);
    return i >= 0 ? l->items[i].tensor : NULL;
}

static void test_vs_pytorch(fm_gpt_arch arch, const char *variant) {
    char p1[512], p2[512], nm[200];
    snprintf(nm, sizeof nm, "%s_init.safetensors", variant);
    fixture(nm, p1, sizeof p1);
    snprintf(nm, sizeof nm, "%s_ref.safetensors", variant);
    fixture(nm, p2, sizeof p2);
    fm_gpt_config cfg = tiny_config(arch);
    fm_gpt *m = fm_gpt_new(&cfg, NULL);
    CHECK(m != NULL);
    if (!m) return;
    CHECK_MSG(fm_gpt_load_hf(m, p1) == FM_OK, "%s", fm_last_error());
    fm_named_list ref;
    memset(&ref, 0, sizeof ref);
    CHECK_MSG(fm_safetensors_load(p2, &ref, NULL) == FM_OK, "%s", fm_last_error());
    const fm_tensor *X = ref_get(&ref, "x"), *Y = ref_get(&ref, "y"), *losses = ref_get(&ref, "losses");
    CHECK(X && Y && losses);
    if (!X || !Y || !losses) { fm_named_list_free(&ref); fm_gpt_free(m); return; }

    /* step 0: logits, loss and every gradient */
    fm_tensor *x0 = fm_select((fm_tensor *)X, 0, 0), *y0 = fm_select((fm_tensor *)Y, 0, 0), *loss = NULL;
    fm_tensor *logits = fm_gpt_forward(m, x0, y0, &loss);
    CHECK_MSG(logits && loss, "%s", fm_last_error());
    if (logits && loss) {
        double e = rel_err(logits, ref_get(&ref, "logits"));
        CHECK_MSG(e < 1e-4, "%s logits rel err %g", variant, e);
        double l = fm_tensor_item(loss), lr = fm_tensor_item(ref_get(&ref, "loss"));
        CHECK_MSG(fabs(l - lr) <= 1e-5 * fabs(lr), "%s loss %.8f vs torch %.8f", variant, l, lr);
        CHECK(fm_backward(loss, NULL, false) == FM_OK);
        double worst = 0;
        const char *worst_name = "";
        for (int i = 0; i < m->n_hf; i++) {
            snprintf(nm, sizeof nm, "grad.%s", m->hf[i].name);
            const fm_tensor *g = ref_get(&ref, nm);
            fm_tensor *mine = hf_grad_view(&m->hf[i]);
            CHECK_MSG(g && mine, "%s: no gradient for %s", variant, m->hf[i].name);
            if (g && mine) {
                double ge = rel_err(mine, g);
                CHECK_MSG(ge < 1e-4, "%s grad %s rel err %g", variant, m->hf[i].name, ge);
                if (ge > worst) { worst = ge; worst_name = m->hf[i].name; }
            }
            fm_tensor_release(mine);
        }
        fprintf(stderr, "%s: logits rel err %.2e, worst grad rel err %.2e (%s)\n", variant, e, worst, worst_name);
    }
    fm_tensor_release_n(4, x0, y0, logits, loss);

    /* 10 AdamW steps: decay on 2-D tensors only, clipping at 1.0, as the script does */
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    oc.lr = 3e-3;
    oc.beta1 = 0.9;
    oc.beta2 = 0.95;
    oc.eps = 1e-8;
    oc.weight_decay = 0.1;
    fm_optim *opt = fm_optim_new(&oc);
    int gd = fm_optim_add_group(opt, 0.1), gn = fm_optim_add_group(opt, 0.0);
    const fm_named_list *ps = fm_gpt_parameters(m);
    for (int i = 0; i < ps->n; i++)
        fm_optim_add_param(opt, ps->items[i].tensor->ndim >= 2 ? gd : gn, ps->items[i].name, ps->items[i].tensor);
    double worst = 0;
    for (int s = 0; s < 10; s++) {
        fm_optim_zero_grad(opt);
        fm_tensor *xs = fm_select((fm_tensor *)X, 0, s), *ys = fm_select((fm_tensor *)Y, 0, s), *ls = NULL;
        fm_tensor *lg = fm_gpt_forward(m, xs, ys, &ls);
        CHECK(lg && ls);
        if (!ls) { fm_tensor_release_n(3, xs, ys, lg); break; }
        double l = fm_tensor_item(ls), lr = fm_tensor_get(losses, s);
        double rel = fabs(l - lr) / fabs(lr);
        if (rel > worst) worst = rel;
        CHECK_MSG(rel <= 1e-5, "%s step %d loss %.8f vs torch %.8f (rel %g)", variant, s, l, lr, rel);
        CHECK(fm_backward(ls, NULL, false) == FM_OK);
        CHECK(fm_optim_clip_grad_norm(opt, 1.0, NULL) == FM_OK);
        CHECK(fm_optim_step(opt) == FM_OK);
        fm_tensor_release_n(4, xs, ys, lg, ls);
    }
    fprintf(stderr, "%s: 10 AdamW steps, worst loss rel err %.2e\n", variant, worst);
    fm_optim_free(opt);
    fm_named_list_free(&ref);
    fm_gpt_free(m);
}

static fm_tensor *ids_tensor(const int64_t *v, int64_t B, int64_t T) {
    return fm_tensor_from_data(v, 2, (int64_t[]){B, T}, FM_I64);
}

/* Export, re-import into a fresh model: same parameters, same logits. Plus the
 * architecture-mismatch errors. */
static void test_hf_roundtrip(fm_gpt_arch arch) {
    fm_gpt_config cfg = tiny_config(arch);
    fm_rng r;
    fm_rng_init(&r, 7);
    fm_gpt *a = fm_gpt_new(&cfg, &r), *b = fm_gpt_new(&cfg, NULL);
    CHECK(a && b);
    char path[] = "/tmp/fathom_gpt_rtXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK_MSG(fm_gpt_save_hf(a, path) == FM_OK, "%s", fm_last_error());
    CHECK_MSG(fm_gpt_load_hf(b, path) == FM_OK, "%s", fm_last_error());
    const fm_named_list *pa = fm_gpt_parameters(a), *pb = fm_gpt_parameters(b);
    for (int i = 0; i < pa->n; i++) CHECK(rel_err(pb->items[i].tensor, pa->items[i].tensor) == 0);
    int64_t ids[8] = {1, 5, 9, 3, 63, 0, 2, 7};
    fm_tensor *x = ids_tensor(ids, 1, 8);
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *la = fm_gpt_forward(a, x, NULL, NULL), *lb = fm_gpt_forward(b, x, NULL, NULL);
    CHECK(la && lb && rel_err(la, lb) == 0);
    fm_tensor_release_n(3, x, la, lb);

    /* a different architecture / size: the error names the tensor and both shapes */
    fm_gpt_config other = cfg;
    other.n_embd = 64;
    fm_gpt *c = fm_gpt_new(&other, NULL);
    CHECK(fm_gpt_load_hf(c, path) != FM_OK);
    CHECK_ERR_CONTAINS(arch == FM_GPT_GPT2 ? "'transformer.wte.weight' has shape [64, 32] but the model expects [64, 64]"
                                           : "'model.embed_tokens.weight' has shape [64, 32] but the model expects [64, 64]");
    fm_gpt_free(c);
    fm_gpt_config wrong = tiny_config(arch == FM_GPT_GPT2 ? FM_GPT_LLAMA : FM_GPT_GPT2);
    c = fm_gpt_new(&wrong, NULL);
    CHECK(fm_gpt_load_hf(c, path) != FM_OK);
    CHECK_ERR_CONTAINS("is missing");
    fm_gpt_free(c);
    fm_set_grad_enabled(prev);
    unlink(path);
    fm_gpt_free(a);
    fm_gpt_free(b);
}

static int count_cb(int tok, void *ctx) {
    (void)tok;
    (*(int *)ctx)++;
    return 0;
}

static void test_generate(fm_gpt_arch arch) {
    fm_gpt_config cfg = tiny_config(arch);
    fm_rng r;
    fm_rng_init(&r, 11);
    fm_gpt *m = fm_gpt_new(&cfg, &r);
    CHECK(m != NULL);
    /* larger weights make the distribution peaky enough that sampling is sensitive to the logits */
    const fm_named_list *ps = fm_gpt_parameters(m);
    for (int i = 0; i < ps->n; i++)
        if (ps->items[i].tensor->ndim == 2) fm_tensor_normal_(ps->items[i].tensor, 0, 0.3, &r);
    int32_t prompt[3] = {4, 8, 15};
    for (int variant = 0; variant < 3; variant++) {
        fm_gpt_sample_params sp = {variant == 0 ? 0.0 : 0.9, variant == 2 ? 10 : 0, variant == 2 ? 0.9 : 1.0, 1234};
        int32_t a[32], b[32];
        int na = 0, nb = 0, streamed = 0;
        bool lim_a = false, lim_b = false;
        CHECK_MSG(fm_gpt_generate(m, prompt, 3, 20, &sp, true, a, &na, &lim_a, count_cb, &streamed) == FM_OK, "%s",
                  fm_last_error());
        CHECK(fm_gpt_generate(m, prompt, 3, 20, &sp, false, b, &nb, &lim_b, NULL, NULL) == FM_OK);
        /* 3 prompt tokens + 13 new fill the 16-token context */
        CHECK(na == 13 && nb == 13 && lim_a && lim_b && streamed == 13);
        CHECK(memcmp(a, b, sizeof(int32_t) * (size_t)(na < nb ? na : nb)) == 0);
    }
    /* cached logits equal uncached logits, position by position */
    int64_t ids[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    fm_tensor *x = ids_tensor(ids, 1, 10);
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *full = fm_gpt_forward(m, x, NULL, NULL);
    fm_gpt_kv_cache *kc = fm_gpt_kv_cache_new(m, 1);
    fm_tensor *x1 = fm_narrow(x, 1, 0, 4), *x2 = fm_narrow(x, 1, 4, 6);
    fm_tensor *c1 = fm_gpt_forward_cached(m, x1, kc), *c2 = fm_gpt_forward_cached(m, x2, kc);
    fm_tensor *f2 = fm_narrow(full, 1, 4, 6);
    CHECK(c1 && c2 && rel_err(c2, f2) < 1e-5);
    /* the context limit is a clear error */
    int64_t many[16] = {0};
    fm_tensor *big = ids_tensor(many, 1, 16);
    CHECK(fm_gpt_forward_cached(m, big, kc) == NULL);
    CHECK_ERR_CONTAINS("context limit");
    fm_tensor_release_n(7, x, full, x1, x2, c1, c2, f2);
    fm_tensor_release(big);
    fm_gpt_kv_cache_free(kc);
    fm_set_grad_enabled(prev);

    /* bad input: prompt longer than the context, unknown token ids */
    int32_t longp[17] = {0};
    fm_gpt_sample_params sp = {0, 0, 1, 1};
    CHECK(fm_gpt_generate(m, longp, 17, 5, &sp, true, NULL, NULL, NULL, NULL, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("prompt is 17 tokens but the model's context is 16");
    int32_t badp[2] = {3, 64};
    CHECK(fm_gpt_generate(m, badp, 2, 5, &sp, true, NULL, NULL, NULL, NULL, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("unknown token id 64");
    int64_t bad_ids[2] = {1, 99};
    fm_tensor *bx = ids_tensor(bad_ids, 1, 2);
    CHECK(fm_gpt_forward(m, bx, NULL, NULL) == NULL);
    CHECK_ERR_CONTAINS("unknown token id 99");
    fm_tensor_release(bx);
    fm_gpt_free(m);
}

static void test_token_file(void) {
    char path[] = "/tmp/fathom_tokXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = (i * 7) % 50;
    CHECK(fm_token_file_write(path, ids, 100, 50) == FM_OK);
    fm_token_data d;
    CHECK_MSG(fm_token_file_read(path, 50, &d) == FM_OK, "%s", fm_last_error());
    CHECK(d.n == 100 && d.vocab_size == 50 && memcmp(d.ids, ids, sizeof ids) == 0);
    /* seeded windows: same (seed, step) gives the same batch; targets are shifted inputs */
    fm_tensor *x, *y, *x2, *y2;
    CHECK(fm_gpt_batch_random(&d, 0, 90, 4, 8, 5, 3, &x, &y) == FM_OK);
    CHECK(fm_gpt_batch_random(&d, 0, 90, 4, 8, 5, 3, &x2, &y2) == FM_OK);
    CHECK(rel_err(x, x2) == 0 && rel_err(y, y2) == 0);
    for (int i = 0; i < 7; i++) CHECK(fm_tensor_get(x, i + 1) == fm_tensor_get(y, i));
    fm_tensor_release_n(4, x, y, x2, y2);
    CHECK(fm_gpt_batch_eval(&d, 90, 100, 1, 4, 0, &x, &y) == FM_OK);
    CHECK(fm_tensor_get(x, 0) == ids[90] && fm_tensor_get(y, 3) == ids[94]);
    fm_tensor_release_n(2, x, y);
    /* too short for a window */
    CHECK(fm_gpt_batch_random(&d, 0, 5, 1, 8, 1, 0, &x, &y) != FM_OK);
    CHECK_ERR_CONTAINS("too few");
    CHECK(fm_gpt_batch_eval(&d, 95, 100, 1, 8, 0, &x, &y) != FM_OK);
    CHECK_ERR_CONTAINS("too few");
    fm_token_data_free(&d);
    /* header mismatches */
    CHECK(fm_token_file_read(path, 51, &d) != FM_OK);
    CHECK_ERR_CONTAINS("vocab size 50, but the tokenizer/model has 51");
    FILE *f = fopen(path, "r+b");
    fseek(f, 8, SEEK_SET);
    fputc(9, f); /* version 9 */
    fclose(f);
    CHECK(fm_token_file_read(path, 0, &d) != FM_OK);
    CHECK_ERR_CONTAINS("version 9 is not supported");
    f = fopen(path, "r+b");
    fputc('X', f);
    fclose(f);
    CHECK(fm_token_file_read(path, 0, &d) != FM_OK);
    CHECK_ERR_CONTAINS("bad magic");
    CHECK(fm_token_file_write(path, ids, 10, 50) == FM_OK);
    CHECK(truncate(path, 32 + 2 * 10 - 1) == 0);
    CHECK(fm_token_file_read(path, 0, &d) != FM_OK);
    CHECK_ERR_CONTAINS("header says 10 tokens");
    CHECK(fm_token_file_write(path, ids, 0, 50) == FM_OK); /* empty corpus: a valid file, unusable for training */
    CHECK(fm_token_file_read(path, 50, &d) == FM_OK && d.n == 0);
    CHECK(fm_gpt_batch_random(&d, 0, d.n, 1, 8, 1, 0, &x, &y) != FM_OK);
    CHECK_ERR_CONTAINS("too few");
    fm_token_data_free(&d);
    unlink(path);
}

static void test_config(void) {
    fm_gpt_config c = tiny_config(FM_GPT_GPT2);
    c.n_head = 5;
    CHECK(fm_gpt_new(&c, NULL) == NULL);
    CHECK_ERR_CONTAINS("not divisible by n_head");
    c = tiny_config(FM_GPT_LLAMA);
    c.n_kv_head = 3;
    CHECK(fm_gpt_new(&c, NULL) == NULL);
    CHECK_ERR_CONTAINS("must divide n_head");
    char path[] = "/tmp/fathom_cfgXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    c = tiny_config(FM_GPT_LLAMA);
    fm_gpt_config d;
    CHECK(fm_gpt_config_save(&c, path) == FM_OK);
    CHECK_MSG(fm_gpt_config_load(path, &d) == FM_OK, "%s", fm_last_error());
    CHECK(d.arch == c.arch && d.n_kv_head == 2 && d.ffn_hidden == 96 && d.block_size == 16);
    unlink(path);
    /* the parameter count the memory check uses matches the built models */
    for (int k = 0; k < 3; k++) {
        c = tiny_config(k == 2 ? FM_GPT_LLAMA : FM_GPT_GPT2);
        c.bias = k == 0;
        fm_gpt *m = fm_gpt_new(&c, NULL);
        CHECK(m != NULL);
        if (m) CHECK_MSG(fm_gpt_config_num_params(&c) == fm_gpt_num_params(m), "config %d: %lld vs %lld", k,
                         (long long)fm_gpt_config_num_params(&c), (long long)fm_gpt_num_params(m));
        fm_gpt_free(m);
    }
}

/* ---- efficiency options in the model and the trainer ---- */

static void write_text(const char *path, const char *s, int repeat);

/* One training forward + backward; the loss and a copy of every gradient (f64). */
static double fwd_bwd(fm_gpt *m, fm_tensor *x, fm_tensor *y, fm_dtype prec, double scale, double **grads) {
    const fm_named_list *ps = fm_gpt_parameters(m);
    fm_tensor *loss = NULL;
    fm_dtype ac = fm_autocast_set(prec);
    fm_tensor *lg = fm_gpt_forward(m, x, y, &loss);
    fm_autocast_set(ac);
    if (!lg) { CHECK_MSG(0, "forward: %s", fm_last_error()); return NAN; }
    double lv = fm_tensor_item(loss);
    fm_tensor *sl = scale != 1 ? fm_mul_scalar(loss, scale) : fm_tensor_retain(loss);
    CHECK_MSG(fm_backward(sl, NULL, false) == FM_OK, "backward: %s", fm_last_error());
    fm_tensor_release_n(3, lg, loss, sl);
    if (grads) {
        int64_t total = 0;
        for (int i = 0; i < ps->n; i++) total += fm_tensor_numel(ps->items[i].tensor);
        *grads = calloc((size_t)total, sizeof **grads);
        int64_t off = 0;
        for (int i = 0; i < ps->n; i++) {
            fm_tensor *g = ps->items[i].tensor->grad;
            int64_t n = fm_tensor_numel(ps->items[i].tensor);
            for (int64_t j = 0; g && j < n; j++) (*grads)[off + j] = fm_tensor_get(g, j);
            off += n;
        }
    }
    return lv;
}

static void zero_grads(fm_gpt *m) {
    const fm_named_list *ps = fm_gpt_parameters(m);
    for (int i = 0; i < ps->n; i++) {
        fm_tensor_release(ps->items[i].tensor->grad);
        ps->items[i].tensor->grad = NULL;
    }
}

static void random_batch(int B, int T, int V, uint64_t seed, fm_tensor **x, fm_tensor **y) {
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * T + 1));
    uint64_t s = seed * 2654435761u + 1;
    for (int i = 0; i <= B * T; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ids[i] = (int64_t)(s % (uint64_t)V); }
    *x = fm_tensor_from_data(ids, 2, (int64_t[]){B, T}, FM_I64);
    *y = fm_tensor_from_data(ids + 1, 2, (int64_t[]){B, T}, FM_I64);
    free(ids);
}

/* Checkpointing (blocks, selective) gives bitwise the losses and gradients of
 * the plain forward, with dropout on (the recomputation must redraw the same
 * masks from the model's generator) and over two steps (the generator must end
 * where the plain run leaves it). fused: the model's fused path; under bf16 on the
 * CPU that is the mixed path (bf16 GEMMs, f32 activations), which selective
 * checkpointing does not take (it keeps the op-by-op autocast path), so there
 * only blocks is compared; unfused bf16 checks all three on the op-by-op path. */
static void test_checkpointing(fm_gpt_arch arch, fm_dtype prec, bool fused) {
    fm_gpt_config c = tiny_config(arch);
    c.n_layer = 3;
    c.dropout = 0.1;
    fm_tensor *x, *y;
    random_batch(2, c.block_size, c.vocab_size, 3, &x, &y);
    double *ref[2] = {NULL, NULL}, ref_loss[2] = {0, 0};
    int64_t total = 0;
    uint64_t ref_off = 0;
    const int last = fused && prec == FM_BF16 ? FM_CKPT_BLOCKS : FM_CKPT_SELECTIVE;
    for (int mode = FM_CKPT_NONE; mode <= last; mode++) {
        fm_rng init;
        fm_rng_init(&init, 21);
        fm_gpt *m = fm_gpt_new(&c, &init);
        if (!m) { CHECK(0); break; }
        fm_gpt_set_fusion(m, fused);
        total = fm_gpt_num_params(m);
        CHECK(fm_gpt_set_checkpointing(m, (fm_checkpointing)mode) == FM_OK);
        for (int step = 0; step < 2; step++) {
            double *g = NULL;
            zero_grads(m);
            double l = fwd_bwd(m, x, y, prec, 1.0, &g);
            if (mode == FM_CKPT_NONE) {
                ref[step] = g;
                ref_loss[step] = l;
                continue;
            }
            CHECK_MSG(l == ref_loss[step], "%s %s checkpointing %s step %d: loss %.9g vs %.9g", fm_gpt_arch_name(arch),
                      fm_precision_name(prec), fm_checkpointing_name((fm_checkpointing)mode), step, l, ref_loss[step]);
            int64_t diff = 0;
            double num = 0, den = 0;
            for (int64_t i = 0; g && ref[step] && i < total; i++) {
                diff += g[i] != ref[step][i];
                num += (g[i] - ref[step][i]) * (g[i] - ref[step][i]);
                den += ref[step][i] * ref[step][i];
            }
            /* bf16 selective included: fm_linear_recompute computes the linear's gradients
             * itself, and sums the bias gradient in the output's dtype as the plain
             * linear's backward does (summing in f32 made it differ by 1e-3) */
            CHECK_MSG(g && diff == 0,
                      "%s %s checkpointing %s step %d: %lld of %lld gradient values differ (relative error %g)",
                      fm_gpt_arch_name(arch), fm_precision_name(prec), fm_checkpointing_name((fm_checkpointing)mode), step,
                      (long long)diff, (long long)total, den > 0 ? sqrt(num / den) : 0.0);
            free(g);
        }
        if (mode == FM_CKPT_NONE) ref_off = fm_gpt_rng(m)->offset;
        else CHECK_MSG(fm_gpt_rng(m)->offset == ref_off, "dropout generator at %llu, plain run at %llu",
                       (unsigned long long)fm_gpt_rng(m)->offset, (unsigned long long)ref_off);
        fm_gpt_free(m);
    }
    CHECK(ref_off > 0); /* dropout drew numbers: the masks were really exercised */
    CHECK(fm_gpt_set_checkpointing(NULL, FM_CKPT_BLOCKS) != FM_OK);
    free(ref[0]);
    free(ref[1]);
    fm_tensor_release_n(2, x, y);
}

/* Gradient accumulation at the model level: a batch of 8 as 4 micro-batches of
 * 2 (each loss scaled by 1/4) gives the single batch's gradients to 1e-6. */
static void test_grad_accum_model(void) {
    fm_gpt_config c = tiny_config(FM_GPT_GPT2);
    fm_tensor *x, *y;
    random_batch(8, c.block_size, c.vocab_size, 5, &x, &y);
    fm_rng init;
    fm_rng_init(&init, 4);
    fm_gpt *m = fm_gpt_new(&c, &init);
    if (!m) { CHECK(0); return; }
    double *full = NULL, *acc = NULL;
    zero_grads(m);
    double lf = fwd_bwd(m, x, y, FM_F32, 1.0, &full);
    zero_grads(m);
    double la = 0;
    for (int k = 0; k < 4; k++) {
        fm_tensor *xs = fm_narrow(x, 0, 2 * k, 2), *ys = fm_narrow(y, 0, 2 * k, 2);
        la += fwd_bwd(m, xs, ys, FM_F32, 0.25, k == 3 ? &acc : NULL) / 4;
        fm_tensor_release_n(2, xs, ys);
    }
    int64_t n = fm_gpt_num_params(m);
    double num = 0, den = 0;
    for (int64_t i = 0; full && acc && i < n; i++) {
        num += (full[i] - acc[i]) * (full[i] - acc[i]);
        den += full[i] * full[i];
    }
    CHECK_MSG(full && acc && sqrt(num) <= 1e-6 * sqrt(den), "grad accumulation: relative gradient error %g", sqrt(num / den));
    CHECK_NEAR(la, lf, 1e-6 * fabs(lf));
    free(full);
    free(acc);
    fm_gpt_free(m);
    fm_tensor_release_n(2, x, y);
}

static size_t report_field(const char *json, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(json, k);
    return p ? (size_t)strtoull(p + strlen(k), NULL, 10) : 0;
}

/* fm_gpt_train_ex with each option on a small corpus: checkpointing does not
 * change a single bit of the run, bf16/fp16 train to nearly the fp32 loss with
 * less activation memory, fp16 reports its scaler, accumulation matches the
 * whole batch, and bad options are clear errors before any weight exists. */
static void test_train_efficiency(void) {
    char dir[] = "/tmp/fathom_gpteffXXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    char corpus[600], out[700], cmd[1400];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    write_text(corpus, "And God said, Let there be light: and there was light. In the beginning.\n", 60);
    fm_gpt_train_opts o = fm_gpt_train_defaults();
    o.model = tiny_config(FM_GPT_GPT2);
    o.model.n_layer = 3;
    o.model.dropout = 0.1;
    o.corpus = corpus;
    o.tokenizer = FM_TOK_CHAR;
    o.batch_size = 4;
    o.steps = 8;
    o.warmup = 2;
    o.eval_every = 4;
    o.ckpt_every = 100;
    o.eval_batches = 2;
    o.quiet = true;
    o.out_dir = out;
    fm_gpt_train_result base, r;
    snprintf(out, sizeof out, "%s/base", dir);
    CHECK_MSG(fm_gpt_train_ex(&o, &base) == FM_OK, "%s", fm_last_error());
    CHECK(base.steps == 8 && isfinite(base.train_loss) && isfinite(base.val_loss) && base.loss_scale == 1 && base.skipped_steps == 0);
    size_t act32 = report_field(base.memory_report_json, "activations");
    CHECK_MSG(act32 > 0 && report_field(base.memory_report_json, "weights") > 0 &&
              report_field(base.memory_report_json, "optimizer_state") > 0, "memory report: %s", base.memory_report_json);
    CHECK(strstr(base.memory_report_text, "activations") != NULL);
    for (int mode = FM_CKPT_BLOCKS; mode <= FM_CKPT_SELECTIVE; mode++) {
        o.eff.checkpointing = (fm_checkpointing)mode;
        snprintf(out, sizeof out, "%s/ckpt%d", dir, mode);
        CHECK_MSG(fm_gpt_train_ex(&o, &r) == FM_OK, "%s", fm_last_error());
        CHECK_MSG(r.train_loss == base.train_loss && r.val_loss == base.val_loss, "checkpointing %s: train %.9g vs %.9g, val %.9g vs %.9g",
                  fm_checkpointing_name((fm_checkpointing)mode), r.train_loss, base.train_loss, r.val_loss, base.val_loss);
    }
    o.eff.checkpointing = FM_CKPT_NONE;
    for (int k = 0; k < 2; k++) {
        o.eff.precision = k ? FM_F16 : FM_BF16;
        o.eff.loss_scaling = k == 1;
        snprintf(out, sizeof out, "%s/lowp%d", dir, k);
        CHECK_MSG(fm_gpt_train_ex(&o, &r) == FM_OK, "%s", fm_last_error());
        CHECK_MSG(fabs(r.val_loss - base.val_loss) < 0.05 && fabs(r.train_loss - base.train_loss) < 0.05,
                  "%s: val %.5f vs fp32 %.5f", fm_precision_name(o.eff.precision), r.val_loss, base.val_loss);
        /* the run's losses are not bitwise fp32's (the val loss alone can be: fp16 moved it by 0 to 6 ulp,
         * depending on OpenBLAS's kernel; the last step's train loss moved more) */
        CHECK_MSG(r.val_loss != base.val_loss || r.train_loss != base.train_loss, "%s: bitwise the fp32 losses: autocast was not applied",
                  fm_precision_name(o.eff.precision));
        size_t act = report_field(r.memory_report_json, "activations");
        CHECK_MSG(act > 0 && act < act32, "%s activations %zu, fp32 %zu", fm_precision_name(o.eff.precision), act, act32);
        CHECK(k == 0 ? r.loss_scale == 1 : r.loss_scale == 65536);
        CHECK(r.skipped_steps == 0);
    }
    o.eff.precision = FM_F32;
    o.eff.loss_scaling = false;
    /* accumulation: with dropout off, 2 micro-batches of 2 train as one batch of 4 */
    o.model.dropout = 0;
    snprintf(out, sizeof out, "%s/acc1", dir);
    CHECK_MSG(fm_gpt_train_ex(&o, &base) == FM_OK, "%s", fm_last_error());
    o.eff.grad_accum = 2;
    snprintf(out, sizeof out, "%s/acc2", dir);
    CHECK_MSG(fm_gpt_train_ex(&o, &r) == FM_OK, "%s", fm_last_error());
    CHECK_MSG(fabs(r.train_loss - base.train_loss) < 1e-4 && fabs(r.val_loss - base.val_loss) < 1e-4,
              "grad-accum 2: train %.7f vs %.7f, val %.7f vs %.7f", r.train_loss, base.train_loss, r.val_loss, base.val_loss);
    size_t act_acc = report_field(r.memory_report_json, "activations"), act_one = report_field(base.memory_report_json, "activations");
    CHECK_MSG(act_acc < act_one, "grad-accum 2 activations %zu, one batch %zu", act_acc, act_one);
    /* bad combinations: clear errors, nothing written */
    o.eff.grad_accum = 3;
    snprintf(out, sizeof out, "%s/bad", dir);
    CHECK(fm_gpt_train_ex(&o, &r) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("not divisible by --grad-accum 3");
    o.eff.grad_accum = 1;
    o.eff.loss_scaling = true;
    CHECK(fm_gpt_train_ex(&o, &r) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("loss scaling is for --precision fp16");
    o.eff.loss_scaling = false;
    /* a limit that cannot hold the weights: refused before training, no checkpoint */
    o.eff.memory_limit = 16 * 1024;
    CHECK(fm_gpt_train_ex(&o, &r) == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("cannot hold the model before training starts");
    snprintf(cmd, sizeof cmd, "%s/bad/model.safetensors", dir);
    CHECK(access(cmd, F_OK) != 0);
    fm_memory_set_limit(FM_CPU, 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void write_text(const char *path, const char *s, int repeat) {
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < repeat; i++) fputs(s, f);
    if (f) fclose(f);
}

/* Training end to end on a small corpus: an interrupted run resumed from its
 * checkpoint ends with exactly the loss of an uninterrupted one (dropout on, so
 * the RNG state must be restored too); short and empty corpora are clear errors. */
static void test_train_resume(void) {
    char dir[] = "/tmp/fathom_gpttrXXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    char corpus[600], out_a[600], out_b[600], cmd[1400];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(out_a, sizeof out_a, "%s/a", dir);
    snprintf(out_b, sizeof out_b, "%s/b", dir);
    write_text(corpus, "And God said, Let there be light: and there was light. \xe2\x80\x94 In the beginning.\n", 60);
    fm_gpt_train_opts o = fm_gpt_train_defaults();
    o.model = tiny_config(FM_GPT_GPT2);
    o.model.dropout = 0.1;
    o.corpus = corpus;
    o.tokenizer = FM_TOK_CHAR;
    o.batch_size = 4;
    o.steps = 12;
    o.warmup = 3;
    o.eval_every = 4;
    o.ckpt_every = 100;
    o.eval_batches = 2;
    o.quiet = true;
    o.out_dir = out_a;
    double la = 0, va = 0, lb = 1, vb = 1;
    CHECK_MSG(fm_gpt_train(&o, &la, &va) == FM_OK, "%s", fm_last_error());
    o.out_dir = out_b;
    o.stop_after = 6;
    CHECK_MSG(fm_gpt_train(&o, NULL, NULL) == FM_OK, "%s", fm_last_error());
    o.stop_after = 0;
    o.resume = true;
    CHECK_MSG(fm_gpt_train(&o, &lb, &vb) == FM_OK, "%s", fm_last_error());
    CHECK_MSG(la == lb && va == vb, "resume: train %.9f vs %.9f, val %.9f vs %.9f", la, lb, va, vb);
    CHECK_MSG(isfinite(la) && la < 5.6, "train loss %g after 12 steps (ln V is about 5.7)", la);
    /* the saved directory loads for generation */
    fm_tokenizer *tok = NULL;
    fm_gpt *m = fm_gpt_load_dir(out_a, &tok);
    CHECK_MSG(m && tok, "%s", fm_last_error());
    fm_gpt_free(m);
    fm_tokenizer_free(tok);
    CHECK(fm_gpt_load_dir(dir, NULL) == NULL);
    CHECK_ERR_CONTAINS("no config.json");

    /* too short: the held-out 10% cannot hold one window */
    o.resume = false;
    o.out_dir = out_a;
    snprintf(cmd, sizeof cmd, "%s/short.txt", dir);
    write_text(cmd, "In the beginning God created the heaven and the earth.\n", 1);
    snprintf(out_a, sizeof out_a, "%s/c", dir);
    o.corpus = cmd;
    CHECK(fm_gpt_train(&o, NULL, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("corpus is too short");
    snprintf(out_a, sizeof out_a, "%s/d", dir);
    write_text(cmd, "", 1);
    CHECK(fm_gpt_train(&o, NULL, NULL) != FM_OK);
    CHECK_ERR_CONTAINS("corpus is empty");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* How many times op `name` appears as a kernel span in a profiler trace of one
 * training forward + backward. */
static int count_op_spans(fm_gpt *m, fm_tensor *x, fm_tensor *y, const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/fathom_test_gpt_fusion_%d.json", (int)getpid());
    if (fm_profiler_start(path) != FM_OK) return -1;
    zero_grads(m);
    fwd_bwd(m, x, y, FM_F32, 1.0, NULL);
    fm_profiler_stop();
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    unlink(path);
    if (!buf) return -1;
    buf[got] = 0;
    char needle[96];
    snprintf(needle, sizeof needle, "\"name\":\"%s\"", name);
    int count = 0;
    for (char *p = strstr(buf, needle); p; p = strstr(p + 1, needle)) count++;
    free(buf);
    return count;
}

/* The fused GPT-2 forward (bias + GELU, residual + LayerNorm) runs the fused ops
 * and agrees with the unfused ops to rounding: loss, logits' gradients, every
 * parameter's gradient; with and without biases. Llama and autocast keep the
 * separate ops. */
static void test_fusion(void) {
    for (int bias = 0; bias < 2; bias++) {
        fm_gpt_config c = tiny_config(FM_GPT_GPT2);
        c.n_layer = 3;
        c.bias = bias;
        fm_tensor *x, *y;
        random_batch(2, c.block_size, c.vocab_size, 5, &x, &y);
        fm_rng init;
        fm_rng_init(&init, 31);
        fm_gpt *m = fm_gpt_new(&c, &init);
        if (!m) { CHECK(0); fm_tensor_release_n(2, x, y); continue; }
        double *g[2] = {NULL, NULL}, l[2];
        for (int fused = 0; fused < 2; fused++) {
            fm_gpt_set_fusion(m, fused);
            zero_grads(m);
            l[fused] = fwd_bwd(m, x, y, FM_F32, 1.0, &g[fused]);
        }
        double num = 0, den = 0;
        int64_t total = fm_gpt_num_params(m);
        for (int64_t i = 0; g[0] && g[1] && i < total; i++) {
            num += (g[1][i] - g[0][i]) * (g[1][i] - g[0][i]);
            den += g[0][i] * g[0][i];
        }
        CHECK_MSG(fabs(l[1] - l[0]) <= 1e-6 * fabs(l[0]), "bias %d: fused loss %.9g, unfused %.9g", bias, l[1], l[0]);
        CHECK_MSG(g[0] && g[1] && den > 0 && sqrt(num) <= 1e-5 * sqrt(den), "bias %d: gradients differ by %g relative",
                  bias, den > 0 ? sqrt(num / den) : -1.0);
        free(g[0]);
        free(g[1]);
        /* 3 blocks: one residual + norm inside each and one at each end; one MLP bias each */
        fm_gpt_set_fusion(m, true);
        CHECK_MSG(count_op_spans(m, x, y, "add_layer_norm") == 6 + 1, "fused forward: %d add_layer_norm spans",
                  count_op_spans(m, x, y, "add_layer_norm"));
        CHECK(count_op_spans(m, x, y, "add_layer_norm_backward") == 6 + 1);
        CHECK(count_op_spans(m, x, y, "bias_gelu_tanh") == (bias ? 3 : 0));
        CHECK(count_op_spans(m, x, y, "layer_norm") == 0);
        fm_gpt_set_fusion(m, false);
        CHECK(count_op_spans(m, x, y, "add_layer_norm") == 0 && count_op_spans(m, x, y, "layer_norm") == 7);
        fm_gpt_free(m);
        fm_tensor_release_n(2, x, y);
    }
    /* Llama: RMSNorm and SwiGLU, none of the fused ops */
    fm_gpt_config c = tiny_config(FM_GPT_LLAMA);
    fm_tensor *x, *y;
    random_batch(2, c.block_size, c.vocab_size, 6, &x, &y);
    fm_gpt *m = fm_gpt_new(&c, NULL);
    CHECK(m && count_op_spans(m, x, y, "add_layer_norm") == 0 && count_op_spans(m, x, y, "bias_gelu_tanh") == 0);
    fm_gpt_free(m);
    fm_tensor_release_n(2, x, y);
}

/* bf16 on the CPU, both architectures: the mixed path (bf16 GEMMs on f32 activations,
 * f32 logits) and the op-by-op autocast path (fm_gpt_set_fusion(m, false): bf16
 * logits) each train near the fp32 loss and gradients, and differ from fp32 (the
 * bf16 rounding was applied). Tolerances: the loss within 5e-4 and the gradients
 * within 1e-2 (relative 2-norm) of fp32; measured (Intel Xeon model 207): loss
 * 7e-6-3e-5, gradients 2.6e-3-4e-3, printed on each run. */
static void test_bf16_paths(fm_gpt_arch arch) {
    fm_gpt_config c = tiny_config(arch);
    c.n_layer = 3;
    fm_tensor *x, *y;
    random_batch(2, c.block_size, c.vocab_size, 8, &x, &y);
    fm_rng init;
    fm_rng_init(&init, 33);
    fm_gpt *m = fm_gpt_new(&c, &init);
    if (!m) { CHECK(0); fm_tensor_release_n(2, x, y); return; }
    int64_t total = fm_gpt_num_params(m);
    double *g32 = NULL, *g = NULL;
    zero_grads(m);
    double l32 = fwd_bwd(m, x, y, FM_F32, 1.0, &g32);
    for (int fused = 1; fused >= 0; fused--) {
        fm_gpt_set_fusion(m, fused);
        fm_dtype ac = fm_autocast_set(FM_BF16);
        fm_tensor *lg = fm_gpt_forward(m, x, NULL, NULL);
        fm_autocast_set(ac);
        CHECK_MSG(lg && lg->dtype == (fused ? FM_F32 : FM_BF16), "%s bf16 %s: logits %s", fm_gpt_arch_name(arch),
                  fused ? "mixed" : "op-by-op", lg ? fm_dtype_name(lg->dtype) : fm_last_error());
        fm_tensor_release(lg);
        zero_grads(m);
        double l = fwd_bwd(m, x, y, FM_BF16, 1.0, &g), num = 0, den = 0;
        for (int64_t i = 0; g && g32 && i < total; i++) {
            num += (g[i] - g32[i]) * (g[i] - g32[i]);
            den += g32[i] * g32[i];
        }
        double ge = den > 0 ? sqrt(num / den) : INFINITY, le = fabs(l - l32) / fabs(l32);
        fprintf(stderr, "%s bf16 %s: loss %.6f vs fp32 %.6f (%.2g), gradients %.2g relative\n", fm_gpt_arch_name(arch),
                fused ? "mixed" : "op-by-op", l, l32, le, ge);
        CHECK_MSG(le <= 5e-4 && l != l32, "%s bf16 %s: loss %.9g vs fp32 %.9g", fm_gpt_arch_name(arch),
                  fused ? "mixed" : "op-by-op", l, l32);
        CHECK_MSG(ge <= 1e-2 && ge > 0, "%s bf16 %s: gradients %g relative to fp32", fm_gpt_arch_name(arch),
                  fused ? "mixed" : "op-by-op", ge);
        free(g);
        g = NULL;
    }
    free(g32);
    fm_gpt_free(m);
    fm_tensor_release_n(2, x, y);
}

/* ---- head_dim: heads that do not tile n_embd ---- */

static fm_tensor *param_named(fm_gpt *m, const char *name) {
    const fm_named_list *ps = fm_gpt_parameters(m);
    for (int i = 0; i < ps->n; i++)
        if (!strcmp(ps->items[i].name, name)) return ps->items[i].tensor;
    return NULL;
}

/* b = a with the query heads [q0, q0 + nq) and kv heads [k0, k0 + nk) cut out (rows of the
 * QKV projection, columns of the output projection); in a, the output projection's
 * columns of those heads become 0, so both compute the same function. */
static void cut_heads(fm_gpt *a, fm_gpt *b, int q0, int nq, int k0, int nk) {
    const fm_gpt_config *ca = fm_gpt_get_config(a);
    const int64_t H = ca->n_head, KV = ca->arch == FM_GPT_LLAMA ? ca->n_kv_head : H, D = fm_gpt_head_dim(ca);
    const fm_named_list *ps = fm_gpt_parameters(a);
    for (int i = 0; i < ps->n; i++) {
        fm_tensor *ta = ps->items[i].tensor, *tb = param_named(b, ps->items[i].name);
        CHECK_MSG(tb != NULL, "%s missing in the cut model", ps->items[i].name);
        if (!tb) continue;
        int64_t n = fm_tensor_numel(ta), rows = ta->shape[0], cols = ta->ndim == 2 ? ta->shape[1] : 1;
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)fm_tensor_numel(tb));
        fm_tensor_copy_to_host(ta, x, FM_F32);
        bool qkv = strstr(ps->items[i].name, "attn.qkv"), proj = strstr(ps->items[i].name, "attn.proj.weight");
        int64_t k = 0;
        for (int64_t r = 0; r < rows; r++) {
            int64_t head = r / D; /* qkv rows: H query heads, then KV key heads, then KV value heads */
            bool cut = qkv && ((head < H && head >= q0 && head < q0 + nq) ||
                               (head >= H && ((head - H) % KV) >= k0 && ((head - H) % KV) < k0 + nk));
            for (int64_t c = 0; c < cols; c++) {
                bool ccut = proj && c / D >= q0 && c / D < q0 + nq;
                if (ccut) x[r * cols + c] = 0;
                if (!cut && !ccut) y[k++] = x[r * cols + c];
            }
        }
        CHECK_MSG(k == fm_tensor_numel(tb), "%s: %lld values for %lld", ps->items[i].name, (long long)k,
                  (long long)fm_tensor_numel(tb));
        fm_tensor *xa = fm_tensor_from_data(x, ta->ndim, ta->shape, FM_F32), *yb = fm_tensor_from_data(y, tb->ndim, tb->shape, FM_F32);
        CHECK(fm_copy_(ta, xa) == FM_OK && fm_copy_(tb, yb) == FM_OK);
        fm_tensor_release_n(2, xa, yb);
        free(x);
        free(y);
    }
}

static void test_head_dim(fm_gpt_arch arch) {
    fm_gpt_config c = tiny_config(arch), d = c;
    const bool llama = arch == FM_GPT_LLAMA;
    /* GPT-2: 4 heads of 8 -> 3 (head 1 cut); Llama: 4 query heads in 2 kv groups -> 1 group */
    d.n_head = llama ? 2 : 3;
    d.n_kv_head = llama ? 1 : 3;
    d.head_dim = 8;
    fm_rng r;
    fm_rng_init(&r, 77);
    fm_gpt *a = fm_gpt_new(&c, &r), *b = fm_gpt_new(&d, &r);
    CHECK_MSG(a && b, "%s", fm_last_error());
    if (!a || !b) { fm_gpt_free(a); fm_gpt_free(b); return; }
    CHECK(fm_gpt_config_num_params(&d) == fm_gpt_num_params(b));
    const fm_named_list *ps = fm_gpt_parameters(a);
    for (int i = 0; i < ps->n; i++)
        if (ps->items[i].tensor->ndim == 2) fm_tensor_normal_(ps->items[i].tensor, 0, 0.2, &r);
    if (llama) cut_heads(a, b, 2, 2, 1, 1);
    else cut_heads(a, b, 1, 1, 1, 1);
    int64_t ids[2 * 12];
    for (int i = 0; i < 24; i++) ids[i] = (i * 7 + 3) % c.vocab_size;
    fm_tensor *x = ids_tensor(ids, 2, 12);
    bool prev = fm_set_grad_enabled(false);
    for (int fused = 0; fused < 2; fused++) {
        fm_gpt_set_fusion(a, fused);
        fm_gpt_set_fusion(b, fused);
        fm_tensor *la = fm_gpt_forward(a, x, NULL, NULL), *lb = fm_gpt_forward(b, x, NULL, NULL);
        CHECK_MSG(la && lb && rel_err(lb, la) < 1e-5, "%s fused %d: %d heads of 8 differ from the 4-head model with "
                  "the cut heads' output zeroed (%g)", llama ? "llama" : "gpt2", fused, d.n_head,
                  la && lb ? rel_err(lb, la) : -1.0);
        fm_tensor_release_n(2, la, lb);
    }
    /* the KV cache (heads of head_dim) gives the full forward's logits */
    fm_tensor *full = fm_gpt_forward(b, x, NULL, NULL);
    fm_gpt_kv_cache *kc = fm_gpt_kv_cache_new(b, 2);
    fm_tensor *x1 = fm_narrow(x, 1, 0, 5), *x2 = fm_narrow(x, 1, 5, 1), *x3 = fm_narrow(x, 1, 6, 6);
    fm_tensor *c1 = fm_gpt_forward_cached(b, x1, kc), *c2 = fm_gpt_forward_cached(b, x2, kc);
    fm_tensor *c3 = fm_gpt_forward_cached(b, x3, kc), *f3 = fm_narrow(full, 1, 6, 6);
    CHECK(c1 && c2 && c3 && rel_err(c3, f3) < 1e-5);
    fm_tensor_release_n(8, full, x1, x2, x3, c1, c2, c3, f3);
    fm_gpt_kv_cache_free(kc);
    fm_set_grad_enabled(prev);
    /* training: the gradient flows (one step's loss is finite and backward succeeds) */
    fm_tensor *y = NULL, *xx = NULL;
    random_batch(2, 12, c.vocab_size, 3, &xx, &y);
    fm_tensor *loss = NULL, *lg = fm_gpt_forward(b, xx, y, &loss);
    CHECK(lg && loss && isfinite(fm_tensor_item(loss)) && fm_backward(loss, NULL, false) == FM_OK);
    CHECK(param_named(b, "h.0.attn.qkv.weight") && param_named(b, "h.0.attn.qkv.weight")->grad);
    fm_tensor_release_n(4, lg, loss, y, xx);
    /* config.json keeps head_dim; a head_dim of 0 with heads that do not tile is refused */
    char path[] = "/tmp/fathom_cfgXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    fm_gpt_config e;
    CHECK(fm_gpt_config_save(&d, path) == FM_OK && fm_gpt_config_load(path, &e) == FM_OK && e.head_dim == 8 &&
          e.n_head == d.n_head && fm_gpt_head_dim(&e) == 8);
    CHECK(fm_gpt_config_save(&c, path) == FM_OK && fm_gpt_config_load(path, &e) == FM_OK && e.head_dim == 0 &&
          fm_gpt_head_dim(&e) == 8);
    unlink(path);
    if (!llama) { /* 3 heads do not tile 32 */
        d.head_dim = 0;
        CHECK(fm_gpt_new(&d, NULL) == NULL);
        CHECK_ERR_CONTAINS("set head_dim");
    }
    d.head_dim = -2;
    CHECK(fm_gpt_new(&d, NULL) == NULL);
    CHECK_ERR_CONTAINS("head_dim -2");
    fm_tensor_release(x);
    fm_gpt_free(a);
    fm_gpt_free(b);
}

/* `fathom generate --precision bf16` on the CPU: the cached decode under bf16 autocast
 * runs the mixed path (f32 activations and logits, bf16 products), its one-row steps
 * through the bf16-weight GEMV. With the weights' bf16 copies (fm_gpt_keep_lowp_weights, what
 * fm_gpt_generate makes) every step's logits are bitwise those of converting the
 * weights at each call; they stay near fp32's and differ from them (bf16 applied);
 * and fm_gpt_generate completes under bf16, the copies dropped after. */
static void test_bf16_decode(fm_gpt_arch arch) {
    fm_gpt_config cfg = tiny_config(arch);
    fm_rng r;
    fm_rng_init(&r, 5);
    fm_gpt *m = fm_gpt_new(&cfg, &r);
    CHECK(m != NULL);
    if (!m) return;
    fm_gpt_train_mode(m, false);
    bool prev = fm_set_grad_enabled(false);
    fm_gpt_kv_cache *k32 = fm_gpt_kv_cache_new(m, 1), *ka = fm_gpt_kv_cache_new(m, 1), *kb = fm_gpt_kv_cache_new(m, 1);
    int64_t ids[9] = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    double worst = 0;
    bool differ = false, same = true;
    for (int step = 0; step < 5; step++) { /* the 5-token prompt (M = 5: the GEMM), then one-token steps (the GEMV) */
        int64_t at = step ? 4 + step : 0, n = step ? 1 : 5;
        fm_tensor *x = ids_tensor(ids + at, 1, n);
        fm_tensor *l32 = fm_gpt_forward_cached(m, x, k32);
        fm_dtype ac = fm_autocast_set(FM_BF16);
        fm_tensor *la = fm_gpt_forward_cached(m, x, ka);
        CHECK(fm_gpt_keep_lowp_weights(m, true) == FM_OK && m->n_lowp == 4 * cfg.n_layer + 1);
        fm_tensor *lb = fm_gpt_forward_cached(m, x, kb);
        fm_gpt_keep_lowp_weights(m, false);
        fm_autocast_set(ac);
        CHECK_MSG(l32 && la && lb && la->dtype == FM_F32 && lb->dtype == FM_F32, "%s bf16 decode step %d: %s",
                  fm_gpt_arch_name(arch), step, fm_last_error());
        if (l32 && la && lb) {
            int64_t cnt = fm_tensor_numel(l32);
            float *p32 = malloc(sizeof(float) * (size_t)cnt), *pa = malloc(sizeof(float) * (size_t)cnt),
                  *pb = malloc(sizeof(float) * (size_t)cnt);
            fm_tensor_copy_to_host(l32, p32, FM_F32);
            fm_tensor_copy_to_host(la, pa, FM_F32);
            fm_tensor_copy_to_host(lb, pb, FM_F32);
            same &= !memcmp(pa, pb, sizeof(float) * (size_t)cnt);
            for (int64_t i = 0; i < cnt; i++) {
                worst = fmax(worst, fabs((double)pb[i] - p32[i]));
                differ |= pb[i] != p32[i];
            }
            free(p32); free(pa); free(pb);
        }
        fm_tensor_release_n(4, x, l32, la, lb);
    }
    CHECK_MSG(same, "%s bf16 decode: the weights' bf16 copies changed the logits", fm_gpt_arch_name(arch));
    CHECK_MSG(differ && worst < 0.05, "%s bf16 decode: logits off fp32 by %g (bf16 applied: %d)", fm_gpt_arch_name(arch),
              worst, differ);
    fm_gpt_kv_cache_free(k32);
    fm_gpt_kv_cache_free(ka);
    fm_gpt_kv_cache_free(kb);
    int32_t prompt[2] = {7, 3}, out[8];
    int made = 0;
    fm_gpt_sample_params sp = {0.0, 0, 1.0, 1};
    fm_dtype ac = fm_autocast_set(FM_BF16);
    CHECK_MSG(fm_gpt_generate(m, prompt, 2, 8, &sp, true, out, &made, NULL, NULL, NULL) == FM_OK && made == 8, "%s",
              fm_last_error());
    fm_autocast_set(ac);
    CHECK(m->n_lowp == 0 && m->lowp_w == NULL); /* dropped when the loop ends */
    /* copies the caller holds are used and kept; outside bf16 autocast nothing is made */
    ac = fm_autocast_set(FM_BF16);
    CHECK(fm_gpt_keep_lowp_weights(m, true) == FM_OK && m->n_lowp == 4 * cfg.n_layer + 1);
    CHECK(fm_gpt_generate(m, prompt, 2, 4, &sp, true, out, &made, NULL, NULL, NULL) == FM_OK && made == 4);
    CHECK(m->n_lowp == 4 * cfg.n_layer + 1);
    fm_autocast_set(ac);
    CHECK(fm_gpt_keep_lowp_weights(m, false) == FM_OK && m->n_lowp == 0);
    CHECK(fm_gpt_keep_lowp_weights(m, true) == FM_OK && m->n_lowp == 0); /* fp32: nothing to copy */
    CHECK(fm_gpt_keep_lowp_weights(NULL, true) == FM_ERR_INVALID);
    fm_set_grad_enabled(prev);
    fm_gpt_free(m);
}

int main(void) {
    test_vs_pytorch(FM_GPT_GPT2, "gpt2");
    test_vs_pytorch(FM_GPT_LLAMA, "llama");
    test_hf_roundtrip(FM_GPT_GPT2);
    test_hf_roundtrip(FM_GPT_LLAMA);
    test_generate(FM_GPT_GPT2);
    test_generate(FM_GPT_LLAMA);
    test_token_file();
    test_config();
    test_head_dim(FM_GPT_GPT2);
    test_head_dim(FM_GPT_LLAMA);
    test_train_resume();
    test_checkpointing(FM_GPT_GPT2, FM_F32, true);
    test_checkpointing(FM_GPT_LLAMA, FM_F32, true);
    test_checkpointing(FM_GPT_GPT2, FM_BF16, false);
    test_checkpointing(FM_GPT_GPT2, FM_BF16, true);
    test_checkpointing(FM_GPT_LLAMA, FM_BF16, false);
    test_checkpointing(FM_GPT_LLAMA, FM_BF16, true);
    test_bf16_paths(FM_GPT_GPT2);
    test_bf16_paths(FM_GPT_LLAMA);
    test_bf16_decode(FM_GPT_GPT2);
    test_bf16_decode(FM_GPT_LLAMA);
    test_grad_accum_model();
    test_train_efficiency();
    test_fusion();
    TEST_DONE();
}
