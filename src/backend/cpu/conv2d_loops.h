/* conv2d_cpu.c's per-element-type loops: im2col and col2im (NCHW and NHWC), the
 * scatter of a chunk's GEMM output into y and the gather of dy (NCHW), the bias
 * gradient, and the weight reorder for the NHWC GEMM. Each is a fm_parallel_for
 * task over items named in its comment, reading the conv_job of conv2d_cpu.c.
 *
 * Written once for both element types: conv2d_cpu.c includes this file twice, with
 * T = float, SFX(name) = name_f32 and T = double, SFX(name) = name_f64, so each
 * loop compiles to its own typed function (no include guard on purpose).
 *
 * The im2col columns may be of another type than the input: TC (default T),
 * with COL_ONE(v) converting one element and COL_RUN(dst, src, n) a run of
 * them (default: the element itself and memcpy). conv2d_cpu.c includes the file
 * a third time with T = float, TC = uint16_t (bf16, rounded to nearest even) and
 * CONV_LOOPS_IM2COL_ONLY, for the columns of its bf16 products. */
#ifndef TC
#define TC T
#define COL_ONE(v) (v)
#define COL_RUN(dst, src, n) memcpy((dst), (src), (size_t)(n) * sizeof(T))
#define CONV_LOOPS_OWN_TC
#endif
/* NCHW im2col: item = (sample in chunk, channel in group) */
static void SFX(im2col_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    for (int64_t it = b; it < e; it++) {
        int64_t nn = it / g->Cg, c = it % g->Cg;
        const T *xc = (const T *)j->x + ((j->n0 + nn) * g->C + j->c0 + c) * g->H * g->W;
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                TC *row = (TC *)j->cols + ((c * g->kh + ki) * g->kw + kj) * j->ldc + nn * g->P;
                int64_t iw0 = kj * g->dw - g->pw;
                if (g->sh == 1 && g->sw == 1 && g->W == g->Wo) {
                    /* "same" width, stride 1: the tap's rows are one contiguous run of the
                     * plane shifted by (ih0 - oh) * W + iw0, so copy them in one go and zero
                     * the padding columns after (a copy per 14-float row cost 10% of a step) */
                    int64_t dr = ki * g->dh - g->ph, oh0 = dr < 0 ? -dr : 0, oh1 = g->H - dr;
                    if (oh1 > g->Ho) oh1 = g->Ho;
                    if (oh0 > oh1) oh0 = oh1;
                    int64_t lo = iw0 < 0 ? -iw0 : 0, hi = g->W - iw0;
                    if (hi > g->Wo) hi = g->Wo;
                    if (lo > hi) lo = hi;
                    for (int64_t q = 0; q < oh0 * g->Wo; q++) row[q] = 0;
                    for (int64_t q = oh1 * g->Wo; q < g->P; q++) row[q] = 0;
                    int64_t k0 = oh0 * g->Wo + lo, k1 = oh1 > oh0 ? (oh1 - 1) * g->Wo + hi : k0;
                    if (k1 > k0) COL_RUN(row + k0, xc + k0 + dr * g->W + iw0, k1 - k0);
                    for (int64_t oh = oh0; oh < oh1; oh++) {
                        TC *d = row + oh * g->Wo;
                        for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0;
                        for (int64_t ow = hi; ow < g->Wo; ow++) d[ow] = 0;
                    }
                    continue;
                }
                for (int64_t oh = 0; oh < g->Ho; oh++) {
                    TC *dst = row + oh * g->Wo;
                    int64_t ih = oh * g->sh - g->ph + ki * g->dh;
                    if (ih < 0 || ih >= g->H) { memset(dst, 0, (size_t)g->Wo * sizeof(TC)); continue; }
                    const T *src = xc + ih * g->W;
                    if (g->sw == 1) {
                        int64_t lo = iw0 < 0 ? -iw0 : 0, hi = g->W - iw0;
                        if (hi > g->Wo) hi = g->Wo;
                        if (lo > g->Wo) lo = g->Wo;
                        if (hi < lo) hi = lo;
                        /* rows are short (a few dozen elements): inline loops beat a
                         * memcpy/memset call per row (7% of the CNN step was in those calls) */
                        const T *sp = src + iw0;
                        for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0;
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = COL_ONE(sp[ow]);
                        for (int64_t ow = hi; ow < g->Wo; ow++) dst[ow] = 0;
                    } else { /* strided: the columns whose input lies inside the row, [lo, hi), without a
                              * test per element (a stride of 2 written out so the copy vectorizes:
                              * the stems of MobileNet and SqueezeNet run this) */
                        const int64_t sw = g->sw;
                        int64_t lo = iw0 < 0 ? (-iw0 + sw - 1) / sw : 0, hi = g->W > iw0 ? (g->W - iw0 + sw - 1) / sw : 0;
                        if (hi > g->Wo) hi = g->Wo;
                        if (lo > hi) lo = hi;
                        const T *sp = src + iw0;
                        for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0;
                        if (sw == 2)
                            for (int64_t ow = lo; ow < hi; ow++) dst[ow] = COL_ONE(sp[2 * ow]);
                        else
                            for (int64_t ow = lo; ow < hi; ow++) dst[ow] = COL_ONE(sp[ow * sw]);
                        for (int64_t ow = hi; ow < g->Wo; ow++) dst[ow] = 0;
                    }
                }
            }
    }
}
#ifdef CONV_LOOPS_OWN_TC
#undef TC
#undef COL_ONE
#undef COL_RUN
#undef CONV_LOOPS_OWN_TC
#endif
#ifndef CONV_LOOPS_IM2COL_ONLY
/* "Same" width, stride 1 (im2col's contiguous case): the tap's columns for rows
 * oh0..oh1-1 land on one contiguous run of the plane shifted by dr * W + iw0, so one
 * long add replaces a short loop per row (col2im was 5% of a fashion-cnn training
 * step). The columns that fall in the padding would land on the neighbouring rows'
 * ends there, so they are zeroed first in `row` (this item's own part of the
 * scratch columns, not read again): each plane element receives the same terms in
 * the same order as with the per-row loops. */
