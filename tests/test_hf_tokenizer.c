/* The Hugging Face tokenizers (GPT-2 byte-level BPE, BERT WordPiece, Llama
 * tokenizer.json) against the reference libraries: a byte-level BPE that
 * `tokenizers` trains and saves, the real all-MiniLM-L6-v2 vocab.txt (or a trained
 * one), Llama-style tokenizer.json files in three pipeline forms, and byte-level
 * tokenizer.json files (Llama 3's form, GPT-2's, ByteLevel with add_prefix_space,
 * Qwen2's NFC + single-digit split form), on a text suite with Unicode and whitespace
 * edge cases (tests/hf/fixtures.py): the ids
 * (and tokenizer.json decodes) must be equal. Then the bad files: each refused with a
 * message naming the problem; and a Llama directory whose only tokenizer is
 * tokenizer.json. */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "fathom/hf.h"
#include "fathom/tokenizer.h"
#include "hf_util.h"
#include "test_util.h"

static bool same_ids(const int32_t *a, int64_t na, json_t *b) {
    if ((size_t)na != json_array_size(b)) return false;
    for (int64_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(b, (size_t)i))) return false;
    return true;
}

static void show(const char *what, size_t i, const char *text, const int32_t *ids, int64_t n, json_t *ref) {
    fprintf(stderr, "%s text %zu \"%s\":\n  fathom:", what, i, text);
    for (int64_t k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
    fprintf(stderr, "\n  reference:");
    for (size_t k = 0; k < json_array_size(ref); k++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(ref, k)));
    fputc('\n', stderr);
}

static void check_gpt2(const char *dir, json_t *exp) {
    char v[1100], m[1100];
    snprintf(v, sizeof v, "%s/gpt2/vocab.json", dir);
    snprintf(m, sizeof m, "%s/gpt2/merges.txt", dir);
    fm_tokenizer *t = fm_tokenizer_load_gpt2(v, m);
    CHECK_MSG(t != NULL, "%s", fm_last_error());
    if (!t) return;
    CHECK(fm_tokenizer_get_kind(t) == FM_TOK_GPT2);
    json_t *texts = json_object_get(exp, "texts"), *ids = json_object_get(exp, "gpt2");
    int equal = 0;
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const char *s = json_string_value(json_array_get(texts, i));
        size_t n = json_string_length(json_array_get(texts, i));
        int32_t *got = NULL;
        int64_t ng = 0;
        CHECK(fm_tokenizer_encode(t, s, n, &got, &ng) == FM_OK);
        bool ok = same_ids(got, ng, json_array_get(ids, i));
        CHECK_MSG(ok, "gpt2 ids differ on text %zu", i);
        if (!ok) show("gpt2", i, s, got, ng, json_array_get(ids, i));
        equal += ok;
        char *back = NULL;
        size_t bl = 0;
        CHECK(fm_tokenizer_decode(t, got, ng, &back, &bl) == FM_OK && bl == n && !memcmp(back, s, n));
        free(back);
        free(got);
    }
    fprintf(stderr, "gpt2 byte-level BPE: %d of %zu texts give the ids of tokenizers' ByteLevelBPETokenizer\n", equal,
            json_array_size(texts));
    /* invalid UTF-8 still round-trips (bytes are tokens) */
    const char bad[] = "ab\xff\xfe\xc3(z";
    int32_t *got = NULL;
    int64_t ng = 0;
    char *back = NULL;
    size_t bl = 0;
    CHECK(fm_tokenizer_encode(t, bad, sizeof bad - 1, &got, &ng) == FM_OK);
    CHECK(fm_tokenizer_decode(t, got, ng, &back, &bl) == FM_OK && bl == sizeof bad - 1 && !memcmp(back, bad, bl));
    free(back);
    free(got);
    CHECK(fm_tokenizer_save(t, "/tmp/never-written") != FM_OK);
    fm_tokenizer_free(t);
}

/* tokenizer.json files in each form (kind: "llama" or "bytelevel") against tokenizers:
 * ids of encode(text) (with the template's special token), and decode(ids,
 * skip_special_tokens=False). */
