#!/usr/bin/env bash
# Session-11 extra device call: the GPU kernel tests that neither run 50 nor run 51 finished.
set -uo pipefail
out=${OUT:-/tmp/moegate-gpu}; mkdir -p "$out"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
start=$(date +%s)
timeout 220 python3 - > "$out/tests.log" 2>&1 <<'PY'
import sys, pytest
done = {l.strip() for f in ("scripts/.passed50.txt", "scripts/.passed51.txt") for l in open(f) if l.strip()}
args = ["tests/test_kernel.py", "-v", "-p", "no:cacheprovider", "-n", "16", "-W", "ignore"]
for t in sorted(done):
    args += ["--deselect", t]
sys.exit(pytest.main(args))
PY
echo "tests rc=$? in $(( $(date +%s) - start )) s"; grep -cE " PASSED" "$out/tests.log"; grep -E "FAILED|ERROR" "$out/tests.log" | head -20; tail -2 "$out/tests.log"
