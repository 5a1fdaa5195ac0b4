/* One head of one row's attention over a paged KV cache (gpt_paged.c):
 * out = softmax(scale * q . k_t) . v_t over positions t in [0, n), where the
 * values of positions [b*BT, (b+1)*BT) are the BT x D rows at v[b], and their
 * keys are stored transposed, D x BT at k[b] (element e of position b*BT + u
 * at k[b][e * BT + u]), so that the scores of a block's positions are vector
 * lanes: D broadcast-FMAs give 8 or 16 of them, with no horizontal sums (the
 * row layout needed a dot product and a reduction tree per position, and
 * measured about 36 cycles a position at D = 32). This is the per-sequence
 * part of a batched decode step (it does not
 * shrink with batching: every row attends over its own cache), so it has an
 * AVX2/FMA version (FATHOM_ISA avx2) and an AVX-512 one (avx512: head sizes a
 * multiple of 16); the scalar one is the reference loop. They differ only in
 * summation order and exp (fm_exp256/512, about 1 ulp). */
#ifndef FATHOM_GPT_PAGED_ATTN_H
#define FATHOM_GPT_PAGED_ATTN_H
#include <stdint.h>

typedef struct fm_paged_head {
    const float *q;                /* [D] */
    const float *const *k, *const *v; /* per block of BT positions: k [D][BT], v [BT][D] */
    int D, BT;
    int64_t n;                     /* positions attended: 0..n-1 */
    float scale;
    float *scores;                 /* scratch, n floats */
    float *out;                    /* [D] */
    /* an f16 cache (fm_gpt_paged_new_ex's kv_dtype FM_F16): the same blocks in half
     * precision, read by the _f16 versions in place of k and v */
    const uint16_t *const *kh, *const *vh;
} fm_paged_head;

void fm_paged_head_f32_scalar(const fm_paged_head *a);
void fm_paged_head_f32_avx2(const fm_paged_head *a); /* only when fm_cpu_use_avx2() */
/* only when fm_cpu_use_avx512(); head sizes not a multiple of 16 or over 256 run the AVX2 version */
void fm_paged_head_f32_avx512(const fm_paged_head *a);
/* The same over f16 blocks (kh, vh): f32 sums of the widened halves. The scalar one is
 * the reference; the AVX2 one (F16C) also serves AVX-512 CPUs (the step reads half the
 * bytes of an f32 cache; a 512-bit version is not written). */
void fm_paged_head_f16_scalar(const fm_paged_head *a);
void fm_paged_head_f16_avx2(const fm_paged_head *a); /* only when fm_cpu_use_avx2() */
#endif
