/* `fathom import MODEL.onnx -o DIR`: an ONNX model as an inference graph directory
 * (graph.json + weights.safetensors, docs/GRAPH.md), which `fathom serve` and the
 * graph API load. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "fathom/graph.h"
#include "fathom/onnx.h"

static void import_usage(FILE *f) {
    fprintf(f, "usage: fathom import MODEL.onnx -o DIR [--dim NAME=SIZE ...]\n\n"
               "Converts an ONNX model to fathom's inference graph (DIR/graph.json and\n"
               "DIR/weights.safetensors, written atomically). Constants and shape arithmetic\n"
               "are folded; dynamic dims (ONNX dim_param) stay dynamic, including the batch and\n"
               "sequence of a transformer exported by torch.onnx.export (its position ids and\n"
               "masks become graph ops over them). A node with no graph form is named in the\n"
               "error; `fathom run` still runs such a model.\n\n"
               "  --dim NAME=SIZE  fix the dynamic input dim NAME (its dim_param, or INPUT_dK for an\n"
               "                   unnamed one) to SIZE in the graph, so that shape arithmetic which\n"
               "                   follows it folds (what the graph cannot follow otherwise, such as\n"
               "                   min(b, 3), is refused naming the dims to fix); repeatable\n");
}

#define MAX_DIM_SPECS 16

bool fm_cli_is_onnx(const char *path) {
    const size_t n = path ? strlen(path) : 0;
    return n > 5 && !strcmp(path + n - 5, ".onnx");
}

int fm_cli_refuse_onnx(const char *cmd, const char *path) {
    if (!fm_cli_is_onnx(path)) return 0;
    fm_cli_error("%s: %s is an ONNX file; %s takes a model directory. `fathom run %s --input NAME=FILE` runs it; "
                 "`fathom import`, `compile`, `quantize`, `bench` and `serve` (in a model repository) take it",
                 cmd, path, cmd, path);
    return 1;
}

int fm_cli_onnx_dims(const char *cmd, struct fm_onnx_model *m, int n, char *const *specs) {
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(specs[i], '=');
        char name[64], *end = NULL;
        errno = 0;
        long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || eq == specs[i] || (size_t)(eq - specs[i]) >= sizeof name || !end || end == eq + 1 || *end || errno) {
            fm_cli_error("%s: --dim '%s': give NAME=SIZE, for example --dim batch=1", cmd, specs[i]);
            return 2;
        }
        snprintf(name, sizeof name, "%.*s", (int)(eq - specs[i]), specs[i]);
        if (fm_onnx_set_dim(m, name, (int64_t)v)) { fm_cli_error("%s: --dim %s: %s", cmd, specs[i], fm_last_error()); return 2; }
    }
    return 0;
}

int fm_cmd_import(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    char *dims[MAX_DIM_SPECS];
    int n_dims = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { import_usage(stdout); return 0; }
        if (!strcmp(argv[i], "--dim")) {
            if (i + 1 >= argc || n_dims == MAX_DIM_SPECS) {
                fm_cli_error("import: --dim %s", i + 1 >= argc ? "needs NAME=SIZE" : "given more than 16 times");
                return 2;
            }
            dims[n_dims++] = argv[++i];
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) {
            if (i + 1 >= argc) { fm_cli_error("import: %s needs a directory", argv[i]); import_usage(stderr); return 2; }
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            fm_cli_error("import: unknown option '%s'", argv[i]);
            import_usage(stderr);
            return 2;
        } else if (model) {
            fm_cli_error("import: more than one model given");
            import_usage(stderr);
            return 2;
        } else model = argv[i];
    }
    if (!model || !out) { fm_cli_error("import: %s", model ? "no output directory (-o DIR)" : "no model given"); import_usage(stderr); return 2; }
    fm_onnx_model *m = fm_onnx_load(model);
    int rc = m ? fm_cli_onnx_dims("import", m, n_dims, dims) : 0;
    fm_graph *g = m && !rc ? fm_onnx_to_graph(m) : NULL;
    if (rc) fm_onnx_free(m);
    if (rc) return rc;
    if (!g || fm_graph_save(g, out)) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    else {
        printf("%s -> %s: %d nodes, %d constants, inputs:", model, out, fm_graph_num_nodes(g), fm_graph_num_consts(g));
        for (int i = 0; i < fm_graph_num_inputs(g); i++) {
            fm_graph_io io;
            if (fm_graph_input_info(g, i, &io)) continue;
            printf(" %s %s [", io.name, fm_dtype_name(io.dtype));
            for (int d = 0; d < io.ndim; d++)
                if (io.shape[d] == FM_DIM_DYNAMIC) printf("%s%s", d ? ", " : "", io.dim_names[d] ? io.dim_names[d] : "?");
                else printf("%s%lld", d ? ", " : "", (long long)io.shape[d]);
            printf("]");
        }
        printf("\n");
    }
    fm_graph_free(g);
    fm_onnx_free(m);
    return rc;
}
