/* GPT recipes: the .ini files with [model] type = gpt that `fathom train` and
 * `fathom summary` read. One parser, so that every command takes the same keys,
 * fills in the trainer's defaults for the ones a recipe leaves out, and rejects
 * an unknown key or a malformed value with the same "file: line N: what" error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "fathom/gpt.h"

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
    double d = strtod(val, &end);
    bool num = end && end != val && *end == 0;
#define IS(s, k) (!strcmp(sec, s) && !strcmp(key, k))
#define NUM(dst)                                                                        \
    do {                                                                                \
        if (!num) {                                                                     \
            snprintf(msg, sizeof msg, "[%s] %s = '%s' is not a number", sec, key, val); \
            return fail(c, msg);                                                        \
        }                                                                               \
        dst = d;                                                                        \
    } while (0)
    if (IS("model", "type")) {
        if (strcmp(val, "gpt")) {
            snprintf(msg, sizeof msg, "[model] type = %s: not a GPT recipe (expected type = gpt)", val);
            return fail(c, msg);
        }
    } else if (IS("model", "arch")) {
        if (fm_gpt_arch_parse(val, &m->arch)) return fail(c, fm_last_error());
        if (m->arch == FM_GPT_LLAMA) m->bias = false;
    } else if (IS("model", "n_layer")) NUM(m->n_layer);
    else if (IS("model", "n_head")) NUM(m->n_head);
    else if (IS("model", "n_kv_head")) NUM(m->n_kv_head);
    else if (IS("model", "n_embd")) NUM(m->n_embd);
    else if (IS("model", "block_size")) NUM(m->block_size);
    else if (IS("model", "ffn_hidden")) NUM(m->ffn_hidden);
    else if (IS("model", "dropout")) NUM(m->dropout);
    else if (IS("model", "bias")) m->bias = !strcmp(val, "true") || !strcmp(val, "1");
    else if (IS("tokenizer", "kind")) {
        if (fm_tokenizer_kind_parse(val, &o->tokenizer)) return fail(c, fm_last_error());
    } else if (IS("tokenizer", "vocab_size")) NUM(o->tokenizer_vocab);
    else if (IS("data", "corpus")) {
        char *s = strdup(val);
        if (!s) return fail(c, "out of host memory");
        free(c->r->corpus);
        o->corpus = c->r->corpus = s;
    } else if (IS("data", "val_fraction")) NUM(o->val_fraction);
    else if (IS("train", "batch_size")) NUM(o->batch_size);
    else if (IS("train", "steps")) NUM(o->steps);
    else if (IS("train", "warmup")) NUM(o->warmup);
    else if (IS("train", "lr")) NUM(o->lr);
    else if (IS("train", "min_lr")) NUM(o->min_lr);
    else if (IS("train", "weight_decay")) NUM(o->weight_decay);
    else if (IS("train", "beta1")) NUM(o->beta1);
    else if (IS("train", "beta2")) NUM(o->beta2);
    else if (IS("train", "grad_clip")) NUM(o->grad_clip);
    else if (IS("train", "eval_every")) NUM(o->eval_every);
    else if (IS("train", "eval_batches")) NUM(o->eval_batches);
    else if (IS("train", "ckpt_every")) NUM(o->ckpt_every);
    else if (IS("train", "log_every")) NUM(o->log_every);
    else if (IS("train", "sample_tokens")) NUM(o->sample_tokens);
    else if (IS("train", "seed")) NUM(o->seed);
    else if (!strcmp(sec, "recipe")) { /* name, description: informational */
    } else {
        snprintf(msg, sizeof msg, "unknown recipe key [%s] %s", sec, key);
        return fail(c, msg);
    }
#undef IS
#undef NUM
    return 1;
}

fm_status fm_gpt_recipe_load(const char *path, fm_gpt_recipe *out) {
    memset(out, 0, sizeof *out);
    out->opts = fm_gpt_train_defaults();
    recipe_ctx c;
    memset(&c, 0, sizeof c);
    c.r = out;
    int rc = ini_parse(path, on_key, &c);
    if (rc == 0) return FM_OK;
    fm_gpt_recipe_free(out);
    if (rc == -1) return fm_set_error(FM_ERR_IO, "%s: cannot read the recipe", path);
    if (rc == -2) return fm_set_error(FM_ERR_OOM, "%s: out of host memory while reading the recipe", path);
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
