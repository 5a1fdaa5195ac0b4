/* Tests of the elementwise ops: values against libm in every supported dtype,
 * broadcasting, non-contiguous views; f64 gradient checks; bad input. */
#include <math.h>

#include "backend/scalar_math.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "gradcheck.h"
#include "op_test.h"
#include "test_util.h"

static fm_tensor *from(const double *v, int ndim, const int64_t *shape, fm_dtype dt) {
    fm_tensor *t = fm_tensor_empty(ndim, shape, dt, FM_CPU);
    int64_t n = fm_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) fm_tensor_set(t, i, v[i]);
    return t;
}

typedef fm_tensor *(*unary_fn)(fm_tensor *);
static double ref_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2)); }
/* 0.5 x (1 + tanh u) written without cancellation in the left tail */
static double ref_gelu_tanh(double x) { return x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double ref_relu(double x) { return x > 0 ? x : 0; }
static double ref_silu(double x) { return x / (1 + exp(-x)); }
static double ref_softplus(double x) { return log1p(exp(x)); } /* log(1 + e^x) */
static double ref_neg(double x) { return -x; }
static double ref_rsqrt(double x) { return 1 / sqrt(x); }
static double ref_leaky(double x) { return x > 0 ? x : 0.1 * x; }
static double ref_clamp(double x) { return x < -0.5 ? -0.5 : (x > 0.7 ? 0.7 : x); }
static fm_tensor *leaky01(fm_tensor *x) { return fm_leaky_relu(x, 0.1); }
static fm_tensor *clamp_ab(fm_tensor *x) { return fm_clamp(x, -0.5, 0.7); }

static double ref_round(double x) { return nearbyint(x); } /* half to even */
static double ref_sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : x; }

/* Where each op is tested: all reals, x > 0, |x| < 1 (asin, acos, atanh), x > 1 (acosh). */
enum { DOM_REAL, DOM_POS, DOM_UNIT, DOM_ABOVE1 };
static const struct { const char *name; unary_fn fn; double (*ref)(double); int domain; } k_unary[] = {
    {"neg", fm_neg, ref_neg, 0}, {"abs", fm_abs, fabs, 0}, {"exp", fm_exp, exp, 0}, {"log", fm_log, log, DOM_POS},
    {"sqrt", fm_sqrt, sqrt, DOM_POS}, {"rsqrt", fm_rsqrt, ref_rsqrt, DOM_POS}, {"sin", fm_sin, sin, 0}, {"cos", fm_cos, cos, 0},
    {"tan", fm_tan, tan, 0}, {"asin", fm_asin, asin, DOM_UNIT}, {"acos", fm_acos, acos, DOM_UNIT}, {"atan", fm_atan, atan, 0},
    {"sinh", fm_sinh, sinh, 0}, {"cosh", fm_cosh, cosh, 0}, {"asinh", fm_asinh, asinh, 0},
    {"acosh", fm_acosh, acosh, DOM_ABOVE1}, {"atanh", fm_atanh, atanh, DOM_UNIT}, {"erf", fm_erf, erf, 0},
    {"floor", fm_floor, floor, 0}, {"ceil", fm_ceil, ceil, 0}, {"round", fm_round, ref_round, 0}, {"sign", fm_sign, ref_sign, 0},
    {"tanh", fm_tanh, tanh, 0}, {"sigmoid", fm_sigmoid, ref_sigmoid, 0}, {"relu", fm_relu, ref_relu, 0},
    {"leaky_relu", leaky01, ref_leaky, 0}, {"gelu", fm_gelu, ref_gelu, 0}, {"gelu_tanh", fm_gelu_tanh, ref_gelu_tanh, 0},
    {"silu", fm_silu, ref_silu, 0}, {"clamp", clamp_ab, ref_clamp, 0}, {"softplus", fm_softplus, ref_softplus, 0},
};
enum { N_UNARY = sizeof k_unary / sizeof k_unary[0] };

static int find_unary(const char *name) {
    for (int i = 0; i < N_UNARY; i++) if (!strcmp(k_unary[i].name, name)) return i;
    return -1;
}

/* Outputs of 8 MiB and more take the non-temporal store path (elementwise_cpu.c):
 * over 2M + 5 elements (a masked tail after the streamed part, split over the
 * threads), each result must equal the same op on the same values in a small
 * tensor, bit for bit. */
static void large_output_check(const char *name, fm_tensor *(*un)(fm_tensor *), fm_tensor *(*bin)(fm_tensor *, fm_tensor *)) {
    const int64_t n = (2 << 20) + 5, n_small = 19;
    fm_tensor *a = op_randn(1, &n, FM_F32, 91), *b = op_randn(1, &n, FM_F32, 92);
    fm_tensor *y = un ? un(a) : bin(a, b);
    CHECK_MSG(y != NULL, "%s large: %s", name, fm_last_error());
    const float *pa = fm_tensor_data(a), *pb = fm_tensor_data(b), *py = y ? fm_tensor_data(y) : NULL;
    float va[19], vb[19];
    int64_t idx[19];
    for (int k = 0; k < n_small; k++) {
        idx[k] = k < 6 ? n - 1 - k : (int64_t)k * 110359 % n; /* the tail and spread-out elements */
        va[k] = pa[idx[k]];
        vb[k] = pb[idx[k]];
    }
    fm_tensor *sa = fm_tensor_from_data(va, 1, &n_small, FM_F32), *sb = fm_tensor_from_data(vb, 1, &n_small, FM_F32);
    fm_tensor *sy = un ? un(sa) : bin(sa, sb);
    for (int k = 0; py && sy && k < n_small; k++)
        CHECK_MSG(py[idx[k]] == fm_tensor_get(sy, k), "%s large [%lld]: %.9g vs %.9g", name, (long long)idx[k],
                  py[idx[k]], fm_tensor_get(sy, k));
    fm_tensor_release_n(6, a, b, y, sa, sb, sy);
}

