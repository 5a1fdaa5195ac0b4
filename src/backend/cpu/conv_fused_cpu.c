/* CONV2D_FUSED: conv2d, then ReLU and a max pool (kernel = stride = pool, no
 * padding), for inference (fathom compile's fuse-conv-act pass writes it).
 *
 * f32 NCHW convs with stride 1, dilation 1 and one group run a direct kernel,
 * with bias, ReLU and a 2x2 pool applied before the store, reading the weights
 * packed by conv2d_fused_pack when they are given (4th input) and packing them
 * per call otherwise:
 * - AVX-512, 3x3 convs with the 2x2 pool, >= 8 input channels, output channels
 *   in whole 16-channel vectors: Winograd F(2x2, 3x3) (conv_wino.h), each 2x2
 *   output tile one pool window; from the lanes kernel's padded input and packed
 *   weights. Measured on an Intel Xeon (model 207), one thread, fashion-cnn's
 *   compiled graph at batch 32 (bench/bench_graph_ort.py --base): 1.28-1.30x
 *   faster than the lanes kernel there (32->64 is ~60% of the graph's time);
 * - AVX-512 otherwise: conv_lanes.h's AVX-512 kernel (output channels along the lanes) for
 *   channels in whole 16-channel vectors with at least 32 weights each
 *   (C*kH*kW >= 32) and for channel counts not a multiple of 8; else
 *   conv_direct.h (pixels along the lanes). Measured on an Intel Xeon (model
 *   207), one thread (bench_isa_kernels --only conv, docs/PERFORMANCE.md): the
 *   lanes kernel 1.05-2.1x faster than the pixel tile on 16->16, 32->48, 32->64,
 *   64->64 and 64->96 3x3 layers (even on 32->64 at batch 1), the pixel tile
 *   1.1-1.2x faster on 1->32 (9 weights a channel) and on a 5x5 with 24
 *   channels (a half-empty vector);
 * - AVX2: the same Winograd kernel for the same convs (conv_wino_avx2.c, bitwise
 *   the AVX-512 one's outputs, from a padded copy of the input). Measured on an AMD
 *   EPYC Zen 3: 1.25-1.79x the lanes kernel per layer, fashion-cnn's compiled graph
 *   1.23-1.39x at batch 32 (docs/PERFORMANCE.md, "AMD EPYC Zen 3 again");
 * - AVX2 otherwise: conv_lanes.h (output channels along the lanes), any channel count. It
 *   replaced an AVX2 build of conv_direct.h's tile (6 channels x 2 rows), which
 *   it beat on every fashion-cnn-like shape measured on Zen 3, 1->32 included
 *   (docs/PERFORMANCE.md).
 * Everything else (f64, other geometries, NHWC, other pools, and every case at
 * FATHOM_ISA=scalar: the reference) runs conv2d's own kernel and then one pass
 * for ReLU and the pool. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_direct.h"
#include "backend/cpu/conv_lanes.h"
#include "backend/cpu/conv_shared.h"
#include "backend/cpu/conv_wino.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* ------------------------------------------------------------ the direct path */

typedef struct pad_job { const float *x; float *xp; int64_t C, H, W, Hp, WS, ph, pw; bool avx2; } pad_job;

static void pad_planes(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const pad_job *j = ctx;
    if (j->avx2) {
        for (int64_t p = b; p < e; p++)
            fm_conv_lanes_pad_avx2(j->x + p * j->H * j->W, j->xp + p * j->Hp * j->WS, j->H, j->W, j->Hp, j->WS, j->ph, j->pw);
        return;
    }
    for (int64_t p = b; p < e; p++) { /* plane p = n*C + c; only the border is zeroed */
        float *d = j->xp + p * j->Hp * j->WS;
        const int64_t right = j->WS - j->pw - j->W;
        memset(d, 0, sizeof(float) * (size_t)(j->ph * j->WS));
        for (int64_t h = 0; h < j->H; h++) {
            float *r = d + (h + j->ph) * j->WS;
            if (j->pw) memset(r, 0, sizeof(float) * (size_t)j->pw);
            memcpy(r + j->pw, j->x + (p * j->H + h) * j->W, sizeof(float) * (size_t)j->W);
            memset(r + j->pw + j->W, 0, sizeof(float) * (size_t)right);
        }
        memset(d + (j->H + j->ph) * j->WS, 0, sizeof(float) * (size_t)((j->Hp - j->H - j->ph) * j->WS));
    }
}

