/* CUDA kernels for indexing ops: cat, gather, scatter_add, scatter, scatter_nd, index_select,
 * index_add, one_hot and topk, with the CPU kernels' semantics (index_cpu.c, topk_cpu.c).
 *
 * Data movement (cat, gather, index_select) works for every dtype by element
 * size. The accumulating backwards are deterministic without float atomics:
 * every output element is owned by one thread that adds its contributions in
 * index order, the CPU's order (scatter_add: one thread per "line", all
 * coordinates but the axis; index_add: one thread per (outer, column)). Halves
 * accumulate in an f32 copy that is rounded once at the end. Indices are
 * validated on the device first; a bad one raises a flag that is read back
 * and reported with the CPU's wording. */
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/scalar_math.h"
#include "backend/scatter_nd.h"

__device__ __forceinline__ int64_t idx_at(const void *p, int dt, int64_t i) {
    return dt == FM_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

__global__ void find_bad(const void *idx, int idt, int64_t n, int64_t S, unsigned long long *flag) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = idx_at(idx, idt, i);
        if (v < 0 || v >= S) atomicMin(flag, (unsigned long long)i + 1);
    }
}

/* y[o, l, i] = t[o, idx[l], i], moved as raw elements of size es. */
__global__ void index_select_k(const char *src, char *dst, const void *idx, int idt, int64_t outer, int64_t S, int64_t L,
                               int64_t inner, int es) {
    int64_t n = outer * L * inner;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e % inner, l = (e / inner) % L, o = e / (inner * L);
        int64_t s = ((o * S + idx_at(idx, idt, l)) * inner + i) * es;
        for (int b = 0; b < es; b++) dst[e * es + b] = src[s + b];
    }
}

__global__ void one_hot_k(const void *idx, int idt, int64_t n, int64_t K, float *y) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * K; e += (int64_t)gridDim.x * blockDim.x)
        y[e] = idx_at(idx, idt, e / K) == e % K ? 1.0f : 0.0f;
}

/* Position of the first bad index, or -1 (synchronizes the stream). */
static fm_status first_bad(const fm_op_call *c, const fm_tensor *idx, int64_t S, int64_t *pos, int64_t *val) {
    *pos = -1;
    if (idx->dtype != FM_I64 && idx->dtype != FM_I32)
        return fm_set_error(FM_ERR_INVALID, "%s: index dtype %s must be i64 or i32", fm_cuda_op_name(c), fm_dtype_name(idx->dtype));
    int64_t n = fm_tensor_numel(idx);
    if (!n) return FM_OK;
    unsigned long long *flag = (unsigned long long *)fm_cuda_scratch_alloc(8), h = 0;
    if (!flag) return fm_last_status();
    cudaStream_t s = fm_cuda_stream();
    fm_status st = fm_cuda_check(cudaMemsetAsync(flag, 0xff, 8, s), fm_cuda_op_name(c));
    if (!st) {
        find_bad<<<fm_cuda_blocks(n, 256), 256, 0, s>>>(fm_tensor_data(idx), idx->dtype, n, S, flag);
        st = fm_cuda_check_launch(fm_cuda_op_name(c));
    }
    if (!st) st = fm_cuda_check(cudaMemcpyAsync(&h, flag, 8, cudaMemcpyDeviceToHost, s), fm_cuda_op_name(c));
    if (!st) st = fm_cuda_check(cudaStreamSynchronize(s), fm_cuda_op_name(c));
    fm_cuda_scratch_free(flag);
    if (st || h == ~0ULL) return st;
    *pos = (int64_t)h - 1;
    size_t es = fm_dtype_size(idx->dtype);
    int64_t v = 0;
    st = fm_cuda_check(cudaMemcpy(&v, (const char *)fm_tensor_data(idx) + *pos * (int64_t)es, es, cudaMemcpyDeviceToHost),
                       fm_cuda_op_name(c));
    *val = es == 4 ? (int64_t)(int32_t)v : v;
    return st;
}

static fm_status index_error(const char *op, int64_t v, int axis, int64_t size) {
    return fm_set_error(FM_ERR_INVALID, "%s: index %lld is out of range for axis %d with size %lld (valid: 0..%lld)", op,
                        (long long)v, axis, (long long)size, (long long)(size - 1));
}

