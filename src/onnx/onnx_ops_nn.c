/* ONNX neural-network ops: MatMul, Gemm, Conv, pooling, normalizations, softmax,
 * Dropout (inference). 1-D convolutions and pools run as 2-D ones over a height of
 * 1; asymmetric padding (SAME_* auto_pad, uneven pads, ceil_mode) becomes explicit
 * padding of the input in front of fathom's symmetric-padding kernels. */
#include "onnx/onnx_internal.h"

#include <math.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

static fm_status op_matmul(onnx_op_ctx *c) { return onnx_set_out(c, 0, fm_matmul(c->in[0], c->in[1])); }

static fm_status op_gemm(onnx_op_ctx *c) {
    fm_tensor *a = c->in[0], *b = c->in[1];
    if (a->ndim != 2 || b->ndim != 2) return onnx_node_error(c, FM_ERR_INVALID, "A and B must be 2-D");
    fm_tensor *at = onnx_attr_int(c, "transA", 0) ? fm_transpose(a, 0, 1) : fm_tensor_retain(a);
    fm_tensor *bt = onnx_attr_int(c, "transB", 0) ? fm_transpose(b, 0, 1) : fm_tensor_retain(b);
    fm_tensor *y = at && bt ? fm_matmul(at, bt) : NULL;
    REL(at, bt);
    double alpha = onnx_attr_float(c, "alpha", 1.0f), beta = onnx_attr_float(c, "beta", 1.0f);
    if (y && alpha != 1.0) { fm_tensor *t = fm_mul_scalar(y, alpha); fm_tensor_release(y); y = t; }
    if (y && c->n_in > 2 && c->in[2] && beta != 0.0) {
        fm_tensor *cb = beta == 1.0 ? fm_tensor_retain(c->in[2]) : fm_mul_scalar(c->in[2], beta);
        fm_tensor *t = cb ? fm_add(y, cb) : NULL;
        REL(cb, y);
        y = t;
    }
    return onnx_set_out(c, 0, y);
}

/* Pads dim d of x by (before, after) elements of value v (negative: crops). */
static fm_tensor *pad_dim(fm_tensor *x, int d, int64_t before, int64_t after, double v) {
    fm_tensor *t = fm_tensor_retain(x);
    if (before < 0 || after < 0) {
        int64_t s = before < 0 ? -before : 0, e = x->shape[d] - (after < 0 ? -after : 0);
        fm_tensor *u = fm_slice(t, d, s, e > s ? e : s, 1);
        fm_tensor_release(t);
        t = u;
        before = before > 0 ? before : 0;
        after = after > 0 ? after : 0;
    }
    if (!t || (before == 0 && after == 0)) return t;
    int64_t sh[FM_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[d] += before + after;
    fm_tensor *y = fm_tensor_full(t->ndim, sh, v, t->dtype, t->storage->device);
    fm_tensor *dst = y ? fm_narrow(y, d, before, t->shape[d]) : NULL;
    if (!dst || fm_copy_(dst, t)) {
        REL(dst, y, t);
        return NULL;
    }
    REL(dst, t);
    return y;
}

typedef onnx_window window;
#define MAX_SP ONNX_MAX_SPATIAL

fm_status onnx_window_of(const onnx_op_ctx *c, const fm_tensor *x, const int64_t *kshape, onnx_window *w) {
    w->nsp = x->ndim - 2;
    if (w->nsp < 1 || w->nsp > MAX_SP)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "%d spatial dimensions; fathom supports 1 to 3", w->nsp);
    int n;
    const int64_t *ks = onnx_attr_ints(c, "kernel_shape", &n), *st, *dl, *pads;
    for (int i = 0; i < w->nsp; i++) w->k[i] = ks && n == w->nsp ? ks[i] : kshape ? kshape[i] : 0;
    st = onnx_attr_ints(c, "strides", &n);
    for (int i = 0; i < w->nsp; i++) w->s[i] = st && n == w->nsp ? st[i] : 1;
    dl = onnx_attr_ints(c, "dilations", &n);
    for (int i = 0; i < w->nsp; i++) w->d[i] = dl && n == w->nsp ? dl[i] : 1;
    pads = onnx_attr_ints(c, "pads", &n);
    if (pads && n != 2 * w->nsp) return onnx_node_error(c, FM_ERR_INVALID, "pads must have %d values", 2 * w->nsp);
    for (int i = 0; i < w->nsp; i++) {
        w->pb[i] = pads ? pads[i] : 0;
        w->pe[i] = pads ? pads[i + w->nsp] : 0;
        if (w->k[i] <= 0 || w->s[i] <= 0 || w->d[i] <= 0 || w->pb[i] < 0 || w->pe[i] < 0 || w->k[i] > 1 << 20 ||
            w->s[i] > 1 << 20 || w->d[i] > 1 << 20 || w->pb[i] > 1 << 20 || w->pe[i] > 1 << 20)
            return onnx_node_error(c, FM_ERR_INVALID, "kernel, strides, dilations must be positive and pads non-negative");
    }
    char buf[32];
    const char *ap = onnx_attr_string(c, "auto_pad", "NOTSET", buf, sizeof buf);
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
        for (int i = 0; i < w->nsp; i++) {
            int64_t in = x->shape[2 + i], out = (in + w->s[i] - 1) / w->s[i];
            int64_t total = (out - 1) * w->s[i] + (w->k[i] - 1) * w->d[i] + 1 - in;
            if (total < 0) total = 0;
            w->pb[i] = !strcmp(ap, "SAME_UPPER") ? total / 2 : total - total / 2;
            w->pe[i] = total - w->pb[i];
        }
    } else if (!strcmp(ap, "VALID")) {
        for (int i = 0; i < w->nsp; i++) w->pb[i] = w->pe[i] = 0;
    } else if (strcmp(ap, "NOTSET"))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "auto_pad='%s' is not supported", ap);
    return FM_OK;
}

