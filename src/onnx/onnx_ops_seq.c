/* ONNX sequences and optionals: the values (onnx_value, onnx_internal.h) and their ops.
 *
 * A sequence is a refcounted list of tensors of one dtype; an optional is empty or holds
 * a tensor or a sequence. Both are immutable once made: SequenceInsert and SequenceErase
 * make a new list holding references to the same tensors (a tensor is never written once
 * made), so a value read by two nodes is never changed under either. SplitToSequence's
 * parts are views of its input; ConcatFromSequence is one fm_cat (fm_stack with new_axis).
 * SequenceMap runs its body once per element through the subgraph machinery of If and
 * Loop (onnx_run_subgraph), with the captured values of the graphs around it. Positions
 * are checked against the sequence's length (SequenceAt: [-n, n - 1], SequenceInsert:
 * [-n, n]) and refused naming both; so are tensors of another dtype than the sequence's,
 * ConcatFromSequence's mismatched shapes and OptionalGetElement of an empty optional. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_MAX_IO 16 /* SequenceMap's inputs and outputs, as run_node bounds a node's outputs */

/* ---- the values ---- */

onnx_value *onnx_seq_new(fm_dtype dt, bool typed, int cap) {
    onnx_value *s = calloc(1, sizeof *s);
    if (s && cap > 0 && !(s->items = malloc((size_t)cap * sizeof *s->items))) {
        free(s);
        s = NULL;
    }
    if (!s) {
        fm_set_error(FM_ERR_OOM, "out of memory for a sequence");
        return NULL;
    }
    s->refs = 1, s->kind = ONNX_SEQ, s->dtype = dt, s->typed = typed, s->cap = cap > 0 ? cap : 0;
    return s;
}

fm_status onnx_seq_push(onnx_value *s, fm_tensor *t) {
    if (!t) return fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_INTERNAL, "no tensor for the sequence");
    if (s->typed && t->dtype != s->dtype) {
        fm_status st = fm_set_error(FM_ERR_INVALID, "a tensor of %s cannot join a sequence of %s", fm_dtype_name(t->dtype),
                                    fm_dtype_name(s->dtype));
        fm_tensor_release(t);
        return st;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        fm_tensor **p = s->cap < (1 << 29) ? realloc(s->items, (size_t)cap * sizeof *p) : NULL;
        if (!p) {
            fm_tensor_release(t);
            return fm_set_error(FM_ERR_OOM, "out of memory for a sequence of %d tensors", s->n + 1);
        }
        s->items = p, s->cap = cap;
    }
    s->items[s->n++] = t;
    s->dtype = t->dtype, s->typed = true;
    return FM_OK;
}

onnx_value *onnx_opt_new(fm_tensor *t, onnx_value *v) {
    onnx_value *o = calloc(1, sizeof *o);
    if (!o) {
        fm_tensor_release(t);
        onnx_value_release(v);
        fm_set_error(FM_ERR_OOM, "out of memory for an optional");
        return NULL;
    }
    o->refs = 1, o->kind = ONNX_OPT, o->t = t, o->v = v;
    return o;
}

onnx_value *onnx_value_retain(onnx_value *v) {
    if (v) v->refs++;
    return v;
}

void onnx_value_release(onnx_value *v) {
    if (!v || --v->refs > 0) return;
    for (int i = 0; i < v->n; i++) fm_tensor_release(v->items[i]);
    free(v->items);
    fm_tensor_release(v->t);
    onnx_value_release(v->v);
    free(v);
}

const char *onnx_value_what(const onnx_value *v) {
    if (!v) return "omitted";
    if (v->kind == ONNX_SEQ) return "a sequence";
    return v->t || v->v ? "an optional" : "an empty optional";
}

bool onnx_value_device(const onnx_value *v, fm_device *dev) {
    if (!v) return false;
    if (v->kind == ONNX_OPT) {
        if (v->t) *dev = v->t->storage->device;
        return v->t ? true : onnx_value_device(v->v, dev);
    }
    if (v->n) *dev = v->items[0]->storage->device;
    return v->n > 0;
}

static bool on_dev(const fm_tensor *t, fm_device dev) {
    return t->storage->device.type == dev.type && t->storage->device.index == dev.index;
}