static void check_json_forms(const char *dir, json_t *exp, const char *kind) {
    char key[64];
    snprintf(key, sizeof key, "%s_texts", kind);
    json_t *texts = json_object_get(exp, key), *forms = json_object_get(exp, kind);
    const char *form;
    json_t *ref;
    CHECK_MSG(json_array_size(texts) > 40 && json_object_size(forms) >= 3, "expected.json has no %s fixtures", kind);
    json_object_foreach(forms, form, ref) {
        char p[1100];
        snprintf(p, sizeof p, "%s/%s_%s/tokenizer.json", dir, kind, form);
        fm_tokenizer *t = fm_tokenizer_load_hf_json(p);
        CHECK_MSG(t != NULL, "%s", fm_last_error());
        if (!t) continue;
        CHECK(fm_tokenizer_get_kind(t) == FM_TOK_LLAMA && !strcmp(fm_tokenizer_kind_name(FM_TOK_LLAMA), "llama"));
        CHECK(fm_tokenizer_vocab_size(t) == json_integer_value(json_object_get(ref, "vocab_size")));
        json_t *ids = json_object_get(ref, "ids"), *dec = json_object_get(ref, "decoded");
        int equal = 0, dequal = 0;
        for (size_t i = 0; i < json_array_size(texts); i++) {
            const char *s = json_string_value(json_array_get(texts, i));
            int32_t *got = NULL;
            int64_t ng = 0;
            CHECK(fm_tokenizer_encode(t, s, json_string_length(json_array_get(texts, i)), &got, &ng) == FM_OK);
            bool ok = same_ids(got, ng, json_array_get(ids, i));
            CHECK_MSG(ok, "%s %s ids differ on text %zu", kind, form, i);
            if (!ok) show(form, i, s, got, ng, json_array_get(ids, i));
            equal += ok;
            char *back = NULL;
            size_t bl = 0;
            const char *want = json_string_value(json_array_get(dec, i));
            size_t wl = json_string_length(json_array_get(dec, i));
            CHECK(fm_tokenizer_decode(t, got, ng, &back, &bl) == FM_OK);
            ok = back && bl == wl && !memcmp(back, want, wl);
            CHECK_MSG(ok, "%s %s decode differs on text %zu: \"%s\" vs \"%s\"", kind, form, i, back ? back : "", want);
            dequal += ok;
            free(back);
            free(got);
        }
        fprintf(stderr, "%s tokenizer.json (%s form): ids equal to tokenizers' on %d of %zu texts, decode on %d\n",
                kind, form, equal, json_array_size(texts), dequal);
        json_t *im = json_object_get(ref, "ignore_merges_changes");
        if (im) fprintf(stderr, "  (ignore_merges changes the reference ids of %lld of these texts)\n",
                        (long long)json_integer_value(im));
        json_t *nfc = json_object_get(ref, "nfc_changes"); /* Qwen2's form: the normalizer must matter */
        if (nfc) {
            fprintf(stderr, "  (NFC changes the reference ids of %lld of these texts)\n", (long long)json_integer_value(nfc));
            CHECK_MSG(json_integer_value(nfc) > 0, "%s %s: no text where NFC matters", kind, form);
        }
        CHECK(fm_tokenizer_save(t, "/tmp/never-written") != FM_OK);
        fm_tokenizer_free(t);
    }
}

static void check_wordpiece_set(const fm_wordpiece *w, json_t *texts, json_t *ids, int max_len, const char *what) {
    int equal = 0;
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const char *s = json_string_value(json_array_get(texts, i));
        int32_t *got = NULL;
        int64_t ng = 0;
        CHECK(fm_wordpiece_encode(w, s, json_string_length(json_array_get(texts, i)), max_len, &got, &ng) == FM_OK);
        bool ok = same_ids(got, ng, json_array_get(ids, i));
        CHECK_MSG(ok, "%s ids differ on text %zu", what, i);
        if (!ok) show(what, i, s, got, ng, json_array_get(ids, i));
        equal += ok;
        free(got);
    }
    fprintf(stderr, "%s: %d of %zu texts give the reference tokenizer's ids\n", what, equal,
            json_array_size(texts));
}

static void check_wordpiece(json_t *exp) {
    const char *vocab = json_string_value(json_object_get(exp, "wordpiece_vocab"));
    fm_wordpiece *w = fm_wordpiece_load(vocab, NULL);
    CHECK_MSG(w != NULL, "%s", fm_last_error());
    if (!w) return;
    json_t *texts = json_object_get(exp, "texts");
    check_wordpiece_set(w, texts, json_object_get(exp, "wordpiece"), 512, "wordpiece uncased");
    check_wordpiece_set(w, texts, json_object_get(exp, "wordpiece8"), 8, "wordpiece uncased, max_length 8");
    fm_wordpiece_free(w);
    fm_wordpiece_opts o = {0, 0, 1};
    w = fm_wordpiece_load(vocab, &o);
    CHECK(w != NULL);
    if (w) check_wordpiece_set(w, texts, json_object_get(exp, "wordpiece_cased"), 512, "wordpiece cased");
    fm_wordpiece_free(w);
}

