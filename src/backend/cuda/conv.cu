/* CUDA kernels for conv2d, max/avg pool2d and batch norm (and their backwards),
 * with the CPU kernels' semantics (src/backend/cpu/conv2d_cpu.c, pool_cpu.c, batchnorm_cpu.c); f32, f64, f16
 * and bf16 (halves computed in f32, as everywhere in this backend).
 *
 * conv2d is im2col + cuBLASLt. Both layouts are lowered to one "rows" form,
 * so there is only one set of GEMM descriptions to get right: for a chunk of
 * samples, cols [R = n*P, K] (K = Cin/g*kH*kW in the weight's (c, kh, kw)
 * order, P = Ho*Wo) and the output as rows [R, Cout]. NHWC's output already is
 * that; NCHW's goes through a transpose. Per group:
 *     y_rows[:, g]  = cols @ w_g^T              (forward)
 *     dw_g         += dy_rows[:, g]^T @ cols    (one GEMM per chunk, in order)
 *     dcols         = dy_rows[:, g] @ w_g       then a gather-form col2im
 * col2im gathers: each dx element sums the taps that read it, in a fixed
 * order, so dx needs no atomics and is deterministic; so are db (one block per
 * channel) and the pool backwards (each dx element walks the windows that
 * contain it in output order, the CPU's order). Chunk sizes come from a fixed
 * scratch budget, never from the device. cuDNN is not used: this is the native
 * path the issue asks to keep.
 *
 * Batch norm: one block per channel reduces in double in a fixed tree (two
 * passes, mean then biased variance, as the CPU), updates the running stats in
 * place (unbiased variance) and keeps mean/rstd in double scratch for the
 * elementwise pass. */
#include <stdlib.h>

#include "backend/conv_geom.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

#define COLS_BUDGET ((int64_t)128 << 20) /* bytes of im2col columns per chunk */

static bool cuda_float_dt(fm_dtype d) { return d == FM_F32 || d == FM_F64 || d == FM_F16 || d == FM_BF16; }

/* fm_conv_geom, fm_conv_geometry: backend/conv_geom.h */

__device__ __forceinline__ int64_t x_index(const fm_conv_geom &g, int64_t n, int64_t c, int64_t h, int64_t w) {
    return g.nhwc ? ((n * g.H + h) * g.W + w) * g.C + c : ((n * g.C + c) * g.H + h) * g.W + w;
}

/* cols[r, k] for samples n0.. and group gi; zero where the tap falls in the padding. */
template <typename R>
__global__ void im2col_k(fm_conv_geom g, const R *x, R *cols, int64_t n0, int64_t nb, int64_t gi) {
    int64_t total = nb * g.P * g.K;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / g.K, k = e % g.K;
        int64_t n = n0 + r / g.P, p = r % g.P, oh = p / g.Wo, ow = p % g.Wo;
        int64_t c = k / (g.kh * g.kw), t = k % (g.kh * g.kw), i = t / g.kw, j = t % g.kw;
        int64_t ih = oh * g.sh - g.ph + i * g.dh, iw = ow * g.sw - g.pw + j * g.dw;
        R v = 0;
        if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) v = x[x_index(g, n, gi * g.Cg + c, ih, iw)];
        cols[e] = v;
    }
}

/* NCHW y[n0 + n, o, p] <-> rows[n * P + p, o]; dir 0: rows -> nchw, 1: nchw -> rows. */
template <typename R>
__global__ void rows_nchw_k(fm_conv_geom g, R *nchw, R *rows, int64_t n0, int64_t nb, int dir) {
    int64_t total = nb * g.P * g.O;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        /* e walks the NCHW side so that its accesses are the coalesced ones */
        int64_t p = e % g.P, o = (e / g.P) % g.O, n = e / (g.P * g.O);
        int64_t ri = (n * g.P + p) * g.O + o, ni = ((n0 + n) * g.O + o) * g.P + p;
        if (dir == 0) nchw[ni] = rows[ri];
        else rows[ri] = nchw[ni];
    }
}

/* dx for the samples n0.. and channels of group gi, from dcols [R, K]: each dx element
 * sums the taps that read it (fixed order: kh, then kw). */
