#!/usr/bin/env bash
# `fathom train` with --profile and --logdir: the trace opens in `fathom profile`,
# the TensorBoard logs in `fathom plot`, and --json carries the memory report.
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=$("$bin" train fashion-mlp --max-steps 12 --no-eval --out "$dir/m" --profile "$dir/trace.json" \
      --logdir "$dir/logs" --hist-every 1 --quiet --json)
echo "$out" | grep -q '"memory":{' || { echo "no memory report in --json: $out"; exit 1; }
echo "$out" | grep -q '"data_wait_seconds"' || { echo "no data wait in --json"; exit 1; }
"$bin" profile "$dir/trace.json" > "$dir/summary.txt"
grep -q "optimizer" "$dir/summary.txt" || { echo "profile summary lacks the optimizer split"; cat "$dir/summary.txt"; exit 1; }
grep -q "^verdict:" "$dir/summary.txt" || { echo "profile summary lacks a verdict"; exit 1; }
ls "$dir/logs"/events.out.tfevents.* >/dev/null
"$bin" plot "$dir/logs" --list > "$dir/scalars.txt"
for tag in train/loss train/lr train/throughput train/grad_norm memory/allocated_bytes; do
  grep -q "^$tag .* 1 points, last step 10:" "$dir/scalars.txt" || { echo "scalar $tag not logged at step 10:"; cat "$dir/scalars.txt"; exit 1; }
done
"$bin" plot "$dir/logs" -o "$dir/c.svg" >/dev/null
grep -q "<svg" "$dir/c.svg"
# weight and gradient histograms every epoch (--hist-every 1): a 600-sample, 2-epoch run of 3 batches each
src=$(dirname "$0")/../data/recipes/fashion-mlp.ini
sed -e 's/^workers = 1/workers = 1\nlimit = 600/' -e 's/^epochs = .*/epochs = 2/' "$src" > "$dir/small.ini"
"$bin" train "$dir/small.ini" --batch 200 --no-eval --quiet --logdir "$dir/hist" --hist-every 1 > /dev/null
"$bin" plot "$dir/hist" --list > "$dir/list.txt"
grep -q "^grads/1.weight .* 2 histograms, last step 6: 802816 values" "$dir/list.txt" ||
  { echo "no gradient histograms at steps 3 and 6:"; cat "$dir/list.txt"; exit 1; }
grep -q "^weights/5.bias .* 2 histograms, last step 6: 10 values" "$dir/list.txt" ||
  { echo "no weight histograms:"; cat "$dir/list.txt"; exit 1; }
# progress lines: plain lines when the output is not a terminal, a redrawn line on one, none with --quiet,
# for training and for evaluation (fathom eval, and the test-set evaluation at the end of training)
"$bin" train "$dir/small.ini" --batch 200 --out "$dir/small" --logdir "$dir/small-logs" > "$dir/train.txt" 2>&1
"$bin" plot "$dir/small-logs" --list > "$dir/scalars.txt"
for tag in val/loss val/accuracy; do
  grep -q "^$tag .* 1 points, last step 6:" "$dir/scalars.txt" || { echo "scalar $tag not logged:"; cat "$dir/scalars.txt"; exit 1; }
done
grep -q "^epoch 2/2: done 3/3 (100%)" "$dir/train.txt" || { echo "no plain training progress:"; cat "$dir/train.txt"; exit 1; }
grep -q "^eval: done 10/10 (100%)" "$dir/train.txt" || { echo "no plain evaluation progress in training:"; cat "$dir/train.txt"; exit 1; }
"$bin" eval "$dir/small" > "$dir/eval.out" 2> "$dir/eval.err"
grep -q "^eval: done 10/10 (100%)" "$dir/eval.err" || { echo "no plain eval progress on stderr:"; cat "$dir/eval.err"; exit 1; }
grep -q "test accuracy" "$dir/eval.out"
"$bin" eval "$dir/small" --quiet > "$dir/eval.out" 2> "$dir/eval.err"
[ ! -s "$dir/eval.err" ] || { echo "eval --quiet printed progress:"; cat "$dir/eval.err"; exit 1; }
if command -v script > /dev/null; then
  script -qc "'$bin' eval '$dir/small'" /dev/null > "$dir/eval.tty" 2>&1 || true
  grep -q $'\r\033\[Keval \[' "$dir/eval.tty" || { echo "no redrawn eval line on a terminal:"; od -c "$dir/eval.tty" | head; exit 1; }
  if grep -q "^eval: 1/10" "$dir/eval.tty"; then echo "plain eval lines on a terminal"; exit 1; fi
fi
# the GPT trainer (fathom train <gpt recipe>): the same --profile and --logdir, with the fp16 loss scale
printf '[model]\ntype = gpt\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 64\nblock_size = 16\n[tokenizer]\nkind = byte\n[train]\nbatch_size = 2\nsteps = 4\neval_every = 2\neval_batches = 1\nckpt_every = 4\nlog_every = 1\n' > "$dir/gpt.ini"
for i in $(seq 60); do printf 'in the beginning was the word, and the word was with god. '; done > "$dir/corpus.txt"
"$bin" train "$dir/gpt.ini" --corpus "$dir/corpus.txt" --out "$dir/gpt" --precision fp16 --profile "$dir/gpt.json" \
      --logdir "$dir/gpt-logs" > /dev/null 2> "$dir/gpt.err"
grep -q "^trace: $dir/gpt.json" "$dir/gpt.err" || { echo "the GPT trainer does not say where the trace went"; cat "$dir/gpt.err"; exit 1; }
"$bin" profile "$dir/gpt.json" > "$dir/gpt-summary.txt"
grep -q "^step time: 4 steps" "$dir/gpt-summary.txt" || { echo "GPT trace: not 4 steps"; cat "$dir/gpt-summary.txt"; exit 1; }
grep -q "^verdict:" "$dir/gpt-summary.txt"
"$bin" plot "$dir/gpt-logs" --list > "$dir/gpt-scalars.txt"
for tag in train/loss train/lr train/throughput train/grad_norm train/loss_scale memory/allocated_bytes; do
  grep -q "^$tag .* 4 points, last step 4:" "$dir/gpt-scalars.txt" || { echo "GPT scalar $tag missing:"; cat "$dir/gpt-scalars.txt"; exit 1; }
done
grep -q "^val/loss .* 2 points, last step 4:" "$dir/gpt-scalars.txt" || { echo "GPT val/loss missing:"; cat "$dir/gpt-scalars.txt"; exit 1; }
# an unwritable trace path is a clear error, exit 1
if "$bin" train fashion-mlp --max-steps 1 --no-eval --profile /nonexistent/t.json --quiet 2> "$dir/err"; then
  echo "expected failure for an unwritable trace path"; exit 1
fi
grep -q "cannot write trace file" "$dir/err"
# so is a log directory that cannot be created (under a regular file: fails even for root)
touch "$dir/afile"
if "$bin" train fashion-mlp --max-steps 1 --no-eval --logdir "$dir/afile/logs" --quiet 2> "$dir/err"; then
  echo "expected failure for an unwritable log directory"; exit 1
fi
grep -q "afile/logs" "$dir/err" || { echo "the logdir error does not name the directory:"; cat "$dir/err"; exit 1; }
echo "train observe: ok"
