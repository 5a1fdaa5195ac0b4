"""MaxPool with its Indices output (fathom run) against ONNX Runtime on five layouts: 2-D with
storage_order 0 and 1 and uneven pads, 2-D with dilation and ceil_mode, 3-D column-major, 1-D
with pads; integer-valued inputs, so ties happen. Exit 77 when onnx or onnxruntime is missing.
  onnx_maxpool_indices_check.py FATHOM_BIN TMPDIR"""
import subprocess
import sys
try:
    import numpy as np, onnx, onnxruntime as ort
    from onnx import helper, TensorProto
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)"); sys.exit(77)
cases = [
  ("2d_so0", [1,2,7,6], dict(kernel_shape=[3,2], strides=[2,1], pads=[1,0,1,1], storage_order=0)),
  ("2d_so1", [2,3,5,7], dict(kernel_shape=[2,3], strides=[1,2], pads=[0,1,1,1], storage_order=1)),
  ("2d_ceil_dil", [1,1,9,8], dict(kernel_shape=[3,3], strides=[2,2], dilations=[2,1], ceil_mode=1)),
  ("3d_so1", [1,2,4,5,6], dict(kernel_shape=[2,2,3], strides=[2,1,2], storage_order=1)),
  ("1d", [2,3,11], dict(kernel_shape=[3], strides=[2], pads=[1,1])),
]
d = sys.argv[2]
rng = np.random.default_rng(0)
bad = 0
for name, shape, attrs in cases:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    i = helper.make_tensor_value_info("i", TensorProto.INT64, None)
    g = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)], name, [x], [y, i])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]); m.ir_version = 8
    p = f"{d}/{name}.onnx"; onnx.save(m, p)
    xv = rng.integers(-20, 20, size=shape).astype(np.float32)  # ties happen
    np.save(f"{d}/{name}_x.npy", xv)
    try:
        ry, ri = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": xv})
    except Exception as e:
        print(name, "ORT refuses:", str(e)[:120]); bad += 1; continue
    r = subprocess.run([sys.argv[1], "run", p, "--input", f"x={d}/{name}_x.npy", "--output", f"{d}/{name}_out"], capture_output=True, text=True)
    if r.returncode: print(name, "fathom failed", r.stderr[:300]); bad += 1; continue
    fy, fi = np.load(f"{d}/{name}_out/y.npy"), np.load(f"{d}/{name}_out/i.npy")
    ok = fy.shape == ry.shape and np.array_equal(fy, ry) and np.array_equal(fi, ri)
    print(name, "Y equal" if fy.shape == ry.shape and np.array_equal(fy, ry) else "Y DIFFER", "Indices equal" if np.array_equal(fi, ri) else f"Indices differ in {int((fi!=ri).sum())} of {fi.size}")
    bad += not ok
print(f"MaxPool Indices: {len(cases) - bad} of {len(cases)} layouts equal to ONNX Runtime")
sys.exit(1 if bad else 0)
