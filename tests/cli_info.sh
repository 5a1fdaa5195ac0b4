#!/usr/bin/env bash
# `fathom info`: the CPU, the kernel levels and the GEMM provider are named;
# FATHOM_ISA that names no level is refused (exit 2, the levels listed);
# a forced lower level shows in the kernel table; a missing OpenBLAS is
# announced and falls back; the user's OPENBLAS_CORETYPE is respected.
# The checked test devices (check:0, check:1) and the meta device (meta:0) are
# listed, as text and JSON.
# Usage: bash tests/cli_info.sh <path-to-fathom-binary>
set -euo pipefail
bin=${1:?usage: cli_info.sh FATHOM_BIN}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "cli_info: FAIL: $*"; exit 1; }

"$bin" info >"$tmp/out" 2>"$tmp/err" || fail "fathom info exited $?"
grep -q '^cpu:' "$tmp/out" || fail "no cpu line"
grep -q 'kernels at ' "$tmp/out" || fail "no kernel level"
grep -q '^gemm:' "$tmp/out" || fail "no gemm line"

set +e
FATHOM_ISA=sse9 "$bin" info >"$tmp/out" 2>"$tmp/err"; rc=$?
set -e
[ "$rc" = 2 ] || fail "FATHOM_ISA=sse9 exited $rc, expected 2"
grep -q "FATHOM_ISA=sse9 names no level" "$tmp/err" || fail "no clear error: $(cat "$tmp/err")"
grep -q "levels this CPU has are: scalar" "$tmp/err" || fail "levels not listed: $(cat "$tmp/err")"

FATHOM_ISA=scalar "$bin" info >"$tmp/out" 2>"$tmp/err" || fail "FATHOM_ISA=scalar refused"
grep -q "kernels at scalar" "$tmp/out" || fail "FATHOM_ISA=scalar not applied"
grep -Eq "elementwise\+gelu +scalar" "$tmp/out" || fail "kernel table not at scalar"

FATHOM_OPENBLAS=/nonexistent/libopenblas.so.0 "$bin" info >"$tmp/out" 2>"$tmp/err" || fail "missing OpenBLAS crashed info"
grep -q "portable loops" "$tmp/out" || fail "fallback not shown"
grep -q "warning: OpenBLAS could not be loaded" "$tmp/err" || fail "fallback not announced"

OPENBLAS_CORETYPE=Prescott "$bin" info --json >"$tmp/out" 2>"$tmp/err" || fail "info --json failed"
grep -q '"core": "Prescott"' "$tmp/out" || fail "user's OPENBLAS_CORETYPE not respected"
"$bin" info >"$tmp/out" 2>"$tmp/err" || fail "fathom info exited $?"
grep -q '^check: check:0, check:1 (the checked test device' "$tmp/out" || fail "the check devices are not listed: $(grep '^check' "$tmp/out")"
"$bin" info --json >"$tmp/out" 2>"$tmp/err" || fail "info --json failed"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["check"]["devices"] == ["check:0", "check:1"]' "$tmp/out" \
  || fail "info --json: check devices"
"$bin" info >"$tmp/out" 2>"$tmp/err" || fail "fathom info exited $?"
grep -q '^meta:  meta:0 (the shape-only device' "$tmp/out" || fail "the meta device is not listed: $(grep '^meta' "$tmp/out")"
"$bin" info --json >"$tmp/out" 2>"$tmp/err" || fail "info --json failed"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["meta"]["devices"] == ["meta:0"]' "$tmp/out" \
  || fail "info --json: meta device"
# the f32 GEMM provider: an f32 line; FATHOM_GEMM_F32=openblas respected; a value naming no provider
# is announced and the default used
"$bin" info >"$tmp/out" 2>"$tmp/err" || fail "fathom info exited $?"
grep -q '^f32:   ' "$tmp/out" || fail "no f32 provider line: $(cat "$tmp/out")"
for dnnl in "" on off; do # one bf16 line whichever path bf16 takes
  FATHOM_DNNL=$dnnl "$bin" info >"$tmp/out" 2>"$tmp/err" || fail "FATHOM_DNNL=$dnnl fathom info exited $?"
  [ "$(grep -c '^bf16:' "$tmp/out")" = 1 ] || fail "FATHOM_DNNL=$dnnl: not one bf16 line: $(grep -A1 '^bf16' "$tmp/out")"
done
FATHOM_GEMM_F32=openblas "$bin" info --json >"$tmp/out" 2>"$tmp/err" || fail "info --json failed"
python3 -c 'import json,sys; f = json.load(open(sys.argv[1]))["gemm"]["f32"]; assert f["provider"] == "openblas" and "FATHOM_GEMM_F32=openblas" in f["note"], f' \
  "$tmp/out" || fail "FATHOM_GEMM_F32=openblas not respected: $(cat "$tmp/out")"
# on an Intel CPU with AVX-512 the large f32 products run fathom's own kernel, and info says so
python3 -c 'import json,sys; f = json.load(open(sys.argv[1]))["gemm"]["f32"]; assert f["fathom_kernel"] is None and "FATHOM_GEMM_F32=openblas" in f["note"], f' \
  "$tmp/out" || fail "FATHOM_GEMM_F32=openblas still names fathom's f32 kernel: $(cat "$tmp/out")"
FATHOM_GEMM_F32=fathom "$bin" info >"$tmp/out" 2>"$tmp/err" || fail "FATHOM_GEMM_F32=fathom: exit $?"
grep -q "every product of >= 2M multiply-adds (FATHOM_GEMM_F32=fathom): fathom's own AVX-512 kernel" "$tmp/out" ||
  fail "FATHOM_GEMM_F32=fathom: not in info: $(cat "$tmp/out")"
FATHOM_GEMM_F32=mkl "$bin" info >"$tmp/out" 2>"$tmp/err" || fail "FATHOM_GEMM_F32=mkl: exit $?"
grep -q "FATHOM_GEMM_F32=mkl names no provider (openblas, onednn or fathom)" "$tmp/err" || fail "FATHOM_GEMM_F32=mkl not announced: $(cat "$tmp/err")"
grep -q '^f32:   ' "$tmp/out" || fail "FATHOM_GEMM_F32=mkl: no f32 line"
echo "cli_info: ok"
