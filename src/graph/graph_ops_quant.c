/* The graph's op table, part 4: the quantized ops that `fathom quantize`
 * writes (docs/QUANTIZE.md). The rules check what the front ends check, so a
 * hand-edited or corrupt graph.json is refused at load with the node named:
 * dtypes (i8 / u8 weights, f16 group scales), shapes (scales per row or per
 * group, K divisible by the group, int8 panels that fit their layout tag), and
 * attribute ranges (group in {32, 64, 128}, a finite activation scale >= 0, a
 * zero point in [0, 255], a known int8 layout). */
#include <math.h>
#include <string.h>

#include "fathom/ops.h"
#include "backend/kernel_attrs.h" /* fm_qconv_panel_k */
#include "graph/graph_internal.h"

static fm_status want(const gtype *t, const char *what, fm_dtype dt, int ndim, const int64_t *dims) {
    char s1[96], s2[96];
    if (t->ndim < 0) return fm_set_error(FM_ERR_INVALID, "%s is required", what);
    if (t->dt != dt) return fm_set_error(FM_ERR_INVALID, "%s must be %s, got %s", what, fm_dtype_name(dt), fm_dtype_name(t->dt));
    gtype w = {dt, ndim, {0}};
    memcpy(w.d, dims, sizeof(int64_t) * (size_t)ndim);
    if (t->ndim != ndim || memcmp(t->d, dims, sizeof(int64_t) * (size_t)ndim))
        return fm_set_error(FM_ERR_INVALID, "%s has shape %s, expected %s", what, g_tshape(t, s1, sizeof s1), g_tshape(&w, s2, sizeof s2));
    return FM_OK;
}

/* x f32 [..., K] -> out [..., N] */
static fm_status rows_out(const gtype *x, int64_t K, int64_t N, gtype *out) {
    char s1[96];
    if (x->dt != FM_F32) return fm_set_error(FM_ERR_INVALID, "input must be f32, got %s", fm_dtype_name(x->dt));
    if (x->ndim < 1 || x->d[x->ndim - 1] != K)
        return fm_set_error(FM_ERR_INVALID, "input %s must end in the weight's %lld input features", g_tshape(x, s1, sizeof s1), (long long)K);
    out[0] = *x;
    out[0].d[x->ndim - 1] = N;
    return FM_OK;
}

/* The int8 weight layouts: "rows" ([N, K], files from before the panels, the
 * default when the attribute is absent) and "vnni16x4" (panels + stored row sums). */
typedef struct { double scale; int64_t zero, relu, gelu_tanh, gelu; bool panels; } q8_spec;

/* the activation's quantization and the fused activation */
static fm_status q8_act_attrs(const gctx *c, q8_spec *q) {
    if (ga_float(c, "a_scale", 0.0, &q->scale) || ga_int(c, "a_zero", 0, &q->zero) || ga_int(c, "relu", 0, &q->relu)) return fm_last_status();
    if (!(q->scale >= 0) || !isfinite(q->scale)) return fm_set_error(FM_ERR_INVALID, "a_scale %g must be finite and >= 0 (0: dynamic)", q->scale);
    if (q->zero < 0 || q->zero > 255) return fm_set_error(FM_ERR_INVALID, "a_zero %lld must be in [0, 255]", (long long)q->zero);
    if (q->relu != 0 && q->relu != 1) return fm_set_error(FM_ERR_INVALID, "relu %lld must be 0 or 1", (long long)q->relu);
    /* gelu_tanh / gelu: a (bias_)gelu_tanh or a gelu fused into this node's epilogue (layout vnni16x4) */
    if (ga_int(c, "gelu_tanh", 0, &q->gelu_tanh) || ga_int(c, "gelu", 0, &q->gelu)) return fm_last_status();
    if (q->gelu_tanh != 0 && q->gelu_tanh != 1) return fm_set_error(FM_ERR_INVALID, "gelu_tanh %lld must be 0 or 1", (long long)q->gelu_tanh);
    if (q->gelu != 0 && q->gelu != 1) return fm_set_error(FM_ERR_INVALID, "gelu %lld must be 0 or 1", (long long)q->gelu);
    if (q->relu + q->gelu_tanh + q->gelu > 1)
        return fm_set_error(FM_ERR_INVALID, "more than one of relu, gelu_tanh and gelu is set: a node fuses one activation");
    return FM_OK;
}

