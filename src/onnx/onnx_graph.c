/* ONNX model -> fm_graph (fathom/graph.h), the one inference graph.
 *
 * The model is run twice by the eager interpreter (onnx_run.c) on zero inputs,
 * with its dynamic dims at two different probe sizes, keeping every value. A
 * value computed from no graph input (initializers, Constant, and Shape/Size of
 * shapes that do not change between the probes) is folded into a graph
 * constant; the shape arithmetic of exported models (Shape -> Gather -> Concat ->
 * Reshape) disappears that way. A shape that does follow a dynamic dim is
 * written with the graph's "0" (the input's size there) and "-1" (inferred)
 * where that is exact. Every other node becomes graph ops (onnx_graph_ops.c);
 * a node with no graph form is refused with its name and op, and `fathom run`
 * still runs such a model directly. */
#include "onnx/onnx_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An ONNX dim name as a graph identifier. */
static void sym_name(const char *param, const char *input, int d, char *out, size_t n) {
    if (param && *param) snprintf(out, n, "%s", param);
    else snprintf(out, n, "%s_d%d", input, d);
    for (char *p = out; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_') *p = '_';
    if (isdigit((unsigned char)out[0])) out[0] = '_';
}

/* The graph's name of dynamic dim d of model input i (in->dims[d] < 0). */
static void dim_name(const fm_onnx_model *m, int i, int d, char *out, size_t n) {
    const char *name = m->value_names[m->inputs[i].slot];
    const Onnx__ValueInfoProto *vi = NULL;
    for (size_t k = 0; k < m->proto->graph->n_input; k++)
        if (!strcmp(m->proto->graph->input[k]->name, name)) vi = m->proto->graph->input[k];
    const Onnx__TensorShapeProto__Dimension *dim = vi->type->tensor_type->shape->dim[d];
    sym_name(dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM ? dim->dim_param : NULL, name, d, out, n);
}

/* The size fm_onnx_set_dim gave dim `name`, or 0. */
static int64_t fixed_size(const fm_onnx_model *m, const char *name) {
    for (int k = 0; k < m->n_fixed; k++)
        if (!strcmp(m->fixed_dims[k], name)) return m->fixed_sizes[k];
    return 0;
}

fm_status fm_onnx_set_dim(fm_onnx_model *m, const char *name, int64_t size) {
    if (!m || !name) return fm_set_error(FM_ERR_INVALID, "fm_onnx_set_dim: model or name is NULL");
    char all[512] = "", nm[64], listed[16][64];
    bool found = false;
    int n_listed = 0;
    for (int i = 0; i < m->n_inputs; i++)
        for (int d = 0; d < m->inputs[i].ndim; d++) {
            if (m->inputs[i].dims[d] >= 0) continue;
            dim_name(m, i, d, nm, sizeof nm);
            found |= !strcmp(nm, name);
            bool seen = false;
            for (int k = 0; k < n_listed; k++) seen |= !strcmp(listed[k], nm);
            if (seen || n_listed == 16 || strlen(all) + strlen(nm) + 3 >= sizeof all) continue;
            snprintf(listed[n_listed++], sizeof listed[0], "%s", nm);
            strcat(strcat(all, *all ? ", " : ""), nm);
        }
    if (!found)
        return fm_set_error(FM_ERR_INVALID, "%s: the model has no dynamic input dim named '%s' (its dynamic dims: %s)", m->path, name,
                            *all ? all : "none");
    if (size < 1 || size >= ((int64_t)1 << 31))
        return fm_set_error(FM_ERR_INVALID, "%s: dim '%s' = %" PRId64 ": a size must be in [1, 2^31)", m->path, name, size);
    int k = 0;
    while (k < m->n_fixed && strcmp(m->fixed_dims[k], name)) k++;
    if (k == (int)(sizeof m->fixed_sizes / sizeof *m->fixed_sizes))
        return fm_set_error(FM_ERR_INVALID, "%s: more than %d dims fixed", m->path, k);
    snprintf(m->fixed_dims[k], sizeof m->fixed_dims[k], "%s", name);
    m->fixed_sizes[k] = size;
    if (k == m->n_fixed) m->n_fixed++;
    return FM_OK;
}

fm_status fm_onnx_set_input_dim(fm_onnx_model *m, const char *input, int d, int64_t size) {
    if (!m || !input) return fm_set_error(FM_ERR_INVALID, "fm_onnx_set_input_dim: model or input is NULL");
    for (int i = 0; i < m->n_inputs; i++) {
        const onnx_input *in = &m->inputs[i];
        if (strcmp(m->value_names[in->slot], input)) continue;
        if (d < 0 || d >= in->ndim)
            return fm_set_error(FM_ERR_INVALID, "%s: input '%s' has %d dims; there is no dim %d", m->path, input, in->ndim, d);
        if (in->dims[d] >= 0 && in->dims[d] != size)
            return fm_set_error(FM_ERR_INVALID, "%s: input '%s' dim %d is fixed at %" PRId64 " in the model, not %" PRId64, m->path,
                                input, d, in->dims[d], size);
        if (in->dims[d] >= 0) return FM_OK;
        char nm[64];
        dim_name(m, i, d, nm, sizeof nm);
        return fm_onnx_set_dim(m, nm, size);
    }
    return fm_set_error(FM_ERR_INVALID, "%s: the model has no input named '%s'", m->path, input);
}

/* Declares the graph inputs; fills the probe inputs (zeros, dynamic dims at
 * probe a or b, fixed dims at their size) for the two runs. */
static fm_status declare_inputs(onnx_graph_ctx *x, fm_tensor **pa, fm_tensor **pb) {
    const fm_onnx_model *m = x->m;
    for (int i = 0; i < m->n_inputs; i++) {
        const onnx_input *in = &m->inputs[i];
        const char *name = m->value_names[in->slot];
        fm_dtype dt;
        if (in->ndim < 0 || !in->elem_type || !onnx_dtype_to_fm(in->elem_type, &dt))
            return fm_set_error(FM_ERR_UNSUPPORTED, "%s: input '%s' has no declared type and shape; the graph needs both", m->path, name);
        char names[FM_MAX_DIMS][64];
        const char *dn[FM_MAX_DIMS];
        int64_t sa[FM_MAX_DIMS], sb[FM_MAX_DIMS], dims[FM_MAX_DIMS];
        for (int d = 0; d < in->ndim; d++) {
            dn[d] = NULL;
            dims[d] = sa[d] = sb[d] = in->dims[d];
            if (in->dims[d] >= 0) continue;
            dim_name(m, i, d, names[d], sizeof names[d]);
            int64_t fixed = fixed_size(m, names[d]);
            if (fixed > 0) { /* fm_onnx_set_dim: a static dim of the graph */
                dims[d] = sa[d] = sb[d] = fixed;
                continue;
            }
            dn[d] = names[d];
            int s = x->n_syms;
            for (int k = 0; k < x->n_syms; k++)
                if (!strcmp(x->syms[k], names[d])) s = k;
            if (s == x->n_syms) {
                if (x->n_syms == ONNX_GRAPH_MAX_SYMS) return fm_set_error(FM_ERR_UNSUPPORTED, "%s: too many dynamic dims", m->path);
                snprintf(x->syms[x->n_syms++], sizeof x->syms[0], "%.63s", names[d]);
            }
            sa[d] = onnx_probe_size(s, 0);
            sb[d] = onnx_probe_size(s, 1);
        }
        if (fm_graph_add_input(x->g, name, dt, in->ndim, dims, dn)) return fm_last_status();
        pa[i] = fm_tensor_zeros(in->ndim, sa, dt, FM_CPU);
        pb[i] = fm_tensor_zeros(in->ndim, sb, dt, FM_CPU);
        if (!pa[i] || !pb[i]) return fm_last_status();
    }
    return FM_OK;
}

static bool same_values(const fm_tensor *a, const fm_tensor *b) {
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t)))
        return false;
    int64_t n = fm_tensor_numel(a);
    for (int64_t i = 0; i < n; i++)
        if (fm_tensor_get(a, i) != fm_tensor_get(b, i)) return false;
    return true;
}

