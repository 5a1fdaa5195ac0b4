/* CPUID-based feature detection (x86-64); other architectures report none.
 * A feature counts only if the OS also saves its registers (XCR0), so a
 * hypervisor that hides AVX-512 state hides the AVX-512 kernels too. */
#include "core/cpu_features.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static fm_cpu_features g_feat;
static int g_done;

#define BIT(r, n) (((r) >> (n)) & 1u)

#if defined(__x86_64__) || defined(__i386__)
static void read_brand(char *out, size_t n) {
    unsigned r[12], a, b, c, d;
    out[0] = 0;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000004u) return;
    for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    char s[49];
    memcpy(s, r, 48);
    s[48] = 0;
    const char *p = s;
    while (*p == ' ') p++; /* Intel pads the brand on the left */
    snprintf(out, n, "%s", p);
    for (size_t l = strlen(out); l && out[l - 1] == ' '; l--) out[l - 1] = 0;
}

/* Linux enables AMX tile data per process: the first tile instruction of a
 * process that did not ask faults. Ask once here (ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA); a kernel that refuses leaves amx_usable false. */
static bool request_amx(void) {
#if defined(__linux__) && defined(__x86_64__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}

static void detect(fm_cpu_features *f) {
    unsigned a, b, c, d, max_leaf = __get_cpuid_max(0, NULL);
    read_brand(f->model, sizeof f->model);
    if (max_leaf >= 1 && __get_cpuid(0, &a, &b, &c, &d)) /* vendor "GenuineIntel" in ebx, edx, ecx */
        f->intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;
    if (max_leaf < 1 || !__get_cpuid(1, &a, &b, &c, &d)) return;
    unsigned long long xcr0 = 0;
    if (BIT(c, 27)) { /* OSXSAVE: xgetbv is allowed */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6, tiles = (xcr0 & 0x60000) == 0x60000;
    f->avx = ymm && BIT(c, 28);
    f->fma = ymm && BIT(c, 12);
    f->f16c = ymm && BIT(c, 29);
    if (max_leaf < 7 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    unsigned subleaves = a;
    f->avx2 = ymm && BIT(b, 5);
    f->avx512f = zmm && BIT(b, 16);
    f->avx512dq = zmm && BIT(b, 17);
    f->avx512ifma = zmm && BIT(b, 21);
    f->avx512cd = zmm && BIT(b, 28);
    f->avx512bw = zmm && BIT(b, 30);
    f->avx512vl = zmm && BIT(b, 31);
    f->avx512vbmi = zmm && BIT(c, 1);
    f->avx512_vnni = zmm && BIT(c, 11);
    f->amx_bf16 = tiles && BIT(d, 22);
    f->avx512_fp16 = zmm && BIT(d, 23);
    f->amx_tile = tiles && BIT(d, 24);
    f->amx_int8 = tiles && BIT(d, 25);
    if (subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        f->avx_vnni = ymm && BIT(a, 4);
        f->avx512_bf16 = zmm && BIT(a, 5);
    }
    if (f->amx_tile) f->amx_usable = request_amx();
}
#endif

const fm_cpu_features *fm_cpu_get_features(void) {
    if (__atomic_load_n(&g_done, __ATOMIC_ACQUIRE)) return &g_feat;
    fm_cpu_features f;
    memset(&f, 0, sizeof f);
#if defined(__x86_64__) || defined(__i386__)
    detect(&f);
#endif
    g_feat = f; /* two racing first callers store the same bytes */
    __atomic_store_n(&g_done, 1, __ATOMIC_RELEASE);
    return &g_feat;
}

static const char *const isa_names[FM_ISA_COUNT] = {"scalar", "avx2", "avx512", "amx"};

const char *fm_isa_name(fm_isa isa) { return isa >= 0 && isa < FM_ISA_COUNT ? isa_names[isa] : "?"; }

fm_isa fm_isa_max_for(const fm_cpu_features *f) {
    if (!(f->avx2 && f->fma && f->f16c)) return FM_ISA_SCALAR;
    if (!(f->avx512f && f->avx512dq && f->avx512bw && f->avx512vl)) return FM_ISA_AVX2;
    if (!(f->avx512_bf16 && f->amx_tile && f->amx_bf16 && f->amx_usable)) return FM_ISA_AVX512;
    return FM_ISA_AMX;
}

bool fm_isa_choose(const char *env, fm_isa max, fm_isa *out, char *msg, size_t msg_len) {
    *out = max;
    if (!env || !*env) return true;
    char have[64] = "";
    for (int i = 0; i <= (int)max; i++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "", isa_names[i]);
    for (int i = 0; i < FM_ISA_COUNT; i++) {
        if (strcmp(env, isa_names[i])) continue;
        if (i <= (int)max) { *out = (fm_isa)i; return true; }
        if (msg) snprintf(msg, msg_len, "FATHOM_ISA=%s: this CPU lacks it; the levels it has are: %s", env, have);
        return false;
    }
    if (msg)
        snprintf(msg, msg_len, "FATHOM_ISA=%s names no level (scalar, avx2, avx512, amx); the levels this CPU has are: %s",
                 env, have);
    return false;
}

/* FATHOM_ISA, or the older FATHOM_DISABLE_SIMD=1 as "scalar" */
static const char *isa_env(void) {
    const char *e = getenv("FATHOM_ISA");
    if (e && *e) return e;
    const char *dis = getenv("FATHOM_DISABLE_SIMD");
    return dis && *dis && strcmp(dis, "0") ? "scalar" : NULL;
}

bool fm_isa_choose_for(const char *env, const fm_cpu_features *f, fm_isa *out, char *msg, size_t msg_len) {
    if (fm_isa_choose(env, fm_isa_max_for(f), out, msg, msg_len)) return true;
    if (msg && !strcmp(env, "amx") && f->amx_tile && f->amx_bf16 && !f->amx_usable) {
        size_t n = strlen(msg);
        snprintf(msg + n, msg_len - n,
                 " (the CPU has AMX, but Linux did not grant this process the tile data: arch_prctl(ARCH_REQ_XCOMP_PERM) "
                 "needs Linux 5.16 or later)");
    }
    return false;
}

bool fm_isa_check(char *msg, size_t msg_len) {
    fm_isa isa;
    return fm_isa_choose_for(isa_env(), fm_cpu_get_features(), &isa, msg, msg_len);
}

fm_isa fm_cpu_isa(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    if (v >= 0) return (fm_isa)v;
    fm_isa max = fm_isa_max_for(fm_cpu_get_features()), isa;
    char msg[256];
    if (!fm_isa_choose_for(isa_env(), fm_cpu_get_features(), &isa, msg, sizeof msg)) {
        /* a library cannot refuse to run here (kernels have no error path):
         * it says so once and uses the highest level the CPU has */
        int expected = -1;
        if (__atomic_compare_exchange_n(&cached, &expected, (int)max, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            fprintf(stderr, "fathom: warning: %s; using %s\n", msg, isa_names[max]);
        return (fm_isa)__atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    }
    __atomic_store_n(&cached, (int)isa, __ATOMIC_RELEASE);
    return isa;
}

bool fm_cpu_use_avx2(void) { return fm_cpu_isa() >= FM_ISA_AVX2; }
bool fm_cpu_use_avx512(void) { return fm_cpu_isa() >= FM_ISA_AVX512; }
bool fm_cpu_use_amx(void) { return fm_cpu_isa() >= FM_ISA_AMX; }
