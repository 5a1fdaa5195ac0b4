/* Tests of the fused transformer helpers: qkv_split_heads against the unfused
 * narrow + transpose + contiguous route (f32, f64, a non-contiguous input, grouped
 * kv heads), its gradient by finite differences in f64 (with some outputs unused,
 * so NULL incoming gradients are covered), and bad input. bias_gelu_tanh and
 * add_layer_norm against add + gelu_tanh and add + layer_norm (values and, in f32,
 * every gradient), by finite differences in f64 on non-contiguous inputs, with
 * each output used alone (NULL incoming gradients), and bad input. */
#include "test_util.h"
#include "op_test.h"
#include "gradcheck.h"

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_set_num_threads */

/* q/k/v the slow way: narrow the fused last dim, split heads, move them before T */
static fm_tensor *fz_ref(fm_tensor *qkv, int64_t start, int64_t heads, int64_t D) {
    fm_tensor *n = fm_narrow(qkv, 2, start * D, heads * D);
    fm_tensor *r = n ? fm_reshape(n, 4, (int64_t[]){qkv->shape[0], qkv->shape[1], heads, D}) : NULL;
    fm_tensor *t = r ? fm_transpose(r, 1, 2) : NULL;
    fm_tensor *c = t ? fm_contiguous(t) : NULL;
    fm_tensor_release_n(3, n, r, t);
    return c;
}

static double fz_maxdiff(const fm_tensor *a, const fm_tensor *b) {
    if (!a || !b || fm_tensor_numel(a) != fm_tensor_numel(b)) return INFINITY;
    double w = 0;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) {
        double d = fabs(fm_tensor_get(a, i) - fm_tensor_get(b, i));
        if (!(d <= w)) w = d;
    }
    return w;
}

static int qkv_split_forward(void) {
    OP_BEGIN;
    const fm_dtype dts[2] = {FM_F32, FM_F64};
    for (int di = 0; di < 2; di++)
        for (int kvcase = 0; kvcase < 2; kvcase++) {
            const int64_t B = 2, T = 5, H = 4, KV = kvcase ? 2 : 4, D = 3, W = (H + 2 * KV) * D;
            fm_rng r;
            fm_rng_init(&r, 5 + (uint64_t)kvcase);
            /* non-contiguous input: [T, B, W] transposed to [B, T, W] */
            fm_tensor *base = fm_tensor_randn(3, (int64_t[]){T, B, W}, dts[di], &r);
            fm_tensor *x = fm_transpose(base, 0, 1);
            fm_tensor *q, *k, *v;
            CHECK(fm_qkv_split_heads(x, (int)H, (int)KV, &q, &k, &v) == FM_OK);
            fm_tensor *rq = fz_ref(x, 0, H, D), *rk = fz_ref(x, H, KV, D), *rv = fz_ref(x, H + KV, KV, D);
            CHECK(q && q->shape[1] == H && k->shape[1] == KV && v->shape[2] == T && v->shape[3] == D);
            CHECK(q->dtype == dts[di] && fm_tensor_is_contiguous(q) && fm_tensor_is_contiguous(k));
            CHECK(fz_maxdiff(q, rq) == 0 && fz_maxdiff(k, rk) == 0 && fz_maxdiff(v, rv) == 0);
            fm_tensor_release_n(8, base, x, q, k, v, rq, rk, rv);
        }
    /* bad input */
    fm_tensor *q, *k, *v;
    fm_tensor *x = fm_tensor_zeros(3, (int64_t[]){2, 3, 10}, FM_F32, FM_CPU);
    CHECK(fm_qkv_split_heads(x, 4, 2, &q, &k, &v) != FM_OK);
    CHECK_ERR_CONTAINS("last dim 10 of qkv [2, 3, 10] is not a positive multiple of n_head + 2*n_kv_head = 8");
    CHECK(fm_qkv_split_heads(x, 4, 3, &q, &k, &v) != FM_OK);
    CHECK_ERR_CONTAINS("n_kv_head 3 must be >= 1 and divide n_head 4");
    fm_tensor *x2 = fm_tensor_zeros(2, (int64_t[]){3, 12}, FM_F32, FM_CPU);
    CHECK(fm_qkv_split_heads(x2, 2, 1, &q, &k, &v) != FM_OK);
    CHECK_ERR_CONTAINS("qkv must be 3-D");
    CHECK(fm_qkv_split_heads(NULL, 2, 1, &q, &k, &v) != FM_OK);
    CHECK_ERR_CONTAINS("qkv is NULL");
    fm_tensor_release_n(2, x, x2);
    OP_END;
}

typedef struct { int use; } fz_ctx; /* bit mask of which of q, k, v feed the output */

/* in[0] is [T, B, W]; transposing it here hands the op a non-contiguous input */
static fm_tensor *fz_fn(fm_tensor **in, void *vctx) {
    const fz_ctx *c = vctx;
    fm_tensor *x = fm_transpose(in[0], 0, 1), *q = NULL, *k = NULL, *v = NULL;
    fm_status st = x ? fm_qkv_split_heads(x, 4, 2, &q, &k, &v) : FM_ERR_INVALID;
    fm_tensor_release(x);
    if (st) return NULL;
    fm_tensor *parts[3], *all[3] = {q, k, v};
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (c->use & (1 << i)) parts[n++] = fm_reshape(all[i], 1, (int64_t[]){-1});
    fm_tensor *y = fm_cat(n, parts, 0);
    for (int i = 0; i < n; i++) fm_tensor_release(parts[i]);
    fm_tensor_release_n(3, q, k, v);
    return y;
}

static int qkv_split_grad(void) {
    OP_BEGIN;
    const int uses[3] = {1, 6, 7}; /* q only; k and v only; all: unused outputs get NULL gradients */
    for (int u = 0; u < 3; u++) {
        fm_rng r;
        fm_rng_init(&r, 9);
        fm_tensor *x = fm_tensor_randn(3, (int64_t[]){3, 2, 16}, FM_F64, &r); /* T 3, B 2, H 4, KV 2, D 2 */
        fm_tensor_requires_grad_(x, true);
        fz_ctx c = {uses[u]};
        CHECK(gradcheck("qkv_split_heads", fz_fn, 1, (fm_tensor *[]){x}, &c, 1e-6, 1e-6));
        fm_tensor_release(x);
    }
    OP_END;
}

