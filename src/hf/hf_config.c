/* Hugging Face config.json for GPT-2, Llama, Qwen2 and BERT (see fathom/hf.h).
 *
 * Every key is accounted for: either fathom reads it (and refuses values it
 * cannot express), or it is listed as not changing inference (dropout rates,
 * token ids, metadata). Anything else is refused by name, since an unknown key
 * may change the model in a way fathom would silently get wrong. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf/hf_internal.h"
#include "io/io_internal.h" /* fm_read_text_file */

/* The most config.json or model.safetensors.index.json may hold (a 405B model's index: about 100 KB). */
#define HF_JSON_MAX_BYTES (64 << 20)

/* Keys any transformers config may carry that do not change the forward pass. */
static const char *const common_ignored[] = {
    "model_type", "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
    "torch_dtype", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type",
    "initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "_name_or_path", "output_attentions", "tokenizer_class", "task_specific_params", "prefix",
    "gradient_checkpointing", "finetuning_task", "decoder_start_token_id", "tie_encoder_decoder", NULL};

static bool in_list(const char *key, const char *const *l) {
    for (; l && *l; l++)
        if (!strcmp(key, *l)) return true;
    return false;
}

fm_status hf_cfg_open(hf_cfg *r, const char *json, size_t len, const char *name) {
    r->name = name ? name : "config.json";
    r->st = FM_OK;
    json_error_t e;
    r->j = json_loadb(json, len, JSON_REJECT_DUPLICATES, &e);
    if (!r->j) return r->st = fm_set_error(FM_ERR_FORMAT, "%s: line %d: %s", r->name, e.line, e.text);
    if (!json_is_object(r->j))
        return r->st = fm_set_error(FM_ERR_FORMAT, "%s: expected a JSON object of model settings", r->name);
    return FM_OK;
}

fm_status hf_check_keys(hf_cfg *r, const char *model_type, const char *const *used, const char *const *ignored) {
    const char *key;
    json_t *v;
    if (r->st) return r->st;
    json_object_foreach(r->j, key, v) {
        if (!in_list(key, used) && !in_list(key, ignored) && !in_list(key, common_ignored))
            return r->st = fm_set_error(FM_ERR_FORMAT,
                                        "%s: unknown key '%.80s' for a %s model: fathom does not know how it changes "
                                        "the model, so it will not guess (remove it if it does not)",
                                        r->name, key, model_type);
    }
    return FM_OK;
}

static json_t *get(hf_cfg *r, const char *key, bool required) {
    if (r->st) return NULL;
    json_t *v = json_object_get(r->j, key);
    if (!v && required) r->st = fm_set_error(FM_ERR_FORMAT, "%s: required key '%s' is missing", r->name, key);
    return json_is_null(v) ? NULL : v;
}

int hf_int(hf_cfg *r, const char *key, bool required, int def, int lo, int hi) {
    json_t *v = get(r, key, required);
    if (!v) return def;
    json_int_t x = json_integer_value(v);
    if (!json_is_integer(v) || x < lo || x > hi) {
        r->st = fm_set_error(FM_ERR_FORMAT, "%s: '%s' must be an integer in [%d, %d]", r->name, key, lo, hi);
        return def;
    }
    return (int)x;
}

double hf_num(hf_cfg *r, const char *key, bool required, double def) {
    json_t *v = get(r, key, required);
    if (!v) return def;
    if (!json_is_number(v) || !isfinite(json_number_value(v))) {
        r->st = fm_set_error(FM_ERR_FORMAT, "%s: '%s' must be a number", r->name, key);
        return def;
    }
    return json_number_value(v);
}

bool hf_bool(hf_cfg *r, const char *key, bool def) {
    json_t *v = get(r, key, false);
    if (!v) return def;
    if (!json_is_boolean(v)) {
        r->st = fm_set_error(FM_ERR_FORMAT, "%s: '%s' must be true or false", r->name, key);
        return def;
    }
    return json_is_true(v);
}

const char *hf_str(hf_cfg *r, const char *key, const char *def) {
    json_t *v = get(r, key, false);
    if (!v) return def;
    if (!json_is_string(v)) {
        r->st = fm_set_error(FM_ERR_FORMAT, "%s: '%s' must be a string", r->name, key);
        return def;
    }
    return json_string_value(v);
}

/* A value fathom's model cannot express: refused by name. */
static void refuse(hf_cfg *r, bool bad, const char *key, const char *what) {
    if (!r->st && bad) r->st = fm_set_error(FM_ERR_FORMAT, "%s: '%s': %s", r->name, key, what);
}

