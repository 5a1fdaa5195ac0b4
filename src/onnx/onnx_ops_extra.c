/* ONNX ops of the later opsets and the less common families.
 *
 * Composed of fathom ops, so they run on the input's device: CumProd (a log-depth scan of
 * shifted products), LpPool (|x|^p summed over strided slices of the zero-padded input, then
 * the p-th root), LpNormalization, GroupNormalization (opset 18: scale and bias per group; 21:
 * per channel), CenterCropPad (one fm_pad whose negative amounts crop), Col2Im (a scatter-add
 * of every column element to its image position), AffineGrid (the base grid times theta),
 * ReverseSequence (a gather along the time axis) and MaxUnpool (a scatter into zeros).
 * Computed on the host, as onnx_ops_host.c does, where fathom has no kernel: the bitwise ops
 * and BitShift (integer bit operations), Det (LU with partial pivoting, in f64).
 * fathom's integer arithmetic runs through double: CumProd of integers is exact while the
 * products stay below 2^53, and one past the dtype's range saturates (ONNX leaves overflow
 * undefined; ONNX Runtime wraps). */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

/* The most elements an op here makes (an index list, a padded copy, an output). */
#define EXTRA_MAX_ELEMS (INT64_C(1) << 36)

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }

/* The product of n sizes, or -1 when one is negative or it passes EXTRA_MAX_ELEMS. */
static int64_t checked_numel(int n, const int64_t *sh) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) {
        if (sh[i] < 0 || (sh[i] && p > EXTRA_MAX_ELEMS / sh[i])) return -1;
        p *= sh[i];
    }
    return p;
}

static bool is_int_dtype(fm_dtype dt) { return dt == FM_I8 || dt == FM_U8 || dt == FM_I32 || dt == FM_I64; }

/* A host int64 buffer of shape sh as a tensor on dev (v is copied). */
static fm_tensor *ints_on(const int64_t *v, int nd, const int64_t *sh, fm_device dev) {
    fm_tensor *h = fm_tensor_from_data(v, nd, sh, FM_I64);
    return h ? onnx_host_back(h, FM_I64, dev) : NULL;
}

/* ---- CumProd: y[i] = x[0] * ... * x[i] along the axis (exclusive: up to x[i-1], 1 first;
 * reverse: from the end), by log2(n) rounds of y *= y shifted by s = 1, 2, 4, ... (the shift
 * an fm_pad with 1s before and as many cropped after), each a fathom op on x's device. The
 * products' order differs from a running product's: floats may differ in the last bits. ---- */
static fm_status op_cumprod(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t ax;
    int n = 0, axis;
    if (onnx_tensor_ints(c, 1, &ax, 1, &n)) return fm_last_status();
    if (n != 1) return onnx_node_error(c, FM_ERR_INVALID, "axis must hold one value; it has %d", n);
    if (ax < -x->ndim || ax >= x->ndim)
        return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is out of range for an input of rank %d", ax, x->ndim);
    axis = (int)(ax < 0 ? ax + x->ndim : ax);
    if (x->dtype == FM_BOOL) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "needs a numeric input; got bool");
    const bool excl = onnx_attr_int(c, "exclusive", 0) != 0, rev = onnx_attr_int(c, "reverse", 0) != 0;
    const int nd = x->ndim;
    const int64_t len = x->shape[axis];
    int64_t pads[2 * FM_MAX_DIMS] = {0};
    fm_tensor *y = fm_tensor_retain(x);
    if (excl && len > 0) {
        pads[axis] = rev ? -1 : 1, pads[nd + axis] = rev ? 1 : -1;
        fm_tensor_release(y);
        y = fm_pad(x, pads, FM_PAD_CONSTANT, 1.0);
    }
    for (int64_t s = 1; y && s < len; s *= 2) {
        pads[axis] = rev ? -s : s, pads[nd + axis] = rev ? s : -s;
        fm_tensor *sh = fm_pad(y, pads, FM_PAD_CONSTANT, 1.0), *ny = sh ? fm_mul(y, sh) : NULL;
        REL(y, sh);
        y = ny;
    }
    return onnx_set_out(c, 0, y);
}

/* ---- LpPool: (sum over the window of |x|^p)^(1/p), the padding zeros ---- */

/* Output size and the end padding (extra, negative: a crop) per spatial dim, as MaxPool and
 * AveragePool count them: ceil_mode rounds up, but a window must start inside the input or
 * its begin padding. */
static fm_status lp_pool_geometry(onnx_op_ctx *c, const fm_tensor *x, const onnx_window *w, bool ceil_mode, int64_t *out, int64_t *extra) {
    int64_t padded[FM_MAX_DIMS] = {x->shape[0], x->shape[1]}, kn[ONNX_MAX_SPATIAL];
    for (int i = 0; i < w->nsp; i++) {
        const int64_t in = x->shape[2 + i], span = (w->k[i] - 1) * w->d[i] + 1, full = in + w->pb[i] + w->pe[i] - span;
        if (full < 0)
            return onnx_node_error(c, FM_ERR_INVALID, "the window (%" PRId64 " wide with its dilation) is larger than the padded input (%" PRId64
                                   ") along spatial dim %d", span, in + w->pb[i] + w->pe[i], i);
        out[i] = (ceil_mode ? (full + w->s[i] - 1) / w->s[i] : full / w->s[i]) + 1;
        if (ceil_mode && (out[i] - 1) * w->s[i] >= in + w->pb[i]) out[i]--;
        extra[i] = (out[i] - 1) * w->s[i] + span - (in + w->pb[i] + w->pe[i]);
        padded[2 + i] = in + w->pb[i] + w->pe[i] + extra[i], kn[i] = w->k[i];
    }
    const int64_t taps = checked_numel(w->nsp, kn);
    if (taps < 0 || taps > 65536) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "a kernel of more than 65536 elements");
    if (checked_numel(x->ndim, padded) < 0) return onnx_node_error(c, FM_ERR_INVALID, "the padded input would have more than 2^36 elements");
    return FM_OK;
}

