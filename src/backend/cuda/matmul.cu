/* CUDA matmul through cuBLASLt, with its bias and GELU epilogues available to
 * fused callers (fm_cuda_gemm_rowmajor, fm_cuda_gemm_raw).
 *
 * fathom is row-major and cuBLASLt column-major: a row-major [R, C] matrix is
 * a column-major [C, R] one, so Y = A B is computed as Y^T = B^T A^T with the
 * operands swapped, and no data moves. Transposed views (unit row stride) are
 * passed as transposed operands; a batch whose dims collapse to one stride per
 * operand (broadcast batch dims have stride 0) is a single strided-batched
 * call, any other batch layout a loop. f32 runs in true f32 (TF32 only when
 * FATHOM_CUDA_TF32=1, since it fails the 1e-6 conformance bound), f16/bf16 on
 * tensor cores with f32 accumulation, f64 in f64. The heuristic's choice is
 * cached per shape, as a training step repeats the same GEMMs. */
#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "fathom/autograd.h"

typedef struct gemm_desc {
    int64_t m, n, k;        /* column-major problem: D[m, n] = op(A)[m, k] op(B)[k, n] */
    int ta, tb;
    int64_t lda, ldb, ldd;
    int64_t sa, sb, sd;     /* batch strides (elements) */
    int64_t batch;
    int dt, epi;
    int accumulate;         /* beta = 1 (D += op(A) op(B)) instead of 0 */
    int align_a, align_b, align_d; /* pointer alignment in bytes (<= 256): part of the algorithm's key */
} gemm_desc;

/* cuBLASLt assumes 256-byte aligned operands unless told otherwise; views and the
 * per-group slices of conv2d are not, so the real alignment goes into the preference. */
static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int r = 1;
    while (r < 256 && !(a & (uintptr_t)r)) r <<= 1;
    return r;
}

typedef struct algo_slot {
    gemm_desc key;
    cublasLtMatmulAlgo_t algo;
    int valid;
} algo_slot;

#define N_SLOTS 256
static algo_slot g_algo[N_SLOTS];
static pthread_mutex_t g_algo_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned hash_desc(const gemm_desc *d) {
    const unsigned char *p = (const unsigned char *)d;
    unsigned h = 2166136261u;
    for (size_t i = 0; i < sizeof *d; i++) h = (h ^ p[i]) * 16777619u;
    return h % N_SLOTS;
}

static cudaDataType_t data_type(int dt) {
    switch (dt) {
    case FM_F16: return CUDA_R_16F;
    case FM_BF16: return CUDA_R_16BF;
    case FM_F64: return CUDA_R_64F;
    default: return CUDA_R_32F;
    }
}

