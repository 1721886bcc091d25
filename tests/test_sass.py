"""The compiled kernel (sm_90 SASS, built on this machine by Triton's bundled ptxas; no GPU needed).

A small launch waits on each line of the kernel-parameter bank it reads (a constant-cache miss the first
time: BENCHMARKS.md run 32), so every benchmark shape's launch must read its parameters from one 64-byte
line. scripts/sass_count.py compiles exactly the launch route_triton makes; it runs in a subprocess because
the kernel tests import the kernel under TRITON_INTERPRET=1, which replaces the JIT with the interpreter.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "sass_count.py")


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return os.path.exists(get_ptxas(90).path)
    except Exception:  # no NVIDIA backend in this Triton build
        return False


pytestmark = pytest.mark.skipif(not _ptxas_available(), reason="Triton's bundled ptxas is not available")


def _sass_count(*args, **env_extra):
    """scripts/sass_count.py's stdout for these arguments, run outside the interpreter on this checkout's src/."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    out = subprocess.run([sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _compile(shapes, tokens):
    stdout = _sass_count(*shapes, "--tokens", str(tokens))
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"(\S+)\s+T=\d+ .* kparams=(\d+)/(\d+)B params=(\S*)$", line)
        if m:
            rows[m.group(1)] = m.group(4)
            rows[m.group(1) + ":kparams"] = (int(m.group(2)), int(m.group(3)))
    return rows


@pytest.mark.parametrize("tokens", [64, 65536])
def test_every_benchmark_launch_reads_one_parameter_line(tokens):
    from moegate.bench import SHAPES

    shapes = list(SHAPES) if tokens == 64 else ["deepseek-v3-fp32", "deepseek-v4", "qwen3", "mixtral"]
    rows = _compile(shapes, tokens)
    lines = {k: v for k, v in rows.items() if not k.endswith(":kparams")}
    assert set(lines) == set(shapes)
    assert all(line == "0x200" for line in lines.values()), lines


def test_launches_carry_only_the_arguments_they_use():
    """LEAN_PARAMS: what a launch's constexprs turn off is passed as None and is not a kernel parameter. Mixtral
    (no bias, no rsf) keeps logits, weights, ids, the row stride, T, renorm_eps and Triton's two scratch pointers;
    DeepSeek-V3 adds its bias and rsf. With every argument passed there are 34 (200 bytes)."""
    rows = _compile(["mixtral", "deepseek-v3-fp32"], 1)
    assert rows["mixtral:kparams"] == (8, 52), rows
    assert rows["deepseek-v3-fp32:kparams"] == (10, 64), rows


def _loads_before_scoring(tmp_path, shape, tokens, *sets):
    """The 128-bit global loads (a row's logits and its bias, two each on a 256-lane fp32 row) issued before the
    first MUFU op (the scoring's first exp) in the launch's SASS."""
    dump = tmp_path / "kernel.sass"
    _sass_count(shape, "--tokens", str(tokens), "--dump", str(dump), *[a for s in sets for a in ("--set", s)])
    sass = dump.read_text()
    first_mufu = sass.index("MUFU.")
    return sass[:first_mufu].count("LDG.E.128"), sass.count("LDG.E.128")


def test_bias_early_issues_the_bias_load_with_the_logits(tmp_path):
    """BIAS_EARLY: DeepSeek-V4 at T = 1 (sqrt-softplus + bias, fast keys) loads its bias before the scoring. Left to
    ptxas, the bias load came after it while the keys were computed from the masked logits (the reason for
    BIAS_EARLY: a second L2 round trip on a small launch); since the keys take the unmasked logits ptxas issues it
    early by itself, and the pin keeps it there whatever ptxas does."""
    early, total = _loads_before_scoring(tmp_path, "deepseek-v4", 1)
    assert early == 4 and total >= 4, (early, total)


