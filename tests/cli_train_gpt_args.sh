#!/usr/bin/env bash
# `fathom train <gpt recipe>` and `fathom tokenizer train` refuse malformed numbers
# with a usage error (exit 2) before they read any corpus.
set -uo pipefail
bin=$1
for args in "--steps 0" "--steps abc" "--stop-after -3" "--seed x1"; do
  # shellcheck disable=SC2086
  "$bin" train kjv-gpt $args > /dev/null 2> /tmp/fathom_gpt_args.err
  rc=$?
  [ "$rc" -eq 2 ] || { echo "train kjv-gpt $args: exit $rc, expected 2"; exit 1; }
  grep -q "needs a whole number" /tmp/fathom_gpt_args.err || { echo "train kjv-gpt $args: unclear error"; cat /tmp/fathom_gpt_args.err; exit 1; }
done
# the tokenizer's --vocab is parsed the same way
printf 'in the beginning\n' > /tmp/fathom_gpt_args.txt
for v in abc 0 99999999999; do
  "$bin" tokenizer train /tmp/fathom_gpt_args.txt --vocab "$v" --out /tmp/fathom_gpt_args.tok > /dev/null 2> /tmp/fathom_gpt_args.err
  rc=$?
  [ "$rc" -eq 2 ] || { echo "tokenizer --vocab $v: exit $rc, expected 2"; exit 1; }
  grep -q -- "--vocab" /tmp/fathom_gpt_args.err || { echo "tokenizer --vocab $v: unclear error"; cat /tmp/fathom_gpt_args.err; exit 1; }
done
rm -f /tmp/fathom_gpt_args.err /tmp/fathom_gpt_args.txt /tmp/fathom_gpt_args.tok
echo "gpt train and tokenizer arguments: ok"
