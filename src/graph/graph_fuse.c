/* The fusion passes:
 *   conv2d -> batch_norm (inference)  =>  one conv2d whose weights and bias hold the
 *       normalization (w' = w * g / sqrt(var + eps) per output channel,
 *       b' = (b - mean) * g / sqrt(var + eps) + beta): the normalization pass is gone;
 *   add -> layer_norm                 =>  add_layer_norm (the residual sum and its norm
 *       in one pass over the rows; the sum stays available to its other readers);
 *   linear (with bias) -> gelu_tanh   =>  linear without bias -> bias_gelu_tanh (the
 *       bias add and the activation in one pass instead of two);
 *   conv2d -> relu (or a clamp from 0 or -inf: ReLU6) and/or max_pool2d (window =
 *       stride, no padding), in either order
 *                                     =>  conv2d_fused (ReLU and pool applied to the
 *       conv's accumulators: its full-size output is never stored); an f32 conv alone
 *       with constant weights, a kernel larger than 1x1, stride 1 and one group too
 *       (relu 0, pool 0), for the CPU's direct kernels and their weights packed at load;
 *   linear (f32, constant weight) -> relu, or a linear alone
 *                                     =>  linear_fused (on the CPU: weights packed once at
 *       load, bias and ReLU applied to the accumulators);
 *   matmul (x [..., K] @ a constant f32 W [K, N]), then add of a constant [N] bias
 *                                     =>  linear (x, W transposed once, the bias): what an
 *       imported ONNX MatMul + Add (a PyTorch Linear on 3-D input) becomes, so that the
 *       linear passes after it apply;
 *   sigmoid(x) -> mul with x          =>  silu(x) (SiLU/Swish as exported: EfficientNet's
 *       activations; one pass over the tensor instead of two and no intermediate);
 *   2 to 8 f32 elementwise steps in a row (add/sub/mul/div by a scalar constant or by
 *       the chain's input, relu, clamp, sigmoid, tanh, round), no broadcasting
 *                                     =>  ew_chain (one pass over memory: HardSwish's
 *       mul, add, clamp, mul).
 *   pad (zeros, as much before as after each spatial dim) -> conv2d
 *                                     =>  conv2d with that much more padding.
 * A pattern is fused only when its first node's output has no other reader (the
 * add excepted: add_layer_norm still produces the sum) and is not a graph output. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph_rewrite.h"

/* The single node reading value v right after, or -1. */
static int sole_reader(const fm_graph *g, const int *uses, int v) {
    if (uses[v] != 1 || g->values[v].is_output) return -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] == v) return i;
    return -1;
}

static const fm_tensor *cst(const fm_graph *g, int v) {
    return v >= 0 && g->values[v].kind == GV_CONST && g->values[v].tensor->dtype == FM_F32 ? g->values[v].tensor : NULL;
}

static const char *str_attr(const gnode *n, const char *name, const char *def) {
    const gattr *a = g_node_attr(n, name);
    return a && a->type == FM_ATTR_STRING ? a->s : def;
}

static double num_attr(const gnode *n, const char *name, double def) {
    const gattr *a = g_node_attr(n, name);
    return !a ? def : a->type == FM_ATTR_INT ? (double)a->i : a->type == FM_ATTR_FLOAT ? a->f : def;
}

