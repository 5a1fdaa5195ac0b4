/* BERT sentence encoders in sentence-transformers layout (see fathom/hf.h):
 * the encoder forward in fathom ops, then the pooling of 1_Pooling/config.json and
 * the Normalize module when modules.json lists one.
 *
 * Texts are batched by token count, so every batch is rectangular and needs no
 * padding or attention mask: the result is that of running each text alone, which
 * is what sentence-transformers' masked batches compute too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/io.h"
#include "fathom/nn.h"
#include "fathom/ops.h"
#include "fathom/quant.h"
#include "hf/hf_internal.h"

#define MAX_BATCH 64

typedef struct bert_layer {
    fm_tensor *qkv_w, *qkv_b, *ao_w, *ao_b, *ln1_w, *ln1_b, *in_w, *in_b, *out_w, *out_b, *ln2_w, *ln2_b;
    /* after fm_hf_encoder_quantize_int8: the int8 weights of the four linears (qkv,
     * attention output, intermediate, output) packed in panels (fm_pack_weight_int8),
     * their per-row scales and row sums; NULL: fp32 */
    fm_tensor *q[4], *qs[4], *qsum[4];
} bert_layer;

enum { POOL_CLS = 1, POOL_MAX = 2, POOL_MEAN = 4, POOL_MEAN_SQRT = 8 };

struct fm_hf_encoder {
    hf_bert_config c;
    fm_wordpiece *tok;
    int max_len, pool, n_pool;
    bool normalize;
    fm_tensor *word, *pos, *type, *eln_w, *eln_b;
    bert_layer *L;
};

void fm_hf_encoder_free(fm_hf_encoder *e) {
    if (!e) return;
    fm_wordpiece_free(e->tok);
    fm_tensor_release_n(5, e->word, e->pos, e->type, e->eln_w, e->eln_b);
    for (int i = 0; e->L && i < e->c.layers; i++) {
        bert_layer *l = &e->L[i];
        fm_tensor_release_n(12, l->qkv_w, l->qkv_b, l->ao_w, l->ao_b, l->ln1_w, l->ln1_b, l->in_w, l->in_b, l->out_w,
                            l->out_b, l->ln2_w, l->ln2_b);
        for (int k = 0; k < 4; k++) fm_tensor_release_n(3, l->q[k], l->qs[k], l->qsum[k]);
    }
    free(e->L);
    free(e);
}

int fm_hf_encoder_dim(const fm_hf_encoder *e) { return e ? e->c.hidden * e->n_pool : 0; }

/* ---------------- weights ---------------- */

typedef struct { fm_named_list l; const char *path; const char *prefix; bool *used; fm_status st; } wsrc;

/* The tensor `name` (under the file's prefix) as f32 of the given shape; NULL and
 * the error set otherwise. */
static fm_tensor *take(wsrc *w, const char *name, int64_t d0, int64_t d1) {
    if (w->st) return NULL;
    char full[200];
    snprintf(full, sizeof full, "%s%s", w->prefix, name);
    int j = fm_named_list_find(&w->l, full);
    if (j < 0) { w->st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' is missing", w->path, full); return NULL; }
    fm_tensor *t = w->l.items[j].tensor;
    w->used[j] = true;
    bool ok = d1 ? t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1 : t->ndim == 1 && t->shape[0] == d0;
    char a[96];
    if (!ok || !fm_dtype_is_float(t->dtype)) {
        w->st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' is %s %s; config.json implies f32 [%lld%s%lld]", w->path,
                             full, fm_dtype_name(t->dtype), fm_shape_str(t->ndim, t->shape, a, sizeof a),
                             (long long)d0, d1 ? ", " : "", (long long)d1);
        return NULL;
    }
    fm_tensor *f = fm_to_dtype(t, FM_F32);
    if (!f) w->st = fm_last_status();
    return f;
}

