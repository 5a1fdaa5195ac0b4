/* The mixed conv2d (bf16 autocast on the CPU, fm_conv2d_mixed): f32 activations
 * in and out, the products in bf16 with f32 accumulation.
 *
 * What is checked: the output and the input and weight gradients equal those of
 * the f32 conv2d run on the same values rounded to bf16 (x, w, and the incoming
 * gradient dy), to f32 summation-order differences (1e-5 of the largest value):
 * the bf16 products are exact in f32 either way, only the sums' order differs.
 * The bias gradient is the f32 sum of the unrounded dy. Against the f32 conv2d on
 * the unrounded values the difference is bf16 rounding (about 1e-3 relative), so a
 * kernel that ignored the bf16 request fails the first check. Shapes cover several
 * chunks of samples (the weight gradient summed across them), stride, padding,
 * dilation, groups, 1x1, and a 9-long first layer, which stays f32 (the kernels'
 * rule, fm_conv2d_lowp_products) and must then equal the f32 conv2d exactly.
 *
 * The bf16 products go to oneDNN where `fathom info` says bf16 runs through it, and
 * are widened to f32 where it does not (an AddressSanitizer build, CPUs without
 * AVX512-BF16): both paths give the values checked here. Then the nn modules under
 * bf16 autocast: f32 outputs, gradients into the f32 weights. */
#include <math.h>

#include "core/parallel.h"
#include "fathom/amp.h"
#include "fathom/fathom.h"
#include "fathom/nn.h"
#include "ops/ops_internal.h" /* fm_conv2d_mixed, fm_mixed_lowp */
#include "tensor_compare.h"
#include "test_util.h"

static fm_tensor *round_bf16(fm_tensor *t) {
    fm_tensor *h = fm_to_dtype(t, FM_BF16), *r = h ? fm_to_dtype(h, FM_F32) : NULL;
    fm_tensor_release(h);
    return r;
}

typedef struct geo {
    const char *name;
    int64_t N, C, H, W, O, k;
    int stride, pad, dil, groups;
    bool bias;
} geo;

/* y and the three gradients of conv2d(x, w, b) . gy; mixed: fm_conv2d_mixed */
static void run(const geo *s, fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *gy, bool mixed, fm_tensor **out) {
    fm_conv2d_params p = fm_conv2d_default_params();
    p.stride[0] = p.stride[1] = s->stride;
    p.padding[0] = p.padding[1] = s->pad;
    p.dilation[0] = p.dilation[1] = s->dil;
    p.groups = s->groups;
    fm_tensor *leaves[3] = {x, w, b};
    for (int i = 0; i < 3; i++)
        if (leaves[i]) fm_tensor_requires_grad_(leaves[i], true);
    fm_tensor *y = mixed ? fm_conv2d_mixed(x, w, b, &p, FM_BF16) : fm_conv2d(x, w, b, &p);
    fm_tensor *prod = y ? fm_mul(y, gy) : NULL, *l = prod ? fm_sum(prod, 0, NULL, false) : NULL;
    CHECK_MSG(l && fm_backward(l, NULL, false) == FM_OK, "%s: %s", s->name, fm_last_error());
    out[0] = y;
    for (int i = 0; i < 3; i++) {
        out[1 + i] = leaves[i] && leaves[i]->grad ? fm_clone(leaves[i]->grad) : NULL;
        if (leaves[i]) {
            fm_tensor_zero_grad(leaves[i]);
            fm_tensor_requires_grad_(leaves[i], false);
        }
    }
    fm_tensor_release_n(2, prod, l);
}

static void release4(fm_tensor **t) { fm_tensor_release_n(4, t[0], t[1], t[2], t[3]); }

