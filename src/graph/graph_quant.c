/* fm_graph_quantize: a graph-to-graph transform (docs/QUANTIZE.md).
 *
 * Candidates are nodes whose weight is an f32 constant:
 *   linear (x, w [N, K], [b])      -> qlinear_int8 / qlinear_int4 with w quantized per row;
 *   matmul (a, b [K, N] constant)  -> the same with b transposed to [N, K] first;
 *   embedding (w [V, D], indices)  -> qembedding_int4, or in int8 modes qembedding_int8 on the
 *                                     int8 panels (widths up to the panels' 32768; wider: fp32);
 *   conv2d / conv2d_fused (x, w [O, C, kh, kw], [b]), groups 1, NCHW, int8 modes
 *                                  -> qconv2d_int8 with w quantized per output channel (and a
 *                                     conv2d_fused's ReLU, cap and pool).
 * Every other node is copied as it is and runs in fp32; the report says which
 * and why. Quantized constants are named after the weight (`fc1.weight.int8`,
 * `.int8_scale`, `.int4`, `.int4_scale`, `.int4_min`), so a weight that two
 * nodes share (a GPT's tied embedding and output head) is stored once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/ops.h"
#include "graph/graph_quant.h"
#include "graph/graph_rewrite.h"

void fm_quant_options_init(fm_quant_options *o) {
    memset(o, 0, sizeof *o);
    o->group = 32;
    o->percentile = 99.99;
    o->batch = 64;
}

void fm_quant_report_free(fm_quant_report *r) {
    if (!r) return;
    free(r->nodes);
    memset(r, 0, sizeof *r);
}

typedef enum { K_NONE, K_LINEAR, K_MATMUL, K_EMBEDDING, K_FUSED, K_CONV } qkind;

static const fm_tensor *f32_const2(const fm_graph *g, int v) {
    return v >= 0 && g->values[v].kind == GV_CONST && g->values[v].tensor->dtype == FM_F32 && g->values[v].tensor->ndim == 2
               ? g->values[v].tensor : NULL;
}

/* A linear_fused node's activation (fathom compile's fuse-linear-act: relu = 1, or act),
 * or NULL: the quantized node keeps it (int8: a ReLU or GELU in its epilogue, another
 * one as a node after; int4: a node after). */
static const char *fused_act(const gnode *n) {
    const char *act = NULL; /* the graph was checked when it was loaded or built */
    return strcmp(n->op, "linear_fused") || g_linear_fused_act(n, &act) ? NULL : act;
}

/* The quantized node's output: out itself, or (an activation that goes after it as a node,
 * act_node) a name for the product in buf. */
static const char *product_name(const char *out, const char *act_node, char *buf, size_t nb) {
    if (!act_node) return out;
    snprintf(buf, nb, "%s.q_product", out);
    return buf;
}

/* The activation node after a quantized node that could not take it: act_node on pre into out. */
static fm_status act_node_after(rw *r, const gnode *n, const char *act_node, const char *pre, const char *out, char *how, size_t nh) {
    char an[300];
    size_t l = strlen(how);
    if (l < nh) snprintf(how + l, nh - l, ", + a %s node", act_node);
    snprintf(an, sizeof an, "%s.%s", n->name, act_node);
    return fm_graph_add_node(r->dst, act_node, an, 1, &pre, 1, &out, 0, NULL);
}

/* Convolutions whose window holds fewer weights stay fp32 (a one-channel image's first 3x3, an
 * RGB 3x3 stem, a 1x1 over a few channels): an int8 output costs about the same codes, im2col,
 * epilogue and transpose whatever its K, and at K 9 that is more than the fp32 direct kernel's
 * whole output. fashion-cnn (Intel Xeon model 167, bench_quant --cnn, batch 32): with its first
 * conv (K 9) int8 too, 1.01-1.04x fp32; with it fp32, 1.56-1.66x. */
#define QCONV_MIN_K 32

