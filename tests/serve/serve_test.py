#!/usr/bin/env python3
"""End-to-end tests of `fathom serve` (run by tests/cli_serve.sh, which trains the
tiny model). Starts the real server on free loopback ports and drives it with
plain HTTP (http.client, raw sockets) and, where installed, tritonclient.
Prints ok/FAIL per check; exits 1 on any failure, else 77 if a part was
skipped (tritonclient or numpy missing), else 0."""
import http.client, json, os, shutil, signal, socket, struct, subprocess, sys, threading, time

BIN, MODEL, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
fails, skips = 0, []


def ok(msg):
    print("ok:", msg)


def bad(msg):
    global fails
    fails += 1
    print("FAIL:", msg)


def check(cond, msg):
    ok(msg) if cond else bad(msg)


class Server:
    def __init__(self, repo, *args):
        self.log = os.path.join(TMP, "serve-%d.log" % time.time_ns())
        self.proc = subprocess.Popen([BIN, "serve", "--model-repository", repo, "--port", "0", "--metrics-port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        self.port = self.mport = None
        deadline = time.time() + 30
        while time.time() < deadline and self.proc.poll() is None:
            text = open(self.log).read()
            if "listening on" in text:
                line = text.split("listening on", 1)[1].split("\n")[0]
                self.port = int(line.split("http://127.0.0.1:")[1].split()[0])
                if "metrics:" in line:
                    self.mport = int(line.split("metrics: http://127.0.0.1:")[1].split("/")[0])
                return
            time.sleep(0.05)
        raise RuntimeError("server did not start: " + open(self.log).read())

    def request(self, method, path, body=None, headers=None, port=None, timeout=30, chunked=False):
        c = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        c.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def json(self, method, path, body=None, headers=None):
        st, h, data = self.request(method, path, body, headers)
        try:
            return st, json.loads(data) if data else None
        except ValueError:
            return st, data

    def metrics(self):
        st, _, data = self.request("GET", "/metrics", port=self.mport)
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -999


def raw(port, data, timeout=5.0, close_write=False):
    """Sends bytes on a fresh connection and returns what comes back ('' on timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if cl and len(rest) >= int(cl[0].split(b":")[1]):
                    break
        return out
    finally:
        s.close()


def status_of(resp):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def make_repo(name, configs):
    repo = os.path.join(TMP, name)
    for model, (versions, cfg) in configs.items():
        for v in versions:
            os.makedirs(os.path.join(repo, model, str(v)), exist_ok=True)
            shutil.copy(os.path.join(MODEL, "model.safetensors"), os.path.join(repo, model, str(v)))
        if cfg is not None:
            json.dump(cfg, open(os.path.join(repo, model, "config.json"), "w"))
    return repo


def sample(n, seed=1):
    import random
    r = random.Random(seed)
    return [[[[r.random() for _ in range(8)] for _ in range(8)]] for _ in range(n)]


def infer_body(x, name="input", dt="FP32", shape=None):
    flat = [v for s in x for c in s for row in c for v in row]
    return {"inputs": [{"name": name, "datatype": dt, "shape": shape or [len(x), 1, 8, 8], "data": flat}]}


def write_graph(dirpath):
    """A graph directory (docs/GRAPH.md): probs = softmax(x @ W^T + b), x of [batch, 4]."""
    W = [[0.1 * (i + 1) * (1 if j % 2 else -1) for j in range(4)] for i in range(3)]
    b = [0.5, -0.25, 0.0]
    os.makedirs(dirpath, exist_ok=True)
    g = {"format": "fathom-graph", "version": 1, "meta": {}, "dim_hints": {"batch": 2},
         "inputs": [{"name": "x", "dtype": "f32", "shape": ["batch", 4]}], "outputs": ["probs"],
         "constants": [{"name": "w", "dtype": "f32", "shape": [3, 4]}, {"name": "b", "dtype": "f32", "shape": [3]}],
         "nodes": [{"name": "fc", "op": "linear", "inputs": ["x", "w", "b"],
                    "outputs": [{"name": "h", "dtype": "f32", "shape": ["batch", 3]}], "attrs": {}},
                   {"name": "sm", "op": "softmax", "inputs": ["h"],
                    "outputs": [{"name": "probs", "dtype": "f32", "shape": ["batch", 3]}], "attrs": {"axis": -1}}]}
    json.dump(g, open(os.path.join(dirpath, "graph.json"), "w"))
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
                      "b": {"dtype": "F32", "shape": [3], "data_offsets": [48, 60]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    data = struct.pack("<12f", *[v for row in W for v in row]) + struct.pack("<3f", *b)
    open(os.path.join(dirpath, "weights.safetensors"), "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)

    def ref(x):
        import math
        out = []
        for row in x:
            h = [sum(W[i][j] * row[j] for j in range(4)) + b[i] for i in range(3)]
            m = max(h)
            e = [math.exp(v - m) for v in h]
            out.append([v / sum(e) for v in e])
        return out
    return ref


def graph_checks(s, ref):
    st, j = s.json("GET", "/v2/models/g")
    check(st == 200 and j["platform"] == "fathom_graph" and j["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
          and j["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [-1, 3]}], "graph model metadata: %s" % j)
    x = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]
    st, j = s.json("POST", "/v2/models/g/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [v for r in x for v in r]}]})
    want = [v for r in ref(x) for v in r]
    check(st == 200 and all(abs(a - b_) < 1e-6 for a, b_ in zip(j["outputs"][0]["data"], want)),
          "graph model infers softmax(x W^T + b) (%s)" % (j if st != 200 else "max error %.1e" % max(
              abs(a - b_) for a, b_ in zip(j["outputs"][0]["data"], want))))


def write_onnx(repo):
    """The graph model exported as ONNX (fathom export), served from model.onnx and from a named file."""
    for model, fname, cfg in [("onx", "model.onnx", None),
                              ("onx-named", "net.onnx", {"platform": "onnxruntime_onnx", "default_model_filename": "net.onnx"}),
                              ("bad-platform", "model.onnx", {"platform": "tensorrt_plan"}),
                              ("wrong-platform", "model.onnx", {"platform": "fathom_recipe"})]:
        os.makedirs(os.path.join(repo, model, "1"), exist_ok=True)
        p = subprocess.run([BIN, "export", os.path.join(repo, "g", "1"), "-o", os.path.join(repo, model, "1", fname)],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, "fathom export of the graph model to %s/%s: %s" % (model, fname, p.stderr.strip()))
        if cfg:
            json.dump(cfg, open(os.path.join(repo, model, "config.json"), "w"))
    # the same file with the config a Triton model repository holds: config.pbtxt, in protobuf text
    for model, text in [("onx-pbtxt", PBTXT), ("bad-pbtxt", PBTXT.replace("dims: [ 3 ]", "dims: [ 3 "))]:
        os.makedirs(os.path.join(repo, model, "1"), exist_ok=True)
        shutil.copy(os.path.join(repo, "onx", "1", "model.onnx"), os.path.join(repo, model, "1"))
        open(os.path.join(repo, model, "config.pbtxt"), "w").write(text.replace("@NAME@", model))


PBTXT = """# as Triton's documentation writes one
name: "@NAME@"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "probs"
    data_type: TYPE_FP32
    dims: [ 3 ]
  }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 1500
}
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def pbtxt_checks(s, ref):
    st, j = s.json("GET", "/v2/models/onx-pbtxt/config")
    check(st == 200 and j["max_batch_size"] == 8 and j["dynamic_batching"]["preferred_batch_size"] == [4, 8]
          and j["dynamic_batching"]["max_queue_delay_microseconds"] == 1500 and j["input"][0]["dims"] == [4]
          and j["output"][0]["dims"] == [3], "a config.pbtxt is read as Triton reads it: %s" % j)
    x = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]
    want = [v for r in ref(x) for v in r]
    st, j = s.json("POST", "/v2/models/onx-pbtxt/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [v for r in x for v in r]}]})
    check(st == 200 and max(abs(a - b_) for a, b_ in zip(j["outputs"][0]["data"], want)) < 1e-6,
          "the model configured by config.pbtxt infers: %s" % (j if st != 200 else "ok"))
    st, j = s.json("POST", "/v2/models/onx-pbtxt/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 4], "data": [0.0] * 36}]})
    check(st == 400 and "max_batch_size" in j.get("error", ""), "its max_batch_size (8) holds: %s %s" % (st, j))
    st, idx = s.json("POST", "/v2/repository/index")
    reason = {m["name"]: m.get("reason", "") for m in idx}.get("bad-pbtxt", "") if st == 200 else ""
    check("bad-pbtxt/config.pbtxt:17:3: expected ',' or ']' in a list" in reason,
          "a malformed config.pbtxt is refused naming the file, line and column: %s" % reason)


def classification_checks(s, ref):
    """Triton's classification extension on graph 'g-labels' (the graph model with label_filename labels.txt in
    its config): the top k of probs with their labels; k past the classes is cut; a bad k is 400."""
    x = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]
    probs = ref(x)
    labels = ["cat", "dog", "fish"]
    want = [["%f:%d:%s" % (row[k], k, labels[k]) for k in sorted(range(3), key=lambda k: (-row[k], k))] for row in probs]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [v for r in x for v in r]}],
            "outputs": [{"name": "probs", "parameters": {"classification": 2}}]}
    st, j = s.json("POST", "/v2/models/g-labels/infer", body)
    o = j["outputs"][0] if st == 200 else {}
    check(st == 200 and o["datatype"] == "BYTES" and o["shape"] == [2, 2] and o["data"] == [w for r in want for w in r[:2]],
          "classification 2 with labels: %s (want %s)" % (o or j, [w for r in want for w in r[:2]]))
    body["outputs"][0]["parameters"]["classification"] = 10
    st, j = s.json("POST", "/v2/models/g-labels/infer", body)
    check(st == 200 and j["outputs"][0]["shape"] == [2, 3], "classification 10 of 3 classes gives 3")
    body["outputs"][0]["parameters"]["classification"] = 0
    st, j = s.json("POST", "/v2/models/g-labels/infer", body)
    check(st == 400 and "classification" in j.get("error", ""), "classification 0 -> 400: %s" % j)
    st, j = s.json("GET", "/v2/models/g-labels/config")
    check(st == 200 and j["output"][0].get("label_filename") == "labels.txt", "the config shows the label file")
    st, idx = s.json("POST", "/v2/repository/index")
    reason = {m["name"]: m.get("reason", "") for m in idx}.get("g-nolabels", "")
    check("label_filename" in reason and "cannot open" in reason, "a missing label file is refused: %s" % reason)


