/* The language-model training loop: corpus -> tokenizer -> token file -> AdamW
 * steps with validation and checkpoints that resume bit for bit.
 *
 * Exact resume rests on three things: batches are a pure function of (seed,
 * step) (fm_gpt_batch_random), the learning rate is a pure function of the step
 * (fm_lr_at), and the checkpoint stores the weights, the Adam moments, the step
 * and the dropout RNG counter. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fathom/autograd.h"
#include "fathom/data.h" /* fm_data_shard_rows: a rank's part of a batch */
#include "fathom/efficiency.h" /* precision, checkpointing, accumulation, memory limits */
#include "fathom/io.h"    /* checkpoints, fm_mkdir_p */
#include "fathom/optim.h" /* AdamW, clipping, schedules */
#include "fathom/observe.h" /* --logdir: TensorBoard scalars and histograms; the progress line */
#include "fathom/profile.h" /* --profile: step, data and optimizer spans */
#include "fathom/amp.h" /* fm_tensor_has_inf_nan */
#include "fathom/train_step.h" /* the step every trainer runs */
#include "core/parallel.h" /* fm_num_threads: the data-parallel banner */
#include "dist/dist_ckpt.h" /* sharded checkpoint units */
#include "gpt/gpt_internal.h"
#include "io/io_internal.h" /* checkpoint units */

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
    o.keep_checkpoints = 2;
    o.divergence_factor = 1e3;
    return o;
}

