/* The graph builder: values (inputs, constants, node outputs) by unique name,
 * nodes in execution order, outputs, dynamic-dim symbols, metadata; and the
 * metadata getters. Shape inference and checks live in graph_check.c. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/ops.h"
#include "graph/graph_internal.h"

static char *dup_str(const char *s) {
    char *r = strdup(s ? s : "");
    if (!r) fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    return r;
}

static bool grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) { fm_set_error(FM_ERR_OOM, "graph: out of host memory"); return false; }
    *p = q;
    *cap = nc;
    return true;
}

bool g_is_ident(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_')) return false;
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_')) return false;
    return strlen(s) <= 64;
}

fm_graph *fm_graph_new(void) {
    fm_graph *g = calloc(1, sizeof *g);
    if (!g) { fm_set_error(FM_ERR_OOM, "graph: out of host memory"); return NULL; }
    g->device = FM_CPU;
    return g;
}

static void free_attr(gattr *a) {
    free(a->name);
    free(a->s);
    if (a->ints)
        for (int k = 0; k < a->n; k++) free(a->ints[k].expr);
    free(a->ints);
    free(a->floats);
}

void fm_graph_free(fm_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_values; i++) {
        free(g->values[i].name);
        free(g->values[i].decl_shape);
        fm_tensor_release(g->values[i].tensor);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        gnode *n = &g->nodes[i];
        free(n->op);
        free(n->name);
        free(n->in);
        free(n->out);
        for (int k = 0; k < n->n_attrs; k++) free_attr(&n->attrs[k]);
        free(n->attrs);
    }
    for (int i = 0; i < g->n_syms; i++) free(g->syms[i].name);
    for (int i = 0; i < g->n_files; i++) { free(g->file_name[i]); free(g->file_path[i]); }
    free(g->values);
    free(g->nodes);
    free(g->inputs);
    free(g->outputs);
    free(g->hash);
    fm_kv_free(&g->meta);
    g_unprepare(g);
    free(g);
}

/* ---- names ---- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static bool rehash(fm_graph *g, int cap) {
    int *h = malloc((size_t)cap * sizeof *h);
    if (!h) { fm_set_error(FM_ERR_OOM, "graph: out of host memory"); return false; }
    for (int i = 0; i < cap; i++) h[i] = -1;
    for (int v = 0; v < g->n_values; v++) {
        size_t k = hash_str(g->values[v].name) & (size_t)(cap - 1);
        while (h[k] >= 0) k = (k + 1) & (size_t)(cap - 1);
        h[k] = v;
    }
    free(g->hash);
    g->hash = h;
    g->cap_hash = cap;
    return true;
}

int g_find_value(const fm_graph *g, const char *name) {
    if (!g->cap_hash || !name) return -1;
    size_t k = hash_str(name) & (size_t)(g->cap_hash - 1);
    while (g->hash[k] >= 0) {
        if (!strcmp(g->values[g->hash[k]].name, name)) return g->hash[k];
        k = (k + 1) & (size_t)(g->cap_hash - 1);
    }
    return -1;
}

int g_new_value(fm_graph *g, const char *name, gv_kind kind) {
    if (!name || !*name) { fm_set_error(FM_ERR_INVALID, "graph: a value needs a non-empty name"); return -1; }
    if (strlen(name) > 256) { fm_set_error(FM_ERR_INVALID, "graph: value name '%.40s...' is longer than 256 characters", name); return -1; }
    if (g_find_value(g, name) >= 0) {
        fm_set_error(FM_ERR_INVALID, "graph: value '%s' is defined twice (names are unique across inputs, constants and node outputs)", name);
        return -1;
    }
    if (!grow((void **)&g->values, &g->cap_values, g->n_values + 1, sizeof *g->values)) return -1;
    if ((g->n_values + 1) * 2 > g->cap_hash && !rehash(g, g->cap_hash ? g->cap_hash * 2 : 64)) return -1;
    gvalue *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    v->name = dup_str(name);
    if (!v->name) return -1;
    v->kind = kind;
    v->producer = -1;
    v->last_use = -1;
    for (int d = 0; d < FM_MAX_DIMS; d++) v->sym[d] = -1;
    g->n_values++;
    size_t k = hash_str(name) & (size_t)(g->cap_hash - 1);
    while (g->hash[k] >= 0) k = (k + 1) & (size_t)(g->cap_hash - 1);
    g->hash[k] = g->n_values - 1;
    g->validated = false;
    return g->n_values - 1;
}

int g_find_sym(const fm_graph *g, const char *name) {
    for (int i = 0; i < g->n_syms; i++)
        if (!strcmp(g->syms[i].name, name)) return i;
    return -1;
}

int g_add_sym(fm_graph *g, const char *name) {
    if (!g_is_ident(name)) {
        fm_set_error(FM_ERR_INVALID, "graph: dynamic dim name '%s' is not an identifier (letters, digits, _)", name ? name : "(null)");
        return -1;
    }
    int s = g_find_sym(g, name);
    if (s >= 0) return s;
    if (g->n_syms == G_MAX_SYMS) { fm_set_error(FM_ERR_INVALID, "graph: more than %d dynamic dim names", G_MAX_SYMS); return -1; }
    g->syms[g->n_syms].name = dup_str(name);
    if (!g->syms[g->n_syms].name) return -1;
    g->syms[g->n_syms].hint = 2;
    return g->n_syms++;
}

/* ---- builder ---- */

