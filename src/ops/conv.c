/* Front end of conv2d (and of the transposed convolution, which runs conv2d's backward
 * kernel): validation, output shape, dispatch and the backward rule.
 *
 * x and y share a layout (NCHW or NHWC); the weight is always [Cout, Cin/groups,
 * kH, kW] as in PyTorch, so a model's weights do not change with its layout.
 * Backward runs one CONV2D_BACKWARD kernel that computes only the gradients
 * asked for (dx, dw, db), since the first layer of a CNN never needs dx. */
#include <math.h>
#include <string.h>

#include "amp/autocast.h"   /* the precision policy (ops.def: conv in low precision) */
#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_conv2d_attrs, fm_conv2d_out_size */
#include "ops/ops_internal.h" /* fm_conv2d_mixed, fm_mixed_device */

fm_conv2d_params fm_conv2d_default_params(void) {
    fm_conv2d_params p;
    memset(&p, 0, sizeof p);
    p.stride[0] = p.stride[1] = 1;
    p.dilation[0] = p.dilation[1] = 1;
    p.groups = 1;
    p.layout = FM_NCHW;
    return p;
}

typedef struct conv_node_attrs {
    fm_conv2d_attrs a;
    int has_bias;
} conv_node_attrs;

/* Gradient buffer for input i (0 x, 1 w, 2 bias [Cout]). */
static fm_tensor *grad_buffer(const fm_tensor *x, const fm_tensor *w, int i, bool zero) {
    const fm_tensor *t = i == 0 ? x : w;
    int ndim = i == 2 ? 1 : t->ndim;
    const int64_t *shape = i == 2 ? w->shape : t->shape;
    return (zero ? fm_tensor_zeros : fm_tensor_empty)(ndim, shape, t->dtype, fm_tensor_device(t));
}

static fm_status conv2d_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    const conv_node_attrs *na = FM_NODE_ATTRS(n, conv_node_attrs);
    fm_tensor *x = n->saved[0], *w = n->saved[1];
    bool need[3] = {fm_node_needs_grad(n, 0), fm_node_needs_grad(n, 1), na->has_bias && fm_node_needs_grad(n, 2)};
    if (!grad_out[0]) {
        for (int i = 0; i < 3; i++)
            if (need[i] && !(grad_in[i] = grad_buffer(x, w, i, true))) return fm_last_status();
        return FM_OK;
    }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_CONV2D_BACKWARD;
    call.n_in = 3;
    call.n_out = 3;
    call.in[0] = grad_out[0];
    call.in[1] = x;
    call.in[2] = w;
    call.attrs = &na->a;
    for (int i = 0; i < 3; i++) {
        if (!need[i]) continue;
        call.out[i] = grad_buffer(x, w, i, false);
        if (!call.out[i]) {
            for (int k = 0; k < i; k++) fm_tensor_release(call.out[k]);
            return fm_last_status();
        }
    }
    fm_status st = fm_dispatch(&call);
    for (int i = 0; i < 3; i++) {
        if (st == FM_OK) grad_in[i] = call.out[i];
        else fm_tensor_release(call.out[i]);
    }
    return st;
}

