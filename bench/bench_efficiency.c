/* Efficiency measurements: peak memory and step time of a GPT-2-style training
 * step (AdamW) for fp32, bf16, fp16 (+ loss scaler), checkpointing of whole
 * blocks, selective recomputation and 4-way gradient accumulation, each against
 * fp32 without checkpointing in the same invocation, plus data loading with a
 * worker thread against preloaded batches.
 *
 *   bench_efficiency [--config kjv|6l|data|converge|all] [--batch B] [--rounds R] [--steps N] [--json]
 *                    [--data-kinds 102]
 *
 * Every mode trains the GPT model of include/fathom/gpt.h (fm_gpt_forward with
 * fm_gpt_set_checkpointing), the one `fathom train` runs. fp32_again repeats fp32
 * as the noise floor of the time ratios.
 * Memory comes from the caching allocator's exact counters:
 *   act  = peak allocated during the step - allocated at its start - gradient
 *          bytes (the activations plus backward temporaries: what the options cut).
 *          A lower bound: the step's peak comes before most parameter gradients
 *          exist (fp32 6L-384: act 283 MiB while forward keeps 314 MiB);
 *   peak = peak allocated during the step - allocated at its start: an upper
 *          bound (it includes the parameter gradients alive at that moment, which
 *          at the peaks measured are those of the last layers only);
 *   saved = peak of the bytes allocated in forward and still alive (tagged
 *          FM_MEM_ACTIVATIONS): forward's peak, transients included;
 *   kept  = of those, what is still allocated when forward ends: the activations
 *          stored for backward (Korthikanti et al.'s measure).
 * Times: the best (minimum) over rounds, with the modes alternating within each
 * round, so bursts of load from other processes on the machine do not decide a
 * ratio (the minimum is the least disturbed run). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "core/parallel.h"
#include "fathom/data.h"
#include "fathom/efficiency.h"
#include "fathom/fathom.h"
#include "fathom/gpt.h"
#include "fathom/optim.h"

#define MAXL 16

static void die(const char *what) {
    fprintf(stderr, "bench_efficiency: %s: %s\n", what, fm_last_error());
    exit(1);
}

typedef struct model {
    fm_gpt_config cfg;
    fm_gpt *g;
    size_t param_bytes;
} model;

static void model_init(model *m, const fm_gpt_config *cfg) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    fm_rng r;
    fm_rng_init(&r, 1234);
    fm_mem_category prev = fm_memory_tag_push(FM_MEM_WEIGHTS);
    m->g = fm_gpt_new(cfg, &r);
    fm_memory_tag_pop(prev);
    if (!m->g) die("gpt_new");
    fm_gpt_train_mode(m->g, true);
    const fm_named_list *ps = fm_gpt_parameters(m->g);
    for (int i = 0; i < ps->n; i++) m->param_bytes += fm_tensor_nbytes(ps->items[i].tensor);
}

typedef enum mode { M_FP32 = 0, M_BF16, M_FP16, M_BLOCKS, M_SELECTIVE, M_ACCUM4, M_FP32B, M_COUNT } mode;
static const char *mode_name[M_COUNT] = {"fp32", "bf16", "fp16", "ckpt_blocks", "ckpt_selective", "grad_accum4", "fp32_again"};

/* Every mode runs the trainer's own model (fm_gpt_forward, fm_gpt_set_checkpointing),
 * so the figures are those of `fathom train` with the same flags. */
static fm_tensor *forward_loss(model *m, mode md, fm_tensor *idx, fm_tensor *tgt) {
    fm_checkpointing ck = md == M_BLOCKS ? FM_CKPT_BLOCKS : md == M_SELECTIVE ? FM_CKPT_SELECTIVE : FM_CKPT_NONE;
    if (fm_gpt_set_checkpointing(m->g, ck)) die("checkpointing");
    fm_tensor *loss = NULL, *logits = fm_gpt_forward(m->g, idx, tgt, &loss);
    fm_tensor_release(logits);
    return loss;
}

typedef struct result {
    double times[64];
    int n;
    size_t act, saved, kept, peak;
    double loss0, loss_last;
    int64_t skipped;
    double scale;
} result;

