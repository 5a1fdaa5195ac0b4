/* Modules: one tagged struct for every layer kind, plus the Sequential container.
 *
 * A tagged struct rather than a vtable per layer keeps each layer's forward,
 * shape rule and parameter list side by side in one switch, which is where a
 * reader looks when a layer misbehaves. Forward passes call only public ops
 * (fathom/ops.h), so modules work on any device the ops support. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h" /* requires_grad, zero_grad */
#include "fathom/memory.h"   /* the moved weights are tagged as weights */
#include "fathom/nn.h"
#include "ops/ops_internal.h" /* fm_mixed_lowp, fm_linear_mixed, fm_conv2d_mixed */

struct fm_module {
    fm_module_kind kind;
    bool training;
    int64_t a, b;          /* in/out features, channels, num/dim */
    int k, stride, pad;    /* conv and pool geometry */
    double eps, momentum, p;
    fm_tensor *weight, *bias, *running_mean, *running_var, *num_batches;
    fm_rng *rng;           /* dropout masks (borrowed) */
    int n_children, cap;
    fm_module **children;
    char **child_names;
    struct block_state *blocks; /* per-block checkpointing state (fm_module_forward_blocks) */
    int n_blocks;
};

/* ---------------- named lists ---------------- */

void fm_named_list_free(fm_named_list *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) {
        free(l->items[i].name);
        if (l->owns_tensors) fm_tensor_release(l->items[i].tensor);
    }
    free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
}

fm_status fm_named_list_push(fm_named_list *l, const char *name, fm_tensor *t, bool no_decay, bool is_buffer) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        fm_named_tensor *it = realloc(l->items, (size_t)cap * sizeof *it);
        if (!it) return fm_set_error(FM_ERR_OOM, "out of host memory");
        l->items = it;
        l->cap = cap;
    }
    char *nm = strdup(name);
    if (!nm) return fm_set_error(FM_ERR_OOM, "out of host memory");
    l->items[l->n].name = nm;
    l->items[l->n].tensor = l->owns_tensors ? fm_tensor_retain(t) : t;
    l->items[l->n].no_decay = no_decay;
    l->items[l->n].is_buffer = is_buffer;
    l->n++;
    return FM_OK;
}

int fm_named_list_find(const fm_named_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].name, name)) return i;
    return -1;
}

/* ---------------- initializers ---------------- */

static void fans(const fm_tensor *w, double *fan_in, double *fan_out) {
    if (w->ndim < 2) { *fan_in = *fan_out = (double)(w->ndim ? w->shape[0] : 1); return; }
    double rf = 1;
    for (int i = 2; i < w->ndim; i++) rf *= (double)w->shape[i];
    *fan_in = (double)w->shape[1] * rf;
    *fan_out = (double)w->shape[0] * rf;
}

fm_status fm_init_kaiming_normal_(fm_tensor *w, double gain, fm_rng *rng) {
    double fi, fo;
    fans(w, &fi, &fo);
    return fm_tensor_normal_(w, 0.0, gain / sqrt(fi), rng);
}

fm_status fm_init_kaiming_uniform_(fm_tensor *w, double gain, fm_rng *rng) {
    double fi, fo;
    fans(w, &fi, &fo);
    double bound = gain * sqrt(3.0 / fi);
    return fm_tensor_uniform_(w, -bound, bound, rng);
}

fm_status fm_init_xavier_uniform_(fm_tensor *w, double gain, fm_rng *rng) {
    double fi, fo;
    fans(w, &fi, &fo);
    double bound = gain * sqrt(6.0 / (fi + fo));
    return fm_tensor_uniform_(w, -bound, bound, rng);
}

fm_status fm_init_normal_(fm_tensor *w, double mean, double std, fm_rng *rng) {
    return fm_tensor_normal_(w, mean, std, rng);
}

/* ---------------- construction ---------------- */

/* num_batches_tracked += 1, where the counter lives (a device's memory is not the host's) */
static fm_status bn_count(fm_tensor *nb) {
    if (fm_tensor_device(nb).type == FM_DEV_CPU) {
        (*(int64_t *)fm_tensor_data(nb))++;
        return FM_OK;
    }
    if (fm_tensor_device(nb).type == FM_DEV_META) return FM_OK; /* no value to count, and the CPU makes no temporary */
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *n1 = fm_add_scalar(nb, 1.0);
    fm_status st = n1 ? fm_copy_(nb, n1) : fm_last_status();
    fm_set_grad_enabled(prev);
    fm_tensor_release(n1);
    return st;
}

