#!/usr/bin/env bash
# The context-kernel session on a GPU host, in one call: unpack the bundle
# (`cargo xtask gpu-bundle --out .gpu/bundle` builds .gpu/bundle.tar.xz),
# run the context GPU tests on the sm_90a kernel (and the named tests on the
# compute_90 kernel), the context bench (default, ping-pong variant,
# compute_90, leave-one-stage-out experiments), torch's cuDNN SDPA on the
# same shapes, compute-sanitizer memcheck + racecheck on small cases, and the
# mha-backend GPU tests. Logs go to $OUT (default /tmp/out); the console gets
# the tables and the test summaries.
#   usage: OUT=logs bash scripts/gpu-context.sh [path/to/bundle.tar.xz]
set -u
archive=$(realpath "${1:-.gpu/bundle.tar.xz}")
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
work=$(mktemp -d)
tar -xJf "$archive" -C "$work" && cd "$work"/* || exit 1
export MHA_KIT_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/smi.txt" 2>&1
T=tests/paged-attention-context_gpu
summary() { grep -E "^test |test result|panicked|SUMMARY" "$1" | grep -v " ok$"; }
echo "== context tests, sm90a (${MHA_KIT_GPU_CASES:-500} random cases)"
timeout 240 $T --include-ignored > "$OUT/ctx_sm90.log" 2>&1; echo "rc=$?"; summary "$OUT/ctx_sm90.log"
echo "== context tests, compute_90 (named)"
MHA_KIT_CONTEXT_KERNEL=mma timeout 60 $T --include-ignored --skip d256 --skip proptest > "$OUT/ctx_mma.log" 2>&1
echo "rc=$?"; summary "$OUT/ctx_mma.log"
echo "== bench"
timeout 180 benches/paged-attention-context --bench > "$OUT/bench.log" 2>&1; echo "rc=$?"
grep -E '^(\||## )' "$OUT/bench.log"
echo "== cuDNN peers"
timeout 90 python3 peers/context_peers.py > "$OUT/peers.log" 2>&1; echo "rc=$?"
grep -E '^(\||## )' "$OUT/peers.log"
echo "== memcheck, racecheck (sm90a, small cases)"
MHA_KIT_GPU_CASES=4 timeout 120 compute-sanitizer --tool memcheck $T --include-ignored --skip d256 --skip proptest \
  --skip long_rows > "$OUT/memcheck.log" 2>&1; echo "rc=$?"; summary "$OUT/memcheck.log"
timeout 90 compute-sanitizer --tool racecheck $T --include-ignored must_pass_windows > "$OUT/racecheck.log" 2>&1
echo "rc=$?"; summary "$OUT/racecheck.log"
echo "== mha-backend GPU tests"
timeout 120 tests/mha-backend-gpu --include-ignored > "$OUT/backend.log" 2>&1; echo "rc=$?"; summary "$OUT/backend.log"
