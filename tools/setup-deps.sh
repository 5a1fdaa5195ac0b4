#!/usr/bin/env bash
# Installs the Debian packages fathom needs to build, test and run its quickstart.
# Idempotent: packages already present are skipped quickly. Runs as root (CI, fresh machines).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libdnnl-dev libjansson-dev libinih-dev libmicrohttpd-dev libicu-dev zlib1g-dev libpng-dev
      libprotobuf-c-dev protobuf-c-compiler libonnx-dev libonnx-testdata dataset-fashion-mnist valgrind
      openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${1:-} == --check ]]; then ((${#missing[@]} == 0)); exit; fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
