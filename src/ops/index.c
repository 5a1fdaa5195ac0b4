/* Front end of the shape and indexing ops: cat (+ stack, split), gather,
 * index_select, one_hot and pad (cat, slice and index_select put together).
 *
 * cat's backward hands each input a narrow view of the gradient (no copy);
 * stack is unsqueeze + cat and split is narrow, so both inherit their
 * gradients from those. gather and index_select scatter their gradient back
 * with the internal SCATTER_ADD / INDEX_ADD kernels. Index values are checked
 * by the kernels (the front end never reads data): an index out of range is
 * FM_ERR_INVALID naming the index and the bound. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_axis_attrs, fm_one_hot_attrs */

/* A cat node keeps every input's size along the axis in its attributes, which
 * bounds the inputs per node; longer lists are concatenated in groups. */
#define CAT_NODE_MAX 24

typedef struct cat_node_attrs {
    fm_axis_attrs a;
    int n;
    int64_t sizes[CAT_NODE_MAX];
} cat_node_attrs;

static fm_status cat_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    const cat_node_attrs *na = FM_NODE_ATTRS(n, cat_node_attrs);
    int64_t off = 0;
    for (int i = 0; i < na->n; i++) {
        int64_t len = na->sizes[i];
        if (fm_node_needs_grad(n, i)) {
            if (grad_out[0]) {
                grad_in[i] = fm_narrow(grad_out[0], na->a.axis, off, len);
            } else {
                int64_t shape[FM_MAX_DIMS];
                memcpy(shape, n->out_shape[0], sizeof shape);
                shape[na->a.axis] = len;
                grad_in[i] = fm_tensor_zeros(n->out_ndim[0], shape, n->out_dtype[0], n->out_device[0]);
            }
            if (!grad_in[i]) return fm_last_status();
        }
        off += len;
    }
    return FM_OK;
}

static bool any_requires_grad(int n, fm_tensor *const *ts) {
    for (int i = 0; i < n; i++)
        if (ts[i]->requires_grad) return true;
    return false;
}

fm_tensor *fm_cat(int n, fm_tensor *const *ts, int axis) {
    char s1[96], s2[96];
    if (n < 1 || !ts) { fm_set_error(FM_ERR_INVALID, "cat: needs at least one tensor, got %d", n); return NULL; }
    for (int i = 0; i < n; i++)
        if (!ts[i]) { fm_set_error(FM_ERR_INVALID, "cat: tensor %d is NULL", i); return NULL; }
    const fm_tensor *t0 = ts[0];
    if (t0->ndim == 0) { fm_set_error(FM_ERR_INVALID, "cat: zero-dimensional tensor 0 cannot be concatenated"); return NULL; }
    int ax;
    if (fm_norm_axis("cat", axis, t0->ndim, &ax) != FM_OK) return NULL;
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[ax] = 0;
    for (int i = 0; i < n; i++) {
        const fm_tensor *t = ts[i];
        bool ok = t->ndim == t0->ndim;
        for (int d = 0; ok && d < t0->ndim; d++) ok = d == ax || t->shape[d] == t0->shape[d];
        if (!ok) {
            fm_set_error(FM_ERR_INVALID, "cat: tensor %d has shape %s but tensor 0 has %s (sizes must match except along axis %d)",
                         i, fm_shape_str(t->ndim, t->shape, s1, sizeof s1), fm_shape_str(t0->ndim, t0->shape, s2, sizeof s2), ax);
            return NULL;
        }
        if (t->dtype != t0->dtype) {
            fm_set_error(FM_ERR_INVALID, "cat: tensor %d has dtype %s but tensor 0 has %s", i, fm_dtype_name(t->dtype),
                         fm_dtype_name(t0->dtype));
            return NULL;
        }
        if (!fm_device_eq(fm_tensor_device(t), fm_tensor_device(t0))) {
            fm_set_error(FM_ERR_INVALID, "cat: tensor %d is on a different device than tensor 0", i);
            return NULL;
        }
        shape[ax] += t->shape[ax];
    }
    bool record = fm_grad_enabled() && any_requires_grad(n, ts);
    if (record && n > CAT_NODE_MAX) { /* cat groups, then the group results */
        int ng = (n + CAT_NODE_MAX - 1) / CAT_NODE_MAX;
        if (ng > CAT_NODE_MAX) ng = CAT_NODE_MAX; /* groups larger than CAT_NODE_MAX recurse */
        fm_tensor *parts[CAT_NODE_MAX] = {0}, *r = NULL;
        int per = (n + ng - 1) / ng, done = 0, made = 0;
        while (done < n) {
            int cnt = n - done < per ? n - done : per;
            if (!(parts[made] = fm_cat(cnt, ts + done, ax))) break;
            made++;
            done += cnt;
        }
        if (done == n) r = fm_cat(made, parts, ax);
        ng = made;
        for (int g = 0; g < ng; g++) fm_tensor_release(parts[g]);
        return r;
    }
    fm_tensor *y = fm_tensor_empty(t0->ndim, shape, t0->dtype, fm_tensor_device(t0));
    if (!y) return NULL;
    fm_axis_attrs at = {ax};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_CAT;
    call.n_in = n;
    call.n_out = 1;
    call.var_in = (fm_tensor **)ts;
    call.out[0] = y;
    call.attrs = &at;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    if (record) {
        fm_node *nd = fm_node_begin(FM_OP_CAT, n, ts, cat_backward);
        if (nd) {
            cat_node_attrs na;
            memset(&na, 0, sizeof na);
            na.a = at;
            na.n = n;
            for (int i = 0; i < n; i++) na.sizes[i] = ts[i]->shape[ax];
            FM_NODE_SET_ATTRS(nd, na);
            fm_node_finish(nd, 1, &y);
        }
    }
    return y;
}

