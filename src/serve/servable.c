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

fm_servable *fm_servable_open(const char *version_dir, fm_device dev) {
    char p[PATH_MAX];
    struct stat st;
    if (fm_graph_dir_is_graph(version_dir)) return fm_servable_open_graph(version_dir, dev);
    snprintf(p, sizeof p, "%s/model.safetensors", version_dir);
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) return fm_servable_open_recipe(version_dir, dev);
    fm_set_error(FM_ERR_IO, "%s: no model found (expected graph.json + weights.safetensors of an inference graph, or "
                 "model.safetensors written by `fathom train`)",
                 version_dir);
    return NULL;
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
