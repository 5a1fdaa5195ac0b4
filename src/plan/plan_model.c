/* The planner's model descriptions: presets with their published dimensions,
 * exact parameter counts from dimensions, a shape guess when only a count is
 * known, and counting from a safetensors header without reading the weights.
 *
 * Parameter counts are computed, never typed in, so a preset's count is a check
 * on the formulas: gpt2-124m must come out at 124,439,808 and llama-2-7b at
 * 6,738,415,616, the figures the published checkpoints have. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "plan/plan_internal.h"

/* Anything above this is a typo, not a model: 1e15 parameters would need
 * petabytes just for the weights. */
#define PLAN_MAX_PARAMS 1e15

fm_status fm_plan_parse_count(const char *text, double *out) {
    if (!text || !*text)
        return fm_set_error(FM_ERR_INVALID, "empty number (expected a count such as 7B, 124M or 2e12)");
    const char *s = text;
    while (isspace((unsigned char)*s)) s++;
    if (*s == '-')
        return fm_set_error(FM_ERR_INVALID, "\"%s\" is negative (expected a positive count such as 7B)", text);
    if (!isdigit((unsigned char)*s) && *s != '.')
        return fm_set_error(FM_ERR_INVALID, "\"%s\" is not a number (expected a count such as 7B, 124M or 2e12)", text);
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE || !isfinite(v))
        return fm_set_error(FM_ERR_INVALID, "\"%s\" is out of range", text);
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1e3; end++; break;
    case 'M': mul = 1e6; end++; break;
    case 'B': case 'G': mul = 1e9; end++; break;
    case 'T': mul = 1e12; end++; break;
    default: break;
    }
    while (isspace((unsigned char)*end)) end++;
    if (*end)
        return fm_set_error(FM_ERR_INVALID, "\"%s\" is not a number (unexpected \"%s\"; suffixes are K, M, B, T)", text, end);
    v *= mul;
    if (!(v >= 1))
        return fm_set_error(FM_ERR_INVALID, "\"%s\" must be at least 1", text);
    if (v > PLAN_MAX_PARAMS)
        return fm_set_error(FM_ERR_INVALID, "\"%s\" is absurdly large (limit 1e15)", text);
    *out = v;
    return FM_OK;
}

/* ---- counting from dimensions ---- */

/* Parameters of one transformer block, of the embeddings + untied head (kept
 * 16-bit when the blocks are quantized), and in total. Doubles: inputs are
 * bounded so the products stay exact below 2^53. */
double plan_head_dim(const fm_plan_model *m) {
    if (m->head_dim > 0) return (double)m->head_dim;
    return m->heads > 0 ? (double)m->hidden / (double)m->heads : 0;
}

/* Parameters of the experts a token skips: (experts - active) SwiGLU MLPs per layer. */
static double idle_expert_params(const fm_plan_model *m) {
    if (m->experts <= 1 || m->arch != FM_PLAN_ARCH_LLAMA) return 0;
    return (double)m->layers * (double)(m->experts - m->experts_active) * 3 * (double)m->hidden * (double)m->ffn;
}

double plan_active_params(const fm_plan_model *m) { return (double)m->params - idle_expert_params(m); }

static void count_from_dims(fm_plan_model *m) {
    double L = (double)m->layers, h = (double)m->hidden, f = (double)m->ffn, V = (double)m->vocab;
    double hd = plan_head_dim(m), q = (double)m->heads * hd, kv = (double)m->kv_heads * hd, P = (double)m->max_seq;
    double E = m->experts > 1 ? (double)m->experts : 1;
    double layer = 0, embed = 0, other = 0;
    switch (m->arch) {
    case FM_PLAN_ARCH_GPT:
        /* qkv (+bias), output projection (+bias), GeLU MLP (+biases), two
         * LayerNorms; the heads' width q = heads x head_dim is h unless a
         * config sets head_dim (heads pruned, say) */
        layer = h * (q + 2 * kv) + q * h + h * f + f * h + 4 * h;
        if (m->no_bias) layer -= 2 * h; /* LayerNorm weights only */
        else layer += (q + 2 * kv) + h + f + h;
        embed = V * h + P * h;
        other = m->no_bias ? h : 2 * h; /* final LayerNorm */
        break;
    case FM_PLAN_ARCH_LLAMA:
        /* q, k, v, o without bias; SwiGLU gate, up, down; two RMSNorm weights */
        layer = 2 * h * q + 2 * h * kv + 3 * h * f * E + 2 * h;
        if (E > 1) layer += h * E;                  /* the router */
        if (m->qkv_bias) layer += q + 2 * kv;       /* Qwen2 */
        embed = V * h;
        other = h;
        break;
    case FM_PLAN_ARCH_BERT:
        layer = (h * h + h) + 2 * (h * kv + kv) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h;
        embed = V * h + P * h + 2 * h + 2 * h; /* words, positions, token types, LayerNorm */
        other = h * h + h;                     /* pooler */
        break;
    case FM_PLAN_ARCH_CNN:
        return;
    }
    /* BERT's published count has no output head (the MLM head is tied and
     * task heads are not part of the base model). */
    double head = m->tied_embeddings || m->arch == FM_PLAN_ARCH_BERT ? 0 : V * h;
    m->params = (int64_t)(L * layer + embed + head + other);
    m->embed_params = (int64_t)(embed + head + other);
    m->largest_layer = (int64_t)(layer > V * h ? layer : V * h);
}

