#!/usr/bin/env bash
# Serving on DEVICE (tools/gpu-check.sh; docs/SERVING.md): a model written by `fathom train`
# is laid out as a one-model repository and served twice, `fathom serve --device cpu` and
# `--device DEVICE`; the same JSON request (8 samples of the model's input shape, values in
# [0, 1), ids below the vocabulary for an id input) goes to both, and the logits must agree
# within SERVE_TOL relative to the largest (default 1e-4; on check 0: the CPU's bits). The
# DEVICE server's /metrics must show memory in use on that device.
#   usage: tools/gpu-check-serve.sh FATHOM_BIN MODEL_DIR DEVICE OUT_DIR
# Last line: "serve smoke: pass ..." or a FAIL.
set -uo pipefail
bin=${1:?usage: gpu-check-serve.sh FATHOM_BIN MODEL_DIR DEVICE OUT_DIR}
model=${2:?model dir}
dev=${3:?device}
out=${4:?out dir}
tol=${SERVE_TOL:-1e-4}
[[ $dev == check* ]] && tol=0
rm -rf "$out/repo"
mkdir -p "$out/repo/m/1"
if ! cp "$model/model.safetensors" "$out/repo/m/1/"; then echo "serve smoke: FAIL (no model.safetensors in $model)"; exit 1; fi
exec "${PYTHON:-python3}" - "$bin" "$out" "$dev" "$tol" <<'PY'
import http.client, json, os, random, signal, subprocess, sys, time
bin_, out, dev, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

def start(d):
    log = os.path.join(out, "serve-%s.log" % d.replace(":", "_"))
    p = subprocess.Popen([bin_, "serve", "--model-repository", os.path.join(out, "repo"), "--port", "0",
                          "--metrics-port", "0", "--device", d], stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    t0 = time.time()
    while time.time() - t0 < 60 and p.poll() is None:
        text = open(log).read()
        if "listening on" in text:
            line = text.split("listening on", 1)[1].split("\n")[0]
            port = int(line.split("http://127.0.0.1:")[1].split()[0])
            mport = int(line.split("metrics: http://127.0.0.1:")[1].split("/")[0]) if "metrics:" in line else None
            return p, port, mport
        time.sleep(0.1)
    p.kill()
    sys.exit("serve smoke: FAIL (the %s server did not start: %s)" % (d, open(log).read()[-400:]))

def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=json.dumps(body).encode() if body is not None else None)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data

results, t0 = {}, time.time()
for d in ("cpu", dev):
    p, port, mport = start(d)
    try:
        t1 = time.time()  # the model loads after the server listens
        while time.time() - t1 < 60 and req(port, "GET", "/v2/models/m/ready")[0] != 200:
            time.sleep(0.2)
        st, meta = req(port, "GET", "/v2/models/m")
        if st != 200:
            sys.exit("serve smoke: FAIL (%s: model metadata HTTP %d: %s)" % (d, st, meta[:300]))
        i0 = json.loads(meta)["inputs"][0]
        shape = [8] + [abs(v) for v in i0["shape"][1:]]
        n = 1
        for v in shape: n *= v
        r = random.Random(7)
        data = [r.randrange(0, 4) for _ in range(n)] if i0["datatype"].startswith("INT") else [r.random() for _ in range(n)]
        body = {"inputs": [{"name": i0["name"], "datatype": i0["datatype"], "shape": shape, "data": data}]}
        st, resp = req(port, "POST", "/v2/models/m/infer", body)
        if st != 200:
            sys.exit("serve smoke: FAIL (%s: infer HTTP %d: %s)" % (d, st, resp[:300]))
        results[d] = json.loads(resp)["outputs"][0]["data"]
        if d == dev and mport:
            st, m = req(mport, "GET", "/metrics")
            key = 'fathom_memory_used_bytes{device="%s' % dev.split(":")[0]
            if not any(l.startswith(key) and float(l.rsplit(" ", 1)[1]) > 0 for l in m.decode().splitlines()):
                sys.exit("serve smoke: FAIL (%s: /metrics shows no memory in use on the device)" % d)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill(); rc = -9
        if rc != 0:
            sys.exit("serve smoke: FAIL (the %s server exited %s on SIGTERM)" % (d, rc))
a, b = results["cpu"], results[dev]
scale = max(abs(v) for v in a) or 1.0
worst = max(abs(x - y) for x, y in zip(a, b)) / scale if len(a) == len(b) and a else float("inf")
if not worst <= tol:
    sys.exit("serve smoke: FAIL (%d logits: largest difference %.3g of the largest logit, bound %g)" % (len(a), worst, tol))
print("serve smoke: pass (%d logits on %s within %.3g of the cpu server's, bound %g; %.0f s)" % (len(a), dev, worst, tol, time.time() - t0))
PY
