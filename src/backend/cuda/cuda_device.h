/* Device-side helpers for the .cu kernels: loads and stores of any fathom dtype
 * in a compute type (float for f32/f16/bf16, double for f64 and integers, as the
 * CPU backend does), warp/block reductions, and offset arithmetic for strided,
 * broadcast operands. Rounding on store is to nearest even, like the CPU's. */
#ifndef FATHOM_CUDA_DEVICE_H
#define FATHOM_CUDA_DEVICE_H
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

template <typename T>
__device__ __forceinline__ T fm_ld(const void *p, int dt, int64_t i) {
    switch (dt) {
    case FM_F32: return (T)((const float *)p)[i];
    case FM_F64: return (T)((const double *)p)[i];
    case FM_F16: return (T)__half2float(((const __half *)p)[i]);
    case FM_BF16: return (T)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case FM_I8: return (T)((const int8_t *)p)[i];
    case FM_U8: return (T)((const uint8_t *)p)[i];
    case FM_I32: return (T)((const int32_t *)p)[i];
    case FM_I64: return (T)((const int64_t *)p)[i];
    case FM_BOOL: return (T)(((const uint8_t *)p)[i] != 0);
    default: return (T)0;
    }
}

/* Float to integer the way the CPU's fm_store_f64 does: truncation toward zero,
 * NaN to 0 (C leaves out-of-range conversions undefined; here they saturate). */
template <typename I>
__device__ __forceinline__ I fm_to_int(double v, double lo, double hi) {
    if (v != v) return (I)0;
    if (v <= lo) return (I)lo;
    if (v >= hi) return (I)hi;
    return (I)v;
}

template <typename T>
__device__ __forceinline__ void fm_st(void *p, int dt, int64_t i, T v) {
    switch (dt) {
    case FM_F32: ((float *)p)[i] = (float)v; break;
    case FM_F64: ((double *)p)[i] = (double)v; break;
    case FM_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case FM_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case FM_I8: ((int8_t *)p)[i] = fm_to_int<int8_t>((double)v, -128.0, 127.0); break;
    case FM_U8: ((uint8_t *)p)[i] = fm_to_int<uint8_t>((double)v, 0.0, 255.0); break;
    case FM_I32: ((int32_t *)p)[i] = fm_to_int<int32_t>((double)v, -2147483648.0, 2147483647.0); break;
    case FM_I64: ((int64_t *)p)[i] = fm_to_int<int64_t>((double)v, -9223372036854775808.0, 9223372036854775807.0); break;
    case FM_BOOL: ((uint8_t *)p)[i] = v != (T)0; break;
    default: break;
    }
}

/* Element offset of logical index `flat` for operand k of a geometry. */
__device__ __forceinline__ int64_t fm_geom_offset(const fm_cuda_geom &g, int k, int64_t flat) {
    int64_t off = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
        int64_t n = g.shape[d];
        int64_t idx = flat % n;
        flat /= n;
        off += idx * g.st[k][d];
    }
    return off;
}

template <typename T>
__device__ __forceinline__ T fm_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T>
__device__ __forceinline__ T fm_warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) {
        T u = __shfl_xor_sync(0xffffffffu, v, o);
        v = (u > v || u != u) ? u : v;
    }
    return v;
}

/* Block-wide sum/max; every thread gets the result. `sh` holds 32 values. */
template <typename T>
__device__ __forceinline__ T fm_block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = fm_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)0;
    r = fm_warp_sum(r);
    return r;
}
template <typename T>
__device__ __forceinline__ T fm_block_max(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = fm_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)-INFINITY;
    r = fm_warp_max(r);
    return r;
}
#endif
