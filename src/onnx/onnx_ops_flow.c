/* ONNX control flow: If, Loop and Scan. Each runs its subgraphs (onnx_node.subs, built at
 * load in the scope of the graph around them) through onnx_run_subgraph, on the device
 * the graph runs on; a subgraph reads the values of the enclosing graphs it names from
 * the running graph's values. What an iteration gives for the scan outputs is kept and
 * stacked at the end (fm_stack), along a new axis 0 for Loop and the output's axis for
 * Scan. Exporters write If for data-dependent branches (torch.cond, TensorFlow's cond),
 * Loop for generation and beam search loops, Scan for recurrences; ONNX's own function
 * bodies (AffineGrid, Range, LinearAttention's expansions) use them too. If's branches may
 * give sequences and optionals, and Loop may carry them (a sequence built over the
 * iterations, an optional that starts empty); Loop's scan outputs and Scan are tensors. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)
#define FLOW_MAX 64 /* inputs and outputs of a body, as run_node bounds a node's */

static void release_all(fm_tensor **t, int n) {
    for (int i = 0; i < n; i++) {
        fm_tensor_release(t[i]);
        t[i] = NULL;
    }
}

/* t's single element as a truth value (a bool, or any number: nonzero). */
static fm_status truth(const onnx_op_ctx *c, const fm_tensor *t, const char *what, bool *v) {
    if (fm_tensor_numel(t) != 1)
        return onnx_node_error(c, FM_ERR_INVALID, "%s must hold one element; it has %" PRId64, what, fm_tensor_numel(t));
    fm_tensor *h = onnx_host((fm_tensor *)t, FM_F64);
    if (!h) return fm_last_status();
    *v = fm_tensor_get(h, 0) != 0;
    fm_tensor_release(h);
    return FM_OK;
}

static fm_onnx_model *body_of(const onnx_op_ctx *c, const char *attr) {
    fm_onnx_model *b = onnx_subgraph(c, attr);
    if (!b) onnx_node_error(c, FM_ERR_INVALID, "attribute '%s' (a graph) is missing or not a graph", attr);
    return b;
}

/* ---- If ---- */

static fm_status op_if(onnx_op_ctx *c) {
    if (c->xin && c->xin[0])
        return onnx_node_error(c, FM_ERR_INVALID, "the condition (input 0) is %s; it must be a tensor", onnx_value_what(c->xin[0]));
    bool cond = false;
    if (truth(c, c->in[0], "the condition (input 0)", &cond)) return fm_last_status();
    fm_onnx_model *b = body_of(c, cond ? "then_branch" : "else_branch");
    if (!b) return fm_last_status();
    if (b->n_outputs != c->n_out || b->n_outputs > FLOW_MAX)
        return onnx_node_error(c, FM_ERR_INVALID, "the %s branch gives %d outputs; the node has %d", cond ? "then" : "else",
                               b->n_outputs, c->n_out);
    fm_tensor *out[FLOW_MAX];
    onnx_value *xout[FLOW_MAX]; /* a branch may give sequences and optionals */
    if (onnx_run_subgraph_values(c, b, 0, NULL, NULL, out, c->xout ? xout : NULL)) return fm_last_status();
    for (int i = 0; i < c->n_out; i++) {
        c->out[i] = out[i];
        if (c->xout) c->xout[i] = xout[i];
    }
    return FM_OK;
}

/* ---- the scan outputs: one tensor per iteration, stacked at the end ---- */

typedef struct { fm_tensor **t; int64_t n, cap; } stack_list;

static fm_status stack_push(stack_list *s, fm_tensor *t) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 16;
        fm_tensor **p = realloc(s->t, (size_t)cap * sizeof *p);
        if (!p) {
            fm_tensor_release(t);
            return fm_set_error(FM_ERR_OOM, "out of memory for the scan outputs");
        }
        s->t = p, s->cap = cap;
    }
    s->t[s->n++] = t;
    return FM_OK;
}

