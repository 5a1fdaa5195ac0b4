/* fathom/ops.h: the differentiable operations.
 *
 * Every function returns a NEW tensor reference, or NULL with fm_last_error()
 * set (shape errors name the op and the shapes). Inputs are borrowed: the
 * caller keeps its own references. When grad mode is on and an input requires
 * grad, the result records its backward on the autograd tape.
 * The op list itself is fathom/ops.def. */
#ifndef FATHOM_OPS_H
#define FATHOM_OPS_H
#include "fathom/export.h"

#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fm_op_id {
#define X(id, name, nin, nout, flags, prec, group) FM_OP_##id,
#include "fathom/ops.def"
#undef X
    FM_OP_COUNT
} fm_op_id;

enum { FM_OPF_DIFF = 1, FM_OPF_INTERNAL = 2, FM_OPF_STRIDED = 4, FM_OPF_F32_ONLY = 8 };
/* The prec and group columns of ops.def (what each means is said there). */
typedef enum fm_prec { FM_PREC_ANY = 0, FM_PREC_LOWP, FM_PREC_F32, FM_PREC_PROMOTE } fm_prec;
typedef enum fm_op_group {
    FM_GROUP_OTHER = 0, FM_GROUP_UNARY, FM_GROUP_ACT, FM_GROUP_BINARY, FM_GROUP_COMPARE, FM_GROUP_REDUCE
} fm_op_group;

/* FM_OP_IF_ACT_##group(...) keeps its arguments for the ACT group only: an X-macro
 * over ops.def generates, for each unary activation, its prototype (below), its
 * front end (src/ops/elementwise.c) and its CPU and CUDA kernel cases, from the
 * functions fm_<name>_{d,f} and fm_<name>_deriv_{d,f} in src/backend/scalar_math.h. */
#define FM_OP_IF_ACT_ACT(...) __VA_ARGS__
#define FM_OP_IF_ACT_UNARY(...)
#define FM_OP_IF_ACT_BINARY(...)
#define FM_OP_IF_ACT_COMPARE(...)
#define FM_OP_IF_ACT_REDUCE(...)
#define FM_OP_IF_ACT_OTHER(...)

typedef struct fm_op_info {
    const char *name;
    int n_in, n_out;
    unsigned flags;
    fm_prec prec;
    fm_op_group group;
} fm_op_info;
FM_API const fm_op_info *fm_op_get_info(fm_op_id op);
/* FM_OP_COUNT if unknown. */
FM_API fm_op_id fm_op_find(const char *name);

typedef enum fm_reduction { FM_REDUCE_MEAN = 0, FM_REDUCE_SUM = 1, FM_REDUCE_NONE = 2 } fm_reduction;
typedef enum fm_layout { FM_NCHW = 0, FM_NHWC = 1 } fm_layout;

/* ---- elementwise unary ---- */
FM_API fm_tensor *fm_neg(fm_tensor *a);
FM_API fm_tensor *fm_abs(fm_tensor *a);
FM_API fm_tensor *fm_exp(fm_tensor *a);
FM_API fm_tensor *fm_log(fm_tensor *a);
FM_API fm_tensor *fm_sqrt(fm_tensor *a);
FM_API fm_tensor *fm_rsqrt(fm_tensor *a);
FM_API fm_tensor *fm_sin(fm_tensor *a);
FM_API fm_tensor *fm_cos(fm_tensor *a);
FM_API fm_tensor *fm_tan(fm_tensor *a);
FM_API fm_tensor *fm_asin(fm_tensor *a);
FM_API fm_tensor *fm_acos(fm_tensor *a);
FM_API fm_tensor *fm_atan(fm_tensor *a);
FM_API fm_tensor *fm_sinh(fm_tensor *a);
FM_API fm_tensor *fm_cosh(fm_tensor *a);
FM_API fm_tensor *fm_asinh(fm_tensor *a);
FM_API fm_tensor *fm_acosh(fm_tensor *a);
FM_API fm_tensor *fm_atanh(fm_tensor *a);
FM_API fm_tensor *fm_erf(fm_tensor *a);
/* floor, ceil, round (half to even, as ONNX's Round and torch.round) and sign (-1, 0, 1;
 * NaN stays NaN): their gradient is 0, as in PyTorch */