static qkind classify_conv(const fm_graph *g, const gnode *n, fm_quant_mode mode, char *why, size_t nw) {
    const int wv = n->in[1];
    const gattr *lay = g_node_attr(n, "layout");
    if (mode == FM_QUANT_INT4) { snprintf(why, nw, "fp32: int4 is weight-only for linear layers and tables (use --int8 for convolutions)"); return K_NONE; }
    if (!(wv >= 0 && g->values[wv].kind == GV_CONST && g->values[wv].tensor->dtype == FM_F32 && g->values[wv].tensor->ndim == 4)) {
        snprintf(why, nw, "fp32: the weight is not a 4-D f32 constant");
        return K_NONE;
    }
    if (g->values[n->in[0]].t.dt != FM_F32) { snprintf(why, nw, "fp32: the input is not f32"); return K_NONE; }
    if (n->n_in > 2 && n->in[2] >= 0 && g->values[n->in[2]].t.dt != FM_F32) { snprintf(why, nw, "fp32: the bias is not f32"); return K_NONE; }
    if (g_node_int(n, "groups", 1) != 1) { snprintf(why, nw, "fp32: a grouped (depthwise) convolution: no int8 kernel for groups > 1"); return K_NONE; }
    if (lay && lay->type == FM_ATTR_STRING && strcmp(lay->s, "NCHW")) { snprintf(why, nw, "fp32: an NHWC convolution (int8 takes NCHW)"); return K_NONE; }
    const fm_tensor *w = g->values[wv].tensor;
    if (w->shape[1] * w->shape[2] * w->shape[3] > 32768 || w->shape[2] > 64 || w->shape[3] > 64) {
        snprintf(why, nw, "fp32: kh kw C beyond the int8 panels' 32768 (or a kernel past 64)");
        return K_NONE;
    }
    if (w->shape[1] * w->shape[2] * w->shape[3] < QCONV_MIN_K) {
        snprintf(why, nw, "fp32: a window of %lld weights (kh kw C < %d): too few products per output for int8 to pay",
                 (long long)(w->shape[1] * w->shape[2] * w->shape[3]), QCONV_MIN_K);
        return K_NONE;
    }
    return K_CONV;
}

/* What the node is to the transform, and why not when it is not. */
static qkind classify(const fm_graph *g, const gnode *n, fm_quant_mode mode, char *why, size_t nw) {
    snprintf(why, nw, "fp32: no quantized kernel for %s", n->op);
    if (!strcmp(n->op, "linear") || !strcmp(n->op, "linear_fused") || !strcmp(n->op, "matmul")) {
        bool lin = strcmp(n->op, "matmul") != 0;
        if (!f32_const2(g, n->in[1])) { snprintf(why, nw, "fp32: the weight is not a 2-D f32 constant"); return K_NONE; }
        if (g->values[n->in[0]].t.dt != FM_F32) { snprintf(why, nw, "fp32: the input is not f32"); return K_NONE; }
        if (lin && n->n_in > 2 && n->in[2] >= 0 && g->values[n->in[2]].t.dt != FM_F32) { snprintf(why, nw, "fp32: the bias is not f32"); return K_NONE; }
        if (!lin && g->values[n->in[0]].t.ndim < 1) { snprintf(why, nw, "fp32: a 0-d operand"); return K_NONE; }
        return lin ? K_LINEAR : K_MATMUL;
    }
    if (!strcmp(n->op, "embedding")) {
        if (!f32_const2(g, n->in[0])) { snprintf(why, nw, "fp32: the table is not a 2-D f32 constant"); return K_NONE; }
        if (mode != FM_QUANT_INT4 && g->values[n->in[0]].tensor->shape[1] > 32768) {
            snprintf(why, nw, "fp32: a table wider than the int8 panels' 32768 (use --int4)");
            return K_NONE;
        }
        return K_EMBEDDING;
    }
    if (!strcmp(n->op, "conv2d") || !strcmp(n->op, "conv2d_fused")) return classify_conv(g, n, mode, why, nw);
    return K_NONE;
}

/* The activation node that alone reads node i's output (not a graph output) and can
 * run in node i's int8 epilogue, or -1: a relu; a gelu_tanh or gelu (the panels' epilogue);
 * or a bias_gelu_tanh after a linear without a bias (fathom compile's fuse-bias-gelu:
 * its bias becomes the quantized node's). The fused epilogues compute what the
 * separate ops do, bitwise (test_quant). */
