/* Reading config.pbtxt or config.json (Triton's ModelConfig fields) and writing it back. */
#include "serve/model_config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fathom/error.h"
#include "io/io_internal.h" /* fm_read_text_file */
#include "serve/pbtxt.h"

void fm_model_config_init(fm_model_config *c, const char *name) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->max_batch_size = 32;
    c->instance_count = 1;
    c->device = FM_CPU;
    c->policy = FM_VP_LATEST;
    c->latest_n = 1;
    fm_chat_template_default(&c->chat);
}

/* An integer field in [lo, hi]: numbers or decimal strings (protobuf's JSON form
 * writes int64 as strings). */
static fm_status get_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *where) {
    const json_t *v = json_object_get(o, key);
    if (!v) return FM_OK;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_string(v)) {
        char *end;
        errno = 0;
        x = strtoll(json_string_value(v), &end, 10);
        if (errno || end == json_string_value(v) || *end)
            return fm_set_error(FM_ERR_FORMAT, "%s: '%s' must be a whole number, got \"%s\"", where, key, json_string_value(v));
    } else {
        return fm_set_error(FM_ERR_FORMAT, "%s: '%s' must be a whole number", where, key);
    }
    if (x < lo || x > hi)
        return fm_set_error(FM_ERR_FORMAT, "%s: '%s' is %lld; it must be in [%lld, %lld]", where, key, x, (long long)lo, (long long)hi);
    *out = x;
    return FM_OK;
}

/* The element count of n sizes: -1 when one is -1 (any), -2 past 2^62 (each size is at
 * most 2^31, so the product of a few overflows int64 without this check). */
static int64_t elems(const int64_t *d, int n) {
    int64_t p = 1;
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (d[i] < 0) { any = true; continue; }
        if (__builtin_mul_overflow(p, d[i], &p) || p > (INT64_C(1) << 62)) return -2;
    }
    return any ? -1 : p;
}

static fm_status parse_io(fm_serve_io *io, const json_t *j, const char *where, const char *what) {
    if (!json_is_object(j)) return fm_set_error(FM_ERR_FORMAT, "%s: each %s must be an object", where, what);
    const char *name = json_string_value(json_object_get(j, "name"));
    if (!name || !*name || strlen(name) >= FM_SERVE_NAME_MAX)
        return fm_set_error(FM_ERR_FORMAT, "%s: each %s needs a \"name\" (1-%d characters)", where, what, FM_SERVE_NAME_MAX - 1);
    strcpy(io->name, name);
    const char *dt = json_string_value(json_object_get(j, "data_type"));
    if (!dt || !fm_serve_dtype_parse(dt, &io->dtype))
        return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': \"data_type\" must be one of TYPE_FP32, TYPE_FP64, TYPE_FP16, "
                            "TYPE_BF16, TYPE_INT8, TYPE_UINT8, TYPE_INT32, TYPE_INT64, TYPE_BOOL", where, what, name);
    const json_t *dims = json_object_get(j, "dims");
    if (!json_is_array(dims) || json_array_size(dims) > FM_MAX_DIMS - 1)
        return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': \"dims\" must be an array of at most %d sizes", where, what,
                            name, FM_MAX_DIMS - 1);
    io->ndim = (int)json_array_size(dims);
    for (int i = 0; i < io->ndim; i++) {
        const json_t *d = json_array_get(dims, (size_t)i);
        json_int_t v = json_is_integer(d) ? json_integer_value(d) : -2;
        if (v < -1 || v == 0 || v > (1LL << 31))
            return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': dims[%d] must be a size >= 1 or -1 (any)", where, what, name, i);
        io->dims[i] = v;
    }
    const json_t *rs = json_object_get(j, "reshape"), *rsh = json_object_get(rs, "shape");
    if (rs && (!json_is_object(rs) || (rsh && !json_is_array(rsh)) || json_array_size(rsh) > FM_MAX_DIMS - 1))
        return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': \"reshape\" must be {\"shape\": [sizes]} with at most %d sizes", where,
                            what, name, FM_MAX_DIMS - 1);
    io->has_reshape = rs != NULL;
    io->reshape_ndim = (int)json_array_size(rsh);
    for (int i = 0; i < io->reshape_ndim; i++) {
        const json_t *d = json_array_get(rsh, (size_t)i);
        json_int_t v = json_is_integer(d) ? json_integer_value(d) : -2;
        if (v < -1 || v == 0 || v > (1LL << 31))
            return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': reshape.shape[%d] must be a size >= 1 or -1", where, what, name, i);
        io->reshape[i] = v;
    }
    int64_t n_dims = elems(io->dims, io->ndim), n_re = elems(io->reshape, io->reshape_ndim);
    if (rs && (n_dims == -2 || n_re == -2))
        return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': dims or reshape.shape hold more than 2^62 elements", where, what, name);
    if (rs && n_dims > 0 && n_re > 0 && n_dims != n_re)
        return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': dims hold %lld elements but reshape.shape %lld", where, what, name,
                            (long long)n_dims, (long long)n_re);
    const json_t *lf = json_object_get(j, "label_filename");
    const char *l = json_string_value(lf);
    if (lf && (!l || !strcmp(what, "input") || !*l || strlen(l) >= sizeof io->label_file || strchr(l, '/') ||
               !strcmp(l, ".") || !strcmp(l, "..")))
        return fm_set_error(FM_ERR_FORMAT, "%s: %s '%s': \"label_filename\" must name a file in the model folder (an output's, "
                            "1-%zu characters, no '/')", where, what, name, sizeof io->label_file - 1);
    if (l) snprintf(io->label_file, sizeof io->label_file, "%s", l);
    return FM_OK;
}

