/* ONNX ops that fathom has no kernel for and that no composition of fathom ops
 * gives exactly (IsNaN, IsInf, Hardmax, ...): the input is brought to the
 * host as a contiguous f64 (floats) or i64 (integers, bools) buffer, computed
 * there, and the result is returned in the input's dtype on the input's device.
 * These are the ops exported models use around the heavy layers (position ids
 * were CumSum), so a host round trip costs little next to the matmuls; a device
 * kernel would be a new fathom op. Erf, the rounding ops, Sign, the
 * (inverse, hyperbolic) trigonometry, CumSum, Mod and the scatters run fathom's own
 * ops since they became ones. Also RMSNormalization and Swish, composed. */
#include "onnx/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

fm_tensor *onnx_host(fm_tensor *x, fm_dtype dt) {
    fm_tensor *a = fm_tensor_to(x, FM_CPU), *b = a ? fm_to_dtype(a, dt) : NULL, *y = b ? fm_contiguous(b) : NULL;
    REL(a, b);
    return y;
}

fm_tensor *onnx_host_back(fm_tensor *y, fm_dtype dt, fm_device dev) {
    fm_tensor *a = y ? fm_to_dtype(y, dt) : NULL, *b = a ? fm_tensor_to(a, dev) : NULL;
    REL(y, a);
    return b;
}

/* A new CPU tensor of x's shape and dtype dt (uninitialized). */
static fm_tensor *host_like(const fm_tensor *x, fm_dtype dt) { return fm_tensor_empty(x->ndim, x->shape, dt, FM_CPU); }

/* ---- unary maths: fathom's ops (on the input's device) ---- */
static fm_status unary_core(onnx_op_ctx *c, fm_tensor *(*fn)(fm_tensor *), bool float_only) {
    fm_tensor *x = c->in[0];
    if (float_only && !fm_dtype_is_float(x->dtype))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "needs a floating-point input; got %s", fm_dtype_name(x->dtype));
    return onnx_set_out(c, 0, fn(x));
}

#define CORE_UNARY(NAME, FN, FLOAT_ONLY) \
    static fm_status NAME(onnx_op_ctx *c) { return unary_core(c, FN, FLOAT_ONLY); }
CORE_UNARY(op_erf, fm_erf, true)
CORE_UNARY(op_floor, fm_floor, true)
CORE_UNARY(op_ceil, fm_ceil, true)
CORE_UNARY(op_round, fm_round, true)
CORE_UNARY(op_sign, fm_sign, false)
CORE_UNARY(op_tan, fm_tan, true)
CORE_UNARY(op_sinh, fm_sinh, true)
CORE_UNARY(op_cosh, fm_cosh, true)
CORE_UNARY(op_asin, fm_asin, true)
CORE_UNARY(op_acos, fm_acos, true)
CORE_UNARY(op_atan, fm_atan, true)
CORE_UNARY(op_asinh, fm_asinh, true)
CORE_UNARY(op_acosh, fm_acosh, true)
CORE_UNARY(op_atanh, fm_atanh, true)

/* IsNaN and IsInf: a bool tensor. */
static fm_status is_class(onnx_op_ctx *c, bool nan) {
    fm_tensor *x = c->in[0];
    if (!fm_dtype_is_float(x->dtype))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "needs a floating-point input; got %s", fm_dtype_name(x->dtype));
    bool neg = onnx_attr_int(c, "detect_negative", 1) != 0, pos = onnx_attr_int(c, "detect_positive", 1) != 0;
    fm_tensor *h = onnx_host(x, FM_F64), *y = h ? host_like(h, FM_BOOL) : NULL;
    if (y) {
        const double *s = fm_tensor_data(h);
        bool *d = fm_tensor_data(y);
        for (int64_t i = 0, n = fm_tensor_numel(h); i < n; i++)
            d[i] = nan ? isnan(s[i]) : isinf(s[i]) && ((s[i] > 0 && pos) || (s[i] < 0 && neg));
    }
    fm_tensor_release(h);
    return onnx_set_out(c, 0, onnx_host_back(y, FM_BOOL, x->storage->device));
}
static fm_status op_isnan(onnx_op_ctx *c) { return is_class(c, true); }
static fm_status op_isinf(onnx_op_ctx *c) { return is_class(c, false); }

/* ---- Mod: fmod=1 fm_fmod (the dividend's sign), fmod=0 fm_remainder (the divisor's,
 * integers only as ONNX requires); an integer division by zero gives 0 (ONNX leaves it
 * undefined). ---- */
static fm_status op_mod(onnx_op_ctx *c) {
    fm_tensor *a = c->in[0], *b = c->in[1];
    bool fm = onnx_attr_int(c, "fmod", 0) != 0;
    if (a->dtype != b->dtype) return onnx_node_error(c, FM_ERR_INVALID, "inputs of different dtypes");
    if (fm_dtype_is_float(a->dtype) && !fm) return onnx_node_error(c, FM_ERR_INVALID, "fmod=0 with floating-point inputs (ONNX requires fmod=1)");
    return onnx_set_out(c, 0, fm ? fm_fmod(a, b) : fm_remainder(a, b));
}

