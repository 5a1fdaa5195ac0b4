/* matmul (numpy semantics) and linear. 1-D operands are promoted to matrices
 * with differentiable reshapes; batch dimensions broadcast through stride-0
 * expands, so the kernel never copies a broadcast operand. */
#include <string.h>

#include "autograd/node.h"
#include "dispatch/dispatch.h"
#include "core/tensor_internal.h"
#include "amp/autocast.h"
#include "fathom/memory.h"
#include "ops/ops_internal.h"

static fm_status matmul_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    fm_tensor *a = n->saved[0], *b = n->saved[1], *g = gout[0];
    /* a, b are the batch-expanded operands (same ndim as g) */
    fm_status st = FM_OK;
    if (fm_node_needs_grad(n, 0)) {
        fm_tensor *bt = fm_transpose(b, -1, -2);
        gin[0] = bt ? fm_matmul(g, bt) : NULL;
        fm_tensor_release(bt);
        if (!gin[0]) st = fm_last_status();
    }
    if (st == FM_OK && fm_node_needs_grad(n, 1)) {
        int nd = b->ndim;
        if (b->strides[nd - 1] != 1 && b->strides[nd - 2] == 1) {
            /* b is a transposed view (a weight used as w^T): produce its gradient
             * in the same layout, (g^T a)^T, so the transpose's backward hands the
             * parameter a contiguous gradient instead of a strided copy */
            fm_tensor *gt = fm_transpose(g, -1, -2);
            fm_tensor *gbt = gt ? fm_matmul(gt, a) : NULL;
            gin[1] = gbt ? fm_transpose(gbt, -1, -2) : NULL;
            fm_tensor_release_n(2, gt, gbt);
        } else {
            fm_tensor *at = fm_transpose(a, -1, -2);
            gin[1] = at ? fm_matmul(at, g) : NULL;
            fm_tensor_release(at);
        }
        if (!gin[1]) st = fm_last_status();
    }
    return st;
}

/* a [..., M, K] @ b [..., K, N], both ndim >= 2 */
static fm_tensor *matmul_nd(fm_tensor *a, fm_tensor *b) {
    char sa[128], sb[128];
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2]) {
        fm_set_error(FM_ERR_INVALID, "matmul: inner dimensions differ: %s @ %s (%lld vs %lld)",
                     fm_shape_str(a->ndim, a->shape, sa, sizeof sa), fm_shape_str(b->ndim, b->shape, sb, sizeof sb),
                     (long long)a->shape[a->ndim - 1], (long long)b->shape[b->ndim - 2]);
        return NULL;
    }
    int nb;
    int64_t batch[FM_MAX_DIMS];
    if (fm_broadcast_shapes("matmul (batch dimensions)", a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nb, batch)) return NULL;
    if (nb + 2 > FM_MAX_DIMS) { fm_set_error(FM_ERR_INVALID, "matmul: too many dimensions"); return NULL; }
    int64_t sha[FM_MAX_DIMS], shb[FM_MAX_DIMS], shy[FM_MAX_DIMS];
    memcpy(sha, batch, sizeof(int64_t) * (size_t)nb);
    memcpy(shb, batch, sizeof(int64_t) * (size_t)nb);
    memcpy(shy, batch, sizeof(int64_t) * (size_t)nb);
    sha[nb] = a->shape[a->ndim - 2]; sha[nb + 1] = a->shape[a->ndim - 1];
    shb[nb] = b->shape[b->ndim - 2]; shb[nb + 1] = b->shape[b->ndim - 1];
    shy[nb] = sha[nb]; shy[nb + 1] = shb[nb + 1];
    fm_tensor *ae = fm_expand(a, nb + 2, sha), *be = ae ? fm_expand(b, nb + 2, shb) : NULL;
    fm_tensor *y = be ? fm_tensor_empty(nb + 2, shy, a->dtype, a->storage->device) : NULL;
    if (!y) { fm_tensor_release_n(2, ae, be); return NULL; }
    fm_op_call c = {.op = FM_OP_MATMUL, .n_in = 2, .n_out = 1, .in = {ae, be}, .out = {y}};
    if (fm_dispatch(&c) != FM_OK) { fm_tensor_release_n(3, ae, be, y); return NULL; }
    fm_tensor *ins[2] = {ae, be};
    fm_node *n = fm_node_begin(FM_OP_MATMUL, 2, ins, matmul_backward);
    if (n) {
        fm_node_save(n, 0, ae);
        fm_node_save(n, 1, be);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release_n(2, ae, be);
    return y;
}

static fm_tensor *matmul_impl(fm_tensor *a, fm_tensor *b);