/* Checks conv2d's inputs and parameters; yshape gets the output shape. */
static fm_status conv_check(const char *op, fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *p, int64_t *yshape) {
    char s1[96], s2[96];
    if (p->layout != FM_NCHW && p->layout != FM_NHWC) {
        return fm_set_error(FM_ERR_INVALID, "%s: unknown layout %d (use FM_NCHW or FM_NHWC)", op, (int)p->layout);
    }
    const char *lname = p->layout == FM_NHWC ? "NHWC" : "NCHW";
    if (x->ndim != 4) {
        return fm_set_error(FM_ERR_INVALID, "%s: input must be 4-D (%s), got %s", op, lname, fm_shape_str(x->ndim, x->shape, s1, sizeof s1));
    }
    if (w->ndim != 4) {
        return fm_set_error(FM_ERR_INVALID, "%s: weight must be 4-D [Cout, Cin/groups, kH, kW], got %s", op,
                     fm_shape_str(w->ndim, w->shape, s1, sizeof s1));
    }
    if (x->dtype != w->dtype || (b && b->dtype != x->dtype)) {
        return fm_set_error(FM_ERR_INVALID, "%s: dtype mismatch: input %s, weight %s%s%s", op, fm_dtype_name(x->dtype),
                     fm_dtype_name(w->dtype), b ? ", bias " : "", b ? fm_dtype_name(b->dtype) : "");
    }
    if (!fm_dtype_is_float(x->dtype)) {
        return fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point input, got %s", op, fm_dtype_name(x->dtype));
    }
    for (int i = 0; i < 2; i++) {
        if (p->stride[i] < 1 || p->dilation[i] < 1 || p->padding[i] < 0) {
            return fm_set_error(FM_ERR_INVALID, "%s: stride (%d, %d) and dilation (%d, %d) must be >= 1, padding (%d, %d) >= 0", op,
                         p->stride[0], p->stride[1], p->dilation[0], p->dilation[1], p->padding[0], p->padding[1]);
        }
    }
    int64_t N = x->shape[0];
    int64_t C = p->layout == FM_NHWC ? x->shape[3] : x->shape[1];
    int64_t H = p->layout == FM_NHWC ? x->shape[1] : x->shape[2];
    int64_t W = p->layout == FM_NHWC ? x->shape[2] : x->shape[3];
    int64_t O = w->shape[0];
    if (p->groups < 1 || C % p->groups || O % p->groups) {
        return fm_set_error(FM_ERR_INVALID, "%s: groups %d must be >= 1 and divide input channels %lld and output channels %lld", op,
                     p->groups, (long long)C, (long long)O);
    }
    if (w->shape[1] * p->groups != C) {
        return fm_set_error(FM_ERR_INVALID, "%s: weight %s expects %lld input channels (%lld x groups %d), input %s (%s) has %lld", op,
                     fm_shape_str(w->ndim, w->shape, s1, sizeof s1), (long long)(w->shape[1] * p->groups),
                     (long long)w->shape[1], p->groups, fm_shape_str(x->ndim, x->shape, s2, sizeof s2), lname, (long long)C);
    }
    if (b && (b->ndim != 1 || b->shape[0] != O)) {
        return fm_set_error(FM_ERR_INVALID, "%s: bias shape %s does not match the weight's %lld output channels (weight %s)", op,
                     fm_shape_str(b->ndim, b->shape, s1, sizeof s1), (long long)O, fm_shape_str(w->ndim, w->shape, s2, sizeof s2));
    }
    if (w->shape[2] < 1 || w->shape[3] < 1) {
        return fm_set_error(FM_ERR_INVALID, "%s: weight %s has an empty kernel", op, fm_shape_str(w->ndim, w->shape, s1, sizeof s1));
    }
    if (!fm_device_eq(fm_tensor_device(x), fm_tensor_device(w)) || (b && !fm_device_eq(fm_tensor_device(x), fm_tensor_device(b)))) {
        return fm_set_error(FM_ERR_INVALID, "%s: input, weight and bias must be on the same device", op);
    }
    int64_t Ho = fm_conv2d_out_size(H, (int)w->shape[2], p->stride[0], p->padding[0], p->dilation[0]);
    int64_t Wo = fm_conv2d_out_size(W, (int)w->shape[3], p->stride[1], p->padding[1], p->dilation[1]);
    if (Ho < 1 || Wo < 1) {
        return fm_set_error(FM_ERR_INVALID, "%s: kernel %lldx%lld (dilation %d, %d) does not fit the padded input %lldx%lld (input %s, padding %d, %d)", op,
                     (long long)w->shape[2], (long long)w->shape[3], p->dilation[0], p->dilation[1],
                     (long long)(H + 2 * p->padding[0]), (long long)(W + 2 * p->padding[1]),
                     fm_shape_str(x->ndim, x->shape, s1, sizeof s1), p->padding[0], p->padding[1]);
    }
    if (p->layout == FM_NHWC) { yshape[0] = N; yshape[1] = Ho; yshape[2] = Wo; yshape[3] = O; }
    else { yshape[0] = N; yshape[1] = O; yshape[2] = Ho; yshape[3] = Wo; }
    return FM_OK;
}