/* ---- GELU in f32: the SIMD kernels against double, densely ----
 * The f32 kernels evaluate Phi with their own polynomial (simd_avx2.h), so the
 * 37-point check above is not enough: sweep [-10, 10] (20001 points, not a
 * multiple of 8) plus the far tails and specials, forward and backward, with
 * bounds a few ulp wide. Relative bounds hold down to the smallest normal
 * results, so the left tail is checked too (no 1 + erf cancellation). */
static double phi_pdf(double x) { return exp(-0.5 * x * x) / sqrt(2 * M_PI); }
static double dref_gelu(double x) { return 0.5 * erfc(-x / sqrt(2)) + x * phi_pdf(x); }
/* |Phi(x)| + |x phi(x)|: the size of the derivative's two terms */
static double dscale_gelu(double x) { return 0.5 * erfc(-x / sqrt(2)) + fabs(x) * phi_pdf(x); }
static const double k_c = 0.044715, k_s2pi = 0.79788456080286536;
/* d/dx x s(2u) = s + 2 x s (1 - s) u', s the logistic function of 2u */
static double sig2u(double x) { return 1 / (1 + exp(-2 * k_s2pi * (x + k_c * x * x * x))); }
static double dterm2_gelu_tanh(double x) {
    double s = sig2u(x);
    return 2 * x * s * (1 - s) * k_s2pi * (1 + 3 * k_c * x * x);
}
static double dref_gelu_tanh(double x) { return sig2u(x) + dterm2_gelu_tanh(x); }
static double dscale_gelu_tanh(double x) { return sig2u(x) + fabs(dterm2_gelu_tanh(x)); }

static void gelu_f32_sweep(const char *name) {
    bool tanh_form = !strcmp(name, "gelu_tanh");
    unary_fn fn = tanh_form ? fm_gelu_tanh : fm_gelu;
    double (*ref)(double) = tanh_form ? ref_gelu_tanh : ref_gelu, (*dref)(double) = tanh_form ? dref_gelu_tanh : dref_gelu;
    double (*dscale)(double) = tanh_form ? dscale_gelu_tanh : dscale_gelu;
    const int64_t n_sweep = 20001, n_extra = 15, n = n_sweep + n_extra;
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n_sweep; i++) v[i] = (float)(-10.0 + 20.0 * (double)i / (double)(n_sweep - 1));
    const float extra[15] = {12.5f, -12.5f, 13.5f, -13.5f, -30.0f, 30.0f, 1e30f, -1e30f, 1e-30f, -1e-30f,
                             0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    memcpy(v + n_sweep, extra, sizeof extra);
    fm_tensor *x = fm_tensor_from_data(v, 1, &n, FM_F32);
    fm_tensor_requires_grad_(x, true);
    fm_tensor *y = fn(x);
    fm_tensor *ones = fm_tensor_ones(1, &n, FM_F32, FM_CPU);
    CHECK_MSG(y && fm_backward(y, ones, false) == FM_OK && x->grad, "%s f32 sweep: %s", name, fm_last_error());
    double worst_f = 0, worst_b = 0, abs_f = 0, abs_b = 0;
    for (int64_t i = 0; y && x->grad && i < n; i++) {
        double xi = v[i], got = fm_tensor_get(y, i), dgot = fm_tensor_get(x->grad, i);
        if (isnan(xi) || isinf(xi)) {
            /* as x Phi(x) in double: inf at +inf, NaN (-inf * 0) at -inf */
            CHECK_MSG(xi == INFINITY ? got == INFINITY : isnan(got), "%s(%g) = %g", name, xi, got);
            continue;
        }
        double want = ref(xi), dwant = dref(xi);
        /* the tanh form rounds its exp argument 2u in f32 (a few ulp): relative error grows as |2u| ulp */
        double u = k_s2pi * (xi + k_c * xi * xi * xi), tol = tanh_form ? 1e-6 + 2e-7 * fabs(2 * u) : 1e-6;
        /* backward: relative to the size of the derivative's two terms (their sum crosses 0 near x = -0.75) */
        double scale = dscale(xi), ef = fabs(got - want), eb = fabs(dgot - dwant);
        /* relative, with an absolute slack of about FLT_MIN where the result underflows */
        CHECK_MSG(ef <= tol * fabs(want) + 2e-38, "%s f32 x=%.9g: got %.9g want %.9g", name, xi, got, want);
        CHECK_MSG(eb <= tol * scale + 2e-38, "%s' f32 x=%.9g: got %.9g want %.9g", name, xi, dgot, dwant);
        if (fabs(want) > 1e-37 && ef / fabs(want) > worst_f) worst_f = ef / fabs(want);
        if (ef > abs_f) abs_f = ef;
        if (eb > abs_b) abs_b = eb;
        if (scale > 1e-37 && eb / scale > worst_b) worst_b = eb / scale;
    }
    if (getenv("FATHOM_TEST_VERBOSE")) /* the figures docs/PERFORMANCE.md quotes */
        fprintf(stderr, "%s f32 sweep of [-10, 10] and the tails: forward max abs err %.3g, max rel err %.3g; backward max abs err %.3g, "
                "max err relative to |both terms| %.3g\n", name, abs_f, worst_f, abs_b, worst_b);
    fm_tensor_release_n(3, x, y, ones);
    free(v);
}

/* backend/scalar_math.h in float (the CUDA f32/f16/bf16 math, compiled here for the
 * host) against its double instantiation (the CPU's reference): each function and
 * derivative within a few float ulp of the double value over [-12, 12] (relative to
 * the size of a derivative's terms, since silu' and gelu' cross 0), so the two
 * backends evaluate one formula. */
