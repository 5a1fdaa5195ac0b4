/* Helpers shared by op front ends. */
#ifndef FATHOM_OPS_INTERNAL_H
#define FATHOM_OPS_INTERNAL_H
#include "fathom/ops.h"
/* Fill a host tensor (any layout) with v. */
fm_status fm_cpu_fill(fm_tensor *t, double v);
/* A linear whose GEMMs run in lowp (FM_BF16 or FM_F16) with f32 accumulation on
 * f32 activations: x and w are cast inside, the bias joins the GEMM, the output is
 * the f32 accumulator, and the backward's two GEMMs take one lowp copy of the
 * gradient; the input gradient is f32. One autograd node. Only for devices whose
 * matmul accepts an f32 output for lowp operands (the CPU, check); other cases
 * (f64 or lowp inputs, another device) are fm_linear's. */
fm_tensor *fm_linear_mixed(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_dtype lowp);
/* The same with wlow, a contiguous lowp copy of w made once by the caller (a decode
 * loop's: the weights do not change between its steps), used instead of converting w
 * on every call; NULL, or a tensor that is not such a copy, converts as above. */
fm_tensor *fm_linear_mixed_w(fm_tensor *x, fm_tensor *w, fm_tensor *wlow, fm_tensor *b, fm_dtype lowp);
/* conv2d with the same split (NCHW, lowp FM_BF16): f32 input, weight, bias and output, the
 * products in bf16 with f32 accumulation inside the kernels (conv2d_cpu.c); otherwise
 * fm_conv2d's path and errors. */
fm_tensor *fm_conv2d_mixed(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *p, fm_dtype lowp);
/* sdpa_qkv on an f32 qkv with its products in lowp (FM_BF16) where the device's kernel has
 * such a path (the CPU's attention_avx512bf16.c, on CPUs whose bf16 dot product is fast;
 * else the f32 kernel): scores, softmax and sums in f32, q/k/v, dO and the probabilities
 * rounded to bf16 as they enter the products. Call it outside autocast (the f32 path). */
fm_tensor *fm_sdpa_qkv_mixed(fm_tensor *qkv, int n_head, int n_kv_head, bool causal, double scale, fm_dtype lowp);
/* scaled_dot_product_attention with the same lowp request ([B, H, T, D] heads). */
fm_tensor *fm_scaled_dot_product_attention_mixed(fm_tensor *q, fm_tensor *k, fm_tensor *v, bool causal, double scale,
                                                 fm_dtype lowp);
/* Whether t's device runs the mixed ops' kernels: the CPU, and the check and meta devices
 * that mirror it. */
bool fm_mixed_device(const fm_tensor *t);
/* The lowp dtype for the nn modules' linears and convolutions under the calling thread's
 * autocast: FM_BF16 for bf16 autocast on f32 x and w on a mixed device, else FM_F32 (no
 * mixing: fm_linear/fm_conv2d, with the op-by-op autocast where it applies). */
fm_dtype fm_mixed_lowp(const fm_tensor *x, const fm_tensor *w);
#endif