static void stack_free(stack_list *s) {
    for (int64_t i = 0; i < s->n; i++) fm_tensor_release(s->t[i]);
    free(s->t);
    s->t = NULL, s->n = s->cap = 0;
}

/* An output of no iteration: size 0 along axis, the body output's declared dims (1 where
 * unknown) elsewhere, its declared element type. */
static fm_tensor *empty_output(const fm_onnx_model *b, int out, int axis, fm_device dev) {
    const Onnx__ValueInfoProto *vi = b->graph->output[out];
    onnx_input d;
    d.ndim = 0, d.elem_type = 0;
    const Onnx__TypeProto *tp = vi->type;
    if (tp && tp->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) {
        const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
        d.elem_type = tt->has_elem_type ? tt->elem_type : 0;
        d.ndim = tt->shape && tt->shape->n_dim < FM_MAX_DIMS ? (int)tt->shape->n_dim : 0;
        for (int k = 0; k < d.ndim; k++)
            d.dims[k] = tt->shape->dim[k]->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && tt->shape->dim[k]->dim_value >= 0
                            ? tt->shape->dim[k]->dim_value : 1; /* a negative declared dim (a bad file) as unknown */
    }
    fm_dtype dt = FM_F32;
    if (d.elem_type) onnx_dtype_to_fm(d.elem_type, &dt);
    int64_t shape[FM_MAX_DIMS];
    if (axis < 0) axis += d.ndim + 1;
    if (axis < 0 || axis > d.ndim) axis = 0;
    for (int k = 0, j = 0; k <= d.ndim; k++) shape[k] = k == axis ? 0 : d.dims[j++];
    return fm_tensor_zeros(d.ndim + 1, shape, dt, dev);
}

/* The list stacked along axis (reversed first with rev), or the empty output. */
static fm_tensor *stack_out(const onnx_op_ctx *c, stack_list *s, const fm_onnx_model *b, int out, int axis, bool rev) {
    if (!s->n) return empty_output(b, out, axis, c->dev);
    if (rev)
        for (int64_t i = 0, j = s->n - 1; i < j; i++, j--) {
            fm_tensor *t = s->t[i];
            s->t[i] = s->t[j], s->t[j] = t;
        }
    if (s->n > INT32_MAX) {
        fm_set_error(FM_ERR_UNSUPPORTED, "more than 2^31 iterations to stack");
        return NULL;
    }
    int r = s->t[0]->ndim;
    if (axis < -(r + 1) || axis > r) {
        onnx_node_error(c, FM_ERR_INVALID, "scan output axis %d is out of range for outputs of %d dimensions", axis, r + 1);
        return NULL;
    }
    return fm_stack((int)s->n, s->t, axis < 0 ? axis + r + 1 : axis);
}

/* ---- Loop ---- */

typedef struct {
    fm_onnx_model *b;
    int n_carry, n_scan;
    int64_t trip; /* -1: no trip count */
    bool has_cond, cond;
} loop_plan;

static fm_status loop_plan_of(onnx_op_ctx *c, loop_plan *p) {
    if (!(p->b = body_of(c, "body"))) return fm_last_status();
    if (c->n_in < 2) return onnx_node_error(c, FM_ERR_INVALID, "takes the trip count and the condition (either may be empty) first");
    for (int k = 0; k < 2 && c->xin; k++)
        if (c->xin[k]) return onnx_node_error(c, FM_ERR_INVALID, "input %d is %s; it must be a tensor", k, onnx_value_what(c->xin[k]));
    p->n_carry = c->n_in - 2;
    p->n_scan = p->b->n_outputs - 1 - p->n_carry;
    if (p->b->n_inputs != p->n_carry + 2 || p->n_scan < 0 || p->b->n_outputs > FLOW_MAX)
        return onnx_node_error(c, FM_ERR_INVALID, "the body takes %d inputs and gives %d outputs; with %d loop-carried values "
                               "it must take %d (iteration, condition, the values) and give at least %d",
                               p->b->n_inputs, p->b->n_outputs, p->n_carry, p->n_carry + 2, p->n_carry + 1);
    if (c->n_out > p->n_carry + p->n_scan)
        return onnx_node_error(c, FM_ERR_INVALID, "the node has %d outputs; its body gives %d", c->n_out, p->n_carry + p->n_scan);
    p->trip = -1;
    if (c->in[0]) {
        int64_t v[1];
        int n;
        if (onnx_tensor_ints(c, 0, v, 1, &n)) return fm_last_status();
        if (n != 1) return onnx_node_error(c, FM_ERR_INVALID, "the trip count M (input 0) must hold one integer");
        p->trip = v[0] < 0 ? 0 : v[0];
    }
    p->has_cond = c->in[1] != NULL, p->cond = true;
    if (p->has_cond && truth(c, c->in[1], "the condition (input 1)", &p->cond)) return fm_last_status();
    if (p->trip < 0 && !p->has_cond)
        return onnx_node_error(c, FM_ERR_INVALID, "has neither a trip count nor a condition: it would never end");
    return FM_OK;
}

