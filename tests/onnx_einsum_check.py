"""Einsum models run by `fathom run` (the interpreter), imported and compiled (the graph
form, `fathom compile` then `fathom run DIR`), against numpy.einsum and ONNX Runtime.

Equations: matmuls with batch labels, attention's "bhid,bhjd->bhij", a diagonal, a trace,
sums, transposes, an outer product, three operands (a bilinear form), the ellipsis with
size-1 broadcasting, upper-case labels and the implicit output. One model has a dynamic
batch label (run at two batch sizes through the same compiled graph). Tolerance: 1e-5
relative to the largest magnitude of the reference (float32 sums in another order); the
graph form must give the interpreter's values within the same. Refusals: an equation that
names more dims than the operand has, and a label with two sizes, exit 1 naming the node.

  onnx_einsum_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy or onnx is missing (ONNX Runtime is optional)."""
import os
import subprocess
import sys

try:
    import numpy as np
    from onnx import TensorProto as T, helper, save
except ImportError as e:
    print(f"SKIP: needs numpy and onnx ({e.name} missing)")
    sys.exit(77)
try:
    import onnxruntime as ort
except ImportError:
    ort = None

FATHOM, D = sys.argv[1], sys.argv[2]
fails = 0
CASES = [  # equation, operand shapes, dynamic (the first dim of every operand is "b")
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], True),
    ("bhid,bhjd->bhij", [(2, 3, 5, 4), (2, 3, 6, 4)], True),
    ("bhij,bhjd->bhid", [(2, 3, 5, 6), (2, 3, 6, 4)], True),
    ("ii->i", [(5, 5)], False),
    ("ii", [(4, 4)], False),
    ("bii->bi", [(3, 4, 4)], False),
    ("ij->", [(3, 4)], False),
    ("ijk->kji", [(2, 3, 4)], False),
    ("i,j->ij", [(3,), (4,)], False),
    ("i,i", [(6,), (6,)], False),
    ("ij,jk", [(3, 4), (4, 2)], False),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)], False),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)], False),
    ("Ab,bC->AC", [(3, 4), (4, 2)], False),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)], False),
    ("ij,ij->i", [(3, 4), (3, 4)], False),
    ("bij,jk,bkl->bil", [(2, 3, 4), (4, 5), (2, 5, 2)], False),
]


def run(args):
    p = subprocess.run([FATHOM] + args, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def model(eq, shapes, dynamic, path):
    names = [f"x{i}" for i in range(len(shapes))]
    ins = [helper.make_tensor_value_info(n, T.FLOAT, ["b"] + list(s[1:]) if dynamic else list(s)) for n, s in zip(names, shapes)]
    out = helper.make_tensor_value_info("y", T.FLOAT, None)
    g = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=eq)], "einsum", ins, [out])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    save(m, path)
    return names


def fathom_out(target, names, xs, tag):
    args = ["run", target, "--output", f"{D}/{tag}"]
    for n, x in zip(names, xs):
        np.save(f"{D}/{tag}_{n}.npy", x)
        args += ["--input", f"{n}={D}/{tag}_{n}.npy"]
    rc, msg = run(args)
    return np.load(f"{D}/{tag}/y.npy") if rc == 0 else msg


def check(k, eq, shapes, dynamic):
    global fails
    path = f"{D}/e{k}.onnx"
    names = model(eq, shapes, dynamic, path)
    rc, msg = run(["compile", path, "-o", f"{D}/e{k}_c"])
    if rc:
        print(f"FAIL: {eq}: compile: {msg.strip()}")
        fails += 1
        return
    rng = np.random.default_rng(k)
    for batch in ([None, 3] if dynamic else [None]):
        sh = [(batch,) + tuple(s[1:]) if batch else s for s in shapes]
        xs = [rng.standard_normal(s).astype(np.float32) for s in sh]
        ref = np.einsum(eq, *[x.astype(np.float64) for x in xs])
        outs = {"interpreter": fathom_out(path, names, xs, f"i{k}"), "graph": fathom_out(f"{D}/e{k}_c", names, xs, f"g{k}")}
        if ort:
            outs["onnxruntime"] = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, dict(zip(names, xs)))[0]
        scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
        for who, y in outs.items():
            ok = not isinstance(y, str) and y.shape == ref.shape and float(np.max(np.abs(y - ref), initial=0)) <= 1e-5 * scale
            print(("ok: " if ok else "FAIL: ") + f"{eq} {[tuple(s) for s in sh]} {who}" + ("" if ok else f": {y if isinstance(y, str) else y.shape}"))
            fails += not ok


def refusals():
    global fails
    for k, (eq, shapes, want) in enumerate([("ijk,jk->i", [(3, 4), (4, 5)], "names 3 dims but its operand has 2"),
                                            ("ij,jk->ik", [(3, 4), (5, 2)], "label 'j' has sizes"),
                                            ("i.j->i", [(3, 4)], "a '.' outside one '...' per term"),
                                            ("...i...->i", [(3, 4)], "a '.' outside one '...' per term"),
                                            ("ij->k", [(3, 4)], "output label 'k' is in no operand"),
                                            ("ij->ii", [(3, 4)], "output label 'i' appears twice"),
                                            ("i1->i", [(3, 4)], "'1' is not a label"),
                                            ("ij,jk->ik", [(3, 4)], "has not 1 terms for 1 operands"),
                                            ("ii->i", [(3, 4)], "label 'i' has sizes 3 and 4 in one operand")]):
        path = f"{D}/bad{k}.onnx"
        names = model(eq, shapes, False, path)
        xs = [np.ones(s, np.float32) for s in shapes]
        y = fathom_out(path, names, xs, f"bad{k}")
        ok = isinstance(y, str) and "(Einsum)" in y and want in y
        print(("ok: " if ok else "FAIL: ") + f"{eq} refused: {y.strip() if isinstance(y, str) else 'ran'}")
        fails += not ok


for k, (eq, shapes, dyn) in enumerate(CASES):
    check(k, eq, shapes, dyn)
refusals()
if not ort:
    print("note: onnxruntime is not installed; compared with numpy only")
print(f"{fails} failures")
sys.exit(1 if fails else 0)