fm_tensor *fm_matmul(fm_tensor *a, fm_tensor *b) {
    if (!a || !b) { fm_set_error(FM_ERR_INVALID, "matmul: input is NULL"); return NULL; }
    fm_tensor *c[2];
    int ac = fm_autocast_inputs(FM_OP_MATMUL, 2, (fm_tensor *[]){a, b}, c);
    if (!ac) return matmul_impl(a, b);
    fm_tensor *y = ac > 0 ? matmul_impl(c[0], c[1]) : NULL;
    fm_tensor_release_n(2, c[0], c[1]);
    return y;
}

static fm_tensor *matmul_impl(fm_tensor *a, fm_tensor *b) {
    if (fm_check_same_dtype("matmul", a, b) || fm_check_same_device("matmul", a, b)) return NULL;
    if (a->ndim == 0 || b->ndim == 0) { fm_set_error(FM_ERR_INVALID, "matmul: operands must have at least 1 dimension (use fm_mul for scalars)"); return NULL; }
    if (!fm_dtype_is_float(a->dtype)) { fm_set_error(FM_ERR_INVALID, "matmul: needs floating-point operands (got %s)", fm_dtype_name(a->dtype)); return NULL; }
    fm_tensor *a2 = a->ndim == 1 ? fm_unsqueeze(a, 0) : fm_tensor_retain(a);
    fm_tensor *b2 = b->ndim == 1 ? fm_unsqueeze(b, 1) : fm_tensor_retain(b);
    fm_tensor *y = (a2 && b2) ? matmul_nd(a2, b2) : NULL;
    fm_tensor_release_n(2, a2, b2);
    if (!y) return NULL;
    if (a->ndim == 1 || b->ndim == 1) {
        int64_t sh[FM_MAX_DIMS];
        int k = 0;
        for (int i = 0; i < y->ndim - 2; i++) sh[k++] = y->shape[i];
        if (a->ndim != 1) sh[k++] = y->shape[y->ndim - 2];
        if (b->ndim != 1) sh[k++] = y->shape[y->ndim - 1];
        fm_tensor *r = fm_reshape(y, k, sh);
        fm_tensor_release(y);
        y = r;
    }
    return y;
}

/* linear as one autograd node (like PyTorch's addmm/linear backward): the weight
 * gradient is computed as g^T @ x, which is already [out, in] and contiguous.
 * Recording matmul(x, w^T) instead would produce the weight gradient as a
 * transposed view, and making it the parameter's contiguous .grad costs a
 * strided copy of the whole weight every step (~20% of an MLP step). */
typedef struct {
    int x_ndim;
    int64_t x_shape[FM_MAX_DIMS];
} linear_attrs;

static fm_status linear_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    fm_tensor *x2 = n->saved[0], *w = n->saved[1], *g = gout[0];
    const linear_attrs *la = FM_NODE_ATTRS(n, linear_attrs);
    fm_tensor *g2 = fm_reshape(g, 2, (int64_t[]){x2->shape[0], w->shape[0]});
    if (!g2) return fm_last_status();
    fm_status st = FM_OK;
    if (fm_node_needs_grad(n, 0)) {
        fm_tensor *gx = fm_matmul(g2, w);
        gin[0] = gx ? fm_reshape(gx, la->x_ndim, la->x_shape) : NULL;
        fm_tensor_release(gx);
        if (!gin[0]) st = fm_last_status();
    }
    if (st == FM_OK && fm_node_needs_grad(n, 1)) {
        fm_tensor *gt = fm_transpose(g2, 0, 1);
        gin[1] = gt ? fm_matmul(gt, x2) : NULL;
        fm_tensor_release(gt);
        if (!gin[1]) st = fm_last_status();
    }
    if (st == FM_OK && n->n_in > 2 && fm_node_needs_grad(n, 2)) {
        gin[2] = fm_sum(g2, 1, (int[]){0}, false);
        if (!gin[2]) st = fm_last_status();
    }
    fm_tensor_release(g2);
    return st;
}

/* y [rows, out] back to x's leading dims [..., out]; consumes y. */
static fm_tensor *unflatten_rows(fm_tensor *y, const fm_tensor *x, int64_t out) {
    if (!y || x->ndim == 2) return y;
    int64_t sh[FM_MAX_DIMS];
    for (int i = 0; i < x->ndim - 1; i++) sh[i] = x->shape[i];
    sh[x->ndim - 1] = out;
    fm_tensor *r = fm_reshape(y, x->ndim, sh);
    fm_tensor_release(y);
    return r;
}

