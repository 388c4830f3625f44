#!/usr/bin/env bash
# Build bench/stock/cutlass_gemm.cu for each configuration named on the command line, two at a
# time, into bench/stock/build/NAME.so (ignored; carry it to the device), with cuco's own
# device flags (cuco.kernels.Compiler.base_flags: arch sm_90a, CUTLASS's include paths) and
# NDEBUG (CUTLASS's asserts inside the wgmma pipeline would serialise it: ptxas C7510).
#
#   bench/stock/build.sh NAME:TILE_M:TILE_N:CLUSTER_M:PINGPONG:SWAP ...
#   e.g. bench/stock/build.sh coop_256x128_cl2_ab:256:128:2:0:1
set -eu
cd "$(dirname "$0")"
mkdir -p build
FLAGS=$(python3 -c "from cuco.kernels.compiler import Compiler; print(' '.join(Compiler(arch='sm_90a').base_flags(['cutlass'])))")
one() {
  IFS=: read -r name tm tn cl pp swap <<< "$1"
  nvcc $FLAGS -DNDEBUG -DTILE_M=$tm -DTILE_N=$tn -DCLUSTER_M=$cl -DPINGPONG=$pp -DSWAP=$swap -DSTAGES=0 \
    -Xcompiler -fPIC -shared -cudart static -o "build/$name.so" cutlass_gemm.cu > "build/$name.log" 2>&1 \
    && echo "built $name" || echo "FAILED $name (build/$name.log)"
}
n=0
for spec in "$@"; do
  one "$spec" &
  n=$((n + 1))
  [ $((n % ${JOBS:-2})) -eq 0 ] && wait
done
wait
