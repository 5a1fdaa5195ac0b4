/* fm_gpt_sample against a reference that sorts with qsort and the comparison the
 * sampler is specified by (descending logit, ties by ascending index, -0 == +0):
 * the same token for every draw, over logits with many ties, signed zeros,
 * infinities, very small and very large vocabularies, and every combination of
 * temperature, top-k and top-p. The sampler's own sort must reproduce that order
 * exactly, or a seed would give different text than before. */
#include <math.h>
#include <stdlib.h>

#include "fathom/gpt.h"
#include "fathom/tensor.h"
#include "test_util.h"

typedef struct { float v; int i; } scored;

static int cmp_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i - y->i;
}

static int ref_sample(const float *logits, int V, const fm_gpt_sample_params *p, uint64_t draw) {
    if (!(p->temperature > 0)) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    scored *s = malloc(sizeof *s * (size_t)V);
    double *pr = malloc(sizeof *pr * (size_t)V);
    for (int i = 0; i < V; i++) { s[i].v = logits[i]; s[i].i = i; }
    qsort(s, (size_t)V, sizeof *s, cmp_desc);
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double mx = s[0].v / p->temperature, z = 0;
    for (int i = 0; i < n; i++) { pr[i] = exp(s[i].v / p->temperature - mx); z += pr[i]; }
    for (int i = 0; i < n; i++) pr[i] /= z;
    if (p->top_p > 0 && p->top_p < 1) {
        double c = 0;
        int k = 0;
        while (k < n) { c += pr[k++]; if (c >= p->top_p) break; }
        n = k;
        z = 0;
        for (int i = 0; i < n; i++) z += pr[i];
        for (int i = 0; i < n; i++) pr[i] /= z;
    }
    uint32_t r[4];
    fm_philox4x32(p->seed, 0x67656e65ull, draw, r);
    double u = (double)(((uint64_t)r[0] << 21) ^ r[1]) / 9007199254740992.0;
    u = fmod(u, 1.0);
    int tok = s[n - 1].i;
    double c = 0;
    for (int i = 0; i < n; i++) {
        c += pr[i];
        if (u < c) { tok = s[i].i; break; }
    }
    free(s);
    free(pr);
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
    /* NaN logits: still a valid id, deterministically */
    float nanl[4] = {1.0f, NAN, 0.5f, NAN};
    fm_gpt_sample_params sp = {1.0, 0, 1.0, 3};
    int t1 = fm_gpt_sample(nanl, 4, &sp, 0), t2 = fm_gpt_sample(nanl, 4, &sp, 0);
    CHECK(t1 >= 0 && t1 < 4 && t1 == t2);
    CHECK(fm_gpt_sample(nanl, 0, &sp, 0) == -1);
    TEST_DONE();
}