typedef struct trainer {
    model m;
    fm_optim *opt;
    fm_grad_scaler gs;
    fm_tensor *x, *y;
    int B, T;
} trainer;

static void trainer_init(trainer *t, const fm_gpt_config *cfg, int B) {
    model_init(&t->m, cfg);
    t->B = B;
    t->T = cfg->block_size;
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    oc.lr = 3e-4;
    t->opt = fm_optim_new(&oc);
    int gd = fm_optim_add_group(t->opt, 0.1), gn = fm_optim_add_group(t->opt, 0.0);
    const fm_named_list *ps = fm_gpt_parameters(t->m.g);
    for (int i = 0; i < ps->n; i++)
        if (fm_optim_add_param(t->opt, ps->items[i].tensor->ndim >= 2 ? gd : gn, ps->items[i].name, ps->items[i].tensor)) die("optim");
    fm_mem_category prev = fm_memory_tag_push(FM_MEM_OPTIMIZER);
    if (fm_optim_init_state(t->opt)) die("optim state");
    fm_memory_tag_pop(prev);
    fm_grad_scaler_init(&t->gs, true);
    t->gs.quiet = true;
    /* byte-level tokens: a fixed pseudo-random corpus window per batch row */
    int64_t n = (int64_t)B * t->T;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(n + 1));
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i <= n; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ids[i] = (int64_t)(s % (uint64_t)cfg->vocab_size); }
    t->x = fm_tensor_from_data(ids, 2, (int64_t[]){B, t->T}, FM_I64);
    t->y = fm_tensor_from_data(ids + 1, 2, (int64_t[]){B, t->T}, FM_I64);
    free(ids);
}

static void trainer_free(trainer *t) {
    fm_optim_free(t->opt);
    fm_tensor_release_n(2, t->x, t->y);
    fm_gpt_free(t->m.g);
}

static size_t grad_bytes_alive(trainer *t) {
    size_t n = 0;
    const fm_named_list *ps = fm_gpt_parameters(t->m.g);
    for (int i = 0; i < ps->n; i++) if (ps->items[i].tensor->grad) n += fm_tensor_nbytes(ps->items[i].tensor->grad);
    return n;
}

