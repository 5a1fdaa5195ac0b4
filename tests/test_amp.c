/* Autocast: matmul/linear run in bf16 and f16 with f32 accumulation, results
 * stay close to f32, gradients reach the f32 master weights as f32, mixed-dtype
 * adds promote under autocast and are refused outside it. */
#include "core/parallel.h"
#include "fathom/amp.h"
#include "fathom/fathom.h"
#include "test_util.h"

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
    fm_parallel_shutdown();
    TEST_DONE();
}