fm_tensor *fm_stack(int n, fm_tensor *const *ts, int axis) {
    char s1[96], s2[96];
    if (n < 1 || !ts) { fm_set_error(FM_ERR_INVALID, "stack: needs at least one tensor, got %d", n); return NULL; }
    for (int i = 0; i < n; i++)
        if (!ts[i]) { fm_set_error(FM_ERR_INVALID, "stack: tensor %d is NULL", i); return NULL; }
    for (int i = 1; i < n; i++) {
        bool ok = ts[i]->ndim == ts[0]->ndim;
        for (int d = 0; ok && d < ts[0]->ndim; d++) ok = ts[i]->shape[d] == ts[0]->shape[d];
        if (!ok) {
            fm_set_error(FM_ERR_INVALID, "stack: tensor %d has shape %s but tensor 0 has %s (all must match)", i,
                         fm_shape_str(ts[i]->ndim, ts[i]->shape, s1, sizeof s1),
                         fm_shape_str(ts[0]->ndim, ts[0]->shape, s2, sizeof s2));
            return NULL;
        }
    }
    if (ts[0]->ndim >= FM_MAX_DIMS) {
        fm_set_error(FM_ERR_INVALID, "stack: result would have more than %d dims", FM_MAX_DIMS);
        return NULL;
    }
    int ax;
    if (fm_norm_axis("stack", axis, ts[0]->ndim + 1, &ax) != FM_OK) return NULL;
    fm_tensor *small[16], **us = n <= 16 ? small : calloc((size_t)n, sizeof *us);
    if (!us) { fm_set_error(FM_ERR_OOM, "stack: out of memory for %d tensors", n); return NULL; }
    fm_tensor *r = NULL;
    int made = 0;
    for (; made < n; made++)
        if (!(us[made] = fm_unsqueeze(ts[made], ax))) goto out;
    r = fm_cat(n, us, ax);
out:
    for (int i = 0; i < made; i++) fm_tensor_release(us[i]);
    if (us != small) free(us);
    return r;
}

