/* The meta device ("meta"): tensors with shapes and dtypes and no data.
 *
 * Why: the planner answers "how much memory will this step take" by running the
 * model's real code for one step (docs/PLANNER.md), and a GPU-sized model cannot
 * be run on the machine that plans it. On meta every op front end runs as usual
 * (validation, shape and dtype rules, autocast, output allocation, autograd
 * nodes, the backward walk, the optimizer), so every tensor the real step makes
 * is made; but kernels compute nothing: each only takes and returns the scratch
 * the CPU kernel would take from the caching allocator (meta_scratch.c). The
 * allocator (meta_memory.c) counts each block at the CPU allocator's size and
 * backs none, so the step's live, peak and per-category bytes are the CPU's.
 *
 * Copies to meta do nothing; copies from meta give zeros (a loss read back is
 * 0, a gradient norm 0): code that branches on values sees zeros. Kernel slots
 * are filled exactly where the CPU backend has kernels (found through core's
 * registry, as the check device does), so "not implemented" errors match. */
#include <pthread.h>
#include <string.h>

#include "backend/meta/meta_memory.h"
#include "backend/meta/meta_scratch.h"
#include "core/tensor_internal.h"

static fm_backend g_meta;
static const fm_backend *g_cpu;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static fm_status meta_kernel(const fm_op_call *c) {
    const fm_tensor *t = c->n_out ? c->out[0] : c->var_in ? c->var_in[0] : c->in[0];
    return fm_meta_kernel_scratch(c, t ? fm_tensor_device(t) : (fm_device){FM_DEV_META, 0});
}

static fm_status meta_h2d(int idx, void *dst, const void *src, size_t n) { (void)idx; (void)dst; (void)src; (void)n; return FM_OK; }
static fm_status meta_d2d(int idx, void *dst, const void *src, size_t n) { (void)idx; (void)dst; (void)src; (void)n; return FM_OK; }
static fm_status meta_d2h(int idx, void *dst, const void *src, size_t n) {
    (void)idx;
    (void)src;
    if (n) memset(dst, 0, n);
    return FM_OK;
}
static fm_status meta_sync(int idx) { (void)idx; return FM_OK; }

static void build(void) {
    g_cpu = fm_backend_get(FM_DEV_CPU);
    if (!g_cpu) return;
    g_meta.name = "meta";
    g_meta.type = FM_DEV_META;
    g_meta.allocator = fm_meta_allocator;
    g_meta.copy_h2d = meta_h2d;
    g_meta.copy_d2h = meta_d2h;
    g_meta.copy_d2d = meta_d2d;
    g_meta.synchronize = meta_sync;
    for (int op = 0; op < FM_OP_COUNT; op++) { /* the CPU's input copies too (dispatch makes them) */
        g_meta.kernels[op] = g_cpu->kernels[op] ? meta_kernel : NULL;
        g_meta.rows_strided[op] = g_cpu->rows_strided[op];
    }
}

static const fm_backend *meta_backend(void) {
    pthread_once(&g_once, build);
    return g_cpu ? &g_meta : NULL;
}

static int meta_count(const char **reason) { (void)reason; return 1; }

void fm_backend_meta_reg(void) {
    fm_backend_register(FM_DEV_META, meta_backend);
    fm_backend_register_count(FM_DEV_META, meta_count);
}
