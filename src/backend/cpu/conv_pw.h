/* The unpadded 1x1 stride-1 convolution (MobileNet's expand and project layers,
 * SqueezeNet's squeeze and expand, ResNet-50's bottleneck ends), NCHW f32, one
 * group at a time, with the bias and the clamp (ReLU, ReLU6) in the same pass:
 *
 *     y[n][o][p] = min(hi, max(lo, sum_c w[o][c] x[n][c][p] + bias[o]))
 *
 * Why not sgemm per sample and an epilogue pass (conv2d's route before, still
 * its route at the other levels): with the small K of these layers (16-960) the
 * product is short and the output large, and sgemm (OpenBLAS 0.3.21 on an AMD
 * EPYC Zen 3) first clears the output (sgemm_beta: 9.7% of MobileNetV2's compiled
 * graph at batch 8), then writes it, then the bias and ReLU6 pass reads and
 * writes it again (4.7%); packing its operands took another 9.2%. Here each 6 x 16
 * output tile is summed in registers and stored once, finished.
 *
 * The GEMM's columns are the pixels of the whole batch (N * P of them), so a
 * 7x7 layer's 49 pixels do not leave most of a 16-column tile empty per sample:
 * a tile may span two samples, and is packed and stored piecewise then. The
 * weights are packed once per call into 6-row panels [C][6] (zero rows past O);
 * each task packs its 16 columns of the input [C][16] (zero columns past N * P)
 * in its thread's buffer and runs every 6-row panel of its output-channel range
 * over them: 12 accumulators, per step two loads of the columns, six broadcasts
 * of the weights and twelve FMAs. Only the AVX2 build exists; the caller runs it
 * at the AVX2 level (not measured against the AVX-512 sgemm).
 *
 * conv2d runs its other convs' products through it too (the same sums with K = C * kh *
 * kw): grouped convs on their im2col columns, strided ones (the stems of SqueezeNet,
 * MobileNet and ResNet, ResNet's stride-2 layers) gathering each tile's columns from the
 * input themselves (fm_conv_pw_geom): SqueezeNet's 7x7 stem wrote and read back 7 MB of
 * im2col columns per sample, and split that im2col over its 3 input channels. */
#ifndef FATHOM_CONV_PW_H
#define FATHOM_CONV_PW_H
#include <stdbool.h>
#include <stdint.h>

/* A conv whose im2col the kernel gathers itself, tile by tile (fm_conv_pw.conv): the
 * input [N][Cin][H][W], kernel kh x kw, strides, padding and dilation; rows k = (c * kh +
 * i) * kw + j of the product, as conv2d's im2col orders them. */
typedef struct fm_conv_pw_geom {
    int64_t Cin, H, W, Wo, kh, kw, sh, sw, ph, pw, dh, dw;
} fm_conv_pw_geom;

typedef struct fm_conv_pw {
    const float *x;    /* [N][C][P]: sample n's channel c at x + n * x_stride + c * ldx */
    const float *w;    /* [O][C] */
    const float *bias; /* [O] or NULL */
    float *y;          /* [N][O][P] at y_stride floats per sample */
    int64_t N, C, O, P, x_stride, y_stride;
    int64_t ldx;       /* P for an input tensor; conv2d's im2col columns [C][N * P]: N * P, x_stride P */
    float lo, hi;      /* outputs clamped to [lo, hi]; -inf, inf: no clamp (NaN passes through either way) */
    const fm_conv_pw_geom *conv; /* NULL, or x is that conv's input (x_stride = Cin * H * W, C = Cin * kh * kw,
                                  * P = Ho * Wo, ldx unused): no im2col buffer, each tile gathers its columns */
} fm_conv_pw;

/* Runs the conv on the thread pool. false only when its packing buffers could not
 * be allocated (malloc, as sgemm's packing; nothing was written): the caller then
 * takes the sgemm route. */
bool fm_conv_pw_run_avx2(const fm_conv_pw *d);

/* The same on the calling thread, with the caller's buffer of fm_conv_pw_serial_floats(d)
 * floats, 32-byte aligned: for a caller that runs many small convs as one pool task each
 * (conv2d's grouped convs, one sample and group a task). */
int64_t fm_conv_pw_serial_floats(const fm_conv_pw *d);
void fm_conv_pw_serial_avx2(const fm_conv_pw *d, float *buf);
#endif
