/* CPU kernels of the quantized ops (ops.def QLINEAR_INT8, QLINEAR_INT4,
 * QEMBEDDING_INT4): the glue around quant_kernels.h. qlinear_int8 quantizes
 * the activations (range, scale, u8 codes) and runs the integer product with
 * the f32 epilogue fused; on weights in rows (files from before the panels)
 * it also sums each weight row for the zero point's correction, which the
 * panel layout stores. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/conv_geom.h" /* fm_cpu_qlinear8_scratch */
#include "backend/cpu/quant_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

static fm_status oom(const char *op) { return fm_set_error(FM_ERR_OOM, "%s: out of host memory for the quantized activations", op); }

static void row_sums(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const fm_q8_gemm *g = ctx;
    int32_t *s = (int32_t *)g->ep->w_sum;
    for (int64_t n = b; n < e; n++) {
        int32_t acc = 0;
        for (int64_t k = 0; k < g->K; k++) acc += g->B[n * g->ldb + k];
        s[n] = acc;
    }
}

/* The activation quantization runs on the pool, in row blocks of at least
 * Q8_ROWS_ELEMS values (below that a hand-off costs more than the pass): at the
 * kjv-gpt prefill's shapes the two serial passes (range, codes) left the other
 * thread spinning for about a tenth of the int8 prefill (perf, bench_quant
 * --profile-prefill int8). The range is the min and max of the blocks' ranges,
 * the codes are per element: the same values as one serial pass. */
#define Q8_ROWS_ELEMS 16384
#define Q8_MAX_BLOCKS 64

typedef struct q8_rows_job {
    const float *x;
    int64_t K, lda, rows; /* rows per block */
    int64_t M;
    float scale;
    int32_t zero;
    uint8_t *q;
    float mn[Q8_MAX_BLOCKS], mx[Q8_MAX_BLOCKS];
    bool v512, v256;
} q8_rows_job;

/* The range and the codes of n values at the CPU's level (the same values at every level) */
static void q8_range_at(bool v512, bool v256, const float *x, int64_t n, float *mn, float *mx) {
    if (v512) fm_q8_range_avx512(x, n, mn, mx);
    else if (v256) fm_q8_range_avx2(x, n, mn, mx);
    else fm_q8_range(x, n, mn, mx);
}

static void q8_codes_at(bool v512, bool v256, const float *x, int64_t n, float scale, int32_t zero, uint8_t *q) {
    if (v512) fm_q8_quantize_avx512(x, n, 1.0f / scale, zero, q);
    else if (v256) fm_q8_quantize_avx2(x, n, scale, zero, q);
    else fm_q8_quantize(x, n, scale, zero, q);
}

void fm_q8_codes_at_level(const float *x, int64_t n, float scale, int32_t zero, uint8_t *q) {
    q8_codes_at(fm_cpu_use_avx512(), fm_cpu_use_avx2(), x, n, scale, zero, q);
}

static void range_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    q8_rows_job *j = ctx;
    for (int64_t c = b; c < e; c++) {
        int64_t m0 = c * j->rows, m1 = m0 + j->rows < j->M ? m0 + j->rows : j->M, n = (m1 - m0) * j->K;
        q8_range_at(j->v512, j->v256, j->x + m0 * j->K, n, &j->mn[c], &j->mx[c]);
    }
}

static void codes_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const q8_rows_job *j = ctx;
    int64_t m0 = b * j->rows, m1 = e * j->rows < j->M ? e * j->rows : j->M;
    for (int64_t m = m0; m < m1; m += j->lda == j->K ? m1 - m0 : 1) { /* one call when the rows are dense */
        int64_t n = j->lda == j->K ? (m1 - m0) * j->K : j->K;
        const float *x = j->x + m * j->K;
        uint8_t *q = j->q + m * j->lda;
        q8_codes_at(j->v512, j->v256, x, n, j->scale, j->zero, q);
        if (j->lda > j->K) memset(q + j->K, 0, (size_t)(j->lda - j->K));
    }
}