static fm_tensor *cat3(wsrc *w, const char *fmt, int i, const char *kind, int64_t H, bool weight) {
    static const char *const parts[] = {"query", "key", "value"};
    fm_tensor *t[3] = {NULL, NULL, NULL}, *r = NULL;
    char name[160];
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof name, fmt, i, parts[k], kind);
        t[k] = take(w, name, H, weight ? H : 0);
    }
    if (!w->st && !(r = fm_cat(3, t, 0))) w->st = fm_last_status();
    fm_tensor_release_n(3, t[0], t[1], t[2]);
    return r;
}

static void take_layer(wsrc *w, bert_layer *l, int i, int64_t H, int64_t I) {
    char n[160];
#define T(dst, d0, d1, ...) (snprintf(n, sizeof n, __VA_ARGS__), (dst) = take(w, n, d0, d1))
    l->qkv_w = cat3(w, "encoder.layer.%d.attention.self.%s.%s", i, "weight", H, true);
    l->qkv_b = cat3(w, "encoder.layer.%d.attention.self.%s.%s", i, "bias", H, false);
    T(l->ao_w, H, H, "encoder.layer.%d.attention.output.dense.weight", i);
    T(l->ao_b, H, 0, "encoder.layer.%d.attention.output.dense.bias", i);
    T(l->ln1_w, H, 0, "encoder.layer.%d.attention.output.LayerNorm.weight", i);
    T(l->ln1_b, H, 0, "encoder.layer.%d.attention.output.LayerNorm.bias", i);
    T(l->in_w, I, H, "encoder.layer.%d.intermediate.dense.weight", i);
    T(l->in_b, I, 0, "encoder.layer.%d.intermediate.dense.bias", i);
    T(l->out_w, H, I, "encoder.layer.%d.output.dense.weight", i);
    T(l->out_b, H, 0, "encoder.layer.%d.output.dense.bias", i);
    T(l->ln2_w, H, 0, "encoder.layer.%d.output.LayerNorm.weight", i);
    T(l->ln2_b, H, 0, "encoder.layer.%d.output.LayerNorm.bias", i);
#undef T
}

/* Tensors a BertModel file may hold that the encoder does not use. */
static bool unused_ok(const char *name) {
    return strstr(name, "position_ids") || !strncmp(name, "pooler.", 7) || !strncmp(name, "bert.pooler.", 12);
}

static fm_status load_weights(fm_hf_encoder *e, const char *dir) {
    wsrc w;
    memset(&w, 0, sizeof w);
    char *path = hf_path(dir, "model.safetensors");
    if (!path) return fm_last_status();
    w.path = path;
    w.st = fm_safetensors_load(path, &w.l, NULL);
    w.used = w.st ? NULL : calloc((size_t)w.l.n + 1, sizeof *w.used);
    if (!w.st && !w.used) w.st = fm_set_error(FM_ERR_OOM, "out of host memory");
    w.prefix = !w.st && fm_named_list_find(&w.l, "bert.embeddings.word_embeddings.weight") >= 0 ? "bert." : "";
    const hf_bert_config *c = &e->c;
    e->word = take(&w, "embeddings.word_embeddings.weight", c->vocab_size, c->hidden);
    e->pos = take(&w, "embeddings.position_embeddings.weight", c->max_pos, c->hidden);
    e->type = take(&w, "embeddings.token_type_embeddings.weight", c->type_vocab, c->hidden);
    e->eln_w = take(&w, "embeddings.LayerNorm.weight", c->hidden, 0);
    e->eln_b = take(&w, "embeddings.LayerNorm.bias", c->hidden, 0);
    for (int i = 0; i < c->layers && !w.st; i++) take_layer(&w, &e->L[i], i, c->hidden, c->intermediate);
    for (int j = 0; j < w.l.n && !w.st; j++)
        if (!w.used[j] && !unused_ok(w.l.items[j].name))
            w.st = fm_set_error(FM_ERR_FORMAT, "%s: unexpected tensor '%s': not a BertModel of this config", path,
                                w.l.items[j].name);
    fm_named_list_free(&w.l);
    free(w.used);
    free(path);
    return w.st;
}