onnx_value *onnx_value_to(onnx_value *v, fm_device dev) {
    if (v->kind == ONNX_OPT) {
        if (v->t && on_dev(v->t, dev)) return onnx_value_retain(v);
        if (v->t) {
            fm_tensor *t = fm_tensor_to(v->t, dev);
            return t ? onnx_opt_new(t, NULL) : NULL;
        }
        onnx_value *s = v->v ? onnx_value_to(v->v, dev) : NULL;
        if (s == v->v) { /* empty, or already there */
            onnx_value_release(s);
            return onnx_value_retain(v);
        }
        return s ? onnx_opt_new(NULL, s) : NULL;
    }
    bool there = true;
    for (int i = 0; i < v->n; i++) there &= on_dev(v->items[i], dev);
    if (there) return onnx_value_retain(v);
    onnx_value *s = onnx_seq_new(v->dtype, v->typed, v->n);
    for (int i = 0; s && i < v->n; i++)
        if (onnx_seq_push(s, fm_tensor_to(v->items[i], dev))) {
            onnx_value_release(s);
            s = NULL;
        }
    return s;
}

/* ---- reading the inputs ---- */

static onnx_value *xin_of(const onnx_op_ctx *c, int k) { return c->xin && k < c->n_in ? c->xin[k] : NULL; }

static const char *what_in(const onnx_op_ctx *c, int k) {
    if (k < c->n_in && c->in[k]) return "a tensor";
    return onnx_value_what(xin_of(c, k));
}

/* Input k as a sequence; NULL with the error naming what it is else. */
static onnx_value *seq_in(const onnx_op_ctx *c, int k) {
    onnx_value *v = xin_of(c, k);
    if (v && v->kind == ONNX_SEQ) return v;
    onnx_node_error(c, FM_ERR_INVALID, "input %d must be a sequence; it is %s", k, what_in(c, k));
    return NULL;
}

/* Input k as a tensor (*t NULL where it is omitted and optional); an error where it is a
 * sequence or optional, or omitted and required. */
static fm_status tensor_in(const onnx_op_ctx *c, int k, bool required, fm_tensor **t) {
    *t = k < c->n_in ? c->in[k] : NULL;
    if (xin_of(c, k)) return onnx_node_error(c, FM_ERR_INVALID, "input %d must be a tensor; it is %s", k, what_in(c, k));
    if (!*t && required) return onnx_node_error(c, FM_ERR_INVALID, "input %d is required", k);
    return FM_OK;
}

/* A position input (one integer) normalized against n: [-n, n - 1], or [-n, n] with at_end. */
static fm_status position(const onnx_op_ctx *c, int k, int n, bool at_end, int *pos) {
    fm_tensor *t;
    if (tensor_in(c, k, true, &t)) return fm_last_status();
    if (t->dtype != FM_I64 && t->dtype != FM_I32)
        return onnx_node_error(c, FM_ERR_INVALID, "the position (input %d) must be int32 or int64; it is %s", k, fm_dtype_name(t->dtype));
    if (fm_tensor_numel(t) != 1 || t->ndim > 1)
        return onnx_node_error(c, FM_ERR_INVALID, "the position (input %d) must be one integer; it has %" PRId64 " elements", k,
                               fm_tensor_numel(t));
    fm_tensor *h = onnx_host(t, FM_I64);
    if (!h) return fm_last_status();
    const int64_t p = ((const int64_t *)fm_tensor_data(h))[0];
    fm_tensor_release(h);
    const int64_t hi = at_end ? n : n - 1;
    if (p < -(int64_t)n || p > hi)
        return onnx_node_error(c, FM_ERR_INVALID, "position %" PRId64 " is out of range for a sequence of %d tensors (it must be in "
                               "[%d, %" PRId64 "])", p, n, -n, hi);
    *pos = (int)(p < 0 ? p + n : p);
    return FM_OK;
}

static fm_status set_xout(onnx_op_ctx *c, int k, onnx_value *v) {
    if (!v) return fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_INTERNAL, "op made no value");
    if (!c->xout || k >= c->n_out) {
        onnx_value_release(v);
        return c->xout ? FM_OK : onnx_node_error(c, FM_ERR_INTERNAL, "the node cannot give a sequence or optional");
    }
    c->xout[k] = v;
    return FM_OK;
}