static fm_module *mod_new(fm_module_kind kind) {
    fm_module *m = calloc(1, sizeof *m);
    if (!m) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    m->kind = kind;
    m->training = true;
    return m;
}

static fm_tensor *new_param(int ndim, const int64_t *shape) {
    fm_tensor *t = fm_tensor_zeros(ndim, shape, FM_F32, FM_CPU);
    if (t && fm_tensor_requires_grad_(t, true) != FM_OK) { fm_tensor_release(t); return NULL; }
    return t;
}

/* Weight init for one layer (weights and biases of linear/conv/embedding). */
static fm_status init_layer(fm_module *m, fm_init_kind kind, fm_rng *rng) {
    fm_status st = FM_OK;
    bool prev = fm_set_grad_enabled(false);
    if (m->kind == FM_MOD_EMBEDDING) {
        st = fm_tensor_normal_(m->weight, 0.0, kind == FM_INIT_NORMAL ? 0.02 : 1.0, rng);
    } else if (m->kind == FM_MOD_LINEAR || m->kind == FM_MOD_CONV2D) {
        double fi, fo;
        fans(m->weight, &fi, &fo);
        switch (kind) {
        case FM_INIT_DEFAULT: st = fm_init_kaiming_uniform_(m->weight, sqrt(1.0 / 3.0), rng); break;
        case FM_INIT_KAIMING: st = fm_init_kaiming_normal_(m->weight, sqrt(2.0), rng); break;
        case FM_INIT_XAVIER: st = fm_init_xavier_uniform_(m->weight, 1.0, rng); break;
        case FM_INIT_NORMAL: st = fm_init_normal_(m->weight, 0.0, 0.02, rng); break;
        }
        if (st == FM_OK && m->bias) {
            double bound = 1.0 / sqrt(fi);
            st = kind == FM_INIT_DEFAULT ? fm_tensor_uniform_(m->bias, -bound, bound, rng) : fm_zero_(m->bias);
        }
    }
    fm_set_grad_enabled(prev);
    return st;
}

fm_module *fm_nn_linear(int64_t in, int64_t out, bool bias, fm_rng *rng) {
    if (in < 1 || out < 1) {
        fm_set_error(FM_ERR_INVALID, "linear: in_features %lld and out_features %lld must be >= 1", (long long)in,
                     (long long)out);
        return NULL;
    }
    fm_module *m = mod_new(FM_MOD_LINEAR);
    if (!m) return NULL;
    m->a = in;
    m->b = out;
    int64_t ws[2] = {out, in};
    m->weight = new_param(2, ws);
    if (m->weight && bias) m->bias = new_param(1, &out);
    if (!m->weight || (bias && !m->bias) || init_layer(m, FM_INIT_DEFAULT, rng) != FM_OK) {
        fm_module_free(m);
        return NULL;
    }
    return m;
}

fm_module *fm_nn_conv2d(int64_t cin, int64_t cout, int kernel, int stride, int padding, bool bias, fm_rng *rng) {
    if (cin < 1 || cout < 1 || kernel < 1 || stride < 1 || padding < 0) {
        fm_set_error(FM_ERR_INVALID,
                     "conv2d: channels (%lld, %lld), kernel %d and stride %d must be >= 1 and padding %d >= 0",
                     (long long)cin, (long long)cout, kernel, stride, padding);
        return NULL;
    }
    fm_module *m = mod_new(FM_MOD_CONV2D);
    if (!m) return NULL;
    m->a = cin;
    m->b = cout;
    m->k = kernel;
    m->stride = stride;
    m->pad = padding;
    int64_t ws[4] = {cout, cin, kernel, kernel};
    m->weight = new_param(4, ws);
    if (m->weight && bias) m->bias = new_param(1, &cout);
    if (!m->weight || (bias && !m->bias) || init_layer(m, FM_INIT_DEFAULT, rng) != FM_OK) {
        fm_module_free(m);
        return NULL;
    }
    return m;
}

static fm_module *norm_new(fm_module_kind kind, const char *what, int64_t c, double eps, bool with_bias) {
    if (c < 1 || !(eps >= 0)) {
        fm_set_error(FM_ERR_INVALID, "%s: size %lld must be >= 1 and eps %g >= 0", what, (long long)c, eps);
        return NULL;
    }
    fm_module *m = mod_new(kind);
    if (!m) return NULL;
    m->a = c;
    m->eps = eps;
    m->weight = new_param(1, &c);
    if (m->weight) fm_fill_(m->weight, 1.0);
    if (m->weight && with_bias) m->bias = new_param(1, &c);
    if (!m->weight || (with_bias && !m->bias)) { fm_module_free(m); return NULL; }
    return m;
}