/* The loop-carried values: a tensor, or a sequence or optional, each. */
typedef struct { fm_tensor *t[FLOW_MAX]; onnx_value *x[FLOW_MAX]; } loop_carry;

/* The body's outputs after the condition: carried values kept, scan values stacked. */
static fm_status loop_keep(onnx_op_ctx *c, loop_plan *p, fm_tensor **out, onnx_value **xout, loop_carry *carry, stack_list *scans) {
    fm_status s = FM_OK;
    for (int k = 0; k < p->n_carry; k++) {
        fm_tensor_release(carry->t[k]);
        onnx_value_release(carry->x[k]);
        carry->t[k] = out[1 + k], carry->x[k] = xout[1 + k];
        out[1 + k] = NULL, xout[1 + k] = NULL;
    }
    for (int k = 0; k < p->n_scan; k++) {
        const int j = 1 + p->n_carry + k;
        if (!s && xout[j])
            s = onnx_node_error(c, FM_ERR_INVALID, "the body's scan output %d is %s; scan outputs are tensors", k,
                                onnx_value_what(xout[j]));
        if (!s) s = stack_push(&scans[k], out[j]);
        else fm_tensor_release(out[j]);
        onnx_value_release(xout[j]);
        out[j] = NULL, xout[j] = NULL;
    }
    return s;
}

/* One iteration: the body on (i, cond, carried); carried and cond updated, scan values kept. */
static fm_status loop_step(onnx_op_ctx *c, loop_plan *p, int64_t i, loop_carry *carry, stack_list *scans) {
    fm_tensor *in[FLOW_MAX + 2] = {0}, *out[FLOW_MAX] = {0};
    onnx_value *xin[FLOW_MAX + 2], *xout[FLOW_MAX]; /* the body's: zeroed below, as far as it has them */
    bool any = false;
    for (int k = 0; k < p->n_carry; k++) any |= (xin[2 + k] = carry->x[k]) != NULL;
    xin[0] = xin[1] = NULL;
    for (int k = 0; k < p->b->n_outputs; k++) xout[k] = NULL;
    in[0] = fm_tensor_full(0, NULL, (double)i, FM_I64, c->dev);
    in[1] = fm_tensor_full(0, NULL, p->cond ? 1.0 : 0.0, FM_BOOL, c->dev);
    if (!in[0] || !in[1]) {
        REL(in[0], in[1]);
        return fm_last_status();
    }
    for (int k = 0; k < p->n_carry; k++) in[2 + k] = carry->t[k];
    fm_status s = onnx_run_subgraph_values(c, p->b, p->n_carry + 2, in, any ? xin : NULL, out, xout);
    REL(in[0], in[1]);
    if (s) return s;
    if (xout[0]) s = onnx_node_error(c, FM_ERR_INVALID, "the body's condition output is %s; it must be a tensor", onnx_value_what(xout[0]));
    else if (p->has_cond) s = truth(c, out[0], "the body's condition output", &p->cond);
    fm_status k = loop_keep(c, p, out, xout, carry, scans);
    fm_tensor_release(out[0]);
    onnx_value_release(xout[0]);
    return s ? s : k;
}

