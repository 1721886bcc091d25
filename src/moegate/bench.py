"""``python -m moegate.bench``: the fused router side by side with its peers, timed with CUDA graphs.

Providers (each the median of ten replays of a CUDA graph of launches, device events: the method of
``triton.testing.do_bench_cudagraph``, with the graph's launch count estimated on a graph rather than on eager
calls, see ``TIMER``; launch gaps and Python overhead are out of every number; at T <= 1024 the median of
--repeats such timings, the providers in turn):

- ``moegate``: ``route(..., backend="triton", out=...)``, the one fused launch.
- ``sglang``: SGLang's Triton router ``moe_fused_gate`` (sglang 0.5.23), when
  ``/work/shared/tools/fetch-sglang-router .peers`` has put it in ``.peers/`` (never committed).
  For 896 experts top-16 SGLang's production path is a native radix kernel that is not part of this
  comparison: that row is measured against SGLang's Triton router only.
- ``flashinfer``: FlashInfer's DeepSeek routing op ``fused_topk_deepseek`` (the CUDA kernel ``NoAuxTc``,
  flashinfer-python 0.7.4, compiled for the device on first use), when ``scripts/fetch_flashinfer_router.sh``
  has put it in ``.peers/`` (never committed), on the shapes whose routing it computes (FLASHINFER_LIMITS).
  It writes weights in the logits' dtype (bf16 for bf16 logits). Its output is checked like moegate's, against
  the fp32 reference on the same inputs, and a disagreement is printed.
- ``floor``: a kernel that only reads the logits once and writes the K weights and ids once; nothing
  routes faster than it. Launched like both routers, with programmatic dependent launch (PDL: the next
  launch in the graph starts while this one runs, and waits in ``griddepcontrol.wait``); ``floor0``
  is the same kernel launched plainly (the floor of runs 1-3).
- ``reference`` / ``compiled``: the torch reference, eager and under torch.compile (only at the token
  counts of ``--ref-tokens``: they are slow to compile and to run).

Every timed moegate launch (table, --ab, --sweep) is checked afterwards: what its last graph replay wrote into
outputs poisoned before the timing, on the first and the last VERIFY_ROWS rows (4096), against the fp32 reference
with ``check_routing``; a wrong routing is printed with its time and counted in the summary.

Bytes: T * W * itemsize read + T * K * 8 written (fp32 weights + int32 ids); GB/s is that over the
time. Inputs are standard-normal logits (and a bias of N(0, 0.1^2)). Every provider cycles through the same copies
of them (``--rotate-mb``, 256 MB by default, at most 256 copies; the ``cp`` column), so that a large launch reads its
logits from HBM as a new batch's router does: with one copy (``--rotate-mb 0``, runs 1-112 of BENCHMARKS.md) the
logits and outputs stay in the H200's L2 (~50 MB) wherever they fit, which made the floor read at 6-7 TB/s (above
HBM's 4.8) for DeepSeek-V3 bf16 and Qwen3 fp32 at T = 65536 and for Mixtral always. Where 256 copies fit the L2 (T <= 64
for every default shape but 896-top16, whose T = 64 takes 58 MB; T = 256 for DeepSeek-V3 bf16 and Qwen3; Mixtral up to
T = 4096) launches are timed L2-warm, as a router behind the gate GEMM that has just written its logits runs (the JSON
rows' ``rotated_mb``). The rotated rows' checks read the first and the last copy.

SGLang's output is checked too (what the last replay wrote, its weights times rsf, which it leaves to the caller)
against the fp32 reference on the first VERIFY_ROWS rows; a disagreement is printed and summarised.
"""

import argparse
import json
import math
import os
import sys
import time
import types

import torch

from moegate.config import RouterConfig
from moegate.reference import route_reference
from moegate.router import route

TOKENS = (1, 16, 64, 256, 1024, 4096, 8192, 32768, 65536)


def _dsv3():
    return RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4,
                        routed_scaling_factor=2.5)


# name -> (config, logits dtype)
SHAPES = {
    "deepseek-v3-fp32": (_dsv3(), torch.float32),
    "deepseek-v3-bf16": (_dsv3(), torch.bfloat16),
    "kimi-k2": (RouterConfig(384, 8, scoring="sigmoid", has_correction_bias=True, routed_scaling_factor=2.827),
                torch.float32),
    "deepseek-v4": (RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True,
                                 routed_scaling_factor=1.5), torch.float32),
    "qwen3": (RouterConfig(128, 8, scoring="softmax", renormalize=True), torch.float32),
    "mixtral": (RouterConfig(8, 2, scoring="softmax", renormalize=True), torch.float32),
    "512-top22": (RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True), torch.float32),
    "896-top16": (RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True), torch.float32),
}
# Narrow rows beyond the issue's list, for --shapes / --ab / --sweep only (not in the default table or its
# geo-means): where one row a thread stops paying off.
EXTRA_SHAPES = {
    "16-top2": (RouterConfig(16, 2, scoring="softmax", renormalize=True), torch.float32),
    "32-top8": (RouterConfig(32, 8, scoring="softmax", renormalize=True), torch.float32),
    "64-top8": (RouterConfig(64, 8, scoring="softmax", renormalize=False), torch.float32),
    "64-top8-renorm": (RouterConfig(64, 8, scoring="softmax", renormalize=True), torch.float32),
    "64-top6-sigmoid": (RouterConfig(64, 6, scoring="sigmoid", has_correction_bias=True), torch.float32),
    "128-top8-sigmoid": (RouterConfig(128, 8, scoring="sigmoid", has_correction_bias=True), torch.float32),
    # LongCat-Flash (the preset): softmax over 512 experts and 256 zero experts (768 lanes, one warp since b3a60ac;
    # --ab-variants four-warps-wide for the launch before), + bias, top-12, x 6. SGLang's moe_fused_gate takes softmax
    # + bias as the softmax of (logit + bias), ranked on logit + bias: not LongCat's routing (softmax score + bias for
    # the choice, the unbiased score as weight): run 128 timed it there and every row it routed differed from the
    # reference, so the bench leaves it out of such shapes (_sglang_covers).
    # Qwen3-Next (the preset): renormalized softmax of 512 experts, top-10, one row a warp on logit keys (fp32: distance
    # words two bits shifted, two binades, LOGIT_SPAN_LOG2; bf16: the logits' bits shifted right by 16, KEY_SHIFT).
    # Qwen3.5-MoE: 256 experts, top-8, the same routing (fp32: one bit shifted).
    "qwen3.5": (RouterConfig(256, 8, scoring="softmax", renormalize=True), torch.float32),
    "qwen3-next": (RouterConfig(512, 10, scoring="softmax", renormalize=True), torch.float32),
    "qwen3-next-bf16": (RouterConfig(512, 10, scoring="softmax", renormalize=True), torch.bfloat16),
    # OLMoE (the preset): softmax of 64 experts without renormalization, top-8, bf16 logits: truncated score words, or
    # words of the logits' own bits with --ab-variants trunc-logit-words.
    "olmoe-bf16": (RouterConfig(64, 8, scoring="softmax", renormalize=False), torch.bfloat16),
    "longcat-flash": (RouterConfig(512, 12, scoring="softmax", renormalize=False, has_correction_bias=True,
                                   num_zero_experts=256, routed_scaling_factor=6.0), torch.float32),
}
SHAPES.update(EXTRA_SHAPES)
DEFAULT_SHAPES = [name for name in SHAPES if name not in EXTRA_SHAPES]


def _load_sglang():
    here = os.path.join(os.getcwd(), ".peers")
    sys.path.insert(0, here)
    try:
        import sglang_moe_fused_gate
    except Exception as exc:  # the peer is optional: report and go on without it
        print(f"sglang router not available ({exc}); run /work/shared/tools/fetch-sglang-router .peers")
        return None
    finally:
        sys.path.remove(here)
    return sglang_moe_fused_gate.moe_fused_gate


