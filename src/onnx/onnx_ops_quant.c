/* ONNX's quantization ops, as ONNX Runtime's quantizer writes them (quantize_dynamic:
 * DynamicQuantizeLinear, MatMulInteger, ConvInteger; quantize_static: QuantizeLinear and
 * DequantizeLinear around float ops (QDQ), or QLinearMatMul and QLinearConv (QOperator)),
 * to uint8 and int8 only. Everything runs on the host: fathom has no integer matmul or
 * conv, so the integer products are fathom's f64 matmul and conv of (q - zero point),
 * exact while a sum stays below 2^53 (255^2 times 2^37 terms), then converted to int32.
 * QuantizeLinear divides, and DequantizeLinear multiplies, in float32 as ONNX Runtime
 * does, rounding half to even and saturating; a NaN quantizes to the type's minimum
 * (ONNX Runtime's result, from its clamp). */
#include "onnx/onnx_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

static const char *in_name(const onnx_op_ctx *c, int k) { return k < (int)c->node->n_input ? c->node->input[k] : "?"; }
static fm_tensor *opt_in(const onnx_op_ctx *c, int k) { return k >= 0 && k < c->n_in ? c->in[k] : NULL; }
static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }

/* The ONNX names of the element types a quantization op may ask for that fathom lacks. */
static const char *qtype_name(int64_t t) {
    static const char *const names[] = {[4] = "uint16", [5] = "int16", [17] = "float8e4m3fn", [18] = "float8e4m3fnuz",
                                        [19] = "float8e5m2", [20] = "float8e5m2fnuz", [21] = "uint4", [22] = "int4",
                                        [23] = "float4e2m1", [24] = "float8e8m0", [25] = "uint2", [26] = "int2"};
    return t >= 0 && t < (int64_t)(sizeof names / sizeof *names) && names[t] ? names[t] : onnx_dtype_name((int32_t)t);
}

static bool is_q8(fm_dtype dt) { return dt == FM_U8 || dt == FM_I8; }

/* Input k must be uint8 or int8 (also int32 when wide); an error naming it otherwise. */
static fm_status need_q8(const onnx_op_ctx *c, int k, bool wide) {
    const fm_tensor *t = c->in[k];
    if (is_q8(t->dtype) || (wide && t->dtype == FM_I32)) return FM_OK;
    return onnx_node_error(c, FM_ERR_UNSUPPORTED, "input %d ('%s') has dtype %s; it must be uint8 or int8%s", k, in_name(c, k),
                           fm_dtype_name(t->dtype), wide ? " or int32" : "");
}

/* Zero point input z (when given) must have the dtype of input k, as ONNX requires. */
static fm_status need_same_dtype(const onnx_op_ctx *c, int z, int k) {
    const fm_tensor *t = opt_in(c, z);
    if (!t || t->dtype == c->in[k]->dtype) return FM_OK;
    return onnx_node_error(c, FM_ERR_INVALID, "zero point input %d ('%s') has dtype %s; it must be %s, as input %d ('%s')", z,
                           in_name(c, z), fm_dtype_name(t->dtype), fm_dtype_name(c->in[k]->dtype), k, in_name(c, k));
}

/* Scale input k must be a floating-point tensor. */
static fm_status need_float(const onnx_op_ctx *c, int k) {
    if (fm_dtype_is_float(c->in[k]->dtype)) return FM_OK;
    return onnx_node_error(c, FM_ERR_INVALID, "scale input %d ('%s') has dtype %s; it must be floating-point", k, in_name(c, k),
                           fm_dtype_name(c->in[k]->dtype));
}

/* Saturates v (already rounded; NaN: the minimum, as ONNX Runtime) plus zp into a uint8 or int8 element. */
static void store_q8(void *dst, fm_dtype dt, int64_t i, double v, double zp) {
    const double lo = dt == FM_U8 ? 0 : -128, hi = dt == FM_U8 ? 255 : 127;
    double q = isnan(v) ? lo : v + zp;
    q = q < lo ? lo : q > hi ? hi : q;
    if (dt == FM_U8) ((uint8_t *)dst)[i] = (uint8_t)q;
    else ((int8_t *)dst)[i] = (int8_t)q;
}

