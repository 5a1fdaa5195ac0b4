/* KServe v2 request parsing and response writing: see infer_codec.h. */
#include "serve/infer_codec.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/ops.h"

#define MAX_ELEMS (1LL << 31) /* elements per tensor in one request */

static int bad(char *err, size_t errn, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int bad(char *err, size_t errn, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return status;
}

void fm_infer_request_free(fm_infer_request *r) {
    json_decref(r->root);
    r->root = NULL;
    for (int i = 0; i < FM_SERVE_MAX_IO; i++) {
        free(r->inputs[i].shm_copy);
        r->inputs[i].shm_copy = NULL;
    }
}

/* parameters.shared_memory_region / _byte_size / _offset of an input or output:
 * *name stays "" when absent. */
static int parse_shm_params(const json_t *params, const char *what, const char *name, char *region, int64_t *size,
                            int64_t *offset, char *err, size_t errn) {
    const json_t *rj = json_is_object(params) ? json_object_get(params, "shared_memory_region") : NULL;
    if (!rj) return 0;
    const char *rn = json_string_value(rj);
    const json_t *bs = json_object_get(params, "shared_memory_byte_size"), *off = json_object_get(params, "shared_memory_offset");
    if (!rn || !*rn || strlen(rn) >= FM_SERVE_NAME_MAX)
        return bad(err, errn, 400, "%s '%s': \"shared_memory_region\" must name a registered region", what, name);
    if (!json_is_integer(bs) || json_integer_value(bs) < 0 || (off && (!json_is_integer(off) || json_integer_value(off) < 0)))
        return bad(err, errn, 400, "%s '%s': a shared memory region needs \"shared_memory_byte_size\" (and an optional "
                   "\"shared_memory_offset\"), whole numbers >= 0", what, name);
    snprintf(region, FM_SERVE_NAME_MAX, "%s", rn);
    *size = json_integer_value(bs);
    *offset = off ? json_integer_value(off) : 0;
    return 0;
}

int fm_infer_resolve_shm(fm_infer_request *r, fm_shm_registry *shm, char *err, size_t errn) {
    r->shm = shm;
    for (int i = 0; i < r->n_inputs; i++) {
        fm_infer_input *in = &r->inputs[i];
        if (!in->shm_region[0]) continue;
        if (!shm) return bad(err, errn, 400, "input '%s': shared memory is not available here", in->name);
        if (!(in->shm_copy = malloc(in->bin_len ? in->bin_len : 1))) return bad(err, errn, 500, "out of memory");
        int st = fm_shm_read(shm, in->shm_region, in->shm_offset, in->shm_copy, in->bin_len, err, errn);
        if (st) return st;
        in->bin = in->shm_copy;
    }
    for (int i = 0; i < r->n_outputs; i++)
        if (r->output_shm[i][0] && !shm) return bad(err, errn, 400, "output '%s': shared memory is not available here", r->outputs[i]);
    return 0;
}

static int parse_shape(fm_infer_input *in, const json_t *shape, char *err, size_t errn) {
    if (!json_is_array(shape) || json_array_size(shape) > FM_MAX_DIMS)
        return bad(err, errn, 400, "input '%s': \"shape\" must be an array of at most %d sizes", in->name, FM_MAX_DIMS);
    in->ndim = (int)json_array_size(shape);
    in->numel = 1;
    for (int d = 0; d < in->ndim; d++) {
        const json_t *v = json_array_get(shape, (size_t)d);
        if (!json_is_integer(v)) return bad(err, errn, 400, "input '%s': shape[%d] is not a whole number", in->name, d);
        json_int_t x = json_integer_value(v);
        if (x < 0) return bad(err, errn, 400, "input '%s': shape[%d] is %lld; sizes must be >= 0", in->name, d, (long long)x);
        if (x > MAX_ELEMS || (x && in->numel > MAX_ELEMS / x))
            return bad(err, errn, 400, "input '%s': shape has over 2^31 elements", in->name);
        in->shape[d] = x;
        in->numel *= x;
    }
    return 0;
}

static int parse_input(fm_infer_input *in, const json_t *j, int64_t *bin_size, char *err, size_t errn) {
    if (!json_is_object(j)) return bad(err, errn, 400, "each entry of \"inputs\" must be an object");
    const char *name = json_string_value(json_object_get(j, "name"));
    if (!name || !*name || strlen(name) >= FM_SERVE_NAME_MAX)
        return bad(err, errn, 400, "each input needs a \"name\" of 1-%d characters", FM_SERVE_NAME_MAX - 1);
    snprintf(in->name, sizeof in->name, "%s", name);
    const char *dt = json_string_value(json_object_get(j, "datatype"));
    if (!dt) return bad(err, errn, 400, "input '%s': \"datatype\" is missing", name);
    if (!fm_serve_dtype_parse(dt, &in->dtype) || !strncmp(dt, "TYPE_", 5))
        return bad(err, errn, 400, "input '%s': datatype '%.32s' is not supported (use BOOL, UINT8, INT8, INT32, INT64, FP16, "
                   "BF16, FP32 or FP64)", name, dt);
    const json_t *shape = json_object_get(j, "shape");
    if (!shape) return bad(err, errn, 400, "input '%s': \"shape\" is missing", name);
    int st = parse_shape(in, shape, err, errn);
    if (st) return st;
    const json_t *params = json_object_get(j, "parameters");
    const json_t *bs = json_is_object(params) ? json_object_get(params, "binary_data_size") : NULL;
    in->data = json_object_get(j, "data");
    *bin_size = -1;
    int64_t shm_size = 0;
    if ((st = parse_shm_params(params, "input", name, in->shm_region, &shm_size, &in->shm_offset, err, errn))) return st;
    if (in->shm_region[0]) {
        if (in->data || bs)
            return bad(err, errn, 400, "input '%s': give its data one way: a shared memory region, \"data\" or binary data", name);
        in->bin_len = (size_t)shm_size; /* its bytes arrive with fm_infer_resolve_shm */
    } else if (bs) {
        if (!json_is_integer(bs) || json_integer_value(bs) < 0)
            return bad(err, errn, 400, "input '%s': \"binary_data_size\" must be a whole number >= 0", name);
        if (in->data) return bad(err, errn, 400, "input '%s': has both \"data\" and \"binary_data_size\"", name);
        *bin_size = json_integer_value(bs);
    } else if (!json_is_array(in->data)) {
        return bad(err, errn, 400, "input '%s': needs \"data\" (an array) or parameters.binary_data_size", name);
    }
    return 0;
}

static int parse_outputs(fm_infer_request *r, const json_t *outs, char *err, size_t errn) {
    if (!outs) return 0;
    if (!json_is_array(outs) || json_array_size(outs) > FM_SERVE_MAX_IO)
        return bad(err, errn, 400, "\"outputs\" must be an array of at most %d objects", FM_SERVE_MAX_IO);
    r->n_outputs = (int)json_array_size(outs);
    for (int i = 0; i < r->n_outputs; i++) {
        const json_t *o = json_array_get(outs, (size_t)i);
        const char *name = json_string_value(json_object_get(o, "name"));
        if (!name || !*name || strlen(name) >= FM_SERVE_NAME_MAX)
            return bad(err, errn, 400, "each entry of \"outputs\" needs a \"name\" of 1-%d characters", FM_SERVE_NAME_MAX - 1);
        snprintf(r->outputs[i], FM_SERVE_NAME_MAX, "%s", name);
        const json_t *p = json_object_get(o, "parameters");
        const json_t *b = json_is_object(p) ? json_object_get(p, "binary_data") : NULL;
        if (b && !json_is_boolean(b)) return bad(err, errn, 400, "output '%s': \"binary_data\" must be true or false", name);
        r->output_binary[i] = b ? json_is_true(b) : r->binary_output;
        const json_t *k = json_is_object(p) ? json_object_get(p, "classification") : NULL;
        if (k && (!json_is_integer(k) || json_integer_value(k) < 1 || json_integer_value(k) > (1 << 20)))
            return bad(err, errn, 400, "output '%s': \"classification\" must be a whole number of classes >= 1", name);
        r->output_class[i] = k ? json_integer_value(k) : 0;
        int st = parse_shm_params(p, "output", name, r->output_shm[i], &r->output_shm_size[i], &r->output_shm_offset[i], err, errn);
        if (st) return st;
        if (r->output_shm[i][0] && k)
            return bad(err, errn, 400, "output '%s': classification results are strings; they are not written to shared memory", name);
    }
    return 0;
}

static int parse_params(fm_infer_request *r, const json_t *p, char *err, size_t errn) {
    if (!p) return 0;
    if (!json_is_object(p)) return bad(err, errn, 400, "\"parameters\" must be an object");
    const json_t *b = json_object_get(p, "binary_data_output");
    if (b && !json_is_boolean(b)) return bad(err, errn, 400, "\"binary_data_output\" must be true or false");
    r->binary_output = b && json_is_true(b);
    const json_t *t = json_object_get(p, "timeout");
    if (t && (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > (1LL << 40)))
        return bad(err, errn, 400, "\"timeout\" must be a whole number of microseconds >= 0");
    r->timeout_us = t ? json_integer_value(t) : 0;
    return 0;
}

int fm_infer_parse(const void *body, size_t len, long long header_len, fm_infer_request *out, char *err, size_t errn) {
    memset(out, 0, sizeof *out);
    if (header_len >= 0 && (unsigned long long)header_len > len)
        return bad(err, errn, 400, "Inference-Header-Content-Length is %lld but the body has only %zu bytes", header_len, len);
    size_t jlen = header_len >= 0 ? (size_t)header_len : len;
    if (jlen == 0) return bad(err, errn, 400, "empty request body: expected a JSON object with \"inputs\"");
    json_error_t je;
    out->root = json_loadb(body, jlen, JSON_REJECT_DUPLICATES, &je);
    if (!out->root) return bad(err, errn, 400, "malformed JSON at line %d, column %d: %s", je.line, je.column, je.text);
    if (!json_is_object(out->root)) return bad(err, errn, 400, "the request body must be a JSON object");
    const json_t *id = json_object_get(out->root, "id");
    if (id && !json_is_string(id)) return bad(err, errn, 400, "\"id\" must be a string");
    out->id = id ? json_string_value(id) : NULL;
    int st = parse_params(out, json_object_get(out->root, "parameters"), err, errn);
    if (st || (st = parse_outputs(out, json_object_get(out->root, "outputs"), err, errn))) return st;
    const json_t *ins = json_object_get(out->root, "inputs");
    if (!json_is_array(ins) || json_array_size(ins) == 0 || json_array_size(ins) > FM_SERVE_MAX_IO)
        return bad(err, errn, 400, "\"inputs\" must be an array of 1 to %d tensors", FM_SERVE_MAX_IO);
    out->n_inputs = (int)json_array_size(ins);
    const unsigned char *bin = (const unsigned char *)body + jlen;
    size_t left = len - jlen;
    for (int i = 0; i < out->n_inputs; i++) {
        int64_t bs;
        if ((st = parse_input(&out->inputs[i], json_array_get(ins, (size_t)i), &bs, err, errn))) return st;
        for (int k = 0; k < i; k++)
            if (!strcmp(out->inputs[k].name, out->inputs[i].name))
                return bad(err, errn, 400, "input '%s' is given twice", out->inputs[i].name);
        if (bs < 0) continue;
        if ((uint64_t)bs > left)
            return bad(err, errn, 400, "input '%s': binary_data_size is %lld but only %zu bytes of binary data are left",
                       out->inputs[i].name, (long long)bs, left);
        out->inputs[i].bin = bin;
        out->inputs[i].bin_len = (size_t)bs;
        bin += bs;
        left -= (size_t)bs;
    }
    if (left) return bad(err, errn, 400, "%zu bytes of binary data follow the JSON but no input claims them", left);
    return 0;
}

/* JSON data, flat or nested, into dst (n elements of dt). */
typedef struct fill_ctx {
    const fm_infer_input *in;
    void *dst;
    int64_t n, at;
    char *err;
    size_t errn;
} fill_ctx;

static int store(fill_ctx *c, const json_t *v) {
    const fm_infer_input *in = c->in;
    if (c->at >= c->n)
        return bad(c->err, c->errn, 400, "input '%s': \"data\" has more than the %lld elements of shape", in->name, (long long)c->n);
    int64_t i = c->at++;
    if (in->dtype == FM_BOOL) {
        if (!json_is_boolean(v)) return bad(c->err, c->errn, 400, "input '%s': BOOL data must be true or false", in->name);
        ((uint8_t *)c->dst)[i] = json_is_true(v);
        return 0;
    }
    bool isf = in->dtype == FM_F32 || in->dtype == FM_F64 || in->dtype == FM_F16 || in->dtype == FM_BF16;
    if (isf) {
        if (!json_is_number(v)) return bad(c->err, c->errn, 400, "input '%s': element %lld is not a number", in->name, (long long)i);
        double x = json_number_value(v);
        if (in->dtype == FM_F64) ((double *)c->dst)[i] = x;
        else ((float *)c->dst)[i] = (float)x; /* FP16/BF16 are converted from f32 afterwards */
        return 0;
    }
    if (!json_is_integer(v))
        return bad(c->err, c->errn, 400, "input '%s': element %lld is not a whole number", in->name, (long long)i);
    json_int_t x = json_integer_value(v);
    static const long long lo[] = {[FM_I8] = -128, [FM_U8] = 0, [FM_I32] = INT32_MIN, [FM_I64] = INT64_MIN};
    static const long long hi[] = {[FM_I8] = 127, [FM_U8] = 255, [FM_I32] = INT32_MAX, [FM_I64] = INT64_MAX};
    if (x < lo[in->dtype] || x > hi[in->dtype])
        return bad(c->err, c->errn, 400, "input '%s': element %lld = %lld is out of range for %s", in->name, (long long)i,
                   (long long)x, fm_serve_dtype_name(in->dtype));
    switch (in->dtype) {
    case FM_I8: ((int8_t *)c->dst)[i] = (int8_t)x; break;
    case FM_U8: ((uint8_t *)c->dst)[i] = (uint8_t)x; break;
    case FM_I32: ((int32_t *)c->dst)[i] = (int32_t)x; break;
    default: ((int64_t *)c->dst)[i] = (int64_t)x; break;
    }
    return 0;
}

static int fill(fill_ctx *c, const json_t *v, int depth) {
    if (!json_is_array(v)) return store(c, v);
    if (depth > FM_MAX_DIMS)
        return bad(c->err, c->errn, 400, "input '%s': \"data\" is nested deeper than its shape", c->in->name);
    for (size_t k = 0; k < json_array_size(v); k++) {
        int st = fill(c, json_array_get(v, k), depth + 1);
        if (st) return st;
    }
    return 0;
}

/* Elements in JSON data, flat or nested (stops counting past `limit`). */
static int64_t count_elems(const json_t *v, int depth, int64_t limit) {
    if (!json_is_array(v)) return 1;
    if (depth > FM_MAX_DIMS) return limit + 1; /* fill() reports the nesting */
    int64_t n = 0;
    for (size_t k = 0; k < json_array_size(v) && n <= limit; k++) n += count_elems(json_array_get(v, k), depth + 1, limit);
    return n;
}

/* One input as a tensor of its shape (checks the data's size before allocating). */
static int make_tensor(const fm_infer_input *in, fm_tensor **out, char *err, size_t errn) {
    bool half = in->dtype == FM_F16 || in->dtype == FM_BF16;
    size_t es = fm_dtype_size(in->dtype);
    if (in->shm_region[0] && !in->bin)
        return bad(err, errn, 400, "input '%s': its shared memory region was not read", in->name);
    if (in->bin && in->bin_len != (size_t)in->numel * es)
        return bad(err, errn, 400, "input '%s': %zu bytes of binary data; shape and %s need %lld", in->name, in->bin_len,
                   fm_serve_dtype_name(in->dtype), (long long)in->numel * (long long)es);
    if (!in->bin) {
        int64_t n = count_elems(in->data, 0, in->numel);
        if (n < in->numel)
            return bad(err, errn, 400, "input '%s': \"data\" has %lld elements; shape needs %lld", in->name, (long long)n,
                       (long long)in->numel);
    }
    fm_dtype fill_dt = half && !in->bin ? FM_F32 : in->dtype;
    fm_tensor *t = fm_tensor_empty(in->ndim, in->shape, fill_dt, FM_CPU);
    if (!t) return bad(err, errn, 400, "input '%s': %s", in->name, fm_last_error());
    if (in->bin) {
        if (in->bin_len) memcpy(fm_tensor_data(t), in->bin, in->bin_len);
    } else {
        fill_ctx c = {in, fm_tensor_data(t), in->numel, 0, err, errn};
        int st = fill(&c, in->data, 0);
        if (!st && c.at != c.n)
            st = bad(err, errn, 400, "input '%s': \"data\" has %lld elements; shape needs %lld", in->name, (long long)c.at,
                     (long long)c.n);
        if (st) { fm_tensor_release(t); return st; }
        if (fill_dt != in->dtype) {
            fm_tensor *h = fm_to_dtype(t, in->dtype);
            fm_tensor_release(t);
            if (!(t = h)) return bad(err, errn, 500, "input '%s': %s", in->name, fm_last_error());
        }
    }
    *out = t;
    return 0;
}

static int check_shape(const fm_infer_input *in, const fm_serve_io *io, const fm_model_config *c, char *err, size_t errn) {
    const bool whole = c->max_batch_size == 0; /* no batch dim: dims are the whole shape */
    const int skip = whole ? 0 : 1;
    char want[160] = "[";
    if (!whole) strcat(want, "-1");
    for (int d = 0; d < io->ndim; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d || !whole ? ", " : "", (long long)io->dims[d]);
    strcat(want, "]");
    bool ok = in->ndim == io->ndim + skip;
    for (int d = 0; ok && d < io->ndim; d++)
        ok = in->shape[d + skip] >= 1 && (io->dims[d] == -1 || io->dims[d] == in->shape[d + skip]);
    if (!ok) {
        char got[160];
        fm_shape_str(in->ndim, in->shape, got, sizeof got);
        return bad(err, errn, 400, "input '%s': shape %s does not match the model's %s%s", in->name, got, want,
                   whole ? " (max_batch_size 0: the whole shape, no batch dim in front)" : "");
    }
    if (!whole && (in->shape[0] < 1 || in->shape[0] > c->max_batch_size))
        return bad(err, errn, 400, "input '%s': batch size %lld is outside [1, max_batch_size = %lld]", in->name,
                   (long long)in->shape[0], (long long)c->max_batch_size);
    return 0;
}

/* Token ids (an input with id_limit): each in [0, id_limit), so that one bad request gets its own 400
 * instead of failing the whole batch it would have joined. */
static int check_ids(const fm_serve_io *io, const fm_tensor *t, char *err, size_t errn) {
    if (io->id_limit <= 0 || (t->dtype != FM_I64 && t->dtype != FM_I32)) return 0;
    const int64_t n = fm_tensor_numel(t), per = n / (t->shape[0] ? t->shape[0] : 1);
    const void *d = fm_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = t->dtype == FM_I64 ? ((const int64_t *)d)[i] : ((const int32_t *)d)[i];
        if (v < 0 || v >= io->id_limit)
            return bad(err, errn, 400, "input '%s': sample %lld, position %lld: %lld is not a token id (whole numbers in "
                       "[0, %lld): the model's embedding has %lld rows)", io->name, (long long)(i / per),
                       (long long)(i % per), (long long)v, (long long)io->id_limit, (long long)io->id_limit);
    }
    return 0;
}

