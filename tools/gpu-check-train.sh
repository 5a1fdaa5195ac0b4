#!/usr/bin/env bash
# The training half of tools/gpu-check.sh: `fathom train` through the CLI on DEVICE
# and on the CPU, the two loss curves compared, and GPT-2 124M-shaped bf16 training
# side by side with PyTorch (bench/bench_gpt2_gpu.py) on the same GPU.
#   usage: tools/gpu-check-train.sh FATHOM_BIN DEVICE OUT_DIR [--no-gpt2]
# DEVICE is cuda (the GPU run) or check (the checked test device: how this script is
# tested on a machine without a GPU). Generation: the small GPT's `fathom generate` on DEVICE in
# fp32 and bf16 (each must run and print text). Curves: fashion-mlp (100 steps), fashion-cnn
# (60 steps), a small GPT on a generated corpus (60 steps) and kjv-gpt (100 steps; the corpus
# from GPU_CHECK_KJV or the `bible` program), each with --logdir;
# the train/loss points of DEVICE's run against the CPU's must have an NMSE
# (sum (d - c)^2 / sum c^2) of at most 1e-3 (fp32 on both sides: only the order of
# floating-point sums differs; the check device must match bit for bit anyway).
# A run that fails, a missing curve or a curve over the bound is a FAIL line and a
# non-zero exit. Writes OUT_DIR/train_summary.txt (also printed).
# GPU_CHECK_GPT2_SMOKE=1 runs the GPT-2 part at a tiny shape (2 x 64, T = 32) with
# PyTorch on the CPU, uncompiled: how that part is tested without a GPU.
# GPU_CHECK_DEVICE_EXTRA="--lr 0.5" adds flags to the device runs only: a way to see
# that a real difference is caught (the check fails).
set -uo pipefail
bin=${1:?usage: gpu-check-train.sh FATHOM_BIN DEVICE OUT_DIR [--no-gpt2]}
dev=${2:?device}
out=${3:?out dir}
gpt2=1
[[ ${4:-} == --no-gpt2 ]] && gpt2=0
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
BOUND=1e-3
mkdir -p "$out"
fails=0
rows=()
note() { echo "[gpu-check-train $(date +%H:%M:%S)] $*"; }
fail() { note "FAIL: $*"; fails=$((fails + 1)); }

# scalars of one tag from the TensorBoard event files in a log dir, as JSON [[step, value], ...]
read_curve() { # LOGDIR TAG
  "$PY" - "$1" "$2" <<'PY'
import glob, json, os, struct, sys
def varint(b, i):
    s = r = 0
    while True:
        c = b[i]; i += 1; r |= (c & 0x7F) << s; s += 7
        if c < 0x80: return r, i
def fields(b):  # (field, wire type, value) of one protobuf message
    i = 0
    while i < len(b):
        k, i = varint(b, i); f, w = k >> 3, k & 7
        if w == 0: v, i = varint(b, i)
        elif w == 1: v = b[i:i + 8]; i += 8
        elif w == 2: n, i = varint(b, i); v = b[i:i + n]; i += n
        elif w == 5: v = b[i:i + 4]; i += 4
        else: raise ValueError("wire type %d" % w)
        yield f, w, v
pts = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "**", "events.out.tfevents.*"), recursive=True)):
    raw = open(p, "rb").read(); i = 0
    while i + 12 <= len(raw):
        n = struct.unpack("<Q", raw[i:i + 8])[0]; ev = raw[i + 12:i + 12 + n]; i += 12 + n + 4
        step = 0; vals = []
        for f, w, v in fields(ev):
            if f == 2 and w == 0: step = v
            if f == 5 and w == 2:  # Summary
                for f2, w2, v2 in fields(v):
                    if f2 != 1: continue
                    tag = val = None
                    for f3, w3, v3 in fields(v2):
                        if f3 == 1: tag = v3.decode()
                        if f3 == 2 and w3 == 5: val = struct.unpack("<f", v3)[0]
                    if tag == sys.argv[2] and val is not None: vals.append(val)
        for v in vals: pts[step] = v
print(json.dumps(sorted(pts.items())))
PY
}

