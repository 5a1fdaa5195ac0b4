/* The CUDA backend: device discovery (fm_cuda_query for `fathom info`), the
 * per-device context (a non-blocking compute stream, cuBLASLt handle and
 * workspace, the caching allocator over cudaMalloc), host/device copies, and
 * the backend vtable registered on first use when a device exists.
 *
 * Every kernel in the table runs through one trampoline that selects the
 * tensors' device and checks the launch, so the kernel groups need not. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_pinned.h"
#include "backend/cuda/cuda_profile.h" /* device-track spans while profiling */
#include "fathom/profile.h"
#include "fathom/fathom.h"

#define LT_WORKSPACE ((size_t)32 << 20) /* what cuBLASLt's heuristics want for Hopper GEMMs */

typedef struct dev_ctx {
    int ready;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    fm_pool *pool;
    fm_pool_config cfg;
    int cfg_set;
    fm_allocator alloc;
    char name[16];
    size_t total_mem;
    /* batch staging (fm_cuda_copy_h2d_async), created on the first pinned copy */
    cudaStream_t copy_stream;
    cudaEvent_t last_free; /* recorded on the compute stream at every pool free once pinned copies are in use */
    int pinned_used;
} dev_ctx;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static int g_ndev = 0;
static char g_reason[256];
static dev_ctx g_dev[FM_MAX_CUDA_DEVICES];
static fm_backend g_cuda;
static fm_kernel_fn g_real[FM_OP_COUNT];
static int g_built = 0;

/* ---------------- discovery ---------------- */

static void probe(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        int drv = 0;
        cudaDriverGetVersion(&drv);
        if (e == cudaErrorInsufficientDriver && drv == 0)
            snprintf(g_reason, sizeof g_reason, "no CUDA driver is installed (%s)", cudaGetErrorString(e));
        else if (e == cudaErrorNoDevice)
            snprintf(g_reason, sizeof g_reason, "no CUDA device was found (%s)", cudaGetErrorString(e));
        else
            snprintf(g_reason, sizeof g_reason, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        cudaGetLastError(); /* clear the sticky-free error so later probes start clean */
        g_ndev = 0;
        return;
    }
    if (n == 0) { snprintf(g_reason, sizeof g_reason, "no CUDA device was found"); return; }
    g_ndev = n > FM_MAX_CUDA_DEVICES ? FM_MAX_CUDA_DEVICES : n;
}

extern "C" int fm_cuda_device_count(const char **reason) {
    pthread_once(&g_probe_once, probe);
    if (reason) *reason = g_ndev ? "" : g_reason;
    return g_ndev;
}

extern "C" void fm_cuda_query(fm_cuda_info *out) {
    memset(out, 0, sizeof *out);
    cudaRuntimeGetVersion(&out->runtime_version);
    cudaDriverGetVersion(&out->driver_version);
    const char *why = NULL;
    int n = fm_cuda_device_count(&why);
    if (!n) { snprintf(out->reason, sizeof out->reason, "%s", why); return; }
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        fm_cuda_device_info *d = &out->devices[out->n_devices++];
        snprintf(d->name, sizeof d->name, "%s", p.name);
        d->memory_bytes = p.totalGlobalMem;
        d->cc_major = p.major;
        d->cc_minor = p.minor;
        d->sm_count = p.multiProcessorCount;
        d->bf16 = p.major >= 8;
    }
}

/* ---------------- errors ---------------- */

fm_status fm_cuda_check(cudaError_t e, const char *op) {
    if (e == cudaSuccess) return FM_OK;
    if (e == cudaErrorMemoryAllocation)
        return fm_set_error(FM_ERR_OOM, "%s: CUDA out of memory (%s)", op, cudaGetErrorString(e));
    return fm_set_error(FM_ERR_INTERNAL, "%s: CUDA error %s: %s", op, cudaGetErrorName(e), cudaGetErrorString(e));
}
fm_status fm_cuda_check_launch(const char *op) { return fm_cuda_check(cudaGetLastError(), op); }
const char *fm_cuda_op_name(const fm_op_call *c) {
    const fm_op_info *i = fm_op_get_info(c->op);
    return i ? i->name : "op";
}
fm_status fm_cuda_unsupported_dtype(const fm_op_call *c, fm_dtype dt) {
    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: dtype %s is not supported on cuda", fm_cuda_op_name(c), fm_dtype_name(dt));
}

