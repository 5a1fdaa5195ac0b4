/* The transformer itself: parameters, the forward pass (with and without a KV
 * cache) and configuration, for both the GPT-2 and the Llama-style variant.
 *
 * The forward pass is built from public differentiable ops only, so autograd
 * gives the backward for free and a CUDA backend will run it unchanged. QKV (and
 * Llama's gate/up) are one fused GEMM each, split afterwards by views.
 *
 * The GPT-2 variant in f32 (no autocast) runs fused ops where they save passes
 * over activations: the MLP's first bias with its GELU (fm_bias_gelu_tanh), and
 * each residual add with the LayerNorm that follows it (fm_add_layer_norm: ln_2
 * inside a block, the next block's ln_1 or ln_f at its end). Checkpointing keeps
 * the numbers bitwise: a recomputed norm is fm_add_layer_norm without the add,
 * which is bitwise the fused norm, and the residual add is then fm_add, whose
 * single rounding is the fused sum's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fathom/autograd.h" /* grad mode for cached decoding */
#include "fathom/gpt.h"
#include "fathom/io.h"       /* fm_atomic_write for config.json */
#include "fathom/memory.h"   /* moved weights are tagged as weights */
#include "fathom/ops.h"
#include "efficiency/efficiency_internal.h" /* fm_cross_entropy_lowp */
#include "ops/ops_internal.h"                /* fm_linear_mixed */
#include "gpt/gpt_internal.h"

/* ---------------- configuration ---------------- */

fm_gpt_config fm_gpt_config_default(fm_gpt_arch arch) {
    fm_gpt_config c;
    memset(&c, 0, sizeof c);
    c.arch = arch;
    c.n_layer = 12;
    c.n_head = 12;
    c.n_kv_head = arch == FM_GPT_LLAMA ? 4 : 12;
    c.n_embd = 768;
    c.block_size = 1024;
    c.vocab_size = 50257;
    c.ffn_hidden = arch == FM_GPT_LLAMA ? 2048 : 3072;
    c.dropout = 0.0;
    c.bias = arch == FM_GPT_GPT2;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    return c;
}

fm_status fm_gpt_arch_parse(const char *s, fm_gpt_arch *out) {
    if (s && !strcmp(s, "gpt2")) { *out = FM_GPT_GPT2; return FM_OK; }
    if (s && !strcmp(s, "llama")) { *out = FM_GPT_LLAMA; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown architecture '%s' (expected gpt2 or llama)", s ? s : "(null)");
}

const char *fm_gpt_arch_name(fm_gpt_arch a) { return a == FM_GPT_LLAMA ? "llama" : "gpt2"; }

int fm_gpt_head_dim(const fm_gpt_config *c) { return c->head_dim > 0 ? c->head_dim : c->n_head > 0 ? c->n_embd / c->n_head : 0; }

fm_status fm_gpt_config_validate(const fm_gpt_config *c) {
    if (!c) return fm_set_error(FM_ERR_INVALID, "gpt config is NULL");
    if (c->arch != FM_GPT_GPT2 && c->arch != FM_GPT_LLAMA)
        return fm_set_error(FM_ERR_INVALID, "gpt config: unknown architecture %d", (int)c->arch);
    if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->block_size < 1 || c->vocab_size < 1 ||
        c->ffn_hidden < 1)
        return fm_set_error(FM_ERR_INVALID,
                            "gpt config: n_layer %d, n_head %d, n_embd %d, block_size %d, vocab_size %d and "
                            "ffn_hidden %d must all be >= 1",
                            c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size, c->ffn_hidden);
    if (c->head_dim < 0 || c->head_dim > 4096)
        return fm_set_error(FM_ERR_INVALID, "gpt config: head_dim %d must be in [1, 4096] (or 0: n_embd / n_head)",
                            c->head_dim);
    if (!c->head_dim && c->n_embd % c->n_head)
        return fm_set_error(FM_ERR_INVALID, "gpt config: n_embd %d is not divisible by n_head %d (set head_dim for heads "
                            "that do not tile n_embd)", c->n_embd, c->n_head);
    int kv = c->arch == FM_GPT_LLAMA ? c->n_kv_head : c->n_head;
    if (kv < 1 || c->n_head % kv)
        return fm_set_error(FM_ERR_INVALID, "gpt config: n_kv_head %d must divide n_head %d", kv, c->n_head);
    if (c->arch == FM_GPT_LLAMA && fm_gpt_head_dim(c) % 2)
        return fm_set_error(FM_ERR_INVALID, "gpt config: rotary embeddings need an even head size, got %d",
                            fm_gpt_head_dim(c));
    if (!(c->dropout >= 0 && c->dropout < 1))
        return fm_set_error(FM_ERR_INVALID, "gpt config: dropout %g must be in [0, 1)", c->dropout);
    if (!(c->norm_eps > 0)) return fm_set_error(FM_ERR_INVALID, "gpt config: norm_eps %g must be > 0", c->norm_eps);
    if (c->arch == FM_GPT_LLAMA && !(c->rope_theta > 0))
        return fm_set_error(FM_ERR_INVALID, "gpt config: rope_theta %g must be > 0", c->rope_theta);
    if ((unsigned)c->rope_scaling > FM_ROPE_LLAMA3 || (c->rope_scaling && c->arch != FM_GPT_LLAMA))
        return fm_set_error(FM_ERR_INVALID, "gpt config: rope scaling %d needs a llama model with rope scaling 0-2",
                            (int)c->rope_scaling);
    if (c->qkv_bias && c->arch != FM_GPT_LLAMA)
        return fm_set_error(FM_ERR_INVALID, "gpt config: qkv_bias (biases on q, k and v only) is for llama models; "
                            "gpt2 takes bias for all of its biases");
    if (c->rope_scaling && !(c->rope_factor > 0))
        return fm_set_error(FM_ERR_INVALID, "gpt config: rope scaling factor %g must be > 0", c->rope_factor);
    if (c->rope_scaling == FM_ROPE_LLAMA3 && !(c->rope_low_freq_factor > 0 && c->rope_high_freq_factor >
                                                c->rope_low_freq_factor && c->rope_original_max_pos > 0))
        return fm_set_error(FM_ERR_INVALID,
                            "gpt config: llama3 rope scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g) "
                            "and original_max_position_embeddings (%d) > 0",
                            c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_original_max_pos);
    return FM_OK;
}

char *gpt_config_json(const fm_gpt_config *c, bool pretty) {
    json_t *j = json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:f,s:f}", "arch", fm_gpt_arch_name(c->arch),
                          "n_layer", c->n_layer, "n_head", c->n_head, "n_kv_head", c->n_kv_head, "n_embd",
                          c->n_embd, "block_size", c->block_size, "vocab_size", c->vocab_size, "ffn_hidden",
                          c->ffn_hidden, "dropout", c->dropout, "bias", (int)c->bias, "norm_eps", c->norm_eps,
                          "rope_theta", c->rope_theta);
    if (!j) { fm_set_error(FM_ERR_OOM, "config.json: out of memory"); return NULL; }
    /* written only when set, so the files of tied, unscaled models stay as they were */
    if (c->untied_head) json_object_set_new(j, "untied_head", json_true());
    if (c->head_dim > 0 && c->head_dim * c->n_head != c->n_embd) json_object_set_new(j, "head_dim", json_integer(c->head_dim));
    if (c->qkv_bias) json_object_set_new(j, "qkv_bias", json_true());
    if (c->rope_scaling) {
        json_object_set_new(j, "rope_scaling", json_string(c->rope_scaling == FM_ROPE_LINEAR ? "linear" : "llama3"));
        json_object_set_new(j, "rope_factor", json_real(c->rope_factor));
        if (c->rope_scaling == FM_ROPE_LLAMA3) {
            json_object_set_new(j, "rope_low_freq_factor", json_real(c->rope_low_freq_factor));
            json_object_set_new(j, "rope_high_freq_factor", json_real(c->rope_high_freq_factor));
            json_object_set_new(j, "rope_original_max_pos", json_integer(c->rope_original_max_pos));
        }
    }
    char *s = json_dumps(j, (pretty ? JSON_INDENT(2) : JSON_COMPACT) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) fm_set_error(FM_ERR_OOM, "config.json: out of memory");
    return s;
}