#define GPT2_BAD(vocab, merges, needle)                                                                      \
    do {                                                                                                     \
        fm_tokenizer *_t = fm_tokenizer_gpt2_from_memory(vocab, strlen(vocab), merges, strlen(merges), NULL, NULL); \
        CHECK(_t == NULL);                                                                                   \
        CHECK_ERR_CONTAINS(needle);                                                                          \
        fm_tokenizer_free(_t);                                                                               \
    } while (0)

/* A complete byte alphabet as a vocab.json body, then extra tokens. */
static char *byte_vocab(const char *extra) {
    char *s = malloc(8192);
    size_t o = 0;
    int id = 0, ex = 0;
    s[o++] = '{';
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)ex++;
        o += (size_t)snprintf(s + o, 8192 - o, "%s\"\\u%04x\": %d", b ? ", " : "", cp, id++);
    }
    o += (size_t)snprintf(s + o, 8192 - o, "%s}", extra);
    return s;
}

static void bad_files(void) {
    char *ok = byte_vocab(", \"ab\": 256");
    fm_tokenizer *t = fm_tokenizer_gpt2_from_memory(ok, strlen(ok), "#version: 0.2\na b\n", 18, NULL, NULL);
    CHECK_MSG(t != NULL, "%s", fm_last_error());
    if (t) {
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK(fm_tokenizer_encode(t, "abab", 4, &ids, &n) == FM_OK && n == 2 && ids[0] == 256 && ids[1] == 256);
        free(ids);
    }
    fm_tokenizer_free(t);
    GPT2_BAD(ok, "a b\nb c\n", "line 2");
    GPT2_BAD(ok, "a b c\n", "line 1 is not two tokens");
    GPT2_BAD(ok, "ab\n", "line 1 is not two tokens");
    free(ok);
    char *dup = byte_vocab(", \"ab\": 3");
    GPT2_BAD(dup, "", "id 3 is given to two tokens");
    free(dup);
    char *hole = byte_vocab(", \"ab\": 300");
    GPT2_BAD(hole, "", "ids must be integers in [0, 257)");
    free(hole);
    GPT2_BAD("{\"a\": 0}", "", "256 to");
    GPT2_BAD("{\"a\": 0", "", "vocab.json: line 1");
    GPT2_BAD("[1, 2]", "", "expected a JSON object");
    char big[4096];
    size_t o = 0;
    o += (size_t)snprintf(big + o, sizeof big - o, "{");
    for (int i = 0; i < 300; i++) o += (size_t)snprintf(big + o, sizeof big - o, "%s\"t%d\": %d", i ? ", " : "", i, i);
    snprintf(big + o, sizeof big - o, "}");
    GPT2_BAD(big, "", "no token for byte 0x00");

    const char *wp = "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n##s\n";
    fm_wordpiece *w = fm_wordpiece_from_memory(wp, strlen(wp), NULL, NULL);
    CHECK_MSG(w != NULL, "%s", fm_last_error());
    if (w) {
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK(fm_wordpiece_encode(w, "Hellos hellx", 12, 16, &ids, &n) == FM_OK && n == 5 && ids[0] == 2 &&
              ids[1] == 4 && ids[2] == 5 && ids[3] == 1 && ids[4] == 3);
        free(ids);
        CHECK(fm_wordpiece_encode(w, "hello", 5, 1, &ids, &n) != FM_OK);
        CHECK_ERR_CONTAINS("max_length 1");
        CHECK(fm_wordpiece_vocab_size(w) == 6 && !strcmp(fm_wordpiece_token(w, 5), "##s"));
    }
    fm_wordpiece_free(w);
    w = fm_wordpiece_from_memory("[PAD]\n[UNK]\n[CLS]\nhello\n", 24, NULL, "v.txt");
    CHECK(w == NULL);
    CHECK_ERR_CONTAINS("v.txt: the vocabulary has no [SEP]");
    w = fm_wordpiece_from_memory("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[UNK]\n", 30, NULL, "v.txt");
    CHECK(w == NULL);
    CHECK_ERR_CONTAINS("line 5 repeats the token \"[UNK]\" (line 2)");
    CHECK(fm_wordpiece_load("/nonexistent/vocab.txt", NULL) == NULL);
    CHECK_ERR_CONTAINS("/nonexistent/vocab.txt: cannot open");
    CHECK(fm_tokenizer_load_gpt2("/nonexistent/vocab.json", "m") == NULL);
    CHECK_ERR_CONTAINS("/nonexistent/vocab.json: cannot open");
}

/* A small Llama-form tokenizer.json (Llama 2's pipeline) to mutate. */
static const char LLAMA_JSON[] =
    "{\"version\": \"1.0\", \"added_tokens\": ["
    "{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false, \"lstrip\": false},"
    "{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}],"
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"},"
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]},"
    "\"pre_tokenizer\": null,"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
    "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1]}}},"
    "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"},"
    "\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \","
    "\"start\": 1, \"stop\": 0}]},"
    "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"fuse_unk\": true,"
    "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0x41>\": 3, \"\u2581\": 4,"
    "\"h\": 5, \"i\": 6, \"\u2581h\": 7, \"\u2581hi\": 8}, \"merges\": [\"\u2581 h\", [\"\u2581h\", \"i\"]]}}";