/* The sum over the kernel offsets of the strided slices of xp (padded already). */
static fm_tensor *window_sum(fm_tensor *xp, const onnx_window *w, const int64_t *out) {
    int64_t total = 1, off[ONNX_MAX_SPATIAL];
    for (int i = 0; i < w->nsp; i++) total *= w->k[i];
    fm_tensor *acc = NULL;
    for (int64_t o = 0; o < total; o++) {
        int64_t r = o;
        for (int i = w->nsp - 1; i >= 0; i--) off[i] = r % w->k[i], r /= w->k[i];
        fm_tensor *v = fm_tensor_retain(xp);
        for (int i = 0; i < w->nsp && v; i++) {
            const int64_t st = off[i] * w->d[i];
            fm_tensor *t = fm_slice(v, 2 + i, st, st + (out[i] - 1) * w->s[i] + 1, w->s[i]);
            fm_tensor_release(v);
            v = t;
        }
        fm_tensor *na = !v ? NULL : acc ? fm_add(acc, v) : fm_contiguous(v);
        REL(v, acc);
        if (!(acc = na)) return NULL;
    }
    return acc;
}

static fm_status op_lp_pool(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    if (!fm_dtype_is_float(x->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "needs a floating-point input; got %s", fm_dtype_name(x->dtype));
    onnx_window w;
    if (onnx_window_of(c, x, NULL, &w)) return fm_last_status();
    const int64_t p = onnx_attr_int(c, "p", 2);
    if (p < 1 || p > 1024) return onnx_node_error(c, FM_ERR_INVALID, "p must be in [1, 1024]; got %" PRId64, p);
    int64_t out[ONNX_MAX_SPATIAL], extra[ONNX_MAX_SPATIAL], pads[2 * FM_MAX_DIMS] = {0};
    if (lp_pool_geometry(c, x, &w, onnx_attr_int(c, "ceil_mode", 0) != 0, out, extra)) return fm_last_status();
    for (int i = 0; i < w.nsp; i++) pads[2 + i] = w.pb[i], pads[x->ndim + 2 + i] = w.pe[i] + extra[i];
    fm_tensor *a = p == 2 ? NULL : fm_abs(x), *xp = p == 1 ? fm_tensor_retain(a) : p == 2 ? fm_mul(x, x) : a ? fm_pow_scalar(a, (double)p) : NULL;
    fm_tensor *pd = xp ? fm_pad(xp, pads, FM_PAD_CONSTANT, 0.0) : NULL, *s = pd ? window_sum(pd, &w, out) : NULL;
    fm_tensor *y = !s ? NULL : p == 1 ? fm_tensor_retain(s) : p == 2 ? fm_sqrt(s) : fm_pow_scalar(s, 1.0 / (double)p);
    REL(a, xp, pd, s);
    return onnx_set_out(c, 0, y);
}

/* ---- LpNormalization: x / (sum |x|^p)^(1/p) along the axis, p 1 or 2; 0 where the norm is 0 ---- */
static fm_status op_lp_norm(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    if (!fm_dtype_is_float(x->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "needs a floating-point input; got %s", fm_dtype_name(x->dtype));
    const int64_t p = onnx_attr_int(c, "p", 2), ax = onnx_attr_int(c, "axis", -1);
    if (p != 1 && p != 2) return onnx_node_error(c, FM_ERR_INVALID, "p must be 1 or 2; got %" PRId64, p);
    if (ax < -x->ndim || ax >= x->ndim)
        return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is out of range for an input of rank %d", ax, x->ndim);
    const int axis = (int)(ax < 0 ? ax + x->ndim : ax);
    fm_tensor *a = p == 1 ? fm_abs(x) : fm_mul(x, x), *s = a ? fm_sum(a, 1, &axis, true) : NULL;
    fm_tensor *n = !s ? NULL : p == 1 ? fm_tensor_retain(s) : fm_sqrt(s), *q = n ? fm_div(x, n) : NULL;
    fm_tensor *z = q ? fm_tensor_zeros(0, NULL, x->dtype, dev_of(x)) : NULL, *zn = z ? fm_eq(n, z) : NULL;
    fm_tensor *y = zn ? fm_where(zn, z, q) : NULL;
    REL(a, s, n, q, z, zn);
    return onnx_set_out(c, 0, y);
}

/* ---- GroupNormalization: x as [N, G, rest] normalized over rest, back in x's dtype, then
 * scaled and shifted: before opset 21 per group (scale and bias of num_groups values), in
 * float32 (float64 for a float64 x); from 21 per channel (C values), in stash_type's dtype
 * (float32 unless given). ---- */
static fm_status op_group_norm(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *sc = c->in[1], *b = c->in[2];
    if (x->ndim < 2) return onnx_node_error(c, FM_ERR_INVALID, "input of rank %d: GroupNormalization needs [N, C, ...]", x->ndim);
    if (!fm_dtype_is_float(x->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "needs a floating-point input; got %s", fm_dtype_name(x->dtype));
    const int64_t G = onnx_attr_int(c, "num_groups", 0), C = x->shape[1];
    if (G < 1 || C % G) return onnx_node_error(c, FM_ERR_INVALID, "num_groups %" PRId64 " must be positive and divide the %" PRId64 " channels", G, C);
    const bool per_channel = c->opset >= 21;
    const int64_t want = per_channel ? C : G;
    if (fm_tensor_numel(sc) != want || fm_tensor_numel(b) != want)
        return onnx_node_error(c, FM_ERR_INVALID, "scale and bias need %" PRId64 " values (%s at opset %d), have %" PRId64 " and %" PRId64, want,
                               per_channel ? "one per channel" : "one per group", c->opset, fm_tensor_numel(sc), fm_tensor_numel(b));
    int64_t rest = C / G, gsh[3] = {x->shape[0], G, 0}, psh[FM_MAX_DIMS] = {1, want, 1};
    for (int d = 2; d < x->ndim; d++) rest *= x->shape[d], psh[d] = 1;
    gsh[2] = rest;
    const int pn = per_channel ? x->ndim : 3;
    fm_dtype wide = x->dtype == FM_F64 ? FM_F64 : FM_F32;
    const int64_t stash = onnx_attr_int(c, "stash_type", 1);
    if (c->opset >= 21 && (stash < 1 || stash > 64 || !onnx_dtype_to_fm((int32_t)stash, &wide) || !fm_dtype_is_float(wide)))
        return onnx_node_error(c, FM_ERR_INVALID, "stash_type %" PRId64 " is not a floating-point type fathom has", stash);
    fm_tensor *xg = fm_reshape(x, 3, gsh), *xw = xg ? fm_to_dtype(xg, wide) : NULL;
    fm_tensor *n = xw ? fm_layer_norm(xw, 1, NULL, NULL, onnx_attr_float(c, "epsilon", 1e-5f)) : NULL;
    fm_tensor *nd = n ? fm_to_dtype(n, x->dtype) : NULL, *nx = nd && per_channel ? fm_reshape(nd, x->ndim, x->shape) : nd ? fm_tensor_retain(nd) : NULL;
    fm_tensor *s = nx ? fm_reshape(sc, pn, psh) : NULL, *bb = s ? fm_reshape(b, pn, psh) : NULL;
    fm_tensor *m = bb ? fm_mul(nx, s) : NULL, *a = m ? fm_add(m, bb) : NULL, *y = a ? fm_reshape(a, x->ndim, x->shape) : NULL;
    REL(xg, xw, n, nd, nx, s, bb, m, a);
    return onnx_set_out(c, 0, y);
}

/* ---- CenterCropPad: each listed axis cropped or zero-padded to its target about the center
 * (the odd element: cropped from the end, padded at the end), one fm_pad ---- */
static fm_status op_center_crop_pad(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t tgt[FM_MAX_DIMS], pads[2 * FM_MAX_DIMS] = {0}, osh[FM_MAX_DIMS];
    int n = 0, na = 0, axes[FM_MAX_DIMS];
    bool seen[FM_MAX_DIMS] = {false};
    if (onnx_tensor_ints(c, 1, tgt, FM_MAX_DIMS, &n)) return fm_last_status();
    const int64_t *av = onnx_attr_ints(c, "axes", &na);
    if (!av) na = x->ndim;
    if (n != na)
        return onnx_node_error(c, FM_ERR_INVALID, "shape has %d values; expected %d (one per %s)", n, na, av ? "axis in axes" : "dim of the input");
    for (int i = 0; i < na; i++) {
        const int64_t a = av ? av[i] : i;
        if (a < -x->ndim || a >= x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is out of range for an input of rank %d", a, x->ndim);
        axes[i] = (int)(a < 0 ? a + x->ndim : a);
        if (seen[axes[i]]) return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is listed twice", a);
        seen[axes[i]] = true;
    }
    memcpy(osh, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    for (int i = 0; i < na; i++) {
        const int ax = axes[i];
        if (tgt[i] < 0) return onnx_node_error(c, FM_ERR_INVALID, "shape[%d] = %" PRId64 " is negative", i, tgt[i]);
        const int64_t d = tgt[i] - x->shape[ax], m = d < 0 ? -d : d, lo = m / 2, hi = m - lo, sg = d < 0 ? -1 : 1;
        pads[ax] = sg * lo, pads[x->ndim + ax] = sg * hi, osh[ax] = tgt[i];
    }
    if (checked_numel(x->ndim, osh) < 0) return onnx_node_error(c, FM_ERR_INVALID, "the output would have more than 2^36 elements");
    return onnx_set_out(c, 0, fm_pad(x, pads, FM_PAD_CONSTANT, 0.0));
}

/* ---- Col2Im: input [N, C * prod(block), L] -> [N, C, image...]: column element (k, l) adds
 * into the image position of block offset k of sliding block l (none when it falls in the
 * padding): the positions computed here once, then one scatter-add on the input's device. ---- */
typedef struct col2im_geom {
    int n;
    int64_t img[FM_MAX_DIMS], blk[FM_MAX_DIMS], nb[FM_MAX_DIMS], s[FM_MAX_DIMS], d[FM_MAX_DIMS], pb[FM_MAX_DIMS], pe[FM_MAX_DIMS];
    int64_t K, L, P, C;
} col2im_geom;

/* An INTS attribute of n values (or dflt), each in [lo, 2^20]. */
static fm_status ints_attr(onnx_op_ctx *c, const char *name, int n, int64_t dflt, int64_t lo, int64_t *v) {
    int k = 0;
    const int64_t *a = onnx_attr_ints(c, name, &k);
    if (a && k != n) return onnx_node_error(c, FM_ERR_INVALID, "%s has %d values; expected %d", name, k, n);
    for (int i = 0; i < n; i++) {
        v[i] = a ? a[i] : dflt;
        if (v[i] < lo || v[i] > (1 << 20))
            return onnx_node_error(c, FM_ERR_INVALID, "%s[%d] = %" PRId64 " is outside [%" PRId64 ", 2^20]", name, i, v[i], lo);
    }
    return FM_OK;
}

static fm_status col2im_geometry(onnx_op_ctx *c, col2im_geom *g) {
    const fm_tensor *x = c->in[0];
    int nb = 0;
    if (x->ndim != 3) return onnx_node_error(c, FM_ERR_INVALID, "input must be [N, C * prod(block_shape), L]; got rank %d", x->ndim);
    if (onnx_tensor_ints(c, 1, g->img, FM_MAX_DIMS - 2, &g->n) || onnx_tensor_ints(c, 2, g->blk, FM_MAX_DIMS - 2, &nb)) return fm_last_status();
    if (g->n < 1 || nb != g->n)
        return onnx_node_error(c, FM_ERR_INVALID, "block_shape has %d values and image_shape %d; they must be as many, at least 1", nb, g->n);
    int64_t pads[2 * FM_MAX_DIMS];
    if (ints_attr(c, "strides", g->n, 1, 1, g->s) || ints_attr(c, "dilations", g->n, 1, 1, g->d) || ints_attr(c, "pads", 2 * g->n, 0, 0, pads))
        return fm_last_status();
    for (int i = 0; i < g->n; i++) {
        g->pb[i] = pads[i], g->pe[i] = pads[g->n + i];
        if (g->img[i] < 1 || g->img[i] > (1 << 30) || g->blk[i] < 1 || g->blk[i] > (1 << 20))
            return onnx_node_error(c, FM_ERR_INVALID, "image_shape[%d] = %" PRId64 " and block_shape[%d] = %" PRId64 " must be positive", i,
                                   g->img[i], i, g->blk[i]);
        const int64_t span = (g->blk[i] - 1) * g->d[i] + 1, room = g->img[i] + g->pb[i] + g->pe[i] - span;
        if (room < 0)
            return onnx_node_error(c, FM_ERR_INVALID, "block_shape[%d] = %" PRId64 " (dilated to %" PRId64 ") is larger than the padded image (%" PRId64
                                   ")", i, g->blk[i], span, g->img[i] + g->pb[i] + g->pe[i]);
        g->nb[i] = room / g->s[i] + 1;
    }
    g->K = checked_numel(g->n, g->blk), g->L = checked_numel(g->n, g->nb), g->P = checked_numel(g->n, g->img);
    if (g->K < 0 || g->L < 0 || g->P < 0 || g->K * (double)g->L > (double)EXTRA_MAX_ELEMS)
        return onnx_node_error(c, FM_ERR_INVALID, "image_shape or block_shape too large");
    if (x->shape[1] % g->K)
        return onnx_node_error(c, FM_ERR_INVALID, "input dim 1 (%" PRId64 ") is not a multiple of the block size %" PRId64, x->shape[1], g->K);
    if (x->shape[2] != g->L)
        return onnx_node_error(c, FM_ERR_INVALID, "input dim 2 (%" PRId64 ") is not the number of sliding blocks, %" PRId64, x->shape[2], g->L);
    g->C = x->shape[1] / g->K;
    return FM_OK;
}

/* The image position of every column element (k, l), k-major, or P for none. */
static void col2im_positions(const col2im_geom *g, int64_t *pos) {
    for (int64_t k = 0; k < g->K; k++)
        for (int64_t l = 0; l < g->L; l++) {
            int64_t rk = k, rl = l, at = 0, idx[FM_MAX_DIMS];
            bool in = true;
            for (int i = g->n - 1; i >= 0; i--) {
                const int64_t ok = rk % g->blk[i], ol = rl % g->nb[i];
                rk /= g->blk[i], rl /= g->nb[i];
                idx[i] = ol * g->s[i] - g->pb[i] + ok * g->d[i];
                in = in && idx[i] >= 0 && idx[i] < g->img[i];
            }
            for (int i = 0; i < g->n && in; i++) at = at * g->img[i] + idx[i];
            pos[k * g->L + l] = in ? at : g->P;
        }
}

static fm_status op_col2im(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    col2im_geom g;
    if (col2im_geometry(c, &g)) return fm_last_status();
    const int64_t N = x->shape[0], KL = g.K * g.L, zsh[3] = {N, g.C, g.P + 1}, ssh[3] = {N, g.C, KL};
    int64_t ysh[FM_MAX_DIMS] = {N, g.C};
    for (int i = 0; i < g.n; i++) ysh[2 + i] = g.img[i];
    if (checked_numel(3, zsh) < 0) return onnx_node_error(c, FM_ERR_INVALID, "the output would have more than 2^36 elements");
    if (!fm_tensor_numel(x)) return onnx_set_out(c, 0, fm_tensor_zeros(2 + g.n, ysh, x->dtype, dev_of(x)));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)KL); /* KL <= the input's elements */
    if (!pos) return onnx_node_error(c, FM_ERR_OOM, "out of memory for %" PRId64 " positions", KL);
    col2im_positions(&g, pos);
    fm_tensor *pi = ints_on(pos, 3, (int64_t[]){1, 1, KL}, dev_of(x));
    free(pos);
    fm_tensor *pe = pi ? fm_expand(pi, 3, ssh) : NULL, *pc = pe ? fm_contiguous(pe) : NULL;
    fm_tensor *src = pc ? fm_reshape(x, 3, ssh) : NULL, *z = src ? fm_tensor_zeros(3, zsh, x->dtype, dev_of(x)) : NULL;
    fm_tensor *sc = z ? fm_scatter(z, 2, pc, src, FM_SCATTER_ADD) : NULL, *nw = sc ? fm_narrow(sc, 2, 0, g.P) : NULL;
    fm_tensor *y = nw ? fm_reshape(nw, 2 + g.n, ysh) : NULL;
    REL(pi, pe, pc, src, z, sc, nw);
    return onnx_set_out(c, 0, y);
}

/* ---- BitwiseAnd, Or, Xor, Not and BitShift: on the host in int64 (the inputs broadcast
 * first), back in the input's dtype. Sign-extended int8/int32 give sign-extended results;
 * uint8's are masked to 8 bits. ---- */
typedef enum { BIT_AND, BIT_OR, BIT_XOR, BIT_NOT, BIT_SHL, BIT_SHR } bit_op;

static int64_t bit_apply(bit_op op, int64_t a, int64_t b, int bits) {
    switch (op) {
    case BIT_AND: return a & b;
    case BIT_OR: return a | b;
    case BIT_XOR: return a ^ b;
    case BIT_NOT: return bits == 8 ? ~a & 0xFF : ~a;
    case BIT_SHL: return b >= bits ? 0 : (int64_t)(((uint64_t)a << b) & 0xFF);
    default: return b >= bits ? 0 : (int64_t)((uint64_t)a >> b);
    }
}

/* The broadcast shape of a and b (numpy's rule) into sh; false when they do not broadcast. */
static bool broadcast_shape(const fm_tensor *a, const fm_tensor *b, int *nd, int64_t *sh) {
    *nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < *nd; i++) {
        const int ia = i - (*nd - a->ndim), ib = i - (*nd - b->ndim);
        const int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        sh[i] = da == 1 ? db : da;
    }
    return true;
}

/* The element strides of contiguous t seen with nd dims (right-aligned): 0 where it broadcasts. */
static void broadcast_strides(const fm_tensor *t, int nd, int64_t *st) {
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        const int ti = i - (nd - t->ndim);
        const int64_t d = ti >= 0 ? t->shape[ti] : 1;
        st[i] = d == 1 ? 0 : s;
        s *= d;
    }
}

/* y = op(a, b) elementwise, a and b (contiguous int64) broadcast to y's shape here: fathom's
 * copy of a broadcast (strided) int64 view goes through double, which would round values
 * past 2^53. */
static void bit_loop(bit_op op, const fm_tensor *a, const fm_tensor *b, fm_tensor *y, int bits) {
    int64_t sa[FM_MAX_DIMS], sb[FM_MAX_DIMS];
    broadcast_strides(a, y->ndim, sa), broadcast_strides(b, y->ndim, sb);
    const int64_t *va = fm_tensor_data(a), *vb = fm_tensor_data(b);
    int64_t *vy = fm_tensor_data(y);
    for (int64_t i = 0, n = fm_tensor_numel(y); i < n; i++) {
        int64_t r = i, oa = 0, ob = 0;
        for (int d = y->ndim - 1; d >= 0; d--) {
            const int64_t k = r % y->shape[d];
            r /= y->shape[d], oa += k * sa[d], ob += k * sb[d];
        }
        vy[i] = bit_apply(op, va[oa], vb[ob], bits);
    }
}

static fm_status bitwise(onnx_op_ctx *c, bit_op op) {
    fm_tensor *a = c->in[0], *b = op == BIT_NOT ? c->in[0] : c->in[1];
    const bool shift = op == BIT_SHL || op == BIT_SHR;
    if (shift ? a->dtype != FM_U8 : !is_int_dtype(a->dtype))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "needs %s input; got %s",
                               shift ? "an unsigned integer (uint8 in fathom)" : "an integer (int8, uint8, int32, int64 in fathom)", fm_dtype_name(a->dtype));
    if (b->dtype != a->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "inputs of different dtypes: %s and %s", fm_dtype_name(a->dtype), fm_dtype_name(b->dtype));
    int nd;
    int64_t sh[FM_MAX_DIMS];
    char s1[96], s2[96];
    if (!broadcast_shape(a, b, &nd, sh))
        return onnx_node_error(c, FM_ERR_INVALID, "shapes %s and %s do not broadcast", fm_shape_str(a->ndim, a->shape, s1, sizeof s1),
                               fm_shape_str(b->ndim, b->shape, s2, sizeof s2));
    fm_tensor *ha = onnx_host(a, FM_I64), *hb = !ha ? NULL : b == a ? fm_tensor_retain(ha) : onnx_host(b, FM_I64);
    fm_tensor *y = hb ? fm_tensor_empty(nd, sh, FM_I64, FM_CPU) : NULL;
    if (y) bit_loop(op, ha, hb, y, a->dtype == FM_U8 ? 8 : 64);
    REL(ha, hb);
    return onnx_set_out(c, 0, onnx_host_back(y, a->dtype, dev_of(a)));
}
static fm_status op_bit_and(onnx_op_ctx *c) { return bitwise(c, BIT_AND); }
static fm_status op_bit_or(onnx_op_ctx *c) { return bitwise(c, BIT_OR); }
static fm_status op_bit_xor(onnx_op_ctx *c) { return bitwise(c, BIT_XOR); }
static fm_status op_bit_not(onnx_op_ctx *c) { return bitwise(c, BIT_NOT); }