static void direct_rows(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    fm_conv_direct_rows_avx512(ctx, b, e);
}

static void lanes_rows(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    if (fm_cpu_use_avx512()) fm_conv_lanes_rows_avx512(ctx, b, e);
    else fm_conv_lanes_rows_avx2(ctx, b, e);
}

/* Winograd (conv_wino.h): one workspace per pool thread; a chunk whose index is
 * past them (not expected: the pool's chunk indices are below its thread count)
 * allocates its own. */
typedef struct wino_job { fm_conv_wino d; float *ws; int64_t wsn; int nws; atomic_int failed; } wino_job;

static void wino_run(const fm_conv_wino *d, int64_t b, int64_t e, float *ws) {
    if (fm_cpu_use_avx512()) fm_conv_wino_rows_avx512(d, b, e, ws);
    else fm_conv_wino_rows_avx2(d, b, e, ws);
}

static void wino_rows(void *ctx, int64_t b, int64_t e, int tid) {
    wino_job *j = ctx;
    if (tid >= 0 && tid < j->nws) {
        wino_run(&j->d, b, e, j->ws + (int64_t)tid * j->wsn);
        return;
    }
    float *ws = malloc(sizeof(float) * (size_t)j->wsn);
    if (!ws) { atomic_store(&j->failed, 1); return; }
    wino_run(&j->d, b, e, ws);
    free(ws);
}

/* The Winograd job's geometry and its workspaces (one of wsn floats per pool thread, nws). */
static void wino_setup(wino_job *j, const fm_conv_lanes *l, int64_t H, int64_t W, int64_t ph, int64_t pw) {
    memset(j, 0, sizeof *j);
    fm_conv_wino *d = &j->d;
    d->H = H, d->W = W, d->ph = ph, d->pw = pw, d->bias = l->bias, d->y = l->y, d->relu = l->relu;
    d->N = l->N, d->C = l->C, d->O = l->O, d->Hp = l->Hp, d->WS = l->WS, d->Hy = l->Hy, d->Wy = l->Wy, d->pool = l->pool;
    if (!d->pool) /* the tiles cover the output, halves rounded up */
        d->Ho = l->Hy, d->Wo = l->Wy, d->Hy = (l->Hy + 1) / 2, d->Wy = (l->Wy + 1) / 2;
    fm_conv_wino_plan(d);
    j->nws = fm_num_threads() < 1 ? 1 : fm_num_threads();
    if (!fm_cpu_use_avx512()) fm_conv_wino_split_channels(d, j->nws);
    j->wsn = fm_conv_wino_ws_floats(d);
    const int64_t tasks = fm_conv_wino_tasks(d);
    if (j->nws > tasks) j->nws = (int)tasks;
}

/* The lanes kernel's geometry and packed weights (run_lanes) -> the Winograd kernel,
 * reading the input x unpadded (ph, pw) on AVX-512 and the padded copy l->xp (to
 * fm_conv_wino_avx2_geometry) on AVX2; the transformed weights uw when packed (form
 * 4), else made from wp. */
static fm_status run_wino(const fm_conv_lanes *l, const float *x, int64_t H, int64_t W, int64_t ph, int64_t pw, const float *wp,
                          const float *uw) {
    wino_job j;
    wino_setup(&j, l, H, W, ph, pw);
    fm_conv_wino *d = &j.d;
    if (fm_cpu_use_avx512()) d->x = x;
    else d->xp = l->xp;
    const int64_t tasks = fm_conv_wino_tasks(d);
    fm_tensor *u = uw ? NULL : scratch(fm_conv_wino_u_floats(d->C, d->O), FM_F32), *ws = scratch(j.nws * j.wsn, FM_F32);
    if ((!uw && !u) || !ws) { fm_tensor_release_n(2, u, ws); return fm_last_status(); }
    if (!uw) fm_conv_wino_weights_avx2(wp, fm_tensor_data(u), d->O, d->C); /* one transform for both levels */
    d->u = uw ? uw : fm_tensor_data(u), j.ws = fm_tensor_data(ws);
    const int64_t work = 2 * 16 * d->C * d->O * fm_conv_wino_max_tiles(d) / d->nob;
    fm_parallel_for(tasks, grain_for(tasks, work / 4), wino_rows, &j);
    fm_tensor_release_n(2, u, ws);
    if (atomic_load(&j.failed)) return fm_set_error(FM_ERR_OOM, "conv2d_fused: no memory for a Winograd workspace");
    return FM_OK;
}

