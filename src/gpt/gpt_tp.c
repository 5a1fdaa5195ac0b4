/* Tensor parallelism for the GPT and Llama models (Megatron style): which
 * parameters are split and how, the sharding of a model built whole, and the
 * gathering back into a whole model (checkpoints hold full, unsplit parameters).
 *
 * Per block, split by output rows (column-parallel): the QKV projection (this rank's
 * query heads and, for GQA, key/value heads; so attention runs locally) and the first
 * MLP projection (Llama: this rank's gate and up rows); split by input columns
 * (row-parallel): the attention output and the second MLP projection. Norms, the
 * row-parallel biases and the position embedding are replicated. The forward pass is
 * block_tp in gpt_model.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/memory.h"
#include "fathom/ops.h"
#include "gpt/gpt_internal.h"

typedef struct tp_slot {
    fm_tensor **p;
    fm_tp_split s;
} tp_slot;

/* The split parameters of m (its full sizes from cfg); returns how many (<= 6 per layer + 2). */
static int tp_slots(fm_gpt *m, tp_slot *out) {
    const fm_gpt_config *c = &m->cfg;
    const int64_t D = fm_gpt_head_dim(c), H = c->n_head, KV = m->n_kv, F = c->ffn_hidden;
    const bool llama = c->arch == FM_GPT_LLAMA;
    const fm_tp_split qkv = {0, 3, {H * D, KV * D, KV * D}}, cols_h = {1, 1, {H * D}};
    const fm_tp_split fc = llama ? (fm_tp_split){0, 2, {F, F}} : (fm_tp_split){0, 1, {F}}, cols_f = {1, 1, {F}};
    const fm_tp_split vocab = {0, 1, {c->vocab_size}};
    int n = 0;
    out[n++] = (tp_slot){&m->wte, vocab}; /* vocabulary-parallel embedding and output */
    if (m->lm_head) out[n++] = (tp_slot){&m->lm_head, vocab};
    for (int i = 0; i < c->n_layer; i++) {
        gpt_layer *L = &m->layers[i];
        out[n++] = (tp_slot){&L->qkv_w, qkv};
        if (L->qkv_b) out[n++] = (tp_slot){&L->qkv_b, qkv};
        out[n++] = (tp_slot){&L->proj_w, cols_h};
        out[n++] = (tp_slot){&L->fc_w, fc};
        if (L->fc_b) out[n++] = (tp_slot){&L->fc_b, fc};
        out[n++] = (tp_slot){&L->fc2_w, cols_f};
    }
    return n;
}

static tp_slot *slots_new(fm_gpt *m, int *n) {
    tp_slot *s = calloc((size_t)(6 * m->cfg.n_layer + 4), sizeof *s);
    if (!s) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    *n = tp_slots(m, s);
    return s;
}

fm_status fm_gpt_tp_check(const fm_gpt_config *c, int tp) {
    if (!c) return fm_set_error(FM_ERR_INVALID, "tensor parallel: config is NULL");
    const int kv = c->arch == FM_GPT_LLAMA ? c->n_kv_head : c->n_head;
    if (tp < 1) return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d: needs 1 or more ranks", tp);
    if (tp > c->n_head)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d is larger than the model's %d attention heads "
                            "(n_head): each rank needs at least one whole head", tp, c->n_head);
    if (c->n_head % tp)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d does not divide the model's %d attention heads "
                            "(n_head): each rank holds n_head / %d whole heads; use a divisor of %d", tp, c->n_head, tp,
                            c->n_head);
    if (kv % tp)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d does not divide the model's %d key/value heads "
                            "(n_kv_head, grouped-query attention): use a divisor of %d", tp, kv, kv);
    if (c->vocab_size % tp)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d does not divide the vocabulary of %d tokens "
                            "(vocab_size; the embedding is split by vocabulary): use a divisor of %d or a vocabulary "
                            "size that %d divides", tp, c->vocab_size, c->vocab_size, tp);
    if (c->ffn_hidden % tp)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d does not divide the MLP width %d (ffn_hidden): use "
                            "a divisor of %d", tp, c->ffn_hidden, c->ffn_hidden);
    return FM_OK;
}

