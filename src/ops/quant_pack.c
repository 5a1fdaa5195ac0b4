/* Weight quantization (fathom/quant.h): f32 host tensors to the int8 and
 * int4 layouts the quantized ops read. Scales are rounded to their stored
 * precision (f16 for int4) before the codes are chosen, so the codes are the
 * nearest for the scale the kernels will actually use. */
#include <math.h>
#include <string.h>

#include "backend/kernel_attrs.h" /* fm_q8_panel_index */
#include "fathom/quant.h"

static fm_status check_w(const char *fn, const fm_tensor *w) {
    char a[128];
    if (!w || w->ndim != 2 || w->dtype != FM_F32 || fm_tensor_device(w).type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_INVALID, "%s: weight must be a 2-D f32 host tensor, got %s %s", fn, w ? fm_dtype_name(w->dtype) : "NULL",
                            w ? fm_shape_str(w->ndim, w->shape, a, sizeof a) : "");
    return FM_OK;
}

fm_status fm_quantize_weight_int8(const fm_tensor *w, fm_tensor **q, fm_tensor **scale) { return fm_quantize_weight_int8_range(w, 127, q, scale); }

fm_status fm_quantize_weight_int8_range(const fm_tensor *w, int qmax, fm_tensor **q, fm_tensor **scale) {
    *q = *scale = NULL;
    if (check_w("quantize int8", w)) return fm_last_status();
    if (qmax < 1 || qmax > 127) return fm_set_error(FM_ERR_INVALID, "quantize int8: the code range %d must be in [1, 127] (127: 8-bit, 63: 7-bit)", qmax);
    fm_tensor *wc = fm_contiguous((fm_tensor *)w);
    if (!wc) return fm_last_status();
    const int64_t N = w->shape[0], K = w->shape[1];
    fm_tensor *tq = fm_tensor_empty(2, w->shape, FM_I8, FM_CPU), *ts = fm_tensor_empty(1, &N, FM_F32, FM_CPU);
    if (!tq || !ts) { fm_tensor_release_n(3, wc, tq, ts); return fm_last_status(); }
    const float *p = fm_tensor_data(wc);
    int8_t *pq = fm_tensor_data(tq);
    float *ps = fm_tensor_data(ts);
    for (int64_t n = 0; n < N; n++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(p[n * K + k]));
        const float hi = (float)qmax, s = amax > 0 && isfinite(amax) ? amax / hi : 1.0f, inv = 1.0f / s;
        ps[n] = s;
        for (int64_t k = 0; k < K; k++) {
            float v = nearbyintf(p[n * K + k] * inv);
            pq[n * K + k] = (int8_t)(v > hi ? hi : v < -hi ? -hi : v);
        }
    }
    fm_tensor_release(wc);
    *q = tq;
    *scale = ts;
    return FM_OK;
}

fm_status fm_pack_weight_int8(const fm_tensor *q, fm_tensor **panels, fm_tensor **row_sums) {
    char a[128];
    *panels = *row_sums = NULL;
    if (!q || q->ndim != 2 || q->dtype != FM_I8 || fm_tensor_device(q).type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_INVALID, "pack int8: weight must be a 2-D i8 host tensor, got %s %s", q ? fm_dtype_name(q->dtype) : "NULL",
                            q ? fm_shape_str(q->ndim, q->shape, a, sizeof a) : "");
    const int64_t N = q->shape[0], K = q->shape[1], Kq = (K + 3) / 4;
    if (K > 32768) return fm_set_error(FM_ERR_INVALID, "pack int8: %lld input features exceed the panels' 32768 (32-bit sums)", (long long)K);
    fm_tensor *qc = fm_contiguous((fm_tensor *)q);
    int64_t ps[4] = {(N + 15) / 16, Kq, 16, 4};
    fm_tensor *tp = fm_tensor_zeros(4, ps, FM_I8, FM_CPU), *ts = fm_tensor_empty(1, &N, FM_I32, FM_CPU);
    if (!qc || !tp || !ts) { fm_tensor_release_n(3, qc, tp, ts); return fm_last_status(); }
    const int8_t *src = fm_tensor_data(qc);
    int8_t *dst = fm_tensor_data(tp);
    int32_t *sums = fm_tensor_data(ts);
    for (int64_t n = 0; n < N; n++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) {
            if (src[n * K + k] == -128) { /* the AVX2 kernel moves signs onto the weights: -128 has no +128 */
                fm_tensor_release_n(3, qc, tp, ts);
                return fm_set_error(FM_ERR_INVALID, "pack int8: weight [%lld, %lld] is -128; the panels hold codes in [-127, 127] "
                                    "(quantize with fm_quantize_weight_int8, which uses that range)", (long long)n, (long long)k);
            }
            dst[fm_q8_panel_index(Kq, n, k)] = src[n * K + k];
            s += src[n * K + k];
        }
        sums[n] = s;
    }
    fm_tensor_release(qc);
    *panels = tp;
    *row_sums = ts;
    return FM_OK;
}

fm_status fm_quantize_conv_weight_int8(const fm_tensor *w, fm_tensor **panels, fm_tensor **scale, fm_tensor **row_sums) {
    return fm_quantize_conv_weight_int8_range(w, 127, panels, scale, row_sums);
}

