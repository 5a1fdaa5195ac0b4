/* CUDA kernels of the fused transformer helpers (src/ops/fused.c), with the CPU
 * kernels' semantics (fused_cpu.c).
 *
 * qkv_split_heads and its backward: pure data movement, so one element-size
 * kernel serves every dtype; one thread per element of the packed
 * [B, T, (H + 2 KV) D] tensor, which is also the coalesced side. A missing
 * gradient (NULL dq/dk/dv) is zero.
 *
 * bias_gelu_tanh and add_layer_norm (+ backward) on rows of a contiguous [M, N]
 * view, in float (double for f64) with any float storage. Vector gradients (the
 * bias; the norm's weight and bias) are summed in two deterministic stages:
 * fixed chunks of rows, then the chunks in order, so results repeat bit for bit.
 * add_layer_norm takes its statistics over the stored (rounded) sum, one block
 * per row, so the norm of x alone (h NULL) is bitwise that of a fused call whose
 * sum equals x, as on the CPU. */
#include <math.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/scalar_math.h"

typedef struct qkv_geom { int64_t T, H, KV, D, W, n; } qkv_geom;

/* Offset in q (seg 0), k (1) or v (2) of element e of the packed tensor. */
__device__ __forceinline__ int64_t qkv_dst(const qkv_geom &g, int64_t e, int *seg) {
    int64_t r = e / g.W, col = e % g.W, h = col / g.D, d = col % g.D, b = r / g.T, t = r % g.T;
    if (h < g.H) { *seg = 0; return ((b * g.H + h) * g.T + t) * g.D + d; }
    h -= g.H;
    *seg = h < g.KV ? 1 : 2;
    if (h >= g.KV) h -= g.KV;
    return ((b * g.KV + h) * g.T + t) * g.D + d;
}

template <typename R>
__global__ void qkv_split_k(qkv_geom g, const R *x, R *q, R *k, R *v) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.n; e += (int64_t)gridDim.x * blockDim.x) {
        int seg;
        int64_t o = qkv_dst(g, e, &seg);
        (seg == 0 ? q : seg == 1 ? k : v)[o] = x[e];
    }
}

template <typename R>
__global__ void qkv_merge_k(qkv_geom g, const R *dq, const R *dk, const R *dv, R *dx) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.n; e += (int64_t)gridDim.x * blockDim.x) {
        int seg;
        int64_t o = qkv_dst(g, e, &seg);
        const R *src = seg == 0 ? dq : seg == 1 ? dk : dv;
        dx[e] = src ? src[o] : (R)0; /* all-zero bits are 0.0 in every float format */
    }
}

template <typename R>
static void launch(const fm_op_call *c, const qkv_geom &g, bool bwd) {
    unsigned bl = fm_cuda_blocks(g.n, 256);
    cudaStream_t s = fm_cuda_stream();
    if (!bwd) {
        qkv_split_k<R><<<bl, 256, 0, s>>>(g, (const R *)fm_tensor_data(c->in[0]), (R *)fm_tensor_data(c->out[0]),
                                          (R *)fm_tensor_data(c->out[1]), (R *)fm_tensor_data(c->out[2]));
    } else {
        const R *p[3];
        for (int i = 0; i < 3; i++) p[i] = c->in[i] ? (const R *)fm_tensor_data(c->in[i]) : NULL;
        qkv_merge_k<R><<<bl, 256, 0, s>>>(g, p[0], p[1], p[2], (R *)fm_tensor_data(c->out[0]));
    }
}

