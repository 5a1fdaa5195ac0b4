/* ONNX BitCast, DeformConv and TensorScatter.
 *
 * BitCast (opset 26): the input's bytes read as another element type of the same width
 * (ONNX allows no change of size): f32 <-> i32, f64 <-> i64, f16 <-> bf16 and i8 <-> u8 <->
 * bool among fathom's dtypes. fathom has no op that reinterprets a tensor's storage, so the
 * bytes are copied on the host and the result returned to the input's device. A byte other
 * than 0 or 1 read as bool becomes true (1): fathom's bools hold only 0 and 1.
 *
 * DeformConv (opset 19; 22 adds bfloat16): per output position and kernel tap, the input is
 * sampled bilinearly (zero outside) at the tap's position plus the learned offset of its
 * offset group, scaled by the mask, and the sampled columns are multiplied by the weights
 * (per group) as an im2col convolution. Composed of fathom ops on the input's device: the
 * corners' flat indices and linear weights come from the offsets by floor, clamp and compare,
 * the corners are read with fm_index_select from the input laid out as [N * offset_group *
 * positions, channels of the group] plus a row of zeros, which a corner outside the input
 * (or at an infinite or NaN position) reads, so that it adds exactly 0 as in ONNX Runtime,
 * and fm_matmul does the convolution. Only the fixed tap positions (from the geometry) and
 * each plane's first row are made on the host. 1 to 3 spatial dims (multilinear sampling
 * over each: 2, 4 or 8 corners); float16 and bfloat16 compute in float32. The columns take
 * N C K O elements (K kernel taps, O output positions), as any im2col does.
 *
 * TensorScatter (opset 24): the KV-cache update, present = past with update's positions along
 * the sequence axis written from write_indices[b] on (circular: modulo the cache length), as
 * one fm_scatter on past's device. The write indices (one per batch) are read on the host to
 * check them against the cache length and reduce them modulo it, so that the scatter's index
 * is exact. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

/* The most elements an intermediate here may have (DeformConv's columns). */
#define MORE_MAX_ELEMS (INT64_C(1) << 36)

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }

/* a * b, or -1 when either is negative or the product passes MORE_MAX_ELEMS. */
static int64_t mul_capped(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || (b && a > MORE_MAX_ELEMS / b)) return -1;
    return a * b;
}

/* ---- BitCast ---- */

static fm_status op_bitcast(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    const Onnx__AttributeProto *at = onnx_attr(c, "to");
    if (!at) return onnx_node_error(c, FM_ERR_INVALID, "attribute 'to' (the target element type) is required");
    const int64_t to = onnx_attr_int(c, "to", 0);
    fm_dtype dt;
    if (to < 1 || to > 64 || !onnx_dtype_to_fm((int32_t)to, &dt))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "to=%" PRId64 " (%s) is not an element type fathom has", to,
                               to >= 0 && to <= 64 ? onnx_dtype_name((int32_t)to) : "unknown");
    const size_t si = fm_dtype_size(x->dtype), so = fm_dtype_size(dt);
    if (si != so)
        return onnx_node_error(c, FM_ERR_INVALID, "%s (%zu bits) and %s (%zu bits) differ in width; BitCast keeps the width",
                               onnx_dtype_name(onnx_dtype_from_fm(x->dtype)), 8 * si, onnx_dtype_name((int32_t)to), 8 * so);
    if (dt == x->dtype) return onnx_set_out(c, 0, fm_tensor_retain(x));
    fm_tensor *h = onnx_host(x, x->dtype), *y = h ? fm_tensor_empty(x->ndim, x->shape, dt, FM_CPU) : NULL;
    if (y && fm_tensor_numel(h) > 0) {
        const int64_t n = fm_tensor_numel(h);
        memcpy(fm_tensor_data(y), fm_tensor_data(h), (size_t)n * so);
        if (dt == FM_BOOL)
            for (unsigned char *b = fm_tensor_data(y), *e = b + n; b < e; b++) *b = *b != 0;
    }
    fm_tensor_release(h);
    return onnx_set_out(c, 0, onnx_host_back(y, dt, dev_of(x)));
}

/* ---- DeformConv ---- */

