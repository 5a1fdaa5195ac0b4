/* conv_dw.c's loops: the depthwise convolution's direct kernel (NCHW f32, one
 * input channel per group: MobileNet's and EfficientNet's 3x3 and 5x5 layers),
 * written once for three vector widths (fm_conv_dw: conv_dw.h).
 * conv_dw_avx512.c, conv_dw_avx2.c and conv_dw.c include it with V (the vector
 * type), VL (its lanes), VSET1, VLOADU, VSTOREU, VSTOREN(p, v, n) (the first n
 * lanes), VFMA(a, b, c) = a * b + c, VMAX(a, b) and VMIN(a, b) (b when either is
 * NaN) and SFX(name); no include guard on purpose.
 *
 * Why not im2col + GEMM (conv2d's general path): each group is a 1 x P x kh*kw
 * product, a row vector times a matrix, which OpenBLAS runs one group at a time
 * (measured on an Intel Xeon model 167: MobileNetV2's convs at 40 GFLOP/s
 * against 150 for its dense ones). Here one output plane is one task: its input
 * plane is copied once, padded, into the thread's scratch and split by column
 * phase (column q*s + r of the padded row goes to phase r at q), so that with
 * column stride s every tap reads consecutive floats: y[oh][ow] = b + sum over
 * taps (i, j) of w[i][j] * phase[j % s][oh*sh + i][ow + j / s]. A row is made
 * in blocks of DW_NB vectors held in registers across the taps; a block past
 * the end of the row is computed in full (the scratch rows have the slack) and
 * only its valid lanes stored (a masked store: a copy through a buffer was 12%
 * of the kernel's time on MobileNetV2, whose rows of 7-56 mostly end in one). */

enum { SFX(DW_NB) = 4 };

/* DW_SPILL (the ISA file's choice; 0 here): a row's last, partial vector is stored whole
 * when the floats past the row's end are still in the plane. Every such float belongs to
 * a later row or a later block of this row, stored after it (rows and blocks go in
 * order, and a plane is one task's), so the store writes nothing that stays. For AVX2
 * on AMD, where vmaskmovps to memory is slow: MobileNetV2's 14x14 rows (a vector and 6
 * lanes) spent most of their time in it (AMD EPYC Zen 3). */
#ifndef DW_SPILL
#define DW_SPILL 0
#endif
_Static_assert(SFX(DW_NB) * VL <= FM_CONV_DW_SLACK, "a block fits in a row's slack");

/* One block of NB vectors of NR output rows from column ow: the sum over the taps
 * (scratch offsets off[t] from r, the first row's; rows rstep floats apart there,
 * weights w[t]), then the clamp and the store of the first m columns of each row
 * (m > (NB - 1) * VL; rows ystep apart in y). NR rows at once keep NR * NB
 * independent sums in flight: one vector a row (a 7- or 14-wide plane) was a single
 * chain of dependent FMAs, bound by their latency (MobileNetV2's 960-channel 7x7
 * layer ran at half ONNX Runtime's speed, 2 threads, AMD EPYC Zen 5). */
static inline __attribute__((always_inline)) void SFX(dw_block)(const int NB, const int NR, const float *r, int64_t rstep,
                                                                 const int64_t *off, const float *w, int64_t taps, float bias,
                                                                 V lov, V hiv, float *yr, int64_t ystep, int64_t m,
                                                                 const float *yend) {
    V acc[4][SFX(DW_NB)];
    for (int q = 0; q < NR; q++)
        for (int k = 0; k < NB; k++) acc[q][k] = VSET1(bias);
    for (int64_t t = 0; t < taps; t++) {
        const float *rt = r + off[t];
        const V wv = VSET1(w[t]);
        for (int q = 0; q < NR; q++)
            for (int k = 0; k < NB; k++) acc[q][k] = VFMA(wv, VLOADU(rt + q * rstep + k * VL), acc[q][k]);
    }
    /* the fused activation's bounds (-inf, inf: none); the value is the second
     * operand, which max and min return when either is NaN: NaN stays */
    const int64_t n = m - (NB - 1) * VL;
    for (int q = 0; q < NR; q++) {
        float *yq = yr + q * ystep;
        for (int k = 0; k < NB - 1; k++) VSTOREU(yq + k * VL, VMIN(hiv, VMAX(lov, acc[q][k])));
        const V last = VMIN(hiv, VMAX(lov, acc[q][NB - 1]));
        if (n == VL || (DW_SPILL && yq + NB * VL <= yend)) VSTOREU(yq + (NB - 1) * VL, last);
        else VSTOREN(yq + (NB - 1) * VL, last, n);
    }
}

