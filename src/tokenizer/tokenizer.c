/* Byte, character and byte-level BPE tokenizers (see fathom/tokenizer.h).
 *
 * Every token is stored as the exact bytes it stands for, so decoding is a
 * concatenation and round trips are exact by construction; encoding only has to
 * choose which tokens cover the input. BPE training counts pairs over unique
 * words weighted by frequency (a corpus like the KJV has ~800k words but only
 * ~15k distinct ones), so each merge costs one pass over the distinct words. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/io.h" /* fm_atomic_write */
#include "fathom/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"


/* ---------------- small hash table: u64 key -> slot ---------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static inline uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

int tokz_rank_of(const fm_tokenizer *t, int32_t a, int32_t b) {
    if (!t->rank_cap) return -1;
    uint64_t k = pair_key(a, b);
    size_t mask = t->rank_cap - 1;
    for (size_t i = mix64(k) & mask;; i = (i + 1) & mask) {
        if (t->rank_keys[i] == -1) return -1;
        if ((uint64_t)t->rank_keys[i] == k) return t->rank_vals[i];
    }
}

fm_status tokz_build_ranks(fm_tokenizer *t) {
    size_t cap = 16;
    while (cap < (size_t)t->n_merges * 2 + 2) cap *= 2;
    t->rank_keys = malloc(sizeof(int64_t) * cap);
    t->rank_vals = malloc(sizeof(int32_t) * cap);
    if (!t->rank_keys || !t->rank_vals) return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
    t->rank_cap = cap;
    for (size_t i = 0; i < cap; i++) t->rank_keys[i] = -1;
    for (int r = 0; r < t->n_merges; r++) {
        uint64_t k = pair_key(t->merges[r][0], t->merges[r][1]);
        size_t i = mix64(k) & (cap - 1);
        while (t->rank_keys[i] != -1 && (uint64_t)t->rank_keys[i] != k) i = (i + 1) & (cap - 1);
        if (t->rank_keys[i] == -1) { t->rank_keys[i] = (int64_t)k; t->rank_vals[i] = r; }
    }
    return FM_OK;
}

/* ---------------- construction ---------------- */

fm_tokenizer *tokz_tok_alloc(fm_tokenizer_kind kind, int vocab) {
    fm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); return NULL; }
    t->kind = kind;
    t->vocab = vocab;
    t->tok = calloc((size_t)vocab, sizeof *t->tok);
    t->tok_len = calloc((size_t)vocab, sizeof *t->tok_len);
    if (!t->tok || !t->tok_len) {
        fm_tokenizer_free(t);
        fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
        return NULL;
    }
    return t;
}

fm_status tokz_set_tok(fm_tokenizer *t, int id, const char *b, int n) {
    t->tok[id] = malloc((size_t)n + 1);
    if (!t->tok[id]) return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
    memcpy(t->tok[id], b, (size_t)n);
    t->tok[id][n] = 0;
    t->tok_len[id] = n;
    return FM_OK;
}

void fm_tokenizer_free(fm_tokenizer *t) {
    if (!t) return;
    for (int i = 0; t->tok && i < t->vocab; i++) free(t->tok[i]);
    free(t->tok);
    free(t->tok_len);
    free(t->cps);
    free(t->merges);
    free(t->merge_out);
    free(t->rank_keys);
    free(t->rank_vals);
    tokz_json_free(t->js);
    free(t);
}

fm_tokenizer *fm_tokenizer_byte(void) {
    fm_tokenizer *t = tokz_tok_alloc(FM_TOK_BYTE, 256);
    for (int i = 0; t && i < 256; i++) {
        char c = (char)i;
        if (tokz_set_tok(t, i, &c, 1)) { fm_tokenizer_free(t); return NULL; }
    }
    return t;
}

/* Length (1-4) of the valid UTF-8 sequence at p with its code point, or 0 if
 * the bytes there are not valid UTF-8 (overlong forms and surrogates included). */
