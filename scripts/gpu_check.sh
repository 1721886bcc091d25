#!/usr/bin/env bash
# One device call: the kernel test suites on the GPU (TEST_FILES: other files), then the benchmark.
#   scripts/gpu_check.sh [--sweep] [bench args...]
# Logs and JSON go to $OUT (the device tool's output folder) or /tmp/moegate-gpu. SGLang's router is
# looked for in .peers/ (carry it: carry [".peers"]), and so is FlashInfer's DeepSeek routing op
# (.peers/flashinfer-router.tar.xz from scripts/fetch_flashinfer_router.sh, unpacked here into
# .peers/flashinfer-site; the bench compiles it on first use). HOST=1 also times an eager call's host path
# (scripts/host_overhead.py; its first calls compile four launches). FUZZ=N runs scripts/gpu_fuzz.py for about N
# seconds after the tests (FUZZ_ARGS adds its options, e.g. "--force-paths --seed 400000"; a case running at N + 60 s
# is cut, and the fuzz still prints what it finished). SHARD=i/n runs the tests i, i + n, ... of the collected suite
# (MOEGATE_SHARD, tests/conftest.py): a suite longer than one call in n calls. MOEGATE_SET="NAME=VALUE;..." runs
# the tests on launcher settings that are not the defaults (as the bench's --set; tests/conftest.py). Exit status: the
# tests' status, else the fuzz's.
set -uo pipefail
out=${OUT:-/tmp/moegate-gpu}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python3}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$out/env.txt"
if [ -f .peers/flashinfer-router.tar.xz ]; then  # unpacked anew each call (a few seconds): never a stale or half copy
  rm -rf .peers/flashinfer-site && mkdir -p .peers/flashinfer-site \
    && tar -C .peers/flashinfer-site --strip-components=1 -xJf .peers/flashinfer-router.tar.xz
fi
test_rc=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  start=$(date +%s)
  [ -n "${SHARD:-}" ] && export MOEGATE_SHARD="$SHARD" && echo "shard $SHARD"
  # -v: the log names each test as it ends, so a call cut by its limit still says which tests were left.
  # PYTEST_K: a -k expression (spaces kept: "cached or logit_keys"), where PYTEST_ARGS splits on them.
  "$py" -m pytest ${TEST_FILES:-tests/test_kernel.py tests/test_warp_rows.py} -v -p no:cacheprovider --durations=20 ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} \
    2>&1 | tee "$out/tests.log" \
    | grep -v " PASSED " | tail -50
  test_rc=${PIPESTATUS[0]}
  echo "kernel tests: rc=$test_rc in $(( $(date +%s) - start )) s"
fi
fuzz_rc=0
if [ "${FUZZ:-0}" != 0 ]; then
  timeout -s TERM $(( FUZZ + 60 )) "$py" scripts/gpu_fuzz.py --seconds "$FUZZ" ${FUZZ_ARGS:-} 2>&1 \
    | grep -v "Warning" | tee "$out/fuzz.log" | tail -12
  fuzz_rc=${PIPESTATUS[0]}
  [ "$fuzz_rc" = 124 ] && fuzz_rc=0  # cut by the timeout: its summary says so; failures printed above it count
  grep -q "^FAIL" "$out/fuzz.log" && fuzz_rc=1
  echo "fuzz: rc=$fuzz_rc"
fi
if [ "${HOST:-0}" = 1 ]; then
  "$py" scripts/host_overhead.py --calls 500 --repeats 3 2>&1 | tee "$out/host.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  # A second call into the same $OUT (two benches in one device call) writes bench-2.*, and so on: never over the first.
  name=bench n=1
  while [ -e "$out/$name.log" ]; do n=$((n + 1)); name=bench-$n; done
  "$py" -m moegate.bench --json "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
fi
[ "$test_rc" != 0 ] && exit "$test_rc"
exit "$fuzz_rc"
