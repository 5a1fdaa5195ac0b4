/* conv2d_fused: max_pool(relu(conv2d(x))) against a reference computed here in
 * double (a loop convolution, then ReLU, then the window max with NaN winning),
 * over the geometries that take the direct kernels (stride 1: AVX-512's pixel
 * tile for channels a multiple of 8 in thin blocks, the channels-along-lanes
 * kernel (AVX2, and AVX-512 for the other channel counts); odd and even sizes, column tails, column chunks, several input-
 * channel passes, pools 0 and 2; AVX-512's Winograd F(2x2, 3x3) for 3x3 convs with a 2x2 pool
 * or none, >= 8 input channels and whole 16-channel vectors) and the ones that take the reference path (stride 2, dilation, groups, NHWC,
 * pool 3, f64). test_ops runs it at every FATHOM_ISA level, so each kernel is
 * checked against the same double result. Also: NaN propagation and bad input. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"
#include "op_test.h"
#include "fathom/ops.h"

typedef struct fcase { int64_t N, C, H, W, O, k; int s, p, d, g, relu, pool; fm_layout layout; fm_dtype dt; } fcase;

/* ref [N, O, Hy, Wy] (NCHW) in double */
static double *reference(const fcase *c, const double *x, const double *w, const double *b, int64_t *Hy, int64_t *Wy) {
    int64_t Ho = (c->H + 2 * c->p - c->d * (c->k - 1) - 1) / c->s + 1, Wo = (c->W + 2 * c->p - c->d * (c->k - 1) - 1) / c->s + 1;
    int64_t Cg = c->C / c->g, Og = c->O / c->g, q = c->pool > 1 ? c->pool : 1;
    double *t = malloc(sizeof(double) * (size_t)(c->N * c->O * Ho * Wo));
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    double s = b ? b[o] : 0;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t i = 0; i < c->k; i++)
                            for (int64_t j = 0; j < c->k; j++) {
                                int64_t ih = oh * c->s - c->p + i * c->d, iw = ow * c->s - c->p + j * c->d;
                                if (ih >= 0 && ih < c->H && iw >= 0 && iw < c->W)
                                    s += x[((n * c->C + (o / Og) * Cg + ci) * c->H + ih) * c->W + iw] * w[((o * Cg + ci) * c->k + i) * c->k + j];
                            }
                    t[((n * c->O + o) * Ho + oh) * Wo + ow] = c->relu && s < 0 ? 0 : s;
                }
    *Hy = Ho / q, *Wy = Wo / q;
    double *y = malloc(sizeof(double) * (size_t)(c->N * c->O * *Hy * *Wy));
    for (int64_t p = 0; p < c->N * c->O; p++)
        for (int64_t oh = 0; oh < *Hy; oh++)
            for (int64_t ow = 0; ow < *Wy; ow++) {
                double m = -INFINITY;
                for (int64_t i = 0; i < q * q; i++) {
                    double v = t[(p * Ho + oh * q + i / q) * Wo + ow * q + i % q];
                    if (isnan(v) || v > m || (i == 0)) m = isnan(m) ? m : v;
                }
                y[(p * *Hy + oh) * *Wy + ow] = m;
            }
    free(t);
    return y;
}

