/* Tests of the fused transformer helpers: qkv_split_heads against the unfused
 * narrow + transpose + contiguous route (f32, f64, a non-contiguous input, grouped
 * kv heads), its gradient by finite differences in f64 (with some outputs unused,
 * so NULL incoming gradients are covered), and bad input. */
#include "test_util.h"
#include "op_test.h"
#include "gradcheck.h"

#include "fathom/autograd.h"
#include "fathom/ops.h"

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