/* The node: dispatch, then the tape (lowp: fm_conv2d_attrs.lowp). */
static fm_tensor *conv2d_node(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_conv2d_params p, int lowp) {
    int64_t yshape[4];
    if (conv_check("conv2d", x, w, b, &p, yshape)) return NULL;
    fm_tensor *y = fm_tensor_empty(4, yshape, x->dtype, fm_tensor_device(x));
    if (!y) return NULL;
    conv_node_attrs na;
    memset(&na, 0, sizeof na);
    na.a.p = p;
    na.a.lowp = lowp;
    na.has_bias = b != NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_CONV2D;
    call.n_in = 3;
    call.n_out = 1;
    call.in[0] = x;
    call.in[1] = w;
    call.in[2] = b;
    call.out[0] = y;
    call.attrs = &na.a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    fm_tensor *ins[3] = {x, w, b};
    fm_node *n = fm_node_begin(FM_OP_CONV2D, b ? 3 : 2, ins, conv2d_backward);
    if (n) {
        fm_node_save(n, 0, x);
        fm_node_save(n, 1, w);
        FM_NODE_SET_ATTRS(n, na);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

fm_tensor *fm_conv2d(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *pp) {
    fm_conv2d_params p = pp ? *pp : fm_conv2d_default_params();
    if (!x || !w) { fm_set_error(FM_ERR_INVALID, "conv2d: %s is NULL", x ? "weight" : "input"); return NULL; }
    fm_tensor *c[3];
    int ac = fm_autocast_inputs(FM_OP_CONV2D, 3, (fm_tensor *[]){x, w, b}, c);
    if (ac) { /* autocast: low-precision storage (the CPU kernels widen to f32: FM_OPF_F32_ONLY) */
        fm_tensor *y = ac > 0 ? fm_conv2d(c[0], c[1], c[2], pp) : NULL;
        fm_tensor_release_n(3, c[0], c[1], c[2]);
        return y;
    }
    return conv2d_node(x, w, b, p, FM_F32);
}

fm_tensor *fm_conv2d_mixed(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *pp, fm_dtype lowp) {
    fm_conv2d_params p = pp ? *pp : fm_conv2d_default_params();
    if (!x || !w || lowp != FM_BF16 || x->dtype != FM_F32 || w->dtype != FM_F32 || (b && b->dtype != FM_F32) ||
        p.layout != FM_NCHW || !fm_mixed_device(x))
        return fm_conv2d(x, w, b, pp); /* its errors, or its path */
    return conv2d_node(x, w, b, p, FM_BF16);
}

/* ---- the transposed convolution: conv2d's backward kernel run forward ----
 * y = convT(x, w) is conv2d's input gradient for the output gradient x, so it is one
 * CONV2D_BACKWARD call (dx only) with y in conv2d's input's place. Its gradient:
 * dL/dx = conv2d(g, w) (same parameters), dL/dw = conv2d's weight gradient for output
 * gradient x and input g. The bias is an fm_add after it (its gradient from that). */
static fm_status convt_call(fm_tensor *dy, fm_tensor *x, fm_tensor *w, fm_tensor *dx, fm_tensor *dw, const fm_conv2d_attrs *a) {
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_CONV2D_BACKWARD;
    call.n_in = 3;
    call.n_out = 3;
    call.in[0] = dy;
    call.in[1] = x; /* read for its shape only when dw is not asked */
    call.in[2] = w;
    call.out[0] = dx;
    call.out[1] = dw;
    call.attrs = a;
    return fm_dispatch(&call);
}

static fm_status convt_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    const fm_conv2d_attrs *a = FM_NODE_ATTRS(n, fm_conv2d_attrs);
    fm_tensor *x = n->saved[0], *w = n->saved[1], *g = grad_out[0];
    for (int i = 0; i < 2; i++) {
        if (!fm_node_needs_grad(n, i)) continue;
        fm_tensor *t = i ? w : x;
        if (!g) grad_in[i] = fm_tensor_zeros(t->ndim, t->shape, t->dtype, fm_tensor_device(t));
        else if (i == 0) grad_in[0] = fm_conv2d(g, w, NULL, &a->p);
        else if ((grad_in[1] = fm_tensor_empty(4, w->shape, w->dtype, fm_tensor_device(w))) && convt_call(x, g, w, NULL, grad_in[1], a)) {
            fm_tensor_release(grad_in[1]);
            grad_in[1] = NULL;
        }
        if (!grad_in[i]) return fm_last_status();
    }
    return FM_OK;
}

fm_status fm_conv_transpose2d_shape(const int64_t *xs, const int64_t *ws, int64_t bias_len, const fm_conv2d_params *p, const int *op, int64_t *ys) {
    char s1[96], s2[96];
    if (p->layout != FM_NCHW) return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: only NCHW is supported");
    if (p->groups < 1 || xs[1] != ws[0] || ws[0] % p->groups)
        return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: weight %s needs %lld input channels (its first dim, a multiple of groups %d), input %s has %lld",
                            fm_shape_str(4, ws, s1, sizeof s1), (long long)ws[0], p->groups, fm_shape_str(4, xs, s2, sizeof s2), (long long)xs[1]);
    const int64_t O = ws[1] * p->groups;
    if (bias_len >= 0 && bias_len != O)
        return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: bias of %lld does not match the %lld output channels (weight %s, groups %d)",
                            (long long)bias_len, (long long)O, fm_shape_str(4, ws, s2, sizeof s2), p->groups);
    ys[0] = xs[0], ys[1] = O;
    for (int i = 0; i < 2; i++) {
        const int s = p->stride[i], d = p->dilation[i], pd = p->padding[i], o = op ? op[i] : 0;
        if (s < 1 || d < 1 || pd < 0 || o < 0 || o >= s || ws[2 + i] < 1)
            return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: stride %d and dilation %d must be >= 1, padding %d >= 0 and output_padding %d in [0, stride)",
                                s, d, pd, o);
        ys[2 + i] = (xs[2 + i] - 1) * s - 2 * pd + (int64_t)d * (ws[2 + i] - 1) + o + 1;
        if (ys[2 + i] < 1 || xs[2 + i] < 1)
            return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: input %s with padding %d leaves no output along dim %d",
                                fm_shape_str(4, xs, s1, sizeof s1), pd, 2 + i);
    }
    return FM_OK;
}

