/* GPT-2, Llama and Qwen2 in Hugging Face layout (fathom/hf.h):
 *  - config.json refusals (missing and unknown keys, values fathom cannot express);
 *  - sharded weights (an index and two shards) and the index's refusals;
 *  - checkpoints that transformers saves from seeded random weights
 *    (tests/hf/fixtures.py models: tied and untied heads, GQA, rope_theta, llama3
 *    and linear rope scaling, Qwen2's q/k/v biases, two sharded): fathom's logits
 *    within 1e-4 of GPT2LMHeadModel's / LlamaForCausalLM's / Qwen2ForCausalLM's,
 *    the KV-cache decode too;
 *  - fathom models exported with fm_hf_gpt_save: transformers loads them and gives
 *    the same logits (within 1e-4). */
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>

#include "fathom/autograd.h"
#include "fathom/hf.h"
#include "fathom/io.h"
#include "fathom/ops.h"
#include "hf_util.h"
#include "test_util.h"

#define TOL 1e-4

static void config_refusals(void) {
    fm_gpt_config c;
#define REFUSED(json, needle)                                                        \
    do {                                                                             \
        const char *_j = json;                                                       \
        CHECK(fm_hf_gpt_config_parse(_j, strlen(_j), "cfg.json", &c) != FM_OK);      \
        CHECK_ERR_CONTAINS(needle);                                                  \
    } while (0)
    const char *ok = "{\"model_type\": \"gpt2\", \"vocab_size\": 50, \"n_positions\": 16, \"n_embd\": 8, "
                     "\"n_layer\": 1, \"n_head\": 2, \"resid_pdrop\": 0.1, \"n_inner\": null}";
    CHECK_MSG(fm_hf_gpt_config_parse(ok, strlen(ok), NULL, &c) == FM_OK, "%s", fm_last_error());
    CHECK(c.arch == FM_GPT_GPT2 && c.ffn_hidden == 32 && c.bias && !c.untied_head && c.block_size == 16);
    REFUSED("{\"model_type\": \"gpt2\", \"n_positions\": 16, \"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2}",
            "cfg.json: required key 'vocab_size' is missing");
    REFUSED("{\"model_type\": \"gpt2\", \"vocab_size\": 50, \"n_positions\": 16, \"n_embd\": 8, \"n_layer\": 1, "
            "\"n_head\": 2, \"sparse_attention\": true}",
            "unknown key 'sparse_attention' for a gpt2 model");
    REFUSED("{\"model_type\": \"gpt2\", \"vocab_size\": 50, \"n_positions\": 16, \"n_embd\": 8, \"n_layer\": 1, "
            "\"n_head\": 2, \"activation_function\": \"relu\"}",
            "'activation_function'");
    REFUSED("{\"model_type\": \"gpt2\", \"vocab_size\": 50, \"n_positions\": 16, \"n_embd\": 9, \"n_layer\": 1, "
            "\"n_head\": 2}",
            "not divisible");
    REFUSED("{\"model_type\": \"gpt2\", \"vocab_size\": \"50\"}", "'vocab_size' must be an integer");
    REFUSED("{\"vocab_size\": 50}", "required key 'model_type' is missing");
    REFUSED("{\"model_type\": \"t5\"}", "model_type 't5' is not a causal LM");
    REFUSED("{\"model_type\": \"gpt2\",", "cfg.json: line 1");
    const char *llama = "{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": "
                        "24, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                        "\"max_position_embeddings\": 32, \"rope_theta\": 500000.0, \"rope_scaling\": {\"type\": "
                        "\"linear\", \"factor\": 4.0}}";
    CHECK_MSG(fm_hf_gpt_config_parse(llama, strlen(llama), NULL, &c) == FM_OK, "%s", fm_last_error());
    CHECK(c.arch == FM_GPT_LLAMA && c.n_kv_head == 2 && c.rope_theta == 500000.0 && c.untied_head &&
          c.rope_scaling == FM_ROPE_LINEAR && c.rope_factor == 4.0 && c.norm_eps == 1e-6);
    REFUSED("{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": 24, "
            "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"max_position_embeddings\": 32, "
            "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
            "rope_type must be default, linear or llama3");
    REFUSED("{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": 24, "
            "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"max_position_embeddings\": 32, "
            "\"attention_bias\": true}",
            "'attention_bias'");
    REFUSED("{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": 24, "
            "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"max_position_embeddings\": 32, "
            "\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
            "required key 'low_freq_factor' is missing");
    /* a head_dim that does not tile hidden_size (4 heads of 8 over 16) is taken as given */
    llama = "{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": 24, "
            "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"max_position_embeddings\": 32, \"head_dim\": 8}";
    CHECK_MSG(fm_hf_gpt_config_parse(llama, strlen(llama), NULL, &c) == FM_OK, "%s", fm_last_error());
    CHECK(c.head_dim == 8 && fm_gpt_head_dim(&c) == 8);
    REFUSED("{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": 24, "
            "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"max_position_embeddings\": 32, "
            "\"head_dim\": 0}",
            "'head_dim'");
    /* Qwen2: Llama's keys without attention_bias / mlp_bias, plus its sliding-window keys */
#define QWEN2 "{\"model_type\": \"qwen2\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": 24, " \
              "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "              \
              "\"max_position_embeddings\": 32, \"attention_dropout\": 0.0, \"rope_theta\": 1000000.0"
    const char *qwen = QWEN2 ", \"use_sliding_window\": false, \"sliding_window\": 8, \"max_window_layers\": 0, "
                       "\"tie_word_embeddings\": true}";
    CHECK_MSG(fm_hf_gpt_config_parse(qwen, strlen(qwen), NULL, &c) == FM_OK, "%s", fm_last_error());
    CHECK(c.arch == FM_GPT_LLAMA && c.qkv_bias && !c.untied_head && c.n_kv_head == 2 && c.rope_theta == 1e6 &&
          c.norm_eps == 1e-6 && !c.bias);
    qwen = QWEN2 ", \"use_sliding_window\": true, \"sliding_window\": 32, \"layer_types\": [\"full_attention\", "
           "\"sliding_attention\"]}"; /* a window as long as the context: full attention */
    CHECK_MSG(fm_hf_gpt_config_parse(qwen, strlen(qwen), NULL, &c) == FM_OK, "%s", fm_last_error());
    CHECK(c.qkv_bias && c.untied_head);
    llama = "{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 16, \"intermediate_size\": 24, "
            "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"max_position_embeddings\": 32}";
    CHECK(fm_hf_gpt_config_parse(llama, strlen(llama), NULL, &c) == FM_OK && !c.qkv_bias);
    REFUSED(QWEN2 ", \"use_sliding_window\": true, \"sliding_window\": 16, \"max_window_layers\": 1}",
            "cfg.json: 'use_sliding_window': layer 1 attends to a window of 16 tokens (sliding_window), shorter than "
            "max_position_embeddings 32");
    REFUSED(QWEN2 ", \"use_sliding_window\": true, \"sliding_window\": 16, \"layer_types\": [\"sliding_attention\", "
            "\"full_attention\"]}",
            "layer 0 attends to a window of 16 tokens");
    REFUSED(QWEN2 ", \"layer_types\": [\"full_attention\"]}", "'layer_types' must be a list of num_hidden_layers (2)");
    REFUSED(QWEN2 ", \"layer_types\": [\"full_attention\", \"chunked_attention\"]}", "'layer_types'[1] must be");
    REFUSED(QWEN2 ", \"attention_bias\": true}", "unknown key 'attention_bias' for a qwen2 model");
    REFUSED(QWEN2 ", \"use_mrope\": true}", "'use_mrope': multimodal RoPE");
    REFUSED(QWEN2 ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}", "rope_type must be default");
    REFUSED(QWEN2 ", \"hidden_act\": \"gelu\"}", "'hidden_act'");
    REFUSED("{\"model_type\": \"qwen2\", \"vocab_size\": 50}", "required key 'hidden_size' is missing");
#undef QWEN2
    /* qkv_bias is Llama's (GPT-2 has all its biases through bias), and fathom's own
     * config.json keeps it */
    fm_gpt_config g = fm_gpt_config_default(FM_GPT_GPT2);
    g.qkv_bias = true;
    CHECK(fm_gpt_config_validate(&g) != FM_OK);
    CHECK_ERR_CONTAINS("qkv_bias (biases on q, k and v only) is for llama models");
    char tmpl[] = "/tmp/fathom-hf-cfg-XXXXXX";
    int fd = mkstemp(tmpl);
    fm_gpt_config l = fm_gpt_config_default(FM_GPT_LLAMA), back;
    l.qkv_bias = true;
    CHECK(fd >= 0 && fm_gpt_config_save(&l, tmpl) == FM_OK && fm_gpt_config_load(tmpl, &back) == FM_OK && back.qkv_bias);
    l.qkv_bias = false;
    CHECK(fm_gpt_config_save(&l, tmpl) == FM_OK && fm_gpt_config_load(tmpl, &back) == FM_OK && !back.qkv_bias);
    if (fd >= 0) { close(fd); remove(tmpl); }
#undef REFUSED
}

