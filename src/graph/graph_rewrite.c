/* Rewriting: every compile pass builds a new graph from the old one through
 * the builder, node by node, so the result is checked like any other graph.
 * A rewrite keeps a map from the old graph's value names to the new graph's
 * (an alias, when a pass replaces a value by another). */
#include <stdlib.h>
#include <string.h>

#include "graph/graph_rewrite.h"

fm_status rw_begin(rw *r, const fm_graph *src) {
    memset(r, 0, sizeof *r);
    r->src = src;
    r->dst = fm_graph_new();
    r->alias = calloc((size_t)src->n_values + 1, sizeof *r->alias);
    if (!r->dst || !r->alias) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    fm_graph *d = r->dst;
    for (int s = 0; s < src->n_syms; s++)
        if (fm_graph_set_dim_hint(d, src->syms[s].name, src->syms[s].hint)) return fm_last_status();
    for (int i = 0; i < src->n_inputs; i++) {
        const gvalue *v = &src->values[src->inputs[i]];
        int64_t dims[FM_MAX_DIMS];
        const char *names[FM_MAX_DIMS];
        for (int k = 0; k < v->t.ndim; k++) {
            dims[k] = v->sym[k] >= 0 ? -1 : v->t.d[k];
            names[k] = v->sym[k] >= 0 ? src->syms[v->sym[k]].name : NULL;
        }
        if (fm_graph_add_input(d, v->name, v->t.dt, v->t.ndim, dims, names)) return fm_last_status();
    }
    for (int i = 0; i < src->meta.n; i++)
        if (fm_graph_set_meta(d, src->meta.items[i].key, src->meta.items[i].value)) return fm_last_status();
    for (int i = 0; i < src->n_files; i++)
        if (fm_graph_attach_file(d, src->file_name[i], src->file_path[i])) return fm_last_status();
    d->device = src->device;
    return FM_OK;
}

const char *rw_name(const rw *r, int v) {
    if (v < 0) return "";
    return r->alias[v] ? r->alias[v] : r->src->values[v].name;
}

fm_status rw_alias(rw *r, int v, const char *to) {
    char *s = strdup(to);
    if (!s) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    free(r->alias[v]);
    r->alias[v] = s;
    return FM_OK;
}

fm_status rw_const(rw *r, const char *name, fm_tensor *t) {
    if (g_find_value(r->dst, name) >= 0) return FM_OK; /* already carried over */
    int v = g_new_value(r->dst, name, GV_CONST);
    if (v < 0) return fm_last_status();
    gvalue *val = &r->dst->values[v];
    val->tensor = fm_tensor_retain(t); /* shared with the source graph: constants are never written */
    val->t.dt = t->dtype;
    val->t.ndim = t->ndim;
    memcpy(val->t.d, t->shape, sizeof val->t.d);
    memcpy(val->probe2, t->shape, sizeof val->probe2);
    val->typed = true;
    return FM_OK;
}

/* The node's attributes in the builder's form (valid while n lives). */
static int attrs_of(const gnode *n, fm_graph_attr *a, const char **dims, int64_t *ints) {
    int used = 0;
    for (int k = 0; k < n->n_attrs; k++) {
        const gattr *s = &n->attrs[k];
        a[k] = (fm_graph_attr){.name = s->name, .type = s->type, .i = s->i, .f = s->f, .s = s->s, .n = s->n, .floats = s->floats};
        if (s->type == FM_ATTR_INTS) {
            a[k].ints = ints + used;
            a[k].dims = dims + used;
            for (int e = 0; e < s->n; e++) {
                ints[used] = s->ints[e].v;
                dims[used++] = s->ints[e].expr;
            }
        }
    }
    return n->n_attrs;
}

fm_status rw_node_as(rw *r, const gnode *n, const char *op, int n_in, const char *const *ins, int n_out, const char *const *outs) {
    return rw_node_with(r, n, op, n_in, ins, n_out, outs, 0, NULL);
}

