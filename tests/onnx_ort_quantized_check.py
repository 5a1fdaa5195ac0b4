"""Int8 models made by ONNX Runtime's quantizer, run by `fathom run` and by ONNX Runtime.

A small MLP (MatMul, Add, Relu) and a small CNN (Conv, Relu, Flatten, MatMul), seeded random
weights, each quantized four ways: quantize_dynamic (DynamicQuantizeLinear, MatMulInteger,
ConvInteger), quantize_static in QDQ format (per tensor and per channel: QuantizeLinear and
DequantizeLinear around the float ops; per channel also with reduce_range, 7-bit weights) and in
QOperator format (QLinearMatMul, QLinearConv).
Then single-op models with inputs chosen to hit the edges (round-half-to-even ties,
saturation, NaN and infinite x, zero, negative and NaN scales, per-axis and blocked scales,
int32 DequantizeLinear, an all-zero DynamicQuantizeLinear, uint8 and int8 MatMulInteger /
ConvInteger with zero points per row, column and channel), and models fathom must refuse
with an error naming the node and the input or attribute.

Tolerances (why not all exact):
  * single ops: equal to ONNX Runtime element for element (integer outputs, and float
    outputs computed by the same float32 operations).
  * the quantized models are compared with ONNX Runtime run op by op
    (ORT_DISABLE_ALL: the graph as written, the semantics fathom implements). Dynamic
    models: DynamicQuantizeLinear and MatMulInteger/ConvInteger are exact and the rest is
    the same float32 Mul and Add, so the outputs are equal within 1e-6 relative (float
    rounding of the bias Add only). QDQ and QOperator models: within one quantization step
    of the output (the scale of the final DequantizeLinear): the float Conv/MatMul between
    DequantizeLinear and QuantizeLinear sums in another order than ONNX Runtime's, and
    QLinearMatMul/QLinearConv requantize acc * multiplier in float64 (as ONNX's reference)
    where ONNX Runtime uses float32, so a value that lands next to a rounding half may round
    the other way: one step there, and an intermediate flip moves the output by less.
  * against ONNX Runtime with its default optimizations (QDQ fused into its own integer
    kernels, dynamic MatMul fused into MatMulIntegerToFloat) the outputs are printed for
    information and must stay within 3 output steps (dynamic: 1e-2 of the output's range).

  onnx_ort_quantized_check.py FATHOM_BIN TMPDIR
Exit 77 when onnx, onnxruntime or its quantization tool is missing."""
import logging
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T, helper, numpy_helper
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime with its quantization tool ({e.name} missing)")
    sys.exit(77)
from onnx_check_lib import (ORT_U8S8_EXACT, REFERENCE_PEER, D, fathom_run, finish,  # noqa: E402 (after the skip)
                            reference_instead_of_ort, reference_run, report)

logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process


def save(m, name):
    m.ir_version = 8
    onnx.checker.check_model(m)
    p = os.path.join(D, name + ".onnx")
    onnx.save(m, p)
    return p


def ort_run(path, feeds, optimize=False):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


