/* Tensor parallelism (fm_gpt_set_tensor_parallel), run as one process and under
 * `mpirun -np 2` / `-np 4` (test_dist_tp_np2/np4): for every T in {1, 2, 4} that
 * divides the world, the ranks form world/T groups of T; each group's model, split
 * over its T ranks, must give what one process gives with the whole model (fp32):
 * logits (gathered when vocabulary-parallel), loss and every parameter's gradient
 * (split ones gathered) within 1e-5 of the largest magnitude, for GPT-2 (biases) and
 * Llama (RoPE, SwiGLU, grouped-query attention). Also: a shard/gather round trip of a
 * three-segment split, and the errors for a T that does not fit the model.
 * Training (fm_gpt_train_ex with tensor_parallel T; world = T x DP): 5 AdamW steps with
 * clipping equal one process (train and validation loss, saved parameters within 1e-5),
 * and checkpoints resume across layouts: 3 steps at T (each rank's part in its own file,
 * put together on resume) then 2 in one process, and 3 in one then 2 at T, end where one
 * process ends. The one-process runs are rank 0's.
 * Selective recomputation inside the split blocks equals the split model without it
 * (gradients within 1e-6, the same bytes sent; trained 5 steps: losses and parameters within
 * 1e-6). fp16 with the loss scaler at TP=2 (x DP): one fp16 process's losses within 1e-4, the
 * same scale on every rank, and an inf in the last rank's own gradient skipped by every rank
 * (FATHOM_TEST_INF_GRAD). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "fathom/autograd.h"
#include "fathom/dist.h"
#include "fathom/gpt.h"
#include "fathom/io.h"
#include "fathom/ops.h"

static int R, N;
static char dir[256];

static fm_gpt_config tiny(fm_gpt_arch arch, int kv) {
    fm_gpt_config c = fm_gpt_config_default(arch);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = kv;
    c.n_embd = 32;
    c.block_size = 16;
    c.vocab_size = 64;
    c.ffn_hidden = arch == FM_GPT_LLAMA ? 48 : 64;
    return c;
}

/* max |a - b| / max |b| over two host arrays */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

static float *host_copy(fm_tensor *t) {
    float *h = malloc(sizeof(float) * (size_t)fm_tensor_numel(t));
    if (h && fm_tensor_copy_to_host(t, h, FM_F32) != FM_OK) { free(h); h = NULL; }
    return h;
}

typedef struct run_out {
    float *logits;  /* [B*T*V] */
    double loss;
    float **grads;  /* per parameter, whole */
    int n;
} run_out;

/* Forward and backward of a model made from seed 42 on a fixed batch; with tp, split first;
 * checkpointing ck (selective: each linear's input function recomputed in backward). */
static bool run_model_ck(const fm_gpt_config *c, fm_dist *tp, fm_checkpointing ck, run_out *o) {
    memset(o, 0, sizeof *o);
    fm_rng init;
    fm_rng_init(&init, 42);
    fm_gpt *m = fm_gpt_new(c, &init);
    if (!m) return false;
    if (tp && fm_gpt_set_tensor_parallel(m, tp) != FM_OK) {
        fprintf(stderr, "split: %s\n", fm_last_error());
        fm_gpt_free(m);
        return false;
    }
    if (fm_gpt_set_checkpointing(m, ck) != FM_OK) {
        fprintf(stderr, "checkpointing: %s\n", fm_last_error());
        fm_gpt_free(m);
        return false;
    }
    enum { B = 2, T = 16 };
    int64_t ids[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 7 + 3) % c->vocab_size;
        tg[i] = i == 5 ? -1 : (i * 11 + 1) % c->vocab_size; /* one ignored target */
    }
    fm_tensor *x = fm_tensor_from_data(ids, 2, (int64_t[]){B, T}, FM_I64);
    fm_tensor *y = fm_tensor_from_data(tg, 2, (int64_t[]){B, T}, FM_I64);
    fm_tensor *loss = NULL, *lg = fm_gpt_forward(m, x, y, &loss);
    bool ok = lg && loss && fm_backward(loss, NULL, false) == FM_OK;
    if (!ok) fprintf(stderr, "forward/backward: %s\n", fm_last_error());
    if (ok) {
        o->loss = fm_tensor_item(loss);
        fm_tensor *l2 = fm_reshape(lg, 2, (int64_t[]){B * T, lg->shape[2]}), *full = NULL;
        fm_tp_split sv = {1, 1, {c->vocab_size}};
        if (lg->shape[2] != c->vocab_size) full = fm_tp_gather(tp, l2, &sv); /* vocabulary-parallel logits */
        o->logits = host_copy(full ? full : l2);
        fm_tensor_release_n(2, l2, full);
        const fm_named_list *p = fm_gpt_parameters(m);
        o->n = p->n;
        o->grads = calloc((size_t)p->n, sizeof *o->grads);
        for (int i = 0; i < p->n && o->grads; i++) {
            fm_tensor *g = p->items[i].tensor->grad, *whole = NULL;
            fm_tp_split sp;
            if (!g) { fprintf(stderr, "no gradient for %s\n", p->items[i].name); ok = false; continue; }
            if (fm_gpt_tp_split(m, p->items[i].tensor, &sp)) whole = fm_tp_gather(tp, g, &sp);
            o->grads[i] = host_copy(whole ? whole : g);
            fm_tensor_release(whole);
        }
    }
    fm_tensor_release_n(4, x, y, lg, loss);
    fm_gpt_free(m);
    return ok && o->logits;
}

