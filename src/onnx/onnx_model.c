/* ModelProto -> fm_onnx_model: every value name gets a slot, initializers become
 * tensors, declared types are checked against them, and every node is checked
 * against the op table (op, opset, inputs, attributes) so that an unsupported
 * model fails at load with the node named, never half-way through a run.
 *
 * A GRAPH attribute (If's branches, Loop's and Scan's body) becomes a model of its
 * own, built the same way while its node is loaded. A name it reads that none of its
 * own initializers, inputs or nodes define is looked up in the enclosing graphs, as
 * far as they are loaded (ONNX's lexical scope): the subgraph gets a slot captured
 * from the graph around it, and that graph's node keeps the value alive (an implicit
 * input) until it has run. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"
#include "graph/graph_internal.h" /* g_list_has */

typedef struct {
    char **keys;
    int *vals;
    size_t cap;
} name_map;

/* A graph being loaded: its model and names, the node being loaded (whose subgraphs are
 * being built) and the graph around it (NULL for the main graph). */
typedef struct scope {
    fm_onnx_model *m;
    name_map *nm;
    onnx_node *cur;
    struct scope *up;
} scope;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The slot of `name`, or -1; with add, creates it as slot m->n_values. */
static int slot_of(fm_onnx_model *m, name_map *nm, char *name, bool add) {
    size_t i = hash_str(name) & (nm->cap - 1);
    for (; nm->keys[i]; i = (i + 1) & (nm->cap - 1))
        if (!strcmp(nm->keys[i], name)) return nm->vals[i];
    if (!add) return -1;
    nm->keys[i] = name;
    nm->vals[i] = m->n_values;
    m->value_names[m->n_values] = name;
    return m->n_values++;
}

/* The slot of `name` as the graph of sc sees it: its own, or one captured from the
 * enclosing graphs (created, and recorded as an implicit input of their node); -1: none. */
static int scope_find(scope *sc, char *name) {
    fm_onnx_model *m = sc->m;
    int s = slot_of(m, sc->nm, name, false);
    if (s >= 0 || !sc->up) return s;
    int outer = scope_find(sc->up, name);
    if (outer < 0) return -1;
    onnx_node *n = sc->up->cur;
    bool seen = false;
    for (int k = 0; k < n->n_imp; k++) seen |= n->imp[k] == outer;
    if (!seen) n->imp[n->n_imp++] = outer;
    s = slot_of(m, sc->nm, name, true);
    m->cap_local[m->n_cap] = s;
    m->cap_outer[m->n_cap++] = outer;
    return s;
}

static fm_status model_error(const fm_onnx_model *m, fm_status st, const char *fmt, const char *a, const char *b) {
    char msg[768];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    return fm_set_error(st, "%s: %s", m->path, msg);
}

static int find_opset(const Onnx__ModelProto *p) {
    for (size_t i = 0; i < p->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = p->opset_import[i];
        if ((!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) && o->has_version)
            return o->version > 1000 ? 1000 : (int)o->version;
    }
    return -1;
}

/* A declared sequence or optional type: its kind and its tensors' element type. Sequences
 * hold tensors; an optional holds a tensor or such a sequence. */