static fm_status op_bit_shift(onnx_op_ctx *c) {
    char buf[16];
    const char *dir = onnx_attr_string(c, "direction", "", buf, sizeof buf);
    if (strcmp(dir, "LEFT") && strcmp(dir, "RIGHT")) return onnx_node_error(c, FM_ERR_INVALID, "direction '%s' is not LEFT or RIGHT", dir);
    return bitwise(c, strcmp(dir, "LEFT") ? BIT_SHR : BIT_SHL);
}

/* ---- AffineGrid: theta [N, r, r+1] (r 2 or 3) times the homogeneous base grid (x along W, y
 * along H, z along D, each spanning [-1, 1]: pixel centers, or the corner pixels' centers
 * with align_corners), one matmul on theta's device: [N, (D,) H, W, r]. ---- */
static double grid_coord(int64_t i, int64_t n, bool align) {
    if (align) return n > 1 ? -1.0 + 2.0 * (double)i / (double)(n - 1) : -1.0;
    return (2.0 * (double)i + 1.0) / (double)n - 1.0;
}

static fm_status op_affine_grid(onnx_op_ctx *c) {
    fm_tensor *th = c->in[0];
    int64_t sz[6];
    int n = 0;
    if (onnx_tensor_ints(c, 1, sz, 6, &n)) return fm_last_status();
    const int r = th->ndim == 3 ? (int)th->shape[1] : 0;
    if ((r != 2 && r != 3) || th->shape[2] != r + 1 || !fm_dtype_is_float(th->dtype))
        return onnx_node_error(c, FM_ERR_INVALID, "theta must be floating-point [N, 2, 3] or [N, 3, 4]");
    if (n != r + 2 || sz[0] != th->shape[0])
        return onnx_node_error(c, FM_ERR_INVALID, "size must be [N, C, %s] with theta's N (%" PRId64 ")", r == 2 ? "H, W" : "D, H, W", th->shape[0]);
    int64_t S = 1, ysh[5] = {th->shape[0]};
    for (int i = 0; i < r; i++) {
        if (sz[2 + i] < 1 || sz[2 + i] > (1 << 24)) return onnx_node_error(c, FM_ERR_INVALID, "size[%d] = %" PRId64 " must be in [1, 2^24]", 2 + i, sz[2 + i]);
        S *= sz[2 + i], ysh[1 + i] = sz[2 + i];
        if (S * (double)(th->shape[0] ? th->shape[0] : 1) > (double)(1 << 30))
            return onnx_node_error(c, FM_ERR_INVALID, "the grid would have more than 2^30 points");
    }
    ysh[1 + r] = r;
    const bool align = onnx_attr_int(c, "align_corners", 0) != 0;
    const int64_t bsh[2] = {S, r + 1};
    fm_tensor *base = fm_tensor_empty(2, bsh, FM_F64, FM_CPU);
    if (!base) return fm_last_status();
    double *bv = fm_tensor_data(base);
    for (int64_t p = 0; p < S; p++) {
        int64_t rem = p;
        for (int j = 0; j < r; j++) { /* the last spatial dim (W) gives x, the first coordinate */
            const int64_t len = sz[2 + r - 1 - j];
            bv[p * (r + 1) + j] = grid_coord(rem % len, len, align);
            rem /= len;
        }
        bv[p * (r + 1) + r] = 1.0;
    }
    fm_tensor *bd = onnx_host_back(base, th->dtype, dev_of(th)), *tt = bd ? fm_transpose(th, 1, 2) : NULL;
    fm_tensor *g = tt ? fm_matmul(bd, tt) : NULL, *y = g ? fm_reshape(g, r + 2, ysh) : NULL;
    REL(bd, tt, g);
    return onnx_set_out(c, 0, y);
}