fm_status fm_plan_model_from_dims(fm_plan_model *m) {
    const char *an = m->arch == FM_PLAN_ARCH_GPT ? "gpt" : m->arch == FM_PLAN_ARCH_LLAMA ? "llama" : "bert";
    if (m->arch == FM_PLAN_ARCH_CNN)
        return fm_set_error(FM_ERR_INVALID, "a CNN cannot be described by transformer dimensions (use --preset resnet-50 or --params)");
    struct { const char *name; int64_t v, lo, hi; } lim[] = {
        {"--layers", m->layers, 1, 10000}, {"--hidden", m->hidden, 1, 1000000},
        {"--heads", m->heads, 1, 100000}, {"--vocab", m->vocab, 1, 100000000},
    };
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v < lim[i].lo || lim[i].v > lim[i].hi)
            return fm_set_error(FM_ERR_INVALID, "%s %lld is out of range (%lld..%lld) for --arch %s", lim[i].name,
                                (long long)lim[i].v, (long long)lim[i].lo, (long long)lim[i].hi, an);
    if (m->head_dim == 0 && m->hidden % m->heads)
        return fm_set_error(FM_ERR_INVALID, "--heads %lld does not divide --hidden %lld", (long long)m->heads,
                            (long long)m->hidden);
    if (m->kv_heads == 0) m->kv_heads = m->heads;
    if (m->kv_heads < 1 || m->kv_heads > m->heads || m->heads % m->kv_heads)
        return fm_set_error(FM_ERR_INVALID, "--kv-heads %lld must divide --heads %lld (grouped-query attention)",
                            (long long)m->kv_heads, (long long)m->heads);
    if (m->ffn == 0) {
        if (m->arch == FM_PLAN_ARCH_LLAMA) /* Llama's rule: 2/3 of 4h, rounded up to 256 */
            m->ffn = ((8 * m->hidden / 3 + 255) / 256) * 256;
        else
            m->ffn = 4 * m->hidden;
    }
    if (m->experts > 1 && (m->arch != FM_PLAN_ARCH_LLAMA || m->experts_active < 1 || m->experts_active > m->experts))
        return fm_set_error(FM_ERR_INVALID, "%lld experts with %lld active per token: a mixture of experts needs a llama-style "
                            "block and 1..experts active", (long long)m->experts, (long long)m->experts_active);
    if (m->ffn < 1 || m->ffn > 10000000)
        return fm_set_error(FM_ERR_INVALID, "--ffn %lld is out of range (1..10000000)", (long long)m->ffn);
    if (m->max_seq == 0) m->max_seq = m->arch == FM_PLAN_ARCH_BERT ? 512 : m->arch == FM_PLAN_ARCH_GPT ? 2048 : 4096;
    if (m->max_seq < 1 || m->max_seq > 100000000)
        return fm_set_error(FM_ERR_INVALID, "context length %lld is out of range", (long long)m->max_seq);
    double approx = (double)m->layers * 16.0 * (double)m->hidden * (double)m->hidden +
                    (double)m->layers * 3.0 * (double)m->hidden * (double)m->ffn +
                    2.0 * (double)m->vocab * (double)m->hidden;
    if (approx > PLAN_MAX_PARAMS)
        return fm_set_error(FM_ERR_INVALID, "these dimensions give about %.3g parameters, beyond any real model (limit 1e15)",
                            approx);
    if (!m->name[0])
        snprintf(m->name, sizeof m->name, "%s L%lld h%lld", an, (long long)m->layers, (long long)m->hidden);
    if (!m->dims_source[0]) snprintf(m->dims_source, sizeof m->dims_source, "given");
    count_from_dims(m);
    return FM_OK;
}

