/* CUDA kernels for layer norm, RMS norm, embedding and dropout (+ backward).
 *
 * Norms: one block per row of the contiguous [M, N] view, statistics in double.
 * Weight/bias gradients sum over rows in two deterministic stages: partial sums
 * over fixed chunks of rows, then the chunks in order (no atomics, so results
 * repeat bit for bit); chunks grow past 65535 * 64 rows so the grid stays valid.
 * Embedding backward sorts the indices stably (cub) and sums each row's positions
 * in order, for the same reason, in parallel over rows and columns. Dropout draws
 * from Philox at (seed, offset + i/4, lane i%4), exactly the CPU's stream, so
 * a mask is identical on both devices. Bad indices lower a deferred-check word
 * (deferred.cu) reported like the CPU's error at the step's next host read. */
#include <climits>
#include <cub/cub.cuh>
#include <math.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

#define ROW_CHUNK 64

/* ---- layer norm / RMS norm ---- */

template <typename T>
__global__ void norm_fwd(const void *x, const void *w, const void *b, void *y, void *mean, void *rstd, int dt, int sdt,
                         int64_t N, double eps, int rms) {
    __shared__ double sh[32];
    int64_t r = blockIdx.x, base = r * N;
    double s = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        double v = fm_ld<double>(x, dt, base + i);
        s += rms ? v * v : v;
    }
    s = fm_block_sum<double>(s, sh);
    double mu = 0, rs;
    if (rms) {
        rs = 1.0 / sqrt(s / (double)N + eps);
    } else {
        mu = s / (double)N;
        double v2 = 0;
        for (int64_t i = threadIdx.x; i < N; i += blockDim.x) { double d = fm_ld<double>(x, dt, base + i) - mu; v2 += d * d; }
        __syncthreads();
        v2 = fm_block_sum<double>(v2, sh);
        rs = 1.0 / sqrt(v2 / (double)N + eps);
    }
    if (threadIdx.x == 0) {
        if (mean) fm_st<double>(mean, sdt, r, mu);
        fm_st<double>(rstd, sdt, r, rs);
    }
    T tm = (T)mu, tr = (T)rs;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        T h = (fm_ld<T>(x, dt, base + i) - tm) * tr;
        if (w) h *= fm_ld<T>(w, dt, i);
        if (b) h += fm_ld<T>(b, dt, i);
        fm_st<T>(y, dt, base + i, h);
    }
}

template <typename T>
__global__ void norm_bwd_dx(const void *dy, const void *x, const void *w, const void *mean, const void *rstd, void *dx,
                            int dt, int sdt, int64_t N, int rms) {
    __shared__ double sh[32];
    int64_t r = blockIdx.x, base = r * N;
    T mu = mean ? fm_ld<T>(mean, sdt, r) : (T)0, rs = fm_ld<T>(rstd, sdt, r);
    double sg = 0, sgx = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        T h = (fm_ld<T>(x, dt, base + i) - mu) * rs, g = fm_ld<T>(dy, dt, base + i);
        if (w) g *= fm_ld<T>(w, dt, i);
        sg += (double)g;
        sgx += (double)g * (double)h;
    }
    sg = fm_block_sum<double>(sg, sh);
    __syncthreads();
    sgx = fm_block_sum<double>(sgx, sh);
    T a = rms ? (T)0 : (T)(sg / (double)N), c = (T)(sgx / (double)N);
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        T h = (fm_ld<T>(x, dt, base + i) - mu) * rs, g = fm_ld<T>(dy, dt, base + i);
        if (w) g *= fm_ld<T>(w, dt, i);
        fm_st<T>(dx, dt, base + i, rs * (g - a - h * c));
    }
}

