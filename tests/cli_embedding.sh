#!/usr/bin/env bash
# A recipe whose first layer is `embedding` trains, end to end, on a real small task: which
# of four licenses in /usr/share/common-licenses (Debian's base-files: Apache-2.0, GPL-3,
# MPL-2.0, Artistic) a run of 32 words comes from. The words become token ids (the 254
# commonest words of the training part, 1 for any other word), one CSV row per window with
# its label; each text is cut in blocks of 100 words, every fifth block tests, the others
# train (no window crosses a block).
# Checked: the training loss falls (first epoch's mean against the last's, and below ln 4),
# the held-out test loss is below ln 4 and the test accuracy beats always answering the
# commonest class by 6 points or more; a run stopped mid-epoch and resumed, and a run on the
# checked test device, end bitwise equal to the straight run; `fathom eval` gives the
# trainer's test accuracy; `fathom predict` takes ids as .csv and .npy; `fathom compile`'s
# graph gives the same accuracy and predictions; `fathom export` writes an ONNX file that
# onnx.checker accepts and ONNX Runtime runs within 1e-5 of fathom (the exported file through
# `fathom run`, the trained model through `fathom predict`'s probabilities, and numpy's own
# forward on the saved weights); a bag-of-words variant (embedding, meanpool, linear) trains,
# compiles and exports (ReduceMean) the same way, and meanpool on anything but token vectors is
# refused; bad ids and a recipe that cannot take ids are refused with the file, sample and
# position. Skipped (77) without the license texts.
set -uo pipefail
. "$(dirname "$0")/cli_lib.sh"
bin=$1
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
lic=/usr/share/common-licenses
for f in Apache-2.0 GPL-3 MPL-2.0 Artistic; do
  [ -r "$lic/$f" ] || { echo "SKIP: $lic/$f is missing (Debian's base-files ships it)"; exit 77; }
done
cli_begin fathom_cli_embedding
"$py" - "$lic" "$tmp" <<'PY' || { echo "FAIL: writing the license windows"; exit 1; }
import collections, re, sys
lic, d = sys.argv[1], sys.argv[2]
names, T, B = ["Apache-2.0", "GPL-3", "MPL-2.0", "Artistic"], 32, 100
texts = [re.findall(r"[a-z]+", open(f"{lic}/{n}", encoding="utf-8", errors="replace").read().lower()) for n in names]
blocks = [[w[i:i + B] for i in range(0, len(w), B)] for w in texts]
parts = [([b for i, b in enumerate(bl) if i % 5 != 4], [b for i, b in enumerate(bl) if i % 5 == 4]) for bl in blocks]
count = collections.Counter(x for tr, _ in parts for b in tr for x in b)
vocab = {w: i + 2 for i, (w, _) in enumerate(count.most_common(254))}  # 0 unused, 1: any other word
for split, k, stride in (("train", 0, 2), ("test", 1, 4)):
    with open(f"{d}/{split}.csv", "w") as f:
        f.write(",".join(f"t{i}" for i in range(T)) + ",label\n")
        for c, p in enumerate(parts):
            for w in p[k]:
                for s in range(0, len(w) - T + 1, stride):
                    f.write(",".join(str(vocab.get(x, 1)) for x in w[s:s + T]) + f",{c}\n")