/* ---- ReverseSequence: the first sequence_lens[b] steps of batch entry b reversed along the
 * time axis: one gather with the source step of every element ---- */
static fm_status op_reverse_sequence(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *lens = c->in[1];
    const int64_t ba = onnx_attr_int(c, "batch_axis", 1), ta = onnx_attr_int(c, "time_axis", 0);
    if (x->ndim < 2) return onnx_node_error(c, FM_ERR_INVALID, "input of rank %d: ReverseSequence needs at least 2 dims", x->ndim);
    if ((ba != 0 && ba != 1) || (ta != 0 && ta != 1) || ba == ta)
        return onnx_node_error(c, FM_ERR_INVALID, "batch_axis (%" PRId64 ") and time_axis (%" PRId64 ") must be 0 and 1, one each", ba, ta);
    const int64_t B = x->shape[ba], T = x->shape[ta];
    if ((lens->dtype != FM_I64 && lens->dtype != FM_I32) || lens->ndim != 1 || lens->shape[0] != B)
        return onnx_node_error(c, FM_ERR_INVALID, "sequence_lens must be %" PRId64 " integers (the batch size)", B);
    if (!fm_tensor_numel(x)) return onnx_set_out(c, 0, fm_tensor_retain(x));
    int64_t ish[FM_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) ish[d] = d == ba ? B : d == ta ? T : 1;
    const int64_t cnt = B * T;
    fm_tensor *lh = onnx_host(lens, FM_I64), *ih = lh ? fm_tensor_empty(x->ndim, ish, FM_I64, FM_CPU) : NULL;
    if (!ih) { REL(lh); return fm_last_status(); }
    const int64_t *lv = fm_tensor_data(lh);
    int64_t *iv = fm_tensor_data(ih);
    for (int64_t i = 0; i < cnt; i++) {
        const int64_t b = ba == 0 ? i / T : i % B, t = ba == 0 ? i % T : i / B, len = lv[b];
        if (len < 0 || len > T) {
            REL(lh, ih);
            return onnx_node_error(c, FM_ERR_INVALID, "sequence_lens[%" PRId64 "] = %" PRId64 " is outside [0, %" PRId64 "]", b, len, T);
        }
        iv[i] = t < len ? len - 1 - t : t;
    }
    fm_tensor *id = onnx_host_back(ih, FM_I64, dev_of(x)), *ie = id ? fm_expand(id, x->ndim, x->shape) : NULL;
    fm_tensor *ic = ie ? fm_contiguous(ie) : NULL, *y = ic ? fm_gather(x, (int)ta, ic) : NULL;
    REL(lh, id, ie, ic);
    return onnx_set_out(c, 0, y);
}