int64_t fm_gpt_config_num_params(const fm_gpt_config *c) {
    if (!c || fm_gpt_config_validate(c)) return -1;
    const bool llama = c->arch == FM_GPT_LLAMA, bias = c->bias && !llama;
    const int64_t C = c->n_embd, V = c->vocab_size, F = c->ffn_hidden, H = c->n_head, D = fm_gpt_head_dim(c);
    const int64_t KV = llama ? c->n_kv_head : H;
    int64_t per = 2 * C                              /* ln_1, ln_2 */
                  + (H + 2 * KV) * D * C + C * H * D /* qkv, proj */
                  + (llama ? 2 : 1) * F * C + C * F; /* fc (gate+up), fc2 */
    if (bias) per += 2 * C + (H + 2 * KV) * D + C + F + C;
    if (llama && c->qkv_bias) per += (H + 2 * KV) * D;
    return (c->untied_head ? 2 : 1) * V * C + (llama ? 0 : (int64_t)c->block_size * C) + c->n_layer * per + C +
           (bias ? C : 0);
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

/* A corpus or tokenizer file, whole (fm_read_file: bytes, NUL allowed, as the
 * tokenizers take them): a pipe works (it has no size: it read as empty before), a
 * directory is named as such (it was "out of host memory"), one past 16 GiB is
 * refused by name. */
static fm_status read_file(const char *path, char **text, size_t *n) {
    fm_status st;
    const char *why;
    *text = fm_read_file(path, (size_t)16 << 30, n, &st, &why);
    if (*text) return FM_OK;
    if (st == FM_ERR_IO && errno == EISDIR) return fm_set_error(st, "%s: is a directory, not a text file", path);
    if (st == FM_ERR_IO) return fm_set_error(st, "%s: %s (%s)", path, why, strerror(errno));
    if (st == FM_ERR_OOM) return fm_set_error(st, "%s: out of host memory reading it", path);
    return fm_set_error(st, "%s: %s (a corpus or tokenizer file here is at most 16 GiB)", path, why);
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* FM_OK when the files at a and b hold the same bytes; else an error saying to start afresh. */
static fm_status same_file_bytes(const char *a, const char *b) {
    char *ta = NULL, *tb = NULL;
    size_t na = 0, nb = 0;
    fm_status st = read_file(a, &ta, &na);
    if (st == FM_OK) st = read_file(b, &tb, &nb);
    if (st == FM_OK && (na != nb || memcmp(ta, tb, na)))
        st = fm_set_error(FM_ERR_INVALID, "%s is not the tokenizer %s: this directory was made with another tokenizer; "
                          "give a new output directory", a, b);
    free(ta);
    free(tb);
    return st;
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
        if (o->tokenizer_file && (st = same_file_bytes(tp, o->tokenizer_file))) goto done;
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
    if (o->tokenizer_file) *tok = fm_tokenizer_load(o->tokenizer_file);
    else if (o->tokenizer == FM_TOK_BYTE) *tok = fm_tokenizer_byte();
    else if (o->tokenizer == FM_TOK_CHAR) *tok = fm_tokenizer_char_from_corpus(text, n);
    else *tok = fm_tokenizer_train_bpe(text, n, o->tokenizer_vocab);
    if (!*tok) { st = fm_last_status(); fm_error_prefix("%s: ", o->tokenizer_file ? o->tokenizer_file : o->corpus); goto done; }
    if ((st = fm_tokenizer_encode(*tok, text, n, &ids, &n_ids))) goto done;
    if (!o->quiet)
        fprintf(stderr, "corpus %s: %zu bytes -> %lld tokens (%s%s tokenizer, vocab %d) in %.1f s\n", o->corpus, n,
                (long long)n_ids, o->tokenizer_file ? "the given " : "",
                o->tokenizer_file ? o->tokenizer_file : fm_tokenizer_kind_name(o->tokenizer), fm_tokenizer_vocab_size(*tok),
                now_s() - t0);
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
                          fm_dist *dp, double *out) {
    bool prev = fm_set_grad_enabled(false);
    fm_gpt_train_mode(m, false);
    double sum = 0;
    fm_status st = FM_OK;
    /* data parallel: rank r takes eval batches r, r + N, ...; the sum is reduced below (dp: the
     * data-parallel group; the ranks of a tensor-parallel group evaluate the same batches) */
    const int rank = dp ? fm_dist_rank(dp) : 0, world = dp ? fm_dist_size(dp) : 1;
    for (int i = rank; i < o->eval_batches && st == FM_OK; i += world) {
        fm_tensor *x, *y, *loss = NULL;
        st = fm_gpt_batch_eval(d, lo, hi, o->batch_size, o->model.block_size, i, &x, &y);
        if (st) break;
        if (o->eff.device.type != FM_DEV_CPU) { /* to the model's device */
            fm_tensor *xd = fm_tensor_to(x, o->eff.device), *yd = xd ? fm_tensor_to(y, o->eff.device) : NULL;
            fm_tensor_release_n(2, x, y);
            if (!yd) { fm_tensor_release(xd); st = fm_last_status(); break; }
            x = xd;
            y = yd;
        }
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
    /* every rank takes part even after an error of its own: the others wait in this sum */
    if (world > 1 && fm_dist_allreduce_sum_f64(dp, &sum, 1) != FM_OK && st == FM_OK) st = fm_last_status();
    *out = sum / o->eval_batches;
    return st;
}

/* The checkpoint's metadata: step, the optimizer's own step count (AdamW's bias correction:
 * fewer than `step` when fp16 skipped steps), dropout generator, seed, and the step's own
 * state (loss scaler, the loss's running minimum: fm_train_step_state_save). */
static fm_status ckpt_meta(const fm_gpt *m, const fm_gpt_train_opts *o, int64_t step, int64_t opt_step,
                           const fm_train_step *ts, fm_kv_list *meta) {
    char buf[64];
    snprintf(buf, sizeof buf, "%lld", (long long)step);
    fm_status st = fm_kv_set(meta, "step", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)opt_step);
    if (!st) st = fm_kv_set(meta, "optimizer_step", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)m->rng->offset);
    if (!st) st = fm_kv_set(meta, "dropout_rng_offset", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->seed);
    if (!st) st = fm_kv_set(meta, "seed", buf);
    if (!st) st = fm_train_step_state_save(ts, meta);
    return st;
}

/* Sharded checkpoint files of rank r of n (dist_ckpt_file): ZeRO-1's optimizer shard without
 * tensor parallelism (zero-shard), and under tensor parallelism the rank's part of the model
 * with its optimizer state (tp-shard; with ZeRO-1 the state is the rank's ZeRO shard of it,
 * tp-zero) */
static void tp_file_name(char *buf, size_t n, const char *kind, int r, int world) {
    char k[16];
    snprintf(k, sizeof k, "tp-%s", kind);
    dist_ckpt_file(buf, n, k, r, world);
}

/* Tensor parallel: this rank's part of the model ("model.<param>") and, without ZeRO-1, its
 * optimizer state ("optim.<param>.<slot>") as they are, no gather; with ZeRO-1 its ZeRO shard
 * of that state in a second file. Metadata: the rank, the world, the split. */
static fm_status write_tp_files(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, const fm_gpt_train_opts *o,
                                const char *tmp, int64_t step, bool *nonfinite) {
    const int rank = fm_dist_rank(o->dist), world = fm_dist_size(o->dist);
    fm_zero *z = o->zero ? fm_dist_trainer_zero(dt) : NULL;
    fm_named_list l, state;
    memset(&l, 0, sizeof l);
    memset(&state, 0, sizeof state);
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    char name[600], fname[64], path[PATH_MAX + 64], v[5][32];
    fm_status st = FM_OK;
    for (int i = 0; i < m->params.n && !st; i++) {
        if (fm_tensor_has_inf_nan(m->params.items[i].tensor)) {
            *nonfinite = true;
            st = fm_set_error(FM_ERR_STATE, "weight '%s' (rank %d's part) became non-finite (NaN or inf)",
                              m->params.items[i].name, rank);
            break;
        }
        snprintf(name, sizeof name, "model.%s", m->params.items[i].name);
        st = fm_named_list_push(&l, name, m->params.items[i].tensor, false, false);
    }
    if (!st && !z && !(st = fm_optim_init_state(opt)) && !(st = fm_optim_state(opt, &state)))
        for (int i = 0; i < state.n && !st; i++) {
            if (fm_tensor_has_inf_nan(state.items[i].tensor)) {
                *nonfinite = true;
                st = fm_set_error(FM_ERR_STATE, "optimizer state '%s' (rank %d's part) became non-finite (NaN or inf)",
                                  state.items[i].name, rank);
                break;
            }
            snprintf(name, sizeof name, "optim.%s", state.items[i].name);
            st = fm_named_list_push(&l, name, state.items[i].tensor, false, false);
        }
    snprintf(v[0], sizeof v[0], "%d", rank);
    snprintf(v[1], sizeof v[1], "%d", world);
    snprintf(v[2], sizeof v[2], "%d", m->tp_rank);
    snprintf(v[3], sizeof v[3], "%d", m->tp_size);
    snprintf(v[4], sizeof v[4], "%lld", (long long)step);
    static const char *const keys[] = {"rank", "world_size", "tp_rank", "tensor_parallel", "step"};
    for (int i = 0; i < 5 && !st; i++) st = fm_kv_set(&meta, keys[i], v[i]);
    if (!st && !(st = fm_kv_set(&meta, "zero", z ? "1" : "0"))) {
        tp_file_name(fname, sizeof fname, "shard", rank, world);
        snprintf(path, sizeof path, "%s/%s", tmp, fname);
        st = fm_safetensors_save(path, &l, &meta);
    }
    if (!st && z) {
        tp_file_name(fname, sizeof fname, "zero", rank, world);
        snprintf(path, sizeof path, "%s/%s", tmp, fname);
        st = fm_zero_save_shard(z, path, nonfinite);
        if (!st && *nonfinite)
            st = fm_set_error(FM_ERR_STATE, "optimizer state (rank %d's ZeRO-1 shard) became non-finite (NaN or inf)", rank);
    }
    fm_named_list_free(&l);
    fm_named_list_free(&state);
    fm_kv_free(&meta);
    return st;
}

/* A sharded checkpoint (dist_ckpt_save, src/dist/dist_ckpt.h): ZeRO-1 without tensor
 * parallelism, or tensor parallelism (with or without ZeRO-1). Each rank writes its own files,
 * as they are, with no gather (ZeRO-1: its shard of the optimizer state; tensor parallel: its
 * part of the model and the state); rank 0 writes the config, train_state.safetensors
 * (metadata only: step, generator, seed, and the layout) and the weights: without tensor
 * parallelism the model (the same on every rank), with it the whole model only at the run's
 * last checkpoint (`last`: gathered after the shards are written). */
typedef struct gpt_ckpt_ctx {
    fm_gpt *m;
    fm_optim *opt;
    fm_dist_trainer *dt;
    const fm_gpt_train_opts *o;
    int64_t step;
    bool last;
    const fm_train_step *ts;
} gpt_ckpt_ctx;

static fm_status gpt_ckpt_write(void *ctx, const char *tmp, bool *nonfinite) {
    const gpt_ckpt_ctx *c = ctx;
    fm_gpt *m = c->m;
    const fm_gpt_train_opts *o = c->o;
    const int rank = fm_dist_rank(o->dist), world = fm_dist_size(o->dist);
    const bool tp = m->tp != NULL, zero = o->zero && fm_dist_trainer_zero(c->dt);
    char path[PATH_MAX + 64], name[64];
    fm_status st = FM_OK;
    if (tmp && tp) {
        st = write_tp_files(m, c->opt, c->dt, o, tmp, c->step, nonfinite);
    } else if (tmp) {
        dist_ckpt_file(name, sizeof name, "zero-shard", rank, world);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        st = fm_zero_save_shard(fm_dist_trainer_zero(c->dt), path, nonfinite);
        if (!st && *nonfinite)
            st = fm_set_error(FM_ERR_STATE, "optimizer state (rank %d's shard) became non-finite (NaN or inf)", rank);
    }
    /* the whole model (a collective on the tensor-parallel group: every rank, whatever it wrote) */
    fm_gpt *whole = tp && c->last ? fm_gpt_tp_gather_model(m) : NULL;
    if (tp && c->last && !whole && !st) st = fm_last_status();
    if (rank != 0 || !tmp || st) {
        fm_gpt_free(whole);
        return st;
    }
    for (int i = 0; i < m->params.n && !st && !tp; i++)
        if (fm_tensor_has_inf_nan(m->params.items[i].tensor)) {
            *nonfinite = true;
            st = fm_set_error(FM_ERR_STATE, "weight '%s' became non-finite (NaN or inf)", m->params.items[i].name);
        }
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    fm_named_list none;
    memset(&none, 0, sizeof none);
    snprintf(name, sizeof name, "%d", world);
    if (!st) st = ckpt_meta(m, o, c->step, fm_optim_get_step(c->dt ? fm_dist_trainer_optim(c->dt) : c->opt), c->ts, &meta);
    if (!st) st = fm_kv_set(&meta, tp ? "tp_world_size" : "zero_world_size", name);
    snprintf(name, sizeof name, "%d", m->tp_size);
    if (!st && tp) st = fm_kv_set(&meta, "tensor_parallel", name);
    if (!st && tp) st = fm_kv_set(&meta, "tp_zero", zero ? "1" : "0");
    fm_gpt *mm = tp ? whole : m;
    if (!st) snprintf(path, sizeof path, "%s/config.json", tmp);
    if (!st) st = fm_gpt_config_save(&m->cfg, path);
    if (!st) snprintf(path, sizeof path, "%s/train_state.safetensors", tmp);
    if (!st) st = fm_safetensors_save(path, &none, &meta);
    if (!st && mm) snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if (!st && mm) st = fm_gpt_save_hf(mm, path);
    fm_kv_free(&meta);
    fm_gpt_free(whole);
    return st;
}

static fm_status save_ckpt_sharded(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, bool last, const fm_gpt_train_opts *o,
                                   int64_t step, const fm_train_step *ts, bool *poisoned) {
    static const char *const common[] = {"config.json", "train_state.safetensors", "model.safetensors"};
    static const char *const zero_kinds[] = {"zero-shard"}, *const tp_kinds[] = {"tp-shard", "tp-zero"};
    const bool tp = m->tp != NULL, zero = o->zero && fm_dist_trainer_zero(dt);
    gpt_ckpt_ctx c = {m, opt, dt, o, step, last, ts};
    dist_ckpt_unit u = {
        .d = o->dist, .out_dir = o->out_dir, .step = step,
        .n_common = tp && !last ? 2 : 3, .common = common, /* TP: the whole model at the run's last unit only */
        .n_kinds = tp ? (zero ? 2 : 1) : 1, .kinds = tp ? tp_kinds : zero_kinds,
        .keep = o->keep_checkpoints, .log = o->quiet ? NULL : stderr, .write = gpt_ckpt_write, .ctx = &c};
    return dist_ckpt_save(&u, poisoned);
}

/* One checkpoint unit (io/io_internal.h): config, weights, and the optimizer
 * moments with the step, RNG counter and loss scaler, committed together as
 * out_dir/ckpt/step-N and linked to out_dir/. Non-finite weights or moments are
 * never committed. */
static fm_status save_ckpt(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, const fm_gpt_train_opts *o, int64_t step,
                           bool last, const fm_train_step *ts, bool *poisoned) {
    static const char *const names[] = {"config.json", "model.safetensors", "train_state.safetensors"};
    /* ZeRO-1 over a whole model: each rank writes its own shard of the state; tensor
     * parallel: each rank its part of the model and the state, and the run's last
     * checkpoint the whole model too (gathered: `fathom generate`, eval and export read it) */
    if (m->tp || (dt && o->zero && fm_dist_trainer_zero(dt))) return save_ckpt_sharded(m, opt, dt, last, o, step, ts, poisoned);
    char path[PATH_MAX + 32];
    fm_named_list state;
    memset(&state, 0, sizeof state);
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    fm_ckpt_tx tx;
    memset(&tx, 0, sizeof tx);
    /* data parallel: the whole state (the same on every rank); rank 0 writes it */
    fm_status st = dt ? fm_dist_trainer_full_state(dt, &state) : fm_optim_state(opt, &state);
    if (o->dist && fm_dist_rank(o->dist) != 0) {
        fm_named_list_free(&state);
        return st;
    }
    for (int i = 0; i < m->params.n && !st; i++)
        if (fm_tensor_has_inf_nan(m->params.items[i].tensor)) {
            st = fm_set_error(FM_ERR_STATE, "weight '%s' became non-finite (NaN or inf)", m->params.items[i].name);
            *poisoned = true;
        }
    for (int i = 0; i < state.n && !st; i++)
        if (fm_tensor_has_inf_nan(state.items[i].tensor)) {
            st = fm_set_error(FM_ERR_STATE, "optimizer state '%s' became non-finite (NaN or inf)", state.items[i].name);
            *poisoned = true;
        }
    if (!st) st = ckpt_meta(m, o, step, fm_optim_get_step(dt ? fm_dist_trainer_optim(dt) : opt), ts, &meta);
    if (!st && !(st = fm_ckpt_begin(&tx, o->out_dir, step))) {
        if ((st = fm_gpt_config_save(&m->cfg, fm_ckpt_path(&tx, names[0], path, sizeof path))) ||
            (st = fm_gpt_save_hf(m, fm_ckpt_path(&tx, names[1], path, sizeof path))) ||
            (st = fm_safetensors_save(fm_ckpt_path(&tx, names[2], path, sizeof path), &state, &meta))) {
            fm_ckpt_abort(&tx);
            fm_error_prefix("checkpoint of step %lld not written; the previous checkpoints in %s/ckpt are unchanged",
                            (long long)step, o->out_dir);
        } else {
            st = fm_ckpt_commit(&tx, 3, names, o->keep_checkpoints, o->quiet ? NULL : stderr);
        }
    }
    fm_named_list_free(&state);
    fm_kv_free(&meta);
    return st;
}

/* A decimal metadata value, whole and in range, or an error naming it. */
static fm_status meta_num(const fm_kv_list *meta, const char *key, const char *file, bool is_unsigned, void *out) {
    const char *s = fm_kv_get(meta, key);
    char *end = NULL;
    errno = 0;
    if (s && is_unsigned && *s != '-') *(uint64_t *)out = strtoull(s, &end, 10);
    else if (s && !is_unsigned) *(int64_t *)out = strtoll(s, &end, 10);
    if (!s || !end || end == s || *end || errno)
        return fm_set_error(FM_ERR_FORMAT, "%s: checkpoint metadata '%s' is %s%s%s (expected a whole number)", file, key,
                            s ? "'" : "missing", s ? s : "", s ? "'" : "");
    return FM_OK;
}

/* Tensor parallel resume: the whole weights into a whole model, then this rank's shards. */
static fm_status load_whole_split(fm_gpt *m, const char *path) {
    fm_rng scratch; /* overwritten by the file: leave the global generator where it is */
    fm_rng_init(&scratch, 0);
    fm_gpt *whole = fm_gpt_new(&m->cfg, &scratch);
    fm_status st = whole ? fm_gpt_load_hf(whole, path) : fm_last_status();
    if (!st) st = fm_gpt_tp_load_model(m, whole);
    fm_gpt_free(whole);
    return st;
}

/* ... and this rank's parts of the whole optimizer state into state (its tensors). */
static fm_status load_state_split(fm_gpt *m, const char *path, fm_named_list *state, fm_kv_list *meta) {
    fm_named_list file;
    fm_status st = fm_safetensors_load(path, &file, meta);
    if (st) return st;
    st = gpt_tp_load_state(m, &file, path, state);
    fm_named_list_free(&file);
    return st;
}

/* The whole optimizer state ("<param>.<slot>") of n ZeRO-1 shard files (paths[r]: ZeRO rank r's),
 * whose flat index space is the parameters of `like` (names, and tensors whose sizes are read) in
 * the model's order, as the trainer's optimizer (gpt_adamw_setup) lays them out. */
static fm_status zero_shards_state(const fm_named_list *like, char *const *paths, int n, fm_named_list *out) {
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    fm_optim *layout = fm_optim_new(&oc); /* names and sizes only: it never makes state */
    fm_status st = layout ? FM_OK : fm_last_status();
    const int g = st ? -1 : fm_optim_add_group(layout, 0.0);
    if (!st && g < 0) st = fm_last_status();
    for (int i = 0; i < like->n && !st; i++) st = fm_optim_add_param(layout, g, like->items[i].name, like->items[i].tensor);
    if (!st) st = fm_zero_state_from_shards((const char *const *)paths, n, layout, out);
    fm_optim_free(layout);
    return st;
}

/* The optimizer state of a ZeRO-1 sharded checkpoint written by `world` ranks
 * (dist_ckpt_load_zero: the own shard in the same sharding, else resharded; under tensor
 * parallelism the whole state, then this rank's part of it). */
static fm_status load_sharded_state(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, const fm_gpt_train_opts *o,
                                    const char *dir, int world) {
    const int rank = o->dist ? fm_dist_rank(o->dist) : 0, now = o->dist ? fm_dist_size(o->dist) : 1;
    if (!m->tp) return dist_ckpt_load_zero(dir, world, rank, now, dt, opt);
    /* under tensor parallelism: the whole state from every shard (laid out as the whole
     * model's parameters), then this rank's part of it, as from a whole checkpoint */
    fm_rng scratch; /* a model only measured: leave the global generator where it is */
    fm_rng_init(&scratch, 0);
    fm_gpt *whole = fm_gpt_new(&m->cfg, &scratch);
    char **paths = calloc((size_t)world, sizeof *paths), name[64];
    fm_named_list full, state;
    memset(&full, 0, sizeof full);
    memset(&state, 0, sizeof state);
    fm_status st = !whole ? fm_last_status() : paths ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int r = 0; r < world && !st; r++) {
        dist_ckpt_file(name, sizeof name, "zero-shard", r, world);
        if (!(paths[r] = path_join(dir, name))) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    }
    if (!st) st = zero_shards_state(&whole->params, paths, world, &full);
    fm_gpt_free(whole);
    if (!st && dt) st = fm_dist_trainer_full_state(dt, &state);
    if (!st && !dt && !(st = fm_optim_init_state(opt))) st = fm_optim_state(opt, &state);
    if (!st) st = gpt_tp_load_state(m, &full, dir, &state);
    if (!st && dt) st = fm_dist_trainer_load_full_state(dt, &state);
    fm_named_list_free(&state);
    fm_named_list_free(&full);
    for (int r = 0; paths && r < world; r++) free(paths[r]);
    free(paths);
    return st;
}