static void SFX(col2im_tap_run)(const fm_conv_geom *g, int64_t ki, int64_t iw0, T *restrict row, T *restrict xc) {
    const int64_t W = g->W, dr = ki * g->dh - g->ph;
    int64_t oh0 = dr < 0 ? -dr : 0, oh1 = g->H - dr;
    if (oh1 > g->Ho) oh1 = g->Ho;
    if (oh0 >= oh1) return;
    int64_t lo = iw0 < 0 ? -iw0 : 0, hi = W - iw0;
    if (hi > W) hi = W;
    if (lo > hi) lo = hi;
    for (int64_t oh = oh0; oh < oh1; oh++) {
        T *r = row + oh * W;
        for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;
        for (int64_t ow = hi; ow < W; ow++) r[ow] = 0;
    }
    const int64_t k0 = oh0 * W + lo, k1 = (oh1 - 1) * W + hi, off = dr * W + iw0; /* k0 + off >= 0 */
    for (int64_t k = k0; k < k1; k++) xc[k + off] += row[k];
}

/* NCHW col2im: item = (sample, channel); zeroes then accumulates its own plane */
static void SFX(col2im_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    const bool run = g->sh == 1 && g->sw == 1 && g->W == g->Wo;
    for (int64_t it = b; it < e; it++) {
        int64_t nn = it / g->Cg, c = it % g->Cg;
        T *xc = (T *)j->dx + ((j->n0 + nn) * g->C + j->c0 + c) * g->H * g->W;
        memset(xc, 0, (size_t)(g->H * g->W) * sizeof(T));
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                T *row = (T *)j->cols + ((c * g->kh + ki) * g->kw + kj) * j->ldc + nn * g->P;
                int64_t iw0 = kj * g->dw - g->pw;
                if (run) {
                    SFX(col2im_tap_run)(g, ki, iw0, row, xc);
                    continue;
                }
                for (int64_t oh = 0; oh < g->Ho; oh++) {
                    int64_t ih = oh * g->sh - g->ph + ki * g->dh;
                    if (ih < 0 || ih >= g->H) continue;
                    const T *src = row + oh * g->Wo;
                    T *dst = xc + ih * g->W;
                    if (g->sw == 1) {
                        int64_t lo = iw0 < 0 ? -iw0 : 0, hi = g->W - iw0;
                        if (hi > g->Wo) hi = g->Wo;
                        T *d = dst + iw0;
                        for (int64_t ow = lo; ow < hi; ow++) d[ow] += src[ow];
                    } else {
                        for (int64_t ow = 0; ow < g->Wo; ow++) {
                            int64_t iw = ow * g->sw + iw0;
                            if (iw >= 0 && iw < g->W) dst[iw] += src[ow];
                        }
                    }
                }
            }
    }
}
/* NCHW: tmp [Og, nb*P] -> y[n, o0+o, :] (+ bias). item = (sample, out channel) */
static void SFX(scatter_out_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    for (int64_t it = b; it < e; it++) {
        int64_t nn = it / g->Og, o = it % g->Og;
        const T *src = (const T *)j->tmp + o * j->ldc + nn * g->P;
        T *dst = (T *)j->y + ((j->n0 + nn) * g->O + j->o0 + o) * g->P;
        T bv = j->bias ? ((const T *)j->bias)[j->o0 + o] : (T)0;
        const int64_t P = g->P; /* a local: a store through dst may alias g (-fno-strict-aliasing), which kept this loop scalar */
        for (int64_t q = 0; q < P; q++) dst[q] = src[q] + bv;
    }
}
/* NCHW: dy[n, o0+o, :] -> dyt [Og, nb*P] */
static void SFX(gather_dy_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    for (int64_t it = b; it < e; it++) {
        int64_t nn = it / g->Og, o = it % g->Og;
        memcpy((T *)j->dyt + o * j->ldc + nn * g->P,
               (const T *)j->dy + ((j->n0 + nn) * g->O + j->o0 + o) * g->P, (size_t)g->P * sizeof(T));
    }
}
/* NCHW db[o] = sum over n, p of dy. item = o */
static void SFX(db_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    bool simd = sizeof(T) == 4 && fm_cpu_use_avx2();
    for (int64_t o = b; o < e; o++) {
        double s = 0;
        for (int64_t n = 0; n < g->N; n++) {
            const T *src = (const T *)j->dy + (n * g->O + o) * g->P;
            if (simd) { s += fm_avx2_sum_f32((const float *)(const void *)src, g->P); continue; }
            T part = 0;
            for (int64_t q = 0; q < g->P; q++) part += src[q];
            s += (double)part;
        }
        ((T *)j->y)[o] = (T)s;
    }
}
/* NHWC im2col: item = (sample in chunk, output row); rows [nb*P, K] in (kh, kw, c) order.
 * Taps are visited per (kh, kw) so the row check is hoisted; one input channel (a first
 * layer) gets its own loop, since a copy call per single-element tap dominates otherwise */
