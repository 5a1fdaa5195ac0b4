/* Loading a graph directory (the format is described in graph_io.c and
 * docs/GRAPH.md). Every field is checked for its JSON type and range before
 * use; the graph is then rebuilt through the builder (which checks names and
 * references), the weights are matched one to one with the declared
 * constants, and fm_graph_validate checks every node's attributes, dtypes and
 * shapes, and the shapes the file declares, before the graph is returned. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "graph/graph_internal.h"

#define GRAPH_JSON_MAX (64 << 20)

static fm_status bad(const char *what) { return fm_set_error(FM_ERR_FORMAT, "%s", what); }

static json_t *get(json_t *obj, const char *key, json_type type, bool required) {
    json_t *v = json_object_get(obj, key);
    if (!v && !required) return NULL;
    if (!v || json_typeof(v) != type) {
        static const char *names[] = {"an object", "an array", "a string", "an integer", "a number", "true", "false", "null"};
        fm_set_error(FM_ERR_FORMAT, "'%s' must be %s", key, names[type]);
        return NULL;
    }
    return v;
}

static fm_status parse_shape(json_t *arr, int *ndim, int64_t *dims, const char **names) {
    if (!json_is_array(arr) || json_array_size(arr) > FM_MAX_DIMS) return bad("a shape must be an array of at most 8 sizes");
    *ndim = (int)json_array_size(arr);
    for (int d = 0; d < *ndim; d++) {
        json_t *e = json_array_get(arr, (size_t)d);
        names[d] = NULL;
        if (json_is_integer(e) && json_integer_value(e) >= 0 && json_integer_value(e) <= (INT64_C(1) << 40)) dims[d] = json_integer_value(e);
        else if (json_is_string(e)) { dims[d] = -1; names[d] = json_string_value(e); }
        else return bad("a shape's sizes must be integers in [0, 2^40] or dynamic dim names");
    }
    return FM_OK;
}

/* "f32 [\"batch\", 10]": the form check_declared compares (graph_check.c). */
static fm_status declared(gvalue *v, const char *dtype, json_t *shape) {
    fm_dtype dt;
    if (fm_dtype_from_name(dtype, &dt) != FM_OK) return fm_set_error(FM_ERR_FORMAT, "value '%s': unknown dtype '%s'", v->name, dtype);
    char *sh = json_dumps(shape, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!sh) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    size_t n = strlen(sh) * 2 + 16;
    v->decl_shape = malloc(n);
    if (!v->decl_shape) { free(sh); return fm_set_error(FM_ERR_OOM, "graph: out of host memory"); }
    size_t k = (size_t)snprintf(v->decl_shape, n, "%s ", fm_dtype_name(dt));
    for (const char *p = sh; *p && k + 2 < n; p++) { /* compact "[a,b]" to the writer's "[a, b]" */
        v->decl_shape[k++] = *p;
        if (*p == ',') v->decl_shape[k++] = ' ';
    }
    v->decl_shape[k] = 0;
    free(sh);
    return FM_OK;
}

static fm_status load_inputs(fm_graph *g, json_t *root) {
    json_t *arr = get(root, "inputs", JSON_ARRAY, true), *e;
    size_t i;
    if (!arr) return fm_last_status();
    json_array_foreach(arr, i, e) {
        json_t *name = get(e, "name", JSON_STRING, true), *dt = name ? get(e, "dtype", JSON_STRING, true) : NULL;
        json_t *shape = dt ? get(e, "shape", JSON_ARRAY, true) : NULL;
        if (!shape) { fm_error_prefix("input %zu", i); return fm_last_status(); }
        fm_dtype dtype;
        if (fm_dtype_from_name(json_string_value(dt), &dtype) != FM_OK)
            return fm_set_error(FM_ERR_FORMAT, "input '%s': unknown dtype '%s'", json_string_value(name), json_string_value(dt));
        int ndim = 0;
        int64_t dims[FM_MAX_DIMS];
        const char *names[FM_MAX_DIMS];
        if (parse_shape(shape, &ndim, dims, names)) { fm_error_prefix("input '%s'", json_string_value(name)); return fm_last_status(); }
        if (fm_graph_add_input(g, json_string_value(name), dtype, ndim, dims, names)) return fm_last_status();
    }
    return FM_OK;
}

