/* Cost model of an op call, shared by the profiler and its tests. */
#ifndef FATHOM_OP_COST_H
#define FATHOM_OP_COST_H
#include "backend/kernel.h"
double fm_op_flops(const fm_op_call *c);
double fm_op_bytes(const fm_op_call *c);
#endif
