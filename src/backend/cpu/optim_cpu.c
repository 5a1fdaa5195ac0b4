/* The optimizers' CPU kernels (ops.def: OPTIM_STEP, SUM_SQ_BLOCKS, SCALE_INPLACE),
 * driven by src/optim/optim.c, which computes the step's scalars.
 *
 * Each update is one fused loop per parameter over contiguous data (parameter,
 * gradient and state read once, written once), split across the thread pool by
 * element ranges; every element is independent, so the result does not depend
 * on the thread count. The AdamW, Adam and SGD f32 loops have AVX-512 and AVX2 twins
 * (adamw_avx512.c, adamw_avx2.c) that give the same bits: this file is built for the
 * baseline ISA, where the compiler's loop is 4-wide (SGD's was ~10% of the fashion-mlp
 * step's samples). Being kernels, they run wherever the parameters live: the checked
 * test device runs these same loops on its memory. */
#include <math.h>

#include "backend/cpu/adamw_simd.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h" /* fm_cpu_use_avx512 */
#include "core/parallel.h"     /* fm_parallel_for over element ranges */

enum { K_SGD = 0, K_ADAM = 1, K_ADAMW = 2 }; /* fm_optim_kind's values */

typedef struct upd_ctx {
    const fm_optim_step_attrs *a;
    void *p;
    const void *g;
    void *b1, *b2;
} upd_ctx;

/* Adam (L2: adam, wd) or AdamW (decay) f32 through the AVX-512 or AVX2 kernel (bitwise the
 * loops below); false: use the loop */
static bool adamw_simd_f32(float *p, const float *g, float *m1, float *m2, float b1, float b2, float ob1, float ob2,
                           float eps, float step_size, float rbc2, float decay, bool adam, float wd, int64_t begin,
                           int64_t end) {
    fm_adamw_args a = {p, m1, m2, g, b1, b2, ob1, ob2, eps, step_size, rbc2, decay, adam, wd};
    if (fm_cpu_use_avx512()) fm_adamw_f32_avx512(&a, begin, end);
    else if (fm_cpu_use_avx2()) fm_adamw_f32_avx2(&a, begin, end);
    else return false;
    return true;
}
/* SGD f32 the same way */
static bool sgd_simd_f32(float *p, const float *g, float *m1, float lr, float wd, float mom, float damp, bool first,
                         bool nesterov, int64_t begin, int64_t end) {
    fm_sgd_args a = {p, m1, g, lr, wd, mom, damp, first, nesterov};
    if (fm_cpu_use_avx512()) fm_sgd_f32_avx512(&a, begin, end);
    else if (fm_cpu_use_avx2()) fm_sgd_f32_avx2(&a, begin, end);
    else return false;
    return true;
}
static bool sgd_simd_f64(double *p, const double *g, double *m1, double lr, double wd, double mom, double damp,
                         bool first, bool nesterov, int64_t begin, int64_t end) {
    (void)p; (void)g; (void)m1; (void)lr; (void)wd; (void)mom; (void)damp; (void)first; (void)nesterov;
    (void)begin; (void)end;
    return false;
}
static bool adamw_simd_f64(double *p, const double *g, double *m1, double *m2, double b1, double b2, double ob1,
                           double ob2, double eps, double step_size, double rbc2, double decay, bool adam, double wd,
                           int64_t begin, int64_t end) {
    (void)p; (void)g; (void)m1; (void)m2; (void)b1; (void)b2; (void)ob1; (void)ob2; (void)eps; (void)step_size;
    (void)rbc2; (void)decay; (void)adam; (void)wd; (void)begin; (void)end;
    return false;
}

