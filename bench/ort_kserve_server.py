#!/usr/bin/env python3
"""The onnxruntime peer for bench/bench_serve.py: a minimal KServe v2 HTTP server
in Python (http.server, one thread per connection, HTTP/1.1 keep-alive) that runs
an ONNX model with onnxruntime's InferenceSession, one session.run per request
(no batching across requests). It speaks the binary tensor data extension as
bench_serve.py sends it (inputs with binary_data_size, outputs asked for as
binary) and plain JSON, so the same client load measures both servers. It also
answers GET /metrics with the counters bench_serve.py reads (requests and
executions, equal here: no batching).

  python3 bench/ort_kserve_server.py --model model.onnx --name fashion-cnn --port 8100 [--threads 1]

Loopback only. docs/SERVING.md has the set-up and the figures."""
import argparse, http.server, json, socketserver, struct, sys, threading

import numpy as np
import onnxruntime as ort

DT = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8, "INT8": np.int8,
      "BOOL": np.bool_}
NAME = {np.dtype(v): k for k, v in DT.items()}


class State:
    def __init__(self, a):
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
        self.name = a.name
        self.lock = threading.Lock()
        self.count = 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: without this, 40 ms delayed-ACK stalls

    def log_message(self, *args):
        pass

    def reply(self, status, body, ctype="application/json", extra=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        st = self.server.state
        if self.path == "/metrics":
            lab = '{model="%s",version="1"}' % st.name
            rss = 0
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
            text = "fathom_inference_count%s %d\nfathom_inference_exec_count%s %d\nfathom_process_resident_memory_bytes %d\n" % (
                lab, st.count, lab, st.count, rss)
            return self.reply(200, text.encode(), "text/plain")
        if self.path in ("/v2/health/live", "/v2/health/ready"):
            return self.reply(200, b"")
        self.reply(404, b'{"error": "unknown endpoint"}')

    def do_POST(self):
        st = self.server.state
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        if self.path != "/v2/models/%s/infer" % st.name:
            return self.reply(404, b'{"error": "unknown model"}')
        hlen = int(self.headers.get("Inference-Header-Content-Length", n))
        try:
            req = json.loads(body[:hlen])
            feeds, off = {}, hlen
            for i in req["inputs"]:
                dt = np.dtype(DT[i["datatype"]])
                size = i.get("parameters", {}).get("binary_data_size")
                if size is not None:
                    arr = np.frombuffer(body, dt, size // dt.itemsize, off)
                    off += size
                else:
                    arr = np.asarray(i["data"], dt)
                feeds[i["name"]] = arr.reshape(i["shape"])
            outs = st.sess.run(None, feeds)
        except Exception as e:  # a bad request: 400 with the reason, as a server would
            return self.reply(400, json.dumps({"error": str(e)}).encode())
        with st.lock:
            st.count += len(next(iter(feeds.values())))
        meta, raw = [], []
        for o, v in zip(st.sess.get_outputs(), outs):
            v = np.ascontiguousarray(v)
            meta.append({"name": o.name, "datatype": NAME.get(v.dtype, "FP32"), "shape": list(v.shape),
                         "parameters": {"binary_data_size": v.nbytes}})
            raw.append(v.tobytes())
        hdr = json.dumps({"model_name": st.name, "model_version": "1", "outputs": meta}).encode()
        self.reply(200, hdr + b"".join(raw), "application/octet-stream",
                   {"Inference-Header-Content-Length": str(len(hdr))})


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an .onnx file")
    p.add_argument("--name", required=True, help="the model name in the URL")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads per run")
    a = p.parse_args()
    srv = Server(("127.0.0.1", a.port), Handler)
    srv.state = State(a)
    print("ort_kserve_server: %s as '%s' on http://127.0.0.1:%d" % (a.model, a.name, a.port), file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