/* x with every spatial dim padded by (pb, pe + extra[i]) elements of value v. */
static fm_tensor *pad_spatial(fm_tensor *x, const window *w, const int64_t *extra, double v) {
    fm_tensor *t = fm_tensor_retain(x);
    for (int i = 0; t && i < w->nsp; i++) {
        int64_t e = w->pe[i] + (extra ? extra[i] : 0);
        if (!w->pb[i] && !e) continue;
        fm_tensor *u = pad_dim(t, 2 + i, w->pb[i], e, v);
        fm_tensor_release(t);
        t = u;
    }
    return t;
}

/* 1-D as 2-D (height 1): the window gets a leading unit dim. */
static void window_to_2d(window *w) {
    w->k[1] = w->k[0], w->s[1] = w->s[0], w->d[1] = w->d[0], w->pb[1] = w->pb[0], w->pe[1] = w->pe[0];
    w->k[0] = w->s[0] = w->d[0] = 1;
    w->pb[0] = w->pe[0] = 0;
    w->nsp = 2;
}

/* Conv over 3 spatial dims as a sum of 2-D convs, one per kernel depth offset:
 * the input frames that offset reads (strided along depth) are folded into the
 * batch. x is padded already; p holds the (H, W) stride and dilation. */
static fm_tensor *conv3d(fm_tensor *x, fm_tensor *wt, const window *w, fm_conv2d_params *p) {
    int64_t N = x->shape[0], C = x->shape[1], Dp = x->shape[2], M = wt->shape[0];
    int64_t span = (w->k[0] - 1) * w->d[0] + 1, Do = Dp >= span ? (Dp - span) / w->s[0] + 1 : 0;
    fm_tensor *acc = NULL;
    static const int to_frames[5] = {0, 2, 1, 3, 4};
    for (int64_t kz = 0; kz < w->k[0]; kz++) {
        int64_t st = kz * w->d[0], sh4[4] = {N * Do, C, x->shape[3], x->shape[4]};
        fm_tensor *xs = fm_slice(x, 2, st, st + (Do - 1) * w->s[0] + 1, w->s[0]), *xt = xs ? fm_permute(xs, to_frames) : NULL;
        fm_tensor *xr = xt ? fm_reshape(xt, 4, sh4) : NULL, *wk = xr ? fm_select(wt, 2, kz) : NULL;
        fm_tensor *wc = wk ? fm_contiguous(wk) : NULL, *y = wc ? fm_conv2d(xr, wc, NULL, p) : NULL;
        fm_tensor *sum = y && acc ? fm_add(acc, y) : y ? fm_tensor_retain(y) : NULL;
        REL(xs, xt, xr, wk, wc, y, acc);
        if (!(acc = sum)) return NULL;
    }
    int64_t sh5[5] = {N, Do, M, acc->shape[2], acc->shape[3]};
    fm_tensor *r = fm_reshape(acc, 5, sh5), *y = r ? fm_permute(r, to_frames) : NULL, *yc = y ? fm_contiguous(y) : NULL;
    REL(acc, r, y);
    return yc;
}

static fm_status op_conv(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *wt = c->in[1], *b = c->n_in > 2 ? c->in[2] : NULL;
    if (wt->ndim != x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "weight rank %d does not match input rank %d", wt->ndim, x->ndim);
    window w;
    if (onnx_window_of(c, x, wt->shape + 2, &w)) return fm_last_status();
    fm_conv2d_params p = fm_conv2d_default_params();
    p.groups = (int)onnx_attr_int(c, "group", 1);
    bool sym = true;
    for (int i = 0; i < w.nsp; i++) sym &= w.pb[i] == w.pe[i] && w.pb[i] <= 1 << 16;
    fm_tensor *xp = sym && w.nsp < 3 ? fm_tensor_retain(x) : pad_spatial(x, &w, NULL, 0.0), *y = NULL;
    int f = w.nsp == 3; /* the (H, W) dims of the window */
    for (int i = 0; i < 2 && i + f < w.nsp; i++)
        p.stride[i] = (int)w.s[i + f], p.dilation[i] = (int)w.d[i + f], p.padding[i] = sym && w.nsp < 3 ? (int)w.pb[i + f] : 0;
    if (w.nsp == 1) {
        p.stride[1] = p.stride[0], p.dilation[1] = p.dilation[0], p.padding[1] = p.padding[0];
        p.stride[0] = p.dilation[0] = 1, p.padding[0] = 0;
        fm_tensor *x4 = xp ? fm_unsqueeze(xp, 2) : NULL, *w4 = x4 ? fm_unsqueeze(wt, 2) : NULL;
        fm_tensor *y4 = w4 ? fm_conv2d(x4, w4, b, &p) : NULL;
        y = y4 ? fm_squeeze(y4, 2) : NULL;
        REL(x4, w4, y4);
    } else if (w.nsp == 2) {
        y = xp ? fm_conv2d(xp, wt, b, &p) : NULL;
    } else if (xp) {
        fm_tensor *y3 = conv3d(xp, wt, &w, &p);
        int64_t bs[4] = {wt->shape[0], 1, 1, 1};
        fm_tensor *br = y3 && b ? fm_reshape(b, 4, bs) : NULL;
        y = !y3 ? NULL : b ? (br ? fm_add(y3, br) : NULL) : fm_tensor_retain(y3);
        REL(y3, br);
    }
    fm_tensor_release(xp);
    return onnx_set_out(c, 0, y);
}