/* Folds bn (node b) into conv (node c): new constants, one conv2d node. */
static fm_status fold_bn(rw *r, const gnode *c, const gnode *b) {
    const fm_graph *g = r->src;
    const fm_tensor *w = cst(g, c->in[1]), *cb = c->n_in > 2 ? cst(g, c->in[2]) : NULL;
    const fm_tensor *gm = cst(g, b->in[1]), *bt = cst(g, b->in[2]), *mu = cst(g, b->in[3]), *var = cst(g, b->in[4]);
    const int64_t O = w->shape[0], per = fm_tensor_numel(w) / O;
    const double eps = num_attr(b, "eps", 1e-5);
    fm_tensor *nw = fm_tensor_empty(w->ndim, w->shape, FM_F32, FM_CPU), *nb = fm_tensor_empty(1, &O, FM_F32, FM_CPU);
    if (!nw || !nb) { fm_tensor_release_n(2, nw, nb); return fm_last_status(); }
    const float *pw = fm_tensor_data(w), *pb = cb ? fm_tensor_data(cb) : NULL, *pg = gm ? fm_tensor_data(gm) : NULL;
    const float *pt = bt ? fm_tensor_data(bt) : NULL, *pm = fm_tensor_data(mu), *pv = fm_tensor_data(var);
    float *qw = fm_tensor_data(nw), *qb = fm_tensor_data(nb);
    for (int64_t o = 0; o < O; o++) {
        double s = (pg ? pg[o] : 1.0) / sqrt((double)pv[o] + eps);
        for (int64_t i = 0; i < per; i++) qw[o * per + i] = (float)(pw[o * per + i] * s);
        qb[o] = (float)(((pb ? pb[o] : 0.0) - pm[o]) * s + (pt ? pt[o] : 0.0));
    }
    char wn[300], bn[300];
    snprintf(wn, sizeof wn, "%s.weight_bn", c->name);
    snprintf(bn, sizeof bn, "%s.bias_bn", c->name);
    fm_status st = rw_const(r, wn, nw);
    if (st == FM_OK) st = rw_const(r, bn, nb);
    fm_tensor_release_n(2, nw, nb);
    if (st != FM_OK) return st;
    const char *ins[3] = {rw_name(r, c->in[0]), wn, bn}, *outs[1] = {g->values[b->out[0]].name};
    return rw_node_as(r, c, "conv2d", 3, ins, 1, outs);
}

static bool conv_bn_match(const fm_graph *g, const int *uses, int i, int *bn) {
    const gnode *c = &g->nodes[i];
    if (strcmp(c->op, "conv2d") || !cst(g, c->in[1]) || (c->n_in > 2 && c->in[2] >= 0 && !cst(g, c->in[2]))) return false;
    int j = sole_reader(g, uses, c->out[0]);
    if (j < 0 || strcmp(g->nodes[j].op, "batch_norm") || g->nodes[j].in[0] != c->out[0]) return false;
    const gnode *b = &g->nodes[j];
    for (int k = 1; k < 5; k++)
        if (b->in[k] >= 0 && !cst(g, b->in[k])) return false;
    if (b->in[3] < 0 || b->in[4] < 0 || strcmp(str_attr(c, "layout", "NCHW"), str_attr(b, "layout", "NCHW"))) return false;
    *bn = j;
    return true;
}

static int conv_bn_node(rw_fuse *f, int i) {
    int j;
    if (!conv_bn_match(f->g, f->uses, i, &j)) return -1;
    f->skip[j] = true;
    f->tally[0]++;
    return fold_bn(&f->r, &f->g->nodes[i], &f->g->nodes[j]);
}

fm_graph *g_pass_fuse_conv_bn(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, conv_bn_node, n);
    if (out) snprintf(note, nn, "%d batch norms folded into the convolution before them", n[0]);
    return out;
}

/* A pair attribute (stride, padding, kernel: one number for both dims, or two) into out,
 * which keeps its values when the attribute is absent; false when it is not such a pair. */
static bool attr_pair(const gnode *n, const char *name, int64_t out[2]) {
    const gattr *at = g_node_attr(n, name);
    if (!at) return true;
    if (at->type == FM_ATTR_INT) out[0] = out[1] = at->i;
    else if (at->type == FM_ATTR_INTS && (at->n == 1 || at->n == 2) && !at->ints[0].expr && !at->ints[at->n - 1].expr)
        out[0] = at->ints[0].v, out[1] = at->ints[at->n - 1].v;
    else return false;
    return true;
}

/* pad (constant 0, the same amount before and after each spatial dim, none on N and C) read
 * only by a conv2d (NCHW): the conv pads that much more itself, and the padded copy goes
 * (Keras's ZeroPadding2D before a VALID conv, as ResNet-50's stem exported by tf2onnx). */
