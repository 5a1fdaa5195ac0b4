/* qconv2d_int8's output pass (qconv_cpu.c), shared with its AVX-512 version
 * (qconv_avx512.c): the GEMM's out [P, O] of one sample into NCHW [O, Hp, Wp],
 * each output the max over its pool x pool window of GEMM rows (pool 1: the row),
 * then min(y, hi). */
#ifndef FATHOM_BACKEND_CPU_QCONV_H
#define FATHOM_BACKEND_CPU_QCONV_H
#include <stdint.h>

typedef struct fm_qconv_out {
    int64_t O, Wo;      /* channels; the convolution's output width (GEMM rows a row) */
    int64_t pool;       /* 1: none */
    int64_t Wp, Pp;     /* the (pooled) output's width and positions */
    float hi;           /* the cap (INFINITY: none) */
} fm_qconv_out;

/* outputs at (pooled) positions [q0, q1) of one sample: src [P, O] -> dst [O, Pp] */
void fm_qconv_out_avx512(const fm_qconv_out *a, const float *src, float *dst, int64_t q0, int64_t q1);
/* One sample's codes straight into its padded NHWC rows: image rows [h0, h1) of x [C, H, W] f32
 * -> dst [Hpad, Wpad, C] at rows ph + h, columns pw.. (the padding cells: the caller's), each code as
 * fm_q8_quantize_avx512 makes it (rint(x / scale) + zero, clamped to [0, 255]); 16 channels x
 * 16 columns at a time through a register transpose, where codes then a byte transpose took
 * two passes with a scalar scatter. */
void fm_qconv_codes_nhwc_avx512(const float *x, int64_t C, int64_t H, int64_t W, int64_t h0, int64_t h1, float inv_scale, int32_t zero,
                                uint8_t *dst, int64_t Wpad, int64_t ph, int64_t pw);
#endif
