/* CPU kernels for max and average 2-D pooling and their backwards: direct loops
 * over planes (NCHW) or rows with channels innermost (NHWC), in pool_loops.h.
 * Max pooling records the input position of each maximum (ih * W + iw within
 * the plane) for the backward, and lets NaN win, as PyTorch does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_avx2.h"
#include "backend/cpu/conv_shared.h"
#include "backend/conv_geom.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* fm_pool_geom, fm_pool_geometry: backend/conv_geom.h */

typedef struct pool_job {
    const fm_pool_geom *g;
    const void *x; void *y; int64_t *idx; const int64_t *cidx;
    const void *dy; void *dx;
    void *ws; int64_t wsn; /* max pool without indices: wsn elements of scratch per pool thread */
} pool_job;

/* One output position's window, clipped to the input: rows [hs, he), columns
 * [ws, we); cnt is the averaging divisor (the whole window with count_include_pad). */
typedef struct pool_win { int64_t hs, he, ws, we, cnt; } pool_win;

static inline pool_win pool_window(const fm_pool_geom *g, int64_t oh, int64_t ow) {
    int64_t h0 = oh * g->sh - g->ph, w0 = ow * g->sw - g->pw;
    int64_t h1 = h0 + g->kh, w1 = w0 + g->kw;
    pool_win r;
    r.hs = h0 < 0 ? 0 : h0;
    r.ws = w0 < 0 ? 0 : w0;
    r.he = h1 > g->H ? g->H : h1;
    r.we = w1 > g->W ? g->W : w1;
    /* with count_include_pad the padded cells count, not the cells past them that a
     * ceil_mode window covers (PyTorch); without ceil_mode that is the whole window */
    const int64_t ph1 = h1 < g->H + g->ph ? h1 : g->H + g->ph, pw1 = w1 < g->W + g->pw ? w1 : g->W + g->pw;
    r.cnt = g->include_pad ? (ph1 - h0) * (pw1 - w0) : (r.he - r.hs) * (r.we - r.ws);
    return r;
}

/* The loops, once per element type (pool_loops.h). */
#define T float
#define SFX(name) name##_f32
#include "backend/cpu/pool_loops.h"
#undef T
#undef SFX
#define T double
#define SFX(name) name##_f64
#include "backend/cpu/pool_loops.h"
#undef T
#undef SFX

static fm_status max_pool2d_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *y = c->out[0], *idx = c->out[1];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, x, y);
    pool_job j = {.g = &g, .x = fm_tensor_data(x), .y = fm_tensor_data(y), .idx = idx ? fm_tensor_data(idx) : NULL};
    bool f32 = x->dtype == FM_F32;
    if (g.nhwc) {
        fm_parallel_for(g.N * g.Ho, grain_for(0, g.Wo * g.C * g.kh * g.kw), f32 ? maxpool_nhwc_f32 : maxpool_nhwc_f64, &j);
        return FM_OK;
    }
    if (!idx) { /* a row per pool thread (malloc, as the GEMM packing: not the allocator's) */
        const int nt = fm_num_threads() < 1 ? 1 : fm_num_threads();
        j.wsn = 2 * (g.W + 2 * g.pw + g.kw + g.sw);
        j.ws = malloc((size_t)(nt * j.wsn) * fm_dtype_size(x->dtype));
        if (!j.ws) return fm_set_error(FM_ERR_OOM, "max_pool2d: out of memory for %d rows of %lld", nt, (long long)j.wsn);
    }
    fm_parallel_for(g.N * g.C, grain_for(0, g.Ho * g.Wo * g.kh * g.kw), f32 ? maxpool_nchw_f32 : maxpool_nchw_f64, &j);
    free(j.ws);
    return FM_OK;
}

static fm_status max_pool2d_backward_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1], *idx = c->in[2], *dx = c->out[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, x, dy);
    pool_job j = {.g = &g, .dy = fm_tensor_data(dy), .dx = fm_tensor_data(dx), .cidx = fm_tensor_data(idx)};
    bool f32 = x->dtype == FM_F32;
    if (g.nhwc)
        fm_parallel_for(g.N, 1, f32 ? maxpool_bwd_nhwc_f32 : maxpool_bwd_nhwc_f64, &j);
    else
        fm_parallel_for(g.N * g.C, grain_for(0, g.H * g.W), f32 ? maxpool_bwd_nchw_f32 : maxpool_bwd_nchw_f64, &j);
    return FM_OK;
}

static fm_status avg_pool2d_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *y = c->out[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, x, y);
    pool_job j = {.g = &g, .x = fm_tensor_data(x), .y = fm_tensor_data(y)};
    bool f32 = x->dtype == FM_F32;
    if (g.nhwc)
        fm_parallel_for(g.N * g.Ho, grain_for(0, g.Wo * g.C * g.kh * g.kw), f32 ? avgpool_nhwc_f32 : avgpool_nhwc_f64, &j);
    else
        fm_parallel_for(g.N * g.C, grain_for(0, g.Ho * g.Wo * g.kh * g.kw), f32 ? avgpool_nchw_f32 : avgpool_nchw_f64, &j);
    return FM_OK;
}

static fm_status avg_pool2d_backward_kernel(const fm_op_call *c) {
    const fm_pool2d_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *dx = c->out[0];
    if (dy->dtype != FM_F32 && dy->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, dy->dtype);
    fm_pool_geom g = fm_pool_geometry(&a->p, dx, dy);
    pool_job j = {.g = &g, .dy = fm_tensor_data(dy), .dx = fm_tensor_data(dx)};
    bool f32 = dy->dtype == FM_F32;
    if (g.nhwc)
        fm_parallel_for(g.N, 1, f32 ? avgpool_bwd_nhwc_f32 : avgpool_bwd_nhwc_f64, &j);
    else
        fm_parallel_for(g.N * g.C, grain_for(0, g.H * g.W), f32 ? avgpool_bwd_nchw_f32 : avgpool_bwd_nchw_f64, &j);
    return FM_OK;
}

void fm_cpu_kernels_pool(fm_backend *b) {
    b->kernels[FM_OP_MAX_POOL2D] = max_pool2d_kernel;
    b->kernels[FM_OP_MAX_POOL2D_BACKWARD] = max_pool2d_backward_kernel;
    b->kernels[FM_OP_AVG_POOL2D] = avg_pool2d_kernel;
    b->kernels[FM_OP_AVG_POOL2D_BACKWARD] = avg_pool2d_backward_kernel;
}