/* LLAMA_JSON with its first `from` replaced by `to` (malloc'd). */
static char *llama_with(const char *from, const char *to) {
    const char *at = strstr(LLAMA_JSON, from);
    size_t fl = strlen(from), tl = strlen(to), n = strlen(LLAMA_JSON);
    char *s = malloc(n + tl + 1);
    size_t pre = at ? (size_t)(at - LLAMA_JSON) : n;
    memcpy(s, LLAMA_JSON, pre);
    memcpy(s + pre, to, tl);
    strcpy(s + pre + tl, at ? at + fl : "");
    CHECK_MSG(at != NULL, "test bug: '%s' not in LLAMA_JSON", from);
    return s;
}

#define LLAMA_BAD(from, to, needle)                                                     \
    do {                                                                                \
        char *_j = llama_with(from, to);                                                \
        fm_tokenizer *_t = fm_tokenizer_hf_json_from_memory(_j, strlen(_j), "t.json"); \
        CHECK_MSG(_t == NULL, "accepted: %s -> %s", from, to);                          \
        CHECK_ERR_CONTAINS(needle);                                                     \
        fm_tokenizer_free(_t);                                                          \
        free(_j);                                                                       \
    } while (0)

static void llama_small(void) {
    fm_tokenizer *t = fm_tokenizer_hf_json_from_memory(LLAMA_JSON, strlen(LLAMA_JSON), "t.json");
    CHECK_MSG(t != NULL, "%s", fm_last_error());
    if (!t) return;
    int32_t *ids = NULL;
    int64_t n = 0;
    /* <s>, then "▁hi▁hiA": two merges each, A by byte fallback; </s> stays one id, and the
     * piece after it gets its own ▁ (Prepend runs per piece) */
    CHECK(fm_tokenizer_encode(t, "hi hiA</s>h", 11, &ids, &n) == FM_OK);
    int32_t want[] = {1, 8, 8, 3, 2, 7};
    CHECK(n == 6 && !memcmp(ids, want, sizeof want));
    char *back = NULL;
    size_t bl = 0;
    CHECK(fm_tokenizer_decode(t, ids + 1, n - 1, &back, &bl) == FM_OK && !strcmp(back, "hi hiA</s> h"));
    free(back);
    CHECK(fm_tokenizer_decode(t, ids, n, &back, &bl) == FM_OK && !strcmp(back, "<s> hi hiA</s> h"));
    free(back);
    free(ids);
    const char *b;
    size_t bn;
    CHECK(fm_tokenizer_token_bytes(t, 3, &b, &bn) == FM_OK && bn == 1 && b[0] == 'A'); /* <0x41> is the byte */
    CHECK(fm_tokenizer_token_bytes(t, 8, &b, &bn) == FM_OK && bn == 3 && !memcmp(b, " hi", 3));
    /* "x" has neither a token nor a byte token: <unk>, fused over the run */
    CHECK(fm_tokenizer_encode(t, "xyh", 3, &ids, &n) == FM_OK && n == 4 && ids[1] == 4 && ids[2] == 0 && ids[3] == 5);
    free(ids);
    fm_tokenizer_free(t);

    LLAMA_BAD("\"model\": {", "\"model\": {{", "t.json: line 1");
    LLAMA_BAD("\"\u2581h\", \"i\"", "\"\u2581h\", \"x\"", "model.merges[1] merges");
    LLAMA_BAD("\"\u2581hi\": 8", "\"\u2581hi\": 9", "no token has id 8");
    LLAMA_BAD("\"<0x41>\": 3", "\"<0x41>\": 4", "gives id 4 to two tokens");
    LLAMA_BAD("\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Whitespace\"}", "pre_tokenizer \"Whitespace\" is not supported");
    LLAMA_BAD("\"lstrip\": false", "\"lstrip\": true", "has lstrip: true");
    LLAMA_BAD("\"dropout\": null", "\"dropout\": 0.1", "model.dropout is set");
    LLAMA_BAD("\"unk_token\": \"<unk>\"", "\"unk_token\": \"<oops>\"", "unk_token \"<oops>\" is not in model.vocab");
    LLAMA_BAD("\"decoder\": {\"type\": \"Sequence\"", "\"decoder\": null, \"x\": {\"type\": \"Sequence\"", "no decoder");
    LLAMA_BAD("\"id\": 1, \"content\": \"<s>\"", "\"id\": 3, \"content\": \"<s>\"", "which model.vocab gives to");
    LLAMA_BAD("\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model type \"WordPiece\" is not supported");
    LLAMA_BAD("\"normalized\": false}", "\"normalized\": true}", "is \"normalized\"");
    LLAMA_BAD("\"ids\": [1]", "\"ids\": [99]", "outside the vocabulary");
    LLAMA_BAD("{\"String\": \" \"}", "{\"Regex\": \" \"}", "Replace pattern \"Regex\"");
    /* a decoder Strip content or a Metaspace replacement longer than the one character
     * they hold (8..63 bytes once overflowed an 8-byte field) is refused by name */
    LLAMA_BAD("\"type\": \"Strip\", \"content\": \" \"", "\"type\": \"Strip\", \"content\": \"0123456789abcdef\"",
              "decoder.content must be a string of at most 7 bytes");
    LLAMA_BAD("\"pre_tokenizer\": null",
              "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"0123456789abcdefghijklmnopq\"}",
              "pre_tokenizer.replacement must be a string of at most 7 bytes");
    CHECK(fm_tokenizer_load_hf_json("/nonexistent/tokenizer.json") == NULL);
    CHECK_ERR_CONTAINS("/nonexistent/tokenizer.json: cannot open");
}