/* ConvTranspose over 1 or 2 spatial dims as fm_conv_transpose2d: its padding the smaller of
 * each dim's two pads, its output_padding what the end still needs (o), and a crop after it of
 * what the uneven pads remove (ONNX: out = s (in - 1) + output_padding + (k - 1) d + 1 - pads;
 * output_shape or SAME_* give the pads, the odd one at the end for SAME_UPPER). */
/* Per spatial dim of a ConvTranspose (1 to 3): stride, dilation, output padding, the full
 * size (output padding included) and the pads to remove at each end (negative: zeros added). */
typedef struct { int nsp; int64_t s[3], d[3], o[3], full[3], pb[3], pe[3]; } convt_dims;

static fm_status convt_dims_of(const onnx_op_ctx *c, const fm_tensor *x, const fm_tensor *wt, convt_dims *g) {
    const int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 3 || wt->ndim != x->ndim)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "ConvTranspose over %d spatial dims (input rank %d, weight rank %d): 1 to 3 are supported",
                               nsp, x->ndim, wt->ndim);
    int n_s, n_d, n_p, n_op, n_os;
    const int64_t *st = onnx_attr_ints(c, "strides", &n_s), *di = onnx_attr_ints(c, "dilations", &n_d), *pa = onnx_attr_ints(c, "pads", &n_p);
    const int64_t *opd = onnx_attr_ints(c, "output_padding", &n_op), *os = onnx_attr_ints(c, "output_shape", &n_os);
    char buf[32];
    const char *ap = onnx_attr_string(c, "auto_pad", "NOTSET", buf, sizeof buf);
    if ((st && n_s != nsp) || (di && n_d != nsp) || (pa && n_p != 2 * nsp) || (opd && n_op != nsp) || (os && n_os != nsp && n_os != x->ndim))
        return onnx_node_error(c, FM_ERR_INVALID, "strides, dilations, output_padding and output_shape need %d values, pads %d", nsp, 2 * nsp);
    g->nsp = nsp;
    for (int i = 0; i < nsp; i++) {
        const int64_t s = st ? st[i] : 1, d = di ? di[i] : 1, o = opd ? opd[i] : 0, k = wt->shape[2 + i], in = x->shape[2 + i];
        if (s < 1 || d < 1 || o < 0 || o >= s || s > 1 << 16 || d > 1 << 16)
            return onnx_node_error(c, FM_ERR_UNSUPPORTED, "strides %lld, dilations %lld, output_padding %lld (output_padding below the stride)",
                                   (long long)s, (long long)d, (long long)o);
        const int64_t full = s * (in - 1) + o + (k - 1) * d + 1;
        int64_t pb = pa ? pa[i] : 0, pe = pa ? pa[i + nsp] : 0;
        const bool same = !strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER");
        if (os || same) { /* the pads from the size asked for; below the full size they are negative (zeros added) */
            const int64_t want = os ? os[n_os == nsp ? i : i + 2] : in * s, total = full - want;
            const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2); /* floor, as ONNX's reference */
            pb = !strcmp(ap, "SAME_UPPER") ? half : total - half, pe = total - pb;
        } else if (!strcmp(ap, "VALID")) pb = pe = 0;
        if (full - pb - pe < 1 || pb > full || pe > full || pb < -full || pe < -full)
            return onnx_node_error(c, FM_ERR_INVALID, "pads %lld, %lld leave no output of the full %lld", (long long)pb, (long long)pe, (long long)full);
        g->s[i] = s, g->d[i] = d, g->o[i] = o, g->full[i] = full, g->pb[i] = pb, g->pe[i] = pe;
    }
    return FM_OK;
}

fm_status onnx_convt_geom(const onnx_op_ctx *c, const fm_tensor *x, const fm_tensor *wt, onnx_convt *g) {
    convt_dims cd;
    if (convt_dims_of(c, x, wt, &cd)) return fm_last_status();
    if (cd.nsp > 2)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "ConvTranspose over 3 spatial dims has no graph form (fathom run runs it)");
    memset(g, 0, sizeof *g);
    g->p = fm_conv2d_default_params();
    g->p.groups = (int)onnx_attr_int(c, "group", 1);
    g->nsp = cd.nsp;
    for (int i = 0; i < cd.nsp; i++) {
        const int j = i + 2 - cd.nsp; /* 1-D runs as [N, C, 1, W]: its dim is the second */
        const int64_t s = cd.s[i], o = cd.o[i], pb = cd.pb[i], pe = cd.pe[i];
        /* fm's own padding p and output padding oo; then what to crop (negative: add) at each end */
        const int64_t mn = pb < pe ? pb : pe, p = mn > 0 ? mn : 0, need = o - pe + p, oo = need < 0 ? 0 : need < s ? need : s - 1;
        g->p.stride[j] = (int)s, g->p.dilation[j] = (int)cd.d[i], g->p.padding[j] = (int)p, g->op[j] = (int)oo;
        g->crop_b[j] = pb - p, g->crop_e[j] = oo - need;
        g->extends |= g->crop_b[j] < 0 || g->crop_e[j] < 0;
    }
    return FM_OK;
}

