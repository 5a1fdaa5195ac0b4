/* CUDA kernels of the quantized ops (ops.def QLINEAR_INT8, QLINEAR_INT4,
 * QEMBEDDING_INT4), with the CPU kernels' semantics (quant_cpu.c).
 *
 * qlinear_int8: the activations' range (dynamic: one block reduces x; static:
 * the attrs), u8 codes stored with the offset trick as s8 (q - 128), because
 * cuBLASLt's integer GEMM takes s8 x s8 -> s32 (CUBLAS_COMPUTE_32I, the TN
 * layout it requires is exactly row-major x times W^T); then
 *   sum_k q w = C + 128 sum_k w  and  y = a_scale w_scale[n] (C + (128 - zero) w_sum[n]) + bias[n]
 * in an epilogue kernel. Shapes cuBLASLt refuses (K or N not a multiple of 4)
 * go to a plain kernel with the same integers (one thread per output), as do
 * weights in the CPU's panel layout (vnni16x4, indexed through
 * fm_q8_panel_index, their row sums stored): a quantized graph made for the
 * CPU still runs here, without cuBLASLt's speed. A fused ReLU ends the epilogue.
 *
 * qlinear_int4: one block per (output feature, 4 rows of x); the threads walk
 * K, dequantize each weight once (q * d + m, d and m the group's f16 scale and
 * offset, m = -8 d for the symmetric form) and multiply it with up to 4 rows;
 * a block reduction gives the sums. qembedding_int4: one thread per output
 * element; a bad index is reported by the deferred check (deferred.cu), as
 * embedding's are, with no host wait here. Compiled (tools/compile-cuda.sh), unverified on a GPU. */
#include <cublasLt.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_device.h"
#include "backend/scalar_math.h"
#include "fathom/ops.h" /* FM_QACT_* */
#include "backend/cuda/cuda_internal.h"

/* ---- int8 ---- */

/* one block: min and max of x (with 0) -> mm[0], mm[1] */
__global__ void q8_range_k(const float *x, int64_t n, float *mm) {
    __shared__ float lo[256], hi[256];
    float a = 0.f, b = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) { a = fminf(a, x[i]); b = fmaxf(b, x[i]); }
    lo[threadIdx.x] = a;
    hi[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) { lo[threadIdx.x] = fminf(lo[threadIdx.x], lo[threadIdx.x + s]); hi[threadIdx.x] = fmaxf(hi[threadIdx.x], hi[threadIdx.x + s]); }
        __syncthreads();
    }
    if (threadIdx.x == 0) { mm[0] = lo[0]; mm[1] = hi[0]; }
}

/* the CPU's fm_q8_params: scale and zero point of a range */
__device__ __forceinline__ void q8_params(const float *mm, float st_scale, int st_zero, float *scale, int *zero) {
    if (st_scale > 0) { *scale = st_scale; *zero = st_zero; return; }
    float s = (mm[1] - mm[0]) / 255.0f;
    if (!(s > 0) || !isfinite(s)) { *scale = 1.f; *zero = 0; return; }
    float z = nearbyintf(-mm[0] / s);
    *scale = s;
    *zero = (int)(z < 0 ? 0 : z > 255 ? 255 : z);
}

__global__ void q8_quantize_k(const float *x, int64_t n, const float *mm, float st_scale, int st_zero, int8_t *q) {
    float s;
    int z;
    q8_params(mm, st_scale, st_zero, &s, &z);
    float inv = 1.0f / s;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = nearbyintf(x[i] * inv) + (float)z;
        v = v < 0 ? 0 : v > 255 ? 255 : v;
        q[i] = (int8_t)((int)v - 128);
    }
}

__global__ void q8_row_sums_k(const int8_t *w, int64_t N, int64_t K, int32_t *s) {
    for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x) {
        int32_t acc = 0;
        for (int64_t k = 0; k < K; k++) acc += w[n * K + k];
        s[n] = acc;
    }
}

/* C[m, n] = sum_k q[m, k] w[n, k] (q already offset by -128), for shapes cuBLASLt
 * refuses and for weights in panels (panels: w read through fm_q8_panel_index) */