fm_status fm_split(fm_tensor *t, int axis, int n, const int64_t *sizes, fm_tensor **out) {
    char s1[96];
    if (!t || !out || !sizes || n < 1)
        return fm_set_error(FM_ERR_INVALID, "split: needs a tensor, n >= 1 sizes and an output array (n = %d)", n);
    for (int i = 0; i < n; i++) out[i] = NULL;
    if (t->ndim == 0) return fm_set_error(FM_ERR_INVALID, "split: cannot split a zero-dimensional tensor");
    int ax;
    fm_status st = fm_norm_axis("split", axis, t->ndim, &ax);
    if (st != FM_OK) return st;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0) return fm_set_error(FM_ERR_INVALID, "split: size %d is negative (%lld)", i, (long long)sizes[i]);
        total += sizes[i];
    }
    if (total != t->shape[ax])
        return fm_set_error(FM_ERR_INVALID, "split: sizes sum to %lld but axis %d of %s has size %lld", (long long)total, ax,
                            fm_shape_str(t->ndim, t->shape, s1, sizeof s1), (long long)t->shape[ax]);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        out[i] = fm_narrow(t, ax, off, sizes[i]);
        if (!out[i]) {
            st = fm_last_status();
            for (int k = 0; k < i; k++) { fm_tensor_release(out[k]); out[k] = NULL; }
            return st;
        }
        off += sizes[i];
    }
    return FM_OK;
}

/* ---- gather / index_select ---- */

static bool is_index_dtype(fm_dtype dt) { return dt == FM_I64 || dt == FM_I32; }

/* Gradient of gather / index_select: zeros of the input's shape with the
 * gradient added at the indexed positions (SCATTER_ADD / INDEX_ADD). */
typedef struct index_node_attrs {
    fm_axis_attrs a;
    int ndim;
    int64_t shape[FM_MAX_DIMS];
    fm_dtype dtype;
    fm_device device;
} index_node_attrs;

static fm_status index_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    const index_node_attrs *na = FM_NODE_ATTRS(n, index_node_attrs);
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    fm_tensor *base = fm_tensor_zeros(na->ndim, na->shape, na->dtype, na->device);
    if (!base || !grad_out[0]) { grad_in[0] = base; return base ? FM_OK : fm_last_status(); }
    fm_tensor *r = fm_tensor_empty(na->ndim, na->shape, na->dtype, na->device);
    if (!r) { fm_tensor_release(base); return fm_last_status(); }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = n->op == FM_OP_GATHER ? FM_OP_SCATTER_ADD : FM_OP_INDEX_ADD;
    call.n_in = 3;
    call.n_out = 1;
    call.in[0] = base;
    call.in[1] = n->saved[0];
    call.in[2] = grad_out[0];
    call.out[0] = r;
    call.attrs = &na->a;
    fm_status st = fm_dispatch(&call);
    fm_tensor_release(base);
    if (st != FM_OK) { fm_tensor_release(r); return st; }
    grad_in[0] = r;
    return FM_OK;
}

