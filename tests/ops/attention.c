/* Tests of scaled_dot_product_attention: forward values and gradients against a
 * naive reference that materializes the score matrix in double (computed here,
 * independently of the tiled kernels), gradient checks in f64, and bad shapes.
 *
 * Shapes are chosen to hit the tiled kernel's edges: sequence lengths that are
 * not multiples of the 64-row tiles, head dims that are not multiples of 16,
 * Tq != Tk in both directions, grouped-query heads, and a q that is a
 * transposed view of a [B, T, H, D] tensor. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"
#include "op_test.h"
#include "gradcheck.h"

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_num_threads, to show thread-count independence */

typedef struct sdpa_case {
    int64_t B, H, Hkv, Tq, Tk, D;
    int causal;
    double scale; /* <= 0: default */
    int q_view;   /* q is a transposed view of a [B, Tq, H, D] tensor */
} sdpa_case;

/* Naive attention in double with the full Tq x Tk matrix. dO may be NULL (then
 * only o is computed). Top-left causal alignment, as PyTorch's is_causal. */
static void sdpa_reference(const sdpa_case *c, const double *q, const double *k, const double *v, const double *dO,
                           double *o, double *dq, double *dk, double *dv) {
    int64_t B = c->B, H = c->H, Hkv = c->Hkv, Tq = c->Tq, Tk = c->Tk, D = c->D;
    double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
    double *P = malloc(sizeof(double) * Tq * Tk), *dP = malloc(sizeof(double) * Tq * Tk);
    if (dO) {
        memset(dk, 0, sizeof(double) * B * Hkv * Tk * D);
        memset(dv, 0, sizeof(double) * B * Hkv * Tk * D);
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / (H / Hkv);
            const double *Q = q + (b * H + h) * Tq * D, *K = k + (b * Hkv + hk) * Tk * D, *V = v + (b * Hkv + hk) * Tk * D;
            double *O = o + (b * H + h) * Tq * D;
            for (int64_t i = 0; i < Tq; i++) {
                double mx = -INFINITY, l = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += Q[i * D + d] * K[j * D + d];
                    s *= scale;
                    if (c->causal && j > i) s = -INFINITY;
                    P[i * Tk + j] = s;
                    if (s > mx) mx = s;
                }
                for (int64_t j = 0; j < Tk; j++) l += (P[i * Tk + j] = exp(P[i * Tk + j] - mx));
                for (int64_t j = 0; j < Tk; j++) P[i * Tk + j] /= l;
                for (int64_t d = 0; d < D; d++) {
                    double s = 0;
                    for (int64_t j = 0; j < Tk; j++) s += P[i * Tk + j] * V[j * D + d];
                    O[i * D + d] = s;
                }
            }
            if (!dO) continue;
            const double *G = dO + (b * H + h) * Tq * D;
            double *dQ = dq + (b * H + h) * Tq * D, *dK = dk + (b * Hkv + hk) * Tk * D, *dV = dv + (b * Hkv + hk) * Tk * D;
            for (int64_t i = 0; i < Tq; i++) {
                double rs = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += G[i * D + d] * V[j * D + d];
                    dP[i * Tk + j] = s;
                    rs += s * P[i * Tk + j];
                }
                for (int64_t j = 0; j < Tk; j++) dP[i * Tk + j] = P[i * Tk + j] * (dP[i * Tk + j] - rs); /* dS */
            }
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t d = 0; d < D; d++) {
                    double s = 0;
                    for (int64_t j = 0; j < Tk; j++) s += dP[i * Tk + j] * K[j * D + d];
                    dQ[i * D + d] = s * scale;
                }
            for (int64_t j = 0; j < Tk; j++)
                for (int64_t d = 0; d < D; d++) {
                    double sk = 0, sv = 0;
                    for (int64_t i = 0; i < Tq; i++) {
                        sk += dP[i * Tk + j] * Q[i * D + d];
                        sv += P[i * Tk + j] * G[i * D + d];
                    }
                    dK[j * D + d] += sk * scale;
                    dV[j * D + d] += sv;
                }
        }
    free(P);
    free(dP);
}