fm_status fm_graph_add_input(fm_graph *g, const char *name, fm_dtype dt, int ndim, const int64_t *dims,
                             const char *const *dim_names) {
    if (!g) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph");
    if ((unsigned)dt >= FM_DTYPE_COUNT) return fm_set_error(FM_ERR_INVALID, "graph: input '%s' has an invalid dtype", name ? name : "");
    if (ndim < 0 || ndim > FM_MAX_DIMS || (ndim && !dims))
        return fm_set_error(FM_ERR_INVALID, "graph: input '%s' has %d dims (0 to %d allowed)", name ? name : "", ndim, FM_MAX_DIMS);
    int sym[FM_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        sym[d] = -1;
        if (dims[d] >= 0) continue;
        if (!dim_names || !dim_names[d])
            return fm_set_error(FM_ERR_INVALID, "graph: input '%s' dim %d is dynamic but has no name", name ? name : "", d);
        if ((sym[d] = g_add_sym(g, dim_names[d])) < 0) return fm_last_status();
    }
    if (!grow((void **)&g->inputs, &g->cap_inputs, g->n_inputs + 1, sizeof *g->inputs)) return fm_last_status();
    int v = g_new_value(g, name, GV_INPUT);
    if (v < 0) return fm_last_status();
    gvalue *val = &g->values[v];
    val->t.dt = dt;
    val->t.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        val->t.d[d] = dims[d] >= 0 ? dims[d] : 0;
        val->sym[d] = sym[d];
    }
    val->typed = true;
    g->inputs[g->n_inputs++] = v;
    return FM_OK;
}

fm_status fm_graph_add_const(fm_graph *g, const char *name, const fm_tensor *t) {
    if (!g || !t) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph or tensor for constant '%s'", name ? name : "");
    fm_tensor *h = fm_tensor_to((fm_tensor *)t, FM_CPU);
    fm_tensor *c = h ? fm_clone(h) : NULL; /* owned and contiguous, detached from any tape */
    fm_tensor_release(h);
    if (!c) return fm_last_status();
    c->requires_grad = false;
    int v = g_new_value(g, name, GV_CONST);
    if (v < 0) { fm_tensor_release(c); return fm_last_status(); }
    gvalue *val = &g->values[v];
    val->tensor = c;
    val->t.dt = c->dtype;
    val->t.ndim = c->ndim;
    memcpy(val->t.d, c->shape, sizeof val->t.d);
    memcpy(val->probe2, c->shape, sizeof val->probe2);
    val->typed = true;
    if (!fm_device_eq(g->device, FM_CPU)) {
        fm_tensor *d = fm_tensor_to(c, g->device);
        if (!d) return fm_last_status();
        fm_tensor_release(c);
        val->tensor = d;
    }
    return FM_OK;
}

