/* GPT-2's byte-level BPE read from Hugging Face's vocab.json + merges.txt (see
 * fathom/tokenizer.h). The encoder is tokenizer.c's merge loop; this file holds
 * what differs from fathom's own BPE: the files, GPT-2's byte-to-unicode
 * alphabet and its pre-tokenization pattern.
 *
 * The pattern is a regex with Unicode classes (\p{L}, \p{N}, \s). C has no such
 * regex engine in libc, and PCRE2 would be a dependency for one expression, so
 * it is written out as a small scanner below; ICU (already needed for BERT's
 * normalization) answers the character-class questions. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <unicode/uchar.h>

#include "fathom/tokenizer.h"
#include "io/io_internal.h" /* fm_read_text_file */
#include "tokenizer/tokenizer_internal.h"

/* ---------------- pre-tokenization ---------------- */

enum { C_LETTER, C_NUMBER, C_SPACE, C_OTHER };

/* Class and byte length of the character at p; bytes that are not valid UTF-8
 * count as one "other" character each. */
static int char_class(const unsigned char *p, size_t n, size_t *len) {
    uint32_t cp;
    int l = tokz_utf8_next(p, n, &cp);
    if (!l) { *len = 1; return C_OTHER; }
    *len = (size_t)l;
    if (u_isUWhiteSpace((UChar32)cp)) return C_SPACE;
    uint32_t gc = U_GET_GC_MASK((UChar32)cp);
    if (gc & U_GC_L_MASK) return C_LETTER;
    if (gc & U_GC_N_MASK) return C_NUMBER;
    return C_OTHER;
}

/* Bytes of the run of class c starting at p. */
static size_t run_of(const unsigned char *p, size_t n, int c) {
    size_t i = 0, l;
    while (i < n && char_class(p + i, n - i, &l) == c) i += l;
    return i;
}

static size_t contraction(const unsigned char *p, size_t n) {
    static const char *const forms[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++) {
        size_t l = strlen(forms[k]);
        if (n >= l && !memcmp(p, forms[k], l)) return l;
    }
    return 0;
}

/* One match of 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * at p: the alternatives in order, as the regex engine tries them. */
size_t tokz_gpt2_word_len(const unsigned char *p, size_t n) {
    size_t l0, l1, c = contraction(p, n);
    if (c) return c;
    int c0 = char_class(p, n, &l0);
    if (p[0] == ' ' && n > 1) {
        int c1 = char_class(p + 1, n - 1, &l1);
        if (c1 != C_SPACE) return 1 + run_of(p + 1, n - 1, c1);
    }
    if (c0 != C_SPACE) return run_of(p, n, c0);
    /* whitespace: all of it at the end of the text, else all but its last character
     * (which then starts the next word), or the single character when that is all */
    size_t i = 0, last = 0, l;
    while (i < n && char_class(p + i, n - i, &l) == C_SPACE) { last = i; i += l; }
    if (i == n || last == 0) return i == n ? n : i;
    return last;
}

static bool is_crlf(unsigned char c) { return c == '\r' || c == '\n'; }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d): ASCII letters in either case, and U+017F (long s),
 * which Unicode case folding makes an s. */
static size_t contraction_ci(const unsigned char *p, size_t n) {
    static const char *const forms[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (n < 2 || p[0] != '\'') return 0;
    if (n >= 3 && p[1] == 0xC5 && p[2] == 0xBF) return 3;
    for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++) {
        size_t l = strlen(forms[k]), i = 0;
        while (i < l && 1 + i < n && (p[1 + i] | 0x20) == forms[k][i]) i++;
        if (i == l) return 1 + l;
    }
    return 0;
}

/* One match of Llama 3's pattern (tiktoken's cl100k split as Llama 3's tokenizer.json
 * writes it; max_digits 3):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * at p: the alternatives in order, as the regex engine tries them. Every character
 * is in one of the classes, so the matches cover the text. */
size_t tokz_llama3_word_len(const unsigned char *p, size_t n, int max_digits) {
    size_t l0, l1, c = contraction_ci(p, n);
    if (c) return c;
    int c0 = char_class(p, n, &l0);
    if (c0 == C_LETTER) return run_of(p, n, C_LETTER);
    /* one character that is not CR, LF, a letter or a number, then letters */
    if (c0 != C_NUMBER && !is_crlf(p[0]) && l0 < n && char_class(p + l0, n - l0, &l1) == C_LETTER)
        return l0 + run_of(p + l0, n - l0, C_LETTER);
    if (c0 == C_NUMBER) {
        size_t i = 0, l;
        for (int d = 0; d < max_digits && i < n && char_class(p + i, n - i, &l) == C_NUMBER; d++) i += l;
        return i;
    }
    /* an optional space, symbols, then any CRs and LFs */
    size_t sp = p[0] == ' ' && n > 1 && char_class(p + 1, n - 1, &l1) == C_OTHER;
    if (sp || c0 == C_OTHER) {
        size_t i = sp + run_of(p + sp, n - sp, C_OTHER);
        while (i < n && is_crlf(p[i])) i++;
        return i;
    }
    /* whitespace: up to its last CR or LF if it has one; else all of it at the end of
     * the text, all but its last character before other text, or the one character */
    size_t i = 0, last = 0, nl_end = 0, l;
    while (i < n && char_class(p + i, n - i, &l) == C_SPACE) {
        if (is_crlf(p[i])) nl_end = i + 1;
        last = i;
        i += l;
    }
    if (nl_end) return nl_end;
    if (i == n || last == 0) return i;
    return last;
}

