/* fm_graph -> .onnx (opset 17): each graph op as one or a few ONNX nodes, the
 * constants as initializers (raw little-endian data), dynamic input dims as
 * dim_params. The message is built with protobuf-c's structs (memory from one
 * arena, freed at the end), packed and written atomically. */
#include "onnx/onnx_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"

#define EXPORT_OPSET 17

typedef struct {
    void **ptrs;
    int n, cap;
    const fm_graph *g;
    Onnx__NodeProto **nodes;
    int n_nodes, cap_nodes;
    Onnx__TensorProto **inits;
    int n_inits, cap_inits;
    int tmp;
    bool oom;
    const char *sym_val[G_MAX_SYMS]; /* each dynamic dim as a [1] int64 value, once read from an input's shape */
} exporter;

static void *ex_alloc(exporter *e, size_t n) {
    if (e->n == e->cap) {
        int cap = e->cap ? 2 * e->cap : 256;
        void **p = realloc(e->ptrs, (size_t)cap * sizeof *p);
        if (!p) { e->oom = true; return NULL; }
        e->ptrs = p, e->cap = cap;
    }
    void *q = calloc(1, n ? n : 1);
    if (!q) { e->oom = true; return NULL; }
    return e->ptrs[e->n++] = q;
}

static char *ex_str(exporter *e, const char *s) {
    char *d = ex_alloc(e, strlen(s) + 1);
    if (d) strcpy(d, s);
    return d;
}

static bool push(exporter *e, void ***arr, int *n, int *cap, void *item) {
    if (!item) return false;
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        void **p = realloc(*arr, (size_t)c * sizeof *p);
        if (!p) { e->oom = true; return false; }
        *arr = p, *cap = c;
    }
    (*arr)[(*n)++] = item;
    return true;
}

static const char *tmp_name(exporter *e) {
    char b[64];
    snprintf(b, sizeof b, "onnx_export_%d", e->tmp++);
    return ex_str(e, b);
}

/* ---- attributes ---- */
static Onnx__AttributeProto *a_int(exporter *e, const char *name, int64_t v) {
    Onnx__AttributeProto *a = ex_alloc(e, sizeof *a);
    if (!a) return NULL;
    onnx__attribute_proto__init(a);
    a->name = ex_str(e, name), a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, a->has_i = 1, a->i = v;
    return a;
}
static Onnx__AttributeProto *a_float(exporter *e, const char *name, double v) {
    Onnx__AttributeProto *a = ex_alloc(e, sizeof *a);
    if (!a) return NULL;
    onnx__attribute_proto__init(a);
    a->name = ex_str(e, name), a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT, a->has_f = 1, a->f = (float)v;
    return a;
}
static Onnx__AttributeProto *a_string(exporter *e, const char *name, const char *v) {
    Onnx__AttributeProto *a = ex_alloc(e, sizeof *a);
    const char *c = ex_str(e, v);
    if (!a || !c) return NULL;
    onnx__attribute_proto__init(a);
    a->name = ex_str(e, name), a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    a->has_s = 1, a->s.len = strlen(c), a->s.data = (uint8_t *)c;
    return a;
}
static Onnx__AttributeProto *a_ints(exporter *e, const char *name, int n, const int64_t *v) {
    Onnx__AttributeProto *a = ex_alloc(e, sizeof *a);
    int64_t *c = ex_alloc(e, (size_t)n * sizeof *c);
    if (!a || !c) return NULL;
    onnx__attribute_proto__init(a);
    memcpy(c, v, (size_t)n * sizeof *c);
    a->name = ex_str(e, name), a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS, a->n_ints = (size_t)n, a->ints = c;
    return a;
}

/* One node: op, inputs, outputs (NULL-terminated lists), attributes. */
static fm_status emit(exporter *e, const char *op, const char *const *ins, const char *const *outs, int n_attr, ...) {
    Onnx__NodeProto *n = ex_alloc(e, sizeof *n);
    if (!n) return fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
    onnx__node_proto__init(n);
    n->op_type = ex_str(e, op);
    while (ins[n->n_input]) n->n_input++;
    while (outs[n->n_output]) n->n_output++;
    n->input = ex_alloc(e, (n->n_input + 1) * sizeof(char *));
    n->output = ex_alloc(e, (n->n_output + 1) * sizeof(char *));
    n->attribute = ex_alloc(e, ((size_t)n_attr + 1) * sizeof(Onnx__AttributeProto *));
    if (!n->input || !n->output || !n->attribute) return fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
    for (size_t i = 0; i < n->n_input; i++) n->input[i] = ex_str(e, ins[i]);
    for (size_t i = 0; i < n->n_output; i++) n->output[i] = ex_str(e, outs[i]);
    va_list ap;
    va_start(ap, n_attr);
    for (int i = 0; i < n_attr; i++) n->attribute[n->n_attribute++] = va_arg(ap, Onnx__AttributeProto *);
    va_end(ap);
    if (!push(e, (void ***)&e->nodes, &e->n_nodes, &e->cap_nodes, n) || e->oom)
        return fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
    return FM_OK;
}

/* An initializer holding t (host copy, raw data); returns its name. */
static const char *add_init(exporter *e, const char *name, const fm_tensor *t) {
    Onnx__TensorProto *tp = ex_alloc(e, sizeof *tp);
    size_t nbytes = fm_tensor_nbytes(t);
    uint8_t *raw = ex_alloc(e, nbytes);
    int64_t *dims = ex_alloc(e, (size_t)(t->ndim + 1) * sizeof *dims);
    if (!tp || !raw || !dims) return NULL;
    onnx__tensor_proto__init(tp);
    if (nbytes && fm_tensor_copy_to_host(t, raw, t->dtype)) return NULL;
    tp->name = ex_str(e, name ? name : tmp_name(e));
    for (int d = 0; d < t->ndim; d++) dims[d] = t->shape[d];
    tp->n_dims = (size_t)t->ndim, tp->dims = dims;
    tp->has_data_type = 1, tp->data_type = onnx_dtype_from_fm(t->dtype);
    tp->has_raw_data = 1, tp->raw_data.len = nbytes, tp->raw_data.data = raw;
    return push(e, (void ***)&e->inits, &e->n_inits, &e->cap_inits, tp) ? tp->name : NULL;
}

static const char *const_i64(exporter *e, int n, const int64_t *v) {
    int64_t sh[1] = {n};
    fm_tensor *t = fm_tensor_from_data(v, 1, sh, FM_I64);
    const char *r = t ? add_init(e, NULL, t) : NULL;
    fm_tensor_release(t);
    return r;
}

static const char *const_scalar(exporter *e, double v, fm_dtype dt) {
    fm_tensor *t = fm_tensor_full(0, NULL, v, dt, FM_CPU);
    const char *r = t ? add_init(e, NULL, t) : NULL;
    fm_tensor_release(t);
    return r;
}

/* ---- graph attributes ---- */
static int64_t at_int(const gnode *n, const char *name, int64_t def) {
    const gattr *a = g_node_attr(n, name);
    return a && a->type == FM_ATTR_INT ? a->i : def;
}
static double at_float(const gnode *n, const char *name, double def) {
    double v = def;
    return g_attr_float(g_node_attr(n, name), name, def, &v) == FM_OK ? v : def;
}
/* Numeric INTS (-1 when absent); a dim expression is refused. */
static int at_ints(const gnode *n, const char *name, int64_t *out, int max) {
    const gattr *a = g_node_attr(n, name);
    if (!a) return -1;
    if (a->type == FM_ATTR_INT) { out[0] = a->i; return 1; }
    if (a->type != FM_ATTR_INTS || a->n > max) return -2;
    for (int i = 0; i < a->n; i++) {
        if (a->ints[i].expr) return -2;
        out[i] = a->ints[i].v;
    }
    return a->n;
}