static fm_tensor *ids_tensor(json_t *ids) {
    int64_t T = (int64_t)json_array_size(ids), shape[2] = {1, T};
    fm_tensor *x = fm_tensor_empty(2, shape, FM_I64, FM_CPU);
    for (int64_t i = 0; x && i < T; i++) ((int64_t *)fm_tensor_data(x))[i] = json_integer_value(json_array_get(ids, (size_t)i));
    return x;
}

/* Max |fathom - reference| over rows [r0, r0 + rows) of logits [1, T, V]. */
static double max_diff(fm_tensor *got, json_t *ref, int64_t r0, int64_t rows, int64_t got_row0) {
    const float *g = fm_tensor_data(got);
    int64_t V = got->shape[2];
    double worst = 0;
    for (int64_t t = 0; t < rows; t++) {
        json_t *row = json_array_get(ref, (size_t)(r0 + t));
        if ((int64_t)json_array_size(row) != V) return INFINITY;
        for (int64_t v = 0; v < V; v++) {
            double d = fabs(g[(got_row0 + t) * V + v] - json_number_value(json_array_get(row, (size_t)v)));
            if (!(d <= worst)) worst = d;
        }
    }
    return worst;
}

/* The KV-cache path: the prefix, then the remaining ids one at a time. */
static double cached_diff(fm_gpt *m, json_t *ids, json_t *ref) {
    fm_gpt_kv_cache *kv = fm_gpt_kv_cache_new(m, 1);
    int64_t T = (int64_t)json_array_size(ids), P = T / 2;
    fm_tensor *x = ids_tensor(ids), *pre = fm_narrow(x, 1, 0, P);
    fm_tensor *lp = fm_gpt_forward_cached(m, pre, kv);
    double worst = lp ? max_diff(lp, ref, 0, P, 0) : INFINITY;
    for (int64_t t = P; t < T && lp; t++) {
        fm_tensor *one = fm_narrow(x, 1, t, 1), *l1 = fm_gpt_forward_cached(m, one, kv);
        double d = l1 ? max_diff(l1, ref, t, 1, 0) : INFINITY;
        if (!(d <= worst)) worst = d;
        fm_tensor_release_n(2, one, l1);
    }
    fm_tensor_release_n(3, x, pre, lp);
    fm_gpt_kv_cache_free(kv);
    return worst;
}