/* ConvTranspose over 3 spatial dims: per kernel depth offset kz, one 2-D transposed conv of
 * every input frame (folded into the batch; full size, no padding), whose output frames land
 * at depths zi s + kz d: spread to stride s with zero frames between, shifted by kz d, summed.
 * Then the pads are cut (or zeros added, output_padding at the end) and the bias added. */
static fm_tensor *convt3d_full(fm_tensor *x, fm_tensor *wt, const convt_dims *g, int groups) {
    const int64_t N = x->shape[0], C = x->shape[1], D = x->shape[2], M = wt->shape[1] * groups, s = g->s[0];
    const int64_t FD = g->full[0] - g->o[0], span = (D - 1) * s + 1;
    fm_conv2d_params p = fm_conv2d_default_params();
    p.groups = groups;
    for (int j = 0; j < 2; j++) p.stride[j] = (int)g->s[1 + j], p.dilation[j] = (int)g->d[1 + j];
    static const int to_frames[5] = {0, 2, 1, 3, 4};
    const int64_t fr[4] = {N * D, C, x->shape[3], x->shape[4]};
    fm_tensor *xt = fm_permute(x, to_frames), *xf = xt ? fm_reshape(xt, 4, fr) : NULL, *acc = NULL;
    fm_tensor_release(xt);
    for (int64_t kz = 0; xf && kz < wt->shape[2]; kz++) {
        fm_tensor *wk = fm_select(wt, 2, kz), *wc = wk ? fm_contiguous(wk) : NULL, *z = wc ? fm_conv_transpose2d(xf, wc, NULL, &p, NULL) : NULL;
        fm_tensor *z6 = NULL, *sp = NULL;
        if (z) { /* [N, D, 1, M, h, w], then s - 1 zero frames after each */
            const int64_t sh6[6] = {N, D, 1, M, z->shape[2], z->shape[3]}, zs[6] = {N, D, s - 1, M, z->shape[2], z->shape[3]};
            fm_tensor *a = fm_reshape(z, 6, sh6), *zr = s > 1 && a ? fm_tensor_zeros(6, zs, z->dtype, z->storage->device) : NULL;
            fm_tensor *parts[2] = {a, zr}, *cat = a && (s == 1 || zr) ? (s > 1 ? fm_cat(2, parts, 2) : fm_tensor_retain(a)) : NULL;
            const int64_t sh5[5] = {N, D * s, M, z->shape[2], z->shape[3]};
            z6 = cat ? fm_reshape(cat, 5, sh5) : NULL;
            REL(a, zr, cat);
        }
        if (z6) {
            const int64_t pads[10] = {0, kz * g->d[0], 0, 0, 0, 0, FD - span - kz * g->d[0], 0, 0, 0};
            fm_tensor *nr = fm_narrow(z6, 1, 0, span);
            sp = nr ? fm_pad(nr, pads, FM_PAD_CONSTANT, 0) : NULL;
            fm_tensor_release(nr);
        }
        fm_tensor *sum = sp && acc ? fm_add(acc, sp) : sp ? fm_tensor_retain(sp) : NULL;
        REL(wk, wc, z, z6, sp, acc);
        if (!(acc = sum)) break;
    }
    fm_tensor_release(xf);
    fm_tensor *y = acc ? fm_permute(acc, to_frames) : NULL;
    fm_tensor_release(acc);
    return y;
}

static fm_status op_conv_transpose3d(onnx_op_ctx *c, const convt_dims *g) {
    fm_tensor *x = c->in[0], *wt = c->in[1], *b = c->n_in > 2 ? c->in[2] : NULL;
    const int64_t groups = onnx_attr_int(c, "group", 1);
    if (groups < 1 || x->shape[1] % groups || wt->shape[0] != x->shape[1])
        return onnx_node_error(c, FM_ERR_INVALID, "group %lld, input channels %lld and weight [%lld, ...] disagree", (long long)groups,
                               (long long)x->shape[1], (long long)wt->shape[0]);
    fm_tensor *yf = convt3d_full(x, wt, g, (int)groups);
    int64_t pads[10] = {0};
    for (int i = 0; i < 3; i++) pads[2 + i] = -g->pb[i], pads[7 + i] = g->o[i] - g->pe[i];
    fm_tensor *y = yf ? fm_pad(yf, pads, FM_PAD_CONSTANT, 0) : NULL;
    fm_tensor *br = y && b ? fm_reshape(b, 5, (int64_t[]){1, b->shape[0], 1, 1, 1}) : NULL, *yb = br ? fm_add(y, br) : fm_tensor_retain(y);
    REL(yf, y, br);
    return onnx_set_out(c, 0, yb);
}