fm_module *fm_nn_batchnorm2d(int64_t c, double eps, double momentum) {
    if (!isfinite(momentum) || momentum < 0 || momentum > 1) {
        fm_set_error(FM_ERR_INVALID, "batchnorm2d: momentum %g must be in [0, 1]", momentum);
        return NULL;
    }
    fm_module *m = norm_new(FM_MOD_BATCHNORM2D, "batchnorm2d", c, eps, true);
    if (!m) return NULL;
    m->momentum = momentum;
    m->running_mean = fm_tensor_zeros(1, &c, FM_F32, FM_CPU);
    m->running_var = fm_tensor_ones(1, &c, FM_F32, FM_CPU);
    m->num_batches = fm_tensor_zeros(0, NULL, FM_I64, FM_CPU);
    if (!m->running_mean || !m->running_var || !m->num_batches) { fm_module_free(m); return NULL; }
    return m;
}

fm_module *fm_nn_layernorm(int64_t dim, double eps) { return norm_new(FM_MOD_LAYERNORM, "layernorm", dim, eps, true); }
fm_module *fm_nn_rmsnorm(int64_t dim, double eps) { return norm_new(FM_MOD_RMSNORM, "rmsnorm", dim, eps, false); }

fm_module *fm_nn_embedding(int64_t num, int64_t dim, fm_rng *rng) {
    if (num < 1 || dim < 1) {
        fm_set_error(FM_ERR_INVALID, "embedding: num %lld and dim %lld must be >= 1", (long long)num, (long long)dim);
        return NULL;
    }
    fm_module *m = mod_new(FM_MOD_EMBEDDING);
    if (!m) return NULL;
    m->a = num;
    m->b = dim;
    int64_t ws[2] = {num, dim};
    m->weight = new_param(2, ws);
    if (!m->weight || init_layer(m, FM_INIT_DEFAULT, rng) != FM_OK) { fm_module_free(m); return NULL; }
    return m;
}

fm_module *fm_nn_dropout(double p, fm_rng *rng) {
    if (!(p >= 0 && p < 1)) {
        fm_set_error(FM_ERR_INVALID, "dropout: p=%g must be in [0, 1)", p);
        return NULL;
    }
    fm_module *m = mod_new(FM_MOD_DROPOUT);
    if (!m) return NULL;
    m->p = p;
    m->rng = rng;
    return m;
}

fm_module *fm_nn_simple(fm_module_kind kind) {
    switch (kind) {
    case FM_MOD_RELU: case FM_MOD_GELU: case FM_MOD_SILU: case FM_MOD_TANH: case FM_MOD_SIGMOID: case FM_MOD_FLATTEN:
    case FM_MOD_MEANPOOL:
        return mod_new(kind);
    default:
        fm_set_error(FM_ERR_INVALID, "fm_nn_simple: kind %d is not a parameter-free layer", (int)kind);
        return NULL;
    }
}

static fm_module *pool_new(fm_module_kind kind, const char *what, int kernel, int stride, int padding) {
    if (stride == 0) stride = kernel;
    if (kernel < 1 || stride < 1 || padding < 0 || 2 * padding > kernel) {
        fm_set_error(FM_ERR_INVALID, "%s: kernel %d and stride %d must be >= 1, padding %d in [0, kernel/2]", what,
                     kernel, stride, padding);
        return NULL;
    }
    fm_module *m = mod_new(kind);
    if (!m) return NULL;
    m->k = kernel;
    m->stride = stride;
    m->pad = padding;
    return m;
}

fm_module *fm_nn_maxpool2d(int kernel, int stride, int padding) {
    return pool_new(FM_MOD_MAXPOOL2D, "maxpool2d", kernel, stride, padding);
}
fm_module *fm_nn_avgpool2d(int kernel, int stride, int padding) {
    return pool_new(FM_MOD_AVGPOOL2D, "avgpool2d", kernel, stride, padding);
}
fm_module *fm_nn_sequential(void) { return mod_new(FM_MOD_SEQUENTIAL); }

