/* `fathom eval MODEL_DIR`: accuracy and loss of a saved model on its recipe's
 * test set (or the data set in --data DIR). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "commands.h"
#include "eval_gpt.h"
#include "device_arg.h"
#include "fathom/amp.h" /* fm_autocast_set */
#include "fathom/graph.h"
#include "fathom/recipe.h"

static void eval_usage(FILE *f) {
    fprintf(f, "usage: fathom eval MODEL_DIR [--data DIR] [--batch N] [--device D] [--precision P] [--json] [--quiet]\n"
               "       fathom eval GPT_DIR [--text FILE | --tokens FILE] [--val-fraction F] [--batch N] [--device D]\n"
               "                   [--precision P] [--json] [--quiet]\n\n"
               "Evaluates a model saved by `fathom train` on the test split of its data set (a classifier:\n"
               "accuracy and loss), or a GPT (a `fathom train` GPT directory, a Hugging Face layout, or a\n"
               "compiled or quantized graph of one) on held-out text: the mean next-token loss and the\n"
               "perplexity, in non-overlapping windows of the model's context.\n\n"
               "  --data DIR   directory with the idx files (default: the recipe's data set); for a recipe\n"
               "               with dataset = csv, the CSV file to evaluate on (default: its test_csv)\n"
               "  --batch N    evaluation batch size (default 1000; a GPT: windows per forward, default 8)\n"
               "  --text FILE  a GPT: evaluate on this text (default: the last --val-fraction of the\n"
               "               directory's tokens.bin, the split `fathom train` validated on)\n"
               "  --tokens FILE  a GPT: that split of this token file instead (a graph's: the tokens.bin of\n"
               "               the model it was compiled or quantized from)\n"
               "  --val-fraction F   that split's fraction, in (0, 1) (default 0.1, the trainer's default)\n"
               "  --device D   where to run the model: cpu (default), cuda, cuda:N, check (the checked\n"
               "               test device: CPU kernels on memory the host may not touch)\n"
               "  --precision P  fp32 (default), bf16 or fp16: the forward autocast to that dtype, as\n"
               "               `fathom train --precision P` runs it (a GPT trained in bf16 validated so);\n"
               "               not for graphs, which run in the precision they were compiled in\n"
               "  --json       print one JSON object on stdout\n"
               "  --quiet      no progress output (otherwise on stderr: a redrawn line on a terminal,\n"
               "               plain periodic lines elsewhere)\n");
}

/* A GPT to evaluate: a graph made from one (its meta says so: *g gets the graph, loaded
 * once here for whichever path runs it), or a directory with config.json (fathom's GPT or a
 * Hugging Face layout). A graph directory that does not load: false, *g NULL and the error set. */
