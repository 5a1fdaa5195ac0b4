/* Low-precision (bf16/fp16) storage for CPU kernels that compute in f32 only.
 *
 * Why: under autocast the activations an op saves for backward should stay in
 * bf16/fp16 (half the memory), but some kernels (attention, dropout, conv2d: the
 * ops flagged FM_OPF_F32_ONLY in ops.def) are written for f32/f64. This group
 * wraps those kernels: low-precision inputs are widened
 * to f32 scratch (F16C/AVX2 bulk conversions), the f32 kernel runs, and
 * low-precision outputs are narrowed back (round to nearest even). Math and
 * accumulation are f32; only storage is low precision. The scratch is transient:
 * it comes from the caching allocator and goes back right after the call. */
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/tensor_internal.h" /* fm_view_raw: batch slices without autograd */
#include "fathom/tensor.h"

static fm_kernel_fn g_f32_kernel[FM_OP_COUNT];

static bool lowp(const fm_tensor *t) { return t && (t->dtype == FM_BF16 || t->dtype == FM_F16); }

static fm_status widen(const fm_tensor *src, fm_tensor *dst) {
    if (!fm_tensor_is_contiguous(src)) return fm_copy_(dst, src);
    size_t n = (size_t)fm_tensor_numel(src);
    if (src->dtype == FM_BF16) fm_convert_bf16_to_f32(fm_tensor_data(src), fm_tensor_data(dst), n);
    else fm_convert_f16_to_f32(fm_tensor_data(src), fm_tensor_data(dst), n);
    return FM_OK;
}

static void narrow(const fm_tensor *src, fm_tensor *dst) {
    size_t n = (size_t)fm_tensor_numel(src);
    if (dst->dtype == FM_BF16) fm_convert_f32_to_bf16(fm_tensor_data(src), fm_tensor_data(dst), n);
    else fm_convert_f32_to_f16(fm_tensor_data(src), fm_tensor_data(dst), n);
}

static fm_status lowp_call(const fm_op_call *c, fm_kernel_fn k) {
    fm_op_call w = *c;
    fm_tensor *tmp_in[FM_CALL_MAX_IN] = {0}, *tmp_out[FM_CALL_MAX_OUT] = {0};
    fm_status st = FM_OK;
    for (int i = 0; i < c->n_in && st == FM_OK; i++) {
        if (!lowp(c->in[i])) continue;
        tmp_in[i] = fm_tensor_empty(c->in[i]->ndim, c->in[i]->shape, FM_F32, fm_tensor_device(c->in[i]));
        st = tmp_in[i] ? widen(c->in[i], tmp_in[i]) : fm_last_status();
        w.in[i] = tmp_in[i];
    }
    for (int i = 0; i < c->n_out && st == FM_OK; i++) {
        if (!lowp(c->out[i])) continue;
        tmp_out[i] = fm_tensor_empty(c->out[i]->ndim, c->out[i]->shape, FM_F32, fm_tensor_device(c->out[i]));
        if (!tmp_out[i]) st = fm_last_status();
        w.out[i] = tmp_out[i];
    }
    if (st == FM_OK) st = k(&w);
    for (int i = 0; i < c->n_out && st == FM_OK; i++)
        if (tmp_out[i]) narrow(tmp_out[i], c->out[i]);
    for (int i = 0; i < FM_CALL_MAX_IN; i++) fm_tensor_release(tmp_in[i]);
    for (int i = 0; i < FM_CALL_MAX_OUT; i++) fm_tensor_release(tmp_out[i]);
    return st;
}

/* SDPA and its backward treat each batch element on its own, and every tensor of
 * the call leads with the batch: such a call is widened and run an eighth of the
 * batch at a time, so the f32 scratch is an eighth too. The backward's scratch was
 * eight f32 copies of an activation at once (24 MiB, the bf16 step's peak, on the
 * 6-layer 384-wide GPT). Each (batch, head) row is computed the same way whatever
 * the batch around it, so the results are the same bits (fm_call_batch_slices). */
static fm_tensor *batch_view(const fm_tensor *t, int64_t b0, int64_t n) {
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    shape[0] = n;
    return fm_view_raw(t, t->ndim, shape, t->strides, t->offset + b0 * t->strides[0]);
}

static fm_status lowp_kernel(const fm_op_call *c) {
    fm_kernel_fn k = g_f32_kernel[c->op];
    bool any = false;
    for (int i = 0; i < c->n_in; i++) any |= lowp(c->in[i]);
    for (int i = 0; i < c->n_out; i++) any |= lowp(c->out[i]);
    if (!any || c->var_in) return k(c);
    int64_t B;
    if (!fm_call_batch_slices(c, &B)) return lowp_call(c, k);
    const int64_t step = (B + 7) / 8;
    fm_status st = FM_OK;
    for (int64_t b0 = 0; b0 < B && st == FM_OK; b0 += step) {
        const int64_t n = B - b0 < step ? B - b0 : step;
        fm_op_call s = *c;
        for (int i = 0; i < c->n_in && st == FM_OK; i++)
            if (!(s.in[i] = batch_view(c->in[i], b0, n))) st = fm_last_status();
        for (int i = 0; i < c->n_out && st == FM_OK; i++)
            if (!(s.out[i] = batch_view(c->out[i], b0, n))) st = fm_last_status();
        if (st == FM_OK) st = lowp_call(&s, k);
        for (int i = 0; i < c->n_in; i++) if (s.in[i] != c->in[i]) fm_tensor_release(s.in[i]);
        for (int i = 0; i < c->n_out; i++) if (s.out[i] != c->out[i]) fm_tensor_release(s.out[i]);
    }
    return st;
}

/* Wraps the kernel of every op flagged FM_OPF_F32_ONLY in fathom/ops.def. It
 * reads the kernel table, so the backend calls it after the groups have filled it. */
void fm_cpu_kernels_lowp(fm_backend *b) {
    for (int op = 0; op < FM_OP_COUNT; op++) {
        if (!(fm_op_get_info((fm_op_id)op)->flags & FM_OPF_F32_ONLY)) continue;
        if (!b->kernels[op] || b->kernels[op] == lowp_kernel) continue;
        g_f32_kernel[op] = b->kernels[op];
        b->kernels[op] = lowp_kernel;
    }
}