/* The job over x [M, K] in row blocks of about Q8_ROWS_ELEMS values (at most Q8_MAX_BLOCKS); the block count */
static int64_t rows_job_init(q8_rows_job *j, const float *xp, int64_t M, int64_t K, int64_t lda, uint8_t *q) {
    *j = (q8_rows_job){.x = xp, .K = K, .lda = lda, .M = M, .q = q, .v512 = fm_cpu_use_avx512(), .v256 = fm_cpu_use_avx2()};
    j->rows = K > 0 && K < Q8_ROWS_ELEMS ? Q8_ROWS_ELEMS / K : 1;
    if ((M + j->rows - 1) / j->rows > Q8_MAX_BLOCKS) j->rows = (M + Q8_MAX_BLOCKS - 1) / Q8_MAX_BLOCKS;
    return M > 0 ? (M + j->rows - 1) / j->rows : 0;
}

static void scale_of_job(q8_rows_job *j, int64_t blocks, double a_scale, int32_t a_zero, float *scale, int32_t *zero) {
    *scale = (float)a_scale;
    *zero = a_zero;
    if (!(*scale > 0)) { /* dynamic: this batch's range */
        float mn = 0.0f, mx = 0.0f;
        fm_parallel_for(blocks, 1, range_task, j);
        for (int64_t c = 0; c < blocks; c++) {
            mn = j->mn[c] < mn ? j->mn[c] : mn;
            mx = j->mx[c] > mx ? j->mx[c] : mx;
        }
        fm_q8_params(mn, mx, scale, zero);
    }
}

void fm_q8_scale_of(const float *xp, int64_t M, int64_t K, double a_scale, int32_t a_zero, float *scale, int32_t *zero) {
    q8_rows_job j;
    const int64_t blocks = rows_job_init(&j, xp, M, K, K, NULL);
    scale_of_job(&j, blocks, a_scale, a_zero, scale, zero);
}

void fm_q8_quantize_rows(const float *xp, int64_t M, int64_t K, int64_t lda, double a_scale, int32_t a_zero, float *scale, int32_t *zero,
                         uint8_t *q) {
    q8_rows_job j;
    const int64_t blocks = rows_job_init(&j, xp, M, K, lda, q);
    scale_of_job(&j, blocks, a_scale, a_zero, scale, zero);
    j.scale = *scale;
    j.zero = *zero;
    fm_parallel_for(blocks, 1, codes_task, &j);
}

int64_t fm_cpu_qlinear8_scratch(const fm_op_call *c) {
    const fm_tensor *x = c->in[0];
    const int64_t K = x->shape[x->ndim - 1], M = K ? fm_tensor_numel(x) / K : 0, lda = c->in[1]->ndim == 4 ? 4 * ((K + 3) / 4) : K;
    return M * lda > 0 ? M * lda : 1;
}

/* Per-row dynamic (FM_QLINEAR_INT8_PER_ROW): each row's codes at its own range, then
 * the kernels' epilogue with the row's scale and zero point (fm_q8_epilogue.row_scale).
 * The integer sums are exact and the epilogue reads only the row's values, so a row's
 * output is the same whatever rows share the call (bitwise the per-call dynamic
 * product of that row alone). */
static fm_status qlinear8_rows_kernel(const fm_op_call *c) {
    const fm_qlinear8_attrs *at = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1];
    const int64_t N = c->in[2]->shape[0], K = x->shape[x->ndim - 1], M = K ? fm_tensor_numel(x) / K : 0;
    const int64_t lda = 4 * ((K + 3) / 4);
    if (w->ndim != 4) return fm_set_error(FM_ERR_INVALID, "qlinear_int8: per-row activation scales take the weights as panels");
    int64_t qn = fm_cpu_qlinear8_scratch(c);
    fm_tensor *qt = fm_tensor_zeros(1, &qn, FM_U8, FM_CPU); /* zeros past K: the panels' padding */
    uint8_t *q = qt ? fm_tensor_data(qt) : NULL;
    float *sc = malloc(sizeof(float) * (size_t)(M > 0 ? M : 1));
    int32_t *zp = malloc(sizeof(int32_t) * (size_t)(M > 0 ? M : 1));
    if (!q || !sc || !zp) {
        fm_tensor_release(qt);
        free(sc);
        free(zp);
        return oom("qlinear_int8");
    }
    const float *xp = fm_tensor_data(x);
    const bool v512 = fm_cpu_use_avx512(), v256 = fm_cpu_use_avx2();
    for (int64_t m = 0; m < M; m++) {
        const float *xr = xp + m * K;
        float mn, mx;
        q8_range_at(v512, v256, xr, K, &mn, &mx);
        fm_q8_params(mn, mx, &sc[m], &zp[m]);
        q8_codes_at(v512, v256, xr, K, sc[m], zp[m], q + m * lda);
    }
    fm_q8_epilogue ep = {0.0f, 0, fm_tensor_data(c->in[2]), fm_tensor_data(c->in[4]), c->in[3] ? fm_tensor_data(c->in[3]) : NULL,
                         fm_tensor_data(c->out[0]), N, at->act, sc, zp};
    fm_q8_pgemm g = {M, N, K, q, lda, fm_tensor_data(w), NULL, 0, &ep, false};
    fm_q8_pgemm_run(&g, fm_q8_impl_best());
    fm_tensor_release(qt);
    free(sc);
    free(zp);
    return FM_OK;
}

