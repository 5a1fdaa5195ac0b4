/* Servable dispatch (which loader opens a version directory) and the KServe
 * datatype names. */
#include "serve/servable.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fathom/error.h"
#include "fathom/graph.h"

fm_servable *fm_servable_open_recipe(const char *dir, fm_device dev); /* servable_recipe.c */
fm_servable *fm_servable_open_graph(const char *dir, fm_device dev);  /* servable_graph.c */

fm_servable *fm_servable_open_onnx(const char *path, fm_device dev, const fm_serve_io *decl, int n_decl,
                                   bool decl_unbatched); /* servable_graph.c */

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

const char *fm_serve_platform_find(const char *version_dir, const char *onnx_file) {
    char p[PATH_MAX];
    if (fm_graph_dir_is_graph(version_dir)) return "fathom_graph";
    snprintf(p, sizeof p, "%s/%s", version_dir, onnx_file && *onnx_file ? onnx_file : "model.onnx");
    if (is_file(p)) return "fathom_onnx";
    snprintf(p, sizeof p, "%s/model.safetensors", version_dir);
    if (is_file(p)) return "fathom_recipe";
    return NULL;
}

fm_servable *fm_servable_open(const char *version_dir, fm_device dev, const char *platform, const char *onnx_file,
                              const fm_serve_io *decl, int n_decl, bool decl_unbatched) {
    const char *found = fm_serve_platform_find(version_dir, onnx_file);
    const char *file = onnx_file && *onnx_file ? onnx_file : "model.onnx";
    if (!found) {
        fm_set_error(FM_ERR_IO, "%s: no model found (expected graph.json + weights.safetensors of an inference graph, "
                     "%s, or model.safetensors written by `fathom train`)", version_dir, file);
        return NULL;
    }
    if (platform && *platform && strcmp(platform, found)) {
        fm_set_error(FM_ERR_FORMAT, "%s: the config names platform '%s' but this version folder holds a %s model", version_dir,
                     platform, found);
        return NULL;
    }
    if (!strcmp(found, "fathom_graph")) return fm_servable_open_graph(version_dir, dev);
    if (!strcmp(found, "fathom_recipe")) return fm_servable_open_recipe(version_dir, dev);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", version_dir, file);
    return fm_servable_open_onnx(p, dev, decl, n_decl, decl_unbatched);
}

static fm_status unbatch_ios(fm_serve_io *ios, int n, const char *where, const char *what) {
    for (int i = 0; i < n; i++) {
        if (ios[i].ndim + 1 > FM_MAX_DIMS - 1)
            return fm_set_error(FM_ERR_UNSUPPORTED, "%s: max_batch_size 0: the model's %s '%s' has %d dims after the batch; "
                                "a whole shape may have at most %d", where, what, ios[i].name, ios[i].ndim, FM_MAX_DIMS - 1);
        memmove(ios[i].dims + 1, ios[i].dims, sizeof *ios[i].dims * (size_t)ios[i].ndim);
        ios[i].dims[0] = -1;
        ios[i].ndim++;
    }
    return FM_OK;
}

fm_status fm_servable_unbatch(fm_servable *s, const char *where) {
    if (s->unbatched) return FM_OK;
    if (unbatch_ios(s->inputs, s->n_inputs, where, "input") || unbatch_ios(s->outputs, s->n_outputs, where, "output"))
        return fm_last_status();
    s->unbatched = true;
    return FM_OK;
}

void fm_servable_free(fm_servable *s) {
    if (s && s->free) s->free(s);
}

static const struct { fm_dtype dt; const char *name, *cfg; } k_types[] = {
    {FM_F32, "FP32", "TYPE_FP32"}, {FM_F64, "FP64", "TYPE_FP64"}, {FM_F16, "FP16", "TYPE_FP16"},
    {FM_BF16, "BF16", "TYPE_BF16"}, {FM_I8, "INT8", "TYPE_INT8"},  {FM_U8, "UINT8", "TYPE_UINT8"},
    {FM_I32, "INT32", "TYPE_INT32"}, {FM_I64, "INT64", "TYPE_INT64"}, {FM_BOOL, "BOOL", "TYPE_BOOL"},
};

const char *fm_serve_dtype_name(fm_dtype dt) {
    for (size_t i = 0; i < sizeof k_types / sizeof *k_types; i++)
        if (k_types[i].dt == dt) return k_types[i].name;
    return "INVALID";
}

const char *fm_serve_config_dtype_name(fm_dtype dt) {
    for (size_t i = 0; i < sizeof k_types / sizeof *k_types; i++)
        if (k_types[i].dt == dt) return k_types[i].cfg;
    return "TYPE_INVALID";
}

bool fm_serve_dtype_parse(const char *name, fm_dtype *out) {
    if (!name) return false;
    for (size_t i = 0; i < sizeof k_types / sizeof *k_types; i++)
        if (!strcmp(k_types[i].name, name) || !strcmp(k_types[i].cfg, name)) { *out = k_types[i].dt; return true; }
    return false;
}
