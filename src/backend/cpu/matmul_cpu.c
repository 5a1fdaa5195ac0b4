/* CPU matmul through fm_cpu_gemm (OpenBLAS per block, split over fathom's
 * pool: gemm_cpu.c). Operands may be transposed views: a matrix whose columns
 * are contiguous is passed transposed instead of being copied. Batches run one
 * GEMM after another. f16/bf16 operands are widened to f32 and the result
 * narrowed, with f32 accumulation (bf16 on the bf16 hardware: bf16_hw); an f32
 * output for f16/bf16 operands receives the f32 result unrounded. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/dtype_internal.h"
#include "core/parallel.h"

typedef struct mat {
    const char *p;
    int64_t ld;
    bool trans;
} mat;

/* Describe a [R, C] matrix at element offset off with strides (sr, sc). */
static bool as_blas(const char *base, size_t es, int64_t off, int64_t R, int64_t C, int64_t sr, int64_t sc, mat *m) {
    m->p = base + off * (int64_t)es;
    if ((sc == 1 || C == 1) && (sr >= C || R == 1)) { m->trans = false; m->ld = R == 1 ? (C > 0 ? C : 1) : sr; if (m->ld < C) m->ld = C; return true; }
    if ((sr == 1 || R == 1) && (sc >= R || C == 1)) { m->trans = true; m->ld = C == 1 ? (R > 0 ? R : 1) : sc; if (m->ld < R) m->ld = R; return true; }
    return false;
}

static void pack(const char *base, fm_dtype dt, int64_t off, int64_t R, int64_t C, int64_t sr, int64_t sc, void *dst, fm_dtype to) {
    size_t es = fm_dtype_size(dt);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            double v = fm_load_f64(base + (off + r * sr + c * sc) * (int64_t)es, dt);
            if (to == FM_F32) ((float *)dst)[r * C + c] = (float)v;
            else ((double *)dst)[r * C + c] = v;
        }
}

/* f16/bf16 -> f32 with the SIMD converters, a contiguous run at a time: rows when
 * the rows are contiguous, else columns (the packed matrix is then the transpose).
 * False when neither is contiguous (pack() then converts element by element). */
static bool widen_lowp(const char *base, fm_dtype dt, int64_t off, int64_t R, int64_t C, int64_t sr, int64_t sc,
                       float *dst, mat *m) {
    if (dt != FM_F16 && dt != FM_BF16) return false;
    bool rows = sc == 1 || C == 1, cols = !rows && (sr == 1 || R == 1);
    if (!rows && !cols) return false;
    int64_t runs = rows ? R : C, len = rows ? C : R, step = rows ? sr : sc;
    for (int64_t i = 0; i < runs; i++) {
        const uint16_t *src = (const uint16_t *)base + off + i * step;
        if (dt == FM_BF16) fm_convert_bf16_to_f32(src, dst + i * len, (size_t)len);
        else fm_convert_f16_to_f32(src, dst + i * len, (size_t)len);
    }
    *m = (mat){(const char *)dst, len > 0 ? len : 1, cols};
    return true;
}

/* One bf16 product on the bf16 hardware (fm_cpu_gemm_bf16: oneDNN), when both
 * operands can be described without a copy: the result goes straight into y, as
 * oneDNN rounds it to bf16 on the store (or as f32 for the mixed linear). Rounding
 * there instead of in a second pass over an f32 copy saved the copy's allocation
 * and a single-threaded pass: 1024^3 measured 384-396 GFLOP/s before and 381-431 after on the AMD EPYC
 * Zen 4 (bench/bench_core.c). False: take the widening path. */
static bool bf16_hw(const fm_op_call *c, fm_tensor *y, int64_t oa, int64_t ob, int64_t bi, int64_t M, int64_t N,
                    int64_t K, const float *bias) {
    const fm_tensor *a = c->in[0], *b = c->in[1];
    int nd = y->ndim;
    mat ma, mb;
    if (!as_blas(a->storage->data, 2, oa, M, K, a->strides[nd - 2], a->strides[nd - 1], &ma) ||
        !as_blas(b->storage->data, 2, ob, K, N, b->strides[nd - 2], b->strides[nd - 1], &mb))
        return false;
    /* an f32 output (the mixed linear's) takes the accumulator as it is */
    bool c_bf16 = y->dtype == FM_BF16;
    void *out = (char *)y->storage->data + (y->offset + bi * M * N) * (int64_t)fm_dtype_size(y->dtype);
    fm_cpu_gemm_args g = {FM_BF16, ma.trans, mb.trans, M, N, K, ma.p, ma.ld, mb.p, mb.ld, 0.0, out, N};
    return fm_cpu_gemm_bf16(&g, bias, c_bf16);
}