/* A small Llama 3-form tokenizer.json (made here, no Python): the 256 byte-alphabet
 * tokens (id = byte), "Ġh" "Ġhi" "12" "123" by merges, <|begin_of_text|> and
 * <|eot_id|> after them, Split on Llama 3's pattern + ByteLevel, the BOS template in a
 * Sequence with ByteLevel, ByteLevel decoder. malloc'd. */
static const char LLAMA3_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static char *llama3_json(void) {
    json_t *vocab = json_object();
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + extra++);
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, u, json_integer(b));
    }
    const char *more[] = {"\u0120h", "\u0120hi", "12", "123"};
    for (int k = 0; k < 4; k++) json_object_set_new(vocab, more[k], json_integer(256 + k));
    json_t *j = json_pack(
        "{s:s, s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}, {s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:n,"
        " s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
        " s:{s:s, s:[{s:s, s:b}, {s:s, s:[{s:{s:s}}, {s:{s:s}}], s:{s:{s:s, s:[i]}}}]},"
        " s:{s:s}, s:{s:s, s:n, s:n, s:b, s:b, s:b, s:o, s:[s, s, s, s]}}",
        "version", "1.0", "added_tokens", "id", 260, "content", "<|begin_of_text|>", "single_word", 0, "lstrip", 0,
        "rstrip", 0, "normalized", 0, "special", 1, "id", 261, "content", "<|eot_id|>", "single_word", 0, "lstrip", 0,
        "rstrip", 0, "normalized", 0, "special", 1, "normalizer", "pre_tokenizer", "type", "Sequence", "pretokenizers",
        "type", "Split", "pattern", "Regex", LLAMA3_RE, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
        "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "post_processor", "type", "Sequence", "processors",
        "type", "ByteLevel", "trim_offsets", 0, "type", "TemplateProcessing", "single", "SpecialToken", "id",
        "<|begin_of_text|>", "Sequence", "id", "A", "special_tokens", "<|begin_of_text|>", "id", "<|begin_of_text|>",
        "ids", 260, "decoder", "type", "ByteLevel", "model", "type", "BPE", "dropout", "unk_token", "fuse_unk", 0,
        "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab, "merges", "\u0120 h", "\u0120h i", "1 2", "12 3");
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    CHECK_MSG(s != NULL, "test bug: llama3_json does not pack");
    json_decref(j);
    return s;
}

/* s with its first `from` replaced by `to` (malloc'd). */
static char *str_with(const char *base, const char *from, const char *to) {
    const char *at = strstr(base, from);
    size_t fl = strlen(from), tl = strlen(to), n = strlen(base);
    char *s = malloc(n + tl + 1);
    size_t pre = at ? (size_t)(at - base) : n;
    memcpy(s, base, pre);
    memcpy(s + pre, to, tl);
    strcpy(s + pre + tl, at ? at + fl : "");
    CHECK_MSG(at != NULL, "test bug: '%s' not in the JSON", from);
    return s;
}

#define LLAMA3_BAD(base, from, to, needle)                                              \
    do {                                                                                \
        char *_j = str_with(base, from, to);                                            \
        fm_tokenizer *_t = fm_tokenizer_hf_json_from_memory(_j, strlen(_j), "t.json"); \
        CHECK_MSG(_t == NULL, "accepted: %s -> %s", from, to);                          \
        CHECK_ERR_CONTAINS(needle);                                                     \
        fm_tokenizer_free(_t);                                                          \
        free(_j);                                                                       \
    } while (0)