/* ---------------- files ---------------- */

/* GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the
 * other 68 take the code points from 256 up, in byte order. */
void tokz_byte_alphabet(uint32_t cp_of[256]) {
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of[b] = printable ? (uint32_t)b : (uint32_t)(256 + extra++);
    }
}

/* A vocab.json key in bytes: each character of the alphabet back to its byte;
 * a key with other characters (an added special token) keeps its UTF-8 bytes. */
static int key_bytes(const char *key, size_t klen, const int16_t *byte_of, char *out) {
    const unsigned char *k = (const unsigned char *)key;
    int o = 0;
    for (size_t i = 0; i < klen;) {
        uint32_t cp;
        int l = tokz_utf8_next(k + i, klen - i, &cp);
        if (!l || cp >= 512 || byte_of[cp] < 0) {
            memcpy(out, key, klen);
            return (int)klen;
        }
        out[o++] = (char)byte_of[cp];
        i += (size_t)l;
    }
    return o;
}

static fm_status read_vocab(fm_tokenizer **out, json_t *vocab, const char *vname) {
    size_t V = json_object_size(vocab);
    if (V < 256 || V > (1u << 22))
        return fm_set_error(FM_ERR_FORMAT, "%s: %zu tokens; a byte-level BPE vocabulary has 256 to 4194304", vname, V);
    fm_tokenizer *t = tokz_tok_alloc(FM_TOK_GPT2, (int)V);
    char *buf = malloc(4096);
    if (!t || !buf) {
        free(buf);
        fm_tokenizer_free(t);
        return t ? fm_set_error(FM_ERR_OOM, "tokenizer: out of memory") : fm_last_status();
    }
    uint32_t cp_of[256];
    int16_t byte_of[512];
    tokz_byte_alphabet(cp_of);
    for (int i = 0; i < 512; i++) byte_of[i] = -1;
    for (int b = 0; b < 256; b++) byte_of[cp_of[b]] = (int16_t)b;
    const char *key;
    size_t klen;
    json_t *val;
    fm_status st = FM_OK;
    json_object_keylen_foreach(vocab, key, klen, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= (json_int_t)V) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: token \"%.40s\" has id %s; ids must be integers in [0, %zu)", vname,
                              key, json_is_integer(val) ? "out of range" : "that is not an integer", V);
            break;
        }
        if (t->tok[id]) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: id %lld is given to two tokens (\"%.40s\" is the second)", vname,
                              (long long)id, key);
            break;
        }
        if (klen > 4096) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: token with id %lld is %zu bytes long (limit 4096)", vname,
                              (long long)id, klen);
            break;
        }
        if ((st = tokz_set_tok(t, (int)id, buf, key_bytes(key, klen, byte_of, buf)))) break;
    }
    for (int b = 0; b < 256 && st == FM_OK; b++) {
        char u[4];
        int ul = tokz_utf8_put(cp_of[b], u);
        json_t *v = json_object_getn(vocab, u, (size_t)ul);
        if (!v) st = fm_set_error(FM_ERR_FORMAT, "%s: no token for byte 0x%02x ('%.*s'): not a byte-level BPE vocabulary",
                                  vname, b, ul, u);
        else t->byte_id[b] = (int32_t)json_integer_value(v);
    }
    free(buf);
    if (st) { fm_tokenizer_free(t); return st; }
    json_t *eot = json_object_get(vocab, "<|endoftext|>");
    if (eot) t->has_special = true, t->special_id = (int32_t)json_integer_value(eot);
    *out = t;
    return FM_OK;
}

/* Looks a merges.txt field up in vocab.json; -1 when absent. */
static int32_t lookup(json_t *vocab, const char *s, size_t n) {
    json_t *v = json_object_getn(vocab, s, n);
    return v ? (int32_t)json_integer_value(v) : -1;
}

