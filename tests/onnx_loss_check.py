"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss run by `fathom run` (the ONNX
interpreter), against ONNX Runtime and, where torch is installed, against
torch.nn.functional.nll_loss and cross_entropy (log_prob: log_softmax over dim 1).

One-node models made with onnx.helper: a 4-D input [N, C, d1, d2] with class weights and a
negative ignore_index at opsets 12, 13 and 22 (SoftmaxCrossEntropyLoss: 12 and 13, with its
log_prob output), each with reduction none, sum and mean; int32 targets with an ignore_index
inside [0, C); an ignore_index above C; no weight and no ignore_index; float64 and float16
inputs; a batch whose every target is ignored (mean is NaN: 0 / 0, as ONNX Runtime gives),
zero weights, and NaN and inf placed where only ignored elements read them (the loss there is
0, as in ONNX Runtime). Every model also runs with --device check (the CPU's kernels behind
the device interface), which must give the CPU's outputs bit for bit. Then models fathom must
refuse, with exit code 1 and an error naming the node and the reason: a target outside
[0, C) that is not the ignore_index (above C, and negative), a float target, a weight of the
wrong length, a target of the wrong shape, an unknown reduction.

Tolerances, element for element, NaN where the reference has NaN:
  float32 |got - want| <= 1e-6 + 1e-5 |want|   (the sums' order and log_softmax's rounding)
  float64 |got - want| <= 1e-12 + 1e-12 |want|
  float16 |got - want| <= 1e-3 + 4e-3 |want|   (a few float16 ulps: fathom's sums and
          log_softmax are computed more precisely than float16; torch gets float32 inputs)

  onnx_loss_check.py FATHOM_BIN TMPDIR
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
from onnx_check_lib import D, close_within, fathom_run, finish, report  # noqa: E402 (after the skip above)
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

NLL, SCE = "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"
ETYPE = {np.dtype(np.float32): T.FLOAT, np.dtype(np.float64): T.DOUBLE, np.dtype(np.float16): T.FLOAT16,
         np.dtype(np.int64): T.INT64, np.dtype(np.int32): T.INT32}
TOL = {np.dtype(np.float32): (1e-6, 1e-5), np.dtype(np.float64): (1e-12, 1e-12), np.dtype(np.float16): (1e-3, 4e-3)}


