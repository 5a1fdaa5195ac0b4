/* Differentiable views: new geometry over the same storage, no copy (reshape
 * copies only when the strides make a view impossible). Each records a
 * backward that maps the gradient back to the input's geometry. Also device
 * moves (fm_tensor_to). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "fathom/autograd.h"
#include "dispatch/dispatch.h"
#include "core/dtype_internal.h"
#include "core/tensor_internal.h"
#include "ops/ops_internal.h"

enum view_kind { V_RESHAPE, V_PERMUTE, V_SLICE, V_SELECT, V_EXPAND, V_STRIDED, V_TO };

typedef struct view_attrs {
    int kind;
    int in_ndim;
    int64_t in_shape[FM_MAX_DIMS];
    int perm[FM_MAX_DIMS];
    int dim;
    int64_t start, step, index;
    int64_t rel_offset; /* V_STRIDED: offset relative to the input's */
    int out_ndim;
    int64_t out_shape[FM_MAX_DIMS], out_strides[FM_MAX_DIMS];
    fm_device in_device;
} view_attrs;
_Static_assert(sizeof(view_attrs) <= FM_NODE_ATTR_BYTES, "view_attrs must fit in a node's attrs");

static fm_status view_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const view_attrs *a = FM_NODE_ATTRS(n, view_attrs);
    fm_tensor *g = gout[0];
    switch (a->kind) {
    case V_RESHAPE:
        gin[0] = fm_reshape(g, a->in_ndim, a->in_shape);
        break;
    case V_PERMUTE: {
        int inv[FM_MAX_DIMS];
        for (int i = 0; i < a->in_ndim; i++) inv[a->perm[i]] = i;
        gin[0] = fm_permute(g, inv);
        break;
    }
    case V_EXPAND:
        gin[0] = fm_sum_to(g, a->in_ndim, a->in_shape);
        break;
    case V_SLICE:
    case V_SELECT:
    case V_STRIDED: {
        fm_tensor *z = fm_tensor_zeros(a->in_ndim, a->in_shape, g->dtype, g->storage->device);
        if (!z) return fm_last_status();
        fm_tensor *v;
        if (a->kind == V_SLICE) {
            int64_t st[FM_MAX_DIMS], sh[FM_MAX_DIMS];
            memcpy(sh, z->shape, sizeof sh);
            memcpy(st, z->strides, sizeof st);
            int64_t off = a->start * z->strides[a->dim];
            sh[a->dim] = g->shape[a->dim];
            st[a->dim] *= a->step;
            v = fm_view_raw(z, z->ndim, sh, st, off);
        } else if (a->kind == V_SELECT) {
            int64_t st[FM_MAX_DIMS], sh[FM_MAX_DIMS];
            int k = 0;
            for (int i = 0; i < z->ndim; i++)
                if (i != a->dim) { sh[k] = z->shape[i]; st[k] = z->strides[i]; k++; }
            v = fm_view_raw(z, k, sh, st, a->index * z->strides[a->dim]);
        } else {
            v = fm_view_raw(z, a->out_ndim, a->out_shape, a->out_strides, a->rel_offset);
        }
        fm_status st = v ? fm_copy_(v, g) : fm_last_status();
        fm_tensor_release(v);
        if (st) { fm_tensor_release(z); return st; }
        gin[0] = z;
        break;
    }
    case V_TO:
        gin[0] = fm_tensor_to(g, a->in_device);
        break;
    default: return fm_set_error(FM_ERR_INTERNAL, "view backward: unknown kind");
    }
    return gin[0] ? FM_OK : fm_last_status();
}

