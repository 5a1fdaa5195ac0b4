/* ONNX nodes as graph ops (docs/GRAPH.md lists the graph's ops): one function per
 * ONNX op family, reading the node's attributes and, for shape and index inputs,
 * the folded values (onnx_graph.c). Shapes that follow a dynamic dim are written
 * with the graph's 0 (the input's size there) or -1 (inferred / kept). */
#include "onnx/onnx_internal.h"

#include "fathom/quant.h" /* fm_pack_weight_int8: QDQ MatMuls as int8 panels */

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ONNX_EXPR_RING 32 /* more than one node's dim expressions (a Slice's starts and ends) */
typedef struct {
    onnx_graph_ctx *x;
    const onnx_node *n;
    onnx_op_ctx c; /* attribute access; in[] are the probe-a values */
    fm_tensor *in[64];
    char expr[ONNX_EXPR_RING][160]; /* sym_for3's expressions, until the node is added */
    int n_expr;
} tctx;

static const char *vname(const tctx *t, int s) { return t->x->m->value_names[s]; }

/* The name of input k (a folded one becomes a graph constant first); "" if absent. */
static const char *in_name(tctx *t, int k) {
    int s = k < t->n->n_in ? t->n->in[k] : -1;
    if (s < 0) return "";
    if (t->x->folded[s] && onnx_graph_const(t->x, s)) return NULL;
    return vname(t, s);
}

static const char *out_name(const tctx *t, int k) { return t->n->out[k] >= 0 ? vname(t, t->n->out[k]) : ""; }

/* A fresh intermediate value name. */
static const char *tmp_name(tctx *t, char *buf, size_t n) {
    snprintf(buf, n, "%s/onnx_%d", out_name(t, 0), t->x->tmp++);
    return buf;
}

static fm_status node(tctx *t, const char *op, int n_in, const char *const *ins, const char *out, int na, const fm_graph_attr *a) {
    for (int i = 0; i < n_in; i++)
        if (!ins[i]) return fm_last_status();
    return fm_graph_add_node(t->x->g, op, NULL, n_in, ins, 1, &out, na, a);
}

static fm_status need_folded(tctx *t, int k, const char *what) {
    int s = k < t->n->n_in ? t->n->in[k] : -1;
    if (s >= 0 && !t->x->folded[s])
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s (input %d) must be a constant for the graph form", what, k);
    return FM_OK;
}

/* Whether dim d of value slot s has one size at all three import probes. */
static bool fixed_slot_dim(const tctx *t, int s, int d) {
    const fm_tensor *a = t->x->va[s], *b = t->x->vb[s], *c = t->x->vc ? t->x->vc[s] : NULL;
    return a->shape[d] == b->shape[d] && (!t->x->n_syms || (c && c->shape[d] == a->shape[d]));
}

/* Whether dim d of input k has one size at all three import probes. */
static bool fixed_dim(const tctx *t, int k, int d) { return fixed_slot_dim(t, t->n->in[k], d); }

/* Whether dim d of slots s and u has the same size at each of the three import probes. */
static bool same_dim_at_probes(const tctx *t, int s, int u, int d) {
    const onnx_graph_ctx *x = t->x;
    return x->va[s]->shape[d] == x->va[u]->shape[d] && x->vb[s]->shape[d] == x->vb[u]->shape[d] &&
           (!x->n_syms || (x->vc && x->vc[s] && x->vc[u] && x->vc[s]->shape[d] == x->vc[u]->shape[d]));
}

/* Every input folded left by the binary op into out (a n-1 node chain; one input: an
 * identity): Sum, Max, Min, and Mean's sum. */
static fm_status fold_inputs(tctx *t, const char *op, const char *out) {
    char b[2][300];
    const char *acc = in_name(t, 0);
    for (int k = 1; k < t->n->n_in; k++) {
        const char *o = k == t->n->n_in - 1 ? out : tmp_name(t, b[k % 2], sizeof b[0]);
        if (node(t, op, 2, (const char *[]){acc, in_name(t, k)}, o, 0, NULL)) return fm_last_status();
        acc = o;
    }
    return t->n->n_in > 1 ? FM_OK : node(t, "identity", 1, &acc, out, 0, NULL);
}

static fm_status only_first_output(tctx *t) {
    for (int k = 1; k < t->n->n_out; k++)
        if (t->n->out[k] >= 0 && t->x->m->last_use[t->n->out[k]] >= 0)
            return fm_set_error(FM_ERR_UNSUPPORTED, "output %d has no graph form (only the first output is)", k);
    return FM_OK;
}

static const struct { const char *onnx, *graph; } k_simple[] = {
    {"Abs", "abs"}, {"Neg", "neg"}, {"Exp", "exp"}, {"Log", "log"}, {"Sqrt", "sqrt"}, {"Sin", "sin"}, {"Cos", "cos"},
    {"Tanh", "tanh"}, {"Sigmoid", "sigmoid"}, {"Relu", "relu"}, {"Softplus", "softplus"}, {"Identity", "identity"},
    {"Dropout", "identity"}, {"Add", "add"}, {"Sub", "sub"}, {"Mul", "mul"}, {"Div", "div"}, {"Pow", "pow"},
    {"Equal", "eq"}, {"Less", "lt"}, {"LessOrEqual", "le"}, {"Greater", "gt"}, {"GreaterOrEqual", "ge"},
    {"Where", "where"}, {"Max", "maximum"}, {"Min", "minimum"}, {"MatMul", "matmul"},
    {"Tan", "tan"}, {"Asin", "asin"}, {"Acos", "acos"}, {"Atan", "atan"}, {"Sinh", "sinh"}, {"Cosh", "cosh"},
    {"Asinh", "asinh"}, {"Acosh", "acosh"}, {"Atanh", "atanh"}, {"Erf", "erf"}, {"Floor", "floor"},
    {"Ceil", "ceil"}, {"Round", "round"}, {"Sign", "sign"},
};

/* Integer Div and Pow, and Pow with an exponent of another dtype, as the interpreter runs
 * them (onnx_ops_math.c): a float base takes the exponent cast to its dtype; integers are
 * divided (truncating, as C and ONNX Runtime) or raised in f64 and cast back. */
static fm_status t_through_cast(tctx *t, const char *op) {
    const fm_dtype dt = t->in[0]->dtype, wide = fm_dtype_is_float(dt) ? dt : FM_F64;
    char b[3][300];
    const char *in[2] = {in_name(t, 0), in_name(t, 1)}, *w[2];
    for (int k = 0; k < 2; k++) {
        fm_graph_attr a = fm_graph_attr_string("dtype", fm_dtype_name(wide));
        w[k] = t->in[k]->dtype == wide ? in[k] : tmp_name(t, b[k], sizeof b[k]);
        if (w[k] != in[k] && node(t, "cast", 1, &in[k], w[k], 1, &a)) return fm_last_status();
    }
    if (wide == dt) return node(t, op, 2, w, out_name(t, 0), 0, NULL);
    const char *r = tmp_name(t, b[2], sizeof b[2]);
    fm_graph_attr a = fm_graph_attr_string("dtype", fm_dtype_name(dt));
    return node(t, op, 2, w, r, 0, NULL) || node(t, "cast", 1, &r, out_name(t, 0), 1, &a) ? fm_last_status() : FM_OK;
}

/* Before opset 7 B broadcast onto A only with broadcast=1, its dims aligned at A's `axis`
 * (default: the trailing dims): B reshaped with trailing 1s (its own dims kept by the
 * graph's 0) makes that numpy's rule, as the interpreter's legacy_b does. */
static const char *legacy_broadcast(tctx *t, char *buf, size_t nb) {
    const int na = t->in[0]->ndim, nbd = t->in[1]->ndim;
    int64_t axis = onnx_attr_int(&t->c, "axis", na - nbd), sh[FM_MAX_DIMS];
    if (axis < 0) axis += na;
    if (axis < 0 || axis + nbd > na) {
        fm_set_error(FM_ERR_INVALID, "broadcast axis %lld does not fit B's %d dimensions into A's %d", (long long)axis, nbd, na);
        return NULL;
    }
    const int n = na - (int)axis;
    if (n == nbd) return in_name(t, 1);
    for (int d = 0; d < n; d++) sh[d] = d < nbd ? 0 : 1;
    fm_graph_attr a = fm_graph_attr_ints("shape", n, sh);
    const char *b = in_name(t, 1), *y = tmp_name(t, buf, nb);
    return node(t, "reshape", 1, &b, y, 1, &a) ? NULL : y;
}

/* Dropout's mask at inference: true everywhere, as where(x != x, x != x, x == x) (a NaN
 * compares unequal to itself, so each element takes one of two true values). */
static fm_status dropout_mask(tctx *t) {
    char b[2][300];
    const char *x = in_name(t, 0), *ne = tmp_name(t, b[0], sizeof b[0]), *eq = tmp_name(t, b[1], sizeof b[1]);
    return node(t, "ne", 2, (const char *[]){x, x}, ne, 0, NULL) || node(t, "eq", 2, (const char *[]){x, x}, eq, 0, NULL) ||
                   node(t, "where", 3, (const char *[]){ne, ne, eq}, out_name(t, 1), 0, NULL)
               ? fm_last_status()
               : FM_OK;
}

static fm_status t_simple(tctx *t, const char *op) {
    const bool dropout = !strcmp(t->n->op->name, "Dropout");
    if (dropout && t->n->n_in > 2 && t->n->in[2] >= 0 && (!t->x->folded[t->n->in[2]] || fm_tensor_item(t->in[2]) != 0))
        return fm_set_error(FM_ERR_UNSUPPORTED, "a training_mode that is not a constant false has no graph form");
    if (dropout && t->n->n_out > 1 && t->n->out[1] >= 0 && t->x->m->last_use[t->n->out[1]] >= 0 && dropout_mask(t)) return fm_last_status();
    if (!dropout && only_first_output(t)) return fm_last_status();
    int n_in = !strcmp(op, "identity") ? 1 : t->n->n_in;
    if ((!strcmp(op, "maximum") || !strcmp(op, "minimum")) && n_in != 2) return fold_inputs(t, op, out_name(t, 0));
    if ((!strcmp(op, "div") && !fm_dtype_is_float(t->in[0]->dtype)) ||
        (!strcmp(op, "pow") && (t->in[0]->dtype != t->in[1]->dtype || !fm_dtype_is_float(t->in[0]->dtype))))
        return t_through_cast(t, op);
    const char *ins[3] = {in_name(t, 0), n_in > 1 ? in_name(t, 1) : "", n_in > 2 ? in_name(t, 2) : ""};
    char lb[300];
    if (n_in == 2 && t->c.opset < 7 && onnx_attr_int(&t->c, "broadcast", 0) && !(ins[1] = legacy_broadcast(t, lb, sizeof lb)))
        return fm_last_status();
    return node(t, op, n_in, ins, out_name(t, 0), 0, NULL);
}

/* A constant of dtype dt and shape (nd, sh) from the f64 values v (the graph's copy), named into buf. */
static const char *const_of(tctx *t, int nd, const int64_t *sh, const double *v, fm_dtype dt, char *buf, size_t n) {
    fm_tensor *h = fm_tensor_from_data(v, nd, sh, FM_F64), *c = h ? fm_to_dtype(h, dt) : NULL;
    const char *name = tmp_name(t, buf, n);
    fm_status st = c ? fm_graph_add_const(t->x->g, name, c) : fm_last_status();
    fm_tensor_release_n(2, h, c);
    return st ? NULL : name;
}

/* A 0-d constant of dtype dt holding v, named buf: a scalar operand for a
 * broadcasting binary node. */
static const char *scalar_const(tctx *t, double v, fm_dtype dt, char *buf, size_t n) { return const_of(t, 0, NULL, &v, dt, buf, n); }

/* out = index_select(in, axis) by the m constant indices src (an i64 constant of the graph's). */
static fm_status select_const(tctx *t, const char *in, int64_t axis, int64_t m, const double *src, const char *out) {
    char ib[300];
    const char *idx = const_of(t, 1, &m, src, FM_I64, ib, sizeof ib);
    fm_graph_attr a = fm_graph_attr_int("axis", axis);
    return idx ? node(t, "index_select", 2, (const char *[]){in, idx}, out, 1, &a) : fm_last_status();
}

/* HardSigmoid(x) = clamp(alpha * x + beta, 0, 1); HardSwish(x) = x * HardSigmoid(x)
 * with alpha 1/6, beta 1/2 (MobileNetV3): mul, add, clamp (and mul), which the
 * compiler's elementwise fusion runs as one kernel. */
static fm_status t_hard(tctx *t, bool swish) {
    const fm_dtype dt = t->in[0]->dtype;
    if (!fm_dtype_is_float(dt)) return fm_set_error(FM_ERR_UNSUPPORTED, "%s of %s has no graph form", t->n->op->name, fm_dtype_name(dt));
    const double alpha = swish ? 1.0 / 6.0 : onnx_attr_float(&t->c, "alpha", 0.2f), beta = swish ? 0.5 : onnx_attr_float(&t->c, "beta", 0.5f);
    char ca[256], cb[256], t1[256], t2[256], t3[256];
    const char *x = in_name(t, 0), *scaled = tmp_name(t, t1, sizeof t1), *shifted = tmp_name(t, t2, sizeof t2);
    const char *hs = swish ? tmp_name(t, t3, sizeof t3) : out_name(t, 0);
    const char *m[2] = {x, scalar_const(t, alpha, dt, ca, sizeof ca)}, *s[2] = {scaled, scalar_const(t, beta, dt, cb, sizeof cb)};
    fm_graph_attr a[2] = {fm_graph_attr_float("min", 0.0), fm_graph_attr_float("max", 1.0)};
    if (node(t, "mul", 2, m, scaled, 0, NULL) || node(t, "add", 2, s, shifted, 0, NULL) || node(t, "clamp", 1, &shifted, hs, 2, a))
        return fm_last_status();
    const char *p[2] = {x, hs};
    return swish ? node(t, "mul", 2, p, out_name(t, 0), 0, NULL) : FM_OK;
}

static fm_status t_activation(tctx *t) {
    const char *op = t->n->op->name, *x[1] = {in_name(t, 0)};
    fm_graph_attr a[2];
    if (!strcmp(op, "HardSigmoid") || !strcmp(op, "HardSwish")) return t_hard(t, op[4] == 'S' && op[5] == 'w');
    if (!strcmp(op, "LeakyRelu")) {
        a[0] = fm_graph_attr_float("negative_slope", onnx_attr_float(&t->c, "alpha", 0.01f));
        return node(t, "leaky_relu", 1, x, out_name(t, 0), 1, a);
    }
    if (!strcmp(op, "Gelu")) {
        char buf[16];
        const char *ap = onnx_attr_string(&t->c, "approximate", "none", buf, sizeof buf);
        return node(t, strcmp(ap, "tanh") ? "gelu" : "gelu_tanh", 1, x, out_name(t, 0), 0, NULL);
    }
    /* Clip */
    double lo = -INFINITY, hi = INFINITY;
    if (t->c.opset < 11) lo = onnx_attr_float(&t->c, "min", -INFINITY), hi = onnx_attr_float(&t->c, "max", INFINITY);
    else {
        const bool has[2] = {t->n->n_in > 1 && t->n->in[1] >= 0, t->n->n_in > 2 && t->n->in[2] >= 0};
        if ((has[0] && !t->x->folded[t->n->in[1]]) || (has[1] && !t->x->folded[t->n->in[2]])) { /* bounds that are data */
            char b[300];
            const char *cur = x[0];
            for (int k = 0; k < 2; k++) {
                if (!has[k]) continue;
                const char *o = k == 1 || !has[1] ? out_name(t, 0) : tmp_name(t, b, sizeof b);
                if (node(t, k ? "minimum" : "maximum", 2, (const char *[]){cur, in_name(t, k + 1)}, o, 0, NULL)) return fm_last_status();
                cur = o;
            }
            return FM_OK; /* min above max gives max everywhere, as ONNX's Clip */
        }
        if (t->n->n_in > 1 && t->in[1]) lo = fm_tensor_item(t->in[1]);
        if (t->n->n_in > 2 && t->in[2]) hi = fm_tensor_item(t->in[2]);
    }
    a[0] = fm_graph_attr_float("min", lo), a[1] = fm_graph_attr_float("max", hi);
    return node(t, "clamp", 1, x, out_name(t, 0), 2, a);
}

/* Gemm with transA, alpha or beta: permutes of the transposed operands, matmul, alpha times
 * the product, plus beta times C (beta 0: no C). */
static fm_status t_gemm_general(tctx *t, bool ta, bool tb, double alpha, double beta) {
    const fm_dtype dt = t->in[0]->dtype;
    if (!fm_dtype_is_float(dt)) return fm_set_error(FM_ERR_UNSUPPORTED, "Gemm of %s with transA, alpha or beta has no graph form", fm_dtype_name(dt));
    char b[7][300];
    const char *op[2] = {in_name(t, 0), in_name(t, 1)};
    const int64_t sw[2] = {1, 0};
    fm_graph_attr pa = fm_graph_attr_ints("perm", 2, sw);
    for (int k = 0; k < 2; k++) {
        if (!(k ? tb : ta)) continue;
        const char *p = tmp_name(t, b[k], sizeof b[k]);
        if (node(t, "permute", 1, &op[k], p, 1, &pa)) return fm_last_status();
        op[k] = p;
    }
    const char *prod = alpha != 1.0 || beta != 0.0 ? tmp_name(t, b[2], sizeof b[2]) : out_name(t, 0);
    if (node(t, "matmul", 2, op, prod, 0, NULL)) return fm_last_status();
    if (alpha != 1.0) {
        const char *al = scalar_const(t, alpha, dt, b[3], sizeof b[3]), *sc = beta != 0.0 ? tmp_name(t, b[4], sizeof b[4]) : out_name(t, 0);
        if (!al || node(t, "mul", 2, (const char *[]){prod, al}, sc, 0, NULL)) return fm_last_status();
        prod = sc;
    }
    if (beta == 0.0) return FM_OK;
    const char *c = in_name(t, 2);
    if (beta != 1.0) {
        const char *be = scalar_const(t, beta, dt, b[5], sizeof b[5]), *cs = tmp_name(t, b[6], sizeof b[6]);
        if (!be || node(t, "mul", 2, (const char *[]){c, be}, cs, 0, NULL)) return fm_last_status();
        c = cs;
    }
    return node(t, "add", 2, (const char *[]){prod, c}, out_name(t, 0), 0, NULL);
}

static int gemm_qdq(tctx *t, int me);

static fm_status t_gemm(tctx *t, int me) {
    const int q = gemm_qdq(t, me);
    if (q >= 0) return (fm_status)q;
    double alpha = onnx_attr_float(&t->c, "alpha", 1.0f), beta = onnx_attr_float(&t->c, "beta", 1.0f);
    bool ta = onnx_attr_int(&t->c, "transA", 0), tb = onnx_attr_int(&t->c, "transB", 0);
    bool bias = t->n->n_in > 2 && t->n->in[2] >= 0 && beta != 0;
    char t1[256];
    const char *out = out_name(t, 0);
    if (ta || alpha != 1.0 || (bias && beta != 1.0)) return t_gemm_general(t, ta, tb, alpha, bias ? beta : 0.0);
    if (tb) { /* B [N, K]: the linear layer's layout */
        const char *ins[3] = {in_name(t, 0), in_name(t, 1), bias ? in_name(t, 2) : ""};
        if (bias && t->in[2]->ndim != 1) return t_gemm_general(t, false, true, 1.0, 1.0); /* a 2-D C: matmul and add */
        return node(t, "linear", bias ? 3 : 2, ins, out, 0, NULL);
    }
    const char *mm_out = bias ? tmp_name(t, t1, sizeof t1) : out, *ins[2] = {in_name(t, 0), in_name(t, 1)};
    if (node(t, "matmul", 2, ins, mm_out, 0, NULL)) return fm_last_status();
    if (!bias) return FM_OK;
    const char *ins2[2] = {mm_out, in_name(t, 2)};
    return node(t, "add", 2, ins2, out, 0, NULL);
}