static void SFX(im2col_nhwc)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    for (int64_t it = b; it < e; it++) {
        int64_t nn = it / g->Ho, oh = it % g->Ho;
        const T *xn = (const T *)j->x + (j->n0 + nn) * g->H * g->W * g->C + j->c0;
        T *dst0 = (T *)j->cols + (nn * g->P + oh * g->Wo) * g->K;
        for (int64_t ki = 0; ki < g->kh; ki++) {
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;
            bool rv = ih >= 0 && ih < g->H;
            const T *xrow = xn + (rv ? ih : 0) * g->W * g->C;
            for (int64_t kj = 0; kj < g->kw; kj++) {
                int64_t iw0 = kj * g->dw - g->pw;
                T *d = dst0 + (ki * g->kw + kj) * g->Cg;
                if (!rv) {
                    for (int64_t ow = 0; ow < g->Wo; ow++)
                        for (int64_t c = 0; c < g->Cg; c++) d[ow * g->K + c] = 0;
                } else if (g->Cg == 1) {
                    for (int64_t ow = 0; ow < g->Wo; ow++) {
                        int64_t iw = ow * g->sw + iw0;
                        d[ow * g->K] = (iw >= 0 && iw < g->W) ? xrow[iw * g->C] : (T)0;
                    }
                } else {
                    for (int64_t ow = 0; ow < g->Wo; ow++) {
                        int64_t iw = ow * g->sw + iw0;
                        T *dd = d + ow * g->K;
                        if (iw < 0 || iw >= g->W) {
                            for (int64_t c = 0; c < g->Cg; c++) dd[c] = 0;
                        } else if (g->Cg < 16) {
                            const T *src = xrow + iw * g->C;
                            for (int64_t c = 0; c < g->Cg; c++) dd[c] = src[c];
                        } else {
                            memcpy(dd, xrow + iw * g->C, (size_t)g->Cg * sizeof(T));
                        }
                    }
                }
            }
        }
    }
}
/* NHWC col2im: item = sample (taps of neighbouring rows overlap, samples never do); dx must
 * be zero beforehand */
