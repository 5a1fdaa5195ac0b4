/* Per-op tests that tests/test_ops.c runs and checks against the op registry.
 *
 * Each tests/ops/<group>.c registers, for every op it covers:
 *     OP_TEST("gelu", gelu_forward, gelu_grad)   (grad may be NULL for non-differentiable ops)
 * Both functions return the number of failed checks (0 = pass). test_ops fails if
 * an op in fathom/ops.def (other than FM_OPF_INTERNAL ones) has no forward test, or
 * a differentiable one has no gradient check. Include test_util.h first. */
#ifndef FATHOM_OP_TEST_H
#define FATHOM_OP_TEST_H
typedef int (*op_test_fn)(void);
void op_test_register(const char *op, op_test_fn forward, op_test_fn grad);
#define OP_TEST(opname, fwd, grad) \
    static void __attribute__((constructor)) op_test_reg_##fwd(void) { op_test_register(opname, fwd, grad); }
/* Inside a test function: `OP_BEGIN; ...CHECKs...; OP_END;` returns this function's failures. */
#define OP_BEGIN int op_fail0_ = t_failures
#define OP_END return t_failures - op_fail0_
#endif