static fm_status parse_ios(fm_serve_io *ios, int *n, const json_t *arr, const char *where, const char *what) {
    if (!arr) return FM_OK;
    if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > FM_SERVE_MAX_IO)
        return fm_set_error(FM_ERR_FORMAT, "%s: \"%s\" must be an array of 1 to %d objects", where, what, FM_SERVE_MAX_IO);
    *n = (int)json_array_size(arr);
    for (int i = 0; i < *n; i++)
        if (parse_io(&ios[i], json_array_get(arr, (size_t)i), where, what)) return fm_last_status();
    return FM_OK;
}

static fm_status parse_batcher(fm_model_config *c, const json_t *db, const char *where) {
    if (!db) return FM_OK;
    if (!json_is_object(db)) return fm_set_error(FM_ERR_FORMAT, "%s: \"dynamic_batching\" must be an object", where);
    c->dynamic_batching = true;
    const json_t *pref = json_object_get(db, "preferred_batch_size");
    if (pref) {
        if (!json_is_array(pref) || json_array_size(pref) > FM_SERVE_MAX_PREFERRED)
            return fm_set_error(FM_ERR_FORMAT, "%s: \"preferred_batch_size\" must be an array of at most %d sizes", where,
                                FM_SERVE_MAX_PREFERRED);
        c->n_preferred = (int)json_array_size(pref);
        for (int i = 0; i < c->n_preferred; i++) {
            const json_t *v = json_array_get(pref, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > c->max_batch_size)
                return fm_set_error(FM_ERR_FORMAT, "%s: preferred_batch_size[%d] must be in [1, max_batch_size = %lld]", where,
                                    i, (long long)c->max_batch_size);
            c->preferred[i] = json_integer_value(v);
        }
    }
    if (get_int(db, "max_queue_delay_microseconds", 0, 60000000, &c->max_queue_delay_us, where)) return fm_last_status();
    const json_t *qp = json_object_get(db, "default_queue_policy");
    if (qp) {
        if (!json_is_object(qp)) return fm_set_error(FM_ERR_FORMAT, "%s: \"default_queue_policy\" must be an object", where);
        if (get_int(qp, "max_queue_size", 0, 1 << 20, &c->max_queue_size, where) ||
            get_int(qp, "default_timeout_microseconds", 0, INT64_MAX / 1000, &c->default_timeout_us, where))
            return fm_last_status();
    }
    return FM_OK;
}

