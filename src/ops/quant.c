/* Front ends of the quantized inference ops (docs/QUANTIZE.md): shape and
 * dtype checks naming what is wrong, output allocation, dispatch. They have
 * no backward: quantized graphs are for inference only. */
#include <string.h>

#include "backend/kernel.h"    /* fm_qlinear8_attrs, fm_q4_attrs */
#include "dispatch/dispatch.h" /* fm_dispatch */

static fm_status need(const char *op, const char *what, const fm_tensor *t, fm_dtype dt, int ndim, const int64_t *dims) {
    char a[128], b[128];
    if (!t) return fm_set_error(FM_ERR_INVALID, "%s: %s is NULL", op, what);
    if (t->dtype != dt) return fm_set_error(FM_ERR_INVALID, "%s: %s must be %s, got %s", op, what, fm_dtype_name(dt), fm_dtype_name(t->dtype));
    if (t->ndim != ndim || memcmp(t->shape, dims, sizeof(int64_t) * (size_t)ndim))
        return fm_set_error(FM_ERR_INVALID, "%s: %s has shape %s, expected %s", op, what, fm_shape_str(t->ndim, t->shape, a, sizeof a),
                            fm_shape_str(ndim, dims, b, sizeof b));
    return FM_OK;
}

static fm_status same_device(const char *op, int n, fm_tensor *const *ts) {
    fm_device d = fm_tensor_device(ts[0]);
    for (int i = 1; i < n; i++)
        if (ts[i] && !fm_device_eq(d, fm_tensor_device(ts[i])))
            return fm_set_error(FM_ERR_INVALID, "%s: the inputs are on different devices", op);
    return FM_OK;
}

/* x [..., K] f32 -> the output shape [..., N] */
static fm_status x_rows(const char *op, const fm_tensor *x, int64_t K, int64_t N, int64_t *shape) {
    char a[128];
    if (!x) return fm_set_error(FM_ERR_INVALID, "%s: input is NULL", op);
    if (x->dtype != FM_F32) return fm_set_error(FM_ERR_INVALID, "%s: input must be f32, got %s", op, fm_dtype_name(x->dtype));
    if (x->ndim < 1 || x->shape[x->ndim - 1] != K)
        return fm_set_error(FM_ERR_INVALID, "%s: input %s must end in the weight's %lld input features", op,
                            fm_shape_str(x->ndim, x->shape, a, sizeof a), (long long)K);
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = N;
    return FM_OK;
}

static fm_tensor *run(fm_op_id op, int n_in, fm_tensor *const *in, int ndim, const int64_t *shape, const void *attrs) {
    fm_tensor *y = fm_tensor_empty(ndim, shape, FM_F32, fm_tensor_device(in[0]));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = op;
    call.n_in = n_in;
    for (int i = 0; i < n_in; i++) call.in[i] = in[i];
    call.n_out = 1;
    call.out[0] = y;
    call.attrs = attrs;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}

fm_tensor *fm_qlinear_int8(fm_tensor *x, fm_tensor *w, fm_tensor *w_scale, fm_tensor *bias, double a_scale, int a_zero) {
    const char *op = "qlinear_int8";
    char a[128];
    if (!w || w->ndim != 2 || w->dtype != FM_I8) {
        fm_set_error(FM_ERR_INVALID, "%s: weight must be a 2-D i8 tensor [out, in], got %s %s", op, w ? fm_dtype_name(w->dtype) : "NULL",
                     w ? fm_shape_str(w->ndim, w->shape, a, sizeof a) : "");
        return NULL;
    }
    int64_t N = w->shape[0], K = w->shape[1], shape[FM_MAX_DIMS];
    if (x_rows(op, x, K, N, shape) || need(op, "weight scale", w_scale, FM_F32, 1, &N) ||
        (bias && need(op, "bias", bias, FM_F32, 1, &N)) || same_device(op, 4, (fm_tensor *[]){x, w, w_scale, bias}))
        return NULL;
    if (!(a_scale >= 0) || a_scale > 1e30 || a_zero < 0 || a_zero > 255) {
        fm_set_error(FM_ERR_INVALID, "%s: activation scale %g must be finite and >= 0 (0: dynamic) and zero point %d in [0, 255]", op, a_scale, a_zero);
        return NULL;
    }
    fm_qlinear8_attrs at = {a_scale, a_zero, 0, 0};
    return run(FM_OP_QLINEAR_INT8, 5, (fm_tensor *[]){x, w, w_scale, bias, NULL}, x->ndim, shape, &at);
}