/* ---------------- configuration files ---------------- */

/* An optional JSON file in dir: NULL (no error) when absent. */
static json_t *opt_json(const char *dir, const char *name, fm_status *st) {
    char *p = hf_path(dir, name);
    FILE *f = p ? fopen(p, "rb") : NULL;
    json_t *j = NULL;
    if (f) {
        fclose(f);
        json_error_t e;
        j = json_load_file(p, JSON_REJECT_DUPLICATES, &e);
        if (!j || (!json_is_object(j) && !json_is_array(j)))
            *st = fm_set_error(FM_ERR_FORMAT, "%s: line %d: %s", p, e.line, j ? "expected an object" : e.text);
    }
    free(p);
    return j;
}

/* modules.json: Transformer, Pooling, optional Normalize; the Pooling folder. */
static fm_status read_modules(fm_hf_encoder *e, const char *dir, char *pool_dir, size_t n) {
    fm_status st = FM_OK;
    json_t *m = opt_json(dir, "modules.json", &st);
    snprintf(pool_dir, n, "1_Pooling");
    for (size_t i = 0; m && !st && i < json_array_size(m); i++) {
        json_t *it = json_array_get(m, i);
        const char *type = json_string_value(json_object_get(it, "type")), *path = json_string_value(json_object_get(it, "path"));
        if (!type) type = "(no type)";
        const char *base = strrchr(type, '.') ? strrchr(type, '.') + 1 : type;
        if (!strcmp(base, "Normalize")) e->normalize = true;
        else if (!strcmp(base, "Pooling") && path && !strchr(path, '/') && strcmp(path, "..")) snprintf(pool_dir, n, "%s", path);
        else if (strcmp(base, "Transformer"))
            st = fm_set_error(FM_ERR_FORMAT, "%s/modules.json: module '%.80s' is not supported (Transformer, Pooling "
                              "and Normalize are)", dir, type);
    }
    json_decref(m);
    return st;
}

static fm_status read_pooling(fm_hf_encoder *e, const char *dir, const char *pool_dir) {
    char name[300];
    snprintf(name, sizeof name, "%s/config.json", pool_dir);
    fm_status st = FM_OK;
    json_t *p = opt_json(dir, name, &st);
    if (st) return st;
    if (!p) { e->pool = POOL_MEAN; e->n_pool = 1; return FM_OK; } /* sentence-transformers' default */
    static const struct { const char *key; int bit; } modes[] = {
        {"pooling_mode_cls_token", POOL_CLS}, {"pooling_mode_max_tokens", POOL_MAX},
        {"pooling_mode_mean_tokens", POOL_MEAN}, {"pooling_mode_mean_sqrt_len_tokens", POOL_MEAN_SQRT}};
    const char *key;
    json_t *v;
    json_object_foreach(p, key, v) {
        int bit = 0;
        for (size_t k = 0; k < 4; k++) if (!strcmp(key, modes[k].key)) bit = modes[k].bit;
        if (bit && json_is_true(v)) { e->pool |= bit; e->n_pool++; }
        else if (!bit && strcmp(key, "word_embedding_dimension") && strcmp(key, "include_prompt") && json_is_true(v))
            st = fm_set_error(FM_ERR_FORMAT, "%s/%s: '%s' is not supported (cls, max, mean, mean_sqrt_len are)", dir,
                              name, key);
    }
    json_t *dim = json_object_get(p, "word_embedding_dimension");
    if (!st && dim && json_integer_value(dim) != e->c.hidden)
        st = fm_set_error(FM_ERR_FORMAT, "%s/%s: word_embedding_dimension %lld is not the model's hidden size %d", dir,
                          name, (long long)json_integer_value(dim), e->c.hidden);
    if (!st && !e->n_pool) st = fm_set_error(FM_ERR_FORMAT, "%s/%s: no pooling mode is on", dir, name);
    json_decref(p);
    return st;
}

