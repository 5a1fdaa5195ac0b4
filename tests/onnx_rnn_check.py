"""ONNX's recurrent ops LSTM, GRU and RNN run by `fathom run`, against ONNX Runtime and PyTorch.

  * PyTorch modules exported by torch.onnx.export (the TorchScript exporter, dynamo=False):
    nn.LSTM (2 layers, bidirectional, batch_first), nn.GRU (bidirectional), nn.RNN (tanh and
    relu), and one float64 LSTM, each with seeded random weights and input, compared with
    torch and with ONNX Runtime.
  * models built with onnx.helper that use what the exporter never writes: sequence_lens
    (an empty sequence among them), peepholes, clip, input_forget, initial_h/initial_c,
    linear_before_reset 0 and 1, layout 1, reverse and bidirectional, every activation the
    spec names with activation_alpha/activation_beta, all three outputs; against ONNX Runtime.
    Affine, ScaledTanh and ThresholdedRelu are always given their alpha (and beta): ONNX
    Runtime reads a missing one as 0, where the spec (and fathom) take the defaults of the ONNX
    ops of those names.
  * refusals (wrong W shape, a float16 input, sequence_lens out of range or int64, an unknown
    activation, the wrong number of activations, hidden_size against R): the error must name
    the node and say what was wrong.

Tolerances: float32 within 1e-5 relative plus 1e-6 absolute of ONNX Runtime and of PyTorch
(the same float32 operations summed in another order, a few steps deep); float64 within 1e-12.

  onnx_rnn_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx, onnxruntime or torch is missing."""
import os
import sys
import warnings

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import TensorProto as T, helper, numpy_helper
except ImportError as e:
    print(f"SKIP: needs numpy, onnx, onnxruntime and torch ({e.name} missing)")
    sys.exit(77)
from onnx_check_lib import D, fathom_run, finish, report  # noqa: E402 (after the skip above)

ort.set_default_logger_severity(4)  # its own messages for the nodes it refuses (reported here)
TOL = {np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-13)}


def ort_run(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def compare(tag, got, want, against):
    """Every output of want in got, same shape and dtype, within TOL."""
    worst, bad = 0.0, []
    for k, w in want.items():
        g = got.get(k)
        if g is None or g.shape != w.shape or g.dtype != w.dtype:
            bad.append(f"{k}: {None if g is None else (g.shape, g.dtype)} vs {(w.shape, w.dtype)}")
            continue
        rtol, atol = TOL[w.dtype.type]
        if not np.allclose(g, w, rtol=rtol, atol=atol):
            bad.append(f"{k}: max |diff| {np.max(np.abs(g.astype(np.float64) - w)):.3g}")
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w) / (atol + rtol * np.abs(w)), initial=0)))
    report(not bad, f"{tag}: {', '.join(sorted(want))} equal to {against} (worst diff {worst:.2g} of the tolerance)"
           + (f"; {'; '.join(bad)}" if bad else ""))


