/* Hugging Face tokenizer files (src/tokenizer/gpt2_bpe.c, wordpiece.c,
 * hf_json_bpe.c), then an encode of mixed-script text with what loaded. The first
 * byte picks the reader: 'w' vocab.txt (the rest); 'j' tokenizer.json (the rest:
 * encode, decode, every id's bytes, and an encode of the rest as text); anything
 * else GPT-2, the rest being
 * vocab.json, a NUL, then merges.txt. */
#include "fathom/tokenizer.h"
#include "fuzz_util.h"

static const char text[] = "Hello, World! I'm naïve café 北京 \t\n 123 👍 'll  x";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    if (data[0] == 'j') {
        fm_tokenizer *t = fm_tokenizer_hf_json_from_memory(p, n, "fuzz");
        if (t && fm_tokenizer_encode(t, text, sizeof text - 1, &ids, &n_ids) == FM_OK) {
            char *s = NULL;
            size_t l = 0;
            if (fm_tokenizer_decode(t, ids, n_ids, &s, &l) == FM_OK) free(s);
            free(ids);
        }
        /* the input itself as text too (any bytes, invalid UTF-8 included), so the split
         * patterns and added-token matching see more than one fixed sentence */
        if (t && fm_tokenizer_encode(t, p, n < 4096 ? n : 4096, &ids, &n_ids) == FM_OK) free(ids);
        for (int i = 0; t && i < fm_tokenizer_vocab_size(t); i++) {
            const char *b;
            size_t l;
            if (fm_tokenizer_token_bytes(t, i, &b, &l) != FM_OK || (l && !b)) __builtin_trap();
        }
        fm_tokenizer_free(t);
    } else if (data[0] == 'w') {
        fm_wordpiece *w = fm_wordpiece_from_memory(p, n, NULL, "fuzz");
        if (w && fm_wordpiece_encode(w, text, sizeof text - 1, 64, &ids, &n_ids) == FM_OK) free(ids);
        fm_wordpiece_free(w);
    } else {
        const char *nul = memchr(p, 0, n);
        size_t vl = nul ? (size_t)(nul - p) : n;
        fm_tokenizer *t = fm_tokenizer_gpt2_from_memory(p, vl, nul ? nul + 1 : "", nul ? n - vl - 1 : 0, "v", "m");
        if (t && fm_tokenizer_encode(t, text, sizeof text - 1, &ids, &n_ids) == FM_OK) {
            char *s = NULL;
            size_t l = 0;
            if (fm_tokenizer_decode(t, ids, n_ids, &s, &l) == FM_OK && (l != sizeof text - 1 || memcmp(s, text, l)))
                __builtin_trap(); /* decoding must give the text back */
            free(s);
            free(ids);
        }
        fm_tokenizer_free(t);
    }
    fm_clear_error();
    return 0;
}