static bool is_gpt(const char *dir, fm_graph **g) {
    char p[4096];
    struct stat sb;
    *g = NULL;
    if (fm_graph_dir_is_graph(dir)) {
        *g = fm_graph_load(dir);
        const char *k = *g ? fm_graph_get_meta(*g, "model_kind") : NULL;
        return k && !strcmp(k, "gpt");
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A classifier (a `fathom train` directory or its graph, g: loaded, taken over) on its
 * recipe's test split or --data: accuracy and loss. The exit code. */
static int eval_classifier(const char *dir, fm_graph *g, const char *data, long batch, fm_device dev, fm_dtype prec,
                           bool json, bool quiet) {
    fm_recipe r;
    fm_module *m = NULL;
    if (!g && fm_graph_dir_is_graph(dir)) { fm_cli_error("%s: %s", dir, fm_last_error()); return 1; } /* it did not load */
    if (fm_cli_classifier_open(dir, g, dev, &r, &m)) return 1;
    int rc = 1;
    fm_dataset *d = fm_recipe_dataset(&r, FM_SPLIT_TEST, data);
    double acc = 0, loss = 0;
    fm_dtype prev_ac = fm_autocast_set(prec); /* fp32: off */
    fm_status est = !d ? fm_last_status()
                    : g ? fm_graph_evaluate(g, d, &r.transforms, batch, &acc, &loss, quiet ? NULL : stderr)
                        : fm_evaluate_progress(m, d, &r.transforms, batch, &acc, &loss, quiet ? NULL : stderr);
    fm_autocast_set(prev_ac);
    if (est != FM_OK) {
        fm_cli_error("%s", fm_last_error());
    } else {
        rc = 0;
        if (json) {
            json_t *j = json_object();
            json_object_set_new(j, "model_path", json_string(dir));
            json_object_set_new(j, "test_accuracy", json_real(acc));
            json_object_set_new(j, "test_loss", json_real(loss));
            json_object_set_new(j, "samples", json_integer(fm_dataset_size(d)));
            json_object_set_new(j, "precision", json_string(fm_precision_name(prec)));
            char *s = json_dumps(j, JSON_COMPACT);
            printf("%s\n", s);
            free(s);
            json_decref(j);
        } else {
            printf("%s: test accuracy %.2f%%, loss %.4f on %lld samples%s\n", dir, 100 * acc, loss,
                   (long long)fm_dataset_size(d), prec == FM_F32 ? "" : prec == FM_BF16 ? " (bf16)" : " (fp16)");
        }
    }
    fm_dataset_release(d);
    fm_module_free(m);
    fm_graph_free(g);
    fm_recipe_free(&r);
    return rc;
}

int fm_cmd_eval(int argc, char **argv) {
    const char *dir = NULL, *data = NULL, *text = NULL, *tokens = NULL;
    bool json = false, quiet = false, batch_set = false;
    long batch = 1000;
    double val_fraction = 0.1;
    fm_device dev = FM_CPU;
    fm_dtype prec = FM_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { eval_usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--quiet")) { quiet = true; continue; }
        if (!strcmp(a, "--data") || !strncmp(a, "--data=", 7)) {
            data = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : NULL);
            if (!data || !*data) { fm_cli_error("eval: --data needs a directory"); eval_usage(stderr); return 2; }
            continue;
        }
        if (!strcmp(a, "--batch") || !strncmp(a, "--batch=", 8)) {
            const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
            long long b;
            if (!fm_cli_parse_int_range("eval", "--batch", v, 1, 1 << 20, &b)) { eval_usage(stderr); return 2; }
            batch = (long)b;
            batch_set = true;
            continue;
        }
        if (!strcmp(a, "--text") || !strcmp(a, "--tokens")) {
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            if (!v || !*v) { fm_cli_error("eval: %s needs a file", a); eval_usage(stderr); return 2; }
            if (!strcmp(a, "--text")) text = v;
            else tokens = v;
            continue;
        }
        if (!strcmp(a, "--val-fraction")) {
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            char *end = NULL;
            val_fraction = v ? strtod(v, &end) : 0;
            if (!v || *end || end == v || !(val_fraction > 0 && val_fraction < 1)) {
                fm_cli_error("eval: --val-fraction needs a fraction in (0, 1), got '%s'", v ? v : "");
                eval_usage(stderr);
                return 2;
            }
            continue;
        }
        if (!strcmp(a, "--device") || !strncmp(a, "--device=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            int drc = fm_cli_device("eval", v, &dev);
            if (drc) return drc;
            continue;
        }
        if (!strcmp(a, "--precision") || !strncmp(a, "--precision=", 12)) {
            const char *v = a[11] == '=' ? a + 12 : (i + 1 < argc ? argv[++i] : NULL);
            int prc = fm_cli_precision("eval", v, &prec);
            if (prc) return prc;
            continue;
        }
        if (a[0] == '-') {
            static const char *const flags[] = {"--help", "--json", "--quiet", "--data", "--batch", "--device", "--text",
                                                "--val-fraction", "--tokens", "--precision"};
            fm_cli_unknown_option("eval", a, flags, 10);
            eval_usage(stderr);
            return 2;
        }
        if (dir) { fm_cli_error("eval: more than one model directory given"); eval_usage(stderr); return 2; }
        dir = a;
    }
    if (!dir) { fm_cli_error("eval: no model directory given"); eval_usage(stderr); return 2; }
    if (fm_cli_refuse_onnx("eval", dir)) return 1;
    fm_graph *g = NULL; /* a graph directory runs as the model it was made from; read once */
    bool gpt = is_gpt(dir, &g);
    if (fm_graph_dir_is_graph(dir) && fm_cli_precision_for_graph("eval", dir, prec)) { fm_graph_free(g); return 2; }
    if (gpt) {
        const char *bad = data ? "--data is for classifiers (give --text FILE)"
                          : text && tokens ? "give --text or --tokens, not both" : NULL;
        if (bad) {
            if (data) fm_cli_error("eval: %s is a GPT: %s", dir, bad);
            else fm_cli_error("eval: %s", bad);
            fm_graph_free(g);
            return 2;
        }
        fm_eval_gpt_opts go = {text, tokens, val_fraction, batch_set ? batch : 8, dev, prec, json, quiet};
        return fm_eval_gpt(dir, g, &go);
    }
    if (text || tokens) {
        fm_cli_error("eval: %s is for GPT models; %s is not one", text ? "--text" : "--tokens", dir);
        fm_graph_free(g);
        return 2;
    }
    return eval_classifier(dir, g, data, batch, dev, prec, json, quiet);
}
