/* Internals shared by the tokenizer files: the fm_tokenizer struct and the
 * helpers that tokenizer.c (fathom's own kinds) and gpt2_bpe.c (GPT-2 files)
 * both use (and hf_json_bpe.c, tokenizer.json). Not a public interface. */
#ifndef FATHOM_TOKENIZER_INTERNAL_H
#define FATHOM_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fathom/tokenizer.h"

struct fm_tokenizer {
    fm_tokenizer_kind kind;
    int vocab;
    char **tok; /* bytes of each token */
    int *tok_len;
    /* char */
    int n_chars;
    uint32_t *cps; /* sorted code points; id = index; byte fallback = n_chars + byte */
    /* bpe and gpt2 */
    int n_merges;
    int32_t (*merges)[2];
    int64_t *rank_keys; /* open-addressing table: pair -> merge index */
    int32_t *rank_vals;
    size_t rank_cap;
    /* gpt2 only: the id each merge produces and the id of each single byte (fathom's
     * bpe has neither: merge r makes id 256 + r and byte b is id b) */
    int32_t *merge_out;
    int32_t byte_id[256];
    /* gpt2: <|endoftext|>, when the vocabulary has it, is matched in the text as one
     * token before pre-tokenization (as transformers' GPT2Tokenizer does) */
    bool has_special;
    int32_t special_id;
    /* llama (tokenizer.json): the pipeline's settings, hf_json_bpe.c */
    struct tokz_json *js;
};

fm_tokenizer *tokz_tok_alloc(fm_tokenizer_kind kind, int vocab);
fm_status tokz_set_tok(fm_tokenizer *t, int id, const char *b, int n);
fm_status tokz_build_ranks(fm_tokenizer *t);
int tokz_rank_of(const fm_tokenizer *t, int32_t a, int32_t b);
/* Length (1-4) of the valid UTF-8 sequence at p with its code point, or 0 if the
 * bytes there are not valid UTF-8 (overlong forms and surrogates included). */
int tokz_utf8_next(const unsigned char *p, size_t n, uint32_t *cp);
int tokz_utf8_put(uint32_t cp, char *out);
/* tokenizer.json (hf_json_bpe.c): encode, the decoder's whole-text steps on a
 * decoded string, and freeing. */
fm_status tokz_json_encode(const fm_tokenizer *t, const char *text, size_t n, int32_t **ids, int64_t *n_ids);
void tokz_json_decode_fix(const fm_tokenizer *t, const int32_t *ids, int64_t n, char *s, size_t *len);
void tokz_json_free(struct tokz_json *js);
/* A whole file (malloc'd, NUL-terminated), or NULL with the error set. */
/* A tokenizer file read whole (vocab.json, merges.txt, vocab.txt, tokenizer.json):
 * through fm_read_text_file, at most TOKZ_FILE_MAX bytes; the error names the file. */
#define TOKZ_FILE_MAX ((size_t)256 << 20)
char *tokz_slurp(const char *path, size_t *len);
/* Length of the next GPT-2 pre-token at p (n > 0 bytes): gpt2_bpe.c. */
size_t tokz_gpt2_word_len(const unsigned char *p, size_t n);
/* Length of the next pre-token of Llama 3's split pattern (max_digits 3): gpt2_bpe.c. */
size_t tokz_llama3_word_len(const unsigned char *p, size_t n, int max_digits);
/* GPT-2's byte-to-unicode alphabet: the code point (below 512) that stands for each byte. */
void tokz_byte_alphabet(uint32_t cp_of[256]);

#endif