PY
ntrain=$(($(wc -l < "$tmp/train.csv") - 1)) ntest=$(($(wc -l < "$tmp/test.csv") - 1))
recipe() { # recipe FILE [EXTRA-DATA-LINE]: the classifier, 3 epochs of batch 32
  {
    printf '[data]\ndataset = csv\ntrain_csv = %s/train.csv\ntest_csv = %s/test.csv\nlabel_column = label\n' "$tmp" "$tmp"
    [ $# -gt 1 ] && printf '%s\n' "$2"
    printf '[model]\ninput = 32\nlayer = embedding 256 8\nlayer = layernorm\nlayer = flatten\nlayer = dropout 0.3\n'
    printf 'layer = linear 4\n[train]\nepochs = 3\nbatch = 32\nseed = 7\n[optimizer]\nname = adamw\nlr = 0.01\n'
    printf 'weight_decay = 0.01\n'
  } > "$1"
}
recipe "$tmp/lic.ini"

# ---- training: the loss falls, the test accuracy beats the commonest class ----
if "$bin" train "$tmp/lic.ini" --out "$tmp/m" --json --threads 2 > "$tmp/train.json" 2> "$tmp/train.err"; then
  ok "fathom train of the embedding recipe ($ntrain training windows, $ntest test windows)"
else
  bad "fathom train of the embedding recipe: $(cat "$tmp/train.err")"
  cli_end cli_embedding
fi
"$py" - "$tmp" <<'PY' || bad "training result (above)"
import csv, json, math, re, sys
d = sys.argv[1]
j = json.load(open(f"{d}/train.json"))
ep = [float(x) for x in re.findall(r"epoch \d+/3\s+loss ([0-9.]+)", open(f"{d}/train.err").read())]
labels = [r["label"] for r in csv.DictReader(open(f"{d}/test.csv"))]
base = max(labels.count(c) for c in set(labels)) / len(labels)
print(f"epoch losses {ep}, test accuracy {j['test_accuracy']:.4f} (commonest class: {base:.4f}), test loss {j['test_loss']:.4f}")
ok = (len(ep) == 3 and ep[0] < math.log(4) and ep[2] < 0.5 * ep[0] and j["test_loss"] < math.log(4)
      and j["test_accuracy"] >= base + 0.06)
sys.exit(0 if ok else 1)
PY
[ $? = 0 ] && ok "the training loss falls below ln 4 and the held-out accuracy beats the commonest class"

# ---- checkpoint and resume: stopped at step 40 (mid-epoch), resumed, equal bit for bit ----
"$bin" train "$tmp/lic.ini" --out "$tmp/r" --stop-after 40 --no-eval --threads 2 --quiet > /dev/null 2>&1 ||
  bad "the run stopped at step 40"
if "$bin" train "$tmp/lic.ini" --resume "$tmp/r" --no-eval --threads 2 --quiet > /dev/null 2> "$tmp/resume.err" &&
   cmp -s "$tmp/m/model.safetensors" "$tmp/r/model.safetensors"; then
  ok "stopped at step 40 and resumed: model.safetensors equal to the straight run's"
else
  bad "resume: $(cat "$tmp/resume.err"); the models differ or one is missing"
fi

# ---- the checked test device (docs/DEVICES.md): ids staged to a device, the CPU's model bit for bit ----
if "$bin" train "$tmp/lic.ini" --out "$tmp/dev" --device check --no-eval --threads 2 --quiet > /dev/null 2> "$tmp/dev.err" &&
   cmp -s "$tmp/m/model.safetensors" "$tmp/dev/model.safetensors"; then
  ok "--device check: model.safetensors equal to the CPU run's"
else
  bad "--device check: $(cat "$tmp/dev.err"); the models differ or one is missing"
fi

# ---- eval and predict ----
acc=$("$bin" eval "$tmp/m" --json --quiet | "$py" -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])')
tacc=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["test_accuracy"])' "$tmp/train.json")
[ -n "$acc" ] && [ "$acc" = "$tacc" ] && ok "fathom eval: test accuracy $acc, the trainer's" ||
  bad "fathom eval gave '$acc', the trainer $tacc"
expect 0 "samples" "$bin" eval "$tmp/m" --data "$tmp/train.csv"
"$py" - "$tmp" <<'PY' || bad "writing the predict inputs"
import csv, sys, numpy as np
d = sys.argv[1]
rows = list(csv.DictReader(open(f"{d}/test.csv")))[::37][:8]
ids = np.array([[int(r[f"t{i}"]) for i in range(32)] for r in rows], dtype=np.int64)
np.save(f"{d}/ids.npy", ids)
with open(f"{d}/ids.csv", "w") as f:
    f.write("\n".join(",".join(map(str, r)) for r in ids) + "\n")
