/* Per-op tests that tests/test_ops.c runs and checks against the op registry.
 *
 * Each tests/ops/<group>.c registers, for every op it covers:
 *     OP_TEST("gelu", gelu_forward, gelu_grad)   (grad may be NULL for non-differentiable ops)
 * Both functions return the number of failed checks (0 = pass). test_ops fails if
 * an op in fathom/ops.def (other than FM_OPF_INTERNAL ones) has no forward test, or
 * a differentiable one has no gradient check. Include test_util.h first. */
#ifndef FATHOM_OP_TEST_H
#define FATHOM_OP_TEST_H
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include "fathom/tensor.h"
typedef int (*op_test_fn)(void);
void op_test_register(const char *op, op_test_fn forward, op_test_fn grad);
#define OP_TEST(opname, fwd, grad) \
    static void __attribute__((constructor)) op_test_reg_##fwd(void) { op_test_register(opname, fwd, grad); }
/* Inside a test function: `OP_BEGIN; ...CHECKs...; OP_END;` returns this function's failures. */
#define OP_BEGIN int op_fail0_ = t_failures
#define OP_END return t_failures - op_fail0_

/* Helpers shared by the op tests. */

/* The tensor in logical row-major order as f64 host memory (free it), NULL on failure. */
static inline double *op_host(const fm_tensor *t) {
    double *p = malloc(sizeof(double) * (size_t)(fm_tensor_numel(t) ? fm_tensor_numel(t) : 1));
    if (p && fm_tensor_copy_to_host(t, p, FM_F64) != FM_OK) { free(p); return NULL; }
    return p;
}

/* Largest |t - ref| / (1 + |ref|) over the tensor; a NaN or an unreadable tensor fails it. */
static inline double op_max_rel_err(const fm_tensor *t, const double *ref) {
    double *a = op_host(t), worst = 0;
    if (!a) return INFINITY;
    for (int64_t i = 0; i < fm_tensor_numel(t); i++) {
        double e = fabs(a[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (!(e <= worst)) worst = e; /* NaN wins */
    }
    free(a);
    return worst;
}

/* N(0,1) values from a generator of its own, so each test's inputs depend only on seed. */
static inline fm_tensor *op_randn(int nd, const int64_t *shape, fm_dtype dt, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(nd, shape, dt, &r);
}

static inline bool op_bitwise_equal(const fm_tensor *a, const fm_tensor *b) {
    if (!a || !b || fm_tensor_numel(a) != fm_tensor_numel(b)) return false;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++)
        if (fm_tensor_get(a, i) != fm_tensor_get(b, i)) return false;
    return true;
}
#endif
