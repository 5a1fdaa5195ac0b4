/* Attention with bf16 products (fm_sdpa_qkv_mixed; attention_avx512bf16.c): the
 * output and the qkv gradient against the f32 kernel's, on shapes that take the
 * bf16 path (causal and not, grouped kv heads, sequence lengths that are not
 * whole 64-row tiles, fewer than 16 (batch, kv head) pairs: the backward's split
 * mode) and a shape that must not (head size not a multiple of 16), where the
 * mixed call must give the f32 kernel's bits. The split mode must give the owner
 * mode's bits: one batch element alone against the same element among 16 copies. On a CPU without a fast bf16 dot product (fm_cpu_bf16_dot_fast)
 * or below FATHOM_ISA=avx512 every shape must give the f32 bits.
 *
 * The bound for the bf16 path: q, k, v, dO and the probabilities rounded to
 * bf16 (8 significant bits) before their products, f32 sums. The errors are
 * printed (2.3e-3 to 6.3e-3 of the f32 result's largest value on an AMD EPYC Zen 4,
 * output and gradient alike; dq up to 1.2e-2 with 160 keys not masked: a row of dS sums
 * to zero, so dq = dS K cancels); the check is 1e-2 for the output and 2e-2 for the
 * gradients, and more than 0: a kernel that
 * ignored the request would give the f32 bits. */
#include <math.h>
#include <stdio.h>

#include "backend/cpu/cpu_kernels.h" /* fm_cpu_bf16_dot_fast */
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "fathom/fathom.h"
#include "ops/ops_internal.h" /* fm_sdpa_qkv_mixed */
#include "tensor_compare.h"
#include "test_util.h"

typedef struct shape {
    int64_t B, T;
    int H, KV, D;
    bool causal;
} shape;

/* y and d(sum(y * gy))/dqkv */
static void run(const shape *s, fm_tensor *qkv, fm_tensor *gy, bool mixed, fm_tensor **y, fm_tensor **g) {
    fm_tensor_requires_grad_(qkv, true);
    *y = mixed ? fm_sdpa_qkv_mixed(qkv, s->H, s->KV, s->causal, 0.0, FM_BF16) : fm_sdpa_qkv(qkv, s->H, s->KV, s->causal, 0.0);
    fm_tensor *p = *y ? fm_mul(*y, gy) : NULL, *l = p ? fm_sum(p, 0, NULL, false) : NULL;
    CHECK_MSG(l && fm_backward(l, NULL, false) == FM_OK, "%s", fm_last_error());
    *g = qkv->grad ? fm_clone(qkv->grad) : NULL;
    fm_tensor_zero_grad(qkv);
    fm_tensor_requires_grad_(qkv, false);
    fm_tensor_release_n(2, p, l);
}

static void check(const shape *s, fm_rng *r) {
    const bool fast = fm_cpu_use_avx512() && fm_cpu_bf16_dot_fast();
    const bool bf16 = fast && s->D % 16 == 0;
    fm_tensor *qkv = fm_tensor_randn(3, (int64_t[]){s->B, s->T, (int64_t)(s->H + 2 * s->KV) * s->D}, FM_F32, r);
    fm_tensor *gy = fm_tensor_randn(3, (int64_t[]){s->B, s->T, (int64_t)s->H * s->D}, FM_F32, r);
    fm_tensor *ym, *gm, *yf, *gf;
    run(s, qkv, gy, true, &ym, &gm);
    run(s, qkv, gy, false, &yf, &gf);
    double ey = t_rel_err(ym, yf), eg = t_rel_err(gm, gf);
    char what[160];
    snprintf(what, sizeof what, "B %lld T %lld H %d KV %d D %d %s", (long long)s->B, (long long)s->T, s->H, s->KV, s->D,
             s->causal ? "causal" : "full");
    if (bf16) {
        fprintf(stderr, "  bf16 products, %s: output %.2e, gradient %.2e of the f32 kernel's largest\n", what, ey, eg);
        CHECK_MSG(ey > 0 && ey < 1e-2, "%s: output differs from the f32 kernel by %g of its largest", what, ey);
        CHECK_MSG(eg > 0 && eg < 2e-2, "%s: gradient differs from the f32 kernel by %g of its largest", what, eg);
    } else {
        CHECK_MSG(ey == 0 && eg == 0, "%s: not a bf16 shape here, yet it differs from the f32 kernel (%g, %g)", what, ey, eg);
    }
    CHECK(ym && ym->dtype == FM_F32 && gm && gm->dtype == FM_F32);
    fm_tensor_release_n(6, qkv, gy, ym, gm, yf, gf);
}