static fm_status declared_value_type(const fm_onnx_model *m, const Onnx__ValueInfoProto *vi, const Onnx__TypeProto *tp,
                                     onnx_input *in) {
    const bool seq = tp->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE;
    in->kind = seq ? ONNX_SEQ : ONNX_OPT;
    const Onnx__TypeProto *e = seq ? tp->sequence_type->elem_type : tp->optional_type->elem_type;
    if (!seq && e && e->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE) e = e->sequence_type->elem_type;
    if (e && e->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        return model_error(m, FM_ERR_UNSUPPORTED, "'%s' is %s of maps, sequences or sparse tensors; fathom's sequences and optionals "
                           "hold tensors", vi->name, seq ? "a sequence" : "an optional");
    if (e && e->tensor_type->has_elem_type) in->item_type = e->tensor_type->elem_type;
    return FM_OK;
}

/* A declared type -> elem type, rank, dims (-1 where symbolic) of a tensor; the kind and the
 * element type of a sequence or optional. */
static fm_status declared_type(const fm_onnx_model *m, const Onnx__ValueInfoProto *vi, onnx_input *in) {
    const Onnx__TypeProto *tp = vi->type;
    in->elem_type = in->item_type = 0;
    in->ndim = -1;
    in->kind = ONNX_TENSOR;
    if (!tp) return FM_OK;
    if (tp->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE || tp->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE)
        return declared_value_type(m, vi, tp, in);
    if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        return model_error(m, FM_ERR_UNSUPPORTED, "'%s' is a map or sparse value (or of no type); fathom runs dense tensors, "
                           "sequences of them and optionals", vi->name, NULL);
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (tt->has_elem_type) in->elem_type = tt->elem_type;
    if (!tt->shape) return FM_OK;
    if (tt->shape->n_dim > FM_MAX_DIMS)
        return model_error(m, FM_ERR_UNSUPPORTED, "'%s' has more dimensions than fathom's 8", vi->name, NULL);
    in->ndim = (int)tt->shape->n_dim;
    for (int d = 0; d < in->ndim; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
        in->dims[d] = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ? dim->dim_value : -1;
    }
    return FM_OK;
}

/* A graph input or value_info that names an initializer must agree with it. */
static fm_status check_against_initializer(const fm_onnx_model *m, const Onnx__ValueInfoProto *vi, const fm_tensor *t) {
    onnx_input d;
    if (declared_type(m, vi, &d)) return fm_last_status();
    char why[256] = "";
    if (d.kind != ONNX_TENSOR)
        snprintf(why, sizeof why, "declared %s but an initializer is a tensor", d.kind == ONNX_SEQ ? "a sequence" : "an optional");
    else if (d.elem_type && d.elem_type != onnx_dtype_from_fm(t->dtype))
        snprintf(why, sizeof why, "declared element type %s but the initializer holds %s", onnx_dtype_name(d.elem_type),
                 fm_dtype_name(t->dtype));
    else if (d.ndim >= 0 && d.ndim != t->ndim)
        snprintf(why, sizeof why, "declared with %d dimensions but the initializer has %d", d.ndim, t->ndim);
    else
        for (int i = 0; i < d.ndim && !*why; i++)
            if (d.dims[i] >= 0 && d.dims[i] != t->shape[i])
                snprintf(why, sizeof why, "declared dimension %d is %" PRId64 " but the initializer's is %" PRId64, i, d.dims[i],
                         t->shape[i]);
    return *why ? model_error(m, FM_ERR_FORMAT, "tensor '%s': %s (the declared shape contradicts the initializer)", vi->name, why)
                : FM_OK;
}

static fm_status load_initializers(fm_onnx_model *m, name_map *nm) {
    const Onnx__GraphProto *g = m->graph;
    for (size_t i = 0; i < g->n_initializer; i++) {
        Onnx__TensorProto *tp = g->initializer[i];
        if (!tp->name || !*tp->name) return model_error(m, FM_ERR_FORMAT, "initializer %s has no name", "", NULL);
        int s = slot_of(m, nm, tp->name, true);
        if (m->constants[s]) return model_error(m, FM_ERR_FORMAT, "initializer '%s' is defined twice", tp->name, NULL);
        char what[512];
        snprintf(what, sizeof what, "%s: initializer '%s'", m->path, tp->name);
        if (!(m->constants[s] = onnx_tensor_from_proto(tp, m->dir, what))) return fm_last_status();
    }
    if (g->n_sparse_initializer) return model_error(m, FM_ERR_UNSUPPORTED, "sparse initializers are not supported%s", "", NULL);
    return FM_OK;
}

static fm_status load_inputs(fm_onnx_model *m, name_map *nm) {
    const Onnx__GraphProto *g = m->graph;
    m->inputs = calloc(g->n_input + 1, sizeof *m->inputs);
    if (!m->inputs) return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    for (size_t i = 0; i < g->n_input; i++) {
        const Onnx__ValueInfoProto *vi = g->input[i];
        if (!vi->name || !*vi->name) return model_error(m, FM_ERR_FORMAT, "graph input %s has no name", "", NULL);
        int s = slot_of(m, nm, vi->name, true);
        if (m->constants[s]) { /* an initializer listed as an input (IR < 4): a constant here */
            if (check_against_initializer(m, vi, m->constants[s])) return fm_last_status();
            continue;
        }
        onnx_input *in = &m->inputs[m->n_inputs];
        if (declared_type(m, vi, in)) return fm_last_status();
        fm_dtype dt;
        const int32_t et = in->kind == ONNX_TENSOR ? in->elem_type : in->item_type;
        if (et && !onnx_dtype_to_fm(et, &dt))
            return model_error(m, FM_ERR_UNSUPPORTED, "input '%s' has element type %s, which fathom does not support", vi->name,
                               onnx_dtype_name(et));
        if (in->kind != ONNX_TENSOR) m->root->has_values = true;
        in->slot = s;
        m->n_inputs++;
    }
    for (size_t i = 0; i < g->n_value_info; i++) {
        int s = g->value_info[i]->name ? slot_of(m, nm, g->value_info[i]->name, false) : -1;
        if (s >= 0 && m->constants[s] && check_against_initializer(m, g->value_info[i], m->constants[s])) return fm_last_status();
    }
    return FM_OK;
}

static fm_status node_error(const fm_onnx_model *m, int i, const Onnx__NodeProto *np, const char *fmt, const char *a) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a ? a : "");
    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: node %d '%s' (%s): %s", m->path, i, np->name ? np->name : "",
                        np->op_type ? np->op_type : "?", msg);
}