typedef struct {
    exporter *e;
    const gnode *n;
    const char *in[FM_GRAPH_MAX_NODE_IO + 1], *out[4];
    const gtype *t0; /* the first input's type */
} xnode;

/* Input k when given: NULL when the node has fewer inputs or names it "" (absent). */
static const char *opt_in(const xnode *x, int k) { return k < x->n->n_in && x->in[k] && *x->in[k] ? x->in[k] : NULL; }

#define EMIT(op, NA, ...) emit(x->e, op, (const char *[]){__VA_ARGS__}, NA)
#define INS(...) (const char *[]){__VA_ARGS__, NULL}
#define OUTS(...) (const char *[]){__VA_ARGS__, NULL}

static fm_status x_gelu(xnode *x, bool tanh_form, const char *in, const char *out) {
    exporter *e = x->e;
    fm_dtype dt = x->t0->dt;
    const char *a = tmp_name(e), *b = tmp_name(e), *c = tmp_name(e), *d = tmp_name(e);
    fm_status s;
    if (!tanh_form) { /* 0.5 x (1 + erf(x / sqrt 2)) */
        s = emit(e, "Div", INS(in, const_scalar(e, sqrt(2.0), dt)), OUTS(a), 0);
        if (!s) s = emit(e, "Erf", INS(a), OUTS(b), 0);
    } else { /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
        const char *x2 = tmp_name(e), *x3 = tmp_name(e), *k = tmp_name(e), *sum = tmp_name(e);
        s = emit(e, "Mul", INS(in, in), OUTS(x2), 0);
        if (!s) s = emit(e, "Mul", INS(x2, in), OUTS(x3), 0);
        if (!s) s = emit(e, "Mul", INS(x3, const_scalar(e, 0.044715, dt)), OUTS(k), 0);
        if (!s) s = emit(e, "Add", INS(in, k), OUTS(sum), 0);
        if (!s) s = emit(e, "Mul", INS(sum, const_scalar(e, sqrt(2.0 / M_PI), dt)), OUTS(a), 0);
        if (!s) s = emit(e, "Tanh", INS(a), OUTS(b), 0);
    }
    if (!s) s = emit(e, "Add", INS(b, const_scalar(e, 1.0, dt)), OUTS(c), 0);
    if (!s) s = emit(e, "Mul", INS(in, c), OUTS(d), 0);
    if (!s) s = emit(e, "Mul", INS(d, const_scalar(e, 0.5, dt)), OUTS(out), 0);
    return s;
}

/* Constant ones or zeros of shape [n] (absent norm weights). */
static const char *const_fill_shape(exporter *e, int nd, const int64_t *shape, double v, fm_dtype dt) {
    fm_tensor *t = fm_tensor_full(nd, shape, v, dt, FM_CPU);
    const char *r = t ? add_init(e, NULL, t) : NULL;
    fm_tensor_release(t);
    return r;
}
static const char *const_fill(exporter *e, int64_t n, double v, fm_dtype dt) { return const_fill_shape(e, 1, &n, v, dt); }

static fm_status x_norm(xnode *x, const char *op) {
    exporter *e = x->e;
    double eps = at_float(x->n, "eps", 1e-5);
    if (!strcmp(op, "batch_norm")) {
        if (strcmp(g_node_attr(x->n, "layout") && g_node_attr(x->n, "layout")->s ? g_node_attr(x->n, "layout")->s : "NCHW", "NCHW"))
            return fm_set_error(FM_ERR_UNSUPPORTED, "NHWC batch_norm has no ONNX form");
        int64_t c = x->t0->d[1];
        const char *w = opt_in(x, 1) ? x->in[1] : const_fill(e, c, 1, x->t0->dt), *b = opt_in(x, 2) ? x->in[2] : const_fill(e, c, 0, x->t0->dt);
        return emit(e, "BatchNormalization", INS(x->in[0], w, b, x->in[3], x->in[4]), OUTS(x->out[0]), 1, a_float(e, "epsilon", eps));
    }
    if (!strcmp(op, "rms_norm")) { /* x / sqrt(mean(x^2) + eps) * w */
        const char *sq = tmp_name(e), *ms = tmp_name(e), *ad = tmp_name(e), *rt = tmp_name(e), *rc = tmp_name(e);
        const char *nx = opt_in(x, 1) ? tmp_name(e) : x->out[0];
        int64_t last = -1;
        fm_status s = emit(e, "Mul", INS(x->in[0], x->in[0]), OUTS(sq), 0);
        if (!s) s = emit(e, "ReduceMean", INS(sq), OUTS(ms), 2, a_ints(e, "axes", 1, &last), a_int(e, "keepdims", 1));
        if (!s) s = emit(e, "Add", INS(ms, const_scalar(e, eps, x->t0->dt)), OUTS(ad), 0);
        if (!s) s = emit(e, "Sqrt", INS(ad), OUTS(rt), 0);
        if (!s) s = emit(e, "Reciprocal", INS(rt), OUTS(rc), 0);
        if (!s) s = emit(e, "Mul", INS(x->in[0], rc), OUTS(nx), 0);
        if (!s && opt_in(x, 1)) s = emit(e, "Mul", INS(nx, x->in[1]), OUTS(x->out[0]), 0);
        return s;
    }
    /* layer_norm, add_layer_norm (sum = x + h first) */
    bool add = !strcmp(op, "add_layer_norm");
    int64_t nn = add ? 1 : at_int(x->n, "n_norm_dims", 1);
    const char *src = x->in[0];
    fm_status s = FM_OK;
    if (add) {
        src = x->out[0];
        s = emit(e, "Add", INS(x->in[0], opt_in(x, 1) ? x->in[1] : x->in[0]), OUTS(src), 0);
        if (!opt_in(x, 1)) return fm_set_error(FM_ERR_UNSUPPORTED, "add_layer_norm without h has no ONNX form");
    }
    const int iw = add ? 2 : 1; /* inputs past the node's own count are absent */
    const char *w = x->n->n_in > iw ? x->in[iw] : "", *b = x->n->n_in > iw + 1 ? x->in[iw + 1] : "";
    if (!*w) w = const_fill_shape(e, (int)nn, x->t0->d + x->t0->ndim - nn, 1, x->t0->dt); /* the normalized dims' shape */
    const char *y = add ? x->out[1] : x->out[0];
    if (!s) s = *b ? emit(e, "LayerNormalization", INS(src, w, b), OUTS(y), 2, a_int(e, "axis", -nn), a_float(e, "epsilon", eps))
                   : emit(e, "LayerNormalization", INS(src, w), OUTS(y), 2, a_int(e, "axis", -nn), a_float(e, "epsilon", eps));
    return s;
}

