#!/usr/bin/env bash
# The whole loop on a lent GPU machine (issue #32), as one prepared run:
#
#   1. what the machine lacks: the wheels in .whl/ (pip download'ed for its Python, see
#      the device tool's README) into a target dir; fastecdsa has no wheel for it and it has
#      no GMP headers, so a stub takes its place that refuses ECDSA keys (py-libp2p imports
#      it for P-256 keys; every node here has an Ed25519 key);
#   2. one import of everything, and the machine (torch, transformers, the GPU); with
#      PROBE=1.1b, one batch of a random-init model of that shape generated and judged
#      without the network (bench/gpu_devnet.py --probe);
#   3. the devnet of the tiny base policy on the GPU (bench/gpu_devnet.py): 3 workers (one
#      cheating with other_weights and int8_weights in turn), a GPU validator in bf16 and a
#      CPU validator in fp32, the trainer on CUDA, TINY_STEPS steps;
#      with GPU_TESTS=1, then the suite's GPU tests (pytest -m gpu, vLLM's left out; the
#      pytest-trio wheel among the carried ones), at most TESTS_TIMEOUT seconds;
#   4. a model of TinyLlama's shape (model init --shape 1.1b, a short SFT on the GPU so
#      that its rewards vary and GRPO has something to train on);
#   5. the same devnet with it, BIG_STEPS steps (1: every node keeps each version of 4.4 GB
#      in fp32, the trainer its checkpoint and AdamW state, on a 64 GB disk), smaller batches
#      (the CPU validator recomputes a 1.1B model in fp32).
#
# Measured on an H200 on 2026-12-04 (bench/gpu_devnet.py's docstring and the README's
# Benchmarks have the figures): the whole script in 359 s of the 600 a device call may take;
# the carried transformers 5.25 wanted the `kernels` package on CUDA, so the machine's 5.17
# ran (the script falls back to it by itself).
#
# Results in $OUT: steps.log (everything printed), gpu.csv (nvidia-smi every 5 s), and per
# run a tarball of its report (statuses.json, metrics.jsonl, bench-run.json) and node logs,
# written as each run ends. A CPU rehearsal of the same script:
#   DEVICE=cpu WHEELS=none FORCE_STUB=1 BIG_FLAGS="--hidden 64 --layers 2" SFT_STEPS=40 \
#       PY=.venv/bin/python bench/gpu_loop.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-loop-out}
WORK=${WORK:-/tmp/gpu-loop}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
TINY_STEPS=${TINY_STEPS:-10}
BIG_STEPS=${BIG_STEPS:-1}
BIG_FLAGS=${BIG_FLAGS:---shape 1.1b}
BIG_TASKS=${BIG_TASKS:-arithmetic:1-2}
SFT_STEPS=${SFT_STEPS:-150}
BUDGET=${BUDGET:-560}  # seconds for the whole script: the device tool stops a call at 600
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$OUT/steps.log"
say() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1

WHEELS=${WHEELS:-.whl}
if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    say "installing $(ls "$WHEELS"/*.whl | wc -l) wheels into $WORK/site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
        "$WHEELS"/*.whl >>"$LOG" 2>&1 || { say "the wheels did not install"; exit 1; }
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -n "${FORCE_STUB:-}" ] || ! $PY -c "import fastecdsa" 2>/dev/null; then
    say "fastecdsa missing: a stub that refuses ECDSA keys (every node here uses Ed25519)"
    stub="$WORK/stub/fastecdsa"
    mkdir -p "$stub/encoding"
    refuse='raise NotImplementedError("ECDSA keys: fastecdsa is a stub on this machine")'
    printf '' >"$stub/__init__.py"
    printf 'class Curve: ...\nP256 = Curve()\n' >"$stub/curve.py"
    printf 'class Point: ...\n' >"$stub/point.py"
    printf 'PEMEncoder = None\ndef gen_private_key(*a, **k): %s\ndef get_public_key(*a, **k): %s\ndef export_key(*a, **k): %s\n' \
        "$refuse" "$refuse" "$refuse" >"$stub/keys.py"
    printf '' >"$stub/encoding/__init__.py"
    printf 'class SEC1Encoder:\n    @staticmethod\n    def encode_public_key(*a, **k): %s\n    @staticmethod\n    def decode_public_key(*a, **k): %s\n' \
        "$refuse" "$refuse" >"$stub/encoding/sec1.py"
    printf 'def int_bytelen(n): return (n.bit_length() + 7) // 8\n' >"$stub/encoding/util.py"
    export PYTHONPATH="$WORK/stub${PYTHONPATH:+:$PYTHONPATH}"
fi
check() {  # every import the nodes make, and the tiny base policy's forward on $DEVICE
    DEVICE="$DEVICE" $PY - <<'EOF' 2>&1 | tee -a "$LOG"
import glob, os
import torch, transformers, libp2p, web3, eth_tester, trio
import node.cli.main, node.roles.services.validator, node.roles.services.inference, node.roles.services.trainer
from node.engine.models import load_model
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, libp2p ok, {gpu}")
m = load_model(glob.glob(".devcache/models/*/")[0], device=os.environ["DEVICE"])
logits = m.model(torch.tensor([[2, 20, 21]], device=m.device)).logits
print(f"tiny base policy on {m.device}: logits {tuple(logits.shape)} {logits.dtype}")
EOF
}
if ! check; then
    # the machine's own transformers (and hub) instead of the carried ones
    say "the imports failed; again with the machine's transformers"
    rm -rf "$WORK"/site/transformers* "$WORK"/site/huggingface_hub*
    check || { say "the imports failed"; exit 1; }
