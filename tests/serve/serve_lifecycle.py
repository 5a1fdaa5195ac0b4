"""`fathom serve` across time (tests/serve/serve_test.py): hot reload in poll mode
(new versions and models appear, removed ones drain), version policies, explicit
control with an API key, the body-size limit, and draining on SIGTERM."""
import json, os, shutil, signal, threading, time


def wait_for(fn, secs=8.0):
    t0 = time.time()
    while time.time() - t0 < secs:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    return None


def load_override_checks(s, key, infer_body, sample, check):
    """Triton's load with the configuration in the request (tritonclient's load_model(name, config=...)):
    it replaces the folder's config for that load; a plain load reads the folder again."""
    def load(params):
        return s.json("POST", "/v2/repository/models/m/load", {"parameters": params}, headers=key)
    st, j = load({"config": json.dumps({"max_batch_size": 2, "dynamic_batching": {"max_queue_delay_microseconds": 100}})})
    check(st == 200, "load with a config in the request -> 200: %s" % j)
    st, j = s.json("GET", "/v2/models/m/config")
    check(st == 200 and j["max_batch_size"] == 2 and j.get("dynamic_batching", {}).get("max_queue_delay_microseconds") == 100,
          "the request's config is the one in use: %s" % j)
    st, j = s.json("POST", "/v2/models/m/infer", infer_body(sample(3)))
    check(st == 400 and "max_batch_size = 2" in j.get("error", ""), "its max_batch_size 2 holds: %s %s" % (st, j))
    for params, want in [({"config": "{not json"}, "is not JSON"),
                         ({"config": json.dumps({"max_batch_size": "lots"})}, "the load request's config: 'max_batch_size'"),
                         ({"config": json.dumps({"name": "other"})}, "'other' but the model's directory is 'm'"),
                         ({"config": 5}, "must be a string"),
                         ({"file:1/model.safetensors": "AAAA", "config": "{}"}, "model files in a load request")]:
        st, j = load(params)
        check(st == 400 and want in j.get("error", ""), "a bad load request (%s) -> 400 naming it: %s %s" % (want, st, j))
    st, j = s.json("GET", "/v2/models/m/config")
    check(st == 200 and j["max_batch_size"] == 2, "a refused load leaves the loaded config: %s" % j.get("max_batch_size"))
    st, j = s.json("POST", "/v2/repository/models/m/load", headers=key)
    st2, j2 = s.json("GET", "/v2/models/m/config")
    check(st == 200 and st2 == 200 and j2["max_batch_size"] == 32 and "dynamic_batching" not in j2,
          "a plain load reads the folder's config again (none: the defaults): %s" % j2)
    try:
        import tritonclient.http as th
    except ImportError:
        return
    c = th.InferenceServerClient("127.0.0.1:%d" % s.port)
    c.load_model("m", headers=key, config=json.dumps({"max_batch_size": 5}))
    check(c.get_model_config("m")["max_batch_size"] == 5, "tritonclient's load_model(config=...) is honoured")
    c.load_model("m", headers=key)
    c.close()