# FlashInfer's op, as FlashInfer documents and checks it (flashinfer.fused_moe.fused_routing_dsv3): sigmoid scores
# plus a correction bias, groups by their top-2 sum (the dropped ones excluded), the plain sum renormalization, rsf in
# the weights; K <= 8; grouped: E / n_group <= 32 and E / n_group * topk_group <= 128; ungrouped: E <= 384.
FLASHINFER_LIMITS = {"max_top_k": 8, "max_group_size": 32, "max_kept_experts": 128, "max_ungrouped_experts": 384}


def _peer_options(c) -> bool:
    """The options both peers' routers compute as the contract does: score selection, no logit scale or softcap,
    top-2-sum groups with the dropped ones excluded, the plain-sum renormalization with eps added, top-K (not hash)
    routing, no expert scales. Anything else is not passed to them at all."""
    return (c.selection == "scores" and c.logit_scale == 1.0 and c.softcap is None and c.group_score == "top2_sum"
            and c.group_fill == "exclude" and c.renorm_p == 1.0 and c.renorm_eps_mode == "add"
            and c.routing == "topk" and not c.has_expert_scale)


def _flashinfer_covers(config) -> bool:
    """Whether FlashInfer's fused_topk_deepseek computes this config's routing (within its limits)."""
    c, lim = config, FLASHINFER_LIMITS
    same_function = (_peer_options(c) and c.scoring == "sigmoid" and c.has_correction_bias and c.renormalize
                     and c.num_zero_experts == 0)
    if not same_function or c.top_k > lim["max_top_k"]:
        return False
    if c.n_group > 1:
        return c.group_size <= lim["max_group_size"] and c.group_size * c.topk_group <= lim["max_kept_experts"]
    return c.num_experts <= lim["max_ungrouped_experts"]


def _sglang_covers(config) -> bool:
    """Whether SGLang's moe_fused_gate computes this config's routing from what ``_SGLang`` passes it (scoring,
    bias, groups, top-K, renormalize, rsf; ``_peer_options``). Its softmax with a bias is the softmax of (logit +
    bias), ranked on logit + bias, not the contract's softmax score + bias for the choice and the unbiased score as
    weight (run 128: every LongCat-Flash row differed). Zero experts are scored with the real ones there as here."""
    return _peer_options(config) and not (config.scoring == "softmax" and config.has_correction_bias)


def _load_flashinfer():
    """FlashInfer's NoAuxTc op, built for this device, or None (the peer is optional: the reason is printed).

    The op is what ``fused_topk_deepseek`` launches after its Python checks. Those refuse an ungrouped call with
    K > 1 (they ask topk_group * n_group >= K with topk_group <= n_group = 1), which the op itself takes (its
    single-group path, documented up to 384 experts): Kimi-K2 is timed through the op, as every shape is."""
    here = os.path.join(os.getcwd(), ".peers", "flashinfer-site")
    if not os.path.isdir(here):
        print("flashinfer not available (no .peers/flashinfer-site); run scripts/fetch_flashinfer_router.sh and "
              "scripts/gpu_check.sh, which unpacks it")
        return None
    sys.path.insert(0, here)  # left there: the op's JIT build imports flashinfer's modules when it runs
    try:
        from flashinfer.fused_moe.fused_routing_dsv3 import get_dsv3_fused_routing_module

        start = time.perf_counter()
        op = get_dsv3_fused_routing_module().NoAuxTc
        x = torch.randn(4, 256, device="cuda")
        op(x, torch.zeros(256, device="cuda"), 8, 4, 8, 1.0, torch.empty(4, 8, device="cuda"),
           torch.empty(4, 8, dtype=torch.int32, device="cuda"), True, None)
        torch.cuda.synchronize()
        print(f"flashinfer NoAuxTc ready ({time.perf_counter() - start:.0f} s to build and load)")
    except Exception as exc:
        print(f"flashinfer not available ({type(exc).__name__}: {str(exc)[:300]})")
        return None
    return op


class _FlashInfer:
    """The timed call: FlashInfer's op into fixed outputs, on the inputs moegate gets (the fp32 bias included: the
    op takes an fp32 bias with bf16 logits). ``verify()``: rows whose expert set differs from the fp32 reference's,
    and the largest relative error of a weight, over the first VERIFY_ROWS rows."""

    def __init__(self, op, logits, config, bias):
        self.op, self.logits, self.config, self.bias = op, logits, config, bias
        T, K = logits.shape[0], config.top_k
        self.values = torch.empty(T, K, dtype=logits.dtype, device=logits.device)
        self.indices = torch.empty(T, K, dtype=torch.int32, device=logits.device)

    def __call__(self):
        c = self.config
        self.op(self.logits, self.bias, c.n_group, c.topk_group, c.top_k, c.routed_scaling_factor, self.values,
                self.indices, True, None)

    def verify(self, rows=None):
        n = min(VERIFY_ROWS if rows is None else rows, self.logits.shape[0])
        if n <= 0:
            return None
        ref_w, ref_ids = route_reference(self.logits[:n], self.config, bias=self.bias)
        return _compare_routing(self.values[:n].float(), self.indices[:n], ref_w, ref_ids)


def _compare_routing(weights, ids, ref_w, ref_ids):
    """(rows whose expert set differs from the reference's, the largest relative weight error on the rows that
    agree): a peer may order its K columns its own way, so each row is compared sorted by expert id."""
    ids, order = ids.long().sort(dim=1)
    ref_ids, ref_order = ref_ids.long().sort(dim=1)
    same = (ids == ref_ids).all(dim=1)
    w, ref = weights.gather(1, order)[same], ref_w.float().gather(1, ref_order)[same]
    rel = ((w - ref).abs() / ref.abs().clamp_min(1e-30)).max().item() if w.numel() else 0.0
    return int((~same).sum().item()), rel


