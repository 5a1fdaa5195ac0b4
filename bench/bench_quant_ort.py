"""ONNX Runtime's side of bench_quant: the MLP that bench_quant exported runs
in fp32, after quantize_dynamic (u8 activations, s8 weights) and after
quantize_static (QDQ, MinMax calibration on the same samples bench_quant used),
each also with reduce_range=True (7-bit weights, as fathom quantize --reduce-range),
at BATCH (default 128; the input's other dims are the calibration samples'), single
session per side, intra-op threads = FATHOM_NUM_THREADS or all cores; alternating
rounds, medians and best rounds, JSON lines like bench_quant's.
Usage: python bench_quant_ort.py MODEL.onnx CALIB.npy ROUNDS [BATCH [NAME]]"""
import json
import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_dynamic, quantize_static


class Reader(CalibrationDataReader):
    def __init__(self, name, x):
        self.items = iter([{name: x[i:i + 64]} for i in range(0, len(x), 64)])

    def get_next(self):
        return next(self.items, None)


def main():
    model, calib_path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    label = sys.argv[5] if len(sys.argv) > 5 else "fashion-mlp (784-1024-1024-10)"
    calib = np.load(calib_path).astype(np.float32)
    opts = ort.SessionOptions()
    threads = int(os.environ.get("FATHOM_NUM_THREADS", "0"))
    if threads:
        opts.intra_op_num_threads = threads
    tmp = tempfile.mkdtemp()
    paths = {k: os.path.join(tmp, k + ".onnx") for k in ("dyn", "static", "dyn_rr", "static_rr")}
    name = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).get_inputs()[0].name
    for rr in (False, True):
        sfx = "_rr" if rr else ""
        quantize_dynamic(model, paths["dyn" + sfx], weight_type=QuantType.QInt8, reduce_range=rr)
        quantize_static(model, paths["static" + sfx], Reader(name, calib), activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=True, reduce_range=rr)
    sides = {k: ort.InferenceSession(p, opts, providers=["CPUExecutionProvider"]) for k, p in
             (("fp32", model), ("quantize_dynamic", paths["dyn"]), ("quantize_static", paths["static"]),
              ("quantize_dynamic_rr", paths["dyn_rr"]), ("quantize_static_rr", paths["static_rr"]))}
    x = np.random.default_rng(4).standard_normal((batch,) + calib.shape[1:]).astype(np.float32)
    times = {k: [] for k in sides}
    for r in range(rounds + 1):
        for k, s in sides.items():
            t0 = time.perf_counter()
            s.run(None, {name: x})
            if r:
                times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    print(json.dumps({"model": label, "runtime": "onnxruntime " + ort.__version__, "batch": batch,
                      "fp32_ms": round(1e3 * med["fp32"], 3), "quantize_dynamic_ms": round(1e3 * med["quantize_dynamic"], 3),
                      "quantize_static_ms": round(1e3 * med["quantize_static"], 3),
                      "dynamic_speedup": round(med["fp32"] / med["quantize_dynamic"], 2),
                      "static_speedup": round(med["fp32"] / med["quantize_static"], 2),
                      "best_fp32_ms": round(1e3 * best["fp32"], 3), "best_quantize_dynamic_ms": round(1e3 * best["quantize_dynamic"], 3),
                      "best_quantize_static_ms": round(1e3 * best["quantize_static"], 3),
                      "reduce_range_dynamic_ms": round(1e3 * med["quantize_dynamic_rr"], 3),
                      "reduce_range_static_ms": round(1e3 * med["quantize_static_rr"], 3),
                      "reduce_range_dynamic_speedup": round(med["fp32"] / med["quantize_dynamic_rr"], 2),
                      "reduce_range_static_speedup": round(med["fp32"] / med["quantize_static_rr"], 2)}), flush=True)


if __name__ == "__main__":
    main()
