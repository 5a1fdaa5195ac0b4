/* `fathom plan --model MODEL.onnx|GRAPH_DIR`: the memory and work of one inference of an
 * inference graph, from fathom's own graph runner run on the meta device (plan_step.c's
 * plan_step_graph), as the recipes' training runs are planned. An ONNX file is imported
 * as `fathom import` does (the --dim sizes fixed first, as `fathom import --dim`); the
 * dynamic dims left take --batch and the other --dim sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "fathom/graph.h"
#include "fathom/onnx.h"
#include "fathom/plan.h"
#include "graph/graph_internal.h" /* the constants' sizes */
#include "plan/plan_internal.h"
#include "plan/plan_step.h"

void fm_plan_graph_defaults(fm_plan_graph_opts *o) {
    memset(o, 0, sizeof *o);
    o->batch = 1;
    o->device = (fm_device){FM_DEV_META, 0};
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

int fm_plan_is_graph_model(const char *model) {
    struct stat st;
    if (!model || stat(model, &st)) return 0;
    return S_ISREG(st.st_mode) ? ends_with(model, ".onnx") : S_ISDIR(st.st_mode) && fm_graph_dir_is_graph(model);
}

/* The graph of `model`, the --dim sizes fixed in an ONNX file before its import; *used[k]
 * says which --dim was a dim of the file. */
static fm_graph *load(const char *model, const fm_plan_graph_opts *o, fm_plan_graph_run *out, bool *used) {
    if (!ends_with(model, ".onnx")) {
        snprintf(out->kind, sizeof out->kind, "graph");
        return fm_graph_load(model);
    }
    snprintf(out->kind, sizeof out->kind, "onnx");
    fm_onnx_model *m = fm_onnx_load(model);
    for (int k = 0; m && k < o->n_dims; k++) {
        fm_status st = fm_onnx_set_dim(m, o->dim_names[k], o->dim_values[k]);
        if (st == FM_OK) used[k] = true;
        else if (st != FM_ERR_INVALID || !strstr(fm_last_error(), "no dynamic input dim")) { fm_onnx_free(m); return NULL; }
        fm_clear_error();
    }
    fm_graph *g = m ? fm_onnx_to_graph(m) : NULL;
    fm_onnx_free(m);
    return g;
}

/* The dynamic dims' names (for messages), comma-separated into buf. */
static void dim_names(const fm_graph *g, char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < g->n_syms; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s", i ? ", " : "", g->syms[i].name);
    }
}

/* The name of the batch dim: "batch" when a dim has it, else input 0's dim 0 when dynamic. */
static const char *batch_name(const fm_graph *g) {
    for (int i = 0; i < g->n_syms; i++)
        if (!strcmp(g->syms[i].name, "batch")) return "batch";
    fm_graph_io io;
    if (fm_graph_num_inputs(g) > 0 && fm_graph_input_info(g, 0, &io) == FM_OK && io.ndim > 0 && io.dim_names[0]) return io.dim_names[0];
    return NULL;
}

/* Every input's shape: its fixed dims, the batch dim o->batch, the others their --dim. */
static fm_status input_shapes(const fm_graph *g, const fm_plan_graph_opts *o, const bool *used, int64_t (*shapes)[FM_MAX_DIMS],
                              fm_plan_graph_run *out) {
    const char *bn = batch_name(g);
    char names[256];
    dim_names(g, names, sizeof names);
    for (int k = 0; k < o->n_dims; k++) {
        bool found = used[k];
        for (int i = 0; i < g->n_syms && !found; i++) found = !strcmp(g->syms[i].name, o->dim_names[k]);
        if (!found) return fm_set_error(FM_ERR_INVALID, "--dim %s: the model has no dynamic dim of that name (its dynamic dims: %s)",
                                        o->dim_names[k], names[0] ? names : "none");
    }
    out->inputs[0] = 0;
    for (int i = 0; i < fm_graph_num_inputs(g); i++) {
        fm_graph_io io;
        if (fm_graph_input_info(g, i, &io)) return fm_last_status();
        for (int d = 0; d < io.ndim; d++) {
            shapes[i][d] = io.shape[d];
            if (io.shape[d] != FM_DIM_DYNAMIC) continue;
            const char *nm = io.dim_names[d] ? io.dim_names[d] : "?";
            int k = 0;
            while (k < o->n_dims && strcmp(o->dim_names[k], nm)) k++;
            if (k < o->n_dims) shapes[i][d] = o->dim_values[k];
            else if (bn && !strcmp(nm, bn)) shapes[i][d] = o->batch;
            else return fm_set_error(FM_ERR_INVALID, "input '%s': dim %d ('%s') is dynamic; give its size with --dim %s=N", io.name, d, nm, nm);
        }
        char sh[128];
        size_t l = strlen(out->inputs);
        snprintf(out->inputs + l, sizeof out->inputs - l, "%s%s %s %s", i ? ", " : "", io.name, fm_dtype_name(io.dtype),
                 fm_shape_str(io.ndim, shapes[i], sh, sizeof sh));
    }
    return FM_OK;
}