static fm_tensor *index_op(fm_op_id op, fm_tensor *t, int ax, fm_tensor *index, int ndim, const int64_t *shape) {
    fm_tensor *y = fm_tensor_empty(ndim, shape, t->dtype, fm_tensor_device(t));
    if (!y) return NULL;
    index_node_attrs na;
    memset(&na, 0, sizeof na);
    na.a.axis = ax;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = op;
    call.n_in = 2;
    call.n_out = 1;
    call.in[0] = t;
    call.in[1] = index;
    call.out[0] = y;
    call.attrs = &na.a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    fm_node *n = fm_node_begin(op, 1, &t, index_backward);
    if (n) {
        na.ndim = t->ndim;
        memcpy(na.shape, t->shape, sizeof na.shape);
        na.dtype = t->dtype;
        na.device = fm_tensor_device(t);
        fm_node_save(n, 0, index);
        FM_NODE_SET_ATTRS(n, na);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

fm_tensor *fm_gather(fm_tensor *t, int axis, fm_tensor *index) {
    char s1[96], s2[96];
    if (!t || !index) { fm_set_error(FM_ERR_INVALID, "gather: %s is NULL", t ? "index" : "input"); return NULL; }
    if (!is_index_dtype(index->dtype)) {
        fm_set_error(FM_ERR_INVALID, "gather: index must be i64 or i32, got %s", fm_dtype_name(index->dtype));
        return NULL;
    }
    if (!fm_device_eq(fm_tensor_device(t), fm_tensor_device(index))) {
        fm_set_error(FM_ERR_INVALID, "gather: input and index are on different devices");
        return NULL;
    }
    int ax = 0;
    if (t->ndim > 0 && fm_norm_axis("gather", axis, t->ndim, &ax) != FM_OK) return NULL;
    if (t->ndim == 0 && axis != 0 && axis != -1) {
        fm_set_error(FM_ERR_INVALID, "gather: axis %d is out of range for a zero-dimensional input", axis);
        return NULL;
    }
    bool ok = index->ndim == t->ndim;
    for (int d = 0; ok && d < t->ndim; d++) ok = d == ax || index->shape[d] <= t->shape[d];
    if (!ok) {
        fm_set_error(FM_ERR_INVALID, "gather: index shape %s does not fit input %s (same number of dims, and no larger "
                     "than the input except along axis %d)", fm_shape_str(index->ndim, index->shape, s1, sizeof s1),
                     fm_shape_str(t->ndim, t->shape, s2, sizeof s2), ax);
        return NULL;
    }
    return index_op(FM_OP_GATHER, t, ax, index, index->ndim, index->shape);
}

fm_tensor *fm_index_select(fm_tensor *t, int axis, fm_tensor *index) {
    char s1[96];
    if (!t || !index) { fm_set_error(FM_ERR_INVALID, "index_select: %s is NULL", t ? "index" : "input"); return NULL; }
    if (!is_index_dtype(index->dtype)) {
        fm_set_error(FM_ERR_INVALID, "index_select: index must be i64 or i32, got %s", fm_dtype_name(index->dtype));
        return NULL;
    }
    if (index->ndim > 1) {
        fm_set_error(FM_ERR_INVALID, "index_select: index must be 1-D, got %s", fm_shape_str(index->ndim, index->shape, s1, sizeof s1));
        return NULL;
    }
    if (t->ndim == 0) { fm_set_error(FM_ERR_INVALID, "index_select: input must have at least one dim"); return NULL; }
    if (!fm_device_eq(fm_tensor_device(t), fm_tensor_device(index))) {
        fm_set_error(FM_ERR_INVALID, "index_select: input and index are on different devices");
        return NULL;
    }
    int ax;
    if (fm_norm_axis("index_select", axis, t->ndim, &ax) != FM_OK) return NULL;
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[ax] = fm_tensor_numel(index);
    return index_op(FM_OP_INDEX_SELECT, t, ax, index, t->ndim, shape);
}

/* ---- scatter / scatter_nd ---- */

static const char *const scatter_names[] = {"none", "add", "mul", "amax", "amin"};

const char *fm_scatter_reduce_name(fm_scatter_reduce r) { return (unsigned)r < 5 ? scatter_names[r] : "?"; }

fm_status fm_scatter_reduce_parse(const char *name, fm_scatter_reduce *r) {
    for (int i = 0; name && i < 5; i++)
        if (!strcmp(name, scatter_names[i])) { *r = (fm_scatter_reduce)i; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "scatter: reduce '%s' is not one of none, add, mul, amax, amin", name ? name : "(null)");
}

/* none: t's gradient is zero where an update replaced it, src's the gradient read back at
 * the indices; add: t's gradient passes through. */
static fm_status scatter_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const fm_scatter_attrs *a = FM_NODE_ATTRS(n, fm_scatter_attrs);
    fm_tensor *g = gout[0], *idx = n->saved[0];
    if (!g) { /* no gradient reached the output: zeros */
        for (int i = 0; i < 2; i++) {
            const fm_tensor *x = i ? idx : NULL;
            if (fm_node_needs_grad(n, i) &&
                !(gin[i] = x ? fm_tensor_zeros(x->ndim, x->shape, n->out_dtype[0], n->out_device[0])
                             : fm_tensor_zeros(n->out_ndim[0], n->out_shape[0], n->out_dtype[0], n->out_device[0])))
                return fm_last_status();
        }
        return FM_OK;
    }
    if (fm_node_needs_grad(n, 0)) {
        if (a->reduce == FM_SCATTER_ADD) gin[0] = fm_tensor_retain(g);
        else {
            fm_tensor *z = fm_tensor_zeros(idx->ndim, idx->shape, g->dtype, fm_tensor_device(g));
            gin[0] = z ? fm_scatter(g, a->axis, idx, z, FM_SCATTER_NONE) : NULL;
            fm_tensor_release(z);
        }
        if (!gin[0]) return fm_last_status();
    }
    if (fm_node_needs_grad(n, 1) && !(gin[1] = fm_gather(g, a->axis, idx))) return fm_last_status();
    return FM_OK;
}

/* The common checks of scatter and scatter_nd: non-NULL, one dtype and device, integer indices,
 * and no gradient asked of a form that has none. */
static bool scatter_args_ok(const char *op, fm_tensor *t, fm_tensor *index, fm_tensor *src, fm_scatter_reduce reduce, bool has_grad) {
    if (!t || !index || !src) { fm_set_error(FM_ERR_INVALID, "%s: %s is NULL", op, !t ? "input" : !index ? "index" : "src"); return false; }
    if ((unsigned)reduce > FM_SCATTER_AMIN) { fm_set_error(FM_ERR_INVALID, "%s: unknown reduce %d", op, (int)reduce); return false; }
    if (!is_index_dtype(index->dtype)) {
        fm_set_error(FM_ERR_INVALID, "%s: index must be i64 or i32, got %s", op, fm_dtype_name(index->dtype));
        return false;
    }
    if (src->dtype != t->dtype) {
        fm_set_error(FM_ERR_INVALID, "%s: src has dtype %s but the input %s", op, fm_dtype_name(src->dtype), fm_dtype_name(t->dtype));
        return false;
    }
    if (!fm_device_eq(fm_tensor_device(t), fm_tensor_device(index)) || !fm_device_eq(fm_tensor_device(t), fm_tensor_device(src))) {
        fm_set_error(FM_ERR_INVALID, "%s: input, index and src are not on one device", op);
        return false;
    }
    if (t->ndim == 0) { fm_set_error(FM_ERR_INVALID, "%s: the input must have at least one dim", op); return false; }
    if (reduce != FM_SCATTER_NONE && (t->dtype == FM_BOOL || fm_dtype_size(t->dtype) > 8)) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: reduce '%s' needs a numeric dtype of at most 8 bytes; got %s (reduce 'none' takes any)",
                     op, fm_scatter_reduce_name(reduce), fm_dtype_name(t->dtype));
        return false;
    }
    if (fm_grad_enabled() && (t->requires_grad || src->requires_grad) && !has_grad) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s with reduce '%s' has no gradient (scatter's none and add do); run it without grad",
                     op, fm_scatter_reduce_name(reduce));
        return false;
    }
    return true;
}