/* A directory with tokenizer.json (transformers' LlamaTokenizer; Qwen2's byte-level
 * one): the prompt's ids as the reference tokenizer gives them (Llama's with <s>),
 * then greedy generation as transformers' generate() does it (up to its length:
 * Llama's stops at </s>). */
static void check_prompt(fm_gpt *m, fm_tokenizer *tok, json_t *exp, const char *dir) {
    const char *prompt = json_string_value(json_object_get(exp, "prompt"));
    json_t *want = json_object_get(exp, "prompt_ids"), *greedy = json_object_get(exp, "greedy");
    int32_t *ids = NULL, out[16];
    int64_t n = 0;
    CHECK(fm_tokenizer_get_kind(tok) == FM_TOK_LLAMA);
    CHECK(fm_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n) == FM_OK);
    bool same_ids = (size_t)n == json_array_size(want);
    for (int64_t i = 0; same_ids && i < n; i++) same_ids = ids[i] == json_integer_value(json_array_get(want, (size_t)i));
    CHECK_MSG(same_ids, "%s: the prompt's ids differ from the reference tokenizer's", dir);
    fm_gpt_sample_params sp = {0.0, 0, 1.0, 0};
    int made = 0, G = (int)json_array_size(greedy);
    bool limit = false;
    CHECK(G > 0 && G <= 16);
    CHECK(fm_gpt_generate(m, ids, (int)n, G, &sp, true, out, &made, &limit, NULL, NULL) == FM_OK && made == G);
    bool same_gen = made == G;
    for (int i = 0; same_gen && i < G; i++) same_gen = out[i] == json_integer_value(json_array_get(greedy, (size_t)i));
    CHECK_MSG(same_gen, "%s: greedy generation differs from transformers'", dir);
    fprintf(stderr, "%s: tokenizer.json prompt (%lld ids) %s the reference tokenizer's; greedy %d tokens %s\n",
            strrchr(dir, '/') + 1, (long long)n, same_ids ? "equal to" : "DIFFERS from", G, same_gen ? "equal" : "DIFFER");
    free(ids);
}

