/* `fathom import MODEL.onnx -o DIR`: an ONNX model as an inference graph directory
 * (graph.json + weights.safetensors, docs/GRAPH.md), which `fathom serve` and the
 * graph API load. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "fathom/graph.h"
#include "fathom/onnx.h"

static void import_usage(FILE *f) {
    fprintf(f, "usage: fathom import MODEL.onnx -o DIR\n\n"
               "Converts an ONNX model to fathom's inference graph (DIR/graph.json and\n"
               "DIR/weights.safetensors, written atomically). Constants and shape arithmetic\n"
               "are folded; dynamic dims (ONNX dim_param) stay dynamic. A node with no graph\n"
               "form is named in the error; `fathom run` still runs such a model.\n");
}

int fm_cmd_import(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { import_usage(stdout); return 0; }
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) {
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
    fm_graph *g = m ? fm_onnx_to_graph(m) : NULL;
    int rc = 0;
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
