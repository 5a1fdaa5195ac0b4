/* `fathom prune MODEL_DIR --sparsity S [--structured channels] [--global|--per-layer]
 * [--finetune STEPS] -o OUT_DIR`: a trained classifier made sparse (masks kept
 * through fine-tuning) or smaller (channels removed), written as a new model
 * directory that eval, predict, compile and train take (fathom/prune.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "fathom/prune.h"

static void usage(FILE *f) {
    fprintf(f, "usage: fathom prune MODEL_DIR --sparsity S -o OUT_DIR [--structured channels|heads] [--global|--per-layer]\n"
               "                    [--finetune STEPS] [--lr LR] [--batch N] [--seed N] [--threads N] [--quiet]\n\n"
               "Prunes a model trained by `fathom train` and writes a new model directory.\n\n"
               "  --sparsity S           fraction to remove, in [0, 1)\n"
               "  --structured channels  remove whole conv channels and linear neurons: the tensors (and the next\n"
               "                         layer's inputs, and batch norms) shrink, so the model runs faster\n"
               "                         (default: unstructured, the smallest weights set to zero and kept zero\n"
               "                         by masks saved with the model)\n"
               "                         (a GPT: the MLP neurons of every block)\n"
               "  --structured heads     a GPT's attention heads (with grouped-query attention, whole kv groups):\n"
               "                         S of the heads of every block go, the weakest by their value-to-output map\n"
               "  --global               one ranking over all layers (default for unstructured)\n"
               "  --per-layer            S of every layer (default for --structured)\n"
               "  --finetune STEPS       then train STEPS optimizer steps on the recipe's data (masks kept);\n"
               "                         the output directory can be resumed with `fathom train --resume`\n"
               "                         (a GPT: on its directory's tokens.bin, with the GPT trainer)\n"
               "  --lr, --batch, --seed, --threads   fine-tuning overrides of the recipe\n"
               "  --quiet                no training progress\n");
}

static void print_report(const fm_prune_report *r, fm_prune_kind kind) {
    printf("%-34s %12s %12s %8s\n", "layer", kind == FM_PRUNE_HEADS ? "heads" : kind ? "channels" : "nonzero", "after",
           "kept");
    for (int i = 0; i < r->n_layers; i++) {
        const fm_prune_layer_report *l = &r->layers[i];
        printf("%-34s %12lld %12lld %7.1f%%\n", l->name, (long long)l->before, (long long)l->after,
               l->before ? 100.0 * (double)l->after / (double)l->before : 0.0);
    }
    printf("parameters: %lld -> %lld (%.1f%%); zeros: %lld -> %lld\n", (long long)r->params_before,
           (long long)r->params_after, r->params_before ? 100.0 * (double)r->params_after / (double)r->params_before : 0.0,
           (long long)r->zeros_before, (long long)r->zeros_after);
}

static int parse_args(int argc, char **argv, const char **in, const char **out, fm_prune_options *o, long long *steps,
                      fm_train_options *to, bool *quiet) {
    int scope = 0; /* 1 global, 2 per layer */
    bool have_s = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--global")) scope = 1;
        else if (!strcmp(a, "--per-layer")) scope = 2;
        else if (!strcmp(a, "--quiet")) *quiet = true;
        else if (a[0] != '-' && !*in) *in = a;
        else if (!v) { fm_cli_error("prune: '%s' needs a value", a); return 2; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) { *out = v; i++; }
        else if (!strcmp(a, "--sparsity")) {
            char *end;
            o->sparsity = strtod(v, &end);
            i++;
            if (*end || end == v || !(o->sparsity >= 0 && o->sparsity < 1)) {
                fm_cli_error("prune: --sparsity must be a fraction in [0, 1) (0.5 removes half), got '%s'; nothing written", v);
                return 2;
            }
            have_s = true;
        } else if (!strcmp(a, "--structured")) {
            i++;
            if (!strcmp(v, "channels")) o->kind = FM_PRUNE_CHANNELS;
            else if (!strcmp(v, "heads")) o->kind = FM_PRUNE_HEADS;
            else { fm_cli_error("prune: --structured takes 'channels' or 'heads', got '%s'", v); return 2; }
        } else if (!strcmp(a, "--finetune")) { if (!fm_cli_parse_int("prune", a, v, 0, steps)) return 2; i++; }
        else if (!strcmp(a, "--batch")) { if (!fm_cli_parse_int_range("prune", a, v, 1, 1 << 20, &n)) return 2; to->batch_size = n; i++; }
        else if (!strcmp(a, "--seed")) { if (!fm_cli_parse_int("prune", a, v, 0, &n)) return 2; to->seed = n; i++; }
        else if (!strcmp(a, "--threads")) { if (!fm_cli_parse_int_range("prune", a, v, 1, 256, &n)) return 2; to->threads = (int)n; i++; }
        else if (!strcmp(a, "--lr")) {
            char *end;
            to->lr = strtod(v, &end);
            i++;
            if (*end || !(to->lr > 0) || !isfinite(to->lr)) { fm_cli_error("prune: --lr needs a positive number, got '%s'", v); return 2; }
        } else {
            static const char *const flags[] = {"--sparsity", "--structured", "--global", "--per-layer", "--finetune",
                                                "--lr", "--batch", "--seed", "--threads", "--quiet", "--out", "--help"};
            fm_cli_unknown_option("prune", a, flags, 12);
            return 2;
        }
    }
    if (!*in) { fm_cli_error("prune: no model directory given"); return 2; }
    if (fm_cli_refuse_onnx("prune", *in)) return 1;
    if (!*out) { fm_cli_error("prune: no output directory (-o OUT_DIR)"); return 2; }
    if (!have_s) { fm_cli_error("prune: --sparsity S is required (the fraction to remove, e.g. 0.5)"); return 2; }
    o->global = scope ? scope == 1 : o->kind == FM_PRUNE_UNSTRUCTURED;
    return -1;
}

int fm_cmd_prune(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    fm_prune_options o;
    fm_prune_options_init(&o);
    long long steps = 0;
    bool quiet = false;
    fm_train_options to;
    fm_train_options_init(&to);
    int rc = parse_args(argc, argv, &in, &out, &o, &steps, &to, &quiet);
    if (rc >= 0) {
        if (rc == 2) usage(stderr);
        return rc;
    }
    to.log = quiet ? NULL : stderr;
    fm_prune_report rep;
    fm_train_result tr;
    memset(&tr, 0, sizeof tr);
    if (fm_prune_dir(in, out, &o, steps, &to, &rep, &tr) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        fm_train_result_free(&tr);
        return 1;
    }
    print_report(&rep, o.kind);
    if (steps > 0 && tr.test_accuracy >= 0)
        printf("fine-tuned %lld steps: test accuracy %.2f%%, test loss %.4f\n", steps, 100 * tr.test_accuracy, tr.test_loss);
    else if (steps > 0) /* a GPT: its validation loss */
        printf("fine-tuned %lld steps: validation loss %.4f\n", steps, tr.test_loss);
    printf("%s -> %s\n", in, out);
    fm_train_result_free(&tr);
    return 0;
}