static fm_status x_conv_pool(xnode *x, const char *op) {
    exporter *e = x->e;
    const gattr *lay = g_node_attr(x->n, "layout");
    if (lay && lay->s && strcmp(lay->s, "NCHW")) return fm_set_error(FM_ERR_UNSUPPORTED, "NHWC has no ONNX form here");
    int64_t st[2] = {1, 1}, pd[2] = {0, 0}, dl[2] = {1, 1}, k[2] = {0, 0}, pads[4];
    int n;
    if ((n = at_ints(x->n, "stride", st, 2)) == 1) st[1] = st[0];
    if ((n = at_ints(x->n, "padding", pd, 2)) == 1) pd[1] = pd[0];
    if ((n = at_ints(x->n, "dilation", dl, 2)) == 1) dl[1] = dl[0];
    pads[0] = pads[2] = pd[0], pads[1] = pads[3] = pd[1];
    if (!strcmp(op, "conv2d") || !strcmp(op, "conv2d_fused")) { /* fused: Conv, then Relu and MaxPool */
        const int64_t relu = at_int(x->n, "relu", 0), pool = at_int(x->n, "pool", 0), kp[2] = {pool, pool}, p0[4] = {0, 0, 0, 0};
        const double hi = at_float(x->n, "max", INFINITY); /* ReLU6: Clip(0, 6) */
        const bool act = relu || hi < INFINITY;
        const char *ins[4] = {x->in[0], x->in[1], opt_in(x, 2), NULL};
        const char *c = act || pool > 1 ? tmp_name(e) : x->out[0], *r = act && pool > 1 ? tmp_name(e) : x->out[0];
        fm_status s = emit(e, "Conv", ins, OUTS(c), 4, a_ints(e, "strides", 2, st), a_ints(e, "pads", 4, pads),
                           a_ints(e, "dilations", 2, dl), a_int(e, "group", at_int(x->n, "groups", 1)));
        if (!s && hi < INFINITY)
            s = emit(e, "Clip", INS(c, const_scalar(e, relu ? 0.0 : -INFINITY, x->t0->dt), const_scalar(e, hi, x->t0->dt)), OUTS(r), 0), c = r;
        else if (!s && relu) s = emit(e, "Relu", INS(c), OUTS(r), 0), c = r;
        if (!s && pool > 1)
            s = emit(e, "MaxPool", INS(c), OUTS(x->out[0]), 3, a_ints(e, "kernel_shape", 2, kp), a_ints(e, "strides", 2, kp),
                     a_ints(e, "pads", 4, p0));
        return s;
    }
    if (!strcmp(op, "conv_transpose2d")) {
        int64_t opd[2] = {0, 0};
        if (at_ints(x->n, "output_padding", opd, 2) == 1) opd[1] = opd[0];
        const char *ins[4] = {x->in[0], x->in[1], opt_in(x, 2), NULL};
        return emit(e, "ConvTranspose", ins, OUTS(x->out[0]), 5, a_ints(e, "strides", 2, st), a_ints(e, "pads", 4, pads),
                    a_ints(e, "dilations", 2, dl), a_int(e, "group", at_int(x->n, "groups", 1)), a_ints(e, "output_padding", 2, opd));
    }
    if ((n = at_ints(x->n, "kernel", k, 2)) == 1) k[1] = k[0];
    if (at_ints(x->n, "stride", st, 2) < 0) st[0] = k[0], st[1] = k[1];
    const int64_t ceil_mode = at_int(x->n, "ceil_mode", 0);
    if (!strcmp(op, "max_pool2d"))
        return emit(e, "MaxPool", INS(x->in[0]), OUTS(x->out[0]), 4, a_ints(e, "kernel_shape", 2, k), a_ints(e, "strides", 2, st),
                    a_ints(e, "pads", 4, pads), a_int(e, "ceil_mode", ceil_mode));
    return emit(e, "AveragePool", INS(x->in[0]), OUTS(x->out[0]), 5, a_ints(e, "kernel_shape", 2, k), a_ints(e, "strides", 2, st),
                a_ints(e, "pads", 4, pads), a_int(e, "count_include_pad", at_int(x->n, "count_include_pad", 1)),
                a_int(e, "ceil_mode", ceil_mode));
}

static fm_status x_reduce(xnode *x, const char *op) {
    exporter *e = x->e;
    int64_t ax[FM_MAX_DIMS];
    int n = at_ints(x->n, "axes", ax, FM_MAX_DIMS);
    if (n == -2) return fm_set_error(FM_ERR_UNSUPPORTED, "bad axes");
    int64_t keep = at_int(x->n, "keepdim", 0);
    if (!strcmp(op, "argmax"))
        return emit(e, "ArgMax", INS(x->in[0]), OUTS(x->out[0]), 2, a_int(e, "axis", at_int(x->n, "axis", -1)), a_int(e, "keepdims", keep));
    if (!strcmp(op, "sum")) {
        if (n <= 0) return emit(e, "ReduceSum", INS(x->in[0]), OUTS(x->out[0]), 1, a_int(e, "keepdims", keep));
        return emit(e, "ReduceSum", INS(x->in[0], const_i64(e, n, ax)), OUTS(x->out[0]), 1, a_int(e, "keepdims", keep));
    }
    const char *o = !strcmp(op, "mean") ? "ReduceMean" : !strcmp(op, "amax") ? "ReduceMax" : !strcmp(op, "amin") ? "ReduceMin"
                  : !strcmp(op, "prod") ? "ReduceProd" : "ReduceLogSumExp";
    if (n <= 0) return emit(e, o, INS(x->in[0]), OUTS(x->out[0]), 1, a_int(e, "keepdims", keep));
    return emit(e, o, INS(x->in[0]), OUTS(x->out[0]), 2, a_ints(e, "axes", n, ax), a_int(e, "keepdims", keep));
}

/* ---- dynamic dims: a graph dim expression ("past", "past+seq") as ONNX nodes over
 * the inputs' shapes, each value a [1] int64 tensor ---- */
static const char *sym_value(exporter *e, const char *name) {
    const fm_graph *g = e->g;
    int s = g_find_sym(g, name);
    if (s < 0) { fm_set_error(FM_ERR_INVALID, "dim '%s' is not a dynamic dim of any graph input", name); return NULL; }
    if (e->sym_val[s]) return e->sym_val[s];
    for (int i = 0; i < g->n_inputs; i++) {
        const gvalue *v = &g->values[g->inputs[i]];
        for (int d = 0; d < v->t.ndim; d++)
            if (v->sym[d] == s) {
                const char *o = tmp_name(e);
                if (emit(e, "Shape", INS(v->name), OUTS(o), 2, a_int(e, "start", d), a_int(e, "end", d + 1))) return NULL;
                return e->sym_val[s] = o;
            }
    }
    fm_set_error(FM_ERR_INVALID, "dim '%s' has no graph input to read it from", name);
    return NULL;
}

typedef struct { exporter *e; const char *s, *p; } xexpr;

static const char *xe_factor(xexpr *x) {
    while (*x->p == ' ') x->p++;
    char name[65];
    int n = 0;
    if (isdigit((unsigned char)*x->p)) {
        int64_t v = 0;
        while (isdigit((unsigned char)*x->p) && v < (INT64_C(1) << 40)) v = v * 10 + (*x->p++ - '0');
        return const_i64(x->e, 1, &v);
    }
    while ((isalnum((unsigned char)*x->p) || *x->p == '_') && n < 64) name[n++] = *x->p++;
    name[n] = 0;
    if (!n) { fm_set_error(FM_ERR_INVALID, "dim expression '%s': expected a number or a name", x->s); return NULL; }
    return sym_value(x->e, name);
}

static const char *xe_binary(xexpr *x, const char *op, const char *a, const char *b) {
    const char *o = a && b ? tmp_name(x->e) : NULL;
    return o && !emit(x->e, op, INS(a, b), OUTS(o), 0) ? o : NULL;
}

static const char *xe_term(xexpr *x) {
    const char *t = xe_factor(x);
    for (;;) {
        while (*x->p == ' ') x->p++;
        if (!t || *x->p != '*') return t;
        x->p++;
        t = xe_binary(x, "Mul", t, xe_factor(x));
    }
}

/* A dim expression as a [1] int64 value. */
static const char *expr_value(exporter *e, const char *expr) {
    xexpr x = {e, expr, expr};
    const char *t = xe_term(&x);
    for (;;) {
        while (*x.p == ' ') x.p++;
        if (!t || !*x.p) return t;
        char op = *x.p++;
        if (op != '+' && op != '-') { fm_set_error(FM_ERR_INVALID, "dim expression '%s': expected + - or *", x.s); return NULL; }
        t = xe_binary(&x, op == '+' ? "Add" : "Sub", t, xe_term(&x));
    }
}

/* One INTS attribute element as a [1] int64 value: a constant, or its expression. */
static const char *dim_value(exporter *e, const gattr *a) {
    if (a->type == FM_ATTR_INT) return const_i64(e, 1, &a->i);
    if (a->type != FM_ATTR_INTS || a->n != 1) { fm_set_error(FM_ERR_UNSUPPORTED, "a bound of %d values", a->n); return NULL; }
    return a->ints[0].expr ? expr_value(e, a->ints[0].expr) : const_i64(e, 1, &a->ints[0].v);
}

