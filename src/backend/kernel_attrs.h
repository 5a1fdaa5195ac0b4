/* Attribute structs passed from an op's front end (src/ops/ *.c) to the
 * backends' kernels through fm_op_call.attrs. One struct per op family.
 * Part of the kernel interface (backend/kernel.h includes it). */
#ifndef FATHOM_KERNEL_ATTRS_H
#define FATHOM_KERNEL_ATTRS_H
#include <stdint.h>
#include "fathom/ops.h"

/* LEAKY_RELU (a = slope), CLAMP (a = lo, b = hi). Other unary ops: unused. */
typedef struct fm_unary_attrs { double a, b; } fm_unary_attrs;
/* UNARY_BACKWARD: which forward op, and its attrs. in = {dy, x, y}; y may be NULL. */
typedef struct fm_unary_bwd_attrs { fm_op_id fwd; fm_unary_attrs fa; } fm_unary_bwd_attrs;

/* SUM, MEAN, AMAX, AMIN, VAR, STD, LOGSUMEXP: a mask of reduced axes (bit i = axis i),
 * keepdim is resolved by the front end (kernels always see keepdim-shaped outputs). */
typedef struct fm_reduce_attrs { unsigned axes_mask; int correction; } fm_reduce_attrs;
/* MAX_DIM, MIN_DIM, ARGMAX: one axis; outputs keepdim-shaped. */
typedef struct fm_dim_attrs { int axis; } fm_dim_attrs;
/* CUMSUM: the axis; exclusive (element i sums those before it), reverse (from the end). */
typedef struct fm_cumsum_attrs { int axis; bool exclusive, reverse; } fm_cumsum_attrs;

/* SOFTMAX, LOG_SOFTMAX and their backward: axis (the front end passes the last axis
 * contiguous; kernels may assume axis == ndim-1 of contiguous inputs). */
typedef struct fm_softmax_attrs { int axis; } fm_softmax_attrs;

/* CROSS_ENTROPY: in = {logits [N,C], target [N] (i64)}; out = {loss scalar or [N]}.
 * CROSS_ENTROPY_BACKWARD: in = {dloss, logits, target}; out = {dlogits}. */
typedef struct fm_ce_attrs { int64_t ignore_index; double label_smoothing; fm_reduction reduction; } fm_ce_attrs;
typedef struct fm_mse_attrs { fm_reduction reduction; } fm_mse_attrs;

/* LAYER_NORM: in = {x [M,N] contiguous, weight [N]|NULL, bias [N]|NULL};
 * out = {y, mean [M], rstd [M]} (f32; f64 when x is f64, so f64 gradchecks keep full precision).
 * LAYER_NORM_BACKWARD: in = {dy, x, weight|NULL, mean, rstd}; out = {dx, dweight|NULL, dbias|NULL}.
 * RMS_NORM: in = {x, weight|NULL}; out = {y, rstd}.  RMS_NORM_BACKWARD: in = {dy, x, weight, rstd};
 * out = {dx, dweight|NULL}. */
typedef struct fm_norm_attrs { double eps; } fm_norm_attrs;

/* DROPOUT: out = {y, mask (u8 [same shape])}; mask from Philox(seed, offset, i). */
typedef struct fm_dropout_attrs { double p; uint64_t seed, offset; } fm_dropout_attrs;

/* CONV2D: in = {x, w, b|NULL}; CONV2D_BACKWARD: in = {dy, x, w}; out = {dx|NULL, dw|NULL, db|NULL}. */
/* lowp: FM_BF16 when the products run in bf16 on f32 activations (fm_conv2d_mixed; the CPU's
 * NCHW kernels), else FM_F32 (0): the products in the inputs' dtype. */
typedef struct fm_conv2d_attrs { fm_conv2d_params p; int lowp; } fm_conv2d_attrs;
/* Whether the CPU kernels (and the meta device's replay of their scratch) take the bf16
 * products for a call with f32 input x_dt and K = Cin/groups * kH * kW multiply-adds per
 * output: NCHW, and K >= 16. A first layer's short columns (fashion-cnn's K = 9) stay
 * f32: there the product is a small part of the layer, and the bf16 form's staging copy
 * cost more than it saved (the fashion-cnn bf16 step 4% slower, AMD EPYC Zen 4). */
