/* Runs a loaded model: the nodes in file order (ONNX requires a topological
 * order, checked at load), each value released after its last reader. The model
 * runs on its inputs' device: on one that is not the CPU the initializers are copied
 * there once (kept with the model for later runs) and every value an op makes on the
 * host (Shape, Constant, the host-computed ops' results) is moved there, so each op
 * sees its inputs on one device and the outputs come back on the inputs' device.
 *
 * Sequences and optionals (onnx_value) live in a second slot array beside the tensors',
 * allocated only for a model that can make one; a node sees them only when its op takes
 * them (onnx_node.values), any other is refused naming the input. fm_onnx_run takes and
 * gives tensors only; onnx_execute_values feeds and returns the other values too. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"

/* What one run takes and gives: n inputs by name (names NULL: in declaration order), input i
 * the tensor in[i] or, where that is NULL, the sequence or optional xin[i] (in or xin may be
 * NULL: none of that kind); output i into out[i] or, for such a value, xout[i] (NULL: the
 * caller takes tensors only). */
typedef struct {
    int n;
    const char *const *names;
    fm_tensor *const *in;
    onnx_value *const *xin;
    fm_tensor **out;
    onnx_value **xout;
} run_io;

static const char *kind_what(onnx_kind k) { return k == ONNX_SEQ ? "a sequence" : k == ONNX_OPT ? "an optional" : "a tensor"; }

/* A sequence or optional given for input in: of the declared kind (an optional input takes
 * its element too), its tensors of the declared element type. */
static fm_status check_value_input(const fm_onnx_model *m, const onnx_input *in, const fm_tensor *t, const onnx_value *v) {
    const char *name = m->value_names[in->slot];
    if (in->kind == ONNX_TENSOR && v)
        return fm_set_error(FM_ERR_INVALID, "%s: input '%s' is a tensor; %s was given", m->path, name, onnx_value_what(v));
    if (in->kind == ONNX_SEQ && !(v && v->kind == ONNX_SEQ))
        return fm_set_error(FM_ERR_INVALID, "%s: input '%s' is a sequence; %s was given", m->path, name,
                            v ? onnx_value_what(v) : "a tensor");
    fm_dtype want;
    if (!in->item_type || !onnx_dtype_to_fm(in->item_type, &want)) return FM_OK;
    const onnx_value *s = v && v->kind == ONNX_OPT ? v->v : v;
    const fm_tensor *e = v && v->kind == ONNX_OPT ? v->t : t;
    if ((e && e->dtype != want) || (s && s->typed && s->n && s->dtype != want))
        return fm_set_error(FM_ERR_INVALID, "%s: input '%s' holds tensors of %s; got %s", m->path, name, fm_dtype_name(want),
                            fm_dtype_name(e ? e->dtype : s->dtype));
    return FM_OK;
}

static fm_status check_input(const fm_onnx_model *m, const onnx_input *in, const fm_tensor *t, const onnx_value *v) {
    const char *name = m->value_names[in->slot];
    if (!t && !v) return fm_set_error(FM_ERR_INVALID, "%s: input '%s' is NULL", m->path, name);
    if (v || in->kind != ONNX_TENSOR) return check_value_input(m, in, t, v);
    fm_dtype want;
    if (in->elem_type && onnx_dtype_to_fm(in->elem_type, &want) && want != t->dtype)
        return fm_set_error(FM_ERR_INVALID, "%s: input '%s' must be %s; got %s", m->path, name, fm_dtype_name(want),
                            fm_dtype_name(t->dtype));
    if (in->ndim >= 0 && in->ndim != t->ndim)
        return fm_set_error(FM_ERR_INVALID, "%s: input '%s' must have %d dimensions; got %d", m->path, name, in->ndim, t->ndim);
    for (int d = 0; d < in->ndim; d++)
        if (in->dims[d] >= 0 && in->dims[d] != t->shape[d])
            return fm_set_error(FM_ERR_INVALID, "%s: input '%s' dimension %d must be %" PRId64 "; got %" PRId64, m->path, name, d,
                                in->dims[d], t->shape[d]);
    return FM_OK;
}

