/* The direct conv tile loop (conv_direct.h), written for a vector width VL (the
 * AVX-512 level includes it). The includer defines V, VL, OB, VZERO, VLOAD, VSET1, VFMA, VMAX (x86
 * max: the second operand when either is NaN), VISNAN_SEL(m, a) (a where a is
 * NaN, else m), VSTORE_N(p, v, n) (the first n lanes), VPAIRMAX(v) (lane i of the
 * result, i < VL/2, is the max of lanes 2i and 2i+1, NaN kept) and FN(name).
 * FN(tile) is an OB-channel tile; FN(fm_conv_direct_rows) runs tasks whose
 * blocks all have OB channels. The j loops
 * are unrolled so the accumulators stay in registers through the epilogue (a
 * spill to the stack cost more than the 9 taps of a 1-channel conv). */

/* One tile: OB channels from o0, rows oh, oh+1, columns from c0. */
static void FN(tile)(const fm_conv_direct *d, int64_t n, int64_t o0, int64_t oh, int64_t c0) {
    V acc[OB][2];
#pragma GCC unroll 16
    for (int j = 0; j < OB; j++) acc[j][0] = acc[j][1] = VZERO();
    const int64_t WS = d->WS, KH = d->KH, KW = d->KW, taps = KH * KW;
    const float *xb = d->xp + n * d->C * d->Hp * WS + oh * WS + c0;
    const float *wb = d->wp + o0 * d->C * taps;
    for (int64_t ic = 0; ic < d->C; ic++) {
        const float *xr = xb + ic * d->Hp * WS, *wr = wb + ic * taps * OB;
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                V x0 = VLOAD(xr + kh * WS + kw), x1 = VLOAD(xr + (kh + 1) * WS + kw);
                const float *wk = wr + (kh * KW + kw) * OB;
#pragma GCC unroll 16
                for (int j = 0; j < OB; j++) {
                    V wv = VSET1(wk[j]);
                    acc[j][0] = VFMA(wv, x0, acc[j][0]);
                    acc[j][1] = VFMA(wv, x1, acc[j][1]);
                }
            }
    }
    if (d->pool == 2) { /* bias and ReLU commute with the max: max rows, pair, then bias, ReLU */
        int64_t q0 = c0 / 2, cnt = d->Wy - q0 < VL / 2 ? d->Wy - q0 : VL / 2;
#pragma GCC unroll 16
        for (int j = 0; j < OB; j++) {
            V m = VISNAN_SEL(VMAX(acc[j][0], acc[j][1]), acc[j][0]);
            m = VPAIRMAX(m);
            if (d->bias) m = VADD(m, VSET1(d->bias[o0 + j]));
            if (d->relu) m = VMAX(VZERO(), m);
            VSTORE_N(d->y + ((n * d->O + o0 + j) * d->Hy + oh / 2) * d->Wy + q0, m, cnt);
        }
        return;
    }
    int64_t cnt = d->Wo - c0 < VL ? d->Wo - c0 : VL;
    for (int r = 0; r < 2 && oh + r < d->Ho; r++)
#pragma GCC unroll 16
        for (int j = 0; j < OB; j++) {
            V m = acc[j][r];
            if (d->bias) m = VADD(m, VSET1(d->bias[o0 + j]));
            if (d->relu) m = VMAX(VZERO(), m);
            VSTORE_N(d->y + ((n * d->O + o0 + j) * d->Hy + oh + r) * d->Wy + c0, m, cnt);
        }
}

void FN(fm_conv_direct_rows)(const fm_conv_direct *d, int64_t begin, int64_t end) {
    const int64_t pairs = d->pool == 2 ? d->Hy : (d->Ho + 1) / 2, blocks = d->O / OB;
    const int64_t cols = d->pool == 2 ? 2 * d->Wy : d->Wo;
    for (int64_t t = begin; t < end; t++) {
        int64_t n = t / (blocks * pairs), r = t % (blocks * pairs);
        for (int64_t c0 = 0; c0 < cols; c0 += VL) FN(tile)(d, n, (r / pairs) * OB, 2 * (r % pairs), c0);
    }
}
