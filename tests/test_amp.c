/* Autocast: matmul/linear and conv2d run in bf16 and f16 with f32 accumulation,
 * results stay close to f32, gradients reach the f32 master weights as f32,
 * mixed-dtype adds promote under autocast and are refused outside it. */
#include "core/parallel.h"
#include "fathom/amp.h"
#include "fathom/fathom.h"
#include "test_util.h"

static double max_abs_diff(fm_tensor *a, fm_tensor *b) {
    double m = 0;
    for (int64_t i = 0; a && b && i < fm_tensor_numel(a); i++) {
        double e = fabs(fm_tensor_get(a, i) - fm_tensor_get(b, i));
        if (!(e <= m)) m = e; /* NaN wins */
    }
    return a && b ? m : INFINITY;
}

/* conv2d autocasts (ops.def: LOWP): bf16/f16 output, the CPU kernel widened to f32
 * (FM_OPF_F32_ONLY), f32 gradients for the f32 input, weight and bias. */
static void conv_autocast(void) {
    fm_rng r;
    fm_rng_init(&r, 5);
    fm_tensor *x = fm_tensor_randn(4, (int64_t[]){2, 3, 6, 6}, FM_F32, &r);
    fm_tensor *w = fm_tensor_randn(4, (int64_t[]){4, 3, 3, 3}, FM_F32, &r), *b = fm_tensor_randn(1, (int64_t[]){4}, FM_F32, &r);
    fm_tensor *leaves[3] = {x, w, b};
    for (int i = 0; i < 3; i++) fm_tensor_requires_grad_(leaves[i], true);
    fm_conv2d_params p = fm_conv2d_default_params();
    p.padding[0] = p.padding[1] = 1;
    fm_tensor *ref = fm_conv2d(x, w, b, &p), *rs = ref ? fm_sum(ref, 0, NULL, false) : NULL;
    CHECK_MSG(rs && fm_backward(rs, NULL, false) == FM_OK, "%s", fm_last_error());
    fm_tensor *g_ref[3];
    for (int i = 0; i < 3; i++) { g_ref[i] = fm_clone(leaves[i]->grad); fm_tensor_zero_grad(leaves[i]); }
    fm_dtype lows[2] = {FM_BF16, FM_F16};
    for (int k = 0; k < 2; k++) {
        fm_dtype prev = fm_autocast_set(lows[k]);
        fm_tensor *y = fm_conv2d(x, w, b, &p);
        fm_autocast_set(prev);
        CHECK_MSG(y && y->dtype == lows[k], "conv2d under %s autocast: %s", fm_dtype_name(lows[k]), y ? fm_dtype_name(y->dtype) : fm_last_error());
        /* 27-term dot products of N(0,1) values: a few bf16 ulps of ~5 */
        double tol = lows[k] == FM_BF16 ? 0.25 : 0.03, e = max_abs_diff(y, ref);
        CHECK_MSG(e < tol, "conv2d %s vs f32: max error %g", fm_dtype_name(lows[k]), e);
        fm_tensor *s = y ? fm_sum(y, 0, NULL, false) : NULL;
        CHECK(s && fm_backward(s, NULL, false) == FM_OK);
        for (int i = 0; i < 3; i++) {
            fm_tensor *g = leaves[i]->grad;
            CHECK_MSG(g && g->dtype == FM_F32, "conv2d %s: gradient %d is %s", fm_dtype_name(lows[k]), i, g ? fm_dtype_name(g->dtype) : "missing");
            /* bias and weight gradients sum 72 and 24 terms of 1s times inputs */
            double eg = max_abs_diff(g, g_ref[i]), tg = (lows[k] == FM_BF16 ? 0.05 : 0.006) * (i == 0 ? 4 : 24);
            CHECK_MSG(eg < tg, "conv2d %s gradient %d: max error %g (bound %g)", fm_dtype_name(lows[k]), i, eg, tg);
            fm_tensor_zero_grad(leaves[i]);
        }
        fm_tensor_release_n(2, y, s);
    }
    fm_tensor_release_n(8, x, w, b, ref, rs, g_ref[0], g_ref[1], g_ref[2]);
}

/* The LOWP rule casts any f32/bf16/f16 input to the autocast dtype (a bf16 operand
 * under fp16 autocast too, as torch.autocast); PROMOTE takes bf16 with f16 to f32. */
static void policy_rules(void) {
    fm_rng r;
    fm_rng_init(&r, 6);
    fm_tensor *a = fm_tensor_randn(2, (int64_t[]){4, 4}, FM_F32, &r);
    fm_tensor *ab = fm_to_dtype(a, FM_BF16), *ah = fm_to_dtype(a, FM_F16);
    fm_dtype prev = fm_autocast_set(FM_F16);
    fm_tensor *m = fm_matmul(ab, a), *s = fm_add(ab, ah);
    fm_autocast_set(prev);
    CHECK_MSG(m && m->dtype == FM_F16, "bf16 @ f32 under fp16 autocast: %s", m ? fm_dtype_name(m->dtype) : fm_last_error());
    CHECK_MSG(s && s->dtype == FM_F32, "bf16 + f16 under autocast: %s", s ? fm_dtype_name(s->dtype) : fm_last_error());
    fm_tensor_release_n(5, a, ab, ah, m, s);
}

int main(void) {
    int64_t sx[2] = {16, 32}, sw[2] = {8, 32}, sb[1] = {8};
    fm_rng r;
    fm_rng_init(&r, 3);
    fm_tensor *x = fm_tensor_randn(2, sx, FM_F32, &r), *w = fm_tensor_randn(2, sw, FM_F32, &r);
    fm_tensor *b = fm_tensor_randn(1, sb, FM_F32, &r);
    fm_tensor_requires_grad_(w, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *ref = fm_linear(x, w, b);
    fm_dtype lows[2] = {FM_BF16, FM_F16};
    for (int k = 0; k < 2; k++) {
        fm_dtype prev = fm_autocast_set(lows[k]);
        CHECK(prev == FM_F32 && fm_autocast_get() == lows[k]);
        fm_tensor *y = fm_linear(x, w, b); /* matmul and bias add in low precision (as torch.autocast) */
        fm_autocast_set(FM_F32);
        CHECK_MSG(y != NULL, "%s", fm_last_error());
        if (!y) continue;
        CHECK(y->dtype == lows[k]); /* the bias is cast too, so activations stay low precision */
        double maxerr = 0;
        for (int i = 0; i < 16 * 8; i++) {
            double e = fabs(fm_tensor_get(y, i) - fm_tensor_get(ref, i));
            if (e > maxerr) maxerr = e;
        }
        CHECK_MSG(maxerr < (lows[k] == FM_BF16 ? 0.15 : 0.02), "%s max error %g", fm_dtype_name(lows[k]), maxerr);
        fm_tensor *s = fm_sum(y, 0, NULL, false);
        CHECK(fm_backward(s, NULL, false) == FM_OK);
        CHECK(w->grad && w->grad->dtype == FM_F32 && b->grad && b->grad->dtype == FM_F32);
        fm_tensor_zero_grad(w);
        fm_tensor_zero_grad(b);
        fm_tensor_release_n(2, y, s);
    }
    /* outside autocast a dtype mismatch is an error */
    fm_tensor *h = fm_to_dtype(x, FM_BF16);
    CHECK(fm_add(h, x) == NULL);
    CHECK_ERR_CONTAINS("dtype mismatch");
    fm_tensor_release_n(5, x, w, b, ref, h);
    conv_autocast();
    policy_rules();
    fm_parallel_shutdown();
    TEST_DONE();
}
