/* BPE read from Hugging Face's tokenizer.json in the two families Llama-style
 * checkpoints ship (see fathom/tokenizer.h): SentencePiece-style (Llama 2, Mistral,
 * TinyLlama: "▁" spaces, <0xXX> byte fallback) and byte-level (Llama 3, and GPT-2's
 * tokenizer.json: a split pattern, then bytes in GPT-2's byte-to-unicode alphabet).
 * The file is a pipeline of named parts; this reads the forms those models use and
 * refuses any other part by name:
 *   added_tokens   matched in the raw text first (leftmost, then longest), each
 *                  one id; the text between them is encoded piece by piece
 *   normalizer     null, or Prepend / Replace (string patterns) / NFC, alone or in
 *                  a Sequence (Llama 2's "prepend ▁, spaces to ▁"; Qwen2's NFC)
 *   pre_tokenizer  null; Metaspace (replacement, prepend_scheme, split); ByteLevel
 *                  (GPT-2's pattern with use_regex, add_prefix_space); or a Sequence
 *                  of Split (Llama 3's, Qwen2's or GPT-2's pattern, Isolated) and
 *                  ByteLevel without use_regex (Llama 3, Qwen2)
 *   model          BPE with byte_fallback (<0xXX> tokens), unk_token, fuse_unk,
 *                  ignore_merges; merges as "a b" strings or [a, b] pairs
 *   post_processor null, TemplateProcessing's "single" (<s> $A ...), ByteLevel (ids
 *                  unchanged), or a Sequence of ByteLevel and the template
 *   decoder        Replace / ByteFallback / Fuse / Strip in a Sequence, Metaspace,
 *                  or ByteLevel
 * Encoding is what `tokenizers`' Tokenizer.encode(text) gives, the template's
 * special tokens included. Merging follows tokenizers' order exactly (lowest rank
 * first, then leftmost, through a heap, so a long word costs n log n and not n^2:
 * with no pre-tokenizer a whole sentence is one word). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <unicode/unorm2.h>
#include <unicode/utf16.h>

#include "fathom/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

enum { MAX_STEPS = 8, MAX_TEMPLATE = 8, STR_MAX = 64 };
enum { STEP_PREPEND, STEP_REPLACE, STEP_NFC };
enum { SCHEME_NEVER, SCHEME_FIRST, SCHEME_ALWAYS };
enum { SPLIT_NONE, SPLIT_GPT2, SPLIT_LLAMA3, SPLIT_QWEN2 };

typedef struct {
    int kind;
    char from[STR_MAX], to[STR_MAX];
    size_t from_len, to_len;
} norm_step;

struct tokz_json {
    int n_ids;
    char **key; /* each id's string as the file writes it (model.vocab or added_tokens) */
    int *key_len;
    int32_t *slot; /* open addressing over model.vocab's strings: hash -> id, -1 empty */
    size_t cap;
    int32_t *added; /* added token ids, sorted by first byte then longest first */
    int n_added, added_start[257];
    norm_step norm[MAX_STEPS];
    int n_norm;
    bool meta, meta_split; /* Metaspace pre-tokenizer */
    int meta_scheme;
    char rep[8];
    size_t rep_len;
    /* byte-level (GPT-2, Llama 3): words by a split pattern, each word's bytes written in
     * GPT-2's byte-to-unicode alphabet before BPE; prefix: ByteLevel's add_prefix_space */
    int split;
    bool byte_level, prefix;
    char alpha[256][3];
    unsigned char alpha_len[256];
    int32_t unk, byte_tok[256];
    bool fuse_unk, ignore_merges;
    int32_t pre[MAX_TEMPLATE], post[MAX_TEMPLATE];
    int n_pre, n_post;
    /* decoder: per-token text is in fm_tokenizer.tok; what applies to the whole text */
    int strip_lead, strip_trail;
    char strip_c[8];
    size_t strip_c_len;
    bool meta_first; /* Metaspace decoder: drop the first token's leading space */
};

void tokz_json_free(struct tokz_json *js) {
    if (!js) return;
    if (js->key)
        for (int i = 0; i < js->n_ids; i++) free(js->key[i]);
    free(js->key);
    free(js->key_len);
    free(js->slot);
    free(js->added);
    free(js);
}

/* ---------------- model.vocab lookup ---------------- */