/* Reads rank r's tp-shard file of a unit written by `world` ranks split T ways, and checks
 * that its metadata says so. */
static fm_status read_tp_file(const char *dir, int r, int world, int T, fm_named_list *l) {
    char name[64];
    tp_file_name(name, sizeof name, "shard", r, world);
    char *path = path_join(dir, name);
    if (!path) return fm_set_error(FM_ERR_OOM, "out of host memory");
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    fm_status st = fm_safetensors_load(path, l, &meta);
    if (!st) {
        const char *a = fm_kv_get(&meta, "rank"), *b = fm_kv_get(&meta, "world_size"), *c = fm_kv_get(&meta, "tp_rank"),
                   *d = fm_kv_get(&meta, "tensor_parallel");
        if (!a || !b || !c || !d || atoi(a) != r || atoi(b) != world || atoi(c) != r % T || atoi(d) != T)
            st = fm_set_error(FM_ERR_FORMAT, "%s holds the part of rank %s of %s (tensor-parallel rank %s of %s), not of "
                              "rank %d of %d (tensor-parallel rank %d of %d): a file renamed or copied from another "
                              "checkpoint?", path, a ? a : "?", b ? b : "?", c ? c : "?", d ? d : "?", r, world, r % T, T);
        if (st) fm_named_list_free(l);
    }
    fm_kv_free(&meta);
    free(path);
    return st;
}

/* This rank's part of the model and the state, as written in the same layout: bit for bit. */
static fm_status load_tp_own(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, const fm_gpt_train_opts *o,
                             const char *dir, bool zero) {
    const int rank = fm_dist_rank(o->dist), world = fm_dist_size(o->dist);
    fm_named_list file, state;
    memset(&state, 0, sizeof state);
    fm_status st = read_tp_file(dir, rank, world, m->tp_size, &file);
    if (st) return st;
    char name[600], a[96], b[96];
    bool prev = fm_set_grad_enabled(false);
    /* the parameters, then the optimizer state (without ZeRO-1) */
    if (!zero && !(st = fm_optim_init_state(opt))) st = fm_optim_state(opt, &state);
    for (int i = 0; i < m->params.n + state.n && !st; i++) {
        const bool w = i < m->params.n;
        const fm_named_tensor *it = w ? &m->params.items[i] : &state.items[i - m->params.n];
        snprintf(name, sizeof name, "%s.%s", w ? "model" : "optim", it->name);
        int k = fm_named_list_find(&file, name);
        fm_tensor *src = k >= 0 ? file.items[k].tensor : NULL, *dst = it->tensor;
        if (!src)
            st = fm_set_error(FM_ERR_FORMAT, "%s: rank %d's file has no '%s'", dir, rank, name);
        else if (src->ndim != dst->ndim || memcmp(src->shape, dst->shape, sizeof(int64_t) * (size_t)dst->ndim))
            st = fm_set_error(FM_ERR_FORMAT, "%s: rank %d's '%s' is %s, this model's %s", dir, rank, name,
                              fm_shape_str(src->ndim, src->shape, a, sizeof a), fm_shape_str(dst->ndim, dst->shape, b, sizeof b));
        else
            st = fm_copy_(dst, src);
    }
    fm_set_grad_enabled(prev);
    fm_named_list_free(&state);
    fm_named_list_free(&file);
    if (!st && zero) {
        tp_file_name(name, sizeof name, "zero", rank, world);
        char *path = path_join(dir, name);
        st = path ? fm_zero_load_shard(fm_dist_trainer_zero(dt), path) : fm_set_error(FM_ERR_OOM, "out of host memory");
        free(path);
    }
    return st;
}

/* TP x ZeRO-1: tensor-parallel part t's optimizer state from the ZeRO-1 shards of its
 * data-parallel group (ranks t, t + T, ...: ZeRO ranks 0 .. world/T - 1, each its tp-zero
 * file), added to part (its tp-shard file's tensors) as "optim.<param>.<slot>", as a TP unit
 * without ZeRO-1 holds them. The shards' flat index space is the part's parameters in the
 * model's order, sized as the part's tensors. */
