/* Patterns of exported models that become one graph op at import.
 *
 * PyTorch exports the exact GELU (BERT's, nn.GELU()) as
 * Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5, and the 0.5 may come first
 * or the Div be a Mul by 1 / sqrt 2. Each such chain, with every intermediate
 * read only by the next step, becomes the graph's `gelu` (0.5 x (1 + erf(x /
 * sqrt 2)), the same function) at the chain's last node; the other nodes are
 * skipped (one pass over memory instead of five). An Erf outside the pattern becomes
 * the graph's `erf` in the translation. The tanh
 * GELU (GPT-2's, nn.GELU(approximate='tanh')) likewise: x^3 as Pow(x, 3) or two Muls,
 * times 0.044715, plus x, times sqrt(2 / pi), Tanh, then the same Add 1 and halving;
 * it becomes `gelu_tanh`.
 *
 * ONNX Runtime's quantize_dynamic writes each MatMul as DynamicQuantizeLinear(x) ->
 * MatMulInteger(q, Wq, zp) -> Cast -> Mul by (x_scale * w_scale): with Wq a symmetric int8
 * constant, that is fathom's dynamic qlinear_int8 (the same per-tensor uint8 quantization of x
 * per call), which the MatMulInteger becomes; the Cast and the Muls are skipped. */
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

