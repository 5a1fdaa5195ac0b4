/* Node attributes and integer-tensor inputs, read by the op functions; the op
 * table lookup. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const onnx_op *onnx_find_op(const char *name) {
    const onnx_op *lists[] = {onnx_ops_math, onnx_ops_nn, onnx_ops_shape, onnx_ops_host, onnx_ops_resize, onnx_ops_quant, onnx_ops_rnn, onnx_ops_loss, onnx_ops_misc,
                              onnx_ops_dyn, onnx_ops_signal, onnx_ops_sample, onnx_ops_attn, onnx_ops_extra, onnx_ops_flow,
                              onnx_ops_linattn, onnx_ops_more, onnx_ops_seq};
    for (size_t l = 0; l < sizeof lists / sizeof *lists; l++)
        for (const onnx_op *o = lists[l]; o->name; o++)
            if (!strcmp(o->name, name)) return o;
    return NULL;
}

const onnx_op *onnx_find_op_domain(const char *domain, const char *name) {
    if (!name) return NULL;
    if (!domain || !*domain || !strcmp(domain, "ai.onnx")) return onnx_find_op(name);
    if (strcmp(domain, "ai.onnx.preview")) return NULL;
    for (const onnx_op *o = onnx_ops_preview; o->name; o++)
        if (!strcmp(o->name, name)) return o;
    return NULL;
}

fm_status onnx_node_error(const onnx_op_ctx *c, fm_status st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fm_set_error(st, "%s", msg);
}

fm_status onnx_set_out(onnx_op_ctx *c, int i, fm_tensor *t) {
    if (!t) return fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_INTERNAL, "op returned no tensor");
    if (i >= c->n_out) {
        fm_tensor_release(t);
        return FM_OK;
    }
    c->out[i] = t;
    return FM_OK;
}

const Onnx__AttributeProto *onnx_attr(const onnx_op_ctx *c, const char *name) {
    for (size_t i = 0; i < c->node->n_attribute; i++)
        if (c->node->attribute[i]->name && !strcmp(c->node->attribute[i]->name, name)) return c->node->attribute[i];
    return NULL;
}

int64_t onnx_attr_int(const onnx_op_ctx *c, const char *name, int64_t dflt) {
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    return a && a->has_i ? a->i : dflt;
}

float onnx_attr_float(const onnx_op_ctx *c, const char *name, float dflt) {
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    return a && a->has_f ? a->f : dflt;
}

const int64_t *onnx_attr_ints(const onnx_op_ctx *c, const char *name, int *n) {
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    *n = a ? (int)(a->n_ints > 1024 ? 1024 : a->n_ints) : 0;
    return a ? a->ints : NULL;
}

const char *onnx_attr_string(const onnx_op_ctx *c, const char *name, const char *dflt, char *buf, size_t n) {
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    if (!a || !a->has_s) return dflt;
    size_t len = a->s.len < n - 1 ? a->s.len : n - 1;
    memcpy(buf, a->s.data, len);
    buf[len] = 0;
    return buf;
}

fm_status onnx_tensor_ints(const onnx_op_ctx *c, int input, int64_t *vals, int max, int *n) {
    const fm_tensor *t = input < c->n_in ? c->in[input] : NULL;
    if (!t) return onnx_node_error(c, FM_ERR_INVALID, "input %d is missing", input);
    if (t->dtype != FM_I64 && t->dtype != FM_I32)
        return onnx_node_error(c, FM_ERR_INVALID, "input %d must be int64 or int32; got %s", input, fm_dtype_name(t->dtype));
    int64_t k = fm_tensor_numel(t);
    if (t->ndim > 1 || k > max)
        return onnx_node_error(c, FM_ERR_INVALID, "input %d must be a list of at most %d integers", input, max);
    /* contiguous and same-dtype: copied exactly, never through double (INT64_MAX ends) */
    fm_tensor *ct = t->dtype == FM_I64 ? fm_contiguous((fm_tensor *)t) : fm_to_dtype((fm_tensor *)t, FM_I64);
    fm_status s = ct ? (k ? fm_tensor_copy_to_host(ct, vals, FM_I64) : FM_OK) : fm_last_status();
    fm_tensor_release(ct);
    *n = (int)k;
    return s;
}