static fm_status tp_zero_part_state(const fm_gpt *whole, const char *dir, int world, int T, int t, fm_named_list *part) {
    const int dp = world / T;
    char **paths = calloc((size_t)dp, sizeof *paths), name[600];
    fm_named_list like, full;
    memset(&like, 0, sizeof like); /* the part's tensors under the model's names, not owned */
    memset(&full, 0, sizeof full);
    fm_status st = paths ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int i = 0; i < whole->params.n && !st; i++) {
        snprintf(name, sizeof name, "model.%s", whole->params.items[i].name);
        int k = fm_named_list_find(part, name);
        st = k < 0 ? fm_set_error(FM_ERR_FORMAT, "%s: tensor-parallel rank %d's file has no '%s'", dir, t, name)
                   : fm_named_list_push(&like, whole->params.items[i].name, part->items[k].tensor, false, false);
    }
    for (int d = 0; d < dp && !st; d++) {
        tp_file_name(name, sizeof name, "zero", t + d * T, world);
        if (!(paths[d] = path_join(dir, name))) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    }
    if (!st) st = zero_shards_state(&like, paths, dp, &full);
    for (int i = 0; i < full.n && !st; i++) {
        snprintf(name, sizeof name, "optim.%s", full.items[i].name);
        st = fm_named_list_push(part, name, full.items[i].tensor, false, false);
    }
    fm_named_list_free(&full);
    fm_named_list_free(&like);
    for (int d = 0; paths && d < dp; d++) free(paths[d]);
    free(paths);
    return st;
}

/* Another layout (or one process): the T parts of tensor-parallel group 0 put together into
 * the whole model and state, which this run then takes as a whole checkpoint's. A TP x ZeRO-1
 * unit's parts get their state from the ZeRO-1 shards of their data-parallel group first. */
static fm_status load_tp_resplit(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, const char *dir, int world, int T,
                                 bool zero) {
    fm_named_list *parts = calloc((size_t)T, sizeof *parts), whole_state, state;
    memset(&whole_state, 0, sizeof whole_state);
    memset(&state, 0, sizeof state);
    fm_status st = parts ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int t = 0; t < T && !st; t++) st = read_tp_file(dir, t, world, T, &parts[t]);
    fm_rng scratch; /* overwritten by the files: leave the global generator where it is */
    fm_rng_init(&scratch, 0);
    fm_gpt *whole = st ? NULL : fm_gpt_new(&m->cfg, &scratch);
    if (!st && !whole) st = fm_last_status();
    for (int t = 0; t < T && !st && zero; t++) st = tp_zero_part_state(whole, dir, world, T, t, &parts[t]);
    if (!st) st = gpt_tp_assemble(whole, T, parts, dir, &whole_state);
    for (int t = 0; parts && t < T; t++) fm_named_list_free(&parts[t]);
    free(parts);
    bool prev = fm_set_grad_enabled(false);
    if (!st && m->tp) st = fm_gpt_tp_load_model(m, whole);
    for (int i = 0; !st && !m->tp && i < m->params.n; i++) st = fm_copy_(m->params.items[i].tensor, whole->params.items[i].tensor);
    fm_set_grad_enabled(prev);
    fm_gpt_free(whole);
    /* the state to fill: this run's (data parallel, ZeRO-1: its whole state, of which each rank keeps its part) */
    if (!st && dt) st = fm_dist_trainer_full_state(dt, &state);
    if (!st && !dt && !(st = fm_optim_init_state(opt))) st = fm_optim_state(opt, &state);
    if (!st && m->tp) st = gpt_tp_load_state(m, &whole_state, dir, &state);
    prev = fm_set_grad_enabled(false);
    for (int i = 0; !st && !m->tp && i < state.n; i++) {
        int k = fm_named_list_find(&whole_state, state.items[i].name);
        st = k < 0 ? fm_set_error(FM_ERR_FORMAT, "%s: optimizer state '%s' is in no part", dir, state.items[i].name)
                   : fm_copy_(state.items[i].tensor, whole_state.items[k].tensor);
    }
    fm_set_grad_enabled(prev);
    if (!st && dt) st = fm_dist_trainer_load_full_state(dt, &state);
    fm_named_list_free(&state);
    fm_named_list_free(&whole_state);
    return st;
}

/* A tensor-parallel sharded checkpoint (written by `world` ranks): the same layout (its split,
 * world size and ZeRO-1) reads each rank's own files exactly; another layout, or one process,
 * has the parts put together (with ZeRO-1: each part's state from its group's shards) and
 * split again. */
static fm_status load_tp_sharded(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, const fm_gpt_train_opts *o,
                                 const char *dir, int world, const fm_kv_list *meta, const char *sp) {
    const char *tv = fm_kv_get(meta, "tensor_parallel"), *zv = fm_kv_get(meta, "tp_zero"), *wv = fm_kv_get(meta, "tp_world_size");
    const int T = tv ? atoi(tv) : 0, now = o->dist ? fm_dist_size(o->dist) : 1;
    const bool zero = zv && !strcmp(zv, "1");
    if (T < 2 || world % T || !wv || atoi(wv) != world)
        return fm_set_error(FM_ERR_FORMAT, "%s: tensor_parallel %s, tp_world_size %s do not match its %d ranks' files", sp,
                            tv ? tv : "missing", wv ? wv : "missing", world);
    if (m->tp && m->tp_size == T && now == world && zero == (o->zero != 0)) return load_tp_own(m, opt, dt, o, dir, zero);
    if (zero && world / T < 2)
        return fm_set_error(FM_ERR_FORMAT, "%s: tp_zero is 1 but its %d ranks split %d ways leave no data-parallel ranks "
                            "to shard over", sp, world, T);
    return load_tp_resplit(m, opt, dt, dir, world, T, zero);
}

