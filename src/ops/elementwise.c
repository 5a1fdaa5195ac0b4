/* Front ends of the elementwise ops: validation, output allocation, dispatch,
 * and their backward rules. Unary backward is one fused kernel
 * (UNARY_BACKWARD: dx = dy * f'(x)); binary backward reduces the gradient over
 * broadcast dimensions with fm_sum_to. */
#include <math.h>
#include <string.h>

#include "autograd/node.h"
#include "dispatch/dispatch.h"
#include "core/tensor_internal.h"
#include "amp/autocast.h"
#include "backend/kernel.h"
#include "ops/ops_internal.h"

static const char *opname(fm_op_id op) { return fm_op_get_info(op)->name; }

/* ---------------- unary ---------------- */

/* Which of x (input) and y (output) each backward needs. */
static bool bwd_needs_y(fm_op_id op) {
    return op == FM_OP_EXP || op == FM_OP_SQRT || op == FM_OP_RSQRT || op == FM_OP_TANH || op == FM_OP_SIGMOID;
}

static fm_status unary_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const fm_unary_bwd_attrs *a = FM_NODE_ATTRS(n, fm_unary_bwd_attrs);
    fm_tensor *x = n->saved[0], *y = n->saved[1], *g = gout[0];
    fm_tensor *dx = fm_tensor_empty(g->ndim, g->shape, n->out_dtype[0], g->storage->device);
    if (!dx) return fm_last_status();
    fm_op_call c = {.op = FM_OP_UNARY_BACKWARD, .n_in = 3, .n_out = 1, .in = {g, x, y}, .out = {dx}, .attrs = a};
    fm_status st = fm_dispatch(&c);
    if (st) { fm_tensor_release(dx); return st; }
    gin[0] = dx;
    return FM_OK;
}