/* A copy of s's list (new references), with room for one more. */
static onnx_value *seq_copy(const onnx_value *s, int skip) {
    onnx_value *r = onnx_seq_new(s->dtype, s->typed, s->n + 1);
    for (int i = 0; r && i < s->n; i++)
        if (i != skip) r->items[r->n++] = fm_tensor_retain(s->items[i]);
    return r;
}

/* ---- the sequence ops ---- */

static fm_status op_sequence_empty(onnx_op_ctx *c) {
    const int64_t t = onnx_attr_int(c, "dtype", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
    fm_dtype dt;
    if (!onnx_dtype_to_fm((int32_t)t, &dt))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "dtype %s is not a type fathom has", onnx_dtype_name((int32_t)t));
    return set_xout(c, 0, onnx_seq_new(dt, true, 0));
}

static fm_status op_sequence_construct(onnx_op_ctx *c) {
    fm_tensor *t;
    for (int k = 0; k < c->n_in; k++)
        if (tensor_in(c, k, true, &t)) return fm_last_status();
    onnx_value *s = onnx_seq_new(c->in[0]->dtype, true, c->n_in);
    for (int k = 0; s && k < c->n_in; k++)
        if (c->in[k]->dtype != s->dtype) {
            onnx_value_release(s);
            return onnx_node_error(c, FM_ERR_INVALID, "input %d is %s but input 0 is %s: a sequence holds one dtype", k,
                                   fm_dtype_name(c->in[k]->dtype), fm_dtype_name(s->dtype));
        } else s->items[s->n++] = fm_tensor_retain(c->in[k]);
    return set_xout(c, 0, s);
}

static fm_status op_sequence_at(onnx_op_ctx *c) {
    onnx_value *s = seq_in(c, 0);
    int p;
    if (!s || position(c, 1, s->n, false, &p)) return fm_last_status();
    return onnx_set_out(c, 0, fm_tensor_retain(s->items[p]));
}

static fm_status op_sequence_length(onnx_op_ctx *c) {
    onnx_value *s = seq_in(c, 0);
    if (!s) return fm_last_status();
    return onnx_set_out(c, 0, fm_tensor_scalar((double)s->n, FM_I64));
}

static fm_status op_sequence_insert(onnx_op_ctx *c) {
    onnx_value *s = seq_in(c, 0);
    fm_tensor *t;
    if (!s || tensor_in(c, 1, true, &t)) return fm_last_status();
    int p = s->n;
    if (c->n_in > 2 && (c->in[2] || xin_of(c, 2)) && position(c, 2, s->n, true, &p)) return fm_last_status();
    if (s->typed && t->dtype != s->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "the tensor is %s but the sequence holds %s", fm_dtype_name(t->dtype),
                               fm_dtype_name(s->dtype));
    onnx_value *r = seq_copy(s, -1);
    if (!r) return fm_last_status();
    memmove(r->items + p + 1, r->items + p, (size_t)(r->n - p) * sizeof *r->items);
    r->items[p] = fm_tensor_retain(t);
    r->n++;
    r->dtype = t->dtype, r->typed = true;
    return set_xout(c, 0, r);
}

static fm_status op_sequence_erase(onnx_op_ctx *c) {
    onnx_value *s = seq_in(c, 0);
    if (!s) return fm_last_status();
    int p = s->n - 1;
    if (c->n_in > 1 && (c->in[1] || xin_of(c, 1))) {
        if (position(c, 1, s->n, false, &p)) return fm_last_status();
    } else if (!s->n) return onnx_node_error(c, FM_ERR_INVALID, "the sequence is empty: there is no tensor to erase");
    return set_xout(c, 0, seq_copy(s, p));
}

