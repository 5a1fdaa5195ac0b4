/* The dispatcher: runs an op call on the kernel that its tensors' device
 * registered. Ops never call kernels directly: a front end (src/ops) builds an
 * fm_op_call (backend/kernel.h) and calls fm_dispatch(). A missing kernel is an
 * error naming the op and the device, never a silent fallback.
 *
 * Above core and the backends, below autograd and the ops. Watchers (the
 * profiler) attach through one hook and are never named here. */
#ifndef FATHOM_DISPATCH_H
#define FATHOM_DISPATCH_H
#include "backend/kernel.h"

/* Run a call; inputs must already be on one device. Handles contiguity for ops
 * without FM_OPF_STRIDED (by dispatching FM_OP_COPY) and reports missing kernels. */
fm_status fm_dispatch(fm_op_call *call);

/* One kernel run as a hook sees it: the call as the kernel got it (inputs made
 * contiguous), the backend, and after the run its status. `stamp` and `mark`
 * are the hook's own: `before` may store values there that `after` reads. */
typedef struct fm_dispatch_event {
    const fm_op_call *call;
    const fm_backend *backend;
    fm_device device;
    fm_status status;
    double stamp;
    uint64_t mark; /* the hook's own too */
} fm_dispatch_event;
typedef void (*fm_dispatch_hook_fn)(fm_dispatch_event *ev, void *user);

/* Installs the hook pair run around every kernel (either may be NULL; both
 * NULL removes it). One watcher at a time: the profiler installs it at start and
 * removes it at stop. Without one, the cost per dispatch is one predictable branch. */
void fm_dispatch_set_hook(fm_dispatch_hook_fn before, fm_dispatch_hook_fn after, void *user);

/* Non-zero while the autograd engine runs backward functions on this thread
 * (set by src/autograd/engine.c, read by watchers to label their events). */
extern _Thread_local int fm_in_backward;

/* Registers every backend this build has (generated from src/dispatch/backends.c.in;
 * runs at load, and again harmlessly if the dispatcher finds no backend). */
void fm_backends_register_builtin(void);
#endif