static fm_tensor *scatter_dispatch(fm_op_id op, fm_tensor *t, fm_tensor *index, fm_tensor *src, const fm_scatter_attrs *at) {
    fm_tensor *y = fm_tensor_empty(t->ndim, t->shape, t->dtype, fm_tensor_device(t));
    if (!y) return NULL;
    fm_op_call call = {.op = op, .n_in = 3, .n_out = 1, .in = {t, index, src}, .out = {y}, .attrs = at};
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}

fm_tensor *fm_scatter(fm_tensor *t, int axis, fm_tensor *index, fm_tensor *src, fm_scatter_reduce reduce) {
    char s1[96], s2[96], s3[96];
    if (!scatter_args_ok("scatter", t, index, src, reduce, reduce == FM_SCATTER_NONE || reduce == FM_SCATTER_ADD)) return NULL;
    int ax;
    if (fm_norm_axis("scatter", axis, t->ndim, &ax) != FM_OK) return NULL;
    bool ok = index->ndim == t->ndim && src->ndim == t->ndim;
    for (int d = 0; ok && d < t->ndim; d++) ok = (d == ax || index->shape[d] <= t->shape[d]) && index->shape[d] <= src->shape[d];
    if (!ok) {
        fm_set_error(FM_ERR_INVALID, "scatter: index %s does not fit input %s and src %s (one rank; index no larger than src, nor "
                     "than the input except along axis %d)", fm_shape_str(index->ndim, index->shape, s1, sizeof s1),
                     fm_shape_str(t->ndim, t->shape, s2, sizeof s2), fm_shape_str(src->ndim, src->shape, s3, sizeof s3), ax);
        return NULL;
    }
    fm_tensor *part = fm_tensor_retain(src); /* src's part of index's shape, as torch reads it */
    for (int d = 0; part && d < t->ndim; d++)
        if (part->shape[d] != index->shape[d]) {
            fm_tensor *nw = fm_narrow(part, d, 0, index->shape[d]);
            fm_tensor_release(part);
            part = nw;
        }
    fm_scatter_attrs at = {ax, (int)reduce};
    fm_tensor *y = part ? scatter_dispatch(FM_OP_SCATTER, t, index, part, &at) : NULL;
    fm_node *n = y ? fm_node_begin(FM_OP_SCATTER, 2, (fm_tensor *[]){t, part}, scatter_backward) : NULL;
    if (n) {
        fm_node_save(n, 0, index);
        FM_NODE_SET_ATTRS(n, at);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(part);
    return y;
}

fm_tensor *fm_scatter_nd(fm_tensor *t, fm_tensor *indices, fm_tensor *updates, fm_scatter_reduce reduce) {
    char s1[96], s2[96], s3[96];
    if (!scatter_args_ok("scatter_nd", t, indices, updates, reduce, false)) return NULL;
    const int64_t k = indices->ndim ? indices->shape[indices->ndim - 1] : 0;
    bool ok = k >= 1 && k <= t->ndim && updates->ndim == indices->ndim - 1 + t->ndim - k;
    for (int d = 0; ok && d < indices->ndim - 1; d++) ok = updates->shape[d] == indices->shape[d];
    for (int d = (int)k; ok && d < t->ndim; d++) ok = updates->shape[indices->ndim - 1 + d - k] == t->shape[d];
    if (!ok) {
        fm_set_error(FM_ERR_INVALID, "scatter_nd: indices %s and updates %s do not fit input %s (indices [..., k] with 1 <= k <= "
                     "the input's rank; updates of shape indices.shape[:-1] + input.shape[k:])",
                     fm_shape_str(indices->ndim, indices->shape, s1, sizeof s1), fm_shape_str(updates->ndim, updates->shape, s2, sizeof s2),
                     fm_shape_str(t->ndim, t->shape, s3, sizeof s3));
        return NULL;
    }
    fm_scatter_attrs at = {0, (int)reduce};
    return scatter_dispatch(FM_OP_SCATTER_ND, t, indices, updates, &at);
}

fm_tensor *fm_one_hot(fm_tensor *index, int64_t num_classes) {
    if (!index) { fm_set_error(FM_ERR_INVALID, "one_hot: index is NULL"); return NULL; }
    if (index->dtype != FM_I64 && index->dtype != FM_I32 && index->dtype != FM_U8 && index->dtype != FM_I8) {
        fm_set_error(FM_ERR_INVALID, "one_hot: index must be an integer tensor (i64, i32, i8, u8), got %s",
                     fm_dtype_name(index->dtype));
        return NULL;
    }
    if (num_classes < 1) {
        fm_set_error(FM_ERR_INVALID, "one_hot: num_classes must be >= 1, got %lld", (long long)num_classes);
        return NULL;
    }
    if (index->ndim >= FM_MAX_DIMS) {
        fm_set_error(FM_ERR_INVALID, "one_hot: result would have more than %d dims", FM_MAX_DIMS);
        return NULL;
    }
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, index->shape, sizeof(int64_t) * (size_t)index->ndim);
    shape[index->ndim] = num_classes;
    fm_tensor *y = fm_tensor_empty(index->ndim + 1, shape, FM_F32, fm_tensor_device(index));
    if (!y) return NULL;
    fm_one_hot_attrs at = {num_classes};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_ONE_HOT;
    call.n_in = 1;
    call.n_out = 1;
    call.in[0] = index;
    call.out[0] = y;
    call.attrs = &at;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}