OP_TEST("qkv_split_heads", qkv_split_forward, qkv_split_grad)

/* ---- sdpa_qkv: attention straight on the fused projection ---- */

/* the composition it replaces: split, attend, merge the heads */
static fm_tensor *sq_ref(fm_tensor *qkv, int H, int KV, bool causal) {
    fm_tensor *q, *k, *v;
    if (fm_qkv_split_heads(qkv, H, KV, &q, &k, &v)) return NULL;
    fm_tensor *h = fm_scaled_dot_product_attention(q, k, v, causal, 0.0);
    fm_tensor *t = h ? fm_transpose(h, 1, 2) : NULL;
    fm_tensor *y = t ? fm_contiguous(t) : NULL;
    fm_tensor *r = y ? fm_reshape(y, 3, (int64_t[]){qkv->shape[0], qkv->shape[1], -1}) : NULL;
    fm_tensor_release_n(6, q, k, v, h, t, y);
    return r;
}

static int sdpa_qkv_forward(void) {
    OP_BEGIN;
    const fm_dtype dts[2] = {FM_F32, FM_F64};
    /* T 70 and 130 cross the 64-row tiles of the f32 kernel; B*KV < 16 and >= 16 take its two
     * backward modes */
    const struct { int64_t B, T, H, KV, D; } shapes[] = {{2, 5, 4, 4, 3}, {2, 70, 4, 2, 8}, {3, 130, 2, 1, 32}, {8, 33, 4, 2, 16}};
    for (int di = 0; di < 2; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int causal = 0; causal < 2; causal++) {
                const int64_t B = shapes[si].B, T = shapes[si].T, H = shapes[si].H, KV = shapes[si].KV, D = shapes[si].D;
                const int64_t W = (H + 2 * KV) * D;
                fm_rng r;
                fm_rng_init(&r, 40 + si);
                fm_tensor *x = fm_tensor_randn(3, (int64_t[]){B, T, W}, dts[di], &r);
                fm_tensor_requires_grad_(x, true);
                fm_tensor *xr = fm_detach(x);
                fm_tensor_requires_grad_(xr, true);
                fm_tensor *y = fm_sdpa_qkv(x, (int)H, (int)KV, causal, 0.0);
                fm_tensor *yr = sq_ref(xr, (int)H, (int)KV, causal);
                CHECK_MSG(y && y->ndim == 3 && y->shape[0] == B && y->shape[1] == T && y->shape[2] == H * D &&
                          y->dtype == dts[di], "shape %d", (int)si);
                /* the same arithmetic in the same order: bitwise equal values and gradients */
                CHECK_MSG(fz_maxdiff(y, yr) == 0, "values, shape %d causal %d dtype %d: %g", (int)si, causal, di,
                          fz_maxdiff(y, yr));
                fm_tensor *w = fm_tensor_randn(3, y->shape, dts[di], &r);
                fm_tensor *m1 = fm_mul(y, w), *m2 = fm_mul(yr, w);
                fm_tensor *l1 = fm_sum(m1, 0, NULL, false), *l2 = fm_sum(m2, 0, NULL, false);
                CHECK(l1 && l2 && fm_backward(l1, NULL, false) == FM_OK && fm_backward(l2, NULL, false) == FM_OK);
                CHECK_MSG(fz_maxdiff(x->grad, xr->grad) == 0, "gradients, shape %d causal %d: %g", (int)si, causal,
                          fz_maxdiff(x->grad, xr->grad));
                fm_tensor_release_n(9, x, xr, y, yr, w, m1, m2, l1, l2);
            }
    /* f16 and a non-contiguous input take the composed route / a copy; values still match */
    {
        fm_rng r;
        fm_rng_init(&r, 3);
        fm_tensor *base = fm_tensor_randn(3, (int64_t[]){6, 2, 24}, FM_F32, &r); /* [T, B, W], H 2, KV 1, D 6 */
        fm_tensor *x = fm_transpose(base, 0, 1);
        fm_tensor *y = fm_sdpa_qkv(x, 2, 1, true, 0.0), *yr = sq_ref(x, 2, 1, true);
        CHECK(fz_maxdiff(y, yr) == 0);
        fm_tensor *h = fm_to_dtype(x, FM_F16);
        fm_tensor *yh = h ? fm_sdpa_qkv(h, 2, 1, true, 0.0) : NULL;
        CHECK(yh && yh->dtype == FM_F16 && fz_maxdiff(yh, yr) < 5e-3);
        fm_tensor_release_n(6, base, x, y, yr, h, yh);
    }
    /* bad input */
    fm_tensor *x = fm_tensor_zeros(3, (int64_t[]){2, 3, 10}, FM_F32, FM_CPU);
    CHECK(fm_sdpa_qkv(x, 4, 2, true, 0.0) == NULL);
    CHECK_ERR_CONTAINS("sdpa_qkv: last dim 10 of qkv [2, 3, 10] is not a positive multiple of n_head + 2*n_kv_head = 8");
    CHECK(fm_sdpa_qkv(x, 4, 3, true, 0.0) == NULL);
    CHECK_ERR_CONTAINS("n_kv_head 3 must be >= 1 and divide n_head 4");
    fm_tensor *xi = fm_tensor_zeros(3, (int64_t[]){2, 3, 12}, FM_I32, FM_CPU);
    CHECK(fm_sdpa_qkv(xi, 2, 1, true, 0.0) == NULL);
    CHECK_ERR_CONTAINS("needs a floating-point qkv");
    fm_tensor *x0 = fm_tensor_zeros(3, (int64_t[]){2, 0, 12}, FM_F32, FM_CPU);
    CHECK(fm_sdpa_qkv(x0, 2, 1, true, 0.0) == NULL);
    CHECK_ERR_CONTAINS("sequence length must be positive");
    CHECK(fm_sdpa_qkv(NULL, 2, 1, true, 0.0) == NULL);
    CHECK_ERR_CONTAINS("qkv is NULL");
    fm_tensor_release_n(3, x, xi, x0);
    OP_END;
}

typedef struct { int causal; } sq_ctx;