static fm_status copy_attr(gattr *dst, const fm_graph_attr *a, const char *node) {
    memset(dst, 0, sizeof *dst);
    if (!a->name || !g_is_ident(a->name))
        return fm_set_error(FM_ERR_INVALID, "graph: node '%s' has an attribute with a bad name ('%s')", node, a->name ? a->name : "(null)");
    if (a->n < 0 || a->n > 4096) return fm_set_error(FM_ERR_INVALID, "graph: node '%s' attribute '%s' has %d elements", node, a->name, a->n);
    dst->type = a->type;
    dst->i = a->i;
    dst->f = a->f;
    dst->n = a->n;
    if (!(dst->name = dup_str(a->name))) return fm_last_status();
    switch (a->type) {
    case FM_ATTR_INT: case FM_ATTR_FLOAT: return FM_OK;
    case FM_ATTR_STRING: return (dst->s = dup_str(a->s)) ? FM_OK : fm_last_status();
    case FM_ATTR_FLOATS:
        if (!(dst->floats = calloc((size_t)a->n + 1, sizeof(double)))) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
        if (a->n) memcpy(dst->floats, a->floats, (size_t)a->n * sizeof(double));
        return FM_OK;
    case FM_ATTR_INTS:
        if (!(dst->ints = calloc((size_t)a->n + 1, sizeof(gdim)))) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
        for (int k = 0; k < a->n; k++) {
            if (a->dims && a->dims[k]) {
                if (!(dst->ints[k].expr = dup_str(a->dims[k]))) return fm_last_status();
            } else {
                dst->ints[k].v = a->ints ? a->ints[k] : 0;
            }
        }
        return FM_OK;
    }
    return fm_set_error(FM_ERR_INVALID, "graph: node '%s' attribute '%s' has an unknown type %d", node, a->name, (int)a->type);
}

static fm_status fill_node(fm_graph *g, gnode *n, int n_in, const char *const *inputs, int n_out,
                           const char *const *outputs, int n_attrs, const fm_graph_attr *attrs) {
    n->in = calloc((size_t)n_in + 1, sizeof(int));
    n->out = calloc((size_t)n_out + 1, sizeof(int));
    n->attrs = calloc((size_t)n_attrs + 1, sizeof(gattr));
    if (!n->in || !n->out || !n->attrs) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    for (int i = 0; i < n_in; i++) {
        const char *nm = inputs ? inputs[i] : NULL;
        if (!nm || !*nm) { n->in[i] = -1; n->n_in++; continue; }
        int v = g_find_value(g, nm);
        if (v < 0)
            return fm_set_error(FM_ERR_INVALID, "graph: node '%s' (%s) reads '%s', which no input, constant or earlier node defines",
                                n->name, n->op, nm);
        n->in[n->n_in++] = v;
    }
    for (int k = 0; k < n_attrs; k++) {
        for (int j = 0; j < k; j++)
            if (attrs[k].name && attrs[j].name && !strcmp(attrs[k].name, attrs[j].name))
                return fm_set_error(FM_ERR_INVALID, "graph: node '%s' has attribute '%s' twice", n->name, attrs[k].name);
        fm_status st = copy_attr(&n->attrs[k], &attrs[k], n->name);
        n->n_attrs++;
        if (st != FM_OK) return st;
    }
    for (int i = 0; i < n_out; i++) {
        int v = g_new_value(g, outputs ? outputs[i] : NULL, GV_NODE);
        if (v < 0) { fm_error_prefix("node '%s' (%s) output %d", n->name, n->op, i); return fm_last_status(); }
        g->values[v].producer = g->n_nodes - 1; /* n is the last node: counted before filling (fm_graph_add_node) */
        n->out[n->n_out++] = v;
    }
    return FM_OK;
}

fm_status fm_graph_add_node(fm_graph *g, const char *op, const char *name, int n_in, const char *const *inputs,
                            int n_out, const char *const *outputs, int n_attrs, const fm_graph_attr *attrs) {
    if (!g || !op) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph or op");
    int spec = g_op_find(op);
    if (spec < 0) return fm_set_error(FM_ERR_UNSUPPORTED, "graph: unknown op '%s' (docs/GRAPH.md lists the graph's ops)", op);
    if (n_in < 0 || n_in > FM_GRAPH_MAX_NODE_IO || n_out < 0 || n_out > FM_GRAPH_MAX_NODE_IO || n_attrs < 0 || n_attrs > 64 ||
        (n_attrs && !attrs))
        return fm_set_error(FM_ERR_INVALID, "graph: node of op '%s' has %d inputs, %d outputs, %d attributes (limits %d, %d, 64)", op,
                            n_in, n_out, n_attrs, FM_GRAPH_MAX_NODE_IO, FM_GRAPH_MAX_NODE_IO);
    if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes)) return fm_last_status();
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    char auto_name[48];
    snprintf(auto_name, sizeof auto_name, "%s_%d", op, g->n_nodes);
    n->op = dup_str(op);
    n->name = dup_str(name && *name ? name : auto_name);
    n->spec = spec;
    g->n_nodes++; /* counted now so that fm_graph_free releases a half-built node */
    if (!n->op || !n->name) return fm_last_status();
    g->validated = false;
    return fill_node(g, n, n_in, inputs, n_out, outputs, n_attrs, attrs);
}

