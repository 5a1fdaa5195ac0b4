/* The scalar paged attention head (gpt_paged_attn.h): the reference for the
 * SIMD versions, and what FATHOM_ISA=scalar runs. */
#include <math.h>
#include <string.h>

#include "gpt/gpt_paged_attn.h"

/* q . k in 8 partial sums, which the compiler turns into vector lanes (a single
 * running sum is a dependency chain it may not reorder). */
static float dot(const float *a, const float *b, int D) {
    float acc[8] = {0};
    int e = 0;
    for (; e + 8 <= D; e += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[e + k] * b[e + k];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; e < D; e++) s += a[e] * b[e];
    return s;
}

void fm_paged_head_f32_scalar(const fm_paged_head *a) {
    const int D = a->D, BT = a->BT;
    float *sc = a->scores, mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < a->n; t++) {
        sc[t] = dot(a->q, a->k[t / BT] + (t % BT) * D, D) * a->scale;
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
