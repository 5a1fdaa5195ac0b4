#!/usr/bin/env bash
# `fathom generate` on a tiny model trained here: streamed text starts with the
# prompt, the KV cache and the uncached path give the same text for a seed, the
# context limit stops generation with its message, and bad input is an error
# (exit 2 for malformed options, 1 for a prompt longer than the context).
set -uo pipefail
bin=$1
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_generate
d=$tmp
cli_tiny_gpt "$d/m" 60 "And the LORD spake unto Moses, saying, Speak unto the children of Israel"

gen() { "$bin" generate "$d/m" "$@"; }
gen --prompt "And the" --tokens 8 --seed 3 > "$d/a.out" 2> "$d/a.err" || { echo "generate failed"; cat "$d/a.err"; exit 1; }
head -c 7 "$d/a.out" | grep -q "^And the" || { echo "output does not start with the prompt"; cat "$d/a.out"; exit 1; }
[ "$(wc -c < "$d/a.out")" -gt 8 ] || { echo "no tokens after the prompt"; cat "$d/a.out"; exit 1; }
grep -q "8 tokens in .* tokens/s, KV cache" "$d/a.err" || { echo "no throughput line"; cat "$d/a.err"; exit 1; }
gen --prompt "And the" --tokens 8 --seed 3 --no-cache --quiet > "$d/b.out" 2> "$d/b.err" || { echo "--no-cache failed"; cat "$d/b.err"; exit 1; }
cmp -s "$d/a.out" "$d/b.out" || { echo "KV cache and --no-cache differ for the same seed"; cat "$d/a.out" "$d/b.out"; exit 1; }
[ ! -s "$d/b.err" ] || { echo "--quiet still printed:"; cat "$d/b.err"; exit 1; }
gen --prompt "And the" --tokens 8 --seed 3 --temperature 0 --quiet > "$d/g1.out" &&
  gen --prompt "And the" --tokens 8 --seed 99 --temperature 0 --quiet > "$d/g2.out" &&
  cmp -s "$d/g1.out" "$d/g2.out" || { echo "greedy decoding depends on the seed"; exit 1; }
# 7 prompt bytes + 25 new fill the 32-token context
gen --prompt "And the" --tokens 100 --seed 1 > "$d/l.out" 2> "$d/l.err" || { echo "generate to the limit failed"; cat "$d/l.err"; exit 1; }
grep -q "stopped after 25 tokens: the context limit of 32 tokens" "$d/l.err" || { echo "no context-limit message"; cat "$d/l.err"; exit 1; }
# --precision bf16: the forward under bf16 autocast (bf16 GEMMs on f32 activations), the
# cached and uncached paths both complete, the report names the precision
gen --prompt "And the" --tokens 8 --seed 3 --precision bf16 > "$d/h.out" 2> "$d/h.err" || { echo "--precision bf16 failed"; cat "$d/h.err"; exit 1; }
head -c 7 "$d/h.out" | grep -q "^And the" && [ "$(wc -c < "$d/h.out")" -gt 8 ] || { echo "--precision bf16: no text"; cat "$d/h.out"; exit 1; }
grep -q "8 tokens in .* tokens/s, KV cache, bf16)" "$d/h.err" || { echo "--precision bf16: no bf16 in the report"; cat "$d/h.err"; exit 1; }
gen --prompt "And the" --tokens 8 --seed 3 --precision=bf16 --no-cache --quiet > "$d/h2.out" 2> "$d/h2.err" || { echo "--precision=bf16 --no-cache failed"; cat "$d/h2.err"; exit 1; }
[ "$(wc -c < "$d/h2.out")" -gt 8 ] || { echo "--precision bf16 --no-cache: no text"; exit 1; }

expect() { # exit-code expected-text args...
  local want_rc=$1 want=$2; shift 2
  gen "$@" > "$d/e.out" 2> "$d/e.err"
  rc=$?
  [ "$rc" -eq "$want_rc" ] || { echo "generate $*: exit $rc, expected $want_rc"; cat "$d/e.err"; exit 1; }
  grep -q -- "$want" "$d/e.err" || { echo "generate $*: expected '$want' in:"; cat "$d/e.err"; exit 1; }
}
expect 2 "--tokens needs a whole number" --prompt x --tokens abc
expect 2 "--tokens needs a whole number" --prompt x --tokens -1
expect 2 "--tokens needs a whole number" --prompt x --tokens ""
expect 2 "must be at most" --prompt x --tokens 99999999999
expect 2 "--top-k needs a whole number" --prompt x --top-k 2.5
expect 2 "--seed needs a whole number" --prompt x --seed -3
expect 2 "--temperature needs a number" --prompt x --temperature nan
expect 2 "--temperature must be >= 0" --prompt x --temperature -1
expect 2 "--top-p in (0, 1]" --prompt x --top-p 0
expect 2 "unknown option '--frobnicate'" --prompt x --frobnicate
expect 2 "--precision" --prompt x --precision fp8
long=$(printf 'a%.0s' $(seq 1 40))
expect 1 "the prompt is 40 tokens but the model's context is 32" --prompt "$long" --tokens 1
[ ! -s "$d/e.out" ] || { echo "a too-long prompt was echoed before the error"; cat "$d/e.out"; exit 1; }
"$bin" generate "$d/nonexistent" --prompt x > /dev/null 2> "$d/e.err"
[ $? -eq 1 ] && grep -q "fathom: error:" "$d/e.err" || { echo "a missing model dir is not a clean error"; cat "$d/e.err"; exit 1; }
echo "generate: ok"
