/* The cleanup passes: dead-code elimination (nodes and constants no output
 * needs; identity and dropout nodes bypassed), common-subexpression elimination
 * (a node equal to an earlier one: same op, inputs and attributes) and constant
 * folding (a node whose inputs are all constants and whose attributes hold no
 * dynamic dim is run now, and its outputs become constants). */
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "graph/graph_rewrite.h"

static bool is_passthrough(const gnode *n) { return !strcmp(n->op, "identity") || !strcmp(n->op, "dropout"); }

fm_graph *g_pass_dce(const fm_graph *g, char *note, size_t nn) {
    bool *need = calloc((size_t)g->n_values + 1, sizeof *need), *keep = calloc((size_t)g->n_nodes + 1, sizeof *keep);
    if (!need || !keep) { free(need); free(keep); fm_set_error(FM_ERR_OOM, "graph: out of host memory"); return NULL; }
    for (int i = 0; i < g->n_outputs; i++) need[g->outputs[i]] = true;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const gnode *n = &g->nodes[i];
        for (int k = 0; k < n->n_out && !keep[i]; k++) keep[i] = need[n->out[k]];
        for (int k = 0; keep[i] && k < n->n_in; k++)
            if (n->in[k] >= 0) need[n->in[k]] = true;
    }
    rw r;
    fm_status st = rw_begin(&r, g);
    int dropped = 0, bypassed = 0;
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        if (!keep[i]) { dropped++; continue; }
        if (is_passthrough(n) && !g->values[n->out[0]].is_output) {
            st = rw_alias(&r, n->out[0], rw_name(&r, n->in[0]));
            bypassed++;
            continue;
        }
        st = rw_copy_node(&r, n);
    }
    int consts_before = fm_graph_num_consts(g);
    free(need);
    free(keep);
    fm_graph *out = rw_end(&r, st);
    if (out) snprintf(note, nn, "%d dead nodes removed, %d identity/dropout nodes bypassed, %d unused constants dropped", dropped, bypassed,
                      consts_before - fm_graph_num_consts(out));
    return out;
}

/* A node's identity for CSE: op, input names (after aliasing) and attributes. */
static char *node_key(const rw *r, const gnode *n) {
    size_t cap = 256, len = 0;
    char *k = malloc(cap);
#define ADD(...) do { int w_ = snprintf(k + len, cap - len, __VA_ARGS__); \
        while (k && (size_t)w_ >= cap - len) { char *nk = realloc(k, cap *= 2); if (!nk) { free(k); return NULL; } k = nk; \
            w_ = snprintf(k + len, cap - len, __VA_ARGS__); } len += (size_t)w_; } while (0)
    if (!k) return NULL;
    ADD("%s(", n->op);
    for (int i = 0; i < n->n_in; i++) ADD("%s,", rw_name(r, n->in[i]));
    ADD(")%d", n->n_out);
    for (int a = 0; a < n->n_attrs; a++) {
        const gattr *t = &n->attrs[a];
        ADD("|%s:%d:%lld:%.17g:%s:", t->name, (int)t->type, (long long)t->i, t->f, t->s ? t->s : "");
        for (int e = 0; e < t->n; e++) {
            if (t->type == FM_ATTR_INTS) ADD("%lld/%s,", (long long)t->ints[e].v, t->ints[e].expr ? t->ints[e].expr : "");
            else if (t->type == FM_ATTR_FLOATS) ADD("%.17g,", t->floats[e]);
        }
    }
#undef ADD
    return k;
}

