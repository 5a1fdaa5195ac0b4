/* The KServe v2 inference request and response bodies: JSON tensors and the
 * binary tensor data extension (the JSON part's length in the header
 * Inference-Header-Content-Length, raw little-endian tensor bytes after it).
 * Every function here only parses and checks: it never trusts a size from the
 * request before comparing it with what arrived. tests/fuzz/fuzz_infer_request.c
 * drives them. Errors come back as an HTTP status (400) and a message. */
#ifndef FATHOM_SERVE_INFER_CODEC_H
#define FATHOM_SERVE_INFER_CODEC_H
#include <jansson.h>

#include "serve/model_config.h"
#include "serve/shm.h"

typedef struct fm_infer_input {
    char name[FM_SERVE_NAME_MAX];
    fm_dtype dtype;
    int ndim;
    int64_t shape[FM_MAX_DIMS];
    int64_t numel;
    const json_t *data;       /* JSON data (borrowed from root), or NULL */
    const unsigned char *bin; /* binary data (borrowed from the body, or shm_copy), or NULL */
    size_t bin_len;
    char shm_region[FM_SERVE_NAME_MAX]; /* parameters.shared_memory_region: the data is there ("": not) */
    int64_t shm_offset;
    unsigned char *shm_copy;  /* the region's bytes, copied by fm_infer_resolve_shm (owned) */
} fm_infer_input;

typedef struct fm_infer_request {
    json_t *root;
    const char *id;           /* borrowed from root; NULL when absent */
    int n_inputs;
    fm_infer_input inputs[FM_SERVE_MAX_IO];
    int n_outputs;            /* requested outputs (0: all) */
    char outputs[FM_SERVE_MAX_IO][FM_SERVE_NAME_MAX];
    bool output_binary[FM_SERVE_MAX_IO];
    int64_t output_class[FM_SERVE_MAX_IO]; /* parameters.classification: the top K as BYTES "value:index[:label]"; 0: off */
    char output_shm[FM_SERVE_MAX_IO][FM_SERVE_NAME_MAX]; /* shared_memory_region to write the output to ("": none) */
    int64_t output_shm_offset[FM_SERVE_MAX_IO], output_shm_size[FM_SERVE_MAX_IO];
    fm_shm_registry *shm;     /* the server's regions (fm_infer_resolve_shm) */
    bool binary_output;       /* parameters.binary_data_output */
    int64_t timeout_us;       /* parameters.timeout; 0: none */
} fm_infer_request;

/* header_len: Inference-Header-Content-Length, or -1 when absent. Returns 0 or
 * an HTTP status with `err` set; free with fm_infer_request_free either way. */
int fm_infer_parse(const void *body, size_t len, long long header_len, fm_infer_request *out, char *err, size_t errn);
void fm_infer_request_free(fm_infer_request *r);
/* Copies the inputs given as shared memory regions out of `shm` (NULL: the server
 * has none; any region named is then a 400) and keeps `shm` for the outputs. */
int fm_infer_resolve_shm(fm_infer_request *r, fm_shm_registry *shm, char *err, size_t errn);
/* Checks the inputs against the model (names, datatypes, shapes, batch size) and
 * makes one [rows, ...] tensor per model input, in the config's order. */
int fm_infer_make_inputs(const fm_infer_request *r, const fm_model_config *c, fm_tensor **in, int64_t *rows, char *err,
                         size_t errn);
/* Checks the requested output names (before running). */
int fm_infer_check_outputs(const fm_infer_request *r, const fm_model_config *c, char *err, size_t errn);
/* The response body (malloc'd): JSON, then binary outputs when any were asked for
 * (*json_len is then the JSON part's length, else 0). labels: per model output (NULL:
 * none), for the classification extension. */
int fm_infer_make_response(const fm_infer_request *r, const fm_model_config *c, const fm_serve_labels *labels,
                           const char *model, int64_t version, fm_tensor *const *out, char **body, size_t *len,
                           size_t *json_len, char *err, size_t errn);
#endif