static fm_status read_tokenizer(fm_hf_encoder *e, const char *dir) {
    fm_status st = FM_OK;
    json_t *tc = opt_json(dir, "tokenizer_config.json", &st), *sb = opt_json(dir, "sentence_bert_config.json", &st);
    fm_wordpiece_opts o = fm_wordpiece_defaults();
    json_t *v;
    if ((v = json_object_get(tc, "do_lower_case"))) o.lowercase = json_is_true(v);
    if ((v = json_object_get(tc, "strip_accents")) && !json_is_null(v)) o.strip_accents = json_is_true(v);
    if ((v = json_object_get(tc, "tokenize_chinese_chars"))) o.chinese_chars = json_is_true(v);
    if (json_is_true(json_object_get(sb, "do_lower_case"))) o.lowercase = 1;
    e->max_len = e->c.max_pos;
    if ((v = json_object_get(sb, "max_seq_length")) && json_integer_value(v) >= 2 && json_integer_value(v) < e->max_len)
        e->max_len = (int)json_integer_value(v);
    json_decref(tc);
    json_decref(sb);
    char *p = st ? NULL : hf_path(dir, "vocab.txt");
    if (p && !(e->tok = fm_wordpiece_load(p, &o))) st = fm_last_status();
    if (!st && fm_wordpiece_vocab_size(e->tok) > e->c.vocab_size)
        st = fm_set_error(FM_ERR_FORMAT, "%s: %d tokens, but config.json's vocab_size is %d: the tokenizer does not "
                          "belong to this model", p, fm_wordpiece_vocab_size(e->tok), e->c.vocab_size);
    free(p);
    return st;
}

fm_hf_encoder *fm_hf_encoder_load(const char *dir) {
    fm_hf_encoder *e = calloc(1, sizeof *e);
    char *cp = hf_path(dir, "config.json"), pool_dir[256];
    size_t n = 0;
    char *s = cp ? hf_read_file(cp, &n) : NULL;
    hf_cfg r = {NULL, cp, FM_OK};
    fm_status st = !e ? fm_set_error(FM_ERR_OOM, "out of host memory") : !s ? fm_last_status() : FM_OK;
    if (!st) st = hf_cfg_open(&r, s, n, cp);
    if (!st) st = hf_bert_config_parse(&r, &e->c);
    if (!st && !(e->L = calloc((size_t)e->c.layers, sizeof *e->L))) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    if (!st) st = read_modules(e, dir, pool_dir, sizeof pool_dir);
    if (!st) st = read_pooling(e, dir, pool_dir);
    if (!st) st = read_tokenizer(e, dir);
    if (!st) st = load_weights(e, dir);
    json_decref(r.j);
    free(s);
    free(cp);
    if (st) { fm_hf_encoder_free(e); return NULL; }
    return e;
}

fm_status fm_hf_encoder_tokenize(const fm_hf_encoder *e, const char *text, int32_t **ids, int64_t *n) {
    return fm_wordpiece_encode(e->tok, text, strlen(text), e->max_len, ids, n);
}

/* ---------------- forward ---------------- */

static bool upd(fm_tensor **acc, fm_tensor *next) {
    fm_tensor_release(*acc);
    *acc = next;
    return next != NULL;
}

/* x + f(x) then LayerNorm, replacing *x. */
static bool residual_norm(fm_tensor **x, fm_tensor *f, fm_tensor *w, fm_tensor *b, double eps) {
    fm_tensor *sum = NULL, *y = NULL;
    fm_status st = f ? fm_add_layer_norm(*x, f, w, b, eps, &sum, &y) : FM_ERR_INVALID;
    fm_tensor_release_n(2, f, sum);
    return !st && upd(x, y);
}