/* The index of the model input names[i] names (an error listing the inputs when none). */
static fm_status input_index(const fm_onnx_model *m, const char *name, int *k) {
    for (*k = 0; *k < m->n_inputs; (*k)++)
        if (name && !strcmp(name, m->value_names[m->inputs[*k].slot])) return FM_OK;
    char list[512] = "";
    for (int j = 0; j < m->n_inputs; j++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", j ? ", " : "", m->value_names[m->inputs[j].slot]);
    return fm_set_error(FM_ERR_INVALID, "%s: the model has no input '%s' (its inputs: %s)", m->path, name ? name : "(null)", list);
}

static fm_status bind_inputs(const fm_onnx_model *m, const run_io *io, fm_tensor **vals, onnx_value **xv) {
    if (!io->names && io->n != m->n_inputs)
        return fm_set_error(FM_ERR_INVALID, "%s: the model takes %d inputs; %d given", m->path, m->n_inputs, io->n);
    for (int i = 0; i < io->n; i++) {
        int k = i;
        if (io->names && input_index(m, io->names[i], &k)) return fm_last_status();
        fm_tensor *t = io->in ? io->in[i] : NULL;
        onnx_value *v = !t && io->xin ? io->xin[i] : NULL;
        if (check_input(m, &m->inputs[k], t, v)) return fm_last_status();
        int s = m->inputs[k].slot;
        if (vals[s] || (xv && xv[s])) return fm_set_error(FM_ERR_INVALID, "%s: input '%s' given twice", m->path, m->value_names[s]);
        if (v && !xv) return fm_set_error(FM_ERR_INTERNAL, "%s: no slots for the value of input '%s'", m->path, m->value_names[s]);
        if (t) vals[s] = fm_tensor_retain(t);
        else xv[s] = onnx_value_retain(v);
    }
    for (int k = 0; k < m->n_inputs; k++) {
        int s = m->inputs[k].slot;
        if (!vals[s] && !(xv && xv[s])) return fm_set_error(FM_ERR_INVALID, "%s: input '%s' is not given", m->path, m->value_names[s]);
    }
    return FM_OK;
}

static bool same_dev(fm_device a, fm_device b) { return a.type == b.type && a.index == b.index; }

/* The device of the inputs (all on one; a sequence's or optional's: its tensors'), the CPU
 * when there are none. */
static fm_status run_device(const fm_onnx_model *m, const run_io *io, fm_device *dev) {
    *dev = FM_CPU;
    int first = -1;
    for (int i = 0; i < io->n; i++) {
        fm_device d;
        const fm_tensor *t = io->in ? io->in[i] : NULL;
        if (t) d = t->storage->device;
        else if (!io->xin || !onnx_value_device(io->xin[i], &d)) continue; /* bind_inputs names a missing one */
        if (first < 0) {
            first = i;
            *dev = d;
        } else if (!same_dev(d, *dev)) {
            char a[32], b[32];
            const char *ni = io->names ? io->names[i] : fm_onnx_input_name(m, i);
            const char *nf = io->names ? io->names[first] : fm_onnx_input_name(m, first);
            return fm_set_error(FM_ERR_INVALID, "%s: input '%s' is on %s but '%s' is on %s: give every input on one device",
                                m->path, ni ? ni : "?", fm_device_name(d, a, sizeof a), nf ? nf : "?",
                                fm_device_name(*dev, b, sizeof b));
        }
    }
    return FM_OK;
}

/* The initializers on dev: copied there by the first run on it, then reused. */
static fm_status constants_on(fm_onnx_model *m, fm_device dev, fm_tensor ***out) {
    *out = m->constants;
    if (dev.type == FM_DEV_CPU) return FM_OK;
    if (m->dev_constants && same_dev(m->dev_of, dev)) {
        *out = m->dev_constants;
        return FM_OK;
    }
    fm_tensor **c = calloc((size_t)m->n_values + 1, sizeof *c);
    if (!c) return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    for (int s = 0; s < m->n_values; s++)
        if (m->constants[s] && !(c[s] = fm_tensor_to(m->constants[s], dev))) {
            fm_error_prefix("%s: initializer '%s' to the inputs' device", m->path, m->value_names[s]);
            for (int k = 0; k < s; k++) fm_tensor_release(c[k]);
            free(c);
            return fm_last_status();
        }
    for (int s = 0; m->dev_constants && s < m->n_values; s++) fm_tensor_release(m->dev_constants[s]);
    free(m->dev_constants);
    m->dev_constants = c;
    m->dev_of = dev;
    *out = c;
    return FM_OK;
}

/* Node i's inputs from the slots: a tensor in in[k], a sequence or optional in xin[k] (for
 * a node whose op takes them; any other is refused naming the input). */
static fm_status node_inputs(const fm_onnx_model *m, int i, fm_tensor **vals, onnx_value **xv, fm_tensor **in, onnx_value **xin) {
    const onnx_node *n = &m->nodes[i];
    const char *nn = n->proto->name ? n->proto->name : "";
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] < 0 || (in[k] = vals[n->in[k]])) continue;
        onnx_value *v = xv ? xv[n->in[k]] : NULL;
        if (!v)
            return fm_set_error(FM_ERR_INVALID, "%s: node %d '%s' (%s): input '%s' was not computed (an optional output that "
                                "its producer does not give)", m->path, i, nn, n->proto->op_type, m->value_names[n->in[k]]);
        if (!n->values)
            return fm_set_error(FM_ERR_INVALID, "%s: node %d '%s' (%s): input '%s' is %s; %s takes tensors", m->path, i, nn,
                                n->proto->op_type, m->value_names[n->in[k]], onnx_value_what(v), n->proto->op_type);
        xin[k] = v;
    }
    return FM_OK;
}