static int act_after(const fm_graph *g, const int *uses, int i, bool panels) {
    const gnode *n = &g->nodes[i];
    const int v = n->out[0];
    if (n->n_out != 1 || uses[v] != 1 || g->values[v].is_output || fused_act(n)) return -1;
    for (int j = i + 1; j < g->n_nodes; j++) {
        const gnode *a = &g->nodes[j];
        if (a->n_in < 1 || a->in[0] != v) continue;
        if (a->n_out != 1) return -1;
        if (!strcmp(a->op, "relu") && a->n_in == 1) return j;
        if (!panels) return -1;
        if ((!strcmp(a->op, "gelu_tanh") || !strcmp(a->op, "gelu")) && a->n_in == 1) return j;
        const bool no_bias = n->n_in < 3 || n->in[2] < 0;
        if (!strcmp(a->op, "bias_gelu_tanh") && a->n_in == 2 && no_bias && strcmp(n->op, "matmul") && a->in[1] >= 0 &&
            g->values[a->in[1]].t.dt == FM_F32 && g->values[a->in[1]].t.ndim == 1)
            return j;
        return -1;
    }
    return -1;
}

/* Adds a node with its own attributes, carrying the source constants it reads. */
static fm_status add_node_to(rw *r, const gnode *n, const char *out, const char *op, int n_in, const char *const *ins, int na,
                             const fm_graph_attr *a) {
    for (int i = 0; i < n_in; i++) {
        int v = g_find_value(r->src, ins[i]);
        if (v >= 0 && r->src->values[v].kind == GV_CONST && rw_const(r, ins[i], r->src->values[v].tensor)) return fm_last_status();
    }
    return fm_graph_add_node(r->dst, op, n->name, n_in, ins, 1, &out, na, a);
}

static fm_status add_node(rw *r, const gnode *n, const char *op, int n_in, const char *const *ins, int na, const fm_graph_attr *a) {
    return add_node_to(r, n, r->src->values[n->out[0]].name, op, n_in, ins, na, a);
}

static fm_status add_consts(rw *r, int n, const char *const *names, fm_tensor *const *ts) {
    for (int i = 0; i < n; i++)
        if (ts[i] && rw_const(r, names[i], ts[i])) return fm_last_status();
    return FM_OK;
}

/* The weight as [N, K] (matmul's [K, N] transposed), a new reference. */
static fm_tensor *weight_nk(const fm_graph *g, const gnode *n, qkind k) {
    fm_tensor *w = (fm_tensor *)f32_const2(g, k == K_EMBEDDING ? n->in[0] : n->in[1]);
    if (k != K_MATMUL) return fm_tensor_retain(w);
    fm_tensor *t = fm_transpose(w, 0, 1), *c = t ? fm_contiguous(t) : NULL;
    fm_tensor_release(t);
    return c;
}

/* The names of weight wn's int8 constants (t: ".T" for a matmul's transposed weight,
 * else ""): the codes (panels or rows), the row scales and the panels' row sums.
 * A tied embedding and output layer name the same constants, so they share one copy. */
typedef struct int8_names { char q[300], s[300], u[300]; } int8_names;
static void int8_names_of(const char *wn, const char *t, bool panels, int8_names *nm) {
    snprintf(nm->q, sizeof nm->q, "%s%s.int8%s", wn, t, panels ? "_panels" : "");
    snprintf(nm->s, sizeof nm->s, "%s%s.int8_scale", wn, t);
    snprintf(nm->u, sizeof nm->u, "%s%s.int8_sum", wn, t);
}

/* The int8 weight of node n as constants in dst: panels (layout vnni16x4) with
 * their row sums, or rows [N, K] past the panels' 32768 input features. */
static fm_status int8_weight(rw *r, const gnode *n, qkind k, const int8_names *nm, bool panels, int qmax) {
    if (g_find_value(r->dst, nm->q) >= 0) return FM_OK; /* a weight two nodes share */
    fm_tensor *w = weight_nk(r->src, n, k), *q = NULL, *s = NULL, *p = NULL, *u = NULL;
    fm_status st = w ? fm_quantize_weight_int8_range(w, qmax, &q, &s) : fm_last_status();
    if (st == FM_OK && panels) st = fm_pack_weight_int8(q, &p, &u);
    if (st == FM_OK) st = add_consts(r, 3, (const char *[]){nm->q, nm->s, nm->u}, (fm_tensor *[]){panels ? p : q, s, u});
    fm_tensor_release_n(5, w, q, s, p, u);
    return st;
}