/* Epilogue codes for fm_cuda_gemm_rowmajor: 0 none, 1 bias, 2 gelu(tanh) + bias, 3 gelu (tanh). */
static cublasLtEpilogue_t epilogue(int e) {
    switch (e) {
    case 1: return CUBLASLT_EPILOGUE_BIAS;
    case 2: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case 3: return CUBLASLT_EPILOGUE_GELU;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

#define LT_TRY(x) do { cublasStatus_t _s = (x); if (_s != CUBLAS_STATUS_SUCCESS) { st = _s; goto done; } } while (0)

/* Column-major batched GEMM with an optional epilogue; bias has m elements. */
static fm_status lt_gemm(const gemm_desc *d0, const void *A, const void *B, void *D, const void *bias, const char *opname) {
    gemm_desc dd = *d0, *d = &dd;
    dd.align_a = ptr_align(A);
    dd.align_b = ptr_align(B);
    dd.align_d = ptr_align(D);
    uint32_t al_a = (uint32_t)dd.align_a, al_b = (uint32_t)dd.align_b, al_d = (uint32_t)dd.align_d;
    cublasLtHandle_t h = (cublasLtHandle_t)fm_cuda_lt_handle();
    if (!h) return fm_set_error(FM_ERR_INTERNAL, "%s: cublasLtCreate failed", opname);
    size_t ws_bytes = 0;
    void *ws = fm_cuda_lt_workspace(&ws_bytes);
    cudaDataType_t t = data_type(d->dt);
    cublasComputeType_t ct = d->dt == FM_F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    if (d->dt == FM_F32 && getenv("FATHOM_CUDA_TF32")) ct = CUBLAS_COMPUTE_32F_FAST_TF32;
    cudaDataType_t scale_t = d->dt == FM_F64 ? CUDA_R_64F : CUDA_R_32F;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    cublasOperation_t opa = d->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = d->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = epilogue(d->epi);
    int32_t batch = (int32_t)d->batch;
    float one_f = 1.f, zero_f = 0.f;
    double one_d = 1.0, zero_d = 0.0;
    const void *alpha = d->dt == FM_F64 ? (const void *)&one_d : (const void *)&one_f;
    const void *beta = d->dt == FM_F64 ? (const void *)(d->accumulate ? &one_d : &zero_d)
                                       : (const void *)(d->accumulate ? &one_f : &zero_f);
    unsigned slot = hash_desc(d);
    cublasLtMatmulAlgo_t algo;
    int have_algo = 0;

    LT_TRY(cublasLtMatmulDescCreate(&op, ct, scale_t));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (d->epi) {
        LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (bias) LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&la, t, d->ta ? d->k : d->m, d->ta ? d->m : d->k, d->lda));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, t, d->tb ? d->n : d->k, d->tb ? d->k : d->n, d->ldb));
    LT_TRY(cublasLtMatrixLayoutCreate(&ld, t, d->m, d->n, d->ldd));
    if (batch > 1) {
        LT_TRY(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &d->sa, sizeof d->sa));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &d->sb, sizeof d->sb));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &d->sd, sizeof d->sd));
    }
    pthread_mutex_lock(&g_algo_mu);
    if (g_algo[slot].valid && !memcmp(&g_algo[slot].key, d, sizeof *d)) { algo = g_algo[slot].algo; have_algo = 1; }
    pthread_mutex_unlock(&g_algo_mu);
    if (!have_algo) {
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
        LT_TRY(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &res, &found));
        if (!found) { st = CUBLAS_STATUS_NOT_SUPPORTED; goto done; }
        algo = res.algo;
        pthread_mutex_lock(&g_algo_mu);
        g_algo[slot].key = *d;
        g_algo[slot].algo = algo;
        g_algo[slot].valid = 1;
        pthread_mutex_unlock(&g_algo_mu);
    }
    LT_TRY(cublasLtMatmul(h, op, alpha, A, la, B, lb, beta, D, ld, D, ld, &algo, ws, ws_bytes, fm_cuda_stream()));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (op) cublasLtMatmulDescDestroy(op);
    if (st != CUBLAS_STATUS_SUCCESS)
        return fm_set_error(FM_ERR_INTERNAL, "%s: cuBLASLt failed with status %d (%s) for m=%lld n=%lld k=%lld batch=%lld",
                            opname, (int)st, cublasLtGetStatusString(st), (long long)d->m, (long long)d->n,
                            (long long)d->k, (long long)d->batch);
    return FM_OK;
}

/* A row-major [R, C] matrix with strides (sr, sc) as a column-major operand:
 * returns 0 if its layout needs packing. */
static int describe(int64_t R, int64_t C, int64_t sr, int64_t sc, int *trans, int64_t *ld) {
    if ((sc == 1 || C == 1) && (sr >= C || R == 1)) { *trans = 0; *ld = R == 1 ? (C > 0 ? C : 1) : sr; if (*ld < C) *ld = C; return 1; }
    if ((sr == 1 || R == 1) && (sc >= R || C == 1)) { *trans = 1; *ld = C == 1 ? (R > 0 ? R : 1) : sc; if (*ld < R) *ld = R; return 1; }
    return 0;
}

/* One stride for all batch dims (or 0 if broadcast throughout), else -1. */
static int64_t batch_stride(const fm_tensor *t, const int64_t *yshape, int nb) {
    int64_t s = -1, expect = -1;
    for (int i = nb - 1; i >= 0; i--) {
        if (yshape[i] == 1) continue;
        int64_t st = t->shape[i] == 1 ? 0 : t->strides[i];
        if (s < 0) { s = st; expect = st * yshape[i]; continue; }
        if (s == 0 ? st != 0 : st != expect) return -1;
        expect = st * yshape[i];
    }
    return s < 0 ? 0 : s;
}