/* A reshape's or expand's "shape" with dim expressions among its sizes: the sizes
 * concatenated into one int64 vector (constants, and each expression over the
 * inputs' shapes); expand's -1 (keep) as 1, which ONNX's two-way broadcast keeps. */
static const char *shape_value(exporter *e, const gattr *a, bool expand) {
    const char *parts[FM_MAX_DIMS + 1] = {0}; /* NULL-terminated, as emit reads its inputs */
    if (a->type != FM_ATTR_INTS || a->n < 1 || a->n > FM_MAX_DIMS) { fm_set_error(FM_ERR_UNSUPPORTED, "a shape of %d sizes", a->n); return NULL; }
    for (int k = 0; k < a->n; k++) {
        const int64_t v = expand && a->ints[k].v < 0 ? 1 : a->ints[k].v;
        if (!(parts[k] = a->ints[k].expr ? expr_value(e, a->ints[k].expr) : const_i64(e, 1, &v))) return NULL;
    }
    const char *o = tmp_name(e);
    return emit(e, "Concat", parts, OUTS(o), 1, a_int(e, "axis", 0)) ? NULL : o;
}

/* qkv [B, T, (H + 2 KV) D] -> q [B, H, T, D], k, v [B, KV, T, D]: Split, then
 * Reshape [0, 0, h, D] and Transpose (0, 2, 1, 3) for each. */
static fm_status x_qkv_split_heads(xnode *x) {
    exporter *e = x->e;
    int64_t H = at_int(x->n, "n_head", 0), KV = at_int(x->n, "n_kv_head", H), C = x->t0->d[2];
    if (H < 1 || KV < 1 || C % (H + 2 * KV)) return fm_set_error(FM_ERR_INVALID, "qkv_split_heads: bad head counts");
    int64_t D = C / (H + 2 * KV), sizes[3] = {H * D, KV * D, KV * D}, heads[3] = {H, KV, KV}, perm[4] = {0, 2, 1, 3};
    const char *part[3] = {tmp_name(e), tmp_name(e), tmp_name(e)};
    fm_status s = emit(e, "Split", INS(x->in[0], const_i64(e, 3, sizes)), OUTS(part[0], part[1], part[2]), 1, a_int(e, "axis", 2));
    for (int i = 0; i < 3 && !s; i++) {
        int64_t sh[4] = {0, 0, heads[i], D};
        const char *r = tmp_name(e);
        s = emit(e, "Reshape", INS(part[i], const_i64(e, 4, sh)), OUTS(r), 0);
        if (!s) s = emit(e, "Transpose", INS(r), OUTS(x->out[i]), 1, a_ints(e, "perm", 4, perm));
    }
    return s;
}

/* k or v [B, KV, L, D] with each head repeated H / KV times -> [B, H, L, D] */
static const char *repeat_kv(exporter *e, const char *t, int64_t H, int64_t KV, int64_t D) {
    if (H == KV) return t;
    int64_t ax = 2, ex[5] = {1, 1, H / KV, 1, 1}, sh[4] = {0, H, -1, D};
    const char *u = tmp_name(e), *x = tmp_name(e), *r = tmp_name(e);
    if (emit(e, "Unsqueeze", INS(t, const_i64(e, 1, &ax)), OUTS(u), 0) || emit(e, "Expand", INS(u, const_i64(e, 5, ex)), OUTS(x), 0) ||
        emit(e, "Reshape", INS(x, const_i64(e, 4, sh)), OUTS(r), 0))
        return NULL;
    return r;
}

/* The causal mask on the scaled scores ss of q [B, H, T, D] against k [B, H, L, D] into out:
 * query i sees keys j <= i + (L - T) (shifted: causal_attention's queries are the last T
 * positions) or j <= i (scaled_dot_product_attention's top-left mask). Built from Range over T
 * and L, so one file serves every length. */
static fm_status x_causal_mask(exporter *e, const char *q, const char *k, const char *ss, bool shifted, fm_dtype dt, const char *out) {
    const int64_t one = 1;
    const char *T = tmp_name(e), *L = tmp_name(e), *Ts = tmp_name(e), *Ls = tmp_name(e), *off = tmp_name(e), *rows = tmp_name(e),
               *cols = tmp_name(e), *rows2 = tmp_name(e), *lim = shifted ? tmp_name(e) : rows2, *cond = tmp_name(e);
    const char *zero = const_scalar(e, 0, FM_I64), *step = const_scalar(e, 1, FM_I64);
    fm_status s = emit(e, "Shape", INS(q), OUTS(T), 2, a_int(e, "start", 2), a_int(e, "end", 3));
    if (!s) s = emit(e, "Shape", INS(k), OUTS(L), 2, a_int(e, "start", 2), a_int(e, "end", 3));
    if (!s) s = emit(e, "Squeeze", INS(T), OUTS(Ts), 0);
    if (!s) s = emit(e, "Squeeze", INS(L), OUTS(Ls), 0);
    if (!s) s = emit(e, "Range", INS(zero, Ts, step), OUTS(rows), 0);
    if (!s) s = emit(e, "Range", INS(zero, Ls, step), OUTS(cols), 0);
    if (!s) s = emit(e, "Unsqueeze", INS(rows, const_i64(e, 1, &one)), OUTS(rows2), 0);
    if (!s && shifted) s = emit(e, "Sub", INS(Ls, Ts), OUTS(off), 0);
    if (!s && shifted) s = emit(e, "Add", INS(rows2, off), OUTS(lim), 0);
    if (!s) s = emit(e, "LessOrEqual", INS(cols, lim), OUTS(cond), 0);
    if (!s) s = emit(e, "Where", INS(cond, ss, const_scalar(e, -INFINITY, dt)), OUTS(out), 0);
    return s;
}

/* causal_attention (mask 2: q [B, H, T, D] against k, v [B, KV, L, D], the queries being the
 * last T positions: query i sees keys j <= L - T + i) and scaled_dot_product_attention (its
 * causal flag: mask 1, top-left, j <= i; else 0, none): scores, the mask, Softmax, values. */
static fm_status x_attention(xnode *x, int mask) {
    exporter *e = x->e;
    const gtype *kt = &e->g->values[x->n->in[1]].t;
    int64_t H = x->t0->d[1], D = x->t0->d[3], KV = kt->d[1], perm[4] = {0, 1, 3, 2};
    double scale = at_float(x->n, "scale", 0);
    if (scale <= 0) scale = 1.0 / sqrt((double)D);
    const char *k = repeat_kv(e, x->in[1], H, KV, D), *v = k ? repeat_kv(e, x->in[2], H, KV, D) : NULL;
    if (!v) return fm_last_status();
    const char *ktr = tmp_name(e), *sc = tmp_name(e), *ss = tmp_name(e), *msk = mask ? tmp_name(e) : ss, *p = tmp_name(e);
    fm_status s = emit(e, "Transpose", INS(k), OUTS(ktr), 1, a_ints(e, "perm", 4, perm));
    if (!s) s = emit(e, "MatMul", INS(x->in[0], ktr), OUTS(sc), 0);
    if (!s) s = emit(e, "Mul", INS(sc, const_scalar(e, scale, x->t0->dt)), OUTS(ss), 0);
    if (!s && mask) s = x_causal_mask(e, x->in[0], k, ss, mask == 2, x->t0->dt, msk);
    if (!s) s = emit(e, "Softmax", INS(msk), OUTS(p), 1, a_int(e, "axis", -1));
    if (!s) s = emit(e, "MatMul", INS(p, v), OUTS(x->out[0]), 0);
    return s;
}

static fm_status x_causal_attention(xnode *x) { return x_attention(x, 2); }

/* scatter as ScatterElements, scatter_nd as ScatterND; opset 17 takes the reductions none,
 * add and mul (max and min came in 18). */
