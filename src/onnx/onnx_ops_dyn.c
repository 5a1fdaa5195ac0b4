/* ONNX ops whose output shapes depend on the input values: NonMaxSuppression (the box
 * selection that SSD, YOLO and Faster R-CNN exports end with), NonZero, Compress and
 * Unique. Their results cannot be sized before the values are known, and they are small
 * next to the layers around them, so they run on the host: the input comes over as a
 * contiguous f64 (floats) or i64 (integers, bools) buffer, which holds every fathom
 * dtype exactly, and the result goes back to the input's device in the input's dtype
 * (indices as int64). They have no graph form: a graph's shapes are fixed when it is built. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }
static const char *in_name(const onnx_op_ctx *c, int k) { return k < (int)c->node->n_input ? c->node->input[k] : "?"; }
static fm_tensor *opt_in(const onnx_op_ctx *c, int k) { return k < c->n_in ? c->in[k] : NULL; }

/* x on the host as 8-byte elements: f64 for floats, i64 for the rest. */
static fm_tensor *host8(fm_tensor *x) { return onnx_host(x, fm_dtype_is_float(x->dtype) ? FM_F64 : FM_I64); }

static fm_status oom(const onnx_op_ctx *c) { return onnx_node_error(c, FM_ERR_OOM, "out of memory"); }

/* An int64 tensor of the given shape holding v, on dev. */
static fm_tensor *i64_out(const int64_t *v, int ndim, const int64_t *shape, fm_device dev) {
    fm_tensor *h = fm_tensor_empty(ndim, shape, FM_I64, FM_CPU);
    if (!h) return NULL;
    int64_t n = fm_tensor_numel(h);
    if (n) memcpy(fm_tensor_data(h), v, (size_t)n * sizeof *v);
    return onnx_host_back(h, FM_I64, dev);
}

/* dst[o, j, i] = src[o, idx[j], i] for 8-byte elements, src seen as [outer, len, inner]. */
static void gather8(const void *src, void *dst, int64_t outer, int64_t len, int64_t inner, const int64_t *idx, int64_t k) {
    const char *s = src;
    char *d = dst;
    const size_t row = (size_t)inner * 8;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++, d += row) memcpy(d, s + (size_t)(o * len + idx[j]) * row, row);
}

/* The comparisons below are stable-sorted, which qsort is not (and qsort_r, which would
 * carry the context, is not portable): a bottom-up merge sort of indices. */