#define DEFINE_UPDATE(T, SQRT, SUFFIX)                                                             \
    static void update_##SUFFIX(void *vctx, int64_t begin, int64_t end, int tid) {               \
        (void)tid;                                                                                 \
        const upd_ctx *u = vctx;                                                                   \
        const fm_optim_step_attrs *c = u->a;                                                       \
        T *restrict p = u->p;                                                                      \
        const T *restrict g = u->g;                                                                \
        T *restrict m1 = u->b1, *restrict m2 = u->b2;                                              \
        const T lr = (T)c->lr, wd = (T)c->wd;                                                      \
        if (c->kind == K_SGD) {                                                                    \
            const T mom = (T)c->momentum, damp = (T)(1.0 - c->dampening);                          \
            if (sgd_simd_##SUFFIX(p, g, m1, lr, wd, mom, damp, c->first, c->nesterov, begin, end))    \
                return;                                                                            \
            if (!m1) {                                                                             \
                for (int64_t i = begin; i < end; i++) p[i] -= lr * (g[i] + wd * p[i]);             \
            } else if (c->first) {                                                                 \
                for (int64_t i = begin; i < end; i++) {                                            \
                    T d = g[i] + wd * p[i];                                                        \
                    m1[i] = d;                                                                     \
                    p[i] -= lr * (c->nesterov ? d + mom * d : d);                                  \
                }                                                                                  \
            } else if (c->nesterov) {                                                              \
                for (int64_t i = begin; i < end; i++) {                                            \
                    T d = g[i] + wd * p[i];                                                        \
                    T b = mom * m1[i] + damp * d;                                                  \
                    m1[i] = b;                                                                     \
                    p[i] -= lr * (d + mom * b);                                                    \
                }                                                                                  \
            } else {                                                                               \
                for (int64_t i = begin; i < end; i++) {                                            \
                    T d = g[i] + wd * p[i];                                                        \
                    T b = mom * m1[i] + damp * d;                                                  \
                    m1[i] = b;                                                                     \
                    p[i] -= lr * b;                                                                \
                }                                                                                  \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        const T b1 = (T)c->beta1, b2 = (T)c->beta2, ob1 = (T)(1.0 - c->beta1),                    \
                ob2 = (T)(1.0 - c->beta2), eps = (T)c->eps;                                        \
        const T step_size = (T)(c->lr / c->bc1), rbc2 = (T)(1.0 / sqrt(c->bc2));                  \
        if (c->kind == K_ADAMW) {                                                                  \
            const T decay = (T)(1.0 - c->lr * c->wd);                                              \
            if (adamw_simd_##SUFFIX(p, g, m1, m2, b1, b2, ob1, ob2, eps, step_size, rbc2, decay, false, 0, begin, end)) \
                return;                                                                            \
            for (int64_t i = begin; i < end; i++) {                                                \
                T gi = g[i];                                                                       \
                T m = b1 * m1[i] + ob1 * gi;                                                       \
                T v = b2 * m2[i] + ob2 * gi * gi;                                                  \
                m1[i] = m;                                                                         \
                m2[i] = v;                                                                         \
                p[i] = p[i] * decay - step_size * m / (SQRT(v) * rbc2 + eps);                      \
            }                                                                                      \
        } else {                                                                                   \
            if (adamw_simd_##SUFFIX(p, g, m1, m2, b1, b2, ob1, ob2, eps, step_size, rbc2, 1, true, wd, begin, end)) \
                return;                                                                            \
            for (int64_t i = begin; i < end; i++) {                                                \
                T gi = g[i] + wd * p[i];                                                           \
                T m = b1 * m1[i] + ob1 * gi;                                                       \
                T v = b2 * m2[i] + ob2 * gi * gi;                                                  \
                m1[i] = m;                                                                         \
                m2[i] = v;                                                                         \
                p[i] -= step_size * m / (SQRT(v) * rbc2 + eps);                                    \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_UPDATE(float, sqrtf, f32)
DEFINE_UPDATE(double, sqrt, f64)

static fm_status optim_step_cpu(const fm_op_call *c) {
    const fm_optim_step_attrs *a = c->attrs;
    fm_tensor *p = c->in[0], *g = c->in[1], *s1 = c->in[2], *s2 = c->in[3];
    if (p->dtype != FM_F32 && p->dtype != FM_F64)
        return fm_set_error(FM_ERR_UNSUPPORTED, "optim_step: parameters of dtype %s are not supported on cpu",
                            fm_dtype_name(p->dtype));
    if (a->kind != K_SGD && (!s1 || !s2)) return fm_set_error(FM_ERR_INTERNAL, "optim_step: Adam needs both moments");
    upd_ctx u = {a, fm_tensor_data(p), fm_tensor_data(g), s1 ? fm_tensor_data(s1) : NULL, s2 ? fm_tensor_data(s2) : NULL};
    fm_parallel_for(fm_tensor_numel(p), 1 << 15, p->dtype == FM_F32 ? update_f32 : update_f64, &u);
    return FM_OK;
}

typedef struct sq_ctx {
    const void *d;
    int64_t n;
    bool f64;
    double *out; /* one per block */
} sq_ctx;

static void sq_blocks(void *vctx, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    const sq_ctx *c = vctx;
    for (int64_t b = b0; b < b1; b++) {
        int64_t i = b * FM_SUM_SQ_BLOCK, e = i + FM_SUM_SQ_BLOCK < c->n ? i + FM_SUM_SQ_BLOCK : c->n;
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        if (c->f64) {
            const double *x = c->d;
            for (; i + 4 <= e; i += 4) { a0 += x[i] * x[i]; a1 += x[i + 1] * x[i + 1]; a2 += x[i + 2] * x[i + 2]; a3 += x[i + 3] * x[i + 3]; }
            for (; i < e; i++) a0 += x[i] * x[i];
        } else {
            const float *x = c->d;
            for (; i + 4 <= e; i += 4) {
                a0 += (double)x[i] * x[i]; a1 += (double)x[i + 1] * x[i + 1];
                a2 += (double)x[i + 2] * x[i + 2]; a3 += (double)x[i + 3] * x[i + 3];
            }
            for (; i < e; i++) a0 += (double)x[i] * x[i];
        }
        c->out[b] = (a0 + a1) + (a2 + a3);
    }
}

static fm_status sum_sq_blocks_cpu(const fm_op_call *c) {
    const fm_tensor *x = c->in[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64)
        return fm_set_error(FM_ERR_UNSUPPORTED, "sum_sq_blocks: dtype %s is not supported", fm_dtype_name(x->dtype));
    int64_t n = fm_tensor_numel(x);
    sq_ctx s = {fm_tensor_data(x), n, x->dtype == FM_F64, fm_tensor_data(c->out[0])};
    fm_parallel_for((n + FM_SUM_SQ_BLOCK - 1) / FM_SUM_SQ_BLOCK, 4, sq_blocks, &s);
    return FM_OK;
}

typedef struct scale_ctx {
    void *d;
    bool f64;
    double s;
} scale_ctx;

static void scale_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const scale_ctx *c = vctx;
    if (c->f64) {
        double *d = c->d;
        for (int64_t k = b; k < e; k++) d[k] *= c->s;
    } else {
        float *d = c->d, s = (float)c->s;
        for (int64_t k = b; k < e; k++) d[k] *= s;
    }
}

static fm_status scale_inplace_cpu(const fm_op_call *c) {
    fm_tensor *x = c->in[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64)
        return fm_set_error(FM_ERR_UNSUPPORTED, "scale_inplace: dtype %s is not supported", fm_dtype_name(x->dtype));
    scale_ctx s = {fm_tensor_data(x), x->dtype == FM_F64, ((const fm_scale_attrs *)c->attrs)->s};
    fm_parallel_for(fm_tensor_numel(x), 1 << 15, scale_range, &s);
    return FM_OK;
}

void fm_cpu_kernels_optim(fm_backend *b) {
    b->kernels[FM_OP_OPTIM_STEP] = optim_step_cpu;
    b->kernels[FM_OP_SUM_SQ_BLOCKS] = sum_sq_blocks_cpu;
    b->kernels[FM_OP_SCALE_INPLACE] = scale_inplace_cpu;
}