static fm_status check_node(fm_onnx_model *m, int i, const Onnx__NodeProto *np, const onnx_op **op) {
    const bool dflt = !np->domain || !*np->domain || !strcmp(np->domain, "ai.onnx");
    if (!dflt && strcmp(np->domain, "ai.onnx.preview"))
        return node_error(m, i, np, "op domain '%s' is not supported (the default ONNX domain and ai.onnx.preview are)", np->domain);
    if (!np->op_type || !(*op = onnx_find_op_domain(np->domain, np->op_type)))
        return node_error(m, i, np, "op %s is not supported by fathom (docs/ONNX.md lists the supported ops)",
                          np->op_type ? np->op_type : "(none)");
    if (dflt && m->opset < (*op)->min_opset) {
        char v[64];
        snprintf(v, sizeof v, "%d (fathom implements it from opset %d)", m->opset, (*op)->min_opset);
        return node_error(m, i, np, "opset %s", v);
    }
    if ((int)np->n_input < (*op)->min_in || ((*op)->max_in >= 0 && (int)np->n_input > (*op)->max_in))
        return node_error(m, i, np, "wrong number of inputs%s", "");
    if ((int)np->n_output > (*op)->max_out || np->n_output == 0)
        return node_error(m, i, np, "wrong number of outputs (or an output fathom does not compute)%s", "");
    for (size_t a = 0; a < np->n_attribute; a++) {
        const Onnx__AttributeProto *at = np->attribute[a];
        if (!at->name || !g_list_has((*op)->attrs, at->name))
            return node_error(m, i, np, "attribute '%s' is not supported", at->name ? at->name : "(unnamed)");
        if (at->ref_attr_name && *at->ref_attr_name)
            return node_error(m, i, np, "attribute '%s' refers to a function attribute (not supported)", at->name);
    }
    return FM_OK;
}

static fm_status build_graph(scope *sc);

/* An upper bound on the names a graph reads: its nodes' inputs and its outputs, nested
 * graphs included (each name it captures from the graphs around it is one of them). */
static size_t graph_refs(const Onnx__GraphProto *g) {
    size_t n = g->n_output;
    for (size_t i = 0; i < g->n_node; i++) {
        n += g->node[i]->n_input;
        for (size_t a = 0; a < g->node[i]->n_attribute; a++)
            if (g->node[i]->attribute[a]->g) n += graph_refs(g->node[i]->attribute[a]->g);
    }
    return n;
}

