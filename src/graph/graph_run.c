/* Running a graph: bind the dynamic dims from the inputs, run the nodes in
 * order through the ops' front ends (which dispatch to the device's kernels),
 * and drop each intermediate after its last reader, so the eager peak is what
 * is live, not everything. The graph itself is only read: concurrent runs of
 * one graph are safe. */
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "graph/graph_internal.h"

void g_unprepare(fm_graph *g) {
    for (int i = 0; i < g->n_prep; i++) fm_tensor_release(g->prep[i]);
    free(g->prep);
    g->prep = NULL;
    g->n_prep = 0;
    g_plan_cache_free(g->plans);
    g->plans = NULL;
}

/* conv2d_fused and linear_fused nodes with constant f32 weights get them packed
 * once for the CPU kernels (fm_conv2d_fused_pack, fm_linear_fused_pack): a call
 * would otherwise repack them each time (5% of a fashion-cnn forward at batch 1
 * for the convs; OpenBLAS packs a linear's weights in every call). The packed
 * copies are the graph's, freed with it (on the meta device, accounted). Other devices
 * run the nodes unfused. */
fm_status g_prepare(fm_graph *g) {
    g_unprepare(g);
    if (!g_cpu_kernels(g->device.type)) return FM_OK;
    if (g->device.type == FM_DEV_CPU && !(g->plans = g_plan_cache_new())) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    for (int i = 0; i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        const bool conv = !strcmp(n->op, "conv2d_fused"), lin = !strcmp(n->op, "linear_fused");
        if ((!conv && !lin) || n->n_in < 2 || n->in[1] < 0) continue;
        if (conv && !g_conv_direct_geometry(n)) continue; /* the reference path reads w itself */
        const gvalue *w = &g->values[n->in[1]];
        if (w->kind != GV_CONST || !w->tensor || w->tensor->dtype != FM_F32 || w->tensor->ndim != (conv ? 4 : 2)) continue;
        if (lin && (w->tensor->shape[0] < 1 || w->tensor->shape[1] < 1 || w->tensor->shape[0] > (1 << 24) || w->tensor->shape[1] > (1 << 24)))
            continue; /* beyond what the packed form describes: the node runs on w itself */
        if (!g->prep) {
            g->prep = calloc((size_t)g->n_nodes, sizeof *g->prep);
            if (!g->prep) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
            g->n_prep = g->n_nodes;
        }
        g->prep[i] = conv ? fm_conv2d_fused_pack(w->tensor) : fm_linear_fused_pack(w->tensor);
        if (!g->prep[i]) { fm_error_prefix("graph: packing the weights of node '%s'", n->name); return fm_last_status(); }
    }
    return FM_OK;
}

fm_status fm_graph_to_device(fm_graph *g, fm_device dev) {
    if (!g) return fm_set_error(FM_ERR_INVALID, "graph: NULL graph");
    for (int v = 0; v < g->n_values; v++) {
        gvalue *val = &g->values[v];
        if (val->kind != GV_CONST || fm_device_eq(fm_tensor_device(val->tensor), dev)) continue;
        fm_tensor *t = fm_tensor_to(val->tensor, dev);
        if (!t) { fm_error_prefix("graph: moving constant '%s'", val->name); return fm_last_status(); }
        fm_tensor_release(val->tensor);
        val->tensor = t;
    }
    g->device = dev;
    return g->validated ? g_prepare(g) : FM_OK;
}

/* Whether value v is a past cache of an attention_kv node (its input 1 or 2) */
static bool is_kv_past(const fm_graph *g, int v) {
    for (int i = 0; i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        if (n->n_in > 2 && (n->in[1] == v || n->in[2] == v) && !strcmp(g_op_spec_at(n->spec)->name, "attention_kv")) return true;
    }
    return false;
}

/* fm_graph_run_options.kv_dtype FM_F16: attention_kv's caches may come in (and go
 * out) f16 where the graph declares its own float dtype */
static bool kv16_ok(const fm_graph *g, const fm_graph_run_options *opt, int v, fm_dtype got, fm_dtype declared) {
    return opt && opt->kv_dtype == FM_F16 && got == FM_F16 && declared == FM_F32 && is_kv_past(g, v);
}

