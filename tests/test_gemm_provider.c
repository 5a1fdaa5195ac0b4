/* The GEMM provider (src/backend/cpu/openblas_load.c, gemm_portable.c):
 * - the decision about OpenBLAS's core, fed made-up cores and CPUs;
 * - FATHOM_ISA parsing (fm_isa_choose), fed made-up levels;
 * - fm_cpu_gemm against a double reference (every transpose, beta, bias, and
 *   sizes that go through the thread split), whichever provider is loaded.
 * Run modes (ctest entries): no argument: the installed OpenBLAS as loaded;
 * "reload": OpenBLAS is first loaded with the generic Prescott core, as an old
 * OpenBLAS does on a CPU it does not know, and fathom must replace it;
 * "missing": FATHOM_OPENBLAS names no library, and GEMM must fall back to the
 * portable loops. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/openblas_load.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "test_util.h"

static void test_decide(void) {
    fm_cpu_features none = {0}, avx = {.avx = true}, avx2 = {.avx = true, .avx2 = true, .fma = true, .f16c = true};
    fm_cpu_features skx = avx2, cpx;
    skx.avx512f = skx.avx512dq = skx.avx512cd = skx.avx512bw = skx.avx512vl = true;
    cpx = skx;
    cpx.avx512_bf16 = true;
    const char *want;
    CHECK(fm_openblas_decide("Prescott", &skx, NULL, false, &want) == FM_OPENBLAS_RELOAD && !strcmp(want, "SkylakeX"));
    CHECK(fm_openblas_decide("Prescott", &cpx, NULL, false, &want) == FM_OPENBLAS_RELOAD && !strcmp(want, "Cooperlake"));
    CHECK(fm_openblas_decide("prescott", &avx2, "", false, &want) == FM_OPENBLAS_RELOAD && !strcmp(want, "Haswell"));
    CHECK(fm_openblas_decide("Nehalem", &avx, NULL, false, &want) == FM_OPENBLAS_RELOAD && !strcmp(want, "Sandybridge"));
    CHECK(fm_openblas_decide("Haswell", &skx, NULL, false, &want) == FM_OPENBLAS_RELOAD); /* AVX2 core, AVX-512 CPU */
    CHECK(fm_openblas_decide("Sandybridge", &avx2, NULL, false, &want) == FM_OPENBLAS_RELOAD);
    /* right already, or nothing better to ask for */
    CHECK(fm_openblas_decide("SkylakeX", &skx, NULL, false, &want) == FM_OPENBLAS_KEEP);
    CHECK(fm_openblas_decide("Cooperlake", &cpx, NULL, false, &want) == FM_OPENBLAS_KEEP);
    CHECK(fm_openblas_decide("SkylakeX", &cpx, NULL, false, &want) == FM_OPENBLAS_KEEP); /* same vector width */
    CHECK(fm_openblas_decide("Zen", &avx2, NULL, false, &want) == FM_OPENBLAS_KEEP);
    CHECK(fm_openblas_decide("Prescott", &none, NULL, false, &want) == FM_OPENBLAS_KEEP && !want);
    CHECK(fm_openblas_decide("SapphireRapids", &cpx, NULL, false, &want) == FM_OPENBLAS_KEEP);
    CHECK(fm_openblas_decide("GraniteRapidsX", &cpx, NULL, false, &want) == FM_OPENBLAS_KEEP); /* unknown: newer */
    CHECK(fm_openblas_decide(NULL, &cpx, NULL, false, &want) == FM_OPENBLAS_KEEP);
    /* cannot fix: the user's own setting, or loaded before fathom */
    CHECK(fm_openblas_decide("Prescott", &skx, "Prescott", false, &want) == FM_OPENBLAS_WARN_USER_SET);
    CHECK(fm_openblas_decide("Prescott", &skx, NULL, true, &want) == FM_OPENBLAS_WARN_PRELOADED);
    CHECK(fm_openblas_decide("SkylakeX", &skx, NULL, true, &want) == FM_OPENBLAS_KEEP);
    /* the level table */
    CHECK(fm_openblas_core_level("Prescott") == 0 && fm_openblas_core_level("Bulldozer") == 1);
    CHECK(fm_openblas_core_level("Zen") == 2 && fm_openblas_core_level("SKYLAKEX") == 3);
    CHECK(fm_openblas_core_level("neoversen1") == -1);
}

