/* AVX2/FMA row kernels for layer norm and RMS norm (f32), forward and backward.
 *
 * Compiled with -mavx2 -mfma and entered from norm_cpu.c only when
 * fm_cpu_use_avx2() is true. One call handles one contiguous row; a row of
 * normal width stays in L1, so the statistics pass and the output pass cost a
 * single trip to memory. With `stream` set (large outputs, 32-byte aligned rows
 * of a multiple of 8 floats) the output row goes out with non-temporal stores,
 * which skip the read-for-ownership of each output line: these kernels are
 * memory-bound and that is a quarter to a third of their traffic. The variance
 * is computed around the mean (two passes over the cached row) rather than as
 * E[x^2] - mean^2, which cancels badly for rows with a large offset. Backward
 * rows also add this row's contribution to per-chunk weight/bias gradient
 * accumulators owned by the caller. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "backend/cpu/simd_avx2.h"

/* Entry points; norm_cpu.c declares the same prototypes. */
void fm_layernorm_row_f32_avx2(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                               float *mean_out, float *rstd_out, int stream);
void fm_layernorm_bwd_row_f32_avx2(const float *dy, const float *x, const float *w, float mean, float rstd,
                                   float *dx, float *dw_acc, float *db_acc, int64_t n, int stream);
void fm_rmsnorm_row_f32_avx2(const float *x, const float *w, float *y, int64_t n, float eps, float *rstd_out,
                             int stream);
void fm_rmsnorm_bwd_row_f32_avx2(const float *dy, const float *x, const float *w, float rstd, float *dx,
                                 float *dw_acc, int64_t n, int stream);


static float row_sum(const float *x, int64_t n) {
    int64_t i;
    float s = fm_hsum256(fm_sum_lanes256(x, n, &i));
    for (; i < n; i++) s += x[i];
    return s;
}

/* sum((x - c)^2) */
static float row_sqdev(const float *x, int64_t n, float c) {
    int64_t i;
    float s = fm_hsum256(fm_sqdev_lanes256(x, n, c, &i));
    for (; i < n; i++) { float d = x[i] - c; s += d * d; }
    return s;
}

void fm_layernorm_row_f32_avx2(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                               float *mean_out, float *rstd_out, int stream) {
    float mean = row_sum(x, n) / (float)n;
    float rstd = 1.0f / sqrtf(row_sqdev(x, n, mean) / (float)n + eps);
    *mean_out = mean;
    *rstd_out = rstd;
    /* y = x*rstd - mean*rstd (then *w + b): one fma per element */
    __m256 vr = _mm256_set1_ps(rstd), vo = _mm256_set1_ps(-mean * rstd);
    int64_t i = 0;
    if (w && b) {
        for (; i + 8 <= n; i += 8) {
            __m256 h = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vr, vo);
            fm_store8(y + i, _mm256_fmadd_ps(h, _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)), stream);
        }
    } else if (w) {
        for (; i + 8 <= n; i += 8) {
            __m256 h = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vr, vo);
            fm_store8(y + i, _mm256_mul_ps(h, _mm256_loadu_ps(w + i)), stream);
        }
    } else if (b) {
        for (; i + 8 <= n; i += 8) {
            __m256 h = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vr, vo);
            fm_store8(y + i, _mm256_add_ps(h, _mm256_loadu_ps(b + i)), stream);
        }
    } else {
        for (; i + 8 <= n; i += 8) fm_store8(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vr, vo), stream);
    }
    for (; i < n; i++) { /* the vector loops' arithmetic, so that the tail rounds as they do (and as fused_avx2.c's add + norm row) */
        float h = fmaf(x[i], rstd, -mean * rstd);
        if (w) h = b ? fmaf(h, w[i], b[i]) : h * w[i];
        else if (b) h += b[i];
        y[i] = h;
    }
    if (stream) _mm_sfence();
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - mean) * rstd */
void fm_layernorm_bwd_row_f32_avx2(const float *dy, const float *x, const float *w, float mean, float rstd,
                                   float *dx, float *dw_acc, float *db_acc, int64_t n, int stream) {
    __m256 vr = _mm256_set1_ps(rstd), vo = _mm256_set1_ps(-mean * rstd);
    __m256 sg = _mm256_setzero_ps(), sgx = sg;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_loadu_ps(dy + i);
        __m256 h = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vr, vo);
        __m256 g = w ? _mm256_mul_ps(d, _mm256_loadu_ps(w + i)) : d;
        sg = _mm256_add_ps(sg, g);
        sgx = _mm256_fmadd_ps(g, h, sgx);
        if (dw_acc) _mm256_storeu_ps(dw_acc + i, _mm256_fmadd_ps(d, h, _mm256_loadu_ps(dw_acc + i)));
        if (db_acc) _mm256_storeu_ps(db_acc + i, _mm256_add_ps(d, _mm256_loadu_ps(db_acc + i)));
    }
    float s_g = fm_hsum256(sg), s_gx = fm_hsum256(sgx);
    for (; i < n; i++) {
        float h = (x[i] - mean) * rstd, g = w ? dy[i] * w[i] : dy[i];
        s_g += g;
        s_gx += g * h;
        if (dw_acc) dw_acc[i] += dy[i] * h;
        if (db_acc) db_acc[i] += dy[i];
    }
    float inv_n = 1.0f / (float)n, a = s_g * inv_n, c = s_gx * inv_n;
    __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 d = _mm256_loadu_ps(dy + i);
        __m256 h = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vr, vo);
        __m256 g = w ? _mm256_mul_ps(d, _mm256_loadu_ps(w + i)) : d;
        __m256 t = _mm256_fnmadd_ps(h, vc, _mm256_sub_ps(g, va));
        fm_store8(dx + i, _mm256_mul_ps(t, vr), stream);
    }
    for (; i < n; i++) {
        float h = (x[i] - mean) * rstd, g = w ? dy[i] * w[i] : dy[i];
        dx[i] = rstd * (g - a - h * c);
    }
    if (stream) _mm_sfence();
}