fm_status fm_sequential_add_named(fm_module *seq, const char *name, fm_module *child) {
    if (!child) return fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_INVALID, "sequential: child is NULL");
    if (!seq || seq->kind != FM_MOD_SEQUENTIAL) {
        fm_module_free(child);
        return fm_set_error(FM_ERR_INVALID, "sequential_add: the container is not a Sequential");
    }
    char idx[24];
    if (!name) { snprintf(idx, sizeof idx, "%d", seq->n_children); name = idx; }
    for (int i = 0; i < seq->n_children; i++)
        if (!strcmp(seq->child_names[i], name)) {
            fm_module_free(child);
            return fm_set_error(FM_ERR_INVALID, "sequential_add: a child named '%s' already exists", name);
        }
    if (seq->n_children == seq->cap) {
        int cap = seq->cap ? seq->cap * 2 : 8;
        fm_module **c = realloc(seq->children, (size_t)cap * sizeof *c);
        if (c) seq->children = c;
        char **nm = c ? realloc(seq->child_names, (size_t)cap * sizeof *nm) : NULL;
        if (nm) seq->child_names = nm;
        if (!c || !nm) { fm_module_free(child); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
        seq->cap = cap;
    }
    char *nm = strdup(name);
    if (!nm) { fm_module_free(child); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    child->training = seq->training;
    seq->children[seq->n_children] = child;
    seq->child_names[seq->n_children] = nm;
    seq->n_children++;
    return FM_OK;
}

fm_status fm_sequential_add(fm_module *seq, fm_module *child) { return fm_sequential_add_named(seq, NULL, child); }

void fm_module_free(fm_module *m) {
    if (!m) return;
    for (int i = 0; i < m->n_children; i++) {
        fm_module_free(m->children[i]);
        free(m->child_names[i]);
    }
    free(m->children);
    free(m->child_names);
    free(m->blocks);
    fm_tensor_release_n(5, m->weight, m->bias, m->running_mean, m->running_var, m->num_batches);
    free(m);
}

fm_module *fm_sequential(int n, ...) {
    va_list ap;
    va_start(ap, n);
    fm_module *seq = fm_nn_sequential();
    fm_status st = seq ? FM_OK : fm_last_status();
    for (int i = 0; i < n; i++) {
        fm_module *c = va_arg(ap, fm_module *);
        if (st == FM_OK) st = fm_sequential_add(seq, c);
        else fm_module_free(c);
    }
    va_end(ap);
    if (st != FM_OK) { fm_module_free(seq); return NULL; }
    return seq;
}

fm_module *fm_linear_new(int64_t in, int64_t out, bool bias) { return fm_nn_linear(in, out, bias, NULL); }
fm_module *fm_relu_new(void) { return fm_nn_simple(FM_MOD_RELU); }

/* ---------------- description and shapes ---------------- */

static const char *kind_name(fm_module_kind k) {
    static const char *names[FM_MOD_KIND_COUNT] = {
        "linear", "conv2d", "batchnorm2d", "layernorm", "rmsnorm", "embedding", "dropout", "relu", "gelu",
        "silu", "tanh", "sigmoid", "maxpool2d", "avgpool2d", "flatten", "sequential", "meanpool"};
    return (unsigned)k < FM_MOD_KIND_COUNT ? names[k] : "?";
}

const char *fm_module_describe(const fm_module *m, char *buf, size_t n) {
    switch (m->kind) {
    case FM_MOD_LINEAR: snprintf(buf, n, "linear %lld->%lld", (long long)m->a, (long long)m->b); break;
    case FM_MOD_CONV2D:
        snprintf(buf, n, "conv2d %lld->%lld k%d s%d p%d", (long long)m->a, (long long)m->b, m->k, m->stride, m->pad);
        break;
    case FM_MOD_BATCHNORM2D: case FM_MOD_LAYERNORM: case FM_MOD_RMSNORM:
        snprintf(buf, n, "%s %lld", kind_name(m->kind), (long long)m->a);
        break;
    case FM_MOD_EMBEDDING: snprintf(buf, n, "embedding %lldx%lld", (long long)m->a, (long long)m->b); break;
    case FM_MOD_DROPOUT: snprintf(buf, n, "dropout p=%g", m->p); break;
    case FM_MOD_MAXPOOL2D: case FM_MOD_AVGPOOL2D:
        snprintf(buf, n, "%s k%d s%d p%d", kind_name(m->kind), m->k, m->stride, m->pad);
        break;
    case FM_MOD_SEQUENTIAL: snprintf(buf, n, "sequential (%d layers)", m->n_children); break;
    default: snprintf(buf, n, "%s", kind_name(m->kind)); break;
    }
    return buf;
}

fm_module_kind fm_module_get_kind(const fm_module *m) { return m->kind; }
fm_module_hparams fm_module_get_hparams(const fm_module *m) {
    return (fm_module_hparams){m->a, m->b, m->k, m->stride, m->pad, m->eps, m->momentum, m->p};
}
int fm_module_num_children(const fm_module *m) { return m->n_children; }
fm_module *fm_module_child(const fm_module *m, int i) { return i >= 0 && i < m->n_children ? m->children[i] : NULL; }
const char *fm_module_child_name(const fm_module *m, int i) { return i >= 0 && i < m->n_children ? m->child_names[i] : NULL; }

static fm_status shape_err(const fm_module *m, const char *expect, int ndim, const int64_t *in) {
    char d[96], s[96];
    return fm_set_error(FM_ERR_INVALID, "%s expects %s, got %s", fm_module_describe(m, d, sizeof d), expect,
                        fm_shape_str(ndim, in, s, sizeof s));
}

static fm_status infer_one(const fm_module *m, int ndim, const int64_t *in, int *on, int64_t *out) {
    char e[96];
    *on = ndim;
    for (int i = 0; i < ndim; i++) out[i] = in[i];
    switch (m->kind) {
    case FM_MOD_LINEAR:
        if (ndim < 1 || in[ndim - 1] != m->a) {
            snprintf(e, sizeof e, "input [..., %lld] (add a flatten layer before it for images)", (long long)m->a);
            return shape_err(m, e, ndim, in);
        }
        out[ndim - 1] = m->b;
        return FM_OK;
    case FM_MOD_CONV2D: {
        if (ndim != 4 || in[1] != m->a) {
            snprintf(e, sizeof e, "input [N, %lld, H, W]", (long long)m->a);
            return shape_err(m, e, ndim, in);
        }
        out[1] = m->b;
        for (int i = 2; i < 4; i++) {
            int64_t padded = in[i] + 2 * (int64_t)m->pad;
            if (padded < m->k) return shape_err(m, "an input at least as large as its kernel", ndim, in);
            out[i] = (padded - m->k) / m->stride + 1;
        }
        return FM_OK;
    }
    case FM_MOD_MAXPOOL2D: case FM_MOD_AVGPOOL2D:
        if (ndim != 4) return shape_err(m, "input [N, C, H, W]", ndim, in);
        for (int i = 2; i < 4; i++) {
            int64_t padded = in[i] + 2 * (int64_t)m->pad;
            if (padded < m->k) return shape_err(m, "an input at least as large as its kernel", ndim, in);
            out[i] = (padded - m->k) / m->stride + 1;
        }
        return FM_OK;
    case FM_MOD_BATCHNORM2D:
        if (ndim != 4 || in[1] != m->a) {
            snprintf(e, sizeof e, "input [N, %lld, H, W]", (long long)m->a);
            return shape_err(m, e, ndim, in);
        }
        return FM_OK;
    case FM_MOD_LAYERNORM: case FM_MOD_RMSNORM:
        if (ndim < 1 || in[ndim - 1] != m->a) {
            snprintf(e, sizeof e, "input [..., %lld]", (long long)m->a);
            return shape_err(m, e, ndim, in);
        }
        return FM_OK;
    case FM_MOD_EMBEDDING:
        if (ndim + 1 > FM_MAX_DIMS) return shape_err(m, "fewer dims", ndim, in);
        out[ndim] = m->b;
        *on = ndim + 1;
        return FM_OK;
    case FM_MOD_MEANPOOL: /* token vectors [batch, tokens, dim], e.g. an embedding's output */
        if (ndim != 3 || in[1] < 1) return shape_err(m, "[batch, tokens, dim] with tokens >= 1", ndim, in);
        out[0] = in[0];
        out[1] = in[2];
        *on = 2;
        return FM_OK;
    case FM_MOD_FLATTEN: {
        if (ndim < 1) return shape_err(m, "input with a batch dim", ndim, in);
        int64_t p = 1;
        for (int i = 1; i < ndim; i++) p *= in[i];
        *on = 2;
        out[1] = p;
        if (ndim == 1) *on = 1;
        return FM_OK;
    }
    case FM_MOD_SEQUENTIAL: {
        int cn = ndim;
        int64_t cur[FM_MAX_DIMS];
        for (int i = 0; i < ndim; i++) cur[i] = in[i];
        for (int i = 0; i < m->n_children; i++) {
            int nn;
            int64_t nx[FM_MAX_DIMS];
            if (fm_module_infer_shape(m->children[i], cn, cur, &nn, nx) != FM_OK) {
                fm_error_prefix("layer %s", m->child_names[i]);
                return fm_last_status();
            }
            cn = nn;
            for (int j = 0; j < nn; j++) cur[j] = nx[j];
        }
        *on = cn;
        for (int i = 0; i < cn; i++) out[i] = cur[i];
        return FM_OK;
    }
    default: return FM_OK; /* elementwise: shape unchanged */
    }
}

fm_status fm_module_infer_shape(const fm_module *m, int ndim, const int64_t *in, int *out_ndim, int64_t *out) {
    if (!m || ndim < 0 || ndim > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "infer_shape: bad arguments");
    return infer_one(m, ndim, in, out_ndim, out);
}

/* ---------------- forward ---------------- */

static fm_tensor *forward_one(fm_module *m, fm_tensor *x) {
    switch (m->kind) {
    /* bf16 autocast on the CPU: the products in bf16 on f32 activations (fm_mixed_lowp) */
    case FM_MOD_LINEAR:
        if (fm_mixed_lowp(x, m->weight) == FM_BF16) return fm_linear_mixed(x, m->weight, m->bias, FM_BF16);
        return fm_linear(x, m->weight, m->bias);
    case FM_MOD_CONV2D: {
        fm_conv2d_params p = fm_conv2d_default_params();
        p.stride[0] = p.stride[1] = m->stride;
        p.padding[0] = p.padding[1] = m->pad;
        if (fm_mixed_lowp(x, m->weight) == FM_BF16) return fm_conv2d_mixed(x, m->weight, m->bias, &p, FM_BF16);
        return fm_conv2d(x, m->weight, m->bias, &p);
    }
    case FM_MOD_BATCHNORM2D: {
        fm_tensor *y = fm_batch_norm(x, m->weight, m->bias, m->running_mean, m->running_var, m->training, m->momentum,
                                     m->eps, FM_NCHW);
        if (y && m->training && bn_count(m->num_batches) != FM_OK) {
            fm_tensor_release(y);
            return NULL;
        }
        return y;
    }
    case FM_MOD_LAYERNORM: return fm_layer_norm(x, 1, m->weight, m->bias, m->eps);
    case FM_MOD_RMSNORM: return fm_rms_norm(x, m->weight, m->eps);
    case FM_MOD_EMBEDDING: return fm_embedding(m->weight, x);
    case FM_MOD_DROPOUT: return fm_dropout(x, m->p, m->training, m->rng);
    case FM_MOD_RELU: return fm_relu(x);
    case FM_MOD_GELU: return fm_gelu(x);
    case FM_MOD_SILU: return fm_silu(x);
    case FM_MOD_TANH: return fm_tanh(x);
    case FM_MOD_SIGMOID: return fm_sigmoid(x);
    case FM_MOD_MAXPOOL2D: case FM_MOD_AVGPOOL2D: {
        fm_pool2d_params p;
        memset(&p, 0, sizeof p);
        p.kernel[0] = p.kernel[1] = m->k;
        p.stride[0] = p.stride[1] = m->stride;
        p.padding[0] = p.padding[1] = m->pad;
        p.count_include_pad = true;
        p.layout = FM_NCHW;
        return m->kind == FM_MOD_MAXPOOL2D ? fm_max_pool2d(x, &p) : fm_avg_pool2d(x, &p);
    }
    case FM_MOD_FLATTEN: return x->ndim <= 1 ? fm_tensor_retain(x) : fm_flatten(x, 1, -1);
    case FM_MOD_MEANPOOL: return fm_mean(x, 1, (const int[]){1}, false);
    case FM_MOD_SEQUENTIAL: {
        fm_tensor *cur = fm_tensor_retain(x);
        for (int i = 0; i < m->n_children && cur; i++) {
            fm_tensor *next = fm_module_forward(m->children[i], cur);
            if (!next) {
                char d[96];
                fm_error_prefix("layer %s (%s)", m->child_names[i], fm_module_describe(m->children[i], d, sizeof d));
            }
            fm_tensor_release(cur);
            cur = next;
        }
        return cur;
    }
    default: fm_set_error(FM_ERR_INTERNAL, "module kind %d has no forward", (int)m->kind); return NULL;
    }
}

fm_tensor *fm_module_forward(fm_module *m, fm_tensor *x) {
    if (!m || !x) { fm_set_error(FM_ERR_INVALID, "module_forward: %s is NULL", m ? "input" : "module"); return NULL; }
    return forward_one(m, x);
}

/* ---------------- traversal ---------------- */

void fm_module_train(fm_module *m, bool training) {
    m->training = training;
    for (int i = 0; i < m->n_children; i++) fm_module_train(m->children[i], training);
}
bool fm_module_is_training(const fm_module *m) { return m->training; }

void fm_module_set_rng(fm_module *m, fm_rng *rng) {
    if (m->kind == FM_MOD_DROPOUT) m->rng = rng;
    for (int i = 0; i < m->n_children; i++) fm_module_set_rng(m->children[i], rng);
}

static fm_status collect(fm_module *m, const char *prefix, fm_named_list *out, bool buffers) {
    char name[512];
    bool norm = m->kind == FM_MOD_BATCHNORM2D || m->kind == FM_MOD_LAYERNORM || m->kind == FM_MOD_RMSNORM;
#define PUSH(t, nm, nd, buf) do { if (t) { snprintf(name, sizeof name, "%s%s", prefix, nm); \
        fm_status _s = fm_named_list_push(out, name, t, nd, buf); if (_s) return _s; } } while (0)
    PUSH(m->weight, "weight", norm, false);
    PUSH(m->bias, "bias", true, false);
    if (buffers) {
        PUSH(m->running_mean, "running_mean", true, true);
        PUSH(m->running_var, "running_var", true, true);
        PUSH(m->num_batches, "num_batches_tracked", true, true);
    }