/* Every output row of a plane whose rows fit in one or two vectors (Wo <= 2 VL): 4 rows
 * of one vector or 2 rows of two at once (DW_NARROW2 rows of two where the ISA file sets
 * it), and the rows left over as one block of fewer rows: single rows (one chain of
 * dependent FMAs each) left a 7-row plane's last three bound by the FMA latency. */
#ifndef DW_NARROW2
#define DW_NARROW2 2
#endif
static inline void SFX(dw_narrow_rows)(const float *ws, int64_t wq, int64_t sh, const int64_t *off, const float *w, int64_t taps,
                                        float bias, V lov, V hiv, float *y, int64_t Ho, int64_t Wo) {
    const int nb = Wo > VL ? 2 : 1, nr = nb == 1 ? 4 : DW_NARROW2;
    const int64_t rs = sh * wq;
    const float *yend = y + Ho * Wo;
    int64_t oh = 0;
    for (; oh + nr <= Ho; oh += nr) {
        if (nb == 1) SFX(dw_block)(1, 4, ws + oh * rs, rs, off, w, taps, bias, lov, hiv, y + oh * Wo, Wo, Wo, yend);
        else SFX(dw_block)(2, DW_NARROW2, ws + oh * rs, rs, off, w, taps, bias, lov, hiv, y + oh * Wo, Wo, Wo, yend);
    }
    const int64_t left = Ho - oh;
    const float *r = ws + oh * rs;
    float *yr = y + oh * Wo;
    if (nb == 1) switch (left) {
        case 1: SFX(dw_block)(1, 1, r, rs, off, w, taps, bias, lov, hiv, yr, Wo, Wo, yend); break;
        case 2: SFX(dw_block)(1, 2, r, rs, off, w, taps, bias, lov, hiv, yr, Wo, Wo, yend); break;
        case 3: SFX(dw_block)(1, 3, r, rs, off, w, taps, bias, lov, hiv, yr, Wo, Wo, yend); break;
        default: break;
        }
    else switch (left) {
        case 1: SFX(dw_block)(2, 1, r, rs, off, w, taps, bias, lov, hiv, yr, Wo, Wo, yend); break;
        case 2: SFX(dw_block)(2, 2, r, rs, off, w, taps, bias, lov, hiv, yr, Wo, Wo, yend); break;
        case 3: SFX(dw_block)(2, 3, r, rs, off, w, taps, bias, lov, hiv, yr, Wo, Wo, yend); break;
        default: break;
        }
}

/* Row xr of W floats into its sw phase rows (phase r at row + r * phase): padded
 * column q * sw + r, that is input column q * sw + r - pw, goes to q. Per phase a
 * strided read; at stride 2 on rows up to 128 wide an ISA's DW_SPLIT2_ROW when it has one
 * (AVX-512: masked vectors; MobileNetV2's 576-channel 14 -> 7 layer 0.33 -> 0.17 ms at
 * batch 8, 2 threads, AMD EPYC Zen 5, the scalar ends of the strided loop were most of it). */