static fm_status load_consts(fm_graph *g, json_t *root, const char *dir) {
    char path[4096];
    json_t *arr = get(root, "constants", JSON_ARRAY, true), *e;
    if (!arr) return fm_last_status();
    fm_named_list w = {0};
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    fm_status st = fm_safetensors_load(path, &w, NULL);
    if (st != FM_OK) return st;
    if (json_array_size(arr) != (size_t)w.n)
        st = fm_set_error(FM_ERR_FORMAT, "graph.json declares %zu constants but weights.safetensors holds %d tensors", json_array_size(arr), w.n);
    size_t i;
    json_array_foreach(arr, i, e) {
        if (st != FM_OK) break;
        json_t *name = get(e, "name", JSON_STRING, true), *dt = name ? get(e, "dtype", JSON_STRING, true) : NULL;
        json_t *shape = dt ? get(e, "shape", JSON_ARRAY, true) : NULL;
        if (!shape) { fm_error_prefix("constant %zu", i); st = fm_last_status(); break; }
        int k = fm_named_list_find(&w, json_string_value(name));
        if (k < 0) { st = fm_set_error(FM_ERR_FORMAT, "constant '%s' is not in weights.safetensors", json_string_value(name)); break; }
        int v = g_new_value(g, json_string_value(name), GV_CONST);
        if (v < 0) { st = fm_last_status(); break; }
        gvalue *val = &g->values[v];
        fm_tensor *t = w.items[k].tensor;
        val->tensor = fm_tensor_retain(t);
        val->t.dt = t->dtype;
        val->t.ndim = t->ndim;
        memcpy(val->t.d, t->shape, sizeof val->t.d);
        memcpy(val->probe2, t->shape, sizeof val->probe2);
        val->typed = true;
        st = declared(val, json_string_value(dt), shape);
    }
    fm_named_list_free(&w);
    return st;
}

static fm_status parse_attr(json_t *j, const char *name, fm_graph_attr *a, int64_t *ints, const char **dims, double *floats) {
    memset(a, 0, sizeof *a);
    a->name = name;
    if (json_is_integer(j)) { a->type = FM_ATTR_INT; a->i = json_integer_value(j); return FM_OK; }
    if (json_is_real(j)) { a->type = FM_ATTR_FLOAT; a->f = json_real_value(j); return FM_OK; }
    if (json_is_string(j)) { a->type = FM_ATTR_STRING; a->s = json_string_value(j); return FM_OK; }
    if (!json_is_array(j) || json_array_size(j) > 64) return fm_set_error(FM_ERR_FORMAT, "attribute '%s' must be a number, a string or an array of at most 64", name);
    size_t n = json_array_size(j), k;
    bool any_real = false, any_str = false;
    json_t *e;
    json_array_foreach(j, k, e) {
        if (json_is_real(e)) any_real = true;
        else if (json_is_string(e)) any_str = true;
        else if (!json_is_integer(e)) return fm_set_error(FM_ERR_FORMAT, "attribute '%s' element %zu is not a number or a string", name, k);
    }
    if (any_real && any_str) return fm_set_error(FM_ERR_FORMAT, "attribute '%s' mixes numbers and dim expressions", name);
    a->n = (int)n;
    a->type = any_real ? FM_ATTR_FLOATS : FM_ATTR_INTS;
    a->ints = ints;
    a->floats = floats;
    a->dims = dims;
    json_array_foreach(j, k, e) {
        floats[k] = json_number_value(e);
        ints[k] = json_is_integer(e) ? json_integer_value(e) : 0;
        dims[k] = json_is_string(e) ? json_string_value(e) : NULL;
    }
    return FM_OK;
}