static fm_status qkv(const fm_op_call *c, bool bwd) {
    const fm_qkv_split_attrs *a = (const fm_qkv_split_attrs *)c->attrs;
    const fm_tensor *x = bwd ? c->out[0] : c->in[0];
    qkv_geom g = {x->shape[1], a->n_head, a->n_kv_head, a->head_dim, (a->n_head + 2 * a->n_kv_head) * a->head_dim,
                  fm_tensor_numel(x)};
    if (!g.n) return FM_OK;
    switch (fm_dtype_size(x->dtype)) {
    case 1: launch<uint8_t>(c, g, bwd); break;
    case 2: launch<uint16_t>(c, g, bwd); break;
    case 4: launch<uint32_t>(c, g, bwd); break;
    case 8: launch<uint64_t>(c, g, bwd); break;
    default: return fm_cuda_unsupported_dtype(c, x->dtype);
    }
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

static fm_status k_qkv_split(const fm_op_call *c) { return qkv(c, false); }
static fm_status k_qkv_split_bwd(const fm_op_call *c) { return qkv(c, true); }

/* ---------------- bias + GELU (tanh) ---------------- */

#define FZ_ROW_CHUNK 64

static int fz_float_ok(fm_dtype dt) { return dt == FM_F32 || dt == FM_F64 || dt == FM_F16 || dt == FM_BF16; }

/* tanh GELU and its derivative from backend/scalar_math.h, in T's precision */
template <typename T>
__device__ __forceinline__ T fz_gelu(T v) {
    return sizeof(T) == sizeof(float) ? (T)fm_gelu_tanh_f((float)v) : (T)fm_gelu_tanh_d((double)v);
}
template <typename T>
__device__ __forceinline__ T fz_dgelu(T v) {
    return sizeof(T) == sizeof(float) ? (T)fm_gelu_tanh_deriv_f((float)v) : (T)fm_gelu_tanh_deriv_d((double)v);
}

template <typename T>
__global__ void bias_gelu_fwd(const void *x, const void *b, void *y, int dt, int64_t N, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        fm_st<T>(y, dt, e, fz_gelu<T>(fm_ld<T>(x, dt, e) + fm_ld<T>(b, dt, e % N)));
    }
}

/* one thread per (column, chunk of rows): writes dx and the chunk's bias-gradient partial */
template <typename T>
__global__ void bias_gelu_bwd(const void *dy, const void *x, const void *b, void *dx, int dt, int64_t M, int64_t N,
                              int64_t rc, double *part) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (col >= N) return;
    int64_t r0 = chunk * rc, r1 = r0 + rc < M ? r0 + rc : M;
    T bc = fm_ld<T>(b, dt, col);
    double acc = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t e = r * N + col;
        T d = fm_ld<T>(dy, dt, e) * fz_dgelu<T>(fm_ld<T>(x, dt, e) + bc);
        fm_st<T>(dx, dt, e, d);
        acc += (double)d;
    }
    if (part) part[chunk * N + col] = acc;
}

__global__ void fz_colsum(const double *part, int64_t chunks, int64_t N, void *out, int dt) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= N) return;
    double s = 0;
    for (int64_t k = 0; k < chunks; k++) s += part[k * N + col];
    fm_st<double>(out, dt, col, s);
}