/* fm_conv_transpose2d_shape, and what only tensors have: ranks, dtypes, devices */
static fm_status convt_check(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *p, const int *op, int64_t *ys) {
    char s1[96], s2[96];
    if (x->ndim != 4 || w->ndim != 4 || (b && b->ndim != 1))
        return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: input %s and weight %s must be 4-D (NCHW; weight [Cin, Cout/groups, kH, kW]), a bias 1-D",
                            fm_shape_str(x->ndim, x->shape, s1, sizeof s1), fm_shape_str(w->ndim, w->shape, s2, sizeof s2));
    if (x->dtype != w->dtype || (b && b->dtype != x->dtype) || !fm_dtype_is_float(x->dtype))
        return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: input, weight and bias must share one floating-point dtype (%s, %s%s%s)",
                            fm_dtype_name(x->dtype), fm_dtype_name(w->dtype), b ? ", " : "", b ? fm_dtype_name(b->dtype) : "");
    if (!fm_device_eq(fm_tensor_device(x), fm_tensor_device(w)) || (b && !fm_device_eq(fm_tensor_device(x), fm_tensor_device(b))))
        return fm_set_error(FM_ERR_INVALID, "conv_transpose2d: input, weight and bias must be on the same device");
    return fm_conv_transpose2d_shape(x->shape, w->shape, b ? b->shape[0] : -1, p, op, ys);
}

fm_tensor *fm_conv_transpose2d(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *pp, const int *output_padding) {
    fm_conv2d_params p = pp ? *pp : fm_conv2d_default_params();
    int64_t ys[4];
    if (!x || !w) { fm_set_error(FM_ERR_INVALID, "conv_transpose2d: %s is NULL", x ? "weight" : "input"); return NULL; }
    if (convt_check(x, w, b, &p, output_padding, ys)) return NULL;
    fm_tensor *y = fm_tensor_empty(4, ys, x->dtype, fm_tensor_device(x));
    fm_conv2d_attrs a;
    memset(&a, 0, sizeof a);
    a.p = p;
    if (!y || convt_call(x, y, w, y, NULL, &a)) { fm_tensor_release(y); return NULL; }
    fm_tensor *ins[2] = {x, w};
    fm_node *n = fm_node_begin(FM_OP_CONV2D_BACKWARD, 2, ins, convt_backward);
    if (n) {
        fm_node_save(n, 0, x);
        fm_node_save(n, 1, w);
        FM_NODE_SET_ATTRS(n, a);
        fm_node_finish(n, 1, &y);
    }
    if (!b) return y;
    fm_tensor *bv = fm_reshape(b, 4, (int64_t[]){1, ys[1], 1, 1}), *yb = bv ? fm_add(y, bv) : NULL;
    fm_tensor_release_n(2, y, bv);
    return yb;
}