static uint64_t str_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static int32_t vocab_find(const struct tokz_json *js, const char *s, size_t n) {
    size_t mask = js->cap - 1;
    for (size_t i = str_hash(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = js->slot[i];
        if (id < 0) return -1;
        if ((size_t)js->key_len[id] == n && !memcmp(js->key[id], s, n)) return id;
    }
}

static void vocab_insert(struct tokz_json *js, int32_t id) {
    size_t mask = js->cap - 1, i = str_hash(js->key[id], (size_t)js->key_len[id]) & mask;
    while (js->slot[i] >= 0) i = (i + 1) & mask;
    js->slot[i] = id;
}

/* ---------------- growable buffers ---------------- */

typedef struct { int32_t *v; int64_t n, cap; } idvec;
static bool id_push(idvec *v, int32_t x) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *p = realloc(v->v, sizeof(int32_t) * (size_t)cap);
        if (!p) return false;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

/* s with every occurrence of from (left to right, not overlapping) replaced by to;
 * malloc'd, NULL when out of memory. */
static char *replace_all(const char *s, size_t n, const char *from, size_t fl, const char *to, size_t tl, size_t *out) {
    size_t hits = 0;
    for (size_t i = 0; i + fl <= n;) {
        if (!memcmp(s + i, from, fl)) hits++, i += fl;
        else i++;
    }
    size_t len = n - hits * fl + hits * tl, o = 0;
    char *r = malloc(len + 1);
    if (!r) return NULL;
    for (size_t i = 0; i < n;) {
        if (i + fl <= n && !memcmp(s + i, from, fl)) { memcpy(r + o, to, tl); o += tl; i += fl; }
        else r[o++] = s[i++];
    }
    *out = o;
    return r;
}

static char *prepend(const char *s, size_t n, const char *p, size_t pl, size_t *out) {
    char *r = malloc(n + pl + 1);
    if (!r) return NULL;
    memcpy(r, p, pl);
    memcpy(r + pl, s, n);
    *out = n + pl;
    return r;
}

/* Unicode NFC (ICU) of s, as tokenizers' NFC normalizer: each run of valid UTF-8 is
 * normalized; a byte that is not valid UTF-8 stays as it is (tokenizers only ever sees
 * valid UTF-8, so there is nothing to match there). malloc'd, NULL when out of memory. */
static char *nfc(const char *s, size_t n, size_t *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0;
    while (a < n && u[a] < 0x80) a++;
    if (a == n) return prepend(s, n, "", 0, out); /* ASCII is its own NFC */
    UErrorCode e = U_ZERO_ERROR;
    const UNormalizer2 *norm = unorm2_getNFCInstance(&e);
    if (U_FAILURE(e) || n > INT32_MAX / 4) return NULL;
    /* UTF-16 needs at most one unit per UTF-8 byte; NFC output is grown when ICU asks */
    int32_t cap = (int32_t)(2 * n + 16);
    size_t rcap = 2 * n + 16, o = 0;
    UChar *src = malloc(sizeof(UChar) * (n + 1)), *dst = malloc(sizeof(UChar) * (size_t)cap);
    char *r = malloc(rcap);
    bool ok = src && dst && r;
    for (size_t i = 0; ok && i < n;) {
        int32_t m = 0, dl = 0;
        uint32_t cp;
        int l;
        while (i < n && (l = tokz_utf8_next(u + i, n - i, &cp)) > 0) {
            U16_APPEND_UNSAFE(src, m, (UChar32)cp);
            i += (size_t)l;
        }
        if (m) {
            e = U_ZERO_ERROR;
            dl = unorm2_normalize(norm, src, m, dst, cap, &e);
            if (e == U_BUFFER_OVERFLOW_ERROR) {
                UChar *d2 = realloc(dst, sizeof(UChar) * ((size_t)dl + 1));
                ok = d2 != NULL;
                if (ok) dst = d2, cap = dl + 1, e = U_ZERO_ERROR, dl = unorm2_normalize(norm, src, m, dst, cap, &e);
            }
            ok = ok && !U_FAILURE(e);
        }
        if (ok && o + 3 * (size_t)dl + 2 > rcap) { /* at most 3 UTF-8 bytes per UTF-16 unit */
            rcap = o + 3 * (size_t)dl + 2 + rcap / 2;
            char *r2 = realloc(r, rcap);
            ok = r2 != NULL;
            if (ok) r = r2;
        }
        for (int32_t k = 0; ok && k < dl;) {
            UChar32 c;
            U16_NEXT(dst, k, dl, c);
            o += (size_t)tokz_utf8_put((uint32_t)c, r + o);
        }
        if (ok && i < n) r[o++] = s[i++]; /* the invalid byte that ended the run */
    }
    free(src);
    free(dst);
    if (!ok) { free(r); return NULL; }
    *out = o;
    return r;
}

/* ---------------- BPE on one word ---------------- */

typedef struct { int rank, pos; } heap_ent;

static bool heap_less(heap_ent a, heap_ent b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(heap_ent *h, int *n, heap_ent e) {
    int i = (*n)++;
    while (i > 0 && heap_less(e, h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, int *n) {
    heap_ent top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* The word's first symbols, as tokenizers' BPE makes them: each character's
 * token, else its bytes' <0xXX> tokens (byte_fallback), else unk (runs of unknown
 * characters fused into one with fuse_unk; without an unk token they vanish).
 * A byte that is not valid UTF-8 is a character of its own, never in the vocab. */
static int first_symbols(const struct tokz_json *js, const unsigned char *w, size_t n, int32_t *sym) {
    int k = 0;
    int32_t unk = -1; /* a pending unk, emitted at the next known character or the end */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tokz_utf8_next(w + i, n - i, &cp);
        size_t cl = l ? (size_t)l : 1;
        int32_t id = vocab_find(js, (const char *)w + i, cl);
        bool bytes = id < 0;
        for (size_t b = 0; id < 0 && b < cl; b++) bytes = bytes && js->byte_tok[w[i + b]] >= 0;
        if (id >= 0) {
            if (unk >= 0) sym[k++] = unk, unk = -1;
            sym[k++] = id;
        } else if (bytes) { /* tokenizers leaves a pending unk pending here */
            for (size_t b = 0; b < cl; b++) sym[k++] = js->byte_tok[w[i + b]];
        } else if (js->unk >= 0) {
            if (unk >= 0 && !js->fuse_unk) sym[k++] = unk;
            unk = js->unk;
        }
        i += cl;
    }
    if (unk >= 0) sym[k++] = unk;
    return k;
}

/* Encodes one word into out. scratch holds 9 ints per byte of the word. */
static bool bpe_word(const fm_tokenizer *t, const unsigned char *w, size_t n, int *scratch, idvec *out) {
    const struct tokz_json *js = t->js;
    if (js->ignore_merges) {
        int32_t whole = vocab_find(js, (const char *)w, n);
        if (whole >= 0) return id_push(out, whole);
    }
    int32_t *sym = scratch;
    int *prev = scratch + n, *next = scratch + 2 * n, nh = 0;
    heap_ent *h = (heap_ent *)(scratch + 3 * n); /* at most n - 1 initial pairs + 2 per merge */
    int k = first_symbols(js, w, n, sym);
    for (int i = 0; i < k; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < k ? i + 1 : -1;
        int r = i + 1 < k ? tokz_rank_of(t, sym[i], sym[i + 1]) : -1;
        if (r >= 0) heap_push(h, &nh, (heap_ent){r, i});
    }
    while (nh) {
        heap_ent e = heap_pop(h, &nh);
        int p = e.pos, q = next[p];
        /* stale: p was merged into its left neighbour, or its pair changed */
        if (sym[p] < 0 || q < 0 || tokz_rank_of(t, sym[p], sym[q]) != e.rank) continue;
        sym[p] = t->merge_out[e.rank];
        sym[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        int r;
        if (prev[p] >= 0 && (r = tokz_rank_of(t, sym[prev[p]], sym[p])) >= 0) heap_push(h, &nh, (heap_ent){r, prev[p]});
        if (next[p] >= 0 && (r = tokz_rank_of(t, sym[p], sym[next[p]])) >= 0) heap_push(h, &nh, (heap_ent){r, p});
    }
    for (int i = 0; i >= 0 && i < k; i = next[i])
        if (!id_push(out, sym[i])) return false;
    return true;
}

/* ---------------- encoding ---------------- */

/* Byte-level pipeline on one piece: ByteLevel's add_prefix_space, the split pattern,
 * then each word's bytes in the byte alphabet (2 bytes of UTF-8 at most per byte)
 * through BPE. */
static bool encode_bytelevel(const fm_tokenizer *t, const char *s, size_t n, idvec *out) {
    const struct tokz_json *js = t->js;
    char *pre = NULL;
    if (js->prefix && n && s[0] != ' ') {
        if (!(pre = prepend(s, n, " ", 1, &n))) return false;
        s = pre;
    }
    const unsigned char *u = (const unsigned char *)s;
    char *w = malloc(2 * n + 1);
    int *scratch = malloc(sizeof(int) * (18 * n + 1));
    bool ok = w && scratch;
    for (size_t a = 0; ok && a < n;) {
        size_t l = js->split == SPLIT_GPT2     ? tokz_gpt2_word_len(u + a, n - a)
                   : js->split == SPLIT_LLAMA3 ? tokz_llama3_word_len(u + a, n - a, 3)
                   : js->split == SPLIT_QWEN2  ? tokz_llama3_word_len(u + a, n - a, 1)
                                               : n - a;
        size_t wl = 0;
        for (size_t i = a; i < a + l; i++) {
            memcpy(w + wl, js->alpha[u[i]], js->alpha_len[u[i]]);
            wl += js->alpha_len[u[i]];
        }
        ok = bpe_word(t, (const unsigned char *)w, wl, scratch, out);
        a += l;
    }
    free(scratch);
    free(w);
    free(pre);
    return ok;
}

/* One piece of text between added tokens: normalizer, pre-tokenizer, then BPE
 * per word. first: the piece starts the text (Metaspace's prepend_scheme first). */
static bool encode_piece(const fm_tokenizer *t, const char *s, size_t n, bool first, idvec *out) {
    const struct tokz_json *js = t->js;
    char *cur = malloc(n + 1), *nx = NULL;
    if (!cur) return false;
    memcpy(cur, s, n);
    for (int i = 0; i < js->n_norm && cur; i++) {
        const norm_step *st = &js->norm[i];
        if (st->kind == STEP_PREPEND && !n) continue; /* Prepend leaves an empty text alone */
        nx = st->kind == STEP_PREPEND ? prepend(cur, n, st->to, st->to_len, &n)
             : st->kind == STEP_NFC   ? nfc(cur, n, &n)
                                      : replace_all(cur, n, st->from, st->from_len, st->to, st->to_len, &n);
        free(cur);
        cur = nx;
    }
    if (cur && js->meta) {
        nx = replace_all(cur, n, " ", 1, js->rep, js->rep_len, &n);
        free(cur);
        cur = nx;
        bool add = js->meta_scheme == SCHEME_ALWAYS || (js->meta_scheme == SCHEME_FIRST && first);
        if (cur && n && add && (n < js->rep_len || memcmp(cur, js->rep, js->rep_len))) {
            nx = prepend(cur, n, js->rep, js->rep_len, &n);
            free(cur);
            cur = nx;
        }
    }
    if (cur && js->byte_level) {
        bool ok = encode_bytelevel(t, cur, n, out);
        free(cur);
        return ok;
    }
    int *scratch = cur ? malloc(sizeof(int) * (9 * n + 1)) : NULL;
    bool ok = scratch != NULL;
    /* words: the whole text, or (Metaspace split) a new word at each replacement */
    for (size_t a = 0; ok && a < n;) {
        size_t b = n;
        if (js->meta && js->meta_split)
            for (b = a + 1; b < n && (b + js->rep_len > n || memcmp(cur + b, js->rep, js->rep_len)); b++) {}
        ok = bpe_word(t, (const unsigned char *)cur + a, b - a, scratch, out);
        a = b;
    }
    free(scratch);
    free(cur);
    return ok;
}

/* The added token that starts at p (the longest), or -1. */
static int32_t added_at(const fm_tokenizer *t, const char *p, size_t n) {
    const struct tokz_json *js = t->js;
    unsigned char c = (unsigned char)p[0];
    for (int i = js->added_start[c]; i < js->added_start[c + 1]; i++) {
        int32_t id = js->added[i];
        size_t l = (size_t)js->key_len[id];
        if (l <= n && !memcmp(p, js->key[id], l)) return id;
    }
    return -1;
}

fm_status tokz_json_encode(const fm_tokenizer *t, const char *text, size_t n, int32_t **ids, int64_t *n_ids) {
    const struct tokz_json *js = t->js;
    idvec v = {NULL, 0, 0};
    bool ok = true;
    for (int i = 0; i < js->n_pre && ok; i++) ok = id_push(&v, js->pre[i]);
    size_t start = 0;
    for (size_t i = 0; ok && i <= n;) {
        int32_t a = i < n ? added_at(t, text + i, n - i) : -1;
        if (a < 0 && i < n) { i++; continue; }
        if (i > start) ok = encode_piece(t, text + start, i - start, start == 0, &v);
        if (a < 0) break;
        ok = ok && id_push(&v, a);
        i += (size_t)js->key_len[a];
        start = i;
    }
    for (int i = 0; i < js->n_post && ok; i++) ok = id_push(&v, js->post[i]);
    if (ok && !v.v) ok = (v.v = malloc(sizeof(int32_t))) != NULL;
    if (!ok) {
        free(v.v);
        return fm_set_error(FM_ERR_OOM, "tokenizer encode: out of memory");
    }
    *ids = v.v;
    *n_ids = v.n;
    return FM_OK;
}

/* The decoder's whole-text steps on the concatenated token texts s (*len bytes). */
void tokz_json_decode_fix(const fm_tokenizer *t, const int32_t *ids, int64_t n, char *s, size_t *len) {
    const struct tokz_json *js = t->js;
    size_t a = 0, b = *len;
    if (js->meta_first && n > 0 && t->tok_len[ids[0]] > 0 && t->tok[ids[0]][0] == ' ') a = 1;
    for (int k = 0; k < js->strip_lead && b - a >= js->strip_c_len && !memcmp(s + a, js->strip_c, js->strip_c_len); k++)
        a += js->strip_c_len;
    for (int k = 0; k < js->strip_trail && b - a >= js->strip_c_len &&
                    !memcmp(s + b - js->strip_c_len, js->strip_c, js->strip_c_len); k++)
        b -= js->strip_c_len;
    memmove(s, s + a, b - a);
    s[b - a] = 0;
    *len = b - a;
}

/* ---------------- reading tokenizer.json ---------------- */

static fm_status refuse(const char *name, const char *what, const char *type) {
    return fm_set_error(FM_ERR_FORMAT, "%s: %s \"%.40s\" is not supported (fathom reads the Llama 2/Mistral and "
                        "Llama 3/GPT-2 forms: see docs/HF.md)", name, what, type ? type : "?");
}

/* A string field of at most cap - 1 bytes into dst (cap is dst's size: the
 * Metaspace replacement and the Strip content have room for one character only). */
static fm_status short_str(json_t *o, const char *key, const char *name, const char *where, char *dst, size_t cap,
                               size_t *len) {
    json_t *v = json_object_get(o, key);
    size_t l = json_string_length(v);
    if (!json_is_string(v) || l >= cap)
        return fm_set_error(FM_ERR_FORMAT, "%s: %s.%s must be a string of at most %zu bytes", name, where, key,
                            cap - 1);
    memcpy(dst, json_string_value(v), l);
    dst[l] = 0;
    *len = l;
    return FM_OK;
}

/* Every id from model.vocab and added_tokens; V is one past the largest, and every
 * id below it must name a token. */
static fm_status read_ids(fm_tokenizer **out, json_t *vocab, json_t *added, const char *name) {
    int64_t V = 0;
    const char *key;
    json_t *val;
    size_t i;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= (1 << 22))
            return fm_set_error(FM_ERR_FORMAT, "%s: model.vocab[\"%.40s\"] must be an integer id in [0, 4194304)", name,
                                key);
        if (id + 1 > V) V = id + 1;
    }
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 22) ||
            !json_is_string(json_object_get(val, "content")) || !json_string_length(json_object_get(val, "content")))
            return fm_set_error(FM_ERR_FORMAT, "%s: added_tokens[%zu] needs an integer \"id\" in [0, 4194304) and a "
                                "non-empty \"content\"", name, i);
        if (json_integer_value(id) + 1 > V) V = json_integer_value(id) + 1;
    }
    if (V == 0) return fm_set_error(FM_ERR_FORMAT, "%s: model.vocab is empty", name);
    fm_tokenizer *t = tokz_tok_alloc(FM_TOK_LLAMA, (int)V);
    struct tokz_json *js = t ? calloc(1, sizeof *js) : NULL;
    if (t) t->js = js;
    if (js) {
        js->n_ids = (int)V;
        js->key = calloc((size_t)V, sizeof *js->key);
        js->key_len = calloc((size_t)V, sizeof *js->key_len);
        for (js->cap = 16; js->cap < 2 * (size_t)V; js->cap *= 2) {}
        js->slot = malloc(sizeof(int32_t) * js->cap);
    }
    if (!js || !js->key || !js->key_len || !js->slot) {
        fm_tokenizer_free(t);
        return fm_set_error(FM_ERR_OOM, "%s: out of memory", name);
    }
    for (size_t k = 0; k < js->cap; k++) js->slot[k] = -1;
    *out = t;
    return FM_OK;
}

