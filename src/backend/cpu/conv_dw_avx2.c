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
static inline __m256i lanes(int64_t n) { return _mm256_loadu_si256((const __m256i *)(const void *)(k_lanes + 8 - n)); }
#define VSTOREN(p, v, n) _mm256_maskstore_ps((p), lanes(n), (v))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VMIN(a, b) _mm256_min_ps((a), (b))
/* Stride 2: row xr of W floats into its two phase rows (conv_dw_loops.h's dw_split_row),
 * 16 input columns at a time: the even lanes of the chunk to one phase row and the odd
 * lanes to the other (which, and where, from pw's parity), two shuffles and a lane
 * permute each. A short last chunk is loaded masked, its lanes past the row zero, and
 * stored whole all the same: the floats past a phase row's last column are its right
 * padding and slack, which must stay zero, and get zeros; they are within the row (its
 * slack is FM_CONV_DW_SLACK >= 32 floats). Masked stores instead, slow on AMD, made
 * MobileNetV2's 28 -> 14 layer slower than the scalar copies (AMD EPYC Zen 3). */
static inline void dw_split2_row_avx2(const float *xr, float *row, int64_t W, int64_t pw, int64_t phase) {
    for (int64_t i0 = 0; i0 < W; i0 += 16) {
        const int64_t n = W - i0 < 16 ? W - i0 : 16;
        __m256 a, b;
        if (n == 16) a = _mm256_loadu_ps(xr + i0), b = _mm256_loadu_ps(xr + i0 + 8);
        else {
            a = _mm256_maskload_ps(xr + i0, lanes(n < 8 ? n : 8));
            b = n > 8 ? _mm256_maskload_ps(xr + i0 + 8, lanes(n - 8)) : _mm256_setzero_ps();
        }
        /* [a0 a2 b0 b2 | a4 a6 b4 b6] -> [a0 a2 a4 a6 b0 b2 b4 b6]; the odd lanes alike */
        const __m256 ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
        const __m256 od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
        const int64_t pe = pw + i0, po = pe + 1; /* padded columns of the chunk's first even and odd lanes */
        float *de = row + (pe & 1) * phase + pe / 2, *dd = row + (po & 1) * phase + po / 2;
        _mm256_storeu_ps(de, ev), _mm256_storeu_ps(dd, od);
    }
}
#define DW_SPLIT2_ROW dw_split2_row_avx2
#define SFX(name) name##_avx2
#define DW_NARROW2 4
#define DW_SPILL 1
#include "backend/cpu/conv_dw_loops.h"

void fm_conv_dw_planes_avx2(const fm_conv_dw *d, int64_t b, int64_t e, float *ws, int64_t *off) {
    dw_planes_avx2(d, b, e, ws, off);
}
