/* CUDA kernels for indexing ops. index_select and one_hot exist; cat, gather,
 * scatter_add and index_add are not written yet, so their table entries stay
 * NULL and the dispatcher reports "not implemented on cuda" (docs/CUDA.md).
 * Indices are validated on the device; a bad one raises a flag that is read
 * back and reported with the CPU's wording. */
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

__device__ __forceinline__ int64_t idx_at(const void *p, int dt, int64_t i) {
    return dt == FM_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

__global__ void find_bad(const void *idx, int idt, int64_t n, int64_t S, unsigned long long *flag) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = idx_at(idx, idt, i);
        if (v < 0 || v >= S) atomicMin(flag, (unsigned long long)i + 1);
    }
}

/* y[o, l, i] = t[o, idx[l], i], moved as raw elements of size es. */
__global__ void index_select_k(const char *src, char *dst, const void *idx, int idt, int64_t outer, int64_t S, int64_t L,
                               int64_t inner, int es) {
    int64_t n = outer * L * inner;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e % inner, l = (e / inner) % L, o = e / (inner * L);
        int64_t s = ((o * S + idx_at(idx, idt, l)) * inner + i) * es;
        for (int b = 0; b < es; b++) dst[e * es + b] = src[s + b];
    }
}

__global__ void one_hot_k(const void *idx, int idt, int64_t n, int64_t K, float *y) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * K; e += (int64_t)gridDim.x * blockDim.x)
        y[e] = idx_at(idx, idt, e / K) == e % K ? 1.0f : 0.0f;
}

/* Position of the first bad index, or -1 (synchronizes the stream). */
static fm_status first_bad(const fm_op_call *c, const fm_tensor *idx, int64_t S, int64_t *pos, int64_t *val) {
    *pos = -1;
    if (idx->dtype != FM_I64 && idx->dtype != FM_I32)
        return fm_set_error(FM_ERR_INVALID, "%s: index dtype %s must be i64 or i32", fm_cuda_op_name(c), fm_dtype_name(idx->dtype));
    int64_t n = fm_tensor_numel(idx);
    if (!n) return FM_OK;
    unsigned long long *flag = (unsigned long long *)fm_cuda_scratch_alloc(8), h = 0;
    if (!flag) return fm_last_status();
    cudaStream_t s = fm_cuda_stream();
    cudaMemsetAsync(flag, 0xff, 8, s);
    find_bad<<<fm_cuda_blocks(n, 256), 256, 0, s>>>(fm_tensor_data(idx), idx->dtype, n, S, flag);
    fm_status st = fm_cuda_check(cudaMemcpyAsync(&h, flag, 8, cudaMemcpyDeviceToHost, s), fm_cuda_op_name(c));
    if (!st) st = fm_cuda_check(cudaStreamSynchronize(s), fm_cuda_op_name(c));
    fm_cuda_scratch_free(flag);
    if (st || h == ~0ULL) return st;
    *pos = (int64_t)h - 1;
    size_t es = fm_dtype_size(idx->dtype);
    int64_t v = 0;
    cudaMemcpy(&v, (const char *)fm_tensor_data(idx) + *pos * (int64_t)es, es, cudaMemcpyDeviceToHost);
    *val = es == 4 ? (int64_t)(int32_t)v : v;
    return FM_OK;
}

static fm_status k_index_select(const fm_op_call *c) {
    const fm_axis_attrs *a = (const fm_axis_attrs *)c->attrs;
    const fm_tensor *t = c->in[0], *idx = c->in[1];
    int64_t outer = 1, inner = 1, S = t->shape[a->axis], L = fm_tensor_numel(idx), pos, val;
    for (int d = 0; d < a->axis; d++) outer *= t->shape[d];
    for (int d = a->axis + 1; d < t->ndim; d++) inner *= t->shape[d];
    fm_status st = first_bad(c, idx, S, &pos, &val);
    if (st) return st;
    if (pos >= 0)
        return fm_set_error(FM_ERR_INVALID, "index_select: index %lld is out of range for axis %d of size %lld",
                            (long long)val, a->axis, (long long)S);
    int64_t n = outer * L * inner;
    if (n) index_select_k<<<fm_cuda_blocks(n, 256), 256, 0, fm_cuda_stream()>>>(
        (const char *)fm_tensor_data(t), (char *)fm_tensor_data(c->out[0]), fm_tensor_data(idx), idx->dtype, outer, S, L,
        inner, (int)fm_dtype_size(t->dtype));
    return fm_cuda_check_launch("index_select");
}

static fm_status k_one_hot(const fm_op_call *c) {
    const fm_one_hot_attrs *a = (const fm_one_hot_attrs *)c->attrs;
    const fm_tensor *idx = c->in[0];
    int64_t n = fm_tensor_numel(idx), K = a->num_classes, pos, val;
    if (c->out[0]->dtype != FM_F32) return fm_cuda_unsupported_dtype(c, c->out[0]->dtype);
    fm_status st = first_bad(c, idx, K, &pos, &val);
    if (st) return st;
    if (pos >= 0)
        return fm_set_error(FM_ERR_INVALID, "one_hot: index %lld is out of range for num_classes %lld (valid: 0..%lld)",
                            (long long)val, (long long)K, (long long)(K - 1));
    if (n * K) one_hot_k<<<fm_cuda_blocks(n * K, 256), 256, 0, fm_cuda_stream()>>>(fm_tensor_data(idx), idx->dtype, n, K, (float *)fm_tensor_data(c->out[0]));
    return fm_cuda_check_launch("one_hot");
}

extern "C" void fm_cuda_kernels_index(fm_backend *b) {
    b->kernels[FM_OP_INDEX_SELECT] = k_index_select;
    b->kernels[FM_OP_ONE_HOT] = k_one_hot;
}