static fm_status op_loop(onnx_op_ctx *c) {
    loop_plan p = {0};
    if (loop_plan_of(c, &p)) return fm_last_status();
    loop_carry carry = {{0}, {0}};
    stack_list scans[FLOW_MAX] = {{0}};
    for (int k = 0; k < p.n_carry; k++) {
        carry.t[k] = fm_tensor_retain(c->in[2 + k]);
        carry.x[k] = c->xin ? onnx_value_retain(c->xin[2 + k]) : NULL;
    }
    const int64_t lim = c->model->root ? c->model->root->max_iterations : 0;
    fm_status s = FM_OK;
    for (int64_t i = 0; !s && (p.trip < 0 || i < p.trip) && (!p.has_cond || p.cond); i++) {
        if (lim && i >= lim) {
            s = onnx_node_error(c, FM_ERR_INVALID, "ran past the limit of %" PRId64 " iterations (fm_onnx_set_max_iterations)", lim);
            break;
        }
        s = loop_step(c, &p, i, &carry, scans);
    }
    for (int k = 0; !s && k < c->n_out; k++)
        if (k < p.n_carry && carry.x[k] && !c->xout)
            s = onnx_node_error(c, FM_ERR_INTERNAL, "loop-carried value %d is %s, which this node cannot give", k,
                                onnx_value_what(carry.x[k]));
        else if (k < p.n_carry) {
            c->out[k] = carry.t[k], carry.t[k] = NULL;
            if (c->xout) c->xout[k] = carry.x[k], carry.x[k] = NULL;
        } else if (!(c->out[k] = stack_out(c, &scans[k - p.n_carry], p.b, 1 + k, 0, false))) s = fm_last_status();
    if (s) {
        release_all(c->out, c->n_out);
        for (int k = 0; c->xout && k < c->n_out; k++) onnx_value_release(c->xout[k]), c->xout[k] = NULL;
    }
    release_all(carry.t, p.n_carry);
    for (int k = 0; k < p.n_carry; k++) onnx_value_release(carry.x[k]);
    for (int k = 0; k < p.n_scan; k++) stack_free(&scans[k]);
    return s;
}

/* ---- Scan (opset 9 and later) ---- */

typedef struct {
    fm_onnx_model *b;
    int n_state, n_in, n_out;
    int in_axis[FLOW_MAX], out_axis[FLOW_MAX];
    bool in_rev[FLOW_MAX], out_rev[FLOW_MAX];
    int64_t len;
} scan_plan;

/* An INTS attribute of n values (all `dflt` when absent) into v. */
static fm_status scan_ints(const onnx_op_ctx *c, const char *name, int n, int dflt, int *v, bool axes) {
    int k;
    const int64_t *a = onnx_attr_ints(c, name, &k);
    if (a && k != n) return onnx_node_error(c, FM_ERR_INVALID, "%s has %d values; %d expected", name, k, n);
    for (int i = 0; i < n; i++) {
        int64_t x = a ? a[i] : dflt;
        if (axes ? (x < -FM_MAX_DIMS || x > FM_MAX_DIMS) : (x != 0 && x != 1))
            return onnx_node_error(c, FM_ERR_INVALID, "%s[%d] = %" PRId64 " is not %s", name, i, x, axes ? "a valid axis" : "0 or 1");
        v[i] = (int)x;
    }
    return FM_OK;
}

