/* The depthwise convolution's direct kernel (conv_dw_loops.h): NCHW f32, one
 * input channel per group, any kernel size, stride and padding, dilation 1,
 * with the bias and an optional clamp (ReLU, ReLU6) applied before the store. */
#ifndef FATHOM_CONV_DW_H
#define FATHOM_CONV_DW_H
#include <stdint.h>

#include "backend/conv_geom.h"
#include "fathom/error.h"

typedef struct fm_conv_dw {
    const float *x, *w, *bias; /* x [N, C, H, W], w [O, 1, kh, kw] (O a multiple of C), bias [O] or NULL */
    float *y;                  /* [N, O, Ho, Wo] */
    int64_t N, C, H, W, O, Ho, Wo, kh, kw, sh, sw, ph, pw;
    float lo, hi;              /* outputs clamped to [lo, hi]; -inf, inf: no activation */
} fm_conv_dw;

/* Output planes [b, e) (plane = n * O + o) with a thread's scratch
 * (fm_conv_dw_scratch_floats: backend/conv_geom.h) and room for kh * kw offsets, per ISA. */
void fm_conv_dw_planes_avx512(const fm_conv_dw *d, int64_t b, int64_t e, float *ws, int64_t *off);
void fm_conv_dw_planes_avx2(const fm_conv_dw *d, int64_t b, int64_t e, float *ws, int64_t *off);

/* Runs the whole conv on the thread pool, at the widest ISA in use; FM_OK or an
 * out-of-memory status. Its scratch, in this order (the meta device replays it):
 * fm_conv_dw_scratch_floats f32 per pool thread, then kh * kw i64 per thread. */
fm_status fm_conv_dw_run(const fm_conv_dw *d);
#endif
