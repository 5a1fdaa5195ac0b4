/* BERT's WordPiece tokenizer from vocab.txt (see fathom/tokenizer.h), following
 * Hugging Face's BertNormalizer + BertPreTokenizer + WordPiece, the tokenizer
 * sentence-transformers runs. Unicode properties, NFD and case come from ICU.
 *
 * Text is carried as arrays of code points between the steps: the steps are
 * defined per character, and each may grow or shrink the text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "fathom/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

#define MAX_WORD_CHARS 100 /* longer words become [UNK], as in BERT */

struct fm_wordpiece {
    fm_wordpiece_opts o;
    int vocab;
    char **tok;
    size_t *tok_len;
    int32_t *slot; /* open addressing: token id or -1 */
    size_t cap;
    int32_t unk, cls, sep, pad;
};

typedef struct { UChar32 *v; size_t n, cap; } cpvec;

static int cp_push(cpvec *a, UChar32 c) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        UChar32 *p = realloc(a->v, sizeof *p * cap);
        if (!p) return -1;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = c;
    return 0;
}

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int32_t find(const fm_wordpiece *w, const char *s, size_t n) {
    for (size_t i = fnv(s, n) & (w->cap - 1);; i = (i + 1) & (w->cap - 1)) {
        int32_t id = w->slot[i];
        if (id < 0) return -1;
        if (w->tok_len[id] == n && !memcmp(w->tok[id], s, n)) return id;
    }
}

fm_wordpiece_opts fm_wordpiece_defaults(void) { return (fm_wordpiece_opts){1, -1, 1}; }

void fm_wordpiece_free(fm_wordpiece *w) {
    if (!w) return;
    for (int i = 0; w->tok && i < w->vocab; i++) free(w->tok[i]);
    free(w->tok);
    free(w->tok_len);
    free(w->slot);
    free(w);
}

int fm_wordpiece_vocab_size(const fm_wordpiece *w) { return w ? w->vocab : 0; }
const char *fm_wordpiece_token(const fm_wordpiece *w, int32_t id) {
    return w && id >= 0 && id < w->vocab ? w->tok[id] : NULL;
}

static fm_status add_token(fm_wordpiece *w, int id, const char *s, size_t n, const char *name) {
    if (n > 1024) return fm_set_error(FM_ERR_FORMAT, "%s: line %d is %zu bytes long (limit 1024)", name, id + 1, n);
    if (n && find(w, s, n) >= 0)
        return fm_set_error(FM_ERR_FORMAT, "%s: line %d repeats the token \"%.*s\" (line %d)", name, id + 1, (int)n, s,
                            find(w, s, n) + 1);
    if (!(w->tok[id] = malloc(n + 1))) return fm_set_error(FM_ERR_OOM, "wordpiece: out of memory");
    memcpy(w->tok[id], s, n);
    w->tok[id][n] = 0;
    w->tok_len[id] = n;
    size_t i = fnv(s, n) & (w->cap - 1);
    while (w->slot[i] >= 0) i = (i + 1) & (w->cap - 1);
    w->slot[i] = id;
    return FM_OK;
}

static fm_status special(fm_wordpiece *w, const char *tok, int32_t *id, const char *name) {
    *id = find(w, tok, strlen(tok));
    if (*id < 0) return fm_set_error(FM_ERR_FORMAT, "%s: the vocabulary has no %s token (not a BERT vocab.txt?)", name, tok);
    return FM_OK;
}