fi
[ -n "${ONLY_CHECK:-}" ] && exit 0
df -h "$WORK" | tail -n 1 | tee -a "$LOG"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 \
        >"$OUT/gpu.csv" 2>/dev/null &
    smi=$!
    trap 'kill "$smi" 2>/dev/null' EXIT
fi
# the tiny base policy travels with the tree (.devcache/): the devnet copies it, no SFT here
export INTELLECT_NODE_CACHE="$PWD/.devcache"

keep() {  # keep NAME: its report and node logs in $OUT/NAME.tar.gz
    (cd "$WORK" && tar czf "$OUT/$1.tar.gz" "$1-report" $(ls "$1"/net/*/node.log "$1"/net/chain.log 2>/dev/null))
}

if [ -n "${PROBE:-}" ]; then  # one batch of a random-init model of that shape, no network
    say "probe: one batch of a $PROBE model, generated and judged on $DEVICE"
    timeout -k 10 "${PROBE_TIMEOUT:-120}" $PY bench/gpu_devnet.py --probe "$PROBE" \
        --device "$DEVICE" --json 2>&1 | tail -n 2 | tee -a "$LOG"
fi

say "run 1: the tiny base policy, $TINY_STEPS steps, validators on $DEVICE and cpu"
timeout -k 20 "${TINY_TIMEOUT:-300}" $PY bench/gpu_devnet.py --device "$DEVICE" \
    --validator-devices "$DEVICE,cpu" --inference 3 --cheaters 1 \
    --cheats other_weights,int8_weights --steps "$TINY_STEPS" --duration "${TINY_DURATION:-200}" \
    --base-dir "$WORK/tiny" --report "$WORK/tiny-report" --json 2>&1 | tee -a "$LOG"
say "run 1 ended: $?"
keep tiny

if [ -n "${GPU_TESTS:-}" ]; then  # the suite's GPU checks (vLLM's left out: it is not here)
    say "pytest -m gpu (not vllm), at most ${TESTS_TIMEOUT:-100} s"
    timeout -k 10 "${TESTS_TIMEOUT:-100}" $PY -m pytest -q -m gpu -k "not vllm" -p no:cacheprovider \
        tests/test_gpu.py 2>&1 | tail -n 15 | tee -a "$LOG"
fi
[ -n "${ONLY_TINY:-}" ] && { say "done"; exit 0; }
say "model: $BIG_FLAGS on $DEVICE, $SFT_STEPS SFT steps on $BIG_TASKS"
# shellcheck disable=SC2086
timeout -k 10 "${BUILD_TIMEOUT:-180}" $PY -m node.cli model init "$WORK/big-model" $BIG_FLAGS \
    --device "$DEVICE" --task "$BIG_TASKS" --steps "$SFT_STEPS" --schedule 600 --lr 3e-4 \
    --no-cache --json 2>&1 | tail -n 3 | tee -a "$LOG"
du -sh "$WORK/big-model" 2>&1 | tee -a "$LOG"

big=$(($(left) - 70))  # its nodes' start and stop, and the tarball, within the budget
[ "$big" -gt "${BIG_DURATION:-270}" ] && big=${BIG_DURATION:-270}
if [ "$big" -lt 90 ] || [ ! -f "$WORK/big-model/config.json" ]; then
    say "no run 2: $big s left for it, or no model built"
    exit 0
fi
say "run 2: that model, $BIG_STEPS steps, 8 tasks x 8 samples a batch, at most $big s"
INTELLECT_NODE_RUN__TASKSET="$BIG_TASKS" INTELLECT_NODE_RUN__TASKS_PER_BATCH=8 INTELLECT_NODE_RUN__GROUP_SIZE=8 \
    INTELLECT_NODE_TRAINER__EVAL_EVERY=0 \
    timeout -k 20 $((big + 50)) $PY bench/gpu_devnet.py --device "$DEVICE" \
    --validator-devices "$DEVICE,cpu" --inference 3 --cheaters 1 \
    --cheats other_weights,int8_weights --steps "$BIG_STEPS" --model "$WORK/big-model" \
    --duration "$big" --base-dir "$WORK/big" --report "$WORK/big-report" \
    --json 2>&1 | tee -a "$LOG"
say "run 2 ended: $?"
df -h "$WORK" | tail -n 1 | tee -a "$LOG"
keep big
say "done"