def onnx_checks(s, ref):
    x = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0], [-3.0, 0.0, 0.5, 4.0]]
    want = [v for r in ref(x) for v in r]
    for model in ("onx", "onx-named"):
        st, j = s.json("GET", "/v2/models/" + model)
        check(st == 200 and j["platform"] == "fathom_onnx" and j["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
              "ONNX model %s: metadata %s" % (model, j))
        st, j = s.json("POST", "/v2/models/%s/infer" % model,
                       {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": [v for r in x for v in r]}]})
        err = max(abs(a - b_) for a, b_ in zip(j["outputs"][0]["data"], want)) if st == 200 else None
        check(st == 200 and len(j["outputs"][0]["data"]) == 9 and err < 1e-6,
              "ONNX model %s (model.onnx in the version folder) infers the formula, batch 3: %s" % (model, err if st == 200 else j))
    st, idx = s.json("POST", "/v2/repository/index")
    reasons = {m["name"]: m.get("reason", "") for m in idx} if st == 200 else {}
    check("not one fathom serves" in reasons.get("bad-platform", ""), "an unknown platform is refused: %s" % reasons.get("bad-platform"))
    check("names platform 'fathom_recipe'" in reasons.get("wrong-platform", ""),
          "a platform the folder does not hold is refused: %s" % reasons.get("wrong-platform"))


def write_onnx_interp(repo):
    """'onx-lstm': an LSTM (ONNX LSTM, the batch moved first around it) over 4 steps, then a Scan summing its
    hidden states step by step: ops with no graph form, so the server runs the file with the ONNX
    interpreter (as `fathom run` does). Its reference is ONNX Runtime on the same file (skipped
    without onnx and onnxruntime)."""
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto as T, helper as h, save
    except ImportError as e:
        skips.append("the ONNX-interpreter model (needs numpy, onnx, onnxruntime: %s)" % e)
        return None
    rng = np.random.default_rng(5)
    W, R = rng.standard_normal((1, 20, 3)).astype(np.float32) * 0.5, rng.standard_normal((1, 20, 5)).astype(np.float32) * 0.5
    Bv = rng.standard_normal((1, 40)).astype(np.float32) * 0.1
    body = h.make_graph([h.make_node("Add", ["s", "yt"], ["s2"])], "sum",
                        [h.make_tensor_value_info("s", T.FLOAT, ["b", 5]), h.make_tensor_value_info("yt", T.FLOAT, ["b", 5])],
                        [h.make_tensor_value_info("s2", T.FLOAT, ["b", 5])])
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),  # [4, batch, 3]: ONNX Runtime has no batch-first LSTM
             h.make_node("LSTM", ["xt", "W", "R", "B"], ["Y", "Y_h"], hidden_size=5),
             h.make_node("Squeeze", ["Y", "ax1"], ["Yq"]), h.make_node("Transpose", ["Yq"], ["Ys"], perm=[1, 0, 2]),  # [batch, 4, 5]
             h.make_node("Squeeze", ["Y_h", "ax0"], ["H"]),  # [batch, 5]
             h.make_node("Mul", ["H", "zero"], ["s0"]),
             h.make_node("Scan", ["s0", "Ys"], ["total"], body=body, num_scan_inputs=1, scan_input_axes=[1]),  # over the 4 steps
             h.make_node("Unsqueeze", ["total", "ax1"], ["t3"]), h.make_node("Add", ["Ys", "t3"], ["z"])]
    inits = [h.make_tensor("W", T.FLOAT, W.shape, W.ravel()), h.make_tensor("R", T.FLOAT, R.shape, R.ravel()),
             h.make_tensor("B", T.FLOAT, Bv.shape, Bv.ravel()), h.make_tensor("ax0", T.INT64, [1], [0]),
             h.make_tensor("ax1", T.INT64, [1], [1]), h.make_tensor("zero", T.FLOAT, [], [0.0])]
    g = h.make_graph(nodes, "lstm", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4, 3])],
                     [h.make_tensor_value_info("z", T.FLOAT, ["batch", 4, 5])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    os.makedirs(os.path.join(repo, "onx-lstm", "1"), exist_ok=True)
    path = os.path.join(repo, "onx-lstm", "1", "model.onnx")
    save(m, path)
    json.dump({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 2000}},
              open(os.path.join(repo, "onx-lstm", "config.json"), "w"))
    x = rng.standard_normal((3, 4, 3)).astype(np.float32)
    return x, ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def write_unbatched(repo):
    """Triton's max_batch_size 0 (no batching): 'fixed2', an ONNX model exported at a fixed batch of 2 (no config:
    served unbatched, as Triton's ONNX backend would); 'fixed2-mbs8', the same file with max_batch_size 8 (refused);
    'g0', the batched graph model with a config.pbtxt that says max_batch_size 0 and whole-shape dims; 'g0-db', that
    with dynamic_batching too (refused). The reference is ONNX Runtime (skipped without onnx and onnxruntime)."""
    shutil.copytree(os.path.join(repo, "g", "1"), os.path.join(repo, "g0", "1"))
    open(os.path.join(repo, "g0", "config.pbtxt"), "w").write(
        'max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
        'output [ { name: "probs" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]\n')
    shutil.copytree(os.path.join(repo, "g", "1"), os.path.join(repo, "g0-db", "1"))
    open(os.path.join(repo, "g0-db", "config.pbtxt"), "w").write("max_batch_size: 0\ndynamic_batching { }\n")
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto as T, helper as h, save
    except ImportError as e:
        skips.append("the fixed-batch ONNX model (needs numpy, onnx, onnxruntime: %s)" % e)
        return None
    rng = np.random.default_rng(7)
    W, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
                      h.make_node("Softmax", ["a"], ["y"], axis=-1)], "fixed",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 4])], [h.make_tensor_value_info("y", T.FLOAT, [2, 3])],
                     initializer=[h.make_tensor("W", T.FLOAT, W.shape, W.ravel()), h.make_tensor("b", T.FLOAT, [3], b)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    for model in ("fixed2", "fixed2-mbs8"):
        os.makedirs(os.path.join(repo, model, "1"), exist_ok=True)
        save(m, os.path.join(repo, model, "1", "model.onnx"))
    json.dump({"max_batch_size": 8}, open(os.path.join(repo, "fixed2-mbs8", "config.json"), "w"))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    return x, ort.InferenceSession(os.path.join(repo, "fixed2", "1", "model.onnx"),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


DENSENET_PBTXT = """name: "@NAME@"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 8, 8 ]
    reshape { shape: [ 1, 3, 8, 8 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 10 ]
    reshape { shape: [ 1, 10, 1, 1 ] }
    label_filename: "labels.txt"
  }
]
"""


def write_quickstart(repo):
    """Triton's quickstart model repository shape (its densenet_onnx config, written as Triton ships it, with
    max_batch_size 0, reshapes and a label file) on a small stand-in: an ONNX conv net taking [1, 3, 8, 8] and
    giving [1, 10, 1, 1]; and 'g-reshape', the batched graph model behind dims [2, 2] -> [4] and [3] -> [3, 1]."""
    shutil.copytree(os.path.join(repo, "g", "1"), os.path.join(repo, "g-reshape", "1"))
    open(os.path.join(repo, "g-reshape", "config.pbtxt"), "w").write(
        'max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]\n'
        'output [ { name: "probs" data_type: TYPE_FP32 dims: [ 3, 1 ] reshape { shape: [ 3 ] } } ]\n')
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto as T, helper as h, save
    except ImportError as e:
        skips.append("the quickstart-shaped ONNX model (needs numpy, onnx, onnxruntime: %s)" % e)
        return None
    rng = np.random.default_rng(11)
    W = rng.standard_normal((10, 3, 3, 3)).astype(np.float32) * 0.3
    g = h.make_graph([h.make_node("Conv", ["data_0", "W"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
                      h.make_node("GlobalAveragePool", ["r"], ["p"]), h.make_node("Softmax", ["p"], ["fc6_1"], axis=1)],
                     "quick", [h.make_tensor_value_info("data_0", T.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("fc6_1", T.FLOAT, [1, 10, 1, 1])],
                     initializer=[h.make_tensor("W", T.FLOAT, W.shape, W.ravel())])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 7
    os.makedirs(os.path.join(repo, "densenet_onnx", "1"), exist_ok=True)
    path = os.path.join(repo, "densenet_onnx", "1", "model.onnx")
    save(m, path)
    open(os.path.join(repo, "densenet_onnx", "config.pbtxt"), "w").write(DENSENET_PBTXT.replace("@NAME@", "densenet_onnx"))
    open(os.path.join(repo, "densenet_onnx", "labels.txt"), "w").write("".join("CLASS_%d\n" % i for i in range(10)))
    x = rng.standard_normal((3, 8, 8)).astype(np.float32)
    return x, ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"data_0": x[None]})[0]


def quickstart_checks(s, ref, graph_ref):
    x = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]
    want = [v for r in graph_ref(x) for v in r]
    st, j = s.json("POST", "/v2/models/g-reshape/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2, 2], "data": [v for r in x for v in r]}]})
    o = j["outputs"][0] if st == 200 else {}
    check(st == 200 and o["shape"] == [2, 3, 1] and max(abs(a - b_) for a, b_ in zip(o["data"], want)) < 1e-6,
          "reshape: a [2, 2, 2] request runs the [b, 4] model and comes back [2, 3, 1] (%s)" % (o.get("shape") if o else j))
    st, j = s.json("GET", "/v2/models/g-reshape")
    check(st == 200 and j["inputs"][0]["shape"] == [-1, 2, 2] and j["outputs"][0]["shape"] == [-1, 3, 1],
          "reshape: the metadata shows the client's dims: %s" % j)
    if ref is None:
        return
    xin, yref = ref
    try:
        import numpy as np
        import tritonclient.http as th
    except ImportError:
        return
    c = th.InferenceServerClient("127.0.0.1:%d" % s.port)
    md = c.get_model_metadata("densenet_onnx")
    check(md["inputs"][0]["shape"] == [3, 8, 8] and md["outputs"][0]["shape"] == [10],
          "Triton's densenet_onnx config (max_batch_size 0, reshape) loads as Triton reads it: %s" % md)
    i = th.InferInput("data_0", [3, 8, 8], "FP32")
    i.set_data_from_numpy(xin, binary_data=True)
    r = c.infer("densenet_onnx", [i], outputs=[th.InferRequestedOutput("fc6_1", binary_data=True, class_count=3)])
    top = [v.decode() if isinstance(v, bytes) else v for v in r.as_numpy("fc6_1")]
    flat = yref.ravel()
    want = ["%f:%d:CLASS_%d" % (flat[k], k, k) for k in np.argsort(-flat, kind="stable")[:3]]
    check(top == want, "image_client's request (class_count 3) gives ONNX Runtime's top 3 with labels: %s (want %s)" % (top, want))
    full = c.infer("densenet_onnx", [i]).as_numpy("fc6_1")
    check(full.shape == (10,) and float(np.abs(full - flat).max()) < 1e-5, "the whole output, [10], as ONNX Runtime's")
    c.close()


def unbatched_checks(s, ref, graph_ref):
    st, idx = s.json("POST", "/v2/repository/index")
    reasons = {m["name"]: m.get("reason", "") for m in idx} if st == 200 else {}
    check("needs max_batch_size >= 1" in reasons.get("g0-db", ""),
          "max_batch_size 0 with dynamic_batching is refused: %s" % reasons.get("g0-db"))
    st, j = s.json("GET", "/v2/models/g0")
    check(st == 200 and j["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
          "max_batch_size 0: the metadata shows the whole shapes: %s" % j)
    st, j = s.json("GET", "/v2/models/g0/config")
    check(st == 200 and j["max_batch_size"] == 0 and j["input"][0]["dims"] == [-1, 4] and "dynamic_batching" not in j,
          "max_batch_size 0: the config keeps it and the whole dims: %s" % j)
    x = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0], [-3.0, 0.0, 0.5, 4.0]]
    want = [v for r in graph_ref(x) for v in r]
    st, j = s.json("POST", "/v2/models/g0/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": [v for r in x for v in r]}]})
    check(st == 200 and j["outputs"][0]["shape"] == [3, 3] and max(abs(a - b_) for a, b_ in zip(j["outputs"][0]["data"], want)) < 1e-6,
          "max_batch_size 0: a [3, 4] request runs whole: %s" % (j if st != 200 else j["outputs"][0]["shape"]))
    st, j = s.json("POST", "/v2/models/g0/infer", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 4], "data": [0.0] * 12}]})
    check(st == 400 and "whole shape" in j.get("error", ""), "max_batch_size 0: a batch dim in front is refused: %s" % j)
    if ref is None:
        return
    check("set max_batch_size: 0" in reasons.get("fixed2-mbs8", "") and "fixed first dim 2" in reasons.get("fixed2-mbs8", ""),
          "a fixed-batch model with max_batch_size 8 is refused with what to do: %s" % reasons.get("fixed2-mbs8"))
    xin, yref = ref
    st, j = s.json("GET", "/v2/models/fixed2")
    check(st == 200 and j["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 4]}]
          and j["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 3]}],
          "an ONNX model exported at batch 2 is served unbatched, whole shapes: %s" % j)
    st, j = s.json("GET", "/v2/models/fixed2/config")
    check(st == 200 and j["max_batch_size"] == 0, "... its config says max_batch_size 0: %s" % j)
    st, j = s.json("POST", "/v2/models/fixed2/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": xin.ravel().tolist()}]})
    err = max(abs(a - b_) for a, b_ in zip(j["outputs"][0]["data"], yref.ravel())) if st == 200 else None
    check(st == 200 and j["outputs"][0]["shape"] == [2, 3] and err < 1e-6,
          "the fixed-batch model infers as ONNX Runtime does: %s" % (err if st == 200 else j))
    st, j = s.json("POST", "/v2/models/fixed2/infer", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}]})
    check(st == 400 and "[2, 4]" in j.get("error", ""), "a request of another shape is refused naming the model's: %s" % j)
    try:
        import numpy as np
        import tritonclient.http as th
    except ImportError:
        return
    c = th.InferenceServerClient("127.0.0.1:%d" % s.port)
    inp = th.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(xin, binary_data=True)
    y = c.infer("fixed2", [inp]).as_numpy("y")
    check(y.shape == (2, 3) and float(np.abs(y - yref).max()) < 1e-6, "tritonclient infers the unbatched model (binary)")
    c.close()