/* At the AVX-512 level: the lanes kernel rather than the pixel tile for O output
 * channels of per = C*kH*kW weights each (see the top of the file). */
static bool lanes_at_avx512(int64_t O, int64_t per) {
    return O % FM_CONV_DIRECT_OBS_AVX512 != 0 || (O % 16 == 0 && per >= 32);
}

/* The geometry both direct kernels take (channel counts aside). */
static bool direct_geometry(const fm_conv2d_fused_attrs *a, const fm_tensor *x) {
    const fm_conv2d_params *p = &a->p;
    return x->dtype == FM_F32 && p->layout == FM_NCHW && p->groups == 1 && p->stride[0] == 1 && p->stride[1] == 1 &&
           p->dilation[0] == 1 && p->dilation[1] == 1 && a->pool <= 2;
}

/* The packed form of the weights (conv2d_fused_pack): a header {form, O, C*kH*kW}
 * (small integers, exact in f32), then the blocks. Form 1: the AVX-512 blocks
 * (fm_conv_direct_pack), 3: the lanes kernels' (fm_conv_lanes_pack, AVX2 and AVX-512; O
 * rounded up to 8), 4: form 3's, then the Winograd weights (AVX2 or AVX-512, a 3x3 conv that
 * fm_conv_wino_fits: fm_conv_wino_weights_* at the first 64-byte boundary
 * after them, so a call need not transform them: 4-5% of fashion-cnn's compiled
 * graph at batch 1), 0: no direct kernel at this level (the weights copied as
 * they are; conv2d_fused ignores them). (2 was the AVX2 pixel tile's form.) The
 * tensor holds 3 + fm_conv2d_fused_pack_numel floats, zeros past the form's. */
enum { PACK_NONE = 0, PACK_AVX512 = 1, PACK_LANES = 3, PACK_LANES_WINO = 4 };

/* The Winograd weights' offset in the packed tensor (a multiple of 16 floats). */
static int64_t wino_offset(int64_t O, int64_t per) { return (3 + fm_conv_lanes_packed_numel(O, per) + 15) / 16 * 16; }

/* The form this level runs for weights w (f32 [O, C, kH, kW]). */
static int pack_form(const fm_tensor *w) {
    if (fm_cpu_use_avx512() && !lanes_at_avx512(w->shape[0], w->shape[1] * w->shape[2] * w->shape[3])) return PACK_AVX512;
    if (!fm_cpu_use_avx2()) return PACK_NONE;
    return fm_conv_wino_fits(w->shape[1], w->shape[0], w->shape[2], w->shape[3], 2, 1, 1) ? PACK_LANES_WINO : PACK_LANES;
}

static fm_status conv2d_fused_pack_kernel(const fm_op_call *c) {
    const fm_tensor *w = c->in[0];
    float *y = fm_tensor_data(c->out[0]);
    const float *ws = fm_tensor_data(w);
    const int64_t O = w->shape[0], per = w->shape[1] * w->shape[2] * w->shape[3];
    const int form = pack_form(w);
    y[0] = (float)form, y[1] = (float)O, y[2] = (float)per;
    if (form == PACK_AVX512) fm_conv_direct_pack(ws, y + 3, O, per, FM_CONV_DIRECT_OB_AVX512, FM_CONV_DIRECT_OBS_AVX512);
    else if (form == PACK_LANES || form == PACK_LANES_WINO) fm_conv_lanes_pack(ws, y + 3, O, per);
    else memcpy(y + 3, ws, sizeof(float) * (size_t)(O * per));
    int64_t used = 3 + (form == PACK_LANES || form == PACK_LANES_WINO ? fm_conv_lanes_packed_numel(O, per) : O * per);
    if (form == PACK_LANES_WINO) {
        const int64_t at = wino_offset(O, per);
        memset(y + used, 0, sizeof(float) * (size_t)(at - used));
        fm_conv_wino_weights_avx2(y + 3, y + at, O, w->shape[1]);
        used = at + fm_conv_wino_u_floats(w->shape[1], O);
    }
    memset(y + used, 0, sizeof(float) * (size_t)(3 + fm_conv2d_fused_pack_numel(O, per) - used)); /* the rest of the tensor */
    return FM_OK;
}