fm_status fm_gpt_config_save(const fm_gpt_config *c, const char *path) {
    char *s = gpt_config_json(c, true);
    if (!s) return fm_last_status();
    size_t n = strlen(s);
    fm_io_chunk ch[2] = {{s, n}, {"\n", 1}};
    fm_status st = fm_atomic_write(path, 2, ch);
    free(s);
    return st;
}

/* The keys of fm_gpt_config_save's JSON into c (path names the source in errors);
 * j is released. */
static fm_status config_from_json(json_t *j, const char *path, fm_gpt_config *c) {
    json_error_t err;
    *c = fm_gpt_config_default(FM_GPT_GPT2);
    const char *arch = NULL;
    int bias = 1;
    double dropout = 0, eps = 1e-5, theta = 10000;
    int kv = -1;
    if (json_unpack_ex(j, &err, 0, "{s:s,s:i,s:i,s?i,s:i,s:i,s:i,s:i,s?F,s?b,s?F,s?F}", "arch", &arch, "n_layer",
                       &c->n_layer, "n_head", &c->n_head, "n_kv_head", &kv, "n_embd", &c->n_embd, "block_size",
                       &c->block_size, "vocab_size", &c->vocab_size, "ffn_hidden", &c->ffn_hidden, "dropout",
                       &dropout, "bias", &bias, "norm_eps", &eps, "rope_theta", &theta)) {
        fm_set_error(FM_ERR_FORMAT, "%s: bad model config: %s", path, err.text);
        json_decref(j);
        return FM_ERR_FORMAT;
    }
    fm_status st = fm_gpt_arch_parse(arch, &c->arch);
    int untied = 0, orig = 0, head_dim = 0, qkv_bias = 0;
    const char *scaling = NULL;
    double factor = 0, lo = 0, hi = 0;
    if (!st && json_unpack_ex(j, &err, 0, "{s?b,s?s,s?F,s?F,s?F,s?i,s?i,s?b}", "untied_head", &untied, "rope_scaling",
                              &scaling, "rope_factor", &factor, "rope_low_freq_factor", &lo, "rope_high_freq_factor", &hi,
                              "rope_original_max_pos", &orig, "head_dim", &head_dim, "qkv_bias", &qkv_bias))
        st = fm_set_error(FM_ERR_FORMAT, "%s: bad model config: %s", path, err.text);
    if (!st && scaling && strcmp(scaling, "linear") && strcmp(scaling, "llama3"))
        st = fm_set_error(FM_ERR_FORMAT, "%s: rope_scaling '%s' is not linear or llama3", path, scaling);
    c->untied_head = untied != 0;
    c->qkv_bias = qkv_bias != 0;
    c->rope_scaling = !scaling ? FM_ROPE_NONE : !strcmp(scaling, "linear") ? FM_ROPE_LINEAR : FM_ROPE_LLAMA3;
    c->rope_factor = factor;
    c->rope_low_freq_factor = lo;
    c->rope_high_freq_factor = hi;
    c->rope_original_max_pos = orig;
    c->head_dim = head_dim;
    json_decref(j);
    if (st) return st;
    c->n_kv_head = kv > 0 ? kv : c->n_head;
    c->dropout = dropout;
    c->bias = bias != 0;
    c->norm_eps = eps;
    c->rope_theta = theta;
    return fm_gpt_config_validate(c);
}

fm_status fm_gpt_config_load(const char *path, fm_gpt_config *c) {
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) return fm_set_error(FM_ERR_IO, "%s: cannot read the model config (%s, line %d)", path, err.text, err.line);
    return config_from_json(j, path, c);
}

fm_status gpt_config_parse(const char *text, const char *where, fm_gpt_config *c) {
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j) return fm_set_error(FM_ERR_FORMAT, "%s: the model config is not JSON (%s)", where, err.text);
    return config_from_json(j, where, c);
}

/* ---------------- parameters ---------------- */

static fm_tensor *add_param(fm_gpt *m, const char *name, int ndim, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    fm_tensor *t = m->src ? m->src(m->src_ctx, name, ndim, shape) : fm_tensor_zeros(ndim, shape, FM_F32, FM_CPU);
    if (!t) return NULL;
    if (m->src) { /* a source's tensor is checked, not trusted; it stays without a gradient (inference only) */
        fm_device_type dt = fm_tensor_device(t).type;
        if (t->dtype != FM_F32 || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1) ||
            (dt != FM_DEV_CPU && dt != FM_DEV_META) || (dt == FM_DEV_CPU && !fm_tensor_is_contiguous(t))) {
            fm_set_error(FM_ERR_FORMAT, "gpt: weight '%s' must be f32 [%lld%s%lld], contiguous, on the CPU", name,
                         (long long)d0, ndim == 2 ? ", " : "", ndim == 2 ? (long long)d1 : 0LL);
            fm_tensor_release(t);
            return NULL;
        }
    } else {
        fm_tensor_requires_grad_(t, true);
    }
    fm_status st = fm_named_list_push(&m->params, name, t, ndim == 1, false);
    fm_tensor_release(t); /* the list holds the reference */
    return st == FM_OK ? t : NULL;
}

static fm_status add_hf(fm_gpt *m, const char *name, fm_tensor *t, int64_t row0, int64_t rows, bool transpose) {
    if (m->n_hf == m->cap_hf) {
        int cap = m->cap_hf ? 2 * m->cap_hf : 32;
        gpt_hf_entry *e = realloc(m->hf, (size_t)cap * sizeof *e);
        if (!e) return fm_set_error(FM_ERR_OOM, "out of host memory");
        m->hf = e;
        m->cap_hf = cap;
    }
    gpt_hf_entry *e = &m->hf[m->n_hf];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->t = t;
    e->row0 = row0;
    e->rows = rows < 0 ? t->shape[0] : rows;
    e->transpose = transpose;
    m->n_hf++;
    return FM_OK;
}