static fm_status t_softmax(tctx *t) {
    int64_t axis = onnx_attr_int(&t->c, "axis", t->c.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += t->in[0]->ndim;
    if (t->c.opset < 13 && axis != t->in[0]->ndim - 1)
        return fm_set_error(FM_ERR_UNSUPPORTED, "Softmax before opset 13 over more than the last axis has no graph form");
    fm_graph_attr a = fm_graph_attr_int("axis", axis);
    const char *x[1] = {in_name(t, 0)}, *op = strcmp(t->n->op->name, "Softmax") ? "log_softmax" : "softmax";
    if (t->in[0]->dtype != FM_F16) return node(t, op, 1, x, out_name(t, 0), 1, &a);
    /* float16 as the interpreter does it: in float32, rounded back (the CPU has no f16 softmax) */
    char b1[160], b2[160];
    const char *up = tmp_name(t, b1, sizeof b1), *y = tmp_name(t, b2, sizeof b2);
    fm_graph_attr f32 = fm_graph_attr_string("dtype", "f32"), f16 = fm_graph_attr_string("dtype", "f16");
    if (node(t, "cast", 1, x, up, 1, &f32) || node(t, op, 1, &up, y, 1, &a)) return fm_last_status();
    return node(t, "cast", 1, &y, out_name(t, 0), 1, &f16);
}

/* Whether output k of the node is read (or a graph output). */
static bool output_used(const tctx *t, int k) { return k < t->n->n_out && t->n->out[k] >= 0 && t->x->m->last_use[t->n->out[k]] >= 0; }

/* LayerNormalization's Mean and InvStdDev outputs (f32/f64 input), when read: the mean over
 * the normalized dims (kept), and 1 / sqrt(mean((x - mean)^2) + eps). */
static fm_status layer_norm_stats(tctx *t, int64_t axis, double eps) {
    const fm_dtype dt = t->in[0]->dtype;
    if (!output_used(t, 1) && !output_used(t, 2)) return FM_OK;
    if (dt != FM_F32 && dt != FM_F64) return fm_set_error(FM_ERR_UNSUPPORTED, "LayerNormalization's Mean and InvStdDev of %s have no graph form", fm_dtype_name(dt));
    int64_t ax[FM_MAX_DIMS];
    int n = 0;
    for (int64_t d = axis; d < t->in[0]->ndim; d++) ax[n++] = d;
    fm_graph_attr a[2] = {fm_graph_attr_ints("axes", n, ax), fm_graph_attr_int("keepdim", 1)};
    char b[8][300];
    const char *x = in_name(t, 0), *mean = output_used(t, 1) ? out_name(t, 1) : tmp_name(t, b[0], sizeof b[0]);
    if (node(t, "mean", 1, &x, mean, 2, a) || !output_used(t, 2)) return fm_last_status();
    const char *d = tmp_name(t, b[1], sizeof b[1]), *sq = tmp_name(t, b[2], sizeof b[2]), *var = tmp_name(t, b[3], sizeof b[3]);
    const char *e = scalar_const(t, eps, dt, b[4], sizeof b[4]), *ve = tmp_name(t, b[5], sizeof b[5]), *sd = tmp_name(t, b[6], sizeof b[6]);
    const char *one = scalar_const(t, 1.0, dt, b[7], sizeof b[7]);
    if (!e || !one || node(t, "sub", 2, (const char *[]){x, mean}, d, 0, NULL) || node(t, "mul", 2, (const char *[]){d, d}, sq, 0, NULL) ||
        node(t, "mean", 1, &sq, var, 2, a) || node(t, "add", 2, (const char *[]){var, e}, ve, 0, NULL) || node(t, "sqrt", 1, &ve, sd, 0, NULL))
        return fm_last_status();
    return node(t, "div", 2, (const char *[]){one, sd}, out_name(t, 2), 0, NULL);
}

static fm_status t_norm(tctx *t) {
    if (strcmp(t->n->op->name, "LayerNormalization") && only_first_output(t)) return fm_last_status();
    double eps = onnx_attr_float(&t->c, "epsilon", 1e-5f);
    fm_graph_attr a[2] = {fm_graph_attr_float("eps", eps)};
    if (!strcmp(t->n->op->name, "BatchNormalization")) {
        if (onnx_attr_int(&t->c, "training_mode", 0)) return fm_set_error(FM_ERR_UNSUPPORTED, "training mode has no graph form");
        const char *ins[5] = {in_name(t, 0), in_name(t, 1), in_name(t, 2), in_name(t, 3), in_name(t, 4)};
        return node(t, "batch_norm", 5, ins, out_name(t, 0), 1, a);
    }
    if (!strcmp(t->n->op->name, "InstanceNormalization")) { /* a layer norm over the spatial dims, then scale and bias per channel */
        const int nd = t->in[0]->ndim;
        if (nd < 3) return fm_set_error(FM_ERR_INVALID, "InstanceNormalization needs [N, C, D1, ...]");
        int64_t sh[FM_MAX_DIMS] = {t->in[0]->shape[1]};
        for (int d = 1; d < nd - 1; d++) sh[d] = 1;
        char b[4][300];
        const char *x = in_name(t, 0), *n = tmp_name(t, b[0], sizeof b[0]), *s = tmp_name(t, b[1], sizeof b[1]);
        const char *bb = tmp_name(t, b[2], sizeof b[2]), *m = tmp_name(t, b[3], sizeof b[3]), *sv = in_name(t, 1), *bv = in_name(t, 2);
        fm_graph_attr r = fm_graph_attr_ints("shape", nd - 1, sh);
        a[1] = fm_graph_attr_int("n_norm_dims", nd - 2);
        if (node(t, "layer_norm", 1, &x, n, 2, a) || node(t, "reshape", 1, &sv, s, 1, &r) || node(t, "reshape", 1, &bv, bb, 1, &r) ||
            node(t, "mul", 2, (const char *[]){n, s}, m, 0, NULL))
            return fm_last_status();
        return node(t, "add", 2, (const char *[]){m, bb}, out_name(t, 0), 0, NULL);
    }
    int64_t axis = onnx_attr_int(&t->c, "axis", -1);
    if (axis < 0) axis += t->in[0]->ndim;
    int nn = t->in[0]->ndim - (int)axis;
    for (int k = 1; k < 3 && k < t->n->n_in; k++)
        if (t->in[k] && t->in[k]->ndim != nn)
            return fm_set_error(FM_ERR_UNSUPPORTED, "LayerNormalization scale/bias must have the normalized shape for the graph form");
    a[1] = fm_graph_attr_int("n_norm_dims", nn);
    const char *ins[3] = {in_name(t, 0), in_name(t, 1), t->n->n_in > 2 ? in_name(t, 2) : ""};
    return node(t, "layer_norm", 3, ins, out_name(t, 0), 2, a) ? fm_last_status() : layer_norm_stats(t, axis, eps);
}

/* Conv and pools over 1 or 2 spatial dims, as 2-D windows (1-D: the second dim, the
 * first of size 1); auto_pad from the probe shapes. p: the pads both sides share,
 * more[4]: what one side has beyond them (begin h, w, end h, w: uneven pads, as
 * TensorFlow's SAME padding at stride 2 gives), which a pad node before the window adds. */
static fm_status window2d(tctx *t, const int64_t *kshape, int64_t k[2], int64_t s[2], int64_t d[2], int64_t p[2], int64_t more[4]) {
    const int nsp = t->in[0]->ndim - 2;
    if (nsp != 1 && nsp != 2) return fm_set_error(FM_ERR_UNSUPPORTED, "only 1 or 2 spatial dims have a graph form (this input has %d)", nsp);
    onnx_window w;
    if (onnx_window_of(&t->c, t->in[0], kshape, &w)) return fm_last_status();
    k[0] = s[0] = d[0] = 1, p[0] = more[0] = more[2] = 0; /* 1-D: the first dim stays as it is */
    for (int i = 0; i < nsp; i++) {
        const int j = i + 2 - nsp;
        k[j] = w.k[i], s[j] = w.s[i], d[j] = w.d[i];
        p[j] = w.pb[i] < w.pe[i] ? w.pb[i] : w.pe[i];
        more[j] = w.pb[i] - p[j], more[2 + j] = w.pe[i] - p[j];
    }
    return FM_OK;
}

/* A 1-D window's operand as 2-D: [N, C, L] -> [N, C, 1, L] (a conv's weight [O, C/g, k]
 * -> [O, C/g, 1, k] alike) into buf's name; a 2-D one as it is. */
static const char *as_2d(tctx *t, const char *x, char *buf, size_t nb) {
    if (!x || t->in[0]->ndim != 3) return x;
    const int64_t sh[4] = {0, 0, 1, -1};
    fm_graph_attr a = fm_graph_attr_ints("shape", 4, sh);
    const char *y = tmp_name(t, buf, nb);
    return node(t, "reshape", 1, &x, y, 1, &a) ? NULL : y;
}

/* The name the 2-D window writes: the node's output, or (1-D) a temporary that back_1d
 * then reshapes to [N, C, L'] into the output. */
static const char *window_out(tctx *t, char *buf, size_t nb) { return t->in[0]->ndim == 3 ? tmp_name(t, buf, nb) : out_name(t, 0); }

static fm_status back_1d(tctx *t, const char *y) {
    if (t->in[0]->ndim != 3) return FM_OK;
    const int64_t sh[3] = {0, 0, -1};
    fm_graph_attr a = fm_graph_attr_ints("shape", 3, sh);
    return node(t, "reshape", 1, &y, out_name(t, 0), 1, &a);
}

/* The window's input: x2 (the input as 2-D) itself, or x2 with the uneven part of its pads (more) added by a
 * pad node filled with `fill` (0 for a conv, -inf for a max pool) into buf's name. */
static const char *window_input(tctx *t, const char *x2, const int64_t more[4], double fill, char *buf, size_t nb) {
    if (!more[0] && !more[1] && !more[2] && !more[3]) return x2;
    const int64_t pads[8] = {0, 0, more[0], more[1], 0, 0, more[2], more[3]};
    const char *x[1] = {x2}, *y = tmp_name(t, buf, nb);
    fm_graph_attr a[2] = {fm_graph_attr_ints("pads", 8, pads), fm_graph_attr_float("value", fill)};
    return node(t, "pad", 1, x, y, fill != 0 ? 2 : 1, a) ? NULL : y;
}

/* A slice along one axis into a fresh name in buf: [start, end) by step. */
static const char *slice_into(tctx *t, const char *x, int64_t axis, int64_t start, int64_t end, int64_t step, char *buf, size_t nb) {
    fm_graph_attr a[4] = {fm_graph_attr_int("axis", axis), fm_graph_attr_ints("start", 1, &start), fm_graph_attr_ints("end", 1, &end),
                          fm_graph_attr_int("step", step)};
    const char *y = tmp_name(t, buf, nb);
    return node(t, "slice", 1, &x, y, 4, a) ? NULL : y;
}

/* A node of op with one input and one ints attribute into a fresh name in buf. */
static const char *with_ints(tctx *t, const char *op, const char *x, const char *attr, int n, const int64_t *v, char *buf, size_t nb) {
    fm_graph_attr a = fm_graph_attr_ints(attr, n, v);
    const char *y = tmp_name(t, buf, nb);
    return x && !node(t, op, 1, &x, y, 1, &a) ? y : NULL;
}

/* The 3-D geometry of a Conv or pool on fixed D, H and W: kernel, strides, dilations and the
 * begin/end pads (auto_pad resolved), in k, s, d, pb, pe; out the output's D, H, W. */
static fm_status window3d_geom(tctx *t, bool conv, int64_t k[3], int64_t s[3], int64_t d[3], int64_t pb[3], int64_t pe[3], int64_t out[3]) {
    for (int i = 2; i < 5; i++)
        if (!fixed_dim(t, 0, i)) return fm_set_error(FM_ERR_UNSUPPORTED, "3-D windows have a graph form on fixed depth, height and width only");
    onnx_window w;
    if (onnx_window_of(&t->c, t->in[0], conv ? t->in[1]->shape + 2 : NULL, &w)) return fm_last_status();
    for (int i = 0; i < 3; i++) {
        const int64_t in = t->in[0]->shape[2 + i];
        k[i] = w.k[i], s[i] = w.s[i], d[i] = w.d[i], pb[i] = w.pb[i], pe[i] = w.pe[i];
        const int64_t span = (k[i] - 1) * d[i] + 1, full = in + pb[i] + pe[i];
        if (full < span)
            return fm_set_error(FM_ERR_UNSUPPORTED, "a 3-D window with kernel %lld, stride %lld, dilation %lld and pads %lld, %lld on %lld has no graph form",
                                (long long)k[i], (long long)s[i], (long long)d[i], (long long)pb[i], (long long)pe[i], (long long)in);
        out[i] = (full - span) / s[i] + 1;
    }
    return FM_OK;
}

/* Conv, MaxPool and AveragePool over 3 spatial dims on fixed D, H and W, as 2-D windows on
 * frames folded into the batch ([N, C, D, H, W] -> [N D, C, H, W]), after a pad node for
 * all the pads: a conv sums one 2-D conv per kernel depth offset (the frames that offset
 * reads, strided), as the interpreter does; a pool runs the 2-D pool on every frame, then
 * takes the max (or the mean) of the kernel's depth offsets, each a strided slice. */
static fm_status t_window3d(tctx *t, bool conv, bool is_max) {
    int64_t k[3], s[3], d[3], pb[3], pe[3], o[3];
    if (window3d_geom(t, conv, k, s, d, pb, pe, o)) return fm_last_status();
    if (!conv && (d[0] != 1 || d[1] != 1 || d[2] != 1 || onnx_attr_int(&t->c, "ceil_mode", 0)))
        return fm_set_error(FM_ERR_UNSUPPORTED, "a 3-D pool with dilation or ceil_mode has no graph form");
    const bool padded = pb[0] || pb[1] || pb[2] || pe[0] || pe[1] || pe[2];
    if (!conv && !is_max && padded && !onnx_attr_int(&t->c, "count_include_pad", 0))
        return fm_set_error(FM_ERR_UNSUPPORTED, "a padded 3-D average pool that leaves the pads out of its count has no graph form");
    const int64_t C = t->in[0]->shape[1], Dp = t->in[0]->shape[2] + pb[0] + pe[0], Hp = t->in[0]->shape[3] + pb[1] + pe[1];
    const int64_t Wp = t->in[0]->shape[4] + pb[2] + pe[2], M = conv ? t->in[1]->shape[0] : C, to_frames[5] = {0, 2, 1, 3, 4};
    char b[12][300];
    const char *x = in_name(t, 0);
    if (padded) {
        const int64_t pads[10] = {0, 0, pb[0], pb[1], pb[2], 0, 0, pe[0], pe[1], pe[2]};
        fm_graph_attr pa[2] = {fm_graph_attr_ints("pads", 10, pads), fm_graph_attr_float("value", is_max ? -INFINITY : 0.0)};
        const char *xp = tmp_name(t, b[0], sizeof b[0]);
        if (node(t, "pad", 1, &x, xp, is_max ? 2 : 1, pa)) return fm_last_status();
        x = xp;
    }
    const int64_t fr[4] = {-1, C, Hp, Wp}, s2[2] = {s[1], s[2]}, d2[2] = {d[1], d[2]}, z2[2] = {0, 0}, k2[2] = {k[1], k[2]};
    fm_graph_attr w2[4] = {fm_graph_attr_ints("stride", 2, s2), fm_graph_attr_ints("padding", 2, z2), fm_graph_attr_ints("dilation", 2, d2),
                           fm_graph_attr_int("groups", onnx_attr_int(&t->c, "group", 1))};
    const char *acc = NULL;
    if (conv) {
        const int64_t wsh[4] = {M, t->in[1]->shape[1], k[1], k[2]};
        for (int64_t kz = 0; kz < k[0]; kz++) {
            const char *xs = slice_into(t, x, 2, kz * d[0], kz * d[0] + (o[0] - 1) * s[0] + 1, s[0], b[1], sizeof b[1]);
            const char *xr = with_ints(t, "reshape", with_ints(t, "permute", xs, "perm", 5, to_frames, b[2], sizeof b[2]), "shape", 4, fr, b[3], sizeof b[3]);
            const char *wk = with_ints(t, "reshape", slice_into(t, in_name(t, 1), 2, kz, kz + 1, 1, b[4], sizeof b[4]), "shape", 4, wsh, b[5], sizeof b[5]);
            const char *y = tmp_name(t, b[6 + kz % 2], sizeof b[6]), *sum = tmp_name(t, b[8 + kz % 2], sizeof b[8]);
            if (!xs || !xr || !wk || node(t, "conv2d", 2, (const char *[]){xr, wk}, y, 4, w2) ||
                (acc && node(t, "add", 2, (const char *[]){acc, y}, sum, 0, NULL)))
                return fm_last_status();
            acc = acc ? sum : y;
        }
    } else {
        const char *xr = with_ints(t, "reshape", with_ints(t, "permute", x, "perm", 5, to_frames, b[1], sizeof b[1]), "shape", 4, fr, b[2], sizeof b[2]);
        fm_graph_attr pa[3] = {fm_graph_attr_ints("kernel", 2, k2), fm_graph_attr_ints("stride", 2, s2), fm_graph_attr_ints("padding", 2, z2)};
        const char *pooled = tmp_name(t, b[3], sizeof b[3]);
        if (!xr || node(t, is_max ? "max_pool2d" : "avg_pool2d", 1, &xr, pooled, 3, pa)) return fm_last_status();
        const int64_t back[5] = {-1, Dp, C, o[1], o[2]};
        const char *fr5 = with_ints(t, "reshape", pooled, "shape", 5, back, b[4], sizeof b[4]);
        for (int64_t kz = 0; fr5 && kz < k[0]; kz++) {
            const char *xs = slice_into(t, fr5, 1, kz, kz + (o[0] - 1) * s[0] + 1, s[0], b[5 + kz % 2], sizeof b[5]);
            const char *sum = tmp_name(t, b[7 + kz % 2], sizeof b[7]);
            if (!xs || (acc && node(t, is_max ? "maximum" : "add", 2, (const char *[]){acc, xs}, sum, 0, NULL))) return fm_last_status();
            acc = acc ? sum : xs;
        }
        if (!fr5) return fm_last_status();
        if (!is_max) {
            const char *inv = scalar_const(t, 1.0 / (double)k[0], t->in[0]->dtype, b[9], sizeof b[9]), *m = tmp_name(t, b[10], sizeof b[10]);
            if (!inv || node(t, "mul", 2, (const char *[]){acc, inv}, m, 0, NULL)) return fm_last_status();
            acc = m;
        }
        const int64_t back_perm[5] = {0, 2, 1, 3, 4};
        fm_graph_attr pp = fm_graph_attr_ints("perm", 5, back_perm);
        return node(t, "permute", 1, &acc, out_name(t, 0), 1, &pp);
    }
    /* the conv's sum [N Do, M, Ho, Wo] -> [N, M, Do, Ho, Wo], then the bias per channel */
    const int64_t five[5] = {-1, o[0], M, o[1], o[2]};
    const bool bias = t->n->n_in > 2 && t->n->in[2] >= 0;
    const char *y5 = with_ints(t, "reshape", acc, "shape", 5, five, b[1], sizeof b[1]);
    fm_graph_attr pp = fm_graph_attr_ints("perm", 5, to_frames);
    const char *yp = bias ? tmp_name(t, b[2], sizeof b[2]) : out_name(t, 0);
    if (!y5 || node(t, "permute", 1, &y5, yp, 1, &pp) || !bias) return fm_last_status();
    const int64_t bs[4] = {M, 1, 1, 1};
    const char *br = with_ints(t, "reshape", in_name(t, 2), "shape", 4, bs, b[3], sizeof b[3]);
    return br ? node(t, "add", 2, (const char *[]){yp, br}, out_name(t, 0), 0, NULL) : fm_last_status();
}

/* A 2-D pool that max_pool2d / avg_pool2d do not take (dilation, or pads over half the
 * kernel): the input padded by p (-inf for max, 0 for an average), one strided slice of it
 * per kernel tap, and their maximum or sum; an average is divided by the taps counted (all
 * of them with count_include_pad, else those inside the input: a constant per output
 * position). xin holds x2 with the uneven pads (more) added; static spatial dims, no ceil_mode. */
static fm_status t_pool_taps(tctx *t, const char *xin, const int64_t k[2], const int64_t s[2], const int64_t d[2], const int64_t p[2],
                             const int64_t more[4], bool is_max, const char *y2) {
    const int one = t->in[0]->ndim == 3;
    if (onnx_attr_int(&t->c, "ceil_mode", 0)) return fm_set_error(FM_ERR_UNSUPPORTED, "a dilated pool, or one with pads over half the kernel, with ceil_mode has no graph form");
    for (int i = 2; i < t->in[0]->ndim; i++)
        if (!fixed_dim(t, 0, i)) return fm_set_error(FM_ERR_UNSUPPORTED, "a dilated pool, or one with pads over half the kernel, has a graph form on static spatial dims only");
    const int64_t hw[2] = {one ? 1 : t->in[0]->shape[2], t->in[0]->shape[3 - one]};
    int64_t o[2];
    for (int q = 0; q < 2; q++) {
        o[q] = (hw[q] + more[q] + more[2 + q] + 2 * p[q] - d[q] * (k[q] - 1) - 1) / s[q] + 1;
        if (o[q] < 1) return fm_set_error(FM_ERR_INVALID, "the pool's window is larger than its padded input");
    }
    char b[8][300];
    const char *x = xin;
    if (p[0] || p[1]) {
        const int64_t pads[8] = {0, 0, p[0], p[1], 0, 0, p[0], p[1]};
        fm_graph_attr a[2] = {fm_graph_attr_ints("pads", 8, pads), fm_graph_attr_float("value", is_max ? -INFINITY : 0.0)};
        if (node(t, "pad", 1, &xin, x = tmp_name(t, b[0], sizeof b[0]), is_max ? 2 : 1, a)) return fm_last_status();
    }
    const bool count_all = is_max || onnx_attr_int(&t->c, "count_include_pad", 0);
    const char *acc = NULL;
    for (int64_t i = 0; i < k[0]; i++)
        for (int64_t j = 0; j < k[1]; j++) {
            const int64_t tap = i * k[1] + j, last = tap == k[0] * k[1] - 1;
            const char *rows = slice_into(t, x, 2, i * d[0], i * d[0] + (o[0] - 1) * s[0] + 1, s[0], b[1], sizeof b[1]);
            const char *cell = rows ? slice_into(t, rows, 3, j * d[1], j * d[1] + (o[1] - 1) * s[1] + 1, s[1], b[2 + tap % 2], sizeof b[2]) : NULL;
            if (!cell) return fm_last_status();
            if (!acc) { acc = cell; continue; }
            const char *r = last && is_max ? y2 : tmp_name(t, b[4 + tap % 2], sizeof b[4]);
            if (node(t, is_max ? "maximum" : "add", 2, (const char *[]){acc, cell}, r, 0, NULL)) return fm_last_status();
            acc = r;
        }
    if (is_max && acc != y2 && node(t, "identity", 1, &acc, y2, 0, NULL)) return fm_last_status(); /* a 1x1 window */
    if (is_max) return back_1d(t, y2);
    double *div = malloc(sizeof(double) * (size_t)(o[0] * o[1]));
    if (!div) return fm_set_error(FM_ERR_OOM, "AveragePool: out of host memory");
    for (int64_t i = 0; i < o[0]; i++)
        for (int64_t j = 0; j < o[1]; j++) {
            int64_t cells = 1, at[2] = {i, j};
            for (int q = 0; q < 2 && !count_all; q++) {
                int64_t in = 0;
                for (int64_t kk = 0; kk < k[q]; kk++) {
                    const int64_t pos = at[q] * s[q] - p[q] - more[q] + kk * d[q];
                    in += pos >= 0 && pos < hw[q];
                }
                cells *= in;
            }
            div[i * o[1] + j] = count_all ? 1.0 / (double)(k[0] * k[1]) : cells > 0 ? 1.0 / (double)cells : 0;
        }
    const char *c = const_of(t, 2, o, div, t->in[0]->dtype, b[6], sizeof b[6]);
    free(div);
    return c && !node(t, "mul", 2, (const char *[]){acc, c}, y2, 0, NULL) ? back_1d(t, y2) : fm_last_status();
}

static int conv_qdq(tctx *t, const int64_t *k, const int64_t *s, const int64_t *d, const int64_t *p);

static fm_status t_conv_pool(tctx *t) {
    const char *op = t->n->op->name;
    bool conv = !strcmp(op, "Conv"), is_max = !strcmp(op, "MaxPool");
    int64_t k[2], s[2], d[2], p[2], more[4];
    char buf[300];
    if (t->in[0]->ndim == 5) return only_first_output(t) ? fm_last_status() : t_window3d(t, conv, is_max);
    if (only_first_output(t) || window2d(t, conv ? t->in[1]->shape + 2 : NULL, k, s, d, p, more)) return fm_last_status();
    const bool uneven = more[0] || more[1] || more[2] || more[3];
    /* an average that leaves uneven pads out of its count (TensorFlow's SAME): the pool counting
     * them, times k kh / (the window's cells inside the input), a constant per output position */
    const bool exclude = uneven && !conv && !is_max && !onnx_attr_int(&t->c, "count_include_pad", 0);
    /* static: the same at every probe (two sizes can agree by chance after a stride: 5 and 7
     * both pool to 2 after a stride-2 conv and a stride-2 pool; the third probe's 9 gives 3) */
    for (int i = 2; exclude && i < t->in[0]->ndim; i++)
        if (onnx_attr_int(&t->c, "ceil_mode", 0) || !fixed_dim(t, 0, i))
            return fm_set_error(FM_ERR_UNSUPPORTED, "an average pool with uneven pads left out of its count has a graph form on static "
                                "spatial dims without ceil_mode only");
    if (conv && t->in[0]->ndim == 4 && !uneven) {
        const int q = conv_qdq(t, k, s, d, p);
        if (q >= 0) return (fm_status)q;
    }
    char b2[300], b3[300], b4[300];
    const char *x2 = as_2d(t, in_name(t, 0), b2, sizeof b2), *xin = x2 ? window_input(t, x2, more, is_max ? -INFINITY : 0.0, buf, sizeof buf) : NULL;
    if (!xin) return fm_last_status();
    const char *y2 = window_out(t, b3, sizeof b3);
    fm_graph_attr a[5] = {fm_graph_attr_ints("stride", 2, s), fm_graph_attr_ints("padding", 2, p)};
    if (conv) {
        a[2] = fm_graph_attr_ints("dilation", 2, d), a[3] = fm_graph_attr_int("groups", onnx_attr_int(&t->c, "group", 1));
        const char *ins[3] = {xin, as_2d(t, in_name(t, 1), b4, sizeof b4), t->n->n_in > 2 ? in_name(t, 2) : ""};
        return node(t, "conv2d", 3, ins, y2, 4, a) ? fm_last_status() : back_1d(t, y2);
    }
    if (d[0] != 1 || d[1] != 1 || 2 * p[0] > k[0] || 2 * p[1] > k[1]) return t_pool_taps(t, xin, k, s, d, p, more, is_max, y2);
    const int64_t ceil_mode = onnx_attr_int(&t->c, "ceil_mode", 0) != 0;
    a[2] = fm_graph_attr_ints("kernel", 2, k);
    int na = 3;
    if (!is_max) a[na++] = fm_graph_attr_int("count_include_pad", exclude ? 1 : onnx_attr_int(&t->c, "count_include_pad", 0));
    if (ceil_mode) a[na++] = fm_graph_attr_int("ceil_mode", 1);
    const char *x[1] = {xin};
    char pb[300], cb[300];
    const char *pooled = exclude ? tmp_name(t, pb, sizeof pb) : y2;
    if (node(t, is_max ? "max_pool2d" : "avg_pool2d", 1, x, pooled, na, a)) return fm_last_status();
    if (!exclude) return back_1d(t, y2);
    const int one = t->in[0]->ndim == 3;
    int64_t hw[2] = {one ? 1 : t->in[0]->shape[2], t->in[0]->shape[3 - one]}, o[2];
    for (int i = 0; i < 2; i++) o[i] = (hw[i] + 2 * p[i] + more[i] + more[2 + i] - k[i]) / s[i] + 1;
    double *corr = malloc(sizeof(double) * (size_t)(o[0] * o[1]));
    if (!corr) return fm_set_error(FM_ERR_OOM, "AveragePool: out of host memory");
    for (int64_t i = 0; i < o[0]; i++)
        for (int64_t j = 0; j < o[1]; j++) {
            int64_t cells = 1, at[2] = {i, j};
            for (int q = 0; q < 2; q++) {
                const int64_t lo = at[q] * s[q] - p[q] - more[q], hi = lo + k[q];
                cells *= (hi < hw[q] ? hi : hw[q]) - (lo > 0 ? lo : 0);
            }
            corr[i * o[1] + j] = cells > 0 ? (double)(k[0] * k[1]) / (double)cells : 0;
        }
    const char *c = const_of(t, 2, o, corr, t->in[0]->dtype, cb, sizeof cb);
    free(corr);
    return c && !node(t, "mul", 2, (const char *[]){pooled, c}, y2, 0, NULL) ? back_1d(t, y2) : fm_last_status();
}

/* ConvTranspose over 1 or 2 spatial dims (1-D as 2-D, as window2d): a conv_transpose2d node, then a pad node that crops
 * what uneven pads remove (or adds what an output_shape beyond the full size asks). */
static fm_status t_conv_transpose(tctx *t) {
    onnx_convt g;
    if (onnx_convt_geom(&t->c, t->in[0], t->in[1], &g)) return fm_last_status();
    const bool bias = t->n->n_in > 2 && t->n->in[2] >= 0, crop = g.crop_b[0] || g.crop_b[1] || g.crop_e[0] || g.crop_e[1];
    if (g.extends && bias) return fm_set_error(FM_ERR_UNSUPPORTED, "an output_shape beyond the full output with a bias has no graph form");
    const int64_t s[2] = {g.p.stride[0], g.p.stride[1]}, pd[2] = {g.p.padding[0], g.p.padding[1]}, d[2] = {g.p.dilation[0], g.p.dilation[1]};
    const int64_t op[2] = {g.op[0], g.op[1]}, pads[8] = {0, 0, -g.crop_b[0], -g.crop_b[1], 0, 0, -g.crop_e[0], -g.crop_e[1]};
    fm_graph_attr a[5] = {fm_graph_attr_ints("stride", 2, s), fm_graph_attr_ints("padding", 2, pd), fm_graph_attr_ints("dilation", 2, d),
                          fm_graph_attr_int("groups", g.p.groups), fm_graph_attr_ints("output_padding", 2, op)};
    char buf[300], bx[300], bw[300], by[300];
    const char *ins[3] = {as_2d(t, in_name(t, 0), bx, sizeof bx), as_2d(t, in_name(t, 1), bw, sizeof bw), bias ? in_name(t, 2) : ""};
    const char *y2 = window_out(t, by, sizeof by), *y = crop ? tmp_name(t, buf, sizeof buf) : y2;
    if (node(t, "conv_transpose2d", 3, ins, y, 5, a)) return fm_last_status();
    fm_graph_attr pa = fm_graph_attr_ints("pads", 8, pads);
    if (crop && node(t, "pad", 1, &y, y2, 1, &pa)) return fm_last_status();
    return back_1d(t, y2);
}

/* Softsign x / (1 + |x|); ThresholdedRelu where(x > alpha, x, 0); Celu max(0, x) +
 * min(0, alpha (exp(x / alpha) - 1)); Mean of n inputs as n - 1 adds and a product by 1 / n. */
static fm_status t_pointwise_more(tctx *t) {
    const char *op = t->n->op->name, *x = in_name(t, 0), *y = out_name(t, 0);
    const fm_dtype dt = t->in[0]->dtype;
    if (!fm_dtype_is_float(dt)) return fm_set_error(FM_ERR_UNSUPPORTED, "%s of %s has no graph form", op, fm_dtype_name(dt));
    char b[6][300];
    const double alpha = onnx_attr_float(&t->c, "alpha", 1.0f);
    const bool mean = !strcmp(op, "Mean"), softsign = !strcmp(op, "Softsign"), thresh = !strcmp(op, "ThresholdedRelu");
    const char *one = mean || thresh ? "" : scalar_const(t, 1.0, dt, b[0], sizeof b[0]); /* each constant only where it is read */
    const char *zero = mean || softsign ? "" : scalar_const(t, 0.0, dt, b[1], sizeof b[1]);
    const char *t1 = tmp_name(t, b[2], sizeof b[2]), *t2 = tmp_name(t, b[3], sizeof b[3]);
    if (!one || !zero) return fm_last_status();
    if (softsign) {
        if (node(t, "abs", 1, &x, t1, 0, NULL) || node(t, "add", 2, (const char *[]){t1, one}, t2, 0, NULL)) return fm_last_status();
        return node(t, "div", 2, (const char *[]){x, t2}, y, 0, NULL);
    }
    if (thresh) {
        const char *al = scalar_const(t, alpha, dt, b[4], sizeof b[4]);
        if (!al || node(t, "gt", 2, (const char *[]){x, al}, t1, 0, NULL)) return fm_last_status();
        return node(t, "where", 3, (const char *[]){t1, x, zero}, y, 0, NULL);
    }
    if (!strcmp(op, "Celu")) {
        if (alpha == 0) return fm_set_error(FM_ERR_INVALID, "Celu's alpha must not be 0");
        const char *inv = scalar_const(t, 1.0 / alpha, dt, b[4], sizeof b[4]), *al = scalar_const(t, alpha, dt, b[5], sizeof b[5]);
        char c[4][300];
        const char *e = tmp_name(t, c[0], sizeof c[0]), *em = tmp_name(t, c[1], sizeof c[1]), *ng = tmp_name(t, c[2], sizeof c[2]);
        const char *r = tmp_name(t, c[3], sizeof c[3]);
        if (!inv || !al || node(t, "mul", 2, (const char *[]){x, inv}, t1, 0, NULL) || node(t, "exp", 1, &t1, e, 0, NULL) ||
            node(t, "sub", 2, (const char *[]){e, one}, em, 0, NULL) || node(t, "mul", 2, (const char *[]){em, al}, t2, 0, NULL) ||
            node(t, "minimum", 2, (const char *[]){t2, zero}, ng, 0, NULL) || node(t, "relu", 1, &x, r, 0, NULL))
            return fm_last_status();
        return node(t, "add", 2, (const char *[]){r, ng}, y, 0, NULL);
    }
    /* Mean: the sum into t1, then 1 / n times it */
    const char *inv = scalar_const(t, 1.0 / t->n->n_in, dt, b[4], sizeof b[4]);
    if (!inv || fold_inputs(t, "add", t1)) return fm_last_status();
    return node(t, "mul", 2, (const char *[]){t1, inv}, y, 0, NULL);
}

/* PRelu, Elu and Selu as where(x > 0, x, the negative branch) of graph ops; Reciprocal as
 * 1 / x; Sum of n inputs as n - 1 adds. */
static fm_status t_pointwise(tctx *t) {
    const char *op = t->n->op->name, *x = in_name(t, 0);
    const fm_dtype dt = t->in[0]->dtype;
    char b[6][300];
    if (!strcmp(op, "Sum")) return fold_inputs(t, "add", out_name(t, 0));
    if (!fm_dtype_is_float(dt)) return fm_set_error(FM_ERR_UNSUPPORTED, "%s of %s has no graph form", op, fm_dtype_name(dt));
    if (!strcmp(op, "Reciprocal")) {
        const char *one = scalar_const(t, 1.0, dt, b[0], sizeof b[0]), *ins[2] = {one, x};
        return one ? node(t, "div", 2, ins, out_name(t, 0), 0, NULL) : fm_last_status();
    }
    const bool selu = !strcmp(op, "Selu"), prelu = !strcmp(op, "PRelu");
    const double alpha = onnx_attr_float(&t->c, "alpha", selu ? 1.67326319217681884765625f : 1.0f);
    const char *zero = scalar_const(t, 0.0, dt, b[0], sizeof b[0]), *pos = tmp_name(t, b[1], sizeof b[1]), *neg = tmp_name(t, b[2], sizeof b[2]);
    if (!zero || node(t, "gt", 2, (const char *[]){x, zero}, pos, 0, NULL)) return fm_last_status();
    if (prelu) {
        const fm_tensor *sl = t->in[1], *xv = t->in[0];
        const char *slope = in_name(t, 1);
        if (t->c.opset < 7 && sl->ndim == 1 && xv->ndim > 2 && sl->shape[0] == xv->shape[1]) { /* before opset 7 a 1-D slope is per channel */
            int64_t sh[FM_MAX_DIMS] = {sl->shape[0]};
            for (int d = 1; d < xv->ndim - 1; d++) sh[d] = 1;
            fm_graph_attr a = fm_graph_attr_ints("shape", xv->ndim - 1, sh);
            const char *r = tmp_name(t, b[3], sizeof b[3]);
            if (node(t, "reshape", 1, &slope, r, 1, &a)) return fm_last_status();
            slope = r;
        }
        if (node(t, "mul", 2, (const char *[]){x, slope}, neg, 0, NULL)) return fm_last_status();
    } else { /* alpha (exp(x) - 1) */
        const char *e = tmp_name(t, b[3], sizeof b[3]), *one = scalar_const(t, 1.0, dt, b[4], sizeof b[4]), *em = tmp_name(t, b[5], sizeof b[5]);
        if (!one || node(t, "exp", 1, &x, e, 0, NULL) || node(t, "sub", 2, (const char *[]){e, one}, em, 0, NULL)) return fm_last_status();
        const char *al = scalar_const(t, alpha, dt, b[3], sizeof b[3]);
        if (!al || node(t, "mul", 2, (const char *[]){em, al}, neg, 0, NULL)) return fm_last_status();
    }
    char wb[300];
    const char *w = selu ? tmp_name(t, wb, sizeof wb) : out_name(t, 0);
    if (node(t, "where", 3, (const char *[]){pos, x, neg}, w, 0, NULL)) return fm_last_status();
    if (!selu) return FM_OK;
    const char *g = scalar_const(t, onnx_attr_float(&t->c, "gamma", 1.05070102214813232421875f), dt, b[0], sizeof b[0]);
    return g ? node(t, "mul", 2, (const char *[]){w, g}, out_name(t, 0), 0, NULL) : fm_last_status();
}

/* Split: one slice node per output; the sizes from `split` (an attribute before opset 13,
 * then a constant input), or equal parts (the last smaller, num_outputs from opset 18). */
static fm_status t_split(tctx *t) {
    const int nd = t->in[0]->ndim, nout = t->n->n_out;
    int n = 0;
    int64_t sz[64], ax = onnx_attr_int(&t->c, "axis", 0);
    ax += ax < 0 ? nd : 0;
    if (ax < 0 || ax >= nd) return fm_set_error(FM_ERR_INVALID, "axis %lld is out of range for %d dims", (long long)onnx_attr_int(&t->c, "axis", 0), nd);
    if (nout > 64) return fm_set_error(FM_ERR_UNSUPPORTED, "a Split into %d outputs has no graph form (64 at most)", nout);
    if (t->c.opset < 13) {
        const int64_t *v = onnx_attr_ints(&t->c, "split", &n);
        for (int k = 0; k < n && k < 64; k++) sz[k] = v[k];
    } else if (t->n->n_in > 1 && t->n->in[1] >= 0 && (need_folded(t, 1, "split") || onnx_tensor_ints(&t->c, 1, sz, 64, &n)))
        return fm_last_status();
    const int64_t len = t->in[0]->shape[ax];
    if (n == 0) {
        const int64_t part = (len + nout - 1) / nout;
        for (int k = 0; k < nout; k++) sz[k] = len - k * part < part ? (len - k * part > 0 ? len - k * part : 0) : part;
        n = nout;
    }
    if (n != nout) return fm_set_error(FM_ERR_INVALID, "split lists %d sizes for %d outputs", n, nout);
    int64_t off = 0;
    for (int k = 0; k < nout; k++) {
        const int64_t end = off + sz[k];
        fm_graph_attr a[4] = {fm_graph_attr_int("axis", ax), fm_graph_attr_ints("start", 1, &off), fm_graph_attr_ints("end", 1, &end),
                              fm_graph_attr_int("step", 1)};
        const char *x = in_name(t, 0);
        if (t->n->out[k] >= 0 && node(t, "slice", 1, &x, out_name(t, k), 4, a)) return fm_last_status();
        off = end;
    }
    return off == len ? FM_OK : fm_set_error(FM_ERR_INVALID, "split sizes add up to %lld, not the axis's %lld", (long long)off, (long long)len);
}

#define RS_GRAPH_TAPS 8 /* a cubic's 4, an antialiased linear's up to 8 */

/* One resized axis: a nearest (each output one source with weight 1) is an index_select; other
 * modes a weighted sum over the kernel's taps, each an index_select times a weight per output
 * position (a constant [out, 1, ...] along the axis). */
static fm_status resize_axis_nodes(tctx *t, const onnx_resize_axis *r, const char *in, const char *out) {
    const fm_dtype dt = t->in[0]->dtype;
    const int nd = t->in[0]->ndim;
    double *col = malloc(sizeof(double) * (size_t)r->out);
    if (!col) return fm_set_error(FM_ERR_OOM, "Resize: out of host memory");
    bool nearest = true;
    for (int64_t o = 0; o < r->out && nearest; o++) {
        int ones = 0;
        for (int k = 0; k < r->n; k++) ones += r->w[o * r->n + k] == 1, nearest &= r->w[o * r->n + k] == 0 || r->w[o * r->n + k] == 1;
        nearest &= ones == 1;
    }
    char wb[300], gb[300], mb[2][300], ab[2][300]; /* acc names the previous step's buffer: two of each */
    int taps[RS_GRAPH_TAPS], nt = 0;
    for (int k = 0; k < r->n && !nearest; k++) { /* the taps that weigh anything somewhere */
        bool used = false;
        for (int64_t o = 0; o < r->out; o++) used |= r->w[o * r->n + k] != 0;
        if (used && nt < RS_GRAPH_TAPS) taps[nt++] = k;
        else if (used) { free(col); return fm_set_error(FM_ERR_UNSUPPORTED, "a Resize kernel of %d taps has no graph form (%d at most)", r->n, RS_GRAPH_TAPS); }
    }
    if (nearest) taps[nt++] = -1;
    int64_t wsh[FM_MAX_DIMS];
    for (int d = 0; d < nd - r->ax; d++) wsh[d] = d ? 1 : r->out;
    const char *acc = NULL;
    fm_status st = FM_OK;
    for (int j = 0; j < nt && st == FM_OK; j++) {
        const int k = taps[j];
        for (int64_t o = 0; o < r->out; o++) { /* the source of each output: tap k's, or (nearest) the one of weight 1 */
            int kk = k;
            for (int i = 0; kk < 0 && i < r->n; i++)
                if (r->w[o * r->n + i] == 1) kk = i;
            col[o] = (double)r->idx[o * r->n + kk];
        }
        const bool last = j == nt - 1;
        const char *g = nearest ? out : tmp_name(t, gb, sizeof gb);
        st = select_const(t, in, r->ax, r->out, col, g);
        if (st || nearest) break;
        for (int64_t o = 0; o < r->out; o++) col[o] = r->w[o * r->n + k];
        const char *w = const_of(t, nd - r->ax, wsh, col, dt, wb, sizeof wb), *m = last && !acc ? out : tmp_name(t, mb[j % 2], sizeof mb[0]);
        st = w ? node(t, "mul", 2, (const char *[]){g, w}, m, 0, NULL) : fm_last_status();
        if (st == FM_OK && acc) {
            const char *sum = last ? out : tmp_name(t, ab[j % 2], sizeof ab[0]);
            st = node(t, "add", 2, (const char *[]){acc, m}, sum, 0, NULL);
            m = sum;
        }
        acc = m;
    }
    free(col);
    return st;
}

/* Resize and Upsample: each resized axis in turn (resize_axis_nodes), the plan made from the
 * probe shapes, so the resized dims and the sizes or scales must not follow a dynamic dim. */
static fm_status t_resize(tctx *t) {
    for (int k = 1; k < t->n->n_in && k < 4; k++) /* sizes may follow a dynamic dim it does not resize (the batch): checked below */
        if (!(k == 3 && t->n->in[3] >= 0 && t->x->shape_like[t->n->in[3]]) && need_folded(t, k, "roi/scales/sizes")) return fm_last_status();
    onnx_resize_axis ax[FM_MAX_DIMS];
    int na = 0;
    fm_status st = onnx_resize_plan(&t->c, t->in[0], ax, &na);
    const int si = t->n->in[0], so = t->n->out[0];
    for (int d = 0; d < t->in[0]->ndim && st == FM_OK; d++) { /* a dim the plan leaves alone must stay so at the other probe */
        bool resized = false;
        for (int i = 0; i < na; i++) resized |= ax[i].ax == d;
        if (!resized && !same_dim_at_probes(t, so, si, d))
            st = fm_set_error(FM_ERR_UNSUPPORTED, "a Resize whose sizes follow a dynamic dim (axis %d) has no graph form", d);
    }
    for (int i = 0; i < na && st == FM_OK; i++)
        if (!fixed_slot_dim(t, si, ax[i].ax) || !fixed_slot_dim(t, so, ax[i].ax))
            st = fm_set_error(FM_ERR_UNSUPPORTED, "a Resize along a dynamic dim (axis %d) has no graph form: fix its size with --dim", ax[i].ax);
    const char *cur = in_name(t, 0);
    char bufs[2][300];
    for (int i = 0; i < na && st == FM_OK; i++) {
        const char *o = i == na - 1 ? out_name(t, 0) : tmp_name(t, bufs[i % 2], sizeof bufs[0]);
        st = resize_axis_nodes(t, &ax[i], cur, o);
        cur = o;
    }
    if (st == FM_OK && na == 0) st = node(t, "identity", 1, &cur, out_name(t, 0), 0, NULL);
    for (int i = 0; i < na; i++) free(ax[i].idx), free(ax[i].w);
    return st;
}

/* Tile with constant repeats: an index_select per repeated axis (source i mod n), the axis static. */
static fm_status t_tile(tctx *t) {
    int64_t rep[FM_MAX_DIMS];
    int n = 0;
    const int nd = t->in[0]->ndim, si = t->n->in[0];
    if (need_folded(t, 1, "repeats") || onnx_tensor_ints(&t->c, 1, rep, FM_MAX_DIMS, &n)) return fm_last_status();
    if (n != nd) return fm_set_error(FM_ERR_INVALID, "repeats has %d values for %d dims", n, nd);
    int last = -1;
    for (int d = 0; d < nd; d++) {
        if (rep[d] < 0) return fm_set_error(FM_ERR_INVALID, "a negative repeat (%lld)", (long long)rep[d]);
        if (rep[d] != 1) last = d;
    }
    const char *cur = in_name(t, 0);
    char bufs[2][300];
    for (int d = 0; d <= last; d++) {
        if (rep[d] == 1) continue;
        const int64_t len = t->in[0]->shape[d], m = len * rep[d];
        if (t->x->vb[si]->shape[d] != len) return fm_set_error(FM_ERR_UNSUPPORTED, "a Tile along a dynamic dim (%d) has no graph form", d);
        if (m > (INT64_C(1) << 31)) return fm_set_error(FM_ERR_INVALID, "a Tile to %lld positions along dim %d", (long long)m, d);
        double *v = malloc(sizeof(double) * (size_t)(m > 0 ? m : 1));
        if (!v) return fm_set_error(FM_ERR_OOM, "Tile: out of host memory");
        for (int64_t i = 0; i < m; i++) v[i] = (double)(i % len);
        const char *o = d == last ? out_name(t, 0) : tmp_name(t, bufs[d % 2], sizeof bufs[0]);
        fm_status st = select_const(t, cur, d, m, v, o);
        free(v);
        if (st) return st;
        cur = o;
    }
    return last >= 0 ? FM_OK : node(t, "identity", 1, &cur, out_name(t, 0), 0, NULL);
}

/* The indices of GatherElements and ScatterElements (input 1) for the graph's gather and
 * scatter, whose indices are never negative: constant indices with negative entries become
 * a constant with the dim's size added to them, computed ones go through
 * where(i < 0, i + size, i). *name is the value to use (bufs: 5 names' room); the axis must
 * be static when anything is wrapped. */
static fm_status elements_indices(tctx *t, int64_t axis, const char **name, char (*b)[300]) {
    const int64_t dim = t->in[0]->shape[axis], k = fm_tensor_numel(t->in[1]);
    const bool dynamic = t->x->vb[t->n->in[0]]->shape[axis] != dim;
    *name = in_name(t, 1);
    if (!t->x->folded[t->n->in[1]]) { /* computed indices: wrapped at run time */
        if (dynamic) return fm_set_error(FM_ERR_UNSUPPORTED, "computed indices along a dynamic dim have no graph form");
        const fm_dtype it = t->in[1]->dtype;
        const char *z = scalar_const(t, 0, it, b[0], sizeof b[0]), *n = scalar_const(t, (double)dim, it, b[1], sizeof b[1]);
        const char *neg = tmp_name(t, b[2], sizeof b[2]), *up = tmp_name(t, b[3], sizeof b[3]), *idx = *name;
        if (!z || !n || node(t, "lt", 2, (const char *[]){idx, z}, neg, 0, NULL) || node(t, "add", 2, (const char *[]){idx, n}, up, 0, NULL))
            return fm_last_status();
        *name = tmp_name(t, b[4], sizeof b[4]);
        return node(t, "where", 3, (const char *[]){neg, up, idx}, *name, 0, NULL);
    }
    double *v = malloc(sizeof(double) * (size_t)(k > 0 ? k : 1));
    fm_tensor *c = fm_contiguous(t->in[1]);
    fm_status st = v && c ? fm_tensor_copy_to_host(c, v, FM_F64) : fm_set_error(FM_ERR_OOM, "%s: out of memory", t->n->op->name);
    bool neg = false;
    for (int64_t i = 0; st == FM_OK && i < k; i++) neg |= v[i] < 0, v[i] += v[i] < 0 ? (double)dim : 0;
    if (st == FM_OK && neg && dynamic) st = fm_set_error(FM_ERR_UNSUPPORTED, "negative indices along a dynamic dim have no graph form");
    if (st == FM_OK && neg && !(*name = const_of(t, t->in[1]->ndim, t->in[1]->shape, v, FM_I64, b[0], sizeof b[0]))) st = fm_last_status();
    free(v);
    fm_tensor_release(c);
    return st;
}

static fm_status elements_axis(tctx *t, int64_t *axis) {
    const int nd = t->in[0]->ndim;
    *axis = onnx_attr_int(&t->c, "axis", 0);
    if (*axis < 0) *axis += nd;
    return *axis >= 0 && *axis < nd ? FM_OK : fm_set_error(FM_ERR_INVALID, "axis out of range");
}

/* GatherElements: the graph's gather (torch.gather). */
static fm_status t_gather_elements(tctx *t) {
    int64_t axis;
    char b[5][300];
    const char *ins[2] = {in_name(t, 0), NULL};
    if (elements_axis(t, &axis) || elements_indices(t, axis, &ins[1], b)) return fm_last_status();
    fm_graph_attr a = fm_graph_attr_int("axis", axis);
    return node(t, "gather", 2, ins, out_name(t, 0), 1, &a);
}

/* ScatterElements (and opset 9's Scatter): the graph's scatter; ScatterND: scatter_nd, whose
 * indices may be negative. */
static fm_status t_scatter(tctx *t) {
    fm_scatter_reduce red = FM_SCATTER_NONE;
    if (onnx_scatter_reduction(&t->c, &red)) return fm_last_status();
    const char *ins[3] = {in_name(t, 0), in_name(t, 1), in_name(t, 2)};
    fm_graph_attr a[2] = {fm_graph_attr_string("reduce", fm_scatter_reduce_name(red)), {0}};
    if (!strcmp(t->n->op->name, "ScatterND")) return node(t, "scatter_nd", 3, ins, out_name(t, 0), 1, a);
    int64_t axis;
    char b[5][300];
    if (elements_axis(t, &axis) || elements_indices(t, axis, &ins[1], b)) return fm_last_status();
    a[1] = fm_graph_attr_int("axis", axis);
    return node(t, "scatter", 3, ins, out_name(t, 0), 2, a);
}

/* Mod: fmod=1 the graph's fmod (the dividend's sign), fmod=0 remainder (the divisor's; the
 * interpreter's probes have refused it on floats, as ONNX does). */
static fm_status t_mod(tctx *t) {
    const bool fm = onnx_attr_int(&t->c, "fmod", 0) != 0;
    return node(t, fm ? "fmod" : "remainder", 2, (const char *[]){in_name(t, 0), in_name(t, 1)}, out_name(t, 0), 0, NULL);
}

/* The reductions that are a sum of a function of x (then, for ReduceL2 and ReduceLogSum, one
 * more function): the op applied first (mul: x times itself; "": none), or NULL for the rest. */
static const char *reduce_composite(const char *op) {
    return !strcmp(op, "ReduceSumSquare") || !strcmp(op, "ReduceL2") ? "mul" : !strcmp(op, "ReduceL1") ? "abs"
         : !strcmp(op, "ReduceLogSum") ? "" : NULL;
}

/* ArgMax and ArgMin (the first largest of -x is the first smallest of x); select_last_index:
 * the first of x reversed along the axis (an index_select by constant indices: a fixed
 * size there), counted back from the end: (n - 1) - i. */
static fm_status t_argmax(tctx *t, bool is_min, int64_t keep) {
    int64_t axis = onnx_attr_int(&t->c, "axis", 0);
    const int nd = t->in[0]->ndim;
    if (axis < -nd || axis >= nd) return fm_set_error(FM_ERR_INVALID, "axis %lld is out of range for rank %d", (long long)axis, nd);
    if (axis < 0) axis += nd;
    const bool last = onnx_attr_int(&t->c, "select_last_index", 0) != 0;
    const int64_t n = t->in[0]->shape[axis];
    if (last && (!fixed_dim(t, 0, (int)axis) || n < 1 || n > (INT64_C(1) << 24)))
        return fm_set_error(FM_ERR_UNSUPPORTED, "select_last_index has a graph form on a fixed, nonempty axis only");
    fm_graph_attr a[2] = {fm_graph_attr_int("axis", axis), fm_graph_attr_int("keepdim", keep)};
    char nb[300], rb[300], ib[300], cb[300];
    const char *x = in_name(t, 0), *src = is_min ? tmp_name(t, nb, sizeof nb) : x;
    if (is_min && node(t, "neg", 1, &x, src, 0, NULL)) return fm_last_status();
    if (!last) return node(t, "argmax", 1, &src, out_name(t, 0), 2, a);
    double *rev = malloc(sizeof(double) * (size_t)n);
    if (!rev) return fm_set_error(FM_ERR_OOM, "ArgMax: out of host memory");
    for (int64_t i = 0; i < n; i++) rev[i] = (double)(n - 1 - i);
    const char *r = tmp_name(t, rb, sizeof rb), *idx = tmp_name(t, ib, sizeof ib);
    fm_status st = select_const(t, src, axis, n, rev, r);
    free(rev);
    if (st || node(t, "argmax", 1, &r, idx, 2, a)) return fm_last_status();
    const char *top = scalar_const(t, (double)(n - 1), FM_I64, cb, sizeof cb);
    return top ? node(t, "sub", 2, (const char *[]){top, idx}, out_name(t, 0), 0, NULL) : fm_last_status();
}

/* Reductions: Global*Pool and Reduce* with constant axes (ReduceSumSquare, ReduceL1, ReduceL2
 * and ReduceLogSum as a sum between elementwise ops); ArgMax. */
static fm_status t_reduce(tctx *t) {
    const char *op = t->n->op->name, *gop;
    int64_t ax[FM_MAX_DIMS];
    int n = 0, nd = t->in[0]->ndim;
    int64_t keep = onnx_attr_int(&t->c, "keepdims", 1);
    const char *x[1] = {in_name(t, 0)};
    if (!strcmp(op, "ArgMax") || !strcmp(op, "ArgMin")) return t_argmax(t, op[3] == 'M' && op[4] == 'i', keep);
    if (!strncmp(op, "Global", 6)) {
        for (int i = 2; i < nd; i++) ax[n++] = i;
        keep = 1;
        gop = strstr(op, "Max") ? "amax" : "mean";
    } else {
        gop = !strcmp(op, "ReduceSum") ? "sum" : !strcmp(op, "ReduceMean") ? "mean" : !strcmp(op, "ReduceMax") ? "amax"
            : !strcmp(op, "ReduceMin") ? "amin" : !strcmp(op, "ReduceLogSumExp") ? "logsumexp" : !strcmp(op, "ReduceProd") ? "prod"
            : reduce_composite(op) ? "sum" : NULL;
        if (!gop) return fm_set_error(FM_ERR_UNSUPPORTED, "no graph form");
        bool as_input = t->c.opset >= (!strcmp(op, "ReduceSum") ? 13 : 18); /* axes became an input */
        if (as_input && t->n->n_in > 1 && t->n->in[1] >= 0) {
            if (need_folded(t, 1, "axes") || onnx_tensor_ints(&t->c, 1, ax, FM_MAX_DIMS, &n)) return fm_last_status();
        } else if (!as_input) {
            const int64_t *a = onnx_attr_ints(&t->c, "axes", &n);
            for (int i = 0; i < n && i < FM_MAX_DIMS; i++) ax[i] = a[i];
        }
        if (n == 0 && onnx_attr_int(&t->c, "noop_with_empty_axes", 0)) return node(t, "identity", 1, x, out_name(t, 0), 0, NULL);
        if (n == 0)
            for (int i = 0; i < nd; i++) ax[n++] = i;
    }
    fm_graph_attr a[2] = {fm_graph_attr_ints("axes", n, ax), fm_graph_attr_int("keepdim", keep)};
    const char *pre = reduce_composite(op), *post = !strcmp(op, "ReduceL2") ? "sqrt" : !strcmp(op, "ReduceLogSum") ? "log" : NULL;
    if (!pre) return node(t, gop, 1, x, out_name(t, 0), 2, a);
    if (!fm_dtype_is_float(t->in[0]->dtype)) return fm_set_error(FM_ERR_UNSUPPORTED, "%s of %s has no graph form", op, fm_dtype_name(t->in[0]->dtype));
    char b1[300], b2[300];
    const char *src = *pre ? tmp_name(t, b1, sizeof b1) : x[0], *sum = post ? tmp_name(t, b2, sizeof b2) : out_name(t, 0);
    if (*pre && node(t, pre, strcmp(pre, "mul") ? 1 : 2, (const char *[]){x[0], x[0]}, src, 0, NULL)) return fm_last_status();
    if (node(t, gop, 1, &src, sum, 2, a)) return fm_last_status();
    return post ? node(t, post, 1, &sum, out_name(t, 0), 0, NULL) : FM_OK;
}

/* Reshape-like nodes: the graph's reshape with each output dim fixed where it is
 * the same under both probes, 0 where it is the input's dim at that index, and
 * -1 (once) otherwise. */
/* A shape input must be a constant or follow the dynamic dims through shapes
 * only: the probes then tell its every element. */
static fm_status need_shape_input(tctx *t) {
    int s = t->n->n_in > 1 ? t->n->in[1] : -1;
    if (s >= 0 && !t->x->folded[s] && !t->x->shape_like[s])
        return fm_set_error(FM_ERR_UNSUPPORTED, "the target shape is computed from input data; the graph needs it from shapes");
    return FM_OK;
}

/* The dynamic dim (import symbol) whose probe sizes are a and b (declare_inputs in
 * onnx_graph.c sets sym k to 3 + 2k and 4 + 3k), or NULL: a target size that is
 * another input's dynamic dim becomes that dim expression. */

static bool fits3(const int64_t *v, int i, int si, int j, int sj, int64_t d) {
    for (int p = 0; p < 3; p++)
        if (v[p] != si * onnx_probe_size(i, p) + (j >= 0 ? sj * onnx_probe_size(j, p) : 0) + d) return false;
    return true;
}

/* A size that follows the dynamic dims, seen as a, b and c at the three probes (c is
 * INT64_MIN without a third probe): one dim's name; or, where the third probe agrees and
 * exactly one of these forms fits, "m*x", "x+d", "x+y+d" or "x-y+d" (the end of a
 * position slice at past+seq, a mask's length): an expression kept in t's ring until the
 * node is added. NULL when nothing, or more than one form, fits. */
static const char *sym_for3(tctx *t, int64_t a, int64_t b, int64_t c) {
    const onnx_graph_ctx *x = t->x;
    for (int k = 0; k < x->n_syms; k++)
        if (a == onnx_probe_size(k, 0) && b == onnx_probe_size(k, 1)) return x->syms[k];
    if (c == INT64_MIN) return NULL;
    const int64_t v[3] = {a, b, c};
    int hits = 0;
    char e[sizeof t->expr[0]] = "";
    for (int i = 0; i < x->n_syms; i++) {
        for (int m = 1; m <= 8; m++) { /* m*x + d, d = 0 only for m > 1 */
            int64_t d = a - m * onnx_probe_size(i, 0);
            if ((m > 1 && d) || (m == 1 && (!d || d < -(INT64_C(1) << 30) || d > (INT64_C(1) << 30))) || !fits3(v, i, m, -1, 0, d)) continue;
            hits++;
            if (m > 1) snprintf(e, sizeof e, "%d*%s", m, x->syms[i]);
            else snprintf(e, sizeof e, "%s%+" PRId64, x->syms[i], d);
        }
        for (int j = 0; j < x->n_syms; j++)
            for (int sj = -1; sj <= 1; sj += 2) {
                if (j == i || (sj > 0 && j < i)) continue; /* x+y once; x-y and y-x both */
                int64_t d = a - onnx_probe_size(i, 0) - sj * onnx_probe_size(j, 0);
                if (d < -(INT64_C(1) << 30) || d > (INT64_C(1) << 30) || !fits3(v, i, 1, j, sj, d)) continue;
                hits++;
                if (d) snprintf(e, sizeof e, "%s%c%s%+" PRId64, x->syms[i], sj > 0 ? '+' : '-', x->syms[j], d);
                else snprintf(e, sizeof e, "%s%c%s", x->syms[i], sj > 0 ? '+' : '-', x->syms[j]);
            }
    }
    if (hits != 1) return NULL;
    char *out = t->expr[t->n_expr++ % ONNX_EXPR_RING];
    memcpy(out, e, sizeof e);
    return out;
}

/* Dim d of value s as sym_for3 sees it at the three probes. */
static const char *sym_dim(tctx *t, int s, int d) {
    const fm_tensor *c = t->x->vc ? t->x->vc[s] : NULL;
    return sym_for3(t, t->x->va[s]->shape[d], t->x->vb[s]->shape[d], c && d < c->ndim ? c->shape[d] : INT64_MIN);
}

static fm_status t_reshape(tctx *t) {
    if (need_shape_input(t)) return fm_last_status();
    int so = t->n->out[0], si = t->n->in[0];
    const fm_tensor *oa = t->x->va[so], *ob = t->x->vb[so], *ia = t->x->va[si], *ib = t->x->vb[si];
    int64_t sh[FM_MAX_DIMS];
    const char *dims[FM_MAX_DIMS] = {0};
    int infer = 0;
    for (int i = 0; i < oa->ndim; i++) {
        if (oa->shape[i] == ob->shape[i]) sh[i] = oa->shape[i];
        else if (i < ia->ndim && oa->shape[i] == ia->shape[i] && ob->shape[i] == ib->shape[i]) sh[i] = 0;
        else if ((dims[i] = sym_dim(t, t->n->out[0], i))) sh[i] = 0;
        else sh[i] = -1, infer++;
    }
    if (infer > 1) return fm_set_error(FM_ERR_UNSUPPORTED, "a target shape with two dims that follow dynamic dims has no graph form");
    fm_graph_attr a = fm_graph_attr_ints("shape", oa->ndim, sh);
    a.dims = dims;
    const char *x[1] = {in_name(t, 0)};
    return node(t, "reshape", 1, x, out_name(t, 0), 1, &a);
}

static fm_status t_squeeze_unsqueeze(tctx *t) {
    bool un = !strcmp(t->n->op->name, "Unsqueeze");
    int64_t ax[FM_MAX_DIMS];
    int n = 0;
    if (t->c.opset >= 13) {
        if (t->n->n_in > 1 && t->n->in[1] >= 0 && (need_folded(t, 1, "axes") || onnx_tensor_ints(&t->c, 1, ax, FM_MAX_DIMS, &n)))
            return fm_last_status();
    } else {
        const int64_t *a = onnx_attr_ints(&t->c, "axes", &n);
        for (int i = 0; i < n && i < FM_MAX_DIMS; i++) ax[i] = a[i];
    }
    if (n == 0 && !un) { /* every size-1 dim, as seen in the probes */
        for (int d = t->in[0]->ndim - 1; d >= 0; d--)
            if (t->x->va[t->n->in[0]]->shape[d] == 1 && t->x->vb[t->n->in[0]]->shape[d] == 1) ax[n++] = d;
    }
    int out_nd = t->x->va[t->n->out[0]]->ndim, in_nd = t->in[0]->ndim;
    for (int i = 0; i < n; i++) ax[i] = ax[i] < 0 ? ax[i] + (un ? out_nd : in_nd) : ax[i];
    /* unsqueeze in increasing axis order, squeeze in decreasing, so each axis means what ONNX says */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (un ? ax[j] < ax[i] : ax[j] > ax[i]) { int64_t tmp = ax[i]; ax[i] = ax[j], ax[j] = tmp; }
    const char *cur = in_name(t, 0);
    char bufs[2][256];
    for (int i = 0; i < n; i++) {
        const char *out = i == n - 1 ? out_name(t, 0) : tmp_name(t, bufs[i % 2], sizeof bufs[0]);
        fm_graph_attr a = fm_graph_attr_int("axis", ax[i]);
        const char *x[1] = {cur};
        if (node(t, un ? "unsqueeze" : "squeeze", 1, x, out, 1, &a)) return fm_last_status();
        cur = out;
    }
    if (n == 0) return node(t, "identity", 1, &cur, out_name(t, 0), 0, NULL);
    return FM_OK;
}

static fm_status t_transpose_concat(tctx *t) {
    const char *op = t->n->op->name;
    if (!strcmp(op, "Transpose")) {
        int n, nd = t->in[0]->ndim;
        int64_t perm[FM_MAX_DIMS];
        const int64_t *p = onnx_attr_ints(&t->c, "perm", &n);
        for (int i = 0; i < nd; i++) perm[i] = p && n == nd ? p[i] : nd - 1 - i;
        fm_graph_attr a = fm_graph_attr_ints("perm", nd, perm);
        const char *x[1] = {in_name(t, 0)};
        return node(t, "permute", 1, x, out_name(t, 0), 1, &a);
    }
    if (!strcmp(op, "Cast") || !strcmp(op, "CastLike")) { /* CastLike: to the second input's dtype */
        fm_dtype dt = t->n->n_in > 1 && t->in[1] ? t->in[1]->dtype : FM_F32;
        if (op[4] != 'L' && !onnx_dtype_to_fm((int32_t)onnx_attr_int(&t->c, "to", 0), &dt)) return fm_set_error(FM_ERR_UNSUPPORTED, "cast type");
        fm_graph_attr a = fm_graph_attr_string("dtype", fm_dtype_name(dt));
        const char *x[1] = {in_name(t, 0)};
        return node(t, "cast", 1, x, out_name(t, 0), 1, &a);
    }
    const char *ins[64];
    if (t->n->n_in > 64) return fm_set_error(FM_ERR_UNSUPPORTED, "too many inputs");
    for (int k = 0; k < t->n->n_in; k++) ins[k] = in_name(t, k);
    fm_graph_attr a = fm_graph_attr_int("axis", onnx_attr_int(&t->c, "axis", 0));
    return node(t, "cat", t->n->n_in, ins, out_name(t, 0), 1, &a);
}

/* Value `in` reshaped to the node's output shape as the probes saw it: a dim that
 * differs between them is 0 (the input's size there) before index `keep`, where
 * the input's dims still line up with the output's; after it, the dynamic dim of
 * the model's inputs it is (a dim expression), else -1 (inferred), one at most. */
static fm_status reshape_to_output(tctx *t, const char *in, int64_t keep) {
    const fm_tensor *oa = t->x->va[t->n->out[0]], *ob = t->x->vb[t->n->out[0]];
    int64_t sh[FM_MAX_DIMS];
    const char *dims[FM_MAX_DIMS] = {0};
    int infer = 0;
    for (int i = 0; i < oa->ndim; i++) {
        if (oa->shape[i] == ob->shape[i]) sh[i] = oa->shape[i];
        else if (i < keep || (dims[i] = sym_dim(t, t->n->out[0], i))) sh[i] = 0;
        else sh[i] = -1, infer++;
    }
    if (infer > 1)
        return fm_set_error(FM_ERR_UNSUPPORTED, "the output has two dims that follow dynamic dims where the graph can infer one; "
                            "fix one of them to a size (`--dim NAME=SIZE`)");
    fm_graph_attr r = fm_graph_attr_ints("shape", oa->ndim, sh);
    r.dims = dims;
    return node(t, "reshape", 1, &in, out_name(t, 0), 1, &r);
}

/* Constant indices of rank >= 1 along a fixed-size axis: index_select of the
 * indices flattened (negative ones counted from the end, as ONNX says), then,
 * for rank > 1, a reshape to data[:axis] + indices.shape + data[axis+1:]. */
static fm_status gather_indices(tctx *t, int64_t axis, int64_t dim, const fm_tensor *idx) {
    int64_t n = fm_tensor_numel(idx);
    double *flat = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!flat) return fm_set_error(FM_ERR_OOM, "Gather: out of host memory");
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (int64_t)fm_tensor_get(idx, i);
        if (v < -dim || v >= dim) {
            free(flat);
            return fm_set_error(FM_ERR_INVALID, "index %" PRId64 " is outside [-%" PRId64 ", %" PRId64 ")", v, dim, dim);
        }
        flat[i] = (double)(v < 0 ? v + dim : v);
    }
    char mbuf[256];
    const char *mid = idx->ndim == 1 ? out_name(t, 0) : tmp_name(t, mbuf, sizeof mbuf);
    fm_status st = select_const(t, in_name(t, 0), axis, n, flat, mid);
    free(flat);
    if (st || idx->ndim == 1) return st;
    return reshape_to_output(t, mid, axis);
}