/* The activations' scale and zero point: static from the calibrated range (the ones the
 * kernels' dynamic path would pick for it), or 0 and 0 (dynamic); how says which. */
static void act_quant_params(const float *range, int qmax, float *s, int *zero, char *how, size_t nh) {
    *s = 0.0f;
    *zero = 0;
    const char *bits = qmax < 127 ? "7-bit " : "";
    if (!range) {
        snprintf(how, nh, "int8 dynamic (per-row %sweights, activation scale per call)", bits);
        return;
    }
    float lo = fminf(range[0], 0.0f), hi = fmaxf(range[1], 0.0f);
    *s = (hi - lo) / 255.0f;
    if (!(*s > 0) || !isfinite(*s)) *s = 1.0f;
    float z = nearbyintf(-lo / *s);
    *zero = (int)(z < 0 ? 0 : z > 255 ? 255 : z);
    snprintf(how, nh, "int8 static (%sactivations [%.4g, %.4g]: scale %.4g, zero %d)", qmax < 127 ? "7-bit weights, " : "", lo, hi, *s, *zero);
}

/* A convolution (K_CONV) as qconv2d_int8: its weight as fm_quantize_conv_weight_int8 makes
 * it, its attributes (stride, padding, dilation; conv2d_fused's ReLU, cap and pool) as they
 * are. act: a relu after a plain conv2d (act_after), or NULL. */
static fm_status quant_conv(rw *r, const gnode *n, const float *range, int qmax, const gnode *act, char *how, size_t nh) {
    const fm_graph *g = r->src;
    fm_tensor *w = g->values[n->in[1]].tensor;
    const char *wn = g->values[n->in[1]].name;
    char qn[300], sn[300], un[300];
    snprintf(qn, sizeof qn, "%s.int8_conv_panels", wn);
    snprintf(sn, sizeof sn, "%s.int8_conv_scale", wn);
    snprintf(un, sizeof un, "%s.int8_conv_sum", wn);
    if (g_find_value(r->dst, qn) < 0) { /* a weight two nodes share is stored once */
        fm_tensor *p = NULL, *sc = NULL, *u = NULL;
        fm_status st = fm_quantize_conv_weight_int8_range(w, qmax, &p, &sc, &u);
        if (st == FM_OK) st = add_consts(r, 3, (const char *[]){qn, sn, un}, (fm_tensor *[]){p, sc, u});
        fm_tensor_release_n(3, p, sc, u);
        if (st) return st;
    }
    float s;
    int zero;
    act_quant_params(range, qmax, &s, &zero, how, nh);
    /* the node's own attributes carry over (conv2d's and conv2d_fused's are all qconv2d_int8's:
     * stride, padding, dilation, groups, layout, relu, max, pool), then the int8 ones */
    const int64_t pool = g_node_int(n, "pool", 0), k[2] = {w->shape[2], w->shape[3]};
    fm_graph_attr extra[4] = {fm_graph_attr_ints("kernel", 2, k)};
    int ne = 1;
    if (act) extra[ne++] = fm_graph_attr_int("relu", 1); /* a plain conv2d's: it has no relu attribute */
    if (range) extra[ne++] = fm_graph_attr_float("a_scale", s), extra[ne++] = fm_graph_attr_int("a_zero", zero);
    const char *ins[5] = {rw_name(r, n->in[0]), qn, sn, n->n_in > 2 ? rw_name(r, n->in[2]) : "", un};
    size_t l = strlen(how);
    if ((act || g_node_int(n, "relu", 0) == 1) && l < nh)
        snprintf(how + l, nh - l, act ? ", + %s '%s' fused" : ", + its relu", act ? act->op : "", act ? act->name : "");
    l = strlen(how);
    if (pool > 1 && l < nh) snprintf(how + l, nh - l, ", + its %lldx%lld max pool", (long long)pool, (long long)pool);
    const char *out = g->values[(act ? act : n)->out[0]].name;
    return rw_node_with(r, n, "qconv2d_int8", 5, ins, 1, &out, ne, extra);
}