/* ---- MaxUnpool: X's values at the flat positions I (MaxPool's Indices) of a zero tensor of
 * the shape the pooling implies, (in - 1) * stride - pads + kernel per spatial dim, one
 * scatter; an output_shape at least that large zero-pads it at the end of each dim (the
 * indices keep addressing the implied shape, as ONNX's reference and test data have it). ---- */
static fm_status op_max_unpool(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *ind = c->in[1];
    onnx_window w;
    if (onnx_window_of(c, x, NULL, &w)) return fm_last_status();
    char s1[96], s2[96];
    bool same = ind->ndim == x->ndim && (ind->dtype == FM_I64 || ind->dtype == FM_I32);
    for (int d = 0; same && d < x->ndim; d++) same = ind->shape[d] == x->shape[d];
    if (!same)
        return onnx_node_error(c, FM_ERR_INVALID, "I must be integers of X's shape %s; got %s %s", fm_shape_str(x->ndim, x->shape, s1, sizeof s1),
                               fm_dtype_name(ind->dtype), fm_shape_str(ind->ndim, ind->shape, s2, sizeof s2));
    int64_t inf[FM_MAX_DIMS] = {x->shape[0], x->shape[1]}, osh[FM_MAX_DIMS], pads[2 * FM_MAX_DIMS] = {0};
    for (int i = 0; i < w.nsp; i++) {
        inf[2 + i] = (x->shape[2 + i] - 1) * w.s[i] - (w.pb[i] + w.pe[i]) + w.k[i];
        if (inf[2 + i] < 1)
            return onnx_node_error(c, FM_ERR_INVALID, "the unpooled size along spatial dim %d is %" PRId64 "; it must be positive", i, inf[2 + i]);
    }
    const int64_t total = checked_numel(x->ndim, inf);
    if (total < 0) return onnx_node_error(c, FM_ERR_INVALID, "the output would have more than 2^36 elements");
    memcpy(osh, inf, sizeof osh);
    if (c->n_in > 2 && c->in[2]) {
        int n = 0;
        if (onnx_tensor_ints(c, 2, osh, FM_MAX_DIMS, &n)) return fm_last_status();
        bool ok = n == x->ndim;
        for (int d = 0; ok && d < n; d++) ok = d < 2 ? osh[d] == inf[d] : osh[d] >= inf[d] && osh[d] <= inf[d] + (1 << 20);
        if (!ok)
            return onnx_node_error(c, FM_ERR_INVALID, "output_shape must be %d values, N and C of X, then at least the unpooled sizes %s", x->ndim,
                                   fm_shape_str(x->ndim, inf, s1, sizeof s1));
        if (checked_numel(n, osh) < 0) return onnx_node_error(c, FM_ERR_INVALID, "the output would have more than 2^36 elements");
        for (int d = 0; d < n; d++) pads[n + d] = osh[d] - inf[d];
    }
    const int64_t m = fm_tensor_numel(x);
    fm_tensor *z = fm_tensor_zeros(1, &total, x->dtype, dev_of(x)), *xf = z ? fm_reshape(x, 1, &m) : NULL;
    fm_tensor *i64 = xf ? fm_to_dtype(ind, FM_I64) : NULL, *idf = i64 ? fm_reshape(i64, 1, &m) : NULL;
    fm_tensor *sc = idf ? fm_scatter(z, 0, idf, xf, FM_SCATTER_NONE) : NULL, *yr = sc ? fm_reshape(sc, x->ndim, inf) : NULL;
    fm_tensor *y = yr ? fm_pad(yr, pads, FM_PAD_CONSTANT, 0.0) : NULL;
    REL(z, xf, i64, idf, sc, yr);
    return onnx_set_out(c, 0, y);
}

