/* The graph's op table, part 1: attribute readers, the lookup over the three
 * families' tables, and the elementwise, reduction and matmul rules. Each op
 * has a shape/dtype rule (infer: checks inputs and attributes as strictly as
 * the op's front end, so a bad graph is refused at load) and a runner (run:
 * calls the op's front end in fathom/ops.h, which dispatches to the device). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "fathom/ops.h"
#include "graph/graph_internal.h"

/* ---- attributes ---- */

static fm_status attr_type_err(const char *name, const char *want) {
    return fm_set_error(FM_ERR_INVALID, "attribute '%s' must be %s", name, want);
}

fm_status ga_int(const gctx *c, const char *name, int64_t def, int64_t *out) {
    const gattr *a = g_node_attr(c->n, name);
    if (!a) { *out = def; return FM_OK; }
    if (a->type != FM_ATTR_INT) return attr_type_err(name, "an integer");
    *out = a->i;
    return FM_OK;
}

fm_status ga_float(const gctx *c, const char *name, double def, double *out) { return g_attr_float(g_node_attr(c->n, name), name, def, out); }

fm_status g_attr_float(const gattr *a, const char *name, double def, double *out) {
    if (!a) { *out = def; return FM_OK; }
    if (a->type == FM_ATTR_INT) { *out = (double)a->i; return FM_OK; }
    if (a->type == FM_ATTR_STRING) { /* JSON has no infinities: graph.json writes them as strings */
        if (!strcmp(a->s, "inf")) { *out = INFINITY; return FM_OK; }
        if (!strcmp(a->s, "-inf")) { *out = -INFINITY; return FM_OK; }
        if (!strcmp(a->s, "nan")) { *out = NAN; return FM_OK; }
    }
    if (a->type != FM_ATTR_FLOAT) return attr_type_err(name, "a number");
    *out = a->f;
    return FM_OK;
}

fm_status ga_ints(const gctx *c, const char *name, int64_t *out, int *n, int max) {
    const gattr *a = g_node_attr(c->n, name);
    *n = -1;
    if (!a) return FM_OK;
    if (a->type == FM_ATTR_INT && max >= 1) { out[0] = a->i; *n = 1; return FM_OK; }
    if (a->type != FM_ATTR_INTS) return attr_type_err(name, "a list of integers");
    if (a->n > max) return fm_set_error(FM_ERR_INVALID, "attribute '%s' has %d elements (at most %d)", name, a->n, max);
    for (int k = 0; k < a->n; k++) {
        if (!a->ints[k].expr) { out[k] = a->ints[k].v; continue; }
        fm_status st = g_expr_eval(c->g, a->ints[k].expr, c->syms, &out[k]);
        if (st != FM_OK) { fm_error_prefix("attribute '%s'", name); return st; }
    }
    *n = a->n;
    return FM_OK;
}

const char *ga_string(const gctx *c, const char *name, const char *def) {
    const gattr *a = g_node_attr(c->n, name);
    if (!a) return def;
    return a->type == FM_ATTR_STRING ? a->s : NULL;
}

const char *g_tshape(const gtype *t, char *buf, size_t n) { return fm_shape_str(t->ndim, t->d, buf, n); }

fm_status g_norm_axis(int64_t axis, int ndim, int *out) {
    int64_t a = axis < 0 ? axis + ndim : axis;
    if (a < 0 || a >= (ndim ? ndim : 1))
        return fm_set_error(FM_ERR_INVALID, "axis %lld is out of range for %d dims", (long long)axis, ndim);
    *out = (int)a;
    return FM_OK;
}

/* ---- unary ---- */

typedef fm_tensor *(*unary_fn)(fm_tensor *);
typedef fm_tensor *(*binary_fn)(fm_tensor *, fm_tensor *);

static fm_status inf_unary(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    if (in[0].dt == FM_BOOL) return fm_set_error(FM_ERR_INVALID, "needs a numeric input, got bool");
    out[0] = in[0];
    return FM_OK;
}

static fm_status inf_unary_float(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    if (!fm_dtype_is_float(in[0].dt)) return fm_set_error(FM_ERR_INVALID, "needs a floating-point input, got %s", fm_dtype_name(in[0].dt));
    out[0] = in[0];
    return FM_OK;
}