/* act: the activation node fused into this one's epilogue (act_after; its output is the new node's), or NULL */
static fm_status quant_int8(rw *r, const gnode *n, qkind k, const float *range, int qmax, const gnode *act, char *how, size_t nh) {
    const fm_graph *g = r->src;
    const char *t = k == K_MATMUL ? ".T" : "", *wn = g->values[n->in[1]].name;
    const int64_t K = g->values[n->in[1]].tensor->shape[k == K_MATMUL ? 0 : 1];
    const bool panels = K <= 32768; /* the panels' 32-bit sums */
    int8_names nm;
    int8_names_of(wn, t, panels, &nm);
    if (int8_weight(r, n, k, &nm, panels, qmax)) return fm_last_status();
    /* own: the linear_fused's own activation; act: a node after it (never both, act_after) */
    const char *own = fused_act(n), *gname = act ? act->op : own;
    const bool own_gelu = own && panels && (!strcmp(own, "gelu") || !strcmp(own, "gelu_tanh"));
    const char *after = own && strcmp(own, "relu") && !own_gelu ? own : NULL;
    const bool relu = (act && !strcmp(act->op, "relu")) || (own && !strcmp(own, "relu")), gelu = (act && !relu) || own_gelu;
    const bool act_bias = act && !strcmp(act->op, "bias_gelu_tanh");
    const char *bias = act_bias ? rw_name(r, act->in[1]) : k == K_LINEAR && n->n_in > 2 ? rw_name(r, n->in[2]) : "";
    const char *ins[5] = {rw_name(r, n->in[0]), nm.q, nm.s, bias, panels ? nm.u : ""};
    const int n_in = panels ? 5 : bias[0] ? 4 : 3;
    char pb[320];
    const char *final = g->values[(act ? act : n)->out[0]].name, *out = product_name(final, after, pb, sizeof pb);
    float s = 0.0f;
    int zero = 0;
    act_quant_params(range, qmax, &s, &zero, how, nh);
    size_t l = strlen(how);
    if (act && l < nh) snprintf(how + l, nh - l, ", + %s '%s' fused", act->op, act->name);
    else if (own && !after && l < nh) snprintf(how + l, nh - l, ", + its %s", own);
    fm_graph_attr a[5] = {fm_graph_attr_string("layout", panels ? "vnni16x4" : "rows"), fm_graph_attr_int("relu", relu ? 1 : 0),
                          fm_graph_attr_int(gelu && !strcmp(gname, "gelu") ? "gelu" : "gelu_tanh", 1), fm_graph_attr_float("a_scale", s),
                          fm_graph_attr_int("a_zero", zero)};
    if (!gelu) a[2] = a[3], a[3] = a[4]; /* no GELU attribute: the graph as earlier versions wrote it */
    fm_status st = add_node_to(r, n, out, "qlinear_int8", n_in, ins, (range ? 4 : 2) + (gelu ? 1 : 0), a);
    return st || !after ? st : act_node_after(r, n, after, out, final, how, nh);
}

/* An embedding in int8 modes: the table as the int8 panels and row scales that a tied
 * output layer's qlinear_int8 reads too (the same names, so the two share one copy);
 * weight-only, whatever the activations' mode. */
static fm_status quant_int8_table(rw *r, const gnode *n, int qmax, char *how, size_t nh) {
    const char *wn = r->src->values[n->in[0]].name;
    const int64_t D = r->src->values[n->in[0]].tensor->shape[1];
    int8_names nm;
    int8_names_of(wn, "", true, &nm);
    if (int8_weight(r, n, K_EMBEDDING, &nm, true, qmax)) return fm_last_status();
    snprintf(how, nh, "int8 table (per-row scales, the int8 panels%s)", qmax < 127 ? ", 7-bit codes" : "");
    const char *ins[3] = {nm.q, nm.s, rw_name(r, n->in[1])};
    fm_graph_attr a = fm_graph_attr_int("dim", D);
    return add_node(r, n, "qembedding_int8", 3, ins, 1, &a);
}

