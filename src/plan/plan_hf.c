/* Model dimensions from a config.json: the Hugging Face layout of the llama,
 * mistral, mixtral, qwen2, gemma, gpt2 and bert families (no weights needed),
 * and fathom's own GPT config.json (`fathom train` writes one beside the
 * weights of a GPT recipe).
 *
 * A planner that guesses when a config is wrong prints nonsense with
 * confidence, so every problem is refused with the file, the line of the
 * offending key (jansson keeps no positions for values; we scan the raw text
 * for the key) and the field's name. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "plan/plan_internal.h"

typedef struct cfg {
    const char *path;
    char *text;
    json_t *root;
    const char *type; /* model_type, or "fathom-gpt" */
} cfg;

/* Line of `"key":` at the top level (1 when absent: the error is about the file). */
static int key_line(const cfg *c, const char *key) {
    size_t kl = strlen(key);
    int line = 1, depth = 0;
    for (const char *p = c->text; *p; p++) {
        if (*p == '\n') line++;
        else if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') depth--;
        else if (*p == '"') {
            const char *start = p + 1;
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1]) p++;
            if (!*p) break;
            if (depth == 1 && (size_t)(p - start) == kl && !strncmp(start, key, kl)) {
                const char *q = p + 1;
                while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
                if (*q == ':') return line;
            }
        }
    }
    return 1;
}

/* A whole number in lo..hi. `alt` is the other family's name for the field
 * (GPT-2's n_embd for hidden_size). Missing and not required: *out = 0. */
static fm_status get_int(const cfg *c, const char *key, const char *alt, int required, int64_t lo, int64_t hi,
                         int64_t *out) {
    const char *name = key;
    json_t *v = json_object_get(c->root, key);
    if ((!v || json_is_null(v)) && alt) {
        v = json_object_get(c->root, alt);
        name = alt;
    }
    *out = 0;
    if (!v || json_is_null(v)) {
        if (!required) return FM_OK;
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: missing field \"%s\" (model_type \"%s\" needs it)", c->path,
                            key_line(c, "model_type"), key, c->type);
    }
    if (!json_is_integer(v))
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"%s\" is not a whole number", c->path, key_line(c, name), name);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"%s\" is %lld; expected %lld..%lld", c->path, key_line(c, name),
                            name, (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return FM_OK;
}

typedef struct family {
    const char *type;
    fm_plan_arch arch;
    int tied;     /* tie_word_embeddings when the config does not say */
    int qkv_bias;
    int moe;
} family;

static const family families[] = {
    {"llama", FM_PLAN_ARCH_LLAMA, 0, 0, 0},  {"mistral", FM_PLAN_ARCH_LLAMA, 0, 0, 0},
    {"mixtral", FM_PLAN_ARCH_LLAMA, 0, 0, 1}, {"qwen2", FM_PLAN_ARCH_LLAMA, 0, 1, 0},
    {"gemma", FM_PLAN_ARCH_LLAMA, 1, 0, 0},  {"gpt2", FM_PLAN_ARCH_GPT, 1, 0, 0},
    {"bert", FM_PLAN_ARCH_BERT, 0, 0, 0},
};
#define NFAMILIES ((int)(sizeof families / sizeof families[0]))

