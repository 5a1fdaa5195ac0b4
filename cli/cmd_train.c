/* `fathom train RECIPE`: parse options, run the library's trainer, report.
 * Human-readable progress by default; with --json the progress goes to stderr
 * and stdout gets exactly one JSON object at the end. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "commands.h"
#include "fathom/recipe.h"

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: fathom train RECIPE [--epochs N] [--batch N] [--lr X] [--seed N] [--threads N]\n"
            "                    [--out DIR] [--resume DIR] [--max-steps N] [--no-eval] [--json]\n"
            "                    [--profile FILE] [--logdir DIR] [--hist-every N] [--quiet]\n\n"
            "Trains the model a recipe describes and evaluates it on the test set.\n"
            "RECIPE is a built-in name (see `fathom recipes`) or a path to an .ini file.\n\n"
            "  --epochs N     override the recipe's epochs\n"
            "  --batch N      override the batch size\n"
            "  --lr X         override the learning rate\n"
            "  --seed N       override the seed (weights, shuffling, dropout)\n"
            "  --threads N    compute threads (default: all cores)\n"
            "  --out DIR      where to save the model (default: runs/<recipe>; with --resume: DIR of --resume)\n"
            "  --resume DIR   continue a run from its newest complete checkpoint (DIR/ckpt/step-N), bit for bit\n"
            "  --max-steps N  stop after N optimizer steps in total (a checkpoint is saved)\n"
            "  --no-eval      skip the test-set evaluation\n"
            "  --json         print one JSON object with the results on stdout\n"
            "  --profile FILE write a Chrome trace (open in ui.perfetto.dev, or: fathom profile FILE)\n"
            "  --logdir DIR   write TensorBoard event files (or: fathom plot DIR -o curves.svg)\n"
            "  --hist-every N weight and gradient histograms every N epochs in the TensorBoard logs\n"
            "  --quiet        no progress output\n"
            "Transformer recipes ([model] type = gpt, e.g. kjv-gpt) take their own options:\n"
            "  fathom train kjv-gpt --help\n");
}

/* "--opt VALUE" or "--opt=VALUE"; returns the value or NULL (and advances *i). */
static const char *opt_value(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] || *i + 1 >= argc) return NULL;
    return argv[++*i];
}

static int parse_num(const char *opt, const char *v, double lo, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || !(x >= lo) || !isfinite(x)) {
        fm_cli_error("train: %s needs a finite number >= %g, got '%s'", opt, lo, v ? v : "nothing");
        return 0;
    }
    *out = x;
    return 1;
}

static int gpt_key(void *user, const char *section, const char *key, const char *value) {
    if (!strcmp(section, "model") && !strcmp(key, "type") && !strcmp(value, "gpt")) *(bool *)user = true;
    return 1;
}

/* Is the recipe named on the command line a transformer recipe ([model] type = gpt)?
 * Those go to the GPT trainer (cli/cmd_train_gpt.c), which takes its own options. */
static bool is_gpt_recipe(int argc, char **argv) {
    static const char *valued[] = {"--epochs", "--batch", "--lr", "--seed", "--threads", "--out", "--resume",
                                   "--max-steps", "--profile", "--logdir", "--hist-every", "--steps", "--corpus",
                                   "--stop-after", "--sample", "--precision", "--checkpointing", "--grad-accum",
                                   "--memory-limit", "--memory-mode", "--memory-preallocate", NULL};
    const char *name = NULL;
    for (int i = 1; i < argc && !name; i++) {
        if (argv[i][0] != '-') { name = argv[i]; break; }
        if (strchr(argv[i], '=')) continue;
        for (int k = 0; valued[k]; k++)
            if (!strcmp(argv[i], valued[k])) { i++; break; }
    }
    if (!name) return false;
    char path[PATH_MAX];
    fm_recipe_resolve(name, path, sizeof path);
    bool gpt = false; /* a missing or unreadable recipe is reported properly by the recipe loader */
    ini_parse(path, gpt_key, &gpt);
    return gpt;
}