/* Full-precision linear with a single node; the caller has validated shapes. */
static fm_tensor *linear_node(fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    int64_t in = w->shape[1], rows = fm_tensor_numel(x) / (in ? in : 1);
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *x2 = fm_reshape(x, 2, (int64_t[]){rows, in});
    fm_tensor *wt = x2 ? fm_transpose(w, 0, 1) : NULL;
    fm_tensor *y = NULL;
    if (wt && b && in > 0) {
        /* y = x w^T + b as one GEMM call: the kernel writes b into each row and
         * accumulates the product onto it (as addmm does), which saves a pass
         * over y for the bias add */
        y = fm_tensor_empty(2, (int64_t[]){rows, w->shape[0]}, x->dtype, x->storage->device);
        fm_op_call c = {.op = FM_OP_MATMUL, .n_in = 3, .n_out = 1, .in = {x2, wt, b}, .out = {y}};
        if (y && fm_dispatch(&c) != FM_OK) { fm_tensor_release(y); y = NULL; }
    } else if (wt) {
        y = fm_matmul(x2, wt);
        if (y && b) {
            fm_tensor *yb = fm_add(y, b);
            fm_tensor_release(y);
            y = yb;
        }
    }
    fm_tensor_release(wt);
    y = unflatten_rows(y, x, w->shape[0]);
    fm_set_grad_enabled(prev);
    if (!y) { fm_tensor_release(x2); return NULL; }
    fm_tensor *ins[3] = {x, w, b};
    fm_node *n = fm_node_begin(FM_OP_MATMUL, b ? 3 : 2, ins, linear_backward);
    if (n) {
        n->name = "linear";
        linear_attrs *la = FM_NODE_ATTRS(n, linear_attrs);
        la->x_ndim = x->ndim;
        memcpy(la->x_shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        fm_node_save(n, 0, x2);
        fm_node_save(n, 1, w);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(x2);
    return y;
}

fm_tensor *fm_linear(fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    if (!x || !w) { fm_set_error(FM_ERR_INVALID, "linear: input or weight is NULL"); return NULL; }
    char sx[128], sw[128];
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
        fm_set_error(FM_ERR_INVALID, "linear: input %s does not match weight %s (expected weight [out, %lld])",
                     fm_shape_str(x->ndim, x->shape, sx, sizeof sx), fm_shape_str(w->ndim, w->shape, sw, sizeof sw),
                     x->ndim ? (long long)x->shape[x->ndim - 1] : 0LL);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        fm_set_error(FM_ERR_INVALID, "linear: bias %s does not match weight %s (expected bias [%lld])",
                     fm_shape_str(b->ndim, b->shape, sx, sizeof sx), fm_shape_str(w->ndim, w->shape, sw, sizeof sw),
                     (long long)w->shape[0]);
        return NULL;
    }
    /* one fused node unless autocast casts an operand (then matmul + add, as torch.autocast) */
    if (!fm_autocast_changes(FM_OP_MATMUL, 3, (fm_tensor *[]){x, w, b}) && !fm_check_same_dtype("linear", x, w) && !fm_check_same_device("linear", x, w) &&
        (!b || (!fm_check_same_dtype("linear", x, b) && !fm_check_same_device("linear", x, b))) &&
        fm_dtype_is_float(x->dtype))
        return linear_node(x, w, b);
    /* flatten leading dims so the whole batch is one GEMM */
    int64_t in = w->shape[1], rows = fm_tensor_numel(x) / (in ? in : 1);
    fm_tensor *x2 = fm_reshape(x, 2, (int64_t[]){rows, in});
    /* autocast: the low-precision weight copy is attributed to weights, not activations */
    fm_mem_category prev_cat = fm_memory_tag_push(FM_MEM_WEIGHTS);
    fm_tensor *wc = x2 ? fm_autocast_cast(FM_OP_MATMUL, w) : NULL;
    fm_memory_tag_pop(prev_cat);
    fm_tensor *wt = wc ? fm_transpose(wc, 0, 1) : NULL;
    fm_tensor *y = wt ? fm_matmul(x2, wt) : NULL;
    fm_tensor_release_n(3, x2, wc, wt);
    if (y && b) {
        fm_tensor *bc = fm_autocast_cast(FM_OP_MATMUL, b); /* autocast: the bias joins the matmul's output dtype */
        fm_tensor *yb = bc ? fm_add(y, bc) : NULL;
        fm_tensor_release_n(2, y, bc);
        y = yb;
    }
    y = unflatten_rows(y, x, w->shape[0]);
    return y;
}

/* ---- the mixed linear (ops_internal.h): lowp GEMMs, f32 activations ---- */

bool fm_mixed_device(const fm_tensor *t) {
    fm_device_type d = t->storage->device.type;
    return d == FM_DEV_CPU || d == FM_DEV_CHECK || d == FM_DEV_META;
}

fm_dtype fm_mixed_lowp(const fm_tensor *x, const fm_tensor *w) {
    return x && w && fm_autocast_get() == FM_BF16 && x->dtype == FM_F32 && w->dtype == FM_F32 && fm_mixed_device(x)
               ? FM_BF16 : FM_F32;
}

/* y = a @ b (+ bias) as one matmul call with an f32 output, no tape */
static fm_tensor *mm_f32(fm_tensor *a, fm_tensor *b, fm_tensor *bias) {
    fm_tensor *y = fm_tensor_empty(2, (int64_t[]){a->shape[0], b->shape[1]}, FM_F32, a->storage->device);
    fm_op_call c = {.op = FM_OP_MATMUL, .n_in = bias ? 3 : 2, .n_out = 1, .in = {a, b, bias}, .out = {y}};
    if (y && fm_dispatch(&c) != FM_OK) { fm_tensor_release(y); y = NULL; }
    return y;
}

static fm_status linear_mixed_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    fm_tensor *xl = n->saved[0], *wl = n->saved[1];
    const linear_attrs *la = FM_NODE_ATTRS(n, linear_attrs);
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *g2 = fm_reshape(gout[0], 2, (int64_t[]){xl->shape[0], wl->shape[0]});
    /* one lowp copy for both GEMMs. (A kernel that also summed the bias gradient in
     * the same read measured no faster on kjv-gpt's [2048, 128..512] gradients, which
     * stay in cache for the second read: 0.35-0.46 vs 0.08-0.36 ms.) */
    fm_tensor *gl = g2 ? fm_to_dtype(g2, xl->dtype) : NULL;
    if (gl && n->n_in > 2 && fm_node_needs_grad(n, 2) && !(gin[2] = fm_sum(g2, 1, (int[]){0}, false))) {
        fm_tensor_release(gl);
        gl = NULL;
    }
    fm_status st = gl ? FM_OK : fm_last_status();
    if (st == FM_OK && fm_node_needs_grad(n, 0)) {
        fm_tensor *gx = mm_f32(gl, wl, NULL);
        gin[0] = gx ? fm_reshape(gx, la->x_ndim, la->x_shape) : NULL;
        fm_tensor_release(gx);
        if (!gin[0]) st = fm_last_status();
    }
    if (st == FM_OK && fm_node_needs_grad(n, 1)) {
        fm_tensor *gt = fm_transpose(gl, 0, 1);
        if (!(gin[1] = gt ? mm_f32(gt, xl, NULL) : NULL)) st = fm_last_status();
        fm_tensor_release(gt);
    }
    fm_tensor_release_n(2, g2, gl);
    fm_set_grad_enabled(prev);
    return st;
}

