"""Compile the router kernel for sm_90 on this machine (no GPU) and count its SASS instructions.

    python scripts/sass_count.py deepseek-v3-fp32 --tokens 65536 [--opcodes] [--lines] [--dump FILE]

The shapes are the benchmark's (moegate.bench.SHAPES). The launch goes through ``_route_triton`` (route()'s
launch path after its checks) with the kernel swapped for a recorder, so the constexprs, launch shape and
argument specialisation (16-byte alignment, strides divisible by 16) are the ones a real launch on an H200
gets; Triton's bundled ptxas
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from moegate.kernels import router as kr  # noqa: E402
from moegate.kernels import router_kernel as rk  # noqa: E402
from moegate.kernels import warp_rows_kernel as wrk  # noqa: E402


class _Capture:
    def __init__(self):
        self.args = self.kwargs = None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.args, self.kwargs = args, kwargs

        return launch


def compile_launch(logits, config, layout, bias=None, use_pdl=False, warp_rows=False, **route_kwargs):
    """The compiled kernel (sm_90) of the launch of the router kernel that route() would make for these inputs (where
    the launcher would take the rows-on-warps kernel instead, the router kernel's launch: warp_rows_override off);
    warp_rows: the rows-on-warps kernel's launch (warp_rows_override on)."""
    module, attr = (kr.wrk, "_warp_rows_kernel") if warp_rows else (rk, "_route_kernel")
    kernel, capture, override = getattr(module, attr), _Capture(), kr.warp_rows_override
    interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # let route_triton accept CPU tensors; the kernel is not run
    router_kernel = rk._route_kernel
    rk._route_kernel = _Capture()  # (not a compiled function: the launcher's check of TRITON_INTERPRET passes)
    setattr(module, attr, capture)
    kr.warp_rows_override = warp_rows
    try:
        kr._route_triton(logits, config, layout, bias=bias, **route_kwargs)
    finally:
        setattr(module, attr, kernel)
        rk._route_kernel = router_kernel
        kr.warp_rows_override = override
        if interpret is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = interpret
    kwargs = dict(capture.kwargs)
    kwargs["ACCURATE"] = True
    if not warp_rows:
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


def param_lines(compiled) -> list[int]:
    """The 64-byte lines of the kernel-parameter bank (c[0x0][0x210] on, sm_90) that the SASS reads: each is a
    constant-cache miss the first time a launch touches it (BENCHMARKS.md run 32)."""
    addrs = {int(a, 16) for a in re.findall(r"c\[0x0\]\[(0x[0-9a-f]+)\]", compiled.asm["sass"])}
    return sorted({a & ~63 for a in addrs if a >= 0x210})


def kernel_params(compiled) -> tuple[int, int]:
    """(count, bytes) of the kernel's parameters in its PTX entry, Triton's own scratch pointers included: what a
    launch hands the GPU (arguments passed as None are constexprs, not parameters)."""
    types = re.findall(r"^\s*\.param\s+\.([usbf](?:8|16|32|64))\b", compiled.asm["ptx"], flags=re.M)
    sizes = [int(t[1:]) // 8 for t in types]
    return len(sizes), sum(sizes)


def sass_counts(compiled) -> collections.Counter:
    """Opcode counts of the whole kernel, from nvdisasm (Triton's own `asm["sass"]` stops at 4096 instructions)."""
    seq, _labels = _disassemble(compiled)
    return collections.Counter(_opcode(text) for _f, _l, text in seq)


# SASS opcodes that issue to the ALU pipe (integer compare, select, logic, min/max, float compare and
# select): a half-rate pipe on sm_90, the one Nsight Compute found busiest for the 256-lane rows (run 9).
ALU_OPS = frozenset(("ISETP", "SEL", "LOP3", "VIMNMX", "VIMNMX3", "VIADDMNMX", "IADD3", "SHF", "FSETP", "FSEL",
                     "FMNMX", "PLOP3", "P2R", "R2P", "PRMT", "POPC", "FLO", "IABS", "LEA", "SGXT", "VIADD",
                     "BMSK", "IMNMX", "MOV", "FCHK"))


def _disassemble(compiled, with_control=False):
    """[(source file, line, instruction text)] of the cubin in order, and {label: index}."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    nvdisasm = os.path.join(os.path.dirname(get_ptxas(90).path), "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([nvdisasm, "-g", "-c", "-hex", f.name], capture_output=True, text=True,
                             check=True).stdout
    where, seq, labels, control = (None, None), [], {}, []
    for ln in out.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"^\s*(\.L\w+):", ln)
        if m:
            labels[m.group(1)] = len(seq)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", ln)
        if m:
            seq.append((*where, m.group(1).strip()))
            continue
        m = re.match(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$", ln)  # an instruction's second word: its control bits
        if m:
            control.append(_control(int(m.group(1), 16)))
    if len(control) != len(seq):
        raise RuntimeError(f"control codes ({len(control)}) and instructions ({len(seq)}) do not line up")
    return (seq, labels, control) if with_control else (seq, labels)


def _control(word: int) -> tuple[int, int, int, int]:
    """(wait mask, read barrier, write barrier, stall cycles) of an sm_90 instruction's second 64-bit word; a
    barrier of 7 is none."""
    return (word >> 52) & 0x3F, (word >> 49) & 0x7, (word >> 46) & 0x7, (word >> 41) & 0xF


def _opcode(text: str) -> str:
    parts = text.split()
    return (parts[1] if parts[0].startswith("@") else parts[0]).split(".")[0]


def fast_path(compiled):
    """The instructions one row executes on the fast path: the kernel body up to its EXIT, without the
    blocks that the `if ambiguous:` branch (the exact-path fallback) and the repair of close fast-key winners
    skip, and without the IEEE divisions' slow paths (short skipped blocks that CALL a subroutine).
    [(file, line, text)]."""
    seq, _labels = _disassemble(compiled)
    return [seq[i] for i in fast_path_indices(compiled)]


def fast_path_indices(compiled) -> list[int]:
    """fast_path's instructions as indices into the cubin's instruction sequence."""
    seq, labels = _disassemble(compiled)
    guards = {}  # file -> the lines of the fallbacks' guards
    for mod in (rk, wrk):
        src = open(mod.__file__).read().splitlines()
        guards[os.path.basename(mod.__file__)] = {
            i + 1 for i, ln in enumerate(src) if ln.strip() in ("if ambiguous:", "if state == 1:", "if state > 1:")
            or ln.strip().startswith("if (tl.max(close_any")}
    # The first EXIT, or a predicated one at a guard (the program ends there when no row needs a fallback).
    end = next((i for i, (fname, line, text) in enumerate(seq) if text.startswith("EXIT")
                or (_opcode(text) == "EXIT" and line in guards.get(fname, ()))), len(seq))
    drop, guarded, largest = set(), {}, (0, 0)
    for i, (fname, line, text) in enumerate(seq[:end]):
        m = re.match(r"@!?U?P\w+\s+BRA\s+(?:!?U?P\w+,\s*)?`?\(?([.\w]+)", text)
        if not m or labels.get(m.group(1), -1) <= i:
            continue
        j = min(labels[m.group(1)], end)
        if j - i > largest[1] - largest[0]:
            largest = (i + 1, j)
        if line in guards.get(fname, ()):
            if j - i > guarded.get((fname, line), (0, 0))[1] - guarded.get((fname, line), (0, 0))[0]:
                guarded[(fname, line)] = (i + 1, j)  # the guard's largest skipped block
        elif j - i < 12 and any(seq[k][2].startswith("CALL") for k in range(i, j)):
            drop.update(range(i + 1, j))
    # The one-row path's fallbacks sit under the guards; elsewhere the fallback is the largest skipped block.
    for span in guarded.values() or [largest]:
        drop.update(range(*span))
    return [i for i in range(min(end + 1, len(seq))) if i not in drop]


def fast_path_estimate(compiled) -> int:
    return len(fast_path(compiled))


# A lone warp's issue model (--cycles). Each SASS instruction carries its scheduling in its control code
# (wait mask : read barrier : write barrier : yield : stall): the warp issues it once the scoreboards in its wait
# mask are released, then waits `stall` cycles before its next instruction. Instructions of variable latency set
# a scoreboard that is released this many cycles after issue (guesses for sm_90, not measured here: an L1 / L2
# hit for LDG, a constant-cache hit for LDC). With one warp an SM (T <= 132) nothing hides these waits, so the
# model's cycle count is the fast path's serial chain; it does not see instruction-cache or constant-cache misses,
# the launch, or the PDL overlap. Calibration and use: docs/kernel.md, "Where a small launch waits".
SCOREBOARD_LATENCY = {"LDG": 300, "LD": 300, "LDC": 40, "S2R": 20, "S2UR": 20, "CS2R": 20, "MUFU": 18, "SHFL": 24,
                      "REDUX": 30, "LDS": 30, "BAR": 24, "ATOMG": 300, "F2I": 12, "I2F": 12, "F2F": 12, "POPC": 12,
                      "FLO": 12, "BREV": 12, "VOTE": 8, "MATCH": 30}


def issue_timeline(compiled, gather_latency: int | None = None) -> list[tuple[float, str, int, str]]:
    """[(issue cycle, file, line, instruction)] of the fast path on one warp, under the model above.
    ``gather_latency``: the latency of the LDGs after the first, dependent ones such as the winners' logits (L1
    hits), where SCOREBOARD_LATENCY's LDG figure is the first read's."""
    seq, _labels, control = _disassemble(compiled, with_control=True)
    board, t, out = [0.0] * 6, 0.0, []
    load_boards, row_read = set(), False  # scoreboards of outstanding LDGs; the row's first read waited for
    for i in fast_path_indices(compiled):
        wait, read, write, stall = control[i]
        op = _opcode(seq[i][2])
        if wait:
            t = max([t] + [board[b] for b in range(6) if wait >> b & 1])
            row_read = row_read or any(wait >> b & 1 for b in load_boards)
        latency = SCOREBOARD_LATENCY.get(op, 20)
        if write != 7:
            if op == "LDG":
                load_boards.add(write)
                if row_read and gather_latency is not None:
                    latency = gather_latency
            board[write] = t + latency
        if read != 7:
            board[read] = max(board[read], t + 4)
        out.append((t, seq[i][0], seq[i][1], seq[i][2]))
        t += stall
    return out


def control_agreement(compiled) -> tuple[int, int]:
    """(matching, compared): _disassemble's control codes against those of Triton's own SASS listing (its
    `asm["sass"]`, whose control field is wait mask (decimal) : read : write : yield : stall (hex); the listing stops
    at 4096 instructions)."""
    _seq, _labels, control = _disassemble(compiled, with_control=True)
    listed = [ln.split("\t", 1)[0] for ln in compiled.asm["sass"].splitlines() if re.match(r"^[-0-9]{2}:", ln)]
    same = 0
    for (wait, read, write, stall), code in zip(control, listed):
        w, r, wr, _y, st = code.split(":")
        same += ((0 if w == "--" else int(w)) == wait and (7 if r == "-" else int(r)) == read
                 and (7 if wr == "-" else int(wr)) == write and int(st, 16) == stall)
    return same, min(len(control), len(listed))


def print_cycles(compiled, gather_latency: int | None) -> None:
    """The modelled cycles of one warp's fast path, and the source lines whose instructions waited longest."""
    same, compared = control_agreement(compiled)
    print(f"    control codes: {same} of {compared} as in Triton's listing")
    timeline = issue_timeline(compiled, gather_latency)
    src = open(rk.__file__).read().splitlines()
    kernel_file = os.path.basename(rk.__file__)
    spent = collections.Counter()
    for (t0, *_prev), (t1, fname, line, _text) in zip([(0.0,)] + timeline, timeline):
        spent[(fname, line)] += t1 - t0  # the cycles from the previous issue: what this instruction waited
    end = timeline[-1][0]
    print(f"    one warp: {end:.0f} cycles modelled ({end / 1980:.2f} us at 1.98 GHz), {len(timeline)} instructions")
    for (fname, line), n in spent.most_common(int(os.environ.get("SASS_LINES", 12))):
        code = src[line - 1].strip()[:80] if fname == kernel_file and line else ""
        print(f"    {n:6.0f} {fname}:{line} {code}")


def print_lines(compiled) -> None:
    """Fast-path instructions (and how many issue to the ALU pipe) per source line, busiest first."""
    body = fast_path(compiled)
    src = open(rk.__file__).read().splitlines()
    kernel_file = os.path.basename(rk.__file__)
    total, alu = collections.Counter(), collections.Counter()
    for fname, line, text in body:
        total[(fname, line)] += 1
        alu[(fname, line)] += _opcode(text) in ALU_OPS
    print(f"    fast path {len(body)} instructions, {sum(alu.values())} on the ALU pipe")
    for (fname, line), n in total.most_common(int(os.environ.get("SASS_LINES", 25))):
        code = src[line - 1].strip()[:80] if fname == kernel_file and line else ""
        print(f"    {n:4d} ({alu[(fname, line)]:3d} alu) {fname}:{line} {code}")


def main(argv=None) -> int:
    from moegate.bench import SHAPES, _parse_settings
    from moegate.layout import ExpertLayout

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="*", default=list(SHAPES))
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--opcodes", action="store_true", help="print the count of each opcode")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a launcher constant or override of moegate.kernels.router first (as moegate bench --set), "
                        "e.g. approx_keys_override=False")
    p.add_argument("--cycles", action="store_true",
                   help="model one warp's issue of the fast path from the SASS control codes (small launches)")
    p.add_argument("--gather-latency", type=int, default=40,
                   help="--cycles: cycles of the dependent gathers after the row's first read (L1 hits)")
    p.add_argument("--warps", type=int, help="warps a program (one row a program): the launcher's choice otherwise")
    p.add_argument("--warp-rows", action="store_true",
                   help="the rows-on-warps kernel's launch (kernels/warp_rows_kernel.py), forced on")
    p.add_argument("--row-stride", type=int,
                   help="the logits' row stride in elements (rows padded past the experts; default: contiguous rows)")
    p.add_argument("--bias-dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="the correction bias's dtype")
    p.add_argument("--dump", help="write the SASS of the last shape to this file (and its TTGIR to FILE.ttgir)")
    p.add_argument("--path", action="store_true",
                   help="print the fast path's SASS in issue order, each instruction with its source line")
    p.add_argument("--lines", action="store_true",
                   help="attribute the fast path's instructions to source lines (the cubin's line table)")
    a = p.parse_args(argv)
    if a.row_stride is not None and a.row_stride < 1:
        p.error(f"--row-stride must be >= 1, not {a.row_stride}")
    for name, value in _parse_settings(p, a.set).items():
        setattr(kr, name, value)
    for name in a.shapes:
        config, dtype = SHAPES[name]
        # Rows of the counted T (values do not matter, nothing runs): the launcher's T-dependent choices (split
        # rows, fast keys, PDL, launch shape) are those of a real launch.
        stride = config.num_scored if a.row_stride is None else a.row_stride
        if stride < config.num_scored:
            p.error(f"--row-stride {stride}: below the {config.num_scored} experts of {name}")
        logits = torch.zeros(a.tokens, stride, dtype=dtype)[:, :config.num_scored]
        bias = (torch.randn(config.num_scored) * 0.1).to(getattr(torch, a.bias_dtype)) \
            if config.has_correction_bias else None
        layout = ExpertLayout()
        split = kr._split_threads(config, a.tokens)
        block_m, num_warps = kr._launch_shape(a.tokens, kr._tile_shape(config)[0] * kr._tile_shape(config)[1],
                                               not split and kr._use_thread_rows(config), split)
        if a.warps:
            num_warps = a.warps
        saved = kr.launch_override, kr.split_rows_override
        kr.launch_override, kr.split_rows_override = (block_m, num_warps), split
        try:
            compiled = compile_launch(logits, config, layout, bias=bias, warp_rows=a.warp_rows,
                                      use_pdl=kr._pdl_wanted(a.tokens, not split and kr._use_thread_rows(config),
                                                             split, num_warps))
        finally:
            kr.launch_override, kr.split_rows_override = saved
        counts = sass_counts(compiled)
        total = sum(counts.values())
        spills = sum(counts[k] for k in ("STL", "LDL"))
        n_params, param_bytes = kernel_params(compiled)
        shape = (f"rows-on-warps W={kr._by_groups(kr.WARP_ROWS_WARPS, config.n_group > 1)} t={kr.WARP_ROWS_THREADS}"
                 if a.warp_rows else f"block_m={block_m} warps={num_warps}")
        print(f"{name:18s} T={a.tokens:<6d} {shape} regs={registers(compiled):3d} "
              f"local={spills} "
              f"sass={total} fast_path~{fast_path_estimate(compiled)} "
              f"kparams={n_params}/{param_bytes}B "
              f"params={','.join(hex(line) for line in param_lines(compiled))}")
        if a.opcodes or a.warps or a.warp_rows:
            print(f"    barriers {counts['BAR']}, shared loads / stores {counts['LDS']} / {counts['STS']}")
        if a.warp_rows:  # a warp's fast path routes 32 // WARP_ROWS_THREADS rows
            print(f"    fast path a row ~{fast_path_estimate(compiled) * kr.WARP_ROWS_THREADS / 32:.0f}")
        if a.opcodes:
            print("   ", " ".join(f"{k}:{v}" for k, v in counts.most_common()))
        if a.lines:
            print_lines(compiled)
        if a.path:
            for fname, line, text in fast_path(compiled):
                print(f"    {fname}:{line:<5} {text}")
        if a.cycles:
            print_cycles(compiled, a.gather_latency)
        if a.dump:
            with open(a.dump, "w") as f:
                f.write(compiled.asm["sass"])
            with open(a.dump + ".ttgir", "w") as f:
                f.write(compiled.asm["ttgir"])
            with open(a.dump + ".ptx", "w") as f:
                f.write(compiled.asm["ptx"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
