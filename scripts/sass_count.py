"""Compile the router kernel for sm_90 on this machine (no GPU) and count its SASS instructions.

    python scripts/sass_count.py deepseek-v3-fp32 --tokens 65536 [--opcodes] [--dump FILE]

The shapes are the benchmark's (moegate.bench.SHAPES). The launch goes through ``route_triton`` with the
kernel swapped for a recorder, so the constexprs, launch shape and argument specialisation (16-byte
alignment, strides divisible by 16) are the ones a real launch on an H200 gets; Triton's bundled ptxas
and nvdisasm do the rest. Counts are static (straight-line code and loop bodies once): the instruction
count of one row's path is what matters for the large-T launches, which are bound by instruction issue.
"""

import argparse
import collections
import os
import re
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from moegate.kernels import router as kr
from moegate.kernels import router_kernel as rk


class _Capture:
    def __init__(self):
        self.args = self.kwargs = None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.args, self.kwargs = args, kwargs

        return launch


def compile_launch(logits, config, layout, bias=None, use_pdl=False, **route_kwargs):
    """The compiled kernel (sm_90) of the launch that route_triton would make for these inputs."""
    kernel, capture = rk._route_kernel, _Capture()
    os.environ["TRITON_INTERPRET"] = "1"  # let route_triton accept CPU tensors; the kernel is not run
    rk._route_kernel = capture
    try:
        kr.route_triton(logits, config, layout, bias=bias, **route_kwargs)
    finally:
        rk._route_kernel = kernel
        os.environ.pop("TRITON_INTERPRET")
    kwargs = dict(capture.kwargs)
    kwargs["ACCURATE"] = True
    kwargs["USE_PDL"] = use_pdl
    kwargs.pop("launch_pdl", None)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*capture.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def registers(compiled) -> int:
    """Registers per thread, from cuobjdump's resource usage of the cubin."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    cuobjdump = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else -1


def sass_counts(compiled) -> collections.Counter:
    counts = collections.Counter()
    for line in compiled.asm["sass"].splitlines():
        m = re.match(r"(?:\s*/\*[0-9a-f]+\*/|[-0-9:A-Y]+\t)\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            counts[m.group(1).split(".")[0]] += 1
    return counts


def fast_path_estimate(compiled) -> int:
    """Instructions of the main body minus its largest forward-skipped block (the exact-path fallback,
    which rows take only when the fast 32-bit words cannot decide) and minus the IEEE division slow paths
    (subroutines after the body's EXIT): an estimate of what one row executes."""
    lines = [ln for ln in compiled.asm["sass"].splitlines() if ln.strip()]
    labels, body, end = {}, [], None
    for ln in lines:
        text = ln.split("\t")[-1].strip()
        if re.match(r"^[.\w]+:$", text):
            labels[text[:-1]] = len(body)
            continue
        if end is None and text.startswith("EXIT"):
            end = len(body)
        body.append(text)
    if end is None:
        end = len(body)
    skip = 0
    for i, text in enumerate(body[:end]):
        m = re.match(r"@!?P\d+\s+BRA\s+([.\w]+);", text)
        if m and labels.get(m.group(1), -1) > i:
            skip = max(skip, min(labels[m.group(1)], end) - i)
    # The slow path of each IEEE division sits inline as a short skipped block with a CALL: ~6 lines each.
    calls = sum(1 for t in body[:end] if t.startswith("CALL"))
    return end - skip - 6 * calls


def main(argv=None) -> int:
    from moegate.bench import SHAPES
    from moegate.layout import ExpertLayout

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="*", default=list(SHAPES))
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--opcodes", action="store_true", help="print the count of each opcode")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a launcher override of moegate.kernels.router first, e.g. approx_keys_override=False")
    p.add_argument("--dump", help="write the SASS of the last shape to this file (and its TTGIR to FILE.ttgir)")
    a = p.parse_args(argv)
    for item in a.set:
        name, value = item.split("=", 1)
        setattr(kr, name, eval(value))  # a developer tool: values are Python literals
    for name in a.shapes:
        config, dtype = SHAPES[name]
        logits = torch.randn(64, config.num_scored).to(dtype)
        bias = torch.randn(config.num_scored) * 0.1 if config.has_correction_bias else None
        layout = ExpertLayout()
        block_m, num_warps = kr._launch_shape(a.tokens, kr._tile_shape(config)[0] * kr._tile_shape(config)[1])
        saved = kr.launch_override
        kr.launch_override = (block_m, num_warps)
        try:
            compiled = compile_launch(logits, config, layout, bias=bias, use_pdl=a.tokens <= kr.PDL_MAX_TOKENS)
        finally:
            kr.launch_override = saved
        counts = sass_counts(compiled)
        total = sum(counts.values())
        print(f"{name:18s} T={a.tokens:<6d} block_m={block_m} warps={num_warps} regs={registers(compiled):3d} "
              f"sass={total} fast_path~{fast_path_estimate(compiled)}")
        if a.opcodes:
            print("   ", " ".join(f"{k}:{v}" for k, v in counts.most_common()))
        if a.dump:
            with open(a.dump, "w") as f:
                f.write(compiled.asm["sass"])
            with open(a.dump + ".ttgir", "w") as f:
                f.write(compiled.asm["ttgir"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