/* ---- presets ---- */

typedef struct preset {
    const char *name;
    fm_plan_arch arch;
    int64_t layers, hidden, heads, kv_heads, ffn, vocab, max_seq;
    int tied;
} preset;

/* Published configurations (the models' own config files). */
static const preset presets[] = {
    {"gpt2-124m", FM_PLAN_ARCH_GPT, 12, 768, 12, 12, 3072, 50257, 1024, 1},
    {"gpt2-355m", FM_PLAN_ARCH_GPT, 24, 1024, 16, 16, 4096, 50257, 1024, 1},
    {"gpt2-774m", FM_PLAN_ARCH_GPT, 36, 1280, 20, 20, 5120, 50257, 1024, 1},
    {"gpt2-1.5b", FM_PLAN_ARCH_GPT, 48, 1600, 25, 25, 6400, 50257, 1024, 1},
    {"llama-2-7b", FM_PLAN_ARCH_LLAMA, 32, 4096, 32, 32, 11008, 32000, 4096, 0},
    {"llama-2-13b", FM_PLAN_ARCH_LLAMA, 40, 5120, 40, 40, 13824, 32000, 4096, 0},
    {"llama-2-70b", FM_PLAN_ARCH_LLAMA, 80, 8192, 64, 8, 28672, 32000, 4096, 0},
    {"llama-3-8b", FM_PLAN_ARCH_LLAMA, 32, 4096, 32, 8, 14336, 128256, 8192, 0},
    {"llama-3.1-8b", FM_PLAN_ARCH_LLAMA, 32, 4096, 32, 8, 14336, 128256, 131072, 0},
    {"llama-3-70b", FM_PLAN_ARCH_LLAMA, 80, 8192, 64, 8, 28672, 128256, 8192, 0},
    {"mistral-7b", FM_PLAN_ARCH_LLAMA, 32, 4096, 32, 8, 14336, 32000, 32768, 0},
    {"codellama-34b", FM_PLAN_ARCH_LLAMA, 48, 8192, 64, 8, 22016, 32000, 16384, 0},
    {"bert-base", FM_PLAN_ARCH_BERT, 12, 768, 12, 12, 3072, 30522, 512, 0},
    {"minilm-l6", FM_PLAN_ARCH_BERT, 6, 384, 12, 12, 1536, 30522, 512, 0},
    {"resnet-50", FM_PLAN_ARCH_CNN, 50, 0, 0, 0, 0, 0, 0, 0},
};
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

int fm_plan_preset_count(void) { return NPRESETS; }
const char *fm_plan_preset_name(int i) { return i >= 0 && i < NPRESETS ? presets[i].name : NULL; }

static void resnet50(fm_plan_model *m) {
    /* torchvision resnet50: 25,557,032 parameters; 4.1 GMACs = 8.2 GFLOP per
     * 224x224 image forward. Saved activations: summed layer outputs are
     * 35.8M elements per image, of which PyTorch keeps about two thirds (the
     * in-place ReLU shares its input's storage), so 24M. The inference working
     * set is about three of the largest feature maps (112x112x64 = 0.8M). */
    m->arch = FM_PLAN_ARCH_CNN;
    m->layers = 50;
    m->params = 25557032;
    m->embed_params = 0;
    m->largest_layer = 2359296 + 2048 * 1000; /* a 3x3x512x512 conv or the fc layer, whichever larger */
    m->cnn_flops_per_sample = 8.2e9;
    m->cnn_act_elems = 24e6;
    m->cnn_infer_elems = 2.4e6;
    m->max_seq = 1;
}