static bool run_model(const fm_gpt_config *c, fm_dist *tp, run_out *o) { return run_model_ck(c, tp, FM_CKPT_NONE, o); }

static void free_out(run_out *o) {
    free(o->logits);
    for (int i = 0; o->grads && i < o->n; i++) free(o->grads[i]);
    free(o->grads);
}

static void test_equal(fm_dist *world, const fm_gpt_config *c, int T, const char *what) {
    fm_dist *tp = NULL;
    CHECK(fm_dist_split(world, R / T, &tp) == FM_OK);
    if (!tp) return;
    CHECK(fm_dist_size(tp) == T && fm_dist_rank(tp) == R % T);
    run_out ref, got;
    bool a = run_model(c, NULL, &ref), b = run_model(c, tp, &got);
    CHECK_MSG(a && b, "%s TP=%d: runs failed", what, T);
    if (a && b) {
        fm_rng init;
        fm_rng_init(&init, 42);
        fm_gpt *m = fm_gpt_new(c, &init);
        const fm_named_list *p = fm_gpt_parameters(m);
        double dl = rel_diff(got.logits, ref.logits, 2 * 16 * (int64_t)c->vocab_size), dg = 0;
        const char *worst = "";
        for (int i = 0; i < p->n && got.n == p->n; i++) {
            double d = got.grads[i] && ref.grads[i] ? rel_diff(got.grads[i], ref.grads[i], fm_tensor_numel(p->items[i].tensor)) : 1;
            CHECK_MSG(d <= 1e-5, "%s TP=%d: gradient of %s differs by %.3g of its largest magnitude", what, T,
                      p->items[i].name, d);
            if (d > dg) { dg = d; worst = p->items[i].name; }
        }
        CHECK_MSG(dl <= 1e-5, "%s TP=%d: logits differ by %.3g of their largest magnitude", what, T, dl);
        CHECK_MSG(fabs(got.loss - ref.loss) <= 1e-5 * fabs(ref.loss), "%s TP=%d: loss %.9g vs %.9g", what, T, got.loss,
                  ref.loss);
        if (R == 0)
            fprintf(stderr, "%s TP=%d of %d ranks: loss %.9g vs %.9g, logits %.2e, worst gradient %.2e (%s)\n", what, T, N,
                    got.loss, ref.loss, dl, dg, worst);
        fm_gpt_free(m);
    }
    if (a) free_out(&ref);
    if (b) free_out(&got);
    fm_dist_finalize(tp);
}

/* Selective recomputation inside the split blocks (norm and tp_copy, attention core,
 * activation, each recomputed in backward on this rank's shards): the loss, logits and
 * every gradient equal the split model's without it (within 1e-6 of the largest
 * magnitude; recomputing tp_copy must not all-reduce its gradient twice, which would
 * multiply the replicated parameters' gradients by T). */
static void test_selective(fm_dist *world, const fm_gpt_config *c, int T, const char *what) {
    fm_dist *tp = NULL;
    CHECK(fm_dist_split(world, R / T, &tp) == FM_OK);
    if (!tp) return;
    fm_dist_stats s0, s1, s2;
    run_out ref, got;
    fm_dist_stats_get(tp, &s0);
    bool a = run_model_ck(c, tp, FM_CKPT_NONE, &ref);
    fm_dist_stats_get(tp, &s1);
    bool b = run_model_ck(c, tp, FM_CKPT_SELECTIVE, &got);
    fm_dist_stats_get(tp, &s2);
    CHECK_MSG(a && b, "%s TP=%d selective: runs failed", what, T);
    if (a && b) {
        double dl = rel_diff(got.logits, ref.logits, 2 * 16 * (int64_t)c->vocab_size), dg = 0;
        fm_rng init;
        fm_rng_init(&init, 42);
        fm_gpt *m = fm_gpt_new(c, &init);
        const fm_named_list *p = fm_gpt_parameters(m);
        for (int i = 0; i < p->n && got.n == p->n; i++) {
            double d = got.grads[i] && ref.grads[i] ? rel_diff(got.grads[i], ref.grads[i], fm_tensor_numel(p->items[i].tensor)) : 1;
            CHECK_MSG(d <= 1e-6, "%s TP=%d selective: gradient of %s differs by %.3g of its largest magnitude", what, T,
                      p->items[i].name, d);
            dg = fmax(dg, d);
        }
        CHECK_MSG(dl <= 1e-6 && fabs(got.loss - ref.loss) <= 1e-6 * fabs(ref.loss),
                  "%s TP=%d selective: logits differ by %.3g, loss %.9g vs %.9g", what, T, dl, got.loss, ref.loss);
        /* the same collectives: recomputing a tp_copy sends nothing more */
        CHECK_MSG(s2.bytes_sent - s1.bytes_sent == s1.bytes_sent - s0.bytes_sent,
                  "%s TP=%d selective: %lld bytes sent, %lld without", what, T, (long long)(s2.bytes_sent - s1.bytes_sent),
                  (long long)(s1.bytes_sent - s0.bytes_sent));
        if (R == 0)
            fprintf(stderr, "%s TP=%d selective recompute: loss %.9g vs %.9g, logits %.2e, worst gradient %.2e\n", what, T,
                    got.loss, ref.loss, dl, dg);
        fm_gpt_free(m);
    }
    if (a) free_out(&ref);
    if (b) free_out(&got);
    fm_dist_finalize(tp);
}

