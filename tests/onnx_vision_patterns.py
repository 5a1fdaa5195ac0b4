"""Writes an ONNX model with what torch.onnx.export puts in torchvision's image
models (tests/cli_onnx_vision_patterns.sh imports it), small and with random
weights, input x [b, 3, 17, 19] float (dim_param b):

  a strided 3x3 Conv, HardSwish and HardSigmoid (MobileNetV3), a depthwise 3x3
  Conv with two filters per channel and Clip(0, 6) (MobileNetV2's ReLU6),
  Sigmoid times its input (EfficientNet's SiLU), MaxPool 3x3/2 and AveragePool
  3x3/2 pad 1 (count_include_pad) with ceil_mode (SqueezeNet, GoogLeNet), a
  1x1 Conv, and ViT's class token: a constant [1, 1, C] expanded to the batch
  (Shape, Gather, Concat, Expand) and concatenated before the flattened tokens.

Also writes x.npy (batch 2) and x3.npy (batch 3), and scatter.onnx: data [b, 4, 6]
float through a Pad with zero pads (Swin pads to the window: nothing at 224x224), then
ScatterND (2-D indices, reduction add, a negative index) and ScatterElements (axis 2,
negative indices) from constant indices and updates; with s.npy [2, 4, 6] and
bad_scatter.onnx, whose ScatterND index is out of range. And scatter_data.onnx: x [b, 4, 6]
through ScatterElements, Mod and ScatterND whose indices and updates are computed from x;
topk.onnx, two TopKs with constant K (smallest along axis 1, largest along the last axis);
index_ops.onnx (GatherND, with batch_dims too, and OneHot) and layout_ops.onnx (l.npy [2, 8, 4,
6]: DepthToSpace both modes, SpaceToDepth, Shrink, MeanVarianceNormalization, LRN).

And pads.onnx, the padding that TensorFlow models converted by tf2onnx carry: x [b, 3, 16,
15] through Pad reflect (uneven), a 3x3/2 Conv with auto_pad SAME_UPPER (its total pad odd
on both dims), Pad edge, a 3x3/2 Conv with explicit uneven pads, a MaxPool 3x3/2 SAME_UPPER,
and Pad constant 0.5 on the channels; with p.npy (batch 2). And upsample.onnx, a U-Net's
decoder: x [b, 4, 5, 6] through ConvTranspose 3x3/2 pads 1 output_padding 1 (PyTorch's 2x
upsampling), Relu, ConvTranspose 2x2/2 with two groups and uneven pads; with u.npy (batch 3).
And gan.onnx, a CycleGAN-style generator: reflect Pad, 7x7 Conv, InstanceNormalization, a
strided Conv down and a ConvTranspose up, each normalized, a 7x7 Conv and Tanh; with g.npy.
And resize.onnx (opset 18): x [b, 4, 6, 5] upsampled 2x three ways, as PyTorch's interpolate
exports them (nearest asymmetric floor by scales, linear half_pixel by sizes on axes 2 and 3,
cubic pytorch_half_pixel by scales, linear by sizes built from Shape(x) with the batch dynamic),
summed; with r.npy. And tile.onnx: x [2, 4, 6, 5] tiled
[1, 2, 1, 2], then GatherElements on the last axis with constant indices, negative ones among
them; with r.npy. And audio.onnx: what speech models (Whisper's stem, wav2vec2's feature
encoder) export, over one spatial dim: x [b, 4, 37] through Conv k3 pad 1 with a bias, Relu,
Conv k3/2, a depthwise Conv k5 (8 groups), MaxPool k3/2 SAME_UPPER, AveragePool k2 with
uneven pads out of its count, ConvTranspose k4/2; with a.npy. audio_dyn.onnx is the same with
the length dynamic (t) and the AveragePool's pads even, with a50.npy [3, 4, 50];
audio_dyn_uneven.onnx keeps the uneven pads, which have no graph form on a dynamic length.

usage: python3 onnx_vision_patterns.py OUT_DIR"""
import sys

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper, save