typedef int (*idx_cmp)(const void *ctx, int64_t a, int64_t b);
static void merge_sort(int64_t *idx, int64_t *tmp, int64_t n, idx_cmp cmp, const void *ctx) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = mid + w < n ? mid + w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(ctx, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

/* ---- NonMaxSuppression ----
 * Per batch and class: the boxes above score_threshold by descending score (equal scores
 * by ascending index: ONNX Runtime's order), each kept unless its IoU with a box already
 * kept in that class is above iou_threshold, up to max_output_boxes_per_class. Sorting is
 * O(N log N) and each candidate meets only the kept boxes. The extents and the IoU are
 * computed in float with ONNX Runtime's operations in its order, so that an IoU that
 * equals the threshold falls on the same side as there. */
typedef struct nms_box { float x0, x1, y0, y1, area; } nms_box;
typedef struct nms_args { int64_t max_out; float iou, score; bool has_score, center; } nms_args;

static void min_max(float a, float b, float *lo, float *hi) {
    *lo = a >= b ? b : a;
    *hi = a >= b ? a : b;
}

static nms_box nms_extent(const float *b, bool center) {
    nms_box r;
    if (center) {
        const float hw = b[2] / 2, hh = b[3] / 2;
        r.x0 = b[0] - hw, r.x1 = b[0] + hw, r.y0 = b[1] - hh, r.y1 = b[1] + hh;
    } else {
        min_max(b[1], b[3], &r.x0, &r.x1);
        min_max(b[0], b[2], &r.y0, &r.y1);
    }
    r.area = (r.x1 - r.x0) * (r.y1 - r.y0);
    return r;
}

static bool nms_suppresses(const nms_box *a, const nms_box *b, float thr) {
    const float ix0 = a->x0 < b->x0 ? b->x0 : a->x0, ix1 = b->x1 < a->x1 ? b->x1 : a->x1;
    if (ix1 <= ix0) return false;
    const float iy0 = a->y0 < b->y0 ? b->y0 : a->y0, iy1 = b->y1 < a->y1 ? b->y1 : a->y1;
    if (iy1 <= iy0) return false;
    const float inter = (ix1 - ix0) * (iy1 - iy0);
    if (inter <= 0) return false;
    const float uni = a->area + b->area - inter;
    if (a->area <= 0 || b->area <= 0 || uni <= 0) return false;
    return inter / uni > thr;
}

/* Descending score; NaN after every number (a total order, so the sort is defined). */
static int nms_by_score(const void *ctx, int64_t a, int64_t b) {
    const float *s = ctx;
    if (isnan(s[a]) != isnan(s[b])) return isnan(s[a]) ? 1 : -1;
    return s[a] > s[b] ? -1 : s[a] < s[b] ? 1 : 0;
}

/* A float scalar input (omitted or empty: absent); false with the error set when it is not one. */
static bool nms_scalar(const onnx_op_ctx *c, int k, float *v, bool *has, fm_status *st) {
    fm_tensor *t = opt_in(c, k), *h;
    *has = false;
    if (!t || fm_tensor_numel(t) == 0) return true;
    if (!fm_dtype_is_float(t->dtype) || fm_tensor_numel(t) != 1 || t->ndim > 1) {
        *st = onnx_node_error(c, FM_ERR_INVALID, "input %d ('%s') must be a float scalar; got %s of rank %d with %" PRId64 " elements",
                              k, in_name(c, k), fm_dtype_name(t->dtype), t->ndim, fm_tensor_numel(t));
        return false;
    }
    if (!(h = onnx_host(t, FM_F32))) return *st = fm_last_status(), false;
    *v = *(const float *)fm_tensor_data(h);
    *has = true;
    fm_tensor_release(h);
    return true;
}

static fm_status nms_check(const onnx_op_ctx *c, nms_args *a) {
    const fm_tensor *b = c->in[0], *s = c->in[1];
    char bs[96], ss[96];
    fm_shape_str(b->ndim, b->shape, bs, sizeof bs), fm_shape_str(s->ndim, s->shape, ss, sizeof ss);
    for (int k = 0; k < 2; k++)
        if (!fm_dtype_is_float(c->in[k]->dtype))
            return onnx_node_error(c, FM_ERR_INVALID, "input %d ('%s') has dtype %s; it must be float", k, in_name(c, k),
                                   fm_dtype_name(c->in[k]->dtype));
    if (b->ndim != 3 || b->shape[2] != 4)
        return onnx_node_error(c, FM_ERR_INVALID, "input 0 ('%s') has shape %s; expected [num_batches, spatial_dimension, 4]", in_name(c, 0), bs);
    if (s->ndim != 3 || s->shape[0] != b->shape[0] || s->shape[2] != b->shape[1])
        return onnx_node_error(c, FM_ERR_INVALID, "input 1 ('%s') has shape %s; expected [num_batches, num_classes, spatial_dimension] "
                               "= [%" PRId64 ", C, %" PRId64 "] for boxes of shape %s", in_name(c, 1), ss, b->shape[0], b->shape[1], bs);
    int64_t cpb = onnx_attr_int(c, "center_point_box", 0), mo = 0;
    if (cpb != 0 && cpb != 1) return onnx_node_error(c, FM_ERR_INVALID, "center_point_box is %" PRId64 "; it must be 0 or 1", cpb);
    int n = 0;
    if (opt_in(c, 2) && onnx_tensor_ints(c, 2, &mo, 1, &n)) return fm_last_status();
    *a = (nms_args){.max_out = n && mo > 0 ? mo : 0, .center = cpb == 1};
    bool has_iou = false;
    fm_status st = FM_OK;
    if (!nms_scalar(c, 3, &a->iou, &has_iou, &st) || !nms_scalar(c, 4, &a->score, &a->has_score, &st)) return st;
    if (!has_iou) a->iou = 0;
    if (!(a->iou >= 0 && a->iou <= 1))
        return onnx_node_error(c, FM_ERR_INVALID, "input 3 ('%s'), iou_threshold, is %g; it must be in [0, 1]", in_name(c, 3), a->iou);
    return FM_OK;
}

/* The selected (batch, class, box) triples so far. */
typedef struct nms_sel { int64_t *v, n, cap; } nms_sel;

/* Batch bi, class ci: the boxes kept, appended to *out; work holds 3 nb indices. */
static fm_status nms_class(const nms_args *a, const nms_box *bx, const float *sc, int64_t nb, int64_t bi, int64_t ci, int64_t *work,
                           nms_sel *out) {
    int64_t *cand = work, *kept = work + 2 * nb, nc = 0, nk = 0;
    for (int64_t i = 0; i < nb; i++)
        if (!a->has_score || sc[i] > a->score) cand[nc++] = i;
    merge_sort(cand, work + nb, nc, nms_by_score, sc);
    for (int64_t k = 0; k < nc && nk < a->max_out; k++) {
        bool keep = true;
        for (int64_t j = 0; j < nk && keep; j++) keep = !nms_suppresses(&bx[cand[k]], &bx[kept[j]], a->iou);
        if (!keep) continue;
        kept[nk++] = cand[k];
        if (out->n == out->cap) {
            int64_t cap = out->cap ? 2 * out->cap : 64, *g = realloc(out->v, (size_t)cap * 3 * sizeof *g);
            if (!g) return FM_ERR_OOM;
            out->v = g, out->cap = cap;
        }
        int64_t *t = out->v + 3 * out->n++;
        t[0] = bi, t[1] = ci, t[2] = cand[k];
    }
    return FM_OK;
}

static fm_status op_nms(onnx_op_ctx *c) {
    nms_args a;
    if (nms_check(c, &a)) return fm_last_status();
    fm_tensor *bh = onnx_host(c->in[0], FM_F32), *sh = bh ? onnx_host(c->in[1], FM_F32) : NULL;
    const int64_t nbat = c->in[0]->shape[0], nb = c->in[0]->shape[1], ncls = c->in[1]->shape[1];
    int64_t *work = sh ? malloc((size_t)(3 * nb + 1) * sizeof *work) : NULL;
    nms_box *bx = work ? malloc((size_t)(nb + 1) * sizeof *bx) : NULL;
    nms_sel sel = {0};
    fm_status st = !sh ? fm_last_status() : !bx ? oom(c) : FM_OK;
    for (int64_t b = 0; !st && b < nbat && a.max_out; b++) {
        const float *bp = (const float *)fm_tensor_data(bh) + b * nb * 4, *sp = (const float *)fm_tensor_data(sh) + b * ncls * nb;
        for (int64_t i = 0; i < nb; i++) bx[i] = nms_extent(bp + 4 * i, a.center);
        for (int64_t k = 0; !st && k < ncls; k++)
            if (nms_class(&a, bx, sp + k * nb, nb, b, k, work, &sel)) st = oom(c);
    }
    const int64_t shape[2] = {sel.n, 3};
    fm_tensor *y = st ? NULL : i64_out(sel.v, 2, shape, dev_of(c->in[0]));
    free(work), free(bx), free(sel.v);
    REL(bh, sh);
    return st ? st : onnx_set_out(c, 0, y);
}

/* ---- NonZero: [rank, count], the indices of the nonzero elements in row-major order (NaN
 * is nonzero). A scalar gives [0, count], as the spec says (numpy and ONNX Runtime give
 * [1, count]). ---- */
static fm_status op_nonzero(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *h = host8(x);
    if (!h) return fm_last_status();
    const int r = x->ndim;
    const int64_t n = fm_tensor_numel(h);
    const double *f = h->dtype == FM_F64 ? fm_tensor_data(h) : NULL;
    const int64_t *iv = f ? NULL : fm_tensor_data(h);
    int64_t cnt = 0, k = 0, pos[FM_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) cnt += f ? f[i] != 0 : iv[i] != 0;
    int64_t *o = malloc((size_t)(r * cnt + 1) * sizeof *o);
    if (!o) {
        fm_tensor_release(h);
        return oom(c);
    }
    for (int64_t i = 0; i < n; i++) {
        if (f ? f[i] != 0 : iv[i] != 0) {
            for (int d = 0; d < r; d++) o[d * cnt + k] = pos[d];
            k++;
        }
        for (int d = r - 1; d >= 0 && ++pos[d] == x->shape[d]; d--) pos[d] = 0;
    }
    const int64_t shape[2] = {r, cnt};
    fm_tensor *y = i64_out(o, 2, shape, dev_of(x));
    free(o);
    fm_tensor_release(h);
    return onnx_set_out(c, 0, y);
}

/* ---- Compress: the slices along axis (the elements of the flattened input, without one)
 * whose condition is true. A condition shorter than the axis selects none of the rest; one
 * longer is read only as far as the axis goes (ONNX Runtime's and numpy's reading). ---- */
static fm_status op_compress(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *cond = c->in[1];
    const Onnx__AttributeProto *ax = onnx_attr(c, "axis");
    const bool has_axis = ax && ax->has_i;
    int axis = 0;
    if (cond->dtype != FM_BOOL || cond->ndim != 1)
        return onnx_node_error(c, FM_ERR_INVALID, "input 1 ('%s') must be a rank-1 bool tensor; got %s of rank %d", in_name(c, 1),
                               fm_dtype_name(cond->dtype), cond->ndim);
    if (has_axis && fm_norm_axis("Compress", (int)ax->i, x->ndim, &axis)) return fm_last_status();
    int64_t len = has_axis ? x->shape[axis] : fm_tensor_numel(x), outer = 1, inner = 1, k = 0;
    for (int d = 0; has_axis && d < x->ndim; d++)
        if (d != axis) *(d < axis ? &outer : &inner) *= x->shape[d];
    const int64_t m = cond->shape[0] < len ? cond->shape[0] : len;
    fm_tensor *ch = onnx_host(cond, FM_BOOL), *h = ch ? host8(x) : NULL, *y = NULL;
    int64_t *idx = h ? malloc((size_t)(m + 1) * sizeof *idx) : NULL;
    fm_status st = !h ? fm_last_status() : !idx ? oom(c) : FM_OK;
    if (!st) {
        const bool *cv = fm_tensor_data(ch);
        for (int64_t i = 0; i < m; i++)
            if (cv[i]) idx[k++] = i;
        int64_t shape[FM_MAX_DIMS];
        memcpy(shape, x->shape, sizeof shape);
        shape[has_axis ? axis : 0] = k;
        if ((y = fm_tensor_empty(has_axis ? x->ndim : 1, shape, h->dtype, FM_CPU)))
            gather8(fm_tensor_data(h), fm_tensor_data(y), outer, len, inner, idx, k);
    }
    free(idx);
    REL(ch, h);
    return st ? st : onnx_set_out(c, 0, onnx_host_back(y, x->dtype, dev_of(x)));
}

/* ---- Unique: the distinct elements (or slices along axis, compared element by element in
 * row-major order), ascending (sorted = 1) or in order of first occurrence (sorted = 0),
 * with the first occurrence of each, every element's (slice's) position in Y, and the
 * counts. -0 equals 0 (Y keeps the first one met); NaNs equal each other and sort last. ---- */
typedef struct uniq_ctx { const double *f; const int64_t *i; int64_t outer, len, inner; } uniq_ctx;

static int uniq_cmp(const void *ctx, int64_t a, int64_t b) {
    const uniq_ctx *u = ctx;
    for (int64_t o = 0; o < u->outer; o++)
        for (int64_t k = 0; k < u->inner; k++) {
            const int64_t pa = (o * u->len + a) * u->inner + k, pb = (o * u->len + b) * u->inner + k;
            int r;
            if (u->f) {
                const double x = u->f[pa], y = u->f[pb];
                r = x < y ? -1 : x > y ? 1 : isnan(x) - isnan(y);
            } else r = u->i[pa] < u->i[pb] ? -1 : u->i[pa] > u->i[pb];
            if (r) return r;
        }
    return 0;
}

/* Groups the n slices: first[g], cnt[g] and inv[i] in output order; returns the count. */
static int64_t uniq_groups(const uniq_ctx *u, int64_t n, bool sorted, int64_t *w, int64_t *first, int64_t *cnt, int64_t *inv) {
    int64_t *idx = w, *tmp = w + n, *grp = w + 2 * n, *rank = w + 3 * n, ng = 0;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    merge_sort(idx, tmp, n, uniq_cmp, u); /* stable: each run starts with its first occurrence */
    for (int64_t j = 0; j < n; j++) {
        if (j == 0 || uniq_cmp(u, idx[j - 1], idx[j])) first[ng] = idx[j], cnt[ng++] = 0;
        cnt[ng - 1]++;
        grp[idx[j]] = ng - 1;
    }
    for (int64_t g = 0; g < ng; g++) rank[g] = g;
    if (!sorted) {
        int64_t next = 0;
        memcpy(tmp, first, (size_t)ng * sizeof *tmp), memcpy(idx, cnt, (size_t)ng * sizeof *idx);
        for (int64_t i = 0; i < n; i++)
            if (tmp[grp[i]] == i) rank[grp[i]] = next++;
        for (int64_t g = 0; g < ng; g++) first[rank[g]] = tmp[g], cnt[rank[g]] = idx[g];
    }
    for (int64_t i = 0; i < n; i++) inv[i] = rank[grp[i]];
    return ng;
}

static fm_status op_unique(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    const Onnx__AttributeProto *ax = onnx_attr(c, "axis");
    const bool has_axis = ax && ax->has_i;
    const int64_t sorted = onnx_attr_int(c, "sorted", 1);
    int axis = 0;
    if (sorted != 0 && sorted != 1) return onnx_node_error(c, FM_ERR_INVALID, "sorted is %" PRId64 "; it must be 0 or 1", sorted);
    if (has_axis && fm_norm_axis("Unique", (int)ax->i, x->ndim, &axis)) return fm_last_status();
    fm_tensor *h = host8(x);
    if (!h) return fm_last_status();
    uniq_ctx u = {.outer = 1, .len = has_axis ? x->shape[axis] : fm_tensor_numel(x), .inner = 1};
    for (int d = 0; has_axis && d < x->ndim; d++)
        if (d != axis) *(d < axis ? &u.outer : &u.inner) *= x->shape[d];
    if (h->dtype == FM_F64) u.f = fm_tensor_data(h);
    else u.i = fm_tensor_data(h);
    const int64_t n = u.len;
    int64_t *w = malloc((size_t)(7 * n + 1) * sizeof *w), ng = 0;
    fm_tensor *y = NULL;
    fm_status st = w ? FM_OK : oom(c);
    if (!st) {
        int64_t *first = w + 4 * n, *cnt = w + 5 * n, *inv = w + 6 * n, shape[FM_MAX_DIMS];
        ng = uniq_groups(&u, n, sorted == 1, w, first, cnt, inv);
        memcpy(shape, x->shape, sizeof shape);
        shape[has_axis ? axis : 0] = ng;
        if ((y = fm_tensor_empty(has_axis ? x->ndim : 1, shape, h->dtype, FM_CPU)))
            gather8(fm_tensor_data(h), fm_tensor_data(y), u.outer, n, u.inner, first, ng);
        const fm_device dev = dev_of(x);
        st = onnx_set_out(c, 0, onnx_host_back(y, x->dtype, dev));
        if (!st && c->n_out > 1) st = onnx_set_out(c, 1, i64_out(first, 1, &ng, dev));
        if (!st && c->n_out > 2) st = onnx_set_out(c, 2, i64_out(inv, 1, &n, dev));
        if (!st && c->n_out > 3) st = onnx_set_out(c, 3, i64_out(cnt, 1, &ng, dev));
    }
    free(w);
    fm_tensor_release(h);
    return st;
}

const onnx_op onnx_ops_dyn[] = {
    {"NonMaxSuppression", 10, 2, 5, 1, "center_point_box", op_nms},
    {"NonZero", 9, 1, 1, 1, "", op_nonzero},
    {"Compress", 9, 2, 2, 1, "axis", op_compress},
    {"Unique", 11, 1, 1, 4, "axis,sorted", op_unique},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
