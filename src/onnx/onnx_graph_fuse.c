/* Patterns of exported models that become one graph op at import.
 *
 * The graph has no Erf: PyTorch exports the exact GELU (BERT's, nn.GELU()) as
 * Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5, and the 0.5 may come first
 * or the Div be a Mul by 1 / sqrt 2. Each such chain, with every intermediate
 * read only by the next step, becomes the graph's `gelu` (0.5 x (1 + erf(x /
 * sqrt 2)), the same function) at the chain's last node; the other nodes are
 * skipped. An Erf outside the pattern stays refused by the translation. */
#include "onnx/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const onnx_graph_ctx *x;
    int *producer, *uses, *reader; /* per slot: the node making it, how many reads, the last reader */
} fuse_ctx;

static bool is_op(const fuse_ctx *f, int node, const char *op) {
    return node >= 0 && !strcmp(f->x->m->nodes[node].op->name, op) && f->x->m->nodes[node].n_in == 2;
}

/* Slot s is a folded float scalar (any rank, one element) within 1e-5 of v. */
static bool is_const(const fuse_ctx *f, int s, double v) {
    const fm_tensor *t = s >= 0 && f->x->folded[s] ? f->x->va[s] : NULL;
    return t && fm_dtype_is_float(t->dtype) && fm_tensor_numel(t) == 1 && fabs(fm_tensor_get(t, 0) - v) <= 1e-5 * fabs(v);
}

/* For a two-input node whose input `s` is known: the other input. */
static int other_in(const fuse_ctx *f, int node, int s) {
    const onnx_node *n = &f->x->m->nodes[node];
    return n->in[0] == s ? n->in[1] : n->in[0];
}

/* The one node reading slot s, or -1. */
static int only_reader(const fuse_ctx *f, int s) { return s >= 0 && f->uses[s] == 1 ? f->reader[s] : -1; }

/* x * c (either order) with c within 1e-5 of v: the slot of x, else -1. */
static int times_const(const fuse_ctx *f, int node, double v) {
    if (!is_op(f, node, "Mul")) return -1;
    const onnx_node *n = &f->x->m->nodes[node];
    return is_const(f, n->in[1], v) ? n->in[0] : is_const(f, n->in[0], v) ? n->in[1] : -1;
}

/* The GELU around Erf node e: fills x->gelu_in / x->skip when it matches. */
static void match_at(const fuse_ctx *f, int e) {
    onnx_graph_ctx *x = (onnx_graph_ctx *)f->x;
    const onnx_node *en = &x->m->nodes[e];
    int d = en->in[0], pd = d >= 0 && f->uses[d] == 1 ? f->producer[d] : -1, xs = -1;
    if (is_op(f, pd, "Div") && is_const(f, x->m->nodes[pd].in[1], sqrt(2.0))) xs = x->m->nodes[pd].in[0];
    else xs = times_const(f, pd, sqrt(0.5));
    int add = only_reader(f, en->out[0]);
    if (xs < 0 || !is_op(f, add, "Add") || !is_const(f, other_in(f, add, en->out[0]), 1.0)) return;
    int m1 = only_reader(f, x->m->nodes[add].out[0]);
    if (!is_op(f, m1, "Mul")) return;
    int o = other_in(f, m1, x->m->nodes[add].out[0]), last = -1, half = -1;
    if (o == xs) { /* (x * (1 + erf)) * 0.5 */
        last = only_reader(f, x->m->nodes[m1].out[0]);
        if (times_const(f, last, 0.5) != x->m->nodes[m1].out[0]) return;
    } else if (f->uses[o] == 1 && times_const(f, f->producer[o], 0.5) == xs) { /* (x * 0.5) * (1 + erf) */
        last = m1, half = f->producer[o];
    } else if (is_const(f, o, 0.5)) { /* ((1 + erf) * 0.5) * x */
        last = only_reader(f, x->m->nodes[m1].out[0]);
        if (!is_op(f, last, "Mul") || other_in(f, last, x->m->nodes[m1].out[0]) != xs) return;
    } else return;
    x->skip[pd] = x->skip[e] = x->skip[add] = true;
    if (m1 != last) x->skip[m1] = true;
    if (half >= 0) x->skip[half] = true;
    x->gelu_in[last] = xs;
}

fm_status onnx_graph_match_gelu(onnx_graph_ctx *x) {
    const fm_onnx_model *m = x->m;
    fuse_ctx f = {x, malloc(sizeof(int) * ((size_t)m->n_values + 1)), calloc((size_t)m->n_values + 1, sizeof(int)),
                  malloc(sizeof(int) * ((size_t)m->n_values + 1))};
    if (!f.producer || !f.uses || !f.reader) {
        free(f.producer), free(f.uses), free(f.reader);
        return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    }
    for (int s = 0; s < m->n_values; s++) f.producer[s] = f.reader[s] = -1;
    for (int i = 0; i < m->n_nodes; i++) {
        x->gelu_in[i] = -1;
        for (int k = 0; k < m->nodes[i].n_out; k++)
            if (m->nodes[i].out[k] >= 0) f.producer[m->nodes[i].out[k]] = i;
        for (int k = 0; k < m->nodes[i].n_in; k++)
            if (m->nodes[i].in[k] >= 0) f.uses[m->nodes[i].in[k]]++, f.reader[m->nodes[i].in[k]] = i;
    }
    for (int i = 0; i < m->n_outputs; i++) f.uses[m->outputs[i]] += 2; /* an output is never an intermediate */
    for (int i = 0; i < m->n_nodes; i++)
        if (!strcmp(m->nodes[i].op->name, "Erf") && m->nodes[i].n_in == 1 && !x->skip[i]) match_at(&f, i);
    free(f.producer), free(f.uses), free(f.reader);
    return FM_OK;
}