def model(tag, op, feeds, opset, n_out=1, **attrs):
    """One node reading the feeds in order (x, t, then w when given); outputs y (and lp)."""
    ins = [helper.make_tensor_value_info(k, ETYPE[v.dtype], None) for k, v in feeds.items()]
    xt = ETYPE[feeds["x"].dtype]
    outs = [helper.make_tensor_value_info(n, xt, None) for n in ["y", "lp"][:n_out]]
    node = helper.make_node(op, list(feeds), ["y", "lp"][:n_out], name=tag, **attrs)
    m = helper.make_model(helper.make_graph([node], tag, ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


def close(got, want):
    return close_within(got, want, *TOL[want.dtype])


def torch_ref(op, feeds, reduction, ignore_index):
    """torch's loss (and log_prob), in the input's dtype; float16 is computed in float32."""
    x = torch.from_numpy(feeds["x"].astype(np.float32 if feeds["x"].dtype == np.float16 else feeds["x"].dtype))
    t = torch.from_numpy(feeds["t"].astype(np.int64))
    w = torch.from_numpy(feeds["w"].astype(x.numpy().dtype)) if "w" in feeds else None
    ii = -100 if ignore_index is None else ignore_index
    lp = F.log_softmax(x, 1) if op == SCE else x
    y = F.nll_loss(lp, t, weight=w, ignore_index=ii, reduction=reduction)
    dt = feeds["x"].dtype
    return {"y": y.numpy().astype(dt), "lp": lp.numpy().astype(dt)}


def check(tag, op, feeds, opset, reduction=None, ignore_index=None, n_out=1, expect=None):
    attrs = {} if reduction is None else {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    p = model(tag, op, feeds, opset, n_out, **attrs)
    got, err = fathom_run(p, feeds, tag)
    if got is None:
        report(False, f"{tag}: fathom refused it: {err}")
        return
    s = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    msgs, ok = [], True
    for k in want:
        good, m = close(got[k], want[k])
        ok &= good
        msgs.append(f"{k} {m}")
    report(ok, f"{tag} ({op} opset {opset}, {reduction or 'mean'}) vs ORT: " + "; ".join(msgs))
    if expect is not None:
        report(bool(expect(got["y"])), f"{tag}: y = {got['y'].ravel()[:6]} as expected")
    if torch is not None:
        ref = torch_ref(op, feeds, reduction or "mean", ignore_index)
        res = [close(got[k], ref[k]) for k in got]
        report(all(r[0] for r in res), f"{tag} vs torch: " + "; ".join(f"{k} {r[1]}" for k, r in zip(got, res)))
    dev, err = fathom_run(p, feeds, tag, "check")
    same = dev is not None and all(np.array_equal(dev[k], got[k], equal_nan=True) and dev[k].dtype == got[k].dtype for k in got)
    report(same, f"{tag}: --device check gives the CPU's outputs bit for bit" + ("" if dev is not None else f": {err}"))


def cases():
    r = np.random.default_rng(11)
    n, c = 3, 5
    x4 = r.standard_normal((n, c, 4, 3)).astype(np.float32)
    t4 = r.integers(0, c, (n, 4, 3)).astype(np.int64)
    t4[r.random(t4.shape) < 0.3] = -1
    w = (r.random(c) + 0.25).astype(np.float32)
    lp4 = torch_free_log_softmax(x4)
    for red in ("none", "sum", "mean"):
        for opset in (12, 13, 22):
            check(f"nll4d_w_negii_{red}_o{opset}", NLL, {"x": lp4, "t": t4, "w": w}, opset, red, -1)
        for opset in (12, 13):
            check(f"sce4d_w_negii_{red}_o{opset}", SCE, {"x": x4, "t": t4, "w": w}, opset, red, -1, n_out=2)
    x3 = r.standard_normal((4, c, 6)).astype(np.float32)
    t3 = r.integers(0, c, (4, 6)).astype(np.int32)
    for op, xv in ((NLL, torch_free_log_softmax(x3)), (SCE, x3)):
        short = "nll" if op == NLL else "sce"
        check(f"{short}_i32_ii2_mean", op, {"x": xv, "t": t3}, 13, "mean", 2)
        check(f"{short}_w_highii_sum", op, {"x": xv, "t": t3, "w": w}, 13, "sum", 10)
        check(f"{short}_2d_default", op, {"x": xv[:, :, 0].copy(), "t": t3[:, 0].astype(np.int64)}, 13)
        check(f"{short}_f64_w_ii", op, {"x": xv.astype(np.float64), "t": t3, "w": w.astype(np.float64)}, 13, "mean", 1)
        check(f"{short}_f16_w_ii", op, {"x": xv.astype(np.float16), "t": t3, "w": w.astype(np.float16)}, 13, "mean", 1,
              n_out=1 + (op == SCE))
        # every target ignored: mean is 0 / 0
        ti = np.full((4, 6), -7, np.int64)
        for red, exp in (("mean", lambda y: np.isnan(y)), ("sum", lambda y: y == 0), ("none", lambda y: np.all(y == 0))):
            check(f"{short}_all_ignored_{red}", op, {"x": xv, "t": ti}, 13, red, -7, expect=exp)
            check(f"{short}_all_ignored_w_{red}", op, {"x": xv, "t": ti, "w": w}, 13, red, -7, expect=exp)
        check(f"{short}_zero_weights_mean", op, {"x": xv, "t": t3, "w": np.zeros(c, np.float32)}, 13, "mean",
              expect=lambda y: np.isnan(y))
        # NaN and inf only where ignored elements read (class 0 and the ignored class, and
        # SCE's whole softmax row): their loss and weight are 0
        xb, tb = xv.copy(), t3.astype(np.int64)
        tb[1, 2] = tb[2, 5] = 3
        xb[1, :, 2] = np.nan
        xb[2, :, 5] = np.inf
        check(f"{short}_nan_inf_ignored", op, {"x": xb, "t": tb, "w": np.array([1, 2, 3, np.inf, 5], np.float32)}, 13,
              "mean", 3, expect=lambda y: np.isfinite(y))
        check(f"{short}_nan_inf_ignored_none", op, {"x": xb, "t": tb}, 13, "none", 3,
              expect=lambda y: np.all(np.isfinite(y)) and y[1, 2] == 0 and y[2, 5] == 0)


def torch_free_log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(x.dtype)


def refusals():
    r = np.random.default_rng(3)
    x = r.standard_normal((3, 5, 4)).astype(np.float32)
    t = r.integers(0, 5, (3, 4)).astype(np.int64)
    hi, neg = t.copy(), t.copy()
    hi[2, 1] = 7
    neg[0, 3] = -3
    cases = [
        ("bad_target_high", NLL, {"x": x, "t": hi}, {}, ["bad_target_high", "NegativeLogLikelihoodLoss", "target value 7", "C = 5"]),
        ("bad_target_negative", SCE, {"x": x, "t": neg}, {"ignore_index": -1},
         ["bad_target_negative", "SoftmaxCrossEntropyLoss", "target value -3", "C = 5", "ignore_index (-1)"]),
        ("bad_target_float", NLL, {"x": x, "t": t.astype(np.float32)}, {}, ["bad_target_float", "target must be int32 or int64", "f32"]),
        ("bad_weight_length", SCE, {"x": x, "t": t, "w": np.ones(4, np.float32)}, {},
         ["bad_weight_length", "weight [4]", "[C] = [5]"]),
        ("bad_target_shape", NLL, {"x": x, "t": t[:, :3].copy()}, {}, ["bad_target_shape", "target [3, 3] does not fit input [3, 5, 4]"]),
        ("bad_reduction", SCE, {"x": x, "t": t}, {"reduction": "average"}, ["bad_reduction", "reduction", "'average'"]),
    ]
    for tag, op, feeds, attrs, needles in cases:
        p = model(tag, op, feeds, 13, **attrs)
        got, err = fathom_run(p, feeds, tag)
        ok = got is None and err[0] == 1 and all(s in err[1] for s in needles)
        report(ok, f"{tag}: exit 1, naming {', '.join(needles)}" + ("" if ok else f"; got: {err if err else 'outputs'}"))


if __name__ == "__main__":
    os.makedirs(D, exist_ok=True)
    print(f"onnxruntime {ort.__version__}; torch {torch.__version__ if torch else 'not installed (no torch comparisons)'}")
    cases()
    refusals()
    finish("onnx_loss_check")
