/* ONNX Attention (opset 23) and RotaryEmbedding. */
#include "onnx/onnx_internal.h"

const onnx_op onnx_ops_attn[] = {
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