static int pad_conv_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *p = &g->nodes[i];
    int64_t pads[8], cp[2] = {0, 0};
    double v = 1;
    const gattr *pa = strcmp(p->op, "pad") ? NULL : g_node_attr(p, "pads");
    if (!pa || pa->type != FM_ATTR_INTS || pa->n != 8 || g->values[p->in[0]].t.ndim != 4 || strcmp(str_attr(p, "mode", "constant"), "constant") ||
        g_attr_float(g_node_attr(p, "value"), "value", 0.0, &v) || v != 0)
        return -1;
    for (int k = 0; k < 8; k++) {
        if (pa->ints[k].expr) return -1; /* a dim expression */
        pads[k] = pa->ints[k].v;
    }
    const int j = sole_reader(g, f->uses, p->out[0]);
    const gnode *c = j >= 0 ? &g->nodes[j] : NULL;
    if (!c || strcmp(c->op, "conv2d") || c->in[0] != p->out[0] || strcmp(str_attr(c, "layout", "NCHW"), "NCHW")) return -1;
    if (pads[0] || pads[1] || pads[4] || pads[5] || pads[2] != pads[6] || pads[3] != pads[7] || pads[2] < 0 || pads[3] < 0) return -1;
    if (!attr_pair(c, "padding", cp)) return -1;
    const int64_t np[2] = {cp[0] + pads[2], cp[1] + pads[3]};
    fm_graph_attr a = fm_graph_attr_ints("padding", 2, np);
    const char *ins[FM_GRAPH_MAX_NODE_IO], *outs[1] = {g->values[c->out[0]].name};
    for (int k = 0; k < c->n_in; k++) ins[k] = k == 0 ? rw_name(&f->r, p->in[0]) : rw_name(&f->r, c->in[k]);
    f->skip[j] = true;
    f->tally[0]++;
    return rw_node_with(&f->r, c, "conv2d", c->n_in, ins, 1, outs, 1, &a);
}

fm_graph *g_pass_fold_pad_conv(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, pad_conv_node, n);
    if (out) snprintf(note, nn, "%d zero pads folded into the convolution after them", n[0]);
    return out;
}

/* add(x, h) read by layer_norm(., w, b) over the last dim, both operands of one shape. */
/* The same shape as value x, at both probe sizes (no broadcasting). */
static bool same_shape(const fm_graph *g, int a, int x) {
    const gvalue *va = &g->values[a], *vx = &g->values[x];
    return va->t.ndim == vx->t.ndim && !memcmp(va->t.d, vx->t.d, sizeof(int64_t) * (size_t)vx->t.ndim) &&
           !memcmp(va->probe2, vx->probe2, sizeof(int64_t) * (size_t)vx->t.ndim);
}

static int add_ln_match(const fm_graph *g, int i) {
    const gnode *a = &g->nodes[i];
    if (strcmp(a->op, "add")) return -1;
    const gtype *x = &g->values[a->in[0]].t, *h = &g->values[a->in[1]].t;
    if (x->dt != FM_F32 || h->dt != FM_F32 || x->ndim < 1 || !same_shape(g, a->in[0], a->in[1]))
        return -1; /* no broadcasting, at either probe size */
    for (int j = i + 1; j < g->n_nodes; j++) {
        const gnode *n = &g->nodes[j];
        if (strcmp(n->op, "layer_norm") || n->in[0] != a->out[0] || num_attr(n, "n_norm_dims", 1) != 1) continue;
        bool consts = true; /* weight and bias must exist where the add is */
        for (int k = 1; k < n->n_in; k++) consts &= n->in[k] < 0 || g->values[n->in[k]].kind == GV_CONST;
        if (consts) return j;
    }
    return -1;
}

static int add_ln_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    int j = add_ln_match(g, i);
    if (j < 0) return -1;
    const gnode *a = &g->nodes[i], *n = &g->nodes[j];
    const char *ins[4] = {rw_name(&f->r, a->in[0]), rw_name(&f->r, a->in[1]), n->n_in > 1 ? rw_name(&f->r, n->in[1]) : "",
                          n->n_in > 2 ? rw_name(&f->r, n->in[2]) : ""};
    const char *outs[2] = {g->values[a->out[0]].name, g->values[n->out[0]].name};
    f->skip[j] = true;
    f->tally[0]++;
    return rw_node_as(&f->r, n, "add_layer_norm", 4, ins, 2, outs);
}

fm_graph *g_pass_fuse_add_layer_norm(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, add_ln_node, n);
    if (out) snprintf(note, nn, "%d residual adds fused with the layer norm after them", n[0]);
    return out;
}

