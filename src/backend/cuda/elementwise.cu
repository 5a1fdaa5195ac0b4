/* CUDA kernels for elementwise ops: unary (+ backward), binary, comparisons,
 * where, copy (any dtype to any dtype), on any strides with numpy broadcasting.
 *
 * One grid-stride kernel per compute type (float for f32/f16/bf16, double for
 * f64 and integers, the CPU backend's rule) reads each operand in its own dtype
 * and layout and writes the output in its own. The op and dtypes are uniform
 * across a launch, so their switches cost no divergence. Contiguous operands
 * skip the index arithmetic; operands of one float dtype, contiguous (or a
 * repeated row), take a 16-byte vector path (ew_vec_kernel), since those
 * dominate memory traffic in training. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/scalar_math.h"

/* A scalar_math.h function in T's precision: _f for float, _d for double. */
#define SM(fn, x) (sizeof(T) == sizeof(float) ? (T)fn##_f((float)(x)) : (T)fn##_d((double)(x)))

enum { K_UNARY = 0, K_UNARY_BWD = 1, K_BINARY = 2, K_WHERE = 3 };

typedef struct ew_params {
    int kind, op, n_in, contig;
    double a, b;
    const void *in[3];
    int in_dt[3];
    void *out;
    int out_dt;
    int64_t n;
    fm_cuda_geom g; /* st[0..2]: inputs, st[3]: output */
} ew_params;

template <typename T>
__device__ __forceinline__ T unary_f(int op, T a, T b, T x) {
    switch (op) {
    case FM_OP_NEG: return -x;
    case FM_OP_ABS: return fabs(x);
    case FM_OP_EXP: return exp(x);
    case FM_OP_LOG: return log(x);
    case FM_OP_SQRT: return sqrt(x);
    case FM_OP_RSQRT: return (T)1 / sqrt(x);
    case FM_OP_SIN: return sin(x);
    case FM_OP_COS: return cos(x);
    FM_LIBM_UNARY_CASES(T)
    case FM_OP_TANH: return tanh(x);
    case FM_OP_SIGMOID: return SM(fm_sigmoid, x);
    case FM_OP_RELU: return x > (T)0 || x != x ? x : (T)0; /* NaN stays NaN; -inf gives 0 */
    case FM_OP_LEAKY_RELU: return x > (T)0 ? x : x * a;
#define X(id, name, nin, nout, flags, prec, group) FM_OP_IF_ACT_##group(case FM_OP_##id: return SM(fm_##name, x);)
#include "fathom/ops.def" /* the activations: scalar_math.h */
#undef X
    case FM_OP_CLAMP: return x != x ? x : (x < a ? a : (x > b ? b : x));
    case FM_OP_COPY: return x;
    default: return (T)NAN;
    }
}

template <typename T>
__device__ __forceinline__ T unary_deriv(int op, T a, T b, T x, T y) {
    switch (op) {
    case FM_OP_NEG: return (T)-1;
    case FM_OP_ABS: return x > (T)0 ? (T)1 : (x < (T)0 ? (T)-1 : (T)0);
    case FM_OP_EXP: return y;
    case FM_OP_LOG: return (T)1 / x;
    case FM_OP_SQRT: return (T)0.5 / y;
    case FM_OP_RSQRT: return (T)-0.5 * y * y * y;
    case FM_OP_SIN: return cos(x);
    case FM_OP_COS: return -sin(x);
    FM_LIBM_UNARY_DERIV_CASES(T)
    case FM_OP_TANH: return (T)1 - y * y;
    case FM_OP_SIGMOID: return y * ((T)1 - y);
    case FM_OP_RELU: return x > (T)0 ? (T)1 : (T)0;
    case FM_OP_LEAKY_RELU: return x > (T)0 ? (T)1 : a;
#define X(id, name, nin, nout, flags, prec, group) FM_OP_IF_ACT_##group(case FM_OP_##id: return SM(fm_##name##_deriv, x);)
#include "fathom/ops.def"
#undef X
    case FM_OP_CLAMP: return (x >= a && x <= b) ? (T)1 : (T)0;
    case FM_OP_COPY: return (T)1;
    default: return (T)NAN;
    }
}

