/* The language-model training loop: corpus -> tokenizer -> token file -> AdamW
 * steps with validation and checkpoints that resume bit for bit.
 *
 * Exact resume rests on three things: batches are a pure function of (seed,
 * step) (fm_gpt_batch_random), the learning rate is a pure function of the step
 * (fm_lr_at), and the checkpoint stores the weights, the Adam moments, the step
 * and the dropout RNG counter. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fathom/autograd.h"
#include "fathom/efficiency.h" /* precision, checkpointing, accumulation, memory limits */
#include "fathom/io.h"    /* checkpoints, fm_mkdir_p */
#include "fathom/optim.h" /* AdamW, clipping, schedules */
#include "fathom/observe.h" /* --logdir: TensorBoard scalars and histograms; the progress line */
#include "fathom/profile.h" /* --profile: step, data and optimizer spans */
#include "gpt/gpt_internal.h"

fm_gpt_train_opts fm_gpt_train_defaults(void) {
    fm_gpt_train_opts o;
    memset(&o, 0, sizeof o);
    o.model = fm_gpt_config_default(FM_GPT_GPT2);
    o.model.n_layer = 4;
    o.model.n_head = 4;
    o.model.n_embd = 128;
    o.model.block_size = 128;
    o.model.ffn_hidden = 512;
    o.out_dir = "runs/gpt";
    o.corpus = "kjv";
    o.tokenizer = FM_TOK_BPE;
    o.tokenizer_vocab = 512;
    o.val_fraction = 0.1;
    o.batch_size = 16;
    o.steps = 2000;
    o.warmup = 100;
    o.lr = 1e-3;
    o.min_lr = 1e-4;
    o.weight_decay = 0.1;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.grad_clip = 1.0;
    o.eval_every = 250;
    o.ckpt_every = 250;
    o.log_every = 50;
    o.eval_batches = 8;
    o.seed = 1337;
    o.eff = fm_efficiency_defaults();
    return o;
}