static fm_status scan_plan_of(onnx_op_ctx *c, scan_plan *p) {
    if (!(p->b = body_of(c, "body"))) return fm_last_status();
    const int64_t m = onnx_attr_int(c, "num_scan_inputs", -1);
    if (m < 1 || m > c->n_in)
        return onnx_node_error(c, FM_ERR_INVALID, "num_scan_inputs must be in [1, %d] (the node's inputs); got %" PRId64, c->n_in, m);
    for (int k = 0; k < c->n_in; k++)
        if (!c->in[k]) return onnx_node_error(c, FM_ERR_INVALID, "input %d is omitted; every state and scan input is required", k);
    p->n_in = (int)m, p->n_state = c->n_in - (int)m;
    p->n_out = p->b->n_outputs - p->n_state;
    if (p->b->n_inputs != c->n_in || p->n_out < 0 || p->b->n_outputs > FLOW_MAX || c->n_out > p->b->n_outputs)
        return onnx_node_error(c, FM_ERR_INVALID, "the body takes %d inputs and gives %d outputs; the node has %d inputs "
                               "(%d states) and %d outputs", p->b->n_inputs, p->b->n_outputs, c->n_in, p->n_state, c->n_out);
    int dir_in[FLOW_MAX], dir_out[FLOW_MAX];
    if (scan_ints(c, "scan_input_axes", p->n_in, 0, p->in_axis, true) ||
        scan_ints(c, c->opset < 9 ? "directions" : "scan_input_directions", p->n_in, 0, dir_in, false) ||
        scan_ints(c, "scan_output_axes", p->n_out, 0, p->out_axis, true) ||
        scan_ints(c, "scan_output_directions", p->n_out, 0, dir_out, false))
        return fm_last_status();
    for (int k = 0; k < p->n_in; k++) {
        const fm_tensor *x = c->in[p->n_state + k];
        int ax = p->in_axis[k] < 0 ? p->in_axis[k] + x->ndim : p->in_axis[k];
        if (ax < 0 || ax >= x->ndim)
            return onnx_node_error(c, FM_ERR_INVALID, "scan input %d has %d dimensions; axis %d is out of range", k, x->ndim, p->in_axis[k]);
        p->in_axis[k] = ax, p->in_rev[k] = dir_in[k];
        if (k && x->shape[ax] != p->len)
            return onnx_node_error(c, FM_ERR_INVALID, "scan input %d has %" PRId64 " steps; scan input 0 has %" PRId64, k, x->shape[ax], p->len);
        p->len = x->shape[ax];
    }
    for (int k = 0; k < p->n_out; k++) p->out_rev[k] = dir_out[k];
    return FM_OK;
}

static fm_status scan_step(onnx_op_ctx *c, scan_plan *p, int64_t t, fm_tensor **state, stack_list *outs) {
    fm_tensor *in[FLOW_MAX] = {0}, *out[FLOW_MAX] = {0};
    fm_status s = FM_OK;
    for (int k = 0; k < p->n_state; k++) in[k] = state[k];
    for (int k = 0; k < p->n_in && !s; k++) {
        fm_tensor *x = c->in[p->n_state + k];
        if (!(in[p->n_state + k] = fm_select(x, p->in_axis[k], p->in_rev[k] ? p->len - 1 - t : t))) s = fm_last_status();
    }
    if (!s) s = onnx_run_subgraph(c, p->b, c->n_in, in, out);
    for (int k = 0; k < p->n_in; k++) fm_tensor_release(in[p->n_state + k]);
    if (s) return s;
    for (int k = 0; k < p->n_state; k++) {
        fm_tensor_release(state[k]);
        state[k] = out[k];
    }
    for (int k = 0; k < p->n_out; k++)
        if (!s) s = stack_push(&outs[k], out[p->n_state + k]);
        else fm_tensor_release(out[p->n_state + k]);
    return s;
}

static fm_status scan_run(onnx_op_ctx *c) {
    scan_plan p = {0};
    if (c->n_in > FLOW_MAX) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "more than %d inputs", FLOW_MAX);
    if (scan_plan_of(c, &p)) return fm_last_status();
    fm_tensor *state[FLOW_MAX] = {0};
    stack_list outs[FLOW_MAX] = {{0}};
    for (int k = 0; k < p.n_state; k++) state[k] = fm_tensor_retain(c->in[k]);
    fm_status s = FM_OK;
    for (int64_t t = 0; !s && t < p.len; t++) s = scan_step(c, &p, t, state, outs);
    for (int k = 0; !s && k < c->n_out; k++)
        if (k < p.n_state) c->out[k] = state[k], state[k] = NULL;
        else {
            const int j = k - p.n_state;
            if (!(c->out[k] = stack_out(c, &outs[j], p.b, k, p.out_axis[j], p.out_rev[j]))) s = fm_last_status();
        }
    if (s) release_all(c->out, c->n_out);
    release_all(state, p.n_state);
    for (int k = 0; k < p.n_out; k++) stack_free(&outs[k]);
    return s;
}