static void scalar_math_float_check(void) {
    static const struct { const char *name; float (*f)(float); double (*d)(double); } fns[] = {
        {"sigmoid", fm_sigmoid_f, fm_sigmoid_d}, {"silu", fm_silu_f, fm_silu_d}, {"silu'", fm_silu_deriv_f, fm_silu_deriv_d},
        {"gelu", fm_gelu_f, fm_gelu_d}, {"gelu'", fm_gelu_deriv_f, fm_gelu_deriv_d},
        {"gelu_tanh", fm_gelu_tanh_f, fm_gelu_tanh_d}, {"gelu_tanh'", fm_gelu_tanh_deriv_f, fm_gelu_tanh_deriv_d},
        {"softplus", fm_softplus_f, fm_softplus_d}, {"softplus'", fm_softplus_deriv_f, fm_softplus_deriv_d},
    };
    for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++) {
        for (int i = 0; i <= 4800; i++) {
            float x = (float)(-12.0 + 24.0 * i / 4800.0);
            double want = fns[k].d((double)x), got = fns[k].f(x);
            /* exp's argument is rounded to float: error grows with |x| (and |x|^3 for tanh GELU) */
            double tol = 4e-7 * (1 + fabs((double)x) * (1 + 0.044715 * 3 * (double)x * (double)x)) * (fabs(want) + (strchr(fns[k].name, '\'') ? 0.1 : 1e-3));
            double e = fabs(got - want);
            CHECK_MSG(e <= tol, "scalar_math %s: float %.9g vs double %.9g at x=%.9g", fns[k].name, got, want, (double)x);
        }
    }
}

/* relu(-inf) is 0 and relu(+inf) is +inf, as in PyTorch (0 * -inf would give NaN), in
 * the SIMD body (indices 0-2) and the masked tail (index 17), f32 and f64; -1 gives +0 */
static void relu_infinities(void) {
    const int64_t n = 18;
    float v[18] = {-INFINITY, INFINITY, -1.0f, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, -INFINITY};
    for (int f64 = 0; f64 < 2; f64++) {
        fm_tensor *x32 = fm_tensor_from_data(v, 1, &n, FM_F32);
        fm_tensor *x = f64 ? fm_to_dtype(x32, FM_F64) : x32, *y = fm_relu(x);
        CHECK_MSG(y && fm_tensor_get(y, 0) == 0 && fm_tensor_get(y, 17) == 0 && fm_tensor_get(y, 1) == INFINITY,
                  "relu(-inf) %g / %g, relu(inf) %g (%s)", y ? fm_tensor_get(y, 0) : -1.0,
                  y ? fm_tensor_get(y, 17) : -1.0, y ? fm_tensor_get(y, 1) : -1.0, f64 ? "f64" : "f32");
        CHECK_MSG(y && !signbit(fm_tensor_get(y, 2)), "relu(-1) is -0, not +0 (%s)", f64 ? "f64" : "f32");
        if (f64) fm_tensor_release(x);
        fm_tensor_release_n(2, x32, y);
    }
}

/* round is half to even (ONNX's Round, torch.round) in f32 and f64; sign keeps -0 and
 * NaN; sign, floor and round take integer tensors (exact, the input's dtype). */
static void rounding_specials(void) {
    const int64_t n = 9;
    const double v[9] = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, -0.0, 7};
    const double want_round[9] = {0, 2, 2, -0.0, -2, -2, 2, -0.0, 7}, want_sign[9] = {1, 1, 1, -1, -1, -1, 1, -0.0, 1};
    for (int f64 = 0; f64 < 2; f64++) {
        fm_tensor *x = from(v, 1, &n, f64 ? FM_F64 : FM_F32), *r = fm_round(x), *s = fm_sign(x);
        for (int i = 0; r && s && i < n; i++) {
            CHECK_MSG(fm_tensor_get(r, i) == want_round[i], "round(%g) = %g", v[i], fm_tensor_get(r, i));
            CHECK_MSG(fm_tensor_get(s, i) == want_sign[i] && signbit(fm_tensor_get(s, i)) == signbit(want_sign[i]),
                      "sign(%g) = %g", v[i], fm_tensor_get(s, i));
        }
        CHECK(r && s);
        fm_tensor_release_n(3, x, r, s);
    }
    const double vi[5] = {-7, 0, 3, -1, 12};
    fm_dtype idt[2] = {FM_I64, FM_I32};
    for (int d = 0; d < 2; d++) {
        const int64_t ni = 5;
        fm_tensor *x = from(vi, 1, &ni, idt[d]), *s = fm_sign(x), *f = fm_floor(x);
        CHECK_MSG(s && f && s->dtype == idt[d] && f->dtype == idt[d], "sign/floor of %s: %s", fm_dtype_name(idt[d]), fm_last_error());
        for (int i = 0; s && f && i < ni; i++)
            CHECK(fm_tensor_get(s, i) == ref_sign(vi[i]) && fm_tensor_get(f, i) == vi[i]);
        fm_tensor_release_n(3, x, s, f);
    }
    fm_tensor *b = fm_tensor_zeros(1, &n, FM_I64, FM_CPU), *t = fm_tan(b);
    CHECK_MSG(!t && strstr(fm_last_error(), "tan"), "tan of an integer tensor is refused: %s", fm_last_error());
    fm_tensor_release_n(2, b, t);
}

