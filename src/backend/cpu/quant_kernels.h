/* Integer kernels of the quantized ops (quant_cpu.c drives them; tests call
 * them directly against the scalar references).
 *
 * INT8: C[m, n] = sum_k A[m, k] * B[n, k], A u8 (activations, zero point
 * folded in later), B s8 (weights, [out, in] as every linear weight), C s32.
 * Three versions, picked at run time: scalar (the reference), AVX2
 * (vpmaddubsw + vpmaddwd) and AVX-512 VNNI (vpdpbusd). All three give the
 * same integers.
 *
 * vpmaddubsw saturation. vpmaddubsw adds two u8 x s8 products into a signed
 * 16-bit lane with saturation: 255 * -128 * 2 = -65280 does not fit, so full
 * 8-bit activations would silently clip. The AVX2 kernel splits each
 * activation byte a = lo + 128 * hi (lo = a & 127, hi = a >> 7 in {0, 1}):
 * |lo0 w0 + lo1 w1| <= 2 * 127 * 128 = 32512 and |hi0 w0 + hi1 w1| <= 256 both
 * fit, and vpmaddwd widens them to 32 bits (hi with weight 128) before they
 * are added. Exact for every u8 x s8 input, at twice the vpmaddubsw count
 * (the price of keeping 8-bit activations; VNNI has no such limit).
 *
 * The fused epilogue turns the integer sums into the op's f32 output:
 *   y[m, n] = a_scale * w_scale[n] * (C[m, n] - a_zero * w_sum[n]) + bias[n]
 * where w_sum[n] = sum_k B[n, k].
 *
 * INT4 (weight-only): W [N, K] in groups of G (32, 64 or 128) along K; each
 * group has a scale d and an offset m (f16): w = q * d + m, q in 0..15. The
 * symmetric form stores only d and means m = -8 d. Packing: each run of 32
 * weights is 16 bytes, byte j holding element j (low nibble) and j + 16
 * (high nibble). Kernels unpack in registers:
 *   y[m, n] = sum_g d_g * sum_{k in g} q_k x_k + m_g * sum_{k in g} x_k,
 * the scalar and AVX-512 ones on f32 x, the AVX2 one on x rounded to int8
 * per block of 32 (fm_q4_rows_avx2 below). */
#ifndef FATHOM_QUANT_KERNELS_H
#define FATHOM_QUANT_KERNELS_H
#include <stdbool.h>
#include <stdint.h>

#include "backend/kernel_attrs.h"
#include "backend/scalar_math.h"

typedef struct fm_q8_epilogue {
    float a_scale;
    int32_t a_zero;
    const float *w_scale;  /* [N] */
    const int32_t *w_sum;  /* [N] */
    const float *bias;     /* [N] or NULL */
    float *y;              /* [M, ldy] */
    int64_t ldy;
    int act;               /* after the bias: FM_QACT_NONE, _RELU, _GELU_TANH or _GELU (fathom/ops.h);
                            * the GELUs as the elementwise ops' vector forms, fm_gelu_tanh512/256
                            * and fm_gelu512/256, in the vector kernels */
    /* per-row activation scales and zero points [M] (dynamic per row), in place of
     * a_scale and a_zero; NULL: a_scale and a_zero for every row */
    const float *row_scale;
    const int32_t *row_zero;
} fm_q8_epilogue;

/* rows [m0, m1) x cols [n0, n1) of A B^T, written as f32 through the epilogue
 * (ep->y) or, when ep is NULL, as s32 into C (ldc). */
typedef struct fm_q8_gemm {
    int64_t M, N, K;
    const uint8_t *A; int64_t lda;
    const int8_t *B; int64_t ldb;
    int32_t *C; int64_t ldc;
    const fm_q8_epilogue *ep;
} fm_q8_gemm;
/* The epilogue of one element (every implementation stores through it, so
 * they round alike). */
