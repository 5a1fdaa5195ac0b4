/* Efficiency helpers the GPT model uses that are not part of the public API. */
#ifndef FATHOM_EFFICIENCY_INTERNAL_H
#define FATHOM_EFFICIENCY_INTERNAL_H
#include "fathom/tensor.h"

/* Mean cross-entropy of bf16/fp16 logits [N, V] against targets [N], computed in
 * f32 as the autocast policy asks, without keeping an f32 copy of the logits for
 * backward: the node saves the low-precision logits, and backward widens them a
 * block of rows at a time and writes the gradient straight into a tensor of the
 * logits' dtype. The loss is f32, within one f32 rounding of fm_cross_entropy's
 * (the forward sums blocks of rows too). */
fm_tensor *fm_cross_entropy_lowp(fm_tensor *logits, fm_tensor *target, int64_t ignore_index, double label_smoothing);

/* Rows per block in that backward: 2^16 logits (256 KiB of f32), at least 8 rows. */
int64_t fm_cross_entropy_lowp_rows(int64_t vocab);
#endif
