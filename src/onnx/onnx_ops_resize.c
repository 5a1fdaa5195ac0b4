/* ONNX Resize (opsets 10 to 19) and Upsample (7 to 9), on the host.
 *
 * Every mode (nearest, linear, cubic) is separable, so the input is resized one
 * axis at a time: for each output position the coordinate transform gives a
 * source coordinate x, and the mode a small kernel of weights over the source
 * positions around x (indices clamped to the edge; exclude_outside drops those
 * outside and renormalizes). Antialias (opset 18) widens the linear and cubic
 * kernels by 1/scale when downsampling. tf_crop_and_resize gives
 * extrapolation_value where x falls outside the input. fathom has no resize
 * kernel, so this runs in f64 on the host like the other host ops. */
#include "onnx/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { R_NEAREST, R_LINEAR, R_CUBIC } rs_mode;
typedef enum { C_HALF_PIXEL, C_HALF_PIXEL_SYM, C_PYTORCH_HALF_PIXEL, C_ALIGN_CORNERS, C_ASYMMETRIC, C_TF_CROP, C_TF_HALF_PIXEL_NN } rs_coord;
typedef enum { N_ROUND_FLOOR, N_ROUND_CEIL, N_FLOOR, N_CEIL } rs_nearest;

typedef struct rs_opts {
    rs_mode mode;
    rs_coord coord;
    rs_nearest nearest;
    double cubic_a, extrapolation;
    bool exclude_outside, antialias;
} rs_opts;

#define RS_MAX_TAPS 64 /* antialias kernels grow with 1/scale; beyond this, refused */

/* The source coordinate of output position o along an axis of `in` -> `out`
 * (out_f: scale * in, as a real number), and whether it lies outside [0, in-1]
 * for tf_crop_and_resize. */
static double source_coord(const rs_opts *p, double o, double scale, int64_t in, int64_t out, double out_f, const double *roi,
                           bool *extrap) {
    double x;
    *extrap = false;
    switch (p->coord) {
    case C_ALIGN_CORNERS: x = out_f == 1 ? 0 : o * (double)(in - 1) / (out_f - 1); break;
    case C_ASYMMETRIC: x = o / scale; break;
    case C_TF_HALF_PIXEL_NN: x = (o + 0.5) / scale; break; /* opsets 11 and 12 */
    case C_PYTORCH_HALF_PIXEL: x = out_f == 1 ? -0.5 : (o + 0.5) / scale - 0.5; break;
    case C_HALF_PIXEL_SYM: {
        double offset = (double)in / 2 * (1 - (double)out / out_f);
        x = offset + (o + 0.5) / scale - 0.5;
        break;
    }
    case C_TF_CROP:
        x = out_f == 1 ? (roi[1] - roi[0]) * (double)(in - 1) / 2 : o * (roi[1] - roi[0]) * (double)(in - 1) / (out_f - 1);
        x += roi[0] * (double)(in - 1);
        *extrap = x < 0 || x > (double)(in - 1);
        break;
    default: x = (o + 0.5) / scale - 0.5; break;
    }
    return x;
}

static double cubic_w(double x, double a) {
    x = fabs(x);
    if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0;
}

/* The kernel's weights for fraction r in (0, 1] (r = 1 at an exact source
 * position); returns the tap count. Tap k weighs the source position
 * floor-ish(x) + first + k, as set up by axis_plan. */
static int kernel(const rs_opts *p, double r, double scale, double *w) {
    if (p->mode == R_NEAREST) {
        bool right;
        if (r == 1) right = true;
        else if (p->nearest == N_ROUND_FLOOR) right = r > 0.5;
        else if (p->nearest == N_ROUND_CEIL) right = r >= 0.5;
        else right = p->nearest == N_CEIL;
        w[0] = !right, w[1] = right;
        return 2;
    }
    double s = p->antialias && scale < 1 ? scale : 1, sum = 0;
    int first = p->mode == R_LINEAR ? (int)floor(-1 / s) + 1 : (int)floor(-2 / s) + 1, n = 2 - 2 * first;
    if (n > RS_MAX_TAPS) return -1;
    for (int k = 0; k < n; k++) {
        double d = (first + k - r) * s;
        w[k] = p->mode == R_LINEAR ? fmax(0, 1 - fabs(d)) : cubic_w(d, p->cubic_a);
        sum += w[k];
    }
    if (s < 1 && sum != 0)
        for (int k = 0; k < n; k++) w[k] /= sum;
    return n;
}

