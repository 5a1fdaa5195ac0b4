/* The direct conv tile (conv_direct_simd.h) with AVX2/FMA: 8 columns per vector,
 * 6 output channels per tile (12 accumulators of the 16 registers), and 4-channel
 * tiles for the channels left over (conv_direct.h, fm_conv_direct_split). */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/conv_direct.h"

#define V __m256
#define VL FM_CONV_DIRECT_VL_AVX2
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSET1(f) _mm256_set1_ps(f)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VISNAN_SEL(m, a) _mm256_blendv_ps(m, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q))

/* Plain stores for the full vector and the pooled half, the common cases: AMD
 * before Zen 4 runs vmaskmovps stores as long microcode sequences, and with them
 * the 1->32 conv (9 taps per tile) ran 1.9x slower on Zen 3. */
static inline void store_n(float *p, __m256 v, int64_t n) {
    if (n == 8) { _mm256_storeu_ps(p, v); return; }
    if (n == 4) { _mm_storeu_ps(p, _mm256_castps256_ps128(v)); return; }
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int64_t i = 0; i < n; i++) p[i] = t[i];
}
#define VSTORE_N(p, v, n) store_n(p, v, n)

static inline __m256 pairmax256(__m256 v) {
    const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), od = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    __m256 a = _mm256_permutevar8x32_ps(v, ev), b = _mm256_permutevar8x32_ps(v, od);
    return VISNAN_SEL(_mm256_max_ps(a, b), a);
}
#define VPAIRMAX(v) pairmax256(v)

#define FM_CONV_DIRECT_OWN_ROWS
#define OB FM_CONV_DIRECT_OB_AVX2
#define FN(name) name##_avx2_big
#include "backend/cpu/conv_direct_simd.h"
#undef OB
#undef FN
#define OB FM_CONV_DIRECT_OBS_AVX2
#define FN(name) name##_avx2_small
#include "backend/cpu/conv_direct_simd.h"

/* Tasks in the order (sample, row pair, channel block), unlike the AVX-512 level:
 * the pair's input rows stay in L1 while the blocks' weights stream through, which
 * measured about 10% faster than block-major at batch 32 on Zen 3 (each block
 * pass re-read the sample's input from L2). */
void fm_conv_direct_rows_avx2(const fm_conv_direct *d, int64_t begin, int64_t end) {
    const int64_t pairs = d->pool == 2 ? d->Hy : (d->Ho + 1) / 2, cols = d->pool == 2 ? 2 * d->Wy : d->Wo;
    int64_t blocks;
    fm_conv_direct_split(d->O, FM_CONV_DIRECT_OB_AVX2, FM_CONV_DIRECT_OBS_AVX2, &blocks);
    for (int64_t t = begin; t < end; t++) {
        int64_t n = t / (blocks * pairs), r = t % (blocks * pairs), width, oh = 2 * (r / blocks);
        int64_t o0 = fm_conv_direct_block(r % blocks, d->n_big, FM_CONV_DIRECT_OB_AVX2, FM_CONV_DIRECT_OBS_AVX2, &width);
        if (width == FM_CONV_DIRECT_OB_AVX2)
            for (int64_t c0 = 0; c0 < cols; c0 += VL) tile_avx2_big(d, n, o0, oh, c0);
        else
            for (int64_t c0 = 0; c0 < cols; c0 += VL) tile_avx2_small(d, n, o0, oh, c0);
    }
}