static fm_tensor *record(fm_tensor *x, fm_tensor *y, const view_attrs *a, const char *name) {
    fm_node *n = fm_node_begin(FM_OP_COPY, 1, &x, view_backward);
    if (n) {
        n->name = name;
        FM_NODE_SET_ATTRS(n, *a);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

static view_attrs base_attrs(const fm_tensor *x, int kind) {
    view_attrs a;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.in_ndim = x->ndim;
    memcpy(a.in_shape, x->shape, sizeof a.in_shape);
    a.in_device = x->storage->device;
    return a;
}

/* Strides for viewing x as `shape` without copying, or false if impossible.
 * Old dims are grouped into runs that are contiguous with each other in memory;
 * each run must map onto a run of new dims with the same element count. */
static bool view_strides(const fm_tensor *x, int ndim, const int64_t *shape, int64_t *strides) {
    if (fm_tensor_is_contiguous(x) || fm_tensor_numel(x) == 0) { fm_contiguous_strides(ndim, shape, strides); return true; }
    int view_d = ndim - 1;
    int64_t base = x->strides[x->ndim - 1], tn = 1, vn = 1;
    for (int td = x->ndim - 1; td >= 0; td--) {
        tn *= x->shape[td];
        if (td == 0 || (x->shape[td - 1] != 1 && x->strides[td - 1] != tn * base)) {
            while (view_d >= 0 && (vn < tn || shape[view_d] == 1)) {
                strides[view_d] = vn * base;
                vn *= shape[view_d];
                view_d--;
            }
            if (vn != tn) return false;
            if (td > 0) { base = x->strides[td - 1]; tn = 1; vn = 1; }
        }
    }
    return view_d == -1;
}

static fm_status resolve_shape(const char *op, const fm_tensor *x, int ndim, const int64_t *in, int64_t *out) {
    if (ndim < 0 || ndim > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "%s: %d dimensions (max %d)", op, ndim, FM_MAX_DIMS);
    int infer = -1;
    int64_t known = 1;
    bool overflow = false; /* sizes whose product exceeds int64 cannot be any tensor's */
    for (int i = 0; i < ndim; i++) {
        out[i] = in[i];
        if (in[i] == -1) {
            if (infer >= 0) return fm_set_error(FM_ERR_INVALID, "%s: only one dimension can be -1", op);
            infer = i;
        } else if (in[i] < 0) {
            return fm_set_error(FM_ERR_INVALID, "%s: invalid size %" PRId64 " in dimension %d", op, in[i], i);
        } else {
            overflow |= __builtin_mul_overflow(known, in[i], &known);
        }
    }
    int64_t n = fm_tensor_numel(x);
    if (overflow) goto bad;
    if (infer >= 0) {
        if (known == 0 || n % known) goto bad;
        out[infer] = n / known;
    } else if (known != n) {
        goto bad;
    }
    return FM_OK;
bad: {
    char a[128], b[128];
    return fm_set_error(FM_ERR_INVALID, "%s: cannot view a tensor of shape %s (%" PRId64 " elements) as %s", op,
                        fm_shape_str(x->ndim, x->shape, a, sizeof a), n, fm_shape_str(ndim, in, b, sizeof b));
}
}

fm_tensor *fm_view(fm_tensor *x, int ndim, const int64_t *shape_in) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "view: tensor is NULL"); return NULL; }
    int64_t shape[FM_MAX_DIMS], strides[FM_MAX_DIMS];
    if (resolve_shape("view", x, ndim, shape_in, shape)) return NULL;
    if (!view_strides(x, ndim, shape, strides)) {
        char a[128], b[128];
        fm_set_error(FM_ERR_INVALID, "view: a tensor of shape %s with these strides cannot be viewed as %s without a copy; use fm_reshape",
                     fm_shape_str(x->ndim, x->shape, a, sizeof a), fm_shape_str(ndim, shape, b, sizeof b));
        return NULL;
    }
    fm_tensor *y = fm_view_raw(x, ndim, shape, strides, x->offset);
    if (!y) return NULL;
    view_attrs a = base_attrs(x, V_RESHAPE);
    return record(x, y, &a, "view");
}

fm_tensor *fm_reshape(fm_tensor *x, int ndim, const int64_t *shape_in) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "reshape: tensor is NULL"); return NULL; }
    int64_t shape[FM_MAX_DIMS], strides[FM_MAX_DIMS];
    if (resolve_shape("reshape", x, ndim, shape_in, shape)) return NULL;
    if (view_strides(x, ndim, shape, strides)) {
        fm_tensor *y = fm_view_raw(x, ndim, shape, strides, x->offset);
        if (!y) return NULL;
        view_attrs a = base_attrs(x, V_RESHAPE);
        return record(x, y, &a, "reshape");
    }
    fm_tensor *c = fm_contiguous(x);
    if (!c) return NULL;
    fm_tensor *y = fm_view(c, ndim, shape);
    fm_tensor_release(c);
    return y;
}

fm_tensor *fm_permute(fm_tensor *x, const int *perm) {
    if (!x || !perm) { fm_set_error(FM_ERR_INVALID, "permute: NULL argument"); return NULL; }
    int64_t sh[FM_MAX_DIMS], st[FM_MAX_DIMS];
    bool seen[FM_MAX_DIMS] = {0};
    view_attrs a = base_attrs(x, V_PERMUTE);
    for (int i = 0; i < x->ndim; i++) {
        int p;
        if (fm_norm_axis("permute", perm[i], x->ndim, &p)) return NULL;
        if (seen[p]) { fm_set_error(FM_ERR_INVALID, "permute: axis %d appears twice in the permutation", p); return NULL; }
        seen[p] = true;
        sh[i] = x->shape[p];
        st[i] = x->strides[p];
        a.perm[i] = p;
    }
    fm_tensor *y = fm_view_raw(x, x->ndim, sh, st, x->offset);
    return y ? record(x, y, &a, "permute") : NULL;
}

