"""A small interpreter for the kernels' inline-PTX programs (warp_rows_kernel._smem_kept_asm,
router_kernel._cache_rounds_asm): the threads of one program run each statement in lock step, on 32-bit registers and
the program's own ``.shared`` arrays. The interpreter is strict where the GPU would be undefined or silent: a shared
access out of its array's bounds or misaligned, a load of a word that another lane stored with no ``bar.warp.sync``
between (a race: nothing orders another lane's store before the load), two lanes storing different values to one word
in one statement, an unknown statement. Only the statements those programs use are known; tests/test_ptx_programs.py
runs them against what their callers expect, with no GPU."""

import re

MASK = 0xFFFFFFFF


def _s32(v: int) -> int:
    v &= MASK
    return v - (1 << 32) if v & 0x80000000 else v


class PtxError(AssertionError):
    pass


def _statements(ptx: str) -> list[str]:
    body = ptx.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise PtxError("expected one { ... } block")
    return [s.strip() for s in body[1:-1].split(";") if s.strip()]


def run(ptx: str, operands: list[list[int]], n_out: int, threads: int) -> list[list[int]]:
    """Runs ``ptx`` on ``threads`` threads (tid 0..threads-1, warps of 32). ``operands[t]``: thread t's input operands
    ($n_out, $n_out + 1, ...); returns each thread's outputs $0..$(n_out - 1) (unsigned 32-bit)."""
    regs = [{f"${n_out + i}": v & MASK for i, v in enumerate(ops)} for ops in operands]
    preds = [{} for _ in range(threads)]
    arrays, base = {}, 0x100
    mem = {}  # byte address -> (value, lanes that stored it in its last store, barrier epoch of that store)
    epoch = [0] * (threads // 32 + (threads % 32 > 0))

    def value(t, tok):
        tok = tok.strip()
        if tok in ("%tid.x",):
            return t
        if tok == "%laneid":
            return t % 32
        if tok in arrays:
            return arrays[tok][0]
        if tok in regs[t]:
            return regs[t][tok]
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
            return int(tok, 0) & MASK
        raise PtxError(f"thread {t}: {tok!r} read before it was written")

    def address(t, tok, size):
        m = re.fullmatch(r"\[\s*([\w$%.]+)\s*(?:\+\s*(-?\d+))?\s*\]", tok.strip())
        if not m:
            raise PtxError(f"bad address {tok!r}")
        a = (value(t, m.group(1)) + int(m.group(2) or 0)) & MASK
        if a % size:
            raise PtxError(f"thread {t}: misaligned {size}-byte access at {a:#x}")
        if not any(lo <= a and a + size <= lo + n for lo, n in arrays.values()):
            raise PtxError(f"thread {t}: shared access at {a:#x} outside every array")
        return a

    for st in _statements(ptx):
        guard = None
        m = re.match(r"@(!?)(\w+)\s+(.*)$", st)
        if m:
            guard, st = (m.group(1) == "!", m.group(2)), m.group(3)
        op, _, rest = st.partition(" ")
        args = [a.strip() for a in re.split(r",(?![^{]*\})", rest)] if rest else []
        if op == ".reg":
            continue
        if op == ".shared":
            m = re.fullmatch(r"(?:\.align (\d+) )?\.b32 (\w+)\[(\d+)\]", rest)
            if not m:
                raise PtxError(f"bad declaration {st!r}")
            align = int(m.group(1) or 4)
            base = -(-base // align) * align
            arrays[m.group(2)] = (base, 4 * int(m.group(3)))
            base += 4 * int(m.group(3)) + 0x100
            continue
        if op == "bar.warp.sync":
            epoch[:] = [e + 1 for e in epoch]
            continue
        stores = {}  # this statement's stores: address -> {lane: value}
        if op == "redux.sync.max.s32":  # lock step: every lane's operand is read before any lane's result is written
            if guard is not None or value(0, args[2]) != MASK:
                raise PtxError(f"{st!r}: a predicated or partial-mask redux.sync")
            read = [_s32(value(t, args[1])) for t in range(threads)]
            for t in range(threads):
                regs[t][args[0]] = max(read[32 * (t // 32):32 * (t // 32) + 32]) & MASK
            continue
        for t in range(threads):
            if guard is not None:
                neg, p = guard
                if p not in preds[t]:
                    raise PtxError(f"thread {t}: predicate {p} read before it was set")
                if preds[t][p] == neg:
                    continue
            r = regs[t]
            if op in ("mov.u32", "mov.b32"):
                r[args[0]] = value(t, args[1])
            elif op in ("mad.lo.u32", "mad.lo.s32"):
                r[args[0]] = (value(t, args[1]) * value(t, args[2]) + value(t, args[3])) & MASK
            elif op == "add.u32":
                r[args[0]] = (value(t, args[1]) + value(t, args[2])) & MASK
            elif op == "sub.u32":
                r[args[0]] = (value(t, args[1]) - value(t, args[2])) & MASK
            elif op == "max.u32":
                r[args[0]] = max(value(t, args[1]), value(t, args[2]))
            elif op == "shr.u32":
                r[args[0]] = value(t, args[1]) >> min(value(t, args[2]), 32)
            elif op == "shl.b32":
                r[args[0]] = (value(t, args[1]) << min(value(t, args[2]), 32)) & MASK
            elif op == "and.b32":
                r[args[0]] = value(t, args[1]) & value(t, args[2])
            elif op == "bfe.u32":
                pos, n = value(t, args[2]), value(t, args[3])
                r[args[0]] = (value(t, args[1]) >> pos) & ((1 << n) - 1)
            elif op in ("setp.eq.s32", "setp.eq.u32"):
                preds[t][args[0]] = value(t, args[1]) == value(t, args[2])
            elif op == "setp.lt.u32":
                preds[t][args[0]] = value(t, args[1]) < value(t, args[2])
            elif op == "setp.lt.s32":
                preds[t][args[0]] = _s32(value(t, args[1])) < _s32(value(t, args[2]))
            elif op in ("st.shared.b32", "st.shared.v4.b32"):
                n = 4 if ".v4" in op else 1
                a = address(t, args[0], 4 * n)
                srcs = args[1].strip("{}").split(",") if n == 4 else [args[1]]
                for k, s in enumerate(srcs):
                    stores.setdefault(a + 4 * k, {})[t] = value(t, s)
            elif op in ("ld.shared.b32", "ld.shared.v4.b32"):
                n = 4 if ".v4" in op else 1
                a = address(t, args[1], 4 * n)
                dsts = args[0].strip("{}").split(",") if n == 4 else [args[0]]
                for k, d in enumerate(dsts):
                    if a + 4 * k not in mem:
                        raise PtxError(f"thread {t}: load of shared word {a + 4 * k:#x} never stored")
                    v, lanes, warp, e = mem[a + 4 * k]
                    if t not in lanes and (warp != t // 32 or e == epoch[warp]):
                        raise PtxError(f"thread {t}: load of a word that thread(s) {sorted(lanes)} stored, with no "
                                       "barrier of its warp between")
                    r[d.strip()] = v
            else:
                raise PtxError(f"unknown statement {st!r}")
        for a, by in stores.items():
            if len(set(by.values())) > 1 or len({t // 32 for t in by}) > 1:
                raise PtxError(f"threads {sorted(by)} store different values (or from two warps) to shared word "
                               f"{a:#x} at once")
            warp = min(by) // 32
            mem[a] = (next(iter(by.values())), set(by), warp, epoch[warp])
    return [[regs[t].get(f"${i}", None) for i in range(n_out)] for t in range(threads)]