static fm_status x_scatter(xnode *x, const char *op) {
    const gattr *a = g_node_attr(x->n, "reduce");
    const char *r = a && a->s ? a->s : "none";
    if (strcmp(r, "none") && strcmp(r, "add") && strcmp(r, "mul"))
        return fm_set_error(FM_ERR_UNSUPPORTED, "reduce '%s' has no ONNX form at opset 17 (ScatterElements and ScatterND took max and min in 18)", r);
    if (op[7] == '_') return emit(x->e, "ScatterND", INS(x->in[0], x->in[1], x->in[2]), OUTS(x->out[0]), 1, a_string(x->e, "reduction", r));
    return emit(x->e, "ScatterElements", INS(x->in[0], x->in[1], x->in[2]), OUTS(x->out[0]), 2, a_int(x->e, "axis", at_int(x->n, "axis", 0)),
                a_string(x->e, "reduction", r));
}

static fm_status x_shape(xnode *x, const char *op) {
    exporter *e = x->e;
    int64_t v[FM_MAX_DIMS];
    int nd = x->t0->ndim, n;
    if (!strcmp(op, "reshape") || !strcmp(op, "expand")) {
        if ((n = at_ints(x->n, "shape", v, FM_MAX_DIMS)) == -2) { /* dim expressions: the shape from the inputs' */
            const char *sh = shape_value(e, g_node_attr(x->n, "shape"), op[0] == 'e');
            return sh ? emit(e, op[0] == 'r' ? "Reshape" : "Expand", INS(x->in[0], sh), OUTS(x->out[0]), 0) : fm_last_status();
        }
        if (n < 0) return fm_set_error(FM_ERR_INVALID, "attribute 'shape' is required");
        if (op[0] == 'e')
            for (int i = 0; i < n; i++) v[i] = v[i] < 0 ? 1 : v[i]; /* Expand broadcasts both ways: 1 keeps the size */
        return emit(e, op[0] == 'r' ? "Reshape" : "Expand", INS(x->in[0], const_i64(e, n, v)), OUTS(x->out[0]), 0);
    }
    if (!strcmp(op, "permute") || !strcmp(op, "transpose")) {
        if (op[0] == 't') {
            int64_t a = at_int(x->n, "dim0", 0), b = at_int(x->n, "dim1", 1);
            a = a < 0 ? a + nd : a, b = b < 0 ? b + nd : b;
            for (int i = 0; i < nd; i++) v[i] = i == a ? b : i == b ? a : i;
        } else if (at_ints(x->n, "perm", v, FM_MAX_DIMS) != nd) return fm_set_error(FM_ERR_INVALID, "bad perm");
        return emit(e, "Transpose", INS(x->in[0]), OUTS(x->out[0]), 1, a_ints(e, "perm", nd, v));
    }
    if (!strcmp(op, "slice")) { /* bounds may be dim expressions (the GPT's positions past .. past+seq) */
        int64_t st = 0, en = INT64_MAX, ax = at_int(x->n, "axis", 0), sp = at_int(x->n, "step", 1);
        const gattr *as = g_node_attr(x->n, "start"), *ae = g_node_attr(x->n, "end");
        const char *sv = as ? dim_value(e, as) : const_i64(e, 1, &st), *ev = ae ? dim_value(e, ae) : const_i64(e, 1, &en);
        if (!sv || !ev) return fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
        return emit(e, "Slice", INS(x->in[0], sv, ev, const_i64(e, 1, &ax), const_i64(e, 1, &sp)), OUTS(x->out[0]), 0);
    }
    if (!strcmp(op, "unsqueeze") || !strcmp(op, "squeeze")) {
        v[0] = at_int(x->n, "axis", 0);
        return emit(e, op[0] == 'u' ? "Unsqueeze" : "Squeeze", INS(x->in[0], const_i64(e, 1, v)), OUTS(x->out[0]), 0);
    }
    if (!strcmp(op, "flatten")) {
        int64_t s = at_int(x->n, "start", 0), en = at_int(x->n, "end", -1);
        s = s < 0 ? s + nd : s, en = en < 0 ? en + nd : en;
        if (en != nd - 1) return fm_set_error(FM_ERR_UNSUPPORTED, "flatten short of the last dim has no ONNX form here");
        for (int i = 0; i < s; i++) v[i] = 0;
        v[s] = -1;
        return emit(e, "Reshape", INS(x->in[0], const_i64(e, (int)s + 1, v)), OUTS(x->out[0]), 0);
    }
    if (!strcmp(op, "cat")) return emit(e, "Concat", x->in, OUTS(x->out[0]), 1, a_int(e, "axis", at_int(x->n, "axis", 0)));
    if (!strcmp(op, "pad")) {
        int64_t p[2 * FM_MAX_DIMS];
        const gattr *m = g_node_attr(x->n, "mode");
        const char *mode = m && m->type == FM_ATTR_STRING ? m->s : "constant";
        if (at_ints(x->n, "pads", p, 2 * FM_MAX_DIMS) != 2 * nd) return fm_set_error(FM_ERR_INVALID, "pad without its pads");
        if (!strcmp(mode, "wrap")) return fm_set_error(FM_ERR_UNSUPPORTED, "pad mode 'wrap' has no ONNX form at opset 17 (Pad took it in 19)");
        return emit(e, "Pad", INS(x->in[0], const_i64(e, 2 * nd, p), const_scalar(e, at_float(x->n, "value", 0.0), x->t0->dt)),
                    OUTS(x->out[0]), 1, a_string(e, "mode", mode));
    }
    if (!strcmp(op, "cast")) {
        const gattr *a = g_node_attr(x->n, "dtype");
        fm_dtype dt;
        if (!a || !a->s || fm_dtype_from_name(a->s, &dt)) return fm_set_error(FM_ERR_INVALID, "cast without a dtype");
        return emit(e, "Cast", INS(x->in[0]), OUTS(x->out[0]), 1, a_int(e, "to", onnx_dtype_from_fm(dt)));
    }
    if (!strcmp(op, "embedding")) return emit(e, "Gather", INS(x->in[0], x->in[1]), OUTS(x->out[0]), 0);
    if (!strcmp(op, "scatter") || !strcmp(op, "scatter_nd")) return x_scatter(x, op);
    if (!strcmp(op, "index_select") || !strcmp(op, "gather"))
        return emit(e, op[0] == 'i' ? "Gather" : "GatherElements", INS(x->in[0], x->in[1]), OUTS(x->out[0]), 1,
                    a_int(e, "axis", at_int(x->n, "axis", 0)));
    return fm_set_error(FM_ERR_UNSUPPORTED, "no ONNX form");
}

/* fmod as Mod fmod=1; remainder as Mod fmod=0 on integers, and on floats (which ONNX's Mod
 * takes with fmod=1 only) as r = Mod(a, b, fmod=1) moved by b where r != 0 and r, b differ in sign. */
static fm_status x_mod(xnode *x, const char *op) {
    exporter *e = x->e;
    const bool fl = fm_dtype_is_float(x->t0->dt);
    if (op[0] == 'f' || !fl) return emit(e, "Mod", INS(x->in[0], x->in[1]), OUTS(x->out[0]), 1, a_int(e, "fmod", op[0] == 'f'));
    const char *z = const_scalar(e, 0, x->t0->dt), *r = tmp_name(e), *rz = tmp_name(e), *nz = tmp_name(e), *rn = tmp_name(e);
    const char *bn = tmp_name(e), *sx = tmp_name(e), *fix = tmp_name(e), *rb = tmp_name(e);
    return emit(e, "Mod", INS(x->in[0], x->in[1]), OUTS(r), 1, a_int(e, "fmod", 1)) || emit(e, "Equal", INS(r, z), OUTS(rz), 0) ||
           emit(e, "Not", INS(rz), OUTS(nz), 0) || emit(e, "Less", INS(r, z), OUTS(rn), 0) || emit(e, "Less", INS(x->in[1], z), OUTS(bn), 0) ||
           emit(e, "Xor", INS(rn, bn), OUTS(sx), 0) || emit(e, "And", INS(nz, sx), OUTS(fix), 0) ||
           emit(e, "Add", INS(r, x->in[1]), OUTS(rb), 0) || emit(e, "Where", INS(fix, rb, r), OUTS(x->out[0]), 0);
}