static void test_isa_choose(void) {
    fm_isa isa;
    char msg[256];
    fm_cpu_features none = {0}, avx2 = {.avx = true, .avx2 = true, .fma = true, .f16c = true}, skx = avx2;
    skx.avx512f = skx.avx512dq = skx.avx512bw = skx.avx512vl = true;
    CHECK(fm_isa_max_for(&none) == FM_ISA_SCALAR && fm_isa_max_for(&avx2) == FM_ISA_AVX2);
    CHECK(fm_isa_max_for(&skx) == FM_ISA_AVX512);
    fm_cpu_features no_f16c = avx2;
    no_f16c.f16c = false;
    CHECK(fm_isa_max_for(&no_f16c) == FM_ISA_SCALAR);
    fm_cpu_features no_vl = skx;
    no_vl.avx512vl = false; /* Knights Landing: AVX-512 F without VL/BW/DQ */
    CHECK(fm_isa_max_for(&no_vl) == FM_ISA_AVX2);
    fm_cpu_features spr = skx; /* AMX needs the tile data granted by the OS, and AVX512-BF16 */
    spr.avx512_bf16 = spr.amx_tile = spr.amx_bf16 = spr.amx_int8 = true;
    CHECK(fm_isa_max_for(&spr) == FM_ISA_AVX512);
    spr.amx_usable = true;
    CHECK(fm_isa_max_for(&spr) == FM_ISA_AMX);
    CHECK(fm_isa_choose("avx512", FM_ISA_AMX, &isa, msg, sizeof msg) && isa == FM_ISA_AVX512);
    CHECK(fm_isa_choose("amx", FM_ISA_AMX, &isa, msg, sizeof msg) && isa == FM_ISA_AMX);
    CHECK(!fm_isa_choose("amx", FM_ISA_AVX512, &isa, msg, sizeof msg));
    CHECK_MSG(strstr(msg, "lacks") && strstr(msg, "scalar, avx2, avx512") && !strstr(msg, "avx512, amx"), "%s", msg);
    spr.amx_usable = false; /* AMX in the CPU, the tile data not granted: the message names the OS */
    CHECK(!fm_isa_choose_for("amx", &spr, &isa, msg, sizeof msg));
    CHECK_MSG(strstr(msg, "lacks") && strstr(msg, "did not grant") && strstr(msg, "scalar, avx2, avx512"), "%s", msg);
    CHECK(!fm_isa_choose_for("amx", &skx, &isa, msg, sizeof msg)); /* no AMX at all: no such note */
    CHECK_MSG(strstr(msg, "lacks") && !strstr(msg, "did not grant"), "%s", msg);
    CHECK(fm_isa_choose_for("avx512", &spr, &isa, msg, sizeof msg) && isa == FM_ISA_AVX512);
    CHECK(fm_isa_choose(NULL, FM_ISA_AVX512, &isa, msg, sizeof msg) && isa == FM_ISA_AVX512);
    CHECK(fm_isa_choose("", FM_ISA_AVX2, &isa, msg, sizeof msg) && isa == FM_ISA_AVX2);
    CHECK(fm_isa_choose("scalar", FM_ISA_AVX512, &isa, msg, sizeof msg) && isa == FM_ISA_SCALAR);
    CHECK(fm_isa_choose("avx2", FM_ISA_AVX512, &isa, msg, sizeof msg) && isa == FM_ISA_AVX2);
    CHECK(fm_isa_choose("avx512", FM_ISA_AVX512, &isa, msg, sizeof msg) && isa == FM_ISA_AVX512);
    CHECK(!fm_isa_choose("avx512", FM_ISA_AVX2, &isa, msg, sizeof msg));
    CHECK_MSG(strstr(msg, "lacks") && strstr(msg, "scalar, avx2") && !strstr(msg, "avx2, avx512"), "%s", msg);
    CHECK(!fm_isa_choose("sse9", FM_ISA_AVX512, &isa, msg, sizeof msg));
    CHECK_MSG(strstr(msg, "names no level") && strstr(msg, "scalar, avx2, avx512, amx"), "%s", msg);
}

