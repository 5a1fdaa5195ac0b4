/* linear_fused on the CPU: y = act(x w^T + b), inference only. With the
 * weights packed by linear_fused_pack (a graph packs its constant weights once,
 * at load) an f32 product runs the AVX2 panel kernel (linear_packed.h), which
 * adds the bias and applies the ReLU while each tile is in registers (its AVX-512
 * twin when the ISA level allows, bitwise the same). Otherwise
 * (no packed weights, f64, a CPU without AVX2/FMA or FATHOM_ISA=scalar) it is
 * the GEMM path of linear (fm_cpu_gemm_bias: OpenBLAS with the bias as its
 * beta = 1 start), then one ReLU pass. The other activations (GELU, SiLU, sigmoid,
 * tanh) run the elementwise kernels' vector loops on each block of outputs the
 * moment it is written (the block is still in cache), or on all of y after the
 * GEMM path. */
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/linear_packed.h"
#include "backend/kernel_attrs.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* The packed form (linear_fused_pack): a header {1, N, K} (exact in f32: both are
 * at most 2^24, which the front end checks), then fm_linear_pack_f32's panels. */
static fm_status linear_fused_pack_kernel(const fm_op_call *c) {
    const fm_tensor *w = c->in[0];
    if (w->dtype != FM_F32) return fm_cpu_unsupported_dtype(c, w->dtype);
    float *y = fm_tensor_data(c->out[0]);
    const int64_t N = w->shape[0], K = w->shape[1];
    y[0] = 1.0f, y[1] = (float)N, y[2] = (float)K;
    fm_linear_pack_f32(fm_tensor_data(w), y + 3, N, K);
    return FM_OK;
}

/* The panels in c->in[3] when they are the packed form of an [N, K] weight, else NULL. */
static const float *prepacked(const fm_op_call *c, int64_t N, int64_t K) {
    const fm_tensor *pk = c->in[3];
    if (!pk || pk->dtype != FM_F32 || pk->ndim != 1 || pk->shape[0] != 3 + fm_linear_packed_numel(N, K)) return NULL;
    const float *h = fm_tensor_data(pk);
    return h[0] == 1.0f && h[1] == (float)N && h[2] == (float)K ? h + 3 : NULL;
}

/* the AVX-512 kernel when the level allows it, else AVX2: both give the same bits */
static void packed(const fm_linear_packed *d, int64_t i0, int64_t i1, int64_t p0, int64_t p1) {
    if (fm_cpu_use_avx512()) fm_linear_packed_f32_avx512(d, i0, i1, p0, p1);
    else fm_linear_packed_f32_avx2(d, i0, i1, p0, p1);
}

/* act_op on n floats at y, in place: the vector loops of the elementwise kernels (the
 * values fm_gelu and the rest give), else the scalar reference. */
static void act_f32(fm_op_id op, float *y, int64_t n) {
    const fm_unary_attrs at = {0, 0};
    if (fm_cpu_use_avx512() && fm_ew_unary_f32_avx512(op, &at, y, y, n, false)) return;
    if (fm_cpu_use_avx2() && fm_ew_unary_f32_avx2(op, &at, y, y, n, false)) return;
    for (int64_t i = 0; i < n; i++) y[i] = (float)fm_ew_unary_scalar(op, &at, y[i]);
}

/* The activation on rows i0..i1 and columns c0..c1 of y (rows ldy apart). */
static void act_block(const fm_linear_fused_attrs *a, float *y, int64_t ldy, int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
    if (!a->act || c1 <= c0) return;
    for (int64_t i = i0; i < i1; i++) act_f32(a->act_op, y + i * ldy + c0, c1 - c0);
}

typedef struct split { const fm_linear_packed *d; const fm_linear_fused_attrs *a; bool by_panels; } split;

/* Rows between the activation passes, whole tiles of FM_LINEAR_MR: 60 rows of at most a
 * few thousand columns stay in L2 while the activation reads them back. */
#define ACT_ROWS (10 * FM_LINEAR_MR)