fm_status fm_gpt_set_tensor_parallel(fm_gpt *m, fm_dist *tp) {
    if (!m || !tp) return fm_set_error(FM_ERR_INVALID, "tensor parallel: needs a model and a communicator");
    if (m->tp) return fm_set_error(FM_ERR_STATE, "tensor parallel: the model is already split");
    const int T = fm_dist_size(tp), r = fm_dist_rank(tp);
    fm_status st = fm_gpt_tp_check(&m->cfg, T);
    if (st) return st;
    if ((fm_gpt_device(m).type != FM_DEV_CPU && fm_gpt_device(m).type != FM_DEV_META) || m->wte->dtype != FM_F32)
        return fm_set_error(FM_ERR_UNSUPPORTED, "tensor parallel: f32 models on the CPU only here");
    int n;
    tp_slot *s = slots_new(m, &n);
    if (!s) return fm_last_status();
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    for (int k = 0; k < n && st == FM_OK; k++) {
        fm_tensor *old = *s[k].p, *sh = fm_tp_shard(T, r, old, &s[k].s);
        if (!sh) { st = fm_last_status(); break; }
        fm_tensor_requires_grad_(sh, true);
        for (int i = 0; i < m->params.n; i++)
            if (m->params.items[i].tensor == old) m->params.items[i].tensor = sh;
        for (int i = 0; i < m->n_hf; i++) /* not used on a split model (save/load refuse it): no stale pointers */
            if (m->hf[i].t == old) m->hf[i].t = sh;
        *s[k].p = sh;
        fm_tensor_release(old);
    }
    fm_memory_tag_pop(mc);
    free(s);
    if (st) return st;
    m->tp = tp;
    m->tp_size = T;
    m->tp_rank = r;
    return FM_OK;
}

bool fm_gpt_tp_split(const fm_gpt *m, const fm_tensor *param, fm_tp_split *out) {
    if (!m || !m->tp || !param) return false;
    int n;
    tp_slot *s = slots_new((fm_gpt *)m, &n);
    bool found = false;
    for (int k = 0; s && k < n && !found; k++)
        if (*s[k].p == param) {
            found = true;
            if (out) *out = s[k].s;
        }
    free(s);
    return found;
}

fm_dist *fm_gpt_tp_group(const fm_gpt *m) { return m ? m->tp : NULL; }

fm_gpt *fm_gpt_tp_gather_model(fm_gpt *m) {
    if (!m) { fm_set_error(FM_ERR_INVALID, "tensor parallel: model is NULL"); return NULL; }
    fm_rng scratch; /* its values are overwritten: leave the global generator where it is */
    fm_rng_init(&scratch, 0);
    fm_gpt *full = fm_gpt_new(&m->cfg, &scratch);
    if (!full) return NULL;
    fm_status st = FM_OK;
    /* next to m (the planner's run is on the meta device) */
    if (fm_gpt_device(m).type != FM_DEV_CPU && (st = fm_gpt_to(full, fm_gpt_device(m)))) { fm_gpt_free(full); return NULL; }
    bool prev = fm_set_grad_enabled(false);
    for (int i = 0; i < m->params.n && st == FM_OK; i++) {
        fm_tensor *p = m->params.items[i].tensor, *g = NULL;
        fm_tp_split sp;
        bool split = fm_gpt_tp_split(m, p, &sp);
        if (split && !(g = fm_tp_gather(m->tp, p, &sp))) { st = fm_last_status(); break; }
        st = fm_copy_(full->params.items[i].tensor, split ? g : p);
        fm_tensor_release(g);
    }
    fm_set_grad_enabled(prev);
    if (st) { fm_gpt_free(full); return NULL; }
    full->rng->offset = m->rng->offset;
    return full;
}

