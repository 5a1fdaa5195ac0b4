/* GPT-2, Llama and Qwen2 checkpoints in Hugging Face layout (see fathom/hf.h), mapped
 * onto fathom's GPT model: its parameters already carry the Hugging Face names
 * (fm_gpt_load_hf_tensors), so this file reads the directory (config, single or
 * sharded weights, tokenizer) and writes one back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fathom/io.h"
#include "fathom/ops.h"
#include "hf/hf_internal.h"
#include "io/io_internal.h" /* fm_dir_begin, fm_dir_commit */

bool fm_hf_is_model_dir(const char *dir) {
    char *p = hf_path(dir, "config.json");
    size_t n = 0;
    char *s = p ? hf_read_file(p, &n) : NULL;
    bool yes = false;
    if (s) {
        json_t *j = json_loadb(s, n, 0, NULL);
        yes = json_is_string(json_object_get(j, "model_type"));
        json_decref(j);
    }
    free(s);
    free(p);
    fm_clear_error();
    return yes;
}

static bool file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A shard named by the index: a plain file name in the model directory (no
 * directory part, so no path out of it: not "..", not absolute, no '/' or '\\'). A
 * symbolic link in the directory is followed: the Hugging Face cache's snapshot
 * directories are links into its blobs folder. */
static fm_status shard_name_ok(const char *index, const char *file) {
    if (!*file || strchr(file, '/') || strchr(file, '\\') || !strcmp(file, ".") || !strcmp(file, ".."))
        return fm_set_error(FM_ERR_FORMAT, "%s: shard '%.80s' is not a file name in the model directory", index, file);
    return FM_OK;
}

/* Adds every tensor of one shard to all (which takes the references) and records
 * in origin which file (its name in the index) each came from. */
static fm_status add_shard(fm_named_list *all, json_t *origin, const char *path, const char *file) {
    fm_named_list l;
    memset(&l, 0, sizeof l);
    fm_status st = fm_safetensors_load(path, &l, NULL);
    for (int i = 0; i < l.n && st == FM_OK; i++) {
        if (fm_named_list_find(all, l.items[i].name) >= 0)
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' is also in another shard (%s)", path, l.items[i].name,
                              json_string_value(json_object_get(origin, l.items[i].name)));
        else if (json_object_set_new(origin, l.items[i].name, json_string(file)))
            st = fm_set_error(FM_ERR_OOM, "out of host memory");
        else
            st = fm_named_list_push(all, l.items[i].name, l.items[i].tensor, false, false); /* retains */
    }
    fm_named_list_free(&l);
    return st;
}

/* model.safetensors.index.json: {"weight_map": {tensor: file}}. Every shard it
 * names is read once; then every tensor the map names must be in the very shard it
 * names, and every tensor the shards hold must be named (a shard with tensors the
 * index does not list, or lists under another shard, belongs to another checkpoint
 * or a broken copy). */
static fm_status load_sharded(const char *dir, const char *index, fm_named_list *all) {
    size_t n = 0;
    char *s = hf_read_file(index, &n);
    if (!s) return fm_last_status();
    json_error_t e;
    json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, &e), *map = json_object_get(j, "weight_map");
    free(s);
    fm_status st = FM_OK;
    if (!j) st = fm_set_error(FM_ERR_FORMAT, "%s: line %d: %s", index, e.line, e.text);
    else if (!json_is_object(map)) st = fm_set_error(FM_ERR_FORMAT, "%s: no \"weight_map\" object", index);
    json_t *done = json_object(), *origin = json_object(); /* shards read; tensor -> the shard it is in */
    if (!st && (!done || !origin)) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) { /* the names first, then each shard once */
        const char *file = json_string_value(v);
        if (st) break;
        if (!file) { st = fm_set_error(FM_ERR_FORMAT, "%s: weight_map['%.80s'] is not a file name", index, name); break; }
        if ((st = shard_name_ok(index, file))) break;
        if (!json_object_get(done, file)) {
            char *p = hf_path(dir, file);
            st = p ? add_shard(all, origin, p, file) : fm_last_status();
            free(p);
            json_object_set_new(done, file, json_true());
        }
    }
    json_object_foreach(map, name, v) {
        if (st) break;
        const char *file = json_string_value(v), *in = json_string_value(json_object_get(origin, name));
        if (!in)
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%.80s' is mapped to %s, which does not hold it", index, name,
                              file);
        else if (strcmp(in, file))
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%.80s' is mapped to %s, but that shard does not hold it (it is "
                              "in %s)", index, name, file, in);
    }
    for (int i = 0; i < all->n && !st; i++)
        if (!json_object_get(map, all->items[i].name))
            st = fm_set_error(FM_ERR_FORMAT, "%s/%s holds tensor '%.80s', which model.safetensors.index.json does not "
                              "name", dir, json_string_value(json_object_get(origin, all->items[i].name)),
                              all->items[i].name);
    json_decref(origin);
    json_decref(done);
    json_decref(j);
    return st;
}