/* The packed weights in c->in[3] when they are in `form` for w, else NULL. */
static const float *prepacked(const fm_op_call *c, int form) {
    const fm_tensor *pk = c->in[3], *w = c->in[1];
    const int64_t O = w->shape[0], per = w->shape[1] * w->shape[2] * w->shape[3];
    if (!pk || pk->dtype != FM_F32 || pk->ndim != 1 || pk->shape[0] != 3 + fm_conv2d_fused_pack_numel(O, per)) return NULL;
    const float *h = fm_tensor_data(pk);
    const bool same = h[0] == (float)form || (form == PACK_LANES && h[0] == (float)PACK_LANES_WINO);
    return same && h[1] == (float)O && h[2] == (float)per ? h + 3 : NULL;
}

/* The Winograd weights in c->in[3] (form 4), else NULL. */
static const float *prepacked_wino(const fm_op_call *c) {
    const float *l = prepacked(c, PACK_LANES_WINO);
    if (!l) return NULL;
    const fm_tensor *w = c->in[1];
    return l - 3 + wino_offset(w->shape[0], w->shape[1] * w->shape[2] * w->shape[3]);
}

/* The zero-padded input: [N][C][Hp][WS]; only the border zeroed, or (avx2: the
 * lanes kernel's level) each row zeroed and copied with vector stores. */
static fm_tensor *padded_input(const fm_tensor *x, int64_t Hp, int64_t WS, int64_t ph, int64_t pw, bool avx2) {
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    fm_tensor *xp = scratch(N * C * Hp * WS, FM_F32);
    if (!xp) return NULL;
    pad_job pj = {fm_tensor_data(x), fm_tensor_data(xp), C, H, W, Hp, WS, ph, pw, avx2};
    fm_parallel_for(N * C, grain_for(N * C, Hp * WS), pad_planes, &pj);
    return xp;
}

/* The lanes kernel's geometry for call c; whether it runs as Winograd. */
static bool lanes_setup(const fm_op_call *c, fm_conv_lanes *d) {
    const fm_conv2d_fused_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    memset(d, 0, sizeof *d);
    d->N = x->shape[0], d->C = x->shape[1], d->O = w->shape[0], d->KH = w->shape[2], d->KW = w->shape[3];
    const int64_t H = x->shape[2], W = x->shape[3], ph = a->p.padding[0], pw = a->p.padding[1];
    d->Ho = H + 2 * ph - d->KH + 1, d->Wo = W + 2 * pw - d->KW + 1, d->Hy = y->shape[2], d->Wy = y->shape[3];
    d->relu = a->relu, d->pool = a->pool > 1 ? 2 : 0;
    d->Hp = H + 2 * ph, d->WS = W + 2 * pw; /* the tiles read rows < Ho + kH - 1, columns < Wo + kW - 1 */
    /* input channels per pass: a pass's weights for a full block (32 channels) in 16 KB, passes balanced */
    const int64_t fit = 4096 / (d->KH * d->KW * 8 * FM_CONV_LANES_NV);
    const int64_t passes = fit < 1 ? d->C : (d->C + fit - 1) / fit;
    d->cc = (d->C + passes - 1) / passes;
    const bool wino = fm_cpu_use_avx2() && fm_conv_wino_fits(d->C, d->O, d->KH, d->KW, d->pool, d->Hy, d->Wy);
    if (wino && !fm_cpu_use_avx512()) /* AVX2 Winograd: the padded copy, to its geometry (from the tiles) */
        fm_conv_wino_avx2_geometry(H, W, ph, pw, d->pool ? d->Hy : (d->Hy + 1) / 2, d->pool ? d->Wy : (d->Wy + 1) / 2, &d->Hp, &d->WS);
    return wino;
}