fm_status fm_plan_model_preset(const char *name, fm_plan_model *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < NPRESETS; i++) {
        if (strcasecmp(name, presets[i].name)) continue;
        const preset *p = &presets[i];
        snprintf(out->name, sizeof out->name, "%s", p->name);
        snprintf(out->dims_source, sizeof out->dims_source, "preset");
        if (p->arch == FM_PLAN_ARCH_CNN) { resnet50(out); return FM_OK; }
        out->arch = p->arch;
        out->layers = p->layers;
        out->hidden = p->hidden;
        out->heads = p->heads;
        out->kv_heads = p->kv_heads;
        out->ffn = p->ffn;
        out->vocab = p->vocab;
        out->max_seq = p->max_seq;
        out->tied_embeddings = p->tied;
        return fm_plan_model_from_dims(out);
    }
    plan_sb sb = {0};
    const char *names[NPRESETS];
    for (int i = 0; i < NPRESETS; i++) names[i] = presets[i].name;
    plan_sb_printf(&sb, "unknown preset \"%s\"", name);
    plan_suggest(&sb, name, names, NPRESETS);
    plan_sb_printf(&sb, " (presets:");
    for (int i = 0; i < NPRESETS; i++) plan_sb_printf(&sb, " %s", names[i]);
    plan_sb_printf(&sb, ")");
    char *msg = plan_sb_take(&sb);
    fm_set_error(FM_ERR_INVALID, "%s", msg ? msg : "unknown preset");
    free(msg);
    return FM_ERR_INVALID;
}

/* ---- only a parameter count ---- */

/* Guess a Llama-like shape for N parameters: width 128 per layer (as in
 * Llama-2 7B and 13B), so N ~ 12 L h^2 + 2 V h with h = 128 L, solved for h.
 * The count itself stays exactly N; the shape only sizes activations and KV. */
static void estimate_dims(fm_plan_model *m, double n) {
    double V = n < 2e8 ? 8192 : 32000;
    double L = round(cbrt(n / (12.0 * 128.0 * 128.0)));
    if (L < 1) L = 1;
    double h = (-2 * V + sqrt(4 * V * V + 48 * L * n)) / (24 * L);
    /* Head width 128 (64 for narrow models), and a head count that is a
     * multiple of 8 once there are 16 or more, so that the usual
     * tensor-parallel degrees divide it as they do in real models. */
    double unit = h >= 1024 ? 128 : 64, heads = round(h / unit);
    if (heads >= 16) heads = round(heads / 8) * 8;
    if (heads < 1) heads = 1;
    h = heads * unit;
    m->arch = FM_PLAN_ARCH_LLAMA;
    m->layers = (int64_t)L;
    m->hidden = (int64_t)h;
    m->heads = m->hidden / (m->hidden >= 1024 ? 128 : 64);
    m->kv_heads = m->heads; /* no GQA assumed: the KV cache errs on the large side */
    m->ffn = ((8 * m->hidden / 3 + 255) / 256) * 256;
    m->vocab = (int64_t)V;
    m->max_seq = 4096;
    m->tied_embeddings = 0;
    double embed = 2 * V * h;
    if (embed > n / 2) embed = n / 2;
    m->params = (int64_t)n;
    m->embed_params = (int64_t)embed;
    double layer = (n - embed) / L;
    m->largest_layer = (int64_t)(layer > V * h ? layer : V * h);
    snprintf(m->dims_source, sizeof m->dims_source, "estimated from the parameter count");
}

fm_status fm_plan_model_from_params(double params, fm_plan_model *out) {
    memset(out, 0, sizeof *out);
    if (!(params >= 1) || params > PLAN_MAX_PARAMS)
        return fm_set_error(FM_ERR_INVALID, "parameter count %g is out of range (1..1e15)", params);
    estimate_dims(out, params);
    snprintf(out->name, sizeof out->name, "model of %.4g B parameters (shape estimated)", params / 1e9);
    return FM_OK;
}

/* ---- safetensors ---- */

