/* Batched decoding over a paged KV cache: see gpt_paged.h. The linear layers run
 * on all n tokens at once through the op front ends (one GEMM per weight per
 * step, shared by every sequence); attention is per sequence over its own
 * blocks, written here as loops over host floats since each sequence has its own
 * length. The math follows the unfused block in gpt_model.c (norm, QKV, RoPE for
 * Llama, attention, projection, residual, norm, MLP, residual); tests/test_gpt_paged.c
 * checks the logits against fm_gpt_forward. */
#include "gpt/gpt_paged.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "gpt/gpt_internal.h"
#include "gpt/gpt_paged_attn.h"

struct fm_gpt_paged {
    int n_layer, H, KV, D, BT, n_blocks, max_seqs, max_blocks_per_seq, block_size;
    void **k, **v;       /* per layer: [n_blocks][KV][BT][D] (keys: [n_blocks][KV][D][BT], transposed per block), f32 or f16 */
    bool f16;            /* the blocks in half precision (kv_dtype FM_F16) */
    int *free_list, n_free;
    int **table;         /* per sequence: its blocks */
    int *n_alloc;        /* per sequence: blocks in its table */
    int64_t *len;        /* per sequence: cached positions; -1: slot free */
    /* the linear weights in linear_fused's panel form, made once here: per layer
     * qkv, proj, fc, fc2 (PK_PER_LAYER), then the output head; and the weight
     * tensor each was made from, which a step checks the model still holds */
    fm_tensor **pk;
    const fm_tensor **pk_src;
    int n_pk;
    /* quantized forms (fm_gpt_paged_new_ex): per packed index (kind F32: pk is used),
     * and the token table */
    fm_paged_linear *ql, emb;
};

#define PK_PER_LAYER 4

static fm_tensor *head_weight(const fm_gpt *m) { return m->lm_head ? m->lm_head : m->wte; }

/* the weight of packed tensor i: per layer qkv, proj, fc, fc2; last the head */
static const fm_tensor *pk_weight(const fm_gpt *m, const fm_gpt_paged *p, int i) {
    if (i == p->n_pk - 1) return head_weight(m);
    const gpt_layer *L = &m->layers[i / PK_PER_LAYER];
    const fm_tensor *w[PK_PER_LAYER] = {L->qkv_w, L->proj_w, L->fc_w, L->fc2_w};
    return w[i % PK_PER_LAYER];
}

/* The linear layers run linear_fused on weights packed once, here, rather than
 * linear's GEMM: every output is then one sum over k in order whatever the number
 * of rows (linear_packed.h), so a sequence's logits are bitwise the same whether
 * it decodes alone (one row: the GEMV before), with 15 others, or within a prompt
 * chunk, and the 2-16-row products of a batched step run the register-tiled
 * kernel instead of a dot product per output (gemm_smallm.h). The packed copies
 * cost as much memory again as the linear weights. */
static fm_paged_linear lin_retain(const fm_paged_linear *l) {
    fm_paged_linear r = *l;
    fm_tensor_retain(r.w);
    fm_tensor_retain(r.scale);
    fm_tensor_retain(r.aux);
    return r;
}

static void lin_release(fm_paged_linear *l) {
    fm_tensor_release_n(3, l->w, l->scale, l->aux);
    memset(l, 0, sizeof *l);
}

void fm_paged_weights_free(fm_paged_weights *q) {
    if (!q) return;
    for (int i = 0; q->lin && i < q->n_lin; i++) lin_release(&q->lin[i]);
    free(q->lin);
    lin_release(&q->emb);
    q->lin = NULL;
    q->n_lin = 0;
}