/* ---------------- per-device context ---------------- */

int fm_cuda_current_device(void) {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) { cudaGetLastError(); d = 0; } /* checked; callers index with it: 0 */
    return d;
}

static void *seg_alloc(void *ctx, size_t n) {
    dev_ctx *d = (dev_ctx *)ctx;
    int idx = (int)(d - g_dev);
    void *p = NULL;
    cudaSetDevice(idx);
    if (cudaMalloc(&p, n) != cudaSuccess) { cudaGetLastError(); return NULL; }
    return p;
}
static void seg_free(void *ctx, void *p, size_t n) {
    (void)n;
    dev_ctx *d = (dev_ctx *)ctx;
    cudaSetDevice((int)(d - g_dev));
    /* Kernels still queued may use the segment: finish them before giving it back. */
    cudaStreamSynchronize(d->stream);
    cudaFree(p);
}

static void env_config(dev_ctx *d) {
    const char *s;
    size_t v;
    if ((s = getenv("FATHOM_CUDA_MEMORY_MODE")) && !strcmp(s, "preallocate")) d->cfg.mode = FM_MEMORY_PREALLOCATE;
    if ((s = getenv("FATHOM_CUDA_MEMORY_LIMIT")) && fm_parse_size(s, &v) == FM_OK) d->cfg.limit = v;
    if ((s = getenv("FATHOM_CUDA_MEMORY_FRACTION"))) {
        double f = atof(s);
        if (f > 0 && f <= 1) d->cfg.fraction = f;
    }
    if ((s = getenv("FATHOM_CUDA_MAX_SPLIT_SIZE")) && fm_parse_size(s, &v) == FM_OK) d->cfg.max_split_size = v;
    fm_clear_error();
}

/* Creates the stream and pool of device idx; caller holds g_mu. */
static fm_status ensure_ctx(int idx) {
    dev_ctx *d = &g_dev[idx];
    if (d->ready) return FM_OK;
    fm_status st = fm_cuda_check(cudaSetDevice(idx), "cuda init");
    if (st) return st;
    if ((st = fm_cuda_check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "cuda init"))) return st;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    d->total_mem = tot;
    snprintf(d->name, sizeof d->name, "cuda:%d", idx);
    if (!d->cfg_set) env_config(d);
    d->cfg.total_bytes = tot;
    fm_pool_segment_ops ops = {seg_alloc, seg_free, d};
    d->pool = fm_pool_create(d->name, &d->cfg, ops);
    if (!d->pool) {
        cudaStreamDestroy(d->stream);
        return fm_last_status();
    }
    d->ready = 1;
    return FM_OK;
}

static fm_status use_device(int idx) {
    if (idx < 0 || idx >= fm_cuda_device_count(NULL))
        return fm_set_error(FM_ERR_INVALID, "cuda:%d does not exist (%d CUDA device%s found)", idx, g_ndev, g_ndev == 1 ? "" : "s");
    pthread_mutex_lock(&g_mu);
    fm_status st = ensure_ctx(idx);
    pthread_mutex_unlock(&g_mu);
    if (st) return st;
    return fm_cuda_check(cudaSetDevice(idx), "cuda");
}

/* Set when fm_cuda_stream could not give the current device's stream; the
 * trampoline (and fm_cuda_stream_check) turn it into the op's error, so work that
 * went to the default stream instead is never silent (was: stream 0, quietly). */
static __thread bool t_stream_failed;