static fm_status set_key(struct tokz_json *js, int32_t id, const char *s, size_t n) {
    js->key[id] = malloc(n + 1);
    if (!js->key[id]) return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
    memcpy(js->key[id], s, n);
    js->key[id][n] = 0;
    js->key_len[id] = (int)n;
    return FM_OK;
}

static fm_status read_vocab(fm_tokenizer *t, json_t *vocab, const char *name) {
    struct tokz_json *js = t->js;
    const char *key;
    size_t klen;
    json_t *val;
    json_object_keylen_foreach(vocab, key, klen, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (js->key[id])
            return fm_set_error(FM_ERR_FORMAT, "%s: model.vocab gives id %d to two tokens (\"%.40s\" is the second)",
                                name, id, key);
        if (klen == 0) return fm_set_error(FM_ERR_FORMAT, "%s: model.vocab has an empty token (id %d)", name, id);
        fm_status st = set_key(js, id, key, klen);
        if (st) return st;
        vocab_insert(js, id);
    }
    return FM_OK;
}

typedef struct { unsigned char c; int len; int32_t id; } added_key;

static int by_first_byte(const void *a, const void *b) {
    const added_key *x = a, *y = b;
    if (x->c != y->c) return x->c < y->c ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return x->id < y->id ? -1 : x->id > y->id;
}