typedef struct dc_plan {
    int nsp;
    int64_t N, C, oC, G, og, Cg; /* Cg: channels per offset group */
    int64_t K, O, P;             /* kernel taps, output positions, input positions (per plane) */
    int64_t S[3], k[3], s[3], d[3], pb[3], o[3];
    fm_dtype wt; /* the dtype computed in */
} dc_plan;

/* An optional INTS attribute has n values (or is absent). */
static bool ints_count_ok(const onnx_op_ctx *c, const char *name, int n) {
    int got = 0;
    return !onnx_attr_ints(c, name, &got) || got == n;
}

/* The spatial geometry and the shapes of W, offset, B and mask checked against X. */
static fm_status dc_geometry(onnx_op_ctx *c, dc_plan *p) {
    const fm_tensor *x = c->in[0], *w = c->in[1];
    const int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 3)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "X has rank %d: fathom runs DeformConv over 1 to 3 spatial dims (rank 3 to 5)", x->ndim);
    if (w->ndim != x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "W has rank %d; X has rank %d", w->ndim, x->ndim);
    if (!ints_count_ok(c, "strides", nsp) || !ints_count_ok(c, "dilations", nsp) || !ints_count_ok(c, "kernel_shape", nsp) ||
        !ints_count_ok(c, "pads", 2 * nsp))
        return onnx_node_error(c, FM_ERR_INVALID, "strides, dilations and kernel_shape need %d values, pads %d", nsp, 2 * nsp);
    int nk = 0;
    const int64_t *ks = onnx_attr_ints(c, "kernel_shape", &nk);
    for (int i = 0; ks && i < nsp; i++)
        if (ks[i] != w->shape[2 + i])
            return onnx_node_error(c, FM_ERR_INVALID, "kernel_shape[%d] = %" PRId64 " but W's spatial dim %d is %" PRId64, i, ks[i], i,
                                   w->shape[2 + i]);
    onnx_window win;
    if (onnx_window_of(c, x, w->shape + 2, &win)) return fm_last_status();
    p->nsp = nsp, p->K = 1, p->O = 1, p->P = 1;
    for (int i = 0; i < nsp; i++) {
        const int64_t in = x->shape[2 + i], span = (win.k[i] - 1) * win.d[i] + 1, room = in + win.pb[i] + win.pe[i] - span;
        if (room < 0)
            return onnx_node_error(c, FM_ERR_INVALID, "the kernel (%" PRId64 " wide with its dilation) is larger than the padded input (%" PRId64
                                   ") along spatial dim %d", span, in + win.pb[i] + win.pe[i], i);
        p->S[i] = in, p->k[i] = win.k[i], p->s[i] = win.s[i], p->d[i] = win.d[i], p->pb[i] = win.pb[i];
        p->o[i] = room / win.s[i] + 1;
        if ((p->K = mul_capped(p->K, p->k[i])) < 0 || (p->O = mul_capped(p->O, p->o[i])) < 0 || (p->P = mul_capped(p->P, in)) < 0)
            return onnx_node_error(c, FM_ERR_INVALID, "the kernel, output or input has more than 2^36 positions");
    }
    return FM_OK;
}

/* A tensor of shape [n, per, o...] (the output's spatial dims), or an error naming it. */
static fm_status dc_check_map(onnx_op_ctx *c, const dc_plan *p, const fm_tensor *t, const char *name, int64_t per) {
    bool ok = t->ndim == 2 + p->nsp && t->shape[0] == p->N && t->shape[1] == per;
    for (int i = 0; ok && i < p->nsp; i++) ok = t->shape[2 + i] == p->o[i];
    if (ok) return FM_OK;
    int64_t want[FM_MAX_DIMS] = {p->N, per};
    for (int i = 0; i < p->nsp; i++) want[2 + i] = p->o[i];
    char a[96], b[96];
    return onnx_node_error(c, FM_ERR_INVALID, "%s is %s; X, W, the offset groups and the geometry need %s", name,
                           fm_shape_str(t->ndim, t->shape, a, sizeof a), fm_shape_str(2 + p->nsp, want, b, sizeof b));
}