#define BIG (1 << 30)

static const char *const gpt2_used[] = {
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
    "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention",
    "tie_word_embeddings", "n_ctx", NULL};
static const char *const gpt2_ignored[] = {
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "reorder_and_upcast_attn", NULL};

static void gpt2_config(hf_cfg *r, fm_gpt_config *c) {
    *c = fm_gpt_config_default(FM_GPT_GPT2);
    hf_check_keys(r, "gpt2", gpt2_used, gpt2_ignored);
    c->vocab_size = hf_int(r, "vocab_size", true, 0, 1, BIG);
    c->block_size = hf_int(r, "n_positions", true, 0, 1, BIG);
    c->n_embd = hf_int(r, "n_embd", true, 0, 1, BIG);
    c->n_layer = hf_int(r, "n_layer", true, 0, 1, 10000);
    c->n_head = hf_int(r, "n_head", true, 0, 1, BIG);
    c->n_kv_head = c->n_head;
    c->ffn_hidden = hf_int(r, "n_inner", false, 4 * c->n_embd, 1, BIG);
    c->norm_eps = hf_num(r, "layer_norm_epsilon", false, 1e-5);
    const char *act = hf_str(r, "activation_function", "gelu_new");
    refuse(r, strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"), "activation_function",
           "fathom's GPT-2 uses the tanh GELU (gelu_new / gelu_pytorch_tanh) only");
    refuse(r, !hf_bool(r, "scale_attn_weights", true), "scale_attn_weights", "unscaled attention is not supported");
    refuse(r, hf_bool(r, "scale_attn_by_inverse_layer_idx", false), "scale_attn_by_inverse_layer_idx",
           "per-layer attention scaling is not supported");
    refuse(r, hf_bool(r, "add_cross_attention", false), "add_cross_attention", "cross-attention is not supported");
    refuse(r, hf_int(r, "n_ctx", false, c->block_size, 1, BIG) != c->block_size, "n_ctx", "must equal n_positions");
    c->untied_head = !hf_bool(r, "tie_word_embeddings", true);
    c->bias = true;
}

static const char *const llama_used[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "attention_bias", "mlp_bias", "head_dim", "tie_word_embeddings", NULL};
static const char *const llama_ignored[] = {"attention_dropout", "pretraining_tp", NULL};

/* rope_theta and scaling: transformers 5's rope_parameters, or 4's rope_theta + rope_scaling. */
static void llama_rope(hf_cfg *r, fm_gpt_config *c) {
    json_t *p = get(r, "rope_parameters", false), *s = get(r, "rope_scaling", false);
    c->rope_theta = hf_num(r, "rope_theta", false, 10000.0);
    if (r->st || (!p && !s)) return;
    refuse(r, p && s, "rope_scaling", "give rope_parameters or rope_scaling, not both");
    refuse(r, !json_is_object(p ? p : s), p ? "rope_parameters" : "rope_scaling", "must be an object");
    if (r->st) return;
    hf_cfg sub = {p ? p : s, r->name, FM_OK};
    const char *type = hf_str(&sub, "rope_type", NULL);
    if (!type) type = hf_str(&sub, "type", "default");
    if (p) c->rope_theta = hf_num(&sub, "rope_theta", false, c->rope_theta);
    if (!strcmp(type, "linear") || !strcmp(type, "llama3")) {
        c->rope_scaling = !strcmp(type, "linear") ? FM_ROPE_LINEAR : FM_ROPE_LLAMA3;
        c->rope_factor = hf_num(&sub, "factor", true, 1.0);
        if (c->rope_scaling == FM_ROPE_LLAMA3) {
            c->rope_low_freq_factor = hf_num(&sub, "low_freq_factor", true, 1.0);
            c->rope_high_freq_factor = hf_num(&sub, "high_freq_factor", true, 4.0);
            c->rope_original_max_pos = hf_int(&sub, "original_max_position_embeddings", true, 8192, 1, BIG);
        }
    } else if (strcmp(type, "default")) {
        refuse(&sub, true, p ? "rope_parameters" : "rope_scaling",
               "rope_type must be default, linear or llama3 (dynamic, yarn, longrope are not supported)");
    }
    r->st = sub.st;
}