/* Whether node n makes data of the graph from a dynamic dim's size: a Range over it,
 * ConstantOfShape of a shape that follows it, a constant sliced to it (position ids and
 * masks over the sequence). They become arange, expand and slice nodes with that dim's
 * expression; what reads them is data as any other. */
static bool makes_dim_data(const onnx_graph_ctx *x, const onnx_node *n) {
    bool any = false;
    for (int k = 0; k < n->n_in; k++) any |= n->in[k] >= 0 && x->shape_like[n->in[k]];
    const char *op = n->op->name;
    return any && (!strcmp(op, "Range") || !strcmp(op, "ConstantOfShape") ||
                   (!strcmp(op, "Slice") && n->n_in > 0 && n->in[0] >= 0 && x->folded[n->in[0]]));
}

/* Which values are folded: computed from constants and shapes only (Shape and
 * Size read only their input's shape), with the same result under both probes.
 * A value computed from a dynamic dim's size must also agree at a third probe (vc,
 * NULL when that run failed: then it is not folded). The rest of what is computed
 * from constants and shapes only follows a dynamic dim (shape_like): a Reshape or
 * Expand target; its readers decide whether the graph can hold it. */
static void mark_folded(onnx_graph_ctx *x, fm_tensor *const *vc) {
    const fm_onnx_model *m = x->m;
    for (int s = 0; s < m->n_values; s++) x->folded[s] = m->constants[s] != NULL;
    for (int i = 0; i < m->n_nodes; i++) {
        const onnx_node *n = &m->nodes[i];
        bool shape_only = !strcmp(n->op->name, "Shape") || !strcmp(n->op->name, "Size");
        bool consts = true, shapes = true; /* every input folded; every input folded or shape_like */
        for (int k = 0; k < n->n_in && !shape_only; k++) {
            consts &= n->in[k] < 0 || x->folded[n->in[k]];
            shapes &= n->in[k] < 0 || x->folded[n->in[k]] || x->shape_like[n->in[k]];
        }
        /* a constant expanded to a size read from a dynamic dim (ViT's class token to the
         * batch) is data of the graph, not a shape: an expand node with that dim's expression */
        if (!strcmp(n->op->name, "Expand") && n->n_in > 1 && n->in[0] >= 0 && x->folded[n->in[0]] && n->in[1] >= 0 &&
            x->shape_like[n->in[1]])
            consts = shapes = false;
        if (makes_dim_data(x, n)) consts = shapes = false;
        for (int k = 0; k < n->n_out; k++) {
            int s = n->out[k];
            if (s < 0) continue;
            /* a value read from a dynamic dim may agree at two probes by chance (min(b, 3) at b = 3
             * and 4): folded only when a third probe, at other sizes, agrees too */
            x->folded[s] = (consts || (shapes && vc && same_values(x->va[s], vc[s]))) && same_values(x->va[s], x->vb[s]);
            x->shape_like[s] = shapes && !x->folded[s]; /* follows a dynamic dim through shapes only */
        }
    }
}