static fm_status load_ckpt(fm_gpt *m, fm_optim *opt, fm_dist_trainer *dt, const fm_gpt_train_opts *o,
                           const fm_ckpt_found *f, int64_t *step, fm_train_step *ts) {
    char *mp = path_join(f->dir, "model.safetensors"), *sp = path_join(f->dir, "train_state.safetensors");
    fm_status st = mp && sp ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    fm_named_list state;
    memset(&state, 0, sizeof state);
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    int64_t s = 0;
    uint64_t off = 0, seed = 0;
    const int tpw = f->legacy ? 0 : dist_ckpt_world(f->dir, "tp-shard"),
              shards = f->legacy || tpw ? 0 : dist_ckpt_world(f->dir, "zero-shard");
    if (!st && tpw > 0) {
        /* tensor parallel shards: train_state.safetensors holds the metadata only */
        st = fm_safetensors_load_into(sp, &state, &meta);
        if (!st) st = load_tp_sharded(m, opt, dt, o, f->dir, tpw, &meta, sp);
    } else if (!st && !(st = m->tp ? load_whole_split(m, mp) : fm_gpt_load_hf(m, mp)) && shards > 0) {
        /* ZeRO-1 shards: train_state.safetensors holds the metadata only */
        st = fm_safetensors_load_into(sp, &state, &meta);
        if (!st) st = load_sharded_state(m, opt, dt, o, f->dir, shards);
        const char *w = fm_kv_get(&meta, "zero_world_size");
        if (!st && (!w || atoi(w) != shards))
            st = fm_set_error(FM_ERR_FORMAT, "%s: zero_world_size is %s but the checkpoint holds shards of %d ranks", sp,
                              w ? w : "missing", shards);
    } else {
        /* data parallel: the whole state (ZeRO-1: full tensors, then this rank's part is kept) */
        if (!st && dt) st = fm_dist_trainer_full_state(dt, &state);
        if (!st && !dt) st = fm_optim_init_state(opt);
        if (!st && !dt) st = fm_optim_state(opt, &state);
        if (!st) st = m->tp ? load_state_split(m, sp, &state, &meta) : fm_safetensors_load_into(sp, &state, &meta);
        if (!st && dt) st = fm_dist_trainer_load_full_state(dt, &state);
    }
    if (!st) st = meta_num(&meta, "step", sp, false, &s);
    if (!st) st = meta_num(&meta, "dropout_rng_offset", sp, true, &off);
    if (!st) st = meta_num(&meta, "seed", sp, true, &seed);
    if (!st && seed != o->seed)
        st = fm_set_error(FM_ERR_INVALID, "%s: checkpoint was trained with seed %llu, this run uses %llu", sp,
                          (unsigned long long)seed, (unsigned long long)o->seed);
    if (!st && (s < 0 || (!f->legacy && s != f->step)))
        st = fm_set_error(FM_ERR_FORMAT, "%s: the state is at step %lld but the MANIFEST says %lld", sp, (long long)s,
                          (long long)f->step);
    /* the optimizer's step count (checkpoints before it was written: the step, as then) */
    int64_t os = s;
    if (!st && fm_kv_get(&meta, "optimizer_step") && !(st = meta_num(&meta, "optimizer_step", sp, false, &os)) &&
        (os < 0 || os > s))
        st = fm_set_error(FM_ERR_FORMAT, "%s: optimizer_step %lld is outside 0..%lld (the step)", sp, (long long)os,
                          (long long)s);
    if (!st) {
        *step = s;
        m->rng->offset = off;
        fm_optim_set_step(dt ? fm_dist_trainer_optim(dt) : opt, os);
        /* the loss scaler and the loss's running minimum go on (absent from older checkpoints: afresh) */
        st = fm_train_step_state_load(ts, &meta);
        if (st) fm_error_prefix("%s", sp);
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

fm_status fm_gpt_train(const fm_gpt_train_opts *o, double *final_train_loss, double *final_val_loss) {
    fm_gpt_train_result r;
    fm_status st = fm_gpt_train_ex(o, &r);
    if (st == FM_OK) {
        if (final_train_loss) *final_train_loss = r.train_loss;
        if (final_val_loss) *final_val_loss = r.val_loss;
    }
    return st;
}

/* The run's state, shared by the pieces of fm_gpt_train_ex. */
typedef struct gpt_run {
    const fm_gpt_train_opts *o;
    fm_gpt_train_result *res;
    fm_gpt_config cfg;
    fm_tokenizer *tok;
    fm_token_data d;
    fm_gpt *m;
    fm_optim *opt;
    fm_tensor **params;
    fm_tb_writer *tb;
    fm_progress *prog;
    fm_train_step ts; /* micro-batches, autocast, loss scaler, clip, AdamW */
    fm_lr_schedule sched;
    fm_dist_trainer *dt; /* data parallel (NULL: this process alone) */
    int rank, world;
    /* tensor parallel (--tensor-parallel T > 1): world = T x DP; tp groups ranks r / T, dp
     * ranks r % T; without it dp is o->dist. dp_rank, dp_size: the data-parallel position */
    fm_dist *tp, *dp;
    int tp_size, dp_rank, dp_size;
    gpt_tp_zero_norm zn; /* ZeRO-1 with it: the clipping norm's reduction */
    int64_t tp_bytes, step0; /* sent by this rank in the training steps' tensor-parallel collectives; first step */
    double tp_seconds;  /* time in them */
    int64_t inf_step;   /* FATHOM_TEST_INF_GRAD=STEP:RANK (tests): that step's gradient gets an inf on that rank */
    int inf_rank;
    bool profiling, in_step, do_step;
    int64_t split, step, steps, last_good, tok_log, tok_all, tok_tb, skipped0; /* steps: the run's length */
    double t_start, t_log, t_tb, last, val, norm;
    fm_batch_stage *stage; /* a device other than the cpu: the next step's batch, uploaded one step ahead */
} gpt_run;

/* The loss of one micro-batch (fm_train_loss_fn). */
static fm_tensor *gpt_loss(void *ctx, fm_tensor *x, fm_tensor *y) {
    gpt_run *u = ctx;
    fm_tensor *loss = NULL, *lg = fm_gpt_forward(u->m, x, u->o->loss ? NULL : y, u->o->loss ? NULL : &loss);
    if (lg && u->o->loss) loss = u->o->loss(u->o->loss_ctx, lg, x, y);
    fm_tensor_release(lg);
    return lg ? loss : NULL;
}

/* The unscaled gradients, before clipping scales them: fp16 under tensor parallelism first
 * makes the loss scaler's overflow check the job's (one sum of the found-inf flags over the
 * world, that is over the tensor-parallel and the data-parallel groups): each rank checks
 * only its own part of the split gradients, so without it one rank could skip a step that
 * another takes, and their weights, scales and collectives would part. Then every rank
 * skips the same steps and halves its scale alike. (Without tensor parallelism the
 * data-parallel layer sums them, fm_dist_trainer.) Then the histograms. */
static fm_status gpt_grad_histograms(void *ctx) {
    gpt_run *u = ctx;
    if (u->ts.scaler.enabled && u->tp) {
        double inf = u->ts.scaler.found_inf ? 1 : 0;
        if (fm_dist_allreduce_sum_f64(u->o->dist, &inf, 1) != FM_OK) return fm_last_status();
        u->ts.scaler.found_inf = inf > 0;
    }
    if (u->tb && u->o->hist_every > 0 && (u->step + 1) % u->o->hist_every == 0)
        fm_tb_add_histograms(u->tb, "grads", &u->m->params, true, u->step + 1);
    return FM_OK;
}

/* The run cannot go on: why, at which step (counted as the log counts them: the
 * weights after `step` steps), and where the last good checkpoint is. */
static fm_status gpt_stopped(gpt_run *u, const char *why, int64_t step) {
    char w[600];
    snprintf(w, sizeof w, "%s", why);
    if (u->last_good >= 0)
        return fm_set_error(FM_ERR_STATE, "train: %s at step %lld; training stopped. The last good checkpoint (step %lld) "
                            "in %s/ckpt is untouched; lower the lr", w, (long long)step, (long long)u->last_good,
                            u->o->out_dir);
    return fm_set_error(FM_ERR_STATE, "train: %s at step %lld; training stopped before any checkpoint was written; lower "
                        "the lr", w, (long long)step);
}

/* The tokenizer and token file: rank 0 makes them in out_dir (once), the other ranks
 * then read them (a shared directory) or make the same ones (another machine's). */
static fm_status gpt_prepare_data(gpt_run *u) {
    fm_status st = u->rank == 0 ? prepare_data(u->o, &u->tok, &u->d) : FM_OK;
    if (u->world < 2) return st;
    int32_t rc0 = (int32_t)st; /* the others wait for rank 0's files, and hear whether it failed */
    if (fm_dist_broadcast(u->o->dist, &rc0, sizeof rc0, 0) != FM_OK) return fm_last_status();
    if (u->rank == 0) return st;
    if (rc0 != FM_OK) return fm_set_error((fm_status)rc0, "rank 0 could not prepare the training data (its error says why)");
    return prepare_data(u->o, &u->tok, &u->d);
}

/* Tensor parallel (--tensor-parallel T > 1): what it cannot run with, then the groups:
 * ranks r / T share a model split T ways, ranks with the same r % T form a data-parallel
 * group. Before any weight exists; every rank finds the same errors. */
static fm_status gpt_tp_setup(gpt_run *u) {
    const fm_gpt_train_opts *o = u->o;
    const int T = o->tensor_parallel > 1 ? o->tensor_parallel : 1;
    u->tp_size = T;
    u->dp = o->dist;
    u->dp_rank = u->rank;
    u->dp_size = u->world;
    if (T == 1) return FM_OK;
    if (o->loss)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d cannot run a loss hook (distillation): the logits are "
                            "split by vocabulary there; distill without tensor parallelism", T);
    if (!o->dist || u->world % T)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d needs a world of a multiple of %d ranks (world size = "
                            "tensor parallel x data parallel), got %d: start the job with mpirun -np %d (or %d, ...)", T, T,
                            u->world, T, 2 * T);
    fm_status st = fm_gpt_tp_check(&u->cfg, T);
    if (st) return st;
    /* ZeRO-1: the data-parallel ranks (r % T alike) share out this rank's part's state */
    if (o->zero && u->world / T < 2)
        return fm_set_error(FM_ERR_INVALID, "--zero 1 with --tensor-parallel %d shards the optimizer state over the "
                            "data-parallel ranks (world / %d = %d here): start the job with mpirun -np %d (or more), or "
                            "drop --zero", T, T, u->world / T, 2 * T);
    /* bf16 and fp16: autocast's low-precision activations are widened to f32 where they
     * cross ranks (src/dist/tensor_parallel.c); fp16's loss scaler decides on the whole
     * job's gradients (gpt_grad_histograms), so every rank skips the same steps */
    /* blocks: a checkpointed split block is run again in backward, all-reduces included (every
     * rank re-runs the same blocks in the same order); selective: each linear's input function
     * (norm and tp_copy, attention core, activation) is recomputed on this rank's shards
     * (block_tp, gpt_model.c) */
    if ((st = fm_dist_split(o->dist, u->rank / T, &u->tp)) || (st = fm_dist_split(o->dist, u->rank % T, &u->dp)))
        return st;
    /* on a GPU each group gets its own NCCL communicator (the world's is the DP one's without TP) */
    if ((st = fm_dist_use_device(u->tp, o->eff.device)) || (st = fm_dist_use_device(u->dp, o->eff.device))) return st;
    u->dp_rank = fm_dist_rank(u->dp);
    u->dp_size = fm_dist_size(u->dp);
    return FM_OK;
}

/* Data parallel (a world of more than one, or --zero): the batch splits evenly over the
 * ranks (of the data-parallel group), and the step gets the gradient buckets or the
 * sharded optimizer. */
static fm_status gpt_dist_init(gpt_run *u) {
    const fm_gpt_train_opts *o = u->o;
    const int n = u->dp_size;
    if (!o->dist && o->zero)
        return fm_set_error(FM_ERR_INVALID, "--zero 1 shards the optimizer state across MPI ranks: start the job with "
                            "mpirun -np N (N >= 2)");
    if (!o->dist || (n < 2 && !o->zero && !fm_dist_uses_nccl(o->dist))) return FM_OK; /* NCCL: even alone */
    if (o->batch_size % n)
        return fm_set_error(FM_ERR_INVALID, "the batch (%d) does not split evenly over %d ranks: give --batch a multiple of %d",
                            o->batch_size, n, n);
    if (o->eff.grad_accum > o->batch_size / n)
        return fm_set_error(FM_ERR_INVALID, "--grad-accum %d is more than the %d windows each of the %d ranks gets per batch",
                            o->eff.grad_accum, o->batch_size / n, n);
    if (!(u->dt = fm_dist_trainer_new(u->dp, &u->ts, o->zero, o->bucket_bytes))) return fm_last_status();
    return FM_OK;
}

/* Data, split, memory checks, model, optimizer and scaler. */
/* The trainer's optimizer (the planner's meta-device step, src/plan/plan_step.c, builds
 * the same): AdamW from o's settings, with weight decay on matrices and none on vectors
 * and norms; *params gets the parameters in the model's order (NULL-terminated; the
 * caller frees it); the state is made up front, tagged as optimizer memory, unless
 * make_state is false. */
fm_status gpt_adamw_setup(fm_gpt *m, const fm_gpt_train_opts *o, bool make_state, fm_optim **opt, fm_tensor ***params) {
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    oc.lr = o->lr;
    oc.beta1 = o->beta1;
    oc.beta2 = o->beta2;
    oc.weight_decay = o->weight_decay;
    if (!(*opt = fm_optim_new(&oc))) return fm_last_status();
    int gd = fm_optim_add_group(*opt, o->weight_decay), gn = fm_optim_add_group(*opt, 0.0);
    if (!(*params = calloc((size_t)m->params.n + 1, sizeof **params))) return fm_set_error(FM_ERR_OOM, "out of host memory");
    fm_status st;
    for (int i = 0; i < m->params.n; i++) {
        fm_tensor *p = m->params.items[i].tensor;
        (*params)[i] = p;
        if ((st = fm_optim_add_param(*opt, p->ndim >= 2 ? gd : gn, m->params.items[i].name, p))) return st;
    }
    if (!make_state) return FM_OK;
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_OPTIMIZER);
    st = fm_optim_init_state(*opt);
    fm_memory_tag_pop(mc);
    return st;
}

