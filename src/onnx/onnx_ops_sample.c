/* ONNX's sampling ops, on the host in f64: GridSample (spatial transformers, optical flow and
 * deformable-sampling models: nearest, linear and cubic over 1 to 3 spatial dims, cubic over
 * 2; zeros, border and reflection padding) and RoiAlign (two-stage detectors: average or max
 * of bilinear samples per bin). Both gather from data-dependent positions, which no fathom
 * kernel does, so they run here like the other host ops (onnx_ops_host.c) and return to the
 * input's device. */
#include "onnx/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

/* ---- GridSample ---- */

typedef enum { GS_ZEROS, GS_BORDER, GS_REFLECT } gs_pad;
typedef enum { GS_NEAREST, GS_LINEAR, GS_CUBIC } gs_mode;

typedef struct gs_plan {
    int r;                  /* spatial dims */
    int64_t dims[3];        /* input spatial sizes */
    double lo[3], hi[3];    /* the borders coordinates reflect about */
    gs_mode mode;
    gs_pad pad;
    bool align;
} gs_plan;

/* x folded into [lo, hi] by reflecting at the nearer border until it lands inside. */
static double reflect(double x, double lo, double hi) {
    const double span = hi - lo;
    if (span <= 0) return lo;
    if (x < lo || x > hi) {
        const double d = x < lo ? lo - x : x - hi;
        const int64_t n = (int64_t)(d / span);
        const double rem = d - (double)n * span;
        const bool even = n % 2 == 0;
        x = x < lo ? (even ? lo + rem : hi - rem) : (even ? hi - rem : lo + rem);
    }
    return x;
}

/* Tap i along dim d: its index, or -1 when it reads zero padding. */
static int64_t tap(const gs_plan *p, int d, int64_t i) {
    const int64_t n = p->dims[d];
    if (i >= 0 && i < n) return i;
    if (p->pad == GS_ZEROS) return -1;
    if (p->pad == GS_BORDER) return i < 0 ? 0 : n - 1;
    const int64_t j = (int64_t)reflect((double)i, p->lo[d], p->hi[d]);
    return j < 0 ? 0 : j >= n ? n - 1 : j;
}

/* Keys' cubic convolution weights (a = -0.75) of the four taps around a point t past the first
 * inner one (0 <= t < 1). */