template <typename T>
__device__ __forceinline__ T binary_f(int op, T a, T b) {
    switch (op) {
    case FM_OP_ADD: return a + b;
    case FM_OP_SUB: return a - b;
    case FM_OP_MUL: return a * b;
    case FM_OP_DIV: return a / b;
    case FM_OP_POW: return pow(a, b);
    case FM_OP_MAXIMUM: return (a != a || b != b) ? (T)NAN : (a > b ? a : b);
    case FM_OP_MINIMUM: return (a != a || b != b) ? (T)NAN : (a < b ? a : b);
    case FM_OP_FMOD: return (T)fmod((double)a, (double)b);
    case FM_OP_REMAINDER: return (T)fm_remainder_d((double)a, (double)b);
    case FM_OP_EQ: return (T)(a == b);
    case FM_OP_NE: return (T)(a != b);
    case FM_OP_LT: return (T)(a < b);
    case FM_OP_LE: return (T)(a <= b);
    case FM_OP_GT: return (T)(a > b);
    case FM_OP_GE: return (T)(a >= b);
    default: return (T)NAN;
    }
}

template <typename T>
__global__ void ew_kernel(ew_params p) {
    const T a = (T)p.a, b = (T)p.b;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (int64_t)gridDim.x * blockDim.x) {
        T x[3] = {(T)0, (T)0, (T)0};
        bool have[3] = {false, false, false};
        for (int k = 0; k < p.n_in; k++) {
            if (!p.in[k]) continue;
            int64_t off = p.contig ? i : fm_geom_offset(p.g, k, i);
            x[k] = fm_ld<T>(p.in[k], p.in_dt[k], off);
            have[k] = true;
        }
        T y;
        switch (p.kind) {
        case K_UNARY: y = unary_f<T>(p.op, a, b, x[0]); break;
        case K_UNARY_BWD: {
            T fy = have[2] ? x[2] : unary_f<T>(p.op, a, b, x[1]);
            y = x[0] * unary_deriv<T>(p.op, a, b, x[1], fy);
            break;
        }
        case K_BINARY: y = binary_f<T>(p.op, x[0], x[1]); break;
        default: y = x[0] != (T)0 ? x[1] : x[2]; break;
        }
        int64_t oo = p.contig ? i : fm_geom_offset(p.g, 3, i);
        fm_st<T>(p.out, p.out_dt, oo, y);
    }
}

static int is_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* One storage type for a whole launch, 16 bytes per thread per step (4 f32 or 8 bf16/f16):
 * unary ops and binary ops of one dtype on contiguous operands, the second operand either
 * of the output's shape (bn == 0) or a row of bn elements repeated over the leading
 * dimensions (a linear's bias). It replaced a float4 path for f32 binary ops and copies
 * alone; the first GPU run measured the bf16 GELU, on the generic kernel, at 17% of
 * PyTorch's rate. */
template <typename S>
__device__ __forceinline__ float st_ld(S v) { return (float)v; }
template <>
__device__ __forceinline__ float st_ld<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float st_ld<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename S>
__device__ __forceinline__ S st_cv(float v) { return (S)v; }
template <>
__device__ __forceinline__ __half st_cv<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 st_cv<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename S>
__global__ void ew_vec_kernel(int kind, int op, float a, float b, const S *x0, const S *x1, S *y, int64_t nv, int64_t bn) {
    constexpr int V = 16 / sizeof(S);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 ra = ((const uint4 *)x0)[i], rb = make_uint4(0, 0, 0, 0), ry;
        if (kind == K_BINARY) rb = bn ? ((const uint4 *)x1)[(i * V % bn) / V] : ((const uint4 *)x1)[i];
        const S *va = (const S *)&ra, *vb = (const S *)&rb;
        S *vy = (S *)&ry;
        #pragma unroll
        for (int e = 0; e < V; e++)
            vy[e] = st_cv<S>(kind == K_BINARY ? binary_f<float>(op, st_ld<S>(va[e]), st_ld<S>(vb[e])) : unary_f<float>(op, a, b, st_ld<S>(va[e])));
        ((uint4 *)y)[i] = ry;
    }
}