static fm_status k_bias_gelu(const fm_op_call *c) {
    const fm_tensor *x = c->in[0], *b = c->in[1];
    fm_dtype dt = x->dtype;
    if (!fz_float_ok(dt) || b->dtype != dt) return fm_cuda_unsupported_dtype(c, fz_float_ok(dt) ? b->dtype : dt);
    int64_t n = fm_tensor_numel(x), N = x->shape[x->ndim - 1];
    if (n == 0) return FM_OK;
    unsigned bl = fm_cuda_blocks(n, 256);
    cudaStream_t s = fm_cuda_stream();
    if (dt == FM_F64) bias_gelu_fwd<double><<<bl, 256, 0, s>>>(fm_tensor_data(x), fm_tensor_data(b), fm_tensor_data(c->out[0]), dt, N, n);
    else bias_gelu_fwd<float><<<bl, 256, 0, s>>>(fm_tensor_data(x), fm_tensor_data(b), fm_tensor_data(c->out[0]), dt, N, n);
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

static fm_status k_bias_gelu_bwd(const fm_op_call *c) {
    const fm_tensor *dy = c->in[0], *x = c->in[1], *b = c->in[2];
    fm_tensor *dx = c->out[0], *db = c->n_out > 1 ? c->out[1] : NULL;
    fm_dtype dt = x->dtype;
    if (!fz_float_ok(dt) || b->dtype != dt || !dy || dy->dtype != dt)
        return fm_cuda_unsupported_dtype(c, fz_float_ok(dt) ? b->dtype : dt);
    const int64_t N = x->shape[x->ndim - 1], M = N ? fm_tensor_numel(x) / N : 0;
    cudaStream_t s = fm_cuda_stream();
    if (M == 0 || N == 0) {
        fm_status zst = db ? fm_cuda_check(cudaMemsetAsync(fm_tensor_data(db), 0, fm_tensor_nbytes(db), s), fm_cuda_op_name(c)) : FM_OK;
        if (zst) return zst;
        return fm_cuda_check_launch(fm_cuda_op_name(c));
    }
    const int64_t rc = fm_cuda_chunk_rows(M, FZ_ROW_CHUNK), chunks = (M + rc - 1) / rc;
    double *part = db ? (double *)fm_cuda_scratch_alloc((size_t)(chunks * N) * sizeof(double)) : NULL;
    if (db && !part) return fm_last_status();
    dim3 grid((unsigned)((N + 127) / 128), (unsigned)chunks);
    if (dt == FM_F64) bias_gelu_bwd<double><<<grid, 128, 0, s>>>(fm_tensor_data(dy), fm_tensor_data(x), fm_tensor_data(b), fm_tensor_data(dx), dt, M, N, rc, part);
    else bias_gelu_bwd<float><<<grid, 128, 0, s>>>(fm_tensor_data(dy), fm_tensor_data(x), fm_tensor_data(b), fm_tensor_data(dx), dt, M, N, rc, part);
    if (db) {
        fz_colsum<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(part, chunks, N, fm_tensor_data(db), db->dtype);
        fm_cuda_scratch_free(part);
    }
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

/* ---------------- residual add + layer norm ---------------- */

/* one block per row; h NULL: the row of x is the sum (and s is not written) */
template <typename T>
__global__ void add_ln_fwd(const void *x, const void *h, const void *w, const void *b, void *sum, void *y, void *mean,
                           void *rstd, int dt, int sdt, int64_t N, double eps) {
    __shared__ double sh[32];
    const int64_t base = (int64_t)blockIdx.x * N;
    const void *src = h ? sum : x;
    double t = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        if (h) fm_st<T>(sum, dt, base + i, fm_ld<T>(x, dt, base + i) + fm_ld<T>(h, dt, base + i));
        t += fm_ld<double>(src, dt, base + i); /* the stored, rounded sum: this thread wrote it */
    }
    const double mu = fm_block_sum<double>(t, sh) / (double)N;
    double v = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        double d = fm_ld<double>(src, dt, base + i) - mu;
        v += d * d;
    }
    __syncthreads();
    const double rs = 1.0 / sqrt(fm_block_sum<double>(v, sh) / (double)N + eps);
    if (threadIdx.x == 0) {
        fm_st<double>(mean, sdt, blockIdx.x, mu);
        fm_st<double>(rstd, sdt, blockIdx.x, rs);
    }
    const T tm = (T)mu, tr = (T)rs;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        T o = (fm_ld<T>(src, dt, base + i) - tm) * tr;
        if (w) o *= fm_ld<T>(w, dt, i);
        if (b) o += fm_ld<T>(b, dt, i);
        fm_st<T>(y, dt, base + i, o);
    }
}

/* g = dsum + rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = dy w; dy NULL: g = dsum (or 0) */
template <typename T>
__global__ void add_ln_bwd_rows(const void *dy, const void *ds, const void *s, const void *w, const void *mean,
                                const void *rstd, void *g, int dt, int sdt, int64_t N) {
    __shared__ double sh[32];
    const int64_t r = blockIdx.x, base = r * N;
    if (!dy) {
        for (int64_t i = threadIdx.x; i < N; i += blockDim.x) fm_st<T>(g, dt, base + i, ds ? fm_ld<T>(ds, dt, base + i) : (T)0);
        return;
    }
    const T mu = fm_ld<T>(mean, sdt, r), rs = fm_ld<T>(rstd, sdt, r);
    double sg = 0, sgx = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        T xh = (fm_ld<T>(s, dt, base + i) - mu) * rs, gw = fm_ld<T>(dy, dt, base + i);
        if (w) gw *= fm_ld<T>(w, dt, i);
        sg += (double)gw;
        sgx += (double)gw * (double)xh;
    }
    sg = fm_block_sum<double>(sg, sh);
    __syncthreads();
    sgx = fm_block_sum<double>(sgx, sh);
    const T a = (T)(sg / (double)N), c = (T)(sgx / (double)N);
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        T xh = (fm_ld<T>(s, dt, base + i) - mu) * rs, gw = fm_ld<T>(dy, dt, base + i);
        if (w) gw *= fm_ld<T>(w, dt, i);
        T d = rs * (gw - a - xh * c);
        if (ds) d += fm_ld<T>(ds, dt, base + i);
        fm_st<T>(g, dt, base + i, d);
    }
}