static fm_status parse_instances(fm_model_config *c, const json_t *ig, const char *where) {
    if (!ig) return FM_OK;
    if (!json_is_array(ig) || json_array_size(ig) != 1)
        return fm_set_error(FM_ERR_FORMAT, "%s: \"instance_group\" must be an array of one group", where);
    const json_t *g = json_array_get(ig, 0);
    int64_t n = 1;
    if (!json_is_object(g) || get_int(g, "count", 1, 64, &n, where)) {
        return json_is_object(g) ? fm_last_status()
                                 : fm_set_error(FM_ERR_FORMAT, "%s: instance_group[0] must be an object", where);
    }
    c->instance_count = (int)n;
    const char *kind = json_string_value(json_object_get(g, "kind"));
    const json_t *gpus = json_object_get(g, "gpus");
    if (gpus && (!json_is_array(gpus) || json_array_size(gpus) > 1 ||
                 (json_array_size(gpus) == 1 && (!json_is_integer(json_array_get(gpus, 0)) ||
                                                  json_integer_value(json_array_get(gpus, 0)) < 0 ||
                                                  json_integer_value(json_array_get(gpus, 0)) > 255))))
        return fm_set_error(FM_ERR_FORMAT, "%s: instance_group \"gpus\" must list one GPU index (fathom runs a model's "
                            "instances on one device; give each GPU its own model folder)", where);
    int gpu = json_array_size(gpus) == 1 ? (int)json_integer_value(json_array_get(gpus, 0)) : 0;
    if (kind && (!strcmp(kind, "KIND_AUTO") || !strcmp(kind, "KIND_MODEL"))) kind = NULL; /* the server's --device */
    if (kind && !strcmp(kind, "KIND_CPU") && json_array_size(gpus))
        return fm_set_error(FM_ERR_FORMAT, "%s: instance_group kind KIND_CPU takes no \"gpus\"", where);
    if (kind || json_array_size(gpus)) {
        if (!kind || !strcmp(kind, "KIND_GPU")) c->device = (fm_device){FM_DEV_CUDA, gpu};
        else if (!strcmp(kind, "KIND_CPU")) c->device = FM_CPU;
        else return fm_set_error(FM_ERR_FORMAT, "%s: instance_group kind '%s': use KIND_CPU, KIND_GPU or KIND_AUTO", where, kind);
        c->device_set = true;
    }
    return FM_OK;
}

static fm_status parse_policy(fm_model_config *c, const json_t *vp, const char *where) {
    if (!vp) return FM_OK;
    const json_t *x;
    int64_t n = 1;
    if (!json_is_object(vp) || json_object_size(vp) != 1)
        return fm_set_error(FM_ERR_FORMAT, "%s: \"version_policy\" must be one of {\"latest\": {\"num_versions\": N}}, "
                            "{\"all\": {}}, {\"specific\": {\"versions\": [...]}}", where);
    if ((x = json_object_get(vp, "latest"))) {
        if (!json_is_object(x) || get_int(x, "num_versions", 1, 1 << 20, &n, where))
            return json_is_object(x) ? fm_last_status() : fm_set_error(FM_ERR_FORMAT, "%s: \"latest\" must be an object", where);
        c->policy = FM_VP_LATEST;
        c->latest_n = (int)n;
    } else if ((x = json_object_get(vp, "all"))) {
        c->policy = FM_VP_ALL;
    } else if ((x = json_object_get(vp, "specific"))) {
        const json_t *vs = json_object_get(x, "versions");
        if (!json_is_array(vs) || json_array_size(vs) == 0 || json_array_size(vs) > FM_SERVE_MAX_SPECIFIC)
            return fm_set_error(FM_ERR_FORMAT, "%s: \"specific\" needs \"versions\": an array of 1 to %d versions", where,
                                FM_SERVE_MAX_SPECIFIC);
        c->policy = FM_VP_SPECIFIC;
        c->n_specific = (int)json_array_size(vs);
        for (int i = 0; i < c->n_specific; i++) {
            const json_t *v = json_array_get(vs, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 1)
                return fm_set_error(FM_ERR_FORMAT, "%s: specific versions must be whole numbers >= 1", where);
            c->specific[i] = json_integer_value(v);
        }
    } else {
        return fm_set_error(FM_ERR_FORMAT, "%s: \"version_policy\": unknown policy (use latest, all or specific)", where);
    }
    return FM_OK;
}