/* ---- topk ---- */

typedef struct topk_node { fm_topk_attrs a; int64_t n; /* x's size along the axis */ } topk_node;

/* The values' gradient goes back to the elements they were taken from (distinct within a
 * line, so scatter's replace is the sum); the rest of x gets zero. */
static fm_status topk_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const topk_node *t = FM_NODE_ATTRS(n, topk_node);
    int64_t sh[FM_MAX_DIMS];
    memcpy(sh, n->out_shape[0], sizeof(int64_t) * (size_t)n->out_ndim[0]);
    sh[t->a.axis] = t->n;
    fm_tensor *z = fm_tensor_zeros(n->out_ndim[0], sh, n->out_dtype[0], n->out_device[0]);
    gin[0] = z && gout[0] ? fm_scatter(z, t->a.axis, n->saved[0], gout[0], FM_SCATTER_NONE) : fm_tensor_retain(z);
    fm_tensor_release(z);
    return gin[0] ? FM_OK : fm_last_status();
}

fm_status fm_topk(fm_tensor *x, int64_t k, int axis, bool largest, fm_tensor **values, fm_tensor **indices) {
    if (!values || !indices) return fm_set_error(FM_ERR_INVALID, "topk: values and indices must not be NULL");
    *values = *indices = NULL;
    if (!x) return fm_set_error(FM_ERR_INVALID, "topk: input is NULL");
    if (x->ndim == 0) return fm_set_error(FM_ERR_INVALID, "topk: the input must have at least one dim");
    int ax;
    if (fm_norm_axis("topk", axis, x->ndim, &ax)) return fm_last_status();
    if (k < 0 || k > x->shape[ax])
        return fm_set_error(FM_ERR_INVALID, "topk: k = %" PRId64 " is outside [0, %" PRId64 "], the size of axis %d", k, x->shape[ax], ax);
    int64_t sh[FM_MAX_DIMS];
    memcpy(sh, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    sh[ax] = k;
    fm_tensor *v = fm_tensor_empty(x->ndim, sh, x->dtype, fm_tensor_device(x)), *i = fm_tensor_empty(x->ndim, sh, FM_I64, fm_tensor_device(x));
    fm_topk_attrs at = {k, ax, largest};
    fm_op_call call = {.op = FM_OP_TOPK, .n_in = 1, .n_out = 2, .in = {x}, .out = {v, i}, .attrs = &at};
    if (!v || !i || fm_dispatch(&call) != FM_OK) {
        fm_tensor_release_n(2, v, i);
        return fm_last_status();
    }
    fm_node *n = fm_node_begin(FM_OP_TOPK, 1, &x, topk_backward);
    if (n) {
        topk_node tn = {at, x->shape[ax]};
        FM_NODE_SET_ATTRS(n, tn);
        fm_node_save(n, 0, i);
        fm_node_finish(n, 1, &v);
    }
    *values = v;
    *indices = i;
    return FM_OK;
}

static const char *const pad_names[] = {"constant", "edge", "reflect", "wrap"};

fm_status fm_pad_mode_parse(const char *name, fm_pad_mode *mode) {
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, pad_names[i])) { *mode = (fm_pad_mode)i; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "pad: mode '%s' is not one of constant, edge, reflect, wrap", name ? name : "(null)");
}