static int dtype_size(const char *d) {
    static const struct { const char *n; int s; } t[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
        {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(d, t[i].n)) return t[i].s;
    return 0;
}

/* Read and validate the header; returns the parsed JSON object. Every length
 * and offset is checked against the file size before it is trusted. */
static json_t *read_safetensors_header(const char *path, int64_t *params, int *tensors) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fm_set_error(FM_ERR_IO, "cannot open %s (%s)", path, strerror(errno));
        return NULL;
    }
    json_t *root = NULL;
    char *hdr = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fm_set_error(FM_ERR_IO, "%s is not a regular file", path);
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char lenb[8];
    if (size < 8 || fread(lenb, 1, 8, f) != 8) {
        fm_set_error(FM_ERR_FORMAT, "%s: too short for a safetensors file (%llu bytes; a header length needs 8)", path,
                     (unsigned long long)size);
        goto out;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenb[i];
    if (n < 2 || n > size - 8 || n > (100u << 20)) {
        fm_set_error(FM_ERR_FORMAT, "%s: header length %llu is impossible for a file of %llu bytes (not a safetensors file?)",
                     path, (unsigned long long)n, (unsigned long long)size);
        goto out;
    }
    hdr = malloc((size_t)n);
    if (!hdr) { fm_set_error(FM_ERR_OOM, "%s: no memory for a %llu-byte header", path, (unsigned long long)n); goto out; }
    if (fread(hdr, 1, (size_t)n, f) != (size_t)n) {
        fm_set_error(FM_ERR_IO, "%s: could not read the %llu-byte header", path, (unsigned long long)n);
        goto out;
    }
    json_error_t jerr;
    root = json_loadb(hdr, (size_t)n, 0, &jerr);
    if (!root || !json_is_object(root)) {
        fm_set_error(FM_ERR_FORMAT, "%s: header is not a JSON object (%s)", path, root ? "wrong type" : jerr.text);
        json_decref(root);
        root = NULL;
        goto out;
    }
    uint64_t data_len = size - 8 - n;
    double total = 0;
    int count = 0;
    const char *key;
    json_t *t;
    json_object_foreach(root, key, t) {
        if (!strcmp(key, "__metadata__")) continue;
        json_t *dt = json_object_get(t, "dtype"), *shape = json_object_get(t, "shape");
        json_t *offs = json_object_get(t, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2) {
            fm_set_error(FM_ERR_FORMAT, "%s: tensor \"%s\" lacks dtype, shape or data_offsets", path, key);
            goto bad;
        }
        double elems = 1;
        for (size_t i = 0; i < json_array_size(shape); i++) {
            json_t *d = json_array_get(shape, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0) {
                fm_set_error(FM_ERR_FORMAT, "%s: tensor \"%s\" has a bad dimension in its shape", path, key);
                goto bad;
            }
            elems *= (double)json_integer_value(d);
        }
        json_t *b0 = json_array_get(offs, 0), *b1 = json_array_get(offs, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
            json_integer_value(b1) < json_integer_value(b0) || (uint64_t)json_integer_value(b1) > data_len) {
            fm_set_error(FM_ERR_FORMAT, "%s: tensor \"%s\" has data_offsets outside the file's %llu data bytes", path,
                         key, (unsigned long long)data_len);
            goto bad;
        }
        int es = dtype_size(json_string_value(dt));
        double span = (double)(json_integer_value(b1) - json_integer_value(b0));
        if (es && elems * es != span) {
            fm_set_error(FM_ERR_FORMAT, "%s: tensor \"%s\" (%s, %.0f elements) needs %.0f bytes but its data_offsets span %.0f",
                         path, key, json_string_value(dt), elems, elems * es, span);
            goto bad;
        }
        total += elems;
        count++;
    }
    if (count == 0) {
        fm_set_error(FM_ERR_FORMAT, "%s: the header lists no tensors", path);
        goto bad;
    }
    *params = (int64_t)total;
    *tensors = count;
    goto out;
bad:
    json_decref(root);
    root = NULL;
out:
    free(hdr);
    fclose(f);
    return root;
}

fm_status fm_plan_safetensors_count(const char *path, int64_t *params, int *tensors) {
    json_t *root = read_safetensors_header(path, params, tensors);
    if (!root) return fm_last_status() ? fm_last_status() : FM_ERR_FORMAT;
    json_decref(root);
    return FM_OK;
}

/* Index after "<tag>." in a tensor name such as "model.layers.17.mlp...", or -1. */
static int layer_index(const char *name) {
    static const char *const tags[] = {"layers.", "h.", "layer.", "blocks."};
    for (size_t t = 0; t < 4; t++) {
        size_t tl = strlen(tags[t]);
        for (const char *p = strstr(name, tags[t]); p; p = strstr(p + 1, tags[t])) {
            if (p != name && p[-1] != '.') continue;
            const char *d = p + tl;
            if (!isdigit((unsigned char)*d)) continue;
            long v = strtol(d, NULL, 10);
            if (v >= 0 && v < 100000) return (int)v;
        }
    }
    return -1;
}

