/* A servable: one loaded copy of a model that the server can run batches on.
 * The server needs only its metadata (named inputs and outputs, each with a
 * dtype and per-sample dims after a dynamic batch dim) and `run`. Each batcher
 * instance owns its own servable, so `run` is never called concurrently on one.
 * Loaders: an inference graph directory or an ONNX file (servable_graph.c) and a
 * model directory written by `fathom train` (servable_recipe.c). */
#ifndef FATHOM_SERVE_SERVABLE_H
#define FATHOM_SERVE_SERVABLE_H
#include "fathom/tensor.h"

#define FM_SERVE_MAX_IO 8
#define FM_SERVE_NAME_MAX 64

typedef struct fm_serve_io {
    char name[FM_SERVE_NAME_MAX];
    fm_dtype dtype;
    int ndim;                       /* per sample: without the batch dim (unbatched: the whole shape) */
    int64_t dims[FM_MAX_DIMS - 1];  /* -1: any size */
    int64_t id_limit;               /* integer token ids: each must be in [0, id_limit), checked per
                                       request (400) before it is batched; 0: no check */
    bool has_reshape;               /* the config's "reshape": the model's shape of what the client sends as
                                       dims (after the batch dim when batched; [] is a scalar per sample) */
    int reshape_ndim;
    int64_t reshape[FM_MAX_DIMS - 1];
    char label_file[64];            /* an output's config "label_filename" (in the model folder): the
                                       classification extension's labels, one per line; "": none */
} fm_serve_io;

/* An output's labels (label_filename's lines), for the classification extension. */
typedef struct fm_serve_labels {
    char *text;         /* the file, its newlines made NULs */
    const char **line;  /* n labels into text */
    int64_t n;
} fm_serve_labels;

typedef struct fm_servable fm_servable;
struct fm_servable {
    const char *platform; /* reported as the model's platform, e.g. "fathom_recipe" */
    /* Triton's max_batch_size 0: the inputs and outputs are whole tensors (dims hold
     * every dim) and each request runs alone, as it came. A graph or ONNX model with
     * an input or output whose first dim is fixed is served so; any model is when
     * its config says max_batch_size 0 (fm_servable_unbatch). */
    bool unbatched;
    int n_inputs, n_outputs;
    fm_serve_io inputs[FM_SERVE_MAX_IO], outputs[FM_SERVE_MAX_IO];
    /* inputs[i]: [B, dims...] contiguous host tensors in declaration order; sets
     * outputs[j] to new [B, ...] host tensors. Returns FM_OK or an error (fm_last_error). */
    fm_status (*run)(fm_servable *s, fm_tensor *const *inputs, fm_tensor **outputs);
    void (*free)(fm_servable *s);
    void *impl;
};

/* Opens the model in a version directory (DIR/<model>/<version>/) on `dev`:
 * an inference graph directory, an ONNX file (onnx_file, default model.onnx) or
 * a model written by `fathom train`, in that order. With `platform` (from the
 * config; NULL or "": any) the folder must hold that kind. An ONNX file's dynamic
 * dims that the config's declared inputs (decl, n_decl: per sample, as
 * fm_serve_io; whole shapes when decl_unbatched) give a size are fixed to it before the import (fm_onnx_set_input_dim):
 * an exported BERT's sequence length, for one. NULL with
 * fm_last_error() set when no loader recognises it or loading fails. */
fm_servable *fm_servable_open(const char *version_dir, fm_device dev, const char *platform, const char *onnx_file,
                              const fm_serve_io *decl, int n_decl, bool decl_unbatched);
/* Makes a batched servable's metadata whole shapes (-1 first: any batch), for a
 * config with max_batch_size 0. */
fm_status fm_servable_unbatch(fm_servable *s, const char *where);
/* The platform of what the folder holds ("fathom_graph", "fathom_onnx", "fathom_recipe"), NULL if none. */
const char *fm_serve_platform_find(const char *version_dir, const char *onnx_file);
void fm_servable_free(fm_servable *s);

/* KServe v2 datatype names ("FP32", ...) for fathom dtypes, and back. */
const char *fm_serve_dtype_name(fm_dtype dt);
/* Returns false for names fathom has no dtype for (UINT16, BYTES, ...) and unknown ones. */
bool fm_serve_dtype_parse(const char *name, fm_dtype *out);
/* Triton's model-config spelling: "TYPE_FP32". */
const char *fm_serve_config_dtype_name(fm_dtype dt);
#endif