/* idx holds 0, 1, ..., rows - 1 in order, rows being data's dim 0 (an exported
 * model's flat index b * s + j over a [b * s, ...] tensor, in both probes). */
static bool is_iota(const fm_tensor *idx, const fm_tensor *data) {
    if (!idx || !data || data->ndim < 1 || fm_tensor_numel(idx) != data->shape[0] || fm_dtype_is_float(idx->dtype)) return false;
    for (int64_t i = 0; i < data->shape[0]; i++)
        if (fm_tensor_get(idx, i) != (double)i) return false;
    return true;
}

/* A Gather of every row of data in order: data reshaped to indices.shape +
 * data.shape[1:], the dims that follow a dynamic dim written as -1 (one at most). */
static fm_status gather_all_rows(tctx *t) { return reshape_to_output(t, in_name(t, 0), 0); }

/* Gather with indices that are data of the graph (a mask's flat index over the batch and
 * the sequence, a graph input): index_select of the indices flattened, then the output's
 * shape. Negative indices count from the end (a where over them adding the dim's size: a
 * constant, or a dim_size node when the dim gathered along is dynamic; not needed for
 * constant indices none of which is negative). */
static fm_status gather_data(tctx *t, int64_t axis) {
    const int sx = t->n->in[0];
    const fm_tensor *idx = t->in[1];
    const fm_dtype it = idx->dtype;
    if (it != FM_I64 && it != FM_I32) return fm_set_error(FM_ERR_UNSUPPORTED, "Gather indices of %s have no graph form", fm_dtype_name(it));
    char b[5][300], c0[300], cd[300];
    const char *cur = in_name(t, 1);
    const int64_t dim = t->x->va[sx]->shape[axis];
    bool neg_possible = !t->x->folded[t->n->in[1]]; /* constant indices: only when one is negative */
    for (int64_t i = 0; !neg_possible && i < fm_tensor_numel(idx); i++) neg_possible = fm_tensor_get(idx, i) < 0;
    if (neg_possible) {
        const char *zero = scalar_const(t, 0, it, c0, sizeof c0), *dd = cd, *x0 = in_name(t, 0);
        const char *neg = tmp_name(t, b[0], sizeof b[0]), *up = tmp_name(t, b[1], sizeof b[1]), *w = tmp_name(t, b[2], sizeof b[2]);
        fm_graph_attr da[2] = {fm_graph_attr_int("axis", axis), fm_graph_attr_string("dtype", fm_dtype_name(it))};
        if (fixed_dim(t, 0, (int)axis)) dd = scalar_const(t, (double)dim, it, cd, sizeof cd);
        else if (node(t, "dim_size", 1, &x0, tmp_name(t, cd, sizeof cd), 2, da)) return fm_last_status();
        if (!zero || !dd || node(t, "lt", 2, (const char *[]){cur, zero}, neg, 0, NULL) ||
            node(t, "add", 2, (const char *[]){cur, dd}, up, 0, NULL) || node(t, "where", 3, (const char *[]){neg, up, cur}, w, 0, NULL))
            return fm_last_status();
        cur = w;
    }
    if (idx->ndim != 1) {
        const char *flat = tmp_name(t, b[3], sizeof b[3]);
        fm_graph_attr r = fm_graph_attr_ints("shape", 1, (int64_t[]){-1});
        if (node(t, "reshape", 1, &cur, flat, 1, &r)) return fm_last_status();
        cur = flat;
    }
    const char *sel = idx->ndim == 1 ? out_name(t, 0) : tmp_name(t, b[4], sizeof b[4]);
    fm_graph_attr a = fm_graph_attr_int("axis", axis);
    if (node(t, "index_select", 2, (const char *[]){in_name(t, 0), cur}, sel, 1, &a)) return fm_last_status();
    return idx->ndim == 1 ? FM_OK : reshape_to_output(t, sel, axis);
}

