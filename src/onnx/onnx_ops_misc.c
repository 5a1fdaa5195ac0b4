/* ONNX ops that are rearrangements or short compositions of fathom ops: DepthToSpace and
 * SpaceToDepth (a reshape, a transpose and a reshape: super-resolution and YOLO-style
 * models), GatherND (flat offsets then one index_select: detection and question-answering
 * exports), OneHot, EyeLike, Shrink, MeanVarianceNormalization and LRN (AlexNet and
 * Inception-era models). Each runs on the input's device; the graph forms are in
 * onnx_graph_ops.c. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }

static fm_tensor *scalar_like(const fm_tensor *x, double v) { return fm_tensor_full(0, NULL, v, x->dtype, dev_of(x)); }

/* ---- DepthToSpace / SpaceToDepth ---- */

fm_status onnx_space_depth_plan(const onnx_op_ctx *c, const int64_t *xs, onnx_space_depth *p) {
    const bool to_space = !strcmp(c->node->op_type, "DepthToSpace");
    const int64_t b = onnx_attr_int(c, "blocksize", 0), N = xs[0], C = xs[1], H = xs[2], W = xs[3];
    char buf[8];
    const char *mode = onnx_attr_string(c, "mode", "DCR", buf, sizeof buf);
    if (b < 1) return onnx_node_error(c, FM_ERR_INVALID, "blocksize must be >= 1, got %" PRId64, b);
    const bool crd = to_space && !strcmp(mode, "CRD");
    if (to_space && !crd && strcmp(mode, "DCR")) return onnx_node_error(c, FM_ERR_INVALID, "mode '%s' is not DCR or CRD", mode);
    if (to_space ? C % (b * b) : H % b || W % b)
        return onnx_node_error(c, FM_ERR_INVALID, "blocksize %" PRId64 " does not divide %s", b, to_space ? "the channels (by its square)" : "H and W");
    if (to_space) {
        const int64_t Co = C / (b * b), a[6] = {N, b, b, Co, H, W}, m[6] = {N, Co, b, b, H, W};
        memcpy(p->mid, crd ? m : a, sizeof p->mid);
        const int pa[6] = {0, 3, 4, 1, 5, 2}, pm[6] = {0, 1, 4, 2, 5, 3};
        memcpy(p->perm, crd ? pm : pa, sizeof p->perm);
        const int64_t o[4] = {N, Co, H * b, W * b};
        memcpy(p->out, o, sizeof p->out);
    } else {
        const int64_t m[6] = {N, C, H / b, b, W / b, b}, o[4] = {N, C * b * b, H / b, W / b};
        const int pm[6] = {0, 3, 5, 1, 2, 4};
        memcpy(p->mid, m, sizeof p->mid), memcpy(p->perm, pm, sizeof p->perm), memcpy(p->out, o, sizeof p->out);
    }
    return FM_OK;
}

static fm_status op_space_depth(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    if (x->ndim != 4) return onnx_node_error(c, FM_ERR_INVALID, "input must be [N, C, H, W]; got rank %d", x->ndim);
    onnx_space_depth p;
    if (onnx_space_depth_plan(c, x->shape, &p)) return fm_last_status();
    fm_tensor *a = fm_reshape(x, 6, p.mid), *t = a ? fm_permute(a, p.perm) : NULL, *y = t ? fm_reshape(t, 4, p.out) : NULL;
    REL(a, t);
    return onnx_set_out(c, 0, y);
}

/* ---- GatherND ---- */

/* The flat row of every index tuple into data seen as [prod(shape[:b+k]), rest...]: the
 * batch position times the block, plus the tuple (negative from the end), checked. */
