/* fathom/amp.h: automatic mixed precision (autocast), as in torch.autocast.
 *
 * While a low-precision dtype (FM_BF16 or FM_F16) is set on the calling thread,
 * matmul and linear (and the ops that opt in: conv2d, attention) cast f32 inputs
 * to it, compute with f32 accumulation, and return low-precision results, so the
 * activations they save for backward take half the memory. Binary elementwise ops
 * then accept mixed float dtypes and promote to the wider one; reductions, softmax,
 * norms and losses compute in f32. Master weights stay f32: gradients flow back
 * through the casts as f32. Outside autocast, mixed dtypes remain an error. */
#ifndef FATHOM_AMP_H
#define FATHOM_AMP_H
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FM_F32 turns autocast off. Returns the previous setting (for nesting). */
fm_dtype fm_autocast_set(fm_dtype dt);
fm_dtype fm_autocast_get(void);
/* a cast to the autocast dtype if autocast is on and t is f32; else a new ref to t */
fm_tensor *fm_autocast_input(fm_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
