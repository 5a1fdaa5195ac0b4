/* Tests of conv2d, max_pool2d, avg_pool2d and batch_norm: forward values against
 * direct (loop) references computed here in double, in NCHW and NHWC, f32 and
 * f64, on non-contiguous inputs; finite-difference gradient checks in f64;
 * running-stat updates (PyTorch convention); thread-count independence; bad input. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"
#include "op_test.h"
#include "gradcheck.h"

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_set_num_threads: results must not depend on it */

/* NCHW <-> NHWC as contiguous copies (new references). */
static fm_tensor *to_nhwc(fm_tensor *t) {
    fm_tensor *v = fm_permute(t, (int[]){0, 2, 3, 1}), *c = fm_contiguous(v);
    fm_tensor_release(v);
    return c;
}
static fm_tensor *nhwc_view_as_nchw(fm_tensor *t) { return fm_permute(t, (int[]){0, 3, 1, 2}); }

/* ------------------------------------------------------------------ conv2d */

/* Direct convolution in double over NCHW host arrays. */
static void ref_conv(const double *x, const double *w, const double *b, double *y, int64_t N, int64_t C, int64_t H,
                     int64_t W, int64_t O, int64_t kh, int64_t kw, const fm_conv2d_params *p, int64_t Ho, int64_t Wo) {
    int64_t G = p->groups, Cg = C / G, Og = O / G;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    double s = b ? b[o] : 0.0;
                    int64_t g = o / Og;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t i = 0; i < kh; i++)
                            for (int64_t j = 0; j < kw; j++) {
                                int64_t ih = oh * p->stride[0] - p->padding[0] + i * p->dilation[0];
                                int64_t iw = ow * p->stride[1] - p->padding[1] + j * p->dilation[1];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                s += x[((n * C + g * Cg + c) * H + ih) * W + iw] * w[((o * Cg + c) * kh + i) * kw + j];
                            }
                    y[((n * O + o) * Ho + oh) * Wo + ow] = s;
                }
}

/* x_nchw: logical NCHW input (any strides). Runs the conv in `layout` and compares. */
static void check_conv(fm_tensor *x_nchw, fm_tensor *w, fm_tensor *b, fm_conv2d_params p, double tol, const char *what) {
    int64_t N = x_nchw->shape[0], C = x_nchw->shape[1], H = x_nchw->shape[2], W = x_nchw->shape[3];
    int64_t O = w->shape[0], kh = w->shape[2], kw = w->shape[3];
    int64_t Ho = (H + 2 * p.padding[0] - p.dilation[0] * (kh - 1) - 1) / p.stride[0] + 1;
    int64_t Wo = (W + 2 * p.padding[1] - p.dilation[1] * (kw - 1) - 1) / p.stride[1] + 1;
    fm_tensor *xin = p.layout == FM_NHWC ? to_nhwc(x_nchw) : fm_tensor_retain(x_nchw);
    fm_tensor *y = fm_conv2d(xin, w, b, &p);
    CHECK_MSG(y != NULL, "conv2d %s: %s", what, fm_last_error());
    if (!y) { fm_tensor_release(xin); return; }
    CHECK(y->dtype == x_nchw->dtype && y->ndim == 4);
    if (p.layout == FM_NHWC) CHECK(y->shape[0] == N && y->shape[1] == Ho && y->shape[2] == Wo && y->shape[3] == O);
    else CHECK(y->shape[0] == N && y->shape[1] == O && y->shape[2] == Ho && y->shape[3] == Wo);
    double *hx = op_host(x_nchw), *hw = op_host(w), *hb = b ? op_host(b) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)(N * O * Ho * Wo));
    ref_conv(hx, hw, hb, ref, N, C, H, W, O, kh, kw, &p, Ho, Wo);
    fm_tensor *yv = p.layout == FM_NHWC ? nhwc_view_as_nchw(y) : fm_tensor_retain(y);
    double e = op_max_rel_err(yv, ref);
    CHECK_MSG(e <= tol, "conv2d %s %s %s: err %g", fm_dtype_name(x_nchw->dtype), p.layout == FM_NHWC ? "NHWC" : "NCHW",
              what, e);
    free(hx); free(hw); free(hb); free(ref);
    fm_tensor_release_n(3, xin, y, yv);
}

static fm_conv2d_params cp_make(int s0, int s1, int p0, int p1, int d0, int d1, int g) {
    fm_conv2d_params p = fm_conv2d_default_params();
    p.stride[0] = s0; p.stride[1] = s1; p.padding[0] = p0; p.padding[1] = p1;
    p.dilation[0] = d0; p.dilation[1] = d1; p.groups = g;
    return p;
}