# A row's fast-path instructions on the ALU pipe (sm_90), which bounds the 256-lane and wider launches (BENCHMARKS.md
# runs 9 and 67), at T = 8192 (FMA keys) and 65536 (fast keys for DeepSeek-V3 and Kimi-K2). At T = 65536: 354 / 338 /
# 267 before run 67, 306 / 270 / 229 since, 241 / 194 / 180 since the dead lanes are found by the row's sum and the
# words take raw key bits (DEAD_BY_ROW, RAW_BITS); at T = 8192 288 / 266 / 229 before those, 228 / 198 / 180 since.
# A bound a few above today's count: what reintroduces a select a lane (the logits' mask, the dead mask, the dropped
# groups' mask before the words, the order bits), an add a round or a second copy of the round words fails it. Since
# those cuts a row issues more instructions than twice its ALU ones (each holds the ALU pipe two cycles: 585 against
# 2 x 228 at T = 8192), so the fast path's whole count is bounded too (585 / 609 / 462 at 8192, 516 / 467 / 462 at
# 65536).
# 2026-12-02 (27863a3): +1 to +3 ALU instructions for the weights' selects that keep every row off the IEEE division's
# slow path (a subroutine of ~34 instructions run twice a row before, which this static count leaves out; run 88).
# 2026-12-02: DeepSeek-V3 at T = 65536 (fast keys) 216 ALU / 496 issued (was 247 / 522) with the rounds on the kept
# groups' lanes only (KEPT_ONLY).
# 2026-12-04: on the fast keys, dead lanes found by the NaN key a non-finite logit leaves (NAN_DEAD, no row sum) and
# the largest |bias| by one REDUX: DeepSeek-V4 (fast keys at both T) 468 -> 448 issued, DeepSeek-V3 at T = 65536
# 496 -> 490, Kimi-K2 473 -> 462; then the fast keys' groups ranked on 32-bit words (NEAR_WORDS): DeepSeek-V3 at
# T = 65536 490 -> 479 (216 -> 206 on the ALU pipe); then one row a program's loads unmasked where every row is < T
# (ROWS_IN_RANGE): 8192 575 / 595 / 434, 65536 459 / 442 / 434; then the words as max(hi, base) << LANE_BITS plus
# a lane constant: 8192 571 / 587 / 431, 65536 452 / 434 / 431; then NaN keys for dead lanes on the FMA keys too:
# 8192 561 / 576 / 431.
# 2026-12-05 night: Kimi-K2 (512 lanes, top-8) on cached rounds (CACHE_DEPTH 5; H200 run 133: level with the plain
# rounds at T >= 4096, 0.95x at T <= 64): 8192 197 -> 204 on the ALU pipe, 576 issued either way; 65536 424 issued.
_ALU_BOUNDS = {8192: {"deepseek-v3-fp32": 230, "kimi-k2": 206, "deepseek-v4": 178},
               65536: {"deepseek-v3-fp32": 198, "kimi-k2": 196, "deepseek-v4": 178}}
_ISSUE_BOUNDS = {8192: {"deepseek-v3-fp32": 564, "kimi-k2": 579, "deepseek-v4": 434},
                 65536: {"deepseek-v3-fp32": 455, "kimi-k2": 437, "deepseek-v4": 434}}


@pytest.mark.parametrize("tokens", sorted(_ALU_BOUNDS))
def test_rows_on_warps_fast_path_alu_instructions(tokens):
    bounds = _ALU_BOUNDS[tokens]
    stdout = _sass_count(*bounds, "--tokens", str(tokens), "--lines", SASS_LINES="0")
    alu, issued, shape = {}, {}, None
    for line in stdout.splitlines():
        m = re.match(rf"(\S+)\s+T={tokens} ", line)
        if m:
            shape = m.group(1)
        m = re.match(r"\s+fast path (\d+) instructions, (\d+) on the ALU pipe", line)
        if m and shape:
            issued[shape], alu[shape] = int(m.group(1)), int(m.group(2))
    assert set(alu) == set(bounds), stdout[-2000:]
    assert all(alu[s] <= bound for s, bound in bounds.items()), alu
    assert all(issued[s] <= bound for s, bound in _ISSUE_BOUNDS[tokens].items()), issued


