"""ConvTranspose over 3 spatial dims (3-D U-Nets' and video models' upsampling) run by `fathom run`
against ONNX Runtime: strides, dilations, uneven pads, output_padding, groups, output_shape,
auto_pad SAME_UPPER and SAME_LOWER, with and without a bias, on random inputs (one SAME case
with a kernel shorter than its stride against ONNX's reference implementation instead). Tolerance 1e-5
relative to the largest magnitude. Refusals: output_padding not below the stride, and pads that
leave no output, exit 1 naming the node.

  onnx_conv_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as T, helper as h, numpy_helper, save
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)

from onnx_check_lib import D, fathom_run, finish, report

rng = np.random.default_rng(11)


def model(tag, x, w, bias, attrs):
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(bias, "b")] if bias is not None else [])
    node = h.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias is not None else []), ["y"], **attrs)
    g = h.make_graph([node], "m", [h.make_tensor_value_info("x", T.FLOAT, list(x.shape))], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    path = f"{D}/{tag}.onnx"
    save(m, path)
    return path


def compare(tag, x, w, bias, attrs, reference=False):
    """Against ONNX Runtime, or with reference=True ONNX's reference implementation (where the two
    differ: SAME padding with a kernel smaller than the stride, whose output the spec makes
    input * stride long by adding zeros at the end, where ONNX Runtime stops one short)."""
    path = model(tag, x, w, bias, attrs)
    if reference:
        from onnx import load
        from onnx.reference import ReferenceEvaluator
        ref = ReferenceEvaluator(load(path)).run(None, {"x": x})[0]
    else:
        ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, err = fathom_run(path, {"x": x}, tag)
    y = got["y"] if got else None
    ok = y is not None and y.shape == ref.shape and float(np.max(np.abs(y - ref), initial=0)) <= 1e-5 * max(1.0, float(np.max(np.abs(ref))))
    report(ok, f"{tag} {attrs} -> {ref.shape}" + ("" if ok else f": {err if err else (y.shape, np.max(np.abs(y - ref)) if y.shape == ref.shape else '')}"))


def refused(tag, x, w, attrs, want):
    path = model(tag, x, w, None, attrs)
    got, err = fathom_run(path, {"x": x}, tag)
    report(err is not None and err[0] == 1 and "(ConvTranspose)" in err[1] and want in err[1], f"{tag} refused: {err[1] if err else 'ran'}")


f32 = np.float32
x = rng.standard_normal((2, 4, 3, 4, 5)).astype(f32)
w = rng.standard_normal((4, 3, 3, 2, 3)).astype(f32) * 0.3
b = rng.standard_normal(3).astype(f32)
compare("ct3_plain", x, w, b, {})
compare("ct3_stride", x, w, b, dict(strides=[2, 1, 3]))
compare("ct3_dilation_pads", x, w, None, dict(strides=[2, 2, 1], dilations=[2, 1, 2], pads=[1, 0, 2, 0, 1, 1]))
compare("ct3_output_padding", x, w, b, dict(strides=[3, 2, 2], pads=[1, 1, 1, 1, 0, 1], output_padding=[2, 1, 0]))
compare("ct3_output_shape", x, w, b, dict(strides=[2, 2, 2], output_shape=[8, 9, 12]))
compare("ct3_same_upper", x, w, b, dict(strides=[2, 2, 2], auto_pad="SAME_UPPER"))
compare("ct3_same_upper_short_kernel", x, w, b, dict(strides=[2, 3, 2], auto_pad="SAME_UPPER"), reference=True)
compare("ct3_same_lower", x, w, None, dict(strides=[2, 2, 2], auto_pad="SAME_LOWER"))
wg = rng.standard_normal((4, 2, 2, 3, 2)).astype(f32) * 0.3
compare("ct3_groups", x, wg, rng.standard_normal(4).astype(f32), dict(strides=[2, 1, 2], group=2, pads=[0, 1, 1, 1, 0, 0]))
refused("ct3_bad_output_padding", x, w, dict(strides=[2, 2, 2], output_padding=[2, 0, 0]), "output_padding below the stride")
refused("ct3_pads_too_big", x, w, dict(pads=[9, 0, 0, 9, 0, 0]), "leave no output")
finish("onnx_conv_check")