/* The sequences and optionals node i gave, into their slots (released on an error). */
static fm_status store_values(const fm_onnx_model *m, int i, fm_tensor **vals, onnx_value **xv, onnx_value **xout) {
    const onnx_node *n = &m->nodes[i];
    fm_status st = FM_OK;
    for (int k = 0; k < n->n_out; k++) {
        if (!xout[k]) continue;
        if (!st && n->out[k] >= 0 && (!xv || vals[n->out[k]]))
            st = fm_set_error(FM_ERR_INTERNAL, "%s: node %d (%s): output %d has no slot for a sequence or optional", m->path, i,
                              n->proto->op_type, k);
        if (st || n->out[k] < 0) onnx_value_release(xout[k]);
        else xv[n->out[k]] = xout[k];
    }
    return st;
}

/* Host-made outputs to dev (false, with the error set and every output released, on failure). */
static fm_status outputs_to(const fm_onnx_model *m, int i, fm_tensor **out, fm_device dev) {
    const onnx_node *n = &m->nodes[i];
    for (int k = 0; k < n->n_out; k++) {
        if (!out[k] || n->out[k] < 0 || same_dev(out[k]->storage->device, dev)) continue;
        fm_tensor *d = fm_tensor_to(out[k], dev); /* made on the host */
        fm_tensor_release(out[k]);
        if (!(out[k] = d)) {
            for (int j = 0; j < n->n_out; j++) fm_tensor_release(out[j]);
            fm_error_prefix("%s: node %d '%s' (%s): output %d to the inputs' device", m->path, i,
                            n->proto->name ? n->proto->name : "", n->proto->op_type, k);
            return fm_last_status();
        }
    }
    return FM_OK;
}

static fm_status run_node(const fm_onnx_model *m, int i, fm_tensor **vals, onnx_value **xv, fm_device dev) {
    const onnx_node *n = &m->nodes[i];
    fm_tensor *in[64] = {0}, *out[16] = {0};
    onnx_value *xin[64], *xout[16];
    if (n->n_in > 64 || n->n_out > 16)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: node %d has too many inputs or outputs", m->path, i);
    if (n->values) { /* only the nodes that may see sequences and optionals pay for them */
        for (int k = 0; k < n->n_in; k++) xin[k] = NULL;
        for (int k = 0; k < n->n_out; k++) xout[k] = NULL;
    }
    if (node_inputs(m, i, vals, xv, in, xin)) return fm_last_status();
    onnx_op_ctx c = {.model = m, .node = n->proto, .opset = m->opset, .n_in = n->n_in, .n_out = n->n_out, .in = in, .out = out,
                     .scope = vals, .dev = dev, .subs = n->subs, .xin = n->values ? xin : NULL, .xout = n->values ? xout : NULL,
                     .xscope = xv};
    fm_clear_error();
    fm_status s;
    if (n->values && n->n_in == 1 && xin[0] && !strcmp(n->op->name, "Identity")) /* Identity passes any value on */
        xout[0] = onnx_value_retain(xin[0]), s = FM_OK;
    else s = n->op->fn(&c);
    if (s) {
        for (int k = 0; k < n->n_out; k++) {
            fm_tensor_release(out[k]);
            if (n->values) onnx_value_release(xout[k]);
        }
        if (!strstr(fm_last_error(), m->path))
            fm_error_prefix("%s: node %d '%s' (%s)", m->path, i, n->proto->name ? n->proto->name : "", n->proto->op_type);
        return s;
    }
    if (outputs_to(m, i, out, dev)) {
        for (int k = 0; n->values && k < n->n_out; k++) onnx_value_release(xout[k]);
        return fm_last_status();
    }
    for (int k = 0; k < n->n_out; k++) {
        if (n->out[k] >= 0) vals[n->out[k]] = out[k];
        else fm_tensor_release(out[k]);
    }
    return n->values ? store_values(m, i, vals, xv, xout) : FM_OK;
}