/* QLINEAR_INT8: in = {x [M, K] f32, w i8 (rows or panels), w_scale [N], bias|NULL, w_sum|NULL} */
static fm_status qlinear8_kernel(const fm_op_call *c) {
    const fm_qlinear8_attrs *at = c->attrs;
    if (at->per_row) return qlinear8_rows_kernel(c);
    const fm_tensor *x = c->in[0], *w = c->in[1];
    const bool panels = w->ndim == 4;
    const int64_t N = c->in[2]->shape[0], K = x->shape[x->ndim - 1], M = K ? fm_tensor_numel(x) / K : 0;
    const int64_t lda = panels ? 4 * ((K + 3) / 4) : K;
    /* the codes in a tensor of the caching allocator: a block reused call after call, where a
     * malloc of the prefill's 256 KiB went to mmap and faulted its pages in on every call */
    int64_t qn = fm_cpu_qlinear8_scratch(c);
    fm_tensor *qt = fm_tensor_empty(1, &qn, FM_U8, FM_CPU);
    uint8_t *q = qt ? fm_tensor_data(qt) : NULL;
    int32_t *wsum = panels ? NULL : malloc(sizeof(int32_t) * (size_t)(N > 0 ? N : 1));
    if (!q || (!panels && !wsum)) { fm_tensor_release(qt); free(wsum); return oom("qlinear_int8"); }
    float scale;
    int32_t zero;
    fm_q8_quantize_rows(fm_tensor_data(x), M, K, lda, at->a_scale, at->a_zero, &scale, &zero, q);
    fm_q8_epilogue ep = {scale, zero, fm_tensor_data(c->in[2]), panels ? fm_tensor_data(c->in[4]) : wsum,
                         c->in[3] ? fm_tensor_data(c->in[3]) : NULL, fm_tensor_data(c->out[0]), N, at->act, NULL, NULL};
    if (panels) {
        fm_q8_pgemm g = {M, N, K, q, lda, fm_tensor_data(w), NULL, 0, &ep, false};
        fm_q8_pgemm_run(&g, fm_q8_impl_best());
    } else {
        fm_q8_gemm g = {M, N, K, q, K, fm_tensor_data(w), K, NULL, 0, &ep};
        fm_parallel_for(N, 256, row_sums, &g);
        fm_q8_gemm_run(&g, fm_q8_impl_best());
    }
    fm_tensor_release(qt);
    free(wsum);
    return FM_OK;
}

/* QLINEAR_INT4: in = {x [M, K] f32, w [N, K/2] u8, scale, min|NULL, bias|NULL} */
static fm_status qlinear4_kernel(const fm_op_call *c) {
    const fm_q4_attrs *at = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1];
    const int64_t N = w->shape[0], K = 2 * w->shape[1], G = at->group, M = K ? fm_tensor_numel(x) / K : 0, ng = K / G;
    const float *xp = fm_tensor_data(x);
    float *xs = malloc(sizeof(float) * (size_t)(M * ng > 0 ? M * ng : 1));
    if (!xs) return oom("qlinear_int4");
    for (int64_t m = 0; m < M; m++)
        for (int64_t gi = 0; gi < ng; gi++) {
            float s = 0.0f;
            for (int64_t k = gi * G; k < (gi + 1) * G; k++) s += xp[m * K + k];
            xs[m * ng + gi] = s;
        }
    fm_q4_gemm g = {M, N, K, G, xp, K, fm_tensor_data(w), fm_tensor_data(c->in[2]), c->in[3] ? fm_tensor_data(c->in[3]) : NULL,
                    c->in[4] ? fm_tensor_data(c->in[4]) : NULL, xs, fm_tensor_data(c->out[0]), N, NULL, NULL, NULL, false};
    fm_q4_gemm_run(&g, fm_q4_impl_best());
    free(xs);
    return FM_OK;
}