/* Builds q (maybe as a transposed view), k, v of the case. */
static void make_qkv(const sdpa_case *c, fm_dtype dt, uint64_t seed, fm_tensor **q, fm_tensor **k, fm_tensor **v) {
    fm_rng r;
    fm_rng_init(&r, seed);
    if (c->q_view) {
        fm_tensor *base = fm_tensor_randn(4, (int64_t[]){c->B, c->Tq, c->H, c->D}, dt, &r);
        *q = fm_transpose(base, 1, 2);
        fm_tensor_release(base);
    } else {
        *q = fm_tensor_randn(4, (int64_t[]){c->B, c->H, c->Tq, c->D}, dt, &r);
    }
    *k = fm_tensor_randn(4, (int64_t[]){c->B, c->Hkv, c->Tk, c->D}, dt, &r);
    *v = fm_tensor_randn(4, (int64_t[]){c->B, c->Hkv, c->Tk, c->D}, dt, &r);
}

/* Forward (and, with grads, backward through the public API) vs the reference. */
static void check_case(const sdpa_case *c, fm_dtype dt, int grads) {
    double tol = dt == FM_F64 ? 1e-10 : 2e-4;
    fm_tensor *q, *k, *v;
    make_qkv(c, dt, 42 + (uint64_t)(c->Tq * 131 + c->Tk * 7 + c->D + c->causal), &q, &k, &v);
    CHECK(q && k && v);
    if (!q || !k || !v) { fm_tensor_release_n(3, q, k, v); return; }
    if (c->q_view) CHECK(!fm_tensor_is_contiguous(q));
    fm_tensor *dO = NULL;
    if (grads) {
        fm_rng r;
        fm_rng_init(&r, 7);
        dO = fm_tensor_randn(4, (int64_t[]){c->B, c->H, c->Tq, c->D}, dt, &r);
        fm_tensor_requires_grad_(q, true);
        fm_tensor_requires_grad_(k, true);
        fm_tensor_requires_grad_(v, true);
    }
    fm_tensor *o = fm_scaled_dot_product_attention(q, k, v, c->causal, c->scale);
    CHECK_MSG(o != NULL, "sdpa failed: %s", fm_last_error());
    double *hq = op_host(q), *hk = op_host(k), *hv = op_host(v), *hdo = dO ? op_host(dO) : NULL;
    int64_t nq = c->B * c->H * c->Tq * c->D, nk = c->B * c->Hkv * c->Tk * c->D;
    double *ro = malloc(sizeof(double) * nq), *rdq = malloc(sizeof(double) * nq);
    double *rdk = malloc(sizeof(double) * nk), *rdv = malloc(sizeof(double) * nk);
    sdpa_reference(c, hq, hk, hv, hdo, ro, rdq, rdk, rdv);
    if (o) {
        CHECK(o->ndim == 4 && o->shape[0] == c->B && o->shape[1] == c->H && o->shape[2] == c->Tq && o->shape[3] == c->D);
        CHECK(o->dtype == dt);
        double e = op_max_rel_err(o, ro);
        CHECK_MSG(e <= tol, "sdpa %s B%lld H%lld Hkv%lld Tq%lld Tk%lld D%lld causal%d view%d: out err %g",
                  fm_dtype_name(dt), (long long)c->B, (long long)c->H, (long long)c->Hkv, (long long)c->Tq,
                  (long long)c->Tk, (long long)c->D, c->causal, c->q_view, e);
        if (grads) {
            CHECK_MSG(fm_backward(o, dO, false) == FM_OK, "backward: %s", fm_last_error());
            const char *nm[3] = {"dq", "dk", "dv"};
            fm_tensor *in[3] = {q, k, v};
            double *ref[3] = {rdq, rdk, rdv};
            for (int i = 0; i < 3; i++) {
                CHECK(in[i]->grad != NULL);
                if (!in[i]->grad) continue;
                double ge = op_max_rel_err(in[i]->grad, ref[i]);
                CHECK_MSG(ge <= tol * 2, "sdpa %s Tq%lld Tk%lld D%lld H%lld/%lld causal%d: %s err %g", fm_dtype_name(dt),
                          (long long)c->Tq, (long long)c->Tk, (long long)c->D, (long long)c->H, (long long)c->Hkv,
                          c->causal, nm[i], ge);
            }
        }
    }
    free(hq); free(hk); free(hv); free(hdo); free(ro); free(rdq); free(rdk); free(rdv);
    fm_tensor_release_n(5, o, q, k, v, dO);
}