/* the vector path's launch when it applies (see ew_vec_kernel); false otherwise */
static bool ew_vec(const fm_op_call *c, int kind, int op, double a, double b, int n_in, fm_dtype ct) {
    const fm_tensor *out = c->out[0], *x0 = c->in[0], *x1 = n_in == 2 ? c->in[1] : NULL;
    const fm_dtype dt = out->dtype;
    if (ct != FM_F32 || !(kind == K_UNARY || (kind == K_BINARY && x1 && op <= FM_OP_DIV)) || !x0) return false;
    if (dt != FM_F32 && dt != FM_BF16 && dt != FM_F16) return false;
    const int64_t n = fm_tensor_numel(out), V = 16 / (int64_t)fm_dtype_size(dt);
    if (n % V || x0->dtype != dt || !fm_tensor_is_contiguous(out) || !fm_tensor_is_contiguous(x0) || fm_tensor_numel(x0) != n)
        return false;
    if (x0->ndim != out->ndim) return false;
    for (int i = 0; i < out->ndim; i++)
        if (x0->shape[i] != out->shape[i]) return false;
    int64_t bn = 0;
    if (x1) {
        if (x1->dtype != dt || !fm_tensor_is_contiguous(x1)) return false;
        const int64_t m = fm_tensor_numel(x1), last = out->ndim ? out->shape[out->ndim - 1] : 1;
        bool same = x1->ndim == out->ndim && m == n;
        for (int i = 0; same && i < out->ndim; i++) same = x1->shape[i] == out->shape[i];
        if (!same) {
            /* a row: [.., 1, N] against [.., N] */
            if (m != last || m % V || x1->ndim < 1 || x1->shape[x1->ndim - 1] != last) return false;
            bn = m;
        }
        if (!is_aligned16(fm_tensor_data(x1))) return false;
    }
    if (!is_aligned16(fm_tensor_data(x0)) || !is_aligned16(fm_tensor_data(out))) return false;
    const int64_t nv = n / V;
    cudaStream_t s = fm_cuda_stream();
    const void *p0 = fm_tensor_data(x0), *p1 = x1 ? fm_tensor_data(x1) : NULL;
    void *py = fm_tensor_data(out);
    if (dt == FM_F32)
        ew_vec_kernel<float><<<fm_cuda_blocks(nv, 256), 256, 0, s>>>(kind, op, (float)a, (float)b, (const float *)p0, (const float *)p1, (float *)py, nv, bn);
    else if (dt == FM_BF16)
        ew_vec_kernel<__nv_bfloat16><<<fm_cuda_blocks(nv, 256), 256, 0, s>>>(kind, op, (float)a, (float)b, (const __nv_bfloat16 *)p0,
                                                                              (const __nv_bfloat16 *)p1, (__nv_bfloat16 *)py, nv, bn);
    else
        ew_vec_kernel<__half><<<fm_cuda_blocks(nv, 256), 256, 0, s>>>(kind, op, (float)a, (float)b, (const __half *)p0, (const __half *)p1,
                                                                      (__half *)py, nv, bn);
    return true;
}

static void make_strides(fm_cuda_geom *g, int k, const fm_tensor *t, bool *same) {
    int off = g->ndim - t->ndim;
    for (int i = 0; i < g->ndim; i++) {
        int ti = i - off;
        g->st[k][i] = (ti < 0 || t->shape[ti] == 1) ? 0 : t->strides[ti];
        if (ti < 0 || t->shape[ti] != g->shape[i]) *same = false;
    }
}