static inline int fm_conv2d_lowp_products(const fm_conv2d_attrs *a, fm_dtype x_dt, int64_t K) {
    return a->lowp == FM_BF16 && x_dt == FM_F32 && a->p.layout == FM_NCHW && K >= 16;
}
/* A convolution's output size along one spatial dim (input in, kernel k, stride s, padding
 * p, dilation d), or -1 if the dilated kernel does not fit: the front end's shape check
 * (ops/conv.c) and the profiler's FLOP count of the fused conv (profile/op_cost.c). */
static inline int64_t fm_conv2d_out_size(int64_t in, int k, int s, int p, int d) {
    int64_t span = (int64_t)d * (k - 1) + 1, padded = in + 2 * (int64_t)p;
    if (padded < span) return -1;
    return (padded - span) / s + 1;
}
/* CONV2D_FUSED: in = {x, w, b|NULL}; out = {y}: max_pool(relu(conv2d(x))) with ReLU if relu
 * and a pool x pool window at stride pool, no padding, when pool > 1. */
/* hi: an upper bound the outputs are clamped to after the ReLU (ReLU6: relu 1, hi 6), INFINITY for none */
typedef struct fm_conv2d_fused_attrs { fm_conv2d_params p; int relu, pool; double hi; } fm_conv2d_fused_attrs;
/* CONV2D_FUSED_PACK: in = {w [O, C, kH, kW]}; out = {1-D f32 of 3 + this many floats}: a
 * header, then the weights in the device's form (the CPU's AVX2 form pads O to 8s). When
 * per = C*kH*kW is a multiple of 9 there is room after them for the CPU's Winograd
 * weights of a 3x3 conv (16 matrices [C][O], O rounded up to 16, a cache line apart and
 * aligned: conv_wino.h). */
static inline int64_t fm_conv2d_fused_pack_numel(int64_t O, int64_t per) {
    return (O + 7) / 8 * 8 * per + (per % 9 == 0 ? 16 * (per / 9 * ((O + 15) / 16 * 16) + 16) + 16 : 0);
}
/* LINEAR_FUSED: in = {x [..., K], w [N, K], b [N]|NULL, packed|NULL}; out = {y [..., N]}:
 * x w^T + b, then ReLU if relu. LINEAR_FUSED_PACK: in = {w [N, K] f32}; out = {1-D f32 of
 * 3 + this many floats}: a header, then the weights in panels of 16 output columns. */
/* LINEAR_FUSED: relu, or act (1: apply act_op, a one-input op without attributes:
 * GELU, GELU_TANH, SILU, SIGMOID or TANH) to the outputs after the bias. */
typedef struct fm_linear_fused_attrs { int relu, act; fm_op_id act_op; } fm_linear_fused_attrs;
/* EW_CHAIN: in = {x}, out = {y}, both contiguous, one shape, f32 */
typedef struct fm_ew_chain_attrs { int n; fm_ew_step steps[FM_EW_CHAIN_MAX]; } fm_ew_chain_attrs;
static inline int64_t fm_linear_fused_pack_numel(int64_t N, int64_t K) { return (N + 15) / 16 * 16 * K; }
/* pools: MAX_POOL2D out = {y, argmax indices i64 | NULL (no backward: not computed)}; MAX_POOL2D_BACKWARD in = {dy, x, indices};
 * AVG_POOL2D_BACKWARD in = {dy}, out = {dx} whose shape is preset by the front end. */
typedef struct fm_pool2d_attrs { fm_pool2d_params p; } fm_pool2d_attrs;
/* BATCH_NORM: in = {x, weight|NULL, bias|NULL, running_mean|NULL, running_var|NULL};
 * out = {y, save_mean [C], save_rstd [C]}. BATCH_NORM_BACKWARD in = {dy, x, weight|NULL,
 * save_mean, save_rstd}; out = {dx, dweight|NULL, dbias|NULL}. */
typedef struct fm_bn_attrs { int training; double momentum, eps; fm_layout layout; } fm_bn_attrs;