static fm_status read_merges(fm_tokenizer *t, json_t *vocab, const char *m, size_t mlen, const char *mname) {
    size_t lines = 1;
    for (size_t i = 0; i < mlen; i++) lines += m[i] == '\n';
    t->merges = malloc(sizeof *t->merges * lines);
    t->merge_out = malloc(sizeof *t->merge_out * lines);
    char *both = malloc(2 * 4096 + 1);
    if (!t->merges || !t->merge_out || !both) { free(both); return fm_set_error(FM_ERR_OOM, "tokenizer: out of memory"); }
    fm_status st = FM_OK;
    size_t line = 0;
    for (size_t i = 0; i < mlen && st == FM_OK; line++) {
        const char *s = m + i, *nl = memchr(s, '\n', mlen - i);
        size_t len = nl ? (size_t)(nl - s) : mlen - i;
        i += len + (nl != NULL);
        if (len && s[len - 1] == '\r') len--;
        if (len == 0 || (line == 0 && len >= 8 && !memcmp(s, "#version", 8))) continue;
        const char *sp = memchr(s, ' ', len);
        size_t la = sp ? (size_t)(sp - s) : 0, lb = sp ? len - la - 1 : 0;
        if (!sp || !la || !lb || memchr(sp + 1, ' ', lb) || la > 4096 || lb > 4096) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: line %zu is not two tokens separated by one space: \"%.*s\"", mname,
                              line + 1, (int)(len < 60 ? len : 60), s); /* s is not NUL-terminated */
            break;
        }
        memcpy(both, s, la);
        memcpy(both + la, sp + 1, lb);
        int32_t a = lookup(vocab, s, la), b = lookup(vocab, sp + 1, lb), r = lookup(vocab, both, la + lb);
        if (a < 0 || b < 0 || r < 0) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: line %zu merges \"%.*s\" + \"%.*s\", but vocab.json has no token \"%.*s\"",
                              mname, line + 1, (int)la, s, (int)lb, sp + 1, a < 0 ? (int)la : b < 0 ? (int)lb : (int)(la + lb),
                              a < 0 ? s : b < 0 ? sp + 1 : both);
            break;
        }
        t->merges[t->n_merges][0] = a;
        t->merges[t->n_merges][1] = b;
        t->merge_out[t->n_merges++] = r;
    }
    free(both);
    return st ? st : tokz_build_ranks(t);
}

fm_tokenizer *fm_tokenizer_gpt2_from_memory(const char *vocab_json, size_t vocab_len, const char *merges,
                                            size_t merges_len, const char *vocab_name, const char *merges_name) {
    const char *vname = vocab_name ? vocab_name : "vocab.json", *mname = merges_name ? merges_name : "merges.txt";
    if (!vocab_json || (!merges && merges_len)) {
        fm_set_error(FM_ERR_INVALID, "gpt2 tokenizer: NULL argument");
        return NULL;
    }
    json_error_t err;
    json_t *vocab = json_loadb(vocab_json, vocab_len, JSON_REJECT_DUPLICATES, &err);
    if (!vocab || !json_is_object(vocab)) {
        if (vocab) fm_set_error(FM_ERR_FORMAT, "%s: expected a JSON object mapping tokens to ids", vname);
        else fm_set_error(FM_ERR_FORMAT, "%s: line %d: %s", vname, err.line, err.text);
        json_decref(vocab);
        return NULL;
    }
    fm_tokenizer *t = NULL;
    if (read_vocab(&t, vocab, vname) == FM_OK && read_merges(t, vocab, merges, merges_len, mname)) {
        fm_tokenizer_free(t);
        t = NULL;
    }
    json_decref(vocab);
    return t;
}

char *tokz_slurp(const char *path, size_t *len) {
    fm_status st;
    const char *why;
    char *s = fm_read_text_file(path, TOKZ_FILE_MAX, len, &st, &why);
    if (s) return s;
    if (st == FM_ERR_IO && errno == EISDIR) fm_set_error(st, "%s: is a directory, not a tokenizer file", path);
    else if (st == FM_ERR_IO) fm_set_error(st, "%s: %s (%s)", path, why, strerror(errno));
    else if (st == FM_ERR_OOM) fm_set_error(st, "%s: out of host memory reading it", path);
    else fm_set_error(st, "%s: %s (a tokenizer file is text of at most %d MiB)", path, why, (int)(TOKZ_FILE_MAX >> 20));
    return NULL;
}

fm_tokenizer *fm_tokenizer_load_gpt2(const char *vocab_json, const char *merges_txt) {
    size_t vl = 0, ml = 0;
    char *v = tokz_slurp(vocab_json, &vl), *m = v ? tokz_slurp(merges_txt, &ml) : NULL;
    fm_tokenizer *t = m ? fm_tokenizer_gpt2_from_memory(v, vl, m, ml, vocab_json, merges_txt) : NULL;
    free(v);
    free(m);
    return t;
}