template <typename A>
__global__ void col2im_k(fm_conv_geom g, const void *dcols, void *dx, int dt, int64_t n0, int64_t nb, int64_t gi) {
    int64_t total = nb * g.Cg * g.H * g.W;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t w = e % g.W, h = (e / g.W) % g.H, c = (e / (g.W * g.H)) % g.Cg, nl = e / (g.W * g.H * g.Cg);
        A acc = 0;
        for (int64_t i = 0; i < g.kh; i++) {
            int64_t th = h + g.ph - i * g.dh;
            if (th < 0 || th % g.sh) continue;
            int64_t oh = th / g.sh;
            if (oh >= g.Ho) continue;
            for (int64_t j = 0; j < g.kw; j++) {
                int64_t tw = w + g.pw - j * g.dw;
                if (tw < 0 || tw % g.sw) continue;
                int64_t ow = tw / g.sw;
                if (ow >= g.Wo) continue;
                acc += fm_ld<A>(dcols, dt, (nl * g.P + oh * g.Wo + ow) * g.K + (c * g.kh + i) * g.kw + j);
            }
        }
        fm_st<A>(dx, dt, x_index(g, n0 + nl, gi * g.Cg + c, h, w), acc);
    }
}

/* y[..] += bias[channel] over the whole output. */
template <typename A>
__global__ void add_bias_k(void *y, const void *b, int dt, int64_t n, int64_t O, int64_t P, int nhwc) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = nhwc ? e % O : (e / P) % O;
        fm_st<A>(y, dt, e, fm_ld<A>(y, dt, e) + fm_ld<A>(b, dt, o));
    }
}

/* db[o] = sum over samples and positions of dy: one block per channel, double partials in a fixed tree. */
__global__ void conv_db_k(const void *dy, void *db, int dt, int64_t N, int64_t O, int64_t P, int nhwc) {
    __shared__ double sh[32];
    int64_t o = blockIdx.x;
    double s = 0;
    for (int64_t m = threadIdx.x; m < N * P; m += blockDim.x) {
        int64_t n = m / P, p = m % P;
        s += fm_ld<double>(dy, dt, nhwc ? (n * P + p) * O + o : (n * O + o) * P + p);
    }
    s = fm_block_sum(s, sh);
    if (threadIdx.x == 0) fm_st<double>(db, dt, o, s);
}

template <typename R>
static void launch_im2col(const fm_conv_geom &g, const void *x, void *cols, int64_t n0, int64_t nb, int64_t gi, cudaStream_t s) {
    int64_t n = nb * g.P * g.K;
    im2col_k<R><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(g, (const R *)x, (R *)cols, n0, nb, gi);
}
static void im2col(const fm_conv_geom &g, size_t es, const void *x, void *cols, int64_t n0, int64_t nb, int64_t gi) {
    cudaStream_t s = fm_cuda_stream();
    if (es == 2) launch_im2col<uint16_t>(g, x, cols, n0, nb, gi, s);
    else if (es == 4) launch_im2col<uint32_t>(g, x, cols, n0, nb, gi, s);
    else launch_im2col<uint64_t>(g, x, cols, n0, nb, gi, s);
}
static void rows_nchw(const fm_conv_geom &g, size_t es, void *nchw, void *rows, int64_t n0, int64_t nb, int dir) {
    cudaStream_t s = fm_cuda_stream();
    int64_t n = nb * g.P * g.O;
    unsigned bl = fm_cuda_blocks(n, 256);
    if (es == 2) rows_nchw_k<uint16_t><<<bl, 256, 0, s>>>(g, (uint16_t *)nchw, (uint16_t *)rows, n0, nb, dir);
    else if (es == 4) rows_nchw_k<uint32_t><<<bl, 256, 0, s>>>(g, (uint32_t *)nchw, (uint32_t *)rows, n0, nb, dir);
    else rows_nchw_k<uint64_t><<<bl, 256, 0, s>>>(g, (uint64_t *)nchw, (uint64_t *)rows, n0, nb, dir);
}

/* Samples per chunk: the im2col columns of a chunk fit COLS_BUDGET (at least one sample).
 * FATHOM_CUDA_CONV_CHUNK=<samples> overrides it, so tests reach the multi-chunk paths
 * (dw accumulated across chunks, sample offsets) with small shapes. */
static int64_t conv_chunk(const fm_conv_geom &g, size_t es) {
    int64_t per = g.P * (g.K > g.O ? g.K : g.O) * (int64_t)es;
    int64_t nb = per > 0 ? COLS_BUDGET / per : g.N;
    const char *env = getenv("FATHOM_CUDA_CONV_CHUNK");
    if (env && atoll(env) > 0) nb = atoll(env);
    if (nb < 1) nb = 1;
    return nb > g.N ? g.N : nb;
}