static fm_status k_index_select(const fm_op_call *c) {
    const fm_axis_attrs *a = (const fm_axis_attrs *)c->attrs;
    const fm_tensor *t = c->in[0], *idx = c->in[1];
    int64_t outer = 1, inner = 1, S = t->shape[a->axis], L = fm_tensor_numel(idx), pos, val;
    for (int d = 0; d < a->axis; d++) outer *= t->shape[d];
    for (int d = a->axis + 1; d < t->ndim; d++) inner *= t->shape[d];
    fm_status st = first_bad(c, idx, S, &pos, &val);
    if (st) return st;
    if (pos >= 0) return index_error("index_select", val, a->axis, S);
    int64_t n = outer * L * inner;
    if (n) index_select_k<<<fm_cuda_blocks(n, 256), 256, 0, fm_cuda_stream()>>>(
        (const char *)fm_tensor_data(t), (char *)fm_tensor_data(c->out[0]), fm_tensor_data(idx), idx->dtype, outer, S, L,
        inner, (int)fm_dtype_size(t->dtype));
    return fm_cuda_check_launch("index_select");
}

static fm_status k_one_hot(const fm_op_call *c) {
    const fm_one_hot_attrs *a = (const fm_one_hot_attrs *)c->attrs;
    const fm_tensor *idx = c->in[0];
    int64_t n = fm_tensor_numel(idx), K = a->num_classes, pos, val;
    if (c->out[0]->dtype != FM_F32) return fm_cuda_unsupported_dtype(c, c->out[0]->dtype);
    fm_status st = first_bad(c, idx, K, &pos, &val);
    if (st) return st;
    if (pos >= 0)
        return fm_set_error(FM_ERR_INVALID, "one_hot: index %lld is out of range for num_classes %lld (valid: 0..%lld)",
                            (long long)val, (long long)K, (long long)(K - 1));
    if (n * K) one_hot_k<<<fm_cuda_blocks(n * K, 256), 256, 0, fm_cuda_stream()>>>(fm_tensor_data(idx), idx->dtype, n, K, (float *)fm_tensor_data(c->out[0]));
    return fm_cuda_check_launch("one_hot");
}

/* ------------------------------------------------------------------- cat */

/* One input's elements (any strides) into its slab of the contiguous output. */
typedef struct cat_geom {
    int ndim, ax;
    int64_t shape[FM_MAX_DIMS], st[FM_MAX_DIMS]; /* the input */
    int64_t out_axis, off;                        /* output size along ax, this input's start */
    int64_t inner;                                /* output elements after the axis */
} cat_geom;

template <typename R>
__global__ void cat_k(cat_geom g, const R *src, R *dst, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = e, so = 0, ia = 0, in = 0, inner_stride = 1;
        for (int d = g.ndim - 1; d >= 0; d--) {
            int64_t i = rem % g.shape[d];
            rem /= g.shape[d];
            so += i * g.st[d];
            if (d > g.ax) { in += i * inner_stride; inner_stride *= g.shape[d]; }
            else if (d == g.ax) ia = i;
        }
        int64_t outer = e / (g.shape[g.ax] * g.inner);
        dst[(outer * g.out_axis + g.off + ia) * g.inner + in] = src[so];
    }
}

static fm_status k_cat(const fm_op_call *c) {
    const fm_axis_attrs *a = (const fm_axis_attrs *)c->attrs;
    fm_tensor *y = c->out[0];
    size_t es = fm_dtype_size(y->dtype);
    if (es != 1 && es != 2 && es != 4 && es != 8) return fm_cuda_unsupported_dtype(c, y->dtype);
    cudaStream_t s = fm_cuda_stream();
    int64_t off = 0, inner = 1;
    for (int d = a->axis + 1; d < y->ndim; d++) inner *= y->shape[d];
    for (int i = 0; i < c->n_in; i++) {
        const fm_tensor *t = c->var_in[i];
        int64_t n = fm_tensor_numel(t);
        cat_geom g;
        memset(&g, 0, sizeof g);
        g.ndim = t->ndim;
        g.ax = a->axis;
        for (int d = 0; d < t->ndim; d++) { g.shape[d] = t->shape[d]; g.st[d] = t->strides[d]; }
        g.out_axis = y->shape[a->axis];
        g.off = off;
        g.inner = inner;
        off += t->shape[a->axis];
        if (!n) continue;
        /* raw pointer of element 0 (fm_tensor_data applies the view's offset) */
        const void *src = fm_tensor_data(t);
        unsigned bl = fm_cuda_blocks(n, 256);
        switch (es) {
        case 1: cat_k<uint8_t><<<bl, 256, 0, s>>>(g, (const uint8_t *)src, (uint8_t *)fm_tensor_data(y), n); break;
        case 2: cat_k<uint16_t><<<bl, 256, 0, s>>>(g, (const uint16_t *)src, (uint16_t *)fm_tensor_data(y), n); break;
        case 4: cat_k<uint32_t><<<bl, 256, 0, s>>>(g, (const uint32_t *)src, (uint32_t *)fm_tensor_data(y), n); break;
        default: cat_k<uint64_t><<<bl, 256, 0, s>>>(g, (const uint64_t *)src, (uint64_t *)fm_tensor_data(y), n); break;
        }
        fm_status st = fm_cuda_check_launch("cat");
        if (st) return st;
    }
    return FM_OK;
}