static fm_status sort_added(struct tokz_json *js) {
    added_key *k = malloc(sizeof *k * (size_t)(js->n_added + 1));
    if (!k) return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
    for (int i = 0; i < js->n_added; i++)
        k[i] = (added_key){(unsigned char)js->key[js->added[i]][0], js->key_len[js->added[i]], js->added[i]};
    qsort(k, (size_t)js->n_added, sizeof *k, by_first_byte);
    int j = 0;
    for (int c = 0; c <= 256; c++) {
        while (j < js->n_added && k[j].c < c) j++;
        js->added_start[c] = j;
    }
    for (int i = 0; i < js->n_added; i++) js->added[i] = k[i].id;
    free(k);
    return FM_OK;
}

/* added_tokens: matched in the raw text. lstrip, rstrip and single_word change
 * that matching and are refused, as is a normalized token under a normalizer
 * (it would be matched in the normalized text). */
static fm_status read_added_list(struct tokz_json *js, json_t *added, unsigned char *seen, bool has_normalizer,
                                 const char *name) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        const char *c = json_string_value(json_object_get(a, "content"));
        size_t cl = json_string_length(json_object_get(a, "content"));
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (json_is_true(json_object_get(a, flags[f])))
                return fm_set_error(FM_ERR_FORMAT, "%s: added token \"%.40s\" has %s: true, which fathom does not "
                                    "implement", name, c, flags[f]);
        if (has_normalizer && json_is_true(json_object_get(a, "normalized")))
            return fm_set_error(FM_ERR_FORMAT, "%s: added token \"%.40s\" is \"normalized\" (matched after the "
                                "normalizer), which fathom does not implement", name, c);
        if (js->key[id] && ((size_t)js->key_len[id] != cl || memcmp(js->key[id], c, cl)))
            return fm_set_error(FM_ERR_FORMAT, "%s: added token \"%.40s\" has id %d, which model.vocab gives to "
                                "\"%.40s\"", name, c, id, js->key[id]);
        fm_status st = js->key[id] ? FM_OK : set_key(js, id, c, cl);
        if (st) return st;
        if (!seen[id]) js->added[js->n_added++] = id;
        seen[id] = 1;
    }
    return FM_OK;
}