/* Gather: an embedding lookup (constant 2-D table, axis 0), constant indices as
 * index_select (1-D) / slice + squeeze (a scalar), or data indices (gather_data). */
static fm_status t_gather(tctx *t) {
    int64_t axis = onnx_attr_int(&t->c, "axis", 0);
    if (axis < 0) axis += t->in[0]->ndim;
    int sx = t->n->in[0], si = t->n->in[1];
    if (axis == 0 && t->x->folded[sx] && t->in[0]->ndim == 2 && !t->x->folded[si]) {
        const char *ins[2] = {in_name(t, 0), in_name(t, 1)};
        return node(t, "embedding", 2, ins, out_name(t, 0), 0, NULL);
    }
    if (axis == 0 && t->x->shape_like[si] && is_iota(t->x->va[si], t->x->va[sx]) && is_iota(t->x->vb[si], t->x->vb[sx]))
        return gather_all_rows(t);
    if (t->x->shape_like[si])
        return fm_set_error(FM_ERR_UNSUPPORTED, "indices computed from the size of a dynamic dim (other than every row in "
                            "order) have no graph form; fix the dynamic dims to sizes (`--dim NAME=SIZE`)");
    if (!t->x->folded[si]) return gather_data(t, axis);
    const fm_tensor *idx = t->in[1];
    int64_t dim = t->x->va[sx]->shape[axis];
    const bool dynamic = !fixed_dim(t, 0, (int)axis);
    if (dynamic && idx->ndim > 0) return gather_data(t, axis); /* constant indices along a dynamic dim: as data */
    if (idx->ndim == 0) { /* a slice of one (from the end when negative: a dynamic dim's last token) and a squeeze */
        int64_t i = (int64_t)fm_tensor_item(idx);
        if (i < 0 && !dynamic) i += dim;
        char buf[256];
        const char *mid = tmp_name(t, buf, sizeof buf), *x[1] = {in_name(t, 0)};
        int64_t st[1] = {i}, en[1] = {i + 1};
        fm_graph_attr a[3] = {fm_graph_attr_int("axis", axis), fm_graph_attr_ints("start", 1, st), fm_graph_attr_ints("end", 1, en)};
        if (node(t, "slice", 1, x, mid, i == -1 ? 2 : 3, a)) return fm_last_status(); /* -1: to the end */
        fm_graph_attr s = fm_graph_attr_int("axis", axis);
        return node(t, "squeeze", 1, &mid, out_name(t, 0), 1, &s);
    }
    return gather_indices(t, axis, dim, idx);
}

/* The logical ops on bools, through where and the comparisons (the graph has no
 * logical ops of its own): a and b = where(a, b, a), a or b = where(a, a, b),
 * a xor b = (a != b), not a = (a == false); and IsNaN(x) = (x != x). */