#undef PUSH
    for (int i = 0; i < m->n_children; i++) {
        snprintf(name, sizeof name, "%s%s.", prefix, m->child_names[i]);
        char *pre = strdup(name);
        if (!pre) return fm_set_error(FM_ERR_OOM, "out of host memory");
        fm_status st = collect(m->children[i], pre, out, buffers);
        free(pre);
        if (st) return st;
    }
    return FM_OK;
}

fm_status fm_module_parameters(fm_module *m, fm_named_list *out) {
    memset(out, 0, sizeof *out);
    fm_status st = collect(m, "", out, false);
    if (st) fm_named_list_free(out);
    return st;
}

fm_status fm_module_state(fm_module *m, fm_named_list *out) {
    memset(out, 0, sizeof *out);
    fm_status st = collect(m, "", out, true);
    if (st) fm_named_list_free(out);
    return st;
}

int64_t fm_module_num_params(fm_module *m) {
    int64_t n = 0;
    if (m->weight) n += fm_tensor_numel(m->weight);
    if (m->bias) n += fm_tensor_numel(m->bias);
    for (int i = 0; i < m->n_children; i++) n += fm_module_num_params(m->children[i]);
    return n;
}

void fm_module_zero_grad(fm_module *m) {
    if (m->weight) fm_tensor_zero_grad(m->weight);
    if (m->bias) fm_tensor_zero_grad(m->bias);
    for (int i = 0; i < m->n_children; i++) fm_module_zero_grad(m->children[i]);
}

