#!/usr/bin/env bash
# Puts FlashInfer's DeepSeek routing op (fused_topk_deepseek, the NoAuxTc CUDA kernel, flashinfer-python 0.7.4 on
# PyPI) into DIR as one archive, DIR/flashinfer-router.tar.xz, for the benchmark's `flashinfer` column: the Python
# package (its .py files), the sources and headers the op's JIT build compiles (csrc/fused_moe/noAuxTcKernels.cu and
# what it includes, nv_internal, include, cccl, spdlog), and the apache-tvm-ffi wheel it loads through, unpacked
# for CPython 3.12 (the device machine's Python). scripts/gpu_check.sh unpacks it into DIR/flashinfer-site, where
# `python -m moegate.bench` finds it; the op is compiled there on first use (nvcc, sm_90; about a minute).
# For side-by-side benchmarks only: DIR must be git-ignored (.peers/ is); never commit its content.
# Usage: scripts/fetch_flashinfer_router.sh [DIR]     (default .peers)
set -euo pipefail
dir=${1:-.peers}
mkdir -p "$dir"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp/dl" flashinfer-python==0.7.4
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$tmp/dl" "apache-tvm-ffi>=0.1.11,<0.2"
python3 - "$tmp" <<'PY'
import glob, os, sys, zipfile
tmp = sys.argv[1]
site = os.path.join(tmp, "site")
data = "flashinfer/data/"
# What the op's JIT build reads (flashinfer.jit.gen_dsv3_fused_routing_module and its include list).
keep_data = ("include/", "cccl/", "spdlog/", "csrc/nv_internal/", "csrc/fused_moe/noAuxTcKernels.cu",
             "csrc/fused_moe/moeTopKFuncs.cuh", "csrc/fused_moe/cake_deepseek_fused_routing_launch.cuh",
             "csrc/fused_moe/cake_deepseek_fused_routing/")
fi = zipfile.ZipFile(glob.glob(f"{tmp}/dl/flashinfer_python-*.whl")[0])
n = 0
for name in fi.namelist():
    if name.startswith(data):
        rest = name[len(data):]
        wanted = rest.startswith(keep_data) or (rest.startswith("csrc/") and rest.count("/") == 1 and rest.endswith(".h"))
    else:
        wanted = name.startswith("flashinfer/") and name.endswith((".py", ".json", "py.typed"))
    if wanted:
        fi.extract(name, site)
        n += 1
if not os.path.isfile(os.path.join(site, data, "csrc/fused_moe/noAuxTcKernels.cu")):
    raise SystemExit("fetch_flashinfer_router: the wheel has no csrc/fused_moe/noAuxTcKernels.cu")
zipfile.ZipFile(glob.glob(f"{tmp}/dl/apache_tvm_ffi-*.whl")[0]).extractall(site)
print(f"kept {n} files of {os.path.basename(fi.filename)} and apache-tvm-ffi")
PY
tar -C "$tmp" -cJf "$dir/flashinfer-router.tar.xz" site
ls -la "$dir/flashinfer-router.tar.xz"
