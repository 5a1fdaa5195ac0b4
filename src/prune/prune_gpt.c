/* Structured pruning of GPT models (`fathom prune GPT_DIR --structured heads|channels`,
 * docs/DEPLOY.md): whole attention heads or MLP neurons leave every block, and the
 * tensors shrink, so the result is a smaller GPT (config.json with the new n_head /
 * head_dim or ffn_hidden) that generate, compile, export and train take as any other.
 *
 * The configuration holds one head count and one MLP width for all blocks, so each
 * block loses the same number: S of them, per block (--per-layer). Scores:
 *  - a head h reads the residual stream through its value rows V_h [D, C] and writes
 *    it back through its output-projection columns O_h [C, D]; its contribution is
 *    the map O_h V_h, scored by its Frobenius norm, computed as
 *    sqrt(sum((O_h^T O_h) .* (V_h V_h^T))) without forming the C x C product.
 *    With grouped-query attention (Llama, n_kv_head < n_head) whole groups go (one
 *    key/value head and the query heads that share it), scored by the sum over the
 *    group's query heads, so the grouping stays regular.
 *  - an MLP neuron j: |fc row j| * |proj column j| (GPT-2); |gate j| * |up j| * |down
 *    column j| (Llama's SwiGLU), with |.| the L2 norm.
 * The lowest-scoring ones go; at least one head group and one neuron stay. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prune/prune_internal.h"

typedef struct {
    float *data;
    int64_t rows, cols;
} host_mat;

static fm_status to_host(fm_gpt *m, const char *name, host_mat *h) {
    const fm_named_list *ps = fm_gpt_parameters(m);
    for (int i = 0; i < ps->n; i++) {
        if (strcmp(ps->items[i].name, name)) continue;
        const fm_tensor *t = ps->items[i].tensor;
        h->rows = t->shape[0];
        h->cols = t->ndim == 2 ? t->shape[1] : 1;
        h->data = malloc(sizeof(float) * (size_t)(h->rows * h->cols));
        if (!h->data) return fm_set_error(FM_ERR_OOM, "prune: out of host memory");
        return fm_tensor_copy_to_host(t, h->data, FM_F32);
    }
    return fm_set_error(FM_ERR_INTERNAL, "prune: the GPT has no parameter %s", name);
}

/* dst (a parameter of the pruned model) = the rows keep_r (NULL: all) and columns keep_c
 * (NULL: all) of src */
static fm_status put_sub(fm_gpt *dst, const char *name, const host_mat *src, const int64_t *keep_r, int64_t nr,
                         const int64_t *keep_c, int64_t nc) {
    const fm_named_list *ps = fm_gpt_parameters(dst);
    fm_tensor *t = NULL;
    for (int i = 0; i < ps->n && !t; i++)
        if (!strcmp(ps->items[i].name, name)) t = ps->items[i].tensor;
    const int64_t rows = keep_r ? nr : src->rows, cols = keep_c ? nc : src->cols;
    if (!t || t->shape[0] != rows || (t->ndim == 2 ? t->shape[1] : 1) != cols)
        return fm_set_error(FM_ERR_INTERNAL, "prune: %s of the pruned GPT is not %lld x %lld", name, (long long)rows,
                            (long long)cols);
    float *d = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!d) return fm_set_error(FM_ERR_OOM, "prune: out of host memory");
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src->data + (keep_r ? keep_r[r] : r) * src->cols;
        for (int64_t c = 0; c < cols; c++) d[r * cols + c] = s[keep_c ? keep_c[c] : c];
    }
    fm_tensor *h = fm_tensor_from_data(d, t->ndim, t->shape, FM_F32);
    free(d);
    fm_status st = h ? fm_copy_(t, h) : fm_last_status();
    fm_tensor_release(h);
    return st;
}