fm_status fm_onnx_run(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                      fm_tensor **outputs) {
    return onnx_execute(m, n_inputs, names, inputs, outputs, NULL);
}

/* The values it captures from the graph around it (outer, xouter), into vals and xv. */
static fm_status bind_captures(fm_onnx_model *m, fm_tensor **vals, onnx_value **xv, fm_tensor *const *outer, onnx_value *const *xouter) {
    for (int k = 0; k < m->n_cap; k++) {
        fm_tensor *t = outer ? outer[m->cap_outer[k]] : NULL;
        onnx_value *v = !t && xouter && xv ? xouter[m->cap_outer[k]] : NULL;
        if (!t && !v) /* the enclosing graph released or never computed it */
            return fm_set_error(FM_ERR_INVALID, "%s: value '%s' of the enclosing graph is not available", m->path,
                                m->value_names[m->cap_local[k]]);
        if (t) vals[m->cap_local[k]] = fm_tensor_retain(t);
        else xv[m->cap_local[k]] = onnx_value_retain(v);
    }
    return FM_OK;
}

/* The graph's outputs into io (a sequence or optional into xout; refused when it is NULL). */
static fm_status take_outputs(fm_onnx_model *m, fm_tensor **vals, onnx_value **xv, const run_io *io) {
    for (int i = 0; i < m->n_outputs; i++) {
        const int s = m->outputs[i];
        onnx_value *v = xv ? xv[s] : NULL;
        if (vals[s]) io->out[i] = fm_tensor_retain(vals[s]);
        else if (v && io->xout) io->xout[i] = onnx_value_retain(v);
        else if (v)
            return fm_set_error(FM_ERR_UNSUPPORTED, "%s: output '%s' is %s, not a tensor (%s)", m->path, m->value_names[s],
                                onnx_value_what(v),
                                m->root == m ? "fm_onnx_run gives tensors only" : "the node takes tensors from this graph");
        else return fm_set_error(FM_ERR_INVALID, "%s: output '%s' was not computed", m->path, m->value_names[s]);
    }
    return FM_OK;
}

/* Whether a run of m needs the slots of sequences and optionals. */
static bool needs_values(const fm_onnx_model *m, const run_io *io, onnx_value *const *xouter) {
    bool need = (m->root ? m->root : m)->has_values || xouter;
    for (int i = 0; !need && io->xin && i < io->n; i++) need = io->xin[i] != NULL;
    return need;
}

/* Runs m on dev: its inputs bound (by name, or in order when names is NULL), the values it
 * captures from the graph around it taken from outer and xouter. */