/* The config's reshape: an input from what the client sent (dims) to what the model
 * takes (reshape.shape), an output back (to_model false); after the batch dim when
 * batched. Replaces *t. */
static int reshape_io(fm_tensor **t, const fm_serve_io *io, bool batched, bool to_model, char *err, size_t errn) {
    int64_t shape[FM_MAX_DIMS];
    int n = 0;
    if (batched) shape[n++] = (*t)->ndim ? (*t)->shape[0] : 1;
    int nd = to_model ? io->reshape_ndim : io->ndim;
    const int64_t *d = to_model ? io->reshape : io->dims;
    for (int i = 0; i < nd; i++) shape[n++] = d[i];
    fm_tensor *r = fm_reshape(*t, n, shape);
    if (!r) return bad(err, errn, to_model ? 400 : 500, "%s '%s': the config's reshape does not fit: %s", to_model ? "input" : "output",
                       io->name, fm_last_error());
    fm_tensor_release(*t);
    *t = r;
    return 0;
}

int fm_infer_make_inputs(const fm_infer_request *r, const fm_model_config *c, fm_tensor **in, int64_t *rows, char *err,
                         size_t errn) {
    for (int i = 0; i < r->n_inputs; i++) {
        bool known = false;
        for (int k = 0; k < c->n_inputs; k++) known |= !strcmp(r->inputs[i].name, c->inputs[k].name);
        if (!known) return bad(err, errn, 400, "unknown input '%s' (model '%s' has input '%s'%s)", r->inputs[i].name, c->name,
                               c->inputs[0].name, c->n_inputs > 1 ? ", ..." : "");
    }
    *rows = -1;
    for (int k = 0; k < c->n_inputs; k++) {
        const fm_infer_input *x = NULL;
        for (int i = 0; i < r->n_inputs; i++)
            if (!strcmp(r->inputs[i].name, c->inputs[k].name)) x = &r->inputs[i];
        if (!x) return bad(err, errn, 400, "input '%s' is missing", c->inputs[k].name);
        if (x->dtype != c->inputs[k].dtype)
            return bad(err, errn, 400, "input '%s': datatype %s does not match the model's %s", x->name,
                       fm_serve_dtype_name(x->dtype), fm_serve_dtype_name(c->inputs[k].dtype));
        int st = check_shape(x, &c->inputs[k], c, err, errn);
        if (st) return st;
        if (c->max_batch_size > 0 && *rows >= 0 && x->shape[0] != *rows)
            return bad(err, errn, 400, "input '%s': batch size %lld differs from the other inputs' %lld", x->name,
                       (long long)x->shape[0], (long long)*rows);
        *rows = c->max_batch_size > 0 ? x->shape[0] : 1; /* unbatched: a request is one run */
        if ((st = make_tensor(x, &in[k], err, errn))) return st;
        if ((st = check_ids(&c->inputs[k], in[k], err, errn))) return st;
        if (c->inputs[k].has_reshape && (st = reshape_io(&in[k], &c->inputs[k], c->max_batch_size > 0, true, err, errn))) return st;
    }
    return 0;
}