static fm_status build_params(fm_gpt *m) {
    const fm_gpt_config *c = &m->cfg;
    const int C = c->n_embd, V = c->vocab_size, F = c->ffn_hidden, H = c->n_head;
    const int D = fm_gpt_head_dim(c), KV = m->n_kv;
    const bool llama = c->arch == FM_GPT_LLAMA, bias = c->bias && !llama, qkv_bias = llama && c->qkv_bias;
    char nm[128], hf[160];
    m->params.owns_tensors = true;
#define P(dst, ndim, a, b, ...)                                  \
    do {                                                         \
        snprintf(nm, sizeof nm, __VA_ARGS__);                    \
        if (!((dst) = add_param(m, nm, ndim, a, b))) return fm_last_status(); \
    } while (0)
#define HF(t, r0, rows, tr, ...)                                      \
    do {                                                              \
        snprintf(hf, sizeof hf, __VA_ARGS__);                         \
        if (add_hf(m, hf, t, r0, rows, tr)) return fm_last_status();  \
    } while (0)
    P(m->wte, 2, V, C, "wte.weight");
    HF(m->wte, 0, -1, false, llama ? "model.embed_tokens.weight" : "transformer.wte.weight");
    if (!llama) {
        P(m->wpe, 2, c->block_size, C, "wpe.weight");
        HF(m->wpe, 0, -1, false, "transformer.wpe.weight");
    }
    for (int i = 0; i < c->n_layer; i++) {
        gpt_layer *L = &m->layers[i];
        const char *hp = llama ? "model.layers" : "transformer.h";
        P(L->ln1_w, 1, C, 0, "h.%d.ln_1.weight", i);
        HF(L->ln1_w, 0, -1, false, llama ? "%s.%d.input_layernorm.weight" : "%s.%d.ln_1.weight", hp, i);
        if (bias) { P(L->ln1_b, 1, C, 0, "h.%d.ln_1.bias", i); HF(L->ln1_b, 0, -1, false, "%s.%d.ln_1.bias", hp, i); }
        P(L->qkv_w, 2, (H + 2 * KV) * D, C, "h.%d.attn.qkv.weight", i);
        if (llama) {
            HF(L->qkv_w, 0, H * D, false, "%s.%d.self_attn.q_proj.weight", hp, i);
            HF(L->qkv_w, H * D, KV * D, false, "%s.%d.self_attn.k_proj.weight", hp, i);
            HF(L->qkv_w, (H + KV) * D, KV * D, false, "%s.%d.self_attn.v_proj.weight", hp, i);
        } else {
            HF(L->qkv_w, 0, -1, true, "%s.%d.attn.c_attn.weight", hp, i);
        }
        if (bias) {
            P(L->qkv_b, 1, (H + 2 * KV) * D, 0, "h.%d.attn.qkv.bias", i);
            HF(L->qkv_b, 0, -1, false, "%s.%d.attn.c_attn.bias", hp, i);
        } else if (qkv_bias) {
            P(L->qkv_b, 1, (H + 2 * KV) * D, 0, "h.%d.attn.qkv.bias", i);
            HF(L->qkv_b, 0, H * D, false, "%s.%d.self_attn.q_proj.bias", hp, i);
            HF(L->qkv_b, H * D, KV * D, false, "%s.%d.self_attn.k_proj.bias", hp, i);
            HF(L->qkv_b, (H + KV) * D, KV * D, false, "%s.%d.self_attn.v_proj.bias", hp, i);
        }
        P(L->proj_w, 2, C, H * D, "h.%d.attn.proj.weight", i);
        HF(L->proj_w, 0, -1, !llama, llama ? "%s.%d.self_attn.o_proj.weight" : "%s.%d.attn.c_proj.weight", hp, i);
        if (bias) {
            P(L->proj_b, 1, C, 0, "h.%d.attn.proj.bias", i);
            HF(L->proj_b, 0, -1, false, "%s.%d.attn.c_proj.bias", hp, i);
        }
        P(L->ln2_w, 1, C, 0, "h.%d.ln_2.weight", i);
        HF(L->ln2_w, 0, -1, false, llama ? "%s.%d.post_attention_layernorm.weight" : "%s.%d.ln_2.weight", hp, i);
        if (bias) { P(L->ln2_b, 1, C, 0, "h.%d.ln_2.bias", i); HF(L->ln2_b, 0, -1, false, "%s.%d.ln_2.bias", hp, i); }
        P(L->fc_w, 2, (llama ? 2 : 1) * (int64_t)F, C, "h.%d.mlp.fc.weight", i);
        if (llama) {
            HF(L->fc_w, 0, F, false, "%s.%d.mlp.gate_proj.weight", hp, i);
            HF(L->fc_w, F, F, false, "%s.%d.mlp.up_proj.weight", hp, i);
        } else {
            HF(L->fc_w, 0, -1, true, "%s.%d.mlp.c_fc.weight", hp, i);
        }
        if (bias) { P(L->fc_b, 1, F, 0, "h.%d.mlp.fc.bias", i); HF(L->fc_b, 0, -1, false, "%s.%d.mlp.c_fc.bias", hp, i); }
        P(L->fc2_w, 2, C, F, "h.%d.mlp.proj.weight", i);
        HF(L->fc2_w, 0, -1, !llama, llama ? "%s.%d.mlp.down_proj.weight" : "%s.%d.mlp.c_proj.weight", hp, i);
        if (bias) {
            P(L->fc2_b, 1, C, 0, "h.%d.mlp.proj.bias", i);
            HF(L->fc2_b, 0, -1, false, "%s.%d.mlp.c_proj.bias", hp, i);
        }
    }
    if (c->untied_head) {
        P(m->lm_head, 2, V, C, "lm_head.weight");
        HF(m->lm_head, 0, -1, false, "lm_head.weight");
    }
    P(m->lnf_w, 1, C, 0, "ln_f.weight");
    HF(m->lnf_w, 0, -1, false, llama ? "model.norm.weight" : "transformer.ln_f.weight");
    if (bias) {
        P(m->lnf_b, 1, C, 0, "ln_f.bias");
        HF(m->lnf_b, 0, -1, false, "transformer.ln_f.bias");
    }
#undef P
#undef HF
    return FM_OK;
}

static fm_status init_params(fm_gpt *m, fm_rng *rng) {
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (int i = 0; i < m->params.n; i++) {
        fm_tensor *t = m->params.items[i].tensor;
        const char *name = m->params.items[i].name;
        fm_status st;
        if (t->ndim == 1) {
            bool is_norm_w = strstr(name, "ln_") && strstr(name, ".weight");
            st = fm_fill_(t, is_norm_w ? 1.0 : 0.0);
        } else {
            bool resid = strstr(name, "attn.proj.weight") || strstr(name, "mlp.proj.weight");
            st = fm_tensor_normal_(t, 0.0, resid ? proj_std : std, rng);
        }
        if (st) return st;
    }
    return FM_OK;
}

/* An inverse frequency after RoPE scaling, as Hugging Face's rope_type linear and
 * llama3 compute it. */
static double rope_inv_freq(const fm_gpt_config *c, double inv) {
    if (c->rope_scaling == FM_ROPE_LINEAR) return inv / c->rope_factor;
    if (c->rope_scaling != FM_ROPE_LLAMA3) return inv;
    const double pi = 3.14159265358979323846, wavelen = 2 * pi / inv;
    const double low_wavelen = c->rope_original_max_pos / c->rope_low_freq_factor;
    const double high_wavelen = c->rope_original_max_pos / c->rope_high_freq_factor;
    if (wavelen < high_wavelen) return inv;
    if (wavelen > low_wavelen) return inv / c->rope_factor;
    double smooth = (c->rope_original_max_pos / wavelen - c->rope_low_freq_factor) /
                    (c->rope_high_freq_factor - c->rope_low_freq_factor);
    return (1 - smooth) * inv / c->rope_factor + smooth * inv;
}

/* cos/sin tables [block, D] in the rotate-half layout (both halves repeat the
 * D/2 frequencies), as Hugging Face's Llama uses. */
static fm_status build_rope(fm_gpt *m) {
    const int T = m->cfg.block_size, D = fm_gpt_head_dim(&m->cfg);
    float *cs = malloc(sizeof(float) * (size_t)T * D), *sn = malloc(sizeof(float) * (size_t)T * D);
    if (!cs || !sn) { free(cs); free(sn); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D / 2; i++) {
            /* the same float rounding of the inverse frequency as PyTorch's f32 tables is
             * not needed: computing in double and rounding once is closer to exact */
            double inv = rope_inv_freq(&m->cfg, 1.0 / pow(m->cfg.rope_theta, (2.0 * i) / D));
            double a = t * inv;
            cs[t * D + i] = cs[t * D + i + D / 2] = (float)cos(a);
            sn[t * D + i] = sn[t * D + i + D / 2] = (float)sin(a);
        }
    int64_t shape[2] = {T, D};
    m->rope_cos = fm_tensor_from_data(cs, 2, shape, FM_F32);
    m->rope_sin = fm_tensor_from_data(sn, 2, shape, FM_F32);
    free(cs);
    free(sn);
    return m->rope_cos && m->rope_sin ? FM_OK : fm_last_status();
}

static fm_gpt *gpt_build(const fm_gpt_config *c, fm_rng *rng, gpt_param_source src, void *src_ctx) {
    if (fm_gpt_config_validate(c)) return NULL;
    fm_gpt *m = calloc(1, sizeof *m);
    if (!m) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    m->src = src;
    m->src_ctx = src_ctx;
    m->cfg = *c;
    m->n_kv = c->arch == FM_GPT_LLAMA ? c->n_kv_head : c->n_head;
    m->cfg.n_kv_head = m->n_kv;
    m->tp_size = 1;
    if (c->arch == FM_GPT_LLAMA) m->cfg.bias = false;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    fm_rng_init(&m->own_rng, 0x5eed);
    m->rng = &m->own_rng;
    m->training = true;
    m->eff = fm_efficiency_defaults();
    if (!m->layers || build_params(m) || (!src && init_params(m, rng)) ||
        (c->arch == FM_GPT_LLAMA && build_rope(m))) {
        if (!m->layers) fm_set_error(FM_ERR_OOM, "out of host memory");
        fm_gpt_free(m);
        return NULL;
    }
    for (int i = 0; i < c->n_layer; i++) {
        gpt_layer *L = &m->layers[i];
        L->ln1c = (gpt_norm_ctx){m, L->ln1_w, L->ln1_b};
        L->ln2c = (gpt_norm_ctx){m, L->ln2_w, L->ln2_b};
        L->blk = (gpt_block_ctx){m, i, 0};
    }
    m->lnfc = (gpt_norm_ctx){m, m->lnf_w, m->lnf_b};
    m->src = NULL;
    m->src_ctx = NULL;
    return m;
}