# ---- PyTorch's exported modules ----
class Wrap(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        y, h = self.rnn(x)
        return (y, *h) if isinstance(h, tuple) else (y, h)


def torch_models():
    cases = [
        ("lstm_2l_bi_bf", torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True), (3, 6, 5), ["y", "hn", "cn"]),
        # batch >= 8: the recurrent product through the packed weights (onnx_ops_rnn.c)
        ("lstm_batch9", torch.nn.LSTM(6, 19, bidirectional=True, batch_first=True), (9, 5, 6), ["y", "hn", "cn"]),
        ("gru_batch9", torch.nn.GRU(6, 19, num_layers=2, batch_first=True), (9, 5, 6), ["y", "hn"]),
        ("gru_bi", torch.nn.GRU(4, 6, bidirectional=True), (5, 2, 4), ["y", "hn"]),
        ("rnn_tanh", torch.nn.RNN(4, 5, num_layers=2, nonlinearity="tanh"), (6, 3, 4), ["y", "hn"]),
        ("rnn_relu", torch.nn.RNN(4, 5, nonlinearity="relu", batch_first=True), (2, 7, 4), ["y", "hn"]),
        ("lstm_f64", torch.nn.LSTM(3, 4, bidirectional=True).double(), (4, 2, 3), ["y", "hn", "cn"]),
    ]
    for i, (tag, mod, shape, outs) in enumerate(cases):
        torch.manual_seed(10 + i)
        for p in mod.parameters():
            torch.nn.init.uniform_(p, -0.6, 0.6)
        dt = next(mod.parameters()).dtype
        x = torch.randn(*shape, dtype=dt)
        w = Wrap(mod).eval()
        path = os.path.join(D, tag + ".onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(w, (x,), path, input_names=["x"], output_names=outs, opset_version=14, dynamo=False)
        with torch.no_grad():
            ref = {k: v.numpy() for k, v in zip(outs, w(x))}
        feeds = {"x": x.numpy()}
        got, err = fathom_run(path, feeds, tag)
        if got is None:
            report(False, f"{tag}: fathom run failed: {err}")
            continue
        ops = sorted({n.op_type for n in onnx.load(path).graph.node if n.op_type in ("LSTM", "GRU", "RNN")})
        compare(f"{tag} ({'/'.join(ops)}, torch export)", got, ref, "PyTorch")
        try:
            compare(f"{tag} ({'/'.join(ops)}, torch export)", got, ort_run(path, feeds), "ONNX Runtime")
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's CPU kernels lack some float64 ops
            print(f"note: {tag}: ONNX Runtime does not run it ({str(e).splitlines()[0][:160]}); compared with PyTorch only")


# ---- hand-built nodes ----
INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]