/* Each GRAPH attribute of node i becomes a model built in the scope of this graph. */
static fm_status load_subgraphs(scope *sc, int i, onnx_node *n) {
    fm_onnx_model *m = sc->m;
    const Onnx__NodeProto *np = n->proto;
    for (size_t a = 0; a < np->n_attribute; a++) {
        const Onnx__AttributeProto *at = np->attribute[a];
        if (at->n_graphs) return node_error(m, i, np, "attribute '%s' holds a list of graphs (not supported)", at->name);
        if (!at->g) continue;
        if (!n->subs && !(n->subs = calloc(np->n_attribute, sizeof *n->subs)))
            return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
        fm_onnx_model *s = calloc(1, sizeof *s);
        char path[1024];
        snprintf(path, sizeof path, "%s: node %d '%s' (%s) %s", m->path, i, np->name ? np->name : "", np->op_type, at->name);
        if (!s || !(s->path = strdup(path)) || !(s->dir = strdup(m->dir))) {
            fm_onnx_free(s);
            return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
        }
        n->subs[a] = s;
        s->root = m->root;
        s->graph = at->g;
        s->opset = m->opset;
        sc->cur = n;
        scope inner = {.m = s, .up = sc};
        if (build_graph(&inner)) return fm_last_status();
    }
    return FM_OK;
}

static fm_status load_node_inputs(scope *sc, int i, onnx_node *n) {
    const Onnx__NodeProto *np = n->proto;
    for (int k = 0; k < n->n_in; k++) {
        /* an empty name omits an optional input; the required ones (the first min_in, and
         * every input of a variadic op) must be named */
        if (!*np->input[k] && (k < n->op->min_in || n->op->max_in < 0)) {
            char which[16];
            snprintf(which, sizeof which, "%d", k);
            return node_error(sc->m, i, np, "input %s is required, but its name is empty (an omitted input)", which);
        }
        n->in[k] = *np->input[k] ? scope_find(sc, np->input[k]) : -1;
        if (*np->input[k] && n->in[k] < 0)
            return node_error(sc->m, i, np, "input '%s' is not produced by an earlier node, an initializer or a graph input "
                              "(nodes must be in topological order)", np->input[k]);
    }
    return FM_OK;
}

/* After the subgraphs: they cannot see the node's own outputs. */
static fm_status load_node_outputs(scope *sc, int i, onnx_node *n) {
    const Onnx__NodeProto *np = n->proto;
    for (int k = 0; k < n->n_out; k++) {
        if (!*np->output[k]) { n->out[k] = -1; continue; }
        if (slot_of(sc->m, sc->nm, np->output[k], false) >= 0)
            return node_error(sc->m, i, np, "output '%s' is already defined (ONNX values are assigned once)", np->output[k]);
        n->out[k] = slot_of(sc->m, sc->nm, np->output[k], true);
    }
    return FM_OK;
}

static fm_status load_nodes(scope *sc) {
    fm_onnx_model *m = sc->m;
    const Onnx__GraphProto *g = m->graph;
    m->nodes = calloc(g->n_node + 1, sizeof *m->nodes);
    if (!m->nodes) return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *np = g->node[i];
        onnx_node *n = &m->nodes[m->n_nodes++];
        n->proto = np;
        if (check_node(m, (int)i, np, &n->op)) return fm_last_status();
        n->values = onnx_op_takes_values(n->op);
        if (onnx_op_makes_values(n->op)) m->root->has_values = true;
        n->n_in = (int)np->n_input;
        n->n_out = (int)np->n_output;
        n->in = malloc((np->n_input + np->n_output + 1) * sizeof(int));
        if (!n->in) return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
        n->out = n->in + np->n_input;
        size_t refs = 0;
        for (size_t a = 0; a < np->n_attribute; a++)
            if (np->attribute[a]->g) refs += graph_refs(np->attribute[a]->g);
        if (refs && !(n->imp = malloc(refs * sizeof(int)))) return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
        if (load_node_inputs(sc, (int)i, n) || load_subgraphs(sc, (int)i, n) || load_node_outputs(sc, (int)i, n))
            return fm_last_status();
    }
    return FM_OK;
}