/* ------------------------------------------------- gather / scatter_add */

/* Index-shaped arrays (index, gather's output, scatter's src) and the input / target
 * (its own shape), both contiguous. A "line" = all elements that differ only along the axis. */
typedef struct line_geom {
    int ndim, ax;
    int64_t ishape[FM_MAX_DIMS];
    int64_t tstride[FM_MAX_DIMS];
    int64_t inner, A, T;
} line_geom;

static line_geom make_line_geom(const fm_tensor *t, const fm_tensor *idx, int ax) {
    line_geom g;
    memset(&g, 0, sizeof g);
    g.ndim = idx->ndim;
    g.ax = ax;
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) { g.tstride[d] = s; s *= t->shape[d]; }
    for (int d = 0; d < idx->ndim; d++) g.ishape[d] = idx->shape[d];
    g.inner = 1;
    for (int d = ax + 1; d < idx->ndim; d++) g.inner *= idx->shape[d];
    g.A = idx->ndim ? idx->shape[ax] : 1;
    g.T = t->ndim ? t->shape[ax] : 1;
    return g;
}

/* Offsets of line L's first element in index-shaped arrays (*io) and in the target (*to). */
__device__ __forceinline__ void line_offsets(const line_geom &g, int64_t L, int64_t *io, int64_t *to) {
    int64_t o = L / g.inner, r = L % g.inner, ti = 0;
    for (int d = g.ndim - 1; d > g.ax; d--) { ti += (r % g.ishape[d]) * g.tstride[d]; r /= g.ishape[d]; }
    for (int d = g.ax - 1; d >= 0; d--) { ti += (o % g.ishape[d]) * g.tstride[d]; o /= g.ishape[d]; }
    *io = (L / g.inner) * g.A * g.inner + L % g.inner;
    *to = ti;
}

/* gather: one thread per index element. */
template <typename R>
__global__ void gather_k(line_geom g, const R *src, const void *idx, int idt, R *dst, int64_t n) {
    int64_t ts = g.ndim ? g.tstride[g.ax] : 1;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t L = (e / (g.A * g.inner)) * g.inner + e % g.inner, io, to;
        line_offsets(g, L, &io, &to);
        dst[e] = src[to + idx_at(idx, idt, e) * ts];
    }
}

/* scatter_add: one thread per line, adding in index order (acc holds the base already). */
template <typename A>
__global__ void scatter_add_k(line_geom g, A *acc, const void *src, int sdt, const void *idx, int idt, int64_t lines) {
    int64_t ts = g.ndim ? g.tstride[g.ax] : 1;
    for (int64_t L = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; L < lines; L += (int64_t)gridDim.x * blockDim.x) {
        int64_t io, to;
        line_offsets(g, L, &io, &to);
        for (int64_t a = 0; a < g.A; a++, io += g.inner) acc[to + idx_at(idx, idt, io) * ts] += fm_ld<A>(src, sdt, io);
    }
}

/* index_add: base [outer, S, inner], src [outer, L, inner]; one thread per (outer, column). */
template <typename A>
__global__ void index_add_k(A *acc, const void *src, int sdt, const void *idx, int idt, int64_t outer, int64_t S, int64_t L,
                            int64_t inner) {
    int64_t n = outer * inner;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = e / inner, k = e % inner;
        for (int64_t l = 0; l < L; l++)
            acc[(o * S + idx_at(idx, idt, l)) * inner + k] += fm_ld<A>(src, sdt, (o * L + l) * inner + k);
    }
}

