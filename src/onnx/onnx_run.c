/* Runs a loaded model: the nodes in file order (ONNX requires a topological
 * order, checked at load), each value released after its last reader. The model
 * runs on its inputs' device: on one that is not the CPU the initializers are copied
 * there once (kept with the model for later runs) and every value an op makes on the
 * host (Shape, Constant, the host-computed ops' results) is moved there, so each op
 * sees its inputs on one device and the outputs come back on the inputs' device. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"

static fm_status check_input(const fm_onnx_model *m, const onnx_input *in, const fm_tensor *t) {
    const char *name = m->value_names[in->slot];
    if (!t) return fm_set_error(FM_ERR_INVALID, "%s: input '%s' is NULL", m->path, name);
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

static fm_status bind_inputs(const fm_onnx_model *m, int n, const char *const *names, fm_tensor *const *inputs,
                             fm_tensor **vals) {
    if (!names && n != m->n_inputs)
        return fm_set_error(FM_ERR_INVALID, "%s: the model takes %d inputs; %d given", m->path, m->n_inputs, n);
    for (int i = 0; i < n; i++) {
        int k = i;
        if (names) {
            for (k = 0; k < m->n_inputs; k++)
                if (names[i] && !strcmp(names[i], m->value_names[m->inputs[k].slot])) break;
            if (k == m->n_inputs) {
                char list[512] = "";
                for (int j = 0; j < m->n_inputs; j++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", j ? ", " : "",
                             m->value_names[m->inputs[j].slot]);
                return fm_set_error(FM_ERR_INVALID, "%s: the model has no input '%s' (its inputs: %s)", m->path,
                                    names[i] ? names[i] : "(null)", list);
            }
        }
        if (check_input(m, &m->inputs[k], inputs[i])) return fm_last_status();
        int s = m->inputs[k].slot;
        if (vals[s]) return fm_set_error(FM_ERR_INVALID, "%s: input '%s' given twice", m->path, m->value_names[s]);
        vals[s] = fm_tensor_retain(inputs[i]);
    }
    for (int k = 0; k < m->n_inputs; k++)
        if (!vals[m->inputs[k].slot])
            return fm_set_error(FM_ERR_INVALID, "%s: input '%s' is not given", m->path, m->value_names[m->inputs[k].slot]);
    return FM_OK;
}

static bool same_dev(fm_device a, fm_device b) { return a.type == b.type && a.index == b.index; }

/* The device of the inputs (all on one), the CPU when there are none. */
static fm_status run_device(const fm_onnx_model *m, int n, const char *const *names, fm_tensor *const *inputs,
                            fm_device *dev) {
    *dev = FM_CPU;
    int first = -1;
    for (int i = 0; i < n; i++) {
        if (!inputs[i]) continue; /* bind_inputs names it */
        fm_device d = inputs[i]->storage->device;
        if (first < 0) {
            first = i;
            *dev = d;
        } else if (!same_dev(d, *dev)) {
            char a[32], b[32];
            const char *ni = names ? names[i] : fm_onnx_input_name(m, i), *nf = names ? names[first] : fm_onnx_input_name(m, first);
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

static fm_status run_node(const fm_onnx_model *m, int i, fm_tensor **vals, fm_device dev) {
    const onnx_node *n = &m->nodes[i];
    fm_tensor *in[64] = {0}, *out[16] = {0};
    if (n->n_in > 64 || n->n_out > 16)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: node %d has too many inputs or outputs", m->path, i);
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] < 0) continue;
        in[k] = vals[n->in[k]];
        if (!in[k])
            return fm_set_error(FM_ERR_INVALID, "%s: node %d '%s' (%s): input '%s' was not computed (an optional output that "
                                "its producer does not give)", m->path, i, n->proto->name ? n->proto->name : "",
                                n->proto->op_type, m->value_names[n->in[k]]);
    }
    onnx_op_ctx c = {.model = m, .node = n->proto, .opset = m->opset, .n_in = n->n_in, .n_out = n->n_out, .in = in, .out = out,
                     .scope = vals, .dev = dev, .subs = n->subs};
    fm_clear_error();
    fm_status s = n->op->fn(&c);
    if (s) {
        for (int k = 0; k < n->n_out; k++) fm_tensor_release(out[k]);
        if (!strstr(fm_last_error(), m->path))
            fm_error_prefix("%s: node %d '%s' (%s)", m->path, i, n->proto->name ? n->proto->name : "", n->proto->op_type);
        return s;
    }
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
    for (int k = 0; k < n->n_out; k++) {
        if (n->out[k] >= 0) vals[n->out[k]] = out[k];
        else fm_tensor_release(out[k]);
    }
    return FM_OK;
}

