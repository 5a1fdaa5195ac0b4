/* Calibration for static int8 quantization: the graph runs on sample inputs
 * with the values to be quantized made extra outputs, and each value's range
 * is chosen by one of three methods:
 *   minmax      the smallest and largest value seen;
 *   percentile  the range holding the central p% of values (signed histogram,
 *               2048 bins over the min-max range, second pass);
 *   entropy     the clipping threshold T on |x| that minimizes the KL
 *               divergence between the histogram of |x| and its quantized copy
 *               (TensorRT's method; 2048 bins, 255 levels for non-negative
 *               values, 128 for signed ones); the range is [max(min, -T), min(max, T)]. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/ops.h"
#include "graph/graph_quant.h"
#include "graph/graph_rewrite.h"

#define NBINS 2048

typedef struct {
    float mn, mx;
    double *hist, *ahist; /* signed over [mn, mx], |x| over [0, max(|mn|, mx)] */
} vstat;

static fm_status check_calib(const fm_graph *g, const fm_tensor *x) {
    char a[128], b[160];
    if (g->n_inputs != 1)
        return fm_set_error(FM_ERR_INVALID, "quantize: static calibration needs a graph with one input (a classifier); this one has %d "
                            "(use --dynamic for a GPT)", g->n_inputs);
    const gvalue *in = &g->values[g->inputs[0]];
    if (!fm_dtype_is_float(in->t.dt))
        return fm_set_error(FM_ERR_INVALID, "quantize: the graph's input '%s' is %s, not a float tensor that can be calibrated (use --dynamic)",
                            in->name, fm_dtype_name(in->t.dt));
    if (!x || x->dtype != FM_F32 || fm_tensor_device(x).type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_INVALID, "quantize: calibration data must be f32 samples on the host, got %s", x ? fm_dtype_name(x->dtype) : "nothing");
    g_shape_text(g, in, b, sizeof b);
    bool ok = x->ndim == in->t.ndim && x->shape[0] > 0;
    for (int k = 1; ok && k < x->ndim; k++) ok = in->sym[k] >= 0 || x->shape[k] == in->t.d[k];
    if (!ok)
        return fm_set_error(FM_ERR_INVALID, "quantize: calibration data %s does not fit the graph's input '%s' %s (samples along dim 0, the rest as the input)",
                            fm_shape_str(x->ndim, x->shape, a, sizeof a), in->name, b);
    return FM_OK;
}

/* g with vals as extra outputs, so one run hands them all back */
static fm_graph *probe_graph(const fm_graph *g, int n, const int *vals) {
    rw r;
    fm_status st = rw_begin(&r, g);
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) st = rw_copy_node(&r, &g->nodes[i]);
    for (int i = 0; st == FM_OK && i < n; i++) {
        bool dup = g->values[vals[i]].is_output;
        for (int j = 0; j < i; j++) dup |= vals[j] == vals[i];
        if (!dup) st = fm_graph_add_output(r.dst, g->values[vals[i]].name);
    }
    return rw_end(&r, st);
}

/* Runs cg on every calibration batch; pass 0 takes ranges, pass 1 histograms. */
static fm_status sweep(const fm_graph *g, const fm_graph *cg, const fm_quant_options *o, int n, const int *vals, vstat *s, int pass) {
    const fm_tensor *x = o->calib;
    const int64_t S = x->shape[0], B = o->batch > 0 ? o->batch : 64;
    const char *in_name = g->values[g->inputs[0]].name, **names = malloc(sizeof *names * (size_t)n);
    fm_tensor **outs = calloc((size_t)n, sizeof *outs);
    fm_status st = names && outs ? FM_OK : fm_set_error(FM_ERR_OOM, "quantize: out of host memory");
    for (int i = 0; st == FM_OK && i < n; i++) names[i] = g->values[vals[i]].name;
    for (int64_t b0 = 0; st == FM_OK && b0 < S; b0 += B) {
        fm_tensor *v = fm_slice((fm_tensor *)x, 0, b0, b0 + B < S ? b0 + B : S, 1), *xb = v ? fm_contiguous(v) : NULL;
        st = xb ? fm_graph_run_named(cg, 1, &in_name, &xb, n, names, outs) : fm_last_status();
        fm_tensor_release_n(2, v, xb);
        for (int i = 0; st == FM_OK && i < n; i++) {
            fm_tensor *t = fm_contiguous(outs[i]);
            if (!t) { st = fm_last_status(); break; }
            const float *p = fm_tensor_data(t);
            const int64_t m = fm_tensor_numel(t);
            vstat *q = &s[i];
            if (pass == 0) {
                for (int64_t k = 0; k < m; k++) { q->mn = fminf(q->mn, p[k]); q->mx = fmaxf(q->mx, p[k]); }
            } else {
                double w = q->mx > q->mn ? NBINS / ((double)q->mx - q->mn) : 0, a = fmax(-(double)q->mn, q->mx), wa = a > 0 ? NBINS / a : 0;
                for (int64_t k = 0; k < m; k++) {
                    int64_t bi = (int64_t)((p[k] - (double)q->mn) * w), ai = (int64_t)(fabs((double)p[k]) * wa);
                    q->hist[bi < 0 ? 0 : bi >= NBINS ? NBINS - 1 : bi] += 1;
                    q->ahist[ai < 0 ? 0 : ai >= NBINS ? NBINS - 1 : ai] += 1;
                }
            }
            fm_tensor_release(t);
        }
        for (int i = 0; i < n; i++) { fm_tensor_release(outs[i]); outs[i] = NULL; }
    }
    free(names);
    free(outs);
    return st;
}

