/* `fathom summary RECIPE|MODEL_DIR [--batch N]`: the layer table of a model
 * (torchinfo's view). Thin: the model comes from the recipe (or a trained
 * model directory), the table from fm_model_summarize (src/observe/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"       /* fm_cli_error */
#include "fathom/observe.h" /* fm_model_summarize */
#include "fathom/recipe.h"  /* fm_recipe_load, fm_recipe_build_model, fm_model_load */

static void usage(FILE *f) {
    fputs("usage: fathom summary RECIPE|MODEL_DIR [--batch N] [--json]\n"
          "\n"
          "A table of the model's layers: output shapes, parameters (trainable and frozen),\n"
          "forward FLOPs and activation memory per layer, with totals.\n"
          "\n"
          "  RECIPE        a built-in recipe name (fashion-cnn) or a recipe .ini file\n"
          "  MODEL_DIR     a directory written by `fathom train --out DIR`\n"
          "  --batch N     batch size of the input (default: the recipe's)\n"
          "  --json        the same as one JSON object\n",
          f);
}

int fm_cmd_summary(int argc, char **argv) {
    const char *src = NULL;
    long long batch = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--batch")) {
            if (i + 1 >= argc) { fm_cli_error("--batch needs a value"); usage(stderr); return 2; }
            char *end;
            batch = strtoll(argv[++i], &end, 10);
            if (*end || batch < 1 || batch > (1LL << 40)) { fm_cli_error("--batch: bad value '%s' (a whole number >= 1)", argv[i]); return 2; }
            continue;
        }
        if (a[0] == '-' && a[1]) { fm_cli_error("unknown option '%s'", a); usage(stderr); return 2; }
        if (src) { fm_cli_error("one recipe or model at a time (got '%s' and '%s')", src, a); return 2; }
        src = a;
    }
    if (!src) { fm_cli_error("no recipe or model directory given"); usage(stderr); return 2; }

    fm_recipe r;
    fm_module *m = NULL;
    struct stat sb;
    bool is_dir = stat(src, &sb) == 0 && S_ISDIR(sb.st_mode);
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
