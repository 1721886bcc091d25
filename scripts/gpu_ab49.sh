#!/usr/bin/env bash
# Session-11 device call: A/B of the FMA reciprocal (FMA_RCP), then the GPU kernel suite with test names (-v).
set -uo pipefail
out=${OUT:-/tmp/moegate-gpu}; mkdir -p "$out"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/env.txt"
timeout 150 python3 -m moegate.bench --shapes deepseek-v3-fp32,deepseek-v3-bf16,kimi-k2,512-top22,896-top16 \
  --tokens 1 --ref-tokens= --rep 10 --repeats 3 --ab 16,256,1024,4096,8192,16384 --ab-variants no-fma-rcp 2>&1 \
  | tee "$out/ab1.log" | grep "^ab "
timeout 60 python3 -m moegate.bench --shapes deepseek-v3-fp32,deepseek-v3-bf16,kimi-k2 --tokens 1 --ref-tokens= \
  --rep 10 --ab 32768,65536 --ab-variants exact-fma-rcp,exact-div 2>&1 | tee "$out/ab2.log" | grep "^ab "
timeout 25 python3 -m moegate.bench --shapes qwen3 --tokens 1 --ref-tokens= --rep 10 --repeats 3 --ab 8192,12288 \
  --ab-variants maxnreg-64 2>&1 | tee "$out/ab3.log" | grep "^ab "
start=$(date +%s)
timeout "${SUITE_S:-330}" python3 -m pytest tests/test_kernel.py -v -p no:cacheprovider -n 16 -W ignore 2>&1 \
  > "$out/tests.log"
echo "suite rc=$? in $(( $(date +%s) - start )) s"; grep -cE " PASSED" "$out/tests.log"; grep -E "FAILED|ERROR" "$out/tests.log" | head -20; tail -3 "$out/tests.log"