static fm_status parse_textgen(fm_model_config *c, const json_t *tg, const char *where) {
    if (!tg) return FM_OK;
    if (!json_is_object(tg)) return fm_set_error(FM_ERR_FORMAT, "%s: \"text_generation\" must be an object", where);
    int64_t nb = 0, bt = 0, ch = 0, si = 0;
    if (get_int(tg, "kv_cache_blocks", 1, 1 << 20, &nb, where) || get_int(tg, "kv_block_tokens", 1, 4096, &bt, where) ||
        get_int(tg, "prefill_chunk_tokens", 1, 1 << 16, &ch, where) ||
        get_int(tg, "stream_interval_tokens", 1, 1024, &si, where) ||
        fm_chat_template_parse(&c->chat, json_object_get(tg, "chat_template"), where))
        return fm_last_status();
    c->kv_cache_blocks = (int)nb;
    c->kv_block_tokens = (int)bt;
    c->prefill_chunk_tokens = (int)ch;
    c->stream_interval_tokens = (int)si;
    const json_t *dt = json_object_get(tg, "kv_cache_dtype");
    if (dt) {
        const char *v = json_string_value(dt);
        if (v && !strcmp(v, "f32")) c->kv_cache_dtype = FM_F32;
        else if (v && !strcmp(v, "f16")) c->kv_cache_dtype = FM_F16;
        else return fm_set_error(FM_ERR_FORMAT, "%s: \"kv_cache_dtype\" must be \"f32\" or \"f16\"", where);
    }
    return FM_OK;
}

/* "platform" / "backend" (Triton's names for what runs the model) and
 * "default_model_filename": the version folder must then hold that kind. */
static fm_status parse_platform(fm_model_config *c, const json_t *j, const char *where) {
    static const char *const names[][2] = {{"fathom_graph", "fathom_graph"},   {"fathom_onnx", "fathom_onnx"},
                                           {"onnxruntime_onnx", "fathom_onnx"}, {"fathom_recipe", "fathom_recipe"},
                                           {"fathom_gpt", "fathom_gpt"},       {"fathom_embed", "fathom_embed"}};
    const json_t *pj = json_object_get(j, "platform"), *bj = json_object_get(j, "backend");
    const char *plat = json_string_value(pj), *backend = json_string_value(bj);
    if ((pj && !plat) || (bj && !backend))
        return fm_set_error(FM_ERR_FORMAT, "%s: \"platform\" and \"backend\" must be strings", where);
    if (backend && strcmp(backend, "onnxruntime") && strcmp(backend, "fathom"))
        return fm_set_error(FM_ERR_FORMAT, "%s: backend '%s' is not one fathom serves (onnxruntime: an ONNX model, run by "
                            "fathom; fathom: any of its own)", where, backend);
    if (backend && !strcmp(backend, "onnxruntime") && !plat) plat = "fathom_onnx";
    if (plat) {
        size_t k = 0;
        while (k < sizeof names / sizeof *names && strcmp(names[k][0], plat)) k++;
        if (k == sizeof names / sizeof *names)
            return fm_set_error(FM_ERR_FORMAT, "%s: platform '%s' is not one fathom serves (fathom_graph, fathom_onnx or "
                                "onnxruntime_onnx, fathom_recipe, fathom_gpt, fathom_embed)", where, plat);
        snprintf(c->platform, sizeof c->platform, "%s", names[k][1]);
    }
    const json_t *fj = json_object_get(j, "default_model_filename");
    const char *f = json_string_value(fj);
    if (fj && (!f || !*f || strlen(f) >= sizeof c->model_filename || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, "..")))
        return fm_set_error(FM_ERR_FORMAT, "%s: \"default_model_filename\" must be a file name in the version folder "
                            "(1-%zu characters, no '/')", where, sizeof c->model_filename - 1);
    if (f) snprintf(c->model_filename, sizeof c->model_filename, "%s", f);
    return FM_OK;
}