/* ConvTranspose: fm_conv_transpose2d (1-D as [N, C, 1, W]), then the uneven pads' crop. */
static fm_status op_conv_transpose(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *wt = c->in[1], *b = c->n_in > 2 ? c->in[2] : NULL;
    if (x->ndim == 5) {
        convt_dims cd;
        return convt_dims_of(c, x, wt, &cd) ? fm_last_status() : op_conv_transpose3d(c, &cd);
    }
    onnx_convt g;
    if (onnx_convt_geom(c, x, wt, &g)) return fm_last_status();
    const bool one = g.nsp == 1;
    fm_tensor *x4 = one ? fm_unsqueeze(x, 2) : fm_tensor_retain(x), *w4 = one ? fm_unsqueeze(wt, 2) : fm_tensor_retain(wt);
    /* positions the pads add hold the bias alone: then the bias goes on after the pad */
    fm_tensor *y4 = x4 && w4 ? fm_conv_transpose2d(x4, w4, g.extends ? NULL : b, &g.p, g.op) : NULL;
    const int64_t crop[8] = {0, 0, -g.crop_b[0], -g.crop_b[1], 0, 0, -g.crop_e[0], -g.crop_e[1]};
    fm_tensor *yc = y4 ? fm_pad(y4, crop, FM_PAD_CONSTANT, 0) : NULL;
    fm_tensor *br = yc && g.extends && b ? fm_reshape(b, 4, (int64_t[]){1, b->shape[0], 1, 1}) : NULL;
    fm_tensor *yb = br ? fm_add(yc, br) : fm_tensor_retain(yc), *y = yb && one ? fm_squeeze(yb, 2) : fm_tensor_retain(yb);
    REL(x4, w4, y4, yc, br, yb);
    return onnx_set_out(c, 0, y);
}

/* The fill value that never wins a max: -inf, or the integer type's minimum. */
static double max_identity(fm_dtype dt) {
    switch (dt) {
    case FM_U8: case FM_BOOL: return 0;
    case FM_I8: return -128;
    case FM_I32: return -2147483648.0;
    case FM_I64: return -9223372036854775808.0;
    default: return -INFINITY;
    }
}

/* Any pooling as a max or sum over the kernel offsets, each a strided slice of
 * the padded input: for what fathom's kernels do not cover (3-D, dilation,
 * ceil_mode, uneven or large pads, integer types). An average divides by the
 * number of counted elements under each window (a pooled mask). */
/* Output size per spatial dim; extra: the end padding ceil_mode adds. */
static bool pool_out_size(const fm_tensor *x, const window *w, bool ceil_mode, int64_t *out, int64_t *extra) {
    for (int i = 0; i < w->nsp; i++) {
        int64_t in = x->shape[2 + i], span = (w->k[i] - 1) * w->d[i] + 1, full = in + w->pb[i] + w->pe[i] - span;
        if (full < 0) { fm_set_error(FM_ERR_INVALID, "pooling window larger than the padded input"); return false; }
        out[i] = (ceil_mode ? (full + w->s[i] - 1) / w->s[i] : full / w->s[i]) + 1;
        if (ceil_mode && (out[i] - 1) * w->s[i] >= in + w->pb[i]) out[i]--; /* windows start inside */
        extra[i] = (out[i] - 1) * w->s[i] + span - (in + w->pb[i] + w->pe[i]);
    }
    return true;
}

static fm_tensor *pool_generic(fm_tensor *x, const window *w, bool is_max, bool include_pad, bool ceil_mode) {
    int64_t out[MAX_SP], extra[MAX_SP];
    if (!pool_out_size(x, w, ceil_mode, out, extra)) return NULL;
    fm_tensor *xp = pad_spatial(x, w, extra, is_max ? max_identity(x->dtype) : 0.0), *mask = NULL;
    if (!is_max) { /* 1 where an element counts toward the divisor */
        int64_t ones_sh[FM_MAX_DIMS] = {1, 1};
        for (int i = 0; i < w->nsp; i++) ones_sh[2 + i] = x->shape[2 + i];
        fm_tensor *ones = fm_tensor_ones(x->ndim, ones_sh, x->dtype, x->storage->device), *m = NULL;
        window wz = *w;
        if (include_pad && ones) {
            m = pad_spatial(ones, w, NULL, 1.0);
            for (int i = 0; i < w->nsp; i++) wz.pb[i] = 0, wz.pe[i] = 0;
        } else m = ones ? fm_tensor_retain(ones) : NULL;
        if (!include_pad) wz = *w;
        mask = m ? pad_spatial(m, &wz, extra, 0.0) : NULL;
        REL(ones, m);
    }
    fm_tensor *acc = NULL, *cnt = NULL;
    int64_t total = 1, off[MAX_SP];
    for (int i = 0; i < w->nsp; i++) total *= w->k[i];
    for (int64_t o = 0; xp && (is_max || mask) && o < total; o++) {
        int64_t r = o;
        for (int i = w->nsp - 1; i >= 0; i--) off[i] = r % w->k[i], r /= w->k[i];
        fm_tensor *v = fm_tensor_retain(xp), *mv = mask ? fm_tensor_retain(mask) : NULL;
        for (int i = 0; i < w->nsp && v; i++) {
            int64_t st = off[i] * w->d[i], en = st + (out[i] - 1) * w->s[i] + 1;
            fm_tensor *t = fm_slice(v, 2 + i, st, en, w->s[i]), *tm = mv ? fm_slice(mv, 2 + i, st, en, w->s[i]) : NULL;
            REL(v, mv);
            v = t, mv = tm;
        }
        fm_tensor *na = !v ? NULL : !acc ? fm_contiguous(v) : is_max ? fm_maximum(acc, v) : fm_add(acc, v);
        fm_tensor *nc = !mv ? NULL : !cnt ? fm_contiguous(mv) : fm_add(cnt, mv);
        REL(v, mv, acc, cnt);
        acc = na, cnt = nc;
        if (!acc || (mask && !cnt)) break;
    }
    fm_tensor *y = !acc ? NULL : is_max ? fm_tensor_retain(acc) : cnt ? fm_div(acc, cnt) : NULL;
    REL(xp, mask, acc, cnt);
    return y;
}

