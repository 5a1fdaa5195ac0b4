/* ONNX LinearAttention and CausalConvWithState (the linear-attention and state-space families). */
#include "onnx/onnx_internal.h"

const onnx_op onnx_ops_linattn[] = {
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