int fm_infer_check_outputs(const fm_infer_request *r, const fm_model_config *c, char *err, size_t errn) {
    for (int i = 0; i < r->n_outputs; i++) {
        bool known = false;
        for (int k = 0; k < c->n_outputs; k++) known |= !strcmp(r->outputs[i], c->outputs[k].name);
        if (!known) return bad(err, errn, 400, "unknown output '%s' (model '%s' has output '%s'%s)", r->outputs[i], c->name,
                               c->outputs[0].name, c->n_outputs > 1 ? ", ..." : "");
        for (int k = 0; r->output_class[i] && k < c->n_outputs; k++)
            if (!strcmp(r->outputs[i], c->outputs[k].name) && c->outputs[k].dtype == FM_BOOL)
                return bad(err, errn, 400, "output '%s': classification needs numbers, not BOOL", r->outputs[i]);
    }
    return 0;
}

static json_t *data_json(const fm_tensor *t, const void *h, int64_t n, bool *nonfinite) {
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) {
        json_t *v;
        switch (t->dtype) {
        case FM_F64: v = json_real(((const double *)h)[i]); break;
        case FM_F32: case FM_F16: case FM_BF16: v = json_real(((const float *)h)[i]); break;
        case FM_I8: v = json_integer(((const int8_t *)h)[i]); break;
        case FM_U8: v = json_integer(((const uint8_t *)h)[i]); break;
        case FM_I32: v = json_integer(((const int32_t *)h)[i]); break;
        case FM_BOOL: v = json_boolean(((const uint8_t *)h)[i]); break;
        default: v = json_integer(((const int64_t *)h)[i]); break;
        }
        if (!v) { *nonfinite = true; v = json_null(); }
        json_array_append_new(a, v);
    }
    return a;
}

