/* Helpers shared by op front ends. */
#ifndef FATHOM_OPS_INTERNAL_H
#define FATHOM_OPS_INTERNAL_H
#include "fathom/ops.h"
/* Fill a host tensor (any layout) with v. */
fm_status fm_cpu_fill(fm_tensor *t, double v);
/* A linear whose GEMMs run in lowp (FM_BF16 or FM_F16) with f32 accumulation on
 * f32 activations: x and w are cast inside, the bias joins the GEMM, the output is
 * the f32 accumulator, and the backward's two GEMMs take one lowp copy of the
 * gradient; the input gradient is f32. One autograd node. Only for devices whose
 * matmul accepts an f32 output for lowp operands (the CPU, check); other cases
 * (f64 or lowp inputs, another device) are fm_linear's. */
fm_tensor *fm_linear_mixed(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_dtype lowp);
#endif
