/* ONNX's signal ops: HannWindow, HammingWindow, BlackmanWindow, DFT, STFT and
 * MelWeightMatrix, what Whisper-style audio front ends export (a log-mel spectrogram:
 * the STFT of the Hann-windowed waveform, its magnitudes, times a MelWeightMatrix). They
 * run on the host in f64 and return the result on the input's device in the input's dtype
 * (the window and mel ops: in output_datatype). The FFT is written here because fathom
 * has no FFT dependency and these are small preprocessing steps on the host: a radix-2
 * transform for power-of-two lengths, the direct sum for short other lengths, and
 * Bluestein's chirp-z (a convolution by power-of-two FFTs) for long ones, so any length
 * costs O(n log n). No graph form. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

/* Window, DFT and spectrum lengths: far beyond any audio front end (2^26 samples is 70
 * minutes at 16 kHz), and a bound on the host buffers a corrupt size input could ask for. */
#define SIGNAL_MAX_LEN ((int64_t)1 << 26)
/* Non-power-of-two lengths up to this take the direct O(n^2) sum, exact twiddles and no padding. */
#define DFT_DIRECT_MAX 64

static const double PI = 3.14159265358979323846;

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }
static const char *in_name(const onnx_op_ctx *c, int k) { return k < (int)c->node->n_input ? c->node->input[k] : "?"; }
static fm_tensor *opt_in(const onnx_op_ctx *c, int k) { return k < c->n_in ? c->in[k] : NULL; }
static fm_status oom(const onnx_op_ctx *c) { return onnx_node_error(c, FM_ERR_OOM, "out of memory"); }

/* Integer scalar input k (int32 or int64, one element). */
static fm_status int_scalar(const onnx_op_ctx *c, int k, int64_t *v) {
    int n = 0;
    if (onnx_tensor_ints(c, k, v, 1, &n)) return fm_last_status();
    return n == 1 ? FM_OK : onnx_node_error(c, FM_ERR_INVALID, "input %d ('%s') must hold one integer; it is empty", k, in_name(c, k));
}

/* Float scalar input k (one element). */
static fm_status float_scalar(const onnx_op_ctx *c, int k, double *v) {
    fm_tensor *t = c->in[k];
    if (!fm_dtype_is_float(t->dtype) || fm_tensor_numel(t) != 1 || t->ndim > 1)
        return onnx_node_error(c, FM_ERR_INVALID, "input %d ('%s') must be a float scalar; got %s of rank %d with %" PRId64 " elements", k,
                               in_name(c, k), fm_dtype_name(t->dtype), t->ndim, fm_tensor_numel(t));
    fm_tensor *h = onnx_host(t, FM_F64);
    if (!h) return fm_last_status();
    *v = *(const double *)fm_tensor_data(h);
    fm_tensor_release(h);
    return FM_OK;
}

/* A length-like integer input in [lo, SIGNAL_MAX_LEN]. */
static fm_status length_in(const onnx_op_ctx *c, int k, const char *what, int64_t lo, int64_t *v) {
    if (int_scalar(c, k, v)) return fm_last_status();
    if (*v < lo || *v > SIGNAL_MAX_LEN)
        return onnx_node_error(c, FM_ERR_INVALID, "input %d ('%s'), %s, is %" PRId64 "; it must be in [%" PRId64 ", %" PRId64 "]", k,
                               in_name(c, k), what, *v, lo, SIGNAL_MAX_LEN);
    return FM_OK;
}

static fm_status bool_attr(const onnx_op_ctx *c, const char *name, int64_t dflt, bool *v) {
    const int64_t a = onnx_attr_int(c, name, dflt);
    if (a != 0 && a != 1) return onnx_node_error(c, FM_ERR_INVALID, "attribute %s is %" PRId64 "; it must be 0 or 1", name, a);
    *v = a == 1;
    return FM_OK;
}

/* A bound on the host result (8 GiB of f64): STFT's frames times bins, or a long DFT over
 * many rows, can ask for far more than the input holds. */
static fm_status out_size(const onnx_op_ctx *c, double elems) {
    if (elems <= (double)((int64_t)1 << 30)) return FM_OK;
    return onnx_node_error(c, FM_ERR_INVALID, "the output would have %.4g elements; at most 2^30 are allowed", elems);
}