fm_status fm_graph_add_output(fm_graph *g, const char *value) {
    if (!g) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph");
    int v = g_find_value(g, value);
    if (v < 0) return fm_set_error(FM_ERR_INVALID, "graph: output '%s' is not a value of the graph", value ? value : "(null)");
    if (g->values[v].is_output) return fm_set_error(FM_ERR_INVALID, "graph: '%s' is an output twice", value);
    if (!grow((void **)&g->outputs, &g->cap_outputs, g->n_outputs + 1, sizeof *g->outputs)) return fm_last_status();
    g->values[v].is_output = true;
    g->outputs[g->n_outputs++] = v;
    g->validated = false;
    return FM_OK;
}

fm_status fm_graph_set_dim_hint(fm_graph *g, const char *name, int64_t size) {
    if (!g) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph");
    if (size < 1 || size > (1 << 20)) return fm_set_error(FM_ERR_INVALID, "graph: dim hint for '%s' must be in [1, 2^20] (got %lld)", name ? name : "", (long long)size);
    int s = g_add_sym(g, name);
    if (s < 0) return fm_last_status();
    g->syms[s].hint = size;
    g->validated = false;
    return FM_OK;
}

fm_status fm_graph_set_meta(fm_graph *g, const char *key, const char *value) {
    if (!g || !key || !value) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph, key or value in set_meta");
    return fm_kv_set(&g->meta, key, value);
}

const char *fm_graph_get_meta(const fm_graph *g, const char *key) { return g && key ? fm_kv_get(&g->meta, key) : NULL; }

fm_status fm_graph_attach_file(fm_graph *g, const char *name, const char *path) {
    if (!g || !name || !path) return fm_set_error(FM_ERR_INVALID, "graph: NULL argument to attach_file");
    bool plain = *name && strlen(name) < 64 && name[0] != '.';
    for (const char *p = name; *p && plain; p++) plain = isalnum((unsigned char)*p) || *p == '.' || *p == '_' || *p == '-';
    if (!plain || !strcmp(name, "graph.json") || !strcmp(name, "weights.safetensors"))
        return fm_set_error(FM_ERR_INVALID, "graph: cannot attach a file named '%s' (a plain name other than graph.json and weights.safetensors)", name);
    int i = 0;
    while (i < g->n_files && strcmp(g->file_name[i], name)) i++;
    if (i == 4) return fm_set_error(FM_ERR_INVALID, "graph: at most 4 attached files");
    char *n = strdup(name), *p = strdup(path);
    if (!n || !p) { free(n); free(p); return fm_set_error(FM_ERR_OOM, "graph: out of host memory"); }
    if (i < g->n_files) { free(g->file_name[i]); free(g->file_path[i]); }
    else g->n_files++;
    g->file_name[i] = n;
    g->file_path[i] = p;
    return FM_OK;
}

const gattr *g_node_attr(const gnode *n, const char *name) {
    for (int k = 0; k < n->n_attrs; k++)
        if (!strcmp(n->attrs[k].name, name)) return &n->attrs[k];
    return NULL;
}

int64_t g_node_int(const gnode *n, const char *name, int64_t def) {
    const gattr *a = g_node_attr(n, name);
    return a && a->type == FM_ATTR_INT ? a->i : def;
}

bool g_list_has(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        const size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, name, n)) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

/* An attribute that is absent or every element of which is the number v. */
static bool attr_all(const gnode *n, const char *name, int64_t v) {
    const gattr *a = g_node_attr(n, name);
    if (!a) return true;
    if (a->type == FM_ATTR_INT) return a->i == v;
    if (a->type != FM_ATTR_INTS) return false;
    for (int k = 0; k < a->n; k++)
        if (a->ints[k].expr || a->ints[k].v != v) return false;
    return true;
}

bool g_conv_direct_geometry(const gnode *n) {
    const gattr *l = g_node_attr(n, "layout");
    return attr_all(n, "stride", 1) && attr_all(n, "dilation", 1) && attr_all(n, "groups", 1) &&
           (!l || (l->type == FM_ATTR_STRING && !strcmp(l->s, "NCHW")));
}

/* ---- attribute constructors ---- */

