/* The scalar paged attention head (gpt_paged_attn.h): the reference for the
 * SIMD versions, and what FATHOM_ISA=scalar runs. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "fathom/tensor.h" /* fm_f16_to_f32 */
#include "gpt/gpt_paged_attn.h"

/* block b's element at off: an f32 block's, or an f16 block's widened (half) */
static inline float key1(const fm_paged_head *a, const bool half, int64_t b, int64_t off) {
    return half ? fm_f16_to_f32(a->kh[b][off]) : a->k[b][off];
}
static inline float val1(const fm_paged_head *a, const bool half, int64_t b, int64_t off) {
    return half ? fm_f16_to_f32(a->vh[b][off]) : a->v[b][off];
}

/* the head over f32 blocks (half false) or f16 blocks (half true), the same loops */
static inline void head(const fm_paged_head *a, const bool half) {
    const int D = a->D, BT = a->BT;
    float *sc = a->scores, mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < a->n; t++) {
        const int64_t b = t / BT, u = t % BT; /* the block's keys, transposed: stride BT */
        float s = 0.0f;
        for (int e = 0; e < D; e++) s += a->q[e] * key1(a, half, b, u + (int64_t)e * BT);
        sc[t] = s * a->scale;
        if (sc[t] > mx) mx = sc[t];
    }
    for (int64_t t = 0; t < a->n; t++) sum += sc[t] = expf(sc[t] - mx);
    memset(a->out, 0, sizeof(float) * (size_t)D);
    for (int64_t t = 0; t < a->n; t++) {
        const int64_t b = t / BT, row = (t % BT) * D;
        float w = sc[t] / sum;
        for (int e = 0; e < D; e++) a->out[e] += w * val1(a, half, b, row + e);
    }
}

void fm_paged_head_f32_scalar(const fm_paged_head *a) { head(a, false); }

void fm_paged_head_f16_scalar(const fm_paged_head *a) { head(a, true); }
