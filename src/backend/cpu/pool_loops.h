/* pool_cpu.c's per-element-type loops: max and average pooling and their
 * backwards, NCHW (item = plane or sample) and NHWC (item = (n, oh) or sample).
 *
 * Written once for both element types: pool_cpu.c includes this file twice, with
 * T = float, SFX(name) = name_f32 and T = double, SFX(name) = name_f64, so each
 * loop compiles to its own typed function (no include guard on purpose). */
/* max pool, NCHW, without the indices (inference): item = plane; separable, the
 * window's max over its rows into a row padded with -inf, then over its columns,
 * plain loops the compiler vectorizes. ws: 2 (W + 2 pw + kw + sw) elements (pool_cpu.c's
 * job.wsn): the row, then the window maxima at every column. NaN wins. Cloned per
 * vector width (compares and selects only: the same bits at each), as conv2d's
 * epilogue: ResNet's stem pool (64 planes of 112x112, 3x3/2) 0.38 -> 0.29 ms on 2
 * threads of an Intel Xeon model 167; SqueezeNet's first (96 of 109x109) 0.53 -> 0.52,
 * bound by reading the planes. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void SFX(maxpool_nchw_noidx)(const fm_pool_geom *g, const T *xp, T *yp, T *ws) {
    /* locals and restrict: the build has -fno-strict-aliasing, so stores through T
     * pointers would otherwise reload g's fields and keep the loops scalar */
    const int64_t H = g->H, W = g->W, Wo = g->Wo, kh = g->kh, kw = g->kw, sh = g->sh, sw = g->sw, ph = g->ph;
    const int64_t Wp = W + 2 * g->pw;
    for (int64_t i = 0; i < Wp + kw + sw; i++) ws[i] = (T)-INFINITY;
    T *restrict row = ws + g->pw;
    for (int64_t oh = 0; oh < g->Ho; oh++) {
        int64_t hs = oh * sh - ph, he = hs + kh;
        if (hs < 0) hs = 0;
        if (he > H) he = H;
        const T *restrict r0 = xp + hs * W;
        for (int64_t w = 0; w < W; w++) row[w] = r0[w];
        for (int64_t h = hs + 1; h < he; h++) {
            const T *restrict r = xp + h * W;
            for (int64_t w = 0; w < W; w++) {
                const T a = r[w], m = row[w];
                row[w] = ((a > m) | (a != a)) ? a : m; /* NaN wins; non-short-circuit: vectorizes */
            }
        }
        const T *restrict wsr = ws;
        T *restrict y = yp + oh * Wo;
        if (sw == 2 && kw == 3) { /* ResNet's and SqueezeNet's 3x3/2: the three columns of each window
                                   * read strided (the compiler deinterleaves them) */
            for (int64_t ow = 0; ow < Wo; ow++) {
                const T a = wsr[2 * ow], b = wsr[2 * ow + 1], c = wsr[2 * ow + 2];
                const T m = ((b > a) | (b != b)) ? b : a;
                y[ow] = ((c > m) | (c != c)) ? c : m;
            }
            continue;
        }
        /* the window's max at every column (contiguous, vectorized), then every sw-th */
        T *restrict hm = ws + Wp + kw + sw;
        const int64_t nc = (Wo - 1) * sw + 1;
        for (int64_t c = 0; c < nc; c++) hm[c] = wsr[c];
        for (int64_t j = 1; j < kw; j++)
            for (int64_t c = 0; c < nc; c++) {
                const T a = wsr[c + j], m = hm[c];
                hm[c] = ((a > m) | (a != a)) ? a : m;
            }
        for (int64_t ow = 0; ow < Wo; ow++) y[ow] = hm[ow * sw];
    }
}
/* max pool, NCHW: item = plane; NaN wins (as PyTorch), index = ih*W + iw */
static void SFX(maxpool_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    if (!j->idx) { /* no indices wanted: the separable loops, in this thread's row of scratch */
        T *ws = (T *)j->ws + (int64_t)tid * j->wsn;
        for (int64_t pl = b; pl < e; pl++)
            SFX(maxpool_nchw_noidx)(g, (const T *)j->x + pl * g->H * g->W, (T *)j->y + pl * g->Ho * g->Wo, ws);
        return;
    }
    for (int64_t pl = b; pl < e; pl++) {
        const T *xp = (const T *)j->x + pl * g->H * g->W;
        T *yp = (T *)j->y + pl * g->Ho * g->Wo;
        int64_t *ip = j->idx + pl * g->Ho * g->Wo;
        if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 && 2 * g->Ho <= g->H &&
            2 * g->Wo <= g->W) { /* (a ceil_mode window past the end takes the generic loop) */
            /* the common 2x2/2 pool without the generic window bookkeeping */
            bool simd = sizeof(T) == 4 && fm_cpu_use_avx2() && g->W < ((int64_t)1 << 30);
            for (int64_t oh = 0; oh < g->Ho; oh++) {
                const T *r0 = xp + 2 * oh * g->W, *r1 = r0 + g->W;
                int64_t ow0 = !simd ? 0 : fm_avx2_maxpool2x2_row_f32((const float *)(const void *)r0,
                    (const float *)(const void *)r1, g->Wo, g->W, 2 * oh * g->W,
                    (float *)(void *)(yp + oh * g->Wo), ip + oh * g->Wo);
                for (int64_t ow = ow0; ow < g->Wo; ow++) {
                    T v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
                    T best = v[0]; int k = 0;
                    for (int q = 1; q < 4; q++)
                        if (!isnan(best) && (v[q] > best || isnan(v[q]))) { best = v[q]; k = q; }
                    yp[oh * g->Wo + ow] = best;
                    ip[oh * g->Wo + ow] = (2 * oh + (k >> 1)) * g->W + 2 * ow + (k & 1);
                }
            }
            continue;
        }
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                const pool_win win = pool_window(g, oh, ow);
                T best = (T)-INFINITY; int64_t bi = win.hs * g->W + win.ws;
                for (int64_t ih = win.hs; ih < win.he; ih++)
                    for (int64_t iw = win.ws; iw < win.we; iw++) {
                        T v = xp[ih * g->W + iw];
                        if (v > best || isnan(v)) { best = v; bi = ih * g->W + iw; if (isnan(v)) goto nan_found; }
                    }
                nan_found:
                yp[oh * g->Wo + ow] = best; ip[oh * g->Wo + ow] = bi;
            }
    }
}
/* max pool, NHWC: item = (n, oh); channels innermost */
static void SFX(maxpool_nhwc)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    for (int64_t it = b; it < e; it++) {
        int64_t n = it / g->Ho, oh = it % g->Ho;
        const T *xn = (const T *)j->x + n * g->H * g->W * g->C;
        for (int64_t ow = 0; ow < g->Wo; ow++) {
            const pool_win win = pool_window(g, oh, ow);
            T *yp = (T *)j->y + ((n * g->Ho + oh) * g->Wo + ow) * g->C;
            int64_t *ip = j->idx ? j->idx + ((n * g->Ho + oh) * g->Wo + ow) * g->C : NULL; /* NULL: no indices */
            for (int64_t c = 0; c < g->C; c++) yp[c] = (T)-INFINITY;
            if (ip)
                for (int64_t c = 0; c < g->C; c++) ip[c] = win.hs * g->W + win.ws;
            for (int64_t ih = win.hs; ih < win.he; ih++)
                for (int64_t iw = win.ws; iw < win.we; iw++) {
                    const T *xp = xn + (ih * g->W + iw) * g->C;
                    int64_t pos = ih * g->W + iw;
                    for (int64_t c = 0; c < g->C; c++) {
                        T v = xp[c];
                        if ((v > yp[c] || isnan(v)) && !isnan(yp[c])) {
                            yp[c] = v;
                            if (ip) ip[c] = pos;
                        }
                    }
                }
        }
    }
}
/* max pool backward NCHW: item = plane (indices stay inside their plane) */
static void SFX(maxpool_bwd_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    for (int64_t pl = b; pl < e; pl++) {
        T *dxp = (T *)j->dx + pl * g->H * g->W;
        const T *dyp = (const T *)j->dy + pl * g->Ho * g->Wo;
        const int64_t *ip = j->cidx + pl * g->Ho * g->Wo;
        memset(dxp, 0, (size_t)(g->H * g->W) * sizeof(T));
        const int64_t n = g->Ho * g->Wo; /* a local: not reloaded after each store (-fno-strict-aliasing) */
        for (int64_t q = 0; q < n; q++) dxp[ip[q]] += dyp[q];
    }
}
/* max pool backward NHWC: item = sample */
static void SFX(maxpool_bwd_nhwc)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    for (int64_t n = b; n < e; n++) {
        T *dxn = (T *)j->dx + n * g->H * g->W * g->C;
        memset(dxn, 0, (size_t)(g->H * g->W * g->C) * sizeof(T));
        const T *dyp = (const T *)j->dy + n * g->Ho * g->Wo * g->C;
        const int64_t *ip = j->cidx + n * g->Ho * g->Wo * g->C;
        for (int64_t q = 0; q < g->Ho * g->Wo; q++)
            for (int64_t c = 0; c < g->C; c++) dxn[ip[q * g->C + c] * g->C + c] += dyp[q * g->C + c];
    }
}
/* avg pool NCHW: item = plane */
static void SFX(avgpool_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    for (int64_t pl = b; pl < e; pl++) {
        const T *xp = (const T *)j->x + pl * g->H * g->W;
        T *yp = (T *)j->y + pl * g->Ho * g->Wo;
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                const pool_win win = pool_window(g, oh, ow);
                T s = 0;
                for (int64_t ih = win.hs; ih < win.he; ih++)
                    for (int64_t iw = win.ws; iw < win.we; iw++) s += xp[ih * g->W + iw];
                yp[oh * g->Wo + ow] = win.cnt > 0 ? s / (T)win.cnt : (T)0;
            }
    }
}
/* avg pool NHWC: item = (n, oh) */
static void SFX(avgpool_nhwc)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    for (int64_t it = b; it < e; it++) {
        int64_t n = it / g->Ho, oh = it % g->Ho;
        const T *xn = (const T *)j->x + n * g->H * g->W * g->C;
        for (int64_t ow = 0; ow < g->Wo; ow++) {
            const pool_win win = pool_window(g, oh, ow);
            T *yp = (T *)j->y + ((n * g->Ho + oh) * g->Wo + ow) * g->C;
            for (int64_t c = 0; c < g->C; c++) yp[c] = 0;
            for (int64_t ih = win.hs; ih < win.he; ih++)
                for (int64_t iw = win.ws; iw < win.we; iw++) {
                    const T *xp = xn + (ih * g->W + iw) * g->C;
                    for (int64_t c = 0; c < g->C; c++) yp[c] += xp[c];
                }
            T inv = win.cnt > 0 ? (T)1 / (T)win.cnt : (T)0;
            for (int64_t c = 0; c < g->C; c++) yp[c] *= inv;
        }
    }
}
/* avg pool backward NCHW: item = plane */
static void SFX(avgpool_bwd_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    for (int64_t pl = b; pl < e; pl++) {
        T *dxp = (T *)j->dx + pl * g->H * g->W;
        const T *dyp = (const T *)j->dy + pl * g->Ho * g->Wo;
        memset(dxp, 0, (size_t)(g->H * g->W) * sizeof(T));
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                const pool_win win = pool_window(g, oh, ow);
                if (win.cnt <= 0) continue;
                T v = dyp[oh * g->Wo + ow] / (T)win.cnt;
                for (int64_t ih = win.hs; ih < win.he; ih++)
                    for (int64_t iw = win.ws; iw < win.we; iw++) dxp[ih * g->W + iw] += v;
            }
    }
}
/* avg pool backward NHWC: item = sample */
static void SFX(avgpool_bwd_nhwc)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pool_job *j = ctx; const fm_pool_geom *g = j->g;
    for (int64_t n = b; n < e; n++) {
        T *dxn = (T *)j->dx + n * g->H * g->W * g->C;
        memset(dxn, 0, (size_t)(g->H * g->W * g->C) * sizeof(T));
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                const pool_win win = pool_window(g, oh, ow);
                if (win.cnt <= 0) continue;
                const T *dyp = (const T *)j->dy + ((n * g->Ho + oh) * g->Wo + ow) * g->C;
                T inv = (T)1 / (T)win.cnt;
                for (int64_t ih = win.hs; ih < win.he; ih++)
                    for (int64_t iw = win.ws; iw < win.we; iw++) {
                        T *d = dxn + (ih * g->W + iw) * g->C;
                        for (int64_t c = 0; c < g->C; c++) d[c] += dyp[c] * inv;
                    }
            }
    }
}
