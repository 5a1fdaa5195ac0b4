/* Fused AdamW on CUDA: every parameter of a list updated by one launch
 * (PyTorch's "foreach/fused" idea), reading each parameter, gradient and both
 * moments once. The launch gets a table of tensor pointers and element
 * prefix sums; each thread finds its tensor by binary search. The formula is
 * the optimizer's AdamW (src/backend/cpu/optim_cpu.c, the same expressions
 * in the same order): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p = p (1 - lr wd) - lr/bc1 * m / (sqrt(v) / sqrt(bc2) + eps). Moments are f32.
 * A bf16/f16 parameter with an f32 master: the update runs on the master and
 * the parameter is written as the master rounded to nearest even (as the
 * optimizer's master-weight path in src/optim does with three ops). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

typedef struct adamw_tab {
    void *p;
    const void *g;
    float *m, *v;
    float *master; /* NULL: the update runs on p itself */
    int64_t start; /* prefix sum of element counts */
    int pdt;
} adamw_tab;

__global__ void adamw_kernel(const adamw_tab *tab, int n, int64_t total, float b1, float b2, float ob1, float ob2, float eps,
                             float step_size, float rbc2, float decay, float gscale) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = n - 1;
        while (lo < hi) { int mid = (lo + hi + 1) / 2; if (tab[mid].start <= e) lo = mid; else hi = mid - 1; }
        const adamw_tab t = tab[lo];
        int64_t i = e - t.start;
        float p = t.master ? t.master[i] : fm_ld<float>(t.p, t.pdt, i), g = fm_ld<float>(t.g, t.pdt, i) * gscale;
        float m = t.m[i] = b1 * t.m[i] + ob1 * g;
        float v = t.v[i] = b2 * t.v[i] + ob2 * g * g;
        p = p * decay - step_size * m / (sqrtf(v) * rbc2 + eps);
        if (t.master) t.master[i] = p;
        fm_st<float>(t.p, t.pdt, i, p);
    }
}

/* Parameter i's entry of the launch table, or an error naming what is wrong. */
static fm_status adamw_entry(int i, fm_tensor *p, fm_tensor *g, fm_tensor *m, fm_tensor *v, fm_tensor *w, int *dev, int64_t start,
                             adamw_tab *out) {
    if (!p || !g || !m || !v) return fm_set_error(FM_ERR_INVALID, "adamw: tensor %d is NULL", i);
    fm_tensor *all[5] = {p, g, m, v, w};
    for (int k = 0; k < 5; k++) {
        if (!all[k]) continue;
        if (all[k]->storage->device.type != FM_DEV_CUDA || !fm_tensor_is_contiguous(all[k]) ||
            fm_tensor_numel(all[k]) != fm_tensor_numel(p))
            return fm_set_error(FM_ERR_INVALID, "adamw: parameter %d: param, grad, moments and master must be contiguous cuda tensors of equal size", i);
        if (all[k]->storage->device.index != (*dev < 0 ? p->storage->device.index : *dev))
            return fm_set_error(FM_ERR_INVALID, "adamw: parameter %d: tensors on several devices", i);
    }
    *dev = p->storage->device.index;
    bool low = p->dtype == FM_BF16 || p->dtype == FM_F16;
    if (g->dtype != p->dtype || m->dtype != FM_F32 || v->dtype != FM_F32 || (p->dtype != FM_F32 && !low))
        return fm_set_error(FM_ERR_INVALID, "adamw: parameter %d: dtypes must be param f32/bf16/f16, grad the same, moments f32 (got %s, %s, %s, %s)",
                            i, fm_dtype_name(p->dtype), fm_dtype_name(g->dtype), fm_dtype_name(m->dtype), fm_dtype_name(v->dtype));
    if (w && (w->dtype != FM_F32 || !low))
        return fm_set_error(FM_ERR_INVALID, "adamw: parameter %d: a master copy is an f32 tensor for a bf16/f16 parameter (got %s for %s)", i,
                            fm_dtype_name(w->dtype), fm_dtype_name(p->dtype));
    *out = (adamw_tab){fm_tensor_data(p), fm_tensor_data(g), (float *)fm_tensor_data(m), (float *)fm_tensor_data(v),
                       w ? (float *)fm_tensor_data(w) : NULL, start, (int)p->dtype};
    return FM_OK;
}

