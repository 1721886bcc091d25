"""The kernels' inline-PTX programs run without a GPU (tests/ptx_lanes.py: lock-step threads, strict about shared
memory) against what their callers expect: the interpreter lane of CI never runs PTX, and the GPU tests
(test_smem_kept_routes_bit_for_bit_alike, test_cache_smem_rounds_route_bit_for_bit_alike) need a device. What this
checks: the programs' addresses, slots and bounds, their lane arithmetic and that no lane reads another's store
unordered; not the hardware's instructions themselves, nor the layout the compiler gives the operands (test_sass)."""

import random

import pytest
import test_kernel  # noqa: F401  (first: Triton is imported under the interpreter where there is no GPU)
from ptx_lanes import MASK, PtxError, run

from moegate.kernels.router_kernel import _cache_rounds_asm
from moegate.kernels.warp_rows_kernel import _smem_kept_asm

INT32_MIN = -(1 << 31)


def _register_rounds(caches: list[list[int]], rounds: int) -> tuple[list[int], list[int]]:
    """The register form of the cached rounds (the kernel's loop): a lane's cache c0..c7 (INT32_MIN past its words),
    the round's max over the heads, the winning head popped by a shift. -> (the rounds' words, the final heads)."""
    c = [list(lane) + [INT32_MIN] * (8 - len(lane)) for lane in caches]
    best = max(lane[0] for lane in c)
    words = [best]
    for _ in range(1, rounds):
        for lane in c:
            if lane[0] == best:
                lane[:] = lane[1:] + [INT32_MIN]
        best = max(lane[0] for lane in c)
        words.append(best)
    return words, [lane[0] for lane in c]


def _caches(rng: random.Random, depth: int, real_words: int) -> list[list[int]]:
    """32 groups' cached words as _cache_next leaves them: distinct non-negative words (distance << lane bits | lane),
    each group's decreasing, INT32_MIN past a group's last; real_words of them in all, spread unevenly."""
    words = rng.sample(range(0, 1 << 31), real_words)
    groups = [[] for _ in range(32)]
    for w in words:
        g = min(int(rng.expovariate(1 / 6)), 31) if rng.random() < 0.5 else rng.randrange(32)
        groups[g].append(w)
    return [sorted(g, reverse=True)[:depth] + [INT32_MIN] * (depth - min(len(g), depth)) for g in groups]


@pytest.mark.parametrize("depth,rounds", [(6, 23), (7, 23), (6, 24), (7, 17), (6, 18), (8, 31), (2, 17)])
def test_cache_rounds_program_pops_as_the_register_shift(depth, rounds):
    """_cache_rounds_asm: lane idx's first output is round idx's word (INT32_MIN from idx = rounds), its second its
    group's head after the last round, exactly as the register form's; on caches that hold more than the rounds pop,
    fewer (a group's cache runs out: its head INT32_MIN from then on), and fewer real words than rounds in the whole
    row (every head runs out and every lane keeps popping, with no real word at all the whole way from the first
    round: the slots of INT32_MIN must reach that far). The groups on
    the lanes in order (the compiled layout) and permuted (the program reads only its own idx)."""
    ptx = _cache_rounds_asm(depth, rounds)
    rng = random.Random(depth * 100 + rounds)
    for case in range(28):
        real = (0, 1, 2, rounds - 5, rounds + 3, 4 * rounds, 32 * depth)[case % 7]
        caches = _caches(rng, depth, real)
        order = list(range(32)) if case % 2 else rng.sample(range(32), 32)
        operands = [[v & MASK for v in caches[g]] + [INT32_MIN & MASK] * (8 - depth) + [g] for g in order]
        out = run(ptx, operands, 2, 32)
        words, heads = _register_rounds(caches, rounds)
        for lane, g in enumerate(order):
            want_word = words[g] if g < rounds else INT32_MIN
            assert out[lane][0] == want_word & MASK, (case, lane, g)
            assert out[lane][1] == heads[g] & MASK, (case, lane, g)


def test_cache_rounds_program_is_caught_when_wrong():
    """The interpreter's strictness on this program: with slots only for the cache (8 a lane, none for the pops past
    it), a row whose heads all run out pops into the next lane's slots (or past the array), which the interpreter
    refuses; the program as built runs the same row."""
    ptx = _cache_rounds_asm(6, 23)
    short = ptx.replace("mgc[768]", "mgc[256]").replace("mad.lo.u32 a, $10, 96, a;", "mad.lo.u32 a, $10, 32, a;")
    for off in (32, 48, 64, 80):
        short = short.replace(f"st.shared.v4.b32 [a+{off}], {{z,z,z,z}};", "")
    assert short.count("st.shared.v4") == 2
    caches = _caches(random.Random(5), 6, 10)
    operands = [[v & MASK for v in caches[g]] + [INT32_MIN & MASK] * 2 + [g] for g in range(32)]
    run(ptx, operands, 2, 32)
    with pytest.raises(PtxError, match="stored, with no barrier|outside every array"):
        run(short, operands, 2, 32)


@pytest.mark.parametrize("rows", [4, 8])
def test_smem_kept_program_moves_the_kept_groups_lanes(rows):
    """_smem_kept_asm (DeepSeek-V3, bf16 / fp16 logits, 8 threads a row, 4 rows a warp): thread tid holds row
    tid // 8, t = tid % 8, its key register 8c + v the row's lane 64c + 8t + v; after the call its output register
    8s + e (e < 4) holds the key of lane 32 g_s + 4t + e of its row (g_s the row's slot s: the group ranked s), the
    others 0. Rows on two warps (8 rows) exchange nothing across the warps."""
    ptx = _smem_kept_asm(rows, 256, 32, 4)
    rng = random.Random(rows)
    for _ in range(8):
        keys = [[rng.getrandbits(32) for _ in range(256)] for _ in range(rows)]
        slots = []
        for _ in range(rows):
            kept = rng.sample(range(8), 4)
            slots.append(sum(g << (4 * s) for s, g in enumerate(kept)))
        operands = []
        for tid in range(8 * rows):
            r, t = divmod(tid, 8)
            operands.append([keys[r][64 * c + 8 * t + v] for c in range(4) for v in range(8)] + [slots[r]] * 32)
        out = run(ptx, operands, 32, 8 * rows)
        for tid in range(8 * rows):
            r, t = divmod(tid, 8)
            want = [0] * 32
            for s in range(4):
                g = (slots[r] >> (4 * s)) & 15
                want[8 * s:8 * s + 4] = keys[r][32 * g + 4 * t:32 * g + 4 * t + 4]
            assert out[tid] == want, (rows, tid)


def test_smem_kept_program_needs_its_barrier():
    """Without its bar.warp.sync a thread would load words that the row's other threads stored unordered: the
    interpreter refuses (what makes the check above mean something for the exchange)."""
    ptx = _smem_kept_asm(4, 256, 32, 4).replace("bar.warp.sync -1;", "")
    operands = [[tid * 32 + i for i in range(32)] + [0x3210] * 32 for tid in range(32)]
    with pytest.raises(PtxError, match="barrier"):
        run(ptx, operands, 32, 32)