def init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def model():
    rng = np.random.default_rng(7)
    f32, i64 = np.float32, np.int64
    inits = [init("w1", rng.standard_normal((8, 3, 3, 3)).astype(f32) * 0.3), init("b1", rng.standard_normal(8).astype(f32) * 0.1),
             init("wd", rng.standard_normal((16, 1, 3, 3)).astype(f32) * 0.3), init("bd", rng.standard_normal(16).astype(f32) * 0.1),
             init("w2", rng.standard_normal((12, 16, 1, 1)).astype(f32) * 0.3),
             init("lo", np.array(0.0, f32)), init("hi", np.array(6.0, f32)),
             init("cls", rng.standard_normal((1, 1, 12)).astype(f32)), init("c0", np.array([0], i64)),
             init("rest", np.array([1, 12], i64)), init("tok_shape", np.array([0, 12, -1], i64))]
    n = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("HardSwish", ["c1"], ["a1"]),
         helper.make_node("Conv", ["a1", "wd", "bd"], ["cd"], group=8, pads=[1, 1, 1, 1]),
         helper.make_node("Clip", ["cd", "lo", "hi"], ["r6"]),
         helper.make_node("Sigmoid", ["r6"], ["sg"]), helper.make_node("Mul", ["r6", "sg"], ["silu"]),
         helper.make_node("MaxPool", ["silu"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
         helper.make_node("AveragePool", ["silu"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                          ceil_mode=1, count_include_pad=1),
         helper.make_node("HardSigmoid", ["ap"], ["hsg"], alpha=0.25, beta=0.4),
         helper.make_node("Conv", ["mp", "w2"], ["c2"]),
         helper.make_node("Reshape", ["c2", "tok_shape"], ["tok0"]), helper.make_node("Transpose", ["tok0"], ["tok"], perm=[0, 2, 1]),
         helper.make_node("Shape", ["x"], ["shp"]), helper.make_node("Gather", ["shp", "c0"], ["bd1"], axis=0),
         helper.make_node("Concat", ["bd1", "rest"], ["cls_shape"], axis=0),
         helper.make_node("Expand", ["cls", "cls_shape"], ["cls_b"]),
         helper.make_node("Concat", ["cls_b", "tok"], ["seq"], axis=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 17, 19])
    outs = [helper.make_tensor_value_info("seq", TensorProto.FLOAT, ["b", 21, 12]),
            helper.make_tensor_value_info("hsg", TensorProto.FLOAT, ["b", 16, 5, 6])]
    g = helper.make_graph(n, "vision_patterns", [x], outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    checker.check_model(m)
    return m


def scatter_model(bad=False):
    f32, i64 = np.float32, np.int64
    inits = [init("pads", np.zeros(6, i64)), init("ind", np.array([[0, 1], [0, -1], [0, 1]], i64)),
             init("upd", np.arange(18, dtype=f32).reshape(3, 6) * (-1 if bad else 1)),
             init("eind", np.array([[[5, -1, 0, 2, 2, 1]] * 4], i64)), init("eupd", np.full((1, 4, 6), 0.5, f32))]
    if bad:
        inits[1] = init("ind", np.array([[0, 4], [0, 1], [0, 2]], i64))
    n = [helper.make_node("Pad", ["d", "pads"], ["p"]),
         helper.make_node("ScatterND", ["p", "ind", "upd"], ["s1"], reduction="add"),
         helper.make_node("ScatterElements", ["s1", "eind", "eupd"], ["y"], axis=2)]
    d = helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 6])
    m = helper.make_model(helper.make_graph(n, "scatter", [d], [y], initializer=inits), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    checker.check_model(m)
    return m


def scatter_data_model():
    """Scatters whose indices and updates are data: ScatterElements (reduction add) at each
    row's argmax, given as a negative index, of twice the row's max; Mod (fmod) by 0.75; then,
    on the data transposed to [4, 6, b], ScatterND (reduction mul, a negative index) of two
    rows of means."""
    f32, i64 = np.float32, np.int64
    inits = [init("six", np.array(6, i64)), init("two", np.array(2, f32)), init("m", np.array(0.75, f32)),
             init("ind", np.array([[1, 2], [-1, 0]], i64)), init("s0", np.array([0], i64)), init("s2", np.array([2], i64))]
    n = [helper.make_node("ArgMax", ["x"], ["am"], axis=2, keepdims=1), helper.make_node("Sub", ["am", "six"], ["neg"]),
         helper.make_node("ReduceMax", ["x"], ["mx"], axes=[2], keepdims=1), helper.make_node("Mul", ["mx", "two"], ["upd"]),
         helper.make_node("ScatterElements", ["x", "neg", "upd"], ["s"], axis=2, reduction="add"),
         helper.make_node("Mod", ["s", "m"], ["md"], fmod=1), helper.make_node("Transpose", ["md"], ["t"], perm=[1, 2, 0]),
         helper.make_node("ReduceMean", ["t"], ["su"], axes=[0], keepdims=0),
         helper.make_node("Slice", ["su", "s0", "s2", "s0"], ["u2"]),
         helper.make_node("ScatterND", ["t", "ind", "u2"], ["r"], reduction="mul"),
         helper.make_node("Transpose", ["r"], ["y"], perm=[2, 0, 1])]
    return build("scatter_data", n, inits, ["b", 4, 6], ["b", 4, 6])


def topk_model():
    """TopK with constant K: the 2 smallest of x [b, 4, 6] along axis 1, their indices cast and
    added, then the 3 largest of that along the last axis (negative axis), values times
    (index + 1): y [b, 2, 3]."""
    i64 = np.int64
    inits = [init("k2", np.array([2], i64)), init("k3", np.array([3], i64)), init("one", np.array(1, i64))]
    n = [helper.make_node("TopK", ["x", "k2"], ["v2", "i2"], axis=1, largest=0),
         helper.make_node("Cast", ["i2"], ["f2"], to=TensorProto.FLOAT), helper.make_node("Add", ["v2", "f2"], ["z"]),
         helper.make_node("TopK", ["z", "k3"], ["v3", "i3"], axis=-1),
         helper.make_node("Add", ["i3", "one"], ["i31"]), helper.make_node("Cast", ["i31"], ["f3"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["v3", "f3"], ["y"])]
    return build("topk", n, inits, ["b", 4, 6], ["b", 2, 3])


def index_model():
    """GatherND on a fixed [4, 6] (the batch summed out) with negative indices, and with
    batch_dims 1; OneHot (constant depth and values, negative axis) of each row's argmax:
    y [b, 4, 1, 6] = one_hot * gathered + batch-gathered."""
    i64, f32 = np.int64, np.float32
    inits = [init("ax0", np.array([0], i64)), init("ind", np.array([[1, -1], [3, 0], [0, 2], [-4, 5], [2, -6], [1, 1]], i64)),
             init("indb", np.array([[5], [-1], [0], [2]], i64)), init("depth", np.array([6], i64)),
             init("vals", np.array([0.5, 2.0], f32)), init("shp", np.array([4, 1, 1], i64))]
    n = [helper.make_node("ReduceSum", ["x", "ax0"], ["s"], keepdims=0),
         helper.make_node("GatherND", ["s", "ind"], ["g"]), helper.make_node("GatherND", ["s", "indb"], ["gb"], batch_dims=1),
         helper.make_node("ArgMax", ["x"], ["am"], axis=2, keepdims=1),
         helper.make_node("OneHot", ["am", "depth", "vals"], ["oh"], axis=-1),
         helper.make_node("Mul", ["oh", "g"], ["m"]), helper.make_node("Reshape", ["gb", "shp"], ["gbr"]),
         helper.make_node("Add", ["m", "gbr"], ["y"])]
    return build("index_ops", n, inits, ["b", 4, 6], ["b", 4, 1, 6])


def bad_gather_nd_model():
    """GatherND with the constant index 6 into a dim of 6: refused by name (interpreter and import)."""
    i64 = np.int64
    inits = [init("ax0", np.array([0], i64)), init("ind", np.array([[1, 6]], i64))]
    n = [helper.make_node("ReduceSum", ["x", "ax0"], ["s"], keepdims=0), helper.make_node("GatherND", ["s", "ind"], ["y"])]
    return build("bad_gather_nd", n, inits, ["b", 4, 6], [1])


def layout_model():
    """x [b, 8, 4, 6] through DepthToSpace (CRD), Shrink, SpaceToDepth, MeanVarianceNormalization,
    LRN (size 3) and DepthToSpace (DCR): y [b, 2, 8, 12]."""
    n = [helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=2, mode="CRD"),
         helper.make_node("Shrink", ["d"], ["sh"], lambd=0.3, bias=0.1),
         helper.make_node("SpaceToDepth", ["sh"], ["s2d"], blocksize=2),
         helper.make_node("MeanVarianceNormalization", ["s2d"], ["mv"]),
         helper.make_node("LRN", ["mv"], ["l"], size=3, alpha=0.02, beta=0.6, bias=1.5),
         helper.make_node("DepthToSpace", ["l"], ["y"], blocksize=2, mode="DCR")]
    return build("layout_ops", n, [], ["b", 8, 4, 6], ["b", 2, 8, 12])


def build(name, nodes, inits, x_shape, y_shape, opset=17):
    """One input x, one output y, float: the model, checked."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)
    m = helper.make_model(helper.make_graph(nodes, name, [x], [y], initializer=inits), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    checker.check_model(m)
    return m


def pads_model():
    rng = np.random.default_rng(11)
    f32, i64 = np.float32, np.int64
    inits = [init("w1", rng.standard_normal((6, 3, 3, 3)).astype(f32) * 0.3), init("b1", rng.standard_normal(6).astype(f32) * 0.1),
             init("w2", rng.standard_normal((8, 6, 3, 3)).astype(f32) * 0.3),
             init("p_reflect", np.array([0, 0, 1, 2, 0, 0, 2, 1], i64)), init("p_edge", np.array([0, 0, 0, 1, 0, 0, 1, 0], i64)),
             init("p_const", np.array([0, 1, 0, 0, 0, 2, 0, 0], i64)), init("half", np.array(0.5, f32))]
    n = [helper.make_node("Pad", ["x", "p_reflect"], ["r"], mode="reflect"),
         helper.make_node("Conv", ["r", "w1", "b1"], ["c1"], strides=[2, 2], auto_pad="SAME_UPPER"),
         helper.make_node("Relu", ["c1"], ["a1"]),
         helper.make_node("Pad", ["a1", "p_edge"], ["e"], mode="edge"),
         helper.make_node("Conv", ["e", "w2"], ["c2"], strides=[2, 2], pads=[0, 1, 1, 2]),
         helper.make_node("MaxPool", ["c2"], ["m"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
         helper.make_node("Pad", ["m", "p_const", "half"], ["y"])]
    return build("pads", n, inits, ["b", 3, 16, 15], ["b", 11, 3, 3])


def upsample_model():
    rng = np.random.default_rng(13)
    f32 = np.float32
    inits = [init("w1", rng.standard_normal((4, 6, 3, 3)).astype(f32) * 0.3), init("b1", rng.standard_normal(6).astype(f32) * 0.1),
             init("w2", rng.standard_normal((6, 2, 2, 2)).astype(f32) * 0.3), init("b2", rng.standard_normal(4).astype(f32) * 0.1)]
    n = [helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["u1"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
         helper.make_node("Relu", ["u1"], ["a1"]),
         helper.make_node("ConvTranspose", ["a1", "w2", "b2"], ["y"], strides=[2, 2], group=2, pads=[0, 1, 1, 0])]
    return build("upsample", n, inits, ["b", 4, 5, 6], ["b", 4, 19, 23])


def gan_model():
    rng = np.random.default_rng(17)
    f32, i64 = np.float32, np.int64
    def w(*shape):
        return rng.standard_normal(shape).astype(f32) * 0.2
    inits = [init("w1", w(8, 3, 7, 7)), init("b1", w(8)), init("s1", 1 + w(8)), init("t1", w(8)),
             init("w2", w(16, 8, 3, 3)), init("s2", 1 + w(16)), init("t2", w(16)),
             init("w3", w(16, 8, 3, 3)), init("s3", 1 + w(8)), init("t3", w(8)),
             init("w4", w(3, 8, 7, 7)), init("b4", w(3)), init("p3", np.array([0, 0, 3, 3, 0, 0, 3, 3], i64))]
    n = [helper.make_node("Pad", ["x", "p3"], ["r1"], mode="reflect"),
         helper.make_node("Conv", ["r1", "w1", "b1"], ["c1"]),
         helper.make_node("InstanceNormalization", ["c1", "s1", "t1"], ["n1"], epsilon=1e-5),
         helper.make_node("Relu", ["n1"], ["a1"]),
         helper.make_node("Conv", ["a1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("InstanceNormalization", ["c2", "s2", "t2"], ["n2"]),
         helper.make_node("Relu", ["n2"], ["a2"]),
         helper.make_node("ConvTranspose", ["a2", "w3"], ["u3"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
         helper.make_node("InstanceNormalization", ["u3", "s3", "t3"], ["n3"]),
         helper.make_node("Relu", ["n3"], ["a3"]),
         helper.make_node("Pad", ["a3", "p3"], ["r4"], mode="reflect"),
         helper.make_node("Conv", ["r4", "w4", "b4"], ["c4"]),
         helper.make_node("Tanh", ["c4"], ["y"])]
    return build("gan", n, inits, ["b", 3, 16, 12], ["b", 3, 16, 12])


def resize_model():
    f32, i64 = np.float32, np.int64
    inits = [init("s2", np.array([1, 1, 2, 2], f32)), init("hw", np.array([12, 10], i64)), init("z", np.array([0], i64)),
             init("two", np.array([2], i64))]
    n = [helper.make_node("Resize", ["x", "", "s2"], ["n1"], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
         helper.make_node("Resize", ["x", "", "", "hw"], ["n2"], mode="linear", axes=[2, 3]),
         helper.make_node("Resize", ["x", "", "s2"], ["n3"], mode="cubic", coordinate_transformation_mode="pytorch_half_pixel"),
         # as torch.onnx.export writes F.interpolate(x, size=(12, 10)): sizes = Shape(x)[0:2] ++ (12, 10), the batch dynamic
         helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Slice", ["sh", "z", "two"], ["nc"]),
         helper.make_node("Concat", ["nc", "hw"], ["size4"], axis=0),
         helper.make_node("Resize", ["x", "", "", "size4"], ["n4"], mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
         helper.make_node("Add", ["n1", "n2"], ["a"]), helper.make_node("Add", ["a", "n3"], ["a3"]), helper.make_node("Add", ["a3", "n4"], ["y"])]
    return build("resize", n, inits, ["b", 4, 6, 5], ["b", 4, 12, 10], opset=18)


def tile_model():
    i64 = np.int64
    idx = np.random.default_rng(19).integers(-10, 10, size=(2, 8, 6, 3)).astype(i64)
    inits = [init("reps", np.array([1, 2, 1, 2], i64)), init("idx", idx)]
    n = [helper.make_node("Tile", ["x", "reps"], ["t"]), helper.make_node("GatherElements", ["t", "idx"], ["y"], axis=3)]
    return build("tile", n, inits, [2, 4, 6, 5], [2, 8, 6, 3])


def audio_model(length, pool_pads=(0, 1)):
    """1-D convs and pools as speech models export them: x [b, 4, length]"""
    rng = np.random.default_rng(23)
    f32 = np.float32
    inits = [init("w1", rng.standard_normal((8, 4, 3)).astype(f32) * 0.3), init("b1", rng.standard_normal(8).astype(f32) * 0.1),
             init("w2", rng.standard_normal((8, 8, 3)).astype(f32) * 0.3), init("w3", rng.standard_normal((8, 1, 5)).astype(f32) * 0.3),
             init("wt", rng.standard_normal((8, 4, 4)).astype(f32) * 0.3), init("bt", rng.standard_normal(4).astype(f32) * 0.1)]
    n = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]),
         helper.make_node("Relu", ["c1"], ["a1"]),
         helper.make_node("Conv", ["a1", "w2"], ["c2"], strides=[2], pads=[1, 1]),
         helper.make_node("Conv", ["c2", "w3"], ["c3"], group=8, pads=[2, 2], dilations=[1]),
         helper.make_node("MaxPool", ["c3"], ["m"], kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER"),
         helper.make_node("AveragePool", ["m"], ["p"], kernel_shape=[2], pads=list(pool_pads), count_include_pad=0),
         helper.make_node("ConvTranspose", ["p", "wt", "bt"], ["y"], strides=[2], pads=[1, 1])]
    return build("audio", n, inits, ["b", 4, length], ["b", 4, None])


def tanh_gelu(h, y, pow_form):
    """GELU's tanh form as torch exports it (x*x*x, or Pow(x, 3) as older exports and GPT-2's
    code give it), h -> y"""
    cube = [helper.make_node("Pow", [h, "three"], [h + "c"])] if pow_form else \
        [helper.make_node("Mul", [h, h], [h + "s"]), helper.make_node("Mul", [h, h + "s"], [h + "c"])]
    return cube + [helper.make_node("Mul", ["k044", h + "c"], [h + "k"]), helper.make_node("Add", [h, h + "k"], [h + "i"]),
                   helper.make_node("Mul", ["sqrt2pi", h + "i"], [h + "m"]), helper.make_node("Tanh", [h + "m"], [h + "t"]),
                   helper.make_node("Add", ["one", h + "t"], [h + "p"]), helper.make_node("Mul", [h, h + "p"], [h + "q"]),
                   helper.make_node("Mul", ["half", h + "q"], [y])]


def mlp_acts_model():
    """an MLP with the activations compile fuses into its linears: GELU (erf, as torch exports
    it), SiLU (Sigmoid and Mul), Sigmoid, Tanh, GELU's tanh form (both cube forms): x [b, 16]"""
    rng = np.random.default_rng(29)
    f32 = np.float32
    inits = [init(f"w{i}", rng.standard_normal((16, 16)).astype(f32) * 0.3) for i in range(6)]
    inits += [init(f"b{i}", rng.standard_normal(16).astype(f32) * 0.1) for i in range(6)]
    inits += [init("sqrt2", np.array(np.sqrt(2), f32)), init("one", np.array(1, f32)), init("half", np.array(0.5, f32))]
    inits += [init("three", np.array(3, f32)), init("k044", np.array(0.044715, f32)),
              init("sqrt2pi", np.array(np.sqrt(2 / np.pi), f32))]
    n = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h0"], transB=1),
         helper.make_node("Div", ["h0", "sqrt2"], ["e0"]), helper.make_node("Erf", ["e0"], ["e1"]),
         helper.make_node("Add", ["e1", "one"], ["e2"]), helper.make_node("Mul", ["h0", "e2"], ["e3"]),
         helper.make_node("Mul", ["e3", "half"], ["a0"]),
         helper.make_node("MatMul", ["a0", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["h1"]),
         helper.make_node("Sigmoid", ["h1"], ["s1"]), helper.make_node("Mul", ["h1", "s1"], ["a1"]),
         helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"], transB=1), helper.make_node("Sigmoid", ["h2"], ["a2"]),
         helper.make_node("Gemm", ["a2", "w3", "b3"], ["h3"], transB=1), helper.make_node("Tanh", ["h3"], ["a3"]),
         helper.make_node("Gemm", ["a3", "w4", "b4"], ["h4"], transB=1)] + tanh_gelu("h4", "a4", False) + \
        [helper.make_node("Gemm", ["a4", "w5", "b5"], ["h5"], transB=1)] + tanh_gelu("h5", "y", True)
    return build("mlp_acts", n, inits, ["b", 16], ["b", 16])


def main():
    out = sys.argv[1]
    save(model(), f"{out}/vision.onnx")
    save(scatter_model(), f"{out}/scatter.onnx")
    save(scatter_model(bad=True), f"{out}/bad_scatter.onnx")
    save(scatter_data_model(), f"{out}/scatter_data.onnx")
    save(topk_model(), f"{out}/topk.onnx")
    save(index_model(), f"{out}/index_ops.onnx")
    save(layout_model(), f"{out}/layout_ops.onnx")
    save(bad_gather_nd_model(), f"{out}/bad_gather_nd.onnx")
    np.save(f"{out}/l.npy", np.random.default_rng(14).standard_normal((2, 8, 4, 6)).astype(np.float32))
    save(pads_model(), f"{out}/pads.onnx")
    np.save(f"{out}/p.npy", np.random.default_rng(5).standard_normal((2, 3, 16, 15)).astype(np.float32))
    save(upsample_model(), f"{out}/upsample.onnx")
    save(gan_model(), f"{out}/gan.onnx")
    save(resize_model(), f"{out}/resize.onnx")
    save(tile_model(), f"{out}/tile.onnx")
    save(mlp_acts_model(), f"{out}/mlp_acts.onnx")
    np.save(f"{out}/m.npy", np.random.default_rng(13).standard_normal((5, 16)).astype(np.float32))
    save(audio_model(37), f"{out}/audio.onnx")
    save(audio_model("t", (1, 1)), f"{out}/audio_dyn.onnx")
    save(audio_model("t"), f"{out}/audio_dyn_uneven.onnx")
    np.save(f"{out}/a.npy", np.random.default_rng(10).standard_normal((2, 4, 37)).astype(np.float32))
    np.save(f"{out}/a50.npy", np.random.default_rng(12).standard_normal((3, 4, 50)).astype(np.float32))
    np.save(f"{out}/r.npy", np.random.default_rng(9).standard_normal((2, 4, 6, 5)).astype(np.float32))
    np.save(f"{out}/g.npy", np.random.default_rng(8).standard_normal((2, 3, 16, 12)).astype(np.float32))
    np.save(f"{out}/u.npy", np.random.default_rng(6).standard_normal((3, 4, 5, 6)).astype(np.float32))
    np.save(f"{out}/s.npy", np.random.default_rng(4).standard_normal((2, 4, 6)).astype(np.float32))
    rng = np.random.default_rng(3)
    np.save(f"{out}/x.npy", rng.standard_normal((2, 3, 17, 19)).astype(np.float32) * 2)
    np.save(f"{out}/x3.npy", rng.standard_normal((3, 3, 17, 19)).astype(np.float32) * 2)


if __name__ == "__main__":
    main()