/* Packs the f32 linears; takes references to the quantized ones (q may be NULL). */
static fm_status pack_weights(const fm_gpt *m, fm_gpt_paged *p, const fm_paged_weights *q) {
    p->n_pk = p->n_layer * PK_PER_LAYER + 1;
    if (q && q->n_lin != p->n_pk)
        return fm_set_error(FM_ERR_INVALID, "paged cache: %d quantized linears given for a model of %d", q->n_lin, p->n_pk);
    p->pk = calloc((size_t)p->n_pk, sizeof *p->pk);
    p->pk_src = calloc((size_t)p->n_pk, sizeof *p->pk_src);
    p->ql = calloc((size_t)p->n_pk, sizeof *p->ql);
    if (!p->pk || !p->pk_src || !p->ql) return fm_set_error(FM_ERR_OOM, "paged cache: out of host memory for the packed weights");
    if (q && (q->emb.kind == FM_PAGED_LIN_INT4 || q->emb.kind == FM_PAGED_LIN_INT8)) p->emb = lin_retain(&q->emb);
    bool prev = fm_set_grad_enabled(false);
    fm_status st = FM_OK;
    for (int i = 0; i < p->n_pk && st == FM_OK; i++) {
        const fm_tensor *w = pk_weight(m, p, i);
        p->pk_src[i] = w;
        if (q && q->lin[i].kind != FM_PAGED_LIN_F32) p->ql[i] = lin_retain(&q->lin[i]);
        else if (fm_tensor_device(w).type != FM_DEV_CPU)
            st = fm_set_error(FM_ERR_INVALID, "paged cache: linear %d has neither f32 weights on the CPU nor a quantized form", i);
        else if (!(p->pk[i] = fm_linear_fused_pack((fm_tensor *)w))) st = fm_last_status();
    }
    fm_set_grad_enabled(prev);
    return st;
}

fm_gpt_paged *fm_gpt_paged_new(const fm_gpt *m, int n_blocks, int block_tokens, int max_seqs) {
    return fm_gpt_paged_new_ex(m, NULL, n_blocks, block_tokens, max_seqs, FM_F32);
}

fm_gpt_paged *fm_gpt_paged_new_ex(const fm_gpt *m, const fm_paged_weights *q, int n_blocks, int block_tokens, int max_seqs, fm_dtype kv_dtype) {
    if (q && q->n_lin == 0 && !q->emb.w) q = NULL; /* none given */
    if (kv_dtype != FM_F32 && kv_dtype != FM_F16) {
        fm_set_error(FM_ERR_INVALID, "paged cache: the KV cache's dtype must be f32 or f16, got %s", fm_dtype_name(kv_dtype));
        return NULL;
    }
    /* the final norm's weight stands for the model's (wte may be a quantized table's placeholder) */
    if (m->lnf_w->dtype != FM_F32 || fm_tensor_device(m->lnf_w).type != FM_DEV_CPU) {
        fm_set_error(FM_ERR_UNSUPPORTED, "paged decoding needs an f32 model on the CPU");
        return NULL;
    }
    if (fm_gpt_head_dim(&m->cfg) > 1024 ||
        (m->cfg.arch == FM_GPT_LLAMA && (m->rope_cos->dtype != FM_F32 || !fm_tensor_is_contiguous(m->rope_cos) ||
                                         !fm_tensor_is_contiguous(m->rope_sin)))) {
        fm_set_error(FM_ERR_UNSUPPORTED, "paged decoding: head size over 1024 or non-f32 RoPE tables");
        return NULL;
    }
    if (n_blocks < 1 || block_tokens < 1 || max_seqs < 1) {
        fm_set_error(FM_ERR_INVALID, "paged cache: blocks, block size and sequences must be >= 1");
        return NULL;
    }
    fm_gpt_paged *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    p->n_layer = m->cfg.n_layer;
    p->H = m->cfg.n_head;
    p->KV = m->n_kv;
    p->D = fm_gpt_head_dim(&m->cfg);
    p->BT = block_tokens;
    p->n_blocks = n_blocks;
    p->max_seqs = max_seqs;
    p->block_size = m->cfg.block_size;
    p->f16 = kv_dtype == FM_F16;
    p->max_blocks_per_seq = (m->cfg.block_size + block_tokens - 1) / block_tokens;
    size_t per_layer = (size_t)n_blocks * (size_t)p->KV * (size_t)block_tokens * (size_t)p->D;
    p->k = calloc((size_t)p->n_layer, sizeof *p->k);
    p->v = calloc((size_t)p->n_layer, sizeof *p->v);
    p->free_list = malloc(sizeof(int) * (size_t)n_blocks);
    p->table = calloc((size_t)max_seqs, sizeof *p->table);
    p->len = malloc(sizeof(int64_t) * (size_t)max_seqs);
    p->n_alloc = calloc((size_t)max_seqs, sizeof(int));
    if (!p->k || !p->v || !p->free_list || !p->table || !p->len || !p->n_alloc) goto oom;
    for (int l = 0; l < p->n_layer; l++)
        if (!(p->k[l] = malloc(per_layer * (p->f16 ? 2 : 4))) || !(p->v[l] = malloc(per_layer * (p->f16 ? 2 : 4)))) goto oom;
    for (int s = 0; s < max_seqs; s++) {
        if (!(p->table[s] = malloc(sizeof(int) * (size_t)p->max_blocks_per_seq))) goto oom;
        p->len[s] = -1;
    }
    for (int b = 0; b < n_blocks; b++) p->free_list[b] = n_blocks - 1 - b;
    p->n_free = n_blocks;
    if (pack_weights(m, p, q) != FM_OK) {
        fm_gpt_paged_free(p);
        return NULL;
    }
    return p;
oom:
    fm_gpt_paged_free(p);
    fm_set_error(FM_ERR_OOM, "paged cache: out of host memory for %d blocks of %d tokens", n_blocks, block_tokens);
    return NULL;
}

