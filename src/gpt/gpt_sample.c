/* Sampling one token from logits (fm_gpt_sample, gpt.h).
 *
 * What a draw means (unchanged since the first sampler): the candidates in
 * descending logit order (ties by ascending index, -0 equal to +0, NaN last), the
 * first top_k of them, their softmax at the temperature, the smallest prefix whose
 * mass reaches top_p (renormalised), and the first candidate whose cumulative mass
 * passes u = Philox(seed, draw). The random number for draw i is Philox(seed, i):
 * the sequence of samples depends only on the seed and the logits.
 *
 * How it is found without sorting the vocabulary:
 * - top_k (up to V/8): a bounded max-heap keeps the k best keys in one pass over
 *   the logits (an element enters only if it beats the heap's worst, which for
 *   k << V is rare), then the k are sorted. Everything after that is the same
 *   arithmetic in the same order as a full sort would give, so ids are bitwise
 *   those of the full-sort sampler.
 * - no top_k: one pass computes every exp() and the normaliser, and a histogram
 *   of the mass in bins of 1/4 nat below the maximum; the bins up to the one where
 *   the cumulative mass reaches top_p (or, without top_p, the draw u) plus one more
 *   for rounding hold the candidates the walk can reach. Only those are sorted.
 *   When the walk does not end inside them (rounding), or they are over half the
 *   vocabulary (a flat distribution), every candidate is sorted, as before.
 *   The normaliser is summed in index order rather than sorted order, so it can
 *   differ from the full-sort sampler's in the last bits: a draw whose u lies within
 *   about 1e-13 (relative) of a boundary between two tokens could pick the
 *   neighbour. tests/test_gpt_sample.c compares every mode against a qsort
 *   reference of the original algorithm (no difference seen).
 * - NaN or +inf logits, a temperature that overflows the maximum, or a large top_k:
 *   the full sort. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/gpt.h"
#include "fathom/tensor.h"

#define NEED_MORE (-2)
#define BINS 128      /* histogram bins below the maximum */
#define BINS_PER_NAT 4 /* bin width 1/4 nat: the last bin holds everything 31.75 nats or more below */

/* A key whose ascending order is the logits' descending order, -0 equal to +0
 * and NaN last; the index in the low half breaks ties (ascending). */
static inline uint64_t sort_key(const float *lg, int i) {
    float v = lg[i];
    uint32_t u;
    if (v != v) {
        u = UINT32_MAX;
    } else {
        if (v == 0) v = 0.0f;
        memcpy(&u, &v, sizeof u);
        u = ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
    }
    return (uint64_t)u << 32 | (uint32_t)i;
}

static inline int key_index(uint64_t k) { return (int)(uint32_t)k; }

/* k[0..n) ascending; tmp: scratch of n. LSD radix on bytes, skipping a byte every key shares. */
static void sort_keys(uint64_t *k, int n, uint64_t *tmp) {
    if (n < 48) {
        for (int i = 1; i < n; i++) {
            uint64_t x = k[i];
            int j = i;
            for (; j > 0 && k[j - 1] > x; j--) k[j] = k[j - 1];
            k[j] = x;
        }
        return;
    }
    uint64_t *src = k, *dst = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        int count[257] = {0};
        for (int i = 0; i < n; i++) count[((src[i] >> shift) & 255) + 1]++;
        if (count[((src[0] >> shift) & 255) + 1] == n) continue;
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (int i = 0; i < n; i++) dst[count[(src[i] >> shift) & 255]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != k) memcpy(k, src, sizeof *k * (size_t)n);
}

static void sift_down(uint64_t *h, int n, int i) { /* max-heap */
    uint64_t x = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] > h[c]) c++;
        if (h[c] <= x) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/* The k smallest keys of the logits (the k best candidates), ascending, in h[0..k). */
static void select_best(const float *lg, int V, int k, uint64_t *h) {
    for (int i = 0; i < k; i++) h[i] = sort_key(lg, i);
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    /* an element enters only if it beats the worst kept (the root): a larger value,
     * since an equal one has a larger index; while the root is NaN, anything not NaN */
    bool root_nan = (h[0] >> 32) == UINT32_MAX;
    float worst = root_nan ? 0.0f : lg[key_index(h[0])];
    for (int i = k; i < V; i++) {
        if (!root_nan && !(lg[i] > worst)) continue;
        uint64_t key = sort_key(lg, i);
        if (key < h[0]) {
            h[0] = key;
            sift_down(h, k, 0);
            root_nan = (h[0] >> 32) == UINT32_MAX;
            worst = root_nan ? 0.0f : lg[key_index(h[0])];
        }
    }
    for (int n = k; n > 1; n--) { /* heap sort: the largest goes to the end */
        uint64_t t = h[0];
        h[0] = h[n - 1];
        h[n - 1] = t;
        sift_down(h, n - 1, 0);
    }
}

