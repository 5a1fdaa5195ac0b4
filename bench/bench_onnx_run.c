/* One ONNX model on fathom, the fathom side of bench/bench_onnx.py: the
 * interpreter (fm_onnx_run, what `fathom run` does) and the compiled inference
 * graph (fm_onnx_to_graph + fm_graph_compile, what `fathom compile` writes), on
 * the same input, as alternating rounds so machine load hits both alike.
 *   build/bench_onnx_run MODEL.onnx INPUT.npy [ROUNDS]
 * One JSON line: median and best milliseconds per run of each side; the graph
 * side is "refused" (with the reason) when the model has no graph form. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fathom/data.h"
#include "fathom/graph.h"
#include "fathom/onnx.h"

static int fail(const char *what) {
    fprintf(stderr, "bench_onnx_run: %s: %s\n", what, fm_last_error());
    return 1;
}

static fm_status run_interp(fm_onnx_model *m, fm_tensor *x) {
    fm_tensor *y[8] = {0};
    if (fm_onnx_output_count(m) > 8) return FM_ERR_INVALID;
    fm_status st = fm_onnx_run(m, 1, NULL, &x, y);
    for (int i = 0; i < 8; i++) fm_tensor_release(y[i]);
    return st;
}

static fm_status run_graph(const fm_graph *g, fm_tensor *x) {
    fm_tensor *y = fm_graph_run1(g, x);
    fm_status st = y ? FM_OK : fm_last_status();
    fm_tensor_release(y);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: bench_onnx_run MODEL.onnx INPUT.npy [ROUNDS]\n"); return 2; }
    int rounds = argc > 3 ? atoi(argv[3]) : 20;
    if (rounds < 1 || rounds > 1000) { fprintf(stderr, "bench_onnx_run: ROUNDS must be 1..1000\n"); return 2; }
    fm_onnx_model *m = fm_onnx_load(argv[1]);
    if (!m) return fail(argv[1]);
    fm_tensor *x = fm_npy_read(argv[2]);
    if (!x) { fm_onnx_free(m); return fail(argv[2]); }
    if (fm_onnx_input_count(m) != 1) {
        fprintf(stderr, "bench_onnx_run: %s has %d inputs; this bench feeds one\n", argv[1], fm_onnx_input_count(m));
        return 1;
    }
    fm_graph *g = fm_onnx_to_graph(m), *c = NULL;
    char why[256] = "";
    if (g) {
        fm_compile_report rep;
        c = fm_graph_compile(g, &rep);
    }
    if (!c) snprintf(why, sizeof why, "%s", fm_last_error());
    double *t[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
    if (!t[0] || !t[1]) return 1;
    if (run_interp(m, x) || (c && run_graph(c, x))) return fail("warm-up run"); /* warm-up */
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now_ms();
        if (run_interp(m, x)) return fail("fm_onnx_run");
        t[0][r] = bench_now_ms() - t0;
        if (!c) continue;
        t0 = bench_now_ms();
        if (run_graph(c, x)) return fail("fm_graph_run");
        t[1][r] = bench_now_ms() - t0;
    }
    double mi = bench_median(t[0], rounds);
    printf("{\"impl\": \"fathom\", \"interp_ms\": %.4f, \"interp_best_ms\": %.4f", mi, t[0][0]);
    if (c) {
        double mg = bench_median(t[1], rounds);
        printf(", \"graph_ms\": %.4f, \"graph_best_ms\": %.4f}\n", mg, t[1][0]);
    } else {
        for (char *p = why; *p; p++)
            if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) *p = ' ';
        printf(", \"graph\": \"refused: %s\"}\n", why);
    }
    free(t[0]);
    free(t[1]);
    fm_graph_free(c);
    fm_graph_free(g);
    fm_tensor_release(x);
    fm_onnx_free(m);
    return 0;
}