/* The loss of a training forward (dropout on) of the model from seed 42, its dropout
 * generator seeded `seed`; with tp, split first. */
static double dropout_loss(const fm_gpt_config *c, fm_dist *tp, uint64_t seed) {
    fm_rng init, drop;
    fm_rng_init(&init, 42);
    fm_rng_init(&drop, seed);
    fm_gpt *m = fm_gpt_new(c, &init);
    double l = NAN;
    if (!m || (tp && fm_gpt_set_tensor_parallel(m, tp) != FM_OK)) { fm_gpt_free(m); return l; }
    fm_gpt_set_rng(m, &drop);
    fm_gpt_train_mode(m, true);
    enum { B = 2, T = 16 };
    int64_t ids[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 5 + 1) % c->vocab_size;
        tg[i] = (i * 3 + 2) % c->vocab_size;
    }
    fm_tensor *x = fm_tensor_from_data(ids, 2, (int64_t[]){B, T}, FM_I64);
    fm_tensor *y = fm_tensor_from_data(tg, 2, (int64_t[]){B, T}, FM_I64);
    fm_tensor *loss = NULL, *lg = fm_gpt_forward(m, x, y, &loss);
    if (lg && loss) l = fm_tensor_item(loss);
    fm_tensor_release_n(4, x, y, lg, loss);
    fm_gpt_free(m);
    return l;
}

/* Dropout seeds (fm_dist_rank_seed of the data-parallel rank, as the trainer seeds them):
 * the ranks of a tensor-parallel group draw the masks one process draws with their
 * group's seed (the GPT's dropouts act on the activations the group holds whole: after
 * the embedding's and the row-parallel layers' all-reduces), and data-parallel ranks,
 * given the same tokens, draw different masks, so their losses differ. */
static void test_dropout(fm_dist *world, int T) {
    fm_dist *tp = NULL;
    CHECK(fm_dist_split(world, R / T, &tp) == FM_OK);
    if (!tp) return;
    fm_gpt_config c = tiny(FM_GPT_GPT2, 4);
    c.dropout = 0.3;
    const uint64_t seed = fm_dist_rank_seed(77, R / T);
    double got = dropout_loss(&c, tp, seed), whole = dropout_loss(&c, NULL, seed);
    c.dropout = 0;
    double none = dropout_loss(&c, NULL, seed);
    CHECK_MSG(fabs(got - whole) <= 1e-5 * fabs(whole), "dropout at TP=%d: loss %.9g, one process with the group's seed %.9g",
              T, got, whole);
    CHECK_MSG(fabs(whole - none) > 1e-6 * fabs(none), "dropout 0.3 did not change the loss (%.9g)", none);
    const int G = N / T; /* data-parallel groups: their losses on the same tokens must differ */
    double *all = calloc((size_t)N, sizeof *all);
    all[R] = got;
    CHECK(fm_dist_allreduce_sum_f64(world, all, N) == FM_OK);
    for (int a = 0; a < N; a++)
        for (int b = 0; b < a; b++) {
            bool same_group = a / T == b / T;
            CHECK_MSG(same_group ? all[a] == all[b] : fabs(all[a] - all[b]) > 1e-6 * fabs(all[b]),
                      "dropout at TP=%d: ranks %d and %d (%s data-parallel rank) got losses %.9g and %.9g", T, a, b,
                      same_group ? "the same" : "another", all[a], all[b]);
        }
    if (R == 0)
        fprintf(stderr, "dropout at TP=%d x DP=%d: loss %.9g (one process with the seed: %.9g, without dropout %.9g)%s\n", T,
                G, got, whole, none, G > 1 ? "; the data-parallel groups' losses differ" : "");
    free(all);
    fm_dist_finalize(tp);
}