int64_t fm_gpt_config_num_params(const fm_gpt_config *c) {
    if (!c || fm_gpt_config_validate(c)) return -1;
    const bool llama = c->arch == FM_GPT_LLAMA, bias = c->bias && !llama;
    const int64_t C = c->n_embd, V = c->vocab_size, F = c->ffn_hidden, H = c->n_head, D = C / H;
    const int64_t KV = llama ? c->n_kv_head : H;
    int64_t per = 2 * C                              /* ln_1, ln_2 */
                  + (H + 2 * KV) * D * C + C * H * D /* qkv, proj */
                  + (llama ? 2 : 1) * F * C + C * F; /* fc (gate+up), fc2 */
    if (bias) per += 2 * C + (H + 2 * KV) * D + C + F + C;
    return V * C + (llama ? 0 : (int64_t)c->block_size * C) + c->n_layer * per + C + (bias ? C : 0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* The KJV from Debian's bible-kjv, verse numbers at line starts removed. */
static fm_status read_kjv(char **text, size_t *n) {
    FILE *p = popen("bible 'Gen1:1-Rev22:21' 2>/dev/null", "r");
    if (!p) return fm_set_error(FM_ERR_IO, "cannot run 'bible' (install it: apt-get install -y bible-kjv)");
    size_t cap = 1 << 22, len = 0;
    char *buf = malloc(cap), line[4096];
    if (!buf) { pclose(p); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    while (fgets(line, sizeof line, p)) {
        char *s = line;
        char *q = s;
        while (*q == ' ') q++;
        if (*q >= '0' && *q <= '9') {
            char *r = q;
            while (*r >= '0' && *r <= '9') r++;
            if (*r == ' ') s = r + 1;
        }
        size_t l = strlen(s);
        if (len + l + 1 > cap) {
            char *g = realloc(buf, cap * 2);
            if (!g) { free(buf); pclose(p); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
            buf = g;
            cap *= 2;
        }
        memcpy(buf + len, s, l);
        len += l;
    }
    int rc = pclose(p);
    if (rc != 0 || len == 0) {
        free(buf);
        return fm_set_error(FM_ERR_IO, "the KJV corpus is unavailable: 'bible' failed (install it: apt-get install -y bible-kjv)");
    }
    buf[len] = 0;
    *text = buf;
    *n = len;
    return FM_OK;
}

static fm_status read_file(const char *path, char **text, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return fm_set_error(FM_ERR_IO, "%s: cannot open the corpus (%s)", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)(sz > 0 ? sz : 0) + 1);
    if (!buf) { fclose(f); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    size_t got = sz > 0 ? fread(buf, 1, (size_t)sz, f) : 0;
    fclose(f);
    buf[got] = 0;
    *text = buf;
    *n = got;
    return FM_OK;
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Tokenizer + token file, made once per out_dir and reused afterwards. */
static fm_status prepare_data(const fm_gpt_train_opts *o, fm_tokenizer **tok, fm_token_data *d) {
    char *tp = path_join(o->out_dir, "tokenizer.txt"), *bp = path_join(o->out_dir, "tokens.bin");
    fm_status st = FM_OK;
    char *text = NULL;
    size_t n = 0;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    if (!tp || !bp) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    if (exists(tp) && exists(bp)) {
        *tok = fm_tokenizer_load(tp);
        if (!*tok) { st = fm_last_status(); goto done; }
        st = fm_token_file_read(bp, fm_tokenizer_vocab_size(*tok), d);
        goto done;
    }
    st = !strcmp(o->corpus, "kjv") ? read_kjv(&text, &n) : read_file(o->corpus, &text, &n);
    if (st) goto done;
    if (n == 0) {
        st = fm_set_error(FM_ERR_INVALID, "%s: the corpus is empty", o->corpus);
        goto done;
    }
    double t0 = now_s();
    if (o->tokenizer == FM_TOK_BYTE) *tok = fm_tokenizer_byte();
    else if (o->tokenizer == FM_TOK_CHAR) *tok = fm_tokenizer_char_from_corpus(text, n);
    else *tok = fm_tokenizer_train_bpe(text, n, o->tokenizer_vocab);
    if (!*tok) { st = fm_last_status(); fm_error_prefix("%s: ", o->corpus); goto done; }
    if ((st = fm_tokenizer_encode(*tok, text, n, &ids, &n_ids))) goto done;
    if (!o->quiet)
        fprintf(stderr, "corpus %s: %zu bytes -> %lld tokens (%s tokenizer, vocab %d) in %.1f s\n", o->corpus, n,
                (long long)n_ids, fm_tokenizer_kind_name(o->tokenizer), fm_tokenizer_vocab_size(*tok), now_s() - t0);
    if ((st = fm_token_file_write(bp, ids, n_ids, fm_tokenizer_vocab_size(*tok)))) goto done;
    if ((st = fm_tokenizer_save(*tok, tp))) goto done;
    st = fm_token_file_read(bp, fm_tokenizer_vocab_size(*tok), d);
done:
    free(text);
    free(ids);
    free(tp);
    free(bp);
    if (st) { fm_tokenizer_free(*tok); *tok = NULL; }
    return st;
}

static fm_status evaluate(fm_gpt *m, const fm_token_data *d, int64_t lo, int64_t hi, const fm_gpt_train_opts *o,
                          double *out) {
    bool prev = fm_set_grad_enabled(false);
    fm_gpt_train_mode(m, false);
    double sum = 0;
    fm_status st = FM_OK;
    for (int i = 0; i < o->eval_batches && st == FM_OK; i++) {
        fm_tensor *x, *y, *loss = NULL;
        st = fm_gpt_batch_eval(d, lo, hi, o->batch_size, o->model.block_size, i, &x, &y);
        if (st) break;
        /* validation runs in the training precision: the model as it is used */
        fm_dtype ac = fm_autocast_set(o->eff.precision);
        fm_tensor *lg = fm_gpt_forward(m, x, y, &loss);
        fm_autocast_set(ac);
        if (!lg) st = fm_last_status();
        else sum += fm_tensor_item(loss);
        fm_tensor_release_n(4, x, y, lg, loss);
    }
    fm_gpt_train_mode(m, true);
    fm_set_grad_enabled(prev);
    *out = sum / o->eval_batches;
    return st;
}

static fm_status save_ckpt(fm_gpt *m, fm_optim *opt, const fm_gpt_train_opts *o, int64_t step, const fm_grad_scaler *gs) {
    char *mp = path_join(o->out_dir, "model.safetensors"), *sp = path_join(o->out_dir, "train_state.safetensors");
    char *cp = path_join(o->out_dir, "config.json");
    fm_status st = mp && sp && cp ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    fm_named_list state;
    memset(&state, 0, sizeof state);
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    char buf[64];
    if (!st) st = fm_gpt_config_save(&m->cfg, cp);
    if (!st) st = fm_gpt_save_hf(m, mp);
    if (!st) st = fm_optim_state(opt, &state);
    snprintf(buf, sizeof buf, "%lld", (long long)step);
    if (!st) st = fm_kv_set(&meta, "step", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)m->rng->offset);
    if (!st) st = fm_kv_set(&meta, "dropout_rng_offset", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->seed);
    if (!st) st = fm_kv_set(&meta, "seed", buf);
    /* fp16: the loss scaler's state, so a resumed run scales exactly as an uninterrupted one */
    if (!st && gs->enabled) {
        snprintf(buf, sizeof buf, "%.17g", gs->scale);
        st = fm_kv_set(&meta, "loss_scale", buf);
        snprintf(buf, sizeof buf, "%d", gs->growth_tracker);
        if (!st) st = fm_kv_set(&meta, "loss_scale_growth_tracker", buf);
    }
    if (!st) st = fm_safetensors_save(sp, &state, &meta);
    fm_named_list_free(&state);
    fm_kv_free(&meta);
    free(mp);
    free(sp);
    free(cp);
    return st;
}

static fm_status load_ckpt(fm_gpt *m, fm_optim *opt, const fm_gpt_train_opts *o, int64_t *step, fm_grad_scaler *gs) {
    char *mp = path_join(o->out_dir, "model.safetensors"), *sp = path_join(o->out_dir, "train_state.safetensors");
    fm_status st = mp && sp ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    fm_named_list state;
    memset(&state, 0, sizeof state);
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    if (!st) st = fm_gpt_load_hf(m, mp);
    if (!st) st = fm_optim_init_state(opt);
    if (!st) st = fm_optim_state(opt, &state);
    if (!st) st = fm_safetensors_load_into(sp, &state, &meta);
    const char *s = fm_kv_get(&meta, "step"), *r = fm_kv_get(&meta, "dropout_rng_offset"), *sd = fm_kv_get(&meta, "seed");
    if (!st && (!s || !r || !sd)) st = fm_set_error(FM_ERR_FORMAT, "%s: checkpoint lacks step/RNG metadata", sp);
    if (!st && strtoull(sd, NULL, 10) != o->seed)
        st = fm_set_error(FM_ERR_INVALID, "%s: checkpoint was trained with seed %s, this run uses %llu", sp, sd,
                          (unsigned long long)o->seed);
    if (!st) {
        *step = strtoll(s, NULL, 10);
        m->rng->offset = strtoull(r, NULL, 10);
        fm_optim_set_step(opt, *step);
        const char *ls = fm_kv_get(&meta, "loss_scale"), *lt = fm_kv_get(&meta, "loss_scale_growth_tracker");
        if (gs->enabled && ls && lt && strtod(ls, NULL) > 0) {
            gs->scale = strtod(ls, NULL);
            gs->growth_tracker = (int)strtol(lt, NULL, 10);
        }
    }
    fm_named_list_free(&state);
    fm_kv_free(&meta);
    free(mp);
    free(sp);
    return st;
}

static int print_tok(int tok, void *ctx) {
    const char *b;
    size_t n;
    if (fm_tokenizer_token_bytes(ctx, tok, &b, &n) == FM_OK) fwrite(b, 1, n, stderr);
    return 0;
}

/* A cut of [B, T] windows along the batch: micro-batch k of n (a new reference). */
static fm_tensor *micro(fm_tensor *t, int k, int n) {
    if (n == 1) return fm_tensor_retain(t);
    int64_t mb = t->shape[0] / n;
    return fm_narrow(t, 0, (int64_t)k * mb, mb);
}

fm_status fm_gpt_train(const fm_gpt_train_opts *o, double *final_train_loss, double *final_val_loss) {
    fm_gpt_train_result r;
    fm_status st = fm_gpt_train_ex(o, &r);
    if (st == FM_OK) {
        if (final_train_loss) *final_train_loss = r.train_loss;
        if (final_val_loss) *final_val_loss = r.val_loss;
    }
    return st;
}

fm_status fm_gpt_train_ex(const fm_gpt_train_opts *o, fm_gpt_train_result *res) {
    fm_gpt_train_result scratch;
    if (!res) res = &scratch;
    memset(res, 0, sizeof *res);
    res->train_loss = res->val_loss = NAN;
    res->loss_scale = 1;
    fm_gpt_config cfg = o->model;
    fm_tokenizer *tok = NULL;
    fm_token_data d;
    memset(&d, 0, sizeof d);
    fm_gpt *m = NULL;
    fm_optim *opt = NULL;
    fm_tensor **params = NULL;
    fm_tb_writer *tb = NULL;
    fm_progress *prog = NULL;
    bool profiling = false, in_step = false;
    fm_status st;
    const fm_efficiency_opts *eo = &o->eff;
    if (o->batch_size < 1 || o->steps < 1 || o->eval_batches < 1 || !(o->val_fraction > 0 && o->val_fraction < 1))
        return fm_set_error(FM_ERR_INVALID, "train: batch_size, steps and eval_batches must be >= 1 and val_fraction in (0, 1)");
    if ((st = fm_efficiency_validate(eo, true, o->batch_size))) return st;
    if ((st = fm_mkdir_p(o->out_dir))) return st;
    if ((st = prepare_data(o, &tok, &d))) return st;
    cfg.vocab_size = fm_tokenizer_vocab_size(tok);
    /* the last val_fraction of the tokens is held out */
    int64_t split = (int64_t)((double)d.n * (1.0 - o->val_fraction));
    const int T = cfg.block_size;
    if (split < T + 1 || d.n - split < T + 1) {
        st = fm_set_error(FM_ERR_INVALID,
                          "%s: the corpus is too short: %lld tokens; with block_size %d both the training split and the "
                          "held-out %.0f%% need at least %d tokens (use more text or a smaller block_size)",
                          o->corpus, (long long)d.n, T, 100 * o->val_fraction, T + 1);
        goto done;
    }
    /* the memory options, and whether the model fits, before any weight exists */
    if ((st = fm_efficiency_apply_memory(eo))) goto done;
    if ((st = fm_efficiency_check_fits(eo, fm_gpt_config_num_params(&cfg), 2 /* AdamW moments */))) goto done;
    fm_rng init;
    fm_rng_init(&init, o->seed);
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    m = fm_gpt_new(&cfg, &init);
    fm_memory_tag_pop(mc);
    if (!m) { st = fm_last_status(); goto done; }
    fm_rng_init(&m->own_rng, o->seed ^ 0xd50u);
    if ((st = fm_gpt_set_checkpointing(m, eo->checkpointing))) goto done;
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    oc.lr = o->lr;
    oc.beta1 = o->beta1;
    oc.beta2 = o->beta2;
    oc.weight_decay = o->weight_decay;
    if (!(opt = fm_optim_new(&oc))) { st = fm_last_status(); goto done; }
    int gd = fm_optim_add_group(opt, o->weight_decay), gn = fm_optim_add_group(opt, 0.0);
    if (!(params = calloc((size_t)m->params.n + 1, sizeof *params))) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    for (int i = 0; i < m->params.n; i++) {
        fm_tensor *p = m->params.items[i].tensor;
        params[i] = p;
        if ((st = fm_optim_add_param(opt, p->ndim >= 2 ? gd : gn, m->params.items[i].name, p))) goto done;
    }
    mc = fm_memory_tag_push(FM_MEM_OPTIMIZER);
    st = fm_optim_init_state(opt);
    fm_memory_tag_pop(mc);
    if (st) goto done;
    fm_grad_scaler gs;
    fm_grad_scaler_init(&gs, eo->loss_scaling);
    gs.quiet = o->quiet;
    int64_t step = 0;
    char *sp = path_join(o->out_dir, "train_state.safetensors");
    bool have = sp && exists(sp);
    free(sp);
    if (o->resume && have) {
        if ((st = load_ckpt(m, opt, o, &step, &gs))) goto done;
        if (!o->quiet) fprintf(stderr, "resumed from %s at step %lld\n", o->out_dir, (long long)step);
    }
    fm_lr_schedule sched;
    memset(&sched, 0, sizeof sched);
    sched.kind = FM_SCHED_COSINE;
    sched.base_lr = o->lr;
    sched.warmup_steps = o->warmup;
    sched.total_steps = o->steps;
    sched.min_lr = o->min_lr;
    const int accum = eo->grad_accum;
    if (!o->quiet) {
        fprintf(stderr, "model: %s, %d layers, %d heads, %d wide, block %d, vocab %d: %lld parameters; %lld train / %lld val tokens\n",
                fm_gpt_arch_name(cfg.arch), cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size,
                (long long)fm_gpt_num_params(m), (long long)split, (long long)(d.n - split));
        if (eo->precision != FM_F32 || eo->checkpointing != FM_CKPT_NONE || accum > 1)
            fprintf(stderr, "precision %s, checkpointing %s, %d micro-batch%s of %d per step\n", fm_precision_name(eo->precision),
                    fm_checkpointing_name(eo->checkpointing), accum, accum > 1 ? "es" : "", o->batch_size / accum);
    }
    if (o->profile_path && (st = fm_profiler_start(o->profile_path))) goto done;
    profiling = o->profile_path != NULL;
    if (o->logdir && !(tb = fm_tb_writer_open(o->logdir))) { st = fm_last_status(); goto done; }
    if (!(prog = fm_progress_begin("train", o->steps, "tokens", o->quiet ? FM_PROGRESS_QUIET : FM_PROGRESS_AUTO, stderr))) {
        st = fm_last_status();
        goto done;
    }
    fm_progress_set_start(prog, step);
    fm_memory_reset_peak(FM_CPU);
    double t_start = now_s(), t_log = t_start, last = NAN, val = NAN, t_tb = t_start;
    int64_t tok_log = 0, tok_all = 0, skipped0 = gs.n_skipped, tok_tb = 0;
    for (; step < o->steps; step++) {
        fm_profile_push("step", "step");
        in_step = true;
        fm_optim_set_lr(opt, fm_lr_at(&sched, step));
        fm_tensor *x, *y;
        double td = now_s(), pd = fm_profiler_now_us();
        st = fm_gpt_batch_random(&d, 0, split, o->batch_size, T, o->seed, step, &x, &y);
        res->data_seconds += now_s() - td;
        fm_profile_span("next batch", "data", pd, fm_profiler_now_us() - pd, NULL);
        if (st) goto done;
        fm_optim_zero_grad(opt);
        last = 0;
        /* micro-batches of the same windows: each loss is scaled by 1/accum and the
         * gradients add up in .grad, so the step sees the mean over the whole batch */
        for (int k = 0; k < accum && st == FM_OK; k++) {
            fm_tensor *xs = micro(x, k, accum), *ys = micro(y, k, accum), *loss = NULL, *lg = NULL, *sl = NULL;
            if (!xs || !ys) st = fm_last_status();
            if (!st) {
                fm_dtype ac = fm_autocast_set(eo->precision);
                mc = fm_memory_tag_push(FM_MEM_ACTIVATIONS);
                lg = fm_gpt_forward(m, xs, ys, &loss);
                fm_memory_tag_pop(mc);
                fm_autocast_set(ac);
                if (!lg) st = fm_last_status();
            }
            if (!st) {
                last += fm_tensor_item(loss) / accum;
                fm_tensor *l = accum > 1 ? fm_mul_scalar(loss, 1.0 / accum) : fm_tensor_retain(loss);
                sl = l ? fm_grad_scaler_scale(&gs, l) : NULL;
                fm_tensor_release(l);
                /* backward's temporaries; the engine tags the leaves' gradients itself */
                mc = fm_memory_tag_push(FM_MEM_ACTIVATIONS);
                st = sl ? fm_backward(sl, NULL, false) : fm_last_status();
                fm_memory_tag_pop(mc);
            }
            fm_tensor_release_n(5, xs, ys, lg, loss, sl);
        }
        fm_tensor_release_n(2, x, y);
        if (st) goto done;
        /* with the fp16 scaler a non-finite loss is an overflow: the scaler skips the step */
        if (!isfinite(last) && !gs.enabled) {
            st = fm_set_error(FM_ERR_STATE, "train: loss became %g at step %lld (lower the lr)", last, (long long)step);
            goto done;
        }
        double po = fm_profiler_now_us();
        if ((st = fm_grad_scaler_unscale(&gs, m->params.n, params))) goto done;
        if (tb && o->hist_every > 0 && (step + 1) % o->hist_every == 0) /* unscaled, before clipping scales them */
            fm_tb_add_histograms(tb, "grads", &m->params, true, step + 1);
        double norm = 0;
        bool do_step = fm_grad_scaler_should_step(&gs);
        mc = fm_memory_tag_push(FM_MEM_OPTIMIZER);
        if (do_step && o->grad_clip > 0) st = fm_optim_clip_grad_norm(opt, o->grad_clip, &norm);
        else if (do_step && tb) st = fm_optim_clip_grad_norm(opt, INFINITY, &norm); /* the norm for the logs; never scales */
        if (!st && do_step) st = fm_optim_step(opt);
        fm_memory_tag_pop(mc);
        if (st) goto done;
        fm_grad_scaler_update(&gs);
        fm_profile_span("optimizer", "optimizer", po, fm_profiler_now_us() - po, NULL);
        fm_profile_pop(); /* step */
        in_step = false;
        tok_log += (int64_t)o->batch_size * T;
        tok_all += (int64_t)o->batch_size * T;
        int64_t done_steps = step + 1;
        fm_progress_update(prog, done_steps, tok_all, last);
        if (!o->quiet && o->log_every > 0 && (done_steps % o->log_every == 0 || done_steps == o->steps)) {
            double t = now_s();
            char line[256];
            int k = snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  %.0f s",
                             (long long)done_steps, (long long)o->steps, last, fm_lr_at(&sched, step), norm,
                             tok_log / (t - t_log), t - t_start);
            if (gs.enabled && k > 0 && k < (int)sizeof line)
                snprintf(line + k, sizeof line - (size_t)k, "  loss scale %g  skipped %lld", gs.scale, (long long)gs.n_skipped);
            fm_progress_log(prog, "%s", line); /* above a terminal's redrawn line, not through it */
            t_log = t;
            tok_log = 0;
        }
        if (tb && o->log_every > 0 && (done_steps % o->log_every == 0 || done_steps == o->steps)) {
            double t = now_s();
            fm_memory_stats mst;
            fm_tb_add_scalar(tb, "train/loss", done_steps, last);
            fm_tb_add_scalar(tb, "train/lr", done_steps, fm_lr_at(&sched, step));
            if (t > t_tb) fm_tb_add_scalar(tb, "train/throughput", done_steps, (double)(tok_all - tok_tb) / (t - t_tb));
            if (do_step) fm_tb_add_scalar(tb, "train/grad_norm", done_steps, norm);
            if (gs.enabled) fm_tb_add_scalar(tb, "train/loss_scale", done_steps, gs.scale);
            if (fm_memory_stats_get(FM_CPU, &mst) == FM_OK) fm_tb_add_scalar(tb, "memory/allocated_bytes", done_steps, (double)mst.allocated);
            t_tb = t;
            tok_tb = tok_all;
        }
        if (tb && o->hist_every > 0 && done_steps % o->hist_every == 0)
            fm_tb_add_histograms(tb, "weights", &m->params, false, done_steps);
        bool stop = o->stop_after > 0 && done_steps >= o->stop_after;
        if ((o->eval_every > 0 && done_steps % o->eval_every == 0) || done_steps == o->steps) {
            if ((st = evaluate(m, &d, split, d.n, o, &val))) goto done;
            if (tb) fm_tb_add_scalar(tb, "val/loss", done_steps, val);
            fm_progress_log(prog, "step %lld  val loss %.4f", (long long)done_steps, val);
            if (o->sample_tokens > 0 && !o->quiet) {
                int32_t nl[1];
                int32_t *pi = NULL;
                int64_t pn = 0;
                fm_gpt_sample_params spar = {0.8, 0, 1.0, (uint64_t)done_steps};
                if (fm_tokenizer_encode(tok, "\n", 1, &pi, &pn) == FM_OK && pn > 0) nl[0] = pi[0];
                else nl[0] = 0;
                free(pi);
                fm_progress_clear(prog); /* the sample streams out token by token */
                fprintf(stderr, "--- sample ---\n");
                fm_gpt_generate(m, nl, 1, o->sample_tokens, &spar, true, NULL, NULL, NULL, print_tok, tok);
                fprintf(stderr, "\n--------------\n");
            }
        }
        if ((o->ckpt_every > 0 && done_steps % o->ckpt_every == 0) || done_steps == o->steps || stop) {
            if ((st = save_ckpt(m, opt, o, done_steps, &gs))) goto done;
        }
        if (stop) { step++; break; }
    }
    fm_progress_end(prog);
    prog = NULL;
    res->train_loss = last;
    res->val_loss = val;
    res->steps = step;
    res->train_seconds = now_s() - t_start;
    res->tokens_per_second = res->train_seconds > 0 ? (double)tok_all / res->train_seconds : 0;
    res->loss_scale = gs.scale;
    res->skipped_steps = gs.n_skipped - skipped0;
    fm_memory_stats ms;
    if (fm_memory_stats_get(FM_CPU, &ms) == FM_OK) res->peak_memory_bytes = ms.allocated_peak;
    fm_memory_report mrep;
    if (fm_memory_report_get(FM_CPU, &mrep) == FM_OK) {
        fm_memory_report_json(&mrep, res->memory_report_json, sizeof res->memory_report_json);
        fm_memory_report_format(&mrep, res->memory_report_text, sizeof res->memory_report_text);
    }
done:
    fm_progress_cancel(prog); /* failed: the error follows, not a "done" line */
    if (in_step) fm_profile_pop();
    if (tb) {
        fm_status cst = fm_tb_writer_close(tb);
        if (!st) st = cst;
    }
    if (profiling) {
        fm_status pst = fm_profiler_stop();
        if (!st) st = pst;
    }
    free(params);
    fm_optim_free(opt);
    fm_gpt_free(m);
    fm_tokenizer_free(tok);
    fm_token_data_free(&d);
    return st;
}

fm_gpt *fm_gpt_load_dir(const char *dir, fm_tokenizer **tok) {
    if (tok) *tok = NULL;
    char *cp = path_join(dir, "config.json"), *mp = path_join(dir, "model.safetensors"), *tp = path_join(dir, "tokenizer.txt");
    fm_gpt *m = NULL;
    fm_gpt_config c;
    if (!cp || !mp || !tp) { fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    if (!exists(cp)) { fm_set_error(FM_ERR_IO, "%s: no config.json here: not a model directory written by `fathom train`", dir); goto done; }
    if (fm_gpt_config_load(cp, &c)) goto done;
    if (!(m = fm_gpt_new(&c, NULL))) goto done;
    if (fm_gpt_load_hf(m, mp)) { fm_gpt_free(m); m = NULL; goto done; }
    if (tok) {
        *tok = fm_tokenizer_load(tp);
        if (!*tok) { fm_gpt_free(m); m = NULL; goto done; }
        if (fm_tokenizer_vocab_size(*tok) != c.vocab_size) {
            fm_set_error(FM_ERR_FORMAT, "%s: tokenizer vocab %d does not match the model's %d", dir,
                         fm_tokenizer_vocab_size(*tok), c.vocab_size);
            fm_tokenizer_free(*tok);
            *tok = NULL;
            fm_gpt_free(m);
            m = NULL;
        }
    }
done:
    free(cp);
    free(mp);
    free(tp);
    return m;
}
