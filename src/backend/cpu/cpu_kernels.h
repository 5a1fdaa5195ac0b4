/* CPU kernel groups. Each src/backend/cpu/<group>_cpu.c defines one
 * fm_cpu_kernels_<group>() that stores its kernels into the backend's table;
 * cpu_backend.c calls every group (explicit calls, so a static link keeps them).
 *
 * Kernel contract (see src/backend/kernel.h): outputs are preallocated and
 * contiguous; inputs are contiguous unless the op has FM_OPF_STRIDED; kernels
 * support at least FM_F32 and FM_F64 (gradient checks run in f64) and return
 * FM_ERR_UNSUPPORTED naming the op and dtype otherwise. Use fm_parallel_for for
 * threads and fm_cpu_use_avx2() to pick SIMD paths (*_avx2.c files). */
#ifndef FATHOM_CPU_KERNELS_H
#define FATHOM_CPU_KERNELS_H
#include <stdint.h>

#include "backend/kernel.h"

/* Registers the CPU backend (cpu_backend.c); the generated backend list calls it. */
void fm_backend_cpu_reg(void);

void fm_cpu_kernels_elementwise(fm_backend *b); /* unary, binary, compare, where, copy, clamp */
void fm_cpu_kernels_reduce(fm_backend *b);      /* sum mean amax amin max/min_dim argmax var std logsumexp prod */
void fm_cpu_kernels_matmul(fm_backend *b);
void fm_cpu_kernels_softmax(fm_backend *b);     /* softmax, log_softmax, cross_entropy, mse (+backward) */
void fm_cpu_kernels_norm(fm_backend *b);        /* layer_norm, rms_norm, embedding, dropout (+backward) */
void fm_cpu_kernels_conv(fm_backend *b);        /* conv2d (+backward) */
void fm_cpu_kernels_conv_fused(fm_backend *b);  /* conv2d_fused (conv + ReLU + max pool, inference) */
void fm_cpu_kernels_linear_fused(fm_backend *b); /* linear_fused (packed weights, bias + ReLU epilogue, inference) */
void fm_cpu_kernels_ew_chain(fm_backend *b);     /* ew_chain (elementwise steps in one pass, inference) */
/* conv2d's forward kernel on CPU tensors (conv2d_cpu.c), its outputs then clamped to
 * [lo, hi] (ReLU: 0, INFINITY; none: -INFINITY, INFINITY): conv2d_fused's reference path. */
fm_status fm_cpu_conv2d_forward(const fm_conv2d_params *p, fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *y, double lo, double hi);
void fm_cpu_kernels_pool(fm_backend *b);        /* max_pool2d, avg_pool2d (+backward) */
void fm_cpu_kernels_batch_norm(fm_backend *b);  /* batch_norm (+backward) */
void fm_cpu_kernels_index(fm_backend *b);       /* cat, gather, scatter_add, scatter, scatter_nd, index_select, index_add, one_hot */
void fm_cpu_kernels_topk(fm_backend *b);        /* topk */
void fm_cpu_kernels_attention(fm_backend *b);   /* sdpa (+backward) */
void fm_cpu_kernels_lowp(fm_backend *b);        /* bf16/fp16 storage for f32-only kernels (register last) */
void fm_cpu_kernels_lstm(fm_backend *b);        /* lstm_cell, gru_cell */
void fm_cpu_kernels_fused(fm_backend *b);       /* qkv_split_heads (+backward) */
void fm_cpu_kernels_qconv(fm_backend *b);       /* qconv2d_int8 */
void fm_cpu_kernels_quant(fm_backend *b);       /* qlinear_int8, qlinear_int4, qembedding_int4 */
void fm_cpu_kernels_optim(fm_backend *b);       /* optim_step, sum_sq_blocks, scale_inplace */

/* Non-temporal output stores (the *_avx2 kernels' `stream` flag) pay off only
 * when an f32 output is too big to stay in cache for its consumer anyway:
 * FM_CPU_STREAM_MIN_BYTES and up. fm_cpu_stream_rows: whether rows of n floats
 * starting at out can be streamed (32-byte aligned rows, n a multiple of 8). */
#define FM_CPU_STREAM_MIN_BYTES ((int64_t)8 << 20)
static inline int fm_cpu_stream_rows(const void *out, int64_t n, int64_t numel) {
    return numel * 4 >= FM_CPU_STREAM_MIN_BYTES && n % 8 == 0 && ((uintptr_t)out & 31) == 0;
}

/* Row-major C[M,N] = op(A)[M,K] * op(B)[K,N] + beta * C in f32 or f64
 * (gemm_cpu.c): OpenBLAS per block, blocks split over fathom's pool. */