fm_gpt *fm_gpt_new(const fm_gpt_config *c, fm_rng *rng) { return gpt_build(c, rng, NULL, NULL); }

fm_gpt *gpt_new_bound(const fm_gpt_config *c, gpt_param_source src, void *ctx) {
    if (!src) { fm_set_error(FM_ERR_INVALID, "gpt: no weight source"); return NULL; }
    fm_gpt *m = gpt_build(c, NULL, src, ctx);
    if (m) m->training = false;
    return m;
}

void fm_gpt_free(fm_gpt *m) {
    if (!m) return;
    fm_gpt_keep_lowp_weights(m, false);
    fm_named_list_free(&m->params);
    fm_tensor_release_n(2, m->rope_cos, m->rope_sin);
    free(m->layers);
    free(m->hf);
    free(m);
}

const fm_gpt_config *fm_gpt_get_config(const fm_gpt *m) { return &m->cfg; }
const fm_named_list *fm_gpt_parameters(const fm_gpt *m) { return &m->params; }
void fm_gpt_train_mode(fm_gpt *m, bool training) { m->training = training; }
void fm_gpt_set_rng(fm_gpt *m, fm_rng *rng) { m->rng = rng ? rng : &m->own_rng; }
fm_rng *fm_gpt_rng(fm_gpt *m) { return m->rng; }

void fm_gpt_set_fusion(fm_gpt *m, bool on) { if (m) m->unfused = !on; }

fm_status fm_gpt_set_checkpointing(fm_gpt *m, fm_checkpointing c) {
    if (!m) return fm_set_error(FM_ERR_INVALID, "gpt: model is NULL");
    if ((unsigned)c > FM_CKPT_SELECTIVE) return fm_set_error(FM_ERR_INVALID, "gpt: unknown checkpointing mode %d", (int)c);
    m->eff.checkpointing = c;
    return FM_OK;
}

int64_t fm_gpt_num_params(const fm_gpt *m) {
    int64_t n = 0;
    for (int i = 0; i < m->params.n; i++) n += fm_tensor_numel(m->params.items[i].tensor);
    return n;
}

/* ---------------- forward ---------------- */

/* Replace *acc by f(*acc, ...) result, releasing the old value: keeps the
 * forward pass readable without a temporary per line. */
static bool upd(fm_tensor **acc, fm_tensor *next) {
    fm_tensor_release(*acc);
    *acc = next;
    return next != NULL;
}

static fm_tensor *norm(const fm_gpt *m, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    if (m->cfg.arch == FM_GPT_LLAMA) return fm_rms_norm(x, w, m->cfg.norm_eps);
    return fm_layer_norm(x, 1, w, b, m->cfg.norm_eps);
}

static fm_tensor *dropout(fm_gpt *m, fm_tensor *x) {
    return fm_dropout(x, m->cfg.dropout, m->training && m->cfg.dropout > 0, m->rng);
}

/* x [B, h, T, D] rotated for positions pos0 .. pos0+T-1 (rotate-half form): fm_rope in one
 * pass when x has the tables' dtype (the same products and sums as the composition below,
 * which keeps autocast's mixed bf16/f16 x and f32 tables as they were). */
static fm_tensor *rope(const fm_gpt *m, fm_tensor *x, int64_t pos0, int64_t T) {
    const int64_t D = x->shape[3];
    fm_tensor *cs = fm_narrow(m->rope_cos, 0, pos0, T), *sn = fm_narrow(m->rope_sin, 0, pos0, T);
    if (cs && sn && x->dtype == cs->dtype && !m->unfused) {
        fm_tensor *y = fm_rope(x, cs, sn);
        fm_tensor_release_n(2, cs, sn);
        return y;
    }
    fm_tensor *x1 = fm_narrow(x, 3, 0, D / 2), *x2 = fm_narrow(x, 3, D / 2, D / 2);
    fm_tensor *nx2 = x2 ? fm_neg(x2) : NULL;
    fm_tensor *rot = nx2 && x1 ? fm_cat(2, (fm_tensor *[]){nx2, x1}, 3) : NULL;
    fm_tensor *a = cs ? fm_mul(x, cs) : NULL;
    fm_tensor *b = rot && sn ? fm_mul(rot, sn) : NULL;
    fm_tensor *y = a && b ? fm_add(a, b) : NULL;
    fm_tensor_release_n(8, cs, sn, x1, x2, nx2, rot, a, b);
    return y;
}

/* One new query per sequence against the cached keys and values (batch-1 style
 * decoding): q [B, H, 1, D], k and v views [B, KV, L, D] of the cache. Written as
 * two matmuls around a softmax rather than fm_scaled_dot_product_attention: that
 * op takes contiguous inputs only, so every call would first copy the whole
 * cache (two copies per layer, growing with L), and its kernel computes a full
 * 64-query tile for the single row. matmul reads the cache views in place, and
 * with one query row per head group each product is a GEMV (fm_cpu_gemm's
 * M == 1 path). Query heads that share a key/value head (GQA) are the rows of
 * one product: [B, KV, G, D] x [B, KV, D, L]. */
static fm_tensor *decode_attention(const fm_gpt *m, fm_tensor *q, fm_tensor *k, fm_tensor *v) {
    const int64_t B = q->shape[0], H = q->shape[1], D = q->shape[3], KV = m->n_kv;
    fm_tensor *qg = fm_reshape(q, 4, (int64_t[]){B, KV, H / KV, D});
    fm_tensor *kt = qg ? fm_transpose(k, 2, 3) : NULL;
    fm_tensor *s = kt ? fm_matmul(qg, kt) : NULL, *y = NULL;
    if (upd(&s, s ? fm_mul_scalar(s, 1.0 / sqrt((double)D)) : NULL) && upd(&s, fm_softmax(s, 3)) &&
        upd(&s, fm_matmul(s, v)))
        y = fm_reshape(s, 4, (int64_t[]){B, H, 1, D});
    fm_tensor_release_n(3, qg, kt, s);
    return y;
}

/* Causal self-attention on the fused projection qkv [B, T, (H+2KV)*D], returning
 * the heads [B, H, T, D] (merge_fn joins them). With a cache, the new keys/values
 * are written at pos0 and attention runs over all cached positions; a single new
 * query may see every cached key, so no mask. */
static fm_tensor *attention(fm_gpt *m, fm_tensor *qkv, int layer, int64_t pos0, gpt_kv *cache, bool lowp) {
    const int64_t T = qkv->shape[1], H = m->cfg.n_head / m->tp_size; /* tensor parallel: this rank's heads */
    fm_tensor *q = NULL, *k = NULL, *v = NULL, *y = NULL;
    /* one pass to contiguous [B, h, T, D] heads (and one pass back for the gradient) */
    if (fm_qkv_split_heads(qkv, (int)H, m->n_kv / m->tp_size, &q, &k, &v)) return NULL;
    if (m->cfg.arch == FM_GPT_LLAMA) {
        if (!upd(&q, rope(m, q, pos0, T)) || !upd(&k, rope(m, k, pos0, T))) goto done;
    }
    if (cache) {
        fm_tensor *kd = fm_narrow(cache->k[layer], 2, pos0, T), *vd = fm_narrow(cache->v[layer], 2, pos0, T);
        fm_status st = kd && vd ? fm_copy_(kd, k) : FM_ERR_INVALID;
        if (st == FM_OK) st = fm_copy_(vd, v);
        fm_tensor_release_n(2, kd, vd);
        if (st) goto done;
        if (!upd(&k, fm_narrow(cache->k[layer], 2, 0, pos0 + T)) || !upd(&v, fm_narrow(cache->v[layer], 2, 0, pos0 + T)))
            goto done;
        if (T == 1) {
            y = decode_attention(m, q, k, v);
            goto done;
        }
    }
    y = lowp ? fm_scaled_dot_product_attention_mixed(q, k, v, pos0 == 0, 0.0, FM_BF16)
             : fm_scaled_dot_product_attention(q, k, v, pos0 == 0, 0.0);
done:
    fm_tensor_release_n(3, q, k, v);
    return y;
}