fm_tensor *fm_transpose(fm_tensor *x, int d0, int d1) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "transpose: tensor is NULL"); return NULL; }
    int a, b;
    if (fm_norm_axis("transpose", d0, x->ndim, &a) || fm_norm_axis("transpose", d1, x->ndim, &b)) return NULL;
    int perm[FM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return fm_permute(x, perm);
}

fm_tensor *fm_slice(fm_tensor *x, int dim, int64_t start, int64_t end, int64_t step) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "slice: tensor is NULL"); return NULL; }
    int d;
    if (fm_norm_axis("slice", dim, x->ndim, &d)) return NULL;
    if (x->ndim == 0) { fm_set_error(FM_ERR_INVALID, "slice: cannot slice a 0-dimensional tensor"); return NULL; }
    if (step <= 0) { fm_set_error(FM_ERR_INVALID, "slice: step must be positive (got %" PRId64 ")", step); return NULL; }
    int64_t n = x->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0) start = 0;
    if (end > n) end = n;
    if (start > n) start = n;
    if (end < start) end = start;
    int64_t sh[FM_MAX_DIMS], st[FM_MAX_DIMS];
    memcpy(sh, x->shape, sizeof sh);
    memcpy(st, x->strides, sizeof st);
    sh[d] = (end - start + step - 1) / step;
    st[d] = x->strides[d] * step;
    fm_tensor *y = fm_view_raw(x, x->ndim, sh, st, x->offset + start * x->strides[d]);
    if (!y) return NULL;
    view_attrs a = base_attrs(x, V_SLICE);
    a.dim = d;
    a.start = start;
    a.step = step;
    return record(x, y, &a, "slice");
}

fm_tensor *fm_narrow(fm_tensor *x, int dim, int64_t start, int64_t length) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "narrow: tensor is NULL"); return NULL; }
    int d;
    if (fm_norm_axis("narrow", dim, x->ndim, &d)) return NULL;
    if (x->ndim == 0 || start < 0 || length < 0 || start > x->shape[d] - length) {
        char sb[128];
        fm_set_error(FM_ERR_INVALID, "narrow: range [%" PRId64 ", %" PRId64 ") is outside dimension %d of size %" PRId64 " (shape %s)",
                     start, start + length, d, x->ndim ? x->shape[d] : 0, fm_shape_str(x->ndim, x->shape, sb, sizeof sb));
        return NULL;
    }
    return fm_slice(x, d, start, start + length, 1);
}

fm_tensor *fm_select(fm_tensor *x, int dim, int64_t index) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "select: tensor is NULL"); return NULL; }
    int d;
    if (fm_norm_axis("select", dim, x->ndim, &d)) return NULL;
    if (x->ndim == 0) { fm_set_error(FM_ERR_INVALID, "select: cannot index a 0-dimensional tensor"); return NULL; }
    int64_t n = x->shape[d];
    if (index < -n || index >= n) {
        fm_set_error(FM_ERR_INVALID, "select: index %" PRId64 " is out of range for dimension %d of size %" PRId64, index, d, n);
        return NULL;
    }
    if (index < 0) index += n;
    int64_t sh[FM_MAX_DIMS], st[FM_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < x->ndim; i++)
        if (i != d) { sh[k] = x->shape[i]; st[k] = x->strides[i]; k++; }
    fm_tensor *y = fm_view_raw(x, k, sh, st, x->offset + index * x->strides[d]);
    if (!y) return NULL;
    view_attrs a = base_attrs(x, V_SELECT);
    a.dim = d;
    a.index = index;
    return record(x, y, &a, "select");
}