static fm_status read_added(fm_tokenizer *t, json_t *added, bool has_normalizer, const char *name) {
    struct tokz_json *js = t->js;
    js->added = malloc(sizeof(int32_t) * (json_array_size(added) + 1));
    unsigned char *seen = calloc((size_t)js->n_ids, 1);
    fm_status st = js->added && seen ? read_added_list(js, added, seen, has_normalizer, name)
                                     : fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
    free(seen);
    if (st) return st;
    for (int id = 0; id < js->n_ids; id++)
        if (!js->key[id])
            return fm_set_error(FM_ERR_FORMAT, "%s: no token has id %d (ids must be dense from 0 to %d)", name, id,
                                js->n_ids - 1);
    return sort_added(js);
}

/* model.merges: "a b" strings (tokenizers before 0.20) or [a, b] pairs; a, b and
 * a + b must all be in model.vocab. Rank = position. */
static fm_status read_merges(fm_tokenizer *t, json_t *merges, const char *name) {
    struct tokz_json *js = t->js;
    size_t n = json_array_size(merges), i;
    t->merges = malloc(sizeof *t->merges * (n + 1));
    t->merge_out = malloc(sizeof *t->merge_out * (n + 1));
    char *both = malloc(2 * (size_t)(1 << 16) + 2);
    fm_status st = t->merges && t->merge_out && both ? FM_OK : fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
    json_t *m;
    json_array_foreach(merges, i, m) {
        if (st) break;
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = memchr(a, ' ', json_string_length(m));
            la = sp ? (size_t)(sp - a) : 0;
            b = sp ? sp + 1 : NULL;
            lb = sp ? json_string_length(m) - la - 1 : 0;
            if (b && memchr(b, ' ', lb)) b = NULL;
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)), la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1)), lb = json_string_length(json_array_get(m, 1));
        }
        if (!a || !b || !la || !lb || la > (1 << 16) || lb > (1 << 16)) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: model.merges[%zu] is not two tokens (\"a b\" or [\"a\", \"b\"])",
                              name, i);
            break;
        }
        memcpy(both, a, la);
        memcpy(both + la, b, lb);
        int32_t ia = vocab_find(js, a, la), ib = vocab_find(js, b, lb), r = vocab_find(js, both, la + lb);
        if (ia < 0 || ib < 0 || r < 0) {
            const char *miss = ia < 0 ? a : ib < 0 ? b : both;
            int ml = (int)(ia < 0 ? la : ib < 0 ? lb : la + lb);
            st = fm_set_error(FM_ERR_FORMAT, "%s: model.merges[%zu] merges \"%.*s\" + \"%.*s\", but model.vocab has no "
                              "token \"%.*s\"", name, i, (int)(la < 40 ? la : 40), a, (int)(lb < 40 ? lb : 40), b,
                              ml < 80 ? ml : 80, miss);
            break;
        }
        t->merges[t->n_merges][0] = ia;
        t->merges[t->n_merges][1] = ib;
        t->merge_out[t->n_merges++] = r;
    }
    free(both);
    return st ? st : tokz_build_ranks(t);
}

/* model: BPE with the options Llama's files use. */
static fm_status read_model_opts(struct tokz_json *js, json_t *model, const char *name) {
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE")) return refuse(name, "model type", type);
    json_t *d = json_object_get(model, "dropout");
    if (d && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0))
        return fm_set_error(FM_ERR_FORMAT, "%s: model.dropout is set: BPE dropout is a training-time option, not "
                            "something to encode with", name);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(model, affixes[k]);
        if (a && !json_is_null(a) && !(json_is_string(a) && !json_string_length(a)))
            return refuse(name, affixes[k], json_string_value(a));
    }
    js->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    js->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    json_t *unk = json_object_get(model, "unk_token");
    js->unk = -1;
    if (json_is_string(unk) && (js->unk = vocab_find(js, json_string_value(unk), json_string_length(unk))) < 0)
        return fm_set_error(FM_ERR_FORMAT, "%s: model.unk_token \"%.40s\" is not in model.vocab", name,
                            json_string_value(unk));
    bool fallback = json_is_true(json_object_get(model, "byte_fallback"));
    for (int b = 0; b < 256; b++) {
        char k[8];
        snprintf(k, sizeof k, "<0x%02X>", b);
        js->byte_tok[b] = fallback ? vocab_find(js, k, 6) : -1;
    }
    return FM_OK;
}