/* Where an output goes when it is written to shared memory (region "": it is not). */
typedef struct shm_dest {
    fm_shm_registry *reg;
    const char *region;
    int64_t offset, size;
} shm_dest;

/* Output j as JSON entry; binary bytes appended to *bin, or written to shared memory. */
static int output_entry(json_t *outs, const fm_serve_io *io, const fm_tensor *t, bool binary, const shm_dest *shm, char **bin,
                        size_t *bin_len, char *err, size_t errn) {
    int64_t n = fm_tensor_numel(t);
    bool half = t->dtype == FM_F16 || t->dtype == FM_BF16, to_shm = shm->region[0] != 0;
    fm_dtype host_dt = half && !binary && !to_shm ? FM_F32 : t->dtype;
    size_t nb = (size_t)n * fm_dtype_size(host_dt);
    void *h = malloc(nb ? nb : 1);
    if (!h || fm_tensor_copy_to_host(t, h, host_dt) != FM_OK) {
        free(h);
        return bad(err, errn, 500, "output '%s': %s", io->name, h ? fm_last_error() : "out of memory");
    }
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_t *o = json_pack("{s:s,s:s,s:o}", "name", io->name, "datatype", fm_serve_dtype_name(t->dtype), "shape", shape);
    if (to_shm) {
        int st = (uint64_t)nb > (uint64_t)shm->size
                     ? bad(err, errn, 400, "output '%s' is %zu bytes; shared_memory_byte_size gives it %lld", io->name, nb,
                           (long long)shm->size)
                     : fm_shm_write(shm->reg, shm->region, shm->offset, h, nb, err, errn);
        if (st) { free(h); json_decref(o); return st; }
        json_object_set_new(o, "parameters", json_pack("{s:s,s:I}", "shared_memory_region", shm->region,
                                                       "shared_memory_byte_size", (json_int_t)nb));
    } else if (binary) {
        char *nbuf = realloc(*bin, *bin_len + nb + 1);
        if (!nbuf) { free(h); json_decref(o); return bad(err, errn, 500, "out of memory"); }
        memcpy(nbuf + *bin_len, h, nb);
        *bin = nbuf;
        *bin_len += nb;
        json_object_set_new(o, "parameters", json_pack("{s:I}", "binary_data_size", (json_int_t)nb));
    } else {
        bool nonfinite = false;
        json_object_set_new(o, "data", data_json(t, h, n, &nonfinite));
        if (nonfinite) {
            free(h);
            json_decref(o);
            return bad(err, errn, 500, "output '%s' holds NaN or infinity, which JSON cannot carry; ask for binary output "
                       "(parameters.binary_data)", io->name);
        }
    }
    free(h);
    json_array_append_new(outs, o);
    return 0;
}

