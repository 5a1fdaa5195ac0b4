/* fathom/tokenizer.h: text <-> token ids for the language models.
 *
 * Three kinds, all lossless on arbitrary bytes (valid UTF-8 or not):
 *   byte  ids 0..255 are the bytes themselves.
 *   char  one id per Unicode character seen in a corpus, then 256 byte-fallback
 *         ids for anything else (unseen characters, invalid UTF-8).
 *   bpe   byte-level byte-pair encoding: ids 0..255 are bytes, each further id is
 *         a learned merge of two earlier ids (trained with fm_tokenizer_train_bpe).
 * decode(encode(s)) == s for every input. Saved as a small text file. The Hugging
 * Face readers below follow their reference libraries instead. */
#ifndef FATHOM_TOKENIZER_H
#define FATHOM_TOKENIZER_H
#include "fathom/export.h"

#include <stddef.h>
#include <stdint.h>

#include "fathom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FM_TOK_GPT2: a byte-level BPE read from Hugging Face's vocab.json + merges.txt
 * (fm_tokenizer_load_gpt2); FM_TOK_LLAMA: a BPE read from tokenizer.json
 * (fm_tokenizer_load_hf_json: Llama 2's SentencePiece-style form or Llama 3's
 * byte-level one). Both are loaded, never trained or
 * saved by fathom. */
typedef enum fm_tokenizer_kind {
    FM_TOK_BYTE = 0,
    FM_TOK_CHAR = 1,
    FM_TOK_BPE = 2,
    FM_TOK_GPT2 = 3,
    FM_TOK_LLAMA = 4
} fm_tokenizer_kind;
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

/* ---- Hugging Face tokenizer files ---- */
/* GPT-2's byte-level BPE: vocab.json (token -> id, tokens written in GPT-2's
 * byte-to-unicode alphabet, ids dense from 0) and merges.txt (one "A B" pair per
 * line, by rank; an optional "#version" first line). Text is split with GPT-2's
 * pre-tokenization pattern ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 * ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, Unicode classes from ICU). "<|endoftext|>", if
 * the vocabulary has it, is a special token: the text is cut at each occurrence,
 * which encodes as that one id (as transformers' GPT2Tokenizer does). A merge or
 * byte with no token, a duplicate or missing id, or malformed JSON is an error
 * naming the file, the line or token. Decoding is exact on any id sequence. */
FM_API fm_tokenizer *fm_tokenizer_load_gpt2(const char *vocab_json, const char *merges_txt);
/* The same from memory; vocab_name and merges_name label the errors. */
FM_API fm_tokenizer *fm_tokenizer_gpt2_from_memory(const char *vocab_json, size_t vocab_len, const char *merges,
                                                   size_t merges_len, const char *vocab_name,
                                                   const char *merges_name);

/* Hugging Face's tokenizer.json with a BPE model, in the two families Llama-style
 * checkpoints ship:
 *   SentencePiece-style (Llama 2, Mistral, TinyLlama): "▁" (U+2581) spaces,
 *     byte_fallback (<0xXX> tokens for characters outside the vocabulary), unk_token
 *     and fuse_unk; normalizer null or Prepend/Replace with string patterns (Llama 2's
 *     form); pre_tokenizer null or Metaspace (replacement, prepend_scheme
 *     always/first/never, split); decoder Replace/ByteFallback/Fuse/Strip or Metaspace.
 *   byte-level (Llama 3, GPT-2's tokenizer.json): pre_tokenizer ByteLevel (GPT-2's
 *     pattern, add_prefix_space) or Split on Llama 3's pattern ((?i:'s|'t|'re|'ve|'m|
 *     'll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *     \s*[\r\n]+|\s+(?!\S)|\s+) or GPT-2's, then ByteLevel without its regex;
 *     decoder ByteLevel; post_processor ByteLevel (ids unchanged).
 * Both: ignore_merges; merges as "a b" or [a, b]; added_tokens (<s>, </s>,
 * <|begin_of_text|>, ...) matched in the text first, each one id; post_processor
 * TemplateProcessing (its "single" template: the <s> or <|begin_of_text|> that
 * fm_tokenizer_encode puts first), alone or in a Sequence with ByteLevel. Any other
 * part or split pattern, added tokens with lstrip/rstrip/single_word, and dropout are
 * refused by name. Encoding gives the ids of tokenizers' Tokenizer.encode(text);
 * decoding its decode(ids, skip_special_tokens=False), except that bytes are
 * returned as they are (no U+FFFD for an incomplete UTF-8 sequence). Malformed
 * JSON, a merge naming a token the vocabulary lacks, duplicate or missing ids are
 * errors naming the file and the entry. The kind is FM_TOK_LLAMA for both. */
FM_API fm_tokenizer *fm_tokenizer_load_hf_json(const char *tokenizer_json);
/* The same from memory; name labels the errors. */
FM_API fm_tokenizer *fm_tokenizer_hf_json_from_memory(const char *json, size_t len, const char *name);

/* BERT's WordPiece (vocab.txt, one token per line, id = line number) with BERT's
 * normalization: control characters dropped, whitespace to spaces, CJK
 * ideographs split apart, optional lower-casing and accent stripping (NFD, marks
 * dropped), then whitespace and punctuation splitting and greedy longest-match
 * WordPiece with "##" continuations; a word with no cover (or over 100
 * characters) becomes [UNK]. */
typedef struct fm_wordpiece fm_wordpiece;
typedef struct fm_wordpiece_opts {
    int lowercase;     /* 1 (BERT uncased) or 0 */
    int strip_accents; /* 1, 0, or -1: follow lowercase (Hugging Face's default) */
    int chinese_chars; /* 1: put spaces around CJK ideographs */
} fm_wordpiece_opts;
FM_API fm_wordpiece_opts fm_wordpiece_defaults(void); /* uncased BERT: 1, -1, 1 */
/* [UNK], [CLS], [SEP] and [PAD] must be in the vocabulary. */
FM_API fm_wordpiece *fm_wordpiece_load(const char *vocab_txt, const fm_wordpiece_opts *o);
FM_API fm_wordpiece *fm_wordpiece_from_memory(const char *vocab, size_t len, const fm_wordpiece_opts *o,
                                              const char *name);
FM_API void fm_wordpiece_free(fm_wordpiece *w);
FM_API int fm_wordpiece_vocab_size(const fm_wordpiece *w);
/* [CLS] tokens [SEP], the tokens cut so the whole is at most max_length (>= 2)
 * ids, as Hugging Face's truncation does. *ids is malloc'd. */
FM_API fm_status fm_wordpiece_encode(const fm_wordpiece *w, const char *text, size_t n, int max_length, int32_t **ids,
                                     int64_t *n_ids);
/* Token text of an id (borrowed), NULL when out of range. */
FM_API const char *fm_wordpiece_token(const fm_wordpiece *w, int32_t id);

#ifdef __cplusplus
}
#endif
#endif