/* ---- QuantizeLinear / DequantizeLinear: the scale and zero point's layout ---- */
/* Per tensor (one value), per axis (one per index along axis) or blocked (block_size
 * consecutive indices along axis share one; scale has x's rank with that dim
 * ceil(n / block_size)). x is seen as [outer, n, inner] around the axis. */
typedef struct qparams {
    fm_tensor *sh, *zh;     /* host copies: f32 scale, i32 zero point (NULL: 0) */
    const float *s;
    const int32_t *z;
    int64_t n, inner, bs, nb;
    bool per_axis;
} qparams;

static int64_t qp_index(const qparams *q, int64_t i) {
    if (!q->per_axis) return 0;
    const int64_t a = (i / q->inner) % q->n;
    if (!q->bs) return a;
    const int64_t o = i / (q->inner * q->n), in = i % q->inner;
    return (o * q->nb + a / q->bs) * q->inner + in;
}

/* The scale's shape checked against x's and the axis; q->per_axis set. */
static fm_status qp_layout(const onnx_op_ctx *c, const fm_tensor *x, const fm_tensor *s, qparams *q) {
    const int64_t bs = onnx_attr_int(c, "block_size", 0);
    if (bs < 0) return onnx_node_error(c, FM_ERR_INVALID, "block_size %lld is negative", (long long)bs);
    q->bs = bs, q->n = 1, q->inner = 1, q->nb = 1;
    if (!bs && fm_tensor_numel(s) == 1 && s->ndim <= 1) return FM_OK; /* per tensor */
    if (!bs && c->opset < 13)
        return onnx_node_error(c, FM_ERR_INVALID, "scale '%s' must be a scalar before opset 13 (per-axis scales came then)", in_name(c, 1));
    int axis;
    if (fm_norm_axis(c->node->op_type, (int)onnx_attr_int(c, "axis", 1), x->ndim, &axis)) return fm_last_status();
    q->per_axis = true, q->n = x->shape[axis];
    for (int d = axis + 1; d < x->ndim; d++) q->inner *= x->shape[d];
    q->nb = bs ? (q->n + bs - 1) / bs : q->n;
    bool ok = bs ? s->ndim == x->ndim : s->ndim == 1 && s->shape[0] == q->n;
    for (int d = 0; bs && ok && d < x->ndim; d++) ok = s->shape[d] == (d == axis ? q->nb : x->shape[d]);
    if (ok) return FM_OK;
    char a[96], b[96];
    return onnx_node_error(c, FM_ERR_INVALID, "scale '%s' has shape %s; for x of shape %s with axis %d and block_size %lld it must %s",
                           in_name(c, 1), fm_shape_str(s->ndim, s->shape, a, sizeof a), fm_shape_str(x->ndim, x->shape, b, sizeof b),
                           axis, (long long)bs, bs ? "have x's shape with the axis divided into blocks" : "be a scalar or hold one value per index along the axis");
}