static fm_status t_logical(tctx *t) {
    const char *op = t->n->op->name;
    for (int k = 0; k < t->n->n_in && strncmp(op, "Is", 2); k++)
        if (t->in[k]->dtype != FM_BOOL) return fm_set_error(FM_ERR_UNSUPPORTED, "%s of non-bool inputs has no graph form", op);
    const char *a = in_name(t, 0), *b = t->n->n_in > 1 ? in_name(t, 1) : NULL;
    if (!strcmp(op, "IsInf")) { /* x == inf, x == -inf, or both: where(p, p, n) */
        const fm_dtype dt = t->in[0]->dtype;
        if (!fm_dtype_is_float(dt)) return fm_set_error(FM_ERR_UNSUPPORTED, "IsInf of %s has no graph form", fm_dtype_name(dt));
        const bool pos = onnx_attr_int(&t->c, "detect_positive", 1) != 0, neg = onnx_attr_int(&t->c, "detect_negative", 1) != 0;
        char c1[300], c2[300], t1[300], t2[300];
        const char *pi = scalar_const(t, pos ? INFINITY : NAN, dt, c1, sizeof c1), *ni = scalar_const(t, -INFINITY, dt, c2, sizeof c2);
        const char *p = neg && pos ? tmp_name(t, t1, sizeof t1) : out_name(t, 0), *n = neg && pos ? tmp_name(t, t2, sizeof t2) : out_name(t, 0);
        if (!pi || !ni || ((pos || !neg) && node(t, "eq", 2, (const char *[]){a, pi}, p, 0, NULL)) ||
            (neg && node(t, "eq", 2, (const char *[]){a, ni}, n, 0, NULL)))
            return fm_last_status();
        return neg && pos ? node(t, "where", 3, (const char *[]){p, p, n}, out_name(t, 0), 0, NULL) : FM_OK;
    }
    if (!strcmp(op, "And") || !strcmp(op, "Or")) {
        const char *ins[3] = {a, op[0] == 'A' ? b : a, op[0] == 'A' ? a : b};
        return node(t, "where", 3, ins, out_name(t, 0), 0, NULL);
    }
    if (!strcmp(op, "Xor") || !strcmp(op, "IsNaN")) { /* IsNaN: x != x */
        const char *ins[2] = {a, b ? b : a};
        return node(t, "ne", 2, ins, out_name(t, 0), 0, NULL);
    }
    char buf[256];
    const char *f = tmp_name(t, buf, sizeof buf);
    fm_tensor *no = fm_tensor_zeros(0, NULL, FM_BOOL, FM_CPU);
    fm_status st = no ? fm_graph_add_const(t->x->g, f, no) : fm_last_status();
    fm_tensor_release(no);
    const char *ins[2] = {a, f};
    return st ? st : node(t, "eq", 2, ins, out_name(t, 0), 0, NULL);
}

/* Trilu on fixed last two dims [M, N]: where(mask, x, 0) with the constant mask
 * j - i >= k (upper) or j - i <= k (lower). */
static fm_status t_trilu(tctx *t) {
    const fm_tensor *x = t->in[0];
    const int nd = x->ndim;
    if (nd < 2 || !fixed_dim(t, 0, nd - 2) || !fixed_dim(t, 0, nd - 1))
        return fm_set_error(FM_ERR_UNSUPPORTED, "Trilu has a graph form on fixed last two dims only");
    if (need_folded(t, 1, "k")) return fm_last_status();
    const int64_t M = x->shape[nd - 2], N = x->shape[nd - 1], k = t->n->n_in > 1 && t->in[1] ? (int64_t)fm_tensor_item(t->in[1]) : 0;
    const bool upper = onnx_attr_int(&t->c, "upper", 1) != 0;
    if (M * N > (INT64_C(1) << 26)) return fm_set_error(FM_ERR_UNSUPPORTED, "Trilu over %lld x %lld: the mask is too large", (long long)M, (long long)N);
    double *m = malloc(sizeof(double) * (size_t)(M * N + 1));
    if (!m) return fm_set_error(FM_ERR_OOM, "Trilu: out of host memory");
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) m[i * N + j] = upper ? j - i >= k : j - i <= k;
    char mb[300], zb[300];
    const int64_t sh[2] = {M, N};
    const char *mask = const_of(t, 2, sh, m, FM_BOOL, mb, sizeof mb), *zero = mask ? scalar_const(t, 0.0, x->dtype, zb, sizeof zb) : NULL;
    free(m);
    return zero ? node(t, "where", 3, (const char *[]){mask, in_name(t, 0), zero}, out_name(t, 0), 0, NULL) : fm_last_status();
}

/* CumSum with a constant axis: the graph's cumsum (RoBERTa's position ids: cumsum of the mask). */
static fm_status t_cumsum(tctx *t) {
    if (need_folded(t, 1, "axis")) return fm_last_status();
    const int nd = t->in[0]->ndim;
    int64_t axis = (int64_t)fm_tensor_item(t->in[1]), ex = onnx_attr_int(&t->c, "exclusive", 0), rev = onnx_attr_int(&t->c, "reverse", 0);
    if (axis < -nd || axis >= (nd ? nd : 1)) return fm_set_error(FM_ERR_INVALID, "axis %lld out of range for rank %d", (long long)axis, nd);
    fm_graph_attr a[3] = {fm_graph_attr_int("axis", axis < 0 ? axis + nd : axis), fm_graph_attr_int("exclusive", ex != 0),
                          fm_graph_attr_int("reverse", rev != 0)};
    const char *x0 = in_name(t, 0);
    return node(t, "cumsum", 1, &x0, out_name(t, 0), 3, a);
}

/* TopK with a constant k: the graph's topk, values and indices. */
static fm_status t_topk(tctx *t) {
    int64_t k;
    if (need_folded(t, 1, "K") || onnx_topk_k(&t->c, &k)) return fm_last_status();
    const int nd = t->in[0]->ndim;
    int64_t axis = onnx_attr_int(&t->c, "axis", -1);
    if (axis < -nd || axis >= nd) return fm_set_error(FM_ERR_INVALID, "axis %lld out of range for rank %d", (long long)axis, nd);
    fm_graph_attr a[3] = {fm_graph_attr_int("k", k), fm_graph_attr_int("axis", axis < 0 ? axis + nd : axis),
                          fm_graph_attr_int("largest", onnx_attr_int(&t->c, "largest", 1) != 0)};
    char b[300];
    const char *x0 = in_name(t, 0), *outs[2] = {out_name(t, 0), t->n->n_out > 1 && t->n->out[1] >= 0 ? out_name(t, 1) : tmp_name(t, b, sizeof b)};
    return x0 ? fm_graph_add_node(t->x->g, "topk", NULL, 1, &x0, 2, outs, 3, a) : fm_last_status();
}

/* DepthToSpace / SpaceToDepth: the interpreter's reshape, permute and reshape, with C, H
 * and W fixed and the batch copied through (a 0 in the shapes). */
static fm_status t_space_depth(tctx *t) {
    const fm_tensor *x = t->in[0];
    if (x->ndim != 4) return fm_set_error(FM_ERR_INVALID, "input must be [N, C, H, W]; got rank %d", x->ndim);
    for (int d = 1; d < 4; d++)
        if (!fixed_dim(t, 0, d)) return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form with C, H and W fixed (dim %d varies)", d);
    onnx_space_depth p;
    if (onnx_space_depth_plan(&t->c, x->shape, &p)) return fm_last_status();
    p.mid[0] = 0, p.out[0] = 0;
    int64_t perm[6];
    for (int i = 0; i < 6; i++) perm[i] = p.perm[i];
    char b1[300], b2[300];
    const char *x0 = in_name(t, 0), *m = tmp_name(t, b1, sizeof b1), *q = tmp_name(t, b2, sizeof b2);
    fm_graph_attr a1 = fm_graph_attr_ints("shape", 6, p.mid), a2 = fm_graph_attr_ints("perm", 6, perm), a3 = fm_graph_attr_ints("shape", 4, p.out);
    if (node(t, "reshape", 1, &x0, m, 1, &a1) || node(t, "permute", 1, &m, q, 1, &a2)) return fm_last_status();
    return node(t, "reshape", 1, &q, out_name(t, 0), 1, &a3);
}

/* GatherND's flat rows (into data as [prod(shape[:b+k]), rest...]) from the index tuples:
 * negative indices wrapped, each tuple dotted with the row strides, the batch's block added,
 * and a tuple with any index out of range sent to row -1, which index_select refuses at run
 * time (instead of landing on some other row). */
/* GatherND's indexed dims b..b+k-1 of data and their row strides as [k] vectors, built at run
 * time from dim_size nodes where a dim is dynamic (the batch and sequence of a mask's
 * position table): dims into nb[1], strides into nb[2]. */
static fm_status gather_nd_dyn_dims(tctx *t, int b, int k, fm_dtype it, char (*nb)[300]) {
    char d[FM_MAX_DIMS][300], st[FM_MAX_DIMS][300], tmp[300];
    const char *dn[FM_MAX_DIMS], *sn[FM_MAX_DIMS], *x0 = in_name(t, 0);
    const fm_graph_attr one = fm_graph_attr_ints("shape", 1, (int64_t[]){1});
    for (int j = 0; j < k; j++) {
        if (fixed_dim(t, 0, b + j)) {
            const double v = (double)t->in[0]->shape[b + j];
            dn[j] = const_of(t, 1, (int64_t[]){1}, &v, it, d[j], 300);
            if (!dn[j]) return fm_last_status();
            continue;
        }
        fm_graph_attr da[2] = {fm_graph_attr_int("axis", b + j), fm_graph_attr_string("dtype", fm_dtype_name(it))};
        const char *sz = tmp_name(t, tmp, sizeof tmp);
        if (node(t, "dim_size", 1, &x0, sz, 2, da) || node(t, "reshape", 1, &sz, dn[j] = tmp_name(t, d[j], 300), 1, &one))
            return fm_last_status();
    }
    const double unit = 1;
    if (!(sn[k - 1] = const_of(t, 1, (int64_t[]){1}, &unit, it, st[k - 1], 300))) return fm_last_status();
    for (int j = k - 2; j >= 0; j--)
        if (node(t, "mul", 2, (const char *[]){sn[j + 1], dn[j + 1]}, sn[j] = tmp_name(t, st[j], 300), 0, NULL)) return fm_last_status();
    fm_graph_attr ax = fm_graph_attr_int("axis", 0);
    if (node(t, "cat", k, dn, tmp_name(t, nb[1], 300), 1, &ax)) return fm_last_status();
    return node(t, "cat", k, sn, tmp_name(t, nb[2], 300), 1, &ax);
}

static const char *gather_nd_rows(tctx *t, int b, int k, char (*nb)[300]) {
    const fm_tensor *data = t->in[0], *idx = t->in[1];
    const int q = idx->ndim;
    const fm_dtype it = idx->dtype;
    double dims[FM_MAX_DIMS], st[FM_MAX_DIMS], blk = 1;
    bool dyn = false;
    for (int j = k - 1; j >= 0; j--) dims[j] = (double)data->shape[b + j], st[j] = blk, blk *= dims[j], dyn |= !fixed_dim(t, 0, b + j);
    const int64_t kk = k;
    const char *i0 = in_name(t, 1), *z = scalar_const(t, 0, it, nb[0], 300), *dv = nb[1], *sv = nb[2];
    if (dyn && gather_nd_dyn_dims(t, b, k, it, nb)) return NULL;
    if (!dyn) dv = const_of(t, 1, &kk, dims, it, nb[1], 300), sv = const_of(t, 1, &kk, st, it, nb[2], 300);
    const char *m1 = scalar_const(t, -1, it, nb[3], 300);
    const char *neg = tmp_name(t, nb[4], 300), *up = tmp_name(t, nb[5], 300), *w = tmp_name(t, nb[6], 300);
    const char *lo = tmp_name(t, nb[7], 300), *hi = tmp_name(t, nb[8], 300), *bad = tmp_name(t, nb[9], 300);
    const char *badi = tmp_name(t, nb[10], 300), *anyb = tmp_name(t, nb[11], 300), *pr = tmp_name(t, nb[12], 300);
    const char *fl = tmp_name(t, nb[13], 300), *row = tmp_name(t, nb[14], 300), *mx = tmp_name(t, nb[18], 300);
    fm_graph_attr ax[2] = {fm_graph_attr_ints("axes", 1, (int64_t[]){q - 1}), fm_graph_attr_int("keepdim", 0)};
    fm_graph_attr cast = fm_graph_attr_string("dtype", fm_dtype_name(it));
    if (!z || !dv || !sv || !m1 || node(t, "lt", 2, (const char *[]){i0, z}, neg, 0, NULL) ||
        node(t, "add", 2, (const char *[]){i0, dv}, up, 0, NULL) || node(t, "where", 3, (const char *[]){neg, up, i0}, w, 0, NULL) ||
        node(t, "lt", 2, (const char *[]){w, z}, lo, 0, NULL) || node(t, "ge", 2, (const char *[]){w, dv}, hi, 0, NULL) ||
        node(t, "cast", 1, &lo, bad, 1, &cast) || node(t, "cast", 1, &hi, badi, 1, &cast) ||
        node(t, "maximum", 2, (const char *[]){bad, badi}, mx, 0, NULL) || node(t, "amax", 1, &mx, anyb, 2, ax) || /* any out of range */
        node(t, "mul", 2, (const char *[]){w, sv}, pr, 0, NULL) || node(t, "sum", 1, &pr, fl, 2, ax))
        return NULL;
    const char *flb = fl;
    if (b > 0) { /* the batch's block: prod(shape[b:b+k]) times its linear position */
        int64_t bsh[FM_MAX_DIMS], nbat = 1;
        for (int d = 0; d < q - 1; d++) bsh[d] = d < b ? idx->shape[d] : 1, nbat *= d < b ? idx->shape[d] : 1;
        double *off = malloc(sizeof(double) * (size_t)nbat);
        if (!off) return fm_set_error(FM_ERR_OOM, "GatherND: out of host memory"), NULL;
        for (int64_t i = 0; i < nbat; i++) off[i] = (double)i * blk;
        const char *oc = const_of(t, q - 1, bsh, off, it, nb[15], 300);
        free(off);
        flb = tmp_name(t, nb[16], 300);
        if (!oc || node(t, "add", 2, (const char *[]){fl, oc}, flb, 0, NULL)) return NULL;
    }
    const char *gt0 = tmp_name(t, nb[17], 300);
    if (node(t, "gt", 2, (const char *[]){anyb, z}, gt0, 0, NULL) || node(t, "where", 3, (const char *[]){gt0, m1, flb}, row, 0, NULL))
        return NULL;
    return row;
}

/* GatherND: one index_select of data's rows (gather_nd_rows); the indexed dims may be
 * dynamic where there are no batch dims (their sizes and strides then come from dim_size). */
static fm_status t_gather_nd(tctx *t) {
    const fm_tensor *data = t->in[0], *idx = t->in[1];
    const int b = (int)onnx_attr_int(&t->c, "batch_dims", 0), r = data->ndim, q = idx->ndim;
    if (onnx_gather_nd_check(&t->c, r, data->shape, q, idx->shape, b)) return fm_last_status();
    const int k = (int)idx->shape[q - 1];
    bool dyn = false; /* the indexed dims may vary (gather_nd_dyn_dims) where there are no batch dims */
    for (int d = 0; d < r; d++)
        if (!fixed_dim(t, 0, d) && (b > 0 || d >= k))
            return fm_set_error(FM_ERR_UNSUPPORTED, "has no graph form where dim %d of the data varies (%s)", d,
                                b > 0 ? "with batch_dims, every dim must be fixed" : "past the indexed dims");
        else dyn |= !fixed_dim(t, 0, d);
    char nb[19][300], b1[300], b2[300];
    const char *row = gather_nd_rows(t, b, k, nb);
    if (!row) return fm_last_status();
    int64_t fsh[FM_MAX_DIMS], rows = 1, flat = -1;
    int fn = 1;
    for (int d = 0; d < b + k; d++) rows *= data->shape[d];
    fsh[0] = dyn ? -1 : rows;
    for (int d = b + k; d < r; d++) fsh[fn++] = data->shape[d];
    fm_graph_attr a1 = fm_graph_attr_ints("shape", 1, &flat), a2 = fm_graph_attr_ints("shape", fn, fsh), a3 = fm_graph_attr_int("axis", 0);
    const char *x0 = in_name(t, 0), *r1 = tmp_name(t, b1, sizeof b1), *df = tmp_name(t, b2, sizeof b2), *sel;
    char b3[300];
    sel = tmp_name(t, b3, sizeof b3);
    if (node(t, "reshape", 1, &row, r1, 1, &a1) || node(t, "reshape", 1, &x0, df, 1, &a2) ||
        node(t, "index_select", 2, (const char *[]){df, r1}, sel, 1, &a3))
        return fm_last_status();
    return reshape_to_output(t, sel, 0);
}

/* OneHot with constant depth and values: where(index (wrapped) == position, on, off), the
 * positions a constant laid along the new axis. */
static fm_status t_one_hot(tctx *t) {
    if (need_folded(t, 1, "depth") || need_folded(t, 2, "values")) return fm_last_status();
    const fm_tensor *idx = t->in[0], *vals = t->in[2];
    if (fm_dtype_is_float(idx->dtype) || fm_tensor_numel(vals) != 2 || fm_tensor_numel(t->in[1]) != 1)
        return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form for integer indices, one depth and two values");
    const double dd = fm_tensor_item(t->in[1]);
    if (!(dd >= 1 && dd <= 65536)) return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form for depth in [1, 65536], got %g", dd);
    const int64_t depth = (int64_t)dd, q = idx->ndim;
    int64_t axis = onnx_attr_int(&t->c, "axis", -1);
    if (axis < -(q + 1) || axis > q) return fm_set_error(FM_ERR_INVALID, "axis %lld out of range for rank %lld", (long long)axis, (long long)q + 1);
    if (axis < 0) axis += q + 1;
    int64_t psh[FM_MAX_DIMS];
    for (int d = 0; d <= q; d++) psh[d] = d == axis ? depth : 1;
    double *pv = malloc(sizeof(double) * (size_t)depth), ov[2] = {fm_tensor_get(vals, 0), fm_tensor_get(vals, 1)};
    if (!pv) return fm_set_error(FM_ERR_OOM, "OneHot: out of host memory");
    for (int64_t i = 0; i < depth; i++) pv[i] = (double)i;
    char nb[9][300];
    const fm_dtype it = idx->dtype;
    const char *pos = const_of(t, (int)q + 1, psh, pv, it, nb[0], 300), *i0 = in_name(t, 0);
    free(pv);
    const char *z = scalar_const(t, 0, it, nb[1], 300), *dc = scalar_const(t, (double)depth, it, nb[2], 300);
    const char *off = scalar_const(t, ov[0], vals->dtype, nb[3], 300), *on = scalar_const(t, ov[1], vals->dtype, nb[4], 300);
    const char *neg = tmp_name(t, nb[5], 300), *up = tmp_name(t, nb[6], 300), *w = tmp_name(t, nb[7], 300), *wu = tmp_name(t, nb[8], 300);
    char b9[300];
    const char *mask = tmp_name(t, b9, sizeof b9);
    fm_graph_attr ua = fm_graph_attr_int("axis", axis);
    if (!pos || !z || !dc || !off || !on || node(t, "lt", 2, (const char *[]){i0, z}, neg, 0, NULL) ||
        node(t, "add", 2, (const char *[]){i0, dc}, up, 0, NULL) || node(t, "where", 3, (const char *[]){neg, up, i0}, w, 0, NULL) ||
        node(t, "unsqueeze", 1, &w, wu, 1, &ua) || node(t, "eq", 2, (const char *[]){wu, pos}, mask, 0, NULL))
        return fm_last_status();
    return node(t, "where", 3, (const char *[]){mask, on, off}, out_name(t, 0), 0, NULL);
}

/* EyeLike of a fixed shape: a constant. */
static fm_status t_eye_like(tctx *t) {
    const fm_tensor *x = t->in[0];
    if (x->ndim != 2 || !fixed_dim(t, 0, 0) || !fixed_dim(t, 0, 1) || x->shape[0] * x->shape[1] > (INT64_C(1) << 24))
        return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form for a 2-D input of fixed shape (at most 2^24 elements)");
    fm_dtype dt = x->dtype;
    const int64_t odt = onnx_attr_int(&t->c, "dtype", 0), k = onnx_attr_int(&t->c, "k", 0), R = x->shape[0], C = x->shape[1];
    if (odt && !onnx_dtype_to_fm((int32_t)odt, &dt)) return fm_set_error(FM_ERR_UNSUPPORTED, "dtype %lld", (long long)odt);
    double *v = calloc((size_t)(R * C + 1), sizeof(double));
    if (!v) return fm_set_error(FM_ERR_OOM, "EyeLike: out of host memory");
    for (int64_t i = 0; i < R; i++)
        if (i + k >= 0 && i + k < C) v[i * C + i + k] = 1;
    char b[300];
    const char *e = const_of(t, 2, x->shape, v, dt, b, sizeof b);
    free(v);
    return e ? node(t, "identity", 1, &e, out_name(t, 0), 0, NULL) : fm_last_status();
}

/* Shrink: where(x < -lambd, x + bias, where(x > lambd, x - bias, 0)). */
static fm_status t_shrink(tctx *t) {
    const fm_dtype dt = t->in[0]->dtype;
    const double l = onnx_attr_float(&t->c, "lambd", 0.5f), bias = onnx_attr_float(&t->c, "bias", 0.0f);
    char nb[10][300];
    const char *x = in_name(t, 0), *nl = scalar_const(t, -l, dt, nb[0], 300), *pl = scalar_const(t, l, dt, nb[1], 300);
    const char *z = scalar_const(t, 0, dt, nb[2], 300), *bc = scalar_const(t, bias, dt, nb[3], 300);
    const char *lo = tmp_name(t, nb[4], 300), *hi = tmp_name(t, nb[5], 300), *xa = tmp_name(t, nb[6], 300), *xs = tmp_name(t, nb[7], 300);
    const char *h = tmp_name(t, nb[8], 300);
    if (!nl || !pl || !z || !bc || node(t, "lt", 2, (const char *[]){x, nl}, lo, 0, NULL) || node(t, "gt", 2, (const char *[]){x, pl}, hi, 0, NULL) ||
        node(t, "add", 2, (const char *[]){x, bc}, xa, 0, NULL) || node(t, "sub", 2, (const char *[]){x, bc}, xs, 0, NULL) ||
        node(t, "where", 3, (const char *[]){hi, xs, z}, h, 0, NULL))
        return fm_last_status();
    return node(t, "where", 3, (const char *[]){lo, xa, h}, out_name(t, 0), 0, NULL);
}

/* MeanVarianceNormalization: ONNX's function body, (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9). */
static fm_status t_mvn(tctx *t) {
    int n = 0;
    int64_t ax[FM_MAX_DIMS] = {0, 2, 3};
    const int64_t *a = onnx_attr_ints(&t->c, "axes", &n);
    if (!a) n = 3;
    for (int i = 0; a && i < n && i < FM_MAX_DIMS; i++) ax[i] = a[i];
    if (!fm_dtype_is_float(t->in[0]->dtype)) return fm_set_error(FM_ERR_INVALID, "input must be floating-point");
    fm_graph_attr ra[2] = {fm_graph_attr_ints("axes", n, ax), fm_graph_attr_int("keepdim", 1)};
    char nb[9][300];
    const char *x = in_name(t, 0), *m = tmp_name(t, nb[0], 300), *x2 = tmp_name(t, nb[1], 300), *m2 = tmp_name(t, nb[2], 300);
    const char *mm = tmp_name(t, nb[3], 300), *var = tmp_name(t, nb[4], 300), *sd = tmp_name(t, nb[5], 300);
    const char *eps = scalar_const(t, 1e-9, t->in[0]->dtype, nb[6], 300), *den = tmp_name(t, nb[7], 300), *xc = tmp_name(t, nb[8], 300);
    if (!eps || node(t, "mean", 1, &x, m, 2, ra) || node(t, "mul", 2, (const char *[]){x, x}, x2, 0, NULL) ||
        node(t, "mean", 1, &x2, m2, 2, ra) || node(t, "mul", 2, (const char *[]){m, m}, mm, 0, NULL) ||
        node(t, "sub", 2, (const char *[]){m2, mm}, var, 0, NULL) || node(t, "sqrt", 1, &var, sd, 0, NULL) ||
        node(t, "add", 2, (const char *[]){sd, eps}, den, 0, NULL) || node(t, "sub", 2, (const char *[]){x, m}, xc, 0, NULL))
        return fm_last_status();
    return node(t, "div", 2, (const char *[]){xc, den}, out_name(t, 0), 0, NULL);
}

/* LRN: the squares zero-padded along the channels, `size` shifted slices summed, then
 * x / (bias + alpha / size * sum)^beta, as the interpreter (onnx_ops_misc.c). */