int tokz_utf8_next(const unsigned char *p, size_t n, uint32_t *cp) {
    if (!n) return 0;
    unsigned c = p[0];
    if (c < 0x80) { *cp = c; return 1; }
    int len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) { len = 2; v = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; v = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (p[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

int tokz_utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static fm_tokenizer *char_from_cps(uint32_t *cps, int n) {
    fm_tokenizer *t = tokz_tok_alloc(FM_TOK_CHAR, n + 256);
    if (!t) { free(cps); return NULL; }
    t->cps = cps;
    t->n_chars = n;
    char buf[4];
    for (int i = 0; i < n; i++)
        if (tokz_set_tok(t, i, buf, tokz_utf8_put(cps[i], buf))) { fm_tokenizer_free(t); return NULL; }
    for (int i = 0; i < 256; i++) {
        buf[0] = (char)i;
        if (tokz_set_tok(t, n + i, buf, 1)) { fm_tokenizer_free(t); return NULL; }
    }
    return t;
}

fm_tokenizer *fm_tokenizer_char_from_corpus(const char *text, size_t n) {
    if (!text || n == 0) {
        fm_set_error(FM_ERR_INVALID, "char tokenizer: the corpus is empty (it needs at least one character)");
        return NULL;
    }
    /* presence bitmap over all code points: 136 KiB, one pass */
    uint8_t *seen = calloc(0x110000 / 8, 1);
    if (!seen) { fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); return NULL; }
    const unsigned char *p = (const unsigned char *)text;
    int count = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tokz_utf8_next(p + i, n - i, &cp);
        if (!l) { i++; continue; } /* invalid bytes go to the byte fallback */
        if (!(seen[cp >> 3] & (1u << (cp & 7)))) { seen[cp >> 3] |= (uint8_t)(1u << (cp & 7)); count++; }
        i += (size_t)l;
    }
    uint32_t *cps = malloc(sizeof(uint32_t) * (size_t)(count ? count : 1));
    if (!cps) { free(seen); fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); return NULL; }
    int k = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++)
        if (seen[cp >> 3] & (1u << (cp & 7))) cps[k++] = cp;
    free(seen);
    return char_from_cps(cps, k);
}

static fm_tokenizer *bpe_from_merges(int32_t (*merges)[2], int n_merges) {
    fm_tokenizer *t = tokz_tok_alloc(FM_TOK_BPE, 256 + n_merges);
    if (!t) { free(merges); return NULL; }
    t->merges = merges;
    t->n_merges = n_merges;
    for (int i = 0; i < 256; i++) {
        char c = (char)i;
        if (tokz_set_tok(t, i, &c, 1)) goto fail;
    }
    for (int r = 0; r < n_merges; r++) {
        int32_t a = merges[r][0], b = merges[r][1];
        if (a < 0 || b < 0 || a >= 256 + r || b >= 256 + r) {
            fm_set_error(FM_ERR_FORMAT, "bpe tokenizer: merge %d refers to id %d, which is not defined before it", r,
                         a < 0 || a >= 256 + r ? a : b);
            goto fail;
        }
        int la = t->tok_len[a], lb = t->tok_len[b];
        char *s = malloc((size_t)(la + lb) + 1);
        if (!s) { fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); goto fail; }
        memcpy(s, t->tok[a], (size_t)la);
        memcpy(s + la, t->tok[b], (size_t)lb);
        s[la + lb] = 0;
        t->tok[256 + r] = s;
        t->tok_len[256 + r] = la + lb;
    }
    if (tokz_build_ranks(t)) goto fail;
    return t;
fail:
    fm_tokenizer_free(t);
    return NULL;
}

/* ---------------- word splitting (shared by BPE training and encoding) ---------------- */

static int cls(unsigned char c) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
    if (c >= 0x80) return 1; /* non-ASCII: letters of other scripts (and their continuation bytes) */
    if (c >= '0' && c <= '9') return 2;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') return 3;
    return 4;
}

/* Length of the word starting at p: an optional space, then a run of one class. */
static size_t word_len(const unsigned char *p, size_t n) {
    size_t i = 0;
    if (p[0] == ' ' && n > 1 && cls(p[1]) != 3) i = 1;
    int c = cls(p[i]);
    i++;
    while (i < n && cls(p[i]) == c) {
        if (c == 3 && p[i] == ' ' && i + 1 < n && cls(p[i + 1]) != 3) break; /* leave the space to the next word */
        i++;
    }
    return i;
}

/* ---------------- BPE training ---------------- */

typedef struct { int32_t *sym; int len; int64_t count; } bpe_word;

