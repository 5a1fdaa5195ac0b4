/* `fathom distill --teacher DIR --student RECIPE [--temperature T] [--alpha A] ...`:
 * trains a classifier recipe with the knowledge-distillation loss against a
 * trained teacher (fathom/distill.h), through the same trainer as `fathom train`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "commands.h"
#include "core/parallel.h" /* fm_set_num_threads for --threads (GPT students) */
#include "fathom/distill.h"
#include "fathom/gpt.h"

static void usage(FILE *f) {
    fprintf(f, "usage: fathom distill --teacher MODEL_DIR --student RECIPE [--temperature T] [--alpha A]\n"
               "                      [--steps N | --epochs N] [--batch N] [--lr X] [--seed N] [--threads N]\n"
               "                      [--out DIR] [--overwrite] [--no-eval] [--json] [--quiet]\n\n"
               "Trains the student recipe (a classifier or a GPT) on its data with the loss\n"
               "  alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE(student, labels)\n"
               "where the teacher is a model trained by `fathom train`: for a classifier, on inputs of the same shape\n"
               "and normalization; for a GPT (per token, over the vocabulary), a GPT whose tokenizer the student takes.\n\n"
               "  --teacher DIR      the teacher model directory\n"
               "  --student RECIPE   a built-in recipe name or an .ini path\n"
               "  --temperature T    softening of both distributions, in [0.01, 1000] (default 2)\n"
               "  --alpha A          weight of the soft targets, in [0, 1] (default 0.5; 0: labels only)\n"
               "  --out DIR          where the student goes (default runs/<recipe>-distilled)\n"
               "  --overwrite        replace a run that --out already holds (without it, such a directory is refused)\n"
               "  the other flags are `fathom train`'s\n");
}

typedef struct distill_args {
    const char *teacher, *student, *out;
    bool json, quiet, no_eval, overwrite;
    long long steps, epochs, batch, seed, threads;
    double lr;
    fm_distill_options d;
} distill_args;

static bool parse_double(const char *opt, const char *v, double *out) {
    char *end;
    *out = strtod(v, &end);
    if (*end || end == v || !isfinite(*out)) { fm_cli_error("distill: %s needs a number, got '%s'", opt, v); return false; }
    return true;
}

/* -1: go on; else the exit code */
static int parse_args(int argc, char **argv, distill_args *a) {
    static const char *const flags[] = {"--teacher", "--student", "--temperature", "--alpha", "--steps", "--epochs",
                                        "--batch", "--lr", "--seed", "--threads", "--out", "--no-eval", "--json",
                                        "--quiet", "--overwrite", "--help"};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); return 0; }
        if (!strcmp(f, "--json")) { a->json = true; continue; }
        if (!strcmp(f, "--quiet")) { a->quiet = true; continue; }
        if (!strcmp(f, "--no-eval")) { a->no_eval = true; continue; }
        if (!strcmp(f, "--overwrite")) { a->overwrite = true; continue; }
        if (f[0] != '-' || !strncmp(f, "---", 3)) { fm_cli_error("distill: unexpected argument '%s'", f); return 2; }
        int k = -1;
        for (int j = 0; j < (int)(sizeof flags / sizeof flags[0]); j++) if (!strcmp(f, flags[j])) k = j;
        if (k < 0) { fm_cli_unknown_option("distill", f, flags, (int)(sizeof flags / sizeof flags[0])); return 2; }
        if (!v) { fm_cli_error("distill: %s needs a value", f); return 2; }
        i++;
        bool ok = true;
        switch (k) {
        case 0: a->teacher = v; break;
        case 1: a->student = v; break;
        case 2:
            ok = parse_double(f, v, &a->d.temperature);
            if (ok && !(a->d.temperature >= FM_DISTILL_TEMPERATURE_MIN && a->d.temperature <= FM_DISTILL_TEMPERATURE_MAX)) {
                fm_cli_error("distill: --temperature must be positive, in [%g, %g], got '%s'", FM_DISTILL_TEMPERATURE_MIN,
                             FM_DISTILL_TEMPERATURE_MAX, v);
                ok = false;
            }
            break;
        case 3:
            ok = parse_double(f, v, &a->d.alpha);
            if (ok && !(a->d.alpha >= 0 && a->d.alpha <= 1)) { fm_cli_error("distill: --alpha must be in [0, 1], got '%s'", v); ok = false; }
            break;
        case 4: ok = fm_cli_parse_int("distill", f, v, 1, &a->steps); break;
        case 5: ok = fm_cli_parse_int_range("distill", f, v, 1, 1000000, &a->epochs); break;
        case 6: ok = fm_cli_parse_int_range("distill", f, v, 1, 1 << 20, &a->batch); break;
        case 7: ok = parse_double(f, v, &a->lr) && (a->lr > 0 || (fm_cli_error("distill: --lr must be positive, got '%s'", v), false)); break;
        case 8: ok = fm_cli_parse_int("distill", f, v, 0, &a->seed); break;
        case 9: ok = fm_cli_parse_int_range("distill", f, v, 1, 256, &a->threads); break;
        case 10: a->out = v; break;
        }
        if (!ok) return 2;
    }
    if (!a->teacher || !a->student) { fm_cli_error("distill: %s", a->teacher ? "no --student RECIPE" : "no --teacher MODEL_DIR"); return 2; }
    if (fm_cli_refuse_onnx("distill --teacher", a->teacher)) return 1;
    return -1;
}