static fm_status load_node(fm_graph *g, json_t *e) {
    json_t *op = get(e, "op", JSON_STRING, true), *name = op ? get(e, "name", JSON_STRING, false) : NULL;
    json_t *ins = op ? get(e, "inputs", JSON_ARRAY, true) : NULL, *outs = ins ? get(e, "outputs", JSON_ARRAY, true) : NULL;
    json_t *attrs = outs ? json_object_get(e, "attrs") : NULL;
    if (!outs) return fm_last_status();
    if (attrs && !json_is_object(attrs)) return bad("'attrs' must be an object");
    if (json_array_size(ins) > FM_GRAPH_MAX_NODE_IO || json_array_size(outs) > FM_GRAPH_MAX_NODE_IO || json_object_size(attrs) > 64)
        return bad("too many inputs, outputs or attributes");
    const char *in_names[FM_GRAPH_MAX_NODE_IO], *out_names[FM_GRAPH_MAX_NODE_IO];
    json_t *decl[FM_GRAPH_MAX_NODE_IO] = {0};
    size_t k;
    json_t *x;
    json_array_foreach(ins, k, x) {
        if (!json_is_string(x)) return bad("'inputs' must hold value names");
        in_names[k] = json_string_value(x);
    }
    json_array_foreach(outs, k, x) {
        if (json_is_string(x)) { out_names[k] = json_string_value(x); continue; }
        json_t *nm = get(x, "name", JSON_STRING, true);
        if (!nm) return fm_last_status();
        out_names[k] = json_string_value(nm);
        decl[k] = x;
    }
    /* attribute element buffers: 64 attributes of up to 64 elements each */
    struct abuf { int64_t ints[64]; const char *dims[64]; double floats[64]; } *ab = malloc(64 * sizeof *ab);
    fm_graph_attr a[64];
    int na = 0;
    const char *key;
    if (!ab) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    json_object_foreach(attrs, key, x) {
        if (parse_attr(x, key, &a[na], ab[na].ints, ab[na].dims, ab[na].floats)) { free(ab); return fm_last_status(); }
        na++;
    }
    fm_status st = fm_graph_add_node(g, json_string_value(op), name ? json_string_value(name) : NULL, (int)json_array_size(ins), in_names,
                                     (int)json_array_size(outs), out_names, na, a);
    free(ab);
    if (st != FM_OK) return st;
    const gnode *n = &g->nodes[g->n_nodes - 1];
    for (int o = 0; o < n->n_out; o++) {
        if (!decl[o]) continue;
        json_t *dt = get(decl[o], "dtype", JSON_STRING, true), *sh = dt ? get(decl[o], "shape", JSON_ARRAY, true) : NULL;
        if (!sh || declared(&g->values[n->out[o]], json_string_value(dt), sh)) return fm_last_status();
    }
    return FM_OK;
}

static fm_status load_rest(fm_graph *g, json_t *root) {
    json_t *nodes = get(root, "nodes", JSON_ARRAY, true), *outs = nodes ? get(root, "outputs", JSON_ARRAY, true) : NULL, *e;
    if (!outs) return fm_last_status();
    size_t i;
    json_array_foreach(nodes, i, e) {
        if (!json_is_object(e)) return fm_set_error(FM_ERR_FORMAT, "node %zu is not an object", i);
        if (load_node(g, e)) { fm_error_prefix("node %zu", i); return fm_last_status(); }
    }
    json_array_foreach(outs, i, e) {
        if (!json_is_string(e)) return bad("'outputs' must hold value names");
        if (fm_graph_add_output(g, json_string_value(e))) return fm_last_status();
    }
    json_t *meta = get(root, "meta", JSON_OBJECT, false);
    const char *key;
    json_object_foreach(meta, key, e) {
        if (!json_is_string(e)) return fm_set_error(FM_ERR_FORMAT, "meta '%s' must be a string", key);
        if (fm_graph_set_meta(g, key, json_string_value(e))) return fm_last_status();
    }
    return FM_OK;
}