/* The lanes kernel (conv_lanes.h), AVX2 or AVX-512. */
static fm_status run_lanes(const fm_op_call *c) {
    const fm_conv2d_fused_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *y = c->out[0];
    fm_conv_lanes d;
    const bool wino = lanes_setup(c, &d);
    const int64_t H = x->shape[2], W = x->shape[3], ph = a->p.padding[0], pw = a->p.padding[1];
    const int64_t per = d.C * d.KH * d.KW;
    const float *given = prepacked(c, PACK_LANES);
    const bool unpadded = wino && fm_cpu_use_avx512(); /* AVX-512 Winograd reads x as it is */
    fm_tensor *xp = unpadded ? NULL : padded_input(x, d.Hp, d.WS, ph, pw, true);
    fm_tensor *wp = given ? NULL : scratch(fm_conv_lanes_packed_numel(d.O, per), FM_F32);
    if ((!unpadded && !xp) || (!given && !wp)) { fm_tensor_release_n(2, xp, wp); return fm_last_status(); }
    if (!given) fm_conv_lanes_pack(fm_tensor_data(w), fm_tensor_data(wp), d.O, per);
    d.xp = xp ? fm_tensor_data(xp) : NULL, d.wp = given ? given : fm_tensor_data(wp), d.bias = b ? fm_tensor_data(b) : NULL, d.y = fm_tensor_data(y);
    if (wino) {
        const fm_status st = run_wino(&d, fm_tensor_data(x), H, W, ph, pw, d.wp, prepacked_wino(c));
        fm_tensor_release_n(2, xp, wp);
        return st;
    }
    fm_conv_lanes_plan(&d);
    const int64_t tasks = fm_conv_lanes_tasks(&d), cols = fm_conv_lanes_cols(&d), pairs = fm_conv_lanes_pairs(&d);
    const int64_t work = 2 * per * 8 * FM_CONV_LANES_NV * (cols < FM_CONV_LANES_COLS ? cols : FM_CONV_LANES_COLS) * pairs / d.ngroups;
    fm_parallel_for(tasks, grain_for(tasks, work / 4), lanes_rows, &d);
    fm_tensor_release_n(2, xp, wp);
    return FM_OK;
}

/* The pixel tile's column blocks, and its padded rows' length (64-byte multiples). */
static int64_t direct_blocks(const fm_conv_direct *d) {
    const int64_t VL = FM_CONV_DIRECT_VL_AVX512, cols = d->pool ? 2 * d->Wy : d->Wo;
    return (cols + VL - 1) / VL;
}
static int64_t direct_ws(const fm_conv_direct *d) { return (direct_blocks(d) * FM_CONV_DIRECT_VL_AVX512 + d->KW - 1 + 15) / 16 * 16; }