/* partials [chunk, col] of dweight (sum dy xhat) and dbias (sum dy) */
__global__ void add_ln_bwd_partial(const void *dy, const void *s, const void *mean, const void *rstd, int dt, int sdt,
                                   int64_t M, int64_t N, int64_t rc, double *pw, double *pb) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (col >= N) return;
    int64_t r0 = chunk * rc, r1 = r0 + rc < M ? r0 + rc : M;
    double sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; r++) {
        double d = fm_ld<double>(dy, dt, r * N + col);
        double xh = (fm_ld<double>(s, dt, r * N + col) - fm_ld<double>(mean, sdt, r)) * fm_ld<double>(rstd, sdt, r);
        sw += d * xh;
        sb += d;
    }
    if (pw) pw[chunk * N + col] = sw;
    if (pb) pb[chunk * N + col] = sb;
}

static int fz_row_threads(int64_t n) { return n >= 2048 ? 512 : (n >= 256 ? 256 : 64); }

static fm_status k_add_ln(const fm_op_call *c) {
    const fm_tensor *x = c->in[0], *h = c->in[1], *w = c->in[2], *b = c->in[3];
    const fm_tensor *mean = c->out[2], *rstd = c->out[3];
    fm_dtype dt = x->dtype;
    if (!fz_float_ok(dt)) return fm_cuda_unsupported_dtype(c, dt);
    for (int i = 1; i < 4; i++)
        if (c->in[i] && c->in[i]->dtype != dt) return fm_cuda_unsupported_dtype(c, c->in[i]->dtype);
    const int64_t N = x->shape[x->ndim - 1], M = N ? fm_tensor_numel(x) / N : 0;
    if (M == 0 || N == 0) return FM_OK;
    const double eps = ((const fm_norm_attrs *)c->attrs)->eps;
    cudaStream_t s = fm_cuda_stream();
    const void *hp = h ? fm_tensor_data(h) : NULL, *wp = w ? fm_tensor_data(w) : NULL, *bp = b ? fm_tensor_data(b) : NULL;
    void *sp = c->out[0] ? fm_tensor_data(c->out[0]) : NULL;
    const int th = fz_row_threads(N);
    if (dt == FM_F64)
        add_ln_fwd<double><<<(unsigned)M, th, 0, s>>>(fm_tensor_data(x), hp, wp, bp, sp, fm_tensor_data(c->out[1]), fm_tensor_data(mean),
                                                      fm_tensor_data(rstd), dt, rstd->dtype, N, eps);
    else
        add_ln_fwd<float><<<(unsigned)M, th, 0, s>>>(fm_tensor_data(x), hp, wp, bp, sp, fm_tensor_data(c->out[1]), fm_tensor_data(mean),
                                                     fm_tensor_data(rstd), dt, rstd->dtype, N, eps);
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

static fm_status k_add_ln_bwd(const fm_op_call *c) {
    const fm_tensor *dy = c->in[0], *ds = c->in[1], *sm = c->in[2], *w = c->in[3], *mean = c->in[4], *rstd = c->in[5];
    fm_tensor *g = c->out[0], *dw = c->n_out > 1 ? c->out[1] : NULL, *db = c->n_out > 2 ? c->out[2] : NULL;
    fm_dtype dt = sm->dtype;
    if (!fz_float_ok(dt)) return fm_cuda_unsupported_dtype(c, dt);
    const int64_t N = sm->shape[sm->ndim - 1], M = N ? fm_tensor_numel(sm) / N : 0;
    cudaStream_t s = fm_cuda_stream();
    if (M == 0 || N == 0 || !dy) {
        fm_status zst = dw ? fm_cuda_check(cudaMemsetAsync(fm_tensor_data(dw), 0, fm_tensor_nbytes(dw), s), fm_cuda_op_name(c)) : FM_OK;
        if (!zst && db) zst = fm_cuda_check(cudaMemsetAsync(fm_tensor_data(db), 0, fm_tensor_nbytes(db), s), fm_cuda_op_name(c));
        if (zst) return zst;
        if (M == 0 || N == 0) return fm_cuda_check_launch(fm_cuda_op_name(c));
    }
    const void *dyp = dy ? fm_tensor_data(dy) : NULL, *dsp = ds ? fm_tensor_data(ds) : NULL, *wp = w ? fm_tensor_data(w) : NULL;
    const int th = fz_row_threads(N);
    if (dt == FM_F64)
        add_ln_bwd_rows<double><<<(unsigned)M, th, 0, s>>>(dyp, dsp, fm_tensor_data(sm), wp, fm_tensor_data(mean), fm_tensor_data(rstd),
                                                           fm_tensor_data(g), dt, rstd->dtype, N);
    else
        add_ln_bwd_rows<float><<<(unsigned)M, th, 0, s>>>(dyp, dsp, fm_tensor_data(sm), wp, fm_tensor_data(mean), fm_tensor_data(rstd),
                                                          fm_tensor_data(g), dt, rstd->dtype, N);
    if (dy && (dw || db)) {
        const int64_t rc = fm_cuda_chunk_rows(M, FZ_ROW_CHUNK), chunks = (M + rc - 1) / rc;
        double *part = (double *)fm_cuda_scratch_alloc((size_t)(2 * chunks * N) * sizeof(double));
        if (!part) return fm_last_status();
        double *pw = dw ? part : NULL, *pb = db ? part + chunks * N : NULL;
        dim3 grid((unsigned)((N + 127) / 128), (unsigned)chunks);
        add_ln_bwd_partial<<<grid, 128, 0, s>>>(dyp, fm_tensor_data(sm), fm_tensor_data(mean), fm_tensor_data(rstd), dt, rstd->dtype, M,
                                                N, rc, pw, pb);
        if (dw) fz_colsum<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(pw, chunks, N, fm_tensor_data(dw), dw->dtype);
        if (db) fz_colsum<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(pb, chunks, N, fm_tensor_data(db), db->dtype);
        fm_cuda_scratch_free(part);
    }
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

/* rope: one thread per pair (i, i + D/2) of a row, as the CPU's (fused_cpu.c) */
template <typename A>
__global__ void rope_k(const void *x, const void *cs, const void *sn, void *y, int dt, int64_t T, int64_t D, int64_t pairs, int inverse) {
    const int64_t h = D / 2;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = p / h, i = p % h, t = r % T, o = r * D + i, u = t * D + i;
        A si = fm_ld<A>(sn, dt, u), sh = fm_ld<A>(sn, dt, u + h);
        if (inverse) { const A t = si; si = -sh, sh = -t; } /* the transpose: each half's sin from the other half */
        const A xl = fm_ld<A>(x, dt, o), xh = fm_ld<A>(x, dt, o + h);
        const A lo = xl * fm_ld<A>(cs, dt, u), hi = xh * fm_ld<A>(cs, dt, u + h), rl = -xh * si, rh = xl * sh;
        fm_st<A>(y, dt, o, lo + rl);
        fm_st<A>(y, dt, o + h, hi + rh);
    }
}

static fm_status k_rope(const fm_op_call *c) {
    const fm_rope_attrs *a = (const fm_rope_attrs *)c->attrs;
    const fm_tensor *x = c->in[0];
    const int64_t D = x->shape[x->ndim - 1], T = x->shape[x->ndim - 2], pairs = fm_tensor_numel(x) / 2;
    if (!pairs) return FM_OK;
    const unsigned bl = fm_cuda_blocks(pairs, 256);
    if (x->dtype == FM_F64)
        rope_k<double><<<bl, 256, 0, fm_cuda_stream()>>>(fm_tensor_data(x), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]),
                                                          fm_tensor_data(c->out[0]), x->dtype, T, D, pairs, a->inverse);
    else
        rope_k<float><<<bl, 256, 0, fm_cuda_stream()>>>(fm_tensor_data(x), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]),
                                                         fm_tensor_data(c->out[0]), x->dtype, T, D, pairs, a->inverse);
    return fm_cuda_check_launch("rope");
}