static fm_tensor *unary(fm_op_id op, fm_tensor *x, double a, double b) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", opname(op)); return NULL; }
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, x->dtype, x->storage->device);
    if (!y) return NULL;
    fm_unary_attrs at = {a, b};
    fm_op_call c = {.op = op, .n_in = 1, .n_out = 1, .in = {x}, .out = {y}, .attrs = &at};
    if (fm_dispatch(&c) != FM_OK) { fm_tensor_release(y); return NULL; }
    fm_node *n = fm_node_begin(op, 1, &x, unary_backward);
    if (n) {
        fm_unary_bwd_attrs ba = {op, at};
        FM_NODE_SET_ATTRS(n, ba);
        fm_node_save(n, 0, x);
        if (bwd_needs_y(op)) fm_node_save(n, 1, y);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

fm_tensor *fm_neg(fm_tensor *a) { return unary(FM_OP_NEG, a, 0, 0); }
fm_tensor *fm_abs(fm_tensor *a) { return unary(FM_OP_ABS, a, 0, 0); }
fm_tensor *fm_exp(fm_tensor *a) { return unary(FM_OP_EXP, a, 0, 0); }
fm_tensor *fm_log(fm_tensor *a) { return unary(FM_OP_LOG, a, 0, 0); }
fm_tensor *fm_sqrt(fm_tensor *a) { return unary(FM_OP_SQRT, a, 0, 0); }
fm_tensor *fm_rsqrt(fm_tensor *a) { return unary(FM_OP_RSQRT, a, 0, 0); }
fm_tensor *fm_sin(fm_tensor *a) { return unary(FM_OP_SIN, a, 0, 0); }
fm_tensor *fm_cos(fm_tensor *a) { return unary(FM_OP_COS, a, 0, 0); }
fm_tensor *fm_tan(fm_tensor *a) { return unary(FM_OP_TAN, a, 0, 0); }
fm_tensor *fm_asin(fm_tensor *a) { return unary(FM_OP_ASIN, a, 0, 0); }
fm_tensor *fm_acos(fm_tensor *a) { return unary(FM_OP_ACOS, a, 0, 0); }
fm_tensor *fm_atan(fm_tensor *a) { return unary(FM_OP_ATAN, a, 0, 0); }
fm_tensor *fm_sinh(fm_tensor *a) { return unary(FM_OP_SINH, a, 0, 0); }
fm_tensor *fm_cosh(fm_tensor *a) { return unary(FM_OP_COSH, a, 0, 0); }
fm_tensor *fm_asinh(fm_tensor *a) { return unary(FM_OP_ASINH, a, 0, 0); }
fm_tensor *fm_acosh(fm_tensor *a) { return unary(FM_OP_ACOSH, a, 0, 0); }
fm_tensor *fm_atanh(fm_tensor *a) { return unary(FM_OP_ATANH, a, 0, 0); }
fm_tensor *fm_erf(fm_tensor *a) { return unary(FM_OP_ERF, a, 0, 0); }
fm_tensor *fm_floor(fm_tensor *a) { return unary(FM_OP_FLOOR, a, 0, 0); }
fm_tensor *fm_ceil(fm_tensor *a) { return unary(FM_OP_CEIL, a, 0, 0); }
fm_tensor *fm_round(fm_tensor *a) { return unary(FM_OP_ROUND, a, 0, 0); }
fm_tensor *fm_sign(fm_tensor *a) { return unary(FM_OP_SIGN, a, 0, 0); }
fm_tensor *fm_tanh(fm_tensor *a) { return unary(FM_OP_TANH, a, 0, 0); }
fm_tensor *fm_sigmoid(fm_tensor *a) { return unary(FM_OP_SIGMOID, a, 0, 0); }
fm_tensor *fm_relu(fm_tensor *a) { return unary(FM_OP_RELU, a, 0, 0); }
fm_tensor *fm_leaky_relu(fm_tensor *a, double s) { return unary(FM_OP_LEAKY_RELU, a, s, 0); }
/* the unary activations (group ACT in ops.def): fm_<name> for each */
#define X(id, name, nin, nout, flags, prec, group) \
    FM_OP_IF_ACT_##group(fm_tensor *fm_##name(fm_tensor *a) { return unary(FM_OP_##id, a, 0, 0); })
#include "fathom/ops.def"
#undef X
fm_tensor *fm_clamp(fm_tensor *a, double lo, double hi) {
    if (lo != lo || hi != hi || lo > hi) {
        fm_set_error(FM_ERR_INVALID, "clamp: need lo <= hi (got lo=%g, hi=%g)", lo, hi);
        return NULL;
    }
    return unary(FM_OP_CLAMP, a, lo, hi);
}

/* ---------------- binary ---------------- */

fm_tensor *fm_sum_to(fm_tensor *g, int ndim, const int64_t *shape) {
    if (g->ndim == ndim) {
        bool same = true;
        for (int i = 0; i < ndim; i++) same &= g->shape[i] == shape[i];
        if (same) return fm_tensor_retain(g);
    }
    if (ndim > g->ndim) { fm_set_error(FM_ERR_INVALID, "sum_to: target has more dimensions than the tensor"); return NULL; }
    int axes[FM_MAX_DIMS], na = 0, lead = g->ndim - ndim;
    for (int i = 0; i < g->ndim; i++) {
        if (i < lead) axes[na++] = i;
        else if (shape[i - lead] == 1 && g->shape[i] != 1) axes[na++] = i;
        else if (shape[i - lead] != g->shape[i]) {
            char a[128], b[128];
            fm_set_error(FM_ERR_INVALID, "sum_to: %s cannot be reduced to %s", fm_shape_str(g->ndim, g->shape, a, sizeof a),
                         fm_shape_str(ndim, shape, b, sizeof b));
            return NULL;
        }
    }
    if (na == 0) return fm_reshape(g, ndim, shape);
    fm_tensor *s = fm_sum(g, na, axes, true);
    if (!s) return NULL;
    fm_tensor *r = fm_reshape(s, ndim, shape);
    fm_tensor_release(s);
    return r;
}

static fm_tensor *sum_to_like(fm_tensor *g, const fm_node *n, int input) {
    (void)n;
    fm_tensor *x = n->saved[input];
    return fm_sum_to(g, x->ndim, x->shape);
}

static fm_status binary_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    fm_tensor *g = gout[0], *a = n->saved[0], *b = n->saved[1], *y = n->saved[2];
    fm_tensor *ta = NULL, *tb = NULL, *t1 = NULL, *t2 = NULL;
    bool na = fm_node_needs_grad(n, 0), nb = fm_node_needs_grad(n, 1);
    switch (n->op) {
    case FM_OP_ADD: ta = fm_tensor_retain(g); tb = fm_tensor_retain(g); break;
    case FM_OP_SUB: ta = fm_tensor_retain(g); if (nb) tb = fm_neg(g); break;
    case FM_OP_MUL: if (na) ta = fm_mul(g, b); if (nb) tb = fm_mul(g, a); break;
    case FM_OP_DIV:
        if (na) ta = fm_div(g, b);
        if (nb) { t1 = fm_div(y, b); t2 = t1 ? fm_mul(g, t1) : NULL; tb = t2 ? fm_neg(t2) : NULL; }
        break;
    case FM_OP_POW:
        if (na) { /* b * a^(b-1) = b * y / a, but a may be 0: compute pow directly */
            fm_tensor *bm1 = fm_add_scalar(b, -1.0);
            fm_tensor *p = bm1 ? fm_pow(a, bm1) : NULL;
            fm_tensor *q = p ? fm_mul(p, b) : NULL;
            ta = q ? fm_mul(g, q) : NULL;
            fm_tensor_release_n(3, bm1, p, q);
        }
        if (nb) { /* y * log(a), taken as 0 where a == 0 (PyTorch's convention) */
            fm_tensor *la = fm_log(a), *z = fm_tensor_zeros(0, NULL, a->dtype, a->storage->device);
            fm_tensor *az = z ? fm_eq(a, z) : NULL;
            fm_tensor *yl = la ? fm_mul(y, la) : NULL;
            fm_tensor *m = (az && yl) ? fm_where(az, z, yl) : NULL;
            tb = m ? fm_mul(g, m) : NULL;
            fm_tensor_release_n(5, la, z, az, yl, m);
        }
        break;
    case FM_OP_MAXIMUM:
    case FM_OP_MINIMUM: { /* the larger (smaller) input takes the gradient; ties split it */
        fm_tensor *w = n->op == FM_OP_MAXIMUM ? fm_gt(a, b) : fm_lt(a, b);
        fm_tensor *eq = fm_eq(a, b);
        fm_tensor *wf = w ? fm_to_dtype(w, g->dtype) : NULL, *ef = eq ? fm_to_dtype(eq, g->dtype) : NULL;
        fm_tensor *half = ef ? fm_mul_scalar(ef, 0.5) : NULL;
        fm_tensor *wa = (wf && half) ? fm_add(wf, half) : NULL;
        if (wa && na) ta = fm_mul(g, wa);
        if (wa && nb) {
            fm_tensor *one_minus = fm_neg(wa), *wb = one_minus ? fm_add_scalar(one_minus, 1.0) : NULL;
            tb = wb ? fm_mul(g, wb) : NULL;
            fm_tensor_release_n(2, one_minus, wb);
        }
        fm_tensor_release_n(6, w, eq, wf, ef, half, wa);
        break;
    }
    case FM_OP_FMOD:
    case FM_OP_REMAINDER: /* a - q b with q = trunc(a / b) or floor(a / b), piecewise constant */
        if (na) ta = fm_tensor_retain(g);
        if (nb) {
            fm_tensor *q = fm_div(a, b), *fl = q ? fm_floor(q) : NULL, *qi = fl;
            if (fl && n->op == FM_OP_FMOD) { /* trunc: ceil below zero */
                fm_tensor *z = fm_tensor_zeros(0, NULL, q->dtype, q->storage->device), *neg = z ? fm_lt(q, z) : NULL;
                fm_tensor *ce = neg ? fm_ceil(q) : NULL;
                qi = ce ? fm_where(neg, ce, fl) : NULL;
                fm_tensor_release_n(3, z, neg, ce);
            }
            t1 = qi ? fm_mul(g, qi) : NULL;
            tb = t1 ? fm_neg(t1) : NULL;
            if (qi != fl) fm_tensor_release(qi);
            fm_tensor_release_n(2, q, fl);
        }
        break;
    default: return fm_set_error(FM_ERR_INTERNAL, "binary backward: unexpected op %s", n->name);
    }
    fm_tensor_release_n(2, t1, t2);
    fm_status st = FM_OK;
    if (na) { if (!ta) st = fm_last_status(); else if (!(gin[0] = sum_to_like(ta, n, 0))) st = fm_last_status(); }
    if (nb && st == FM_OK) { if (!tb) st = fm_last_status(); else if (!(gin[1] = sum_to_like(tb, n, 1))) st = fm_last_status(); }
    fm_tensor_release_n(2, ta, tb);
    return st;
}