fm_status fm_quantize_conv_weight_int8_range(const fm_tensor *w, int qmax, fm_tensor **panels, fm_tensor **scale, fm_tensor **row_sums) {
    char a[128];
    *panels = *scale = *row_sums = NULL;
    if (!w || w->ndim != 4 || w->dtype != FM_F32 || fm_tensor_device(w).type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_INVALID, "quantize conv int8: weight must be a 4-D f32 host tensor [out, in, kh, kw], got %s %s",
                            w ? fm_dtype_name(w->dtype) : "NULL", w ? fm_shape_str(w->ndim, w->shape, a, sizeof a) : "");
    /* [O, C, kh, kw] -> [O, kh, kw, C] -> [O, kh kw C]: the order the kernel's im2col rows take (channels innermost) */
    fm_tensor *t = fm_permute((fm_tensor *)w, (const int[]){0, 2, 3, 1}), *c = t ? fm_contiguous(t) : NULL, *r = NULL, *q = NULL;
    fm_tensor_release(t);
    if (c) r = fm_reshape(c, 2, (const int64_t[]){w->shape[0], w->shape[1] * w->shape[2] * w->shape[3]});
    fm_tensor_release(c);
    fm_status st = r ? fm_quantize_weight_int8_range(r, qmax, &q, scale) : fm_last_status();
    const int64_t O = w->shape[0], K = w->shape[1] * w->shape[2] * w->shape[3], Kp = fm_qconv_panel_k(K);
    fm_tensor *qp = st == FM_OK ? fm_tensor_zeros(2, (const int64_t[]){O, Kp}, FM_I8, FM_CPU) : NULL; /* zero columns to Kp */
    if (st == FM_OK && !qp) st = fm_last_status();
    for (int64_t o = 0; st == FM_OK && o < O; o++)
        memcpy((int8_t *)fm_tensor_data(qp) + o * Kp, (const int8_t *)fm_tensor_data(q) + o * K, (size_t)K);
    if (st == FM_OK) st = fm_pack_weight_int8(qp, panels, row_sums);
    fm_tensor_release_n(3, r, q, qp);
    if (st) {
        fm_tensor_release(*scale);
        *scale = NULL;
    }
    return st;
}

/* One group's scale and offset, rounded to f16; codes into q[0..G). */
static void q4_group(const float *w, int64_t G, bool with_min, uint16_t *d16, uint16_t *m16, uint8_t *q) {
    float d, m;
    if (with_min) {
        float lo = w[0], hi = w[0];
        for (int64_t k = 1; k < G; k++) { lo = fminf(lo, w[k]); hi = fmaxf(hi, w[k]); }
        *d16 = fm_f32_to_f16((hi - lo) / 15.0f);
        *m16 = fm_f32_to_f16(lo);
        d = fm_f16_to_f32(*d16);
        m = fm_f16_to_f32(*m16);
    } else { /* the value of largest magnitude maps to code 0 (-8 d), as llama.cpp's Q4_0 */
        float big = 0.0f;
        for (int64_t k = 0; k < G; k++)
            if (fabsf(w[k]) > fabsf(big)) big = w[k];
        *d16 = fm_f32_to_f16(big / -8.0f);
        d = fm_f16_to_f32(*d16);
        m = -8.0f * d;
    }
    float inv = d != 0 && isfinite(d) ? 1.0f / d : 0.0f;
    for (int64_t k = 0; k < G; k++) {
        float v = inv != 0 ? nearbyintf((w[k] - m) * inv) : with_min ? 0.0f : 8.0f;
        q[k] = (uint8_t)(v < 0 ? 0 : v > 15 ? 15 : v);
    }
}

fm_status fm_quantize_weight_int4(const fm_tensor *w, int group, bool with_min, fm_tensor **packed, fm_tensor **scale, fm_tensor **min) {
    *packed = *scale = NULL;
    if (min) *min = NULL;
    if (check_w("quantize int4", w)) return fm_last_status();
    const int64_t N = w->shape[0], K = w->shape[1];
    if (group != 32 && group != 64 && group != 128) return fm_set_error(FM_ERR_INVALID, "quantize int4: group %d must be 32, 64 or 128", group);
    if (K % group) return fm_set_error(FM_ERR_INVALID, "quantize int4: group %d does not divide the %lld input features", group, (long long)K);
    if (with_min && !min) return fm_set_error(FM_ERR_INVALID, "quantize int4: with_min needs somewhere to put the offsets");
    fm_tensor *wc = fm_contiguous((fm_tensor *)w);
    int64_t ps[2] = {N, K / 2}, ss[2] = {N, K / group};
    fm_tensor *tp = fm_tensor_empty(2, ps, FM_U8, FM_CPU), *ts = fm_tensor_empty(2, ss, FM_F16, FM_CPU);
    fm_tensor *tm = with_min ? fm_tensor_empty(2, ss, FM_F16, FM_CPU) : NULL;
    if (!wc || !tp || !ts || (with_min && !tm)) { fm_tensor_release_n(4, wc, tp, ts, tm); return fm_last_status(); }
    const float *p = fm_tensor_data(wc);
    uint8_t *pp = fm_tensor_data(tp), q[128];
    uint16_t *pd = fm_tensor_data(ts), *pm = tm ? fm_tensor_data(tm) : NULL, unused;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < K / group; g++) {
            q4_group(p + n * K + g * group, group, with_min, &pd[n * (K / group) + g], pm ? &pm[n * (K / group) + g] : &unused, q);
            for (int64_t c = 0; c < group; c += 32) {
                uint8_t *dst = pp + n * (K / 2) + (g * group + c) / 2;
                for (int j = 0; j < 16; j++) dst[j] = (uint8_t)(q[c + j] | (q[c + j + 16] << 4));
            }
        }
    fm_tensor_release(wc);
    *packed = tp;
    *scale = ts;
    if (min) *min = tm;
    return FM_OK;
}