/* in[0] is [T, B, W]: the op sees a non-contiguous input */
static fm_tensor *sq_fn(fm_tensor **in, void *vctx) {
    const sq_ctx *c = vctx;
    fm_tensor *x = fm_transpose(in[0], 0, 1);
    fm_tensor *y = x ? fm_sdpa_qkv(x, 4, 2, c->causal, 0.0) : NULL;
    fm_tensor_release(x);
    return y;
}

static int sdpa_qkv_grad(void) {
    OP_BEGIN;
    for (int causal = 0; causal < 2; causal++) {
        fm_rng r;
        fm_rng_init(&r, 11);
        fm_tensor *x = fm_tensor_randn(3, (int64_t[]){5, 2, 24}, FM_F64, &r); /* T 5, B 2, H 4, KV 2, D 3 */
        fm_tensor_requires_grad_(x, true);
        sq_ctx c = {causal};
        CHECK_MSG(gradcheck("sdpa_qkv", sq_fn, 1, (fm_tensor *[]){x}, &c, 1e-6, 1e-6), "causal %d", causal);
        fm_tensor_release(x);
    }
    OP_END;
}

OP_TEST("sdpa_qkv", sdpa_qkv_forward, sdpa_qkv_grad)

/* ---------------- bias + GELU (tanh) ---------------- */

/* gelu_tanh(x + b) the unfused way */
static fm_tensor *bg_ref(fm_tensor *x, fm_tensor *b) {
    fm_tensor *s = fm_add(x, b), *y = s ? fm_gelu_tanh(s) : NULL;
    fm_tensor_release(s);
    return y;
}

static int bias_gelu_forward(void) {
    OP_BEGIN;
    const fm_dtype dts[2] = {FM_F32, FM_F64};
    /* N 37: the vector loop and its masked tail; N 8: no tail; M 70 over 3 gradient chunks */
    const int64_t Ns[2] = {37, 8};
    for (int di = 0; di < 2; di++)
        for (int ni = 0; ni < 2; ni++) {
            const int64_t N = Ns[ni];
            fm_tensor *base = op_randn(3, (int64_t[]){N, 7, 10}, dts[di], 21 + (uint64_t)ni);
            fm_tensor *xs = fm_mul_scalar(base, 3.0); /* reach the tails of the curve */
            fm_tensor *x = fm_permute(xs, (int[]){1, 2, 0}); /* [7, 10, N], non-contiguous */
            fm_tensor *b = op_randn(1, (int64_t[]){N}, dts[di], 22);
            fm_tensor *y = fm_bias_gelu_tanh(x, b), *r = bg_ref(x, b);
            CHECK(y && y->ndim == 3 && y->shape[2] == N && y->dtype == dts[di]);
            double *rh = r ? op_host(r) : NULL;
            double e = y && rh ? op_max_rel_err(y, rh) : INFINITY;
            CHECK_MSG(e < (dts[di] == FM_F32 ? 2e-6 : 1e-14), "bias_gelu_tanh %s N %lld: rel err %g",
                      fm_dtype_name(dts[di]), (long long)N, e);
            free(rh);
            fm_tensor_release_n(6, base, xs, x, b, y, r);
        }
    /* far tails: exact 0 on the left (no NaN from e^{-2u} = inf), identity on the right */
    fm_tensor *x = fm_tensor_from_data((float[]){-200, -30, 30, 200, -200, -30, 30, 200, 0}, 1, (int64_t[]){9}, FM_F32);
    fm_tensor *b = fm_tensor_zeros(1, (int64_t[]){9}, FM_F32, FM_CPU);
    fm_tensor *y = fm_bias_gelu_tanh(x, b);
    CHECK(y && fm_tensor_get(y, 0) == 0 && fabs(fm_tensor_get(y, 1)) < 1e-30 && fm_tensor_get(y, 2) == 30 &&
          fm_tensor_get(y, 3) == 200 && fm_tensor_get(y, 4) == 0 && fm_tensor_get(y, 8) == 0);
    fm_tensor_release_n(3, x, b, y);
    /* bad input */
    fm_tensor *x2 = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_F32, FM_CPU);
    fm_tensor *b5 = fm_tensor_zeros(1, (int64_t[]){5}, FM_F32, FM_CPU);
    fm_tensor *b4d = fm_tensor_zeros(1, (int64_t[]){4}, FM_F64, FM_CPU);
    fm_tensor *xi = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_I32, FM_CPU);
    fm_tensor *b4 = fm_tensor_zeros(1, (int64_t[]){4}, FM_F32, FM_CPU);
    CHECK(fm_bias_gelu_tanh(x2, b5) == NULL);
    CHECK_ERR_CONTAINS("bias [5] does not match the last dim of input [3, 4] (expected [4])");
    CHECK(fm_bias_gelu_tanh(x2, b4d) == NULL);
    CHECK_ERR_CONTAINS("bias dtype f64 does not match input dtype f32");
    CHECK(fm_bias_gelu_tanh(xi, b4) == NULL);
    CHECK_ERR_CONTAINS("needs a floating-point input");
    CHECK(fm_bias_gelu_tanh(x2, NULL) == NULL);
    CHECK_ERR_CONTAINS("bias is NULL");
    fm_tensor_release_n(5, x2, b5, b4d, xi, b4);
    OP_END;
}

/* in[0] is [N, M] and is transposed here, so the op sees a non-contiguous input */
static fm_tensor *bg_fn(fm_tensor **in, void *ctx) {
    (void)ctx;
    fm_tensor *x = fm_transpose(in[0], 0, 1), *y = x ? fm_bias_gelu_tanh(x, in[1]) : NULL;
    fm_tensor_release(x);
    return y;
}

