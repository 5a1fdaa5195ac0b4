/* The servable for an inference graph directory (graph.json + weights.safetensors,
 * include/fathom/graph.h): what the ONNX importer and `fathom compile` write; and
 * for an .onnx file, imported into that graph when it loads (or, when the import
 * refuses it, run by the ONNX interpreter).
 * When every input and output has a dynamic first dimension, the server batches
 * on it and the other dims are reported as declared (-1 where dynamic); when one
 * has a fixed first dim (an export at batch 1), the model is served unbatched
 * (Triton's max_batch_size 0): whole shapes, one request per run. An integer input that
 * indexes an embedding table on a constant gets the table's rows as its id_limit.
 * On a GPU the graph's
 * outputs are copied back to the host for the response. */
#include <stdlib.h>
#include <string.h>

#include "fathom/graph.h"
#include "fathom/onnx.h"
#include "serve/servable.h"

/* The outputs of a device run copied to the host for the response (all released on an error). */
static fm_status outputs_to_host(const fm_servable *s, fm_tensor **out) {
    fm_status st = FM_OK;
    for (int j = 0; j < s->n_outputs; j++) {
        fm_tensor *h = st == FM_OK ? fm_tensor_to(out[j], FM_CPU) : NULL;
        if (!h) st = fm_last_status();
        fm_tensor_release(out[j]);
        out[j] = h;
    }
    if (st)
        for (int j = 0; j < s->n_outputs; j++) { fm_tensor_release(out[j]); out[j] = NULL; }
    return st;
}

static fm_status graph_run(fm_servable *s, fm_tensor *const *in, fm_tensor **out) {
    fm_graph *g = s->impl;
    if (fm_graph_run(g, in, out) != FM_OK) return fm_last_status();
    return fm_graph_device(g).type == FM_DEV_CPU ? FM_OK : outputs_to_host(s, out);
}

static void graph_free(fm_servable *s) {
    fm_graph_free(s->impl);
    free(s);
}

/* One input or output's metadata: the dims after the batch, or (unbatched) every dim. */
static fm_status describe(fm_serve_io *io, const fm_graph_io *gi, const char *dir, const char *what, bool unbatched) {
    if (strlen(gi->name) >= FM_SERVE_NAME_MAX)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s name '%.80s...' is over %d characters", dir, what, gi->name,
                            FM_SERVE_NAME_MAX - 1);
    if (gi->ndim < 1 || (unbatched && gi->ndim > FM_MAX_DIMS - 1))
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s '%s' has %d dims; the server takes 1 to %d", dir, what, gi->name,
                            gi->ndim, FM_MAX_DIMS - 1);
    strcpy(io->name, gi->name);
    io->dtype = gi->dtype;
    int skip = unbatched ? 0 : 1;
    io->ndim = gi->ndim - skip;
    for (int d = skip; d < gi->ndim; d++) io->dims[d - skip] = gi->shape[d] == FM_DIM_DYNAMIC ? -1 : gi->shape[d];
    return FM_OK;
}

/* Batched (every input and output has a dynamic first dim: the server batches on
 * it) or not (Triton's max_batch_size 0: a first dim is fixed, e.g. an export at
 * batch 1). info(i) gives input i, then the outputs after n_in. */
typedef fm_status (*io_info_fn)(const void *model, int i, fm_graph_io *out);

static fm_status describe_all(fm_servable *s, const void *model, io_info_fn info, const char *dir) {
    fm_graph_io gi;
    bool unbatched = false;
    for (int k = 0; k < s->n_inputs + s->n_outputs; k++) {
        if (info(model, k, &gi)) return fm_last_status();
        unbatched |= gi.ndim < 1 || gi.shape[0] != FM_DIM_DYNAMIC;
    }
    s->unbatched = unbatched;
    for (int k = 0; k < s->n_inputs + s->n_outputs; k++) {
        bool in = k < s->n_inputs;
        if (info(model, k, &gi) ||
            describe(in ? &s->inputs[k] : &s->outputs[k - s->n_inputs], &gi, dir, in ? "input" : "output", unbatched))
            return fm_last_status();
    }
    return FM_OK;
}

static fm_status graph_io_info(const void *model, int k, fm_graph_io *out) {
    const fm_graph *g = model;
    int n_in = fm_graph_num_inputs(g);
    return k < n_in ? fm_graph_input_info(g, k, out) : fm_graph_output_info(g, k - n_in, out);
}

static fm_status onnx_io_info(const void *model, int k, fm_graph_io *out) {
    const fm_onnx_model *m = model;
    int n_in = fm_onnx_input_count(m);
    return k < n_in ? fm_onnx_input_info(m, k, out) : fm_onnx_output_info(m, k - n_in, out);
}

