/* ONNX shape and indexing ops (Reshape, Transpose, Concat, Slice, Gather, ...)
 * and the constant makers (Constant, ConstantOfShape, Shape, Range). */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

static fm_tensor *i64_tensor(int n, const int64_t *v) {
    int64_t sh[1] = {n};
    return fm_tensor_from_data(v, 1, sh, FM_I64);
}

/* The index tensor of a gather from x, on x's device. */
static fm_tensor *index_for(const fm_tensor *x, int n, const int64_t *v) {
    fm_tensor *h = i64_tensor(n, v);
    if (!h || x->storage->device.type == FM_DEV_CPU) return h;
    fm_tensor *d = fm_tensor_to(h, x->storage->device);
    fm_tensor_release(h);
    return d;
}

/* The axes list: an attribute before `input_opset`, input `input` from then on. */
static fm_status axes_of(const onnx_op_ctx *c, int input_opset, int input, int64_t *ax, int *n) {
    *n = 0;
    if (c->opset >= input_opset) return c->n_in > input && c->in[input] ? onnx_tensor_ints(c, input, ax, FM_MAX_DIMS, n) : FM_OK;
    const int64_t *a = onnx_attr_ints(c, "axes", n);
    if (*n > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_INVALID, "too many axes");
    for (int i = 0; i < *n; i++) ax[i] = a[i];
    return FM_OK;
}

static fm_status op_reshape(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t sh[FM_MAX_DIMS];
    int n;
    if (onnx_tensor_ints(c, 1, sh, FM_MAX_DIMS, &n)) return fm_last_status();
    bool allowzero = onnx_attr_int(c, "allowzero", 0) != 0;
    for (int i = 0; i < n; i++) {
        if (sh[i] == 0 && !allowzero) {
            if (i >= x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "shape[%d] = 0 copies a dimension the input lacks", i);
            sh[i] = x->shape[i];
        }
        if (sh[i] < -1) return onnx_node_error(c, FM_ERR_INVALID, "shape[%d] = %" PRId64 " is invalid", i, sh[i]);
    }
    return onnx_set_out(c, 0, fm_reshape(x, n, sh));
}