/* The output_datatype attribute (default float) as a fathom dtype. */
static fm_status out_dtype(const onnx_op_ctx *c, fm_dtype *dt) {
    const int64_t t = onnx_attr_int(c, "output_datatype", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
    if (t < INT32_MIN || t > INT32_MAX || !onnx_dtype_to_fm((int32_t)t, dt) || *dt == FM_BOOL)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "output_datatype %" PRId64 " (%s) is not supported (fathom has float, double, float16, "
                               "bfloat16, int8, uint8, int32 and int64)", t, t == (int32_t)t ? onnx_dtype_name((int32_t)t) : "out of range");
    return FM_OK;
}

/* ---- HannWindow, HammingWindow, BlackmanWindow: w[i] of the generalized cosine window
 * over N = size (periodic) or size - 1 (symmetric). A symmetric window of one point is
 * [1], as torch, numpy and scipy give (the formula is 0/0 there). ---- */
typedef enum { WIN_HANN, WIN_HAMMING, WIN_BLACKMAN } win_kind;

static fm_status op_window(onnx_op_ctx *c, win_kind kind) {
    int64_t n;
    fm_dtype dt;
    bool periodic = true;
    if (length_in(c, 0, "the window size", 0, &n) || out_dtype(c, &dt) || bool_attr(c, "periodic", 1, &periodic)) return fm_last_status();
    fm_tensor *y = fm_tensor_empty(1, &n, FM_F64, FM_CPU);
    if (!y) return fm_last_status();
    double *d = fm_tensor_data(y);
    const double N = (double)(periodic ? n : n - 1);
    for (int64_t i = 0; i < n; i++) {
        const double t = N > 0 ? 2 * PI * (double)i / N : 0;
        if (kind == WIN_HANN) {
            const double s = N > 0 ? sin(PI * (double)i / N) : 1;
            d[i] = s * s;
        } else if (kind == WIN_HAMMING) d[i] = 25.0 / 46.0 - 21.0 / 46.0 * cos(t);
        else d[i] = 0.42 - 0.5 * cos(t) + 0.08 * cos(2 * t);
    }
    return onnx_set_out(c, 0, onnx_host_back(y, dt, dev_of(c->in[0])));
}
static fm_status op_hann(onnx_op_ctx *c) { return op_window(c, WIN_HANN); }
static fm_status op_hamming(onnx_op_ctx *c) { return op_window(c, WIN_HAMMING); }
static fm_status op_blackman(onnx_op_ctx *c) { return op_window(c, WIN_BLACKMAN); }

/* ---- the transform: y[k] = sum_j z[j] e^(sign 2 pi i j k / n), unnormalized, in place on
 * n interleaved (re, im) pairs ---- */
typedef struct dft_plan {
    int64_t n, m;  /* m: the power-of-two FFT length (n itself, or Bluestein's padding) */
    int sign;
    bool direct;
    double *tw;    /* power of two: the m/2 twiddles e^(sign 2 pi i k / m) (Bluestein: sign -1); direct: the n of length n */
    double *chirp; /* Bluestein: e^(sign pi i k^2 / n), k < n */
    double *bf;    /* Bluestein: the FFT of the conjugate chirp, wrapped to m */
    double *work;  /* 2 max(n, m) */
} dft_plan;

static void fft_pow2(double *z, int64_t m, const double *tw, bool conj) {
    for (int64_t i = 1, j = 0; i < m; i++) {
        int64_t bit = m >> 1;
        for (; j & bit; bit >>= 1) j ^= bit;
        j ^= bit;
        if (i < j) {
            double t0 = z[2 * i], t1 = z[2 * i + 1];
            z[2 * i] = z[2 * j], z[2 * i + 1] = z[2 * j + 1], z[2 * j] = t0, z[2 * j + 1] = t1;
        }
    }
    for (int64_t len = 2; len <= m; len <<= 1) {
        const int64_t half = len / 2, step = m / len;
        for (int64_t s = 0; s < m; s += len)
            for (int64_t k = 0; k < half; k++) {
                const double wr = tw[2 * k * step], wi = conj ? -tw[2 * k * step + 1] : tw[2 * k * step + 1];
                double *a = z + 2 * (s + k), *b = a + 2 * half;
                const double br = b[0] * wr - b[1] * wi, bi = b[0] * wi + b[1] * wr;
                b[0] = a[0] - br, b[1] = a[1] - bi;
                a[0] += br, a[1] += bi;
            }
    }
}