fm_status fm_gpt_tp_load_model(fm_gpt *m, fm_gpt *full) {
    if (!m || !full || full->params.n != m->params.n)
        return fm_set_error(FM_ERR_INVALID, "tensor parallel: the whole model does not match this one");
    fm_status st = FM_OK;
    bool prev = fm_set_grad_enabled(false);
    for (int i = 0; i < m->params.n && st == FM_OK; i++) {
        fm_tensor *p = m->params.items[i].tensor, *f = full->params.items[i].tensor, *sh = NULL;
        fm_tp_split sp;
        if (fm_gpt_tp_split(m, p, &sp) && !(sh = fm_tp_shard(m->tp_size, m->tp_rank, f, &sp))) st = fm_last_status();
        else st = fm_copy_(p, sh ? sh : f);
        fm_tensor_release(sh);
    }
    fm_set_grad_enabled(prev);
    return st;
}

/* ---- for the trainer: optimizer state and the gradient norm under tensor parallelism ---- */

/* The split of the parameter an optimizer state tensor belongs to ("<param>.exp_avg"). */
static bool state_split(const fm_gpt *m, const char *state_name, fm_tp_split *out) {
    const char *dot = strrchr(state_name, '.');
    if (!dot) return false;
    char p[256];
    snprintf(p, sizeof p, "%.*s", (int)(dot - state_name), state_name);
    int i = fm_named_list_find(&m->params, p);
    return i >= 0 && fm_gpt_tp_split(m, m->params.items[i].tensor, out);
}

fm_status gpt_tp_full_state(const fm_gpt *m, const fm_named_list *local, fm_named_list *full) {
    memset(full, 0, sizeof *full);
    full->owns_tensors = true;
    fm_status st = FM_OK;
    for (int i = 0; i < local->n && st == FM_OK; i++) {
        fm_tp_split sp;
        fm_tensor *t = local->items[i].tensor;
        fm_tensor *g = state_split(m, local->items[i].name, &sp) ? fm_tp_gather(m->tp, t, &sp) : fm_tensor_retain(t);
        st = g ? fm_named_list_push(full, local->items[i].name, g, false, true) : fm_last_status();
        fm_tensor_release(g);
    }
    if (st) fm_named_list_free(full);
    return st;
}

fm_status gpt_tp_load_state(const fm_gpt *m, const fm_named_list *file, const char *path, fm_named_list *local) {
    fm_status st = FM_OK;
    char a[96], b[96];
    bool prev = fm_set_grad_enabled(false);
    for (int i = 0; i < local->n && st == FM_OK; i++) {
        fm_tensor *dst = local->items[i].tensor, *sh = NULL;
        int k = fm_named_list_find(file, local->items[i].name);
        fm_tp_split sp;
        if (k < 0) { st = fm_set_error(FM_ERR_FORMAT, "%s: optimizer state '%s' is missing", path, local->items[i].name); break; }
        fm_tensor *src = file->items[k].tensor;
        if (state_split(m, local->items[i].name, &sp) && !(sh = fm_tp_shard(m->tp_size, m->tp_rank, src, &sp))) {
            st = fm_last_status();
            fm_error_prefix("%s: optimizer state '%s'", path, local->items[i].name);
            break;
        }
        fm_tensor *s = sh ? sh : src;
        if (s->ndim != dst->ndim || fm_tensor_numel(s) != fm_tensor_numel(dst) || memcmp(s->shape, dst->shape, sizeof(int64_t) * (size_t)s->ndim))
            st = fm_set_error(FM_ERR_FORMAT, "%s: optimizer state '%s' is %s, this model's part of it %s", path,
                              local->items[i].name, fm_shape_str(src->ndim, src->shape, a, sizeof a),
                              fm_shape_str(dst->ndim, dst->shape, b, sizeof b));
        else st = fm_copy_(dst, s);
        fm_tensor_release(sh);
    }
    fm_set_grad_enabled(prev);
    return st;
}

/* *acc += the sum of squares of g (contiguous f32, any device: a device's values are read
 * through a host copy), in index order, in double: the CPU's bits on every device. */