/* dtype conversion between an accumulator and a tensor (halves only). */
__global__ void to_f32_k(const void *src, int dt, float *dst, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        dst[e] = fm_ld<float>(src, dt, e);
}
__global__ void from_f32_k(const float *src, void *dst, int dt, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        fm_st<float>(dst, dt, e, src[e]);
}

static fm_status k_gather(const fm_op_call *c) {
    const fm_axis_attrs *a = (const fm_axis_attrs *)c->attrs;
    fm_tensor *t = c->in[0], *idx = c->in[1], *y = c->out[0];
    line_geom g = make_line_geom(t, idx, a->axis);
    int64_t pos, val;
    fm_status st = first_bad(c, idx, g.T, &pos, &val);
    if (st) return st;
    if (pos >= 0) return index_error("gather", val, a->axis, g.T);
    int64_t n = fm_tensor_numel(idx);
    if (!n) return FM_OK;
    size_t es = fm_dtype_size(t->dtype);
    unsigned bl = fm_cuda_blocks(n, 256);
    cudaStream_t s = fm_cuda_stream();
    const void *src = fm_tensor_data(t), *ip = fm_tensor_data(idx);
    void *dst = fm_tensor_data(y);
    switch (es) {
    case 1: gather_k<uint8_t><<<bl, 256, 0, s>>>(g, (const uint8_t *)src, ip, idx->dtype, (uint8_t *)dst, n); break;
    case 2: gather_k<uint16_t><<<bl, 256, 0, s>>>(g, (const uint16_t *)src, ip, idx->dtype, (uint16_t *)dst, n); break;
    case 4: gather_k<uint32_t><<<bl, 256, 0, s>>>(g, (const uint32_t *)src, ip, idx->dtype, (uint32_t *)dst, n); break;
    case 8: gather_k<uint64_t><<<bl, 256, 0, s>>>(g, (const uint64_t *)src, ip, idx->dtype, (uint64_t *)dst, n); break;
    default: return fm_cuda_unsupported_dtype(c, t->dtype);
    }
    return fm_cuda_check_launch("gather");
}

/* The accumulator of scatter_add / index_add: the output itself (f32/f64) or an f32 copy
 * (halves); in both cases initialized from the base. */
static fm_status acc_begin(const fm_op_call *c, fm_tensor *base, fm_tensor *y, void **acc) {
    cudaStream_t s = fm_cuda_stream();
    int64_t n = fm_tensor_numel(y);
    if (y->dtype == FM_F32 || y->dtype == FM_F64) {
        *acc = fm_tensor_data(y);
        if (fm_tensor_data(y) == fm_tensor_data(base) || !n) return FM_OK;
        return fm_cuda_check(cudaMemcpyAsync(fm_tensor_data(y), fm_tensor_data(base), fm_tensor_nbytes(y), cudaMemcpyDeviceToDevice, s),
                             fm_cuda_op_name(c));
    }
    if (y->dtype != FM_F16 && y->dtype != FM_BF16) return fm_cuda_unsupported_dtype(c, y->dtype);
    *acc = fm_cuda_scratch_alloc((size_t)n * sizeof(float));
    if (!*acc) return fm_last_status();
    if (n) to_f32_k<<<fm_cuda_blocks(n, 256), 256, 0, s>>>(fm_tensor_data(base), base->dtype, (float *)*acc, n);
    return FM_OK;
}
static void acc_end(fm_tensor *y, void *acc) {
    if (acc == fm_tensor_data(y)) return;
    int64_t n = fm_tensor_numel(y);
    if (n) from_f32_k<<<fm_cuda_blocks(n, 256), 256, 0, fm_cuda_stream()>>>((const float *)acc, fm_tensor_data(y), y->dtype, n);
    fm_cuda_scratch_free(acc);
}