static int conv2d_forward(void) {
    OP_BEGIN;
    fm_conv2d_params dp = fm_conv2d_default_params();
    CHECK(dp.stride[0] == 1 && dp.stride[1] == 1 && dp.padding[0] == 0 && dp.dilation[1] == 1 && dp.groups == 1 &&
          dp.layout == FM_NCHW);
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        double tol = d ? 1e-12 : 2e-5;
        for (int l = 0; l < 2; l++) {
            fm_layout lay = l ? FM_NHWC : FM_NCHW;
            fm_tensor *x = op_randn(4, (int64_t[]){2, 3, 7, 6}, dt, 1);
            fm_tensor *w = op_randn(4, (int64_t[]){4, 3, 3, 3}, dt, 2), *b = op_randn(1, (int64_t[]){4}, dt, 3);
            fm_conv2d_params p = cp_make(1, 1, 1, 1, 1, 1, 1); p.layout = lay;
            check_conv(x, w, b, p, tol, "3x3 pad 1 bias");
            p = cp_make(2, 1, 1, 0, 1, 2, 1); p.layout = lay;
            check_conv(x, w, NULL, p, tol, "stride (2,1) pad (1,0) dilation (1,2)");
            p = cp_make(3, 2, 2, 2, 2, 1, 1); p.layout = lay;
            check_conv(x, w, b, p, tol, "stride (3,2) pad 2 dilation (2,1)");
            /* groups: C 4 -> O 6 in 2 groups, kernel 3x2 */
            fm_tensor *xg = op_randn(4, (int64_t[]){3, 4, 5, 6}, dt, 4), *wg = op_randn(4, (int64_t[]){6, 2, 3, 2}, dt, 5);
            fm_tensor *bg = op_randn(1, (int64_t[]){6}, dt, 6);
            p = cp_make(1, 2, 1, 1, 1, 1, 2); p.layout = lay;
            check_conv(xg, wg, bg, p, tol, "groups 2");
            /* depthwise: groups = C = 3, two filters each */
            fm_tensor *wd = op_randn(4, (int64_t[]){6, 1, 3, 3}, dt, 7);
            p = cp_make(1, 1, 1, 1, 1, 1, 3); p.layout = lay;
            check_conv(x, wd, bg, p, tol, "depthwise");
            p = cp_make(2, 3, 2, 1, 2, 1, 3); p.layout = lay;
            check_conv(x, wd, NULL, p, tol, "depthwise stride (2,3) dilation (2,1)");
            /* 1x1 (no im2col), with and without groups, and 1x1 with stride (im2col) */
            fm_tensor *w1 = op_randn(4, (int64_t[]){6, 4, 1, 1}, dt, 8), *w1g = op_randn(4, (int64_t[]){6, 2, 1, 1}, dt, 9);
            p = cp_make(1, 1, 0, 0, 1, 1, 1); p.layout = lay;
            check_conv(xg, w1, bg, p, tol, "1x1");
            p.groups = 2;
            check_conv(xg, w1g, NULL, p, tol, "1x1 groups 2");
            p = cp_make(2, 2, 0, 0, 1, 1, 1); p.layout = lay;
            check_conv(xg, w1, bg, p, tol, "1x1 stride 2");
            /* non-contiguous input and weight */
            fm_tensor *base = op_randn(4, (int64_t[]){2, 3, 6, 7}, dt, 10), *xt = fm_transpose(base, 2, 3);
            fm_tensor *wbase = op_randn(4, (int64_t[]){8, 3, 3, 3}, dt, 11), *ws = fm_slice(wbase, 0, 0, 8, 2);
            p = cp_make(1, 1, 1, 1, 1, 1, 1); p.layout = lay;
            check_conv(xt, ws, b, p, tol, "transposed input, strided weight");
            /* a kernel as large as the padded input: one output pixel */
            fm_tensor *wbig = op_randn(4, (int64_t[]){2, 3, 9, 8}, dt, 12);
            check_conv(x, wbig, NULL, p, tol, "kernel = padded input");
            fm_tensor_release_n(14, x, w, b, xg, wg, bg, wd, w1, w1g, base, xt, wbase, ws, wbig);
        }
    }
    /* chunking of the batch (the im2col scratch is ~1 MiB): one sample per chunk (GEMM in place),
     * several samples per chunk with a ragged last chunk, in f32 and f64 */
    for (int l = 0; l < 2; l++)
        for (int d = 0; d < 2; d++) {
            fm_dtype dt = d ? FM_F64 : FM_F32;
            fm_conv2d_params p = cp_make(1, 1, 1, 1, 1, 1, 1);
            p.layout = l ? FM_NHWC : FM_NCHW;
            fm_tensor *x = op_randn(4, (int64_t[]){3, 16, 32, 32}, dt, 13);
            fm_tensor *w = op_randn(4, (int64_t[]){8, 16, 3, 3}, dt, 14), *b = op_randn(1, (int64_t[]){8}, dt, 15);
            check_conv(x, w, b, p, d ? 1e-12 : 1e-4, "one sample per chunk");
            fm_tensor *x2 = op_randn(4, (int64_t[]){7, 8, 24, 24}, dt, 16), *w2 = op_randn(4, (int64_t[]){8, 8, 3, 3}, dt, 17);
            check_conv(x2, w2, b, p, d ? 1e-12 : 1e-4, "ragged chunks");
            fm_tensor_release_n(5, x, w, b, x2, w2);
        }
    /* the depthwise direct kernel (f32 NCHW, conv_dw.h): rows of several vector blocks
     * with a tail (150 columns), column phases for strides 2 and 3, stride (2,1), 5x5
     * with pad 2, two filters per channel, planes split over the threads, narrow planes */
    {
        typedef struct { int64_t N, C, H, W, mult, kh, kw; int s0, s1, p0, p1; } dwshape;
        const dwshape shapes[] = {{2, 24, 57, 150, 1, 3, 3, 2, 2, 1, 1}, {1, 16, 14, 14, 1, 3, 3, 1, 1, 1, 1},
                                  {1, 8, 9, 23, 2, 5, 5, 2, 2, 2, 2},     {3, 5, 7, 7, 1, 5, 5, 1, 1, 2, 2},
                                  {1, 4, 5, 5, 1, 3, 3, 3, 3, 0, 0},      {1, 6, 11, 19, 1, 3, 2, 2, 1, 1, 0},
                                  {2, 3, 1, 70, 3, 1, 7, 1, 1, 0, 3},
                                  /* narrow planes, several rows at once (4 rows of one vector, 2 of two,
                                   * then single rows): 7x7, 27 wide, 10 wide with 5x5 at stride 2; stride
                                   * 2 on rows up to 128 wide split by masked vectors (45, 40 and 100 columns:
                                   * full and partial chunks; pads 1 and 2: odd and even pw) */
                                  {2, 6, 7, 7, 1, 3, 3, 1, 1, 1, 1},      {1, 5, 27, 27, 1, 3, 3, 1, 1, 1, 1},
                                  {1, 4, 12, 10, 1, 5, 5, 2, 2, 2, 2},    {2, 4, 14, 45, 1, 3, 3, 2, 2, 1, 1},
                                  {1, 3, 13, 40, 2, 3, 3, 2, 2, 0, 2},    {1, 3, 9, 100, 1, 3, 3, 2, 2, 1, 1},
                                  /* AVX2: rows of two vectors 4 at a time with 1 and 3 left over (13 and
                                   * 11 rows); a row's partial last vector stored whole over the next rows
                                   * (1 and 3 wide: over several), the plane's last row masked; stride 2 on
                                   * 14, 3 and 17 columns (one partial chunk; a full one and one column) */
                                  {2, 4, 13, 12, 1, 3, 3, 1, 1, 1, 1},    {1, 3, 11, 16, 1, 3, 3, 1, 1, 1, 1},
                                  {2, 5, 9, 1, 1, 3, 3, 1, 1, 1, 1},      {1, 6, 3, 3, 1, 3, 3, 1, 1, 1, 1},
                                  {2, 8, 14, 14, 1, 3, 3, 2, 2, 1, 1},    {1, 3, 6, 3, 1, 3, 3, 2, 2, 1, 1},
                                  {1, 3, 10, 17, 1, 3, 3, 2, 2, 0, 0}};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const dwshape *h = &shapes[i];
            fm_tensor *x = op_randn(4, (int64_t[]){h->N, h->C, h->H, h->W}, FM_F32, 40 + (uint64_t)i);
            fm_tensor *w = op_randn(4, (int64_t[]){h->C * h->mult, 1, h->kh, h->kw}, FM_F32, 50 + (uint64_t)i);
            fm_tensor *b = i % 2 ? NULL : op_randn(1, (int64_t[]){h->C * h->mult}, FM_F32, 60 + (uint64_t)i);
            char what[64];
            snprintf(what, sizeof what, "depthwise direct, shape %zu", i);
            check_conv(x, w, b, cp_make(h->s0, h->s1, h->p0, h->p1, 1, 1, (int)h->C), 2e-5, what);
            fm_tensor_release_n(3, x, w, b);
        }
    }
    /* thread-count independence, forward and backward, bitwise */
    for (int l = 0; l < 2; l++) {
        fm_conv2d_params p = cp_make(1, 1, 1, 1, 1, 1, 1);
        p.layout = l ? FM_NHWC : FM_NCHW;
        fm_tensor *x = op_randn(4, l ? (int64_t[]){9, 10, 11, 5} : (int64_t[]){9, 5, 10, 11}, FM_F32, 16);
        fm_tensor *w = op_randn(4, (int64_t[]){7, 5, 3, 3}, FM_F32, 17), *b = op_randn(1, (int64_t[]){7}, FM_F32, 18);
        fm_tensor *ys[2] = {0}, *gx[2] = {0}, *gw[2] = {0}, *gb[2] = {0};
        int nt = fm_num_threads();
        for (int r = 0; r < 2; r++) {
            fm_set_num_threads(r ? (nt > 1 ? nt : 2) : 1);
            fm_tensor_requires_grad_(x, true); fm_tensor_requires_grad_(w, true); fm_tensor_requires_grad_(b, true);
            ys[r] = fm_conv2d(x, w, b, &p);
            fm_tensor *s = fm_sum(ys[r], 0, NULL, false);
            CHECK(s && fm_backward(s, NULL, false) == FM_OK);
            gx[r] = fm_tensor_retain(x->grad); gw[r] = fm_tensor_retain(w->grad); gb[r] = fm_tensor_retain(b->grad);
            fm_tensor_zero_grad(x); fm_tensor_zero_grad(w); fm_tensor_zero_grad(b);
            fm_tensor_release(s);
        }
        fm_set_num_threads(nt);
        CHECK(op_bitwise_equal(ys[0], ys[1]) && op_bitwise_equal(gx[0], gx[1]) && op_bitwise_equal(gw[0], gw[1]) &&
              op_bitwise_equal(gb[0], gb[1]));
        fm_tensor_release_n(11, x, w, b, ys[0], ys[1], gx[0], gx[1], gw[0], gw[1], gb[0], gb[1]);
    }
    /* bad input */
    fm_tensor *x = op_randn(4, (int64_t[]){2, 3, 5, 5}, FM_F32, 20), *w = op_randn(4, (int64_t[]){4, 3, 3, 3}, FM_F32, 21);
    fm_tensor *x3 = op_randn(3, (int64_t[]){3, 5, 5}, FM_F32, 22), *w2 = op_randn(4, (int64_t[]){4, 2, 3, 3}, FM_F32, 23);
    fm_tensor *w64 = op_randn(4, (int64_t[]){4, 3, 3, 3}, FM_F64, 24), *b5 = op_randn(1, (int64_t[]){5}, FM_F32, 25);
    fm_tensor *wbig = op_randn(4, (int64_t[]){4, 3, 7, 7}, FM_F32, 26);
    fm_tensor *xi = fm_tensor_zeros(4, (int64_t[]){2, 3, 5, 5}, FM_I32, FM_CPU);
    fm_tensor *wi = fm_tensor_zeros(4, (int64_t[]){4, 3, 3, 3}, FM_I32, FM_CPU);
    fm_conv2d_params p = fm_conv2d_default_params();
    CHECK(fm_conv2d(x3, w, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: input must be 4-D (NCHW), got [3, 5, 5]");
    CHECK(fm_conv2d(x, w2, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: weight [4, 2, 3, 3] expects 2 input channels");
    CHECK_ERR_CONTAINS("input [2, 3, 5, 5] (NCHW) has 3");
    CHECK(fm_conv2d(x, w64, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: dtype mismatch: input f32, weight f64");
    CHECK(fm_conv2d(xi, wi, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: needs a floating-point input");
    CHECK(fm_conv2d(x, w, b5, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: bias shape [5] does not match the weight's 4 output channels");
    CHECK(fm_conv2d(x, wbig, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("does not fit the padded input 5x5");
    p.groups = 2;
    CHECK(fm_conv2d(x, w, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: groups 2 must be >= 1 and divide input channels 3");
    p = fm_conv2d_default_params();
    p.stride[1] = 0;
    CHECK(fm_conv2d(x, w, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: stride (1, 0)");
    p = fm_conv2d_default_params();
    p.layout = FM_NHWC; /* x read as NHWC has 5 channels */
    CHECK(fm_conv2d(x, w, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("(NHWC) has 5");
    CHECK(fm_conv2d(NULL, w, NULL, &p) == NULL);
    CHECK_ERR_CONTAINS("conv2d: input is NULL");
    fm_tensor_release_n(9, x, w, x3, w2, w64, b5, wbig, xi, wi);
    OP_END;
}

typedef struct conv_gc_ctx { fm_conv2d_params p; bool nhwc_in; } conv_gc_ctx;

static fm_tensor *conv_gc_fn(fm_tensor **in, void *ctx) {
    const conv_gc_ctx *c = ctx;
    return fm_conv2d(in[0], in[1], in[2], &c->p);
}

static int conv2d_grad(void) {
    OP_BEGIN;
    for (int l = 0; l < 2; l++) {
        fm_layout lay = l ? FM_NHWC : FM_NCHW;
        /* non-contiguous x: a transposed view of [N, W, H, C] (NHWC) or [N, C, W, H] (NCHW) */
        fm_tensor *xb = op_randn(4, l ? (int64_t[]){2, 4, 5, 4} : (int64_t[]){2, 4, 4, 5}, FM_F64, 30);
        fm_tensor *x = fm_transpose(xb, l ? 1 : 2, l ? 2 : 3);
        fm_tensor *w = op_randn(4, (int64_t[]){6, 2, 3, 3}, FM_F64, 31), *b = op_randn(1, (int64_t[]){6}, FM_F64, 32);
        fm_tensor_requires_grad_(x, true); /* a non-contiguous leaf */
        fm_tensor_requires_grad_(w, true);
        fm_tensor_requires_grad_(b, true);
        conv_gc_ctx c = {cp_make(2, 1, 1, 1, 1, 2, 2), false};
        c.p.layout = lay;
        fm_tensor *in[3] = {x, w, b};
        CHECK_MSG(gradcheck("conv2d groups/stride/dilation", conv_gc_fn, 3, in, &c, 1e-6, 1e-6), "layout %d", l);
        /* 3x3 pad 1, no bias */
        fm_tensor *w3 = op_randn(4, (int64_t[]){3, 4, 3, 3}, FM_F64, 33);
        fm_tensor_requires_grad_(w3, true);
        c.p = cp_make(1, 1, 1, 1, 1, 1, 1);
        c.p.layout = lay;
        fm_tensor *in3[3] = {x, w3, NULL};
        CHECK(gradcheck("conv2d 3x3 pad 1", conv_gc_fn, 3, in3, &c, 1e-6, 1e-6));
        /* 1x1 groups 2 */
        fm_tensor *w1 = op_randn(4, (int64_t[]){4, 2, 1, 1}, FM_F64, 34), *b1 = op_randn(1, (int64_t[]){4}, FM_F64, 35);
        fm_tensor_requires_grad_(w1, true);
        fm_tensor_requires_grad_(b1, true);
        c.p = cp_make(1, 1, 0, 0, 1, 1, 2);
        c.p.layout = lay;
        fm_tensor *in1[3] = {x, w1, b1};
        CHECK(gradcheck("conv2d 1x1", conv_gc_fn, 3, in1, &c, 1e-6, 1e-6));
        /* only the weight needs a gradient (first layer): dx is not computed */
        fm_tensor_requires_grad_(x, false);
        c.p = cp_make(1, 1, 1, 1, 1, 1, 1);
        c.p.layout = lay;
        CHECK(gradcheck("conv2d weight only", conv_gc_fn, 3, in3, &c, 1e-6, 1e-6));
        fm_tensor_release_n(7, xb, x, w, b, w3, w1, b1);
    }
    OP_END;
}

/* ------------------------------------------------------------------- pools */

static void ref_pool(int is_max, const double *x, double *y, int64_t N, int64_t C, int64_t H, int64_t W,
                     const fm_pool2d_params *p, int64_t Ho, int64_t Wo) {
    int sh = p->stride[0] ? p->stride[0] : p->kernel[0], sw = p->stride[1] ? p->stride[1] : p->kernel[1];
    for (int64_t nc = 0; nc < N * C; nc++)
        for (int64_t oh = 0; oh < Ho; oh++)
            for (int64_t ow = 0; ow < Wo; ow++) {
                double m = -INFINITY, s = 0;
                int64_t cnt = 0;
                for (int64_t i = 0; i < p->kernel[0]; i++)
                    for (int64_t j = 0; j < p->kernel[1]; j++) {
                        int64_t ih = oh * sh - p->padding[0] + i, iw = ow * sw - p->padding[1] + j;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                        double v = x[(nc * H + ih) * W + iw];
                        if (v > m) m = v;
                        s += v;
                        cnt++;
                    }
                if (p->count_include_pad) { /* the window within the padded input (a ceil_mode one may run past it) */
                    int64_t h0 = oh * sh - p->padding[0], w0 = ow * sw - p->padding[1];
                    int64_t h1 = h0 + p->kernel[0], w1 = w0 + p->kernel[1];
                    if (h1 > H + p->padding[0]) h1 = H + p->padding[0];
                    if (w1 > W + p->padding[1]) w1 = W + p->padding[1];
                    cnt = (h1 - h0) * (w1 - w0);
                }
                y[(nc * Ho + oh) * Wo + ow] = is_max ? m : s / (double)cnt;
            }
}

static fm_pool2d_params pp_make(int k0, int k1, int s0, int s1, int p0, int p1, bool inc) {
    fm_pool2d_params p;
    memset(&p, 0, sizeof p);
    p.kernel[0] = k0; p.kernel[1] = k1; p.stride[0] = s0; p.stride[1] = s1;
    p.padding[0] = p0; p.padding[1] = p1; p.count_include_pad = inc; p.layout = FM_NCHW;
    return p;
}

static void check_pool(int is_max, fm_tensor *x_nchw, fm_pool2d_params p, double tol, const char *what) {
    int64_t N = x_nchw->shape[0], C = x_nchw->shape[1], H = x_nchw->shape[2], W = x_nchw->shape[3];
    int sh = p.stride[0] ? p.stride[0] : p.kernel[0], sw = p.stride[1] ? p.stride[1] : p.kernel[1];
    int64_t Ho = (H + 2 * p.padding[0] - p.kernel[0]) / sh + 1, Wo = (W + 2 * p.padding[1] - p.kernel[1]) / sw + 1;
    if (p.ceil_mode) { /* PyTorch: rounded up, unless that last window starts past the input and its left padding */
        Ho = (H + 2 * p.padding[0] - p.kernel[0] + sh - 1) / sh + 1, Wo = (W + 2 * p.padding[1] - p.kernel[1] + sw - 1) / sw + 1;
        if ((Ho - 1) * sh >= H + p.padding[0]) Ho--;
        if ((Wo - 1) * sw >= W + p.padding[1]) Wo--;
    }
    fm_tensor *xin = p.layout == FM_NHWC ? to_nhwc(x_nchw) : fm_tensor_retain(x_nchw);
    fm_tensor *y = is_max ? fm_max_pool2d(xin, &p) : fm_avg_pool2d(xin, &p);
    CHECK_MSG(y != NULL, "%s %s: %s", is_max ? "max_pool2d" : "avg_pool2d", what, fm_last_error());
    if (!y) { fm_tensor_release(xin); return; }
    double *hx = op_host(x_nchw), *ref = malloc(sizeof(double) * (size_t)(N * C * Ho * Wo));
    ref_pool(is_max, hx, ref, N, C, H, W, &p, Ho, Wo);
    fm_tensor *yv = p.layout == FM_NHWC ? nhwc_view_as_nchw(y) : fm_tensor_retain(y);
    CHECK(yv->shape[0] == N && yv->shape[1] == C && yv->shape[2] == Ho && yv->shape[3] == Wo);
    double e = op_max_rel_err(yv, ref);
    CHECK_MSG(e <= tol, "%s %s %s %s: err %g", is_max ? "max_pool2d" : "avg_pool2d", fm_dtype_name(x_nchw->dtype),
              p.layout == FM_NHWC ? "NHWC" : "NCHW", what, e);
    free(hx); free(ref);
    fm_tensor_release_n(3, xin, y, yv);
}

static int pool_forward(int is_max) {
    OP_BEGIN;
    const char *op = is_max ? "max_pool2d" : "avg_pool2d";
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        double tol = d ? 1e-13 : 1e-6;
        for (int l = 0; l < 2; l++) {
            fm_tensor *x = op_randn(4, (int64_t[]){2, 3, 7, 8}, dt, 40);
            fm_tensor *base = op_randn(4, (int64_t[]){2, 3, 8, 7}, dt, 41), *xt = fm_transpose(base, 2, 3);
            fm_pool2d_params ps[4] = {pp_make(2, 2, 0, 0, 0, 0, true), pp_make(3, 3, 2, 2, 1, 1, true),
                                      pp_make(3, 2, 1, 2, 1, 1, false), pp_make(3, 3, 2, 1, 1, 0, false)};
            const char *names[4] = {"2x2 default stride", "3x3 s2 p1 incl pad", "3x2 s(1,2) p1 excl pad",
                                    "3x3 s(2,1) p(1,0)"};
            for (int k = 0; k < 4; k++) {
                ps[k].layout = l ? FM_NHWC : FM_NCHW;
                check_pool(is_max, x, ps[k], tol, names[k]);
                check_pool(is_max, xt, ps[k], tol, names[k]);
            }
            /* ceil_mode: windows past the end (clipped; an average counts the padded cells only) */
            fm_pool2d_params pc[3] = {pp_make(3, 3, 2, 2, 0, 0, true), pp_make(2, 2, 2, 2, 0, 0, false),
                                      pp_make(3, 2, 2, 3, 1, 1, true)};
            const char *cnames[3] = {"3x3 s2 ceil (SqueezeNet)", "2x2 s2 ceil, odd sizes", "3x2 s(2,3) p1 ceil incl pad"};
            for (int k = 0; k < 3; k++) {
                pc[k].layout = l ? FM_NHWC : FM_NCHW, pc[k].ceil_mode = true;
                check_pool(is_max, x, pc[k], tol, cnames[k]);
                check_pool(is_max, xt, pc[k], tol, cnames[k]);
            }
            fm_tensor *yc = is_max ? fm_max_pool2d(x, &pc[0]) : fm_avg_pool2d(x, &pc[0]);
            const int hx = l ? 1 : 2; /* x read as 7x8 (NCHW: 3x4, floor 3x3) or 3x7 with 8 channels (NHWC: 1x3) */
            CHECK(yc && yc->shape[hx] == (l ? 1 : 3) && yc->shape[hx + 1] == (l ? 3 : 4));
            fm_tensor_release_n(4, x, base, xt, yc);
        }
    }
    if (is_max) { /* without a backward to feed (no indices kept: separable loops) the values are
                   * bitwise those of the recorded pool, NaN included, in NCHW and NHWC */
        for (int l = 0; l < 2; l++) {
            fm_tensor *x = op_randn(4, (int64_t[]){2, 3, 11, 13}, FM_F32, 42);
            ((float *)fm_tensor_data(x))[2 * 13 + 5] = NAN;
            fm_pool2d_params p = pp_make(3, 3, 2, 2, 1, 1, true);
            p.layout = l ? FM_NHWC : FM_NCHW;
            fm_tensor *y0 = fm_max_pool2d(x, &p);
            fm_tensor_requires_grad_(x, true);
            fm_tensor *y1 = fm_max_pool2d(x, &p);
            const int64_t n = y0 ? fm_tensor_numel(y0) : 0;
            int nans = 0;
            for (int64_t i = 0; i < n; i++) nans += isnan(((const float *)fm_tensor_data(y0))[i]);
            CHECK(y0 && y1 && fm_tensor_numel(y1) == n &&
                  !memcmp(fm_tensor_data(y0), fm_tensor_data(y1), sizeof(float) * (size_t)n));
            CHECK_MSG(nans >= 1 && nans <= 4, "%d NaN outputs", nans); /* the windows holding it, no more */
            fm_tensor_release_n(3, x, y0, y1);
        }
    }
    if (is_max) { /* NaN propagates, as in PyTorch */
        fm_tensor *x = fm_tensor_from_data((float[]){1, NAN, 3, 4}, 4, (int64_t[]){1, 1, 2, 2}, FM_F32);
        fm_pool2d_params p = pp_make(2, 2, 0, 0, 0, 0, true);
        fm_tensor *y = fm_max_pool2d(x, &p);
        CHECK(y && isnan(fm_tensor_get(y, 0)));
        /* ties: the first maximum in the window gets the gradient, as in PyTorch */
        for (int l = 0; l < 2; l++) {
            fm_tensor *xt = fm_tensor_from_data((double[]){1, 3, 3, 2}, 4, l ? (int64_t[]){1, 2, 2, 1} : (int64_t[]){1, 1, 2, 2},
                                                FM_F64);
            fm_tensor_requires_grad_(xt, true);
            p.layout = l ? FM_NHWC : FM_NCHW;
            fm_tensor *yt = fm_max_pool2d(xt, &p), *s = yt ? fm_sum(yt, 0, NULL, false) : NULL;
            CHECK(s && fm_backward(s, NULL, false) == FM_OK && xt->grad);
            if (xt->grad) CHECK(fm_tensor_get(xt->grad, 1) == 1 && fm_tensor_get(xt->grad, 2) == 0);
            fm_tensor_release_n(3, xt, yt, s);
        }
        fm_tensor_release_n(2, x, y);
        /* wide f32 rows take the vectorized 2x2 path (8 outputs at a time, then a scalar tail):
         * values, ties (first maximum wins the gradient) and a NaN in the middle of a row */
        p.layout = FM_NCHW;
        int64_t W = 37, H = 6, nel = 2 * H * W;
        float *v = malloc(sizeof(float) * (size_t)nel);
        for (int64_t i = 0; i < nel; i++) v[i] = (float)((i * 7919) % 13) - 6.0f; /* many ties */
        fm_tensor *xw = fm_tensor_from_data(v, 4, (int64_t[]){1, 2, H, W}, FM_F32);
        fm_tensor_requires_grad_(xw, true);
        fm_tensor *yw = fm_max_pool2d(xw, &p), *sw = yw ? fm_sum(yw, 0, NULL, false) : NULL;
        CHECK(sw && fm_backward(sw, NULL, false) == FM_OK && xw->grad);
        int64_t Ho = H / 2, Wo = W / 2, bad = 0;
        for (int64_t pl = 0; yw && xw->grad && pl < 2; pl++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    int64_t at[4] = {(2 * oh) * W + 2 * ow, (2 * oh) * W + 2 * ow + 1, (2 * oh + 1) * W + 2 * ow,
                                     (2 * oh + 1) * W + 2 * ow + 1};
                    int k = 0;
                    for (int q = 1; q < 4; q++) if (v[pl * H * W + at[q]] > v[pl * H * W + at[k]]) k = q;
                    if (fm_tensor_get(yw, (pl * Ho + oh) * Wo + ow) != v[pl * H * W + at[k]]) bad++;
                    for (int q = 0; q < 4; q++)
                        if (fm_tensor_get(xw->grad, pl * H * W + at[q]) != (q == k ? 1.0 : 0.0)) bad++;
                }
        CHECK_MSG(bad == 0, "wide 2x2 max pool: %lld wrong values or gradients", (long long)bad);
        v[2 * W + 10] = NAN; /* window (oh 1, ow 5) of plane 0, inside the vectorized part */
        fm_tensor *xn = fm_tensor_from_data(v, 4, (int64_t[]){1, 2, H, W}, FM_F32), *yn = fm_max_pool2d(xn, &p);
        CHECK(yn && isnan(fm_tensor_get(yn, 1 * Wo + 5)));
        for (int64_t ow = 0; yn && ow < Wo; ow++)
            if (ow != 5) CHECK_MSG(!isnan(fm_tensor_get(yn, 1 * Wo + ow)), "NaN leaked into ow %lld", (long long)ow);
        free(v);
        fm_tensor_release_n(5, xw, yw, sw, xn, yn);
    }
    /* bad input */
    fm_tensor *x = op_randn(4, (int64_t[]){1, 2, 4, 4}, FM_F32, 42), *x3 = op_randn(3, (int64_t[]){2, 4, 4}, FM_F32, 43);
    fm_pool2d_params p = pp_make(2, 2, 0, 0, 2, 0, true);
    CHECK((is_max ? fm_max_pool2d(x, &p) : fm_avg_pool2d(x, &p)) == NULL);
    CHECK_ERR_CONTAINS("padding (2, 0) must be at most half the kernel (2, 2)");
    p = pp_make(5, 2, 0, 0, 0, 0, true);
    CHECK((is_max ? fm_max_pool2d(x, &p) : fm_avg_pool2d(x, &p)) == NULL);
    CHECK_ERR_CONTAINS("kernel (5, 2) is larger than the padded input 4x4 (input [1, 2, 4, 4])");
    p = pp_make(2, 2, 0, 0, 0, 0, true);
    CHECK((is_max ? fm_max_pool2d(x3, &p) : fm_avg_pool2d(x3, &p)) == NULL);
    CHECK_ERR_CONTAINS("must be 4-D (NCHW), got [2, 4, 4]");
    p = pp_make(0, 2, 0, 0, 0, 0, true);
    CHECK((is_max ? fm_max_pool2d(x, &p) : fm_avg_pool2d(x, &p)) == NULL);
    CHECK_ERR_CONTAINS(op);
    fm_tensor_release_n(2, x, x3);
    OP_END;
}
static int max_pool2d_forward(void) { return pool_forward(1); }
static int avg_pool2d_forward(void) { return pool_forward(0); }

typedef struct pool_gc_ctx { int is_max; fm_pool2d_params p; } pool_gc_ctx;
static fm_tensor *pool_gc_fn(fm_tensor **in, void *ctx) {
    const pool_gc_ctx *c = ctx;
    return c->is_max ? fm_max_pool2d(in[0], &c->p) : fm_avg_pool2d(in[0], &c->p);
}

static int pool_grad(int is_max) {
    OP_BEGIN;
    for (int l = 0; l < 2; l++) {
        fm_tensor *xb = op_randn(4, (int64_t[]){2, 3, 6, 5}, FM_F64, 50), *x = fm_transpose(xb, 2, 3);
        fm_tensor_requires_grad_(x, true);
        pool_gc_ctx c = {is_max, pp_make(3, 2, 2, 1, 1, 1, l == 0)};
        c.p.layout = l ? FM_NHWC : FM_NCHW;
        fm_tensor *in[1] = {x};
        CHECK_MSG(gradcheck(is_max ? "max_pool2d" : "avg_pool2d", pool_gc_fn, 1, in, &c, 1e-6, 1e-6), "layout %d", l);
        c.p = pp_make(2, 2, 0, 0, 0, 0, true);
        c.p.layout = l ? FM_NHWC : FM_NCHW;
        CHECK(gradcheck(is_max ? "max_pool2d 2x2" : "avg_pool2d 2x2", pool_gc_fn, 1, in, &c, 1e-6, 1e-6));
        fm_tensor_release_n(2, xb, x);
    }
    OP_END;
}
static int max_pool2d_grad(void) { return pool_grad(1); }
static int avg_pool2d_grad(void) { return pool_grad(0); }

/* -------------------------------------------------------------- batch norm */

/* Reference over NCHW-ordered host data viewed as [outer, C, inner]. */
static void ref_bn(const double *x, const double *w, const double *b, const double *rm, const double *rv, bool training,
                   double eps, double *y, double *mean_out, double *var_out, int64_t outer, int64_t C, int64_t inner) {
    for (int64_t c = 0; c < C; c++) {
        double m = 0, v = 0, M = (double)(outer * inner);
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++) m += x[(o * C + c) * inner + i];
        m /= M;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++) v += pow(x[(o * C + c) * inner + i] - m, 2);
        v /= M;
        mean_out[c] = m;
        var_out[c] = v;
        double um = training ? m : rm[c], uv = training ? v : rv[c];
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t k = (o * C + c) * inner + i;
                y[k] = (x[k] - um) / sqrt(uv + eps) * (w ? w[c] : 1.0) + (b ? b[c] : 0.0);
            }
    }
}

static int batch_norm_forward(void) {
    OP_BEGIN;
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        double tol = d ? 1e-11 : 2e-5;
        for (int l = 0; l < 2; l++) {
            fm_layout lay = l ? FM_NHWC : FM_NCHW;
            int64_t N = 4, C = 3, H = 5, W = 6;
            fm_tensor *base = op_randn(4, (int64_t[]){N, C, W, H}, dt, 60);
            fm_tensor *xs = fm_mul_scalar(base, 2.0), *xo = fm_add_scalar(xs, 3.0);
            fm_tensor *x = fm_transpose(xo, 2, 3); /* [N, C, H, W], non-contiguous, mean 3, std 2 */
            fm_tensor *w = op_randn(1, &C, dt, 61), *b = op_randn(1, &C, dt, 62);
            fm_tensor *rm = fm_tensor_full(1, &C, 0.5, dt, FM_CPU), *rv = fm_tensor_full(1, &C, 2.0, dt, FM_CPU);
            double *hx = op_host(x), *hw = op_host(w), *hb = op_host(b);
            double ref[360], mean[3], var[3], rm0[3] = {0.5, 0.5, 0.5}, rv0[3] = {2, 2, 2};
            fm_tensor *xin = l ? to_nhwc(x) : fm_tensor_retain(x);
            /* training: batch stats, running stats updated with momentum 0.1 and unbiased variance */
            fm_tensor *y = fm_batch_norm(xin, w, b, rm, rv, true, 0.1, 1e-5, lay);
            CHECK_MSG(y != NULL, "batch_norm: %s", fm_last_error());
            ref_bn(hx, hw, hb, NULL, NULL, true, 1e-5, ref, mean, var, N, C, H * W);
            fm_tensor *yv = y ? (l ? nhwc_view_as_nchw(y) : fm_tensor_retain(y)) : NULL;
            if (yv) CHECK_MSG(op_max_rel_err(yv, ref) <= tol, "batch_norm train %s layout %d: err %g", fm_dtype_name(dt), l, op_max_rel_err(yv, ref));
            double M = (double)(N * H * W);
            for (int c = 0; c < 3; c++) {
                CHECK_NEAR(fm_tensor_get(rm, c), 0.9 * rm0[c] + 0.1 * mean[c], d ? 1e-12 : 1e-6);
                CHECK_NEAR(fm_tensor_get(rv, c), 0.9 * rv0[c] + 0.1 * var[c] * M / (M - 1), d ? 1e-12 : 1e-6);
            }
            /* eval: running stats */
            double rmv[3], rvv[3];
            for (int c = 0; c < 3; c++) { rmv[c] = fm_tensor_get(rm, c); rvv[c] = fm_tensor_get(rv, c); }
            fm_tensor *ye = fm_batch_norm(xin, w, b, rm, rv, false, 0.1, 1e-3, lay);
            CHECK(ye != NULL);
            ref_bn(hx, hw, hb, rmv, rvv, false, 1e-3, ref, mean, var, N, C, H * W);
            fm_tensor *yev = ye ? (l ? nhwc_view_as_nchw(ye) : fm_tensor_retain(ye)) : NULL;
            if (yev) CHECK_MSG(op_max_rel_err(yev, ref) <= tol, "batch_norm eval %s layout %d", fm_dtype_name(dt), l);
            for (int c = 0; c < 3; c++) CHECK(fm_tensor_get(rm, c) == rmv[c]); /* eval leaves them alone */
            /* no affine params, no running stats */
            fm_tensor *yn = fm_batch_norm(xin, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, lay);
            ref_bn(hx, NULL, NULL, NULL, NULL, true, 1e-5, ref, mean, var, N, C, H * W);
            fm_tensor *ynv = yn ? (l ? nhwc_view_as_nchw(yn) : fm_tensor_retain(yn)) : NULL;
            CHECK(ynv && op_max_rel_err(ynv, ref) <= tol);
            free(hx); free(hw); free(hb);
            fm_tensor_release_n(16, base, xs, xo, x, w, b, rm, rv, xin, y, yv, ye, yev, yn, ynv, NULL);
        }
        /* [N, C] input (BatchNorm1d); channels-last over many rows (several 256-row blocks) */
        fm_tensor *x2 = op_randn(2, (int64_t[]){700, 5}, dt, 63);
        fm_tensor *y2 = fm_batch_norm(x2, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, FM_NCHW);
        fm_tensor *y2h = fm_batch_norm(x2, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, FM_NHWC);
        double *hx = op_host(x2), *ref = malloc(sizeof(double) * 3500), mean[5], var[5];
        ref_bn(hx, NULL, NULL, NULL, NULL, true, 1e-5, ref, mean, var, 700, 5, 1);
        CHECK(y2 && op_max_rel_err(y2, ref) <= tol);
        CHECK(y2h && op_max_rel_err(y2h, ref) <= tol);
        free(hx); free(ref);
        fm_tensor_release_n(3, x2, y2, y2h);
    }
    /* bad input */
    fm_tensor *x = op_randn(4, (int64_t[]){2, 3, 2, 2}, FM_F32, 64), *w4 = op_randn(1, (int64_t[]){4}, FM_F32, 65);
    fm_tensor *x1 = op_randn(2, (int64_t[]){1, 3}, FM_F32, 66), *r64 = fm_tensor_zeros(1, (int64_t[]){3}, FM_F64, FM_CPU);
    CHECK(fm_batch_norm(x, w4, NULL, NULL, NULL, true, 0.1, 1e-5, FM_NCHW) == NULL);
    CHECK_ERR_CONTAINS("batch_norm: weight shape [4] does not match the 3 channels of input [2, 3, 2, 2]");
    CHECK(fm_batch_norm(x1, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, FM_NCHW) == NULL);
    CHECK_ERR_CONTAINS("expected more than 1 value per channel when training, got input [1, 3]");
    CHECK(fm_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5, FM_NCHW) == NULL);
    CHECK_ERR_CONTAINS("eval mode needs running_mean and running_var");
    CHECK(fm_batch_norm(x, NULL, NULL, r64, NULL, true, 0.1, 1e-5, FM_NCHW) == NULL);
    CHECK_ERR_CONTAINS("running_mean dtype f64 does not match input dtype f32");
    CHECK(fm_batch_norm(w4, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, FM_NCHW) == NULL);
    CHECK_ERR_CONTAINS("at least 2 dims");
    fm_tensor_release_n(4, x, w4, x1, r64);
    OP_END;
}

typedef struct bn_gc_ctx { bool training; fm_layout layout; fm_tensor *rm, *rv; } bn_gc_ctx;
static fm_tensor *bn_gc_fn(fm_tensor **in, void *ctx) {
    const bn_gc_ctx *c = ctx;
    return fm_batch_norm(in[0], in[1], in[2], c->rm, c->rv, c->training, 0.1, 1e-5, c->layout);
}

static int batch_norm_grad(void) {
    OP_BEGIN;
    for (int l = 0; l < 2; l++) {
        /* non-contiguous x with 4 channels: [3, 4, 4, 3] (NCHW) or [3, 4, 3, 4] (NHWC) */
        fm_tensor *xb = op_randn(4, l ? (int64_t[]){3, 3, 4, 4} : (int64_t[]){3, 4, 3, 4}, FM_F64, 70);
        fm_tensor *x = l ? fm_transpose(xb, 1, 2) : fm_transpose(xb, 2, 3);
        fm_tensor *w = op_randn(1, (int64_t[]){4}, FM_F64, 71), *b = op_randn(1, (int64_t[]){4}, FM_F64, 72);
        fm_tensor *rm = op_randn(1, (int64_t[]){4}, FM_F64, 73), *rv = fm_tensor_full(1, (int64_t[]){4}, 1.5, FM_F64, FM_CPU);
        fm_tensor_requires_grad_(x, true);
        fm_tensor_requires_grad_(w, true);
        fm_tensor_requires_grad_(b, true);
        bn_gc_ctx c = {true, l ? FM_NHWC : FM_NCHW, NULL, NULL};
        fm_tensor *in[3] = {x, w, b};
        CHECK_MSG(gradcheck("batch_norm train", bn_gc_fn, 3, in, &c, 1e-6, 1e-6), "layout %d", l);
        fm_tensor *in2[3] = {x, NULL, b};
        CHECK(gradcheck("batch_norm train no weight", bn_gc_fn, 3, in2, &c, 1e-6, 1e-6));
        c.training = false;
        c.rm = rm;
        c.rv = rv;
        CHECK(gradcheck("batch_norm eval", bn_gc_fn, 3, in, &c, 1e-6, 1e-6));
        fm_tensor_release_n(6, xb, x, w, b, rm, rv);
    }
    OP_END;
}

/* ---------------------------------------------- the transposed convolution */

/* y by its definition: every x element scattered through the kernel (f64 sums). */
static double *convt_ref(const fm_tensor *x, const fm_tensor *w, const fm_tensor *b, const fm_conv2d_params *p, const int *op, int64_t *ys) {
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3], G = p->groups;
    const int64_t Og = w->shape[1], KH = w->shape[2], KW = w->shape[3], Cg = C / G;
    ys[0] = N, ys[1] = Og * G;
    ys[2] = (H - 1) * p->stride[0] - 2 * p->padding[0] + p->dilation[0] * (KH - 1) + op[0] + 1;
    ys[3] = (W - 1) * p->stride[1] - 2 * p->padding[1] + p->dilation[1] * (KW - 1) + op[1] + 1;
    double *y = calloc((size_t)(ys[0] * ys[1] * ys[2] * ys[3]), sizeof *y), *xv = op_host(x), *wv = op_host(w);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < H; i++)
                for (int64_t j = 0; j < W; j++)
                    for (int64_t o = 0; o < Og; o++)
                        for (int64_t u = 0; u < KH; u++)
                            for (int64_t v = 0; v < KW; v++) {
                                const int64_t oh = i * p->stride[0] - p->padding[0] + u * p->dilation[0];
                                const int64_t ow = j * p->stride[1] - p->padding[1] + v * p->dilation[1];
                                if (oh < 0 || ow < 0 || oh >= ys[2] || ow >= ys[3]) continue;
                                const int64_t oc = (c / Cg) * Og + o;
                                y[((n * ys[1] + oc) * ys[2] + oh) * ys[3] + ow] +=
                                    xv[((n * C + c) * H + i) * W + j] * wv[((c * Og + o) * KH + u) * KW + v];
                            }
    for (int64_t k = 0; b && k < ys[0] * ys[1] * ys[2] * ys[3]; k++) y[k] += fm_tensor_get(b, (k / (ys[2] * ys[3])) % ys[1]);
    free(xv);
    free(wv);
    return y;
}

static int conv_transpose2d_forward(void) {
    OP_BEGIN;
    static const struct { int64_t C, O, k, H, W; int s, pd, d, g, op; } cases[] = {
        {4, 3, 3, 5, 6, 2, 1, 1, 1, 1}, /* a U-Net's 2x upsampling with output padding */
        {4, 6, 2, 4, 4, 2, 0, 1, 2, 0}, /* groups 2, kernel = stride */
        {3, 2, 3, 4, 5, 1, 1, 2, 1, 0}, /* dilation */
        {2, 5, 1, 3, 3, 3, 0, 1, 1, 2}, /* 1x1, stride 3 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        fm_conv2d_params p = fm_conv2d_default_params();
        p.stride[0] = p.stride[1] = cases[k].s, p.padding[0] = p.padding[1] = cases[k].pd;
        p.dilation[0] = p.dilation[1] = cases[k].d, p.groups = cases[k].g;
        const int op[2] = {cases[k].op, cases[k].op};
        fm_tensor *x = op_randn(4, (int64_t[]){2, cases[k].C, cases[k].H, cases[k].W}, FM_F32, 50 + k);
        fm_tensor *w = op_randn(4, (int64_t[]){cases[k].C, cases[k].O / cases[k].g, cases[k].k, cases[k].k}, FM_F32, 60 + k);
        fm_tensor *b = op_randn(1, (int64_t[]){cases[k].O}, FM_F32, 70 + k);
        int64_t ys[4];
        double *ref = convt_ref(x, w, b, &p, op, ys);
        fm_tensor *y = fm_conv_transpose2d(x, w, b, &p, op);
        CHECK_MSG(y && y->shape[0] == ys[0] && y->shape[1] == ys[1] && y->shape[2] == ys[2] && y->shape[3] == ys[3], "case %zu: %s", k,
                  y ? "shape" : fm_last_error());
        const double worst = y ? op_max_rel_err(y, ref) : INFINITY;
        CHECK_MSG(worst < 1e-5, "case %zu: worst relative error %g", k, worst);
        free(ref);
        fm_tensor_release_n(4, x, w, b, y);
    }
    fm_conv2d_params p = fm_conv2d_default_params();
    fm_tensor *x = op_randn(4, (int64_t[]){1, 4, 3, 3}, FM_F32, 80), *w = op_randn(4, (int64_t[]){3, 2, 3, 3}, FM_F32, 81);
    CHECK(fm_conv_transpose2d(x, w, NULL, &p, NULL) == NULL);
    CHECK_ERR_CONTAINS("conv_transpose2d: weight [3, 2, 3, 3] needs 3 input channels");
    p.stride[0] = p.stride[1] = 2;
    fm_tensor *w4 = op_randn(4, (int64_t[]){4, 2, 3, 3}, FM_F32, 82);
    CHECK(fm_conv_transpose2d(x, w4, NULL, &p, (const int[]){2, 0}) == NULL);
    CHECK_ERR_CONTAINS("output_padding 2 in [0, stride)");
    p.padding[0] = p.padding[1] = 4;
    CHECK(fm_conv_transpose2d(x, w4, NULL, &p, NULL) == NULL);
    CHECK_ERR_CONTAINS("leaves no output along dim 2");
    fm_tensor_release_n(3, x, w, w4);
    OP_END;
}

typedef struct convt_gc { fm_conv2d_params p; int op[2]; } convt_gc;
static fm_tensor *convt_gc_fn(fm_tensor **in, void *ctx) {
    const convt_gc *c = ctx;
    return fm_conv_transpose2d(in[0], in[1], in[2], &c->p, c->op);
}

static int conv_transpose2d_grad(void) {
    OP_BEGIN;
    convt_gc c = {fm_conv2d_default_params(), {1, 0}};
    c.p.stride[0] = c.p.stride[1] = 2, c.p.padding[0] = 1, c.p.groups = 2;
    fm_tensor *x = op_randn(4, (int64_t[]){2, 4, 3, 4}, FM_F64, 90), *w = op_randn(4, (int64_t[]){4, 3, 3, 2}, FM_F64, 91);
    fm_tensor *b = op_randn(1, (int64_t[]){6}, FM_F64, 92);
    fm_tensor_requires_grad_(x, true);
    fm_tensor_requires_grad_(w, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *in[3] = {x, w, b};
    CHECK(gradcheck("conv_transpose2d", convt_gc_fn, 3, in, &c, 1e-6, 1e-6));
    fm_tensor_release_n(3, x, w, b);
    OP_END;
}

OP_TEST("conv2d", conv2d_forward, conv2d_grad)
OP_TEST("conv2d", conv_transpose2d_forward, conv_transpose2d_grad) /* fm_conv_transpose2d runs conv2d's backward kernel */
OP_TEST("max_pool2d", max_pool2d_forward, max_pool2d_grad)
OP_TEST("avg_pool2d", avg_pool2d_forward, avg_pool2d_grad)
OP_TEST("batch_norm", batch_norm_forward, batch_norm_grad)