static fm_status k_conv2d(const fm_op_call *c) {
    const fm_conv2d_attrs *a = (const fm_conv2d_attrs *)c->attrs;
    fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *y = c->out[0];
    fm_dtype dt = x->dtype;
    if (!cuda_float_dt(dt)) return fm_cuda_unsupported_dtype(c, dt);
    fm_conv_geom g = fm_conv_geometry(&a->p, x, w, y);
    int64_t ny = fm_tensor_numel(y);
    if (ny == 0) return FM_OK;
    size_t es = fm_dtype_size(dt);
    cudaStream_t s = fm_cuda_stream();
    if (g.K == 0) { /* no input channels: y is the bias (or zero) */
        if (!b) return fm_cuda_check(cudaMemsetAsync(fm_tensor_data(y), 0, (size_t)ny * es, s), "conv2d");
    }
    int64_t nbmax = conv_chunk(g, es);
    void *cols = g.K ? fm_cuda_scratch_alloc((size_t)(nbmax * g.P * g.K) * es) : NULL;
    void *rows = !g.nhwc ? fm_cuda_scratch_alloc((size_t)(nbmax * g.P * g.O) * es) : NULL;
    fm_status st = FM_OK;
    if ((g.K && !cols) || (!g.nhwc && !rows)) st = fm_last_status();
    for (int64_t n0 = 0; st == FM_OK && n0 < g.N; n0 += nbmax) {
        int64_t nb = g.N - n0 < nbmax ? g.N - n0 : nbmax, R = nb * g.P;
        char *yr = g.nhwc ? (char *)fm_tensor_data(y) + n0 * g.P * g.O * (int64_t)es : (char *)rows;
        if (g.K == 0) {
            st = fm_cuda_check(cudaMemsetAsync(yr, 0, (size_t)(R * g.O) * es, s), "conv2d");
        }
        for (int64_t gi = 0; st == FM_OK && gi < g.G && g.K; gi++) {
            im2col(g, es, fm_tensor_data(x), cols, n0, nb, gi);
            st = fm_cuda_gemm_raw(dt, 0, 1, R, g.Og, g.K, cols, g.K, 0, (const char *)fm_tensor_data(w) + gi * g.Og * g.K * (int64_t)es,
                                  g.K, 0, yr + gi * g.Og * (int64_t)es, g.O, 0, 1, 0, "conv2d");
        }
        if (st == FM_OK && !g.nhwc) rows_nchw(g, es, fm_tensor_data(y), rows, n0, nb, 0);
    }
    if (st == FM_OK && b) {
        if (dt == FM_F64) add_bias_k<double><<<fm_cuda_blocks(ny, 256), 256, 0, s>>>(fm_tensor_data(y), fm_tensor_data(b), dt, ny, g.O, g.P, g.nhwc);
        else add_bias_k<float><<<fm_cuda_blocks(ny, 256), 256, 0, s>>>(fm_tensor_data(y), fm_tensor_data(b), dt, ny, g.O, g.P, g.nhwc);
    }
    fm_cuda_scratch_free(cols);
    fm_cuda_scratch_free(rows);
    if (st) return st;
    return fm_cuda_check_launch("conv2d");
}