PY
"$bin" predict "$tmp/m" "$tmp/ids.csv" --json > "$tmp/pred_csv.json" 2> "$tmp/pred.err" || bad "predict ids.csv: $(cat "$tmp/pred.err")"
"$bin" predict "$tmp/m" "$tmp/ids.npy" --json > "$tmp/pred_npy.json" 2> "$tmp/pred.err" || bad "predict ids.npy: $(cat "$tmp/pred.err")"

# ---- fathom serve: the model takes INT64 ids, a bad id is the request's own 400 ----
mkdir -p "$tmp/repo/lic/1" && cp "$tmp/m/model.safetensors" "$tmp/repo/lic/1/"
"$py" - "$bin" "$tmp" <<'PY' && ok "fathom serve: INT64 ids in, the predictions of fathom predict; bad ids and FP32 refused (400)" ||
import http.client, json, math, subprocess, sys, time
binary, d = sys.argv[1], sys.argv[2]
log = open(f"{d}/serve.log", "w")
p = subprocess.Popen([binary, "serve", "--model-repository", f"{d}/repo", "--port", "0", "--metrics-port", "0"],
                     stdout=subprocess.DEVNULL, stderr=log)
def req(port, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST" if body else "GET", path, body=json.dumps(body) if body else None)
    r = c.getresponse(); data = json.loads(r.read() or b"null"); c.close()
    return r.status, data
try:
    port = None
    for _ in range(600):
        text = open(f"{d}/serve.log").read()
        if "listening on" in text:
            port = int(text.split("http://127.0.0.1:")[1].split()[0]); break
        time.sleep(0.05)
    assert port, "the server did not start: " + open(f"{d}/serve.log").read()
    st, meta = req(port, "/v2/models/lic")
    assert st == 200 and meta["inputs"] == [{"name": "input", "datatype": "INT64", "shape": [-1, 32]}], meta
    ids = [[int(v) for v in l.split(",")] for l in open(f"{d}/ids.csv").read().split()]
    body = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [len(ids), 32], "data": sum(ids, [])}]}
    st, out = req(port, "/v2/models/lic/infer", body)
    assert st == 200, out
    logits = out["outputs"][0]["data"]
    pred = json.load(open(f"{d}/pred_npy.json"))["predictions"]
    worst = 0.0
    for i, q in enumerate(pred):
        row = logits[4 * i:4 * i + 4]
        e = [math.exp(v - max(row)) for v in row]
        assert row.index(max(row)) == q["class"], (i, row, q)
        worst = max(worst, abs(e[q["class"]] / sum(e) - q["probability"]))
    assert worst <= 1e-5, worst
    bad_ids = [r[:] for r in ids[:2]]; bad_ids[1][31] = 256
    st, out = req(port, "/v2/models/lic/infer", {"inputs": [{"name": "input", "datatype": "INT64", "shape": [2, 32],
                                                               "data": sum(bad_ids, [])}]})
    assert st == 400 and "sample 1, position 31: 256 is not a token id" in out["error"], (st, out)
    st, out = req(port, "/v2/models/lic/infer", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32],
                                                               "data": [float(v) for v in ids[0]]}]})
    assert st == 400 and "does not match the model's INT64" in out["error"], (st, out)
    print(f"served {len(ids)} rows: classes equal to fathom predict's, probabilities within {worst:.1e}")
finally:
    p.terminate(); p.wait(30)
PY
  bad "fathom serve of the embedding model (above; log: $(tail -3 "$tmp/serve.log"))"

# the compiled graph runs as the model: the same test accuracy, the same predictions
"$bin" compile "$tmp/m" -o "$tmp/g" > /dev/null 2>&1 || bad "fathom compile of the embedding model"
gacc=$("$bin" eval "$tmp/g" --json --quiet | "$py" -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])')
[ -n "$gacc" ] && [ "$gacc" = "$tacc" ] && ok "the compiled graph's test accuracy is the model's ($gacc)" ||
  bad "compiled graph: test accuracy '$gacc', the model's $tacc"
