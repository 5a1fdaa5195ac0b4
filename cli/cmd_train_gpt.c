/* `fathom train <gpt recipe>`: reads a transformer recipe (an .ini with
 * [model] type = gpt) and hands it to fm_gpt_train. Thin: parsing only.
 *
 *   fathom train kjv-gpt [--out DIR] [--steps N] [--resume] [--corpus FILE]
 *                        [--stop-after N] [--sample N] [--seed S] [--batch N] [--json] [--quiet]
 *                        [--precision P] [--checkpointing C] [--grad-accum N]
 *                        [--memory-limit SIZE] [--memory-mode grow|preallocate] [--memory-preallocate X]
 *                        [--profile FILE] [--logdir DIR] [--hist-every N]
 * The efficiency flags are parsed with the library's own parsers into one
 * fm_efficiency_opts and checked by fm_efficiency_validate (fathom/efficiency.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "commands.h"
#include "fathom/gpt.h"
#include "fathom/recipe.h" /* fm_recipe_resolve: one rule for where recipes live */

int fm_cmd_train_gpt(int argc, char **argv);

/* A recipe name resolves to data/recipes/<name>.ini next to the working
 * directory, the executable's source tree, or FATHOM_DATA_DIR. */
static void usage(FILE *f) {
    fprintf(f, "usage: fathom train RECIPE [--out DIR] [--steps N] [--resume] [--corpus FILE] [--stop-after N]\n"
               "                          [--sample N] [--seed S] [--batch N] [--json] [--quiet]\n"
               "                          [--precision fp32|bf16|fp16] [--checkpointing none|blocks|selective]\n"
               "                          [--grad-accum N] [--memory-limit SIZE] [--memory-mode grow|preallocate]\n"
               "                          [--memory-preallocate SIZE|FRACTION] [--profile FILE] [--logdir DIR]\n"
               "                          [--hist-every N]\n"
               "  RECIPE: a GPT recipe name (kjv-gpt) or an .ini path with [model] type = gpt\n"
               "  --batch N            override the recipe's batch_size (windows per optimizer step)\n"
               "  --precision P        autocast matmuls/attention to bf16 or fp16 (fp16 adds dynamic loss scaling);\n"
               "                       master weights and the optimizer stay fp32 (default fp32)\n"
               "  --checkpointing C    recompute activations in backward: blocks (whole transformer blocks) or\n"
               "                       selective (norms, GELU, head merge; never a matmul) (default none)\n"
               "  --grad-accum N       split each batch into N micro-batches, one optimizer step (N divides the batch)\n"
               "  --memory-limit SIZE  fail allocations past SIZE (2G, 512M; also FATHOM_MEMORY_LIMIT)\n"
               "  --memory-mode M      grow (default) or preallocate (reserve an arena up front)\n"
               "  --memory-preallocate X  with preallocate: a size (1G) or a fraction of the limit (0.5)\n"
               "  --json               stdout gets one JSON object with the results and the memory report\n"
               "  --quiet              no progress output (otherwise a redrawn line on a terminal, plain lines elsewhere)\n"
               "  --profile FILE       write a Chrome trace (open in ui.perfetto.dev, or: fathom profile FILE)\n"
               "  --logdir DIR         write TensorBoard event files (or: fathom plot DIR -o curves.svg)\n"
               "  --hist-every N       with --logdir: weight and gradient histograms every N steps\n");
}