/* shard then gather gives back the tensor; each shard holds part r of every segment */
static void test_shard_gather(fm_dist *world) {
    fm_dist *tp = NULL;
    CHECK(fm_dist_split(world, 0, &tp) == FM_OK); /* the whole world as one group */
    const int T = fm_dist_size(tp), r = fm_dist_rank(tp);
    const int64_t segs[3] = {8, 4, 4}, cols = 3;
    fm_tp_split s = {0, 3, {8, 4, 4}};
    float v[16 * 3];
    for (int i = 0; i < 16 * 3; i++) v[i] = (float)i;
    fm_tensor *full = fm_tensor_from_data(v, 2, (int64_t[]){16, cols}, FM_F32);
    fm_tensor *sh = fm_tp_shard(T, r, full, &s), *back = sh ? fm_tp_gather(tp, sh, &s) : NULL;
    CHECK(sh && sh->shape[0] == 16 / T && sh->shape[1] == cols);
    if (sh) { /* the first row of this rank's key part is row 8 + r*4/T of the whole */
        int64_t row = segs[0] / T;
        CHECK(fm_tensor_get(sh, row * cols) == (double)((8 + r * (segs[1] / T)) * cols));
    }
    CHECK(back && rel_diff(fm_tensor_data(back), v, 16 * 3) == 0);
    fm_tp_split c1 = {1, 1, {3}}; /* 3 columns do not split in 2 or 4 */
    fm_tensor *bad = T > 1 ? fm_tp_shard(T, r, full, &c1) : NULL;
    if (T > 1) {
        CHECK(!bad);
        CHECK_ERR_CONTAINS("does not split into");
    }
    fm_tensor_release_n(4, full, sh, back, bad);
    fm_dist_finalize(tp);
}

/* A bad target on one rank of the group: that rank still joins the loss's collectives
 * and returns the error naming it; the others get their (finite) loss instead of
 * waiting in a sum that rank never joined. */
static void test_bad_target(fm_dist *world) {
    fm_dist *tp = NULL;
    CHECK(fm_dist_split(world, 0, &tp) == FM_OK);
    const int T = fm_dist_size(tp), r = fm_dist_rank(tp);
    const int64_t V = 4 * T, rows = 3;
    float lv[3 * 4];
    for (int i = 0; i < 12; i++) lv[i] = 0.1f * (float)(i + r);
    int64_t tg[3] = {1, 0, r == 0 ? V + 5 : 2}; /* rank 0's last target is past the vocabulary */
    fm_tensor *lg = fm_tensor_from_data(lv, 2, (int64_t[]){rows, 4}, FM_F32), *t = fm_tensor_from_data(tg, 1, &rows, FM_I64);
    fm_tensor *loss = fm_tp_cross_entropy(tp, lg, t, (int64_t)r * 4, V);
    if (r == 0) {
        CHECK(!loss);
        CHECK_ERR_CONTAINS("is outside 0..");
    } else {
        CHECK_MSG(loss && isfinite(fm_tensor_item(loss)), "rank %d: a loss beside rank 0's bad target", r);
    }
    fm_tensor_release_n(3, lg, t, loss);
    fm_dist_finalize(tp);
}

static void test_errors(void) {
    fm_gpt_config g = tiny(FM_GPT_GPT2, 4), l = tiny(FM_GPT_LLAMA, 2);
    CHECK(fm_gpt_tp_check(&g, 3) != FM_OK);
    CHECK_ERR_CONTAINS("--tensor-parallel 3 does not divide the model's 4 attention heads");
    CHECK(fm_gpt_tp_check(&g, 8) != FM_OK);
    CHECK_ERR_CONTAINS("--tensor-parallel 8 is larger than the model's 4 attention heads");
    CHECK(fm_gpt_tp_check(&l, 4) != FM_OK);
    CHECK_ERR_CONTAINS("does not divide the model's 2 key/value heads");
    fm_gpt_config f = g;
    f.ffn_hidden = 66;
    CHECK(fm_gpt_tp_check(&f, 4) != FM_OK);
    CHECK_ERR_CONTAINS("does not divide the MLP width 66");
    f = g;
    f.vocab_size = 66;
    CHECK(fm_gpt_tp_check(&f, 4) != FM_OK);
    CHECK_ERR_CONTAINS("does not divide the vocabulary of 66 tokens");
    CHECK(fm_gpt_tp_check(&g, 4) == FM_OK && fm_gpt_tp_check(&l, 2) == FM_OK);
}

/* every rank waits for every other (a broadcast is no barrier: its root may run on) */
static void barrier(fm_dist *d) {
    double x = 0;
    CHECK(fm_dist_allreduce_sum_f64(d, &x, 1) == FM_OK);
}

