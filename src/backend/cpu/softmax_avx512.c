/* AVX-512 row kernels for softmax, log_softmax and the fused cross-entropy:
 * the 16-lane versions of softmax_avx2.c (same exp polynomial, fm_exp512).
 * Row sums use 16-lane accumulators, so they round differently from the
 * 8-lane AVX2 sums (tolerance, not bitwise: the op tests run at each level).
 * Tails are masked vector steps. Non-temporal stores need 64-byte aligned rows
 * here; a stream request on a row that is only 32-byte aligned stores
 * normally. */
#include <math.h>
#include <stdint.h>

#include "backend/cpu/simd_avx512.h"

void fm_softmax_row_f32_avx512(const float *x, float *y, int64_t n, int log_mode, int stream);
void fm_softmax_bwd_row_f32_avx512(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream);
void fm_ce_row_stats_f32_avx512(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out);
void fm_ce_bwd_row_f32_avx512(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream);
void fm_ce_bwd_fused_row_f32_avx512(const float *x, float *dx, int64_t n, double g, float shift, int stream);

#define STAGE_MAX 4096 /* widest row softmax stages on the stack when streaming */

static inline void store(float *p, __m512 v, int stream) { fm_store16(p, v, stream); }

/* Four independent max chains (max_ps latency, not loads, bounds one chain). */
static float row_max(const float *x, int64_t n) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(x + i + 32));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(x + i + 48));
    }
    for (; i + 16 <= n; i += 16) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    if (i < n) m1 = _mm512_max_ps(m1, _mm512_mask_loadu_ps(ninf, fm_tail16(n - i), x + i));
    float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
    return m == -INFINITY ? 0.0f : m;
}

/* sum of exp(x - m); writes exp(x - m) to y when y != NULL */
static float row_expsum(const float *x, float *y, int64_t n, float m) {
    __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = fm_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        if (y) _mm512_storeu_ps(y + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 t = fm_tail16(n - i);
        __m512 e = fm_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + i), vm));
        if (y) _mm512_mask_storeu_ps(y + i, t, e);
        acc = _mm512_mask_add_ps(acc, t, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

void fm_softmax_row_f32_avx512(const float *x, float *y, int64_t n, int log_mode, int stream) {
    stream = stream && ((uintptr_t)y & 63) == 0;
    float m = row_max(x, n);
    int64_t i = 0;
    if (log_mode) {
        /* (x - m) - log(s): subtracting m first keeps the low bits when |x| is large */
        float ls = logf(row_expsum(x, NULL, n, m));
        __m512 vm = _mm512_set1_ps(m), vl = _mm512_set1_ps(ls);
        for (; i + 16 <= n; i += 16) store(y + i, _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vl), stream);
        if (i < n) {
            __mmask16 t = fm_tail16(n - i);
            _mm512_mask_storeu_ps(y + i, t, _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + i), vm), vl));
        }
        if (stream) _mm_sfence();
        return;
    }
    _Alignas(64) float stage[STAGE_MAX];
    float *e = stream && n <= STAGE_MAX ? stage : y;
    float inv = 1.0f / row_expsum(x, e, n, m);
    __m512 vi = _mm512_set1_ps(inv);
    for (; i + 16 <= n; i += 16) store(y + i, _mm512_mul_ps(_mm512_loadu_ps(e + i), vi), e == stage);
    if (i < n) {
        __mmask16 t = fm_tail16(n - i);
        _mm512_mask_storeu_ps(y + i, t, _mm512_mul_ps(_mm512_maskz_loadu_ps(t, e + i), vi));
    }
    if (e == stage) _mm_sfence();
}