/* loss = sum(f(x, b) * w) in f32 both ways: the fused gradients match autograd's of the composition */
static void bg_grad_vs_unfused(void) {
    const int64_t M = 70, N = 37;
    fm_tensor *x = op_randn(2, (int64_t[]){M, N}, FM_F32, 31), *b = op_randn(1, (int64_t[]){N}, FM_F32, 32);
    fm_tensor *w = op_randn(2, (int64_t[]){M, N}, FM_F32, 33);
    fm_tensor *g[2][2] = {{NULL}};
    for (int fused = 0; fused < 2; fused++) {
        fm_tensor_requires_grad_(x, true);
        fm_tensor_requires_grad_(b, true);
        fm_tensor *y = fused ? fm_bias_gelu_tanh(x, b) : bg_ref(x, b), *yw = y ? fm_mul(y, w) : NULL;
        fm_tensor *L = yw ? fm_sum(yw, 0, NULL, false) : NULL;
        CHECK(L && fm_backward(L, NULL, false) == FM_OK);
        g[fused][0] = fm_tensor_retain(x->grad);
        g[fused][1] = fm_tensor_retain(b->grad);
        fm_tensor_zero_grad(x);
        fm_tensor_zero_grad(b);
        fm_tensor_release_n(3, y, yw, L);
    }
    for (int k = 0; k < 2; k++) {
        double *rh = g[0][k] ? op_host(g[0][k]) : NULL;
        double e = rh && g[1][k] ? op_max_rel_err(g[1][k], rh) : INFINITY;
        CHECK_MSG(e < 1e-5, "bias_gelu_tanh f32 gradient %d vs unfused: rel err %g", k, e);
        free(rh);
    }
    fm_tensor_release_n(7, x, b, w, g[0][0], g[0][1], g[1][0], g[1][1]);
}

static int bias_gelu_grad(void) {
    OP_BEGIN;
    fm_tensor *x = op_randn(2, (int64_t[]){11, 6}, FM_F64, 41); /* x^T: [6, 11] */
    fm_tensor *xs = fm_mul_scalar(x, 2.0), *b = op_randn(1, (int64_t[]){11}, FM_F64, 42);
    fm_tensor_requires_grad_(xs, true);
    fm_tensor_requires_grad_(b, true);
    CHECK(gradcheck("bias_gelu_tanh", bg_fn, 2, (fm_tensor *[]){xs, b}, NULL, 1e-6, 1e-6));
    /* only the bias wants a gradient */
    fm_tensor_requires_grad_(xs, false);
    fm_tensor_zero_grad(b);
    CHECK(gradcheck("bias_gelu_tanh (bias only)", bg_fn, 2, (fm_tensor *[]){xs, b}, NULL, 1e-6, 1e-6));
    fm_tensor_release_n(3, x, xs, b);
    bg_grad_vs_unfused();
    OP_END;
}

OP_TEST("bias_gelu_tanh", bias_gelu_forward, bias_gelu_grad)

/* ---------------- elementwise chain ---------------- */

/* One step on double v (x: the chain input), as the reference. */
static double ew_ref(const fm_ew_step *s, double v, double x) {
    switch (s->op) {
    case FM_EW_ADD: return v + s->a;
    case FM_EW_MUL: return v * s->a;
    case FM_EW_SUB: return v - s->a;
    case FM_EW_RSUB: return s->a - v;
    case FM_EW_DIV: return v / s->a;
    case FM_EW_RDIV: return s->a / v;
    case FM_EW_CLAMP: return v < s->a ? s->a : v > s->b ? s->b : v;
    case FM_EW_RELU: return v < 0 ? 0 : v;
    case FM_EW_SIGMOID: return 1.0 / (1.0 + exp(-v));
    case FM_EW_TANH: return tanh(v);
    case FM_EW_MUL_X: return v * x;
    case FM_EW_ADD_X: return v + x;
    case FM_EW_ROUND: return nearbyint(v);
    default: return NAN;
    }
}

/* ew_chain against a double reference, every step kind, sizes across the kernel's
 * 512-element blocks (and a tail), a NaN carried through; HardSwish's chain also
 * against the four ops it replaces; bad steps refused. */
static int ew_chain_forward(void) {
    OP_BEGIN;
    const fm_ew_step chains[][6] = {
        {{FM_EW_MUL, 1.0f / 6, 0}, {FM_EW_ADD, 0.5f, 0}, {FM_EW_CLAMP, 0, 1}, {FM_EW_MUL_X, 0, 0}}, /* HardSwish */
        {{FM_EW_SUB, 0.25f, 0}, {FM_EW_RSUB, 2, 0}, {FM_EW_DIV, 3, 0}, {FM_EW_RDIV, 1.5f, 0}, {FM_EW_TANH, 0, 0}},
        {{FM_EW_SIGMOID, 0, 0}, {FM_EW_ADD_X, 0, 0}, {FM_EW_RELU, 0, 0}},
        /* a QuantizeLinear-DequantizeLinear pair (a power-of-two scale: exact in float and double) */
        {{FM_EW_DIV, 0.0625f, 0}, {FM_EW_ROUND, 0, 0}, {FM_EW_ADD, 3, 0}, {FM_EW_CLAMP, -128, 127}, {FM_EW_SUB, 3, 0}, {FM_EW_MUL, 0.0625f, 0}},
    };
    const int lens[4] = {4, 5, 3, 6};
    const int64_t sizes[3] = {7, 1037, 2 * 512};
    for (int c = 0; c < 4; c++)
        for (int z = 0; z < 3; z++) {
            fm_tensor *x = op_randn(1, (int64_t[]){sizes[z]}, FM_F32, 60 + (uint64_t)z);
            fm_tensor_set(x, sizes[z] / 2, NAN);
            fm_tensor *y = fm_ew_chain(x, lens[c], chains[c]);
            CHECK_MSG(y && y->dtype == FM_F32 && fm_tensor_numel(y) == sizes[z], "ew_chain %d: %s", c, fm_last_error());
            for (int64_t i = 0; y && i < sizes[z]; i++) {
                const double xi = fm_tensor_get(x, i);
                double v = (float)xi;
                for (int k = 0; k < lens[c]; k++) v = ew_ref(&chains[c][k], v, xi);
                const double got = fm_tensor_get(y, i);
                if (isnan(v) ? !isnan(got) : !(fabs(got - v) <= 2e-6 * (1 + fabs(v)))) {
                    CHECK_MSG(0, "ew_chain %d, size %lld, at %lld: %g vs %g", c, (long long)sizes[z], (long long)i, got, v);
                    break;
                }
            }
            fm_tensor_release_n(2, x, y);
        }
    /* HardSwish as the four ops */
    fm_tensor *x = op_randn(2, (int64_t[]){33, 65}, FM_F32, 70), *xs = fm_mul_scalar(x, 4.0);
    fm_tensor *a = fm_mul_scalar(xs, 1.0f / 6), *b = a ? fm_add_scalar(a, 0.5) : NULL, *cl = b ? fm_clamp(b, 0, 1) : NULL;
    fm_tensor *hs = cl ? fm_mul(cl, xs) : NULL, *y = fm_ew_chain(xs, lens[0], chains[0]);
    CHECK(hs && y && y->ndim == 2 && y->shape[0] == 33 && y->shape[1] == 65);
    for (int64_t i = 0; hs && y && i < 33 * 65; i++) CHECK_NEAR(fm_tensor_get(y, i), fm_tensor_get(hs, i), 1e-6);
    fm_tensor_release_n(6, x, a, b, cl, hs, y);
    /* bad input */
    fm_ew_step bad[9] = {{FM_EW_RELU, 0, 0}};
    CHECK(!fm_ew_chain(xs, 0, bad));
    CHECK_ERR_CONTAINS("0 steps (1 to 8)");
    CHECK(!fm_ew_chain(xs, 9, bad));
    bad[0] = (fm_ew_step){FM_EW_CLAMP, 1, 0};
    CHECK(!fm_ew_chain(xs, 1, bad));
    CHECK_ERR_CONTAINS("a clamp needs min <= max");
    bad[0] = (fm_ew_step){(fm_ew_step_op)99, 0, 0};
    CHECK(!fm_ew_chain(xs, 1, bad));
    CHECK_ERR_CONTAINS("step 0 is not an elementwise step");
    fm_tensor *x64 = op_randn(1, (int64_t[]){4}, FM_F64, 71);
    CHECK(!fm_ew_chain(x64, 1, chains[2]));
    CHECK_ERR_CONTAINS("needs f32");
    CHECK(!fm_ew_chain(NULL, 1, chains[2]));
    fm_tensor_release_n(2, xs, x64);
    OP_END;
}

