/* The dispatcher: device check, kernel lookup in the backend registry,
 * contiguous inputs for ops that need them, and the watcher hook. */
#include "dispatch/dispatch.h"

#include "core/tensor_internal.h"

_Thread_local int fm_in_backward = 0;

/* The installed hook, published as one pointer so a dispatch on another thread
 * sees a whole pair or none. Two slots: installing writes the one not in use. */
typedef struct dispatch_hook { fm_dispatch_hook_fn before, after; void *user; } dispatch_hook;
static dispatch_hook g_hook_slots[2];
static int g_hook_slot;
static dispatch_hook *g_hook;

void fm_dispatch_set_hook(fm_dispatch_hook_fn before, fm_dispatch_hook_fn after, void *user) {
    if (!before && !after) { __atomic_store_n(&g_hook, NULL, __ATOMIC_RELEASE); return; }
    g_hook_slot ^= 1;
    dispatch_hook *h = &g_hook_slots[g_hook_slot];
    *h = (dispatch_hook){before, after, user};
    __atomic_store_n(&g_hook, h, __ATOMIC_RELEASE);
}

static const fm_backend *backend_for(fm_device_type type) {
    const fm_backend *b = fm_backend_get(type);
    if (__builtin_expect(b != NULL, 1)) return b;
    /* The load-time registration did not run (a static link can drop a
     * constructor-only object): register now. Also links that object in. */
    fm_backends_register_builtin();
    return fm_backend_get(type);
}

/* Unit stride along the last dim, the others non-negative (rows_strided kernels). */
static bool rows_layout(const fm_tensor *x) {
    if (x->ndim < 1 || x->strides[x->ndim - 1] != 1) return false;
    for (int d = 0; d < x->ndim - 1; d++)
        if (x->strides[d] < 0) return false;
    return true;
}

/* c->in[i] = a contiguous copy (FM_OP_COPY, dispatched: no op and no autograd
 * involved) of each input that is not contiguous (with `rows`: not in rows
 * layout); the copies go to tmp. */
static fm_status make_contiguous(fm_op_call *c, fm_tensor **tmp, bool rows) {
    for (int i = 0; i < c->n_in; i++) {
        fm_tensor *x = c->in[i];
        if (!x || fm_tensor_is_contiguous(x) || (rows && rows_layout(x))) continue;
        tmp[i] = fm_tensor_empty(x->ndim, x->shape, x->dtype, x->storage->device);
        if (!tmp[i]) return fm_last_status();
        fm_op_call cp = {.op = FM_OP_COPY, .n_in = 1, .n_out = 1, .in = {x}, .out = {tmp[i]}};
        fm_status st = fm_dispatch(&cp);
        if (st != FM_OK) return st;
        c->in[i] = tmp[i];
    }
    return FM_OK;
}

fm_status fm_dispatch(fm_op_call *call) {
    const fm_op_info *info = fm_op_get_info(call->op);
    if (!info) return fm_set_error(FM_ERR_INTERNAL, "dispatch: invalid op id %d", (int)call->op);
    fm_tensor **ins = call->var_in ? call->var_in : call->in;
    fm_tensor *first = NULL;
    for (int i = 0; i < call->n_in && !first; i++) first = ins[i];
    for (int i = 0; i < call->n_out && !first; i++) first = call->out[i];
    if (!first) return fm_set_error(FM_ERR_INTERNAL, "%s: dispatch with no tensors", info->name);
    fm_device dev = first->storage->device;
    char d1[32], d2[32];
    for (int i = 0; i < call->n_in; i++)
        if (ins[i] && !fm_device_eq(ins[i]->storage->device, dev))
            return fm_set_error(FM_ERR_INVALID, "%s: inputs are on different devices (%s and %s); move them with fm_tensor_to",
                                info->name, fm_device_name(dev, d1, sizeof d1), fm_device_name(ins[i]->storage->device, d2, sizeof d2));
    const fm_backend *b = backend_for(dev.type);
    if (!b) return fm_set_error(FM_ERR_UNSUPPORTED, "%s: no backend for device %s in this build", info->name, fm_device_name(dev, d1, sizeof d1));
    fm_kernel_fn k = b->kernels[call->op];
    if (!k) return fm_set_error(FM_ERR_UNSUPPORTED, "%s: not implemented on %s", info->name, b->name);
    /* Kernels of ops without FM_OPF_STRIDED see contiguous inputs. */
    fm_tensor *tmp[FM_CALL_MAX_IN] = {0};
    fm_op_call c2 = *call;
    if (!(info->flags & FM_OPF_STRIDED)) {
        if (call->var_in) return fm_set_error(FM_ERR_INTERNAL, "%s: variadic op must accept strided inputs", info->name);
        fm_status st = make_contiguous(&c2, tmp, b->rows_strided[call->op]);
        if (st != FM_OK) {
            for (int i = 0; i < FM_CALL_MAX_IN; i++) fm_tensor_release(tmp[i]);
            return st;
        }
    }
    fm_status st;
    const dispatch_hook *h = __atomic_load_n(&g_hook, __ATOMIC_ACQUIRE);
    if (__builtin_expect(h != NULL, 0)) {
        fm_dispatch_event ev = {.call = &c2, .backend = b, .device = dev, .status = FM_OK, .stamp = 0, .mark = 0};
        if (h->before) h->before(&ev, h->user);
        ev.status = st = k(&c2);
        if (h->after) h->after(&ev, h->user);
    } else {
        st = k(&c2);
    }
    for (int i = 0; i < FM_CALL_MAX_IN; i++) fm_tensor_release(tmp[i]);
    return st;
}