static fm_status op_flatten(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t axis = onnx_attr_int(c, "axis", 1);
    if (axis < 0) axis += x->ndim;
    if (axis < 0 || axis > x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "axis out of range");
    int64_t sh[2] = {1, 1};
    for (int d = 0; d < x->ndim; d++) sh[d >= axis] *= x->shape[d];
    return onnx_set_out(c, 0, fm_reshape(x, 2, sh));
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static fm_status op_squeeze(onnx_op_ctx *c) {
    int64_t ax[FM_MAX_DIMS];
    int n;
    fm_tensor *x = c->in[0];
    if (axes_of(c, 13, 1, ax, &n)) return fm_last_status();
    if (n == 0) return onnx_set_out(c, 0, fm_squeeze(x, -100));
    for (int i = 0; i < n; i++) {
        if (ax[i] < 0) ax[i] += x->ndim;
        if (ax[i] < 0 || ax[i] >= x->ndim || x->shape[ax[i]] != 1)
            return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is not a dimension of size 1", ax[i]);
    }
    qsort(ax, (size_t)n, sizeof *ax, cmp_i64);
    fm_tensor *y = fm_tensor_retain(x);
    for (int i = n - 1; y && i >= 0; i--) {
        if (i < n - 1 && ax[i] == ax[i + 1]) continue;
        fm_tensor *t = fm_squeeze(y, (int)ax[i]);
        fm_tensor_release(y);
        y = t;
    }
    return onnx_set_out(c, 0, y);
}

static fm_status op_unsqueeze(onnx_op_ctx *c) {
    int64_t ax[FM_MAX_DIMS];
    int n;
    fm_tensor *x = c->in[0];
    if (axes_of(c, 13, 1, ax, &n)) return fm_last_status();
    int out = x->ndim + n;
    if (out > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "result would have more than 8 dimensions");
    for (int i = 0; i < n; i++) {
        if (ax[i] < 0) ax[i] += out;
        if (ax[i] < 0 || ax[i] >= out) return onnx_node_error(c, FM_ERR_INVALID, "axis out of range");
    }
    qsort(ax, (size_t)n, sizeof *ax, cmp_i64);
    fm_tensor *y = fm_tensor_retain(x);
    for (int i = 0; y && i < n; i++) {
        if (i && ax[i] == ax[i - 1]) { fm_tensor_release(y); return onnx_node_error(c, FM_ERR_INVALID, "repeated axis"); }
        fm_tensor *t = fm_unsqueeze(y, (int)ax[i]);
        fm_tensor_release(y);
        y = t;
    }
    return onnx_set_out(c, 0, y);
}

static fm_status op_transpose(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int n, perm[FM_MAX_DIMS];
    const int64_t *p = onnx_attr_ints(c, "perm", &n);
    if (p && n != x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "perm has %d entries for %d dimensions", n, x->ndim);
    for (int i = 0; i < x->ndim; i++) perm[i] = p ? (int)p[i] : x->ndim - 1 - i;
    return onnx_set_out(c, 0, x->ndim ? fm_permute(x, perm) : fm_tensor_retain(x));
}

static fm_status op_concat(onnx_op_ctx *c) {
    return onnx_set_out(c, 0, fm_cat(c->n_in, c->in, (int)onnx_attr_int(c, "axis", 0)));
}

static fm_status op_split(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int axis;
    if (fm_norm_axis("Split", (int)onnx_attr_int(c, "axis", 0), x->ndim, &axis)) return fm_last_status();
    int64_t sizes[16];
    int n = 0;
    if (c->opset >= 13 && c->n_in > 1 && c->in[1]) {
        if (onnx_tensor_ints(c, 1, sizes, 16, &n)) return fm_last_status();
    } else if (c->opset < 13) {
        const int64_t *s = onnx_attr_ints(c, "split", &n);
        if (n > 16) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "more than 16 outputs");
        for (int i = 0; i < n; i++) sizes[i] = s[i];
    }
    if (n == 0) { /* equal parts (the last one smaller, opset 18) */
        n = c->n_out;
        int64_t each = (x->shape[axis] + n - 1) / n;
        for (int i = 0; i < n; i++) {
            int64_t left = x->shape[axis] - each * i;
            sizes[i] = left < each ? (left > 0 ? left : 0) : each;
        }
    }
    if (n != c->n_out) return onnx_node_error(c, FM_ERR_INVALID, "%d sizes for %d outputs", n, c->n_out);
    return fm_split(x, axis, n, sizes, c->out);
}

/* Elements start, start+step, ... of dim d (negative steps: a gather). */
static fm_tensor *slice_dim(fm_tensor *x, int d, int64_t start, int64_t end, int64_t step) {
    int64_t n = x->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (step > 0) {
        start = start < 0 ? 0 : start > n ? n : start;
        end = end < 0 ? 0 : end > n ? n : end;
        return fm_slice(x, d, start, end > start ? end : start, step);
    }
    start = start < 0 ? 0 : start > n - 1 ? n - 1 : start;
    end = end < -1 ? -1 : end > n - 1 ? n - 1 : end;
    int64_t cnt = start > end ? (start - end + (-step) - 1) / (-step) : 0;
    int64_t *idx = malloc((size_t)(cnt ? cnt : 1) * sizeof *idx);
    if (!idx) { fm_set_error(FM_ERR_OOM, "Slice: out of memory"); return NULL; }
    for (int64_t i = 0; i < cnt; i++) idx[i] = start + i * step;
    fm_tensor *it = index_for(x, (int)cnt, idx), *y = it ? fm_index_select(x, d, it) : NULL;
    free(idx);
    fm_tensor_release(it);
    return y;
}

