/* FATHOM_ISA for the ctest entries that run a test file at each kernel level
 * (test_ops_isa_<level>, test_quant_isa_<level>): a level this CPU lacks is skipped
 * (exit 77), a name that is no level fails (exit 1); else 0, after saying the level. */
#ifndef FATHOM_TEST_ISA_ENV_H
#define FATHOM_TEST_ISA_ENV_H
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/cpu_features.h"

static inline int test_isa_env(void) {
    const char *e = getenv("FATHOM_ISA");
    fm_isa isa;
    char msg[256];
    if (!fm_isa_check(msg, sizeof msg)) { /* the message lists the levels this CPU really has */
        bool is_level = fm_isa_choose(e, FM_ISA_COUNT - 1, &isa, NULL, 0);
        fprintf(stderr, "%s%s\n", is_level ? "skipped: " : "", msg);
        return is_level ? 77 : 1;
    }
    fprintf(stderr, "kernels at %s (FATHOM_ISA)\n", fm_isa_name(fm_cpu_isa()));
    return 0;
}
#endif
