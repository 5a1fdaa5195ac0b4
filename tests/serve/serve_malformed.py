"""Malformed requests against a running `fathom serve` (tests/serve/serve_test.py):
each must get the stated status with a JSON {"error": ...} naming the problem,
and the server must keep serving. Raw-socket cases cover what http.client cannot
send: truncated bodies, wrong Content-Length, stalls (slowloris)."""
import json, socket, struct, time

GOOD = None


def run(s, raw, status_of, infer_body, sample, ok, bad):
    global GOOD
    GOOD = infer_body(sample(1))
    n = 0

    def case(name, status, body, path="/v2/models/tiny/infer", method="POST", headers=None, needle=None):
        nonlocal n
        n += 1
        st, h, data = s.request(method, path, body, headers)
        try:
            err = json.loads(data).get("error", "") if data else ""
        except ValueError:
            err = None
        if st == status and err and (needle is None or needle in err):
            ok("malformed %d (%s) -> %d: %s" % (n, name, st, err))
        else:
            bad("malformed %d (%s): got %d %r, expected %d%s" % (n, name, st, data[:200], status,
                                                                  " with '%s'" % needle if needle else ""))

    def inp(**kw):
        d = {"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.5] * 64}
        d.update(kw)
        return {"inputs": [{k: v for k, v in d.items() if v is not None}]}
    case("malformed JSON", 400, b'{"inputs": [', needle="malformed JSON")
    case("empty body", 400, b"", needle="empty request body")
    case("body is an array", 400, b"[]", needle="JSON object")
    case("no inputs", 400, {"id": "x"}, needle='"inputs"')
    case("inputs not an array", 400, {"inputs": {}}, needle='"inputs"')
    case("inputs empty", 400, {"inputs": []}, needle='"inputs"')
    case("input not an object", 400, {"inputs": [3]}, needle="object")
    case("input without a name", 400, inp(name=None), needle='"name"')
    case("input without a datatype", 400, inp(datatype=None), needle='"datatype"')
    case("datatype BYTES", 400, inp(datatype="BYTES"), needle="not supported")
    case("unknown datatype", 400, inp(datatype="FLOAT"), needle="not supported")
    case("datatype mismatch", 400, inp(datatype="FP64"), needle="does not match the model's FP32")
    case("no shape", 400, inp(shape=None), needle='"shape"')
    case("negative shape", 400, inp(shape=[-1, 1, 8, 8]), needle="must be >= 0")
    case("huge dims", 400, inp(shape=[1 << 40, 1 << 40, 8, 8]), needle="2^31")
    case("shape of the wrong rank", 400, inp(shape=[1, 64]), needle="does not match")
    case("wrong spatial size", 400, inp(shape=[1, 1, 8, 9], data=[0.5] * 72), needle="does not match")
    case("batch 0", 400, inp(shape=[0, 1, 8, 8], data=[]), needle="batch size 0")
    case("batch over max_batch_size", 400, inp(shape=[17, 1, 8, 8], data=[0.5] * 64 * 17), needle="max_batch_size")
    case("data too short", 400, inp(data=[0.5] * 63), needle="has 63 elements")
    case("data too long", 400, inp(data=[0.5] * 65), needle="more than")
    case("a string in data", 400, inp(data=["x"] * 64), needle="not a number")
    case("data not an array", 400, inp(data=5), needle='"data"')
    case("unknown input", 400, inp(name="pixels"), needle="unknown input 'pixels'")
    case("input given twice", 400, {"inputs": GOOD["inputs"] * 2}, needle="twice")
    case("unknown output", 400, dict(GOOD, outputs=[{"name": "probs"}]), needle="unknown output 'probs'")
    case("id not a string", 400, dict(GOOD, id=5), needle='"id"')
    case("invalid UTF-8", 400, b'{"id": "\xff\xfe", "inputs": []}', needle="malformed JSON")
    case("duplicate keys", 400, b'{"inputs": [], "inputs": []}', needle="malformed JSON")
    case("NaN literal", 400, json.dumps(GOOD).replace("0.5", "NaN", 1).encode(), needle="malformed JSON")
    case("nested too deep", 400, inp(data=[[[[[[[[[[0.5]]]]]]]]]] * 64), needle="nested deeper")
    case("negative timeout", 400, dict(GOOD, parameters={"timeout": -1}), needle="timeout")
    hdr = json.dumps(inp(data=None, parameters={"binary_data_size": 256})).encode()
    case("binary data shorter than declared", 400, hdr + b"\0" * 100,
         headers={"Inference-Header-Content-Length": str(len(hdr))}, needle="only 100 bytes")
    case("binary header length past the body", 400, hdr, headers={"Inference-Header-Content-Length": "999999"},
         needle="Inference-Header-Content-Length")
    case("binary header length not a number", 400, hdr, headers={"Inference-Header-Content-Length": "12abc"},
         needle="not a byte count")
    hdr2 = json.dumps(inp(data=None, parameters={"binary_data_size": 128})).encode()
    case("binary size does not fit the shape", 400, hdr2 + b"\0" * 128,
         headers={"Inference-Header-Content-Length": str(len(hdr2))}, needle="need 256")
    case("binary bytes nobody claims", 400, hdr + b"\0" * 300,
         headers={"Inference-Header-Content-Length": str(len(hdr))}, needle="no input claims")
    case("data and binary_data_size both", 400, inp(parameters={"binary_data_size": 256}), needle="both")
    case("compressed body", 400, GOOD, headers={"Content-Encoding": "gzip"}, needle="Content-Encoding")
    case("GET on infer", 405, None, method="GET", needle="POST")
    case("unknown endpoint", 404, None, path="/v2/nothing", method="GET")
    case("unknown action", 404, None, path="/v2/models/tiny/explode", method="GET")
    case("path escape in the model name", 400, GOOD, path="/v2/models/..%2f..%2fetc/infer", needle="invalid model name")
    case("dot model name", 400, GOOD, path="/v2/models/.hidden/infer", needle="invalid model name")
    case("version not a number", 400, GOOD, path="/v2/models/tiny/versions/abc/infer", needle="invalid model version")
    case("version 0", 400, GOOD, path="/v2/models/tiny/versions/0/infer", needle="invalid model version")
    case("outside /v2", 404, None, path="/etc/passwd", method="GET")

    # ---- raw sockets ----
    good = json.dumps(GOOD).encode()
    req = b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    r = raw(s.port, req + b"Content-Length: 5\r\n\r\n" + good, timeout=5)
    st = status_of(r)
    (ok if st == 400 and b"malformed JSON" in r else bad)("raw: Content-Length shorter than the body -> %d" % st)
    t0 = time.time()
    r = raw(s.port, req + b"Content-Length: 100000\r\n\r\n" + good, timeout=10, close_write=True)
    (ok if status_of(r) in (0, 400) else bad)("raw: body truncated (Content-Length past the data, client closes) -> "
                                               "%d after %.1f s" % (status_of(r), time.time() - t0))
    r = raw(s.port, req + b"Content-Length: abc\r\n\r\n" + good, timeout=5)
    (ok if status_of(r) == 400 else bad)("raw: Content-Length not a number -> %d" % status_of(r))
    r = raw(s.port, req + b"Content-Length: 10\r\nContent-Length: 20\r\n\r\n" + good, timeout=5)
    (ok if status_of(r) in (400, 0) or b"malformed" in r else bad)("raw: two Content-Length headers -> %d" % status_of(r))
    r = raw(s.port, b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n", timeout=5)
    (ok if status_of(r) in (400, 413, 431) or r == b"" else bad)("raw: 100 kB header line -> %d" % status_of(r))
    r = raw(s.port, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\0" * 40, timeout=5)
    (ok if status_of(r) in (0, 400) else bad)("raw: TLS hello on the plain port -> %d" % status_of(r))
    # slowloris: a client that stalls mid-headers and one that stalls mid-body are
    # cut off after --connection-timeout (2 s) while other clients are served
    stalls = []
    for part in (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Le",
                 req + b"Content-Length: 1000\r\n\r\n" + good[:20]):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        c.sendall(part)
        stalls.append(c)
    t0 = time.time()
    st, _, _ = s.request("GET", "/v2/health/live")
    (ok if st == 200 and time.time() - t0 < 1 else bad)("served while two slowloris clients stall")
    for c in stalls:
        t0 = time.time()
        try:
            got = c.recv(100)
        except OSError:
            got = b""
        dt = time.time() - t0
        c.close()
        (ok if dt < 8 and not got.startswith(b"HTTP/1.1 200") else bad)(
            "stalled connection closed by the server after %.1f s (%r)" % (dt, got[:40]))
    st, _, _ = s.request("GET", "/v2/health/live")
    (ok if st == 200 else bad)("server alive after %d malformed requests" % n)
    st, _, data = s.request("POST", "/v2/models/tiny/infer", GOOD)
    (ok if st == 200 else bad)("and still infers")
