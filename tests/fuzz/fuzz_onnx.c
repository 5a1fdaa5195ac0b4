/* The ONNX decoder and loader (src/onnx): the input as a model file (decode, the
 * nesting check, initializers, declared-shape checks, the op table) and, when it
 * loads, one run on zero inputs of its declared shapes (dynamic dims 1) and the
 * import into the inference graph (fm_onnx_to_graph: its probe runs, the
 * folding, the pattern matches and each node's translation; under 4 MiB), under a
 * 256 MiB memory limit; the same bytes as a TensorProto (.pb). */
#include "fathom/memory.h"
#include "fathom/onnx.h"
#include "fuzz_util.h"

static void run_once(fm_onnx_model *m) {
    int n = fm_onnx_input_count(m), nout = fm_onnx_output_count(m);
    if (n > 16 || nout > 16) return;
    fm_tensor *in[16] = {0}, *out[16] = {0};
    for (int i = 0; i < n; i++) {
        int64_t one = 1;
        in[i] = fm_tensor_zeros(1, &one, FM_F32, FM_CPU); /* the declared-shape check refuses most; that path counts too */
    }
    if (fm_onnx_run(m, n, NULL, in, out) == FM_OK)
        for (int i = 0; i < nout; i++) fm_tensor_release(out[i]);
    for (int i = 0; i < n; i++) fm_tensor_release(in[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int configured;
    if (!configured) {
        fm_memory_config cfg = {.mode = FM_MEMORY_GROW, .limit = (size_t)256 << 20};
        fm_memory_configure(FM_CPU, &cfg);
        configured = 1;
    }
    const char *path = fuzz_file(data, size, ".onnx");
    fm_onnx_model *m = fm_onnx_load(path);
    if (m) fm_onnx_set_max_iterations(m, 64); /* a Loop the input makes endless (or long) stops there */
    if (m) run_once(m);
    /* the import runs the model two or three times: under a 4 MiB limit, so that inputs
     * declared large (seconds of compute under the sanitizers) fail fast and the
     * executions go to the import's own code */
    fm_memory_set_limit(FM_CPU, (size_t)4 << 20);
    fm_graph_free(m ? fm_onnx_to_graph(m) : NULL);
    fm_memory_set_limit(FM_CPU, (size_t)256 << 20);
    fm_onnx_free(m);
    fm_tensor_release(fm_onnx_read_tensor(path));
    fm_clear_error();
    return 0;
}