fm_wordpiece *fm_wordpiece_from_memory(const char *vocab, size_t len, const fm_wordpiece_opts *o, const char *name) {
    name = name ? name : "vocab.txt";
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += vocab[i] == '\n';
    if (len && vocab[len - 1] != '\n') lines++;
    if (lines < 4 || lines > (1u << 22)) {
        fm_set_error(FM_ERR_FORMAT, "%s: %zu tokens; a WordPiece vocabulary has 4 to 4194304", name, lines);
        return NULL;
    }
    fm_wordpiece *w = calloc(1, sizeof *w);
    size_t cap = 16;
    while (cap < 2 * lines) cap *= 2;
    if (w) {
        w->o = o ? *o : fm_wordpiece_defaults();
        w->tok = calloc(lines, sizeof *w->tok);
        w->tok_len = calloc(lines, sizeof *w->tok_len);
        w->slot = malloc(sizeof *w->slot * cap);
        w->cap = cap;
    }
    if (!w || !w->tok || !w->tok_len || !w->slot) {
        fm_set_error(FM_ERR_OOM, "wordpiece: out of memory");
        fm_wordpiece_free(w);
        return NULL;
    }
    for (size_t i = 0; i < cap; i++) w->slot[i] = -1;
    fm_status st = FM_OK;
    for (size_t i = 0; i < len && st == FM_OK; w->vocab++) {
        const char *s = vocab + i, *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + (nl != NULL);
        if (n && s[n - 1] == '\r') n--;
        st = add_token(w, w->vocab, s, n, name);
    }
    if (st || special(w, "[UNK]", &w->unk, name) || special(w, "[CLS]", &w->cls, name) ||
        special(w, "[SEP]", &w->sep, name) || special(w, "[PAD]", &w->pad, name)) {
        fm_wordpiece_free(w);
        return NULL;
    }
    return w;
}

fm_wordpiece *fm_wordpiece_load(const char *vocab_txt, const fm_wordpiece_opts *o) {
    size_t n = 0;
    char *s = tokz_slurp(vocab_txt, &n); /* bounded; a directory, a NUL byte refused by name */
    fm_wordpiece *w = s ? fm_wordpiece_from_memory(s, n, o, vocab_txt) : NULL;
    free(s);
    return w;
}

/* ---------------- normalization ---------------- */

static bool is_cjk(UChar32 c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool is_space(UChar32 c) { return c == '\t' || c == '\n' || c == '\r' || u_isUWhiteSpace(c); }

static bool is_punct(UChar32 c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) ||
           (U_GET_GC_MASK(c) & U_GC_P_MASK);
}

/* Decoding, cleaning (NUL, U+FFFD and other-category characters dropped but tab,
 * newline and return; whitespace to ' ') and spaces around CJK ideographs. */
static int clean(const fm_wordpiece *w, const unsigned char *p, size_t n, cpvec *out) {
    for (size_t i = 0; i < n;) {
        uint32_t u;
        int l = tokz_utf8_next(p + i, n - i, &u);
        i += l ? (size_t)l : 1;
        if (!l) continue; /* invalid UTF-8: as U+FFFD, which BERT drops */
        UChar32 c = (UChar32)u;
        bool ctl = c != '\t' && c != '\n' && c != '\r' && (U_GET_GC_MASK(c) & U_GC_C_MASK);
        if (c == 0 || c == 0xFFFD || ctl) continue;
        if (is_space(c)) c = ' ';
        bool cjk = w->o.chinese_chars && is_cjk(c);
        if ((cjk && cp_push(out, ' ')) || cp_push(out, c) || (cjk && cp_push(out, ' '))) return -1;
    }
    return 0;
}

/* NFD, then nonspacing marks dropped. */
static int strip_accents(cpvec *a) {
    UErrorCode e = U_ZERO_ERROR;
    const UNormalizer2 *nfd = unorm2_getNFDInstance(&e);
    if (U_FAILURE(e)) return -1;
    cpvec out = {NULL, 0, 0};
    UChar buf[64];
    for (size_t i = 0; i < a->n; i++) {
        UChar src[2];
        int32_t sl = 0, dl;
        U16_APPEND_UNSAFE(src, sl, a->v[i]);
        e = U_ZERO_ERROR;
        dl = unorm2_normalize(nfd, src, sl, buf, 64, &e);
        if (U_FAILURE(e)) { free(out.v); return -1; }
        for (int32_t k = 0; k < dl;) {
            UChar32 c;
            U16_NEXT(buf, k, dl, c);
            if (!(U_GET_GC_MASK(c) & U_GC_MN_MASK) && cp_push(&out, c)) { free(out.v); return -1; }
        }
    }
    free(a->v);
    *a = out;
    return 0;
}