static fm_status gather_nd_offsets(const onnx_op_ctx *c, const fm_tensor *data, const fm_tensor *ih, int b, int64_t *off) {
    const int q = ih->ndim, k = (int)ih->shape[q - 1];
    const int64_t *iv = fm_tensor_data(ih), m = k ? fm_tensor_numel(ih) / k : fm_tensor_numel(ih);
    int64_t per_batch = 1, block = 1;
    for (int d = b; d < q - 1; d++) per_batch *= ih->shape[d];
    for (int d = b; d < b + k; d++) block *= data->shape[d];
    for (int64_t i = 0; i < m; i++) {
        int64_t o = 0;
        for (int j = 0; j < k; j++) {
            const int64_t dim = data->shape[b + j], v = iv[i * k + j];
            if (v < -dim || v >= dim)
                return onnx_node_error(c, FM_ERR_INVALID, "index %" PRId64 " (tuple %" PRId64 ") is out of range for dim %d of size %" PRId64,
                                       v, i, b + j, dim);
            o = o * dim + (v < 0 ? v + dim : v);
        }
        off[i] = (per_batch ? i / per_batch : 0) * block + o;
    }
    return FM_OK;
}

fm_status onnx_gather_nd_check(const onnx_op_ctx *c, int r, const int64_t *ds, int q, const int64_t *is, int b) {
    if (q < 1 || b < 0 || b >= q || b >= r)
        return onnx_node_error(c, FM_ERR_INVALID, "batch_dims %d must be below the ranks of data (%d) and indices (%d)", b, r, q);
    const int64_t k = is[q - 1];
    if (k < 1 || k > r - b) return onnx_node_error(c, FM_ERR_INVALID, "indices' last dim %" PRId64 " must be in [1, %d]", k, r - b);
    for (int d = 0; d < b; d++)
        if (ds[d] != is[d])
            return onnx_node_error(c, FM_ERR_INVALID, "batch dim %d is %" PRId64 " in data but %" PRId64 " in indices", d, ds[d], is[d]);
    return FM_OK;
}

static fm_status op_gather_nd(onnx_op_ctx *c) {
    fm_tensor *data = c->in[0], *idx = c->in[1];
    const int b = (int)onnx_attr_int(c, "batch_dims", 0), q = idx->ndim, r = data->ndim;
    if (idx->dtype != FM_I64 && idx->dtype != FM_I32) return onnx_node_error(c, FM_ERR_INVALID, "indices must be int64 or int32");
    if (onnx_gather_nd_check(c, r, data->shape, q, idx->shape, b)) return fm_last_status();
    const int k = (int)idx->shape[q - 1];
    int64_t rows = 1, osh[FM_MAX_DIMS], fsh[FM_MAX_DIMS];
    int on = 0, fn = 1;
    for (int d = 0; d < b + k; d++) rows *= data->shape[d];
    fsh[0] = rows;
    for (int d = b + k; d < r; d++) fsh[fn++] = data->shape[d];
    for (int d = 0; d < q - 1; d++) osh[on++] = idx->shape[d];
    for (int d = b + k; d < r; d++) osh[on++] = data->shape[d];
    if (on > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_INVALID, "the output would have %d dims", on);
    fm_tensor *ih = onnx_host(idx, FM_I64);
    const int64_t m = ih ? fm_tensor_numel(ih) / k : 0;
    fm_tensor *ot = ih ? fm_tensor_empty(1, &m, FM_I64, FM_CPU) : NULL;
    fm_status st = ot ? gather_nd_offsets(c, data, ih, b, fm_tensor_data(ot)) : fm_last_status();
    fm_tensor *od = !st ? fm_tensor_to(ot, dev_of(data)) : NULL, *flat = od ? fm_reshape(data, fn, fsh) : NULL;
    fm_tensor *g = flat ? fm_index_select(flat, 0, od) : NULL, *y = g ? fm_reshape(g, on, osh) : NULL;
    REL(ih, ot, od, flat, g);
    return st ? st : onnx_set_out(c, 0, y);
}

/* ---- OneHot ---- */

/* y = where(index (negative from the end) == position along axis, on, off); indices
 * outside [-depth, depth) give a row of off, as the spec says. */