/* the efficiency flags, each through the library's parser; 0 ok, 2 usage error */
static int efficiency_flag(const char *a, const char *v, fm_efficiency_opts *eo) {
    if (!strcmp(a, "--precision")) {
        if (fm_precision_parse(v, &eo->precision)) { fm_cli_error("train: --precision %s: expected fp32, bf16 or fp16", v); return 2; }
        eo->loss_scaling = eo->precision == FM_F16;
    } else if (!strcmp(a, "--checkpointing")) {
        if (fm_checkpointing_parse(v, &eo->checkpointing)) { fm_cli_error("train: --checkpointing: %s", fm_last_error()); return 2; }
    } else if (!strcmp(a, "--grad-accum")) {
        long long n;
        if (!fm_cli_parse_int("train", a, v, 1, &n)) return 2;
        if (n > 1 << 20) { fm_cli_error("train: --grad-accum %lld is too large", n); return 2; }
        eo->grad_accum = (int)n;
    } else if (!strcmp(a, "--memory-limit")) {
        if (fm_parse_size(v, &eo->memory_limit) || eo->memory_limit == 0) {
            fm_cli_error("train: --memory-limit needs a size such as 2G or 512M, got '%s'", v);
            return 2;
        }
    } else if (!strcmp(a, "--memory-mode")) {
        if (fm_memory_mode_parse(v, &eo->memory_mode)) { fm_cli_error("train: --memory-mode: %s", fm_last_error()); return 2; }
    } else if (!strcmp(a, "--memory-preallocate")) {
        char *end = NULL;
        double f = strtod(v, &end);
        if (end != v && *end == 0) { /* a bare number is a fraction; sizes carry a unit */
            if (!(f > 0 && f <= 1)) {
                fm_cli_error("train: --memory-preallocate %s: a fraction must be in (0, 1]; give a size with a unit (1G, 512M)", v);
                return 2;
            }
            eo->prealloc_fraction = f;
        } else if (fm_parse_size(v, &eo->prealloc_bytes) || eo->prealloc_bytes == 0) {
            fm_cli_error("train: --memory-preallocate needs a size (1G) or a fraction in (0, 1], got '%s'", v);
            return 2;
        }
    } else {
        return 1;
    }
    return 0;
}