fm_graph_attr fm_graph_attr_int(const char *name, int64_t v) { return (fm_graph_attr){.name = name, .type = FM_ATTR_INT, .i = v}; }
fm_graph_attr fm_graph_attr_float(const char *name, double v) { return (fm_graph_attr){.name = name, .type = FM_ATTR_FLOAT, .f = v}; }
fm_graph_attr fm_graph_attr_ints(const char *name, int n, const int64_t *v) {
    return (fm_graph_attr){.name = name, .type = FM_ATTR_INTS, .n = n, .ints = v};
}
fm_graph_attr fm_graph_attr_floats(const char *name, int n, const double *v) {
    return (fm_graph_attr){.name = name, .type = FM_ATTR_FLOATS, .n = n, .floats = v};
}
fm_graph_attr fm_graph_attr_string(const char *name, const char *s) { return (fm_graph_attr){.name = name, .type = FM_ATTR_STRING, .s = s}; }

/* ---- metadata getters ---- */

int fm_graph_num_inputs(const fm_graph *g) { return g ? g->n_inputs : 0; }
int fm_graph_num_outputs(const fm_graph *g) { return g ? g->n_outputs : 0; }
int fm_graph_num_nodes(const fm_graph *g) { return g ? g->n_nodes : 0; }
const char *fm_graph_node_op(const fm_graph *g, int i) { return g && i >= 0 && i < g->n_nodes ? g->nodes[i].op : NULL; }

int64_t fm_graph_input_id_limit(const fm_graph *g, int i) {
    if (!g || i < 0 || i >= g->n_inputs) return 0;
    const int v = g->inputs[i];
    int64_t lim = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        const gnode *n = &g->nodes[k];
        int table = -1;
        if (!strcmp(n->op, "embedding") && n->n_in == 2 && n->in[1] == v) table = n->in[0];
        else if (!strcmp(n->op, "qembedding_int4") && n->n_in >= 3 && n->in[2] == v) table = n->in[0];
        else if (!strcmp(n->op, "qembedding_int8") && n->n_in >= 3 && n->in[2] == v) table = n->in[1]; /* its scales [V] */
        if (table < 0 || g->values[table].kind != GV_CONST || g->values[table].t.ndim != (table == n->in[1] ? 1 : 2)) continue;
        int64_t rows = g->values[table].t.d[0];
        if (rows > 0 && (lim == 0 || rows < lim)) lim = rows;
    }
    return lim;
}

int fm_graph_num_consts(const fm_graph *g) {
    int n = 0;
    for (int i = 0; g && i < g->n_values; i++) n += g->values[i].kind == GV_CONST;
    return n;
}
fm_device fm_graph_device(const fm_graph *g) { return g ? g->device : FM_CPU; }

static fm_status io_info(const fm_graph *g, int v, fm_graph_io *out) {
    const gvalue *val = &g->values[v];
    memset(out, 0, sizeof *out);
    out->name = val->name;
    out->dtype = val->t.dt;
    out->ndim = val->t.ndim;
    for (int d = 0; d < val->t.ndim; d++) {
        if (val->kind == GV_INPUT && val->sym[d] >= 0) {
            out->shape[d] = FM_DIM_DYNAMIC;
            out->dim_names[d] = g->syms[val->sym[d]].name;
        } else if (val->t.d[d] != val->probe2[d]) {
            out->shape[d] = FM_DIM_DYNAMIC;
            for (int s = 0; s < g->n_syms; s++) /* a dim that is exactly one name's size */
                if (val->t.d[d] == g->syms[s].hint && val->probe2[d] == g->syms[s].hint + 1 + s) out->dim_names[d] = g->syms[s].name;
        } else {
            out->shape[d] = val->t.d[d];
        }
    }
    return FM_OK;
}

fm_status fm_graph_input_info(const fm_graph *g, int i, fm_graph_io *out) {
    if (!g || !out || i < 0 || i >= g->n_inputs) return fm_set_error(FM_ERR_INVALID, "graph: no input %d", i);
    return io_info(g, g->inputs[i], out);
}

fm_status fm_graph_output_info(const fm_graph *g, int i, fm_graph_io *out) {
    if (!g || !out || i < 0 || i >= g->n_outputs) return fm_set_error(FM_ERR_INVALID, "graph: no output %d", i);
    if (!g->validated) return fm_set_error(FM_ERR_STATE, "graph: output info needs a validated graph (fm_graph_validate)");
    return io_info(g, g->outputs[i], out);
}