/* One optimizer step in mode md; fills time and memory. */
static double train_step(trainer *t, mode md, result *res) {
    fm_dtype prec = md == M_BF16 ? FM_BF16 : md == M_FP16 ? FM_F16 : FM_F32;
    int accum = md == M_ACCUM4 ? 4 : 1;
    fm_grad_scaler *gs = md == M_FP16 ? &t->gs : NULL;
    fm_memory_stats s0, s1;
    size_t g0 = grad_bytes_alive(t);
    fm_memory_reset_peak(FM_CPU);
    fm_memory_stats_get(FM_CPU, &s0);
    double t0 = bench_now_s(), loss_sum = 0;
    for (int k = 0; k < accum; k++) {
        int mb = t->B / accum;
        fm_tensor *xs = fm_narrow(t->x, 0, (int64_t)k * mb, mb), *ys = fm_narrow(t->y, 0, (int64_t)k * mb, mb);
        fm_dtype pa = fm_autocast_set(prec);
        fm_mem_category pc = fm_memory_tag_push(FM_MEM_ACTIVATIONS);
        fm_tensor *loss = forward_loss(&t->m, md, xs, ys);
        fm_memory_tag_pop(pc);
        fm_autocast_set(pa);
        if (!loss) die("forward");
        if (k == 0 && res) {
            fm_memory_stats sk;
            fm_memory_stats_get(FM_CPU, &sk);
            size_t kept = sk.by_category[FM_MEM_ACTIVATIONS] - s0.by_category[FM_MEM_ACTIVATIONS];
            if (kept > res->kept) res->kept = kept;
        }
        loss_sum += fm_tensor_item(loss) / accum;
        fm_tensor *l = accum > 1 ? fm_mul_scalar(loss, 1.0 / accum) : fm_tensor_retain(loss);
        fm_tensor *sl = gs ? fm_grad_scaler_scale(gs, l) : fm_tensor_retain(l);
        pc = fm_memory_tag_push(FM_MEM_GRADIENTS);
        if (!sl || fm_backward(sl, NULL, false) != FM_OK) die("backward");
        fm_memory_tag_pop(pc);
        fm_tensor_release_n(5, loss, l, sl, xs, ys);
    }
    fm_memory_stats_get(FM_CPU, &s1);
    bool do_step = true;
    if (gs) {
        const fm_named_list *ps = fm_gpt_parameters(t->m.g);
        fm_tensor *arr[512];
        int n = 0;
        for (int i = 0; i < ps->n && n < 512; i++) arr[n++] = ps->items[i].tensor;
        if (fm_grad_scaler_unscale(gs, n, arr) != FM_OK) die("unscale");
        do_step = fm_grad_scaler_should_step(gs);
    }
    if (do_step && fm_optim_step(t->opt) != FM_OK) die("optim step");
    if (gs) fm_grad_scaler_update(gs);
    fm_optim_zero_grad(t->opt);
    double dt = bench_now_s() - t0;
    size_t grads = 0;
    const fm_named_list *ps = fm_gpt_parameters(t->m.g);
    for (int i = 0; i < ps->n; i++) grads += fm_tensor_nbytes(ps->items[i].tensor);
    size_t above = s1.allocated_peak - s0.allocated;
    size_t act = above > grads - g0 ? above - (grads - g0) : 0;
    if (res) {
        if (res->n < 64) res->times[res->n++] = dt;
        if (act > res->act) res->act = act;
        size_t sv = s1.by_category_peak[FM_MEM_ACTIVATIONS] - s0.by_category[FM_MEM_ACTIVATIONS];
        if (sv > res->saved) res->saved = sv;
        if (above > res->peak) res->peak = above;
        if (res->n == 1) res->loss0 = loss_sum;
        res->loss_last = loss_sum;
        res->skipped = gs ? gs->n_skipped : 0;
        res->scale = gs ? gs->scale : 1;
    }
    return loss_sum;
}

static double best(const double *v, int n) {
    double b = v[0];
    for (int i = 1; i < n; i++) b = v[i] < b ? v[i] : b;
    return b;
}

/* kjv-gpt: the recipe's model when data/recipes/kjv-gpt.ini exists, else the defaults the issue names. */
static void kjv_config(fm_gpt_config *c, int *batch) {
    *c = fm_gpt_config_default(FM_GPT_GPT2);
    c->n_layer = 4; c->n_embd = 256; c->n_head = 4; c->block_size = 128; c->vocab_size = 256;
    FILE *f = fopen("data/recipes/kjv-gpt.ini", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            char k[64];
            double v;
            if (sscanf(line, " %63[a-z_] = %lf", k, &v) != 2) continue;
            if (!strcmp(k, "n_layer")) c->n_layer = (int)v;
            else if (!strcmp(k, "n_embd")) c->n_embd = (int)v;
            else if (!strcmp(k, "n_head")) c->n_head = (int)v;
            else if (!strcmp(k, "block_size")) c->block_size = (int)v;
            else if (!strcmp(k, "vocab_size")) c->vocab_size = (int)v;
            else if (!strcmp(k, "batch_size") || !strcmp(k, "batch")) *batch = (int)v;
        }
        fclose(f);
        fprintf(stderr, "bench_efficiency: kjv-gpt sizes from data/recipes/kjv-gpt.ini\n");
    }
    c->ffn_hidden = 4 * c->n_embd;
    c->dropout = 0.0;
    c->bias = true;
}