const char *fm_pad_mode_name(fm_pad_mode mode) { return (unsigned)mode < 4 ? pad_names[mode] : "?"; }

/* constant mode along one dim: the crop (negative amounts) as a view, then one cat with the filled blocks */
static fm_tensor *pad_constant_dim(fm_tensor *y, int d, int64_t b, int64_t e, double value) {
    const int64_t s0 = b < 0 ? -b : 0, e0 = y->shape[d] - (e < 0 ? -e : 0);
    fm_tensor *cr = fm_slice(y, d, s0, e0, 1), *parts[3] = {NULL, NULL, NULL};
    int n = 0;
    int64_t sh[FM_MAX_DIMS];
    memcpy(sh, y->shape, sizeof sh);
    bool ok = cr != NULL;
    if (ok && b > 0) { sh[d] = b; ok = (parts[n++] = fm_tensor_full(y->ndim, sh, value, y->dtype, fm_tensor_device(y))) != NULL; }
    if (ok) parts[n++] = fm_tensor_retain(cr);
    if (ok && e > 0) { sh[d] = e; ok = (parts[n++] = fm_tensor_full(y->ndim, sh, value, y->dtype, fm_tensor_device(y))) != NULL; }
    fm_tensor *out = ok ? (n == 1 ? fm_tensor_retain(cr) : fm_cat(n, parts, d)) : NULL;
    fm_tensor_release_n(4, cr, parts[0], parts[1], parts[2]);
    return out;
}