/* Largest |a - b| over the largest |b| across every tensor of two model files; -1 if they differ in kind. */
static double file_diff(const char *pa, const char *pb) {
    fm_named_list a, b;
    if (fm_safetensors_load(pa, &a, NULL) != FM_OK) return -1;
    if (fm_safetensors_load(pb, &b, NULL) != FM_OK) { fm_named_list_free(&a); return -1; }
    double diff = a.n == b.n && a.n > 0 ? 0 : -1, mag = 0;
    for (int i = 0; i < a.n && diff >= 0; i++) {
        int k = fm_named_list_find(&b, a.items[i].name);
        fm_tensor *x = a.items[i].tensor, *y = k >= 0 ? b.items[k].tensor : NULL;
        if (!y || fm_tensor_numel(x) != fm_tensor_numel(y) || x->dtype != FM_F32) { diff = -1; break; }
        const float *px = fm_tensor_data(x), *py = fm_tensor_data(y);
        for (int64_t j = 0; j < fm_tensor_numel(x); j++) {
            diff = fmax(diff, fabs((double)px[j] - py[j]));
            mag = fmax(mag, fabs((double)py[j]));
        }
    }
    fm_named_list_free(&a);
    fm_named_list_free(&b);
    return diff < 0 ? -1 : diff / (mag > 0 ? mag : 1);
}

static double tp_dropout; /* the model's dropout in tp_train */
static fm_dtype tp_precision = FM_F32;     /* and its precision (fp16: with the loss scaler) */
static fm_checkpointing tp_ckpt = FM_CKPT_NONE; /* and checkpointing */

/* A small GPT on dir/corpus.txt: 5 steps (or stop after `stop`, or resume out's checkpoint). */
static fm_status tp_train(fm_dist *d, int T, fm_gpt_arch arch, const char *out, int64_t stop, bool resume,
                          fm_gpt_train_result *res) {
    static char corpus[400];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    fm_gpt_train_opts o = fm_gpt_train_defaults();
    o.model = tiny(arch, 2);
    o.model.n_embd = 16;
    o.model.block_size = 8;
    o.model.ffn_hidden = 32;
    o.model.dropout = tp_dropout;
    o.tokenizer = FM_TOK_BYTE;
    o.corpus = corpus;
    o.out_dir = out;
    o.batch_size = 4;
    o.steps = 5;
    o.warmup = 1;
    o.lr = 3e-3;
    o.grad_clip = 0.05; /* clips every step: the norm must be the whole model's */
    o.eval_every = 5;
    o.eval_batches = 4;
    o.ckpt_every = 0;
    o.quiet = true;
    o.dist = d;
    o.tensor_parallel = T;
    o.stop_after = stop;
    o.resume = resume;
    o.eff.precision = tp_precision;
    o.eff.loss_scaling = tp_precision == FM_F16;
    o.eff.checkpointing = tp_ckpt;
    return fm_gpt_train_ex(&o, res);
}

static void path(char *buf, size_t n, const char *run, int T, fm_gpt_arch arch, const char *file) {
    snprintf(buf, n, "%s/%s-t%d-%s%s%s", dir, run, T, fm_gpt_arch_name(arch), file ? "/" : "", file ? file : "");
}