static fm_status load_outputs(scope *sc) {
    fm_onnx_model *m = sc->m;
    const Onnx__GraphProto *g = m->graph;
    m->outputs = calloc(g->n_output + 1, sizeof(int));
    m->out_decl = calloc(g->n_output + 1, sizeof *m->out_decl);
    if (!m->outputs || !m->out_decl) return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    for (size_t i = 0; i < g->n_output; i++) {
        char *name = g->output[i]->name;
        int s = name && *name ? scope_find(sc, name) : -1;
        if (s < 0) return model_error(m, FM_ERR_FORMAT, "graph output '%s' is produced by no node, initializer or input", name, NULL);
        if (declared_type(m, g->output[i], &m->out_decl[m->n_outputs])) return fm_last_status();
        m->out_decl[m->n_outputs].slot = s;
        m->outputs[m->n_outputs++] = s;
    }
    for (int s = 0; s < m->n_values; s++) m->last_use[s] = -1;
    for (int i = 0; i < m->n_nodes; i++) {
        for (int k = 0; k < m->nodes[i].n_in; k++)
            if (m->nodes[i].in[k] >= 0) m->last_use[m->nodes[i].in[k]] = i;
        for (int k = 0; k < m->nodes[i].n_imp; k++) m->last_use[m->nodes[i].imp[k]] = i;
    }
    for (int i = 0; i < m->n_outputs; i++) m->last_use[m->outputs[i]] = m->n_nodes;
    return FM_OK;
}

/* Slots are allocated for every name the graph can define or capture. */
static fm_status alloc_slots(scope *sc) {
    fm_onnx_model *m = sc->m;
    name_map *nm = sc->nm;
    const Onnx__GraphProto *g = m->graph;
    size_t refs = sc->up ? graph_refs(g) : 0, n = g->n_initializer + g->n_input + refs + 1;
    for (size_t i = 0; i < g->n_node; i++) n += g->node[i]->n_output;
    nm->cap = 16;
    while (nm->cap < 2 * n) nm->cap *= 2;
    nm->keys = calloc(nm->cap, sizeof *nm->keys);
    nm->vals = calloc(nm->cap, sizeof *nm->vals);
    m->value_names = calloc(n, sizeof *m->value_names);
    m->constants = calloc(n, sizeof *m->constants);
    m->last_use = calloc(n, sizeof *m->last_use);
    m->cap_local = calloc(refs + 1, sizeof *m->cap_local);
    m->cap_outer = calloc(refs + 1, sizeof *m->cap_outer);
    if (!nm->keys || !nm->vals || !m->value_names || !m->constants || !m->last_use || !m->cap_local || !m->cap_outer)
        return fm_set_error(FM_ERR_OOM, "%s: out of memory for %zu values", m->path, n);
    return FM_OK;
}

static fm_status build_graph(scope *sc) {
    name_map nm = {0};
    sc->nm = &nm;
    fm_status s = alloc_slots(sc);
    if (!s) s = load_initializers(sc->m, &nm);
    if (!s) s = load_inputs(sc->m, &nm);
    if (!s) s = load_nodes(sc);
    if (!s) s = load_outputs(sc);
    free(nm.keys);
    free(nm.vals);
    sc->nm = NULL;
    return s;
}

static fm_status build(fm_onnx_model *m) {
    if (!m->proto->graph) return model_error(m, FM_ERR_FORMAT, "the model has no graph (not an ONNX model?)%s", "", NULL);
    if ((m->opset = find_opset(m->proto)) < 0)
        return model_error(m, FM_ERR_FORMAT, "the model imports no opset of the default ONNX domain%s", "", NULL);
    m->graph = m->proto->graph;
    m->root = m;
    scope sc = {.m = m};
    return build_graph(&sc);
}

fm_onnx_model *fm_onnx_load(const char *path) {
    if (!path) { fm_set_error(FM_ERR_INVALID, "fm_onnx_load: path is NULL"); return NULL; }
    fm_onnx_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path)) || !(m->dir = strdup(path))) {
        fm_onnx_free(m);
        fm_set_error(FM_ERR_OOM, "%s: out of memory", path);
        return NULL;
    }
    char *slash = strrchr(m->dir, '/');
    if (slash) *(slash == m->dir ? slash + 1 : slash) = 0;
    else strcpy(m->dir, ".");
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n)) { fm_onnx_free(m); return NULL; }
    m->proto = (Onnx__ModelProto *)onnx_unpack(&onnx__model_proto__descriptor, buf, n, path);
    free(buf);
    if (!m->proto || build(m)) {
        fm_onnx_free(m);
        return NULL;
    }
    return m;
}