void fm_gpt_paged_free(fm_gpt_paged *p) {
    if (!p) return;
    for (int l = 0; l < p->n_layer; l++) {
        if (p->k) free(p->k[l]);
        if (p->v) free(p->v[l]);
    }
    for (int s = 0; p->table && s < p->max_seqs; s++) free(p->table[s]);
    free(p->k);
    free(p->v);
    free(p->free_list);
    free(p->table);
    free(p->len);
    free(p->n_alloc);
    for (int i = 0; p->pk && i < p->n_pk; i++) fm_tensor_release(p->pk[i]);
    for (int i = 0; p->ql && i < p->n_pk; i++) lin_release(&p->ql[i]);
    lin_release(&p->emb);
    free(p->ql);
    free(p->pk);
    free(p->pk_src);
    free(p);
}

int fm_gpt_paged_free_blocks(const fm_gpt_paged *p) { return p->n_free; }
int fm_gpt_paged_total_blocks(const fm_gpt_paged *p) { return p->n_blocks; }
int fm_gpt_paged_block_tokens(const fm_gpt_paged *p) { return p->BT; }
size_t fm_gpt_paged_block_bytes(const fm_gpt_paged *p) {
    return (size_t)2 * (size_t)p->n_layer * (size_t)p->KV * (size_t)p->BT * (size_t)p->D * (p->f16 ? 2 : 4);
}
int64_t fm_gpt_paged_len(const fm_gpt_paged *p, int seq) { return p->len[seq]; }

int fm_gpt_paged_open(fm_gpt_paged *p) {
    for (int s = 0; s < p->max_seqs; s++)
        if (p->len[s] < 0) { p->len[s] = 0; return s; }
    return -1;
}

void fm_gpt_paged_close(fm_gpt_paged *p, int seq) {
    if (seq < 0 || seq >= p->max_seqs || p->len[seq] < 0) return;
    for (int b = 0; b < p->n_alloc[seq]; b++) p->free_list[p->n_free++] = p->table[seq][b];
    p->n_alloc[seq] = 0;
    p->len[seq] = -1;
}

int fm_gpt_paged_need_n(const fm_gpt_paged *p, int seq, int k) {
    int64_t blocks = (p->len[seq] + k + p->BT - 1) / p->BT;
    return blocks > p->n_alloc[seq] ? (int)(blocks - p->n_alloc[seq]) : 0;
}

int fm_gpt_paged_need(const fm_gpt_paged *p, int seq) { return fm_gpt_paged_need_n(p, seq, 1); }

/* Position t of sequence s, kv head g: the element offset of its cached value row in a
 * layer's pool (t at a block's start: the block, which for keys holds them transposed,
 * D x BT). */
static size_t slot(const fm_gpt_paged *p, int s, int64_t t, int g) {
    int blk = p->table[s][t / p->BT];
    return (((size_t)blk * (size_t)p->KV + (size_t)g) * (size_t)p->BT + (size_t)(t % p->BT)) * (size_t)p->D;
}

/* Position t's key into its block's transposed layout (gpt_paged_attn.h) and its value
 * into its row, rounded to f16 for an f16 cache. */
