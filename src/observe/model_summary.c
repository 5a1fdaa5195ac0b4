/* The layer table behind `fathom summary` (torchinfo's view of a model):
 * output shape, parameters (trainable and frozen), forward FLOPs and
 * activation memory per layer, with totals.
 *
 * Shapes come from the modules' own shape inference, so the table is exactly
 * what a forward pass would produce, without running one. FLOP counts follow
 * the usual conventions: a multiply-add is 2 FLOPs (GEMM/conv: 2 * in * out
 * per output position, plus the bias), elementwise activations and dropout
 * 1 per element, normalizations 5 per element (mean, variance, normalize,
 * scale, shift), pooling kernel-size per output element; flatten is a view
 * and costs nothing. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/nn.h"
#include "fathom/observe.h"

static int64_t numel(int nd, const int64_t *s) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

typedef struct walk {
    fm_model_summary *s;
    int cap;
} walk;

static fm_layer_summary *new_row(walk *w) {
    if (w->s->n == w->cap) {
        int nc = w->cap ? w->cap * 2 : 32;
        fm_layer_summary *nl = realloc(w->s->layers, (size_t)nc * sizeof *nl);
        if (!nl) return NULL;
        w->s->layers = nl;
        w->cap = nc;
    }
    fm_layer_summary *r = &w->s->layers[w->s->n++];
    memset(r, 0, sizeof *r);
    return r;
}

static double layer_flops(fm_module *m, const fm_named_list *params, int in_nd, const int64_t *in, int out_nd, const int64_t *out) {
    int64_t n_out = numel(out_nd, out), n_in = numel(in_nd, in);
    const fm_tensor *w = NULL, *b = NULL;
    for (int i = 0; i < params->n; i++) {
        if (!strcmp(params->items[i].name, "weight")) w = params->items[i].tensor;
        if (!strcmp(params->items[i].name, "bias")) b = params->items[i].tensor;
    }
    char d[96];
    int k = 0;
    switch (fm_module_get_kind(m)) {
    case FM_MOD_LINEAR: /* weight [out, in] */
        return (w ? 2.0 * (double)w->shape[1] * (double)n_out : 0) + (b ? (double)n_out : 0);
    case FM_MOD_CONV2D: /* weight [out, in, k, k] */
        return (w ? 2.0 * (double)(w->shape[1] * w->shape[2] * w->shape[3]) * (double)n_out : 0) + (b ? (double)n_out : 0);
    case FM_MOD_BATCHNORM2D: case FM_MOD_LAYERNORM: case FM_MOD_RMSNORM: return 5.0 * (double)n_out;
    case FM_MOD_MAXPOOL2D: case FM_MOD_AVGPOOL2D: {
        const char *kp = strstr(fm_module_describe(m, d, sizeof d), " k");
        if (kp) k = atoi(kp + 2);
        return (double)k * k * (double)n_out;
    }
    case FM_MOD_RELU: case FM_MOD_GELU: case FM_MOD_SILU: case FM_MOD_TANH: case FM_MOD_SIGMOID: case FM_MOD_DROPOUT:
    case FM_MOD_MEANPOOL: /* one add per input element */
        return (double)n_in;
    default: return 0; /* embedding (a gather), flatten (a view) */
    }
}

