/* The tape: accumulation, retain_graph and the freed-graph error, no-grad
 * scopes, detach, hooks, non-leaf retain_grad, a deep chain. And the gradient
 * check itself (tests/gradcheck.h): NaN and infinite gradients must fail it. */
#include "core/parallel.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "test_util.h"
#include "gradcheck.h"

static fm_tensor *double_it(fm_tensor *g, void *ctx) { (*(int *)ctx)++; return fm_mul_scalar(g, 2.0); }
static void post(fm_tensor *t, void *ctx) { (void)t; (*(int *)ctx)++; }

static fm_tensor *gc_sqrt(fm_tensor **in, void *ctx) { (void)ctx; return fm_sqrt(in[0]); }
/* sqrt(x * x) = |x|: at 0 the forward and the numeric gradient are finite (0),
 * but the analytic one is 0 * inf = NaN (d sqrt/du is infinite at u = 0). */
static fm_tensor *gc_sqrt_sq(fm_tensor **in, void *ctx) {
    (void)ctx;
    fm_tensor *sq = fm_mul(in[0], in[0]), *y = sq ? fm_sqrt(sq) : NULL;
    fm_tensor_release(sq);
    return y;
}

/* gradcheck on x = {x0, 4}: the second element is always well behaved, so a
 * check that skipped non-finite elements would pass. */
static int gradcheck_sqrt_at(gc_fn fn, double x0, const char *name) {
    int64_t s[1] = {2};
    fm_tensor *x = fm_tensor_from_data((double[]){x0, 4}, 1, s, FM_F64);
    fm_tensor_requires_grad_(x, true);
    int ok = gradcheck(name, fn, 1, &x, NULL, 1e-6, 1e-6);
    fm_tensor_release(x);
    return ok;
}

static void test_gradcheck_can_fail(void) {
    CHECK(gc_error(1.0, 1.0) == 0);
    CHECK(isinf(gc_error(NAN, 1.0)) && isinf(gc_error(1.0, NAN)));
    CHECK(isinf(gc_error(INFINITY, 1.0)) && isinf(gc_error(1.0, -INFINITY)));
    fprintf(stderr, "test_autograd: the next three gradcheck failures are expected\n");
    CHECK(gradcheck_sqrt_at(gc_sqrt, 1.0, "sqrt at 1 (finite: must pass)"));
    CHECK(!gradcheck_sqrt_at(gc_sqrt, -1.0, "sqrt at -1 (NaN forward and gradients: must fail)"));
    CHECK(!gradcheck_sqrt_at(gc_sqrt, 0.0, "sqrt at 0 (infinite analytic gradient: must fail)"));
    CHECK(!gradcheck_sqrt_at(gc_sqrt_sq, 0.0, "sqrt(x*x) at 0 (NaN analytic, finite numeric: must fail)"));
}

int main(void) {
    int64_t s[1] = {3};
    fm_tensor *x = fm_tensor_from_data((double[]){1, 2, 3}, 1, s, FM_F64);
    fm_tensor_requires_grad_(x, true);
    /* y = sum(x * x + x): dy/dx = 2x + 1, used twice -> accumulates */
    fm_tensor *xx = fm_mul(x, x), *y1 = fm_add(xx, x), *y = fm_sum(y1, 0, NULL, false);
    CHECK(y && y->requires_grad && !fm_tensor_is_leaf(y));
    CHECK(fm_backward(y, NULL, true) == FM_OK);
    CHECK(x->grad && fm_tensor_get(x->grad, 0) == 3 && fm_tensor_get(x->grad, 2) == 7);
    CHECK(fm_backward(y, NULL, false) == FM_OK); /* retained: a second pass works and accumulates */
    CHECK(fm_tensor_get(x->grad, 1) == 10);
    CHECK(fm_backward(y, NULL, false) != FM_OK); /* freed now */
    CHECK(fm_last_status() == FM_ERR_STATE);
    CHECK_ERR_CONTAINS("second time");
    fm_tensor_release_n(3, xx, y1, y);

    /* backward of a non-scalar needs a gradient */
    fm_tensor *z = fm_mul_scalar(x, 3.0);
    CHECK(fm_backward(z, NULL, false) != FM_OK);
    CHECK_ERR_CONTAINS("single-element");
    fm_tensor_release(z);

    /* no-grad scope and detach */
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *ng = fm_mul(x, x);
    fm_set_grad_enabled(prev);
    CHECK(ng && !ng->requires_grad && ng->grad_fn == NULL);
    fm_tensor *d = fm_detach(x);
    CHECK(d && !d->requires_grad && d->storage == x->storage);
    fm_tensor_release_n(2, ng, d);

    /* hooks: a gradient hook that doubles, a post-accumulate hook that counts */
    fm_tensor_zero_grad(x);
    int calls = 0, posts = 0;
    CHECK(fm_tensor_register_hook(x, double_it, &calls) == FM_OK);
    CHECK(fm_tensor_register_post_accumulate_hook(x, post, &posts) == FM_OK);
    fm_tensor *h1 = fm_mul_scalar(x, 5.0), *h2 = fm_sum(h1, 0, NULL, false);
    fm_tensor_retain_grad(h1);
    CHECK(fm_backward(h2, NULL, false) == FM_OK);
    CHECK(calls == 1 && posts == 1);
    CHECK(fm_tensor_get(x->grad, 0) == 10);
    CHECK(h1->grad && fm_tensor_get(h1->grad, 0) == 1); /* retained non-leaf grad */
    fm_tensor_release_n(2, h1, h2);

    /* requires_grad on an integer tensor is refused */
    fm_tensor *it = fm_tensor_zeros(1, s, FM_I64, FM_CPU);
    CHECK(fm_tensor_requires_grad_(it, true) != FM_OK);
    CHECK_ERR_CONTAINS("floating-point");
    fm_tensor_release(it);

    /* a deep chain (no recursion limits on backward or release) */
    fm_tensor *w = fm_tensor_ones(1, s, FM_F32, FM_CPU);
    fm_tensor_requires_grad_(w, true);
    fm_tensor *cur = fm_tensor_retain(w);
    for (int i = 0; i < 20000; i++) {
        fm_tensor *nx = fm_mul_scalar(cur, 1.0);
        fm_tensor_release(cur);
        cur = nx;
    }
    fm_tensor *tot = fm_sum(cur, 0, NULL, false);
    CHECK(fm_backward(tot, NULL, false) == FM_OK);
    CHECK(w->grad && fm_tensor_get(w->grad, 0) == 1);
    fm_tensor_release_n(3, cur, tot, w);
    fm_tensor_release(x);
    test_gradcheck_can_fail();
    fm_parallel_shutdown();
    TEST_DONE();
}