/* e^(sign 2 pi i k / len) for k < count, each from cos and sin (a recurrence's error would grow with k). */
static void twiddles(double *tw, int64_t count, int64_t len, int sign) {
    for (int64_t k = 0; k < count; k++) {
        const double a = 2 * PI * (double)k / (double)len;
        tw[2 * k] = cos(a), tw[2 * k + 1] = sign * sin(a);
    }
}

static void dft_plan_free(dft_plan *p) {
    free(p->tw), free(p->chirp), free(p->bf), free(p->work);
    memset(p, 0, sizeof *p);
}

static fm_status dft_plan_make(const onnx_op_ctx *c, dft_plan *p, int64_t n, int sign) {
    memset(p, 0, sizeof *p);
    p->n = n, p->sign = sign, p->m = 1;
    const bool pow2 = (n & (n - 1)) == 0;
    p->direct = !pow2 && n <= DFT_DIRECT_MAX;
    while (p->m < (pow2 ? n : 2 * n - 1)) p->m *= 2;
    if (p->direct) p->m = n;
    const int64_t m = p->m, big = m > n ? m : n;
    p->tw = malloc((size_t)(2 * big + 2) * sizeof(double));
    p->work = malloc((size_t)(2 * big + 2) * sizeof(double));
    if (!p->tw || !p->work) return dft_plan_free(p), oom(c);
    if (p->direct || pow2) {
        twiddles(p->tw, p->direct ? n : m / 2, n, sign);
        return FM_OK;
    }
    p->chirp = malloc((size_t)(2 * n) * sizeof(double));
    p->bf = calloc((size_t)(2 * m), sizeof(double));
    if (!p->chirp || !p->bf) return dft_plan_free(p), oom(c);
    twiddles(p->tw, m / 2, m, -1);
    for (int64_t k = 0; k < n; k++) {
        /* k^2 mod 2n keeps the angle small (the chirp's period in k^2 is 2n): k < 2^26 fits */
        const double a = PI * (double)((uint64_t)k * (uint64_t)k % (uint64_t)(2 * n)) / (double)n;
        p->chirp[2 * k] = cos(a), p->chirp[2 * k + 1] = sign * sin(a);
        p->bf[2 * k] = p->chirp[2 * k], p->bf[2 * k + 1] = -p->chirp[2 * k + 1];
        if (k) p->bf[2 * (m - k)] = p->bf[2 * k], p->bf[2 * (m - k) + 1] = p->bf[2 * k + 1];
    }
    fft_pow2(p->bf, m, p->tw, false);
    return FM_OK;
}

/* Bluestein: j k = (j^2 + k^2 - (k - j)^2) / 2 turns the sum into chirp[k] times the
 * convolution of z chirp with the conjugate chirp, done by FFTs of length m >= 2n - 1. */
static void dft_bluestein(const dft_plan *p, double *z) {
    const int64_t n = p->n, m = p->m;
    double *a = p->work;
    memset(a, 0, (size_t)(2 * m) * sizeof *a);
    for (int64_t j = 0; j < n; j++) {
        const double cr = p->chirp[2 * j], ci = p->chirp[2 * j + 1];
        a[2 * j] = z[2 * j] * cr - z[2 * j + 1] * ci, a[2 * j + 1] = z[2 * j] * ci + z[2 * j + 1] * cr;
    }
    fft_pow2(a, m, p->tw, false);
    for (int64_t j = 0; j < m; j++) {
        const double ar = a[2 * j], ai = a[2 * j + 1], br = p->bf[2 * j], bi = p->bf[2 * j + 1];
        a[2 * j] = ar * br - ai * bi, a[2 * j + 1] = ar * bi + ai * br;
    }
    fft_pow2(a, m, p->tw, true);
    for (int64_t k = 0; k < n; k++) {
        const double ar = a[2 * k] / (double)m, ai = a[2 * k + 1] / (double)m, cr = p->chirp[2 * k], ci = p->chirp[2 * k + 1];
        z[2 * k] = ar * cr - ai * ci, z[2 * k + 1] = ar * ci + ai * cr;
    }
}