static const sdpa_case fwd_cases[] = {
    /* B  H Hkv Tq   Tk  D  causal scale view */
    {1, 1, 1, 1, 1, 4, 0, 0, 0},
    {2, 2, 2, 5, 7, 8, 0, 0, 0},
    {2, 2, 2, 9, 9, 8, 1, 0, 0},
    {1, 4, 2, 70, 70, 16, 1, 0, 0},      /* GQA, tails of 64-row tiles */
    {1, 4, 1, 70, 133, 24, 0, 0.3, 1},   /* multi-query, Tq < Tk, D = 16 + 8, view */
    {2, 2, 1, 130, 67, 20, 1, 0, 1},     /* Tq > Tk causal: late queries see all keys; D tail of 4 */
    {1, 2, 2, 67, 130, 64, 1, 0, 0},     /* Tq < Tk causal: keys past Tq never seen */
    {1, 3, 3, 128, 128, 64, 0, 0, 1},
    {1, 2, 2, 3, 200, 5, 1, 0, 0},       /* D below one vector */
    {4, 4, 4, 70, 70, 16, 1, 0, 0},      /* >= 16 (batch, kv head) pairs: the owner-mode backward */
    {4, 8, 4, 130, 67, 24, 0, 0, 1},     /* owner mode with GQA */
};

