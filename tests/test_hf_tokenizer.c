/* The Hugging Face tokenizers (GPT-2 byte-level BPE, BERT WordPiece) against the
 * reference libraries: a byte-level BPE that `tokenizers` trains and saves, and
 * the real all-MiniLM-L6-v2 vocab.txt (or a trained one), on a text suite with
 * Unicode and whitespace edge cases (tests/hf/fixtures.py): the ids must be
 * equal. Then the bad files: each refused with a message naming the problem. */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>

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

int main(void) {
    bad_files();
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
        }
        json_decref(exp);
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    TEST_DONE();
}
