/* Front end of linear_fused (inference: x w^T + b, then ReLU, in one kernel) and
 * of linear_fused_pack (its weights in the CPU kernel's panel form, made once).
 * No backward: the op is written by fathom compile's fuse-linear-act pass and
 * runs with grad mode off; an input that requires grad is refused rather than
 * silently cut off from the tape. */
#include <string.h>

#include "backend/kernel.h"
#include "core/tensor_internal.h"
#include "dispatch/dispatch.h"
#include "fathom/autograd.h"

#define PACK_MAX_DIM ((int64_t)1 << 24) /* N and K are stored in the packed header as f32 */

fm_tensor *fm_linear_fused_pack(fm_tensor *w) {
    if (!w) { fm_set_error(FM_ERR_INVALID, "linear_fused_pack: weight is NULL"); return NULL; }
    if (w->ndim != 2 || w->dtype != FM_F32) {
        fm_set_error(FM_ERR_INVALID, "linear_fused_pack: weight must be f32 [out, in], got %s with %d dims", fm_dtype_name(w->dtype), w->ndim);
        return NULL;
    }
    if (w->shape[0] < 1 || w->shape[1] < 1 || w->shape[0] > PACK_MAX_DIM || w->shape[1] > PACK_MAX_DIM) {
        fm_set_error(FM_ERR_INVALID, "linear_fused_pack: weight [%lld, %lld] must have 1 to 2^24 rows and columns",
                     (long long)w->shape[0], (long long)w->shape[1]);
        return NULL;
    }
    int64_t n = 3 + fm_linear_fused_pack_numel(w->shape[0], w->shape[1]);
    fm_tensor *y = fm_tensor_empty(1, &n, FM_F32, fm_tensor_device(w));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_LINEAR_FUSED_PACK, call.n_in = 1, call.n_out = 1, call.in[0] = w, call.out[0] = y;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}

fm_tensor *fm_linear_fused(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, bool relu) {
    return fm_linear_fused_act(x, w, b, packed, relu ? "relu" : NULL);
}

/* The activations linear_fused applies: name -> op (relu has its own flag). */
static const struct { const char *name; fm_op_id op; } k_acts[] = {
    {"gelu", FM_OP_GELU}, {"gelu_tanh", FM_OP_GELU_TANH}, {"silu", FM_OP_SILU}, {"sigmoid", FM_OP_SIGMOID}, {"tanh", FM_OP_TANH},
};

fm_status fm_linear_act_parse(const char *act, int *relu, int *op) {
    *relu = 0, *op = -1;
    if (!act || !*act || !strcmp(act, "none")) return FM_OK;
    if (!strcmp(act, "relu")) { *relu = 1; return FM_OK; }
    for (size_t i = 0; i < sizeof k_acts / sizeof k_acts[0]; i++)
        if (!strcmp(act, k_acts[i].name)) { *op = (int)k_acts[i].op; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "linear_fused: unknown activation '%s' (none, relu, gelu, gelu_tanh, silu, sigmoid or tanh)", act);
}

fm_tensor *fm_linear_fused_act(fm_tensor *x, fm_tensor *w, fm_tensor *b, fm_tensor *packed, const char *act) {
    char sx[128], sw[128];
    int relu = 0, act_op = -1;
    if (fm_linear_act_parse(act, &relu, &act_op)) return NULL;
    if (!x || !w) { fm_set_error(FM_ERR_INVALID, "linear_fused: %s is NULL", x ? "weight" : "input"); return NULL; }
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
        fm_set_error(FM_ERR_INVALID, "linear_fused: input %s does not match weight %s (expected weight [out, %lld])",
                     fm_shape_str(x->ndim, x->shape, sx, sizeof sx), fm_shape_str(w->ndim, w->shape, sw, sizeof sw),
                     x->ndim ? (long long)x->shape[x->ndim - 1] : 0LL);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        fm_set_error(FM_ERR_INVALID, "linear_fused: bias %s does not match weight %s (expected bias [%lld])",
                     fm_shape_str(b->ndim, b->shape, sx, sizeof sx), fm_shape_str(w->ndim, w->shape, sw, sizeof sw), (long long)w->shape[0]);
        return NULL;
    }
    if (x->dtype != FM_F32 && x->dtype != FM_F64) {
        fm_set_error(FM_ERR_INVALID, "linear_fused: needs f32 or f64, got %s (run linear and relu)", fm_dtype_name(x->dtype));
        return NULL;
    }
    if (fm_check_same_dtype("linear_fused", x, w) || (b && fm_check_same_dtype("linear_fused", x, b)) ||
        fm_check_same_device("linear_fused", x, w) || (b && fm_check_same_device("linear_fused", x, b)))
        return NULL;
    if (packed && (packed->ndim != 1 || packed->dtype != FM_F32 || fm_check_same_device("linear_fused", x, packed))) {
        if (packed->ndim != 1 || packed->dtype != FM_F32)
            fm_set_error(FM_ERR_INVALID, "linear_fused: packed weights must be fm_linear_fused_pack's 1-D f32 tensor");
        return NULL;
    }
    if (fm_grad_enabled() && (x->requires_grad || w->requires_grad || (b && b->requires_grad))) {
        fm_set_error(FM_ERR_INVALID, "linear_fused: inference only (no backward); run it under fm_set_grad_enabled(false), or use linear and relu");
        return NULL;
    }
    int64_t ys[FM_MAX_DIMS];
    memcpy(ys, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    ys[x->ndim - 1] = w->shape[0];
    fm_tensor *y = fm_tensor_empty(x->ndim, ys, x->dtype, fm_tensor_device(x));
    if (!y) return NULL;
    fm_linear_fused_attrs a = {relu, act_op >= 0, act_op >= 0 ? (fm_op_id)act_op : FM_OP_RELU};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_LINEAR_FUSED, call.n_in = 4, call.n_out = 1;
    call.in[0] = x, call.in[1] = w, call.in[2] = b, call.in[3] = packed, call.out[0] = y, call.attrs = &a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}