def onnx_interp_checks(s, ref):
    if ref is None:
        return
    x, want = ref
    st, j = s.json("GET", "/v2/models/onx-lstm")
    check(st == 200 and j["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4, 3]}]
          and j["outputs"] == [{"name": "z", "datatype": "FP32", "shape": [-1, 4, 5]}],
          "ONNX model with no graph form (LSTM, Scan), served by the interpreter: metadata %s" % j)
    st, j = s.json("POST", "/v2/models/onx-lstm/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()}]})
    got = j["outputs"][0]["data"] if st == 200 else []
    err = max((abs(a - b_) for a, b_ in zip(got, want.reshape(-1).tolist())), default=None)
    check(st == 200 and len(got) == want.size and err is not None and err < 1e-5,
          "ONNX model with no graph form (LSTM, Scan), batch 3, equals ONNX Runtime: %s" % (err if st == 200 else j))


def write_onnx_patterns(repo):
    """What torch.onnx.export writes for a BERT (tests/onnx_import_patterns.py): 'onx-seq', whose config
    declares the per-sample dims (x [5, 4], mask [5]) so that the sequence dim is fixed at import and
    the batch stays dynamic; 'onx-nodims', the same file with no dims declared, imported with both
    the batch and the sequence dynamic."""
    d = os.path.join(TMP, "patterns")
    os.makedirs(d, exist_ok=True)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, os.path.join(here, "onnx_import_patterns.py"), d], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "writing the BERT-pattern ONNX model: %s" % p.stderr.strip()[-300:])
    for model, cfg in (("onx-seq", {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 1000},
                                    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [5, 4]},
                                              {"name": "mask", "data_type": "TYPE_INT64", "dims": [5]}]}),
                       ("onx-nodims", {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 100000}})):
        os.makedirs(os.path.join(repo, model, "1"), exist_ok=True)
        shutil.copy(os.path.join(d, "patterns.onnx"), os.path.join(repo, model, "1", "model.onnx"))
        json.dump(cfg, open(os.path.join(repo, model, "config.json"), "w"))
    p = subprocess.run([BIN, "run", os.path.join(d, "patterns.onnx"), "--input", "x=" + os.path.join(d, "x.npy"),
                        "--input", "mask=" + os.path.join(d, "mask.npy"), "--json"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "fathom run of the BERT-pattern model: %s" % p.stderr.strip()[-300:])
    return d, {o["name"]: o["data"] for o in json.loads(p.stdout)["outputs"]} if p.returncode == 0 else {}


def onnx_patterns_checks(s, d, ref):
    import numpy as np
    x, mask = np.load(os.path.join(d, "x.npy")), np.load(os.path.join(d, "mask.npy"))
    st, j = s.json("GET", "/v2/models/onx-seq")
    check(st == 200 and j["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 5, 4]},
                                        {"name": "mask", "datatype": "INT64", "shape": [-1, 5]}],
          "ONNX BERT-pattern model with its sequence dim declared: metadata %s" % j)
    st, j = s.json("POST", "/v2/models/onx-seq/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()},
                               {"name": "mask", "datatype": "INT64", "shape": list(mask.shape), "data": mask.reshape(-1).tolist()}]})
    outs = {o["name"]: o["data"] for o in j.get("outputs", [])} if st == 200 else {}
    err = max((abs(a - b_) for k in ("attn", "gelu") for a, b_ in zip(outs.get(k, []), ref.get(k, []))), default=None)
    check(st == 200 and all(len(outs.get(k, [])) == len(ref.get(k, [1])) for k in ("attn", "gelu")) and err is not None and err < 1e-5,
          "ONNX BERT-pattern model, batch 2 (dims from the config), equals fathom run on the file: %s" % (err if st == 200 else j))
    # no dims declared: both the batch and the sequence stay dynamic (arange, dim_size and an
    # index_select carry the mask's arithmetic), and a request of any sequence length runs
    # concurrent requests of 5 and of 3 tokens, the model's first (its batcher waits for
    # company, as 'burst' below): the batcher joins only requests of one
    # per-sample shape, so each gets its own length's outputs (a batch of mixed lengths would
    # fail as a whole); the 5-token ones equal sample 0 of the batch-2 run
    res = {}

    def worker(k):
        L = 5 if k % 2 == 0 else 3
        xs, ms = x[:1, :L], mask[:1, :L]
        st, j = s.json("POST", "/v2/models/onx-nodims/infer",
                       {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(xs.shape), "data": xs.reshape(-1).tolist()},
                                   {"name": "mask", "datatype": "INT64", "shape": list(ms.shape), "data": ms.reshape(-1).tolist()}]})
        res[k] = (L, st, {o["name"]: o for o in j.get("outputs", [])} if st == 200 else j)
    th = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    bad_ = [(k, r[1]) for k, r in res.items() if r[1] != 200 or r[2]["gelu"]["shape"] != [1, r[0], 4]]
    err5 = max((abs(a - b_) for L, st, o in res.values() if st == 200 and L == 5
                for a, b_ in zip(o["gelu"]["data"], ref.get("gelu", [])[:20])), default=None)
    check(len(res) == 8 and not bad_ and err5 is not None and err5 < 1e-5,
          "8 concurrent requests of 5 and 3 tokens to the dynamic-sequence model: each its own length's outputs "
          "(5-token ones within %s of the reference): failures %s" % (err5, bad_))
    st, j = s.json("GET", "/v2/models/onx-nodims")
    check(st == 200 and [i["shape"] for i in j.get("inputs", [])] == [[-1, -1, 4], [-1, -1]],
          "the same without declared dims: batch and sequence dynamic in the metadata: %s" % j)
    st, j = s.json("POST", "/v2/models/onx-nodims/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()},
                               {"name": "mask", "datatype": "INT64", "shape": list(mask.shape), "data": mask.reshape(-1).tolist()}]})
    outs = {o["name"]: o["data"] for o in j.get("outputs", [])} if st == 200 else {}
    err = max((abs(a - b_) for k in ("attn", "gelu") for a, b_ in zip(outs.get(k, []), ref.get(k, []))), default=None)
    check(st == 200 and all(len(outs.get(k, [])) == len(ref.get(k, [1])) for k in ("attn", "gelu")) and err is not None and err < 1e-5,
          "the same without declared dims, batch 2 of 5 tokens, equals fathom run on the file: %s" % (err if st == 200 else j))
    x3, m3 = x[:1, :3], mask[:1, :3]
    st, j = s.json("POST", "/v2/models/onx-nodims/infer",
                   {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x3.shape), "data": x3.reshape(-1).tolist()},
                               {"name": "mask", "datatype": "INT64", "shape": list(m3.shape), "data": m3.reshape(-1).tolist()}]})
    outs = {o["name"]: o for o in j.get("outputs", [])} if st == 200 else {}
    check(st == 200 and outs.get("gelu", {}).get("shape") == [1, 3, 4] and outs.get("attn", {}).get("shape") == [1, 1, 3, 4],
          "the same without declared dims, batch 1 of 3 tokens: outputs of that sequence length: %s" % (
              {k: v.get("shape") for k, v in outs.items()} if st == 200 else j))


