/* qconv2d_int8 (fm_qconv2d_int8, fm_quantize_conv_weight_int8) and the int8
 * convolutions of fm_graph_quantize.
 *
 * The kernel against an exact reference: with the activation scale a power of
 * two (1/32), the kernel's codes are the reference's for every rounding path
 * (x / s and x * (1/s) are the same float), so the integer sums are exact and
 * the only difference is the f32 epilogue's rounding: bound 1e-5 of the largest
 * output. Geometries cover each path of the kernel: im2col with padding
 * (the zero point in padded cells), K not a multiple of 4 (the rows' zero tail),
 * stride, dilation, one input channel, a 1x1 where C is the panels' K (the NHWC
 * codes as the GEMM's rows), a 1x1 where it is not (C % 4 != 0; C = 96, whose K
 * the panels pad to 128): im2col, outputs not a multiple of the panels' 16, K
 * padded to a multiple of 64 (the AMX tiles) and exactly one,
 * several sample chunks, more than one 64-channel block of the output pass, and
 * the fused max pool (2x2; 3x3 with rows and columns left over); each on 2
 * threads (one sample a task) and on 1 (each step over the pool, in chunks),
 * whose dynamic outputs must be the same bits. Run at every ISA level (CMakeLists.txt).
 *
 * Graph: a CNN (a first conv of 27 weights a window, conv + relu, conv2d_fused with its
 * pool after compile, which the int8 node takes over, a depthwise conv, a linear head)
 * quantized dynamic and static stays within 0.03 of fp32 (max |diff| / max |fp32|); the
 * grouped conv and the small first one stay fp32 and say why;
 * save + load gives the same bits; a bad qconv2d_int8 node is refused at load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/kernel_attrs.h" /* fm_q8_panel_index */
#include "core/parallel.h"        /* fm_set_num_threads: both of the kernel's paths */
#include "fathom/fathom.h"
#include "fathom/graph.h"
#include "fathom/quant.h"
#include "tensor_compare.h"
#include "test_util.h"
#include "graph_roundtrip.h"
#include "test_isa_env.h"

static fm_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(ndim, shape, FM_F32, &r);
}

typedef struct geo { int64_t N, C, H, W, O; int kh, kw, sh, sw, ph, pw, dh, dw, pool; } geo;

/* The reference in double: codes q = clamp(rint(x / s) + z), weight codes read back from the
 * panels, y = s w_scale (sum (q - z) wq) + b, relu, cap. */
