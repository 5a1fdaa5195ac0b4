/* GPT recipes: the .ini files with [model] type = gpt that `fathom train` and
 * `fathom summary` read. One parser, so that every command takes the same keys,
 * fills in the trainer's defaults for the ones a recipe leaves out, and rejects
 * an unknown key or a malformed value with the same "file: line N: what" error. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "fathom/gpt.h"
#include "io/io_internal.h" /* fm_ini_text: inih over text, long lines refused */

typedef struct recipe_ctx {
    fm_gpt_recipe *r;
    char err[256]; /* the first error: inih goes on parsing after it, and its line is the first one's */
} recipe_ctx;

static int fail(recipe_ctx *c, const char *msg) {
    if (!c->err[0]) snprintf(c->err, sizeof c->err, "%s", msg);
    return 0;
}

static int on_key(void *user, const char *sec, const char *key, const char *val) {
    recipe_ctx *c = user;
    fm_gpt_train_opts *o = &c->r->opts;
    fm_gpt_config *m = &o->model;
    char msg[256];
    char *end = NULL;
    errno = 0;
    double d = strtod(val, &end);
    bool looks_num = end && end != val && *end == 0; /* "many" is not a number; "inf" and "1e999" are, out of range */
    bool num = looks_num && errno == 0 && isfinite(d);
    /* whole numbers: exact in a double below 2^53, then range-checked against the field */
    long long iv = 0;
    errno = 0;
    long long li = strtoll(val, &end, 10);
    bool is_int = end && end != val && *end == 0 && errno == 0;
    if (is_int) iv = li;
    else if (num && d == floor(d) && fabs(d) < 9007199254740992.0) { is_int = true; iv = (long long)d; }
#define IS(s, k) (!strcmp(sec, s) && !strcmp(key, k))
#define INT(dst, lo, hi)                                                                                           \
    do {                                                                                                           \
        if (!is_int || iv < (long long)(lo) || iv > (long long)(hi)) {                                             \
            if (!looks_num) snprintf(msg, sizeof msg, "[%s] %s = '%s' is not a number", sec, key, val);            \
            else snprintf(msg, sizeof msg, "[%s] %s = '%s': expected a whole number in [%lld, %lld]", sec, key,    \
                          val, (long long)(lo), (long long)(hi));                                                  \
            return fail(c, msg);                                                                                   \
        }                                                                                                          \
        dst = iv;                                                                                                  \
    } while (0)
#define FLT(dst, lo, hi, what)                                                                                     \
    do {                                                                                                           \
        if (!num || !(d >= (lo) && d <= (hi))) {                                                                   \
            if (!looks_num) snprintf(msg, sizeof msg, "[%s] %s = '%s' is not a number", sec, key, val);            \
            else snprintf(msg, sizeof msg, "[%s] %s = '%s': expected %s", sec, key, val, what);                    \
            return fail(c, msg);                                                                                   \
        }                                                                                                          \
        dst = d;                                                                                                   \
    } while (0)
    if (IS("model", "type")) {
        if (strcmp(val, "gpt")) {
            snprintf(msg, sizeof msg, "[model] type = %s: not a GPT recipe (expected type = gpt)", val);
            return fail(c, msg);
        }
    } else if (IS("model", "arch")) {
        if (fm_gpt_arch_parse(val, &m->arch)) return fail(c, fm_last_error());
        if (m->arch == FM_GPT_LLAMA) m->bias = false;
    } else if (IS("model", "n_layer")) INT(m->n_layer, 1, 1 << 20);
    else if (IS("model", "n_head")) INT(m->n_head, 1, 1 << 20);
    else if (IS("model", "n_kv_head")) INT(m->n_kv_head, 0, 1 << 20);
    else if (IS("model", "n_embd")) INT(m->n_embd, 1, 1 << 24);
    else if (IS("model", "block_size")) INT(m->block_size, 1, 1 << 24);
    else if (IS("model", "ffn_hidden")) INT(m->ffn_hidden, 1, 1 << 26);
    else if (IS("model", "head_dim")) INT(m->head_dim, 0, 4096);
    else if (IS("model", "dropout")) FLT(m->dropout, 0, 0.999999, "a probability in [0, 1)");
    else if (IS("model", "bias")) {
        if (strcmp(val, "true") && strcmp(val, "false") && strcmp(val, "1") && strcmp(val, "0")) {
            snprintf(msg, sizeof msg, "[model] bias = '%s': expected true or false", val);
            return fail(c, msg);
        }
        m->bias = !strcmp(val, "true") || !strcmp(val, "1");
    }
    else if (IS("tokenizer", "kind")) {
        if (fm_tokenizer_kind_parse(val, &o->tokenizer)) return fail(c, fm_last_error());
    } else if (IS("tokenizer", "vocab_size")) INT(o->tokenizer_vocab, 1, 1 << 30);
    else if (IS("data", "corpus")) {
        char *s = strdup(val);
        if (!s) return fail(c, "out of host memory");
        free(c->r->corpus);
        o->corpus = c->r->corpus = s;
    } else if (IS("data", "val_fraction")) FLT(o->val_fraction, 1e-9, 0.999999, "a fraction in (0, 1)");
    else if (IS("train", "batch_size")) INT(o->batch_size, 1, INT_MAX);
    else if (IS("train", "steps")) INT(o->steps, 1, INT64_MAX);
    else if (IS("train", "warmup")) INT(o->warmup, 0, INT64_MAX);
    else if (IS("train", "lr")) FLT(o->lr, 0, 1e30, "a learning rate in [0, 1e30]");
    else if (IS("train", "min_lr")) FLT(o->min_lr, 0, 1e30, "a learning rate in [0, 1e30]");
    else if (IS("train", "weight_decay")) FLT(o->weight_decay, 0, 1e30, "a weight decay >= 0");
    else if (IS("train", "beta1")) FLT(o->beta1, 0, 0.999999999, "a beta in [0, 1)");
    else if (IS("train", "beta2")) FLT(o->beta2, 0, 0.999999999, "a beta in [0, 1)");
    else if (IS("train", "grad_clip")) FLT(o->grad_clip, 0, 1e30, "a norm >= 0 (0: off)");
    else if (IS("train", "eval_every")) INT(o->eval_every, 0, INT64_MAX);
    else if (IS("train", "eval_batches")) INT(o->eval_batches, 1, INT_MAX);
    else if (IS("train", "ckpt_every")) INT(o->ckpt_every, 0, INT64_MAX);
    else if (IS("train", "log_every")) INT(o->log_every, 0, INT64_MAX);
    else if (IS("train", "sample_tokens")) INT(o->sample_tokens, 0, INT_MAX);
    else if (IS("train", "seed")) INT(o->seed, 0, INT64_MAX);
    else if (IS("train", "keep_checkpoints")) INT(o->keep_checkpoints, 1, INT_MAX);
    else if (IS("train", "divergence_factor")) FLT(o->divergence_factor, 0, 1e300, "a factor >= 0 (0: off)");
    else if (!strcmp(sec, "recipe")) { /* name, description: informational */
    } else {
        snprintf(msg, sizeof msg, "unknown recipe key [%s] %s", sec, key);
        return fail(c, msg);
    }
#undef IS
#undef INT
#undef FLT
    return 1;
}