def test_cycles_model_reads_the_control_codes_and_times_the_scalar_checks():
    """--cycles (a lone warp's issue model, docs/kernel.md "Where a small launch waits"): the control codes it decodes
    from the cubin are those of Triton's own SASS listing, and DeepSeek-V3's chain at T = 1 is shorter with the scalar
    checks than with the vector ones (H200 run 75: 1.55 against 1.60 us), and longer than one cycle an instruction."""
    cycles = {}
    for scalar in (True, False):
        stdout = _sass_count("deepseek-v3-fp32", "--tokens", "1", "--cycles", "--set",
                             f"scalar_checks_override={scalar}", SASS_LINES="0")
        same, compared = map(int, re.search(r"control codes: (\d+) of (\d+)", stdout).groups())
        assert compared > 1000 and same == compared, stdout
        m = re.search(r"one warp: (\d+) cycles modelled .*, (\d+) instructions", stdout)
        cycles[scalar] = int(m.group(1))
        assert cycles[scalar] > 2 * int(m.group(2)), stdout
    assert cycles[True] < cycles[False] - 50, cycles


@pytest.mark.parametrize("shape", ["deepseek-v3-fp32", "deepseek-v3-bf16"])
def test_prefetch_is_one_predicated_l2_prefetch(tmp_path, shape):
    """PREFETCH_ROWS: one predicated CCTL.E.PF2 (PTX prefetch.global.L2) a thread, issued with the row's own loads
    (before the first MUFU op); none where the launch has it off. Nothing waits on it but a read of its address
    registers: the interpreter never runs the inline PTX, so this is where the kernel's prefetch is checked off a
    GPU."""
    for ahead in (0, 4096):
        dump = tmp_path / f"kernel-{ahead}.sass"
        _sass_count(shape, "--tokens", "65536", "--dump", str(dump), "--set", f"prefetch_rows_override={ahead}")
        sass = dump.read_text()
        prefetches = re.findall(r"@P\d+ CCTL\.E\.PF2 \[R\d+\]", sass)
        assert len(prefetches) == (1 if ahead else 0) and sass.count("CCTL") == len(prefetches), (ahead, prefetches)
        if ahead:
            assert sass.index("CCTL.E.PF2") < sass.index("MUFU.")


# The rows-on-warps kernel (kernels/warp_rows_kernel.py) at the launcher's choice for T = 65536: a row on 8 threads,
# four rows a warp (docs/kernel.md, "Four rows a warp"), its fast path a row a few above the counts of 2026-12-07
# (DeepSeek-V4 304, DeepSeek-V3 fp32 290 and bf16 288 with the kept groups' re-read, the bf16 one's fp32 bias through
# its own pointers, the epilogue on the winners' tile, the kept groups by rounds and the words past the first loser
# found only where _repair runs: 317 / 295 / 294 without the last, 335 / 332 without the last three, 375 on the whole
# row before; on a row a warp they were 483 / 513 / 527), and no local memory in the whole kernel (the exact path a
# row at a time does not spill; a program's rows at once did). With WARP_ROWS_LEAN (on by default since H200 run 186:
# bf16 widened a pair at a time, the kept lanes' words by one mad.lo and their rounds' steps four words at a time,
# their fp32 bias addressed from the logits' pointers and their keys without the finite check) DeepSeek-V3 fp32 274
# and bf16 256, with the kept lanes through shared memory (WARP_ROWS_SMEM_KEPT, on since H100 run 197) bf16 232;
# DeepSeek-V4 (no kept lanes) unchanged.
_WARP_ROWS_NO_LEAN_BOUNDS = {"deepseek-v4": 310, "deepseek-v3-fp32": 296, "deepseek-v3-bf16": 294}
_WARP_ROWS_LEAN_BOUNDS = {"deepseek-v4": 310, "deepseek-v3-fp32": 280, "deepseek-v3-bf16": 240}


