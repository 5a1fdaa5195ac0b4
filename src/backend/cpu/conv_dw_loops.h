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
_Static_assert(SFX(DW_NB) * VL <= FM_CONV_DW_SLACK, "a block fits in a row's slack");

/* One block of NB vectors of output row yr from column ow: the sum over the taps
 * (scratch offsets off[t], weights w[t]), then the clamp and the store of the
 * first m columns (m > (NB - 1) * VL). */
static inline __attribute__((always_inline)) void SFX(dw_block)(const int NB, const float *r, const int64_t *off,
                                                                 const float *w, int64_t taps, float bias, V lov,
                                                                 V hiv, float *yr, int64_t m) {
    V acc[SFX(DW_NB)];
    for (int k = 0; k < NB; k++) acc[k] = VSET1(bias);
    for (int64_t t = 0; t < taps; t++) {
        const float *rt = r + off[t];
        const V wv = VSET1(w[t]);
        for (int k = 0; k < NB; k++) acc[k] = VFMA(wv, VLOADU(rt + k * VL), acc[k]);
    }
    /* the fused activation's bounds (-inf, inf: none); the value is the second
     * operand, which max and min return when either is NaN: NaN stays */
    for (int k = 0; k < NB - 1; k++) VSTOREU(yr + k * VL, VMIN(hiv, VMAX(lov, acc[k])));
    const V last = VMIN(hiv, VMAX(lov, acc[NB - 1]));
    const int64_t n = m - (NB - 1) * VL;
    if (n == VL) VSTOREU(yr + (NB - 1) * VL, last);
    else VSTOREN(yr + (NB - 1) * VL, last, n);
}

/* Row xr of W floats into its sw phase rows (phase r at row + r * phase): padded
 * column q * sw + r, that is input column q * sw + r - pw, goes to q. Per phase a
 * strided read, written for a literal stride 2 apart so the compiler vectorizes it. */
static inline void SFX(dw_split_row)(const float *restrict xr, float *restrict row, int64_t W, int64_t pw, int64_t sw, int64_t phase) {
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
        if (p == b || mult == 1 || o % mult == 0) /* the padded, phase-split input plane */
            for (int64_t h = 0; h < H; h++) {
                float *row = ws + (h + ph) * wq;
                if (s == 1) memcpy(row + pw, x + h * W, sizeof(float) * (size_t)W);
                else SFX(dw_split_row)(x + h * W, row, W, pw, s, phase);
            }
        const float bias = d->bias ? d->bias[o] : 0.0f;
        const V lov = VSET1(d->lo), hiv = VSET1(d->hi);
        for (int64_t oh = 0; oh < Ho; oh++) {
            const float *rrow = ws + oh * sh * wq;
            for (int64_t ow = 0; ow < Wo; ow += SFX(DW_NB) * VL) {
                const int64_t left = Wo - ow, m = left < SFX(DW_NB) * VL ? left : SFX(DW_NB) * VL;
                float *yr = y + oh * Wo + ow;
                switch ((m + VL - 1) / VL) { /* as few vectors as the columns left need */
                case 1: SFX(dw_block)(1, rrow + ow, off, w, taps, bias, lov, hiv, yr, m); break;
                case 2: SFX(dw_block)(2, rrow + ow, off, w, taps, bias, lov, hiv, yr, m); break;
                case 3: SFX(dw_block)(3, rrow + ow, off, w, taps, bias, lov, hiv, yr, m); break;
                default: SFX(dw_block)(SFX(DW_NB), rrow + ow, off, w, taps, bias, lov, hiv, yr, m); break;
                }
            }
        }
    }
}