static int shape2(json_t *t, int64_t *a, int64_t *b) {
    json_t *s = json_object_get(t, "shape");
    if (!json_is_array(s) || json_array_size(s) != 2) return 0;
    *a = json_integer_value(json_array_get(s, 0));
    *b = json_integer_value(json_array_get(s, 1));
    return 1;
}

/* Recover dimensions from the conventional tensor names of GPT-2, Llama and
 * BERT checkpoints. Head counts are not visible in shapes, so a head width of
 * 128 (64 for narrow models) is assumed and said so. */
static int dims_from_names(json_t *root, fm_plan_model *m) {
    int maxl = -1, llama = 0, gpt = 0, bert = 0, has_head = 0;
    int64_t V = 0, h = 0, f = 0, kvd = 0, ctx = 0, a, b;
    const char *key;
    json_t *t;
    json_object_foreach(root, key, t) {
        int li = layer_index(key);
        if (li > maxl) maxl = li;
        if (strstr(key, "gate_proj") || strstr(key, "feed_forward.w1")) llama = 1;
        if (strstr(key, "c_attn") || strstr(key, "wte")) gpt = 1;
        if (strstr(key, "word_embeddings")) bert = 1;
        if (strstr(key, "lm_head") || strstr(key, "output.weight")) has_head = 1;
        if (!shape2(t, &a, &b)) continue;
        if (strstr(key, "embed_tokens") || strstr(key, "wte") || strstr(key, "word_embeddings") ||
            strstr(key, "tok_embeddings")) { V = a; h = b; }
        if (strstr(key, "wpe") || strstr(key, "position_embeddings")) ctx = a;
        if (strstr(key, "up_proj") || strstr(key, "feed_forward.w3") || strstr(key, "intermediate.dense")) f = a;
        if (strstr(key, "c_fc.weight")) f = b; /* GPT-2's Conv1D stores [in, out] */
        if (strstr(key, "k_proj.weight") || strstr(key, "attention.wk")) kvd = a;
    }
    if (maxl < 0 || h <= 0 || V <= 0 || !(llama || gpt || bert)) return 0;
    m->arch = llama ? FM_PLAN_ARCH_LLAMA : gpt ? FM_PLAN_ARCH_GPT : FM_PLAN_ARCH_BERT;
    m->layers = maxl + 1;
    m->hidden = h;
    m->vocab = V;
    m->ffn = f > 0 ? f : 0;
    m->max_seq = ctx;
    int64_t hd = (h >= 2048 && h % 128 == 0) ? 128 : 64;
    m->heads = h % hd == 0 ? h / hd : 1;
    m->kv_heads = (kvd > 0 && kvd % hd == 0 && m->heads % (kvd / hd) == 0) ? kvd / hd : m->heads;
    m->tied_embeddings = m->arch == FM_PLAN_ARCH_LLAMA ? !has_head : m->arch == FM_PLAN_ARCH_GPT;
    snprintf(m->dims_source, sizeof m->dims_source, "tensor names (head width %lld assumed)", (long long)hd);
    return 1;
}

