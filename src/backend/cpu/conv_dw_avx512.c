/* The depthwise conv kernel (conv_dw_loops.h) in 16-lane AVX-512 vectors. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/conv_dw.h"

#define V __m512
#define VL 16
#define VSET1(v) _mm512_set1_ps(v)
#define VLOADU(p) _mm512_loadu_ps(p)
#define VSTOREU(p, v) _mm512_storeu_ps((p), (v))
#define VSTOREN(p, v, n) _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1), (v))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VMIN(a, b) _mm512_min_ps((a), (b))
#define SFX(name) name##_avx512
#include "backend/cpu/conv_dw_loops.h"

void fm_conv_dw_planes_avx512(const fm_conv_dw *d, int64_t b, int64_t e, float *ws, int64_t *off) {
    dw_planes_avx512(d, b, e, ws, off);
}