/* Inputs 1 (scale) and 2 (zero point, optional) of a QuantizeLinear or DequantizeLinear of x. */
static fm_status qparams_of(const onnx_op_ctx *c, const fm_tensor *x, qparams *q) {
    memset(q, 0, sizeof *q);
    const fm_tensor *s = c->in[1], *z = opt_in(c, 2);
    if (need_float(c, 1) || qp_layout(c, x, s, q)) return fm_last_status();
    if (z && (z->ndim != s->ndim || memcmp(z->shape, s->shape, (size_t)s->ndim * sizeof *s->shape)) &&
        !(fm_tensor_numel(z) == 1 && !q->per_axis && z->ndim <= 1)) {
        char a[96], b[96];
        return onnx_node_error(c, FM_ERR_INVALID, "zero point '%s' has shape %s; it must have the scale's shape %s", in_name(c, 2),
                               fm_shape_str(z->ndim, z->shape, a, sizeof a), fm_shape_str(s->ndim, s->shape, b, sizeof b));
    }
    q->sh = onnx_host((fm_tensor *)s, FM_F32);
    q->zh = q->sh && z ? onnx_host((fm_tensor *)z, FM_I32) : NULL;
    if (!q->sh || (z && !q->zh)) {
        REL(q->sh, q->zh);
        return fm_last_status();
    }
    q->s = fm_tensor_data(q->sh);
    q->z = q->zh ? fm_tensor_data(q->zh) : NULL;
    return FM_OK;
}

/* QuantizeLinear's output dtype: its zero point's, else output_dtype's (opset 21), else uint8. */
static fm_status quant_out_dtype(const onnx_op_ctx *c, fm_dtype *dt) {
    const fm_tensor *z = opt_in(c, 2);
    const int64_t od = onnx_attr_int(c, "output_dtype", 0);
    if (z && !is_q8(z->dtype))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "zero point '%s' has dtype %s: fathom quantizes to uint8 and int8 only",
                               in_name(c, 2), fm_dtype_name(z->dtype));
    *dt = z ? z->dtype : od == ONNX__TENSOR_PROTO__DATA_TYPE__INT8 ? FM_I8 : FM_U8;
    if (!od || od == onnx_dtype_from_fm(*dt)) return FM_OK;
    if (od != ONNX__TENSOR_PROTO__DATA_TYPE__UINT8 && od != ONNX__TENSOR_PROTO__DATA_TYPE__INT8)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "output_dtype %s is not supported: the dtype must be uint8 or int8", qtype_name(od));
    return onnx_node_error(c, FM_ERR_INVALID, "output_dtype %s differs from the zero point's dtype %s", qtype_name(od), fm_dtype_name(*dt));
}

/* y = saturate(round_half_even(x / scale) + zero_point), the division in float32. */
static fm_status op_quantize(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    fm_dtype dt = FM_U8;
    const int64_t prec = onnx_attr_int(c, "precision", 0);
    if (quant_out_dtype(c, &dt)) return fm_last_status();
    if (prec && prec != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "precision %s is not supported (float only)", qtype_name(prec));
    if (!fm_dtype_is_float(x->dtype) && x->dtype != FM_I32)
        return onnx_node_error(c, FM_ERR_INVALID, "x has dtype %s; it must be floating-point or int32", fm_dtype_name(x->dtype));
    qparams q;
    if (qparams_of(c, x, &q)) return fm_last_status();
    fm_tensor *h = onnx_host(x, FM_F32), *y = h ? fm_tensor_empty(x->ndim, x->shape, dt, FM_CPU) : NULL;
    if (y) {
        const float *xs = fm_tensor_data(h);
        void *d = fm_tensor_data(y);
        for (int64_t i = 0, n = fm_tensor_numel(h); i < n; i++) {
            const int64_t k = qp_index(&q, i);
            const float v = xs[i] / q.s[k]; /* float32, as ONNX Runtime divides */
            store_q8(d, dt, i, nearbyintf(v), q.z ? q.z[k] : 0);
        }
    }
    REL(h, q.sh, q.zh);
    return onnx_set_out(c, 0, onnx_host_back(y, dt, dev_of(x)));
}

/* DequantizeLinear's output dtype: output_dtype (opset 23) when set, else the scale's. */
static fm_status dequant_out_dtype(const onnx_op_ctx *c, fm_dtype *dt) {
    const int64_t od = onnx_attr_int(c, "output_dtype", 0);
    *dt = c->in[1]->dtype;
    if (!od) return FM_OK;
    if (!onnx_dtype_to_fm((int32_t)od, dt) || !fm_dtype_is_float(*dt))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "output_dtype %s is not supported: the dtype must be a float type fathom has",
                               qtype_name(od));
    return FM_OK;
}