static fm_tensor *binary_impl(fm_op_id op, fm_tensor *a, fm_tensor *b);

/* Under autocast, mixed float dtypes promote (ops.def's PROMOTE: to the wider one). */
static fm_tensor *binary(fm_op_id op, fm_tensor *a, fm_tensor *b) {
    fm_tensor *c[2];
    int ac = fm_autocast_inputs(op, 2, (fm_tensor *[]){a, b}, c);
    if (!ac) return binary_impl(op, a, b);
    fm_tensor *y = ac > 0 ? binary_impl(op, c[0], c[1]) : NULL;
    fm_tensor_release_n(2, c[0], c[1]);
    return y;
}

static fm_tensor *binary_impl(fm_op_id op, fm_tensor *a, fm_tensor *b) {
    const char *name = opname(op);
    if (!a || !b) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", name); return NULL; }
    if (fm_check_same_dtype(name, a, b) || fm_check_same_device(name, a, b)) return NULL;
    int nd;
    int64_t shape[FM_MAX_DIMS];
    if (fm_broadcast_shapes(name, a->ndim, a->shape, b->ndim, b->shape, &nd, shape)) return NULL;
    bool cmp = op == FM_OP_EQ || op == FM_OP_NE || op == FM_OP_LT || op == FM_OP_LE || op == FM_OP_GT || op == FM_OP_GE;
    if (!cmp && a->dtype == FM_BOOL) { fm_set_error(FM_ERR_INVALID, "%s: not defined for bool tensors", name); return NULL; }
    fm_tensor *y = fm_tensor_empty(nd, shape, cmp ? FM_BOOL : a->dtype, a->storage->device);
    if (!y) return NULL;
    fm_op_call c = {.op = op, .n_in = 2, .n_out = 1, .in = {a, b}, .out = {y}};
    if (fm_dispatch(&c) != FM_OK) { fm_tensor_release(y); return NULL; }
    if (!cmp) {
        fm_tensor *ins[2] = {a, b};
        fm_node *n = fm_node_begin(op, 2, ins, binary_backward);
        if (n && (op == FM_OP_ADD || op == FM_OP_SUB)) {
            /* (efficiency) backward needs only the operands' shapes: save stride-0 stand-ins,
             * so a residual add does not keep both of its inputs alive */
            fm_tensor *za = fm_tensor_zeros(0, NULL, a->dtype, a->storage->device), *zb = fm_tensor_zeros(0, NULL, b->dtype, b->storage->device);
            fm_tensor *sa = za ? fm_expand(za, a->ndim, a->shape) : NULL, *sb = zb ? fm_expand(zb, b->ndim, b->shape) : NULL;
            fm_node_save(n, 0, sa ? sa : a);
            fm_node_save(n, 1, sb ? sb : b);
            fm_tensor_release_n(4, za, zb, sa, sb);
            fm_node_finish(n, 1, &y);
        } else if (n) {
            fm_node_save(n, 0, a);
            fm_node_save(n, 1, b);
            if (op == FM_OP_DIV || op == FM_OP_POW) fm_node_save(n, 2, y);
            fm_node_finish(n, 1, &y);
        }
    }
    return y;
}