static double frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 40) / (double)(1ull << 24) - 0.5;
}

/* a GEMM entry as the tests call it: fm_cpu_gemm_bias, or one provider directly */
typedef void (*gemm_entry)(const fm_cpu_gemm_args *g, const void *bias);

/* one gemm call (NULL: fm_cpu_gemm(_bias)) in f32 or f64 against a double reference */
static void check_gemm_with(gemm_entry fn, fm_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double beta,
                            bool bias) {
    uint64_t s = (uint64_t)(M * 131 + N * 17 + K) * 2 + ta + 4 * tb;
    size_t es = dt == FM_F32 ? 4 : 8;
    int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb, nc = M * ldc;
    double *ra = malloc(sizeof(double) * (size_t)na), *rb = malloc(sizeof(double) * (size_t)nb);
    double *rc = malloc(sizeof(double) * (size_t)nc), *rbias = malloc(sizeof(double) * (size_t)N);
    char *a = malloc(es * (size_t)na), *b = malloc(es * (size_t)nb), *c = malloc(es * (size_t)nc);
    char *bv = malloc(es * (size_t)N);
#define SET(p, i, v) (dt == FM_F32 ? (void)(((float *)(p))[i] = (float)(v)) : (void)(((double *)(p))[i] = (v)))
#define GET(p, i) (dt == FM_F32 ? (double)((float *)(p))[i] : ((double *)(p))[i])
    for (int64_t i = 0; i < na; i++) { SET(a, i, frand(&s)); ra[i] = GET(a, i); }
    for (int64_t i = 0; i < nb; i++) { SET(b, i, frand(&s)); rb[i] = GET(b, i); }
    for (int64_t i = 0; i < nc; i++) { SET(c, i, frand(&s)); rc[i] = GET(c, i); }
    for (int64_t i = 0; i < N; i++) { SET(bv, i, frand(&s)); rbias[i] = GET(bv, i); }
    fm_cpu_gemm_args g = {dt, ta, tb, M, N, K, a, lda, b, ldb, beta, c, ldc};
    if (fn) fn(&g, bias ? bv : NULL);
    else if (bias) fm_cpu_gemm_bias(&g, bv);
    else fm_cpu_gemm(&g);
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = bias ? rbias[j] : beta * rc[i * ldc + j], mag = fabs(ref);
            for (int64_t k = 0; k < K; k++) {
                double p = (ta ? ra[k * lda + i] : ra[i * lda + k]) * (tb ? rb[j * ldb + k] : rb[k * ldb + j]);
                ref += p;
                mag += fabs(p);
            }
            double e = fabs(GET(c, i * ldc + j) - ref) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    for (int64_t i = 0; i < M; i++) /* the padding beyond N is untouched */
        for (int64_t j = N; j < ldc; j++) CHECK(GET(c, i * ldc + j) == rc[i * ldc + j]);
    CHECK_MSG(worst < (dt == FM_F32 ? 1e-5 : 1e-13), "%s ta %d tb %d %lldx%lldx%lld beta %g bias %d: error %g",
              dt == FM_F32 ? "f32" : "f64", ta, tb, (long long)M, (long long)N, (long long)K, beta, bias, worst);
#undef SET
#undef GET
    free(ra); free(rb); free(rc); free(rbias); free(a); free(b); free(c); free(bv);
}

static void check_gemm(fm_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double beta, bool bias) {
    check_gemm_with(NULL, dt, ta, tb, M, N, K, beta, bias);
}

static void own_avx512(const fm_cpu_gemm_args *g, const void *bias) { CHECK(fm_cpu_gemm_f32_avx512(g, bias)); }