/* The sampler's arithmetic over the first m candidates in order (keys). complete:
 * they are all the candidates (top_k or V), and the normaliser is their sum in this
 * order; otherwise z is the normaliser over all V and the walk must end inside the
 * m, else NEED_MORE. e (may be NULL): exp(logit / T - max / T) by index. pr: m doubles. */
static int walk(const float *lg, const uint64_t *keys, int m, bool complete, double z, const double *e, double *pr,
                const fm_gpt_sample_params *p, double u) {
    const double T = p->temperature;
    if (complete) {
        double mx = lg[key_index(keys[0])] / T;
        z = 0;
        for (int i = 0; i < m; i++) {
            int ix = key_index(keys[i]);
            pr[i] = e ? e[ix] : exp(lg[ix] / T - mx);
            z += pr[i];
        }
    } else {
        for (int i = 0; i < m; i++) pr[i] = e[key_index(keys[i])];
    }
    for (int i = 0; i < m; i++) pr[i] /= z;
    int n = m;
    bool cut = p->top_p > 0 && p->top_p < 1;
    if (cut) { /* smallest prefix whose mass reaches top_p */
        double c = 0;
        int k = 0;
        bool reached = false;
        while (k < m) {
            c += pr[k++];
            if (c >= p->top_p) { reached = true; break; }
        }
        if (!reached && !complete) return NEED_MORE;
        n = k;
        double z2 = 0;
        for (int i = 0; i < n; i++) z2 += pr[i];
        for (int i = 0; i < n; i++) pr[i] /= z2;
    }
    double c = 0;
    for (int i = 0; i < n; i++) {
        c += pr[i];
        if (u < c) return key_index(keys[i]);
    }
    if (!complete && !cut) return NEED_MORE;
    return key_index(keys[n - 1]);
}

/* Every key sorted; the first n are the candidates. e as in walk. */
static int sample_sorted(const float *lg, int V, int n, const double *e, const fm_gpt_sample_params *p, double u) {
    uint64_t *keys = malloc(sizeof *keys * (size_t)V * 2);
    double *pr = malloc(sizeof *pr * (size_t)n);
    int tok = -1;
    if (keys && pr) {
        for (int i = 0; i < V; i++) keys[i] = sort_key(lg, i);
        sort_keys(keys, V, keys + V);
        tok = walk(lg, keys, n, true, 0, e, pr, p, u);
    }
    free(keys);
    free(pr);
    return tok;
}

static int sample_top_k(const float *lg, int V, int k, const fm_gpt_sample_params *p, double u) {
    uint64_t *keys = malloc(sizeof *keys * (size_t)k);
    double *pr = malloc(sizeof *pr * (size_t)k);
    int tok = -1;
    if (keys && pr) {
        select_best(lg, V, k, keys);
        tok = walk(lg, keys, k, true, 0, NULL, pr, p, u);
    }
    free(keys);
    free(pr);
    return tok;
}