/* lstm_cell: one thread per hidden unit of a row, as the CPU's (lstm_cpu.c), in float
 * (double for f64) */
template <typename A>
__global__ void lstm_cell_k(const void *xg, const void *hg, const void *cs, void *h, void *cn, int dt, int64_t H, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / H, k = e % H, g = r * 4 * H + k;
        const A one = 1;
        const A i = one / (one + exp(-(fm_ld<A>(xg, dt, g) + fm_ld<A>(hg, dt, g))));
        const A o = one / (one + exp(-(fm_ld<A>(xg, dt, g + H) + fm_ld<A>(hg, dt, g + H))));
        const A f = one / (one + exp(-(fm_ld<A>(xg, dt, g + 2 * H) + fm_ld<A>(hg, dt, g + 2 * H))));
        const A gg = tanh(fm_ld<A>(xg, dt, g + 3 * H) + fm_ld<A>(hg, dt, g + 3 * H));
        const A cv = f * fm_ld<A>(cs, dt, e) + i * gg;
        fm_st<A>(cn, dt, e, cv);
        fm_st<A>(h, dt, e, o * tanh(cv));
    }
}

/* gru_cell: one thread per hidden unit of a row, as the CPU's (rnn_cell_cpu.c) */
template <typename A>
__global__ void gru_cell_k(const void *xg, const void *hg, const void *hs, void *hn, int dt, int64_t H, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / H, k = e % H, g = r * 3 * H + k;
        const A one = 1;
        const A z = one / (one + exp(-(fm_ld<A>(xg, dt, g) + fm_ld<A>(hg, dt, g))));
        const A rr = one / (one + exp(-(fm_ld<A>(xg, dt, g + H) + fm_ld<A>(hg, dt, g + H))));
        const A nn = tanh(fm_ld<A>(xg, dt, g + 2 * H) + rr * fm_ld<A>(hg, dt, g + 2 * H));
        fm_st<A>(hn, dt, e, nn + z * (fm_ld<A>(hs, dt, e) - nn));
    }
}

