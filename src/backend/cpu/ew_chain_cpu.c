/* EW_CHAIN: a chain of elementwise steps (fm_ew_step) on f32 in one pass over memory:
 * each block of x is loaded once into an L1 buffer, every step runs over the buffer
 * (a plain loop per step, which the compiler vectorizes), and the block is stored
 * once. The separate ops would read and write the whole tensor once per step
 * (MobileNetV3's HardSwish is four ops: mul, add, clamp, mul). sigmoid and tanh use
 * libm's expf and tanhf: within a few ulps of the ops' own kernels, not bitwise. */
#include <math.h>
#include <string.h>

#include "backend/cpu/conv_shared.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/parallel.h"

enum { EW_BLOCK = 512 };

typedef struct ew_job { const float *x; float *y; int64_t n; const fm_ew_chain_attrs *a; } ew_job;

/* One step over v[0, m) (x: the block's input). Cloned per vector width: the same
 * arithmetic per element at each (the libm calls aside, which the clones share). */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void step(const fm_ew_step *s, float *restrict v, const float *restrict x, int64_t m) {
    const float a = s->a, b = s->b;
    switch (s->op) {
    case FM_EW_ADD: for (int64_t i = 0; i < m; i++) v[i] += a; break;
    case FM_EW_MUL: for (int64_t i = 0; i < m; i++) v[i] *= a; break;
    case FM_EW_SUB: for (int64_t i = 0; i < m; i++) v[i] -= a; break;
    case FM_EW_RSUB: for (int64_t i = 0; i < m; i++) v[i] = a - v[i]; break;
    case FM_EW_DIV: for (int64_t i = 0; i < m; i++) v[i] /= a; break;
    case FM_EW_RDIV: for (int64_t i = 0; i < m; i++) v[i] = a / v[i]; break;
    case FM_EW_CLAMP: for (int64_t i = 0; i < m; i++) v[i] = v[i] < a ? a : v[i] > b ? b : v[i]; break;
    case FM_EW_RELU: for (int64_t i = 0; i < m; i++) v[i] = v[i] < 0 ? 0.0f : v[i]; break;
    case FM_EW_SIGMOID: for (int64_t i = 0; i < m; i++) v[i] = 1.0f / (1.0f + expf(-v[i])); break;
    case FM_EW_TANH: for (int64_t i = 0; i < m; i++) v[i] = tanhf(v[i]); break;
    case FM_EW_MUL_X: for (int64_t i = 0; i < m; i++) v[i] *= x[i]; break;
    case FM_EW_ADD_X: for (int64_t i = 0; i < m; i++) v[i] += x[i]; break;
    case FM_EW_ROUND: for (int64_t i = 0; i < m; i++) v[i] = nearbyintf(v[i]); break;
    default: break;
    }
}

static void ew_blocks(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const ew_job *j = ctx;
    _Alignas(64) float v[EW_BLOCK];
    for (int64_t blk = b; blk < e; blk++) {
        const int64_t i0 = blk * EW_BLOCK, m = j->n - i0 < EW_BLOCK ? j->n - i0 : EW_BLOCK;
        memcpy(v, j->x + i0, sizeof(float) * (size_t)m);
        for (int s = 0; s < j->a->n; s++) step(&j->a->steps[s], v, j->x + i0, m);
        memcpy(j->y + i0, v, sizeof(float) * (size_t)m);
    }
}

static fm_status ew_chain_kernel(const fm_op_call *c) {
    const fm_tensor *x = c->in[0];
    if (x->dtype != FM_F32) return fm_cpu_unsupported_dtype(c, x->dtype);
    ew_job j = {fm_tensor_data(x), fm_tensor_data(c->out[0]), fm_tensor_numel(x), c->attrs};
    const int64_t blocks = (j.n + EW_BLOCK - 1) / EW_BLOCK;
    fm_parallel_for(blocks, grain_for(blocks, EW_BLOCK * j.a->n), ew_blocks, &j);
    return FM_OK;
}

void fm_cpu_kernels_ew_chain(fm_backend *b) { b->kernels[FM_OP_EW_CHAIN] = ew_chain_kernel; }