static fm_status read_norm_step(struct tokz_json *js, json_t *n, const char *name) {
    const char *type = json_string_value(json_object_get(n, "type"));
    if (js->n_norm == MAX_STEPS) return fm_set_error(FM_ERR_FORMAT, "%s: more than %d normalizers", name, MAX_STEPS);
    norm_step *st = &js->norm[js->n_norm];
    fm_status s;
    if (type && !strcmp(type, "Prepend")) {
        st->kind = STEP_PREPEND;
        s = short_str(n, "prepend", name, "normalizer", st->to, sizeof st->to, &st->to_len);
    } else if (type && !strcmp(type, "Replace")) {
        st->kind = STEP_REPLACE;
        json_t *pat = json_object_get(n, "pattern");
        if (!json_is_string(json_object_get(pat, "String"))) return refuse(name, "normalizer Replace pattern", "Regex");
        s = short_str(pat, "String", name, "normalizer.pattern", st->from, sizeof st->from, &st->from_len);
        if (s == FM_OK) s = short_str(n, "content", name, "normalizer", st->to, sizeof st->to, &st->to_len);
        if (s == FM_OK && !st->from_len)
            return fm_set_error(FM_ERR_FORMAT, "%s: normalizer Replace has an empty pattern", name);
    } else if (type && !strcmp(type, "NFC")) {
        st->kind = STEP_NFC;
        s = FM_OK;
    } else {
        return refuse(name, "normalizer", type);
    }
    js->n_norm += s == FM_OK;
    return s;
}

static fm_status read_normalizer(struct tokz_json *js, json_t *n, const char *name) {
    if (!n || json_is_null(n)) return FM_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type || strcmp(type, "Sequence")) return read_norm_step(js, n, name);
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(n, "normalizers"), i, s) {
        fm_status st = read_norm_step(js, s, name);
        if (st) return st;
    }
    return FM_OK;
}

/* Metaspace's prepend_scheme, or the older add_prefix_space (true: always). */
static fm_status read_scheme(json_t *m, const char *name, const char *where, int *scheme) {
    const char *ps = json_string_value(json_object_get(m, "prepend_scheme"));
    json_t *apx = json_object_get(m, "add_prefix_space");
    if (!ps) *scheme = apx && json_is_false(apx) ? SCHEME_NEVER : SCHEME_ALWAYS;
    else if (!strcmp(ps, "always")) *scheme = SCHEME_ALWAYS;
    else if (!strcmp(ps, "first")) *scheme = SCHEME_FIRST;
    else if (!strcmp(ps, "never")) *scheme = SCHEME_NEVER;
    else return refuse(name, where, ps);
    return FM_OK;
}

/* The split patterns fathom has scanners for (gpt2_bpe.c), as tokenizer.json writes them. */
static const char LLAMA3_PATTERN[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen2's: Llama 3's with single digits */
static const char QWEN2_PATTERN[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Split (Isolated, not inverted) with one of the known patterns, as the first step of a
 * byte-level Sequence (Llama 3: Split, then ByteLevel without its own regex). */
static fm_status read_split(struct tokz_json *js, json_t *p, const char *name) {
    json_t *pat = json_object_get(p, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    const char *beh = json_string_value(json_object_get(p, "behavior"));
    if (!re) return refuse(name, "pre_tokenizer Split pattern (only Regex patterns are)", "String");
    if (!strcmp(re, LLAMA3_PATTERN)) js->split = SPLIT_LLAMA3;
    else if (!strcmp(re, QWEN2_PATTERN)) js->split = SPLIT_QWEN2;
    else if (!strcmp(re, GPT2_PATTERN)) js->split = SPLIT_GPT2;
    else return fm_set_error(FM_ERR_FORMAT, "%s: pre_tokenizer Split pattern \"%.80s\" is not supported (fathom knows "
                             "Llama 3's, Qwen2's and GPT-2's patterns: see docs/HF.md)", name, re);
    if (!beh || strcmp(beh, "Isolated")) return refuse(name, "pre_tokenizer Split behavior", beh);
    if (json_is_true(json_object_get(p, "invert"))) return refuse(name, "pre_tokenizer Split invert", "true");
    return FM_OK;
}

/* ByteLevel: bytes to the byte alphabet; use_regex (default true) splits with GPT-2's
 * pattern first; add_prefix_space puts a space before a piece that lacks one. */
static fm_status read_byte_level(struct tokz_json *js, json_t *p, bool after_split, const char *name) {
    json_t *ur = json_object_get(p, "use_regex");
    bool regex = !ur || json_is_true(ur);
    if (regex && after_split) return refuse(name, "pre_tokenizer ByteLevel use_regex after a Split", "true");
    if (json_is_true(json_object_get(p, "add_prefix_space"))) {
        if (after_split) return refuse(name, "pre_tokenizer ByteLevel add_prefix_space after a Split", "true");
        js->prefix = true;
    }
    if (regex) js->split = SPLIT_GPT2;
    js->byte_level = true;
    uint32_t cp_of[256];
    tokz_byte_alphabet(cp_of);
    for (int b = 0; b < 256; b++) js->alpha_len[b] = (unsigned char)tokz_utf8_put(cp_of[b], js->alpha[b]);
    return FM_OK;
}

static fm_status read_pre_tokenizer(struct tokz_json *js, json_t *p, const char *name) {
    if (!p || json_is_null(p)) return FM_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "ByteLevel")) return read_byte_level(js, p, false, name);
    if (type && !strcmp(type, "Sequence")) {
        json_t *seq = json_object_get(p, "pretokenizers"), *a = json_array_get(seq, 0), *b = json_array_get(seq, 1);
        const char *ta = json_string_value(json_object_get(a, "type")), *tb = json_string_value(json_object_get(b, "type"));
        if (json_array_size(seq) != 2 || !ta || !tb || strcmp(ta, "Split") || strcmp(tb, "ByteLevel"))
            return fm_set_error(FM_ERR_FORMAT, "%s: pre_tokenizer Sequence of %zu (%.20s, %.20s, ...) is not supported "
                                "(fathom reads Split then ByteLevel, Llama 3's form: see docs/HF.md)", name,
                                json_array_size(seq), ta ? ta : "?", tb ? tb : "?");
        fm_status st = read_split(js, a, name);
        return st ? st : read_byte_level(js, b, true, name);
    }
    if (!type || strcmp(type, "Metaspace")) return refuse(name, "pre_tokenizer", type);
    fm_status st = short_str(p, "replacement", name, "pre_tokenizer", js->rep, sizeof js->rep, &js->rep_len);
    if (st == FM_OK && (!js->rep_len || js->rep_len > 4))
        st = fm_set_error(FM_ERR_FORMAT, "%s: pre_tokenizer.replacement must be one character", name);
    if (st == FM_OK) st = read_scheme(p, name, "pre_tokenizer prepend_scheme", &js->meta_scheme);
    json_t *split = json_object_get(p, "split");
    js->meta = true;
    js->meta_split = !split || json_is_true(split); /* files from before "split" existed always split */
    return st;
}

/* TemplateProcessing's "single": special tokens around one "$A" sequence. ByteLevel
 * (alone, or with the template in a Sequence, as Llama 3 has it) only trims offsets,
 * which fathom does not report, so it changes no id. */
static fm_status read_template(struct tokz_json *js, json_t *p, const char *name);
static fm_status read_post(struct tokz_json *js, json_t *p, const char *name) {
    if (!p || json_is_null(p)) return FM_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "ByteLevel")) return FM_OK;
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *q;
        bool templ = false;
        json_array_foreach(json_object_get(p, "processors"), i, q) {
            const char *tq = json_string_value(json_object_get(q, "type"));
            if (tq && !strcmp(tq, "ByteLevel")) continue;
            if (!tq || strcmp(tq, "TemplateProcessing") || templ) return refuse(name, "post_processor in a Sequence", tq);
            templ = true;
            fm_status st = read_template(js, q, name);
            if (st) return st;
        }
        return FM_OK;
    }
    if (!type || strcmp(type, "TemplateProcessing")) return refuse(name, "post_processor", type);
    return read_template(js, p, name);
}

