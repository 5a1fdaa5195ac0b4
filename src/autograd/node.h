/* The autograd tape's node, for op implementers (src/ops/ *.c).
 *
 * Pattern for an op front end:
 *     fm_node *n = fm_node_begin(FM_OP_X, 2, (fm_tensor*[]){a, b}, x_backward);
 *     if (n) { fm_node_save(n, 0, a); FM_NODE_SET_ATTRS(n, attrs); fm_node_finish(n, 1, &out); }
 * fm_node_begin returns NULL when no grad is needed (grad mode off, or no
 * input requires grad); that is not an error.
 *
 * A backward function receives grad_out[i] for each output (NULL: no gradient
 * reached that output; treat as zeros) and fills grad_in[j] with NEW references
 * for every input j where fm_node_needs_grad(n, j). It runs with grad mode off.
 * Gradients must have exactly the input's shape and dtype (the engine checks). */
#ifndef FATHOM_NODE_H
#define FATHOM_NODE_H
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"

#define FM_NODE_MAX_SAVED 8
#define FM_NODE_MAX_OUT 4
/* Room for the largest attribute struct an op records (views.c's view_attrs, 288
 * bytes, checked there at compile time; it overflowed into grad_acc at 256 and the
 * engine then released its device word, never visible while that word was cpu's 0). */
#define FM_NODE_ATTR_BYTES 320

struct fm_node;
typedef fm_status (*fm_backward_fn)(struct fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in);

typedef struct fm_edge {
    struct fm_node *node; /* producer of the input (strong ref), or NULL */
    fm_tensor *leaf;      /* the input itself if it is a leaf requiring grad (strong ref) */
    int output_nr;
} fm_edge;

typedef struct fm_node {
    int refcount;
    fm_op_id op;
    const char *name;
    fm_backward_fn backward;
    int n_in;
    fm_edge *next;        /* n_in edges, one per input */
    int n_out;
    int out_ndim[FM_NODE_MAX_OUT];
    int64_t out_shape[FM_NODE_MAX_OUT][FM_MAX_DIMS];
    fm_dtype out_dtype[FM_NODE_MAX_OUT];
    fm_device out_device[FM_NODE_MAX_OUT];
    fm_hook *out_hooks[FM_NODE_MAX_OUT];
    fm_tensor *retain[FM_NODE_MAX_OUT]; /* non-owning: outputs that asked to keep .grad */
    fm_tensor *saved[FM_NODE_MAX_SAVED];
    int n_saved;
    bool released;        /* saved tensors freed by a backward without retain_graph */
    uint64_t seq;         /* creation order: larger = later */
    _Alignas(16) unsigned char attrs[FM_NODE_ATTR_BYTES];
    /* scratch used by the engine during one backward */
    fm_tensor *grad_acc[FM_NODE_MAX_OUT];
    int pending;
    int visit;
} fm_node;

fm_node *fm_node_begin(fm_op_id op, int n_in, fm_tensor *const *inputs, fm_backward_fn fn);
/* Keep t for the backward (stored as a detached alias: no reference cycles). */
void fm_node_save(fm_node *n, int slot, fm_tensor *t);
/* Attach outputs: sets their grad_fn/output_nr/requires_grad. Consumes the
 * caller's reference to n. */
void fm_node_finish(fm_node *n, int n_out, fm_tensor *const *outs);
bool fm_node_needs_grad(const fm_node *n, int input);
void fm_node_release(fm_node *n);
/* Drop saved tensors (after a backward without retain_graph). */
void fm_node_free_saved(fm_node *n);
/* The node's attributes as `type`; a type larger than the room fails to compile
 * (a negative array size), so no op can read or write past attrs. */
#define FM_NODE_ATTRS(n, type) \
    ((type *)(void *)((n)->attrs + 0 * sizeof(char[sizeof(type) <= FM_NODE_ATTR_BYTES ? 1 : -1])))
/* Stores the attribute struct v (an lvalue) in n; checked for size at compile time. */
#define FM_NODE_SET_ATTRS(n, v)                                                                \
    do {                                                                                       \
        _Static_assert(sizeof(v) <= FM_NODE_ATTR_BYTES, "op attributes larger than fm_node.attrs"); \
        memcpy((n)->attrs, &(v), sizeof(v));                                                   \
    } while (0)
#endif
