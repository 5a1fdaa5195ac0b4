#!/usr/bin/env python3
"""Every Conv of an ONNX CNN, alone, in fathom and in ONNX Runtime: where a model's gap is.

Each Conv node of MODEL.onnx (with the Relu or Clip right after it when that is its only
reader, which both sides fuse) becomes a one-node model at a fixed batch: shapes from ONNX
shape inference, its weights and the Constant nodes it reads copied in. fathom runs
`fathom compile` of that file (libfathom.so through ctypes, as bench_graph_ort.py does);
ONNX Runtime runs the file (all graph optimizations, --threads intra-op threads, spinning
off). The same input, alternating rounds in one process; each side keeps its best round.
Prints one line per conv, largest fathom-minus-ORT gap first, and the sums.

Per-layer sums do not add up to the whole graph: between layers ORT keeps its blocked
(NCHWc) activations, and each side's caches hold what the previous layer wrote.

Usage: bench/bench_conv_layers_ort.py MODEL.onnx [--batch 8] [--rounds 15] [--threads 2]
                                      [--build build] [--top N]
"""
import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_graph_ort as bgo  # noqa: E402  (the Fathom ctypes wrapper)


def layer_models(m, batch, d):
    """(description, path, input name, input shape) per Conv of model m at this batch"""
    import onnx
    from onnx import helper, shape_inference
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_value = batch
    m = shape_inference.infer_shapes(m)
    shapes = {vi.name: [x.dim_value for x in vi.type.tensor_type.shape.dim]
              for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)}
    inits = {i.name: i for i in m.graph.initializer}
    readers, producer = collections.defaultdict(list), {}
    for n in m.graph.node:
        for i in n.input:
            readers[i].append(n)
        for o in n.output:
            producer[o] = n
    for k, n in enumerate(m.graph.node):
        if n.op_type != "Conv":
            continue
        nodes, out = [n], n.output[0]
        if len(readers[out]) == 1 and readers[out][0].op_type in ("Relu", "Clip"):
            nodes.append(readers[out][0])
            out = nodes[-1].output[0]
        pre, todo = [], [i for nd in nodes for i in nd.input if i and i != n.input[0] and i not in inits]
        while todo:  # the Constant (and similar) nodes the layer reads
            p = producer.get(todo.pop())
            if p is None or p in nodes or p in pre:
                continue
            pre.insert(0, p)
            todo += [j for j in p.input if j and j not in inits]
        used = {i for nd in pre + nodes for i in nd.input}
        g = helper.make_graph(pre + nodes, f"conv{k}",
                              [helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, shapes[n.input[0]])],
                              [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, shapes[out])],
                              initializer=[inits[i] for i in sorted(used) if i in inits])
        lm = helper.make_model(g, opset_imports=m.opset_import)
        lm.ir_version = m.ir_version
        path = f"{d}/conv{k}.onnx"
        onnx.save(lm, path)
        w = inits[n.input[1]].dims
        a = {at.name: helper.get_attribute_value(at) for at in n.attribute}
        grp, s = a.get("group", 1), a.get("strides", [1])[0]
        act = f" +{nodes[1].op_type}" if len(nodes) > 1 else ""
        yield (f"{w[1] * grp}->{w[0]} k{w[2]} s{s} g{grp} {shapes[n.input[0]][2]}->{shapes[out][2]}{act}",
               path, n.input[0], shapes[n.input[0]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default="build")
    ap.add_argument("--top", type=int, default=0, help="print the N largest gaps only (0: all)")
    a = ap.parse_args()
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        sys.exit(f"bench_conv_layers_ort: needs onnx and onnxruntime ({e})")
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    os.environ["FATHOM_NUM_THREADS"] = str(a.threads)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for k, (desc, path, xin, shape) in enumerate(layer_models(onnx.load(a.model), a.batch, d)):
            bgo.run([os.path.join(a.build, "fathom"), "compile", path, "-o", path + ".c"])
            fm = bgo.Fathom(os.path.join(a.build, "libfathom.so"), path + ".c")
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            x = np.random.default_rng(k).standard_normal(shape).astype(np.float32)
            tf, to = [], []
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                fm.release(fm.run_many([x]), 1)
                tf.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                sess.run(None, {xin: x})
                to.append(time.perf_counter() - t0)
            fm.close()
            rows.append((desc, min(tf) * 1e3, min(to) * 1e3))
    rows.sort(key=lambda r: -(r[1] - r[2]))
    for desc, f, o in rows[:a.top or len(rows)]:
        print(f"{desc:40s} fathom {f:8.3f} ms  ort {o:8.3f} ms  gap {f - o:+8.3f}")
    print(f"sum of the best rounds over {len(rows)} convs: fathom {sum(r[1] for r in rows):.2f} ms, "
          f"ort {sum(r[2] for r in rows):.2f} ms (batch {a.batch}, {a.threads} threads)")


if __name__ == "__main__":
    main()