static void dft_exec(const dft_plan *p, double *z) {
    const int64_t n = p->n;
    if (n == 1) return;
    if (!p->direct && p->m == n) {
        fft_pow2(z, n, p->tw, false);
        return;
    }
    if (!p->direct) {
        dft_bluestein(p, z);
        return;
    }
    double *o = p->work;
    for (int64_t k = 0; k < n; k++) {
        double re = 0, im = 0;
        for (int64_t j = 0, t = 0; j < n; j++, t = t + k >= n ? t + k - n : t + k) {
            re += z[2 * j] * p->tw[2 * t] - z[2 * j + 1] * p->tw[2 * t + 1];
            im += z[2 * j] * p->tw[2 * t + 1] + z[2 * j + 1] * p->tw[2 * t];
        }
        o[2 * k] = re, o[2 * k + 1] = im;
    }
    memcpy(z, o, (size_t)(2 * n) * sizeof *z);
}

/* ---- DFT ---- */
typedef struct dft_args {
    int axis, cin, cout;
    bool inverse, onesided;
    int64_t n, nout, outer, len, inner;
} dft_args;

/* The axis: attribute (opset 17, default 1) or input 2 (opset 20, default -2), in [-r, -2] or [0, r - 2]. */
static fm_status dft_axis(const onnx_op_ctx *c, int r, int *axis) {
    int64_t a = c->opset >= 20 ? -2 : onnx_attr_int(c, "axis", 1);
    if (c->opset >= 20 && onnx_attr(c, "axis"))
        return onnx_node_error(c, FM_ERR_INVALID, "attribute axis is opset 17's; from opset 20 the axis is input 2");
    if (c->opset < 20 && c->n_in > 2)
        return onnx_node_error(c, FM_ERR_INVALID, "has %d inputs; before opset 20 DFT takes input and dft_length only", c->n_in);
    if (opt_in(c, 2) && int_scalar(c, 2, &a)) return fm_last_status();
    if (a < -r || a > r - 2 || a == -1)
        return onnx_node_error(c, FM_ERR_INVALID, "axis %" PRId64 " is out of range for input 0 of rank %d: it must be in [-%d, -2] or [0, %d] "
                               "(the last dim holds the real and imaginary parts)", a, r, r, r - 2);
    *axis = (int)(a < 0 ? a + r : a);
    return FM_OK;
}

static fm_status dft_check(const onnx_op_ctx *c, dft_args *g) {
    const fm_tensor *x = c->in[0];
    const int r = x->ndim;
    char sh[96];
    fm_shape_str(r, x->shape, sh, sizeof sh);
    if (!fm_dtype_is_float(x->dtype))
        return onnx_node_error(c, FM_ERR_INVALID, "input 0 ('%s') has dtype %s; it must be float", in_name(c, 0), fm_dtype_name(x->dtype));
    if (r < 2 || (x->shape[r - 1] != 1 && x->shape[r - 1] != 2))
        return onnx_node_error(c, FM_ERR_INVALID, "input 0 ('%s') has shape %s; expected [..., signal dims, 1] (real) or [..., 2] (complex)",
                               in_name(c, 0), sh);
    memset(g, 0, sizeof *g);
    if (bool_attr(c, "inverse", 0, &g->inverse) || bool_attr(c, "onesided", 0, &g->onesided) || dft_axis(c, r, &g->axis))
        return fm_last_status();
    g->cin = (int)x->shape[r - 1], g->len = x->shape[g->axis], g->outer = 1, g->inner = 1;
    for (int d = 0; d < r - 1; d++)
        if (d != g->axis) *(d < g->axis ? &g->outer : &g->inner) *= x->shape[d];
    if (g->onesided && g->inverse != (g->cin == 2))
        return onnx_node_error(c, FM_ERR_INVALID, "onesided=1 with inverse=%d needs a %s input 0 ('%s'); its shape is %s", g->inverse,
                               g->inverse ? "complex ([..., 2])" : "real ([..., 1])", in_name(c, 0), sh);
    g->n = g->onesided && g->inverse ? 2 * (g->len - 1) : g->len;
    if (opt_in(c, 1)) {
        if (length_in(c, 1, "dft_length", 1, &g->n)) return fm_last_status();
    } else if (g->n < 1 || g->n > SIGNAL_MAX_LEN)
        return onnx_node_error(c, FM_ERR_INVALID, "input 0 ('%s') of shape %s gives a DFT length of %" PRId64 "; it must be in [1, %" PRId64 "]",
                               in_name(c, 0), sh, g->n, SIGNAL_MAX_LEN);
    g->nout = g->onesided && !g->inverse ? g->n / 2 + 1 : g->n;
    g->cout = g->onesided && g->inverse ? 1 : 2;
    return out_size(c, (double)g->outer * (double)g->inner * (double)g->nout * g->cout);
}