void fm_rmsnorm_row_f32_avx2(const float *x, const float *w, float *y, int64_t n, float eps, float *rstd_out,
                             int stream) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
    }
    float ss = fm_hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++) ss += x[i] * x[i];
    float rstd = 1.0f / sqrtf(ss / (float)n + eps);
    *rstd_out = rstd;
    __m256 vr = _mm256_set1_ps(rstd);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 h = _mm256_mul_ps(_mm256_loadu_ps(x + i), vr);
        if (w) h = _mm256_mul_ps(h, _mm256_loadu_ps(w + i));
        fm_store8(y + i, h, stream);
    }
    for (; i < n; i++) y[i] = x[i] * rstd * (w ? w[i] : 1.0f);
    if (stream) _mm_sfence();
}

/* dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd */
void fm_rmsnorm_bwd_row_f32_avx2(const float *dy, const float *x, const float *w, float rstd, float *dx,
                                 float *dw_acc, int64_t n, int stream) {
    __m256 vr = _mm256_set1_ps(rstd), sgx = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_loadu_ps(dy + i);
        __m256 h = _mm256_mul_ps(_mm256_loadu_ps(x + i), vr);
        __m256 g = w ? _mm256_mul_ps(d, _mm256_loadu_ps(w + i)) : d;
        sgx = _mm256_fmadd_ps(g, h, sgx);
        if (dw_acc) _mm256_storeu_ps(dw_acc + i, _mm256_fmadd_ps(d, h, _mm256_loadu_ps(dw_acc + i)));
    }
    float s_gx = fm_hsum256(sgx);
    for (; i < n; i++) {
        float h = x[i] * rstd, g = w ? dy[i] * w[i] : dy[i];
        s_gx += g * h;
        if (dw_acc) dw_acc[i] += dy[i] * h;
    }
    float c = s_gx / (float)n;
    __m256 vc = _mm256_set1_ps(c);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 d = _mm256_loadu_ps(dy + i);
        __m256 h = _mm256_mul_ps(_mm256_loadu_ps(x + i), vr);
        __m256 g = w ? _mm256_mul_ps(d, _mm256_loadu_ps(w + i)) : d;
        fm_store8(dx + i, _mm256_mul_ps(_mm256_fnmadd_ps(h, vc, g), vr), stream);
    }
    for (; i < n; i++) {
        float h = x[i] * rstd, g = w ? dy[i] * w[i] : dy[i];
        dx[i] = rstd * (g - h * c);
    }
    if (stream) _mm_sfence();
}
