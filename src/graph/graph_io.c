/* Graph directories: DIR/graph.json (the graph, human-readable) and
 * DIR/weights.safetensors (the constants). Saving writes both into
 * DIR.tmp.<pid> and makes it DIR in one step (fm_dir_commit: a rename, or an
 * atomic exchange with a previous graph directory), so a crash leaves the old
 * graph or the new one. Loading trusts nothing: the JSON's structure, every name, dtype, shape
 * and attribute, the weights against the declared constants, then the whole
 * graph through fm_graph_validate before it is returned. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "graph/graph_internal.h"
#include "io/io_internal.h"

#define GRAPH_FORMAT "fathom-graph"
#define GRAPH_VERSION 1

/* ---------------- writing ---------------- */

static json_t *shape_json(const fm_graph *g, const gvalue *v) {
    char buf[512];
    g_shape_text(g, v, buf, sizeof buf);
    return json_loads(buf, 0, NULL);
}

static json_t *attr_json(const gattr *a) {
    switch (a->type) {
    case FM_ATTR_INT: return json_integer(a->i);
    case FM_ATTR_FLOAT:
        if (isfinite(a->f)) return json_real(a->f);
        return json_string(isnan(a->f) ? "nan" : a->f > 0 ? "inf" : "-inf");
    case FM_ATTR_STRING: return json_string(a->s);
    case FM_ATTR_INTS: {
        json_t *arr = json_array();
        for (int k = 0; arr && k < a->n; k++)
            json_array_append_new(arr, a->ints[k].expr ? json_string(a->ints[k].expr) : json_integer(a->ints[k].v));
        return arr;
    }
    case FM_ATTR_FLOATS: {
        json_t *arr = json_array();
        for (int k = 0; arr && k < a->n; k++) {
            if (!isfinite(a->floats[k])) { json_decref(arr); return NULL; }
            json_array_append_new(arr, json_real(a->floats[k]));
        }
        return arr;
    }
    }
    return NULL;
}

static json_t *value_json(const fm_graph *g, const gvalue *v) {
    return json_pack("{s:s, s:s, s:o}", "name", v->name, "dtype", fm_dtype_name(v->t.dt), "shape", shape_json(g, v));
}

static json_t *node_json(const fm_graph *g, const gnode *n) {
    json_t *ins = json_array(), *outs = json_array(), *attrs = json_object();
    for (int k = 0; k < n->n_in; k++) json_array_append_new(ins, json_string(n->in[k] >= 0 ? g->values[n->in[k]].name : ""));
    for (int k = 0; k < n->n_out; k++) json_array_append_new(outs, value_json(g, &g->values[n->out[k]]));
    for (int k = 0; k < n->n_attrs; k++) {
        json_t *a = attr_json(&n->attrs[k]);
        if (!a) {
            json_decref(ins);
            json_decref(outs);
            json_decref(attrs);
            fm_set_error(FM_ERR_INVALID, "graph: node '%s' attribute '%s' holds a non-finite number in a list", n->name, n->attrs[k].name);
            return NULL;
        }
        json_object_set_new(attrs, n->attrs[k].name, a);
    }
    return json_pack("{s:s, s:s, s:o, s:o, s:o}", "name", n->name, "op", n->op, "inputs", ins, "outputs", outs, "attrs", attrs);
}

/* graph.json's layout: one line per top-level key, and one per element of
 * the top-level arrays (a node per line), so the file reads and diffs well. */
static char *layout_text(json_t *root) {
    const size_t flags = JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17) | JSON_ENCODE_ANY;
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    const char *key;
    json_t *v;
    bool first = true;
#define APPEND(str) do { const char *s_ = (str); size_t l_ = strlen(s_); \
        if (len + l_ + 2 > cap) { while (len + l_ + 2 > cap) cap *= 2; char *n_ = realloc(out, cap); if (!n_) goto oom; out = n_; } \
        memcpy(out + len, s_, l_); len += l_; out[len] = 0; } while (0)
    if (!out) goto oom;
    out[0] = 0;
    APPEND("{");
    json_object_foreach(root, key, v) {
        APPEND(first ? "\n \"" : ",\n \"");
        first = false;
        APPEND(key);
        APPEND("\": ");
        if (json_is_array(v) && json_array_size(v)) {
            size_t i;
            json_t *e;
            APPEND("[");
            json_array_foreach(v, i, e) {
                char *t = json_dumps(e, flags);
                if (!t) goto oom;
                APPEND(i ? ",\n  " : "\n  ");
                APPEND(t);
                free(t);
            }
            APPEND("\n ]");
        } else {
            char *t = json_dumps(v, flags);
            if (!t) goto oom;
            APPEND(t);
            free(t);
        }
    }
    APPEND("\n}\n");
#undef APPEND
    return out;
oom:
    free(out);
    fm_set_error(FM_ERR_OOM, "graph: out of host memory writing graph.json");
    return NULL;
}