static fm_status k_scatter_add(const fm_op_call *c) {
    const fm_axis_attrs *a = (const fm_axis_attrs *)c->attrs;
    fm_tensor *base = c->in[0], *idx = c->in[1], *src = c->in[2], *y = c->out[0];
    line_geom g = make_line_geom(base, idx, a->axis);
    int64_t pos, val;
    fm_status st = first_bad(c, idx, g.T, &pos, &val);
    if (st) return st;
    if (pos >= 0) return index_error("scatter_add", val, a->axis, g.T);
    void *acc = NULL;
    if ((st = acc_begin(c, base, y, &acc))) return st;
    int64_t lines = g.A ? fm_tensor_numel(idx) / g.A : 0;
    if (lines > 0) {
        unsigned bl = fm_cuda_blocks(lines, 128);
        if (y->dtype == FM_F64)
            scatter_add_k<double><<<bl, 128, 0, fm_cuda_stream()>>>(g, (double *)acc, fm_tensor_data(src), src->dtype, fm_tensor_data(idx), idx->dtype, lines);
        else
            scatter_add_k<float><<<bl, 128, 0, fm_cuda_stream()>>>(g, (float *)acc, fm_tensor_data(src), src->dtype, fm_tensor_data(idx), idx->dtype, lines);
    }
    acc_end(y, acc);
    return fm_cuda_check_launch("scatter_add");
}

/* scatter / scatter_nd: the updates of one output element are applied by one thread in index
 * order, the CPU's order (scatter: a thread per line; scatter_nd: a thread per slice column,
 * walking the updates). none moves raw elements; the reductions combine in double
 * (fm_scatter_combine_d, shared with the CPU). */
__device__ __forceinline__ void scatter_put(void *dst, int64_t p, const void *src, int64_t q, int dt, int es, int r) {
    if (r == FM_SCATTER_NONE) {
        for (int b = 0; b < es; b++) ((char *)dst)[p * es + b] = ((const char *)src)[q * es + b];
        return;
    }
    fm_st<double>(dst, dt, p, fm_scatter_combine_d(r, fm_ld<double>(dst, dt, p), fm_ld<double>(src, dt, q)));
}

__global__ void scatter_k(line_geom g, void *dst, const void *src, int dt, int es, const void *idx, int idt, int64_t lines, int r) {
    int64_t ts = g.ndim ? g.tstride[g.ax] : 1;
    for (int64_t L = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; L < lines; L += (int64_t)gridDim.x * blockDim.x) {
        int64_t io, to;
        line_offsets(g, L, &io, &to);
        for (int64_t a = 0; a < g.A; a++, io += g.inner) scatter_put(dst, to + idx_at(idx, idt, io) * ts, src, io, dt, es, r);
    }
}

__global__ void scatter_nd_k(void *dst, const void *src, int dt, int es, const int64_t *off, int64_t m, int64_t slice, int r) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < slice; k += (int64_t)gridDim.x * blockDim.x)
        for (int64_t i = 0; i < m; i++) scatter_put(dst, off[i] + k, src, i * slice + k, dt, es, r);
}

static fm_status scatter_begin(const fm_op_call *c, const fm_tensor *t, fm_tensor *y) {
    if (fm_tensor_data(y) == fm_tensor_data(t) || !fm_tensor_numel(y)) return FM_OK;
    return fm_cuda_check(cudaMemcpyAsync(fm_tensor_data(y), fm_tensor_data(t), fm_tensor_nbytes(y), cudaMemcpyDeviceToDevice, fm_cuda_stream()),
                         fm_cuda_op_name(c));
}

static fm_status k_scatter(const fm_op_call *c) {
    const fm_scatter_attrs *a = (const fm_scatter_attrs *)c->attrs;
    fm_tensor *t = c->in[0], *idx = c->in[1], *src = c->in[2], *y = c->out[0];
    line_geom g = make_line_geom(t, idx, a->axis);
    int64_t pos, val;
    fm_status st = first_bad(c, idx, g.T, &pos, &val);
    if (st) return st;
    if (pos >= 0) return index_error("scatter", val, a->axis, g.T);
    if ((st = scatter_begin(c, t, y))) return st;
    int64_t lines = g.A ? fm_tensor_numel(idx) / g.A : 0;
    if (lines > 0)
        scatter_k<<<fm_cuda_blocks(lines, 128), 128, 0, fm_cuda_stream()>>>(g, fm_tensor_data(y), fm_tensor_data(src), y->dtype,
                                                                            (int)fm_dtype_size(y->dtype), fm_tensor_data(idx), idx->dtype, lines, a->reduce);
    return fm_cuda_check_launch("scatter");
}

/* The index tuples are read back to the host, checked and turned into offsets there
 * (backend/scatter_nd.h, the CPU's code), then copied to the device. */