/* Linear k of layer l: int8 on the packed panels (activations quantized per call)
 * once quantized. The intermediate linear (k 2) returns GELU(x W^T + b): in int8 the
 * GELU runs in the product's epilogue, bitwise the separate fm_gelu. */
static fm_tensor *lin(const bert_layer *l, int k, fm_tensor *x) {
    fm_tensor *w[4] = {l->qkv_w, l->ao_w, l->in_w, l->out_w}, *b[4] = {l->qkv_b, l->ao_b, l->in_b, l->out_b};
    if (l->q[k]) return fm_qlinear_int8_packed(x, l->q[k], l->qs[k], l->qsum[k], b[k], 0.0, 0, k == 2 ? FM_QACT_GELU : FM_QACT_NONE);
    fm_tensor *y = fm_linear(x, w[k], b[k]);
    if (k == 2 && y) {
        fm_tensor *g = fm_gelu(y);
        fm_tensor_release(y);
        y = g;
    }
    return y;
}

fm_status fm_hf_encoder_quantize_int8(fm_hf_encoder *e) {
    if (!e) return fm_set_error(FM_ERR_INVALID, "fm_hf_encoder_quantize_int8: NULL encoder");
    for (int i = 0; i < e->c.layers; i++) {
        bert_layer *l = &e->L[i];
        fm_tensor *w[4] = {l->qkv_w, l->ao_w, l->in_w, l->out_w};
        for (int k = 0; k < 4; k++) {
            if (l->q[k]) continue;
            fm_tensor *rows = NULL, *scale = NULL, *panels = NULL, *sums = NULL;
            fm_status st = fm_quantize_weight_int8(w[k], &rows, &scale);
            if (!st) st = fm_pack_weight_int8(rows, &panels, &sums);
            fm_tensor_release(rows);
            if (st) {
                fm_tensor_release(scale);
                return st;
            }
            l->q[k] = panels, l->qs[k] = scale, l->qsum[k] = sums;
        }
    }
    return FM_OK;
}

/* Hidden states [B, T, H] of ids [B, T] (token type 0, positions 0..T-1). */
static fm_tensor *encode(fm_hf_encoder *e, fm_tensor *ids) {
    const hf_bert_config *c = &e->c;
    const int64_t T = ids->shape[1];
    fm_tensor *pe = fm_narrow(e->pos, 0, 0, T), *te = fm_narrow(e->type, 0, 0, 1), *x = fm_embedding(e->word, ids);
    bool ok = pe && te && x && upd(&x, fm_add(x, pe)) && upd(&x, fm_add(x, te)) &&
              upd(&x, fm_layer_norm(x, 1, e->eln_w, e->eln_b, c->eps));
    fm_tensor_release_n(2, pe, te);
    for (int i = 0; i < c->layers && ok; i++) {
        const bert_layer *l = &e->L[i];
        fm_tensor *a = lin(l, 0, x), *h = NULL;
        ok = a && upd(&a, fm_sdpa_qkv(a, c->heads, c->heads, false, 0.0)) &&
             residual_norm(&x, lin(l, 1, a), l->ln1_w, l->ln1_b, c->eps);
        ok = ok && (h = lin(l, 2, x)) && residual_norm(&x, lin(l, 3, h), l->ln2_w, l->ln2_b, c->eps);
        fm_tensor_release_n(2, a, h);
    }
    if (!ok) { fm_tensor_release(x); return NULL; }
    return x;
}

/* Pools hidden [B, T, H] into rows of out (B rows of dim floats), in sentence-
 * transformers' order: cls, max, mean, mean_sqrt_len. */