EMB_DIM = 32  # an int4 group (32) divides it, so the table also quantizes (model emb-q4)
EMB_TABLE = [[0.5 * r + 0.125 * c for c in range(EMB_DIM)] for r in range(5)]


def write_emb_graph(repo):
    """Token ids into an embedding table (a constant [5, 32]): model 'emb', a graph directory whose INT64 input
    ids [batch, 2] feeds the lookup; 'emb-onnx', the same exported to ONNX (a Gather on a constant table); and
    'emb-q4', the same quantized to int4 (qembedding_int4). All batch with a 300 ms window, so concurrent
    requests share one execution."""
    d = os.path.join(repo, "emb", "1")
    os.makedirs(d, exist_ok=True)
    g = {"format": "fathom-graph", "version": 1, "meta": {}, "dim_hints": {"batch": 2},
         "inputs": [{"name": "ids", "dtype": "i64", "shape": ["batch", 2]}], "outputs": ["vec"],
         "constants": [{"name": "table", "dtype": "f32", "shape": [5, EMB_DIM]}],
         "nodes": [{"name": "lookup", "op": "embedding", "inputs": ["table", "ids"],
                    "outputs": [{"name": "vec", "dtype": "f32", "shape": ["batch", 2, EMB_DIM]}], "attrs": {}}]}
    json.dump(g, open(os.path.join(d, "graph.json"), "w"))
    hdr = json.dumps({"table": {"dtype": "F32", "shape": [5, EMB_DIM], "data_offsets": [0, 5 * EMB_DIM * 4]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    data = struct.pack("<%df" % (5 * EMB_DIM), *[v for row in EMB_TABLE for v in row])
    open(os.path.join(d, "weights.safetensors"), "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)
    cfg = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 300000}}
    json.dump(cfg, open(os.path.join(repo, "emb", "config.json"), "w"))
    os.makedirs(os.path.join(repo, "emb-onnx", "1"), exist_ok=True)
    p = subprocess.run([BIN, "export", d, "-o", os.path.join(repo, "emb-onnx", "1", "model.onnx")],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "fathom export of the embedding graph to ONNX: %s" % p.stderr.strip())
    json.dump(cfg, open(os.path.join(repo, "emb-onnx", "config.json"), "w"))
    os.makedirs(os.path.join(repo, "emb-q4"), exist_ok=True)
    p = subprocess.run([BIN, "quantize", d, "-o", os.path.join(repo, "emb-q4", "1"), "--int4", "--group", "32"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and "qembedding_int4" in open(os.path.join(repo, "emb-q4", "1", "graph.json")).read(),
          "fathom quantize --int4 of the embedding graph: %s" % p.stderr.strip())
    json.dump(cfg, open(os.path.join(repo, "emb-q4", "config.json"), "w"))


def emb_checks(s):
    """An id outside the table is its own request's 400, checked before batching; the requests that would
    have shared its batch succeed (before id_limit was set for graph inputs, the lookup failed the batch)."""
    # emb-q4's rows are the table's to within one int4 step (its group's largest magnitude / 7)
    step = max(abs(v) for row in EMB_TABLE for v in row) / 7
    for model, tol in (("emb", 1e-6), ("emb-onnx", 1e-6), ("emb-q4", step)):
        st, j = s.json("GET", "/v2/models/" + model)
        check(st == 200 and j["inputs"] == [{"name": "ids", "datatype": "INT64", "shape": [-1, 2]}],
              "%s: metadata %s" % (model, j))
        before = s.metrics()
        bodies = [[[0, 4]], [[1, 2], [3, 3]], [[2, 5]], [[4, 0]], [[-1, 1]]]  # the third and fifth are out of range
        res = [None] * len(bodies)

        def worker(k):
            ids = bodies[k]
            res[k] = s.json("POST", "/v2/models/%s/infer" % model, {"inputs": [
                {"name": "ids", "datatype": "INT64", "shape": [len(ids), 2], "data": [v for r in ids for v in r]}]})
        th = [threading.Thread(target=worker, args=(k,)) for k in range(len(bodies))]
        for t in th:
            t.start()
        for t in th:
            t.join()
        for k in (2, 4):
            st, j = res[k]
            check(st == 400 and "is not a token id" in j.get("error", "") and "[0, 5)" in j["error"],
                  "%s: an id outside the 5-row table is that request's 400: %s %s" % (model, st, j))
        for k in (0, 1, 3):
            st, j = res[k]
            want = [v for r in bodies[k] for i in r for v in EMB_TABLE[i]]
            got = j["outputs"][0]["data"] if st == 200 else None
            check(st == 200 and got is not None and len(got) == len(want) and max(abs(a - b_) for a, b_ in zip(got, want)) < tol,
                  "%s: request %d, batched beside the bad ones, gets its rows: %s %s" % (model, k, st, j))
        m = s.metrics()
        lab = '{model="%s",version="1"}' % model
        n = m.get("fathom_inference_count" + lab, 0) - before.get("fathom_inference_count" + lab, 0)
        e = m.get("fathom_inference_exec_count" + lab, 0) - before.get("fathom_inference_exec_count" + lab, 0)
        check(n == 4 and 0 < e < 3, "%s: the three good requests (4 rows) ran in %d execution(s), the bad ones in none" % (model, e))


def usage_checks():
    def run(*args):
        p = subprocess.run([BIN, "serve", *args], capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout + p.stderr
    rc, out = run("--help")
    check(rc == 0 and "usage: fathom serve" in out, "serve --help -> 0")
    rc, out = run()
    check(rc == 2 and "--model-repository DIR is required" in out, "serve without a repository -> 2")
    rc, out = run("--model-repository", TMP, "--model-control", "sometimes")
    check(rc == 2 and "poll or explicit" in out, "bad --model-control -> 2")
    rc, out = run("--model-repository", TMP, "--port", "70000")
    check(rc == 2 and "--port" in out, "--port 70000 -> 2")
    rc, out = run("--model-repository", TMP, "--host", "0.0.0.0", "--model-control", "explicit")
    check(rc == 2 and "without --api-key" in out, "non-loopback control without a key refused -> 2: " + out.strip())
    rc, out = run("--model-repository", TMP, "--release-idle-secs", "-1")
    check(rc == 2 and "--release-idle-secs" in out, "--release-idle-secs -1 -> 2")
    rc, out = run("--model-repository", os.path.join(TMP, "nope"))
    check(rc == 1 and "not a directory" in out, "missing repository -> 1")


def predict_reference(x):
    """Logits' argmax and top probability from `fathom predict --json` on the same samples."""
    n = len(x)
    flat = [v for s in x for c in s for row in c for v in row]
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, 1, 8, 8), }" % n
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    path = os.path.join(TMP, "x.npy")
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + struct.pack("<%df" % len(flat), *flat))
    p = subprocess.run([BIN, "predict", MODEL, path, "--json"], capture_output=True, text=True, timeout=60)
    return [(r["class"], r["probability"]) for r in json.loads(p.stdout)["predictions"]]


def softmax_top(row):
    import math
    m = max(row)
    e = [math.exp(v - m) for v in row]
    i = max(range(len(row)), key=lambda k: row[k])
    return i, e[i] / sum(e)


def protocol_checks(s):
    st, j = s.json("GET", "/v2/health/live")
    check(st == 200, "GET /v2/health/live -> 200")
    st, j = s.json("GET", "/v2/health/ready")
    check(st == 200, "GET /v2/health/ready -> 200")
    st, j = s.json("GET", "/v2")
    check(st == 200 and j["name"] == "fathom" and "binary_tensor_data" in j["extensions"], "server metadata")
    st, j = s.json("GET", "/v2/models/tiny")
    check(st == 200 and j["versions"] == ["1"] and j["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}
          and j["outputs"][0]["shape"] == [-1, 4], "model metadata: %s" % j)
    st, j = s.json("GET", "/v2/models/tiny/versions/1")
    check(st == 200 and j["name"] == "tiny", "model metadata of version 1")
    st, j = s.json("GET", "/v2/models/tiny/versions/7")
    check(st == 404 and "no version 7" in j["error"], "unknown version -> 404 with a message")
    st, _ = s.json("GET", "/v2/models/tiny/ready")
    check(st == 200, "model ready")
    st, _ = s.json("GET", "/v2/models/tiny/versions/1/ready")
    check(st == 200, "model version ready")
    st, j = s.json("GET", "/v2/models/tiny/config")
    check(st == 200 and j["max_batch_size"] == 16 and j["dynamic_batching"]["max_queue_delay_microseconds"] == 20000,
          "model config: %s" % j)
    st, j = s.json("GET", "/v2/models/ghost")
    check(st == 404 and "unknown model 'ghost'" in j["error"], "unknown model -> 404")
    st, j = s.json("POST", "/v2/repository/index", {})
    check(st == 200 and {"name": "tiny", "state": "READY", "version": "1"} in j, "repository index: %s" % j)
    x = sample(3)
    st, j = s.json("POST", "/v2/models/tiny/infer", dict(infer_body(x), id="req-7"))
    ref = predict_reference(x)
    got = [softmax_top(j["outputs"][0]["data"][4 * i:4 * i + 4]) for i in range(3)] if st == 200 else []
    check(st == 200 and j["id"] == "req-7" and j["model_version"] == "1" and j["outputs"][0]["shape"] == [3, 4] and
          all(g[0] == r[0] and abs(g[1] - r[1]) < 1e-4 for g, r in zip(got, ref)) and len(got) == 3,
          "JSON infer matches `fathom predict` (%s vs %s)" % (got, ref))
    # binary extension: input as raw FP32 bytes, output asked for as binary
    flat = [v for smp in x for c in smp for row in c for v in row]
    hdr = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [3, 1, 8, 8],
                                  "parameters": {"binary_data_size": 4 * len(flat)}}],
                      "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    st, h, data = s.request("POST", "/v2/models/tiny/infer", hdr + struct.pack("<%df" % len(flat), *flat),
                            {"Inference-Header-Content-Length": str(len(hdr))})
    hl = int(h.get("Inference-Header-Content-Length", "-1"))
    ok_bin = st == 200 and hl > 0 and len(data) == hl + 48
    if ok_bin:
        vals = struct.unpack("<12f", data[hl:])
        ok_bin = all(abs(a - b) < 1e-5 for a, b in zip(vals, j["outputs"][0]["data"]))
    check(ok_bin, "binary tensor data in and out match the JSON result")
    # nested JSON data is accepted as well as flat
    st, j2 = s.json("POST", "/v2/models/tiny/infer", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [3, 1, 8, 8], "data": x}]})
    check(st == 200 and j2["outputs"][0]["data"] == j["outputs"][0]["data"], "nested JSON data")