static void check_model(const char *dir) {
    char p[1200];
    snprintf(p, sizeof p, "%s/expected.json", dir);
    json_t *exp = json_load_file(p, 0, NULL);
    fm_tokenizer *tok = NULL;
    fm_gpt *m = fm_hf_gpt_load(dir, &tok);
    CHECK_MSG(m && tok && exp, "%s: %s", dir, fm_last_error());
    if (m && tok && exp) {
        fm_tensor *x = ids_tensor(json_object_get(exp, "ids"));
        fm_tensor *l = fm_gpt_forward(m, x, NULL, NULL);
        json_t *ref = json_object_get(exp, "logits");
        double d = l ? max_diff(l, ref, 0, x->shape[1], 0) : INFINITY, dc = cached_diff(m, json_object_get(exp, "ids"), ref);
        fprintf(stderr, "%s: %s%s, %d layers, %d heads (%d kv): max |logit - transformers| %.2e, KV-cache decode %.2e\n",
                strrchr(dir, '/') + 1, fm_gpt_arch_name(fm_gpt_get_config(m)->arch),
                fm_gpt_get_config(m)->qkv_bias ? " with q/k/v biases" : "", fm_gpt_get_config(m)->n_layer,
                fm_gpt_get_config(m)->n_head, fm_gpt_get_config(m)->n_kv_head, d, dc);
        CHECK_MSG(d <= TOL, "%s: logits differ by %g", dir, d);
        /* the count the planner and memory checks use, from the config alone */
        CHECK_MSG(fm_gpt_config_num_params(fm_gpt_get_config(m)) == fm_gpt_num_params(m), "%s: %lld parameters counted "
                  "from the config, %lld in the model", dir, (long long)fm_gpt_config_num_params(fm_gpt_get_config(m)),
                  (long long)fm_gpt_num_params(m));
        CHECK_MSG(dc <= TOL, "%s: cached logits differ by %g", dir, dc);
        fm_tensor_release_n(2, x, l);
        if (json_object_get(exp, "prompt")) check_prompt(m, tok, exp, dir);
    }
    json_decref(exp);
    fm_tokenizer_free(tok);
    fm_gpt_free(m);
}

static bool same(fm_tensor *a, fm_tensor *b) {
    return fm_tensor_numel(a) == fm_tensor_numel(b) &&
           !memcmp(fm_tensor_data(a), fm_tensor_data(b), sizeof(float) * (size_t)fm_tensor_numel(a));
}

/* Writes model.safetensors.index.json in dir: tensor names[i] -> files[i]. */
static void write_index(const char *dir, int n, char **names, const char **files) {
    json_t *map = json_object();
    for (int i = 0; i < n; i++) json_object_set_new(map, names[i], json_string(files[i]));
    json_t *j = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", map);
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK(j && json_dump_file(j, p, JSON_INDENT(1)) == 0);
    json_decref(j);
}