/* The cheap parts in front of each linear, as segment functions, so selective
 * checkpointing (fm_efficiency_linear) can drop their outputs and recompute them. */
static fm_status norm_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    const gpt_norm_ctx *c = ctx;
    out[0] = norm(c->m, in[0], c->w, c->b);
    return out[0] ? FM_OK : fm_last_status();
}

/* heads [B, H, T, D] -> [B, T, H*D] */
static fm_status merge_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    (void)ctx;
    const int64_t B = in[0]->shape[0], H = in[0]->shape[1], T = in[0]->shape[2], D = in[0]->shape[3];
    fm_tensor *y = fm_transpose(in[0], 1, 2);
    out[0] = y ? fm_reshape(y, 3, (int64_t[]){B, T, H * D}) : NULL;
    fm_tensor_release(y);
    return out[0] ? FM_OK : fm_last_status();
}

static bool fused_path(const fm_gpt *m);
static bool mixed(const fm_gpt *m);
static fm_tensor *glin(const fm_gpt *m, fm_tensor *x, fm_tensor *w, fm_tensor *b);
static fm_tensor *lin_n(fm_gpt *m, fm_segment_fn f, void *ctx, int n, fm_tensor **x, fm_tensor *w, fm_tensor *b);

/* the attention core on the QKV projection: head split, causal SDPA, head merge
 * (one op on the fused path: attention straight out of qkv into merged heads) */
static fm_status attn_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    gpt_block_ctx *c = ctx;
    if (fused_path(c->m)) {
        /* mixed bf16: the fused kernel on the f32 projection, its products in bf16 where the
         * CPU runs them fast (fm_sdpa_qkv_mixed); autocast would take the composed bf16 path,
         * whose kernel widens to f32 */
        bool mx = mixed(c->m);
        fm_dtype ac = mx ? fm_autocast_set(FM_F32) : fm_autocast_get();
        out[0] = mx ? fm_sdpa_qkv_mixed(in[0], (int)c->m->cfg.n_head, (int)c->m->n_kv, true, 0.0, FM_BF16)
                    : fm_sdpa_qkv(in[0], (int)c->m->cfg.n_head, (int)c->m->n_kv, true, 0.0);
        fm_autocast_set(ac);
        return out[0] ? FM_OK : fm_last_status();
    }
    /* mixed bf16 (Llama): rope and attention on the f32 projection, as fp32 runs them, the
     * attention's products in bf16 where the CPU runs them fast */
    bool mx = mixed(c->m);
    fm_dtype ac = mx ? fm_autocast_set(FM_F32) : fm_autocast_get();
    fm_tensor *y = attention(c->m, in[0], c->layer, 0, NULL, mx);
    fm_autocast_set(ac);
    if (!y) return fm_last_status();
    fm_status st = merge_fn(&y, NULL, out);
    fm_tensor_release(y);
    return st;
}

/* GELU(tanh), or SwiGLU on the fused gate/up projection (Llama) */
static fm_status act_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    const fm_gpt *m = ctx;
    const int64_t F = m->cfg.ffn_hidden / m->tp_size; /* tensor parallel: this rank's columns */
    if (m->cfg.arch == FM_GPT_LLAMA) {
        fm_tensor *g = fm_narrow(in[0], 2, 0, F), *u = fm_narrow(in[0], 2, F, F);
        fm_tensor *sg = g ? fm_silu(g) : NULL;
        out[0] = sg && u ? fm_mul(sg, u) : NULL;
        fm_tensor_release_n(3, g, u, sg);
    } else {
        out[0] = fm_gelu_tanh(in[0]);
    }
    return out[0] ? FM_OK : fm_last_status();
}

/* Attention and the output projection on qkv. Selective checkpointing recomputes
 * the whole attention core in backward (Megatron's selective recomputation): only
 * the QKV projection stays stored, not the attention output (nor its logsumexp
 * and merged copy). On kjv-gpt that cut the kept activations from 0.608 to 0.552 of
 * fp32's, for one more SDPA forward per block (~3% of the step). */
static fm_tensor *attn_proj(fm_gpt *m, fm_tensor *qkv, int i, int64_t pos0, gpt_kv *cache) {
    gpt_layer *L = &m->layers[i];
    if (!cache && (fused_path(m) || mixed(m) || (m->eff.checkpointing == FM_CKPT_SELECTIVE && fm_grad_enabled())))
        return lin_n(m, attn_fn, &L->blk, 1, &qkv, L->proj_w, L->proj_b);
    /* bf16 autocast (mixed, as `fathom generate --precision bf16` runs a cached forward):
     * the attention core takes f32 and gives f32 as on the uncached path (attn_fn), its
     * products in bf16 through the mixed kernel; a decode step's one-row attention runs
     * f32. Autocast is off around it, so no op in it casts its output to bf16. */
    const bool mx = mixed(m);
    fm_dtype ac = mx ? fm_autocast_set(FM_F32) : FM_F32;
    fm_tensor *h = attention(m, qkv, i, pos0, cache, mx);
    if (mx) fm_autocast_set(ac);
    /* With a tape, the head merge (a transposing copy, no arithmetic) is redone in
     * backward rather than kept: SDPA already keeps its output, so the copy would
     * store the same numbers twice (bf16 kjv-gpt: 0.5 of the 9.5 MiB a block keeps). */
    if (!upd(&h, !h ? NULL
                 : fm_grad_enabled() && !cache ? fm_linear_recompute(merge_fn, NULL, 1, &h, L->proj_w, L->proj_b)
                                               : lin_n(m, merge_fn, NULL, 1, &h, L->proj_w, L->proj_b)))
        return NULL;
    return h;
}

/* linear(f(x)): with selective checkpointing f's output is not kept for backward */
static fm_tensor *lin_n(fm_gpt *m, fm_segment_fn f, void *ctx, int n, fm_tensor **x, fm_tensor *w, fm_tensor *b) {
    if (!mixed(m)) return fm_efficiency_linear(&m->eff, f, ctx, n, x, w, b);
    fm_tensor *g = NULL, *y = NULL;
    if (f(x, ctx, &g) == FM_OK) y = glin(m, g, w, b);
    fm_tensor_release(g);
    return y;
}
static fm_tensor *lin(fm_gpt *m, fm_segment_fn f, void *ctx, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    return lin_n(m, f, ctx, 1, &x, w, b);
}

static fm_tensor *block(fm_gpt *m, fm_tensor *x, int i, int64_t pos0, gpt_kv *cache) {
    gpt_layer *L = &m->layers[i];
    fm_tensor *h = lin(m, norm_fn, &L->ln1c, x, L->qkv_w, L->qkv_b), *r = NULL;
    if (!h) return NULL;
    if (!upd(&h, attn_proj(m, h, i, pos0, cache))) return NULL;
    if (!upd(&h, dropout(m, h))) return NULL;
    r = fm_add(x, h);
    fm_tensor_release(h);
    if (!r) return NULL;
    h = lin(m, norm_fn, &L->ln2c, r, L->fc_w, L->fc_b);
    if (!h || !upd(&h, lin(m, act_fn, m, h, L->fc2_w, L->fc2_b)) || !upd(&h, dropout(m, h))) goto fail;
    fm_tensor *out = fm_add(r, h);
    fm_tensor_release_n(2, r, h);
    return out;
fail:
    fm_tensor_release_n(2, r, h);
    return NULL;
}

/* Tensor parallel (Megatron): norm(x) -> tp_copy -> column-parallel linear (this rank's
 * heads, or MLP columns) -> attention / activation on them -> row-parallel linear
 * without bias -> tp_reduce (the one all-reduce) -> + bias. So a block does two
 * all-reduces forward (attention, MLP) and two backward (at the tp_copy ops).
 *
 * Selective checkpointing: each linear's cheap input function is recomputed in
 * backward (fm_linear_recompute), as without tensor parallelism: norm and tp_copy in
 * front of the column-parallel linear, attention core or activation in front of the
 * row-parallel one. The recomputation runs on this rank's own shards and inputs (no
 * communication: tp_copy is the identity forward); the first forward ran them without a
 * tape, so tp_copy's backward all-reduce happens once, in the recomputed graph. */