static fm_status t_lrn(tctx *t) {
    const fm_tensor *x = t->in[0];
    const int nd = x->ndim;
    const int64_t size = onnx_attr_int(&t->c, "size", 0), C = nd > 1 ? x->shape[1] : 0;
    if (size < 1 || size > 64 || nd < 3 || !fixed_dim(t, 0, 1) || !fm_dtype_is_float(x->dtype))
        return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form for a float [N, C, ...] of fixed C with size in [1, 64]");
    const double alpha = onnx_attr_float(&t->c, "alpha", 1e-4f), beta = onnx_attr_float(&t->c, "beta", 0.75f), bias = onnx_attr_float(&t->c, "bias", 1.0f);
    int64_t pads[2 * FM_MAX_DIMS] = {0};
    pads[1] = (size - 1) / 2, pads[nd + 1] = size / 2;
    fm_graph_attr pa[2] = {fm_graph_attr_ints("pads", 2 * nd, pads), fm_graph_attr_string("mode", "constant")};
    char nb[8][300], sb[2][300], ab[2][300];
    const char *x0 = in_name(t, 0), *sq = tmp_name(t, nb[0], 300), *pd = tmp_name(t, nb[1], 300), *acc = NULL;
    if (node(t, "mul", 2, (const char *[]){x0, x0}, sq, 0, NULL) || node(t, "pad", 1, &sq, pd, 2, pa)) return fm_last_status();
    for (int64_t i = 0; i < size; i++) {
        fm_graph_attr sa[4] = {fm_graph_attr_int("axis", 1), fm_graph_attr_int("start", i), fm_graph_attr_int("end", i + C), fm_graph_attr_int("step", 1)};
        const char *sl = tmp_name(t, sb[i % 2], 300), *sum = i ? tmp_name(t, ab[i % 2], 300) : sl;
        if (node(t, "slice", 1, &pd, sl, 4, sa) || (i && node(t, "add", 2, (const char *[]){acc, sl}, sum, 0, NULL))) return fm_last_status();
        acc = sum;
    }
    const fm_dtype dt = x->dtype;
    const char *k = scalar_const(t, alpha / (double)size, dt, nb[2], 300), *b = scalar_const(t, bias, dt, nb[3], 300);
    const char *e = scalar_const(t, beta, dt, nb[4], 300), *sc = tmp_name(t, nb[5], 300), *bs = tmp_name(t, nb[6], 300), *p = tmp_name(t, nb[7], 300);
    if (!k || !b || !e || node(t, "mul", 2, (const char *[]){acc, k}, sc, 0, NULL) || node(t, "add", 2, (const char *[]){sc, b}, bs, 0, NULL) ||
        node(t, "pow", 2, (const char *[]){bs, e}, p, 0, NULL))
        return fm_last_status();
    return node(t, "div", 2, (const char *[]){x0, p}, out_name(t, 0), 0, NULL);
}

/* ---- Einsum: the plan of onnx_einsum.c emitted as graph nodes; handles are value names ---- */

static char *g_fresh(tctx *t) {
    char b[300];
    return strdup(tmp_name(t, b, sizeof b));
}
static char *g_one(tctx *t, const char *op, int n_in, const char *const *ins, int na, const fm_graph_attr *a) {
    char *o = g_fresh(t);
    if (o && node(t, op, n_in, ins, o, na, a)) free(o), o = NULL;
    return o;
}
static void *ge_retain(void *c, void *h) { (void)c; return strdup(h); }
static void ge_release(void *c, void *h) { (void)c; free(h); }
static void *ge_permute(void *c, void *h, int nd, const int *perm) {
    int64_t p[FM_MAX_DIMS];
    for (int i = 0; i < nd; i++) p[i] = perm[i];
    fm_graph_attr a = fm_graph_attr_ints("perm", nd, p);
    return g_one(c, "permute", 1, (const char *[]){h}, 1, &a);
}
static void *ge_reshape(void *c, void *h, int nd, const int64_t *sz, int n, const int64_t *sh, int nkeep) {
    (void)nd, (void)sz;
    int64_t s[FM_MAX_DIMS];
    for (int i = 0; i < n; i++) s[i] = i < nkeep ? 0 : sh[i]; /* the leading dims copied: they may be dynamic */
    fm_graph_attr a = fm_graph_attr_ints("shape", n, s);
    return g_one(c, "reshape", 1, (const char *[]){h}, 1, &a);
}
static void *ge_sum(void *c, void *h, int nd, const int64_t *sz, int n, const int *axes) {
    (void)nd, (void)sz;
    int64_t ax[FM_MAX_DIMS];
    for (int i = 0; i < n; i++) ax[i] = axes[i];
    fm_graph_attr a[2] = {fm_graph_attr_ints("axes", n, ax), fm_graph_attr_int("keepdim", 0)};
    return g_one(c, "sum", 1, (const char *[]){h}, 2, a);
}
static void *ge_matmul(void *c, void *a, void *b) { return g_one(c, "matmul", 2, (const char *[]){a, b}, 0, NULL); }
static void *ge_expand(void *c, void *h, int nd, const int64_t *sz, const int64_t *want) {
    int64_t w[FM_MAX_DIMS];
    for (int i = 0; i < nd; i++) w[i] = want[i] == sz[i] ? -1 : want[i]; /* -1 keeps a dim, dynamic or not */
    fm_graph_attr a = fm_graph_attr_ints("shape", nd, w);
    return g_one(c, "expand", 1, (const char *[]){h}, 1, &a);
}
static void *ge_diag(void *c, void *h, int nd, const int64_t *sz, int64_t n) {
    int64_t sh[FM_MAX_DIMS];
    for (int i = 0; i < nd - 2; i++) sh[i] = 0;
    sh[nd - 2] = n * n;
    fm_graph_attr r = fm_graph_attr_ints("shape", nd - 1, sh), ax = fm_graph_attr_int("axis", nd - 2);
    (void)sz;
    double *iv = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!iv) return fm_set_error(FM_ERR_OOM, "out of host memory"), NULL;
    for (int64_t i = 0; i < n; i++) iv[i] = (double)(i * (n + 1));
    char b[300];
    const char *idx = const_of(c, 1, &n, iv, FM_I64, b, sizeof b);
    free(iv);
    char *f = idx ? g_one(c, "reshape", 1, (const char *[]){h}, 1, &r) : NULL, *y = f ? g_one(c, "index_select", 2, (const char *[]){f, idx}, 1, &ax) : NULL;
    free(f);
    return y;
}

/* Dims that vary between the probes must carry labels every operand and the output have,
 * once each (they stay leading batch dims, never merged into a matrix). */
static fm_status einsum_dynamic_ok(tctx *t, const onnx_einsum *p) {
    for (int i = 0; i < p->n_in; i++)
        for (int d = 0; d < p->nd[i]; d++) {
            if (fixed_dim(t, i, d)) continue;
            const int l = p->lab[i][d];
            bool ok = false;
            for (int k = 0; k < p->nout; k++) ok |= p->out[k] == l;
            for (int j = 0; ok && j < p->n_in; j++) {
                int c = 0;
                for (int e = 0; e < p->nd[j]; e++) c += p->lab[j][e] == l;
                ok = c == 1;
            }
            if (!ok) return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form where only labels that every operand and the output "
                                         "have once vary in size (operand %d's dim %d varies)", i, d);
        }
    return FM_OK;
}

static fm_status t_einsum(tctx *t) {
    char eq[256];
    if (!onnx_attr_string(&t->c, "equation", NULL, eq, sizeof eq)) return fm_set_error(FM_ERR_INVALID, "needs the equation attribute");
    const int n = t->n->n_in;
    int ranks[ONNX_EINSUM_MAX_IN];
    const int64_t *shapes[ONNX_EINSUM_MAX_IN];
    void *ins[ONNX_EINSUM_MAX_IN];
    if (n > ONNX_EINSUM_MAX_IN) return fm_set_error(FM_ERR_UNSUPPORTED, "more than %d operands", ONNX_EINSUM_MAX_IN);
    for (int i = 0; i < n; i++) ranks[i] = t->in[i]->ndim, shapes[i] = t->in[i]->shape;
    onnx_einsum p;
    if (onnx_einsum_parse(eq, n, ranks, &p) || einsum_dynamic_ok(t, &p)) return fm_last_status();
    for (int i = 0; i < n; i++)
        if (!(ins[i] = (void *)in_name(t, i))) return fm_last_status();
    const onnx_einsum_exec ex = {t, ge_retain, ge_release, ge_permute, ge_reshape, ge_sum, ge_matmul, ge_expand, ge_diag};
    char *y = onnx_einsum_run(&p, &ex, ins, shapes);
    fm_status st = y ? node(t, "identity", 1, (const char *[]){y}, out_name(t, 0), 0, NULL) : fm_last_status();
    free(y);
    return st;
}

/* ---- QuantizeLinear / DequantizeLinear (QDQ models), and MatMul between them as int8 ---- */

/* Input k (a folded scale or zero point: one value, or one per index along axis of x) as a
 * graph constant of dtype dt shaped to broadcast against x. */
static const char *qdq_param(tctx *t, int k, int64_t axis, fm_dtype dt, char *buf, size_t n) {
    const fm_tensor *v = t->in[k], *x = t->in[0];
    const int64_t m = fm_tensor_numel(v);
    int64_t sh[FM_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) sh[d] = d == axis ? m : 1;
    double *vals = malloc(sizeof(double) * (size_t)(m > 0 ? m : 1));
    if (!vals) return fm_set_error(FM_ERR_OOM, "out of host memory"), NULL;
    for (int64_t i = 0; i < m; i++) vals[i] = fm_tensor_get(v, i);
    const char *r = m == 1 ? const_of(t, 0, NULL, vals, dt, buf, n) : const_of(t, x->ndim, sh, vals, dt, buf, n);
    free(vals);
    return r;
}

/* The axis of QuantizeLinear/DequantizeLinear node t's scale: -1 when it is one value, else
 * the normalized axis (its length checked); refused for blocked scales and data scales. */
static fm_status qdq_axis(tctx *t, int64_t *axis) {
    const fm_tensor *x = t->in[0], *s = t->in[1];
    if (need_folded(t, 1, "scale") || need_folded(t, 2, "zero point")) return fm_last_status();
    if (onnx_attr_int(&t->c, "block_size", 0)) return fm_set_error(FM_ERR_UNSUPPORTED, "blocked scales have no graph form");
    *axis = -1;
    if (fm_tensor_numel(s) == 1) return FM_OK;
    int64_t a = onnx_attr_int(&t->c, "axis", 1);
    if (a < 0) a += x->ndim;
    if (a < 0 || a >= x->ndim || s->ndim != 1 || s->shape[0] != x->shape[a] || !fixed_dim(t, 0, (int)a))
        return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form for one scale, or one per index of a fixed axis");
    *axis = a;
    return FM_OK;
}

/* QuantizeLinear: cast(clamp(round(x / scale) + zero_point, type's range)); the value before
 * the cast is named "<output>/qf" so that a DequantizeLinear of the same parameters reads it
 * without the casts (t_dequantize), and the pair becomes one ew_chain when compiled. A NaN x
 * gives 0 here (the interpreter and ONNX Runtime: the type's minimum, the same for uint8). */
static fm_status t_quantize(tctx *t) {
    int64_t axis;
    if (qdq_axis(t, &axis)) return fm_last_status();
    const fm_tensor *x = t->in[0], *z = t->n->n_in > 2 && t->n->in[2] >= 0 ? t->in[2] : NULL;
    const fm_dtype dt = z ? z->dtype : FM_U8;
    if ((dt != FM_U8 && dt != FM_I8) || !fm_dtype_is_float(x->dtype) || onnx_attr_int(&t->c, "output_dtype", 0))
        return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form from a float x to uint8 or int8 (its zero point's type)");
    char nb[6][300];
    const char *x0 = in_name(t, 0), *sc = qdq_param(t, 1, axis, x->dtype, nb[0], 300), *q = tmp_name(t, nb[1], 300), *r = tmp_name(t, nb[2], 300);
    const char *zc = z ? qdq_param(t, 2, axis, x->dtype, nb[3], 300) : NULL, *zs = z ? tmp_name(t, nb[4], 300) : r, *c = nb[5];
    snprintf(nb[5], 300, "%s/qf", out_name(t, 0));
    fm_graph_attr cl[2] = {fm_graph_attr_float("min", dt == FM_U8 ? 0 : -128), fm_graph_attr_float("max", dt == FM_U8 ? 255 : 127)};
    fm_graph_attr ca = fm_graph_attr_string("dtype", fm_dtype_name(dt));
    if (!sc || (z && !zc) || node(t, "div", 2, (const char *[]){x0, sc}, q, 0, NULL) || node(t, "round", 1, &q, r, 0, NULL) ||
        (z && node(t, "add", 2, (const char *[]){r, zc}, zs, 0, NULL)) || node(t, "clamp", 1, &zs, c, 2, cl))
        return fm_last_status();
    return node(t, "cast", 1, &c, out_name(t, 0), 1, &ca);
}

static int producer_of(const tctx *t, int s, int before);
static bool node_is(const tctx *t, int i, const char *op);

/* Whether folded slots a and b hold the same values (one may be absent: all zeros). */
static bool same_values(const tctx *t, int a, int b) {
    const fm_tensor *x = a >= 0 ? t->x->va[a] : NULL, *y = b >= 0 ? t->x->va[b] : NULL;
    if ((a >= 0 && !t->x->folded[a]) || (b >= 0 && !t->x->folded[b])) return false;
    const int64_t n = x ? fm_tensor_numel(x) : y ? fm_tensor_numel(y) : 0;
    if (x && y && (x->dtype != y->dtype || fm_tensor_numel(y) != n)) return false;
    for (int64_t i = 0; i < n; i++)
        if ((x ? fm_tensor_get(x, i) : 0) != (y ? fm_tensor_get(y, i) : 0)) return false;
    return true;
}

/* The QuantizeLinear node that DequantizeLinear d (node index at) reads, when both have the
 * same scale, zero point and axis (a fake-quantization pair), else -1. */
static int quantize_pair(const tctx *t, const onnx_node *d, int at) {
    const int q = producer_of(t, d->in[0], at);
    if (!node_is(t, q, "QuantizeLinear") || d->n_in < 2) return -1;
    const onnx_node *qn = &t->x->m->nodes[q];
    const int zq = qn->n_in > 2 ? qn->in[2] : -1, zd = d->n_in > 2 ? d->in[2] : -1;
    if (!same_values(t, qn->in[1], d->in[1]) || !same_values(t, zq, zd) || (zq < 0) != (zd < 0) ||
        onnx_attr_int(&(onnx_op_ctx){.node = qn->proto}, "axis", 1) != onnx_attr_int(&(onnx_op_ctx){.node = d->proto}, "axis", 1))
        return -1;
    return q;
}

/* The float name of the QuantizeLinear before DequantizeLinear node t when they form a pair
 * (quantize_pair) on a float of the scale's dtype ("<q output>/qf", t_quantize), else NULL. */
static const char *quantized_float(tctx *t, int me, char *buf, size_t n) {
    const int q = quantize_pair(t, t->n, me);
    if (q < 0 || t->in[1]->dtype != t->x->va[t->x->m->nodes[q].in[0]]->dtype) return NULL;
    snprintf(buf, n, "%s/qf", vname(t, t->n->in[0]));
    return buf;
}

/* DequantizeLinear: (cast(x) - zero_point) * scale, in the scale's dtype; after a
 * QuantizeLinear of the same parameters, from its float value (quantized_float). */
static fm_status t_dequantize(tctx *t, int me) {
    int64_t axis;
    if (qdq_axis(t, &axis)) return fm_last_status();
    const fm_tensor *x = t->in[0], *z = t->n->n_in > 2 && t->n->in[2] >= 0 ? t->in[2] : NULL;
    const fm_dtype dt = t->in[1]->dtype;
    if ((x->dtype != FM_U8 && x->dtype != FM_I8 && x->dtype != FM_I32) || !fm_dtype_is_float(dt) || onnx_attr_int(&t->c, "output_dtype", 0))
        return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form from uint8, int8 or int32 to the scale's float type");
    char nb[5][300];
    fm_graph_attr ca = fm_graph_attr_string("dtype", fm_dtype_name(dt));
    const char *x0 = in_name(t, 0), *f = tmp_name(t, nb[0], 300), *sc = qdq_param(t, 1, axis, dt, nb[1], 300);
    const char *zc = z ? qdq_param(t, 2, axis, dt, nb[2], 300) : NULL, *d = z ? tmp_name(t, nb[3], 300) : f;
    const char *qf = quantized_float(t, me, nb[4], 300);
    if (qf) f = qf, d = z ? d : qf;
    if (!sc || (z && !zc) || (!qf && node(t, "cast", 1, &x0, f, 1, &ca)) || (z && node(t, "sub", 2, (const char *[]){f, zc}, d, 0, NULL)))
        return fm_last_status();
    return node(t, "mul", 2, (const char *[]){d, sc}, out_name(t, 0), 0, NULL);
}

/* The node before `before` that writes slot s, or -1. */
static int producer_of(const tctx *t, int s, int before) {
    for (int i = before - 1; s >= 0 && i >= 0; i--)
        for (int k = 0; k < t->x->m->nodes[i].n_out; k++)
            if (t->x->m->nodes[i].out[k] == s) return i;
    return -1;
}

static bool node_is(const tctx *t, int i, const char *op) { return i >= 0 && !strcmp(t->x->m->nodes[i].op->name, op); }

/* One folded value of slot s (a scalar scale or zero point), or NAN. */
static double folded_scalar(const tctx *t, int s) {
    const fm_tensor *v = s >= 0 && t->x->folded[s] ? t->x->va[s] : NULL;
    return v && fm_tensor_numel(v) == 1 ? fm_tensor_get(v, 0) : NAN;
}

typedef struct qdq_mm { int x_slot, wq_slot, ws_slot, bias_slot; bool nk; double a_scale; int a_zero; } qdq_mm;

/* MatMul(DequantizeLinear(QuantizeLinear(x, s, z), s, z), DequantizeLinear(Wq, ws, 0)) with
 * Wq an int8 constant [K, N] (nk: Gemm's transB, [N, K]), ws one value or one per output, s
 * and z one value each: what ONNX Runtime's quantize_static writes around a MatMul or a
 * linear's Gemm (QDQ format). */
/* Input slot v of node me as DequantizeLinear(QuantizeLinear(x, s, z), s, z), s and z one
 * value each: x's slot (-1: no match), *s and *z, the zero point as a uint8 code (int8 ones are
 * the same values 128 up). */
static int qdq_act(const tctx *t, int me, int v, double *s, int *z) {
    const int da = producer_of(t, v, me);
    if (!node_is(t, da, "DequantizeLinear")) return -1;
    const onnx_node *a = &t->x->m->nodes[da];
    const int q = quantize_pair(t, a, da);
    if (q < 0 || a->n_in < 3) return -1;
    const double sc = folded_scalar(t, a->in[1]), zp = folded_scalar(t, a->in[2]);
    if (!(sc > 0) || zp != zp) return -1; /* one scale and one zero point */
    *s = sc, *z = (int)zp + (t->x->va[a->in[2]]->dtype == FM_I8 ? 128 : 0);
    return *z >= 0 && *z <= 255 ? t->x->m->nodes[q].in[0] : -1;
}

static bool match_qdq_matmul(const tctx *t, int me, bool nk, qdq_mm *m) {
    const onnx_node *n = t->n;
    double s;
    int z;
    const int xs = qdq_act(t, me, n->in[0], &s, &z), db = producer_of(t, n->in[1], me);
    if (xs < 0 || !node_is(t, db, "DequantizeLinear") || !t->x->folded[n->in[1]]) return false;
    const onnx_node *b = &t->x->m->nodes[db];
    if (b->n_in < 2) return false;
    const fm_tensor *wq = t->x->va[b->in[0]], *ws = t->x->va[b->in[1]];
    if (!t->x->folded[b->in[0]] || !t->x->folded[b->in[1]] || wq->dtype != FM_I8 || wq->ndim != 2) return false;
    if (fm_tensor_numel(ws) != 1 && !(ws->ndim == 1 && ws->shape[0] == wq->shape[nk ? 0 : 1] &&
                                      onnx_attr_int(&(onnx_op_ctx){.node = b->proto}, "axis", 1) == (nk ? 0 : 1)))
        return false;
    if (onnx_attr_int(&(onnx_op_ctx){.node = b->proto}, "block_size", 0)) return false;
    const fm_tensor *wz = b->n_in > 2 && b->in[2] >= 0 ? t->x->va[b->in[2]] : NULL;
    for (int64_t i = 0; wz && i < fm_tensor_numel(wz); i++)
        if (fm_tensor_get(wz, i) != 0) return false; /* symmetric weights only: the int8 kernels' */
    *m = (qdq_mm){xs, b->in[0], b->in[1], -1, nk, s, z};
    return true;
}

/* The weight of a Conv at node me as DequantizeLinear of an int8 constant whose per-channel
 * scales fathom's own per-channel quantization of the dequantized weight reproduces (so its
 * panels hold the model's codes): the panels, scales and row sums as graph constants. */
static fm_status qdq_conv_weight(tctx *t, int me, const char **ins, char (*nb)[300]) {
    const int db = producer_of(t, t->n->in[1], me);
    if (!node_is(t, db, "DequantizeLinear") || !t->x->folded[t->n->in[1]]) return FM_ERR_UNSUPPORTED;
    const onnx_node *b = &t->x->m->nodes[db];
    const fm_tensor *wq = t->x->va[b->in[0]], *ws = b->n_in > 1 ? t->x->va[b->in[1]] : NULL, *w = t->x->va[t->n->in[1]];
    if (!t->x->folded[b->in[0]] || !ws || wq->dtype != FM_I8 || w->dtype != FM_F32 || w->ndim != 4) return FM_ERR_UNSUPPORTED;
    fm_tensor *p = NULL, *sc = NULL, *u = NULL;
    fm_status st = fm_quantize_conv_weight_int8(w, &p, &sc, &u) ? FM_ERR_UNSUPPORTED : FM_OK; /* past the panels' limits: float */
    for (int64_t o = 0; !st && o < w->shape[0]; o++) { /* the model's scale per channel, else no fusion */
        const double want = fm_tensor_get(ws, fm_tensor_numel(ws) == 1 ? 0 : o), got = ((const float *)fm_tensor_data(sc))[o];
        if (fm_tensor_numel(ws) != 1 && fm_tensor_numel(ws) != w->shape[0]) st = FM_ERR_UNSUPPORTED;
        else if (fabs(got - want) > 1e-6 * want) st = FM_ERR_UNSUPPORTED;
    }
    ins[1] = tmp_name(t, nb[0], 300), ins[2] = tmp_name(t, nb[1], 300), ins[4] = tmp_name(t, nb[2], 300);
    if (!st) st = fm_graph_add_const(t->x->g, ins[1], p);
    if (!st) st = fm_graph_add_const(t->x->g, ins[2], sc);
    if (!st) st = fm_graph_add_const(t->x->g, ins[4], u);
    fm_tensor_release_n(3, p, sc, u);
    return st;
}

/* A 2-D Conv (groups 1, even pads) between a Q/DQ pair and a DequantizeLinear of an int8
 * constant weight (qdq_conv_weight): qconv2d_int8 with the pair's scale; -1 when it does not
 * match (the float conv2d then). */
static int conv_qdq(tctx *t, const int64_t *k, const int64_t *s, const int64_t *d, const int64_t *p) {
    const int me = (int)(t->n - t->x->m->nodes);
    double as;
    int az;
    const int xs = qdq_act(t, me, t->n->in[0], &as, &az), c = t->n->n_in > 2 ? t->n->in[2] : -1;
    if (xs < 0 || onnx_attr_int(&t->c, "group", 1) != 1 || (c >= 0 && (!t->x->folded[c] || t->in[2]->dtype != FM_F32)) || k[0] > 64 || k[1] > 64)
        return -1;
    char nb[3][300];
    const char *ins[5] = {vname(t, xs), NULL, NULL, c >= 0 ? vname(t, c) : "", NULL};
    fm_status st = qdq_conv_weight(t, me, ins, nb);
    if (st == FM_ERR_UNSUPPORTED) return fm_clear_error(), -1;
    if (!st && t->x->folded[xs]) st = onnx_graph_const(t->x, xs);
    if (!st && c >= 0) st = onnx_graph_const(t->x, c);
    if (st) return (int)st;
    fm_graph_attr a[6] = {fm_graph_attr_ints("stride", 2, s), fm_graph_attr_ints("padding", 2, p), fm_graph_attr_ints("dilation", 2, d),
                          fm_graph_attr_ints("kernel", 2, k), fm_graph_attr_float("a_scale", as), fm_graph_attr_int("a_zero", az)};
    return (int)node(t, "qconv2d_int8", 5, ins, out_name(t, 0), 6, a);
}

/* The weight [N, K] int8 and its scales [N] f32 of a matched MatMul, as graph constants:
 * panels with row sums (layout vnni16x4), or rows when a code is -128 (no panel form). */
static fm_status qdq_weights(tctx *t, const qdq_mm *m, char (*nb)[300], const char **ins, bool *panels) {
    const fm_tensor *wq = t->x->va[m->wq_slot], *ws = t->x->va[m->ws_slot];
    const int64_t N = wq->shape[m->nk ? 0 : 1], nsh[1] = {N};
    fm_tensor *wt = m->nk ? fm_tensor_retain((fm_tensor *)wq) : fm_transpose((fm_tensor *)wq, 0, 1), *q = wt ? fm_contiguous(wt) : NULL, *p = NULL, *u = NULL;
    fm_tensor *sv = fm_tensor_empty(1, nsh, FM_F32, FM_CPU);
    for (int64_t i = 0; sv && i < N; i++) ((float *)fm_tensor_data(sv))[i] = (float)fm_tensor_get(ws, fm_tensor_numel(ws) == 1 ? 0 : i);
    *panels = q && sv && q->shape[1] <= 32768 && fm_pack_weight_int8(q, &p, &u) == FM_OK;
    fm_status st = q && sv ? FM_OK : fm_last_status();
    ins[1] = tmp_name(t, nb[0], 300), ins[2] = tmp_name(t, nb[1], 300), ins[4] = *panels ? tmp_name(t, nb[2], 300) : "";
    ins[3] = m->bias_slot >= 0 ? vname(t, m->bias_slot) : "";
    if (!st && m->bias_slot >= 0) st = onnx_graph_const(t->x, m->bias_slot);
    if (!st) st = fm_graph_add_const(t->x->g, ins[1], *panels ? p : q);
    if (!st) st = fm_graph_add_const(t->x->g, ins[2], sv);
    if (!st && *panels) st = fm_graph_add_const(t->x->g, ins[4], u);
    fm_tensor_release_n(5, wt, q, p, u, sv);
    return st;
}

/* The qlinear_int8 of a matched MatMul or Gemm (match_qdq_matmul), or of a dynamic int8
 * MatMulInteger (a_scale 0), written to out. */
static fm_status qdq_linear_to(tctx *t, const qdq_mm *mm, const char *out) {
    const qdq_mm m = *mm;
    char nb[3][300];
    const char *ins[5];
    bool panels = false;
    fm_clear_error();
    if (qdq_weights(t, &m, nb, ins, &panels)) return fm_last_status();
    ins[0] = vname(t, m.x_slot);
    if (t->x->folded[m.x_slot] && onnx_graph_const(t->x, m.x_slot)) return fm_last_status();
    fm_graph_attr a[3] = {fm_graph_attr_string("layout", panels ? "vnni16x4" : "rows"), fm_graph_attr_float("a_scale", m.a_scale),
                          fm_graph_attr_int("a_zero", m.a_zero)};
    return node(t, "qlinear_int8", panels ? 5 : m.bias_slot >= 0 ? 4 : 3, ins, out, 3, a);
}

static fm_status qdq_linear(tctx *t, const qdq_mm *m) { return qdq_linear_to(t, m, out_name(t, 0)); }

/* MatMulInteger inside ONNX Runtime's dynamic int8 MatMul (onnx_graph_match_dynamic_int8): a
 * dynamic qlinear_int8 from the DynamicQuantizeLinear's float input to the final Mul's output. */
static fm_status t_matmul_integer(tctx *t, int me) {
    if (t->x->dyn_out[me] < 0)
        return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form only inside ONNX Runtime's dynamic int8 MatMul (DynamicQuantizeLinear, "
                            "MatMulInteger on a symmetric int8 constant weight, Cast, Mul by the two scales)");
    const int dq = producer_of(t, t->n->in[0], me);
    const qdq_mm m = {t->x->m->nodes[dq].in[0], t->n->in[1], t->x->dyn_scale[me], -1, false, 0, 0};
    return qdq_linear_to(t, &m, vname(t, t->x->dyn_out[me]));
}