/* The [model] input line of a recipe.ini ("input = 1 28 28"): H x W, or 0. */
static double recipe_input_area(const char *dir) {
    char path[4096 + 16], line[512];
    snprintf(path, sizeof path, "%s/recipe.ini", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    double area = 0;
    while (fgets(line, sizeof line, f)) {
        long long c = 0, hh = 0, ww = 0;
        if (sscanf(line, " input = %lld %lld %lld", &c, &hh, &ww) == 3 && c > 0 && hh > 0 && ww > 0) area = (double)(hh * ww);
        else if (sscanf(line, " input = %lld", &c) == 1 && c > 0 && area == 0) area = 1;
    }
    fclose(f);
    return area;
}

int plan_model_from_fathom_dir(const char *dir, fm_plan_model *out) {
    char ini[4096 + 16], file[4096 + 32];
    struct stat st;
    snprintf(ini, sizeof ini, "%s/recipe.ini", dir);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    if (stat(ini, &st) != 0 || stat(file, &st) != 0) return 0;
    int64_t params = 0;
    int tensors = 0;
    json_t *root = read_safetensors_header(file, &params, &tensors);
    if (!root) return -1;
    /* Forward FLOPs per sample: 2 x weights for a linear layer, 2 x weights x
     * output positions for a convolution. Positions are taken at the input's
     * resolution (pooling and strides shrink them later), so a CNN's figure is
     * an upper bound; an MLP's is exact. Saved activations: each layer's output,
     * twice (the layer and its activation function). */
    double area = recipe_input_area(dir), flops = 0, act = 0, largest = 0, biggest_layer = 0;
    int convs = 0;
    if (area <= 0) area = 1;
    const char *key;
    json_t *t;
    json_object_foreach(root, key, t) {
        json_t *shape = json_object_get(t, "shape");
        size_t nd = json_array_size(shape);
        if (nd != 2 && nd != 4) continue;
        double w = 1;
        for (size_t i = 0; i < nd; i++) w *= (double)json_integer_value(json_array_get(shape, i));
        double out_elems = (double)json_integer_value(json_array_get(shape, 0)) * (nd == 4 ? area : 1);
        convs += nd == 4;
        flops += 2 * w * (nd == 4 ? area : 1);
        act += 2 * out_elems;
        if (out_elems > largest) largest = out_elems;
        if (w > biggest_layer) biggest_layer = w;
    }
    json_decref(root);
    memset(out, 0, sizeof *out);
    out->arch = FM_PLAN_ARCH_CNN;
    out->params = params;
    out->largest_layer = (int64_t)biggest_layer;
    out->cnn_flops_per_sample = flops;
    out->cnn_act_elems = act;
    out->cnn_infer_elems = 3 * largest;
    out->max_seq = 1;
    out->layers = convs;
    snprintf(out->dims_source, sizeof out->dims_source, "%s",
             convs ? "fathom recipe directory: a CNN (conv FLOPs at input resolution, an upper bound)"
                   : "fathom recipe directory: an MLP (exact FLOPs)");
    return 1;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void name_after(fm_plan_model *m, const char *path) {
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base && base[1] ? base + 1 : path);
}

fm_status fm_plan_model_from_file(const char *path, fm_plan_model *out) {
    memset(out, 0, sizeof *out);
    char file[4096 + 32], dir[4096], config[4096 + 16];
    struct stat st;
    if (stat(path, &st) != 0)
        return fm_set_error(FM_ERR_IO, "cannot open model %s (%s)", path, strerror(errno));
    size_t plen = strlen(path);
    if (!S_ISDIR(st.st_mode) && plen >= 5 && !strcmp(path + plen - 5, ".json"))
        return plan_model_from_config(path, out);
    if (S_ISDIR(st.st_mode)) {
        int fd = plan_model_from_fathom_dir(path, out);
        if (fd < 0) return fm_last_status() ? fm_last_status() : FM_ERR_FORMAT;
        if (fd > 0) { name_after(out, path); return FM_OK; }
        snprintf(file, sizeof file, "%s/model.safetensors", path);
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(config, sizeof config, "%s/config.json", dir);
        if (!is_file(file)) {
            if (is_file(config)) return plan_model_from_config(config, out);
            return fm_set_error(FM_ERR_IO, "%s is a directory without model.safetensors or config.json (a fathom model "
                                "directory holds the first, a Hugging Face model directory the second)", path);
        }
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        snprintf(config, sizeof config, "%s/config.json", dir);
    }
    int64_t params = 0;
    int tensors = 0;
    json_t *root = read_safetensors_header(file, &params, &tensors);
    if (!root) return fm_last_status() ? fm_last_status() : FM_ERR_FORMAT;
    if (params < 1) {
        json_decref(root);
        return fm_set_error(FM_ERR_FORMAT, "%s: the tensors hold no parameters", file);
    }
    fm_plan_model m = {0};
    int have = 0;
    if (is_file(config)) {
        /* A config beside the weights is read strictly: a broken one is an error, not a guess. */
        if (plan_model_from_config(config, &m)) { json_decref(root); return fm_last_status(); }
        have = 1;
    }
    if (!have && dims_from_names(root, &m)) {
        have = fm_plan_model_from_dims(&m) == FM_OK;
        if (!have) fm_clear_error();
    }
    json_decref(root);
    if (!have) estimate_dims(&m, (double)params);
    /* The file's count is the truth; the dimensions only size activations. */
    m.params = params;
    if (m.embed_params > params / 2) m.embed_params = params / 2;
    name_after(&m, path);
    *out = m;
    return FM_OK;
}