def node_model(tag, op, feeds, n_out, attrs, opset=14, elem=T.FLOAT):
    """One op node named tag; feeds maps INPUTS names to arrays (missing: omitted)."""
    last = max(INPUTS.index(k) for k in feeds)
    ins = [k if k in feeds else "" for k in INPUTS[:last + 1]]
    outs = ["Y", "Y_h", "Y_c"][:n_out]
    node = helper.make_node(op, ins, outs, name=tag, **attrs)
    def vi(k, v):
        return helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
    g = helper.make_graph([node], tag, [vi(k, v) for k, v in feeds.items()],
                          [helper.make_tensor_value_info(o, elem, None) for o in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


rng = np.random.default_rng(5)


def rnd(*shape, scale=1.0, dt=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dt)


def layer_feeds(op, seq, batch, inp, hid, dirs, layout=0, bias=True, lens=None, h0=False, c0=False, peep=False, dt=np.float32):
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    f = {"X": rnd(*((batch, seq, inp) if layout else (seq, batch, inp)), dt=dt),
         "W": rnd(dirs, g * hid, inp, scale=0.5, dt=dt), "R": rnd(dirs, g * hid, hid, scale=0.5, dt=dt)}
    st = (batch, dirs, hid) if layout else (dirs, batch, hid)
    if bias:
        f["B"] = rnd(dirs, 2 * g * hid, scale=0.3, dt=dt)
    if lens is not None:
        f["sequence_lens"] = np.array(lens, np.int32)
    if h0:
        f["initial_h"] = rnd(*st, dt=dt)
    if c0:
        f["initial_c"] = rnd(*st, dt=dt)
    if peep:
        f["P"] = rnd(dirs, 3 * hid, scale=0.5, dt=dt)
    return f


def to_layout0(feeds):
    """The same inputs for layout 0: X [seq, batch, in], initial states [dirs, batch, hid]."""
    return {k: (np.ascontiguousarray(v.transpose(1, 0, 2)) if k in ("X", "initial_h", "initial_c") else v) for k, v in feeds.items()}


def from_layout0(outs):
    return {k: np.ascontiguousarray(v.transpose(2, 0, 1, 3) if k == "Y" else v.transpose(1, 0, 2)) for k, v in outs.items()}


def built_case(tag, op, feeds, n_out, attrs, opset=14):
    """fathom against ONNX Runtime on one node. ONNX Runtime runs neither layout 1 nor
    float64 LSTM/GRU: layout 1 is checked against its run of the layout-0 node on the
    transposed inputs, and float64 against its float32 run on the same values (within
    float32's tolerance; float64's own precision is the PyTorch float64 LSTM's check)."""
    elem = helper.np_dtype_to_tensor_dtype(feeds["X"].dtype)
    p = node_model(tag, op, feeds, n_out, attrs, opset, elem)
    got, err = fathom_run(p, feeds, tag)
    if got is None:
        report(False, f"{tag}: fathom run failed: {err}")
        return
    ref_feeds, ref_attrs, how = feeds, attrs, ""
    if attrs.get("layout"):
        ref_feeds, ref_attrs, how = to_layout0(feeds), dict(attrs, layout=0), " (its layout-0 node, inputs transposed)"
    if elem == T.DOUBLE:
        ref_feeds = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in ref_feeds.items()}
        how += " (float32)"
    if opset < 7:  # ONNX Runtime has no kernel before opset 7, whose semantics are the same
        ref_attrs, opset = {k: v for k, v in ref_attrs.items() if k != "output_sequence"}, 7
    ref_path = node_model(tag + "_ref", op, ref_feeds, n_out, ref_attrs, opset, helper.np_dtype_to_tensor_dtype(ref_feeds["X"].dtype))
    want = ort_run(ref_path, ref_feeds)
    if attrs.get("layout"):
        want = from_layout0(want)
    if elem == T.DOUBLE:
        got = {k: v.astype(np.float32) for k, v in got.items()}
        want = {k: v.astype(np.float32) for k, v in want.items()}
    compare(f"{tag} ({op})", got, want, "ONNX Runtime" + how)


def built_models():
    lens = [5, 0, 3, 1]
    # LSTM: peepholes, clip, input_forget, sequence_lens (one empty), initial state, other
    # activations per direction, all three outputs
    built_case("lstm_all", "LSTM", layer_feeds("LSTM", 5, 4, 3, 4, 2, lens=lens, h0=True, c0=True, peep=True), 3,
               dict(hidden_size=4, direction="bidirectional", clip=0.7, input_forget=1,
                    activations=["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "ScaledTanh", "LeakyRelu"],
                    activation_alpha=[0.3, 0.9, 0.05], activation_beta=[0.45, 1.3]))
    built_case("lstm_rev_layout1", "LSTM", layer_feeds("LSTM", 4, 3, 2, 3, 1, layout=1, lens=[2, 4, 3], h0=True, peep=True), 3,
               dict(hidden_size=3, direction="reverse", layout=1))
    built_case("lstm_opset7_nobias", "LSTM", layer_feeds("LSTM", 3, 2, 3, 2, 1, bias=False), 3, dict(hidden_size=2), opset=7)
    built_case("lstm_opset1", "LSTM", layer_feeds("LSTM", 3, 2, 3, 2, 1, h0=True, c0=True), 3, dict(hidden_size=2, output_sequence=1),
               opset=1)
    # GRU: linear_before_reset 0 and 1, sequence_lens, clip, layout 1, Elu/Affine
    for lbr in (0, 1):
        built_case(f"gru_lbr{lbr}", "GRU", layer_feeds("GRU", 5, 4, 3, 4, 2, lens=lens, h0=True), 2,
                   dict(hidden_size=4, direction="bidirectional", linear_before_reset=lbr, clip=1.5,
                        activations=["Sigmoid", "Tanh", "HardSigmoid", "Elu"], activation_alpha=[0.25, 0.8],
                        activation_beta=[0.4]))
        built_case(f"gru_lbr{lbr}_layout1_rev", "GRU", layer_feeds("GRU", 4, 3, 2, 5, 1, layout=1, lens=[4, 1, 2], h0=True), 2,
                   dict(hidden_size=5, direction="reverse", layout=1, linear_before_reset=lbr))
    built_case("gru_opset3_nobias", "GRU", layer_feeds("GRU", 3, 2, 3, 2, 1, bias=False), 2, dict(hidden_size=2), opset=3)
    # RNN: every activation of the spec, with its alpha/beta given
    acts = [("Relu", None, None), ("Tanh", None, None), ("Sigmoid", None, None), ("Affine", 0.7, -0.2),
            ("LeakyRelu", 0.1, None), ("ThresholdedRelu", 0.3, None), ("ScaledTanh", 1.7, 0.6),
            ("HardSigmoid", 0.3, 0.4), ("Elu", 0.6, None), ("Softsign", None, None), ("Softplus", None, None)]
    for name, a, b in acts:
        attrs = dict(hidden_size=3, activations=[name, name], direction="bidirectional", clip=2.0)
        if a is not None:
            attrs["activation_alpha"] = [a, a]
        if b is not None:
            attrs["activation_beta"] = [b, b]
        built_case(f"rnn_{name}", "RNN", layer_feeds("RNN", 4, 2, 3, 3, 2, lens=[4, 2], h0=True), 2, attrs)
    for op in ("LSTM", "GRU", "RNN"):
        built_case(f"{op.lower()}_f64", op, layer_feeds(op, 4, 3, 2, 3, 2, lens=[4, 2, 0], h0=True, peep=op == "LSTM",
                                                         dt=np.float64), 2, dict(hidden_size=3, direction="bidirectional"))


def refusals():
    x = layer_feeds("LSTM", 3, 2, 3, 4, 1)
    bad_w = dict(x, W=rnd(1, 12, 3))
    f16 = {k: v.astype(np.float16) for k, v in x.items()}
    cases = [
        ("bad_w", "LSTM", bad_w, dict(hidden_size=4), ["'bad_w'", "input W must be [1, 16, 3]", "got [1, 12, 3]"]),
        ("bad_f16", "LSTM", f16, dict(hidden_size=4), ["'bad_f16'", "X is f16", "float32 and float64"]),
        ("bad_lens", "GRU", layer_feeds("GRU", 3, 2, 3, 4, 1, lens=[3, 4]), dict(hidden_size=4),
         ["'bad_lens'", "sequence_lens[1] is 4", "[0, 3]"]),
        ("bad_lens_i64", "RNN", dict(layer_feeds("RNN", 3, 2, 3, 4, 1), sequence_lens=np.array([3, 3], np.int64)),
         dict(hidden_size=4), ["'bad_lens_i64'", "sequence_lens must be int32", "i64"]),
        ("bad_act", "RNN", layer_feeds("RNN", 3, 2, 3, 4, 1), dict(hidden_size=4, activations=["Gelu"]),
         ["'bad_act'", "activations[0] 'Gelu'"]),
        ("bad_act_count", "GRU", layer_feeds("GRU", 3, 2, 3, 4, 2), dict(hidden_size=4, direction="bidirectional",
                                                                          activations=["Sigmoid", "Tanh"]),
         ["'bad_act_count'", "activations lists 2", "takes 4"]),
        ("bad_hidden", "RNN", layer_feeds("RNN", 3, 2, 3, 4, 1), dict(hidden_size=5),
         ["'bad_hidden'", "input W must be [1, 5, 3]"]),
        ("bad_h0", "LSTM", dict(x, initial_h=rnd(2, 2, 4)), dict(hidden_size=4),
         ["'bad_h0'", "input initial_h must be [1, 2, 4]", "num_directions, batch_size, hidden_size"]),
    ]
    for tag, op, feeds, attrs, needles in cases:
        p = node_model(tag, op, feeds, 2, attrs, elem=helper.np_dtype_to_tensor_dtype(feeds["X"].dtype))
        got, err = fathom_run(p, feeds, tag)
        ok = got is None and err[0] == 1 and all(n in err[1] for n in needles)
        report(ok, f"{tag}: refused: {err}" if ok else f"{tag}: not refused naming {', '.join(needles)}; got: {err if err else 'outputs'}")


if __name__ == "__main__":
    os.makedirs(D, exist_ok=True)
    torch_models()
    built_models()
    refusals()
    finish("onnx_rnn_check")