fm_tensor *fm_linear_mixed(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_dtype lowp) { return fm_linear_mixed_w(x, w, NULL, b, lowp); }

fm_tensor *fm_linear_mixed_w(fm_tensor *x, fm_tensor *w, fm_tensor *wlow, fm_tensor *b, fm_dtype lowp) {
    if (wlow && (wlow->dtype != lowp || wlow->ndim != 2 || !w || w->ndim != 2 || wlow->shape[0] != w->shape[0] ||
                 wlow->shape[1] != w->shape[1] || !fm_tensor_is_contiguous(wlow)))
        wlow = NULL; /* not a copy of w: convert as usual */
    if (!x || !w || (lowp != FM_BF16 && lowp != FM_F16) || x->dtype != FM_F32 || w->dtype != FM_F32 ||
        (b && b->dtype != FM_F32) || w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) || w->shape[1] < 1 || !fm_mixed_device(x) ||
        fm_check_same_device("linear", x, w) || (b && fm_check_same_device("linear", x, b)))
        return fm_linear(x, w, b); /* its errors, or its path */
    int64_t in = w->shape[1], rows = fm_tensor_numel(x) / in;
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *x2 = fm_reshape(x, 2, (int64_t[]){rows, in});
    fm_tensor *xl = x2 ? fm_to_dtype(x2, lowp) : NULL;
    fm_mem_category prev_cat = fm_memory_tag_push(FM_MEM_WEIGHTS); /* the lowp weight copy is a weight */
    fm_tensor *wl = !xl ? NULL : wlow ? fm_tensor_retain(wlow) : fm_to_dtype(w, lowp);
    fm_memory_tag_pop(prev_cat);
    fm_tensor *wt = wl ? fm_transpose(wl, 0, 1) : NULL;
    fm_tensor *y = wt ? mm_f32(xl, wt, b) : NULL;
    fm_set_grad_enabled(prev);
    y = unflatten_rows(y, x, w->shape[0]);
    fm_tensor *ins[3] = {x, w, b};
    fm_node *n = y ? fm_node_begin(FM_OP_MATMUL, b ? 3 : 2, ins, linear_mixed_backward) : NULL;
    if (n) {
        n->name = "linear_mixed";
        linear_attrs *la = FM_NODE_ATTRS(n, linear_attrs);
        la->x_ndim = x->ndim;
        memcpy(la->x_shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        fm_node_save(n, 0, xl);
        fm_node_save(n, 1, wl);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release_n(4, x2, xl, wl, wt);
    return y;
}