# ---- the float models ----
rng = np.random.default_rng(7)


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mlp():
    inits = [numpy_helper.from_array(f32(16, 32, scale=0.3), "w1"), numpy_helper.from_array(f32(32, scale=0.1), "b1"),
             numpy_helper.from_array(f32(32, 8, scale=0.3), "w2"), numpy_helper.from_array(f32(8, scale=0.1), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]), helper.make_node("MatMul", ["r1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", T.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["n", 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def cnn():
    inits = [numpy_helper.from_array(f32(8, 3, 3, 3, scale=0.3), "c1w"), numpy_helper.from_array(f32(8, scale=0.1), "c1b"),
             numpy_helper.from_array(f32(12, 8, 3, 3, scale=0.2), "c2w"), numpy_helper.from_array(f32(12, scale=0.1), "c2b"),
             numpy_helper.from_array(f32(12 * 4 * 4, 10, scale=0.1), "fw")]
    nodes = [helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("MatMul", ["f", "fw"], ["y"])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", T.FLOAT, ["n", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["n", 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


class Reader(CalibrationDataReader):
    def __init__(self, shape):
        r = np.random.default_rng(3)
        self.data = iter([{"x": r.standard_normal(shape).astype(np.float32)} for _ in range(16)])

    def get_next(self):
        return next(self.data, None)


def out_step(path):
    """The scale of the DequantizeLinear that makes graph output 0 (None: the output is not one)."""
    m = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    for n in m.graph.node:
        if n.output[0] == m.graph.output[0].name and n.op_type == "DequantizeLinear":
            return float(np.max(inits[n.input[1]]))
    return None


def check_model(path, what, x, need):
    feeds = {"x": x}
    got, err = fathom_run(path, feeds, os.path.basename(path)[:-5])
    ops = sorted({n.op_type for n in onnx.load(path).graph.node})
    report(set(need) <= set(ops), f"{what}: the quantizer wrote {', '.join(need)}")
    if got is None:
        report(False, f"{what}: fathom refused it: {err}")
        return
    step = out_step(path)
    use_ref = reference_instead_of_ort(path)
    for optimize in (False, True):
        want = (reference_run(path, feeds) if use_ref and not optimize else ort_run(path, feeds, optimize))["y"]
        d = float(np.max(np.abs(got["y"] - want)))
        peer = REFERENCE_PEER if use_ref and not optimize else "ORT"
        if optimize and not ORT_U8S8_EXACT:  # its fused integer kernels saturate here: printed, not checked
            print(f"info: {what} vs ORT optimized: max |diff| {d:.3g}{f' ({d / step:.3g} steps)' if step else ''}, not checked: "
                  "without VNNI ONNX Runtime's u8 x s8 products saturate (onnx_check_lib.ort_u8s8_exact)")
            continue
        if step is None:  # float output: dynamic quantization
            tol = 1e-6 * float(np.max(np.abs(want))) if not optimize else 1e-2 * float(np.ptp(want))
            msg = f"{what} ({', '.join(ops)}) vs {peer}{' optimized' if optimize else ''}: max |diff| {d:.3g} (allowed {tol:.3g})"
        else:
            tol = step * (3 if optimize else 1) * (1 + 1e-6)
            msg = (f"{what} ({', '.join(ops)}) vs {peer}{' optimized' if optimize else ''}: max |diff| {d / step:.3g} steps "
                   f"of {step:.3g} (allowed {tol / step:.3g}); {int(np.sum(got['y'] != want))} of {want.size} differ")
        report(got["y"].shape == want.shape and d <= tol, msg)


def quantized_models():
    for name, make, shape in (("mlp", mlp, (64, 16)), ("cnn", cnn, (8, 3, 8, 8))):
        fp = save(make(), name)
        x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
        q = os.path.join(D, f"{name}_dyn.onnx")
        quantize_dynamic(fp, q, weight_type=QuantType.QUInt8 if name == "cnn" else QuantType.QInt8)
        check_model(q, f"{name} quantize_dynamic", x, ["DynamicQuantizeLinear", "MatMulInteger"] + ["ConvInteger"] * (name == "cnn"))
        # rr: reduce_range (7-bit weights, codes in [-64, 64]: the AVX2 int8 tile's narrow form from 16 rows)
        for fmt, per_channel, act, rr in ((QuantFormat.QDQ, False, QuantType.QUInt8, False), (QuantFormat.QDQ, True, QuantType.QInt8, False),
                                          (QuantFormat.QDQ, True, QuantType.QUInt8, True),
                                          (QuantFormat.QOperator, False, QuantType.QUInt8, False),
                                          (QuantFormat.QOperator, True, QuantType.QUInt8, False)):
            tag = f"{name}_{'qdq' if fmt == QuantFormat.QDQ else 'qop'}_{'pc' if per_channel else 'pt'}_{act.name}{'_rr' if rr else ''}"
            q = os.path.join(D, tag + ".onnx")
            # QOperator's Add and Relu would be com.microsoft ops (QLinearAdd): MatMul and Conv only
            quantize_static(fp, q, Reader(shape), quant_format=fmt, per_channel=per_channel, activation_type=act,
                            weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Conv"], reduce_range=rr)
            check_model(q, f"{name} quantize_static {fmt.name} {'per channel' if per_channel else 'per tensor'} "
                        f"{act.name} activations{', reduce_range' if rr else ''}", x, ["QuantizeLinear", "DequantizeLinear"] if fmt == QuantFormat.QDQ else
                        ["QuantizeLinear", "QLinearMatMul"] + ["QLinearConv"] * (name == "cnn"))


# ---- single ops against ONNX Runtime, element for element ----
ETYPE = {np.dtype(np.float32): T.FLOAT, np.dtype(np.float16): T.FLOAT16, np.dtype(np.uint8): T.UINT8,
         np.dtype(np.int8): T.INT8, np.dtype(np.int32): T.INT32}


def one_op(tag, op, feeds, consts, n_out=1, opset=13, order=None, **attrs):
    """A model of one node: feeds are graph inputs, consts initializers; the node's inputs
    in the order given (feeds first, or as order names them; a None const omits that input)."""
    names = order or list(feeds) + list(consts)
    ins = [helper.make_tensor_value_info(k, ETYPE[v.dtype], v.shape) for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items() if v is not None]
    outs = [onnx.ValueInfoProto(name=f"y{i}") for i in range(n_out)]  # types left to inference
    node = helper.make_node(op, [k if (k in feeds or consts[k] is not None) else "" for k in names],
                            [f"y{i}" for i in range(n_out)], name=tag, **attrs)
    g = helper.make_graph([node], tag, ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def check_op(tag, op, feeds, consts, n_out=1, opset=13, order=None, **attrs):
    p = one_op(tag, op, feeds, consts, n_out, opset, order, **attrs)
    use_ref = reference_instead_of_ort(p)
    want = reference_run(p, feeds) if use_ref else ort_run(p, feeds)
    peer = REFERENCE_PEER if use_ref else "ORT"
    got, err = fathom_run(p, feeds, tag)
    if got is None:
        report(False, f"{tag}: fathom refused it: {err}")
        return
    bad = [k for k in want if not same(got[k], want[k])]
    report(not bad, f"{tag} ({op}): " + (f"equal to {peer}" if not bad else
           "; ".join(f"{k} {got[k].dtype}{got[k].shape} {got[k].ravel()[:8]} vs {peer} {want[k].dtype}{want[k].shape} {want[k].ravel()[:8]}" for k in bad)))


def single_ops():
    r = np.random.default_rng(5)
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 300, -300, np.nan, np.inf, -np.inf, 0, -0.0, 1e-30, 127.5],
                    np.float32)
    for zdt in (np.uint8, np.int8):
        z = np.array(3 if zdt == np.uint8 else -3, zdt)
        for s in (0.5, 1.0, 0.0, -2.0, np.nan):
            check_op(f"q_{zdt.__name__}_s{s}", "QuantizeLinear", {"x": ties}, {"s": np.array(s, np.float32), "z": z})
    check_op("q_nozp", "QuantizeLinear", {"x": ties}, {"s": np.array(0.25, np.float32)})
    x4 = (r.standard_normal((2, 3, 4, 5)) * 50).astype(np.float32)
    check_op("q_axis1", "QuantizeLinear", {"x": x4}, {"s": np.array([0.5, 0.7, 1.3], np.float32),
                                                       "z": np.array([1, -5, 9], np.int8)})
    check_op("q_axis-1", "QuantizeLinear", {"x": x4}, {"s": (r.random(5) + 0.1).astype(np.float32),
                                                        "z": r.integers(0, 255, 5).astype(np.uint8)}, axis=-1)
    check_op("q_blocked", "QuantizeLinear", {"x": x4}, {"s": (r.random((2, 3, 4, 2)) + 0.1).astype(np.float32),
                                                         "z": r.integers(0, 255, (2, 3, 4, 2)).astype(np.uint8)},
             opset=21, axis=3, block_size=3)
    check_op("q_output_dtype_int8", "QuantizeLinear", {"x": x4}, {"s": np.array(0.3, np.float32)}, opset=21,
             output_dtype=T.INT8)
    check_op("q_f16", "QuantizeLinear", {"x": x4.astype(np.float16)}, {"s": np.array(0.3, np.float16),
                                                                      "z": np.array(4, np.uint8)}, opset=19)
    q4 = r.integers(0, 256, (2, 3, 4, 5)).astype(np.uint8)
    check_op("dq_u8", "DequantizeLinear", {"x": q4}, {"s": np.array(0.37, np.float32), "z": np.array(128, np.uint8)})
    check_op("dq_i8_axis0", "DequantizeLinear", {"x": q4.astype(np.int8)},
             {"s": np.array([0.1, 3.3], np.float32), "z": np.array([-7, 100], np.int8)}, axis=0)
    check_op("dq_i32", "DequantizeLinear", {"x": r.integers(-2**31, 2**31 - 1, 20).astype(np.int32)},
             {"s": np.array(1e-3, np.float32)})
    check_op("dq_f16", "DequantizeLinear", {"x": q4}, {"s": np.array(0.37, np.float16), "z": np.array(128, np.uint8)}, opset=19)
    check_op("dq_blocked", "DequantizeLinear", {"x": q4}, {"s": (r.random((2, 2, 4, 5)) + 0.1).astype(np.float32),
                                                            "z": r.integers(0, 255, (2, 2, 4, 5)).astype(np.uint8)},
             opset=21, axis=1, block_size=2)
    for tag, xv in (("dql_zero", np.zeros((3, 4), np.float32)), ("dql_pos", (r.random((3, 4)) * 7).astype(np.float32)),
                    ("dql_neg", -(r.random((3, 4)) * 7).astype(np.float32)), ("dql_mixed", x4),
                    ("dql_nan", np.array([np.nan, 1.0, -2.0], np.float32))):
        check_op(tag, "DynamicQuantizeLinear", {"x": xv}, {}, n_out=3, opset=11)
    a, b = r.integers(0, 256, (2, 5, 7)).astype(np.uint8), r.integers(-128, 128, (7, 6)).astype(np.int8)
    check_op("mmi_u8_i8", "MatMulInteger", {"a": a, "b": b}, {"za": np.array(131, np.uint8), "zb": np.array(-3, np.int8)}, opset=10)
    check_op("mmi_u8_u8_col", "MatMulInteger", {"a": a, "b": b.view(np.uint8)},
             {"za": np.array(7, np.uint8), "zb": r.integers(0, 256, 6).astype(np.uint8)}, opset=10)
    check_op("mmi_i8_i8", "MatMulInteger", {"a": a.view(np.int8), "b": b}, {}, opset=10)
    big = r.integers(0, 256, (3, 2000)).astype(np.uint8)  # long sums: exactness of the f64 products
    check_op("mmi_long", "MatMulInteger", {"a": big, "b": big.T.copy()}, {"za": np.array(0, np.uint8), "zb": np.array(255, np.uint8)},
             opset=10)
    # ONNX Runtime's ConvInteger takes one w zero point (per channel: test_convinteger_with_padding in the conformance suite)
    x, w = r.integers(0, 256, (2, 4, 9, 8)).astype(np.uint8), r.integers(0, 256, (6, 2, 3, 3)).astype(np.uint8)
    check_op("convi", "ConvInteger", {"x": x, "w": w}, {"zx": np.array(77, np.uint8), "zw": np.array(201, np.uint8)},
             opset=10, group=2, pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])
    check_op("convi_same", "ConvInteger", {"x": x, "w": w[:, :, :2, :]}, {"zx": np.array(3, np.uint8)}, opset=10, group=2,
             auto_pad="SAME_UPPER")
    xs, ws, ys = np.array(0.05, np.float32), (r.random(6) * 0.02 + 0.001).astype(np.float32), np.array(0.3, np.float32)
    check_op("qlconv", "QLinearConv", {"x": x, "w": w.view(np.int8)},
             {"xs": xs, "zx": np.array(128, np.uint8), "ws": ws, "zw": np.zeros(6, np.int8), "ys": ys, "zy": np.array(120, np.uint8),
              "b": r.integers(-5000, 5000, 6).astype(np.int32)}, opset=10, group=2, pads=[1, 1, 1, 1],
             order=["x", "xs", "zx", "w", "ws", "zw", "ys", "zy", "b"])
    check_op("qlmm", "QLinearMatMul", {"a": a, "b": b}, {"sa": np.array(0.02, np.float32), "za": np.array(128, np.uint8),
                                                         "sb": (r.random(6) * 0.01).astype(np.float32), "zb": np.zeros(6, np.int8),
                                                         "sy": np.array(0.1, np.float32), "zy": np.array(10, np.uint8)}, opset=10,
             order=["a", "sa", "za", "b", "sb", "zb", "sy", "zy"])


# ---- what fathom must refuse, naming the node and the input or attribute ----
def refusals():
    x = np.zeros((2, 3), np.float32)
    cases = [
        ("bad_mmi_float", "MatMulInteger", {"a": x, "b": np.zeros((3, 2), np.uint8)}, {}, {}, 10,
         ["bad_mmi_float", "MatMulInteger", "'a'", "f32"]),
        ("bad_mmi_zp_shape", "MatMulInteger", {"a": np.zeros((2, 3), np.uint8), "b": np.zeros((3, 2), np.uint8)},
         {"za": np.zeros(3, np.uint8)}, {}, 10, ["'za'", "shape [3]"]),
        ("bad_q_axis", "QuantizeLinear", {"x": x}, {"s": np.ones(4, np.float32)}, {"axis": 1}, 13, ["bad_q_axis", "'s'", "[4]"]),
        ("bad_q_zp_shape", "QuantizeLinear", {"x": x}, {"s": np.ones(3, np.float32), "z": np.zeros(2, np.uint8)}, {}, 13,
         ["'z'", "[2]"]),
        ("bad_q_int4", "QuantizeLinear", {"x": x}, {"s": np.ones(1, np.float32)}, {"output_dtype": 22}, 21, ["dtype", "int4"]),
        ("bad_q_float8", "QuantizeLinear", {"x": x}, {"s": np.ones(1, np.float32)}, {"output_dtype": 17}, 21,
         ["dtype", "float8e4m3fn"]),
        ("bad_q_block", "QuantizeLinear", {"x": x}, {"s": np.ones((2, 1), np.float32)}, {"axis": 1, "block_size": 2}, 21,
         ["block_size", "'s'"]),
        ("bad_dq_i32_zp", "DequantizeLinear", {"x": np.zeros(3, np.int32)}, {"s": np.ones(1, np.float32), "z": np.array(2, np.int32)},
         {}, 13, ["int32", "zero point"]),
        ("bad_dq_zp_dtype", "DequantizeLinear", {"x": np.zeros(3, np.uint8)}, {"s": np.ones(1, np.float32), "z": np.array(2, np.int8)},
         {}, 13, ["'z'", "i8"]),
        ("bad_dql_f16", "DynamicQuantizeLinear", {"x": x.astype(np.float16)}, {}, {}, 11, ["f16"]),
    ]
    for tag, op, feeds, consts, attrs, opset, needles in cases:
        p = one_op(tag, op, feeds, consts, 1, opset, None, **attrs)
        got, err = fathom_run(p, feeds, tag)
        ok = got is None and err[0] == 1 and all(n in err[1] for n in needles)
        report(ok, f"{tag}: refused naming {', '.join(needles)}" + ("" if ok else f"; got: {err if err else 'outputs'}"))


if __name__ == "__main__":
    os.makedirs(D, exist_ok=True)
    single_ops()
    refusals()
    quantized_models()
    finish("onnx_ort_quantized_check")