def shm_checks(s):
    """Triton's system shared memory extension through tritonclient: the input read from a region and the output
    written to another, equal to the same request over HTTP; registration errors; status; unregister."""
    try:
        import numpy as np
        import tritonclient.http as th
        import tritonclient.utils.shared_memory as shm
    except ImportError as e:
        skips.append("shared memory checks (tritonclient, numpy): %s" % e)
        return
    c = th.InferenceServerClient("127.0.0.1:%d" % s.port)
    x = np.asarray(sample(3, seed=4), dtype=np.float32)
    key_in, key_out = "/fathom_test_in_%d" % os.getpid(), "/fathom_test_out_%d" % os.getpid()
    hin = shm.create_shared_memory_region("in0", key_in, x.nbytes + 64)
    hout = shm.create_shared_memory_region("out0", key_out, 3 * 4 * 4)
    try:
        shm.set_shared_memory_region(hin, [x], offset=64)
        c.register_system_shared_memory("in0", key_in, x.nbytes + 64)
        c.register_system_shared_memory("out0", key_out, 3 * 4 * 4)
        st = c.get_system_shared_memory_status()
        check(sorted(r["name"] for r in st) == ["in0", "out0"], "shared memory status lists the regions: %s" % st)
        i = th.InferInput("input", list(x.shape), "FP32")
        i.set_shared_memory("in0", x.nbytes, offset=64)
        o = th.InferRequestedOutput("logits", binary_data=True)
        o.set_shared_memory("out0", 3 * 4 * 4)
        res = c.infer("tiny", [i], outputs=[o])
        out = res.get_output("logits")
        got = shm.get_contents_as_numpy(hout, np.float32, [3, 4])
        i2 = th.InferInput("input", list(x.shape), "FP32")
        i2.set_data_from_numpy(x)
        want = c.infer("tiny", [i2]).as_numpy("logits")
        check(out is not None and out["parameters"]["shared_memory_region"] == "out0" and np.array_equal(got, want),
              "an input read from and an output written to shared memory equal the HTTP ones (%s)" % (out,))
        for args, msg in [(("in0", key_in, 8), "already registered"), ((".hidden", key_in, 8), "invalid region name"),
                          (("x1", "noslash", 8), "not a POSIX shared memory name"),
                          (("x2", "/fathom_no_such_object", 8), "no shared memory object"),
                          (("x3", key_out, 4096), "fewer bytes")]:
            try:
                c.register_system_shared_memory(*args)
                bad("registering %s should fail" % (args,))
            except Exception as e:
                check(msg in str(e), "a bad registration is refused: %s" % e)
        o2 = th.InferRequestedOutput("logits", binary_data=True)
        o2.set_shared_memory("out0", 8)
        try:
            c.infer("tiny", [i], outputs=[o2])
            bad("an output region too small should fail")
        except Exception as e:
            check("shared_memory_byte_size gives it 8" in str(e), "an output larger than its region is a 400: %s" % e)
        i3 = th.InferInput("input", list(x.shape), "FP32")
        i3.set_shared_memory("in0", x.nbytes, offset=128)
        try:
            c.infer("tiny", [i3])
            bad("reading past the region should fail")
        except Exception as e:
            check("do not fit" in str(e), "an input past its region's end is a 400: %s" % e)
        c.unregister_system_shared_memory("in0")
        check([r["name"] for r in c.get_system_shared_memory_status()] == ["out0"], "unregister one region")
        try:
            c.infer("tiny", [i])
            bad("an unregistered region should fail")
        except Exception as e:
            check("not registered" in str(e), "a request naming an unregistered region is a 400: %s" % e)
        c.unregister_system_shared_memory()
        check(c.get_system_shared_memory_status() == [], "unregister all")
        st_, j = s.json("POST", "/v2/cudasharedmemory/region/g/register", {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 4})
        check(st_ == 400 and "CUDA shared memory is not supported" in j.get("error", ""), "CUDA shared memory refused: %s" % j)
    finally:
        shm.destroy_shared_memory_region(hin)
        shm.destroy_shared_memory_region(hout)
        c.close()


