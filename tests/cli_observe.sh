#!/usr/bin/env bash
# `fathom profile`, `fathom plot` and `fathom summary` from the outside: exit
# codes (0 ok, 1 runtime failure, 2 bad usage), clear errors on bad input,
# --json validity, truncated traces, and TensorBoard files read back by
# TensorBoard itself when it is installed (tools/read_tensorboard.py).
# Usage: bash tests/cli_observe.sh /path/to/fathom   (run from the repository root)
set -u
FATHOM=${1:?usage: cli_observe.sh /path/to/fathom}
BIN=$(dirname "$FATHOM")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0 skips=0
# a part that cannot run here: the reason is printed, and the test exits 77 (ctest: Skipped)
# unless something failed -- the rule of tests/test_util.h
skip() { echo "SKIP: $*"; skips=$((skips + 1)); }

# expect CODE "needle in stdout or stderr" -- fathom args...
expect() {
    local code=$1 needle=$2
    shift 2
    "$FATHOM" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ "$rc" != "$code" ]; then
        echo "FAIL: fathom $* -> exit $rc, expected $code"; sed 's/^/  /' "$TMP/err" | head -5
        fails=$((fails + 1)); return
    fi
    if [ -n "$needle" ] && ! grep -qF -- "$needle" "$TMP/out" "$TMP/err"; then
        echo "FAIL: fathom $* -> output lacks: $needle"; sed 's/^/  /' "$TMP/out" "$TMP/err" | head -8
        fails=$((fails + 1))
    fi
}

# ---- profile ----
cat >"$TMP/trace.json" <<'EOF'
[
{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"fathom"}},
{"name":"next batch","cat":"data","ph":"X","ts":0,"dur":600,"pid":1,"tid":1},
{"name":"matmul","cat":"forward","ph":"X","ts":610,"dur":200,"pid":1,"tid":1,"args":{"flops":2e8,"bytes":1e6,"device":"cpu"}},
{"name":"add","cat":"forward","ph":"X","ts":820,"dur":100,"pid":1,"tid":1,"args":{"flops":4096,"bytes":49152,"device":"cpu"}},
{"name":"step","cat":"step","ph":"X","ts":600,"dur":400,"pid":1,"tid":1}
]
EOF
expect 0 "usage: fathom profile" profile --help
expect 2 "no trace file given" profile
expect 2 "unknown option" profile "$TMP/trace.json" --bogus
expect 2 "bad value" profile "$TMP/trace.json" --peak-gflops -3
expect 1 "cannot read trace" profile "$TMP/missing.json"
echo "not json at all" >"$TMP/bad.json"
expect 1 "not a Chrome trace" profile "$TMP/bad.json"
expect 0 "data-bound" profile "$TMP/trace.json" --peak-gflops 100
expect 0 "data waiting" profile "$TMP/trace.json" --peak-gflops 100
expect 0 "MFU: " profile "$TMP/trace.json" --peak-gflops 100
# 2e8 FLOPs in a 400 us step is 500 GFLOP/s: above a peak of 100, the MFU is flagged as meaningless
expect 0 "this MFU means nothing" profile "$TMP/trace.json" --peak-gflops 100
if "$FATHOM" profile "$TMP/trace.json" --peak-gflops 1000 | grep -qF "this MFU means nothing"; then
    echo "FAIL: profile flags an MFU of 50% as above the peak"; fails=$((fails + 1))
fi
expect 0 '"bottleneck": "data"' profile "$TMP/trace.json" --json --peak-gflops 100
if command -v python3 >/dev/null; then
    "$FATHOM" profile "$TMP/trace.json" --json --peak-gflops 100 | python3 -m json.tool >/dev/null ||
        { echo "FAIL: profile --json is not valid JSON"; fails=$((fails + 1)); }
else
    skip "python3 not found: profile --json not checked with a JSON parser"