static fm_status norm_copy_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    const gpt_norm_ctx *c = ctx;
    fm_tensor *h = norm(c->m, in[0], c->w, c->b);
    out[0] = h ? fm_tp_copy(c->m->tp, h) : NULL;
    fm_tensor_release(h);
    return out[0] ? FM_OK : fm_last_status();
}

static fm_tensor *tp_half(fm_gpt *m, fm_tensor *x, const gpt_norm_ctx *ln, fm_tensor *w1, fm_tensor *b1,
                          fm_segment_fn mid, void *ctx, fm_tensor *w2, fm_tensor *b2) {
    const bool sel = m->eff.checkpointing == FM_CKPT_SELECTIVE && fm_grad_enabled();
    fm_tensor *h = NULL, *y = NULL;
    if (sel) {
        if (!(h = fm_linear_recompute(norm_copy_fn, (void *)ln, 1, &x, w1, b1)) ||
            !upd(&h, fm_linear_recompute(mid, ctx, 1, &h, w2, NULL)))
            goto fail;
    } else {
        if (norm_copy_fn(&x, (void *)ln, &h) != FM_OK || !upd(&h, fm_linear(h, w1, b1)) || mid(&h, ctx, &y) != FM_OK ||
            !upd(&h, y) || !upd(&h, fm_linear(h, w2, NULL)))
            goto fail;
    }
    if (!upd(&h, fm_tp_reduce(m->tp, h)) || (b2 && !upd(&h, fm_add(h, b2))) || !upd(&h, dropout(m, h))) goto fail;
    return h;
fail:
    fm_tensor_release(h);
    return NULL;
}

static fm_tensor *block_tp(fm_gpt *m, fm_tensor *x, int i) {
    gpt_layer *L = &m->layers[i];
    fm_tensor *h = tp_half(m, x, &L->ln1c, L->qkv_w, L->qkv_b, attn_fn, &L->blk, L->proj_w, L->proj_b);
    fm_tensor *r = h ? fm_add(x, h) : NULL, *out = NULL;
    fm_tensor_release(h);
    h = r ? tp_half(m, r, &L->ln2c, L->fc_w, L->fc_b, act_fn, m, L->fc2_w, L->fc2_b) : NULL;
    if (h) out = fm_add(r, h);
    fm_tensor_release_n(2, r, h);
    return out;
}

/* ---- the fused GPT-2 path ---- */

/* bf16 autocast on the CPU: the f32 path with every linear's GEMMs in bf16
 * (fm_linear_mixed: f32 accumulation and f32 outputs). The ops between the GEMMs
 * keep their f32 kernels (GPT-2: the fused ones; Llama: RMSNorm, rope, attention,
 * SwiGLU); bf16 elementwise ops and casts around each GEMM cost more than the
 * bf16 GEMMs saved (docs/PERFORMANCE.md, the kjv-gpt profile). Selective
 * checkpointing keeps the op-by-op autocast path (it recomputes in bf16), and so
 * does fm_gpt_set_fusion(m, false). */
static bool mixed(const fm_gpt *m) {
    fm_device_type d = m->wte->storage->device.type;
    return !m->tp && fm_autocast_get() == FM_BF16 && (d == FM_DEV_CPU || d == FM_DEV_CHECK || d == FM_DEV_META) &&
           !m->unfused && m->wte->dtype == FM_F32 && m->eff.checkpointing != FM_CKPT_SELECTIVE;
}

static fm_tensor *lowp_of(const fm_gpt *m, const fm_tensor *w) {
    for (int i = 0; i < m->n_lowp; i++)
        if (m->lowp_src[i] == w) return m->lowp_w[i];
    return NULL;
}

static fm_tensor *glin(const fm_gpt *m, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    return mixed(m) ? fm_linear_mixed_w(x, w, lowp_of(m, w), b, FM_BF16) : fm_linear(x, w, b);
}

fm_status fm_gpt_keep_lowp_weights(fm_gpt *m, bool on) {
    if (!m) return fm_set_error(FM_ERR_INVALID, "gpt: model is NULL");
    for (int i = 0; i < m->n_lowp; i++) fm_tensor_release(m->lowp_w[i]);
    free(m->lowp_src);
    free(m->lowp_w);
    m->lowp_src = m->lowp_w = NULL;
    m->n_lowp = 0;
    if (!on || !mixed(m)) return FM_OK;
    int cap = 4 * m->cfg.n_layer + 1;
    m->lowp_src = calloc((size_t)cap, sizeof *m->lowp_src);
    m->lowp_w = calloc((size_t)cap, sizeof *m->lowp_w);
    if (!m->lowp_src || !m->lowp_w) { fm_gpt_keep_lowp_weights(m, false); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    bool prev = fm_set_grad_enabled(false);
    fm_mem_category cat = fm_memory_tag_push(FM_MEM_WEIGHTS);
    fm_status st = FM_OK;
    for (int i = 0; i < m->cfg.n_layer + 1 && st == FM_OK; i++) {
        fm_tensor *ws[4] = {NULL, NULL, NULL, NULL};
        if (i < m->cfg.n_layer) {
            const gpt_layer *L = &m->layers[i];
            ws[0] = L->qkv_w, ws[1] = L->proj_w, ws[2] = L->fc_w, ws[3] = L->fc2_w;
        } else {
            ws[0] = m->lm_head ? m->lm_head : m->wte; /* the output projection */
        }
        for (int k = 0; k < 4 && st == FM_OK; k++) {
            if (!ws[k] || ws[k]->dtype != FM_F32 || ws[k]->ndim != 2) continue;
            fm_tensor *c = fm_to_dtype(ws[k], FM_BF16);
            if (!c) { st = fm_last_status(); break; }
            m->lowp_src[m->n_lowp] = ws[k];
            m->lowp_w[m->n_lowp++] = c;
        }
    }
    fm_memory_tag_pop(cat);
    fm_set_grad_enabled(prev);
    if (st != FM_OK) fm_gpt_keep_lowp_weights(m, false);
    return st;
}

static bool fused_path(const fm_gpt *m) {
    return m->cfg.arch == FM_GPT_GPT2 && !m->unfused && !m->tp && m->wte->dtype == FM_F32 &&
           (fm_autocast_get() == FM_F32 || mixed(m));
}

/* LayerNorm by the fused op's kernel: bitwise the norm a fused residual add gives */
static fm_tensor *fnorm(const fm_gpt *m, fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    fm_tensor *s = NULL, *y = NULL;
    if (fm_add_layer_norm(x, NULL, w, b, m->cfg.norm_eps, &s, &y)) return NULL;
    fm_tensor_release(s);
    return y;
}

static fm_status fnorm_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    const gpt_norm_ctx *c = ctx;
    out[0] = fnorm(c->m, in[0], c->w, c->b);
    return out[0] ? FM_OK : fm_last_status();
}

/* in = {fc output without its bias, the bias} */
static fm_status bias_gelu_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    (void)ctx;
    out[0] = fm_bias_gelu_tanh(in[0], in[1]);
    return out[0] ? FM_OK : fm_last_status();
}

/* A GPT-2 block on the residual x. y = ln_1(x) when the previous block already
 * made it (fused with its last add), else NULL. With next (the norm after this
 * block) and no selective checkpointing, the closing residual add is fused with
 * it and *y_next receives its output. */