/* The taps of output position o along an axis of `in` -> `out` positions: the source
 * indices (clamped to the edge) and weights of its kernel; *ex when tf_crop_and_resize puts
 * it outside the input. Returns the tap count, or -1 past RS_MAX_TAPS (an error set). */
static int axis_taps(const rs_opts *p, int64_t o, int64_t in, int64_t out, double scale, const double *roi, int64_t *idx, double *w, bool *ex) {
    double out_f = scale * (double)in, x = source_coord(p, (double)o, scale, in, out, out_f, roi, ex), xf = floor(x);
    int n = kernel(p, x == xf ? 1 : x - xf, scale, w);
    if (n < 0) { fm_set_error(FM_ERR_UNSUPPORTED, "antialias kernel over %d taps (scale %g)", RS_MAX_TAPS, scale); return -1; }
    /* the n positions nearest x, the lower preferred: an even kernel starts n/2 - 1
     * below floor(x) (n/2 at an exact position), an odd one is centred on the nearest */
    double frac = x - xf, sum = 0;
    int64_t start = (int64_t)xf + (n % 2 == 0 ? (frac == 0 ? -(n / 2) : -(n / 2) + 1) : -((n - 1) / 2) + (frac > 0.5));
    for (int k = 0; k < n; k++) {
        int64_t j = start + k;
        if (p->exclude_outside && (j < 0 || j >= in)) w[k] = 0;
        sum += w[k];
        idx[k] = j < 0 ? 0 : j >= in ? in - 1 : j;
    }
    if (p->exclude_outside && sum != 0)
        for (int k = 0; k < n; k++) w[k] /= sum;
    return n;
}

/* Resizes axis `ax` of the contiguous f64 buffer src (shape sh) to `out`
 * positions into dst. */
static fm_status resize_axis(const rs_opts *p, const double *src, double *dst, int ndim, const int64_t *sh, int ax, int64_t out,
                             double scale, const double *roi) {
    int64_t in = sh[ax], outer = 1, inner = 1, idx[RS_MAX_TAPS];
    for (int i = 0; i < ax; i++) outer *= sh[i];
    for (int i = ax + 1; i < ndim; i++) inner *= sh[i];
    double w[RS_MAX_TAPS];
    for (int64_t o = 0; o < out; o++) {
        bool ex;
        int n = axis_taps(p, o, in, out, scale, roi, idx, w, &ex);
        if (n < 0) return fm_last_status();
        for (int64_t a = 0; a < outer; a++) {
            double *d = dst + (a * out + o) * inner;
            for (int64_t i = 0; i < inner; i++) d[i] = ex ? p->extrapolation : 0;
            if (ex) continue;
            for (int k = 0; k < n; k++) {
                if (w[k] == 0) continue;
                const double *s = src + (a * in + idx[k]) * inner;
                for (int64_t i = 0; i < inner; i++) d[i] += w[k] * s[i];
            }
        }
    }
    return FM_OK;
}

/* Resizes x to out_sh with per-axis scales (roi: starts then ends, per dim). */
static fm_tensor *resize(const rs_opts *p, fm_tensor *x, const int64_t *out_sh, const double *scales, const double *roi) {
    fm_tensor *h = onnx_host(x, FM_F64);
    if (!h) return NULL;
    int nd = x->ndim;
    int64_t sh[FM_MAX_DIMS];
    memcpy(sh, x->shape, sizeof(int64_t) * (size_t)nd);
    for (int ax = 0; h && ax < nd; ax++) {
        double r2[2] = {roi ? roi[ax] : 0, roi ? roi[ax + nd] : 1};
        if (out_sh[ax] == sh[ax] && fabs(scales[ax] - 1) < 1e-9 && fabs(r2[0]) < 1e-9 && fabs(r2[1] - 1) < 1e-9) continue;
        if (sh[ax] == 0 && out_sh[ax] > 0) {
            fm_tensor_release(h);
            fm_set_error(FM_ERR_INVALID, "cannot resize an empty dimension %d to %lld", ax, (long long)out_sh[ax]);
            return NULL;
        }
        int64_t nsh[FM_MAX_DIMS];
        memcpy(nsh, sh, sizeof nsh);
        nsh[ax] = out_sh[ax];
        fm_tensor *y = fm_tensor_empty(nd, nsh, FM_F64, FM_CPU);
        if (y && resize_axis(p, fm_tensor_data(h), fm_tensor_data(y), nd, sh, ax, out_sh[ax], scales[ax], r2))
            fm_tensor_release(y), y = NULL;
        fm_tensor_release(h);
        h = y;
        sh[ax] = out_sh[ax];
    }
    return onnx_host_back(h, x->dtype, x->storage->device);
}