/* Opset 8's Scan: every input and output has a batch axis first, and the optional input 0
 * (sequence_lens) may give each batch entry its own length: each entry is scanned as
 * opset 9 does, and the results are stacked along the batch axis. Lengths shorter than
 * the scan axis are refused (the scan outputs' padding is not implemented). */
static fm_status scan8_entry(onnx_op_ctx *c, int64_t b, fm_tensor **res) {
    fm_tensor *in[FLOW_MAX] = {0};
    fm_status s = FM_OK;
    for (int k = 1; k < c->n_in && !s; k++)
        if (!(in[k - 1] = fm_select(c->in[k], 0, b))) s = fm_last_status();
    onnx_op_ctx e = *c;
    e.in = in, e.n_in = c->n_in - 1, e.out = res;
    if (!s) s = scan_run(&e);
    release_all(in, c->n_in - 1);
    return s;
}

static fm_status scan8_lengths(onnx_op_ctx *c) {
    const int64_t m = onnx_attr_int(c, "num_scan_inputs", 1);
    const fm_tensor *x = c->in[c->n_in - (m >= 1 && m < c->n_in ? m : 1)];
    fm_tensor *h = onnx_host(c->in[0], FM_I64);
    if (!h) return fm_last_status();
    fm_status s = FM_OK;
    for (int64_t b = 0; !s && b < fm_tensor_numel(h); b++)
        if (x->ndim < 2 || fm_tensor_get(h, b) != x->shape[1])
            s = onnx_node_error(c, FM_ERR_UNSUPPORTED, "sequence_lens shorter than the scan axis are not supported");
    fm_tensor_release(h);
    return s;
}

static fm_status op_scan(onnx_op_ctx *c) {
    if (c->opset >= 9) return scan_run(c);
    if (c->n_in < 2 || c->n_in > FLOW_MAX || c->n_out > FLOW_MAX || !c->in[1]->ndim)
        return onnx_node_error(c, FM_ERR_INVALID, "opset 8 Scan needs batched inputs after sequence_lens");
    if (c->in[0] && scan8_lengths(c)) return fm_last_status();
    stack_list per[FLOW_MAX] = {{0}};
    fm_status s = FM_OK;
    for (int64_t b = 0; b < c->in[1]->shape[0] && !s; b++) {
        fm_tensor *res[FLOW_MAX] = {0};
        s = scan8_entry(c, b, res);
        for (int k = 0; k < c->n_out; k++)
            if (!s) s = stack_push(&per[k], res[k]);
            else fm_tensor_release(res[k]);
    }
    for (int k = 0; k < c->n_out && !s; k++)
        if (!per[k].n || per[k].n > INT32_MAX) s = onnx_node_error(c, FM_ERR_INVALID, "the batch is empty");
        else if (!(c->out[k] = fm_stack((int)per[k].n, per[k].t, 0))) s = fm_last_status();
    if (s) release_all(c->out, c->n_out);
    for (int k = 0; k < c->n_out; k++) stack_free(&per[k]);
    return s;
}

const onnx_op onnx_ops_flow[] = {
    {"If", 1, 1, 1, FLOW_MAX, "then_branch,else_branch", op_if},
    {"Loop", 1, 0, FLOW_MAX + 2, FLOW_MAX, "body", op_loop}, /* M and cond may be omitted: checked by the op */
    {"Scan", 8, 0, FLOW_MAX, FLOW_MAX,
     "body,num_scan_inputs,scan_input_axes,scan_input_directions,scan_output_axes,scan_output_directions,directions",
     op_scan},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
