/* AVX2 row kernels for softmax, log_softmax and the fused cross-entropy
 * (entered from softmax_cpu.c after run-time detection). Row sums go through
 * 8-lane float accumulators, then a horizontal sum.
 * With `stream` set (large outputs, 32-byte aligned rows of a multiple of 8)
 * the output row is written with non-temporal stores: these kernels are
 * memory-bound, and streaming skips the read-for-ownership of each output line,
 * a third of the traffic of a one-input one-output pass. Softmax then stages
 * the exponentials in a stack buffer so the output is written only once. */
#include <math.h>
#include <stdint.h>

#include "backend/cpu/simd_avx2.h"

void fm_softmax_row_f32_avx2(const float *x, float *y, int64_t n, int log_mode, int stream);
void fm_softmax_bwd_row_f32_avx2(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream);
void fm_ce_row_stats_f32_avx2(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out);
void fm_ce_bwd_row_f32_avx2(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream);
void fm_ce_bwd_fused_row_f32_avx2(const float *x, float *dx, int64_t n, double g, float shift, int stream);

#define STAGE_MAX 4096 /* widest row softmax stages on the stack when streaming */


/* Four independent max chains: one chain is bound by max_ps latency, not loads. */
static float row_max(const float *x, int64_t n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + i + 16));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + i + 24));
    }
    for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    float m = fm_hmax256(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m == -INFINITY ? 0.0f : m;
}

/* sum of exp(x - m); writes exp(x - m) to y when y != NULL */
static float row_expsum(const float *x, float *y, int64_t n, float m) {
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = fm_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        if (y) _mm256_storeu_ps(y + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = fm_hsum256(acc);
    for (; i < n; i++) {
        float e = expf(x[i] - m);
        if (y) y[i] = e;
        s += e;
    }
    return s;
}

void fm_softmax_row_f32_avx2(const float *x, float *y, int64_t n, int log_mode, int stream) {
    float m = row_max(x, n);
    if (log_mode) {
        /* (x - m) - log(s): subtracting m first keeps the low bits when |x| is large */
        float ls = logf(row_expsum(x, NULL, n, m));
        __m256 vm = _mm256_set1_ps(m), vl = _mm256_set1_ps(ls);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            fm_store8(y + i, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vl), stream);
        for (; i < n; i++) y[i] = (x[i] - m) - ls;
        if (stream) _mm_sfence();
        return;
    }
    _Alignas(32) float stage[STAGE_MAX];
    float *e = stream && n <= STAGE_MAX ? stage : y;
    float s = row_expsum(x, e, n, m);
    float inv = 1.0f / s;
    __m256 vi = _mm256_set1_ps(inv);
    int64_t i = 0;
    if (e == stage) {
        for (; i + 8 <= n; i += 8) _mm256_stream_ps(y + i, _mm256_mul_ps(_mm256_load_ps(stage + i), vi));
        for (; i < n; i++) y[i] = stage[i] * inv;
        _mm_sfence();
        return;
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vi));
    for (; i < n; i++) y[i] *= inv;
}

void fm_softmax_bwd_row_f32_avx2(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    if (log_mode) {
        for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(dy + i));
        float s = fm_hsum256(acc);
        for (; i < n; i++) s += dy[i];
        __m256 vs = _mm256_set1_ps(s);
        for (i = 0; i + 8 <= n; i += 8)
            fm_store8(dx + i, _mm256_fnmadd_ps(fm_exp256(_mm256_loadu_ps(y + i)), vs, _mm256_loadu_ps(dy + i)), stream);
        for (; i < n; i++) dx[i] = dy[i] - expf(y[i]) * s;
        if (stream) _mm_sfence();
        return;
    }
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(y + i), acc);
    float s = fm_hsum256(acc);
    for (; i < n; i++) s += dy[i] * y[i];
    __m256 vs = _mm256_set1_ps(s);
    for (i = 0; i + 8 <= n; i += 8)
        fm_store8(dx + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), _mm256_sub_ps(_mm256_loadu_ps(dy + i), vs)), stream);
    for (; i < n; i++) dx[i] = y[i] * (dy[i] - s);
    if (stream) _mm_sfence();
}

void fm_ce_row_stats_f32_avx2(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out) {
    __m256 vm = _mm256_set1_ps(-INFINITY), va = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        vm = _mm256_max_ps(vm, v);
        va = _mm256_add_ps(va, v);
    }
    float m = fm_hmax256(vm), a = fm_hsum256(va);
    for (; i < n; i++) { m = x[i] > m ? x[i] : m; a += x[i]; }
    if (m == -INFINITY) m = 0;
    *max_out = m;
    *sumx_out = a;
    *sumexp_out = row_expsum(x, NULL, n, m);
}

void fm_ce_bwd_row_f32_avx2(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream) {
    __m256 vm = _mm256_set1_ps(m), vsc = _mm256_set1_ps(scale), vsh = _mm256_set1_ps(shift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        fm_store8(dx + i, _mm256_fmsub_ps(fm_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)), vsc, vsh), stream);
    for (; i < n; i++) dx[i] = expf(x[i] - m) * scale - shift;
    if (stream) _mm_sfence();
}

/* The whole backward row of cross-entropy: dx = exp(x - m) * (g / sum exp(x - m)) - shift.
 * fm_ce_row_stats_f32_avx2 followed by fm_ce_bwd_row_f32_avx2 evaluate each exp twice
 * (once for the sum, once for dx); here the exponentials of the sum pass are kept (staged
 * on the stack when dx is streamed, else in dx itself) and scaled in a third pass over
 * them, which runs from L1. The same max, the same exps summed in the same order and
 * the same final fmsub: the same bits as the two calls. Rows too wide to stage
 * while streaming take the two calls, so dx is still written once. */
void fm_ce_bwd_fused_row_f32_avx2(const float *x, float *dx, int64_t n, double g, float shift, int stream) {
    if (stream && n > STAGE_MAX) {
        float m, se, sx;
        fm_ce_row_stats_f32_avx2(x, n, &m, &se, &sx);
        fm_ce_bwd_row_f32_avx2(x, dx, n, m, (float)(g / se), shift, stream);
        return;
    }
    _Alignas(32) float stage[STAGE_MAX];
    float *e = stream ? stage : dx;
    float m = row_max(x, n);
    float scale = (float)(g / row_expsum(x, e, n, m));
    __m256 vsc = _mm256_set1_ps(scale), vsh = _mm256_set1_ps(shift);
    int64_t i = 0;
    if (stream) {
        for (; i + 8 <= n; i += 8) _mm256_stream_ps(dx + i, _mm256_fmsub_ps(_mm256_load_ps(stage + i), vsc, vsh));
        for (; i < n; i++) dx[i] = stage[i] * scale - shift;
        _mm_sfence();
        return;
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dx + i, _mm256_fmsub_ps(_mm256_loadu_ps(dx + i), vsc, vsh));
    for (; i < n; i++) dx[i] = dx[i] * scale - shift;
}
