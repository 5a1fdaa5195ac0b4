/* ONNX BitCast, DeformConv and TensorScatter. */
#include "onnx/onnx_internal.h"

const onnx_op onnx_ops_more[] = {
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