static void run_config(const char *name, fm_gpt_config cfg, int B, int rounds, bool json) {
    cfg.ffn_hidden = 4 * cfg.n_embd;
    cfg.dropout = 0.0;
    cfg.bias = true;
    if (fm_gpt_config_validate(&cfg) != FM_OK) die("config");
    trainer t;
    trainer_init(&t, &cfg, B);
    result res[M_COUNT];
    memset(res, 0, sizeof res);
    for (int md = 0; md < M_COUNT; md++) train_step(&t, (mode)md, NULL); /* warm-up: caches, optimizer state */
    for (int r = 0; r < rounds; r++)
        for (int md = 0; md < M_COUNT; md++) train_step(&t, (mode)md, &res[md]);
    double bt = best(res[M_FP32].times, res[M_FP32].n);
    size_t ba = res[M_FP32].act, bs = res[M_FP32].saved;
    char b1[32], b2[32], b3[32];
    printf("\n%s: n_layer %d n_embd %d n_head %d block %d vocab %d batch %d, %lld params (%s), %d rounds, %d threads\n", name,
           cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, cfg.vocab_size, B, (long long)fm_gpt_num_params(t.m.g),
           fm_format_bytes(t.m.param_bytes, b1, sizeof b1), rounds, fm_num_threads());
    size_t bk = res[M_FP32].kept, bp = res[M_FP32].peak;
    printf("%-16s %12s %7s %12s %7s %12s %7s %12s %7s %9s %7s\n", "mode", "act", "ratio", "saved", "ratio", "kept", "ratio", "step peak",
           "ratio", "step ms", "ratio");
    for (int md = 0; md < M_COUNT; md++) {
        result *q = &res[md];
        double tm = best(q->times, q->n);
        char b4[32];
        printf("%-16s %12s %7.3f %12s %7.3f %12s %7.3f %12s %7.3f %9.1f %7.3f", mode_name[md], fm_format_bytes(q->act, b1, sizeof b1),
               (double)q->act / (double)ba, fm_format_bytes(q->saved, b2, sizeof b2), (double)q->saved / (double)bs,
               fm_format_bytes(q->kept, b4, sizeof b4), (double)q->kept / (double)bk, fm_format_bytes(q->peak, b3, sizeof b3),
               (double)q->peak / (double)bp, 1e3 * tm, tm / bt);
        if (md == M_FP16) printf("   (loss scale %g, %lld skipped)", q->scale, (long long)q->skipped);
        printf("\n");
        if (json)
            printf("{\"config\": \"%s\", \"mode\": \"%s\", \"batch\": %d, \"act_bytes\": %zu, \"act_ratio\": %.4f, \"saved_bytes\": %zu, "
                   "\"saved_ratio\": %.4f, \"kept_bytes\": %zu, \"kept_ratio\": %.4f, \"step_peak_bytes\": %zu, \"step_peak_ratio\": %.4f, \"step_ms\": %.2f, \"time_ratio\": %.4f, \"loss_first\": %.6f, "
                   "\"loss_last\": %.6f}\n",
                   name, mode_name[md], B, q->act, (double)q->act / (double)ba, q->saved, (double)q->saved / (double)bs, q->kept, (double)q->kept / (double)bk, q->peak,
                   (double)q->peak / (double)bp, 1e3 * tm, tm / bt, q->loss0, q->loss_last);
    }
    trainer_free(&t);
}

/* ---- convergence: does bf16 reach the fp32 validation loss? ----
 * A small byte-level GPT trained on Genesis-Exodus (Debian's bible-kjv) for the
 * same steps from the same initialization in fp32 and bf16; validation on the
 * held-out last 10%. A proxy for the recipe-level check (kjv-gpt recipe). */
static double eval_loss(trainer *t, mode md, const fm_token_data *d, int64_t lo, int64_t hi) {
    bool pg = fm_set_grad_enabled(false);
    double s = 0;
    int n = 0;
    for (int64_t i = 0; i < 16; i++) {
        fm_tensor *x, *y;
        if (fm_gpt_batch_eval(d, lo, hi, t->B, t->T, i, &x, &y) != FM_OK) break;
        fm_dtype pa = fm_autocast_set(md == M_BF16 ? FM_BF16 : FM_F32);
        fm_tensor *l = forward_loss(&t->m, md, x, y);
        fm_autocast_set(pa);
        if (!l) die("eval");
        s += fm_tensor_item(l);
        n++;
        fm_tensor_release_n(3, l, x, y);
    }
    fm_set_grad_enabled(pg);
    return n ? s / n : NAN;
}