fm_status fm_model_config_parse(fm_model_config *c, const json_t *j, const char *where) {
    if (!json_is_object(j)) return fm_set_error(FM_ERR_FORMAT, "%s: must hold a JSON object", where);
    const char *name = json_string_value(json_object_get(j, "name"));
    if (name && strcmp(name, c->name))
        return fm_set_error(FM_ERR_FORMAT, "%s: \"name\" is '%s' but the model's directory is '%s'", where, name, c->name);
    /* what changes how requests must be run: refused rather than ignored */
    const json_t *tp = json_object_get(j, "model_transaction_policy");
    if (json_object_get(j, "sequence_batching"))
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: \"sequence_batching\" (stateful models) is not supported by fathom serve", where);
    if (json_object_get(j, "ensemble_scheduling"))
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: \"ensemble_scheduling\" (ensembles) is not supported by fathom serve", where);
    if (json_is_true(json_object_get(tp, "decoupled")))
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: decoupled models (model_transaction_policy) are not supported by fathom "
                            "serve; text generation streams on /v1/completions", where);
    c->max_batch_size_set = json_object_get(j, "max_batch_size") != NULL;
    if (get_int(j, "max_batch_size", 0, 1 << 16, &c->max_batch_size, where) ||
        parse_ios(c->inputs, &c->n_inputs, json_object_get(j, "input"), where, "input") ||
        parse_ios(c->outputs, &c->n_outputs, json_object_get(j, "output"), where, "output") ||
        parse_batcher(c, json_object_get(j, "dynamic_batching"), where) ||
        parse_instances(c, json_object_get(j, "instance_group"), where) ||
        parse_policy(c, json_object_get(j, "version_policy"), where) ||
        parse_textgen(c, json_object_get(j, "text_generation"), where) || parse_platform(c, j, where))
        return fm_last_status();
    if (c->max_batch_size == 0 && c->dynamic_batching)
        return fm_set_error(FM_ERR_FORMAT, "%s: \"dynamic_batching\" needs max_batch_size >= 1 (max_batch_size 0 means the "
                            "model takes no batch: each request runs alone)", where);
    return FM_OK;
}

fm_status fm_model_config_file(const char *model_dir, char *path, size_t cap) {
    char pb[PATH_MAX], js[PATH_MAX];
    struct stat st;
    snprintf(pb, sizeof pb, "%s/config.pbtxt", model_dir);
    snprintf(js, sizeof js, "%s/config.json", model_dir);
    bool has_pb = stat(pb, &st) == 0, has_js = stat(js, &st) == 0;
    snprintf(path, cap, "%s", has_pb ? pb : has_js ? js : "");
    if (has_pb && has_js)
        return fm_set_error(FM_ERR_FORMAT, "%s: both config.pbtxt and config.json are here; keep one (the same fields, in "
                            "protobuf text or JSON)", model_dir);
    return FM_OK;
}

fm_status fm_model_config_load(fm_model_config *c, const char *model_dir, const char *name) {
    fm_model_config_init(c, name);
    char p[PATH_MAX];
    if (fm_model_config_file(model_dir, p, sizeof p)) return fm_last_status();
    if (!*p) return FM_OK;
    size_t len;
    fm_status rst;
    const char *why;
    char *text = fm_read_text_file(p, 1 << 20, &len, &rst, &why); /* a model config is small */
    if (!text) return fm_set_error(rst, "%s: %s%s%s", p, why, errno && rst == FM_ERR_IO ? ": " : "",
                                   errno && rst == FM_ERR_IO ? strerror(errno) : "");
    json_t *j;
    size_t plen = strlen(p);
    if (plen >= 6 && !strcmp(p + plen - 6, ".pbtxt")) {
        j = fm_pbtxt_to_json(text, len, p);
    } else {
        json_error_t e;
        j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
        if (!j) fm_set_error(FM_ERR_FORMAT, "%s:%d: %s", p, e.line, e.text);
    }
    free(text);
    if (!j) return fm_last_status();
    fm_status s = fm_model_config_parse(c, j, p);
    json_decref(j);
    return s;
}