static int bias_gelu_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *l = &g->nodes[i];
    int j = !strcmp(l->op, "linear") && l->n_in > 2 && l->in[2] >= 0 && g->values[l->out[0]].t.dt == FM_F32
                ? sole_reader(g, f->uses, l->out[0]) : -1;
    if (j < 0 || strcmp(g->nodes[j].op, "gelu_tanh")) return -1;
    const fm_tensor *w = cst(g, l->in[1]);
    if (w && w->dtype == FM_F32 && w->ndim == 2) return -1; /* fuse-linear-act's: linear_fused applies bias and GELU as it stores */
    char mid[300];
    snprintf(mid, sizeof mid, "%s.nobias", g->values[l->out[0]].name);
    const char *ins[3] = {rw_name(&f->r, l->in[0]), rw_name(&f->r, l->in[1]), ""}, *bg[2] = {mid, rw_name(&f->r, l->in[2])};
    const char *o1[1] = {mid}, *o2[1] = {g->values[g->nodes[j].out[0]].name};
    fm_status st = rw_node_as(&f->r, l, "linear", 3, ins, 1, o1);
    if (st == FM_OK) st = rw_node_as(&f->r, &g->nodes[j], "bias_gelu_tanh", 2, bg, 1, o2);
    f->skip[j] = true;
    f->tally[0]++;
    return st;
}

fm_graph *g_pass_fuse_bias_gelu(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, bias_gelu_node, n);
    if (out) snprintf(note, nn, "%d linear biases fused into the tanh-GELU after them", n[0]);
    return out;
}

static int silu_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *s = &g->nodes[i];
    int j = !strcmp(s->op, "sigmoid") ? sole_reader(g, f->uses, s->out[0]) : -1;
    const gnode *m = j >= 0 ? &g->nodes[j] : NULL;
    /* mul(x, sigmoid(x)) or mul(sigmoid(x), x), of one dtype (the mul's inputs are) */
    if (!m || strcmp(m->op, "mul") || m->n_in != 2 || m->in[m->in[0] == s->out[0] ? 1 : 0] != s->in[0]) return -1;
    const char *ins[1] = {rw_name(&f->r, s->in[0])}, *outs[1] = {g->values[m->out[0]].name};
    f->skip[j] = true;
    f->tally[0]++;
    return rw_node_as(&f->r, m, "silu", 1, ins, 1, outs);
}

fm_graph *g_pass_fuse_silu(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, silu_node, n);
    if (out) snprintf(note, nn, "%d sigmoid-times-input pairs fused into silu", n[0]);
    return out;
}

/* A clamp node's constant bounds (absent: -inf, inf); false if they are not numbers. */
static bool clamp_bounds(const gnode *n, double *lo, double *hi) {
    if (strcmp(n->op, "clamp")) return false;
    const gattr *a = g_node_attr(n, "min"), *b = g_node_attr(n, "max");
    *lo = -INFINITY, *hi = INFINITY;
    for (int k = 0; k < 2; k++) {
        const gattr *t = k ? b : a;
        if (!t) continue;
        if (t->type != FM_ATTR_FLOAT && t->type != FM_ATTR_INT) return false;
        *(k ? hi : lo) = t->type == FM_ATTR_FLOAT ? t->f : (double)t->i;
    }
    return !isnan(*lo) && !isnan(*hi) && *lo <= *hi;
}

/* A square max pool with stride = window and no padding in `layout`: its window, or 0. */
static int64_t plain_pool(const gnode *n, const char *layout) {
    int64_t k[2] = {0, 0}, st[2] = {-1, -1}, pd[2] = {0, 0};
    if (!attr_pair(n, "kernel", k) || !attr_pair(n, "stride", st) || !attr_pair(n, "padding", pd)) return 0;
    if (st[0] < 0) st[0] = k[0], st[1] = k[1];
    bool ok = k[0] == k[1] && st[0] == k[0] && st[1] == k[1] && !pd[0] && !pd[1] && k[0] > 1 && k[0] <= 64;
    return ok && !strcmp(str_attr(n, "layout", "NCHW"), layout) ? k[0] : 0;
}