/* Adds folded value s as a graph constant once. */
fm_status onnx_graph_const(onnx_graph_ctx *x, int s) {
    if (x->emitted[s]) return FM_OK;
    x->emitted[s] = true;
    return fm_graph_add_const(x->g, x->m->value_names[s], x->va[s]);
}

static fm_status emit_node(onnx_graph_ctx *x, int i) {
    const onnx_node *n = &x->m->nodes[i];
    for (int k = 0; k < n->n_in; k++) {
        int s = n->in[k];
        if (s >= 0 && x->shape_like[s] && !onnx_graph_shape_input_ok(n->op->name, k) && onnx_graph_materialize(x, s)) {
            char dims[256] = "";
            for (int d = 0; d < x->n_syms && strlen(dims) + strlen(x->syms[d]) + 3 < sizeof dims; d++)
                strcat(strcat(dims, d ? ", " : ""), x->syms[d]);
            return fm_set_error(FM_ERR_UNSUPPORTED, "%s: node %d '%s' (%s): input '%s' is a value computed from the size of a "
                                "dynamic dim, which the graph cannot hold here; fix the dynamic dims (%s) to sizes "
                                "(`--dim NAME=SIZE`, fm_onnx_set_dim), or `fathom run` runs this model directly",
                                x->m->path, i, n->proto->name ? n->proto->name : "", n->op->name, x->m->value_names[s], dims);
        }
    }
    fm_status st = onnx_graph_translate(x, i);
    if (st && !strstr(fm_last_error(), x->m->path))
        fm_error_prefix("%s: node %d '%s' (%s)", x->m->path, i, n->proto->name ? n->proto->name : "", n->op->name);
    return st;
}

/* A third run at other sizes (sym k at 2 + 7k), only to tell which shape-derived
 * values are constant: the values, or NULL when the model does not run there. */