/* y = (x - zero_point) * scale in float32, in the scale's dtype (or output_dtype). */
static fm_status op_dequantize(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    fm_dtype dt = FM_U8;
    if (need_q8(c, 0, true) || need_same_dtype(c, 2, 0) || need_float(c, 1) || dequant_out_dtype(c, &dt)) return fm_last_status();
    qparams q;
    if (qparams_of(c, x, &q)) return fm_last_status();
    for (int64_t i = 0, n = q.z && x->dtype == FM_I32 ? fm_tensor_numel(q.zh) : 0; i < n; i++)
        if (q.z[i]) {
            REL(q.sh, q.zh);
            return onnx_node_error(c, FM_ERR_INVALID, "int32 input with zero point %d at %lld: it must be 0", (int)q.z[i], (long long)i);
        }
    fm_tensor *h = onnx_host(x, FM_I32), *y = h ? fm_tensor_empty(x->ndim, x->shape, FM_F32, FM_CPU) : NULL;
    if (y) {
        const int32_t *xs = fm_tensor_data(h);
        float *d = fm_tensor_data(y);
        for (int64_t i = 0, n = fm_tensor_numel(h); i < n; i++) {
            const int64_t k = qp_index(&q, i);
            d[i] = (float)(xs[i] - (q.z ? q.z[k] : 0)) * q.s[k];
        }
    }
    REL(h, q.sh, q.zh);
    return onnx_set_out(c, 0, onnx_host_back(y, dt, dev_of(x)));
}

/* DynamicQuantizeLinear: uint8 over the range of x widened to hold 0 (NaNs ignored);
 * scale (max - min) / 255, 1 when the range is empty (ONNX Runtime's value for an
 * all-zero x, where the spec's formula divides by 0); zero point
 * saturate(round(0 - min / scale)). In float32, as ONNX Runtime. */
static fm_status op_dynamic_quantize(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    if (x->dtype != FM_F32)
        return onnx_node_error(c, FM_ERR_INVALID, "x has dtype %s; DynamicQuantizeLinear takes float32", fm_dtype_name(x->dtype));
    fm_tensor *h = onnx_host(x, FM_F32), *y = h ? fm_tensor_empty(x->ndim, x->shape, FM_U8, FM_CPU) : NULL;
    if (!y) {
        REL(h);
        return fm_last_status();
    }
    const float *xs = fm_tensor_data(h);
    const int64_t n = fm_tensor_numel(h);
    float mn = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        if (xs[i] < mn) mn = xs[i];
        if (xs[i] > mx) mx = xs[i];
    }
    const float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f, z0 = 0.0f - mn / scale;
    uint8_t zp;
    store_q8(&zp, FM_U8, 0, nearbyintf(z0 < 0 ? 0 : z0 > 255 ? 255 : z0), 0);
    for (int64_t i = 0; i < n; i++) store_q8(fm_tensor_data(y), FM_U8, i, nearbyintf(xs[i] / scale), zp);
    fm_tensor_release(h);
    const fm_device dev = dev_of(x);
    if (onnx_set_out(c, 0, onnx_host_back(y, FM_U8, dev)) || onnx_set_out(c, 1, fm_tensor_full(0, NULL, scale, FM_F32, dev)))
        return fm_last_status();
    return onnx_set_out(c, 2, fm_tensor_full(0, NULL, zp, FM_U8, dev));
}

/* ---- the integer matmul and conv: f64 of (q - zero point) on the host ---- */
/* Input k (a zero point or a scale, dtype dt on the host) shaped to broadcast against op:
 * one value (a scalar); a vector along op's dim vec (-1: none) as op's rank, 1 elsewhere;
 * or (red >= 0) op's rank with each dim 1 or op's, dim red (the reduced one) 1. */