/* partial[chunk, col] for dweight (k = 0) and dbias (k = 1). */
__global__ void norm_bwd_partial(const void *dy, const void *x, const void *mean, const void *rstd, int dt, int sdt,
                                 int64_t M, int64_t N, int64_t rc, double *pw, double *pb) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (col >= N) return;
    int64_t r0 = chunk * rc, r1 = r0 + rc < M ? r0 + rc : M;
    double sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; r++) {
        double g = fm_ld<double>(dy, dt, r * N + col);
        double mu = mean ? fm_ld<double>(mean, sdt, r) : 0.0;
        double h = (fm_ld<double>(x, dt, r * N + col) - mu) * fm_ld<double>(rstd, sdt, r);
        sw += g * h;
        sb += g;
    }
    if (pw) pw[chunk * N + col] = sw;
    if (pb) pb[chunk * N + col] = sb;
}

__global__ void colsum_finish(const double *part, int64_t chunks, int64_t N, void *out, int dt) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= N) return;
    double s = 0;
    for (int64_t k = 0; k < chunks; k++) s += part[k * N + col];
    fm_st<double>(out, dt, col, s);
}

static int row_threads(int64_t n) { return n >= 2048 ? 512 : (n >= 256 ? 256 : 64); }
static int float_ok(fm_dtype dt) { return dt == FM_F32 || dt == FM_F64 || dt == FM_F16 || dt == FM_BF16; }

static fm_status norm_fwd_k(const fm_op_call *c, int rms) {
    const fm_tensor *x = c->in[0], *w = c->in[1], *b = rms ? NULL : c->in[2];
    const fm_tensor *mean = rms ? NULL : c->out[1], *rstd = c->out[rms ? 1 : 2];
    fm_dtype dt = x->dtype;
    if (!float_ok(dt)) return fm_cuda_unsupported_dtype(c, dt);
    int64_t M = fm_tensor_numel(rstd), N = M ? fm_tensor_numel(x) / M : 0;
    if (M == 0 || N == 0) return FM_OK;
    double eps = ((const fm_norm_attrs *)c->attrs)->eps;
    cudaStream_t s = fm_cuda_stream();
    int th = row_threads(N);
    const void *wp = w ? fm_tensor_data(w) : NULL, *bp = b ? fm_tensor_data(b) : NULL;
    void *mp = mean ? fm_tensor_data(mean) : NULL;
    if (dt == FM_F64) norm_fwd<double><<<(unsigned)M, th, 0, s>>>(fm_tensor_data(x), wp, bp, fm_tensor_data(c->out[0]), mp, fm_tensor_data(rstd), dt, rstd->dtype, N, eps, rms);
    else norm_fwd<float><<<(unsigned)M, th, 0, s>>>(fm_tensor_data(x), wp, bp, fm_tensor_data(c->out[0]), mp, fm_tensor_data(rstd), dt, rstd->dtype, N, eps, rms);
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

/* LAYER_NORM_BACKWARD in = {dy, x, w|NULL, mean, rstd}, out = {dx, dw|NULL, db|NULL};
 * RMS_NORM_BACKWARD in = {dy, x, w|NULL, rstd}, out = {dx, dw|NULL}. */
static fm_status norm_bwd_k(const fm_op_call *c, int rms) {
    const fm_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
    const fm_tensor *mean = rms ? NULL : c->in[3], *rstd = c->in[rms ? 3 : 4];
    fm_tensor *dx = c->out[0], *dw = c->n_out > 1 ? c->out[1] : NULL, *db = (!rms && c->n_out > 2) ? c->out[2] : NULL;
    fm_dtype dt = x->dtype;
    if (!float_ok(dt)) return fm_cuda_unsupported_dtype(c, dt);
    int64_t M = fm_tensor_numel(rstd), N = M ? fm_tensor_numel(x) / M : 0;
    cudaStream_t s = fm_cuda_stream();
    if (M == 0 || N == 0) {
        fm_status zst = dw ? fm_cuda_check(cudaMemsetAsync(fm_tensor_data(dw), 0, fm_tensor_nbytes(dw), s), fm_cuda_op_name(c)) : FM_OK;
        if (!zst && db) zst = fm_cuda_check(cudaMemsetAsync(fm_tensor_data(db), 0, fm_tensor_nbytes(db), s), fm_cuda_op_name(c));
        if (zst) return zst;
        return fm_cuda_check_launch(fm_cuda_op_name(c));
    }
    const void *wp = w ? fm_tensor_data(w) : NULL, *mp = mean ? fm_tensor_data(mean) : NULL;
    int th = row_threads(N);
    if (dx) {
        if (dt == FM_F64) norm_bwd_dx<double><<<(unsigned)M, th, 0, s>>>(fm_tensor_data(dy), fm_tensor_data(x), wp, mp, fm_tensor_data(rstd), fm_tensor_data(dx), dt, rstd->dtype, N, rms);
        else norm_bwd_dx<float><<<(unsigned)M, th, 0, s>>>(fm_tensor_data(dy), fm_tensor_data(x), wp, mp, fm_tensor_data(rstd), fm_tensor_data(dx), dt, rstd->dtype, N, rms);
    }
    if (dw || db) {
        const int64_t rc = fm_cuda_chunk_rows(M, ROW_CHUNK), chunks = (M + rc - 1) / rc;
        double *part = (double *)fm_cuda_scratch_alloc((size_t)(2 * chunks * N) * sizeof(double));
        if (!part) return fm_last_status();
        double *pw = dw ? part : NULL, *pb = db ? part + chunks * N : NULL;
        dim3 grid((unsigned)((N + 127) / 128), (unsigned)chunks);
        norm_bwd_partial<<<grid, 128, 0, s>>>(fm_tensor_data(dy), fm_tensor_data(x), mp, fm_tensor_data(rstd), dt, rstd->dtype, M, N, rc, pw, pb);
        if (dw) colsum_finish<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(pw, chunks, N, fm_tensor_data(dw), dw->dtype);
        if (db) colsum_finish<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(pb, chunks, N, fm_tensor_data(db), db->dtype);
        fm_cuda_scratch_free(part);
    }
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

static fm_status k_ln(const fm_op_call *c) { return norm_fwd_k(c, 0); }
static fm_status k_rms(const fm_op_call *c) { return norm_fwd_k(c, 1); }
static fm_status k_ln_bwd(const fm_op_call *c) { return norm_bwd_k(c, 0); }
static fm_status k_rms_bwd(const fm_op_call *c) { return norm_bwd_k(c, 1); }

/* ---- embedding ---- */

__device__ __forceinline__ int64_t index_at(const void *p, int dt, int64_t i) {
    return dt == FM_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

__global__ void check_indices(const void *idx, int idt, int64_t n, int64_t V, unsigned long long *flag) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = index_at(idx, idt, i);
        if (v < 0 || v >= V) atomicMin(flag, (unsigned long long)i + 1);
    }
}

__global__ void embedding_fwd(const void *w, int dt, const void *idx, int idt, int64_t n, int64_t V, int64_t D, void *y) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * D; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / D, d = e % D, v = index_at(idx, idt, i);
        double val = (v >= 0 && v < V) ? fm_ld<double>(w, dt, v * D + d) : 0.0;
        fm_st<double>(y, dt, e, val);
    }
}

