#!/usr/bin/env bash
# Packs a CUDA build made here (tools/gpu-check.sh's binaries) with the shared libraries
# that a bare GPU machine lacks, for a GPU machine that cannot install fathom's build
# dependencies (nothing reachable from it): the binaries get an RPATH of $ORIGIN/lib, so
# they find the bundled libraries without LD_LIBRARY_PATH (which would also reach the
# machine's own Python and PyTorch); the CUDA libraries (cudart, cuBLASLt, NCCL) are not
# bundled: the GPU machine's own are used. OpenMPI's components, help files and
# configuration are bundled under their Debian paths, for `mpirun -np 1` (the NCCL smoke).
#   usage: tools/gpu-bundle.sh BUILD_DIR OUT.tar.xz [FASHION_TRAIN_IMAGES]
# FASHION_TRAIN_IMAGES (default 12000): how many Fashion-MNIST training images to take
# along (the GPU check trains 100 steps of 64; the full set is 26 MB).
# On the GPU machine: tools/gpu-unbundle.sh OUT.tar.xz DIR, then BUILD=DIR/bin
# GPU_CHECK_PREBUILT=1 tools/gpu-check.sh.
set -euo pipefail
build=${1:?usage: gpu-bundle.sh BUILD_DIR OUT.tar.xz}
out=${2:?out}
ntrain=${3:-12000}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/mpi/usr/lib/x86_64-linux-gnu" "$stage/mpi/usr/share" "$stage/mpi/etc" "$stage/data"
bins=(fathom test_cuda test_profile bench_gpu test_onnx_conformance)
for b in "${bins[@]}"; do cp "$build/$b" "$stage/bin/"; done
cp "$build/CMakeCache.txt" "$stage/bin/"
cp /usr/bin/orterun "$stage/bin/mpirun"; cp /usr/bin/orted "$stage/bin/orted"
# libraries: everything the binaries, OpenBLAS (dlopened) and OpenMPI's components need,
# except glibc's own and CUDA's
skip='^(libc|libm|libpthread|libdl|librt|ld-linux-x86-64|libcudart|libcublas|libcublasLt|libnccl|libcuda)\.so'
objs=("$stage"/bin/fathom "$stage"/bin/test_cuda "$stage"/bin/test_profile "$stage"/bin/bench_gpu "$stage"/bin/test_onnx_conformance
      "$stage/bin/mpirun" "$stage/bin/orted"
      /usr/lib/x86_64-linux-gnu/libopenblas.so.0 /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so)
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  cp -L "$path" "$stage/lib/$name"
done
cp -L /usr/lib/x86_64-linux-gnu/libopenblas.so.0 "$stage/lib/libopenblas.so.0"
for b in "${bins[@]}" mpirun orted; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$stage/bin/$b"; done
cp -a /usr/lib/x86_64-linux-gnu/openmpi "$stage/mpi/usr/lib/x86_64-linux-gnu/"
cp -a /usr/share/openmpi "$stage/mpi/usr/share/"
cp -a /etc/openmpi "$stage/mpi/etc/"
python3 - "$stage/data" "$ntrain" <<'PY'
import gzip, struct, sys, os
d, n = sys.argv[1], int(sys.argv[2])
src = "/usr/share/datasets/fashion-mnist"
for split, cnt in (("train", n), ("t10k", min(n, 10000))):
    im = gzip.open(f"{src}/{split}-images-idx3-ubyte.gz").read()
    lb = gzip.open(f"{src}/{split}-labels-idx1-ubyte.gz").read()
    magic, total, r, c = struct.unpack(">IIII", im[:16])
    cnt = min(cnt, total)
    with gzip.open(f"{d}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", magic, cnt, r, c) + im[16:16 + cnt * r * c])
    with gzip.open(f"{d}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(lb[:4] + struct.pack(">I", cnt) + lb[8:8 + cnt])
PY
# kjv-gpt's corpus as the trainer reads it from `bible` (verse numbers dropped), for the
# curve check on a machine without that program (tools/gpu-check-train.sh: GPU_CHECK_KJV)
if command -v bible >/dev/null 2>&1; then
  bible 'Gen1:1-Rev22:21' 2>/dev/null | sed -E 's/^ *[0-9]+ //' >"$stage/data/kjv.txt"
else
  echo "gpu-bundle: no 'bible' program here (apt-get install bible-kjv): the bundle has no KJV corpus" >&2
fi
tar -C "$stage" -cJf "$out" .
echo "bundle: $out ($(du -h "$out" | cut -f1)): $(ls "$stage/lib" | wc -l) libraries"