@pytest.mark.parametrize("lean", [False, True])
def test_rows_on_warps_kernel_fast_path_a_row(lean):
    bounds = _WARP_ROWS_LEAN_BOUNDS if lean else _WARP_ROWS_NO_LEAN_BOUNDS
    stdout = _sass_count(*bounds, "--tokens", "65536", "--warp-rows", "--path", "--set", f"WARP_ROWS_LEAN={lean}")
    a_row, spills, shape = {}, {}, None
    for line in stdout.splitlines():
        m = re.match(r"(\S+)\s+T=65536\s+rows-on-warps W=\d+ t=(\d+) regs=\s*\d+ local=(\d+) ", line)
        if m:
            shape = m.group(1)
            assert m.group(2) == "8", line
            spills[shape] = int(m.group(3))
            continue
        m = re.match(r"\s+fast path a row ~(\d+)$", line)
        if m and shape:
            a_row[shape] = int(m.group(1))
        elif shape and re.search(r"\s(LDL|STL)\b", line):
            spills[shape] += 1
    assert set(a_row) == set(bounds), stdout[-2000:]
    assert all(a_row[s] <= bound for s, bound in bounds.items()), a_row
    assert not any(spills.values()), spills


@pytest.mark.parametrize("shape,rounds", [("deepseek-v3-bf16", 8), ("deepseek-v3-fp32", 8), ("deepseek-v4", 0)])
def test_lean_round_steps_pack_a_threads_adjacent_words(shape, rounds, tmp_path):
    """WARP_ROWS_LEAN's round step (_step_below) takes four words a thread into one inline-asm call and keeps the
    first output of each four (lane & 3 == 0): right only where the words' layout puts a multiple of four adjacent
    lanes on a thread, the lanes fastest. The compiled TTGIR's layout of every such call says so. On the kept lanes
    only: DeepSeek-V4's whole rows keep the compiler's form (the packed one was slower there, H200 run 186)."""
    dump = tmp_path / "k.sass"
    _sass_count(shape, "--tokens", "65536", "--warp-rows", "--set", "WARP_ROWS_LEAN=True", "--dump", str(dump))
    ttgir = (tmp_path / "k.sass.ttgir").read_text()
    layouts = dict(re.findall(r"^(#blocked\d*) = #ttg\.blocked<(.*)>$", ttgir, re.M))
    calls = re.findall(r"sub\.u32 a, .*packed_element = 4 : i32.*: tensor<\d+x\d+x\d+xi32, (#blocked\d*)>", ttgir)
    assert len(calls) == rounds, calls  # the K rounds after the first word (the lazy extra word's step is plain)
    for name in calls:
        m = re.search(r"sizePerThread = \[1, 1, (\d+)\].*order = \[2,", layouts[name])
        assert m and int(m.group(1)) % 4 == 0, layouts[name]


@pytest.mark.parametrize("warps", [1, 2])
def test_smem_kept_asm_sees_the_layout_it_assumes(warps, tmp_path):
    """WARP_ROWS_SMEM_KEPT (off by default; not yet run on a GPU): the kept lanes' keys are taken from the first
    pass's through shared memory by one inline-asm call a thread (pack 32), whose PTX assumes the first pass's key
    tile puts a thread's 8 adjacent lanes of each of 4 chunks in registers 8c + v and row r, thread t on lane 8r + t
    (sizePerThread [1, 1, 8], threadsPerWarp [4, 1, 8], order [2, 0, 1]). The compiled TTGIR's layout of that call
    says so; the fast path is ~10% shorter than the second read's and spills nothing."""
    dump = tmp_path / "k.sass"
    stdout = _sass_count("deepseek-v3-bf16", "--tokens", "65536", "--warp-rows", "--path", "--set",
                         "WARP_ROWS_SMEM_KEPT=True", "--set", f"WARP_ROWS_WARPS={warps}", "--dump", str(dump))
    ttgir = (tmp_path / "k.sass.ttgir").read_text()
    layouts = dict(re.findall(r"^(#blocked\d*) = #ttg\.blocked<(.*)>$", ttgir, re.M))
    calls = re.findall(rf"\.shared \.align 16 \.b32 mgk\[{1024 * warps}\].*packed_element = 32 : i32.*"
                       rf": tensor<{4 * warps}x4x64xi32, (#blocked\d*)>", ttgir)
    assert len(calls) == 1, calls
    assert layouts[calls[0]] == ("{sizePerThread = [1, 1, 8], threadsPerWarp = [4, 1, 8], "
                                 f"warpsPerCTA = [{warps}, 1, 1], order = [2, 0, 1]}}"), layouts[calls[0]]
    m = re.search(r"local=(\d+) .*\n.*\n\s+fast path a row ~(\d+)", stdout)
    assert m and int(m.group(1)) == 0 and int(m.group(2)) <= (236 if warps == 1 else 248), stdout[:600]
    assert not re.search(r"\s(LDL|STL)\b", stdout)