static fm_status q8_attrs(const gctx *c, q8_spec *q) {
    if (q8_act_attrs(c, q)) return fm_last_status();
    const char *l = ga_string(c, "layout", "rows");
    if (!l || (strcmp(l, "rows") && strcmp(l, "vnni16x4")))
        return fm_set_error(FM_ERR_INVALID, "layout '%s' is not one this fathom knows (rows, vnni16x4): a file from a newer version? "
                            "re-run fathom quantize with this one", l ? l : "(not a string)");
    q->panels = !strcmp(l, "vnni16x4");
    if ((q->gelu || q->gelu_tanh) && !q->panels)
        return fm_set_error(FM_ERR_INVALID, "%s is fused on layout vnni16x4 only (this node's layout is rows)", q->gelu ? "gelu" : "gelu_tanh");
    return FM_OK;
}

/* in: x, w, w_scale, [bias], [w_sum]: rows w i8 [N, K] with no w_sum; panels w i8
 * [ceil(N/16), ceil(K/4), 16, 4] with w_sum i32 [N] */
static fm_status inf_qlinear8(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    q8_spec q;
    if (q8_attrs(c, &q)) return fm_last_status();
    if (in[2].ndim != 1) return fm_set_error(FM_ERR_INVALID, "weight scale must be a 1-D f32 tensor [out], got %s", g_tshape(&in[2], s1, sizeof s1));
    int64_t N = in[2].d[0], K = in[0].ndim >= 1 ? in[0].d[in[0].ndim - 1] : -1;
    if (!q.panels) {
        if (in[1].ndim != 2 || in[1].dt != FM_I8)
            return fm_set_error(FM_ERR_INVALID, "weight must be a 2-D i8 tensor [out, in] (layout rows), got %s %s", fm_dtype_name(in[1].dt),
                                g_tshape(&in[1], s1, sizeof s1));
        if (in[4].ndim >= 0) return fm_set_error(FM_ERR_INVALID, "row sums are an input of layout vnni16x4 only (this node's layout is rows)");
        K = in[1].d[1];
        if (want(&in[2], "weight scale", FM_F32, 1, &in[1].d[0])) return fm_last_status();
    } else {
        if (K < 0) return fm_set_error(FM_ERR_INVALID, "layout vnni16x4 needs the input's last dim (the input features) known");
        int64_t pd[4] = {(N + 15) / 16, (K + 3) / 4, 16, 4};
        if (K > 32768) return fm_set_error(FM_ERR_INVALID, "%lld input features exceed layout vnni16x4's 32768", (long long)K);
        if (want(&in[1], "weight (layout vnni16x4)", FM_I8, 4, pd) || want(&in[2], "weight scale", FM_F32, 1, &N) ||
            want(&in[4], "row sums (layout vnni16x4)", FM_I32, 1, &N))
            return fm_last_status();
    }
    if (in[3].ndim >= 0 && want(&in[3], "bias", FM_F32, 1, &N)) return fm_last_status();
    return rows_out(&in[0], K, N, out);
}