fm_tensor *fm_add(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_ADD, a, b); }
fm_tensor *fm_sub(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_SUB, a, b); }
fm_tensor *fm_mul(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_MUL, a, b); }
fm_tensor *fm_div(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_DIV, a, b); }
fm_tensor *fm_pow(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_POW, a, b); }
fm_tensor *fm_maximum(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_MAXIMUM, a, b); }
fm_tensor *fm_minimum(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_MINIMUM, a, b); }
fm_tensor *fm_fmod(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_FMOD, a, b); }
fm_tensor *fm_remainder(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_REMAINDER, a, b); }
fm_tensor *fm_eq(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_EQ, a, b); }
fm_tensor *fm_ne(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_NE, a, b); }
fm_tensor *fm_lt(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_LT, a, b); }
fm_tensor *fm_le(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_LE, a, b); }
fm_tensor *fm_gt(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_GT, a, b); }
fm_tensor *fm_ge(fm_tensor *a, fm_tensor *b) { return binary(FM_OP_GE, a, b); }

static fm_tensor *with_scalar(fm_op_id op, fm_tensor *a, double s) {
    if (!a) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", opname(op)); return NULL; }
    fm_tensor *t = fm_tensor_full(0, NULL, s, a->dtype, a->storage->device);
    if (!t) return NULL;
    fm_tensor *r = binary(op, a, t);
    fm_tensor_release(t);
    return r;
}
fm_tensor *fm_add_scalar(fm_tensor *a, double s) { return with_scalar(FM_OP_ADD, a, s); }
fm_tensor *fm_mul_scalar(fm_tensor *a, double s) { return with_scalar(FM_OP_MUL, a, s); }
fm_tensor *fm_pow_scalar(fm_tensor *a, double s) { return with_scalar(FM_OP_POW, a, s); }

