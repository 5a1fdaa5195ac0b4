/* fathom/quant.h: quantizing weights and graphs (docs/QUANTIZE.md).
 *
 * Weight formats, as the quantized ops of fathom/ops.h read them:
 *   int8: per output row (channel) symmetric, w ~= scale[n] * q[n, k], q in [-127, 127];
 *   int4: groups of G (32, 64, 128) along the input dim, each with an f16 scale d (and,
 *         in the with-min variant, an f16 offset m): w ~= q * d + m with q in 0..15; the
 *         symmetric variant means m = -8 d. Packed two per byte: each run of 32 weights
 *         is 16 bytes, byte j holding element j in its low nibble and j + 16 in its high. */
#ifndef FATHOM_QUANT_H
#define FATHOM_QUANT_H
#include "fathom/export.h"
#include "fathom/graph.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* w f32 [N, K] (host) -> *q i8 [N, K] and *scale f32 [N]. */
FM_API fm_status fm_quantize_weight_int8(const fm_tensor *w, fm_tensor **q, fm_tensor **scale);
/* The same with codes in [-qmax, qmax] (1..127; scale = max |w| / qmax). 63 is "7-bit"
 * weights, ONNX Runtime's reduce_range: every pair of u8 x s8 products then fits
 * vpmaddubsw's 16 bits, and on an AVX2 CPU without VNNI the int8 product runs with 4
 * multiply operations per 64 multiply-adds instead of 7 (docs/QUANTIZE.md), at half the
 * weight resolution. Every CPU level gives the same integers either way. */
FM_API fm_status fm_quantize_weight_int8_range(const fm_tensor *w, int qmax, fm_tensor **q, fm_tensor **scale);
/* q i8 [N, K] (host, as fm_quantize_weight_int8 makes it) -> *panels i8
 * [ceil(N/16), ceil(K/4), 16, 4], the layout fm_qlinear_int8_packed reads (panel
 * n/16, step k/4, then 16 columns x 4 bytes; zeros past N and K), and *row_sums
 * i32 [N] (sum_k q[n, k]). K at most 32768 (the sums stay 32-bit); codes in
 * [-127, 127] (a -128 is refused: the AVX2 kernel carries activation signs onto
 * the weights, and -128 has no positive twin). */
FM_API fm_status fm_pack_weight_int8(const fm_tensor *q, fm_tensor **panels, fm_tensor **row_sums);
/* A convolution's weight w f32 [O, C, kh, kw] (host) -> what fm_qconv2d_int8 reads: the
 * weight as [O, kh kw C] in the order (ky, kx, c), quantized per output channel
 * (fm_quantize_weight_int8) and packed (fm_pack_weight_int8) over K = kh kw C padded with
 * zero columns to a multiple of 64 from 64 on (of 4 below), the whole steps of the AMX
 * tiles: *panels [ceil(O/16), Kp/4, 16, 4], *scale f32 [O], *row_sums i32 [O]. K at most 32768. */
FM_API fm_status fm_quantize_conv_weight_int8(const fm_tensor *w, fm_tensor **panels, fm_tensor **scale, fm_tensor **row_sums);
/* The same with codes in [-qmax, qmax] (fm_quantize_weight_int8_range). */
FM_API fm_status fm_quantize_conv_weight_int8_range(const fm_tensor *w, int qmax, fm_tensor **panels, fm_tensor **scale,
                                                    fm_tensor **row_sums);
/* w f32 [N, K] (host) -> *packed u8 [N, K/2], *scale f16 [N, K/group] and, when
 * with_min, *min f16 [N, K/group] (else *min = NULL). group must divide K. */
FM_API fm_status fm_quantize_weight_int4(const fm_tensor *w, int group, bool with_min, fm_tensor **packed, fm_tensor **scale,
                                         fm_tensor **min);

/* ---- quantizing a graph (fathom quantize) ---- */
typedef enum fm_quant_mode {
    FM_QUANT_INT8_DYNAMIC = 0, /* linear/matmul: int8 weights per row, activations quantized per call */
    FM_QUANT_INT8_STATIC,      /* the same with activation scales fixed by calibration */
    FM_QUANT_INT4              /* weight-only int4 for linear/matmul and embedding */
} fm_quant_mode;
typedef enum fm_calib_method { FM_CALIB_MINMAX = 0, FM_CALIB_PERCENTILE, FM_CALIB_ENTROPY } fm_calib_method;
typedef struct fm_quant_options {
    fm_quant_mode mode;
    int group;              /* int4: 32, 64 or 128 (0: 32) */
    bool with_min;          /* int4: an f16 offset per group too */
    fm_calib_method method; /* static */
    double percentile;      /* static, percentile method: the share of values kept (0: 99.99) */
    const fm_tensor *calib; /* static: [S, ...] samples of the graph's one input, as it takes them */
    int64_t batch;          /* calibration batch (0: 64) */
    /* Which nodes may be quantized (ONNX Runtime's op_types_to_quantize and nodes_to_exclude):
     * op_types, comma-separated kinds among linear (linear and linear_fused), matmul, conv2d
     * (conv2d and conv2d_fused) and embedding, NULL or "" for all; exclude, comma-separated
     * node names that stay fp32 (the names the report gives), NULL for none. A kind or a name
     * the graph lacks is an error that names it. */
    const char *op_types;
    const char *exclude;
    /* int8 modes: weight codes in [-63, 63] instead of [-127, 127] (ONNX Runtime's
     * reduce_range; fm_quantize_weight_int8_range): faster on AVX2 CPUs without VNNI,
     * half the weight resolution; no effect on speed where VNNI or AMX run the product */
    bool reduce_range;
} fm_quant_options;
FM_API void fm_quant_options_init(fm_quant_options *o);
/* What became of each compute node. */
typedef struct fm_quant_node {
    char node[96], op[32];
    bool quantized;
    char how[160]; /* "int8 dynamic", "int4 g32 (with min)", or why it stays fp32 */
} fm_quant_node;
typedef struct fm_quant_report {
    int n_nodes;             /* entries below: every node of the input graph */
    fm_quant_node *nodes;
    int n_quantized;
    size_t bytes_before, bytes_after; /* constants */
} fm_quant_report;
FM_API void fm_quant_report_free(fm_quant_report *r);
/* A new graph with the quantized ops in place of linear/matmul/embedding nodes
 * whose weights are f32 constants (g unchanged). Errors (a group that does not
 * divide a layer's input features, calibration data that does not fit the
 * graph's input, a graph that static quantization cannot calibrate) name the
 * node or the input. rep (may be NULL) says what happened to each node. */
FM_API fm_graph *fm_graph_quantize(const fm_graph *g, const fm_quant_options *o, fm_quant_report *rep);

#ifdef __cplusplus
}
#endif
#endif