static fm_status op_slice(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t st[FM_MAX_DIMS], en[FM_MAX_DIMS], ax[FM_MAX_DIMS], sp[FM_MAX_DIMS];
    int ns, ne, na = 0, np = 0;
    if (c->opset < 10) {
        const int64_t *a = onnx_attr_ints(c, "starts", &ns), *b = onnx_attr_ints(c, "ends", &ne), *e;
        if (ns > FM_MAX_DIMS || ne != ns) return onnx_node_error(c, FM_ERR_INVALID, "starts and ends differ in length");
        if (ns) { /* a missing attribute reads as none (NULL), which memcpy may not be given */
            memcpy(st, a, (size_t)ns * sizeof *st);
            memcpy(en, b, (size_t)ne * sizeof *en);
        }
        if ((e = onnx_attr_ints(c, "axes", &na)) && na == ns) memcpy(ax, e, (size_t)na * sizeof *ax);
    } else {
        if (onnx_tensor_ints(c, 1, st, FM_MAX_DIMS, &ns) || onnx_tensor_ints(c, 2, en, FM_MAX_DIMS, &ne)) return fm_last_status();
        if (c->n_in > 3 && c->in[3] && onnx_tensor_ints(c, 3, ax, FM_MAX_DIMS, &na)) return fm_last_status();
        if (c->n_in > 4 && c->in[4] && onnx_tensor_ints(c, 4, sp, FM_MAX_DIMS, &np)) return fm_last_status();
    }
    if (ne != ns || (na && na != ns) || (np && np != ns))
        return onnx_node_error(c, FM_ERR_INVALID, "starts, ends, axes and steps differ in length");
    fm_tensor *y = fm_tensor_retain(x);
    for (int i = 0; y && i < ns; i++) {
        int64_t a = na ? ax[i] : i, step = np ? sp[i] : 1;
        if (a < 0) a += x->ndim;
        if (a < 0 || a >= x->ndim || step == 0) {
            fm_tensor_release(y);
            return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " out of range or step 0", na ? ax[i] : i);
        }
        fm_tensor *t = slice_dim(y, (int)a, st[i], en[i], step);
        fm_tensor_release(y);
        y = t;
    }
    return onnx_set_out(c, 0, y);
}

/* Negative indices count from the end of a dimension of size n. */
static fm_tensor *wrap_indices(fm_tensor *idx, int64_t n) {
    fm_tensor *i64 = fm_to_dtype(idx, FM_I64), *z = fm_tensor_zeros(0, NULL, FM_I64, idx->storage->device);
    fm_tensor *neg = i64 && z ? fm_lt(i64, z) : NULL, *sh = neg ? fm_add_scalar(i64, (double)n) : NULL;
    fm_tensor *y = sh ? fm_where(neg, sh, i64) : NULL;
    REL(i64, z, neg, sh);
    return y;
}

static fm_status op_gather(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *idx = c->in[1];
    int axis;
    if (fm_norm_axis("Gather", (int)onnx_attr_int(c, "axis", 0), x->ndim, &axis)) return fm_last_status();
    if (x->ndim - 1 + idx->ndim > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "result over 8 dimensions");
    int64_t flat_n = fm_tensor_numel(idx), sh[FM_MAX_DIMS];
    fm_tensor *w = wrap_indices(idx, x->shape[axis]), *flat = w ? fm_reshape(w, 1, &flat_n) : NULL;
    fm_tensor *g = flat ? fm_index_select(x, axis, flat) : NULL, *y = NULL;
    if (g) {
        int k = 0;
        for (int d = 0; d < axis; d++) sh[k++] = x->shape[d];
        for (int d = 0; d < idx->ndim; d++) sh[k++] = idx->shape[d];
        for (int d = axis + 1; d < x->ndim; d++) sh[k++] = x->shape[d];
        y = fm_reshape(g, k, sh);
    }
    REL(w, flat, g);
    return onnx_set_out(c, 0, y);
}

