#!/usr/bin/env python3
"""Load test for `fathom serve` (docs/SERVING.md has the figures): closed-loop
clients on loopback, each with one keep-alive connection, sending KServe v2
requests (binary FP32 input and output, as tritonclient sends by default) for a
fixed time. Reports requests/s, client-side p50/p99 latency, errors, and from the
server's /metrics the average batch (inference_count / exec_count) and RSS.

  python3 bench/bench_serve.py --port 8000 --metrics-port 8002 --model fashion-cnn \
      --shape 1,28,28 --concurrency 1,8,32,64 --seconds 10

Load only goes to 127.0.0.1; the number of clients and the time are bounded
(--concurrency <= 256, --seconds <= 120)."""
import argparse, http.client, json, random, struct, sys, threading, time


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    c.close()
    return out


def body_for(shape, batch, seed, output="logits"):
    r = random.Random(seed)
    n = batch
    for d in shape:
        n *= d
    hdr = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [batch, *shape],
                                  "parameters": {"binary_data_size": 4 * n}}],
                      "outputs": [{"name": output, "parameters": {"binary_data": True}}]}).encode()
    return hdr + struct.pack("<%df" % n, *[r.random() for _ in range(n)]), len(hdr)


def client(port, path, body, hlen, stop, lat, errs):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    hdrs = {"Inference-Header-Content-Length": str(hlen), "Content-Type": "application/octet-stream"}
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers=hdrs)
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        dt = time.perf_counter() - t0
        if ok:
            lat.append(dt)
        else:
            errs.append(dt)
    conn.close()


def run(a, conc):
    path = "/v2/models/%s/infer" % a.model
    body, hlen = body_for(a.shape, a.batch, 1, a.output)
    lab = '{model="%s",version="%s"}' % (a.model, a.version)
    m0 = metrics(a.metrics_port)
    stop, lat, errs = threading.Event(), [], []
    th = [threading.Thread(target=client, args=(a.port, path, body, hlen, stop, lat, errs)) for _ in range(conc)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    time.sleep(a.seconds)
    stop.set()
    for t in th:
        t.join()
    el = time.perf_counter() - t0
    m1 = metrics(a.metrics_port)
    n = m1["fathom_inference_count" + lab] - m0.get("fathom_inference_count" + lab, 0)
    e = m1["fathom_inference_exec_count" + lab] - m0.get("fathom_inference_exec_count" + lab, 0)
    lat.sort()
    q = lambda p: 1000 * lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")
    return {"model": a.model, "concurrency": conc, "seconds": round(el, 2), "requests": len(lat), "errors": len(errs),
            "req_per_s": round(len(lat) / el, 1), "samples_per_s": round(len(lat) * a.batch / el, 1),
            "p50_ms": round(q(0.50), 2), "p99_ms": round(q(0.99), 2), "avg_batch": round(n / e, 2) if e else None,
            "rss_mb": round(m1.get("fathom_process_resident_memory_bytes", 0) / 2**20, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--version", default="1")
    p.add_argument("--shape", default="1,28,28", help="one sample's shape")
    p.add_argument("--batch", type=int, default=1, help="samples per request")
    p.add_argument("--output", default="logits", help="the output to ask for (binary)")
    p.add_argument("--concurrency", default="32", help="comma-separated client counts")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--warmup", type=float, default=2, help="seconds of load before the first measurement")
    a = p.parse_args()
    a.shape = [int(x) for x in a.shape.split(",")]
    concs = [int(x) for x in a.concurrency.split(",")]
    if max(concs) > 256 or a.seconds > 120 or min(concs) < 1:
        sys.exit("bench_serve: keep --concurrency in [1, 256] and --seconds <= 120")
    if a.warmup > 0:
        w = argparse.Namespace(**vars(a))
        w.seconds = a.warmup
        run(w, concs[0])
    for c in concs:
        print(json.dumps(run(a, c)), flush=True)


if __name__ == "__main__":
    main()