static void run_converge(int steps, bool json) {
    FILE *p = popen("bible 'Gen1:1-Exo40:38' 2>/dev/null", "r");
    if (!p) { printf("\nconvergence: skipped (no 'bible' command)\n"); return; }
    size_t cap = 1 << 22, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n, p)) > 0) n += k;
    pclose(p);
    if (n < 100000) { printf("\nconvergence: skipped (bible-kjv text not available)\n"); free(buf); return; }
    fm_token_data d = {malloc(sizeof(int32_t) * n), (int64_t)n, 256};
    for (size_t i = 0; i < n; i++) d.ids[i] = (unsigned char)buf[i];
    free(buf);
    int64_t split = (int64_t)n * 9 / 10;
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = 2; c.n_embd = 128; c.n_head = 4; c.block_size = 64; c.vocab_size = 256;
    c.ffn_hidden = 512; c.dropout = 0; c.bias = true;
    double val[2], tr[2];
    mode modes[2] = {M_FP32, M_BF16};
    for (int mi = 0; mi < 2; mi++) {
        trainer t;
        trainer_init(&t, &c, 16);
        fm_optim_set_lr(t.opt, 1e-3);
        for (int s = 0; s < steps; s++) {
            fm_tensor_release_n(2, t.x, t.y);
            if (fm_gpt_batch_random(&d, 0, split, t.B, t.T, 42, s, &t.x, &t.y)) die("batch");
            tr[mi] = train_step(&t, modes[mi], NULL);
        }
        val[mi] = eval_loss(&t, modes[mi], &d, split, d.n);
        trainer_free(&t);
    }
    printf("\nconvergence (GPT 2x128, block 64, batch 16, %d AdamW steps on Genesis-Exodus bytes): validation loss fp32 %.4f, "
           "bf16 %.4f, difference %+.4f (last train loss %.4f / %.4f)\n", steps, val[0], val[1], val[1] - val[0], tr[0], tr[1]);
    if (json)
        printf("{\"config\": \"converge\", \"steps\": %d, \"val_fp32\": %.5f, \"val_bf16\": %.5f, \"diff\": %.5f}\n", steps, val[0],
               val[1], val[1] - val[0]);
    free(d.ids);
}

/* ---- data loading: a worker thread preparing batch n+1 vs all batches preloaded ----
 * One epoch (64 steps) per loader kind per round, the kinds alternating within a
 * round, so each round gives its own ratio against the preloaded epoch next to
 * it. Reported: the ratio of the best epochs (as before), and the median and
 * range of the per-round ratios, which show how much the shared machine moved
 * the result. data_kinds selects kinds (a string of 'p', '1', '0', '2'). */