static void cubic_weights(double t, double w[4]) {
    const double a = -0.75, t1 = t + 1, t2 = 1 - t, t3 = 2 - t;
    w[0] = ((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a;
    w[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
    w[2] = ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1;
    w[3] = ((a * t3 - 5 * a) * t3 + 8 * a) * t3 - 4 * a;
}

/* One output value of the plane x (dims p->dims, row-major) at the pixel coordinates c[d]. */
static double gs_sample(const gs_plan *p, const double *x, const double *c) {
    const int taps = p->mode == GS_NEAREST ? 1 : p->mode == GS_LINEAR ? 2 : 4;
    int64_t base[3];
    double w[3][4];
    for (int d = 0; d < p->r; d++) {
        const double f = floor(c[d]), t = c[d] - f;
        base[d] = (int64_t)f - (p->mode == GS_CUBIC);
        if (p->mode == GS_NEAREST) base[d] = (int64_t)c[d], w[d][0] = 1; /* c already rounded */
        else if (p->mode == GS_LINEAR) w[d][0] = 1 - t, w[d][1] = t;
        else cubic_weights(t, w[d]);
    }
    int total = 1;
    for (int d = 0; d < p->r; d++) total *= taps;
    double acc = 0;
    for (int k = 0; k < total; k++) {
        int64_t off = 0;
        double wt = 1;
        for (int d = 0, q = k; d < p->r; d++, q /= taps) {
            const int64_t i = tap(p, d, base[d] + q % taps);
            if (i < 0) { wt = 0; break; }
            off = off * p->dims[d] + i, wt *= w[d][q % taps];
        }
        if (wt != 0) acc += wt * x[off];
    }
    return acc;
}

/* The grid's normalized point g (its last dim lists W first) as pixel coordinates, rounded
 * half to even for nearest, clamped or reflected into the borders by the padding mode; cubic
 * with border padding clamps only its taps (tap()), as PyTorch and ONNX Runtime do (ONNX's
 * reference clamps the point too, which moves the taps). */
static void gs_coords(const gs_plan *p, const double *g, double *c) {
    for (int d = 0; d < p->r; d++) {
        const double n = g[p->r - 1 - d], len = (double)p->dims[d];
        double v = p->align ? (n + 1) / 2 * (len - 1) : ((n + 1) * len - 1) / 2;
        if (p->mode == GS_NEAREST) v = nearbyint(v);
        if (v < p->lo[d] || v > p->hi[d]) {
            if (p->pad == GS_BORDER && p->mode != GS_CUBIC) v = v < 0 ? 0 : v > len - 1 ? len - 1 : v;
            else if (p->pad == GS_REFLECT) v = reflect(v, p->lo[d], p->hi[d]);
        }
        c[d] = v;
    }
}

static fm_status gs_plan_of(onnx_op_ctx *c, gs_plan *p) {
    const fm_tensor *x = c->in[0], *g = c->in[1];
    char mb[16], pb[16];
    const char *mode = onnx_attr_string(c, "mode", c->opset >= 20 ? "linear" : "bilinear", mb, sizeof mb);
    const char *pad = onnx_attr_string(c, "padding_mode", "zeros", pb, sizeof pb);
    memset(p, 0, sizeof *p);
    p->r = x->ndim - 2;
    p->align = onnx_attr_int(c, "align_corners", 0) != 0;
    p->mode = !strcmp(mode, "nearest") ? GS_NEAREST : !strcmp(mode, "linear") || !strcmp(mode, "bilinear") ? GS_LINEAR
            : !strcmp(mode, "cubic") || !strcmp(mode, "bicubic") ? GS_CUBIC : (gs_mode)-1;
    p->pad = !strcmp(pad, "zeros") ? GS_ZEROS : !strcmp(pad, "border") ? GS_BORDER : !strcmp(pad, "reflection") ? GS_REFLECT : (gs_pad)-1;
    if ((int)p->mode < 0) return onnx_node_error(c, FM_ERR_INVALID, "mode '%s' is not nearest, linear (bilinear) or cubic (bicubic)", mode);
    if ((int)p->pad < 0) return onnx_node_error(c, FM_ERR_INVALID, "padding_mode '%s' is not zeros, border or reflection", pad);
    if (p->r < 1 || p->r > 3 || (p->mode == GS_CUBIC && p->r != 2))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "X has %d spatial dims; fathom samples 1 to 3 (cubic: 2)", p->r);
    if (g->ndim != x->ndim || g->shape[0] != x->shape[0] || g->shape[g->ndim - 1] != p->r) {
        char a[96], b[96];
        return onnx_node_error(c, FM_ERR_INVALID, "grid %s does not fit X %s: it must be [N, out spatial..., %d]",
                               fm_shape_str(g->ndim, g->shape, a, sizeof a), fm_shape_str(x->ndim, x->shape, b, sizeof b), p->r);
    }
    if (!fm_dtype_is_float(x->dtype) || !fm_dtype_is_float(g->dtype)) return onnx_node_error(c, FM_ERR_INVALID, "X and grid must be floating-point");
    for (int d = 0; d < p->r; d++) {
        p->dims[d] = x->shape[2 + d];
        p->lo[d] = p->align ? 0 : -0.5, p->hi[d] = p->align ? (double)p->dims[d] - 1 : (double)p->dims[d] - 0.5;
    }
    return FM_OK;
}

static fm_status op_grid_sample(onnx_op_ctx *c) {
    gs_plan p = {0};
    if (gs_plan_of(c, &p)) return fm_last_status();
    const fm_tensor *x = c->in[0], *g = c->in[1];
    const int64_t N = x->shape[0], C = x->shape[1];
    int64_t plane = 1, outs = 1, ysh[FM_MAX_DIMS] = {N, C};
    for (int d = 0; d < p.r; d++) plane *= p.dims[d], outs *= g->shape[1 + d], ysh[2 + d] = g->shape[1 + d];
    fm_tensor *xh = onnx_host(c->in[0], FM_F64), *gh = xh ? onnx_host(c->in[1], FM_F64) : NULL;
    fm_tensor *y = gh ? fm_tensor_empty(x->ndim, ysh, FM_F64, FM_CPU) : NULL;
    if (y) {
        const double *xv = fm_tensor_data(xh), *gv = fm_tensor_data(gh);
        double *yv = fm_tensor_data(y), co[3];
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < outs; o++) {
                gs_coords(&p, gv + (n * outs + o) * p.r, co);
                for (int64_t ch = 0; ch < C; ch++) yv[(n * C + ch) * outs + o] = gs_sample(&p, xv + (n * C + ch) * plane, co);
            }
    }
    REL(xh, gh);
    return onnx_set_out(c, 0, onnx_host_back(y, x->dtype, x->storage->device));
}

/* ---- RoiAlign ---- */

typedef struct roi_plan {
    int64_t H, W, oh, ow, sampling;
    double scale, offset;
    bool is_max, half_pixel;
} roi_plan;

/* The bilinear sample of plane x at (y, x): the four taps' weighted values, each kept (max
 * mode takes the largest weighted tap, as ONNX Runtime and ONNX's reference do). */
static void roi_taps(const roi_plan *p, double y, double xx, int64_t pos[4], double w[4]) {
    if (y < -1.0 || y > (double)p->H || xx < -1.0 || xx > (double)p->W) {
        memset(pos, 0, 4 * sizeof *pos), memset(w, 0, 4 * sizeof *w);
        return;
    }
    y = y < 0 ? 0 : y, xx = xx < 0 ? 0 : xx;
    int64_t yl = (int64_t)y, xl = (int64_t)xx, yh, xh;
    if (yl >= p->H - 1) yh = yl = p->H - 1, y = (double)yl;
    else yh = yl + 1;
    if (xl >= p->W - 1) xh = xl = p->W - 1, xx = (double)xl;
    else xh = xl + 1;
    const double ly = y - (double)yl, lx = xx - (double)xl, hy = 1 - ly, hx = 1 - lx;
    pos[0] = yl * p->W + xl, pos[1] = yl * p->W + xh, pos[2] = yh * p->W + xl, pos[3] = yh * p->W + xh;
    w[0] = hy * hx, w[1] = hy * lx, w[2] = ly * hx, w[3] = ly * lx;
}

/* One roi's bins over every channel of its image. */
static void roi_one(const roi_plan *p, const double *img, int64_t C, const double *box, double *out) {
    const double x0 = box[0] * p->scale - p->offset, y0 = box[1] * p->scale - p->offset;
    double rw = box[2] * p->scale - p->offset - x0, rh = box[3] * p->scale - p->offset - y0;
    if (!p->half_pixel) rw = rw < 1 ? 1 : rw, rh = rh < 1 ? 1 : rh;
    const double bh = rh / (double)p->oh, bw = rw / (double)p->ow;
    const int64_t gh = p->sampling > 0 ? p->sampling : (int64_t)ceil(rh / (double)p->oh), gw = p->sampling > 0 ? p->sampling : (int64_t)ceil(rw / (double)p->ow);
    const double count = gh * gw > 1 ? (double)(gh * gw) : 1;
    for (int64_t ph = 0; ph < p->oh; ph++)
        for (int64_t pw = 0; pw < p->ow; pw++)
            for (int64_t ch = 0; ch < C; ch++) {
                const double *pl = img + ch * p->H * p->W;
                double acc = 0;
                bool any = false;
                for (int64_t iy = 0; iy < gh; iy++)
                    for (int64_t ix = 0; ix < gw; ix++) {
                        int64_t pos[4];
                        double w[4];
                        roi_taps(p, y0 + (double)ph * bh + ((double)iy + 0.5) * bh / (double)gh,
                                 x0 + (double)pw * bw + ((double)ix + 0.5) * bw / (double)gw, pos, w);
                        if (!p->is_max) {
                            for (int k = 0; k < 4; k++) acc += w[k] * pl[pos[k]];
                            continue;
                        }
                        double v = w[0] * pl[pos[0]];
                        for (int k = 1; k < 4; k++) v = fmax(v, w[k] * pl[pos[k]]);
                        acc = any ? fmax(acc, v) : v, any = true;
                    }
                out[(ch * p->oh + ph) * p->ow + pw] = p->is_max ? acc : acc / count;
            }
}

static fm_status roi_plan_of(onnx_op_ctx *c, roi_plan *p) {
    const fm_tensor *x = c->in[0], *rois = c->in[1], *bi = c->in[2];
    char mb[8], cb[24];
    const char *mode = onnx_attr_string(c, "mode", "avg", mb, sizeof mb);
    const char *ctm = onnx_attr_string(c, "coordinate_transformation_mode", c->opset >= 16 ? "half_pixel" : "output_half_pixel", cb, sizeof cb);
    if (strcmp(mode, "avg") && strcmp(mode, "max")) return onnx_node_error(c, FM_ERR_INVALID, "mode '%s' is not avg or max", mode);
    if (strcmp(ctm, "half_pixel") && strcmp(ctm, "output_half_pixel"))
        return onnx_node_error(c, FM_ERR_INVALID, "coordinate_transformation_mode '%s' is not half_pixel or output_half_pixel", ctm);
    if (x->ndim != 4 || rois->ndim != 2 || rois->shape[1] != 4 || bi->ndim != 1 || bi->shape[0] != rois->shape[0])
        return onnx_node_error(c, FM_ERR_INVALID, "needs X [N, C, H, W], rois [R, 4] and batch_indices [R]");
    if (!fm_dtype_is_float(x->dtype) || !fm_dtype_is_float(rois->dtype) || (bi->dtype != FM_I64 && bi->dtype != FM_I32))
        return onnx_node_error(c, FM_ERR_INVALID, "X and rois must be floating-point, batch_indices int64");
    *p = (roi_plan){.H = x->shape[2], .W = x->shape[3], .oh = onnx_attr_int(c, "output_height", 1), .ow = onnx_attr_int(c, "output_width", 1),
                    .sampling = onnx_attr_int(c, "sampling_ratio", 0), .scale = onnx_attr_float(c, "spatial_scale", 1.0f),
                    .is_max = !strcmp(mode, "max"), .half_pixel = !strcmp(ctm, "half_pixel")};
    p->offset = p->half_pixel ? 0.5 : 0.0;
    if (p->oh < 1 || p->ow < 1 || p->oh > 4096 || p->ow > 4096 || p->sampling < 0 || p->sampling > 64)
        return onnx_node_error(c, FM_ERR_INVALID, "output_height/width must be in [1, 4096] and sampling_ratio in [0, 64]");
    return FM_OK;
}

static fm_status op_roi_align(onnx_op_ctx *c) {
    roi_plan p = {0};
    if (roi_plan_of(c, &p)) return fm_last_status();
    const fm_tensor *x = c->in[0];
    const int64_t N = x->shape[0], C = x->shape[1], R = c->in[1]->shape[0], ysh[4] = {R, C, p.oh, p.ow};
    fm_tensor *xh = onnx_host(c->in[0], FM_F64), *rh = xh ? onnx_host(c->in[1], FM_F64) : NULL, *bh = rh ? onnx_host(c->in[2], FM_I64) : NULL;
    fm_tensor *y = bh ? fm_tensor_empty(4, ysh, FM_F64, FM_CPU) : NULL;
    fm_status st = y ? FM_OK : fm_last_status();
    for (int64_t r = 0; !st && r < R; r++) {
        const int64_t b = ((const int64_t *)fm_tensor_data(bh))[r];
        if (b < 0 || b >= N) st = onnx_node_error(c, FM_ERR_INVALID, "batch_indices[%lld] = %lld is outside [0, %lld)", (long long)r, (long long)b, (long long)N);
        else
            roi_one(&p, (const double *)fm_tensor_data(xh) + b * C * p.H * p.W, C, (const double *)fm_tensor_data(rh) + 4 * r,
                    (double *)fm_tensor_data(y) + r * C * p.oh * p.ow);
    }
    REL(xh, rh, bh);
    if (st) {
        fm_tensor_release(y);
        return st;
    }
    return onnx_set_out(c, 0, onnx_host_back(y, x->dtype, x->storage->device));
}

const onnx_op onnx_ops_sample[] = {
    {"GridSample", 16, 2, 2, 1, "align_corners,mode,padding_mode", op_grid_sample},
    {"RoiAlign", 10, 3, 3, 1, "coordinate_transformation_mode,mode,output_height,output_width,sampling_ratio,spatial_scale", op_roi_align},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