static fm_status k_scatter_nd(const fm_op_call *c) {
    const fm_scatter_attrs *a = (const fm_scatter_attrs *)c->attrs;
    fm_tensor *t = c->in[0], *idx = c->in[1], *up = c->in[2], *y = c->out[0];
    const int k = (int)idx->shape[idx->ndim - 1];
    int64_t m = k ? fm_tensor_numel(idx) / k : 0, slice = 1;
    for (int d = k; d < t->ndim; d++) slice *= t->shape[d];
    size_t ib = fm_tensor_nbytes(idx), ob = sizeof(int64_t) * (size_t)(m > 0 ? m : 1);
    void *hi = malloc(ib ? ib : 1);
    int64_t *off = (int64_t *)malloc(ob);
    fm_status st = hi && off ? FM_OK : fm_set_error(FM_ERR_OOM, "scatter_nd: out of host memory for %lld index tuples", (long long)m);
    if (!st && ib) st = fm_cuda_check(cudaMemcpy(hi, fm_tensor_data(idx), ib, cudaMemcpyDeviceToHost), "scatter_nd");
    if (!st) st = fm_scatter_nd_offsets(hi, idx->dtype, m, k, t->shape, slice, off);
    free(hi);
    int64_t *doff = NULL;
    if (!st) st = scatter_begin(c, t, y);
    if (!st && m > 0 && slice > 0) {
        if (!(doff = (int64_t *)fm_cuda_scratch_alloc(ob))) st = fm_last_status();
        if (!st) st = fm_cuda_check(cudaMemcpyAsync(doff, off, ob, cudaMemcpyHostToDevice, fm_cuda_stream()), "scatter_nd");
        if (!st) {
            scatter_nd_k<<<fm_cuda_blocks(slice, 128), 128, 0, fm_cuda_stream()>>>(fm_tensor_data(y), fm_tensor_data(up), y->dtype,
                                                                                  (int)fm_dtype_size(y->dtype), doff, m, slice, a->reduce);
            st = fm_cuda_check_launch("scatter_nd");
        }
        if (!st) st = fm_cuda_check(cudaStreamSynchronize(fm_cuda_stream()), "scatter_nd"); /* off is freed next */
        if (doff) fm_cuda_scratch_free(doff);
    }
    free(off);
    return st;
}

static fm_status k_index_add(const fm_op_call *c) {
    const fm_axis_attrs *a = (const fm_axis_attrs *)c->attrs;
    fm_tensor *base = c->in[0], *idx = c->in[1], *src = c->in[2], *y = c->out[0];
    int64_t outer = 1, inner = 1, S = base->shape[a->axis], L = fm_tensor_numel(idx), pos, val;
    for (int d = 0; d < a->axis; d++) outer *= base->shape[d];
    for (int d = a->axis + 1; d < base->ndim; d++) inner *= base->shape[d];
    fm_status st = first_bad(c, idx, S, &pos, &val);
    if (st) return st;
    if (pos >= 0) return index_error("index_add", val, a->axis, S);
    void *acc = NULL;
    if ((st = acc_begin(c, base, y, &acc))) return st;
    int64_t n = outer * inner;
    if (n > 0 && L > 0) {
        unsigned bl = fm_cuda_blocks(n, 256);
        if (y->dtype == FM_F64)
            index_add_k<double><<<bl, 256, 0, fm_cuda_stream()>>>((double *)acc, fm_tensor_data(src), src->dtype, fm_tensor_data(idx), idx->dtype, outer, S, L, inner);
        else
            index_add_k<float><<<bl, 256, 0, fm_cuda_stream()>>>((float *)acc, fm_tensor_data(src), src->dtype, fm_tensor_data(idx), idx->dtype, outer, S, L, inner);
    }
    acc_end(y, acc);
    return fm_cuda_check_launch("index_add");
}

/* topk: a block per line and k rounds; each round every thread finds, among its elements, the
 * first (in the output's order: value, then index) that comes after the previous round's pick,
 * and the block reduces those to one. The order is the CPU's (topk_cpu.c): NaN above every
 * number, equal values lower index first; integers compare as i64, floats as f64. O(k n /
 * 256) per line: made for sampling's and detection's k (a few to a few hundred); k near a
 * long line's length would want a sort instead. */
struct tk_key { double f; long long n, i; };