fm_tensor *fm_qlinear_int8_packed(fm_tensor *x, fm_tensor *panels, fm_tensor *w_scale, fm_tensor *w_sum, fm_tensor *bias, double a_scale,
                                  int a_zero, int act) {
    const char *op = "qlinear_int8 (panels)";
    char a[128];
    if (!w_scale || w_scale->ndim != 1) {
        fm_set_error(FM_ERR_INVALID, "%s: weight scale must be a 1-D f32 tensor [out]", op);
        return NULL;
    }
    const int64_t N = w_scale->shape[0];
    int64_t K = x && x->ndim >= 1 ? x->shape[x->ndim - 1] : 0, shape[FM_MAX_DIMS];
    if (K > 32768) {
        fm_set_error(FM_ERR_INVALID, "%s: %lld input features exceed the panels' 32768", op, (long long)K);
        return NULL;
    }
    int64_t pd[4] = {(N + 15) / 16, (K + 3) / 4, 16, 4};
    if (x_rows(op, x, K, N, shape)) return NULL;
    if (!panels || panels->dtype != FM_I8 || panels->ndim != 4 || memcmp(panels->shape, pd, sizeof pd)) {
        fm_set_error(FM_ERR_INVALID, "%s: panels must be i8 %s for %lld outputs and %lld input features (fm_pack_weight_int8), got %s %s", op,
                     fm_shape_str(4, pd, a, sizeof a), (long long)N, (long long)K, panels ? fm_dtype_name(panels->dtype) : "NULL",
                     panels ? fm_shape_str(panels->ndim, panels->shape, (char[128]){0}, 128) : "");
        return NULL;
    }
    if (need(op, "weight scale", w_scale, FM_F32, 1, &N) || need(op, "row sums", w_sum, FM_I32, 1, &N) ||
        (bias && need(op, "bias", bias, FM_F32, 1, &N)) || same_device(op, 5, (fm_tensor *[]){x, panels, w_scale, w_sum, bias}))
        return NULL;
    if (!(a_scale >= 0 || a_scale == FM_QLINEAR_INT8_PER_ROW) || a_scale > 1e30 || a_zero < 0 || a_zero > 255) {
        fm_set_error(FM_ERR_INVALID, "%s: activation scale %g must be finite and >= 0 (0: dynamic per call; "
                     "FM_QLINEAR_INT8_PER_ROW: dynamic per row) and zero point %d in [0, 255]", op, a_scale, a_zero);
        return NULL;
    }
    if (a_scale < 0 && fm_tensor_device(x).type == FM_DEV_CUDA) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: per-row activation scales run on the CPU only", op);
        return NULL;
    }
    if (act < FM_QACT_NONE || act > FM_QACT_GELU) {
        fm_set_error(FM_ERR_INVALID, "%s: activation %d is not one of FM_QACT_NONE (0), FM_QACT_RELU (1), FM_QACT_GELU_TANH (2), FM_QACT_GELU (3)",
                     op, act);
        return NULL;
    }
    fm_qlinear8_attrs at = {a_scale, a_zero, act, a_scale < 0 ? 1 : 0};
    return run(FM_OP_QLINEAR_INT8, 5, (fm_tensor *[]){x, panels, w_scale, bias, w_sum}, x->ndim, shape, &at);
}

fm_tensor *fm_qembedding_int8(fm_tensor *panels, fm_tensor *scale, fm_tensor *indices, int64_t dim) {
    const char *op = "qembedding_int8";
    char a[128];
    if (!scale || scale->ndim != 1 || scale->dtype != FM_F32) {
        fm_set_error(FM_ERR_INVALID, "%s: scale must be a 1-D f32 tensor [rows]", op);
        return NULL;
    }
    if (dim < 1 || dim > 32768) {
        fm_set_error(FM_ERR_INVALID, "%s: width %lld must be in [1, 32768] (the panels' input features)", op, (long long)dim);
        return NULL;
    }
    const int64_t V = scale->shape[0], pd[4] = {(V + 15) / 16, (dim + 3) / 4, 16, 4};
    if (!panels || panels->dtype != FM_I8 || panels->ndim != 4 || memcmp(panels->shape, pd, sizeof pd)) {
        fm_set_error(FM_ERR_INVALID, "%s: panels must be i8 %s for %lld rows of width %lld (fm_pack_weight_int8), got %s %s", op,
                     fm_shape_str(4, pd, a, sizeof a), (long long)V, (long long)dim, panels ? fm_dtype_name(panels->dtype) : "NULL",
                     panels ? fm_shape_str(panels->ndim, panels->shape, (char[128]){0}, 128) : "");
        return NULL;
    }
    if (!indices || (indices->dtype != FM_I64 && indices->dtype != FM_I32) || indices->ndim + 1 > FM_MAX_DIMS) {
        fm_set_error(FM_ERR_INVALID, "%s: indices must be i64 or i32 with at most %d dims", op, FM_MAX_DIMS - 1);
        return NULL;
    }
    if (same_device(op, 3, (fm_tensor *[]){panels, scale, indices})) return NULL;
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = dim;
    fm_q8emb_attrs at = {dim};
    return run(FM_OP_QEMBEDDING_INT8, 3, (fm_tensor *[]){panels, scale, indices}, indices->ndim + 1, shape, &at);
}