static fm_status read_dims(const cfg *c, const family *f, fm_plan_model *m) {
    int gpt2 = f->arch == FM_PLAN_ARCH_GPT;
    fm_status st;
#define GET(key, alt, req, lo, hi, dst) if ((st = get_int(c, key, alt, req, lo, hi, &m->dst))) return st
    GET(gpt2 ? "n_layer" : "num_hidden_layers", NULL, 1, 1, 10000, layers);
    GET(gpt2 ? "n_embd" : "hidden_size", NULL, 1, 1, 1000000, hidden);
    GET(gpt2 ? "n_head" : "num_attention_heads", NULL, 1, 1, 100000, heads);
    GET("vocab_size", NULL, 1, 1, 100000000, vocab);
    GET(gpt2 ? "n_inner" : "intermediate_size", NULL, !gpt2, 1, 10000000, ffn);
    GET(gpt2 ? "n_positions" : "max_position_embeddings", gpt2 ? "n_ctx" : NULL, 0, 1, 100000000, max_seq);
    if (f->arch == FM_PLAN_ARCH_LLAMA) {
        GET("num_key_value_heads", NULL, 0, 1, 100000, kv_heads);
        GET("head_dim", NULL, 0, 1, 100000, head_dim);
    }
    if (f->moe) {
        GET("num_local_experts", NULL, 1, 1, 100000, experts);
        GET("num_experts_per_tok", NULL, 1, 1, 100000, experts_active);
        if (m->experts_active > m->experts)
            return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"num_experts_per_tok\" is %lld, more than the %lld experts",
                                c->path, key_line(c, "num_experts_per_tok"), (long long)m->experts_active,
                                (long long)m->experts);
    }
#undef GET
    if (m->kv_heads && m->heads % m->kv_heads)
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"num_key_value_heads\" (%lld) does not divide the %lld heads",
                            c->path, key_line(c, "num_key_value_heads"), (long long)m->kv_heads, (long long)m->heads);
    if (!m->head_dim && m->hidden % m->heads)
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: the %lld heads do not divide hidden size %lld (and no head_dim is given)",
                            c->path, key_line(c, gpt2 ? "n_head" : "num_attention_heads"), (long long)m->heads,
                            (long long)m->hidden);
    json_t *tie = json_object_get(c->root, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie))
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"tie_word_embeddings\" is not true/false", c->path,
                            key_line(c, "tie_word_embeddings"));
    m->tied_embeddings = tie ? json_is_true(tie) : f->tied;
    m->qkv_bias = f->qkv_bias;
    return FM_OK;
}

/* An optional true/false field: 0 with *out unchanged when absent. */
static fm_status get_bool(const cfg *c, const char *key, int *out) {
    json_t *v = json_object_get(c->root, key);
    if (!v) return FM_OK;
    if (!json_is_boolean(v))
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"%s\" is not true/false", c->path, key_line(c, key), key);
    *out = json_is_true(v);
    return FM_OK;
}

/* fathom's own GPT config.json, as fm_gpt_config_save (src/gpt/gpt_model.c)
 * writes it: "arch" "gpt2" or "llama" ("gpt" is taken for GPT-2 too), the
 * optional "head_dim" (heads that do not tile n_embd), "untied_head", for
 * GPT-2 "bias" and for Llama "qkv_bias" (Qwen2's biases on q, k and v). GPT-2 runs every head with its own K and V whatever
 * n_kv_head says, as the model does. */
static fm_status read_fathom_gpt(const cfg *c, fm_plan_model *m) {
    const char *arch = json_string_value(json_object_get(c->root, "arch"));
    if (!arch || (strcmp(arch, "gpt2") && strcmp(arch, "gpt") && strcmp(arch, "llama")))
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"arch\" must be \"gpt2\" or \"llama\" in a fathom GPT config",
                            c->path, key_line(c, "arch"));
    m->arch = strcmp(arch, "llama") ? FM_PLAN_ARCH_GPT : FM_PLAN_ARCH_LLAMA;
    fm_status st;
    int untied = 0, bias = 1, qkv_bias = 0;
    if ((st = get_int(c, "n_layer", NULL, 1, 1, 10000, &m->layers)) ||
        (st = get_int(c, "n_embd", NULL, 1, 1, 1000000, &m->hidden)) ||
        (st = get_int(c, "n_head", NULL, 1, 1, 100000, &m->heads)) ||
        (st = get_int(c, "n_kv_head", NULL, 0, 1, 100000, &m->kv_heads)) ||
        (st = get_int(c, "ffn_hidden", NULL, 0, 1, 10000000, &m->ffn)) ||
        (st = get_int(c, "vocab_size", NULL, 1, 1, 100000000, &m->vocab)) ||
        (st = get_int(c, "block_size", NULL, 1, 1, 100000000, &m->max_seq)) ||
        (st = get_int(c, "head_dim", NULL, 0, 0, 4096, &m->head_dim)) || (st = get_bool(c, "untied_head", &untied)) ||
        (st = get_bool(c, "bias", &bias)) || (st = get_bool(c, "qkv_bias", &qkv_bias)))
        return st;
    if (!m->head_dim && m->hidden % m->heads)
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: the %lld heads do not divide n_embd %lld (and no head_dim is given)",
                            c->path, key_line(c, "n_head"), (long long)m->heads, (long long)m->hidden);
    if (m->arch == FM_PLAN_ARCH_GPT) {
        m->kv_heads = m->heads;
        m->no_bias = !bias;
    } else {
        m->qkv_bias = qkv_bias; /* Qwen2-style biases on q, k and v (fathom's Llama imports them) */
    }
    m->tied_embeddings = !untied; /* fathom's GPT ties the output head to the token embedding unless untied_head */
    return FM_OK;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (64u << 20)) { free(buf); fclose(f); errno = EFBIG; return NULL; }
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); return NULL; }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    fclose(f);
    buf[n] = 0;
    return buf;
}