FM_API fm_tensor *fm_floor(fm_tensor *a);
FM_API fm_tensor *fm_ceil(fm_tensor *a);
FM_API fm_tensor *fm_round(fm_tensor *a);
FM_API fm_tensor *fm_sign(fm_tensor *a);
FM_API fm_tensor *fm_tanh(fm_tensor *a);
FM_API fm_tensor *fm_sigmoid(fm_tensor *a);
FM_API fm_tensor *fm_relu(fm_tensor *a);
FM_API fm_tensor *fm_leaky_relu(fm_tensor *a, double negative_slope);
/* The unary activations: each ACT line of ops.def declares
 *   FM_API fm_tensor *fm_<name>(fm_tensor *a);
 * (fm_gelu: exact, x Phi(x) with erf; fm_gelu_tanh: the tanh approximation; fm_silu;
 * each one's formula is beside its math in src/backend/scalar_math.h). */
#define X(id, name, nin, nout, flags, prec, group) FM_OP_IF_ACT_##group(FM_API fm_tensor *fm_##name(fm_tensor *a);)
#include "fathom/ops.def"
#undef X
FM_API fm_tensor *fm_clamp(fm_tensor *a, double lo, double hi); /* use -INFINITY/INFINITY for one side */

/* ---- elementwise binary (numpy broadcasting; both operands same dtype) ---- */
FM_API fm_tensor *fm_add(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_sub(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_mul(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_div(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_pow(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_maximum(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_minimum(fm_tensor *a, fm_tensor *b);
/* a - trunc(a / b) * b, the dividend's sign (torch.fmod, C fmod, ONNX Mod fmod=1) and
 * a - floor(a / b) * b, the divisor's (torch.remainder, Python %, ONNX Mod fmod=0), computed
 * as fmod exactly; integers (exact up to 2^53) give 0 for a divisor of 0. */
FM_API fm_tensor *fm_fmod(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_remainder(fm_tensor *a, fm_tensor *b);
/* scalar conveniences (scalar takes a's dtype) */
FM_API fm_tensor *fm_add_scalar(fm_tensor *a, double s);
FM_API fm_tensor *fm_mul_scalar(fm_tensor *a, double s);
FM_API fm_tensor *fm_pow_scalar(fm_tensor *a, double s);
/* comparisons give FM_BOOL */
FM_API fm_tensor *fm_eq(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_ne(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_lt(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_le(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_gt(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_ge(fm_tensor *a, fm_tensor *b);
FM_API fm_tensor *fm_where(fm_tensor *cond, fm_tensor *a, fm_tensor *b);

/* ---- reductions: n_axes == 0 means all axes; negative axes count from the end ---- */
FM_API fm_tensor *fm_sum(fm_tensor *a, int n_axes, const int *axes, bool keepdim);
FM_API fm_tensor *fm_mean(fm_tensor *a, int n_axes, const int *axes, bool keepdim);
FM_API fm_tensor *fm_amax(fm_tensor *a, int n_axes, const int *axes, bool keepdim);
FM_API fm_tensor *fm_amin(fm_tensor *a, int n_axes, const int *axes, bool keepdim);
/* max/min along one axis with indices (FM_I64); *indices may be NULL if unwanted */
FM_API fm_tensor *fm_max_dim(fm_tensor *a, int axis, bool keepdim, fm_tensor **indices);
FM_API fm_tensor *fm_min_dim(fm_tensor *a, int axis, bool keepdim, fm_tensor **indices);
FM_API fm_tensor *fm_argmax(fm_tensor *a, int axis, bool keepdim);
/* correction: 1 = unbiased (PyTorch default), 0 = population */
FM_API fm_tensor *fm_var(fm_tensor *a, int n_axes, const int *axes, int correction, bool keepdim);
FM_API fm_tensor *fm_std(fm_tensor *a, int n_axes, const int *axes, int correction, bool keepdim);
FM_API fm_tensor *fm_logsumexp(fm_tensor *a, int n_axes, const int *axes, bool keepdim);
/* The product over axes (computed in f64; integer inputs keep their dtype, exact while the
 * product stays below 2^53 in magnitude); the empty product is 1. Its gradient is exact with
 * zeros: the product of the others. */
FM_API fm_tensor *fm_prod(fm_tensor *a, int n_axes, const int *axes, bool keepdim);
/* The running sum along axis, in a's dtype (integers exact, wrapping on overflow; floats
 * accumulated in double on the CPU): y[i] = a[0] + ... + a[i]; exclusive: a[0] + ... + a[i-1]
 * (0 first); reverse: from the end (a[i] + ... + a[n-1]). ONNX's CumSum, torch.cumsum. */
FM_API fm_tensor *fm_cumsum(fm_tensor *a, int axis, bool exclusive, bool reverse);
/* Sum `a` down to `shape` (the inverse of broadcasting). */
FM_API fm_tensor *fm_sum_to(fm_tensor *a, int ndim, const int64_t *shape);

/* ---- linear algebra ---- */
/* numpy matmul semantics: 1-D operands are promoted; batch dims broadcast */
FM_API fm_tensor *fm_matmul(fm_tensor *a, fm_tensor *b);
/* y = x @ w^T + b, w: [out, in] (PyTorch Linear layout); b may be NULL */
FM_API fm_tensor *fm_linear(fm_tensor *x, fm_tensor *w, fm_tensor *b);

/* ---- softmax family and losses ---- */
FM_API fm_tensor *fm_softmax(fm_tensor *a, int axis);
FM_API fm_tensor *fm_log_softmax(fm_tensor *a, int axis);
/* logits [N, C] (or [C]); target FM_I64/FM_I32 [N] class indices. Fused: the
 * probabilities are never materialized. */
FM_API fm_tensor *fm_cross_entropy(fm_tensor *logits, fm_tensor *target, int64_t ignore_index,
                            double label_smoothing, fm_reduction reduction);
FM_API fm_tensor *fm_mse_loss(fm_tensor *input, fm_tensor *target, fm_reduction reduction);

/* ---- normalization, embedding, dropout ---- */
/* normalizes over the last `n_norm_dims` dims; weight/bias (may be NULL) have that shape */
FM_API fm_tensor *fm_layer_norm(fm_tensor *x, int n_norm_dims, fm_tensor *weight, fm_tensor *bias, double eps);
FM_API fm_tensor *fm_rms_norm(fm_tensor *x, fm_tensor *weight, double eps); /* over the last dim */
FM_API fm_tensor *fm_embedding(fm_tensor *weight, fm_tensor *indices);   /* weight [V, D] */
/* Inverted dropout. Not training or p == 0: returns a new ref to x. rng NULL: global. */
FM_API fm_tensor *fm_dropout(fm_tensor *x, double p, bool training, fm_rng *rng);

/* ---- convolution and pooling ---- */
typedef struct fm_conv2d_params {
    int stride[2], padding[2], dilation[2];
    int groups;
    fm_layout layout; /* x and y layout; weight is always [Cout, Cin/groups, kH, kW] */
} fm_conv2d_params;
FM_API fm_conv2d_params fm_conv2d_default_params(void); /* stride 1, pad 0, dil 1, groups 1, NCHW */
FM_API fm_tensor *fm_conv2d(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *p);
/* The transposed convolution (ConvTranspose, torch.nn.ConvTranspose2d): the gradient of
 * fm_conv2d with respect to its input. x [N, Cin, H, W] (NCHW), w [Cin, Cout/groups, kH, kW]
 * (PyTorch's and ONNX's layout for it), b [Cout] or NULL -> y [N, Cout, Ho, Wo] with
 * Ho = (H - 1) stride - 2 padding + dilation (kH - 1) + output_padding + 1 (Wo alike);
 * output_padding (NULL: 0) below the stride. Differentiable in x, w and b; runs where the
 * device has conv2d's backward kernel. */
FM_API fm_tensor *fm_conv_transpose2d(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *p, const int *output_padding);
/* Its checks and y's shape from the shapes alone (x [4], w [4]; bias_len -1: no bias). */
FM_API fm_status fm_conv_transpose2d_shape(const int64_t *xs, const int64_t *ws, int64_t bias_len, const fm_conv2d_params *p,
                                           const int *output_padding, int64_t *ys);
/* Inference only (no gradient): max_pool2d(relu(conv2d(x, w, b))) in one kernel. ReLU when
 * `relu`; when pool > 1 a pool x pool max pool at stride pool, no padding; pool 0 or 1: none.
 * f32 or f64. On the CPU f32 NCHW stride-1 convs store only the pooled output. */
FM_API fm_tensor *fm_conv2d_fused(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *p, bool relu, int pool);
/* The weights w [O, C/groups, kH, kW] in the packed form the device's conv2d_fused
 * kernel reads (a 1-D tensor that says which form it holds); made once, e.g. at a
 * graph's load, and passed as `packed` so that no call repacks them. A packed tensor
 * made for another weight shape or kernel level is ignored (the kernel packs w
 * itself), so the result never depends on it. Devices without such a kernel: NULL
 * with an error. */
FM_API fm_tensor *fm_conv2d_fused_pack(fm_tensor *w);
FM_API fm_tensor *fm_conv2d_fused_packed(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, const fm_conv2d_params *p,
                                         bool relu, int pool);
/* fm_conv2d_fused_packed with the activation's outputs also capped at hi (ReLU6: relu and
 * hi 6; a Clip(-inf, hi) without relu); hi = INFINITY is fm_conv2d_fused_packed. NaN stays. */
FM_API fm_tensor *fm_conv2d_fused_capped(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, const fm_conv2d_params *p,
                                         bool relu, double hi, int pool);
/* Inference: y = x w^T + b (b may be NULL), then ReLU when relu, with the bias and the
 * ReLU applied before anything is stored; x f32 or f64 [..., K], w [N, K], b [N]. No
 * autograd (fathom compile's fuse-linear-act writes it). `packed`: NULL, or
 * fm_linear_fused_pack(w), the weights in the panel form the CPU's AVX2/FMA kernel
 * reads, made once (a graph does it at load) so that no call packs them. Without it,
 * for f64, a packed tensor of another shape, or a CPU without AVX2 the result is
 * linear's GEMM, then ReLU. fm_linear_fused_pack: w f32 [N, K] -> a 1-D f32 tensor of
 * 3 + ceil(N/16)*16*K floats (a header, then 16-column panels [K][16]). */
FM_API fm_tensor *fm_linear_fused(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, bool relu);
/* fm_linear_fused with an activation named act: NULL or "none", "relu", "gelu" (erf),
 * "gelu_tanh", "silu", "sigmoid" or "tanh" (the values fm_gelu and the rest give on the
 * product; on the CPU applied to each block of outputs as it is written). */
FM_API fm_tensor *fm_linear_fused_act(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, const char *act);
/* The activation name of fm_linear_fused_act: *relu 1 for "relu", else *op the fm_op_id of
 * the others (-1: none); an error naming the choices for another name. */
FM_API fm_status fm_linear_act_parse(const char *act, int *relu, int *op);
FM_API fm_tensor *fm_linear_fused_pack(fm_tensor *w);
typedef struct fm_pool2d_params {
    int kernel[2], stride[2], padding[2];
    bool count_include_pad; /* avg pool; PyTorch default true */
    fm_layout layout;
    bool ceil_mode; /* output size rounded up, as PyTorch's ceil_mode and ONNX's: a last window
                     * may run past the end (it is clipped; one must start inside the input or
                     * the left padding); an average then counts the padded cells only */
} fm_pool2d_params;
FM_API fm_tensor *fm_max_pool2d(fm_tensor *x, const fm_pool2d_params *p);
FM_API fm_tensor *fm_avg_pool2d(fm_tensor *x, const fm_pool2d_params *p);
/* x [N, C, ...] (NCHW) or [N, H, W, C] (NHWC); running stats (may be NULL) are
 * updated in place in training mode with `momentum` (PyTorch convention). */
FM_API fm_tensor *fm_batch_norm(fm_tensor *x, fm_tensor *weight, fm_tensor *bias, fm_tensor *running_mean,
                         fm_tensor *running_var, bool training, double momentum, double eps,
                         fm_layout layout);

/* ---- shape and indexing ---- */
FM_API fm_tensor *fm_cat(int n, fm_tensor *const *ts, int axis);
FM_API fm_tensor *fm_stack(int n, fm_tensor *const *ts, int axis);
/* Splits into n pieces of the given sizes (views); out[] receives new references. */
FM_API fm_status fm_split(fm_tensor *t, int axis, int n, const int64_t *sizes, fm_tensor **out);
FM_API fm_tensor *fm_gather(fm_tensor *t, int axis, fm_tensor *index);       /* torch.gather */
FM_API fm_tensor *fm_index_select(fm_tensor *t, int axis, fm_tensor *index); /* index 1-D */
/* How scatter combines an update with the element it lands on (torch.scatter_reduce's
 * include_self=True): replace, add, multiply, keep the larger or the smaller (NaN wins). */
typedef enum fm_scatter_reduce { FM_SCATTER_NONE = 0, FM_SCATTER_ADD, FM_SCATTER_MUL, FM_SCATTER_AMAX, FM_SCATTER_AMIN } fm_scatter_reduce;
FM_API const char *fm_scatter_reduce_name(fm_scatter_reduce r); /* none, add, mul, amax, amin */
FM_API fm_status fm_scatter_reduce_parse(const char *name, fm_scatter_reduce *r);
/* A copy of t with y[.., index[i..], ..] (index's position i along axis) = src[i..] combined
 * by reduce (torch.scatter / scatter_reduce, ONNX ScatterElements). index: i64/i32 in
 * [0, t.shape[axis]), t's rank, no larger than t off the axis; src: t's dtype and device, at
 * least index's shape (the part of that shape is read). Duplicate indices apply in index
 * order (the last wins for none). Gradients for none and add. */
FM_API fm_tensor *fm_scatter(fm_tensor *t, int axis, fm_tensor *index, fm_tensor *src, fm_scatter_reduce reduce);
/* ONNX ScatterND: indices [..., k] (i64/i32, k <= t's rank, negative from the end) name
 * slices t[i0, .., ik-1] that updates [..., t.shape[k:]...] replace or combine with, in order.
 * No gradient. */
FM_API fm_tensor *fm_scatter_nd(fm_tensor *t, fm_tensor *indices, fm_tensor *updates, fm_scatter_reduce reduce);
FM_API fm_tensor *fm_one_hot(fm_tensor *index, int64_t num_classes);         /* FM_F32 result */
/* The k largest (largest = true) or smallest elements of x along axis (torch.topk, ONNX
 * TopK), always in order: *values has x's dtype, *indices is i64, both x's shape with k
 * along the axis. Equal values come lower index first; NaN ranks above every number (first
 * when largest, last otherwise). 0 <= k <= x.shape[axis]. The gradient flows to the chosen
 * elements of x. On failure both outputs are NULL. */
FM_API fm_status fm_topk(fm_tensor *x, int64_t k, int axis, bool largest, fm_tensor **values, fm_tensor **indices);
/* x padded along each dim d by pads[d] elements before it and pads[ndim + d] after it
 * (ONNX Pad's order; torch.nn.functional.pad lists the dims the other way round); a
 * negative amount crops. constant: `value`; edge: the border element repeated; reflect:
 * mirrored about the border element, without repeating it (each amount below the dim's
 * size); wrap: the elements from the other end. Made of cat, slice and index_select, so it
 * runs on any device and has a gradient. */
typedef enum fm_pad_mode { FM_PAD_CONSTANT = 0, FM_PAD_EDGE, FM_PAD_REFLECT, FM_PAD_WRAP } fm_pad_mode;
FM_API fm_tensor *fm_pad(fm_tensor *x, const int64_t *pads, fm_pad_mode mode, double value);
/* fm_pad's checks and result shape, without data: out[d] = shape[d] + pads[d] + pads[ndim + d] */
FM_API fm_status fm_pad_shape(int ndim, const int64_t *shape, const int64_t *pads, fm_pad_mode mode, int64_t *out);
/* "constant", "edge", "reflect", "wrap" (ONNX's names) -> *mode; anything else is FM_ERR_INVALID naming the four */
FM_API fm_status fm_pad_mode_parse(const char *name, fm_pad_mode *mode);
FM_API const char *fm_pad_mode_name(fm_pad_mode mode);

/* ---- attention ---- */
/* q [B,H,Tq,D], k/v [B,Hkv,Tk,D] (Hkv divides H: grouped-query attention);
 * scale <= 0 means 1/sqrt(D). Tiled (flash-style): no Tq x Tk matrix is stored. */
FM_API fm_tensor *fm_scaled_dot_product_attention(fm_tensor *q, fm_tensor *k, fm_tensor *v, bool causal,
                                           double scale);
/* Inference attention over a KV cache kept in half precision (what a decode loop with
 * fm_graph_run_options.kv_dtype FM_F16 runs): q [B,H,T,D] f32; k, v [B,Hkv,L,D] f16
 * with L >= T, the past then these T rows, as views with any row strides; query i
 * attends to keys [0, L - T + i]. Returns [B,H,T,D] f32; scale <= 0 means 1/sqrt(D).
 * No gradient. CPU only. */
FM_API fm_tensor *fm_sdpa_kv16(fm_tensor *q, fm_tensor *k, fm_tensor *v, double scale);
/* Inference attention with an additive mask, as exported encoders (BERT) and decoders
 * write it: softmax(q k^T * scale + mask) v, where mask (q's dtype) broadcasts to
 * [B, H, Tq, Tk]; q [B,H,Tq,D], k, v [B,Hkv,Tk,D] f32 or f64 (views with unit-stride
 * rows are read in place). A query whose every key is masked (-inf) gets 0, as
 * transformers' exports make it. scale <= 0 means 1/sqrt(D). No gradient; CPU (on
 * other devices the graph composes it from matmul, add and softmax). */
FM_API fm_tensor *fm_sdpa_mask(fm_tensor *q, fm_tensor *k, fm_tensor *v, fm_tensor *mask, double scale);

/* ---- fused transformer helpers ---- */
/* qkv [B, T, (n_head + 2*n_kv_head) * D] (a fused QKV projection) -> new contiguous
 * q [B, n_head, T, D], k and v [B, n_kv_head, T, D] in one pass; the gradient is
 * written back into the fused layout in one pass too (no zero-padded slices). */
FM_API fm_status fm_qkv_split_heads(fm_tensor *qkv, int n_head, int n_kv_head, fm_tensor **q, fm_tensor **k, fm_tensor **v);
/* Self-attention straight on a fused QKV projection: qkv [B, T, (n_head + 2*n_kv_head) * D]
 * -> the merged heads [B, T, n_head * D] (what the output projection reads). The
 * values are those of fm_qkv_split_heads + fm_scaled_dot_product_attention + merging
 * the heads, but no split or merged copy is made, and the gradient is written into
 * the fused layout directly. scale <= 0 means 1/sqrt(D). Where the device's backend
 * has no fused kernel (or for f16/bf16), it runs as those three steps. */
FM_API fm_tensor *fm_sdpa_qkv(fm_tensor *qkv, int n_head, int n_kv_head, bool causal, double scale);
/* Rotary position embedding in the rotate-half form (Llama, GPT-NeoX, what Hugging Face's
 * rotate_half computes): x [..., T, D] (D even) with the tables' rows cos, sin [T, D] of
 * x's positions: y = x * cos + [-x[D/2:], x[:D/2]] * sin, in one pass (the composition is
 * two slices, a neg, a cat, two muls and an add). Gradient for x. */
FM_API fm_tensor *fm_rope(fm_tensor *x, fm_tensor *cos, fm_tensor *sin);
/* Inference: y = the steps applied in order to each element of x (f32), in one pass over
 * memory instead of one per step; v is the running value, x the input element. */
typedef enum fm_ew_step_op {
    FM_EW_ADD,   /* v + a */
    FM_EW_MUL,   /* v * a */
    FM_EW_SUB,   /* v - a */
    FM_EW_RSUB,  /* a - v */
    FM_EW_DIV,   /* v / a */
    FM_EW_RDIV,  /* a / v */
    FM_EW_CLAMP, /* min(max(v, a), b); NaN stays */
    FM_EW_RELU,
    FM_EW_SIGMOID,
    FM_EW_TANH,
    FM_EW_MUL_X, /* v * x */
    FM_EW_ADD_X, /* v + x */
    FM_EW_ROUND, /* to the nearest integer, halves to even (ONNX Round, QuantizeLinear) */
    FM_EW_OP_COUNT
} fm_ew_step_op;
typedef struct fm_ew_step { fm_ew_step_op op; float a, b; } fm_ew_step;
#define FM_EW_CHAIN_MAX 8
FM_API fm_tensor *fm_ew_chain(fm_tensor *x, int n_steps, const fm_ew_step *steps);
/* Inference: one LSTM step's gates in one pass, after the step's two matmuls. xg, hg [B, 4H]
 * (x W^T + biases, and h R^T; the gates in ONNX's order i, o, f, g), c [B, H], all f32 or all
 * f64 on one device: returns h' = sigmoid(o) tanh(c') and sets *c_out = c' = sigmoid(f) c +
 * sigmoid(i) tanh(g) (ONNX's LSTM with its default activations; nn.LSTM's order is i, f, g, o).
 * The composition is two adds, three sigmoids, two tanhs, three muls and an add. */
FM_API fm_tensor *fm_lstm_cell(fm_tensor *xg, fm_tensor *hg, fm_tensor *c, fm_tensor **c_out);
/* Inference: one GRU step's gates in one pass, after the step's two matmuls (ONNX's GRU with
 * linear_before_reset, what nn.GRU exports, and its default activations). xg [B, 3H] (x W^T + Wb),
 * hg [B, 3H] (h R^T + Rb), h [B, H], gate order z, r, n, all f32 or all f64 on one device: returns
 * h' = (1 - z) n + z h with z = sigmoid(xz + hz), r = sigmoid(xr + hr), n = tanh(xn + r hn). */
FM_API fm_tensor *fm_gru_cell(fm_tensor *xg, fm_tensor *hg, fm_tensor *h);
/* gelu_tanh(x + b) for x [..., N], b [N] (same float dtype): the bias of the linear
 * in front, added in the same pass; the backward writes dx and sums db in one pass. */
FM_API fm_tensor *fm_bias_gelu_tanh(fm_tensor *x, fm_tensor *b);
/* *sum = x + h and *y = layer_norm(*sum) over the last dim (weight/bias [N] or NULL),
 * in one pass over the rows; x and h have one shape and float dtype. *sum is the next
 * residual. Backward: the gradient reaching *sum is added to the norm's input gradient
 * in the same pass. h may be NULL: *sum is then x itself and *y is bitwise the *y of a
 * fused call whose sum equals x (what recomputation needs). Outputs are new references
 * (both NULL on error). */
FM_API fm_status fm_add_layer_norm(fm_tensor *x, fm_tensor *h, fm_tensor *weight, fm_tensor *bias, double eps,
                            fm_tensor **sum, fm_tensor **y);

/* ---- quantized inference (docs/QUANTIZE.md; made by fathom quantize) ---- */
/* y = x W^T + bias with W int8 [N, K] (w_scale [N] f32: W_f32[n] = w_scale[n] * W[n]);
 * x f32 [..., K] is quantized to u8 with a_scale/a_zero, or, when a_scale <= 0, with
 * the range of this x (dynamic). Integer products, f32 out [..., N]. bias may be NULL. */
FM_API fm_tensor *fm_qlinear_int8(fm_tensor *x, fm_tensor *w, fm_tensor *w_scale, fm_tensor *bias, double a_scale, int a_zero);
/* The same on weights packed once by fm_pack_weight_int8 (fathom/quant.h): panels i8
 * [ceil(N/16), ceil(K/4), 16, 4] and their row sums w_sum i32 [N] (N from w_scale), which
 * the CPU runs as a VNNI (vpdpbusd) microkernel with no per-call weight work; act: an
 * activation fused after the bias, one of FM_QACT_* (false and true read as none and
 * ReLU). */
FM_API fm_tensor *fm_qlinear_int8_packed(fm_tensor *x, fm_tensor *panels, fm_tensor *w_scale, fm_tensor *w_sum, fm_tensor *bias,
                                         double a_scale, int a_zero, int act);
#define FM_QACT_NONE 0
#define FM_QACT_RELU 1      /* max(y, 0) */
#define FM_QACT_GELU_TANH 2 /* GELU in its tanh form, bitwise what fm_bias_gelu_tanh gives on the same CPU */
#define FM_QACT_GELU 3      /* exact GELU x Phi(x), bitwise what fm_gelu gives on the same CPU */
/* a_scale for fm_qlinear_int8_packed: dynamic with each row of x quantized at its own
 * range (one scale and zero point per row), so a row's output does not depend on the
 * rows beside it (what a server batching many sequences wants). CPU only. */
#define FM_QLINEAR_INT8_PER_ROW (-1.0)
/* y = x W^T + bias with W int4 [N, K] packed (w u8 [N, K/2]), one f16 scale per group
 * of `group` (32, 64 or 128) along K (scale [N, K/group]) and optionally an f16 offset
 * (min, same shape; NULL: symmetric, w = (q - 8) * scale). f32 x and out. */
FM_API fm_tensor *fm_qlinear_int4(fm_tensor *x, fm_tensor *w, fm_tensor *scale, fm_tensor *min, fm_tensor *bias, int group);
/* The embedding lookup of an int4 table (w u8 [V, D/2], scale/min as fm_qlinear_int4):
 * indices (i32/i64) [...] -> f32 [..., D]. */
FM_API fm_tensor *fm_qembedding_int4(fm_tensor *w, fm_tensor *scale, fm_tensor *min, fm_tensor *indices, int group);
/* The embedding lookup of an int8 table held as fm_pack_weight_int8's panels (the layout
 * fm_qlinear_int8_packed reads, so a tied output layer and its table share one int8
 * copy) with its per-row scales [V] f32: indices (i32/i64) [...] -> f32 [..., dim], row r
 * = scale[r] * its codes. dim: the table's width (the panels round it up to 4). */
FM_API fm_tensor *fm_qembedding_int8(fm_tensor *panels, fm_tensor *scale, fm_tensor *indices, int64_t dim);
/* An int8 convolution (groups 1, NCHW): x f32 [N, C, H, W] quantized to u8 with a_scale and
 * a_zero, or with the range of this x when a_scale is 0 (dynamic); the weight [O, C, kh, kw]
 * as fm_quantize_conv_weight_int8 (fathom/quant.h) packs it: panels over K = kh kw C in the
 * order (ky, kx, c) (padded with zeros to a multiple of 64 from 64 on, of 4 below), per-channel
 * scales w_scale [O] and row sums w_sum [O]. Integer sums, then
 * y = a_scale w_scale (sum - a_zero w_sum) + bias (bias may be NULL), max(y, 0) when relu, then
 * min(y, hi) (INFINITY: no cap; ReLU6: relu and 6); pool > 1: then a pool x pool max pool at
 * stride pool, no padding (as fm_conv2d_fused's). p: stride, padding and dilation (groups 1,
 * layout NCHW). f32 out [N, O, Ho, Wo] (pooled: [N, O, Ho / pool, Wo / pool]). CPU. */
FM_API fm_tensor *fm_qconv2d_int8(fm_tensor *x, fm_tensor *panels, fm_tensor *w_scale, fm_tensor *w_sum, fm_tensor *bias,
                                  const fm_conv2d_params *p, int kh, int kw, double a_scale, int a_zero, bool relu, double hi, int pool);

#ifdef __cplusplus
}
#endif
#endif