static fm_tensor **third_probe(onnx_graph_ctx *x, fm_tensor *const *pa) {
    const fm_onnx_model *m = x->m;
    fm_tensor *pc[64] = {0}, *oc[256] = {0}, **vc = calloc((size_t)m->n_values + 1, sizeof *vc);
    bool ok = vc != NULL;
    for (int i = 0; i < m->n_inputs && ok; i++) {
        const onnx_input *in = &m->inputs[i];
        int64_t sc[FM_MAX_DIMS];
        for (int d = 0; d < in->ndim; d++) {
            char nm[64];
            sc[d] = pa[i]->shape[d];
            if (in->dims[d] >= 0) continue;
            dim_name(m, i, d, nm, sizeof nm);
            for (int k = 0; k < x->n_syms; k++) /* a dim fixed by fm_onnx_set_dim is no sym */
                if (!strcmp(x->syms[k], nm)) sc[d] = onnx_probe_size(k, 2);
        }
        ok = (pc[i] = fm_tensor_zeros(in->ndim, sc, pa[i]->dtype, FM_CPU)) != NULL;
    }
    ok = ok && onnx_execute((fm_onnx_model *)m, m->n_inputs, NULL, pc, oc, vc) == FM_OK;
    for (int i = 0; i < 64; i++) fm_tensor_release(pc[i]);
    for (int i = 0; i < 256; i++) fm_tensor_release(oc[i]);
    fm_clear_error();
    if (!ok && vc) {
        for (int s = 0; s < m->n_values; s++) fm_tensor_release(vc[s]);
        free(vc), vc = NULL;
    }
    return vc;
}

/* The inputs of each op that set a shape or a parameter (a bit per input): the graph's ops
 * take those as attributes, so one that is a graph input (data) has no graph form. Found
 * before the probes, whose zero inputs would otherwise fail there with a confusing reason
 * (a Resize with "scale 0"). */
static unsigned param_inputs(const char *op, int opset) {
    static const struct { const char *op; unsigned mask; } k[] = {
        {"Reshape", 2}, {"Expand", 2}, {"Slice", 30}, {"Squeeze", 2}, {"Unsqueeze", 2}, {"Tile", 2}, {"Pad", 14},
        {"Resize", 14}, {"Upsample", 2}, {"Range", 7}, {"ConstantOfShape", 1}, {"CumSum", 2}, {"Trilu", 2},
        {"Split", 2}, {"OneHot", 2},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!strcmp(op, k[i].op)) return !strcmp(op, "Slice") && opset < 10 ? 0 : k[i].mask;
    return 0;
}

static fm_status check_param_inputs(const onnx_graph_ctx *x) {
    const fm_onnx_model *m = x->m;
    for (int i = 0; i < m->n_nodes; i++) {
        const onnx_node *n = &m->nodes[i];
        const unsigned mask = param_inputs(n->op->name, m->opset);
        for (int k = 0; k < n->n_in && k < 32; k++) {
            if (!(mask >> k & 1) || n->in[k] < 0) continue;
            for (int j = 0; j < m->n_inputs; j++)
                if (m->inputs[j].slot == n->in[k])
                    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: node %d '%s' (%s): input %d is the graph input '%s', data that the "
                                        "graph form cannot take as a shape or parameter (make it an initializer; `fathom run` "
                                        "runs this model directly)", m->path, i, n->proto->name ? n->proto->name : "",
                                        n->op->name, k, m->value_names[n->in[k]]);
        }
    }
    return FM_OK;
}

/* Sequences and optionals have no graph form: a model that declares one as an input or
 * output, or has a node of their ops, is refused naming it. */
static fm_status refuse_values(const fm_onnx_model *m) {
    for (int i = 0; i < m->n_inputs + m->n_outputs; i++) {
        const onnx_input *d = i < m->n_inputs ? &m->inputs[i] : &m->out_decl[i - m->n_inputs];
        if (d->kind != ONNX_TENSOR)
            return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s '%s' is %s, which the graph form does not have", m->path,
                                i < m->n_inputs ? "input" : "output", m->value_names[d->slot],
                                d->kind == ONNX_SEQ ? "a sequence" : "an optional");
    }
    for (int i = 0; i < m->n_nodes; i++)
        if (onnx_op_makes_values(m->nodes[i].op))
            return fm_set_error(FM_ERR_UNSUPPORTED, "%s: node %d '%s' (%s): sequences and optionals have no graph form (`fathom run` "
                                "runs this model directly)", m->path, i, m->nodes[i].proto->name ? m->nodes[i].proto->name : "",
                                m->nodes[i].op->name);
    return FM_OK;
}

