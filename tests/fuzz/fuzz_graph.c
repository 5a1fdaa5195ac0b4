/* Graph directories (src/graph): the input is graph.json; weights.safetensors
 * is a fixed file (graph_weights.h: f32 "w" and "b", and tables for the quantized
 * ops), so fuzzed graphs can use constants; every seed declares all eight
 * (tests/data/graph). A graph that loads is also run on zeros (dynamic dims at
 * 2), when its values are small, so the checks in front of every op front end
 * are exercised too; twice, and the second run (the one the runner's arena plans
 * and places) must give the same outputs; and the structural passes that read the graph's producers
 * and value types (fold-reshape, cse, dce) run on it; their result is freed. */
#include <sys/stat.h>

#include "fathom/graph.h"
#include "fathom/io.h"
#include "fathom/ops.h"
#include "fuzz_util.h"
#include "graph_weights.h"

static char g_dir[512];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/fathom_fuzz_graph_%ld", fuzz_dir(), (long)getpid());
    mkdir(g_dir, 0755);
    char p[600];
    snprintf(p, sizeof p, "%s/weights.safetensors", g_dir);
    if (graph_weights_save(p) != FM_OK) abort();
}

/* The same shape and the same values (NaN equal to NaN). */
static bool same_values(const fm_tensor *a, const fm_tensor *b) {
    if (a->ndim != b->ndim || a->dtype != b->dtype || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim)) return false;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) {
        double x = fm_tensor_get(a, i), y = fm_tensor_get(b, i);
        if (x != y && !(x != x && y != y)) return false;
    }
    return true;
}

static void run_once(fm_graph *g) {
    int n = fm_graph_num_inputs(g);
    fm_tensor *in[16] = {0}, *out[16] = {0};
    if (n > 16 || fm_graph_num_outputs(g) > 16) return;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        fm_graph_io io;
        int64_t sh[FM_MAX_DIMS], numel = 1;
        fm_graph_input_info(g, i, &io);
        for (int d = 0; d < io.ndim; d++) {
            sh[d] = io.shape[d] < 0 ? 2 : io.shape[d];
            numel *= sh[d] ? sh[d] : 1;
            if (numel > 4096) ok = false;
        }
        in[i] = ok ? fm_tensor_zeros(io.ndim, sh, io.dtype, FM_CPU) : NULL;
        ok = in[i] != NULL;
    }
    for (int i = 0; ok && i < fm_graph_num_outputs(g); i++) {
        fm_graph_io io;
        int64_t numel = 1;
        fm_graph_output_info(g, i, &io);
        for (int d = 0; d < io.ndim; d++) numel *= io.shape[d] < 0 ? 64 : io.shape[d] ? io.shape[d] : 1;
        if (numel > 65536) ok = false;
    }
    if (ok && fm_graph_run(g, in, out) == FM_OK) {
        fm_tensor *again[16] = {0};
        if (fm_graph_run(g, in, again) != FM_OK) abort(); /* the shape's second run: in the planned arena */
        for (int i = 0; i < fm_graph_num_outputs(g); i++) {
            if (!same_values(out[i], again[i])) abort();
            fm_tensor_release(out[i]);
            fm_tensor_release(again[i]);
        }
    }
    for (int i = 0; i < n; i++) fm_tensor_release(in[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) setup();
    char p[600];
    snprintf(p, sizeof p, "%s/graph.json", g_dir);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    fm_graph *g = fm_graph_load(g_dir);
    if (g) run_once(g);
    const char *passes[3] = {"fold-reshape", "cse", "dce"};
    for (int i = 0; g && i < 3; i++) fm_graph_free(fm_graph_pass(g, passes[i], NULL, 0));
    fm_graph_free(g);
    fm_clear_error();
    return 0;
}
