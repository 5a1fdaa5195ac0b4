#!/usr/bin/env python3
"""Checks that fathom's layers point down only (docs/ARCHITECTURE.md draws them).

Reads every quoted #include in src/, cli/ and include/ and fails on:
  - an include from a lower layer into a higher one (upward),
  - an include between two different directories of the same layer (sideways:
    peers such as the CPU and CUDA backends never include each other),
  - a quoted include that resolves to no file in the tree (it cannot be placed),
  - an include cycle between files or between directories.
Public headers (include/fathom) are the API contract: src/core may include only
the core-level ones (LAYERS[0]); the rest may include any public header, and a
public header includes only public headers.

With --objects DIR (the fathom_obj object directory of a build, e.g.
build/CMakeFiles/fathom_obj.dir) it also reads the objects' symbols (nm) and
fails when a src/core object calls a function defined above core. --report-calls
then lists every call between directories that goes upward or sideways
(information only: above core, modules still call each other through the public
headers, as docs/ARCHITECTURE.md says).

  python3 tools/check-layering.py [--root DIR] [--objects DIR] [--report-calls]

Exit status 0: layered; 1: violations (each printed); 2: usage or I/O error.
Standard library only."""
import argparse
import os
import re
import subprocess
import sys

# Bottom to top. Each entry: (layer name, [units]); a unit is a directory (its
# files, not its subdirectories' when those are units too) or a public header.
# Units in one layer are peers.
LAYERS = [
    ("public-core", ["include/fathom/error.h", "include/fathom/tensor.h", "include/fathom/memory.h",
                     "include/fathom/ops.def", "include/fathom/export.h"]),
    ("core", ["src/core"]),
    ("public", ["include/fathom"]),
    ("kernel-interface", ["src/backend"]),
    ("backends", ["src/backend/cpu", "src/backend/cuda", "src/backend/check", "src/backend/meta"]),
    ("dispatch", ["src/dispatch"]),
    ("profile", ["src/profile"]),
    ("autograd", ["src/autograd"]),
    ("amp", ["src/amp"]),  # autocast: the op front ends call it, it casts through fm_to_dtype
    ("ops", ["src/ops"]),
    ("modules", ["src/data", "src/nn"]),
    ("module users", ["src/efficiency", "src/io", "src/optim"]),
    ("distributed", ["src/dist"]),  # collectives and gradient buckets: the trainers call them
    ("tokenizer", ["src/tokenizer"]),
    ("applications", ["src/gpt", "src/observe", "src/recipe"]),
    ("deploy", ["src/graph"]),  # the inference graph: traces the applications' models, runs them compiled
    ("compress", ["src/prune", "src/distill"]),  # pruning and distillation, trained through the recipe trainer
    ("interchange", ["src/onnx", "src/hf"]),  # other runtimes' formats, mapped to the graph and the models
    ("serve", ["src/serve"]),
    ("planner", ["src/plan"]),
    ("cli", ["cli"]),
]

# Files allowed to break the rules, each with its reason; keep this list short.
ALLOW = {}

SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".def", ".in")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def unit_of(path, units):
    """The most specific unit holding a repository-relative path, or None."""
    if path in units:
        return path
    d = os.path.dirname(path)
    while d:
        if d in units:
            return d
        d = os.path.dirname(d)
    return None


