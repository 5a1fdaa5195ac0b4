/* AVX2/FMA row kernels of the fused transformer helpers (f32): bias + GELU(tanh)
 * and residual add + layer norm, forward and backward. Entered from fused_cpu.c
 * only when fm_cpu_use_avx2() is true; one call handles one contiguous row.
 *
 * add + layer norm: the sum row is written once and then read back from L1 for
 * the statistics and the output, so the residual stream makes one trip to
 * memory instead of the two that a separate add and norm cost. The statistics
 * are always taken over the stored sum, with the same accumulator layout
 * whether or not there was anything to add: a norm over x alone (h == NULL) is
 * bitwise the norm of a fused call whose sum equals x. Checkpointed forwards
 * rely on that to recompute a norm without the add and get the same numbers.
 * The backward adds the gradient that reached the sum to the norm's input
 * gradient after rounding the latter, so the total is bitwise what autograd's
 * separate accumulation of the two would give. */
#include <math.h>
#include <stdint.h>

#include "backend/cpu/simd_avx2.h"

/* Entry points; fused_cpu.c declares the same prototypes. */
void fm_bias_gelu_row_f32_avx2(const float *x, const float *b, float *y, int64_t n);
void fm_bias_gelu_bwd_row_f32_avx2(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                   int64_t n);
void fm_add_ln_row_f32_avx2(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                            int64_t n, float eps, float *mean_out, float *rstd_out);
void fm_add_ln_bwd_row_f32_avx2(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                float rstd, float *g, float *dw_acc, float *db_acc, int64_t n);

static const float k_2sqrt2_pi = 1.5957691216057308f; /* 2 sqrt(2/pi) */
static const float k_cubic = 0.044715f;

static inline __m256i lanes_below(int64_t r) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* the forward GELU is simd_avx2.h's fm_gelu_tanh256, the elementwise op's */
/* d/dv: with s = 1/(1+e) and q = e s = 1 - s, s (1 + q 2u'), 2u' = 2 sqrt(2/pi)(1 + 3*0.044715 v^2) */
static inline __m256 dgelu8(__m256 v) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 v2 = _mm256_mul_ps(v, v), kv = _mm256_mul_ps(v, _mm256_set1_ps(k_2sqrt2_pi));
    __m256 two_u = _mm256_mul_ps(kv, _mm256_fmadd_ps(_mm256_set1_ps(k_cubic), v2, one));
    __m256 e = fm_exp256(_mm256_sub_ps(_mm256_setzero_ps(), two_u));
    __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    /* e = inf (far left tail) makes e*s NaN; q is 1 there */
    __m256 q = _mm256_min_ps(_mm256_mul_ps(e, s), one);
    __m256 du = _mm256_mul_ps(kv, _mm256_fmadd_ps(_mm256_set1_ps(3.0f * k_cubic), v2, one));
    return _mm256_mul_ps(s, _mm256_fmadd_ps(q, du, one));
}

void fm_bias_gelu_row_f32_avx2(const float *x, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, fm_gelu_tanh256(_mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(b + i))));
    if (i < n) {
        __m256i m = lanes_below(n - i);
        __m256 v = _mm256_add_ps(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(b + i, m));
        _mm256_maskstore_ps(y + i, m, fm_gelu_tanh256(v));
    }
}

void fm_bias_gelu_bwd_row_f32_avx2(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                   int64_t n) {
    int64_t i = 0;
#define BG_BWD8(ACC)                                                                            \
    for (; i + 8 <= n; i += 8) {                                                                \
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(b + i));               \
        __m256 d = _mm256_mul_ps(_mm256_loadu_ps(dy + i), dgelu8(v));                           \
        _mm256_storeu_ps(dx + i, d);                                                            \
        if (ACC) _mm256_storeu_ps(db_acc + i, _mm256_add_ps(_mm256_loadu_ps(db_acc + i), d));   \
    }
    if (db_acc) BG_BWD8(1)
    else BG_BWD8(0)
#undef BG_BWD8
    if (i < n) {
        __m256i m = lanes_below(n - i);
        __m256 v = _mm256_add_ps(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(b + i, m));
        __m256 d = _mm256_mul_ps(_mm256_maskload_ps(dy + i, m), dgelu8(v));
        _mm256_maskstore_ps(dx + i, m, d);
        if (db_acc) _mm256_maskstore_ps(db_acc + i, m, _mm256_add_ps(_mm256_maskload_ps(db_acc + i, m), d));
    }
}

/* Sum of the row x (+ h, stored to s when h is given). Without h it is the
 * layer norm kernel's row sum (fm_sum_lanes256); with h the accumulators see the
 * sums x + h in that same order, so a recomputed norm (h = NULL over the stored
 * sum) is bitwise the fused one. */
static float sum_row(const float *x, const float *h, float *s, int64_t n) {
    int64_t i = 0;
    if (!h) {
        float t = fm_hsum256(fm_sum_lanes256(x, n, &i));
        for (; i < n; i++) t += x[i];
        return t;
    }
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        __m256 v0 = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(h + i));
        __m256 v1 = _mm256_add_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(h + i + 8));
        __m256 v2 = _mm256_add_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(h + i + 16));
        __m256 v3 = _mm256_add_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(h + i + 24));
        _mm256_storeu_ps(s + i, v0);
        _mm256_storeu_ps(s + i + 8, v1);
        _mm256_storeu_ps(s + i + 16, v2);
        _mm256_storeu_ps(s + i + 24, v3);
        a0 = _mm256_add_ps(a0, v0);
        a1 = _mm256_add_ps(a1, v1);
        a2 = _mm256_add_ps(a2, v2);
        a3 = _mm256_add_ps(a3, v3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v0 = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(h + i));
        _mm256_storeu_ps(s + i, v0);
        a0 = _mm256_add_ps(a0, v0);
    }
    float t = fm_hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) {
        float v = x[i] + h[i];
        s[i] = v;
        t += v;
    }
    return t;
}