static fm_status op_gather_elements(onnx_op_ctx *c) {
    int axis;
    if (fm_norm_axis("GatherElements", (int)onnx_attr_int(c, "axis", 0), c->in[0]->ndim, &axis)) return fm_last_status();
    fm_tensor *w = wrap_indices(c->in[1], c->in[0]->shape[axis]), *y = w ? fm_gather(c->in[0], axis, w) : NULL;
    fm_tensor_release(w);
    return onnx_set_out(c, 0, y);
}

/* Bidirectional broadcast of x's shape with `shape`. */
static fm_status op_expand(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t sh[FM_MAX_DIMS], out[FM_MAX_DIMS];
    int n;
    if (onnx_tensor_ints(c, 1, sh, FM_MAX_DIMS, &n)) return fm_last_status();
    int nd = n > x->ndim ? n : x->ndim;
    for (int i = 0; i < nd; i++) {
        int64_t a = i - (nd - x->ndim) >= 0 ? x->shape[i - (nd - x->ndim)] : 1, b = i - (nd - n) >= 0 ? sh[i - (nd - n)] : 1;
        if (a != b && a != 1 && b != 1)
            return onnx_node_error(c, FM_ERR_INVALID, "shape does not broadcast with the input (dim %d: %" PRId64 " vs %" PRId64 ")", i, a, b);
        out[i] = a == 1 ? b : a;
    }
    fm_tensor *e = fm_expand(x, nd, out), *y = e ? fm_contiguous(e) : NULL;
    fm_tensor_release(e);
    return onnx_set_out(c, 0, y);
}

static fm_status op_tile(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t rep[FM_MAX_DIMS], sh[FM_MAX_DIMS], big[FM_MAX_DIMS], out[FM_MAX_DIMS];
    int n;
    if (onnx_tensor_ints(c, 1, rep, FM_MAX_DIMS, &n)) return fm_last_status();
    if (n != x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "repeats has %d entries for %d dimensions", n, x->ndim);
    if (2 * n > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "Tile supports at most 4 dimensions");
    for (int i = 0; i < n; i++) {
        if (rep[i] < 0) return onnx_node_error(c, FM_ERR_INVALID, "negative repeat");
        if (rep[i] && x->shape[i] > (INT64_C(1) << 40) / rep[i]) /* the product must not overflow (found by fuzz_onnx) */
            return onnx_node_error(c, FM_ERR_INVALID, "repeats %lld times dim %d of size %lld: more than 2^40 elements along it",
                                   (long long)rep[i], i, (long long)x->shape[i]);
        sh[2 * i] = 1, sh[2 * i + 1] = x->shape[i];
        big[2 * i] = rep[i], big[2 * i + 1] = x->shape[i];
        out[i] = rep[i] * x->shape[i];
    }
    fm_tensor *r = fm_reshape(x, 2 * n, sh), *e = r ? fm_expand(r, 2 * n, big) : NULL, *ec = e ? fm_contiguous(e) : NULL;
    fm_tensor *y = ec ? fm_reshape(ec, n, out) : NULL;
    REL(r, e, ec);
    return onnx_set_out(c, 0, y);
}

static fm_status op_shape(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    int64_t s = onnx_attr_int(c, "start", 0), e = onnx_attr_int(c, "end", x->ndim);
    if (s < 0) s += x->ndim;
    if (e < 0) e += x->ndim;
    s = s < 0 ? 0 : s > x->ndim ? x->ndim : s;
    e = e < 0 ? 0 : e > x->ndim ? x->ndim : e;
    return onnx_set_out(c, 0, i64_tensor(e > s ? (int)(e - s) : 0, x->shape + s));
}

static fm_status op_size(onnx_op_ctx *c) {
    int64_t n = fm_tensor_numel(c->in[0]);
    return onnx_set_out(c, 0, fm_tensor_from_data(&n, 0, NULL, FM_I64));
}