typedef struct {
    uint64_t *keys; /* UINT64_MAX = empty */
    int64_t *vals;
    size_t cap, n;
} u64map;

static int map_init(u64map *m, size_t cap) {
    m->cap = cap;
    m->n = 0;
    m->keys = malloc(sizeof(uint64_t) * cap);
    m->vals = malloc(sizeof(int64_t) * cap);
    if (!m->keys || !m->vals) return -1;
    memset(m->keys, 0xff, sizeof(uint64_t) * cap);
    return 0;
}
static void map_free(u64map *m) { free(m->keys); free(m->vals); }
static int map_add(u64map *m, uint64_t k, int64_t v) {
    if ((m->n + 1) * 2 > m->cap) {
        u64map g;
        if (map_init(&g, m->cap * 2)) { map_free(&g); return -1; }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i] != UINT64_MAX) map_add(&g, m->keys[i], m->vals[i]);
        map_free(m);
        *m = g;
    }
    size_t mask = m->cap - 1;
    for (size_t i = mix64(k) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == k) { m->vals[i] += v; return 0; }
        if (m->keys[i] == UINT64_MAX) { m->keys[i] = k; m->vals[i] = v; m->n++; return 0; }
    }
}

/* Unique words by FNV hash of their bytes, then exact comparison. */
typedef struct { const unsigned char *p; size_t len; int64_t count; uint64_t h; } wslot;

static fm_status collect_words(const unsigned char *p, size_t n, bpe_word **out, int *n_out) {
    size_t cap = 1 << 16, used = 0;
    wslot *tab = calloc(cap, sizeof *tab);
    if (!tab) return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
    for (size_t i = 0; i < n;) {
        size_t l = word_len(p + i, n - i);
        uint64_t h = 1469598103934665603ULL;
        for (size_t j = 0; j < l; j++) h = (h ^ p[i + j]) * 1099511628211ULL;
        if ((used + 1) * 2 > cap) {
            wslot *g = calloc(cap * 2, sizeof *g);
            if (!g) { free(tab); return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); }
            for (size_t k = 0; k < cap; k++)
                if (tab[k].p) {
                    size_t s = tab[k].h & (cap * 2 - 1);
                    while (g[s].p) s = (s + 1) & (cap * 2 - 1);
                    g[s] = tab[k];
                }
            free(tab);
            tab = g;
            cap *= 2;
        }
        size_t s = h & (cap - 1);
        while (tab[s].p && !(tab[s].h == h && tab[s].len == l && !memcmp(tab[s].p, p + i, l))) s = (s + 1) & (cap - 1);
        if (!tab[s].p) { tab[s].p = p + i; tab[s].len = l; tab[s].h = h; used++; }
        tab[s].count++;
        i += l;
    }
    bpe_word *w = calloc(used ? used : 1, sizeof *w);
    int k = 0;
    if (!w) { free(tab); return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); }
    for (size_t s = 0; s < cap; s++) {
        if (!tab[s].p) continue;
        w[k].sym = malloc(sizeof(int32_t) * tab[s].len);
        if (!w[k].sym) {
            for (int j = 0; j < k; j++) free(w[j].sym);
            free(w);
            free(tab);
            return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
        }
        for (size_t j = 0; j < tab[s].len; j++) w[k].sym[j] = tab[s].p[j];
        w[k].len = (int)tab[s].len;
        w[k].count = tab[s].count;
        k++;
    }
    free(tab);
    *out = w;
    *n_out = k;
    return FM_OK;
}