# NAME RECIPE ARGS...: trains on the cpu and on $dev with the same flags, compares the curves
compare() {
  local name=$1 recipe=$2; shift 2
  local ok=1 d
  for d in cpu "$dev"; do
    local t0=$SECONDS extra=()
    [[ $d != cpu && -n ${GPU_CHECK_DEVICE_EXTRA:-} ]] && read -ra extra <<<"$GPU_CHECK_DEVICE_EXTRA"
    if ! timeout 300 "$bin" train "$recipe" "$@" "${extra[@]}" --device "$d" --out "$out/$name-$d" --logdir "$out/$name-$d.log" --json \
        >"$out/$name-$d.json" 2>"$out/$name-$d.err"; then
      fail "$name on $d: exit $? ($(tail -2 "$out/$name-$d.err" | tr '\n' ' '))"; ok=0
    else
      note "$name on $d: $((SECONDS - t0)) s"
    fi
  done
  ((ok)) || { rows+=("$name|-|-|-|FAIL (run)"); return; }
  read_curve "$out/$name-cpu.log" train/loss >"$out/$name-cpu.curve" || fail "$name: cannot read the cpu curve"
  read_curve "$out/$name-$dev.log" train/loss >"$out/$name-$dev.curve" || fail "$name: cannot read the $dev curve"
  local line
  line=$("$PY" - "$out/$name-cpu.curve" "$out/$name-$dev.curve" "$BOUND" <<'PY'
import json, sys
c, d, bound = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
cs, ds = dict(c), dict(d)
if not c or [s for s, _ in c] != [s for s, _ in d]:
    print(f"{len(c)}|-|-|FAIL (steps differ: cpu {[s for s, _ in c]} vs device {[s for s, _ in d]})"); sys.exit()
num = sum((ds[s] - cs[s]) ** 2 for s in cs); den = sum(v * v for v in cs.values())
nmse = num / den if den else float("inf")
last = c[-1][0]
verdict = "ok" if nmse <= bound else f"FAIL (> {bound:g})"
print(f"{len(c)}|{cs[last]:.6f}|{ds[last]:.6f}|{nmse:.3e}|{verdict}")
PY
)
  rows+=("$name|$line")
  [[ $line == *FAIL* || -z $line ]] && fail "$name: loss curves: ${line:-no comparison}"
}

# ---- the curves ----
compare fashion-mlp fashion-mlp --steps 100 --batch 64 --no-eval --seed 1
compare fashion-cnn fashion-cnn --steps 60 --batch 64 --no-eval --seed 1
"$PY" - "$out/corpus.txt" <<'PY'
import random, sys
r = random.Random(7); w = ("in the beginning god created the heaven and the earth and the earth was without form "
                           "and void and darkness was upon the face of the deep").split()
open(sys.argv[1], "w").write("\n".join(" ".join(r.choice(w) for _ in range(14)) for _ in range(3000)))
PY
printf '[model]\ntype = gpt\narch = gpt2\nn_layer = 2\nn_head = 4\nn_embd = 64\nffn_hidden = 256\nblock_size = 64\n[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n[train]\nbatch_size = 8\nsteps = 60\neval_every = 0\nlog_every = 5\n' "$out" >"$out/small-gpt.ini"
compare small-gpt "$out/small-gpt.ini" --seed 1
# ---- generation on the device (#15: every model generates on the device from the same command) ----
# The small GPT trained on the CPU, greedy (temperature 0), 24 tokens: fp32 on $dev must run and
# print text, and its text against the CPU's is reported (informational: a near tie between two
# tokens may break either way when only the order of sums differs); bf16 (`--precision bf16`) on
# $dev must run and print text too.
gen_row() { # PRECISION DEVICE -> the generated text in $out/gen-PRECISION-DEVICE.txt
  timeout 120 "$bin" generate "$out/small-gpt-cpu" --prompt "in the beginning" --tokens 24 --temperature 0 \
    --precision "$1" --device "$2" --quiet >"$out/gen-$1-$2.txt" 2>"$out/gen-$1-$2.err"
}
if [[ -d $out/small-gpt-cpu ]]; then
  for spec in "fp32 cpu" "fp32 $dev" "bf16 $dev"; do
    read -r p d <<<"$spec"
    if gen_row "$p" "$d" && [[ $(wc -c <"$out/gen-$p-$d.txt") -gt 17 ]]; then
      note "generate --precision $p --device $d: ok"
    else
      fail "generate --precision $p --device $d: $(tail -2 "$out/gen-$p-$d.err" | tr '\n' ' ')"
    fi
  done
  if cmp -s "$out/gen-fp32-cpu.txt" "$out/gen-fp32-$dev.txt"; then note "generate: fp32 text on $dev equals the CPU's"
  else note "generate: fp32 text on $dev differs from the CPU's (informational): $(head -c 80 "$out/gen-fp32-$dev.txt" | tr '\n' ' ')"; fi
else
  fail "generate: no model from the small-gpt cpu run"
