"""Writes a small image classifier as torch.onnx.export would (Conv, Relu, MaxPool,
GlobalAveragePool, Flatten, Gemm; dynamic batch) for tests/cli_quantize_onnx.sh, with
calibration samples and test inputs (preprocessed f32, as the model takes them), and a
calibration file of the wrong shape. Usage: python onnx_quant_cnn.py OUT_DIR"""
import sys

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper


def init(name, a):
    return numpy_helper.from_array(np.asarray(a, dtype=np.float32), name)


def model():
    rng = np.random.default_rng(11)
    he = lambda *s: rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))
    inits = [init("w1", he(16, 3, 3, 3)), init("b1", rng.standard_normal(16) * 0.1),
             init("w2", he(32, 16, 3, 3)), init("b2", rng.standard_normal(32) * 0.1),
             init("w3", he(48, 32, 1, 1)),
             init("fc", he(10, 48)), init("fcb", rng.standard_normal(10) * 0.1)]
    n = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),  # 27 weights a window: stays fp32
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c2"], ["r2"]),
         helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Conv", ["p2", "w3"], ["c3"]),  # 1x1 over 32 channels
         helper.make_node("Relu", ["c3"], ["r3"]),
         helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
         helper.make_node("Flatten", ["g"], ["f"], axis=1),
         helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])
    m = helper.make_model(helper.make_graph(n, "quant_cnn", [x], [y], initializer=inits), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    checker.check_model(m)
    return m


def main():
    out = sys.argv[1]
    open(f"{out}/cnn.onnx", "wb").write(model().SerializeToString())
    rng = np.random.default_rng(5)
    np.save(f"{out}/calib.npy", rng.standard_normal((64, 3, 32, 32)).astype(np.float32))
    np.save(f"{out}/x.npy", rng.standard_normal((6, 3, 32, 32)).astype(np.float32))
    np.save(f"{out}/calib_bad.npy", rng.standard_normal((8, 3, 30, 32)).astype(np.float32))


if __name__ == "__main__":
    main()