fm_status fm_module_init(fm_module *m, fm_init_kind kind, fm_rng *rng) {
    fm_status st = init_layer(m, kind, rng);
    for (int i = 0; i < m->n_children && st == FM_OK; i++) st = fm_module_init(m->children[i], kind, rng);
    return st;
}

/* Moves the layer's own tensors (parameters with their gradients, running
 * statistics) in place, so pointers the caller holds stay valid. */
static fm_status move_layer(fm_module *m, fm_device dev) {
    fm_tensor *ts[] = {m->weight, m->bias, m->running_mean, m->running_var, m->num_batches};
    fm_status st = FM_OK;
    for (size_t i = 0; i < sizeof ts / sizeof *ts && st == FM_OK; i++)
        if (ts[i]) st = fm_tensor_move_(ts[i], dev);
    for (int i = 0; i < m->n_children && st == FM_OK; i++) st = move_layer(m->children[i], dev);
    return st;
}

fm_status fm_module_to(fm_module *m, fm_device dev) {
    if (!m) return fm_set_error(FM_ERR_INVALID, "module_to: module is NULL");
    fm_status st = fm_device_validate(dev);
    if (st != FM_OK) return st;
    fm_mem_category prev = fm_memory_tag_push(FM_MEM_WEIGHTS);
    st = move_layer(m, dev);
    fm_memory_tag_pop(prev);
    if (st != FM_OK) {
        char dn[32], msg[512];
        snprintf(msg, sizeof msg, "%s", fm_last_error());
        return fm_set_error(st, "module_to %s: %s (the module may be partly moved: move it again or free it)",
                            fm_device_name(dev, dn, sizeof dn), msg);
    }
    return FM_OK;
}