cudaStream_t fm_cuda_stream(void) {
    int d = fm_cuda_current_device();
    if (d >= 0 && d < FM_MAX_CUDA_DEVICES && g_dev[d].ready) return g_dev[d].stream;
    if (d < 0 || d >= FM_MAX_CUDA_DEVICES || use_device(d) != FM_OK) {
        t_stream_failed = true;
        return 0;
    }
    return g_dev[d].stream;
}

extern "C" void *fm_cuda_compute_stream(int idx) {
    if (use_device(idx) != FM_OK) return NULL;
    return (void *)g_dev[idx].stream;
}

fm_status fm_cuda_stream_check(const char *op) {
    if (!t_stream_failed) return FM_OK;
    t_stream_failed = false;
    return fm_set_error(FM_ERR_INTERNAL, "%s: the current device's CUDA stream could not be made (%s); the work was "
                        "not queued where it belongs", op, fm_last_error());
}

void *fm_cuda_lt_handle(void) {
    dev_ctx *d = &g_dev[fm_cuda_current_device()];
    pthread_mutex_lock(&g_mu);
    if (!d->lt) {
        cublasLtHandle_t h;
        if (cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS) d->lt = h;
    }
    pthread_mutex_unlock(&g_mu);
    return d->lt;
}

void *fm_cuda_lt_workspace(size_t *bytes) {
    dev_ctx *d = &g_dev[fm_cuda_current_device()];
    pthread_mutex_lock(&g_mu);
    if (!d->lt_ws && d->pool) d->lt_ws = fm_pool_alloc(d->pool, LT_WORKSPACE, (uintptr_t)d->stream);
    pthread_mutex_unlock(&g_mu);
    fm_clear_error();
    *bytes = d->lt_ws ? LT_WORKSPACE : 0;
    return d->lt_ws;
}

void *fm_cuda_scratch_alloc(size_t n) {
    dev_ctx *d = &g_dev[fm_cuda_current_device()];
    if (!d->pool) return NULL;
    return fm_pool_alloc(d->pool, n ? n : 1, (uintptr_t)d->stream);
}
void fm_cuda_scratch_free(void *p) {
    dev_ctx *d = &g_dev[fm_cuda_current_device()];
    if (!p || !d->pool) return;
    if (d->pinned_used) cudaEventRecord(d->last_free, d->stream); /* as in a_free: see fm_cuda_copy_h2d_async */
    fm_pool_free(d->pool, p);
}

/* ---------------- allocator (fm_allocator over the pool) ---------------- */

static dev_ctx *ctx_of(fm_allocator *a) { return (dev_ctx *)a->impl; }
static void *a_alloc(fm_allocator *a, size_t n) {
    dev_ctx *d = ctx_of(a);
    return fm_pool_alloc(d->pool, n, (uintptr_t)d->stream);
}
static void a_free(fm_allocator *a, void *p, size_t n) {
    (void)n;
    dev_ctx *d = ctx_of(a);
    /* A block freed now may be handed to a copy-stream transfer next: that copy must wait for
     * the compute work queued so far, which may still use the block (fm_cuda_copy_h2d_async). */
    if (d->pinned_used) cudaEventRecord(d->last_free, d->stream);
    fm_pool_free(d->pool, p);
}
static fm_status a_stats(fm_allocator *a, fm_memory_stats *out) {
    fm_pool_get_stats(ctx_of(a)->pool, out);
    return FM_OK;
}
static void a_reset_peak(fm_allocator *a) { fm_pool_reset_peak(ctx_of(a)->pool); }
static void a_empty(fm_allocator *a) { fm_pool_empty_cache(ctx_of(a)->pool); }
static fm_status a_limit(fm_allocator *a, size_t lim) { return fm_pool_set_limit(ctx_of(a)->pool, lim); }

extern "C" fm_allocator *fm_cuda_allocator(int idx) {
    if (use_device(idx)) return NULL;
    dev_ctx *d = &g_dev[idx];
    pthread_mutex_lock(&g_mu);
    if (!d->alloc.alloc)
        d->alloc = (fm_allocator){"cuda-caching", a_alloc, a_free, a_stats, a_reset_peak, a_empty, a_limit, d, NULL};
    pthread_mutex_unlock(&g_mu);
    return &d->alloc;
}