/* Per-character full lower case without context: the simple mapping, except
 * U+0130 whose lower case is two characters. */
static int lowercase(cpvec *a) {
    cpvec out = {NULL, 0, 0};
    for (size_t i = 0; i < a->n; i++) {
        UChar32 c = a->v[i];
        int bad = c == 0x130 ? cp_push(&out, 'i') || cp_push(&out, 0x307) : cp_push(&out, u_tolower(c));
        if (bad) { free(out.v); return -1; }
    }
    free(a->v);
    *a = out;
    return 0;
}

/* ---------------- WordPiece ---------------- */

typedef struct { int32_t *v; int64_t n, cap; } idvec;
static int id_push(idvec *a, int32_t x) {
    if (a->n == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 64;
        int32_t *p = realloc(a->v, sizeof *p * (size_t)cap);
        if (!p) return -1;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Greedy longest match over the word's characters; any gap makes the whole word
 * [UNK]. buf holds the word's UTF-8 (4 * MAX_WORD_CHARS) then room for "##" + a piece. */
static int encode_word(const fm_wordpiece *w, const UChar32 *c, size_t nc, idvec *out, char *buf) {
    if (nc > MAX_WORD_CHARS) return id_push(out, w->unk);
    size_t off[MAX_WORD_CHARS + 1], o = 0; /* byte offset of each character in buf */
    for (size_t i = 0; i < nc; i++) { off[i] = o; o += (size_t)tokz_utf8_put((uint32_t)c[i], buf + o); }
    off[nc] = o;
    char *piece = buf + 4 * MAX_WORD_CHARS;
    int64_t mark = out->n;
    for (size_t start = 0; start < nc;) {
        size_t end = nc;
        int32_t id = -1;
        for (; end > start && id < 0; end--) {
            size_t len = off[end] - off[start];
            if (start) {
                piece[0] = piece[1] = '#';
                memcpy(piece + 2, buf + off[start], len);
                id = find(w, piece, len + 2);
            } else {
                id = find(w, buf, len);
            }
        }
        if (id < 0) { out->n = mark; return id_push(out, w->unk); }
        if (id_push(out, id)) return -1;
        start = end + 1;
    }
    return 0;
}

/* Whitespace splitting, punctuation isolated, each word through WordPiece. */
static int split_encode(const fm_wordpiece *w, const cpvec *a, idvec *out) {
    char *buf = malloc(8 * MAX_WORD_CHARS + 8);
    if (!buf) return -1;
    int bad = 0;
    for (size_t i = 0; i < a->n && !bad;) {
        if (is_space(a->v[i])) { i++; continue; }
        size_t j = i + 1;
        if (!is_punct(a->v[i]))
            while (j < a->n && !is_space(a->v[j]) && !is_punct(a->v[j])) j++;
        bad = encode_word(w, a->v + i, j - i, out, buf);
        i = j;
    }
    free(buf);
    return bad;
}

fm_status fm_wordpiece_encode(const fm_wordpiece *w, const char *text, size_t n, int max_length, int32_t **ids,
                              int64_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!w || (!text && n)) return fm_set_error(FM_ERR_INVALID, "wordpiece encode: NULL argument");
    if (max_length < 2) return fm_set_error(FM_ERR_INVALID, "wordpiece encode: max_length %d must be >= 2", max_length);
    cpvec a = {NULL, 0, 0};
    idvec out = {NULL, 0, 0};
    bool strip = w->o.strip_accents < 0 ? w->o.lowercase != 0 : w->o.strip_accents != 0;
    int bad = id_push(&out, w->cls) || clean(w, (const unsigned char *)text, n, &a) || (strip && strip_accents(&a)) ||
              (w->o.lowercase && lowercase(&a)) || split_encode(w, &a, &out);
    free(a.v);
    if (!bad && out.n > max_length - 1) out.n = max_length - 1;
    if (bad || id_push(&out, w->sep)) {
        free(out.v);
        return fm_set_error(FM_ERR_OOM, "wordpiece encode: out of memory");
    }
    *ids = out.v;
    *n_ids = out.n;
    return FM_OK;
}