static fm_status build_graph(onnx_graph_ctx *x) {
    const fm_onnx_model *m = x->m;
    if (refuse_values(m) || check_param_inputs(x)) return fm_last_status();
    fm_tensor *pa[64] = {0}, *pb[64] = {0}, *oa[256] = {0}, *ob[256] = {0}, **vc = NULL;
    fm_status st = m->n_inputs > 64 || m->n_outputs > 256
                       ? fm_set_error(FM_ERR_UNSUPPORTED, "%s: too many inputs or outputs", m->path)
                       : declare_inputs(x, pa, pb);
    if (!st) st = onnx_execute((fm_onnx_model *)m, m->n_inputs, NULL, pa, oa, x->va);
    if (!st) st = onnx_execute((fm_onnx_model *)m, m->n_inputs, NULL, pb, ob, x->vb);
    if (st) fm_error_prefix("%s: probing the shapes (zero inputs, dynamic dims at two sizes)", m->path);
    if (!st && x->n_syms) vc = third_probe(x, pa);
    for (int i = 0; i < 64; i++) fm_tensor_release_n(2, pa[i], pb[i]);
    for (int i = 0; i < 256; i++) fm_tensor_release_n(2, oa[i], ob[i]);
    if (st) return st;
    mark_folded(x, vc);
    x->vc = vc; /* released by the caller, after the nodes */
    if ((st = onnx_graph_match_gelu(x)) || (st = onnx_graph_match_dynamic_int8(x))) return st;
    for (int i = 0; i < m->n_inputs; i++) x->emitted[m->inputs[i].slot] = true;
    for (int i = 0; i < m->n_nodes && !st; i++) {
        bool all_folded = true;
        for (int k = 0; k < m->nodes[i].n_out; k++) all_folded &= m->nodes[i].out[k] < 0 || x->folded[m->nodes[i].out[k]];
        bool shape_only = m->nodes[i].n_out > 0; /* read only as a shape (Reshape's target): its readers check */
        for (int k = 0; k < m->nodes[i].n_out; k++) shape_only &= m->nodes[i].out[k] >= 0 && x->shape_like[m->nodes[i].out[k]];
        if (all_folded || shape_only || x->skip[i]) continue;
        if (x->gelu_in[i] >= 0) {
            const char *in = m->value_names[x->gelu_in[i]], *out = m->value_names[m->nodes[i].out[0]];
            st = fm_graph_add_node(x->g, x->gelu_tanh[i] ? "gelu_tanh" : "gelu", NULL, 1, &in, 1, &out, 0, NULL);
        } else st = emit_node(x, i);
    }
    for (int i = 0; i < m->n_outputs && !st; i++) {
        int s = m->outputs[i];
        if (x->shape_like[s])
            st = fm_set_error(FM_ERR_UNSUPPORTED, "%s: output '%s' is a shape of a dynamic dim; the graph cannot hold it", m->path,
                              m->value_names[s]);
        else if (!(st = x->folded[s] ? onnx_graph_const(x, s) : FM_OK))
            st = fm_graph_add_output(x->g, m->value_names[s]);
    }
    for (int k = 0; k < x->n_syms && !st; k++) st = fm_graph_set_dim_hint(x->g, x->syms[k], onnx_probe_size(k, 0));
    if (!st) st = fm_graph_set_meta(x->g, "source", "onnx");
    if (!st) st = fm_graph_validate(x->g);
    return st;
}

fm_graph *fm_onnx_to_graph(fm_onnx_model *m) {
    if (!m) { fm_set_error(FM_ERR_INVALID, "fm_onnx_to_graph: model is NULL"); return NULL; }
    onnx_graph_ctx x = {.m = m, .g = fm_graph_new()};
    size_t n = (size_t)m->n_values + 1;
    x.va = calloc(n, sizeof *x.va), x.vb = calloc(n, sizeof *x.vb);
    x.folded = calloc(n, 1), x.shape_like = calloc(n, 1), x.emitted = calloc(n, 1);
    x.gelu_in = calloc((size_t)m->n_nodes + 1, sizeof(int)), x.skip = calloc((size_t)m->n_nodes + 1, 1);
    x.gelu_tanh = calloc((size_t)m->n_nodes + 1, 1);
    x.dyn_out = calloc((size_t)m->n_nodes + 1, sizeof(int)), x.dyn_scale = calloc((size_t)m->n_nodes + 1, sizeof(int));
    fm_status st = !x.g || !x.va || !x.vb || !x.folded || !x.shape_like || !x.emitted || !x.gelu_in || !x.skip || !x.gelu_tanh || !x.dyn_out ||
                           !x.dyn_scale
                       ? fm_set_error(FM_ERR_OOM, "%s: out of memory", m->path)
                       : build_graph(&x);
    for (int s = 0; x.va && x.vb && s < m->n_values; s++) fm_tensor_release_n(3, x.va[s], x.vb[s], x.vc ? x.vc[s] : NULL);
    free(x.va), free(x.vb), free(x.vc), free(x.folded), free(x.shape_like), free(x.emitted), free(x.gelu_in), free(x.skip), free(x.gelu_tanh);
    free(x.dyn_out), free(x.dyn_scale);
    if (st) {
        fm_graph_free(x.g);
        return NULL;
    }
    return x.g;
}