static fm_status k_gru_cell(const fm_op_call *c) {
    const fm_tensor *hs = c->in[2];
    const int64_t n = fm_tensor_numel(hs), H = hs->shape[1];
    if (!n) return FM_OK;
    const unsigned bl = fm_cuda_blocks(n, 256);
    if (hs->dtype == FM_F64)
        gru_cell_k<double><<<bl, 256, 0, fm_cuda_stream()>>>(fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(hs),
                                                              fm_tensor_data(c->out[0]), hs->dtype, H, n);
    else
        gru_cell_k<float><<<bl, 256, 0, fm_cuda_stream()>>>(fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(hs),
                                                             fm_tensor_data(c->out[0]), hs->dtype, H, n);
    return fm_cuda_check_launch("gru_cell");
}

static fm_status k_lstm_cell(const fm_op_call *c) {
    const fm_tensor *cs = c->in[2];
    const int64_t n = fm_tensor_numel(cs), H = cs->shape[1];
    if (!n) return FM_OK;
    const unsigned bl = fm_cuda_blocks(n, 256);
    if (cs->dtype == FM_F64)
        lstm_cell_k<double><<<bl, 256, 0, fm_cuda_stream()>>>(fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(cs),
                                                               fm_tensor_data(c->out[0]), fm_tensor_data(c->out[1]), cs->dtype, H, n);
    else
        lstm_cell_k<float><<<bl, 256, 0, fm_cuda_stream()>>>(fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(cs),
                                                              fm_tensor_data(c->out[0]), fm_tensor_data(c->out[1]), cs->dtype, H, n);
    return fm_cuda_check_launch("lstm_cell");
}

extern "C" void fm_cuda_kernels_fused(fm_backend *b) {
    b->kernels[FM_OP_LSTM_CELL] = k_lstm_cell;
    b->kernels[FM_OP_GRU_CELL] = k_gru_cell;
    b->kernels[FM_OP_ROPE] = k_rope;
    b->kernels[FM_OP_QKV_SPLIT_HEADS] = k_qkv_split;
    b->kernels[FM_OP_QKV_SPLIT_HEADS_BACKWARD] = k_qkv_split_bwd;
    b->kernels[FM_OP_BIAS_GELU_TANH] = k_bias_gelu;
    b->kernels[FM_OP_BIAS_GELU_TANH_BACKWARD] = k_bias_gelu_bwd;
    b->kernels[FM_OP_ADD_LAYER_NORM] = k_add_ln;
    b->kernels[FM_OP_ADD_LAYER_NORM_BACKWARD] = k_add_ln_bwd;
}