/* declared a against the model's b: a's reshape (what the model takes) when it has one, else its dims */
static bool io_equal(const fm_serve_io *a, const fm_serve_io *b) {
    int n = a->has_reshape ? a->reshape_ndim : a->ndim;
    const int64_t *d = a->has_reshape ? a->reshape : a->dims;
    if (strcmp(a->name, b->name) || a->dtype != b->dtype || n != b->ndim) return false;
    for (int i = 0; i < n; i++)
        if (d[i] != b->dims[i] && d[i] != -1 && b->dims[i] != -1) return false;
    return true;
}

static fm_status complete_ios(fm_serve_io *decl, int *n_decl, const fm_serve_io *have, int n_have, const char *where,
                              const char *what) {
    if (*n_decl == 0) {
        memcpy(decl, have, sizeof *have * (size_t)n_have);
        *n_decl = n_have;
        return FM_OK;
    }
    if (*n_decl != n_have)
        return fm_set_error(FM_ERR_FORMAT, "%s: declares %d %ss; the model has %d", where, *n_decl, what, n_have);
    for (int i = 0; i < n_have; i++)
        if (!io_equal(&decl[i], &have[i]))
            return fm_set_error(FM_ERR_FORMAT, "%s: %s %d is declared as '%s' %s with %d dims; the model's is '%s' %s with %d "
                                "dims", where, what, i, decl[i].name, fm_serve_config_dtype_name(decl[i].dtype), decl[i].ndim,
                                have[i].name, fm_serve_config_dtype_name(have[i].dtype), have[i].ndim);
    /* the model's exact sizes win over -1 (into the reshape when there is one: the dims are
     * then what clients send); the declared label files stay */
    for (int i = 0; i < n_have; i++) {
        fm_serve_io d = decl[i];
        decl[i] = have[i];
        memcpy(decl[i].label_file, d.label_file, sizeof d.label_file);
        if (!d.has_reshape) continue;
        decl[i].has_reshape = true;
        decl[i].reshape_ndim = have[i].ndim;
        memcpy(decl[i].reshape, have[i].dims, sizeof have[i].dims);
        decl[i].ndim = d.ndim;
        memcpy(decl[i].dims, d.dims, sizeof d.dims);
        decl[i].id_limit = 0; /* the ids' check reads the model's layout */
    }
    return FM_OK;
}

fm_status fm_model_config_complete(fm_model_config *c, fm_servable *s, const char *where) {
    if (s->unbatched && c->max_batch_size_set && c->max_batch_size > 0) {
        const fm_serve_io *io = s->inputs;
        for (int k = 0; k < s->n_inputs + s->n_outputs; k++) {
            const fm_serve_io *x = k < s->n_inputs ? &s->inputs[k] : &s->outputs[k - s->n_inputs];
            if (x->dims[0] != -1) { io = x; break; }
        }
        return fm_set_error(FM_ERR_FORMAT, "%s: max_batch_size is %lld, but the model's '%s' has the fixed first dim %lld, "
                            "so it takes no batch: set max_batch_size: 0 (Triton's 'no batching'; dims are then whole "
                            "shapes) or export the model with a dynamic batch dim", where, (long long)c->max_batch_size,
                            io->name, (long long)io->dims[0]);
    }
    if (s->unbatched && c->dynamic_batching)
        return fm_set_error(FM_ERR_FORMAT, "%s: \"dynamic_batching\" needs a batch dim, but the model has a fixed first dim "
                            "(it is served with max_batch_size 0: one request per run); remove dynamic_batching", where);
    if (s->unbatched) c->max_batch_size = 0;
    else if (c->max_batch_size == 0 && fm_servable_unbatch(s, where)) return fm_last_status();
    if (complete_ios(c->inputs, &c->n_inputs, s->inputs, s->n_inputs, where, "input") ||
        complete_ios(c->outputs, &c->n_outputs, s->outputs, s->n_outputs, where, "output"))
        return fm_last_status();
    return FM_OK;
}