static fm_status parse_config(cfg *c, fm_plan_model *m) {
    json_error_t jerr;
    c->root = json_loads(c->text, 0, &jerr);
    if (!c->root) return fm_set_error(FM_ERR_FORMAT, "%s:%d: malformed JSON: %s", c->path, jerr.line, jerr.text);
    if (!json_is_object(c->root)) return fm_set_error(FM_ERR_FORMAT, "%s:1: not a JSON object (a model config is one)", c->path);
    json_t *mt = json_object_get(c->root, "model_type");
    if (!mt && json_object_get(c->root, "n_layer") && json_object_get(c->root, "arch")) {
        c->type = "fathom-gpt";
        return read_fathom_gpt(c, m);
    }
    if (!mt)
        return fm_set_error(FM_ERR_FORMAT, "%s:1: missing field \"model_type\" (llama, mistral, mixtral, qwen2, gemma, "
                            "gpt2 or bert)", c->path);
    if (!json_is_string(mt))
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: field \"model_type\" is not a string", c->path, key_line(c, "model_type"));
    c->type = json_string_value(mt);
    for (int i = 0; i < NFAMILIES; i++)
        if (!strcmp(c->type, families[i].type)) {
            m->arch = families[i].arch;
            return read_dims(c, &families[i], m);
        }
    return fm_set_error(FM_ERR_INVALID, "%s:%d: unknown architecture: field \"model_type\" is \"%s\"; the planner reads "
                        "llama, mistral, mixtral, qwen2, gemma, gpt2 and bert configs (give --arch and dimensions for "
                        "others)", c->path, key_line(c, "model_type"), c->type);
}

fm_status plan_model_from_config(const char *path, fm_plan_model *out) {
    memset(out, 0, sizeof *out);
    cfg c = {.path = path};
    c.text = slurp(path);
    if (!c.text) return fm_set_error(FM_ERR_IO, "cannot read model config %s (%s)", path, strerror(errno));
    fm_plan_model m = {0};
    fm_status st = parse_config(&c, &m);
    if (!st) {
        snprintf(m.dims_source, sizeof m.dims_source, "config.json (%s)", c.type);
        const char *base = strrchr(path, '/');
        snprintf(m.name, sizeof m.name, "%s", path);
        /* Name a model after its directory: ".../Mixtral-8x7B/config.json" */
        if (base && base != path && !strcmp(base, "/config.json")) {
            const char *d = base - 1;
            while (d > path && d[-1] != '/') d--;
            snprintf(m.name, sizeof m.name, "%.*s", (int)(base - d), d);
        }
        st = fm_plan_model_from_dims(&m);
        if (st) {
            /* from_dims speaks in CLI flags; point at the file instead. */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", fm_last_error());
            st = fm_set_error(FM_ERR_FORMAT, "%s: %s", path, msg);
        }
    }
    json_decref(c.root);
    free(c.text);
    if (!st) *out = m;
    return st;
}
