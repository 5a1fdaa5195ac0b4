/* `fathom export DIR -o model.onnx`: a model as an ONNX file (opset 17), through
 * the inference graph: DIR is a graph directory (`fathom import`, `fathom
 * compile`) or a trained model directory, traced into a graph first
 * (fm_graph_from_model_dir). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "fathom/graph.h"
#include "fathom/onnx.h"

static void export_usage(FILE *f) {
    fprintf(f, "usage: fathom export DIR -o MODEL.onnx\n\n"
               "Writes the model in DIR as an ONNX file (opset 17), atomically: DIR is a model\n"
               "trained by `fathom train` (traced into the inference graph first) or a graph\n"
               "directory (`fathom compile`, `fathom import`). The constants\n"
               "become initializers and dynamic dims stay dynamic (dim_param). An op with no\n"
               "ONNX form is named in the error and nothing is written.\n");
}

int fm_cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { export_usage(stdout); return 0; }
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) {
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
    if (!dir || !out) { fm_cli_error("export: %s", dir ? "no output file (-o MODEL.onnx)" : "no model directory given"); export_usage(stderr); return 2; }
    fm_graph *g = fm_graph_from_model_dir(dir); /* a graph directory, or a trained model traced */
    int rc = 0;
    if (!g || fm_graph_export_onnx(g, out)) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    else printf("%s -> %s: %d graph nodes, %d constants\n", dir, out, fm_graph_num_nodes(g), fm_graph_num_consts(g));
    fm_graph_free(g);
    return rc;
}