static fm_status add_sum_sq(const fm_tensor *g, const char *name, double *acc) {
    if (g->dtype != FM_F32 || !fm_tensor_is_contiguous(g))
        return fm_set_error(FM_ERR_UNSUPPORTED, "tensor parallel: the gradient of '%s' is not a contiguous f32 tensor", name);
    const int64_t n = fm_tensor_numel(g);
    float *h = NULL;
    if (fm_tensor_device(g).type != FM_DEV_CPU) {
        if (!(h = malloc(sizeof(float) * (size_t)(n ? n : 1))))
            return fm_set_error(FM_ERR_OOM, "tensor parallel: out of host memory for the gradient of '%s'", name);
        if (fm_tensor_copy_to_host(g, h, FM_F32) != FM_OK) { free(h); return fm_last_status(); }
    }
    const float *v = h ? h : fm_tensor_data(g);
    for (int64_t j = 0; j < n; j++) *acc += (double)v[j] * v[j];
    free(h);
    return FM_OK;
}

/* The clipping norm's sum of squares over the whole model: the split parameters' parts
 * are summed over the group, the replicated ones (equal on every rank) counted once. */
fm_status gpt_tp_norm_reduce(double *ss, void *ctx) {
    const fm_gpt *m = ctx;
    double rep = 0;
    for (int i = 0; i < m->params.n; i++) {
        fm_tensor *p = m->params.items[i].tensor, *g = p->grad;
        if (!g || fm_gpt_tp_split(m, p, NULL) || fm_tensor_device(g).type == FM_DEV_META) continue;
        if (add_sum_sq(g, m->params.items[i].name, &rep)) return fm_last_status();
    }
    *ss -= rep * (double)(m->tp_size - 1) / m->tp_size;
    return fm_dist_allreduce_sum_f64(m->tp, ss, 1);
}

/* ZeRO-1 under tensor parallelism: the sharded optimizer's parameters are 1-D views of
 * parts of this rank's (split or replicated) parameters, and its sum of squares covers
 * its own parts only. Summed over the data-parallel group (with the replicated
 * parameters' share alongside), it is this rank's whole sum; then, as
 * gpt_tp_norm_reduce, the split parameters' sums are added over the tensor-parallel
 * group and the replicated ones counted once. */
fm_status gpt_tp_zero_norm_reduce(double *ss, void *ctx) {
    const gpt_tp_zero_norm *z = ctx;
    const fm_gpt *m = z->m;
    double v[2] = {*ss, 0}; /* the sum, its replicated part */
    for (int i = 0, n = fm_optim_param_count(z->shard); i < n; i++) {
        const char *name;
        fm_tensor *view;
        if (fm_optim_param_at(z->shard, i, &name, &view, NULL) != FM_OK) return fm_last_status();
        fm_tensor *g = view->grad;
        int k = fm_named_list_find(&m->params, name);
        if (k < 0) return fm_set_error(FM_ERR_STATE, "tensor parallel: the sharded optimizer's '%s' is not a parameter", name);
        if (!g || fm_gpt_tp_split(m, m->params.items[k].tensor, NULL) || fm_tensor_device(g).type == FM_DEV_META) continue;
        if (add_sum_sq(g, name, &v[1])) return fm_last_status();
    }
    if (fm_dist_allreduce_sum_f64(z->dp, v, 2) != FM_OK) return fm_last_status();
    *ss = v[0] - v[1] * (double)(m->tp_size - 1) / m->tp_size;
    return fm_dist_allreduce_sum_f64(m->tp, ss, 1);
}

int64_t gpt_tp_num_params(const fm_gpt_config *c, int tp) {
    int64_t n = fm_gpt_config_num_params(c);
    if (tp <= 1 || n < 0) return n;
    const bool llama = c->arch == FM_GPT_LLAMA, bias = c->bias && !llama;
    const int64_t C = c->n_embd, F = c->ffn_hidden, H = c->n_head, D = fm_gpt_head_dim(c), KV = llama ? c->n_kv_head : H;
    int64_t split = (c->untied_head ? 2 : 1) * (int64_t)c->vocab_size * C +
                    c->n_layer * ((H + 2 * KV) * D * C + C * H * D + (llama ? 3 : 2) * F * C +
                                  (bias ? (H + 2 * KV) * D + F : 0) + (llama && c->qkv_bias ? (H + 2 * KV) * D : 0));
    return n - split + split / tp;
}

