/* Shared by the CUDA backend's .cu files: the per-device context (stream,
 * cuBLASLt handle, workspace), error helpers and the kernel groups, each of
 * which fills its part of the backend's kernel table, as the CPU groups do.
 * Only .cu files include this header (it needs the CUDA runtime). */
#ifndef FATHOM_CUDA_INTERNAL_H
#define FATHOM_CUDA_INTERNAL_H
#include <cuda_runtime.h>
#include <stdint.h>

/* backend/kernel.h and core/backend.h have no C++ guard of their own: their functions are C. */
extern "C" {
#include "backend/kernel.h"
}

/* Kernel groups (one per .cu file). */
extern "C" void fm_cuda_kernels_elementwise(fm_backend *b); /* unary, binary, compare, where, copy */
extern "C" void fm_cuda_kernels_reduce(fm_backend *b);
extern "C" void fm_cuda_kernels_matmul(fm_backend *b);
extern "C" void fm_cuda_kernels_softmax(fm_backend *b);     /* softmax, log_softmax, cross_entropy, mse */
extern "C" void fm_cuda_kernels_norm(fm_backend *b);        /* layer_norm, rms_norm, embedding, dropout */
extern "C" void fm_cuda_kernels_attention(fm_backend *b);
extern "C" void fm_cuda_kernels_index(fm_backend *b);       /* cat, gather, scatter_add, index_select, index_add, one_hot */
extern "C" void fm_cuda_kernels_conv(fm_backend *b);
extern "C" void fm_cuda_kernels_optim(fm_backend *b);       /* optim_step, sum_sq_blocks, scale_inplace */
extern "C" void fm_cuda_kernels_quant(fm_backend *b);       /* qlinear_int8 (cuBLASLt s8), qlinear_int4, qembedding_int4 */
extern "C" void fm_cuda_kernels_fused(fm_backend *b);       /* qkv_split_heads (+ backward) */        /* conv2d, max/avg pool2d, batch_norm (+ backwards) */

/* Tensor-core attention (attention_mma.cu): whether it takes this dtype, head
 * dimension, key count, device and these pointers (16-byte aligned), and its launches
 * (q, k, v, o, dout, dq, dk, dv contiguous [B, heads, T, D]; lse and delta [B, H, Tq]). */
extern "C" bool fm_cuda_sdpa_mma_fits(int dt, int64_t D, int64_t Tk, const void *const *ptrs, int n);
extern "C" fm_status fm_cuda_sdpa_mma_fwd(int dt, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, int causal,
                               double scale, const void *q, const void *k, const void *v, void *o, float *lse);
extern "C" fm_status fm_cuda_sdpa_mma_bwd(int dt, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, int causal,
                               double scale, const void *dout, const void *q, const void *k, const void *v,
                               const float *lse, const float *delta, void *dq, void *dk, void *dv);

/* The stream every kernel of the current device is queued on. */
cudaStream_t fm_cuda_stream(void);
/* FM_ERR_INTERNAL (naming op) when an fm_cuda_stream call since the last check could
 * not give the device's stream (it returned the default stream); FM_OK otherwise. */
fm_status fm_cuda_stream_check(const char *op);
int fm_cuda_current_device(void);
/* cuBLASLt handle and a workspace for the current device (created on first use). */
void *fm_cuda_lt_handle(void);
void *fm_cuda_lt_workspace(size_t *bytes);
/* Scratch memory from the device's caching allocator (stream-ordered reuse). */
void *fm_cuda_scratch_alloc(size_t n);
void fm_cuda_scratch_free(void *p);

/* Row-major y = a @ b (+ bias, GELU) through cuBLASLt: a [.., M, K], b [.., K, N], y [.., M, N]
 * contiguous; a/b rows or columns must be unit-stride. epi: 0 none, 1 bias [N], 2 gelu(bias),
 * 3 gelu (tanh form, cuBLASLt's). */
extern "C" fm_status fm_cuda_gemm_rowmajor(const fm_tensor *a, const fm_tensor *b, fm_tensor *y, const void *bias,
                                           int epi, const char *opname);

/* Row-major C[M,N] (ld ldc) = op(A)[M,K] op(B)[K,N] (+ C when accumulate), `batch` times
 * with element strides sa/sb/sc. ta: A is stored [K,M] (ld lda); tb: B is stored [N,K].
 * Types: all of dt (f32, f64, f16, bf16; f32 accumulation for the halves). */
extern "C" fm_status fm_cuda_gemm_raw(int dt, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                                      int64_t sa, const void *B, int64_t ldb, int64_t sb, void *C, int64_t ldc, int64_t sc,
                                      int64_t batch, int accumulate, const char *opname);

/* Deferred index checks (deferred.cu): a device word for op's kernel to atomicMin to
 * 1 + the first position of idx outside [0, bound) (what: "target", "index"); NULL with
 * the error set on failure. fm_cuda_deferred_check reads device dev's words (one copy,
 * one wait on s) and returns the first bad one as the error; the device-to-host copy
 * and synchronize call it, so a bad index surfaces at the step's next host read. */
unsigned long long *fm_cuda_defer_index_check(const char *op, const char *what, const fm_tensor *idx, int64_t bound);
extern "C" fm_status fm_cuda_deferred_check(int dev, cudaStream_t s);

/* Turns a CUDA error into a fathom error naming the op; FM_OK otherwise. */
fm_status fm_cuda_check(cudaError_t e, const char *op);
/* Checks the launch that just happened (cudaGetLastError). */
fm_status fm_cuda_check_launch(const char *op);
fm_status fm_cuda_unsupported_dtype(const fm_op_call *c, fm_dtype dt);
const char *fm_cuda_op_name(const fm_op_call *c);

/* Geometry of up to 4 operands over an output's shape (element strides, 0 where
 * broadcast), passed to kernels by value. */
#define FM_CUDA_MAX_OPS 4
typedef struct fm_cuda_geom {
    int ndim;
    int64_t shape[FM_MAX_DIMS];
    int64_t st[FM_CUDA_MAX_OPS][FM_MAX_DIMS];
} fm_cuda_geom;

/* Rows per chunk of a [chunks x column-blocks] partial-sum grid (chunks on gridDim.y,
 * at most 65535): `base` rows, or more when M rows would need more chunks than that,
 * so the grid stays valid past 65535 * base rows (4.19M for base 64). Below that the
 * chunks, hence the partial sums and their order, are unchanged. */
static inline int64_t fm_cuda_chunk_rows(int64_t M, int64_t base) {
    int64_t need = (M + 65534) / 65535;
    return need > base ? need : base;
}

static inline unsigned fm_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535LL * 32) b = 65535LL * 32; /* grid-stride loops cover the rest */
    return (unsigned)(b > 0 ? b : 1);
}
#endif
