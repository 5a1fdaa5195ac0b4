"""The data-dependent-shape ops (NonMaxSuppression, NonZero, Compress, Unique) and the signal
ops (HannWindow, HammingWindow, BlackmanWindow, DFT, STFT, MelWeightMatrix) run by
`fathom run` (the ONNX interpreter), against ONNX Runtime and numpy.

One-node models made with onnx.helper, every input a graph input (so nothing is folded):
  * NonMaxSuppression: 2 batches x 3 classes x 500 random boxes in both box formats (corners
    given in either order), scores rounded to 1/32 so that many tie, with and without
    score_threshold, max_output_boxes_per_class limiting and not, opsets 10 and 11; boxes
    whose IoU equals the threshold exactly; an omitted max_output_boxes_per_class (no output).
  * NonZero, Compress, Unique on random data with repeats: int64, float (with -0.0 and NaN for
    NonZero), bool; Compress on each axis, a negative one, none (flattened) and a condition
    shorter than the axis; Unique sorted and unsorted, without an axis and along each axis of
    a 3-D input made of repeated slices, all four outputs.
  * DFT of lengths 1, 7, 64 and 100 (a power of two, the direct sum, Bluestein): forward on
    real and complex input, inverse, one-sided (RFFT) and its inverse (IRFFT), dft_length
    padding and cutting, the axis as opset 17's attribute and opset 20's input, float64.
  * STFT of a random 2 x 4000 signal with a 400-point periodic Hann window and step 160
    (Whisper's front end), one- and two-sided; without a window; a complex signal.
  * the three windows, periodic and symmetric, sizes 1, 7, 400, float and double outputs;
    MelWeightMatrix at Whisper's (80 bins, 400-point DFT, 16 kHz, 0-8000 Hz) and two others.
Every model also runs with --device check (the CPU's kernels behind the device interface),
which must give the CPU's outputs bit for bit. Then models fathom must refuse with exit code 1
and an error naming the node and the reason (boxes of the wrong shape, scores that do not
match the boxes, an iou_threshold outside [0, 1], a DFT length of 0, a one-sided DFT of a
complex input, a negative and a huge window size, an STFT window longer than frame_length, a
float Compress condition, a MelWeightMatrix band above the Nyquist bin).

Tolerances:
  * integer outputs (every output of NonMaxSuppression, NonZero, Compress and Unique on
    integers, Unique's and Compress's float values, which are copies): equal to ONNX Runtime.
  * DFT and STFT: fathom computes in float64 and rounds once, so against numpy's float64 FFT
    of the same (float32) input: |got - want| <= 1e-6 max|want| (float32 outputs; float64:
    1e-12). Against ONNX Runtime, which computes in float32: |got - want| <= 1e-4 ||x||_2
    (the input's norm: float32 rounding of sums of up to n terms).
  * the windows: |got - want| <= 1e-6 against ONNX Runtime (float32) and 1e-12 against
    numpy's formulas in float64. MelWeightMatrix: within 1e-6 of ONNX Runtime (the same
    integer bin edges; the weights are ratios of small integers).

  onnx_dyn_signal_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T, helper
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)
from onnx_check_lib import D, fathom_run, finish, report  # noqa: E402 (after the skip above)

ETYPE = {np.dtype(np.float32): T.FLOAT, np.dtype(np.float64): T.DOUBLE, np.dtype(np.int64): T.INT64,
         np.dtype(np.int32): T.INT32, np.dtype(np.bool_): T.BOOL, np.dtype(np.uint8): T.UINT8}


def model(tag, op, feeds, n_out=1, opset=17, order=None, **attrs):
    """One node reading the feeds (graph inputs) in order; a name in `order` that is not a feed
    is an omitted optional input. Outputs y0, y1, ... (types left to inference)."""
    names = order or list(feeds)
    ins = [helper.make_tensor_value_info(k, ETYPE[v.dtype], v.shape) for k, v in feeds.items()]
    outs = [onnx.ValueInfoProto(name=f"y{i}") for i in range(n_out)]
    ins_names = [k if k in feeds else "" for k in names]
    while ins_names and not ins_names[-1]:  # trailing omitted inputs left out (ONNX Runtime crashes on an empty last DFT input)
        ins_names.pop()
    node = helper.make_node(op, ins_names, [f"y{i}" for i in range(n_out)], name=tag, **attrs)
    m = helper.make_model(helper.make_graph([node], tag, ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


def ort_run(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def desc(a):
    return f"{a.dtype}{list(a.shape)} {a.ravel()[:6]}"


def run_both(tag, path, feeds):
    """fathom's outputs on the CPU, checked equal bit for bit to --device check's (None: refused)."""
    got, err = fathom_run(path, feeds, tag)
    if got is None:
        report(False, f"{tag}: fathom refused it: {err}")
        return None
    got = [got[f"y{i}"] for i in range(len(got))]  # the model's outputs y0, y1, ... in order
    dev, err = fathom_run(path, feeds, tag, "check")
    dev = [dev[f"y{i}"] for i in range(len(dev))] if dev is not None else None
    report(dev is not None and all(same(a, b) for a, b in zip(got, dev)),
           f"{tag}: --device check equal to the CPU" + ("" if dev is not None else f" (refused: {err})"))
    return got


def check_exact(tag, op, feeds, n_out=1, opset=17, order=None, **attrs):
    p = model(tag, op, feeds, n_out, opset, order, **attrs)
    got = run_both(tag, p, feeds)
    if got is None:
        return
    want = ort_run(p, feeds)
    bad = [i for i in range(n_out) if not same(got[i], want[i])]
    report(not bad, f"{tag} ({op}): {n_out} output(s) equal to ORT" + "".join(
        f"; y{i}: {desc(got[i])} vs ORT {desc(want[i])}" for i in bad))


# ---- NonMaxSuppression, NonZero, Compress, Unique ----
def boxes(r, nb, nbox, center):
    if center:
        c = r.random((nb, nbox, 2)) * 10
        wh = r.random((nb, nbox, 2)) * 3 + 0.1
        return np.concatenate([c, wh], -1).astype(np.float32)
    a, b = r.random((nb, nbox, 2)) * 10, r.random((nb, nbox, 2)) * 10  # corners in either order
    return np.concatenate([a, b], -1).astype(np.float32)


def nms_cases():
    r = np.random.default_rng(1)
    for center in (0, 1):
        b = boxes(r, 2, 500, center)
        s = (np.round(r.random((2, 3, 500)) * 32) / 32).astype(np.float32)  # many equal scores
        for mo, iou, st in ((100, 0.5, 0.3), (10000, 0.3, None), (5, 0.7, 0.0), (10000, 0.0, None), (10000, 1.0, 0.5)):
            feeds = {"boxes": b, "scores": s, "max": np.array([mo], np.int64), "iou": np.array([iou], np.float32)}
            if st is not None:
                feeds["score"] = np.array([st], np.float32)
            check_exact(f"nms_c{center}_m{mo}_i{iou}_s{st}", "NonMaxSuppression", feeds, opset=11, center_point_box=center)
    b = boxes(r, 1, 50, 0)
    check_exact("nms_opset10", "NonMaxSuppression", {"boxes": b, "scores": r.random((1, 2, 50)).astype(np.float32),
                                                     "max": np.array([7], np.int64), "iou": np.array([0.4], np.float32)}, opset=10)
    # IoU exactly 1/3 and 1/2 against those thresholds (kept: only an IoU above it suppresses), identical boxes
    eb = np.array([[[0, 0, 1, 1], [0, 0.5, 1, 1.5], [0, 0, 1, 2], [0, 0, 1, 1], [5, 5, 6, 6]]], np.float32)
    es = np.array([[[0.9, 0.8, 0.7, 0.9, 0.1]]], np.float32)
    for thr in (1 / 3, 0.5, 0.49):
        check_exact(f"nms_edge_{thr:.3f}", "NonMaxSuppression", {"boxes": eb, "scores": es, "max": np.array([10], np.int64),
                                                                 "iou": np.array([thr], np.float32)}, opset=11)
    check_exact("nms_no_max", "NonMaxSuppression", {"boxes": eb, "scores": es}, opset=11)


def dyn_cases():
    r = np.random.default_rng(2)
    ints = r.integers(-2, 3, (3, 4, 5)).astype(np.int64)
    fl = r.integers(-2, 3, (6, 7)).astype(np.float32)
    fl[0, 0], fl[1, 1], fl[2, 2] = -0.0, np.nan, 0.0
    for tag, x in (("nz_i64", ints), ("nz_f32", fl), ("nz_bool", ints > 0), ("nz_1d", ints.ravel()), ("nz_none", np.zeros((2, 3), np.float32))):
        check_exact(tag, "NonZero", {"x": x}, opset=13)
    x = r.standard_normal((4, 5, 6)).astype(np.float32)
    for axis, n in ((0, 4), (1, 5), (2, 6), (-1, 6), (1, 3), (None, 120), (None, 50)):
        cond = r.random(n) > 0.5
        kw = {} if axis is None else {"axis": axis}
        check_exact(f"compress_a{axis}_n{n}", "Compress", {"x": x, "c": cond}, opset=11, **kw)
    check_exact("compress_i64", "Compress", {"x": ints, "c": np.array([True, False, True])}, opset=11, axis=0)
    v = r.integers(0, 6, 40).astype(np.int64)
    rows = r.integers(0, 3, (4, 3)).astype(np.float32)[r.integers(0, 4, 12)]  # 12 rows drawn from 4
    cube = np.stack([rows, rows[::-1], rows * 2], 0)  # [3, 12, 3]: repeated slices along axis 1
    for sorted_ in (0, 1):
        check_exact(f"unique_s{sorted_}_flat", "Unique", {"x": v}, 4, 11, sorted=sorted_)
        check_exact(f"unique_s{sorted_}_f32", "Unique", {"x": rows}, 4, 11, sorted=sorted_)
        check_exact(f"unique_s{sorted_}_rows", "Unique", {"x": rows}, 4, 11, sorted=sorted_, axis=0)
        check_exact(f"unique_s{sorted_}_cube1", "Unique", {"x": cube}, 4, 11, sorted=sorted_, axis=1)
        check_exact(f"unique_s{sorted_}_cube-1", "Unique", {"x": cube.astype(np.int64)}, 4, 11, sorted=sorted_, axis=-1)
    check_exact("unique_y_only", "Unique", {"x": v}, 1, 11)


# ---- the signal ops ----
def cplx(a):
    return a[..., 0].astype(np.float64) + 1j * (a[..., 1] if a.shape[-1] == 2 else 0)


def check_close(tag, got, want_np, want_ort, scale):
    """got against numpy in float64 (1e-6 max|want| in float32, 1e-12 in float64) and ONNX Runtime (1e-4 scale)."""
    rel = 1e-12 if got.dtype == np.float64 else 1e-6
    d_np = float(np.max(np.abs(got - want_np))) if got.size else 0.0
    tol_np = rel * max(float(np.max(np.abs(want_np))) if want_np.size else 0.0, 1e-30)
    ok = got.shape == want_np.shape and d_np <= tol_np
    msg = f"{tag}: {list(got.shape)} vs numpy max |diff| {d_np:.3g} (allowed {tol_np:.3g})"
    if want_ort is not None:
        d_o = float(np.max(np.abs(got - want_ort))) if got.size else 0.0
        ok &= want_ort.shape == got.shape and d_o <= 1e-4 * scale
        msg += f", vs ORT {d_o:.3g} (allowed {1e-4 * scale:.3g})"
    report(ok, msg)


def dft_np(x, axis, n, inverse, onesided):
    z = cplx(x)
    if onesided and inverse:
        y = np.fft.irfft(z, n=n, axis=axis)[..., None]
    elif inverse:
        y = np.fft.ifft(z, n=n, axis=axis)
    else:
        y = np.fft.fft(z, n=n, axis=axis)
        if onesided:
            y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return y if y.shape[-1:] == (1,) and onesided and inverse else np.stack([y.real, y.imag], -1)


def check_dft(tag, x, opset=20, axis=None, n=None, inverse=0, onesided=0, use_ort=True):
    feeds, order = {"x": x}, ["x", "n", "axis"]
    if n is not None:
        feeds["n"] = np.array(n, np.int64)
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset >= 20 and axis is not None:
        feeds["axis"] = np.array(axis, np.int64)
    elif axis is not None:
        attrs["axis"] = axis
    ax = (axis if axis is not None else (-2 if opset >= 20 else 1)) % x.ndim
    p = model(tag, "DFT", feeds, 1, opset, order[:3 if opset >= 20 else 2], **attrs)
    got = run_both(tag, p, feeds)
    if got is None:
        return
    nn = n if n is not None else (2 * (x.shape[ax] - 1) if onesided and inverse else x.shape[ax])
    want = dft_np(x, ax, nn, inverse, onesided).astype(x.dtype)
    check_close(tag, got[0], want, ort_run(p, feeds)[0] if use_ort else None, float(np.linalg.norm(x)) or 1.0)


def dft_cases():
    r = np.random.default_rng(3)
    for n in (1, 7, 64, 100):
        xr = r.standard_normal((2, n, 1)).astype(np.float32)
        xc = r.standard_normal((2, n, 2)).astype(np.float32)
        check_dft(f"dft_{n}_real", xr)
        check_dft(f"dft_{n}_complex", xc)
        check_dft(f"dft_{n}_inverse", xc, inverse=1)
        check_dft(f"dft_{n}_rfft", xr, onesided=1)
        if n > 1:
            h = r.standard_normal((2, n // 2 + 1, 2)).astype(np.float32)
            check_dft(f"dft_{n}_irfft", h, inverse=1, onesided=1, n=n)
        check_dft(f"dft_{n}_f64", xc.astype(np.float64), inverse=1, use_ort=False)  # numpy's float64 is the better reference
    x3 = r.standard_normal((3, 12, 10, 2)).astype(np.float32)
    check_dft("dft_axis1_opset17", x3, opset=17, axis=1)
    check_dft("dft_axis2_opset17", x3, opset=17, axis=-2)
    check_dft("dft_axis0_opset20", x3, axis=0)
    check_dft("dft_axis1_opset20", x3, axis=1)
    check_dft("dft_pad", x3, axis=2, n=16)
    check_dft("dft_cut", x3, axis=1, n=5)
    check_dft("dft_rfft_pad", x3[..., :1], axis=1, n=31, onesided=1)
    check_dft("dft_irfft_default_n", x3, axis=1, inverse=1, onesided=1)


def stft_np(s, step, w, fl, onesided):
    z = cplx(s)
    frames = 1 + (z.shape[1] - fl) // step
    fr = np.stack([z[:, f * step:f * step + fl] * (w if w is not None else 1) for f in range(frames)], 1)
    y = np.fft.fft(fr, axis=-1)
    if onesided:
        y = y[..., :fl // 2 + 1]
    return np.stack([y.real, y.imag], -1)


def check_stft(tag, s, step, w=None, fl=None, onesided=1, use_ort=True):
    feeds = {"s": s, "step": np.array(step, np.int64)}
    if w is not None:
        feeds["w"] = w
    if fl is not None:
        feeds["fl"] = np.array(fl, np.int64)
    p = model(tag, "STFT", feeds, 1, 17, ["s", "step", "w", "fl"], onesided=onesided)
    got = run_both(tag, p, feeds)
    if got is None:
        return
    want = stft_np(s, step, None if w is None else w.astype(np.float64), fl or (len(w) if w is not None else s.shape[1]), onesided)
    check_close(tag, got[0], want.astype(s.dtype), ort_run(p, feeds)[0] if use_ort else None, float(np.linalg.norm(s)))


def signal_cases():
    r = np.random.default_rng(4)
    sig = r.standard_normal((2, 4000, 1)).astype(np.float32)
    hann = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)).astype(np.float32)
    check_stft("stft_whisper", sig, 160, hann)
    check_stft("stft_twosided", sig[:, :1000], 100, hann[::4].copy(), onesided=0)
    check_stft("stft_no_window", sig[:, :700], 64, None, 128)
    check_stft("stft_window_and_length", sig[:, :900], 50, hann[:100].copy(), 100)
    check_stft("stft_complex", r.standard_normal((1, 300, 2)).astype(np.float32), 37, hann[:60].copy(), onesided=0, use_ort=False)
    forms = {"HannWindow": lambda i, N: np.sin(np.pi * i / N) ** 2,
             "HammingWindow": lambda i, N: 25 / 46 - 21 / 46 * np.cos(2 * np.pi * i / N),
             "BlackmanWindow": lambda i, N: 0.42 - 0.5 * np.cos(2 * np.pi * i / N) + 0.08 * np.cos(4 * np.pi * i / N)}
    for op, f in forms.items():
        for size, periodic in ((1, 1), (7, 0), (7, 1), (400, 1), (400, 0)):
            for dt, odt in ((np.float32, T.FLOAT), (np.float64, T.DOUBLE)):
                tag = f"{op}_{size}_p{periodic}_{np.dtype(dt).name}"
                feeds = {"size": np.array(size, np.int64)}
                p = model(tag, op, feeds, periodic=periodic, output_datatype=odt)
                got = run_both(tag, p, feeds)
                if got is None:
                    continue
                want = f(np.arange(size), size if periodic else size - 1)
                d_np, d_o = float(np.max(np.abs(got[0] - want))), float(np.max(np.abs(got[0] - ort_run(p, feeds)[0])))
                tol = 1e-12 if dt == np.float64 else 1e-7
                report(got[0].dtype == dt and got[0].shape == (size,) and d_np <= tol and d_o <= 1e-6,
                       f"{tag}: vs numpy {d_np:.3g} (allowed {tol:g}), vs ORT {d_o:.3g} (allowed 1e-6)")
    for nmel, dft, sr, lo, hi in ((80, 400, 16000, 0, 8000), (40, 512, 16000, 20, 7600), (10, 64, 8000, 100, 3900)):
        tag = f"mel_{nmel}_{dft}_{sr}"
        feeds = {"n": np.array(nmel, np.int64), "dft": np.array(dft, np.int64), "sr": np.array(sr, np.int64),
                 "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}
        p = model(tag, "MelWeightMatrix", feeds)
        got = run_both(tag, p, feeds)
        if got is not None:
            want = ort_run(p, feeds)[0]
            d = float(np.max(np.abs(got[0] - want)))
            report(got[0].shape == want.shape and got[0].dtype == want.dtype and d <= 1e-6,
                   f"{tag}: {list(got[0].shape)} vs ORT max |diff| {d:.3g} (allowed 1e-6)")


# ---- what fathom must refuse ----
def refusals():
    f = np.float32
    b5 = np.zeros((1, 5, 4), f)
    cases = [
        ("bad_nms_boxes", "NonMaxSuppression", {"boxes": np.zeros((1, 5, 3), f), "scores": np.zeros((1, 1, 5), f)}, 11, {},
         ["bad_nms_boxes", "'boxes'", "[1, 5, 3]", "[num_batches, spatial_dimension, 4]"]),
        ("bad_nms_scores", "NonMaxSuppression", {"boxes": b5, "scores": np.zeros((1, 2, 4), f)}, 11, {},
         ["bad_nms_scores", "'scores'", "[1, 2, 4]", "[1, 5, 4]"]),
        ("bad_nms_iou", "NonMaxSuppression", {"boxes": b5, "scores": np.zeros((1, 1, 5), f), "max": np.array([3], np.int64),
                                              "iou": np.array([1.5], f)}, 11, {}, ["bad_nms_iou", "iou_threshold", "[0, 1]"]),
        ("bad_dft_len0", "DFT", {"x": np.zeros((1, 8, 1), f), "n": np.array(0, np.int64)}, 20, {},
         ["bad_dft_len0", "dft_length", "is 0"]),
        ("bad_dft_onesided_complex", "DFT", {"x": np.zeros((1, 8, 2), f)}, 20, {"onesided": 1},
         ["bad_dft_onesided_complex", "onesided", "real"]),
        ("bad_dft_shape", "DFT", {"x": np.zeros((1, 8, 3), f)}, 20, {}, ["bad_dft_shape", "'x'", "[1, 8, 3]"]),
        ("bad_window_neg", "HannWindow", {"size": np.array(-1, np.int64)}, 17, {}, ["bad_window_neg", "'size'", "-1"]),
        ("bad_window_huge", "HammingWindow", {"size": np.array(1 << 40, np.int64)}, 17, {}, ["bad_window_huge", "window size"]),
        ("bad_stft_window", "STFT", {"s": np.zeros((1, 100, 1), f), "step": np.array(10, np.int64), "w": np.ones(20, f),
                                     "fl": np.array(16, np.int64)}, 17, {}, ["bad_stft_window", "window", "frame_length"]),
        ("bad_compress_cond", "Compress", {"x": np.zeros(4, f), "c": np.ones(4, f)}, 11, {}, ["bad_compress_cond", "'c'", "bool"]),
        ("bad_mel_edge", "MelWeightMatrix", {"n": np.array(10, np.int64), "dft": np.array(64, np.int64), "sr": np.array(8000, np.int64),
                                             "lo": np.array(0, f), "hi": np.array(6000, f)}, 17, {}, ["bad_mel_edge", "upper_edge_hertz"]),
    ]
    for tag, op, feeds, opset, attrs, needles in cases:
        order = {"DFT": ["x", "n"], "NonMaxSuppression": ["boxes", "scores", "max", "iou"]}.get(op)
        p = model(tag, op, feeds, 1, opset, order, **attrs)
        got, err = fathom_run(p, feeds, tag)
        ok = got is None and err[0] == 1 and all(n in err[1] for n in needles)
        report(ok, f"{tag}: refused (exit 1) naming {', '.join(needles)}" + ("" if ok else f"; got: {err if err else 'outputs'}"))


if __name__ == "__main__":
    os.makedirs(D, exist_ok=True)
    nms_cases()
    dyn_cases()
    dft_cases()
    signal_cases()
    refusals()
    finish("onnx_dyn_signal_check")
