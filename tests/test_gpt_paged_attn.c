/* One head of paged attention (src/gpt/gpt_paged_attn.h), the per-sequence part
 * of a batched decode step: the scalar, AVX2 and AVX-512 versions against a double
 * reference over head sizes that hit every tail (D % 8, D % 4 positions, and the
 * AVX-512 version's column groups of 1-4 zmm, its AVX2 fallback over 256), block
 * sizes 1-16 with the blocks scattered in the pool (a paged table's order),
 * 1-130 positions, and large score ranges (the softmax's max subtraction); and the
 * f16 versions (an f16 cache) against the reference on the same halves. */
#include <stdlib.h>

#include "core/cpu_features.h"
#include "fathom/tensor.h" /* fm_convert_f32_to_f16 */
#include "gpt/gpt_paged_attn.h"
#include "test_util.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) - 0.5);
}

static void reference(const fm_paged_head *a, double *out) {
    double *sc = malloc(sizeof(double) * (size_t)a->n), mx = -1e300, sum = 0;
    for (int64_t t = 0; t < a->n; t++) {
        const float *k = a->k[t / a->BT] + t % a->BT; /* keys transposed per block: [D][BT] */
        double s = 0;
        for (int e = 0; e < a->D; e++) s += (double)a->q[e] * k[(int64_t)e * a->BT];
        sc[t] = s * a->scale;
        if (sc[t] > mx) mx = sc[t];
    }
    for (int64_t t = 0; t < a->n; t++) sum += sc[t] = exp(sc[t] - mx);
    for (int e = 0; e < a->D; e++) {
        double o = 0;
        for (int64_t t = 0; t < a->n; t++) o += sc[t] / sum * a->v[t / a->BT][(t % a->BT) * a->D + e];
        out[e] = o;
    }
    free(sc);
}