static fm_status op_constant(onnx_op_ctx *c) {
    const Onnx__AttributeProto *a;
    int n;
    const int64_t *iv;
    if ((a = onnx_attr(c, "value")) && a->t) {
        char what[256];
        snprintf(what, sizeof what, "value of Constant '%s'", c->node->name ? c->node->name : "");
        return onnx_set_out(c, 0, onnx_tensor_from_proto(a->t, c->model->dir, what));
    }
    if ((a = onnx_attr(c, "value_float")) && a->has_f) return onnx_set_out(c, 0, fm_tensor_from_data(&a->f, 0, NULL, FM_F32));
    if ((a = onnx_attr(c, "value_int")) && a->has_i) return onnx_set_out(c, 0, fm_tensor_from_data(&a->i, 0, NULL, FM_I64));
    if ((a = onnx_attr(c, "value_floats"))) {
        int64_t sh[1] = {(int64_t)a->n_floats};
        return onnx_set_out(c, 0, fm_tensor_from_data(a->floats, 1, sh, FM_F32));
    }
    if ((iv = onnx_attr_ints(c, "value_ints", &n))) return onnx_set_out(c, 0, i64_tensor(n, iv));
    return onnx_node_error(c, FM_ERR_UNSUPPORTED, "no value fathom can read (sparse and string constants are not supported)");
}

static fm_status op_constant_of_shape(onnx_op_ctx *c) {
    int64_t sh[FM_MAX_DIMS];
    int n;
    if (onnx_tensor_ints(c, 0, sh, FM_MAX_DIMS, &n)) return fm_last_status();
    const Onnx__AttributeProto *a = onnx_attr(c, "value");
    fm_tensor *v = a && a->t ? onnx_tensor_from_proto(a->t, NULL, "ConstantOfShape value") : fm_tensor_zeros(0, NULL, FM_F32, FM_CPU);
    if (!v) return fm_last_status();
    if (fm_tensor_numel(v) != 1) {
        fm_tensor_release(v);
        return onnx_node_error(c, FM_ERR_INVALID, "value must hold one element");
    }
    fm_tensor *y = fm_tensor_empty(n, sh, v->dtype, FM_CPU);
    fm_tensor *v0 = y ? fm_reshape(v, 0, NULL) : NULL;
    if (v0 && fm_copy_(y, v0)) fm_tensor_release(y), y = NULL;
    REL(v, v0);
    return onnx_set_out(c, 0, y);
}

static fm_status op_range(onnx_op_ctx *c) {
    for (int i = 0; i < 3; i++)
        if (fm_tensor_numel(c->in[i]) != 1) return onnx_node_error(c, FM_ERR_INVALID, "start, limit and delta must be scalars");
    double s = fm_tensor_item(c->in[0]), l = fm_tensor_item(c->in[1]), d = fm_tensor_item(c->in[2]);
    if (d == 0) return onnx_node_error(c, FM_ERR_INVALID, "delta is 0");
    double cnt = ceil((l - s) / d);
    int64_t n = cnt > 0 ? (int64_t)cnt : 0;
    if (n > ((int64_t)1 << 32)) return onnx_node_error(c, FM_ERR_INVALID, "range of %" PRId64 " elements is too long", n);
    fm_tensor *y = fm_tensor_empty(1, &n, c->in[0]->dtype, FM_CPU);
    for (int64_t i = 0; y && i < n; i++) fm_tensor_set(y, i, s + (double)i * d);
    return onnx_set_out(c, 0, y);
}

/* Pad's arguments: the mode, the pads (an attribute before opset 11, then input 1, over
 * the dims that input 3, axes, lists, from opset 18) as fm_pad's one amount per dim and
 * side of an ndim-dim input, and the constant (attribute `value`, then input 2). */
