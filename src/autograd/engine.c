/* The backward walk.
 *
 * Every node gets a sequence number when created, and an op's node is always
 * created after the nodes of its inputs, so processing the reachable nodes in
 * decreasing sequence order visits every consumer before its producer: each
 * node's incoming gradient is complete when it runs. Contributions to a leaf are
 * summed during the walk and handed to the leaf (hooks, then .grad, then
 * post-accumulate hooks) once, as PyTorch's AccumulateGrad does: as soon as the
 * last node with an edge to it has run (the walk counts the edges first), so that
 * data-parallel training can all-reduce early gradients while backward goes on. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "core/tensor_internal.h"
#include "dispatch/dispatch.h" /* fm_in_backward */
#include "fathom/memory.h"
#include "fathom/profile.h"

typedef struct leaf_acc {
    fm_tensor *leaf;
    fm_tensor *sum;
    int pending; /* edges from collected nodes not yet run */
} leaf_acc;

typedef struct walk {
    fm_node **nodes;
    size_t n, cap;
    leaf_acc *leaves;
    size_t nl, capl;
} walk;

static fm_status push_node(walk *w, fm_node *n) {
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 64;
        fm_node **nn = realloc(w->nodes, nc * sizeof *nn);
        if (!nn) return fm_set_error(FM_ERR_OOM, "backward: out of memory");
        w->nodes = nn;
        w->cap = nc;
    }
    w->nodes[w->n++] = n;
    return FM_OK;
}

static int by_seq_desc(const void *a, const void *b) {
    const fm_node *x = *(fm_node *const *)a, *y = *(fm_node *const *)b;
    return x->seq < y->seq ? 1 : (x->seq > y->seq ? -1 : 0);
}

/* Sum a and b (either may be NULL). Returns a new reference. */
static fm_tensor *acc(fm_tensor *a, fm_tensor *b) {
    if (!a) return fm_tensor_retain(b);
    if (!b) return fm_tensor_retain(a);
    return fm_add(a, b);
}

static fm_status check_grad_shape(const char *what, const fm_tensor *g, int ndim, const int64_t *shape, fm_dtype dt) {
    bool ok = g->ndim == ndim && g->dtype == dt;
    for (int i = 0; ok && i < ndim; i++) ok = g->shape[i] == shape[i];
    if (ok) return FM_OK;
    char a[128], b[128];
    return fm_set_error(FM_ERR_INTERNAL, "backward of %s produced a gradient of shape %s %s for an input of shape %s %s",
                        what, fm_shape_str(g->ndim, g->shape, a, sizeof a), fm_dtype_name(g->dtype),
                        fm_shape_str(ndim, shape, b, sizeof b), fm_dtype_name(dt));
}

static fm_tensor *run_hooks(fm_hook *h, fm_tensor *g) {
    for (; h && g; h = h->next) {
        fm_tensor *r = h->fn(g, h->ctx);
        if (r) { fm_tensor_release(g); g = r; }
    }
    return g;
}

/* The leaf's entry, added (empty) if new; NULL when out of memory. */
static leaf_acc *leaf_entry(walk *w, fm_tensor *leaf) {
    for (size_t i = 0; i < w->nl; i++)
        if (w->leaves[i].leaf == leaf) return &w->leaves[i];
    if (w->nl == w->capl) {
        size_t nc = w->capl ? w->capl * 2 : 64;
        leaf_acc *nl = realloc(w->leaves, nc * sizeof *nl);
        if (!nl) { fm_set_error(FM_ERR_OOM, "backward: out of memory"); return NULL; }
        w->leaves = nl;
        w->capl = nc;
    }
    w->leaves[w->nl] = (leaf_acc){leaf, NULL, 0};
    return &w->leaves[w->nl++];
}

static fm_status add_leaf(walk *w, fm_tensor *leaf, fm_tensor *g) {
    leaf_acc *e = leaf_entry(w, leaf);
    if (!e) return fm_last_status();
    fm_tensor *s = acc(e->sum, g);
    if (!s) return fm_last_status();
    fm_tensor_release(e->sum);
    e->sum = s;
    return FM_OK;
}