extern "C" fm_status fm_cuda_allocator_configure(int idx, const fm_pool_config *cfg) {
    const char *why;
    if (!fm_cuda_device_count(&why)) return fm_set_error(FM_ERR_UNSUPPORTED, "cuda allocator: %s", why);
    if (idx < 0 || idx >= g_ndev) return fm_set_error(FM_ERR_INVALID, "cuda allocator: cuda:%d does not exist", idx);
    pthread_mutex_lock(&g_mu);
    dev_ctx *d = &g_dev[idx];
    fm_status st = FM_OK;
    if (d->ready) {
        st = fm_set_error(FM_ERR_STATE, "cuda allocator: cuda:%d is already in use; configure it before its first "
                          "allocation (only the limit can change later: fm_memory_set_limit)", idx);
    } else {
        d->cfg = *cfg;
        d->cfg_set = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return st;
}

extern "C" fm_status fm_cuda_allocator_extra_stats(int idx, fm_pool_extra_stats *out) {
    memset(out, 0, sizeof *out);
    if (use_device(idx)) return fm_last_status();
    fm_pool_get_extra_stats(g_dev[idx].pool, out);
    return FM_OK;
}

static fm_allocator *b_allocator(int idx) { return fm_cuda_allocator(idx); }

/* ---------------- copies ---------------- */

/* ---------------- pinned host memory and the copy stream ---------------- */

static fm_pinned_cache *g_pinned;

static void *pin_alloc(void *ctx, size_t n) {
    (void)ctx;
    void *p = NULL;
    if (cudaHostAlloc(&p, n, cudaHostAllocPortable) != cudaSuccess) { cudaGetLastError(); return NULL; }
    return p;
}
static void pin_free(void *ctx, void *p) { (void)ctx; cudaFreeHost(p); }
static int ev_done(void *ctx, void *ev) {
    (void)ctx;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) return 0;
    if (e != cudaSuccess) cudaGetLastError(); /* a failed copy reported elsewhere; the block is not read any more */
    return 1;
}
static void ev_release(void *ctx, void *ev) { (void)ctx; cudaEventDestroy((cudaEvent_t)ev); }

static fm_pinned_cache *pinned_cache(void) {
    pthread_mutex_lock(&g_mu);
    if (!g_pinned) g_pinned = fm_pinned_create((fm_pinned_ops){pin_alloc, pin_free, ev_done, ev_release, NULL});
    fm_pinned_cache *c = g_pinned;
    pthread_mutex_unlock(&g_mu);
    return c;
}

static void pinned_deleter(void *ctx, void *data) {
    (void)ctx;
    if (g_pinned) fm_pinned_free(g_pinned, data);
}

extern "C" fm_tensor *fm_cuda_pinned_empty(int ndim, const int64_t *shape, fm_dtype dt) {
    const char *why;
    if (!fm_cuda_device_count(&why)) { fm_set_error(FM_ERR_UNSUPPORTED, "pinned memory: %s", why); return NULL; }
    if (use_device(fm_cuda_current_device())) return NULL;
    size_t n = fm_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    fm_pinned_cache *c = pinned_cache();
    void *p = c ? fm_pinned_alloc(c, n ? n : 1) : NULL;
    if (!p) return NULL;
    fm_tensor *t = fm_tensor_from_buffer(p, ndim, shape, dt, pinned_deleter, NULL);
    if (!t) fm_pinned_free(c, p);
    return t;
}

extern "C" bool fm_cuda_is_pinned(const fm_tensor *t) {
    if (!t || t->storage->device.type != FM_DEV_CPU || !g_pinned) return false;
    return fm_pinned_find(g_pinned, fm_tensor_data(t), fm_tensor_nbytes(t)) != NULL;
}