fm_graph *g_pass_cse(const fm_graph *g, char *note, size_t nn) {
    char **keys = calloc((size_t)g->n_nodes + 1, sizeof *keys);
    if (!keys) { fm_set_error(FM_ERR_OOM, "graph: out of host memory"); return NULL; }
    rw r;
    fm_status st = rw_begin(&r, g);
    int merged = 0;
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        if (!(keys[i] = node_key(&r, n))) { st = fm_set_error(FM_ERR_OOM, "graph: out of host memory"); break; }
        int j = 0;
        bool out_is_graph_output = false;
        for (int k = 0; k < n->n_out; k++) out_is_graph_output |= g->values[n->out[k]].is_output;
        while (j < i && (!keys[j] || strcmp(keys[j], keys[i]))) j++;
        if (j < i && !out_is_graph_output) {
            for (int k = 0; st == FM_OK && k < n->n_out; k++) st = rw_alias(&r, n->out[k], rw_name(&r, g->nodes[j].out[k]));
            free(keys[i]);
            keys[i] = NULL; /* not a target itself: the first one is */
            merged++;
            continue;
        }
        st = rw_copy_node(&r, n);
    }
    for (int i = 0; i < g->n_nodes; i++) free(keys[i]);
    free(keys);
    fm_graph *out = rw_end(&r, st);
    if (out) snprintf(note, nn, "%d repeated nodes merged into earlier equal ones", merged);
    return out;
}

static bool foldable(const rw *r, const gnode *n) {
    if (n->n_in == 0) return false;
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] < 0) continue;
        int v = g_find_value(r->dst, rw_name(r, n->in[k]));
        if (v < 0 || r->dst->values[v].kind != GV_CONST) {
            v = g_find_value(r->src, rw_name(r, n->in[k]));
            if (v < 0 || r->src->values[v].kind != GV_CONST) return false;
        }
    }
    for (int a = 0; a < n->n_attrs; a++)
        for (int e = 0; n->attrs[a].type == FM_ATTR_INTS && e < n->attrs[a].n; e++)
            if (n->attrs[a].ints[e].expr) return false; /* depends on the run's sizes */
    for (int k = 0; k < n->n_out; k++)
        if (r->src->values[n->out[k]].is_output) return false;
    return true;
}

static fm_tensor *const_tensor(const rw *r, const char *name) {
    int v = g_find_value(r->dst, name);
    if (v >= 0 && r->dst->values[v].kind == GV_CONST) return r->dst->values[v].tensor;
    v = g_find_value(r->src, name);
    return v >= 0 ? r->src->values[v].tensor : NULL;
}

/* Runs n on its constant inputs; its outputs become constants of dst. */
static fm_status fold_node(rw *r, const gnode *n) {
    fm_tensor *in[FM_GRAPH_MAX_NODE_IO] = {0}, *out[FM_GRAPH_MAX_NODE_IO] = {0};
    for (int k = 0; k < n->n_in; k++) in[k] = n->in[k] >= 0 ? const_tensor(r, rw_name(r, n->in[k])) : NULL;
    gctx c = {r->src, n, NULL, NULL};
    bool prev = fm_set_grad_enabled(false);
    fm_status st = g_op_spec_at(n->spec)->run(&c, in, out);
    fm_set_grad_enabled(prev);
    for (int k = 0; st == FM_OK && k < n->n_out; k++) {
        fm_tensor *h = fm_tensor_to(out[k], FM_CPU), *cc = h ? fm_clone(h) : NULL; /* own, contiguous storage */
        st = cc ? rw_const(r, r->src->values[n->out[k]].name, cc) : fm_last_status();
        fm_tensor_release_n(2, h, cc);
    }
    for (int k = 0; k < n->n_out; k++) fm_tensor_release(out[k]);
    return st;
}

fm_graph *g_pass_fold(const fm_graph *g, char *note, size_t nn) {
    rw r;
    fm_status st = rw_begin(&r, g);
    int folded = 0;
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        if (foldable(&r, n)) {
            st = fold_node(&r, n);
            folded++;
        } else {
            st = rw_copy_node(&r, n);
        }
    }
    fm_graph *out = rw_end(&r, st);
    if (out) snprintf(note, nn, "%d nodes computed at compile time (all their inputs constant)", folded);
    return out;
}