/* rope(x, cos, sin) as the rotate-half composition it fused: the halves of x's last axis (D),
 * Neg, Concat, two Muls and an Add. */
static fm_status x_rope(exporter *e, const char *x, const char *cs, const char *sn, int64_t D, const char *y) {
    const int64_t last = -1, z = 0, h = D / 2, d = D;
    const char *ax = const_i64(e, 1, &last), *x1 = tmp_name(e), *x2 = tmp_name(e), *n2 = tmp_name(e), *rot = tmp_name(e), *a = tmp_name(e), *b = tmp_name(e);
    return emit(e, "Slice", INS(x, const_i64(e, 1, &z), const_i64(e, 1, &h), ax), OUTS(x1), 0) ||
                   emit(e, "Slice", INS(x, const_i64(e, 1, &h), const_i64(e, 1, &d), ax), OUTS(x2), 0) || emit(e, "Neg", INS(x2), OUTS(n2), 0) ||
                   emit(e, "Concat", INS(n2, x1), OUTS(rot), 1, a_int(e, "axis", -1)) || emit(e, "Mul", INS(x, cs), OUTS(a), 0) ||
                   emit(e, "Mul", INS(rot, sn), OUTS(b), 0) || emit(e, "Add", INS(a, b), OUTS(y), 0)
               ? fm_last_status()
               : FM_OK;
}

/* attention_kv (fathom compile's fuse-attention): the split, the two cache Concats,
 * causal_attention and the head merge it stands for. */
static fm_status x_attention_kv(xnode *x) {
    exporter *e = x->e;
    const gtype *qkv = x->t0;
    int64_t H = at_int(x->n, "n_head", 0), KV = at_int(x->n, "n_kv_head", H);
    if (qkv->ndim != 3 || H < 1 || KV < 1 || qkv->d[2] % (H + 2 * KV)) return fm_set_error(FM_ERR_INVALID, "attention_kv: bad head counts");
    int64_t D = qkv->d[2] / (H + 2 * KV), perm[4] = {0, 2, 1, 3}, sh[3] = {0, 0, H * D};
    xnode s = *x, a = *x;
    s.out[0] = tmp_name(e), s.out[1] = tmp_name(e), s.out[2] = tmp_name(e);
    gtype qt = {qkv->dt, 4, {qkv->d[0], H, qkv->d[1], D}};
    a.in[0] = s.out[0], a.in[1] = x->out[1], a.in[2] = x->out[2], a.out[0] = tmp_name(e), a.t0 = &qt;
    const char *t = tmp_name(e);
    fm_status st = x_qkv_split_heads(&s);
    if (x->n->n_in > 3) { /* q and k rotated first (the ropes fuse-attention took in) */
        const char *qr = tmp_name(e), *kr = tmp_name(e);
        if (!st) st = x_rope(e, s.out[0], x->in[3], x->in[4], D, qr);
        if (!st) st = x_rope(e, s.out[1], x->in[3], x->in[4], D, kr);
        a.in[0] = qr, s.out[1] = kr;
    }
    if (!st) st = emit(e, "Concat", INS(x->in[1], s.out[1]), OUTS(x->out[1]), 1, a_int(e, "axis", 2));
    if (!st) st = emit(e, "Concat", INS(x->in[2], s.out[2]), OUTS(x->out[2]), 1, a_int(e, "axis", 2));
    if (!st) st = x_causal_attention(&a);
    if (!st) st = emit(e, "Transpose", INS(a.out[0]), OUTS(t), 1, a_ints(e, "perm", 4, perm));
    if (!st) st = emit(e, "Reshape", INS(t, const_i64(e, 3, sh)), OUTS(x->out[0]), 0);
    return st;
}

/* ew_chain: its steps as ONNX ops, one after the other (x: the chain's input). */
static fm_status x_ew_chain(xnode *x) {
    exporter *e = x->e;
    const gattr *ops = g_node_attr(x->n, "ops"), *args = g_node_attr(x->n, "args");
    if (!ops || ops->type != FM_ATTR_INTS || !args || args->type != FM_ATTR_FLOATS || args->n != 2 * ops->n)
        return fm_set_error(FM_ERR_INVALID, "ew_chain without its steps");
    const fm_dtype dt = x->t0->dt;
    const char *v = x->in[0];
    fm_status s = FM_OK;
    for (int i = 0; i < ops->n && !s; i++) {
        const char *o = i == ops->n - 1 ? x->out[0] : tmp_name(e);
        const double a = args->floats[2 * i], b = args->floats[2 * i + 1];
        switch ((fm_ew_step_op)ops->ints[i].v) {
        case FM_EW_ADD: s = emit(e, "Add", INS(v, const_scalar(e, a, dt)), OUTS(o), 0); break;
        case FM_EW_MUL: s = emit(e, "Mul", INS(v, const_scalar(e, a, dt)), OUTS(o), 0); break;
        case FM_EW_SUB: s = emit(e, "Sub", INS(v, const_scalar(e, a, dt)), OUTS(o), 0); break;
        case FM_EW_RSUB: s = emit(e, "Sub", INS(const_scalar(e, a, dt), v), OUTS(o), 0); break;
        case FM_EW_DIV: s = emit(e, "Div", INS(v, const_scalar(e, a, dt)), OUTS(o), 0); break;
        case FM_EW_RDIV: s = emit(e, "Div", INS(const_scalar(e, a, dt), v), OUTS(o), 0); break;
        case FM_EW_CLAMP: s = emit(e, "Clip", INS(v, const_scalar(e, a, dt), const_scalar(e, b, dt)), OUTS(o), 0); break;
        case FM_EW_RELU: s = emit(e, "Relu", INS(v), OUTS(o), 0); break;
        case FM_EW_SIGMOID: s = emit(e, "Sigmoid", INS(v), OUTS(o), 0); break;
        case FM_EW_TANH: s = emit(e, "Tanh", INS(v), OUTS(o), 0); break;
        case FM_EW_MUL_X: s = emit(e, "Mul", INS(v, x->in[0]), OUTS(o), 0); break;
        case FM_EW_ADD_X: s = emit(e, "Add", INS(v, x->in[0]), OUTS(o), 0); break;
        case FM_EW_ROUND: s = emit(e, "Round", INS(v), OUTS(o), 0); break;
        default: s = fm_set_error(FM_ERR_INVALID, "ew_chain: unknown step %lld", (long long)ops->ints[i].v);
        }
        v = o;
    }
    return s;
}

/* dim_size: x's size along axis, Shape then Squeeze (then Cast); arange: Range(start,
 * start + n step, step) over that size n, in the node's dtype. */