static fm_status pool_rows(const fm_hf_encoder *e, fm_tensor *h, float *out) {
    const int64_t B = h->shape[0], T = h->shape[1], H = h->shape[2], dim = H * e->n_pool;
    int ax = 1, k = 0;
    for (int bit = POOL_CLS; bit <= POOL_MEAN_SQRT; bit <<= 1) {
        if (!(e->pool & bit)) continue;
        fm_tensor *p = bit == POOL_CLS ? fm_narrow(h, 1, 0, 1) : bit == POOL_MAX ? fm_amax(h, 1, &ax, true)
                       : bit == POOL_MEAN ? fm_mean(h, 1, &ax, true) : fm_sum(h, 1, &ax, true);
        if (p && bit == POOL_MEAN_SQRT) upd(&p, fm_mul_scalar(p, 1.0 / sqrt((double)T)));
        fm_tensor *pc = p ? fm_contiguous(p) : NULL;
        fm_tensor_release(p);
        if (!pc) return fm_last_status();
        const float *src = fm_tensor_data(pc);
        for (int64_t b = 0; b < B; b++) memcpy(out + b * dim + k * H, src + b * H, sizeof(float) * (size_t)H);
        fm_tensor_release(pc);
        k++;
    }
    for (int64_t b = 0; e->normalize && b < B; b++) { /* torch's F.normalize: x / max(||x||, 1e-12) */
        double ss = 0;
        for (int64_t j = 0; j < dim; j++) ss += (double)out[b * dim + j] * out[b * dim + j];
        double inv = 1.0 / fmax(sqrt(ss), 1e-12);
        for (int64_t j = 0; j < dim; j++) out[b * dim + j] = (float)(out[b * dim + j] * inv);
    }
    return FM_OK;
}

/* One rectangular batch: texts order[0..B) all of T tokens. */
static fm_status run_batch(fm_hf_encoder *e, int32_t **ids, const int *order, int B, int64_t T, float *out) {
    int64_t shape[2] = {B, T};
    fm_tensor *x = fm_tensor_empty(2, shape, FM_I64, FM_CPU);
    if (!x) return fm_last_status();
    int64_t *xp = fm_tensor_data(x);
    for (int b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) xp[b * T + t] = ids[order[b]][t];
    fm_tensor *h = encode(e, x);
    const int dim = fm_hf_encoder_dim(e);
    float *rows = h ? malloc(sizeof(float) * (size_t)B * (size_t)dim) : NULL;
    fm_status st = !h ? fm_last_status() : !rows ? fm_set_error(FM_ERR_OOM, "out of host memory") : pool_rows(e, h, rows);
    for (int b = 0; !st && b < B; b++) memcpy(out + (size_t)order[b] * dim, rows + (size_t)b * dim, sizeof(float) * dim);
    free(rows);
    fm_tensor_release_n(2, x, h);
    return st;
}

fm_tensor *fm_hf_encoder_embed(fm_hf_encoder *e, const char *const *texts, int n) {
    if (!e || !texts || n < 1) { fm_set_error(FM_ERR_INVALID, "embed: no encoder or no texts"); return NULL; }
    int64_t shape[2] = {n, fm_hf_encoder_dim(e)};
    fm_tensor *out = fm_tensor_empty(2, shape, FM_F32, FM_CPU);
    int32_t **ids = calloc((size_t)n, sizeof *ids);
    int64_t *len = calloc((size_t)n, sizeof *len);
    int *order = malloc(sizeof(int) * (size_t)n);
    bool *done = calloc((size_t)n, sizeof *done);
    fm_status st = out && ids && len && order && done ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int i = 0; i < n && !st; i++) st = fm_hf_encoder_tokenize(e, texts[i] ? texts[i] : "", &ids[i], &len[i]);
    bool prev = fm_set_grad_enabled(false);
    for (int i = 0; i < n && !st; i++) { /* batches of texts with i's token count */
        if (done[i]) continue;
        int B = 0;
        for (int j = i; j < n && B < MAX_BATCH; j++)
            if (!done[j] && len[j] == len[i]) { order[B++] = j; done[j] = true; }
        st = run_batch(e, ids, order, B, len[i], fm_tensor_data(out));
    }
    fm_set_grad_enabled(prev);
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
    free(len);
    free(order);
    free(done);
    if (st) { fm_tensor_release(out); return NULL; }
    return out;
}