static fm_status dc_plan_of(onnx_op_ctx *c, dc_plan *p) {
    const fm_tensor *x = c->in[0], *w = c->in[1], *off = c->in[2];
    const fm_tensor *b = c->n_in > 3 ? c->in[3] : NULL, *mask = c->n_in > 4 ? c->in[4] : NULL;
    memset(p, 0, sizeof *p);
    const char *xt = onnx_dtype_name(onnx_dtype_from_fm(x->dtype));
    if (!fm_dtype_is_float(x->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "X must be floating-point; got %s", xt);
    if (w->dtype != x->dtype || off->dtype != x->dtype || (b && b->dtype != x->dtype) || (mask && mask->dtype != x->dtype))
        return onnx_node_error(c, FM_ERR_INVALID, "X, W, offset, B and mask must share one dtype (X is %s)", xt);
    if (dc_geometry(c, p)) return fm_last_status();
    p->N = x->shape[0], p->C = x->shape[1], p->oC = w->shape[0];
    p->G = onnx_attr_int(c, "group", 1), p->og = onnx_attr_int(c, "offset_group", 1);
    if (p->G < 1 || p->og < 1) return onnx_node_error(c, FM_ERR_INVALID, "group and offset_group must be positive");
    if (p->C % p->og) return onnx_node_error(c, FM_ERR_INVALID, "offset_group %" PRId64 " does not divide the %" PRId64 " channels", p->og, p->C);
    if (p->oC % p->G || p->C % p->G || w->shape[1] != p->C / p->G)
        return onnx_node_error(c, FM_ERR_INVALID, "group %" PRId64 " must divide X's %" PRId64 " channels and W's %" PRId64
                               " outputs, and W's dim 1 (%" PRId64 ") be the channels per group", p->G, p->C, p->oC, w->shape[1]);
    p->Cg = p->C / p->og;
    const int64_t ogk = mul_capped(p->og, p->K);
    if (ogk < 0 || mul_capped(ogk, p->nsp) < 0) return onnx_node_error(c, FM_ERR_INVALID, "offset_group times the kernel taps is too large");
    if (dc_check_map(c, p, off, "offset", ogk * p->nsp) || (mask && dc_check_map(c, p, mask, "mask", ogk))) return fm_last_status();
    if (b && (b->ndim != 1 || b->shape[0] != p->oC))
        return onnx_node_error(c, FM_ERR_INVALID, "B must be [%" PRId64 "] (one per output channel)", p->oC);
    const int64_t m = mul_capped(mul_capped(p->N, ogk), p->O), cols = mul_capped(m, p->Cg);
    const int64_t xin = mul_capped(mul_capped(p->N, p->C), p->P);
    if (m < 0 || cols < 0 || xin < 0 || mul_capped(mul_capped(p->N, p->oC), p->O) < 0)
        return onnx_node_error(c, FM_ERR_INVALID, "the sampled columns would have more than 2^36 elements");
    p->wt = x->dtype == FM_F64 ? FM_F64 : FM_F32;
    return FM_OK;
}

/* A malloc'd host buffer of dtype host_dt and shape sh as a tensor of dtype dt on dev; takes
 * buf (NULL: the malloc failed). */
static fm_tensor *host_buf_on(void *buf, int nd, const int64_t *sh, fm_dtype host_dt, fm_dtype dt, fm_device dev) {
    fm_tensor *h = buf ? fm_tensor_from_data(buf, nd, sh, host_dt) : NULL;
    if (!buf) fm_set_error(FM_ERR_OOM, "out of memory for a host buffer of %s", fm_dtype_name(host_dt));
    free(buf);
    return h ? onnx_host_back(h, dt, dev) : NULL;
}

/* The kernel taps' fixed positions along spatial dim i, [K, O]: o * stride - pad_begin +
 * k * dilation (the k-th tap of the flattened kernel, the o-th output position). */
static fm_tensor *dc_base(const dc_plan *p, int i, fm_device dev) {
    double *v = malloc((size_t)(p->K * p->O) * sizeof *v);
    for (int64_t k = 0; v && k < p->K; k++)
        for (int64_t o = 0; o < p->O; o++) {
            int64_t kr = k, orr = o, ki = 0, oi = 0;
            for (int j = p->nsp - 1; j >= i; j--) ki = kr % p->k[j], kr /= p->k[j], oi = orr % p->o[j], orr /= p->o[j];
            v[k * p->O + o] = (double)(oi * p->s[i] - p->pb[i] + ki * p->d[i]);
        }
    const int64_t sh[2] = {p->K, p->O};
    return host_buf_on(v, 2, sh, FM_F64, p->wt, dev);
}

/* Per spatial dim i and corner side b (0: the floor, 1: the next), over [N, og, K, O]: the
 * corner's flat-position contribution idx[i][b] (its coordinate times the dim's stride in
 * the plane) and its weight wgt[i][b] (the linear weight). A corner outside the input (an
 * infinite or NaN position too) weighs 0 and its contribution is the zero row's index
 * (N og P, past every plane: dc_sample clamps the sum to it), so that it reads 0 whatever
 * X holds, as ONNX Runtime skips it. The mask, when given, is folded into dim 0's weights. */
static fm_status dc_corners(onnx_op_ctx *c, const dc_plan *p, fm_tensor *off, fm_tensor *mask, fm_tensor *idx[3][2], fm_tensor *wgt[3][2]) {
    const fm_device dev = dev_of(c->in[0]);
    int64_t stride = 1;
    fm_tensor *zero = fm_tensor_zeros(0, NULL, p->wt, dev);
    fm_tensor *past = zero ? fm_tensor_full(0, NULL, (double)(p->N * p->og * p->P), FM_I64, dev) : NULL; /* the zero row */
    for (int i = p->nsp - 1; i >= 0; i--) {
        fm_tensor *di = fm_select(off, 3, i), *base = di ? dc_base(p, i, dev) : NULL, *pos = base ? fm_add(di, base) : NULL;
        fm_tensor *fl = pos ? fm_floor(pos) : NULL, *fr = fl ? fm_sub(pos, fl) : NULL;
        fm_tensor *nf = fr ? fm_mul_scalar(fr, -1.0) : NULL, *one_m = nf ? fm_add_scalar(nf, 1.0) : NULL;
        REL(di, base, pos, nf);
        for (int b = 0; b < 2 && one_m && past; b++) {
            fm_tensor *at = fm_add_scalar(fl, (double)b), *cl = at ? fm_clamp(at, 0.0, (double)(p->S[i] - 1)) : NULL;
            fm_tensor *in = cl ? fm_eq(cl, at) : NULL, *ci = in ? fm_to_dtype(cl, FM_I64) : NULL;
            fm_tensor *cs = ci ? fm_mul_scalar(ci, (double)stride) : NULL;
            idx[i][b] = cs ? fm_where(in, cs, past) : NULL;
            fm_tensor *lw = idx[i][b] ? fm_where(in, b ? fr : one_m, zero) : NULL;
            wgt[i][b] = lw && i == 0 && mask ? fm_mul(lw, mask) : lw ? fm_tensor_retain(lw) : NULL;
            REL(at, cl, in, ci, cs, lw);
            if (!wgt[i][b]) break;
        }
        const bool ok = wgt[i][1] != NULL;
        REL(fl, fr, one_m);
        if (!ok) {
            REL(zero, past);
            return fm_last_status();
        }
        stride *= p->S[i];
    }
    REL(zero, past);
    return FM_OK;
}

/* The sampled columns [N * og * K * O, Cg]: for each of the 2^nsp corners, the rows of xr
 * [N * og * P + 1, Cg] at the corner's positions (offset by each (n, g)'s plane start,
 * rowbase; the last row, zeros, for a corner outside) times the corner's weight, summed. */
static fm_tensor *dc_sample(const dc_plan *p, fm_tensor *xr, fm_tensor *rowbase, fm_tensor *idx[3][2], fm_tensor *wgt[3][2]) {
    const int64_t m = p->N * p->og * p->K * p->O, flat[1] = {m}, wsh[2] = {m, 1};
    fm_tensor *acc = NULL;
    for (int t = 0; t < 1 << p->nsp; t++) {
        fm_tensor *ix = fm_tensor_retain(rowbase), *w = NULL;
        for (int i = 0; i < p->nsp && ix; i++) {
            const int b = (t >> i) & 1;
            fm_tensor *nix = fm_add(ix, idx[i][b]), *nw = !nix ? NULL : w ? fm_mul(w, wgt[i][b]) : fm_tensor_retain(wgt[i][b]);
            REL(ix, w);
            ix = nw ? nix : NULL, w = nw;
            if (!nw) fm_tensor_release(nix);
        }
        fm_tensor *ixc = ix ? fm_clamp(ix, 0.0, (double)(p->N * p->og * p->P)) : NULL, *ixf = ixc ? fm_reshape(ixc, 1, flat) : NULL;
        fm_tensor *g = ixf ? fm_index_select(xr, 0, ixf) : NULL;
        fm_tensor *wc = g ? fm_reshape(w, 2, wsh) : NULL, *gw = wc ? fm_mul(g, wc) : NULL;
        fm_tensor *na = !gw ? NULL : acc ? fm_add(acc, gw) : fm_tensor_retain(gw);
        REL(ix, ixc, w, ixf, g, wc, gw, acc);
        if (!(acc = na)) return NULL;
    }
    return acc;
}

/* X as [N * og * P + 1, Cg] in the dtype computed in: each (n, offset group)'s plane of
 * positions, a row per position holding the group's channels, then a row of zeros. */
static fm_tensor *dc_rows(const dc_plan *p, fm_tensor *x) {
    const int64_t s4[4] = {p->N, p->og, p->Cg, p->P}, s2[2] = {p->N * p->og * p->P, p->Cg};
    int64_t pads[4] = {0, 0, 1, 0}; /* one row after */
    static const int perm[4] = {0, 1, 3, 2};
    fm_tensor *xw = fm_to_dtype(x, p->wt), *r = xw ? fm_reshape(xw, 4, s4) : NULL, *pt = r ? fm_permute(r, perm) : NULL;
    fm_tensor *r2 = pt ? fm_reshape(pt, 2, s2) : NULL, *y = r2 ? fm_pad(r2, pads, FM_PAD_CONSTANT, 0.0) : NULL;
    REL(xw, r, pt, r2);
    return y;
}

/* The im2col columns [N, G, (C / G) K, O] of the sampled [N * og * K * O, Cg] ones. */
static fm_tensor *dc_columns(const dc_plan *p, fm_tensor *smp) {
    const int64_t s5[5] = {p->N, p->og, p->K, p->O, p->Cg}, s4[4] = {p->N, p->G, p->C / p->G * p->K, p->O};
    static const int perm[5] = {0, 1, 4, 2, 3};
    fm_tensor *r = fm_reshape(smp, 5, s5), *pt = r ? fm_permute(r, perm) : NULL, *y = pt ? fm_reshape(pt, 4, s4) : NULL;
    REL(r, pt);
    return y;
}

/* Every (n, offset group)'s first row in the [N * og * P, Cg] layout, [N, og, 1, 1]. */
static fm_tensor *dc_rowbase(const dc_plan *p, fm_device dev) {
    int64_t *v = malloc((size_t)(p->N * p->og) * sizeof *v);
    for (int64_t i = 0; v && i < p->N * p->og; i++) v[i] = i * p->P;
    const int64_t sh[4] = {p->N, p->og, 1, 1};
    return host_buf_on(v, 4, sh, FM_I64, FM_I64, dev);
}

/* The columns of the sampled input, or NULL with the error set (p->N * og * K * O * Cg > 0). */
static fm_tensor *dc_cols_of(onnx_op_ctx *c, const dc_plan *p) {
    fm_tensor *x = c->in[0], *mask = c->n_in > 4 ? c->in[4] : NULL;
    const fm_device dev = dev_of(x);
    const int64_t osh[5] = {p->N, p->og, p->K, p->nsp, p->O}, msh[4] = {p->N, p->og, p->K, p->O};
    fm_tensor *idx[3][2] = {{NULL}}, *wgt[3][2] = {{NULL}};
    fm_tensor *ow = fm_to_dtype(c->in[2], p->wt), *off = ow ? fm_reshape(ow, 5, osh) : NULL;
    fm_tensor *mw = off && mask ? fm_to_dtype(mask, p->wt) : NULL, *mr = mw ? fm_reshape(mw, 4, msh) : NULL;
    fm_status st = !off || (mask && !mr) ? fm_last_status() : dc_corners(c, p, off, mr, idx, wgt);
    fm_tensor *xr = st ? NULL : dc_rows(p, x), *rb = xr ? dc_rowbase(p, dev) : NULL;
    fm_tensor *smp = rb ? dc_sample(p, xr, rb, idx, wgt) : NULL, *cols = smp ? dc_columns(p, smp) : NULL;
    REL(ow, off, mw, mr, xr, rb, smp);
    for (int i = 0; i < 3; i++) REL(idx[i][0], idx[i][1], wgt[i][0], wgt[i][1]);
    return cols;
}

static fm_status op_deform_conv(onnx_op_ctx *c) {
    dc_plan p;
    if (dc_plan_of(c, &p)) return fm_last_status();
    fm_tensor *x = c->in[0], *b = c->n_in > 3 ? c->in[3] : NULL;
    const fm_device dev = dev_of(x);
    int64_t ysh[FM_MAX_DIMS] = {p.N, p.oC}, bsh[FM_MAX_DIMS] = {1, p.oC};
    for (int i = 0; i < p.nsp; i++) ysh[2 + i] = p.o[i], bsh[2 + i] = 1;
    fm_tensor *y = NULL;
    if (p.N * p.og * p.K * p.O * p.Cg == 0 || p.P == 0) { /* nothing sampled (or only zeros): the bias alone */
        y = fm_tensor_zeros(2 + p.nsp, ysh, p.wt, dev);
    } else {
        const int64_t wsh[3] = {p.G, p.oC / p.G, p.C / p.G * p.K};
        fm_tensor *cols = dc_cols_of(c, &p), *ww = cols ? fm_to_dtype(c->in[1], p.wt) : NULL, *wr = ww ? fm_reshape(ww, 3, wsh) : NULL;
        fm_tensor *mm = wr ? fm_matmul(wr, cols) : NULL; /* [N, G, oC / G, O] */
        y = mm ? fm_reshape(mm, 2 + p.nsp, ysh) : NULL;
        REL(cols, ww, wr, mm);
    }
    if (y && b) {
        fm_tensor *bw = fm_to_dtype(b, p.wt), *br = bw ? fm_reshape(bw, 2 + p.nsp, bsh) : NULL, *yb = br ? fm_add(y, br) : NULL;
        REL(bw, br, y);
        y = yb;
    }
    fm_tensor *out = y ? fm_to_dtype(y, x->dtype) : NULL;
    fm_tensor_release(y);
    return onnx_set_out(c, 0, out);
}

/* ---- TensorScatter ---- */

/* The write start of each batch entry (write_indices, 0 when omitted), checked against the
 * cache length L for linear mode and reduced modulo L for circular; malloc'd. */
static int64_t *ts_starts(onnx_op_ctx *c, int64_t B, int64_t L, int64_t S, bool circular) {
    fm_tensor *wi = c->n_in > 2 ? c->in[2] : NULL, *h = NULL;
    if (wi && !(h = onnx_host(wi, FM_I64))) return NULL;
    int64_t *v = malloc((size_t)(B ? B : 1) * sizeof *v);
    if (!v) fm_set_error(FM_ERR_OOM, "TensorScatter: out of memory");
    for (int64_t i = 0; v && i < B; i++) {
        const int64_t w = h ? ((const int64_t *)fm_tensor_data(h))[i] : 0;
        if (circular) v[i] = L ? (w % L + L) % L : 0;
        else if (w < 0 || w > L - S) {
            onnx_node_error(c, FM_ERR_INVALID, "write_indices[%" PRId64 "] = %" PRId64 ": linear mode writes %" PRId64
                            " positions from it into a cache of %" PRId64 " (it must be in [0, %" PRId64 "])", i, w, S, L, L - S);
            free(v);
            v = NULL;
        } else v[i] = w;
    }
    fm_tensor_release(h);
    return v;
}

/* past, update, write_indices and axis checked: one dtype and rank, the same sizes off the
 * axis, update no longer than past along it, the axis not the batch dim, an int64 write
 * index per batch entry. */
static fm_status ts_check(onnx_op_ctx *c, int *axis) {
    const fm_tensor *past = c->in[0], *upd = c->in[1];
    const int r = past->ndim;
    const int64_t ax = onnx_attr_int(c, "axis", -2);
    if (r < 2) return onnx_node_error(c, FM_ERR_INVALID, "past_cache has rank %d; it needs a batch and a sequence dim", r);
    if (ax < -r || ax >= r || ax == 0 || ax == -r)
        return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " must name a dim of past_cache (rank %d) other than the batch dim 0", ax, r);
    *axis = (int)(ax < 0 ? ax + r : ax);
    if (upd->dtype != past->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "update is %s but past_cache %s", onnx_dtype_name(onnx_dtype_from_fm(upd->dtype)),
                               onnx_dtype_name(onnx_dtype_from_fm(past->dtype)));
    bool ok = upd->ndim == r;
    for (int d = 0; ok && d < r; d++) ok = d == *axis ? upd->shape[d] <= past->shape[d] : upd->shape[d] == past->shape[d];
    char a[96], b[96];
    if (!ok)
        return onnx_node_error(c, FM_ERR_INVALID, "update %s does not fit past_cache %s: the same sizes except along axis %d, "
                               "where it is no longer", fm_shape_str(upd->ndim, upd->shape, a, sizeof a),
                               fm_shape_str(r, past->shape, b, sizeof b), *axis);
    const fm_tensor *wi = c->n_in > 2 ? c->in[2] : NULL;
    if (wi && (wi->dtype != FM_I64 || wi->ndim != 1 || wi->shape[0] != past->shape[0]))
        return onnx_node_error(c, FM_ERR_INVALID, "write_indices must be int64 [%" PRId64 "] (one per batch entry); got %s %s", past->shape[0],
                               onnx_dtype_name(onnx_dtype_from_fm(wi->dtype)), fm_shape_str(wi->ndim, wi->shape, a, sizeof a));
    return FM_OK;
}