static fm_status run_qlinear8(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    q8_spec q;
    if (q8_attrs(c, &q)) return fm_last_status();
    if (q.panels) {
        out[0] = fm_qlinear_int8_packed(in[0], in[1], in[2], in[4], in[3], q.scale, (int)q.zero,
                                        q.gelu_tanh ? FM_QACT_GELU_TANH : q.gelu ? FM_QACT_GELU : q.relu ? FM_QACT_RELU : FM_QACT_NONE);
        return out[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *y = fm_qlinear_int8(in[0], in[1], in[2], in[3], q.scale, (int)q.zero);
    out[0] = y && q.relu ? fm_relu(y) : y;
    if (y && q.relu) fm_tensor_release(y);
    return out[0] ? FM_OK : fm_last_status();
}

/* qconv2d_int8: conv2d's stride, padding and dilation (groups 1, layout NCHW), kernel [kh, kw], the
 * activation attributes of qlinear_int8 but the GELUs (relu), max (a cap after the ReLU) and
 * pool (conv2d_fused's: k > 1 a k x k max pool at stride k after). The
 * weight is always panels (vnni16x4) over K = (ky, kx, c): "layout" is the activations' here. */
typedef struct qconv_spec {
    fm_conv2d_params p;
    int64_t k[2]; /* kh, kw */
    q8_spec q;
    double hi;
    int64_t pool;
} qconv_spec;

static fm_status qconv_attrs(const gctx *c, qconv_spec *s) {
    int n = 0;
    if (g_conv_params(c, &s->p) || q8_act_attrs(c, &s->q) || ga_ints(c, "kernel", s->k, &n, 2) || ga_float(c, "max", INFINITY, &s->hi) ||
        ga_int(c, "pool", 0, &s->pool))
        return fm_last_status();
    if (s->pool < 0 || s->pool > 64) return fm_set_error(FM_ERR_INVALID, "attribute 'pool' must be in [0, 64], got %lld", (long long)s->pool);
    if (n != 2 || s->k[0] < 1 || s->k[1] < 1 || s->k[0] > 64 || s->k[1] > 64)
        return fm_set_error(FM_ERR_INVALID, "attribute 'kernel' must be two numbers in [1, 64]");
    if (s->p.groups != 1 || s->p.layout != FM_NCHW) return fm_set_error(FM_ERR_INVALID, "groups 1 and layout NCHW only");
    if (isnan(s->hi)) return fm_set_error(FM_ERR_INVALID, "attribute 'max' is NaN");
    return FM_OK;
}

/* in: x f32 [N, C, H, W], panels [ceil(O/16), fm_qconv_panel_k(kh kw C) / 4, 16, 4], w_scale [O], [bias], w_sum [O] */
static fm_status inf_qconv8(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    qconv_spec sp;
    if (qconv_attrs(c, &sp)) return fm_last_status();
    const int64_t *k = sp.k, pool = sp.pool;
    if (in[0].dt != FM_F32 || in[0].ndim != 4 || in[0].d[1] < 1)
        return fm_set_error(FM_ERR_INVALID, "input must be f32 [N, C, H, W] with C known, got %s %s", fm_dtype_name(in[0].dt), g_tshape(&in[0], s1, sizeof s1));
    if (in[2].ndim != 1) return fm_set_error(FM_ERR_INVALID, "weight scale must be a 1-D f32 tensor [out], got %s", g_tshape(&in[2], s1, sizeof s1));
    const int64_t O = in[2].d[0], K = k[0] * k[1] * in[0].d[1];
    if (K > 32768) return fm_set_error(FM_ERR_INVALID, "kh kw C = %lld exceeds layout vnni16x4's 32768", (long long)K);
    int64_t pd[4] = {(O + 15) / 16, fm_qconv_panel_k(K) / 4, 16, 4};
    if (want(&in[1], "weight (layout vnni16x4)", FM_I8, 4, pd) || want(&in[2], "weight scale", FM_F32, 1, &O) ||
        want(&in[4], "row sums (layout vnni16x4)", FM_I32, 1, &O))
        return fm_last_status();
    const gtype conv_in[3] = {in[0], {FM_F32, 4, {O, in[0].d[1], k[0], k[1]}}, in[3]};
    if (g_inf_conv2d(c, conv_in, out)) return fm_last_status();
    for (int i = 2; pool > 1 && i < 4; i++) {
        if (out[0].d[i] >= 0 && out[0].d[i] < pool)
            return fm_set_error(FM_ERR_INVALID, "pool %lld is larger than the convolution's output %s", (long long)pool, g_tshape(&out[0], s1, sizeof s1));
        if (out[0].d[i] >= 0) out[0].d[i] /= pool;
    }
    return FM_OK;
}

static fm_status run_qconv8(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    qconv_spec s;
    if (qconv_attrs(c, &s)) return fm_last_status();
    out[0] = fm_qconv2d_int8(in[0], in[1], in[2], in[4], in[3], &s.p, (int)s.k[0], (int)s.k[1], s.q.scale, (int)s.q.zero, s.q.relu != 0, s.hi,
                             (int)s.pool);
    return out[0] ? FM_OK : fm_last_status();
}

/* packed [R, K/2] u8, scale (and min) [R, K/G] f16 */
static fm_status q4_tables(const gctx *c, const gtype *w, const gtype *sc, const gtype *mi, int64_t *G, int64_t *R, int64_t *K) {
    char s1[96];
    if (ga_int(c, "group", 0, G)) return fm_last_status();
    if (*G != 32 && *G != 64 && *G != 128) return fm_set_error(FM_ERR_INVALID, "group %lld must be 32, 64 or 128", (long long)*G);
    if (w->ndim != 2 || w->dt != FM_U8)
        return fm_set_error(FM_ERR_INVALID, "packed weight must be a 2-D u8 tensor [rows, in/2], got %s %s", fm_dtype_name(w->dt), g_tshape(w, s1, sizeof s1));
    *R = w->d[0];
    *K = 2 * w->d[1];
    if (*K % *G) return fm_set_error(FM_ERR_INVALID, "group %lld does not divide the %lld input features", (long long)*G, (long long)*K);
    int64_t sd[2] = {*R, *K / *G};
    if (want(sc, "scale", FM_F16, 2, sd) || (mi->ndim >= 0 && want(mi, "min", FM_F16, 2, sd))) return fm_last_status();
    return FM_OK;
}

static fm_status inf_qlinear4(const gctx *c, const gtype *in, gtype *out) {
    int64_t G = 0, N = 0, K = 0;
    if (q4_tables(c, &in[1], &in[2], &in[3], &G, &N, &K) || (in[4].ndim >= 0 && want(&in[4], "bias", FM_F32, 1, &N))) return fm_last_status();
    return rows_out(&in[0], K, N, out);
}

static fm_status run_qlinear4(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t G = 0;
    if (ga_int(c, "group", 0, &G)) return fm_last_status();
    out[0] = fm_qlinear_int4(in[0], in[1], in[2], in[3], in[4], (int)G);
    return out[0] ? FM_OK : fm_last_status();
}

/* A lookup's output: the indices' shape and D, f32. */
static fm_status lookup_out(const gtype *idx, int64_t D, gtype *out) {
    if (idx->dt != FM_I64 && idx->dt != FM_I32) return fm_set_error(FM_ERR_INVALID, "indices must be i64 or i32, got %s", fm_dtype_name(idx->dt));
    if (idx->ndim + 1 > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "indices have too many dims");
    out[0] = *idx;
    out[0].dt = FM_F32;
    out[0].d[out[0].ndim++] = D;
    return FM_OK;
}

/* graph inputs: packed, scale, indices, [min] (the optional one last) */
static fm_status inf_qembedding4(const gctx *c, const gtype *in, gtype *out) {
    int64_t G = 0, V = 0, D = 0;
    if (q4_tables(c, &in[0], &in[1], &in[3], &G, &V, &D)) return fm_last_status();
    return lookup_out(&in[2], D, out);
}

static fm_status run_qembedding4(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t G = 0;
    if (ga_int(c, "group", 0, &G)) return fm_last_status();
    out[0] = fm_qembedding_int4(in[0], in[1], in[3], in[2], (int)G);
    return out[0] ? FM_OK : fm_last_status();
}

/* graph inputs: panels, scale [V], indices; attribute dim (the table's width) */
static fm_status inf_qembedding8(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    int64_t D = 0;
    if (ga_int(c, "dim", 0, &D)) return fm_last_status();
    if (D < 1 || D > 32768) return fm_set_error(FM_ERR_INVALID, "dim %lld must be in [1, 32768]", (long long)D);
    if (in[1].ndim != 1 || in[1].dt != FM_F32) return fm_set_error(FM_ERR_INVALID, "scale must be a 1-D f32 tensor [rows], got %s", g_tshape(&in[1], s1, sizeof s1));
    int64_t pd[4] = {(in[1].d[0] + 15) / 16, (D + 3) / 4, 16, 4};
    if (want(&in[0], "panels (layout vnni16x4)", FM_I8, 4, pd)) return fm_last_status();
    return lookup_out(&in[2], D, out);
}

static fm_status run_qembedding8(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t D = 0;
    if (ga_int(c, "dim", 0, &D)) return fm_last_status();
    out[0] = fm_qembedding_int8(in[0], in[1], in[2], D);
    return out[0] ? FM_OK : fm_last_status();
}

const g_op_spec g_ops_quant[] = {
    {"qlinear_int8", 3, 5, 1, "a_scale,a_zero,relu,gelu_tanh,gelu,layout", inf_qlinear8, run_qlinear8, NULL},
    {"qlinear_int4", 3, 5, 1, "group", inf_qlinear4, run_qlinear4, NULL},
    {"qembedding_int4", 3, 4, 1, "group", inf_qembedding4, run_qembedding4, NULL},
    {"qembedding_int8", 3, 3, 1, "dim", inf_qembedding8, run_qembedding8, NULL},
    {"qconv2d_int8", 3, 5, 1, "stride,padding,dilation,groups,layout,kernel,a_scale,a_zero,relu,max,pool", inf_qconv8, run_qconv8, NULL},
};
const int g_n_ops_quant = (int)(sizeof g_ops_quant / sizeof g_ops_quant[0]);