/* indices of the `keep` highest scores, ascending */
static int64_t *top_indices(const double *score, int64_t n, int64_t keep) {
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
    if (!idx) return NULL;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    for (int64_t i = 0; i < keep; i++) { /* partial selection: n is heads or neurons of one block */
        int64_t best = i;
        for (int64_t j = i + 1; j < n; j++)
            if (score[idx[j]] > score[idx[best]] || (score[idx[j]] == score[idx[best]] && idx[j] < idx[best])) best = j;
        int64_t t = idx[i];
        idx[i] = idx[best];
        idx[best] = t;
    }
    for (int64_t i = 1; i < keep; i++) /* back to ascending order: the kept ones keep their order */
        for (int64_t j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
            int64_t t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    return idx;
}

static double row_norm(const host_mat *m, int64_t r) {
    double s = 0;
    for (int64_t c = 0; c < m->cols; c++) s += (double)m->data[r * m->cols + c] * m->data[r * m->cols + c];
    return sqrt(s);
}

static double col_norm(const host_mat *m, int64_t c) {
    double s = 0;
    for (int64_t r = 0; r < m->rows; r++) s += (double)m->data[r * m->cols + c] * m->data[r * m->cols + c];
    return sqrt(s);
}

/* |O_h V_g|_F for query head h (columns of proj) and value rows starting at v0 */
static double ov_norm(const host_mat *proj, int64_t h, const host_mat *qkv, int64_t v0, int64_t D) {
    const int64_t C = proj->rows;
    double s = 0;
    for (int64_t a = 0; a < D; a++)
        for (int64_t b = 0; b < D; b++) {
            double oo = 0, vv = 0;
            for (int64_t c = 0; c < C; c++) {
                oo += (double)proj->data[c * proj->cols + h * D + a] * proj->data[c * proj->cols + h * D + b];
                vv += (double)qkv->data[(v0 + a) * qkv->cols + c] * qkv->data[(v0 + b) * qkv->cols + c];
            }
            s += oo * vv;
        }
    return sqrt(s > 0 ? s : 0);
}

typedef struct {
    fm_gpt *src, *dst;
    const fm_gpt_config *c;
    int layer;
    char name[96];
} gpt_cut;

static const char *pname(gpt_cut *g, const char *what) {
    snprintf(g->name, sizeof g->name, "h.%d.%s", g->layer, what);
    return g->name;
}

/* one block's heads: keep the `keep` best groups of the source */
static fm_status cut_heads(gpt_cut *g, int64_t keep_groups) {
    const fm_gpt_config *c = g->c;
    /* the q/k/v bias: GPT-2's (with its other biases) or a Llama's with qkv_bias (Qwen2) */
    const bool llama = c->arch == FM_GPT_LLAMA, bias = llama ? c->qkv_bias : c->bias;
    const int64_t H = c->n_head, KV = llama ? c->n_kv_head : H, D = fm_gpt_head_dim(c), gs = H / KV;
    host_mat qkv = {0}, qb = {0}, proj = {0};
    fm_status st = to_host(g->src, pname(g, "attn.qkv.weight"), &qkv);
    if (st == FM_OK) st = to_host(g->src, pname(g, "attn.proj.weight"), &proj);
    if (st == FM_OK && bias) st = to_host(g->src, pname(g, "attn.qkv.bias"), &qb);
    double *score = st == FM_OK ? calloc((size_t)KV, sizeof(double)) : NULL;
    int64_t *kg = NULL, *rows = NULL, *cols = NULL;
    if (st == FM_OK && !score) st = fm_set_error(FM_ERR_OOM, "prune: out of host memory");
    for (int64_t k = 0; st == FM_OK && k < KV; k++)
        for (int64_t q = k * gs; q < (k + 1) * gs; q++) score[k] += ov_norm(&proj, q, &qkv, (H + KV + k) * D, D);
    if (st == FM_OK) {
        kg = top_indices(score, KV, keep_groups);
        rows = malloc(sizeof(int64_t) * (size_t)((keep_groups * gs + 2 * keep_groups) * D));
        cols = malloc(sizeof(int64_t) * (size_t)(keep_groups * gs * D));
        if (!kg || !rows || !cols) st = fm_set_error(FM_ERR_OOM, "prune: out of host memory");
    }
    if (st == FM_OK) {
        int64_t nr = 0, nc = 0;
        for (int64_t i = 0; i < keep_groups; i++) /* query heads of the kept groups */
            for (int64_t q = kg[i] * gs; q < (kg[i] + 1) * gs; q++)
                for (int64_t d = 0; d < D; d++) rows[nr++] = cols[nc++] = q * D + d;
        for (int part = 1; part <= 2; part++) /* then their key heads, then their value heads */
            for (int64_t i = 0; i < keep_groups; i++)
                for (int64_t d = 0; d < D; d++) rows[nr++] = H * D + (part - 1) * KV * D + kg[i] * D + d;
        st = put_sub(g->dst, pname(g, "attn.qkv.weight"), &qkv, rows, nr, NULL, 0);
        if (st == FM_OK && bias) st = put_sub(g->dst, pname(g, "attn.qkv.bias"), &qb, rows, nr, NULL, 0);
        if (st == FM_OK) st = put_sub(g->dst, pname(g, "attn.proj.weight"), &proj, NULL, 0, cols, nc);
    }
    free(qkv.data);
    free(qb.data);
    free(proj.data);
    free(score);
    free(kg);
    free(rows);
    free(cols);
    return st;
}

/* one block's MLP: keep the `keep` best neurons */
static fm_status cut_neurons(gpt_cut *g, int64_t keep) {
    const fm_gpt_config *c = g->c;
    const bool llama = c->arch == FM_GPT_LLAMA, bias = c->bias && !llama;
    const int64_t F = c->ffn_hidden;
    host_mat fc = {0}, fb = {0}, down = {0};
    fm_status st = to_host(g->src, pname(g, "mlp.fc.weight"), &fc);
    if (st == FM_OK) st = to_host(g->src, pname(g, "mlp.proj.weight"), &down);
    if (st == FM_OK && bias) st = to_host(g->src, pname(g, "mlp.fc.bias"), &fb);
    double *score = st == FM_OK ? malloc(sizeof(double) * (size_t)F) : NULL;
    int64_t *kn = NULL, *rows = NULL;
    if (st == FM_OK && !score) st = fm_set_error(FM_ERR_OOM, "prune: out of host memory");
    for (int64_t j = 0; st == FM_OK && j < F; j++)
        score[j] = row_norm(&fc, j) * (llama ? row_norm(&fc, F + j) : 1.0) * col_norm(&down, j);
    if (st == FM_OK) {
        kn = top_indices(score, F, keep);
        rows = malloc(sizeof(int64_t) * (size_t)(2 * keep));
        if (!kn || !rows) st = fm_set_error(FM_ERR_OOM, "prune: out of host memory");
    }
    if (st == FM_OK) {
        int64_t nr = 0;
        for (int part = 0; part < (llama ? 2 : 1); part++) /* Llama: the gate rows, then the up rows */
            for (int64_t i = 0; i < keep; i++) rows[nr++] = part * F + kn[i];
        st = put_sub(g->dst, pname(g, "mlp.fc.weight"), &fc, rows, nr, NULL, 0);
        if (st == FM_OK && bias) st = put_sub(g->dst, pname(g, "mlp.fc.bias"), &fb, kn, keep, NULL, 0);
        if (st == FM_OK) st = put_sub(g->dst, pname(g, "mlp.proj.weight"), &down, NULL, 0, kn, keep);
    }
    free(fc.data);
    free(fb.data);
    free(down.data);
    free(score);
    free(kn);
    free(rows);
    return st;
}

/* every parameter the cut leaves whole: copied as it is */
static fm_status copy_rest(fm_gpt *src, fm_gpt *dst, bool heads) {
    const fm_named_list *ps = fm_gpt_parameters(src);
    for (int i = 0; i < ps->n; i++) {
        const char *n = ps->items[i].name;
        bool cut = heads ? strstr(n, ".attn.qkv.") || strstr(n, ".attn.proj.weight")
                         : strstr(n, ".mlp.fc.") || strstr(n, ".mlp.proj.weight");
        if (cut) continue;
        const fm_named_list *pd = fm_gpt_parameters(dst);
        int k = fm_named_list_find(pd, n);
        fm_status st = k < 0 ? fm_set_error(FM_ERR_INTERNAL, "prune: %s missing in the pruned GPT", n)
                             : fm_copy_(pd->items[k].tensor, ps->items[i].tensor);
        if (st) return st;
    }
    return FM_OK;
}

fm_status fm_prune_gpt(fm_gpt *m, const fm_prune_options *o, fm_gpt **out, fm_prune_report *rep) {
    *out = NULL;
    const fm_gpt_config *c = fm_gpt_get_config(m);
    const bool llama = c->arch == FM_GPT_LLAMA;
    if (!(o->sparsity >= 0 && o->sparsity < 1))
        return fm_set_error(FM_ERR_INVALID, "prune: sparsity %g is outside [0, 1)", o->sparsity);
    if (o->kind != FM_PRUNE_HEADS && o->kind != FM_PRUNE_CHANNELS)
        return fm_set_error(FM_ERR_UNSUPPORTED, "prune: unstructured pruning of GPT models is not built (the masks would "
                            "need the GPT trainer); use --structured heads (attention heads) or --structured channels "
                            "(MLP neurons)");
    if (o->global)
        return fm_set_error(FM_ERR_UNSUPPORTED, "prune: --global is not possible for a GPT: its config holds one head "
                            "count and one MLP width for every block, so each block loses the same number "
                            "(--per-layer)");
    if (o->keep_shape)
        return fm_set_error(FM_ERR_UNSUPPORTED, "prune: keep_shape is for classifiers");
    const bool heads = o->kind == FM_PRUNE_HEADS;
    const int64_t groups = llama ? c->n_kv_head : c->n_head, gs = c->n_head / groups;
    const int64_t n = heads ? groups : c->ffn_hidden;
    int64_t keep = n - (int64_t)llround(o->sparsity * (double)n);
    if (keep < 1) keep = 1;
    fm_gpt_config d = *c;
    if (heads) {
        d.head_dim = fm_gpt_head_dim(c);
        d.n_head = (int)(keep * gs);
        d.n_kv_head = llama ? (int)keep : d.n_head;
    } else {
        d.ffn_hidden = (int)keep;
    }
    fm_gpt *p = fm_gpt_new(&d, NULL);
    if (!p) return fm_last_status();
    fm_status st = copy_rest(m, p, heads);
    for (int l = 0; st == FM_OK && l < c->n_layer; l++) {
        gpt_cut g = {m, p, c, l, {0}};
        st = heads ? cut_heads(&g, keep) : cut_neurons(&g, keep);
    }
    if (st) { fm_gpt_free(p); return st; }
    if (rep) {
        memset(rep, 0, sizeof *rep);
        rep->n_layers = c->n_layer < FM_PRUNE_MAX_LAYERS ? c->n_layer : FM_PRUNE_MAX_LAYERS;
        for (int l = 0; l < rep->n_layers; l++) {
            fm_prune_layer_report *r = &rep->layers[l];
            snprintf(r->name, sizeof r->name, heads ? "block %d attention %s" : "block %d mlp neurons", l,
                     llama && gs > 1 ? "heads (in kv groups)" : "heads");
            r->before = heads ? c->n_head : c->ffn_hidden;
            r->after = heads ? d.n_head : d.ffn_hidden;
        }
        rep->params_before = fm_gpt_num_params(m);
        rep->params_after = fm_gpt_num_params(p);
    }
    *out = p;
    return FM_OK;
}