/* ---- Det: LU with partial pivoting per [M, M] matrix, in f64 on the host ---- */
static double det_of(double *a, int64_t m) {
    double det = 1.0;
    for (int64_t k = 0; k < m; k++) {
        int64_t piv = k;
        for (int64_t i = k + 1; i < m; i++)
            if (fabs(a[i * m + k]) > fabs(a[piv * m + k])) piv = i;
        if (a[piv * m + k] == 0.0) return 0.0;
        if (piv != k) {
            for (int64_t j = 0; j < m; j++) {
                const double t = a[k * m + j];
                a[k * m + j] = a[piv * m + j], a[piv * m + j] = t;
            }
            det = -det;
        }
        det *= a[k * m + k];
        for (int64_t i = k + 1; i < m; i++) {
            const double f = a[i * m + k] / a[k * m + k];
            for (int64_t j = k + 1; j < m; j++) a[i * m + j] -= f * a[k * m + j];
        }
    }
    return det;
}

static fm_status op_det(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    char s1[96];
    if (!fm_dtype_is_float(x->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "needs a floating-point input; got %s", fm_dtype_name(x->dtype));
    if (x->ndim < 2 || x->shape[x->ndim - 1] != x->shape[x->ndim - 2])
        return onnx_node_error(c, FM_ERR_INVALID, "input %s is not [..., M, M] (square matrices)", fm_shape_str(x->ndim, x->shape, s1, sizeof s1));
    const int64_t m = x->shape[x->ndim - 1], batch = checked_numel(x->ndim - 2, x->shape);
    if (batch < 0) return onnx_node_error(c, FM_ERR_INVALID, "more than 2^36 matrices");
    fm_tensor *h = onnx_host(x, FM_F64), *y = h ? fm_tensor_empty(x->ndim - 2, x->shape, FM_F64, FM_CPU) : NULL;
    double *a = y ? malloc(sizeof(double) * (size_t)(m ? m * m : 1)) : NULL;
    if (y && !a) {
        REL(h, y);
        return onnx_node_error(c, FM_ERR_OOM, "out of memory for a %" PRId64 "x%" PRId64 " matrix", m, m);
    }
    for (int64_t b = 0; a && b < batch; b++) {
        if (m) memcpy(a, (const double *)fm_tensor_data(h) + b * m * m, sizeof(double) * (size_t)(m * m));
        ((double *)fm_tensor_data(y))[b] = det_of(a, m); /* the empty matrix's determinant is 1 */
    }
    free(a);
    fm_tensor_release(h);
    return onnx_set_out(c, 0, onnx_host_back(y, x->dtype, dev_of(x)));
}

#define WIN_ATTRS "auto_pad,kernel_shape,pads,strides,dilations"
const onnx_op onnx_ops_extra[] = {
    {"CumProd", 26, 2, 2, 1, "exclusive,reverse", op_cumprod},
    {"LpPool", 2, 1, 1, 1, WIN_ATTRS ",ceil_mode,p", op_lp_pool},
    {"LpNormalization", 1, 1, 1, 1, "axis,p", op_lp_norm},
    {"CenterCropPad", 18, 2, 2, 1, "axes", op_center_crop_pad},
    {"Col2Im", 18, 3, 3, 1, "dilations,pads,strides", op_col2im},
    {"BitwiseAnd", 18, 2, 2, 1, "", op_bit_and},
    {"BitwiseOr", 18, 2, 2, 1, "", op_bit_or},
    {"BitwiseXor", 18, 2, 2, 1, "", op_bit_xor},
    {"BitwiseNot", 18, 1, 1, 1, "", op_bit_not},
    {"BitShift", 11, 2, 2, 1, "direction", op_bit_shift},
    {"AffineGrid", 20, 2, 2, 1, "align_corners", op_affine_grid},
    {"GroupNormalization", 18, 3, 3, 1, "epsilon,num_groups,stash_type", op_group_norm},
    {"ReverseSequence", 10, 2, 2, 1, "batch_axis,time_axis", op_reverse_sequence},
    {"MaxUnpool", 9, 2, 3, 1, "kernel_shape,pads,strides", op_max_unpool},
    {"Det", 11, 1, 1, 1, "", op_det},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
