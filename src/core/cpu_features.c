/* CPUID-based feature detection (x86-64); other architectures report none. */
#include "core/cpu_features.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static fm_cpu_features g_feat;
static int g_done;

const fm_cpu_features *fm_cpu_get_features(void) {
    if (__atomic_load_n(&g_done, __ATOMIC_ACQUIRE)) return &g_feat;
    fm_cpu_features f;
    memset(&f, 0, sizeof f);
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        bool osxsave = (c >> 27) & 1;
        unsigned long long xcr0 = 0;
        if (osxsave) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            xcr0 = ((unsigned long long)hi << 32) | lo;
        }
        bool ymm = (xcr0 & 6) == 6;
        f.avx = ymm && ((c >> 28) & 1);
        f.fma = ymm && ((c >> 12) & 1);
        f.f16c = ymm && ((c >> 29) & 1);
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            f.avx2 = ymm && ((b >> 5) & 1);
            bool zmm = (xcr0 & 0xe6) == 0xe6;
            f.avx512f = zmm && ((b >> 16) & 1);
            f.avx512bw = zmm && ((b >> 30) & 1);
        }
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx_vnni = ymm && ((a >> 4) & 1);
    }
#endif
    g_feat = f;
    __atomic_store_n(&g_done, 1, __ATOMIC_RELEASE);
    return &g_feat;
}

bool fm_cpu_use_avx2(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const fm_cpu_features *f = fm_cpu_get_features();
        const char *dis = getenv("FATHOM_DISABLE_SIMD");
        v = f->avx2 && f->fma && f->f16c && !(dis && *dis && strcmp(dis, "0"));
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v != 0;
}
