"""The ops of src/onnx/onnx_ops_extra.c run by `fathom run` against ONNX Runtime, or numpy where
ONNX Runtime lacks the op or the variant, on shapes and attributes other than ONNX's own node tests.

CumProd (every exclusive/reverse pair, float32, float64, int32, int64, a non-power-of-two length);
LpPool (opset 18's ceil_mode and dilations, uneven pads, SAME_UPPER, 1-D to 3-D, p 1 to 4, opset 11);
LpNormalization (p 1 and 2, a zero row giving 0, float64); GroupNormalization (opset 21: scale and
bias per channel; opset 18: per group; one group, a group per channel, float64); CenterCropPad
(crop and pad by odd amounts, negative axes, uint8 and int64); Col2Im (strides, pads and dilations
together, several channels and batches, a 3-D image); BitwiseAnd/Or/Xor/Not (int8, uint8, int32,
int64, broadcast); BitShift (uint8, shifts past the width); AffineGrid (2-D and 3-D, both
align_corners, float64); ReverseSequence (both axis orders, zero and full lengths, int32 data);
MaxUnpool (the indices of ONNX Runtime's MaxPool, 1-D to 3-D; an output_shape larger than the
unpooled shape against ONNX's reference, which keeps the indices on the unpooled shape: ONNX
Runtime reads them on output_shape instead); Det (float32 batches; float64, a singular and an
empty matrix against numpy). Every model also runs with --device check, which must give the CPU's
outputs bit for bit. Then models fathom must refuse with exit code 1 and a message naming the node
and the problem.

Tolerances, relative to the largest magnitude of the reference (at least 1): float32 1e-5,
float64 1e-11, float16 2e-3; integers exact.

  onnx_extra_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper
    from onnx.helper import np_dtype_to_tensor_dtype
    from onnx.reference import ReferenceEvaluator
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)
from onnx_check_lib import D, fathom_run, finish, report  # noqa: E402 (after the skip above)

TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-11, np.dtype(np.float16): 2e-3}
rng = np.random.default_rng(11)
n_models = 0


def model(tag, op, feeds, opset, out_dtype=None, **attrs):
    """One node reading the feeds in order; its output y has out_dtype (the first feed's when None)."""
    global n_models
    n_models += 1
    ins = [helper.make_tensor_value_info(k, np_dtype_to_tensor_dtype(v.dtype), None) for k, v in feeds.items()]
    yt = np_dtype_to_tensor_dtype(np.dtype(out_dtype) if out_dtype else next(iter(feeds.values())).dtype)
    node = helper.make_node(op, list(feeds), ["y"], name=tag, **attrs)
    m = helper.make_model(helper.make_graph([node], tag, ins, [helper.make_tensor_value_info("y", yt, None)]),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


def close(got, want):
    if got.dtype != want.dtype or got.shape != want.shape:
        return False, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    if want.dtype not in TOL:
        return bool(np.array_equal(got, want)), "exact" if np.array_equal(got, want) else f"{got.ravel()[:8]} vs {want.ravel()[:8]}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    d = float(np.max(np.abs(g - w), initial=0))
    return d <= TOL[want.dtype] * max(1.0, float(np.max(np.abs(w), initial=0))), f"max |diff| {d:.3g}"


def ort_run(path, feeds):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def check(tag, op, feeds, opset, ref="ort", out_dtype=None, **attrs):
    """Runs the model on fathom (cpu and check) and compares with ref: "ort", "onnx" (ONNX's
    reference evaluator) or an array."""
    path = model(tag, op, feeds, opset, out_dtype, **attrs)
    want = ort_run(path, feeds) if isinstance(ref, str) and ref == "ort" else \
        ReferenceEvaluator(path).run(None, feeds)[0] if isinstance(ref, str) else np.asarray(ref)
    got, err = fathom_run(path, feeds, tag)
    if err:
        report(False, f"{tag}: {op} {attrs}: exit {err[0]}: {err[1][:600]}")
        return
    ok, why = close(got["y"], want)
    report(ok, f"{tag}: {op} {attrs} {[v.shape for v in feeds.values()]} vs {ref if isinstance(ref, str) else 'numpy'}: {why}")
    chk, err = fathom_run(path, feeds, tag, device="check")
    same = not err and chk["y"].dtype == got["y"].dtype and chk["y"].shape == got["y"].shape and \
        chk["y"].tobytes() == got["y"].tobytes()
    report(same, f"{tag}: --device check gives the CPU's output" + (f": {err}" if err else ""))


def refused(tag, op, feeds, opset, want, out_dtype=None, **attrs):
    path = model(tag, op, feeds, opset, out_dtype, **attrs)
    got, err = fathom_run(path, feeds, tag)
    ok = err is not None and err[0] == 1 and f"({op})" in err[1] and want in err[1]
    report(ok, f"{tag}: {op} refused: {err[1].strip()[:300] if err else 'ran'}")


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def i64(*v):
    return np.array(v, np.int64)


def cumprod_cases():
    x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    for ex in (0, 1):
        for rev in (0, 1):
            check(f"cumprod_e{ex}r{rev}", "CumProd", {"x": x, "a": np.array(1, np.int64)}, 26, exclusive=ex, reverse=rev)
    check("cumprod_f64", "CumProd", {"x": rng.uniform(-2, 2, (2, 7)), "a": np.array(-1, np.int64)}, 26, reverse=1)
    check("cumprod_i64", "CumProd", {"x": rng.integers(-9, 9, (4, 6)), "a": np.array(0, np.int64)}, 26, exclusive=1)
    check("cumprod_i32", "CumProd", {"x": rng.integers(-5, 5, (3, 1)).astype(np.int32), "a": np.array(1, np.int32)}, 26, exclusive=1)
    check("cumprod_len13", "CumProd", {"x": rng.uniform(0.8, 1.2, (13,)).astype(np.float32), "a": np.array(0, np.int64)}, 26,
          exclusive=1, reverse=1)


def lppool_cases():
    x = f32(2, 3, 7, 6)
    check("lppool_ceil", "LpPool", {"x": x}, 18, kernel_shape=[3, 2], strides=[2, 2], p=3, ceil_mode=1)
    check("lppool_pads", "LpPool", {"x": x}, 18, kernel_shape=[2, 3], pads=[1, 0, 0, 2], p=1)
    check("lppool_dil3d", "LpPool", {"x": f32(1, 2, 5, 6, 7)}, 18, kernel_shape=[2, 2, 2], dilations=[1, 2, 2], p=3)
    check("lppool_same1d", "LpPool", {"x": f32(2, 2, 9)}, 18, kernel_shape=[4], strides=[2], auto_pad="SAME_UPPER", p=4)
    check("lppool_dil_ceil", "LpPool", {"x": x}, 22, kernel_shape=[2, 2], dilations=[2, 1], strides=[3, 2], ceil_mode=1, p=2)
    check("lppool_op11", "LpPool", {"x": x}, 11, kernel_shape=[3, 3], strides=[1, 2], p=2)
    check("lppool_f16", "LpPool", {"x": x.astype(np.float16)}, 18, kernel_shape=[2, 2], p=2)


def lpnorm_cases():
    x = f32(3, 4, 5)
    check("lpnorm_p1_ax0", "LpNormalization", {"x": x}, 22, p=1, axis=0)
    check("lpnorm_p2_ax1", "LpNormalization", {"x": x}, 1, p=2, axis=1)
    z = np.array([[0, 0, 0], [3, 0, -4], [1e-30, 0, 0]], np.float32)
    check("lpnorm_zero", "LpNormalization", {"x": z}, 22, p=2, axis=1)
    check("lpnorm_f64", "LpNormalization", {"x": rng.standard_normal((2, 6))}, 22, p=1, axis=-1)


def group_norm_cases():
    x = f32(2, 6, 3, 4)
    for g in (3, 1, 6):
        check(f"gn21_g{g}", "GroupNormalization", {"x": x, "s": f32(6), "b": f32(6)}, 21, num_groups=g, epsilon=1e-3)
    check("gn18_g2", "GroupNormalization", {"x": f32(2, 6, 5), "s": f32(2), "b": f32(2)}, 18, num_groups=2)
    check("gn21_f64", "GroupNormalization", {"x": rng.standard_normal((3, 4, 5)), "s": rng.standard_normal(4),
                                             "b": rng.standard_normal(4)}, 21, num_groups=2, stash_type=11)


def crop_pad_cases():
    x = f32(5, 8, 3)
    check("ccp_odd", "CenterCropPad", {"x": x, "s": i64(2, 11)}, 18, axes=[0, 1])
    check("ccp_neg", "CenterCropPad", {"x": rng.integers(0, 255, (4, 3, 6)).astype(np.uint8), "s": i64(1, 9)}, 18, axes=[-1, -3])
    check("ccp_all", "CenterCropPad", {"x": rng.integers(-9, 9, (4, 3, 6)), "s": i64(7, 3, 2)}, 18)


def col2im_cases():
    c, n = 2, 2
    img, blk, st, dil, pads = [7, 6], [2, 3], [2, 1], [1, 2], [1, 0, 2, 1]
    nb = [(img[i] + pads[i] + pads[i + 2] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(2)]
    x = f32(n, c * blk[0] * blk[1], nb[0] * nb[1])
    check("col2im_all", "Col2Im", {"x": x, "i": i64(*img), "b": i64(*blk)}, 18, strides=st, dilations=dil, pads=pads)
    check("col2im_3d", "Col2Im", {"x": f32(1, 3 * 8, 27), "i": i64(4, 4, 4), "b": i64(2, 2, 2)}, 18)


def bitwise_cases():
    a8, b8 = rng.integers(-128, 128, (3, 4, 5)).astype(np.int8), rng.integers(-128, 128, (4, 1)).astype(np.int8)
    check("band_i8", "BitwiseAnd", {"x": a8, "y0": b8}, 18)
    check("bor_i32", "BitwiseOr", {"x": rng.integers(-2**31, 2**31, (2, 3)).astype(np.int32), "y0": np.array(0x0F0F, np.int32)}, 18)
    check("bxor_i64", "BitwiseXor", {"x": rng.integers(-2**62, 2**62, (5,)), "y0": rng.integers(-2**62, 2**62, (2, 5))}, 18)
    check("bnot_u8", "BitwiseNot", {"x": rng.integers(0, 256, (3, 7)).astype(np.uint8)}, 18)
    check("bnot_i8", "BitwiseNot", {"x": a8}, 18)
    check("bxor_u8", "BitwiseXor", {"x": rng.integers(0, 256, (2, 3)).astype(np.uint8), "y0": rng.integers(0, 256, (3,)).astype(np.uint8)}, 18)
    s = np.array([[0], [1], [7], [8], [200]], np.uint8)
    for d in ("LEFT", "RIGHT"):
        check(f"bshift_{d}", "BitShift", {"x": rng.integers(0, 256, (1, 6)).astype(np.uint8), "s": s}, 11, direction=d)


def affine_grid_cases():
    for a in (0, 1):
        check(f"ag2d_a{a}", "AffineGrid", {"t": f32(2, 2, 3), "s": i64(2, 3, 5, 7)}, 20, align_corners=a)
        check(f"ag3d_a{a}", "AffineGrid", {"t": f32(1, 3, 4), "s": i64(1, 2, 3, 4, 5)}, 20, align_corners=a)
    check("ag2d_f64", "AffineGrid", {"t": rng.standard_normal((3, 2, 3)), "s": i64(3, 1, 4, 2)}, 20)


def reverse_sequence_cases():
    check("rs_time0", "ReverseSequence", {"x": f32(5, 3, 2), "l": i64(5, 0, 2)}, 10, batch_axis=1, time_axis=0)
    check("rs_batch0", "ReverseSequence", {"x": rng.integers(-99, 99, (3, 4, 2)).astype(np.int32), "l": i64(1, 4, 3)}, 10,
          batch_axis=0, time_axis=1)


def max_unpool_cases():
    for tag, shape, k in (("2d", (2, 3, 6, 8), [2, 2]), ("1d", (1, 2, 9), [3]), ("3d", (1, 2, 4, 4, 6), [2, 2, 2])):
        x = f32(*shape)
        pool = model(f"mp{tag}", "MaxPool", {"x": x}, 12, kernel_shape=k, strides=k)
        m = onnx.load(pool)
        m.graph.node[0].output.append("ind")
        m.graph.output.append(helper.make_tensor_value_info("ind", onnx.TensorProto.INT64, None))
        onnx.save(m, pool)
        v, ind = ort.InferenceSession(pool, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        check(f"mu{tag}", "MaxUnpool", {"v": v, "i": ind}, 22, kernel_shape=k, strides=k)
        inferred = [shape[0], shape[1]] + [(v.shape[2 + d] - 1) * k[d] + k[d] for d in range(len(k))]
        check(f"mu{tag}_os", "MaxUnpool", {"v": v, "i": ind, "o": i64(*inferred)}, 22, kernel_shape=k, strides=k)
    v, ind = np.array([[[[5, 6], [7, 8]]]], np.float32), np.array([[[[0, 3], [10, 13]]]], np.int64)
    check("mu_bigger", "MaxUnpool", {"v": v, "i": ind, "o": i64(1, 1, 6, 5)}, 22, ref="onnx", kernel_shape=[2, 2], strides=[2, 2])
    check("mu_pads", "MaxUnpool", {"v": v, "i": i64(0, 2, 4, 8).reshape(1, 1, 2, 2)}, 22, kernel_shape=[2, 2], strides=[2, 2],
          pads=[1, 0, 0, 1])


def det_cases():
    check("det_f32", "Det", {"x": f32(3, 4, 4)}, 22)
    check("det_f32_2d", "Det", {"x": f32(5, 5)}, 11)
    x = rng.standard_normal((2, 2, 3, 3))
    x[1, 0] = [[1, 2, 3], [2, 4, 6], [0, 1, 1]]
    check("det_f64", "Det", {"x": x}, 22, ref=np.linalg.det(x))
    check("det_empty", "Det", {"x": np.zeros((2, 0, 0))}, 22, ref=np.ones(2))


cumprod_cases()
lppool_cases()
lpnorm_cases()
group_norm_cases()
crop_pad_cases()
col2im_cases()
bitwise_cases()
affine_grid_cases()
reverse_sequence_cases()
max_unpool_cases()
det_cases()

# refusals: exit 1 naming the node's op and the problem
refused("bad_col2im_blk", "Col2Im", {"x": f32(1, 10, 12), "i": i64(5, 6), "b": i64(2, 2)}, 18, "not a multiple of the block size 4")
refused("bad_col2im_len", "Col2Im", {"x": f32(1, 4, 11), "i": i64(4, 5), "b": i64(2, 2)}, 18, "not the number of sliding blocks, 12")
refused("bad_col2im_rank", "Col2Im", {"x": f32(1, 4, 12), "i": i64(4, 5), "b": i64(2, 2, 1)}, 18, "block_shape has 3 values and image_shape 2")
refused("bad_ccp_len", "CenterCropPad", {"x": f32(4, 5, 6), "s": i64(3, 3, 3)}, 18, "shape has 3 values; expected 2", axes=[0, 1])
refused("bad_ccp_axes", "CenterCropPad", {"x": f32(4, 5), "s": i64(3, 3)}, 18, "axis -2 is listed twice", axes=[0, -2])
refused("bad_det", "Det", {"x": f32(2, 3, 4)}, 22, "is not [..., M, M]")
refused("bad_gn_groups", "GroupNormalization", {"x": f32(2, 6, 3), "s": f32(6), "b": f32(6)}, 21,
        "num_groups 4 must be positive and divide", num_groups=4)
refused("bad_gn_scale", "GroupNormalization", {"x": f32(2, 6, 3), "s": f32(2), "b": f32(2)}, 21,
        "need 6 values (one per channel at opset 21)", num_groups=2)
refused("bad_bitshift", "BitShift", {"x": np.array([1, 2], np.int32), "s": np.array([1, 1], np.int32)}, 11,
        "needs an unsigned integer", direction="LEFT")
refused("bad_bitshift_dir", "BitShift", {"x": np.array([1, 2], np.uint8), "s": np.array([1, 1], np.uint8)}, 11,
        "direction 'UP' is not LEFT or RIGHT", direction="UP")
refused("bad_bitand", "BitwiseAnd", {"x": f32(3), "y0": f32(3)}, 18, "needs an integer")
refused("bad_bitor_shape", "BitwiseOr", {"x": np.zeros((2, 3), np.int32), "y0": np.zeros((4,), np.int32)}, 18, "do not broadcast")
refused("bad_ag_size", "AffineGrid", {"t": f32(2, 2, 3), "s": i64(2, 3, 4)}, 20, "size must be [N, C, H, W]")
refused("bad_ag_n", "AffineGrid", {"t": f32(2, 2, 3), "s": i64(3, 1, 4, 4)}, 20, "with theta's N (2)")
refused("bad_rs_len", "ReverseSequence", {"x": f32(4, 3), "l": i64(1, 5, 2)}, 10, "sequence_lens[1] = 5 is outside [0, 4]")
refused("bad_rs_axes", "ReverseSequence", {"x": f32(4, 3), "l": i64(1, 2, 2)}, 10, "must be 0 and 1, one each", batch_axis=0, time_axis=0)
refused("bad_mu_shape", "MaxUnpool", {"v": f32(1, 1, 2, 2), "i": i64(0, 1, 2, 3).reshape(1, 1, 2, 2), "o": i64(1, 1, 3, 3)}, 22,
        "at least the unpooled sizes", kernel_shape=[2, 2], strides=[2, 2])
refused("bad_mu_index", "MaxUnpool", {"v": f32(1, 1, 2, 2), "i": i64(0, 1, 2, 16).reshape(1, 1, 2, 2)}, 22, "16",
        kernel_shape=[2, 2], strides=[2, 2])
refused("bad_mu_kernel", "MaxUnpool", {"v": f32(1, 1, 2, 2), "i": i64(0, 1, 2, 3).reshape(1, 1, 2, 2)}, 22, "must be positive")
refused("bad_cumprod_axis", "CumProd", {"x": f32(2, 3), "a": np.array(2, np.int64)}, 26, "axis 2 is out of range for an input of rank 2")
refused("bad_lpnorm_p", "LpNormalization", {"x": f32(2, 3)}, 22, "p must be 1 or 2; got 3", p=3)
refused("bad_lppool_p", "LpPool", {"x": f32(1, 1, 4, 4)}, 18, "p must be in [1, 1024]; got 0", kernel_shape=[2, 2], p=0)
refused("bad_lppool_win", "LpPool", {"x": f32(1, 1, 4, 4)}, 18, "larger than the padded input", kernel_shape=[2, 3], dilations=[1, 2])
print(f"{n_models} models")
finish("onnx_extra_check")
