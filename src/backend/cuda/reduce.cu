/* CUDA reduction kernels: sum mean amax amin max_dim min_dim argmax var std
 * logsumexp. As on the CPU, the contiguous input is viewed as [outer, R, inner]
 * with the reduced axes in the middle. Rows of contiguous elements (inner == 1)
 * get one block each, reduced in shared memory; otherwise one thread per output
 * walks its column, so neighbouring threads read neighbouring addresses - for sums
 * and means of few long columns, split into row chunks whose partial sums a second
 * kernel adds in chunk order.
 * Sums accumulate in double (the CPU's rule); extrema follow the CPU's NaN and
 * tie rules: NaN wins, and the first occurrence wins ties. */
#include <math.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

typedef struct red_params {
    int op, dt, out_dt, correction;
    const void *x;
    void *out;
    int64_t *idx; /* MAX_DIM/MIN_DIM indices, ARGMAX output */
    int64_t outer, R, inner;
} red_params;

__device__ __forceinline__ bool is_max_op(int op) { return op == FM_OP_AMAX || op == FM_OP_MAX_DIM || op == FM_OP_ARGMAX; }
__device__ __forceinline__ bool is_ext_op(int op) {
    return op == FM_OP_AMAX || op == FM_OP_AMIN || op == FM_OP_MAX_DIM || op == FM_OP_MIN_DIM || op == FM_OP_ARGMAX;
}

/* Does candidate (v, i) beat (best, bi)? */
__device__ __forceinline__ bool better(bool mx, double v, int64_t i, double best, int64_t bi) {
    bool vn = v != v, bn = best != best;
    if (vn || bn) return vn && (!bn || i < bi);
    if (v == best) return i < bi;
    return mx ? v > best : v < best;
}

__device__ void write_out(const red_params &p, int64_t j, double v, int64_t arg) {
    if (p.op == FM_OP_ARGMAX) { p.idx[j] = arg; return; }
    fm_st<double>(p.out, p.out_dt, j, v);
    if (p.idx) p.idx[j] = arg;
}

/* One block per output row (inner == 1). */
__global__ void red_rows(red_params p) {
    __shared__ double sh[33]; /* 32 warps; [32]: the product's running value */
    __shared__ int64_t shi[32];
    int64_t j = blockIdx.x;
    const int64_t base = j * p.R;
    const int tid = threadIdx.x, nt = blockDim.x;
    if (is_ext_op(p.op)) {
        bool mx = is_max_op(p.op);
        double best = NAN;
        int64_t bi = -1;
        for (int64_t k = tid; k < p.R; k += nt) {
            double v = fm_ld<double>(p.x, p.dt, base + k);
            if (bi < 0 || better(mx, v, k, best, bi)) { best = v; bi = k; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            double ov = __shfl_xor_sync(0xffffffffu, best, o);
            int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || better(mx, ov, oi, best, bi))) { best = ov; bi = oi; }
        }
        if ((tid & 31) == 0) { sh[tid >> 5] = best; shi[tid >> 5] = bi; }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < (nt + 31) / 32; w++)
                if (shi[w] >= 0 && (bi < 0 || better(mx, sh[w], shi[w], best, bi))) { best = sh[w]; bi = shi[w]; }
            write_out(p, j, best, bi);
        }
        return;
    }
    if (p.op == FM_OP_PROD) { /* a product per thread, then thread 0 multiplies them in thread order */
        double q = 1;
        for (int64_t k = tid; k < p.R; k += nt) q *= fm_ld<double>(p.x, p.dt, base + k);
        for (int w = 0; w < nt; w += 32) { /* sh holds one warp's worth at a time */
            if (tid >= w && tid < w + 32) sh[tid - w] = q;
            __syncthreads();
            if (tid == 0) {
                double acc = w ? sh[32] : 1;
                for (int i = 0; i < 32 && w + i < nt; i++) acc *= sh[i];
                sh[32] = acc;
            }
            __syncthreads();
        }
        if (tid == 0) write_out(p, j, sh[32], 0);
        return;
    }
    if (p.op == FM_OP_LOGSUMEXP) {
        double m = -INFINITY;
        for (int64_t k = tid; k < p.R; k += nt) {
            double v = fm_ld<double>(p.x, p.dt, base + k);
            if (v > m || v != v) m = v;
        }
        m = fm_block_max<double>(m, sh);
        if (m == -INFINITY || m != m || m == INFINITY) { if (tid == 0) write_out(p, j, m, 0); return; }
        double s = 0;
        for (int64_t k = tid; k < p.R; k += nt) s += exp(fm_ld<double>(p.x, p.dt, base + k) - m);
        __syncthreads();
        s = fm_block_sum<double>(s, sh);
        if (tid == 0) write_out(p, j, m + log(s), 0);
        return;
    }
    double s = 0;
    for (int64_t k = tid; k < p.R; k += nt) s += fm_ld<double>(p.x, p.dt, base + k);
    s = fm_block_sum<double>(s, sh);
    if (p.op == FM_OP_SUM) { if (tid == 0) write_out(p, j, s, 0); return; }
    double mean = s / (double)p.R;
    if (p.op == FM_OP_MEAN) { if (tid == 0) write_out(p, j, mean, 0); return; }
    double m2 = 0; /* VAR/STD: second pass over the row, stable for large offsets */
    for (int64_t k = tid; k < p.R; k += nt) { double d = fm_ld<double>(p.x, p.dt, base + k) - mean; m2 += d * d; }
    __syncthreads();
    m2 = fm_block_sum<double>(m2, sh);
    if (tid == 0) {
        double den = (double)(p.R - p.correction);
        double var = den > 0 ? m2 / den : NAN;
        write_out(p, j, p.op == FM_OP_STD ? sqrt(var) : var, 0);
    }
}