static inline void fm_q8_store(const fm_q8_gemm *g, int64_t m, int64_t n, int32_t acc) {
    const fm_q8_epilogue *e = g->ep;
    if (!e) { g->C[m * g->ldc + n] = acc; return; }
    const float as = e->row_scale ? e->row_scale[m] : e->a_scale;
    const int32_t az = e->row_scale ? e->row_zero[m] : e->a_zero;
    int64_t v = (int64_t)acc - (int64_t)az * e->w_sum[n];
    float y = as * e->w_scale[n] * (float)v;
    if (e->bias) y = y + e->bias[n];
    if (e->act == FM_QACT_RELU) y = y > 0.0f ? y : 0.0f;
    else if (e->act == FM_QACT_GELU_TANH) y = (float)fm_gelu_tanh_d((double)y); /* the scalar ops' */
    else if (e->act == FM_QACT_GELU) y = (float)fm_gelu_d((double)y);
    e->y[m * e->ldy + n] = y;
}
void fm_q8_gemm_tile_ref(const fm_q8_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void fm_q8_gemm_tile_avx2(const fm_q8_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void fm_q8_gemm_tile_vnni(const fm_q8_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
typedef enum { FM_Q8_REF, FM_Q8_AVX2, FM_Q8_VNNI, FM_Q8_AMX } fm_q8_impl;
/* The best this CPU has at the ISA level in use (FATHOM_ISA). */
fm_q8_impl fm_q8_impl_best(void);
const char *fm_q8_impl_name(fm_q8_impl i);
/* The whole product over the thread pool with implementation `impl`. */
void fm_q8_gemm_run(const fm_q8_gemm *g, fm_q8_impl impl);

/* Panel layout ("vnni16x4", packed once at quantize time, fm_pack_weight_int8;
 * fm_q8_panel_index in backend/kernel_attrs.h):
 * B [N, K] s8 as [Np = ceil(N/16)][Kq = ceil(K/4)][16][4]. Panel p, step s
 * holds B[16p + j][4s .. 4s + 3] for its 16 columns j (zeros past N and K), so
 * one 64-byte load feeds vpdpbusd with 16 columns x 4 k against one broadcast
 * 4-byte group of an activation row: each 32-bit lane is one output's sum, and
 * no horizontal sums are left. The row sums (the zero point's correction) are
 * stored with the panels. A's rows must be readable to 4 Kq bytes (lda >=
 * 4 Kq), zero past K. Sums are 32-bit: K <= FM_Q8_PANEL_MAX_K keeps both the
 * sum and its zero-point correction in range. Weight codes are in [-127, 127]
 * (fm_pack_weight_int8 refuses -128): the AVX2 kernel (quant_panel_avx2.c)
 * multiplies |a - 128| by the weight with a's sign, which -128 would overflow. */
#define FM_Q8_PANEL_MAX_K 32768
typedef struct fm_q8_pgemm {
    int64_t M, N, K;
    const uint8_t *A; int64_t lda;
    const int8_t *P;       /* panels */
    int32_t *C; int64_t ldc; /* s32 out when ep is NULL */
    const fm_q8_epilogue *ep;
    /* set by the drivers at the AVX2 level (callers leave it false): every weight code is
     * in [-64, 64] ("7-bit" weights, fm_quantize_weight_int8_range), so the AVX2 tile
     * multiplies the u8 codes as they are (fm_q8_panels_narrow_avx2) */
    bool narrow;
} fm_q8_pgemm;
void fm_q8_pgemm_tile_ref(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
/* The AVX2 tile reads A as s8 codes a - 128 (each byte xor 0x80), which fm_q8_pgemm_run
 * prepares; with g->narrow, A's u8 codes as they are. */
void fm_q8_pgemm_tile_avx2(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
/* Whether every one of the n panel bytes at P is in [-64, 64] (stops at the first that is
 * not): then a pair of u8 x s8 products sums to at most 2 x 255 x 64 = 32640, inside
 * vpmaddubsw's 16 bits, and the AVX2 tile needs no sign trick. */
bool fm_q8_panels_narrow_avx2(const int8_t *P, int64_t n);
/* The fewest rows for which the AVX2 drivers look for narrow panels (the scan reads every
 * weight byte once; below this the sign trick's two extra operations a step cost less). */
#define FM_Q8_NARROW_MIN_M 16
void fm_q8_pgemm_tile_vnni(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
/* The same on AMX-INT8 tiles (quant_panel_amx.c; the parts tiles cannot take go to the
 * VNNI tile); false, with nothing written, when K is not a multiple of 64. */
bool fm_q8_pgemm_tile_amx(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
/* The whole product over the thread pool (tasks: 64 columns x up to 96 rows). */
void fm_q8_pgemm_run(const fm_q8_pgemm *g, fm_q8_impl impl);
/* The same product on the calling thread alone (for callers that split other work over the
 * pool: qconv2d_int8's samples), in the same tiles: the same integers and floats. */
void fm_q8_pgemm_serial(const fm_q8_pgemm *g, fm_q8_impl impl);
/* The codes of n values at the CPU's level, on the calling thread: the same values as the
 * pool's pass (fm_q8_quantize_rows) over the same values. */
void fm_q8_codes_at_level(const float *x, int64_t n, float scale, int32_t zero, uint8_t *q);

/* Dynamic activation quantization: the range of x[n] (widened to hold 0),
 * scale = (max - min) / 255 and zero point z, q = clamp(rint(x / scale) + z, 0, 255). */
void fm_q8_range(const float *x, int64_t n, float *mn, float *mx);
void fm_q8_params(float mn, float mx, float *scale, int32_t *zero);
void fm_q8_quantize(const float *x, int64_t n, float scale, int32_t zero, uint8_t *q);
void fm_q8_quantize_avx512(const float *x, int64_t n, float inv_scale, int32_t zero, uint8_t *q);
void fm_q8_range_avx512(const float *x, int64_t n, float *mn, float *mx);
/* The codes of x [M, K] (dense rows) with (a_scale, a_zero), or, when a_scale is 0, with the
 * range of this x (dynamic, per call); *scale and *zero: what was used. Rows lda apart in q
 * (zeros from K to lda). On the thread pool, the same codes as one serial pass. */
void fm_q8_quantize_rows(const float *x, int64_t M, int64_t K, int64_t lda, double a_scale, int32_t a_zero, float *scale, int32_t *zero,
                         uint8_t *q);
/* Only the scale and zero point fm_q8_quantize_rows would take for x [M, K] (dense rows) */
void fm_q8_scale_of(const float *x, int64_t M, int64_t K, double a_scale, int32_t a_zero, float *scale, int32_t *zero);
/* The same with AVX2 (the scalar loops' results bit for bit; the tails run the scalar loops). */
void fm_q8_range_avx2(const float *x, int64_t n, float *mn, float *mx);
void fm_q8_quantize_avx2(const float *x, int64_t n, float scale, int32_t zero, uint8_t *q);

/* One row of an int8 table (qembedding_int8): y[k] = s * code k of the row whose
 * panel bytes start at panel_row (fm_q8_panel_index(Kq, r, 0): 4 codes a step, the
 * steps 64 bytes apart), k < D. The same floats at every level (one exact
 * conversion and one product each). */
void fm_q8_table_row_avx512(const int8_t *panel_row, int64_t D, float s, float *y);
void fm_q8_table_row_avx2(const int8_t *panel_row, int64_t D, float s, float *y);

/* INT4: y[m, n] for rows [m0, m1) (at most 4 per call) and cols [n0, n1).
 * xsum[m * n_groups + g]: the sum of x over group g of row m. */
typedef struct fm_q4_gemm {
    int64_t M, N, K, G;
    const float *x; int64_t ldx;
    const uint8_t *w;        /* [N, K / 2] */
    const uint16_t *scale;   /* [N, K / G] f16 */
    const uint16_t *min;     /* [N, K / G] f16, or NULL: symmetric (m = -8 d) */
    const float *bias;       /* [N] or NULL */
    const float *xsum;
    float *y; int64_t ldy;
    /* AVX2 and AVX512 (fm_q4_gemm_run fills them): x rounded to s8 at one scale
     * per weight group, laid out by fm_q4_quantize_x (xb = G); NULL for the
     * reference. */
    const int8_t *qx;
    const float *dxv;
    /* groups of 32 (fm_q4_gemm_run fills it; may be NULL): per row, per quad of
     * pairs (ceil(K / 256) of them), the 8 block scales [dx_b0, dx_b1, ...] of its
     * four pairs (zeros past the last), what the rows load per quad */
    const float *dx8;
    /* two or more rows run four at a time against each weight row (q4_tile32,
     * q4_tileg; fm_q4_gemm_run sets it unless FATHOM_Q4_TILE=0) */
    bool tiles;
} fm_q4_gemm;
void fm_q4_rows_ref(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
/* The AVX2 rows take x as int8 (as llama.cpp's Q4_0 x Q8_0, and for larger
 * groups as its k-quants x Q8_K, one x scale per 256): each x block of xb
 * values (xb = the weight group G: 32, 64 or 128) is rounded to
 * q = rint(x * 127 / amax) in [-127, 127] with scale dx = amax / 127 (0 for an
 * all-zero block), so a group's sum sum_k q_k x_k becomes dx_g * (an exact
 * integer sum of u4 x s8 from vpmaddubsw or vpdpbusd, over the whole group).
 * The offset term m_g sum_k x_k keeps the f32 sums of x (xsum).
 * fm_q4_quantize_x writes a row's codes in pairs of 32-blocks, 64 bytes each:
 * [b0 0..15, b1 0..15, b0 16..31, b1 16..31] (a last odd block: its 32 codes
 * in order), the layout the nibbles come out of one 32-byte load in, and
 * dxv: per pair 8 floats [dx_b0 x4, dx_b1 x4] (an odd last block: 4 x dx),
 * each 32-block's the scale of its x block. Row m's codes start at qx + m K,
 * its scales at dxv + m K / 8. */
void fm_q4_quantize_x(const float *x, int64_t K, int64_t xb, int8_t *qx, float *dxv);
void fm_q4_quantize_x_avx2(const float *x, int64_t K, int64_t xb, int8_t *qx, float *dxv);
/* The scalar model of the AVX2 rows' arithmetic (integer sums exact, f32 sums
 * in another order): the reference the tests hold them to. */
void fm_q4_rows_q8_ref(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void fm_q4_rows_avx2(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
/* the AVX2 rows with vpdpbusd: call only with avx512_vnni; bitwise fm_q4_rows_avx2 */
void fm_q4_rows_avx512(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
typedef enum { FM_Q4_REF, FM_Q4_AVX2, FM_Q4_AVX512 } fm_q4_impl;
fm_q4_impl fm_q4_impl_best(void);
void fm_q4_gemm_run(const fm_q4_gemm *g, fm_q4_impl impl);
/* One weight row dequantized (the embedding's lookup), f32 out[K]. */
void fm_q4_dequant_row(const uint8_t *w, const uint16_t *scale, const uint16_t *min, int64_t K, int64_t G, float *out);
#endif