static json_t *ios_json(const fm_serve_io *ios, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *dims = json_array();
        for (int d = 0; d < ios[i].ndim; d++) json_array_append_new(dims, json_integer(ios[i].dims[d]));
        json_t *o = json_pack("{s:s,s:s,s:o}", "name", ios[i].name, "data_type", fm_serve_config_dtype_name(ios[i].dtype),
                              "dims", dims);
        if (ios[i].label_file[0]) json_object_set_new(o, "label_filename", json_string(ios[i].label_file));
        if (ios[i].has_reshape) {
            json_t *rsh = json_array();
            for (int d = 0; d < ios[i].reshape_ndim; d++) json_array_append_new(rsh, json_integer(ios[i].reshape[d]));
            json_object_set_new(o, "reshape", json_pack("{s:o}", "shape", rsh));
        }
        json_array_append_new(a, o);
    }
    return a;
}

json_t *fm_model_config_json(const fm_model_config *c, const char *platform) {
    json_t *j = json_pack("{s:s,s:s,s:I,s:o,s:o}", "name", c->name, "platform", platform, "max_batch_size",
                          (json_int_t)c->max_batch_size, "input", ios_json(c->inputs, c->n_inputs), "output",
                          ios_json(c->outputs, c->n_outputs));
    if (c->dynamic_batching) {
        json_t *pref = json_array();
        for (int i = 0; i < c->n_preferred; i++) json_array_append_new(pref, json_integer(c->preferred[i]));
        json_object_set_new(j, "dynamic_batching",
                            json_pack("{s:o,s:I,s:{s:I,s:I}}", "preferred_batch_size", pref, "max_queue_delay_microseconds",
                                      (json_int_t)c->max_queue_delay_us, "default_queue_policy", "max_queue_size",
                                      (json_int_t)c->max_queue_size, "default_timeout_microseconds",
                                      (json_int_t)c->default_timeout_us));
    }
    json_t *ig = json_pack("{s:i,s:s}", "count", c->instance_count, "kind", c->device.type == FM_DEV_CPU ? "KIND_CPU" : "KIND_GPU");
    if (c->device.type == FM_DEV_CUDA) json_object_set_new(ig, "gpus", json_pack("[i]", c->device.index));
    json_object_set_new(j, "instance_group", json_pack("[o]", ig));
    json_t *vp;
    if (c->policy == FM_VP_ALL) {
        vp = json_pack("{s:{}}", "all");
    } else if (c->policy == FM_VP_SPECIFIC) {
        json_t *vs = json_array();
        for (int i = 0; i < c->n_specific; i++) json_array_append_new(vs, json_integer(c->specific[i]));
        vp = json_pack("{s:{s:o}}", "specific", "versions", vs);
    } else {
        vp = json_pack("{s:{s:i}}", "latest", "num_versions", c->latest_n);
    }
    json_object_set_new(j, "version_policy", vp);
    if (*c->model_filename) json_object_set_new(j, "default_model_filename", json_string(c->model_filename));
    if (c->kv_cache_blocks || c->kv_block_tokens || c->prefill_chunk_tokens || c->stream_interval_tokens || c->chat.set ||
        c->kv_cache_dtype == FM_F16) {
        json_t *tg = json_pack("{s:i,s:i,s:i,s:i,s:s}", "kv_cache_blocks", c->kv_cache_blocks, "kv_block_tokens", c->kv_block_tokens,
                               "prefill_chunk_tokens", c->prefill_chunk_tokens, "stream_interval_tokens",
                               c->stream_interval_tokens, "kv_cache_dtype", c->kv_cache_dtype == FM_F16 ? "f16" : "f32");
        if (c->chat.set) json_object_set_new(tg, "chat_template", fm_chat_template_json(&c->chat));
        json_object_set_new(j, "text_generation", tg);
    }
    return j;
}