/* The AVX-512 pixel tile (conv_direct.h). */
static fm_status run_direct(const fm_op_call *c) {
    const fm_conv2d_fused_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *y = c->out[0];
    const int64_t VL = FM_CONV_DIRECT_VL_AVX512, OB = FM_CONV_DIRECT_OB_AVX512, OBS = FM_CONV_DIRECT_OBS_AVX512;
    fm_conv_direct dd;
    memset(&dd, 0, sizeof dd);
    fm_conv_direct *d = &dd;
    d->N = x->shape[0], d->C = x->shape[1], d->O = w->shape[0], d->KH = w->shape[2], d->KW = w->shape[3];
    const int64_t H = x->shape[2], W = x->shape[3], ph = a->p.padding[0], pw = a->p.padding[1];
    d->Ho = H + 2 * ph - d->KH + 1, d->Wo = W + 2 * pw - d->KW + 1;
    d->Hy = y->shape[2], d->Wy = y->shape[3], d->relu = a->relu, d->pool = a->pool > 1 ? 2 : 0;
    const int64_t blocks = direct_blocks(d);
    d->WS = direct_ws(d);
    d->Hp = H + 2 * ph + 1; /* + a zero row for the odd last row pair */
    const float *given = prepacked(c, PACK_AVX512);
    fm_tensor *xp = padded_input(x, d->Hp, d->WS, ph, pw, false), *wp = given ? NULL : scratch(fm_tensor_numel(w), FM_F32);
    if (!xp || (!given && !wp)) { fm_tensor_release_n(2, xp, wp); return fm_last_status(); }
    const int64_t per = d->C * d->KH * d->KW; /* [O][per] -> per block [per][width] */
    const float *wq = given;
    if (!wq) {
        fm_conv_direct_pack(fm_tensor_data(w), fm_tensor_data(wp), d->O, per, OB, OBS);
        wq = fm_tensor_data(wp);
    }
    int64_t n_blocks;
    d->n_big = fm_conv_direct_split(d->O, OB, OBS, &n_blocks);
    d->xp = fm_tensor_data(xp), d->wp = wq, d->bias = b ? fm_tensor_data(b) : NULL, d->y = fm_tensor_data(y);
    const int64_t pairs = d->pool ? d->Hy : (d->Ho + 1) / 2, tasks = d->N * n_blocks * pairs;
    fm_parallel_for(tasks, grain_for(tasks, per * OB * 2 * blocks * VL / 4), direct_rows, d);
    fm_tensor_release_n(2, xp, wp);
    return FM_OK;
}

/* --------------------------------------------- the reference: conv, then one pass */

typedef struct epi_job {
    const fm_tensor *t; fm_tensor *y;
    int64_t C, H, W, Hy, Wy, k; /* t [N, C, H, W] or [N, H, W, C]; y pooled by k */
    bool nhwc, relu;
    double hi; /* the cap after the ReLU */
} epi_job;

/* max over the window with NaN winning (as max_pool2d), then ReLU (NaN stays) */
#define EPI_LOOP(T)                                                                                                        \
    for (int64_t p = b; p < e; p++) { /* p = (n, c) */                                                                     \
        int64_t n = p / j->C, ch = p % j->C;                                                                               \
        for (int64_t oh = 0; oh < j->Hy; oh++)                                                                             \
            for (int64_t ow = 0; ow < j->Wy; ow++) {                                                                       \
                T m = 0;                                                                                                   \
                for (int64_t i = 0; i < j->k * j->k; i++) {                                                               \
                    int64_t h = oh * j->k + i / j->k, w = ow * j->k + i % j->k;                                            \
                    T v = t[j->nhwc ? ((n * j->H + h) * j->W + w) * j->C + ch : ((n * j->C + ch) * j->H + h) * j->W + w]; \
                    if (i == 0 || isnan(v) || (!isnan(m) && v > m)) m = v;                                                 \
                }                                                                                                          \
                if (j->relu && m < 0) m = 0;                                                                               \
                if (m > j->hi) m = (T)j->hi;                                                                               \
                y[j->nhwc ? ((n * j->Hy + oh) * j->Wy + ow) * j->C + ch : ((n * j->C + ch) * j->Hy + oh) * j->Wy + ow] = m; \
            }                                                                                                              \
    }

static void epilogue(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const epi_job *j = ctx;
    if (j->t->dtype == FM_F32) {
        const float *t = fm_tensor_data(j->t);
        float *y = fm_tensor_data(j->y);
        EPI_LOOP(float)
    } else {
        const double *t = fm_tensor_data(j->t);
        double *y = fm_tensor_data(j->y);
        EPI_LOOP(double)
    }
}

/* The conv's output before the pool, [N, C, Ho, Wo] (or NHWC): y's shape with the conv's
 * spatial dims ((H + 2p - span) / s + 1). */
static void unpooled_shape(const fm_op_call *c, int64_t ts[4]) {
    const fm_conv2d_fused_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    memcpy(ts, y->shape, 4 * sizeof *ts);
    const int hx = a->p.layout == FM_NHWC ? 1 : 2;
    for (int i = 0; i < 2; i++) {
        int64_t span = (int64_t)a->p.dilation[i] * (w->shape[2 + i] - 1) + 1;
        ts[hx + i] = (x->shape[hx + i] + 2 * (int64_t)a->p.padding[i] - span) / a->p.stride[i] + 1;
    }
}