/* CAT: in = n tensors; GATHER/SCATTER_ADD/INDEX_SELECT/INDEX_ADD: axis.
 * SCATTER_ADD in = {base(zeros), index, src}; INDEX_ADD in = {base(zeros), index, src}. */
typedef struct fm_axis_attrs { int axis; } fm_axis_attrs;
/* SCATTER: in = {t, index, src (index's shape)}; SCATTER_ND: in = {t, indices, updates}, axis unused. */
typedef struct fm_scatter_attrs { int axis; int reduce; /* fm_scatter_reduce */ } fm_scatter_attrs;
typedef struct fm_one_hot_attrs { int64_t num_classes; } fm_one_hot_attrs;
/* TOPK: in = {x (contiguous)}, out = {values, indices i64}, each x's shape with k along axis. */
typedef struct fm_topk_attrs { int64_t k; int axis; int largest; } fm_topk_attrs;

/* SDPA: in = {q, k, v}; out = {o [B,H,Tq,D], lse [B,H,Tq] f32}.
 * SDPA_BACKWARD: in = {dout, q, k, v, out, lse}; out = {dq, dk, dv}. */
/* lowp as in fm_sdpa_qkv_attrs (fm_scaled_dot_product_attention_mixed). */
typedef struct fm_sdpa_attrs { int causal; double scale; int lowp; } fm_sdpa_attrs;
/* QKV_SPLIT_HEADS: in = {qkv [B,T,(H+2KV)*D]}; out = {q [B,H,T,D], k, v [B,KV,T,D]}.
 * QKV_SPLIT_HEADS_BACKWARD: in = {dq, dk, dv} (each may be NULL: zero); out = {dqkv}. */
typedef struct fm_qkv_split_attrs { int64_t n_head, n_kv_head, head_dim; } fm_qkv_split_attrs;
/* ROPE: in = {x, cos, sin}; inverse: the transposed rotation (the gradient). */
typedef struct fm_rope_attrs { int inverse; } fm_rope_attrs;
/* SDPA_QKV: in = {qkv [B,T,(H+2KV)*D] contiguous}; out = {y [B,T,H*D], lse [B,H,T] f32}.
 * SDPA_QKV_BACKWARD: in = {dy [B,T,H*D], qkv, y, lse}; out = {dqkv [B,T,(H+2KV)*D]}. */
/* lowp: FM_BF16 for the products in bf16 on f32 operands (fm_sdpa_qkv_mixed; the CPU kernels
 * where the CPU's bf16 dot product is fast), else FM_F32 (0). */
typedef struct fm_sdpa_qkv_attrs { int64_t n_head, n_kv_head, head_dim; int causal; double scale; int lowp; } fm_sdpa_qkv_attrs;
/* BIAS_GELU_TANH: in = {x [M, N] contiguous, b [N]}; out = {y}. No attrs.
 * BIAS_GELU_TANH_BACKWARD: in = {dy, x, b}; out = {dx, db|NULL} (db summed over the M rows).
 * ADD_LAYER_NORM: in = {x, h (same shape, contiguous), weight [N]|NULL, bias [N]|NULL};
 * out = {sum = x + h, y = layer_norm(sum), mean [M], rstd [M]} (statistics as LAYER_NORM's), attrs
 * fm_norm_attrs. ADD_LAYER_NORM_BACKWARD: in = {dy|NULL, dsum|NULL, sum, weight|NULL, mean, rstd};
 * out = {dsum_total = dsum + d layer_norm/d sum, dweight|NULL, dbias|NULL} (NULL dy or dsum: zero). */
/* OPTIM_STEP: in = {param, grad, state1|NULL, state2|NULL}, contiguous, one dtype (f32/f64); no
 * outputs: param and state are updated in place. kind: fm_optim_kind (0 SGD: state1 = momentum
 * buffer, NULL without momentum; 1 Adam, 2 AdamW: state1/2 = exp_avg/exp_avg_sq). wd is the
 * parameter's group decay; bc1/bc2 = 1 - beta^step; first: SGD's first momentum step copies. */
