/* AVX-512 row kernels for layer norm and RMS norm (f32), forward and backward:
 * the 16-lane versions of norm_avx2.c (see there for the method: variance
 * around the mean, one FMA per output, the caller's weight/bias gradient
 * accumulators). Row sums run in 16 lanes, so they round differently from the
 * 8-lane AVX2 sums (tolerance, not bitwise). Tails are masked vector steps.
 * Non-temporal stores need 64-byte aligned rows; a stream request on a row
 * that is only 32-byte aligned stores normally. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "backend/cpu/simd_avx512.h"

void fm_layernorm_row_f32_avx512(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                                 float *mean_out, float *rstd_out, int stream);
void fm_layernorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                     float *dx, float *dw_acc, float *db_acc, int64_t n, int stream);
void fm_layernorm_bwd_add_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                         float *dx, float *dw_acc, float *db_acc, int64_t n, const float *dsum);
void fm_rmsnorm_row_f32_avx512(const float *x, const float *w, float *y, int64_t n, float eps, float *rstd_out,
                               int stream);
void fm_rmsnorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float rstd, float *dx,
                                   float *dw_acc, int64_t n, int stream);

/* y = (x * r + o) [* w] [+ b] over [i, i + 16) lanes in mask t */
static inline __m512 ln_out(const float *x, const float *w, const float *b, int64_t i, __mmask16 t, __m512 vr,
                            __m512 vo) {
    __m512 h = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(t, x + i), vr, vo);
    if (w && b) return _mm512_fmadd_ps(h, _mm512_maskz_loadu_ps(t, w + i), _mm512_maskz_loadu_ps(t, b + i));
    if (w) return _mm512_mul_ps(h, _mm512_maskz_loadu_ps(t, w + i));
    if (b) return _mm512_add_ps(h, _mm512_maskz_loadu_ps(t, b + i));
    return h;
}

void fm_layernorm_row_f32_avx512(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                                 float *mean_out, float *rstd_out, int stream) {
    stream = stream && ((uintptr_t)y & 63) == 0;
    float mean = fm_row_reduce512(x, n, 0, 0) / (float)n;
    float rstd = 1.0f / sqrtf(fm_row_reduce512(x, n, mean, 1) / (float)n + eps);
    *mean_out = mean;
    *rstd_out = rstd;
    __m512 vr = _mm512_set1_ps(rstd), vo = _mm512_set1_ps(-mean * rstd);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) fm_store16(y + i, ln_out(x, w, b, i, 0xffff, vr, vo), stream);
    if (i < n) _mm512_mask_storeu_ps(y + i, fm_tail16(n - i), ln_out(x, w, b, i, fm_tail16(n - i), vr, vo));
    if (stream) _mm_sfence();
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - mean) * rstd;
 * with dsum, dsum is added to each rounded dx (add + layer norm's backward, fused_avx512.c:
 * bitwise this row followed by a separate add; dx may be dsum itself) */
static inline __attribute__((always_inline)) void ln_bwd_row(const float *dy, const float *x, const float *w, float mean,
                                                             float rstd, float *dx, float *dw_acc, float *db_acc, int64_t n,
                                                             int stream, const float *dsum) {
    __m512 vr = _mm512_set1_ps(rstd), vo = _mm512_set1_ps(-mean * rstd);
    __m512 sg = _mm512_setzero_ps(), sgx = sg;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 t = n - i >= 16 ? 0xffff : fm_tail16(n - i);
        __m512 d = _mm512_maskz_loadu_ps(t, dy + i);
        __m512 h = _mm512_maskz_mov_ps(t, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(t, x + i), vr, vo));
        __m512 g = w ? _mm512_mul_ps(d, _mm512_maskz_loadu_ps(t, w + i)) : d;
        sg = _mm512_add_ps(sg, g);
        sgx = _mm512_fmadd_ps(g, h, sgx);
        if (dw_acc) _mm512_mask_storeu_ps(dw_acc + i, t, _mm512_fmadd_ps(d, h, _mm512_maskz_loadu_ps(t, dw_acc + i)));
        if (db_acc) _mm512_mask_storeu_ps(db_acc + i, t, _mm512_add_ps(d, _mm512_maskz_loadu_ps(t, db_acc + i)));
    }
    float inv_n = 1.0f / (float)n, a = _mm512_reduce_add_ps(sg) * inv_n, c = _mm512_reduce_add_ps(sgx) * inv_n;
    __m512 va = _mm512_set1_ps(a), vc = _mm512_set1_ps(c);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 t = n - i >= 16 ? 0xffff : fm_tail16(n - i);
        __m512 d = _mm512_maskz_loadu_ps(t, dy + i);
        __m512 h = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(t, x + i), vr, vo);
        __m512 g = w ? _mm512_mul_ps(d, _mm512_maskz_loadu_ps(t, w + i)) : d;
        __m512 r = _mm512_mul_ps(_mm512_fnmadd_ps(h, vc, _mm512_sub_ps(g, va)), vr);
        if (dsum) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(t, dsum + i));
        if (t == 0xffff) fm_store16(dx + i, r, stream);
        else _mm512_mask_storeu_ps(dx + i, t, r);
    }
    if (stream) _mm_sfence();
}