/* w [R, K/2] u8 with scale (and min) [R, K/group] f16; K from the packing */
static fm_status q4_weights(const char *op, const fm_tensor *w, const fm_tensor *scale, const fm_tensor *min, int group, int64_t *R, int64_t *K) {
    char a[128];
    if (group != 32 && group != 64 && group != 128)
        return fm_set_error(FM_ERR_INVALID, "%s: group %d must be 32, 64 or 128", op, group);
    if (!w || w->ndim != 2 || w->dtype != FM_U8)
        return fm_set_error(FM_ERR_INVALID, "%s: packed weight must be a 2-D u8 tensor [rows, in/2], got %s %s", op,
                            w ? fm_dtype_name(w->dtype) : "NULL", w ? fm_shape_str(w->ndim, w->shape, a, sizeof a) : "");
    *R = w->shape[0];
    *K = 2 * w->shape[1];
    if (*K % group)
        return fm_set_error(FM_ERR_INVALID, "%s: group %d does not divide the %lld input features", op, group, (long long)*K);
    int64_t sd[2] = {*R, *K / group};
    if (need(op, "scale", scale, FM_F16, 2, sd) || (min && need(op, "min", min, FM_F16, 2, sd))) return fm_last_status();
    return FM_OK;
}

fm_tensor *fm_qlinear_int4(fm_tensor *x, fm_tensor *w, fm_tensor *scale, fm_tensor *min, fm_tensor *bias, int group) {
    const char *op = "qlinear_int4";
    int64_t N = 0, K = 0, shape[FM_MAX_DIMS];
    if (q4_weights(op, w, scale, min, group, &N, &K) || x_rows(op, x, K, N, shape) || (bias && need(op, "bias", bias, FM_F32, 1, &N)) ||
        same_device(op, 5, (fm_tensor *[]){x, w, scale, min, bias}))
        return NULL;
    fm_q4_attrs at = {group};
    return run(FM_OP_QLINEAR_INT4, 5, (fm_tensor *[]){x, w, scale, min, bias}, x->ndim, shape, &at);
}

fm_tensor *fm_qembedding_int4(fm_tensor *w, fm_tensor *scale, fm_tensor *min, fm_tensor *indices, int group) {
    const char *op = "qembedding_int4";
    int64_t V = 0, D = 0, shape[FM_MAX_DIMS];
    if (q4_weights(op, w, scale, min, group, &V, &D)) return NULL;
    if (!indices || (indices->dtype != FM_I64 && indices->dtype != FM_I32) || indices->ndim + 1 > FM_MAX_DIMS) {
        fm_set_error(FM_ERR_INVALID, "%s: indices must be i64 or i32 with at most %d dims", op, FM_MAX_DIMS - 1);
        return NULL;
    }
    if (same_device(op, 4, (fm_tensor *[]){w, scale, min, indices})) return NULL;
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = D;
    fm_q4_attrs at = {group};
    return run(FM_OP_QEMBEDDING_INT4, 4, (fm_tensor *[]){w, scale, min, indices}, indices->ndim + 1, shape, &at);
}