static fm_status k_conv2d_backward(const fm_op_call *c) {
    const fm_conv2d_attrs *a = (const fm_conv2d_attrs *)c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
    fm_tensor *dx = c->out[0], *dw = c->out[1], *db = c->out[2];
    fm_dtype dt = x->dtype;
    if (!cuda_float_dt(dt)) return fm_cuda_unsupported_dtype(c, dt);
    fm_conv_geom g = fm_conv_geometry(&a->p, x, w, dy);
    size_t es = fm_dtype_size(dt);
    cudaStream_t s = fm_cuda_stream();
    fm_status st = FM_OK;
    if (fm_tensor_numel(dy) == 0 || g.K == 0) { /* nothing flows back */
        fm_tensor *o3[3] = {dx, dw, db};
        for (int i = 0; i < 3 && st == FM_OK; i++)
            if (o3[i] && fm_tensor_numel(o3[i]))
                st = fm_cuda_check(cudaMemsetAsync(fm_tensor_data(o3[i]), 0, fm_tensor_nbytes(o3[i]), s), "conv2d_backward");
        return st;
    }
    if (db) conv_db_k<<<(unsigned)g.O, 256, 0, s>>>(fm_tensor_data(dy), fm_tensor_data(db), dt, g.N, g.O, g.P, g.nhwc);
    if (!dx && !dw) return fm_cuda_check_launch("conv2d_backward");
    int64_t nbmax = conv_chunk(g, es);
    void *cols = dw ? fm_cuda_scratch_alloc((size_t)(nbmax * g.P * g.K) * es) : NULL;
    void *dcols = dx ? fm_cuda_scratch_alloc((size_t)(nbmax * g.P * g.K) * es) : NULL;
    void *rows = !g.nhwc ? fm_cuda_scratch_alloc((size_t)(nbmax * g.P * g.O) * es) : NULL;
    if ((dw && !cols) || (dx && !dcols) || (!g.nhwc && !rows)) st = fm_last_status();
    for (int64_t n0 = 0; st == FM_OK && n0 < g.N; n0 += nbmax) {
        int64_t nb = g.N - n0 < nbmax ? g.N - n0 : nbmax, R = nb * g.P;
        const char *dyr = g.nhwc ? (const char *)fm_tensor_data(dy) + n0 * g.P * g.O * (int64_t)es : (const char *)rows;
        if (!g.nhwc) rows_nchw(g, es, fm_tensor_data(dy), rows, n0, nb, 1);
        for (int64_t gi = 0; st == FM_OK && gi < g.G; gi++) {
            const char *dyg = dyr + gi * g.Og * (int64_t)es;
            if (dw) {
                im2col(g, es, fm_tensor_data(x), cols, n0, nb, gi);
                /* dw_g[Og, K] (+)= dy_rows[R, Og]^T @ cols[R, K]; chunks accumulate in order */
                st = fm_cuda_gemm_raw(dt, 1, 0, g.Og, g.K, R, dyg, g.O, 0, cols, g.K, 0,
                                      (char *)fm_tensor_data(dw) + gi * g.Og * g.K * (int64_t)es, g.K, 0, 1, n0 > 0,
                                      "conv2d_backward");
            }
            if (st == FM_OK && dx) {
                /* dcols[R, K] = dy_rows[R, Og] @ w_g[Og, K] */
                st = fm_cuda_gemm_raw(dt, 0, 0, R, g.K, g.Og, dyg, g.O, 0,
                                      (const char *)fm_tensor_data(w) + gi * g.Og * g.K * (int64_t)es, g.K, 0, dcols, g.K, 0,
                                      1, 0, "conv2d_backward");
                int64_t n = nb * g.Cg * g.H * g.W;
                if (st == FM_OK && n) {
                    if (dt == FM_F64) col2im_k<double><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(g, dcols, fm_tensor_data(dx), dt, n0, nb, gi);
                    else col2im_k<float><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(g, dcols, fm_tensor_data(dx), dt, n0, nb, gi);
                }
            }
        }
    }
    fm_cuda_scratch_free(cols);
    fm_cuda_scratch_free(dcols);
    fm_cuda_scratch_free(rows);
    if (st) return st;
    return fm_cuda_check_launch("conv2d_backward");
}

/* ----------------------------------------------------------------- pools */

/* fm_pool_geom, fm_pool_geometry: backend/conv_geom.h */

/* (n, c, h, w) of element e of a [N, C, hh, ww] tensor in the pool's layout, and back. */
__device__ __forceinline__ void p_coords(const fm_pool_geom &g, int64_t e, int64_t hh, int64_t ww, int64_t *n, int64_t *c, int64_t *h,
                                         int64_t *w) {
    if (g.nhwc) { *c = e % g.C; *w = (e / g.C) % ww; *h = (e / (g.C * ww)) % hh; *n = e / (g.C * ww * hh); }
    else { *w = e % ww; *h = (e / ww) % hh; *c = (e / (ww * hh)) % g.C; *n = e / (ww * hh * g.C); }
}
__device__ __forceinline__ int64_t p_index(const fm_pool_geom &g, int64_t n, int64_t c, int64_t h, int64_t w, int64_t hh, int64_t ww) {
    return g.nhwc ? ((n * hh + h) * ww + w) * g.C + c : ((n * g.C + c) * hh + h) * ww + w;
}

/* Window of output (oh, ow) clipped to the input, and its divisor. */
__device__ __forceinline__ void p_window(const fm_pool_geom &g, int64_t oh, int64_t ow, int64_t *hs, int64_t *he, int64_t *ws,
                                         int64_t *we, int64_t *cnt) {
    int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    *hs = h0 < 0 ? 0 : h0;
    *ws = w0 < 0 ? 0 : w0;
    *he = h0 + g.kh > g.H ? g.H : h0 + g.kh;
    *we = w0 + g.kw > g.W ? g.W : w0 + g.kw;
    /* count_include_pad: the padded cells, not those past them (a ceil_mode window) */
    const int64_t ph1 = h0 + g.kh < g.H + g.ph ? h0 + g.kh : g.H + g.ph, pw1 = w0 + g.kw < g.W + g.pw ? w0 + g.kw : g.W + g.pw;
    *cnt = g.include_pad ? (ph1 - h0) * (pw1 - w0) : (*he - *hs) * (*we - *ws);
}

