/* Run-time CPU feature detection: AVX2/FMA/F16C kernels are entered only when
 * the CPU reports them (and FATHOM_DISABLE_SIMD is unset). */
#ifndef FATHOM_CPU_FEATURES_H
#define FATHOM_CPU_FEATURES_H
#include <stdbool.h>
typedef struct fm_cpu_features { bool avx, avx2, fma, f16c, avx512f, avx512bw, avx_vnni; } fm_cpu_features;
const fm_cpu_features *fm_cpu_get_features(void);
/* AVX2 + FMA + F16C all present and SIMD not disabled. */
bool fm_cpu_use_avx2(void);
#endif
