#!/usr/bin/env bash
# `fathom import|compile|export` on what torch.onnx.export puts in torchvision's image models
# (tests/onnx_vision_patterns.py writes the model): HardSwish, HardSigmoid, a depthwise Conv
# with Clip(0, 6), Sigmoid times its input, MaxPool and AveragePool with ceil_mode, and ViT's
# class token expanded to the batch. The batch stays dynamic (no --dim); the graph and the
# compiled graph equal the interpreter (and ONNX Runtime when installed) within 1e-5 at batch
# 2 and 3; the compiled graph holds silu and no sigmoid; the exported graph runs in ONNX
# Runtime with the same outputs. Then the scatter model, TensorFlow-style padding (Pad
# reflect/edge/constant, uneven SAME_UPPER and explicit pads), and the other models of
# onnx_vision_patterns.py (1-D convs and pools among them) through the same steps.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_need_onnx_python
cli_begin fathom_cli_onnx_vis
d=$tmp
python3 "$here/onnx_vision_patterns.py" "$d" || { echo "FAIL: writing the model"; exit 1; }

out=$("$bin" import "$d/vision.onnx" -o "$d/g"); rc=$?
check "import keeps the batch dynamic" '[ $rc = 0 ] && [[ "$out" == *"inputs: x f32 [b, 3, 17, 19]"* ]]'
out=$("$bin" compile "$d/vision.onnx" -o "$d/c"); rc=$?
check "compile" '[ $rc = 0 ]'
ops=$(python3 -c "import json, sys; print(' '.join(sorted(n['op'] for n in json.load(open(sys.argv[1]))['nodes'])))" "$d/c/graph.json")
check "compiled: silu, no sigmoid; the Clip(0, 6) in the depthwise conv; HardSwish and HardSigmoid each one ew_chain (no clamp, mul or add left); the pools and the expand in the graph ($ops)" \
  '[[ " $ops " == *" silu "* ]] && [[ " $ops " != *" sigmoid "* ]] && [ "$(tr " " "\n" <<< "$ops" | grep -c "^ew_chain$")" = 2 ] && [[ " $ops " != *" clamp "* ]] && [[ " $ops " != *" mul "* ]] && [[ " $ops " != *" add "* ]] && [[ " $ops " == *" conv2d_fused "* ]] && [[ "$ops" == *max_pool2d* ]] && [[ "$ops" == *avg_pool2d* ]] && [[ "$ops" == *expand* ]]'