extern "C" fm_status fm_cuda_adamw_step(int n, fm_tensor *const *params, fm_tensor *const *grads, fm_tensor *const *exp_avg,
                                        fm_tensor *const *exp_avg_sq, fm_tensor *const *master, const fm_adamw_hparams *hp) {
    if (n <= 0) return FM_OK;
    if (!hp || hp->step < 1) return fm_set_error(FM_ERR_INVALID, "adamw: step must count from 1");
    adamw_tab *tab = (adamw_tab *)calloc((size_t)n, sizeof *tab);
    if (!tab) return fm_set_error(FM_ERR_OOM, "adamw: out of host memory");
    int64_t total = 0;
    int dev = -1;
    fm_status st = FM_OK;
    for (int i = 0; i < n && !st; i++) {
        st = adamw_entry(i, params[i], grads[i], exp_avg[i], exp_avg_sq[i], master ? master[i] : NULL, &dev, total, &tab[i]);
        if (!st) total += fm_tensor_numel(params[i]);
    }
    if (!st) st = fm_cuda_check(cudaSetDevice(dev), "adamw");
    adamw_tab *dtab = st ? NULL : (adamw_tab *)fm_cuda_scratch_alloc((size_t)n * sizeof *tab);
    if (!st && !dtab) st = fm_last_status();
    if (!st) {
        cudaStream_t s = fm_cuda_stream();
        /* The table is copied before the call returns (pageable source), so it can be freed right after. */
        st = fm_cuda_check(cudaMemcpyAsync(dtab, tab, (size_t)n * sizeof *tab, cudaMemcpyHostToDevice, s), "adamw");
        if (!st && total > 0) {
            /* the step's scalars exactly as src/optim and the cpu kernel form them */
            double bc1 = 1.0 - pow(hp->beta1, (double)hp->step), bc2 = 1.0 - pow(hp->beta2, (double)hp->step);
            adamw_kernel<<<fm_cuda_blocks(total, 256), 256, 0, s>>>(
                dtab, n, total, (float)hp->beta1, (float)hp->beta2, (float)(1.0 - hp->beta1), (float)(1.0 - hp->beta2),
                (float)hp->eps, (float)(hp->lr / bc1), (float)(1.0 / sqrt(bc2)), (float)(1.0 - hp->lr * hp->weight_decay),
                hp->grad_scale > 0 ? (float)hp->grad_scale : 1.f);
            st = fm_cuda_check_launch("adamw");
        }
        fm_cuda_scratch_free(dtab);
    }
    free(tab);
    return st;
}

/* ---------------- the optimizer ops (ops.def OPTIM_STEP, SUM_SQ_BLOCKS, SCALE_INPLACE) ----------------
 * One parameter per call, the same formulas in the same order as the CPU's
 * loops (src/backend/cpu/optim_cpu.c), in the parameter's dtype (f32/f64), so
 * src/optim runs unchanged on CUDA parameters. Unverified on a GPU. */

template <typename T> __device__ __forceinline__ T dsqrt(T x);
template <> __device__ __forceinline__ float dsqrt<float>(float x) { return sqrtf(x); }
template <> __device__ __forceinline__ double dsqrt<double>(double x) { return sqrt(x); }

template <typename T>
__global__ void optim_step_kernel(fm_optim_step_attrs a, T *p, const T *g, T *m1, T *m2, int64_t n) {
    const T lr = (T)a.lr, wd = (T)a.wd;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (a.kind == 0) { /* SGD */
            const T mom = (T)a.momentum, damp = (T)(1.0 - a.dampening);
            T d = g[i] + wd * p[i];
            if (!m1) { p[i] -= lr * d; continue; }
            T b = a.first ? d : mom * m1[i] + damp * d;
            m1[i] = b;
            p[i] -= lr * (a.nesterov ? d + mom * b : b);
            continue;
        }
        const T b1 = (T)a.beta1, b2 = (T)a.beta2, ob1 = (T)(1.0 - a.beta1), ob2 = (T)(1.0 - a.beta2), eps = (T)a.eps;
        const T step_size = (T)(a.lr / a.bc1), rbc2 = (T)(1.0 / sqrt(a.bc2));
        T gi = a.kind == 2 ? g[i] : g[i] + wd * p[i];
        T m = b1 * m1[i] + ob1 * gi;
        T v = b2 * m2[i] + ob2 * gi * gi;
        m1[i] = m;
        m2[i] = v;
        if (a.kind == 2) p[i] = p[i] * (T)(1.0 - a.lr * a.wd) - step_size * m / (dsqrt(v) * rbc2 + eps);
        else p[i] -= step_size * m / (dsqrt(v) * rbc2 + eps);
    }
}

