/* Backend registry, op-info table and the dispatcher. */
#include <string.h>

#include "core/backend.h"
#include "core/tensor_internal.h"
#include "fathom/autograd.h"
#include "fathom/memory.h"
#include "fathom/profile.h"
#include "profile/op_cost.h"

extern int fm_profiler_on;
_Thread_local int fm_in_backward = 0;

static const fm_op_info k_ops[FM_OP_COUNT] = {
#define X(id, name, nin, nout, flags) [FM_OP_##id] = {name, nin, nout, flags},
#include "fathom/ops.def"
#undef X
};

const fm_op_info *fm_op_get_info(fm_op_id op) { return (unsigned)op < FM_OP_COUNT ? &k_ops[op] : NULL; }

fm_op_id fm_op_find(const char *name) {
    for (int i = 0; i < FM_OP_COUNT; i++)
        if (!strcmp(k_ops[i].name, name)) return (fm_op_id)i;
    return FM_OP_COUNT;
}

static const fm_backend *g_backends[2];

void fm_backend_register(const fm_backend *b) {
    if (b && (unsigned)b->type < 2) g_backends[b->type] = b;
}

const fm_backend *fm_backend_get(fm_device_type type) {
    if (type == FM_DEV_CPU) return fm_cpu_backend();
    if (type == FM_DEV_CUDA && !g_backends[FM_DEV_CUDA]) return fm_cuda_backend(); /* lazy: probes the device once */
    return (unsigned)type < 2 ? g_backends[type] : NULL;
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
    const fm_backend *b = fm_backend_get(dev.type);
    if (!b) return fm_set_error(FM_ERR_UNSUPPORTED, "%s: no backend for device %s in this build", info->name, fm_device_name(dev, d1, sizeof d1));
    fm_kernel_fn k = b->kernels[call->op];
    if (!k) return fm_set_error(FM_ERR_UNSUPPORTED, "%s: not implemented on %s", info->name, b->name);
    /* Kernels of ops without FM_OPF_STRIDED see contiguous inputs. */
    fm_tensor *tmp[FM_CALL_MAX_IN] = {0};
    fm_tensor **vtmp = NULL;
    fm_op_call c2 = *call;
    if (!(info->flags & FM_OPF_STRIDED)) {
        if (call->var_in) return fm_set_error(FM_ERR_INTERNAL, "%s: variadic op must accept strided inputs", info->name);
        bool prev = fm_set_grad_enabled(false);
        for (int i = 0; i < call->n_in; i++) {
            if (ins[i] && !fm_tensor_is_contiguous(ins[i])) {
                tmp[i] = fm_contiguous(ins[i]);
                if (!tmp[i]) {
                    fm_set_grad_enabled(prev);
                    for (int j = 0; j < i; j++) fm_tensor_release(tmp[j]);
                    return fm_last_status();
                }
                c2.in[i] = tmp[i];
            }
        }
        fm_set_grad_enabled(prev);
    }
    (void)vtmp;
    fm_status st;
    if (__builtin_expect(fm_profiler_on, 0)) {
        double t0 = fm_profiler_now_us();
        st = k(&c2);
        if (b->synchronize && dev.type != FM_DEV_CPU) b->synchronize(dev.index);
        double t1 = fm_profiler_now_us();
        char args[256], sh[128];
        fm_tensor *o = call->n_out ? call->out[0] : NULL;
        snprintf(args, sizeof args, "{\"flops\":%.0f,\"bytes\":%.0f,\"out\":\"%s\",\"device\":\"%s\"}", fm_op_flops(&c2),
                 fm_op_bytes(&c2), o ? fm_shape_str(o->ndim, o->shape, sh, sizeof sh) : "", b->name);
        fm_profile_span(info->name, fm_in_backward ? "backward" : "forward", t0, t1 - t0, args);
        fm_memory_stats ms;
        if (fm_memory_stats_get(dev, &ms) == FM_OK) {
            fm_profile_counter("memory", "allocated", (double)ms.allocated);
            fm_profile_counter("memory reserved", "reserved", (double)ms.reserved);
        }
    } else {
        st = k(&c2);
    }
    for (int i = 0; i < FM_CALL_MAX_IN; i++) fm_tensor_release(tmp[i]);
    return st;
}