__device__ __forceinline__ tk_key tk_load(const void *x, int dt, bool fl, int64_t p, int64_t i) {
    tk_key k = {0, 0, (long long)i};
    if (fl) k.f = fm_ld<double>(x, dt, p);
    else k.n = dt == FM_I64 ? ((const long long *)x)[p] : dt == FM_I32 ? ((const int *)x)[p]
             : dt == FM_I8 ? ((const signed char *)x)[p] : ((const unsigned char *)x)[p];
    return k;
}

/* Whether a comes before b. */
__device__ __forceinline__ bool tk_first(const tk_key &a, const tk_key &b, bool fl, bool largest) {
    bool na = fl && a.f != a.f, nb = fl && b.f != b.f;
    int r = na || nb ? (int)na - (int)nb : fl ? (a.f > b.f) - (a.f < b.f) : (a.n > b.n) - (a.n < b.n);
    if (!largest) r = -r;
    return r > 0 || (r == 0 && a.i < b.i);
}

#define TK_THREADS 256
__global__ void topk_k(const char *x, char *val, long long *idx, int dt, int es, bool fl, bool largest, int64_t n, int64_t k,
                       int64_t inner, int64_t lines) {
    __shared__ tk_key best[TK_THREADS];
    __shared__ int has[TK_THREADS];
    const int t = threadIdx.x;
    for (int64_t L = blockIdx.x; L < lines; L += gridDim.x) {
        const int64_t o = L / inner, in = L % inner, base = o * n * inner + in;
        tk_key prev = {0, 0, -1};
        for (int64_t r = 0; r < k; r++) {
            tk_key mine = {0, 0, -1};
            int got = 0;
            for (int64_t i = t; i < n; i += TK_THREADS) {
                tk_key c = tk_load(x, dt, fl, base + i * inner, i);
                if (r && !tk_first(prev, c, fl, largest)) continue; /* taken already */
                if (!got || tk_first(c, mine, fl, largest)) mine = c, got = 1;
            }
            best[t] = mine, has[t] = got;
            __syncthreads();
            for (int s = TK_THREADS / 2; s > 0; s >>= 1) {
                if (t < s && has[t + s] && (!has[t] || tk_first(best[t + s], best[t], fl, largest))) best[t] = best[t + s], has[t] = 1;
                __syncthreads();
            }
            prev = best[0];
            if (t == 0) {
                const int64_t to = (o * k + r) * inner + in;
                for (int b = 0; b < es; b++) val[to * es + b] = x[(base + prev.i * inner) * es + b];
                idx[to] = prev.i;
            }
            __syncthreads();
        }
    }
}

/* in = {x (contiguous)}, out = {values, indices i64}. */
static fm_status k_topk(const fm_op_call *c) {
    const fm_topk_attrs *a = (const fm_topk_attrs *)c->attrs;
    const fm_tensor *x = c->in[0];
    int64_t n = x->shape[a->axis], inner = 1;
    for (int d = a->axis + 1; d < x->ndim; d++) inner *= x->shape[d];
    int64_t lines = n ? fm_tensor_numel(x) / n : 0;
    if (!a->k || !lines) return FM_OK;
    unsigned bl = (unsigned)(lines < 65535 ? lines : 65535);
    topk_k<<<bl, TK_THREADS, 0, fm_cuda_stream()>>>((const char *)fm_tensor_data(x), (char *)fm_tensor_data(c->out[0]),
                                                   (long long *)fm_tensor_data(c->out[1]), x->dtype, (int)fm_dtype_size(x->dtype),
                                                   fm_dtype_is_float(x->dtype), a->largest != 0, n, a->k, inner, lines);
    return fm_cuda_check_launch("topk");
}

extern "C" void fm_cuda_kernels_index(fm_backend *b) {
    b->kernels[FM_OP_TOPK] = k_topk;
    b->kernels[FM_OP_CAT] = k_cat;
    b->kernels[FM_OP_GATHER] = k_gather;
    b->kernels[FM_OP_SCATTER_ADD] = k_scatter_add;
    b->kernels[FM_OP_SCATTER] = k_scatter;
    b->kernels[FM_OP_SCATTER_ND] = k_scatter_nd;
    b->kernels[FM_OP_INDEX_ADD] = k_index_add;
    b->kernels[FM_OP_INDEX_SELECT] = k_index_select;
    b->kernels[FM_OP_ONE_HOT] = k_one_hot;
}
