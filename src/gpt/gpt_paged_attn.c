/* The scalar paged attention head (gpt_paged_attn.h): the reference for the
 * SIMD versions, and what FATHOM_ISA=scalar runs. */
#include <math.h>
#include <string.h>

#include "fathom/tensor.h" /* fm_f16_to_f32 */
#include "gpt/gpt_paged_attn.h"

void fm_paged_head_f32_scalar(const fm_paged_head *a) {
    const int D = a->D, BT = a->BT;
    float *sc = a->scores, mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < a->n; t++) {
        const float *kt = a->k[t / BT] + t % BT; /* the block's keys, transposed: stride BT */
        float s = 0.0f;
        for (int e = 0; e < D; e++) s += a->q[e] * kt[(int64_t)e * BT];
        sc[t] = s * a->scale;
        if (sc[t] > mx) mx = sc[t];
    }
    for (int64_t t = 0; t < a->n; t++) sum += sc[t] = expf(sc[t] - mx);
    memset(a->out, 0, sizeof(float) * (size_t)D);
    for (int64_t t = 0; t < a->n; t++) {
        const float *vt = a->v[t / BT] + (t % BT) * D;
        float w = sc[t] / sum;
        for (int e = 0; e < D; e++) a->out[e] += w * vt[e];
    }
}

void fm_paged_head_f16_scalar(const fm_paged_head *a) {
    const int D = a->D, BT = a->BT;
    float *sc = a->scores, mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < a->n; t++) {
        const uint16_t *kt = a->kh[t / BT] + t % BT; /* transposed, as the f32 blocks */
        float s = 0.0f;
        for (int e = 0; e < D; e++) s += a->q[e] * fm_f16_to_f32(kt[(int64_t)e * BT]);
        sc[t] = s * a->scale;
        if (sc[t] > mx) mx = sc[t];
    }
    for (int64_t t = 0; t < a->n; t++) sum += sc[t] = expf(sc[t] - mx);
    memset(a->out, 0, sizeof(float) * (size_t)D);
    for (int64_t t = 0; t < a->n; t++) {
        const uint16_t *vt = a->vh[t / BT] + (t % BT) * D;
        float w = sc[t] / sum;
        for (int e = 0; e < D; e++) a->out[e] += w * fm_f16_to_f32(vt[e]);
    }
}