OP_TEST("ew_chain", ew_chain_forward, NULL)

/* ---------------- lstm_cell ---------------- */

/* lstm_cell against a double reference (f32, f64) at hidden sizes that leave tails for the
 * 8- and 16-lane rows, gates large enough to saturate; against the composition of fathom's
 * own ops; bad shapes and dtypes refused. */
static int lstm_cell_forward(void) {
    OP_BEGIN;
    const fm_dtype dts[2] = {FM_F32, FM_F64};
    const int64_t Hs[4] = {1, 19, 32, 37};
    for (int di = 0; di < 2; di++)
        for (int hi = 0; hi < 4; hi++) {
            const int64_t B = 5, H = Hs[hi];
            fm_tensor *x0 = op_randn(2, (int64_t[]){B, 4 * H}, dts[di], 80 + (uint64_t)hi), *xg = fm_mul_scalar(x0, 4.0);
            fm_tensor *hg = op_randn(2, (int64_t[]){B, 4 * H}, dts[di], 81), *c = op_randn(2, (int64_t[]){B, H}, dts[di], 82), *cn = NULL;
            fm_tensor *h = fm_lstm_cell(xg, hg, c, &cn);
            CHECK_MSG(h && cn && h->dtype == dts[di] && h->shape[0] == B && h->shape[1] == H, "lstm_cell: %s", fm_last_error());
            const double tol = dts[di] == FM_F32 ? 2e-6 : 1e-13;
            for (int64_t b = 0; h && cn && b < B; b++)
                for (int64_t k = 0; k < H; k++) {
                    double g[4];
                    for (int q = 0; q < 4; q++) g[q] = fm_tensor_get(xg, b * 4 * H + q * H + k) + fm_tensor_get(hg, b * 4 * H + q * H + k);
                    const double sg = 1 / (1 + exp(-g[0])), so = 1 / (1 + exp(-g[1])), sf = 1 / (1 + exp(-g[2]));
                    const double cv = sf * fm_tensor_get(c, b * H + k) + sg * tanh(g[3]), hv = so * tanh(cv);
                    CHECK_NEAR(fm_tensor_get(cn, b * H + k), cv, tol * (1 + fabs(cv)));
                    CHECK_NEAR(fm_tensor_get(h, b * H + k), hv, tol * (1 + fabs(hv)));
                }
            /* the composition of fathom's ops */
            fm_tensor *gs = fm_add(xg, hg), *gi = fm_narrow(gs, 1, 0, H), *go = fm_narrow(gs, 1, H, H), *gf = fm_narrow(gs, 1, 2 * H, H);
            fm_tensor *gg = fm_narrow(gs, 1, 3 * H, H), *si = fm_sigmoid(gi), *so = fm_sigmoid(go), *sf = fm_sigmoid(gf), *tg = fm_tanh(gg);
            fm_tensor *fc = fm_mul(sf, c), *ig = fm_mul(si, tg), *rc = fm_add(fc, ig), *tc = fm_tanh(rc), *rh = fm_mul(so, tc);
            for (int64_t e = 0; h && rh && e < B * H; e++) {
                CHECK_NEAR(fm_tensor_get(h, e), fm_tensor_get(rh, e), 4 * tol);
                CHECK_NEAR(fm_tensor_get(cn, e), fm_tensor_get(rc, e), 4 * tol * (1 + fabs(fm_tensor_get(rc, e))));
            }
            fm_tensor_release_n(20, x0, xg, hg, c, cn, h, gs, gi, go, gf, gg, si, so, sf, tg, fc, ig, rc, tc, rh);
        }
    fm_tensor *xg = op_randn(2, (int64_t[]){2, 12}, FM_F32, 90), *c = op_randn(2, (int64_t[]){2, 3}, FM_F32, 91), *cn = NULL;
    fm_tensor *bad = op_randn(2, (int64_t[]){2, 11}, FM_F32, 92), *c64 = op_randn(2, (int64_t[]){2, 3}, FM_F64, 93);
    fm_tensor *ci = fm_tensor_zeros(2, (int64_t[]){2, 3}, FM_I32, FM_CPU);
    CHECK(!fm_lstm_cell(xg, bad, c, &cn) && !cn);
    CHECK_ERR_CONTAINS("it must be [B, 4H] = [2, 12]");
    CHECK(!fm_lstm_cell(xg, xg, c64, &cn));
    CHECK_ERR_CONTAINS("of its dtype");
    CHECK(!fm_lstm_cell(xg, xg, ci, &cn));
    CHECK_ERR_CONTAINS("needs f32 or f64");
    CHECK(!fm_lstm_cell(xg, xg, c, NULL));
    fm_tensor_release_n(5, xg, c, bad, c64, ci);
    OP_END;
}