static fm_status read_template(struct tokz_json *js, json_t *p, const char *name) {
    size_t i;
    json_t *item;
    bool seq = false;
    json_array_foreach(json_object_get(p, "single"), i, item) {
        json_t *sp = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) {
            if (seq) return fm_set_error(FM_ERR_FORMAT, "%s: post_processor.single has two sequences", name);
            seq = true;
            continue;
        }
        const char *id = json_string_value(json_object_get(sp, "id"));
        json_t *ids = json_object_get(json_object_get(json_object_get(p, "special_tokens"), id ? id : ""), "ids");
        if (!id || !json_array_size(ids))
            return fm_set_error(FM_ERR_FORMAT, "%s: post_processor.single[%zu] is neither a Sequence nor a SpecialToken "
                                "listed in special_tokens", name, i);
        size_t k;
        json_t *v;
        json_array_foreach(ids, k, v) {
            json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
            if (x < 0 || x >= js->n_ids)
                return fm_set_error(FM_ERR_FORMAT, "%s: post_processor special token \"%.40s\" has an id outside the "
                                    "vocabulary", name, id);
            if ((seq ? js->n_post : js->n_pre) == MAX_TEMPLATE)
                return fm_set_error(FM_ERR_FORMAT, "%s: post_processor adds more than %d tokens", name, MAX_TEMPLATE);
            if (seq) js->post[js->n_post++] = (int32_t)x;
            else js->pre[js->n_pre++] = (int32_t)x;
        }
    }
    if (!seq) return fm_set_error(FM_ERR_FORMAT, "%s: post_processor.single has no Sequence ($A)", name);
    return FM_OK;
}

/* ---------------- decoder: each token's text ---------------- */

enum { DEC_REPLACE, DEC_BYTES, DEC_BYTELEVEL };
typedef struct {
    int kind;
    char from[STR_MAX], to[STR_MAX];
    size_t from_len, to_len;
} dec_step;