/* SplitToSequence's part lengths along an axis of size dim (*n of them, malloc'd in *len). */
static fm_status split_lengths(onnx_op_ctx *c, int64_t dim, int64_t **len, int64_t *n) {
    fm_tensor *sp;
    if (tensor_in(c, 1, false, &sp)) return fm_last_status();
    fm_tensor *h = NULL;
    if (sp && (sp->ndim > 1 || (sp->dtype != FM_I64 && sp->dtype != FM_I32)))
        return onnx_node_error(c, FM_ERR_INVALID, "split (input 1) must be a scalar or a 1-D tensor of int32 or int64");
    if (sp && !(h = onnx_host(sp, FM_I64))) return fm_last_status();
    const int64_t *v = h ? fm_tensor_data(h) : NULL;
    const int64_t chunk = !sp ? 1 : !sp->ndim ? v[0] : 0; /* 0: the lengths are listed */
    if (sp && !sp->ndim && chunk < 1) {
        fm_tensor_release(h);
        return onnx_node_error(c, FM_ERR_INVALID, "split (input 1) is %" PRId64 "; it must be positive", chunk);
    }
    *n = chunk ? dim / chunk + (dim % chunk != 0) : sp->shape[0];
    if (*n > INT32_MAX / 2) {
        fm_tensor_release(h);
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "%" PRId64 " parts are too many", *n);
    }
    *len = malloc((size_t)(*n + 1) * sizeof **len);
    if (!*len) {
        fm_tensor_release(h);
        return fm_set_error(FM_ERR_OOM, "out of memory for %" PRId64 " parts", *n);
    }
    int64_t sum = 0;
    fm_status st = FM_OK;
    for (int64_t i = 0; i < *n && !st; i++) {
        (*len)[i] = chunk ? (i + 1 < *n ? chunk : dim - chunk * i) : v[i];
        if ((*len)[i] < 0 || (!chunk && (*len)[i] == 0))
            st = onnx_node_error(c, FM_ERR_INVALID, "split[%" PRId64 "] is %" PRId64 "; the lengths must be positive", i, (*len)[i]);
        sum += (*len)[i];
    }
    fm_tensor_release(h);
    if (!st && sum != dim)
        st = onnx_node_error(c, FM_ERR_INVALID, "the split lengths add up to %" PRId64 " but the axis has %" PRId64, sum, dim);
    if (st) free(*len), *len = NULL;
    return st;
}

static fm_status op_split_to_sequence(onnx_op_ctx *c) {
    fm_tensor *x;
    if (tensor_in(c, 0, true, &x)) return fm_last_status();
    if (!x->ndim) return onnx_node_error(c, FM_ERR_INVALID, "the input is a scalar; there is no axis to split");
    const int64_t a = onnx_attr_int(c, "axis", 0);
    if (a < -x->ndim || a >= x->ndim)
        return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is out of range for %d dimensions", a, x->ndim);
    const int ax = (int)(a < 0 ? a + x->ndim : a);
    const bool squeeze = !onnx_attr_int(c, "keepdims", 1) && !(c->n_in > 1 && (c->in[1] || xin_of(c, 1)));
    int64_t *len = NULL, n = 0;
    if (split_lengths(c, x->shape[ax], &len, &n)) return fm_last_status();
    onnx_value *s = onnx_seq_new(x->dtype, true, (int)n);
    int64_t at = 0;
    for (int64_t i = 0; s && i < n; at += len[i++])
        if (onnx_seq_push(s, squeeze ? fm_select(x, ax, at) : fm_narrow(x, ax, at, len[i]))) {
            onnx_value_release(s);
            s = NULL;
        }
    free(len);
    return set_xout(c, 0, s);
}

/* ConcatFromSequence's shapes: every tensor of one rank r; along new_axis all of one shape,
 * else equal but along axis. */
static fm_status concat_check(const onnx_op_ctx *c, const onnx_value *s, bool stack, int axis) {
    const fm_tensor *t0 = s->items[0];
    char a[96], b[96];
    for (int i = 1; i < s->n; i++) {
        const fm_tensor *t = s->items[i];
        bool ok = t->ndim == t0->ndim;
        for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == t0->shape[d] || (!stack && d == axis);
        if (!ok)
            return onnx_node_error(c, FM_ERR_INVALID, "tensor %d of the sequence has shape %s but tensor 0 has %s: %s", i,
                                   fm_shape_str(t->ndim, t->shape, a, sizeof a), fm_shape_str(t0->ndim, t0->shape, b, sizeof b),
                                   stack ? "with new_axis they must all have one shape"
                                         : "they must have one rank and agree except along the axis");
    }
    return FM_OK;
}