static int conv_act_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *c = &g->nodes[i];
    fm_dtype dt = g->values[c->out[0]].t.dt;
    if (strcmp(c->op, "conv2d") || (dt != FM_F32 && dt != FM_F64)) return -1;
    int64_t relu = 0, pool = 0;
    double hi = INFINITY;
    bool act = false;
    int last = i, chain[2], n_chain = 0;
    for (int step = 0; step < 2; step++) { /* up to one relu (or clamp) and one pool after it, in either order */
        int j = sole_reader(g, f->uses, g->nodes[last].out[0]);
        if (j < 0) break;
        const gnode *n = &g->nodes[j];
        int64_t k = !pool && !strcmp(n->op, "max_pool2d") ? plain_pool(n, str_attr(c, "layout", "NCHW")) : 0;
        double lo, cap;
        if (!act && !strcmp(n->op, "relu")) relu = 1, act = true;
        else if (!act && clamp_bounds(n, &lo, &cap) && (lo == 0 || lo == -INFINITY)) relu = lo == 0, hi = cap, act = true; /* ReLU6 */
        else if (k) pool = k;
        else break;
        chain[n_chain++] = last = j;
    }
    /* a conv alone becomes conv2d_fused too where the CPU's direct kernels take it (f32
     * constant weights, stride 1, one group): its weights are packed once at load, and
     * 3x3 layers run Winograd (ResNet's second conv of a block, before the residual add);
     * a 1x1 conv alone stays: conv2d gives it to the GEMM as it is */
    const fm_tensor *w = cst(g, c->in[1]);
    if (!n_chain && !(dt == FM_F32 && w && w->ndim == 4 && w->shape[2] * w->shape[3] > 1 && g_conv_direct_geometry(c))) return -1;
    const char *ins[3] = {rw_name(&f->r, c->in[0]), rw_name(&f->r, c->in[1]), c->n_in > 2 ? rw_name(&f->r, c->in[2]) : ""};
    const char *outs[1] = {g->values[g->nodes[last].out[0]].name};
    fm_graph_attr extra[3] = {fm_graph_attr_int("relu", relu), fm_graph_attr_int("pool", pool), fm_graph_attr_float("max", hi)};
    for (int k = 0; k < n_chain; k++) f->skip[chain[k]] = true;
    f->tally[n_chain ? 0 : 2]++;
    f->tally[1] += pool > 1;
    return rw_node_with(&f->r, c, "conv2d_fused", 3, ins, 1, outs, hi < INFINITY ? 3 : 2, extra);
}

fm_graph *g_pass_fuse_conv_act(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, conv_act_node, n);
    if (out)
        snprintf(note, nn, "%d convolutions fused with the ReLU/max pool after them (%d with the pool), %d alone for the direct kernels",
                 n[0], n[1], n[2]);
    return out;
}

static int linear_act_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *l = &g->nodes[i];
    const fm_tensor *w = !strcmp(l->op, "linear") && g->values[l->out[0]].t.dt == FM_F32 ? cst(g, l->in[1]) : NULL;
    if (!w || w->ndim != 2) return -1;
    int j = sole_reader(g, f->uses, l->out[0]), r = 0, op = -1;
    const gnode *a = j >= 0 ? &g->nodes[j] : NULL; /* the activation after it, which linear_fused applies */
    const bool act = a && a->n_in == 1 && a->n_out == 1 && fm_linear_act_parse(a->op, &r, &op) == FM_OK && (r || op >= 0);
    if (!act) fm_clear_error();
    const char *ins[3] = {rw_name(&f->r, l->in[0]), rw_name(&f->r, l->in[1]), l->n_in > 2 ? rw_name(&f->r, l->in[2]) : ""};
    const char *outs[1] = {g->values[(act ? a->out[0] : l->out[0])].name};
    /* relu as the attribute earlier versions wrote (the quantizer reads it); the rest as act */
    fm_graph_attr extra[1] = {act && !r ? fm_graph_attr_string("act", a->op) : fm_graph_attr_int("relu", r)};
    if (act) f->skip[j] = true, f->tally[r ? 1 : 2]++;
    f->tally[0]++;
    return rw_node_with(&f->r, l, "linear_fused", 3, ins, 1, outs, 1, extra);
}