attrs=$(python3 -c "
import json, sys
g = json.load(open(sys.argv[1]))
print(' '.join(f\"{n['op']}:ceil={n.get('attrs', {}).get('ceil_mode', 0)}\" for n in g['nodes'] if 'pool' in n['op']),
      ' '.join(json.dumps(n['attrs']['shape']) for n in g['nodes'] if n['op'] == 'expand'))" "$d/g/graph.json")
check "the pools keep ceil_mode, the class token expands to the dim b ($attrs)" \
  '[[ "$attrs" == *"max_pool2d:ceil=1"* ]] && [[ "$attrs" == *"avg_pool2d:ceil=1"* ]] && [[ "$attrs" == *"\"b\""* ]]'
"$bin" export "$d/c" -o "$d/exported.onnx" >/dev/null; rc=$?
check "export of the compiled graph" '[ $rc = 0 ] && [ -s "$d/exported.onnx" ]'
for n in "" 3; do
  "$bin" run "$d/vision.onnx" --input "x=$d/x$n.npy" --output "$d/eager$n" >/dev/null; rc1=$?
  "$bin" run "$d/g" --input "x=$d/x$n.npy" --output "$d/graph$n" >/dev/null; rc2=$?
  "$bin" run "$d/c" --input "x=$d/x$n.npy" --output "$d/compiled$n" >/dev/null; rc3=$?
  check "batch ${n:-2}: the interpreter, the graph and the compiled graph run" '[ "$rc1$rc2$rc3" = 000 ]'
  worst=$(python3 -c "
import sys, numpy as np
d, n = sys.argv[1], sys.argv[2]
worst = 0.0
refs = {k: np.load(f'{d}/eager{n}/{k}.npy') for k in ('seq', 'hsg')}
try:
    import onnxruntime as ort
    x = np.load(f'{d}/x{n}.npy')
    for f in ('vision.onnx', 'exported.onnx'):
        r = ort.InferenceSession(f'{d}/{f}', providers=['CPUExecutionProvider']).run(['seq', 'hsg'], {'x': x})
        for k, v in zip(('seq', 'hsg'), r):
            worst = max(worst, float(np.max(np.abs(v - refs[k]) / (1 + np.abs(refs[k])))))
except ImportError:
    print('note: onnxruntime is not installed; compared with the interpreter only', file=sys.stderr)
for side in ('graph', 'compiled'):
    for k, ref in refs.items():
        a = np.load(f'{d}/{side}{n}/{k}.npy')
        assert a.shape == ref.shape, (side, k, a.shape, ref.shape)
        worst = max(worst, float(np.max(np.abs(a - ref) / (1 + np.abs(ref)))))
print(worst)" "$d" "$n")
  check "batch ${n:-2}: graph, compiled and exported outputs equal the interpreter's and ORT's within 1e-5 (worst $worst)" \
    'python3 -c "import sys; sys.exit(not float(sys.argv[1]) <= 1e-5)" "$worst"'
done
# ScatterND (reduction add, a negative index) and ScatterElements (negative indices) in the
# interpreter, against numpy written out here and ORT; the zero Pad becomes an identity in
# the graph; an out-of-range index is refused by name, exit 1
"$bin" run "$d/scatter.onnx" --input "d=$d/s.npy" --output "$d/sc" >/dev/null; rc1=$?
"$bin" import "$d/scatter.onnx" -o "$d/sg" >/dev/null 2>"$d/sg.err"; rc2=$?
"$bin" run "$d/sg" --input "d=$d/s.npy" --output "$d/sgo" >/dev/null; rc3=$?
check "scatter model runs, imports (scatter_nd and scatter nodes) and its graph runs" '[ "$rc1$rc2$rc3" = 000 ]'
worst=$(python3 -c "
import sys, numpy as np
d = sys.argv[1]
x = np.load(f'{d}/s.npy'); y = x.copy()
upd = np.arange(18, dtype=np.float32).reshape(3, 6)
for i, (a, b) in enumerate([(0, 1), (0, -1), (0, 1)]):
    y[a, b] += upd[i]
for i in range(4):
    for j, k in enumerate([5, -1, 0, 2, 2, 1]):
        y[0, i, k] = 0.5
err = max(float(np.max(np.abs(np.load(f'{d}/{o}/y.npy') - y))) for o in ('sc', 'sgo'))
got = np.load(f'{d}/sc/y.npy')
try:
    import onnxruntime as ort
    r = ort.InferenceSession(f'{d}/scatter.onnx', providers=['CPUExecutionProvider']).run(None, {'d': x})[0]
    err = max(err, float(np.max(np.abs(got - r))))
except ImportError:
    pass
print(err)" "$d")
check "scatter outputs (interpreter and graph) equal numpy's (and ORT's) within a float rounding of values up to 20 (worst $worst)" 'python3 -c "import sys; sys.exit(not float(sys.argv[1]) <= 1e-5)" "$worst"'
err=$("$bin" run "$d/bad_scatter.onnx" --input "d=$d/s.npy" 2>&1); rc=$?
check "an out-of-range ScatterND index: exit 1, named" '[ $rc = 1 ] && [[ "$err" == *"index 4 (update 0) is out of range for dim 1 with size 4"* ]]'
# MODEL NPY OP COUNT WHAT: import, compile and export MODEL; the compiled graph holds COUNT nodes of
# OP; the graph, the compiled graph and the export equal the interpreter and ORT within 1e-5
roundtrip() {
  local m=$1 npy=$2 op=$3 count=$4 what=$5 rc1 rc2 rc3 n worst s
  "$bin" import "$d/$m.onnx" -o "$d/${m}_g" >/dev/null; rc1=$?
  "$bin" compile "$d/$m.onnx" -o "$d/${m}_c" >/dev/null; rc2=$?
  "$bin" export "$d/${m}_c" -o "$d/${m}_exported.onnx" >/dev/null; rc3=$?
  check "$m: import, compile and export" '[ "$rc1$rc2$rc3" = 000 ]'
  n=$(python3 -c "import json, sys; print(sum(n['op'] == sys.argv[2] for n in json.load(open(sys.argv[1]))['nodes']))" "$d/${m}_c/graph.json" "$op")
  check "$m: $what, got $n" '[ "$n" = "$count" ]'
  for s in "$m.onnx" "${m}_g" "${m}_c"; do "$bin" run "$d/$s" --input "x=$d/$npy" --output "$d/o_$s" >/dev/null || bad "run $s"; done
  worst=$(python3 -c "
import sys, numpy as np
d, m, npy = sys.argv[1:4]
ref = np.load(f'{d}/o_{m}.onnx/y.npy')
outs = [np.load(f'{d}/o_{m}_{s}/y.npy') for s in ('g', 'c')]
try:
    import onnxruntime as ort
    x = np.load(f'{d}/{npy}')
    outs += [ort.InferenceSession(f'{d}/{f}', providers=['CPUExecutionProvider']).run(None, {'x': x})[0] for f in (f'{m}.onnx', f'{m}_exported.onnx')]
except ImportError:
    print('note: onnxruntime is not installed; compared with the interpreter only', file=sys.stderr)
print(max(float(np.max(np.abs(o - ref) / (1 + np.abs(ref)))) if o.shape == ref.shape else 1e9 for o in outs))" "$d" "$m" "$npy")
  check "$m: graph, compiled and exported outputs equal the interpreter's and ORT's within 1e-5 (worst $worst)" \
    'python3 -c "import sys; sys.exit(not float(sys.argv[1]) <= 1e-5)" "$worst"'
}
# TensorFlow's padding: Pad reflect/edge/constant and the uneven part of SAME_UPPER and explicit
# pads as pad nodes (the max pool's pad is -inf, which graph.json writes as a string)
roundtrip pads p.npy pad 6 "six pad nodes (three Pads, the uneven parts of two convs and a pool)"
# a U-Net's decoder: ConvTranspose with output_padding, groups and uneven pads (a crop after it)
roundtrip upsample u.npy conv_transpose2d 2 "two conv_transpose2d nodes"
# a CycleGAN-style generator: reflect pads, InstanceNormalization (a layer norm over H and W, then
# scale and bias), a strided conv down and a ConvTranspose up
roundtrip gan g.npy layer_norm 3 "three layer_norm nodes (the instance norms)"
# Resize with constant scales or sizes (or sizes that carry the dynamic batch along): an
# index_select per axis (nearest), per tap and axis weighted (linear: 2 taps, cubic: 4) -> 2 + 4 + 8 + 4
roundtrip resize r.npy index_select 18 "eighteen index_select nodes"
# Tile as an index_select per repeated axis, GatherElements with negative constant indices as gather
roundtrip tile r.npy gather 1 "one gather node"
# ScatterElements, Mod and ScatterND on computed indices (negative ones wrapped by a where) and updates
roundtrip scatter_data s.npy scatter 1 "one scatter node"
# TopK (smallest and largest, values and indices used) with constant K: two topk nodes
roundtrip topk s.npy topk 2 "two topk nodes"
# GatherND (negative indices, batch_dims 1) and OneHot with constant depth: two index_select nodes
roundtrip index_ops s.npy index_select 2 "two index_select nodes (the GatherNDs)"
err=$("$bin" run "$d/bad_gather_nd.onnx" --input "x=$d/s.npy" 2>&1); rc1=$?
"$bin" import "$d/bad_gather_nd.onnx" -o "$d/bgn" >/dev/null 2>&1; rc2=$?
check "an out-of-range GatherND index: exit 1 (run and import), named; nothing written" \
  '[ "$rc1$rc2" = 11 ] && [[ "$err" == *"(GatherND): index 6 (tuple 0) is out of range for dim 1 of size 6"* ]] && [ ! -e "$d/bgn" ]'
# DepthToSpace (CRD, DCR), SpaceToDepth, Shrink, MeanVarianceNormalization, LRN: three permutes
roundtrip layout_ops l.npy permute 3 "three permute nodes (the depth/space moves)"
# linears with GELU (erf), SiLU, Sigmoid, Tanh and GELU's tanh form (x*x*x, then Pow(x, 3)) after them:
# each one linear_fused with its activation
roundtrip mlp_acts m.npy linear_fused 6 "six linear_fused nodes"
acts=$(python3 -c "import json, sys; print(','.join(n['attrs'].get('act', '-') for n in json.load(open(sys.argv[1]))['nodes'] if n['op'] == 'linear_fused'))" \
  "$d/mlp_acts_c/graph.json" 2>&1)
check "mlp_acts: the activations are the linear_fused nodes' own (got $acts)" '[ "$acts" = "gelu,silu,sigmoid,tanh,gelu_tanh,gelu_tanh" ]'
# 1-D convs and pools (speech models) as 2-D ones on [N, C, 1, L]; the length fixed, then dynamic
roundtrip audio a.npy conv_transpose2d 1 "one conv_transpose2d node"
roundtrip audio_dyn a.npy max_pool2d 1 "one max_pool2d node"
roundtrip audio_dyn a50.npy avg_pool2d 1 "one avg_pool2d node"
err=$("$bin" compile "$d/audio_dyn_uneven.onnx" -o "$d/adu" 2>&1); rc=$?
check "an average pool that leaves uneven pads out of its count on a dynamic length: exit 1, named" \
  '[ $rc = 1 ] && [[ "$err" == *"AveragePool"*"uneven pads left out of its count has a graph form on static spatial dims"* ]] && [ ! -e "$d/adu" ]'
cli_end cli_onnx_vision_patterns