fm_tokenizer *fm_tokenizer_train_bpe(const char *text, size_t n, int vocab_size) {
    if (vocab_size < 256 || vocab_size > (1 << 20)) {
        fm_set_error(FM_ERR_INVALID, "bpe tokenizer: vocab size %d must be in [256, %d]", vocab_size, 1 << 20);
        return NULL;
    }
    if (!text || n == 0) {
        fm_set_error(FM_ERR_INVALID, "bpe tokenizer: the training corpus is empty");
        return NULL;
    }
    bpe_word *w = NULL;
    int nw = 0;
    if (collect_words((const unsigned char *)text, n, &w, &nw)) return NULL;
    int want = vocab_size - 256, got = 0;
    int32_t(*merges)[2] = malloc(sizeof *merges * (size_t)(want ? want : 1));
    u64map pc;
    memset(&pc, 0, sizeof pc);
    if (!merges) { fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); goto fail; }
    while (got < want) {
        map_free(&pc);
        if (map_init(&pc, 1 << 14)) { fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); goto fail; }
        for (int i = 0; i < nw; i++)
            for (int j = 0; j + 1 < w[i].len; j++)
                if (map_add(&pc, pair_key(w[i].sym[j], w[i].sym[j + 1]), w[i].count)) {
                    fm_set_error(FM_ERR_OOM, "tokenizer: out of memory");
                    goto fail;
                }
        uint64_t best = UINT64_MAX;
        int64_t best_c = 0;
        for (size_t s = 0; s < pc.cap; s++) {
            if (pc.keys[s] == UINT64_MAX) continue;
            if (pc.vals[s] > best_c || (pc.vals[s] == best_c && pc.keys[s] < best)) { best = pc.keys[s]; best_c = pc.vals[s]; }
        }
        if (best_c < 2) break; /* nothing repeats: further merges would only memorize */
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xffffffffu), id = 256 + got;
        merges[got][0] = a;
        merges[got][1] = b;
        got++;
        for (int i = 0; i < nw; i++) {
            int o = 0;
            for (int j = 0; j < w[i].len; j++) {
                if (j + 1 < w[i].len && w[i].sym[j] == a && w[i].sym[j + 1] == b) { w[i].sym[o++] = id; j++; }
                else w[i].sym[o++] = w[i].sym[j];
            }
            w[i].len = o;
        }
    }
    map_free(&pc);
    for (int i = 0; i < nw; i++) free(w[i].sym);
    free(w);
    if (got == 0 && want > 0) {
        free(merges);
        fm_set_error(FM_ERR_INVALID, "bpe tokenizer: the corpus (%zu bytes) is too short: no pair of bytes repeats", n);
        return NULL;
    }
    return bpe_from_merges(merges, got);
fail:
    map_free(&pc);
    for (int i = 0; i < nw; i++) free(w[i].sym);
    free(w);
    free(merges);
    return NULL;
}

/* ---------------- encode / decode ---------------- */

typedef struct { int32_t *v; int64_t n, cap; } ivec;
static int push(ivec *v, int32_t x) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 1024;
        int32_t *p = realloc(v->v, sizeof(int32_t) * (size_t)cap);
        if (!p) return -1;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