int fm_cmd_train(int argc, char **argv) {
    if (fm_cmd_train_gpt && is_gpt_recipe(argc, argv)) return fm_cmd_train_gpt(argc, argv);
    fm_train_options o;
    fm_train_options_init(&o);
    const char *recipe = NULL, *out = NULL;
    bool json = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        double x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { train_usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--no-eval")) { o.skip_eval = true; continue; }
        if (!strcmp(a, "--quiet")) { quiet = true; continue; }
        if (!strncmp(a, "--profile", 9) && (a[9] == 0 || a[9] == '=')) {
            if (!(o.profile_path = opt_value(argc, argv, &i, "--profile"))) { fm_cli_error("train: --profile needs a file name"); train_usage(stderr); return 2; }
            continue;
        }
        if (!strncmp(a, "--logdir", 8) && (a[8] == 0 || a[8] == '=')) {
            if (!(o.logdir = opt_value(argc, argv, &i, "--logdir"))) { fm_cli_error("train: --logdir needs a directory"); train_usage(stderr); return 2; }
            continue;
        }
#define NUM_OPT(name, lo, field, type) \
        if (!strncmp(a, name, strlen(name)) && (a[strlen(name)] == 0 || a[strlen(name)] == '=')) { \
            v = opt_value(argc, argv, &i, name); \
            if (!parse_num(name, v, lo, &x)) { train_usage(stderr); return 2; } \
            o.field = (type)x; continue; }
/* whole numbers, within the range of the field they are stored in */
#define INT_OPT(name, lo, hi, field, type) \
        if (!strncmp(a, name, strlen(name)) && (a[strlen(name)] == 0 || a[strlen(name)] == '=')) { \
            long long n_; \
            v = opt_value(argc, argv, &i, name); \
            if (!fm_cli_parse_int_range("train", name, v, lo, hi, &n_)) { train_usage(stderr); return 2; } \
            o.field = (type)n_; continue; }
        INT_OPT("--epochs", 1, INT_MAX, epochs, int)
        INT_OPT("--batch", 1, INT64_MAX, batch_size, int64_t)
        NUM_OPT("--lr", 1e-300, lr, double)
        INT_OPT("--seed", 0, INT64_MAX, seed, int64_t)
        INT_OPT("--threads", 1, 256, threads, int)
        INT_OPT("--max-steps", 1, INT64_MAX, max_steps, int64_t)
        INT_OPT("--hist-every", 1, INT_MAX, hist_every, int)
#undef INT_OPT
#undef NUM_OPT
        if (!strncmp(a, "--out", 5) && (a[5] == 0 || a[5] == '=')) {
            if (!(out = opt_value(argc, argv, &i, "--out"))) { fm_cli_error("train: --out needs a directory"); train_usage(stderr); return 2; }
            continue;
        }
        if (!strncmp(a, "--resume", 8) && (a[8] == 0 || a[8] == '=')) {
            if (!(o.resume_dir = opt_value(argc, argv, &i, "--resume"))) { fm_cli_error("train: --resume needs a directory"); train_usage(stderr); return 2; }
            continue;
        }
        if (a[0] == '-') { fm_cli_error("train: unknown option '%s'", a); train_usage(stderr); return 2; }
        if (recipe) { fm_cli_error("train: more than one recipe given ('%s' and '%s')", recipe, a); train_usage(stderr); return 2; }
        recipe = a;
    }
    if (!recipe) { fm_cli_error("train: no recipe given"); train_usage(stderr); return 2; }
    fm_recipe r;
    if (fm_recipe_load(recipe, &r) != FM_OK) { fm_cli_error("%s", fm_last_error()); return 1; }
    char outbuf[600];
    if (!out && !o.resume_dir) {
        snprintf(outbuf, sizeof outbuf, "runs/%s", r.name);
        out = outbuf;
    }
    o.out_dir = out;
    o.log = quiet ? NULL : (json ? stderr : stdout);
    fm_train_result res;
    fm_status st = fm_train(&r, &o, &res);
    if (st != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        fm_train_result_free(&res);
        fm_recipe_free(&r);
        return 1;
    }
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "recipe", json_string(r.name));
        if (res.test_accuracy >= 0) {
            json_object_set_new(j, "test_accuracy", json_real(res.test_accuracy));
            json_object_set_new(j, "test_loss", json_real(res.test_loss));
        } else {
            json_object_set_new(j, "test_accuracy", json_null());
        }
        json_object_set_new(j, "final_loss", json_real(res.final_loss));
        json_object_set_new(j, "epochs", json_integer(res.epochs));
        json_object_set_new(j, "steps", json_integer(res.steps));
        json_object_set_new(j, "train_seconds", json_real(res.train_seconds));
        json_object_set_new(j, "samples_per_second", json_real(res.samples_per_second));
        json_object_set_new(j, "peak_memory_bytes", json_integer((json_int_t)res.peak_memory_bytes));
        json_object_set_new(j, "num_params", json_integer(res.num_params));
        json_object_set_new(j, "model_path", res.model_path[0] ? json_string(res.model_path) : json_null());
        json_object_set_new(j, "data_wait_seconds", json_real(res.data_wait_seconds));
        json_t *mem = res.memory_report_json[0] ? json_loads(res.memory_report_json, 0, NULL) : NULL;
        if (mem) json_object_set_new(j, "memory", mem);
        if (o.profile_path) json_object_set_new(j, "trace", json_string(o.profile_path));
        if (o.logdir) json_object_set_new(j, "logdir", json_string(o.logdir));
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("done: %d epochs in %.1f s (%.0f samples/s)", res.epochs, res.train_seconds, res.samples_per_second);
        if (res.test_accuracy >= 0) printf(", test accuracy %.2f%%", 100 * res.test_accuracy);
        printf("\n");
        if (res.model_path[0]) printf("model saved to %s\n", res.model_path);
        if (res.memory_report_text[0] && !quiet) printf("%s\n", res.memory_report_text);
        if (o.profile_path) printf("trace: %s (open in ui.perfetto.dev, or: fathom profile %s)\n", o.profile_path, o.profile_path);
        if (o.logdir) printf("logs: %s (TensorBoard event files; or: fathom plot %s -o curves.svg)\n", o.logdir, o.logdir);
    }
    fm_train_result_free(&res);
    fm_recipe_free(&r);
    return 0;
}