static fm_status parse_opts(onnx_op_ctx *c, rs_opts *p) {
    char buf[32];
    const char *m = onnx_attr_string(c, "mode", "nearest", buf, sizeof buf);
    if (!strcmp(m, "nearest")) p->mode = R_NEAREST;
    else if (!strcmp(m, "linear") || !strcmp(m, "bilinear")) p->mode = R_LINEAR;
    else if (!strcmp(m, "cubic") && c->opset >= 11) p->mode = R_CUBIC;
    else return onnx_node_error(c, FM_ERR_UNSUPPORTED, "mode='%s' is not supported (nearest, linear, cubic)", m);
    bool old = c->opset < 11; /* Upsample and Resize-10: asymmetric coordinates, nearest rounds down */
    static const char *const coords[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                                         "tf_crop_and_resize", "tf_half_pixel_for_nn"};
    const char *cm = onnx_attr_string(c, "coordinate_transformation_mode", old ? "asymmetric" : "half_pixel", buf, sizeof buf);
    p->coord = (rs_coord)-1;
    for (int i = 0; i < 7; i++)
        if (!strcmp(cm, coords[i])) p->coord = (rs_coord)i;
    if ((int)p->coord < 0) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "coordinate_transformation_mode='%s' is not supported", cm);
    static const char *const nearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    const char *nm = onnx_attr_string(c, "nearest_mode", old ? "floor" : "round_prefer_floor", buf, sizeof buf);
    p->nearest = (rs_nearest)-1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(nm, nearest[i])) p->nearest = (rs_nearest)i;
    if ((int)p->nearest < 0) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "nearest_mode='%s' is not supported", nm);
    p->cubic_a = onnx_attr_float(c, "cubic_coeff_a", -0.75f);
    p->extrapolation = onnx_attr_float(c, "extrapolation_value", 0.0f);
    p->exclude_outside = onnx_attr_int(c, "exclude_outside", 0) != 0;
    p->antialias = onnx_attr_int(c, "antialias", 0) != 0;
    return FM_OK;
}

/* The float values of input i (at most max); -1 in *n when omitted or empty. */
static fm_status float_input(onnx_op_ctx *c, int i, double *v, int max, int *n) {
    *n = -1;
    if (i >= c->n_in || !c->in[i] || fm_tensor_numel(c->in[i]) == 0) return FM_OK;
    int64_t k = fm_tensor_numel(c->in[i]);
    if (k > max) return onnx_node_error(c, FM_ERR_INVALID, "input %d has %lld values; at most %d expected", i, (long long)k, max);
    /* through the host: the input may be on a device */
    fm_tensor *t = fm_to_dtype(c->in[i], FM_F64), *ct = t ? fm_contiguous(t) : NULL;
    fm_status st = ct ? fm_tensor_copy_to_host(ct, v, FM_F64) : fm_last_status();
    fm_tensor_release_n(2, t, ct);
    if (st) return st;
    *n = (int)k;
    return FM_OK;
}

/* Output sizes and per-axis scales from `scales` or `sizes` over the listed axes,
 * with keep_aspect_ratio_policy for sizes. */
