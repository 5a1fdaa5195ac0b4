/* The int8 panel product's epilogue on whole AVX-512 vectors, shared by the VNNI
 * (quant_panel_avx512.c) and AMX (quant_panel_amx.c) kernels: the scalar one's
 * arithmetic (fm_q8_store), so every kernel's floats equal the reference's.
 * Include only from files built with AVX-512 (the *_avx512.c and *_amx.c flags). */
#ifndef FATHOM_QUANT_EPILOGUE_AVX512_H
#define FATHOM_QUANT_EPILOGUE_AVX512_H
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/simd_avx512.h"

static inline __mmask16 lanes(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* The epilogue as its kernels read it: a copy of the fm_q8_epilogue in a local
 * variable of the kernel (q8_ep_copy) plus the product's N. fathom builds with
 * -fno-strict-aliasing, so through the shared struct every store to y made GCC load
 * ep, y, ldy, bias, act and row_scale again before the next (a quarter of the VNNI
 * kernel's samples at K = 128 went to those loads and their branches, perf); a local
 * whose address does not escape stays in registers. */
typedef struct q8_ep {
    fm_q8_epilogue e; /* zeros when the product has none (on false) */
    int64_t N;
    bool on;
    int32_t *C; /* without an epilogue: the integer sums, ldc apart */
    int64_t ldc;
} q8_ep;

static inline __attribute__((always_inline)) q8_ep q8_ep_copy(const fm_q8_pgemm *g) {
    q8_ep x;
    memset(&x, 0, sizeof x);
    if (g->ep) x.e = *g->ep;
    x.N = g->N;
    x.on = g->ep != NULL;
    x.C = g->C;
    x.ldc = g->ldc;
    return x;
}

/* A panel's column terms of the epilogue, the same for every row of a tile: computed once per
 * tile instead of once per row (at K = 128 the per-row form was about a fifth of the tile) */
typedef struct col16 {
    __mmask16 k;
    __m512i zs; /* a_zero * w_sum */
    __m512 s;   /* a_scale * w_scale */
    __m512 b;   /* bias (0 without) */
    __m512i ws; /* w_sum and w_scale, for per-row scales (ep->row_scale) */
    __m512 wsc;
} col16;

static inline __attribute__((always_inline)) col16 col_terms(const q8_ep *x, int64_t n) {
    col16 c;
    c.k = lanes(x->N - n);
    const fm_q8_epilogue *e = &x->e;
    if (!x->on) return c;
    c.ws = _mm512_maskz_loadu_epi32(c.k, e->w_sum + n);
    c.wsc = _mm512_maskz_loadu_ps(c.k, e->w_scale + n);
    c.zs = _mm512_mullo_epi32(_mm512_set1_epi32(e->a_zero), c.ws);
    c.s = _mm512_mul_ps(_mm512_set1_ps(e->a_scale), c.wsc);
    c.b = e->bias ? _mm512_maskz_loadu_ps(c.k, e->bias + n) : _mm512_setzero_ps();
    return c;
}

/* 16 outputs of row m from column n (n0 + 16 * j), the lanes of c.k valid */
static inline __attribute__((always_inline)) void store16(const q8_ep *x, int64_t m, int64_t n, const col16 *c, __m512i acc) {
    const fm_q8_epilogue *e = &x->e;
    if (!x->on) { _mm512_mask_storeu_epi32(x->C + m * x->ldc + n, c->k, acc); return; }
    __m512 y;
    if (e->row_scale) /* the same arithmetic with row m's scale and zero point */
        y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(e->row_scale[m]), c->wsc),
                          _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(e->row_zero[m]), c->ws))));
    else y = _mm512_mul_ps(c->s, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, c->zs)));
    if (e->bias) y = _mm512_add_ps(y, c->b);
    if (e->act == FM_QACT_RELU) y = _mm512_max_ps(y, _mm512_setzero_ps());
    else if (e->act == FM_QACT_GELU_TANH) y = fm_gelu_tanh512(y);
    else if (e->act == FM_QACT_GELU) y = fm_gelu512(y);
    _mm512_mask_storeu_ps(e->y + m * e->ldy + n, c->k, y);
}

#endif