static fm_status k_optim_step(const fm_op_call *c) {
    const fm_optim_step_attrs *a = (const fm_optim_step_attrs *)c->attrs;
    fm_tensor *p = c->in[0], *g = c->in[1], *s1 = c->in[2], *s2 = c->in[3];
    if (a->kind != 0 && (!s1 || !s2)) return fm_set_error(FM_ERR_INTERNAL, "optim_step: Adam needs both moments");
    int64_t n = fm_tensor_numel(p);
    if (n == 0) return FM_OK;
    cudaStream_t s = fm_cuda_stream();
    if (p->dtype == FM_F32)
        optim_step_kernel<float><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(*a, (float *)fm_tensor_data(p), (const float *)fm_tensor_data(g),
            s1 ? (float *)fm_tensor_data(s1) : NULL, s2 ? (float *)fm_tensor_data(s2) : NULL, n);
    else if (p->dtype == FM_F64)
        optim_step_kernel<double><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(*a, (double *)fm_tensor_data(p), (const double *)fm_tensor_data(g),
            s1 ? (double *)fm_tensor_data(s1) : NULL, s2 ? (double *)fm_tensor_data(s2) : NULL, n);
    else
        return fm_set_error(FM_ERR_UNSUPPORTED, "optim_step: parameters of dtype %s are not supported on cuda "
                            "(src/optim updates a 16-bit parameter through its f32 master; fm_cuda_adamw_step fuses that)",
                            fm_dtype_name(p->dtype));
    return FM_OK;
}

/* One block of 256 threads per FM_SUM_SQ_BLOCK elements: each thread keeps four
 * f64 partial sums, then a shared-memory tree adds them. The grouping differs from
 * the CPU's four interleaved accumulators, so the norm agrees to rounding, not bits. */
template <typename T>
__global__ void sum_sq_kernel(const T *x, int64_t n, double *out) {
    __shared__ double part[256];
    const int64_t b0 = (int64_t)blockIdx.x * FM_SUM_SQ_BLOCK;
    const int64_t e = b0 + FM_SUM_SQ_BLOCK < n ? b0 + FM_SUM_SQ_BLOCK : n;
    double acc = 0;
    for (int64_t i = b0 + threadIdx.x; i < e; i += blockDim.x) acc += (double)x[i] * (double)x[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

static fm_status k_sum_sq_blocks(const fm_op_call *c) {
    const fm_tensor *x = c->in[0];
    int64_t n = fm_tensor_numel(x), nb = (n + FM_SUM_SQ_BLOCK - 1) / FM_SUM_SQ_BLOCK;
    if (nb == 0) return FM_OK;
    if (nb > 0x7fffffff) return fm_set_error(FM_ERR_UNSUPPORTED, "sum_sq_blocks: %lld blocks exceed the grid", (long long)nb);
    cudaStream_t s = fm_cuda_stream();
    double *out = (double *)fm_tensor_data(c->out[0]);
    if (x->dtype == FM_F32) sum_sq_kernel<float><<<(unsigned)nb, 256, 0, s>>>((const float *)fm_tensor_data(x), n, out);
    else if (x->dtype == FM_F64) sum_sq_kernel<double><<<(unsigned)nb, 256, 0, s>>>((const double *)fm_tensor_data(x), n, out);
    else return fm_set_error(FM_ERR_UNSUPPORTED, "sum_sq_blocks: dtype %s is not supported", fm_dtype_name(x->dtype));
    return FM_OK;
}

template <typename T>
__global__ void scale_kernel(T *x, int64_t n, T s) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) x[i] *= s;
}

static fm_status k_scale_inplace(const fm_op_call *c) {
    fm_tensor *x = c->in[0];
    double sc = ((const fm_scale_attrs *)c->attrs)->s;
    int64_t n = fm_tensor_numel(x);
    if (n == 0) return FM_OK;
    cudaStream_t s = fm_cuda_stream();
    if (x->dtype == FM_F32) scale_kernel<float><<<fm_cuda_blocks(n, 256), 256, 0, s>>>((float *)fm_tensor_data(x), n, (float)sc);
    else if (x->dtype == FM_F64) scale_kernel<double><<<fm_cuda_blocks(n, 256), 256, 0, s>>>((double *)fm_tensor_data(x), n, sc);
    else return fm_set_error(FM_ERR_UNSUPPORTED, "scale_inplace: dtype %s is not supported", fm_dtype_name(x->dtype));
    return FM_OK;
}

extern "C" void fm_cuda_kernels_optim(fm_backend *b) {
    b->kernels[FM_OP_OPTIM_STEP] = k_optim_step;
    b->kernels[FM_OP_SUM_SQ_BLOCKS] = k_sum_sq_blocks;
    b->kernels[FM_OP_SCALE_INPLACE] = k_scale_inplace;
}