static fm_status op_concat_from_sequence(onnx_op_ctx *c) {
    onnx_value *s = seq_in(c, 0);
    if (!s) return fm_last_status();
    if (!onnx_attr(c, "axis")) return onnx_node_error(c, FM_ERR_INVALID, "the attribute 'axis' is required");
    if (!s->n) return onnx_node_error(c, FM_ERR_INVALID, "the sequence is empty: there is nothing to concatenate");
    const bool stack = onnx_attr_int(c, "new_axis", 0) != 0;
    const int r = s->items[0]->ndim + (stack ? 1 : 0);
    const int64_t a = onnx_attr_int(c, "axis", 0);
    if (a < -r || a >= r || !r)
        return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is out of range for %s of %d dimensions", a,
                               stack ? "the stacked result" : "tensors", r);
    const int ax = (int)(a < 0 ? a + r : a);
    if (concat_check(c, s, stack, ax)) return fm_last_status();
    return onnx_set_out(c, 0, stack ? fm_stack(s->n, s->items, ax) : fm_cat(s->n, s->items, ax));
}

/* ---- SequenceMap ---- */

typedef struct { fm_onnx_model *b; int len; onnx_value *out[SEQ_MAX_IO]; } seqmap_plan;

static fm_status seqmap_plan_of(onnx_op_ctx *c, seqmap_plan *p) {
    if (!(p->b = onnx_subgraph(c, "body"))) return onnx_node_error(c, FM_ERR_INVALID, "attribute 'body' (a graph) is missing");
    if (c->n_in > SEQ_MAX_IO || p->b->n_inputs != c->n_in || p->b->n_outputs != c->n_out)
        return onnx_node_error(c, FM_ERR_INVALID, "the body takes %d inputs and gives %d outputs; the node has %d and %d "
                               "(at most %d)", p->b->n_inputs, p->b->n_outputs, c->n_in, c->n_out, SEQ_MAX_IO);
    onnx_value *s0 = seq_in(c, 0);
    if (!s0) return fm_last_status();
    p->len = s0->n;
    for (int k = 1; k < c->n_in; k++) {
        onnx_value *v = xin_of(c, k);
        if (v && v->kind != ONNX_SEQ)
            return onnx_node_error(c, FM_ERR_INVALID, "input %d is %s; SequenceMap takes tensors and sequences", k, onnx_value_what(v));
        if (v && v->n != p->len)
            return onnx_node_error(c, FM_ERR_INVALID, "input %d is a sequence of %d tensors but input 0 has %d", k, v->n, p->len);
        if (!v && !c->in[k]) return onnx_node_error(c, FM_ERR_INVALID, "input %d is omitted", k);
    }
    for (int k = 0; k < c->n_out; k++) { /* an empty input gives empty sequences of the body's declared types */
        fm_dtype dt = FM_F32;
        const int32_t et = p->b->out_decl[k].elem_type;
        const bool typed = et && onnx_dtype_to_fm(et, &dt);
        if (!(p->out[k] = onnx_seq_new(dt, typed, p->len))) return fm_last_status();
    }
    return FM_OK;
}

static fm_status op_sequence_map(onnx_op_ctx *c) {
    seqmap_plan p = {0};
    fm_status st = seqmap_plan_of(c, &p);
    for (int i = 0; !st && i < p.len; i++) {
        fm_tensor *in[SEQ_MAX_IO] = {0}, *out[SEQ_MAX_IO] = {0};
        for (int k = 0; k < c->n_in; k++) in[k] = xin_of(c, k) ? c->xin[k]->items[i] : c->in[k];
        st = onnx_run_subgraph(c, p.b, c->n_in, in, out);
        for (int k = 0; k < c->n_out; k++)
            if (!st) st = onnx_seq_push(p.out[k], out[k]);
            else fm_tensor_release(out[k]);
        if (st) fm_error_prefix("element %d", i);
    }
    for (int k = 0; k < c->n_out; k++) {
        if (!st) st = set_xout(c, k, p.out[k]);
        else onnx_value_release(p.out[k]);
    }
    return st;
}

/* ---- optionals ---- */