fm_tensor *fm_expand(fm_tensor *x, int ndim, const int64_t *shape) {
    if (!x || !shape) { fm_set_error(FM_ERR_INVALID, "expand: NULL argument"); return NULL; }
    if (ndim < x->ndim || ndim > FM_MAX_DIMS) {
        fm_set_error(FM_ERR_INVALID, "expand: cannot expand %d dimensions to %d", x->ndim, ndim);
        return NULL;
    }
    int64_t sh[FM_MAX_DIMS], st[FM_MAX_DIMS];
    int lead = ndim - x->ndim;
    for (int i = 0; i < ndim; i++) {
        int xi = i - lead;
        int64_t want = shape[i];
        if (xi < 0) {
            if (want < 0) goto bad;
            sh[i] = want;
            st[i] = 0;
        } else if (want == -1 || want == x->shape[xi]) {
            sh[i] = x->shape[xi];
            st[i] = x->strides[xi];
        } else if (x->shape[xi] == 1 && want >= 0) {
            sh[i] = want;
            st[i] = 0;
        } else {
            goto bad;
        }
    }
    fm_tensor *y = fm_view_raw(x, ndim, sh, st, x->offset);
    if (!y) return NULL;
    view_attrs a = base_attrs(x, V_EXPAND);
    return record(x, y, &a, "expand");
bad: {
    char a1[128], b1[128];
    fm_set_error(FM_ERR_INVALID, "expand: shape %s cannot be expanded to %s (only size-1 dimensions can grow)",
                 fm_shape_str(x->ndim, x->shape, a1, sizeof a1), fm_shape_str(ndim, shape, b1, sizeof b1));
    return NULL;
}
}

fm_tensor *fm_squeeze(fm_tensor *x, int dim) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "squeeze: tensor is NULL"); return NULL; }
    int64_t sh[FM_MAX_DIMS];
    int k = 0;
    if (dim == -100) {
        for (int i = 0; i < x->ndim; i++)
            if (x->shape[i] != 1) sh[k++] = x->shape[i];
    } else {
        int d;
        if (fm_norm_axis("squeeze", dim, x->ndim, &d)) return NULL;
        for (int i = 0; i < x->ndim; i++)
            if (i != d || x->shape[i] != 1) sh[k++] = x->shape[i];
    }
    return fm_reshape(x, k, sh);
}

fm_tensor *fm_unsqueeze(fm_tensor *x, int dim) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "unsqueeze: tensor is NULL"); return NULL; }
    if (x->ndim >= FM_MAX_DIMS) { fm_set_error(FM_ERR_INVALID, "unsqueeze: tensor already has %d dimensions", FM_MAX_DIMS); return NULL; }
    int d;
    if (fm_norm_axis("unsqueeze", dim, x->ndim + 1, &d)) return NULL;
    int64_t sh[FM_MAX_DIMS];
    for (int i = 0, k = 0; i <= x->ndim; i++) sh[i] = i == d ? 1 : x->shape[k++];
    return fm_reshape(x, x->ndim + 1, sh);
}

fm_tensor *fm_flatten(fm_tensor *x, int start_dim, int end_dim) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "flatten: tensor is NULL"); return NULL; }
    if (x->ndim == 0) return fm_reshape(x, 1, (int64_t[]){1});
    int s, e;
    if (fm_norm_axis("flatten", start_dim, x->ndim, &s) || fm_norm_axis("flatten", end_dim, x->ndim, &e)) return NULL;
    if (s > e) { fm_set_error(FM_ERR_INVALID, "flatten: start_dim %d is after end_dim %d", s, e); return NULL; }
    int64_t sh[FM_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < s; i++) sh[k++] = x->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++) m *= x->shape[i];
    sh[k++] = m;
    for (int i = e + 1; i < x->ndim; i++) sh[k++] = x->shape[i];
    return fm_reshape(x, k, sh);
}