void fm_layernorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                     float *dx, float *dw_acc, float *db_acc, int64_t n, int stream) {
    ln_bwd_row(dy, x, w, mean, rstd, dx, dw_acc, db_acc, n, stream && ((uintptr_t)dx & 63) == 0, NULL);
}

void fm_layernorm_bwd_add_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                         float *dx, float *dw_acc, float *db_acc, int64_t n, const float *dsum) {
    ln_bwd_row(dy, x, w, mean, rstd, dx, dw_acc, db_acc, n, 0, dsum);
}

void fm_rmsnorm_row_f32_avx512(const float *x, const float *w, float *y, int64_t n, float eps, float *rstd_out,
                               int stream) {
    stream = stream && ((uintptr_t)y & 63) == 0;
    float rstd = 1.0f / sqrtf(fm_row_reduce512(x, n, 0, 1) / (float)n + eps);
    *rstd_out = rstd;
    __m512 vr = _mm512_set1_ps(rstd);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 t = n - i >= 16 ? 0xffff : fm_tail16(n - i);
        __m512 h = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, x + i), vr);
        if (w) h = _mm512_mul_ps(h, _mm512_maskz_loadu_ps(t, w + i));
        if (t == 0xffff) fm_store16(y + i, h, stream);
        else _mm512_mask_storeu_ps(y + i, t, h);
    }
    if (stream) _mm_sfence();
}

/* dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd */
void fm_rmsnorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float rstd, float *dx,
                                   float *dw_acc, int64_t n, int stream) {
    stream = stream && ((uintptr_t)dx & 63) == 0;
    __m512 vr = _mm512_set1_ps(rstd), sgx = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 t = n - i >= 16 ? 0xffff : fm_tail16(n - i);
        __m512 d = _mm512_maskz_loadu_ps(t, dy + i);
        __m512 h = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, x + i), vr);
        __m512 g = w ? _mm512_mul_ps(d, _mm512_maskz_loadu_ps(t, w + i)) : d;
        sgx = _mm512_fmadd_ps(g, h, sgx);
        if (dw_acc) _mm512_mask_storeu_ps(dw_acc + i, t, _mm512_fmadd_ps(d, h, _mm512_maskz_loadu_ps(t, dw_acc + i)));
    }
    __m512 vc = _mm512_set1_ps(_mm512_reduce_add_ps(sgx) / (float)n);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 t = n - i >= 16 ? 0xffff : fm_tail16(n - i);
        __m512 d = _mm512_maskz_loadu_ps(t, dy + i);
        __m512 h = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, x + i), vr);
        __m512 g = w ? _mm512_mul_ps(d, _mm512_maskz_loadu_ps(t, w + i)) : d;
        __m512 r = _mm512_mul_ps(_mm512_fnmadd_ps(h, vc, g), vr);
        if (t == 0xffff) fm_store16(dx + i, r, stream);
        else _mm512_mask_storeu_ps(dx + i, t, r);
    }
    if (stream) _mm_sfence();
}