/* One thread per output (inner > 1): serial walk down a strided column. */
__global__ void red_cols(red_params p) {
    int64_t nout = p.outer * p.inner;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < nout; j += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = j / p.inner, in = j % p.inner, base = o * p.R * p.inner + in, st = p.inner;
        if (is_ext_op(p.op)) {
            bool mx = is_max_op(p.op);
            double best = fm_ld<double>(p.x, p.dt, base);
            int64_t bi = 0;
            for (int64_t k = 1; k < p.R && best == best; k++) {
                double v = fm_ld<double>(p.x, p.dt, base + k * st);
                if (v != v || (mx ? v > best : v < best)) { best = v; bi = k; }
            }
            write_out(p, j, best, bi);
        } else if (p.op == FM_OP_LOGSUMEXP) {
            double m = -INFINITY;
            for (int64_t k = 0; k < p.R; k++) { double v = fm_ld<double>(p.x, p.dt, base + k * st); if (v > m || v != v) m = v; }
            if (m == -INFINITY || m != m || m == INFINITY) { write_out(p, j, m, 0); continue; }
            double s = 0;
            for (int64_t k = 0; k < p.R; k++) s += exp(fm_ld<double>(p.x, p.dt, base + k * st) - m);
            write_out(p, j, m + log(s), 0);
        } else if (p.op == FM_OP_PROD) {
            double q = 1;
            for (int64_t k = 0; k < p.R; k++) q *= fm_ld<double>(p.x, p.dt, base + k * st);
            write_out(p, j, q, 0);
        } else if (p.op == FM_OP_SUM || p.op == FM_OP_MEAN) {
            double s = 0;
            for (int64_t k = 0; k < p.R; k++) s += fm_ld<double>(p.x, p.dt, base + k * st);
            write_out(p, j, p.op == FM_OP_MEAN ? s / (double)p.R : s, 0);
        } else {
            double mean = 0, m2 = 0;
            for (int64_t k = 0; k < p.R; k++) {
                double v = fm_ld<double>(p.x, p.dt, base + k * st), d = v - mean;
                mean += d / (double)(k + 1);
                m2 += d * (v - mean);
            }
            double den = (double)(p.R - p.correction);
            double var = den > 0 ? m2 / den : NAN;
            write_out(p, j, p.op == FM_OP_STD ? sqrt(var) : var, 0);
        }
    }
}

/* Sums down columns split over row chunks: partial[(o * chunks + c) * inner + in] for rows
 * [c * rc, (c + 1) * rc) of column (o, in). One thread per column walked the whole column
 * before: a bias gradient (the sum of 8192 rows of 768 columns) had 768 threads, each
 * 8192 loads deep, on a 132-SM GPU. */
