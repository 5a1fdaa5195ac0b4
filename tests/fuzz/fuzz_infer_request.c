/* The inference server's request parser and response writer
 * (src/serve/infer_codec.c): the first 4 bytes give Inference-Header-Content-Length
 * (all ones: absent), the rest is the body. Parsed requests are checked against a
 * model with an FP32 [-1, 2, -1] input and an INT64 [3] input, turned into tensors,
 * and echoed back as outputs in JSON and binary form (or as the classification
 * extension's top K, output x with two labels). */
#include "fathom/tensor.h"
#include "fuzz_util.h"
#include "serve/infer_codec.h"

static void setup(fm_model_config *c) {
    fm_model_config_init(c, "fuzz");
    c->max_batch_size = 8;
    c->n_inputs = c->n_outputs = 2;
    c->inputs[0] = (fm_serve_io){.name = "x", .dtype = FM_F32, .ndim = 2, .dims = {2, -1}};
    c->inputs[1] = (fm_serve_io){.name = "ids", .dtype = FM_I64, .ndim = 1, .dims = {3}, .id_limit = 1000}; /* token ids: checked per request */
    c->outputs[0] = c->inputs[0];
    c->outputs[1] = c->inputs[1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    uint32_t hl = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    long long header_len = hl == 0xffffffffu ? -1 : (long long)hl;
    fm_model_config c;
    setup(&c);
    fm_infer_request r;
    char err[512];
    fm_tensor *in[FM_SERVE_MAX_IO] = {0};
    int64_t rows = 0;
    int st = fm_infer_parse(data + 4, size - 4, header_len, &r, err, sizeof err);
    if (!st) st = fm_infer_resolve_shm(&r, NULL, err, sizeof err); /* regions named: refused (none registered) */
    if (!st) st = fm_infer_check_outputs(&r, &c, err, sizeof err);
    if (!st) st = fm_infer_make_inputs(&r, &c, in, &rows, err, sizeof err);
    if (!st) {
        char *body = NULL;
        size_t len = 0, jlen = 0;
        const char *names[] = {"first", "second"};
        fm_serve_labels labels[FM_SERVE_MAX_IO] = {{.line = names, .n = 2}};
        if (!fm_infer_make_response(&r, &c, labels, "fuzz", 1, in, &body, &len, &jlen, err, sizeof err)) {
            if (jlen > len) abort();
            free(body);
        }
    }
    for (int i = 0; i < FM_SERVE_MAX_IO; i++) fm_tensor_release(in[i]);
    fm_infer_request_free(&r);
    fm_clear_error();
    return 0;
}