/* Sharded weights without Python: a fathom GPT-2's model.safetensors split into two
 * shards with an index loads and gives the same logits; an index that names a path
 * outside the directory (../, absolute, .., a backslash), a tensor that is in two
 * shards, a tensor its shard lacks (in no shard, or in the other shard: every entry is
 * checked against the shard it names), a tensor a shard holds but the index does not
 * name, or that leaves a tensor out is refused with the index or shard and the tensor
 * named. */
static void shards(const char *tmp) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = 1, c.n_head = 2, c.n_embd = 16, c.block_size = 16, c.ffn_hidden = 32, c.vocab_size = 50;
    char d[1100], p[1200];
    snprintf(d, sizeof d, "%s/shards", tmp);
    fm_rng rng;
    fm_rng_init(&rng, 11);
    fm_gpt *m = fm_gpt_new(&c, &rng);
    CHECK_MSG(m && fm_hf_gpt_save(m, d) == FM_OK, "%s", fm_last_error());
    int64_t idv[4] = {3, 1, 4, 1}, shape[2] = {1, 4};
    fm_tensor *x = fm_tensor_from_data(idv, 2, shape, FM_I64), *ref = m ? fm_gpt_forward(m, x, NULL, NULL) : NULL;
    fm_gpt_free(m);
    fm_named_list all, half[2];
    memset(&all, 0, sizeof all);
    memset(half, 0, sizeof half);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK_MSG(fm_safetensors_load(p, &all, NULL) == FM_OK && all.n >= 4, "%s", fm_last_error());
    CHECK(remove(p) == 0);
    const char *shard[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char **names = malloc(sizeof(char *) * (size_t)(all.n + 1));
    const char **files = malloc(sizeof(char *) * (size_t)(all.n + 1));
    for (int i = 0; i < all.n; i++) {
        int k = i >= all.n / 2;
        CHECK(fm_named_list_push(&half[k], all.items[i].name, all.items[i].tensor, false, false) == FM_OK);
        names[i] = all.items[i].name, files[i] = shard[k];
    }
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s", d, shard[k]);
        CHECK(fm_safetensors_save(p, &half[k], NULL) == FM_OK);
    }
    write_index(d, all.n, names, files);
    fm_gpt *back = fm_hf_gpt_load(d, NULL);
    CHECK_MSG(back != NULL, "%s", fm_last_error());
    fm_tensor *got = back ? fm_gpt_forward(back, x, NULL, NULL) : NULL;
    CHECK(ref && got && same(ref, got));
    fm_tensor_release(got);
    fm_gpt_free(back);
#define SHARD_BAD_FROM(i0, needle)                             \
    do {                                                      \
        write_index(d, all.n - (i0), names + (i0), files + (i0)); \
        CHECK(fm_hf_gpt_load(d, NULL) == NULL);               \
        CHECK_ERR_CONTAINS(needle);                           \
        files[0] = shard[0];                                  \
    } while (0)
