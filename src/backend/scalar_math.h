/* Scalar activation math shared by the CPU and CUDA backends: each function is
 * written once here and compiled for the host (C) and, under nvcc, the device.
 *
 * Each is defined for double (suffix _d: the CPU's scalar reference, and f64 on
 * CUDA) and float (suffix _f: the CUDA f32/f16/bf16 path) from one body, so the
 * two backends evaluate the same formula. The AVX2 loops (elementwise_avx2.c,
 * fused_avx2.c) keep their own vector forms; tests/ops/elementwise.c checks
 * them against the _d functions. Derivatives take x (and, where cheaper, y). */
#ifndef FATHOM_SCALAR_MATH_H
#define FATHOM_SCALAR_MATH_H
#include <math.h>

#ifdef __CUDACC__
#define FM_HD __host__ __device__
#else
#define FM_HD
#endif

/* 2 sqrt(2/pi) and the cubic coefficient of the tanh form of GELU */
#define FM_GELU_TANH_K2 1.5957691216057308
#define FM_GELU_TANH_C 0.044715
#define FM_INV_SQRT_2PI 0.3989422804014327

/* One body per function, instantiated for (T, suffix, exp, erfc, log1p) below. */
#define FM_SCALAR_MATH(T, S, EXP, ERFC, LOG1P)                                                          \
    /* logistic; the split keeps exp's argument non-positive, so nothing overflows */                  \
    FM_HD static inline T fm_sigmoid##S(T x) {                                                        \
        return x >= (T)0 ? (T)1 / ((T)1 + EXP(-x)) : EXP(x) / ((T)1 + EXP(x));                        \
    }                                                                                                  \
    FM_HD static inline T fm_silu##S(T x) { return x / ((T)1 + EXP(-x)); }                             \
    FM_HD static inline T fm_silu_deriv##S(T x) {                                                     \
        T s = (T)1 / ((T)1 + EXP(-x));                                                                 \
        return s * ((T)1 + x * ((T)1 - s));                                                            \
    }                                                                                                  \
    /* exact GELU x Phi(x); erfc keeps the left tail accurate (no 1 + erf cancellation) */             \
    FM_HD static inline T fm_gelu##S(T x) { return (T)0.5 * x * ERFC(-x * (T)M_SQRT1_2); }              \
    FM_HD static inline T fm_gelu_deriv##S(T x) {                                                     \
        return (T)0.5 * ERFC(-x * (T)M_SQRT1_2) + x * (EXP((T)-0.5 * x * x) * (T)FM_INV_SQRT_2PI);      \
    }                                                                                                  \
    /* tanh GELU: 0.5 x (1 + tanh u) = x s, s = 1/(1 + e), e = exp(-2u),                              \
     * u = sqrt(2/pi) (x + 0.044715 x^3) */                                                            \
    FM_HD static inline T fm_gelu_tanh##S(T x) {                                                      \
        return x / ((T)1 + EXP((T)-FM_GELU_TANH_K2 * x * ((T)1 + (T)FM_GELU_TANH_C * x * x)));          \
    }                                                                                                  \
    /* d/dx = s (1 + q 2u'), q = e s = 1 - s: no 1 - tanh^2 cancellation */                          \
    FM_HD static inline T fm_gelu_tanh_deriv##S(T x) {                                                \
        T e = EXP((T)-FM_GELU_TANH_K2 * x * ((T)1 + (T)FM_GELU_TANH_C * x * x));                        \
        T s = (T)1 / ((T)1 + e), q = e * s;                                                            \
        if (q != q) q = (T)1; /* e = inf: s = 0 */                                                     \
        return s * ((T)1 + q * (T)FM_GELU_TANH_K2 * x * ((T)1 + (T)3 * (T)FM_GELU_TANH_C * x * x));   \
    }                                                                                                  \
    /* softplus log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow, and no cancellation            \
     * in the left tail; its derivative is the logistic */                                             \
    FM_HD static inline T fm_softplus##S(T x) {                                                       \
        return (x > (T)0 ? x : (T)0) + LOG1P(EXP(x > (T)0 ? -x : x));                                  \
    }                                                                                                  \
    FM_HD static inline T fm_softplus_deriv##S(T x) { return fm_sigmoid##S(x); }

FM_SCALAR_MATH(double, _d, exp, erfc, log1p)
FM_SCALAR_MATH(float, _f, expf, erfcf, log1pf)
#undef FM_SCALAR_MATH

/* The switch cases of the math library's unary ops, for both backends' unary switches
 * (T: double on the CPU; the compute type on CUDA, where the names are its overloads):
 * y = f(x), and df/dx from x. round is half to even (rint, in the default rounding
 * mode); floor, ceil, round and sign have a zero gradient, as in PyTorch. */
#define FM_LIBM_UNARY_CASES(T)                                                     \
    case FM_OP_TAN: return tan(x);                                                 \
    case FM_OP_ASIN: return asin(x);                                               \
    case FM_OP_ACOS: return acos(x);                                               \
    case FM_OP_ATAN: return atan(x);                                               \
    case FM_OP_SINH: return sinh(x);                                               \
    case FM_OP_COSH: return cosh(x);                                               \
    case FM_OP_ASINH: return asinh(x);                                             \
    case FM_OP_ACOSH: return acosh(x);                                             \
    case FM_OP_ATANH: return atanh(x);                                             \
    case FM_OP_ERF: return erf(x);                                                 \
    case FM_OP_FLOOR: return floor(x);                                             \
    case FM_OP_CEIL: return ceil(x);                                               \
    case FM_OP_ROUND: return rint(x);                                              \
    case FM_OP_SIGN: return x > (T)0 ? (T)1 : x < (T)0 ? (T)-1 : x; /* 0, NaN stay */
#define FM_LIBM_UNARY_DERIV_CASES(T)                                               \
    case FM_OP_TAN: return (T)1 / (cos(x) * cos(x));                               \
    case FM_OP_ASIN: return (T)1 / sqrt((T)1 - x * x);                             \
    case FM_OP_ACOS: return (T)-1 / sqrt((T)1 - x * x);                            \
    case FM_OP_ATAN: return (T)1 / ((T)1 + x * x);                                 \
    case FM_OP_SINH: return cosh(x);                                               \
    case FM_OP_COSH: return sinh(x);                                               \
    case FM_OP_ASINH: return (T)1 / sqrt(x * x + (T)1);                            \
    case FM_OP_ACOSH: return (T)1 / sqrt(x * x - (T)1);                            \
    case FM_OP_ATANH: return (T)1 / ((T)1 - x * x);                                \
    case FM_OP_ERF: return (T)1.1283791670955126 * exp(-x * x); /* 2 / sqrt(pi) */ \
    case FM_OP_FLOOR: case FM_OP_CEIL: case FM_OP_ROUND: case FM_OP_SIGN: return (T)0;

/* The divisor's sign (Python's %, torch.remainder) from C's exact fmod, for both backends. */
FM_HD static inline double fm_remainder_d(double a, double b) {
    double r = fmod(a, b);
    return r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
}

/* An update v combined with the element d it lands on, by fm_scatter_reduce (0 none, 1 add,
 * 2 mul, 3 amax, 4 amin); NaN wins amax and amin, as in torch. */
FM_HD static inline double fm_scatter_combine_d(int r, double d, double v) {
    switch (r) {
    case 1: return d + v;
    case 2: return d * v;
    case 3: return (d != d || v != v) ? d + v : d > v ? d : v;
    case 4: return (d != d || v != v) ? d + v : d < v ? d : v;
    default: return v;
    }
}

#endif