extern "C" fm_status fm_cuda_pinned_wait(const fm_tensor *t) {
    if (!t || !g_pinned) return FM_OK;
    void *base = fm_pinned_find(g_pinned, fm_tensor_data(t), fm_tensor_nbytes(t));
    void *ev = base ? fm_pinned_pending(g_pinned, base) : NULL;
    return ev ? fm_cuda_check(cudaEventSynchronize((cudaEvent_t)ev), "pinned wait") : FM_OK;
}

extern "C" fm_status fm_cuda_pinned_stats(fm_pinned_stats *out) {
    memset(out, 0, sizeof *out);
    if (g_pinned) fm_pinned_get_stats(g_pinned, out);
    return FM_OK;
}
extern "C" size_t fm_cuda_pinned_empty_cache(void) { return g_pinned ? fm_pinned_empty_cache(g_pinned) : 0; }

/* The copy stream and the free event of device d; caller holds no lock. */
static fm_status ensure_copy_stream(dev_ctx *d) {
    fm_status st = FM_OK;
    pthread_mutex_lock(&g_mu);
    if (!d->pinned_used) {
        st = fm_cuda_check(cudaStreamCreateWithFlags(&d->copy_stream, cudaStreamNonBlocking), "copy stream");
        if (!st) st = fm_cuda_check(cudaEventCreateWithFlags(&d->last_free, cudaEventDisableTiming), "copy stream");
        /* blocks freed before now are covered by this first record */
        if (!st) st = fm_cuda_check(cudaEventRecord(d->last_free, d->stream), "copy stream");
        if (!st) d->pinned_used = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return st;
}

extern "C" fm_status fm_cuda_copy_h2d_async(int idx, void *dst, const void *src, size_t n) {
    fm_status st = use_device(idx);
    if (st) return st;
    dev_ctx *d = &g_dev[idx];
    void *base = g_pinned && n ? fm_pinned_find(g_pinned, src, n) : NULL;
    if (!base) /* pageable: staged by the driver before the call returns, so the host buffer may be reused */
        return fm_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, d->stream), "copy to cuda");
    if ((st = ensure_copy_stream(d))) return st;
    cudaEvent_t done;
    if ((st = fm_cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "copy to cuda"))) return st;
    /* copy after the compute work that may still use dst's block, compute after the copy */
    st = fm_cuda_check(cudaStreamWaitEvent(d->copy_stream, d->last_free, 0), "copy to cuda");
    if (!st) st = fm_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, d->copy_stream), "copy to cuda");
    if (!st) st = fm_cuda_check(cudaEventRecord(done, d->copy_stream), "copy to cuda");
    if (!st) st = fm_cuda_check(cudaStreamWaitEvent(d->stream, done, 0), "copy to cuda");
    if (st) {
        cudaStreamSynchronize(d->copy_stream);
        cudaEventDestroy(done);
        return st;
    }
    return fm_pinned_record(g_pinned, base, done); /* the host may reuse `src` once `done` has completed */
}

/* Batches one step ahead (fm_batch_stage, src/efficiency/stage.c): the copy is queued as
 * above but compute is not made to wait for it yet, so the step already queued (and the
 * next one, until ticket_wait) overlaps it; the ticket is a second event recorded after
 * the copy (the first belongs to the pinned cache, which may release it before the
 * ticket is waited on). A source that is not pinned is copied on the compute stream
 * (ordered already: no ticket). */