static void reference(const geo *g, const float *x, const int8_t *P, const float *ws, const float *b, double s, int z, bool relu, double hi,
                      int64_t Ho, int64_t Wo, double *y) {
    const int64_t Kq = fm_qconv_panel_k((int64_t)g->kh * g->kw * g->C) / 4;
    for (int64_t n = 0; n < g->N; n++)
        for (int64_t o = 0; o < g->O; o++)
            for (int64_t oy = 0; oy < Ho; oy++)
                for (int64_t ox = 0; ox < Wo; ox++) {
                    int64_t acc = 0;
                    for (int ky = 0; ky < g->kh; ky++)
                        for (int kx = 0; kx < g->kw; kx++)
                            for (int64_t c = 0; c < g->C; c++) {
                                const int64_t iy = oy * g->sh - g->ph + ky * g->dh, ix = ox * g->sw - g->pw + kx * g->dw;
                                int64_t q = z;
                                if (iy >= 0 && iy < g->H && ix >= 0 && ix < g->W) {
                                    double v = nearbyint(x[((n * g->C + c) * g->H + iy) * g->W + ix] / s) + z;
                                    q = (int64_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                                }
                                acc += (q - z) * P[fm_q8_panel_index(Kq, o, (ky * g->kw + kx) * g->C + c)];
                            }
                    double v = s * ws[o] * (double)acc + (b ? b[o] : 0.0);
                    if (relu && v < 0) v = 0;
                    if (v > hi) v = hi;
                    y[((n * g->O + o) * Ho + oy) * Wo + ox] = v;
                }
}

/* y [N, O, Ho, Wo] max-pooled k x k at stride k into p [N, O, Ho / k, Wo / k] */
static void pool_ref(const double *y, int64_t NO, int64_t Ho, int64_t Wo, int k, double *p) {
    const int64_t Hp = Ho / k, Wp = Wo / k;
    for (int64_t i = 0; i < NO; i++)
        for (int64_t py = 0; py < Hp; py++)
            for (int64_t px = 0; px < Wp; px++) {
                double m = -INFINITY;
                for (int dy = 0; dy < k; dy++)
                    for (int dx = 0; dx < k; dx++) m = fmax(m, y[(i * Ho + py * k + dy) * Wo + px * k + dx]);
                p[(i * Hp + py) * Wp + px] = m;
            }
}

static void test_kernel_exact(void) {
    const geo cases[] = {
        {2, 3, 9, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1, 0},     /* im2col, padding, K = 27 */
        {3, 8, 6, 6, 20, 1, 1, 1, 1, 0, 0, 1, 1, 1},    /* 1x1 on the NHWC codes directly */
        {2, 6, 5, 5, 7, 1, 1, 1, 1, 0, 0, 1, 1, 0},     /* 1x1, C % 4 != 0: im2col */
        {1, 5, 11, 10, 17, 3, 2, 2, 1, 1, 0, 2, 1, 0},  /* stride, dilation, a 3x2 window */
        {4, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1, 1, 2},  /* one input channel, its 2x2 pool (fashion-cnn's first conv) */
        {2, 64, 12, 12, 48, 3, 3, 1, 1, 1, 1, 1, 1, 0}, /* K = 576 = 9 x 64: the AMX tiles, rows on every thread */
        {2, 16, 9, 9, 24, 5, 5, 2, 2, 2, 2, 1, 3, 0},   /* 5x5, stride 2, dilation in width */
        {40, 32, 24, 24, 80, 3, 3, 1, 1, 1, 1, 1, 1, 0}, /* several sample chunks, channels past one 64-block */
        {3, 8, 11, 13, 70, 3, 3, 1, 1, 1, 1, 1, 1, 3},  /* a 3x3 pool with rows and columns left over */
        {2, 128, 5, 5, 33, 1, 1, 1, 1, 0, 0, 1, 1, 0},  /* 1x1 over 128 channels: direct, on the AMX tiles */
        {2, 96, 7, 7, 40, 1, 1, 1, 1, 0, 0, 1, 1, 0},   /* 1x1 over 96: K padded to 128, so im2col */
    };
    for (size_t tc = 0; tc < 2 * sizeof cases / sizeof cases[0]; tc++) {
        /* each case on 2 threads (one sample a task where N >= 2) and on 1 (the chunked path) */
        const size_t t = tc / 2;
        fm_set_num_threads(tc % 2 ? 1 : 2);
        const geo *g = &cases[t];
        fm_tensor *x = randn(4, (int64_t[]){g->N, g->C, g->H, g->W}, 100 + t), *w = randn(4, (int64_t[]){g->O, g->C, g->kh, g->kw}, 200 + t);
        fm_tensor *b = randn(1, (int64_t[]){g->O}, 300 + t), *P = NULL, *ws = NULL, *sum = NULL;
        CHECK_MSG(fm_quantize_conv_weight_int8(w, &P, &ws, &sum) == FM_OK, "%s", fm_last_error());
        fm_conv2d_params p = fm_conv2d_default_params();
        p.stride[0] = g->sh, p.stride[1] = g->sw, p.padding[0] = g->ph, p.padding[1] = g->pw, p.dilation[0] = g->dh, p.dilation[1] = g->dw;
        const int64_t Ho = (g->H + 2 * g->ph - g->dh * (g->kh - 1) - 1) / g->sh + 1, Wo = (g->W + 2 * g->pw - g->dw * (g->kw - 1) - 1) / g->sw + 1;
        const int k = g->pool > 1 ? g->pool : 1, ny = (int)(g->N * g->O * (Ho / k) * (Wo / k));
        double *ref = malloc(sizeof(double) * (size_t)(g->N * g->O * Ho * Wo)), *pooled = malloc(sizeof(double) * (size_t)ny);
        for (int act = 0; act < 3 && P; act++) { /* none; relu; relu and a cap at 1 */
            const bool relu = act > 0;
            const double hi = act == 2 ? 1.0 : INFINITY;
            fm_tensor *y = fm_qconv2d_int8(x, P, ws, sum, act == 1 ? NULL : b, &p, g->kh, g->kw, 1.0 / 32, 128, relu, hi, g->pool);
            CHECK_MSG(y != NULL, "case %zu: %s", t, fm_last_error());
            if (!y) continue;
            CHECK(y->ndim == 4 && y->shape[0] == g->N && y->shape[1] == g->O && y->shape[2] == Ho / k && y->shape[3] == Wo / k);
            reference(g, fm_tensor_data(x), fm_tensor_data(P), fm_tensor_data(ws), act == 1 ? NULL : fm_tensor_data(b), 1.0 / 32, 128, relu, hi,
                      Ho, Wo, ref);
            pool_ref(ref, g->N * g->O, Ho, Wo, k, pooled);
            double mx = 0, err = 0;
            const float *yp = fm_tensor_data(y);
            for (int64_t i = 0; i < ny; i++) {
                mx = fmax(mx, fabs(pooled[i]));
                err = fmax(err, fabs(pooled[i] - yp[i]));
            }
            CHECK_MSG(err <= 1e-5 * mx, "case %zu (%d threads) act %d: max |diff| %g of max %g", t, fm_num_threads(), act, err, mx);
            fm_tensor_release(y);
        }
        /* dynamic: within int8's rounding of the fp32 convolution (and its pool: fm_conv2d_fused) */
        fm_tensor *yd = P ? fm_qconv2d_int8(x, P, ws, sum, b, &p, g->kh, g->kw, 0.0, 0, false, INFINITY, g->pool) : NULL;
        fm_tensor *yf = g->pool > 1 ? fm_conv2d_fused(x, w, b, &p, false, g->pool) : fm_conv2d(x, w, b, &p);
        CHECK_MSG(yd && yf, "case %zu: %s", t, fm_last_error());
        double mx = 0, err = 0;
        for (int64_t i = 0; yd && yf && i < ny; i++) {
            mx = fmax(mx, fabs(fm_tensor_get(yf, i)));
            err = fmax(err, fabs(fm_tensor_get(yf, i) - fm_tensor_get(yd, i)));
        }
        CHECK_MSG(err < 0.03 * mx, "case %zu (%d threads) dynamic: max |diff| %g of max %g", t, fm_num_threads(), err, mx);
        /* the two paths compute the same codes and integer sums: the same bits */
        static fm_tensor *prev;
        if (tc % 2 == 0) {
            fm_tensor_release(prev);
            prev = fm_tensor_retain(yd);
        } else {
            bool same = prev && yd && !memcmp(fm_tensor_data(prev), fm_tensor_data(yd), sizeof(float) * (size_t)ny);
            CHECK_MSG(same, "case %zu: dynamic output differs between 2 threads and 1", t);
            fm_tensor_release(prev);
            prev = NULL;
        }
        free(ref);
        free(pooled);
        fm_tensor_release_n(8, x, w, b, P, ws, sum, yd, yf);
    }
    fm_set_num_threads(2);
}

static void test_bad_input(void) {
    fm_tensor *x = randn(4, (int64_t[]){2, 4, 8, 8}, 1), *w = randn(4, (int64_t[]){6, 4, 3, 3}, 2), *P = NULL, *ws = NULL, *sum = NULL;
    CHECK(fm_quantize_conv_weight_int8(w, &P, &ws, &sum) == FM_OK);
    fm_conv2d_params p = fm_conv2d_default_params();
    CHECK(fm_qconv2d_int8(x, P, ws, sum, NULL, &p, 3, 2, 0.0, 0, false, INFINITY, 0) == NULL); /* panels made for 3x3 */
    CHECK_ERR_CONTAINS("qconv2d_int8: panels must be i8 [1, 6, 16, 4]");
    p.groups = 2;
    CHECK(fm_qconv2d_int8(x, P, ws, sum, NULL, &p, 3, 3, 0.0, 0, false, INFINITY, 0) == NULL);
    CHECK_ERR_CONTAINS("groups 1 and layout NCHW only");
    p.groups = 1;
    CHECK(fm_qconv2d_int8(x, P, ws, sum, NULL, &p, 9, 9, 0.0, 0, false, INFINITY, 0) == NULL);
    CHECK_ERR_CONTAINS("a 9x9 kernel (stride 1,1, padding 0,0, dilation 1,1) does not fit input [2, 4, 8, 8]");
    CHECK(fm_qconv2d_int8(x, P, ws, sum, NULL, &p, 3, 3, 0.0, 0, false, INFINITY, 7) == NULL); /* a 6x6 output */
    CHECK_ERR_CONTAINS("pool 7 must be in [0, 64] and fit the convolution's 6x6 output");
    CHECK(fm_qconv2d_int8(x, P, ws, sum, NULL, &p, 3, 3, 0.1, 300, false, INFINITY, 0) == NULL);
    CHECK_ERR_CONTAINS("zero point 300 in [0, 255]");
    CHECK(fm_qconv2d_int8(x, P, ws, NULL, NULL, &p, 3, 3, 0.1, 3, false, INFINITY, 0) == NULL);
    CHECK_ERR_CONTAINS("row sums is NULL");
    fm_tensor *x3 = randn(3, (int64_t[]){4, 8, 8}, 3), *w3 = randn(3, (int64_t[]){4, 8, 8}, 3), *q3 = NULL, *s3 = NULL, *u3 = NULL;
    CHECK(fm_qconv2d_int8(x3, P, ws, sum, NULL, &p, 3, 3, 0.0, 0, false, INFINITY, 0) == NULL);
    CHECK_ERR_CONTAINS("input must be an f32 [N, C, H, W] tensor, got f32 [4, 8, 8]");
    CHECK(fm_quantize_conv_weight_int8(w3, &q3, &s3, &u3) != FM_OK && !q3 && !s3 && !u3);
    CHECK_ERR_CONTAINS("weight must be a 4-D f32 host tensor [out, in, kh, kw]");
    fm_tensor_release_n(7, x, w, P, ws, sum, x3, w3);
}

static int count_op(const fm_graph *g, const char *op) {
    int n = 0;
    for (int i = 0; i < fm_graph_num_nodes(g); i++) n += !strcmp(fm_graph_node_op(g, i), op);
    return n;
}

/* x [-1, 3, 16, 16] -> conv 3->8 3x3 pad 1 (K 27: stays fp32) -> conv 8->16 3x3 pad 1 -> relu -> conv
 * 16->24 3x3 pad 1 -> relu -> max pool 2 -> depthwise 3x3 (groups 24) -> flatten -> linear 24*8*8 -> 10 */
static fm_graph *cnn(void) {
    fm_graph *g = fm_graph_new();
    fm_tensor *w0 = randn(4, (int64_t[]){8, 3, 3, 3}, 10);
    fm_tensor *w1 = randn(4, (int64_t[]){16, 8, 3, 3}, 11), *b1 = randn(1, (int64_t[]){16}, 12), *w2 = randn(4, (int64_t[]){24, 16, 3, 3}, 13);
    fm_tensor *wd = randn(4, (int64_t[]){24, 1, 3, 3}, 14), *wf = randn(2, (int64_t[]){10, 24 * 8 * 8}, 15);
    fm_graph_add_input(g, "x", FM_F32, 4, (int64_t[]){-1, 3, 16, 16}, (const char *[]){"batch", NULL, NULL, NULL});
    fm_graph_add_const(g, "c0.w", w0);
    fm_graph_add_const(g, "c1.w", w1);
    fm_graph_add_const(g, "c1.b", b1);
    fm_graph_add_const(g, "c2.w", w2);
    fm_graph_add_const(g, "dw.w", wd);
    fm_graph_add_const(g, "fc.w", wf);
    fm_graph_attr pad = fm_graph_attr_ints("padding", 2, (int64_t[]){1, 1});
    fm_graph_attr dw[2] = {pad, fm_graph_attr_int("groups", 24)};
    fm_graph_attr pool[2] = {fm_graph_attr_ints("kernel", 2, (int64_t[]){2, 2}), fm_graph_attr_ints("stride", 2, (int64_t[]){2, 2})};
    fm_graph_add_node(g, "conv2d", "c0", 2, (const char *[]){"x", "c0.w"}, 1, (const char *[]){"h0"}, 1, &pad);
    fm_graph_add_node(g, "conv2d", "c1", 3, (const char *[]){"h0", "c1.w", "c1.b"}, 1, (const char *[]){"h1"}, 1, &pad);
    fm_graph_add_node(g, "relu", "r1", 1, (const char *[]){"h1"}, 1, (const char *[]){"a1"}, 0, NULL);
    fm_graph_add_node(g, "conv2d", "c2", 2, (const char *[]){"a1", "c2.w"}, 1, (const char *[]){"h2"}, 1, &pad);
    fm_graph_add_node(g, "relu", "r2", 1, (const char *[]){"h2"}, 1, (const char *[]){"a2"}, 0, NULL);
    fm_graph_add_node(g, "max_pool2d", "p2", 1, (const char *[]){"a2"}, 1, (const char *[]){"m2"}, 2, pool);
    fm_graph_add_node(g, "conv2d", "dw", 2, (const char *[]){"m2", "dw.w"}, 1, (const char *[]){"d"}, 2, dw);
    fm_graph_attr start = fm_graph_attr_int("start", 1);
    fm_graph_add_node(g, "flatten", "fl", 1, (const char *[]){"d"}, 1, (const char *[]){"f"}, 1, &start);
    fm_graph_add_node(g, "linear", "fc", 2, (const char *[]){"f", "fc.w"}, 1, (const char *[]){"y"}, 0, NULL);
    fm_graph_add_output(g, "y");
    fm_tensor_release_n(6, w0, w1, b1, w2, wd, wf);
    CHECK_MSG(fm_graph_validate(g) == FM_OK, "%s", fm_last_error());
    return g;
}

/* max |a(x) - b(x)| / max |a(x)| */
static double rel_diff(const fm_graph *a, const fm_graph *b, fm_tensor *x) {
    fm_tensor *ya = fm_graph_run1(a, x), *yb = fm_graph_run1(b, x);
    const double d = t_rel_err(yb, ya);
    fm_tensor_release_n(2, ya, yb);
    return d;
}

static void test_graph(const char *tmp) {
    fm_compile_report crep;
    fm_graph *g0 = cnn(), *g = fm_graph_compile(g0, &crep); /* c2 + relu + pool -> conv2d_fused with its pool */
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    if (!g) { fm_graph_free(g0); return; }
    CHECK(count_op(g, "conv2d_fused") >= 1);
    fm_tensor *x = randn(4, (int64_t[]){5, 3, 16, 16}, 21), *calib = randn(4, (int64_t[]){48, 3, 16, 16}, 22);
    for (int mode = 0; mode < 2; mode++) {
        fm_quant_options o;
        fm_quant_options_init(&o);
        o.mode = mode ? FM_QUANT_INT8_STATIC : FM_QUANT_INT8_DYNAMIC;
        o.calib = calib;
        fm_quant_report rep;
        fm_graph *q = fm_graph_quantize(g, &o, &rep);
        CHECK_MSG(q != NULL, "mode %d: %s", mode, fm_last_error());
        if (!q) continue;
        CHECK_MSG(count_op(q, "qconv2d_int8") == 2 && count_op(q, "qlinear_int8") == 1 && count_op(q, "max_pool2d") == 0, "mode %d: %d qconv",
                  mode, count_op(q, "qconv2d_int8"));
        bool grouped_said = false, small_said = false;
        for (int k = 0; k < rep.n_nodes; k++) {
            grouped_said |= !rep.nodes[k].quantized && strstr(rep.nodes[k].how, "grouped (depthwise)") != NULL;
            small_said |= !rep.nodes[k].quantized && strstr(rep.nodes[k].how, "a window of 27 weights (kh kw C < 32)") != NULL;
        }
        CHECK(grouped_said && small_said && rep.n_quantized == 3);
        double d = rel_diff(g, q, x);
        CHECK_MSG(d < 0.03, "mode %d: relative difference %g", mode, d);
        printf("cnn int8 %s: max rel diff vs fp32 %.4g\n", mode ? "static" : "dynamic", d);
        char dir[300];
        snprintf(dir, sizeof dir, "%s/q%d", tmp, mode);
        graph_roundtrip_same(q, dir, x);
        fm_graph_free(q);
        fm_quant_report_free(&rep);
    }
    fm_tensor_release_n(2, x, calib);
    fm_graph_free(g);
    fm_graph_free(g0);
}

/* op_types and exclude (fathom quantize --ops, --exclude): what they leave fp32, and the names they refuse */
static void test_filters(void) {
    fm_graph *g = cnn(); /* quantizable by default: c1, c2 (conv2d) and fc (linear) */
    fm_tensor *x = randn(4, (int64_t[]){3, 3, 16, 16}, 23);
    static const struct {
        const char *ops, *exclude;
        int qconv, qlinear;
        const char *node, *why; /* one node's report, or the error when qconv < 0 */
    } cases[] = {
        {"linear", NULL, 0, 1, "c1", "fp32: conv2d is not among --ops linear"},
        {"conv2d", NULL, 2, 0, "fc", "fp32: linear is not among --ops conv2d"},
        {"", "c2", 1, 1, "c2", "fp32: excluded (--exclude)"},
        {"conv2d,linear", "fc,c1", 1, 0, "fc", "fp32: excluded (--exclude)"},
        {NULL, "c1,c2,fc", -1, 0, NULL, "with an f32 constant weight left by --ops and --exclude"},
        {"linear,convs", NULL, -1, 0, NULL, "--ops 'convs': expected a comma-separated list of linear, matmul, conv2d, embedding"},
        {NULL, "c2,c9", -1, 0, NULL, "--exclude 'c9': the graph has no node of that name"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fm_quant_options o;
        fm_quant_options_init(&o);
        o.op_types = cases[c].ops;
        o.exclude = cases[c].exclude;
        fm_quant_report rep;
        fm_graph *q = fm_graph_quantize(g, &o, &rep);
        if (cases[c].qconv < 0) {
            CHECK_MSG(q == NULL, "case %zu quantized", c);
            CHECK_ERR_CONTAINS(cases[c].why);
            fm_graph_free(q);
            continue;
        }
        CHECK_MSG(q != NULL, "case %zu: %s", c, fm_last_error());
        if (!q) continue;
        CHECK_MSG(count_op(q, "qconv2d_int8") == cases[c].qconv && count_op(q, "qlinear_int8") == cases[c].qlinear, "case %zu: %d qconv, %d qlinear", c,
                  count_op(q, "qconv2d_int8"), count_op(q, "qlinear_int8"));
        CHECK(rep.n_quantized == cases[c].qconv + cases[c].qlinear);
        bool said = false;
        for (int k = 0; k < rep.n_nodes; k++) said |= !strcmp(rep.nodes[k].node, cases[c].node) && !rep.nodes[k].quantized && !strcmp(rep.nodes[k].how, cases[c].why);
        CHECK_MSG(said, "case %zu: node %s's report", c, cases[c].node);
        const double d = rel_diff(g, q, x);
        CHECK_MSG(d < 0.03, "case %zu: relative difference %g", c, d);
        fm_graph_free(q);
        fm_quant_report_free(&rep);
    }
    fm_tensor_release(x);
    fm_graph_free(g);
}

/* a qconv2d_int8 node whose kernel attribute does not fit its panels, or with a GELU, is refused at validation */
static void test_node_checks(void) {
    fm_tensor *w = randn(4, (int64_t[]){6, 4, 3, 3}, 2), *P = NULL, *ws = NULL, *sum = NULL;
    CHECK(fm_quantize_conv_weight_int8(w, &P, &ws, &sum) == FM_OK);
    for (int bad = 0; bad < 3; bad++) {
        fm_graph *g = fm_graph_new();
        fm_graph_add_input(g, "x", FM_F32, 4, (int64_t[]){-1, 4, 8, 8}, (const char *[]){"batch", NULL, NULL, NULL});
        fm_graph_add_const(g, "p", P);
        fm_graph_add_const(g, "s", ws);
        fm_graph_add_const(g, "u", sum);
        fm_graph_attr a[2] = {fm_graph_attr_ints("kernel", 2, (int64_t[]){3, bad == 1 ? 2 : 3}), fm_graph_attr_int(bad == 2 ? "gelu" : "relu", 1)};
        fm_status st = fm_graph_add_node(g, "qconv2d_int8", "qc", 5, (const char *[]){"x", "p", "s", "", "u"}, 1, (const char *[]){"y"}, 2, a);
        if (st == FM_OK) st = fm_graph_add_output(g, "y");
        if (st == FM_OK) st = fm_graph_validate(g);
        if (bad == 0) CHECK_MSG(st == FM_OK, "%s", fm_last_error());
        if (bad == 1) { CHECK(st != FM_OK); CHECK_ERR_CONTAINS("weight (layout vnni16x4) has shape [1, 9, 16, 4], expected [1, 6, 16, 4]"); }
        if (bad == 2) { CHECK(st != FM_OK); CHECK_ERR_CONTAINS("unknown attribute 'gelu'"); }
        fm_graph_free(g);
    }
    fm_tensor_release_n(4, w, P, ws, sum);
}

int main(void) {
    const int isa = test_isa_env();
    if (isa) return isa;
    char tmp[] = "/tmp/fathom_qconv_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    test_kernel_exact();
    test_bad_input();
    test_graph(tmp);
    test_filters();
    test_node_checks();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    TEST_DONE();
}