/* The window maximum of one output position (kernel offsets in row-major order,
 * the first maximum on ties; padding never wins) and its position in the plane. */
static double window_max(const double *src, const window *w, const int64_t *in, const int64_t *oi, int64_t *at) {
    int64_t nk = 1, ki[MAX_SP];
    for (int i = 0; i < w->nsp; i++) nk *= w->k[i];
    double best = -INFINITY;
    *at = -1;
    for (int64_t o = 0; o < nk; o++) {
        int64_t r = o, flat = 0;
        for (int i = w->nsp - 1; i >= 0; i--) ki[i] = r % w->k[i], r /= w->k[i];
        bool inside = true;
        for (int i = 0; i < w->nsp && inside; i++) {
            int64_t p = oi[i] * w->s[i] - w->pb[i] + ki[i] * w->d[i];
            inside = p >= 0 && p < in[i];
            flat = flat * in[i] + p;
        }
        if (inside && (*at < 0 || src[flat] > best)) best = src[flat], *at = flat;
    }
    return best;
}

/* MaxPool with its Indices output, on the host: the flat index into X of each
 * maximum, row-major (storage_order 0) or with the spatial dims column-major (1). */
static fm_status max_pool_indices(onnx_op_ctx *c, fm_tensor *x, const window *w, bool ceil_mode, bool col_major) {
    int64_t out[MAX_SP], extra[MAX_SP], in[MAX_SP], ysh[FM_MAX_DIMS] = {x->shape[0], x->shape[1]};
    if (!pool_out_size(x, w, ceil_mode, out, extra)) return onnx_node_error(c, FM_ERR_INVALID, "%s", fm_last_error());
    int64_t plane = 1, oplane = 1, cm[MAX_SP];
    for (int i = 0; i < w->nsp; i++) in[i] = x->shape[2 + i], ysh[2 + i] = out[i], oplane *= out[i];
    for (int i = 0; i < w->nsp; i++) cm[i] = plane, plane *= in[i]; /* column-major strides */
    fm_tensor *h = onnx_host(x, FM_F64), *y = h ? fm_tensor_empty(x->ndim, ysh, FM_F64, FM_CPU) : NULL;
    fm_tensor *ix = y ? fm_tensor_empty(x->ndim, ysh, FM_I64, FM_CPU) : NULL;
    for (int64_t nc = 0; ix && nc < x->shape[0] * x->shape[1]; nc++) {
        const double *src = (const double *)fm_tensor_data(h) + nc * plane;
        for (int64_t o = 0; o < oplane; o++) {
            int64_t oi[MAX_SP], r = o, at, pos = 0;
            for (int i = w->nsp - 1; i >= 0; i--) oi[i] = r % out[i], r /= out[i];
            double v = window_max(src, w, in, oi, &at);
            for (int i = w->nsp - 1, rest = (int)at; col_major && i >= 0 && at >= 0; i--) {
                pos += (rest % in[i]) * cm[i];
                rest /= (int)in[i];
            }
            ((double *)fm_tensor_data(y))[nc * oplane + o] = v;
            ((int64_t *)fm_tensor_data(ix))[nc * oplane + o] = nc * plane + (col_major ? pos : at);
        }
    }
    fm_device dev = x->storage->device;
    fm_tensor_release(h);
    if (!ix) { REL(y); return fm_last_status(); }
    if (onnx_set_out(c, 0, onnx_host_back(y, x->dtype, dev))) { REL(ix); return fm_last_status(); }
    return onnx_set_out(c, 1, onnx_host_back(ix, FM_I64, dev));
}

