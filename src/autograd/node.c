/* Building the tape: nodes, edges, saved tensors, and the small public
 * autograd calls (grad mode, detach, hooks). The backward walk is engine.c. */
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "core/tensor_internal.h"

static _Thread_local int t_grad_disabled = 0;
static uint64_t g_seq = 0;

bool fm_grad_enabled(void) { return !t_grad_disabled; }
bool fm_set_grad_enabled(bool enabled) {
    bool prev = !t_grad_disabled;
    t_grad_disabled = !enabled;
    return prev;
}

bool fm_tensor_is_leaf(const fm_tensor *t) { return t->grad_fn == NULL; }

fm_status fm_tensor_requires_grad_(fm_tensor *t, bool rg) {
    if (!t) return fm_set_error(FM_ERR_INVALID, "requires_grad_: tensor is NULL");
    if (t->grad_fn && !rg)
        return fm_set_error(FM_ERR_INVALID, "requires_grad_: cannot turn off gradients of a non-leaf tensor; use fm_detach");
    if (rg && !fm_dtype_is_float(t->dtype))
        return fm_set_error(FM_ERR_INVALID, "requires_grad_: only floating-point tensors can require gradients (got %s)",
                            fm_dtype_name(t->dtype));
    t->requires_grad = rg;
    return FM_OK;
}

fm_status fm_tensor_retain_grad(fm_tensor *t) {
    if (!t || !t->requires_grad) return fm_set_error(FM_ERR_INVALID, "retain_grad: tensor does not require grad");
    if (!t->grad_fn) return FM_OK; /* leaves keep .grad anyway */
    t->grad_fn->retain[t->output_nr] = t;
    t->retains_grad = true;
    return FM_OK;
}

fm_tensor *fm_detach(fm_tensor *t) {
    if (!t) { fm_set_error(FM_ERR_INVALID, "detach: tensor is NULL"); return NULL; }
    return fm_alias(t);
}

void fm_tensor_zero_grad(fm_tensor *t) {
    if (!t) return;
    fm_tensor_release(t->grad);
    t->grad = NULL;
}

fm_status fm_tensor_register_hook(fm_tensor *t, fm_tensor *(*fn)(fm_tensor *, void *), void *ctx) {
    if (!t || !fn) return fm_set_error(FM_ERR_INVALID, "register_hook: NULL argument");
    if (!t->requires_grad) return fm_set_error(FM_ERR_INVALID, "register_hook: tensor does not require grad");
    fm_hook *h = calloc(1, sizeof *h);
    if (!h) return fm_set_error(FM_ERR_OOM, "register_hook: out of memory");
    h->fn = fn;
    h->ctx = ctx;
    fm_hook **list = t->grad_fn ? &t->grad_fn->out_hooks[t->output_nr] : &t->hooks;
    while (*list) list = &(*list)->next;
    *list = h;
    return FM_OK;
}


fm_status fm_tensor_register_post_accumulate_hook(fm_tensor *t, void (*fn)(fm_tensor *, void *), void *ctx) {
    if (!t || !fn) return fm_set_error(FM_ERR_INVALID, "register_post_accumulate_hook: NULL argument");
    if (t->grad_fn || !t->requires_grad)
        return fm_set_error(FM_ERR_INVALID, "register_post_accumulate_hook: only leaf tensors that require grad");
    fm_post_hook *h = calloc(1, sizeof *h);
    if (!h) return fm_set_error(FM_ERR_OOM, "register_post_accumulate_hook: out of memory");
    h->fn = fn;
    h->ctx = ctx;
    fm_post_hook **list = &t->post_hooks;
    while (*list) list = &(*list)->next;
    *list = h;
    return FM_OK;
}

fm_status fm_tensor_remove_post_accumulate_hook(fm_tensor *t, void (*fn)(fm_tensor *, void *), void *ctx) {
    if (!t || !fn) return fm_set_error(FM_ERR_INVALID, "remove_post_accumulate_hook: NULL argument");
    for (fm_post_hook **h = &t->post_hooks; *h; h = &(*h)->next)
        if ((*h)->fn == fn && (*h)->ctx == ctx) {
            fm_post_hook *dead = *h;
            *h = dead->next;
            free(dead);
            return FM_OK;
        }
    return fm_set_error(FM_ERR_INVALID, "remove_post_accumulate_hook: no such hook on this tensor");
}