static void put_kv(const fm_gpt_paged *p, int l, int s, int64_t t, int g, const float *k, const float *v) {
    const size_t kt = slot(p, s, t - t % p->BT, g) + (size_t)(t % p->BT), vt = slot(p, s, t, g);
    if (p->f16) {
        uint16_t *kp = (uint16_t *)p->k[l] + kt;
        for (int e = 0; e < p->D; e++) kp[(size_t)e * (size_t)p->BT] = fm_f32_to_f16(k[e]);
        fm_convert_f32_to_f16(v, (uint16_t *)p->v[l] + vt, (size_t)p->D);
        return;
    }
    float *kp = (float *)p->k[l] + kt;
    for (int e = 0; e < p->D; e++) kp[(size_t)e * (size_t)p->BT] = k[e];
    memcpy((float *)p->v[l] + vt, v, sizeof(float) * (size_t)p->D);
}

/* Rotate-half RoPE of one head vector at position pos (as gpt_model.c's rope). */
static void rope_vec(const fm_gpt *m, float *x, int D, int64_t pos) {
    const float *cs = (const float *)fm_tensor_data(m->rope_cos) + pos * D;
    const float *sn = (const float *)fm_tensor_data(m->rope_sin) + pos * D;
    float tmp[1024];
    for (int i = 0; i < D; i++) tmp[i] = x[i];
    for (int i = 0; i < D; i++) {
        float rot = i < D / 2 ? -tmp[i + D / 2] : tmp[i - D / 2];
        x[i] = tmp[i] * cs[i] + rot * sn[i];
    }
}

/* One (row, kv head) pair of a step's attention per item: the row's query heads of
 * that kv head over the row's sequence's cached positions 0..pos. */
typedef struct attend_ctx {
    const fm_gpt_paged *p;
    int l;
    const int *seqs;
    const int64_t *poss;
    const float *qkv;
    float *att;
    float scale;
    void (*head)(const fm_paged_head *);
    _Atomic int oom;
} attend_ctx;

static void attend_items(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    attend_ctx *c = vctx;
    const fm_gpt_paged *p = c->p;
    const int H = p->H, KV = p->KV, D = p->D, G = H / KV, W = (H + 2 * KV) * D;
    /* this call's scratch: one sequence's block pointers for one kv head, and the scores */
    const void **kb = malloc(sizeof *kb * 2 * (size_t)p->max_blocks_per_seq);
    float *scores = malloc(sizeof(float) * (size_t)p->block_size);
    if (!kb || !scores) {
        c->oom = 1;
        free(kb);
        free(scores);
        return;
    }
    const void **vb = kb + p->max_blocks_per_seq;
    const size_t es = p->f16 ? 2 : 4;
    for (int64_t it = b; it < e; it++) {
        const int i = (int)(it / KV), g = (int)(it % KV), s = c->seqs[i];
        const int64_t pos = c->poss[i];
        const float *q = c->qkv + (size_t)i * W;
        for (int64_t blk = 0; blk * p->BT <= pos; blk++) {
            kb[blk] = (const char *)p->k[c->l] + es * slot(p, s, blk * p->BT, g);
            vb[blk] = (const char *)p->v[c->l] + es * slot(p, s, blk * p->BT, g);
        }
        for (int h = g * G; h < (g + 1) * G; h++) {
            fm_paged_head a = {q + h * D, NULL, NULL, D, p->BT, pos + 1, c->scale, scores, c->att + (size_t)i * H * D + h * D, NULL, NULL};
            if (p->f16) a.kh = (const uint16_t *const *)kb, a.vh = (const uint16_t *const *)vb;
            else a.k = (const float *const *)kb, a.v = (const float *const *)vb;
            c->head(&a);
        }
    }
    free(kb);
    free(scores);
}

static _Atomic int64_t g_parallel_min = (int64_t)1 << 16;
void fm_gpt_paged_set_parallel_min(int64_t multiply_adds) { g_parallel_min = multiply_adds; }

/* qkv [n, (H+2KV)*D] (host) -> att [n, H*D]: row i is sequence seqs[i] at position
 * pos[i]; it caches its k/v there and attends over positions 0..pos[i]. A
 * sequence's rows come in position order, so a prompt chunk's later rows see the
 * earlier rows' keys (causal attention within the chunk): every row's k/v is
 * written first, then the (row, kv head) pairs run over the pool (each reads only
 * positions up to its own, all written by then). A pair runs the same kernel on
 * the same values wherever it runs, so a row's result does not depend on the
 * split. Steps of under 64K multiply-adds of attention (fm_gpt_paged_set_parallel_min)
 * stay on the calling thread. */