/* Row (o, i)'s signal into z (length n: cut or zero-padded). IRFFT: the one-sided bins made
 * into the full conjugate-symmetric spectrum, the imaginary parts of bin 0 and (even n) n/2
 * dropped, as numpy's irfft. */
static void dft_load(const dft_args *g, const double *x, int64_t o, int64_t i, double *z) {
    const int64_t n = g->n, have = g->onesided && g->inverse ? (g->len < n / 2 + 1 ? g->len : n / 2 + 1) : (g->len < n ? g->len : n);
    memset(z, 0, (size_t)(2 * n) * sizeof *z);
    for (int64_t j = 0; j < have; j++) {
        const double *e = x + ((o * g->len + j) * g->inner + i) * g->cin;
        z[2 * j] = e[0], z[2 * j + 1] = g->cin == 2 ? e[1] : 0;
    }
    if (!(g->onesided && g->inverse)) return;
    z[1] = 0;
    if (n % 2 == 0) z[n + 1] = 0;
    for (int64_t j = 1; j < (n + 1) / 2; j++) z[2 * (n - j)] = z[2 * j], z[2 * (n - j) + 1] = -z[2 * j + 1];
}

static fm_status op_dft(onnx_op_ctx *c) {
    dft_args g;
    if (dft_check(c, &g)) return fm_last_status();
    fm_tensor *x = c->in[0], *h = onnx_host(x, FM_F64), *y = NULL;
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[g.axis] = g.nout, shape[x->ndim - 1] = g.cout;
    dft_plan p = {0};
    double *z = h ? malloc((size_t)(2 * g.n) * sizeof *z) : NULL;
    fm_status st = !h ? fm_last_status() : !z ? oom(c) : dft_plan_make(c, &p, g.n, g.inverse ? 1 : -1);
    if (!st && !(y = fm_tensor_empty(x->ndim, shape, FM_F64, FM_CPU))) st = fm_last_status();
    const double scale = g.inverse ? 1.0 / (double)g.n : 1.0;
    for (int64_t o = 0; !st && o < g.outer; o++)
        for (int64_t i = 0; i < g.inner; i++) {
            dft_load(&g, fm_tensor_data(h), o, i, z);
            dft_exec(&p, z);
            double *yd = fm_tensor_data(y);
            for (int64_t k = 0; k < g.nout; k++) {
                double *e = yd + ((o * g.nout + k) * g.inner + i) * g.cout;
                e[0] = z[2 * k] * scale;
                if (g.cout == 2) e[1] = z[2 * k + 1] * scale;
            }
        }
    dft_plan_free(&p);
    free(z);
    fm_tensor_release(h);
    if (st) {
        fm_tensor_release(y);
        return st;
    }
    return onnx_set_out(c, 0, onnx_host_back(y, x->dtype, dev_of(x)));
}

/* ---- STFT: frame f is signal[f step, f step + frame_length) times the window (none:
 * ones), transformed; frames = 1 + (length - frame_length) / step; one-sided: the first
 * frame_length / 2 + 1 bins. ---- */
typedef struct stft_args { int64_t step, fl, frames, bins, batch, len; int cin; } stft_args;