static void SFX(col2im_nhwc)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    for (int64_t nn = b; nn < e; nn++) {
        T *xn = (T *)j->dx + (j->n0 + nn) * g->H * g->W * g->C + j->c0;
        const T *src = (const T *)j->cols + nn * g->P * g->K;
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++)
                for (int64_t ki = 0; ki < g->kh; ki++) {
                    int64_t ih = oh * g->sh - g->ph + ki * g->dh;
                    for (int64_t kj = 0; kj < g->kw; kj++, src += g->Cg) {
                        int64_t iw = ow * g->sw - g->pw + kj * g->dw;
                        if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;
                        T *d = xn + (ih * g->W + iw) * g->C;
                        for (int64_t c = 0; c < g->Cg; c++) d[c] += src[c];
                    }
                }
    }
}
/* NHWC db: fixed blocks of 256 rows, partial sums per block (summed in order afterwards) */
static void SFX(db_rows)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const conv_job *j = ctx; const fm_conv_geom *g = j->g;
    int64_t R = g->N * g->P;
    for (int64_t blk = b; blk < e; blk++) {
        double *acc = (double *)j->cols + blk * g->O;
        for (int64_t o = 0; o < g->O; o++) acc[o] = 0;
        int64_t r1 = (blk + 1) * 256 < R ? (blk + 1) * 256 : R;
        for (int64_t r = blk * 256; r < r1; r++) {
            const T *src = (const T *)j->dy + r * g->O;
            for (int64_t o = 0; o < g->O; o++) acc[o] += (double)src[o];
        }
    }
}
/* weight [O, Cg, kh, kw] <-> [O, kh, kw, Cg] (NHWC GEMM operand); dir 0: to, 1: back */
static void SFX(reorder_w)(const fm_conv_geom *g, const T *src, T *dst, int dir) {
    int64_t khw = g->kh * g->kw;
    for (int64_t o = 0; o < g->O; o++)
        for (int64_t c = 0; c < g->Cg; c++)
            for (int64_t k = 0; k < khw; k++) {
                int64_t a = (o * g->Cg + c) * khw + k, r = (o * khw + k) * g->Cg + c;
                if (dir == 0) dst[r] = src[a]; else dst[a] = src[r];
            }
}
#endif /* CONV_LOOPS_IM2COL_ONLY */
