"""What the tests/onnx_*_check.py scripts share: their arguments (the fathom binary and a scratch
directory), the report lines and the failure count, `fathom run` on an ONNX file with numpy inputs,
and the exit. A script imports it first: `from onnx_check_lib import D, FATHOM, fathom_run, finish,
report` (the tests/ directory is the script's own, so it is on the path)."""
import os
import subprocess
import sys

import numpy as np

FATHOM, D = sys.argv[1], sys.argv[2]
fails = 0


def report(ok, msg):
    """One "ok: " or "FAIL: " line; failures are counted for finish()."""
    global fails
    print(("ok: " if ok else "FAIL: ") + msg)
    fails += not ok


def fathom_run(path, feeds, tag, device="cpu"):
    """`fathom run path` with each feed saved as TAG_NAME.npy: (outputs by name, None), or (None,
    (exit code, stderr and stdout)). A sanitized build's report in stderr is a failure of its own,
    refusals included."""
    out = os.path.join(D, f"{tag}_{device}_out")
    args = [FATHOM, "run", path, "--output", out, "--device", device]
    for k, v in feeds.items():
        f = os.path.join(D, f"{tag}_{k}.npy")
        np.save(f, v)
        args += ["--input", f"{k}={f}"]
    r = subprocess.run(args, capture_output=True, text=True)
    if "Sanitizer" in r.stderr or "runtime error:" in r.stderr:
        report(False, f"{tag}: sanitizer report: {r.stderr.strip()[:2000]}")
    if r.returncode:
        return None, (r.returncode, (r.stderr + r.stdout).strip())
    return {f[:-4]: np.load(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".npy")}, None


INTEGER_PRODUCTS = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"}


def ort_u8s8_exact():
    """Whether ONNX Runtime's uint8 x int8 integer products are exact on this CPU. On x86 without
    VNNI (AVX-VNNI or AVX512-VNNI) its kernels multiply with vpmaddubsw, whose sums of two
    products saturate at int16 (ONNX Runtime's quantization documentation says so and advises
    reduce_range); measured on an AMD EPYC Zen 3: MatMulInteger, QLinearConv and QLinearMatMul
    off by up to 26 of 255 where ONNX's reference evaluator and fathom agree exactly."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return True
    return "avx512_vnni" in flags or "avx_vnni" in flags


ORT_U8S8_EXACT = ort_u8s8_exact()


def reference_instead_of_ort(path):
    """Whether a test should compare the model at path with ONNX's reference evaluator rather than
    with ONNX Runtime run op by op: it multiplies integers (INTEGER_PRODUCTS; quantize_dynamic's
    MatMulInteger among them) and ONNX Runtime's uint8 x int8 products are not exact here
    (ort_u8s8_exact)."""
    if ORT_U8S8_EXACT:
        return False
    import onnx
    return any(n.op_type in INTEGER_PRODUCTS for n in onnx.load(path).graph.node)


REFERENCE_PEER = "ONNX's reference evaluator (ORT's u8 x s8 products saturate on this CPU)"


def reference_run(path, feeds):
    """The outputs by name of ONNX's own reference evaluator (onnx.reference, numpy) on the model."""
    import onnx
    from onnx import version_converter
    from onnx.reference import ReferenceEvaluator
    m = onnx.load(path)
    # the evaluator implements DequantizeLinear only from opset 19 on: the model converted up (the
    # quantization ops' later versions take the earlier ones' models unchanged)
    if any(o.domain in ("", "ai.onnx") and o.version < 21 for o in m.opset_import):
        m = version_converter.convert_version(m, 21)
    ev = ReferenceEvaluator(m)
    return dict(zip(ev.output_names, ev.run(None, feeds)))


def close_within(got, want, atol, rtol):
    """(ok, what): same dtype and shape, NaN where the reference has NaN, and every other element
    within atol + rtol |want| (equal values, infinities among them, need no tolerance)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_ok = np.array_equal(np.isnan(g), np.isnan(w))
    fin = ~np.isnan(w) & (g != w)
    err = np.abs(g[fin] - w[fin]) - (atol + rtol * np.abs(w[fin])) if fin.any() else np.zeros(1)
    d = float(np.max(np.abs(g[fin] - w[fin]), initial=0))
    return nan_ok and bool(np.all(err <= 0)), f"max |diff| {d:.3g}" + ("" if nan_ok else f"; NaN at {np.argwhere(np.isnan(g)).tolist()[:4]} vs "
                                                                          f"{np.argwhere(np.isnan(w)).tolist()[:4]}")


def report_outputs(tag, names, refs, got, rel=1e-5):
    """One report line per output name: fathom's (got, by name) equal to the reference (refs, in the
    order of names) in shape and dtype and within rel of the reference's largest magnitude."""
    for n, r in zip(names, refs):
        y = got.get(n)
        ok = y is not None and y.shape == r.shape and y.dtype == r.dtype and \
            float(np.max(np.abs(y.astype(np.float64) - r), initial=0)) <= rel * max(1.0, float(np.max(np.abs(r), initial=0)))
        report(ok, f"{tag}: output {n} {r.shape} {r.dtype}" + ("" if ok else f": fathom {None if y is None else (y.shape, y.dtype)} {y}, reference {r}"))


def finish(name):
    """Prints the count and exits: 1 when any check failed."""
    print(f"{name}: {fails} failed")
    sys.exit(1 if fails else 0)