/* The weights a quantized node stands for, counted as the fp32 model's (int8 panels' padding
 * and int4's two codes a byte undone), with its weight and scale constants marked in aux so
 * they are not counted again; 0 for other nodes. */
static int64_t quantized_weights(const fm_graph *g, const gnode *n, bool *aux) {
    const char *op = n->op;
    const bool q8 = !strcmp(op, "qlinear_int8") || !strcmp(op, "qconv2d_int8"), q4 = !strcmp(op, "qlinear_int4") || !strcmp(op, "qembedding_int4");
    const bool e8 = !strcmp(op, "qembedding_int8");
    if (!q8 && !q4 && !e8) return 0;
    const int skip_bias = q8 ? 3 : -1; /* qlinear_int8/qconv2d_int8's input 3 is a float bias: a parameter */
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] >= 0 && g->values[n->in[k]].kind == GV_CONST && k != skip_bias && !(q4 && k == 4 && !strcmp(op, "qlinear_int4"))) aux[n->in[k]] = true;
    const int wi = q8 || !strcmp(op, "qlinear_int4") ? 1 : 0; /* the embeddings' weight comes first */
    const gvalue *w = n->in[wi] >= 0 ? &g->values[n->in[wi]] : NULL;
    if (q4) return w && w->tensor ? 2 * fm_tensor_numel(w->tensor) : 0;
    const gvalue *sc = &g->values[n->in[q8 ? 2 : 1]], *x = q8 ? &g->values[n->in[0]] : NULL;
    const int64_t rows = sc->tensor ? fm_tensor_numel(sc->tensor) : 0;
    if (e8) { const gattr *d = g_node_attr(n, "dim"); return rows * (d ? d->i : 0); }
    if (!strcmp(op, "qlinear_int8")) return rows * (x->t.ndim ? x->t.d[x->t.ndim - 1] : 0);
    const gattr *kr = g_node_attr(n, "kernel");
    const int64_t kk = kr && kr->n == 2 ? kr->ints[0].v * kr->ints[1].v : 1;
    return rows * (x->t.ndim > 1 ? x->t.d[1] : 0) * kk;
}

/* The model's parameters: float constants, and the weights quantized nodes hold (as many as
 * before quantization; their scales, zero sums and offsets not counted). */
static long long graph_params(const fm_graph *g) {
    bool *aux = calloc((size_t)g->n_values + 1, sizeof *aux);
    long long p = 0;
    if (!aux) return -1;
    for (int i = 0; i < g->n_nodes; i++) p += quantized_weights(g, &g->nodes[i], aux);
    for (int v = 0; v < g->n_values; v++) {
        const fm_tensor *t = g->values[v].kind == GV_CONST && !aux[v] ? g->values[v].tensor : NULL;
        if (t && fm_dtype_is_float(t->dtype)) p += fm_tensor_numel(t);
    }
    free(aux);
    return p;
}

fm_status fm_plan_run_graph(const char *model, const fm_plan_graph_opts *o, fm_plan_graph_run *out) {
    memset(out, 0, sizeof *out);
    if (!model || !o) return fm_set_error(FM_ERR_INVALID, "plan graph: model and options must not be NULL");
    if (o->batch < 1 || o->n_dims < 0 || o->n_dims > FM_PLAN_GRAPH_MAX_DIMS)
        return fm_set_error(FM_ERR_INVALID, "--batch must be at least 1 (got %lld)", (long long)o->batch);
    for (int k = 0; k < o->n_dims; k++)
        if (!o->dim_names[k] || o->dim_values[k] < 1 || o->dim_values[k] >= (INT64_C(1) << 31))
            return fm_set_error(FM_ERR_INVALID, "--dim %s: the size must be in [1, 2^31)", o->dim_names[k] ? o->dim_names[k] : "?");
    snprintf(out->path, sizeof out->path, "%s", model);
    bool used[FM_PLAN_GRAPH_MAX_DIMS] = {0};
    fm_graph *g = load(model, o, out, used);
    if (!g) return fm_last_status();
    int64_t (*shapes)[FM_MAX_DIMS] = calloc((size_t)fm_graph_num_inputs(g) + 1, sizeof *shapes);
    fm_status st = shapes ? input_shapes(g, o, used, shapes, out) : fm_set_error(FM_ERR_OOM, "out of host memory");
    out->nodes = fm_graph_num_nodes(g), out->consts = fm_graph_num_consts(g);
    out->params = graph_params(g);
    plan_step_opts so;
    plan_step_defaults(&so);
    so.dev = o->device;
    plan_step_mem mem;
    size_t ob = 0;
    if (!st) st = plan_step_graph(g, (const int64_t(*)[FM_MAX_DIMS])shapes, &so, &mem, &out->flops, &out->bytes, &ob);
    if (!st) {
        out->input_bytes = (double)mem.batch;
        out->weights = (double)mem.resident - (double)mem.batch;
        out->peak = (double)mem.peak - (double)mem.resident;
        out->output_bytes = (double)ob;
        snprintf(out->peak_at, sizeof out->peak_at, "%s", mem.peak_at);
    }
    free(shapes);
    fm_graph_free(g);
    return st;
}