static fm_status op_one_hot(onnx_op_ctx *c) {
    fm_tensor *idx = c->in[0], *vals = c->in[2];
    if (fm_tensor_numel(c->in[1]) != 1) return onnx_node_error(c, FM_ERR_INVALID, "depth must hold one value");
    if (fm_tensor_numel(vals) != 2) return onnx_node_error(c, FM_ERR_INVALID, "values must hold [off_value, on_value]");
    const double dd = fm_tensor_item(c->in[1]);
    if (!(dd >= 1 && dd <= (double)(INT64_C(1) << 31))) return onnx_node_error(c, FM_ERR_INVALID, "depth %g must be in [1, 2^31]", dd);
    const int64_t depth = (int64_t)dd;
    int axis;
    if (fm_norm_axis("OneHot", (int)onnx_attr_int(c, "axis", -1), idx->ndim + 1, &axis)) return fm_last_status();
    int64_t ash[FM_MAX_DIMS];
    for (int d = 0; d <= idx->ndim; d++) ash[d] = d == axis ? depth : 1;
    fm_tensor *i64 = fm_to_dtype(idx, fm_dtype_is_float(idx->dtype) ? FM_F64 : FM_I64), *z = i64 ? scalar_like(i64, 0) : NULL;
    fm_tensor *neg = z ? fm_lt(i64, z) : NULL, *up = neg ? fm_add_scalar(i64, (double)depth) : NULL;
    fm_tensor *w = up ? fm_where(neg, up, i64) : NULL, *wu = w ? fm_unsqueeze(w, axis) : NULL;
    fm_tensor *ar = fm_tensor_arange(0, (double)depth, 1, wu ? wu->dtype : FM_I64), *ad = ar ? fm_tensor_to(ar, dev_of(idx)) : NULL;
    fm_tensor *pos = ad ? fm_reshape(ad, idx->ndim + 1, ash) : NULL, *mask = pos && wu ? fm_eq(wu, pos) : NULL;
    fm_tensor *off = fm_narrow(vals, 0, 0, 1), *on = fm_narrow(vals, 0, 1, 1);
    fm_tensor *off0 = off ? fm_reshape(off, 0, NULL) : NULL, *on0 = on ? fm_reshape(on, 0, NULL) : NULL;
    fm_tensor *y = mask && off0 && on0 ? fm_where(mask, on0, off0) : NULL;
    REL(i64, z, neg, up, w, wu, ar, ad, pos, mask, off, on, off0, on0);
    return onnx_set_out(c, 0, y);
}

/* ---- EyeLike ---- */

static fm_status op_eye_like(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    if (x->ndim != 2) return onnx_node_error(c, FM_ERR_INVALID, "input must be 2-D; got rank %d", x->ndim);
    fm_dtype dt = x->dtype;
    const int64_t odt = onnx_attr_int(c, "dtype", 0), k = onnx_attr_int(c, "k", 0);
    if (odt && !onnx_dtype_to_fm((int32_t)odt, &dt))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "dtype %s is not one fathom has", onnx_dtype_name((int32_t)odt));
    const int64_t R = x->shape[0], C = x->shape[1];
    fm_tensor *y = fm_tensor_zeros(2, x->shape, FM_F64, FM_CPU);
    double *v = y ? fm_tensor_data(y) : NULL;
    for (int64_t i = 0; v && i < R; i++)
        if (i + k >= 0 && i + k < C) v[i * C + i + k] = 1;
    return onnx_set_out(c, 0, onnx_host_back(y, dt, dev_of(x)));
}

/* ---- Shrink ---- */

/* x < -lambd: x + bias; x > lambd: x - bias; else 0. */
static fm_status op_shrink(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    const double l = onnx_attr_float(c, "lambd", 0.5f), b = onnx_attr_float(c, "bias", 0.0f);
    fm_tensor *nl = scalar_like(x, -l), *pl = scalar_like(x, l), *z = scalar_like(x, 0);
    fm_tensor *lo = nl ? fm_lt(x, nl) : NULL, *hi = pl ? fm_gt(x, pl) : NULL;
    fm_tensor *xa = fm_add_scalar(x, b), *xs = fm_add_scalar(x, -b);
    fm_tensor *h = hi && xs && z ? fm_where(hi, xs, z) : NULL, *y = lo && xa && h ? fm_where(lo, xa, h) : NULL;
    REL(nl, pl, z, lo, hi, xa, xs, h);
    return onnx_set_out(c, 0, y);
}

/* ---- MeanVarianceNormalization ---- */