static fm_tensor *bcast_param(const onnx_op_ctx *c, int k, const fm_tensor *op, int vec, int red, fm_dtype dt) {
    fm_tensor *t = c->in[k];
    int64_t sh[FM_MAX_DIMS];
    int nd = 0;
    bool ok = fm_tensor_numel(t) == 1;
    if (!ok && vec >= 0 && t->ndim == 1 && t->shape[0] == op->shape[vec]) {
        ok = true, nd = op->ndim;
        for (int d = 0; d < nd; d++) sh[d] = d == vec ? t->shape[0] : 1;
    } else if (!ok && red >= 0 && t->ndim == op->ndim && t->shape[red] == 1) {
        ok = true, nd = op->ndim;
        for (int d = 0; d < nd; d++) ok &= t->shape[d] == 1 || t->shape[d] == op->shape[d], sh[d] = t->shape[d];
    }
    if (!ok) {
        char a[96], b[96];
        char v[48] = "";
        if (vec >= 0) snprintf(v, sizeof v, " or one per index of dim %d", vec);
        onnx_node_error(c, FM_ERR_INVALID, "input %d ('%s') has shape %s, which does not fit %s: it must be one value%s%s", k,
                        in_name(c, k), fm_shape_str(t->ndim, t->shape, a, sizeof a), fm_shape_str(op->ndim, op->shape, b, sizeof b), v,
                        red >= 0 ? " (or that shape, 1 along the reduced dim)" : "");
        return NULL;
    }
    fm_tensor *h = onnx_host(t, dt), *r = h ? fm_reshape(h, nd, sh) : NULL;
    fm_tensor_release(h);
    return r;
}

/* Input k minus zero point input z (omitted: 0) as a host f64 tensor, the zero point laid
 * out by bcast_param(vec, red). */
static fm_tensor *shifted(const onnx_op_ctx *c, int k, int z, int vec, int red) {
    if (need_q8(c, k, false) || need_same_dtype(c, z, k)) return NULL;
    fm_tensor *x = onnx_host(c->in[k], FM_F64);
    if (!x || !opt_in(c, z)) return x;
    fm_tensor *zb = bcast_param(c, z, c->in[k], vec, red, FM_F64), *y = zb ? fm_sub(x, zb) : NULL;
    REL(x, zb);
    return y;
}

/* (A - a_zp) @ (B - b_zp) exactly, as f64: a_zp per tensor or per row of A, b_zp per
 * tensor or per column of B (or with their batch dims, as the spec's N-D forms). */
static fm_tensor *int_matmul(const onnx_op_ctx *c, int ka, int za, int kb, int zb) {
    const int na = c->in[ka]->ndim, nb = c->in[kb]->ndim;
    fm_tensor *a = shifted(c, ka, za, na >= 2 ? na - 2 : -1, na >= 2 ? na - 1 : -1);
    fm_tensor *b = a ? shifted(c, kb, zb, nb >= 2 ? nb - 1 : -1, nb >= 2 ? nb - 2 : -1) : NULL;
    fm_tensor *y = b ? fm_matmul(a, b) : NULL;
    REL(a, b);
    return y;
}

/* ONNX's Conv (its attributes read from this node, which shares them) on f64 tensors. */
static fm_tensor *run_conv(const onnx_op_ctx *c, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    const onnx_op *conv = onnx_find_op("Conv");
    fm_tensor *in[3] = {x, w, b}, *out[1] = {NULL};
    onnx_op_ctx s = *c;
    s.in = in, s.n_in = b ? 3 : 2, s.out = out, s.n_out = 1;
    if (!conv) {
        fm_set_error(FM_ERR_INTERNAL, "the Conv op is missing");
        return NULL;
    }
    return conv->fn(&s) ? NULL : out[0];
}

/* (x - x_zp) conv (w - w_zp) exactly, as f64 (+ bias, an int32 [M], when kb >= 0):
 * x_zp per tensor, w_zp per tensor or per output channel. */