static void *b_host_alloc(int idx, size_t n) {
    if (use_device(idx)) return NULL;
    fm_pinned_cache *c = pinned_cache();
    return c ? fm_pinned_alloc(c, n ? n : 1) : NULL;
}
static void b_host_free(void *p) {
    if (g_pinned && p) fm_pinned_free(g_pinned, p);
}
static fm_status b_h2d_ahead(int idx, void *dst, const void *src, size_t n, void **ticket) {
    *ticket = NULL;
    fm_status st = use_device(idx);
    if (st) return st;
    dev_ctx *d = &g_dev[idx];
    void *base = g_pinned && n ? fm_pinned_find(g_pinned, src, n) : NULL;
    if (!base) return fm_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, d->stream), "copy to cuda");
    if ((st = ensure_copy_stream(d))) return st;
    cudaEvent_t done, tk;
    if ((st = fm_cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "copy to cuda"))) return st;
    if ((st = fm_cuda_check(cudaEventCreateWithFlags(&tk, cudaEventDisableTiming), "copy to cuda"))) {
        cudaEventDestroy(done);
        return st;
    }
    st = fm_cuda_check(cudaStreamWaitEvent(d->copy_stream, d->last_free, 0), "copy to cuda");
    if (!st) st = fm_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, d->copy_stream), "copy to cuda");
    if (!st) st = fm_cuda_check(cudaEventRecord(done, d->copy_stream), "copy to cuda");
    if (!st) st = fm_cuda_check(cudaEventRecord(tk, d->copy_stream), "copy to cuda");
    if (st) {
        cudaStreamSynchronize(d->copy_stream);
        cudaEventDestroy(done);
        cudaEventDestroy(tk);
        return st;
    }
    *ticket = (void *)tk;
    return fm_pinned_record(g_pinned, base, done);
}
static fm_status b_ticket_wait(int idx, void *ticket) {
    if (!ticket) return FM_OK;
    fm_status st = use_device(idx);
    if (!st) st = fm_cuda_check(cudaStreamWaitEvent(g_dev[idx].stream, (cudaEvent_t)ticket, 0), "batch upload wait");
    cudaEventDestroy((cudaEvent_t)ticket); /* released once the copy is done, even with a wait still queued */
    return st;
}

static fm_status b_h2d_raw(int idx, void *dst, const void *src, size_t n) { return fm_cuda_copy_h2d_async(idx, dst, src, n); }
static fm_status b_d2h_raw(int idx, void *dst, const void *src, size_t n) {
    fm_status st = use_device(idx);
    if (st) return st;
    st = fm_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, g_dev[idx].stream), "copy from cuda");
    if (!st) st = fm_cuda_check(cudaStreamSynchronize(g_dev[idx].stream), "copy from cuda");
    /* the host waits here anyway: the deferred index checks of the ops before this read */
    fm_status dst_st = fm_cuda_deferred_check(idx, g_dev[idx].stream);
    return st ? st : dst_st;
}
static fm_status b_d2d_raw(int idx, void *dst, const void *src, size_t n) {
    fm_status st = use_device(idx);
    if (st) return st;
    return fm_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, g_dev[idx].stream), "copy on cuda");
}
/* While profiling, a copy is a host span ("copy h2d", category memcpy: the op table
 * lists it with its bytes) and a device span timed by events on the compute stream,
 * which every copy is ordered on. */
static fm_status profiled_copy(fm_status (*f)(int, void *, const void *, size_t), const char *dir, int idx, void *dst,
                               const void *src, size_t n) {
    if (!fm_profiler_enabled()) return f(idx, dst, src, n);
    fm_status st = use_device(idx);
    if (st) return st;
    char args[64], host[16], devn[16];
    snprintf(args, sizeof args, "{\"bytes\":%zu,\"device\":\"cuda:%d\"}", n, idx);
    snprintf(host, sizeof host, "copy %s", dir);
    snprintf(devn, sizeof devn, "memcpy %s", dir);
    double t0 = fm_profiler_now_us();
    int prof = fm_cuda_prof_begin(idx, g_dev[idx].stream);
    st = f(idx, dst, src, n);
    if (prof) fm_cuda_prof_end(idx, g_dev[idx].stream, devn, "gpu memcpy", (double)n);
    fm_profile_span(host, "memcpy", t0, fm_profiler_now_us() - t0, args);
    return st;
}
static fm_status b_h2d(int idx, void *dst, const void *src, size_t n) { return profiled_copy(b_h2d_raw, "h2d", idx, dst, src, n); }
static fm_status b_d2h(int idx, void *dst, const void *src, size_t n) { return profiled_copy(b_d2h_raw, "d2h", idx, dst, src, n); }
static fm_status b_d2d(int idx, void *dst, const void *src, size_t n) { return profiled_copy(b_d2d_raw, "d2d", idx, dst, src, n); }
static fm_status b_sync(int idx) {
    fm_status st = use_device(idx);
    if (st) return st;
    st = fm_cuda_check(cudaStreamSynchronize(g_dev[idx].stream), "cuda synchronize");
    fm_status dst_st = fm_cuda_deferred_check(idx, g_dev[idx].stream);
    return st ? st : dst_st;
}