fi
# kjv-gpt itself (#15 names it), 100 steps logged every 10: its corpus from GPU_CHECK_KJV (a text
# file: tools/gpu-bundle.sh carries one to a GPU machine without the `bible` program), else `bible`
sed 's/^steps = .*/steps = 100/; s/^log_every = .*/log_every = 10/; s/^eval_every = .*/eval_every = 0/' \
  "$ROOT/data/recipes/kjv-gpt.ini" >"$out/kjv-gpt.ini"
if [[ -n ${GPU_CHECK_KJV:-} && -s ${GPU_CHECK_KJV:-} ]]; then
  compare kjv-gpt "$out/kjv-gpt.ini" --corpus "$GPU_CHECK_KJV" --seed 1
elif command -v bible >/dev/null 2>&1; then
  compare kjv-gpt "$out/kjv-gpt.ini" --seed 1
else
  fail "kjv-gpt: no KJV corpus (set GPU_CHECK_KJV to a text file, or apt-get install bible-kjv)"
  rows+=("kjv-gpt|-|-|-|FAIL (no corpus)")
fi

# ---- GPT-2 124M shape, bf16, fathom vs PyTorch on the same GPU ----
# The layers are GPT-2 124M's (12 x 768, 12 heads, T = 1024, batch 8); the vocabulary is
# the corpus's (fathom's tokenizers are trained on the corpus: a char tokenizer here), and
# PyTorch is given the same vocabulary, so both train the same network.
g2=""
smoke=${GPU_CHECK_GPT2_SMOKE:-0}
L=12 D=768 H=12 T=1024 B=8 torch_args=()
((smoke)) && { L=2 D=64 H=2 T=32 B=2 torch_args=(--device cpu --no-compile --steps 2 --warmup 1); }
if ((gpt2)) && [[ $dev == cuda* || $smoke == 1 ]]; then
  "$PY" - "$out/corpus-large.txt" <<'PY'
import random, sys
r = random.Random(11); w = [chr(97 + i % 26) * (1 + i % 7) for i in range(400)]
open(sys.argv[1], "w").write("\n".join(" ".join(r.choice(w) for _ in range(20)) for _ in range(40000)))
PY
  printf '[model]\ntype = gpt\narch = gpt2\nn_layer = %d\nn_head = %d\nn_embd = %d\nffn_hidden = %d\nblock_size = %d\n[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus-large.txt\n[train]\nbatch_size = %d\nsteps = 25\neval_every = 0\nlog_every = 5\n' \
    "$L" "$H" "$D" $((4 * D)) "$T" "$out" "$B" >"$out/gpt2.ini"
  if timeout 300 "$bin" train "$out/gpt2.ini" --device "$dev" --precision bf16 --out "$out/gpt2-fathom" --json --quiet \
      >"$out/gpt2-fathom.json" 2>"$out/gpt2-fathom.err"; then
    vocab=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$out/gpt2-fathom/config.json" 2>/dev/null)
    [[ -n $vocab ]] || { fail "gpt2: no vocab_size in $out/gpt2-fathom/config.json"; vocab=100; }
    timeout 300 "$PY" "$ROOT/bench/bench_gpt2_gpu.py" --vocab "$vocab" --batch "$B" --seq "$T" --layers "$L" --width "$D" \
      --heads "$H" --steps 20 --warmup 5 "${torch_args[@]}" \
      >"$out/gpt2-torch.json" 2>"$out/gpt2-torch.err" || fail "gpt2: bench_gpt2_gpu.py exit $? ($(tail -2 "$out/gpt2-torch.err" | tr '\n' ' '))"
  else
    fail "gpt2: fathom train on $dev: exit $? ($(tail -2 "$out/gpt2-fathom.err" | tr '\n' ' '))"
  fi
  g2=$("$PY" - "$out/gpt2-fathom.json" "$out/gpt2-torch.json" <<'PY'
import json, sys
def load(p):
    try: return json.loads(open(p).read().strip().splitlines()[-1])
    except Exception: return {}
f, t = load(sys.argv[1]), load(sys.argv[2])
ft, tt = f.get("tokens_per_second"), t.get("tokens_per_s")
fm, tm = f.get("peak_memory_bytes"), t.get("peak_mem_gib")
ratio = f"{ft / tt:.2f}" if ft and tt else "-"
fgib = f"{fm / 2**30:.3f}" if fm else "-"
peer = "torch.compile" if t.get("compile") else "torch (eager)"
print(f"gpt2 {'124M' if f.get('num_params', 0) > 50e6 else 'smoke'}-shape bf16, vocab {t.get('vocab', '?')}: "
      f"fathom {ft or 0:.0f} tok/s, peak {fgib} GiB ({f.get('num_params', '?')} params) | {peer} {tt or 0:.0f} tok/s, "
      f"MFU {t.get('mfu', '-')}, peak {tm if tm is not None else '-'} GiB ({t.get('params', '?')} params) | "
      f"fathom/torch tokens/s {ratio}")
bad = []
if not ft or not tt: bad.append("a side reported no tokens/s")
if f.get("num_params") != t.get("params"): bad.append("the two sides' parameter counts differ: not the same network")
if not t.get("loss_is_finite", False): bad.append("PyTorch's loss is not finite")
if f.get("train_loss") is None or f["train_loss"] != f["train_loss"]: bad.append("fathom's loss is not finite")
if bad: print("FAIL: gpt2: " + "; ".join(bad))
PY
)
  [[ $g2 == *FAIL* ]] && fail "gpt2 comparison: ${g2##*FAIL: }"
  # where the step's time goes: 6 steps with every launch synchronous (CUDA_LAUNCH_BLOCKING=1,
  # so each op's host span holds its kernels), `fathom profile`'s table; then the tokens/s of
  # the tensor-core attention (FATHOM_CUDA_ATTENTION=mma) beside the default's
  if [[ $dev == cuda* ]]; then
    sed 's/^steps = .*/steps = 6/' "$out/gpt2.ini" >"$out/gpt2-prof.ini"
    if CUDA_LAUNCH_BLOCKING=1 timeout 200 "$bin" train "$out/gpt2-prof.ini" --device "$dev" --precision bf16 --out "$out/gpt2-prof" \
        --profile "$out/gpt2-step.trace.json" --quiet >/dev/null 2>"$out/gpt2-prof.err" &&
       "$bin" profile "$out/gpt2-step.trace.json" >"$out/gpt2-step-profile.txt" 2>&1; then
      note "gpt2 step profile (launches synchronous): $out/gpt2-step-profile.txt"
      g2="$g2