fm_graph *g_pass_fuse_linear_act(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, linear_act_node, n);
    if (out)
        snprintf(note, nn, "%d linears with constant weights made linear_fused (%d with the ReLU after them, %d with another activation)",
                 n[0], n[1], n[2]);
    return out;
}

/* The constant f32 bias [N] that add node j adds to value v ([..., N]), or -1. */
static int bias_of(const fm_graph *g, int j, int v, int64_t N) {
    const gnode *a = &g->nodes[j];
    if (strcmp(a->op, "add") || a->n_in != 2) return -1;
    int b = a->in[0] == v ? a->in[1] : a->in[0];
    const fm_tensor *t = cst(g, b);
    return t && t->ndim == 1 && t->shape[0] == N && g->values[a->out[0]].t.ndim == g->values[v].t.ndim ? b : -1;
}

/* W [K, N] as a new constant [N, K] in dst, named after W; its name. */
static const char *transposed(rw *r, int w, char *name, size_t n) {
    const fm_tensor *t = cst(r->src, w);
    snprintf(name, n, "%s.T", r->src->values[w].name);
    const int64_t K = t->shape[0], N = t->shape[1], sh[2] = {N, K};
    fm_tensor *wt = fm_tensor_empty(2, sh, FM_F32, FM_CPU);
    if (!wt) return NULL;
    const float *src = fm_tensor_data(t);
    float *dst = fm_tensor_data(wt);
    for (int64_t k = 0; k < K; k++)
        for (int64_t j = 0; j < N; j++) dst[j * K + k] = src[k * N + j];
    fm_status st = rw_const(r, name, wt);
    fm_tensor_release(wt);
    return st ? NULL : name;
}

static int matmul_linear_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *m = &g->nodes[i];
    const fm_tensor *w = !strcmp(m->op, "matmul") && m->n_in == 2 ? cst(g, m->in[1]) : NULL;
    if (!w || w->ndim != 2 || cst(g, m->in[0]) || g->values[m->in[0]].t.ndim < 2 || g->values[m->in[0]].t.dt != FM_F32) return -1;
    int j = sole_reader(g, f->uses, m->out[0]), b = j >= 0 ? bias_of(g, j, m->out[0], w->shape[1]) : -1;
    char wname[300];
    const char *ins[3] = {rw_name(&f->r, m->in[0]), transposed(&f->r, m->in[1], wname, sizeof wname), b >= 0 ? rw_name(&f->r, b) : ""};
    const char *outs[1] = {g->values[b >= 0 ? g->nodes[j].out[0] : m->out[0]].name};
    if (b >= 0) f->skip[j] = true, f->tally[1]++;
    f->tally[0]++;
    return ins[1] ? rw_node_as(&f->r, m, "linear", 3, ins, 1, outs) : fm_last_status();
}

fm_graph *g_pass_matmul_to_linear(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, matmul_linear_node, n);
    if (out) snprintf(note, nn, "%d matmuls by a constant 2-D weight made linear (%d with the bias add after them)", n[0], n[1]);
    return out;
}

/* Node n as a chain step on the running value v, x being the chain's input: its step,
 * or false. */
static bool as_step(const fm_graph *g, const gnode *n, int v, int x, fm_ew_step *s) {
    if (n->n_out != 1 || g->values[n->out[0]].t.dt != FM_F32 || !same_shape(g, n->out[0], x)) return false;
    double lo, hi;
    if (n->n_in == 1 && n->in[0] == v) {
        static const struct { const char *op; fm_ew_step_op code; } un[] = {
            {"relu", FM_EW_RELU}, {"sigmoid", FM_EW_SIGMOID}, {"tanh", FM_EW_TANH}, {"round", FM_EW_ROUND}};
        for (size_t k = 0; k < sizeof un / sizeof un[0]; k++)
            if (!strcmp(n->op, un[k].op)) { *s = (fm_ew_step){un[k].code, 0, 0}; return true; }
        if (clamp_bounds(n, &lo, &hi)) { *s = (fm_ew_step){FM_EW_CLAMP, (float)lo, (float)hi}; return true; }
        return false;
    }
    if (n->n_in != 2 || (n->in[0] != v && n->in[1] != v)) return false;
    const bool first = n->in[0] == v;
    const int k = first ? n->in[1] : n->in[0];
    const bool add = !strcmp(n->op, "add"), mul = !strcmp(n->op, "mul"), sub = !strcmp(n->op, "sub"), div = !strcmp(n->op, "div");
    if (k == x && (add || mul)) { *s = (fm_ew_step){add ? FM_EW_ADD_X : FM_EW_MUL_X, 0, 0}; return true; }
    const fm_tensor *c = cst(g, k);
    if (!c || fm_tensor_numel(c) != 1 || (!add && !mul && !sub && !div)) return false;
    const float a = ((const float *)fm_tensor_data(c))[0];
    *s = (fm_ew_step){add ? FM_EW_ADD : mul ? FM_EW_MUL : sub ? (first ? FM_EW_SUB : FM_EW_RSUB) : (first ? FM_EW_DIV : FM_EW_RDIV), a, 0};
    return true;
}

