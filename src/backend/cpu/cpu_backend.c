/* The CPU backend: its allocator, copies, and the kernel table filled by the
 * kernel groups (cpu_kernels.h). Registered at load (fm_backend_cpu_reg, from
 * the generated list src/dispatch/backends.c.in); built once, on first use. */
#include <pthread.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "fathom/memory.h"

static fm_allocator *cpu_alloc(int idx) { (void)idx; return fm_cpu_allocator(); }
static fm_status cpu_copy(int idx, void *dst, const void *src, size_t n) { (void)idx; memcpy(dst, src, n); return FM_OK; }
static fm_status cpu_sync(int idx) { (void)idx; return FM_OK; }

static fm_backend g_cpu;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build(void) {
    g_cpu.name = "cpu";
    g_cpu.type = FM_DEV_CPU;
    g_cpu.allocator = cpu_alloc;
    g_cpu.copy_h2d = cpu_copy;
    g_cpu.copy_d2h = cpu_copy;
    g_cpu.copy_d2d = cpu_copy;
    g_cpu.synchronize = cpu_sync;
    fm_cpu_gemm_init();
    fm_cpu_kernels_elementwise(&g_cpu);
    fm_cpu_kernels_reduce(&g_cpu);
    fm_cpu_kernels_matmul(&g_cpu);
    fm_cpu_kernels_softmax(&g_cpu);
    fm_cpu_kernels_norm(&g_cpu);
    fm_cpu_kernels_conv(&g_cpu);
    fm_cpu_kernels_conv_fused(&g_cpu);
    fm_cpu_kernels_linear_fused(&g_cpu);
    fm_cpu_kernels_ew_chain(&g_cpu);
    fm_cpu_kernels_pool(&g_cpu);
    fm_cpu_kernels_batch_norm(&g_cpu);
    fm_cpu_kernels_index(&g_cpu);
    fm_cpu_kernels_topk(&g_cpu);
    fm_cpu_kernels_attention(&g_cpu);
    fm_cpu_kernels_fused(&g_cpu);
    fm_cpu_kernels_lstm(&g_cpu);
    fm_cpu_kernels_optim(&g_cpu);
    fm_cpu_kernels_quant(&g_cpu);
    fm_cpu_kernels_qconv(&g_cpu);
    fm_cpu_kernels_lowp(&g_cpu); /* wraps kernels registered above: keep last */
}

static const fm_backend *cpu_backend(void) {
    pthread_once(&g_once, build);
    return &g_cpu;
}

static int cpu_count(const char **reason) { (void)reason; return 1; }

void fm_backend_cpu_reg(void) {
    fm_backend_register(FM_DEV_CPU, cpu_backend);
    fm_backend_register_count(FM_DEV_CPU, cpu_count);
}