/* Checks one input against its declaration and binds its dynamic dims. */
static fm_status bind_input(const fm_graph *g, int v, const fm_tensor *t, int64_t *syms, const fm_graph_run_options *opt) {
    char s1[96], s2[512];
    const gvalue *val = &g->values[v];
    if (!t) return fm_set_error(FM_ERR_INVALID, "graph input '%s' is missing", val->name);
    if (t->dtype != val->t.dt && !kv16_ok(g, opt, v, t->dtype, val->t.dt))
        return fm_set_error(FM_ERR_INVALID, "graph input '%s' must be %s, got %s", val->name, fm_dtype_name(val->t.dt), fm_dtype_name(t->dtype));
    bool ok = t->ndim == val->t.ndim;
    for (int d = 0; ok && d < t->ndim; d++) {
        int s = val->sym[d];
        if (s < 0) ok = t->shape[d] == val->t.d[d];
        else if (syms[s] < 0) syms[s] = t->shape[d];
        else ok = syms[s] == t->shape[d];
    }
    if (!ok)
        return fm_set_error(FM_ERR_INVALID, "graph input '%s' has shape %s, expected %s (named dims must agree across inputs)", val->name,
                            fm_shape_str(t->ndim, t->shape, s1, sizeof s1), g_shape_text(g, val, s2, sizeof s2));
    return FM_OK;
}

static fm_status run_node(const fm_graph *g, const gnode *n, fm_tensor **env, const int64_t *syms, const fm_graph_run_options *opt) {
    char lb[160];
    fm_tensor *in[FM_GRAPH_MAX_NODE_IO] = {0}, *out[FM_GRAPH_MAX_NODE_IO] = {0};
    for (int k = 0; k < n->n_in; k++) in[k] = n->in[k] >= 0 ? env[n->in[k]] : NULL;
    const g_op_spec *sp = g_op_spec_at(n->spec);
    gctx c = {g, n, syms, opt};
    fm_status st = sp->run(&c, in, out);
    for (int k = 0; st == FM_OK && k < n->n_out; k++) {
        const gvalue *ov = &g->values[n->out[k]];
        if (!out[k]) st = fm_set_error(FM_ERR_INTERNAL, "output %d was not produced", k);
        else if (out[k]->dtype != ov->t.dt && !(k > 0 && out[k]->dtype == FM_F16 && g_kv16_on(&c) && !strcmp(sp->name, "attention_kv")))
            st = fm_set_error(FM_ERR_INTERNAL, "output %d is %s but shape inference said %s", k, fm_dtype_name(out[k]->dtype), fm_dtype_name(ov->t.dt));
    }
    if (st != FM_OK) {
        for (int k = 0; k < n->n_out; k++) fm_tensor_release(out[k]);
        fm_error_prefix("%s", g_node_label(n, lb, sizeof lb));
        return st;
    }
    for (int k = 0; k < n->n_out; k++) env[n->out[k]] = out[k];
    return FM_OK;
}

/* A graph output that shares storage with a constant is copied, so the caller
 * can never write into the weights through it; one that is a view of an
 * intermediate placed in the run's arena too, so that it does not hold the arena. */
static fm_tensor *detach_output(const fm_graph *g, fm_tensor *t) {
    if (g_arena_owns(t->storage)) return fm_clone(t);
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == GV_CONST && g->values[v].tensor->storage == t->storage) return fm_clone(t);
    return fm_tensor_retain(t);
}

static fm_status run_all(const fm_graph *g, fm_tensor **env, const int64_t *syms, int n_out, const int *out_v, fm_tensor **outputs,
                         const fm_graph_run_options *opt, g_arena_run *arena) {
    for (int i = 0; i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        g_arena_node_begin(arena, n);
        fm_status st = run_node(g, n, env, syms, opt);
        g_arena_node_end(arena);
        if (st) return st;
        for (int k = 0; k < n->n_in; k++) { /* intermediates die after their last reader */
            int v = n->in[k];
            if (v >= 0 && g->values[v].last_use == i && !g->values[v].is_output && g->values[v].kind == GV_NODE && env[v]) {
                fm_tensor_release(env[v]);
                env[v] = NULL;
            }
        }
        for (int k = 0; k < n->n_out; k++) { /* and outputs nobody reads at once */
            int v = n->out[k];
            if (g->values[v].last_use < 0 && !g->values[v].is_output) { fm_tensor_release(env[v]); env[v] = NULL; }
        }
    }
    for (int j = 0; j < n_out; j++) {
        outputs[j] = detach_output(g, env[out_v[j]]);
        if (!outputs[j]) {
            for (int k = 0; k < j; k++) { fm_tensor_release(outputs[k]); outputs[k] = NULL; }
            return fm_last_status();
        }
    }
    return FM_OK;
}

