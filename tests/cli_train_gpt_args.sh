#!/usr/bin/env bash
# `fathom train <gpt recipe>` and `fathom tokenizer train` refuse malformed numbers
# with a usage error (exit 2) before they read any corpus.
set -uo pipefail
bin=$1
# scratch files in a directory of this run (several suites may run at once on one machine)
tmp=$(mktemp -d /tmp/fathom_gpt_args.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for args in "--steps 0" "--steps abc" "--stop-after -3" "--seed x1"; do
  # shellcheck disable=SC2086
  "$bin" train kjv-gpt $args > /dev/null 2> "$tmp/err"
  rc=$?
  [ "$rc" -eq 2 ] || { echo "train kjv-gpt $args: exit $rc, expected 2"; exit 1; }
  grep -q "needs a whole number" "$tmp/err" || { echo "train kjv-gpt $args: unclear error"; cat "$tmp/err"; exit 1; }
done
# efficiency flags: each bad value or combination is a usage error naming the flag,
# reported before the recipe's corpus is read (kjv is not installed in CI)
check_flag() { # expected-text args...
  local want=$1; shift
  "$bin" train kjv-gpt "$@" > /dev/null 2> "$tmp/err"
  rc=$?
  [ "$rc" -eq 2 ] || { echo "train kjv-gpt $*: exit $rc, expected 2"; cat "$tmp/err"; exit 1; }
  grep -q -- "$want" "$tmp/err" || { echo "train kjv-gpt $*: expected '$want' in:"; cat "$tmp/err"; exit 1; }
  if grep -q "corpus kjv:\|KJV corpus" "$tmp/err"; then echo "train kjv-gpt $*: read the corpus before rejecting"; exit 1; fi
}
check_flag "expected fp32, bf16 or fp16" --precision fp8
check_flag "expected none, blocks or selective" --checkpointing all
check_flag "--grad-accum needs a whole number" --grad-accum 0
check_flag "--grad-accum needs a whole number" --grad-accum two
check_flag "batch 16 is not divisible by --grad-accum 3" --grad-accum 3
check_flag "batch 6 is not divisible by --grad-accum 4" --grad-accum 4 --batch 6
check_flag "--memory-limit needs a size" --memory-limit lots
check_flag "unknown memory mode 'huge'" --memory-mode huge
check_flag "needs --memory-mode preallocate" --memory-preallocate 1G
check_flag "a fraction must be in (0, 1]" --memory-mode preallocate --memory-preallocate 1.5
check_flag "larger than --memory-limit" --memory-mode preallocate --memory-preallocate 2G --memory-limit 1G
check_flag "--precision needs a value" --precision
# the router passes the flags' values over when it looks for the recipe name
"$bin" train --memory-mode grow kjv-gpt --precision fp8 > /dev/null 2> "$tmp/err"
grep -q "expected fp32, bf16 or fp16" "$tmp/err" || { echo "router: --memory-mode value taken as the recipe"; cat "$tmp/err"; exit 1; }
# the tokenizer's --vocab is parsed the same way
printf 'in the beginning\n' > "$tmp/in.txt"
for v in abc 0 99999999999; do
  "$bin" tokenizer train "$tmp/in.txt" --vocab "$v" --out "$tmp/out.tok" > /dev/null 2> "$tmp/err"
  rc=$?
  [ "$rc" -eq 2 ] || { echo "tokenizer --vocab $v: exit $rc, expected 2"; exit 1; }
  grep -q -- "--vocab" "$tmp/err" || { echo "tokenizer --vocab $v: unclear error"; cat "$tmp/err"; exit 1; }
done
echo "gpt train and tokenizer arguments: ok"