/* Values over a wide range, including the SIMD tails (n = 37 is not a multiple of 8). */
static int unary_forward_named(const char *name) {
    OP_BEGIN;
    int u = find_unary(name);
    const int64_t n = 37;
    double v[37];
    for (int i = 0; i < n; i++) {
        double x = -9.0 + 18.0 * i / (n - 1) + 0.013;
        int dom = k_unary[u].domain;
        v[i] = dom == DOM_POS ? fabs(x) + 0.01 : dom == DOM_UNIT ? x / 9.5 : dom == DOM_ABOVE1 ? fabs(x) + 1.01 : x;
    }
    fm_dtype dts[] = {FM_F32, FM_F64, FM_F16, FM_BF16};
    double tols[] = {2e-6, 1e-12, 2e-3, 1.6e-2};
    for (int d = 0; d < 4; d++) {
        fm_tensor *x = from(v, 1, &n, dts[d]);
        fm_tensor *y = k_unary[u].fn(x);
        CHECK_MSG(y != NULL, "%s %s: %s", name, fm_dtype_name(dts[d]), fm_last_error());
        if (y) {
            CHECK(y->dtype == dts[d]);
            for (int i = 0; i < n; i++) {
                double xi = fm_tensor_get(x, i), want = k_unary[u].ref(xi), got = fm_tensor_get(y, i);
                double err = fabs(got - want) / (1e-6 + fabs(want));
                if (dts[d] != FM_F64) err = fabs(got - want) / (fabs(want) + (dts[d] == FM_F32 ? 1e-4 : 1e-2));
                CHECK_MSG(err <= tols[d], "%s %s x=%g: got %.9g want %.9g", name, fm_dtype_name(dts[d]), xi, got, want);
            }
        }
        fm_tensor_release(y);
        fm_tensor_release(x);
    }
    /* a non-contiguous input (transposed 2-D view) */
    int64_t sh[2] = {4, 6};
    fm_rng r;
    fm_rng_init(&r, 7);
    fm_tensor *m = fm_tensor_rand(2, sh, FM_F32, &r);
    fm_tensor *ma = fm_add_scalar(m, k_unary[u].domain == DOM_ABOVE1 ? 1.1 : k_unary[u].domain == DOM_UNIT ? -0.5 : 0.1);
    fm_tensor *mt = fm_transpose(ma, 0, 1);
    fm_tensor *y = k_unary[u].fn(mt);
    CHECK(y && y->shape[0] == 6 && y->shape[1] == 4);
    for (int i = 0; y && i < 24; i++) {
        double xi = fm_tensor_get(mt, i);
        CHECK_NEAR(fm_tensor_get(y, i), k_unary[u].ref(xi), 1e-5);
    }
    fm_tensor_release_n(4, m, ma, mt, y);
    CHECK(k_unary[u].fn(NULL) == NULL);
    /* NaN propagates through every f32 path: in the SIMD body (index 3) and the masked tail (index 10) */
    const int64_t n_nan = 11;
    float vn[11] = {0.5f, -1.5f, 2.0f, NAN, 3.0f, -0.25f, 1.0f, 4.0f, 0.75f, 2.5f, NAN};
    fm_tensor *xn = fm_tensor_from_data(vn, 1, &n_nan, FM_F32), *yn = k_unary[u].fn(xn);
    CHECK_MSG(yn && isnan(fm_tensor_get(yn, 3)) && isnan(fm_tensor_get(yn, 10)), "%s(NaN) is not NaN", name);
    fm_tensor_release_n(2, xn, yn);
    if (!strcmp(name, "relu")) relu_infinities();
    if (!strcmp(name, "gelu") || !strcmp(name, "gelu_tanh")) gelu_f32_sweep(name);
    if (!strcmp(name, "gelu_tanh")) scalar_math_float_check();
    if (!strcmp(name, "round") || !strcmp(name, "sign")) rounding_specials();
    if (k_unary[u].domain == DOM_REAL) large_output_check(name, k_unary[u].fn, NULL);
    OP_END;
}

static fm_tensor *gc_unary(fm_tensor **in, void *ctx) { return ((unary_fn)ctx)(in[0]); }

static int unary_grad_named(const char *name) {
    OP_BEGIN;
    int u = find_unary(name);
    int64_t sh[2] = {3, 5};
    fm_rng r;
    fm_rng_init(&r, 11);
    fm_tensor *base = fm_tensor_randn(2, sh, FM_F64, &r);
    int dom = k_unary[u].domain;
    if (dom == DOM_UNIT || dom == DOM_ABOVE1)
        for (int i = 0; i < 15; i++) {
            double x = fm_tensor_get(base, i);
            fm_tensor_set(base, i, dom == DOM_UNIT ? 0.9 * x / (1 + fabs(x)) : fabs(x) + 1.2);
        }
    if (dom == DOM_POS || !strcmp(name, "abs") || !strcmp(name, "relu") || !strcmp(name, "leaky_relu") || !strcmp(name, "clamp")) {
        /* keep away from kinks (and from 0 for log/sqrt) so finite differences are valid */
        for (int i = 0; i < 15; i++) {
            double x = fm_tensor_get(base, i);
            double ax = fabs(x) + 0.2;
            if (!strcmp(name, "clamp")) ax = (i % 3 == 0) ? 0.9 + 0.1 * i : 0.05 * i - 0.3;
            fm_tensor_set(base, i, dom == DOM_POS ? ax : (x < 0 ? -ax : ax));
        }
    }
    /* gradient through a transposed (non-contiguous) leaf */
    fm_tensor *t = fm_transpose(base, 0, 1);
    fm_tensor *leaf = fm_detach(t);
    fm_tensor_requires_grad_(leaf, true);
    fm_tensor *ins[1] = {leaf};
    CHECK_MSG(gradcheck(name, gc_unary, 1, ins, (void *)k_unary[u].fn, 1e-6, 1e-6), "%s gradcheck", name);
    fm_tensor_release_n(3, base, t, leaf);
    OP_END;
}