static fm_status k_matmul(const fm_op_call *c) {
    fm_tensor *a = c->in[0], *b = c->in[1], *y = c->out[0];
    int nd = y->ndim;
    int64_t M = y->shape[nd - 2], N = y->shape[nd - 1], K = a->shape[nd - 1];
    fm_dtype dt = a->dtype;
    if (!fm_dtype_is_float(dt)) return fm_cpu_unsupported_dtype(c, dt);
    fm_dtype ct = dt == FM_F64 ? FM_F64 : FM_F32;
    /* y is a's dtype, or f32 for f16/bf16 operands (the mixed linear: the f32 accumulator kept) */
    if (y->dtype != dt && !(y->dtype == FM_F32 && ct == FM_F32))
        return fm_set_error(FM_ERR_INVALID, "matmul: %s output for %s operands", fm_dtype_name(y->dtype), fm_dtype_name(dt));
    size_t es = fm_dtype_size(dt), cs = fm_dtype_size(ct);
    int64_t batch = 1;
    for (int i = 0; i < nd - 2; i++) batch *= y->shape[i];
    bool widen = dt != ct, narrow = y->dtype != ct;
    void *ta = NULL, *tb = NULL, *tc = NULL, *tbias = NULL;
    fm_status st = FM_OK;
    /* optional third input: a bias [N] added to every row (linear) */
    const void *bias = NULL;
    if (c->n_in > 2) {
        fm_tensor *bt = c->in[2];
        if (bt->dtype != ct || bt->strides[0] != 1) {
            if (!(tbias = malloc((size_t)(N > 0 ? N : 1) * cs))) return fm_set_error(FM_ERR_OOM, "matmul: out of memory");
            pack(bt->storage->data, bt->dtype, bt->offset, 1, N, 0, bt->strides[0], tbias, ct);
            bias = tbias;
        } else {
            bias = (const char *)bt->storage->data + bt->offset * (int64_t)cs;
        }
    }
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t rem = bi, oa = a->offset, ob = b->offset;
        for (int i = nd - 3; i >= 0; i--) {
            int64_t ix = rem % y->shape[i];
            rem /= y->shape[i];
            oa += ix * a->strides[i];
            ob += ix * b->strides[i];
        }
        mat ma, mb;
        if (dt == FM_BF16 && bf16_hw(c, y, oa, ob, bi, M, N, K, (const float *)bias)) continue;
        bool okA = !widen && as_blas(a->storage->data, es, oa, M, K, a->strides[nd - 2], a->strides[nd - 1], &ma);
        bool okB = !widen && as_blas(b->storage->data, es, ob, K, N, b->strides[nd - 2], b->strides[nd - 1], &mb);
        if (!okA) {
            if (!ta && !(ta = malloc((size_t)(M * K > 0 ? M * K : 1) * cs))) { st = fm_set_error(FM_ERR_OOM, "matmul: out of memory"); break; }
            if (!widen_lowp(a->storage->data, dt, oa, M, K, a->strides[nd - 2], a->strides[nd - 1], ta, &ma)) {
                pack(a->storage->data, dt, oa, M, K, a->strides[nd - 2], a->strides[nd - 1], ta, ct);
                ma = (mat){ta, K > 0 ? K : 1, false};
            }
        }
        if (!okB) {
            if (!tb && !(tb = malloc((size_t)(K * N > 0 ? K * N : 1) * cs))) { st = fm_set_error(FM_ERR_OOM, "matmul: out of memory"); break; }
            if (!widen_lowp(b->storage->data, dt, ob, K, N, b->strides[nd - 2], b->strides[nd - 1], tb, &mb)) {
                pack(b->storage->data, dt, ob, K, N, b->strides[nd - 2], b->strides[nd - 1], tb, ct);
                mb = (mat){tb, N > 0 ? N : 1, false};
            }
        }
        void *out = (char *)y->storage->data + (y->offset + bi * M * N) * (int64_t)fm_dtype_size(y->dtype);
        if (narrow) {
            if (!tc && !(tc = malloc((size_t)(M * N > 0 ? M * N : 1) * cs))) { st = fm_set_error(FM_ERR_OOM, "matmul: out of memory"); break; }
            out = tc;
        }
        fm_cpu_gemm_bias(&(fm_cpu_gemm_args){ct, ma.trans, mb.trans, M, N, K, ma.p, ma.ld, mb.p, mb.ld, 0.0, out, N}, bias);
        if (narrow) {
            char *dst = (char *)y->storage->data + (y->offset + bi * M * N) * (int64_t)fm_dtype_size(y->dtype);
            if (y->dtype == FM_F16) fm_convert_f32_to_f16(tc, (uint16_t *)dst, (size_t)(M * N));
            else fm_convert_f32_to_bf16(tc, (uint16_t *)dst, (size_t)(M * N));
        }
    }
    free(ta);
    free(tb);
    free(tc);
    free(tbias);
    return st;
}

void fm_cpu_kernels_matmul(fm_backend *b) { b->kernels[FM_OP_MATMUL] = k_matmul; }