static fm_status finish_leaf_tagged(fm_tensor *leaf, fm_tensor *g);

/* Store g as leaf's gradient (memory counted as gradients), owning its storage (a gradient passed through
 * unchanged may share storage with another tensor's gradient). Consumes the caller's reference to g. */
static fm_status finish_leaf(fm_tensor *leaf, fm_tensor *g) {
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_GRADIENTS);
    fm_status st = finish_leaf_tagged(leaf, g);
    fm_memory_tag_pop(mc);
    return st;
}

static fm_status finish_leaf_tagged(fm_tensor *leaf, fm_tensor *g) {
    g = run_hooks(leaf->hooks, g);
    if (!g) return FM_OK;
    fm_tensor *ng;
    if (leaf->grad) {
        ng = fm_add(leaf->grad, g);
    } else if (g->refcount > 1 || g->storage->refcount > 1 || !fm_tensor_is_contiguous(g)) {
        ng = fm_clone(g);
    } else {
        /* the walk's only reference to a fresh gradient: take it without a copy */
        ng = fm_tensor_retain(g);
        fm_memory_retag(g->storage, FM_MEM_GRADIENTS);
    }
    fm_tensor_release(g);
    if (!ng) return fm_last_status();
    fm_tensor_release(leaf->grad);
    leaf->grad = ng;
    for (fm_post_hook *h = leaf->post_hooks; h; h = h->next) h->fn(leaf, h->ctx);
    return FM_OK;
}

/* One edge into a leaf has run (g: its contribution, or NULL): add it. */
static fm_status leaf_edge_done(walk *w, fm_tensor *leaf, fm_tensor *g, const char *node_name) {
    leaf_acc *e = leaf_entry(w, leaf);
    if (!e) return fm_last_status();
    fm_status st = FM_OK;
    if (g) st = check_grad_shape(node_name, g, leaf->ndim, leaf->shape, leaf->dtype);
    if (st == FM_OK && g) st = add_leaf(w, leaf, g);
    e = leaf_entry(w, leaf);
    if (e) e->pending--;
    return st;
}

/* After node n has run and dropped its references: hands each leaf it feeds whose
 * last edge this was its summed gradient (then usually the only reference, so
 * finish_leaf takes it without a copy). */
static fm_status hand_over_leaves(walk *w, fm_node *n) {
    for (int j = 0; j < n->n_in; j++) {
        fm_tensor *leaf = n->next[j].leaf;
        if (!leaf || !fm_node_needs_grad(n, j)) continue;
        leaf_acc *e = leaf_entry(w, leaf);
        if (!e) return fm_last_status();
        if (e->pending > 0 || !e->sum) continue;
        fm_tensor *sum = e->sum;
        e->sum = NULL;
        fm_status st = finish_leaf(leaf, sum);
        if (st != FM_OK) return st;
    }
    return FM_OK;
}

/* Validates one root and makes its seed gradient (new reference). */
static fm_tensor *seed_grad(fm_tensor *root, fm_tensor *grad) {
    if (!root) { fm_set_error(FM_ERR_INVALID, "backward: tensor is NULL"); return NULL; }
    if (!root->requires_grad) {
        fm_set_error(FM_ERR_INVALID, "backward: tensor does not require grad and has no grad_fn "
                     "(did an input have requires_grad set, and was grad mode on?)");
        return NULL;
    }
    char sb[128], gb[128];
    if (grad) {
        bool same = grad->ndim == root->ndim && grad->dtype == root->dtype;
        for (int i = 0; same && i < root->ndim; i++) same = grad->shape[i] == root->shape[i];
        if (!same) {
            fm_set_error(FM_ERR_INVALID, "backward: gradient %s %s does not match tensor %s %s",
                         fm_shape_str(grad->ndim, grad->shape, gb, sizeof gb), fm_dtype_name(grad->dtype),
                         fm_shape_str(root->ndim, root->shape, sb, sizeof sb), fm_dtype_name(root->dtype));
            return NULL;
        }
        return fm_tensor_retain(grad);
    }
    if (fm_tensor_numel(root) != 1) {
        fm_set_error(FM_ERR_INVALID, "backward: gradient can be implied only for a single-element tensor; "
                     "this one has shape %s (pass a gradient, or reduce it first)",
                     fm_shape_str(root->ndim, root->shape, sb, sizeof sb));
        return NULL;
    }
    return fm_tensor_full(root->ndim, root->shape, 1.0, root->dtype, root->storage->device);
}