/* (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over axes (default 0, 2, 3), ONNX's own
 * function body, so its epsilon and its variance formula. */
static fm_status op_mvn(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int n = 0, axes[FM_MAX_DIMS];
    const int64_t *a = onnx_attr_ints(c, "axes", &n);
    if (!a) n = 3, axes[0] = 0, axes[1] = 2, axes[2] = 3;
    if (n > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_INVALID, "too many axes");
    for (int i = 0; a && i < n; i++) axes[i] = (int)a[i];
    if (!fm_dtype_is_float(x->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "input must be floating-point");
    fm_tensor *m = fm_mean(x, n, axes, true), *x2 = fm_mul(x, x), *m2 = x2 ? fm_mean(x2, n, axes, true) : NULL;
    fm_tensor *mm = m ? fm_mul(m, m) : NULL, *var = m2 && mm ? fm_sub(m2, mm) : NULL, *sd = var ? fm_sqrt(var) : NULL;
    fm_tensor *den = sd ? fm_add_scalar(sd, 1e-9) : NULL, *xc = m ? fm_sub(x, m) : NULL, *y = den && xc ? fm_div(xc, den) : NULL;
    REL(m, x2, m2, mm, var, sd, den, xc);
    return onnx_set_out(c, 0, y);
}

/* ---- LRN ---- */

/* x / (bias + alpha / size * (sum of x^2 over channels c - floor((size-1)/2) ..
 * c + ceil((size-1)/2)))^beta: the squares zero-padded along the channels and `size`
 * shifted slices summed. */
static fm_status op_lrn(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    const int64_t size = onnx_attr_int(c, "size", 0);
    const double alpha = onnx_attr_float(c, "alpha", 1e-4f), beta = onnx_attr_float(c, "beta", 0.75f), bias = onnx_attr_float(c, "bias", 1.0f);
    if (size < 1 || size > 4096) return onnx_node_error(c, FM_ERR_INVALID, "size must be in [1, 4096]; got %" PRId64, size);
    if (x->ndim < 3 || !fm_dtype_is_float(x->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "input must be floating-point [N, C, ...]");
    int64_t pads[2 * FM_MAX_DIMS] = {0};
    pads[1] = (size - 1) / 2, pads[x->ndim + 1] = size / 2; /* ceil((size - 1) / 2) */
    fm_tensor *sq = fm_mul(x, x), *pd = sq ? fm_pad(sq, pads, FM_PAD_CONSTANT, 0.0) : NULL, *acc = NULL;
    for (int64_t i = 0; pd && i < size; i++) {
        fm_tensor *s = fm_narrow(pd, 1, i, x->shape[1]), *t = s && acc ? fm_add(acc, s) : s ? fm_contiguous(s) : NULL;
        REL(s, acc);
        acc = t;
        if (!acc) break;
    }
    fm_tensor *sc = acc ? fm_mul_scalar(acc, alpha / (double)size) : NULL, *bs = sc ? fm_add_scalar(sc, bias) : NULL;
    fm_tensor *e = scalar_like(x, beta), *p = bs && e ? fm_pow(bs, e) : NULL, *y = p ? fm_div(x, p) : NULL;
    REL(sq, pd, acc, sc, bs, e, p);
    return onnx_set_out(c, 0, y);
}

const onnx_op onnx_ops_misc[] = {
    {"DepthToSpace", 1, 1, 1, 1, "blocksize,mode", op_space_depth},
    {"SpaceToDepth", 1, 1, 1, 1, "blocksize", op_space_depth},
    {"GatherND", 11, 2, 2, 1, "batch_dims", op_gather_nd},
    {"OneHot", 9, 3, 3, 1, "axis", op_one_hot},
    {"EyeLike", 9, 1, 1, 1, "dtype,k", op_eye_like},
    {"Shrink", 9, 1, 1, 1, "bias,lambd", op_shrink},
    {"MeanVarianceNormalization", 9, 1, 1, 1, "axes", op_mvn},
    {"LRN", 1, 1, 1, 1, "alpha,beta,bias,size", op_lrn},
    {"Einsum", 12, 1, ONNX_EINSUM_MAX_IN, 1, "equation", onnx_op_einsum},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