/* Optional's `type` attribute against its input (a tensor's element type, or a sequence). */
static fm_status optional_type_check(const onnx_op_ctx *c, const Onnx__TypeProto *tp, const fm_tensor *t, const onnx_value *v) {
    if (!tp) return FM_OK;
    const bool tensor_type = tp->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    if ((t && !tensor_type) || (v && tp->value_case != ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE))
        return onnx_node_error(c, FM_ERR_INVALID, "the input is %s but the attribute 'type' says otherwise", t ? "a tensor" : "a sequence");
    fm_dtype dt;
    if (t && tp->tensor_type->has_elem_type && onnx_dtype_to_fm(tp->tensor_type->elem_type, &dt) && dt != t->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "the input is %s but the attribute 'type' is %s", fm_dtype_name(t->dtype),
                               fm_dtype_name(dt));
    return FM_OK;
}

static fm_status op_optional(onnx_op_ctx *c) {
    const Onnx__AttributeProto *at = onnx_attr(c, "type");
    const Onnx__TypeProto *tp = at ? at->tp : NULL;
    fm_tensor *t = c->n_in ? c->in[0] : NULL;
    onnx_value *v = xin_of(c, 0);
    if (v && v->kind != ONNX_SEQ)
        return onnx_node_error(c, FM_ERR_INVALID, "the input is %s; Optional takes a tensor or a sequence", onnx_value_what(v));
    if (!t && !v && !tp) return onnx_node_error(c, FM_ERR_INVALID, "an empty optional needs the attribute 'type'");
    if (optional_type_check(c, tp, t, v)) return fm_last_status();
    return set_xout(c, 0, onnx_opt_new(fm_tensor_retain(t), onnx_value_retain(v)));
}

static fm_status op_optional_has_element(onnx_op_ctx *c) {
    const onnx_value *v = xin_of(c, 0);
    const bool has = (c->n_in && c->in[0]) || (v && (v->kind != ONNX_OPT || v->t || v->v));
    return onnx_set_out(c, 0, fm_tensor_scalar(has ? 1.0 : 0.0, FM_BOOL));
}

static fm_status op_optional_get_element(onnx_op_ctx *c) {
    onnx_value *v = xin_of(c, 0);
    if (c->in[0]) return onnx_set_out(c, 0, fm_tensor_retain(c->in[0]));
    if (!v) return onnx_node_error(c, FM_ERR_INVALID, "the input is omitted");
    if (v->kind == ONNX_SEQ) return set_xout(c, 0, onnx_value_retain(v));
    if (v->t) return onnx_set_out(c, 0, fm_tensor_retain(v->t));
    if (v->v) return set_xout(c, 0, onnx_value_retain(v->v));
    return onnx_node_error(c, FM_ERR_INVALID, "the optional is empty: it has no element to get");
}

const onnx_op onnx_ops_seq[] = {
    {"SequenceEmpty", 11, 0, 0, 1, "dtype", op_sequence_empty},
    {"SequenceConstruct", 11, 1, -1, 1, "", op_sequence_construct},
    {"SequenceAt", 11, 2, 2, 1, "", op_sequence_at},
    {"SequenceLength", 11, 1, 1, 1, "", op_sequence_length},
    {"SequenceInsert", 11, 2, 3, 1, "", op_sequence_insert},
    {"SequenceErase", 11, 1, 2, 1, "", op_sequence_erase},
    {"SplitToSequence", 11, 1, 2, 1, "axis,keepdims", op_split_to_sequence},
    {"ConcatFromSequence", 11, 1, 1, 1, "axis,new_axis", op_concat_from_sequence},
    {"SequenceMap", 17, 1, -1, SEQ_MAX_IO, "body", op_sequence_map},
    {"Optional", 15, 0, 1, 1, "type", op_optional},
    {"OptionalHasElement", 15, 0, 1, 1, "", op_optional_has_element},
    {"OptionalGetElement", 15, 1, 1, 1, "", op_optional_get_element},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};

bool onnx_op_makes_values(const onnx_op *op) {
    for (const onnx_op *o = onnx_ops_seq; o->name; o++)
        if (o == op) return true;
    return false;
}

bool onnx_op_takes_values(const onnx_op *op) {
    return onnx_op_makes_values(op) || !strcmp(op->name, "Identity") || !strcmp(op->name, "If") || !strcmp(op->name, "Loop");
}