fm_tensor *fm_conv2d_fused(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *pp, bool relu, int pool) {
    return fm_conv2d_fused_packed(x, w, b, NULL, pp, relu, pool);
}

fm_tensor *fm_conv2d_fused_pack(fm_tensor *w) {
    if (!w) { fm_set_error(FM_ERR_INVALID, "conv2d_fused_pack: weight is NULL"); return NULL; }
    if (w->ndim != 4 || w->dtype != FM_F32) {
        fm_set_error(FM_ERR_INVALID, "conv2d_fused_pack: weight must be f32 [O, C, kH, kW], got %s with %d dims", fm_dtype_name(w->dtype), w->ndim);
        return NULL;
    }
    /* a header of 3 (the form, O, C*kH*kW), then the weights (O padded to 8s in one form) */
    int64_t n = 3 + fm_conv2d_fused_pack_numel(w->shape[0], w->shape[1] * w->shape[2] * w->shape[3]);
    fm_tensor *y = fm_tensor_empty(1, &n, FM_F32, fm_tensor_device(w));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_CONV2D_FUSED_PACK, call.n_in = 1, call.n_out = 1, call.in[0] = w, call.out[0] = y;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}

fm_tensor *fm_conv2d_fused_packed(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, const fm_conv2d_params *pp, bool relu, int pool) {
    return fm_conv2d_fused_capped(x, w, b, packed, pp, relu, INFINITY, pool);
}

fm_tensor *fm_conv2d_fused_capped(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, const fm_conv2d_params *pp, bool relu,
                                  double hi, int pool) {
    fm_conv2d_fused_attrs a = {pp ? *pp : fm_conv2d_default_params(), relu, pool, hi};
    if (isnan(hi)) { fm_set_error(FM_ERR_INVALID, "conv2d_fused: the cap is NaN"); return NULL; }
    if (!x || !w) { fm_set_error(FM_ERR_INVALID, "conv2d_fused: %s is NULL", x ? "weight" : "input"); return NULL; }
    int64_t ys[4];
    if (conv_check("conv2d_fused", x, w, b, &a.p, ys)) return NULL;
    if (x->dtype != FM_F32 && x->dtype != FM_F64) {
        fm_set_error(FM_ERR_INVALID, "conv2d_fused: needs f32 or f64, got %s (run conv2d, relu and max_pool2d)", fm_dtype_name(x->dtype));
        return NULL;
    }
    const int hx = a.p.layout == FM_NHWC ? 1 : 2;
    if (pool < 0 || (pool > 1 && (ys[hx] < pool || ys[hx + 1] < pool))) {
        fm_set_error(FM_ERR_INVALID, "conv2d_fused: pool %d must be 0, 1 (none) or a window that fits the %lldx%lld conv output", pool,
                     (long long)ys[hx], (long long)ys[hx + 1]);
        return NULL;
    }
    if (pool > 1) ys[hx] /= pool, ys[hx + 1] /= pool;
    fm_tensor *y = fm_tensor_empty(4, ys, x->dtype, fm_tensor_device(x));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    if (packed && (packed->ndim != 1 || packed->dtype != FM_F32)) {
        fm_tensor_release(y);
        fm_set_error(FM_ERR_INVALID, "conv2d_fused: packed weights must be fm_conv2d_fused_pack's 1-D f32 tensor");
        return NULL;
    }
    call.op = FM_OP_CONV2D_FUSED, call.n_in = 4, call.n_out = 1;
    call.in[0] = x, call.in[1] = w, call.in[2] = b, call.in[3] = packed, call.out[0] = y, call.attrs = &a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}