fm_tensor *fm_qconv2d_int8(fm_tensor *x, fm_tensor *panels, fm_tensor *w_scale, fm_tensor *w_sum, fm_tensor *bias,
                           const fm_conv2d_params *p, int kh, int kw, double a_scale, int a_zero, bool relu, double hi, int pool) {
    const char *op = "qconv2d_int8";
    char a[128], b[128];
    if (!x || x->ndim != 4 || x->dtype != FM_F32) {
        fm_set_error(FM_ERR_INVALID, "%s: input must be an f32 [N, C, H, W] tensor, got %s %s", op, x ? fm_dtype_name(x->dtype) : "NULL",
                     x ? fm_shape_str(x->ndim, x->shape, a, sizeof a) : "");
        return NULL;
    }
    if (!p || p->groups != 1 || p->layout != FM_NCHW) {
        fm_set_error(FM_ERR_INVALID, "%s: groups 1 and layout NCHW only (grouped and NHWC convolutions stay fp32)", op);
        return NULL;
    }
    if (!w_scale || w_scale->ndim != 1) {
        fm_set_error(FM_ERR_INVALID, "%s: weight scale must be a 1-D f32 tensor [out channels]", op);
        return NULL;
    }
    bool geom_ok = kh >= 1 && kw >= 1 && kh <= 64 && kw <= 64;
    for (int i = 0; i < 2; i++)
        geom_ok = geom_ok && p->stride[i] >= 1 && p->dilation[i] >= 1 && p->padding[i] >= 0 && p->padding[i] <= 1024;
    const int64_t O = w_scale->shape[0], C = x->shape[1], K = (int64_t)kh * kw * C;
    const int64_t Ho = geom_ok ? fm_conv2d_out_size(x->shape[2], kh, p->stride[0], p->padding[0], p->dilation[0]) : -1;
    const int64_t Wo = geom_ok ? fm_conv2d_out_size(x->shape[3], kw, p->stride[1], p->padding[1], p->dilation[1]) : -1;
    if (Ho < 1 || Wo < 1) {
        fm_set_error(FM_ERR_INVALID, "%s: a %dx%d kernel (stride %d,%d, padding %d,%d, dilation %d,%d) does not fit input %s", op, kh, kw,
                     p->stride[0], p->stride[1], p->padding[0], p->padding[1], p->dilation[0], p->dilation[1],
                     fm_shape_str(4, x->shape, a, sizeof a));
        return NULL;
    }
    if (pool < 0 || pool > 64 || (pool > 1 && (Ho < pool || Wo < pool))) {
        fm_set_error(FM_ERR_INVALID, "%s: pool %d must be in [0, 64] and fit the convolution's %lldx%lld output", op, pool, (long long)Ho,
                     (long long)Wo);
        return NULL;
    }
    if (K > 32768) {
        fm_set_error(FM_ERR_INVALID, "%s: kh kw C = %lld exceeds the panels' 32768", op, (long long)K);
        return NULL;
    }
    int64_t pd[4] = {(O + 15) / 16, fm_qconv_panel_k(K) / 4, 16, 4};
    if (!panels || panels->dtype != FM_I8 || panels->ndim != 4 || memcmp(panels->shape, pd, sizeof pd)) {
        fm_set_error(FM_ERR_INVALID, "%s: panels must be i8 %s for %lld outputs and %dx%dx%lld weights (fm_quantize_conv_weight_int8), got %s %s",
                     op, fm_shape_str(4, pd, a, sizeof a), (long long)O, kh, kw, (long long)C, panels ? fm_dtype_name(panels->dtype) : "NULL",
                     panels ? fm_shape_str(panels->ndim, panels->shape, b, sizeof b) : "");
        return NULL;
    }
    if (need(op, "weight scale", w_scale, FM_F32, 1, &O) || need(op, "row sums", w_sum, FM_I32, 1, &O) ||
        (bias && need(op, "bias", bias, FM_F32, 1, &O)) || same_device(op, 5, (fm_tensor *[]){x, panels, w_scale, w_sum, bias}))
        return NULL;
    if (!(a_scale >= 0) || a_scale > 1e30 || a_zero < 0 || a_zero > 255 || hi != hi) {
        fm_set_error(FM_ERR_INVALID, "%s: activation scale %g must be finite and >= 0 (0: dynamic), zero point %d in [0, 255] and the cap not NaN",
                     op, a_scale, a_zero);
        return NULL;
    }
    fm_qconv8_attrs at = {kh, kw, {p->stride[0], p->stride[1]}, {p->padding[0], p->padding[1]}, {p->dilation[0], p->dilation[1]},
                          a_scale, a_zero, relu ? 1 : 0, hi, pool};
    const int64_t k = pool > 1 ? pool : 1, shape[4] = {x->shape[0], O, Ho / k, Wo / k};
    return run(FM_OP_QCONV2D_INT8, 5, (fm_tensor *[]){x, panels, w_scale, bias, w_sum}, 4, shape, &at);
}