static int ew_chain_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *n0 = &g->nodes[i];
    /* the chain's input: the first node's non-constant input */
    int x = -1;
    for (int k = 0; k < n0->n_in && x < 0; k++)
        if (n0->in[k] >= 0 && !cst(g, n0->in[k])) x = n0->in[k];
    if (x < 0 || g->values[x].t.dt != FM_F32) return -1;
    fm_ew_step st[FM_EW_CHAIN_MAX];
    int nodes[FM_EW_CHAIN_MAX], n = 0, v = x, cur = i;
    while (n < FM_EW_CHAIN_MAX && cur >= 0 && as_step(g, &g->nodes[cur], v, x, &st[n])) {
        nodes[n++] = cur;
        v = g->nodes[cur].out[0];
        cur = sole_reader(g, f->uses, v);
    }
    if (n < 2) return -1;
    int64_t ops[FM_EW_CHAIN_MAX];
    double args[2 * FM_EW_CHAIN_MAX];
    for (int k = 0; k < n; k++) ops[k] = st[k].op, args[2 * k] = st[k].a, args[2 * k + 1] = st[k].b;
    fm_graph_attr at[2] = {fm_graph_attr_ints("ops", n, ops), fm_graph_attr_floats("args", 2 * n, args)};
    const char *ins[1] = {rw_name(&f->r, x)}, *outs[1] = {g->values[v].name};
    for (int k = 1; k < n; k++) f->skip[nodes[k]] = true;
    f->tally[0]++;
    f->tally[1] += n;
    /* its own attributes only (rw_node_with would copy the last step's); x is no constant */
    return fm_graph_add_node(f->r.dst, "ew_chain", g->nodes[nodes[n - 1]].name, 1, ins, 1, outs, 2, at);
}

fm_graph *g_pass_fuse_elementwise(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, ew_chain_node, n);
    if (out) snprintf(note, nn, "%d chains of elementwise ops (%d ops) run as one ew_chain each", n[0], n[1]);
    return out;
}

/* ------------------------------------------------------------ fold-reshape
 * A reshape, elementwise ops, then a reshape back: what a 1-D conv net imported from
 * ONNX holds between its windows (each runs as a 2-D one on [N, C, 1, L] between two
 * reshapes). The reshapes are moved past the elementwise ops (a reshape commutes with
 * them; with a per-channel batch_norm when it keeps dims 0 and 1), a reshape of a
 * reshape reads the first one's input when its 0 entries (copy that dim) see the same
 * dims there, and a reshape whose output has its input's shape (fixed and dynamic dims
 * alike) is bypassed. Conv, ReLU and the next conv then meet, for fuse-conv-act. */

static bool same_type(const fm_graph *g, int a, int b) { return g->values[a].t.dt == g->values[b].t.dt && same_shape(g, a, b); }

/* Whether value b's dim d is value a's dim d (fixed and dynamic alike). */
static bool same_dim(const fm_graph *g, int a, int b, int d) {
    const gvalue *x = &g->values[a], *y = &g->values[b];
    return d < x->t.ndim && d < y->t.ndim && x->t.d[d] == y->t.d[d] && x->probe2[d] == y->probe2[d];
}