char *fm_plan_graph_render_text(const fm_plan_graph_run *r) {
    plan_sb sb = {0};
    char a[32], b[32], c[32], d[32], e[32];
    plan_sb_printf(&sb, "fathom plan: %s (%s, %d nodes, %d constants), %lld parameters\n", r->path,
                   !strcmp(r->kind, "onnx") ? "an ONNX file, imported as `fathom import` does" : "a graph directory", r->nodes,
                   r->consts, (long long)r->params);
    plan_sb_printf(&sb, "job: one inference by fathom's graph runner; inputs %s\n", r->inputs);
    plan_sb_printf(&sb, "Memory at the peak (fathom's allocator on the meta device: shapes only, nothing allocated):\n");
    plan_sb_printf(&sb, "  weights                        %10s\n", fm_format_bytes((size_t)r->weights, a, sizeof a));
    plan_sb_printf(&sb, "  inputs                         %10s\n", fm_format_bytes((size_t)r->input_bytes, b, sizeof b));
    plan_sb_printf(&sb, "  activations, scratch, outputs  %10s  (the peak, after %s)\n", fm_format_bytes((size_t)r->peak, c, sizeof c),
                   r->peak_at[0] ? r->peak_at : "-");
    plan_sb_printf(&sb, "  = allocated                    %10s  (outputs %s)\n",
                   fm_format_bytes((size_t)(r->weights + r->input_bytes + r->peak), d, sizeof d),
                   fm_format_bytes((size_t)r->output_bytes, e, sizeof e));
    plan_sb_printf(&sb, "Work: %.4g GFLOP, %.4g GB read and written by its kernels (arithmetic intensity %.3g FLOP/byte)\n",
                   r->flops / 1e9, r->bytes / 1e9, r->bytes > 0 ? r->flops / r->bytes : 0.0);
    plan_sb_printf(&sb, "(the run allocates per node, as on a GPU; on the CPU the runner plans one arena for a shape once it "
                        "has run twice: `fathom compile --report` shows the planned peak)\n");
    return plan_sb_take(&sb);
}

char *fm_plan_graph_render_json(const fm_plan_graph_run *r) {
    json_t *j = json_object(), *mem = json_object();
    if (!j || !mem) { json_decref(j); json_decref(mem); fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    json_object_set_new(j, "model", json_string(r->path));
    json_object_set_new(j, "kind", json_string(r->kind));
    json_object_set_new(j, "nodes", json_integer(r->nodes));
    json_object_set_new(j, "constants", json_integer(r->consts));
    json_object_set_new(j, "params", json_integer(r->params));
    json_object_set_new(j, "inputs", json_string(r->inputs));
    json_object_set_new(mem, "weights", json_integer((json_int_t)r->weights));
    json_object_set_new(mem, "inputs", json_integer((json_int_t)r->input_bytes));
    json_object_set_new(mem, "run_peak", json_integer((json_int_t)r->peak));
    json_object_set_new(mem, "peak_allocated", json_integer((json_int_t)(r->weights + r->input_bytes + r->peak)));
    json_object_set_new(mem, "outputs", json_integer((json_int_t)r->output_bytes));
    json_object_set_new(mem, "peak_at", json_string(r->peak_at));
    json_object_set_new(j, "memory", mem);
    json_object_set_new(j, "flops", json_real(r->flops));
    json_object_set_new(j, "bytes", json_real(r->bytes));
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text) fm_set_error(FM_ERR_OOM, "out of host memory");
    return text;
}
