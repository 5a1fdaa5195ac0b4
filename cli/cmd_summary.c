/* `fathom summary RECIPE|MODEL_DIR [--batch N] [--seq N]`: the layer table of a
 * model (torchinfo's view). Thin: the model comes from the recipe (or a trained
 * model directory), the table from fm_model_summarize / fm_gpt_summarize
 * (src/observe/). Layer recipes and `fathom train --out` directories of them go
 * through the module path; GPT recipes ([model] type = gpt) and the directories
 * the GPT trainer writes (config.json + model.safetensors) through the GPT one. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"       /* fm_cli_error, fm_cli_parse_int */
#include "fathom/gpt.h"     /* fm_gpt_new, fm_gpt_load_dir, fm_gpt_recipe_load */
#include "fathom/observe.h" /* fm_model_summarize, fm_gpt_summarize */
#include "fathom/recipe.h"  /* fm_recipe_load, fm_recipe_resolve, fm_model_load */

static void usage(FILE *f) {
    fputs("usage: fathom summary RECIPE|MODEL_DIR [--batch N] [--seq N] [--json]\n"
          "\n"
          "A table of the model's layers: output shapes, parameters (trainable and frozen),\n"
          "forward FLOPs and activation memory per layer, with totals.\n"
          "\n"
          "  RECIPE        a built-in recipe name (fashion-cnn, kjv-gpt) or a recipe .ini file\n"
          "  MODEL_DIR     a directory written by `fathom train --out DIR`\n"
          "  --batch N     batch size of the input (default: the recipe's; 1 for a GPT model directory)\n"
          "  --seq N       GPT models: sequence length (default: the model's block_size)\n"
          "  --json        the same as one JSON object\n",
          f);
}

static int summarize_gpt(fm_gpt *m, const char *title, long long batch, long long seq, bool json) {
    fm_model_summary s;
    if (fm_gpt_summarize(m, batch, seq ? seq : fm_gpt_get_config(m)->block_size, &s) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        return 1;
    }
    int rc = 0;
    if (json) {
        char *t = fm_model_summary_json(&s);
        if (t) puts(t);
        else { fm_cli_error("out of memory"); rc = 1; }
        free(t);
    } else {
        const fm_gpt_config *c = fm_gpt_get_config(m);
        printf("model: %s\n", title);
        printf("%s, %d layers, %d heads, %d wide, block %d, vocab %d; activations at batch %lld, sequence %lld\n",
               fm_gpt_arch_name(c->arch), c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size,
               (long long)s.in_shape[0], (long long)s.in_shape[1]);
        fm_model_summary_print(&s, stdout);
    }
    fm_model_summary_free(&s);
    return rc;
}

static int gpt_from_dir(const char *dir, long long batch, long long seq, bool json) {
    fm_gpt *m = fm_gpt_load_dir(dir, NULL);
    if (!m) { fm_cli_error("%s", fm_last_error()); return 1; }
    char title[PATH_MAX + 32];
    snprintf(title, sizeof title, "%s (trained GPT model)", dir);
    int rc = summarize_gpt(m, title, batch ? batch : 1, seq, json);
    fm_gpt_free(m);
    return rc;
}