OP_TEST("lstm_cell", lstm_cell_forward, NULL)

/* gru_cell against a double reference (f32, f64) at hidden sizes with 8- and 16-lane tails, and
 * against the composition of fathom's ops; bad shapes refused. */
static int gru_cell_forward(void) {
    OP_BEGIN;
    const fm_dtype dts[2] = {FM_F32, FM_F64};
    const int64_t Hs[4] = {1, 19, 32, 37};
    for (int di = 0; di < 2; di++)
        for (int hi = 0; hi < 4; hi++) {
            const int64_t B = 4, H = Hs[hi];
            fm_tensor *x0 = op_randn(2, (int64_t[]){B, 3 * H}, dts[di], 84 + (uint64_t)hi), *xg = fm_mul_scalar(x0, 4.0);
            fm_tensor *hg = op_randn(2, (int64_t[]){B, 3 * H}, dts[di], 85), *h = op_randn(2, (int64_t[]){B, H}, dts[di], 86);
            fm_tensor *y = fm_gru_cell(xg, hg, h);
            CHECK_MSG(y && y->dtype == dts[di] && y->shape[0] == B && y->shape[1] == H, "gru_cell: %s", fm_last_error());
            const double tol = dts[di] == FM_F32 ? 2e-6 : 1e-13;
            for (int64_t b = 0; y && b < B; b++)
                for (int64_t k = 0; k < H; k++) {
                    const int64_t g = b * 3 * H + k;
                    const double z = 1 / (1 + exp(-(fm_tensor_get(xg, g) + fm_tensor_get(hg, g))));
                    const double r = 1 / (1 + exp(-(fm_tensor_get(xg, g + H) + fm_tensor_get(hg, g + H))));
                    const double n = tanh(fm_tensor_get(xg, g + 2 * H) + r * fm_tensor_get(hg, g + 2 * H));
                    const double want = (1 - z) * n + z * fm_tensor_get(h, b * H + k);
                    CHECK_NEAR(fm_tensor_get(y, b * H + k), want, tol * (1 + fabs(want)));
                }
            /* the composition: z, r = sigmoid(x + h) of the first 2H, n = tanh(xn + r hn), n + z (h - n) */
            fm_tensor *xs = fm_narrow(xg, 1, 0, 2 * H), *hs = fm_narrow(hg, 1, 0, 2 * H), *zr0 = fm_add(xs, hs), *zr = fm_sigmoid(zr0);
            fm_tensor *z = fm_narrow(zr, 1, 0, H), *r = fm_narrow(zr, 1, H, H), *hn = fm_narrow(hg, 1, 2 * H, H), *xn = fm_narrow(xg, 1, 2 * H, H);
            fm_tensor *rh = fm_mul(r, hn), *pre = fm_add(xn, rh), *n = fm_tanh(pre), *df = fm_sub(h, n), *zd = fm_mul(z, df), *ref = fm_add(n, zd);
            for (int64_t e = 0; y && ref && e < B * H; e++) CHECK_NEAR(fm_tensor_get(y, e), fm_tensor_get(ref, e), 4 * tol);
            fm_tensor_release_n(19, x0, xg, hg, h, y, xs, hs, zr0, zr, z, r, hn, xn, rh, pre, n, df, zd, ref);
        }
    fm_tensor *xg = op_randn(2, (int64_t[]){2, 9}, FM_F32, 94), *h = op_randn(2, (int64_t[]){2, 3}, FM_F32, 95);
    fm_tensor *bad = op_randn(2, (int64_t[]){2, 12}, FM_F32, 96);
    CHECK(!fm_gru_cell(xg, bad, h));
    CHECK_ERR_CONTAINS("it must be [B, 3H] = [2, 9]");
    CHECK(!fm_gru_cell(xg, xg, NULL));
    fm_tensor_release_n(3, xg, h, bad);
    OP_END;
}

OP_TEST("gru_cell", gru_cell_forward, NULL)

/* ---------------- residual add + layer norm ---------------- */