static void packed_rows(const fm_linear_packed *d, const fm_linear_fused_attrs *a, int64_t i0, int64_t i1) {
    const int64_t P = fm_linear_panels(d->N), step = a->act ? ACT_ROWS : i1 - i0;
    for (int64_t i = i0; i < i1; i += step) {
        const int64_t e = i + step < i1 ? i + step : i1;
        packed(d, i, e, 0, P);
        act_block(a, d->y, d->ldy, i, e, 0, d->N);
    }
}

static void packed_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const split *s = vctx;
    const fm_linear_packed *d = s->d;
    if (s->by_panels) {
        packed(d, 0, d->M, b, e);
        const int64_t c1 = e * FM_LINEAR_NR < d->N ? e * FM_LINEAR_NR : d->N;
        act_block(s->a, d->y, d->ldy, 0, d->M, b * FM_LINEAR_NR, c1);
    } else packed_rows(d, s->a, b * FM_LINEAR_MR, e * FM_LINEAR_MR < d->M ? e * FM_LINEAR_MR : d->M);
}

/* Threads split the panels when x is the smaller operand (each reads all of x and
 * its share of the weights), else the rows in tiles of FM_LINEAR_MR; below 2^18
 * multiply-adds (as fm_cpu_gemm) the calling thread does it all. The split does
 * not change any output's sum. */
static void run_packed(const fm_linear_packed *d, const fm_linear_fused_attrs *a) {
    const int nt = fm_num_threads();
    const int64_t P = fm_linear_panels(d->N), R = (d->M + FM_LINEAR_MR - 1) / FM_LINEAR_MR;
    const bool by_panels = d->M <= d->N || R < 2;
    const int64_t units = by_panels ? P : R;
    if (nt <= 1 || units < 2 || d->M * d->N * d->K < ((int64_t)1 << 18)) {
        packed_rows(d, a, 0, d->M);
        return;
    }
    split s = {d, a, by_panels};
    fm_parallel_for(units, (units + nt - 1) / nt, packed_task, &s);
}

static void relu_rows(fm_tensor *y) {
    const int64_t n = fm_tensor_numel(y);
    if (y->dtype == FM_F32) {
        float *p = fm_tensor_data(y);
        for (int64_t i = 0; i < n; i++) p[i] = p[i] > 0 || p[i] != p[i] ? p[i] : 0.0f;
    } else {
        double *p = fm_tensor_data(y);
        for (int64_t i = 0; i < n; i++) p[i] = p[i] > 0 || p[i] != p[i] ? p[i] : 0.0;
    }
}

static fm_status linear_fused_kernel(const fm_op_call *c) {
    const fm_linear_fused_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    fm_tensor *y = c->out[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    const int64_t N = w->shape[0], K = w->shape[1], M = N ? fm_tensor_numel(y) / N : 0;
    if (M == 0 || N == 0) return FM_OK;
    const float *wp = x->dtype == FM_F32 && K > 0 && fm_cpu_use_avx2() ? prepacked(c, N, K) : NULL;
    if (wp) {
        fm_linear_packed d = {fm_tensor_data(x), wp, b ? fm_tensor_data(b) : NULL, fm_tensor_data(y), M, N, K, K, N, a->relu != 0};
        run_packed(&d, a);
        return FM_OK;
    }
    fm_cpu_gemm_bias(&(fm_cpu_gemm_args){x->dtype, false, true, M, N, K, fm_tensor_data(x), K > 0 ? K : 1, fm_tensor_data(w),
                                         K > 0 ? K : 1, 0.0, fm_tensor_data(y), N},
                     b ? fm_tensor_data(b) : NULL);
    if (a->relu) relu_rows(y);
    if (a->act && y->dtype == FM_F32) act_block(a, fm_tensor_data(y), N, 0, M, 0, N);
    else if (a->act) {
        const fm_unary_attrs at = {0, 0};
        double *p = fm_tensor_data(y);
        for (int64_t i = 0; i < M * N; i++) p[i] = fm_ew_unary_scalar(a->act_op, &at, p[i]);
    }
    return FM_OK;
}

void fm_cpu_kernels_linear_fused(fm_backend *b) {
    b->kernels[FM_OP_LINEAR_FUSED] = linear_fused_kernel;
    b->kernels[FM_OP_LINEAR_FUSED_PACK] = linear_fused_pack_kernel;
}
