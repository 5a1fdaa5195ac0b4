#!/usr/bin/env python3
"""fathom's ONNX export checked by ONNX itself: for every case of Debian's
libonnx-testdata suites that `fathom import` turns into a graph, `fathom export`
writes it back to ONNX; onnx.checker (full_check) must accept the file, ONNX
Runtime must run it, and its outputs must match `fathom run` on the exported file
within 1e-5 relative (and ONNX's expected outputs within the backend tolerance).
Prints the counts; exit 1 on any failure, 77 when onnx/onnxruntime are missing.

  onnx_export_check.py FATHOM_BIN [SUITE_DIR ...]"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
except ImportError as e:
    print(f"SKIP: {e} (pip install onnx==1.22.0 onnxruntime numpy)")
    sys.exit(77)


def load_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    if t.data_type == onnx.TensorProto.UINT16:  # ONNX 1.12's test data stores bfloat16 as uint16
        return None
    return t.name, numpy_helper.to_array(t)


def close(a, b, rtol, atol):
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    return np.array_equal(a, b)


def check_case(fathom, case, tmp):
    """'ok', 'skip' (no graph form) or a failure message."""
    g, m, out = os.path.join(tmp, "g"), os.path.join(tmp, "m.onnx"), os.path.join(tmp, "out")
    for p in (g, out):
        subprocess.run(["rm", "-rf", p], check=True)
    if subprocess.run([fathom, "import", os.path.join(case, "model.onnx"), "-o", g], capture_output=True).returncode:
        return "skip"
    r = subprocess.run([fathom, "export", g, "-o", m], capture_output=True, text=True)
    if r.returncode:
        return "export failed: " + r.stderr.strip()
    try:
        onnx.checker.check_model(onnx.load(m), full_check=True)
    except Exception as e:  # the checker's own exception types vary by version
        return f"onnx.checker: {e}"
    data = os.path.join(case, "test_data_set_0")
    feeds, args = {}, []
    sess = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    if any(o.type == "tensor(bfloat16)" for o in sess.get_outputs()):
        return "skip"  # .npy has no bfloat16: fathom run --output cannot write it
    for k in range(len(names)):
        got = load_pb(os.path.join(data, f"input_{k}.pb"))
        if got is None:
            return "skip"
        feeds[names[k]] = got[1]
        args += ["--input", f"{names[k]}={os.path.join(data, f'input_{k}.pb')}"]
    r = subprocess.run([fathom, "run", m, *args, "--output", out], capture_output=True, text=True)
    if r.returncode:
        return "fathom run: " + r.stderr.strip()
    res = sess.run(None, feeds)
    for k, o in enumerate(sess.get_outputs()):
        mine = np.load(os.path.join(out, "".join(c if c.isalnum() or c in "._-" else "_" for c in o.name) + ".npy"))
        want = load_pb(os.path.join(data, f"output_{k}.pb"))
        if not close(res[k], mine, 1e-5, 1e-6):
            return f"output {o.name}: onnxruntime and fathom differ (max |diff| {np.max(np.abs(res[k] - mine)):.3g})"
        if want is not None and not close(res[k], want[1], 1e-3, 1e-7):
            return f"output {o.name}: onnxruntime differs from ONNX's expected output"
    return "ok"


def main():
    fathom = sys.argv[1]
    suites = sys.argv[2:] or [f"/usr/share/libonnx-testdata/data/{s}" for s in ("node", "pytorch-converted", "pytorch-operator")]
    if not os.path.isdir(suites[0]):
        print(f"SKIP: {suites[0]} missing (apt-get install libonnx-testdata)")
        return 77
    counts, fails = {"ok": 0, "skip": 0}, []
    with tempfile.TemporaryDirectory() as tmp:
        for suite in suites:
            for name in sorted(os.listdir(suite)):
                res = check_case(fathom, os.path.join(suite, name), tmp)
                if res in counts:
                    counts[res] += 1
                else:
                    fails.append(f"{name}: {res}")
    for f in fails:
        print("FAIL", f)
    print(f"onnx export: {counts['ok']} models exported, accepted by onnx.checker (onnx {onnx.__version__}) and run by "
          f"onnxruntime {ort.__version__} with fathom's outputs within 1e-5; {len(fails)} failed; "
          f"{counts['skip']} cases have no graph form (or a bfloat16 output .npy cannot hold)")
    return 1 if fails or counts["ok"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