static fm_tensor *block_fused(fm_gpt *m, fm_tensor *x, fm_tensor *y, int i, int64_t pos0, gpt_kv *cache,
                              gpt_norm_ctx *next, fm_tensor **y_next) {
    gpt_layer *L = &m->layers[i];
    /* selective checkpointing recomputes every norm and the GELU in front of its
     * linear, so there the adds stay separate (fm_efficiency_linear decides the same way) */
    const bool sel = m->eff.checkpointing == FM_CKPT_SELECTIVE && fm_grad_enabled();
    const double eps = m->cfg.norm_eps;
    fm_tensor *h = y ? glin(m, y, L->qkv_w, L->qkv_b) : lin(m, fnorm_fn, &L->ln1c, x, L->qkv_w, L->qkv_b);
    fm_tensor *r = NULL, *y2 = NULL, *out = NULL, *act_in[2];
    if (y_next) *y_next = NULL;
    if (!h || !upd(&h, attn_proj(m, h, i, pos0, cache)) || !upd(&h, dropout(m, h)))
        goto done;
    if (sel) {
        r = fm_add(x, h);
        if (!upd(&h, r ? lin(m, fnorm_fn, &L->ln2c, r, L->fc_w, NULL) : NULL)) goto done;
    } else {
        if (fm_add_layer_norm(x, h, L->ln2_w, L->ln2_b, eps, &r, &y2)) goto done;
        if (!upd(&h, glin(m, y2, L->fc_w, NULL))) goto done;
    }
    act_in[0] = h;
    act_in[1] = L->fc_b;
    if (!upd(&h, L->fc_b ? lin_n(m, bias_gelu_fn, NULL, 2, act_in, L->fc2_w, L->fc2_b)
                         : lin(m, act_fn, m, h, L->fc2_w, L->fc2_b)) ||
        !upd(&h, dropout(m, h)))
        goto done;
    if (next && !sel) fm_add_layer_norm(r, h, next->w, next->b, eps, &out, y_next);
    else out = fm_add(r, h);
done:
    fm_tensor_release_n(3, h, r, y2);
    return out;
}

/* A block as a segment for fm_checkpoint. Dropout draws from the model's own
 * generator, which fm_checkpoint does not replay, so the block rewinds it to
 * where the first forward started: the recomputation in backward then draws
 * the same masks, and the generator is put back where backward found it. */
static fm_status block_fn(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    gpt_block_ctx *c = ctx;
    fm_rng *r = c->m->rng;
    uint64_t now = r->offset;
    r->offset = c->rng_offset;
    out[0] = c->m->tp        ? block_tp(c->m, in[0], c->layer)
             : fused_path(c->m) ? block_fused(c->m, in[0], NULL, c->layer, 0, NULL, NULL, NULL)
                              : block(c->m, in[0], c->layer, 0, NULL);
    if (now != c->rng_offset) r->offset = now; /* a recomputation: the forward already moved past */
    return out[0] ? FM_OK : fm_last_status();
}

static fm_status check_idx(const fm_gpt *m, fm_tensor *idx, const char *what) {
    char s[96];
    if (!idx || idx->ndim != 2 || (idx->dtype != FM_I64 && idx->dtype != FM_I32))
        return fm_set_error(FM_ERR_INVALID, "gpt: %s must be a [B, T] tensor of i64/i32 token ids%s%s", what,
                            idx ? ", got " : "", idx ? fm_shape_str(idx->ndim, idx->shape, s, sizeof s) : "");
    if (idx->shape[0] < 1 || idx->shape[1] < 1)
        return fm_set_error(FM_ERR_INVALID, "gpt: %s %s is empty", what, fm_shape_str(idx->ndim, idx->shape, s, sizeof s));
    /* Ids on a device are not read back here: that read would make the host wait for the
     * queued work every micro-batch (on a GPU it stalls the next batch's upload). The
     * embedding and cross-entropy kernels check them instead ("embedding: index 70 at
     * position 3 is out of range [0, 64)", "target 70 at position 3 is out of range";
     * CUDA: deferred to the next host read, the step's loss). */
    if (fm_tensor_device(idx).type != FM_DEV_CPU) return FM_OK;
    int64_t n = fm_tensor_numel(idx);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)n);
    if (!ids) return fm_set_error(FM_ERR_OOM, "gpt: no host memory to check %lld token ids", (long long)n);
    fm_status st = fm_tensor_copy_to_host(idx, ids, FM_I64);
    for (int64_t i = 0; i < n && st == FM_OK; i++) {
        double v = (double)ids[i];
        bool ok = v >= 0 && v < m->cfg.vocab_size;
        if (!ok && !(v == -1 && !strcmp(what, "targets")))
            st = fm_set_error(FM_ERR_INVALID, "gpt: unknown token id %.0f in %s at position %lld (vocab size %d)", v,
                              what, (long long)i, m->cfg.vocab_size);
    }
    free(ids);
    return st;
}

/* Tensor parallel, vocabulary-parallel embedding: this rank's rows [start, start + V/T)
 * look up the ids they own (the others read row 0, zeroed by a mask), and tp_reduce
 * sums the ranks' parts, so each position gets exactly its one row. */
static fm_tensor *embed_tp(fm_gpt *m, fm_tensor *idx) {
    const int64_t n = fm_tensor_numel(idx), Vl = m->wte->shape[0], start = (int64_t)m->tp_rank * Vl;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)n);
    float *mask = malloc(sizeof(float) * (size_t)n);
    fm_tensor *li = NULL, *mk = NULL, *e = NULL;
    if (!ids || !mask) fm_set_error(FM_ERR_OOM, "gpt: out of host memory for %lld token ids", (long long)n);
    else if (fm_tensor_copy_to_host(idx, ids, FM_I64) == FM_OK) {
        for (int64_t i = 0; i < n; i++) {
            bool mine = ids[i] >= start && ids[i] < start + Vl;
            mask[i] = mine ? 1.0f : 0.0f;
            ids[i] = mine ? ids[i] - start : 0;
        }
        li = fm_tensor_from_data(ids, 2, idx->shape, FM_I64);
        mk = fm_tensor_from_data(mask, 3, (int64_t[]){idx->shape[0], idx->shape[1], 1}, FM_F32);
        fm_device dev = fm_tensor_device(m->wte); /* the meta device: the planner's run of a rank */
        if (li && mk && dev.type != FM_DEV_CPU) {
            fm_tensor *a = fm_tensor_to(li, dev), *b = fm_tensor_to(mk, dev);
            fm_tensor_release_n(2, li, mk);
            li = a;
            mk = b;
        }
        if (li && mk && (e = fm_embedding(m->wte, li)) && upd(&e, fm_mul(e, mk))) upd(&e, fm_tp_reduce(m->tp, e));
    }
    free(ids);
    free(mask);
    fm_tensor_release_n(2, li, mk);
    return e;
}

/* Tensor parallel output: this rank's vocabulary columns of the logits (never gathered:
 * the loss is fm_tp_cross_entropy) */
static fm_tensor *head_tp(fm_gpt *m, fm_tensor *x) {
    fm_tensor *h = norm(m, x, m->lnf_w, m->lnf_b);
    if (h && upd(&h, fm_tp_copy(m->tp, h))) upd(&h, fm_linear(h, m->lm_head ? m->lm_head : m->wte, NULL));
    return h;
}

/* Shared by the training forward and cached decoding. */
static fm_tensor *run(fm_gpt *m, fm_tensor *idx, int64_t pos0, gpt_kv *cache) {
    const int64_t T = idx->shape[1];
    fm_tensor *x = m->tp ? embed_tp(m, idx) : fm_embedding(m->wte, idx);
    if (!x) return NULL;
    if (m->cfg.arch == FM_GPT_GPT2) {
        fm_tensor *pe = fm_narrow(m->wpe, 0, pos0, T);
        fm_tensor *s = pe ? fm_add(x, pe) : NULL;
        fm_tensor_release(pe);
        if (!upd(&x, s)) return NULL;
    }
    if (!upd(&x, dropout(m, x))) return NULL;
    const bool fused = fused_path(m);
    fm_tensor *yn = NULL; /* fused: the norm of x when the last block made it */
    for (int i = 0; i < m->cfg.n_layer; i++) {
        /* the last block is not checkpointed: backward needs its activations first,
         * so recomputing them would save no memory */
        if (!cache && m->eff.checkpointing == FM_CKPT_BLOCKS && i < m->cfg.n_layer - 1) {
            gpt_block_ctx *c = &m->layers[i].blk;
            fm_tensor *y = NULL;
            c->rng_offset = m->rng->offset;
            if (fm_efficiency_segment(&m->eff, FM_CKPT_BLOCKS, block_fn, c, 1, &x, 1, &y) != FM_OK) y = NULL;
            if (!upd(&x, y)) return NULL;
        } else if (fused) {
            gpt_norm_ctx *next = i + 1 < m->cfg.n_layer ? &m->layers[i + 1].ln1c : &m->lnfc;
            fm_tensor *ny = NULL, *nx = block_fused(m, x, yn, i, pos0, cache, next, &ny);
            fm_tensor_release(yn);
            yn = ny;
            if (!upd(&x, nx)) { fm_tensor_release(yn); return NULL; }
        } else if (!upd(&x, m->tp ? block_tp(m, x, i) : block(m, x, i, pos0, cache))) {
            return NULL;
        }
    }
    if (m->tp) {
        upd(&x, head_tp(m, x));
        return x;
    }
    /* the output projection: the token embedding (tied) or lm_head */
    fm_tensor *head = m->lm_head ? m->lm_head : m->wte;
    if (yn) upd(&x, glin(m, yn, head, NULL));
    else upd(&x, lin(m, fused ? fnorm_fn : norm_fn, &m->lnfc, x, head, NULL));
    fm_tensor_release(yn);
    return x;
}