static fm_status visit(walk *w, fm_module *m, const char *name, int depth, int *nd, int64_t *shape, size_t elt) {
    fm_layer_summary *row = new_row(w);
    if (!row) return fm_set_error(FM_ERR_OOM, "summary: out of memory");
    int idx = w->s->n - 1;
    snprintf(row->name, sizeof row->name, "%s", name);
    fm_module_describe(m, row->desc, sizeof row->desc);
    row->depth = depth;
    int nc = fm_module_num_children(m);
    if (fm_module_get_kind(m) == FM_MOD_SEQUENTIAL) {
        row->container = true;
        for (int i = 0; i < nc; i++) {
            char cn[64];
            snprintf(cn, sizeof cn, "%.40s%s%d", name, *name ? "." : "", i);
            fm_status st = visit(w, fm_module_child(m, i), cn, depth + 1, nd, shape, elt);
            if (st != FM_OK) return st;
        }
        row = &w->s->layers[idx]; /* the array may have moved */
        row->out_ndim = *nd;
        memcpy(row->out_shape, shape, sizeof(int64_t) * (size_t)*nd);
        for (int j = idx + 1; j < w->s->n; j++) {
            const fm_layer_summary *c = &w->s->layers[j];
            if (c->depth != depth + 1) continue; /* direct children carry their own subtotals */
            row->params += c->params;
            row->trainable += c->trainable;
            row->frozen += c->frozen;
            row->buffer_elems += c->buffer_elems;
            row->flops += c->flops;
            row->act_bytes += c->act_bytes;
        }
        return FM_OK;
    }
    int out_nd;
    int64_t out[FM_MAX_DIMS];
    if (fm_module_infer_shape(m, *nd, shape, &out_nd, out) != FM_OK) {
        fm_error_prefix("summary: layer %s (%s)", name, row->desc);
        return fm_last_status();
    }
    fm_named_list st;
    if (fm_module_state(m, &st) != FM_OK) return fm_last_status();
    for (int i = 0; i < st.n; i++) {
        const fm_tensor *t = st.items[i].tensor;
        int64_t n = fm_tensor_numel(t);
        if (st.items[i].is_buffer) {
            if (fm_dtype_is_float(t->dtype)) row->buffer_elems += n; /* num_batches_tracked is a counter, not state size */
            continue;
        }
        row->params += n;
        if (t->requires_grad) row->trainable += n;
        else row->frozen += n;
    }
    row->flops = layer_flops(m, &st, *nd, shape, out_nd, out);
    fm_named_list_free(&st);
    fm_module_kind k = fm_module_get_kind(m);
    row->act_bytes = k == FM_MOD_FLATTEN ? 0 : (double)numel(out_nd, out) * (double)elt;
    row->out_ndim = out_nd;
    memcpy(row->out_shape, out, sizeof(int64_t) * (size_t)out_nd);
    *nd = out_nd;
    memcpy(shape, out, sizeof(int64_t) * (size_t)out_nd);
    return FM_OK;
}

fm_status fm_model_summarize(fm_module *m, int ndim, const int64_t *in_shape, fm_model_summary *out) {
    memset(out, 0, sizeof *out);
    if (!m || ndim < 1 || ndim > FM_MAX_DIMS || !in_shape)
        return fm_set_error(FM_ERR_INVALID, "summary: needs a model and an input shape with a batch dimension");
    out->in_ndim = ndim;
    memcpy(out->in_shape, in_shape, sizeof(int64_t) * (size_t)ndim);
    /* element size of the activations: that of the weights (f32 unless converted) */
    size_t elt = 4;
    fm_named_list ps;
    if (fm_module_parameters(m, &ps) == FM_OK) {
        if (ps.n) elt = fm_dtype_size(ps.items[0].tensor->dtype);
        for (int i = 0; i < ps.n; i++) out->param_bytes += (double)fm_tensor_nbytes(ps.items[i].tensor);
        fm_named_list_free(&ps);
    }
    walk w = {out, 0};
    int nd = ndim;
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, in_shape, sizeof(int64_t) * (size_t)ndim);
    fm_status st;
    if (fm_module_get_kind(m) == FM_MOD_SEQUENTIAL) {
        /* the root container itself is the totals line, not a row */
        st = FM_OK;
        for (int i = 0; st == FM_OK && i < fm_module_num_children(m); i++) {
            char cn[16];
            snprintf(cn, sizeof cn, "%d", i);
            st = visit(&w, fm_module_child(m, i), cn, 0, &nd, shape, elt);
        }
    } else {
        st = visit(&w, m, "0", 0, &nd, shape, elt);
    }
    if (st != FM_OK) { fm_model_summary_free(out); return st; }
    for (int i = 0; i < out->n; i++) {
        const fm_layer_summary *r = &out->layers[i];
        if (r->depth != 0) continue;
        out->total_params += r->params;
        out->trainable += r->trainable;
        out->frozen += r->frozen;
        out->buffer_elems += r->buffer_elems;
        out->total_flops += r->flops;
        out->act_bytes += r->act_bytes;
    }
    /* a model that starts with an embedding takes token ids, I64 as the trainers feed them */
    fm_module *first = fm_module_get_kind(m) == FM_MOD_SEQUENTIAL && fm_module_num_children(m) > 0 ? fm_module_child(m, 0) : m;
    size_t in_elt = fm_module_get_kind(first) == FM_MOD_EMBEDDING ? fm_dtype_size(FM_I64) : elt;
    out->input_bytes = (double)numel(ndim, in_shape) * (double)in_elt;
    out->buffer_bytes = (double)out->buffer_elems * (double)elt;
    return FM_OK;
}