fm_status rw_node_with(rw *r, const gnode *n, const char *op, int n_in, const char *const *ins, int n_out, const char *const *outs,
                       int n_extra, const fm_graph_attr *extra) {
    fm_graph_attr a[64];
    const char *dims[64 * 64];
    int64_t ints[64 * 64];
    int na = attrs_of(n, a, dims, ints);
    if (na + n_extra > 64) return fm_set_error(FM_ERR_INVALID, "graph rewrite: node '%s' has too many attributes", n->name);
    for (int k = 0; k < n_extra; k++) { /* an extra attribute replaces the node's own of its name */
        int at = 0;
        while (at < na && strcmp(a[at].name, extra[k].name)) at++;
        a[at] = extra[k];
        na += at == na;
    }
    for (int i = 0; i < n_in; i++) { /* constants are carried over when first read */
        int v = g_find_value(r->src, ins[i]);
        if (v >= 0 && r->src->values[v].kind == GV_CONST && rw_const(r, ins[i], r->src->values[v].tensor)) return fm_last_status();
    }
    return fm_graph_add_node(r->dst, op, n->name, n_in, ins, n_out, outs, na, a);
}

fm_status rw_copy_node(rw *r, const gnode *n) {
    const char *ins[FM_GRAPH_MAX_NODE_IO], *outs[FM_GRAPH_MAX_NODE_IO];
    for (int i = 0; i < n->n_in; i++) ins[i] = rw_name(r, n->in[i]);
    for (int i = 0; i < n->n_out; i++) outs[i] = r->src->values[n->out[i]].name;
    return rw_node_as(r, n, n->op, n->n_in, ins, n->n_out, outs);
}

fm_graph *rw_end(rw *r, fm_status st) {
    const fm_graph *src = r->src;
    for (int i = 0; st == FM_OK && i < src->n_outputs; i++) {
        int v = src->outputs[i];
        const char *nm = rw_name(r, v);
        if (src->values[v].kind == GV_CONST && g_find_value(r->dst, nm) < 0) st = rw_const(r, nm, src->values[v].tensor);
        if (st == FM_OK && strcmp(nm, src->values[v].name)) /* an output renamed by the pass keeps its name */
            st = fm_graph_add_node(r->dst, "identity", NULL, 1, &nm, 1, (const char *[]){src->values[v].name}, 0, NULL);
        if (st == FM_OK) st = fm_graph_add_output(r->dst, src->values[v].name);
    }
    if (st == FM_OK) st = fm_graph_validate(r->dst);
    for (int v = 0; v < src->n_values; v++) free(r->alias[v]);
    free(r->alias);
    if (st != FM_OK) { fm_graph_free(r->dst); return NULL; }
    return r->dst;
}

fm_graph *rw_fuse_pass(const fm_graph *g, rw_fuse_fn fn, int tally[3]) {
    rw_fuse f = {.g = g, .uses = rw_use_counts(g), .skip = calloc((size_t)g->n_nodes + 1, sizeof *f.skip)};
    fm_status st = f.uses && f.skip ? rw_begin(&f.r, g) : fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) {
        if (f.skip[i]) continue;
        const int taken = fn(&f, i);
        st = taken < 0 ? rw_copy_node(&f.r, &g->nodes[i]) : (fm_status)taken;
    }
    const bool ok = f.uses && f.skip;
    free(f.uses);
    free(f.skip);
    if (!ok) return NULL;
    for (int k = 0; k < 3; k++) tally[k] = f.tally[k];
    return rw_end(&f.r, st);
}

/* Readers of each value (counts), for the passes' "used only here" tests. */
int *rw_use_counts(const fm_graph *g) {
    int *c = calloc((size_t)g->n_values + 1, sizeof *c);
    if (!c) { fm_set_error(FM_ERR_OOM, "graph: out of host memory"); return NULL; }
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0) c[g->nodes[i].in[k]]++;
    for (int i = 0; i < g->n_outputs; i++) c[g->outputs[i]]++;
    return c;
}
