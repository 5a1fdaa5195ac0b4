"""ONNX sequences and optionals run by `fathom run` against ONNX Runtime.

The models take and give tensors (`fathom run` and fm_onnx_run feed and return tensors only) and
build sequences and optionals inside: SplitToSequence (listed lengths, a scalar chunk with a
remainder, keepdims 0), SequenceMap (a body reading a value of the graph around it; two sequences
and a tensor, two outputs), ConcatFromSequence (concat and new_axis), SequenceConstruct,
SequenceEmpty, SequenceAt, SequenceInsert, SequenceErase (negative positions too),
SequenceLength, a Loop carrying a sequence, If branches giving sequences, Optional (of a tensor,
of a sequence, empty), OptionalHasElement, OptionalGetElement and a Loop carrying an optional
that becomes a sequence (as ONNX's test_loop16_seq_none). Each also runs on the check device
(bit for bit against the CPU). Tolerance 1e-5 relative. Refusals (exit 1, named, and ONNX
Runtime refusing too): SequenceAt out of range, ConcatFromSequence of mismatched shapes,
OptionalGetElement of an empty optional, SequenceInsert of another dtype, a tensor op given a
sequence; and a model whose output is a sequence, which `fathom run` does not give.

  onnx_seq_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import os
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as T, helper as h, save
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)

from onnx_check_lib import D, fathom_run, finish, report, report_outputs

ort.set_default_logger_severity(4)  # the refusals below are expected; their ONNX Runtime errors are caught

F, I, B = T.FLOAT, T.INT64, T.BOOL
RUNS = os.path.join(D, "runs.txt")  # each run: model and feeds (for running them again, under valgrind)


def vi(name, t, shape=None):
    return h.make_tensor_value_info(name, t, shape)


def seq_vi(name, t):
    return h.make_value_info(name, h.make_sequence_type_proto(h.make_tensor_type_proto(t, None)))


def save_model(tag, nodes, ins, outs, inits=(), opset=18):
    g = h.make_graph(nodes, tag, ins, outs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    path = f"{D}/{tag}.onnx"
    save(m, path)
    return path


def ort_run(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [o.name for o in s.get_outputs()], s.run(None, feeds)


def record(tag, path, feeds):
    with open(RUNS, "a") as f:
        f.write(" ".join([path] + [f"{k}={D}/{tag}_{k}.npy" for k in feeds]) + "\n")


def compare(tag, path, feeds):
    names, ref = ort_run(path, feeds)
    got, err = fathom_run(path, feeds, tag)
    record(tag, path, feeds)
    if err:
        report(False, f"{tag}: fathom refused: {err}")
        return
    report_outputs(tag, names, ref, got)
    dev, err = fathom_run(path, feeds, tag, device="check")
    same = dev is not None and all(np.array_equal(dev[n], got[n]) and dev[n].dtype == got[n].dtype for n in names)
    report(same, f"{tag}: on the check device, the CPU's outputs bit for bit" + ("" if same else f": {err}"))


def refused(tag, path, feeds, want):
    try:
        ort_run(path, feeds)
        ort_ok = False
    except Exception:  # noqa: BLE001 (ONNX Runtime's errors are of several classes)
        ort_ok = True
    got, err = fathom_run(path, feeds, tag)
    record(tag, path, feeds)
    ok = err is not None and err[0] == 1 and want in err[1] and "Sanitizer" not in err[1]
    report(ok and ort_ok, f"{tag} refused{'' if ort_ok else ' (but ONNX Runtime ran it)'}: {err[1] if err else 'ran'}")


rng = np.random.default_rng(5)
x46 = rng.standard_normal((4, 6)).astype(np.float32)
w = h.make_tensor("w", F, [4, 1], rng.standard_normal(4).astype(np.float32).tolist())

# SplitToSequence with listed lengths -> SequenceMap whose body reads the outer initializer w ->
# ConcatFromSequence; SequenceLength and the last part (SequenceAt -1) too
body = h.make_graph([h.make_node("Mul", ["a", "a"], ["a2"]), h.make_node("Add", ["a2", "w"], ["b"])], "sq",
                    [vi("a", F, [4, None])], [vi("b", F, [4, None])])
nodes = [h.make_node("SplitToSequence", ["x", "sp"], ["s"], axis=1), h.make_node("SequenceMap", ["s"], ["s2"], body=body),
         h.make_node("ConcatFromSequence", ["s2"], ["y"], axis=1), h.make_node("SequenceLength", ["s2"], ["n"]),
         h.make_node("SequenceAt", ["s2", "last"], ["tail"])]
p = save_model("split_map_concat", nodes, [vi("x", F, [4, 6])], [vi("y", F), vi("n", I), vi("tail", F)],
               inits=[w, h.make_tensor("sp", I, [3], [1, 2, 3]), h.make_tensor("last", I, [], [-1])])
compare("split_map_concat", p, {"x": x46})

# a scalar chunk with a remainder (7 = 3 + 3 + 1) along axis -1, concatenated back on axis 0 is
# refused by shape, so each part is summed; and keepdims 0 without split, stacked with new_axis
nodes = [h.make_node("SplitToSequence", ["x", "three"], ["s"], axis=-1), h.make_node("SequenceLength", ["s"], ["n"]),
         h.make_node("SequenceAt", ["s", "two"], ["rest"]), h.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
         h.make_node("ConcatFromSequence", ["rows"], ["st"], axis=1, new_axis=1),
         h.make_node("ConcatFromSequence", ["rows"], ["st_last"], axis=-1, new_axis=1)]
p = save_model("split_chunk_stack", nodes, [vi("x", F, [2, 7])], [vi("n", I), vi("rest", F), vi("st", F), vi("st_last", F)],
               inits=[h.make_tensor("three", I, [], [3]), h.make_tensor("two", I, [], [2])])
compare("split_chunk_stack", p, {"x": rng.standard_normal((2, 7)).astype(np.float32)})

# SequenceConstruct, SequenceErase (position -2, and the default last), SequenceInsert (at 0,
# at -1, at the end), SequenceEmpty of int64 filled by inserts
nodes = [h.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]), h.make_node("SequenceErase", ["s", "m2"], ["s1"]),
         h.make_node("SequenceInsert", ["s1", "b", "zero"], ["s2"]), h.make_node("SequenceInsert", ["s2", "c", "m1"], ["s3"]),
         h.make_node("SequenceInsert", ["s3", "a"], ["s4"]), h.make_node("SequenceErase", ["s4"], ["s5"]),
         h.make_node("ConcatFromSequence", ["s5"], ["y"], axis=0), h.make_node("SequenceLength", ["s5"], ["n"]),
         h.make_node("SequenceEmpty", [], ["e"], dtype=I), h.make_node("SequenceInsert", ["e", "n"], ["e1"]),
         h.make_node("SequenceInsert", ["e1", "n", "zero"], ["e2"]), h.make_node("ConcatFromSequence", ["e2"], ["ns"], axis=0, new_axis=1)]
p = save_model("construct_erase_insert", nodes, [vi("a", F, [1, 3]), vi("b", F, [2, 3]), vi("c", F, [3, 3])],
               [vi("y", F), vi("n", I), vi("ns", I)],
               inits=[h.make_tensor("m2", I, [], [-2]), h.make_tensor("zero", I, [], [0]), h.make_tensor("m1", I, [1], [-1])])
compare("construct_erase_insert", p, {"a": rng.standard_normal((1, 3)).astype(np.float32),
                                      "b": rng.standard_normal((2, 3)).astype(np.float32),
                                      "c": rng.standard_normal((3, 3)).astype(np.float32)})

# SequenceMap over two sequences and a tensor, two outputs (a sum and a shape per element)
body = h.make_graph([h.make_node("Add", ["p", "q"], ["pq"]), h.make_node("Mul", ["pq", "k"], ["o"]), h.make_node("Shape", ["p"], ["sh"])],
                    "two", [vi("p", F, [None, 3]), vi("q", F, [None, 3]), vi("k", F, [])], [vi("o", F, [None, 3]), vi("sh", I, [2])])
nodes = [h.make_node("SplitToSequence", ["x", "spa"], ["sa"], axis=0), h.make_node("SplitToSequence", ["z", "spa"], ["sb"], axis=0),
         h.make_node("SequenceMap", ["sa", "sb", "k"], ["so", "ssh"], body=body),
         h.make_node("ConcatFromSequence", ["so"], ["y"], axis=0), h.make_node("ConcatFromSequence", ["ssh"], ["shapes"], axis=0, new_axis=1)]
p = save_model("map_two_seqs", nodes, [vi("x", F, [6, 3]), vi("z", F, [6, 3]), vi("k", F, [])], [vi("y", F), vi("shapes", I)],
               inits=[h.make_tensor("spa", I, [3], [1, 2, 3])])
compare("map_two_seqs", p, {"x": rng.standard_normal((6, 3)).astype(np.float32), "z": rng.standard_normal((6, 3)).astype(np.float32),
                            "k": np.array(0.5, np.float32)})

# Loop carrying a sequence from SequenceEmpty (x[:i+1] appended each step) with a scan output,
# then the sequence concatenated; zero trips gives the empty sequence (its length)
body = h.make_graph([h.make_node("Identity", ["cin"], ["cout"]), h.make_node("Add", ["i", "one"], ["e"]),
                     h.make_node("Unsqueeze", ["e", "ax0"], ["e1"]), h.make_node("Slice", ["x", "z1", "e1"], ["part"]),
                     h.make_node("SequenceInsert", ["sin", "part"], ["sout"]), h.make_node("SequenceLength", ["sout"], ["len"])],
                    "lb", [vi("i", I, []), vi("cin", B, []), seq_vi("sin", F)], [vi("cout", B, []), seq_vi("sout", F), vi("len", I, [])])
nodes = [h.make_node("SequenceEmpty", [], ["s0"]), h.make_node("Loop", ["M", "", "s0"], ["s", "lens"], body=body),
         h.make_node("SequenceLength", ["s"], ["n"]), h.make_node("If", ["has"], ["y"],
                                                                    then_branch=h.make_graph([h.make_node("ConcatFromSequence", ["s"], ["yc"], axis=0)], "t", [], [vi("yc", F)]),
                                                                    else_branch=h.make_graph([h.make_node("Identity", ["x"], ["ye"])], "e", [], [vi("ye", F)])),
         ]
nodes.insert(3, h.make_node("Greater", ["n", "zero"], ["has"]))
p = save_model("loop_seq", nodes, [vi("M", I, []), vi("x", F, [5])], [vi("y", F), vi("lens", I), vi("n", I)],
               inits=[h.make_tensor("one", I, [], [1]), h.make_tensor("ax0", I, [1], [0]), h.make_tensor("z1", I, [1], [0]),
                      h.make_tensor("zero", I, [], [0])])
x5 = rng.standard_normal(5).astype(np.float32)
compare("loop_seq", p, {"M": np.array(4, np.int64), "x": x5})
compare("loop_seq_zero_trips", p, {"M": np.array(0, np.int64), "x": x5})

# If whose branches give sequences (two copies, or the rows split), concatenated after it
then_g = h.make_graph([h.make_node("SequenceConstruct", ["x", "x"], ["ts"])], "t", [], [seq_vi("ts", F)])
else_g = h.make_graph([h.make_node("SplitToSequence", ["x"], ["es"], axis=0)], "e", [], [seq_vi("es", F)])
nodes = [h.make_node("If", ["c"], ["s"], then_branch=then_g, else_branch=else_g), h.make_node("ConcatFromSequence", ["s"], ["y"], axis=0),
         h.make_node("SequenceLength", ["s"], ["n"])]
p = save_model("if_seq", nodes, [vi("c", B, []), vi("x", F, [3, 2])], [vi("y", F), vi("n", I)])
x32 = rng.standard_normal((3, 2)).astype(np.float32)
compare("if_seq_then", p, {"c": np.array(True), "x": x32})
compare("if_seq_else", p, {"c": np.array(False), "x": x32})

# optionals: of a tensor (has it, gets it), an empty one chosen by If (has none), of a sequence
opt_f = h.make_optional_type_proto(h.make_tensor_type_proto(F, None))
then_g = h.make_graph([h.make_node("Optional", ["x"], ["o_t"])], "t", [], [h.make_value_info("o_t", opt_f)])
else_g = h.make_graph([h.make_node("Optional", [], ["o_e"], type=h.make_tensor_type_proto(F, None))], "e", [], [h.make_value_info("o_e", opt_f)])
nodes = [h.make_node("If", ["c"], ["o"], then_branch=then_g, else_branch=else_g), h.make_node("OptionalHasElement", ["o"], ["has"]),
         h.make_node("Optional", ["x"], ["ox"]), h.make_node("OptionalGetElement", ["ox"], ["gx"]), h.make_node("Mul", ["gx", "gx"], ["y"]),
         h.make_node("SequenceConstruct", ["x", "gx"], ["s"]), h.make_node("Optional", ["s"], ["os"]),
         h.make_node("OptionalHasElement", ["os"], ["has_s"]), h.make_node("OptionalGetElement", ["os"], ["gs"]),
         h.make_node("ConcatFromSequence", ["gs"], ["ys"], axis=0), h.make_node("OptionalHasElement", ["x"], ["has_x"]),
         h.make_node("OptionalGetElement", ["x"], ["gx2"])]
p = save_model("optionals", nodes, [vi("c", B, []), vi("x", F, [2, 3])],
               [vi("has", B), vi("y", F), vi("has_s", B), vi("ys", F), vi("has_x", B), vi("gx2", F)])
x23 = rng.standard_normal((2, 3)).astype(np.float32)
compare("optionals_full", p, {"c": np.array(True), "x": x23})
compare("optionals_empty", p, {"c": np.array(False), "x": x23})

# a Loop carrying an optional sequence that starts empty and becomes the sequence (test_loop16_seq_none's
# pattern): the first iteration starts a sequence, the next append to it
opt_seq = h.make_optional_type_proto(h.make_sequence_type_proto(h.make_tensor_type_proto(F, None)))
start = h.make_graph([h.make_node("SequenceConstruct", ["xi"], ["ns"])], "start", [], [seq_vi("ns", F)])
cont = h.make_graph([h.make_node("OptionalGetElement", ["oin"], ["old"])], "cont", [], [seq_vi("old", F)])
body = h.make_graph([h.make_node("Identity", ["cin"], ["cout"]), h.make_node("Cast", ["i"], ["fi"], to=F), h.make_node("Mul", ["x", "fi"], ["xi"]),
                     h.make_node("OptionalHasElement", ["oin"], ["has"]), h.make_node("Not", ["has"], ["none"]),
                     h.make_node("If", ["none"], ["cur"], then_branch=start, else_branch=cont),
                     h.make_node("SequenceInsert", ["cur", "xi"], ["sout"])],
                    "ob", [vi("i", I, []), vi("cin", B, []), h.make_value_info("oin", opt_seq)], [vi("cout", B, []), seq_vi("sout", F)])
nodes = [h.make_node("Optional", [], ["o0"], type=h.make_sequence_type_proto(h.make_tensor_type_proto(F, None))),
         h.make_node("Loop", ["M", "", "o0"], ["s"], body=body), h.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1)]
p = save_model("loop_optional", nodes, [vi("M", I, []), vi("x", F, [3])], [vi("y", F)])
compare("loop_optional", p, {"M": np.array(3, np.int64), "x": rng.standard_normal(3).astype(np.float32)})

# refusals
nodes = [h.make_node("SplitToSequence", ["x"], ["s"], axis=0), h.make_node("SequenceAt", ["s", "pos"], ["y"])]
p = save_model("at_range", nodes, [vi("x", F, [3, 2]), vi("pos", I, [])], [vi("y", F)])
refused("sequence_at_out_of_range", p, {"x": x32, "pos": np.array(5, np.int64)},
        "(SequenceAt): position 5 is out of range for a sequence of 3 tensors")
refused("sequence_at_below_range", p, {"x": x32, "pos": np.array(-4, np.int64)}, "position -4 is out of range")
nodes = [h.make_node("SequenceConstruct", ["a", "b"], ["s"]), h.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
p = save_model("concat_mismatch", nodes, [vi("a", F, [2, 3]), vi("b", F, [2, 4])], [vi("y", F)])
refused("concat_mismatched_shapes", p, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 4), np.float32)},
        "(ConcatFromSequence): tensor 1 of the sequence has shape [2, 4] but tensor 0 has [2, 3]")
nodes = [h.make_node("If", ["c"], ["o"], then_branch=h.make_graph([h.make_node("Optional", ["x"], ["o_t"])], "t", [], [h.make_value_info("o_t", opt_f)]),
                     else_branch=h.make_graph([h.make_node("Optional", [], ["o_e"], type=h.make_tensor_type_proto(F, None))], "e", [],
                                              [h.make_value_info("o_e", opt_f)])),
         h.make_node("OptionalGetElement", ["o"], ["y"])]
p = save_model("get_empty", nodes, [vi("c", B, []), vi("x", F, [2, 3])], [vi("y", F)])
compare("get_full", p, {"c": np.array(True), "x": x23})
refused("optional_get_element_empty", p, {"c": np.array(False), "x": x23}, "(OptionalGetElement): the optional is empty")
nodes = [h.make_node("SequenceConstruct", ["a"], ["s"]), h.make_node("SequenceInsert", ["s", "b"], ["s2"]),
         h.make_node("SequenceLength", ["s2"], ["n"])]
p = save_model("insert_dtype", nodes, [vi("a", F, [2]), vi("b", I, [2])], [vi("n", I)])
refused("sequence_insert_dtype", p, {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.int64)},
        "(SequenceInsert): the tensor is i64 but the sequence holds f32")
nodes = [h.make_node("SequenceConstruct", ["a"], ["s"]), h.make_node("Add", ["s", "a"], ["y"])]
p = save_model("tensor_op_seq", nodes, [vi("a", F, [2])], [vi("y", F)])
refused("tensor_op_given_sequence", p, {"a": np.zeros(2, np.float32)}, "(Add): input 's' is a sequence; Add takes tensors")
nodes = [h.make_node("SplitToSequence", ["x"], ["s"], axis=0)]
p = save_model("seq_output", nodes, [vi("x", F, [3, 2])], [seq_vi("s", F)])
got, err = fathom_run(p, {"x": x32}, "seq_output")
record("seq_output", p, {"x": x32})
report(err is not None and err[0] == 1 and "output 's' is a sequence; fm_onnx_run (and `fathom run`) take and give tensors only" in err[1],
       f"a sequence output refused by fathom run: {err[1] if err else 'ran'}")
finish("onnx_seq_check")