static int sdpa_forward(void) {
    OP_BEGIN;
    for (size_t i = 0; i < sizeof fwd_cases / sizeof fwd_cases[0]; i++) {
        check_case(&fwd_cases[i], FM_F32, 0);
        check_case(&fwd_cases[i], FM_F64, 0);
    }
    /* gradients of the tiled f32 backward (the f64 path is covered by gradcheck) */
    for (size_t i = 0; i < sizeof fwd_cases / sizeof fwd_cases[0]; i++) check_case(&fwd_cases[i], FM_F32, 1);
    check_case(&fwd_cases[3], FM_F64, 1);

    /* results (forward and all three gradients) must not depend on how many threads
     * run the kernels, in both backward modes (few and many (batch, kv head) pairs) */
    {
        static const sdpa_case tc[2] = {{2, 4, 2, 100, 100, 32, 1, 0, 0}, {4, 8, 4, 70, 90, 16, 0, 0, 0}};
        for (int ci = 0; ci < 2; ci++) {
            fm_tensor *q, *k, *v, *res[2][4] = {{NULL}};
            make_qkv(&tc[ci], FM_F32, 5, &q, &k, &v);
            fm_tensor_requires_grad_(q, true);
            fm_tensor_requires_grad_(k, true);
            fm_tensor_requires_grad_(v, true);
            int nt = fm_num_threads();
            for (int run = 0; run < 2; run++) {
                fm_set_num_threads(run == 0 ? nt : 1);
                fm_tensor *o = fm_scaled_dot_product_attention(q, k, v, tc[ci].causal, 0);
                fm_tensor *gy = o ? fm_tensor_ones(4, o->shape, FM_F32, FM_CPU) : NULL;
                CHECK(o && gy && fm_backward(o, gy, false) == FM_OK);
                res[run][0] = o;
                res[run][1] = q->grad ? fm_tensor_retain(q->grad) : NULL;
                res[run][2] = k->grad ? fm_tensor_retain(k->grad) : NULL;
                res[run][3] = v->grad ? fm_tensor_retain(v->grad) : NULL;
                fm_tensor_zero_grad(q); fm_tensor_zero_grad(k); fm_tensor_zero_grad(v);
                fm_tensor_release(gy);
            }
            fm_set_num_threads(nt);
            for (int j = 0; j < 4; j++) {
                CHECK(res[0][j] && res[1][j]);
                if (res[0][j] && res[1][j]) {
                    double *a = op_host(res[0][j]), *b = op_host(res[1][j]);
                    CHECK_MSG(memcmp(a, b, sizeof(double) * (size_t)fm_tensor_numel(res[0][j])) == 0,
                              "case %d tensor %d differs between thread counts", ci, j);
                    free(a); free(b);
                }
                fm_tensor_release(res[0][j]);
                fm_tensor_release(res[1][j]);
            }
            fm_tensor_release_n(3, q, k, v);
        }
    }

    /* an empty query sequence is valid and gives an empty result */
    {
        fm_rng r;
        fm_rng_init(&r, 9);
        fm_tensor *q = fm_tensor_randn(4, (int64_t[]){1, 2, 0, 8}, FM_F32, &r);
        fm_tensor *k = fm_tensor_randn(4, (int64_t[]){1, 2, 5, 8}, FM_F32, &r);
        fm_tensor *o = fm_scaled_dot_product_attention(q, k, k, true, 0);
        CHECK_MSG(o && o->shape[2] == 0 && fm_tensor_numel(o) == 0, "empty q: %s", fm_last_error());
        fm_tensor_release_n(3, q, k, o);
    }

    /* bad input */
    {
        fm_rng r;
        fm_rng_init(&r, 3);
        fm_tensor *q = fm_tensor_randn(4, (int64_t[]){1, 4, 5, 8}, FM_F32, &r);
        fm_tensor *k = fm_tensor_randn(4, (int64_t[]){1, 4, 6, 8}, FM_F32, &r);
        fm_tensor *v = fm_tensor_randn(4, (int64_t[]){1, 4, 6, 8}, FM_F32, &r);
        fm_tensor *kD = fm_tensor_randn(4, (int64_t[]){1, 4, 6, 7}, FM_F32, &r);
        fm_tensor *k3 = fm_tensor_randn(4, (int64_t[]){1, 3, 6, 8}, FM_F32, &r);
        fm_tensor *q3d = fm_tensor_randn(3, (int64_t[]){4, 5, 8}, FM_F32, &r);
        fm_tensor *v64 = fm_tensor_randn(4, (int64_t[]){1, 4, 6, 8}, FM_F64, &r);
        fm_tensor *vT = fm_tensor_randn(4, (int64_t[]){1, 4, 7, 8}, FM_F32, &r);
        fm_tensor *kB = fm_tensor_randn(4, (int64_t[]){2, 4, 6, 8}, FM_F32, &r);
        CHECK(fm_scaled_dot_product_attention(q, kD, v, false, 0) == NULL);
        CHECK_ERR_CONTAINS("[1, 4, 6, 7]");
        CHECK(fm_scaled_dot_product_attention(q, kD, kD, false, 0) == NULL);
        CHECK_ERR_CONTAINS("head dim");
        CHECK(fm_scaled_dot_product_attention(q, k3, k3, false, 0) == NULL);
        CHECK_ERR_CONTAINS("must divide");
        CHECK(fm_scaled_dot_product_attention(q3d, k, v, false, 0) == NULL);
        CHECK_ERR_CONTAINS("4-D");
        CHECK(fm_scaled_dot_product_attention(q, k, v64, false, 0) == NULL);
        CHECK_ERR_CONTAINS("dtype");
        CHECK(fm_scaled_dot_product_attention(q, k, vT, false, 0) == NULL);
        CHECK_ERR_CONTAINS("does not match v shape");
        CHECK(fm_scaled_dot_product_attention(q, kB, kB, false, 0) == NULL);
        CHECK_ERR_CONTAINS("batch");
        CHECK(fm_scaled_dot_product_attention(NULL, k, v, false, 0) == NULL);
        CHECK_ERR_CONTAINS("NULL");
        fm_tensor *k0 = fm_tensor_randn(4, (int64_t[]){1, 4, 0, 8}, FM_F32, &r);
        CHECK(fm_scaled_dot_product_attention(q, k0, k0, false, 0) == NULL);
        CHECK_ERR_CONTAINS("key length");
        fm_tensor_release(k0);
        fm_tensor_release_n(9, q, k, v, kD, k3, q3d, v64, vT, kB);
    }
    OP_END;
}

typedef struct gc_sdpa { int causal; double scale; } gc_sdpa;
static fm_tensor *gc_sdpa_fn(fm_tensor **in, void *ctx) {
    gc_sdpa *c = ctx;
    return fm_scaled_dot_product_attention(in[0], in[1], in[2], c->causal, c->scale);
}