@pytest.mark.parametrize("shape,rounds,alu_before,alu_after",
                         [("512-top22", 23, 375, 254), ("896-top16", 17, 467, 376)])
def test_cache_smem_asm_sees_the_layout_it_assumes(shape, rounds, alu_before, alu_after, tmp_path):
    """CACHE_SMEM (forced on and off here; the launcher takes it from top-17 and T = 16384): the cached rounds run in
    one inline-asm call a lane whose PTX assumes a group's cached words on one lane and the 32 groups on the warp's 32
    lanes (a warp REDUX is the round's max): operands [32] sliced from a [G, 32, V] tile with threadsPerWarp
    [1, 32, 1] on one warp. The compiled TTGIR's layout of that call says so, it is the only such call, its SASS has a
    predicated shared load a pop (and one for the round's word at the end), and the fast path's ALU-pipe
    instructions drop by about a third on 512 top-22, a fifth on 896 top-16 (sm_90 SASS, T = 65536)."""
    alu = {}
    for smem in (False, True):
        dump = tmp_path / f"k{smem}.sass"
        stdout = _sass_count(shape, "--tokens", "65536", "--lines", "--set", f"cache_smem_override={smem}", "--dump",
                             str(dump))
        m = re.search(r"fast path \d+ instructions, (\d+) on the ALU pipe", stdout)
        assert m, stdout[:600]
        alu[smem] = int(m.group(1))
    ttgir = (tmp_path / "kTrue.sass.ttgir").read_text()
    layouts = dict(re.findall(r"^(#blocked\d*) = #ttg\.blocked<(.*)>$", ttgir, re.M))
    calls = re.findall(r"\.shared \.align 16 \.b32 mgc\[\d+\].*-> tensor<32xi32, #ttg\.slice<\{dim = 0, parent = "
                       r"#ttg\.slice<\{dim = 2, parent = (#blocked\d*)\}>\}>>, tensor<32xi32", ttgir)
    assert len(calls) == 1 and "mgc[" not in (tmp_path / "kFalse.sass.ttgir").read_text(), calls
    assert re.fullmatch(r"\{sizePerThread = \[1, 1, \d+\], threadsPerWarp = \[1, 32, 1\], warpsPerCTA = \[1, 1, 1\], "
                        r"order = \[2, 1, 0\]\}", layouts[calls[0]]), layouts[calls[0]]
    assert len(re.findall(r"@!?P\d+ LDS R", (tmp_path / "kTrue.sass").read_text())) == rounds
    assert alu[False] <= alu_before + 8 and alu[True] <= alu_after + 8 and alu[True] < 0.85 * alu[False], alu