gpt2 step profile, 6 steps, launches synchronous (fathom profile $out/gpt2-step.trace.json):
$(head -32 "$out/gpt2-step-profile.txt")"
    else
      note "gpt2 step profile: failed ($(tail -2 "$out/gpt2-prof.err" | tr '\n' ' '))"
    fi
    # the trained GPT-2-shape model as an inference graph on the GPU: a 1024-token prefill of 8
    # sequences (fathom bench; informational, no peer in this script)
    if b=$(timeout 200 "$bin" bench "$out/gpt2-fathom" --device "$dev" --batch 8 --dim seq=1024 --dim past=0 --iters 10 --json 2>&1); then
      g2="$g2
gpt2-shape inference, prefill 8 x 1024 on $dev (fathom bench): $(echo "$b" | "$PY" -c 'import json, sys
r = json.loads(sys.stdin.read())
print("median %.2f ms, p90 %.2f ms, %.0f tokens/s" % (r["median_ms"], r["p90_ms"], 8 * 1024 / (r["median_ms"] / 1e3)))' 2>&1)"
    else
      g2="$g2
gpt2-shape inference on $dev (fathom bench): failed: $(echo "$b" | tail -2 | tr '\n' ' ')"
    fi
    if FATHOM_CUDA_ATTENTION=mma timeout 300 "$bin" train "$out/gpt2.ini" --device "$dev" --precision bf16 --out "$out/gpt2-mma" --json --quiet \
        >"$out/gpt2-mma.json" 2>"$out/gpt2-mma.err"; then
      mma=$("$PY" -c 'import json, sys
f = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%.0f tok/s, loss %s" % (f.get("tokens_per_second") or 0, f.get("train_loss")))' "$out/gpt2-mma.json" 2>&1)
      g2="$g2
gpt2 with the tensor-core attention (FATHOM_CUDA_ATTENTION=mma): $mma"
    else
      fail "gpt2 with FATHOM_CUDA_ATTENTION=mma: exit $? ($(tail -2 "$out/gpt2-mma.err" | tr '\n' ' '))"
    fi
  fi
fi

# ---- summary ----
{
  echo "=== training through the CLI: $dev vs cpu (train/loss curves, NMSE bound $BOUND) ==="
  printf '%-12s %6s %12s %12s %11s  %s\n' run points cpu_last "${dev}_last" nmse verdict
  for r in "${rows[@]}"; do
    IFS='|' read -r n p a b e v <<<"$r"
    printf '%-12s %6s %12s %12s %11s  %s\n' "$n" "$p" "$a" "$b" "$e" "$v"
  done
  [[ -n $g2 ]] && echo "$g2"
  if ((fails)); then echo "training check: $fails FAILURE(S)"; else echo "training check: all passed"; fi
} | tee "$out/train_summary.txt"
((fails == 0))