/* fathom's own f32 AVX-512 kernel (gemm_f32_avx512.c), called directly where the CPU
 * runs AVX-512: every transpose case, beta, bias, and the edges of its 14 x 32 blocks,
 * its K blocks (384), its column chunks (768), its blocks for the last rows and its split over threads */
static void test_gemm_f32_avx512(void) {
    /* which products fm_cpu_gemm hands it (gemm_cpu.c) */
    const char *env = getenv("FATHOM_GEMM_F32");
    const fm_cpu_features *f = fm_cpu_get_features();
    int chosen = env && !strcmp(env, "fathom") ? 2
                 : env && (!strcmp(env, "openblas") || !strcmp(env, "onednn")) ? 0
                                                                              : f->intel && fm_isa_max_for(f) >= FM_ISA_AVX512;
    /* `fathom info` names the kernel when it was chosen, even while FATHOM_ISA is below avx512 */
    CHECK_MSG((fm_cpu_gemm_f32_avx512_note() != NULL) == (chosen > 0), "chosen %d", chosen);
    int mode = fm_cpu_use_avx512() ? chosen : 0;
    fm_cpu_gemm_args r = {FM_F32, false, false, 1024, 1024, 512, NULL, 512, NULL, 1024, 0.0, NULL, 1024};
    bool one = fm_num_threads() == 1; /* the default takes them on one thread only */
    CHECK_MSG(fm_cpu_gemm_f32_avx512_takes(&r) == (mode == 2 || (mode == 1 && one)), "1024x1024x512: mode %d, %d threads",
              mode, fm_num_threads());
    r.K = 256; /* large, but K below the default's bound */
    CHECK_MSG(fm_cpu_gemm_f32_avx512_takes(&r) == (mode == 2), "1024x1024x256: mode %d", mode);
    r.M = 4; /* below 2M multiply-adds: never */
    CHECK(!fm_cpu_gemm_f32_avx512_takes(&r));
    r.M = 1024;
    r.dt = FM_F64;
    CHECK(!fm_cpu_gemm_f32_avx512_takes(&r));
    if (!fm_cpu_use_avx512()) {
        fprintf(stderr, "f32 avx512 gemm: skipped, the kernel level is %s\n", fm_isa_name(fm_cpu_isa()));
        return;
    }
    static const int64_t shapes[][3] = {{1, 1, 1},   {14, 32, 16},  {15, 33, 17},  {13, 31, 1100},
                                        {300, 40, 70}, {29, 1100, 45}, {70, 200, 520}, {2, 700, 3}, {18, 40, 33}};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const int64_t *sh = shapes[i];
            check_gemm_with(own_avx512, FM_F32, t & 1, t >> 1, sh[0], sh[1], sh[2], 0.0, false);
            check_gemm_with(own_avx512, FM_F32, t & 1, t >> 1, sh[0], sh[1], sh[2], 0.5, false);
            check_gemm_with(own_avx512, FM_F32, t & 1, t >> 1, sh[0], sh[1], sh[2], 0.0, true);
        }
}

static void test_gemm(void) {
    static const int64_t shapes[][3] = {{1, 70, 33}, {5, 3, 7}, {64, 200, 48}, {130, 70, 40}, {3, 4, 0}};
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 4; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                fm_dtype dt = d ? FM_F64 : FM_F32;
                const int64_t *sh = shapes[s];
                check_gemm(dt, t & 1, t >> 1, sh[0], sh[1], sh[2], 0.0, false);
                check_gemm(dt, t & 1, t >> 1, sh[0], sh[1], sh[2], 0.5, false);
                check_gemm(dt, t & 1, t >> 1, sh[0], sh[1], sh[2], 0.0, true);
            }
}

/* f32 products of >= 2M multiply-adds go to oneDNN where fathom chose it for f32
 * (`fathom info`'s f32 line); the rest, and beta != 0, stay on OpenBLAS */