static int sdpa_grad(void) {
    OP_BEGIN;
    static const sdpa_case cases[] = {
        {1, 2, 2, 4, 4, 3, 0, 0, 0},
        {1, 2, 2, 5, 5, 3, 1, 0, 1},    /* causal, q a transposed view */
        {2, 4, 2, 3, 6, 2, 0, 0.7, 0},  /* GQA, Tq < Tk, explicit scale */
        {1, 2, 1, 6, 3, 2, 1, 0, 1},    /* multi-query, Tq > Tk causal */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const sdpa_case *c = &cases[i];
        fm_tensor *in[3];
        make_qkv(c, FM_F64, 100 + i, &in[0], &in[1], &in[2]);
        for (int j = 0; j < 3; j++) fm_tensor_requires_grad_(in[j], true);
        gc_sdpa ctx = {c->causal, c->scale};
        char name[64];
        snprintf(name, sizeof name, "sdpa case %zu", i);
        CHECK(gradcheck(name, gc_sdpa_fn, 3, in, &ctx, 1e-6, 1e-6));
        fm_tensor_release_n(3, in[0], in[1], in[2]);
    }
    OP_END;
}

OP_TEST("scaled_dot_product_attention", sdpa_forward, sdpa_grad)

/* sdpa_kv16: f32 queries over an f16 KV cache, against a double reference on the
 * same f16 values with the bottom-right mask (query i sees keys 0 .. L - T + i).
 * The caches are views with spare rows, as the graph's in-place cache makes them;
 * odd head sizes take the kernels' tails. */
typedef struct kv16_case { int64_t B, H, Hkv, T, L, C, D; } kv16_case;

static double kv16_err(const kv16_case *c, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    fm_tensor *q = fm_tensor_randn(4, (int64_t[]){c->B, c->H, c->T, c->D}, FM_F32, &r);
    fm_tensor *kf = fm_tensor_randn(4, (int64_t[]){c->B, c->Hkv, c->C, c->D}, FM_F32, &r);
    fm_tensor *vf = fm_tensor_randn(4, (int64_t[]){c->B, c->Hkv, c->C, c->D}, FM_F32, &r);
    fm_tensor *kc = fm_to_dtype(kf, FM_F16), *vc = fm_to_dtype(vf, FM_F16);
    fm_tensor *k = fm_narrow(kc, 2, 0, c->L), *v = fm_narrow(vc, 2, 0, c->L);
    fm_tensor *o = fm_sdpa_kv16(q, k, v, 0);
    double err = o ? 0 : INFINITY, big = 0;
    const double scale = 1.0 / sqrt((double)c->D);
    double *s = malloc(sizeof(double) * (size_t)c->L);
    for (int64_t b = 0; o && b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->T; i++) {
                const int64_t hk = h / (c->H / c->Hkv), n = c->L - c->T + i + 1;
                double mx = -INFINITY, l = 0;
                for (int64_t j = 0; j < n; j++) {
                    double a = 0;
                    for (int64_t d = 0; d < c->D; d++)
                        a += fm_tensor_get(q, ((b * c->H + h) * c->T + i) * c->D + d) * fm_tensor_get(kc, ((b * c->Hkv + hk) * c->C + j) * c->D + d);
                    s[j] = a * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int64_t j = 0; j < n; j++) l += s[j] = exp(s[j] - mx);
                for (int64_t d = 0; d < c->D; d++) {
                    double y = 0;
                    for (int64_t j = 0; j < n; j++) y += s[j] / l * fm_tensor_get(vc, ((b * c->Hkv + hk) * c->C + j) * c->D + d);
                    const double got = fm_tensor_get(o, ((b * c->H + h) * c->T + i) * c->D + d);
                    err = fabs(got - y) > err ? fabs(got - y) : err;
                    big = fabs(y) > big ? fabs(y) : big;
                }
            }
    free(s);
    fm_tensor_release_n(8, q, kf, vf, kc, vc, k, v, o);
    return big > 0 ? err / big : err;
}