def shm_remote_checks():
    """Shared memory control is for local clients: a server on 0.0.0.0 answers 403 to one that reaches it on the
    machine's own non-loopback address, 401 to a local one without the key, 200 to a local one with it."""
    import socket
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.connect(("10.255.255.255", 1))
        ip = u.getsockname()[0]
    except OSError:
        ip = None
    finally:
        u.close()
    if not ip or ip.startswith("127."):
        skips.append("shared memory from a non-loopback address: this machine has no such address")
        return
    log = os.path.join(TMP, "serve-remote.log")
    os.makedirs(os.path.join(TMP, "empty-repo"), exist_ok=True)
    p = subprocess.Popen([BIN, "serve", "--model-repository", os.path.join(TMP, "empty-repo"), "--host", "0.0.0.0",
                          "--api-key", "k3y", "--port", "0", "--metrics-port", "-1"], stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        port, deadline = None, time.time() + 30
        while port is None and time.time() < deadline and p.poll() is None:
            text = open(log).read()
            if "listening on http://" in text:
                port = int(text.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1].rstrip("/"))
            time.sleep(0.05)
        got = []
        for host, hdr in ((ip, {"X-API-Key": "k3y"}), ("127.0.0.1", {}), ("127.0.0.1", {"X-API-Key": "k3y"})):
            c = http.client.HTTPConnection(host, port, timeout=10)
            c.request("GET", "/v2/systemsharedmemory/status", headers=hdr)
            got.append(c.getresponse().status)
            c.close()
        check(got == [403, 401, 200], "shared memory: 403 from %s, 401 locally without the key, 200 with it (%s)" % (ip, got))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