static fm_status run_reference(const fm_op_call *c) {
    const fm_conv2d_fused_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *y = c->out[0];
    const bool nhwc = a->p.layout == FM_NHWC;
    const int64_t k = a->pool > 1 ? a->pool : 1;
    const int hx = nhwc ? 1 : 2;
    int64_t ts[4];
    unpooled_shape(c, ts);
    fm_tensor *t = k > 1 ? fm_tensor_empty(4, ts, y->dtype, FM_CPU) : fm_tensor_retain(y);
    if (!t) return fm_last_status();
    /* without a pool the conv applies the activation in its own epilogue (t is y) */
    fm_status st = k == 1 ? fm_cpu_conv2d_forward(&a->p, x, w, b, t, a->relu ? 0.0 : -INFINITY, a->hi)
                          : fm_cpu_conv2d_forward(&a->p, x, w, b, t, -INFINITY, INFINITY);
    if (st == FM_OK && k > 1) {
        epi_job j = {t, y, nhwc ? ts[3] : ts[1], ts[hx], ts[hx + 1], y->shape[hx], y->shape[hx + 1], k, nhwc, a->relu != 0, a->hi};
        fm_parallel_for(y->shape[0] * j.C, grain_for(0, j.Hy * j.Wy * k * k), epilogue, &j);
    }
    fm_tensor_release(t);
    return st;
}

/* At the AVX-512 level without a pool, whether a small output (ResNet's last stage,
 * 512 channels at 7x7) runs conv2d's kernel (im2col and the GEMM, then the bias and
 * ReLU pass) instead of the direct kernels: Winograd takes a task per 24 tiles or more,
 * so with fewer tiles than 24 per pool thread some threads idle, and the lanes
 * kernel's rows are as short. Measured on an Intel Xeon model 167, 2 threads, batch 1,
 * 3x3 layers, best of 30: 512->512 at 7x7 1.48 ms direct (Winograd or lanes) against
 * 0.97 through the GEMM, 9x9 1.98 against 1.47; 256->256 at 14x14 0.60 (Winograd)
 * against 0.92, 128->128 at 28x28 0.37 against 0.82, 64->64 at 56x56 0.52 against 0.92. */
static bool small_unpooled(const fm_conv2d_fused_attrs *a, const fm_tensor *y) {
    if (a->pool > 1 || !fm_cpu_use_avx512()) return false;
    const int64_t tiles = y->shape[0] * ((y->shape[2] + 1) / 2) * ((y->shape[3] + 1) / 2);
    return tiles < FM_CONV_WINO_TASK_TILES * (int64_t)(fm_num_threads() < 1 ? 1 : fm_num_threads());
}

/* At the AVX-512 and AVX2 levels an unpadded 1x1 conv without a pool (ResNet-50's
 * bottlenecks, SqueezeNet's squeeze and expand layers) runs conv2d's kernel, which hands
 * the input to the GEMM as it is: same machine and method, 256->64 at 56x56 0.26 ms
 * against 0.76 in the lanes kernel, 512->128 at 28x28 0.26 against 0.51, 1024->256 at
 * 14x14 0.28 against 0.49, 2048->512 at 7x7 equal. On an AMD EPYC Zen 3 (AVX2) the
 * lanes kernel's 1x1 tiles were a third of SqueezeNet 1.0's compiled graph at batch 8;
 * through the GEMM the graph ran 1.43-1.55x faster (docs/PERFORMANCE.md, "AMD EPYC
 * Zen 3 again"). At the AVX2 level conv2d's kernel now runs the product itself, with the
 * bias and clamp (conv_pw.h), rather than the GEMM and an epilogue pass. */
static bool pointwise_unpooled(const fm_conv2d_fused_attrs *a, const fm_tensor *w) {
    return a->pool <= 1 && fm_cpu_use_avx2() && w->shape[2] == 1 && w->shape[3] == 1 && !a->p.padding[0] && !a->p.padding[1];
}