/* The backward is parallel and deterministic without atomics: the (index, position)
 * pairs are sorted stably by index (cub's radix sort), each index's run of positions
 * is found, and one block per vocabulary row sums its positions' rows of dy in
 * position order (f32 accumulation, as the CPU), threads across D. A row no index
 * names gets 0. A bad index (its check is deferred) sorts into bucket V, which no
 * row reads. */
__global__ void emb_keys(const void *idx, int idt, int64_t n, int64_t V, unsigned long long *keys, int64_t *pos) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = index_at(idx, idt, i);
        keys[i] = (unsigned long long)(v >= 0 && v < V ? v : V); /* a bad index (reported later): bucket V, never read */
        pos[i] = i;
    }
}
__global__ void emb_runs(const unsigned long long *keys, int64_t n, int64_t *start, int64_t *end) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        unsigned long long k = keys[i];
        if (i == 0 || keys[i - 1] != k) start[k] = i;
        if (i == n - 1 || keys[i + 1] != k) end[k] = i + 1;
    }
}
__global__ void emb_rows(const void *dy, int dt, const int64_t *pos, const int64_t *start, const int64_t *end, int64_t V,
                         int64_t D, void *dw, int wdt) {
    for (int64_t v = blockIdx.x; v < V; v += gridDim.x) {
        const int64_t a = start[v], b = end[v];
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            float acc = 0;
            for (int64_t k = a; k < b; k++) acc += fm_ld<float>(dy, dt, pos[k] * D + d);
            fm_st<float>(dw, wdt, v * D + d, acc);
        }
    }
}