static void check_case(int D, int BT, int64_t n, float qscale, double tol, uint64_t seed) {
    const int64_t nb = (n + BT - 1) / BT, pool_blocks = nb + 3;
    float *K = malloc(sizeof(float) * (size_t)(pool_blocks * BT * D)), *V = malloc(sizeof(float) * (size_t)(pool_blocks * BT * D));
    float *q = malloc(sizeof(float) * (size_t)D), *sc = malloc(sizeof(float) * (size_t)n);
    float *o = malloc(sizeof(float) * (size_t)D);
    double *ref = malloc(sizeof(double) * (size_t)D);
    const float **kb = malloc(sizeof *kb * (size_t)nb), **vb = malloc(sizeof *vb * (size_t)nb);
    if (!K || !V || !q || !sc || !o || !ref || !kb || !vb) { CHECK(!"out of memory"); goto done; }
    for (int64_t i = 0; i < pool_blocks * BT * D; i++) { K[i] = frand(&seed); V[i] = frand(&seed); }
    for (int e = 0; e < D; e++) q[e] = qscale * frand(&seed);
    for (int64_t b = 0; b < nb; b++) { /* blocks in a scattered order */
        int64_t at = (b * 5 + 2) % pool_blocks;
        kb[b] = K + at * BT * D;
        vb[b] = V + at * BT * D;
    }
    fm_paged_head a = {q, kb, vb, D, BT, n, 0.25f, sc, o, NULL, NULL};
    reference(&a, ref);
    void (*fns[3])(const fm_paged_head *) = {fm_paged_head_f32_scalar, fm_paged_head_f32_avx2, fm_paged_head_f32_avx512};
    const char *names[3] = {"scalar", "avx2", "avx512"};
    for (int f = 0; f < 3; f++) {
        if ((f == 1 && !fm_cpu_use_avx2()) || (f == 2 && !fm_cpu_use_avx512())) continue;
        fns[f](&a);
        double worst = 0;
        for (int e = 0; e < D; e++) {
            double d = fabs(o[e] - ref[e]);
            if (d > worst) worst = d;
        }
        /* outputs are convex combinations of values in [-0.5, 0.5]; with scores in the
         * hundreds a float score's rounding moves the weights more */
        CHECK_MSG(worst < tol, "%s D %d BT %d n %lld q x%g: max error %g", names[f], D, BT, (long long)n, qscale, worst);
    }
    /* the f16 versions: the same blocks rounded to f16, against the reference on the
     * rounded values (the f32 versions' bound: the rounding is in the data, not the sums) */
    {
        const size_t nel = (size_t)(pool_blocks * BT * D);
        uint16_t *Kh = malloc(2 * nel), *Vh = malloc(2 * nel);
        float *Kr = malloc(4 * nel), *Vr = malloc(4 * nel);
        const uint16_t **khb = malloc(sizeof *khb * (size_t)nb), **vhb = malloc(sizeof *vhb * (size_t)nb);
        const float **krb = malloc(sizeof *krb * (size_t)nb), **vrb = malloc(sizeof *vrb * (size_t)nb);
        if (Kh && Vh && Kr && Vr && khb && vhb && krb && vrb) {
            fm_convert_f32_to_f16(K, Kh, nel);
            fm_convert_f32_to_f16(V, Vh, nel);
            fm_convert_f16_to_f32(Kh, Kr, nel);
            fm_convert_f16_to_f32(Vh, Vr, nel);
            for (int64_t b = 0; b < nb; b++) {
                const size_t at = (size_t)(kb[b] - K);
                khb[b] = Kh + at, vhb[b] = Vh + at, krb[b] = Kr + at, vrb[b] = Vr + at;
            }
            fm_paged_head r = {q, krb, vrb, D, BT, n, 0.25f, sc, o, NULL, NULL}, h = {q, NULL, NULL, D, BT, n, 0.25f, sc, o, khb, vhb};
            reference(&r, ref);
            void (*hf[2])(const fm_paged_head *) = {fm_paged_head_f16_scalar, fm_paged_head_f16_avx2};
            for (int f = 0; f < 2; f++) {
                if (f == 1 && !fm_cpu_use_avx2()) continue;
                hf[f](&h);
                double worst = 0;
                for (int e = 0; e < D; e++) worst = fabs(o[e] - ref[e]) > worst ? fabs(o[e] - ref[e]) : worst;
                CHECK_MSG(worst < tol, "f16 %s D %d BT %d n %lld q x%g: max error %g", f ? "avx2" : "scalar", D, BT, (long long)n, qscale, worst);
            }
        } else {
            CHECK(!"out of memory");
        }
        free(Kh); free(Vh); free(Kr); free(Vr); free(khb); free(vhb); free(krb); free(vrb);
    }
done:
    free(K); free(V); free(q); free(sc); free(o); free(ref); free(kb); free(vb);
}

int main(void) {
    const int Ds[] = {1, 3, 7, 8, 9, 16, 31, 32, 33, 48, 64, 80, 100, 128, 256, 272};
    const int BTs[] = {1, 3, 4, 16};
    const int64_t ns[] = {1, 2, 3, 4, 5, 15, 16, 17, 33, 64, 130};
    uint64_t seed = 3;
    for (size_t i = 0; i < sizeof Ds / sizeof Ds[0]; i++)
        for (size_t j = 0; j < sizeof BTs / sizeof BTs[0]; j++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) check_case(Ds[i], BTs[j], ns[k], 1.0f, 2e-6, seed++);
    check_case(64, 16, 100, 400.0f, 1e-5, seed++); /* scores spanning hundreds: exp's range */
    check_case(32, 4, 37, -300.0f, 1e-5, seed++);
    if (!fm_cpu_use_avx2()) TEST_SKIP("the AVX2 version (FATHOM_ISA=scalar or no AVX2)");
    if (!fm_cpu_use_avx512()) TEST_SKIP("the AVX-512 version (FATHOM_ISA below avx512 or no AVX-512)");
    TEST_DONE();
}