static int char_id(const fm_tokenizer *t, uint32_t cp) {
    int lo = 0, hi = t->n_chars - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (t->cps[mid] == cp) return mid;
        if (t->cps[mid] < cp) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static int bpe_word_encode(const fm_tokenizer *t, const unsigned char *p, size_t l, ivec *out, int32_t *tmp) {
    int n = (int)l;
    for (int i = 0; i < n; i++) tmp[i] = t->merge_out ? t->byte_id[p[i]] : p[i];
    for (;;) { /* merge the lowest-ranked pair present, everywhere, until none applies */
        int best = -1;
        for (int i = 0; i + 1 < n; i++) {
            int r = tokz_rank_of(t, tmp[i], tmp[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) break;
        int32_t a = t->merges[best][0], b = t->merges[best][1];
        int o = 0;
        for (int i = 0; i < n; i++) {
            if (i + 1 < n && tmp[i] == a && tmp[i + 1] == b) { tmp[o++] = t->merge_out ? t->merge_out[best] : 256 + best; i++; }
            else tmp[o++] = tmp[i];
        }
        n = o;
    }
    for (int i = 0; i < n; i++)
        if (push(out, tmp[i])) return -1;
    return 0;
}

fm_status fm_tokenizer_encode(const fm_tokenizer *t, const char *text, size_t n, int32_t **ids, int64_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && n)) return fm_set_error(FM_ERR_INVALID, "tokenizer encode: NULL argument");
    if (t->js) return tokz_json_encode(t, text, n, ids, n_ids);
    const unsigned char *p = (const unsigned char *)text;
    ivec v = {NULL, 0, 0};
    int32_t *tmp = NULL;
    size_t tmp_cap = 0;
    int bad = 0;
    /* GPT-2's special token: the text is cut at each occurrence, which becomes its id */
    const char *sp = t->kind == FM_TOK_GPT2 && t->has_special ? t->tok[t->special_id] : NULL;
    size_t sl = sp ? (size_t)t->tok_len[t->special_id] : 0, next_sp = 0;
    bool sp_known = false;
    for (size_t i = 0; i < n && !bad;) {
        size_t lim = n - i;
        if (sl) {
            if (!sp_known || next_sp < i) {
                const unsigned char *f = memmem(p + i, n - i, sp, sl);
                next_sp = f ? (size_t)(f - p) : n, sp_known = true;
            }
            if (next_sp == i) {
                bad = push(&v, t->special_id);
                i += sl, sp_known = false;
                continue;
            }
            lim = next_sp - i;
        }
        if (t->kind == FM_TOK_BYTE) {
            bad = push(&v, p[i++]);
        } else if (t->kind == FM_TOK_CHAR) {
            uint32_t cp;
            int l = tokz_utf8_next(p + i, n - i, &cp);
            int id = l ? char_id(t, cp) : -1;
            if (id >= 0) { bad = push(&v, id); i += (size_t)l; }
            else {
                for (int k = 0; k < (l ? l : 1) && !bad; k++) bad = push(&v, t->n_chars + p[i + (size_t)k]);
                i += (size_t)(l ? l : 1);
            }
        } else {
            size_t l = t->kind == FM_TOK_GPT2 ? tokz_gpt2_word_len(p + i, lim) : word_len(p + i, n - i);
            if (l > tmp_cap) {
                free(tmp);
                tmp_cap = l * 2;
                tmp = malloc(sizeof(int32_t) * tmp_cap);
                if (!tmp) { bad = 1; break; }
            }
            bad = bpe_word_encode(t, p + i, l, &v, tmp);
            i += l;
        }
    }
    free(tmp);
    if (bad) {
        free(v.v);
        return fm_set_error(FM_ERR_OOM, "tokenizer encode: out of memory");
    }
    *ids = v.v ? v.v : malloc(sizeof(int32_t));
    *n_ids = v.n;
    return *ids ? FM_OK : fm_set_error(FM_ERR_OOM, "tokenizer encode: out of memory");
}

fm_status fm_tokenizer_token_bytes(const fm_tokenizer *t, int32_t id, const char **bytes, size_t *len) {
    if (id < 0 || id >= t->vocab)
        return fm_set_error(FM_ERR_INVALID, "tokenizer: unknown token id %d (vocab size %d)", id, t->vocab);
    *bytes = t->tok[id];
    *len = (size_t)t->tok_len[id];
    return FM_OK;
}

fm_status fm_tokenizer_decode(const fm_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab)
            return fm_set_error(FM_ERR_INVALID, "tokenizer decode: unknown token id %d at position %lld (vocab size %d)",
                                ids[i], (long long)i, t->vocab);
        total += (size_t)t->tok_len[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return fm_set_error(FM_ERR_OOM, "tokenizer decode: out of memory");
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(s + o, t->tok[ids[i]], (size_t)t->tok_len[ids[i]]);
        o += (size_t)t->tok_len[ids[i]];
    }
    s[o] = 0;
    if (t->js) tokz_json_decode_fix(t, ids, n, s, &o);
    *text = s;
    *len = o;
    return FM_OK;
}

/* ---------------- metadata, save, load ---------------- */

fm_tokenizer_kind fm_tokenizer_get_kind(const fm_tokenizer *t) { return t->kind; }
int fm_tokenizer_vocab_size(const fm_tokenizer *t) { return t ? t->vocab : 0; }
static const char *kind_names[] = {"byte", "char", "bpe", "gpt2", "llama"};
const char *fm_tokenizer_kind_name(fm_tokenizer_kind k) { return (unsigned)k < 5 ? kind_names[k] : "?"; }
fm_status fm_tokenizer_kind_parse(const char *s, fm_tokenizer_kind *out) {
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, kind_names[i])) { *out = (fm_tokenizer_kind)i; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown tokenizer kind '%s' (expected byte, char or bpe)", s ? s : "(null)");
}