def resolve(root, src, inc):
    """Repository-relative path of a quoted include, as the build resolves it
    (-Iinclude -Isrc, then the including file's directory), or None."""
    for base in ("include", "src", os.path.dirname(src)):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def find_cycle(graph):
    """One cycle in a {node: set(nodes)} graph as a list, or None."""
    color, stack = {}, []

    def visit(n):
        color[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if not color.get(m):
                c = visit(m)
                if c:
                    return c
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(graph):
        if not color.get(n):
            c = visit(n)
            if c:
                return c
    return None


def check_includes(root, rank, units):
    errors, file_graph, unit_graph = [], {}, {}
    for top in ("src", "cli", "include"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE_EXT):
                    continue
                src = os.path.relpath(os.path.join(d, f), root)
                su = unit_of(src, units)
                if su is None:
                    errors.append(f"{src}: not in any layer (add its directory to LAYERS in tools/check-layering.py)")
                    continue
                with open(os.path.join(root, src), encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for m in INCLUDE_RE.finditer(text):
                    inc = m.group(1)
                    line = text.count("\n", 0, m.start()) + 1
                    where = f"{src}:{line}"
                    tgt = resolve(root, src, inc)
                    if tgt is None:
                        errors.append(f'{where}: #include "{inc}" matches no file in the tree')
                        continue
                    file_graph.setdefault(src, set()).add(tgt)
                    tu = unit_of(tgt, units)
                    if tu is None or tu == su:
                        continue
                    unit_graph.setdefault(su, set()).add(tu)
                    if src in ALLOW:
                        continue
                    # the core-level public headers form one unit
                    ok = rank[tu] < rank[su] or (rank[tu] == rank[su] == 0)
                    why = "upward" if rank[tu] > rank[su] else "sideways"
                    # the public API: any layer above core may include it; it includes only itself
                    if rank[tu] == rank["include/fathom"]:
                        ok = rank[su] > rank["src/core"] or su in LAYERS[0][1]
                        why = "core includes only the core-level public headers"
                        if su in LAYERS[0][1]:
                            ok = False
                            why = "a core-level public header includes only core-level ones"
                    elif rank[su] == rank["include/fathom"] or su in LAYERS[0][1]:
                        ok = ok and tgt.startswith("include/")
                    if not ok:
                        errors.append(f'{where}: #include "{inc}": {why} ({lname[rank[su]]} {su} -> '
                                      f"{lname[rank[tu]]} {tu})")
    for graph, what in ((unit_graph, "directories"), (file_graph, "files")):
        cyc = find_cycle(graph)
        if cyc:
            errors.append(f"include cycle between {what}: " + " -> ".join(cyc))
    return errors


def object_symbols(objdir, root, units):
    """{unit: (defined set, {symbol: [objects using it]})} from nm over the build's objects."""
    out = {}
    for d, _, files in os.walk(objdir):
        for f in sorted(files):
            if not f.endswith(".o"):
                continue
            obj = os.path.join(d, f)
            rel = os.path.relpath(obj, objdir)[:-2]  # src/core/tensor.c
            su = unit_of(rel, units) if rel.startswith(("src/", "cli/")) else None
            if su is None:
                # generated sources (the backend list) belong to the dispatcher
                su = "src/dispatch" if os.path.basename(rel).startswith("backends.c") else None
            if su is None:
                continue
            try:
                nm = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
            except (OSError, subprocess.CalledProcessError) as e:
                raise SystemExit(f"check-layering: cannot read symbols of {obj} ({e})")
            defs, uses = out.setdefault(su, (set(), {}))
            for line in nm.splitlines():
                p = line.split()
                if len(p) < 2:
                    continue
                if p[1] == "U":
                    uses.setdefault(p[0], []).append(rel)
                elif p[1] in "TDBRVWGSC":
                    defs.add(p[0])
    return out


def check_calls(objdir, root, rank, units, report):
    syms = object_symbols(objdir, root, units)
    if "src/core" not in syms:
        return [f"--objects {objdir}: no src/core objects there (expected <build>/CMakeFiles/fathom_obj.dir)"]
    owner = {}
    for u, (defs, _) in syms.items():
        for s in defs:
            owner[s] = u
    errors, lines = [], []
    for u in sorted(syms):
        for s, users in sorted(syms[u][1].items()):
            tu = owner.get(s)
            if tu is None or tu == u or rank[tu] < rank[u]:
                continue
            for obj in sorted(set(users)):
                src = obj
                msg = f"{src}: calls {s} ({lname[rank[tu]]} {tu})"
                if u == "src/core" and src not in ALLOW:
                    errors.append(msg + ": core calls nothing above it")
                else:
                    lines.append(msg)
    if report:
        print(f"calls that go upward or sideways, above core ({len(lines)}; information, not failures):")
        for m in lines:
            print("  " + m)
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--objects", help="the fathom_obj object directory of a build, to check calls from core")
    ap.add_argument("--report-calls", action="store_true", help="with --objects: list upward calls above core")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    for top in ("src", "include"):
        if not os.path.isdir(os.path.join(root, top)):
            print(f"check-layering: {root} has no {top}/ (give the repository with --root)", file=sys.stderr)
            return 2
    if a.objects and not os.path.isdir(a.objects):
        print(f"check-layering: --objects {a.objects}: no such directory", file=sys.stderr)
        return 2
    rank, units = {}, set()
    for i, (_, us) in enumerate(LAYERS):
        for u in us:
            rank[u] = i
            units.add(u)
    global lname
    lname = [n for n, _ in LAYERS]
    errors = check_includes(root, rank, units)
    if a.objects:
        errors += check_calls(a.objects, root, rank, units, a.report_calls)
    for e in errors:
        print(e)
    if errors:
        print(f"check-layering: {len(errors)} violation(s); the layers are in tools/check-layering.py "
              "and docs/ARCHITECTURE.md")
        return 1
    print(f"check-layering: {len(LAYERS)} layers, includes{' and calls from core' if a.objects else ''} point down only")
    return 0


lname = []
if __name__ == "__main__":
    sys.exit(main())