static fm_status load_weights(fm_gpt *m, const char *dir) {
    char *single = hf_path(dir, "model.safetensors"), *index = hf_path(dir, "model.safetensors.index.json");
    fm_named_list all;
    memset(&all, 0, sizeof all);
    all.owns_tensors = true;
    fm_status st;
    if (!single || !index) st = fm_last_status();
    else if (file_exists(single)) st = fm_gpt_load_hf(m, single);
    else if (file_exists(index)) {
        st = load_sharded(dir, index, &all);
        if (st == FM_OK) st = fm_gpt_load_hf_tensors(m, &all, index);
    } else {
        st = fm_set_error(FM_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json is here", dir);
    }
    fm_named_list_free(&all);
    free(single);
    free(index);
    return st;
}

/* fathom's tokenizer.txt when it is here, else vocab.json + merges.txt (GPT-2's
 * files) when both are, else tokenizer.json (Llama's, Mistral's). */
const char *const *fm_hf_tokenizer_files(const char *dir) {
    static const char *const gpt2[] = {"vocab.json", "merges.txt", NULL}, *const json[] = {"tokenizer.json", NULL},
                             *const own[] = {"tokenizer.txt", NULL};
    char *ft = hf_path(dir, "tokenizer.txt"), *v = hf_path(dir, "vocab.json"), *mg = hf_path(dir, "merges.txt"),
         *tj = hf_path(dir, "tokenizer.json");
    const char *const *r = !ft || !v || !mg || !tj ? NULL
                           : file_exists(ft)                       ? own
                           : file_exists(v) && file_exists(mg)     ? gpt2
                           : file_exists(tj)                       ? json
                                                                   : NULL;
    free(ft);
    free(v);
    free(mg);
    free(tj);
    return r;
}

/* The tokenizer fm_hf_tokenizer_files picks: fathom's tokenizer.txt (exactly the
 * model's vocabulary), vocab.json + merges.txt, or tokenizer.json (Hugging Face's,
 * which may be padded past: at most the model's) */
static fm_tokenizer *load_tokenizer(const char *dir, int model_vocab) {
    const char *const *files = fm_hf_tokenizer_files(dir);
    if (!files) {
        fm_set_error(FM_ERR_IO, "%s: no tokenizer here: neither vocab.json + merges.txt (byte-level BPE) nor tokenizer.json", dir);
        return NULL;
    }
    char *a = hf_path(dir, files[0]), *b = files[1] ? hf_path(dir, files[1]) : NULL;
    const bool own = !strcmp(files[0], "tokenizer.txt");
    fm_tokenizer *t = NULL;
    if (!a || (files[1] && !b)) fm_set_error(FM_ERR_OOM, "out of host memory");
    else t = own ? fm_tokenizer_load(a) : files[1] ? fm_tokenizer_load_gpt2(a, b) : fm_tokenizer_load_hf_json(a);
    const int tv = t ? fm_tokenizer_vocab_size(t) : 0;
    if (t && (own ? tv != model_vocab : tv > model_vocab)) {
        if (own) fm_set_error(FM_ERR_FORMAT, "%s: the tokenizer has %d tokens but the model's vocabulary is %d", a, tv, model_vocab);
        else fm_set_error(FM_ERR_FORMAT, "%s: the tokenizer has %d tokens but config.json's vocab_size is %d: the tokenizer "
                          "files do not belong to this model", a, tv, model_vocab);
        fm_tokenizer_free(t);
        t = NULL;
    }
    free(a);
    free(b);
    return t;
}

fm_tokenizer *fm_hf_tokenizer_load(const char *dir, int model_vocab) { return load_tokenizer(dir, model_vocab); }

fm_gpt *fm_hf_gpt_load(const char *dir, fm_tokenizer **tok) {
    if (tok) *tok = NULL;
    char *cp = hf_path(dir, "config.json");
    size_t n = 0;
    char *s = cp ? hf_read_file(cp, &n) : NULL;
    fm_gpt_config c;
    fm_gpt *m = NULL;
    if (s && fm_hf_gpt_config_parse(s, n, cp, &c) == FM_OK && (m = fm_gpt_new(&c, NULL))) {
        fm_gpt_train_mode(m, false);
        if (load_weights(m, dir) || (tok && !(*tok = load_tokenizer(dir, c.vocab_size)))) {
            fm_gpt_free(m);
            m = NULL;
        }
    }
    free(s);
    free(cp);
    return m;
}

/* ---------------- export ---------------- */

static json_t *gpt_config_json(const fm_gpt_config *c) {
    if (c->arch == FM_GPT_GPT2)
        return json_pack("{s:s,s:[s],s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:f,s:b,s:f,s:f,s:f}", "model_type", "gpt2",
                         "architectures", "GPT2LMHeadModel", "vocab_size", c->vocab_size, "n_positions",
                         c->block_size, "n_embd", c->n_embd, "n_layer", c->n_layer, "n_head", c->n_head, "n_inner",
                         c->ffn_hidden, "activation_function", "gelu_new", "layer_norm_epsilon", c->norm_eps,
                         "tie_word_embeddings", !c->untied_head, "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop",
                         0.0);
    /* a Llama with q, k and v biases is Qwen2's model (Llama's attention_bias would
     * put one on the output projection too) */
    const bool qwen2 = c->qkv_bias;
    json_t *j = json_pack("{s:s,s:[s],s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:f,s:f,s:b}", "model_type",
                          qwen2 ? "qwen2" : "llama", "architectures", qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
                          "vocab_size", c->vocab_size, "hidden_size", c->n_embd, "intermediate_size", c->ffn_hidden,
                          "num_hidden_layers", c->n_layer, "num_attention_heads", c->n_head, "num_key_value_heads",
                          c->n_kv_head, "head_dim", fm_gpt_head_dim(c), "max_position_embeddings", c->block_size,
                          "hidden_act", "silu", "rms_norm_eps", c->norm_eps, "rope_theta", c->rope_theta,
                          "tie_word_embeddings", !c->untied_head);
    if (j && qwen2) json_object_set_new(j, "use_sliding_window", json_false());
    if (j && !qwen2) {
        json_object_set_new(j, "attention_bias", json_false());
        json_object_set_new(j, "mlp_bias", json_false());
    }
    if (j && c->rope_scaling) {
        json_t *r = json_pack("{s:s,s:f}", "rope_type", c->rope_scaling == FM_ROPE_LINEAR ? "linear" : "llama3",
                              "factor", c->rope_factor);
        if (r && c->rope_scaling == FM_ROPE_LLAMA3) {
            json_object_set_new(r, "low_freq_factor", json_real(c->rope_low_freq_factor));
            json_object_set_new(r, "high_freq_factor", json_real(c->rope_high_freq_factor));
            json_object_set_new(r, "original_max_position_embeddings", json_integer(c->rope_original_max_pos));
        }
        json_object_set_new(j, "rope_scaling", r);
    }
    return j;
}

/* GPT-2 without biases: the zero biases HF's GPT-2 expects, added to the file. */
static fm_status add_zero_biases(const fm_gpt_config *c, const char *path) {
    fm_named_list l;
    memset(&l, 0, sizeof l);
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    fm_status st = fm_safetensors_load(path, &l, &meta);
    char name[160];
    const int C = c->n_embd, F = c->ffn_hidden;
    for (int i = -1; i < c->n_layer && st == FM_OK; i++) {
        static const char *const parts[] = {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"};
        for (int k = 0; k < (i < 0 ? 1 : 6) && st == FM_OK; k++) {
            int64_t n = i < 0 ? C : k == 1 ? 3 * C : k == 4 ? F : C;
            if (i < 0) snprintf(name, sizeof name, "transformer.ln_f.bias");
            else snprintf(name, sizeof name, "transformer.h.%d.%s.bias", i, parts[k]);
            fm_tensor *z = fm_tensor_zeros(1, &n, FM_F32, FM_CPU);
            st = z ? fm_named_list_push(&l, name, z, false, false) : fm_last_status(); /* retains */
            fm_tensor_release(z);
        }
    }
    if (st == FM_OK) st = fm_safetensors_save(path, &l, &meta);
    fm_kv_free(&meta);
    fm_named_list_free(&l);
    return st;
}

fm_status fm_hf_gpt_save(const fm_gpt *m, const char *dir) {
    const fm_gpt_config *c = fm_gpt_get_config(m);
    if (c->arch == FM_GPT_GPT2 && fm_gpt_head_dim(c) * c->n_head != c->n_embd)
        return fm_set_error(FM_ERR_UNSUPPORTED, "Hugging Face export: this GPT-2 has %d heads of %d (head_dim set, e.g. by "
                            "head pruning), which GPT2LMHeadModel cannot express (its heads tile n_embd %d)", c->n_head,
                            fm_gpt_head_dim(c), c->n_embd);
    fm_dir_tx tx; /* written whole into DIR.tmp.PID, then one rename: never a half directory */
    fm_status st = fm_dir_begin(&tx, dir, false, "Hugging Face export");
    if (st) return st;
    char *cp = hf_path(tx.tmp, "config.json"), *mp = hf_path(tx.tmp, "model.safetensors");
    json_t *j = gpt_config_json(c);
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    st = !cp || !mp || !s ? fm_set_error(FM_ERR_OOM, "out of host memory") : FM_OK;
    if (st == FM_OK) st = fm_gpt_save_hf(m, mp);
    if (st == FM_OK && c->arch == FM_GPT_GPT2 && !c->bias) st = add_zero_biases(c, mp);
    if (st == FM_OK) {
        fm_io_chunk ch[2] = {{s, strlen(s)}, {"\n", 1}};
        st = fm_atomic_write(cp, 2, ch);
    }
    if (st == FM_OK) st = fm_dir_commit(&tx);
    else fm_dir_abort(&tx);
    free(s);
    json_decref(j);
    free(cp);
    free(mp);
    return st;
}