static fm_status x_dim_data(xnode *x, const char *op) {
    exporter *e = x->e;
    const int64_t axis = at_int(x->n, "axis", 0);
    const gattr *da = g_node_attr(x->n, "dtype");
    fm_dtype dt = FM_I64;
    if (da && da->type == FM_ATTR_STRING && fm_dtype_from_name(da->s, &dt)) return fm_last_status();
    const char *sh = tmp_name(e), *last = !strcmp(op, "dim_size") ? x->out[0] : tmp_name(e);
    const char *sq = dt == FM_I64 ? last : tmp_name(e);
    fm_status s = emit(e, "Shape", INS(x->in[0]), OUTS(sh), 2, a_int(e, "start", axis), a_int(e, "end", axis + 1));
    if (!s) s = emit(e, "Squeeze", INS(sh, const_i64(e, 1, (int64_t[]){0})), OUTS(sq), 0);
    if (!s && dt != FM_I64) s = emit(e, "Cast", INS(sq), OUTS(last), 1, a_int(e, "to", onnx_dtype_from_fm(dt)));
    if (s || !strcmp(op, "dim_size")) return s;
    const char *start = const_scalar(e, at_float(x->n, "start", 0), dt), *step = const_scalar(e, at_float(x->n, "step", 1), dt);
    const char *span = tmp_name(e), *lim = tmp_name(e);
    s = emit(e, "Mul", INS(last, step), OUTS(span), 0);
    if (!s) s = emit(e, "Add", INS(start, span), OUTS(lim), 0);
    if (!s) s = emit(e, "Range", INS(start, lim, step), OUTS(x->out[0]), 0);
    return s;
}

static fm_status x_misc(xnode *x, const char *op) {
    exporter *e = x->e;
    const char *t = NULL;
    fm_dtype dt = x->t0->dt;
    if (!strcmp(op, "rsqrt"))
        return emit(e, "Sqrt", INS(x->in[0]), OUTS(t = tmp_name(e)), 0) || emit(e, "Reciprocal", INS(t), OUTS(x->out[0]), 0);
    if (!strcmp(op, "ne"))
        return emit(e, "Equal", INS(x->in[0], x->in[1]), OUTS(t = tmp_name(e)), 0) || emit(e, "Not", INS(t), OUTS(x->out[0]), 0);
    if (!strcmp(op, "silu"))
        return emit(e, "Sigmoid", INS(x->in[0]), OUTS(t = tmp_name(e)), 0) || emit(e, "Mul", INS(x->in[0], t), OUTS(x->out[0]), 0);
    if (!strcmp(op, "ew_chain")) return x_ew_chain(x);
    if (!strcmp(op, "fmod") || !strcmp(op, "remainder")) return x_mod(x, op);
    if (!strcmp(op, "rope")) return x_rope(e, x->in[0], x->in[1], x->in[2], x->t0->d[x->t0->ndim - 1], x->out[0]);
    if (!strcmp(op, "dim_size") || !strcmp(op, "arange")) return x_dim_data(x, op);
    if (!strcmp(op, "cumsum"))
        return emit(e, "CumSum", INS(x->in[0], const_scalar(e, (double)at_int(x->n, "axis", 0), FM_I64)), OUTS(x->out[0]), 2,
                    a_int(e, "exclusive", at_int(x->n, "exclusive", 0)), a_int(e, "reverse", at_int(x->n, "reverse", 0)));
    if (!strcmp(op, "topk")) {
        const int64_t k = at_int(x->n, "k", 0);
        return emit(e, "TopK", INS(x->in[0], const_i64(e, 1, &k)), OUTS(x->out[0], x->out[1]), 3, a_int(e, "axis", at_int(x->n, "axis", -1)),
                    a_int(e, "largest", at_int(x->n, "largest", 1)), a_int(e, "sorted", 1));
    }
    if (!strcmp(op, "leaky_relu"))
        return emit(e, "LeakyRelu", INS(x->in[0]), OUTS(x->out[0]), 1, a_float(e, "alpha", at_float(x->n, "negative_slope", 0.01)));
    if (!strcmp(op, "clamp"))
        return emit(e, "Clip", INS(x->in[0], const_scalar(e, at_float(x->n, "min", -INFINITY), dt),
                                   const_scalar(e, at_float(x->n, "max", INFINITY), dt)), OUTS(x->out[0]), 0);
    if (!strcmp(op, "gelu") || !strcmp(op, "gelu_tanh")) return x_gelu(x, op[4] == '_', x->in[0], x->out[0]);
    if (!strcmp(op, "bias_gelu_tanh"))
        return emit(e, "Add", INS(x->in[0], x->in[1]), OUTS(t = tmp_name(e)), 0) || x_gelu(x, true, t, x->out[0]);
    if (!strcmp(op, "softmax") || !strcmp(op, "log_softmax"))
        return emit(e, op[0] == 's' ? "Softmax" : "LogSoftmax", INS(x->in[0]), OUTS(x->out[0]), 1, a_int(e, "axis", at_int(x->n, "axis", -1)));
    if (!strcmp(op, "qkv_split_heads")) return x_qkv_split_heads(x);
    if (!strcmp(op, "causal_attention")) return x_causal_attention(x);
    if (!strcmp(op, "scaled_dot_product_attention")) return x_attention(x, at_int(x->n, "causal", 0) ? 1 : 0);
    if (!strcmp(op, "attention_kv")) return x_attention_kv(x);
    if (!strcmp(op, "linear") || !strcmp(op, "linear_fused")) { /* fused: then its activation (relu = 1, or act) */
        const gattr *ga = g_node_attr(x->n, "act");
        const char *act = at_int(x->n, "relu", 0) ? "relu" : ga && ga->type == FM_ATTR_STRING && strcmp(ga->s, "none") ? ga->s : NULL;
        const char *b = opt_in(x, 2), *y = act ? tmp_name(e) : x->out[0];
        fm_status s;
        if (x->t0->ndim == 2) {
            const char *ins[4] = {x->in[0], x->in[1], b, NULL};
            s = emit(e, "Gemm", ins, OUTS(y), 1, a_int(e, "transB", 1));
        } else {
            const char *wt = tmp_name(e), *mm = b ? tmp_name(e) : y;
            int64_t perm[2] = {1, 0};
            s = emit(e, "Transpose", INS(x->in[1]), OUTS(wt), 1, a_ints(e, "perm", 2, perm));
            if (!s) s = emit(e, "MatMul", INS(x->in[0], wt), OUTS(mm), 0);
            if (!s && b) s = emit(e, "Add", INS(mm, b), OUTS(y), 0);
        }
        if (s || !act) return s;
        if (!strcmp(act, "gelu") || !strcmp(act, "gelu_tanh")) return x_gelu(x, act[4] == '_', y, x->out[0]);
        if (!strcmp(act, "silu"))
            return emit(e, "Sigmoid", INS(y), OUTS(t = tmp_name(e)), 0) || emit(e, "Mul", INS(y, t), OUTS(x->out[0]), 0);
        return emit(e, !strcmp(act, "relu") ? "Relu" : !strcmp(act, "tanh") ? "Tanh" : "Sigmoid", INS(y), OUTS(x->out[0]), 0);
    }
    return fm_set_error(FM_ERR_UNSUPPORTED, "no ONNX form");
}

/* where on bools (the import's And/Or): ONNX Runtime has no bool Where kernel, so
 * (c and x) or (not c and y), the same values. */
static fm_status x_where_bool(xnode *x) {
    exporter *e = x->e;
    const char *cx = tmp_name(e), *nc = tmp_name(e), *ncy = tmp_name(e);
    return emit(e, "And", INS(x->in[0], x->in[1]), OUTS(cx), 0) || emit(e, "Not", INS(x->in[0]), OUTS(nc), 0) ||
           emit(e, "And", INS(nc, x->in[2]), OUTS(ncy), 0) || emit(e, "Or", INS(cx, ncy), OUTS(x->out[0]), 0);
}

static const struct { const char *g, *onnx; } k_direct[] = {
    {"neg", "Neg"}, {"abs", "Abs"}, {"exp", "Exp"}, {"log", "Log"}, {"sqrt", "Sqrt"}, {"sin", "Sin"}, {"cos", "Cos"},
    {"tanh", "Tanh"}, {"sigmoid", "Sigmoid"}, {"relu", "Relu"}, {"softplus", "Softplus"}, {"identity", "Identity"},
    {"dropout", "Identity"}, {"contiguous", "Identity"}, {"add", "Add"}, {"sub", "Sub"}, {"mul", "Mul"}, {"div", "Div"},
    {"pow", "Pow"}, {"maximum", "Max"}, {"minimum", "Min"}, {"eq", "Equal"}, {"lt", "Less"}, {"le", "LessOrEqual"},
    {"gt", "Greater"}, {"ge", "GreaterOrEqual"}, {"where", "Where"}, {"matmul", "MatMul"}, {"tan", "Tan"},
    {"asin", "Asin"}, {"acos", "Acos"}, {"atan", "Atan"}, {"sinh", "Sinh"}, {"cosh", "Cosh"}, {"asinh", "Asinh"},
    {"acosh", "Acosh"}, {"atanh", "Atanh"}, {"erf", "Erf"}, {"floor", "Floor"}, {"ceil", "Ceil"}, {"round", "Round"},
    {"sign", "Sign"},
};