#define UNARY_TESTS(nm, id)                                            \
    static int id##_fwd(void) { return unary_forward_named(nm); }      \
    static int id##_grad(void) { return unary_grad_named(nm); }        \
    OP_TEST(nm, id##_fwd, id##_grad)
UNARY_TESTS("neg", neg)
UNARY_TESTS("abs", abs_)
UNARY_TESTS("exp", exp_)
UNARY_TESTS("log", log_)
UNARY_TESTS("sqrt", sqrt_)
UNARY_TESTS("rsqrt", rsqrt)
UNARY_TESTS("sin", sin_)
UNARY_TESTS("cos", cos_)
UNARY_TESTS("tan", tan_)
UNARY_TESTS("asin", asin_)
UNARY_TESTS("acos", acos_)
UNARY_TESTS("atan", atan_)
UNARY_TESTS("sinh", sinh_)
UNARY_TESTS("cosh", cosh_)
UNARY_TESTS("asinh", asinh_)
UNARY_TESTS("acosh", acosh_)
UNARY_TESTS("atanh", atanh_)
UNARY_TESTS("erf", erf_)
UNARY_TESTS("floor", floor_)
UNARY_TESTS("ceil", ceil_)
UNARY_TESTS("round", round_)
UNARY_TESTS("sign", sign_)
UNARY_TESTS("tanh", tanh_)
UNARY_TESTS("sigmoid", sigmoid)
UNARY_TESTS("relu", relu)
UNARY_TESTS("leaky_relu", leaky_relu)
UNARY_TESTS("gelu", gelu)
UNARY_TESTS("gelu_tanh", gelu_tanh)
UNARY_TESTS("silu", silu)
UNARY_TESTS("clamp", clamp)
UNARY_TESTS("softplus", softplus)

/* ---- binary ---- */
typedef fm_tensor *(*binary_fn)(fm_tensor *, fm_tensor *);
static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
static double r_pow(double a, double b) { return pow(a, b); }
static double r_max(double a, double b) { return a > b ? a : b; }
static double r_min(double a, double b) { return a < b ? a : b; }
static double r_eq(double a, double b) { return a == b; }
static double r_ne(double a, double b) { return a != b; }
static double r_lt(double a, double b) { return a < b; }
static double r_le(double a, double b) { return a <= b; }
static double r_gt(double a, double b) { return a > b; }
static double r_ge(double a, double b) { return a >= b; }
static double r_fmod(double a, double b) { return b == 0 ? 0 : fmod(a, b); } /* integers by 0 give 0 */
static double r_rem(double a, double b) {
    if (b == 0) return 0;
    double r = fmod(a, b);
    return r != 0 && (r < 0) != (b < 0) ? r + b : r;
}
static const struct { const char *name; binary_fn fn; double (*ref)(double, double); int cmp, positive, intok; } k_bin[] = {
    {"add", fm_add, r_add, 0, 0, 1}, {"sub", fm_sub, r_sub, 0, 0, 1}, {"mul", fm_mul, r_mul, 0, 0, 1},
    {"div", fm_div, r_div, 0, 1, 0}, {"pow", fm_pow, r_pow, 0, 1, 0}, {"maximum", fm_maximum, r_max, 0, 0, 1},
    {"minimum", fm_minimum, r_min, 0, 0, 1}, {"eq", fm_eq, r_eq, 1, 0, 1}, {"ne", fm_ne, r_ne, 1, 0, 1},
    {"lt", fm_lt, r_lt, 1, 0, 1}, {"le", fm_le, r_le, 1, 0, 1}, {"gt", fm_gt, r_gt, 1, 0, 1}, {"ge", fm_ge, r_ge, 1, 0, 1},
    /* positive floats (no float division by 0); the integer cases have every sign and 0 */
    {"fmod", fm_fmod, r_fmod, 0, 1, 1}, {"remainder", fm_remainder, r_rem, 0, 1, 1},
};
static int find_bin(const char *n) {
    for (size_t i = 0; i < sizeof k_bin / sizeof k_bin[0]; i++) if (!strcmp(k_bin[i].name, n)) return (int)i;
    return -1;
}

static int binary_forward_named(const char *name) {
    OP_BEGIN;
    int b = find_bin(name);
    /* broadcasting [3,1,4] with [5,1]: result [3,5,4] */
    int64_t sa[3] = {3, 1, 4}, sb[2] = {5, 1};
    fm_dtype dts[] = {FM_F32, FM_F64, FM_F16, FM_BF16, FM_I32, FM_I64};
    for (int d = 0; d < 6; d++) {
        bool isint = dts[d] == FM_I32 || dts[d] == FM_I64;
        if (isint && !k_bin[b].intok) continue;
        fm_tensor *a = fm_tensor_empty(3, sa, dts[d], FM_CPU), *c = fm_tensor_empty(2, sb, dts[d], FM_CPU);
        for (int i = 0; i < 12; i++) fm_tensor_set(a, i, k_bin[b].positive ? 0.5 + 0.25 * i : (i % 5) - 2.0);
        for (int i = 0; i < 5; i++) fm_tensor_set(c, i, k_bin[b].positive ? 0.75 + 0.5 * i : (i % 3) - 1.0);
        if (isint) {
            for (int i = 0; i < 12; i++) fm_tensor_set(a, i, (i % 5) - 2);
            for (int i = 0; i < 5; i++) fm_tensor_set(c, i, (i % 3) - 1);
        }
        fm_tensor *y = k_bin[b].fn(a, c);
        CHECK_MSG(y != NULL, "%s %s: %s", name, fm_dtype_name(dts[d]), fm_last_error());
        if (y) {
            CHECK(y->ndim == 3 && y->shape[0] == 3 && y->shape[1] == 5 && y->shape[2] == 4);
            CHECK(y->dtype == (k_bin[b].cmp ? FM_BOOL : dts[d]));
            double tol = dts[d] == FM_F16 ? 2e-3 : (dts[d] == FM_BF16 ? 1.6e-2 : 1e-6);
            for (int i = 0; i < 3; i++) for (int j = 0; j < 5; j++) for (int k = 0; k < 4; k++) {
                double av = fm_tensor_get(a, i * 4 + k), cv = fm_tensor_get(c, j);
                double want = k_bin[b].ref(av, cv), got = fm_tensor_get(y, (i * 5 + j) * 4 + k);
                CHECK_MSG(fabs(got - want) <= tol * (1 + fabs(want)), "%s %s [%d,%d,%d]: %g vs %g", name,
                          fm_dtype_name(dts[d]), i, j, k, got, want);
            }
        }
        fm_tensor_release_n(3, a, c, y);
    }
    /* non-contiguous operands: a transposed view against a sliced view */
    int64_t s2[2] = {4, 6};
    fm_rng r;
    fm_rng_init(&r, 3);
    fm_tensor *m = fm_tensor_rand(2, s2, FM_F32, &r), *mt = fm_transpose(m, 0, 1);   /* [6,4] */
    int64_t s3[2] = {6, 8};
    fm_tensor *q = fm_tensor_rand(2, s3, FM_F32, &r), *qa = fm_add_scalar(q, 0.5);
    fm_tensor *qs = fm_slice(qa, 1, 0, 8, 2);                                            /* [6,4], stride 2 */
    fm_tensor *y = k_bin[b].fn(mt, qs);
    CHECK(y != NULL);
    for (int i = 0; y && i < 24; i++)
        CHECK_NEAR(fm_tensor_get(y, i), k_bin[b].ref(fm_tensor_get(mt, i), fm_tensor_get(qs, i)), 1e-5);
    fm_tensor_release_n(6, m, mt, q, qa, qs, y);
    /* the shapes whose dims the kernel merges (elementwise_cpu.c, coalesce): an SE block's
     * [N, C, 1, 1] scale over [N, C, H, W] (either side), [1, C, 1, W] with size-1 dims
     * between, a transposed operand with a broadcast one, and a [1, 1] scalar tensor */
    {
        const int64_t shp[][2][5] = {{{2, 5, 3, 7, 0}, {2, 5, 1, 1, 0}}, {{2, 1, 5, 1, 6}, {1, 1, 5, 1, 1}},
                                     {{3, 5, 4, 6, 0}, {1, 5, 1, 6, 0}}, {{4, 9, 0, 0, 0}, {1, 1, 0, 0, 0}}};
        const int nds[4] = {4, 5, 4, 2};
        for (int t = 0; t < 8; t++) {
            const int s = t % 4, nd = nds[s];
            int64_t sx[5], sy[5], n = 1, nb = 1;
            for (int i = 0; i < nd; i++) sx[i] = shp[s][0][i], sy[i] = shp[s][1][i], n *= sx[i], nb *= sy[i];
            fm_tensor *x = fm_tensor_rand(nd, sx, FM_F32, &r), *bc = fm_tensor_rand(nd, sy, FM_F32, &r), *xv = NULL;
            for (int64_t i = 0; i < nb; i++) fm_tensor_set(bc, i, k_bin[b].positive ? 0.5 + 0.01 * (double)i : 0.25 * (double)(i % 7) - 0.75);
            if (s == 2) { /* x as a transposed view of a [3, 5, 6, 4] tensor */
                int64_t st[4] = {3, 5, 6, 4};
                fm_tensor *base = fm_tensor_rand(4, st, FM_F32, &r);
                xv = fm_transpose(base, 2, 3);
                fm_tensor_release(base);
            } else xv = fm_tensor_retain(x);
            fm_tensor *z = t < 4 ? k_bin[b].fn(xv, bc) : k_bin[b].fn(bc, xv);
            CHECK_MSG(z && fm_tensor_numel(z) == n, "%s coalesced case %d: %s", name, t, z ? "wrong size" : fm_last_error());
            for (int64_t i = 0; z && i < n; i++) {
                int64_t rem = i, bi = 0, mul = 1;
                for (int d = nd - 1; d >= 0; d--) { /* the broadcast operand's element for output i */
                    const int64_t idx = rem % sx[d];
                    rem /= sx[d];
                    bi += (sy[d] == 1 ? 0 : idx) * mul, mul *= sy[d];
                }
                const double xv_i = fm_tensor_get(xv, i), bv = fm_tensor_get(bc, bi);
                const double want = t < 4 ? k_bin[b].ref(xv_i, bv) : k_bin[b].ref(bv, xv_i), got = fm_tensor_get(z, i);
                if (!(fabs(got - want) <= 1e-5 * (1 + fabs(want)))) {
                    CHECK_MSG(0, "%s coalesced case %d at %lld: %g vs %g", name, t, (long long)i, got, want);
                    break;
                }
            }
            fm_tensor_release_n(4, x, bc, xv, z);
        }
    }
    /* bad input: incompatible shapes and dtypes */
    int64_t x1[1] = {3}, x2[1] = {4};
    fm_tensor *p1 = fm_tensor_ones(1, x1, FM_F32, FM_CPU), *p2 = fm_tensor_ones(1, x2, FM_F32, FM_CPU);
    fm_tensor *p3 = fm_tensor_ones(1, x1, FM_F64, FM_CPU);
    CHECK(k_bin[b].fn(p1, p2) == NULL);
    CHECK_ERR_CONTAINS("[3] and [4]");
    CHECK(k_bin[b].fn(p1, p3) == NULL);
    CHECK_ERR_CONTAINS("dtype mismatch");
    fm_tensor_release_n(3, p1, p2, p3);
    if (!k_bin[b].cmp && !k_bin[b].positive) large_output_check(name, NULL, k_bin[b].fn);
    OP_END;
}

static fm_tensor *gc_bin(fm_tensor **in, void *ctx) { return ((binary_fn)ctx)(in[0], in[1]); }

static int binary_grad_named(const char *name) {
    OP_BEGIN;
    int b = find_bin(name);
    fm_rng r;
    fm_rng_init(&r, 5);
    int64_t sa[2] = {3, 4}, sb[1] = {4};
    fm_tensor *a = fm_tensor_rand(2, sa, FM_F64, &r), *c = fm_tensor_rand(1, sb, FM_F64, &r);
    for (int i = 0; i < 12; i++) fm_tensor_set(a, i, fm_tensor_get(a, i) + 0.5 + (i % 2 ? 0.0 : 1.1));
    for (int i = 0; i < 4; i++) fm_tensor_set(c, i, fm_tensor_get(c, i) + 0.5);
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(c, true);
    fm_tensor *ins[2] = {a, c}; /* c broadcasts over a's rows */
    CHECK_MSG(gradcheck(name, gc_bin, 2, ins, (void *)k_bin[b].fn, 1e-6, 1e-6), "%s gradcheck", name);
    fm_tensor_release_n(2, a, c);
    OP_END;
}

#define BIN_TESTS(nm, id)                                                \
    static int id##_fwd(void) { return binary_forward_named(nm); }       \
    static int id##_grad(void) { return binary_grad_named(nm); }         \
    OP_TEST(nm, id##_fwd, id##_grad)
#define CMP_TESTS(nm, id)                                                \
    static int id##_fwd(void) { return binary_forward_named(nm); }       \
    OP_TEST(nm, id##_fwd, NULL)
BIN_TESTS("add", add)
BIN_TESTS("sub", sub)
BIN_TESTS("mul", mul)
BIN_TESTS("div", div_)
BIN_TESTS("pow", pow_)
BIN_TESTS("maximum", maximum)
BIN_TESTS("minimum", minimum)
/* the sign rules on both sides of 0, floats and integers, and a float divisor of 0 (NaN) */
static int mod_signs(const char *name) {
    OP_BEGIN;
    const double a[6] = {-7, 7, -7, 7, -5.5, 5.5}, b[6] = {3, -3, -3, 3, 2, -2};
    const double want_fmod[6] = {-1, 1, -1, 1, -1.5, 1.5}, want_rem[6] = {2, -2, -1, 1, 0.5, -0.5};
    const bool rem = !strcmp(name, "remainder");
    for (int d = 0; d < 2; d++) {
        const fm_dtype dt = d ? FM_I64 : FM_F32;
        const int n = d ? 4 : 6;
        fm_tensor *x = fm_tensor_empty(1, (int64_t[]){n}, dt, FM_CPU), *yv = fm_tensor_empty(1, (int64_t[]){n}, dt, FM_CPU);
        for (int i = 0; i < n; i++) fm_tensor_set(x, i, a[i]), fm_tensor_set(yv, i, b[i]);
        fm_tensor *r = rem ? fm_remainder(x, yv) : fm_fmod(x, yv);
        for (int i = 0; r && i < n; i++)
            CHECK_MSG(fm_tensor_get(r, i) == (rem ? want_rem : want_fmod)[i], "%s(%g, %g) %s: %g", name, a[i], b[i], fm_dtype_name(dt),
                      fm_tensor_get(r, i));
        CHECK(r != NULL);
        fm_tensor_release_n(3, x, yv, r);
    }
    fm_tensor *x = fm_tensor_full(1, (int64_t[]){2}, 3.0, FM_F64, FM_CPU), *z = fm_tensor_zeros(1, (int64_t[]){2}, FM_F64, FM_CPU);
    fm_tensor *r = rem ? fm_remainder(x, z) : fm_fmod(x, z);
    CHECK(r && isnan(fm_tensor_get(r, 0)));
    fm_tensor_release_n(3, x, z, r);
    OP_END;
}
static int fmod_fwd(void) { return binary_forward_named("fmod") + mod_signs("fmod"); }
static int fmod_grad(void) { return binary_grad_named("fmod"); }
OP_TEST("fmod", fmod_fwd, fmod_grad)
static int remainder_fwd(void) { return binary_forward_named("remainder") + mod_signs("remainder"); }
static int remainder_grad(void) { return binary_grad_named("remainder"); }
OP_TEST("remainder", remainder_fwd, remainder_grad)
CMP_TESTS("eq", eq)
CMP_TESTS("ne", ne)
CMP_TESTS("lt", lt)
CMP_TESTS("le", le)
CMP_TESTS("gt", gt)
CMP_TESTS("ge", ge)

/* ---- where ---- */
static int where_fwd(void) {
    OP_BEGIN;
    int64_t s[2] = {2, 3}, s1[1] = {3};
    double av[6] = {1, 2, 3, 4, 5, 6}, cv[3] = {1, 0, 1};
    fm_tensor *a = from(av, 2, s, FM_F32), *b = fm_tensor_full(0, NULL, -1.0, FM_F32, FM_CPU);
    fm_tensor *c = from(cv, 1, s1, FM_BOOL);
    fm_tensor *y = fm_where(c, a, b);
    double want[6] = {1, -1, 3, 4, -1, 6};
    CHECK(y != NULL);
    for (int i = 0; y && i < 6; i++) CHECK_NEAR(fm_tensor_get(y, i), want[i], 0);
    /* a condition of the output's shape (read in place, not broadcast) */
    double c2v[6] = {0, 1, 1, 0, 0, 1}, want2[6] = {-1, 2, 3, -1, -1, 6};
    fm_tensor *c2 = from(c2v, 2, s, FM_BOOL), *y2 = fm_where(c2, a, b);
    CHECK(y2 != NULL);
    for (int i = 0; y2 && i < 6; i++) CHECK_NEAR(fm_tensor_get(y2, i), want2[i], 0);
    fm_tensor_release_n(2, c2, y2);
    CHECK(fm_where(a, a, b) == NULL);
    CHECK_ERR_CONTAINS("must be bool");
    fm_tensor_release_n(4, a, b, c, y);
    OP_END;
}
static fm_tensor *gc_where(fm_tensor **in, void *ctx) { return fm_where((fm_tensor *)ctx, in[0], in[1]); }
static int where_grad(void) {
    OP_BEGIN;
    int64_t s[2] = {2, 3}, s1[1] = {3};
    double cv[3] = {1, 0, 1};
    fm_rng r;
    fm_rng_init(&r, 9);
    fm_tensor *a = fm_tensor_randn(2, s, FM_F64, &r), *b = fm_tensor_randn(1, s1, FM_F64, &r), *c = from(cv, 1, s1, FM_BOOL);
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *ins[2] = {a, b};
    CHECK(gradcheck("where", gc_where, 2, ins, c, 1e-6, 1e-6));
    fm_tensor_release_n(3, a, b, c);
    OP_END;
}
OP_TEST("where", where_fwd, where_grad)

/* ---- copy (contiguous / dtype conversion) ---- */
static int copy_fwd(void) {
    OP_BEGIN;
    int64_t s[2] = {3, 4};
    fm_tensor *a = fm_tensor_arange(0, 12, 1, FM_F32), *a2 = fm_reshape(a, 2, s), *t = fm_transpose(a2, 0, 1);
    fm_tensor *c = fm_contiguous(t);
    CHECK(c && fm_tensor_is_contiguous(c) && c != t);
    for (int i = 0; c && i < 12; i++) CHECK_NEAR(fm_tensor_get(c, i), (i % 3) * 4 + i / 3, 0);
    /* conversions round to nearest even */
    double vals[4] = {1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 65504, 1e6};
    int64_t n4 = 4;
    fm_tensor *f = from(vals, 1, &n4, FM_F64), *h = fm_to_dtype(f, FM_F16);
    CHECK(h && fm_tensor_get(h, 0) == 1.0);                 /* tie -> even (down) */
    CHECK(h && fm_tensor_get(h, 1) == 1.0 + 2.0 / 1024);    /* tie -> even (up) */
    CHECK(h && fm_tensor_get(h, 2) == 65504);
    CHECK(h && isinf(fm_tensor_get(h, 3)));
    fm_tensor *bf = fm_to_dtype(f, FM_BF16);
    CHECK(bf && fm_tensor_get(bf, 0) == 1.0);
    fm_tensor *i8 = fm_to_dtype(f, FM_I8);
    CHECK(i8 && fm_tensor_get(i8, 0) == 1 && fm_tensor_get(i8, 3) == 127); /* saturates */
    /* large f16 <-> f32 bulk through the SIMD path equals the scalar path */
    int64_t big = 1000;
    fm_tensor *x = fm_tensor_arange(-500, 500, 1, FM_F32), *xs = fm_mul_scalar(x, 0.37);
    fm_tensor *x16 = fm_to_dtype(xs, FM_F16);
    for (int i = 0; x16 && i < big; i++) {
        float v = (float)fm_tensor_get(xs, i);
        CHECK(fm_tensor_get(x16, i) == fm_f16_to_f32(fm_f32_to_f16(v)));
    }
    fm_tensor_release_n(12, a, a2, t, c, f, h, bf, i8, x, xs, x16, NULL);
    /* int64 beyond 2^53 copies and selects exactly (strided, broadcast, where) */
    const int64_t big64[4] = {(INT64_C(1) << 62) + 1, -(INT64_C(1) << 61) - 3, (INT64_C(1) << 53) + 1, INT64_MAX};
    fm_tensor *w64 = fm_tensor_from_data(big64, 2, (int64_t[]){2, 2}, FM_I64), *tr = w64 ? fm_transpose(w64, 0, 1) : NULL;
    fm_tensor *tc = tr ? fm_contiguous(tr) : NULL, *row = w64 ? fm_narrow(w64, 0, 1, 1) : NULL;
    fm_tensor *ex = row ? fm_expand(row, 2, (int64_t[]){3, 2}) : NULL, *ec = ex ? fm_contiguous(ex) : NULL;
    const uint8_t pick[4] = {1, 0, 0, 1};
    fm_tensor *cond = fm_tensor_from_data(pick, 2, (int64_t[]){2, 2}, FM_BOOL), *wh = cond && tc ? fm_where(cond, w64, tc) : NULL;
    CHECK(tc && ec && wh);
    const int64_t *pt = tc ? fm_tensor_data(tc) : NULL, *pe = ec ? fm_tensor_data(ec) : NULL, *pw = wh ? fm_tensor_data(wh) : NULL;
    CHECK(pt && pt[0] == big64[0] && pt[1] == big64[2] && pt[2] == big64[1] && pt[3] == big64[3]);
    for (int i = 0; pe && i < 6; i++) CHECK(pe[i] == big64[2 + i % 2]);
    CHECK(pw && pw[0] == big64[0] && pw[1] == big64[2] && pw[2] == big64[1] && pw[3] == big64[3]);
    fm_tensor_release_n(8, w64, tr, tc, row, ex, ec, cond, wh);
    OP_END;
}
static fm_tensor *gc_copy(fm_tensor **in, void *ctx) { (void)ctx; return fm_contiguous(in[0]); }
static int copy_grad(void) {
    OP_BEGIN;
    int64_t s[2] = {3, 4};
    fm_rng r;
    fm_rng_init(&r, 1);
    fm_tensor *a = fm_tensor_randn(2, s, FM_F64, &r), *t = fm_transpose(a, 0, 1), *leaf = fm_detach(t);
    fm_tensor_requires_grad_(leaf, true);
    fm_tensor *ins[1] = {leaf};
    CHECK(gradcheck("copy", gc_copy, 1, ins, NULL, 1e-6, 1e-7));
    fm_tensor_release_n(3, a, t, leaf);
    OP_END;
}
OP_TEST("copy", copy_fwd, copy_grad)
