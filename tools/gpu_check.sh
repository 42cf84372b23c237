#!/usr/bin/env bash
# One-shot GPU check (issue 6): the spec suite on CUDA, the CUDA benchmarks side by side (bf16),
# the graded performance checks on CUDA, and GPT-2-small training-step MFU, eager and compiled.
#
#   OUT=/some/folder tools/gpu_check.sh          # run from the repository root
#
# Everything goes under $OUT (default ./gpu_results): env.txt, spec_cuda.xml, cuda.json
# (pytest-benchmark, with GPU name and torch/CUDA versions in machine_info), cuda.md and PNGs
# (tools/bench_report.py; PNGs only where matplotlib is installed), perf_checks_cuda.json,
# mfu_eager.json, mfu_compiled.json, and summary.txt. Each step has its own time limit so the
# whole script stays under 10 minutes; a failing step is recorded and the next one still runs.
# Needs: a CUDA build of torch, pytest, pytest-benchmark, einops, numpy, hypothesis; transformers
# for the Hugging Face column. Nothing is downloaded.
#
# Plumbing check without a GPU (small sizes, CPU):
#   DEVICE=cpu BENCH_ARGS="--bench-sizes smoke" MFU_ARGS="--config gpt2-tiny --batch 2 --seq-len 32" OUT=/tmp/g tools/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_results}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
BENCH_ARGS="${BENCH_ARGS:-}"
MFU_ARGS="${MFU_ARGS:-}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
started=$(date +%s)

step() {  # step NAME LIMIT_SECONDS COMMAND... : run with a time limit, log to $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local t0=$(date +%s)
    timeout --signal=INT --kill-after=15 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    printf '%-18s rc=%-3s %4ss  %s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$*" | tee -a "$SUMMARY"
    tail -n 5 "$OUT/$name.log" | sed 's/^/    /' >>"$SUMMARY"
    return 0
}

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    "$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
for name in ("transformers", "pytest_benchmark", "matplotlib", "einops", "hypothesis"):
    try:
        print(name, __import__(name).__version__)
    except ImportError:
        print(name, "not installed")
EOF
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >>"$SUMMARY"
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device visible to torch: nothing to run" | tee -a "$SUMMARY"
    exit 1
fi

# 1. The spec suite on CUDA (float32/float64 with TF32 off, as the plugin sets).
step spec 110 "$PY" -m pytest spec_tests --spec-device "$DEVICE" -q -p no:cacheprovider \
    --junitxml="$OUT/spec_$DEVICE.xml"

# 2. Benchmarks side by side in bf16: attention to T 8192, Llama at GPT-2-small size (impl = the
#    reference, and Hugging Face), decode to context 1792, GPT-2 small training step for MFU.
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
step bench 230 "$PY" -m pytest benchmarks --device "$DEVICE" -q -p no:cacheprovider \
    --benchmark-only --benchmark-max-time 0.3 --benchmark-min-rounds 3 \
    --benchmark-json="$OUT/$DEVICE.json" --benchmark-columns=median,iqr,rounds $BENCH_ARGS
[ -s "$OUT/$DEVICE.json" ] && step report 20 "$PY" tools/bench_report.py "$OUT/$DEVICE.json" --out "$OUT"

# 3. Graded performance checks on CUDA (reference).
step perf_checks 45 "$PY" -m benchmarks.perf_checks --impl reference --device "$DEVICE" \
    --json "$OUT/perf_checks_$DEVICE.json"

# 4. GPT-2 small training-step MFU, eager then torch.compile (the issue's goal: >= 40%).
# shellcheck disable=SC2086
step mfu_eager 40 "$PY" -m benchmarks.mfu --impl reference --device "$DEVICE" $MFU_ARGS --json "$OUT/mfu_eager.json"
# shellcheck disable=SC2086
step mfu_compiled 110 "$PY" -m benchmarks.mfu --impl reference --device "$DEVICE" --compile $MFU_ARGS \
    --json "$OUT/mfu_compiled.json"

echo "total $(($(date +%s) - started))s" | tee -a "$SUMMARY"
