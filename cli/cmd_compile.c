/* `fathom compile MODEL_DIR|MODEL.onnx -o OUT_DIR [--report] [--batch N] [--no-passes]`:
 * the model's inference graph (traced from a recipe model, or the GPT's
 * KV-cache graph), optimized by the passes (docs/GRAPH.md), checked against the
 * uncompiled graph, and written as a graph directory that predict, eval and
 * generate run. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "gpt_dir.h"
#include "fathom/graph.h"
#include "fathom/memory.h"
#include "fathom/onnx.h"

static void usage(FILE *f) {
    fprintf(f, "usage: fathom compile MODEL_DIR|MODEL.onnx -o OUT_DIR [--report] [--batch N] [--no-passes]\n"
               "                      [--dim NAME=SIZE ...]\n\n"
               "Makes an inference graph of a trained model or an ONNX file (or recompiles a graph directory),\n"
               "runs the optimization passes, and writes OUT_DIR (graph.json + weights.safetensors).\n\n"
               "  --report      print each pass's effect and the memory plan\n"
               "  --batch N     batch size the memory plan is made for (default: the graph's hint)\n"
               "  --no-passes   write the graph as traced, unoptimized\n"
               "  --dim NAME=SIZE  (an ONNX file) fix its dynamic input dim NAME to SIZE, as `fathom import`\n"
               "                does; repeatable\n");
}

static void print_plan(const char *what, const fm_memory_plan *p) {
    char a[32], b[32], c[32], d[32], e[32];
    printf("  %-9s %s all intermediates, %s live peak, %s planned arena (%d values); a CPU run: %s block + %s outputs%s\n", what,
           fm_format_bytes(p->naive_bytes, a, sizeof a), fm_format_bytes(p->live_peak_bytes, b, sizeof b),
           fm_format_bytes(p->planned_bytes, c, sizeof c), p->n_values, fm_format_bytes(p->run_arena_bytes, d, sizeof d),
           fm_format_bytes(p->output_bytes, e, sizeof e), p->run_uses_arena ? "" : " (too much above the live peak: it allocates per value)");
}

static void print_report(const fm_compile_report *r, const fm_memory_plan *before, const fm_memory_plan *after) {
    printf("%-22s %13s %13s %8s  %s\n", "pass", "nodes", "constants", "ms", "effect");
    for (int i = 0; i < r->n_passes; i++) {
        const fm_compile_pass_report *p = &r->passes[i];
        char nodes[32], consts[32];
        snprintf(nodes, sizeof nodes, "%d -> %d", p->nodes_before, p->nodes_after);
        snprintf(consts, sizeof consts, "%d -> %d", p->consts_before, p->consts_after);
        printf("%-22s %13s %13s %8.1f  %s\n", p->name, nodes, consts, 1e3 * p->seconds, p->note);
    }
    printf("check: compiled vs uncompiled outputs on random inputs: max relative difference %.3g (limit 1e-4)\n", r->max_rel_diff);
    printf("memory plan (batch %lld):\n", (long long)before->batch);
    print_plan("traced", before);
    print_plan("compiled", after);
    printf("  (\"live peak\" is what running node by node and freeing each value after its last reader needs;\n"
           "   on the CPU, runs from the second at a shape take the planned block in one allocation: docs/GRAPH.md)\n");
}

int fm_cmd_compile(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    bool report = false, passes = true;
    long long batch = 0;
    char *dims[16];
    int n_dims = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--report")) report = true;
        else if (!strcmp(a, "--no-passes")) passes = false;
        else if (!strcmp(a, "--dim") && i + 1 < argc && n_dims < 16) dims[n_dims++] = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--out")) && i + 1 < argc) out = argv[++i];
        else if (!strcmp(a, "--batch") && i + 1 < argc) { if (!fm_cli_parse_int_range("compile", a, argv[++i], 1, 1 << 20, &batch)) return 2; }
        else if (a[0] != '-' && !in) in = a;
        else { fm_cli_error("compile: unknown or incomplete option '%s'", a); usage(stderr); return 2; }
    }
    if (!in || !out) { fm_cli_error("compile: %s", in ? "no output directory (-o OUT_DIR)" : "no model directory given"); usage(stderr); return 2; }
    const bool onnx = fm_cli_is_onnx(in);
    if (n_dims && !onnx) { fm_cli_error("compile: --dim applies to an ONNX file; %s is not one", in); return 2; }
    fm_onnx_model *om = onnx ? fm_onnx_load(in) : NULL; /* an ONNX file (docs/ONNX.md) */
    int drc = om ? fm_cli_onnx_dims("compile", om, n_dims, dims) : 0;
    if (drc) { fm_onnx_free(om); return drc; }
    fm_graph *g = om ? fm_onnx_to_graph(om) : onnx ? NULL : fm_cli_graph_from_dir(in);
    fm_onnx_free(om);
    if (!g) { fm_cli_error("%s", fm_last_error()); return 1; }
    fm_compile_report rep;
    memset(&rep, 0, sizeof rep);
    fm_graph *c = passes ? fm_graph_compile(g, &rep) : NULL;
    int rc = 0;
    if (passes && !c) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    fm_memory_plan pb, pa;
    if (rc == 0 && (fm_graph_plan_memory(g, batch, &pb) || fm_graph_plan_memory(c ? c : g, batch, &pa))) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    if (rc == 0 && fm_graph_save(c ? c : g, out) != FM_OK) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    if (rc == 0) {
        if (report && passes) print_report(&rep, &pb, &pa);
        else if (report) print_plan("traced", &pb);
        printf("%s: %d nodes, %d constants -> %s\n", in, fm_graph_num_nodes(c ? c : g), fm_graph_num_consts(c ? c : g), out);
    }
    fm_graph_free(c);
    fm_graph_free(g);
    return rc;
}