static int sdpa_kv16_forward(void) {
    OP_BEGIN;
    static const kv16_case cases[] = {
        {1, 4, 2, 1, 37, 50, 64}, /* a decode step, grouped heads, a cache with spare rows */
        {1, 2, 1, 3, 10, 16, 13}, /* three new rows after a past of 7, odd head size */
        {2, 3, 3, 5, 5, 5, 40},   /* a prompt (T = L: causal), batch 2, D not a multiple of 32 */
        {1, 12, 12, 1, 193, 200, 64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const double e = kv16_err(&cases[i], 40 + i);
        CHECK_MSG(e < 2e-5, "sdpa_kv16 case %zu: relative error %g against the double reference on the same halves", i, e);
    }
    fm_rng r;
    fm_rng_init(&r, 9);
    fm_tensor *q = fm_tensor_randn(4, (int64_t[]){1, 2, 2, 8}, FM_F32, &r), *kf = fm_tensor_randn(4, (int64_t[]){1, 2, 4, 8}, FM_F32, &r);
    fm_tensor *k = fm_to_dtype(kf, FM_F16), *q16 = fm_to_dtype(q, FM_F16), *k1 = fm_narrow(k, 2, 0, 1);
    CHECK(!fm_sdpa_kv16(q, kf, kf, 0));
    CHECK_ERR_CONTAINS("k, v f16");
    CHECK(!fm_sdpa_kv16(q16, k, k, 0));
    CHECK_ERR_CONTAINS("needs q f32");
    CHECK(!fm_sdpa_kv16(q, k1, k1, 0));
    CHECK_ERR_CONTAINS("at least the 2 query rows");
    CHECK(!fm_sdpa_kv16(q, k, NULL, 0));
    CHECK_ERR_CONTAINS("NULL");
    fm_tensor_release_n(5, q, kf, k, q16, k1);
    OP_END;
}

OP_TEST("sdpa_kv16", sdpa_kv16_forward, NULL)

/* sdpa_mask: softmax(q k^T scale + mask) v against a double reference, with masks of the
 * shapes exports give ([B, 1, 1, Tk] padding, [Tq, Tk], the full [B, H, Tq, Tk]), keys
 * masked with -inf (a whole row of one batch: its output must be 0), q, k and v as views
 * of [B, T, H, D] projections (the kernels read their rows in place), grouped heads, odd
 * head sizes, one query (the row path) and several tiles of queries and keys. */
typedef struct mask_case { int64_t B, H, Hkv, Tq, Tk, D; int mask_kind; } mask_case;

static fm_tensor *bthd_view(int64_t B, int64_t T, int64_t H, int64_t D, fm_rng *r, fm_tensor **base) {
    *base = fm_tensor_randn(4, (int64_t[]){B, T, H, D}, FM_F32, r);
    return *base ? fm_permute(*base, (int[]){0, 2, 1, 3}) : NULL; /* [B, H, T, D], not contiguous */
}

static fm_tensor *test_mask(const mask_case *c, fm_rng *r) {
    const int64_t B = c->B, H = c->H, Tq = c->Tq, Tk = c->Tk;
    if (c->mask_kind == 0) { /* padding: batch b keeps its first Tk - 3 b keys; the last batch none */
        float *m = malloc(sizeof(float) * (size_t)(B * Tk));
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Tk; j++) m[b * Tk + j] = (b == B - 1 && B > 1) || j >= Tk - 3 * b ? -INFINITY : 0.0f;
        fm_tensor *t = fm_tensor_from_data(m, 4, (int64_t[]){B, 1, 1, Tk}, FM_F32);
        free(m);
        return t;
    }
    if (c->mask_kind == 1) return fm_tensor_randn(2, (int64_t[]){Tq, Tk}, FM_F32, r);
    return fm_tensor_randn(4, (int64_t[]){B, H, Tq, Tk}, FM_F32, r);
}