static fm_status gpt_setup(gpt_run *u) {
    const fm_gpt_train_opts *o = u->o;
    const fm_efficiency_opts *eo = &o->eff;
    fm_status st;
    if ((st = fm_mkdir_p(o->out_dir))) return st;
    if (u->rank == 0) fm_ckpt_clean_stale(o->out_dir, o->quiet ? NULL : stderr);
    if ((st = gpt_prepare_data(u))) return st;
    u->cfg.vocab_size = fm_tokenizer_vocab_size(u->tok);
    /* the last val_fraction of the tokens is held out */
    u->split = (int64_t)((double)u->d.n * (1.0 - o->val_fraction));
    const int T = u->cfg.block_size;
    if (u->split < T + 1 || u->d.n - u->split < T + 1)
        return fm_set_error(FM_ERR_INVALID,
                            "%s: the corpus is too short: %lld tokens; with block_size %d both the training split and the "
                            "held-out %.0f%% need at least %d tokens (use more text or a smaller block_size)",
                            o->corpus, (long long)u->d.n, T, 100 * o->val_fraction, T + 1);
    u->steps = o->steps;
    if (o->epochs > 0) {
        int64_t per = (int64_t)o->batch_size * T;
        u->steps = ((int64_t)o->epochs * u->split + per - 1) / per;
    }
    /* the memory options, and whether the model fits, before any weight exists */
    if ((st = fm_efficiency_apply_memory(eo))) return st;
    if ((st = gpt_tp_setup(u))) return st;
    /* tensor parallel: the parameters one rank holds (ZeRO-1: this rank's 1/DP of the AdamW
     * moments; its checkpoints write each rank's shard as it is, save_ckpt_sharded) */
    if ((st = fm_efficiency_check_fits_zero(eo, gpt_tp_num_params(&u->cfg, u->tp_size), 2 /* AdamW moments */,
                                            o->zero && o->dist ? u->dp_size : 1, false)))
        return st;
    fm_rng init;
    fm_rng_init(&init, o->seed);
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    u->m = fm_gpt_new(&u->cfg, &init);
    fm_memory_tag_pop(mc);
    if (!u->m) return fm_last_status();
    if (o->init_weights && (st = fm_gpt_load_hf(u->m, o->init_weights))) {
        fm_error_prefix("train: the initial weights");
        return st;
    }
    if (u->tp && (st = fm_gpt_set_tensor_parallel(u->m, u->tp))) return st; /* built whole, then split */
    /* the model goes to its device before the optimizer makes its state there */
    if (eo->device.type != FM_DEV_CPU && (st = fm_gpt_to(u->m, eo->device))) return st;
    /* dropout: one generator per data-parallel rank (the ranks of a tensor-parallel group
     * share it: every dropout of the GPT acts on activations the group holds whole) */
    fm_rng_init(&u->m->own_rng, fm_dist_rank_seed(o->seed ^ 0xd50u, u->dp_rank));
    if ((st = fm_gpt_set_checkpointing(u->m, eo->checkpointing))) return st;
    /* ZeRO-1: only this rank's shard of the state, made by dt */
    if ((st = gpt_adamw_setup(u->m, o, !o->zero, &u->opt, &u->params))) return st;
    if (u->tp) fm_optim_set_norm_reduce(u->opt, gpt_tp_norm_reduce, u->m); /* the whole model's norm */
    fm_train_step_init(&u->ts, eo, u->opt, u->m->params.n, u->params, gpt_loss, u);
    u->ts.divergence_factor = o->divergence_factor;
    u->ts.scaler.quiet = o->quiet;
    u->ts.clip = o->grad_clip;
    u->ts.inspect_grads = gpt_grad_histograms;
    if ((st = gpt_dist_init(u))) return st;
    if (u->tp && u->dt && o->zero) { /* the whole model's norm from the shards */
        u->zn = (gpt_tp_zero_norm){u->m, fm_dist_trainer_optim(u->dt), u->dp};
        fm_optim_set_norm_reduce(u->zn.shard, gpt_tp_zero_norm_reduce, &u->zn);
    }
    u->sched.kind = FM_SCHED_COSINE;
    u->sched.base_lr = o->lr;
    u->sched.warmup_steps = o->warmup;
    u->sched.total_steps = u->steps;
    u->sched.min_lr = o->min_lr;
    return FM_OK;
}

/* --resume: the newest complete checkpoint; none (or only incomplete ones): step 0. */
static fm_status gpt_resume(gpt_run *u) {
    const fm_gpt_train_opts *o = u->o;
    fm_ckpt_found f;
    fm_ckpt_find(o->out_dir, &f, u->rank == 0 ? stderr : NULL);
    if (!f.dir[0]) {
        if (!o->quiet) fprintf(stderr, "no complete checkpoint in %s: training from step 0\n", o->out_dir);
        return FM_OK;
    }
    fm_status st = load_ckpt(u->m, u->opt, u->dt, o, &f, &u->step, &u->ts);
    if (!st && u->rank == 0) st = fm_ckpt_relink(o->out_dir, &f);
    if (u->world > 1) { /* every rank resumed, or none trains: the others would wait for it at the first collective */
        double bad = st ? 1 : 0;
        /* said now: the job may end (MPI_Abort from another rank) before this rank's error is printed */
        if (st) fprintf(stderr, "fathom: rank %d of %d: resuming from %s: %s\n", u->rank, u->world, f.dir, fm_last_error());
        if (fm_dist_allreduce_sum_f64(o->dist, &bad, 1) != FM_OK) st = fm_last_status();
        else if (bad > 0 && !st)
            st = fm_set_error(FM_ERR_STATE, "%.0f of the %d ranks could not resume from %s (their errors say why); nothing "
                              "was trained", bad, u->world, f.dir);
    }
    if (st) {
        fm_error_prefix("resuming from %s", f.dir);
        return st;
    }
    u->last_good = u->step;
    if (!o->quiet)
        fprintf(stderr, "resumed from %s at step %lld%s\n", f.dir, (long long)u->step,
                f.legacy ? " (a checkpoint without a MANIFEST, written by an older fathom: its files' steps are not "
                           "cross-checked)" : "");
    return FM_OK;
}

/* The failed loss was computed on the weights the last step left: when the newest
 * checkpoint is of that step it holds them, and rank 0 sets it aside
 * (OUT/ckpt/step-N.diverged, out of --resume's way; fm_ckpt_set_aside). */
static fm_status gpt_loss_stopped(gpt_run *u, const char *why) {
    if (u->last_good < 0 || u->last_good != u->step || u->rank != 0) return gpt_stopped(u, why, u->step);
    char moved[PATH_MAX + 64];
    int64_t prev = fm_ckpt_set_aside(u->o->out_dir, u->step, moved, sizeof moved, u->o->quiet ? NULL : stderr);
    if (prev < 0)
        return fm_set_error(FM_ERR_STATE, "train: %s at step %lld; training stopped. The checkpoint of step %lld in "
                            "%s/ckpt holds the weights that gave this loss, and no earlier one is kept to go back to "
                            "(keep_checkpoints): resuming from it starts from those weights; lower the lr", why,
                            (long long)u->step, (long long)u->step, u->o->out_dir);
    return fm_set_error(FM_ERR_STATE, "train: %s at step %lld; training stopped. The checkpoint of step %lld holds the "
                        "weights that gave this loss: moved to %s, out of --resume's way. The last good checkpoint "
                        "(step %lld) in %s/ckpt is untouched, and %s/ links to it again; lower the lr", why,
                        (long long)u->step, (long long)u->step, moved, (long long)prev, u->o->out_dir, u->o->out_dir);
}

/* A non-finite loss (without the fp16 scaler, which skips such steps) or one
 * that exploded over its running minimum ends the run. */
static fm_status gpt_check_loss(gpt_run *u) {
    char why[200];
    return fm_train_step_check_loss(&u->ts, u->last, why, sizeof why) ? FM_OK : gpt_loss_stopped(u, why);
}

/* Step `step`'s batch (this rank's rows of it), on the host. */
static fm_status gpt_batch(gpt_run *u, int64_t step, fm_tensor **x, fm_tensor **y) {
    const fm_gpt_train_opts *o = u->o;
    int64_t first = 0, rows = o->batch_size; /* data parallel: this rank's windows of the batch */
    fm_data_shard_rows(o->batch_size, u->dp_rank, u->dp_size, &first, &rows);
    return fm_gpt_batch_random_rows(&u->d, 0, u->split, o->batch_size, u->cfg.block_size, o->seed, step, (int)first,
                                    (int)rows, x, y);
}

/* Through the stage (a device): this step's batch on the device, and the next step's
 * upload queued before this step's compute, so that on a GPU the two overlap. */
