#!/usr/bin/env bash
# `fathom train <gpt recipe>` refuses malformed numbers with a usage error (exit 2)
# before it reads any corpus.
set -uo pipefail
bin=$1
for args in "--steps 0" "--steps abc" "--stop-after -3" "--seed x1"; do
  # shellcheck disable=SC2086
  "$bin" train kjv-gpt $args > /dev/null 2> /tmp/fathom_gpt_args.err
  rc=$?
  [ "$rc" -eq 2 ] || { echo "train kjv-gpt $args: exit $rc, expected 2"; exit 1; }
  grep -q "needs a whole number" /tmp/fathom_gpt_args.err || { echo "train kjv-gpt $args: unclear error"; cat /tmp/fathom_gpt_args.err; exit 1; }
done
rm -f /tmp/fathom_gpt_args.err
echo "gpt train arguments: ok"