/* Queues the indices' range check (deferred.cu): a bad one is reported at the next host
 * read; the kernels below skip it meanwhile (forward: a zero row; backward: no row). */
static fm_status validate_indices(const fm_op_call *c, const fm_tensor *idx, int64_t V) {
    if (idx->dtype != FM_I64 && idx->dtype != FM_I32)
        return fm_set_error(FM_ERR_INVALID, "%s: index dtype %s must be i64 or i32", fm_cuda_op_name(c), fm_dtype_name(idx->dtype));
    int64_t n = fm_tensor_numel(idx);
    if (n == 0) return FM_OK;
    unsigned long long *flag = fm_cuda_defer_index_check(fm_cuda_op_name(c), "index", idx, V);
    if (!flag) return fm_last_status();
    check_indices<<<fm_cuda_blocks(n, 256), 256, 0, fm_cuda_stream()>>>(fm_tensor_data(idx), idx->dtype, n, V, flag);
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

static fm_status k_embedding(const fm_op_call *c) {
    const fm_tensor *w = c->in[0], *idx = c->in[1];
    if (!float_ok(w->dtype)) return fm_cuda_unsupported_dtype(c, w->dtype);
    int64_t V = w->shape[0], D = w->shape[1], n = fm_tensor_numel(idx);
    fm_status st = validate_indices(c, idx, V);
    if (st || n * D == 0) return st;
    embedding_fwd<<<fm_cuda_blocks(n * D, 256), 256, 0, fm_cuda_stream()>>>(fm_tensor_data(w), w->dtype, fm_tensor_data(idx), idx->dtype, n, V, D, fm_tensor_data(c->out[0]));
    return fm_cuda_check_launch("embedding");
}

/* EMBEDDING_BACKWARD in = {dy [n, D], indices}, out = {dweight [V, D]}. */
static fm_status k_embedding_bwd(const fm_op_call *c) {
    const fm_tensor *dy = c->in[0], *idx = c->in[1];
    fm_tensor *dw = c->out[0];
    if (!float_ok(dw->dtype)) return fm_cuda_unsupported_dtype(c, dw->dtype);
    int64_t V = dw->shape[0], D = dw->shape[1], n = fm_tensor_numel(idx);
    fm_status st = validate_indices(c, idx, V);
    if (st) return st;
    if (V * D == 0) return FM_OK;
    if (n > INT_MAX) return fm_set_error(FM_ERR_UNSUPPORTED, "embedding_backward: %lld indices (the sort takes at most %d)", (long long)n, INT_MAX);
    cudaStream_t s = fm_cuda_stream();
    int bits = 1;
    while (bits < 63 && ((int64_t)1 << bits) <= V) bits++; /* the keys' significant bits (0..V) */
    const size_t nn = (size_t)(n ? n : 1);
    char *buf = (char *)fm_cuda_scratch_alloc(4 * nn * 8 + 2 * (size_t)(V + 1) * 8);
    if (!buf) return fm_last_status();
    unsigned long long *k_in = (unsigned long long *)buf, *k_out = k_in + nn;
    int64_t *p_in = (int64_t *)(k_out + nn), *p_out = p_in + nn, *start = p_out + nn, *end = start + V + 1;
    void *tmp = NULL;
    size_t tmp_bytes = 0;
    st = fm_cuda_check(cudaMemsetAsync(start, 0, 2 * (size_t)(V + 1) * 8, s), "embedding_backward");
    if (!st && n) {
        emb_keys<<<fm_cuda_blocks(n, 256), 256, 0, s>>>(fm_tensor_data(idx), idx->dtype, n, V, k_in, p_in);
        st = fm_cuda_check(cub::DeviceRadixSort::SortPairs(NULL, tmp_bytes, k_in, k_out, p_in, p_out, (int)n, 0, bits, s),
                           "embedding_backward (sort size)");
        if (!st && !(tmp = fm_cuda_scratch_alloc(tmp_bytes ? tmp_bytes : 1))) st = fm_last_status();
        if (!st)
            st = fm_cuda_check(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, k_in, k_out, p_in, p_out, (int)n, 0, bits, s),
                               "embedding_backward (sort)");
        if (!st) emb_runs<<<fm_cuda_blocks(n, 256), 256, 0, s>>>(k_out, n, start, end);
    }
    if (!st) {
        unsigned rows = (unsigned)(V < 65535LL * 32 ? V : 65535LL * 32);
        emb_rows<<<rows, D >= 256 ? 256 : 128, 0, s>>>(fm_tensor_data(dy), dy->dtype, p_out, start, end, V, D, fm_tensor_data(dw), dw->dtype);
        st = fm_cuda_check_launch("embedding_backward");
    }
    if (tmp) fm_cuda_scratch_free(tmp);
    fm_cuda_scratch_free(buf);
    return st;
}