static void test_train(fm_dist *d, int T, fm_gpt_arch arch) {
    char out[400], ref[400], pa[500], pb[500];
    fm_gpt_train_result a, b;
    path(out, sizeof out, "tp", T, arch, NULL);
    path(ref, sizeof ref, "ref", T, arch, NULL);
    fm_status st = tp_train(d, T, arch, out, 0, false, &a);
    CHECK_MSG(st == FM_OK, "%s TP=%d training: %s", fm_gpt_arch_name(arch), T, fm_last_error());
    CHECK(st != FM_OK || (a.dist.tensor_parallel == T && a.dist.world_size == N && a.dist.tp_steps == 5 &&
                          a.dist.tp_bytes_sent == 5 * a.dist.tp_formula_bytes));
    if (R == 0 && st == FM_OK) {
        CHECK(tp_train(NULL, 1, arch, ref, 0, false, &b) == FM_OK);
        double et = fabs(a.train_loss - b.train_loss) / fabs(b.train_loss), ev = fabs(a.val_loss - b.val_loss) / fabs(b.val_loss);
        path(pa, sizeof pa, "tp", T, arch, "model.safetensors");
        path(pb, sizeof pb, "ref", T, arch, "model.safetensors");
        double pd = file_diff(pa, pb);
        CHECK_MSG(et <= 1e-5 && ev <= 1e-5, "%s TP=%d: losses differ: train %.3g, val %.3g", fm_gpt_arch_name(arch), T, et, ev);
        CHECK_MSG(pd >= 0 && pd <= 1e-5, "%s TP=%d: parameters differ by %.3g", fm_gpt_arch_name(arch), T, pd);
        fprintf(stderr, "%s trained at TP=%d x DP=%d: train loss %.9g (one process %.9g), val within %.2g, parameters "
                "within %.2g; %lld bytes sent per step (formula %lld)\n", fm_gpt_arch_name(arch), T, N / T, a.train_loss,
                b.train_loss, ev, pd, (long long)(a.dist.tp_bytes_sent / 5), (long long)a.dist.tp_formula_bytes);
    }
    barrier(d);
    /* resume T -> 1 */
    char ra[400], rb[400];
    path(ra, sizeof ra, "t-to-1", T, arch, NULL);
    path(rb, sizeof rb, "1-to-t", T, arch, NULL);
    CHECK(tp_train(d, T, arch, ra, 3, false, &a) == FM_OK);
    if (R == 0) {
        CHECK(tp_train(NULL, 1, arch, ra, 0, true, &a) == FM_OK);
        CHECK(tp_train(NULL, 1, arch, rb, 3, false, &b) == FM_OK);
        path(pa, sizeof pa, "t-to-1", T, arch, "model.safetensors");
        path(pb, sizeof pb, "ref", T, arch, "model.safetensors");
        double pd = file_diff(pa, pb);
        CHECK_MSG(pd >= 0 && pd <= 1e-5, "%s TP=%d -> 1 resume: parameters differ by %.3g", fm_gpt_arch_name(arch), T, pd);
        fprintf(stderr, "%s resume TP=%d -> 1 process: final train loss %.9g, parameters within %.2g of one process\n",
                fm_gpt_arch_name(arch), T, a.train_loss, pd);
    }
    barrier(d);
    /* resume 1 -> T */
    CHECK(tp_train(d, T, arch, rb, 0, true, &b) == FM_OK);
    if (R == 0) {
        path(pa, sizeof pa, "1-to-t", T, arch, "model.safetensors");
        path(pb, sizeof pb, "ref", T, arch, "model.safetensors");
        double pd = file_diff(pa, pb);
        CHECK_MSG(pd >= 0 && pd <= 1e-5, "%s 1 -> TP=%d resume: parameters differ by %.3g", fm_gpt_arch_name(arch), T, pd);
        fprintf(stderr, "%s resume 1 process -> TP=%d: final train loss %.9g, parameters within %.2g of one process\n",
                fm_gpt_arch_name(arch), T, b.train_loss, pd);
    }
    barrier(d);
}

/* With dropout, a tensor-parallel group (DP = 1) trains as one process does: its ranks
 * draw the masks one process draws (the seed of data-parallel rank 0 is the job's). */
static void test_train_dropout(fm_dist *d, int T) {
    char out[400], ref[400], pa[500], pb[500];
    fm_gpt_train_result a, b;
    tp_dropout = 0.2;
    path(out, sizeof out, "tp-dropout", T, FM_GPT_GPT2, NULL);
    path(ref, sizeof ref, "ref-dropout", T, FM_GPT_GPT2, NULL);
    CHECK(tp_train(d, T, FM_GPT_GPT2, out, 0, false, &a) == FM_OK);
    if (R == 0) {
        CHECK(tp_train(NULL, 1, FM_GPT_GPT2, ref, 0, false, &b) == FM_OK);
        double et = fabs(a.train_loss - b.train_loss) / fabs(b.train_loss);
        path(pa, sizeof pa, "tp-dropout", T, FM_GPT_GPT2, "model.safetensors");
        path(pb, sizeof pb, "ref-dropout", T, FM_GPT_GPT2, "model.safetensors");
        double pd = file_diff(pa, pb);
        CHECK_MSG(et <= 1e-5 && pd >= 0 && pd <= 1e-5, "dropout 0.2 at TP=%d: train loss differs by %.3g, parameters by %.3g",
                  T, et, pd);
        fprintf(stderr, "dropout 0.2 trained at TP=%d: train loss %.9g (one process %.9g), parameters within %.2g\n", T,
                a.train_loss, b.train_loss, pd);
    }
    tp_dropout = 0;
    barrier(d);
}

/* Every rank's value of v, gathered (all[r] = rank r's). */
static void gather_all(fm_dist *d, double v, double *all) {
    for (int r = 0; r < N; r++) all[r] = r == R ? v : 0;
    CHECK(fm_dist_allreduce_sum_f64(d, all, N) == FM_OK);
}

/* fp16 under tensor parallelism (TP=2, and TP=2 x DP=2 at 4 ranks): the loss scaler's
 * overflow check is the job's. Trained 5 steps, the losses are one fp16 process's within
 * 1e-4 (fp16 rounds the row-parallel halves before their sum, one process the whole sum),
 * and every rank ends with the same scale. An inf written into the last rank's own part
 * of the embedding's gradient at step 2 (FATHOM_TEST_INF_GRAD) makes every rank skip that
 * step and halve its scale (65536 -> 32768), as one process does with the inf in its
 * gradient; the continued losses then equal that process's within 1e-4 and differ from the
 * run without the skip. */
