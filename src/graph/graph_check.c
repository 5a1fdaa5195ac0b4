/* Checking a graph before anything runs: every node's op, input count,
 * attributes (known names, types, dim expressions over declared names) and,
 * through shape inference, its input dtypes and shapes. Inference runs twice:
 * with each dynamic dim at its probe size, then at probe + 1 + its index, so a
 * graph that only works at one batch size is refused and output dims that
 * follow a dynamic dim are known to be dynamic. */
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"

const char *g_node_label(const gnode *n, char *buf, size_t size) {
    snprintf(buf, size, "node '%s' (%s)", n->name, n->op);
    return buf;
}

static int64_t probe(const fm_graph *g, int s, bool second) { return g->syms[s].hint + (second ? 1 + s : 0); }

const char *g_shape_text(const fm_graph *g, const gvalue *v, char *buf, size_t size) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, size - k, "[");
    for (int d = 0; d < v->t.ndim && k < size; d++) {
        const char *sep = d ? ", " : "";
        const char *name = NULL;
        bool dyn = v->kind == GV_INPUT ? v->sym[d] >= 0 : v->t.d[d] != v->probe2[d];
        if (v->kind == GV_INPUT && v->sym[d] >= 0) name = g->syms[v->sym[d]].name;
        for (int s = 0; dyn && !name && s < g->n_syms; s++)
            if (v->t.d[d] == probe(g, s, false) && v->probe2[d] == probe(g, s, true)) name = g->syms[s].name;
        if (dyn) k += (size_t)snprintf(buf + k, size - k, "%s\"%s\"", sep, name ? name : "?");
        else k += (size_t)snprintf(buf + k, size - k, "%s%lld", sep, (long long)v->t.d[d]);
    }
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

static fm_status check_node_static(const fm_graph *g, const gnode *n) {
    char lb[160];
    const g_op_spec *sp = g_op_spec_at(n->spec);
    g_node_label(n, lb, sizeof lb);
    if (n->n_in < sp->min_in || n->n_in > sp->max_in) {
        if (sp->min_in == sp->max_in) return fm_set_error(FM_ERR_INVALID, "%s: takes %d inputs, got %d", lb, sp->min_in, n->n_in);
        return fm_set_error(FM_ERR_INVALID, "%s: takes %d to %d inputs, got %d", lb, sp->min_in, sp->max_in, n->n_in);
    }
    if (n->n_out != sp->n_out) return fm_set_error(FM_ERR_INVALID, "%s: has %d outputs, got %d", lb, sp->n_out, n->n_out);
    for (int i = 0; i < sp->min_in && i < n->n_in; i++)
        if (n->in[i] < 0) return fm_set_error(FM_ERR_INVALID, "%s: input %d is required", lb, i);
    for (int k = 0; k < n->n_attrs; k++) {
        const gattr *a = &n->attrs[k];
        if (!g_list_has(sp->attrs, a->name)) return fm_set_error(FM_ERR_INVALID, "%s: unknown attribute '%s' (it takes: %s)", lb, a->name, *sp->attrs ? sp->attrs : "none");
        for (int e = 0; a->type == FM_ATTR_INTS && e < a->n; e++)
            if (a->ints[e].expr && g_expr_check(g, a->ints[e].expr) != FM_OK) {
                fm_error_prefix("%s: attribute '%s'", lb, a->name);
                return fm_last_status();
            }
    }
    return FM_OK;
}

static fm_status check_out_type(const gtype *t, const char *lb, int i) {
    if (t->ndim < 0 || t->ndim > FM_MAX_DIMS || (unsigned)t->dt >= FM_DTYPE_COUNT)
        return fm_set_error(FM_ERR_INTERNAL, "%s: output %d has an invalid type", lb, i);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->d[d] < 0) return fm_set_error(FM_ERR_INVALID, "%s: output %d has a negative size", lb, i);
        if (t->d[d] && n > (INT64_C(1) << 46) / t->d[d]) return fm_set_error(FM_ERR_INVALID, "%s: output %d has more than 2^46 elements", lb, i);
        n *= t->d[d] ? t->d[d] : 1;
    }
    return FM_OK;
}

