#!/usr/bin/env bash
# The GPU machine's half of tools/gpu-bundle.sh: unpacks BUNDLE into DIR, puts OpenMPI's
# components, help files and configuration at their Debian paths (only where nothing is
# there already), the Fashion-MNIST subset at fathom's default data folder (likewise),
# finds the machine's own CUDA libraries (cudart, cuBLASLt, NCCL) and prints the
# `export LD_LIBRARY_PATH=...` line that names their folders (eval it), then checks
# that every bundled program resolves all of its libraries (exit 1, naming the missing
# ones, if not).
#   usage: eval "$(tools/gpu-unbundle.sh BUNDLE DIR)"
set -uo pipefail
bundle=${1:?usage: gpu-unbundle.sh BUNDLE DIR}
dir=${2:?dir}
mkdir -p "$dir" && tar -C "$dir" -xJf "$bundle" || { echo "echo 'gpu-unbundle: cannot unpack $bundle' >&2; false"; exit 1; }
for p in usr/lib/x86_64-linux-gnu/openmpi usr/share/openmpi etc/openmpi; do
  if [[ ! -e /$p ]]; then mkdir -p "/$(dirname "$p")" && cp -a "$dir/mpi/$p" "/$p"; else echo "gpu-unbundle: /$p exists; kept" >&2; fi
done
fm=/usr/share/datasets/fashion-mnist
if [[ ! -e $fm ]]; then mkdir -p "$fm" && cp "$dir"/data/*.gz "$fm/"; else echo "gpu-unbundle: $fm exists; kept" >&2; fi
libdirs=""
for l in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
  f=$(find /usr/local/cuda*/ /usr/local/cuda/lib64 /opt /usr/lib -name "$l" 2>/dev/null | head -1)
  if [[ -z $f ]]; then echo "gpu-unbundle: $l not found on this machine" >&2; continue; fi
  d=$(dirname "$f"); [[ ":$libdirs:" == *":$d:"* ]] || libdirs="$libdirs:$d"
done
export LD_LIBRARY_PATH="${libdirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
kjv=""
[[ -s $dir/data/kjv.txt ]] && kjv=" GPU_CHECK_KJV='$dir/data/kjv.txt'"
echo "export LD_LIBRARY_PATH='$LD_LIBRARY_PATH' PATH='$dir/bin':\"\$PATH\" OPAL_PREFIX=/usr$kjv"
bad=0
for b in "$dir"/bin/fathom "$dir"/bin/test_cuda "$dir"/bin/test_profile "$dir"/bin/bench_gpu "$dir"/bin/test_onnx_conformance "$dir"/bin/mpirun; do
  miss=$(ldd "$b" 2>&1 | grep "not found" | tr '\n' ' ')
  [[ -n $miss ]] && { echo "gpu-unbundle: $b: $miss" >&2; bad=1; }
done
((bad)) && echo "false"
exit 0