/* Max pool: the first maximum wins; a NaN wins over everything (PyTorch, and the CPU). */
template <typename A>
__global__ void maxpool_k(fm_pool_geom g, const void *x, void *y, int64_t *idx, int dt) {
    int64_t total = g.N * g.C * g.Ho * g.Wo;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n, c, oh, ow, hs, he, ws, we, cnt;
        p_coords(g, e, g.Ho, g.Wo, &n, &c, &oh, &ow);
        p_window(g, oh, ow, &hs, &he, &ws, &we, &cnt);
        A best = (A)-INFINITY;
        int64_t bi = hs * g.W + ws;
        for (int64_t ih = hs; ih < he; ih++)
            for (int64_t iw = ws; iw < we; iw++) {
                A v = fm_ld<A>(x, dt, p_index(g, n, c, ih, iw, g.H, g.W));
                if (v > best || v != v) {
                    best = v;
                    bi = ih * g.W + iw;
                    if (v != v) goto done;
                }
            }
    done:
        fm_st<A>(y, dt, e, best);
        if (idx) idx[e] = bi; /* NULL: no backward wants them */
    }
}

/* Max pool backward as a gather: dx[h, w] sums dy over the windows holding it whose argmax is (h, w). */
template <typename A>
__global__ void maxpool_bwd_k(fm_pool_geom g, const void *dy, const int64_t *idx, void *dx, int dt) {
    int64_t total = g.N * g.C * g.H * g.W;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n, c, h, w;
        p_coords(g, e, g.H, g.W, &n, &c, &h, &w);
        int64_t oh0 = h + g.ph - g.kh + 1, ow0 = w + g.pw - g.kw + 1;
        oh0 = oh0 <= 0 ? 0 : (oh0 + g.sh - 1) / g.sh;
        ow0 = ow0 <= 0 ? 0 : (ow0 + g.sw - 1) / g.sw;
        int64_t oh1 = (h + g.ph) / g.sh, ow1 = (w + g.pw) / g.sw;
        if (oh1 > g.Ho - 1) oh1 = g.Ho - 1;
        if (ow1 > g.Wo - 1) ow1 = g.Wo - 1;
        A acc = 0;
        int64_t me = h * g.W + w;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t o = p_index(g, n, c, oh, ow, g.Ho, g.Wo);
                if (idx[o] == me) acc += fm_ld<A>(dy, dt, o);
            }
        fm_st<A>(dx, dt, e, acc);
    }
}

template <typename A>
__global__ void avgpool_k(fm_pool_geom g, const void *x, void *y, int dt) {
    int64_t total = g.N * g.C * g.Ho * g.Wo;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n, c, oh, ow, hs, he, ws, we, cnt;
        p_coords(g, e, g.Ho, g.Wo, &n, &c, &oh, &ow);
        p_window(g, oh, ow, &hs, &he, &ws, &we, &cnt);
        A s = 0;
        for (int64_t ih = hs; ih < he; ih++)
            for (int64_t iw = ws; iw < we; iw++) s += fm_ld<A>(x, dt, p_index(g, n, c, ih, iw, g.H, g.W));
        fm_st<A>(y, dt, e, cnt > 0 ? s / (A)cnt : (A)0);
    }
}

template <typename A>
__global__ void avgpool_bwd_k(fm_pool_geom g, const void *dy, void *dx, int dt) {
    int64_t total = g.N * g.C * g.H * g.W;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n, c, h, w;
        p_coords(g, e, g.H, g.W, &n, &c, &h, &w);
        int64_t oh0 = h + g.ph - g.kh + 1, ow0 = w + g.pw - g.kw + 1;
        oh0 = oh0 <= 0 ? 0 : (oh0 + g.sh - 1) / g.sh;
        ow0 = ow0 <= 0 ? 0 : (ow0 + g.sw - 1) / g.sw;
        int64_t oh1 = (h + g.ph) / g.sh, ow1 = (w + g.pw) / g.sw;
        if (oh1 > g.Ho - 1) oh1 = g.Ho - 1;
        if (ow1 > g.Wo - 1) ow1 = g.Wo - 1;
        A acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t hs, he, ws, we, cnt;
                p_window(g, oh, ow, &hs, &he, &ws, &we, &cnt);
                if (cnt <= 0) continue;
                acc += fm_ld<A>(dy, dt, p_index(g, n, c, oh, ow, g.Ho, g.Wo)) / (A)cnt;
            }
        fm_st<A>(dx, dt, e, acc);
    }
}