/* ---- Trilu: a [rows, cols] mask, broadcast over the leading dims ---- */
static fm_status op_trilu(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    if (x->ndim < 2) return onnx_node_error(c, FM_ERR_INVALID, "input has rank %d; Trilu needs at least 2", x->ndim);
    int64_t k = 0;
    int n = 0;
    if (c->n_in > 1 && c->in[1] && onnx_tensor_ints(c, 1, &k, 1, &n)) return fm_last_status();
    bool upper = onnx_attr_int(c, "upper", 1) != 0;
    int64_t sh[2] = {x->shape[x->ndim - 2], x->shape[x->ndim - 1]};
    fm_tensor *m = fm_tensor_empty(2, sh, FM_BOOL, FM_CPU);
    if (!m) return fm_last_status();
    bool *d = fm_tensor_data(m);
    for (int64_t i = 0; i < sh[0]; i++)
        for (int64_t j = 0; j < sh[1]; j++) d[i * sh[1] + j] = upper ? j - i >= k : j - i <= k;
    fm_tensor *md = fm_tensor_to(m, x->storage->device), *z = md ? fm_tensor_zeros(0, NULL, x->dtype, x->storage->device) : NULL;
    fm_tensor *y = z ? fm_where(md, x, z) : NULL;
    REL(m, md, z);
    return onnx_set_out(c, 0, y);
}

/* ---- CumSum along one axis (the axis is an input), exclusive and/or reverse: fm_cumsum ---- */
static fm_status op_cumsum(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t ax;
    int n = 0, axis;
    if (onnx_tensor_ints(c, 1, &ax, 1, &n)) return fm_last_status();
    if (n != 1) return onnx_node_error(c, FM_ERR_INVALID, "axis must hold one value");
    if (fm_norm_axis("CumSum", (int)ax, x->ndim, &axis)) return fm_last_status();
    if (x->dtype == FM_BOOL) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "needs a numeric input; got bool");
    bool excl = onnx_attr_int(c, "exclusive", 0) != 0, rev = onnx_attr_int(c, "reverse", 0) != 0;
    return onnx_set_out(c, 0, fm_cumsum(x, axis, excl, rev));
}

/* ---- Hardmax: 1 at the first maximum along the axis, 0 elsewhere ---- */
static fm_status op_hardmax(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int axis;
    if (fm_norm_axis("Hardmax", (int)onnx_attr_int(c, "axis", -1), x->ndim, &axis)) return fm_last_status();
    fm_tensor *h = onnx_host(x, FM_F64), *y = h ? host_like(h, FM_F64) : NULL;
    if (y) {
        int64_t len = x->shape[axis], inner = 1, outer = 1;
        for (int i = axis + 1; i < x->ndim; i++) inner *= x->shape[i];
        for (int i = 0; i < axis; i++) outer *= x->shape[i];
        const double *s = fm_tensor_data(h);
        double *d = fm_tensor_data(y);
        for (int64_t o = 0; o < outer; o++)
            for (int64_t in = 0; in < inner; in++) {
                int64_t best = 0;
                for (int64_t t = 0; t < len; t++) {
                    int64_t at = (o * len + t) * inner + in;
                    d[at] = 0;
                    if (s[at] > s[(o * len + best) * inner + in]) best = t;
                }
                if (len) d[(o * len + best) * inner + in] = 1;
            }
    }
    fm_tensor_release(h);
    return onnx_set_out(c, 0, onnx_host_back(y, x->dtype, x->storage->device));
}

/* ---- ScatterND, ScatterElements (and opset 9's Scatter): fm_scatter_nd and fm_scatter, a
 * copy of data with slices or elements replaced, or combined by the reduction (add, mul,
 * max, min), by updates. Negative indices count from the end (ScatterElements': wrapped
 * here, as fm_scatter takes none); one out of range is the kernel's error naming it.
 * Swin's shifted-window mask is built with ScatterND. ---- */
fm_status onnx_scatter_reduction(onnx_op_ctx *c, fm_scatter_reduce *r) {
    char buf[16];
    const char *s = onnx_attr_string(c, "reduction", "none", buf, sizeof buf);
    static const char *const names[] = {"none", "add", "mul", "max", "min"};
    for (int k = 0; k < 5; k++)
        if (!strcmp(s, names[k])) { *r = (fm_scatter_reduce)k; return FM_OK; } /* fm_scatter_reduce's order */
    return onnx_node_error(c, FM_ERR_UNSUPPORTED, "reduction '%s' is not one of none, add, mul, max, min", s);
}

static fm_status op_scatter_nd(onnx_op_ctx *c) {
    fm_scatter_reduce red = FM_SCATTER_NONE;
    if (onnx_scatter_reduction(c, &red)) return fm_last_status();
    return onnx_set_out(c, 0, fm_scatter_nd(c->in[0], c->in[1], c->in[2], red));
}