/* ---- dropout ---- */

__device__ __forceinline__ void philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32), c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c1 = lo1; c3 = lo0; c0 = n0; c2 = n2;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

__global__ void dropout_kernel(const void *x, void *y, uint8_t *mask, int dt, int64_t n, double keep_thresh, double scale,
                               uint64_t seed, uint64_t offset) {
    int64_t groups = (n + 3) / 4;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (int64_t)gridDim.x * blockDim.x) {
        uint32_t r[4];
        philox4x32(seed, 0, offset + (uint64_t)g, r);
        for (int k = 0; k < 4; k++) {
            int64_t i = g * 4 + k;
            if (i >= n) break;
            uint8_t keep = (double)(r[k] >> 8) < keep_thresh;
            mask[i] = keep;
            if (dt == FM_F64) ((double *)y)[i] = keep ? ((const double *)x)[i] * scale : 0.0;
            else fm_st<float>(y, dt, i, keep ? fm_ld<float>(x, dt, i) * (float)scale : 0.0f);
        }
    }
}

static fm_status k_dropout(const fm_op_call *c) {
    const fm_tensor *x = c->in[0];
    const fm_dropout_attrs *a = (const fm_dropout_attrs *)c->attrs;
    if (!float_ok(x->dtype)) return fm_cuda_unsupported_dtype(c, x->dtype);
    if (c->out[1]->dtype != FM_U8 && c->out[1]->dtype != FM_BOOL) return fm_cuda_unsupported_dtype(c, c->out[1]->dtype);
    int64_t n = fm_tensor_numel(x);
    if (n == 0) return FM_OK;
    dropout_kernel<<<fm_cuda_blocks((n + 3) / 4, 256), 256, 0, fm_cuda_stream()>>>(
        fm_tensor_data(x), fm_tensor_data(c->out[0]), (uint8_t *)fm_tensor_data(c->out[1]), x->dtype, n,
        (1.0 - a->p) * 16777216.0, a->p < 1 ? 1.0 / (1.0 - a->p) : 0.0, a->seed, a->offset);
    return fm_cuda_check_launch("dropout");
}

extern "C" void fm_cuda_kernels_norm(fm_backend *b) {
    b->kernels[FM_OP_LAYER_NORM] = k_ln;
    b->kernels[FM_OP_LAYER_NORM_BACKWARD] = k_ln_bwd;
    b->kernels[FM_OP_RMS_NORM] = k_rms;
    b->kernels[FM_OP_RMS_NORM_BACKWARD] = k_rms_bwd;
    b->kernels[FM_OP_EMBEDDING] = k_embedding;
    b->kernels[FM_OP_EMBEDDING_BACKWARD] = k_embedding_bwd;
    b->kernels[FM_OP_DROPOUT] = k_dropout;
}
