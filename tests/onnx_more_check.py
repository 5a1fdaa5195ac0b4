"""The ops of src/onnx/onnx_ops_more.c (BitCast, DeformConv, TensorScatter) run by `fathom run`
against ONNX Runtime 1.32, on shapes and attributes other than ONNX's own node tests.

BitCast (opset 26; ONNX allows no change of width, so there is no size change to test): f32 <->
i32, f64 <-> i64, i8 <-> u8, bool <-> u8, bool <-> i8, f16 -> bf16 (read back through a Cast to
f32, since .npy has no bfloat16) and bf16 -> f16 (made by a Cast from f32), the special values
(NaN payloads, infinities, -0, denormals) and a same-type cast; against ONNX Runtime. A byte other
than 0 and 1 read as bool is true: ONNX Runtime keeps the byte, fathom stores 1, so bool outputs
compare as truth values.

DeformConv (opset 19 and 22): offset groups, a mask, weight groups, strides, dilations, uneven
pads, a bias, a batch of 2, non-square images and kernels, offsets reaching outside the input,
NaN, infinite and huge offsets (those taps read 0), float64, float16, bfloat16 (through Casts); against ONNX Runtime (2-D: ONNX Runtime runs only 4-D X). 1-D against ONNX
Runtime on the same model as 2-D with a height of 1 (zero height offsets). 3-D against a numpy
deformable convolution written here (ONNX Runtime and ONNX's reference run only 2-D), which is
itself checked against ONNX Runtime on the 2-D cases.

TensorScatter (opset 24): linear with and without write_indices, an update as long as the cache
and an empty one, circular wrapping past the end, axis 1 of a 3-D cache, axis -3 of a 5-D one,
float16, int64 and bool caches; against ONNX Runtime. Circular mode with a negative and a large
(2^40) write index against ONNX's reference (onnx.reference.ReferenceEvaluator, np.mod): ONNX
Runtime refuses negative write indices; fathom follows the reference.

Where ONNX Runtime has no kernel for a node's types (BitCast of bool), ONNX's reference instead;
each report line says which.

Every model also runs with --device check, which must give the CPU's outputs bit for bit. Then
models fathom must refuse with exit code 1 and a message naming the node and the problem.

Tolerances, relative to the largest magnitude of the reference (at least 1): float32 1e-5,
float64 1e-11, float16 2e-3; integers and bools exact.

  onnx_more_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import itertools
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T, helper
    from onnx.helper import np_dtype_to_tensor_dtype
    from onnx.reference import ReferenceEvaluator
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)
from onnx_check_lib import D, fathom_run, finish, report  # noqa: E402 (after the skip above)

TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-11, np.dtype(np.float16): 2e-3}
rng = np.random.default_rng(19)


def save(tag, nodes, feeds, out_type, opset):
    """The nodes reading the feeds (by name), giving y of element type out_type."""
    ins = [helper.make_tensor_value_info(k, np_dtype_to_tensor_dtype(v.dtype), None) for k, v in feeds.items()]
    g = helper.make_graph(nodes, tag, ins, [helper.make_tensor_value_info("y", out_type, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


def one(tag, op, feeds, out_type, opset, **attrs):
    """One node reading the feeds in order (DeformConv: an empty name for B when only mask is given)."""
    ins = list(feeds)
    if op == "DeformConv" and "mask" in feeds and "B" not in feeds:
        ins.insert(3, "")
    return save(tag, [helper.make_node(op, ins, ["y"], name=tag, **attrs)], feeds, out_type, opset)


def close(got, want, bits=False):
    """Within the tolerance; bits: the same bytes (BitCast's outputs, NaN payloads included)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    if bits and want.dtype != np.bool_:
        ok = got.tobytes() == want.tobytes()
        return ok, "the same bytes" if ok else f"{got.ravel()[:8]} vs {want.ravel()[:8]}"
    if want.dtype == np.bool_:  # as truth values: a byte other than 0 and 1 is true
        ok = np.array_equal(got.view(np.uint8) != 0, want.view(np.uint8) != 0)
        return ok, "exact" if ok else f"{got.ravel()[:8]} vs {want.ravel()[:8]}"
    if want.dtype not in TOL:
        ok = got.tobytes() == want.tobytes()
        return ok, "exact" if ok else f"{got.ravel()[:8]} vs {want.ravel()[:8]}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    d = float(np.max(np.abs(g - w), initial=0))
    return d <= TOL[want.dtype] * max(1.0, float(np.max(np.abs(w), initial=0))), f"max |diff| {d:.3g}"


def ort_session(path):
    so = ort.SessionOptions()
    so.log_severity_level = 3  # not TensorScatter's notes on copying the cache
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def reference(path, feeds, ref):
    """(y, what computed it): ref "ort" falls back to ONNX's reference where ONNX Runtime has no
    kernel for the node's types."""
    lacks = ""
    if isinstance(ref, str) and ref == "ort":
        try:
            return ort_session(path).run(None, feeds)[0], "ort"
        except ort.capi.onnxruntime_pybind11_state.NotImplemented:
            ref, lacks = "onnx", " (ONNX Runtime lacks it)"
    if isinstance(ref, str) and ref == "onnx":
        return ReferenceEvaluator(path).run(None, feeds)[0], "onnx reference" + lacks
    return (np.asarray(ref[0]), ref[1]) if isinstance(ref, tuple) else (np.asarray(ref), "numpy")


def compare(tag, path, feeds, ref="ort", what="", bits=False):
    """fathom's y (cpu and check) against ref: "ort", "onnx" (ONNX's reference evaluator), an array
    (numpy's) or (array, what computed it)."""
    want, by = reference(path, feeds, ref)
    got, err = fathom_run(path, feeds, tag)
    if err:
        report(False, f"{tag}: exit {err[0]}: {err[1][:600]}")
        return
    ok, why = close(got["y"], want, bits)
    report(ok, f"{tag}: {what} {[v.shape for v in feeds.values()]} vs {by}: {why}")
    chk, err = fathom_run(path, feeds, tag, device="check")
    same = not err and chk["y"].dtype == got["y"].dtype and chk["y"].shape == got["y"].shape and \
        chk["y"].tobytes() == got["y"].tobytes()
    report(same, f"{tag}: --device check gives the CPU's output" + (f": {err}" if err else ""))


def refused(tag, path, feeds, op, want):
    got, err = fathom_run(path, feeds, tag)
    ok = err is not None and err[0] == 1 and f"({op})" in err[1] and want in err[1]
    report(ok, f"{tag}: {op} refused: {err[1].strip()[:300] if err else 'ran'}")


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- BitCast ----

def bitcast_cases():
    special = np.array([np.nan, -np.inf, np.inf, -0.0, 1e-45, 3.4e38, -1.5, 0.1], np.float32)
    special_bits = np.frombuffer(np.array([0x7fc00001, 0xffa00000], np.uint32).tobytes(), np.float32)  # NaN payloads
    x32 = np.concatenate([special, special_bits, f32(6)]).reshape(4, 4)
    cases = [("f32_i32", x32, T.INT32), ("i32_f32", rng.integers(-2**31, 2**31, (3, 5)).astype(np.int32), T.FLOAT),
             ("f64_i64", np.array([[np.nan, -0.0, 5e-324], [np.inf, 1e308, -2.5]]), T.INT64),
             ("i64_f64", rng.integers(-2**62, 2**62, (2, 2, 3)), T.DOUBLE),
             ("i8_u8", rng.integers(-128, 128, (7,)).astype(np.int8), T.UINT8),
             ("u8_i8", rng.integers(0, 256, (2, 9)).astype(np.uint8), T.INT8),
             ("bool_u8", rng.integers(0, 2, (3, 3)).astype(np.bool_), T.UINT8),
             ("u8_bool", np.array([0, 1, 2, 255, 0, 128], np.uint8), T.BOOL),
             ("i8_bool", np.array([[0, -1], [1, 0]], np.int8), T.BOOL), ("bool_i8", np.array([True, False, True]), T.INT8),
             ("f32_f32", x32, T.FLOAT), ("scalar_f64_i64", np.array(-3.75), T.INT64)]
    for tag, x, to in cases:
        compare(f"bitcast_{tag}", one(f"bitcast_{tag}", "BitCast", {"x": x}, to, 26, to=to), {"x": x}, what=f"BitCast to={to}", bits=True)
    h16 = np.concatenate([np.array([np.nan, np.inf, -0.0, 6e-8, 65504], np.float16), f32(7).astype(np.float16)]).reshape(3, 4)
    p = save("bitcast_f16_bf16", [helper.make_node("BitCast", ["x"], ["b"], to=T.BFLOAT16), helper.make_node("Cast", ["b"], ["y"], to=T.FLOAT)],
             {"x": h16}, T.FLOAT, 26)
    compare("bitcast_f16_bf16", p, {"x": h16}, what="BitCast f16 -> bf16, Cast to f32", bits=True)
    xf = np.concatenate([np.array([1.0, -2.5, 1e-40, 3e38], np.float32), f32(4)])
    p = save("bitcast_bf16_f16", [helper.make_node("Cast", ["x"], ["b"], to=T.BFLOAT16), helper.make_node("BitCast", ["b"], ["y"], to=T.FLOAT16)],
             {"x": xf}, T.FLOAT16, 26)
    compare("bitcast_bf16_f16", p, {"x": xf}, what="Cast f32 -> bf16, BitCast to f16", bits=True)


# ---- DeformConv ----

def np_deform_conv(x, w, off, b=None, mask=None, strides=None, pads=None, dilations=None, group=1, offset_group=1):
    """Deformable convolution over any number of spatial dims, in float64: multilinear sampling
    with zeros outside the input, one loop per output position and tap."""
    n, c = x.shape[:2]
    oc, k = w.shape[0], w.shape[2:]
    r = len(k)
    strides, dilations, pads = strides or [1] * r, dilations or [1] * r, pads or [0] * (2 * r)
    outs = off.shape[2:]
    K = int(np.prod(k))
    off = off.astype(np.float64).reshape(n, offset_group, K, r, *outs)
    mask = np.ones((n, offset_group, K, *outs)) if mask is None else mask.astype(np.float64).reshape(n, offset_group, K, *outs)
    cols = np.zeros((n, c, K, *outs))
    cg = c // offset_group
    xs = x.astype(np.float64)
    for bi, ch, t in itertools.product(range(n), range(c), range(K)):
        kt, g = np.unravel_index(t, k), ch // cg
        for o in np.ndindex(*outs):
            pos = [o[d] * strides[d] - pads[d] + kt[d] * dilations[d] + off[(bi, g, t, d) + o] for d in range(r)]
            fl = [int(np.floor(p)) for p in pos]
            v = 0.0
            for corner in itertools.product((0, 1), repeat=r):
                idx = [fl[d] + corner[d] for d in range(r)]
                if all(0 <= idx[d] < x.shape[2 + d] for d in range(r)):
                    wt = np.prod([(pos[d] - fl[d]) if corner[d] else (1 - (pos[d] - fl[d])) for d in range(r)])
                    v += wt * xs[(bi, ch) + tuple(idx)]
            cols[(bi, ch, t) + o] = v * mask[(bi, g, t) + o]
    y = np.zeros((n, oc, *outs))
    ocg, icg = oc // group, c // group
    for gi in range(group):
        wg = w[gi * ocg:(gi + 1) * ocg].astype(np.float64).reshape(ocg, icg * K)
        cg_ = cols[:, gi * icg:(gi + 1) * icg].reshape(n, icg * K, -1)
        y[:, gi * ocg:(gi + 1) * ocg] = np.einsum("ok,nkp->nop", wg, cg_).reshape(n, ocg, *outs)
    if b is not None:
        y += b.astype(np.float64).reshape(1, oc, *([1] * r))
    return y.astype(x.dtype)


def bf16_round(a):
    """float32 values rounded to bfloat16's (to nearest, ties to even), as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def out_sizes(xs, k, strides, pads, dil):
    r = len(k)
    return [(xs[d] + pads[d] + pads[d + r] - ((k[d] - 1) * dil[d] + 1)) // strides[d] + 1 for d in range(r)]


def dc_feeds(n, c, oc, xs, k, group=1, og=1, strides=None, pads=None, dil=None, scale=1.5, bias=True, mask=True, dt=np.float32):
    r = len(k)
    outs = out_sizes(xs, k, strides or [1] * r, pads or [0] * (2 * r), dil or [1] * r)
    K = int(np.prod(k))
    f = {"X": rng.standard_normal((n, c, *xs)), "W": rng.standard_normal((oc, c // group, *k)),
         "offset": rng.standard_normal((n, og * K * r, *outs)) * scale}
    if bias:
        f["B"] = rng.standard_normal(oc)
    if mask:
        f["mask"] = rng.uniform(0, 1, (n, og * K, *outs))
    return {kk: v.astype(dt) for kk, v in f.items()}


def dc_attrs(k, group, og, strides, pads, dil):
    a = {"kernel_shape": list(k)}
    for name, v in (("strides", strides), ("pads", pads), ("dilations", dil)):
        if v:
            a[name] = v
    if group != 1:
        a["group"] = group
    if og != 1:
        a["offset_group"] = og
    return a


def deform_conv_cases():
    two_d = [  # tag, N, C, oC, spatial, kernel, group, offset_group, strides, pads, dilations, offset scale, bias, mask, dtype, opset
        ("dc_full", 2, 4, 6, (7, 6), (3, 2), 2, 2, [2, 1], [1, 0, 2, 1], [1, 2], 1.5, True, True, np.float32, 22),
        ("dc_og4_g1", 1, 8, 3, (5, 5), (3, 3), 1, 4, None, [1, 1, 1, 1], None, 1.0, True, False, np.float32, 19),
        ("dc_plain", 1, 3, 2, (6, 4), (2, 2), 1, 1, None, None, None, 0.7, False, False, np.float32, 22),
        ("dc_far", 2, 2, 2, (4, 5), (2, 3), 1, 1, [1, 2], [2, 2, 0, 1], None, 6.0, True, True, np.float32, 22),
        ("dc_groups3", 1, 6, 3, (5, 4), (1, 2), 3, 3, [1, 1], None, [2, 1], 2.0, False, True, np.float32, 22),
        ("dc_f64", 2, 2, 4, (5, 6), (2, 2), 2, 1, [2, 2], [1, 1, 1, 1], None, 1.2, True, True, np.float64, 22),
    ]
    for tag, n, c, oc, xs, k, g, og, st, pd, dl, sc, bias, mask, dt, opset in two_d:
        f = dc_feeds(n, c, oc, xs, k, g, og, st, pd, dl, sc, bias, mask, dt)
        p = one(tag, "DeformConv", f, np_dtype_to_tensor_dtype(np.dtype(dt)), opset, **dc_attrs(k, g, og, st, pd, dl))
        what = f"DeformConv group {g} offset_group {og} strides {st} pads {pd} dilations {dl}"
        compare(tag, p, f, what=what)
        want = ort_session(p).run(None, f)[0]
        mine = np_deform_conv(f["X"], f["W"], f["offset"], f.get("B"), f.get("mask"), st, pd, dl, g, og)
        ok, why = close(mine, want)
        report(ok, f"{tag}: the numpy deformable convolution of this check equals ONNX Runtime: {why}")
    # offsets that are NaN, infinite or far outside: those taps read nothing (0), as in ONNX Runtime
    f = dc_feeds(2, 2, 3, (4, 4), (2, 2), 1, 1, None, [1, 1, 0, 0], None, 1.0, True, True)
    f["offset"].flat[[0, 5, 9, 17, 40, 77]] = [np.nan, np.inf, -np.inf, 1e30, -1e30, np.nan]
    compare("dc_nonfinite", one("dc_nonfinite", "DeformConv", f, T.FLOAT, 22, pads=[1, 1, 0, 0]), f,
            what="DeformConv NaN, infinite and huge offsets")
    # float16: against ONNX Runtime on the same inputs as float32, the output rounded
    f = dc_feeds(1, 4, 4, (5, 5), (3, 3), 2, 2, None, [1, 1, 1, 1], None, 1.0, True, True, np.float16)
    p32 = one("dc_f16_as_f32", "DeformConv", {kk: v.astype(np.float32) for kk, v in f.items()}, T.FLOAT, 22,
              **dc_attrs((3, 3), 2, 2, None, [1, 1, 1, 1], None))
    want = ort_session(p32).run(None, {kk: v.astype(np.float32) for kk, v in f.items()})[0]
    p = one("dc_f16", "DeformConv", f, T.FLOAT16, 22, **dc_attrs((3, 3), 2, 2, None, [1, 1, 1, 1], None))
    compare("dc_f16", p, f, ref=(want.astype(np.float16), "ort"), what="DeformConv float16 (ORT's float32 result, rounded)")
    # bfloat16 (Cast from and to float32 around it; .npy has no bfloat16): ONNX Runtime's float32 on the rounded inputs, rounded
    f = dc_feeds(1, 4, 2, (5, 6), (2, 3), 2, 2, [1, 2], [1, 0, 0, 1], None, 1.0, True, True)
    ins = list(f)
    nodes = [helper.make_node("Cast", [k], [k + "_bf"], to=T.BFLOAT16) for k in ins] + \
        [helper.make_node("DeformConv", [k + "_bf" for k in ins], ["y_bf"], group=2, offset_group=2, strides=[1, 2], pads=[1, 0, 0, 1]),
         helper.make_node("Cast", ["y_bf"], ["y"], to=T.FLOAT)]
    p = save("dc_bf16", nodes, f, T.FLOAT, 22)
    fr = {k: bf16_round(v) for k, v in f.items()}
    p32 = one("dc_bf16_as_f32", "DeformConv", fr, T.FLOAT, 22, **dc_attrs((2, 3), 2, 2, [1, 2], [1, 0, 0, 1], None))
    compare("dc_bf16", p, f, ref=(bf16_round(ort_session(p32).run(None, fr)[0]), "ort"), what="DeformConv bfloat16 (ORT's float32 result, rounded)")
    # 1-D: ONNX Runtime on the same convolution as 2-D with a height of 1 and zero height offsets
    f = dc_feeds(2, 4, 3, (9,), (3,), 1, 2, [2], [1, 2], [2], 2.0, True, True)
    p = one("dc_1d", "DeformConv", f, T.FLOAT, 22, **dc_attrs((3,), 1, 2, [2], [1, 2], [2]))
    n, _, o = f["offset"].shape
    off2 = np.stack([np.zeros((n, 2, 3, o), np.float32), f["offset"].reshape(n, 2, 3, o)], axis=3).reshape(n, 12, 1, o)
    f2 = {"X": f["X"][:, :, None], "W": f["W"][:, :, None], "offset": off2, "B": f["B"], "mask": f["mask"][:, :, None]}
    p2 = one("dc_1d_as_2d", "DeformConv", f2, T.FLOAT, 22, **dc_attrs((1, 3), 1, 2, [1, 2], [0, 1, 0, 2], [1, 2]))
    want = ort_session(p2).run(None, f2)[0][:, :, 0]
    compare("dc_1d", p, f, ref=(want, "ort"), what="DeformConv 1-D (ONNX Runtime's 2-D of height 1)")
    # 3-D: the numpy convolution above
    f = dc_feeds(1, 4, 2, (4, 5, 3), (2, 2, 2), 2, 2, [1, 2, 1], [1, 0, 0, 0, 1, 1], [1, 1, 2], 1.0, True, True)
    p = one("dc_3d", "DeformConv", f, T.FLOAT, 22, **dc_attrs((2, 2, 2), 2, 2, [1, 2, 1], [1, 0, 0, 0, 1, 1], [1, 1, 2]))
    want = np_deform_conv(f["X"], f["W"], f["offset"], f["B"], f["mask"], [1, 2, 1], [1, 0, 0, 0, 1, 1], [1, 1, 2], 2, 2)
    compare("dc_3d", p, f, ref=want, what="DeformConv 3-D (numpy)")


# ---- TensorScatter ----

def tensor_scatter_cases():
    cases = [  # tag, past shape, update shape, write_indices (None: omitted), attrs, reference
        ("ts_linear_4d", (3, 2, 6, 4), (3, 2, 2, 4), [0, 4, 1], {}, "ort"),
        ("ts_no_indices", (2, 5, 3), (2, 3, 3), None, {"axis": 1}, "ort"),
        ("ts_axis1_3d", (2, 7, 3), (2, 2, 3), [5, 0], {"axis": 1, "mode": "linear"}, "ort"),
        ("ts_axis_m3_5d", (2, 3, 5, 2, 2), (2, 3, 3, 2, 2), [2, 1], {"axis": -3}, "ort"),
        ("ts_circular", (2, 2, 5, 3), (2, 2, 3, 3), [4, 1], {"mode": "circular"}, "ort"),
        ("ts_circular_big", (3, 4, 2), (3, 4, 2), [-1, 9, 1 << 40], {"mode": "circular", "axis": 1}, "onnx"),
        ("ts_full", (2, 3, 2), (2, 3, 2), [0, 0], {"axis": 1}, "ort"),
        ("ts_empty_update", (2, 4, 3), (2, 0, 3), [4, 2], {"axis": 1}, "ort"),
    ]
    for tag, ps, us, wi, attrs, ref in cases:
        f = {"past": f32(*ps), "upd": f32(*us)}
        if wi is not None:
            f["wi"] = np.array(wi, np.int64)
        p = one(tag, "TensorScatter", f, T.FLOAT, 24, **attrs)
        compare(tag, p, f, ref=ref, what=f"TensorScatter {attrs}")
    for tag, dt, ref in (("ts_f16", np.float16, "ort"), ("ts_i64", np.int64, "ort"), ("ts_bool", np.bool_, "ort")):
        f = {"past": (rng.standard_normal((2, 3, 4)) * 9).astype(dt), "upd": (rng.standard_normal((2, 3, 2)) * 9).astype(dt),
             "wi": np.array([1, 2], np.int64)}
        p = one(tag, "TensorScatter", f, np_dtype_to_tensor_dtype(np.dtype(dt)), 24, axis=2, mode="circular" if dt == np.bool_ else "linear")
        compare(tag, p, f, ref=ref, what=f"TensorScatter {np.dtype(dt)}")


def refusals():
    x = np.zeros((2, 3), np.float32)
    refused("bad_bitcast_width", one("bad_bitcast_width", "BitCast", {"x": x}, T.DOUBLE, 26, to=T.DOUBLE), {"x": x}, "BitCast",
            "float (32 bits) and double (64 bits) differ in width")
    refused("bad_bitcast_type", one("bad_bitcast_type", "BitCast", {"x": x}, T.UINT32, 26, to=T.UINT32), {"x": x}, "BitCast",
            "is not an element type fathom has")
    f = dc_feeds(1, 4, 2, (5, 5), (3, 3), 1, 2, None, None, None, 1.0, True, True)
    bad = dict(f, offset=f["offset"][:, :-2])
    refused("bad_dc_offset", one("bad_dc_offset", "DeformConv", bad, T.FLOAT, 22, offset_group=2), bad, "DeformConv",
            "offset is [1, 34, 3, 3]; X, W, the offset groups and the geometry need [1, 36, 3, 3]")
    refused("bad_dc_og", one("bad_dc_og", "DeformConv", f, T.FLOAT, 22, offset_group=3), f, "DeformConv",
            "offset_group 3 does not divide the 4 channels")
    refused("bad_dc_group", one("bad_dc_group", "DeformConv", f, T.FLOAT, 22, group=2, offset_group=2), f, "DeformConv",
            "group 2 must divide")
    refused("bad_dc_kernel", one("bad_dc_kernel", "DeformConv", f, T.FLOAT, 22, offset_group=2, kernel_shape=[2, 3]), f, "DeformConv",
            "kernel_shape[0] = 2 but W's spatial dim 0 is 3")
    big = dict(f, W=f32(2, 4, 7, 7), offset=f32(1, 98, 1, 1), mask=f32(1, 49, 1, 1))
    refused("bad_dc_window", one("bad_dc_window", "DeformConv", big, T.FLOAT, 22), big, "DeformConv", "larger than the padded input")
    g = {"past": f32(2, 4, 3), "upd": f32(2, 2, 3), "wi": np.array([0, 3], np.int64)}
    refused("bad_ts_linear", one("bad_ts_linear", "TensorScatter", g, T.FLOAT, 24, axis=1), g, "TensorScatter",
            "write_indices[1] = 3: linear mode writes 2 positions from it into a cache of 4 (it must be in [0, 2])")
    refused("bad_ts_axis", one("bad_ts_axis", "TensorScatter", g, T.FLOAT, 24, axis=0), g, "TensorScatter",
            "axis 0 must name a dim of past_cache (rank 3) other than the batch dim 0")
    h = {"past": f32(2, 2, 3), "upd": f32(2, 3, 3)}
    refused("bad_ts_long", one("bad_ts_long", "TensorScatter", h, T.FLOAT, 24, axis=1), h, "TensorScatter",
            "update [2, 3, 3] does not fit past_cache [2, 2, 3]")
    refused("bad_ts_mode", one("bad_ts_mode", "TensorScatter", g, T.FLOAT, 24, axis=1, mode="ring"), g, "TensorScatter",
            "mode 'ring' is not linear or circular")
    k = dict(g, wi=np.array([0, 1, 2], np.int64))
    refused("bad_ts_indices", one("bad_ts_indices", "TensorScatter", k, T.FLOAT, 24, axis=1), k, "TensorScatter",
            "write_indices must be int64 [2] (one per batch entry); got int64 [3]")


bitcast_cases()
deform_conv_cases()
tensor_scatter_cases()
refusals()
finish("onnx_more_check")