/* ---------------- the vtable ---------------- */

static fm_status trampoline(const fm_op_call *c) {
    const fm_tensor *first = NULL;
    fm_tensor *const *ins = c->var_in ? c->var_in : c->in;
    for (int i = 0; i < c->n_in && !first; i++) first = ins[i];
    for (int i = 0; i < c->n_out && !first; i++) first = c->out[i];
    const int dev = first ? first->storage->device.index : 0;
    fm_status st = use_device(dev);
    if (st) return st;
    cudaGetLastError(); /* a stale launch error must not be blamed on this op */
    t_stream_failed = false;
    int prof = fm_cuda_prof_begin(dev, fm_cuda_stream()); /* 0 unless profiling */
    st = g_real[c->op](c);
    if (st == FM_OK) st = fm_cuda_check_launch(fm_cuda_op_name(c));
    if (st == FM_OK) st = fm_cuda_stream_check(fm_cuda_op_name(c));
    if (prof) fm_cuda_prof_end(dev, fm_cuda_stream(), fm_cuda_op_name(c), "gpu kernel", 0);
    if (st) return st;
    if (st == FM_OK && getenv("FATHOM_CUDA_SYNC")) { /* debugging: report faults (and bad indices) at their op */
        st = fm_cuda_check(cudaStreamSynchronize(fm_cuda_stream()), fm_cuda_op_name(c));
        if (st == FM_OK) st = fm_cuda_deferred_check(dev, fm_cuda_stream());
    }
    return st;
}

static void build(void) {
    g_cuda.name = "cuda";
    g_cuda.type = FM_DEV_CUDA;
    g_cuda.allocator = b_allocator;
    g_cuda.copy_h2d = b_h2d;
    g_cuda.copy_d2h = b_d2h;
    g_cuda.copy_d2d = b_d2d;
    g_cuda.synchronize = b_sync;
    g_cuda.host_alloc = b_host_alloc;
    g_cuda.host_free = b_host_free;
    g_cuda.copy_h2d_ahead = b_h2d_ahead;
    g_cuda.ticket_wait = b_ticket_wait;
    fm_cuda_kernels_elementwise(&g_cuda);
    fm_cuda_kernels_reduce(&g_cuda);
    fm_cuda_kernels_matmul(&g_cuda);
    fm_cuda_kernels_softmax(&g_cuda);
    fm_cuda_kernels_norm(&g_cuda);
    fm_cuda_kernels_attention(&g_cuda);
    fm_cuda_kernels_index(&g_cuda);
    fm_cuda_kernels_conv(&g_cuda);
    fm_cuda_kernels_fused(&g_cuda);
    fm_cuda_kernels_optim(&g_cuda);
    fm_cuda_kernels_quant(&g_cuda);
    for (int i = 0; i < FM_OP_COUNT; i++) {
        g_real[i] = g_cuda.kernels[i];
        if (g_real[i]) g_cuda.kernels[i] = trampoline;
    }
}

/* The backend's constructor, asked by the core registry on first use: probes for
 * a device (NULL without one, and the registry asks again next time). */
static const fm_backend *cuda_backend(void) {
    if (!fm_cuda_device_count(NULL)) return NULL;
    pthread_mutex_lock(&g_mu);
    if (!g_built) {
        build();
        g_built = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return &g_cuda;
}

/* Registers the constructor only: nothing touches the GPU until a CUDA tensor or op needs it. */
extern "C" void fm_backend_cuda_reg(void) {
    fm_backend_register(FM_DEV_CUDA, cuda_backend);
    fm_backend_register_count(FM_DEV_CUDA, fm_cuda_device_count);
}