/* The plain op ([B, H, T, D] heads; Llama's mixed path) with as many keys as queries or more
 * (the decode-with-cache shape: causal is top-left aligned, as the f32 kernel's) */
static void plain(int64_t B, int64_t H, int64_t KV, int64_t Tq, int64_t Tk, int64_t D, bool causal, fm_rng *r) {
    const bool bf16 = fm_cpu_use_avx512() && fm_cpu_bf16_dot_fast() && D % 16 == 0;
    fm_tensor *q = fm_tensor_randn(4, (int64_t[]){B, H, Tq, D}, FM_F32, r);
    fm_tensor *k = fm_tensor_randn(4, (int64_t[]){B, KV, Tk, D}, FM_F32, r);
    fm_tensor *v = fm_tensor_randn(4, (int64_t[]){B, KV, Tk, D}, FM_F32, r);
    fm_tensor *gy = fm_tensor_randn(4, (int64_t[]){B, H, Tq, D}, FM_F32, r);
    fm_tensor *leaves[3] = {q, k, v}, *out[2][4] = {{0}};
    for (int mixed = 0; mixed < 2; mixed++) {
        for (int i = 0; i < 3; i++) fm_tensor_requires_grad_(leaves[i], true);
        fm_tensor *y = mixed ? fm_scaled_dot_product_attention_mixed(q, k, v, causal, 0.0, FM_BF16)
                             : fm_scaled_dot_product_attention(q, k, v, causal, 0.0);
        fm_tensor *p = y ? fm_mul(y, gy) : NULL, *l = p ? fm_sum(p, 0, NULL, false) : NULL;
        CHECK_MSG(l && fm_backward(l, NULL, false) == FM_OK, "%s", fm_last_error());
        out[mixed][0] = y;
        for (int i = 0; i < 3; i++) {
            out[mixed][1 + i] = leaves[i]->grad ? fm_clone(leaves[i]->grad) : NULL;
            fm_tensor_zero_grad(leaves[i]);
            fm_tensor_requires_grad_(leaves[i], false);
        }
        fm_tensor_release_n(2, p, l);
    }
    const char *what[4] = {"output", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        double e = t_rel_err(out[1][i], out[0][i]);
        if (bf16)
            CHECK_MSG(e > 0 && e < (i ? 2e-2 : 1e-2), "sdpa %lldx%lld Tq %lld Tk %lld %s: %s differs from the f32 kernel by %g", (long long)B,
                      (long long)H, (long long)Tq, (long long)Tk, causal ? "causal" : "full", what[i], e);
        else
            CHECK_MSG(e == 0, "sdpa Tq %lld Tk %lld: %s differs from the f32 kernel (%g) on a non-bf16 shape", (long long)Tq,
                      (long long)Tk, what[i], e);
    }
    for (int m = 0; m < 2; m++) fm_tensor_release_n(4, out[m][0], out[m][1], out[m][2], out[m][3]);
    fm_tensor_release_n(4, q, k, v, gy);
}

/* out[0..3] = y, dq, dk, dv of the mixed op on q, k, v with upstream gradient gy */
static void mixed_grads(fm_tensor *q, fm_tensor *k, fm_tensor *v, fm_tensor *gy, bool causal, fm_tensor **out) {
    fm_tensor *leaves[3] = {q, k, v};
    for (int i = 0; i < 3; i++) fm_tensor_requires_grad_(leaves[i], true);
    fm_tensor *y = fm_scaled_dot_product_attention_mixed(q, k, v, causal, 0.0, FM_BF16);
    fm_tensor *p = y ? fm_mul(y, gy) : NULL, *l = p ? fm_sum(p, 0, NULL, false) : NULL;
    CHECK_MSG(l && fm_backward(l, NULL, false) == FM_OK, "%s", fm_last_error());
    out[0] = y;
    for (int i = 0; i < 3; i++) {
        out[1 + i] = leaves[i]->grad ? fm_clone(leaves[i]->grad) : NULL;
        fm_tensor_zero_grad(leaves[i]);
        fm_tensor_requires_grad_(leaves[i], false);
    }
    fm_tensor_release_n(2, p, l);
}