static fm_status stft_check(const onnx_op_ctx *c, stft_args *a) {
    const fm_tensor *s = c->in[0], *w = opt_in(c, 2);
    char sh[96];
    fm_shape_str(s->ndim, s->shape, sh, sizeof sh);
    if (!fm_dtype_is_float(s->dtype) || s->ndim != 3 || (s->shape[2] != 1 && s->shape[2] != 2))
        return onnx_node_error(c, FM_ERR_INVALID, "input 0 ('%s') is %s of shape %s; expected a float [batch, length, 1] (real) or "
                               "[batch, length, 2] (complex)", in_name(c, 0), fm_dtype_name(s->dtype), sh);
    if (w && (!fm_dtype_is_float(w->dtype) || w->ndim != 1))
        return onnx_node_error(c, FM_ERR_INVALID, "input 2 ('%s'), the window, is %s of rank %d; expected a float [frame_length]",
                               in_name(c, 2), fm_dtype_name(w->dtype), w->ndim);
    bool onesided = true;
    if (length_in(c, 1, "frame_step", 1, &a->step) || bool_attr(c, "onesided", 1, &onesided)) return fm_last_status();
    a->batch = s->shape[0], a->len = s->shape[1], a->cin = (int)s->shape[2];
    a->fl = w ? w->shape[0] : a->len;
    if (opt_in(c, 3) && length_in(c, 3, "frame_length", 1, &a->fl)) return fm_last_status();
    if (w && w->shape[0] != a->fl)
        return onnx_node_error(c, FM_ERR_INVALID, "input 2 ('%s'), the window, has %" PRId64 " points; frame_length (input 3) is %" PRId64,
                               in_name(c, 2), w->shape[0], a->fl);
    if (a->fl < 1 || a->fl > a->len)
        return onnx_node_error(c, FM_ERR_INVALID, "frame length %" PRId64 " is not in [1, %" PRId64 "], the length of input 0 ('%s')", a->fl,
                               a->len, in_name(c, 0));
    if (onesided && a->cin == 2)
        return onnx_node_error(c, FM_ERR_INVALID, "onesided=1 needs a real input 0 ('%s'); its shape is %s (complex)", in_name(c, 0), sh);
    a->frames = 1 + (a->len - a->fl) / a->step;
    a->bins = onesided ? a->fl / 2 + 1 : a->fl;
    return out_size(c, (double)a->batch * (double)a->frames * (double)a->bins * 2);
}

static fm_status op_stft(onnx_op_ctx *c) {
    stft_args a;
    if (stft_check(c, &a)) return fm_last_status();
    fm_tensor *s = c->in[0], *sh = onnx_host(s, FM_F64), *wh = sh && opt_in(c, 2) ? onnx_host(c->in[2], FM_F64) : NULL, *y = NULL;
    const int64_t shape[4] = {a.batch, a.frames, a.bins, 2};
    dft_plan p = {0};
    double *z = sh ? malloc((size_t)(2 * a.fl) * sizeof *z) : NULL;
    fm_status st = !sh || (opt_in(c, 2) && !wh) ? fm_last_status() : !z ? oom(c) : dft_plan_make(c, &p, a.fl, -1);
    if (!st && !(y = fm_tensor_empty(4, shape, FM_F64, FM_CPU))) st = fm_last_status();
    for (int64_t b = 0; !st && b < a.batch; b++)
        for (int64_t f = 0; f < a.frames; f++) {
            const double *sd = (const double *)fm_tensor_data(sh) + (b * a.len + f * a.step) * a.cin, *w = wh ? fm_tensor_data(wh) : NULL;
            for (int64_t j = 0; j < a.fl; j++) {
                const double wj = w ? w[j] : 1;
                z[2 * j] = sd[j * a.cin] * wj, z[2 * j + 1] = a.cin == 2 ? sd[j * a.cin + 1] * wj : 0;
            }
            dft_exec(&p, z);
            memcpy((double *)fm_tensor_data(y) + (b * a.frames + f) * a.bins * 2, z, (size_t)(2 * a.bins) * sizeof *z);
        }
    dft_plan_free(&p);
    free(z);
    REL(sh, wh);
    if (st) {
        fm_tensor_release(y);
        return st;
    }
    return onnx_set_out(c, 0, onnx_host_back(y, s->dtype, dev_of(s)));
}

