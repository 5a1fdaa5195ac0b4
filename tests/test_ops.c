/* Runs every registered per-op test (tests/ops/ *.c) and checks the registry:
 * every op in fathom/ops.def that is not internal must have a forward test, and
 * every differentiable one a gradient check. Arguments: op names to run only those. */
#include <stdlib.h>

#include "fathom/ops.h"
#include "test_util.h"
#include "op_test.h"
#include "test_isa_env.h"
#include "core/parallel.h"

#define MAX_TESTS 512
static struct { const char *op; op_test_fn fwd, grad; } g_tests[MAX_TESTS];
static int g_n;

void op_test_register(const char *op, op_test_fn fwd, op_test_fn grad) {
    if (g_n < MAX_TESTS) { g_tests[g_n].op = op; g_tests[g_n].fwd = fwd; g_tests[g_n].grad = grad; g_n++; }
}

static bool selected(const char *op, int argc, char **argv) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; i++) if (!strcmp(argv[i], op)) return true;
    return false;
}


int main(int argc, char **argv) {
    int failed_ops = 0, isa = test_isa_env();
    if (isa) return isa;
    for (int i = 0; i < g_n; i++) {
        if (!selected(g_tests[i].op, argc, argv)) continue;
        if (fm_op_find(g_tests[i].op) == FM_OP_COUNT) {
            fprintf(stderr, "test registered for unknown op '%s'\n", g_tests[i].op);
            failed_ops++;
            continue;
        }
        int f = g_tests[i].fwd ? g_tests[i].fwd() : 0;
        int gr = g_tests[i].grad ? g_tests[i].grad() : 0;
        fprintf(stderr, "%-30s forward %s  grad %s\n", g_tests[i].op, f ? "FAIL" : "ok",
                g_tests[i].grad ? (gr ? "FAIL" : "ok") : "-");
        if (f || gr) failed_ops++;
    }
    if (argc < 2) { /* the registry walk */
        for (int op = 0; op < FM_OP_COUNT; op++) {
            const fm_op_info *info = fm_op_get_info((fm_op_id)op);
            if (info->flags & FM_OPF_INTERNAL) continue;
            bool fwd = false, grad = false;
            for (int i = 0; i < g_n; i++)
                if (!strcmp(g_tests[i].op, info->name)) { fwd |= g_tests[i].fwd != NULL; grad |= g_tests[i].grad != NULL; }
            CHECK_MSG(fwd, "op '%s' has no forward test", info->name);
            if (info->flags & FM_OPF_DIFF) CHECK_MSG(grad, "differentiable op '%s' has no gradient check", info->name);
        }
    }
    CHECK_MSG(failed_ops == 0, "%d op test(s) failed", failed_ops);
    fm_parallel_shutdown();
    TEST_DONE();
}