/* The backward's two modes agree bit for bit: batch 1 (H / KV pairs < 16: split mode)
 * against the same element as the first of 16 copies (owner mode); the forward is
 * per (batch, head, query block) either way. */
static void modes_agree(int64_t H, int64_t KV, int64_t Tq, int64_t Tk, int64_t D, bool causal, fm_rng *r) {
    fm_tensor *one[4] = {fm_tensor_randn(4, (int64_t[]){1, H, Tq, D}, FM_F32, r), fm_tensor_randn(4, (int64_t[]){1, KV, Tk, D}, FM_F32, r),
                         fm_tensor_randn(4, (int64_t[]){1, KV, Tk, D}, FM_F32, r), fm_tensor_randn(4, (int64_t[]){1, H, Tq, D}, FM_F32, r)};
    fm_tensor *many[4];
    for (int i = 0; i < 4; i++) {
        fm_tensor *copies[16];
        for (int c = 0; c < 16; c++) copies[c] = one[i];
        many[i] = fm_cat(16, copies, 0);
        CHECK(many[i] != NULL);
    }
    fm_tensor *a[4] = {0}, *b[4] = {0};
    mixed_grads(one[0], one[1], one[2], one[3], causal, a);
    mixed_grads(many[0], many[1], many[2], many[3], causal, b);
    const char *what[4] = {"output", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        fm_tensor *n = b[i] ? fm_narrow(b[i], 0, 0, 1) : NULL, *nc = n ? fm_contiguous(n) : NULL;
        double e = t_rel_err(a[i], nc);
        CHECK_MSG(e == 0, "H %lld KV %lld Tq %lld Tk %lld %s: %s alone differs from the same element among 16 (%g)", (long long)H,
                  (long long)KV, (long long)Tq, (long long)Tk, causal ? "causal" : "full", what[i], e);
        fm_tensor_release_n(2, n, nc);
    }
    for (int i = 0; i < 4; i++) fm_tensor_release_n(3, one[i], many[i], a[i]);
    fm_tensor_release_n(4, b[0], b[1], b[2], b[3]);
}

int main(void) {
    fm_rng r;
    fm_rng_init(&r, 17);
    const shape shapes[] = {
        {16, 128, 4, 4, 32, true},  /* kjv-gpt's attention */
        {8, 100, 4, 2, 32, true},   /* grouped kv heads (8 x 2 = 16 pairs), a partial tile */
        {4, 70, 8, 4, 64, false},   /* not causal */
        {16, 33, 2, 1, 16, true},   /* one short tile */
        {2, 64, 4, 4, 32, true},    /* 8 (batch, kv head) pairs: the backward's split mode */
        {1, 150, 12, 12, 64, true}, /* batch 1, 12 heads (a GPT-2 fine-tune's shape): split mode */
        {1, 90, 8, 2, 32, false},   /* 2 kv heads, not causal: split mode */
        {16, 40, 2, 2, 24, true},   /* head size 24: the f32 kernel */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check(&shapes[i], &r);
    plain(8, 4, 2, 100, 160, 32, false, &r);
    plain(8, 4, 2, 100, 160, 32, true, &r);
    plain(16, 2, 1, 70, 70, 64, true, &r);
    plain(4, 2, 2, 64, 64, 32, true, &r); /* 8 (batch, kv head) pairs: split mode */
    plain(1, 4, 2, 100, 160, 32, true, &r);
    modes_agree(4, 2, 130, 130, 32, true, &r);
    modes_agree(4, 4, 100, 160, 64, true, &r);
    modes_agree(2, 1, 70, 200, 16, false, &r);
    fm_parallel_shutdown();
    TEST_DONE();
}
