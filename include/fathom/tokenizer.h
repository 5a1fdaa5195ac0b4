/* fathom/tokenizer.h: text <-> token ids for the language models.
 *
 * Three kinds, all lossless on arbitrary bytes (valid UTF-8 or not):
 *   byte  ids 0..255 are the bytes themselves.
 *   char  one id per Unicode character seen in a corpus, then 256 byte-fallback
 *         ids for anything else (unseen characters, invalid UTF-8).
 *   bpe   byte-level byte-pair encoding: ids 0..255 are bytes, each further id is
 *         a learned merge of two earlier ids (trained with fm_tokenizer_train_bpe).
 * decode(encode(s)) == s for every input. Saved as a small text file. */
#ifndef FATHOM_TOKENIZER_H
#define FATHOM_TOKENIZER_H
#include "fathom/export.h"

#include <stddef.h>
#include <stdint.h>

#include "fathom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fm_tokenizer_kind { FM_TOK_BYTE = 0, FM_TOK_CHAR = 1, FM_TOK_BPE = 2 } fm_tokenizer_kind;
typedef struct fm_tokenizer fm_tokenizer;

FM_API fm_tokenizer *fm_tokenizer_byte(void);
/* Characters of `text` (n bytes); an empty corpus is an error. */
FM_API fm_tokenizer *fm_tokenizer_char_from_corpus(const char *text, size_t n);
/* Learns vocab_size - 256 merges (vocab_size in [256, 1<<20]) from the corpus.
 * Text is first split into words (an optional leading space, then a run of
 * letters, of digits, of other symbols, or of whitespace) so merges never cross
 * word boundaries. Deterministic: ties go to the smallest pair of ids. A corpus
 * too small to yield the requested merges gives a smaller vocabulary, unless it
 * yields none at all, which is an error. */
FM_API fm_tokenizer *fm_tokenizer_train_bpe(const char *text, size_t n, int vocab_size);
FM_API void fm_tokenizer_free(fm_tokenizer *t);

FM_API fm_tokenizer_kind fm_tokenizer_get_kind(const fm_tokenizer *t);
FM_API const char *fm_tokenizer_kind_name(fm_tokenizer_kind k);
FM_API fm_status fm_tokenizer_kind_parse(const char *s, fm_tokenizer_kind *out);
FM_API int fm_tokenizer_vocab_size(const fm_tokenizer *t);

/* *ids (malloc'd, caller frees) receives *n_ids ids. */
FM_API fm_status fm_tokenizer_encode(const fm_tokenizer *t, const char *text, size_t n, int32_t **ids, int64_t *n_ids);
/* *text (malloc'd, NUL-terminated for convenience) receives *len bytes. An id
 * outside the vocabulary is an error naming it. */
FM_API fm_status fm_tokenizer_decode(const fm_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len);
/* The bytes of one token (borrowed), for streaming output. */
FM_API fm_status fm_tokenizer_token_bytes(const fm_tokenizer *t, int32_t id, const char **bytes, size_t *len);

FM_API fm_status fm_tokenizer_save(const fm_tokenizer *t, const char *path);
FM_API fm_tokenizer *fm_tokenizer_load(const char *path);

#ifdef __cplusplus
}
#endif
#endif