/* The same file in Qwen2's form (NFC normalizer, Split with single digits): a combining
 * accent composes before the split (e + U+0301 is the bytes of U+00E9), digits are
 * words of one (the merge "1 2" never applies), and a byte that is not UTF-8 stays
 * where it is: the mark after it does not compose across it. */
static void qwen2_small(const char *llama3) {
    char *a = str_with(llama3, "\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}");
    char *q = str_with(a, "\\p{N}{1,3}", "\\p{N}");
    free(a);
    fm_tokenizer *t = fm_tokenizer_hf_json_from_memory(q, strlen(q), "q.json");
    CHECK_MSG(t != NULL, "%s", fm_last_error());
    free(q);
    if (!t) return;
    int32_t *ids = NULL;
    int64_t n = 0;
    char *back = NULL;
    size_t bl = 0;
    const char text[] = "e\xcc\x81 123";
    int32_t want[] = {260, 0xC3, 0xA9, ' ', '1', '2', '3'};
    CHECK(fm_tokenizer_encode(t, text, sizeof text - 1, &ids, &n) == FM_OK);
    CHECK_MSG(n == 7 && !memcmp(ids, want, sizeof want), "qwen2 small: %lld ids", (long long)n);
    free(ids);
    const char bad[] = "e\xff\xcc\x81 ab\xfe 9";
    int32_t want_bad[] = {260, 'e', 0xFF, 0xCC, 0x81};
    CHECK(fm_tokenizer_encode(t, bad, sizeof bad - 1, &ids, &n) == FM_OK);
    CHECK_MSG(n > 5 && !memcmp(ids, want_bad, sizeof want_bad), "qwen2 small: invalid UTF-8 moved the mark");
    CHECK(n > 1 && fm_tokenizer_decode(t, ids + 1, n - 1, &back, &bl) == FM_OK && bl == sizeof bad - 1 &&
          !memcmp(back, bad, bl));
    free(back);
    free(ids);
    fm_tokenizer_free(t);
}

static void llama3_small(void) {
    char *js = llama3_json();
    if (!js) return;
    fm_tokenizer *t = fm_tokenizer_hf_json_from_memory(js, strlen(js), "t.json");
    CHECK_MSG(t != NULL, "%s", fm_last_error());
    if (t) {
        CHECK(fm_tokenizer_get_kind(t) == FM_TOK_LLAMA && fm_tokenizer_vocab_size(t) == 262);
        int32_t *ids = NULL;
        int64_t n = 0;
        /* BOS; " hi" one word (space + letters) merged to Ġhi; " " alone before digits;
         * digits in threes (123, then 4 and 5 as bytes); <|eot_id|> one id */
        const char text[] = " hi 12345<|eot_id|>";
        CHECK(fm_tokenizer_encode(t, text, sizeof text - 1, &ids, &n) == FM_OK);
        int32_t want[] = {260, 257, 32, 259, '4', '5', 261};
        CHECK_MSG(n == 7 && !memcmp(ids, want, sizeof want), "llama3 small: %lld ids", (long long)n);
        char *back = NULL;
        size_t bl = 0;
        CHECK(fm_tokenizer_decode(t, ids, n, &back, &bl) == FM_OK && !strcmp(back, "<|begin_of_text|> hi 12345<|eot_id|>"));
        free(back);
        free(ids);
        const char *b;
        size_t bn;
        CHECK(fm_tokenizer_token_bytes(t, 257, &b, &bn) == FM_OK && bn == 3 && !memcmp(b, " hi", 3));
        CHECK(fm_tokenizer_token_bytes(t, 10, &b, &bn) == FM_OK && bn == 1 && b[0] == '\n'); /* Ċ is byte 10 */
        /* any bytes, invalid UTF-8 included, come back exactly after the BOS */
        const char bad[] = "ab\xff\xfe\xc3(z\r\n\t 9999 'S it's \xe2\x82";
        CHECK(fm_tokenizer_encode(t, bad, sizeof bad - 1, &ids, &n) == FM_OK && n > 1 && ids[0] == 260);
        CHECK(n > 1 && fm_tokenizer_decode(t, ids + 1, n - 1, &back, &bl) == FM_OK && bl == sizeof bad - 1 &&
              !memcmp(back, bad, bl));
        free(back);
        free(ids);
        fm_tokenizer_free(t);
    }
    /* what fathom does not implement is refused by name */
    LLAMA3_BAD(js, "\\p{N}{1,3}", "\\p{N}{1,4}", "pre_tokenizer Split pattern \"(?i:'s");
    LLAMA3_BAD(js, "\"Isolated\"", "\"Removed\"", "pre_tokenizer Split behavior \"Removed\" is not supported");
    LLAMA3_BAD(js, "\"invert\":false", "\"invert\":true", "pre_tokenizer Split invert");
    LLAMA3_BAD(js, "\"type\":\"Split\"", "\"type\":\"Digits\"", "pre_tokenizer Sequence of 2 (Digits, ByteLevel");
    LLAMA3_BAD(js, "\"use_regex\":false", "\"use_regex\":true", "ByteLevel use_regex after a Split");
    LLAMA3_BAD(js, "\"add_prefix_space\":false", "\"add_prefix_space\":true", "add_prefix_space after a Split");
    LLAMA3_BAD(js, "{\"type\":\"ByteLevel\",\"trim_offsets\":false}", "{\"type\":\"RobertaProcessing\"}",
               "post_processor in a Sequence \"RobertaProcessing\"");
    LLAMA3_BAD(js, "\"decoder\":{\"type\":\"ByteLevel\"}", "\"decoder\":{\"type\":\"BPEDecoder\"}",
               "decoder \"BPEDecoder\" is not supported");
    LLAMA3_BAD(js, "\"12 3\"", "\"12 4\"", "model.merges[3] merges");
    LLAMA3_BAD(js, "\"normalizer\":null", "\"normalizer\":{\"type\":\"NFKC\"}", "normalizer \"NFKC\" is not supported");
    qwen2_small(js);
    free(js);
}