static void test_train_fp16(fm_dist *d, int T) {
    char out[400], ref[400], env[32];
    double all[8];
    fm_gpt_train_result a, b, c, e;
    tp_precision = FM_F16;
    path(out, sizeof out, "tp-fp16", T, FM_GPT_LLAMA, NULL);
    path(ref, sizeof ref, "ref-fp16", T, FM_GPT_LLAMA, NULL);
    fm_status st = tp_train(d, T, FM_GPT_LLAMA, out, 0, false, &a);
    CHECK_MSG(st == FM_OK, "fp16 TP=%d training: %s", T, fm_last_error());
    gather_all(d, st == FM_OK ? a.loss_scale : -1, all);
    for (int r = 1; r < N; r++) CHECK_MSG(all[r] == all[0], "fp16 TP=%d: rank %d's loss scale %g, rank 0's %g", T, r, all[r], all[0]);
    if (R == 0 && st == FM_OK) {
        CHECK(tp_train(NULL, 1, FM_GPT_LLAMA, ref, 0, false, &b) == FM_OK);
        double et = fabs(a.train_loss - b.train_loss) / fabs(b.train_loss), ev = fabs(a.val_loss - b.val_loss) / fabs(b.val_loss);
        CHECK_MSG(et <= 1e-4 && ev <= 1e-4, "fp16 TP=%d: train loss %.9g vs one fp16 process %.9g, val differs by %.3g", T,
                  a.train_loss, b.train_loss, ev);
        CHECK_MSG(a.loss_scale == b.loss_scale && a.skipped_steps == b.skipped_steps,
                  "fp16 TP=%d: scale %g, %lld skipped; one process %g, %lld", T, a.loss_scale, (long long)a.skipped_steps,
                  b.loss_scale, (long long)b.skipped_steps);
        fprintf(stderr, "fp16 trained at TP=%d x DP=%d: train loss %.9g (one fp16 process %.9g, %.2g), val within %.2g; "
                "loss scale %g on every rank, %lld skipped\n", T, N / T, a.train_loss, b.train_loss, et, ev, a.loss_scale,
                (long long)a.skipped_steps);
    }
    barrier(d);
    /* a forced overflow on the last rank only */
    snprintf(env, sizeof env, "2:%d", N - 1);
    setenv("FATHOM_TEST_INF_GRAD", env, 1);
    path(out, sizeof out, "tp-fp16-inf", T, FM_GPT_LLAMA, NULL);
    st = tp_train(d, T, FM_GPT_LLAMA, out, 0, false, &c);
    unsetenv("FATHOM_TEST_INF_GRAD");
    CHECK_MSG(st == FM_OK, "fp16 TP=%d with an inf on rank %d: %s", T, N - 1, fm_last_error());
    gather_all(d, st == FM_OK ? c.loss_scale : -1, all);
    for (int r = 0; r < N; r++)
        CHECK_MSG(all[r] == (st == FM_OK ? a.loss_scale / 2 : -1), "fp16 TP=%d, inf on rank %d at step 2: rank %d's scale %g, "
                  "expected %g", T, N - 1, r, all[r], a.loss_scale / 2);
    gather_all(d, st == FM_OK ? (double)c.skipped_steps : -1, all);
    for (int r = 0; r < N; r++)
        CHECK_MSG(all[r] == (double)a.skipped_steps + 1, "fp16 TP=%d, inf on rank %d: rank %d skipped %g steps, expected %lld",
                  T, N - 1, r, all[r], (long long)a.skipped_steps + 1);
    if (R == 0 && st == FM_OK) {
        setenv("FATHOM_TEST_INF_GRAD", "2:0", 1);
        path(ref, sizeof ref, "ref-fp16-inf", T, FM_GPT_LLAMA, NULL);
        CHECK(tp_train(NULL, 1, FM_GPT_LLAMA, ref, 0, false, &e) == FM_OK);
        unsetenv("FATHOM_TEST_INF_GRAD");
        double et = fabs(c.train_loss - e.train_loss) / fabs(e.train_loss);
        CHECK_MSG(e.loss_scale == c.loss_scale && e.skipped_steps == c.skipped_steps && et <= 1e-4,
                  "fp16 TP=%d skipped step: loss %.9g, scale %g; one process %.9g, scale %g", T, c.train_loss, c.loss_scale,
                  e.train_loss, e.loss_scale);
        CHECK_MSG(fabs(c.train_loss - a.train_loss) > 1e-6 * fabs(a.train_loss),
                  "fp16 TP=%d: the skipped step changed nothing (loss %.9g)", T, c.train_loss);
        fprintf(stderr, "fp16 TP=%d x DP=%d, inf in rank %d's gradient at step 2: every rank skipped it, scale %g; loss %.9g "
                "(one process with the inf: %.9g; without any: %.9g)\n", T, N / T, N - 1, c.loss_scale, c.train_loss,
                e.train_loss, a.train_loss);
    }
    tp_precision = FM_F32;
    barrier(d);
}

