/* fm_gpt_sample against a reference that sorts with qsort and the comparison the
 * sampler is specified by (descending logit, ties by ascending index, -0 == +0):
 * the same token for every draw, over logits with many ties, signed zeros,
 * infinities, very small and very large vocabularies, and every combination of
 * temperature, top-k and top-p. The sampler's own selection must reproduce that
 * order exactly, or a seed would give different text than before. Then GPT-2's
 * vocabulary (50257) with GPT-like logits, a flat distribution, masked (-inf)
 * logits and top_k around V/8, which take each of the sampler's paths (heap
 * selection, the mass histogram, its fall-back to the full sort, the full sort). */
#include <math.h>
#include <stdlib.h>

#include "gpt_sample_ref.h"
#include "test_util.h"

static int cmp_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i - y->i;
}

/* s: the logits in the specified order (sorted once, drawn from many times) */
static int ref_sample_sorted(const scored *s, int V, const fm_gpt_sample_params *p, uint64_t draw) {
    double *pr = malloc(sizeof *pr * (size_t)V);
    if (!pr) return -1;
    int tok = ref_sample_in_order(s, V, p, draw, pr);
    free(pr);
    return tok;
}

static scored *ref_sort(const float *logits, int V) {
    scored *s = malloc(sizeof *s * (size_t)V);
    for (int i = 0; i < V; i++) { s[i].v = logits[i]; s[i].i = i; }
    qsort(s, (size_t)V, sizeof *s, cmp_desc);
    return s;
}

static int ref_sample(const float *logits, int V, const fm_gpt_sample_params *p, uint64_t draw) {
    if (!(p->temperature > 0)) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    scored *s = ref_sort(logits, V);
    int tok = ref_sample_sorted(s, V, p, draw);
    free(s);
    return tok;
}

static uint64_t rs = 12345;
static double urand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) / 9007199254740992.0;
}

/* kind 0: continuous; 1: few distinct values (many ties); 2: ties, signed zeros and infinities */
static void fill(float *lg, int V, int kind) {
    for (int i = 0; i < V; i++) {
        double u = urand();
        if (kind == 0) lg[i] = (float)(8.0 * u - 4.0);
        else if (kind == 1) lg[i] = (float)floor(4.0 * u) * 0.5f;
        else {
            int c = (int)(7.0 * u);
            const float vals[7] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, INFINITY, -INFINITY};
            lg[i] = vals[c];
        }
    }
    if (kind == 2 && V > 2) { lg[0] = -0.0f; lg[1] = 0.0f; } /* equal: the lower index must come first */
}

/* kind 0: Gaussian (sd 2.5) with a few tokens far above; 1: flat (every logit within
 * 0.01); 2: kind 0 with three quarters masked to -inf; 3: a peaked one (most mass on
 * a handful, the rest over 30 nats below) */
static void fill_large(float *lg, int V, int kind) {
    for (int i = 0; i < V; i++) {
        double g = sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand());
        lg[i] = kind == 1 ? (float)(0.01 * urand()) : kind == 3 ? (float)(-40.0 + g) : (float)(2.5 * g);
        if (kind == 2 && i % 4) lg[i] = -INFINITY;
    }
    if (kind != 1)
        for (int j = 0; j < 6; j++) lg[(int)(urand() * V) & ~3] = (float)(8.0 + 4.0 * urand());
}

static void large_vocab(void) {
    const int V = 50257;
    const struct { double T; int k; double p; } modes[] = {
        {0.8, 40, 1.0}, {0.8, 40, 0.95}, {0.8, 0, 0.95}, {1.0, 0, 0.5}, {1.0, 0, 1.0}, {1.5, 0, 0.99},
        {1.0, V / 8, 1.0}, {1.0, V / 8 + 1, 0.9}, {1.0, 6000, 1.0}, {0.7, 1, 1.0}, {1.0, 0, 1e-6},
    };
    float *lg = malloc(sizeof(float) * (size_t)V);
    int mismatches = 0, cases = 0, distinct = 0, last = -1;
    for (int kind = 0; kind < 4; kind++)
        for (int rep = 0; rep < 2; rep++) {
            fill_large(lg, V, kind);
            scored *s = ref_sort(lg, V);
            for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
                for (uint64_t d = 0; d < 12; d++) {
                    fm_gpt_sample_params sp = {modes[mi].T, modes[mi].k, modes[mi].p, 1000 + d * 7 + (uint64_t)kind};
                    int a = fm_gpt_sample(lg, V, &sp, d * 31 + mi), b = ref_sample_sorted(s, V, &sp, d * 31 + mi);
                    cases++;
                    if (a != b && mismatches++ < 5)
                        fprintf(stderr, "V %d kind %d T %g k %d p %g draw %llu: %d vs reference %d\n", V, kind,
                                modes[mi].T, modes[mi].k, modes[mi].p, (unsigned long long)(d * 31 + mi), a, b);
                    distinct += a != last;
                    last = a;
                }
            free(s);
        }
    free(lg);
    CHECK_MSG(mismatches == 0, "vocab 50257: %d of %d draws differ from the reference", mismatches, cases);
    CHECK(distinct > cases / 2);
}

int main(void) {
    const int Vs[] = {1, 2, 3, 17, 256, 512, 5000};
    const double temps[] = {0.0, 0.5, 1.0, 2.0};
    const int topks[] = {0, 1, 3, 40};
    const double topps[] = {1.0, 0.9, 0.3};
    int mismatches = 0, cases = 0, distinct_from_first = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        int V = Vs[vi];
        float *lg = malloc(sizeof(float) * (size_t)V);
        for (int kind = 0; kind < 3; kind++) {
            fill(lg, V, kind);
            if (kind == 2) /* infinities make exp() NaN in both; keep one finite case with inf removed too */
                for (int i = 0; i < V; i++) if (isinf(lg[i]) && (i & 1)) lg[i] = 2.0f;
            for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++)
                for (size_t ki = 0; ki < sizeof topks / sizeof topks[0]; ki++)
                    for (size_t pi = 0; pi < sizeof topps / sizeof topps[0]; pi++)
                        for (uint64_t d = 0; d < 6; d++) {
                            fm_gpt_sample_params sp = {temps[ti], topks[ki], topps[pi], 7 + d};
                            int a = fm_gpt_sample(lg, V, &sp, d), b = ref_sample(lg, V, &sp, d);
                            cases++;
                            if (a != b) {
                                if (mismatches++ < 5)
                                    fprintf(stderr, "V %d kind %d T %g k %d p %g draw %llu: %d vs reference %d\n", V,
                                            kind, temps[ti], topks[ki], topps[pi], (unsigned long long)d, a, b);
                            }
                            if (a != 0) distinct_from_first++;
                        }
        }
        free(lg);
    }
    CHECK_MSG(mismatches == 0, "%d of %d draws differ from the reference", mismatches, cases);
    CHECK(distinct_from_first > cases / 4); /* the draws really spread over tokens */
    large_vocab();
    /* NaN logits: still a valid id, deterministically */
    float nanl[4] = {1.0f, NAN, 0.5f, NAN};
    fm_gpt_sample_params sp = {1.0, 0, 1.0, 3};
    int t1 = fm_gpt_sample(nanl, 4, &sp, 0), t2 = fm_gpt_sample(nanl, 4, &sp, 0);
    CHECK(t1 >= 0 && t1 < 4 && t1 == t2);
    CHECK(fm_gpt_sample(nanl, 0, &sp, 0) == -1);
    TEST_DONE();
}