__global__ void q8_gemm_plain_k(const int8_t *q, const int8_t *w, int64_t M, int64_t N, int64_t K, bool panels, int32_t *C) {
    const int64_t Kq = (K + 3) / 4;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < M * N; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = e / N, n = e % N;
        int32_t acc = 0;
        for (int64_t k = 0; k < K; k++) acc += (int32_t)q[m * K + k] * (int32_t)w[panels ? fm_q8_panel_index(Kq, n, k) : n * K + k];
        C[e] = acc;
    }
}

__global__ void q8_epilogue_k(const int32_t *C, const int32_t *wsum, const float *ws, const float *bias, const float *mm, float st_scale,
                              int st_zero, int64_t M, int64_t N, int act, float *y) {
    float s;
    int z;
    q8_params(mm, st_scale, st_zero, &s, &z);
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < M * N; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = e % N;
        long long v = (long long)C[e] + (long long)(128 - z) * wsum[n];
        float r = s * ws[n] * (float)v;
        if (bias) r = r + bias[n];
        y[e] = act == FM_QACT_RELU ? (r > 0.0f ? r : 0.0f) : act == FM_QACT_GELU_TANH ? fm_gelu_tanh_f(r) : act == FM_QACT_GELU ? fm_gelu_f(r) : r;
    }
}

/* C^T (column-major [N, M]) = W (as [K, N] column-major, transposed) x q ([K, M] column-major): row-major C = q W^T */
static cublasStatus_t lt_int8(const int8_t *q, const int8_t *w, int64_t M, int64_t N, int64_t K, int32_t *C) {
    cublasLtHandle_t h = (cublasLtHandle_t)fm_cuda_lt_handle();
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    size_t ws_bytes = 0;
    void *ws = fm_cuda_lt_workspace(&ws_bytes);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int32_t one = 1, zero = 0;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32I, CUDA_R_32I);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, (uint64_t)K, (uint64_t)N, K);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, (uint64_t)K, (uint64_t)M, K);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lc, CUDA_R_32I, (uint64_t)N, (uint64_t)M, N);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(h, op, &one, w, la, q, lb, &zero, C, lc, C, lc, NULL, ws, ws_bytes, fm_cuda_stream());
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}

static fm_status k_qlinear8(const fm_op_call *c) {
    const fm_qlinear8_attrs *at = (const fm_qlinear8_attrs *)c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1];
    const bool panels = w->ndim == 4; /* the CPU's VNNI layout: the plain kernel reads it, the row sums are stored */
    const int64_t N = c->in[2]->shape[0], K = x->shape[x->ndim - 1], M = K ? fm_tensor_numel(x) / K : 0;
    if (M == 0 || N == 0) return FM_OK;
    cudaStream_t s = fm_cuda_stream();
    float *mm = (float *)fm_cuda_scratch_alloc(2 * sizeof(float));
    int8_t *q = (int8_t *)fm_cuda_scratch_alloc((size_t)(M * K));
    int32_t *wsum = (int32_t *)fm_cuda_scratch_alloc(sizeof(int32_t) * (size_t)N), *C = (int32_t *)fm_cuda_scratch_alloc(sizeof(int32_t) * (size_t)(M * N));
    fm_status st = mm && q && wsum && C ? FM_OK : fm_set_error(FM_ERR_OOM, "qlinear_int8: out of cuda memory for the integer product");
    const float *xp = (const float *)fm_tensor_data(x);
    float sts = (float)at->a_scale;
    if (st == FM_OK) {
        if (!(sts > 0)) q8_range_k<<<1, 256, 0, s>>>(xp, M * K, mm);
        q8_quantize_k<<<fm_cuda_blocks(M * K, 256), 256, 0, s>>>(xp, M * K, mm, sts, at->a_zero, q);
        if (!panels) q8_row_sums_k<<<fm_cuda_blocks(N, 128), 128, 0, s>>>((const int8_t *)fm_tensor_data(w), N, K, wsum);
        bool lt = !panels && K % 4 == 0 && N % 4 == 0 && lt_int8(q, (const int8_t *)fm_tensor_data(w), M, N, K, C) == CUBLAS_STATUS_SUCCESS;
        if (!lt) q8_gemm_plain_k<<<fm_cuda_blocks(M * N, 128), 128, 0, s>>>(q, (const int8_t *)fm_tensor_data(w), M, N, K, panels, C);
        q8_epilogue_k<<<fm_cuda_blocks(M * N, 256), 256, 0, s>>>(C, panels ? (const int32_t *)fm_tensor_data(c->in[4]) : wsum,
                                                                 (const float *)fm_tensor_data(c->in[2]),
                                                                 c->in[3] ? (const float *)fm_tensor_data(c->in[3]) : NULL, mm, sts, at->a_zero, M,
                                                                 N, at->act, (float *)fm_tensor_data(c->out[0]));
        st = fm_cuda_check_launch("qlinear_int8");
    }
    fm_cuda_scratch_free(mm);
    fm_cuda_scratch_free(q);
    fm_cuda_scratch_free(wsum);
    fm_cuda_scratch_free(C);
    return st;
}

