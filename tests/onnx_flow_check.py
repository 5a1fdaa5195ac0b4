"""ONNX control flow (If, Loop, Scan) run by `fathom run` against ONNX Runtime.

If: both branches chosen by a data condition, each reading values of the graph around it
(outer scope). Loop: a for-loop with loop-carried values and a scan output, a while-loop ended
by the body's condition, a trip count of 0 (empty scan output), and an If nested in the body
reading a value two graphs up. Scan (opset 16): two states, reversed input and output, scan
axes 1, and opset 8's batched form. Tolerance 1e-5 relative. Refusals (exit non-zero, the node
named): a Loop with neither trip count nor condition, a branch giving the wrong number of
outputs, a body of the wrong arity, a subgraph naming a value no graph defines, scan inputs of
different lengths, and a Loop past `fathom run --max-iterations`. And ai.onnx.preview's
FlexAttention, whose score_mod and prob_mod are subgraphs too, against ONNX's reference evaluator
(ONNX Runtime has no preview ops), with a score_mod of the wrong output shape refused.

  onnx_flow_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import subprocess
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as T, helper as h, save
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)

from onnx_check_lib import D, FATHOM, fathom_run, finish, report, report_outputs

F, I, B = T.FLOAT, T.INT64, T.BOOL


def npy(name, a):
    np.save(f"{D}/lim_{name}.npy", a)
    return f"{D}/lim_{name}.npy"


def vi(name, t, shape=None):
    return h.make_tensor_value_info(name, t, shape)


def save_model(nodes, ins, outs, path, opset=16, inits=()):
    g = h.make_graph(nodes, "m", ins, outs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    save(m, path)
    return path


def compare(tag, path, feeds, ort_ok=True):
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    names = [o.name for o in ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_outputs()]
    got, err = fathom_run(path, feeds, tag)
    if err:
        report(False, f"{tag}: fathom refused: {err}")
        return
    report_outputs(tag, names, ref, got)


def refused(tag, path, feeds, want):
    got, err = fathom_run(path, feeds, tag)
    ok = err is not None and err[0] != 0 and want in err[1] and "Sanitizer" not in err[1]
    report(ok, f"{tag} refused: {err[1] if err else 'ran'}")


rng = np.random.default_rng(3)
x = rng.standard_normal((3, 4)).astype(np.float32)
w = h.make_tensor("w", F, [4], rng.standard_normal(4).astype(np.float32).tolist())

# If: then adds the outer initializer w, else multiplies by the outer value xx = x * 2
then_g = h.make_graph([h.make_node("Add", ["xx", "w"], ["t"])], "then", [], [vi("t", F)])
else_g = h.make_graph([h.make_node("Mul", ["xx", "xx"], ["e"])], "else", [], [vi("e", F)])
nodes = [h.make_node("Mul", ["x", "two"], ["xx"]), h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
         h.make_node("Greater", ["s", "zero"], ["c"]), h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
two, zero = h.make_tensor("two", F, [], [2.0]), h.make_tensor("zero", F, [], [0.0])
p = save_model(nodes, [vi("x", F, [3, 4])], [vi("y", F)], f"{D}/if.onnx", inits=[w, two, zero])
compare("if_then", p, {"x": np.abs(x)})
compare("if_else", p, {"x": -np.abs(x)})

# Loop (for): carried acc += x * i, scan output acc each step; trip count from input
body = h.make_graph([h.make_node("Cast", ["i"], ["fi"], to=F), h.make_node("Mul", ["x", "fi"], ["xi"]),
                     h.make_node("Add", ["acc", "xi"], ["acc2"]), h.make_node("Identity", ["cin"], ["cout"]),
                     h.make_node("Identity", ["acc2"], ["sc"])], "body",
                    [vi("i", I, []), vi("cin", B, []), vi("acc", F)], [vi("cout", B, []), vi("acc2", F), vi("sc", F, [3, 4])])
p = save_model([h.make_node("Loop", ["M", "", "a0"], ["acc_out", "scans"], body=body)],
               [vi("M", I, []), vi("x", F, [3, 4]), vi("a0", F, [3, 4])], [vi("acc_out", F), vi("scans", F)], f"{D}/loop_for.onnx")
compare("loop_for", p, {"M": np.array(5, np.int64), "x": x, "a0": np.ones((3, 4), np.float32)})
compare("loop_zero_trips", p, {"M": np.array(0, np.int64), "x": x, "a0": np.ones((3, 4), np.float32)})
# a body scan output declared with a negative dim (a bad file): zero trips give an empty output, no crash
bad_body = h.make_graph([h.make_node("Identity", ["cin"], ["cout"]), h.make_node("Identity", ["acc"], ["acc2"]),
                         h.make_node("Identity", ["acc"], ["sc"])], "body",
                        [vi("i", I, []), vi("cin", B, []), vi("acc", F)], [vi("cout", B, []), vi("acc2", F), vi("sc", F, [-3, 4])])
p = save_model([h.make_node("Loop", ["M", "", "a0"], ["acc_out", "scans"], body=bad_body)], [vi("M", I, []), vi("a0", F, [3, 4])],
               [vi("acc_out", F), vi("scans", F)], f"{D}/loop_negdim.onnx")
got, err = fathom_run(p, {"M": np.array(0, np.int64), "a0": np.ones((3, 4), np.float32)}, "loop_negdim")
report(err is None and got["scans"].shape[0] == 0, f"loop_negative_declared_dim: zero trips give {None if err else got['scans'].shape} {err or ''}")

# Loop (while): v = v * 1.5 while sum(v) < limit, also capped by M; nested If reading x (two graphs up)
inner_t = h.make_graph([h.make_node("Add", ["v2", "x"], ["it"])], "it", [], [vi("it", F)])
inner_e = h.make_graph([h.make_node("Identity", ["v2"], ["ie"])], "ie", [], [vi("ie", F)])
body = h.make_graph([h.make_node("Mul", ["v", "k"], ["v2"]), h.make_node("ReduceSum", ["v2"], ["sv"], keepdims=0),
                     h.make_node("Less", ["sv", "limit"], ["go"]), h.make_node("Equal", ["i", "one"], ["odd"]),
                     h.make_node("If", ["odd"], ["v3"], then_branch=inner_t, else_branch=inner_e)], "wb",
                    [vi("i", I, []), vi("cin", B, []), vi("v", F)], [vi("go", B, []), vi("v3", F)])
inits = [h.make_tensor("k", F, [], [1.5]), h.make_tensor("one", I, [], [1])]
p = save_model([h.make_node("Loop", ["M", "c0", "v0"], ["v_out"], body=body)],
               [vi("M", I, []), vi("c0", B, []), vi("v0", F, [3, 4]), vi("x", F, [3, 4]), vi("limit", F, [])], [vi("v_out", F)],
               f"{D}/loop_while.onnx", inits=inits)
feeds = {"M": np.array(50, np.int64), "c0": np.array(True), "v0": np.abs(x) + 0.1, "x": x, "limit": np.array(200.0, np.float32)}
compare("loop_while_nested_if", p, feeds)
compare("loop_while_false_at_start", p, dict(feeds, c0=np.array(False)))

# Scan: two states (running sum and running max), reversed input and output, scan axis 1
body = h.make_graph([h.make_node("Add", ["s", "xt"], ["s2"]), h.make_node("Max", ["m", "xt"], ["m2"]),
                     h.make_node("Mul", ["s2", "m2"], ["o"])], "sb",
                    [vi("s", F, [3]), vi("m", F, [3]), vi("xt", F, [3])], [vi("s2", F, [3]), vi("m2", F, [3]), vi("o", F, [3])])
xs = rng.standard_normal((3, 6)).astype(np.float32)
for tag, attrs in (("scan_fwd", dict(scan_input_axes=[1])),
                   ("scan_rev_axis1", dict(scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1], scan_output_directions=[1]))):
    p = save_model([h.make_node("Scan", ["s0", "m0", "xs"], ["s_out", "m_out", "ys"], body=body, num_scan_inputs=1, **attrs)],
                   [vi("s0", F, [3]), vi("m0", F, [3]), vi("xs", F, [3, 6])], [vi("s_out", F), vi("m_out", F), vi("ys", F)], f"{D}/{tag}.onnx")
    compare(tag, p, {"s0": np.zeros(3, np.float32), "m0": np.full(3, -9, np.float32), "xs": xs})

# Scan opset 8: batch axis first, sequence_lens omitted
body8 = h.make_graph([h.make_node("Add", ["s", "xt"], ["s2"]), h.make_node("Identity", ["s2"], ["o"])], "b8",
                     [vi("s", F, [2]), vi("xt", F, [2])], [vi("s2", F, [2]), vi("o", F, [2])])
p = save_model([h.make_node("Scan", ["", "s0", "xs"], ["s_out", "ys"], body=body8, num_scan_inputs=1, directions=[1])],
               [vi("s0", F, [2, 2]), vi("xs", F, [2, 5, 2])], [vi("s_out", F), vi("ys", F)], f"{D}/scan8.onnx", opset=8)
compare("scan_opset8", p, {"s0": np.zeros((2, 2), np.float32), "xs": rng.standard_normal((2, 5, 2)).astype(np.float32)})

# FlexAttention (ai.onnx.preview; ONNX Runtime has none: ONNX's reference evaluator is the peer):
# grouped-query heads, a score_mod adding a scaled relative-position bias (its reference evaluator
# gives a mod graph no outer scope, so the scale is the subgraph's own), a prob_mod, and a score_mod
# whose output shape is wrong (refused)
from onnx.reference import ReferenceEvaluator  # noqa: E402


def flex_model(path, score_mod=None, prob_mod=None, inits=()):
    attrs = {k: v for k, v in (("score_mod", score_mod), ("prob_mod", prob_mod)) if v is not None}
    node = h.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview", **attrs)
    g = h.make_graph([node], "flex", [vi("q", F, [2, 4, 5, 8]), vi("k", F, [2, 2, 6, 8]), vi("v", F, [2, 2, 6, 3])],
                     [vi("y", F)], initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 23), h.make_opsetid("ai.onnx.preview", 1)])
    m.ir_version = 10
    save(m, path)
    return m


sm = h.make_graph([h.make_node("Shape", ["s"], ["sh"]), h.make_node("Gather", ["sh", "i2"], ["L"]), h.make_node("Gather", ["sh", "i3"], ["S"]),
                   h.make_node("Range", ["z", "L", "o"], ["qr"]), h.make_node("Range", ["z", "S", "o"], ["kr"]),
                   h.make_node("Unsqueeze", ["qr", "o1"], ["qc"]), h.make_node("Sub", ["qc", "kr"], ["rel"]),
                   h.make_node("Cast", ["rel"], ["relf"], to=F), h.make_node("Mul", ["relf", "w"], ["bias"]),
                   h.make_node("Add", ["s", "bias"], ["so"])], "score_mod", [vi("s", F, ["B", "H", "L", "S"])], [vi("so", F, ["B", "H", "L", "S"])],
                  initializer=[h.make_tensor("i2", I, [], [2]), h.make_tensor("i3", I, [], [3]), h.make_tensor("z", I, [], [0]),
                               h.make_tensor("o", I, [], [1]), h.make_tensor("o1", I, [1], [1]), h.make_tensor("w", F, [], [0.3])])
pm = h.make_graph([h.make_node("Mul", ["p", "p"], ["po"])], "prob_mod", [vi("p", F, ["B", "H", "L", "S"])], [vi("po", F, ["B", "H", "L", "S"])])
feeds = {"q": rng.standard_normal((2, 4, 5, 8)).astype(np.float32), "k": rng.standard_normal((2, 2, 6, 8)).astype(np.float32),
         "v": rng.standard_normal((2, 2, 6, 3)).astype(np.float32)}
for tag, kw in (("flex_gqa", {}), ("flex_score_mod", {"score_mod": sm}), ("flex_both_mods", {"score_mod": sm, "prob_mod": pm})):
    m = flex_model(f"{D}/{tag}.onnx", **kw)
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    got, err = fathom_run(f"{D}/{tag}.onnx", feeds, tag)
    y = got.get("y") if got else None
    ok = y is not None and y.shape == want.shape and float(np.max(np.abs(y - want))) <= 1e-5 * max(1.0, float(np.max(np.abs(want))))
    report(ok, f"{tag}: FlexAttention {want.shape} against ONNX's reference" + ("" if ok else f": {err if err else np.max(np.abs(y - want))}"))
bad = h.make_graph([h.make_node("ReduceSum", ["s", "ax"], ["so"], keepdims=1)], "score_mod", [vi("s", F, ["B", "H", "L", "S"])], [vi("so", F)],
                   initializer=[h.make_tensor("ax", I, [1], [3])])
flex_model(f"{D}/flex_bad.onnx", score_mod=bad)
refused("flex_score_mod_shape", f"{D}/flex_bad.onnx", feeds, "score_mod gave f32 [2, 4, 5, 1] for its input f32 [2, 4, 5, 6]")

# refusals
r = subprocess.run([FATHOM, "run", f"{D}/loop_for.onnx", "--max-iterations", "3", "--json"] +
                   [a for k, v in (("M", np.array(5, np.int64)), ("x", x), ("a0", x)) for a in ("--input", f"{k}={npy(k, v)}")],
                   capture_output=True, text=True)
report(r.returncode == 1 and "ran past the limit of 3 iterations" in r.stderr, f"loop --max-iterations 3 refused: {r.stderr.strip()}")
body = h.make_graph([h.make_node("Identity", ["cin"], ["cout"]), h.make_node("Identity", ["v"], ["v2"])], "b",
                    [vi("i", I, []), vi("cin", B, []), vi("v", F)], [vi("cout", B, []), vi("v2", F)])
p = save_model([h.make_node("Loop", ["", "", "v0"], ["v_out"], body=body)], [vi("v0", F, [2])], [vi("v_out", F)], f"{D}/endless.onnx")
refused("loop_endless", p, {"v0": np.zeros(2, np.float32)}, "neither a trip count nor a condition")
short = h.make_graph([h.make_node("Identity", ["x"], ["t"])], "t", [], [vi("t", F)])
two_out = h.make_graph([h.make_node("Identity", ["x"], ["a"]), h.make_node("Identity", ["x"], ["b"])], "e", [], [vi("a", F), vi("b", F)])
p = save_model([h.make_node("If", ["c"], ["y"], then_branch=short, else_branch=two_out)], [vi("c", B, []), vi("x", F, [2])], [vi("y", F)],
               f"{D}/if_arity.onnx")
refused("if_branch_outputs", p, {"c": np.array(False), "x": np.zeros(2, np.float32)}, "gives 2 outputs; the node has 1")
p = save_model([h.make_node("Loop", ["M", "", "v0", "v0"], ["a", "b"], body=body)], [vi("M", I, []), vi("v0", F, [2])],
               [vi("a", F), vi("b", F)], f"{D}/loop_arity.onnx")
refused("loop_body_arity", p, {"M": np.array(2, np.int64), "v0": np.zeros(2, np.float32)}, "the body takes 3 inputs")
ghost = h.make_graph([h.make_node("Add", ["x", "nowhere"], ["t"])], "g", [], [vi("t", F)])
p = save_model([h.make_node("If", ["c"], ["y"], then_branch=ghost, else_branch=ghost)], [vi("c", B, []), vi("x", F, [2])], [vi("y", F)],
               f"{D}/if_ghost.onnx")
refused("if_undefined_name", p, {"c": np.array(True), "x": np.zeros(2, np.float32)}, "input 'nowhere' is not produced")
body = h.make_graph([h.make_node("Add", ["a", "b"], ["o"])], "sb", [vi("a", F, [2]), vi("b", F, [2])], [vi("o", F, [2])])
p = save_model([h.make_node("Scan", ["xa", "xb"], ["ys"], body=body, num_scan_inputs=2)], [vi("xa", F, [3, 2]), vi("xb", F, [4, 2])],
               [vi("ys", F)], f"{D}/scan_len.onnx")
refused("scan_lengths", p, {"xa": np.zeros((3, 2), np.float32), "xb": np.zeros((4, 2), np.float32)}, "has 4 steps; scan input 0 has 3")
finish("onnx_flow_check")
