/* The depthwise conv kernel (conv_dw_loops.h) in 8-lane AVX2 vectors. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/conv_dw.h"

#define V __m256
#define VL 8
#define VSET1(v) _mm256_set1_ps(v)
#define VLOADU(p) _mm256_loadu_ps(p)
#define VSTOREU(p, v) _mm256_storeu_ps((p), (v))
/* the first n lanes: a mask of n all-ones words from a sliding window over a table */
static const int32_t k_lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define VSTOREN(p, v, n) _mm256_maskstore_ps((p), _mm256_loadu_si256((const __m256i *)(const void *)(k_lanes + 8 - (n))), (v))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VMIN(a, b) _mm256_min_ps((a), (b))
#define SFX(name) name##_avx2
#include "backend/cpu/conv_dw_loops.h"

void fm_conv_dw_planes_avx2(const fm_conv_dw *d, int64_t b, int64_t e, float *ws, int64_t *off) {
    dw_planes_avx2(d, b, e, ws, off);
}
