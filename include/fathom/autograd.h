/* fathom/autograd.h: a dynamic, define-by-run tape (as in PyTorch eager).
 *
 * Ops record a node when grad mode is on and an input requires grad. backward()
 * walks the nodes from the root in reverse topological order and accumulates
 * into the .grad of leaf tensors that require grad. Unless retain_graph is set,
 * the saved tensors are freed as the walk passes; a second backward through the
 * same nodes is then an error (FM_ERR_STATE), not a crash. */
#ifndef FATHOM_AUTOGRAD_H
#define FATHOM_AUTOGRAD_H
#include "fathom/export.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* root must be a single element unless grad is given (same shape as root). */
FM_API fm_status fm_backward(fm_tensor *root, fm_tensor *grad, bool retain_graph);

/* Several roots at once (grads may be NULL for single-element roots). */
FM_API fm_status fm_backward_multi(int n_roots, fm_tensor *const *roots, fm_tensor *const *grads, bool retain_graph);

/* Activation checkpointing. fn(inputs, ctx, outputs) computes n_out outputs (new
 * references) from n_in inputs. fm_checkpoint runs it without recording its
 * internals; backward re-runs it (with the global RNG restored to the same state,
 * so dropout masks repeat) and backpropagates through the recomputed graph.
 * Parameters used inside fn receive their gradients during that inner backward. */
typedef fm_status (*fm_segment_fn)(fm_tensor *const *inputs, void *ctx, fm_tensor **outputs);
FM_API fm_status fm_checkpoint(fm_segment_fn fn, void *ctx, int n_in, fm_tensor *const *inputs, int n_out, fm_tensor **outputs);

FM_API bool fm_grad_enabled(void);
/* Returns the previous state, so scopes nest: bool prev = fm_set_grad_enabled(false); ...; fm_set_grad_enabled(prev); */
FM_API bool fm_set_grad_enabled(bool enabled);

FM_API fm_status fm_tensor_requires_grad_(fm_tensor *t, bool requires_grad);
/* A non-leaf keeps its .grad after backward. */
FM_API fm_status fm_tensor_retain_grad(fm_tensor *t);
/* New tensor sharing storage, cut from the tape. */
FM_API fm_tensor *fm_detach(fm_tensor *t);
/* Drop t->grad (set_to_none semantics). */
FM_API void fm_tensor_zero_grad(fm_tensor *t);
FM_API bool fm_tensor_is_leaf(const fm_tensor *t);
/* Hook called with the gradient w.r.t. t during backward (before it is accumulated
 * into a leaf's .grad). Hooks run in registration order. */
FM_API fm_status fm_tensor_register_hook(fm_tensor *t, fm_tensor *(*fn)(fm_tensor *grad, void *ctx), void *ctx);
/* Hook called after a leaf's .grad has been updated, as soon as backward has produced
 * all of this leaf's gradient (data parallelism starts its all-reduces there). */
FM_API fm_status fm_tensor_register_post_accumulate_hook(fm_tensor *t, void (*fn)(fm_tensor *t, void *ctx), void *ctx);
/* Removes the hook registered with the same fn and ctx (FM_ERR_INVALID if none). */
FM_API fm_status fm_tensor_remove_post_accumulate_hook(fm_tensor *t, void (*fn)(fm_tensor *t, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