/* Wraps a loaded graph (the servable owns it from here). */
static fm_servable *from_graph(fm_graph *g, const char *dir, fm_device dev, const char *platform) {
    fm_servable *s = calloc(1, sizeof *s);
    if (!s) { fm_graph_free(g); fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    s->impl = g;
    s->platform = platform;
    s->run = graph_run;
    s->free = graph_free;
    s->n_inputs = fm_graph_num_inputs(g);
    s->n_outputs = fm_graph_num_outputs(g);
    fm_status st = FM_OK;
    if (s->n_inputs > FM_SERVE_MAX_IO || s->n_outputs > FM_SERVE_MAX_IO)
        st = fm_set_error(FM_ERR_UNSUPPORTED, "%s: the graph has %d inputs and %d outputs; the server takes at most %d of each",
                          dir, s->n_inputs, s->n_outputs, FM_SERVE_MAX_IO);
    if (!st) st = describe_all(s, g, graph_io_info, dir);
    /* ids that index an embedding table are checked per request (infer_codec.c): an id
     * out of range is that request's 400 instead of failing the batch it joins */
    for (int i = 0; i < s->n_inputs && !st; i++)
        if (s->inputs[i].dtype == FM_I64 || s->inputs[i].dtype == FM_I32) s->inputs[i].id_limit = fm_graph_input_id_limit(g, i);
    if (!st && dev.type != FM_DEV_CPU) st = fm_graph_to_device(g, dev);
    if (st) { graph_free(s); return NULL; }
    return s;
}

fm_servable *fm_servable_open_graph(const char *dir, fm_device dev);
fm_servable *fm_servable_open_graph(const char *dir, fm_device dev) {
    fm_graph *g = fm_graph_load(dir);
    return g ? from_graph(g, dir, dev, "fathom_graph") : NULL;
}

/* ---- an ONNX file the graph import refuses: run by the interpreter ---- */

typedef struct { fm_onnx_model *m; fm_device dev; } onnx_servable;

static fm_status onnx_run_batch(fm_servable *s, fm_tensor *const *in, fm_tensor **out) {
    onnx_servable *o = s->impl;
    fm_tensor *din[FM_SERVE_MAX_IO] = {0};
    const bool cpu = o->dev.type == FM_DEV_CPU;
    fm_status st = FM_OK;
    for (int i = 0; !cpu && i < s->n_inputs && !st; i++)
        if (!(din[i] = fm_tensor_to(in[i], o->dev))) st = fm_last_status();
    if (!st) st = fm_onnx_run(o->m, s->n_inputs, NULL, cpu ? in : din, out);
    for (int i = 0; i < s->n_inputs; i++) fm_tensor_release(din[i]);
    return st || cpu ? st : outputs_to_host(s, out);
}

static void onnx_servable_free(fm_servable *s) {
    onnx_servable *o = s->impl;
    if (o) fm_onnx_free(o->m);
    free(o);
    free(s);
}

/* Wraps a loaded model (owned from here) for the interpreter; NULL with the error set. */
static fm_servable *from_onnx_interpreter(fm_onnx_model *m, const char *path, fm_device dev) {
    fm_servable *s = calloc(1, sizeof *s);
    onnx_servable *o = s ? calloc(1, sizeof *o) : NULL;
    if (!o) { free(s); fm_onnx_free(m); fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    o->m = m, o->dev = dev;
    s->impl = o;
    s->platform = "fathom_onnx";
    s->run = onnx_run_batch;
    s->free = onnx_servable_free;
    s->n_inputs = fm_onnx_input_count(m);
    s->n_outputs = fm_onnx_output_count(m);
    fm_status st = FM_OK;
    if (s->n_inputs > FM_SERVE_MAX_IO || s->n_outputs > FM_SERVE_MAX_IO)
        st = fm_set_error(FM_ERR_UNSUPPORTED, "%s: the model has %d inputs and %d outputs; the server takes at most %d of each",
                          path, s->n_inputs, s->n_outputs, FM_SERVE_MAX_IO);
    if (!st) st = describe_all(s, m, onnx_io_info, path);
    if (st) { onnx_servable_free(s); return NULL; }
    return s;
}

/* An ONNX file, imported into the inference graph at load (fm_onnx_to_graph), so
 * it runs as a graph directory would: batched on its dynamic first dimension. The
 * sizes the config declares for the other dims fix them first (per sample: dim i
 * of a declared input is the model's dim i + 1; with max_batch_size 0, dim i). A model the import refuses (an op
 * with no graph form: If, Loop, Scan, the recurrent ops, data-dependent shapes) is
 * served by the ONNX interpreter instead, as `fathom run` runs it: the same outputs,
 * without the graph's fusions and memory plan. */
fm_servable *fm_servable_open_onnx(const char *path, fm_device dev, const fm_serve_io *decl, int n_decl,
                                   bool decl_unbatched);
fm_servable *fm_servable_open_onnx(const char *path, fm_device dev, const fm_serve_io *decl, int n_decl,
                                   bool decl_unbatched) {
    const int first = decl_unbatched ? 0 : 1; /* the model dim of the config's dims[0] */
    fm_onnx_model *m = fm_onnx_load(path);
    bool ok = m != NULL;
    for (int i = 0; ok && i < n_decl; i++) { /* the model's sizes: the reshape when the config gives one */
        const int nd = decl[i].has_reshape ? decl[i].reshape_ndim : decl[i].ndim;
        const int64_t *dd = decl[i].has_reshape ? decl[i].reshape : decl[i].dims;
        for (int d = 0; ok && d < nd; d++)
            if (dd[d] >= 1 && fm_onnx_set_input_dim(m, decl[i].name, d + first, dd[d])) {
                fm_error_prefix("the config's input '%s' %s[%d] = %lld", decl[i].name, decl[i].has_reshape ? "reshape.shape" : "dims",
                                d, (long long)dd[d]);
                ok = false;
            }
    }
    fm_graph *g = ok ? fm_onnx_to_graph(m) : NULL;
    if (g || !ok) {
        fm_onnx_free(m);
        return g ? from_graph(g, path, dev, "fathom_onnx") : NULL;
    }
    char why[768];
    snprintf(why, sizeof why, "%s", fm_last_error());
    fm_servable *s = from_onnx_interpreter(m, path, dev);
    if (!s) fm_error_prefix("%s: its graph import refused it (%s), and the ONNX interpreter cannot serve it either", path, why);
    return s;
}