static void check_case(const fcase *c, uint64_t seed, bool with_nan) {
    fm_tensor *x = op_randn(4, (int64_t[]){c->N, c->C, c->H, c->W}, c->dt, seed);
    fm_tensor *w = op_randn(4, (int64_t[]){c->O, c->C / c->g, c->k, c->k}, c->dt, seed + 1), *b = op_randn(1, &c->O, c->dt, seed + 2);
    if (with_nan) fm_tensor_set(x, 5, NAN);
    double *hx = op_host(x), *hw = op_host(w), *hb = op_host(b);
    int64_t Hy, Wy;
    double *ref = reference(c, hx, hw, hb, &Hy, &Wy);
    fm_conv2d_params p = fm_conv2d_default_params();
    p.stride[0] = p.stride[1] = c->s, p.padding[0] = p.padding[1] = c->p, p.dilation[0] = p.dilation[1] = c->d, p.groups = c->g;
    p.layout = c->layout;
    fm_tensor *xin = c->layout == FM_NHWC ? fm_permute(x, (int[]){0, 2, 3, 1}) : fm_tensor_retain(x), *xc = fm_contiguous(xin);
    fm_tensor *y = fm_conv2d_fused(xc, w, b, &p, c->relu, c->pool);
    CHECK_MSG(y, "conv2d_fused: %s", fm_last_error());
    if (y) {
        fm_tensor *yv = c->layout == FM_NHWC ? fm_permute(y, (int[]){0, 3, 1, 2}) : fm_tensor_retain(y);
        CHECK(yv->shape[0] == c->N && yv->shape[1] == c->O && yv->shape[2] == Hy && yv->shape[3] == Wy);
        double *hy = op_host(yv), worst = 0;
        int nan_ok = 1;
        for (int64_t i = 0; i < c->N * c->O * Hy * Wy; i++) {
            if (isnan(ref[i]) || isnan(hy[i])) { nan_ok &= isnan(ref[i]) && isnan(hy[i]); continue; }
            double e = fabs(hy[i] - ref[i]) / (1 + fabs(ref[i]));
            if (e > worst) worst = e;
        }
        double tol = c->dt == FM_F64 ? 1e-12 : 2e-5;
        CHECK_MSG(worst <= tol && nan_ok, "conv2d_fused N%lld C%lld %lldx%lld O%lld k%lld s%d p%d d%d g%d relu%d pool%d %s %s%s: err %g, NaN %s",
                  (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (long long)c->O, (long long)c->k, c->s, c->p, c->d,
                  c->g, c->relu, c->pool, c->layout == FM_NHWC ? "NHWC" : "NCHW", fm_dtype_name(c->dt), with_nan ? " +NaN" : "", worst,
                  nan_ok ? "ok" : "wrong");
        /* the same with the weights packed first (as a graph does at load): the same
         * kernel on the same packed or transformed weights, so the same bits */
        if (c->dt == FM_F32) {
            fm_tensor *pk = fm_conv2d_fused_pack(w), *y2 = pk ? fm_conv2d_fused_packed(xc, w, b, pk, &p, c->relu, c->pool) : NULL;
            CHECK_MSG(pk && y2, "conv2d_fused_pack / packed: %s", fm_last_error());
            if (y2) {
                fm_tensor *y2v = c->layout == FM_NHWC ? fm_permute(y2, (int[]){0, 3, 1, 2}) : fm_tensor_retain(y2);
                double *hy2 = op_host(y2v);
                int64_t diff = -1;
                for (int64_t i = 0; i < c->N * c->O * Hy * Wy; i++)
                    if (!(hy2[i] == hy[i] || (isnan(hy2[i]) && isnan(hy[i])))) { diff = i; break; }
                CHECK_MSG(diff < 0, "conv2d_fused packed N%lld C%lld O%lld k%lld pool%d: %g vs %g unpacked at %lld", (long long)c->N,
                          (long long)c->C, (long long)c->O, (long long)c->k, c->pool, diff >= 0 ? hy2[diff] : 0, diff >= 0 ? hy[diff] : 0,
                          (long long)diff);
                free(hy2);
                fm_tensor_release(y2v);
            }
            fm_tensor_release_n(2, pk, y2);
            /* capped (ReLU6's form: the reference path's epilogue), against the reference
             * capped: the cap commutes with the pool's max */
            const double hi = 0.5;
            fm_tensor *y3 = fm_conv2d_fused_capped(xc, w, b, NULL, &p, c->relu, hi, c->pool), *y3v = NULL;
            CHECK_MSG(y3, "conv2d_fused_capped: %s", fm_last_error());
            if (y3) {
                y3v = c->layout == FM_NHWC ? fm_permute(y3, (int[]){0, 3, 1, 2}) : fm_tensor_retain(y3);
                double *hy3 = op_host(y3v), worst3 = 0;
                int nan3 = 1;
                for (int64_t i = 0; i < c->N * c->O * Hy * Wy; i++) {
                    if (isnan(ref[i]) || isnan(hy3[i])) { nan3 &= isnan(ref[i]) && isnan(hy3[i]); continue; }
                    const double r = ref[i] > hi ? hi : ref[i], e = fabs(hy3[i] - r) / (1 + fabs(r));
                    if (e > worst3 || hy3[i] > hi) worst3 = hy3[i] > hi ? 1 : e;
                }
                CHECK_MSG(worst3 <= tol && nan3, "conv2d_fused capped at %g N%lld C%lld O%lld k%lld relu%d pool%d: err %g, NaN %s", hi,
                          (long long)c->N, (long long)c->C, (long long)c->O, (long long)c->k, c->relu, c->pool, worst3, nan3 ? "ok" : "wrong");
                free(hy3);
            }
            fm_tensor_release_n(2, y3, y3v);
        }
        free(hy);
        fm_tensor_release(yv);
    }
    free(hx), free(hw), free(hb), free(ref);
    fm_tensor_release_n(5, x, w, b, xin, xc);
    fm_tensor_release(y);
}

static int conv2d_fused_forward(void) {
    OP_BEGIN;
    const fm_layout NC = FM_NCHW;
    const fcase cases[] = {
        /* the direct kernels: fashion-cnn's two layers, odd sizes, column tails, pools 0/1/2 */
        {2, 1, 28, 28, 32, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32},
        {3, 32, 14, 14, 64, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32},
        {2, 3, 7, 21, 16, 3, 1, 1, 1, 1, 1, 0, NC, FM_F32},
        {1, 5, 9, 35, 8, 3, 1, 0, 1, 1, 0, 2, NC, FM_F32},
        {2, 4, 11, 17, 24, 5, 1, 2, 1, 1, 1, 1, NC, FM_F32},
        {1, 2, 6, 6, 12, 1, 1, 0, 1, 1, 0, 0, NC, FM_F32}, /* 12 channels: lanes (2 vectors, 4 lanes unused) at both levels */
        {1, 3, 13, 9, 8, 2, 1, 0, 1, 1, 1, 2, NC, FM_F32},
        {2, 3, 9, 19, 20, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32}, /* AVX2: a block of 3 vectors */
        {1, 2, 8, 10, 4, 3, 1, 1, 1, 1, 0, 0, NC, FM_F32},  /* AVX2: one half-used vector */
        /* the lanes kernel (AVX2; AVX-512 too, whose pixel tile needs channels in 8s) */
        {2, 40, 9, 11, 70, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32}, /* 3 input-channel passes; blocks of 4, 4, 1 vectors, 70 of 72 lanes */
        {1, 20, 6, 7, 13, 5, 1, 2, 1, 1, 0, 0, NC, FM_F32},  /* 5x5: 4 passes; 13 channels; odd rows, no pool */
        {1, 3, 5, 101, 41, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32}, /* column chunks of 48, 48, 4, pooled */
        {1, 2, 3, 101, 9, 3, 1, 1, 1, 1, 0, 0, NC, FM_F32},  /* chunks of 48, 48, 5; 3 rows, no pool */
        {2, 5, 7, 8, 17, 4, 1, 1, 1, 1, 1, 2, NC, FM_F32},   /* even kernel (kW is not 3): 7x8 -> 6x7 -> 3x3 */
        /* the reference path */
        {2, 3, 10, 12, 6, 3, 2, 1, 1, 1, 1, 2, NC, FM_F32},
        {1, 4, 12, 12, 8, 3, 1, 2, 2, 1, 1, 2, NC, FM_F32},
        {2, 4, 9, 9, 8, 3, 1, 1, 1, 2, 1, 2, NC, FM_F32},
        {2, 3, 10, 10, 8, 3, 1, 1, 1, 1, 1, 3, NC, FM_F32},
        {2, 3, 10, 11, 8, 3, 1, 1, 1, 1, 1, 2, FM_NHWC, FM_F32},
        {2, 3, 10, 11, 8, 3, 1, 1, 1, 1, 1, 2, NC, FM_F64},
        /* AVX2's lanes kernel, the epilogue's short runs (a channel's outputs in a task < 8: lane by lane) */
        {2, 3, 4, 4, 10, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32},  /* 2x2 pooled: one run of 4 */
        {1, 2, 2, 3, 9, 3, 1, 1, 1, 1, 0, 0, NC, FM_F32},   /* 2x3, no pool: one row pair, a run of 6 */
        {2, 6, 14, 10, 16, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32}, /* 7x5 pooled: groups of 2, 2 and 3 row pairs (10, 10, 15) */
        /* AVX-512's lanes kernel on whole 16-channel vectors (C*kH*kW >= 32): 2 blocks, 2 passes; a 5x5 */
        {2, 40, 9, 13, 64, 3, 1, 1, 1, 1, 1, 2, NC, FM_F32},
        {1, 4, 10, 9, 32, 5, 1, 2, 1, 1, 0, 0, NC, FM_F32},
        /* AVX-512's Winograd (cases 1 and 23 too): 48 channels (a half block), rows of 8 tiles, no ReLU, no padding */
        {2, 16, 9, 17, 48, 3, 1, 1, 1, 1, 0, 2, NC, FM_F32},
        {1, 8, 12, 12, 16, 3, 1, 0, 1, 1, 1, 2, NC, FM_F32},
        /* Winograd without a pool: odd output sizes (the last tile row and column cut short),
         * even ones, ReLU or not, no padding, tasks over several tile rows */
        {2, 16, 9, 13, 32, 3, 1, 1, 1, 1, 1, 0, NC, FM_F32},
        {1, 24, 14, 14, 64, 3, 1, 1, 1, 1, 0, 0, NC, FM_F32},
        {1, 8, 11, 8, 16, 3, 1, 0, 1, 1, 1, 1, NC, FM_F32},
        {1, 32, 28, 30, 48, 3, 1, 1, 1, 1, 1, 0, NC, FM_F32},
        /* 1x1 unpadded (AVX2: conv_pw.h's kernel, 16 pixels of the batch a tile): 7x7 planes,
         * so tiles span two samples, and 13 channels (panels of 6, 6, 1); one pixel a sample
         * (a tile spans 16, the last tile mostly past the batch); 4 pixels a sample; one input
         * channel; groups; a pool after it */
        {3, 37, 7, 7, 13, 1, 1, 0, 1, 1, 1, 0, NC, FM_F32},
        {2, 5, 1, 1, 20, 1, 1, 0, 1, 1, 0, 0, NC, FM_F32},
        {21, 3, 2, 2, 8, 1, 1, 0, 1, 1, 1, 0, NC, FM_F32},
        {1, 1, 17, 19, 7, 1, 1, 0, 1, 1, 1, 0, NC, FM_F32},
        {2, 8, 4, 5, 6, 1, 1, 0, 1, 2, 0, 0, NC, FM_F32},
        {2, 6, 8, 10, 12, 1, 1, 0, 1, 1, 1, 2, NC, FM_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 10 + 3 * i, false);
    check_case(&cases[1], 99, true); /* a NaN input reaches the pooled outputs over it */
    check_case(&cases[2], 98, true);
    check_case(&cases[18], 97, true);
    check_case(&cases[27], 96, true); /* a NaN through the unpooled Winograd tiles */
    check_case(&cases[9], 96, true); /* lanes: NaN through the input-channel passes */
    check_case(&cases[20], 95, true); /* lanes: NaN through a short run */
    check_case(&cases[22], 94, true); /* lanes: NaN through a group of row pairs */
    check_case(&cases[25], 93, true); /* Winograd: NaN through the transforms */
    check_case(&cases[34], 92, true); /* 1x1: NaN through a tile that spans four samples */
    /* bad input */
    fm_tensor *x = op_randn(4, (int64_t[]){1, 2, 5, 5}, FM_F32, 1), *w = op_randn(4, (int64_t[]){4, 2, 3, 3}, FM_F32, 2);
    fm_tensor *xh = fm_to_dtype(x, FM_BF16), *wh = fm_to_dtype(w, FM_BF16), *w3 = op_randn(4, (int64_t[]){4, 3, 3, 3}, FM_F32, 3);
    CHECK(!fm_conv2d_fused(x, w, NULL, NULL, true, 4));
    CHECK_ERR_CONTAINS("pool 4");
    CHECK(!fm_conv2d_fused(x, w, NULL, NULL, true, -1));
    CHECK(!fm_conv2d_fused(xh, wh, NULL, NULL, true, 2));
    CHECK_ERR_CONTAINS("f32 or f64");
    CHECK(!fm_conv2d_fused_capped(x, w, NULL, NULL, NULL, true, NAN, 0));
    CHECK_ERR_CONTAINS("the cap is NaN");
    CHECK(!fm_conv2d_fused(x, w3, NULL, NULL, false, 0));
    CHECK_ERR_CONTAINS("conv2d_fused: weight");
    fm_tensor *ok = fm_conv2d_fused(x, w, NULL, NULL, false, 3);
    CHECK(ok && ok->shape[2] == 1 && ok->shape[3] == 1);
    fm_tensor_release_n(6, x, w, xh, wh, w3, ok);
    OP_END;
}

/* Weights packed once (fm_conv2d_fused_pack, as a graph does at load) give the same
 * bits as the per-call packing; a packed tensor of another weight shape is ignored;
 * a packed tensor of the wrong kind is refused. Runs at every ISA level (scalar:
 * the form that says "not packed"). */
static int conv2d_fused_prepacked(void) {
    OP_BEGIN;
    const int64_t shapes[][5] = {{32, 1, 3, 28, 1}, {64, 32, 3, 14, 2}, {20, 3, 3, 9, 1}, {12, 2, 1, 6, 1}, {13, 40, 3, 7, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t *s = shapes[i];
        fm_tensor *x = op_randn(4, (int64_t[]){s[4], s[1], s[3], s[3]}, FM_F32, 40 + i);
        fm_tensor *w = op_randn(4, (int64_t[]){s[0], s[1], s[2], s[2]}, FM_F32, 50 + i), *b = op_randn(1, &s[0], FM_F32, 60 + i);
        fm_tensor *other = op_randn(4, (int64_t[]){s[0], s[1] + 1, s[2], s[2]}, FM_F32, 70 + i);
        fm_conv2d_params p = fm_conv2d_default_params();
        p.padding[0] = p.padding[1] = (int)(s[2] / 2);
        fm_tensor *pk = fm_conv2d_fused_pack(w), *pk_other = fm_conv2d_fused_pack(other);
        CHECK_MSG(pk && pk_other, "conv2d_fused_pack: %s", fm_last_error());
        fm_tensor *y0 = fm_conv2d_fused(x, w, b, &p, true, 2), *y1 = fm_conv2d_fused_packed(x, w, b, pk, &p, true, 2);
        fm_tensor *y2 = fm_conv2d_fused_packed(x, w, b, pk_other, &p, true, 2);
        CHECK_MSG(y0 && y1 && y2, "conv2d_fused_packed: %s", fm_last_error());
        if (y0 && y1 && y2) {
            double *h0 = op_host(y0), *h1 = op_host(y1), *h2 = op_host(y2);
            int same = 1;
            for (int64_t k = 0; k < fm_tensor_numel(y0); k++) same &= h0[k] == h1[k] && h0[k] == h2[k];
            CHECK_MSG(same, "conv2d_fused: packed weights changed the result (O%lld C%lld k%lld)", (long long)s[0], (long long)s[1], (long long)s[2]);
            free(h0), free(h1), free(h2);
        }
        fm_tensor_release_n(9, x, w, b, other, pk, pk_other, y0, y1, y2);
    }
    fm_tensor *x = op_randn(4, (int64_t[]){1, 2, 6, 6}, FM_F32, 1), *w = op_randn(4, (int64_t[]){4, 2, 3, 3}, FM_F32, 2);
    fm_tensor *bad = op_randn(2, (int64_t[]){3, 25}, FM_F32, 3), *wd = fm_to_dtype(w, FM_F64);
    CHECK(!fm_conv2d_fused_packed(x, w, NULL, bad, NULL, true, 2));
    CHECK_ERR_CONTAINS("packed weights");
    CHECK(!fm_conv2d_fused_pack(wd));
    CHECK_ERR_CONTAINS("f32");
    CHECK(!fm_conv2d_fused_pack(NULL));
    fm_tensor_release_n(4, x, w, bad, wd);
    OP_END;
}

OP_TEST("conv2d_fused", conv2d_fused_forward, NULL)
OP_TEST("conv2d_fused_pack", conv2d_fused_prepacked, NULL)