static void test_gemm_f32_provider(void) {
    fm_f32_gemm_info fi;
    fm_f32_gemm_info_get(&fi);
    const fm_cpu_features *f = fm_cpu_get_features();
    const char *env = getenv("FATHOM_GEMM_F32"), *dn = getenv("FATHOM_DNNL");
    fprintf(stderr, "f32 gemm: %s %s\n", fi.onednn ? "oneDNN" : "OpenBLAS:", fi.onednn ? fi.kernel : fi.note);
    CHECK_MSG(fi.onednn || fi.note[0], "f32 GEMM stays on OpenBLAS without a reason");
    /* an AddressSanitizer build does not load oneDNN unless FATHOM_DNNL=on, and says so first */
    bool asan = strstr(fi.note, "AddressSanitizer") != NULL;
    if (env && !strcmp(env, "openblas"))
        CHECK_MSG(!fi.onednn && (asan || strstr(fi.note, "FATHOM_GEMM_F32=openblas")), "%s", fi.note);
    else if (dn && !strcmp(dn, "off")) /* (on a CPU where f32 would not use oneDNN anyway, that reason is given) */
        CHECK_MSG(!fi.onednn && (strstr(fi.note, "FATHOM_DNNL=off") || strstr(fi.note, "AVX-512")), "%s", fi.note);
    else if (!(env && !strcmp(env, "onednn")) && fm_isa_max_for(f) < FM_ISA_AVX512)
        CHECK_MSG(!fi.onednn && (asan || strstr(fi.note, "AVX-512")), "%s", fi.note);
    /* shapes above the 2M bound through the public entry, every layout */
    static const int64_t big[][3] = {{160, 130, 112}, {300, 96, 80}, {64, 520, 96}};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
            check_gemm(FM_F32, t & 1, t >> 1, big[i][0], big[i][1], big[i][2], 0.0, false);
            check_gemm(FM_F32, t & 1, t >> 1, big[i][0], big[i][1], big[i][2], 0.0, true);
            check_gemm(FM_F32, t & 1, t >> 1, big[i][0], big[i][1], big[i][2], 0.5, false);
        }
    /* and whether oneDNN took such a product */
    int64_t M = 160, N = 130, K = 112;
    float *a = calloc((size_t)(M * K), 4), *b = calloc((size_t)(K * N), 4), *c = calloc((size_t)(M * N), 4);
    fm_cpu_gemm_args g = {FM_F32, false, false, M, N, K, a, K, b, N, 0.0, c, N};
    bool want = fi.onednn && fm_cpu_use_avx512();
    CHECK_MSG(fm_cpu_gemm_f32_dnnl(&g, NULL) == want, "oneDNN f32 took the product: %d, expected %d", !want, want);
    g.M = 8; /* 8 x 130 x 112: below the bound */
    CHECK(!fm_cpu_gemm_f32_dnnl(&g, NULL));
    free(a); free(b); free(c);
}

