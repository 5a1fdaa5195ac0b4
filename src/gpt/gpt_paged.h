/* Batched decoding over a block-allocated (paged) KV cache, for continuous
 * batching (src/serve/textgen.c). Not a public interface.
 *
 * The cache is a pool of blocks of `block_tokens` positions per layer; each
 * sequence holds a table of the blocks it uses, so memory follows the tokens
 * actually cached, not block_size per sequence. One step feeds one or more
 * tokens to each of n sequences (each at its own position: a decoding sequence
 * takes one, a prompt being prefilled a chunk) as one batch through the linear
 * layers, and returns each sequence's last logits: sequences join and leave
 * between steps. */
#ifndef FATHOM_GPT_PAGED_H
#define FATHOM_GPT_PAGED_H
#include "fathom/gpt.h"

typedef struct fm_gpt_paged fm_gpt_paged;

/* n_blocks blocks of block_tokens positions. The model must be f32 and on the CPU. */
fm_gpt_paged *fm_gpt_paged_new(const fm_gpt *m, int n_blocks, int block_tokens, int max_seqs);

/* A linear layer's weight in the form a quantized graph keeps it (fathom quantize,
 * docs/QUANTIZE.md), for the paged step to run in place of the model's f32 weight:
 * INT8: w the panels (i8 [ceil(N/16), ceil(K/4), 16, 4]), scale f32 [N], aux the row
 * sums i32 [N] (fm_qlinear_int8_packed, activations quantized per step); INT4: w u8
 * [N, K/2], scale f16 [N, K/group], aux the f16 offsets (or NULL) (fm_qlinear_int4).
 * F32: none (the model's weight, packed by the cache). */
typedef enum fm_paged_lin_kind { FM_PAGED_LIN_F32 = 0, FM_PAGED_LIN_INT8, FM_PAGED_LIN_INT4 } fm_paged_lin_kind;
typedef struct fm_paged_linear {
    fm_paged_lin_kind kind;
    fm_tensor *w, *scale, *aux;
    int group;
} fm_paged_linear;
/* Per linear (n_layer * 4 + 1: per layer qkv, proj, fc, fc2 (the MLP's second), then
 * the output head) and the token table (INT4; INT8: the panels and scales, read by
 * fm_qembedding_int8; or F32: the model's wte). */
typedef struct fm_paged_weights {
    int n_lin;
    fm_paged_linear *lin;
    fm_paged_linear emb;
} fm_paged_weights;
void fm_paged_weights_free(fm_paged_weights *q);
/* fm_gpt_paged_new with some weights in quantized form (q may be NULL: all f32; the
 * cache takes its own references). The model's tensors for those weights are not
 * read (gpt_new_bound's placeholders). kv_dtype: the blocks' dtype, FM_F32 or FM_F16
 * (half the memory a block takes and half the bytes a step reads; keys and values
 * rounded to f16 as they are cached, the attention's sums in f32). */
fm_gpt_paged *fm_gpt_paged_new_ex(const fm_gpt *m, const fm_paged_weights *q, int n_blocks, int block_tokens, int max_seqs, fm_dtype kv_dtype);
void fm_gpt_paged_free(fm_gpt_paged *p);
int fm_gpt_paged_free_blocks(const fm_gpt_paged *p);
int fm_gpt_paged_total_blocks(const fm_gpt_paged *p);
int fm_gpt_paged_block_tokens(const fm_gpt_paged *p);
/* one block's keys and values over all layers, in bytes (half as many for f16 blocks) */
size_t fm_gpt_paged_block_bytes(const fm_gpt_paged *p);
/* A sequence slot (-1 when all max_seqs are taken); closing frees its blocks. */
int fm_gpt_paged_open(fm_gpt_paged *p);
void fm_gpt_paged_close(fm_gpt_paged *p, int seq);
int64_t fm_gpt_paged_len(const fm_gpt_paged *p, int seq);
/* Blocks a sequence still needs before it can cache one more token (0 or 1), or k more. */
int fm_gpt_paged_need(const fm_gpt_paged *p, int seq);
int fm_gpt_paged_need_n(const fm_gpt_paged *p, int seq, int k);
/* One step: token[i] appended to seqs[i] at its next position; logits [n, V] (f32)
 * written. Needs one free block per sequence whose last block is full (check
 * fm_gpt_paged_need first); FM_ERR_OOM otherwise, with nothing changed. */
fm_status fm_gpt_paged_step(fm_gpt *m, fm_gpt_paged *p, int n, const int *seqs, const int32_t *tokens, float *logits);
/* The same with counts[i] >= 1 tokens for seqs[i] (tokens: every sequence's in turn,
 * in position order; the whole step must fit in the context): a prompt chunk in
 * one forward. logits [n, V]: each sequence's last token. */
fm_status fm_gpt_paged_step_n(fm_gpt *m, fm_gpt_paged *p, int n, const int *seqs, const int *counts, const int32_t *tokens,
                              float *logits);
/* Steps whose attention has fewer multiply-adds than this (default 65536) run it on
 * the calling thread; larger ones split its (row, kv head) pairs over the pool. For
 * the tests, which run models too small to reach the default (process-wide). */
void fm_gpt_paged_set_parallel_min(int64_t multiply_adds);

#endif