static fm_status op_scatter_elements(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *ind = c->in[1];
    fm_scatter_reduce red = FM_SCATTER_NONE;
    int axis;
    if (onnx_scatter_reduction(c, &red) || fm_norm_axis("ScatterElements", (int)onnx_attr_int(c, "axis", 0), x->ndim, &axis))
        return fm_last_status();
    fm_tensor *z = fm_tensor_zeros(0, NULL, ind->dtype, fm_tensor_device(ind));
    fm_tensor *n = z ? fm_tensor_full(0, NULL, (double)x->shape[axis], ind->dtype, fm_tensor_device(ind)) : NULL;
    fm_tensor *neg = n ? fm_lt(ind, z) : NULL, *up = neg ? fm_add(ind, n) : NULL, *w = up ? fm_where(neg, up, ind) : NULL;
    fm_tensor *y = w ? fm_scatter(x, axis, w, c->in[2], red) : NULL;
    REL(z, n, neg, up, w);
    return onnx_set_out(c, 0, y);
}

/* ---- composed ---- */
/* x * sigmoid(alpha * x) */
static fm_status op_swish(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    fm_tensor *ax = fm_mul_scalar(x, onnx_attr_float(c, "alpha", 1.0f)), *s = ax ? fm_sigmoid(ax) : NULL;
    fm_tensor *y = s ? fm_mul(x, s) : NULL;
    REL(ax, s);
    return onnx_set_out(c, 0, y);
}

/* x / sqrt(mean(x^2 over the dims from `axis` on) + epsilon) * scale, in f32 or
 * wider (stash_type 1) and back to x's dtype */
static fm_status op_rms_norm(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int axis;
    if (fm_norm_axis("RMSNormalization", (int)onnx_attr_int(c, "axis", -1), x->ndim, &axis)) return fm_last_status();
    int axes[FM_MAX_DIMS], na = 0;
    for (int i = axis; i < x->ndim; i++) axes[na++] = i;
    fm_dtype wide = x->dtype == FM_F64 ? FM_F64 : FM_F32;
    fm_tensor *xw = fm_to_dtype(x, wide), *sq = xw ? fm_mul(xw, xw) : NULL, *ms = sq ? fm_mean(sq, na, axes, true) : NULL;
    fm_tensor *me = ms ? fm_add_scalar(ms, onnx_attr_float(c, "epsilon", 1e-5f)) : NULL, *r = me ? fm_rsqrt(me) : NULL;
    fm_tensor *n = r ? fm_mul(xw, r) : NULL, *nd = n ? fm_to_dtype(n, x->dtype) : NULL;
    fm_tensor *y = nd ? fm_mul(nd, c->in[1]) : NULL;
    REL(xw, sq, ms, me, r, n, nd);
    return onnx_set_out(c, 0, y);
}

const onnx_op onnx_ops_host[] = {
    {"Erf", 9, 1, 1, 1, "", op_erf},         {"Floor", 6, 1, 1, 1, "", op_floor},
    {"Ceil", 6, 1, 1, 1, "", op_ceil},       {"Round", 11, 1, 1, 1, "", op_round},
    {"Sign", 9, 1, 1, 1, "", op_sign},       {"Tan", 7, 1, 1, 1, "", op_tan},
    {"Sinh", 9, 1, 1, 1, "", op_sinh},       {"Cosh", 9, 1, 1, 1, "", op_cosh},
    {"Asin", 7, 1, 1, 1, "", op_asin},       {"Acos", 7, 1, 1, 1, "", op_acos},
    {"Atan", 7, 1, 1, 1, "", op_atan},       {"Asinh", 9, 1, 1, 1, "", op_asinh},
    {"Acosh", 9, 1, 1, 1, "", op_acosh},     {"Atanh", 9, 1, 1, 1, "", op_atanh},
    {"IsNaN", 9, 1, 1, 1, "", op_isnan},     {"IsInf", 10, 1, 1, 1, "detect_negative,detect_positive", op_isinf},
    {"Mod", 10, 2, 2, 1, "fmod", op_mod},    {"Trilu", 14, 1, 2, 1, "upper", op_trilu},
    {"CumSum", 11, 2, 2, 1, "exclusive,reverse", op_cumsum},
    {"ScatterND", 11, 3, 3, 1, "reduction", op_scatter_nd},
    {"ScatterElements", 11, 3, 3, 1, "axis,reduction", op_scatter_elements},
    {"Scatter", 9, 3, 3, 1, "axis", op_scatter_elements},
    {"Hardmax", 13, 1, 1, 1, "axis", op_hardmax},
    {"Swish", 24, 1, 1, 1, "alpha", op_swish},
    {"RMSNormalization", 23, 2, 2, 1, "axis,epsilon,stash_type", op_rms_norm},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