fm_node *fm_node_begin(fm_op_id op, int n_in, fm_tensor *const *inputs, fm_backward_fn fn) {
    if (t_grad_disabled) return NULL;
    bool any = false;
    for (int i = 0; i < n_in; i++)
        if (inputs[i] && inputs[i]->requires_grad) { any = true; break; }
    if (!any) return NULL;
    fm_node *n = calloc(1, sizeof *n);
    fm_edge *e = calloc((size_t)(n_in ? n_in : 1), sizeof *e);
    if (!n || !e) { free(n); free(e); return NULL; } /* no memory for the tape: the op still succeeds, untracked */
    n->refcount = 1;
    n->op = op;
    const fm_op_info *info = fm_op_get_info(op);
    n->name = info ? info->name : "op";
    n->backward = fn;
    n->n_in = n_in;
    n->next = e;
    for (int i = 0; i < n_in; i++) {
        fm_tensor *x = inputs[i];
        if (!x || !x->requires_grad) continue;
        if (x->grad_fn) {
            e[i].node = x->grad_fn;
            __atomic_add_fetch(&x->grad_fn->refcount, 1, __ATOMIC_RELAXED);
            e[i].output_nr = x->output_nr;
        } else {
            e[i].leaf = fm_tensor_retain(x);
        }
    }
    n->seq = __atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED);
    return n;
}

void fm_node_save(fm_node *n, int slot, fm_tensor *t) {
    if (!n || slot < 0 || slot >= FM_NODE_MAX_SAVED) return;
    fm_tensor_release(n->saved[slot]);
    n->saved[slot] = t ? fm_alias(t) : NULL;
    if (slot + 1 > n->n_saved) n->n_saved = slot + 1;
}

bool fm_node_needs_grad(const fm_node *n, int i) {
    return i >= 0 && i < n->n_in && (n->next[i].node || n->next[i].leaf);
}

/* Core calls this when it frees a tensor that has a grad_fn. */
static void release_grad_fn(fm_tensor *t) {
    for (int i = 0; i < FM_NODE_MAX_OUT; i++)
        if (t->grad_fn->retain[i] == t) t->grad_fn->retain[i] = NULL;
    fm_node_release(t->grad_fn);
}

void fm_node_finish(fm_node *n, int n_out, fm_tensor *const *outs) {
    if (!n) return;
    /* Before any tensor gets a grad_fn, so core's release can always reach it. */
    static int registered;
    if (__builtin_expect(!__atomic_load_n(&registered, __ATOMIC_ACQUIRE), 0)) {
        fm_tensor_set_grad_fn_release(release_grad_fn);
        __atomic_store_n(&registered, 1, __ATOMIC_RELEASE);
    }
    n->n_out = n_out;
    for (int i = 0; i < n_out && i < FM_NODE_MAX_OUT; i++) {
        fm_tensor *o = outs[i];
        if (!o) continue;
        n->out_ndim[i] = o->ndim;
        memcpy(n->out_shape[i], o->shape, sizeof o->shape);
        n->out_dtype[i] = o->dtype;
        n->out_device[i] = o->storage->device;
        if (!fm_dtype_is_float(o->dtype)) continue; /* indices etc. carry no gradient */
        if (o->grad_fn) fm_node_release(o->grad_fn);
        __atomic_add_fetch(&n->refcount, 1, __ATOMIC_RELAXED);
        o->grad_fn = n;
        o->output_nr = i;
        o->requires_grad = true;
    }
    fm_node_release(n); /* the caller's reference */
}

void fm_node_free_saved(fm_node *n) {
    for (int i = 0; i < n->n_saved; i++) { fm_tensor_release(n->saved[i]); n->saved[i] = NULL; }
}

/* Releasing a node can release a long chain of producers: iterate with an explicit
 * stack instead of recursing, so deep graphs cannot overflow the C stack. */
void fm_node_release(fm_node *n) {
    fm_node **stack = NULL;
    size_t sp = 0, cap = 0;
    while (n) {
        if (__atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
            for (int i = 0; i < n->n_in; i++) {
                fm_tensor_release(n->next[i].leaf);
                if (n->next[i].node) {
                    if (sp == cap) {
                        size_t nc = cap ? cap * 2 : 64;
                        fm_node **ns = realloc(stack, nc * sizeof *ns);
                        if (!ns) { fm_node_release(n->next[i].node); continue; } /* fall back to recursion */
                        stack = ns;
                        cap = nc;
                    }
                    stack[sp++] = n->next[i].node;
                }
            }
            fm_node_free_saved(n);
            for (int i = 0; i < FM_NODE_MAX_OUT; i++) {
                for (fm_hook *h = n->out_hooks[i]; h;) { fm_hook *nx = h->next; free(h); h = nx; }
                fm_tensor_release(n->grad_acc[i]);
            }
            free(n->next);
            free(n);
        }
        n = sp ? stack[--sp] : NULL;
    }
    free(stack);
}