/* ---------------- where ---------------- */

static fm_status where_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    fm_tensor *c = n->saved[0], *g = gout[0];
    fm_tensor *z = fm_tensor_zeros(0, NULL, g->dtype, g->storage->device);
    if (!z) return fm_last_status();
    fm_status st = FM_OK;
    for (int k = 1; k <= 2 && st == FM_OK; k++) {
        if (!fm_node_needs_grad(n, k)) continue;
        fm_tensor *m = k == 1 ? fm_where(c, g, z) : fm_where(c, z, g);
        gin[k] = m ? sum_to_like(m, n, k) : NULL;
        if (!gin[k]) st = fm_last_status();
        fm_tensor_release(m);
    }
    fm_tensor_release(z);
    return st;
}

fm_tensor *fm_where(fm_tensor *cond, fm_tensor *a, fm_tensor *b) {
    if (!cond || !a || !b) { fm_set_error(FM_ERR_INVALID, "where: input is NULL"); return NULL; }
    if (cond->dtype != FM_BOOL) {
        fm_set_error(FM_ERR_INVALID, "where: condition must be bool (got %s); build it with a comparison", fm_dtype_name(cond->dtype));
        return NULL;
    }
    if (fm_check_same_dtype("where", a, b) || fm_check_same_device("where", a, b) || fm_check_same_device("where", cond, a))
        return NULL;
    int n1, nd;
    int64_t s1[FM_MAX_DIMS], shape[FM_MAX_DIMS];
    if (fm_broadcast_shapes("where", a->ndim, a->shape, b->ndim, b->shape, &n1, s1)) return NULL;
    if (fm_broadcast_shapes("where", cond->ndim, cond->shape, n1, s1, &nd, shape)) return NULL;
    fm_tensor *y = fm_tensor_empty(nd, shape, a->dtype, a->storage->device);
    if (!y) return NULL;
    fm_op_call c = {.op = FM_OP_WHERE, .n_in = 3, .n_out = 1, .in = {cond, a, b}, .out = {y}};
    if (fm_dispatch(&c) != FM_OK) { fm_tensor_release(y); return NULL; }
    fm_tensor *ins[3] = {cond, a, b};
    fm_node *n = fm_node_begin(FM_OP_WHERE, 3, ins, where_backward);
    if (n) {
        fm_node_save(n, 0, cond);
        fm_node_save(n, 1, a);
        fm_node_save(n, 2, b);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

/* ---------------- copy, dtype conversion ---------------- */

static fm_status copy_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    fm_tensor *x = n->saved[0];
    gin[0] = fm_to_dtype(gout[0], x->dtype);
    return gin[0] ? FM_OK : fm_last_status();
}

/* y = contiguous copy of x in dtype dt, recorded on the tape */
static fm_tensor *copy_as(fm_tensor *x, fm_dtype dt) {
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, dt, x->storage->device);
    if (!y) return NULL;
    fm_op_call c = {.op = FM_OP_COPY, .n_in = 1, .n_out = 1, .in = {x}, .out = {y}};
    if (fm_dispatch(&c) != FM_OK) { fm_tensor_release(y); return NULL; }
    if (fm_dtype_is_float(dt)) {
        fm_node *n = fm_node_begin(FM_OP_COPY, 1, &x, copy_backward);
        if (n) {
            /* (efficiency) backward needs only x's dtype: keep a 1-element stand-in, not x,
             * so a cast or contiguous copy does not hold its source alive */
            fm_tensor *z = fm_tensor_zeros(0, NULL, x->dtype, x->storage->device);
            fm_node_save(n, 0, z ? z : x);
            fm_tensor_release(z);
            fm_node_finish(n, 1, &y);
        }
    }
    return y;
}