static fm_status pool(onnx_op_ctx *c, bool is_max) {
    fm_tensor *x = c->in[0];
    window w;
    if (onnx_window_of(c, x, NULL, &w)) return fm_last_status();
    bool include_pad = onnx_attr_int(c, "count_include_pad", 0) != 0, ceil_mode = onnx_attr_int(c, "ceil_mode", 0) != 0;
    bool col_major = onnx_attr_int(c, "storage_order", 0) != 0;
    if (is_max && c->n_out > 1 && c->out) return max_pool_indices(c, x, &w, ceil_mode, col_major);
    bool fast = w.nsp <= 2 && fm_dtype_is_float(x->dtype) && !ceil_mode;
    for (int i = 0; i < w.nsp; i++) fast &= w.d[i] == 1 && w.pb[i] == w.pe[i] && 2 * w.pb[i] <= w.k[i];
    if (!fast) return onnx_set_out(c, 0, pool_generic(x, &w, is_max, include_pad, ceil_mode));
    fm_tensor *x4 = w.nsp == 1 ? fm_unsqueeze(x, 2) : fm_tensor_retain(x);
    if (w.nsp == 1) window_to_2d(&w);
    fm_pool2d_params p = {.count_include_pad = include_pad, .layout = FM_NCHW};
    for (int i = 0; i < 2; i++) p.kernel[i] = (int)w.k[i], p.stride[i] = (int)w.s[i], p.padding[i] = (int)w.pb[i];
    fm_tensor *y = x4 ? (is_max ? fm_max_pool2d(x4, &p) : fm_avg_pool2d(x4, &p)) : NULL;
    fm_tensor *yo = y && x->ndim == 3 ? fm_squeeze(y, 2) : y ? fm_tensor_retain(y) : NULL;
    REL(x4, y);
    return onnx_set_out(c, 0, yo);
}
static fm_status op_max_pool(onnx_op_ctx *c) { return pool(c, true); }
static fm_status op_avg_pool(onnx_op_ctx *c) { return pool(c, false); }

static fm_status global_pool(onnx_op_ctx *c, bool is_max) {
    fm_tensor *x = c->in[0];
    if (x->ndim < 3) return onnx_node_error(c, FM_ERR_INVALID, "input must be [N, C, spatial...]");
    int axes[FM_MAX_DIMS], n = 0;
    for (int d = 2; d < x->ndim; d++) axes[n++] = d;
    return onnx_set_out(c, 0, is_max ? fm_amax(x, n, axes, true) : fm_mean(x, n, axes, true));
}
static fm_status op_global_avg_pool(onnx_op_ctx *c) { return global_pool(c, false); }
static fm_status op_global_max_pool(onnx_op_ctx *c) { return global_pool(c, true); }

static fm_status op_batch_norm(onnx_op_ctx *c) {
    if (onnx_attr_int(c, "training_mode", 0) || c->n_out > 1)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "training mode (running statistics outputs) is not supported");
    if (c->opset < 9 && !onnx_attr_int(c, "spatial", 1))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "spatial=0 is not supported");
    double eps = onnx_attr_float(c, "epsilon", 1e-5f);
    return onnx_set_out(c, 0, fm_batch_norm(c->in[0], c->in[1], c->in[2], c->in[3], c->in[4], false, 0.1, eps, FM_NCHW));
}

/* Softmax before opset 13 works on x flattened to 2-D at `axis`. float16 is
 * computed in float32 and rounded back, on every device (the CPU's kernels, which the
 * check device runs too, have no f16 softmax). */
static fm_status softmax(onnx_op_ctx *c, bool log) {
    fm_tensor *x = c->in[0];
    if (x->dtype == FM_F16) {
        fm_tensor *x32 = fm_to_dtype(x, FM_F32);
        if (!x32) return fm_last_status();
        c->in[0] = x32;
        fm_status st = softmax(c, log);
        c->in[0] = x;
        fm_tensor_release(x32);
        if (st) return st;
        fm_tensor *y = c->out[0], *y16 = fm_to_dtype(y, FM_F16);
        c->out[0] = NULL;
        fm_tensor_release(y);
        return onnx_set_out(c, 0, y16);
    }
    int axis = (int)onnx_attr_int(c, "axis", c->opset >= 13 ? -1 : 1), a;
    if (fm_norm_axis("softmax", axis, x->ndim ? x->ndim : 1, &a)) return fm_last_status();
    if (c->opset >= 13 || x->ndim == 0) return onnx_set_out(c, 0, log ? fm_log_softmax(x, a) : fm_softmax(x, a));
    int64_t rows = 1, cols = 1;
    for (int d = 0; d < x->ndim; d++) *(d < a ? &rows : &cols) *= x->shape[d];
    int64_t sh[2] = {rows, cols};
    fm_tensor *x2 = fm_reshape(x, 2, sh), *y2 = x2 ? (log ? fm_log_softmax(x2, 1) : fm_softmax(x2, 1)) : NULL;
    fm_tensor *y = y2 ? fm_reshape(y2, x->ndim, x->shape) : NULL;
    REL(x2, y2);
    return onnx_set_out(c, 0, y);
}
static fm_status op_softmax(onnx_op_ctx *c) { return softmax(c, false); }
static fm_status op_log_softmax(onnx_op_ctx *c) { return softmax(c, true); }

/* Scale/B broadcast to the normalized shape when given smaller. */
static fm_tensor *norm_param(fm_tensor *p, int n, const int64_t *shape) {
    if (!p) return NULL;
    fm_tensor *e = fm_expand(p, n, shape), *y = e ? fm_contiguous(e) : NULL;
    fm_tensor_release(e);
    return y;
}