static fm_status attend(const fm_gpt *m, fm_gpt_paged *p, int l, int n, const int *seqs, const int64_t *poss, float *qkv,
                        float *att) {
    const int H = p->H, KV = p->KV, D = p->D, W = (H + 2 * KV) * D;
    int64_t work = 0; /* multiply-adds, to keep small steps off the pool */
    for (int i = 0; i < n; i++) {
        int s = seqs[i];
        int64_t pos = poss[i];
        float *q = qkv + (size_t)i * W, *k = q + H * D, *v = k + KV * D;
        if (m->cfg.arch == FM_GPT_LLAMA) {
            for (int h = 0; h < H; h++) rope_vec(m, q + h * D, D, pos);
            for (int g = 0; g < KV; g++) rope_vec(m, k + g * D, D, pos);
        }
        for (int g = 0; g < KV; g++) put_kv(p, l, s, pos, g, k + g * D, v + g * D);
        work += 2 * (pos + 1) * H * D;
    }
    attend_ctx c = {p, l, seqs, poss, qkv, att, 1.0f / sqrtf((float)D),
                    p->f16 ? (fm_cpu_use_avx2() ? fm_paged_head_f16_avx2 : fm_paged_head_f16_scalar)
                    : fm_cpu_use_avx512() ? fm_paged_head_f32_avx512
                    : fm_cpu_use_avx2()   ? fm_paged_head_f32_avx2
                                          : fm_paged_head_f32_scalar,
                    0};
    const int64_t items = (int64_t)n * KV;
    if (work < g_parallel_min || items < 2) attend_items(&c, 0, items, 0);
    else fm_parallel_for(items, 1, attend_items, &c);
    return c.oom ? fm_set_error(FM_ERR_OOM, "paged step: out of host memory for the attention's scratch") : FM_OK;
}

static bool upd(fm_tensor **acc, fm_tensor *next) {
    fm_tensor_release(*acc);
    *acc = next;
    return next != NULL;
}

static fm_tensor *norm(const fm_gpt *m, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    if (m->cfg.arch == FM_GPT_LLAMA) return fm_rms_norm(x, w, m->cfg.norm_eps);
    return fm_layer_norm(x, 1, w, b, m->cfg.norm_eps);
}

static fm_tensor *mlp_act(const fm_gpt *m, fm_tensor *h) {
    if (m->cfg.arch != FM_GPT_LLAMA) return fm_gelu_tanh(h);
    const int64_t F = m->cfg.ffn_hidden;
    fm_tensor *g = fm_narrow(h, 1, 0, F), *u = fm_narrow(h, 1, F, F);
    fm_tensor *sg = g ? fm_silu(g) : NULL;
    fm_tensor *y = sg && u ? fm_mul(sg, u) : NULL;
    fm_tensor_release_n(3, g, u, sg);
    return y;
}

/* x w^T + b with linear number i (pack_weights): its packed f32 weights or its
 * quantized form. int8's activations are quantized row by row (each at its own
 * range, where the graph's dynamic qlinear_int8 takes one range per call), so that,
 * as with f32 and int4, a sequence gets the same values alone or batched. */
static fm_tensor *lin(const fm_gpt_paged *p, int i, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    const fm_paged_linear *q = &p->ql[i];
    if (q->kind == FM_PAGED_LIN_INT4) return fm_qlinear_int4(x, q->w, q->scale, q->aux, b, q->group);
    if (q->kind == FM_PAGED_LIN_INT8) return fm_qlinear_int8_packed(x, q->w, q->scale, q->aux, b, FM_QLINEAR_INT8_PER_ROW, 0, FM_QACT_NONE);
    return fm_linear_fused(x, w, b, p->pk[i], false);
}

/* The MLP's first linear and its activation: GPT-2's tanh GELU runs in an int8
 * product's epilogue (bitwise the separate fm_gelu_tanh), else after it. */
static fm_tensor *lin_act(const fm_gpt *m, const fm_gpt_paged *p, int i, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    const fm_paged_linear *q = &p->ql[i];
    if (q->kind == FM_PAGED_LIN_INT8 && m->cfg.arch != FM_GPT_LLAMA)
        return fm_qlinear_int8_packed(x, q->w, q->scale, q->aux, b, FM_QLINEAR_INT8_PER_ROW, 0, FM_QACT_GELU_TANH);
    fm_tensor *h = lin(p, i, x, w, b), *y = h ? mlp_act(m, h) : NULL;
    fm_tensor_release(h);
    return y;
}