static fm_tensor *int_conv(const onnx_op_ctx *c, int kx, int zx, int kw, int zw, int kb) {
    if (c->in[kx]->ndim < 3 || c->in[kw]->ndim != c->in[kx]->ndim) {
        onnx_node_error(c, FM_ERR_INVALID, "x (rank %d) and w (rank %d) must be [N, C, spatial...] and [M, C/group, kernel...]",
                        c->in[kx]->ndim, c->in[kw]->ndim);
        return NULL;
    }
    fm_tensor *b = opt_in(c, kb), *bh = NULL;
    if (b && (b->dtype != FM_I32 || b->ndim != 1 || b->shape[0] != c->in[kw]->shape[0])) {
        onnx_node_error(c, FM_ERR_INVALID, "bias '%s' must be int32 [%lld]; got %s with %d dims", in_name(c, kb),
                        (long long)c->in[kw]->shape[0], fm_dtype_name(b->dtype), b->ndim);
        return NULL;
    }
    fm_tensor *x = shifted(c, kx, zx, -1, -1), *w = x ? shifted(c, kw, zw, 0, -1) : NULL;
    if (w && b) bh = onnx_host(b, FM_F64);
    fm_tensor *y = w && (!b || bh) ? run_conv(c, x, w, bh) : NULL;
    REL(x, w, bh);
    return y;
}

/* y = saturate(round_half_even(acc * multiplier) + y_zp) (multiplier: host, broadcasting
 * against acc; y_zp: input z, one value of uint8 or int8), on x's device. The product is
 * f64, as ONNX's reference (ONNX Runtime's float32 may differ by one where it lands on a
 * half). */
static fm_status requantize(onnx_op_ctx *c, fm_tensor *acc, fm_tensor *mult, int z) {
    fm_tensor *zt = c->in[z];
    if (!is_q8(zt->dtype) || fm_tensor_numel(zt) != 1)
        return onnx_node_error(c, FM_ERR_INVALID, "output zero point '%s' must be one uint8 or int8 value; got %s with %lld values",
                               in_name(c, z), fm_dtype_name(zt->dtype), (long long)fm_tensor_numel(zt));
    const fm_dtype dt = zt->dtype;
    const double zp = fm_tensor_item(zt);
    fm_tensor *m = fm_to_dtype(mult, FM_F64), *p = m ? fm_mul(acc, m) : NULL, *pc = p ? fm_contiguous(p) : NULL;
    fm_tensor *y = pc ? fm_tensor_empty(pc->ndim, pc->shape, dt, FM_CPU) : NULL;
    if (y) {
        const double *s = fm_tensor_data(pc);
        for (int64_t i = 0, n = fm_tensor_numel(pc); i < n; i++) store_q8(fm_tensor_data(y), dt, i, nearbyint(s[i]), zp);
    }
    REL(m, p, pc);
    return onnx_set_out(c, 0, onnx_host_back(y, dt, dev_of(c->in[0])));
}

/* a_scale * b_scale / y_scale in the scales' dtype (as ONNX's reference), each laid out
 * against the output. The scales must share one floating-point dtype. */
static fm_tensor *multiplier(const onnx_op_ctx *c, fm_tensor *sa, fm_tensor *sb, int ky) {
    fm_tensor *sy = c->in[ky];
    if (need_float(c, ky) || !sa || !sb) return NULL;
    if (sa->dtype != sy->dtype || sb->dtype != sy->dtype || fm_tensor_numel(sy) != 1) {
        onnx_node_error(c, FM_ERR_INVALID, "the scales must share one float dtype (%s, %s, %s) and y_scale '%s' be one value",
                        fm_dtype_name(sa->dtype), fm_dtype_name(sb->dtype), fm_dtype_name(sy->dtype), in_name(c, ky));
        return NULL;
    }
    fm_tensor *yh = onnx_host(sy, sy->dtype), *ys = yh ? fm_reshape(yh, 0, NULL) : NULL;
    fm_tensor *ab = ys ? fm_mul(sa, sb) : NULL, *m = ab ? fm_div(ab, ys) : NULL;
    REL(yh, ys, ab);
    return m;
}

