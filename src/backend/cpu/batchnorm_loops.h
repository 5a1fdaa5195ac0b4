/* batchnorm_cpu.c's per-element-type loops: the forward statistics, y = affine
 * normalisation, the backward per-channel sums and dx, reading its bn_job.
 *
 * Written once for both element types: batchnorm_cpu.c includes this file twice, with
 * T = float, SFX(name) = name_f32 and T = double, SFX(name) = name_f64, so each
 * loop compiles to its own typed function (no include guard on purpose). */
/* NCHW statistics: item = channel; part[c] = mean, part[C + c] = biased var */
static void SFX(bn_stats_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const bn_job *j = ctx;
    double M = (double)(j->outer * j->inner);
    bool simd = sizeof(T) == 4 && fm_cpu_use_avx2();
    for (int64_t c = b; c < e; c++) {
        double s = 0, ss = 0;
        if (simd) {
            for (int64_t o = 0; o < j->outer; o++)
                s += fm_avx2_sum_f32((const float *)j->x + (o * j->C + c) * j->inner, j->inner);
            double mean = s / M;
            float mf = (float)mean;
            for (int64_t o = 0; o < j->outer; o++)
                ss += fm_avx2_sqdev_f32((const float *)j->x + (o * j->C + c) * j->inner, j->inner, mf);
            /* sum (x - mf)^2 = sum (x - mean)^2 + M (mean - mf)^2 */
            ss -= M * (mean - mf) * (mean - mf);
            j->part[c] = mean; j->part[j->C + c] = (ss > 0 ? ss : 0) / M;
            continue;
        }
        for (int64_t o = 0; o < j->outer; o++) {
            const T *xp = (const T *)j->x + (o * j->C + c) * j->inner;
            for (int64_t i = 0; i < j->inner; i++) s += (double)xp[i];
        }
        double mean = s / M;
        for (int64_t o = 0; o < j->outer; o++) {
            const T *xp = (const T *)j->x + (o * j->C + c) * j->inner;
            for (int64_t i = 0; i < j->inner; i++) { double d = (double)xp[i] - mean; ss += d * d; }
        }
        j->part[c] = mean; j->part[j->C + c] = ss / M;
    }
}
/* channels-last partial sums: pass 0 sums x, pass 1 sums (x - mean)^2 (mean = j->mean) */
static void SFX(bn_rows_sum)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const bn_job *j = ctx;
    for (int64_t blk = b; blk < e; blk++) {
        double *acc = j->part + blk * j->C;
        for (int64_t c = 0; c < j->C; c++) acc[c] = 0;
        int64_t r1 = (blk + 1) * BN_ROWS < j->outer ? (blk + 1) * BN_ROWS : j->outer;
        for (int64_t r = blk * BN_ROWS; r < r1; r++) {
            const T *xp = (const T *)j->x + r * j->C;
            if (!j->mean) for (int64_t c = 0; c < j->C; c++) acc[c] += (double)xp[c];
            else for (int64_t c = 0; c < j->C; c++) { double d = (double)xp[c] - j->mean[c]; acc[c] += d * d; }
        }
    }
}
/* y = (x - mean) * rstd * w + b. item = (outer, channel) row of `inner` elements */
static void SFX(bn_apply)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const bn_job *j = ctx;
    const T *w = j->w, *bb = j->b;
    if (j->inner == 1) { /* item = row of C channels */
        for (int64_t r = b; r < e; r++) {
            const T *xp = (const T *)j->x + r * j->C; T *yp = (T *)j->y + r * j->C;
            for (int64_t c = 0; c < j->C; c++) {
                double sc = j->rstd[c] * (w ? (double)w[c] : 1.0);
                yp[c] = (T)(((double)xp[c] - j->mean[c]) * sc + (bb ? (double)bb[c] : 0.0));
            }
        }
        return;
    }
    for (int64_t it = b; it < e; it++) {
        int64_t c = it % j->C;
        T sc = (T)(j->rstd[c] * (w ? (double)w[c] : 1.0));
        T sh = (T)((bb ? (double)bb[c] : 0.0) - j->mean[c] * (double)sc);
        const T *xp = (const T *)j->x + it * j->inner; T *yp = (T *)j->y + it * j->inner;
        const int64_t n = j->inner; /* a local: a store through yp may alias j (-fno-strict-aliasing) */
        if (sizeof(T) == 4 && fm_cpu_use_avx2()) { fm_avx2_affine_f32((const float *)xp, (float *)yp, n, (float)sc, (float)sh); continue; }
        for (int64_t i = 0; i < n; i++) yp[i] = xp[i] * sc + sh;
    }
}
/* backward sums per channel: part[c] = sum dy, part[C + c] = sum dy * xhat. NCHW: item = c */
static void SFX(bn_bsum_nchw)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const bn_job *j = ctx;
    bool simd = sizeof(T) == 4 && fm_cpu_use_avx2();
    for (int64_t c = b; c < e; c++) {
        double s = 0, sx = 0;
        if (simd) {
            float mf = (float)j->mean[c];
            for (int64_t o = 0; o < j->outer; o++)
                fm_avx2_sum_dydev_f32((const float *)j->dy + (o * j->C + c) * j->inner,
                                      (const float *)j->x + (o * j->C + c) * j->inner, j->inner, mf, &s, &sx);
            /* sum dy (x - mf) = sum dy (x - mean) + (mean - mf) sum dy */
            sx -= (j->mean[c] - (double)mf) * s;
            j->part[c] = s; j->part[j->C + c] = sx * j->rstd[c];
            continue;
        }
        for (int64_t o = 0; o < j->outer; o++) {
            const T *xp = (const T *)j->x + (o * j->C + c) * j->inner;
            const T *gp = (const T *)j->dy + (o * j->C + c) * j->inner;
            for (int64_t i = 0; i < j->inner; i++) {
                s += (double)gp[i]; sx += (double)gp[i] * ((double)xp[i] - j->mean[c]);
            }
        }
        j->part[c] = s; j->part[j->C + c] = sx * j->rstd[c];
    }
}
/* channels last: per 256-row block, [2, C] partials (dy sum, dy*(x-mean) sum) */
static void SFX(bn_bsum_rows)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const bn_job *j = ctx;
    for (int64_t blk = b; blk < e; blk++) {
        double *acc = j->part + blk * 2 * j->C;
        for (int64_t c = 0; c < 2 * j->C; c++) acc[c] = 0;
        int64_t r1 = (blk + 1) * BN_ROWS < j->outer ? (blk + 1) * BN_ROWS : j->outer;
        for (int64_t r = blk * BN_ROWS; r < r1; r++) {
            const T *xp = (const T *)j->x + r * j->C, *gp = (const T *)j->dy + r * j->C;
            for (int64_t c = 0; c < j->C; c++) {
                acc[c] += (double)gp[c];
                acc[j->C + c] += (double)gp[c] * ((double)xp[c] - j->mean[c]);
            }
        }
    }
}
/* dx = a*dy + b*(x - mean) + k with per-channel coef a = coef[c], b = coef[C+c], k = coef[2C+c] */
static void SFX(bn_dx)(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const bn_job *j = ctx;
    const double *A = j->coef, *B = j->coef + j->C, *Kc = j->coef + 2 * j->C;
    if (j->inner == 1) {
        for (int64_t r = b; r < e; r++) {
            const T *xp = (const T *)j->x + r * j->C, *gp = (const T *)j->dy + r * j->C;
            T *dp = (T *)j->dx + r * j->C;
            for (int64_t c = 0; c < j->C; c++)
                dp[c] = (T)(A[c] * (double)gp[c] + B[c] * ((double)xp[c] - j->mean[c]) + Kc[c]);
        }
        return;
    }
    for (int64_t it = b; it < e; it++) {
        int64_t c = it % j->C;
        T a = (T)A[c], bc = (T)B[c], k = (T)(Kc[c] - B[c] * j->mean[c]);
        const T *xp = (const T *)j->x + it * j->inner, *gp = (const T *)j->dy + it * j->inner;
        T *dp = (T *)j->dx + it * j->inner;
        const int64_t n = j->inner; /* a local: a store through dp may alias j (-fno-strict-aliasing) */
        if (sizeof(T) == 4 && fm_cpu_use_avx2()) {
            fm_avx2_affine2_f32((const float *)gp, (const float *)xp, (float *)dp, n, (float)a, (float)bc, (float)k);
            continue;
        }
        for (int64_t i = 0; i < n; i++) dp[i] = a * gp[i] + bc * xp[i] + k;
    }
}