extern "C" fm_status fm_cuda_gemm_rowmajor(const fm_tensor *a, const fm_tensor *b, fm_tensor *y, const void *bias, int epi,
                                           const char *opname) {
    int nd = y->ndim;
    int64_t M = y->shape[nd - 2], N = y->shape[nd - 1], K = a->shape[nd - 1];
    if (M == 0 || N == 0) return FM_OK;
    size_t es = fm_dtype_size(a->dtype);
    int nb = nd - 2;
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) batch *= y->shape[i];
    gemm_desc d;
    memset(&d, 0, sizeof d);
    d.dt = a->dtype;
    d.epi = epi;
    /* Y^T[N, M] = B^T[N, K] A^T[K, M] in column-major terms. */
    d.m = N; d.n = M; d.k = K; d.ldd = N;
    int tb_, ta_;
    int64_t ldb_, lda_;
    if (!describe(K, N, b->strides[nd - 2], b->strides[nd - 1], &tb_, &ldb_) ||
        !describe(M, K, a->strides[nd - 2], a->strides[nd - 1], &ta_, &lda_))
        return fm_set_error(FM_ERR_INTERNAL, "%s: operand layout needs packing", opname);
    /* B row-major untransposed [K,N] == column-major [N,K] == op N for the swapped problem. */
    d.ta = tb_; d.lda = ldb_;
    d.tb = ta_; d.ldb = lda_;
    if (K == 0) return cudaMemsetAsync(fm_tensor_data(y), 0, (size_t)(batch * M * N) * fm_dtype_size(y->dtype),
                                       fm_cuda_stream()) == cudaSuccess ? FM_OK : fm_cuda_check(cudaGetLastError(), opname);
    int64_t sa = batch_stride(a, y->shape, nb), sb = batch_stride(b, y->shape, nb);
    const char *pa = (const char *)a->storage->data + a->offset * (int64_t)es;
    const char *pb = (const char *)b->storage->data + b->offset * (int64_t)es;
    char *py = (char *)fm_tensor_data(y);
    if (batch == 1 || (sa >= 0 && sb >= 0)) {
        d.batch = batch;
        d.sa = sb; d.sb = sa; d.sd = M * N;
        return lt_gemm(&d, pb, pa, py, bias, opname);
    }
    d.batch = 1;
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t rem = bi, oa = 0, ob = 0;
        for (int i = nb - 1; i >= 0; i--) {
            int64_t ix = rem % y->shape[i];
            rem /= y->shape[i];
            oa += (a->shape[i] == 1 ? 0 : ix) * a->strides[i];
            ob += (b->shape[i] == 1 ? 0 : ix) * b->strides[i];
        }
        fm_status st = lt_gemm(&d, pb + ob * (int64_t)es, pa + oa * (int64_t)es, py + bi * M * N * (int64_t)fm_dtype_size(y->dtype),
                               bias, opname);
        if (st) return st;
    }
    return FM_OK;
}

extern "C" fm_status fm_cuda_gemm_raw(int dt, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                                      int64_t sa, const void *B, int64_t ldb, int64_t sb, void *C, int64_t ldc, int64_t sc,
                                      int64_t batch, int accumulate, const char *opname) {
    if (M <= 0 || N <= 0 || batch <= 0) return FM_OK;
    if (K <= 0) {
        if (accumulate) return FM_OK;
        return fm_set_error(FM_ERR_INTERNAL, "%s: empty GEMM reduction without accumulate", opname);
    }
    gemm_desc d;
    memset(&d, 0, sizeof d);
    d.dt = dt;
    d.accumulate = accumulate;
    /* Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T: swap the operands. */
    d.m = N; d.n = M; d.k = K;
    d.ta = tb; d.lda = ldb;
    d.tb = ta; d.ldb = lda;
    d.ldd = ldc;
    d.batch = batch;
    d.sa = sb; d.sb = sa; d.sd = sc;
    return lt_gemm(&d, B, A, C, NULL, opname);
}

static int needs_pack(const fm_tensor *t) {
    int nd = t->ndim, tr;
    int64_t ld;
    return !describe(t->shape[nd - 2], t->shape[nd - 1], t->strides[nd - 2], t->strides[nd - 1], &tr, &ld);
}

static fm_status k_matmul(const fm_op_call *c) {
    fm_tensor *a = c->in[0], *b = c->in[1], *y = c->out[0];
    fm_dtype dt = a->dtype;
    if (dt != FM_F32 && dt != FM_F64 && dt != FM_F16 && dt != FM_BF16) return fm_cuda_unsupported_dtype(c, dt);
    if (b->dtype != dt || y->dtype != dt) return fm_cuda_unsupported_dtype(c, b->dtype != dt ? b->dtype : y->dtype);
    fm_tensor *pa = NULL, *pb = NULL;
    bool prev = fm_set_grad_enabled(false);
    if (needs_pack(a)) pa = fm_contiguous(a);
    if (needs_pack(b)) pb = fm_contiguous(b);
    fm_set_grad_enabled(prev);
    if ((needs_pack(a) && !pa) || (needs_pack(b) && !pb)) { fm_tensor_release(pa); fm_tensor_release(pb); return fm_last_status(); }
    /* optional third input: a contiguous bias [N] of the same dtype (linear), cuBLASLt's bias epilogue */
    const void *bias = c->n_in > 2 ? fm_tensor_data(c->in[2]) : NULL;
    if (bias && (c->in[2]->dtype != dt || c->in[2]->strides[0] != 1)) {
        fm_tensor_release(pa);
        fm_tensor_release(pb);
        return fm_cuda_unsupported_dtype(c, c->in[2]->dtype);
    }
    fm_status st = fm_cuda_gemm_rowmajor(pa ? pa : a, pb ? pb : b, y, bias, bias ? 1 : 0, "matmul");
    fm_tensor_release(pa);
    fm_tensor_release(pb);
    return st;
}

extern "C" void fm_cuda_kernels_matmul(fm_backend *b) { b->kernels[FM_OP_MATMUL] = k_matmul; }
