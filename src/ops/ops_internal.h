/* Helpers shared by op front ends. */
#ifndef FATHOM_OPS_INTERNAL_H
#define FATHOM_OPS_INTERNAL_H
#include "fathom/ops.h"
/* Fill a host tensor (any layout) with v. */
fm_status fm_cpu_fill(fm_tensor *t, double v);
#endif