fi
# a trace cut mid-event, as a crashed run leaves it
head -c -40 "$TMP/trace.json" | head -n 5 >"$TMP/cut.json"
printf '{"name":"relu","cat":"forw' >>"$TMP/cut.json"
expect 0 "the file ends early" profile "$TMP/cut.json" --peak-gflops 100
expect 0 "matmul" profile "$TMP/cut.json" --peak-gflops 100

# ---- plot ----
expect 0 "usage: fathom plot" plot --help
expect 2 "no log directory given" plot
expect 2 "no output file given" plot "$TMP"
expect 1 "cannot read" plot "$TMP/no-such-dir" -o "$TMP/c.svg"
expect 1 "no event files" plot "$TMP" -o "$TMP/c.svg"
if [ -x "$BIN/test_observe" ]; then
    "$BIN/test_observe" --write-tb "$TMP/logs" >"$TMP/expect.txt"
    expect 0 "wrote $TMP/c.svg" plot "$TMP/logs" -o "$TMP/c.svg"
    grep -q "</svg>" "$TMP/c.svg" || { echo "FAIL: c.svg is not a complete SVG"; fails=$((fails + 1)); }
    expect 0 "train/loss" plot "$TMP/logs" --list
    expect 2 "must end in .svg or .png" plot "$TMP/logs" -o "$TMP/c.gif"
    if "$FATHOM" plot --help | grep -q "(available"; then
        expect 0 "wrote" plot "$TMP/logs" -o "$TMP/c.png"
        head -c 8 "$TMP/c.png" | od -An -c | grep -q "P   N   G" || { echo "FAIL: c.png is not a PNG"; fails=$((fails + 1)); }
    fi
    # TensorBoard's own reader, when installed (pip install tensorboard tbparse; not in CI: it takes minutes)
    PY=""
    for p in "${FATHOM_PYTHON:-}" .venv/bin/python python3; do
        if [ -n "$p" ] && command -v "$p" >/dev/null && "$p" -c "import tbparse" 2>/dev/null; then PY=$p; break; fi
    done
    if [ -n "$PY" ]; then
        "$PY" tools/read_tensorboard.py --self-test "$BIN/test_observe --write-tb" >"$TMP/tb.txt" 2>&1 ||
            { echo "FAIL: TensorBoard did not read back what fathom wrote:"; sed 's/^/  /' "$TMP/tb.txt"; fails=$((fails + 1)); }
    else
        skip "tbparse not installed (pip install tensorboard tbparse): the TensorBoard read-back" \
             "(tools/read_tensorboard.py) did not run"
    fi
else
    skip "$BIN/test_observe is not built: the plot checks on written event files did not run"
fi

# ---- summary ----
expect 0 "usage: fathom summary" summary --help
expect 2 "no recipe or model directory given" summary
expect 2 "--batch needs a whole number" summary fashion-cnn --batch 0
expect 2 "--seq needs a whole number" summary kjv-gpt --seq x
expect 2 "--seq applies to GPT models only" summary fashion-cnn --seq 4
expect 1 "no built-in recipe named" summary no-such-recipe
# fashion-cnn: conv 1->32 (320) + bn (64) + conv 32->64 (18,496) + bn (128) + linear 3136->128 (401,536) + linear 128->10 (1,290)
expect 0 "Total params: 421,834" summary fashion-cnn
expect 0 "[64, 32, 28, 28]" summary fashion-cnn
expect 0 "[8, 10]" summary fashion-cnn --batch 8
expect 0 '"total_params": 421834' summary fashion-cnn --json
printf '[model]\ninput = 1 28 28\nlayer = linear 10\n' >"$TMP/bad.ini"
expect 1 "linear" summary "$TMP/bad.ini"