static void check_geo(const geo *s, fm_rng *r) {
    int64_t Ho = (s->H + 2 * s->pad - s->dil * (s->k - 1) - 1) / s->stride + 1;
    int64_t Wo = (s->W + 2 * s->pad - s->dil * (s->k - 1) - 1) / s->stride + 1;
    fm_tensor *x = fm_tensor_randn(4, (int64_t[]){s->N, s->C, s->H, s->W}, FM_F32, r);
    fm_tensor *w = fm_tensor_randn(4, (int64_t[]){s->O, s->C / s->groups, s->k, s->k}, FM_F32, r);
    fm_tensor *b = s->bias ? fm_tensor_randn(1, (int64_t[]){s->O}, FM_F32, r) : NULL;
    fm_tensor *gy = fm_tensor_randn(4, (int64_t[]){s->N, s->O, Ho, Wo}, FM_F32, r);
    fm_tensor *xr = round_bf16(x), *wr = round_bf16(w), *gyr = round_bf16(gy);
    fm_tensor *m[4], *ref[4], *refb[4], *plain[4];
    run(s, x, w, b, gy, true, m);
    run(s, x, w, b, gy, false, plain);
    int64_t K = s->C / s->groups * s->k * s->k;
    if (K < 16) { /* the 9-long first layer: f32 products, bitwise fm_conv2d's */
        for (int i = 0; i < 4; i++)
            CHECK_MSG(!plain[i] || t_rel_err(m[i], plain[i]) == 0, "%s: output %d differs from the f32 conv2d (%g)", s->name, i,
                      t_rel_err(m[i], plain[i]));
    } else {
        run(s, xr, wr, b, gyr, false, ref); /* y (bias unrounded: f32 in both), dx, dw from rounded dy */
        run(s, xr, wr, b, gy, false, refb); /* db from the unrounded dy */
        const char *what[4] = {"output", "input gradient", "weight gradient", "bias gradient"};
        fm_tensor *want[4] = {ref[0], ref[1], ref[2], refb[3]};
        for (int i = 0; i < 4; i++) {
            if (!want[i]) continue;
            double e = t_rel_err(m[i], want[i]);
            CHECK_MSG(e < 1e-5, "%s: %s differs from the f32 conv2d on bf16-rounded values by %g of its largest", s->name,
                      what[i], e);
        }
        /* and the bf16 rounding is really there (the bias gradient is f32 in both) */
        for (int i = 0; i < 3; i++) {
            double e = t_rel_err(m[i], plain[i]);
            CHECK_MSG(e > 1e-4 && e < 2e-2, "%s: %s against the unrounded f32 conv2d: %g (bf16 rounding expected)", s->name,
                      what[i], e);
        }
        release4(ref);
        release4(refb);
    }
    CHECK_MSG(m[0] && m[0]->dtype == FM_F32 && m[1] && m[1]->dtype == FM_F32 && m[2] && m[2]->dtype == FM_F32,
              "%s: the mixed conv2d's output and gradients are f32", s->name);
    release4(m);
    release4(plain);
    fm_tensor_release_n(7, x, w, b, gy, xr, wr, gyr);
}

/* The nn modules under bf16 autocast take the mixed ops: f32 outputs and gradients. */
static void modules(void) {
    fm_rng r;
    fm_rng_init(&r, 9);
    fm_module *m = fm_nn_sequential();
    fm_sequential_add(m, fm_nn_conv2d(4, 16, 3, 1, 1, true, &r));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_FLATTEN));
    fm_sequential_add(m, fm_nn_linear(16 * 8 * 8, 10, true, &r));
    fm_tensor *x = fm_tensor_randn(4, (int64_t[]){3, 4, 8, 8}, FM_F32, &r);
    CHECK(fm_mixed_lowp(x, x) == FM_F32); /* no autocast: no mixing */
    fm_tensor *ref = fm_module_forward(m, x);
    fm_dtype prev = fm_autocast_set(FM_BF16);
    CHECK(fm_mixed_lowp(x, x) == FM_BF16);
    fm_tensor *y = fm_module_forward(m, x);
    fm_autocast_set(prev);
    CHECK_MSG(y && y->dtype == FM_F32, "module under bf16 autocast: %s", y ? fm_dtype_name(y->dtype) : fm_last_error());
    double e = t_rel_err(y, ref);
    CHECK_MSG(e > 0 && e < 2e-2, "module output under bf16 autocast vs f32: %g of the largest", e);
    fm_tensor *s = y ? fm_sum(y, 0, NULL, false) : NULL;
    CHECK(s && fm_backward(s, NULL, false) == FM_OK);
    fm_named_list ps = {0};
    CHECK(fm_module_parameters(m, &ps) == FM_OK && ps.n == 4);
    for (int i = 0; i < ps.n; i++) {
        fm_tensor *g = ps.items[i].tensor->grad;
        CHECK_MSG(g && g->dtype == FM_F32 && t_max_abs(g) > 0, "%s's gradient", ps.items[i].name);
    }
    fm_named_list_free(&ps);
    fm_tensor_release_n(4, x, ref, y, s);
    fm_module_free(m);
}

int main(void) {
    fm_rng r;
    fm_rng_init(&r, 21);
    const geo geos[] = {
        {"3x3 pad 1, three chunks", 7, 16, 24, 24, 24, 3, 1, 1, 1, 1, true},
        {"3x3 pad 1, small images", 5, 32, 7, 7, 64, 3, 1, 1, 1, 1, true},
        {"stride 2, dilation 2, no bias", 3, 8, 13, 11, 12, 3, 2, 0, 2, 1, false},
        {"groups 2", 4, 16, 9, 9, 8, 3, 1, 1, 1, 2, true},
        {"1x1", 4, 32, 6, 6, 16, 1, 1, 0, 1, 1, true},
        {"5x5 stride 2 pad 2", 2, 3, 17, 17, 8, 5, 2, 2, 1, 1, true},
        {"first layer, K = 9", 6, 1, 28, 28, 32, 3, 1, 1, 1, 1, true},
    };
    for (size_t i = 0; i < sizeof geos / sizeof geos[0]; i++) check_geo(&geos[i], &r);
    modules();
    fm_parallel_shutdown();
    TEST_DONE();
}