#define SHARD_BAD(n, needle)                                  \
    do {                                                      \
        write_index(d, n, names, files);                      \
        CHECK(fm_hf_gpt_load(d, NULL) == NULL);               \
        CHECK_ERR_CONTAINS(needle);                           \
        files[0] = shard[0];                                  \
    } while (0)
    files[0] = "../model-00001-of-00002.safetensors";
    SHARD_BAD(all.n, "model.safetensors.index.json: shard '../model-00001-of-00002.safetensors' is not a file name "
              "in the model directory");
    files[0] = "/etc/hostname";
    SHARD_BAD(all.n, "shard '/etc/hostname' is not a file name");
    files[0] = "..";
    SHARD_BAD(all.n, "shard '..' is not a file name in the model directory");
    files[0] = "..\\model-00001-of-00002.safetensors";
    SHARD_BAD(all.n, "is not a file name in the model directory");
    /* every shard exists and is read, but the index sends one tensor of each to the other */
    files[0] = shard[1];
    files[all.n - 1] = shard[0];
    char want[600];
    snprintf(want, sizeof want, "tensor '%s' is mapped to %s, but that shard does not hold it (it is in %s)", names[0],
             shard[1], shard[0]);
    SHARD_BAD(all.n, want);
    files[all.n - 1] = shard[1];
    /* a shard holding a tensor the index does not name (the index names the rest) */
    snprintf(want, sizeof want, "%s holds tensor '%s', which model.safetensors.index.json does not name", shard[0],
             names[0]);
    SHARD_BAD_FROM(1, want);
    snprintf(p, sizeof p, "%s/copy.safetensors", d); /* shard 1's tensors again, in a third file */
    CHECK(fm_safetensors_save(p, &half[0], NULL) == FM_OK);
    files[all.n - 1] = "copy.safetensors";
    SHARD_BAD(all.n, "is also in another shard");
    files[all.n - 1] = shard[1];
    names[all.n] = "lm_head.not_there", files[all.n] = shard[1];
    SHARD_BAD(all.n + 1, "tensor 'lm_head.not_there' is mapped to model-00002-of-00002.safetensors, which does not hold it");
    SHARD_BAD(all.n / 2, "is missing");
#undef SHARD_BAD
#undef SHARD_BAD_FROM
    free(names);
    free(files);
    fm_named_list_free(&half[0]);
    fm_named_list_free(&half[1]);
    fm_named_list_free(&all);
    fm_tensor_release_n(2, x, ref);
}

/* fathom-made models written in HF layout; transformers' logits come back as JSON
 * (one Python run for all three: GPT-2, Llama, and Llama with q/k/v biases, which
 * is written as Qwen2). */
static void check_export(const char *tmp) {
    fm_gpt_config cg = fm_gpt_config_default(FM_GPT_GPT2), cl = fm_gpt_config_default(FM_GPT_LLAMA), cq;
    cg.n_layer = 2, cg.n_head = 4, cg.n_embd = 32, cg.block_size = 32, cg.vocab_size = 97, cg.ffn_hidden = 64;
    cg.bias = false; /* written with zero biases */
    cl.n_layer = 2, cl.n_head = 4, cl.n_kv_head = 2, cl.n_embd = 32, cl.block_size = 32, cl.vocab_size = 97;
    cl.ffn_hidden = 48, cl.rope_theta = 1000.0;
    cq = cl;
    cq.qkv_bias = true, cq.n_kv_head = 1, cq.untied_head = true;
    fm_gpt_config cfgs[3] = {cg, cl, cq};
    int64_t idv[10] = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38}, shape[2] = {1, 10};
    fm_tensor *x = fm_tensor_from_data(idv, 2, shape, FM_I64), *l[3] = {NULL, NULL, NULL};
    char dirs[3][1100], args[4800], out[1200], why[8192];
    for (int k = 0; k < 3; k++) {
        fm_rng rng;
        fm_rng_init(&rng, 7 + (uint64_t)k);
        fm_gpt *m = fm_gpt_new(&cfgs[k], &rng);
        for (int i = 0; m && i < fm_gpt_parameters(m)->n; i++) /* non-trivial norms and biases too */
            fm_tensor_normal_(fm_gpt_parameters(m)->items[i].tensor, 0.2, 0.3, &rng);
        if (m) fm_gpt_train_mode(m, false);
        snprintf(dirs[k], sizeof dirs[k], "%s/export_%s%s", tmp, fm_gpt_arch_name(cfgs[k].arch),
                 cfgs[k].qkv_bias ? "_qkv_bias" : "");
        CHECK_MSG(m && fm_hf_gpt_save(m, dirs[k]) == FM_OK, "%s", fm_last_error());
        l[k] = m ? fm_gpt_forward(m, x, NULL, NULL) : NULL;
        fm_gpt *back = fm_hf_gpt_load(dirs[k], NULL);
        CHECK_MSG(back != NULL, "%s", fm_last_error());
        fm_tensor *lb = back ? fm_gpt_forward(back, x, NULL, NULL) : NULL;
        CHECK(l[k] && lb && same(l[k], lb)); /* fathom reads back exactly what it wrote */
        fm_tensor_release(lb);
        fm_gpt_free(back);
        fm_gpt_free(m);
    }
    snprintf(out, sizeof out, "%s/logits.json", tmp);
    snprintf(args, sizeof args, "'%s' '%s' '%s' '%s'", out, dirs[0], dirs[1], dirs[2]);
    int rc = hf_fixtures("logits", "3,14,15,92,65,35,89,79,32,38", args, why, sizeof why);
    if (rc == 77) TEST_SKIP("transformers not available: the exports were not loaded by it");
    else if (rc) CHECK_MSG(0, "transformers could not load the exports: %s", why);
    json_t *r = rc ? NULL : json_load_file(out, 0, NULL);
    for (int k = 0; r && k < 3; k++) {
        json_t *e = json_object_get(r, dirs[k]);
        double d = l[k] && e ? max_diff(l[k], json_object_get(e, "logits"), 0, 10, 0) : INFINITY;
        const char *cls = json_string_value(json_object_get(e, "class"));
        fprintf(stderr, "export %s%s -> transformers %s: max |logit difference| %.2e\n", fm_gpt_arch_name(cfgs[k].arch),
                cfgs[k].qkv_bias ? " with q/k/v biases" : "", cls ? cls : "(none)", d);
        CHECK_MSG(cls && !strcmp(cls, k == 0 ? "GPT2LMHeadModel" : k == 1 ? "LlamaForCausalLM" : "Qwen2ForCausalLM"),
                  "%s: transformers loaded it as %s", dirs[k], cls ? cls : "(none)");
        CHECK_MSG(d <= TOL, "exported %s: transformers' logits differ by %g", dirs[k], d);
    }
    if (!rc && !r) CHECK_MSG(0, "%s: no logits from transformers", out);
    json_decref(r);
    fm_tensor_release_n(4, x, l[0], l[1], l[2]);
}