fm_status fm_gpt_recipe_load(const char *path, fm_gpt_recipe *out) {
    memset(out, 0, sizeof *out);
    out->opts = fm_gpt_train_defaults();
    recipe_ctx c;
    memset(&c, 0, sizeof c);
    c.r = out;
    fm_status st;
    const char *why;
    char *text = fm_read_text_file(path, 1 << 20, NULL, &st, &why);
    if (!text) {
        if (st == FM_ERR_IO) return fm_set_error(FM_ERR_IO, "%s: cannot read the recipe: %s", path, strerror(errno));
        if (st == FM_ERR_OOM) return fm_set_error(FM_ERR_OOM, "%s: out of host memory while reading the recipe", path);
        return fm_set_error(FM_ERR_FORMAT, "%s: not a recipe (%s)", path, why);
    }
    fm_ini_text src = {.text = text};
    int rc = ini_parse_stream(fm_ini_text_reader, &src, on_key, &c);
    free(text);
    if (rc == 0 && !src.long_line) return FM_OK;
    fm_gpt_recipe_free(out);
    if (rc == -2) return fm_set_error(FM_ERR_OOM, "%s: out of host memory while reading the recipe", path);
    if (rc <= 0)
        return fm_set_error(FM_ERR_FORMAT, "%s: line %d: the line is longer than %d characters (the most a recipe line "
                            "may have): shorten it or move its comment to a line of its own", path, src.long_line,
                            src.max_len);
    return fm_set_error(FM_ERR_INVALID, "%s: line %d: %s", path, rc, c.err[0] ? c.err : "syntax error");
}

void fm_gpt_recipe_free(fm_gpt_recipe *r) {
    if (!r) return;
    free(r->corpus);
    r->corpus = NULL;
    r->opts.corpus = fm_gpt_train_defaults().corpus;
}

static int type_key(void *user, const char *sec, const char *key, const char *val) {
    if (!strcmp(sec, "model") && !strcmp(key, "type") && !strcmp(val, "gpt")) *(bool *)user = true;
    return 1;
}

bool fm_gpt_recipe_is_gpt(const char *path) {
    bool gpt = false;
    if (path) ini_parse(path, type_key, &gpt); /* an unreadable or malformed file is the loader's to report */
    return gpt;
}