static fm_status load_header(fm_graph *g, json_t *root) {
    if (!json_is_object(root)) return bad("the top level must be an object");
    json_t *fmt = get(root, "format", JSON_STRING, true), *ver = fmt ? get(root, "version", JSON_INTEGER, true) : NULL;
    if (!ver) return fm_last_status();
    if (strcmp(json_string_value(fmt), "fathom-graph")) return fm_set_error(FM_ERR_FORMAT, "format is '%s', expected 'fathom-graph'", json_string_value(fmt));
    if (json_integer_value(ver) != 1)
        return fm_set_error(FM_ERR_UNSUPPORTED, "graph format version %lld; this fathom reads version 1", (long long)json_integer_value(ver));
    json_t *hints = get(root, "dim_hints", JSON_OBJECT, false), *e;
    const char *key;
    json_object_foreach(hints, key, e) {
        if (!json_is_integer(e)) return fm_set_error(FM_ERR_FORMAT, "dim hint '%s' must be an integer", key);
        if (fm_graph_set_dim_hint(g, key, json_integer_value(e))) return fm_last_status();
    }
    return FM_OK;
}

/* Builds the graph from graph.json's text (a separate step, so the fuzzer can drive it without files). */
fm_graph *g_load_text(const char *text, size_t len, const char *dir);
fm_graph *g_load_text(const char *text, size_t len, const char *dir) {
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        fm_set_error(FM_ERR_FORMAT, "invalid JSON at line %d column %d: %s", err.line, err.column, err.text);
        return NULL;
    }
    fm_graph *g = fm_graph_new();
    fm_status st = g ? load_header(g, root) : fm_last_status();
    if (st == FM_OK) st = load_inputs(g, root);
    if (st == FM_OK && dir) st = load_consts(g, root, dir);
    if (st == FM_OK && !dir && json_array_size(json_object_get(root, "constants")))
        st = fm_set_error(FM_ERR_FORMAT, "constants need a weights file");
    if (st == FM_OK) st = load_rest(g, root);
    if (st == FM_OK) st = fm_graph_validate(g);
    json_decref(root);
    if (st != FM_OK) { fm_graph_free(g); return NULL; }
    return g;
}

fm_graph *fm_graph_load(const char *dir) {
    char path[4096];
    struct stat sb;
    if (!dir) { fm_set_error(FM_ERR_INVALID, "graph load: NULL directory"); return NULL; }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) { fm_set_error(FM_ERR_IO, "%s: not a directory", dir); return NULL; }
    snprintf(path, sizeof path, "%s/graph.json", dir);
    if (!fm_graph_dir_is_graph(dir)) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        bool model = stat(path, &sb) == 0;
        fm_set_error(FM_ERR_INVALID, "%s is not a graph directory (no graph.json)%s", dir,
                     model ? "; it holds a trained model: make a graph of it with `fathom compile`" : "");
        return NULL;
    }
    if (stat(path, &sb) != 0 || sb.st_size > GRAPH_JSON_MAX) { fm_set_error(FM_ERR_FORMAT, "%s: unreadable or larger than 64 MiB", path); return NULL; }
    FILE *f = fopen(path, "rb");
    if (!f) { fm_set_error(FM_ERR_IO, "%s: cannot open", path); return NULL; }
    char *buf = malloc((size_t)sb.st_size + 1);
    size_t n = buf ? fread(buf, 1, (size_t)sb.st_size + 1, f) : 0;
    fclose(f);
    if (!buf || n != (size_t)sb.st_size) {
        free(buf);
        fm_set_error(buf ? FM_ERR_IO : FM_ERR_OOM, "%s: %s", path, buf ? "changed while being read" : "out of host memory");
        return NULL;
    }
    fm_graph *g = g_load_text(buf, n, dir);
    free(buf);
    if (!g) fm_error_prefix("%s", path);
    /* the tokenizer files a GPT graph carries (fathom's, or a Hugging Face model's),
     * and a Hugging Face model's generation_config.json (its end-of-sequence ids) and
     * chat template's files, so that compile and quantize pass them on */
    const char *tok[] = {"tokenizer.txt",          "vocab.json",            "merges.txt",          "tokenizer.json",
                         "generation_config.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json"};
    for (int i = 0; g && i < 8; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, tok[i]);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && fm_graph_attach_file(g, tok[i], path)) { fm_graph_free(g); g = NULL; }
    }
    return g;
}