void fm_model_summary_free(fm_model_summary *s) {
    if (!s) return;
    free(s->layers);
    memset(s, 0, sizeof *s);
}

/* 1234567 -> "1,234,567" */
static const char *commas(int64_t v, char *buf, size_t n) {
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)(v < 0 ? -v : v));
    size_t len = strlen(t), j = 0;
    if (v < 0 && j + 1 < n) buf[j++] = '-';
    for (size_t i = 0; i < len && j + 2 < n; i++) {
        buf[j++] = t[i];
        if ((len - i - 1) % 3 == 0 && i + 1 < len) buf[j++] = ',';
    }
    buf[j] = 0;
    return buf;
}

static const char *human_flops(double f, char *buf, size_t n) {
    if (f >= 1e9) snprintf(buf, n, "%.2fG", f / 1e9);
    else if (f >= 1e6) snprintf(buf, n, "%.2fM", f / 1e6);
    else if (f >= 1e3) snprintf(buf, n, "%.2fk", f / 1e3);
    else snprintf(buf, n, "%.0f", f);
    return buf;
}

void fm_model_summary_print(const fm_model_summary *s, FILE *f) {
    char sh[96], a[32], b[32], c[32];
    /* the label column widens for deep names ("h.11.attn.qkv: linear 768->2304 (q, k, v)") */
    int lw = 40;
    for (int i = 0; i < s->n; i++) {
        const fm_layer_summary *r = &s->layers[i];
        int n = 2 * (r->depth % 16) + (int)strlen(r->name) + 2 + (int)strlen(r->desc);
        if (n > lw) lw = n < 72 ? n : 72;
    }
    char rule[192];
    int rl = lw + 68;
    memset(rule, '=', (size_t)rl);
    rule[rl] = 0;
    fprintf(f, "%s\n%-*s %-20s %12s %10s %10s %10s\n%s\n", rule, lw, "layer (index: type)", "output shape", "params", "frozen",
            "FLOPs", "act. MB", rule);
    for (int i = 0; i < s->n; i++) {
        const fm_layer_summary *r = &s->layers[i];
        char label[256];
        snprintf(label, sizeof label, "%*s%s: %s", 2 * (r->depth % 16), "", r->name, r->desc);
        const char *pstr = r->tied_params && !r->params ? "(tied)" : commas(r->params, a, sizeof a);
        fprintf(f, "%-*.*s %-20s %12s %10s %10s %10.3f\n", lw, lw, label, fm_shape_str(r->out_ndim, r->out_shape, sh, sizeof sh),
                pstr, r->frozen ? commas(r->frozen, b, sizeof b) : "-", human_flops(r->flops, c, sizeof c), r->act_bytes / 1e6);
    }
    fprintf(f, "%s\n", rule);
    fprintf(f, "Input shape: %s (batch %lld%s%s)\n", fm_shape_str(s->in_ndim, s->in_shape, sh, sizeof sh),
            (long long)s->in_shape[0], s->input_desc[0] ? ", " : "", s->input_desc);
    fprintf(f, "Total params: %s\n", commas(s->total_params, a, sizeof a));
    fprintf(f, "Trainable params: %s\n", commas(s->trainable, a, sizeof a));
    fprintf(f, "Non-trainable (frozen) params: %s\n", commas(s->frozen, a, sizeof a));
    for (int i = 0; i < s->n; i++)
        if (s->layers[i].tied_to[0])
            fprintf(f, "Tied weights: %s reuses %s (%s params, counted once)\n", s->layers[i].name, s->layers[i].tied_to,
                    commas(s->layers[i].tied_params, a, sizeof a));
    if (s->buffer_elems) fprintf(f, "Buffers (running statistics): %s values\n", commas(s->buffer_elems, a, sizeof a));
    fprintf(f, "Forward FLOPs: %s (%s per sample; a training step is about 3x)\n", human_flops(s->total_flops, a, sizeof a),
            human_flops(s->in_shape[0] > 0 ? s->total_flops / (double)s->in_shape[0] : 0, b, sizeof b));
    fprintf(f, "%s\n", rule);
    fprintf(f, "Input size (MB): %.3f\n", s->input_bytes / 1e6);
    fprintf(f, "Forward/backward pass size (MB): %.3f\n", s->act_bytes / 1e6);
    fprintf(f, "Params size (MB): %.3f\n", (s->param_bytes + s->buffer_bytes) / 1e6);
    fprintf(f, "Estimated total size (MB): %.3f\n", (s->input_bytes + s->act_bytes + s->param_bytes + s->buffer_bytes) / 1e6);
    fprintf(f, "%s\n", rule);
}