static fm_status k_max_pool2d(const fm_op_call *c) {
    const fm_pool2d_attrs *a = (const fm_pool2d_attrs *)c->attrs;
    fm_tensor *x = c->in[0], *y = c->out[0], *idx = c->out[1];
    if (!cuda_float_dt(x->dtype)) return fm_cuda_unsupported_dtype(c, x->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, x, y);
    int64_t n = fm_tensor_numel(y);
    if (!n) return FM_OK;
    unsigned bl = fm_cuda_blocks(n, 256);
    cudaStream_t s = fm_cuda_stream();
    int64_t *ip = idx ? (int64_t *)fm_tensor_data(idx) : NULL;
    if (x->dtype == FM_F64) maxpool_k<double><<<bl, 256, 0, s>>>(g, fm_tensor_data(x), fm_tensor_data(y), ip, x->dtype);
    else maxpool_k<float><<<bl, 256, 0, s>>>(g, fm_tensor_data(x), fm_tensor_data(y), ip, x->dtype);
    return fm_cuda_check_launch("max_pool2d");
}

static fm_status k_max_pool2d_backward(const fm_op_call *c) {
    const fm_pool2d_attrs *a = (const fm_pool2d_attrs *)c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1], *idx = c->in[2], *dx = c->out[0];
    if (!cuda_float_dt(x->dtype)) return fm_cuda_unsupported_dtype(c, x->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, x, dy);
    int64_t n = fm_tensor_numel(dx);
    if (!n) return FM_OK;
    unsigned bl = fm_cuda_blocks(n, 256);
    cudaStream_t s = fm_cuda_stream();
    if (x->dtype == FM_F64) maxpool_bwd_k<double><<<bl, 256, 0, s>>>(g, fm_tensor_data(dy), (const int64_t *)fm_tensor_data(idx), fm_tensor_data(dx), x->dtype);
    else maxpool_bwd_k<float><<<bl, 256, 0, s>>>(g, fm_tensor_data(dy), (const int64_t *)fm_tensor_data(idx), fm_tensor_data(dx), x->dtype);
    return fm_cuda_check_launch("max_pool2d_backward");
}

static fm_status k_avg_pool2d(const fm_op_call *c) {
    const fm_pool2d_attrs *a = (const fm_pool2d_attrs *)c->attrs;
    fm_tensor *x = c->in[0], *y = c->out[0];
    if (!cuda_float_dt(x->dtype)) return fm_cuda_unsupported_dtype(c, x->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, x, y);
    int64_t n = fm_tensor_numel(y);
    if (!n) return FM_OK;
    unsigned bl = fm_cuda_blocks(n, 256);
    cudaStream_t s = fm_cuda_stream();
    if (x->dtype == FM_F64) avgpool_k<double><<<bl, 256, 0, s>>>(g, fm_tensor_data(x), fm_tensor_data(y), x->dtype);
    else avgpool_k<float><<<bl, 256, 0, s>>>(g, fm_tensor_data(x), fm_tensor_data(y), x->dtype);
    return fm_cuda_check_launch("avg_pool2d");
}

static fm_status k_avg_pool2d_backward(const fm_op_call *c) {
    const fm_pool2d_attrs *a = (const fm_pool2d_attrs *)c->attrs;
    fm_tensor *dy = c->in[0], *dx = c->out[0];
    if (!cuda_float_dt(dy->dtype)) return fm_cuda_unsupported_dtype(c, dy->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, dx, dy);
    int64_t n = fm_tensor_numel(dx);
    if (!n) return FM_OK;
    unsigned bl = fm_cuda_blocks(n, 256);
    cudaStream_t s = fm_cuda_stream();
    if (dy->dtype == FM_F64) avgpool_bwd_k<double><<<bl, 256, 0, s>>>(g, fm_tensor_data(dy), fm_tensor_data(dx), dy->dtype);
    else avgpool_bwd_k<float><<<bl, 256, 0, s>>>(g, fm_tensor_data(dy), fm_tensor_data(dx), dy->dtype);
    return fm_cuda_check_launch("avg_pool2d_backward");
}

/* ------------------------------------------------------------ batch norm */

/* x viewed as [outer, C, inner] (channels last: inner = 1), as on the CPU. */
static void bn_shape(const fm_tensor *x, fm_layout layout, int64_t *outer, int64_t *C, int64_t *inner) {
    if (layout == FM_NHWC) {
        *C = x->shape[x->ndim - 1];
        *inner = 1;
        *outer = *C ? fm_tensor_numel(x) / *C : 0;
    } else {
        *outer = x->shape[0];
        *C = x->shape[1];
        *inner = 1;
        for (int d = 2; d < x->ndim; d++) *inner *= x->shape[d];
    }
}

