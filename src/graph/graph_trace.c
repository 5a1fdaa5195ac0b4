/* Tracing a module tree (the recipe models: MLPs, CNNs) into a graph. The
 * model runs on the example input layer by layer, in evaluation mode; each
 * layer that runs is recorded as its graph op with its weights as constants
 * (named as in the model's state, "features.0.weight"), and the value it
 * produced is checked against the shape inference of the node just recorded.
 * The input's leading dim becomes the dynamic dim "batch". At the end the
 * graph runs on the example and must give the model's output exactly (the same
 * ops in the same order). */
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/nn.h"
#include "fathom/ops.h"
#include "graph/graph_internal.h"

typedef struct tracer { fm_graph *g; } tracer;

static fm_status add_param(tracer *t, const char *prefix, const char *what, fm_tensor *p, char *name, size_t size) {
    if (!p) { name[0] = 0; return FM_OK; }
    snprintf(name, size, "%s%s", prefix, what);
    return fm_graph_add_const(t->g, name, p);
}

/* The weights of a leaf module by their state names ("weight", "bias", ...). */
static fm_tensor *state_of(fm_module *m, const char *name) {
    fm_named_list l;
    if (fm_module_state(m, &l)) return NULL;
    int i = fm_named_list_find(&l, name);
    fm_tensor *t = i >= 0 ? l.items[i].tensor : NULL;
    fm_named_list_free(&l);
    return t; /* borrowed from the module */
}

/* Records leaf m (already run: x -> y) as one node reading xname, writing yname. */
static fm_status record_leaf(tracer *t, fm_module *m, const char *prefix, const char *xname, const char *yname) {
    fm_module_hparams h = fm_module_get_hparams(m);
    char w[320], b[320], rm[320], rv[320];
    const char *op = NULL;
    fm_graph_attr at[4];
    int na = 0, nin = 1;
    const char *ins[5] = {xname, w, b, rm, rv};
    switch (fm_module_get_kind(m)) {
    case FM_MOD_LINEAR: op = "linear"; nin = 3; break;
    case FM_MOD_CONV2D:
        op = "conv2d";
        nin = 3;
        at[na++] = fm_graph_attr_int("stride", h.stride);
        at[na++] = fm_graph_attr_int("padding", h.padding);
        break;
    case FM_MOD_BATCHNORM2D: op = "batch_norm"; nin = 5; at[na++] = fm_graph_attr_float("eps", h.eps); break;
    case FM_MOD_LAYERNORM: op = "layer_norm"; nin = 3; at[na++] = fm_graph_attr_float("eps", h.eps); break;
    case FM_MOD_RMSNORM: op = "rms_norm"; nin = 2; at[na++] = fm_graph_attr_float("eps", h.eps); break;
    case FM_MOD_EMBEDDING: op = "embedding"; nin = 2; ins[0] = w; ins[1] = xname; break;
    case FM_MOD_DROPOUT: op = "identity"; break; /* evaluation mode */
    case FM_MOD_RELU: op = "relu"; break;
    case FM_MOD_GELU: op = "gelu"; break;
    case FM_MOD_SILU: op = "silu"; break;
    case FM_MOD_TANH: op = "tanh"; break;
    case FM_MOD_SIGMOID: op = "sigmoid"; break;
    case FM_MOD_MAXPOOL2D: case FM_MOD_AVGPOOL2D:
        op = fm_module_get_kind(m) == FM_MOD_MAXPOOL2D ? "max_pool2d" : "avg_pool2d";
        at[na++] = fm_graph_attr_int("kernel", h.kernel);
        at[na++] = fm_graph_attr_int("stride", h.stride);
        at[na++] = fm_graph_attr_int("padding", h.padding);
        break;
    case FM_MOD_FLATTEN: op = "flatten"; at[na++] = fm_graph_attr_int("start", 1); break;
    case FM_MOD_MEANPOOL: { /* the attribute points at its values until the node is added: a static array */
        static const int64_t token_axis[1] = {1};
        op = "mean";
        at[na++] = fm_graph_attr_ints("axes", 1, token_axis);
        break;
    }
    default: {
        char d[96];
        return fm_set_error(FM_ERR_UNSUPPORTED, "trace: layer %s (%s) has no graph op", prefix, fm_module_describe(m, d, sizeof d));
    }
    }
    if (add_param(t, prefix, "weight", state_of(m, "weight"), w, sizeof w) || add_param(t, prefix, "bias", state_of(m, "bias"), b, sizeof b) ||
        add_param(t, prefix, "running_mean", state_of(m, "running_mean"), rm, sizeof rm) ||
        add_param(t, prefix, "running_var", state_of(m, "running_var"), rv, sizeof rv))
        return fm_last_status();
    char name[300];
    snprintf(name, sizeof name, "%.*s", (int)(strlen(prefix) ? strlen(prefix) - 1 : 0), prefix);
    return fm_graph_add_node(t->g, op, *name ? name : NULL, nin, ins, 1, (const char *[]){yname}, na, at);
}