/* ---------------- per-block activation checkpointing ---------------- */

/* A block of a sequential conv net: its layers up to and including a pooling layer.
 * fm_module_forward_blocks runs each block under fm_checkpoint, so only the blocks'
 * inputs are kept and the rest is recomputed in the backward. The recomputation
 * must not repeat the forward's side effects or draw other random numbers: batch
 * norm there uses the batch statistics without touching the running ones or the
 * counter, and each dropout's generator is put back to where the forward found it
 * (fm_checkpoint restores only the global one). The state lives in the module until
 * the next forward, as the recomputation happens during the backward. */
#define BLOCK_MAX_RNG 16
struct block_state {
    fm_module *seq;
    int lo, hi; /* children [lo, hi] */
    int n_rng;
    fm_rng *rng[BLOCK_MAX_RNG];
    fm_rng before[BLOCK_MAX_RNG];
};

static bool is_pool(const fm_module *m) { return m->kind == FM_MOD_MAXPOOL2D || m->kind == FM_MOD_AVGPOOL2D; }

int fm_module_num_blocks(const fm_module *m) {
    int n = 0;
    if (m && m->kind == FM_MOD_SEQUENTIAL)
        for (int i = 0; i < m->n_children; i++) n += is_pool(m->children[i]);
    return n;
}