/* One block on x [n, C]; returns the new residual stream. */
static fm_tensor *paged_block(fm_gpt *m, fm_gpt_paged *p, int l, fm_tensor *x, int n, const int *seqs,
                              const int64_t *pos) {
    gpt_layer *L = &m->layers[l];
    const int H = p->H, D = p->D;
    fm_tensor *h = norm(m, x, L->ln1_w, L->ln1_b), *att = NULL, *r = NULL;
    const int pk = l * PK_PER_LAYER;
    if (!h || !upd(&h, lin(p, pk, h, L->qkv_w, L->qkv_b)) || !upd(&h, fm_contiguous(h))) goto fail;
    att = fm_tensor_empty(2, (int64_t[]){n, (int64_t)H * D}, FM_F32, fm_tensor_device(h)); /* the host: see the step */
    if (!att) goto fail;
    if (attend(m, p, l, n, seqs, pos, fm_tensor_data(h), fm_tensor_data(att)) != FM_OK) goto fail;
    if (!upd(&att, lin(p, pk + 1, att, L->proj_w, L->proj_b)) || !(r = fm_add(x, att))) goto fail;
    if (!upd(&h, norm(m, r, L->ln2_w, L->ln2_b)) || !upd(&h, lin_act(m, p, pk + 2, h, L->fc_w, L->fc_b)) ||
        !upd(&h, lin(p, pk + 3, h, L->fc2_w, L->fc2_b)))
        goto fail;
    fm_tensor *out = fm_add(r, h);
    fm_tensor_release_n(3, h, att, r);
    return out;
fail:
    fm_tensor_release_n(3, h, att, r);
    return NULL;
}

/* Checks a step's arguments and takes the blocks it needs (all or none). */
static fm_status reserve(const fm_gpt *m, fm_gpt_paged *p, int n, const int *seqs, const int *counts, const int32_t *tokens) {
    /* attention reads the activations through host pointers: a model moved off the CPU
     * after its cache was made (fm_gpt_to) is refused rather than read wrongly */
    if (fm_tensor_device(m->lnf_w).type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_UNSUPPORTED, "paged step: paged decoding runs on the CPU; the model was moved to "
                                                "another device (fm_gpt_to(m, cpu) first)");
    /* the packed copies are of the weights the cache was made with: a model whose
     * weights were replaced since (loaded, moved) is refused rather than run with
     * stale ones (weights changed in place are not seen: make a new cache) */
    for (int i = 0; i < p->n_pk; i++)
        if (pk_weight(m, p, i) != p->pk_src[i])
            return fm_set_error(FM_ERR_INVALID, "paged step: the model's weights are not those the cache was made with "
                                                "(make a new cache for this model)");
    int need = 0, r = 0;
    for (int i = 0; i < n; i++) {
        int s = seqs[i];
        if (s < 0 || s >= p->max_seqs || p->len[s] < 0)
            return fm_set_error(FM_ERR_INVALID, "paged step: sequence %d is not open", s);
        if (counts[i] < 1) return fm_set_error(FM_ERR_INVALID, "paged step: sequence %d is given %d tokens", s, counts[i]);
        if (p->len[s] + counts[i] > p->block_size)
            return fm_set_error(FM_ERR_INVALID, "paged step: sequence %d at %lld tokens cannot take %d more (context size %d)",
                                s, (long long)p->len[s], counts[i], p->block_size);
        for (int k = 0; k < counts[i]; k++, r++)
            if (tokens[r] < 0 || tokens[r] >= m->cfg.vocab_size)
                return fm_set_error(FM_ERR_INVALID, "paged step: token id %d outside the vocabulary", tokens[r]);
        for (int j = 0; j < i; j++)
            if (seqs[j] == s) return fm_set_error(FM_ERR_INVALID, "paged step: sequence %d given twice", s);
        need += fm_gpt_paged_need_n(p, s, counts[i]);
    }
    if (need > p->n_free) return fm_set_error(FM_ERR_OOM, "paged cache: %d blocks needed, %d free", need, p->n_free);
    for (int i = 0; i < n; i++)
        for (int k = fm_gpt_paged_need_n(p, seqs[i], counts[i]); k > 0; k--)
            p->table[seqs[i]][p->n_alloc[seqs[i]]++] = p->free_list[--p->n_free];
    return FM_OK;
}