int main(void) {
    fm_set_grad_enabled(false);
    config_refusals();
    char tmp[] = "/tmp/fathom-hf-gpt-XXXXXX", why[8192];
    if (!mkdtemp(tmp)) { CHECK(0); TEST_DONE(); }
    shards(tmp);
    int rc = hf_fixtures("models", tmp, NULL, why, sizeof why);
    if (rc == 77) {
        TEST_SKIP("transformers/torch not available (%s): logits not compared", why);
    } else if (rc) {
        CHECK_MSG(0, "fixtures.py models failed: %s", why);
    } else {
        const char *names[] = {"m_gpt2",         "m_gpt2_untied", "m_llama",        "m_llama_tied_llama3",
                               "m_llama_linear", "m_qwen2",       "m_qwen2_untied", "m_llama_head_dim"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            char d[1100];
            snprintf(d, sizeof d, "%s/%s", tmp, names[i]);
            check_model(d);
        }
        check_export(tmp);
        /* `fathom generate` on transformers' own GPT-2 directory (vocab.json + merges.txt),
         * its GQA Llama and its Qwen2 (tokenizer.json): exit 0, the prompt echoed, then text */
        const char *gen[] = {"m_gpt2", "m_llama", "m_qwen2_untied"};
        for (int k = 0; k < 3; k++) {
            char cmd[2400], out[4096] = "";
            snprintf(cmd, sizeof cmd, "\"%s\" generate '%s/%s' --prompt 'Hello world' --tokens 5 --temperature 0 "
                     "--quiet 2>&1", getenv("FATHOM_BIN") ? getenv("FATHOM_BIN") : "build/fathom", tmp, gen[k]);
            FILE *pf = popen(cmd, "r");
            size_t got = pf ? fread(out, 1, sizeof out - 1, pf) : 0;
            out[got] = 0;
            int st = pf ? pclose(pf) : -1;
            CHECK_MSG(st == 0 && !strncmp(out, "Hello world", 11) && got > 11,
                      "fathom generate %s: status %d, printed '%s'", gen[k], st, out);
        }
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
    TEST_DONE();
}