"$bin" predict "$tmp/g" "$tmp/ids.csv" > "$tmp/pred_g.txt" 2>&1 && "$bin" predict "$tmp/m" "$tmp/ids.csv" > "$tmp/pred_m.txt" 2>&1 &&
  cmp -s "$tmp/pred_g.txt" "$tmp/pred_m.txt" && ok "predict: the compiled graph gives the model's classes and probabilities" ||
  bad "predict through the graph: $(cat "$tmp/pred_g.txt")"

# ---- export: onnx.checker, ONNX Runtime against fathom ----
if "$bin" export "$tmp/m" -o "$tmp/m.onnx" > /dev/null 2> "$tmp/export.err"; then
  ok "fathom export of the trained embedding model"
else
  bad "fathom export: $(cat "$tmp/export.err")"
fi
if ! "$py" -c "import onnx, onnxruntime, numpy, safetensors.numpy" 2>/dev/null; then
  echo "SKIP: the ONNX Runtime check (python modules onnx, onnxruntime, numpy or safetensors missing)"
elif [ -s "$tmp/m.onnx" ]; then
  "$bin" run "$tmp/m.onnx" --input "$tmp/ids.npy" --output "$tmp/run" > /dev/null 2> "$tmp/run.err" ||
    bad "fathom run of the exported file: $(cat "$tmp/run.err")"
  "$py" - "$tmp" <<'PY' || bad "the exported model against ONNX Runtime (above)"