/* Inference over all nodes into types[] (one per value). */
static fm_status infer_pass(const fm_graph *g, gtype *types, const int64_t *vals) {
    char lb[160];
    for (int i = 0; i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        gtype in[FM_GRAPH_MAX_NODE_IO], out[FM_GRAPH_MAX_NODE_IO];
        memset(out, 0, (size_t)n->n_out * sizeof out[0]);
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] < 0) { memset(&in[k], 0, sizeof in[k]); in[k].ndim = -1; }
            else in[k] = types[n->in[k]];
        }
        const g_op_spec *sp = g_op_spec_at(n->spec);
        for (int k = n->n_in; k < sp->max_in && k < FM_GRAPH_MAX_NODE_IO; k++) { memset(&in[k], 0, sizeof in[k]); in[k].ndim = -1; }
        gctx c = {g, n, vals, NULL};
        g_node_label(n, lb, sizeof lb);
        if (sp->infer(&c, in, out) != FM_OK) {
            fm_error_prefix("%s", lb);
            return fm_last_status();
        }
        for (int k = 0; k < n->n_out; k++) {
            if (check_out_type(&out[k], lb, k)) return fm_last_status();
            types[n->out[k]] = out[k];
        }
    }
    return FM_OK;
}

fm_status g_infer_types(const fm_graph *g, const int64_t *vals, gtype *types) {
    for (int v = 0; v < g->n_values; v++) {
        const gvalue *val = &g->values[v];
        types[v] = val->t;
        if (val->kind == GV_INPUT)
            for (int d = 0; d < val->t.ndim; d++)
                if (val->sym[d] >= 0) types[v].d[d] = vals[val->sym[d]];
    }
    return infer_pass(g, types, vals);
}

fm_status g_infer_all(fm_graph *g, const int64_t *vals, bool second) {
    gtype *types = calloc((size_t)g->n_values + 1, sizeof *types);
    if (!types) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    fm_status st = g_infer_types(g, vals, types);
    for (int v = 0; st == FM_OK && v < g->n_values; v++) {
        gvalue *val = &g->values[v];
        if (!second) { val->t = types[v]; val->typed = true; continue; }
        if (types[v].ndim != val->t.ndim || types[v].dt != val->t.dt) {
            st = fm_set_error(FM_ERR_INVALID, "value '%s' changes rank or dtype with the dynamic dims' sizes", val->name);
            break;
        }
        memcpy(val->probe2, types[v].d, sizeof val->probe2);
    }
    free(types);
    return st;
}

static fm_status check_declared(const fm_graph *g) {
    char have[600], sh[512];
    for (int v = 0; v < g->n_values; v++) {
        const gvalue *val = &g->values[v];
        if (!val->decl_shape) continue;
        snprintf(have, sizeof have, "%s %s", fm_dtype_name(val->t.dt), g_shape_text(g, val, sh, sizeof sh));
        if (strcmp(have, val->decl_shape))
            return fm_set_error(FM_ERR_FORMAT, "value '%s': the file declares %s but the graph computes %s", val->name, val->decl_shape, have);
    }
    return FM_OK;
}

fm_status fm_graph_validate(fm_graph *g) {
    if (!g) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph");
    if (g->validated) return FM_OK;
    if (g->n_outputs == 0) return fm_set_error(FM_ERR_INVALID, "graph: no outputs (fm_graph_add_output)");
    for (int i = 0; i < g->n_nodes; i++)
        if (check_node_static(g, &g->nodes[i])) return fm_last_status();
    int64_t a[G_MAX_SYMS], b[G_MAX_SYMS];
    for (int s = 0; s < g->n_syms; s++) { a[s] = probe(g, s, false); b[s] = probe(g, s, true); }
    if (g_infer_all(g, a, false) || g_infer_all(g, b, true)) return fm_last_status();
    for (int v = 0; v < g->n_values; v++) g->values[v].last_use = -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0) g->values[g->nodes[i].in[k]].last_use = i;
    if (check_declared(g) || g_prepare(g)) return fm_last_status();
    g->validated = true;
    return FM_OK;
}