fm_tensor *fm_gpt_forward(fm_gpt *m, fm_tensor *idx, fm_tensor *targets, fm_tensor **loss) {
    if (loss) *loss = NULL;
    if (!m) { fm_set_error(FM_ERR_INVALID, "gpt: model is NULL"); return NULL; }
    if (check_idx(m, idx, "input")) return NULL;
    char a[96], b[96];
    if (idx->shape[1] > m->cfg.block_size) {
        fm_set_error(FM_ERR_INVALID, "gpt: sequence length %lld exceeds the context size (block_size %d)",
                     (long long)idx->shape[1], m->cfg.block_size);
        return NULL;
    }
    if (targets) {
        if (check_idx(m, targets, "targets")) return NULL;
        if (targets->shape[0] != idx->shape[0] || targets->shape[1] != idx->shape[1]) {
            fm_set_error(FM_ERR_INVALID, "gpt: targets %s do not match input %s",
                         fm_shape_str(targets->ndim, targets->shape, a, sizeof a),
                         fm_shape_str(idx->ndim, idx->shape, b, sizeof b));
            return NULL;
        }
    }
    fm_tensor *logits = run(m, idx, 0, NULL);
    if (!logits || !targets || !loss) return logits;
    const int64_t N = idx->shape[0] * idx->shape[1], Vo = logits->shape[2]; /* tensor parallel: V/T columns */
    fm_tensor *l2 = fm_reshape(logits, 2, (int64_t[]){N, Vo});
    fm_tensor *t1 = fm_reshape(targets, 1, (int64_t[]){N});
    /* under autocast with a tape, the loss keeps the bf16/fp16 logits instead of an f32 copy */
    if (m->tp)
        *loss = l2 && t1 ? fm_tp_cross_entropy(m->tp, l2, t1, (int64_t)m->tp_rank * Vo, m->cfg.vocab_size) : NULL;
    else if (l2 && t1 && fm_autocast_get() != FM_F32 && fm_grad_enabled() && (l2->dtype == FM_BF16 || l2->dtype == FM_F16))
        *loss = fm_cross_entropy_lowp(l2, t1, -1, 0.0);
    else
        *loss = l2 && t1 ? fm_cross_entropy(l2, t1, -1, 0.0, FM_REDUCE_MEAN) : NULL;
    fm_tensor_release_n(2, l2, t1);
    if (!*loss) {
        fm_tensor_release(logits);
        return NULL;
    }
    return logits;
}

/* ---------------- KV cache ---------------- */

fm_gpt_kv_cache *fm_gpt_kv_cache_new(const fm_gpt *m, int batch) {
    if (!m || batch < 1) { fm_set_error(FM_ERR_INVALID, "kv cache: needs a model and batch >= 1"); return NULL; }
    gpt_kv *c = calloc(1, sizeof *c);
    if (!c) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    c->n_layer = m->cfg.n_layer;
    c->cap = m->cfg.block_size;
    c->batch = batch;
    c->k = calloc((size_t)c->n_layer, sizeof *c->k);
    c->v = calloc((size_t)c->n_layer, sizeof *c->v);
    if (!c->k || !c->v) { fm_set_error(FM_ERR_OOM, "out of host memory"); fm_gpt_kv_cache_free(c); return NULL; }
    int64_t shape[4] = {batch, m->n_kv, c->cap, fm_gpt_head_dim(&m->cfg)};
    fm_device dev = fm_tensor_device(m->wte); /* the cache lives with the model */
    for (int i = 0; i < c->n_layer; i++) {
        c->k[i] = fm_tensor_zeros(4, shape, FM_F32, dev);
        c->v[i] = fm_tensor_zeros(4, shape, FM_F32, dev);
        if (!c->k[i] || !c->v[i]) { fm_gpt_kv_cache_free(c); return NULL; }
    }
    return c;
}

void fm_gpt_kv_cache_free(fm_gpt_kv_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n_layer; i++) {
        if (c->k) fm_tensor_release(c->k[i]);
        if (c->v) fm_tensor_release(c->v[i]);
    }
    free(c->k);
    free(c->v);
    free(c);
}

void fm_gpt_kv_cache_reset(fm_gpt_kv_cache *c) { if (c) c->len = 0; }
int fm_gpt_kv_cache_len(const fm_gpt_kv_cache *c) { return c ? (int)c->len : 0; }

fm_tensor *fm_gpt_forward_cached(fm_gpt *m, fm_tensor *idx, fm_gpt_kv_cache *c) {
    if (!m || !c) { fm_set_error(FM_ERR_INVALID, "gpt: forward_cached needs a model and a cache"); return NULL; }
    if (m->tp) {
        fm_set_error(FM_ERR_UNSUPPORTED, "gpt: cached decoding of a tensor-parallel model is not built; gather it "
                     "(fm_gpt_tp_gather_model) or load the saved model in one process");
        return NULL;
    }
    if (check_idx(m, idx, "input")) return NULL;
    if (idx->shape[0] != c->batch) {
        fm_set_error(FM_ERR_INVALID, "gpt: batch %lld does not match the cache's batch %d", (long long)idx->shape[0],
                     c->batch);
        return NULL;
    }
    const int64_t T = idx->shape[1];
    if (c->len + T > c->cap) {
        fm_set_error(FM_ERR_INVALID, "gpt: context limit reached: %lld cached + %lld new tokens exceed block_size %lld",
                     (long long)c->len, (long long)T, (long long)c->cap);
        return NULL;
    }
    bool prev = fm_set_grad_enabled(false);
    bool was_training = m->training;
    m->training = false;
    fm_tensor *out = NULL;
    if (c->len == 0 || T == 1) {
        out = run(m, idx, c->len, c);
        if (out) c->len += T;
    } else {
        /* top-left causal alignment only fits an empty cache: feed one at a time */
        fm_tensor **parts = calloc((size_t)T, sizeof *parts);
        int64_t i = 0;
        for (; parts && i < T; i++) {
            fm_tensor *one = fm_narrow(idx, 1, i, 1);
            parts[i] = one ? run(m, one, c->len, c) : NULL;
            fm_tensor_release(one);
            if (!parts[i]) break;
            c->len++;
        }
        if (parts && i == T) out = fm_cat((int)T, parts, 1);
        for (int64_t j = 0; parts && j < T; j++) fm_tensor_release(parts[j]);
        free(parts);
    }
    m->training = was_training;
    fm_set_grad_enabled(prev);
    return out;
}

fm_status fm_gpt_to(fm_gpt *m, fm_device dev) {
    if (!m) return fm_set_error(FM_ERR_INVALID, "gpt_to: model is NULL");
    fm_status st = fm_device_validate(dev);
    if (st != FM_OK) return st;
    fm_mem_category prev = fm_memory_tag_push(FM_MEM_WEIGHTS);
    for (int i = 0; i < m->params.n && st == FM_OK; i++) st = fm_tensor_move_(m->params.items[i].tensor, dev);
    if (st == FM_OK && m->rope_cos) st = fm_tensor_move_(m->rope_cos, dev);
    if (st == FM_OK && m->rope_sin) st = fm_tensor_move_(m->rope_sin, dev);
    fm_memory_tag_pop(prev);
    return st;
}

fm_device fm_gpt_device(const fm_gpt *m) { return fm_tensor_device(m->wte); }