static fm_status op_tensor_scatter(onnx_op_ctx *c) {
    fm_tensor *past = c->in[0], *upd = c->in[1];
    int ax = 0;
    if (ts_check(c, &ax)) return fm_last_status();
    char mb[16];
    const char *mode = onnx_attr_string(c, "mode", "linear", mb, sizeof mb);
    if (strcmp(mode, "linear") && strcmp(mode, "circular"))
        return onnx_node_error(c, FM_ERR_INVALID, "mode '%s' is not linear or circular", mode);
    const bool circular = !strcmp(mode, "circular");
    const int r = past->ndim;
    const int64_t B = past->shape[0], L = past->shape[ax], S = upd->shape[ax];
    const fm_device dev = dev_of(past);
    if (fm_tensor_numel(upd) == 0) return onnx_set_out(c, 0, fm_tensor_retain(past)); /* nothing written */
    int64_t *starts = ts_starts(c, B, L, S, circular);
    if (!starts) return fm_last_status();
    int64_t bsh[FM_MAX_DIMS], ssh[FM_MAX_DIMS];
    for (int d = 0; d < r; d++) bsh[d] = d == 0 ? B : 1, ssh[d] = d == ax ? S : 1;
    fm_tensor *st = host_buf_on(starts, r, bsh, FM_I64, FM_I64, dev);
    fm_tensor *ar_h = st ? fm_tensor_arange(0, (double)S, 1, FM_I64) : NULL, *ar = ar_h ? fm_reshape(ar_h, r, ssh) : NULL;
    fm_tensor *ard = ar ? fm_tensor_to(ar, dev) : NULL, *pos = ard ? fm_add(st, ard) : NULL;
    fm_tensor *lt = pos && circular ? fm_tensor_full(0, NULL, (double)L, FM_I64, dev) : NULL;
    fm_tensor *wrap = lt ? fm_remainder(pos, lt) : pos ? fm_tensor_retain(pos) : NULL;
    fm_tensor *ix = wrap ? fm_expand(wrap, r, upd->shape) : NULL, *y = ix ? fm_scatter(past, ax, ix, upd, FM_SCATTER_NONE) : NULL;
    REL(st, ar_h, ar, ard, pos, lt, wrap, ix);
    return onnx_set_out(c, 0, y);
}

const onnx_op onnx_ops_more[] = {
    {"BitCast", 26, 1, 1, 1, "to", op_bitcast},
    {"DeformConv", 19, 3, 5, 1, "dilations,group,kernel_shape,offset_group,pads,strides", op_deform_conv},
    {"TensorScatter", 24, 2, 3, 1, "axis,mode", op_tensor_scatter},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
