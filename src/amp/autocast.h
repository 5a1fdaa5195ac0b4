/* Autocast: the one place the precision policy is applied (internal).
 *
 * The policy is data: the prec column of fathom/ops.def says, per op, what
 * autocast does to its float inputs (LOWP, F32, PROMOTE, ANY). An op's front end
 * (src/ops) calls fm_autocast_inputs first; when that changes an input, the front
 * end calls itself again with the cast tensors, whose casts are ops on the tape,
 * so gradients flow back through them in the inputs' own dtypes. */
#ifndef FATHOM_AMP_AUTOCAST_H
#define FATHOM_AMP_AUTOCAST_H
#include "fathom/amp.h"
#include "fathom/ops.h"

/* Applies op's policy to its n inputs (NULL entries stay NULL) under the calling
 * thread's autocast setting. Returns 0 when no input changes (out untouched), 1
 * with out[0..n) new references (cast or retained) when one does, -1 on error
 * (out all NULL, fm_last_error set). */
int fm_autocast_inputs(fm_op_id op, int n, fm_tensor *const *in, fm_tensor **out);
/* Whether fm_autocast_inputs would change any input (no casting done). */
bool fm_autocast_changes(fm_op_id op, int n, fm_tensor *const *in);
/* One tensor under op's policy (PROMOTE needs two, so it leaves t as it is): a new
 * reference, cast or retained; NULL for NULL. For compositions that cast an
 * operand themselves (fm_linear's weight and bias, the recomputing linear). */
fm_tensor *fm_autocast_cast(fm_op_id op, fm_tensor *t);
#endif