/* The keys Llama and Qwen2 share (Qwen2's model is Llama's with q, k and v biases). */
static void llama_common(hf_cfg *r, fm_gpt_config *c) {
    c->vocab_size = hf_int(r, "vocab_size", true, 0, 1, BIG);
    c->n_embd = hf_int(r, "hidden_size", true, 0, 1, BIG);
    c->ffn_hidden = hf_int(r, "intermediate_size", true, 0, 1, BIG);
    c->n_layer = hf_int(r, "num_hidden_layers", true, 0, 1, 10000);
    c->n_head = hf_int(r, "num_attention_heads", true, 0, 1, BIG);
    c->n_kv_head = hf_int(r, "num_key_value_heads", false, c->n_head, 1, BIG);
    c->block_size = hf_int(r, "max_position_embeddings", true, 0, 1, 1 << 24);
    c->norm_eps = hf_num(r, "rms_norm_eps", false, 1e-6);
    refuse(r, strcmp(hf_str(r, "hidden_act", "silu"), "silu"), "hidden_act", "fathom's Llama uses SiLU (SwiGLU) only");
    /* head_dim other than hidden_size / num_attention_heads (Mistral Nemo: 5120 / 32 heads of 128):
     * the heads need not tile the hidden size */
    const int hd = c->n_head > 0 ? c->n_embd / c->n_head : 0, given = hf_int(r, "head_dim", false, hd, 1, 4096);
    c->head_dim = c->n_head > 0 && given * c->n_head != c->n_embd ? given : 0;
    llama_rope(r, c);
    c->untied_head = !hf_bool(r, "tie_word_embeddings", false);
    c->bias = false;
    c->dropout = 0;
}

static void llama_config(hf_cfg *r, fm_gpt_config *c) {
    *c = fm_gpt_config_default(FM_GPT_LLAMA);
    hf_check_keys(r, "llama", llama_used, llama_ignored);
    llama_common(r, c);
    refuse(r, hf_bool(r, "attention_bias", false), "attention_bias",
           "Llama attention biases (q, k, v and the output projection) are not supported");
    refuse(r, hf_bool(r, "mlp_bias", false), "mlp_bias", "Llama MLP biases are not supported");
}

static const char *const qwen2_used[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "head_dim", "tie_word_embeddings", "use_sliding_window", "sliding_window",
    "max_window_layers", "layer_types", "use_mrope", NULL};
static const char *const qwen2_ignored[] = {"attention_dropout", NULL};

/* Qwen2's sliding-window attention, as transformers (5.x) decides it: layer i slides
 * when layer_types says "sliding_attention" (without layer_types: when i >=
 * max_window_layers), and only with use_sliding_window and a sliding_window set.
 * fathom attends to the whole causal context, which is the same thing only when
 * the window holds every position (sliding_window >= max_position_embeddings). */
static void qwen2_window(hf_cfg *r, const fm_gpt_config *c) {
    const bool use = hf_bool(r, "use_sliding_window", false);
    const int window = hf_int(r, "sliding_window", false, 0, 1, BIG);
    const int first = hf_int(r, "max_window_layers", false, 28, 0, BIG);
    json_t *types = get(r, "layer_types", false);
    if (r->st) return;
    if (types && (!json_is_array(types) || (int)json_array_size(types) != c->n_layer)) {
        r->st = fm_set_error(FM_ERR_FORMAT, "%s: 'layer_types' must be a list of num_hidden_layers (%d) strings",
                             r->name, c->n_layer);
        return;
    }
    int sliding = -1;
    for (int i = 0; i < c->n_layer && !r->st; i++) {
        const char *t = types ? json_string_value(json_array_get(types, (size_t)i)) : NULL;
        if (types && (!t || (strcmp(t, "full_attention") && strcmp(t, "sliding_attention"))))
            r->st = fm_set_error(FM_ERR_FORMAT, "%s: 'layer_types'[%d] must be \"full_attention\" or "
                                 "\"sliding_attention\"", r->name, i);
        else if (sliding < 0 && (types ? !strcmp(t, "sliding_attention") : i >= first)) sliding = i;
    }
    if (!r->st && use && window > 0 && sliding >= 0 && window < c->block_size)
        r->st = fm_set_error(FM_ERR_FORMAT,
                             "%s: 'use_sliding_window': layer %d attends to a window of %d tokens (sliding_window), "
                             "shorter than max_position_embeddings %d; fathom's attention sees the whole context, so "
                             "it would give other results past %d tokens (sliding-window attention is not supported)",
                             r->name, sliding, window, c->block_size, window);
}