static uint16_t to_bf16(float x) { /* round to nearest even (the inputs are finite) */
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static double from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

typedef bool (*bf16_gemm_fn)(const fm_cpu_gemm_args *g, const float *bias, bool c_bf16);

/* one bf16 GEMM call (fn) against a double reference on the same bf16 values,
 * into an f32 C or (cb) a bf16 one; returns whether the path took it */
static bool check_gemm_bf16_with(bf16_gemm_fn fn, bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool bias, bool cb) {
    uint64_t s = (uint64_t)(M * 7 + N * 3 + K) * 2 + ta + 4 * tb;
    int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb, nc = M * ldc;
    uint16_t *a = malloc(2 * (size_t)na), *b = malloc(2 * (size_t)nb);
    float *c = malloc(4 * (size_t)nc), *bv = malloc(4 * (size_t)N);
    for (int64_t i = 0; i < na; i++) a[i] = to_bf16((float)frand(&s));
    for (int64_t i = 0; i < nb; i++) b[i] = to_bf16((float)frand(&s));
    uint16_t *c16 = (uint16_t *)c; /* cb: C is bf16, in the same buffer */
    for (int64_t i = 0; i < nc; i++) {
        if (cb) c16[i] = to_bf16(-7.0f);
        else c[i] = -7.0f;
    }
    for (int64_t i = 0; i < N; i++) bv[i] = (float)frand(&s);
    fm_cpu_gemm_args g = {FM_BF16, ta, tb, M, N, K, a, lda, b, ldb, 0.0, c, ldc};
    bool took = fn(&g, bias ? bv : NULL, cb);
    double worst = 0;
    for (int64_t i = 0; took && i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = bias ? bv[j] : 0, mag = fabs(ref);
            for (int64_t k = 0; k < K; k++) {
                double p = from_bf16(ta ? a[k * lda + i] : a[i * lda + k]) * from_bf16(tb ? b[j * ldb + k] : b[k * ldb + j]);
                ref += p;
                mag += fabs(p);
            }
            /* a bf16 C adds its rounding: half a unit in the 8th bit of the sum */
            double got = cb ? from_bf16(c16[i * ldc + j]) : c[i * ldc + j];
            double e = (fabs(got - ref) - (cb ? fabs(ref) / 256 : 0)) / (mag + 1e-30);
            if (e > worst) worst = e;
            if (j == N - 1) /* padding untouched */
                CHECK(cb ? from_bf16(c16[i * ldc + N]) == -7.0 && from_bf16(c16[i * ldc + N + 1]) == -7.0
                         : c[i * ldc + N] == -7.0f && c[i * ldc + N + 1] == -7.0f);
        }
    CHECK_MSG(worst < 1e-5, "bf16 ta %d tb %d %lldx%lldx%lld bias %d bf16 C %d: error %g", ta, tb, (long long)M,
              (long long)N, (long long)K, bias, cb, worst);
    free(a); free(b); free(c); free(bv);
    return took;
}

static bool check_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool bias, bool cb) {
    return check_gemm_bf16_with(fm_cpu_gemm_bf16, ta, tb, M, N, K, bias, cb);
}

/* fathom's own AMX kernel (gemm_amx.c), called directly: at the amx level it takes
 * every product above its bound, edges in M, N and K included (K not a multiple of
 * the tile's 32, M and N not of the block's 32, one row short of a group of 64);
 * below that level (FATHOM_ISA, or a CPU without AMX) it takes none. Not called on a
 * CPU without AVX-512: gemm_amx.c is compiled for AMX and AVX-512, and in a sanitized
 * build its prologue runs AVX-512 stores before the check (its caller checks first). */
static void test_gemm_bf16_amx(void) {
    if (fm_isa_max_for(fm_cpu_get_features()) < FM_ISA_AVX512) {
        /* not a skipped part: that would report the whole test skipped; the level's gate is
         * checked through fm_cpu_gemm_bf16 by the rest of the test */
        fprintf(stderr, "the AMX kernel is not called directly: this CPU has no AVX-512 (fm_cpu_gemm_bf16 checks the level before it)\n");
        return;
    }
    static const int64_t shapes[][3] = {{33, 47, 200}, {64, 64, 64}, {97, 161, 300}, {2, 300, 1000},
                                        {250, 31, 70}, {63, 96, 33}, {128, 128, 1}};
    int took = 0, calls = 0;
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int v = 0; v < 4; v++) {
                bool big = shapes[i][0] * shapes[i][1] * shapes[i][2] >= ((int64_t)1 << 18);
                bool got = check_gemm_bf16_with(fm_cpu_gemm_bf16_amx, t & 1, t >> 1, shapes[i][0], shapes[i][1],
                                                shapes[i][2], v & 1, v >> 1);
                took += got;
                calls += big;
                CHECK_MSG(got == (big && fm_cpu_use_amx()), "amx %lldx%lldx%lld: took %d",
                          (long long)shapes[i][0], (long long)shapes[i][1], (long long)shapes[i][2], got);
            }
    fprintf(stderr, "amx bf16 gemm: level %s, took %d of %d products above its bound\n", fm_isa_name(fm_cpu_isa()), took,
            calls);
    /* beta != 0 is not its product */
    uint16_t z[64 * 64] = {0};
    float c[64 * 64];
    fm_cpu_gemm_args g = {FM_BF16, false, false, 64, 64, 64, z, 64, z, 64, 1.0, c, 64};
    CHECK(!fm_cpu_gemm_bf16_amx(&g, NULL, false));
}

