"""GridSample and RoiAlign run by `fathom run` against ONNX Runtime on random inputs.

GridSample: every mode (nearest, linear, cubic) with every padding mode (zeros, border,
reflection) and both align_corners, on a grid reaching past the borders (normalized
coordinates in [-1.6, 1.6]), 2-D; linear and nearest over 3-D volumes. RoiAlign: avg and max,
half_pixel and output_half_pixel, sampling_ratio 0 (adaptive) and 2, boxes partly outside the
image. Tolerance: 1e-5 relative to the largest magnitude (fathom samples in f64, ONNX Runtime
in float32). Refusals: a grid whose last dim is not the spatial rank, a batch index out of
range, and (not a sampling op) a Tile whose repeats overflow, exit 1 naming the node.

  onnx_sample_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import subprocess
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as T, helper, save
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)

FATHOM, D = sys.argv[1], sys.argv[2]
fails = 0


def model(op, ins, attrs, opset, path):
    vis = [helper.make_tensor_value_info(n, T.INT64 if a.dtype == np.int64 else T.FLOAT, list(a.shape)) for n, a in ins.items()]
    g = helper.make_graph([helper.make_node(op, list(ins), ["y"], **attrs)], "m", vis, [helper.make_tensor_value_info("y", T.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    save(m, path)


def fathom(path, ins, tag):
    args = [FATHOM, "run", path, "--output", f"{D}/{tag}"]
    for n, a in ins.items():
        np.save(f"{D}/{tag}_{n}.npy", a)
        args += ["--input", f"{n}={D}/{tag}_{n}.npy"]
    p = subprocess.run(args, capture_output=True, text=True)
    return np.load(f"{D}/{tag}/y.npy") if p.returncode == 0 else p.stderr


def compare(op, ins, attrs, opset, tag):
    global fails
    path = f"{D}/{tag}.onnx"
    model(op, ins, attrs, opset, path)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, ins)[0]
    y = fathom(path, ins, tag)
    ok = not isinstance(y, str) and y.shape == ref.shape and float(np.max(np.abs(y - ref), initial=0)) <= 1e-5 * max(1.0, float(np.max(np.abs(ref))))
    print(("ok: " if ok else "FAIL: ") + f"{op} {attrs}" + ("" if ok else f": {y if isinstance(y, str) else np.max(np.abs(y - ref))}"))
    fails += not ok


def refused(op, ins, attrs, opset, tag, want):
    global fails
    path = f"{D}/{tag}.onnx"
    model(op, ins, attrs, opset, path)
    y = fathom(path, ins, tag)
    ok = isinstance(y, str) and f"({op})" in y and want in y
    print(("ok: " if ok else "FAIL: ") + f"{op} refused: {y.strip() if isinstance(y, str) else 'ran'}")
    fails += not ok


rng = np.random.default_rng(7)
x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
grid = rng.uniform(-1.6, 1.6, (2, 5, 4, 2)).astype(np.float32)
k = 0
for mode in ("nearest", "linear", "cubic"):
    for pad in ("zeros", "border", "reflection"):
        for align in (0, 1):
            compare("GridSample", {"x": x, "g": grid}, dict(mode=mode, padding_mode=pad, align_corners=align), 20, f"gs{k}")
            k += 1
compare("GridSample", {"x": x, "g": grid}, dict(mode="bicubic", padding_mode="reflection"), 16, "gs16")
xv = rng.standard_normal((1, 2, 4, 5, 6)).astype(np.float32)
gv = rng.uniform(-1.3, 1.3, (1, 3, 4, 2, 3)).astype(np.float32)
for mode in ("nearest", "linear"):
    for pad in ("zeros", "border", "reflection"):
        compare("GridSample", {"x": xv, "g": gv}, dict(mode=mode, padding_mode=pad), 20, f"gsv{mode}{pad}")
xr = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
rois = np.array([[0, 0, 9, 9], [1.5, 2.2, 7.7, 8.1], [-2, -1, 4, 13], [5, 5, 5.5, 5.2]], np.float32)
bi = np.array([0, 1, 1, 0], np.int64)
for mode in ("avg", "max"):
    for ctm in ("half_pixel", "output_half_pixel"):
        for sr in (0, 2):
            compare("RoiAlign", {"x": xr, "rois": rois, "bi": bi},
                    dict(mode=mode, coordinate_transformation_mode=ctm, sampling_ratio=sr, output_height=3, output_width=4, spatial_scale=0.9),
                    16, f"roi{mode}{ctm}{sr}")
refused("GridSample", {"x": x, "g": grid[..., :1].copy()}, {}, 20, "badgs", "does not fit X")
refused("RoiAlign", {"x": xr, "rois": rois, "bi": np.array([0, 1, 2, 0], np.int64)}, {}, 16, "badroi", "batch_indices[2] = 2 is outside [0, 2)")
# not a sampling op: Tile with repeats whose product with the dim overflows int64 (fuzz_onnx found it)
refused("Tile", {"x": x[0, 0], "r": np.array([2 ** 62, 1], np.int64)}, {}, 13, "badtile", "more than 2^40 elements")
print(f"{fails} failures")
sys.exit(1 if fails else 0)