fm_status fm_onnx_run(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                      fm_tensor **outputs) {
    return onnx_execute(m, n_inputs, names, inputs, outputs, NULL);
}

/* Runs m on dev: its inputs bound (by name, or in order when names is NULL), the values it
 * captures from the graph around it taken from outer. */
static fm_status execute_on(fm_onnx_model *m, fm_device dev, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                            fm_tensor **outputs, fm_tensor **keep, fm_tensor *const *outer) {
    fm_tensor **consts = NULL;
    if (constants_on(m, dev, &consts)) return fm_last_status();
    fm_tensor **vals = calloc((size_t)m->n_values + 1, sizeof *vals);
    if (!vals) return fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path);
    for (int s = 0; s < m->n_values; s++)
        if (consts[s]) vals[s] = fm_tensor_retain(consts[s]);
    fm_status st = FM_OK;
    for (int k = 0; k < m->n_cap; k++) {
        fm_tensor *t = outer ? outer[m->cap_outer[k]] : NULL;
        if (!t) { /* the enclosing graph released or never computed it */
            st = fm_set_error(FM_ERR_INVALID, "%s: value '%s' of the enclosing graph is not available", m->path,
                              m->value_names[m->cap_local[k]]);
            break;
        }
        vals[m->cap_local[k]] = fm_tensor_retain(t);
    }
    bool prev = fm_set_grad_enabled(false);
    if (!st) st = bind_inputs(m, n_inputs, names, inputs, vals);
    if (keep && !st)
        for (int s = 0; s < m->n_values; s++) keep[s] = vals[s] ? fm_tensor_retain(vals[s]) : NULL;
    for (int i = 0; !st && i < m->n_nodes; i++) {
        st = run_node(m, i, vals, dev);
        for (int k = 0; keep && !st && k < m->nodes[i].n_out; k++)
            if (m->nodes[i].out[k] >= 0) keep[m->nodes[i].out[k]] = fm_tensor_retain(vals[m->nodes[i].out[k]]);
        const onnx_node *n = &m->nodes[i];
        for (int k = 0; !st && k < n->n_in + n->n_imp; k++) {
            int s = k < n->n_in ? n->in[k] : n->imp[k - n->n_in];
            if (s >= 0 && m->last_use[s] == i) {
                fm_tensor_release(vals[s]);
                vals[s] = NULL;
            }
        }
    }
    for (int i = 0; !st && i < m->n_outputs; i++) {
        if (!vals[m->outputs[i]])
            st = fm_set_error(FM_ERR_INVALID, "%s: output '%s' was not computed", m->path, m->value_names[m->outputs[i]]);
        else outputs[i] = fm_tensor_retain(vals[m->outputs[i]]);
    }
    if (st)
        for (int i = 0; i < m->n_outputs; i++) {
            fm_tensor_release(outputs[i]);
            outputs[i] = NULL;
        }
    for (int s = 0; s < m->n_values; s++) fm_tensor_release(vals[s]);
    free(vals);
    fm_set_grad_enabled(prev);
    return st;
}

fm_status onnx_execute(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                       fm_tensor **outputs, fm_tensor **keep) {
    if (!m || !outputs || (n_inputs && !inputs) || n_inputs < 0)
        return fm_set_error(FM_ERR_INVALID, "fm_onnx_run: NULL model, inputs or outputs");
    for (int i = 0; i < m->n_outputs; i++) outputs[i] = NULL;
    fm_device dev;
    if (run_device(m, n_inputs, names, inputs, &dev)) return fm_last_status();
    return execute_on(m, dev, n_inputs, names, inputs, outputs, keep, NULL);
}

fm_onnx_model *onnx_subgraph(const onnx_op_ctx *c, const char *attr) {
    for (size_t a = 0; c->subs && a < c->node->n_attribute; a++)
        if (c->subs[a] && c->node->attribute[a]->name && !strcmp(c->node->attribute[a]->name, attr)) return c->subs[a];
    return NULL;
}

fm_status onnx_run_subgraph(const onnx_op_ctx *c, fm_onnx_model *sub, int n_in, fm_tensor *const *in, fm_tensor **out) {
    for (int i = 0; i < sub->n_outputs; i++) out[i] = NULL;
    if (n_in != sub->n_inputs)
        return fm_set_error(FM_ERR_INVALID, "%s: the graph declares %d inputs; the op gives it %d", sub->path, sub->n_inputs, n_in);
    return execute_on(sub, c->dev, n_in, NULL, in, out, NULL, c->scope);
}