/* Binary BYTES elements: each a 4-byte little-endian length, then its bytes. */
static bool append_bytes(char **bin, size_t *bin_len, const char *s, size_t n) {
    char *nb = realloc(*bin, *bin_len + 4 + n + 1);
    if (!nb) return false;
    uint32_t l = (uint32_t)n;
    for (int b = 0; b < 4; b++) nb[*bin_len + (size_t)b] = (char)(l >> (8 * b) & 0xff);
    memcpy(nb + *bin_len + 4, s, n);
    *bin = nb;
    *bin_len += 4 + n;
    return true;
}

typedef struct scored {
    float v;
    int64_t i;
} scored;

/* highest first, ties (and NaNs, which go last) by the lower index */
static int by_score(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    bool na = isnan(a->v), nb = isnan(b->v);
    if (na != nb) return na ? 1 : -1;
    if (!na && a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Triton's classification extension: output t ([rows, classes...] when batched, else
 * [classes...]) as the top k of each row, BYTES "value:index" (":label" when the
 * config names a label file), highest first, ties by lower index; shape [rows, k]
 * (or [k]). k is cut to the number of classes. */
static int class_entry(json_t *outs, const fm_serve_io *io, const fm_tensor *t, bool batched, int64_t k,
                       const fm_serve_labels *lab, bool binary, char **bin, size_t *bin_len, char *err, size_t errn) {
    int64_t n = fm_tensor_numel(t), rows = batched && t->ndim ? t->shape[0] : 1, per = rows ? n / rows : 0;
    if (k > per) k = per;
    float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
    scored *sc = malloc(sizeof *sc * (size_t)(per ? per : 1));
    if (!h || !sc || fm_tensor_copy_to_host(t, h, FM_F32) != FM_OK) {
        int st = bad(err, errn, 500, "output '%s': %s", io->name, h && sc ? fm_last_error() : "out of memory");
        free(h);
        free(sc);
        return st;
    }
    json_t *data = binary ? NULL : json_array();
    size_t start = *bin_len;
    bool ok = true;
    for (int64_t r = 0; r < rows && ok; r++) {
        for (int64_t i = 0; i < per; i++) sc[i] = (scored){h[r * per + i], i};
        qsort(sc, (size_t)per, sizeof *sc, by_score); /* O(per log per) whatever k is */
        for (int64_t a = 0; a < k && ok; a++) {
            char s[320];
            int len = lab && sc[a].i < lab->n
                          ? snprintf(s, sizeof s, "%f:%lld:%.255s", (double)sc[a].v, (long long)sc[a].i, lab->line[sc[a].i])
                          : snprintf(s, sizeof s, "%f:%lld", (double)sc[a].v, (long long)sc[a].i);
            len = len < (int)sizeof s ? len : (int)sizeof s - 1;
            ok = binary ? append_bytes(bin, bin_len, s, (size_t)len) : json_array_append_new(data, json_stringn(s, (size_t)len)) == 0;
        }
    }
    free(h);
    free(sc);
    json_t *shape = batched ? json_pack("[I,I]", (json_int_t)rows, (json_int_t)k) : json_pack("[I]", (json_int_t)k);
    json_t *o = json_pack("{s:s,s:s,s:o}", "name", io->name, "datatype", "BYTES", "shape", shape);
    if (!ok || !o) { json_decref(data), json_decref(o); return bad(err, errn, 500, "out of memory"); }
    if (binary) json_object_set_new(o, "parameters", json_pack("{s:I}", "binary_data_size", (json_int_t)(*bin_len - start)));
    else json_object_set_new(o, "data", data);
    json_array_append_new(outs, o);
    return 0;
}

int fm_infer_make_response(const fm_infer_request *r, const fm_model_config *c, const fm_serve_labels *labels,
                           const char *model, int64_t version, fm_tensor *const *out, char **body, size_t *len,
                           size_t *json_len, char *err, size_t errn) {
    char vs[24];
    snprintf(vs, sizeof vs, "%lld", (long long)version);
    json_t *j = json_pack("{s:s,s:s}", "model_name", model, "model_version", vs);
    if (r->id) json_object_set_new(j, "id", json_string(r->id));
    json_t *outs = json_array();
    json_object_set_new(j, "outputs", outs);
    char *bin = NULL;
    size_t bin_len = 0;
    bool any_bin = false, any_f64 = false;
    int st = 0;
    for (int k = 0; k < c->n_outputs && !st; k++) {
        bool want = r->n_outputs == 0, binary = r->binary_output;
        int64_t top = 0;
        shm_dest shm = {r->shm, "", 0, 0};
        for (int i = 0; i < r->n_outputs; i++)
            if (!strcmp(r->outputs[i], c->outputs[k].name)) {
                want = true, binary = r->output_binary[i], top = r->output_class[i];
                shm = (shm_dest){r->shm, r->output_shm[i], r->output_shm_offset[i], r->output_shm_size[i]};
            }
        if (!want) continue;
        if (shm.region[0]) binary = false; /* its bytes are in the region, not after the JSON */
        any_bin |= binary;
        any_f64 |= out[k]->dtype == FM_F64;
        fm_tensor *t = fm_tensor_retain(out[k]);
        if (c->outputs[k].has_reshape) st = reshape_io(&t, &c->outputs[k], c->max_batch_size > 0, false, err, errn);
        if (!st)
            st = top ? class_entry(outs, &c->outputs[k], t, c->max_batch_size > 0, top, labels ? &labels[k] : NULL, binary, &bin,
                                   &bin_len, err, errn)
                     : output_entry(outs, &c->outputs[k], t, binary, &shm, &bin, &bin_len, err, errn);
        fm_tensor_release(t);
    }
    char *js = st ? NULL : json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(any_f64 ? 17 : 9));
    json_decref(j);
    if (!st && !js) st = bad(err, errn, 500, "could not write the response JSON");
    if (st) { free(bin); free(js); return st; }
    size_t jl = strlen(js);
    *body = malloc(jl + bin_len + 1);
    if (!*body) { free(bin); free(js); return bad(err, errn, 500, "out of memory"); }
    memcpy(*body, js, jl);
    if (bin_len) memcpy(*body + jl, bin, bin_len);
    *len = jl + bin_len;
    *json_len = any_bin ? jl : 0;
    free(bin);
    free(js);
    return 0;
}