# GPT recipes: kjv-gpt is 512*128 (wte) + 128*128 (wpe) + 4 blocks of 198,272 + 256 (ln_f);
# the LM head reuses wte.weight and is counted once
expect 0 "Total params: 875,264" summary kjv-gpt
expect 0 "Tied weights: lm_head reuses wte.weight (65,536 params, counted once)" summary kjv-gpt
expect 0 "[16, 128, 512]" summary kjv-gpt
expect 0 "h.3.mlp.proj: linear 512->128" summary kjv-gpt
expect 0 "[2, 8, 384]" summary kjv-gpt --batch 2 --seq 8
expect 0 '"tied_params": 65536' summary kjv-gpt --json
expect 1 "block_size 128" summary kjv-gpt --seq 129
printf '[model]\ntype = gpt\nn_head = 3\nn_embd = 16\n' >"$TMP/badgpt.ini"
expect 1 "not divisible by n_head" summary "$TMP/badgpt.ini"
printf '[model]\ntype = gpt\nn_lyer = 3\n' >"$TMP/typo.ini"
expect 1 "unknown recipe key [model] n_lyer" summary "$TMP/typo.ini"
# one parser for GPT recipes (fm_gpt_recipe_load): summary and train reject the same keys with the same file:line
printf '[model]\ntype = gpt\n[train]\nsteps = many\n' >"$TMP/nonnum.ini"
expect 1 "$TMP/nonnum.ini: line 4: [train] steps = 'many' is not a number" summary "$TMP/nonnum.ini"
expect 2 "$TMP/nonnum.ini: line 4: [train] steps = 'many' is not a number" train "$TMP/nonnum.ini"
printf '[model]\ntype = gpt\n[train]\nstepz = 3\n' >"$TMP/typo2.ini"
expect 1 "$TMP/typo2.ini: line 4: unknown recipe key [train] stepz" summary "$TMP/typo2.ini"
expect 2 "$TMP/typo2.ini: line 4: unknown recipe key [train] stepz" train "$TMP/typo2.ini"
printf '[model]\ntype = gpt\n[tokenizer]\nkind = char\n' >"$TMP/char.ini"
expect 1 "depends on the corpus" summary "$TMP/char.ini"

# trained model directories: what `fathom train --out DIR` writes, for both kinds of recipe
if "$FATHOM" train fashion-mlp --max-steps 1 --no-eval --quiet --out "$TMP/mlp" >/dev/null 2>"$TMP/train.err"; then
    expect 0 "trained model" summary "$TMP/mlp"
    total=$("$FATHOM" summary fashion-mlp | grep "Total params")
    expect 0 "$total" summary "$TMP/mlp"
elif [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "Fashion-MNIST is not installed (tools/setup-deps.sh installs it): no fashion-mlp model-directory summary"
else
    echo "FAIL: fashion-mlp did not train with its data set installed"; sed 's/^/  /' "$TMP/train.err" | head -3
    fails=$((fails + 1))
fi
printf '[model]\ntype = gpt\narch = gpt2\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 64\nblock_size = 16\n[tokenizer]\nkind = byte\n[train]\nbatch_size = 2\nsteps = 1\neval_every = 1\neval_batches = 1\nckpt_every = 1\nlog_every = 1\n' >"$TMP/tiny.ini"
for i in $(seq 60); do printf 'in the beginning was the word, and the word was with god. ' ; done >"$TMP/corpus.txt"
if "$FATHOM" train "$TMP/tiny.ini" --corpus "$TMP/corpus.txt" --out "$TMP/gpt" >/dev/null 2>"$TMP/train.err"; then
    # byte vocabulary 256: wte 256*16 + wpe 16*16 + one block (2*32 + 16*48+48 + 16*16+16 + 16*64+64 + 64*16+16) + ln_f 32
    expect 0 "Total params: 7,664" summary "$TMP/gpt"
    expect 0 "trained GPT model" summary "$TMP/gpt"
    expect 0 "[3, 16, 256]" summary "$TMP/gpt" --batch 3
    expect 0 "Total params: 7,664" summary "$TMP/tiny.ini"
else
    echo "FAIL: the tiny GPT recipe did not train"; sed 's/^/  /' "$TMP/train.err" | head -5; fails=$((fails + 1))
fi

if [ "$fails" != 0 ]; then echo "$fails failure(s)"; exit 1; fi
if [ "$skips" != 0 ]; then echo "cli_observe: all that ran passed; $skips part(s) skipped"; exit 77; fi
echo "cli_observe: all passed"