static void run_data(int rounds, bool json, const char *data_kinds) {
    fm_dataset *d = fm_dataset_fashion_mnist(NULL, FM_SPLIT_TRAIN);
    if (!d) { printf("\ndata loading: skipped (%s)\n", fm_last_error()); return; }
    fm_dataset *ds = fm_dataset_slice(d, 0, 8192);
    fm_dataset_release(d);
    fm_rng r;
    fm_rng_init(&r, 9);
    fm_module *net = fm_nn_sequential();
    fm_sequential_add(net, fm_nn_simple(FM_MOD_FLATTEN));
    fm_sequential_add(net, fm_nn_linear(784, 512, true, &r));
    fm_sequential_add(net, fm_nn_simple(FM_MOD_RELU));
    fm_sequential_add(net, fm_nn_linear(512, 10, true, &r));
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    fm_optim *opt = fm_optim_new(&oc);
    fm_optim_add_params(opt, net);
    fm_loader_options lo;
    fm_loader_options_init(&lo);
    lo.batch_size = 128;
    lo.shuffle = true;
    lo.seed = 5;
    lo.drop_last = true;
    lo.transforms.normalize_channels = 1;
    lo.transforms.mean[0] = 0.286f;
    lo.transforms.std[0] = 0.353f;
    lo.transforms.crop_padding = 2;
    lo.transforms.hflip = true;
    enum { NK = 4 };
    const char *names[NK] = {"preloaded", "1 worker", "0 workers", "2 workers"};
    const char codes[NK] = {'p', '1', '0', '2'};
    bool on[NK];
    for (int k = 0; k < NK; k++) on[k] = k == 0 || strchr(data_kinds, codes[k]) != NULL;
    double *times[NK], wait[NK] = {0}, *steps[NK];
    int64_t nsteps[NK] = {0}, cap_steps = (int64_t)rounds * 8192 / 128;
    int64_t reallocs[NK] = {0}, by_workers[NK] = {0}, in_next[NK] = {0};
    for (int k = 0; k < NK; k++) {
        times[k] = calloc((size_t)rounds, sizeof(double));
        steps[k] = calloc((size_t)cap_steps, sizeof(double));
    }
    int64_t nb = 0;
    for (int round = -1; round < rounds; round++) { /* round -1 warms caches and the allocator */
        for (int kind = 0; kind < NK; kind++) {
            if (!on[kind]) continue;
            lo.workers = kind == 1 ? 1 : kind == 3 ? 2 : 0;
            fm_dataloader *l = fm_dataloader_create(ds, &lo);
            if (!l) die("loader");
            nb = fm_dataloader_num_batches(l);
            fm_tensor **px = NULL, **py = NULL;
            if (kind == 0) { /* prepare every batch before the clock starts */
                px = calloc((size_t)nb, sizeof *px);
                py = calloc((size_t)nb, sizeof *py);
                for (int64_t i = 0; i < nb; i++) {
                    fm_batch b;
                    if (fm_dataloader_next(l, &b) || !b.x) die("loader next");
                    px[i] = fm_clone(b.x);
                    py[i] = fm_clone(b.y);
                }
            }
            double w0 = fm_dataloader_wait_seconds(l), t0 = bench_now_s();
            for (int64_t i = 0; i < nb; i++) {
                fm_tensor *bx, *by;
                double ts = bench_now_s();
                if (kind == 0) { bx = px[i]; by = py[i]; }
                else {
                    fm_batch b;
                    if (fm_dataloader_next(l, &b) || !b.x) die("loader next");
                    bx = b.x; by = b.y;
                }
                fm_tensor *o = fm_module_forward(net, bx);
                fm_tensor *loss = o ? fm_cross_entropy(o, by, -100, 0, FM_REDUCE_MEAN) : NULL;
                if (!loss || fm_backward(loss, NULL, false)) die("data step");
                fm_optim_step(opt);
                fm_optim_zero_grad(opt);
                fm_tensor_release_n(2, o, loss);
                if (round >= 0 && nsteps[kind] < cap_steps) steps[kind][nsteps[kind]++] = bench_now_s() - ts;
            }
            double dt = (bench_now_s() - t0) / (double)nb;
            if (round >= 0) {
                times[kind][round] = dt;
                if (kind) wait[kind] += (fm_dataloader_wait_seconds(l) - w0) / (double)nb / rounds;
                reallocs[kind] += fm_dataloader_realloc_count(l);
                int64_t bw = 0, bn = 0;
                fm_dataloader_fill_counts(l, &bw, &bn);
                by_workers[kind] += bw;
                in_next[kind] += bn;
            }
            if (px) for (int64_t i = 0; i < nb; i++) fm_tensor_release_n(2, px[i], py[i]);
            free(px);
            free(py);
            fm_dataloader_free(l);
        }
    }
    printf("\ndata loading (Fashion-MNIST, 8192 samples, batch 128, crop+flip+normalize, MLP 784-512-10 AdamW), %d rounds "
           "of one epoch (%lld steps) per loader, %d threads:\n", rounds, (long long)nb, fm_num_threads());
    /* per-step statistics: a burst of load from another process spoils a few steps,
     * not the median step or the mean of the fastest 90% */
    double med_step[NK] = {0}, trim_step[NK] = {0};
    for (int k = 0; k < NK; k++) {
        if (!on[k] || !nsteps[k]) continue;
        qsort(steps[k], (size_t)nsteps[k], sizeof(double), bench_cmp_d);
        med_step[k] = steps[k][nsteps[k] / 2];
        int64_t keep = nsteps[k] * 9 / 10;
        for (int64_t i = 0; i < keep; i++) trim_step[k] += steps[k][i] / (double)keep;
    }
    double best0 = times[0][0];
    for (int i = 1; i < rounds; i++) best0 = times[0][i] < best0 ? times[0][i] : best0;
    for (int k = 0; k < NK; k++) {
        if (!on[k]) continue;
        double ratio[64], bk = times[k][0];
        int n = rounds < 64 ? rounds : 64;
        for (int i = 0; i < rounds; i++) bk = times[k][i] < bk ? times[k][i] : bk;
        for (int i = 0; i < n; i++) ratio[i] = times[k][i] / times[0][i];
        qsort(ratio, (size_t)n, sizeof *ratio, bench_cmp_d);
        double med = n % 2 ? ratio[n / 2] : 0.5 * (ratio[n / 2 - 1] + ratio[n / 2]);
        double share = by_workers[k] + in_next[k] ? (double)by_workers[k] / (double)(by_workers[k] + in_next[k]) : 0;
        printf("%-10s epoch: best %.3f ms/step, ratio of bests %.3f, per-round ratio median %.3f [%.3f .. %.3f] | step: median %.3f ms "
               "(ratio %.3f), mean of fastest 90%% %.3f ms (ratio %.3f) | waiting %.3f ms/step, filled by workers %.0f%%, "
               "buffer reallocations %lld\n",
               names[k], 1e3 * bk, bk / best0, med, ratio[0], ratio[n - 1], 1e3 * med_step[k], med_step[k] / med_step[0],
               1e3 * trim_step[k], trim_step[k] / trim_step[0], 1e3 * wait[k], 100 * share, (long long)reallocs[k]);
        if (json)
            printf("{\"config\": \"data\", \"mode\": \"%s\", \"step_ms\": %.4f, \"time_ratio\": %.4f, \"ratio_median\": %.4f, "
                   "\"ratio_min\": %.4f, \"ratio_max\": %.4f, \"median_step_ms\": %.4f, \"median_step_ratio\": %.4f, "
                   "\"trimmed_step_ms\": %.4f, \"trimmed_step_ratio\": %.4f, \"wait_ms\": %.4f, \"worker_share\": %.4f, \"reallocs\": %lld}\n",
                   names[k], 1e3 * bk, bk / best0, med, ratio[0], ratio[n - 1], 1e3 * med_step[k], med_step[k] / med_step[0],
                   1e3 * trim_step[k], trim_step[k] / trim_step[0], 1e3 * wait[k], share, (long long)reallocs[k]);
    }
    for (int k = 0; k < NK; k++) {
        free(times[k]);
        free(steps[k]);
    }
    fm_optim_free(opt);
    fm_module_free(net);
    fm_dataset_release(ds);
}

