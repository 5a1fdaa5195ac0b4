/* The reference sampling step that test_gpt_sample.c checks fm_gpt_sample against and
 * bench_gpt_sample.c times as the previous sampler's: given the logits already in the
 * specified order (descending, ties by index), keep the top k, soften at the
 * temperature, keep the smallest prefix holding top_p of the mass, and draw with the
 * sampler's Philox stream (key seed, counter "gene" / draw). pr: room for V doubles. */
#ifndef FATHOM_TESTS_GPT_SAMPLE_REF_H
#define FATHOM_TESTS_GPT_SAMPLE_REF_H
#include <math.h>
#include <stdint.h>

#include "fathom/gpt.h"
#include "fathom/tensor.h"

typedef struct { float v; int i; } scored;

static inline int ref_sample_in_order(const scored *s, int V, const fm_gpt_sample_params *p, uint64_t draw, double *pr) {
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double mx = s[0].v / p->temperature, z = 0;
    for (int i = 0; i < n; i++) { pr[i] = exp(s[i].v / p->temperature - mx); z += pr[i]; }
    for (int i = 0; i < n; i++) pr[i] /= z;
    if (p->top_p > 0 && p->top_p < 1) {
        double c = 0;
        int k = 0;
        while (k < n) { c += pr[k++]; if (c >= p->top_p) break; }
        n = k;
        z = 0;
        for (int i = 0; i < n; i++) z += pr[i];
        for (int i = 0; i < n; i++) pr[i] /= z;
    }
    uint32_t r[4];
    fm_philox4x32(p->seed, 0x67656e65ull, draw, r);
    double u = (double)(((uint64_t)r[0] << 21) ^ r[1]) / 9007199254740992.0;
    u = fmod(u, 1.0);
    int tok = s[n - 1].i;
    double c = 0;
    for (int i = 0; i < n; i++) {
        c += pr[i];
        if (u < c) { tok = s[i].i; break; }
    }
    return tok;
}

#endif