__global__ void red_cols_partial(red_params p, int64_t chunks, int64_t rc, double *part) {
    const int64_t in = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, o = blockIdx.z;
    if (in >= p.inner) return;
    const int64_t r0 = c * rc, r1 = r0 + rc < p.R ? r0 + rc : p.R, base = o * p.R * p.inner + in;
    double s = 0;
    for (int64_t k = r0; k < r1; k++) s += fm_ld<double>(p.x, p.dt, base + k * p.inner);
    part[(o * chunks + c) * p.inner + in] = s;
}

/* the chunks' partial sums of each column, in chunk order (deterministic) */
__global__ void red_cols_finish(red_params p, int64_t chunks, const double *part) {
    const int64_t nout = p.outer * p.inner;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < nout; j += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = j / p.inner, in = j % p.inner;
        double s = 0;
        for (int64_t c = 0; c < chunks; c++) s += part[(o * chunks + c) * p.inner + in];
        write_out(p, j, p.op == FM_OP_MEAN ? s / (double)p.R : s, 0);
    }
}

__global__ void fill_kernel(void *out, int dt, int64_t n, double v) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        fm_st<double>(out, dt, i, v);
}

static void block_of(const fm_tensor *x, unsigned mask, int64_t *outer, int64_t *R, int64_t *inner) {
    *outer = *R = *inner = 1;
    int first = -1, last = -1;
    for (int i = 0; i < x->ndim; i++)
        if (mask >> i & 1) { if (first < 0) first = i; last = i; }
    for (int i = 0; i < x->ndim; i++) {
        if (first < 0 || i < first) *outer *= x->shape[i];
        else if (i <= last) *R *= x->shape[i];
        else *inner *= x->shape[i];
    }
}