/* Whether c->in[3] has the packed weights' size (the form is this level's: a graph packs
 * them with conv2d_fused_pack in the same process); the data is not read. */
static bool packed_given(const fm_op_call *c) {
    const fm_tensor *pk = c->in[3], *w = c->in[1];
    const int64_t O = w->shape[0], per = w->shape[1] * w->shape[2] * w->shape[3];
    return pk && pk->dtype == FM_F32 && pk->ndim == 1 && pk->shape[0] == 3 + fm_conv2d_fused_pack_numel(O, per);
}

/* Which kernel conv2d_fused_kernel runs for c: 1 the lanes kernel, 2 the pixel tile, 0 the reference. */
static int fused_path(const fm_op_call *c) {
    const fm_conv2d_fused_attrs *a = c->attrs;
    const fm_tensor *x = c->in[0], *w = c->in[1];
    if (direct_geometry(a, x) && a->hi == INFINITY && !small_unpooled(a, c->out[0]) && !pointwise_unpooled(a, w)) {
        if (fm_cpu_use_avx512()) return lanes_at_avx512(w->shape[0], w->shape[1] * w->shape[2] * w->shape[3]) ? 1 : 2;
        if (fm_cpu_use_avx2()) return 1;
    }
    return 0;
}

int fm_cpu_conv2d_fused_scratch(const fm_op_call *c, int64_t floats[4], int64_t ref_shape[4]) {
    const fm_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    ref_shape[0] = -1;
    for (int i = 0; i < 4; i++) floats[i] = -1;
    if ((x->dtype != FM_F32 && x->dtype != FM_F64) || fm_tensor_numel(y) == 0) return 0;
    const int path = fused_path(c);
    const bool given = packed_given(c);
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    const int64_t per = C * w->shape[2] * w->shape[3];
    if (path == 1) { /* run_lanes: the padded input unless AVX-512 Winograd, the packed weights unless given; run_wino's */
        fm_conv_lanes d;
        const bool wino = lanes_setup(c, &d);
        if (!(wino && fm_cpu_use_avx512())) floats[0] = N * C * d.Hp * d.WS;
        if (!given) floats[1] = fm_conv_lanes_packed_numel(d.O, per);
        if (wino) {
            const fm_conv2d_fused_attrs *a = c->attrs;
            wino_job j;
            wino_setup(&j, &d, H, W, a->p.padding[0], a->p.padding[1]);
            if (!(given && pack_form(w) == PACK_LANES_WINO)) floats[2] = fm_conv_wino_u_floats(C, d.O);
            floats[3] = j.nws * j.wsn;
        }
        return 4;
    }
    if (path == 2) { /* run_direct: the padded input, the packed weights unless given */
        const fm_conv2d_fused_attrs *a = c->attrs;
        fm_conv_direct d;
        memset(&d, 0, sizeof d);
        d.KW = w->shape[3], d.Wo = W + 2 * a->p.padding[1] - d.KW + 1, d.Wy = y->shape[3], d.pool = a->pool > 1 ? 2 : 0;
        floats[0] = N * C * (H + 2 * a->p.padding[0] + 1) * direct_ws(&d);
        if (!given) floats[1] = fm_tensor_numel(w);
        return 2;
    }
    const fm_conv2d_fused_attrs *a = c->attrs; /* run_reference: the unpooled output, then conv2d's own scratch */
    if (a->pool > 1) unpooled_shape(c, ref_shape);
    return -1;
}

static fm_status conv2d_fused_kernel(const fm_op_call *c) {
    const fm_tensor *x = c->in[0];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    if (fm_tensor_numel(c->out[0]) == 0) return FM_OK;
    /* a cap (ReLU6) only in the reference path's epilogue */
    const int path = fused_path(c);
    return path == 1 ? run_lanes(c) : path == 2 ? run_direct(c) : run_reference(c);
}

void fm_cpu_kernels_conv_fused(fm_backend *b) {
    b->kernels[FM_OP_CONV2D_FUSED] = conv2d_fused_kernel;
    b->kernels[FM_OP_CONV2D_FUSED_PACK] = conv2d_fused_pack_kernel;
}