static fm_status quant_int4(rw *r, const gnode *n, qkind k, const fm_quant_options *o, char *how, size_t nh) {
    const fm_graph *g = r->src;
    const int wv = k == K_EMBEDDING ? n->in[0] : n->in[1];
    const fm_tensor *w0 = f32_const2(g, wv);
    const int64_t K = k == K_MATMUL ? w0->shape[0] : w0->shape[1];
    char lb[200];
    if (K % o->group)
        return fm_set_error(FM_ERR_INVALID, "quantize: %s: --group %d does not divide its %lld input features (%s); choose a group that does, "
                            "or keep this model in int8", g_node_label(n, lb, sizeof lb), o->group, (long long)K,
                            K % 32 ? "no int4 group (32, 64, 128) does" : K % 64 ? "32 does" : "32 and 64 do");
    char pn[300], sn[300], mn[300];
    const char *wn = g->values[wv].name, *t = k == K_MATMUL ? ".T" : "";
    snprintf(pn, sizeof pn, "%s%s.int4", wn, t);
    snprintf(sn, sizeof sn, "%s%s.int4_scale", wn, t);
    snprintf(mn, sizeof mn, "%s%s.int4_min", wn, t);
    if (g_find_value(r->dst, pn) < 0) {
        fm_tensor *w = weight_nk(g, n, k), *p = NULL, *s = NULL, *m = NULL;
        fm_status st = w ? fm_quantize_weight_int4(w, o->group, o->with_min, &p, &s, &m) : fm_last_status();
        if (st == FM_OK) st = add_consts(r, 3, (const char *[]){pn, sn, mn}, (fm_tensor *[]){p, s, m});
        fm_tensor_release_n(4, w, p, s, m);
        if (st) return st;
    }
    fm_graph_attr a = fm_graph_attr_int("group", o->group);
    snprintf(how, nh, "int4 g%d%s (weight-only, f32 activations)", o->group, o->with_min ? " with min" : " symmetric");
    if (k == K_EMBEDDING) {
        const char *ins[4] = {pn, sn, rw_name(r, n->in[1]), mn};
        return add_node(r, n, "qembedding_int4", o->with_min ? 4 : 3, ins, 1, &a);
    }
    const char *bias = k == K_LINEAR && n->n_in > 2 ? rw_name(r, n->in[2]) : "";
    const char *ins[5] = {rw_name(r, n->in[0]), pn, sn, o->with_min ? mn : "", bias};
    const char *own = fused_act(n); /* qlinear_int4 has no activation: a node after it */
    char pb[320];
    const char *final = g->values[n->out[0]].name, *out = product_name(final, own, pb, sizeof pb);
    if (add_node_to(r, n, out, "qlinear_int4", bias[0] ? 5 : o->with_min ? 4 : 3, ins, 1, &a)) return fm_last_status();
    return own ? act_node_after(r, n, own, out, final, how, nh) : FM_OK;
}

/* The next item of the comma-separated list at *p (moving *p past it) into item, or false at its end. */
static bool next_item(const char **p, char *item, size_t n) {
    if (!*p || !**p) return false;
    const char *e = strchr(*p, ',');
    snprintf(item, n, "%.*s", (int)(e ? (size_t)(e - *p) : strlen(*p)), *p);
    *p = e ? e + 1 : NULL;
    return true;
}

/* The --ops kind a candidate belongs to (its family's first op name). */
static const char *kind_name(qkind k) {
    return k == K_LINEAR ? "linear" : k == K_MATMUL ? "matmul" : k == K_CONV ? "conv2d" : k == K_EMBEDDING ? "embedding" : "";
}

/* A candidate the options leave fp32 (not among op_types, or named in exclude) becomes K_NONE, with why. */
static qkind filter_kind(const gnode *n, qkind k, const fm_quant_options *o, char *why, size_t nw) {
    if (k == K_NONE) return k;
    if (o->exclude && g_list_has(o->exclude, n->name)) { snprintf(why, nw, "fp32: excluded (--exclude)"); return K_NONE; }
    if (o->op_types && o->op_types[0] && !g_list_has(o->op_types, kind_name(k))) {
        snprintf(why, nw, "fp32: %s is not among --ops %s", kind_name(k), o->op_types);
        return K_NONE;
    }
    return k;
}

/* Every item of op_types is a kind, and every item of exclude a node of g: a typo must not quantize what it meant to keep. */
static fm_status check_lists(const fm_graph *g, const fm_quant_options *o) {
    char item[256];
    for (const char *p = o->op_types; next_item(&p, item, sizeof item);)
        if (!g_list_has("linear,matmul,conv2d,embedding", item))
            return fm_set_error(FM_ERR_INVALID, "quantize: --ops '%s': expected a comma-separated list of linear, matmul, conv2d, embedding", item);
    for (const char *p = o->exclude; next_item(&p, item, sizeof item);) {
        bool found = false;
        for (int i = 0; i < g->n_nodes && !found; i++) found = !strcmp(g->nodes[i].name, item);
        if (!found)
            return fm_set_error(FM_ERR_INVALID, "quantize: --exclude '%s': the graph has no node of that name (the report of a run "
                                "without --exclude lists the node names)", item);
    }
    return FM_OK;
}

