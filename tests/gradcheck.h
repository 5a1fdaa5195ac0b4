/* Finite-difference gradient check, for tests (include after test_util.h).
 *
 * gradcheck(name, fn, n, inputs, ctx, eps, tol): fn(inputs, ctx) returns a tensor y (any
 * shape). The check forms L = sum(y * W) with a fixed pseudo-random W, so every
 * output element matters, gets analytic gradients by backward, and compares them
 * with central differences (L(x+eps) - L(x-eps)) / 2eps for every element of
 * every input that requires grad. Inputs should be f64 (and may be non-contiguous
 * views or broadcast-expanded tensors: the perturbation goes through the view).
 * A NaN or infinite gradient, analytic or numeric, fails the check (gc_error); the
 * self-test in tests/test_autograd.c feeds it such gradients and expects failure. */
#ifndef FATHOM_GRADCHECK_H
#define FATHOM_GRADCHECK_H
#include <math.h>
#include <stdio.h>
#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "fathom/tensor.h"

typedef fm_tensor *(*gc_fn)(fm_tensor **inputs, void *ctx);

static double gc_loss(fm_tensor *y, fm_tensor *w) {
    if (!y) return NAN; /* the perturbed forward failed: fails the check below */
    double s = 0;
    int64_t n = fm_tensor_numel(y);
    for (int64_t i = 0; i < n; i++) s += fm_tensor_get(y, i) * fm_tensor_get(w, i);
    return s;
}

/* The error of one element, relative to the numeric gradient's size; infinite when
 * either gradient is NaN or infinite, so that such an element is always the worst
 * and always fails (a plain `err > worst` comparison is false for NaN). */
static double gc_error(double numeric, double analytic) {
    if (!isfinite(numeric) || !isfinite(analytic)) return INFINITY;
    return fabs(numeric - analytic) / (1.0 + fabs(numeric));
}

/* Returns 1 on pass, 0 on failure (and prints the worst element). */
static int gradcheck(const char *name, gc_fn fn, int n, fm_tensor **inputs, void *ctx, double eps, double tol) {
    int ok = 1;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) fm_tensor_zero_grad(inputs[i]);
    fm_tensor *y = fn(inputs, ctx);
    if (!y) { fprintf(stderr, "gradcheck %s: forward failed: %s\n", name, fm_last_error()); return 0; }
    fm_rng r; fm_rng_init(&r, 1234);
    fm_tensor *w = fm_tensor_randn(y->ndim, y->shape, FM_F64, &r);
    fm_tensor *yw = NULL, *yf = y;
    if (y->dtype != FM_F64) yf = fm_to_dtype(y, FM_F64);
    yw = fm_mul(yf, w);
    fm_tensor *L = fm_sum(yw, 0, NULL, false);
    if (!L || fm_backward(L, NULL, false) != FM_OK) {
        fprintf(stderr, "gradcheck %s: backward failed: %s\n", name, fm_last_error());
        ok = 0;
    }
    fm_tensor_release(L); fm_tensor_release(yw);
    if (yf != y) fm_tensor_release(yf);
    fm_tensor_release(y);
    bool prev = fm_set_grad_enabled(false);
    for (int i = 0; ok && i < n; i++) {
        fm_tensor *x = inputs[i];
        if (!x || !x->requires_grad) continue;
        if (!x->grad) { fprintf(stderr, "gradcheck %s: input %d got no grad\n", name, i); ok = 0; break; }
        int64_t ne = fm_tensor_numel(x);
        double worst = 0; int64_t worst_i = -1; double wa = 0, wn = 0;
        for (int64_t e = 0; e < ne; e++) {
            double x0 = fm_tensor_get(x, e);
            fm_tensor_set(x, e, x0 + eps);
            fm_tensor *yp = fn(inputs, ctx);
            double lp = gc_loss(yp, w);
            fm_tensor_set(x, e, x0 - eps);
            fm_tensor *ym = fn(inputs, ctx);
            double lm = gc_loss(ym, w);
            fm_tensor_set(x, e, x0);
            fm_tensor_release(yp); fm_tensor_release(ym);
            double num = (lp - lm) / (2 * eps);
            double ana = fm_tensor_get(x->grad, e);
            double err = gc_error(num, ana);
            if (worst_i < 0 || err > worst) { worst = err; worst_i = e; wa = ana; wn = num; }
        }
        if (!(worst <= tol)) {
            fprintf(stderr, "gradcheck %s: input %d element %lld analytic %.10g numeric %.10g (err %.3g > %.3g)\n",
                    name, i, (long long)worst_i, wa, wn, worst, tol);
            ok = 0;
        }
    }
    fm_set_grad_enabled(prev);
    fm_tensor_release(w);
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) fm_tensor_zero_grad(inputs[i]);
    return ok;
}
#endif