static inline void SFX(dw_split_row)(const float *restrict xr, float *restrict row, int64_t W, int64_t pw, int64_t sw, int64_t phase) {
#ifdef DW_SPLIT2_ROW
    if (sw == 2 && W <= 128) { /* wider rows keep the loops below: 200 and 256 columns ran 1.6-1.7x slower split by
                                * masked vectors (32 and 24 channels, batch 8); 112 columns 1.1-2.6x faster */
        DW_SPLIT2_ROW(xr, row, W, pw, phase);
        return;
    }
#endif
    for (int64_t r = 0; r < sw; r++) {
        /* q from the first with q * sw + r >= pw to the last with q * sw + r - pw < W */
        const int64_t q0 = (pw - r + sw - 1) / sw, q1 = (W + pw - r + sw - 1) / sw;
        float *restrict dst = row + r * phase;
        const int64_t at = r - pw; /* input column of q = 0 (may be negative: only q >= q0 is read) */
        if (sw == 2)
            for (int64_t q = q0; q < q1; q++) dst[q] = xr[2 * q + at];
        else
            for (int64_t q = q0; q < q1; q++) dst[q] = xr[q * sw + at];
    }
}

/* Output planes [b, e) (plane = n * O + o); ws: this thread's scratch
 * (fm_conv_dw_scratch_floats), and off room for kh * kw offsets. */
static void SFX(dw_planes)(const fm_conv_dw *d, int64_t b, int64_t e, float *ws, int64_t *off) {
    /* locals: the build has -fno-strict-aliasing, so stores would reload d's fields */
    const int64_t s = d->sw, sh = d->sh, H = d->H, W = d->W, ph = d->ph, pw = d->pw, Ho = d->Ho, Wo = d->Wo, O = d->O, C = d->C;
    const int64_t Hp = H + 2 * ph, Wp = W + 2 * pw;
    const int64_t wq = (Wp + s - 1) / s + FM_CONV_DW_SLACK + d->kw, phase = Hp * wq, taps = d->kh * d->kw;
    const int64_t mult = O / C;
    for (int64_t i = 0; i < d->kh; i++)
        for (int64_t j = 0; j < d->kw; j++) off[i * d->kw + j] = (j % s) * phase + i * wq + j / s;
    /* the padding and the slack stay zero: every plane writes the same interior */
    memset(ws, 0, sizeof(float) * (size_t)(s * phase));
    for (int64_t p = b; p < e; p++) {
        const int64_t n = p / O, o = p % O;
        const float *x = d->x + (n * C + o / mult) * H * W, *w = d->w + o * taps;
        float *y = d->y + p * Ho * Wo;
        const float *yend = y + Ho * Wo;
        if (p == b || mult == 1 || o % mult == 0) /* the padded, phase-split input plane */
            for (int64_t h = 0; h < H; h++) {
                float *row = ws + (h + ph) * wq;
                if (s == 1) memcpy(row + pw, x + h * W, sizeof(float) * (size_t)W);
                else SFX(dw_split_row)(x + h * W, row, W, pw, s, phase);
            }
        const float bias = d->bias ? d->bias[o] : 0.0f;
        const V lov = VSET1(d->lo), hiv = VSET1(d->hi);
        if (Wo <= 2 * VL) {
            SFX(dw_narrow_rows)(ws, wq, sh, off, w, taps, bias, lov, hiv, y, Ho, Wo);
            continue;
        }
        for (int64_t oh = 0; oh < Ho; oh++) {
            const float *rrow = ws + oh * sh * wq;
            for (int64_t ow = 0; ow < Wo; ow += SFX(DW_NB) * VL) {
                const int64_t left = Wo - ow, m = left < SFX(DW_NB) * VL ? left : SFX(DW_NB) * VL;
                float *yr = y + oh * Wo + ow;
                switch ((m + VL - 1) / VL) { /* as few vectors as the columns left need */
                case 1: SFX(dw_block)(1, 1, rrow + ow, 0, off, w, taps, bias, lov, hiv, yr, 0, m, yend); break;
                case 2: SFX(dw_block)(2, 1, rrow + ow, 0, off, w, taps, bias, lov, hiv, yr, 0, m, yend); break;
                case 3: SFX(dw_block)(3, 1, rrow + ow, 0, off, w, taps, bias, lov, hiv, yr, 0, m, yend); break;
                default: SFX(dw_block)(SFX(DW_NB), 1, rrow + ow, 0, off, w, taps, bias, lov, hiv, yr, 0, m, yend); break;
                }
            }
        }
    }
}