static void percentile_range(const vstat *s, double pct, float *lo, float *hi) {
    double total = 0, tail = 0, w = ((double)s->mx - s->mn) / NBINS;
    for (int b = 0; b < NBINS; b++) total += s->hist[b];
    double cut = total * (1 - pct / 100) / 2;
    int a = 0, z = NBINS - 1;
    for (tail = 0; a < NBINS - 1 && tail + s->hist[a] <= cut; a++) tail += s->hist[a];
    for (tail = 0; z > a && tail + s->hist[z] <= cut; z--) tail += s->hist[z];
    *lo = (float)(s->mn + w * a);
    *hi = (float)(s->mn + w * (z + 1));
}

/* KL(P || Q) of the first i bins (outliers folded into bin i-1) against P merged into `levels` bins */
static double kl_at(const double *h, int i, int levels, double *P) {
    double out = 0;
    for (int b = i; b < NBINS; b++) out += h[b];
    memcpy(P, h, sizeof *P * (size_t)i);
    P[i - 1] += out;
    double kl = 0, sp = 0, sq = 0;
    for (int b = 0; b < i; b++) { sp += P[b]; sq += h[b]; }
    if (sp <= 0 || sq <= 0) return INFINITY;
    for (int l = 0; l < levels; l++) {
        int b0 = (int)((int64_t)l * i / levels), b1 = (int)((int64_t)(l + 1) * i / levels);
        double sum = 0;
        int nz = 0;
        for (int b = b0; b < b1; b++) { sum += h[b]; nz += h[b] > 0; }
        for (int b = b0; b < b1; b++) {
            if (P[b] <= 0) continue;
            double q = h[b] > 0 && nz ? sum / nz : 1e-12; /* the folded outliers may land where Q has nothing */
            kl += P[b] / sp * log((P[b] / sp) / (q / sq + 1e-30)); /* each normalized by its own total */
        }
    }
    return kl;
}

static fm_status entropy_range(const vstat *s, float *lo, float *hi) {
    const int levels = s->mn >= 0 ? 255 : 128;
    double a = fmax(-(double)s->mn, s->mx), *P = malloc(sizeof *P * NBINS), best = INFINITY;
    if (!P) return fm_set_error(FM_ERR_OOM, "quantize: out of host memory");
    int bi = NBINS;
    for (int i = levels; i <= NBINS; i += 8) {
        double kl = kl_at(s->ahist, i, levels, P);
        if (kl < best) { best = kl; bi = i; }
    }
    free(P);
    double T = a * bi / NBINS;
    *lo = (float)fmax(s->mn, -T);
    *hi = (float)fmin(s->mx, T);
    return FM_OK;
}

fm_status g_calibrate(const fm_graph *g, const fm_quant_options *o, int n, const int *vals, float *lo, float *hi) {
    if (check_calib(g, o->calib)) return fm_last_status();
    if (n == 0) return FM_OK;
    fm_graph *cg = probe_graph(g, n, vals);
    vstat *s = calloc((size_t)n, sizeof *s);
    fm_status st = cg && s ? FM_OK : fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_OOM, "quantize: out of host memory");
    for (int i = 0; st == FM_OK && i < n; i++) { s[i].mn = INFINITY; s[i].mx = -INFINITY; }
    if (st == FM_OK) st = sweep(g, cg, o, n, vals, s, 0);
    for (int i = 0; st == FM_OK && i < n; i++) {
        if (!isfinite(s[i].mn) || !isfinite(s[i].mx))
            st = fm_set_error(FM_ERR_INVALID, "quantize: value '%s' is not finite on the calibration data", g->values[vals[i]].name);
        lo[i] = s[i].mn;
        hi[i] = s[i].mx;
    }
    if (st == FM_OK && o->method != FM_CALIB_MINMAX) {
        for (int i = 0; st == FM_OK && i < n; i++) {
            s[i].hist = calloc(NBINS, sizeof(double));
            s[i].ahist = calloc(NBINS, sizeof(double));
            if (!s[i].hist || !s[i].ahist) st = fm_set_error(FM_ERR_OOM, "quantize: out of host memory");
        }
        if (st == FM_OK) st = sweep(g, cg, o, n, vals, s, 1);
        for (int i = 0; st == FM_OK && i < n; i++) {
            if (o->method == FM_CALIB_PERCENTILE) percentile_range(&s[i], o->percentile > 0 ? o->percentile : 99.99, &lo[i], &hi[i]);
            else st = entropy_range(&s[i], &lo[i], &hi[i]);
        }
    }
    for (int i = 0; s && i < n; i++) { free(s[i].hist); free(s[i].ahist); }
    free(s);
    fm_graph_free(cg);
    return st;
}
