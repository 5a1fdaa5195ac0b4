/* `fathom train <gpt recipe>`: reads a transformer recipe (an .ini with
 * [model] type = gpt) and hands it to fm_gpt_train. Thin: parsing only.
 *
 *   fathom train kjv-gpt [--out DIR] [--steps N] [--resume] [--corpus FILE]
 *                        [--stop-after N] [--sample N] [--seed S] */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ini.h>

#include "commands.h"
#include "fathom/gpt.h"
#include "fathom/recipe.h" /* fm_recipe_resolve: one rule for where recipes live */

int fm_cmd_train_gpt(int argc, char **argv);

typedef struct {
    fm_gpt_train_opts *o;
    char err[256];
    char *strings[4];
    int n_strings;
} recipe_ctx;

static int on_key(void *user, const char *sec, const char *key, const char *val) {
    recipe_ctx *c = user;
    fm_gpt_train_opts *o = c->o;
    fm_gpt_config *m = &o->model;
    char *end = NULL;
    double d = strtod(val, &end);
    bool num = end && end != val && *end == 0;
#define IS(s, k) (!strcmp(sec, s) && !strcmp(key, k))
#define NUM(dst)                                                                          \
    do {                                                                                  \
        if (!num) { snprintf(c->err, sizeof c->err, "[%s] %s = '%s' is not a number", sec, key, val); return 0; } \
        dst = d;                                                                          \
    } while (0)
    if (IS("model", "type")) {
        if (strcmp(val, "gpt")) { snprintf(c->err, sizeof c->err, "[model] type = %s: this command trains gpt recipes", val); return 0; }
    } else if (IS("model", "arch")) {
        if (fm_gpt_arch_parse(val, &m->arch)) { snprintf(c->err, sizeof c->err, "%s", fm_last_error()); return 0; }
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
        if (fm_tokenizer_kind_parse(val, &o->tokenizer)) { snprintf(c->err, sizeof c->err, "%s", fm_last_error()); return 0; }
    } else if (IS("tokenizer", "vocab_size")) NUM(o->tokenizer_vocab);
    else if (IS("data", "corpus")) {
        if (c->n_strings >= 4) return 0;
        o->corpus = c->strings[c->n_strings++] = strdup(val);
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
        snprintf(c->err, sizeof c->err, "unknown recipe key [%s] %s", sec, key);
        return 0;
    }
#undef IS
#undef NUM
    return 1;
}

/* A recipe name resolves to data/recipes/<name>.ini next to the working
 * directory, the executable's source tree, or FATHOM_DATA_DIR. */
static void usage(FILE *f) {
    fprintf(f, "usage: fathom train RECIPE [--out DIR] [--steps N] [--resume] [--corpus FILE] [--stop-after N]\n"
               "                          [--sample N] [--seed S]\n"
               "  RECIPE: a GPT recipe name (kjv-gpt) or an .ini path with [model] type = gpt\n");
}

int fm_cmd_train_gpt(int argc, char **argv) {
    const char *recipe = NULL, *out = NULL, *corpus = NULL;
    long long steps = -1, stop_after = -1, sample = -1, seed = -1;
    bool resume = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--out") && has) out = argv[++i];
        else if (!strcmp(a, "--steps") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 1, &steps)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--stop-after") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 1, &stop_after)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--sample") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 0, &sample)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--seed") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 0, &seed)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--corpus") && has) corpus = argv[++i];
        else if (!strcmp(a, "--resume")) resume = true;
        else if (a[0] != '-' && !recipe) recipe = a;
        else { fm_cli_error("unknown or incomplete option '%s'", a); usage(stderr); return 2; }
    }
    if (!recipe) { usage(stderr); return 2; }
    char path[PATH_MAX];
    bool builtin = fm_recipe_resolve(recipe, path, sizeof path);
    if (access(path, R_OK) != 0) {
        if (builtin) fm_cli_error("no built-in recipe named '%s' (looked for %s; `fathom recipes` lists them)", recipe, path);
        else fm_cli_error("cannot open recipe %s: %s", path, strerror(errno));
        return 2;
    }
    fm_gpt_train_opts o = fm_gpt_train_defaults();
    recipe_ctx c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    int rc = ini_parse(path, on_key, &c);
    if (rc != 0) {
        if (rc < 0) fm_cli_error("%s: cannot read the recipe", path);
        else fm_cli_error("%s: line %d: %s", path, rc, c.err[0] ? c.err : "syntax error");
        for (int i = 0; i < c.n_strings; i++) free(c.strings[i]);
        return 2;
    }
    char def_out[PATH_MAX];
    const char *base = strrchr(recipe, '/') ? strrchr(recipe, '/') + 1 : recipe;
    snprintf(def_out, sizeof def_out, "runs/%.*s", (int)(strstr(base, ".ini") ? strstr(base, ".ini") - base : (long)strlen(base)), base);
    o.out_dir = out ? out : def_out;
    if (corpus) o.corpus = corpus;
    if (steps > 0) o.steps = steps;
    if (stop_after > 0) o.stop_after = stop_after;
    if (sample >= 0) o.sample_tokens = (int)sample;
    if (seed >= 0) o.seed = (uint64_t)seed;
    o.resume = resume;
    double tl = 0, vl = 0;
    fm_status st = fm_gpt_train(&o, &tl, &vl);
    for (int i = 0; i < c.n_strings; i++) free(c.strings[i]);
    if (st) {
        fm_cli_error("%s", fm_last_error());
        return 1;
    }
    printf("{\"recipe\":\"%s\",\"out\":\"%s\",\"train_loss\":%.6f,\"val_loss\":%.6f}\n", recipe, o.out_dir, tl, vl);
    return 0;
}
