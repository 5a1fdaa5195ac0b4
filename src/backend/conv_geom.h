/* The geometry of a 2-D convolution or pooling call, read off its parameters and
 * tensors (NCHW or NHWC): one definition for the CPU kernels, the CUDA kernels and
 * the meta device's replay of the CPU kernels' scratch. Plain C, also compiled as
 * CUDA host code. The shapes were checked by the op front ends (src/ops). */
#ifndef FATHOM_BACKEND_CONV_GEOM_H
#define FATHOM_BACKEND_CONV_GEOM_H
#include <stdbool.h>
#include <stdint.h>

#include "core/cpu_features.h"
#include "fathom/ops.h"
#include "fathom/tensor.h"

/* N, C, H, W of an NCHW or NHWC activation x, and the output's Ho, Wo from y */
static inline void fm_image_dims(const fm_tensor *x, const fm_tensor *y, bool nhwc, int64_t *N, int64_t *C, int64_t *H,
                                 int64_t *W, int64_t *Ho, int64_t *Wo) {
    *N = x->shape[0];
    *C = nhwc ? x->shape[3] : x->shape[1];
    *H = nhwc ? x->shape[1] : x->shape[2];
    *W = nhwc ? x->shape[2] : x->shape[3];
    *Ho = nhwc ? y->shape[1] : y->shape[2];
    *Wo = nhwc ? y->shape[2] : y->shape[3];
}

typedef struct fm_conv_geom {
    int64_t N, C, H, W;           /* input */
    int64_t O, Ho, Wo;            /* output channels and size */
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t G, Cg, Og;            /* groups, input/output channels per group */
    int64_t K, P;                 /* GEMM inner size per group, output pixels per sample */
    bool nhwc, pointwise;         /* pointwise: 1x1, stride 1, no padding */
} fm_conv_geom;

/* x the input, w the weight [O, C/G, kh, kw], y the output (or dy) */
static inline fm_conv_geom fm_conv_geometry(const fm_conv2d_params *p, const fm_tensor *x, const fm_tensor *w,
                                            const fm_tensor *y) {
    fm_conv_geom g;
    g.nhwc = p->layout == FM_NHWC;
    fm_image_dims(x, y, g.nhwc, &g.N, &g.C, &g.H, &g.W, &g.Ho, &g.Wo);
    g.O = w->shape[0];
    g.kh = w->shape[2]; g.kw = w->shape[3];
    g.sh = p->stride[0]; g.sw = p->stride[1];
    g.ph = p->padding[0]; g.pw = p->padding[1];
    g.dh = p->dilation[0]; g.dw = p->dilation[1];
    g.G = p->groups; g.Cg = g.C / g.G; g.Og = g.O / g.G;
    g.K = g.Cg * g.kh * g.kw;
    g.P = g.Ho * g.Wo;
    g.pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
    return g;
}

/* The CPU's depthwise direct kernel (backend/cpu/conv_dw.h; f32 NCHW, one input
 * channel per group, dilation 1) and the floats of scratch each pool thread takes
 * there: the padded input plane split into sw column phases, each row with
 * FM_CONV_DW_SLACK + kw floats of slack for the vector blocks that run past its end.
 * The meta device replays the same sizes. */
enum { FM_CONV_DW_SLACK = 64 };
static inline bool fm_conv_dw_direct(const fm_conv_geom *g, fm_dtype dt) {
    return dt == FM_F32 && !g->nhwc && g->G > 1 && g->Cg == 1 && g->dh == 1 && g->dw == 1;
}
/* Whether conv2d's f32 products run conv_pw.h's kernel (the AVX2 level, not AVX-512:
 * not measured against the AVX-512 sgemm there; K > 0: something to sum). */