static fm_status execute_on(fm_onnx_model *m, fm_device dev, const run_io *io, fm_tensor **keep, fm_tensor *const *outer,
                            onnx_value *const *xouter) {
    fm_tensor **consts = NULL;
    if (constants_on(m, dev, &consts)) return fm_last_status();
    const bool need = needs_values(m, io, xouter);
    fm_tensor **vals = calloc((size_t)m->n_values + 1, sizeof *vals);
    onnx_value **xv = need ? calloc((size_t)m->n_values + 1, sizeof *xv) : NULL;
    if (!vals || (need && !xv)) {
        free(xv);
        free(vals);
        return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    }
    for (int s = 0; s < m->n_values; s++)
        if (consts[s]) vals[s] = fm_tensor_retain(consts[s]);
    fm_status st = bind_captures(m, vals, xv, outer, xouter);
    bool prev = fm_set_grad_enabled(false);
    if (!st) st = bind_inputs(m, io, vals, xv);
    if (keep && !st)
        for (int s = 0; s < m->n_values; s++) keep[s] = vals[s] ? fm_tensor_retain(vals[s]) : NULL;
    for (int i = 0; !st && i < m->n_nodes; i++) {
        st = run_node(m, i, vals, xv, dev);
        for (int k = 0; keep && !st && k < m->nodes[i].n_out; k++)
            if (m->nodes[i].out[k] >= 0) keep[m->nodes[i].out[k]] = fm_tensor_retain(vals[m->nodes[i].out[k]]);
        const onnx_node *n = &m->nodes[i];
        for (int k = 0; !st && k < n->n_in + n->n_imp; k++) {
            int s = k < n->n_in ? n->in[k] : n->imp[k - n->n_in];
            if (s >= 0 && m->last_use[s] == i) {
                fm_tensor_release(vals[s]);
                vals[s] = NULL;
                if (xv) onnx_value_release(xv[s]), xv[s] = NULL;
            }
        }
    }
    if (!st) st = take_outputs(m, vals, xv, io);
    if (st)
        for (int i = 0; i < m->n_outputs; i++) {
            fm_tensor_release(io->out[i]);
            io->out[i] = NULL;
            if (io->xout) onnx_value_release(io->xout[i]), io->xout[i] = NULL;
        }
    for (int s = 0; s < m->n_values; s++) {
        fm_tensor_release(vals[s]);
        if (xv) onnx_value_release(xv[s]);
    }
    free(vals);
    free(xv);
    fm_set_grad_enabled(prev);
    return st;
}

static fm_status execute(fm_onnx_model *m, run_io *io, fm_tensor **keep) {
    if (!m || !io->out || (io->n && !io->in && !io->xin) || io->n < 0)
        return fm_set_error(FM_ERR_INVALID, "fm_onnx_run: NULL model, inputs or outputs");
    for (int i = 0; i < m->n_outputs; i++) {
        io->out[i] = NULL;
        if (io->xout) io->xout[i] = NULL;
    }
    fm_device dev;
    if (run_device(m, io, &dev)) return fm_last_status();
    return execute_on(m, dev, io, keep, NULL, NULL);
}

fm_status onnx_execute(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                       fm_tensor **outputs, fm_tensor **keep) {
    for (int i = 0; m && outputs && i < m->n_outputs; i++) outputs[i] = NULL;
    for (int i = 0; m && i < m->n_inputs + m->n_outputs; i++) { /* refused before anything runs */
        const bool is_in = i < m->n_inputs;
        const onnx_input *d = is_in ? &m->inputs[i] : &m->out_decl[i - m->n_inputs];
        if (d->kind != ONNX_TENSOR)
            return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s '%s' is %s; fm_onnx_run (and `fathom run`) take and give tensors only",
                                m->path, is_in ? "input" : "output", m->value_names[d->slot], kind_what(d->kind));
    }
    run_io io = {.n = n_inputs, .names = names, .in = inputs, .out = outputs};
    return execute(m, &io, keep);
}

fm_status onnx_execute_values(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                              onnx_value *const *xinputs, fm_tensor **outputs, onnx_value **xoutputs) {
    run_io io = {.n = n_inputs, .names = names, .in = inputs, .xin = xinputs, .out = outputs, .xout = xoutputs};
    return execute(m, &io, NULL);
}

fm_onnx_model *onnx_subgraph(const onnx_op_ctx *c, const char *attr) {
    for (size_t a = 0; c->subs && a < c->node->n_attribute; a++)
        if (c->subs[a] && c->node->attribute[a]->name && !strcmp(c->node->attribute[a]->name, attr)) return c->subs[a];
    return NULL;
}

fm_status onnx_run_subgraph_values(const onnx_op_ctx *c, fm_onnx_model *sub, int n_in, fm_tensor *const *in,
                                   onnx_value *const *xin, fm_tensor **out, onnx_value **xout) {
    for (int i = 0; i < sub->n_outputs; i++) {
        out[i] = NULL;
        if (xout) xout[i] = NULL;
    }
    if (n_in != sub->n_inputs)
        return fm_set_error(FM_ERR_INVALID, "%s: the graph declares %d inputs; the op gives it %d", sub->path, sub->n_inputs, n_in);
    run_io io = {.n = n_in, .in = in, .xin = xin, .out = out, .xout = xout};
    return execute_on(sub, c->dev, &io, NULL, c->scope, c->xscope);
}

fm_status onnx_run_subgraph(const onnx_op_ctx *c, fm_onnx_model *sub, int n_in, fm_tensor *const *in, fm_tensor **out) {
    return onnx_run_subgraph_values(c, sub, n_in, in, NULL, out, NULL);
}