char *fm_model_summary_json(const fm_model_summary *s) {
    json_t *root = json_object(), *layers = json_array(), *in = json_array();
    if (!root || !layers || !in) { json_decref(root); json_decref(layers); json_decref(in); return NULL; }
    for (int i = 0; i < s->in_ndim; i++) json_array_append_new(in, json_integer(s->in_shape[i]));
    json_object_set_new(root, "input_shape", in);
    if (s->input_desc[0]) json_object_set_new(root, "input", json_string(s->input_desc));
    for (int i = 0; i < s->n; i++) {
        const fm_layer_summary *r = &s->layers[i];
        json_t *shape = json_array();
        for (int d = 0; d < r->out_ndim; d++) json_array_append_new(shape, json_integer(r->out_shape[d]));
        json_array_append_new(layers, json_pack("{s:s,s:s,s:i,s:o,s:I,s:I,s:I,s:f,s:f}", "name", r->name, "type", r->desc, "depth",
                                                r->depth, "output_shape", shape, "params", (json_int_t)r->params, "trainable",
                                                (json_int_t)r->trainable, "frozen", (json_int_t)r->frozen, "flops", r->flops,
                                                "activation_bytes", r->act_bytes));
        if (r->tied_to[0]) {
            json_t *row = json_array_get(layers, json_array_size(layers) - 1);
            json_object_set_new(row, "tied_to", json_string(r->tied_to));
            json_object_set_new(row, "tied_params", json_integer(r->tied_params));
        }
    }
    json_object_set_new(root, "layers", layers);
    json_object_set_new(root, "total_params", json_integer(s->total_params));
    json_object_set_new(root, "trainable_params", json_integer(s->trainable));
    json_object_set_new(root, "frozen_params", json_integer(s->frozen));
    json_object_set_new(root, "tied_params", json_integer(s->tied_params));
    json_object_set_new(root, "buffer_values", json_integer(s->buffer_elems));
    json_object_set_new(root, "forward_flops", json_real(s->total_flops));
    json_object_set_new(root, "input_bytes", json_real(s->input_bytes));
    json_object_set_new(root, "activation_bytes", json_real(s->act_bytes));
    json_object_set_new(root, "param_bytes", json_real(s->param_bytes + s->buffer_bytes));
    char *txt = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return txt;
}