void fm_softmax_bwd_row_f32_avx512(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream) {
    stream = stream && ((uintptr_t)dx & 63) == 0;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0, full = n & ~(int64_t)15;
    __mmask16 t = fm_tail16(n - full);
    if (log_mode) {
        for (; i < full; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(dy + i));
        if (t) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(t, dy + i));
        __m512 vs = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
        for (i = 0; i < full; i += 16)
            store(dx + i, _mm512_fnmadd_ps(fm_exp512(_mm512_loadu_ps(y + i)), vs, _mm512_loadu_ps(dy + i)), stream);
        if (t)
            _mm512_mask_storeu_ps(dx + i, t, _mm512_fnmadd_ps(fm_exp512(_mm512_maskz_loadu_ps(t, y + i)), vs,
                                                             _mm512_maskz_loadu_ps(t, dy + i)));
        if (stream) _mm_sfence();
        return;
    }
    for (; i < full; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(dy + i), _mm512_loadu_ps(y + i), acc);
    if (t) acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(t, dy + i), _mm512_maskz_loadu_ps(t, y + i), acc);
    __m512 vs = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
    for (i = 0; i < full; i += 16)
        store(dx + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), _mm512_sub_ps(_mm512_loadu_ps(dy + i), vs)), stream);
    if (t)
        _mm512_mask_storeu_ps(dx + i, t, _mm512_mul_ps(_mm512_maskz_loadu_ps(t, y + i),
                                                      _mm512_sub_ps(_mm512_maskz_loadu_ps(t, dy + i), vs)));
    if (stream) _mm_sfence();
}

/* The row's max (0 for an all -inf row) and, with sumx, its sum: one chain each, so
 * the statistics and the fused backward below see the same max, NaNs included. */
static inline __attribute__((always_inline)) float ce_max_sum(const float *x, int64_t n, float *sumx) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 vm = ninf, va = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        vm = _mm512_max_ps(vm, v);
        if (sumx) va = _mm512_add_ps(va, v);
    }
    if (i < n) {
        __mmask16 t = fm_tail16(n - i);
        vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(ninf, t, x + i));
        if (sumx) va = _mm512_add_ps(va, _mm512_maskz_loadu_ps(t, x + i));
    }
    if (sumx) *sumx = _mm512_reduce_add_ps(va);
    float m = _mm512_reduce_max_ps(vm);
    return m == -INFINITY ? 0.0f : m;
}

void fm_ce_row_stats_f32_avx512(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out) {
    float m = ce_max_sum(x, n, sumx_out);
    *max_out = m;
    *sumexp_out = row_expsum(x, NULL, n, m);
}

void fm_ce_bwd_row_f32_avx512(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream) {
    stream = stream && ((uintptr_t)dx & 63) == 0;
    __m512 vm = _mm512_set1_ps(m), vsc = _mm512_set1_ps(scale), vsh = _mm512_set1_ps(shift);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        store(dx + i, _mm512_fmsub_ps(fm_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm)), vsc, vsh), stream);
    if (i < n) {
        __mmask16 t = fm_tail16(n - i);
        _mm512_mask_storeu_ps(dx + i, t, _mm512_fmsub_ps(fm_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + i), vm)),
                                                         vsc, vsh));
    }
    if (stream) _mm_sfence();
}

/* The whole backward row of cross-entropy, one exp per element: the 16-lane twin of
 * softmax_avx2.c's fm_ce_bwd_fused_row_f32_avx2 (see there). The same max, the same
 * exps summed in the same order and the same final fmsub as fm_ce_row_stats_f32_avx512
 * followed by fm_ce_bwd_row_f32_avx512, so the same bits (test_isa_kernels); rows too
 * wide to stage while streaming take those two calls. */
void fm_ce_bwd_fused_row_f32_avx512(const float *x, float *dx, int64_t n, double g, float shift, int stream) {
    stream = stream && ((uintptr_t)dx & 63) == 0;
    if (stream && n > STAGE_MAX) {
        float m, se, sx;
        fm_ce_row_stats_f32_avx512(x, n, &m, &se, &sx);
        fm_ce_bwd_row_f32_avx512(x, dx, n, m, (float)(g / se), shift, stream);
        return;
    }
    _Alignas(64) float stage[STAGE_MAX];
    float *e = stream ? stage : dx;
    float m = ce_max_sum(x, n, NULL);
    float scale = (float)(g / row_expsum(x, e, n, m));
    __m512 vsc = _mm512_set1_ps(scale), vsh = _mm512_set1_ps(shift);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) store(dx + i, _mm512_fmsub_ps(_mm512_loadu_ps(e + i), vsc, vsh), stream);
    if (i < n) {
        __mmask16 t = fm_tail16(n - i);
        _mm512_mask_storeu_ps(dx + i, t, _mm512_fmsub_ps(_mm512_maskz_loadu_ps(t, e + i), vsc, vsh));
    }
    if (stream) _mm_sfence();
}