fm_status onnx_pad_args(const onnx_op_ctx *c, int ndim, int64_t *all, fm_pad_mode *mode, double *value) {
    char buf[16];
    const char *ms = onnx_attr_string(c, "mode", "constant", buf, sizeof buf);
    if (fm_pad_mode_parse(ms, mode)) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "mode='%s' is not supported (constant, edge, reflect, wrap)", ms);
    int64_t pads[2 * FM_MAX_DIMS], ax[FM_MAX_DIMS];
    int n, na = 0;
    *value = 0;
    if (c->opset < 11) {
        const int64_t *p = onnx_attr_ints(c, "pads", &n);
        if (n > 2 * FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_INVALID, "too many pads");
        if (n) memcpy(pads, p, (size_t)n * sizeof *pads);
        *value = onnx_attr_float(c, "value", 0.0f);
    } else {
        if (onnx_tensor_ints(c, 1, pads, 2 * FM_MAX_DIMS, &n)) return fm_last_status();
        if (c->n_in > 2 && c->in[2] && fm_tensor_numel(c->in[2]) == 1) *value = fm_tensor_item(c->in[2]);
        if (c->n_in > 3 && c->in[3] && onnx_tensor_ints(c, 3, ax, FM_MAX_DIMS, &na)) return fm_last_status();
    }
    int k = na ? na : ndim;
    if (n != 2 * k) return onnx_node_error(c, FM_ERR_INVALID, "pads has %d values; %d expected", n, 2 * k);
    memset(all, 0, sizeof(int64_t) * 2 * (size_t)ndim);
    for (int i = 0; i < k; i++) {
        int64_t d = na ? (ax[i] < 0 ? ax[i] + ndim : ax[i]) : i;
        if (d < 0 || d >= ndim) return onnx_node_error(c, FM_ERR_INVALID, "axis %lld out of range for %d dims", (long long)ax[i], ndim);
        all[d] = pads[i], all[ndim + d] = pads[i + k];
    }
    return FM_OK;
}

static fm_status op_pad(onnx_op_ctx *c) {
    int64_t all[2 * FM_MAX_DIMS];
    fm_pad_mode mode;
    double v;
    if (onnx_pad_args(c, c->in[0]->ndim, all, &mode, &v)) return fm_last_status();
    fm_tensor *y = fm_pad(c->in[0], all, mode, v);
    return y ? onnx_set_out(c, 0, y) : fm_last_status();
}

const onnx_op onnx_ops_shape[] = {
    {"Reshape", 5, 2, 2, 1, "allowzero", op_reshape},
    {"Flatten", 1, 1, 1, 1, "axis", op_flatten},
    {"Squeeze", 1, 1, 2, 1, "axes", op_squeeze},
    {"Unsqueeze", 1, 1, 2, 1, "axes", op_unsqueeze},
    {"Transpose", 1, 1, 1, 1, "perm", op_transpose},
    {"Concat", 4, 1, -1, 1, "axis", op_concat},
    {"Split", 2, 1, 2, 16, "axis,split,num_outputs", op_split},
    {"Slice", 1, 1, 5, 1, "starts,ends,axes", op_slice},
    {"Gather", 1, 2, 2, 1, "axis", op_gather},
    {"GatherElements", 11, 2, 2, 1, "axis", op_gather_elements},
    {"Expand", 8, 2, 2, 1, "", op_expand},
    {"Tile", 6, 2, 2, 1, "", op_tile},
    {"Shape", 1, 1, 1, 1, "start,end", op_shape},
    {"Size", 1, 1, 1, 1, "", op_size},
    {"Constant", 1, 0, 0, 1, "value,value_float,value_floats,value_int,value_ints", op_constant},
    {"ConstantOfShape", 9, 1, 1, 1, "value", op_constant_of_shape},
    {"Range", 11, 3, 3, 1, "", op_range},
    {"Pad", 2, 1, 4, 1, "mode,pads,value", op_pad},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