static void qwen2_config(hf_cfg *r, fm_gpt_config *c) {
    *c = fm_gpt_config_default(FM_GPT_LLAMA);
    hf_check_keys(r, "qwen2", qwen2_used, qwen2_ignored);
    llama_common(r, c);
    refuse(r, hf_bool(r, "use_mrope", false), "use_mrope", "multimodal RoPE (Qwen2-VL) is not supported");
    qwen2_window(r, c);
    c->qkv_bias = true;
}

fm_status fm_hf_gpt_config_parse(const char *json, size_t len, const char *name, fm_gpt_config *out) {
    hf_cfg r;
    if (hf_cfg_open(&r, json, len, name)) { json_decref(r.j); return r.st; }
    const char *type = hf_str(&r, "model_type", NULL);
    if (!r.st && !type) r.st = fm_set_error(FM_ERR_FORMAT, "%s: required key 'model_type' is missing", r.name);
    fm_gpt_config c;
    if (!r.st) {
        if (!strcmp(type, "gpt2")) gpt2_config(&r, &c);
        else if (!strcmp(type, "llama")) llama_config(&r, &c);
        else if (!strcmp(type, "qwen2")) qwen2_config(&r, &c);
        else r.st = fm_set_error(FM_ERR_FORMAT,
                                 "%s: model_type '%.40s' is not a causal LM fathom loads (gpt2, llama, qwen2)", r.name,
                                 type);
    }
    json_decref(r.j);
    if (r.st) return r.st;
    if (fm_gpt_config_validate(&c)) {
        fm_error_prefix("%s: ", r.name);
        return fm_last_status();
    }
    *out = c;
    return FM_OK;
}

static const char *const bert_used[] = {
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act", "position_embedding_type", NULL};
static const char *const bert_ignored[] = {"attention_probs_dropout_prob", "hidden_dropout_prob", "classifier_dropout",
                                           NULL};

fm_status hf_bert_config_parse(hf_cfg *r, hf_bert_config *c) {
    const char *type = hf_str(r, "model_type", NULL);
    if (!r->st && (!type || strcmp(type, "bert")))
        return r->st = fm_set_error(FM_ERR_FORMAT, "%s: model_type '%.40s' is not bert", r->name, type ? type : "(none)");
    hf_check_keys(r, "bert", bert_used, bert_ignored);
    c->vocab_size = hf_int(r, "vocab_size", true, 0, 1, BIG);
    c->hidden = hf_int(r, "hidden_size", true, 0, 1, BIG);
    c->layers = hf_int(r, "num_hidden_layers", true, 0, 1, 10000);
    c->heads = hf_int(r, "num_attention_heads", true, 0, 1, BIG);
    c->intermediate = hf_int(r, "intermediate_size", true, 0, 1, BIG);
    c->max_pos = hf_int(r, "max_position_embeddings", true, 0, 1, 1 << 24);
    c->type_vocab = hf_int(r, "type_vocab_size", false, 2, 1, BIG);
    c->eps = hf_num(r, "layer_norm_eps", false, 1e-12);
    refuse(r, strcmp(hf_str(r, "hidden_act", "gelu"), "gelu"), "hidden_act", "fathom's BERT uses the exact (erf) GELU");
    refuse(r, strcmp(hf_str(r, "position_embedding_type", "absolute"), "absolute"), "position_embedding_type",
           "only absolute position embeddings are supported");
    refuse(r, c->heads > 0 && c->hidden % c->heads, "num_attention_heads", "must divide hidden_size");
    refuse(r, !(c->eps > 0), "layer_norm_eps", "must be > 0");
    return r->st;
}

char *hf_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    else fm_set_error(FM_ERR_OOM, "out of host memory");
    return p;
}

char *hf_read_file(const char *path, size_t *len) {
    fm_status st;
    const char *why;
    char *s = fm_read_text_file(path, HF_JSON_MAX_BYTES, len, &st, &why);
    if (s) return s;
    if (st == FM_ERR_IO && errno == EISDIR) fm_set_error(st, "%s: is a directory, not a JSON file", path);
    else if (st == FM_ERR_IO) fm_set_error(st, "%s: %s: %s", path, why, strerror(errno));
    else if (st == FM_ERR_FORMAT)
        fm_set_error(st, "%s: %s (a Hugging Face JSON file here is at most %d MiB of text)", path, why,
                     HF_JSON_MAX_BYTES >> 20);
    else fm_set_error(st, "%s: out of host memory", path);
    return NULL;
}
