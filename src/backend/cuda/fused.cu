/* CUDA kernels of the fused transformer helpers (src/ops/fused.c): qkv_split_heads
 * and its backward, with the CPU kernels' semantics (fused_cpu.c). Pure data
 * movement, so one element-size kernel serves every dtype; one thread per
 * element of the packed [B, T, (H + 2 KV) D] tensor, which is also the
 * coalesced side. A missing gradient (NULL dq/dk/dv) is zero. */
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

typedef struct qkv_geom { int64_t T, H, KV, D, W, n; } qkv_geom;

/* Offset in q (seg 0), k (1) or v (2) of element e of the packed tensor. */
__device__ __forceinline__ int64_t qkv_dst(const qkv_geom &g, int64_t e, int *seg) {
    int64_t r = e / g.W, col = e % g.W, h = col / g.D, d = col % g.D, b = r / g.T, t = r % g.T;
    if (h < g.H) { *seg = 0; return ((b * g.H + h) * g.T + t) * g.D + d; }
    h -= g.H;
    *seg = h < g.KV ? 1 : 2;
    if (h >= g.KV) h -= g.KV;
    return ((b * g.KV + h) * g.T + t) * g.D + d;
}

template <typename R>
__global__ void qkv_split_k(qkv_geom g, const R *x, R *q, R *k, R *v) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.n; e += (int64_t)gridDim.x * blockDim.x) {
        int seg;
        int64_t o = qkv_dst(g, e, &seg);
        (seg == 0 ? q : seg == 1 ? k : v)[o] = x[e];
    }
}

template <typename R>
__global__ void qkv_merge_k(qkv_geom g, const R *dq, const R *dk, const R *dv, R *dx) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.n; e += (int64_t)gridDim.x * blockDim.x) {
        int seg;
        int64_t o = qkv_dst(g, e, &seg);
        const R *src = seg == 0 ? dq : seg == 1 ? dk : dv;
        dx[e] = src ? src[o] : (R)0; /* all-zero bits are 0.0 in every float format */
    }
}

template <typename R>
static void launch(const fm_op_call *c, const qkv_geom &g, bool bwd) {
    unsigned bl = fm_cuda_blocks(g.n, 256);
    cudaStream_t s = fm_cuda_stream();
    if (!bwd) {
        qkv_split_k<R><<<bl, 256, 0, s>>>(g, (const R *)fm_tensor_data(c->in[0]), (R *)fm_tensor_data(c->out[0]),
                                          (R *)fm_tensor_data(c->out[1]), (R *)fm_tensor_data(c->out[2]));
    } else {
        const R *p[3];
        for (int i = 0; i < 3; i++) p[i] = c->in[i] ? (const R *)fm_tensor_data(c->in[i]) : NULL;
        qkv_merge_k<R><<<bl, 256, 0, s>>>(g, p[0], p[1], p[2], (R *)fm_tensor_data(c->out[0]));
    }
}

static fm_status qkv(const fm_op_call *c, bool bwd) {
    const fm_qkv_split_attrs *a = (const fm_qkv_split_attrs *)c->attrs;
    const fm_tensor *x = bwd ? c->out[0] : c->in[0];
    qkv_geom g = {x->shape[1], a->n_head, a->n_kv_head, a->head_dim, (a->n_head + 2 * a->n_kv_head) * a->head_dim,
                  fm_tensor_numel(x)};
    if (!g.n) return FM_OK;
    switch (fm_dtype_size(x->dtype)) {
    case 1: launch<uint8_t>(c, g, bwd); break;
    case 2: launch<uint16_t>(c, g, bwd); break;
    case 4: launch<uint32_t>(c, g, bwd); break;
    case 8: launch<uint64_t>(c, g, bwd); break;
    default: return fm_cuda_unsupported_dtype(c, x->dtype);
    }
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

static fm_status k_qkv_split(const fm_op_call *c) { return qkv(c, false); }
static fm_status k_qkv_split_bwd(const fm_op_call *c) { return qkv(c, true); }

extern "C" void fm_cuda_kernels_fused(fm_backend *b) {
    b->kernels[FM_OP_QKV_SPLIT_HEADS] = k_qkv_split;
    b->kernels[FM_OP_QKV_SPLIT_HEADS_BACKWARD] = k_qkv_split_bwd;
}