int fm_cmd_train_gpt(int argc, char **argv) {
    const char *recipe = NULL, *out = NULL, *corpus = NULL, *profile = NULL, *logdir = NULL;
    long long steps = -1, stop_after = -1, sample = -1, seed = -1, batch = -1, hist_every = 0;
    bool resume = false, json = false, quiet = false;
    fm_efficiency_opts eo = fm_efficiency_defaults();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (a[0] == '-' && has) {
            int e = efficiency_flag(a, argv[i + 1], &eo);
            if (e == 2) { usage(stderr); return 2; }
            if (e == 0) { i++; continue; }
        }
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--quiet")) quiet = true;
        else if (!strcmp(a, "--batch") && has) { if (!fm_cli_parse_int_range("train", a, argv[++i], 1, INT_MAX, &batch)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--out") && has) out = argv[++i];
        else if (!strcmp(a, "--steps") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 1, &steps)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--stop-after") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 1, &stop_after)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--sample") && has) { if (!fm_cli_parse_int_range("train", a, argv[++i], 0, INT_MAX, &sample)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--seed") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 0, &seed)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--corpus") && has) corpus = argv[++i];
        else if (!strcmp(a, "--profile") && has) profile = argv[++i];
        else if (!strcmp(a, "--logdir") && has) logdir = argv[++i];
        else if (!strcmp(a, "--hist-every") && has) { if (!fm_cli_parse_int("train", a, argv[++i], 1, &hist_every)) { usage(stderr); return 2; } }
        else if (!strcmp(a, "--resume")) resume = true;
        else if (a[0] != '-' && !recipe) recipe = a;
        else { fm_cli_error("unknown or incomplete option '%s'", a); usage(stderr); return 2; }
    }
    if (!recipe) { usage(stderr); return 2; }
    if (hist_every > 0 && !logdir) { fm_cli_error("train: --hist-every writes to the TensorBoard logs: give --logdir DIR too"); usage(stderr); return 2; }
    /* bad flag combinations are usage errors, reported before the recipe or corpus is read */
    if (fm_efficiency_validate(&eo, true, batch > 0 ? (int)batch : 0)) {
        fm_cli_error("train: %s", fm_last_error());
        usage(stderr);
        return 2;
    }
    char path[PATH_MAX];
    bool builtin = fm_recipe_resolve(recipe, path, sizeof path);
    if (access(path, R_OK) != 0) {
        if (builtin) fm_cli_error("no built-in recipe named '%s' (looked for %s; `fathom recipes` lists them)", recipe, path);
        else fm_cli_error("cannot open recipe %s: %s", path, strerror(errno));
        return 2;
    }
    fm_gpt_recipe rec; /* src/gpt/gpt_recipe.c: the parser `fathom summary` uses too */
    if (fm_gpt_recipe_load(path, &rec)) {
        fm_cli_error("%s", fm_last_error());
        return 2;
    }
    fm_gpt_train_opts o = rec.opts;
    char def_out[PATH_MAX];
    const char *base = strrchr(recipe, '/') ? strrchr(recipe, '/') + 1 : recipe;
    snprintf(def_out, sizeof def_out, "runs/%.*s", (int)(strstr(base, ".ini") ? strstr(base, ".ini") - base : (long)strlen(base)), base);
    o.out_dir = out ? out : def_out;
    if (corpus) o.corpus = corpus;
    if (steps > 0) o.steps = steps;
    if (stop_after > 0) o.stop_after = stop_after;
    if (sample >= 0) o.sample_tokens = (int)sample;
    if (seed >= 0) o.seed = (uint64_t)seed;
    if (batch > 0) o.batch_size = (int)batch;
    o.resume = resume;
    o.quiet = quiet;
    o.eff = eo;
    o.profile_path = profile;
    o.logdir = logdir;
    o.hist_every = hist_every;
    /* the recipe's batch size is known only now */
    if (fm_efficiency_validate(&eo, true, o.batch_size)) {
        fm_cli_error("train: %s (%d is the recipe's batch_size; set another with --batch)", fm_last_error(), o.batch_size);
        fm_gpt_recipe_free(&rec);
        return 2;
    }
    fm_gpt_train_result r;
    fm_status st = fm_gpt_train_ex(&o, &r);
    fm_gpt_recipe_free(&rec);
    if (st) {
        fm_cli_error("%s", fm_last_error());
        return 1;
    }
    if (!json && !quiet) {
        fprintf(stderr, "done: %lld steps, %.1f s, %.0f tokens/s", (long long)r.steps, r.train_seconds, r.tokens_per_second);
        if (eo.loss_scaling) fprintf(stderr, ", loss scale %g, %lld steps skipped", r.loss_scale, (long long)r.skipped_steps);
        fprintf(stderr, "\n%s\n", r.memory_report_text);
        if (profile) fprintf(stderr, "trace: %s (open in ui.perfetto.dev, or: fathom profile %s)\n", profile, profile);
        if (logdir) fprintf(stderr, "logs: %s (TensorBoard event files; or: fathom plot %s -o curves.svg)\n", logdir, logdir);
    }
    /* stdout: one JSON object (the fields before "precision" are the format scripts already read) */
    json_t *j = json_object();
    json_object_set_new(j, "recipe", json_string(recipe));
    json_object_set_new(j, "out", json_string(o.out_dir));
    json_object_set_new(j, "train_loss", isfinite(r.train_loss) ? json_real(r.train_loss) : json_null());
    json_object_set_new(j, "val_loss", isfinite(r.val_loss) ? json_real(r.val_loss) : json_null());
    json_object_set_new(j, "precision", json_string(fm_precision_name(eo.precision)));
    json_object_set_new(j, "checkpointing", json_string(fm_checkpointing_name(eo.checkpointing)));
    json_object_set_new(j, "grad_accum", json_integer(eo.grad_accum));
    json_object_set_new(j, "batch", json_integer(o.batch_size));
    json_object_set_new(j, "steps", json_integer(r.steps));
    json_object_set_new(j, "train_seconds", json_real(r.train_seconds));
    json_object_set_new(j, "tokens_per_second", json_real(r.tokens_per_second));
    json_object_set_new(j, "data_wait_seconds", json_real(r.data_seconds));
    json_object_set_new(j, "loss_scale", json_real(r.loss_scale));
    json_object_set_new(j, "skipped_steps", json_integer(r.skipped_steps));
    json_object_set_new(j, "peak_memory_bytes", json_integer((json_int_t)r.peak_memory_bytes));
    json_t *mem = r.memory_report_json[0] ? json_loads(r.memory_report_json, 0, NULL) : NULL;
    if (mem) json_object_set_new(j, "memory", mem);
    char *js = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (js) printf("%s\n", js);
    free(js);
    json_decref(j);
    return 0;
}
