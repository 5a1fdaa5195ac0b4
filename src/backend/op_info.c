/* The op-info table (name, arity, flags, autocast policy, kernel group), built from ops.def: the names that
 * errors, the profiler and the kernels' own messages use. */
#include <string.h>

#include "backend/kernel.h"

static const fm_op_info k_ops[FM_OP_COUNT] = {
#define X(id, name, nin, nout, flags, prec, group) [FM_OP_##id] = {#name, nin, nout, flags, FM_PREC_##prec, FM_GROUP_##group},
#include "fathom/ops.def"
#undef X
};

const fm_op_info *fm_op_get_info(fm_op_id op) { return (unsigned)op < FM_OP_COUNT ? &k_ops[op] : NULL; }

fm_op_id fm_op_find(const char *name) {
    for (int i = 0; i < FM_OP_COUNT; i++)
        if (!strcmp(k_ops[i].name, name)) return (fm_op_id)i;
    return FM_OP_COUNT;
}