/* MatMulInteger: int32 (A - a_zp) @ (B - b_zp). */
static fm_status op_matmul_integer(onnx_op_ctx *c) {
    fm_tensor *y = int_matmul(c, 0, 2, 1, 3);
    return onnx_set_out(c, 0, y ? onnx_host_back(y, FM_I32, dev_of(c->in[0])) : NULL);
}

/* ConvInteger: int32 (x - x_zp) conv (w - w_zp), Conv's attributes. */
static fm_status op_conv_integer(onnx_op_ctx *c) {
    fm_tensor *y = int_conv(c, 0, 2, 1, 3, -1);
    return onnx_set_out(c, 0, y ? onnx_host_back(y, FM_I32, dev_of(c->in[0])) : NULL);
}

/* QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp): the exact integer
 * product requantized; a_scale per tensor or row, b_scale per tensor or column. */
static fm_status op_qlinear_matmul(onnx_op_ctx *c) {
    if (need_float(c, 1) || need_float(c, 4)) return fm_last_status();
    fm_tensor *acc = int_matmul(c, 0, 2, 3, 5);
    const int na = c->in[0]->ndim, nb = c->in[3]->ndim;
    fm_tensor *sa = acc ? bcast_param(c, 1, c->in[0], na >= 2 ? na - 2 : -1, na >= 2 ? na - 1 : -1, c->in[1]->dtype) : NULL;
    fm_tensor *sb = sa ? bcast_param(c, 4, c->in[3], nb >= 2 ? nb - 1 : -1, nb >= 2 ? nb - 2 : -1, c->in[4]->dtype) : NULL;
    fm_tensor *m = sb ? multiplier(c, sa, sb, 6) : NULL;
    fm_status st = m ? requantize(c, acc, m, 7) : fm_last_status();
    REL(acc, sa, sb, m);
    return st;
}

/* QLinearConv (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B): the exact integer
 * conv plus the int32 bias (at scale x_scale * w_scale) requantized; w_scale per tensor
 * or per output channel. */
static fm_status op_qlinear_conv(onnx_op_ctx *c) {
    if (need_float(c, 1) || need_float(c, 4)) return fm_last_status();
    fm_tensor *acc = int_conv(c, 0, 2, 3, 5, 8);
    fm_tensor *sx = acc ? bcast_param(c, 1, c->in[0], -1, -1, c->in[1]->dtype) : NULL;
    fm_tensor *sb = sx ? bcast_param(c, 4, acc, 1, -1, c->in[4]->dtype) : NULL; /* per channel: dim 1 of y */
    fm_tensor *m = sb ? multiplier(c, sx, sb, 6) : NULL;
    fm_status st = m ? requantize(c, acc, m, 7) : fm_last_status();
    REL(acc, sx, sb, m);
    return st;
}

#define CONV_ATTRS "auto_pad,kernel_shape,pads,strides,dilations,group"
const onnx_op onnx_ops_quant[] = {
    {"QuantizeLinear", 10, 2, 3, 1, "axis,saturate,block_size,output_dtype,precision", op_quantize},
    {"DequantizeLinear", 10, 2, 3, 1, "axis,block_size,output_dtype", op_dequantize},
    {"DynamicQuantizeLinear", 11, 1, 1, 3, "", op_dynamic_quantize},
    {"MatMulInteger", 10, 2, 4, 1, "", op_matmul_integer},
    {"ConvInteger", 10, 2, 4, 1, CONV_ATTRS, op_conv_integer},
    {"QLinearMatMul", 10, 8, 8, 1, "", op_qlinear_matmul},
    {"QLinearConv", 10, 8, 9, 1, CONV_ATTRS, op_qlinear_conv},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