/* sum((s - c)^2), as the layer norm kernel computes it (simd_avx2.h) */
static float sqdev_row(const float *s, int64_t n, float c) {
    int64_t i;
    float t = fm_hsum256(fm_sqdev_lanes256(s, n, c, &i));
    for (; i < n; i++) {
        float d = s[i] - c;
        t += d * d;
    }
    return t;
}

void fm_add_ln_row_f32_avx2(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                            int64_t n, float eps, float *mean_out, float *rstd_out) {
    float mean = sum_row(x, h, s, n) / (float)n;
    const float *src = h ? s : x;
    float rstd = 1.0f / sqrtf(sqdev_row(src, n, mean) / (float)n + eps);
    *mean_out = mean;
    *rstd_out = rstd;
    /* xhat = s rstd - mean rstd: one fma; the affine variants get loops of their own */
    const __m256 vr = _mm256_set1_ps(rstd), vo = _mm256_set1_ps(-mean * rstd);
    int64_t i = 0;
#define XH(k) _mm256_fmadd_ps(_mm256_loadu_ps(src + (k)), vr, vo)
    if (w && b) {
        for (; i + 16 <= n; i += 16) {
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(XH(i), _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
            _mm256_storeu_ps(y + i + 8, _mm256_fmadd_ps(XH(i + 8), _mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(b + i + 8)));
        }
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(XH(i), _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
    } else if (w) {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(XH(i), _mm256_loadu_ps(w + i)));
    } else if (b) {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(XH(i), _mm256_loadu_ps(b + i)));
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, XH(i));
    }
#undef XH
    for (; i < n; i++) {
        float t = fmaf(src[i], rstd, -mean * rstd);
        if (w) t = b ? fmaf(t, w[i], b[i]) : t * w[i];
        else if (b) t += b[i];
        y[i] = t;
    }
}

/* g = dsum + rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = dy w; dy == NULL: g = dsum.
 * The weight/accumulator/dsum cases get loops of their own (ACC_*: compile-time flags), with the
 * same arithmetic in each, so which pointers are present never changes a value. */
#define ALN_PASS1(W, DW, DB)                                                                       \
    for (; i + 8 <= n; i += 8) {                                                                   \
        __m256 d = _mm256_loadu_ps(dy + i), xh = _mm256_fmadd_ps(_mm256_loadu_ps(s + i), vr, vo);  \
        __m256 gw = (W) ? _mm256_mul_ps(d, _mm256_loadu_ps(w + i)) : d;                            \
        sg = _mm256_add_ps(sg, gw);                                                                \
        sgx = _mm256_fmadd_ps(gw, xh, sgx);                                                        \
        if (DW) _mm256_storeu_ps(dw_acc + i, _mm256_fmadd_ps(d, xh, _mm256_loadu_ps(dw_acc + i))); \
        if (DB) _mm256_storeu_ps(db_acc + i, _mm256_add_ps(_mm256_loadu_ps(db_acc + i), d));       \
    }
#define ALN_PASS2(W, DS)                                                                           \
    for (i = 0; i + 8 <= n; i += 8) {                                                              \
        __m256 d = _mm256_loadu_ps(dy + i), xh = _mm256_fmadd_ps(_mm256_loadu_ps(s + i), vr, vo);  \
        __m256 gw = (W) ? _mm256_mul_ps(d, _mm256_loadu_ps(w + i)) : d;                            \
        __m256 dx = _mm256_mul_ps(_mm256_fnmadd_ps(xh, vc, _mm256_sub_ps(gw, va)), vr);            \
        if (DS) dx = _mm256_add_ps(dx, _mm256_loadu_ps(dsum + i));                                 \
        _mm256_storeu_ps(g + i, dx);                                                               \
    }

void fm_add_ln_bwd_row_f32_avx2(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                float rstd, float *g, float *dw_acc, float *db_acc, int64_t n) {
    int64_t i = 0;
    if (!dy) {
        for (; i < n; i++) g[i] = dsum ? dsum[i] : 0.0f;
        return;
    }
    const __m256 vr = _mm256_set1_ps(rstd), vo = _mm256_set1_ps(-mean * rstd);
    __m256 sg = _mm256_setzero_ps(), sgx = sg;
    if (w && dw_acc && db_acc) ALN_PASS1(1, 1, 1)
    else if (w) ALN_PASS1(1, dw_acc != NULL, db_acc != NULL)
    else ALN_PASS1(0, 0, db_acc != NULL)
    float t_g = fm_hsum256(sg), t_gx = fm_hsum256(sgx);
    for (; i < n; i++) {
        float xh = fmaf(s[i], rstd, -mean * rstd), gw = w ? dy[i] * w[i] : dy[i];
        t_g += gw;
        t_gx = fmaf(gw, xh, t_gx);
        if (dw_acc) dw_acc[i] = fmaf(dy[i], xh, dw_acc[i]);
        if (db_acc) db_acc[i] += dy[i];
    }
    const float a = t_g / (float)n, c = t_gx / (float)n;
    const __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
    if (w && dsum) ALN_PASS2(1, 1)
    else if (w) ALN_PASS2(1, 0)
    else if (dsum) ALN_PASS2(0, 1)
    else ALN_PASS2(0, 0)
    for (; i < n; i++) {
        float xh = fmaf(s[i], rstd, -mean * rstd), gw = w ? dy[i] * w[i] : dy[i];
        float dx = fmaf(-xh, c, gw - a) * rstd;
        g[i] = dsum ? dx + dsum[i] : dx;
    }
}
#undef ALN_PASS1
#undef ALN_PASS2