def _packed_layouts_ok(ttgir: str) -> tuple[int, int, int, bool]:
    """(packed round steps, kept-lane exchanges, cached-round calls, every one on the layout its PTX assumes)."""
    layouts = dict(re.findall(r"^(#blocked\d*) = #ttg\.blocked<(.*)>$", ttgir, re.M))
    steps = re.findall(r"sub\.u32 a, .*packed_element = 4 : i32.*: tensor<\d+x\d+x\d+xi32, (#blocked\d*)>", ttgir)
    kept = re.findall(r"\.b32 mgk\[\d+\].*packed_element = 32 : i32.*: tensor<\d+x4x64xi32, (#blocked\d*)>", ttgir)
    cache = re.findall(r"\.b32 mgc\[\d+\].*-> tensor<32xi32, #ttg\.slice<\{dim = 0, parent = #ttg\.slice<\{dim = 2, "
                       r"parent = (#blocked\d*)\}>\}>>, tensor<32xi32", ttgir)
    ok = all(re.search(r"sizePerThread = \[1, 1, (\d+)\].*order = \[2,", layouts[k])
             and int(re.search(r"sizePerThread = \[1, 1, (\d+)\]", layouts[k]).group(1)) % 4 == 0 for k in steps)
    ok &= all(re.match(r"\{sizePerThread = \[1, 1, 8\], threadsPerWarp = \[4, 1, 8\], warpsPerCTA = \[\d, 1, 1\], "
                       r"order = \[2, 0, 1\]\}", layouts[k]) is not None for k in kept)
    ok &= all(re.match(r"\{sizePerThread = \[1, 1, \d+\], threadsPerWarp = \[1, 32, 1\], warpsPerCTA = \[1, 1, 1\], "
                       r"order = \[2, 1, 0\]\}", layouts[k]) is not None for k in cache)
    ok &= ttgir.count("mgk[") == len(kept) and ttgir.count("mgc[") == len(cache)
    return len(steps), len(kept), len(cache), ok


@pytest.mark.parametrize("shape,stride,bias,want", [
    ("deepseek-v3-bf16", 256, "bfloat16", (8, 1, 0)),
    ("deepseek-v3-bf16", 264, "bfloat16", (8, 1, 0)),  # rows 16-byte aligned, not 16 elements apart
    ("deepseek-v3-fp32", 260, "float32", (8, 0, 0)),
    ("deepseek-v3-fp32", 272, "float32", (8, 0, 0)),
    ("512-top22", 512, "float32", (0, 0, 1)),
    ("512-top22", 520, "float32", (0, 0, 1)),
    ("512-top22", 514, "float32", (0, 0, 0)),  # rows 8-byte aligned: the registers' rounds
])
def test_layout_bound_ptx_only_on_the_layouts_it_assumes(shape, stride, bias, want, tmp_path):
    """The PTX forms that assume a layout (WARP_ROWS_LEAN's packed round steps: four adjacent lanes of one row a call;
    WARP_ROWS_SMEM_KEPT's exchange; CACHE_SMEM's rounds: a group a lane) run only on the layout they assume. The
    loads' layout follows what Triton proves of the rows' alignment, which it proves by itself only for a row stride
    that is a multiple of 16 elements. Rows padded to 260 or 264 elements (16-byte aligned all the same) put a kept
    lane a thread with four rows in its registers, where a packed step took the max across the rows (wrong ids on a
    GPU before 2026-12-07's fix) and the fast path spilled; the kernels now say the rows are 16-byte aligned (the
    launcher checks it: `_rows_16b`, the router kernel's ROWS_16B), and padded rows compile as contiguous ones do.
    Rows not 16-byte aligned keep the compiler's forms. Both off-by-default forms forced on here."""
    dump = tmp_path / "k.sass"
    stdout = _sass_count(shape, "--tokens", "65536", *(["--warp-rows"] if shape.startswith("deepseek") else []),
                         "--row-stride", str(stride), "--bias-dtype", bias, "--set", "WARP_ROWS_SMEM_KEPT=True",
                         "--set", "CACHE_SMEM=True", "--dump", str(dump))
    assert " local=0 " in stdout, stdout[:300]
    steps, kept, cache, ok = _packed_layouts_ok((tmp_path / "k.sass.ttgir").read_text())
    assert (steps, kept, cache) == want and ok, (steps, kept, cache, ok)