/* Selective recomputation inside the split blocks, trained: 5 steps at TP=T end on the
 * losses and parameters of TP=T without it (within 1e-6) and send the same bytes. */
static void test_train_selective(fm_dist *d, int T) {
    char out[400], ref[400], pa[500], pb[500];
    fm_gpt_train_result a, b;
    path(ref, sizeof ref, "tp-nosel", T, FM_GPT_GPT2, NULL);
    path(out, sizeof out, "tp-sel", T, FM_GPT_GPT2, NULL);
    fm_status st = tp_train(d, T, FM_GPT_GPT2, ref, 0, false, &b);
    CHECK_MSG(st == FM_OK, "TP=%d training: %s", T, fm_last_error());
    tp_ckpt = FM_CKPT_SELECTIVE;
    fm_status st2 = tp_train(d, T, FM_GPT_GPT2, out, 0, false, &a);
    tp_ckpt = FM_CKPT_NONE;
    CHECK_MSG(st2 == FM_OK, "selective TP=%d training: %s", T, fm_last_error());
    if (R == 0 && st == FM_OK && st2 == FM_OK) {
        double et = fabs(a.train_loss - b.train_loss) / fabs(b.train_loss), ev = fabs(a.val_loss - b.val_loss) / fabs(b.val_loss);
        path(pa, sizeof pa, "tp-sel", T, FM_GPT_GPT2, "model.safetensors");
        path(pb, sizeof pb, "tp-nosel", T, FM_GPT_GPT2, "model.safetensors");
        double pd = file_diff(pa, pb);
        CHECK_MSG(et <= 1e-6 && ev <= 1e-6 && pd >= 0 && pd <= 1e-6,
                  "selective TP=%d: train loss %.9g vs %.9g, val %.3g, parameters %.3g", T, a.train_loss, b.train_loss, ev, pd);
        CHECK_MSG(a.dist.tp_bytes_sent == b.dist.tp_bytes_sent && a.dist.tp_bytes_sent == 5 * a.dist.tp_formula_bytes,
                  "selective TP=%d: %lld bytes sent, %lld without, formula %lld x 5", T, (long long)a.dist.tp_bytes_sent,
                  (long long)b.dist.tp_bytes_sent, (long long)a.dist.tp_formula_bytes);
        fprintf(stderr, "selective recompute trained at TP=%d x DP=%d: train loss %.9g (without: %.9g), parameters within "
                "%.2g, %lld bytes per step both\n", T, N / T, a.train_loss, b.train_loss, pd,
                (long long)(a.dist.tp_bytes_sent / 5));
    }
    barrier(d);
}

int main(void) {
    fm_dist *d = NULL;
    if (fm_dist_init(&d) != FM_OK) { fprintf(stderr, "dist init: %s\n", fm_last_error()); return 1; }
    R = fm_dist_rank(d);
    N = fm_dist_size(d);
    for (int T = 1; T <= 4 && T <= N; T *= 2) {
        if (N % T) continue;
        fm_gpt_config g = tiny(FM_GPT_GPT2, 4), l = tiny(FM_GPT_LLAMA, T <= 2 ? 2 : 4);
        test_equal(d, &g, T, "gpt2");
        test_equal(d, &l, T, T <= 2 ? "llama (4 heads, 2 kv)" : "llama (4 heads, 4 kv)");
        test_dropout(d, T);
        if (T > 1) {
            test_selective(d, &g, T, "gpt2");
            test_selective(d, &l, T, "llama");
        }
    }
    test_shard_gather(d);
    test_bad_target(d);
    test_errors();
    if (N > 1) {
        if (R == 0) {
            snprintf(dir, sizeof dir, "/tmp/fathom-dist-tp-XXXXXX");
            if (!mkdtemp(dir)) { perror("mkdtemp"); fm_dist_abort(d, 1); }
            char p[400];
            snprintf(p, sizeof p, "%s/corpus.txt", dir);
            FILE *f = fopen(p, "w");
            for (int i = 0; f && i < 60; i++) fprintf(f, "In the beginning %d was the word, and the word was %d.\n", i, i * 7 % 13);
            if (f) fclose(f);
        }
        CHECK(fm_dist_broadcast(d, dir, sizeof dir, 0) == FM_OK);
        test_train(d, 2, FM_GPT_GPT2);
        test_train(d, 2, FM_GPT_LLAMA);
        if (N == 4) test_train(d, 4, FM_GPT_GPT2);
        test_train_fp16(d, 2);
        test_train_selective(d, 2);
        test_train_dropout(d, N);
        barrier(d);
        if (R == 0) {
            char cmd[300];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
            if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
        }
    }
    fm_dist_finalize(d);
    TEST_DONE();
}