/* The split of a whole model's parameter p when the model is split T ways (NULL: replicated). */
static const fm_tp_split *whole_split(const tp_slot *s, int n, const fm_tensor *p) {
    for (int k = 0; k < n; k++)
        if (*s[k].p == p) return &s[k].s;
    return NULL;
}

/* parts[t]'s tensor `name`, or an error naming the file's rank. */
static fm_tensor *part_of(const fm_named_list *parts, int t, const char *name, const char *path) {
    int k = fm_named_list_find(&parts[t], name);
    if (k < 0) fm_set_error(FM_ERR_FORMAT, "%s: tensor-parallel rank %d's file has no '%s'", path, t, name);
    return k < 0 ? NULL : parts[t].items[k].tensor;
}

/* One whole tensor from the T parts' `name` (split as sp, or replicated: part 0's). */
static fm_tensor *assemble_one(const fm_named_list *parts, int T, const char *name, const fm_tp_split *sp,
                               const char *path) {
    fm_tensor *sh[64];
    if (T > 64) { fm_set_error(FM_ERR_UNSUPPORTED, "%s: more than 64 tensor-parallel parts", path); return NULL; }
    for (int t = 0; t < (sp ? T : 1); t++)
        if (!(sh[t] = part_of(parts, t, name, path))) return NULL;
    if (!sp) return fm_tensor_retain(sh[0]);
    fm_tensor *w = fm_tp_unshard(T, sh, sp);
    if (!w) fm_error_prefix("%s: '%s'", path, name);
    return w;
}

fm_status gpt_tp_assemble(fm_gpt *whole, int T, const fm_named_list *parts, const char *path, fm_named_list *state) {
    memset(state, 0, sizeof *state);
    state->owns_tensors = true;
    int n;
    tp_slot *s = slots_new(whole, &n);
    if (!s) return fm_last_status();
    fm_status st = FM_OK;
    char name[600], a[96], b[96];
    bool prev = fm_set_grad_enabled(false);
    for (int i = 0; i < whole->params.n && st == FM_OK; i++) {
        fm_tensor *p = whole->params.items[i].tensor;
        const fm_tp_split *sp = whole_split(s, n, p);
        snprintf(name, sizeof name, "model.%s", whole->params.items[i].name);
        fm_tensor *w = assemble_one(parts, T, name, sp, path);
        if (!w) { st = fm_last_status(); break; }
        if (w->ndim != p->ndim || memcmp(w->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim))
            st = fm_set_error(FM_ERR_FORMAT, "%s: '%s' put together is %s, this model's %s", path, name,
                              fm_shape_str(w->ndim, w->shape, a, sizeof a), fm_shape_str(p->ndim, p->shape, b, sizeof b));
        else st = fm_copy_(p, w);
        fm_tensor_release(w);
        /* the parameter's optimizer state: every "optim.<param>.<slot>" of part 0 */
        const size_t pl = strlen(whole->params.items[i].name);
        for (int k = 0; k < parts[0].n && st == FM_OK; k++) {
            const char *nm = parts[0].items[k].name;
            if (strncmp(nm, "optim.", 6) || strncmp(nm + 6, whole->params.items[i].name, pl) || nm[6 + pl] != '.' ||
                strchr(nm + 7 + pl, '.'))
                continue;
            fm_tensor *t = assemble_one(parts, T, nm, sp, path);
            st = t ? fm_named_list_push(state, nm + 6, t, false, true) : fm_last_status();
            fm_tensor_release(t);
        }
    }
    fm_set_grad_enabled(prev);
    free(s);
    if (st) fm_named_list_free(state);
    return st;
}