typedef struct fm_cpu_gemm_args {
    fm_dtype dt;
    bool ta, tb;
    int64_t M, N, K;
    const void *A; int64_t lda;
    const void *B; int64_t ldb;
    double beta;
    void *C; int64_t ldc;
} fm_cpu_gemm_args;
void fm_cpu_gemm(const fm_cpu_gemm_args *g);
/* C = op(A) op(B) + bias, bias [N] (dtype dt) added to every row; beta is not used. */
void fm_cpu_gemm_bias(const fm_cpu_gemm_args *g, const void *bias);
/* bf16 GEMM on the CPU's bf16 hardware (oneDNN, gemm_bf16.c): A and B bf16
 * (g->dt == FM_BF16), C f32 or, with c_bf16, bf16 (the f32 sum rounded to
 * nearest even as it is stored), beta 0, bias [N] f32 or NULL. False when that
 * path is not available or not worth it for the shape (the caller then widens to f32). */
bool fm_cpu_gemm_bf16(const fm_cpu_gemm_args *g, const float *bias, bool c_bf16);
/* The same product on AMX tiles, fathom's own kernel (gemm_amx.c), at the amx kernel
 * level only; false where not taken (no AMX, beta != 0, too small, out of memory). */
bool fm_cpu_gemm_bf16_amx(const fm_cpu_gemm_args *g, const float *bias, bool c_bf16);
typedef struct fm_bf16_gemm_info {
    bool loaded;
    char library[256], version[32];
    char kernel[64]; /* oneDNN's implementation for a 256^3 product, e.g. "brg:avx512_core_bf16" */
    char note[256];  /* why bf16 is widened instead; "" when loaded */
    double dp_rate;  /* fm_bf16_dot_rate() where it was measured (AVX512-BF16 without AMX), else 0 */
} fm_bf16_gemm_info;
/* The bf16 dot product's (vdpbf16ps) multiply-adds per second over the f32
 * FMA's, measured on this core (0 without AVX512-BF16). Below
 * FM_BF16_DOT_MIN_RATE a CPU without AMX widens bf16 GEMMs to f32 instead of
 * running them through oneDNN, unless FATHOM_DNNL=on. */
double fm_bf16_dot_rate(void);
#define FM_BF16_DOT_MIN_RATE 1.2
/* Whether this CPU's AVX512-BF16 dot product (vdpbf16ps) outruns its f32 FMAs:
 * fm_bf16_dot_rate() >= FM_BF16_DOT_MIN_RATE (measured once). Independent of oneDNN: for
 * fathom's own bf16 kernels (attention_avx512bf16.c), which use that instruction. */
bool fm_cpu_bf16_dot_fast(void);
void fm_bf16_gemm_info_get(fm_bf16_gemm_info *out);
/* f32 GEMM through oneDNN (gemm_bf16.c) where it measured faster than OpenBLAS:
 * C f32, beta 0, bias [N] f32 or NULL. False when not chosen or not worth it for
 * the shape (the caller then runs OpenBLAS). */
bool fm_cpu_gemm_f32_dnnl(const fm_cpu_gemm_args *g, const float *bias);
/* f32 GEMM on AVX-512, fathom's own kernel (gemm_f32_avx512.c): any transposes,
 * beta, bias [N] f32 or NULL. False only when out of memory (nothing written then). */
bool fm_cpu_gemm_f32_avx512(const fm_cpu_gemm_args *g, const float *bias);
/* bf16 A [M, K] (M <= 4) times a bf16 [N, K] weight (tb), f32 C (beta 0, bias [N]
 * f32 or NULL): a mixed linear's decode step, streamed like the f32 GEMV (gemm_cpu.c).
 * False when the shape is not that (or out of memory): the caller's path runs it. */
bool fm_cpu_gemv_bf16(const fm_cpu_gemm_args *g, const float *bias);
/* FATHOM_GEMM_F32, read once for both places that act on it (gemm_bf16.c's oneDNN
 * choice and gemm_cpu.c's own-kernel choice); a value naming no provider is said
 * once on stderr and reads as unset. */
typedef enum { FM_F32_PROVIDER_DEFAULT, FM_F32_PROVIDER_OPENBLAS, FM_F32_PROVIDER_ONEDNN, FM_F32_PROVIDER_FATHOM } fm_f32_provider;
fm_f32_provider fm_cpu_gemm_f32_asked(void);
/* Whether fm_cpu_gemm hands g to that kernel (FATHOM_GEMM_F32, the CPU, the kernel
 * level, the shape), and which products it takes, for `fathom info` (NULL: none). */
bool fm_cpu_gemm_f32_avx512_takes(const fm_cpu_gemm_args *g);
const char *fm_cpu_gemm_f32_avx512_note(void);
typedef struct fm_f32_gemm_info {
    bool onednn;     /* f32 products of enough work go to oneDNN */
    char kernel[64]; /* oneDNN's implementation for a 256^3 f32 product */
    char note[256];  /* why f32 stays on OpenBLAS; "" when onednn */
} fm_f32_gemm_info;
void fm_f32_gemm_info_get(fm_f32_gemm_info *out);
/* Picks who drives GEMM threads (once; the backend calls it at start-up). */
void fm_cpu_gemm_init(void);

/* An error for a dtype the kernel lacks. */
fm_status fm_cpu_unsupported_dtype(const fm_op_call *c, fm_dtype dt);
#endif