typedef struct bn_args {
    int64_t outer, C, inner;
    int dt;
    const void *x, *w, *b, *dy;
    void *rm, *rv;            /* running stats (in place) or NULL */
    void *smean, *srstd;      /* forward: outputs; backward: inputs */
    void *dw, *db;
    double *stat;             /* [2, C] mean, rstd in double; backward: [3, C] coefficients */
    int training;
    double momentum, eps;
} bn_args;

/* One block per channel: statistics (training) or the running ones (eval), the running-stat
 * update, and the saved mean / rstd. */
__global__ void bn_stats_k(bn_args a) {
    __shared__ double sh[32];
    int64_t c = blockIdx.x, M = a.outer * a.inner;
    double mean, var;
    if (a.training) {
        double s = 0;
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x)
            s += fm_ld<double>(a.x, a.dt, ((m / a.inner) * a.C + c) * a.inner + m % a.inner);
        mean = fm_block_sum(s, sh) / (double)M;
        double ss = 0;
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
            double d = fm_ld<double>(a.x, a.dt, ((m / a.inner) * a.C + c) * a.inner + m % a.inner) - mean;
            ss += d * d;
        }
        var = fm_block_sum(ss, sh) / (double)M;
    } else {
        mean = fm_ld<double>(a.rm, a.dt, c);
        var = fm_ld<double>(a.rv, a.dt, c);
    }
    if (threadIdx.x == 0) {
        if (a.training) {
            if (a.rm) fm_st<double>(a.rm, a.dt, c, (1 - a.momentum) * fm_ld<double>(a.rm, a.dt, c) + a.momentum * mean);
            if (a.rv)
                fm_st<double>(a.rv, a.dt, c,
                              (1 - a.momentum) * fm_ld<double>(a.rv, a.dt, c) + a.momentum * var * (double)M / (double)(M - 1));
        }
        double rstd = 1.0 / sqrt(var + a.eps);
        a.stat[c] = mean;
        a.stat[a.C + c] = rstd;
        fm_st<double>(a.smean, a.dt, c, mean);
        fm_st<double>(a.srstd, a.dt, c, rstd);
    }
}

template <typename A>
__global__ void bn_apply_k(bn_args a, void *y) {
    int64_t total = a.outer * a.C * a.inner;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = (e / a.inner) % a.C;
        double sc = a.stat[a.C + c] * (a.w ? fm_ld<double>(a.w, a.dt, c) : 1.0);
        double v = (fm_ld<double>(a.x, a.dt, e) - a.stat[c]) * sc + (a.b ? fm_ld<double>(a.b, a.dt, c) : 0.0);
        fm_st<A>(y, a.dt, e, (A)v);
    }
}

/* Backward sums per channel (one block each): sum dy and sum dy * xhat; writes dweight, dbias
 * and the dx coefficients dx = A dy + B (x - mean) + K. */
__global__ void bn_bsum_k(bn_args a) {
    __shared__ double sh[32];
    int64_t c = blockIdx.x, M = a.outer * a.inner;
    double mean = fm_ld<double>(a.smean, a.dt, c), r = fm_ld<double>(a.srstd, a.dt, c);
    double s = 0, sx = 0;
    for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
        int64_t i = ((m / a.inner) * a.C + c) * a.inner + m % a.inner;
        double g = fm_ld<double>(a.dy, a.dt, i);
        s += g;
        sx += g * (fm_ld<double>(a.x, a.dt, i) - mean);
    }
    s = fm_block_sum(s, sh);
    sx = fm_block_sum(sx, sh) * r;
    if (threadIdx.x == 0) {
        if (a.dw) fm_st<double>(a.dw, a.dt, c, sx);
        if (a.db) fm_st<double>(a.db, a.dt, c, s);
        double wc = a.w ? fm_ld<double>(a.w, a.dt, c) : 1.0;
        a.stat[c] = wc * r;
        a.stat[a.C + c] = a.training ? -wc * r * r * sx / (double)M : 0.0;
        a.stat[2 * a.C + c] = a.training ? -wc * r * s / (double)M : 0.0;
    }
}

template <typename A>
__global__ void bn_dx_k(bn_args a, void *dx) {
    int64_t total = a.outer * a.C * a.inner;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = (e / a.inner) % a.C;
        double mean = fm_ld<double>(a.smean, a.dt, c);
        double v = a.stat[c] * fm_ld<double>(a.dy, a.dt, e) + a.stat[a.C + c] * (fm_ld<double>(a.x, a.dt, e) - mean) +
                   a.stat[2 * a.C + c];
        fm_st<A>(dx, a.dt, e, (A)v);
    }
}

