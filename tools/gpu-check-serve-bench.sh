#!/usr/bin/env bash
# Dynamic batching's throughput on DEVICE (#18's figure: fashion-cnn at 32 clients, batching
# on against off; tools/gpu-check.sh runs it on the GPU, where one sample leaves the device
# mostly idle). A one-server repository holds the model twice: "on" (max_batch_size 64, the
# dynamic batcher with a 2 ms queue delay) and "off" (max_batch_size 64, no batcher: one
# request per execution). bench/bench_serve.py drives each with CLIENTS closed-loop clients
# (binary FP32 requests of one sample) for SECONDS after a warm-up. Informational: prints
# "serve batching: ..." with requests/s both ways, the ratio and the average batch from
# /metrics; exit 1 only when the server or the load fails.
#   usage: tools/gpu-check-serve-bench.sh FATHOM_BIN MODEL_DIR DEVICE OUT_DIR [CLIENTS] [SECONDS]
set -uo pipefail
bin=${1:?usage: gpu-check-serve-bench.sh FATHOM_BIN MODEL_DIR DEVICE OUT_DIR [CLIENTS] [SECONDS]}
model=${2:?model dir}
dev=${3:?device}
out=${4:?out dir}
clients=${5:-32}
secs=${6:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
rm -rf "$out/brepo"
for m in on off; do
  mkdir -p "$out/brepo/$m/1"
  cp "$model/model.safetensors" "$out/brepo/$m/1/" || { echo "serve batching: FAIL (no model.safetensors in $model)"; exit 1; }
done
echo '{"max_batch_size": 64, "dynamic_batching": {"max_queue_delay_microseconds": 2000}}' >"$out/brepo/on/config.json"
echo '{"max_batch_size": 64}' >"$out/brepo/off/config.json"
"$bin" serve --model-repository "$out/brepo" --port 0 --metrics-port 0 --device "$dev" >/dev/null 2>"$out/bserve.log" &
pid=$!
port="" mport=""
for _ in $(seq 1 300); do
  if line=$(grep -m1 "listening on" "$out/bserve.log" 2>/dev/null); then
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' <<<"$line" | grep -o '[0-9]*$')
    mport=$(grep -o 'metrics: http://127.0.0.1:[0-9]*' <<<"$line" | grep -o '[0-9]*$')
    break
  fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $port || -z $mport ]]; then
  echo "serve batching: FAIL (the server did not start: $(tail -c 300 "$out/bserve.log"))"; kill "$pid" 2>/dev/null; exit 1
fi
# the models load after the server listens: wait until both are ready (60 s at most)
shape=$("$PY" -c "
import http.client, json, sys, time
def get(path):
    c = http.client.HTTPConnection('127.0.0.1', $port, timeout=30); c.request('GET', path)
    r = c.getresponse(); return r.status, r.read()
t0 = time.time()
while time.time() - t0 < 60 and not all(get('/v2/models/%s/ready' % m)[0] == 200 for m in ('on', 'off')):
    time.sleep(0.2)
print(','.join(str(abs(v)) for v in json.loads(get('/v2/models/on')[1])['inputs'][0]['shape'][1:]))")
status=0
for m in on off; do
  if ! timeout $((3 * secs + 60)) "$PY" "$ROOT/bench/bench_serve.py" --port "$port" --metrics-port "$mport" --model "$m" \
       --shape "$shape" --concurrency "$clients" --seconds "$secs" --warmup 2 >"$out/bench-$m.txt" 2>&1; then
    status=1
  fi
done
kill -TERM "$pid"; wait "$pid"
if ((status)); then echo "serve batching: FAIL (the load failed: $(tail -c 300 "$out"/bench-*.txt | tr '\n' ' '))"; exit 1; fi
"$PY" - "$out/bench-on.txt" "$out/bench-off.txt" "$dev" "$clients" <<'PYEOF'
import json, re, sys
def row(p):
    t = open(p).read()
    for line in t.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if isinstance(j, dict) and "req_per_s" in j:
            return j
    sys.exit("serve batching: FAIL (no result in %s: %s)" % (p, t[-300:]))
a, b = row(sys.argv[1]), row(sys.argv[2])
print("serve batching: %s, %s clients: %.0f req/s with the batcher (average batch %s, p50 %s ms) against %.0f without: %.2fx"
      % (sys.argv[3], sys.argv[4], a["req_per_s"], a.get("avg_batch", "?"), a.get("p50_ms", "?"), b["req_per_s"],
         a["req_per_s"] / b["req_per_s"] if b["req_per_s"] else float("inf")))
PYEOF