/* e[i] = exp(lg[i] / T - mx) for logits at or below the maximum (mx = max / T), written
 * here rather than with libm's exp so that the loop vectorizes: Cody-Waite reduction
 * x = n ln2 + r (|r| <= ln2 / 2), exp(r) by its Taylor series to r^13 (truncation under
 * 1e-17 relative), 2^n added to the exponent bits; arguments below -708 (e < 1e-307,
 * nothing a draw can reach) are taken as -708. Only additions, multiplications and one
 * division per element, in a fixed order, and this file is compiled without
 * floating-point contraction (CMakeLists.txt), so every clone below gives the same
 * bits as the plain one and as another CPU. At a 512-token vocabulary libm's exp was
 * most of a draw's 5 us. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void exp_shifted(const float *lg, int V, double T, double mx, double *e) {
    const double log2e = 1.4426950408889634, ln2_hi = 0.6931471803691238, ln2_lo = 1.9082149292705877e-10;
    const double shifter = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
    for (int i = 0; i < V; i++) {
        double x = lg[i] / T - mx;
        x = x < -708.0 ? -708.0 : x;
        const double t = x * log2e + shifter, n = t - shifter;
        const double r = (x - n * ln2_hi) - n * ln2_lo;
        double q = 1.0 / 6227020800.0;
        q = q * r + 1.0 / 479001600.0;
        q = q * r + 1.0 / 39916800.0;
        q = q * r + 1.0 / 3628800.0;
        q = q * r + 1.0 / 362880.0;
        q = q * r + 1.0 / 40320.0;
        q = q * r + 1.0 / 5040.0;
        q = q * r + 1.0 / 720.0;
        q = q * r + 1.0 / 120.0;
        q = q * r + 1.0 / 24.0;
        q = q * r + 1.0 / 6.0;
        q = q * r + 0.5;
        q = q * r + 1.0;
        q = q * r + 1.0;
        uint64_t tb, qb;
        memcpy(&tb, &t, sizeof tb);
        memcpy(&qb, &q, sizeof qb);
        qb += tb << 52; /* n (the low bits of t) onto the exponent: 2^n * q */
        memcpy(&e[i], &qb, sizeof qb);
    }
}

/* No top_k: every exp once, a histogram of the mass below the maximum, and only
 * the candidates in the bins the walk can reach sorted (see the top of the file). */
static int sample_threshold(const float *lg, int V, const fm_gpt_sample_params *p, double u) {
    float best = -INFINITY;
    for (int i = 0; i < V; i++) {
        float v = lg[i];
        if (v != v || v == INFINITY) return sample_sorted(lg, V, V, NULL, p, u);
        if (v > best) best = v;
    }
    const double T = p->temperature, mx = best / T;
    if (!isfinite(mx)) return sample_sorted(lg, V, V, NULL, p, u);
    double *e = malloc(sizeof *e * (size_t)V);
    unsigned char *bin = malloc((size_t)V);
    uint64_t *keys = NULL;
    double *pr = NULL;
    int tok = -1;
    if (!e || !bin) goto done;
    double mass[BINS] = {0}, z = 0;
    int count[BINS] = {0};
    exp_shifted(lg, V, T, mx, e);
    for (int i = 0; i < V; i++) {
        double x = lg[i] / T - mx; /* <= 0 */
        double ei = e[i];
        int b = x > -(double)BINS / BINS_PER_NAT ? (int)(-x * BINS_PER_NAT) : BINS - 1;
        if (b > BINS - 1) b = BINS - 1;
        z += ei;
        bin[i] = (unsigned char)b;
        mass[b] += ei;
        count[b]++;
    }
    bool cut = p->top_p > 0 && p->top_p < 1;
    double target = (cut ? p->top_p : u) * z * (1 + 1e-9), cum = 0;
    int last = 0;
    while (last < BINS - 1 && (cum += mass[last]) < target) last++;
    if (last < BINS - 1) last++; /* one bin more, for rounding */
    int m = 0;
    for (int b = 0; b <= last; b++) m += count[b];
    if (m <= V / 2) {
        keys = malloc(sizeof *keys * (size_t)m * 2);
        pr = malloc(sizeof *pr * (size_t)m);
        if (!keys || !pr) goto done;
        for (int i = 0, j = 0; i < V; i++)
            if (bin[i] <= last) keys[j++] = sort_key(lg, i);
        sort_keys(keys, m, keys + m);
        tok = walk(lg, keys, m, m == V, z, e, pr, p, u);
        if (tok != NEED_MORE) goto done;
    }
    tok = sample_sorted(lg, V, V, e, p, u);
done:
    free(e);
    free(bin);
    free(keys);
    free(pr);
    return tok;
}

int fm_gpt_sample(const float *logits, int V, const fm_gpt_sample_params *p, uint64_t draw) {
    if (V < 1) return -1;
    if (!(p->temperature > 0)) { /* greedy */
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    uint32_t r[4];
    fm_philox4x32(p->seed, 0x67656e65ull, draw, r);
    double u = (double)(((uint64_t)r[0] << 21) ^ r[1]) / 9007199254740992.0; /* 53 bits */
    u = fmod(u, 1.0);
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    if (k < V && k <= V / 8) return sample_top_k(logits, V, k, p, u);
    if (k < V) return sample_sorted(logits, V, k, NULL, p, u);
    return sample_threshold(logits, V, p, u);
}