static int add_ln_forward(void) {
    OP_BEGIN;
    const fm_dtype dts[2] = {FM_F32, FM_F64};
    const int64_t Ns[3] = {37, 64, 5};
    for (int di = 0; di < 2; di++)
        for (int ni = 0; ni < 3; ni++)
            for (int affine = 0; affine < 3; affine++) { /* weight and bias, neither, weight only */
                const int64_t N = Ns[ni];
                fm_tensor *xb = op_randn(3, (int64_t[]){N, 5, 14}, dts[di], 51 + (uint64_t)ni);
                fm_tensor *x = fm_permute(xb, (int[]){1, 2, 0}); /* [5, 14, N], non-contiguous */
                fm_tensor *h0 = op_randn(3, (int64_t[]){5, 14, N}, dts[di], 52), *h = fm_add_scalar(h0, 4.0);
                fm_tensor *w = affine != 1 ? op_randn(1, (int64_t[]){N}, dts[di], 53) : NULL;
                fm_tensor *b = affine == 0 ? op_randn(1, (int64_t[]){N}, dts[di], 54) : NULL;
                fm_tensor *s = NULL, *y = NULL;
                CHECK(fm_add_layer_norm(x, h, w, b, 1e-5, &s, &y) == FM_OK);
                fm_tensor *rs = fm_add(x, h), *ry = rs ? fm_layer_norm(rs, 1, w, b, 1e-5) : NULL;
                CHECK(s && y && fm_tensor_is_contiguous(s) && s->dtype == dts[di] && y->shape[2] == N);
                CHECK_MSG(op_bitwise_equal(s, rs), "add_layer_norm %s: the sum is not x + h", fm_dtype_name(dts[di]));
                double *rh = ry ? op_host(ry) : NULL;
                double e = y && rh ? op_max_rel_err(y, rh) : INFINITY;
                CHECK_MSG(e < (dts[di] == FM_F32 ? 2e-6 : 1e-13), "add_layer_norm %s N %lld affine %d: rel err %g",
                          fm_dtype_name(dts[di]), (long long)N, affine, e);
                free(rh);
                /* h NULL: the norm of x alone, bitwise the fused result for a sum equal to x */
                fm_tensor *s2 = NULL, *y2 = NULL;
                CHECK(s && fm_add_layer_norm(s, NULL, w, b, 1e-5, &s2, &y2) == FM_OK);
                CHECK(s2 == s);
                CHECK_MSG(op_bitwise_equal(y2, y), "add_layer_norm %s: h = NULL is not bitwise the fused norm",
                          fm_dtype_name(dts[di]));
                fm_tensor_release_n(12, xb, x, h0, h, w, b, s, y, rs, ry, s2, y2);
            }
    /* bad input */
    fm_tensor *x = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_F32, FM_CPU), *s, *y;
    fm_tensor *h5 = fm_tensor_zeros(2, (int64_t[]){3, 5}, FM_F32, FM_CPU);
    fm_tensor *hd = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_F64, FM_CPU);
    fm_tensor *w3 = fm_tensor_zeros(1, (int64_t[]){3}, FM_F32, FM_CPU);
    fm_tensor *xi = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_I64, FM_CPU);
    CHECK(fm_add_layer_norm(x, h5, NULL, NULL, 1e-5, &s, &y) != FM_OK && !s && !y);
    CHECK_ERR_CONTAINS("h [3, 5] must have the shape of x [3, 4]");
    CHECK(fm_add_layer_norm(x, hd, NULL, NULL, 1e-5, &s, &y) != FM_OK);
    CHECK_ERR_CONTAINS("h dtype f64 does not match input dtype f32");
    CHECK(fm_add_layer_norm(x, x, w3, NULL, 1e-5, &s, &y) != FM_OK);
    CHECK_ERR_CONTAINS("weight [3] does not match the last dim of input [3, 4]");
    CHECK(fm_add_layer_norm(x, x, NULL, w3, 1e-5, &s, &y) != FM_OK);
    CHECK_ERR_CONTAINS("bias [3] does not match");
    CHECK(fm_add_layer_norm(x, x, NULL, NULL, -1, &s, &y) != FM_OK);
    CHECK_ERR_CONTAINS("eps -1 must be >= 0");
    CHECK(fm_add_layer_norm(xi, xi, NULL, NULL, 1e-5, &s, &y) != FM_OK);
    CHECK_ERR_CONTAINS("needs a floating-point input, got i64");
    CHECK(fm_add_layer_norm(NULL, x, NULL, NULL, 1e-5, &s, &y) != FM_OK);
    CHECK_ERR_CONTAINS("x is NULL");
    CHECK(fm_add_layer_norm(x, x, NULL, NULL, 1e-5, NULL, &y) != FM_OK);
    CHECK_ERR_CONTAINS("output pointers must not be NULL");
    fm_tensor_release_n(5, x, h5, hd, w3, xi);
    OP_END;
}

/* Which outputs feed the checked result: bit 0 the sum, bit 1 the norm. h_null:
 * the norm of x alone. in = {x [N, M] (transposed here: non-contiguous), h, w, b}. */
typedef struct { int use, h_null; } aln_ctx;

static fm_tensor *aln_fn(fm_tensor **in, void *vctx) {
    const aln_ctx *c = vctx;
    fm_tensor *x = fm_transpose(in[0], 0, 1), *s = NULL, *y = NULL, *out = NULL;
    if (!x || fm_add_layer_norm(x, c->h_null ? NULL : in[1], in[2], in[3], 1e-5, &s, &y)) goto done;
    if (c->use == 1) out = fm_mul_scalar(s, 1.0);
    else if (c->use == 2) out = fm_tensor_retain(y);
    else {
        fm_tensor *s2 = fm_mul(s, s); /* the sum feeds the loss nonlinearly, as the next block would */
        out = s2 ? fm_cat(2, (fm_tensor *[]){s2, y}, 0) : NULL;
        fm_tensor_release(s2);
    }
done:
    fm_tensor_release_n(3, x, s, y);
    return out;
}

static int add_ln_grad(void) {
    OP_BEGIN;
    const int64_t M = 6, N = 9;
    const aln_ctx cases[4] = {{3, 0}, {2, 0}, {1, 0}, {2, 1}};
    for (int ci = 0; ci < 4; ci++)
        for (int affine = 0; affine < 2; affine++) {
            fm_tensor *x = op_randn(2, (int64_t[]){N, M}, FM_F64, 61);
            fm_tensor *h = op_randn(2, (int64_t[]){M, N}, FM_F64, 62);
            fm_tensor *w = affine ? op_randn(1, (int64_t[]){N}, FM_F64, 63) : NULL;
            fm_tensor *b = affine ? op_randn(1, (int64_t[]){N}, FM_F64, 64) : NULL;
            fm_tensor *in[4] = {x, h, w, b};
            for (int i = 0; i < 4; i++)
                if (in[i] && !(i == 1 && cases[ci].h_null)) fm_tensor_requires_grad_(in[i], true);
            char name[96];
            snprintf(name, sizeof name, "add_layer_norm (use %d, h %s, affine %d)", cases[ci].use,
                     cases[ci].h_null ? "NULL" : "given", affine);
            CHECK_MSG(gradcheck(name, aln_fn, 4, in, (void *)&cases[ci], 1e-6, 1e-6), "%s", name);
            fm_tensor_release_n(4, x, h, w, b);
        }
    /* f32: gradients of every input equal, to rounding, those of add + layer_norm under autograd */
    const int64_t M2 = 70, N2 = 37;
    fm_tensor *x = op_randn(2, (int64_t[]){M2, N2}, FM_F32, 71), *h = op_randn(2, (int64_t[]){M2, N2}, FM_F32, 72);
    fm_tensor *w = op_randn(1, (int64_t[]){N2}, FM_F32, 73), *b = op_randn(1, (int64_t[]){N2}, FM_F32, 74);
    fm_tensor *c1 = op_randn(2, (int64_t[]){M2, N2}, FM_F32, 75), *c2 = op_randn(2, (int64_t[]){M2, N2}, FM_F32, 76);
    fm_tensor *in[4] = {x, h, w, b}, *g[2][4] = {{NULL}};
    for (int fused = 0; fused < 2; fused++) {
        for (int i = 0; i < 4; i++) fm_tensor_requires_grad_(in[i], true);
        fm_tensor *s = NULL, *y = NULL;
        if (fused) CHECK(fm_add_layer_norm(x, h, w, b, 1e-5, &s, &y) == FM_OK);
        else {
            s = fm_add(x, h);
            y = s ? fm_layer_norm(s, 1, w, b, 1e-5) : NULL;
        }
        fm_tensor *a = s ? fm_mul(s, c1) : NULL, *bb = y ? fm_mul(y, c2) : NULL, *t = a && bb ? fm_add(a, bb) : NULL;
        fm_tensor *L = t ? fm_sum(t, 0, NULL, false) : NULL;
        CHECK(L && fm_backward(L, NULL, false) == FM_OK);
        for (int i = 0; i < 4; i++) {
            g[fused][i] = fm_tensor_retain(in[i]->grad);
            fm_tensor_zero_grad(in[i]);
        }
        fm_tensor_release_n(6, s, y, a, bb, t, L);
    }
    for (int i = 0; i < 4; i++) {
        double *rh = g[0][i] ? op_host(g[0][i]) : NULL;
        double e = rh && g[1][i] ? op_max_rel_err(g[1][i], rh) : INFINITY;
        CHECK_MSG(e < 2e-5, "add_layer_norm f32 gradient of input %d vs unfused: rel err %g", i, e);
        free(rh);
        fm_tensor_release_n(2, g[0][i], g[1][i]);
    }
    fm_tensor_release_n(6, x, h, w, b, c1, c2);
    OP_END;
}