fm_status fm_tokenizer_save(const fm_tokenizer *t, const char *path) {
    if (t->kind == FM_TOK_GPT2 || t->kind == FM_TOK_LLAMA)
        return fm_set_error(FM_ERR_INVALID, "%s: a %s tokenizer is kept as %s, not saved in fathom's tokenizer format",
                            path, kind_names[t->kind], t->kind == FM_TOK_GPT2 ? "vocab.json + merges.txt" : "tokenizer.json");
    int items = t->kind == FM_TOK_CHAR ? t->n_chars : t->kind == FM_TOK_BPE ? t->n_merges : 0;
    size_t cap = 128 + (size_t)items * 24, o = 0;
    char *s = malloc(cap);
    if (!s) return fm_set_error(FM_ERR_OOM, "tokenizer save: out of memory");
    o += (size_t)snprintf(s + o, cap - o, "fathom-tokenizer 1\nkind %s\nvocab %d\n", kind_names[t->kind], t->vocab);
    if (t->kind == FM_TOK_CHAR) {
        o += (size_t)snprintf(s + o, cap - o, "chars %d\n", t->n_chars);
        for (int i = 0; i < t->n_chars; i++) o += (size_t)snprintf(s + o, cap - o, "%u\n", t->cps[i]);
    } else if (t->kind == FM_TOK_BPE) {
        o += (size_t)snprintf(s + o, cap - o, "merges %d\n", t->n_merges);
        for (int i = 0; i < t->n_merges; i++)
            o += (size_t)snprintf(s + o, cap - o, "%d %d\n", t->merges[i][0], t->merges[i][1]);
    }
    fm_io_chunk ch = {s, o};
    fm_status st = fm_atomic_write(path, 1, &ch);
    free(s);
    return st;
}

fm_tokenizer *fm_tokenizer_load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) { fm_set_error(FM_ERR_IO, "%s: cannot open tokenizer file", path); return NULL; }
    int ver = 0, vocab = 0, cnt = 0;
    char kind[16] = "", what[16] = "";
    fm_tokenizer *t = NULL;
    fm_tokenizer_kind k;
    if (fscanf(f, "fathom-tokenizer %d kind %15s vocab %d", &ver, kind, &vocab) != 3 || ver != 1 ||
        fm_tokenizer_kind_parse(kind, &k)) {
        fm_set_error(FM_ERR_FORMAT, "%s: not a fathom tokenizer file (version 1) or unknown kind", path);
        goto done;
    }
    if (k == FM_TOK_BYTE) {
        if (vocab != 256) { fm_set_error(FM_ERR_FORMAT, "%s: a byte tokenizer has vocab 256, file says %d", path, vocab); goto done; }
        t = fm_tokenizer_byte();
        goto done;
    }
    if (fscanf(f, " %15s %d", what, &cnt) != 2 || cnt < 0 || cnt > (1 << 21) ||
        strcmp(what, k == FM_TOK_CHAR ? "chars" : "merges") || vocab != cnt + 256) {
        fm_set_error(FM_ERR_FORMAT, "%s: bad tokenizer header (vocab %d, %s %d)", path, vocab, what, cnt);
        goto done;
    }
    if (k == FM_TOK_CHAR) {
        uint32_t *cps = malloc(sizeof(uint32_t) * (size_t)(cnt ? cnt : 1));
        if (!cps) { fm_set_error(FM_ERR_OOM, "tokenizer load: out of memory"); goto done; }
        for (int i = 0; i < cnt; i++)
            if (fscanf(f, "%u", &cps[i]) != 1 || cps[i] > 0x10FFFF || (i && cps[i] <= cps[i - 1])) {
                free(cps);
                fm_set_error(FM_ERR_FORMAT, "%s: character %d is missing, out of range or out of order", path, i);
                goto done;
            }
        t = char_from_cps(cps, cnt);
    } else {
        int32_t(*m)[2] = malloc(sizeof *m * (size_t)(cnt ? cnt : 1));
        if (!m) { fm_set_error(FM_ERR_OOM, "tokenizer load: out of memory"); goto done; }
        for (int i = 0; i < cnt; i++)
            if (fscanf(f, "%d %d", &m[i][0], &m[i][1]) != 2) {
                free(m);
                fm_set_error(FM_ERR_FORMAT, "%s: merge %d is missing or malformed", path, i);
                goto done;
            }
        t = bpe_from_merges(m, cnt);
        if (!t) fm_error_prefix("%s: ", path);
    }
done:
    fclose(f);
    return t;
}