/* edge, reflect, wrap along one dim: an index_select of the source position of every output element */
static fm_tensor *pad_gather_dim(fm_tensor *y, int d, int64_t b, int64_t e, fm_pad_mode mode) {
    const int64_t n = y->shape[d], m = n + b + e;
    /* the indices from fathom's allocator, not malloc: its memory limit refuses an amount
     * that passed fm_pad_shape (up to 2^40 a side) but cannot be held (the ONNX fuzzer's
     * Pad of 2^33 asked malloc for 64 GiB) */
    fm_tensor *h = fm_tensor_empty(1, (int64_t[]){m}, FM_I64, FM_CPU), *it = h;
    if (!h) return NULL;
    int64_t *idx = fm_tensor_data(h);
    for (int64_t i = 0; i < m; i++) {
        int64_t j = i - b;
        if (mode == FM_PAD_REFLECT) j = j < 0 ? -j : j >= n ? 2 * (n - 1) - j : j;
        else if (mode == FM_PAD_WRAP) j = ((j % n) + n) % n;
        else j = j < 0 ? 0 : j >= n ? n - 1 : j;
        idx[i] = j;
    }
    if (fm_tensor_device(y).type != FM_DEV_CPU) {
        it = fm_tensor_to(h, fm_tensor_device(y));
        fm_tensor_release(h);
    }
    fm_tensor *out = it ? fm_index_select(y, d, it) : NULL;
    fm_tensor_release(it);
    return out;
}

fm_status fm_pad_shape(int nd, const int64_t *shape, const int64_t *pads, fm_pad_mode mode, int64_t *out) {
    char s1[96];
    if (!shape || !pads || !out || nd < 0 || nd > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "pad: bad arguments");
    if ((unsigned)mode > FM_PAD_WRAP) return fm_set_error(FM_ERR_INVALID, "pad: unknown mode %d", (int)mode);
    for (int d = 0; d < nd; d++) {
        const int64_t n = shape[d], b = pads[d], e = pads[nd + d], lim = INT64_C(1) << 40;
        const char *why = b > lim || e > lim || b < -lim || e < -lim || n + b + e < 0 ? "leaves a negative or too large size"
                          : (b < 0 ? -b : 0) + (e < 0 ? -e : 0) > n ? "crops more elements than the dim has"
                          : mode != FM_PAD_CONSTANT && n == 0 && (b > 0 || e > 0) ? "has no element to repeat"
                          : mode == FM_PAD_REFLECT && (b >= n || e >= n) && (b > 0 || e > 0) ? "reflects more elements than the dim has less one"
                          : NULL;
        if (why)
            return fm_set_error(FM_ERR_INVALID, "pad: %s padding of %lld before and %lld after dim %d of %s %s", fm_pad_mode_name(mode),
                                (long long)b, (long long)e, d, fm_shape_str(nd, shape, s1, sizeof s1), why);
        out[d] = n + b + e;
    }
    return FM_OK;
}

fm_tensor *fm_pad(fm_tensor *x, const int64_t *pads, fm_pad_mode mode, double value) {
    int64_t sh[FM_MAX_DIMS];
    if (!x || !pads) { fm_set_error(FM_ERR_INVALID, "pad: %s is NULL", x ? "pads" : "input"); return NULL; }
    if (fm_pad_shape(x->ndim, x->shape, pads, mode, sh)) return NULL; /* every amount checked before any work */
    const int nd = x->ndim;
    fm_tensor *y = fm_tensor_retain(x);
    for (int d = 0; y && d < nd; d++) {
        const int64_t b = pads[d], e = pads[nd + d];
        if (!b && !e) continue;
        fm_tensor *t = mode == FM_PAD_CONSTANT || (b <= 0 && e <= 0) ? pad_constant_dim(y, d, b, e, value) : pad_gather_dim(y, d, b, e, mode);
        fm_tensor_release(y);
        y = t;
    }
    return y;
}