/* Whether node u gives the same values before reshape node r as after it. */
static bool commutes(const fm_graph *g, const gnode *u, const gnode *r) {
    if (u->n_out != 1) return false;
    if (!strcmp(u->op, "batch_norm")) /* per channel (dim 1): the reshape keeps dims 0 and 1 */
        return !strcmp(str_attr(u, "layout", "NCHW"), "NCHW") && same_dim(g, r->in[0], r->out[0], 0) &&
               same_dim(g, r->in[0], r->out[0], 1) && g->values[r->in[0]].t.ndim >= 3;
    return u->n_in == 1 && g_op_is_pointwise(u->op);
}

/* reshape A -> u -> (more such ops) -> reshape: u = A's sole reader, and the chain of sole
 * readers after it reaches a reshape within 8 ops, each commuting with A. */
static int sink_reshape_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *a = &g->nodes[i];
    int j = !strcmp(a->op, "reshape") ? sole_reader(g, f->uses, a->out[0]) : -1;
    if (j < 0 || g->nodes[j].in[0] != a->out[0] || !commutes(g, &g->nodes[j], a)) return -1;
    int k = sole_reader(g, f->uses, g->nodes[j].out[0]);
    for (int hop = 0; k >= 0 && hop < 8 && strcmp(g->nodes[k].op, "reshape"); hop++)
        k = commutes(g, &g->nodes[k], a) ? sole_reader(g, f->uses, g->nodes[k].out[0]) : -1;
    if (k < 0 || strcmp(g->nodes[k].op, "reshape")) return -1;
    const gnode *u = &g->nodes[j];
    const char *ins[FM_GRAPH_MAX_NODE_IO], *mid[1] = {g->values[a->out[0]].name}, *outs[1] = {g->values[u->out[0]].name};
    ins[0] = rw_name(&f->r, a->in[0]);
    for (int q = 1; q < u->n_in; q++) ins[q] = rw_name(&f->r, u->in[q]);
    f->skip[j] = true;
    f->tally[0]++;
    fm_status st = rw_node_as(&f->r, u, u->op, u->n_in, ins, 1, mid);
    return st ? st : rw_node_as(&f->r, a, "reshape", 1, mid, 1, outs);
}

/* A reshape of a reshape reads the first one's input where that gives the same result;
 * a reshape to its input's own shape is bypassed. */
static int fold_reshape_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    const gnode *n = &g->nodes[i];
    if (strcmp(n->op, "reshape") || g->values[n->out[0]].is_output) return -1;
    int src = n->in[0];
    const gvalue *in = &g->values[src];
    const gnode *p = in->kind == GV_NODE && in->producer >= 0 ? &g->nodes[in->producer] : NULL;
    const gattr *sh = g_node_attr(n, "shape");
    bool compose = p && !strcmp(p->op, "reshape") && sh && sh->type == FM_ATTR_INTS;
    for (int d = 0; compose && d < sh->n; d++)
        if (!sh->ints[d].expr && sh->ints[d].v == 0) compose = same_dim(g, p->in[0], p->out[0], d);
    if (compose) src = p->in[0];
    if (same_type(g, src, n->out[0])) {
        f->tally[0]++;
        return rw_alias(&f->r, n->out[0], rw_name(&f->r, src));
    }
    if (src == n->in[0]) return -1;
    f->tally[1]++;
    const char *ins[1] = {rw_name(&f->r, src)}, *outs[1] = {g->values[n->out[0]].name};
    return rw_node_as(&f->r, n, "reshape", 1, ins, 1, outs);
}

fm_graph *g_pass_fold_reshape(const fm_graph *g, char *note, size_t nn) {
    int moved = 0, n[3];
    fm_graph *cur = NULL;
    for (int round = 0; round < 8; round++) { /* one elementwise op per round */
        fm_graph *next = rw_fuse_pass(cur ? cur : g, sink_reshape_node, n);
        fm_graph_free(cur);
        if (!(cur = next)) return NULL;
        moved += n[0];
        if (!n[0]) break;
    }
    fm_graph *out = rw_fuse_pass(cur, fold_reshape_node, n);
    fm_graph_free(cur);
    if (!out) return NULL;
    snprintf(note, nn, "%d reshapes moved past elementwise ops, %d reshapes of a reshape read its input, %d reshapes to the "
             "input's own shape bypassed", moved, n[1], n[0]);
    return out;
}
