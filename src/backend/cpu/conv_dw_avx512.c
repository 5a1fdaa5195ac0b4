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
/* Stride 2: row xr of W floats into its two phase rows (conv_dw_loops.h's dw_split_row), 32
 * input columns at a time with masked loads and stores, so that a short row (7-28 columns,
 * MobileNet's late stride-2 layers) takes one pass instead of scalar copies: even lanes of the
 * chunk go to one phase, odd lanes to the other (which one, and where, from pw's parity). */
static inline void dw_split2_row_avx512(const float *xr, float *row, int64_t W, int64_t pw, int64_t phase) {
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int64_t i0 = 0; i0 < W; i0 += 32) {
        const int64_t n = W - i0 < 32 ? W - i0 : 32, na = n < 16 ? n : 16, nb = n - na;
        const __m512 a = _mm512_maskz_loadu_ps((__mmask16)((1u << na) - 1), xr + i0);
        const __m512 b = _mm512_maskz_loadu_ps((__mmask16)((1u << nb) - 1), xr + i0 + 16);
        const int64_t pe = pw + i0, po = pe + 1; /* padded columns of the chunk's first even and odd lanes */
        _mm512_mask_storeu_ps(row + (pe & 1) * phase + pe / 2, (__mmask16)((1u << ((n + 1) / 2)) - 1), _mm512_permutex2var_ps(a, ev, b));
        _mm512_mask_storeu_ps(row + (po & 1) * phase + po / 2, (__mmask16)((1u << (n / 2)) - 1), _mm512_permutex2var_ps(a, od, b));
    }
}
#define DW_SPLIT2_ROW dw_split2_row_avx512
#define SFX(name) name##_avx512
#include "backend/cpu/conv_dw_loops.h"

void fm_conv_dw_planes_avx512(const fm_conv_dw *d, int64_t b, int64_t e, float *ws, int64_t *off) {
    dw_planes_avx512(d, b, e, ws, off);
}