static fm_status op_layer_norm(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int a;
    if (fm_norm_axis("LayerNormalization", (int)onnx_attr_int(c, "axis", -1), x->ndim, &a)) return fm_last_status();
    double eps = onnx_attr_float(c, "epsilon", 1e-5f);
    int nn = x->ndim - a;
    fm_tensor *w = norm_param(c->in[1], nn, x->shape + a), *b = c->n_in > 2 ? norm_param(c->in[2], nn, x->shape + a) : NULL;
    fm_tensor *y = w && (b || c->n_in < 3 || !c->in[2]) ? fm_layer_norm(x, nn, w, b, eps) : NULL;
    REL(w, b);
    if (onnx_set_out(c, 0, y)) return fm_last_status();
    if (c->n_out > 1) { /* Mean and InvStdDev, over the normalized axes, kept as size-1 dims */
        int axes[FM_MAX_DIMS];
        for (int i = 0; i < nn; i++) axes[i] = a + i;
        fm_tensor *m = fm_mean(x, nn, axes, true), *d = m ? fm_sub(x, m) : NULL, *d2 = d ? fm_mul(d, d) : NULL;
        fm_tensor *v = d2 ? fm_mean(d2, nn, axes, true) : NULL, *ve = v ? fm_add_scalar(v, eps) : NULL;
        fm_tensor *r = ve ? fm_rsqrt(ve) : NULL;
        REL(d, d2, v, ve);
        if (onnx_set_out(c, 1, m)) { fm_tensor_release(r); return fm_last_status(); }
        if (onnx_set_out(c, 2, r)) return fm_last_status();
    }
    return FM_OK;
}

/* InstanceNormalization: each (sample, channel) normalized over its spatial dims (a layer
 * norm over the last ndim - 2 dims), then scale and bias per channel. */
static fm_status op_instance_norm(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *sc = c->in[1], *b = c->in[2];
    if (x->ndim < 3) return onnx_node_error(c, FM_ERR_INVALID, "input of rank %d: InstanceNormalization needs [N, C, D1, ...]", x->ndim);
    if (fm_tensor_numel(sc) != x->shape[1] || fm_tensor_numel(b) != x->shape[1])
        return onnx_node_error(c, FM_ERR_INVALID, "scale and bias need %lld values (the channels), have %lld and %lld", (long long)x->shape[1],
                               (long long)fm_tensor_numel(sc), (long long)fm_tensor_numel(b));
    int64_t sh[FM_MAX_DIMS] = {x->shape[1]};
    for (int d = 1; d < x->ndim - 1; d++) sh[d] = 1;
    fm_tensor *n = fm_layer_norm(x, x->ndim - 2, NULL, NULL, onnx_attr_float(c, "epsilon", 1e-5f));
    fm_tensor *s = n ? fm_reshape(sc, x->ndim - 1, sh) : NULL, *bb = s ? fm_reshape(b, x->ndim - 1, sh) : NULL;
    fm_tensor *m = bb ? fm_mul(n, s) : NULL, *y = m ? fm_add(m, bb) : NULL;
    REL(n, s, bb, m);
    return onnx_set_out(c, 0, y);
}

static fm_status op_dropout(onnx_op_ctx *c) {
    if (onnx_attr_int(c, "training_mode", 0) || (c->n_in > 2 && c->in[2] && fm_tensor_item(c->in[2]) != 0))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "training-mode dropout is not supported (random)");
    if (onnx_set_out(c, 0, fm_tensor_retain(c->in[0]))) return fm_last_status();
    if (c->n_out > 1)
        return onnx_set_out(c, 1, fm_tensor_full(c->in[0]->ndim, c->in[0]->shape, 1, FM_BOOL, c->in[0]->storage->device));
    return FM_OK;
}

#define WIN_ATTRS "auto_pad,kernel_shape,pads,strides,dilations"
const onnx_op onnx_ops_nn[] = {
    {"MatMul", 1, 2, 2, 1, "", op_matmul},
    {"Gemm", 1, 2, 3, 1, "alpha,beta,transA,transB,broadcast", op_gemm},
    {"Conv", 1, 2, 3, 1, WIN_ATTRS ",group", op_conv},
    {"ConvTranspose", 1, 2, 3, 1, WIN_ATTRS ",group,output_padding,output_shape", op_conv_transpose},
    {"MaxPool", 1, 1, 1, 2, WIN_ATTRS ",ceil_mode,storage_order", op_max_pool},
    {"AveragePool", 1, 1, 1, 1, WIN_ATTRS ",ceil_mode,count_include_pad", op_avg_pool},
    {"GlobalAveragePool", 1, 1, 1, 1, "", op_global_avg_pool},
    {"GlobalMaxPool", 1, 1, 1, 1, "", op_global_max_pool},
    {"BatchNormalization", 1, 5, 5, 5, "epsilon,momentum,spatial,training_mode,is_test", op_batch_norm},
    {"Softmax", 1, 1, 1, 1, "axis", op_softmax},
    {"LogSoftmax", 1, 1, 1, 1, "axis", op_log_softmax},
    {"LayerNormalization", 17, 2, 3, 3, "axis,epsilon,stash_type", op_layer_norm},
    {"InstanceNormalization", 1, 3, 3, 1, "epsilon", op_instance_norm},
    {"Dropout", 7, 1, 3, 2, "ratio,seed,training_mode,is_test", op_dropout},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
