/* Run-time CPU feature detection (cpuid + xgetbv; other architectures report
 * none) and the ISA level the CPU kernels use: the highest level the CPU has,
 * or a lower one forced with FATHOM_ISA=scalar|avx2|avx512 (so that tests can
 * run every path the machine supports). */
#ifndef FATHOM_CPU_FEATURES_H
#define FATHOM_CPU_FEATURES_H
#include <stdbool.h>
#include <stddef.h>

typedef struct fm_cpu_features {
    char model[64]; /* cpuid brand string, "" where the CPU has none */
    bool intel;     /* vendor GenuineIntel (kernel choices that depend on the core design, gemm_bf16.c) */
    bool avx, avx2, fma, f16c;
    bool avx512f, avx512dq, avx512cd, avx512bw, avx512vl, avx512vbmi, avx512ifma;
    bool avx512_vnni, avx512_bf16, avx512_fp16, avx_vnni;
    bool amx_tile, amx_bf16, amx_int8;
    bool amx_usable; /* the OS enables tile state and granted this process the tile data (Linux arch_prctl) */
} fm_cpu_features;

/* Levels of the CPU kernels, lowest first. Each needs all features of the one below. */
typedef enum fm_isa { FM_ISA_SCALAR, FM_ISA_AVX2, FM_ISA_AVX512, FM_ISA_AMX, FM_ISA_COUNT } fm_isa;

const fm_cpu_features *fm_cpu_get_features(void);
/* "scalar", "avx2", "avx512", "amx" */
const char *fm_isa_name(fm_isa isa);
/* The highest level a feature set allows: avx2 = AVX2+FMA+F16C; avx512 = that +
 * AVX-512 F/DQ/BW/VL; amx = that + AVX512-BF16 + AMX-TILE/BF16 with the tile data
 * granted by the OS. Pure: the tests feed it made-up feature sets. */
fm_isa fm_isa_max_for(const fm_cpu_features *f);
/* Picks the level for a FATHOM_ISA value (NULL or "" = the highest, max). Returns
 * false if the value names no level or one above max; then msg (if non-NULL)
 * says why and lists the levels this CPU has. Pure, for the tests. */
bool fm_isa_choose(const char *env, fm_isa max, fm_isa *out, char *msg, size_t msg_len);
/* The same for a feature set (its highest level), where a refused amx on a CPU that has
 * the tiles but was not granted their data by the OS says so. Pure, for the tests. */
bool fm_isa_choose_for(const char *env, const fm_cpu_features *f, fm_isa *out, char *msg, size_t msg_len);
/* The level in use: FATHOM_ISA if valid, else the highest (a bad FATHOM_ISA is
 * announced once on stderr; the CLI refuses it before any work, fm_isa_check). */
fm_isa fm_cpu_isa(void);
/* False with the message in msg if FATHOM_ISA is set to something unusable here. */
bool fm_isa_check(char *msg, size_t msg_len);
/* Shorthands for the kernels: level >= avx2 / avx512 / amx. */
bool fm_cpu_use_avx2(void);
bool fm_cpu_use_avx512(void);
bool fm_cpu_use_amx(void);
#endif