def tritonclient_checks(s):
    try:
        import numpy as np
        import tritonclient.http as th
    except ImportError as e:
        skips.append("tritonclient checks (pip install 'tritonclient[http]' numpy): %s" % e)
        return
    c = th.InferenceServerClient("127.0.0.1:%d" % s.port)
    check(c.is_server_live() and c.is_server_ready() and c.is_model_ready("tiny"), "tritonclient: live, ready, model ready")
    md = c.get_model_metadata("tiny")
    check(md["inputs"][0]["name"] == "input", "tritonclient: model metadata")
    cfg = c.get_model_config("tiny")
    check(cfg["max_batch_size"] == 16, "tritonclient: model config")
    x = np.asarray(sample(5, seed=9), dtype=np.float32)
    res = {}
    for binary in (False, True):
        i = th.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        o = th.InferRequestedOutput("logits", binary_data=binary)
        r = c.infer("tiny", [i], outputs=[o], request_id="t%d" % binary)
        res[binary] = r.as_numpy("logits")
    # the classification extension (InferRequestedOutput(class_count=K)): BYTES "value:index", highest first
    for binary in (False, True):
        i = th.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        top = c.infer("tiny", [i], outputs=[th.InferRequestedOutput("logits", binary_data=binary, class_count=2)]).as_numpy("logits")
        want = [["%f:%d" % (row[k], k) for k in np.argsort(-row, kind="stable")[:2]] for row in res[False]]
        got = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in top] if top is not None else None
        check(top is not None and top.shape == (5, 2) and got == want,
              "tritonclient class_count=2 (%s): the top 2 as value:index (%s)" % ("binary" if binary else "JSON", got and got[0]))
    check(res[False].shape == (5, 4) and np.allclose(res[False], res[True], atol=1e-6),
          "tritonclient: JSON and binary modes agree")
    try:
        c.infer("tiny", [th.InferInput("wrong", [1, 1, 8, 8], "FP32").set_data_from_numpy(x[:1])])
        bad("tritonclient: an unknown input should fail")
    except Exception as e:
        check("unknown input 'wrong'" in str(e), "tritonclient: unknown input raises with the server's message")
    idx = c.get_model_repository_index()
    check(any(m["name"] == "tiny" for m in idx), "tritonclient: repository index")


def batching_checks(s):
    # model 'burst' (the same weights as 'tiny') has had no request yet, so its batcher waits
    # for company (the adaptive wait stops waiting only after a wait that ended alone)
    before = s.metrics()
    results = []

    def worker(k):
        st, j = s.json("POST", "/v2/models/burst/infer", infer_body(sample(1, seed=k)))
        results.append(st)
    th = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    m = s.metrics()
    lab = '{model="burst",version="1"}'
    n = m["fathom_inference_count" + lab] - before.get("fathom_inference_count" + lab, 0)
    e = m["fathom_inference_exec_count" + lab] - before.get("fathom_inference_exec_count" + lab, 0)
    check(results.count(200) == 12 and n == 12 and 0 < e < 12,
          "12 concurrent requests ran in %d executions (dynamic batching; average batch %.1f)" % (e, n / max(e, 1)))
    check(m["fathom_inference_request_success" + lab] >= 12 and 'fathom_inference_request_latency_us_bucket{model="burst",version="1",le="+Inf"}' in m,
          "metrics: success count and latency histogram")
    check(m.get('fathom_memory_used_bytes{device="cpu"}', 0) > 0 and m.get("fathom_process_resident_memory_bytes", 0) > 0,
          "metrics: memory per device and RSS")
    stats_checks(s, e)


def stats_checks(s, execs):
    """Triton's statistics extension on 'burst' after batching_checks' 12 requests in `execs` executions:
    per-request counts, per-execution batch_stats whose sizes sum to the 12 rows, and tritonclient's call."""
    st, j = s.json("GET", "/v2/models/burst/stats")
    ms = j.get("model_stats", [{}])[0] if st == 200 else {}
    inf = ms.get("inference_stats", {})
    bs = ms.get("batch_stats", [])
    check(st == 200 and ms.get("name") == "burst" and ms.get("version") == "1" and ms.get("inference_count") == 12
          and ms.get("execution_count") == execs and inf["success"]["count"] == 12 and inf["success"]["ns"] > 0
          and inf["queue"]["count"] == 12 and inf["compute_infer"]["count"] == 12 and inf["compute_infer"]["ns"] > 0
          and inf["fail"]["count"] == 0 and sum(b["compute_infer"]["count"] for b in bs) == execs
          and sum(b["batch_size"] * b["compute_infer"]["count"] for b in bs) == 12 and ms.get("last_inference", 0) > 1.7e12,
          "GET /v2/models/burst/stats: Triton's statistics (%s)" % (ms if st == 200 else j))
    st, j = s.json("GET", "/v2/models/stats")
    names = {m["name"] for m in j.get("model_stats", [])} if st == 200 else set()
    check({"burst", "tiny", "g", "onx"} <= names, "GET /v2/models/stats: every loaded model (%d)" % len(names))
    st, j = s.json("GET", "/v2/models/burst/versions/1/stats")
    check(st == 200 and len(j["model_stats"]) == 1, "per-version statistics")
    st, j = s.json("GET", "/v2/models/burst/versions/7/stats")
    check(st == 404 and "version 7 is not loaded" in j.get("error", ""), "statistics of a version not loaded -> 404: %s" % j)
    st, j = s.json("GET", "/v2/models/ghost/stats")
    check(st == 404, "statistics of a model not loaded -> 404")
    try:
        import tritonclient.http as th
    except ImportError:
        return
    c = th.InferenceServerClient("127.0.0.1:%d" % s.port)
    got = c.get_inference_statistics("burst")
    check(got["model_stats"][0]["inference_count"] == 12, "tritonclient's get_inference_statistics reads them")
    c.close()