static fm_status ew_run(const fm_op_call *c, int kind, int op, double a, double b, int n_in, fm_dtype ct) {
    fm_tensor *out = c->out[0];
    static int generic = -1; /* FATHOM_CUDA_EW_GENERIC=1: the generic kernel only (comparisons) */
    if (generic < 0) generic = getenv("FATHOM_CUDA_EW_GENERIC") != NULL;
    if (fm_tensor_numel(out) > 0 && !generic && ew_vec(c, kind, op, a, b, n_in, ct))
        return fm_cuda_check_launch(fm_cuda_op_name(c));
    ew_params p;
    memset(&p, 0, sizeof p);
    p.kind = kind; p.op = op; p.a = a; p.b = b; p.n_in = n_in;
    p.n = fm_tensor_numel(out);
    if (p.n == 0) return FM_OK;
    p.g.ndim = out->ndim;
    for (int i = 0; i < out->ndim; i++) p.g.shape[i] = out->shape[i];
    bool contig = fm_tensor_is_contiguous(out);
    for (int k = 0; k < n_in; k++) {
        const fm_tensor *t = c->in[k];
        if (!t) continue;
        p.in[k] = fm_tensor_data(t);
        p.in_dt[k] = t->dtype;
        bool same = true;
        make_strides(&p.g, k, t, &same);
        if (!same || !fm_tensor_is_contiguous(t)) contig = false;
    }
    bool same_out = true;
    make_strides(&p.g, 3, out, &same_out);
    p.out = fm_tensor_data(out);
    p.out_dt = out->dtype;
    p.contig = contig;
    cudaStream_t s = fm_cuda_stream();
    const int threads = 256;
    if (ct == FM_F32) {
        ew_kernel<float><<<fm_cuda_blocks(p.n, threads), threads, 0, s>>>(p);
    } else {
        ew_kernel<double><<<fm_cuda_blocks(p.n, threads), threads, 0, s>>>(p);
    }
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

static fm_dtype compute_type(fm_dtype dt) { return (dt == FM_F32 || dt == FM_F16 || dt == FM_BF16) ? FM_F32 : FM_F64; }

static fm_status k_unary(const fm_op_call *c) {
    double a = 0, b = 0;
    if (c->attrs) { a = ((const fm_unary_attrs *)c->attrs)->a; b = ((const fm_unary_attrs *)c->attrs)->b; }
    fm_dtype dt = c->in[0]->dtype;
    if (!fm_dtype_is_float(dt) && !fm_ew_unary_takes_ints(c->op)) return fm_cuda_unsupported_dtype(c, dt);
    fm_dtype ct = compute_type(c->out[0]->dtype);
    if (c->op == FM_OP_COPY && dt == FM_F64) ct = FM_F64;
    return ew_run(c, K_UNARY, c->op, a, b, 1, ct);
}

static fm_status k_unary_bwd(const fm_op_call *c) {
    const fm_unary_bwd_attrs *at = (const fm_unary_bwd_attrs *)c->attrs;
    if (!fm_dtype_is_float(c->out[0]->dtype)) return fm_cuda_unsupported_dtype(c, c->out[0]->dtype);
    return ew_run(c, K_UNARY_BWD, at->fwd, at->fa.a, at->fa.b, 3, compute_type(c->out[0]->dtype));
}

static fm_status k_binary(const fm_op_call *c) {
    fm_dtype dt = c->in[0]->dtype;
    if ((c->op == FM_OP_POW || c->op == FM_OP_DIV) && !fm_dtype_is_float(dt) && c->out[0]->dtype == dt)
        return fm_cuda_unsupported_dtype(c, dt);
    return ew_run(c, K_BINARY, c->op, 0, 0, 2, compute_type(dt));
}

static fm_status k_where(const fm_op_call *c) {
    return ew_run(c, K_WHERE, FM_OP_WHERE, 0, 0, 3, compute_type(c->out[0]->dtype));
}

/* Every op of the UNARY/ACT and BINARY/COMPARE groups of ops.def (tests/test_cuda.c
 * runs a conformance case for each, by the same groups). */
extern "C" void fm_cuda_kernels_elementwise(fm_backend *b) {
    for (int op = 0; op < FM_OP_COUNT; op++) {
        fm_op_group g = fm_op_get_info((fm_op_id)op)->group;
        if (g == FM_GROUP_UNARY || g == FM_GROUP_ACT) b->kernels[op] = k_unary;
        if (g == FM_GROUP_BINARY || g == FM_GROUP_COMPARE) b->kernels[op] = k_binary;
    }
    b->kernels[FM_OP_COPY] = k_unary;
    b->kernels[FM_OP_UNARY_BACKWARD] = k_unary_bwd;
    b->kernels[FM_OP_WHERE] = k_where;
}