/* ---- int4 ---- */

__device__ __forceinline__ float q4_weight(const uint8_t *row, const __half *sc, const __half *mi, int64_t k, int64_t G) {
    int64_t c = k >> 5, j = k & 31;
    uint8_t b = row[c * 16 + (j & 15)];
    float q = (float)(j < 16 ? (b & 15) : (b >> 4)), d = __half2float(sc[k / G]);
    return q * d + (mi ? __half2float(mi[k / G]) : -8.0f * d);
}

__global__ void q4_linear_k(const float *x, const uint8_t *w, const __half *sc, const __half *mi, const float *bias, int64_t M, int64_t N,
                            int64_t K, int64_t G, float *y) {
    __shared__ float part[4][128];
    const int64_t n = blockIdx.x, m0 = (int64_t)blockIdx.y * 4, ng = K / G;
    const int rows = (int)(M - m0 < 4 ? M - m0 : 4);
    const uint8_t *row = w + n * (K / 2);
    const __half *s = sc + n * ng, *mn = mi ? mi + n * ng : NULL;
    float acc[4] = {0, 0, 0, 0};
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
        float wv = q4_weight(row, s, mn, k, G);
        for (int r = 0; r < rows; r++) acc[r] += wv * x[(m0 + r) * K + k];
    }
    for (int r = 0; r < 4; r++) part[r][threadIdx.x] = acc[r];
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if ((int)threadIdx.x < st)
            for (int r = 0; r < 4; r++) part[r][threadIdx.x] += part[r][threadIdx.x + st];
        __syncthreads();
    }
    if ((int)threadIdx.x < rows) y[(m0 + threadIdx.x) * N + n] = part[threadIdx.x][0] + (bias ? bias[n] : 0.f);
}

static fm_status k_qlinear4(const fm_op_call *c) {
    const fm_q4_attrs *at = (const fm_q4_attrs *)c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1];
    const int64_t N = w->shape[0], K = 2 * w->shape[1], M = K ? fm_tensor_numel(x) / K : 0;
    if (M == 0 || N == 0) return FM_OK;
    if ((M + 3) / 4 > 65535) return fm_set_error(FM_ERR_UNSUPPORTED, "qlinear_int4: %lld rows is more than this CUDA kernel's grid holds", (long long)M);
    dim3 grid((unsigned)N, (unsigned)((M + 3) / 4));
    q4_linear_k<<<grid, 128, 0, fm_cuda_stream()>>>((const float *)fm_tensor_data(x), (const uint8_t *)fm_tensor_data(w),
                                                    (const __half *)fm_tensor_data(c->in[2]),
                                                    c->in[3] ? (const __half *)fm_tensor_data(c->in[3]) : NULL,
                                                    c->in[4] ? (const float *)fm_tensor_data(c->in[4]) : NULL, M, N, K, at->group,
                                                    (float *)fm_tensor_data(c->out[0]));
    return fm_cuda_check_launch("qlinear_int4");
}

template <typename I>
__global__ void q4_embedding_k(const uint8_t *w, const __half *sc, const __half *mi, const I *idx, int64_t n, int64_t V, int64_t D, int64_t G,
                               float *y, unsigned long long *bad) {
    const int64_t ng = D / G;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * D; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / D, d = e % D, r = (int64_t)idx[i];
        if (r < 0 || r >= V) { atomicMin(bad, (unsigned long long)(i + 1)); y[e] = 0.f; continue; } /* reported by the deferred check */
        y[e] = q4_weight(w + r * (D / 2), sc + r * ng, mi ? mi + r * ng : NULL, d, G);
    }
}