OP_TEST("add_layer_norm", add_ln_forward, add_ln_grad)

/* ---- rope: against the composition it replaces (bitwise in f32 and f64, a strided x, every
 * thread count), the bf16 path through f32, its gradient, and bad input ---- */
static fm_tensor *rope_ref(fm_tensor *x, fm_tensor *cs, fm_tensor *sn) {
    const int64_t D = x->shape[x->ndim - 1];
    fm_tensor *x1 = fm_narrow(x, x->ndim - 1, 0, D / 2), *x2 = fm_narrow(x, x->ndim - 1, D / 2, D / 2), *nx2 = fm_neg(x2);
    fm_tensor *rot = fm_cat(2, (fm_tensor *[]){nx2, x1}, x->ndim - 1), *a = fm_mul(x, cs), *b = fm_mul(rot, sn), *y = fm_add(a, b);
    fm_tensor_release_n(6, x1, x2, nx2, rot, a, b);
    return y;
}

static int rope_forward(void) {
    OP_BEGIN;
    fm_dtype dts[2] = {FM_F32, FM_F64};
    for (int d = 0; d < 2; d++)
        for (int th = 1; th <= 2; th++) {
            fm_set_num_threads(th);
            fm_tensor *xb = op_randn(4, (int64_t[]){2, 5, 3, 8}, dts[d], 70), *x = fm_transpose(xb, 1, 2); /* [2, 3, 5, 8] strided */
            fm_tensor *cs = op_randn(2, (int64_t[]){5, 8}, dts[d], 71), *sn = op_randn(2, (int64_t[]){5, 8}, dts[d], 72);
            fm_tensor *y = fm_rope(x, cs, sn), *r = rope_ref(x, cs, sn);
            CHECK_MSG(y && r && fz_maxdiff(y, r) == 0.0, "rope %s, %d threads: differs from the composition by %g", fm_dtype_name(dts[d]), th,
                      fz_maxdiff(y, r));
            fm_tensor *x2 = op_randn(2, (int64_t[]){5, 8}, dts[d], 73), *y2 = fm_rope(x2, cs, sn), *r2 = rope_ref(x2, cs, sn);
            CHECK_MSG(y2 && fz_maxdiff(y2, r2) == 0.0, "rope 2-D %s", fm_dtype_name(dts[d]));
            fm_tensor_release_n(9, xb, x, cs, sn, y, r, x2, y2, r2);
        }
    fm_set_num_threads(0);
    /* bf16 runs through f32 and rounds once */
    fm_tensor *x = op_randn(3, (int64_t[]){2, 4, 6}, FM_F32, 74), *cs = op_randn(2, (int64_t[]){4, 6}, FM_F32, 75), *sn = op_randn(2, (int64_t[]){4, 6}, FM_F32, 76);
    fm_tensor *xb = fm_to_dtype(x, FM_BF16), *cb = fm_to_dtype(cs, FM_BF16), *sb = fm_to_dtype(sn, FM_BF16);
    fm_tensor *yb = fm_rope(xb, cb, sb), *yf = fm_rope(x, cs, sn);
    CHECK_MSG(yb && yb->dtype == FM_BF16 && fz_maxdiff(yb, yf) < 0.1, "rope bf16: %s, %g", fm_last_error(), fz_maxdiff(yb, yf));
    /* bad input */
    fm_tensor *odd = op_randn(2, (int64_t[]){4, 5}, FM_F32, 77), *c5 = op_randn(2, (int64_t[]){4, 5}, FM_F32, 78), *c3 = op_randn(2, (int64_t[]){3, 6}, FM_F32, 79);
    CHECK(fm_rope(odd, c5, c5) == NULL);
    CHECK_ERR_CONTAINS("with D even");
    CHECK(fm_rope(x, c3, sn) == NULL);
    CHECK_ERR_CONTAINS("rope: x [2, 4, 6] needs [..., T, D] with D even, and cos [3, 6] and sin [4, 6] [T, D]");
    CHECK(fm_rope(x, cb, sn) == NULL);
    CHECK_ERR_CONTAINS("one floating-point dtype");
    CHECK(fm_rope(NULL, cs, sn) == NULL);
    fm_tensor_release_n(12, x, cs, sn, xb, cb, sb, yb, yf, odd, c5, c3, NULL);
    OP_END;
}

static fm_tensor *rope_gc(fm_tensor **in, void *ctx) {
    fm_tensor **t = ctx;
    return fm_rope(in[0], t[0], t[1]);
}

static int rope_grad(void) {
    OP_BEGIN;
    fm_tensor *x = op_randn(4, (int64_t[]){2, 2, 3, 6}, FM_F64, 80);
    fm_tensor *tab[2] = {op_randn(2, (int64_t[]){3, 6}, FM_F64, 81), op_randn(2, (int64_t[]){3, 6}, FM_F64, 82)};
    fm_tensor_requires_grad_(x, true);
    CHECK(gradcheck("rope", rope_gc, 1, &x, tab, 1e-6, 1e-6));
    fm_tensor_release_n(3, x, tab[0], tab[1]);
    OP_END;
}
OP_TEST("rope", rope_forward, rope_grad)