static size_t const_bytes(const fm_graph *g) {
    size_t b = 0;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == GV_CONST) b += (size_t)fm_tensor_numel(g->values[v].tensor) * fm_dtype_size(g->values[v].tensor->dtype);
    return b;
}

static fm_status check_opts(const fm_graph *g, const fm_quant_options *o) {
    if (!g || !o) return fm_set_error(FM_ERR_INVALID, "quantize: NULL graph or options");
    if (fm_graph_device(g).type != FM_DEV_CPU) return fm_set_error(FM_ERR_INVALID, "quantize: the graph must be on the CPU (quantize before fm_graph_to_device)");
    if (o->mode == FM_QUANT_INT4 && o->group != 32 && o->group != 64 && o->group != 128)
        return fm_set_error(FM_ERR_INVALID, "quantize: --group %d must be 32, 64 or 128", o->group);
    if (o->mode == FM_QUANT_INT4 && o->reduce_range)
        return fm_set_error(FM_ERR_INVALID, "quantize: --reduce-range (7-bit int8 weights) applies to --int8, not to --int4");
    if (o->mode == FM_QUANT_INT8_STATIC && !o->calib) return fm_set_error(FM_ERR_INVALID, "quantize: static int8 needs calibration data");
    if (o->method == FM_CALIB_PERCENTILE && !(o->percentile > 50 && o->percentile <= 100))
        return fm_set_error(FM_ERR_INVALID, "quantize: percentile %g must be in (50, 100]", o->percentile);
    return check_lists(g, o);
}

/* Static mode: the ranges of every candidate's input, by node (NULL entries elsewhere). */
static fm_status static_ranges(const fm_graph *g, const fm_quant_options *o, const qkind *kinds, float *ranges) {
    int *vals = malloc(sizeof(int) * (size_t)(g->n_nodes + 1)), nv = 0;
    float *lo = malloc(sizeof(float) * (size_t)(g->n_nodes + 1)), *hi = malloc(sizeof(float) * (size_t)(g->n_nodes + 1));
    fm_status st = vals && lo && hi ? FM_OK : fm_set_error(FM_ERR_OOM, "quantize: out of host memory");
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++)
        if (kinds[i] != K_NONE) vals[nv++] = g->nodes[i].in[0];
    if (st == FM_OK) st = g_calibrate(g, o, nv, vals, lo, hi);
    for (int i = 0, j = 0; st == FM_OK && i < g->n_nodes; i++)
        if (kinds[i] != K_NONE) { ranges[2 * i] = lo[j]; ranges[2 * i + 1] = hi[j]; j++; }
    free(vals); free(lo); free(hi);
    return st;
}

