/* ONNX ops of the later opsets and the less common families. */
#include "onnx/onnx_internal.h"

const onnx_op onnx_ops_extra[] = {
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