/* x [R, C] -> [n, C]: the rows at last[0..n) (each sequence's last token). */
static fm_tensor *gather_rows(fm_tensor *x, int n, const int *last) {
    fm_tensor *xc = fm_contiguous(x);
    int64_t C = x->shape[1];
    fm_tensor *y = xc ? fm_tensor_empty(2, (int64_t[]){n, C}, FM_F32, fm_tensor_device(xc)) : NULL; /* the host: see the step */
    if (y) {
        const float *src = fm_tensor_data(xc);
        float *dst = fm_tensor_data(y);
        for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * C, src + (size_t)last[i] * C, sizeof(float) * (size_t)C);
    }
    fm_tensor_release(xc);
    return y;
}

fm_status fm_gpt_paged_step(fm_gpt *m, fm_gpt_paged *p, int n, const int *seqs, const int32_t *tokens, float *logits) {
    int *ones = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (!ones) return fm_set_error(FM_ERR_OOM, "paged step: out of host memory");
    for (int i = 0; i < n; i++) ones[i] = 1;
    fm_status st = fm_gpt_paged_step_n(m, p, n, seqs, ones, tokens, logits);
    free(ones);
    return st;
}

fm_status fm_gpt_paged_step_n(fm_gpt *m, fm_gpt_paged *p, int n, const int *seqs, const int *counts, const int32_t *tokens,
                              float *logits) {
    fm_status st = reserve(m, p, n, seqs, counts, tokens);
    if (st != FM_OK) return st;
    int R = 0;
    for (int i = 0; i < n; i++) R += counts[i];
    bool prev = fm_set_grad_enabled(false);
    /* per row: token id, position (as i64 for the embeddings), sequence; per sequence: its last row */
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)R * 2);
    int *rseq = malloc(sizeof(int) * ((size_t)R + (size_t)n));
    fm_tensor *x = NULL, *t = NULL, *pe = NULL;
    if (!ids || !rseq) { st = fm_set_error(FM_ERR_OOM, "paged step: out of host memory"); goto done; }
    int *last = rseq + R;
    for (int i = 0, r = 0; i < n; i++) {
        for (int k = 0; k < counts[i]; k++, r++) {
            ids[r] = tokens[r];
            ids[R + r] = p->len[seqs[i]] + k;
            rseq[r] = seqs[i];
        }
        last[i] = r - 1;
    }
    t = fm_tensor_from_data(ids, 1, (int64_t[]){R}, FM_I64);
    x = !t                               ? NULL
        : p->emb.kind == FM_PAGED_LIN_INT4 ? fm_qembedding_int4(p->emb.w, p->emb.scale, p->emb.aux, t, p->emb.group)
        : p->emb.kind == FM_PAGED_LIN_INT8 ? fm_qembedding_int8(p->emb.w, p->emb.scale, t, m->cfg.n_embd)
                                           : fm_embedding(m->wte, t);
    if (x && m->cfg.arch == FM_GPT_GPT2) {
        fm_tensor *pt = fm_tensor_from_data(ids + R, 1, (int64_t[]){R}, FM_I64);
        pe = pt ? fm_embedding(m->wpe, pt) : NULL;
        fm_tensor_release(pt);
        upd(&x, pe ? fm_add(x, pe) : NULL);
    }
    for (int l = 0; l < p->n_layer && x; l++) upd(&x, paged_block(m, p, l, x, R, rseq, ids + R));
    if (x && R > n) upd(&x, gather_rows(x, n, last)); /* the head only for the tokens that get sampled */
    if (x && upd(&x, norm(m, x, m->lnf_w, m->lnf_b)) && upd(&x, lin(p, p->n_pk - 1, x, head_weight(m), NULL)))
        st = fm_tensor_copy_to_host(x, logits, FM_F32);
    else
        st = fm_last_status();
    if (st == FM_OK)
        for (int i = 0; i < n; i++) p->len[seqs[i]] += counts[i];
done:
    /* on failure the blocks taken stay in their sequences' tables (len unchanged), so
     * fm_gpt_paged_need_n counts them as held next time: nothing leaks */
    fm_tensor_release_n(3, x, t, pe);
    free(ids);
    free(rseq);
    fm_set_grad_enabled(prev);
    return st;
}
