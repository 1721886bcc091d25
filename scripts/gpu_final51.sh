#!/usr/bin/env bash
# Session-11 last device call: A/Bs (DeepSeek-V4 FMA keys, Qwen3 register cap), the GPU kernel tests that run 50 did
# not finish plus every test the FMA keys' sqrt-softplus form touches, then the full benchmark table.
set -uo pipefail
out=${OUT:-/tmp/moegate-gpu}; mkdir -p "$out"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/env.txt"
timeout 50 python3 -m moegate.bench --shapes deepseek-v4 --tokens 1 --ref-tokens= --rep 10 --repeats 3 \
  --ab 16,256,1024,4096 --ab-variants no-fma-keys 2>&1 | tee "$out/ab1.log" | grep "^ab "
timeout 40 python3 -m moegate.bench --shapes qwen3 --tokens 1 --ref-tokens= --rep 10 --repeats 3 --ab 8192,12288 \
  --ab-variants maxnreg-64 2>&1 | tee "$out/ab2.log" | grep "^ab "
start=$(date +%s)
timeout 150 python3 - > "$out/tests.log" 2>&1 <<'PY'
import re, sys, pytest
done = [l.strip() for l in open("scripts/.passed50.txt") if l.strip()]
again = re.compile(r"sqrtsoftplus|ssp|dsv4|fma|launcher|exact_path")
args = ["tests/test_kernel.py", "-v", "-p", "no:cacheprovider", "-n", "16", "-W", "ignore"]
for t in done:
    if not again.search(t):
        args += ["--deselect", t]
sys.exit(pytest.main(args))
PY
echo "tests rc=$? in $(( $(date +%s) - start )) s"; grep -cE " PASSED" "$out/tests.log"; grep -E "FAILED|ERROR" "$out/tests.log" | head -20; tail -2 "$out/tests.log"
timeout 320 python3 -m moegate.bench --ref-tokens= --rep 5 --repeats 3 --json "$out/bench.json" 2>&1 | tee "$out/bench.log" | tail -22