static fm_status x_node(exporter *e, int i) {
    const fm_graph *g = e->g;
    const gnode *n = &g->nodes[i];
    xnode x = {.e = e, .n = n};
    for (int k = 0; k < n->n_in && k < FM_GRAPH_MAX_NODE_IO; k++) x.in[k] = n->in[k] >= 0 ? g->values[n->in[k]].name : "";
    for (int k = 0; k < n->n_out && k < 3; k++) x.out[k] = g->values[n->out[k]].name;
    if (n->n_in < 1 || n->in[0] < 0) return fm_set_error(FM_ERR_UNSUPPORTED, "no ONNX form");
    x.t0 = &g->values[n->in[0]].t;
    if (!strcmp(n->op, "where") && g->values[n->out[0]].t.dt == FM_BOOL) return x_where_bool(&x);
    /* ONNX's Floor, Ceil and Round take floats only; on integers they are the identity */
    if ((!strcmp(n->op, "floor") || !strcmp(n->op, "ceil") || !strcmp(n->op, "round")) && !fm_dtype_is_float(x.t0->dt))
        return emit(e, "Identity", x.in, OUTS(x.out[0]), 0);
    for (size_t k = 0; k < sizeof k_direct / sizeof *k_direct; k++)
        if (!strcmp(n->op, k_direct[k].g)) return emit(e, k_direct[k].onnx, x.in, OUTS(x.out[0]), 0);
    const char *op = n->op;
    static const char *const norms = ",layer_norm,add_layer_norm,rms_norm,batch_norm,";
    static const char *const pools = ",conv2d,conv2d_fused,conv_transpose2d,max_pool2d,avg_pool2d,";
    static const char *const reds = ",sum,mean,amax,amin,logsumexp,prod,argmax,";
    static const char *const shapes = ",reshape,expand,permute,transpose,slice,unsqueeze,squeeze,flatten,cat,cast,embedding,index_select,gather,scatter,scatter_nd,pad,";
    char key[64];
    snprintf(key, sizeof key, ",%s,", op);
    if (strstr(norms, key)) return x_norm(&x, op);
    if (strstr(pools, key)) return x_conv_pool(&x, op);
    if (strstr(reds, key)) return x_reduce(&x, op);
    if (strstr(shapes, key)) return x_shape(&x, op);
    return x_misc(&x, op);
}

static Onnx__ValueInfoProto *value_info(exporter *e, const gvalue *v, bool with_dims) {
    Onnx__ValueInfoProto *vi = ex_alloc(e, sizeof *vi);
    Onnx__TypeProto *tp = ex_alloc(e, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = ex_alloc(e, sizeof *tt);
    Onnx__TensorShapeProto *sh = ex_alloc(e, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dims = ex_alloc(e, (size_t)(v->t.ndim + 1) * sizeof *dims);
    if (!vi || !tp || !tt || !sh || !dims) return NULL;
    onnx__value_info_proto__init(vi), onnx__type_proto__init(tp), onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    vi->name = ex_str(e, v->name), vi->type = tp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE, tp->tensor_type = tt;
    tt->has_elem_type = 1, tt->elem_type = onnx_dtype_from_fm(v->t.dt), tt->shape = sh;
    sh->n_dim = (size_t)v->t.ndim, sh->dim = dims;
    for (int d = 0; d < v->t.ndim; d++) {
        Onnx__TensorShapeProto__Dimension *dm = ex_alloc(e, sizeof *dm);
        if (!dm) return NULL;
        onnx__tensor_shape_proto__dimension__init(dm);
        if (with_dims && v->kind == GV_INPUT && v->sym[d] >= 0)
            dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM, dm->dim_param = ex_str(e, e->g->syms[v->sym[d]].name);
        else if (with_dims && v->probe2[d] == v->t.d[d])
            dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE, dm->dim_value = v->t.d[d];
        dims[d] = dm;
    }
    return vi;
}

static fm_status build_model(exporter *e, Onnx__ModelProto *m, Onnx__GraphProto *gp, Onnx__OperatorSetIdProto *ops) {
    const fm_graph *g = e->g;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind == GV_CONST) {
            fm_tensor *h = fm_tensor_to(g->values[i].tensor, FM_CPU);
            const char *r = h ? add_init(e, g->values[i].name, h) : NULL;
            fm_tensor_release(h);
            if (!r) return fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
        }
    for (int i = 0; i < g->n_nodes; i++)
        if (x_node(e, i)) {
            char lbl[160];
            fm_error_prefix("%s", g_node_label(&g->nodes[i], lbl, sizeof lbl));
            return fm_last_status();
        }
    Onnx__ValueInfoProto **in = ex_alloc(e, (size_t)(g->n_inputs + 1) * sizeof *in), **out = ex_alloc(e, (size_t)(g->n_outputs + 1) * sizeof *out);
    if (!in || !out) return fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
    for (int i = 0; i < g->n_inputs; i++)
        if (!(in[i] = value_info(e, &g->values[g->inputs[i]], true))) return fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
    for (int i = 0; i < g->n_outputs; i++)
        if (!(out[i] = value_info(e, &g->values[g->outputs[i]], true))) return fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
    onnx__model_proto__init(m), onnx__graph_proto__init(gp), onnx__operator_set_id_proto__init(ops);
    ops->domain = "", ops->has_version = 1, ops->version = EXPORT_OPSET;
    m->has_ir_version = 1, m->ir_version = 8, m->producer_name = "fathom", m->producer_version = "0.1.0";
    m->n_opset_import = 1;
    m->opset_import = ex_alloc(e, sizeof *m->opset_import);
    if (!m->opset_import) return fm_set_error(FM_ERR_OOM, "ONNX export: out of memory");
    m->opset_import[0] = ops;
    m->graph = gp;
    gp->name = "fathom";
    gp->n_node = (size_t)e->n_nodes, gp->node = e->nodes;
    gp->n_initializer = (size_t)e->n_inits, gp->initializer = e->inits;
    gp->n_input = (size_t)g->n_inputs, gp->input = in;
    gp->n_output = (size_t)g->n_outputs, gp->output = out;
    return FM_OK;
}

fm_status fm_graph_export_onnx(fm_graph *g, const char *path) {
    if (!g || !path) return fm_set_error(FM_ERR_INVALID, "fm_graph_export_onnx: NULL graph or path");
    if (fm_graph_validate(g)) return fm_last_status();
    exporter e = {.g = g};
    Onnx__ModelProto m;
    Onnx__GraphProto gp;
    Onnx__OperatorSetIdProto ops;
    fm_status s = build_model(&e, &m, &gp, &ops);
    if (!s) {
        size_t n = protobuf_c_message_get_packed_size(&m.base);
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf) s = fm_set_error(FM_ERR_OOM, "%s: out of memory for %zu bytes", path, n);
        else {
            protobuf_c_message_pack(&m.base, buf);
            fm_io_chunk ch = {buf, n};
            s = fm_atomic_write(path, 1, &ch);
            free(buf);
        }
    } else fm_error_prefix("exporting to %s", path);
    for (int i = 0; i < e.n; i++) free(e.ptrs[i]);
    free(e.ptrs), free(e.nodes), free(e.inits);
    return s;
}
