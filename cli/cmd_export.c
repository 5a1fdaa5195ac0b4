/* `fathom export DIR -o model.onnx`: a model as an ONNX file (opset 17), through
 * the inference graph: DIR is a graph directory (`fathom import`, `fathom
 * compile`) or a trained model directory, traced into a graph first
 * (fm_graph_from_model_dir), or a GPT-2/Llama/Qwen2 directory in Hugging Face layout
 * (its KV-cache decode graph, fm_graph_from_gpt). */
#include <dirent.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "gpt_dir.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/hf.h"
#include "fathom/onnx.h"

static void export_usage(FILE *f) {
    fprintf(f, "usage: fathom export DIR -o MODEL.onnx\n"
               "       fathom export GPT_DIR --hf -o OUT_DIR\n\n"
               "Writes the model in DIR as an ONNX file (opset 17), atomically: DIR is a model\n"
               "trained by `fathom train` (traced into the inference graph first), a graph\n"
               "directory (`fathom compile`, `fathom import`), or a GPT-2/Llama/Qwen2 checkpoint in\n"
               "Hugging Face layout. A GPT is written as its KV-cache decode graph: tokens and\n"
               "past_key.<i>/past_value.<i> in, logits and present_key/present_value out. The constants\n"
               "become initializers and dynamic dims stay dynamic (dim_param). An op with no\n"
               "ONNX form is named in the error and nothing is written.\n\n"
               "  --hf   write a GPT (GPT-2, Llama, Qwen2) instead in Hugging Face layout: OUT_DIR (new or\n"
               "         empty) gets config.json and model.safetensors, which transformers'\n"
               "         AutoModelForCausalLM loads with the same logits (the tokenizer is not written)\n");
}

/* --hf: a GPT (fathom's own directory or already HF) written as config.json +
 * model.safetensors into a new or empty directory, never into the model's own. */
static int export_hf(const char *dir, const char *out) {
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(dir, a) && realpath(out, b) && !strcmp(a, b)) {
        fm_cli_error("export --hf: the output directory is the model's own directory (%s); choose another", out);
        return 2;
    }
    DIR *d = opendir(out);
    if (d) {
        struct dirent *e;
        int n = 0;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
        closedir(d);
        if (n) { fm_cli_error("export --hf: %s is not empty (give a new or empty directory)", out); return 1; }
    }
    fm_gpt *m = fm_hf_is_model_dir(dir) ? fm_hf_gpt_load(dir, NULL) : fm_gpt_load_dir(dir, NULL);
    if (!m || fm_hf_gpt_save(m, out)) {
        fm_cli_error("%s", fm_last_error());
        fm_gpt_free(m);
        return 1;
    }
    const fm_gpt_config *c = fm_gpt_get_config(m);
    printf("%s -> %s: %s in Hugging Face layout (config.json, model.safetensors; %d layers, %d wide)\n", dir, out,
           c->arch == FM_GPT_LLAMA ? "LlamaForCausalLM" : "GPT2LMHeadModel", c->n_layer, c->n_embd);
    fm_gpt_free(m);
    return 0;
}

int fm_cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    bool hf = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { export_usage(stdout); return 0; }
        if (!strcmp(argv[i], "--hf")) hf = true;
        else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) {
            if (i + 1 >= argc) { fm_cli_error("export: %s needs a file name", argv[i]); export_usage(stderr); return 2; }
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            fm_cli_error("export: unknown option '%s'", argv[i]);
            export_usage(stderr);
            return 2;
        } else if (dir) {
            fm_cli_error("export: more than one model directory given");
            export_usage(stderr);
            return 2;
        } else dir = argv[i];
    }
    if (!dir || !out) {
        fm_cli_error("export: %s", !dir ? "no model directory given" : hf ? "no output directory (-o OUT_DIR)" : "no output file (-o MODEL.onnx)");
        export_usage(stderr);
        return 2;
    }
    if (hf) return export_hf(dir, out);
    /* a graph directory, a trained model traced, or a GPT-2, Llama or Qwen2 in Hugging
     * Face layout (its KV-cache decode graph) */
    fm_graph *g = fm_cli_graph_from_dir(dir);
    int rc = 0;
    if (!g || fm_graph_export_onnx(g, out)) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    else printf("%s -> %s: %d graph nodes, %d constants\n", dir, out, fm_graph_num_nodes(g), fm_graph_num_consts(g));
    fm_graph_free(g);
    return rc;
}
