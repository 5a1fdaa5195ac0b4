/* The checked test device ("check", "check:N"): the CPU backend's kernels
 * behind the device interface, on memory the host may not touch.
 *
 * Why: CI has no GPU, yet the device path (modules moved to a device, the
 * optimizer on device parameters, batches copied in, checkpoints copied out)
 * must be tested. Running the CPU kernels on protected memory does that: each
 * kernel call opens its tensors' blocks for the call only, the copies open their
 * block for the copy only, and everything else that reaches device memory from
 * the host faults at once with the address named (check_memory.c). The kernels
 * are the CPU's own, so results are bitwise those of the CPU.
 *
 * It finds the CPU backend through core's registry (the backends stay peers:
 * neither includes the other) and is always built (FATHOM_BACKENDS). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/check/check_memory.h"
#include "backend/kernel.h"

static fm_backend g_check;
static fm_check_counts g_counts;
#define COUNT(field) __atomic_add_fetch(&g_counts.field, 1, __ATOMIC_RELAXED)

void fm_check_counts_get(fm_check_counts *out) {
    unsigned long long *d = (unsigned long long *)out, *s = (unsigned long long *)&g_counts;
    for (size_t i = 0; i < sizeof *out / sizeof *d; i++) d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}
static const fm_backend *g_cpu;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void open_call(const fm_op_call *c, bool open) {
    fm_tensor *const *ins = c->var_in ? c->var_in : c->in;
    void (*fn)(const void *) = open ? fm_check_open : fm_check_close;
    for (int i = 0; i < c->n_in; i++)
        if (ins[i]) fn(ins[i]->storage->data);
    for (int i = 0; i < c->n_out; i++)
        if (c->out[i]) fn(c->out[i]->storage->data);
}

/* Every kernel slot: the CPU kernel of the call's op, with the call's blocks
 * open around it. Device tensors the kernel makes for itself (the low-precision
 * wrapper's f32 scratch) are open until it returns (fm_check_kernel_enter). */
static fm_status check_kernel(const fm_op_call *c) {
    COUNT(kernels);
    open_call(c, true);
    fm_check_kernel_enter();
    fm_status st = g_cpu->kernels[c->op](c);
    fm_check_kernel_leave();
    open_call(c, false);
    return st;
}

static fm_status check_h2d(int idx, void *dst, const void *src, size_t n) {
    (void)idx;
    COUNT(h2d);
    if (!n) return FM_OK;
    fm_check_open(dst);
    memcpy(dst, src, n);
    fm_check_close(dst);
    return FM_OK;
}

static fm_status check_d2h(int idx, void *dst, const void *src, size_t n) {
    (void)idx;
    COUNT(d2h);
    if (!n) return FM_OK;
    fm_check_open(src);
    memcpy(dst, src, n);
    fm_check_close(src);
    return FM_OK;
}

static fm_status check_d2d(int idx, void *dst, const void *src, size_t n) {
    (void)idx;
    COUNT(d2d);
    if (!n) return FM_OK;
    fm_check_open(src);
    fm_check_open(dst);
    memmove(dst, src, n);
    fm_check_close(dst);
    fm_check_close(src);
    return FM_OK;
}

static fm_status check_sync(int idx) { (void)idx; return FM_OK; }

/* Batches one step ahead (fm_batch_stage): the same calls as on a GPU, made
 * synchronous here (the copy is done when it returns), and counted, so that a test
 * sees when each upload was issued relative to the kernels around it. The staging
 * memory is the host's own. */
static void *check_host_alloc(int idx, size_t n) { (void)idx; return malloc(n ? n : 1); }
static void check_host_free(void *p) { free(p); }
static fm_status check_h2d_ahead(int idx, void *dst, const void *src, size_t n, void **ticket) {
    (void)idx;
    COUNT(h2d_ahead);
    *ticket = &g_counts; /* any non-NULL token: the check device does not need one */
    if (!n) return FM_OK;
    fm_check_open(dst);
    memcpy(dst, src, n);
    fm_check_close(dst);
    return FM_OK;
}
static fm_status check_ticket_wait(int idx, void *ticket) {
    (void)idx;
    if (ticket) COUNT(waits);
    return FM_OK;
}

static void build(void) {
    g_cpu = fm_backend_get(FM_DEV_CPU);
    if (!g_cpu) return;
    g_check.name = "check";
    g_check.type = FM_DEV_CHECK;
    g_check.allocator = fm_check_allocator;
    g_check.copy_h2d = check_h2d;
    g_check.copy_d2h = check_d2h;
    g_check.copy_d2d = check_d2d;
    g_check.synchronize = check_sync;
    g_check.host_alloc = check_host_alloc;
    g_check.host_free = check_host_free;
    g_check.copy_h2d_ahead = check_h2d_ahead;
    g_check.ticket_wait = check_ticket_wait;
    for (int op = 0; op < FM_OP_COUNT; op++) {
        g_check.kernels[op] = g_cpu->kernels[op] ? check_kernel : NULL;
        g_check.rows_strided[op] = g_cpu->rows_strided[op];
    }
}

static const fm_backend *check_backend(void) {
    pthread_once(&g_once, build);
    return g_cpu ? &g_check : NULL;
}

static int check_count(const char **reason) { (void)reason; return FM_CHECK_DEVICES; }

void fm_backend_check_reg(void) {
    fm_backend_register(FM_DEV_CHECK, check_backend);
    fm_backend_register_count(FM_DEV_CHECK, check_count);
}