static void print_json(const distill_args *a, const fm_train_result *res, const char *out) {
    json_t *j = json_object();
    json_object_set_new(j, "teacher", json_string(a->teacher));
    json_object_set_new(j, "student", json_string(a->student));
    json_object_set_new(j, "temperature", json_real(a->d.temperature));
    json_object_set_new(j, "alpha", json_real(a->d.alpha));
    json_object_set_new(j, "steps", json_integer(res->steps));
    json_object_set_new(j, "final_loss", json_real(res->final_loss));
    json_object_set_new(j, "test_accuracy", res->test_accuracy >= 0 ? json_real(res->test_accuracy) : json_null());
    json_object_set_new(j, "test_loss", res->test_accuracy >= 0 ? json_real(res->test_loss) : json_null());
    json_object_set_new(j, "num_params", json_integer(res->num_params));
    json_object_set_new(j, "train_seconds", json_real(res->train_seconds));
    json_object_set_new(j, "model_dir", json_string(out));
    char *s = json_dumps(j, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* A GPT student: per-token soft targets, through the GPT trainer (fm_gpt_distill). */
static int distill_gpt(const distill_args *a, const char *path) {
    fm_gpt_recipe rec;
    if (fm_gpt_recipe_load(path, &rec)) { fm_cli_error("%s", fm_last_error()); return 2; }
    fm_gpt_train_opts o = rec.opts;
    char out[600];
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (a->out) snprintf(out, sizeof out, "%s", a->out);
    else snprintf(out, sizeof out, "runs/%.*s-distilled", (int)(strstr(base, ".ini") ? strstr(base, ".ini") - base : (long)strlen(base)), base);
    o.out_dir = out;
    if (!a->overwrite && fm_cli_out_guard("distill", out, false)) { fm_gpt_recipe_free(&rec); return 1; }
    if (a->steps > 0) o.steps = a->steps;
    if (a->epochs > 0) o.epochs = (int)a->epochs;
    if (a->batch > 0) o.batch_size = (int)a->batch;
    if (a->lr > 0) { o.min_lr *= a->lr / o.lr; o.lr = a->lr; }
    if (a->seed >= 0) o.seed = (uint64_t)a->seed;
    o.no_eval = a->no_eval;
    o.quiet = a->quiet;
    if (a->threads > 0) fm_set_num_threads((int)a->threads);
    fm_gpt_train_result res;
    memset(&res, 0, sizeof res);
    fm_status st = fm_gpt_distill(a->teacher, &o, &a->d, &res);
    fm_gpt_recipe_free(&rec);
    if (st != FM_OK) { fm_cli_error("%s", fm_last_error()); return 1; }
    if (a->json) {
        json_t *j = json_object();
        json_object_set_new(j, "teacher", json_string(a->teacher));
        json_object_set_new(j, "student", json_string(a->student));
        json_object_set_new(j, "temperature", json_real(a->d.temperature));
        json_object_set_new(j, "alpha", json_real(a->d.alpha));
        json_object_set_new(j, "steps", json_integer(res.steps));
        json_object_set_new(j, "final_loss", json_real(res.train_loss));
        json_object_set_new(j, "val_loss", isfinite(res.val_loss) ? json_real(res.val_loss) : json_null());
        json_object_set_new(j, "num_params", json_integer(res.num_params));
        json_object_set_new(j, "train_seconds", json_real(res.train_seconds));
        json_object_set_new(j, "model_dir", json_string(out));
        char *js = json_dumps(j, JSON_COMPACT);
        printf("%s\n", js);
        free(js);
        json_decref(j);
    } else {
        if (isfinite(res.val_loss)) printf("distilled %s: validation loss %.4f\n", base, res.val_loss);
        printf("model: %s\n", out);
    }
    return 0;
}

int fm_cmd_distill(int argc, char **argv) {
    distill_args a;
    memset(&a, 0, sizeof a);
    a.seed = -1;
    fm_distill_options_init(&a.d);
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) {
        if (rc == 2) usage(stderr);
        return rc;
    }
    char path[1024];
    fm_recipe_resolve(a.student, path, sizeof path);
    if (fm_gpt_recipe_is_gpt(path)) return distill_gpt(&a, path);
    fm_recipe r;
    if (fm_recipe_load(a.student, &r) != FM_OK) { fm_cli_error("%s", fm_last_error()); return 1; }
    char out[600];
    if (a.out) snprintf(out, sizeof out, "%s", a.out);
    else snprintf(out, sizeof out, "runs/%s-distilled", r.name);
    if (!a.overwrite && fm_cli_out_guard("distill", out, false)) { fm_recipe_free(&r); return 1; }
    fm_train_options o;
    fm_train_options_init(&o);
    o.steps = a.steps;
    o.epochs = (int)a.epochs;
    o.batch_size = a.batch;
    o.lr = a.lr;
    o.seed = a.seed;
    o.threads = (int)a.threads;
    o.out_dir = out;
    o.skip_eval = a.no_eval;
    o.log = a.quiet ? NULL : stderr;
    fm_train_result res;
    fm_status st = fm_distill(a.teacher, &r, &a.d, &o, &res);
    if (st != FM_OK) {
        fm_cli_error("%s", fm_last_error());
    } else if (a.json) {
        print_json(&a, &res, out);
    } else {
        if (res.test_accuracy >= 0)
            printf("distilled %s: test accuracy %.2f%%, test loss %.4f\n", r.name, 100 * res.test_accuracy, res.test_loss);
        printf("model: %s\n", out);
    }
    fm_train_result_free(&res);
    fm_recipe_free(&r);
    return st == FM_OK ? 0 : 1;
}