/* bf16 GEMM on the bf16 hardware (oneDNN) where the CPU and the library allow it;
 * otherwise the reason is printed, and it must be a real one */
static void test_gemm_bf16(void) {
    fm_bf16_gemm_info bi;
    fm_bf16_gemm_info_get(&bi);
    const fm_cpu_features *f = fm_cpu_get_features();
    const char *env = getenv("FATHOM_DNNL");
    fprintf(stderr, "bf16 gemm: %s%s%s %s %s\n", bi.loaded ? "oneDNN " : "widened to f32: ", bi.version, bi.loaded ? "," : "",
            bi.kernel, bi.note);
    if (env && !strcmp(env, "off")) CHECK_MSG(!bi.loaded && strstr(bi.note, "FATHOM_DNNL=off"), "%s", bi.note);
    /* without bf16 hardware the CPU is the reason, unless FATHOM_DNNL=off or an ASan build said so first */
    else if (!f->avx512_bf16 && !f->amx_bf16)
        CHECK_MSG(!bi.loaded && (strstr(bi.note, "neither") || strstr(bi.note, "AddressSanitizer")), "%s", bi.note);
    /* AVX512-BF16 without AMX, a dot product slower than 1.2x the f32 FMA (measured): widened unless
     * FATHOM_DNNL asks for oneDNN */
    else if (f->avx512_bf16 && !(f->amx_bf16 && f->amx_usable) && !(env && *env) && bi.dp_rate < FM_BF16_DOT_MIN_RATE)
        CHECK_MSG(!bi.loaded && (strstr(bi.note, "no usable AMX") || strstr(bi.note, "AddressSanitizer")), "%s", bi.note);
    /* FATHOM_DNNL=on on a CPU with bf16 hardware: oneDNN is used (or why not is said) */
    else if (env && !strcmp(env, "on") && (f->avx512_bf16 || (f->amx_bf16 && f->amx_usable)))
        CHECK_MSG(bi.loaded || strstr(bi.note, "oneDNN"), "%s", bi.note);
    CHECK_MSG(bi.loaded || bi.note[0], "bf16 GEMM is neither loaded nor explained");
    /* AVX512-BF16 without AMX: the dot product's rate was measured (a plausible figure), and
     * oneDNN was skipped for it only below the threshold, and only without FATHOM_DNNL */
    if (f->avx512_bf16 && !(f->amx_bf16 && f->amx_usable) && (bi.loaded || strstr(bi.note, "vdpbf16ps"))) {
        CHECK_MSG(bi.dp_rate > 0.05 && bi.dp_rate < 8, "vdpbf16ps rate %g", bi.dp_rate);
        if (bi.loaded) CHECK_MSG(bi.dp_rate >= FM_BF16_DOT_MIN_RATE || (env && *env), "rate %g", bi.dp_rate);
        else CHECK_MSG(bi.dp_rate < FM_BF16_DOT_MIN_RATE && !(env && *env), "rate %g: %s", bi.dp_rate, bi.note);
    }
    static const int64_t shapes[][3] = {{130, 140, 128}, {300, 64, 160}, {64, 520, 96}, {2, 4096, 300}};
    int took = 0, calls = 0, streamed = 0;
    bool want = (bi.loaded && fm_cpu_use_avx512()) || fm_cpu_use_amx(); /* every shape is above both bounds */
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int v = 0; v < 4; v++, calls++) { /* bias or not, f32 or bf16 C */
                took += check_gemm_bf16(t & 1, t >> 1, shapes[i][0], shapes[i][1], shapes[i][2], v & 1, v >> 1);
                /* up to 4 rows against a [N, K] weight into f32: the bf16-weight GEMV, on any CPU */
                streamed += shapes[i][0] <= 4 && !(t & 1) && (t >> 1) && !(v >> 1);
            }
    /* the parts run at the same time in the pool: the same product again gives the same bits
     * (with oneDNN's global scratchpad, two parts packing B at once corrupted each other) */
    if (want) {
        static const int64_t gs[][3] = {{2048, 384, 128}, {2048, 128, 512}, {128, 512, 2048}, {512, 384, 256}};
        int same = 1;
        for (size_t si = 0; si < sizeof gs / sizeof gs[0]; si++)
            for (int t = 0; t < 4; t++) {
                int64_t M = gs[si][0], N = gs[si][1], K = gs[si][2];
                bool ta = t & 1, tb = t >> 1;
                uint64_t sd = 99 + si;
                uint16_t *a = malloc(2 * (size_t)(M * K)), *b = malloc(2 * (size_t)(K * N));
                float *c1 = malloc(4 * (size_t)(M * N)), *c2 = malloc(4 * (size_t)(M * N));
                for (int64_t i = 0; i < M * K; i++) a[i] = to_bf16((float)frand(&sd));
                for (int64_t i = 0; i < K * N; i++) b[i] = to_bf16((float)frand(&sd));
                fm_cpu_gemm_args g1 = {FM_BF16, ta, tb, M, N, K, a, ta ? M : K, b, tb ? K : N, 0.0, c1, N};
                fm_cpu_gemm_args g2 = g1;
                g2.C = c2;
                CHECK(fm_cpu_gemm_bf16(&g1, NULL, false));
                for (int rep = 0; rep < 3; rep++) {
                    CHECK(fm_cpu_gemm_bf16(&g2, NULL, false));
                    same &= !memcmp(c1, c2, 4 * (size_t)(M * N));
                }
                free(a); free(b); free(c1); free(c2);
            }
        CHECK_MSG(same, "the same bf16 product gave different results when run again");
    }
    /* small products stay on the widening path */
    CHECK(!check_gemm_bf16(false, false, 8, 8, 8, false, false));
    CHECK_MSG(streamed == 2 && took == (want ? calls : streamed), "the bf16 path took %d of %d products (expected %s)",
              took, calls, want ? "all" : "only the 2 streamed ones");
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    /* reload mode tests OpenBLAS's own choice: a core set in the environment (some machines set
     * one for every program) would be respected instead, as test_decide checks */
    if (!strcmp(mode, "reload")) unsetenv("OPENBLAS_CORETYPE");
    const char *env0 = getenv("OPENBLAS_CORETYPE");
    char before[64];
    snprintf(before, sizeof before, "%s", env0 ? env0 : "(unset)");
    if (!strcmp(mode, "reload")) fm_openblas_test_first_core("Prescott");
    test_decide();
    test_isa_choose();
    fm_gemm_provider_info gp;
    fm_gemm_provider_info_get(&gp);
    fprintf(stderr, "provider: %s core '%s' note '%s'\n", gp.loaded ? gp.library : "portable", gp.core, gp.note);
    if (!strcmp(mode, "missing")) {
        CHECK(!gp.loaded && fm_openblas() == NULL);
        CHECK_MSG(strstr(gp.note, "could not be loaded") && strstr(gp.note, "portable"), "%s", gp.note);
    } else if (!strcmp(mode, "reload")) {
        const char *want = fm_openblas_core_for(fm_cpu_get_features());
        if (!want) {
            fprintf(stderr, "skipped: this CPU has no core above Prescott to ask for\n");
            return 77;
        }
        CHECK_MSG(gp.loaded && !strcmp(gp.core, want), "core %s, wanted %s", gp.core, want);
        CHECK_MSG(strstr(gp.note, "Prescott") && strstr(gp.note, want), "%s", gp.note);
        const char *env1 = getenv("OPENBLAS_CORETYPE"); /* the environment is as it was */
        CHECK_MSG(!strcmp(before, env1 ? env1 : "(unset)"), "OPENBLAS_CORETYPE was %s, now %s", before, env1);
    } else {
        CHECK_MSG(gp.loaded, "%s", gp.note);
    }
    for (int threads = 1; threads <= 2; threads++) {
        fm_set_num_threads(threads);
        test_gemm();
        test_gemm_f32_avx512();
        test_gemm_f32_provider();
        test_gemm_bf16();
        test_gemm_bf16_amx();
    }
    fm_parallel_shutdown();
    TEST_DONE();
}