import glob, json, sys, numpy as np, onnx, onnxruntime as ort
from safetensors.numpy import load_file
d = sys.argv[1]
m = onnx.load(f"{d}/m.onnx")
onnx.checker.check_model(m, full_check=True)
ids = np.load(f"{d}/ids.npy")
s = ort.InferenceSession(f"{d}/m.onnx", providers=["CPUExecutionProvider"])
inp = s.get_inputs()[0]
(ref,) = s.run(None, {inp.name: ids})
mine = np.load(glob.glob(f"{d}/run/*.npy")[0])
w = {k: v.astype(np.float64) for k, v in load_file(f"{d}/m/model.safetensors").items()}
e = w["0.weight"][ids]
e = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-5) * w["1.weight"] + w["1.bias"]
want = e.reshape(len(ids), -1) @ w["4.weight"].T + w["4.bias"]
rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
p = np.exp(ref - ref.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
worst_p = 0.0
for f in ("pred_csv", "pred_npy"):
    pr = json.load(open(f"{d}/{f}.json"))["predictions"]
    assert [q["class"] for q in pr] == list(ref.argmax(1)), f"{f}: classes {[q['class'] for q in pr]} vs {ref.argmax(1)}"
    worst_p = max(worst_p, max(abs(q["probability"] - p[i, q["class"]]) for i, q in enumerate(pr)))
ops = sorted({n.op_type for n in m.graph.node})
print(f"exported: input {inp.name} {inp.type} {inp.shape}, ops {' '.join(ops)}; ONNX Runtime vs fathom run max rel "
      f"diff {rel(mine, ref):.2e}, vs numpy on the weights {rel(ref, want):.2e}; predict's probabilities (trained "
      f"model) vs ONNX Runtime's softmax: max abs diff {worst_p:.2e}")
ok = (rel(mine, ref) <= 1e-5 and rel(ref, want) <= 1e-5 and worst_p <= 1e-5 and inp.type == "tensor(int64)"
      and inp.shape[0] == "batch" and "Gather" in ops and ref.shape == (len(ids), 4))
sys.exit(0 if ok else 1)
PY
fi

# ---- a bag of words: embedding, then meanpool (the mean over the 32 token vectors), then linear ----
bow=$tmp/bow.ini
sed -e 's/^layer = embedding 256 8$/layer = embedding 256 16/' -e '/^layer = layernorm$/d' -e '/^layer = dropout 0.3$/d' \
  -e 's/^layer = flatten$/layer = meanpool/' "$tmp/lic.ini" > "$bow"
if grep -q '^layer = meanpool$' "$bow" && "$bin" train "$bow" --out "$tmp/bow" --json --threads 2 > "$tmp/bow.json" 2> "$tmp/bow.err"; then
  "$py" - "$tmp" <<'PY' && ok "meanpool: the bag-of-words classifier trains and beats the commonest class" || bad "meanpool training (above)"
import csv, json, math, sys
d = sys.argv[1]
j, p = json.load(open(f"{d}/bow.json")), json.load(open(f"{d}/train.json"))
labels = [r["label"] for r in csv.DictReader(open(f"{d}/test.csv"))]
base = max(labels.count(c) for c in set(labels)) / len(labels)
print(f"bag of words: test accuracy {j['test_accuracy']:.4f}, loss {j['test_loss']:.4f} (positional model "
      f"{p['test_accuracy']:.4f}, {p['test_loss']:.4f}; commonest class {base:.4f})")
sys.exit(0 if j["test_loss"] < math.log(4) and j["test_accuracy"] >= base + 0.06 else 1)
PY
else
  bad "fathom train of the meanpool recipe: $(cat "$tmp/bow.err")"
fi
"$bin" compile "$tmp/bow" -o "$tmp/bowg" > /dev/null 2>&1 || bad "fathom compile of the meanpool model"
"$bin" predict "$tmp/bowg" "$tmp/ids.csv" > "$tmp/bow_g.txt" 2>&1 && "$bin" predict "$tmp/bow" "$tmp/ids.csv" > "$tmp/bow_m.txt" 2>&1 &&
  cmp -s "$tmp/bow_g.txt" "$tmp/bow_m.txt" && ok "meanpool: the compiled graph gives the model's classes and probabilities" ||
  bad "meanpool: predict through the graph: $(cat "$tmp/bow_g.txt")"
"$bin" predict "$tmp/bow" "$tmp/ids.npy" --json > "$tmp/bow_pred.json" 2> "$tmp/bow.err" || bad "meanpool predict: $(cat "$tmp/bow.err")"
if ! "$bin" export "$tmp/bow" -o "$tmp/bow.onnx" > /dev/null 2> "$tmp/bow.err"; then
  bad "fathom export of the meanpool model: $(cat "$tmp/bow.err")"
elif "$py" -c "import onnx, onnxruntime, numpy, safetensors.numpy" 2>/dev/null; then
  "$py" - "$tmp" <<'PY' && ok "meanpool: exported (ReduceMean), ONNX Runtime = numpy = fathom predict within 1e-5" || bad "meanpool export (above)"
import json, sys, numpy as np, onnx, onnxruntime as ort
from safetensors.numpy import load_file
d = sys.argv[1]
m = onnx.load(f"{d}/bow.onnx")
onnx.checker.check_model(m, full_check=True)
ids = np.load(f"{d}/ids.npy")
s = ort.InferenceSession(f"{d}/bow.onnx", providers=["CPUExecutionProvider"])
(ref,) = s.run(None, {s.get_inputs()[0].name: ids})
w = {k: v.astype(np.float64) for k, v in load_file(f"{d}/bow/model.safetensors").items()}
want = w["0.weight"][ids].mean(1) @ w["2.weight"].T + w["2.bias"]
rel = float(np.max(np.abs(ref - want)) / np.max(np.abs(want)))
p = np.exp(ref - ref.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
pr = json.load(open(f"{d}/bow_pred.json"))["predictions"]
assert [q["class"] for q in pr] == list(ref.argmax(1)), ([q["class"] for q in pr], ref.argmax(1))
worst_p = max(abs(q["probability"] - p[i, q["class"]]) for i, q in enumerate(pr))
ops = sorted({n.op_type for n in m.graph.node})
print(f"meanpool export: ops {' '.join(ops)}; ONNX Runtime vs numpy max rel diff {rel:.2e}; predict vs ORT softmax {worst_p:.2e}")
sys.exit(0 if rel <= 1e-5 and worst_p <= 1e-5 and "ReduceMean" in ops else 1)
PY
else
  echo "SKIP: the meanpool ONNX Runtime check (python modules onnx, onnxruntime, numpy or safetensors missing)"
fi
"$bin" plan --model "$bow" --json > "$tmp/bow_plan.json" 2> "$tmp/bow.err" && ok "fathom plan of the meanpool recipe" ||
  bad "fathom plan of the meanpool recipe: $(cat "$tmp/bow.err")"
# meanpool takes token vectors [batch, tokens, dim]: after flatten it is refused when the model is built
sed 's/^layer = linear 4$/layer = meanpool\nlayer = linear 4/' "$tmp/lic.ini" > "$tmp/mp_bad.ini"
expect 1 "mp_bad.ini:12: layer 4 ('meanpool') does not fit: meanpool expects [batch, tokens, dim] with tokens >= 1, got [1, 256]" \
  "$bin" train "$tmp/mp_bad.ini" --out "$tmp/bad-out"

# ---- refusals: what was wrong, where, and what to do ----
sed '3s/^\([0-9]*\),/300,/' "$tmp/train.csv" > "$tmp/bad_id.csv"
sed '5s/^\([0-9]*\),/2.5,/' "$tmp/train.csv" > "$tmp/frac_id.csv"
recipe "$tmp/bad.ini"; sed -i "s|$tmp/train.csv|$tmp/bad_id.csv|" "$tmp/bad.ini"
expect 1 "bad_id.csv: sample 1, position 0: 300 is not a token id of layer 'embedding 256 8' (whole numbers in [0, 256)" \
  "$bin" train "$tmp/bad.ini" --out "$tmp/bad-out"
[ -e "$tmp/bad-out/model.safetensors" ] && bad "a refused run wrote a model"
recipe "$tmp/frac.ini"; sed -i "s|$tmp/train.csv|$tmp/frac_id.csv|" "$tmp/frac.ini"
expect 1 "frac_id.csv: sample 3, position 0: 2.5 is not a token id" "$bin" train "$tmp/frac.ini" --out "$tmp/bad-out"
recipe "$tmp/norm.ini" "normalize = 0.5 0.25"
expect 1 "normalize, crop_padding and hflip are image transforms, but the first layer, 'embedding 256 8', takes token ids" \
  "$bin" train "$tmp/norm.ini" --out "$tmp/bad-out"
cli_images "$tmp" 32 16
{ cli_idx_data "$tmp"; printf '[model]\ninput = 1 8 8\nlayer = embedding 16 3\nlayer = flatten\nlayer = linear 4\n'; } > "$tmp/img.ini"
expect 1 "takes token ids, but dataset = idx gives images (floats): give the ids as a table with dataset = csv" \
  "$bin" train "$tmp/img.ini" --out "$tmp/bad-out"
sed 1d "$tmp/test.csv" | head -3 > "$tmp/with_label.csv"
expect 1 "with_label.csv: 33 columns, but the model takes 32 values per sample" "$bin" predict "$tmp/m" "$tmp/with_label.csv"
{ seq -s, 1 31 | tr -d '\n'; echo ,256; } > "$tmp/big.csv"
expect 1 "big.csv: sample 0, position 31: 256 is not a token id" "$bin" predict "$tmp/m" "$tmp/big.csv"
# summary: the input is I64 token ids (8 bytes each), not f32 (it said half: 4 bytes)
ib=$("$bin" summary "$tmp/lic.ini" --json 2> /dev/null | "$py" -c 'import json, sys; j = json.load(sys.stdin); print(int(j["input_bytes"]), j["input_shape"][0] * j["input_shape"][1] * 8)')
set -- $ib
[ -n "$ib" ] && [ "$1" = "$2" ] && ok "fathom summary sizes the input as I64 ids ($1 bytes)" || bad "fathom summary input_bytes: '$ib' (bytes, batch x 32 x 8)"
# the planner runs the step on I64 ids and reads the CSV tables as the trainer does
"$bin" plan --model "$tmp/lic.ini" --json > "$tmp/plan.json" 2> "$tmp/plan.err" && ok "fathom plan of the embedding recipe" ||
  bad "fathom plan of the embedding recipe: $(cat "$tmp/plan.err")"
cli_end cli_embedding