static fm_status out_shape(onnx_op_ctx *c, const fm_tensor *x, const int *axes, int na, const double *sc, int nsc, const double *sz,
                           int nsz, int64_t *out, double *scale) {
    int nd = x->ndim;
    for (int i = 0; i < nd; i++) out[i] = x->shape[i], scale[i] = 1;
    if ((nsc > 0) == (nsz > 0)) return onnx_node_error(c, FM_ERR_INVALID, "exactly one of scales and sizes must be given");
    int n = nsc > 0 ? nsc : nsz;
    if (n != na) return onnx_node_error(c, FM_ERR_INVALID, "%s has %d values for %d axes", nsc > 0 ? "scales" : "sizes", n, na);
    if (nsc > 0) {
        for (int i = 0; i < na; i++) {
            if (!(sc[i] > 0) || !isfinite(sc[i])) return onnx_node_error(c, FM_ERR_INVALID, "scale %g is not positive", sc[i]);
            double o = floor(sc[i] * (double)x->shape[axes[i]]);
            if (o > 1e9) return onnx_node_error(c, FM_ERR_INVALID, "scale %g makes a dimension of %g", sc[i], o);
            scale[axes[i]] = sc[i], out[axes[i]] = (int64_t)o;
        }
        return FM_OK;
    }
    char buf[16];
    const char *pol = onnx_attr_string(c, "keep_aspect_ratio_policy", "stretch", buf, sizeof buf);
    int kp = !strcmp(pol, "stretch") ? 0 : !strcmp(pol, "not_larger") ? 1 : !strcmp(pol, "not_smaller") ? 2 : -1;
    if (kp < 0) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "keep_aspect_ratio_policy='%s' is not supported", pol);
    double pick = kp == 1 ? INFINITY : 0;
    for (int i = 0; i < na; i++) {
        if (sz[i] < 0 || sz[i] > 1e9) return onnx_node_error(c, FM_ERR_INVALID, "size %g is out of range", sz[i]);
        if (x->shape[axes[i]] == 0) return onnx_node_error(c, FM_ERR_INVALID, "cannot resize an empty dimension by sizes");
        double s = sz[i] / (double)x->shape[axes[i]];
        scale[axes[i]] = s, out[axes[i]] = (int64_t)sz[i];
        pick = kp == 1 ? fmin(pick, s) : fmax(pick, s);
    }
    if (kp)
        for (int i = 0; i < na; i++) scale[axes[i]] = pick, out[axes[i]] = (int64_t)(pick * (double)x->shape[axes[i]] + 0.5);
    return FM_OK;
}

/* Everything Resize takes: its options, the output shape, per-axis scales and the roi. */
static fm_status resize_params(onnx_op_ctx *c, const fm_tensor *x, rs_opts *p, int64_t *out, double *scale, double *roi) {
    if (parse_opts(c, p)) return fm_last_status();
    int nd = x->ndim, axes[FM_MAX_DIMS], na = 0, n_axes_attr;
    const int64_t *aa = onnx_attr_ints(c, "axes", &n_axes_attr);
    if (n_axes_attr > nd) return onnx_node_error(c, FM_ERR_INVALID, "%d axes for a rank-%d input", n_axes_attr, nd);
    for (int i = 0; i < (n_axes_attr ? n_axes_attr : nd); i++) {
        int64_t a = n_axes_attr ? (aa[i] < 0 ? aa[i] + nd : aa[i]) : i;
        if (a < 0 || a >= nd) return onnx_node_error(c, FM_ERR_INVALID, "axis %lld out of range", (long long)aa[i]);
        for (int j = 0; j < na; j++)
            if (axes[j] == a) return onnx_node_error(c, FM_ERR_INVALID, "axis %lld repeated", (long long)a);
        axes[na++] = (int)a;
    }
    double sc[FM_MAX_DIMS], sz[FM_MAX_DIMS], roi_in[2 * FM_MAX_DIMS];
    int nsc, nsz = -1, nroi = -1;
    if (c->opset < 11) { /* Resize-10, Upsample-9: (X, scales); Upsample-7: scales attribute */
        if (c->n_in > 1) {
            if (float_input(c, 1, sc, FM_MAX_DIMS, &nsc)) return fm_last_status();
        } else {
            const Onnx__AttributeProto *a = onnx_attr(c, "scales");
            nsc = a ? (int)a->n_floats : -1;
            if (nsc > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_INVALID, "too many scales");
            for (int i = 0; i < nsc; i++) sc[i] = a->floats[i];
        }
    } else if (float_input(c, 1, roi_in, 2 * FM_MAX_DIMS, &nroi) || float_input(c, 2, sc, FM_MAX_DIMS, &nsc) ||
               float_input(c, 3, sz, FM_MAX_DIMS, &nsz))
        return fm_last_status();
    if (out_shape(c, x, axes, na, sc, nsc, sz, nsz, out, scale)) return fm_last_status();
    double total = 1;
    for (int i = 0; i < nd; i++) total *= (double)out[i];
    if (total > 4294967296.0) return onnx_node_error(c, FM_ERR_INVALID, "the output would have %.3g elements", total);
    for (int i = 0; i < nd; i++) roi[i] = 0, roi[i + nd] = 1;
    if (p->coord == C_TF_CROP) {
        if (nroi != 2 * na) return onnx_node_error(c, FM_ERR_INVALID, "tf_crop_and_resize needs a roi of %d values", 2 * na);
        for (int i = 0; i < na; i++) roi[axes[i]] = roi_in[i], roi[axes[i] + nd] = roi_in[i + na];
    }
    return FM_OK;
}