static fm_status k_qembedding4(const fm_op_call *c) {
    const fm_q4_attrs *at = (const fm_q4_attrs *)c->attrs;
    const fm_tensor *w = c->in[0], *idx = c->in[3];
    const int64_t V = w->shape[0], D = 2 * w->shape[1], n = fm_tensor_numel(idx);
    if (n == 0) return FM_OK;
    /* a bad index lowers a deferred-check word (deferred.cu), reported at the next host read as embedding's are */
    unsigned long long *bad = fm_cuda_defer_index_check("qembedding_int4", "index", idx, V);
    if (!bad) return fm_last_status();
    cudaStream_t s = fm_cuda_stream();
    const __half *sc = (const __half *)fm_tensor_data(c->in[1]), *mi = c->in[2] ? (const __half *)fm_tensor_data(c->in[2]) : NULL;
    unsigned bl = fm_cuda_blocks(n * D, 256);
    if (idx->dtype == FM_I64)
        q4_embedding_k<int64_t><<<bl, 256, 0, s>>>((const uint8_t *)fm_tensor_data(w), sc, mi, (const int64_t *)fm_tensor_data(idx), n, V, D, at->group,
                                                   (float *)fm_tensor_data(c->out[0]), bad);
    else
        q4_embedding_k<int32_t><<<bl, 256, 0, s>>>((const uint8_t *)fm_tensor_data(w), sc, mi, (const int32_t *)fm_tensor_data(idx), n, V, D, at->group,
                                                   (float *)fm_tensor_data(c->out[0]), bad);
    return fm_cuda_check_launch("qembedding_int4");
}

template <typename I>
__global__ void q8_embedding_k(const int8_t *P, const float *sc, const I *idx, int64_t n, int64_t V, int64_t D, float *y,
                               unsigned long long *bad) {
    const int64_t Kq = (D + 3) / 4;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * D; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / D, d = e % D, r = (int64_t)idx[i];
        if (r < 0 || r >= V) { atomicMin(bad, (unsigned long long)(i + 1)); y[e] = 0.f; continue; } /* reported by the deferred check */
        y[e] = sc[r] * (float)P[fm_q8_panel_index(Kq, r, d)];
    }
}

/* the CPU kernel's lookup (quant_cpu.c) on the panels; compiled, unverified on a GPU */
static fm_status k_qembedding8(const fm_op_call *c) {
    const fm_q8emb_attrs *at = (const fm_q8emb_attrs *)c->attrs;
    const fm_tensor *idx = c->in[2];
    const int64_t V = c->in[1]->shape[0], D = at->dim, n = fm_tensor_numel(idx);
    if (n == 0) return FM_OK;
    unsigned long long *bad = fm_cuda_defer_index_check("qembedding_int8", "index", idx, V);
    if (!bad) return fm_last_status();
    cudaStream_t s = fm_cuda_stream();
    const int8_t *P = (const int8_t *)fm_tensor_data(c->in[0]);
    const float *sc = (const float *)fm_tensor_data(c->in[1]);
    unsigned bl = fm_cuda_blocks(n * D, 256);
    if (idx->dtype == FM_I64)
        q8_embedding_k<int64_t><<<bl, 256, 0, s>>>(P, sc, (const int64_t *)fm_tensor_data(idx), n, V, D, (float *)fm_tensor_data(c->out[0]), bad);
    else
        q8_embedding_k<int32_t><<<bl, 256, 0, s>>>(P, sc, (const int32_t *)fm_tensor_data(idx), n, V, D, (float *)fm_tensor_data(c->out[0]), bad);
    return fm_cuda_check_launch("qembedding_int8");
}

extern "C" void fm_cuda_kernels_quant(fm_backend *b) {
    b->kernels[FM_OP_QLINEAR_INT8] = k_qlinear8;
    b->kernels[FM_OP_QLINEAR_INT4] = k_qlinear4;
    b->kernels[FM_OP_QEMBEDDING_INT4] = k_qembedding4;
    b->kernels[FM_OP_QEMBEDDING_INT8] = k_qembedding8;
}
