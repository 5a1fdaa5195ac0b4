#!/usr/bin/env python3
"""Text-generation load test for `fathom serve` (docs/SERVING.md has the figures):
the same R requests (streamed /v1/completions, max_tokens each) sent by C
concurrent clients, then one at a time; reports generated tokens/s for both, the
ratio, client-side time to first token, and from /metrics the server's sequences
per decode step, its wall time per step (step_wall_us) and the part of it inside
the model (step_model_us: fm_gpt_paged_step_n). --lean-client reads each stream
as raw bytes (one recv per wake-up) and parses it once at the end, so that on a
machine shared with the server the client takes less CPU per token. Loopback
only; bounded (C <= 64, R <= 256).

  python3 bench/bench_serve_text.py --port 8000 --metrics-port 8002 --model kjv \
      --clients 8 --requests 16 --max-tokens 64"""
import argparse, http.client, json, socket, sys, threading, time

PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "And it came to pass",
           "Blessed are the", "For God so loved", "And the earth was", "Thus saith the LORD"]


def one(port, model, prompt, max_tokens, seed, stream=True):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                      "seed": seed, "temperature": 0.8, "stream": stream}))
    r = c.getresponse()
    ttft, tokens = None, 0
    if not stream:
        d = json.loads(r.read())
        c.close()
        return d["usage"]["completion_tokens"], None, time.perf_counter() - t0
    while True:
        line = r.fp.readline()
        if not line or line.strip() == b"data: [DONE]":
            break
        if line.startswith(b"data: "):
            d = json.loads(line[6:])
            if ttft is None:
                ttft = time.perf_counter() - t0
            if "usage" in d:
                tokens = d["usage"]["completion_tokens"]
    c.close()
    return tokens, ttft, time.perf_counter() - t0


def one_lean(port, model, prompt, max_tokens, seed):
    """A streamed request read as raw bytes: one recv per wake-up (events that arrived together are
    read together), the events parsed once at the end. About the least a client can spend per token,
    so that on a machine shared with the server the client takes little CPU from it."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                       "temperature": 0.8, "stream": True}).encode()
    sk = socket.create_connection(("127.0.0.1", port), timeout=600)
    t0 = time.perf_counter()
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    parts, ttft = [], None
    while True:
        b = sk.recv(1 << 16)
        if not b:
            break
        if ttft is None and b"data: " in b:
            ttft = time.perf_counter() - t0
        parts.append(b)
    sk.close()
    el = time.perf_counter() - t0
    raw = b"".join(parts)
    head, _, rest = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError("request failed: %r" % raw[:300])
    data = bytearray()
    while rest:  # chunked transfer coding
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        data += rest[:n]
        rest = rest[n + 2:]
    tokens = 0
    for line in reversed(bytes(data).split(b"\n")):
        if line.startswith(b"data: {") and b'"completion_tokens"' in line:
            tokens = json.loads(line[6:])["usage"]["completion_tokens"]
            break
    return tokens, ttft, el


def metrics(port, model):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    lab = '{model="%s",version="1"}' % model
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if lab in line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k.replace(lab, "")] = float(v)
    return out


def run(a, clients):
    jobs = list(range(a.requests))
    lock = threading.Lock()
    res = []

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                k = jobs.pop(0)
            prompt = " ".join([PROMPTS[k % len(PROMPTS)]] * a.prompt_repeat)
            if a.lean_client:
                res.append(one_lean(a.port, a.model, prompt, a.max_tokens, k))
            else:
                res.append(one(a.port, a.model, prompt, a.max_tokens, k, not a.no_stream))
    m0 = metrics(a.metrics_port, a.model)
    t0 = time.perf_counter()
    th = [threading.Thread(target=worker) for _ in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    el = time.perf_counter() - t0
    m1 = metrics(a.metrics_port, a.model)
    toks = sum(r[0] for r in res)
    ttfts = sorted(r[1] for r in res if r[1] is not None)
    steps = m1["fathom_generation_step_count"] - m0["fathom_generation_step_count"]
    seqs = m1["fathom_generation_step_sequences"] - m0["fathom_generation_step_sequences"]
    tt = m1["fathom_time_to_first_token_us_sum"] - m0.get("fathom_time_to_first_token_us_sum", 0)
    tn = m1["fathom_time_to_first_token_us_count"] - m0.get("fathom_time_to_first_token_us_count", 0)
    ci = m1["fathom_inference_compute_infer_duration_us"] - m0.get("fathom_inference_compute_infer_duration_us", 0)
    out = {"clients": clients, "requests": len(res), "tokens": int(toks), "seconds": round(el, 2),
           "tokens_per_s": round(toks / el, 1), "server_ttft_mean_ms": round(tt / tn / 1000, 1) if tn else None,
           "seqs_per_step": round(seqs / steps, 2) if steps else None,
           # wall time per decode step, and the part of it inside the model (fm_gpt_paged_step_n)
           "step_wall_us": round(el / steps * 1e6, 1) if steps else None,
           "step_model_us": round(ci / steps, 1) if steps else None}
    if ttfts:
        out.update(ttft_p50_ms=round(1000 * ttfts[len(ttfts) // 2], 1), ttft_max_ms=round(1000 * ttfts[-1], 1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--no-stream", action="store_true", help="whole responses (the client does less work per token)")
    p.add_argument("--prompt-repeat", type=int, default=1, help="each prompt repeated this many times (long prompts: prefill)")
    p.add_argument("--concurrent-only", action="store_true", help="skip the one-at-a-time run (and the ratio)")
    p.add_argument("--lean-client", action="store_true",
                   help="streamed, read as raw bytes and parsed once at the end (less client CPU per token)")
    a = p.parse_args()
    if a.lean_client and a.no_stream:
        sys.exit("bench_serve_text: --lean-client reads streams; drop --no-stream")
    if not 1 <= a.clients <= 64 or not 1 <= a.requests <= 256:
        sys.exit("bench_serve_text: keep --clients in [1, 64] and --requests in [1, 256]")
    conc = run(a, a.clients)
    print(json.dumps(conc), flush=True)
    if a.concurrent_only:
        return
    seq = run(a, 1)
    print(json.dumps(seq), flush=True)
    print(json.dumps({"speedup": round(conc["tokens_per_s"] / seq["tokens_per_s"], 2)}))


if __name__ == "__main__":
    main()