/* MatMul: an int8 qlinear_int8 where it sits between QDQ pairs (match_qdq_matmul), the graph's
 * matmul otherwise. */
static fm_status t_matmul(tctx *t, int me) {
    qdq_mm m;
    return match_qdq_matmul(t, me, false, &m) ? qdq_linear(t, &m) : t_simple(t, "matmul");
}

/* Gemm between QDQ pairs (transA 0, alpha 1, a bias of beta 1 that is a constant [N]) as
 * qlinear_int8, else -1 for the float forms. */
static int gemm_qdq(tctx *t, int me) {
    qdq_mm m;
    const bool tb = onnx_attr_int(&t->c, "transB", 0) != 0;
    const int c = t->n->n_in > 2 ? t->n->in[2] : -1;
    if (onnx_attr_int(&t->c, "transA", 0) || onnx_attr_float(&t->c, "alpha", 1.0f) != 1.0f || !match_qdq_matmul(t, me, tb, &m)) return -1;
    if (c >= 0 && (onnx_attr_float(&t->c, "beta", 1.0f) != 1.0f || !t->x->folded[c] || t->in[2]->ndim != 1 ||
                   !fm_dtype_is_float(t->in[2]->dtype) || t->in[2]->shape[0] != t->x->va[m.wq_slot]->shape[tb ? 0 : 1]))
        return -1;
    m.bias_slot = c;
    return qdq_linear(t, &m);
}

/* The value slot of a graph input whose dim has the probe sizes (a, b), and that dim (-1:
 * none): what an arange over a dynamic dim reads its length from. */
static int input_with_dim(const onnx_graph_ctx *x, int64_t a, int64_t b, int *dim) {
    const fm_onnx_model *m = x->m;
    for (int i = 0; i < m->n_inputs; i++) {
        const fm_tensor *va = x->va[m->inputs[i].slot], *vb = x->vb[m->inputs[i].slot];
        for (int d = 0; va && vb && d < va->ndim; d++)
            if (va->shape[d] == a && vb->shape[d] == b) {
                *dim = d;
                return m->inputs[i].slot;
            }
    }
    return -1;
}

fm_status onnx_graph_materialize(onnx_graph_ctx *x, int s) {
    if (x->emitted[s]) return FM_OK;
    const fm_tensor *a = x->va[s], *b = x->vb[s], *c = x->vc ? x->vc[s] : NULL;
    int dim = 0;
    int in = a->ndim <= 1 && fm_tensor_numel(a) == 1 && fm_tensor_numel(b) == 1
                 ? input_with_dim(x, (int64_t)fm_tensor_get(a, 0), (int64_t)fm_tensor_get(b, 0), &dim) : -1;
    if (in >= 0 && x->vc && (!c || !x->vc[in] || fm_tensor_numel(c) != 1 || (int64_t)fm_tensor_get(c, 0) != x->vc[in]->shape[dim]))
        in = -1; /* the third probe must agree too */
    if (in < 0) return fm_set_error(FM_ERR_UNSUPPORTED, "not one dynamic dim's size");
    const char *src = x->m->value_names[in];
    char buf[300];
    const char *name = x->m->value_names[s], *mid = a->ndim ? buf : name;
    if (a->ndim) snprintf(buf, sizeof buf, "%s/dim", name);
    fm_graph_attr at[2] = {fm_graph_attr_int("axis", dim), fm_graph_attr_string("dtype", fm_dtype_name(a->dtype))};
    fm_status st = fm_graph_add_node(x->g, "dim_size", NULL, 1, &src, 1, &mid, 2, at);
    fm_graph_attr u = fm_graph_attr_int("axis", 0);
    if (!st && a->ndim) st = fm_graph_add_node(x->g, "unsqueeze", NULL, 1, &mid, 1, &name, 1, &u);
    x->emitted[s] = !st;
    return st;
}

static bool dim_at_probes(const onnx_graph_ctx *x, int s, int d, int64_t a, int64_t b, int64_t c) {
    const fm_tensor *va = x->va[s], *vb = x->vb[s], *vc = x->vc ? x->vc[s] : NULL;
    return va && vb && d < va->ndim && d < vb->ndim && va->shape[d] == a && vb->shape[d] == b &&
           (c == INT64_MIN || (vc && d < vc->ndim && vc->shape[d] == c));
}

/* A value the graph holds with a dim of sizes a and b at the probes (and c at the third,
 * where there is one; INT64_MIN: none): a model input's, else, at all three probes, an
 * output of an earlier node the graph has (the present cache, whose length past+seq a
 * causal mask's Range follows). The slot, with *dim; -1 if none. */
static int value_with_dim(const tctx *t, int64_t a, int64_t b, int64_t c, int *dim) {
    const onnx_graph_ctx *x = t->x;
    const fm_onnx_model *m = x->m;
    for (int i = 0; i < m->n_inputs; i++)
        for (int d = 0; d < FM_MAX_DIMS; d++)
            if (dim_at_probes(x, m->inputs[i].slot, d, a, b, x->vc && x->vc[m->inputs[i].slot] ? c : INT64_MIN)) {
                *dim = d;
                return m->inputs[i].slot;
            }
    for (int j = 0; c != INT64_MIN && j < (int)(t->n - m->nodes); j++) {
        const onnx_node *n = &m->nodes[j];
        for (int k = 0; !x->skip[j] && k < n->n_out; k++) {
            const int s = n->out[k];
            if (s < 0 || x->folded[s] || x->shape_like[s]) continue;
            for (int d = 0; d < FM_MAX_DIMS; d++)
                if (dim_at_probes(x, s, d, a, b, c)) {
                    *dim = d;
                    return s;
                }
        }
    }
    return -1;
}

/* Range(start, limit, delta) with a constant start and delta whose length follows the
 * dynamic dims (position ids, a mask's row and column indices): arange over the dim of a
 * value that has that length (value_with_dim). */
static fm_status t_range(tctx *t) {
    if (need_folded(t, 0, "start") || need_folded(t, 2, "delta") || (!t->x->shape_like[t->n->in[1]] && need_folded(t, 1, "limit")))
        return fm_last_status();
    const int so = t->n->out[0];
    const int64_t la = t->x->va[so]->shape[0], lb = t->x->vb[so]->shape[0];
    const int64_t lc = t->x->vc && t->x->vc[so] ? t->x->vc[so]->shape[0] : INT64_MIN;
    int dim = 0;
    const int in = la != lb ? value_with_dim(t, la, lb, lc, &dim) : -1;
    const char *src = in >= 0 ? vname(t, in) : NULL;
    if (!src)
        return fm_set_error(FM_ERR_UNSUPPORTED, "a Range whose length is not a dim of the model's inputs or of a value computed "
                            "before it has no graph form");
    const fm_dtype dt = t->x->va[so]->dtype;
    fm_graph_attr a[4] = {fm_graph_attr_int("axis", dim), fm_graph_attr_float("start", fm_tensor_item(t->in[0])),
                          fm_graph_attr_float("step", fm_tensor_item(t->in[2])), fm_graph_attr_string("dtype", fm_dtype_name(dt))};
    return node(t, "arange", 1, &src, out_name(t, 0), 4, a);
}

/* ConstantOfShape of a shape that follows dynamic dims: its one value expanded to the shape,
 * each dynamic dim written as its expression. */
static fm_status t_constant_of_shape(tctx *t) {
    if (!t->x->shape_like[t->n->in[0]] && need_folded(t, 0, "shape")) return fm_last_status();
    const fm_tensor *oa = t->x->va[t->n->out[0]], *ob = t->x->vb[t->n->out[0]];
    int64_t sh[FM_MAX_DIMS], ones[FM_MAX_DIMS];
    const char *dims[FM_MAX_DIMS] = {0};
    for (int i = 0; i < oa->ndim; i++) {
        ones[i] = 1;
        if (oa->shape[i] == ob->shape[i]) sh[i] = oa->shape[i];
        else if ((dims[i] = sym_dim(t, t->n->out[0], i))) sh[i] = 0;
        else return fm_set_error(FM_ERR_UNSUPPORTED, "a ConstantOfShape dim computed from dynamic dims that is not one of them has no graph form");
    }
    double v = oa->ndim && fm_tensor_numel(oa) ? fm_tensor_get(oa, 0) : 0;
    char cb[300];
    const char *c = const_of(t, oa->ndim, ones, &v, oa->dtype, cb, sizeof cb);
    if (!c) return fm_last_status();
    fm_graph_attr a = fm_graph_attr_ints("shape", oa->ndim, sh);
    a.dims = dims;
    return node(t, "expand", 1, &c, out_name(t, 0), 1, &a);
}

/* Hardmax (opset 13's: along one axis) on a fixed axis: 1 where the index equals the
 * first largest's (argmax with the dim kept), as x's dtype. */
