/* Tokenizer tests: exact round trips for the byte, char and BPE tokenizers on
 * ASCII, multi-byte UTF-8 and invalid UTF-8; save/load; BPE training behaviour;
 * and the bad-input errors (empty corpora, unknown ids, corrupt files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fathom/tokenizer.h"
#include "test_util.h"

static const char *samples[] = {
    "In the beginning God created the heaven and the earth.",
    "",
    "caf\xc3\xa9 \xe2\x82\xac 100 \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\n\n  tabs\tand   spaces  ",
    "\xff\xfe invalid \xc3 truncated \xe2\x82 end \xc0\xaf overlong \xed\xa0\x80 surrogate \xf4\x90\x80\x80 too big",
    "\x80\x80\x80",
    "a",
};

static void roundtrip(const fm_tokenizer *t, const char *s, size_t n) {
    int32_t *ids = NULL;
    int64_t k = 0;
    CHECK(fm_tokenizer_encode(t, s, n, &ids, &k) == FM_OK);
    char *back = NULL;
    size_t len = 0;
    CHECK(fm_tokenizer_decode(t, ids, k, &back, &len) == FM_OK);
    CHECK_MSG(len == n && memcmp(back, s, n) == 0, "%s round trip of %zu bytes gave %zu",
              fm_tokenizer_kind_name(fm_tokenizer_get_kind(t)), n, len);
    for (int64_t i = 0; i < k; i++) CHECK(ids[i] >= 0 && ids[i] < fm_tokenizer_vocab_size(t));
    free(ids);
    free(back);
}

static void roundtrip_all(const fm_tokenizer *t) {
    for (size_t i = 0; i < sizeof samples / sizeof *samples; i++) roundtrip(t, samples[i], strlen(samples[i]));
    char all[256]; /* every byte value, NUL included */
    for (int i = 0; i < 256; i++) all[i] = (char)i;
    roundtrip(t, all, 256);
    /* random bytes */
    char rnd[4096];
    unsigned x = 12345;
    for (size_t i = 0; i < sizeof rnd; i++) { x = x * 1103515245u + 12345u; rnd[i] = (char)(x >> 16); }
    roundtrip(t, rnd, sizeof rnd);
}

static const char *corpus =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: "
    "and God divided the light from the darkness. caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 the end.\n";

static void save_load(const fm_tokenizer *t) {
    char path[] = "/tmp/fathom_tokzXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK(fm_tokenizer_save(t, path) == FM_OK);
    fm_tokenizer *u = fm_tokenizer_load(path);
    CHECK_MSG(u != NULL, "%s", fm_last_error());
    if (u) {
        CHECK(fm_tokenizer_vocab_size(u) == fm_tokenizer_vocab_size(t));
        CHECK(fm_tokenizer_get_kind(u) == fm_tokenizer_get_kind(t));
        int32_t *a, *b;
        int64_t na, nb;
        CHECK(fm_tokenizer_encode(t, corpus, strlen(corpus), &a, &na) == FM_OK);
        CHECK(fm_tokenizer_encode(u, corpus, strlen(corpus), &b, &nb) == FM_OK);
        CHECK(na == nb && memcmp(a, b, sizeof(int32_t) * (size_t)na) == 0);
        free(a);
        free(b);
        roundtrip_all(u);
        fm_tokenizer_free(u);
    }
    unlink(path);
}

int main(void) {
    fm_tokenizer *bt = fm_tokenizer_byte();
    CHECK(bt && fm_tokenizer_vocab_size(bt) == 256);
    roundtrip_all(bt);
    save_load(bt);

    fm_tokenizer *ct = fm_tokenizer_char_from_corpus(corpus, strlen(corpus));
    CHECK(ct != NULL);
    roundtrip_all(ct);
    save_load(ct);
    /* one id per character of the corpus: the multi-byte e-acute is a single id */
    int32_t *ids;
    int64_t n;
    CHECK(fm_tokenizer_encode(ct, "caf\xc3\xa9", 5, &ids, &n) == FM_OK && n == 4);
    free(ids);

    fm_tokenizer *bp = fm_tokenizer_train_bpe(corpus, strlen(corpus), 300);
    CHECK_MSG(bp != NULL, "%s", fm_last_error());
    CHECK(fm_tokenizer_vocab_size(bp) > 256 && fm_tokenizer_vocab_size(bp) <= 300);
    roundtrip_all(bp);
    save_load(bp);
    CHECK(fm_tokenizer_encode(bp, corpus, strlen(corpus), &ids, &n) == FM_OK);
    CHECK_MSG(n < (int64_t)strlen(corpus) / 2, "bpe compresses its training text: %lld ids for %zu bytes",
              (long long)n, strlen(corpus));
    free(ids);
    /* deterministic training */
    fm_tokenizer *bp2 = fm_tokenizer_train_bpe(corpus, strlen(corpus), 300);
    const char *b1, *b2;
    size_t l1, l2;
    for (int i = 256; bp2 && i < fm_tokenizer_vocab_size(bp); i++) {
        CHECK(fm_tokenizer_token_bytes(bp, i, &b1, &l1) == FM_OK && fm_tokenizer_token_bytes(bp2, i, &b2, &l2) == FM_OK);
        CHECK(l1 == l2 && !memcmp(b1, b2, l1));
    }
    fm_tokenizer_free(bp2);

    /* bad input */
    CHECK(fm_tokenizer_char_from_corpus("", 0) == NULL);
    CHECK_ERR_CONTAINS("corpus is empty");
    CHECK(fm_tokenizer_train_bpe("", 0, 300) == NULL);
    CHECK_ERR_CONTAINS("corpus is empty");
    CHECK(fm_tokenizer_train_bpe("abc", 3, 300) == NULL);
    CHECK_ERR_CONTAINS("too short");
    CHECK(fm_tokenizer_train_bpe(corpus, strlen(corpus), 100) == NULL);
    CHECK_ERR_CONTAINS("must be in [256");
    int32_t bad[3] = {65, 9999, 66};
    char *txt;
    size_t len;
    CHECK(fm_tokenizer_decode(bp, bad, 3, &txt, &len) != FM_OK);
    CHECK_ERR_CONTAINS("unknown token id 9999 at position 1");
    CHECK(fm_tokenizer_token_bytes(bt, -1, &b1, &l1) != FM_OK);
    CHECK_ERR_CONTAINS("unknown token id -1");
    char path[] = "/tmp/fathom_tokbXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) {
        const char *junk = "fathom-tokenizer 1\nkind bpe\nvocab 258\nmerges 2\n97 98\n999 97\n";
        CHECK(write(fd, junk, strlen(junk)) == (ssize_t)strlen(junk));
        close(fd);
    }
    CHECK(fm_tokenizer_load(path) == NULL);
    CHECK_ERR_CONTAINS("merge 1 refers to id 999");
    FILE *f = fopen(path, "w");
    fputs("hello", f);
    fclose(f);
    CHECK(fm_tokenizer_load(path) == NULL);
    CHECK_ERR_CONTAINS("not a fathom tokenizer file");
    unlink(path);
    CHECK(fm_tokenizer_load("/nonexistent/tok.txt") == NULL);
    CHECK_ERR_CONTAINS("cannot open");

    fm_tokenizer_free(bt);
    fm_tokenizer_free(ct);
    fm_tokenizer_free(bp);
    TEST_DONE();
}