fm_status fm_backward(fm_tensor *root, fm_tensor *grad, bool retain_graph) {
    return fm_backward_multi(1, &root, grad ? &grad : NULL, retain_graph);
}

/* Collects the nodes reachable from the roots into w (iterative DFS with a visit
 * mark); a root without a grad_fn is a leaf whose gradient is its seed. */
static fm_status collect_nodes(walk *w, int n_roots, fm_tensor *const *roots, fm_tensor *const *seeds) {
    static _Thread_local int visit_mark = 0;
    int mark = ++visit_mark;
    fm_status st = FM_OK;
    fm_node **stack = NULL;
    size_t sp = 0, scap = 0;
#define PUSH(x)                                                                           \
    do {                                                                                  \
        if (sp == scap) {                                                                 \
            size_t nc = scap ? scap * 2 : 64;                                             \
            fm_node **ns = realloc(stack, nc * sizeof *ns);                               \
            if (!ns) { st = fm_set_error(FM_ERR_OOM, "backward: out of memory"); break; } \
            stack = ns;                                                                   \
            scap = nc;                                                                    \
        }                                                                                 \
        stack[sp++] = (x);                                                                \
    } while (0)
    for (int r = 0; r < n_roots && st == FM_OK; r++) {
        fm_node *rn = roots[r]->grad_fn;
        if (!rn) { st = add_leaf(w, roots[r], seeds[r]); continue; } /* a leaf root: its gradient is the seed */
        if (rn->visit != mark) { rn->visit = mark; PUSH(rn); }
    }
    while (st == FM_OK && sp) {
        fm_node *n = stack[--sp];
        if (n->released) {
            st = fm_set_error(FM_ERR_STATE, "backward: trying to backward through the graph a second time: the "
                              "intermediate values of '%s' were freed by the first backward (pass retain_graph=true "
                              "to the first call if you need to backward twice)", n->name);
            break;
        }
        if ((st = push_node(w, n)) != FM_OK) break;
        for (int i = 0; i < n->n_in; i++) {
            fm_node *m = n->next[i].node;
            if (m && m->visit != mark) { m->visit = mark; PUSH(m); }
            if (n->next[i].leaf && fm_node_needs_grad(n, i)) {
                leaf_acc *e = leaf_entry(w, n->next[i].leaf);
                if (!e) { st = fm_last_status(); break; }
                e->pending++;
            }
        }
    }
#undef PUSH
    free(stack);
    return st;
}

/* Runs one node's backward: takes its accumulated output gradients (through the
 * output hooks, into retained non-leaf grads), and accumulates the input
 * gradients into the next nodes or the leaves. Frees the saved values unless
 * retain_graph. */