static int gpt_from_recipe(const char *path, long long batch, long long seq, bool json) {
    fm_gpt_recipe r; /* the trainer's own parser and defaults (src/gpt/gpt_recipe.c) */
    if (fm_gpt_recipe_load(path, &r) != FM_OK) { fm_cli_error("%s", fm_last_error()); return 1; }
    fm_gpt_config cfg = r.opts.model;
    fm_tokenizer_kind tok = r.opts.tokenizer;
    int vocab = r.opts.tokenizer_vocab, rbatch = r.opts.batch_size;
    fm_gpt_recipe_free(&r);
    /* the vocabulary is the tokenizer's: known up front for byte and bpe (a corpus too
     * small for all the merges gives fewer), only after training for char */
    if (tok == FM_TOK_CHAR) {
        fm_cli_error("%s: a char tokenizer's vocabulary depends on the corpus; train the model and summarize its "
                     "directory (fathom summary runs/<name>)", path);
        return 1;
    }
    cfg.vocab_size = tok == FM_TOK_BYTE ? 256 : vocab;
    fm_rng rng;
    fm_rng_init(&rng, 0);
    fm_gpt *m = fm_gpt_new(&cfg, &rng);
    if (!m) { fm_cli_error("%s: %s", path, fm_last_error()); return 1; }
    char title[PATH_MAX + 32];
    snprintf(title, sizeof title, "%s (GPT recipe)", path);
    int rc = summarize_gpt(m, title, batch ? batch : (rbatch > 0 ? rbatch : 1), seq, json);
    fm_gpt_free(m);
    return rc;
}

static bool file_exists(const char *dir, const char *name) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

int fm_cmd_summary(int argc, char **argv) {
    const char *src = NULL;
    long long batch = 0, seq = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--batch") || !strcmp(a, "--seq")) {
            if (i + 1 >= argc) { fm_cli_error("%s needs a value", a); usage(stderr); return 2; }
            long long *dst = !strcmp(a, "--batch") ? &batch : &seq;
            if (!fm_cli_parse_int("summary", a, argv[++i], 1, dst)) { usage(stderr); return 2; }
            if (*dst > (1LL << 40)) { fm_cli_error("summary: %s %s is too large", a, argv[i]); return 2; }
            continue;
        }
        if (a[0] == '-' && a[1]) {
            static const char *const flags[] = {"--help", "--json", "--batch", "--seq"};
            fm_cli_unknown_option("summary", a, flags, 4);
            usage(stderr);
            return 2;
        }
        if (src) { fm_cli_error("one recipe or model at a time (got '%s' and '%s')", src, a); return 2; }
        src = a;
    }
    if (!src) { fm_cli_error("no recipe or model directory given"); usage(stderr); return 2; }

    struct stat sb;
    bool is_dir = stat(src, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (is_dir && file_exists(src, "config.json")) return gpt_from_dir(src, batch, seq, json);
    if (!is_dir) {
        char path[PATH_MAX];
        fm_recipe_resolve(src, path, sizeof path);
        if (fm_gpt_recipe_is_gpt(path)) return gpt_from_recipe(path, batch, seq, json);
    }
    if (seq) { fm_cli_error("--seq applies to GPT models only"); return 2; }

    fm_recipe r;
    fm_module *m = NULL;
    if (is_dir) {
        if (fm_model_load(src, &r, &m) != FM_OK) { fm_cli_error("%s", fm_last_error()); return 1; }
    } else {
        if (fm_recipe_load(src, &r) != FM_OK) { fm_cli_error("%s", fm_last_error()); return 1; }
        fm_rng rng;
        fm_rng_init(&rng, r.seed);
        m = fm_recipe_build_model(&r, &rng);
        if (!m) { fm_cli_error("%s", fm_last_error()); fm_recipe_free(&r); return 1; }
    }
    int64_t shape[FM_MAX_DIMS];
    shape[0] = batch ? batch : (r.batch_size > 0 ? r.batch_size : 1);
    for (int i = 0; i < r.input_ndim; i++) shape[1 + i] = r.input_shape[i];
    fm_model_summary s;
    int rc = 0;
    if (fm_model_summarize(m, 1 + r.input_ndim, shape, &s) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        rc = 1;
    } else {
        if (json) {
            char *t = fm_model_summary_json(&s);
            if (t) puts(t);
            else { fm_cli_error("out of memory"); rc = 1; }
            free(t);
        } else {
            printf("model: %s (%s)\n", r.name[0] ? r.name : src, is_dir ? "trained model" : r.path);
            fm_model_summary_print(&s, stdout);
        }
        fm_model_summary_free(&s);
    }
    fm_module_free(m);
    fm_recipe_free(&r);
    return rc;
}