static fm_status run_impl(const fm_graph *g, fm_tensor *const *by_input, int n_out, const int *out_v, fm_tensor **outputs,
                          const fm_graph_run_options *opt) {
    if (!g->validated) return fm_set_error(FM_ERR_STATE, "graph: not validated (fm_graph_validate, or build it with fm_graph_load)");
    int64_t syms[G_MAX_SYMS];
    for (int s = 0; s < G_MAX_SYMS; s++) syms[s] = -1;
    for (int i = 0; i < g->n_inputs; i++)
        if (bind_input(g, g->inputs[i], by_input[i], syms, opt)) return fm_last_status();
    fm_tensor **env = calloc((size_t)g->n_values + 1, sizeof *env);
    if (!env) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    fm_status st = FM_OK;
    for (int i = 0; i < g->n_inputs && st == FM_OK; i++) {
        env[g->inputs[i]] = fm_tensor_to(by_input[i], g->device);
        if (!env[g->inputs[i]]) st = fm_last_status();
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == GV_CONST) env[v] = fm_tensor_retain(g->values[v].tensor);
    bool prev = fm_set_grad_enabled(false);
    g_arena_run *arena = st == FM_OK && !(opt && opt->no_arena) ? g_arena_begin(g, syms) : NULL;
    if (st == FM_OK) st = run_all(g, env, syms, n_out, out_v, outputs, opt, arena);
    fm_set_grad_enabled(prev);
    for (int v = 0; v < g->n_values; v++) fm_tensor_release(env[v]);
    free(env);
    g_arena_end(arena);
    return st;
}

fm_status fm_graph_run(const fm_graph *g, fm_tensor *const *inputs, fm_tensor **outputs) { return fm_graph_run_ex(g, inputs, outputs, NULL); }

fm_status fm_graph_run_ex(const fm_graph *g, fm_tensor *const *inputs, fm_tensor **outputs, const fm_graph_run_options *opt) {
    if (!g || (!inputs && g->n_inputs) || !outputs) return fm_set_error(FM_ERR_INVALID, "graph run: NULL graph, inputs or outputs");
    if (opt && opt->kv_capacity < 0) return fm_set_error(FM_ERR_INVALID, "graph run: kv_capacity %lld is negative", (long long)opt->kv_capacity);
    if (opt && opt->kv_dtype != FM_F32) {
        if (opt->kv_dtype != FM_F16)
            return fm_set_error(FM_ERR_INVALID, "graph run: kv_dtype %s is not a KV cache dtype (f32 or f16)", fm_dtype_name(opt->kv_dtype));
        if (!opt->kv_append || fm_graph_device(g).type != FM_DEV_CPU)
            return fm_set_error(FM_ERR_INVALID, "graph run: an f16 KV cache (kv_dtype f16) needs kv_append, on the CPU (this graph is on %s)",
                                fm_graph_device(g).type == FM_DEV_CPU ? "the CPU, kv_append off" : "another device");
        bool has = false;
        for (int i = 0; i < g->n_nodes && !has; i++) has = !strcmp(g_op_spec_at(g->nodes[i].spec)->name, "attention_kv");
        if (!has)
            return fm_set_error(FM_ERR_INVALID, "graph run: an f16 KV cache (kv_dtype f16) needs the graph's attention_kv nodes: compile the "
                                                "graph first (fathom compile fuses its KV attention)");
    }
    return run_impl(g, inputs, g->n_outputs, g->outputs, outputs, opt);
}

fm_status fm_graph_run_named(const fm_graph *g, int n_in, const char *const *in_names, fm_tensor *const *inputs, int n_out,
                             const char *const *out_names, fm_tensor **outputs) {
    if (!g || n_in < 0 || n_out < 1 || (n_in && (!in_names || !inputs)) || !out_names || !outputs)
        return fm_set_error(FM_ERR_INVALID, "graph run: NULL or empty arguments");
    fm_tensor **by_input = calloc((size_t)g->n_inputs + 1, sizeof *by_input);
    int *out_v = calloc((size_t)n_out, sizeof *out_v);
    fm_status st = by_input && out_v ? FM_OK : fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    for (int i = 0; st == FM_OK && i < n_in; i++) {
        int v = g_find_value(g, in_names[i]), k = 0;
        while (k < g->n_inputs && g->inputs[k] != v) k++;
        if (v < 0 || k == g->n_inputs) st = fm_set_error(FM_ERR_INVALID, "graph has no input named '%s'", in_names[i] ? in_names[i] : "(null)");
        else if (by_input[k]) st = fm_set_error(FM_ERR_INVALID, "graph input '%s' is given twice", in_names[i]);
        else by_input[k] = inputs[i];
    }
    for (int j = 0; st == FM_OK && j < n_out; j++) {
        out_v[j] = g_find_value(g, out_names[j]);
        if (out_v[j] < 0 || !g->values[out_v[j]].is_output)
            st = fm_set_error(FM_ERR_INVALID, "graph has no output named '%s'", out_names[j] ? out_names[j] : "(null)");
    }
    if (st == FM_OK) st = run_impl(g, by_input, n_out, out_v, outputs, NULL);
    free(by_input);
    free(out_v);
    return st;
}