/* A Llama directory (written by fathom) with only tokenizer.json: fm_hf_gpt_load reads
 * it, and refuses it when it has more tokens than config.json's vocab_size; the same
 * for a GPT-2 directory's vocab.json + merges.txt. */
static void llama_dir(const char *tmp) {
    char d[1100], p[1200];
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_LLAMA);
    c.n_layer = 1, c.n_head = 2, c.n_kv_head = 1, c.n_embd = 16, c.block_size = 16, c.ffn_hidden = 32;
    for (int k = 0; k < 2; k++) {
        c.vocab_size = k ? 8 : 9;
        snprintf(d, sizeof d, "%s/llama_dir_%d", tmp, k);
        fm_rng rng;
        fm_rng_init(&rng, 3);
        fm_gpt *m = fm_gpt_new(&c, &rng);
        CHECK_MSG(m && fm_hf_gpt_save(m, d) == FM_OK, "%s", fm_last_error());
        fm_gpt_free(m);
        snprintf(p, sizeof p, "%s/tokenizer.json", d);
        FILE *f = fopen(p, "w");
        CHECK(f && fputs(LLAMA_JSON, f) >= 0);
        if (f) fclose(f);
        fm_tokenizer *tok = NULL;
        m = fm_hf_gpt_load(d, &tok);
        if (k == 0) {
            CHECK_MSG(m && tok && fm_tokenizer_get_kind(tok) == FM_TOK_LLAMA, "%s", fm_last_error());
        } else {
            CHECK(m == NULL && tok == NULL);
            CHECK_ERR_CONTAINS("tokenizer.json: the tokenizer has 9 tokens but config.json's vocab_size is 8");
        }
        fm_tokenizer_free(tok);
        fm_gpt_free(m);
    }
    /* a Llama 3-form tokenizer.json (262 tokens) in a Llama directory of vocab_size 262:
     * loaded with the model, and it encodes with <|begin_of_text|> first */
    c.vocab_size = 262;
    snprintf(d, sizeof d, "%s/llama3_dir", tmp);
    fm_rng rng;
    fm_rng_init(&rng, 4);
    fm_gpt *m3 = fm_gpt_new(&c, &rng);
    CHECK_MSG(m3 && fm_hf_gpt_save(m3, d) == FM_OK, "%s", fm_last_error());
    fm_gpt_free(m3);
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    char *j3 = llama3_json();
    FILE *f3 = fopen(p, "w");
    CHECK(f3 && j3 && fputs(j3, f3) >= 0);
    if (f3) fclose(f3);
    free(j3);
    fm_tokenizer *tok3 = NULL;
    m3 = fm_hf_gpt_load(d, &tok3);
    CHECK_MSG(m3 && tok3 && fm_tokenizer_vocab_size(tok3) == 262, "%s", fm_last_error());
    int32_t *ids3 = NULL;
    int64_t n3 = 0;
    CHECK(tok3 && fm_tokenizer_encode(tok3, " hi", 3, &ids3, &n3) == FM_OK && n3 == 2 && ids3[0] == 260 && ids3[1] == 257);
    free(ids3);
    fm_tokenizer_free(tok3);
    fm_gpt_free(m3);
    /* a GPT-2 directory whose vocab.json + merges.txt (257 tokens) disagree with vocab_size
     * 256: refused naming vocab.json and both counts; with vocab_size 257 it loads */
    for (int k = 0; k < 2; k++) {
        fm_gpt_config cg = fm_gpt_config_default(FM_GPT_GPT2);
        cg.n_layer = 1, cg.n_head = 2, cg.n_embd = 16, cg.block_size = 16, cg.ffn_hidden = 32;
        cg.vocab_size = k ? 256 : 257;
        snprintf(d, sizeof d, "%s/gpt2_dir_%d", tmp, k);
        fm_rng_init(&rng, 5);
        fm_gpt *m = fm_gpt_new(&cg, &rng);
        CHECK_MSG(m && fm_hf_gpt_save(m, d) == FM_OK, "%s", fm_last_error());
        fm_gpt_free(m);
        char *v = byte_vocab(", \"ab\": 256");
        snprintf(p, sizeof p, "%s/vocab.json", d);
        FILE *f = fopen(p, "w");
        CHECK(f && fputs(v, f) >= 0);
        if (f) fclose(f);
        free(v);
        snprintf(p, sizeof p, "%s/merges.txt", d);
        f = fopen(p, "w");
        CHECK(f && fputs("#version: 0.2\na b\n", f) >= 0);
        if (f) fclose(f);
        fm_tokenizer *tg = NULL;
        m = fm_hf_gpt_load(d, &tg);
        if (k == 0) {
            CHECK_MSG(m && tg && fm_tokenizer_get_kind(tg) == FM_TOK_GPT2, "%s", fm_last_error());
        } else {
            CHECK(m == NULL && tg == NULL);
            CHECK_ERR_CONTAINS("gpt2_dir_1/vocab.json: the tokenizer has 257 tokens but config.json's vocab_size is 256");
        }
        fm_tokenizer_free(tg);
        fm_gpt_free(m);
    }
    snprintf(p, sizeof p, "%s/llama_dir_0/tokenizer.json", tmp);
    CHECK(remove(p) == 0);
    snprintf(d, sizeof d, "%s/llama_dir_0", tmp);
    fm_tokenizer *tok = NULL;
    CHECK(fm_hf_gpt_load(d, &tok) == NULL && tok == NULL);
    CHECK_ERR_CONTAINS("neither vocab.json + merges.txt (byte-level BPE) nor tokenizer.json");
}