static fm_status gpt_stage_put(gpt_run *u, int64_t step) {
    fm_tensor *hx, *hy;
    fm_status st = gpt_batch(u, step, &hx, &hy);
    if (st == FM_OK) st = fm_batch_stage_put(u->stage, hx, hy);
    fm_tensor_release_n(2, hx, hy);
    return st;
}
static fm_status gpt_staged_batch(gpt_run *u, fm_tensor **x, fm_tensor **y) {
    fm_status st = fm_batch_stage_count(u->stage) ? FM_OK : gpt_stage_put(u, u->step);
    if (st == FM_OK) st = fm_batch_stage_take(u->stage, x, y);
    if (st == FM_OK && u->step + 1 < u->steps && (st = gpt_stage_put(u, u->step + 1))) fm_tensor_release_n(2, *x, *y);
    return st;
}

/* FATHOM_TEST_INF_GRAD=STEP:RANK, for tests of the fp16 loss scaler over several ranks:
 * at step STEP (counted from 1, as the log counts) rank RANK writes +inf into the first
 * element of the first gradient the scaler checks (the token embedding's, under tensor
 * parallelism this rank's vocabulary rows of it; under ZeRO-1 this rank's first shard of the
 * averaged gradient) after backward, before the scaler checks it, as an fp16 overflow in
 * that rank's own gradient would. */
static fm_status gpt_test_inf_parse(gpt_run *u) {
    const char *v = getenv("FATHOM_TEST_INF_GRAD");
    u->inf_step = -1;
    if (!v || !*v) return FM_OK;
    char *e = NULL, *e2 = NULL;
    long long step = strtoll(v, &e, 10), rank = *e == ':' ? strtoll(e + 1, &e2, 10) : -1;
    if (*e != ':' || e2 == e + 1 || *e2 || step < 1 || rank < 0 || rank >= u->world)
        return fm_set_error(FM_ERR_INVALID, "FATHOM_TEST_INF_GRAD is '%s': give STEP:RANK (a step from 1 and a rank of the "
                            "%d), or unset it", v, u->world);
    u->inf_step = step;
    u->inf_rank = (int)rank;
    return FM_OK;
}

static fm_status gpt_test_inf_grad(gpt_run *u) {
    fm_tensor *g = u->ts.n_params > 0 && u->ts.params[0] ? u->ts.params[0]->grad : NULL;
    if (!g || g->dtype != FM_F32 || !fm_tensor_is_contiguous(g) || fm_tensor_device(g).type != FM_DEV_CPU ||
        fm_tensor_numel(g) < 1)
        return fm_set_error(FM_ERR_UNSUPPORTED, "FATHOM_TEST_INF_GRAD: the first parameter has no contiguous f32 CPU "
                            "gradient to write into");
    ((float *)fm_tensor_data(g))[0] = INFINITY;
    return FM_OK;
}

/* One optimizer step: the batch, then the step every trainer runs (fathom/train_step.h). */
static fm_status gpt_step(gpt_run *u) {
    const fm_gpt_train_opts *o = u->o;
    fm_optim_set_lr(u->dt ? fm_dist_trainer_optim(u->dt) : u->opt, fm_lr_at(&u->sched, u->step));
    fm_tensor *x = NULL, *y = NULL;
    double td = now_s(), pd = fm_profiler_now_us();
    int64_t first = 0, rows = o->batch_size; /* data parallel: this rank's windows of the batch */
    fm_data_shard_rows(o->batch_size, u->dp_rank, u->dp_size, &first, &rows);
    fm_status st = u->stage ? gpt_staged_batch(u, &x, &y) : gpt_batch(u, u->step, &x, &y);
    u->res->data_seconds += now_s() - td;
    fm_profile_span("next batch", "data", pd, fm_profiler_now_us() - pd, NULL);
    if (st) return st;
    fm_dist_stats t0, t1;
    fm_dist_stats_get(u->tp, &t0);
    st = fm_train_step_backward(&u->ts, x, y, &u->last);
    fm_tensor_release_n(2, x, y);
    if (!st && u->dt) st = fm_dist_trainer_reduce_loss(u->dt, &u->last, rows, o->batch_size); /* the batch's mean */
    if (st || (st = gpt_check_loss(u))) return st;
    if (u->inf_step == u->step + 1 && u->inf_rank == u->rank && (st = gpt_test_inf_grad(u))) return st;
    u->ts.want_norm = u->tb != NULL || o->zero; /* the norm for the logs (ZeRO-1: a collective, on every rank) */
    if ((st = fm_train_step_update(&u->ts))) return st;
    fm_dist_stats_get(u->tp, &t1); /* tensor parallel: the step's own collectives (not validation's) */
    u->tp_bytes += t1.bytes_sent - t0.bytes_sent;
    u->tp_seconds += t1.wait_seconds - t0.wait_seconds;
    u->norm = u->ts.stepped && u->ts.grad_norm == u->ts.grad_norm ? u->ts.grad_norm : 0;
    u->do_step = u->ts.stepped;
    return FM_OK;
}

/* The log line and the TensorBoard scalars of a finished step. */
static void gpt_log_step(gpt_run *u, int64_t done_steps) {
    const fm_gpt_train_opts *o = u->o;
    bool due = o->log_every > 0 && (done_steps % o->log_every == 0 || done_steps == u->steps);
    if (!o->quiet && due) {
        double t = now_s();
        char line[256];
        int k = snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  %.0f s",
                         (long long)done_steps, (long long)u->steps, u->last, fm_lr_at(&u->sched, u->step), u->norm,
                         u->tok_log / (t - u->t_log), t - u->t_start);
        if (u->ts.scaler.enabled && k > 0 && k < (int)sizeof line)
            snprintf(line + k, sizeof line - (size_t)k, "  loss scale %g  skipped %lld", u->ts.scaler.scale, (long long)u->ts.scaler.n_skipped);
        fm_progress_log(u->prog, "%s", line); /* above a terminal's redrawn line, not through it */
        u->t_log = t;
        u->tok_log = 0;
    }
    if (u->tb && due) {
        double t = now_s();
        fm_memory_stats mst;
        fm_tb_add_scalar(u->tb, "train/loss", done_steps, u->last);
        fm_tb_add_scalar(u->tb, "train/lr", done_steps, fm_lr_at(&u->sched, u->step));
        if (t > u->t_tb) fm_tb_add_scalar(u->tb, "train/throughput", done_steps, (double)(u->tok_all - u->tok_tb) / (t - u->t_tb));
        if (u->do_step) fm_tb_add_scalar(u->tb, "train/grad_norm", done_steps, u->norm);
        if (u->ts.scaler.enabled) fm_tb_add_scalar(u->tb, "train/loss_scale", done_steps, u->ts.scaler.scale);
        if (fm_memory_stats_get(o->eff.device, &mst) == FM_OK) fm_tb_add_scalar(u->tb, "memory/allocated_bytes", done_steps, (double)mst.allocated);
        u->t_tb = t;
        u->tok_tb = u->tok_all;
    }
    if (u->tb && o->hist_every > 0 && done_steps % o->hist_every == 0)
        fm_tb_add_histograms(u->tb, "weights", &u->m->params, false, done_steps);
}

/* Validation (a non-finite loss stops the run before anything is saved) and a sample. */
static fm_status gpt_validate(gpt_run *u, int64_t done_steps) {
    const fm_gpt_train_opts *o = u->o;
    fm_status st = evaluate(u->m, &u->d, u->split, u->d.n, o, u->dp, &u->val);
    if (st) return st;
    if (u->tb) fm_tb_add_scalar(u->tb, "val/loss", done_steps, u->val);
    fm_progress_log(u->prog, "step %lld  val loss %.4f", (long long)done_steps, u->val);
    if (!isfinite(u->val)) {
        char why[100];
        snprintf(why, sizeof why, "the validation loss became %g", u->val);
        return gpt_stopped(u, why, done_steps);
    }
    if (o->sample_tokens > 0 && !o->quiet && !u->tp) { /* no cached decoding of a split model */
        int32_t nl[1];
        int32_t *pi = NULL;
        int64_t pn = 0;
        fm_gpt_sample_params spar = {0.8, 0, 1.0, (uint64_t)done_steps};
        if (fm_tokenizer_encode(u->tok, "\n", 1, &pi, &pn) == FM_OK && pn > 0) nl[0] = pi[0];
        else nl[0] = 0;
        free(pi);
        fm_progress_clear(u->prog); /* the sample streams out token by token */
        fprintf(stderr, "--- sample ---\n");
        fm_gpt_generate(u->m, nl, 1, o->sample_tokens, &spar, true, NULL, NULL, NULL, print_tok, u->tok);
        fprintf(stderr, "\n--------------\n");
    }
    return FM_OK;
}

static fm_status gpt_loop(gpt_run *u) {
    const fm_gpt_train_opts *o = u->o;
    const int64_t step_tokens = (int64_t)o->batch_size * u->cfg.block_size;
    for (; u->step < u->steps; u->step++) {
        fm_profile_push("step", "step");
        u->in_step = true;
        fm_status st = gpt_step(u);
        if (st) return st;
        fm_profile_pop(); /* step */
        u->in_step = false;
        u->tok_log += step_tokens;
        u->tok_all += step_tokens;
        int64_t done_steps = u->step + 1;
        fm_progress_update(u->prog, done_steps, u->tok_all, u->last);
        gpt_log_step(u, done_steps);
        bool stop = o->stop_after > 0 && done_steps >= o->stop_after;
        if (!o->no_eval && ((o->eval_every > 0 && done_steps % o->eval_every == 0) || done_steps == u->steps) &&
            (st = gpt_validate(u, done_steps)))
            return st;
        if ((o->ckpt_every > 0 && done_steps % o->ckpt_every == 0) || done_steps == u->steps || stop) {
            bool poisoned = false;
            if ((st = save_ckpt(u->m, u->opt, u->dt, o, done_steps, done_steps == u->steps || stop, &u->ts,
                                &poisoned)))
                return poisoned ? gpt_stopped(u, fm_last_error(), done_steps) : st;
            u->last_good = done_steps;
        }
        if (stop) { u->step++; break; }
    }
    return FM_OK;
}