static fm_status t_hardmax(tctx *t) {
    const fm_tensor *x = t->in[0];
    const int nd = x->ndim;
    int64_t axis = onnx_attr_int(&t->c, "axis", t->c.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += nd;
    if (axis < 0 || axis >= nd) return fm_set_error(FM_ERR_INVALID, "axis out of range for rank %d", nd);
    if (t->c.opset < 13 && axis != nd - 1)
        return fm_set_error(FM_ERR_UNSUPPORTED, "Hardmax before opset 13 over more than the last axis has no graph form");
    if (!fm_dtype_is_float(x->dtype) || !fixed_dim(t, 0, (int)axis) || x->shape[axis] > (INT64_C(1) << 24))
        return fm_set_error(FM_ERR_UNSUPPORTED, "Hardmax has a graph form on a fixed axis of a float input only");
    const int64_t n = x->shape[axis];
    int64_t sh[FM_MAX_DIMS];
    for (int d = 0; d < nd; d++) sh[d] = d == axis ? n : 1;
    double *ar = malloc(sizeof(double) * (size_t)(n + 1));
    if (!ar) return fm_set_error(FM_ERR_OOM, "Hardmax: out of host memory");
    for (int64_t i = 0; i < n; i++) ar[i] = (double)i;
    char ab[300], ib[300], eb[300];
    const char *iota = const_of(t, nd, sh, ar, FM_I64, ab, sizeof ab), *x0 = in_name(t, 0);
    free(ar);
    const char *idx = tmp_name(t, ib, sizeof ib), *hit = tmp_name(t, eb, sizeof eb);
    fm_graph_attr a[2] = {fm_graph_attr_int("axis", axis), fm_graph_attr_int("keepdim", 1)};
    fm_graph_attr c = fm_graph_attr_string("dtype", fm_dtype_name(x->dtype));
    if (!iota || node(t, "argmax", 1, &x0, idx, 2, a) || node(t, "eq", 2, (const char *[]){idx, iota}, hit, 0, NULL)) return fm_last_status();
    return node(t, "cast", 1, &hit, out_name(t, 0), 1, &c);
}

/* Slice bound input k (starts 1, ends 2) as graph ints: constant elements as they are, one
 * that follows a dynamic dim (a constant sliced to the sequence length) as that dim's
 * expression in dims[]; NULL dims when every element is constant. */
static fm_status slice_bounds(tctx *t, int k, int64_t *v, int *n, const char **dims) {
    for (int i = 0; i < FM_MAX_DIMS; i++) dims[i] = NULL;
    int s = t->n->in[k];
    if (onnx_tensor_ints(&t->c, k, v, FM_MAX_DIMS, n)) return fm_last_status();
    if (t->x->folded[s]) return FM_OK;
    if (!t->x->shape_like[s]) return need_folded(t, k, "starts/ends/axes/steps");
    const fm_tensor *b = t->x->vb[s];
    if (fm_tensor_numel(b) != *n) return fm_set_error(FM_ERR_UNSUPPORTED, "slice bounds of different lengths at the probes");
    const fm_tensor *c = t->x->vc ? t->x->vc[s] : NULL;
    for (int i = 0; i < *n; i++) {
        int64_t vb = (int64_t)fm_tensor_get(b, i), vc = c && fm_tensor_numel(c) == *n ? (int64_t)fm_tensor_get(c, i) : INT64_MIN;
        if (vb != v[i] && !(dims[i] = sym_for3(t, v[i], vb, vc)))
            return fm_set_error(FM_ERR_UNSUPPORTED, "a slice bound computed from dynamic dims that is not one of them has no graph form");
    }
    return FM_OK;
}

static fm_status t_slice(tctx *t) {
    int64_t st[FM_MAX_DIMS], en[FM_MAX_DIMS], ax[FM_MAX_DIMS], sp[FM_MAX_DIMS];
    const char *sd[FM_MAX_DIMS], *ed[FM_MAX_DIMS];
    int ns = 0, ne = 0, na = 0, np = 0;
    if (t->c.opset < 10) return fm_set_error(FM_ERR_UNSUPPORTED, "Slice before opset 10 has no graph form");
    for (int k = 3; k < t->n->n_in; k++)
        if (need_folded(t, k, "axes/steps")) return fm_last_status();
    if (slice_bounds(t, 1, st, &ns, sd) || slice_bounds(t, 2, en, &ne, ed)) return fm_last_status();
    if ((t->n->n_in > 3 && t->n->in[3] >= 0 && onnx_tensor_ints(&t->c, 3, ax, FM_MAX_DIMS, &na)) ||
        (t->n->n_in > 4 && t->n->in[4] >= 0 && onnx_tensor_ints(&t->c, 4, sp, FM_MAX_DIMS, &np)))
        return fm_last_status();
    const char *cur = in_name(t, 0);
    char bufs[2][256];
    for (int i = 0; i < ns; i++) {
        int64_t step = np ? sp[i] : 1;
        if (step < 1) return fm_set_error(FM_ERR_UNSUPPORTED, "negative slice steps have no graph form");
        const char *out = i == ns - 1 ? out_name(t, 0) : tmp_name(t, bufs[i % 2], sizeof bufs[0]);
        fm_graph_attr a[4] = {fm_graph_attr_int("axis", na ? ax[i] : i), fm_graph_attr_ints("start", 1, &st[i]),
                              fm_graph_attr_ints("end", 1, &en[i]), fm_graph_attr_int("step", step)};
        a[1].dims = &sd[i], a[2].dims = &ed[i];
        if (node(t, "slice", 1, &cur, out, 4, a)) return fm_last_status();
        cur = out;
    }
    return ns ? FM_OK : node(t, "identity", 1, &cur, out_name(t, 0), 0, NULL);
}

/* Expand: the target shape, with -1 where a dynamic dim of the input is kept. */
static fm_status t_expand(tctx *t) {
    if (need_shape_input(t)) return fm_last_status();
    int so = t->n->out[0], si = t->n->in[0];
    const fm_tensor *oa = t->x->va[so], *ob = t->x->vb[so], *ia = t->x->va[si], *ib = t->x->vb[si];
    int64_t sh[FM_MAX_DIMS];
    const char *dims[FM_MAX_DIMS] = {0};
    for (int i = 0; i < oa->ndim; i++) {
        int j = i - (oa->ndim - ia->ndim);
        if (oa->shape[i] == ob->shape[i] && (j < 0 || ia->shape[j] == ib->shape[j])) sh[i] = oa->shape[i];
        else if (j >= 0 && oa->shape[i] == ia->shape[j] && ob->shape[i] == ib->shape[j]) sh[i] = -1;
        else if ((j < 0 || (ia->shape[j] == 1 && ib->shape[j] == 1)) && (dims[i] = sym_dim(t, t->n->out[0], i)))
            sh[i] = 0; /* a size-1 dim expanded to a dynamic dim of the model's inputs (ViT's class token to the batch) */
        else return fm_set_error(FM_ERR_UNSUPPORTED, "an expanded dim that follows another input's dynamic dim has no graph form");
    }
    fm_graph_attr a = fm_graph_attr_ints("shape", oa->ndim, sh);
    a.dims = dims;
    const char *x[1] = {in_name(t, 0)};
    return node(t, "expand", 1, x, out_name(t, 0), 1, &a);
}

/* Pad: its pads, constant and axes must be constants; all-zero pads (Swin pads its feature
 * map to a multiple of the window, nothing at 224x224) are an identity, others a pad node. */
static fm_status t_pad(tctx *t) {
    int64_t all[2 * FM_MAX_DIMS];
    fm_pad_mode mode;
    double v;
    const int nd = t->in[0]->ndim;
    if (need_folded(t, 1, "pads") || need_folded(t, 2, "constant_value") || need_folded(t, 3, "axes") ||
        onnx_pad_args(&t->c, nd, all, &mode, &v))
        return fm_last_status();
    bool zero = true;
    for (int i = 0; i < 2 * nd; i++) zero &= all[i] == 0;
    const char *x[1] = {in_name(t, 0)};
    if (zero) return node(t, "identity", 1, x, out_name(t, 0), 0, NULL);
    fm_graph_attr a[3] = {fm_graph_attr_ints("pads", 2 * nd, all), fm_graph_attr_string("mode", fm_pad_mode_name(mode)), fm_graph_attr_float("value", v)};
    return node(t, "pad", 1, x, out_name(t, 0), mode == FM_PAD_CONSTANT && v != 0 ? 3 : 2, a);
}

/* ---- Attention and RotaryEmbedding (onnx_ops_attn.c's semantics) as graph nodes ---- */

/* The intermediate names of a composition: each step writes a fresh name (or dst, when given)
 * and returns it, or NULL (the error set) when it or one of its inputs failed, so that a chain
 * of steps needs one check at its end. */
#define GN_MAX 64
typedef struct gnames { tctx *t; int n; char b[GN_MAX][300]; } gnames;

static char *gn_buf(gnames *g) {
    if (g->n < GN_MAX) return g->b[g->n++];
    fm_set_error(FM_ERR_UNSUPPORTED, "more than %d intermediate values", GN_MAX);
    return NULL;
}

static const char *gn_op(gnames *g, const char *dst, const char *op, int n_in, const char *const *ins, int na, const fm_graph_attr *a) {
    for (int i = 0; i < n_in; i++)
        if (!ins[i]) return NULL;
    char *b = dst ? NULL : gn_buf(g);
    const char *o = dst ? dst : b ? tmp_name(g->t, b, sizeof g->b[0]) : NULL;
    return o && !node(g->t, op, n_in, ins, o, na, a) ? o : NULL;
}

static const char *gn_1(gnames *g, const char *dst, const char *op, const char *x, int na, const fm_graph_attr *a) { return gn_op(g, dst, op, 1, &x, na, a); }
static const char *gn_2(gnames *g, const char *dst, const char *op, const char *x, const char *y) {
    return gn_op(g, dst, op, 2, (const char *[]){x, y}, 0, NULL);
}
static const char *gn_axis(gnames *g, const char *op, const char *x, int64_t axis) {
    fm_graph_attr a = fm_graph_attr_int("axis", axis);
    return gn_1(g, NULL, op, x, 1, &a);
}
static const char *gn_ints(gnames *g, const char *dst, const char *op, const char *x, const char *attr, int n, const int64_t *v) {
    fm_graph_attr a = fm_graph_attr_ints(attr, n, v);
    return gn_1(g, dst, op, x, 1, &a);
}
static const char *gn_scalar(gnames *g, double v, fm_dtype dt) {
    char *b = gn_buf(g);
    return b ? scalar_const(g->t, v, dt, b, sizeof g->b[0]) : NULL;
}
/* x (dtype from) as dtype to: x itself, or a cast (written to dst when given; an identity there when the types agree). */
static const char *gn_cast(gnames *g, const char *dst, const char *x, fm_dtype from, fm_dtype to) {
    if (from == to) return dst ? gn_1(g, dst, "identity", x, 0, NULL) : x;
    fm_graph_attr a = fm_graph_attr_string("dtype", fm_dtype_name(to));
    return gn_1(g, dst, "cast", x, 1, &a);
}
/* 0 where cond, -inf elsewhere (dtype dt). */
static const char *gn_bias_of(gnames *g, const char *cond, fm_dtype dt) {
    const char *z = gn_scalar(g, 0, dt), *ninf = gn_scalar(g, -INFINITY, dt);
    return gn_op(g, NULL, "where", 3, (const char *[]){cond, z, ninf}, 0, NULL);
}

/* Size of dim d of input k at import probe i (0: a, 1: b, 2: c), or -1 when there is no such probe. */
static int64_t probe_dim(const tctx *t, int k, int d, int i) {
    const onnx_graph_ctx *x = t->x;
    const int s = t->n->in[k];
    const fm_tensor *v = i == 0 ? x->va[s] : i == 1 ? x->vb[s] : x->vc ? x->vc[s] : NULL;
    return v ? v->shape[d] : -1;
}

typedef struct gattn {
    gnames g;
    onnx_attn_plan p;
    fm_dtype qdt, kdt, vdt;
    const char *q, *k, *v;       /* 4-D [B, heads, S, D] in their own types; k and v after the past */
    const char *kw, *vw, *cols;  /* k and v in the math's type; the keys' positions 0 .. total - 1 (i64) */
} gattn;

/* Head counts and head sizes must be fixed (the splits and merges are reshapes by them); an
 * attn_mask shorter than the keys is padded by an amount that must be the same at every probe
 * (*pad). */
static fm_status attn_graph_check(tctx *t, const onnx_attn_plan *p, int64_t *pad) {
    static const int dims3[] = {2}, dims4[] = {1, 3};
    for (int k = 0; k < 6; k++) {
        if (k >= t->n->n_in || t->n->in[k] < 0 || k == 3) continue;
        const bool r3 = p->rank3 && k < 3;
        for (int i = 0; i < (r3 ? 1 : 2); i++)
            if (!fixed_dim(t, k, (r3 ? dims3 : dims4)[i]))
                return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form with fixed head counts and head sizes (input %d's dim %d varies)", k,
                                    (r3 ? dims3 : dims4)[i]);
    }
    *pad = 0;
    if (!p->has_mask) return FM_OK;
    const int nm = t->in[3]->ndim, np = t->x->n_syms ? 3 : 1;
    for (int i = 0; i < np; i++) {
        const int64_t kv = probe_dim(t, 1, p->rank3 ? 1 : 2, i), past = p->has_past ? probe_dim(t, 4, 2, i) : 0, last = probe_dim(t, 3, nm - 1, i);
        if (kv < 0 || past < 0 || last < 0 || (i && kv + past - last != *pad))
            return fm_set_error(FM_ERR_UNSUPPORTED, "an attn_mask whose last dim falls short of the total key length by an amount that "
                                "follows the dynamic dims has no graph form");
        *pad = kv + past - last;
    }
    return FM_OK;
}

/* Q, K and V as 4-D in their own types (3-D: reshape and permute), K and V after past_key and
 * past_value (a cat): present_key and present_value, written to outputs 1 and 2 when read. */
static fm_status attn_graph_heads(gattn *a) {
    tctx *t = a->g.t;
    const onnx_attn_plan *p = &a->p;
    const int64_t heads[3] = {p->hq, p->hkv, p->hkv}, size[3] = {p->d, p->d, p->dv}, perm[4] = {0, 2, 1, 3};
    const char **dst[3] = {&a->q, &a->k, &a->v};
    for (int i = 0; i < 3; i++) {
        const char *x = in_name(t, i), *pres = i && output_used(t, i) ? out_name(t, i) : NULL, *fin = p->has_past ? NULL : pres;
        if (p->rank3) {
            const int64_t sh[4] = {0, 0, heads[i], size[i]};
            x = gn_ints(&a->g, fin, "permute", gn_ints(&a->g, NULL, "reshape", x, "shape", 4, sh), "perm", 4, perm);
        } else if (fin) {
            x = gn_1(&a->g, fin, "identity", x, 0, NULL);
        }
        if (i && p->has_past) {
            fm_graph_attr ax = fm_graph_attr_int("axis", 2);
            x = gn_op(&a->g, pres, "cat", 2, (const char *[]){in_name(t, i + 3), x}, 1, &ax);
        }
        if (!(*dst[i] = x)) return fm_last_status();
    }
    return FM_OK;
}

/* attn_mask as a float bias (dtype wt), its last dim padded with -inf by pad. */
static const char *attn_mask_bias(gattn *a, int64_t pad) {
    tctx *t = a->g.t;
    const fm_dtype dt = t->in[3]->dtype, wt = a->p.wt;
    const int nd = t->in[3]->ndim;
    const char *m = in_name(t, 3);
    m = dt == FM_BOOL ? gn_bias_of(&a->g, m, wt) : gn_cast(&a->g, NULL, m, dt, wt);
    if (!pad) return m;
    int64_t pads[2 * FM_MAX_DIMS] = {0};
    pads[2 * nd - 1] = pad;
    fm_graph_attr pa[3] = {fm_graph_attr_ints("pads", 2 * nd, pads), fm_graph_attr_string("mode", "constant"), fm_graph_attr_float("value", -INFINITY)};
    return gn_1(&a->g, NULL, "pad", m, 3, pa);
}

/* is_causal's bias [Sq, total]: key j is masked for query i when j > past + i. */
static const char *attn_causal_bias(gattn *a) {
    tctx *t = a->g.t;
    const bool fixed_past = !a->p.has_past || fixed_dim(t, 4, 2);
    fm_graph_attr ar[3] = {fm_graph_attr_int("axis", 2), fm_graph_attr_float("start", fixed_past ? (double)a->p.past : 0),
                           fm_graph_attr_string("dtype", "i64")};
    const char *rows = gn_1(&a->g, NULL, "arange", a->q, 3, ar);
    if (!fixed_past) /* the past's length read at run time */
        rows = gn_2(&a->g, NULL, "add", rows, gn_1(&a->g, NULL, "dim_size", in_name(t, 4), 1, (fm_graph_attr[]){ar[0]}));
    const char *ok = gn_2(&a->g, NULL, "le", a->cols, gn_axis(&a->g, "unsqueeze", rows, 1));
    return gn_bias_of(&a->g, ok, a->p.wt);
}

/* nonpad_kv_seqlen's bias [B, 1, 1, total]: key j is padding in batch b when j >= nonpad[b]. */
static const char *attn_nonpad_bias(gattn *a) {
    tctx *t = a->g.t;
    const char *n = gn_axis(&a->g, "unsqueeze", gn_cast(&a->g, NULL, in_name(t, 6), t->in[6]->dtype, FM_I64), 1);
    const char *b = gn_bias_of(&a->g, gn_2(&a->g, NULL, "lt", a->cols, n), a->p.wt);
    return gn_axis(&a->g, "unsqueeze", gn_axis(&a->g, "unsqueeze", b, 1), 1);
}

/* The sum of the mask, causal and padding biases: "" when there is none, NULL on an error. */
static const char *attn_graph_bias(gattn *a, int64_t pad) {
    const char *parts[3] = {a->p.has_mask ? attn_mask_bias(a, pad) : "", a->p.causal ? attn_causal_bias(a) : "",
                            a->p.has_nonpad ? attn_nonpad_bias(a) : ""}, *acc = "";
    for (int i = 0; i < 3 && acc; i++)
        acc = !parts[i] ? NULL : !*parts[i] ? acc : !*acc ? parts[i] : gn_2(&a->g, NULL, "add", acc, parts[i]);
    return acc;
}

/* x [B, Hq, S, N] @ y [B, Hkv, N, M] -> [B, Hq, S, M], query head h with kv head h / (Hq / Hkv):
 * x viewed as [B, Hkv, (Hq / Hkv) S, N], so K and V are never repeated. */
static const char *gn_grouped_matmul(gnames *g, const char *dst, const char *x, const char *y, int64_t hq, int64_t hkv) {
    if (hq == hkv) return gn_2(g, dst, "matmul", x, y);
    const int64_t in[4] = {0, hkv, -1, 0}, out[4] = {0, hq, -1, 0};
    const char *xg = gn_ints(g, NULL, "reshape", x, "shape", 4, in);
    return gn_ints(g, dst, "reshape", gn_2(g, NULL, "matmul", xg, y), "shape", 4, out);
}

/* The composed attention (dtype wt) into dst; *qk the scores qk_matmul_output_mode picks. */
static const char *attn_graph_compose(gattn *a, const char *bias, const char *dst, const char **qk) {
    gnames *g = &a->g;
    const onnx_attn_plan *p = &a->p;
    const fm_dtype wt = p->wt;
    const char *rs = gn_scalar(g, sqrt(p->scale > 0 ? p->scale : 1.0 / sqrt((double)p->d)), wt);
    const char *qs = gn_2(g, NULL, "mul", gn_cast(g, NULL, a->q, a->qdt, wt), rs), *ks = gn_2(g, NULL, "mul", a->kw, rs);
    fm_graph_attr tr[2] = {fm_graph_attr_int("dim0", 2), fm_graph_attr_int("dim1", 3)};
    const char *s[4];
    s[0] = s[1] = gn_grouped_matmul(g, NULL, qs, gn_1(g, NULL, "transpose", ks, 2, tr), p->hq, p->hkv);
    if (p->softcap > 0) {
        const char *th = gn_1(g, NULL, "tanh", gn_2(g, NULL, "mul", s[0], gn_scalar(g, 1.0 / p->softcap, wt)), 0, NULL);
        s[1] = gn_2(g, NULL, "mul", th, gn_scalar(g, p->softcap, wt));
    }
    s[2] = *bias ? gn_2(g, NULL, "add", s[1], bias) : s[1];
    const char *sm = gn_axis(g, "softmax", gn_cast(g, NULL, s[2], wt, p->sm_dt), 3);
    s[3] = gn_cast(g, NULL, sm, p->sm_dt, wt);
    *qk = s[p->mode];
    return gn_grouped_matmul(g, dst, s[3], a->vw, p->hq, p->hkv);
}

/* Without a mask, softcap, padding or qk output, and with one head size: the fused attention
 * in f32. is_causal with as many new keys as queries (same_seq) is causal_attention (query i
 * sees keys j <= L - Sq + i = past + i, the KV cache's alignment); otherwise, with no past, it
 * is scaled_dot_product_attention's top-left mask (j <= i), as ONNX's. */
static const char *attn_graph_fused(gattn *a, const char *dst, bool same_seq) {
    const bool ca = a->p.causal && same_seq;
    fm_graph_attr at[2] = {fm_graph_attr_float("scale", a->p.scale), fm_graph_attr_int("causal", a->p.causal)};
    const char *q = gn_cast(&a->g, NULL, a->q, a->qdt, FM_F32);
    return gn_op(&a->g, dst, ca ? "causal_attention" : "scaled_dot_product_attention", 3, (const char *[]){q, a->kw, a->vw}, ca ? 1 : 2, at);
}

static fm_status t_attention(tctx *t) {
    gattn *a = calloc(1, sizeof *a);
    if (!a) return fm_set_error(FM_ERR_OOM, "out of host memory");
    a->g.t = t;
    t->c.n_out = t->n->n_out;
    int64_t pad = 0;
    fm_status st = onnx_attention_plan(&t->c, &a->p) || attn_graph_check(t, &a->p, &pad) || attn_graph_heads(a) ? fm_last_status() : FM_OK;
    const onnx_attn_plan *p = &a->p;
    const bool want_qk = p->want_qk && output_used(t, 3);
    const bool same_seq = !st && same_dim_at_probes(t, t->n->in[0], t->n->in[1], p->rank3 ? 1 : 2);
    const bool fused = p->wt == FM_F32 && p->sm_dt == FM_F32 && !p->has_mask && !p->has_nonpad && p->softcap == 0 && !want_qk &&
                       p->d == p->dv && (!p->causal || !p->has_past || same_seq);
    const fm_dtype wt = fused ? FM_F32 : p->wt;
    a->qdt = t->in[0]->dtype, a->kdt = t->in[1]->dtype, a->vdt = t->in[2]->dtype;
    const bool cast_y = wt != a->qdt;
    const char *y = NULL, *qk = NULL, *ydst = !p->rank3 && !cast_y ? out_name(t, 0) : NULL;
    if (!st) {
        fm_graph_attr ar[3] = {fm_graph_attr_int("axis", 2), fm_graph_attr_float("start", 0), fm_graph_attr_string("dtype", "i64")};
        a->kw = gn_cast(&a->g, NULL, a->k, a->kdt, wt), a->vw = gn_cast(&a->g, NULL, a->v, a->vdt, wt);
        a->cols = fused ? "" : gn_1(&a->g, NULL, "arange", a->k, 3, ar);
        const char *bias = fused ? "" : attn_graph_bias(a, pad);
        y = !bias ? NULL : fused ? attn_graph_fused(a, ydst, same_seq) : attn_graph_compose(a, bias, ydst, &qk);
    }
    if (y && p->rank3) { /* [B, Hq, Sq, Dv] -> [B, Sq, Hq Dv] */
        const int64_t perm[4] = {0, 2, 1, 3}, sh[3] = {0, 0, p->hq * p->dv};
        y = gn_ints(&a->g, cast_y ? NULL : out_name(t, 0), "reshape", gn_ints(&a->g, NULL, "permute", y, "perm", 4, perm), "shape", 3, sh);
    }
    if (y && cast_y) y = gn_cast(&a->g, out_name(t, 0), y, wt, a->qdt);
    if (y && want_qk && !gn_cast(&a->g, out_name(t, 3), qk, wt, a->qdt)) y = NULL;
    if (!st && !y) st = fm_last_status();
    free(a);
    return st;
}

/* RotaryEmbedding's cos or sin rows for each token: cache[position_ids] (an embedding lookup)
 * or the cache itself, [B, S, rd / 2], in dtype wt. */
static const char *rope_graph_rows(gnames *g, int k, bool pos, fm_dtype wt) {
    tctx *t = g->t;
    const char *c = in_name(t, k);
    if (pos) c = gn_op(g, NULL, "embedding", 2, (const char *[]){c, in_name(t, 3)}, 0, NULL);
    return gn_cast(g, NULL, c, t->in[k]->dtype, wt);
}

/* The rotation of xr [.., rd] by cs, sn (broadcasting to [.., rd / 2]) into dst (NULL: a fresh
 * name): (x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2), x1 and x2 the halves or (interleaved)
 * the even and odd elements. */
static const char *rope_graph_rotate(gnames *g, const char *dst, const char *xr, const char *cs, const char *sn, const onnx_rope_plan *r) {
    const int64_t half = r->rd / 2, st = r->interleaved ? 2 : 1, b1[2] = {0, r->interleaved ? r->rd : half}, b2[2] = {r->interleaved ? 1 : half, r->rd};
    fm_graph_attr a1[4] = {fm_graph_attr_int("axis", 3), fm_graph_attr_ints("start", 1, &b1[0]), fm_graph_attr_ints("end", 1, &b1[1]),
                           fm_graph_attr_int("step", st)};
    fm_graph_attr a2[4] = {a1[0], fm_graph_attr_ints("start", 1, &b2[0]), fm_graph_attr_ints("end", 1, &b2[1]), a1[3]};
    const char *x1 = gn_1(g, NULL, "slice", xr, 4, a1), *x2 = gn_1(g, NULL, "slice", xr, 4, a2);
    const char *re = gn_2(g, NULL, "sub", gn_2(g, NULL, "mul", cs, x1), gn_2(g, NULL, "mul", sn, x2));
    const char *im = gn_2(g, NULL, "add", gn_2(g, NULL, "mul", sn, x1), gn_2(g, NULL, "mul", cs, x2));
    fm_graph_attr ax = fm_graph_attr_int("axis", r->interleaved ? 4 : 3);
    if (!r->interleaved) return gn_op(g, dst, "cat", 2, (const char *[]){re, im}, 1, &ax);
    const char *pair = gn_op(g, NULL, "cat", 2, (const char *[]){gn_axis(g, "unsqueeze", re, 4), gn_axis(g, "unsqueeze", im, 4)}, 1, &ax);
    return gn_ints(g, dst, "reshape", pair, "shape", 4, (const int64_t[]){0, 0, 0, r->rd});
}

/* The graph's rope (rotate-half, cos and sin [S, D]) into dst: the rows [1, S, D / 2] of a batch
 * of one, each doubled along the last dim. */
static const char *rope_graph_fused(gnames *g, const char *dst, const char *x, bool pos, fm_dtype wt, const onnx_rope_plan *r) {
    const char *tab[2];
    for (int i = 0; i < 2; i++) {
        const char *h = gn_ints(g, NULL, "reshape", rope_graph_rows(g, 1 + i, pos, wt), "shape", 2, (const int64_t[]){-1, r->d / 2});
        fm_graph_attr ax = fm_graph_attr_int("axis", 1);
        tab[i] = gn_op(g, NULL, "cat", 2, (const char *[]){h, h}, 1, &ax);
    }
    return gn_op(g, dst, "rope", 3, (const char *[]){x, tab[0], tab[1]}, 0, NULL);
}

/* Composed: X viewed as [B, H, S, D] (3-D: [B, S, H, D]), the rows given a heads dim, the
 * rotated part and the rest concatenated, into dst. */
static const char *rope_graph_compose(gnames *g, const char *dst, const char *x, bool pos, fm_dtype wt, const onnx_rope_plan *r) {
    const int64_t axis = r->rank3 ? 2 : 1, b[4] = {0, r->rd, r->rd, r->d};
    const char *x4 = r->rank3 ? gn_ints(g, NULL, "reshape", x, "shape", 4, (const int64_t[]){0, 0, r->h, r->d}) : x;
    const char *cs = gn_axis(g, "unsqueeze", rope_graph_rows(g, 1, pos, wt), axis), *sn = gn_axis(g, "unsqueeze", rope_graph_rows(g, 2, pos, wt), axis);
    fm_graph_attr a[4] = {fm_graph_attr_int("axis", 3), fm_graph_attr_ints("start", 1, &b[0]), fm_graph_attr_ints("end", 1, &b[1]),
                          fm_graph_attr_int("step", 1)};
    const bool part = r->rd < r->d;
    const char *y = rope_graph_rotate(g, part || r->rank3 ? NULL : dst, part ? gn_1(g, NULL, "slice", x4, 4, a) : x4, cs, sn, r);
    if (part) {
        a[1] = fm_graph_attr_ints("start", 1, &b[2]), a[2] = fm_graph_attr_ints("end", 1, &b[3]);
        fm_graph_attr ax = fm_graph_attr_int("axis", 3);
        y = gn_op(g, r->rank3 ? NULL : dst, "cat", 2, (const char *[]){y, gn_1(g, NULL, "slice", x4, 4, a)}, 1, &ax);
    }
    return r->rank3 ? gn_ints(g, dst, "reshape", y, "shape", 3, (const int64_t[]){0, 0, r->h * r->d}) : y;
}

/* RotaryEmbedding in f32 (f64 for f64 X), as the interpreter: the graph's rope for a batch of one
 * 4-D X rotating whole heads in halves, composed otherwise. */
static fm_status t_rotary(tctx *t) {
    onnx_rope_plan r;
    t->c.n_out = t->n->n_out;
    if (onnx_rope_check(&t->c, &r)) return fm_last_status();
    for (int d = r.rank3 ? 2 : 1; d < 4; d += 2)
        if (d < t->in[0]->ndim && !fixed_dim(t, 0, d))
            return fm_set_error(FM_ERR_UNSUPPORTED, "has a graph form with a fixed head count and head size (X's dim %d varies)", d);
    gnames *g = calloc(1, sizeof *g);
    if (!g) return fm_set_error(FM_ERR_OOM, "out of host memory");
    g->t = t;
    const fm_dtype xdt = t->in[0]->dtype, wt = xdt == FM_F64 ? FM_F64 : FM_F32;
    const bool pos = t->n->n_in > 3 && t->n->in[3] >= 0, cast_y = wt != xdt;
    const char *x = gn_cast(g, NULL, in_name(t, 0), xdt, wt), *dst = cast_y ? NULL : out_name(t, 0);
    const char *y = !r.interleaved && r.rd == r.d && !r.rank3 && fixed_dim(t, 0, 0) && r.b == 1 ? rope_graph_fused(g, dst, x, pos, wt, &r)
                                                                                               : rope_graph_compose(g, dst, x, pos, wt, &r);
    if (y && cast_y) y = gn_cast(g, out_name(t, 0), y, wt, xdt);
    fm_status st = y ? FM_OK : fm_last_status();
    free(g);
    return st;
}

bool onnx_graph_shape_input_ok(const char *op, int input) {
    return (input == 1 && (!strcmp(op, "Reshape") || !strcmp(op, "Expand") || !strcmp(op, "Gather"))) || /* Gather: t_gather */
           (input == 3 && !strcmp(op, "Resize")) || /* sizes that carry the batch along: t_resize checks the resized dims */
           !strcmp(op, "Range") || !strcmp(op, "ConstantOfShape") || /* t_range, t_constant_of_shape */
           (!strcmp(op, "Slice") && (input == 1 || input == 2)); /* bounds that are a dynamic dim: slice_bounds */
}

fm_status onnx_graph_translate(onnx_graph_ctx *x, int i) {
    tctx t = {.x = x, .n = &x->m->nodes[i]};
    for (int k = 0; k < t.n->n_in && k < 64; k++) t.in[k] = t.n->in[k] >= 0 ? x->va[t.n->in[k]] : NULL;
    t.c = (onnx_op_ctx){.model = x->m, .node = t.n->proto, .opset = x->m->opset, .n_in = t.n->n_in, .in = t.in};
    const char *op = t.n->op->name;
    if (!strcmp(op, "MatMul")) return t_matmul(&t, i);
    if (!strcmp(op, "Gemm")) return t_gemm(&t, i);
    if (!strcmp(op, "DequantizeLinear")) return t_dequantize(&t, i);
    if (!strcmp(op, "MatMulInteger")) return t_matmul_integer(&t, i);
    for (size_t k = 0; k < sizeof k_simple / sizeof *k_simple; k++)
        if (!strcmp(op, k_simple[k].onnx)) return t_simple(&t, k_simple[k].graph);
    static const struct { const char *names; fm_status (*fn)(tctx *); } fams[] = {
        {",LeakyRelu,Gelu,Clip,HardSigmoid,HardSwish,", t_activation},
        {",Softmax,LogSoftmax,", t_softmax},
        {",LayerNormalization,BatchNormalization,InstanceNormalization,", t_norm},
        {",Conv,MaxPool,AveragePool,", t_conv_pool},
        {",GlobalAveragePool,GlobalMaxPool,ReduceSum,ReduceMean,ReduceMax,ReduceMin,ReduceLogSumExp,ReduceSumSquare,ReduceL1,ReduceL2,"
         "ReduceLogSum,ReduceProd,ArgMax,ArgMin,", t_reduce},
        {",Reshape,Flatten,", t_reshape},
        {",Squeeze,Unsqueeze,", t_squeeze_unsqueeze},
        {",Transpose,Concat,Cast,CastLike,", t_transpose_concat},
        {",Gather,", t_gather},
        {",Slice,", t_slice},
        {",Expand,", t_expand},
        {",Pad,", t_pad},
        {",ConvTranspose,", t_conv_transpose},
        {",PRelu,Elu,Selu,Reciprocal,Sum,", t_pointwise},
        {",Softsign,ThresholdedRelu,Celu,Mean,", t_pointwise_more},
        {",Split,", t_split},
        {",Resize,Upsample,", t_resize},
        {",Tile,", t_tile},
        {",GatherElements,", t_gather_elements},
        {",ScatterElements,Scatter,ScatterND,", t_scatter},
        {",Mod,", t_mod},
        {",And,Or,Xor,Not,IsNaN,IsInf,", t_logical},
        {",Trilu,", t_trilu},
        {",Hardmax,", t_hardmax},
        {",CumSum,", t_cumsum},
        {",TopK,", t_topk},
        {",DepthToSpace,SpaceToDepth,", t_space_depth},
        {",GatherND,", t_gather_nd},
        {",OneHot,", t_one_hot},
        {",EyeLike,", t_eye_like},
        {",Shrink,", t_shrink},
        {",MeanVarianceNormalization,", t_mvn},
        {",LRN,", t_lrn},
        {",Einsum,", t_einsum},
        {",QuantizeLinear,", t_quantize},
        {",Range,", t_range},
        {",ConstantOfShape,", t_constant_of_shape},
        {",Attention,", t_attention},
        {",RotaryEmbedding,", t_rotary},
    };
    char key[64];
    snprintf(key, sizeof key, ",%s,", op);
    for (size_t k = 0; k < sizeof fams / sizeof *fams; k++)
        if (strstr(fams[k].names, key)) return fams[k].fn(&t);
    return fm_set_error(FM_ERR_UNSUPPORTED, "has no graph form yet (fathom run runs the model directly)");
}