void fm_onnx_free(fm_onnx_model *m) {
    if (!m) return;
    for (int s = 0; s < m->n_values; s++) fm_tensor_release(m->constants[s]);
    for (int s = 0; m->dev_constants && s < m->n_values; s++) fm_tensor_release(m->dev_constants[s]);
    free(m->dev_constants);
    for (int i = 0; i < m->n_nodes; i++) {
        for (size_t a = 0; m->nodes[i].subs && a < m->nodes[i].proto->n_attribute; a++) fm_onnx_free(m->nodes[i].subs[a]);
        free(m->nodes[i].subs);
        free(m->nodes[i].imp);
        free(m->nodes[i].in);
    }
    free(m->cap_local);
    free(m->cap_outer);
    free(m->nodes);
    free(m->inputs);
    free(m->outputs);
    free(m->out_decl);
    free(m->constants);
    free(m->last_use);
    free(m->value_names);
    if (m->proto) protobuf_c_message_free_unpacked(&m->proto->base, NULL);
    free(m->path);
    free(m->dir);
    free(m);
}

int fm_onnx_input_count(const fm_onnx_model *m) { return m ? m->n_inputs : 0; }
const char *fm_onnx_input_name(const fm_onnx_model *m, int i) {
    return m && i >= 0 && i < m->n_inputs ? m->value_names[m->inputs[i].slot] : NULL;
}
int fm_onnx_output_count(const fm_onnx_model *m) { return m ? m->n_outputs : 0; }
const char *fm_onnx_output_name(const fm_onnx_model *m, int i) {
    return m && i >= 0 && i < m->n_outputs ? m->value_names[m->outputs[i]] : NULL;
}
int fm_onnx_opset(const fm_onnx_model *m) { return m ? m->opset : 0; }

static fm_status io_info(const fm_onnx_model *m, const onnx_input *d, const char *what, fm_graph_io *io) {
    const char *name = m->value_names[d->slot];
    fm_dtype dt;
    if (d->kind != ONNX_TENSOR)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s '%s' is %s, not a tensor (fm_onnx_run and `fathom run` take and give "
                            "tensors only)", m->path, what, name, d->kind == ONNX_SEQ ? "a sequence" : "an optional");
    if (d->ndim < 0 || !d->elem_type)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s '%s' declares no %s", m->path, what, name, d->ndim < 0 ? "rank" : "element type");
    if (!onnx_dtype_to_fm(d->elem_type, &dt))
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s '%s' has element type %s, which fathom does not support", m->path, what, name,
                            onnx_dtype_name(d->elem_type));
    memset(io, 0, sizeof *io);
    io->name = name;
    io->dtype = dt;
    io->ndim = d->ndim;
    for (int k = 0; k < d->ndim; k++) io->shape[k] = d->dims[k] >= 0 ? d->dims[k] : FM_DIM_DYNAMIC;
    return FM_OK;
}

fm_status fm_onnx_input_info(const fm_onnx_model *m, int i, fm_graph_io *io) {
    if (!m || !io || i < 0 || i >= m->n_inputs) return fm_set_error(FM_ERR_INVALID, "fm_onnx_input_info: no input %d", i);
    return io_info(m, &m->inputs[i], "input", io);
}

fm_status fm_onnx_output_info(const fm_onnx_model *m, int i, fm_graph_io *io) {
    if (!m || !io || i < 0 || i >= m->n_outputs) return fm_set_error(FM_ERR_INVALID, "fm_onnx_output_info: no output %d", i);
    return io_info(m, &m->out_decl[i], "output", io);
}

fm_status fm_onnx_set_max_iterations(fm_onnx_model *m, int64_t n) {
    if (!m || n < 0) return fm_set_error(FM_ERR_INVALID, "fm_onnx_set_max_iterations: NULL model or a negative limit");
    m->max_iterations = n;
    return FM_OK;
}