fm_graph *fm_graph_quantize(const fm_graph *g, const fm_quant_options *o, fm_quant_report *rep) {
    if (rep) memset(rep, 0, sizeof *rep);
    if (check_opts(g, o)) return NULL;
    fm_quant_node *nodes = calloc((size_t)g->n_nodes + 1, sizeof *nodes);
    qkind *kinds = calloc((size_t)g->n_nodes + 1, sizeof *kinds);
    float *ranges = calloc(2 * (size_t)g->n_nodes + 2, sizeof *ranges);
    rw r;
    fm_status st = nodes && kinds && ranges ? FM_OK : fm_set_error(FM_ERR_OOM, "quantize: out of host memory");
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        snprintf(nodes[i].node, sizeof nodes[i].node, "%s", n->name);
        snprintf(nodes[i].op, sizeof nodes[i].op, "%s", n->op);
        kinds[i] = filter_kind(n, classify(g, n, o->mode, nodes[i].how, sizeof nodes[i].how), o, nodes[i].how, sizeof nodes[i].how);
    }
    if (st == FM_OK && o->mode == FM_QUANT_INT8_STATIC) st = static_ranges(g, o, kinds, ranges);
    bool begun = st == FM_OK && rw_begin(&r, g) == FM_OK;
    if (st == FM_OK && !begun) st = fm_last_status();
    const int qmax = o->reduce_range ? 63 : 127; /* int8 weight codes in [-qmax, qmax] */
    int nq = 0, *uses = st == FM_OK && o->mode != FM_QUANT_INT4 ? rw_use_counts(g) : NULL;
    if (st == FM_OK && o->mode != FM_QUANT_INT4 && !uses) st = fm_last_status();
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        if (kinds[i] == K_FUSED) continue;
        if (kinds[i] == K_NONE) { st = rw_copy_node(&r, n); continue; }
        if (o->mode != FM_QUANT_INT4 && kinds[i] == K_EMBEDDING) {
            st = quant_int8_table(&r, n, qmax, nodes[i].how, sizeof nodes[i].how);
            nodes[i].quantized = true;
            nq++;
            continue;
        }
        int j = -1;
        if (o->mode != FM_QUANT_INT4 && kinds[i] != K_CONV) { /* the panels' layout holds up to 32768 input features (quant_int8) */
            const int64_t K = g->values[n->in[1]].tensor->shape[kinds[i] == K_MATMUL ? 0 : 1];
            j = act_after(g, uses, i, K <= 32768);
        } else if (kinds[i] == K_CONV && !strcmp(n->op, "conv2d")) {
            j = act_after(g, uses, i, false); /* a relu */
        }
        if (j >= 0) {
            kinds[j] = K_FUSED;
            snprintf(nodes[j].how, sizeof nodes[j].how, "fused into '%s' (int8 epilogue)", n->name);
        }
        const float *range = o->mode == FM_QUANT_INT8_STATIC ? &ranges[2 * i] : NULL;
        if (kinds[i] == K_CONV) st = quant_conv(&r, n, range, qmax, j >= 0 ? &g->nodes[j] : NULL, nodes[i].how, sizeof nodes[i].how);
        else st = o->mode == FM_QUANT_INT4 ? quant_int4(&r, n, kinds[i], o, nodes[i].how, sizeof nodes[i].how)
                                      : quant_int8(&r, n, kinds[i], range, qmax, j >= 0 ? &g->nodes[j] : NULL, nodes[i].how, sizeof nodes[i].how);
        nodes[i].quantized = true;
        nq++;
    }
    free(uses);
    fm_graph *out = NULL;
    if (begun) {
        char keep[512];
        snprintf(keep, sizeof keep, "%s", st ? fm_last_error() : "");
        out = rw_end(&r, st);
        if (st) fm_set_error(st, "%s", keep); /* the first error, not the teardown's */
    }
    if (out && nq == 0) { /* nothing to do is an answer, not a silent copy */
        fm_graph_free(out);
        out = NULL;
        const bool filtered = (o->op_types && o->op_types[0]) || (o->exclude && o->exclude[0]);
        fm_set_error(FM_ERR_INVALID, "quantize: no node of this graph can be quantized in this mode (no linear/matmul%s with an f32 constant weight%s)",
                     o->mode == FM_QUANT_INT4 ? "/embedding" : "/embedding/convolution", filtered ? " left by --ops and --exclude" : "");
    }
    if (out && rep) {
        rep->n_nodes = g->n_nodes;
        rep->nodes = nodes;
        rep->n_quantized = nq;
        rep->bytes_before = const_bytes(g);
        rep->bytes_after = const_bytes(out);
        nodes = NULL;
    }
    if (out && o->mode != FM_QUANT_INT8_DYNAMIC && fm_graph_set_meta(out, "quantized", o->mode == FM_QUANT_INT4 ? "int4" : "int8-static")) {
        fm_graph_free(out);
        out = NULL;
    }
    if (out && o->mode == FM_QUANT_INT8_DYNAMIC && fm_graph_set_meta(out, "quantized", "int8-dynamic")) { fm_graph_free(out); out = NULL; }
    /* where the weights came from, for whoever reads the graph later: codes in [-63, 63] */
    if (out && o->reduce_range && fm_graph_set_meta(out, "int8_weights", "7-bit (reduce_range)")) { fm_graph_free(out); out = NULL; }
    free(nodes);
    free(kinds);
    free(ranges);
    return out;
}
