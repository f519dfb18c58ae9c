#!/usr/bin/env bash
# Everything vramguard measures on a GPU, in one go (about seven minutes on one
# H100/H200; the reference stops starting runs at GPU_DEADLINE):
#   1. the GPU tests (`#[ignore]`d in CI): NVML and CUDA backends, the
#      largest-block probe on an idle and a fragmented device, the kernels of
#      kernels/touch.cu; then `vramguard agent --once` on the real GPUs;
#   2. benches/gpu_mechanisms.py: context and kernel images, cuDNN workspaces,
#      the allocator over variable-length batches;
#   3. benches/gpu_truth.py: the hand-built models' steps;
#   4. benches/gpu_reference.py: the reference's configurations, until the
#      deadline.
# Rows land in benches/ground-truth/; logs in $OUT (default target/gpu-run).
#
#   benches/gpu_run.sh                  # builds the tests with cargo first
#   GPU_BIN=dir benches/gpu_run.sh      # test binaries built elsewhere (agent-tests,
#                                       # lib-tests, vramguard; .gz accepted)
#   GPU_DEADLINE=400 benches/gpu_run.sh # seconds after the start that no reference run starts
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-target/gpu-run}
mkdir -p "$OUT"
START=$(date +%s)
export PYTHONUNBUFFERED=1
stage() { echo "== $1 at +$(($(date +%s) - START)) s" | tee -a "$OUT/stages.txt"; }

stage environment
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__, "peft", peft.__version__)'
} >> "$OUT/stages.txt" 2>&1

stage "GPU tests"
if [ -n "${GPU_BIN:-}" ]; then
  BIN=$(mktemp -d)
  for f in "$GPU_BIN"/*; do
    case $f in
      *.gz) gunzip -c "$f" > "$BIN/$(basename "$f" .gz)" ;;
      *) cp "$f" "$BIN/" ;;
    esac
  done
  chmod +x "$BIN"/*
  AGENT_TESTS=$BIN/agent-tests LIB_TESTS=$BIN/lib-tests VRAMGUARD=$BIN/vramguard
else
  cargo build --release
  AGENT_TESTS=$(cargo test --release --test agent --no-run 2>&1 | sed -n 's/.*(\(target[^)]*\)).*/\1/p')
  LIB_TESTS=$(cargo test --release --lib --no-run 2>&1 | sed -n 's/.*(\(target[^)]*\)).*/\1/p')
  VRAMGUARD=target/release/vramguard
fi
timeout 120 "$AGENT_TESTS" --ignored --nocapture --test-threads 1 > "$OUT/gpu-tests.log" 2>&1
echo "agent tests: exit $?" >> "$OUT/stages.txt"
timeout 120 "$LIB_TESTS" --ignored --nocapture --test-threads 1 agent:: >> "$OUT/gpu-tests.log" 2>&1
echo "lib GPU tests: exit $?" >> "$OUT/stages.txt"
NODE_NAME=gpu-run timeout 60 "$VRAMGUARD" agent --once -o yaml > "$OUT/agent-once.yaml" 2>&1
echo "agent --once: exit $?" >> "$OUT/stages.txt"

stage "mechanisms (context, cuDNN) beside gpu_truth"
# Each run reads its own process's figures, so these share the GPU; the rows
# each script writes go to one expected.json, so those writers take turns.
timeout 300 python3 benches/gpu_mechanisms.py context cudnn > "$OUT/mechanisms.jsonl" \
  2> "$OUT/mechanisms.err" &
timeout 200 python3 benches/gpu_truth.py --parallel 6 2> "$OUT/gpu-truth.log"
wait

stage "mechanisms (variable-length batches)"
timeout 200 python3 benches/gpu_mechanisms.py varlen >> "$OUT/mechanisms.jsonl" \
  2>> "$OUT/mechanisms.err"

stage reference
LEFT=$(( ${GPU_DEADLINE:-400} - ($(date +%s) - START) ))
[ "$LEFT" -gt 10 ] && timeout $((LEFT + 90)) python3 benches/gpu_reference.py --parallel 12 \
  --deadline "$LEFT" 2> "$OUT/reference.log"

stage done
tar czf "$OUT/ground-truth.tgz" benches/ground-truth
cat "$OUT/stages.txt"
grep -E "context overhead|idle:|fragmented|memory check|test result" "$OUT/gpu-tests.log"
cut -c1-600 "$OUT/mechanisms.jsonl"
tail -c 1500 "$OUT/mechanisms.err"
tail -n 5 "$OUT/gpu-truth.log" "$OUT/reference.log"