static fm_status op_resize(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0];
    rs_opts p = {0};
    int64_t out[FM_MAX_DIMS];
    double scale[FM_MAX_DIMS], roi[2 * FM_MAX_DIMS];
    if (resize_params(c, x, &p, out, scale, roi)) return fm_last_status();
    fm_tensor *y = resize(&p, x, out, scale, p.coord == C_TF_CROP ? roi : NULL);
    if (!y) return onnx_node_error(c, fm_last_status(), "%s", fm_last_error());
    return onnx_set_out(c, 0, y);
}

fm_status onnx_resize_plan(onnx_op_ctx *c, const fm_tensor *x, onnx_resize_axis *axes, int *n_axes) {
    rs_opts p = {0};
    int64_t out[FM_MAX_DIMS], idx[RS_MAX_TAPS];
    double scale[FM_MAX_DIMS], roi[2 * FM_MAX_DIMS], w[RS_MAX_TAPS];
    *n_axes = 0;
    if (resize_params(c, x, &p, out, scale, roi)) return fm_last_status();
    if (p.coord == C_TF_CROP) return fm_set_error(FM_ERR_UNSUPPORTED, "tf_crop_and_resize has no graph form");
    for (int ax = 0; ax < x->ndim; ax++) {
        if (out[ax] == x->shape[ax] && fabs(scale[ax] - 1) < 1e-9) continue;
        if (x->shape[ax] == 0) return fm_set_error(FM_ERR_INVALID, "cannot resize an empty dimension %d", ax);
        onnx_resize_axis *r = &axes[(*n_axes)++];
        r->ax = ax, r->in = x->shape[ax], r->out = out[ax], r->n = 0;
        r->idx = NULL, r->w = NULL;
        for (int64_t o = 0; o < out[ax]; o++) {
            bool ex;
            int n = axis_taps(&p, o, r->in, r->out, scale[ax], NULL, idx, w, &ex);
            if (n < 0) return fm_last_status();
            if (!r->idx) {
                r->n = n;
                r->idx = malloc(sizeof(int64_t) * (size_t)(n * r->out));
                r->w = malloc(sizeof(double) * (size_t)(n * r->out));
                if (!r->idx || !r->w) return fm_set_error(FM_ERR_OOM, "Resize: out of host memory");
            }
            memcpy(r->idx + o * n, idx, sizeof(int64_t) * (size_t)n);
            memcpy(r->w + o * n, w, sizeof(double) * (size_t)n);
        }
    }
    return FM_OK;
}

const onnx_op onnx_ops_resize[] = {
    {"Resize", 10, 1, 4, 1,
     "mode,coordinate_transformation_mode,nearest_mode,cubic_coeff_a,exclude_outside,extrapolation_value,antialias,axes,"
     "keep_aspect_ratio_policy",
     op_resize},
    {"Upsample", 7, 1, 2, 1, "mode,scales", op_resize},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