static fm_status k_batch_norm(const fm_op_call *c) {
    const fm_bn_attrs *at = (const fm_bn_attrs *)c->attrs;
    fm_tensor *x = c->in[0];
    if (!cuda_float_dt(x->dtype)) return fm_cuda_unsupported_dtype(c, x->dtype);
    bn_args a;
    memset(&a, 0, sizeof a);
    bn_shape(x, at->layout, &a.outer, &a.C, &a.inner);
    if (a.C == 0) return FM_OK;
    a.dt = x->dtype;
    a.x = fm_tensor_data(x);
    a.w = c->in[1] ? fm_tensor_data(c->in[1]) : NULL;
    a.b = c->in[2] ? fm_tensor_data(c->in[2]) : NULL;
    a.rm = c->in[3] ? fm_tensor_data(c->in[3]) : NULL;
    a.rv = c->in[4] ? fm_tensor_data(c->in[4]) : NULL;
    a.smean = fm_tensor_data(c->out[1]);
    a.srstd = fm_tensor_data(c->out[2]);
    a.training = at->training;
    a.momentum = at->momentum;
    a.eps = at->eps;
    if (!a.training && (!a.rm || !a.rv))
        return fm_set_error(FM_ERR_INVALID, "batch_norm: eval mode needs running_mean and running_var");
    a.stat = (double *)fm_cuda_scratch_alloc((size_t)(2 * a.C) * sizeof(double));
    if (!a.stat) return fm_last_status();
    cudaStream_t s = fm_cuda_stream();
    bn_stats_k<<<(unsigned)a.C, 256, 0, s>>>(a);
    int64_t n = fm_tensor_numel(x);
    if (n) {
        if (a.dt == FM_F64) bn_apply_k<double><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(a, fm_tensor_data(c->out[0]));
        else bn_apply_k<float><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(a, fm_tensor_data(c->out[0]));
    }
    fm_cuda_scratch_free(a.stat);
    return fm_cuda_check_launch("batch_norm");
}

static fm_status k_batch_norm_backward(const fm_op_call *c) {
    const fm_bn_attrs *at = (const fm_bn_attrs *)c->attrs;
    fm_tensor *x = c->in[1], *dx = c->out[0];
    if (!cuda_float_dt(x->dtype)) return fm_cuda_unsupported_dtype(c, x->dtype);
    bn_args a;
    memset(&a, 0, sizeof a);
    bn_shape(x, at->layout, &a.outer, &a.C, &a.inner);
    if (a.C == 0) return FM_OK;
    a.dt = x->dtype;
    a.dy = fm_tensor_data(c->in[0]);
    a.x = fm_tensor_data(x);
    a.w = c->in[2] ? fm_tensor_data(c->in[2]) : NULL;
    a.smean = fm_tensor_data(c->in[3]);
    a.srstd = fm_tensor_data(c->in[4]);
    a.dw = c->out[1] ? fm_tensor_data(c->out[1]) : NULL;
    a.db = c->out[2] ? fm_tensor_data(c->out[2]) : NULL;
    a.training = at->training;
    a.stat = (double *)fm_cuda_scratch_alloc((size_t)(3 * a.C) * sizeof(double));
    if (!a.stat) return fm_last_status();
    cudaStream_t s = fm_cuda_stream();
    bn_bsum_k<<<(unsigned)a.C, 256, 0, s>>>(a);
    int64_t n = fm_tensor_numel(x);
    if (dx && n) {
        if (a.dt == FM_F64) bn_dx_k<double><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(a, fm_tensor_data(dx));
        else bn_dx_k<float><<<fm_cuda_blocks(n, 256), 256, 0, s>>>(a, fm_tensor_data(dx));
    }
    fm_cuda_scratch_free(a.stat);
    return fm_cuda_check_launch("batch_norm_backward");
}

extern "C" void fm_cuda_kernels_conv(fm_backend *b) {
    b->kernels[FM_OP_CONV2D] = k_conv2d;
    b->kernels[FM_OP_CONV2D_BACKWARD] = k_conv2d_backward;
    b->kernels[FM_OP_MAX_POOL2D] = k_max_pool2d;
    b->kernels[FM_OP_MAX_POOL2D_BACKWARD] = k_max_pool2d_backward;
    b->kernels[FM_OP_AVG_POOL2D] = k_avg_pool2d;
    b->kernels[FM_OP_AVG_POOL2D_BACKWARD] = k_avg_pool2d_backward;
    b->kernels[FM_OP_BATCH_NORM] = k_batch_norm;
    b->kernels[FM_OP_BATCH_NORM_BACKWARD] = k_batch_norm_backward;
}