static fm_status read_dec_step(struct tokz_json *js, json_t *d, dec_step *steps, int *n, bool *fused,
                               const char *name) {
    const char *type = json_string_value(json_object_get(d, "type"));
    if (*n == MAX_STEPS) return fm_set_error(FM_ERR_FORMAT, "%s: more than %d decoders", name, MAX_STEPS);
    dec_step *s = &steps[*n];
    fm_status st = FM_OK;
    if (type && !strcmp(type, "Replace")) {
        json_t *pat = json_object_get(d, "pattern");
        if (!json_is_string(json_object_get(pat, "String"))) return refuse(name, "decoder Replace pattern", "Regex");
        s->kind = DEC_REPLACE;
        st = short_str(pat, "String", name, "decoder.pattern", s->from, sizeof s->from, &s->from_len);
        if (st == FM_OK) st = short_str(d, "content", name, "decoder", s->to, sizeof s->to, &s->to_len);
        if (st == FM_OK && !s->from_len) st = fm_set_error(FM_ERR_FORMAT, "%s: decoder Replace has an empty pattern", name);
        *n += st == FM_OK;
    } else if (type && !strcmp(type, "ByteFallback")) {
        steps[(*n)++].kind = DEC_BYTES;
    } else if (type && !strcmp(type, "ByteLevel")) {
        steps[(*n)++].kind = DEC_BYTELEVEL;
    } else if (type && !strcmp(type, "Fuse")) {
        *fused = true;
    } else if (type && !strcmp(type, "Strip")) {
        if (!*fused) return fm_set_error(FM_ERR_FORMAT, "%s: decoder Strip before Fuse (per token) is not supported", name);
        st = short_str(d, "content", name, "decoder", js->strip_c, sizeof js->strip_c, &js->strip_c_len);
        json_t *a = json_object_get(d, "start"), *b = json_object_get(d, "stop");
        if (st == FM_OK && (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
                            json_integer_value(b) < 0 || json_integer_value(a) > 64 || json_integer_value(b) > 64 ||
                            !js->strip_c_len))
            st = fm_set_error(FM_ERR_FORMAT, "%s: decoder Strip needs a content character and start/stop in [0, 64]",
                              name);
        if (st == FM_OK) js->strip_lead = (int)json_integer_value(a), js->strip_trail = (int)json_integer_value(b);
    } else if (type && !strcmp(type, "Metaspace")) {
        int scheme;
        s->kind = DEC_REPLACE;
        st = short_str(d, "replacement", name, "decoder", s->from, sizeof s->from, &s->from_len);
        if (st == FM_OK && !s->from_len) st = fm_set_error(FM_ERR_FORMAT, "%s: decoder.replacement is empty", name);
        if (st == FM_OK) st = read_scheme(d, name, "decoder prepend_scheme", &scheme);
        if (st == FM_OK) {
            memcpy(s->to, " ", 2), s->to_len = 1, (*n)++;
            js->meta_first = scheme != SCHEME_NEVER;
        }
    } else {
        return refuse(name, "decoder", type);
    }
    return st;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

/* ByteLevel's decoder on one token: each character of the byte alphabet back to its
 * byte; a token with any other character keeps its UTF-8 as it is (as tokenizers
 * does). In place: a byte is never longer than its character. */
static void byte_level_token(char *s, size_t *len, const int16_t *byte_of) {
    size_t o = 0;
    for (size_t i = 0; i < *len;) {
        uint32_t cp;
        int l = tokz_utf8_next((const unsigned char *)s + i, *len - i, &cp);
        if (!l || cp >= 512 || byte_of[cp] < 0) return;
        i += (size_t)l;
    }
    for (size_t i = 0; i < *len;) {
        uint32_t cp;
        i += (size_t)tokz_utf8_next((const unsigned char *)s + i, *len - i, &cp);
        s[o++] = (char)byte_of[cp];
    }
    *len = o;
}

/* The text of every token: its string through the decoder's per-token steps. */
static fm_status token_texts(fm_tokenizer *t, const dec_step *steps, int n) {
    struct tokz_json *js = t->js;
    fm_status st = FM_OK;
    uint32_t cp_of[256];
    int16_t byte_of[512];
    tokz_byte_alphabet(cp_of);
    for (int i = 0; i < 512; i++) byte_of[i] = -1;
    for (int b = 0; b < 256; b++) byte_of[cp_of[b]] = (int16_t)b;
    for (int id = 0; id < js->n_ids && st == FM_OK; id++) {
        size_t len = (size_t)js->key_len[id];
        char *s = malloc(len + 1), *nx;
        if (s) memcpy(s, js->key[id], len);
        for (int k = 0; k < n && s; k++) {
            if (steps[k].kind == DEC_BYTES) {
                if (len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0)
                    s[0] = (char)(hexval(s[3]) * 16 + hexval(s[4])), len = 1;
                continue;
            }
            if (steps[k].kind == DEC_BYTELEVEL) {
                byte_level_token(s, &len, byte_of);
                continue;
            }
            nx = replace_all(s, len, steps[k].from, steps[k].from_len, steps[k].to, steps[k].to_len, &len);
            free(s);
            s = nx;
        }
        st = s ? tokz_set_tok(t, id, s, (int)len) : fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
        free(s);
    }
    return st;
}

static fm_status read_decoder(fm_tokenizer *t, json_t *d, const char *name) {
    if (!d || json_is_null(d))
        return fm_set_error(FM_ERR_FORMAT, "%s: no decoder: without one fathom cannot say how ids become text", name);
    dec_step steps[MAX_STEPS];
    int n = 0;
    bool fused = false;
    const char *type = json_string_value(json_object_get(d, "type"));
    fm_status st = FM_OK;
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(d, "decoders"), i, s) {
            if ((st = read_dec_step(t->js, s, steps, &n, &fused, name))) break;
        }
    } else {
        st = read_dec_step(t->js, d, steps, &n, &fused, name);
    }
    return st ? st : token_texts(t, steps, n);
}

/* ---------------- entry points ---------------- */

static fm_status read_all(fm_tokenizer **out, json_t *j, const char *name) {
    json_t *model = json_object_get(j, "model"), *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(j, "added_tokens"), *norm = json_object_get(j, "normalizer");
    if (!json_is_object(model)) return fm_set_error(FM_ERR_FORMAT, "%s: no \"model\" object", name);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE")) return refuse(name, "model type", type);
    if (!json_is_object(vocab)) return fm_set_error(FM_ERR_FORMAT, "%s: model.vocab is not an object", name);
    if (!json_is_array(json_object_get(model, "merges")))
        return fm_set_error(FM_ERR_FORMAT, "%s: model.merges is not an array", name);
    if (added && !json_is_array(added)) return fm_set_error(FM_ERR_FORMAT, "%s: added_tokens is not an array", name);
    fm_tokenizer *t = NULL;
    fm_status st = read_ids(&t, vocab, added, name);
    if (st) return st;
    struct tokz_json *js = t->js;
    if ((st = read_vocab(t, vocab, name)) || (st = read_added(t, added, norm && !json_is_null(norm), name)) ||
        (st = read_model_opts(js, model, name)) || (st = read_merges(t, json_object_get(model, "merges"), name)) ||
        (st = read_normalizer(js, norm, name)) || (st = read_pre_tokenizer(js, json_object_get(j, "pre_tokenizer"), name)) ||
        (st = read_post(js, json_object_get(j, "post_processor"), name)) ||
        (st = read_decoder(t, json_object_get(j, "decoder"), name))) {
        fm_tokenizer_free(t);
        return st;
    }
    *out = t;
    return FM_OK;
}

fm_tokenizer *fm_tokenizer_hf_json_from_memory(const char *json, size_t len, const char *name) {
    if (!name) name = "tokenizer.json";
    if (!json) {
        fm_set_error(FM_ERR_INVALID, "%s: NULL argument", name);
        return NULL;
    }
    json_error_t err;
    json_t *j = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!json_is_object(j)) {
        if (j) fm_set_error(FM_ERR_FORMAT, "%s: expected a JSON object", name);
        else fm_set_error(FM_ERR_FORMAT, "%s: line %d, column %d: %s", name, err.line, err.column, err.text);
        json_decref(j);
        return NULL;
    }
    fm_tokenizer *t = NULL;
    read_all(&t, j, name);
    json_decref(j);
    return t;
}

fm_tokenizer *fm_tokenizer_load_hf_json(const char *path) {
    size_t n = 0;
    char *s = tokz_slurp(path, &n);
    fm_tokenizer *t = s ? fm_tokenizer_hf_json_from_memory(s, n, path) : NULL;
    free(s);
    return t;
}