/* ---- MelWeightMatrix: [dft_length / 2 + 1, num_mel_bins] triangles of peak 1 between
 * num_mel_bins + 2 points spaced evenly on the mel scale, mel(f) = 2595 log10(1 + f / 700),
 * from lower_edge_hertz by (mel(upper) - mel(lower)) / (num_mel_bins + 2), each at DFT bin
 * floor((dft_length + 1) f / sample_rate): the spec's reference and ONNX Runtime's
 * construction. The edges are refused where a point falls outside the spectrum's bins. ---- */
static fm_status mel_bins(const onnx_op_ctx *c, int64_t nmel, int64_t dft, int64_t sr, int64_t *pts) {
    double lo, hi;
    if (float_scalar(c, 3, &lo) || float_scalar(c, 4, &hi)) return fm_last_status();
    const int64_t nspec = dft / 2 + 1;
    /* the mel edges in float, as both reference implementations compute them from float inputs */
    const double lo_mel = (float)(2595 * log10(1 + lo / 700)), hi_mel = (float)(2595 * log10(1 + hi / 700));
    const double step = (float)((hi_mel - lo_mel) / (double)(nmel + 2));
    for (int64_t i = 0; i < nmel + 2; i++) {
        const double hz = 700 * (pow(10, ((double)i * step + lo_mel) / 2595) - 1), b = floor((double)(dft + 1) * hz / (double)sr);
        if (!(b >= 0 && b < (double)nspec))
            return onnx_node_error(c, FM_ERR_INVALID, "lower_edge_hertz %g and upper_edge_hertz %g (inputs 3 and 4) put mel point %" PRId64 " at %g Hz, "
                                   "DFT bin %g, outside the %" PRId64 " bins of a %" PRId64 "-point DFT at sample_rate %" PRId64, lo, hi, i,
                                   hz, b, nspec, dft, sr);
        pts[i] = (int64_t)b;
    }
    return FM_OK;
}

static fm_status op_mel(onnx_op_ctx *c) {
    int64_t nmel, dft, sr;
    fm_dtype dt;
    if (length_in(c, 0, "num_mel_bins", 1, &nmel) || length_in(c, 1, "dft_length", 1, &dft) || int_scalar(c, 2, &sr) || out_dtype(c, &dt))
        return fm_last_status();
    if (sr < 1) return onnx_node_error(c, FM_ERR_INVALID, "input 2 ('%s'), sample_rate, is %" PRId64 "; it must be >= 1", in_name(c, 2), sr);
    const int64_t nspec = dft / 2 + 1, shape[2] = {nspec, nmel};
    if (nspec > SIGNAL_MAX_LEN / nmel)
        return onnx_node_error(c, FM_ERR_INVALID, "a [%" PRId64 ", %" PRId64 "] matrix is over the %" PRId64 " elements allowed", nspec, nmel,
                               SIGNAL_MAX_LEN);
    int64_t *pts = malloc((size_t)(nmel + 2) * sizeof *pts);
    if (!pts) return oom(c);
    fm_tensor *y = mel_bins(c, nmel, dft, sr, pts) ? NULL : fm_tensor_zeros(2, shape, FM_F64, FM_CPU);
    if (!y) {
        free(pts);
        return fm_last_status();
    }
    double *d = fm_tensor_data(y);
    for (int64_t i = 0; i < nmel; i++) {
        const int64_t l = pts[i], m = pts[i + 1], r = pts[i + 2];
        if (m == l) d[m * nmel + i] = 1;
        for (int64_t j = l; m > l && j <= m; j++) d[j * nmel + i] = (double)(j - l) / (double)(m - l);
        for (int64_t j = m; j < r; j++) d[j * nmel + i] = (double)(r - j) / (double)(r - m);
    }
    free(pts);
    return onnx_set_out(c, 0, onnx_host_back(y, dt, dev_of(c->in[0])));
}

const onnx_op onnx_ops_signal[] = {
    {"HannWindow", 17, 1, 1, 1, "periodic,output_datatype", op_hann},
    {"HammingWindow", 17, 1, 1, 1, "periodic,output_datatype", op_hamming},
    {"BlackmanWindow", 17, 1, 1, 1, "periodic,output_datatype", op_blackman},
    {"DFT", 17, 1, 3, 1, "axis,inverse,onesided", op_dft},
    {"STFT", 17, 2, 4, 1, "onesided", op_stft},
    {"MelWeightMatrix", 17, 5, 5, 1, "output_datatype", op_mel},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