static fm_status k_reduce(const fm_op_call *c) {
    const fm_tensor *x = c->in[0];
    red_params p = {};
    p.op = c->op;
    p.dt = x->dtype;
    p.x = fm_tensor_data(x);
    p.out = fm_tensor_data(c->out[0]);
    p.out_dt = c->out[0]->dtype;
    if (c->op == FM_OP_ARGMAX) p.idx = (int64_t *)p.out;
    else if (c->n_out > 1 && c->out[1]) p.idx = (int64_t *)fm_tensor_data(c->out[1]);
    if (c->op == FM_OP_MAX_DIM || c->op == FM_OP_MIN_DIM || c->op == FM_OP_ARGMAX) {
        block_of(x, 1u << ((const fm_dim_attrs *)c->attrs)->axis, &p.outer, &p.R, &p.inner);
    } else {
        const fm_reduce_attrs *a = (const fm_reduce_attrs *)c->attrs;
        block_of(x, a->axes_mask, &p.outer, &p.R, &p.inner);
        p.correction = a->correction;
    }
    if (x->dtype == FM_BOOL && c->op != FM_OP_SUM && c->op != FM_OP_AMAX && c->op != FM_OP_AMIN)
        return fm_cuda_unsupported_dtype(c, x->dtype);
    int64_t nout = p.outer * p.inner;
    cudaStream_t s = fm_cuda_stream();
    if (nout == 0) return FM_OK;
    if (p.R == 0) {
        double v;
        if (c->op == FM_OP_SUM) v = 0;
        else if (c->op == FM_OP_MEAN || c->op == FM_OP_VAR || c->op == FM_OP_STD) v = NAN;
        else if (c->op == FM_OP_LOGSUMEXP) v = -INFINITY;
        else if (c->op == FM_OP_PROD) v = 1;
        else return fm_set_error(FM_ERR_INVALID, "%s: cannot reduce over an empty dimension", fm_cuda_op_name(c));
        fill_kernel<<<fm_cuda_blocks(nout, 256), 256, 0, s>>>(p.out, p.out_dt, nout, v);
        return fm_cuda_check_launch(fm_cuda_op_name(c));
    }
    if (p.inner == 1) {
        int threads = p.R >= 4096 ? 512 : (p.R >= 512 ? 256 : 64);
        for (int64_t done = 0; done < nout;) { /* grids are at most 2^31-1 blocks */
            int64_t chunk = nout - done < 2147483647LL ? nout - done : 2147483647LL;
            red_params q = p;
            q.x = (const char *)p.x + done * p.R * (int64_t)fm_dtype_size(x->dtype);
            q.out = p.op == FM_OP_ARGMAX ? p.out : (char *)p.out + done * (int64_t)fm_dtype_size(c->out[0]->dtype);
            if (p.idx) q.idx = p.idx + done;
            red_rows<<<(unsigned)chunk, threads, 0, s>>>(q);
            done += chunk;
        }
    } else if ((p.op == FM_OP_SUM || p.op == FM_OP_MEAN) && nout < (1 << 18) && p.R >= 64 && p.outer <= 65535) {
        /* few long columns: split the rows so that about 2^18 threads share the work, at
         * least 16 rows each */
        int64_t chunks = ((1 << 18) + nout - 1) / nout, most = p.R / 16;
        if (chunks > most) chunks = most;
        if (chunks > 65535) chunks = 65535;
        if (chunks < 1) chunks = 1;
        const int64_t rc = (p.R + chunks - 1) / chunks;
        chunks = (p.R + rc - 1) / rc;
        double *part = (double *)fm_cuda_scratch_alloc((size_t)(p.outer * chunks * p.inner) * sizeof(double));
        if (!part) return fm_last_status();
        dim3 grid((unsigned)((p.inner + 255) / 256), (unsigned)chunks, (unsigned)p.outer);
        red_cols_partial<<<grid, 256, 0, s>>>(p, chunks, rc, part);
        red_cols_finish<<<fm_cuda_blocks(nout, 256), 256, 0, s>>>(p, chunks, part);
        fm_cuda_scratch_free(part);
    } else {
        red_cols<<<fm_cuda_blocks(nout, 256), 256, 0, s>>>(p);
    }
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

/* CUMSUM: one thread per line (a fixed outer and inner index) down the axis, as the CPU:
 * floats accumulate in double, integers in int64, wrapping. Neighbouring threads take
 * neighbouring inner indices, so reads coalesce when inner > 1. */
__global__ void cumsum_kernel(const void *x, void *y, int dt, int64_t lines, int64_t n, int64_t inner, bool excl, bool rev) {
    const bool integer = dt != FM_F32 && dt != FM_F64 && dt != FM_F16 && dt != FM_BF16;
    for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = l / inner * n * inner + l % inner;
        double acc = 0;
        unsigned long long iacc = 0;
        for (int64_t k = 0; k < n; k++) {
            const int64_t at = base + (rev ? n - 1 - k : k) * inner;
            if (integer) {
                const unsigned long long v = (unsigned long long)fm_ld<long long>(x, dt, at);
                if (!excl) iacc += v;
                switch (dt) {
                case FM_I64: ((long long *)y)[at] = (long long)iacc; break;
                case FM_I32: ((int *)y)[at] = (int)(unsigned)iacc; break;
                case FM_I8: ((signed char *)y)[at] = (signed char)(unsigned char)iacc; break;
                default: ((unsigned char *)y)[at] = (unsigned char)iacc; break;
                }
                if (excl) iacc += v;
            } else {
                const double v = fm_ld<double>(x, dt, at);
                if (!excl) acc += v;
                fm_st<double>(y, dt, at, acc);
                if (excl) acc += v;
            }
        }
    }
}

static fm_status k_cumsum(const fm_op_call *c) {
    const fm_cumsum_attrs *a = (const fm_cumsum_attrs *)c->attrs;
    const fm_tensor *x = c->in[0];
    if (x->dtype == FM_BOOL) return fm_cuda_unsupported_dtype(c, x->dtype);
    int64_t outer = 1, n = x->ndim ? x->shape[a->axis] : 1, inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < a->axis) outer *= x->shape[i];
        else if (i > a->axis) inner *= x->shape[i];
    }
    if (outer * n * inner == 0) return FM_OK;
    cumsum_kernel<<<fm_cuda_blocks(outer * inner, 256), 256, 0, fm_cuda_stream()>>>(
        fm_tensor_data(x), fm_tensor_data(c->out[0]), x->dtype, outer * inner, n, inner, a->exclusive, a->reverse);
    return fm_cuda_check_launch(fm_cuda_op_name(c));
}

/* Every op of the REDUCE group of ops.def, and CUMSUM. */
extern "C" void fm_cuda_kernels_reduce(fm_backend *b) {
    for (int op = 0; op < FM_OP_COUNT; op++)
        if (fm_op_get_info((fm_op_id)op)->group == FM_GROUP_REDUCE) b->kernels[op] = k_reduce;
    b->kernels[FM_OP_CUMSUM] = k_cumsum;
}
