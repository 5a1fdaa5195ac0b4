/* Fused AdamW on CUDA: every parameter of a list updated by one launch
 * (PyTorch's "foreach/fused" idea), reading each parameter, gradient and both
 * moments once. The launch gets a table of tensor pointers and element
 * prefix sums; each thread finds its tensor by binary search. Formula as
 * torch.optim.AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^t) * m / (sqrt(v/(1-b2^t)) + eps). Moments are f32. */
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
    int64_t start; /* prefix sum of element counts */
    int pdt;
} adamw_tab;

__global__ void adamw_kernel(const adamw_tab *tab, int n, int64_t total, float lr, float b1, float b2, float eps, float wd,
                             float bc1, float bc2, float gscale) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = n - 1;
        while (lo < hi) { int mid = (lo + hi + 1) / 2; if (tab[mid].start <= e) lo = mid; else hi = mid - 1; }
        const adamw_tab t = tab[lo];
        int64_t i = e - t.start;
        float p = fm_ld<float>(t.p, t.pdt, i), g = fm_ld<float>(t.g, t.pdt, i) * gscale;
        float m = t.m[i] = b1 * t.m[i] + (1.f - b1) * g;
        float v = t.v[i] = b2 * t.v[i] + (1.f - b2) * g * g;
        p -= lr * wd * p;
        p -= (lr / bc1) * m / (sqrtf(v / bc2) + eps);
        fm_st<float>(t.p, t.pdt, i, p);
    }
}

extern "C" fm_status fm_cuda_adamw_step(int n, fm_tensor *const *params, fm_tensor *const *grads, fm_tensor *const *exp_avg,
                                        fm_tensor *const *exp_avg_sq, const fm_adamw_hparams *hp) {
    if (n <= 0) return FM_OK;
    if (!hp || hp->step < 1) return fm_set_error(FM_ERR_INVALID, "adamw: step must count from 1");
    adamw_tab *tab = (adamw_tab *)calloc((size_t)n, sizeof *tab);
    if (!tab) return fm_set_error(FM_ERR_OOM, "adamw: out of host memory");
    int64_t total = 0;
    int dev = -1;
    for (int i = 0; i < n; i++) {
        fm_tensor *p = params[i], *g = grads[i], *m = exp_avg[i], *v = exp_avg_sq[i];
        if (!p || !g || !m || !v) { free(tab); return fm_set_error(FM_ERR_INVALID, "adamw: tensor %d is NULL", i); }
        fm_tensor *all[4] = {p, g, m, v};
        for (int k = 0; k < 4; k++) {
            if (all[k]->storage->device.type != FM_DEV_CUDA || !fm_tensor_is_contiguous(all[k]) ||
                fm_tensor_numel(all[k]) != fm_tensor_numel(p)) {
                free(tab);
                return fm_set_error(FM_ERR_INVALID, "adamw: parameter %d: param, grad and moments must be contiguous cuda tensors of equal size", i);
            }
        }
        if (dev < 0) dev = p->storage->device.index;
        if (p->storage->device.index != dev) { free(tab); return fm_set_error(FM_ERR_INVALID, "adamw: parameters on several devices"); }
        if (g->dtype != p->dtype || m->dtype != FM_F32 || v->dtype != FM_F32 ||
            (p->dtype != FM_F32 && p->dtype != FM_BF16 && p->dtype != FM_F16)) {
            free(tab);
            return fm_set_error(FM_ERR_INVALID, "adamw: parameter %d: dtypes must be param f32/bf16/f16, grad the same, moments f32 (got %s, %s, %s, %s)",
                                i, fm_dtype_name(p->dtype), fm_dtype_name(g->dtype), fm_dtype_name(m->dtype), fm_dtype_name(v->dtype));
        }
        tab[i] = (adamw_tab){fm_tensor_data(p), fm_tensor_data(g), (float *)fm_tensor_data(m), (float *)fm_tensor_data(v), total, (int)p->dtype};
        total += fm_tensor_numel(p);
    }
    fm_status st = fm_cuda_check(cudaSetDevice(dev), "adamw");
    adamw_tab *dtab = st ? NULL : (adamw_tab *)fm_cuda_scratch_alloc((size_t)n * sizeof *tab);
    if (!st && !dtab) st = fm_last_status();
    if (!st) {
        cudaStream_t s = fm_cuda_stream();
        /* The table is copied before the call returns (pageable source), so it can be freed right after. */
        st = fm_cuda_check(cudaMemcpyAsync(dtab, tab, (size_t)n * sizeof *tab, cudaMemcpyHostToDevice, s), "adamw");
        if (!st && total > 0) {
            float bc1 = (float)(1.0 - pow(hp->beta1, (double)hp->step)), bc2 = (float)(1.0 - pow(hp->beta2, (double)hp->step));
            adamw_kernel<<<fm_cuda_blocks(total, 256), 256, 0, s>>>(dtab, n, total, (float)hp->lr, (float)hp->beta1,
                                                                      (float)hp->beta2, (float)hp->eps, (float)hp->weight_decay,
                                                                      bc1, bc2, hp->grad_scale > 0 ? (float)hp->grad_scale : 1.f);
            st = fm_cuda_check_launch("adamw");
        }
        fm_cuda_scratch_free(dtab);
    }
    free(tab);
    return st;
}