def lone_wait_checks(s):
    """Adaptive batch wait: model 'lonely' waits 300 ms for company. A lone client pays it once; after
    that wait ended alone, its requests run at once; requests that queue up together batch again and
    bring the wait back."""
    def timed():
        t0 = time.time()
        st, _ = s.json("POST", "/v2/models/lonely/infer", infer_body(sample(1)))
        return st, time.time() - t0
    st1, dt1 = timed()
    st2, dt2 = timed()
    st3, dt3 = timed()
    check(st1 == st2 == st3 == 200 and dt1 >= 0.28 and dt2 < 0.2 and dt3 < 0.2,
          "a lone client waits out the batch window once (%.0f ms), then not (%.0f, %.0f ms)"
          % (dt1 * 1000, dt2 * 1000, dt3 * 1000))
    lab = '{model="lonely",version="1"}'
    # bursts of 16 released together: requests that queue behind a running one form a batch
    # without any wait (the first of a burst may run alone; how many queue depends on timing).
    # After a round that batched, a lone request waits for company again, unless a straggler of
    # the burst itself waited the window out alone (a slow, loaded machine): then another round.
    rounds, batched, waited, dt4 = 0, 0, False, 0.0
    while rounds < 5 and not waited:
        rounds += 1
        before = s.metrics()
        res, go = [], threading.Barrier(16)

        def burst():
            go.wait()
            res.append(timed())
        th = [threading.Thread(target=burst) for _ in range(16)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        m = s.metrics()
        n = m["fathom_inference_count" + lab] - before["fathom_inference_count" + lab]
        e = m["fathom_inference_exec_count" + lab] - before["fathom_inference_exec_count" + lab]
        check(all(r[0] == 200 for r in res) and n == 16, "burst round %d: 16 requests answered 200 (%d counted)" % (rounds, n))
        if e >= n:
            continue
        batched += 1
        st4, dt4 = timed()
        check(st4 == 200, "lone request after burst round %d answered (%d)" % (rounds, st4))
        # a burst member that waited >= 280 ms ran alone after the window: that resets the wait legitimately
        straggled = any(r[1] >= 0.28 for r in res)
        waited = dt4 >= 0.28
        if not waited and not straggled:
            break
    check(batched > 0, "concurrent requests after the lone ones still batch (%d of %d rounds)" % (batched, rounds))
    check(waited, "after a batch formed, a lone request waits for company again (%.0f ms, round %d)" % (dt4 * 1000, rounds))


def memory_checks(s):
    """The allocator's cache of freed blocks (kept for reuse under load) goes back to the system
    once the server has been idle for --release-idle-secs (2 by default)."""
    for k in range(3):
        s.json("POST", "/v2/models/tiny/infer", infer_body(sample(16, seed=k)))
    m = s.metrics()
    used, res = m.get('fathom_memory_used_bytes{device="cpu"}', 0), m.get('fathom_memory_reserved_bytes{device="cpu"}', 0)
    time.sleep(3.5)
    m2 = s.metrics()
    used2, res2 = m2.get('fathom_memory_used_bytes{device="cpu"}', 0), m2.get('fathom_memory_reserved_bytes{device="cpu"}', 0)
    # what stays over `used` is the allocator's 64-byte header of each live block
    check(res - used > 65536 and res2 - used2 < 8192 and used2 > 0,
          "cached memory released when idle: reserved %.0f kB over used after batches, %.0f kB after 3.5 s idle"
          % ((res - used) / 1024, (res2 - used2) / 1024))


def queue_checks(s):
    """Model 'slow' waits 400 ms for company and holds at most 2 queued requests."""
    out = {}

    def worker(k):
        out[k] = s.json("POST", "/v2/models/slow/infer", infer_body(sample(1)))
    th = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in th:
        t.start()
    time.sleep(0.15)
    t0 = time.time()
    st, j = s.json("POST", "/v2/models/slow/infer", infer_body(sample(1)))
    dt = time.time() - t0
    check(st == 503 and "Exceeds maximum queue size" in j["error"] and dt < 0.3,
          "full queue -> 503 at once (%.0f ms): %s" % (dt * 1000, j))
    for t in th:
        t.join()
    check(all(v[0] == 200 for v in out.values()), "the queued requests still succeed")
    body = infer_body(sample(1))
    body["parameters"] = {"timeout": 50000}
    t0 = time.time()
    st, j = s.json("POST", "/v2/models/slow/infer", body)
    dt = time.time() - t0
    check(st == 503 and "timeout" in j["error"] and dt < 0.35, "per-request timeout 50 ms honoured (%.0f ms): %s" % (dt * 1000, j))


def device_checks():
    """--device check (the test device, whose kernels are the CPU's): a trained recipe model and a graph
    served there answer with the CPU server's exact values; a shape-only or absent device is refused."""
    repo = make_repo("devrepo", {"tiny": ([1], {"max_batch_size": 16})})
    write_graph(os.path.join(repo, "g", "1"))
    x, gx = sample(5, seed=4), [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]
    bodies = {"tiny": infer_body(x), "g": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4],
                                                       "data": [v for r in gx for v in r]}]}}
    got = {}
    for dev in ("cpu", "check"):
        s = Server(repo, "--device", dev)
        try:
            for m, body in bodies.items():
                st, j = s.json("POST", "/v2/models/%s/infer" % m, body)
                got[(dev, m)] = j["outputs"][0]["data"] if st == 200 else "HTTP %d: %s" % (st, j)
            if dev == "check":
                met = s.metrics()
                check(any(k.startswith('fathom_memory_used_bytes{device="check') and v > 0 for k, v in met.items()),
                      "--device check: the metrics show memory in use on the check device")
        finally:
            s.stop()
    for m in bodies:
        check(isinstance(got[("check", m)], list) and got[("check", m)] == got[("cpu", m)],
              "--device check: %s's outputs equal the cpu server's exactly (%s)" % (m, str(got[("check", m)])[:120]))
    p = subprocess.run([BIN, "serve", "--model-repository", repo, "--device", "meta"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "meta" in p.stderr, "serve --device meta -> 2 with the reason: " + p.stderr.strip()[:160])
    p = subprocess.run([BIN, "serve", "--model-repository", repo, "--device", "gpu"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "--device" in p.stderr, "serve --device gpu (not a device) -> 2: " + p.stderr.strip()[:160])


def main():
    usage_checks()
    device_checks()
    repo = make_repo("repo", {
        "tiny": ([1], {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 20000}}),
        # 200 ms: the 12 threads of batching_checks must all start within the first request's wait,
        # which 20 ms did not always allow at load 9 (one execution each, 3 December 2026)
        "burst": ([1], {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 200000}}),
        "lonely": ([1], {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 300000}}),
        "slow": ([1], {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 400000,
                                                                 "default_queue_policy": {"max_queue_size": 2}}}),
    })
    graph_ref = write_graph(os.path.join(repo, "g", "1"))
    write_onnx(repo)
    pat_dir, pat_ref = write_onnx_patterns(repo)
    interp_ref = write_onnx_interp(repo)
    unbatched_ref = write_unbatched(repo)
    quick_ref = write_quickstart(repo)
    for name in ("g-labels", "g-nolabels"):
        shutil.copytree(os.path.join(repo, "g", "1"), os.path.join(repo, name, "1"))
        json.dump({"output": [{"name": "probs", "data_type": "TYPE_FP32", "dims": [3], "label_filename": "labels.txt"}]},
                  open(os.path.join(repo, name, "config.json"), "w"))
    open(os.path.join(repo, "g-labels", "labels.txt"), "w").write("cat\ndog\r\nfish")
    write_emb_graph(repo)
    s = Server(repo, "--connection-timeout", "2")
    try:
        protocol_checks(s)
        graph_checks(s, graph_ref)
        onnx_checks(s, graph_ref)
        pbtxt_checks(s, graph_ref)
        unbatched_checks(s, unbatched_ref, graph_ref)
        classification_checks(s, graph_ref)
        quickstart_checks(s, quick_ref, graph_ref)
        onnx_patterns_checks(s, pat_dir, pat_ref)
        onnx_interp_checks(s, interp_ref)
        emb_checks(s)
        tritonclient_checks(s)
        shm_checks(s)
        shm_remote_checks()
        batching_checks(s)
        lone_wait_checks(s)
        memory_checks(s)
        queue_checks(s)
        import serve_malformed
        serve_malformed.run(s, raw, status_of, infer_body, sample, ok, bad)
    finally:
        rc = s.stop()
    check(rc == 0, "SIGTERM on an idle server -> exit 0 (got %s)" % rc)
    import serve_lifecycle
    serve_lifecycle.run(Server, make_repo, infer_body, sample, ok, bad, check)
    import serve_textgen
    serve_textgen.run(Server, os.path.join(TMP, "gpt"), MODEL, TMP, check, skips)
    import serve_embed
    serve_embed.run(Server, BIN, TMP, check, skips)
    if fails:
        print("%d check(s) failed" % fails)
        sys.exit(1)
    if skips:
        for s_ in skips:
            print("SKIP:", s_)
        sys.exit(77)


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
main()