/* Row i's index of a lookup, checked against the table's V rows. */
static fm_status lookup_row(const char *op, const fm_tensor *idx, int64_t i, int64_t V, int64_t *r) {
    *r = idx->dtype == FM_I64 ? ((const int64_t *)fm_tensor_data(idx))[i] : ((const int32_t *)fm_tensor_data(idx))[i];
    if (*r < 0 || *r >= V)
        return fm_set_error(FM_ERR_INVALID, "%s: index %lld at position %lld is outside the table's %lld rows", op, (long long)*r,
                            (long long)i, (long long)V);
    return FM_OK;
}

/* QEMBEDDING_INT4: in = {w [V, D/2] u8, scale, min|NULL, indices} */
static fm_status qembedding4_kernel(const fm_op_call *c) {
    const fm_q4_attrs *at = c->attrs;
    const fm_tensor *w = c->in[0], *idx = c->in[3];
    const int64_t V = w->shape[0], D = 2 * w->shape[1], ng = D / at->group, n = fm_tensor_numel(idx);
    const uint8_t *wp = fm_tensor_data(w);
    const uint16_t *sc = fm_tensor_data(c->in[1]), *mi = c->in[2] ? fm_tensor_data(c->in[2]) : NULL;
    float *y = fm_tensor_data(c->out[0]);
    for (int64_t i = 0; i < n; i++) {
        int64_t r;
        if (lookup_row("qembedding_int4", idx, i, V, &r)) return fm_last_status();
        fm_q4_dequant_row(wp + r * (D / 2), sc + r * ng, mi ? mi + r * ng : NULL, D, at->group, y + i * D);
    }
    return FM_OK;
}

/* One row of an int8 table (the scalar level's; the vector ones in quant_avx2.c and
 * quant_avx512.c). Element by element with the scale reloaded after every store
 * (-fno-strict-aliasing), the row took about 4 cycles per element: 61 us of a 1.7 ms
 * kjv-gpt int8 prefill (512 rows of 128); with the AVX-512 rows the call takes 12.6 us. */
static void q8_table_row(const int8_t *panel_row, int64_t D, float s, float *y) {
    for (int64_t k = 0; k < D; k++) y[k] = s * (float)panel_row[(k >> 2) * 64 + (k & 3)];
}

/* QEMBEDDING_INT8: in = {panels, scale [V], indices}: each row's codes times its scale */
static fm_status qembedding8_kernel(const fm_op_call *c) {
    const fm_q8emb_attrs *at = c->attrs;
    const fm_tensor *idx = c->in[2];
    const int64_t V = c->in[1]->shape[0], D = at->dim, Kq = (D + 3) / 4, n = fm_tensor_numel(idx);
    const int8_t *P = fm_tensor_data(c->in[0]);
    const float *sc = fm_tensor_data(c->in[1]);
    float *y = fm_tensor_data(c->out[0]);
    void (*row)(const int8_t *, int64_t, float, float *) =
        fm_cpu_use_avx512() ? fm_q8_table_row_avx512 : fm_cpu_use_avx2() ? fm_q8_table_row_avx2 : q8_table_row;
    for (int64_t i = 0; i < n; i++) {
        int64_t r;
        if (lookup_row("qembedding_int8", idx, i, V, &r)) return fm_last_status();
        row(P + fm_q8_panel_index(Kq, r, 0), D, sc[r], y + i * D);
    }
    return FM_OK;
}

void fm_cpu_kernels_quant(fm_backend *b) {
    b->kernels[FM_OP_QLINEAR_INT8] = qlinear8_kernel;
    b->kernels[FM_OP_QLINEAR_INT4] = qlinear4_kernel;
    b->kernels[FM_OP_QEMBEDDING_INT4] = qembedding4_kernel;
    b->kernels[FM_OP_QEMBEDDING_INT8] = qembedding8_kernel;
}
