#!/usr/bin/env bash
# #14's many-core run, on a lent device machine (16 cores, an H200, no network), from what
# bench/device_bundle.sh carried in .device/: one prepared command, ~6 min once started.
#
#     run(carry=[".device"], timeout_s=540, command="bench/device_many_core.sh")
#
# The engine is the bundle's CPU-only llama-server, so fitbox places it in RAM beside the
# real GPU (Abilities.gpus, no_gpu_backend) and claims cores for it as on any CPU box. The
# model is SmolLM2-135M's shape written with tests/support/ggufs.py (the wheel does not fit the
# carry), quantized to Q4_1 like the wheel's; bench/rig.py makes its Q4_0 twin. Figures land
# under $OUT (or /tmp/many-core): each bench's output, the machine's CPUs and fitbox's argv.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/many-core}
work=${MANY_CORE_WORK:-/tmp/many-core-work}
mkdir -p "$out" "$work/site" "$work/models"
py=${PYTHON:-python3}
# wheel by wheel: one built for another interpreter is skipped and the image's copy serves
for wheel in .device/whl/*.whl; do
    $py -m pip install -q --no-deps --no-index --target "$work/site" "$wheel" 2>/dev/null ||
        echo "skipped ${wheel##*/} (the image's own copy serves)"
done
export PYTHONPATH="$root/src:$root:$work/site"
export LD_LIBRARY_PATH="$root/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LLAMA_SERVER_BIN="$root/.device/bin/llama-server"
export FITBOX_TEST_CACHE="$work/cache"
{
    echo "cpus: $(nproc) online; $($py -c 'import psutil; print(psutil.cpu_count(logical=False))') physical"
    grep -m1 "model name" /proc/cpuinfo || true
    "$LLAMA_SERVER_BIN" --version 2>&1 | grep -m1 version || true
    "$LLAMA_SERVER_BIN" --list-devices 2>&1 | tail -n +1 || true
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
} | tee "$out/machine.txt"
model="$work/models/smol-shaped.gguf"
if [ ! -f "$model" ]; then
    # SmolLM2-135M: 30 layers, 576 wide, 9 heads over 3 KV heads, FFN 1536, 49152 tokens
    $py - "$work/models/smol-shaped-f32.gguf" <<'PY'
import sys
from pathlib import Path
from tests.support.ggufs import SPECIALS, WORDS, write_tiny_llama
write_tiny_llama(Path(sys.argv[1]), n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536,
                 n_ctx=8192, extra_vocab=49152 - len(SPECIALS) - len(WORDS), tied=True)
PY
    "$root/.device/bin/llama-quantize" "$work/models/smol-shaped-f32.gguf" "$model" Q4_1 \
        > "$work/quantize.log" 2>&1
    rm "$work/models/smol-shaped-f32.gguf"
fi
export FITBOX_BENCH_GGUF="$model"
# swaps and latency on few rounds (their 2-core runs stand); decode, prompt and concurrent
# rows are what this machine is for
timeout 330 $py -u bench/side_by_side.py --latency 10 --swaps 6 --decode 9 --prompt 9 \
    --clients 8 --together 3 --loads 3 2>&1 | tee "$out/side_by_side.txt" || true
timeout 150 $py -u bench/prompt_read.py --sessions 6 --rounds 4 2>&1 | tee "$out/prompt_read.txt" || true