static inline bool fm_conv_pw_level(const fm_conv_geom *g, fm_dtype dt) {
    return dt == FM_F32 && g->K > 0 && fm_cpu_use_avx2() && !fm_cpu_use_avx512();
}
/* conv2d_cpu.c's grouped convs at the AVX2 level (not depthwise, not 1x1): one pool task
 * per sample and group runs the group's im2col and its product (backend/cpu/conv_pw.h)
 * in buffers of its own, from malloc (uncounted, as the GEMM's packing): none of the
 * caching allocator's scratch, which the meta device replays as none. */
static inline bool fm_conv_grouped_avx2(const fm_conv_geom *g, fm_dtype dt) {
    return fm_conv_pw_level(g, dt) && !g->nhwc && g->G > 1 && !g->pointwise && !fm_conv_dw_direct(g, dt);
}
/* conv2d_cpu.c's strided convs of one group at the AVX2 level: conv_pw.h's kernel gathers
 * each tile's columns from the input (no im2col buffer; its own buffers from malloc, none
 * of the caching allocator's scratch). */
static inline bool fm_conv_strided_avx2(const fm_conv_geom *g, fm_dtype dt) {
    return fm_conv_pw_level(g, dt) && !g->nhwc && g->G == 1 && (g->sh > 1 || g->sw > 1);
}
static inline int64_t fm_conv_dw_scratch_floats(int64_t H, int64_t W, int64_t ph, int64_t pw, int64_t sw, int64_t kw) {
    return sw * (H + 2 * ph) * ((W + 2 * pw + sw - 1) / sw + FM_CONV_DW_SLACK + kw);
}

/* A pool's output length along one dim (PyTorch's rule): floor((in + 2p - k) / s) + 1,
 * or with ceil_mode rounded up, less one if that last window would start past the
 * input and its left padding. in + 2p >= k (the front ends check). */
static inline int64_t fm_pool_out_len(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
    int64_t out = (in + 2 * p - k + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (out - 1) * s >= in + p) out--;
    return out;
}

typedef struct fm_pool_geom {
    int64_t N, C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
    bool nhwc, include_pad;
} fm_pool_geom;

/* x the input, y the output (or dy); a stride of 0 means the kernel size */
static inline fm_pool_geom fm_pool_geometry(const fm_pool2d_params *p, const fm_tensor *x, const fm_tensor *y) {
    fm_pool_geom g;
    g.nhwc = p->layout == FM_NHWC;
    fm_image_dims(x, y, g.nhwc, &g.N, &g.C, &g.H, &g.W, &g.Ho, &g.Wo);
    g.kh = p->kernel[0]; g.kw = p->kernel[1];
    g.sh = p->stride[0] > 0 ? p->stride[0] : p->kernel[0];
    g.sw = p->stride[1] > 0 ? p->stride[1] : p->kernel[1];
    g.ph = p->padding[0]; g.pw = p->padding[1];
    g.include_pad = p->count_include_pad;
    return g;
}

/* conv2d_fused's CPU kernel (cpu/conv_fused_cpu.c): the f32 blocks it takes from fathom's
 * allocator for call c, all alive together, in the order it takes them (floats[i] < 0: not
 * taken; the padded input, the packed weights, the Winograd weights and workspaces), and 4 or
 * 2; or -1 when the call runs conv2d's own kernel, after an unpooled output of shape
 * ref_shape in the output's dtype (ref_shape[0] < 0: none, the conv writes the output). The
 * meta device replays them (meta_scratch.c). */
struct fm_op_call;
int fm_cpu_conv2d_fused_scratch(const struct fm_op_call *c, int64_t floats[4], int64_t ref_shape[4]);
/* qconv2d_int8's CPU kernel (cpu/qconv_cpu.c): the blocks it takes, all alive together, in
 * order (n[i] elements of dt[i]), and their count (0: none). */
int fm_cpu_qconv8_scratch(const struct fm_op_call *c, int64_t n[4], fm_dtype dt[4]);
/* qlinear_int8's (cpu/quant_cpu.c): the u8 activation codes' block, in elements. */
int64_t fm_cpu_qlinear8_scratch(const struct fm_op_call *c);

#endif