/* The forward calls it with grad off (fm_checkpoint), the backward's recomputation with grad on. */
static fm_status block_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    struct block_state *b = ctx;
    const bool recompute = fm_grad_enabled();
    fm_rng now[BLOCK_MAX_RNG];
    for (int i = 0; i < b->n_rng; i++) now[i] = *b->rng[i];
    for (int i = b->n_rng - 1; recompute && i >= 0; i--) *b->rng[i] = b->before[i]; /* a shared one: its first state */
    fm_tensor *cur = fm_tensor_retain(in[0]);
    for (int i = b->lo; i <= b->hi && cur; i++) {
        fm_module *c = b->seq->children[i];
        fm_tensor *next = recompute && c->kind == FM_MOD_BATCHNORM2D && c->training
                              ? fm_batch_norm(cur, c->weight, c->bias, NULL, NULL, true, c->momentum, c->eps, FM_NCHW)
                              : fm_module_forward(c, cur);
        if (!next) {
            char d[96];
            fm_error_prefix("layer %s (%s)", b->seq->child_names[i], fm_module_describe(c, d, sizeof d));
        }
        fm_tensor_release(cur);
        cur = next;
    }
    if (recompute)
        for (int i = 0; i < b->n_rng; i++) *b->rng[i] = now[i];
    out[0] = cur;
    return cur ? FM_OK : fm_last_status();
}

fm_tensor *fm_module_forward_blocks(fm_module *m, fm_tensor *x) {
    int nb = fm_module_num_blocks(m);
    if (!nb || !fm_grad_enabled() || !x) return fm_module_forward(m, x);
    if (m->n_blocks < nb) {
        struct block_state *bs = realloc(m->blocks, (size_t)nb * sizeof *bs);
        if (!bs) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
        m->blocks = bs;
        m->n_blocks = nb;
    }
    /* the checkpoint node (and so the blocks' parameter gradients, made in its backward)
     * exists only for an input that requires grad: the data batch is made one */
    fm_tensor *cur = x->requires_grad ? fm_tensor_retain(x) : fm_detach(x);
    if (cur && !cur->requires_grad && fm_tensor_requires_grad_(cur, true) != FM_OK) { fm_tensor_release(cur); return NULL; }
    int lo = 0, k = 0;
    for (int i = 0; i < m->n_children && cur; i++) {
        if (!is_pool(m->children[i])) continue;
        struct block_state *b = &m->blocks[k++];
        *b = (struct block_state){.seq = m, .lo = lo, .hi = i};
        for (int j = lo; j <= i; j++) {
            fm_module *c = m->children[j];
            if (c->kind != FM_MOD_DROPOUT || !c->rng || !c->training) continue;
            if (b->n_rng == BLOCK_MAX_RNG) { fm_set_error(FM_ERR_UNSUPPORTED, "checkpointing: more than %d dropout layers in one block", BLOCK_MAX_RNG); fm_tensor_release(cur); return NULL; }
            b->rng[b->n_rng] = c->rng;
            b->before[b->n_rng++] = *c->rng;
        }
        fm_tensor *next = NULL;
        if (fm_checkpoint(block_fn, b, 1, &cur, 1, &next) != FM_OK) next = NULL;
        fm_tensor_release(cur);
        cur = next;
        lo = i + 1;
    }
    for (int i = lo; i < m->n_children && cur; i++) { /* the tail after the last block, as usual */
        fm_tensor *next = fm_module_forward(m->children[i], cur);
        if (!next) {
            char d[96];
            fm_error_prefix("layer %s (%s)", m->child_names[i], fm_module_describe(m->children[i], d, sizeof d));
        }
        fm_tensor_release(cur);
        cur = next;
    }
    return cur;
}