static void gpt_results(gpt_run *u) {
    fm_gpt_train_result *res = u->res;
    res->train_loss = u->last;
    res->val_loss = u->val;
    res->steps = u->step;
    res->total_steps = u->steps;
    res->num_params = fm_gpt_config_num_params(&u->cfg); /* the whole model's, also when split */
    res->train_seconds = now_s() - u->t_start;
    res->tokens_per_second = res->train_seconds > 0 ? (double)u->tok_all / res->train_seconds : 0;
    res->loss_scale = u->ts.scaler.scale;
    res->skipped_steps = u->ts.scaler.n_skipped - u->skipped0;
    fm_dist_trainer_report(u->dt, &res->dist);
    if (u->tp) {
        res->dist.world_size = u->world;
        res->dist.tensor_parallel = u->tp_size;
        res->dist.tp_steps = u->step - u->step0;
        res->dist.tp_bytes_sent = u->tp_bytes;
        res->dist.tp_comm_seconds = u->tp_seconds;
        /* per rank: all-reduces send 2(T-1)/T of the buffer (T-1 chunks twice); the loss
         * all-gathers N row maxima (f32) and all-reduces two [N] f32 sums (exp, target's
         * logit); the norm one f64 */
        const int64_t T = u->tp_size, N = (int64_t)(u->o->batch_size / u->dp_size) * u->cfg.block_size;
        const int64_t act = N * u->cfg.n_embd * (int64_t)sizeof(float);
        /* --checkpointing blocks: every block but the last is run again in backward, with
         * its two forward all-reduces */
        const int64_t L = u->cfg.n_layer, redo = u->o->eff.checkpointing == FM_CKPT_BLOCKS ? 2 * (L - 1) : 0;
        res->dist.tp_formula_bytes = (4 * L + 2 + redo) * 2 * (T - 1) * (act / T) +
                                     (T - 1) * N * 4 + 2 * 2 * (T - 1) * ((N + T - 1) / T) * 4 + (T - 1) * 8;
    }
    fm_memory_stats ms;
    if (fm_memory_stats_get(u->o->eff.device, &ms) == FM_OK) res->peak_memory_bytes = ms.allocated_peak;
    fm_memory_report mrep;
    if (fm_memory_report_get(u->o->eff.device, &mrep) == FM_OK) {
        fm_memory_report_json(&mrep, res->memory_report_json, sizeof res->memory_report_json);
        fm_memory_report_format(&mrep, res->memory_report_text, sizeof res->memory_report_text);
    }
}

static void gpt_banner(const gpt_run *u) {
    const fm_gpt_config *c = &u->cfg;
    const fm_efficiency_opts *eo = &u->o->eff;
    fprintf(stderr, "model: %s, %d layers, %d heads, %d wide, block %d, vocab %d: %lld parameters; %lld train / %lld val tokens\n",
            fm_gpt_arch_name(c->arch), c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size,
            (long long)fm_gpt_config_num_params(c), (long long)u->split, (long long)(u->d.n - u->split));
    if (eo->precision != FM_F32 || eo->checkpointing != FM_CKPT_NONE || eo->grad_accum > 1)
        fprintf(stderr, "precision %s, checkpointing %s, %d micro-batch%s of %d per step\n", fm_precision_name(eo->precision),
                fm_checkpointing_name(eo->checkpointing), eo->grad_accum, eo->grad_accum > 1 ? "es" : "",
                u->o->batch_size / eo->grad_accum);
    if (u->tp)
        fprintf(stderr, "tensor parallel over %d ranks: %d of the %d heads, %d of the %d MLP columns and %d of the %d "
                "vocabulary rows per rank (%lld parameters); %d such group%s\n", u->tp_size, c->n_head / u->tp_size,
                c->n_head, c->ffn_hidden / u->tp_size, c->ffn_hidden, c->vocab_size / u->tp_size, c->vocab_size,
                (long long)fm_gpt_num_params(u->m), u->dp_size,
                u->dp_size == 1 ? "" : "s (data parallel)");
    if (u->dt)
        fprintf(stderr, "data parallel over %d ranks: %d windows of each batch per rank, %d thread%s each%s\n", u->dp_size,
                u->o->batch_size / u->dp_size, fm_num_threads(), fm_num_threads() == 1 ? "" : "s", u->o->zero ? ", AdamW moments sharded (ZeRO-1)" : "");
}

fm_status fm_gpt_train_ex(const fm_gpt_train_opts *o, fm_gpt_train_result *res) {
    fm_gpt_train_result scratch;
    if (!res) res = &scratch;
    memset(res, 0, sizeof *res);
    res->train_loss = res->val_loss = NAN;
    res->loss_scale = 1;
    if (o->batch_size < 1 || o->steps < 1 || o->eval_batches < 1 || !(o->val_fraction > 0 && o->val_fraction < 1))
        return fm_set_error(FM_ERR_INVALID, "train: batch_size, steps and eval_batches must be >= 1 and val_fraction in (0, 1)");
    fm_status st = fm_efficiency_validate(&o->eff, true, o->batch_size);
    if (st) return st;
    gpt_run *u = calloc(1, sizeof *u);
    if (!u) return fm_set_error(FM_ERR_OOM, "out of host memory");
    u->o = o;
    u->res = res;
    u->cfg = o->model;
    u->last = u->val = NAN;
    u->last_good = -1;
    u->rank = o->dist ? fm_dist_rank(o->dist) : 0;
    u->world = o->dist ? fm_dist_size(o->dist) : 1;
    if ((st = gpt_test_inf_parse(u)) || (st = gpt_setup(u))) goto done;
    if (o->resume && (st = gpt_resume(u))) goto done;
    if (o->eff.device.type != FM_DEV_CPU && !(u->stage = fm_batch_stage_new(o->eff.device))) {
        st = fm_last_status();
        goto done;
    }
    if (!o->quiet) gpt_banner(u);
    if (o->profile_path && (st = fm_profiler_start(o->profile_path))) goto done;
    u->profiling = o->profile_path != NULL;
    if (o->logdir && !(u->tb = fm_tb_writer_open(o->logdir))) { st = fm_last_status(); goto done; }
    if (!(u->prog = fm_progress_begin("train", u->steps, "tokens", o->quiet ? FM_PROGRESS_QUIET : FM_PROGRESS_AUTO, stderr))) {
        st = fm_last_status();
        goto done;
    }
    fm_progress_set_start(u->prog, u->step);
    fm_memory_reset_peak(o->eff.device);
    u->t_start = u->t_log = u->t_tb = now_s();
    u->skipped0 = u->ts.scaler.n_skipped;
    u->step0 = u->step;
    if ((st = gpt_loop(u))) goto done;
    fm_progress_end(u->prog);
    u->prog = NULL;
    gpt_results(u);
done:
    fm_progress_cancel(u->prog); /* failed: the error follows, not a "done" line */
    if (u->in_step) fm_profile_pop();
    if (u->tb) {
        fm_status cst = fm_tb_writer_close(u->tb);
        if (!st) st = cst;
    }
    if (u->profiling) {
        fm_status pst = fm_profiler_stop();
        if (!st) st = pst;
    }
    fm_batch_stage_free(u->stage);
    free(u->params);
    fm_dist_trainer_free(u->dt);
    fm_optim_free(u->opt);
    fm_gpt_free(u->m);
    if (u->dp != o->dist) fm_dist_finalize(u->dp); /* the groups, after everything that uses them */
    fm_dist_finalize(u->tp);
    fm_tokenizer_free(u->tok);
    fm_token_data_free(&u->d);
    free(u);
    return st;
}

fm_gpt *fm_gpt_load_dir(const char *dir, fm_tokenizer **tok) {
    if (tok) *tok = NULL;
    char *cp = path_join(dir, "config.json"), *mp = path_join(dir, "model.safetensors"), *tp = path_join(dir, "tokenizer.txt");
    fm_gpt *m = NULL;
    fm_gpt_config c;
    if (!cp || !mp || !tp) { fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    if (!exists(dir)) {
        fm_set_error(FM_ERR_IO, "%s: no such model directory; `fathom train kjv-gpt --out %s` makes one", dir, dir);
        goto done;
    }
    if (!exists(cp)) {
        char *rp = path_join(dir, "recipe.ini");
        if (rp && exists(rp)) fm_set_error(FM_ERR_INVALID, "%s holds a classifier model (recipe.ini), not a GPT: use `fathom "
                                           "eval %s` or `fathom predict %s INPUT`", dir, dir, dir);
        else fm_set_error(FM_ERR_IO, "%s: no config.json here: not a GPT model directory written by `fathom train`", dir);
        free(rp);
        goto done;
    }
    if (fm_gpt_config_load(cp, &c)) goto done;
    if (!(m = fm_gpt_new(&c, NULL))) goto done;
    if (fm_gpt_load_hf(m, mp)) { fm_gpt_free(m); m = NULL; goto done; }
    for (int i = 0; i < m->params.n; i++)
        if (fm_tensor_has_inf_nan(m->params.items[i].tensor)) { /* garbage out, without a word, otherwise */
            fm_set_error(FM_ERR_FORMAT, "%s: weight '%s' holds NaN or inf values (from a diverged run?); refusing to "
                         "use it", mp, m->params.items[i].name);
            fm_gpt_free(m);
            m = NULL;
            goto done;
        }
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
