"""ONNX Runtime's QDQ int8 models (quantize_static, QuantFormat.QDQ) imported and compiled by
fathom: each QuantizeLinear-DequantizeLinear-MatMul (or Gemm) whose weight is a symmetric int8
constant must become one qlinear_int8 node (fathom's int8 kernels), the other Q/DQ pairs float
ew_chains without casts; the compiled graph's outputs must equal the interpreter's (`fathom run
model.onnx`) and ONNX Runtime's with its optimizations off (the graph as written) within one
step of the output's quantization grid (in practice: exactly). Where ONNX Runtime's uint8 x int8
products saturate (x86 without VNNI: onnx_check_lib.ort_u8s8_exact), a model with integer
products is compared with ONNX's reference evaluator instead.

Models (onnx helper API, seeded weights): an MLP of MatMul+Add+Relu, a linear stack of Gemm
(transB=1, bias) with an exact GELU (Div, Erf, Add, Mul, Mul) between, each quantized per
tensor and per channel with uint8 and int8 activations; and the MLP with asymmetric weights
(weight zero points not 0), which must stay float (no qlinear_int8) and still match. A CNN of two
3x3 Convs (pads 1, then stride 2) with biases and a Relu: per channel each Conv must become
qconv2d_int8; per tensor they stay float convs (fathom's int8 conv weights are per channel). Then both
models through quantize_dynamic (DynamicQuantizeLinear, MatMulInteger, Cast, Mul): each such
MatMul must become one dynamic qlinear_int8, no MatMulInteger left, and the outputs must agree
with the interpreter's and ONNX Runtime's within 2% of their largest magnitude (both quantize x
per call to uint8 over its range; fathom multiplies by 1 / scale where ONNX divides, so a value on
a rounding half may land one step over).

  onnx_qdq_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime's quantization tool is missing."""
import json
import logging
import subprocess
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime with its quantization tool ({e.name} missing)")
    sys.exit(77)

from onnx_check_lib import reference_instead_of_ort, reference_run  # noqa: E402 (after the skip above)

FATHOM, D = sys.argv[1], sys.argv[2]
logging.getLogger().setLevel(logging.ERROR)
rng = np.random.default_rng(5)
fails = 0


def save(nodes, inits, k, n, name):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", T.FLOAT, ["b", k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["b", n])],
                          [numpy_helper.from_array(a, nm) for nm, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, f"{D}/{name}.onnx")


def w(*shape):
    return (rng.standard_normal(shape) * 0.1).astype(np.float32)


def cnn():
    nodes = [helper.make_node("Conv", ["x4", "c1", "cb1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "c2", "cb2"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x4", T.FLOAT, ["b", 3, 12, 12])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["b", 8, 6, 6])],
                          [numpy_helper.from_array(a, nm) for nm, a in {"c1": w(16, 3, 3, 3), "cb1": w(16), "c2": w(8, 16, 3, 3), "cb2": w(8)}.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, f"{D}/cnn.onnx")


def mlp():
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]), helper.make_node("Add", ["o", "b2"], ["y"])]
    save(nodes, {"w1": w(64, 96), "b1": w(96), "w2": w(96, 10), "b2": w(10)}, 64, 10, "mlp")


def gelu_ffn():
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Div", ["h", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["h", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["g"]), helper.make_node("Gemm", ["g", "w2", "b2"], ["y"], transB=1)]
    consts = {"w1": w(128, 48), "b1": w(128), "w2": w(48, 128), "b2": w(48), "sqrt2": np.array(np.sqrt(2), np.float32),
              "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    save(nodes, consts, 48, 48, "ffn")


class Reader(CalibrationDataReader):
    def __init__(self, k):
        shape, name = ((16, k), "x") if isinstance(k, int) else ((4,) + k, "x4")
        self.it = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.it, None)


def run(args):
    p = subprocess.run([FATHOM] + args, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def check(src, k, name, want_int8, dynamic=False, **q):
    global fails
    if dynamic:
        quantize_dynamic(f"{D}/{src}.onnx", f"{D}/{name}.onnx", weight_type=QuantType.QInt8)
    else:
        quantize_static(f"{D}/{src}.onnx", f"{D}/{name}.onnx", Reader(k), quant_format=QuantFormat.QDQ, **q)
    xn = "x" if isinstance(k, int) else "x4"
    x = rng.standard_normal((7, k) if xn == "x" else (3,) + k).astype(np.float32)
    np.save(f"{D}/{name}_x.npy", x)
    rc1, m1 = run(["compile", f"{D}/{name}.onnx", "-o", f"{D}/{name}_c"])
    rc2, m2 = run(["run", f"{D}/{name}_c", "--input", f"{xn}={D}/{name}_x.npy", "--output", f"{D}/{name}_oc"])
    rc3, m3 = run(["run", f"{D}/{name}.onnx", "--input", f"{xn}={D}/{name}_x.npy", "--output", f"{D}/{name}_oi"])
    if rc1 or rc2 or rc3:
        print(f"FAIL: {name}: {(m1 + m2 + m3).strip()}")
        fails += 1
        return
    ops = [nd["op"] for nd in json.load(open(f"{D}/{name}_c/graph.json"))["nodes"]]
    n8, casts = ops.count("qlinear_int8") + ops.count("qconv2d_int8"), ops.count("cast")
    if reference_instead_of_ort(f"{D}/{name}.onnx"):  # ORT's u8 x s8 products saturate on this CPU (no VNNI)
        ref = reference_run(f"{D}/{name}.onnx", {xn: x})["y"]
    else:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ref = ort.InferenceSession(f"{D}/{name}.onnx", so, providers=["CPUExecutionProvider"]).run(None, {xn: x})[0]
    yc, yi = np.load(f"{D}/{name}_oc/y.npy"), np.load(f"{D}/{name}_oi/y.npy")
    err = max(float(np.max(np.abs(yc - ref))), float(np.max(np.abs(yc - yi))))
    if dynamic:
        y_scale = 0.02 * float(np.max(np.abs(ref)))
        ok = n8 == want_int8 and err <= y_scale
    else:
        y_scale = float(numpy_helper.to_array([t for t in onnx.load(f"{D}/{name}.onnx").graph.initializer if t.name == "y_scale"][0]))
        ok = n8 == want_int8 and (want_int8 == 0 or casts == 0) and err <= y_scale * 1.001
    print(("ok: " if ok else "FAIL: ") + f"{name}: {n8} int8 nodes (want {want_int8}), {casts} casts, "
          f"worst difference {err:.3g} (allowed {y_scale:.3g}: {'2% of the largest output' if dynamic else 'one step of the output grid'})")
    fails += not ok


mlp()
gelu_ffn()
cnn()
for pc in (False, True):
    for at in (QuantType.QUInt8, QuantType.QInt8):
        tag = f"{'pc' if pc else 'pt'}_{'u8' if at == QuantType.QUInt8 else 'i8'}"
        check("mlp", 64, f"mlp_{tag}", 2, per_channel=pc, activation_type=at, weight_type=QuantType.QInt8)
        check("ffn", 48, f"ffn_{tag}", 2, per_channel=pc, activation_type=at, weight_type=QuantType.QInt8)
check("mlp", 64, "mlp_asym", 0, per_channel=False, activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8)
check("cnn", (3, 12, 12), "cnn_pc", 2, per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
check("cnn", (3, 12, 12), "cnn_pt", 0, per_channel=False, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
check("mlp", 64, "mlp_dynamic", 2, dynamic=True)
check("ffn", 48, "ffn_dynamic", 2, dynamic=True)
print(f"{fails} failures")
sys.exit(1 if fails else 0)