fm_tensor *fm_contiguous(fm_tensor *t) {
    if (!t) { fm_set_error(FM_ERR_INVALID, "contiguous: tensor is NULL"); return NULL; }
    if (fm_tensor_is_contiguous(t)) return fm_tensor_retain(t);
    return copy_as(t, t->dtype);
}

fm_tensor *fm_clone(fm_tensor *t) {
    if (!t) { fm_set_error(FM_ERR_INVALID, "clone: tensor is NULL"); return NULL; }
    return copy_as(t, t->dtype);
}

fm_tensor *fm_to_dtype(fm_tensor *t, fm_dtype dt) {
    if (!t) { fm_set_error(FM_ERR_INVALID, "to_dtype: tensor is NULL"); return NULL; }
    if ((unsigned)dt >= FM_DTYPE_COUNT) { fm_set_error(FM_ERR_INVALID, "to_dtype: invalid dtype %d", (int)dt); return NULL; }
    if (t->dtype == dt) return fm_tensor_retain(t);
    return copy_as(t, dt);
}

fm_status fm_copy_(fm_tensor *dst, const fm_tensor *src) {
    if (!dst || !src) return fm_set_error(FM_ERR_INVALID, "copy_: NULL argument");
    int nd;
    int64_t shape[FM_MAX_DIMS];
    if (fm_broadcast_shapes("copy_", dst->ndim, dst->shape, src->ndim, src->shape, &nd, shape)) return fm_last_status();
    bool ok = nd == dst->ndim;
    for (int i = 0; ok && i < nd; i++) ok = shape[i] == dst->shape[i];
    if (!ok) {
        char a[128], b[128];
        return fm_set_error(FM_ERR_INVALID, "copy_: source %s does not broadcast to destination %s",
                            fm_shape_str(src->ndim, src->shape, a, sizeof a), fm_shape_str(dst->ndim, dst->shape, b, sizeof b));
    }
    if (!fm_device_eq(dst->storage->device, src->storage->device)) {
        fm_tensor *moved = fm_tensor_to((fm_tensor *)src, dst->storage->device);
        if (!moved) return fm_last_status();
        fm_status st = fm_copy_(dst, moved);
        fm_tensor_release(moved);
        return st;
    }
    fm_op_call c = {.op = FM_OP_COPY, .n_in = 1, .n_out = 1, .in = {(fm_tensor *)src}, .out = {dst}};
    return fm_dispatch(&c);
}

fm_status fm_fill_(fm_tensor *t, double v) {
    if (!t) return fm_set_error(FM_ERR_INVALID, "fill_: tensor is NULL");
    if (t->storage->device.type == FM_DEV_CPU) return fm_cpu_fill(t, v);
    if (t->storage->device.type == FM_DEV_META) return FM_OK; /* no values to set, and no staging copy to count */
    fm_tensor *s = fm_tensor_empty(0, NULL, t->dtype, FM_CPU);
    if (!s) return fm_last_status();
    fm_status st = fm_cpu_fill(s, v);
    if (!st) st = fm_copy_(t, s);
    fm_tensor_release(s);
    return st;
}

fm_status fm_zero_(fm_tensor *t) { return fm_fill_(t, 0.0); }