static double mask_ref_err(const mask_case *c, const fm_tensor *q, const fm_tensor *k, const fm_tensor *v, const fm_tensor *m,
                           const fm_tensor *o) {
    const int64_t B = c->B, H = c->H, Tq = c->Tq, Tk = c->Tk, D = c->D, g = c->H / c->Hkv;
    fm_tensor *qc = fm_contiguous((fm_tensor *)q), *kc = fm_contiguous((fm_tensor *)k), *vc = fm_contiguous((fm_tensor *)v);
    double err = 0, big = 0, *s = malloc(sizeof(double) * (size_t)Tk);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tq; i++) {
                double mx = -INFINITY, l = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    double a = 0;
                    for (int64_t d = 0; d < D; d++)
                        a += fm_tensor_get(qc, ((b * H + h) * Tq + i) * D + d) * fm_tensor_get(kc, ((b * c->Hkv + h / g) * Tk + j) * D + d);
                    const int64_t mi = c->mask_kind == 0 ? b * Tk + j : c->mask_kind == 1 ? i * Tk + j : ((b * H + h) * Tq + i) * Tk + j;
                    s[j] = a / sqrt((double)D) + fm_tensor_get(m, mi);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int64_t j = 0; mx > -INFINITY && j < Tk; j++) l += s[j] = exp(s[j] - mx);
                for (int64_t d = 0; d < D; d++) {
                    double y = 0;
                    for (int64_t j = 0; l > 0 && j < Tk; j++) y += s[j] / l * fm_tensor_get(vc, ((b * c->Hkv + h / g) * Tk + j) * D + d);
                    const double got = fm_tensor_get(o, ((b * H + h) * Tq + i) * D + d);
                    err = fabs(got - y) > err || !(got == got) ? (got == got ? fabs(got - y) : INFINITY) : err;
                    big = fabs(y) > big ? fabs(y) : big;
                }
            }
    free(s);
    fm_tensor_release_n(3, qc, kc, vc);
    return big > 0 ? err / big : err;
}

static int sdpa_mask_forward(void) {
    OP_BEGIN;
    static const mask_case cases[] = {
        {2, 4, 4, 70, 70, 32, 0},  /* an encoder's padding mask, two query tiles; the second batch all masked */
        {3, 4, 2, 1, 130, 20, 0},  /* one query (the row path), grouped heads, odd D, three key tiles */
        {1, 3, 3, 9, 17, 16, 1},   /* a [Tq, Tk] mask of finite values */
        {2, 2, 1, 65, 66, 8, 2},   /* the full [B, H, Tq, Tk] mask */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mask_case *c = &cases[i];
        fm_rng r;
        fm_rng_init(&r, 70 + i);
        fm_tensor *qb, *kb, *vb;
        fm_tensor *q = bthd_view(c->B, c->Tq, c->H, c->D, &r, &qb), *k = bthd_view(c->B, c->Tk, c->Hkv, c->D, &r, &kb);
        fm_tensor *v = bthd_view(c->B, c->Tk, c->Hkv, c->D, &r, &vb), *m = test_mask(c, &r);
        fm_tensor *o = fm_sdpa_mask(q, k, v, m, 0);
        CHECK_MSG(o != NULL, "sdpa_mask case %zu: %s", i, fm_last_error());
        const double e = o ? mask_ref_err(c, q, k, v, m, o) : INFINITY;
        CHECK_MSG(e < 2e-5, "sdpa_mask case %zu: relative error %g against the double reference", i, e);
        if (o && c->mask_kind == 0 && c->B > 1) { /* the fully masked batch: exact zeros */
            double worst = 0;
            const int64_t per = c->H * c->Tq * c->D;
            for (int64_t j = (c->B - 1) * per; j < c->B * per; j++) worst = fmax(worst, fabs(fm_tensor_get(o, j)));
            CHECK_MSG(worst == 0, "sdpa_mask case %zu: a query with every key masked gave %g, not 0", i, worst);
        }
        fm_tensor_release_n(8, qb, kb, vb, q, k, v, m, o);
    }
    fm_rng r;
    fm_rng_init(&r, 9);
    fm_tensor *q = fm_tensor_randn(4, (int64_t[]){1, 2, 3, 8}, FM_F32, &r), *k = fm_tensor_randn(4, (int64_t[]){1, 2, 5, 8}, FM_F32, &r);
    fm_tensor *bad = fm_tensor_randn(2, (int64_t[]){4, 5}, FM_F32, &r), *m64 = fm_tensor_zeros(2, (int64_t[]){3, 5}, FM_F64, FM_CPU);
    CHECK(!fm_sdpa_mask(q, k, k, bad, 0));
    CHECK_ERR_CONTAINS("does not broadcast to the scores [B, H, Tq, Tk] = [1, 2, 3, 5]");
    CHECK(!fm_sdpa_mask(q, k, k, m64, 0));
    CHECK_ERR_CONTAINS("q's dtype (f32)");
    CHECK(!fm_sdpa_mask(q, k, k, NULL, 0));
    CHECK_ERR_CONTAINS("got NULL");
    fm_tensor_release_n(4, q, k, bad, m64);
    OP_END;
}

OP_TEST("sdpa_mask", sdpa_mask_forward, NULL)
