#!/usr/bin/env bash
# `fathom import|compile --dim` and `fathom run GRAPH_DIR` on what torch.onnx.export puts in a
# Hugging Face BERT (tests/onnx_import_patterns.py writes the models): the attention-mask
# arithmetic on Shape/Range, a Gather with 2-D indices, And/Or/Xor/Not/IsNaN, and the exact
# GELU in three orders. Without --dim both dims stay dynamic (arange, dim_size and an
# index_select carry the mask's arithmetic); with them the graph holds three `gelu` nodes and
# no erf, and its outputs equal the interpreter's
# (and ONNX Runtime's when installed) within 1e-5. Bad --dim values exit 2 naming the dims,
# and nothing is written. An Erf that is no GELU becomes the graph's `erf`.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_need_onnx_python
cli_begin fathom_cli_onnx_pat
d=$tmp
python3 "$here/onnx_import_patterns.py" "$d" || { echo "FAIL: writing the models"; exit 1; }
ins=(--input "x=$d/x.npy" --input "mask=$d/mask.npy")

# both dims dynamic: the mask's Range over s becomes an arange, its flat index b * s + j a
# dim_size times an arange, the Gather of the flattened mask an index_select
out=$("$bin" import "$d/patterns.onnx" -o "$d/dyn" 2>&1); rc=$?
check "both dims dynamic: imported, b and s kept dynamic" '[ $rc = 0 ] && [[ "$out" == *"inputs: x f32 [b, s, 4] mask i64 [b, s]"* ]]'
# graph_vs_eager GRAPH TAG WHAT: patterns.onnx through the interpreter and GRAPH at batch 2
# and 3 (outputs in $d/TAG_eager$n and $d/TAG_graph$n), within 1e-5 of each other
graph_vs_eager() {
  local n rc1 rc2 worst
  for n in "" 3; do
    "$bin" run "$d/patterns.onnx" --input "x=$d/x$n.npy" --input "mask=$d/mask$n.npy" --output "$d/$2_eager$n" >/dev/null; rc1=$?
    "$bin" run "$1" --input "x=$d/x$n.npy" --input "mask=$d/mask$n.npy" --output "$d/$2_graph$n" >/dev/null; rc2=$?
    worst=$(python3 -c "
import sys, numpy as np
a, b = sys.argv[1], sys.argv[2]
print(max(float(np.max(np.abs(np.load(f'{a}/{k}.npy') - np.load(f'{b}/{k}.npy')))) for k in ('attn', 'gelu')))" "$d/$2_eager$n" "$d/$2_graph$n")
    check "$3 at batch ${n:-2} equals the interpreter (worst $worst)" \
      '[ "$rc1$rc2" = 00 ] && python3 -c "import sys; sys.exit(float(sys.argv[1]) > 1e-5)" "$worst"'
  done
}
graph_vs_eager "$d/dyn" dyn "the graph with both dims dynamic"
# exported back to ONNX (arange as Shape, Squeeze and Range; dim_size as Shape and Squeeze),
# the file runs at batch 3 with the same outputs (and in ONNX Runtime when installed)
"$bin" export "$d/dyn" -o "$d/dyn_rt.onnx" >/dev/null; rc=$?
"$bin" run "$d/dyn_rt.onnx" --input "x=$d/x3.npy" --input "mask=$d/mask3.npy" --output "$d/dyn_rt3" >/dev/null; rc1=$?
worst=$(python3 -c "
import sys, numpy as np
d = sys.argv[1]
w = max(float(np.max(np.abs(np.load(f'{d}/dyn_rt3/{k}.npy') - np.load(f'{d}/dyn_eager3/{k}.npy')))) for k in ('attn', 'gelu'))
try:
    import onnxruntime as ort
    r = ort.InferenceSession(f'{d}/dyn_rt.onnx', providers=['CPUExecutionProvider']).run(None, {'x': np.load(f'{d}/x3.npy'), 'mask': np.load(f'{d}/mask3.npy')})
    w = max(w, max(float(np.max(np.abs(a - np.load(f'{d}/dyn_eager3/{k}.npy')))) for a, k in zip(r, ('attn', 'gelu'))))
except ImportError:
    pass
print(w)" "$d" 2>&1)
check "the dynamic graph exported to ONNX runs at batch 3 with the same outputs (worst $worst)" \
  '[ "$rc$rc1" = 00 ] && python3 -c "import sys; sys.exit(float(sys.argv[1]) > 1e-5)" "$worst"'
err=$("$bin" import "$d/patterns.onnx" -o "$d/g" --dim b=2 --dim q=5 2>&1); rc=$?
check "an unknown --dim name: exit 2, the dims listed" '[ $rc = 2 ] && [[ "$err" == *"no dynamic input dim named '"'"'q'"'"' (its dynamic dims: b, s)"* ]] && [ ! -e "$d/g" ]'
for bad in b=0 b=-3 b=x b= =2 b; do
  err=$("$bin" import "$d/patterns.onnx" -o "$d/g" --dim "$bad" 2>&1); rc=$?
  check "--dim $bad: exit 2" '[ $rc = 2 ] && [ ! -e "$d/g" ]'
done
err=$("$bin" compile "$d/../nope_dir" -o "$d/g" --dim b=2 2>&1); rc=$?
check "compile --dim on a model directory: exit 2" '[ $rc = 2 ] && [[ "$err" == *"--dim applies to an ONNX file"* ]]'

out=$("$bin" import "$d/patterns.onnx" -o "$d/g" --dim b=2 --dim s=5); rc=$?
check "import with --dim b=2 --dim s=5" '[ $rc = 0 ] && [[ "$out" == *"inputs: x f32 [2, 5, 4] mask i64 [2, 5]"* ]]'
ops=$(python3 -c "import json, sys; print(' '.join(sorted(n['op'] for n in json.load(open(sys.argv[1]))['nodes'])))" "$d/g/graph.json")
check "three gelu nodes, each exported Erf chain gone" '[ "$(tr " " "\n" <<< "$ops" | grep -c "^gelu$")" = 3 ] && [[ "$ops" != *erf* ]]'
check "the logical ops as where/eq/ne, the 2-D Gather as index_select" \
  '[[ "$ops" == *index_select* ]] && [[ "$ops" == *where* ]] && [[ "$ops" == *" ne "* ]] && [[ "$ops" == *" eq "* ]]'
"$bin" run "$d/patterns.onnx" "${ins[@]}" --output "$d/eager" >/dev/null; rc1=$?
"$bin" run "$d/g" "${ins[@]}" --output "$d/graph" >/dev/null; rc2=$?
"$bin" compile "$d/patterns.onnx" -o "$d/c" --dim b=2 --dim s=5 >/dev/null; rc3=$?
"$bin" run "$d/c" "${ins[@]}" --output "$d/compiled" >/dev/null; rc4=$?
check "the interpreter, the graph and the compiled graph run" '[ "$rc1$rc2$rc3$rc4" = 0000 ]'
cmp_py='
import sys, numpy as np
d = sys.argv[1]
worst = 0.0
for side in ("graph", "compiled"):
    for name in ("attn", "gelu"):
        a, b = np.load(f"{d}/{side}/{name}.npy"), np.load(f"{d}/eager/{name}.npy")
        assert a.shape == b.shape, (side, name, a.shape, b.shape)
        worst = max(worst, float(np.max(np.abs(a - b) / (1 + np.abs(b)))))
try:
    import onnxruntime as ort
    s = ort.InferenceSession(f"{d}/patterns.onnx", providers=["CPUExecutionProvider"])
    ref = s.run(None, {"x": np.load(f"{d}/x.npy"), "mask": np.load(f"{d}/mask.npy")})
    for name, r in zip(("attn", "gelu"), ref):
        worst = max(worst, float(np.max(np.abs(np.load(f"{d}/graph/{name}.npy") - r) / (1 + np.abs(r)))))
except ImportError:
    print("note: onnxruntime is not installed; compared with the interpreter only")
print(worst)
sys.exit(0 if worst <= 1e-5 else 1)'
worst=$(python3 -c "$cmp_py" "$d"); rc=$?
check "graph and compiled outputs equal the interpreter's (and ORT's) within 1e-5 (worst $worst)" '[ $rc = 0 ]'
# only the sequence fixed: the batch stays dynamic (the flat mask index b * s + j over every
# row in order becomes a reshape), and one graph runs batch 2 and batch 3
out=$("$bin" import "$d/patterns.onnx" -o "$d/gb" --dim s=5); rc=$?
check "import with --dim s=5 keeps b dynamic" '[ $rc = 0 ] && [[ "$out" == *"inputs: x f32 [b, 5, 4] mask i64 [b, 5]"* ]]'
graph_vs_eager "$d/gb" b "dynamic-batch graph"
# fathom bench: --batch is the graph's batch dim whatever the file named it (here "b")
out=$("$bin" bench "$d/gb" --batch 3 --iters 2 --warmup 0 --json 2>&1); rc=$?
check "bench --batch 3 on the dim named b" '[ $rc = 0 ] && [[ "$out" == *"\"batch\":3"* ]] && [[ "$out" == *"x f32 [3, 5, 4]"* ]]'
err=$("$bin" bench "$d/g" --batch 3 --iters 1 2>&1); rc=$?
check "bench --batch on a graph without a dynamic batch: exit 2" '[ $rc = 2 ] && [[ "$err" == *"no dynamic batch dim"* ]] && [[ "$err" == *"fixed at 2"* ]]'
# a fixed batch (b=2 here) is what one run holds: items/s counts 2 per run, and --batch 2 is accepted
out=$("$bin" bench "$d/g" --batch 2 --iters 2 --warmup 0 --json 2>&1); rc=$?
check "bench of a fixed batch of 2 reports batch 2" '[ $rc = 0 ] && [[ "$out" == *"\"batch\":2"* ]]'
err=$("$bin" bench "$d/gb" --dim q=2 --iters 1 2>&1); rc=$?
check "bench --dim with a name the graph lacks: exit 2" '[ $rc = 2 ] && [[ "$err" == *"no dynamic dim of that name"* ]]'
err=$("$bin" import "$d/reversed.onnx" -o "$d/rev" 2>&1); rc=$?
check "indices from a dynamic dim that are not every row in order: refused" \
  '[ $rc = 1 ] && [[ "$err" == *"--dim NAME=SIZE"* ]] && [ ! -e "$d/rev" ]'
"$bin" import "$d/reversed.onnx" -o "$d/rev" --dim b=2 >/dev/null; rc=$?
out=$("$bin" run "$d/rev" --input "x=$d/x2.npy" --json); rc2=$?
check "the same with b fixed: rows reversed" '[ "$rc$rc2" = 00 ] && [[ "$out" == *"\"data\":[3.0,4.0,1.0,2.0]"* ]]'
err=$("$bin" import "$d/minbatch.onnx" -o "$d/minb" 2>&1); rc=$?
check "x * min(b, 3) is not folded to x * 3 (refused while b is dynamic)" '[ $rc = 1 ] && [ ! -e "$d/minb" ]'
"$bin" import "$d/minbatch.onnx" -o "$d/minb" --dim b=2 >/dev/null; rc=$?
out=$("$bin" run "$d/minb" --input "x=$d/x2.npy" --json); rc2=$?
check "the same with b = 2: x * 2" '[ "$rc$rc2" = 00 ] && [[ "$out" == *"\"data\":[2.0,4.0,6.0,8.0]"* ]]'
err=$("$bin" run "$d/g" --input "x=$d/x.npy" 2>&1); rc=$?
check "a graph run missing an input: exit 1" '[ $rc = 1 ]'
mkdir -p "$d/empty"
err=$("$bin" run "$d/empty" "${ins[@]}" 2>&1); rc=$?
check "a directory that is no graph: exit 1, said" '[ $rc = 1 ] && [[ "$err" == *"without a graph.json"* ]]'
"$bin" import "$d/erf.onnx" -o "$d/e" >/dev/null; rc=$?
ops=$(python3 -c "import json, sys; print(' '.join(n['op'] for n in json.load(open(sys.argv[1]))['nodes']))" "$d/e/graph.json" 2>/dev/null)
out=$("$bin" run "$d/e" --input "x=$d/xe.npy" --json); rc2=$?
err=$(python3 -c "
import json, math, sys
o = json.loads(sys.argv[1])['outputs'][0]['data']
x = [-2, -0.5, 0, 0.3, 1, 3]
print(max(abs(a - math.erf(v)) for a, v in zip(o, x)))" "$out" 2>/dev/null)
check "an Erf outside the GELU pattern: the graph's erf, erf's values within 1e-6 ($err)" \
  '[ "$rc$rc2" = 00 ] && [ "$ops" = erf ] && python3 -c "import sys; sys.exit(not float(sys.argv[1]) <= 1e-6)" "$err"'
# fathom plan on the file and on the graph: one inference on the meta device (weights, inputs,
# the run's peak, FLOPs), the dynamic dims sized by --batch and --dim; a dim left unsized, an
# unknown --dim and a GPU-plan option are usage errors
out=$("$bin" plan --model "$d/patterns.onnx" --batch 2 --dim s=5 --json); rc=$?
check "plan --model FILE.onnx --batch 2 --dim s=5: the inputs sized, a peak and FLOPs" \
  '[ $rc = 0 ] && python3 -c "
import json, sys
j = json.loads(sys.argv[1])
assert j[\"kind\"] == \"onnx\" and j[\"inputs\"] == \"x f32 [2, 5, 4], mask i64 [2, 5]\", j
assert j[\"memory\"][\"run_peak\"] > 0 and j[\"memory\"][\"inputs\"] > 0 and j[\"flops\"] > 0, j" "$out"'
out=$("$bin" plan --model "$d/dyn" --batch 3 --dim s=7); rc=$?
check "plan --model GRAPH_DIR (both dims dynamic) --batch 3 --dim s=7: text report" \
  '[ $rc = 0 ] && [[ "$out" == *"inputs x f32 [3, 7, 4], mask i64 [3, 7]"* ]] && [[ "$out" == *"GFLOP"* ]]'
err=$("$bin" plan --model "$d/dyn" --batch 3 2>&1); rc=$?
check "plan of a graph with s unsized: exit 2, the fix named" '[ $rc = 2 ] && [[ "$err" == *"give its size with --dim s=N"* ]]'
err=$("$bin" plan --model "$d/dyn" --dim q=3 --dim s=2 2>&1); rc=$?
check "plan --dim q=3 (no such dim): exit 2, the dims listed" '[ $rc = 2 ] && [[ "$err" == *"no dynamic dim of that name (its dynamic dims: b, s)"* ]]'
err=$("$bin" plan --model "$d/dyn" --dim s=2 --gpu h100 2>&1); rc=$?
check "plan of a graph with --gpu: exit 2" '[ $rc = 2 ] && [[ "$err" == *"--gpu does not apply to an inference graph"* ]]'
err=$("$bin" plan --model "$d/dyn" --dim s=0 2>&1); rc=$?
check "plan --dim s=0: exit 2" '[ $rc = 2 ] && [[ "$err" == *"SIZE in [1, 2^31)"* ]]'
# CumSum with a constant axis: the graph's cumsum, both dims dynamic; RoBERTa's position ids
# [[2, 3, 4, 5, 1, 1], [2, 3, 4, 5, 6, 7]] (positions start after the padding id 1, which keeps 1)
"$bin" import "$d/positions.onnx" -o "$d/pos" >/dev/null; rc=$?
ops=$(python3 -c "import json, sys; print(' '.join(n['op'] for n in json.load(open(sys.argv[1]))['nodes']))" "$d/pos/graph.json" 2>/dev/null)
"$bin" run "$d/positions.onnx" --input "ids=$d/ids.npy" --input "x=$d/xp.npy" --output "$d/pos_eager" >/dev/null; rc1=$?
"$bin" run "$d/pos" --input "ids=$d/ids.npy" --input "x=$d/xp.npy" --output "$d/pos_graph" >/dev/null; rc2=$?
worst=$(python3 -c "
import sys, numpy as np
d = sys.argv[1]
pos, xs = np.load(f'{d}/pos_graph/pos.npy'), np.load(f'{d}/pos_graph/xs.npy')
assert pos.tolist() == [[2, 3, 4, 5, 1, 1], [2, 3, 4, 5, 6, 7]], pos.tolist()
assert (pos == np.load(f'{d}/pos_eager/pos.npy')).all()
x = np.load(f'{d}/xp.npy')
want = np.flip(np.cumsum(np.flip(x, 1), 1), 1) - x  # exclusive, reversed
worst = float(np.max(np.abs(xs - want)))
worst = max(worst, float(np.max(np.abs(np.load(f'{d}/pos_eager/xs.npy') - want))))
assert (np.load(f'{d}/pos_graph/cls.npy') == x[:, 0]).all() and (np.load(f'{d}/pos_graph/last.npy') == x[:, -1]).all()
assert (np.load(f'{d}/pos_graph/ends.npy') == x[:, [-1, 0, -2]]).all()
try:
    import onnxruntime as ort
    s = ort.InferenceSession(f'{d}/positions.onnx', providers=['CPUExecutionProvider'])
    rp, rx = s.run(None, {'ids': np.load(f'{d}/ids.npy'), 'x': x})[:2]
    assert (rp == pos).all()
    worst = max(worst, float(np.max(np.abs(rx - xs))))
except ImportError:
    pass
print(worst)" "$d" 2>&1); rc3=$?
check "CumSum: two graph cumsum nodes, position ids exact, the float sum within 1e-5 of numpy (and ORT), the first, last and tokens -1, 0, -2 exact ($worst)" \
  '[ "$rc$rc1$rc2$rc3" = 0000 ] && [ "$(tr " " "\n" <<< "$ops" | grep -c "^cumsum$")" = 2 ] && python3 -c "import sys; sys.exit(not float(sys.argv[1]) <= 1e-5)" "$worst"'
"$bin" export "$d/pos" -o "$d/pos_rt.onnx" >/dev/null 2>&1; rc=$?
"$bin" run "$d/pos_rt.onnx" --input "ids=$d/ids.npy" --input "x=$d/xp.npy" --output "$d/pos_rt" >/dev/null; rc1=$?
check "the cumsum graph exported to ONNX and run again: the same position ids" \
  '[ "$rc$rc1" = 00 ] && python3 -c "import sys, numpy as np; sys.exit(not (np.load(sys.argv[1]) == np.load(sys.argv[2])).all())" "$d/pos_rt/pos.npy" "$d/pos_graph/pos.npy"'
cli_end cli_onnx_import_patterns