/* Whole-file reads go through fm_read_text_file (tokz_slurp): a directory and a
 * binary file are refused naming the file (a directory gave "cannot read" before,
 * after an ftell of a directory). */
static void whole_files(void) {
    char d[] = "/tmp/fathom-hf-whole-XXXXXX", p[300];
    if (!mkdtemp(d)) { CHECK(0); return; }
    CHECK(fm_wordpiece_load(d, NULL) == NULL);
    CHECK_ERR_CONTAINS(": is a directory, not a tokenizer file");
    CHECK(fm_tokenizer_load_gpt2(d, "m") == NULL);
    CHECK_ERR_CONTAINS(": is a directory, not a tokenizer file");
    CHECK(fm_tokenizer_load_hf_json(d) == NULL);
    CHECK_ERR_CONTAINS(": is a directory, not a tokenizer file");
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    FILE *f = fopen(p, "wb");
    if (f) { fwrite("{\"model\": \0}", 1, 12, f); fclose(f); } /* 12 bytes, one of them NUL */
    CHECK(fm_tokenizer_load_hf_json(p) == NULL);
    CHECK_ERR_CONTAINS("tokenizer.json: not a text file: it holds a NUL byte");
    CHECK(fm_wordpiece_load(p, NULL) == NULL);
    CHECK_ERR_CONTAINS("holds a NUL byte");
    remove(p);
    rmdir(d);
}

int main(void) {
    bad_files();
    whole_files();
    llama_small();
    llama3_small();
    char dir[] = "/tmp/fathom-hf-tok-XXXXXX", why[2048];
    if (!mkdtemp(dir)) { CHECK(0); TEST_DONE(); }
    int rc = hf_fixtures("tokenizers", dir, NULL, why, sizeof why);
    if (rc == 77) {
        TEST_SKIP("reference tokenizers not available (%s): ids not compared", why);
    } else if (rc != 0) {
        CHECK_MSG(0, "fixtures.py failed: %s", why);
    } else {
        char p[1100];
        snprintf(p, sizeof p, "%s/expected.json", dir);
        json_error_t e;
        json_t *exp = json_load_file(p, 0, &e);
        CHECK_MSG(exp != NULL, "%s: %s", p, e.text);
        if (exp) {
            check_gpt2(dir, exp);
            check_wordpiece(exp);
            check_json_forms(dir, exp, "llama");
            check_json_forms(dir, exp, "bytelevel");
        }
        json_decref(exp);
    }
    llama_dir(dir);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    TEST_DONE();
}