typedef struct fm_optim_step_attrs {
    int kind;
    int nesterov, first;
    double lr, wd, momentum, dampening, beta1, beta2, eps, bc1, bc2;
} fm_optim_step_attrs;
/* SUM_SQ_BLOCKS: in = {x contiguous f32/f64}; out = {f64 [ceil(n / FM_SUM_SQ_BLOCK)]}: the sum of
 * squares of each block (four interleaved accumulators), so a norm is the same bits for any thread
 * count. SCALE_INPLACE: in = {x contiguous f32/f64}, no outputs: x *= s, s rounded to x's dtype. */
/* QLINEAR_INT8: in = {x [M, K] f32, w i8, w_scale [N] f32, bias [N] f32|NULL, w_sum [N] i32|NULL};
 * out = {y [M, N] f32}. w is [N, K] (rows; w_sum NULL, summed per call) or the panels
 * [ceil(N/16), ceil(K/4), 16, 4] (backend/cpu/quant_kernels.h; w_sum required).
 * a_scale > 0: static activation quantization with (a_scale, a_zero); 0: dynamic (range of x per call).
 * act: an activation fused after the bias (FM_QACT_*: 0 none, 1 ReLU, 2 tanh GELU, 3 exact GELU). */
typedef struct fm_qlinear8_attrs {
    double a_scale;
    int a_zero;
    int act;
    int per_row; /* dynamic with one scale and zero point per row of x (fm_qlinear_int8_rows): CPU only */
} fm_qlinear8_attrs;
/* Where weight (n, k) of an int8 [N, K] matrix lies in its panels (Kq = ceil(K/4)):
 * panel n/16, step k/4, then 16 columns x 4 bytes. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int64_t fm_q8_panel_index(int64_t Kq, int64_t n, int64_t k) {
    return ((n >> 4) * Kq + (k >> 2)) * 64 + (n & 15) * 4 + (k & 3);
}
/* QLINEAR_INT4: in = {x [M, K] f32, w [N, K/2] u8, scale [N, K/G] f16, min [N, K/G] f16|NULL, bias [N] f32|NULL}.
 * QEMBEDDING_INT4: in = {w [V, D/2] u8, scale [V, D/G] f16, min|NULL, indices (i32/i64)}; out = {[..., D] f32}. */
typedef struct fm_q4_attrs { int64_t group; } fm_q4_attrs;
/* QEMBEDDING_INT8: in = {panels i8 [ceil(V/16), ceil(D/4), 16, 4] (fm_q8_panel_index), scale [V] f32,
 * indices (i32/i64)}; out = {[..., D] f32}, row r = scale[r] * its int8 codes. */
typedef struct fm_q8emb_attrs { int64_t dim; } fm_q8emb_attrs;
/* QCONV2D_INT8: in = {x [N, C, H, W] f32, panels i8 [ceil(O/16), ceil(K/4), 16, 4] of the weight
 * as [O, K] with K = kh kw C running (ky, kx, c) (fm_quantize_conv_weight_int8), w_scale [O] f32,
 * bias [O] f32|NULL, w_sum [O] i32}; out = {[N, O, Ho, Wo] f32}; the panels' K is fm_qconv_panel_k(K)
 * (zeros past K). groups 1, NCHW. a_scale > 0:
 * static (a_scale, a_zero); 0: the range of this x. relu: max(y, 0); then y = min(y, hi); pool > 1:
 * a pool x pool max pool at stride pool after (out [N, O, Ho / pool, Wo / pool]). */
/* The K a convolution's int8 panels hold (fm_quantize_conv_weight_int8): kh kw C rounded up to
 * a multiple of 64 from 64 on, so that the AMX tiles (64 K a step) take the whole product
 * (zeros cost up to 63 of each row's K elsewhere: 288 -> 320 for a 3x3 over 32 channels), and
 * to a multiple of 4 (the panels' step) below, where the tiles would mostly hold zeros. */
static inline int64_t fm_qconv_panel_k(int64_t K) { return K >= 64 ? (K + 63) / 64 * 64 : (K + 3) / 4 * 4; }
typedef struct fm_qconv8_attrs {
    int kh, kw, stride[2], padding[2], dilation[2];
    double a_scale;
    int a_zero;
    int relu;
    double hi;
    int pool;
} fm_qconv8_attrs;
#define FM_SUM_SQ_BLOCK 8192
typedef struct fm_scale_attrs { double s; } fm_scale_attrs;
#endif
