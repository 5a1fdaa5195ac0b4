#!/usr/bin/env python3
"""Read fathom's TensorBoard event files back with TensorBoard's own reader.

An independent check of src/observe/tensorboard.c: if TensorBoard (through
tbparse, or TensorBoard's EventAccumulator when tbparse is missing) finds the
values fathom wrote, the TFRecord framing, the CRCs and the hand-encoded Event
protobufs are right.

    python3 tools/read_tensorboard.py LOGDIR                     # print what is there
    python3 tools/read_tensorboard.py LOGDIR --expect train/loss=5:0.25 --expect-histogram weights/fc1
    python3 tools/read_tensorboard.py --self-test /path/to/fathom_test_observe_writer

--expect TAG=STEP:VALUE fails (exit 1) unless that scalar is found (float32
tolerance). Needs `pip install tensorboard tbparse`; exit 77 (skip) when
neither can be imported.
"""
import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile


def load(logdir):
    """Returns ({tag: {step: value}}, {tag: [(step, num, min, max)]})."""
    scalars, histos = {}, {}
    try:
        from tbparse import SummaryReader
        df = SummaryReader(logdir, pivot=False).scalars
        for row in df.itertuples():
            scalars.setdefault(row.tag, {})[int(row.step)] = float(row.value)
        hdf = SummaryReader(logdir, pivot=False, extra_columns={"dir_name"}).histograms
        for row in hdf.itertuples():
            counts = list(row.counts)
            limits = list(row.limits)
            histos.setdefault(row.tag, []).append((int(row.step), float(sum(counts)), limits))
        return scalars, histos, "tbparse"
    except ImportError:
        pass
    from tensorboard.backend.event_processing import event_accumulator as ea  # noqa: raises ImportError when absent
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    for tag in acc.Tags().get("scalars", []):
        for e in acc.Scalars(tag):
            scalars.setdefault(tag, {})[int(e.step)] = float(e.value)
    for tag in acc.Tags().get("histograms", []):
        for e in acc.Histograms(tag):
            h = e.histogram_value
            histos.setdefault(tag, []).append((int(e.step), float(h.num), list(h.bucket_limit)))
    return scalars, histos, "tensorboard EventAccumulator"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir", nargs="?")
    ap.add_argument("--expect", action="append", default=[], help="TAG=STEP:VALUE")
    ap.add_argument("--expect-histogram", action="append", default=[], help="TAG")
    ap.add_argument("--self-test", metavar="WRITER", help="run WRITER LOGDIR (prints TAG=STEP:VALUE lines to expect), then check")
    a = ap.parse_args()
    try:
        import tbparse  # noqa: F401
    except ImportError:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            print("skip: neither tbparse nor tensorboard is installed (pip install tensorboard tbparse)")
            return 77
    tmp = None
    if a.self_test:
        tmp = tempfile.TemporaryDirectory()
        a.logdir = tmp.name
        out = subprocess.run(shlex.split(a.self_test) + [a.logdir], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("expect "):
                a.expect.append(line.split(None, 1)[1])
            elif line.startswith("expect-histogram "):
                a.expect_histogram.append(line.split(None, 1)[1])
    if not a.logdir or not os.path.isdir(a.logdir):
        ap.error("a log directory is needed")
    scalars, histos, how = load(a.logdir)
    print(f"read with {how}: {sum(len(v) for v in scalars.values())} scalars in {len(scalars)} tags, "
          f"{sum(len(v) for v in histos.values())} histograms in {len(histos)} tags")
    fails = 0
    if not a.expect and not a.expect_histogram:
        for tag, pts in sorted(scalars.items()):
            last = max(pts)
            print(f"  {tag}: {len(pts)} points, step {last} = {pts[last]:.6g}")
        for tag, hs in sorted(histos.items()):
            print(f"  {tag}: {len(hs)} histograms, last has {hs[-1][1]:.0f} values")
    for e in a.expect:
        tag, rest = e.split("=", 1)
        step, val = rest.split(":")
        step, val = int(step), float(val)
        got = scalars.get(tag, {}).get(step)
        ok = got is not None and math.isclose(got, val, rel_tol=1e-6, abs_tol=1e-6)
        print(f"  {'ok ' if ok else 'FAIL'} {tag} step {step}: expected {val:.7g}, found {got}")
        fails += not ok
    for tag in a.expect_histogram:
        ok = tag in histos and histos[tag][0][1] > 0
        print(f"  {'ok ' if ok else 'FAIL'} histogram {tag}: {histos.get(tag, [[0, 0]])[0][1]:.0f} values")
        fails += not ok
    if tmp:
        tmp.cleanup()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