static fm_status shape_matches(const fm_graph *g, const char *vname, const fm_tensor *y) {
    const gvalue *v = &g->values[g_find_value(g, vname)];
    char s1[96], s2[96];
    if (v->t.dt != y->dtype || v->t.ndim != y->ndim || memcmp(v->t.d, y->shape, sizeof(int64_t) * (size_t)y->ndim))
        return fm_set_error(FM_ERR_INTERNAL, "trace: value '%s' is %s %s in the graph but %s %s in the model", vname, fm_dtype_name(v->t.dt),
                            fm_shape_str(v->t.ndim, v->t.d, s1, sizeof s1), fm_dtype_name(y->dtype), fm_shape_str(y->ndim, y->shape, s2, sizeof s2));
    return FM_OK;
}

/* Runs m on *x (replaced by the output), recording nodes; *xname follows. */
static fm_status trace_tree(tracer *t, fm_module *m, const char *prefix, fm_tensor **x, char *xname, int64_t batch) {
    if (fm_module_get_kind(m) == FM_MOD_SEQUENTIAL) {
        for (int i = 0; i < fm_module_num_children(m); i++) {
            char pre[300];
            snprintf(pre, sizeof pre, "%s%s.", prefix, fm_module_child_name(m, i));
            if (trace_tree(t, fm_module_child(m, i), pre, x, xname, batch)) return fm_last_status();
        }
        return FM_OK;
    }
    fm_tensor *y = fm_module_forward(m, *x);
    if (!y) return fm_last_status();
    char yname[320];
    snprintf(yname, sizeof yname, "%sout", prefix);
    fm_status st = record_leaf(t, m, prefix, xname, yname);
    /* the node's inference at the example's batch must give what the layer gave */
    if (st == FM_OK) {
        int64_t vals[G_MAX_SYMS] = {batch};
        t->g->validated = false;
        st = g_infer_all(t->g, vals, false);
    }
    if (st == FM_OK) st = shape_matches(t->g, yname, y);
    fm_tensor_release(*x);
    *x = y;
    snprintf(xname, 320, "%s", yname);
    return st;
}

fm_graph *fm_graph_trace_module(fm_module *m, const fm_tensor *example) {
    if (!m || !example || example->ndim < 1) { fm_set_error(FM_ERR_INVALID, "trace: needs a module and an example input [batch, ...]"); return NULL; }
    fm_graph *g = fm_graph_new();
    if (!g) return NULL;
    tracer t = {g};
    bool was_training = fm_module_is_training(m), prev = fm_set_grad_enabled(false);
    fm_module_train(m, false);
    int64_t dims[FM_MAX_DIMS];
    const char *names[FM_MAX_DIMS] = {"batch"};
    memcpy(dims, example->shape, sizeof dims);
    dims[0] = -1;
    fm_status st = fm_graph_add_input(g, "input", example->dtype, example->ndim, dims, names);
    if (st == FM_OK) st = fm_graph_set_dim_hint(g, "batch", example->shape[0] > 1 ? example->shape[0] : 2);
    fm_tensor *x = fm_tensor_retain((fm_tensor *)example);
    char xname[320] = "input";
    if (st == FM_OK) st = trace_tree(&t, m, "", &x, xname, example->shape[0]);
    if (st == FM_OK && !strcmp(xname, "input")) st = fm_set_error(FM_ERR_INVALID, "trace: the model has no layers");
    if (st == FM_OK) {
        /* the output gets a stable name */
        st = fm_graph_add_node(g, "identity", "output", 1, (const char *[]){xname}, 1, (const char *[]){"output"}, 0, NULL);
        if (st == FM_OK) st = fm_graph_add_output(g, "output");
    }
    if (st == FM_OK) st = fm_graph_validate(g);
    fm_tensor *y = NULL;
    if (st == FM_OK) st = fm_graph_run(g, (fm_tensor *[]){(fm_tensor *)example}, &y);
    if (st == FM_OK) {
        bool same = y->ndim == x->ndim && !memcmp(y->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        for (int64_t i = 0; same && i < fm_tensor_numel(x); i++) same = fm_tensor_get(x, i) == fm_tensor_get(y, i);
        if (!same) st = fm_set_error(FM_ERR_INTERNAL, "trace: the graph's output differs from the model's on the example");
    }
    fm_tensor_release_n(2, x, y);
    fm_module_train(m, was_training);
    fm_set_grad_enabled(prev);
    if (st != FM_OK) { fm_graph_free(g); return NULL; }
    fm_graph_set_meta(g, "producer", "fathom trace");
    return g;
}