fm_tensor *fm_as_strided(fm_tensor *x, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset) {
    if (!x || (ndim && (!shape || !strides))) { fm_set_error(FM_ERR_INVALID, "as_strided: NULL argument"); return NULL; }
    for (int i = 0; i < ndim; i++)
        if (strides[i] < 0) { fm_set_error(FM_ERR_INVALID, "as_strided: negative stride %" PRId64, strides[i]); return NULL; }
    fm_tensor *y = fm_view_raw(x, ndim, shape, strides, offset);
    if (!y) return NULL;
    if (!x->requires_grad) return y;
    if (!fm_tensor_is_contiguous(x)) return y; /* gradient only defined relative to a contiguous base */
    view_attrs a = base_attrs(x, V_STRIDED);
    a.out_ndim = ndim;
    memcpy(a.out_shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(a.out_strides, strides, sizeof(int64_t) * (size_t)ndim);
    a.rel_offset = offset - x->offset;
    return record(x, y, &a, "as_strided");
}

/* ---- device moves ---- */

/* Between two devices (two GPUs, a GPU and the check device): through a host
 * buffer, since backends are peers and know only their own memory. */
static fm_status copy_through_host(const fm_backend *bs, int si, const fm_backend *bd, int di, void *dst, const void *src,
                                   size_t nb) {
    void *h = malloc(nb ? nb : 1);
    if (!h) return fm_set_error(FM_ERR_OOM, "to: no host memory for a %zu-byte staging copy between devices", nb);
    fm_status st = bs->copy_d2h(si, h, src, nb);
    if (st == FM_OK) st = bs->synchronize ? bs->synchronize(si) : FM_OK;
    if (st == FM_OK) st = bd->copy_h2d(di, dst, h, nb);
    if (st == FM_OK) st = bd->synchronize ? bd->synchronize(di) : FM_OK; /* h is freed next */
    free(h);
    return st;
}

fm_tensor *fm_tensor_to(fm_tensor *x, fm_device dev) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "to: tensor is NULL"); return NULL; }
    fm_device src = x->storage->device;
    if (fm_device_eq(src, dev)) return fm_tensor_retain(x);
    const fm_backend *bs = fm_backend_get(src.type), *bd = fm_backend_get(dev.type);
    char dn[32];
    if (!bd || fm_device_validate(dev) != FM_OK) {
        /* fm_device_validate says why: not built, no driver, no device, index out of range */
        if (!bd && fm_device_validate(dev) == FM_OK)
            fm_set_error(FM_ERR_UNSUPPORTED, "to: device %s is not available (see `fathom info`)", fm_device_name(dev, dn, sizeof dn));
        return NULL;
    }
    fm_tensor *c = fm_contiguous(x);
    if (!c) return NULL;
    fm_tensor *y = fm_tensor_empty(c->ndim, c->shape, c->dtype, dev);
    if (!y) { fm_tensor_release(c); return NULL; }
    size_t nb = fm_tensor_nbytes(c);
    fm_status st;
    if (src.type == FM_DEV_CPU) st = bd->copy_h2d(dev.index, y->storage->data, fm_tensor_data(c), nb);
    else if (dev.type == FM_DEV_CPU) st = bs->copy_d2h(src.index, y->storage->data, fm_tensor_data(c), nb);
    else st = copy_through_host(bs, src.index, bd, dev.index, y->storage->data, fm_tensor_data(c), nb);
    fm_tensor_release(c);
    if (st) { fm_tensor_release(y); return NULL; }
    view_attrs a = base_attrs(x, V_TO);
    return record(x, y, &a, "to");
}

fm_status fm_tensor_move_(fm_tensor *t, fm_device dev) {
    if (!t) return fm_set_error(FM_ERR_INVALID, "move_: tensor is NULL");
    if (t->grad_fn)
        return fm_set_error(FM_ERR_INVALID, "move_: the tensor is computed (it has a gradient function); move the leaves "
                                            "it comes from, or use fm_tensor_to for a copy");
    fm_status st = fm_device_validate(dev);
    if (st != FM_OK) return st;
    if (t->grad && (st = fm_tensor_move_(t->grad, dev)) != FM_OK) return st;
    if (fm_device_eq(t->storage->device, dev)) return FM_OK;
    bool prev = fm_set_grad_enabled(false); /* a copy, not an op to record */
    fm_tensor *y = fm_tensor_to(t, dev);
    fm_set_grad_enabled(prev);
    if (!y) return fm_last_status();
    /* t takes y's storage and its contiguous geometry; y goes */
    fm_storage *old = t->storage;
    t->storage = y->storage;
    __atomic_add_fetch(&t->storage->refcount, 1, __ATOMIC_RELAXED);
    t->offset = y->offset;
    memcpy(t->strides, y->strides, sizeof t->strides);
    fm_storage_release(old);
    fm_tensor_release(y);
    return FM_OK;
}

/* ---- fill ---- */

fm_status fm_cpu_fill(fm_tensor *t, double v) {
    int64_t n = fm_tensor_numel(t);
    size_t es = fm_dtype_size(t->dtype);
    char *base = (char *)t->storage->data;
    if (fm_tensor_is_contiguous(t)) {
        char *p = base + t->offset * (int64_t)es;
        if (t->dtype == FM_F32) { float f = (float)v; float *q = (float *)p; for (int64_t i = 0; i < n; i++) q[i] = f; return FM_OK; }
        if (v == 0.0 && !signbit(v)) { memset(p, 0, (size_t)n * es); return FM_OK; }
        if (n == 0) return FM_OK;
        fm_store_f64(p, t->dtype, v);
        for (int64_t i = 1; i < n; i++) memcpy(p + i * (int64_t)es, p, es);
        return FM_OK;
    }
    for (int64_t i = 0; i < n; i++) fm_store_f64(base + fm_tensor_elem_offset(t, i) * (int64_t)es, t->dtype, v);
    return FM_OK;
}