static fm_status run_node(walk *w, fm_node *n, bool retain_graph) {
    fm_status st = FM_OK;
    fm_tensor *gout[FM_NODE_MAX_OUT] = {0};
    bool any = false;
    for (int i = 0; i < n->n_out && i < FM_NODE_MAX_OUT; i++) {
        gout[i] = n->grad_acc[i];
        n->grad_acc[i] = NULL;
        if (gout[i] && n->out_hooks[i]) gout[i] = run_hooks(n->out_hooks[i], gout[i]);
        if (gout[i] && n->retain[i]) {
            fm_tensor *t = n->retain[i];
            fm_tensor *s = t->grad ? fm_add(t->grad, gout[i]) : fm_clone(gout[i]);
            if (s) { fm_tensor_release(t->grad); t->grad = s; }
        }
        if (gout[i]) any = true;
    }
    fm_tensor *gin[64] = {0};
    fm_tensor **gi = n->n_in <= 64 ? gin : calloc((size_t)n->n_in, sizeof *gi);
    if (!gi) st = fm_set_error(FM_ERR_OOM, "backward: out of memory");
    if (st == FM_OK && any && n->backward) {
        st = n->backward(n, gout, gi);
        if (st != FM_OK) fm_error_prefix("backward of %s", n->name);
    }
    for (int j = 0; st == FM_OK && j < n->n_in; j++) {
        if (!fm_node_needs_grad(n, j)) continue;
        fm_edge *e = &n->next[j];
        if (e->leaf) st = leaf_edge_done(w, e->leaf, gi[j], n->name);
        if (!gi[j]) continue;
        if (e->node) {
            fm_node *m = e->node;
            int o = e->output_nr;
            st = check_grad_shape(n->name, gi[j], m->out_ndim[o], m->out_shape[o], m->out_dtype[o]);
            if (st == FM_OK) {
                fm_tensor *s = acc(m->grad_acc[o], gi[j]);
                if (!s) st = fm_last_status();
                else { fm_tensor_release(m->grad_acc[o]); m->grad_acc[o] = s; }
            }
        }
    }
    if (gi)
        for (int j = 0; j < n->n_in; j++) fm_tensor_release(gi[j]);
    if (gi != gin) free(gi);
    for (int i = 0; i < FM_NODE_MAX_OUT; i++) fm_tensor_release(gout[i]);
    if (!retain_graph) {
        fm_node_free_saved(n);
        n->released = true;
    }
    if (st == FM_OK) st = hand_over_leaves(w, n);
    return st;
}

fm_status fm_backward_multi(int n_roots, fm_tensor *const *roots, fm_tensor *const *grads, bool retain_graph) {
    if (n_roots < 1 || !roots) return fm_set_error(FM_ERR_INVALID, "backward: no tensors given");
    fm_tensor *seeds[64];
    if (n_roots > 64) return fm_set_error(FM_ERR_INVALID, "backward: at most 64 roots");
    for (int r = 0; r < n_roots; r++) {
        seeds[r] = seed_grad(roots[r], grads ? grads[r] : NULL);
        if (!seeds[r]) {
            for (int q = 0; q < r; q++) fm_tensor_release(seeds[q]);
            return fm_last_status();
        }
    }
    bool prev = fm_set_grad_enabled(false);
    walk w = {0};
    int prev_bw = fm_in_backward;
    fm_in_backward = 1;
    fm_profile_push("backward", "autograd");
    fm_status st = collect_nodes(&w, n_roots, roots, seeds);
    if (st == FM_OK) {
        qsort(w.nodes, w.n, sizeof *w.nodes, by_seq_desc);
        for (int r = 0; r < n_roots && st == FM_OK; r++) {
            fm_node *rn = roots[r]->grad_fn;
            if (!rn) continue;
            fm_tensor *sum = acc(rn->grad_acc[roots[r]->output_nr], seeds[r]);
            if (!sum) { st = fm_last_status(); break; }
            fm_tensor_release(rn->grad_acc[roots[r]->output_nr]);
            rn->grad_acc[roots[r]->output_nr] = sum;
        }
        for (size_t k = 0; k < w.n && st == FM_OK; k++) st = run_node(&w, w.nodes[k], retain_graph);
        /* On failure, drop partial gradients held by nodes. */
        for (size_t k = 0; k < w.n; k++)
            for (int i = 0; i < FM_NODE_MAX_OUT; i++) {
                fm_tensor_release(w.nodes[k]->grad_acc[i]);
                w.nodes[k]->grad_acc[i] = NULL;
            }
    }
    for (size_t i = 0; i < w.nl; i++) { /* leaf roots, and whatever an error left */
        if (!w.leaves[i].sum) continue;
        if (st == FM_OK) st = finish_leaf(w.leaves[i].leaf, w.leaves[i].sum);
        else fm_tensor_release(w.leaves[i].sum);
    }
    free(w.leaves);
    free(w.nodes);
    for (int r = 0; r < n_roots; r++) fm_tensor_release(seeds[r]);
    fm_set_grad_enabled(prev);
    fm_profile_pop();
    fm_in_backward = prev_bw;
    return st;
}