/* Whether node i reads slot s. */
static bool has_in(const onnx_graph_ctx *x, int i, int s) {
    for (int k = 0; k < x->m->nodes[i].n_in; k++)
        if (x->m->nodes[i].in[k] == s) return true;
    return false;
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

/* The node making slot s when s is read once (an intermediate of the pattern), else -1. */
static int sole_producer(const fuse_ctx *f, int s) { return s >= 0 && f->uses[s] == 1 ? f->producer[s] : -1; }

/* The slot of x when node c computes x^3 (Pow(x, 3), x * (x * x) or (x * x) * x, the
 * square read once), else -1; the square's node into *sq (-1 for Pow). */
static int cube_of(const fuse_ctx *f, int c, int *sq) {
    *sq = -1;
    if (c < 0) return -1;
    const onnx_node *n = &f->x->m->nodes[c];
    if (is_op(f, c, "Pow")) return is_const(f, n->in[1], 3.0) ? n->in[0] : -1;
    if (!is_op(f, c, "Mul")) return -1;
    for (int k = 0; k < 2; k++) {
        int q = sole_producer(f, n->in[1 - k]);
        if (is_op(f, q, "Mul") && f->x->m->nodes[q].in[0] == n->in[k] && f->x->m->nodes[q].in[1] == n->in[k]) return *sq = q, n->in[k];
    }
    return -1;
}

/* The tanh GELU's inner part before Tanh node t: sqrt(2/pi) * (x + 0.044715 x^3), each
 * step read once by the next. The slot of x, else -1; its nodes into nodes[0..4] (-1: none). */
static int tanh_inner(const fuse_ctx *f, int t, int nodes[5]) {
    const onnx_node *tn = &f->x->m->nodes[t];
    int pm = sole_producer(f, tn->in[0]), a = times_const(f, pm, sqrt(2.0 / M_PI)), pa = sole_producer(f, a);
    if (!is_op(f, pa, "Add")) return -1;
    for (int k = 0; k < 2; k++) {
        const int xs = f->x->m->nodes[pa].in[k], pt = sole_producer(f, f->x->m->nodes[pa].in[1 - k]);
        int c = times_const(f, pt, 0.044715), sq;
        if (c < 0 || cube_of(f, sole_producer(f, c), &sq) != xs) continue;
        nodes[0] = pm, nodes[1] = pa, nodes[2] = pt, nodes[3] = sole_producer(f, c), nodes[4] = sq;
        return xs;
    }
    return -1;
}

/* The GELU around Erf (or, tanh_form, Tanh) node e: fills x->gelu_in / x->skip when it matches. */
static void match_at(const fuse_ctx *f, int e, bool tanh_form) {
    onnx_graph_ctx *x = (onnx_graph_ctx *)f->x;
    const onnx_node *en = &x->m->nodes[e];
    int d = en->in[0], pd = d >= 0 && f->uses[d] == 1 ? f->producer[d] : -1, xs = -1, inner[5] = {-1, -1, -1, -1, -1};
    if (tanh_form) xs = tanh_inner(f, e, inner), pd = -1;
    else if (is_op(f, pd, "Div") && is_const(f, x->m->nodes[pd].in[1], sqrt(2.0))) xs = x->m->nodes[pd].in[0];
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
    if (pd >= 0) x->skip[pd] = true;
    for (int k = 0; k < 5; k++)
        if (inner[k] >= 0) x->skip[inner[k]] = true;
    x->skip[e] = x->skip[add] = true;
    if (m1 != last) x->skip[m1] = true;
    if (half >= 0) x->skip[half] = true;
    x->gelu_in[last] = xs;
    x->gelu_tanh[last] = tanh_form;
}

static void fuse_end(fuse_ctx *f) { free(f->producer), free(f->uses), free(f->reader); }

static fm_status fuse_begin(onnx_graph_ctx *x, fuse_ctx *f) {
    const fm_onnx_model *m = x->m;
    *f = (fuse_ctx){x, malloc(sizeof(int) * ((size_t)m->n_values + 1)), calloc((size_t)m->n_values + 1, sizeof(int)),
                    malloc(sizeof(int) * ((size_t)m->n_values + 1))};
    if (!f->producer || !f->uses || !f->reader) {
        fuse_end(f);
        return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    }
    for (int s = 0; s < m->n_values; s++) f->producer[s] = f->reader[s] = -1;
    for (int i = 0; i < m->n_nodes; i++) {
        for (int k = 0; k < m->nodes[i].n_out; k++)
            if (m->nodes[i].out[k] >= 0) f->producer[m->nodes[i].out[k]] = i;
        for (int k = 0; k < m->nodes[i].n_in; k++)
            if (m->nodes[i].in[k] >= 0) f->uses[m->nodes[i].in[k]]++, f->reader[m->nodes[i].in[k]] = i;
    }
    for (int i = 0; i < m->n_outputs; i++) f->uses[m->outputs[i]] += 2; /* an output is never an intermediate */
    return FM_OK;
}

fm_status onnx_graph_match_gelu(onnx_graph_ctx *x) {
    const fm_onnx_model *m = x->m;
    fuse_ctx f;
    if (fuse_begin(x, &f)) return fm_last_status();
    for (int i = 0; i < m->n_nodes; i++) x->gelu_in[i] = -1;
    for (int i = 0; i < m->n_nodes; i++)
        if ((!strcmp(m->nodes[i].op->name, "Erf") || !strcmp(m->nodes[i].op->name, "Tanh")) && m->nodes[i].n_in == 1 && !x->skip[i])
            match_at(&f, i, m->nodes[i].op->name[0] == 'T');
    fuse_end(&f);
    return FM_OK;
}

/* Folded slot s holds only zeros (or is absent). */
static bool zeros_or_none(const fuse_ctx *f, int s) {
    if (s < 0) return true;
    const fm_tensor *t = f->x->folded[s] ? f->x->va[s] : NULL;
    for (int64_t i = 0; t && i < fm_tensor_numel(t); i++)
        if (fm_tensor_get(t, i) != 0) return false;
    return t != NULL;
}

/* The dynamic int8 pattern at MatMulInteger node i (the header's): marks it, else leaves it. */
static void match_dynamic_at(const fuse_ctx *f, int i) {
    onnx_graph_ctx *x = (onnx_graph_ctx *)f->x;
    const onnx_node *n = &x->m->nodes[i];
    const int dq = n->in[0] >= 0 ? f->producer[n->in[0]] : -1;
    if (dq < 0 || strcmp(x->m->nodes[dq].op->name, "DynamicQuantizeLinear") || n->n_in < 3 || x->m->nodes[dq].n_out < 3) return;
    const onnx_node *d = &x->m->nodes[dq];
    const fm_tensor *w = n->in[1] >= 0 && x->folded[n->in[1]] ? x->va[n->in[1]] : NULL;
    if (d->out[0] != n->in[0] || d->out[2] != n->in[2] || !w || w->dtype != FM_I8 || w->ndim != 2 || !zeros_or_none(f, n->n_in > 3 ? n->in[3] : -1))
        return;
    const int c = only_reader(f, n->out[0]);
    if (c < 0 || strcmp(x->m->nodes[c].op->name, "Cast") || onnx_attr_int(&(onnx_op_ctx){.node = x->m->nodes[c].proto}, "to", 0) != 1) return;
    const int mul = only_reader(f, x->m->nodes[c].out[0]);
    if (!is_op(f, mul, "Mul")) return;
    const int sc = other_in(f, mul, x->m->nodes[c].out[0]), ms = sole_producer(f, sc);
    if (!is_op(f, ms, "Mul")) return;
    const int ws = other_in(f, ms, d->out[1]);
    const fm_tensor *wt = ws >= 0 && x->folded[ws] ? x->va[ws] : NULL;
    if (!has_in(x, ms, d->out[1]) || !wt || wt->dtype != FM_F32 || (fm_tensor_numel(wt) != 1 && fm_tensor_numel(wt) != w->shape[1])) return;
    x->dyn_out[i] = x->m->nodes[mul].out[0], x->dyn_scale[i] = ws;
    x->skip[c] = x->skip[mul] = x->skip[ms] = true;
}

/* Whether every reader of node dq's outputs is skipped or a matched MatMulInteger. */
static bool all_readers_fused(const onnx_graph_ctx *x, int dq) {
    const onnx_node *d = &x->m->nodes[dq];
    for (int i = 0; i < x->m->n_nodes; i++)
        for (int k = 0; k < x->m->nodes[i].n_in; k++)
            for (int o = 0; o < d->n_out; o++)
                if (d->out[o] >= 0 && x->m->nodes[i].in[k] == d->out[o] && !x->skip[i] && x->dyn_out[i] < 0) return false;
    for (int o = 0; o < d->n_out; o++)
        for (int j = 0; j < x->m->n_outputs; j++)
            if (d->out[o] >= 0 && x->m->outputs[j] == d->out[o]) return false;
    return true;
}

fm_status onnx_graph_match_dynamic_int8(onnx_graph_ctx *x) {
    const fm_onnx_model *m = x->m;
    fuse_ctx f;
    if (fuse_begin(x, &f)) return fm_last_status();
    for (int i = 0; i < m->n_nodes; i++) x->dyn_out[i] = x->dyn_scale[i] = -1;
    for (int i = 0; i < m->n_nodes; i++)
        if (!strcmp(m->nodes[i].op->name, "MatMulInteger") && !x->skip[i]) match_dynamic_at(&f, i);
    for (int i = 0; i < m->n_nodes; i++)
        if (!strcmp(m->nodes[i].op->name, "DynamicQuantizeLinear") && all_readers_fused(x, i)) x->skip[i] = true;
    fuse_end(&f);
    return FM_OK;
}