def _floor_launch(logits, weights, ids, K, pdl=True):
    import triton

    from moegate.kernels.router_kernel import _floor_kernel

    T, W = logits.shape
    block_w = triton.next_power_of_2(W)
    block_m = max(1, min(64, 4096 // block_w))
    while block_m > 1 and triton.cdiv(T, block_m) < 264:
        block_m //= 2
    _floor_kernel[(max(1, triton.cdiv(T, block_m)),)](
        logits, logits.stride(0), weights, ids, T, W=W, K=K, BLOCK_M=block_m, BLOCK_W=block_w,
        BLOCK_K=triton.next_power_of_2(K), num_warps=4, USE_PDL=pdl, **({"launch_pdl": True} if pdl else {}),
    )


# Rows of each timed moegate launch checked against the fp32 reference afterwards (check_routing): the first and the
# last VERIFY_ROWS rows (a launch that skipped its last programs would time faster), into outputs poisoned before the
# timing (a variant of --ab / --sweep that wrote nothing would pass on the previous variant's output).
VERIFY_ROWS = 4096
# --fallbacks: after each timed moegate launch, one more launch that counts the programs leaving the fast path.
COUNT_FALLBACKS = False


class _Moegate:
    """The timed call: ``route`` into fixed outputs. ``poison()`` fills them with NaN / -7 (``_time`` calls it before
    timing); ``verify()`` checks what the last call (the last graph replay) wrote, on the first and the last
    VERIFY_ROWS rows, against the fp32 reference: the number of violations."""

    def __init__(self, logits, config, bias, out):
        self.logits, self.config, self.bias, self.out = logits, config, bias, out

    def __call__(self):
        return route(self.logits, self.config, bias=self.bias, out=self.out, backend="triton")

    def poison(self):
        self.out[0].fill_(float("nan"))
        self.out[1].fill_(-7)
        if self.out[0].is_cuda:
            torch.cuda.synchronize()  # the timing launches on a stream of its own, which does not wait for this one

    def verify(self, rows=None):
        """Violations in the first and the last ``rows`` (VERIFY_ROWS) rows; None when the check is off."""
        from moegate.check import check_routing

        T = self.logits.shape[0]
        n = min(VERIFY_ROWS if rows is None else rows, T)
        if n <= 0:
            return None
        bad = 0
        for part in (slice(0, n), slice(max(n, T - n), T)):
            if part.start < part.stop:
                bad += len(check_routing(self.out[0][part], self.out[1][part], self.config,
                                         logits=self.logits[part], bias=self.bias))
        return bad

    def fallbacks(self):
        """One launch with the kernel's counters on (moegate.kernels.router.count_fallbacks_into): (programs
        that redid their rows on the exact path, programs that repaired a row, programs)."""
        import moegate.kernels.router as kr

        stats = torch.zeros(3, dtype=torch.int32, device=self.logits.device)
        kr.count_fallbacks_into = stats
        try:
            self()
        finally:
            kr.count_fallbacks_into = None
        return tuple(stats.tolist())


def _verified(fn, label):
    """fn.verify(), printing a line when the timed launch routed wrongly; None where fn cannot verify. With
    COUNT_FALLBACKS (--fallbacks) also prints how many of its programs left the fast path."""
    verify = getattr(fn, "verify", None)
    if verify is None:
        return None
    try:
        bad = verify()
    except Exception as exc:  # the timing stands; say why it is unchecked
        print(f"{label}: not verified: {type(exc).__name__}: {exc}")
        return None
    if bad:
        where = " of the first and the last copy" if getattr(fn, "copies", 1) > 1 else ""
        print(f"{label}: {bad} routing violations in the first and last {VERIFY_ROWS} rows{where} (check_routing "
              "against the fp32 reference): this time is of a wrong routing")
    if COUNT_FALLBACKS:
        redo, repaired, programs = fn.fallbacks()
        print(f"{label}: {redo} of {programs} programs redid their rows on the exact path "
              f"({100 * redo / max(programs, 1):.2f}%), {repaired} repaired a row")
    return bad


def _peer_check(fn, label):
    """A peer's (rows routed to other experts than the fp32 reference's, largest relative weight error), printed
    when any row differs; None where the check could not run."""
    try:
        result = fn.verify()
    except Exception as exc:
        print(f"{label}: not verified: {type(exc).__name__}: {exc}")
        return None
    if result is not None and result[0]:
        where = " of the first and the last copy" if getattr(fn, "copies", 1) > 1 else ""
        print(f"{label}: {result[0]} of the first {VERIFY_ROWS} rows{where} routed to other experts than the fp32 "
              "reference's")
    return result


class _SGLang:
    """The timed call: SGLang's ``moe_fused_gate`` on the inputs moegate gets. It allocates its outputs each call
    and leaves rsf to the caller (``apply_routed_scaling_factor_on_output`` off, as SGLang's MoE layers call it).
    The last call's outputs are kept: under a graph capture each copy's outputs then stay live, at their own addresses
    (a copy's writes do not land where the previous copy's did), and ``verify()`` reads what the last replay wrote
    (not poisoned first: each capture allocates them anew). ``verify()`` compares the weights times rsf with the fp32
    reference on the first VERIFY_ROWS rows: (rows routed to other experts, the largest relative weight error)."""

    def __init__(self, fn, logits, config, bias):
        self.fn, self.logits, self.config, self.bias = fn, logits, config, bias
        self.last = None

    def __call__(self):
        c = self.config
        self.last = self.fn(self.logits, self.bias, c.top_k, scoring_func=c.scoring, renormalize=c.renormalize,
                            routed_scaling_factor=c.routed_scaling_factor, num_expert_group=c.n_group,
                            topk_group=c.topk_group)
        return self.last

    def verify(self, rows=None):
        n = min(VERIFY_ROWS if rows is None else rows, self.logits.shape[0])
        if n <= 0:
            return None
        weights, ids = self.last if self.last is not None else self()
        ref_w, ref_ids = route_reference(self.logits[:n], self.config, bias=self.bias)
        return _compare_routing(weights[:n].float() * self.config.routed_scaling_factor, ids[:n], ref_w, ref_ids)


# Inputs rotated past the L2: each provider cycles through copies of its inputs and outputs, ROTATE_BYTES of
# logits and outputs in all (at most MAX_COPIES copies), so that a replay reads logits the previous launches did not
# leave in the L2 (~50 MB on the H200), as every provider's first touch of a new batch would. 0: one copy (every
# replay on the same buffers, the table of runs 1-112). Where MAX_COPIES copies fit the L2 (a copy under ~190 KB:
# T <= 64 for every default shape but 896-top16, whose 256 copies at T = 64 take 58 MB; T = 256 for DeepSeek-V3 bf16
# and Qwen3; Mixtral up to T = 4096, 48 MB) launches stay L2-warm, as a router behind the gate GEMM that has just
# written its logits runs; the JSON rows give each launch's rotated MB.
ROTATE_BYTES = 256 << 20
MAX_COPIES = 256
# --row-pad: each row's logits this many elements apart more than its width (a view of a wider buffer, as where the
# gate GEMM writes a padded output). The rotation's bytes count the padding too.
ROW_PAD = 0


def _copy_bytes(config, dtype, T) -> int:
    """One copy's logits (with --row-pad's padding) and outputs (fp32 weights, int32 ids), bytes."""
    return T * (config.num_scored + ROW_PAD) * torch.finfo(dtype).bits // 8 + T * config.top_k * 8


def _copies(config, dtype, T) -> int:
    """How many copies of a launch's inputs and outputs the rotation cycles through."""
    per_copy = _copy_bytes(config, dtype, T)
    return max(1, min(MAX_COPIES, -(-ROTATE_BYTES // max(per_copy, 1)))) if ROTATE_BYTES > 0 else 1


class _Cycle:
    """Calls its providers in turn, one a call (a CUDA graph of n calls captures them in that order). ``poison()``
    poisons every copy's outputs; ``verify()`` checks the first and the last copy (``_time`` makes every timed
    graph a multiple of ``copies`` calls, and ``--timer do_bench`` times ``all_copies``, so the last replay writes
    every copy): violations summed, or for a peer (rows routed to other experts summed, largest weight error)."""

    def __init__(self, fns):
        self.fns, self.next = list(fns), 0
        self.copies = len(self.fns)

    def __call__(self):
        fn = self.fns[self.next]
        self.next = (self.next + 1) % self.copies
        return fn()

    def poison(self):
        for fn in self.fns:
            if hasattr(fn, "poison"):
                fn.poison()

    def verify(self, rows=None):
        ends = self.fns[:1] + self.fns[1:][-1:]
        results = [fn.verify(rows) for fn in ends]
        if any(r is None for r in results):
            return None
        if isinstance(results[0], tuple):
            return sum(r[0] for r in results), max(r[1] for r in results)
        return sum(results)

    def fallbacks(self):
        return self.fns[0].fallbacks()

    def all_copies(self):
        """One call of every copy, in order (``--timer do_bench`` times this and divides by ``copies``)."""
        for fn in self.fns:
            fn()


def _providers(config, dtype, T, sglang, want, flashinfer=None):
    """name -> zero-argument callable, all on the same inputs: ``_copies`` copies of them, each provider cycling
    through its copies (``_Cycle``) where there is more than one."""
    g = torch.Generator(device="cuda").manual_seed(T)
    W, K = config.num_scored, config.top_k
    C = _copies(config, dtype, T)
    # The logits first, then the bias: with one copy (--rotate-mb 0) the inputs of runs 1-112. --row-pad: views of
    # wider rows (their padding never read).
    all_logits = torch.randn(C, T, W + ROW_PAD, generator=g, device="cuda").to(dtype)[..., :W]
    bias = (torch.randn(W, generator=g, device="cuda") * 0.1) if config.has_correction_bias else None
    per_copy = {name: [] for name in ("moegate", "floor", "floor0", "sglang", "flashinfer", "reference", "compiled")}
    if "compiled" in want:
        # One code object serves every shape, and dynamo counts each shape's guards against it: past its recompile
        # limit (8) it runs the function eagerly and the "compiled" figure is the eager one (run 62, Qwen3 T=4096).
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, b: route_reference(x, config, bias=b), dynamic=False)
    for logits in all_logits.unbind(0):
        out = (torch.empty(T, K, device="cuda"), torch.empty(T, K, dtype=torch.int32, device="cuda"))
        floor_out = (torch.empty(T, K, device="cuda"), torch.empty(T, K, dtype=torch.int32, device="cuda"))
        per_copy["moegate"].append(_Moegate(logits, config, bias, out))
        per_copy["floor"].append(lambda x=logits, o=floor_out: _floor_launch(x, *o, K))
        per_copy["floor0"].append(lambda x=logits, o=floor_out: _floor_launch(x, *o, K, pdl=False))
        if sglang is not None and _sglang_covers(config):
            per_copy["sglang"].append(_SGLang(sglang, logits, config, bias))
        if flashinfer is not None and _flashinfer_covers(config) and ROW_PAD == 0:  # its op takes contiguous rows
            per_copy["flashinfer"].append(_FlashInfer(flashinfer, logits, config, bias))
        if "reference" in want:
            per_copy["reference"].append(lambda x=logits: route_reference(x, config, bias=bias))
        if "compiled" in want:
            per_copy["compiled"].append(lambda x=logits: compiled(x, bias))
    return {name: fns[0] if C == 1 else _Cycle(fns) for name, fns in per_copy.items() if fns}


# How each figure is timed. "graph" (the default): triton.testing.do_bench_cudagraph's method (a CUDA graph of
# rep / estimate launches, the median of ten timed replays, device events) with the estimate taken from a graph of
# ESTIMATE_LAUNCHES launches and at most MAX_LAUNCHES launches a graph. "do_bench": do_bench_cudagraph itself, which
# estimates from five eager calls. Those time the host as well, and route()'s host path is far slower than the
# floor's bare launch, so moegate's small launches got short graphs whose own launch cost landed in their figures,
# differently from one estimate to the next (BENCHMARKS.md runs 65-66).
TIMER = "graph"
ESTIMATE_LAUNCHES = 20
MAX_LAUNCHES = 2000


def _capture(fn, n):
    """A CUDA graph of n calls of fn, captured on the current stream."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    torch.cuda.synchronize()
    return graph


def _replay_ms(graph):
    """One replay of graph on the current stream, timed with device events (ms)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _median_us(graph, n, replays=10):
    """The median over `replays` replays of a graph of n launches, us a launch."""
    times = sorted(_replay_ms(graph) / n for _ in range(replays))
    return times[len(times) // 2] * 1e3


def _time(fn, rep):
    """us a launch of fn: the median of ten replays of a CUDA graph of launches, timed with device events."""
    poison = getattr(fn, "poison", None)
    if poison is not None:
        poison()  # what verify() reads afterwards is this timing's output, not an earlier one's
    if TIMER == "do_bench":
        import triton.testing

        copies = getattr(fn, "copies", 1)
        call = fn.all_copies if copies > 1 else fn  # every copy once a call, each written by the last replay
        return triton.testing.do_bench_cudagraph(call, rep=rep, return_mode="median") * 1e3 / copies
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()  # compiles, allocates
        probe = _capture(fn, ESTIMATE_LAUNCHES)
        _replay_ms(probe)
        estimate_ms = _replay_ms(probe) / ESTIMATE_LAUNCHES
        del probe
        n = min(MAX_LAUNCHES, max(1, int(rep / max(estimate_ms, 1e-6))))
        copies = getattr(fn, "copies", 1)
        n = max(copies, n - n % copies)  # every copy as often, and each written by the graph (verify reads them)
        return _median_us(_capture(fn, n), n)


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# Small launches (T <= REPEAT_MAX_TOKENS) are timed in --repeats rounds, the providers in turn each round, and
# each provider's figure is the median of its rounds: on the H200 one Mixtral launch at T = 1 timed 0.88-1.79 us
# within and across processes (run 35, BENCHMARKS.md), the first timing of a process the slowest, while large
# launches repeat within 1%.
REPEAT_MAX_TOKENS = 1024


def _median(times):
    """The median of a list of timings (the lower middle one for an even count)."""
    return sorted(times)[(len(times) - 1) // 2]


def bench(shapes, tokens, ref_tokens, rep, sglang, compiled_shapes, repeats=1, flashinfer=None):
    from moegate.cli import progress_bar

    with progress_bar(unit="shapes x T") as progress:
        task = progress.add_task("bench", total=len(shapes) * len(tokens))
        return _bench_rows(shapes, tokens, ref_tokens, rep, sglang, compiled_shapes, lambda: progress.advance(task),
                           repeats, flashinfer)


def _bench_rows(shapes, tokens, ref_tokens, rep, sglang, compiled_shapes, advance, repeats=1, flashinfer=None):
    rows = []
    for name in shapes:
        config, dtype = SHAPES[name]
        for T in tokens:
            want = set()
            if T in ref_tokens:
                want = {"reference", "compiled"} if name in compiled_shapes else {"reference"}
            fns = _providers(config, dtype, T, sglang, want, flashinfer)
            copies = getattr(fns["moegate"], "copies", 1)
            row = {"shape": name, "T": T, "dtype": str(dtype)[6:], "E": config.num_scored, "K": config.top_k,
                   "copies": copies, "rotated_mb": round(copies * _copy_bytes(config, dtype, T) / 2**20, 1)}
            samples = {prov: [] for prov in fns}
            for _ in range(repeats if T <= REPEAT_MAX_TOKENS else 1):
                for prov, fn in fns.items():
                    if samples[prov] is None:
                        continue
                    try:
                        samples[prov].append(_time(fn, rep))
                    except Exception as exc:  # a peer failing on a shape is a result to print, not a crash
                        print(f"{name} T={T} {prov}: {type(exc).__name__}: {exc}")
                        samples[prov] = None
            for prov, times in samples.items():
                row[prov] = None if times is None else _median(times)
            row["samples"] = samples
            if row.get("moegate") is not None:
                row["violations"] = _verified(fns["moegate"], f"{name} T={T} moegate")
            for peer in ("flashinfer", "sglang"):
                if row.get(peer) is not None:
                    row[f"{peer}_check"] = _peer_check(fns[peer], f"{name} T={T} {peer}")
            nbytes = _copy_bytes(config, dtype, T)
            row["GB/s"] = nbytes / (row["moegate"] * 1e-6) / 1e9 if row.get("moegate") else None
            rows.append(row)
            print(_format_row(row), flush=True)
            advance()
    return rows


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


HEADER = (f"{'shape':18} {'T':>6} {'cp':>3} {'moegate':>8} {'sglang':>8} {'flashinf':>8} {'floor':>7} {'floor0':>7} "
          f"{'ref':>8} {'compiled':>8} {'GB/s':>6} {'mg/sgl':>6} {'mg/fi':>6} {'mg/floor':>8}")


def _ratio(r, peer):
    return r["moegate"] / r[peer] if r.get(peer) and r.get("moegate") else None


def _format_row(r):
    return (f"{r['shape']:18} {r['T']:>6} {r.get('copies', 1):>3} {_fmt(r.get('moegate')):>8} "
            f"{_fmt(r.get('sglang')):>8} {_fmt(r.get('flashinfer')):>8} {_fmt(r.get('floor')):>7} "
            f"{_fmt(r.get('floor0')):>7} {_fmt(r.get('reference')):>8} {_fmt(r.get('compiled')):>8} "
            f"{_fmt(r.get('GB/s'), '.0f'):>6} "
            f"{_fmt(_ratio(r, 'sglang'), '.3f'):>6} {_fmt(_ratio(r, 'flashinfer'), '.3f'):>6} "
            f"{_fmt(_ratio(r, 'floor'), '.2f'):>8}")


def summary(rows):
    """The issue's targets, each with the figure it is judged on. A provider that failed (None) leaves its row
    out of the figures that need its time (the summary lists those rows); the routing check counts every row."""
    all_rows = rows
    failed = [r for r in rows if r.get("moegate") is None or r.get("floor") is None]
    rows = [{**r, "sglang": r.get("sglang") or None, "floor0": r.get("floor0") or None} for r in rows
            if r.get("moegate") is not None]
    timed = [r for r in rows if r.get("floor") is not None]  # the figures against the floor
    big = [r["moegate"] / r["sglang"] for r in rows if r["T"] >= 4096 and r.get("sglang")]
    slower = [(r["shape"], r["T"], r["moegate"] / r["sglang"]) for r in rows
              if r.get("sglang") and r["moegate"] > r["sglang"]]
    small = [(r["shape"], r["T"], r["moegate"] - r["floor"]) for r in timed if r["T"] <= 64]
    large = [(r["shape"], r["T"], r["moegate"] / r["floor"]) for r in timed if r["T"] >= 32768]
    worst_small = max(small, key=lambda x: x[2], default=None)
    worst_large = max(large, key=lambda x: x[2], default=None)
    gm = _geomean(big)
    lines = [
        f"geo-mean moegate/sglang over T >= 4096: {gm:.3f} (target <= 0.333: {'met' if gm <= 1 / 3 else 'NOT met'})"
        if big else "geo-mean moegate/sglang over T >= 4096: none (no SGLang time at T >= 4096: a shape whose routing "
                    "it does not compute (_sglang_covers) or that it failed)",
        f"geo-mean moegate/floor over T >= 4096: "
        f"{_geomean([r['moegate'] / r['floor'] for r in timed if r['T'] >= 4096]):.2f}",
        f"slower than sglang at: {slower if slower else 'nowhere'} (target: nowhere)",
        f"worst moegate - floor at T <= 64: {worst_small} us (target <= 0.3: "
        f"{'met' if worst_small is None or worst_small[2] <= 0.3 else 'NOT met'})",
        f"worst moegate / floor at T >= 32768: {worst_large} (target <= 2: "
        f"{'met' if worst_large is None or worst_large[2] <= 2 else 'NOT met'})",
    ]
    if failed:
        lines.append(f"left out (moegate or the floor failed): {[(r['shape'], r['T']) for r in failed]}")
    checked = [r for r in all_rows if r.get("violations") is not None]
    if checked:
        wrong = [(r["shape"], r["T"], r["violations"]) for r in checked if r["violations"]]
        lines.append(f"routing of the timed launches against the fp32 reference (first and last {VERIFY_ROWS} rows; "
                     f"of the first and the last copy where rotated; {len(checked)} of {len(all_rows)} runs checked): "
                     f"{wrong if wrong else 'no violations'}")
    rows0 = [r for r in timed if r.get("floor0")]
    if rows0:
        ws = max(((r["shape"], r["T"], r["moegate"] - r["floor0"]) for r in rows0 if r["T"] <= 64),
                 key=lambda x: x[2], default=None)
        wl = max(((r["shape"], r["T"], r["moegate"] / r["floor0"]) for r in rows0 if r["T"] >= 32768),
                 key=lambda x: x[2], default=None)
        lines.append(f"against floor0 (no PDL): worst moegate - floor0 at T <= 64: {ws}; worst moegate / floor0 at "
                     f"T >= 32768: {wl}")
    sg = [r for r in rows if r.get("sglang_check")]
    if sg:
        off = [(r["shape"], r["T"], r["sglang_check"][0]) for r in sg if r["sglang_check"][0]]
        lines.append(f"sglang's routing against the fp32 reference (first {VERIFY_ROWS} rows, its weights times rsf): "
                     f"rows routed to other experts {off if off else 'none'}; largest relative weight error "
                     f"{_fmt(max(r['sglang_check'][1] for r in sg), '.2e')}")
    fi = [r for r in rows if r.get("flashinfer")]
    if fi:
        fi_slower = [(r["shape"], r["T"], round(r["moegate"] / r["flashinfer"], 3)) for r in fi
                     if r["moegate"] > r["flashinfer"]]
        lines.append(f"geo-mean moegate/flashinfer over T >= 4096 ({len({r['shape'] for r in fi})} shapes it "
                     f"covers): {_geomean([_ratio(r, 'flashinfer') for r in fi if r['T'] >= 4096]):.3f}, over every "
                     f"T: {_geomean([_ratio(r, 'flashinfer') for r in fi]):.3f}; slower than flashinfer at: "
                     f"{fi_slower if fi_slower else 'nowhere'}")
        off = [(r["shape"], r["T"], r["flashinfer_check"][0]) for r in fi
               if r.get("flashinfer_check") and r["flashinfer_check"][0]]
        rel = max((r["flashinfer_check"][1] for r in fi if r.get("flashinfer_check")), default=None)
        lines.append(f"flashinfer's routing against the fp32 reference (first {VERIFY_ROWS} rows): rows routed to "
                     f"other experts {off if off else 'none'}; largest relative weight error {_fmt(rel, '.2e')}")
    for name in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == name]
        sg = _geomean([r["moegate"] / r["sglang"] for r in rs if r["T"] >= 4096 and r.get("sglang")])
        fl = _geomean([r["moegate"] / r["floor"] for r in rs if r["T"] >= 4096 and r.get("floor") is not None])
        over = max((r["moegate"] - r["floor"] for r in rs if r["T"] <= 64 and r.get("floor") is not None),
                   default=float("nan"))
        worst = max((r["moegate"] / r["sglang"] for r in rs if r.get("sglang")), default=float("nan"))
        lines.append(f"{name:18} mg/sgl {sg:.3f}  mg/floor {fl:.2f}  T<=64 over floor max {over:.2f} us  "
                     f"worst mg/sgl any T {worst:.3f}")
    return lines


# --ab variants: label -> launcher overrides (moegate.kernels.router) set for that measurement only.
AB_VARIANTS = {
    "exact-keys": {"approx_keys_override": False},  # sigmoid keys from libdevice exp and IEEE division
    # sigmoid / sqrt-softplus keys from MUFU ops, margins checked (one-warp sigmoid launches held to 64 registers, as
    # the launcher holds them: runs 44-45 timed this as approx-keys-r64)
    "approx-keys": {"approx_keys_override": True},
    "repair": {"approx_keys_override": True, "approx_repair_override": True},  # close rows repaired (no groups)
    "score-keys": {"logit_keys_override": False},  # renormalized softmax selected on exact scores
    "one-row": {"launch_override": (1, 1)},  # one row a warp (flat epilogue; logit keys for softmax)
    "two-rows": {"launch_override": (2, 1)},  # two rows a program (the 2-D epilogue and rounds)
    "four-rows": {"launch_override": (4, 1)},  # four rows a one-warp program
    "eight-rows-two-warps": {"launch_override": (8, 2)},  # eight rows a two-warp program
    "no-pdl": {"use_pdl_override": False},
    "pdl": {"use_pdl_override": True},  # PDL at every T (the launcher leaves it off for large launches of most shapes)
    "every-run": {"logit_drop_override": False},  # logit keys: every K-th logit repeated by the first loser redone
    "no-pair-exact": {"split_pair_exact_override": False},  # split rows: close rows straight to the 64-bit rounds
    "pdl-start": {"pdl_trigger_override": 0},  # PDL: the next grid may launch from this one's start
    "pdl-late": {"pdl_trigger_override": 1},  # ... from the end of the selection (as SGLang's router)
    "pdl-end": {"pdl_trigger_override": 2},  # ... only when this grid ends
    "thread-rows": {"thread_rows_override": True},  # one row a thread (ungrouped rows up to 32 lanes)
    "warp-rows": {"thread_rows_override": False},  # rows on warps (the path of wide rows)
    "no-split": {"split_rows_override": 0},  # rows on warps (or one a thread) where the launcher splits them
    "no-fma-keys": {"fma_keys_override": False},  # exact sigmoid / sqrt-softplus keys through div_rn / sqrt_rn
    "exact-fma-keys": {"approx_keys_override": False, "fma_keys_override": True},  # exact keys, FMA forms
    "exact-div": {"approx_keys_override": False, "fma_keys_override": False},  # exact keys through div_rn
    "bias-early": {"bias_early_override": True},  # the bias load pinned before the scoring (rows on warps)
    "no-bias-early": {"bias_early_override": False},  # ... left where ptxas puts it
    "scalar-checks": {"scalar_checks_override": True},  # one row a program: checks on the rounds' scalars
    "vector-checks": {"scalar_checks_override": False},  # ... on the round words' vector after the rounds
    "winners-in-regs": {"winners_in_regs_override": True},  # one row a thread: winners' logits from registers
    "winners-reloaded": {"winners_in_regs_override": False},  # ... read again after the selection
    "fat-params": {"lean_params_override": False},  # every kernel argument passed, used or not (34 parameters)
    "kept-only": {"kept_only_override": True},  # grouped rows: the rounds on the kept groups' lanes only
    "all-lanes": {"kept_only_override": False},  # ... on every lane, the dropped ones excluded in the words
    "approx-all-lanes": {"approx_keys_override": True, "kept_only_override": False},  # fast keys, every lane
    "row-sum-dead": {"nan_dead_override": False},  # fast / FMA keys: dead lanes by the logit sum, not NaN keys
    # one warp on a row of 1024 lanes (the launcher's choice since run 126), 32-bit exact rounds, capped at 128
    # registers (16 warps an SM); -r0 uncapped (145 registers, 13 warps an SM)
    "one-warp-wide": {"launch_override": (1, 1)},
    "one-warp-wide-r0": {"launch_override": (1, 1), "maxnreg_override": 0},
    "two-warps-wide": {"launch_override": (1, 2)},  # ... two warps (the launcher's register cap)
    "four-warps-wide": {"launch_override": (1, 4)},  # ... four warps (the launcher's choice before run 126)
}
# Rows on warps (kernels/warp_rows_kernel.py, router.WARP_ROWS): forced on at every T where the config
# allows it (rows-a-warp; -4: four warps a program), or off (router-kernel).
AB_VARIANTS["router-kernel"] = {"warp_rows_override": False}
AB_VARIANTS["rows-a-warp"] = {"warp_rows_override": True}
AB_VARIANTS["rows-a-warp-4"] = {"warp_rows_override": True, "WARP_ROWS_WARPS": 4}
# ... with a row on N threads (32 // N rows a warp; -rM: capped at M registers, 0 none)
for _t in (32, 16, 8):
    AB_VARIANTS[f"rows-t{_t}"] = {"warp_rows_override": True, "WARP_ROWS_THREADS": _t}
    for _n in (0, 48, 64, 96, 128):
        AB_VARIANTS[f"rows-t{_t}-r{_n}"] = {"warp_rows_override": True, "WARP_ROWS_THREADS": _t,
                                           "WARP_ROWS_MAX_REGISTERS": {_t: (_n, _n)}}
    for _w in (1, 4):  # ... on W warps a program (WARP_ROWS_WARPS)
        AB_VARIANTS[f"rows-t{_t}-w{_w}"] = {"warp_rows_override": True, "WARP_ROWS_THREADS": _t, "WARP_ROWS_WARPS": _w}
AB_VARIANTS["rows-t8-w1-r64"] = {"warp_rows_override": True, "WARP_ROWS_THREADS": 8, "WARP_ROWS_WARPS": 1,
                                 "WARP_ROWS_MAX_REGISTERS": {8: (64, 64)}}
# ... two warps a program under a lower cap: more warps an SM than one-warp programs' 32 (56 registers: 36, 48: 42);
# slower than one warp everywhere in H100 run 192 (DeepSeek-V3 bf16 T = 65536 28.11 / 28.76 against 27.00 us)
for _n in (48, 56):
    AB_VARIANTS[f"rows-t8-w2-r{_n}"] = {"warp_rows_override": True, "WARP_ROWS_THREADS": 8, "WARP_ROWS_WARPS": 2,
                                       "WARP_ROWS_MAX_REGISTERS": {8: (_n, _n)}}
# ... an fp32 bias beside bf16 logits rounding on every lane (WARP_ROWS_MIXED_KEPT off)
AB_VARIANTS["rows-a-warp-no-mixed-kept"] = {"warp_rows_override": True, "WARP_ROWS_MIXED_KEPT": False}
# ... the epilogue on the [KC, R] words' tile, two slots a thread for DeepSeek-V3 (WARP_ROWS_NARROW off)
AB_VARIANTS["rows-a-warp-wide-epilogue"] = {"warp_rows_override": True, "WARP_ROWS_NARROW": False}
# ... the kept groups by counting the groups above each (WARP_ROWS_GROUP_ROUNDS off)
AB_VARIANTS["rows-a-warp-group-count"] = {"warp_rows_override": True, "WARP_ROWS_GROUP_ROUNDS": False}
# ... 2026-12-07's fast-path changes off (the kernel of 9f7707a)
AB_VARIANTS["rows-a-warp-9f7707a"] = {"warp_rows_override": True, "WARP_ROWS_GROUP_ROUNDS": False,
                                      "WARP_ROWS_NARROW": False, "WARP_ROWS_LAZY_EXTRA": False,
                                      "WARP_ROWS_LEAN": False}
# ... the words past the first loser found on the fast path too, not only where _repair runs (WARP_ROWS_LAZY_EXTRA off)
AB_VARIANTS["rows-a-warp-eager-extra"] = {"warp_rows_override": True, "WARP_ROWS_LAZY_EXTRA": False}
# ... the compiler's own forms where WARP_ROWS_LEAN writes its own (bf16 widening, the kept lanes' distance words and
# round steps in PTX, their wider bias's addresses, their keys' finite check): the fast path before H200 run 186
AB_VARIANTS["rows-a-warp-no-lean"] = {"warp_rows_override": True, "WARP_ROWS_LEAN": False}
# ... DeepSeek-V3's kept lanes' keys (bf16 / fp16 logits) from the first pass's through shared memory (the default
# since H100 run 197) or read and scored again (WARP_ROWS_SMEM_KEPT off); the launcher's own choice of kernel otherwise
AB_VARIANTS["rows-smem-kept"] = {"WARP_ROWS_SMEM_KEPT": True}
AB_VARIANTS["rows-no-smem-kept"] = {"WARP_ROWS_SMEM_KEPT": False}
# ... the cached rounds with each group's cache in shared memory wherever it applies (the launcher takes it from
# top-17 and T = 16384 only), or nowhere
AB_VARIANTS["cache-smem"] = {"cache_smem_override": True}
AB_VARIANTS["no-cache-smem"] = {"cache_smem_override": False}
# ... and on the fast sigmoid keys (512 top-22 keeps the exact FMA keys: with the ALU pipe's load cut, the 23% fewer
# instructions of the fast keys might pay; H100 run 197: they did not, 75.86 against 74.71 us at T = 65536)
AB_VARIANTS["cache-smem-fast-keys"] = {"cache_smem_override": True, "approx_keys_override": True}
AB_VARIANTS["rows-a-warp-no-repair"] = {"warp_rows_override": True, "WARP_ROWS_REPAIR": False}
AB_VARIANTS["rows-a-warp-extra0"] = {"warp_rows_override": True, "WARP_ROWS_EXTRA": 0}
# A register cap for ptxas (maxnreg-N): spills where the exact path sets the count, more warps an SM. 80-128 for one
# warp on a 1024-lane row (the launcher: 128 below T = 16384, 123 registers and 16 warps an SM; 80 from there, 25 warps;
# sm_90 SASS of 896 top-16 at T = 65536: 112 -> 18 warps, 104 -> 19, both 18 bytes spilled and 7 more fast-path
# instructions; 96 -> 21, 82 bytes; 80 -> 25, 73 bytes); 64-72 for one warp on a 512-lane row (64 from T = 16384).
for _n in (40, 48, 52, 56, 60, 64, 72, 80, 88, 96, 104, 112, 128):
    AB_VARIANTS[f"maxnreg-{_n}"] = {"maxnreg_override": _n}
# The row N programs ahead asked of the L2 (one row a one-warp program): prefetch-0 never, prefetch-N at every T.
for _n in (0, 1024, 2048, 4096, 8192):
    AB_VARIANTS[f"prefetch-{_n}"] = {"prefetch_rows_override": _n}
# Truncated softmax words of bf16 / fp16 logits from the logits' own bits (TRUNC_LOGIT_WORDS).
AB_VARIANTS["trunc-logit-words"] = {"trunc_logit_words_override": True}
AB_VARIANTS["trunc-score-words"] = {"trunc_logit_words_override": False}
# Rounds on each lane group's cached top words (CACHE_DEPTH; cache-0: the plain rounds).
for _n in (0, 3, 4, 5, 6, 7, 8):
    AB_VARIANTS[f"cache-{_n}"] = {"cache_rounds_override": _n}
# One row a program: the rounds' words shifted a column a round (SHIFT_WORDS) or selected into their column.
AB_VARIANTS["shift-words"] = {"shift_words_override": True}
AB_VARIANTS["select-words"] = {"shift_words_override": False}
# The binades fp32 logit keys' words span: 2**N (logit-span-0: one, as before 2026-12-05 night).
for _n in (0, 1, 2):
    AB_VARIANTS[f"logit-span-{_n}"] = {"logit_span_override": _n}
AB_VARIANTS["no-maxnreg"] = {"maxnreg_override": 0}  # ptxas decides everywhere (the launcher caps some launches)
# Split rows (ungrouped rows on Q threads each): the launcher's warps (split-Q) and w warps (split-QwW).
for _q in (2, 4, 8, 16):
    AB_VARIANTS[f"split-{_q}"] = {"split_rows_override": _q}
    for _w in (1, 2, 4):
        AB_VARIANTS[f"split-{_q}w{_w}"] = {"split_rows_override": _q, "launch_override": (32 * _w // _q, _w)}


def ab(shapes, tokens, rep, variants=None, repeats=1):
    """moegate as the heuristic launches it and with each of AB_VARIANTS (or the named ones), on the same
    inputs; at T <= REPEAT_MAX_TOKENS in ``repeats`` rounds (the heuristic, each variant, floor0 in turn), each
    figure the median of its rounds."""
    import moegate.kernels.router as kr

    chosen = {k: v for k, v in AB_VARIANTS.items() if variants is None or k in variants}

    for name in shapes:
        config, dtype = SHAPES[name]
        for T in tokens:
            fns = _providers(config, dtype, T, None, set())
            samples = {label: [] for label in ("heuristic", *chosen, "floor0")}
            for rnd in range(repeats if T <= REPEAT_MAX_TOKENS else 1):
                samples["heuristic"].append(_time(fns["moegate"], rep))
                if rnd == 0:
                    _verified(fns["moegate"], f"ab {name} T={T} heuristic")
                for label, overrides in chosen.items():
                    if samples[label] is None:
                        continue
                    saved = {k: getattr(kr, k) for k in overrides}
                    for k, v in overrides.items():
                        setattr(kr, k, v)
                    try:
                        samples[label].append(_time(fns["moegate"], rep))
                        if rnd == 0:
                            _verified(fns["moegate"], f"ab {name} T={T} {label}")
                    except Exception as exc:
                        samples[label] = None
                        print(f"ab {name} T={T} {label}: {type(exc).__name__}: {str(exc)[:100]}")
                    finally:
                        for k, v in saved.items():
                            setattr(kr, k, v)
                samples["floor0"].append(_time(fns["floor0"], rep))
            times = {k: float("nan") if v is None else _median(v) for k, v in samples.items()}
            print(f"ab {name:18} T={T:>6} " + " ".join(f"{k} {v:6.2f}" for k, v in times.items()), flush=True)


def _candidates(width, thread_rows=False, split=0):
    """(rows per program, warps) worth timing for a row of ``width`` lanes (a few K lanes per program)."""
    if split:  # rows on ``split`` threads each: 32 / split rows a warp
        return [(32 * w // split, w) for w in (1, 2, 4, 8)]
    if thread_rows:  # rows a program: a multiple of 32 a warp
        return [(32, 1), (64, 1), (128, 1), (64, 2), (128, 2), (128, 4), (256, 4)]
    if width <= 128:
        return [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (32, 1), (64, 1), (4, 2), (8, 2), (16, 4)]
    if width <= 512:
        return [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2), (1, 4)]
    return [(2, 1), (1, 2), (2, 2), (1, 4), (2, 4), (1, 8)]  # one warp a 1024-lane row is refused


def sweep(shapes, tokens, rep):
    """Time every (rows per program, warps) candidate; print the best per shape and T. Returns the rows
    ({shape, T, heuristic, best, times: {"rows x warps": us}}; a candidate that failed is None)."""
    import moegate.kernels.router as kr

    rows = []
    for name in shapes:
        config, dtype = SHAPES[name]
        g, gs = kr._tile_shape(config)
        for T in tokens:
            split = kr._split_threads(config, T)
            candidates = _candidates(g * gs, not split and kr._use_thread_rows(config), split)
            fns = _providers(config, dtype, T, None, set())
            times = {}
            for cand in candidates:
                kr.launch_override = cand
                try:
                    times[cand] = _time(fns["moegate"], rep)
                    _verified(fns["moegate"], f"sweep {name} T={T} {cand}")
                except Exception as exc:
                    times[cand] = float("inf")
                    print(f"sweep {name} T={T} {cand}: {type(exc).__name__}: {str(exc)[:100]}")
            kr.launch_override = None
            heur = _time(fns["moegate"], rep)
            best = min(times, key=times.get) if any(math.isfinite(t) for t in times.values()) else None
            print(f"sweep {name:18} T={T:>6} heuristic {heur:7.2f} us, best "
                  + (f"{best} {times[best]:7.2f} us | " if best else "none (every candidate failed) | ")
                  + " ".join(f"{c[0]}x{c[1]}:{t:.1f}" for c, t in times.items()), flush=True)
            rows.append({"shape": name, "T": T, "heuristic": heur, "best": f"{best[0]}x{best[1]}" if best else None,
                         "times": {f"{c[0]}x{c[1]}": (t if math.isfinite(t) else None) for c, t in times.items()}})
    return rows


def _parse_settings(parser, items):
    """--set NAME=VALUE entries -> {name: value}: names of moegate.kernels.router's module-level constants and
    overrides, values Python literals. Anything else is a usage error, before any launch."""
    import ast

    import moegate.kernels.router as kr

    settings = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not (name.isupper() or name.endswith("_override")) \
                or name.startswith("_") or not hasattr(kr, name) or callable(getattr(kr, name)) \
                or isinstance(getattr(kr, name), types.ModuleType):
            parser.error(f"--set {item!r}: NAME=VALUE with NAME a setting of moegate.kernels.router "
                         "(an upper-case constant or a *_override)")
        try:
            settings[name] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            parser.error(f"--set {item!r}: {text!r} is not a Python literal")
    return settings


def _names(parser, option: str, text: str, valid) -> list[str]:
    names = [n for n in text.split(",") if n]
    for n in names:
        if n not in valid:
            parser.error(f"{option}: unknown name {n!r}; valid: {', '.join(valid)}")
    return names


def _counts(parser, option: str, text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t]
    except ValueError:
        parser.error(f"{option} {text!r}: comma-separated token counts")
    if any(t < 0 for t in counts):
        parser.error(f"{option} {text!r}: token counts are >= 0")
    return counts


def main(argv=None) -> int:
    global VERIFY_ROWS, COUNT_FALLBACKS, TIMER, ROTATE_BYTES, ROW_PAD
    p = argparse.ArgumentParser(prog="moegate bench", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                   help="comma-separated names: " + ", ".join(SHAPES) + " (default: all but "
                        + ", ".join(EXTRA_SHAPES) + ")")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--ref-tokens", default="4096,65536",
                   help="token counts at which the torch reference (eager and compiled) is timed too; '' for none")
    p.add_argument("--compiled-shapes", default=None,
                   help="shapes at which torch.compile of the reference is timed (default: all; compiling is slow)")
    p.add_argument("--rep", type=int, default=20, help="milliseconds of graph replay per measurement")
    p.add_argument("--repeats", type=int, default=3,
                   help=f"rounds of the providers (and of the --ab variants) in turn at T <= {REPEAT_MAX_TOKENS}; "
                        "each figure is the median of its rounds (the lower middle for an even count)")
    p.add_argument("--verify-rows", type=int, default=VERIFY_ROWS,
                   help="rows of each timed moegate launch checked against the fp32 reference (0: none)")
    p.add_argument("--fallbacks", action="store_true",
                   help="after each timed moegate launch, print how many programs left the fast path (one more "
                        "launch with the kernel's counters on; each counting variant compiles once)")
    p.add_argument("--rotate-mb", type=int, default=ROTATE_BYTES >> 20,
                   help="MB of copies of each launch's inputs and outputs that every provider cycles through, so "
                        "that large launches read logits from HBM, not the L2 (at most %d copies; 0: one copy, every "
                        "replay on the same buffers)" % MAX_COPIES)
    p.add_argument("--row-pad", type=int, default=ROW_PAD,
                   help="time logits whose rows lie this many elements further apart than their width (a view of a "
                        "wider buffer; FlashInfer's op, which takes contiguous rows, is left out)")
    p.add_argument("--json", help="write the rows and the summary here")
    p.add_argument("--sweep", action="store_true", help="time launch shapes instead of providers")
    p.add_argument("--ab", default=None,
                   help="after the table, also time the AB_VARIANTS (exact keys, score keys, one or two rows a "
                        "program, PDL off) at these token counts")
    p.add_argument("--ab-variants", default=None,
                   help="comma-separated AB_VARIANTS to time with --ab (default: all): " + ", ".join(AB_VARIANTS))
    p.add_argument("--timer", choices=("graph", "do_bench"), default=TIMER,
                   help="graph: do_bench_cudagraph's method with its launch count estimated on a graph (default); "
                        "do_bench: triton.testing.do_bench_cudagraph itself, estimated on eager calls")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a launcher constant or override of moegate.kernels.router for the whole run (a Python "
                        "literal), e.g. PDL_MAX_TOKENS=2048 or approx_keys_override=False; repeatable")
    args = p.parse_args(argv)
    settings = _parse_settings(p, args.set)
    # Every usage error before anything runs (a typo found after the table would cost the whole run).
    shapes = _names(p, "--shapes", args.shapes, SHAPES)
    compiled_shapes = set(shapes if args.compiled_shapes is None
                          else _names(p, "--compiled-shapes", args.compiled_shapes, SHAPES))
    tokens = _counts(p, "--tokens", args.tokens)
    ref_tokens = set(_counts(p, "--ref-tokens", args.ref_tokens))
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, not {args.repeats}")
    if args.ab_variants is not None and not args.ab:
        p.error("--ab-variants chooses the variants of --ab; give --ab T,...")
    ab_tokens = _counts(p, "--ab", args.ab) if args.ab else []
    variants = None if args.ab_variants is None else _names(p, "--ab-variants", args.ab_variants, AB_VARIANTS)
    if args.sweep and args.ab:
        p.error("--sweep times launch shapes, not the --ab variants; give one of them")
    if args.rotate_mb < 0:
        p.error(f"--rotate-mb must be >= 0, not {args.rotate_mb}")
    if args.row_pad < 0:
        p.error(f"--row-pad must be >= 0, not {args.row_pad}")
    if args.verify_rows < 0:
        p.error(f"--verify-rows must be >= 0 (0: no check), not {args.verify_rows}")
    if args.rep < 1:
        p.error(f"--rep must be >= 1 (milliseconds of replay a measurement), not {args.rep}")
    if args.json is not None:
        from moegate.cli import CliError, _check_writable

        try:
            _check_writable(args.json, "--json")  # before the run, not after it
        except CliError as exc:
            p.error(str(exc))
    VERIFY_ROWS = args.verify_rows
    ROTATE_BYTES = args.rotate_mb << 20
    ROW_PAD = args.row_pad
    TIMER = args.timer
    COUNT_FALLBACKS = args.fallbacks
    if not torch.cuda.is_available():
        print("moegate bench: error: it needs a CUDA device; none is available", file=sys.stderr)
        return 2
    import triton

    import moegate.kernels.router as kr

    for name, value in settings.items():
        setattr(kr, name, value)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | {torch.cuda.get_device_name()} | "
          f"torch {torch.__version__} | triton {triton.__version__} | timer {TIMER}: CUDA-graph median, "
          f"rep={args.rep} ms | inputs rotated over {args.rotate_mb} MB (at most {MAX_COPIES} copies; cp)"
          + (f" | rows padded by {ROW_PAD} elements" if ROW_PAD else "")
          + "".join(f" | {k}={v!r}" for k, v in settings.items()))
    if args.sweep:
        rows = sweep(shapes, tokens, args.rep)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "sweep": rows}, f, indent=1)
        return 0
    sglang = _load_sglang()
    covered = [name for name in shapes if _flashinfer_covers(SHAPES[name][0])]
    flashinfer = _load_flashinfer() if covered else None
    print(HEADER)
    rows = bench(shapes, tokens, ref_tokens, args.rep, sglang, compiled_shapes, args.repeats, flashinfer)
    print("\n" + HEADER)
    for r in rows:
        print(_format_row(r))
    lines = summary(rows) if sglang is not None else ["(no sglang: no ratios)"]
    print("\n".join(lines))
    if ab_tokens:
        ab(shapes, ab_tokens, args.rep, variants, args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "row_pad": ROW_PAD, "rows": rows, "summary": lines}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