def run(Server, make_repo, infer_body, sample, ok, bad, check):
    body = infer_body(sample(1))
    # ---- poll mode: hot reload ----
    repo = make_repo("hot", {"hot": ([1], {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_microseconds": 600000}}),
                             "multi": ([1, 2, 3], {"version_policy": {"all": {}}}),
                             "pick": ([1, 2, 3], {"version_policy": {"specific": {"versions": [1, 3]}}})})
    s = Server(repo, "--poll-secs", "1")
    try:
        st, j = s.json("GET", "/v2/models/multi")
        check(st == 200 and j["versions"] == ["3", "2", "1"], "version policy all: %s" % j.get("versions"))
        st, j = s.json("GET", "/v2/models/pick")
        check(st == 200 and j["versions"] == ["3", "1"], "version policy specific [1, 3]: %s" % j.get("versions"))
        st, _ = s.json("POST", "/v2/models/pick/versions/2/infer", body)
        check(st == 404, "a version outside the policy -> 404")
        st, j = s.json("POST", "/v2/models/multi/versions/2/infer", body)
        check(st == 200 and j["model_version"] == "2", "infer on a chosen version")
        shutil.copytree(os.path.join(repo, "hot", "1"), os.path.join(repo, "hot", "2"))
        got = wait_for(lambda: s.json("GET", "/v2/models/hot")[1].get("versions") == ["2"])
        check(got, "poll: version 2 appears without a restart (latest 1 retires version 1)")
        # a request in flight on version 2 while its folder is removed still completes
        res = {}
        t = threading.Thread(target=lambda: res.update(r=s.json("POST", "/v2/models/hot/infer", body)))
        t.start()
        time.sleep(0.2)
        shutil.rmtree(os.path.join(repo, "hot", "2"))
        got = wait_for(lambda: s.json("GET", "/v2/models/hot")[1].get("versions") == ["1"])
        t.join()
        check(got and res["r"][0] == 200 and res["r"][1]["model_version"] == "2",
              "poll: removed version 2 drains (its in-flight request answered %s) and version 1 serves again" % (res["r"][0],))
        shutil.copytree(os.path.join(repo, "hot"), os.path.join(repo, "fresh"))
        got = wait_for(lambda: s.json("POST", "/v2/models/fresh/infer", body)[0] == 200)
        check(got, "poll: a new model folder is served without a restart")
        shutil.rmtree(os.path.join(repo, "fresh"))
        got = wait_for(lambda: s.json("GET", "/v2/models/fresh")[0] == 404)
        check(got, "poll: a removed model folder is unloaded")
        # a version that fails to load is not loaded again at every poll while its files are unchanged,
        # but is as soon as they change
        os.makedirs(os.path.join(repo, "late", "1"))
        open(os.path.join(repo, "late", "1", "model.safetensors"), "wb").write(b"not a safetensors file")
        got = wait_for(lambda: any(m.get("name") == "late" and m.get("state") == "UNAVAILABLE"
                                   for m in s.json("POST", "/v2/repository/index")[1]))
        check(got, "poll: a broken version is listed UNAVAILABLE")
        time.sleep(1.5)  # at least one more poll over the unchanged folder
        shutil.copy(os.path.join(repo, "hot", "1", "model.safetensors"), os.path.join(repo, "late", "1", "model.safetensors"))
        got = wait_for(lambda: s.json("POST", "/v2/models/late/infer", body)[0] == 200)
        check(got, "poll: the broken version is loaded once its file is replaced")
        st, j = s.json("POST", "/v2/repository/models/hot/unload")
        check(st == 400 and "explicit" in j["error"], "poll mode refuses unload through the API")
    finally:
        check(s.stop() == 0, "poll server stops with 0")

    # ---- explicit control + API key ----
    repo = make_repo("explicit", {"m": ([1], None), "broken": ([1], None)})
    open(os.path.join(repo, "broken", "config.json"), "w").write('{"max_batch_size": "lots"}')
    s = Server(repo, "--model-control", "explicit", "--api-key", "s3cret")
    key = {"Authorization": "Bearer s3cret"}
    try:
        st, _ = s.json("POST", "/v2/models/m/infer", body)
        check(st == 404, "explicit: nothing loaded at start")
        st, j = s.json("POST", "/v2/repository/models/m/load")
        check(st == 401 and "API key" in j["error"], "load without the key -> 401")
        st, j = s.json("POST", "/v2/repository/models/m/load", headers={"Authorization": "Bearer wrong"})
        check(st == 401, "load with a wrong key -> 401")
        st, j = s.json("POST", "/v2/repository/index", headers={"X-API-Key": "s3cre"})
        check(st == 401, "index with a key prefix -> 401")
        st, j = s.json("POST", "/v2/repository/models/m/load", headers=key)
        check(st == 200, "load with the key -> 200")
        # /v1 (OpenAI's endpoints) needs the key too, as vLLM's --api-key does
        st, j = s.json("GET", "/v1/models")
        e = j.get("error") if isinstance(j, dict) else None
        check(st == 401 and isinstance(e, dict) and e.get("type") == "authentication_error" and "API key" in e.get("message", ""),
              "/v1 without the key -> 401 in OpenAI's error shape: %s" % j)
        st, j = s.json("POST", "/v1/completions", {"model": "m", "prompt": "x"}, headers={"Authorization": "Bearer wrong"})
        check(st == 401, "/v1 with a wrong key -> 401")
        st, j = s.json("GET", "/v1/models", headers=key)
        check(st == 200 and j.get("object") == "list", "/v1 with the key -> 200")
        st, j = s.json("POST", "/v2/models/m/infer", body)
        check(st == 200, "explicit: infer after load")
        load_override_checks(s, key, infer_body, sample, check)
        st, j = s.json("POST", "/v2/repository/models/broken/load", headers=key)
        check(st == 400 and "config.json" in j["error"] and "max_batch_size" in j["error"],
              "a bad config.json -> 400 naming the file and field: %s" % j)
        st, j = s.json("POST", "/v2/repository/models/ghost/load", headers=key)
        check(st == 404 and "not in the repository" in j["error"], "load of a missing model -> 404")
        st, j = s.json("POST", "/v2/repository/index", headers=key)
        states = {(m["name"], m["state"]) for m in j}
        check(("m", "READY") in states and ("broken", "UNAVAILABLE") in states, "index lists states: %s" % j)
        st, j = s.json("POST", "/v2/repository/models/m/unload", headers=key)
        check(st == 200, "unload with the key -> 200")
        st, _ = s.json("POST", "/v2/models/m/infer", body)
        check(st == 404, "explicit: infer after unload -> 404")
    finally:
        check(s.stop() == 0, "explicit server stops with 0")

    # ---- body limit ----
    s = Server(repo, "--model-control", "explicit", "--load-model", "m", "--max-body-mb", "1")
    try:
        # the server answers from the headers alone, before any of the body is sent
        import socket
        k = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        k.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2400000\r\n\r\n")
        got = k.recv(4096)
        k.close()
        check(got.startswith(b"HTTP/1.1 413") and b"over the limit" in got,
              "Content-Length 2.4 MB with a 1 MiB limit -> 413 before the body is read: %r" % got[:60])

        def chunks():
            for _ in range(40):
                yield b"x" * 65536
        st, h, data = s.request("POST", "/v2/models/m/infer", chunks(), {"Transfer-Encoding": "chunked"}, chunked=True)
        check(st == 413, "a chunked 2.6 MB body -> 413")
        st, _ = s.json("POST", "/v2/models/m/infer", body)
        check(st == 200, "small requests still served")
    finally:
        check(s.stop() == 0, "limited server stops with 0")

    # ---- SIGTERM drains ----
    repo = make_repo("drain", {"d": ([1], {"dynamic_batching": {"max_queue_delay_microseconds": 1000000}})})
    s = Server(repo)
    res = {}
    t = threading.Thread(target=lambda: res.update(a=s.json("POST", "/v2/models/d/infer", body)))
    t.start()
    time.sleep(0.3)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    try:
        st, j = s.json("POST", "/v2/models/d/infer", body)
    except OSError as e:
        st, j = 0, str(e)
    t.join()
    rc = s.proc.wait(30)
    check(st == 503 and "shutting down" in j["error"], "during the drain a new request gets 503")
    check(res["a"][0] == 200, "the in-flight request completes (200)")
    check(rc == 0, "then the server exits 0 (%.1f s after SIGTERM)" % (time.time() - t0))