int main(int argc, char **argv) {
    const char *which = "all", *data_kinds = "10";
    int batch = 0, rounds = 5, steps = 400;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--data-kinds") && i + 1 < argc) data_kinds = argv[++i];
        else {
            fprintf(stderr, "usage: bench_efficiency [--config kjv|6l|data|converge|all] [--batch B] [--rounds R] [--steps N] [--json]\n"
                            "                        [--data-kinds p102]  (data: loaders besides preloaded: 1 worker, 0, 2 workers)\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 60) rounds = 5;
    if (!strcmp(which, "kjv") || !strcmp(which, "all")) {
        fm_gpt_config c;
        int B = 16;
        kjv_config(&c, &B);
        if (batch) B = batch;
        run_config("kjv-gpt", c, B, rounds, json);
    }
    if (!strcmp(which, "6l") || !strcmp(which, "all")) {
        fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
        c.n_layer = 6; c.n_embd = 384; c.n_head = 6; c.block_size = 256; c.vocab_size = 256;
        run_config("gpt-6l-384", c, batch ? batch : 8, rounds, json);
    }
    if (!strcmp(which, "data") || !strcmp(which, "all")) run_data(rounds, json, data_kinds);
    if (!strcmp(which, "converge") || !strcmp(which, "all")) run_converge(steps, json);
    fm_parallel_shutdown();
    return 0;
}
