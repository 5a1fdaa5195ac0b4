/* graph_rewrite.h: building a pass's output graph from its input (graph_rewrite.c)
 * and the passes themselves (graph_passes.c, graph_fuse.c, graph_plan.c). */
#ifndef FATHOM_GRAPH_REWRITE_H
#define FATHOM_GRAPH_REWRITE_H
#include "graph/graph_internal.h"

typedef struct rw {
    const fm_graph *src;
    fm_graph *dst;
    char **alias; /* per source value: its name in dst when a pass replaced it (NULL: its own) */
} rw;

/* Starts dst with src's inputs, dim hints, metadata and attached files. */
fm_status rw_begin(rw *r, const fm_graph *src);
/* The name source value v has in dst ("" for v < 0). */
const char *rw_name(const rw *r, int v);
fm_status rw_alias(rw *r, int v, const char *to);
/* Adds a constant to dst sharing t (no copy); a name already there is kept. */
fm_status rw_const(rw *r, const char *name, fm_tensor *t);
/* Adds node n to dst as it is (inputs through the aliases), or as another op
 * with other inputs and outputs but n's name and attributes. */
fm_status rw_copy_node(rw *r, const gnode *n);
fm_status rw_node_as(rw *r, const gnode *n, const char *op, int n_in, const char *const *ins, int n_out, const char *const *outs);
/* rw_node_as with extra attributes after n's (one of the same name as n's replaces it). */
fm_status rw_node_with(rw *r, const gnode *n, const char *op, int n_in, const char *const *ins, int n_out, const char *const *outs,
                       int n_extra, const fm_graph_attr *extra);
/* Adds the outputs, validates, frees the rewrite state; the new graph or NULL. */
fm_graph *rw_end(rw *r, fm_status st);
/* How many nodes (and graph outputs) read each value; free() the array. */
int *rw_use_counts(const fm_graph *g);

/* The fusion passes' common loop (rw_fuse_pass): each node not yet consumed by an earlier
 * rewrite goes to fn, which either writes its rewrite into r (marking the nodes it
 * absorbed in skip, counting in tally) and returns that status, or returns -1 and the
 * node is copied as it is. uses: rw_use_counts. */
typedef struct rw_fuse {
    const fm_graph *g;
    rw r;
    int *uses;
    bool *skip;
    int tally[3];
} rw_fuse;
typedef int (*rw_fuse_fn)(rw_fuse *f, int i);
/* The rewritten graph (or NULL), and fn's tallies. */
fm_graph *rw_fuse_pass(const fm_graph *g, rw_fuse_fn fn, int tally[3]);

/* The passes: each returns a new, validated graph (or NULL) and a one-line
 * summary of what it did in note. */
fm_graph *g_pass_dce(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_cse(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fold(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_conv_bn(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fold_pad_conv(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_add_layer_norm(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_bias_gelu(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_conv_act(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_linear_act(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_matmul_to_linear(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_silu(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_elementwise(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fold_reshape(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_rope(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_attention(const fm_graph *g, char *note, size_t n);
fm_graph *g_pass_fuse_masked_attention(const fm_graph *g, char *note, size_t n);
#endif
