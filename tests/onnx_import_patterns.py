"""Writes two ONNX models with what torch.onnx.export puts in a Hugging Face BERT
(tests/cli_onnx_import_patterns.sh imports them):

  patterns.onnx  inputs x [b, s, 4] float and mask [b, s] int64 (dim_params b, s):
                 the attention-mask construction from Shape, Range, a 2-D-index
                 Gather of the flattened mask, the logical ops and IsNaN, an
                 attention on x, and the exact GELU exported in three orders.
  erf.onnx       an Erf that is not a GELU (xe.npy its input).
  positions.onnx RoBERTa's position ids (CumSum of the non-padding mask), a float
                 exclusive, reversed CumSum, the first and last tokens (Gather of index
                 0 and -1 along the dynamic sequence) and tokens -1, 0, -2 (ids.npy, xp.npy
                 its inputs).
  reversed.onnx  rows gathered in reverse order by indices made from Range over a
                 dynamic dim (refused: only every row in order is a reshape).
  minbatch.onnx  x * min(b, 3): the same at b = 3 and 4, not at 2 (must not fold).

usage: python3 onnx_import_patterns.py OUT_DIR"""
import math
import sys

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper, save


def const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype=dtype), name))


def patterns():
    n = []
    i64 = np.int64
    n += [helper.make_node("Shape", ["x"], ["shp"]), const("c0", 0, i64), const("c1", 1, i64), const("ax0", [0], i64),
          const("ax1", [1], i64), const("one_v", [1], i64)]
    n += [helper.make_node("Gather", ["shp", "c0"], ["bd"], axis=0), helper.make_node("Gather", ["shp", "c1"], ["sd"], axis=0)]
    n += [helper.make_node("Range", ["c0", "sd", "c1"], ["rs"]), helper.make_node("Range", ["c0", "bd", "c1"], ["rb"])]
    # indices [b, s] into the flattened mask: b * s + s'
    n += [helper.make_node("Unsqueeze", ["rs", "ax0"], ["rs0"]), helper.make_node("Unsqueeze", ["rb", "ax1"], ["rb1"]),
          helper.make_node("Mul", ["rb1", "sd"], ["rbs"]), helper.make_node("Add", ["rs0", "rbs"], ["idx"]),
          helper.make_node("Flatten", ["mask"], ["mflat"], axis=2), helper.make_node("Gather", ["mflat", "idx"], ["mg"], axis=0)]
    n += [helper.make_node("Unsqueeze", ["bd", "ax0"], ["bd1"]), helper.make_node("Unsqueeze", ["sd", "ax0"], ["sd1"]),
          helper.make_node("Concat", ["bd1", "one_v", "one_v", "sd1"], ["m4shape"], axis=0),
          helper.make_node("Reshape", ["mg", "m4shape"], ["m4"]), helper.make_node("Cast", ["m4"], ["keep"], to=TensorProto.BOOL)]
    # causal: query i sees keys j <= i, and the padding mask; the logical ops each once
    n += [helper.make_node("Unsqueeze", ["rs", "ax1"], ["rs1"]),
          helper.make_node("GreaterOrEqual", ["rs1", "rs0"], ["causal"]),
          helper.make_node("And", ["keep", "causal"], ["allowed0"]), helper.make_node("Not", ["allowed0"], ["blocked"]),
          helper.make_node("Or", ["allowed0", "blocked"], ["every"]), helper.make_node("Xor", ["every", "blocked"], ["allowed"]),
          const("zero", 0.0), const("neg", -1e4), helper.make_node("Where", ["allowed", "zero", "neg"], ["bias"])]
    n += [helper.make_node("Unsqueeze", ["x", "ax1"], ["xu"]), helper.make_node("Transpose", ["xu"], ["xt"], perm=[0, 1, 3, 2]),
          helper.make_node("MatMul", ["xu", "xt"], ["sc"]), const("scale", 0.5), helper.make_node("Mul", ["sc", "scale"], ["scs"]),
          helper.make_node("Add", ["scs", "bias"], ["sb"]), helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
          helper.make_node("IsNaN", ["p"], ["pnan"]), helper.make_node("Where", ["pnan", "zero", "p"], ["p0"]),
          helper.make_node("MatMul", ["p0", "xu"], ["attn"])]
    # the exact GELU: (x (1 + erf(x / sqrt 2))) 0.5, (x 0.5)(1 + erf(x / sqrt 2)), ((1 + erf(x sqrt .5)) 0.5) x
    n += [const("sqrt2", math.sqrt(2.0)), const("rsqrt2", math.sqrt(0.5)), const("onef", 1.0), const("half", 0.5)]
    n += [helper.make_node("Div", ["x", "sqrt2"], ["d1"]), helper.make_node("Erf", ["d1"], ["e1"]),
          helper.make_node("Add", ["e1", "onef"], ["a1"]), helper.make_node("Mul", ["x", "a1"], ["m1"]),
          helper.make_node("Mul", ["m1", "half"], ["g1"])]
    n += [helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Div", ["x", "sqrt2"], ["d2"]),
          helper.make_node("Erf", ["d2"], ["e2"]), helper.make_node("Add", ["onef", "e2"], ["a2"]),
          helper.make_node("Mul", ["xh", "a2"], ["g2"])]
    n += [helper.make_node("Mul", ["rsqrt2", "x"], ["d3"]), helper.make_node("Erf", ["d3"], ["e3"]),
          helper.make_node("Add", ["e3", "onef"], ["a3"]), helper.make_node("Mul", ["a3", "half"], ["h3"]),
          helper.make_node("Mul", ["h3", "x"], ["g3"])]
    n += [helper.make_node("Add", ["g1", "g2"], ["g12"]), helper.make_node("Add", ["g12", "g3"], ["gelu"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"])
    outs = [helper.make_tensor_value_info("attn", TensorProto.FLOAT, ["b", 1, "s", 4]),
            helper.make_tensor_value_info("gelu", TensorProto.FLOAT, ["b", "s", 4])]
    return helper.make_model(helper.make_graph(n, "patterns", [x, mask], outs), opset_imports=[helper.make_opsetid("", 17)])


def erf_alone():
    n = [helper.make_node("Erf", ["x"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    return helper.make_model(helper.make_graph(n, "erf", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def positions():
    """RoBERTa's position ids from its input ids (padding id 1): cumsum(ids != 1) * (ids != 1) + 1,
    with CumSum's axis a constant; and a float running sum, exclusive and reversed, over the
    middle axis of x. Batch and sequence dynamic."""
    i64 = np.int64
    n = [const("pad", 1, i64), const("ax1", 1, i64), const("axm", -2, i64),
         helper.make_node("Equal", ["ids", "pad"], ["is_pad"]), helper.make_node("Not", ["is_pad"], ["keep_b"]),
         helper.make_node("Cast", ["keep_b"], ["keep"], to=TensorProto.INT64),
         helper.make_node("CumSum", ["keep", "ax1"], ["run"]), helper.make_node("Mul", ["run", "keep"], ["run_k"]),
         helper.make_node("Add", ["run_k", "pad"], ["pos"]),
         helper.make_node("CumSum", ["x", "axm"], ["xs"], exclusive=1, reverse=1),
         # a BERT pooler's first token and a decoder's last one: constant indices along the dynamic s
         const("first", 0, i64), const("lastp", -1, i64),
         helper.make_node("Gather", ["x", "first"], ["cls"], axis=1), helper.make_node("Gather", ["x", "lastp"], ["last"], axis=1),
         # constant indices, two of them negative, along the dynamic s
         helper.make_node("Constant", [], ["picks"], value=numpy_helper.from_array(np.array([-1, 0, -2], i64))),
         helper.make_node("Gather", ["x", "picks"], ["ends"], axis=1)]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])
    outs = [helper.make_tensor_value_info("pos", TensorProto.INT64, ["b", "s"]),
            helper.make_tensor_value_info("xs", TensorProto.FLOAT, ["b", "s", 4]),
            helper.make_tensor_value_info("cls", TensorProto.FLOAT, ["b", 4]),
            helper.make_tensor_value_info("last", TensorProto.FLOAT, ["b", 4]),
            helper.make_tensor_value_info("ends", TensorProto.FLOAT, ["b", 3, 4])]
    return helper.make_model(helper.make_graph(n, "positions", [ids, x], outs), opset_imports=[helper.make_opsetid("", 17)])


def reversed_rows():
    """x [b, 2] gathered in reverse row order by indices made from Range over b: not every
    row in order, so the graph import must refuse it while b is dynamic"""
    i64 = np.int64
    n = [helper.make_node("Shape", ["x"], ["shp"]), const("c0", 0, i64), const("c1", 1, i64),
         helper.make_node("Gather", ["shp", "c0"], ["bd"], axis=0), helper.make_node("Range", ["c0", "bd", "c1"], ["r"]),
         helper.make_node("Sub", ["bd", "c1"], ["last"]), helper.make_node("Sub", ["last", "r"], ["rev"]),
         helper.make_node("Gather", ["x", "rev"], ["y"], axis=0)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])
    return helper.make_model(helper.make_graph(n, "reversed", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def min_batch():
    """y = x * min(b, 3): equal at the first two probes (b = 3 and 4) but not at b = 2, so the
    import must not fold it to 3 (a third probe tells)"""
    i64 = np.int64
    n = [helper.make_node("Shape", ["x"], ["shp"]), const("c0", [0], i64), const("three", [3], i64),
         helper.make_node("Gather", ["shp", "c0"], ["bd"], axis=0), helper.make_node("Min", ["bd", "three"], ["mb"]),
         helper.make_node("Cast", ["mb"], ["mbf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "mbf"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])
    return helper.make_model(helper.make_graph(n, "minbatch", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def main():
    out = sys.argv[1]
    for name, m in (("patterns", patterns()), ("erf", erf_alone()), ("reversed", reversed_rows()), ("minbatch", min_batch()),
                    ("positions", positions())):
        m.ir_version = 8
        checker.check_model(m)
        save(m, f"{out}/{name}.onnx")
    rng = np.random.default_rng(7)
    np.save(f"{out}/x.npy", rng.standard_normal((2, 5, 4)).astype(np.float32))
    mask = np.ones((2, 5), np.int64)
    mask[1, 3:] = 0
    np.save(f"{out}/mask.npy", mask)
    # batch 3 for the graph with a dynamic batch (--dim s=5 only)
    np.save(f"{out}/x3.npy", rng.standard_normal((3, 5, 4)).astype(np.float32))
    mask3 = np.ones((3, 5), np.int64)
    mask3[0, 2:] = 0
    np.save(f"{out}/mask3.npy", mask3)
    np.save(f"{out}/x2.npy", np.array([[1, 2], [3, 4]], np.float32))
    np.save(f"{out}/ids.npy", np.array([[0, 31, 7, 2, 1, 1], [0, 5, 9, 12, 44, 2]], np.int64))
    np.save(f"{out}/xp.npy", rng.standard_normal((2, 6, 4)).astype(np.float32))
    np.save(f"{out}/xe.npy", np.array([[-2, -0.5, 0], [0.3, 1, 3]], np.float32))


main()