static char *graph_json_text(const fm_graph *g) {
    json_t *root = json_pack("{s:s, s:i}", "format", GRAPH_FORMAT, "version", GRAPH_VERSION);
    json_t *meta = json_object(), *hints = json_object(), *ins = json_array(), *consts = json_array(), *nodes = json_array(), *outs = json_array();
    for (int i = 0; i < g->meta.n; i++) json_object_set_new(meta, g->meta.items[i].key, json_string(g->meta.items[i].value));
    for (int s = 0; s < g->n_syms; s++) json_object_set_new(hints, g->syms[s].name, json_integer(g->syms[s].hint));
    for (int i = 0; i < g->n_inputs; i++) json_array_append_new(ins, value_json(g, &g->values[g->inputs[i]]));
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == GV_CONST) json_array_append_new(consts, value_json(g, &g->values[v]));
    bool ok = true;
    for (int i = 0; i < g->n_nodes && ok; i++) {
        json_t *nj = node_json(g, &g->nodes[i]);
        ok = nj != NULL;
        if (ok) json_array_append_new(nodes, nj);
    }
    for (int i = 0; i < g->n_outputs; i++) json_array_append_new(outs, json_string(g->values[g->outputs[i]].name));
    json_object_set_new(root, "meta", meta);
    json_object_set_new(root, "dim_hints", hints);
    json_object_set_new(root, "inputs", ins);
    json_object_set_new(root, "outputs", outs);
    json_object_set_new(root, "constants", consts);
    json_object_set_new(root, "nodes", nodes);
    char *text = ok ? layout_text(root) : NULL;
    json_decref(root);
    return text;
}

/* An attached file, copied into the directory being written. */
static fm_status copy_file(const char *src, const char *dir, const char *name) {
    FILE *f = fopen(src, "rb");
    if (!f) return fm_set_error(FM_ERR_IO, "graph save: cannot read %s (attached as %s): %s", src, name, strerror(errno));
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2) : NULL;
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return fm_set_error(FM_ERR_OOM, "graph save: cannot hold %s in memory", src);
    char path[PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fm_status st = fm_atomic_write(path, 1, (fm_io_chunk[]){{buf, n}});
    free(buf);
    return st;
}

static fm_status write_files(const fm_graph *g, const char *tmp) {
    char path[PATH_MAX + 32];
    char *text = graph_json_text(g);
    if (!text) return fm_last_status();
    snprintf(path, sizeof path, "%s/graph.json", tmp);
    fm_status st = fm_atomic_write(path, 1, (fm_io_chunk[]){{text, strlen(text)}});
    free(text);
    if (st != FM_OK) return st;
    fm_named_list list = {0};
    for (int v = 0; v < g->n_values && st == FM_OK; v++) {
        const gvalue *val = &g->values[v];
        if (val->kind != GV_CONST) continue;
        fm_tensor *h = fm_tensor_to(val->tensor, FM_CPU);
        st = h ? fm_named_list_push(&list, val->name, h, false, false) : fm_last_status();
        fm_tensor_release(h); /* the list borrows; the graph keeps the host copy alive (or h was the same tensor) */
    }
    for (int i = 0; st == FM_OK && i < g->n_files; i++) st = copy_file(g->file_path[i], tmp, g->file_name[i]);
    fm_kv_list meta = {0};
    if (st == FM_OK) st = fm_kv_set(&meta, "format", GRAPH_FORMAT);
    snprintf(path, sizeof path, "%s/weights.safetensors", tmp);
    if (st == FM_OK) st = fm_safetensors_save(path, &list, &meta);
    fm_kv_free(&meta);
    fm_named_list_free(&list);
    return st;
}

fm_status fm_graph_save(fm_graph *g, const char *dir) {
    if (!g || !dir || !*dir) return fm_set_error(FM_ERR_INVALID, "graph save: NULL graph or empty directory");
    if (strlen(dir) > PATH_MAX - 64) return fm_set_error(FM_ERR_INVALID, "graph save: directory path too long");
    if (!fm_device_eq(g->device, FM_CPU)) return fm_set_error(FM_ERR_UNSUPPORTED, "graph save: move the graph to the CPU first (fm_graph_to_device)");
    if (fm_graph_validate(g)) return fm_last_status();
    /* an existing graph directory is replaced whole; anything else that is not empty is refused */
    fm_stale_sweep(dir, stderr); /* first: it may put back a graph that a dead save had moved aside */
    struct stat sb;
    bool is_graph = fm_graph_dir_is_graph(dir);
    if (stat(dir, &sb) == 0 && (!S_ISDIR(sb.st_mode) || (!is_graph && !fm_dir_is_empty(dir))))
        return fm_set_error(FM_ERR_INVALID, "graph save: %s exists and is not a graph directory; not replacing it (choose a new path)", dir);
    fm_dir_tx tx;
    fm_status st = fm_dir_begin(&tx, dir, is_graph, "graph save");
    if (st == FM_OK && (st = write_files(g, tx.tmp)) != FM_OK) fm_dir_abort(&tx);
    if (st == FM_OK) st = fm_dir_commit(&tx);
    return st;
}

bool fm_graph_dir_is_graph(const char *dir) {
    char p[PATH_MAX];
    struct stat sb;
    if (!dir || snprintf(p, sizeof p, "%s/graph.json", dir) >= (int)sizeof p) return false;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}
