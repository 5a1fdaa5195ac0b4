/* `fathom plan --model <recipe>`: the peak memory of fathom's own CPU training
 * run for a recipe, replayed from how the trainer and each op allocate.
 *
 * This file covers the sequential recipes `fathom train` runs
 * (src/recipe/train.c) and the shared parts (recipe detection, rendering);
 * plan_fathom_gpt.c covers GPT recipes. Every allocation below names the line
 * of fathom it stands for, so a change there is easy to carry over; the
 * validation test (tests/test_plan_fathom.c) runs the real trainer and fails
 * when the two drift apart by more than 10%. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ini.h>
#include <jansson.h>
#include <zlib.h>

#include "fathom/recipe.h"
#include "plan/plan_fathom.h"

void fm_plan_run_defaults(fm_plan_run_opts *o) {
    memset(o, 0, sizeof *o);
    o->precision = FM_PLAN_FP32;
    o->eval = 1;
    o->grad_accum = 1;
}

void fm_plan_run_free(fm_plan_run *r) {
    if (!r) return;
    free(r->explain);
    r->explain = NULL;
}

/* ---------------- what kind of recipe ---------------- */

static int is_regular(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int fm_plan_is_recipe(const char *model) {
    if (!model || !*model) return 0;
    size_t n = strlen(model);
    if (n > 4 && !strcmp(model + n - 4, ".ini")) return 1;
    struct stat st;
    if (stat(model, &st) == 0) return 0; /* an existing model file or directory */
    char path[PATH_MAX];
    return fm_recipe_resolve(model, path, sizeof path) && is_regular(path);
}

static int gpt_key(void *user, const char *section, const char *key, const char *value) {
    if (!strcmp(section, "model") && !strcmp(key, "type")) *(int *)user = !strcmp(value, "gpt") ? 1 : 2;
    return 1;
}

/* ---------------- sequential recipes: layers ---------------- */

enum seq_kind { L_LINEAR, L_CONV, L_BN, L_LN, L_RMS, L_DROPOUT, L_MAXPOOL, L_AVGPOOL, L_FLATTEN, L_UNARY, L_UNARY_Y };

typedef struct seq_layer {
    enum seq_kind kind;
    char name[16];
    int line;
    int64_t in_features, out_features; /* linear; conv: channels */
    int k, stride, pad;
    double p;
    int bias;
    int in_nd, out_nd;
    int64_t in[FM_MAX_DIMS], out[FM_MAX_DIMS]; /* per sample (no batch dim) */
} seq_layer;

static int64_t prod(int nd, const int64_t *s) {
    int64_t p = 1;
    for (int i = 0; i < nd; i++) p *= s[i];
    return p;
}

static const char *shape_txt(int nd, const int64_t *s, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[N");
    for (int i = 0; i < nd && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, ", %lld", (long long)s[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

static const char *kw_find(int n, char keys[][32], char vals[][32], const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(keys[i], key)) return vals[i];
    return NULL;
}

/* Reads one `layer =` spec the way fm_recipe_build_model does (same defaults:
 * conv stride 1 padding 0, pooling stride = kernel, dropout 0.5, biases on). */
static fm_status parse_layer(const fm_recipe *r, const fm_recipe_layer *L, int nd, const int64_t *in, seq_layer *o) {
    memset(o, 0, sizeof *o);
    o->line = L->line;
    o->in_nd = nd;
    memcpy(o->in, in, sizeof(int64_t) * (size_t)nd);
    char buf[192], kind[32] = "";
    snprintf(buf, sizeof buf, "%s", L->spec);
    double pos[4];
    int npos = 0, tokn = 0;
    char keys[8][32], vals[8][32];
    int nkw = 0;
    for (char *tok = strtok(buf, " \t"); tok; tok = strtok(NULL, " \t"), tokn++) {
        if (tokn == 0) { snprintf(kind, sizeof kind, "%s", tok); continue; }
        char *eq = strchr(tok, '=');
        if (eq) {
            if (nkw == 8) goto bad_args;
            *eq = 0;
            snprintf(keys[nkw], 32, "%s", tok);
            snprintf(vals[nkw], 32, "%s", eq + 1);
            nkw++;
            continue;
        }
        char *end;
        if (npos == 4) goto bad_args;
        pos[npos++] = strtod(tok, &end);
        if (end == tok || *end) goto bad_args;
    }
    snprintf(o->name, sizeof o->name, "%.15s", kind);
#define KW(k) kw_find(nkw, keys, vals, k)
    const char *v = KW("bias");
    o->bias = !v || strcmp(v, "false");
    o->out_nd = nd;
    memcpy(o->out, in, sizeof(int64_t) * (size_t)nd);
    char s1[96];
    if (!strcmp(kind, "linear")) {
        if (npos < 1 || npos > 2) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s': expected 'linear OUT' or 'linear IN OUT'", r->path, L->line, L->spec);
        if (nd != 1)
            return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s' expects input [N, features] but the previous layers give %s "
                                "(add 'layer = flatten' before it)", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
        o->kind = L_LINEAR;
        o->in_features = npos == 2 ? (int64_t)pos[0] : in[0];
        o->out_features = (int64_t)pos[npos - 1];
        if (o->in_features != in[0] || o->out_features < 1)
            return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s' does not fit input %s", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
        o->out[0] = o->out_features;
    } else if (!strcmp(kind, "conv2d")) {
        if (npos != 2) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s': expected 'conv2d OUT_CHANNELS KERNEL [stride=S] [padding=P]'", r->path, L->line, L->spec);
        if (nd != 3) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s' expects input [N, C, H, W] but the previous layers give %s", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
        o->kind = L_CONV;
        o->stride = (v = KW("stride")) ? atoi(v) : 1;
        o->pad = (v = KW("padding")) ? atoi(v) : 0;
        o->in_features = (v = KW("in")) ? atoll(v) : in[0];
        o->out_features = (int64_t)pos[0];
        o->k = (int)pos[1];
        if (o->in_features != in[0] || o->out_features < 1 || o->k < 1 || o->stride < 1 || o->pad < 0)
            return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s' does not fit input %s", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
        o->out[0] = o->out_features;
        for (int i = 1; i < 3; i++) {
            int64_t padded = in[i] + 2 * (int64_t)o->pad;
            if (padded < o->k) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s': the kernel is larger than the input %s", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
            o->out[i] = (padded - o->k) / o->stride + 1;
        }
    } else if (!strcmp(kind, "batchnorm2d")) {
        if (nd != 3) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s' expects input [N, C, H, W] but the previous layers give %s", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
        o->kind = L_BN;
    } else if (!strcmp(kind, "layernorm") || !strcmp(kind, "rmsnorm")) {
        o->kind = kind[0] == 'l' ? L_LN : L_RMS;
    } else if (!strcmp(kind, "dropout")) {
        o->kind = L_DROPOUT;
        o->p = npos ? pos[0] : 0.5;
    } else if (!strcmp(kind, "maxpool2d") || !strcmp(kind, "avgpool2d")) {
        if (npos != 1) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s': expected '%s KERNEL [stride=S] [padding=P]'", r->path, L->line, L->spec, kind);
        if (nd != 3) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s' expects input [N, C, H, W] but the previous layers give %s", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
        o->kind = kind[0] == 'm' ? L_MAXPOOL : L_AVGPOOL;
        o->k = (int)pos[0];
        o->stride = (v = KW("stride")) ? atoi(v) : 0;
        if (o->stride == 0) o->stride = o->k;
        o->pad = (v = KW("padding")) ? atoi(v) : 0;
        if (o->k < 1 || o->stride < 1 || o->pad < 0 || 2 * o->pad > o->k)
            return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s': kernel and stride must be >= 1, padding at most half the kernel", r->path, L->line, L->spec);
        for (int i = 1; i < 3; i++) {
            int64_t padded = in[i] + 2 * (int64_t)o->pad;
            if (padded < o->k) return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s': the kernel is larger than the input %s", r->path, L->line, L->spec, shape_txt(nd, in, s1, sizeof s1));
            o->out[i] = (padded - o->k) / o->stride + 1;
        }
    } else if (!strcmp(kind, "flatten")) {
        o->kind = L_FLATTEN;
        o->out_nd = 1;
        o->out[0] = prod(nd, in);
    } else if (!strcmp(kind, "relu") || !strcmp(kind, "gelu") || !strcmp(kind, "silu")) {
        o->kind = L_UNARY;
    } else if (!strcmp(kind, "tanh") || !strcmp(kind, "sigmoid")) {
        o->kind = L_UNARY_Y; /* their backward reads the output too */
    } else if (!strcmp(kind, "embedding")) {
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s:%d: layer '%s': the planner does not model embedding layers in "
                            "sequential recipes (their inputs are images)", r->path, L->line, L->spec);
    } else {
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: unknown layer '%s'", r->path, L->line, kind);
    }
#undef KW
    return FM_OK;
bad_args:
    return fm_set_error(FM_ERR_FORMAT, "%s:%d: layer '%s': expected numbers and key=value options", r->path, L->line, L->spec);
}

/* Parameter tensors of a layer in the order the module creates them; buffers
 * (BatchNorm's running stats and batch count) are weights too but get no
 * gradient. Returns the count; sizes in elements, bytes per element in es. */
static int layer_tensors(const seq_layer *l, double *elems, double *es, int *is_param) {
    int n = 0;
#define T(e, b, p) do { elems[n] = (e); es[n] = (b); is_param[n] = (p); n++; } while (0)
    switch (l->kind) {
    case L_LINEAR: T((double)l->out_features * (double)l->in_features, 4, 1); if (l->bias) T((double)l->out_features, 4, 1); break;
    case L_CONV:
        T((double)l->out_features * (double)l->in_features * l->k * l->k, 4, 1);
        if (l->bias) T((double)l->out_features, 4, 1);
        break;
    case L_BN: T((double)l->in[0], 4, 1); T((double)l->in[0], 4, 1); T((double)l->in[0], 4, 0); T((double)l->in[0], 4, 0); T(1, 8, 0); break;
    case L_LN: T((double)l->in[l->in_nd - 1], 4, 1); T((double)l->in[l->in_nd - 1], 4, 1); break;
    case L_RMS: T((double)l->in[l->in_nd - 1], 4, 1); break;
    default: break;
    }
#undef T
    return n;
}

/* ---------------- sequential recipes: the replay ---------------- */

typedef struct seq_ctx {
    pf_sim *s;
    const seq_layer *L;
    int n;
    int64_t B;
    int *saved;      /* per layer: up to 4 saved buffer ids (-1) */
    int *has_node;   /* per layer: a tape node exists */
    int *rg_in;      /* per layer: its input requires grad */
    int *leaf_ids;   /* gradient sums handed to parameters, in the order the walk meets them */
    int n_leaf;
} seq_ctx;

#define SAVED(i, k) c->saved[(i) * 4 + (k)]

/* conv2d's CPU kernel (src/backend/cpu/conv2d_cpu.c): im2col columns for a chunk
 * of samples bounded by 1 MiB, plus a [Og, chunk*P] staging buffer when the
 * per-sample GEMM is not used (conv_direct). Forward and backward alike. */
static void conv_scratch(pf_sim *s, const seq_layer *l, int64_t B) {
    int64_t P = l->out[1] * l->out[2], K = l->in_features * l->k * l->k;
    if (l->k == 1 && l->stride == 1 && l->pad == 0) return; /* pointwise: straight GEMMs */
    int64_t per = K * P > 0 ? K * P : 1, nc = ((int64_t)1 << 20) / 4 / per;
    if (nc < 1) nc = 1;
    if (nc > B) nc = B;
    int cols = pf_alloc(s, PF_WORK, (double)(K * nc * P), 4, "im2col");
    int tmp = (nc == 1 || P >= 256) ? -1 : pf_alloc(s, PF_WORK, (double)(l->out_features * nc * P), 4, "conv staging");
    pf_unref(s, cols);
    pf_unref(s, tmp);
}

/* One layer's forward: returns the output buffer (one reference, the caller's). */
static int seq_forward(seq_ctx *c, int i, int x, int rg) {
    pf_sim *s = c->s;
    const seq_layer *l = &c->L[i];
    double in_n = (double)c->B * (double)prod(l->in_nd, l->in), out_n = (double)c->B * (double)prod(l->out_nd, l->out);
    int has_params = l->kind == L_LINEAR || l->kind == L_CONV || l->kind == L_BN || l->kind == L_LN || l->kind == L_RMS;
    int node = rg || has_params;
    c->rg_in[i] = rg;
    c->has_node[i] = node;
    for (int k = 0; k < 4; k++) SAVED(i, k) = -1;
    pf_phase(s, "forward %d %s", i + 1, l->name);
    int y = -1;
    switch (l->kind) {
    case L_LINEAR: { /* src/ops/matmul.c linear_node: matmul, then the bias add into a new tensor */
        int t = pf_alloc(s, PF_ACT, out_n, 4, "matmul");
        if (l->bias) { y = pf_alloc(s, PF_ACT, out_n, 4, "linear out"); pf_unref(s, t); }
        else y = t;
        pf_ref(s, x); SAVED(i, 0) = x;
        break;
    }
    case L_CONV:
        y = pf_alloc(s, PF_ACT, out_n, 4, "conv out");
        conv_scratch(s, l, c->B);
        pf_ref(s, x); SAVED(i, 0) = x;
        break;
    case L_BN: { /* src/ops/batchnorm.c: y, batch mean and 1/std; the kernel's f64 statistics */
        y = pf_alloc(s, PF_ACT, out_n, 4, "bn out");
        int m = pf_alloc(s, PF_ACT, (double)l->in[0], 4, "bn mean"), r = pf_alloc(s, PF_ACT, (double)l->in[0], 4, "bn rstd");
        pf_unref(s, pf_alloc(s, PF_WORK, 4.0 * (double)l->in[0], 8, "bn stats"));
        pf_ref(s, x); SAVED(i, 0) = x; SAVED(i, 1) = m; SAVED(i, 2) = r;
        break;
    }
    case L_LN: case L_RMS: { /* src/ops/norm.c: y, f32 mean (layer norm) and rstd per row */
        double rows = in_n / (double)l->in[l->in_nd - 1];
        y = pf_alloc(s, PF_ACT, out_n, 4, "norm out");
        int m = l->kind == L_LN ? pf_alloc(s, PF_ACT, rows, 4, "norm mean") : -1;
        int r = pf_alloc(s, PF_ACT, rows, 4, "norm rstd");
        pf_ref(s, x); SAVED(i, 0) = x; SAVED(i, 1) = m; SAVED(i, 2) = r;
        break;
    }
    case L_DROPOUT: /* src/ops/dropout.c: y and a u8 mask; only the mask is saved */
        if (l->p == 0) { pf_ref(s, x); y = x; break; }
        y = pf_alloc(s, PF_ACT, out_n, 4, "dropout out");
        SAVED(i, 0) = pf_alloc(s, PF_ACT, out_n, 1, "dropout mask");
        if (!node) { pf_unref(s, SAVED(i, 0)); SAVED(i, 0) = -1; }
        break;
    case L_MAXPOOL: /* src/ops/pool.c: y and the i64 argmax of every window, both kept */
        y = pf_alloc(s, PF_ACT, out_n, 4, "maxpool out");
        SAVED(i, 1) = pf_alloc(s, PF_ACT, out_n, 8, "maxpool argmax");
        if (node) { pf_ref(s, x); SAVED(i, 0) = x; }
        else { pf_unref(s, SAVED(i, 1)); SAVED(i, 1) = -1; }
        break;
    case L_AVGPOOL:
        y = pf_alloc(s, PF_ACT, out_n, 4, "avgpool out");
        break;
    case L_FLATTEN: /* a view: same storage */
        pf_ref(s, x);
        y = x;
        break;
    case L_UNARY: case L_UNARY_Y: /* src/ops/elementwise.c unary(): saves x (and y for tanh/sigmoid) */
        y = pf_alloc(s, PF_ACT, out_n, 4, l->name);
        if (node) { pf_ref(s, x); SAVED(i, 0) = x; }
        if (node && l->kind == L_UNARY_Y) { pf_ref(s, y); SAVED(i, 1) = y; }
        break;
    }
    return y;
}

static void grad_leaf(seq_ctx *c, int id) { c->leaf_ids[c->n_leaf++] = id; }

/* One layer's backward: consumes gout (one reference), returns the input's
 * gradient (or -1 when the input needs none). The order inside follows the
 * engine: the backward function's allocations, then gout is released, then
 * the node's saved tensors. */
static int seq_backward(seq_ctx *c, int i, int gout) {
    pf_sim *s = c->s;
    const seq_layer *l = &c->L[i];
    double in_n = (double)c->B * (double)prod(l->in_nd, l->in);
    int rg = c->rg_in[i], gin = -1;
    pf_phase(s, "backward %d %s", i + 1, l->name);
    switch (l->kind) {
    case L_LINEAR: /* linear_backward: dx = g @ w, dw = g^T @ x, db = sum(g) */
        if (rg) gin = pf_alloc(s, PF_WORK, in_n, 4, "dx");
        grad_leaf(c, pf_alloc(s, PF_GRADS, (double)l->out_features * (double)l->in_features, 4, "dW"));
        if (l->bias) grad_leaf(c, pf_alloc(s, PF_GRADS, (double)l->out_features, 4, "db"));
        break;
    case L_CONV: /* conv2d_backward: dx, dw, db buffers, then the kernel's scratch */
        if (rg) gin = pf_alloc(s, PF_WORK, in_n, 4, "dx");
        grad_leaf(c, pf_alloc(s, PF_GRADS, (double)l->out_features * (double)l->in_features * l->k * l->k, 4, "dW"));
        if (l->bias) grad_leaf(c, pf_alloc(s, PF_GRADS, (double)l->out_features, 4, "db"));
        conv_scratch(s, l, c->B);
        break;
    case L_BN:
        if (rg) gin = pf_alloc(s, PF_WORK, in_n, 4, "dx");
        grad_leaf(c, pf_alloc(s, PF_GRADS, (double)l->in[0], 4, "dgamma"));
        grad_leaf(c, pf_alloc(s, PF_GRADS, (double)l->in[0], 4, "dbeta"));
        pf_unref(s, pf_alloc(s, PF_WORK, 7.0 * (double)l->in[0], 8, "bn stats"));
        break;
    case L_LN: case L_RMS: { /* norm_backward always produces dx */
        int dx = pf_alloc(s, PF_WORK, in_n, 4, "dx");
        double d = (double)l->in[l->in_nd - 1];
        grad_leaf(c, pf_alloc(s, PF_GRADS, d, 4, "dgamma"));
        if (l->kind == L_LN) grad_leaf(c, pf_alloc(s, PF_GRADS, d, 4, "dbeta"));
        if (rg) gin = dx;
        else pf_unref(s, dx);
        break;
    }
    case L_DROPOUT:
        if (l->p == 0) { if (rg) { pf_ref(s, gout); gin = gout; } break; }
        if (rg) { /* dropout_backward: mask -> f32, scaled, times g */
            int mf = pf_alloc(s, PF_WORK, in_n, 4, "mask f32"), ms = pf_alloc(s, PF_WORK, in_n, 4, "mask scaled");
            gin = pf_alloc(s, PF_WORK, in_n, 4, "dx");
            pf_unref(s, mf);
            pf_unref(s, ms);
        }
        break;
    case L_MAXPOOL: case L_AVGPOOL: case L_UNARY: case L_UNARY_Y:
        if (rg) gin = pf_alloc(s, PF_WORK, in_n, 4, "dx");
        break;
    case L_FLATTEN:
        if (rg) { pf_ref(s, gout); gin = gout; } /* the reshape of a contiguous gradient is a view */
        break;
    }
    pf_unref(s, gout);
    for (int k = 0; k < 4; k++) { pf_unref(s, SAVED(i, k)); SAVED(i, k) = -1; }
    return gin;
}

typedef struct seq_model {
    fm_recipe r;
    seq_layer L[FM_RECIPE_MAX_LAYERS];
    int n;
    int64_t params;
} seq_model;

static fm_status seq_load(const char *path, seq_model *m) {
    if (fm_recipe_load(path, &m->r) != FM_OK) return fm_last_status();
    int nd = m->r.input_ndim;
    int64_t cur[FM_MAX_DIMS];
    memcpy(cur, m->r.input_shape, sizeof(int64_t) * (size_t)nd);
    m->n = m->r.n_layers;
    m->params = 0;
    for (int i = 0; i < m->n; i++) {
        if (parse_layer(&m->r, &m->r.layers[i], nd, cur, &m->L[i]) != FM_OK) { fm_recipe_free(&m->r); return fm_last_status(); }
        nd = m->L[i].out_nd;
        memcpy(cur, m->L[i].out, sizeof(int64_t) * (size_t)nd);
        double e[8] = {0}, es[8] = {0};
        int isp[8] = {0};
        int k = layer_tensors(&m->L[i], e, es, isp);
        for (int j = 0; j < k; j++) if (isp[j]) m->params += (int64_t)e[j];
    }
    if (nd != 1) {
        char s1[96];
        fm_status st = fm_set_error(FM_ERR_FORMAT, "%s: the model's output is %s but a classifier must produce [N, classes] "
                                    "(end with 'layer = linear CLASSES')", m->r.path, shape_txt(nd, cur, s1, sizeof s1));
        fm_recipe_free(&m->r);
        return st;
    }
    return FM_OK;
}

/* Samples and image size of an idx file (gz or plain) from its header alone. */
static int idx_count(const char *path, int64_t *count, int64_t *h, int64_t *w) {
    gzFile f = gzopen(path, "rb");
    if (!f) return 0;
    unsigned char hd[16];
    int got = gzread(f, hd, sizeof hd);
    gzclose(f);
    if (got < 8 || hd[0] || hd[1]) return 0;
    int ndim = hd[3];
    if (ndim < 1 || got < 4 + 4 * ndim) return 0;
    uint32_t d[3] = {0, 1, 1};
    for (int i = 0; i < ndim && i < 3; i++)
        d[i] = (uint32_t)hd[4 + 4 * i] << 24 | (uint32_t)hd[5 + 4 * i] << 16 | (uint32_t)hd[6 + 4 * i] << 8 | hd[7 + 4 * i];
    *count = d[0];
    if (h) *h = d[1];
    if (w) *w = d[2];
    return 1;
}

/* The idx image file of a split, found as fm_dataset_fashion_mnist finds it. */
static int find_split(const fm_recipe *r, int test, char *img, size_t cap) {
    if (!strcmp(r->dataset, "idx") && !r->data_dir[0]) {
        const char *p = test ? r->test_images : r->train_images;
        if (!p[0]) return 0;
        snprintf(img, cap, "%s", p);
        return 1;
    }
    const char *dir = r->data_dir[0] ? r->data_dir : !strcmp(r->dataset, "mnist") ? "/usr/share/datasets/mnist" : FM_FASHION_MNIST_DIR;
    const char *pre = test ? "t10k" : "train";
    snprintf(img, cap, "%s/%s-images-idx3-ubyte", dir, pre);
    if (is_regular(img)) return 1;
    snprintf(img, cap, "%s/%s-images-idx3-ubyte.gz", dir, pre);
    return is_regular(img);
}

/* Samples held in memory for a split: the whole file (a `limit` only narrows a view of it). */
static int64_t split_samples(const fm_recipe *r, int test, char *note, size_t note_cap) {
    char img[1100];
    int64_t n = 0, h = 0, w = 0;
    if (find_split(r, test, img, sizeof img) && idx_count(img, &n, &h, &w)) return n;
    int64_t def = test ? 10000 : 60000;
    if (strcmp(r->dataset, "idx")) {
        size_t k = strlen(note);
        snprintf(note + k, note_cap - k, "%s%s split not found: %lld samples assumed (the published size)", k ? "; " : "",
                 test ? "test" : "training", (long long)def);
        return def;
    }
    return -1;
}

/* Batch buffers the data loader allocates up front (fm_dataloader_create in
 * src/data/loader.c): one slot without workers, else a ring of 2 per worker,
 * at least 4 (the recipe sets no prefetch depth). */
static int loader_slots(int workers) {
    if (workers <= 0) return 1;
    return 2 * workers < 4 ? 4 : 2 * workers;
}

static fm_status plan_sequential(const char *path, const fm_plan_run_opts *o, int explain, fm_plan_run *out) {
    seq_model *m = calloc(1, sizeof *m);
    if (!m) return fm_set_error(FM_ERR_OOM, "out of host memory");
    fm_status st = seq_load(path, m);
    if (st) { free(m); return st; }
    fm_recipe *r = &m->r;
    if (o->precision != FM_PLAN_FP32 || o->checkpointing != 0 || o->grad_accum > 1) {
        st = fm_set_error(FM_ERR_INVALID, "%s: `fathom train` runs this recipe in fp32 without checkpointing or gradient "
                          "accumulation (those options exist for GPT recipes only); drop --precision/--checkpointing/--grad-accum",
                          r->path);
        goto done;
    }
    snprintf(out->path, sizeof out->path, "%s", r->path);
    snprintf(out->name, sizeof out->name, "%s", r->name);
    snprintf(out->trainer, sizeof out->trainer, "sequential");
    out->opts = *o;
    out->batch = o->batch > 0 ? o->batch : r->batch_size;
    out->params = m->params;
    {
        size_t k = 0;
        char s1[96];
        k += (size_t)snprintf(out->model + k, sizeof out->model - k, "%d layers, input %s, %s",
                              m->n, shape_txt(r->input_ndim, r->input_shape, s1, sizeof s1),
                              fm_optim_kind_name(r->optim.kind));
        if (r->optim.kind == FM_OPTIM_SGD && r->optim.momentum > 0 && k < sizeof out->model)
            snprintf(out->model + k, sizeof out->model - k, " with momentum");
    }
    int64_t n_train = split_samples(r, 0, out->notes, sizeof out->notes);
    int64_t n_test = o->eval ? split_samples(r, 1, out->notes, sizeof out->notes) : 0;
    if (n_train < 0 || n_test < 0) {
        st = fm_set_error(FM_ERR_IO, "%s: cannot read the %s images' idx header to count the samples", r->path,
                          n_train < 0 ? "training" : "test");
        goto done;
    }
    int64_t sample = prod(r->input_ndim, r->input_shape);
    int64_t B = out->batch;
    pf_sim sim;
    memset(&sim, 0, sizeof sim);
    plan_sb log = {0};
    if (explain) sim.log = &log;
    pf_sim *s = &sim;

    /* Before fm_memory_reset_peak: the data sets (u8 idx images become f32 [N, C, H, W],
     * labels i64), the model, and the loader's batch buffers. */
    pf_phase(s, "data sets (resident)");
    pf_alloc(s, PF_DATA, (double)n_train * (double)sample, 4, "train images f32");
    pf_alloc(s, PF_DATA, (double)n_train, 8, "train labels");
    if (o->eval) {
        pf_alloc(s, PF_DATA, (double)n_test * (double)sample, 4, "test images f32");
        pf_alloc(s, PF_DATA, (double)n_test, 8, "test labels");
    }
    pf_phase(s, "model");
    int n_w = 0;
    double w_elems[FM_RECIPE_MAX_LAYERS * 5];
    for (int i = 0; i < m->n; i++) {
        double e[8] = {0}, es[8] = {0};
        int isp[8] = {0};
        int k = layer_tensors(&m->L[i], e, es, isp);
        for (int j = 0; j < k; j++) {
            pf_alloc(s, PF_WEIGHTS, e[j], es[j], isp[j] ? "param" : "buffer");
            if (isp[j]) w_elems[n_w++] = e[j];
        }
    }
    pf_phase(s, "data loader");
    int nslots = loader_slots(r->workers);
    int bx = -1, by = -1;
    for (int k = 0; k < nslots; k++) {
        bx = pf_alloc(s, PF_DATA, (double)B * (double)sample, 4, "batch x");
        by = pf_alloc(s, PF_DATA, (double)B, 8, "batch y");
    }
    out->resident = s->cur;
    /* the trainer resets the peak here: everything above is the floor */
    s->peak = s->cur;
    memcpy(s->peak_cat, s->cat, sizeof s->cat);
    snprintf(s->peak_where, sizeof s->peak_where, "before the first step");

    seq_ctx c = {s, m->L, m->n, B, NULL, NULL, NULL, NULL, 0};
    c.saved = malloc(sizeof(int) * 4 * (size_t)m->n);
    c.has_node = malloc(sizeof(int) * (size_t)m->n);
    c.rg_in = malloc(sizeof(int) * (size_t)m->n);
    c.leaf_ids = malloc(sizeof(int) * (size_t)(n_w + 1));
    int *grads = malloc(sizeof(int) * (size_t)(n_w + 1));
    if (!c.saved || !c.has_node || !c.rg_in || !c.leaf_ids || !grads) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto sim_done; }
    int opt_slots = r->optim.kind == FM_OPTIM_SGD ? (r->optim.momentum > 0 ? 1 : 0) : 2;
    /* Two steps: the first has no optimizer state until its update; from the
     * second on every step is the same, with the state alive throughout. */
    for (int step = 1; step <= 2; step++) {
        c.n_leaf = 0;
        int cur = bx;
        pf_ref(s, cur);
        int rg = 0;
        for (int i = 0; i < m->n; i++) {
            int y = seq_forward(&c, i, cur, rg);
            pf_unref(s, cur);
            cur = y;
            rg = rg || c.has_node[i];
        }
        int logits = cur; /* the trainer's reference until after backward */
        pf_phase(s, "step %d loss", step);
        int loss = pf_alloc(s, PF_ACT, 1, 4, "loss");
        pf_ref(s, logits); /* cross-entropy saves the logits (and the targets) */
        pf_ref(s, by);
        pf_phase(s, "step %d backward: loss", step);
        int seed = pf_alloc(s, PF_WORK, 1, 4, "seed");
        int g = pf_alloc(s, PF_WORK, (double)B * (double)m->L[m->n - 1].out[0], 4, "dlogits");
        pf_unref(s, logits);
        pf_unref(s, by);
        for (int i = m->n - 1; i >= 0; i--) {
            if (!c.has_node[i]) {
                pf_unref(s, g);
                g = -1;
                continue;
            }
            if (g < 0) break;
            g = seq_backward(&c, i, g);
        }
        pf_unref(s, g);
        /* the walk's gradient sums become .grad (src/autograd/engine.c
         * finish_leaf): a fresh gradient the walk alone holds is handed over
         * without a copy, which is the case for every layer here */
        pf_phase(s, "step %d backward: gradients to parameters", step);
        for (int k = 0; k < c.n_leaf; k++) grads[k] = c.leaf_ids[k];
        pf_unref(s, seed);
        pf_phase(s, "step %d release logits and loss", step);
        pf_unref(s, logits);
        pf_unref(s, loss);
        if (step == 1) {
            pf_phase(s, "step 1 optimizer state (created at the first update)");
            for (int k = 0; k < n_w; k++)
                for (int q = 0; q < opt_slots; q++) pf_alloc(s, PF_OPTIM, w_elems[k], 4, q ? "exp_avg_sq" : "momentum/exp_avg");
        }
        pf_phase(s, "step %d zero_grad", step);
        for (int k = 0; k < c.n_leaf; k++) pf_unref(s, grads[k]);
    }
    pf_end(s);
    if (s->failed) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto sim_done; }
    out->peak = s->peak;
    out->data = s->peak_cat[PF_DATA];
    out->weights = s->peak_cat[PF_WEIGHTS];
    out->gradients = s->peak_cat[PF_GRADS];
    out->optimizer = s->peak_cat[PF_OPTIM];
    out->activations = s->peak_cat[PF_ACT];
    out->workspace = s->peak_cat[PF_WORK];
    snprintf(out->peak_at, sizeof out->peak_at, "%s", s->peak_where);
    if (explain) {
        char b1[32];
        plan_sb hdr = {0};
        plan_sb_printf(&hdr, "Replay of `fathom train %s%s --batch %lld` on the CPU allocator (sizes rounded as it rounds "
                       "them: 64 B below 4 KiB, eighths of a power of two above; + allocated, - freed):\n",
                       r->path, o->eval ? "" : " --no-eval", (long long)B);
        plan_sb_printf(&hdr, "%s", log.buf ? log.buf : "");
        plan_sb_printf(&hdr, "peak %s at %s\n", pf_mib(s->peak, b1, sizeof b1), s->peak_where);
        out->explain = plan_sb_take(&hdr);
    }
sim_done:
    free(log.buf);
    free(c.saved);
    free(c.has_node);
    free(c.rg_in);
    free(c.leaf_ids);
    free(grads);
    pf_free(s);
done:
    fm_recipe_free(r);
    free(m);
    return st;
}

/* ---------------- entry point and output ---------------- */

fm_status fm_plan_run_recipe(const char *recipe, const fm_plan_run_opts *o, int explain, fm_plan_run *out) {
    memset(out, 0, sizeof *out);
    fm_plan_run_opts def;
    if (!o) { fm_plan_run_defaults(&def); o = &def; }
    if (!recipe || !*recipe) return fm_set_error(FM_ERR_INVALID, "plan: no recipe given");
    if (o->batch < 0 || o->grad_accum < 0 || o->checkpointing < 0 || o->checkpointing > 2)
        return fm_set_error(FM_ERR_INVALID, "plan: batch, grad_accum and checkpointing out of range");
    if (o->precision != FM_PLAN_FP32 && o->precision != FM_PLAN_BF16 && o->precision != FM_PLAN_FP16)
        return fm_set_error(FM_ERR_INVALID, "plan: fathom trains in fp32, bf16 or fp16 (not %s)", fm_plan_precision_name(o->precision));
    char path[PATH_MAX];
    bool builtin = fm_recipe_resolve(recipe, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (builtin)
            return fm_set_error(FM_ERR_IO, "no built-in recipe named '%s' (looked for %s; `fathom recipes` lists them)", recipe, path);
        return fm_set_error(FM_ERR_IO, "cannot open recipe %s: %s", path, strerror(errno));
    }
    int type = 0;
    int rc = ini_parse_file(f, gpt_key, &type);
    fclose(f);
    if (rc > 0) return fm_set_error(FM_ERR_FORMAT, "%s:%d: expected 'key = value', '[section]' or a comment", path, rc);
    fm_status st = type == 1 ? plan_fathom_gpt(path, o, explain, out) : plan_sequential(path, o, explain, out);
    if (st) fm_plan_run_free(out);
    return st;
}

char *fm_plan_run_render_text(const fm_plan_run *r) {
    plan_sb sb = {0};
    char b[32];
    plan_sb_printf(&sb, "fathom plan: recipe %s (%s): %lld parameters, %s\n", r->name, r->path, (long long)r->params, r->model);
    plan_sb_printf(&sb, "job: fathom train on the CPU, %s, batch %lld", fm_plan_precision_name(r->opts.precision),
                   (long long)r->batch);
    if (!strcmp(r->trainer, "gpt")) {
        static const char *ck[] = {"none", "blocks", "selective"};
        plan_sb_printf(&sb, ", checkpointing %s, grad-accum %d", ck[r->opts.checkpointing], r->opts.grad_accum > 1 ? r->opts.grad_accum : 1);
    } else {
        plan_sb_printf(&sb, ", %s", r->opts.eval ? "test set loaded for the final evaluation" : "--no-eval");
    }
    plan_sb_printf(&sb, "\nMemory at the peak (fathom's CPU allocator, bytes in use):\n");
    struct { const char *n; double v; } rows[] = {
        {"weights", r->weights}, {"gradients", r->gradients}, {"optimizer state", r->optimizer},
        {"activations", r->activations}, {"workspace (op temporaries)", r->workspace}, {"data set + batches", r->data},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        plan_sb_printf(&sb, "  %-28s %12s\n", rows[i].n, pf_mib(rows[i].v, b, sizeof b));
    plan_sb_printf(&sb, "  %-28s %12s\n", "= allocated", pf_mib(r->peak, b, sizeof b));
    plan_sb_printf(&sb, "  (before the first step: %s)\n", pf_mib(r->resident, b, sizeof b));
    plan_sb_printf(&sb, "fathom CPU run: peak %s allocated (%.0f bytes; `fathom train --json` reports it as "
                   "memory.peak_allocated), reached at %s\n", pf_mib(r->peak, b, sizeof b), r->peak, r->peak_at);
    if (r->notes[0]) plan_sb_printf(&sb, "Note: %s\n", r->notes);
    return plan_sb_take(&sb);
}

char *fm_plan_run_render_json(const fm_plan_run *r) {
    json_t *j = json_object(), *mem = json_object(), *job = json_object();
    if (!j || !mem || !job) { json_decref(j); json_decref(mem); json_decref(job); fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    static const char *ck[] = {"none", "blocks", "selective"};
    json_object_set_new(j, "recipe", json_string(r->name));
    json_object_set_new(j, "path", json_string(r->path));
    json_object_set_new(j, "trainer", json_string(r->trainer));
    json_object_set_new(j, "model", json_string(r->model));
    json_object_set_new(j, "params", json_integer(r->params));
    json_object_set_new(job, "device", json_string("cpu"));
    json_object_set_new(job, "precision", json_string(fm_plan_precision_name(r->opts.precision)));
    json_object_set_new(job, "batch", json_integer(r->batch));
    json_object_set_new(job, "checkpointing", json_string(ck[r->opts.checkpointing]));
    json_object_set_new(job, "grad_accum", json_integer(r->opts.grad_accum > 1 ? r->opts.grad_accum : 1));
    json_object_set_new(job, "eval", json_boolean(r->opts.eval));
    json_object_set_new(j, "job", job);
    json_object_set_new(mem, "weights", json_integer((json_int_t)r->weights));
    json_object_set_new(mem, "gradients", json_integer((json_int_t)r->gradients));
    json_object_set_new(mem, "optimizer", json_integer((json_int_t)r->optimizer));
    json_object_set_new(mem, "activations", json_integer((json_int_t)r->activations));
    json_object_set_new(mem, "workspace", json_integer((json_int_t)r->workspace));
    json_object_set_new(mem, "data", json_integer((json_int_t)r->data));
    json_object_set_new(mem, "allocated", json_integer((json_int_t)r->peak));
    json_object_set_new(mem, "resident_before_training", json_integer((json_int_t)r->resident));
    json_object_set_new(j, "memory", mem);
    json_object_set_new(j, "fathom_cpu_peak_bytes", json_integer((json_int_t)r->peak));
    json_object_set_new(j, "peak_at", json_string(r->peak_at));
    if (r->notes[0]) json_object_set_new(j, "notes", json_string(r->notes));
    char *s = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!s) fm_set_error(FM_ERR_OOM, "out of host memory");
    return s;
}

char *fm_plan_run_render_explain(const fm_plan_run *r) {
    plan_sb sb = {0};
    plan_sb_printf(&sb, "%s", r->explain ? r->explain : "(no replay recorded)\n");
    char *text = fm_plan_run_render_text(r);
    if (text) plan_sb_printf(&sb, "\n%s", text);
    free(text);
    return plan_sb_take(&sb);
}