static fm_status inf_unary_any(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_unary(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    out[0] = ((unary_fn)g_op_spec_at(c->n->spec)->fn)(in[0]);
    return out[0] ? FM_OK : fm_last_status();
}

static fm_status run_leaky_relu(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    double s = 0;
    if (ga_float(c, "negative_slope", 0.01, &s)) return fm_last_status();
    out[0] = fm_leaky_relu(in[0], s);
    return out[0] ? FM_OK : fm_last_status();
}

static fm_status run_clamp(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    double lo = 0, hi = 0;
    if (ga_float(c, "min", -INFINITY, &lo) || ga_float(c, "max", INFINITY, &hi)) return fm_last_status();
    out[0] = fm_clamp(in[0], lo, hi);
    return out[0] ? FM_OK : fm_last_status();
}

static fm_status run_identity(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    (void)c;
    out[0] = fm_tensor_retain(in[0]);
    return FM_OK;
}

/* ---- binary (numpy broadcasting, one dtype) ---- */

static fm_status broadcast(const gtype *a, const gtype *b, gtype *o) {
    char s1[96], s2[96];
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    o->ndim = nd;
    for (int i = 0; i < nd; i++) {
        int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
        int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return fm_set_error(FM_ERR_INVALID, "shapes %s and %s do not broadcast", g_tshape(a, s1, sizeof s1), g_tshape(b, s2, sizeof s2));
        o->d[i] = da == 1 ? db : da;
    }
    return FM_OK;
}

static fm_status same_dtype(const gtype *a, const gtype *b) {
    if (a->dt != b->dt)
        return fm_set_error(FM_ERR_INVALID, "inputs have different dtypes (%s and %s); insert a cast", fm_dtype_name(a->dt), fm_dtype_name(b->dt));
    return FM_OK;
}

static fm_status inf_binary(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    if (same_dtype(&in[0], &in[1])) return fm_last_status();
    if (in[0].dt == FM_BOOL) return fm_set_error(FM_ERR_INVALID, "arithmetic on bool inputs; cast them first");
    out[0].dt = in[0].dt;
    return broadcast(&in[0], &in[1], &out[0]);
}

static fm_status inf_compare(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    if (same_dtype(&in[0], &in[1])) return fm_last_status();
    out[0].dt = FM_BOOL;
    return broadcast(&in[0], &in[1], &out[0]);
}

static fm_status run_binary(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    out[0] = ((binary_fn)g_op_spec_at(c->n->spec)->fn)(in[0], in[1]);
    return out[0] ? FM_OK : fm_last_status();
}

static fm_status inf_where(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    if (in[0].dt != FM_BOOL) return fm_set_error(FM_ERR_INVALID, "condition must be bool, got %s", fm_dtype_name(in[0].dt));
    if (same_dtype(&in[1], &in[2])) return fm_last_status();
    gtype t;
    if (broadcast(&in[0], &in[1], &t) || broadcast(&t, &in[2], &out[0])) return fm_last_status();
    out[0].dt = in[1].dt;
    return FM_OK;
}

static fm_status run_where(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    (void)c;
    out[0] = fm_where(in[0], in[1], in[2]);
    return out[0] ? FM_OK : fm_last_status();
}

/* ---- reductions ---- */

typedef fm_tensor *(*reduce_fn)(fm_tensor *, int, const int *, bool);

/* The reduced axes (normalized, no repeats) and keepdim; n_axes == 0: all. */
static fm_status reduce_axes(const gctx *c, int ndim, int *axes, int *n_axes, bool *keepdim) {
    int64_t a[FM_MAX_DIMS], kd = 0;
    int n = 0;
    if (ga_ints(c, "axes", a, &n, FM_MAX_DIMS) || ga_int(c, "keepdim", 0, &kd)) return fm_last_status();
    *keepdim = kd != 0;
    *n_axes = n < 0 ? 0 : n;
    for (int i = 0; i < *n_axes; i++) {
        if (g_norm_axis(a[i], ndim, &axes[i])) return fm_last_status();
        for (int j = 0; j < i; j++)
            if (axes[j] == axes[i]) return fm_set_error(FM_ERR_INVALID, "axis %d is reduced twice", axes[i]);
    }
    return FM_OK;
}

static fm_status inf_reduce(const gctx *c, const gtype *in, gtype *out) {
    int axes[FM_MAX_DIMS], na;
    bool kd = false;
    if (reduce_axes(c, in[0].ndim, axes, &na, &kd)) return fm_last_status();
    const char *op = c->n->op;
    bool need_float = strcmp(op, "sum") && strcmp(op, "amax") && strcmp(op, "amin") && strcmp(op, "prod");
    if (need_float && !fm_dtype_is_float(in[0].dt))
        return fm_set_error(FM_ERR_INVALID, "needs a floating-point input, got %s", fm_dtype_name(in[0].dt));
    unsigned mask = 0;
    for (int i = 0; i < na; i++) mask |= 1u << axes[i];
    if (!na) mask = ~0u;
    out[0].dt = in[0].dt;
    out[0].ndim = 0;
    for (int d = 0; d < in[0].ndim; d++) {
        if (!(mask & (1u << d))) out[0].d[out[0].ndim++] = in[0].d[d];
        else if (kd) out[0].d[out[0].ndim++] = 1;
    }
    return FM_OK;
}

static fm_status run_reduce(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int axes[FM_MAX_DIMS], na;
    bool kd = false;
    if (reduce_axes(c, in[0]->ndim, axes, &na, &kd)) return fm_last_status();
    const char *op = c->n->op;
    if (!strcmp(op, "var") || !strcmp(op, "std")) {
        int64_t corr = 0;
        if (ga_int(c, "correction", 1, &corr)) return fm_last_status();
        out[0] = (!strcmp(op, "var") ? fm_var : fm_std)(in[0], na, axes, (int)corr, kd);
    } else {
        out[0] = ((reduce_fn)g_op_spec_at(c->n->spec)->fn)(in[0], na, axes, kd);
    }
    return out[0] ? FM_OK : fm_last_status();
}

static fm_status inf_argmax(const gctx *c, const gtype *in, gtype *out) {
    int64_t axis = 0, kd = 0;
    int ax = 0;
    if (ga_int(c, "axis", -1, &axis) || ga_int(c, "keepdim", 0, &kd) || g_norm_axis(axis, in[0].ndim, &ax)) return fm_last_status();
    if (in[0].ndim == 0) return fm_set_error(FM_ERR_INVALID, "needs at least 1 dim");
    out[0].dt = FM_I64;
    out[0].ndim = 0;
    for (int d = 0; d < in[0].ndim; d++) {
        if (d != ax) out[0].d[out[0].ndim++] = in[0].d[d];
        else if (kd) out[0].d[out[0].ndim++] = 1;
    }
    return FM_OK;
}

static fm_status run_argmax(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t axis = 0, kd = 0;
    if (ga_int(c, "axis", -1, &axis) || ga_int(c, "keepdim", 0, &kd)) return fm_last_status();
    out[0] = fm_argmax(in[0], (int)axis, kd != 0);
    return out[0] ? FM_OK : fm_last_status();
}

/* cumsum: axis (default 0), exclusive and reverse (0/1): fm_cumsum; the input's shape and dtype. */
static fm_status cumsum_attrs(const gctx *c, int ndim, int *axis, bool *excl, bool *rev) {
    int64_t a = 0, e = 0, r = 0;
    if (ga_int(c, "axis", 0, &a) || ga_int(c, "exclusive", 0, &e) || ga_int(c, "reverse", 0, &r)) return fm_last_status();
    if ((e != 0 && e != 1) || (r != 0 && r != 1))
        return fm_set_error(FM_ERR_INVALID, "attributes 'exclusive' and 'reverse' must be 0 or 1, got %lld and %lld", (long long)e, (long long)r);
    *excl = e != 0;
    *rev = r != 0;
    return g_norm_axis(a, ndim, axis);
}

static fm_status inf_cumsum(const gctx *c, const gtype *in, gtype *out) {
    int axis = 0;
    bool e = false, r = false;
    if (in[0].dt == FM_BOOL) return fm_set_error(FM_ERR_INVALID, "needs a numeric input, got bool");
    if (cumsum_attrs(c, in[0].ndim, &axis, &e, &r)) return fm_last_status();
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_cumsum(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int axis = 0;
    bool e = false, r = false;
    if (cumsum_attrs(c, in[0]->ndim, &axis, &e, &r)) return fm_last_status();
    out[0] = fm_cumsum(in[0], axis, e, r);
    return out[0] ? FM_OK : fm_last_status();
}

/* ---- matmul, linear, softmax ---- */

static fm_status inf_matmul(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    char s1[96], s2[96];
    const gtype *a = &in[0], *b = &in[1];
    if (same_dtype(a, b)) return fm_last_status();
    if (!fm_dtype_is_float(a->dt)) return fm_set_error(FM_ERR_INVALID, "needs floating-point inputs, got %s", fm_dtype_name(a->dt));
    if (a->ndim < 1 || b->ndim < 1) return fm_set_error(FM_ERR_INVALID, "operands need at least 1 dim");
    gtype A = *a, B = *b;
    if (A.ndim == 1) { A.ndim = 2; A.d[1] = a->d[0]; A.d[0] = 1; }
    if (B.ndim == 1) { B.ndim = 2; B.d[1] = 1; B.d[0] = b->d[0]; }
    if (A.d[A.ndim - 1] != B.d[B.ndim - 2])
        return fm_set_error(FM_ERR_INVALID, "inner sizes differ: %s @ %s", g_tshape(a, s1, sizeof s1), g_tshape(b, s2, sizeof s2));
    gtype ba = A, bb = B, bo;
    ba.ndim -= 2;
    bb.ndim -= 2;
    if (broadcast(&ba, &bb, &bo)) return fm_last_status();
    out[0] = bo;
    out[0].dt = a->dt;
    if (a->ndim > 1) out[0].d[out[0].ndim++] = A.d[A.ndim - 2];
    if (b->ndim > 1) out[0].d[out[0].ndim++] = B.d[B.ndim - 1];
    return FM_OK;
}

static fm_status inf_linear(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    char s1[96], s2[96];
    const gtype *x = &in[0], *w = &in[1], *b = &in[2];
    if (same_dtype(x, w) || (b->ndim >= 0 && same_dtype(x, b))) return fm_last_status();
    if (!fm_dtype_is_float(x->dt)) return fm_set_error(FM_ERR_INVALID, "needs floating-point inputs, got %s", fm_dtype_name(x->dt));
    if (w->ndim != 2 || x->ndim < 1 || x->d[x->ndim - 1] != w->d[1])
        return fm_set_error(FM_ERR_INVALID, "input %s does not match weight %s", g_tshape(x, s1, sizeof s1), g_tshape(w, s2, sizeof s2));
    if (b->ndim >= 0 && (b->ndim != 1 || b->d[0] != w->d[0]))
        return fm_set_error(FM_ERR_INVALID, "bias %s does not match weight %s", g_tshape(b, s1, sizeof s1), g_tshape(w, s2, sizeof s2));
    out[0] = *x;
    out[0].d[x->ndim - 1] = w->d[0];
    return FM_OK;
}

static fm_status run_linear(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    (void)c;
    out[0] = fm_linear(in[0], in[1], in[2]);
    return out[0] ? FM_OK : fm_last_status();
}

/* linear_fused (fuse-linear-act): linear's inputs, relu (0/1) or act (fm_linear_fused_act's
 * names), f32 or f64. Node n's activation, or NULL for none, into *act (graph_quant.c keeps
 * it on the quantized node). */
fm_status g_linear_fused_act(const gnode *n, const char **act) {
    const gattr *ra = g_node_attr(n, "relu"), *aa = g_node_attr(n, "act");
    if (ra && ra->type != FM_ATTR_INT) return attr_type_err("relu", "an integer");
    if (aa && aa->type != FM_ATTR_STRING) return attr_type_err("act", "a string");
    const int64_t relu = ra ? ra->i : 0;
    if (relu != 0 && relu != 1) return fm_set_error(FM_ERR_INVALID, "attribute 'relu' must be 0 or 1, got %lld", (long long)relu);
    const char *a = aa ? aa->s : NULL;
    int r = 0, op = -1;
    if (a && fm_linear_act_parse(a, &r, &op)) return fm_last_status();
    if (relu && a && (r || op >= 0)) return fm_set_error(FM_ERR_INVALID, "attributes 'relu' and 'act' both give an activation; keep one");
    *act = relu ? "relu" : a && (r || op >= 0) ? a : NULL;
    return FM_OK;
}
static fm_status fused_act(const gctx *c, const char **act) { return g_linear_fused_act(c->n, act); }

static fm_status inf_linear_fused(const gctx *c, const gtype *in, gtype *out) {
    const char *act = NULL;
    if (fused_act(c, &act) || inf_linear(c, in, out)) return fm_last_status();
    if (in[0].dt != FM_F32 && in[0].dt != FM_F64) return fm_set_error(FM_ERR_INVALID, "input must be f32 or f64, got %s", fm_dtype_name(in[0].dt));
    return FM_OK;
}

/* The graph op named act on y, through the op table's front end (linear_fused's
 * activations are all its one-input elementwise entries: relu, gelu, silu, ...). */
static fm_tensor *act_by_name(const char *act, fm_tensor *y) {
    const int i = g_op_find(act);
    const g_op_spec *sp = i >= 0 ? g_op_spec_at(i) : NULL;
    if (sp && sp->run == run_unary && sp->fn) return ((unary_fn)sp->fn)(y);
    fm_set_error(FM_ERR_INTERNAL, "linear_fused: activation '%s' has no one-input op", act);
    return NULL;
}

/* The fused kernel where the device has it (CPU, check), with the weights packed
 * at load (g_prepare) when they are; elsewhere linear, then the activation's op. */
static fm_status run_linear_fused(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    const char *act = NULL;
    if (fused_act(c, &act)) return fm_last_status();
    fm_device_type dev = fm_tensor_device(in[0]).type;
    if (g_cpu_kernels(dev)) {
        ptrdiff_t i = c->n - c->g->nodes;
        fm_tensor *packed = c->g->prep && i >= 0 && i < c->g->n_prep ? c->g->prep[i] : NULL;
        out[0] = fm_linear_fused_act(in[0], in[1], in[2], packed, act);
        return out[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *y = fm_linear(in[0], in[1], in[2]), *t = NULL;
    if (y && act) t = act_by_name(act, y), fm_tensor_release(y), y = t;
    out[0] = y;
    return y ? FM_OK : fm_last_status();
}

static fm_status inf_softmax(const gctx *c, const gtype *in, gtype *out) {
    int64_t axis = 0;
    int ax = 0;
    if (ga_int(c, "axis", -1, &axis) || g_norm_axis(axis, in[0].ndim, &ax)) return fm_last_status();
    return inf_unary_float(c, in, out);
}

static fm_status run_softmax(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t axis = 0;
    if (ga_int(c, "axis", -1, &axis)) return fm_last_status();
    out[0] = (!strcmp(c->n->op, "softmax") ? fm_softmax : fm_log_softmax)(in[0], (int)axis);
    return out[0] ? FM_OK : fm_last_status();
}

#define FN(f) ((void (*)(void))(f))
#define UN(name, inf) {#name, 1, 1, 1, "", inf, run_unary, FN(fm_##name)}
#define BIN(name, inf) {#name, 2, 2, 1, "", inf, run_binary, FN(fm_##name)}
#define RED(name) {#name, 1, 1, 1, "axes,keepdim", inf_reduce, run_reduce, FN(fm_##name)}
const g_op_spec g_ops_core[] = {
    UN(neg, inf_unary), UN(abs, inf_unary), UN(exp, inf_unary_float), UN(log, inf_unary_float),
    UN(sqrt, inf_unary_float), UN(rsqrt, inf_unary_float), UN(sin, inf_unary_float), UN(cos, inf_unary_float),
    UN(tanh, inf_unary_float), UN(sigmoid, inf_unary_float), UN(relu, inf_unary), UN(gelu, inf_unary_float),
    UN(gelu_tanh, inf_unary_float), UN(silu, inf_unary_float), UN(softplus, inf_unary_float),
    UN(tan, inf_unary_float), UN(asin, inf_unary_float), UN(acos, inf_unary_float), UN(atan, inf_unary_float),
    UN(sinh, inf_unary_float), UN(cosh, inf_unary_float), UN(asinh, inf_unary_float), UN(acosh, inf_unary_float),
    UN(atanh, inf_unary_float), UN(erf, inf_unary_float), UN(floor, inf_unary), UN(ceil, inf_unary),
    UN(round, inf_unary), UN(sign, inf_unary),
    {"leaky_relu", 1, 1, 1, "negative_slope", inf_unary, run_leaky_relu, NULL},
    {"clamp", 1, 1, 1, "min,max", inf_unary, run_clamp, NULL},
    {"identity", 1, 1, 1, "", inf_unary_any, run_identity, NULL},
    {"dropout", 1, 1, 1, "p", inf_unary_any, run_identity, NULL}, /* inference: the identity */
    BIN(add, inf_binary), BIN(sub, inf_binary), BIN(mul, inf_binary), BIN(div, inf_binary), BIN(pow, inf_binary),
    BIN(maximum, inf_binary), BIN(minimum, inf_binary), BIN(fmod, inf_binary), BIN(remainder, inf_binary), BIN(eq, inf_compare), BIN(ne, inf_compare),
    BIN(lt, inf_compare), BIN(le, inf_compare), BIN(gt, inf_compare), BIN(ge, inf_compare),
    {"where", 3, 3, 1, "", inf_where, run_where, NULL},
    RED(sum), RED(mean), RED(amax), RED(amin), RED(logsumexp), RED(prod),
    {"var", 1, 1, 1, "axes,keepdim,correction", inf_reduce, run_reduce, NULL},
    {"std", 1, 1, 1, "axes,keepdim,correction", inf_reduce, run_reduce, NULL},
    {"argmax", 1, 1, 1, "axis,keepdim", inf_argmax, run_argmax, NULL},
    {"cumsum", 1, 1, 1, "axis,exclusive,reverse", inf_cumsum, run_cumsum, NULL},
    {"matmul", 2, 2, 1, "", inf_matmul, run_binary, FN(fm_matmul)},
    {"linear", 2, 3, 1, "", inf_linear, run_linear, NULL},
    {"linear_fused", 2, 3, 1, "relu,act", inf_linear_fused, run_linear_fused, NULL},
    {"softmax", 1, 1, 1, "axis", inf_softmax, run_softmax, NULL},
    {"log_softmax", 1, 1, 1, "axis", inf_softmax, run_softmax, NULL},
};
const int g_n_ops_core = (int)(sizeof g_ops_core / sizeof g_ops_core[0]);

/* ---- lookup over the families ---- */

static const struct { const g_op_spec *t; const int *n; } k_tables[] = {
    {g_ops_core, &g_n_ops_core}, {g_ops_nn, &g_n_ops_nn}, {g_ops_shape, &g_n_ops_shape}, {g_ops_quant, &g_n_ops_quant},
    {g_ops_attn, &g_n_ops_attn}};

int g_op_count(void) { return g_n_ops_core + g_n_ops_nn + g_n_ops_shape + g_n_ops_quant + g_n_ops_attn; }

const g_op_spec *g_op_spec_at(int i) {
    for (size_t t = 0; t < sizeof k_tables / sizeof k_tables[0]; t++) {
        if (i < *k_tables[t].n) return &k_tables[t].t[i];
        i -= *k_tables[t].n;
    }
    return NULL;
}

int g_op_find(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < g_op_count(); i++)
        if (!strcmp(g_op_spec_at(i)->name, name)) return i;
    return -1;
}

bool g_op_is_pointwise(const char *op) {
    int i = g_op_find(op);
    const g_op_spec *sp = i >= 0 ? g_op_spec_at(i) : NULL;
    return sp && (sp->run == run_unary || sp->run == run_leaky_relu || sp->run == run_clamp);
}

bool g_op_is_view(const char *op) {
    static const char *const k_views[] = {"reshape", "permute", "transpose", "slice", "squeeze", "unsqueeze", "flatten", "expand", "identity", "dropout"};
    for (size_t i = 0; op && i < sizeof k_views / sizeof k_views[0]; i++)
        if (!strcmp(op, k_views[i])) return true;
    return false;
}
