"""The fused Triton router (backend="triton") against the reference, docs/contract.md steps 1-12.

On a CUDA machine these run on the GPU over the full grid. Without one they run the same kernel under
TRITON_INTERPRET=1 on the CPU with small shapes (the CI lane); the environment variable must be set
before the kernel module is first imported, hence the top of this file.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from moegate import ExpertLayout, ExpertPlacement, RouterConfig, RoutingRecorder, route  # noqa: E402
from moegate.check import _tie_order_violation, logical_routed_ids  # noqa: E402
from moegate.kernels import router_kernel as rk  # noqa: E402
from moegate.reference import route_reference, routed_weights, scores_and_keys  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if HAS_CUDA else "cpu"
FULL = HAS_CUDA  # the full grid on the GPU; small shapes under the interpreter


def _gpu_split(q):
    """Threads a row for tests that force 128-expert rows onto Q = 4: 32 columns a thread, a kernel ptxas takes ~2
    minutes to compile (sm_90), several times per test. On the GPU those tests take 8 threads (16 columns);
    test_split_rows_at_large_T_match_reference keeps Q = 4 there at T = 65536 (SPLIT_MAX_COLUMNS, the widest split
    row)."""
    return 8 if FULL and q == 4 else q
pytestmark = pytest.mark.skipif(
    not (HAS_CUDA or INTERPRET), reason="no CUDA device, and TRITON_INTERPRET is set to something other than 1"
)
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (CUDA graphs); none is available")

# Weights: fp32 arithmetic throughout, so one tolerance whatever the logits' dtype (docs/contract.md): 1e-6
# relative, as issue 3 asks (atol 1e-9 only for weights near 0; 1e-7 let a weight of 0.03 off by 3e-6 relative
# pass); the p-norm goes through pow twice and gets a few ulps more.
TOLERANCES = {"default": dict(rtol=1e-6, atol=1e-9), "pnorm": dict(rtol=4e-6, atol=1e-9)}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOKEN_COUNTS = (0, 1, 37, 199, 1024) if FULL else (0, 1, 37, 199)

# Distinct values exact in bf16 and fp16, none near 0: every bf16 in [1/64, 8) and its negation
# (bit patterns 0x3C80..0x40FF), 2304 values, so rows wider than 256 stay tie-free.
_POOL = torch.arange(0x3C80, 0x4100, dtype=torch.int16).view(torch.bfloat16).float()
_POOL = torch.cat([_POOL, -_POOL])


def tie_free_logits(T, W, dtype=torch.float32, seed=0):
    """Per-row permutations: randperm(W) / 32 up to W = 256 (exact in bf16), else draws from _POOL."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(T, max(W, 1), generator=g).argsort(dim=1)[:, :W]
    if W <= 256:
        x = order.float() / 32
    else:
        x = _POOL[torch.rand(T, len(_POOL), generator=g).argsort(dim=1)[:, :W]]
    return x.to(dtype).to(DEVICE)


def extras(config, T, seed=0):
    """bias / expert_scale / hash tables for a config, on the device."""
    g = torch.Generator().manual_seed(seed + 1)
    kw = {}
    if config.has_correction_bias:
        kw["bias"] = (torch.randint(0, 16, (config.num_scored,), generator=g) / 64).to(DEVICE)
    if config.has_expert_scale:
        kw["expert_scale"] = (0.5 + torch.rand(config.num_experts, generator=g)).to(DEVICE)
    if config.routing == "hash":
        vocab = 50
        kw["hash_table"] = torch.rand(vocab, config.num_experts, generator=g).argsort(dim=1)[:, : config.top_k].to(
            DEVICE, torch.int32
        )
        kw["token_ids"] = torch.randint(0, vocab, (T,), generator=g).to(DEVICE)
    return kw


def poisoned_out(T, width):
    return (
        torch.full((T, width), float("nan"), device=DEVICE),
        torch.full((T, width), -7, dtype=torch.int32, device=DEVICE),
    )


def run_both(logits, config, layout=None, tol="default", near_ties=False, **kw):
    """Route with the kernel (into poisoned outputs) and the reference; compare ids and weights."""
    layout = layout or ExpertLayout()
    width = config.top_k + layout.num_shared_columns(config.num_shared_experts)
    out = poisoned_out(logits.shape[0], width)
    got = route(logits, config, layout, backend="triton", out=out, **kw)
    assert got.weights is out[0] and got.ids is out[1]
    want = route(logits, config, layout, backend="reference", **kw)
    assert_same_routing(got, want, logits, config, kw.get("bias"), tol=tol, near_ties=near_ties, layout=layout,
                        expert_scale=kw.get("expert_scale"))
    return got, want


def assert_same_routing(got, want, logits, config, bias, tol="default", near_ties=False, layout=None,
                        expert_scale=None):
    """Ids equal and weights within TOLERANCES[tol]. near_ties: a few rows (at most T / 50, at least 1) may pick
    other experts than the reference, each column's key within 1e-6 of the reference's (with a bias, s_i + b_i and
    s_j + b_j may land within an ulp; the kernel's exp / log and torch's may then order them differently). Those rows
    are still checked: K distinct experts; keys exactly equal in fp64 (equal inputs) ordered by the lower id, before
    any such expert left out of the picked groups; weights those of the reference's step 6-8 on the picked experts
    (layout and expert_scale as routed; the expert ids mapped back from placed slots); shared columns equal."""
    gw, gi = got
    ww, wi = want
    assert not torch.isnan(gw).any(), "an output weight was never written"
    assert not (gi == -7).any(), "an output id was never written"
    same = (gi == wi).all(dim=1)
    if near_ties and not bool(same.all()):
        layout = layout or ExpertLayout()
        scores32, _ = scores_and_keys(logits, config, bias, torch.float32)
        _, key64 = scores_and_keys(logits, config, bias, torch.float64)
        bad = (~same).nonzero().flatten()
        assert len(bad) <= max(1, logits.shape[0] // 50), f"{len(bad)} rows routed differently"
        K, W = config.top_k, key64.shape[1]
        tie = _tie_order_violation(gi, logits, config, layout, bias, bad)
        assert tie is None, tie
        logical = logical_routed_ids(gi[:, :K], config, layout)
        for r in bad.tolist():
            g, w = logical[r], logical_routed_ids(wi[r:r + 1, :K], config, layout)[0]
            assert bool(((g >= 0) & (g < W)).all()), f"row {r}: ids {gi[r]}"
            assert len(set(g.tolist())) == K, f"row {r}: an expert twice in {gi[r]}"
            kg, kw_ = key64[r, g], key64[r, w]
            assert torch.allclose(kg, kw_, rtol=1e-6, atol=1e-12), f"row {r}: {gi[r]} vs {wi[r]}"
            exp_w = routed_weights(scores32[r:r + 1], g[None], config, layout,
                                   None if expert_scale is None else expert_scale.float())[0]
            torch.testing.assert_close(gw[r, :K], exp_w.to(gw.dtype), **TOLERANCES[tol])
            torch.testing.assert_close(gi[r, K:], wi[r, K:], rtol=0, atol=0)
            torch.testing.assert_close(gw[r, K:], ww[r, K:], **TOLERANCES[tol])
        keep = same
        gw, gi, ww, wi = gw[keep], gi[keep], ww[keep], wi[keep]
    torch.testing.assert_close(gi, wi, rtol=0, atol=0)
    torch.testing.assert_close(gw, ww, **TOLERANCES[tol])


def test_near_tie_check_fails_wrong_rows():
    """assert_same_routing(near_ties=True) on doctored routings (no kernel): a row whose two best keys are equal
    (row 0) and one whose best two are an ulp apart (row 5). It accepts the near tie reported in the other order
    (their weights with them) and fails an exact tie given to the higher id, an expert twice, columns swapped that
    are not near ties, and a wrong weight on the near-tie row."""
    config = RouterConfig(32, 4, scoring="sigmoid", has_correction_bias=True)
    x, bias = tie_free_logits(60, 32, seed=1).cpu(), torch.zeros(32)
    ids = route(x, config, bias=bias, backend="reference").ids
    x[0, ids[0, :2].max()] = x[0, ids[0, :2].min()]
    x[5, ids[5, 1]] = torch.nextafter(x[5, ids[5, 0]], torch.tensor(-1e9))
    want = route(x, config, bias=bias, backend="reference")

    def doctored(row, swap=None, dup=False, weight=None):
        w, i = want.weights.clone(), want.ids.clone()
        if swap:
            a, b = swap
            i[row, a], i[row, b], w[row, a], w[row, b] = i[row, b].item(), i[row, a].item(), w[row, b], w[row, a]
        if dup:
            i[row, 1] = i[row, 0]
        if weight is not None:
            w[row, 2] = weight
        return w, i

    assert_same_routing(doctored(5, swap=(0, 1)), want, x, config, bias, near_ties=True)
    for bad in (doctored(0, swap=(0, 1)), doctored(0, dup=True), doctored(3, swap=(2, 3)),
                doctored(5, swap=(0, 1), weight=0.5)):
        with pytest.raises(AssertionError):
            assert_same_routing(bad, want, x, config, bias, near_ties=True)


def assert_identical(a, b):
    """Two routings of the same inputs, ids and weights bit for bit."""
    torch.testing.assert_close(a.ids, b.ids, rtol=0, atol=0)
    torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=0)


def _configs():
    """(name, config, tolerance) over the contract's knobs; widths small under the interpreter."""
    E, K = (256, 8) if FULL else (32, 4)
    wide = [
        ("kimi-384", RouterConfig(384, 8, scoring="sigmoid", has_correction_bias=True, routed_scaling_factor=2.827)),
        ("k3-896-top16", RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True)),
        ("2048-top32", RouterConfig(2048, 32, scoring="softmax")),
        ("512-top22", RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True)),
        ("384-groups-of-48", RouterConfig(384, 8, scoring="sigmoid", has_correction_bias=True, n_group=8,
                                          topk_group=3)),
        ("groups-of-64", RouterConfig(2048, 16, scoring="sigmoid", n_group=32, topk_group=4, group_score="max")),
    ] if FULL else [
        ("width-300", RouterConfig(300, 6, scoring="sigmoid", has_correction_bias=True)),
    ]
    return [
        ("softmax", RouterConfig(E, K), "default"),
        ("softmax-raw", RouterConfig(E, K, renormalize=False), "default"),
        ("shared-scale-half", RouterConfig(E, K, routed_scaling_factor=0.5, shared_expert_scale=0.5), "default"),
        ("sigmoid-bias-rsf", RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True,
                                          routed_scaling_factor=2.5), "default"),
        ("sqrtsoftplus-bias", RouterConfig(E, K - 2, scoring="sqrtsoftplus", has_correction_bias=True,
                                           routed_scaling_factor=1.5), "default"),
        ("grouped-top2-exclude", RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True, n_group=8,
                                              topk_group=4, routed_scaling_factor=2.5), "default"),
        ("grouped-max-zero", RouterConfig(E, K, scoring="softmax", n_group=4, topk_group=2, group_score="max",
                                          group_fill="zero"), "default"),
        ("odd-groups", RouterConfig(3 * (12 if FULL else 5), 4, scoring="sigmoid", n_group=3, topk_group=2),
         "default"),
        ("logits-selection", RouterConfig(E, K, selection="logits", scoring="sigmoid", renormalize=False),
         "default"),
        ("softcap-scale", RouterConfig(E, K, logit_scale=0.5, softcap=3.0), "default"),
        ("pnorm-clamp", RouterConfig(E, K, renorm_p=2.0, renorm_eps_mode="clamp", renorm_eps=1e-6), "pnorm"),
        ("expert-scale", RouterConfig(E, K, scoring="sigmoid", has_expert_scale=True), "default"),
        ("zero-experts", RouterConfig(E, K, num_zero_experts=E // 4 if FULL else 8, scoring="sigmoid",
                                      has_correction_bias=True), "default"),
        ("top1-non-pow2", RouterConfig(E - 3, 1, renormalize=False), "default"),
    ] + [(name, c, "default") for name, c in wide]


CONFIGS = _configs()


def _layouts(E):
    half = E // 2
    # Every expert once, experts [0, half) twice more: replicas on both ranks.
    slots = tuple(range(E)) + tuple(range(half))
    if len(slots) % 2:
        slots = slots + (0,)
    placement = ExpertPlacement(slots, E)
    return [
        ("default", ExpertLayout(), 0),
        ("global-on-output", ExpertLayout(shared_slots="global", scale="on_output"), 2),
        ("per-rank-round-robin", ExpertLayout(shared_slots="per_rank", ep_size=2, placement=placement), 1),
        ("per-rank-home", ExpertLayout(shared_slots="per_rank", ep_size=2, placement=placement,
                                       replica_policy="home_rank"), 2),
        ("first-replica-on-output", ExpertLayout(ep_size=2, placement=placement, replica_policy="first",
                                                 scale="on_output"), 0),
    ]


def _grid():
    cases = []
    for name, config, tol in CONFIGS:
        layouts = _layouts(config.num_experts)
        for lname, layout, S in layouts:
            if config.num_zero_experts and lname != "default":
                continue
            for dtype in DTYPES:  # every config x layout x dtype, on the GPU and under the interpreter
                cases.append(pytest.param(config.replace(num_shared_experts=S), layout, dtype, tol,
                                          id=f"{name}-{lname}-{str(dtype)[6:]}"))
    return cases


@pytest.mark.parametrize("config,layout,dtype,tol", _grid())
def test_matches_reference_on_tie_free_logits(config, layout, dtype, tol):
    for seed, T in enumerate(TOKEN_COUNTS):
        logits = tie_free_logits(T, config.num_scored, dtype, seed)
        kw = extras(config, T, seed)
        home = layout.ep_size - 1
        run_both(logits, config, layout, tol=tol, near_ties=config.has_correction_bias, home_rank=home, **kw)


@pytest.mark.parametrize("ep_size", [2, 4])
def test_home_rank_policy_on_every_rank_with_and_without_a_home_replica(ep_size):
    """replica_policy="home_rank" on every home rank: the first replica on the home rank where there is one, else
    round robin over the replicas (t % count). The grid's placement has a replica of each replicated expert on the
    last rank, the grid's home: an expert replicated on other ranks only takes the fallback here (a kernel that took
    the first replica there passed the grid, a review found)."""
    E = 16
    # Slots per rank: 8 / ep_size experts once each, then extras. Experts 0-3 get two more replicas, both on rank 0's
    # half of the extra slots; experts 4-7 one more on the last rank's.
    base = list(range(E))
    extra = [0, 1, 2, 3, 0, 1, 2, 3] + [4, 5, 6, 7] * 2
    per_rank = (len(base) + len(extra)) // ep_size
    slots = []
    for r in range(ep_size):  # rank r's base experts, then rank 0 the first extras, the last rank the last ones
        slots += base[r * E // ep_size:(r + 1) * E // ep_size]
        n = per_rank - E // ep_size
        slots += extra[:n] if r == 0 else extra[-n:] if r == ep_size - 1 else extra[8:8 + n]
    placement = ExpertPlacement(tuple(slots), E)
    layout = ExpertLayout(ep_size=ep_size, placement=placement, replica_policy="home_rank")
    config = RouterConfig(E, 4, scoring="softmax", renormalize=True)
    logits = tie_free_logits(37, E, torch.float32, 5)
    replicas = placement.replicas
    no_home = [e for e in range(E) if len(replicas[e]) >= 2
               and not any(p // per_rank == ep_size - 1 for p in replicas[e])]
    assert no_home, "the placement must hold experts with several replicas and none on the last rank"
    for home in range(ep_size):
        got, want = run_both(logits, config, layout, home_rank=home)
        phys = want.ids[:, :4].long()
        for t in range(logits.shape[0]):  # the rule itself, on the reference's ids
            for p in phys[t].tolist():
                e = placement.physical_to_logical[p]
                at_home = [q for q in replicas[e] if q // per_rank == home]
                assert p == (at_home[0] if at_home else replicas[e][t % len(replicas[e])])


@pytest.mark.parametrize("block_m,num_warps", [(1, 1), (4, 1), (2, 2), (1, 4)])
def test_every_launch_shape_routes_the_same(block_m, num_warps, monkeypatch):
    """The heuristic only picks among correct launches: force each shape through the same batch."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (block_m, num_warps))
    E = 64 if not FULL else 256
    config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    for T in (1, 37):
        logits = tie_free_logits(T, E, seed=T)
        run_both(logits, config, near_ties=True, **extras(config, T))


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's speed-ups (tests/conftest.py) apply to the CPU lane only")
def test_interpreter_speedups_change_nothing():
    """conftest.py's shortcuts for Triton 3.6's interpreter give what the code they replace gives: a tuple's type
    (read late) is the type of its values, also after _setitem; the numpy dtype table matches the original function
    on every scalar, block and pointer type; overflow checks are off only where their asserts would be dropped."""
    import triton.language.core as core
    import triton.runtime.interpreter as ti

    if not triton.__version__.startswith("3.6."):
        pytest.skip("the speed-ups are written for Triton 3.6")
    assert getattr(core, "_moegate_lazy_tuples", False) and getattr(ti, "_moegate_np_dtypes", False)
    t = core.tuple([1, 2.5, tl.int32])
    assert t.type == core._type_for_tuple_values([1, 2.5, tl.int32])
    t._setitem(1, 7)
    assert t.type == core._type_for_tuple_values([1, 7, tl.int32]) and t.values == [1, 7, tl.int32]
    given = core.tuple([3], core.tuple_type([core.constexpr_type(3)]))
    assert given.type == core._type_for_tuple_values([3])
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    kinds = scalars + [tl.pointer_type(tl.float32)] + [tl.block_type(d, [4, 2]) for d in scalars]
    kinds.append(tl.block_type(tl.pointer_type(tl.bfloat16), [8]))
    for d in kinds:
        assert ti._get_np_dtype(d) == ti._moegate_slow_np_dtype(d), d
    options = ti.interpreter_builder.options
    assert not options.debug and not options.sanitize_overflow


def test_one_warp_on_a_1024_lane_row_is_refused_on_the_64_bit_rounds(monkeypatch):
    """That launch returned wrong ids on the H200 on the 64-bit exact rounds (BENCHMARKS.md run 8): with them forced,
    an error, never a silent answer."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "exact32_override", False)
    config = RouterConfig(1024, 8, scoring="sigmoid")
    with pytest.raises(ValueError, match="one warp"):
        route(tie_free_logits(2, 1024), config, backend="triton")


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("keys", ["fast", "exact"])
@pytest.mark.parametrize("config", [
    RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True),
    RouterConfig(1024, 8, scoring="sqrtsoftplus", has_correction_bias=True),
    RouterConfig(1000, 8, scoring="softmax", n_group=8, topk_group=4),
    RouterConfig(512, 12, num_zero_experts=256),  # LongCat-Flash: 768 lanes with its zero experts
], ids=["896-top16", "1024-ssp", "1000-grouped", "longcat-768"])
def test_one_warp_on_wide_rows(config, keys, exact, monkeypatch):
    """The launcher puts a row of 1024 lanes on one warp (32 a thread) on the exact path's 32-bit rounds (EXACT32);
    fast or exact keys, the exact path forced or not, NaN / -inf rows, ties and dead lanes among the winners."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "approx_keys_override", keys == "fast")
    monkeypatch.setattr(kr, "force_exact_override", exact)
    seen = _spy_launches(monkeypatch)
    T, W = 6, config.num_scored
    logits = tie_free_logits(T, W, seed=5)
    logits[1, ::3] = float("nan")
    logits[2, 3:] = float("-inf")  # three live lanes, K > 3: dead ones win the rest, lowest id first
    logits[3] = 0.5  # all tied: ids 0..K-1 (or the groups' order)
    logits[4, 100:140] = logits[4].max() + 1.0  # a run of equal winners across threads
    run_both(logits, config, **extras(config, T))
    assert seen[0]["EXACT32"] and seen[0]["num_warps"] == 1 and seen[0]["BLOCK_W"] == 1024


@pytest.mark.parametrize("launch", [(1, 1), (2, 2)])
def test_exact32_rounds_route_like_the_64_bit_rounds(launch, monkeypatch):
    """_exact_rounds32 forced on narrower rows and on packed rows: the 64-bit rounds' winners, ranks and ties, also
    with dropped groups' lanes at the bottom (exclude), zeroed groups, K = E and rows of NaN or -inf."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", launch)
    monkeypatch.setattr(kr, "thread_rows_override", False)
    monkeypatch.setattr(kr, "split_rows_override", 0)
    monkeypatch.setattr(kr, "force_exact_override", True)
    seen = _spy_launches(monkeypatch)
    g = torch.Generator().manual_seed(8)
    for config in (
        RouterConfig(64, 6, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=3),
        RouterConfig(64, 6, scoring="sigmoid", n_group=8, topk_group=1, group_fill="zero"),
        RouterConfig(48, 5, scoring="sqrtsoftplus", n_group=4, topk_group=2, group_score="max"),
        RouterConfig(16, 16),  # K = E
        RouterConfig(60, 7, selection="logits", scoring="sigmoid"),
    ):
        E = config.num_scored
        logits = torch.randint(0, 4, (9, E), generator=g).float() / 4
        logits[1, ::3] = float("nan")
        logits[2] = float("-inf")
        logits[3, E // 2:] = float("nan")
        logits = logits.to(DEVICE)
        kw = extras(config, 9)
        got = {}
        for exact32 in (False, True):
            monkeypatch.setattr(kr, "exact32_override", exact32)
            got[exact32], _ = run_both(logits, config, **kw)
            assert seen[-1]["EXACT32"] is exact32 and seen[-1]["FORCE_EXACT"]
        assert_identical(got[True], got[False])


def test_ties_go_to_the_lower_id():
    """Many equal logits: ids must follow the reference's stable order exactly (lower id first)."""
    g = torch.Generator().manual_seed(3)
    E = 64 if not FULL else 256
    for config in (
        RouterConfig(E, 6),
        RouterConfig(E, 6, scoring="sigmoid", n_group=8, topk_group=3),
        RouterConfig(E, 6, scoring="sqrtsoftplus", n_group=4, topk_group=2, group_score="max", group_fill="zero"),
        RouterConfig(E, 6, selection="logits", scoring="sigmoid"),
    ):
        logits = torch.randint(0, 3, (37, E), generator=g).float().to(DEVICE)
        logits[0] = 1.0  # one row all equal: ids 0..K-1
        got, want = run_both(logits, config)
        if config.n_group == 1:
            assert got.ids[0].tolist() == list(range(6))


@pytest.mark.parametrize("selection,scoring", [("logits", "sigmoid"), ("logits", "softmax"), ("scores", "softmax"),
                                               ("scores", "sigmoid")])
def test_saturated_softcap(selection, scoring):
    """A saturating softcap. x / c = 20 and 30 cap to c * 1.0 exactly: those keys tie (lower id first). Selected on
    the logits, x / c = 8.887 caps to c * (1 - 2**-24), the float below, one ulp under them: the interpreter's tanh
    once rounded it to 1.0 too (from |x / c| ~ 8.7; tanh's float is 1 - 2**-24 up to ~9.01) and routed such rows
    otherwise. (On scores two keys an ulp apart may score alike: scores take only the exact ties.)"""
    g = torch.Generator().manual_seed(11)
    E, K, c = (64 if FULL else 16), 6, 1.5
    config = RouterConfig(E, K, selection=selection, scoring=scoring, softcap=c)
    below = 8.887 if selection == "logits" else 3.0
    levels = torch.tensor([20.0, 30.0, below, 0.25, -20.0]) * c
    logits = levels[torch.randint(0, len(levels), (37, E), generator=g)].to(DEVICE)
    logits[0] = levels[2]
    logits[0, E - 1] = levels[0]  # the last id above the rest: first
    logits[0, E - 2] = levels[1]  # ... tied with it, and a lower id: before it
    got, want = run_both(logits, config)
    assert got.ids[0].tolist() == [E - 2, E - 1] + list(range(K - 2))


def test_nan_and_neg_inf_rows():
    """NaN/-inf logits score 0, key -inf, below every real key; an all-NaN row gives weights 0."""
    g = torch.Generator().manual_seed(4)
    E = 48 if not FULL else 256
    for config in (
        RouterConfig(E, 4),
        RouterConfig(E, 4, scoring="sigmoid", has_correction_bias=True),
        RouterConfig(E, 4, scoring="sqrtsoftplus", n_group=4, topk_group=2),
        RouterConfig(E, 4, scoring="sigmoid", n_group=4, topk_group=2, group_fill="zero", softcap=5.0),
        RouterConfig(E, 4, selection="logits", renormalize=False),
        RouterConfig(E, 4, renorm_eps=0.0),  # 0 / 0 on the all-NaN row must give 0, not NaN
        RouterConfig(E, 4, scoring="sigmoid", renorm_eps=0.0, renorm_eps_mode="clamp", renorm_p=2.0),
        RouterConfig(E, 4, scoring="sigmoid", selection="logits", n_group=4, topk_group=1, group_fill="zero",
                     group_score="max", renorm_eps=0.0),  # dead experts of zeroed groups stay below
    ):
        logits = torch.rand(9, E, generator=g) * 4
        logits[1, ::3] = float("nan")
        logits[2, 5:] = float("-inf")  # fewer than K live experts in the row
        logits[3] = float("nan")
        logits[4] = float("-inf")
        logits[5, : E // 2] = float("nan")  # whole groups dead: exclude keeps them below kept ones
        logits = logits.to(DEVICE)
        got, _ = run_both(logits, config, **extras(config, 9))
        if config.softcap is None:
            assert (got.weights[3] == 0).all()
        assert (got.weights >= 0).all()


@pytest.mark.parametrize("T", [4, 37])
@pytest.mark.parametrize("scoring,renormalize", [("sqrtsoftplus", False), ("sqrtsoftplus", True),
                                                 ("softmax", True), ("softmax", False), ("sigmoid", False)])
@pytest.mark.parametrize("path", ["warps", "thread", "split"])
def test_exponentials_below_the_normal_range_are_zero(scoring, renormalize, T, path, monkeypatch):
    """Step 2's flush (docs/contract.md): exp results below 2**-126 are 0. Row 0 has three experts that score in
    fp32's normal range, three more whose exp is subnormal (distinct values before the rule: the higher ids the
    larger) and the rest lower still; top-8 takes the three, then the lowest ids among the flushed, with weight 0.
    On the GPU libdevice's flush-to-zero exp computes that; under the interpreter the kernel flushes numpy's
    subnormals itself. Sigmoid, whose tiny scores come from a division, keeps its subnormals (and so its order).
    T = 4 takes DeepSeek-V4's fast sqrt-softplus keys on the GPU (T <= 32), T = 37 the exact ones. The same rows
    one a thread (8 experts: the thread rows' exact path) and split over threads (their 64-bit exact path)."""
    import moegate.kernels.router as kr

    E, K = (256 if FULL else 16), 8
    if path == "thread":
        E, K = 8, 6
        monkeypatch.setattr(kr, "thread_rows_override", True)
    elif path == "split":  # at most 32 columns a thread
        E = 128 if FULL else 16
        monkeypatch.setattr(kr, "split_rows_override", 8 if FULL else 4)
    else:
        monkeypatch.setattr(kr, "thread_rows_override", False)
        monkeypatch.setattr(kr, "split_rows_override", 0)
    config = RouterConfig(E, K, scoring=scoring, renormalize=renormalize)
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(T, E, generator=g) * 2
    if scoring == "softmax":  # relative to the row max 0: e = exp(x)
        row = torch.full((E,), -100.0)
        row[E - 1], row[E - 2], row[E - 3] = 0.0, -80.0, -87.2
    elif scoring == "sqrtsoftplus":
        row = torch.full((E,), -100.0)
        row[E - 1], row[E - 2], row[E - 3] = -87.0, -87.1, -87.2
    else:  # sigmoid: 1 / (1 + exp(-x)), subnormal below x = -87.34 and 0 below -88.72
        row = torch.full((E,), -89.0)
        row[E - 1], row[E - 2], row[E - 3] = -87.0, -87.1, -87.2
    row[E - 6], row[E - 5], row[E - 4] = -88.5, -88.0, -87.5  # exp subnormal (softmax: 87.5-88.5 below the max)
    logits[0] = row
    logits[T - 1] = -100.0  # every exp flushed: ids 0..K-1
    logits = logits.to(DEVICE)
    got, want = run_both(logits, config)
    top = [E - 1, E - 2, E - 3]
    if scoring == "sigmoid":
        assert got.ids[0].tolist() == top + [E - 4, E - 5, E - 6, 0, 1][: K - 3]
        assert (got.weights[0, :6] > 0).all()
    else:
        assert got.ids[0].tolist() == top + list(range(K - 3))
        assert (got.weights[0, :3] > 0).all() and (got.weights[0, 3:] == 0).all()
        if scoring == "sqrtsoftplus":
            assert got.ids[T - 1].tolist() == list(range(K)) and (got.weights[T - 1] == 0).all()


def test_zero_experts_with_layouts_of_no_shared_column():
    """Zero experts with shared_slots='global' / 'per_rank' and no shared expert (no column: allowed since a review
    of 2026-12-04), scale='on_output' too: the kernel routes them as the reference does."""
    config = RouterConfig(16, 3, num_zero_experts=4, scoring="sigmoid", routed_scaling_factor=2.0)
    logits = tie_free_logits(37, 20)
    for layout in (ExpertLayout(shared_slots="global"), ExpertLayout(shared_slots="per_rank", scale="on_output")):
        got, _ = run_both(logits, config, layout)
        assert got.ids.shape == (37, 3) and bool((got.ids >= 16).any())  # zero experts among the winners


def test_exclude_never_selects_a_dropped_group_even_below_neg_inf():
    """Kept groups full of -inf still come before any expert of a dropped group (group_fill='exclude')."""
    E, G = 32, 4
    config = RouterConfig(E, 6, scoring="sigmoid", n_group=G, topk_group=2, group_score="max")
    logits = torch.full((3, E), float("-inf"))
    logits[:, 0] = 5.0  # group 0 kept on its one live expert
    logits[:, 8] = 4.0  # group 1 kept
    logits[:, 16:] = -20.0  # groups 2, 3 dropped despite many finite keys
    logits = logits.to(DEVICE)
    got, _ = run_both(logits, config)
    assert (got.ids < 16).all()


@pytest.mark.parametrize("keys", ["fma", "fast", "fast-row-sum"])
def test_dead_lanes_and_negative_raw_keys_send_rows_to_the_exact_path(keys, monkeypatch):
    """One row a program on FMA or fast keys marks no dead lane and takes the keys' raw bits (router_kernel's
    DEAD_BY_ROW and RAW_BITS): a row with a NaN, -inf or +inf logit, a row of negative keys only, and a row with a
    group whose top2_sum (or max) takes a negative key must go to the exact path (the fallback counter counts
    exactly those rows) and route like the reference; the rows of positive keys stay on the fast path. Fast keys
    find the dead lanes by their NaN keys (NAN_DEAD), and by the row's logit sum with nan_dead_override off."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "approx_keys_override", keys != "fma")
    monkeypatch.setattr(kr, "fma_keys_override", keys == "fma")
    monkeypatch.setattr(kr, "nan_dead_override", False if keys == "fast-row-sum" else None)
    T = 8
    for config, grouped in (
        (RouterConfig(64, 4, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4), True),
        (RouterConfig(64, 4, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=3,
                      group_score="max"), True),
        (RouterConfig(48, 4, scoring="sigmoid", has_correction_bias=True), False),  # 16 padding lanes
        (RouterConfig(64, 6, scoring="sqrtsoftplus", has_correction_bias=True), False),
    ):
        E = config.num_scored
        sigmoid = config.scoring == "sigmoid"
        # Keys s + b of both signs: logits >= 1 score above 0.73 (sigmoid) / 1.14 (sqrt-softplus), logits <= -3
        # below 0.05 / 0.22; the bias of -0.5 / -0.8 puts the first above 0.2 and the second below -0.4.
        bias = torch.full((E,), -0.5 if sigmoid else -0.8, device=DEVICE)
        logits = 1.0 + tie_free_logits(T, E, seed=E).abs().cpu() / 4
        logits[1, 3] = float("nan")
        logits[2, 10] = float("-inf")
        if sigmoid:
            logits[3, 20] = float("inf")  # scores 1.0 (sqrt-softplus's inf would make the weights NaN)
        logits[4] = -3.0 - logits[4]  # every key negative: the best is below the base's 2**23 ulps
        if grouped:
            logits[5, 8:16] = -3.0 - logits[5, 8:16]  # group 1: every key negative ...
            if config.group_score == "top2_sum":
                logits[5, 9] = 2.0  # ... but one, so its second key is negative
        redone = {1, 2, 4} | ({3} if sigmoid else set()) | ({5} if grouped else set())
        logits = logits.to(DEVICE)
        run_both(logits, config, bias=bias)
        _, (redo, repaired, n) = _counted(logits, config, bias=bias)
        assert (redo, repaired, n) == (len(redone), 0, T), (config, redo)


@pytest.mark.parametrize("split", [False, True], ids=["heuristic", "split-rows"])
def test_wide_key_ranges_take_the_exact_path(split, monkeypatch):
    """Rows the 32-bit fast path cannot order (keys of both signs or spread past the distance word, keys
    closer than the truncated word's resolution) must take the exact path and route like the reference:
    as the launcher picks the path, and with the ungrouped rows split over threads."""
    import moegate.kernels.router as kr

    E = 32 if not FULL else 256
    if split:
        monkeypatch.setattr(kr, "split_rows_override", E // 16)  # 16 columns a thread
    g = torch.Generator().manual_seed(7)
    order = torch.rand(37, E, generator=g).argsort(dim=1).float()
    for config, logits in (
        (RouterConfig(E, 6), order * 3.0),  # softmax: top-6 span e**-15, ~22 binades
        (RouterConfig(E, 6, selection="logits", scoring="sigmoid"), (order - E / 2) / 8),  # keys around 0
        # K past the positive keys: winners of both signs overflow the distance word.
        (RouterConfig(E, 12, selection="logits", scoring="sigmoid", renormalize=False), (order - (E - 8)) / 8),
        # Softmax keys 16-32 ulps apart: several share the truncated word's high bits.
        (RouterConfig(E, 6), order * 2.0 ** (-20 if not FULL else -19)),
        (RouterConfig(E, 6, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=2,
                      group_fill="zero"), (order - E / 2) / 8),
    ):
        kw = extras(config, 37)
        if "bias" in kw:
            kw["bias"] = kw["bias"] - 0.6  # negative keys: zero-filled groups compete at 0.0
        run_both(logits.to(DEVICE), config, near_ties=config.has_correction_bias, **kw)


def _spy_launches(monkeypatch):
    """Record the keyword arguments (constexprs, launch options) of every kernel launch from here on; the
    launches still run."""
    import moegate.kernels.router as kr

    seen = []
    monkeypatch.setattr(kr.rk, "_route_kernel", kr._LaunchRecorder(kr.rk._route_kernel, seen))
    return seen


@pytest.mark.parametrize("tile_weights", [False, True])
def test_weights_from_tile_and_from_gather(tile_weights, monkeypatch):
    """Both epilogues (weights read from the tile by the winning lanes, or recomputed from a gather of the
    winners' logits) route like the reference, whatever T the heuristic would pick them at. Two rows a program
    on two warps: one row a program never takes the tile's weights (until 2026-12-04 the GPU lane launched one
    row a program at T = 37 for every config, and the forced tile epilogue never ran there)."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "tile_weights_override", tile_weights)
    monkeypatch.setattr(kr, "launch_override", (2, 2))
    monkeypatch.setattr(kr, "thread_rows_override", False)
    monkeypatch.setattr(kr, "split_rows_override", 0)
    seen = _spy_launches(monkeypatch)
    layout = ExpertLayout(shared_slots="global", scale="on_output")
    took = 0
    for ci, (name, config, tol) in enumerate(CONFIGS):
        if config.num_zero_experts:
            continue
        T = 37 if FULL or ci % 2 else 5
        logits = tie_free_logits(T, config.num_scored, DTYPES[ci % len(DTYPES)], seed=ci)
        kw = extras(config, T, seed=ci)
        seen.clear()
        run_both(logits, config.replace(num_shared_experts=1), layout, tol=tol, near_ties=config.has_correction_bias,
                 num_valid_tokens=T - 2, **kw)
        # The tile holds no scores for logits selection, and p-norms take the gather's epilogue.
        able = config.selection == "scores" and not (config.renormalize and config.renorm_p != 1.0)
        assert [s["TILE_WEIGHTS"] for s in seen] == [tile_weights and able], name
        assert seen[0]["BLOCK_M"] == 2 and seen[0]["num_warps"] == 2, name
        took += seen[0]["TILE_WEIGHTS"]
    assert took >= (10 if tile_weights else 0) and (tile_weights or took == 0)


@pytest.mark.parametrize("min_lane_bits", [None, 6])
def test_wide_rows_near_ties_and_wide_ranges(min_lane_bits, monkeypatch):
    """Tiles from 1024 lanes (or from 64, forced) drop low bits of the distance word: keys a few ulps apart,
    equal keys and keys spread past the word's range must all take the exact path and route like the
    reference."""
    import moegate.kernels.router as kr

    if min_lane_bits is not None:
        monkeypatch.setattr(kr, "DIST_SHIFT_MIN_LANE_BITS", min_lane_bits)
    E = 300 if not FULL else 896
    K = 6 if not FULL else 16
    g = torch.Generator().manual_seed(11)
    order = torch.rand(37, E, generator=g).argsort(dim=1)
    one = torch.tensor(1.0)
    ulps = (one.view(torch.int32) + order.to(torch.int32)).view(torch.float32)  # 1.0 + k ulps, 1 ulp apart
    rows = [
        ulps,  # adjacent winners 1 ulp apart: equal shifted distance bits
        torch.where(order < E - 3, ulps, torch.tensor(4.0)),  # three equal winners (a real tie)
        (order.float() - E / 2) / 4,  # keys of both signs: past the word's 2**23 ulps
    ]
    for logits in rows:
        for config in (
            RouterConfig(E, K, selection="logits", scoring="sigmoid", renormalize=False),
            RouterConfig(E, K, selection="logits", scoring="sigmoid", renormalize=False, n_group=4, topk_group=2),
        ):
            if config.n_group > 1 and E % 4:
                continue
            run_both(logits.to(DEVICE), config)


def _near_tie_sigmoid_rows(T, E, seed):
    """Sigmoid logits whose keys sit within the fast keys' error of each other, and ordinary ones."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(T, E, generator=g).argsort(dim=1)
    one = torch.tensor(1.0)
    ulps = (one.view(torch.int32) + order.to(torch.int32)).view(torch.float32)  # keys ~0.06 ulp apart
    spread = order.float() / 16 - 1
    pairs = spread.clone()
    pairs[:, 1::2] = pairs[:, 0::2] + 2e-7  # neighbours a few ulps apart in key
    return torch.cat([ulps, spread, pairs, spread * 40])  # the last: |x| up to 40, keys saturate


_FAST_SIGMOID_CONFIGS = [
    ("bias", RouterConfig(64 if not FULL else 256, 8, scoring="sigmoid", has_correction_bias=True)),
    ("groups-exclude", RouterConfig(64 if not FULL else 256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8,
                                    topk_group=4)),
    ("groups-zero", RouterConfig(64 if not FULL else 256, 6, scoring="sigmoid", n_group=4, topk_group=2,
                                 group_fill="zero")),
    ("wide", RouterConfig(300 if not FULL else 896, 8, scoring="sigmoid", has_correction_bias=True)),
]


# The repair serves rows without groups only: grouped rows are redone whole (until 2026-12-04 they ran both ways,
# the same launch twice).
@pytest.mark.parametrize("config,repair", [
    pytest.param(c, r, id=f"{'repair' if r else 'redo'}-{n}")
    for n, c in _FAST_SIGMOID_CONFIGS for r in (True, False) if c.n_group == 1 or not r
])
def test_fast_sigmoid_keys_route_like_exact_keys(config, repair, monkeypatch):
    """One row a program selects on sigmoid keys from fast math and checks the margins between winners
    and groups: it must route exactly like the exact keys (every row forced down the exact path), also on
    keys closer than the fast keys' error; and both like the reference. Close rows are repaired (the K + 2
    best reordered on exact keys; rows without groups) or redone whole."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "approx_repair_override", repair)
    E = config.num_experts
    # One row a program on one warp (as the heuristic launches rows up to 1024 lanes; EXACT32 on 1024-lane tiles).
    monkeypatch.setattr(kr, "launch_override", (1, 1 if E <= 1024 else 4))
    logits = _near_tie_sigmoid_rows(9, E, seed=E).to(DEVICE)
    kw = extras(config, logits.shape[0])
    if "bias" in kw:
        kw["bias"] = torch.zeros_like(kw["bias"])
        kw["bias"][::3] = 1e-7  # keys shifted by about an ulp: near-ties across experts
    monkeypatch.setattr(kr, "approx_keys_override", True)
    seen = _spy_launches(monkeypatch)
    fast = route(logits, config, backend="triton", **kw)
    assert seen[0]["APPROX_KEYS"] and seen[0]["APPROX_REPAIR"] is repair
    monkeypatch.setattr(kr, "force_exact_override", True)
    exact = route(logits, config, backend="triton", **kw)
    torch.testing.assert_close(fast.ids, exact.ids, rtol=0, atol=0)
    torch.testing.assert_close(fast.weights, exact.weights, rtol=0, atol=0)
    # And on ordinary inputs, both like the reference (these near-ties are below what the reference and
    # the kernel's exact scores agree on: an ulp).
    logits = tie_free_logits(37, E, seed=1)
    kw = extras(config, 37)
    for force in (False, True):
        monkeypatch.setattr(kr, "force_exact_override", force)
        run_both(logits, config, near_ties=True, **kw)


def near_tied_group_logits(T, E, G, seed=5):
    """[T, E] sigmoid logits of G groups: groups 0-2 clearly kept, groups 3 and 4 (the fourth kept and the first
    dropped at topk_group 4) with top2_sum scores a few ulps apart, their experts far apart, the rest low."""
    GS = E // G
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(T, E, generator=g, dtype=torch.float64) - 3.0  # low keys everywhere
    for grp in range(3):
        x[:, grp * GS] = 3.0 - grp * 0.1
        x[:, grp * GS + 1] = 2.5 - grp * 0.1
    xa = 1.0 + 0.1 * torch.rand(T, generator=g, dtype=torch.float64)
    xb = 0.5 + 0.1 * torch.rand(T, generator=g, dtype=torch.float64)
    target = torch.sigmoid(xa) + torch.sigmoid(xb)
    xa2 = xa + 0.2
    xb2 = torch.logit(target - torch.sigmoid(xa2))
    x[:, 3 * GS], x[:, 3 * GS + 1], x[:, 4 * GS], x[:, 4 * GS + 1] = xa, xb, xa2, xb2
    logits = x.float()
    c = 4 * GS + 1
    logits[:, c] = (logits[:, c].view(torch.int32) + torch.arange(T, dtype=torch.int32) % 7 - 3).view(torch.float32)
    return logits.to(DEVICE)


def test_fast_sigmoid_keys_near_tied_groups(monkeypatch):
    """Groups 3 and 4 with top2_sum scores a few ulps apart, their experts far apart: only the group margin
    check can send these rows down the exact path."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    E, G = 64, 8
    config = RouterConfig(E, 8, scoring="sigmoid", n_group=G, topk_group=4, renormalize=False)
    logits = near_tied_group_logits(64, E, G)
    monkeypatch.setattr(kr, "approx_keys_override", True)
    fast = route(logits, config, backend="triton")
    monkeypatch.setattr(kr, "force_exact_override", True)
    exact = route(logits, config, backend="triton")
    torch.testing.assert_close(fast.ids, exact.ids, rtol=0, atol=0)


def _near_tie_sqrtsoftplus(E, seed):
    """(logits, biases) for sqrt-softplus + bias: scores within the fast keys' error of each other in every
    branch of _sqrtsoftplus_fast (the series below x = -3.4, lg2 above, x itself past 20), winners lifted
    out of the series by large biases, and biases that cancel large scores (|key| << the score)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(8, E, generator=g).argsort(dim=1)
    rows = []
    for base in (-60.0, -12.0, -4.0, -3.4, -1.0, 0.5, 4.0, 19.999, 25.0):
        b = torch.tensor(base, dtype=torch.float32).view(torch.int32)
        rows.append((b + order[:2].to(torch.int32) * (1 + order[:2] % 5).to(torch.int32)).view(torch.float32))
    rows.append(order.float() / 8 - E / 16)  # one spread, every branch
    rows.append((order.float() / E - 0.5) * 200)  # |x| up to 100
    logits = torch.cat(rows)
    zero = torch.zeros(E)
    tiny = torch.where(torch.arange(E) % 3 == 0, 1e-7, 0.0)  # keys shifted by about an ulp: cross-expert near-ties
    # Low logits lifted: an expert with x = -12 and bias 3 beats one with x = 2 and bias 0.
    lift = torch.where(torch.arange(E) % 2 == 0, 3.0, 0.0)
    cancel = -torch.rand(E, generator=g) * 5  # keys near 0 from scores up to ~4.5
    return logits, (zero, tiny, lift, cancel)


@triton.jit
def _ssp_keys_kernel(x_ptr, fast_ptr, exact_ptr, n, BLOCK: tl.constexpr, ACCURATE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(fast_ptr + offs, rk._sqrtsoftplus_fast(x, ACCURATE), mask=offs < n)
    tl.store(exact_ptr + offs, rk._score(x, 0.0, 1.0, 2, ACCURATE), mask=offs < n)


@pytest.mark.parametrize("E", [64, 256] if FULL else [64])
@pytest.mark.parametrize("repair", [True, False], ids=["repair", "redo"])
def test_fast_sqrtsoftplus_keys_route_like_exact_keys(E, repair, monkeypatch):
    """DeepSeek-V4's scoring: one row a program selects on sqrt-softplus keys from MUFU approximations and
    checks the margins; it must route exactly like the exact keys, on keys closer than the fast keys' error
    in every branch of the approximation and under biases that lift low scores or cancel high ones; close
    rows repaired or redone whole."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "approx_repair_override", repair)
    monkeypatch.setattr(kr, "launch_override", (1, 1))
    config = RouterConfig(E, 6, scoring="sqrtsoftplus", has_correction_bias=True)
    logits, biases = _near_tie_sqrtsoftplus(E, seed=E)
    logits = logits.to(DEVICE)
    for bias in biases:
        bias = bias.to(DEVICE)
        monkeypatch.setattr(kr, "force_exact_override", False)
        monkeypatch.setattr(kr, "approx_keys_override", True)
        fast = route(logits, config, backend="triton", bias=bias)
        monkeypatch.setattr(kr, "force_exact_override", True)
        exact = route(logits, config, backend="triton", bias=bias)
        torch.testing.assert_close(fast.ids, exact.ids, rtol=0, atol=0)
        torch.testing.assert_close(fast.weights, exact.weights, rtol=0, atol=0)
    monkeypatch.setattr(kr, "approx_keys_override", True)
    for force in (False, True):
        monkeypatch.setattr(kr, "force_exact_override", force)
        run_both(tie_free_logits(37, E, seed=3), config, near_ties=True, **extras(config, 37))
        run_both(tie_free_logits(37, E, seed=4) * 8 - 20, config, near_ties=True, **extras(config, 37))


@needs_cuda
@pytest.mark.parametrize("E,K,scoring,n_group", [(256, 6, "sqrtsoftplus", 1), (896, 16, "sigmoid", 1),
                                                 (256, 8, "sigmoid", 8), (384, 8, "sigmoid", 1)],
                         ids=["dsv4", "896-top16", "dsv3", "kimi-k2"])
@pytest.mark.parametrize("repair", [False, True], ids=["default", "repair"])
def test_fast_keys_at_large_T_match_reference(E, K, scoring, n_group, repair, monkeypatch):
    """DeepSeek-V4, 896 top-16, DeepSeek-V3 and Kimi-K2 as the launcher takes them (fast keys at T >= 8192 /
    8192 / 65536, under its register caps; exact keys in their FMA forms below) and with the repair switched on
    (fast keys at every T, close rows repaired below T = 16384; rows without groups), against the reference:
    tie-free rows, normal draws with a bias (some rows within the margin: repaired or redone), fp32 and bf16, the
    last rows padding. GPU only: the interpreter would take hours at these T."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "APPROX_REPAIR", repair)
    groups = {"n_group": n_group, "topk_group": 4} if n_group > 1 else {}
    config = RouterConfig(E, K, scoring=scoring, has_correction_bias=True, routed_scaling_factor=1.5, **groups)
    g = torch.Generator().manual_seed(6)
    bias = (torch.randn(E, generator=g) * 0.1).to(DEVICE)
    for T, dtype in ((1024, torch.float32), (4096, torch.bfloat16), (16384, torch.float32),
                     (32768, torch.bfloat16), (65536, torch.float32)):
        run_both(tie_free_logits(T, E, dtype, seed=T), config, bias=bias, num_valid_tokens=T - 5)
        drawn = torch.randn(T, E, generator=g).to(dtype).to(DEVICE)
        run_both(drawn, config, near_ties=True, bias=bias, num_valid_tokens=T - 5)


def _counted(logits, config, **kw):
    """(routing, (programs that redid their rows, programs that repaired a row, programs)) of one launch with
    the kernel's fallback counters on."""
    import moegate.kernels.router as kr

    stats = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    kr.count_fallbacks_into = stats
    try:
        got = route(logits, config, backend="triton", **kw)
    finally:
        kr.count_fallbacks_into = None
    return got, tuple(stats.tolist())


@pytest.mark.parametrize("path", ["one-row", "two-rows", "thread-rows", "split-rows"])
def test_fallback_counters(path, monkeypatch):
    """The diagnostic counters (the benchmark's --fallbacks): every program counted once; none redone on rows
    far from ties, every one with the exact path forced; counting changes no routing."""
    import moegate.kernels.router as kr

    E = 8 if path == "thread-rows" else 64
    config = RouterConfig(E, 4, renormalize=True) if path in ("thread-rows", "split-rows") else \
        RouterConfig(E, 4, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=2)
    if path == "two-rows":
        monkeypatch.setattr(kr, "launch_override", (2, 1))
    if path == "split-rows":
        monkeypatch.setattr(kr, "split_rows_override", 4)
    T = 37
    rows_per_program = {"one-row": 1, "two-rows": 2, "thread-rows": 32, "split-rows": 8}[path]
    programs = -(-T // rows_per_program)
    logits = tie_free_logits(T, E, seed=2)
    kw = extras(config, T)
    plain = route(logits, config, backend="triton", **kw)
    got, (redo, repaired, n) = _counted(logits, config, **kw)
    assert n == programs and repaired == 0 and redo == 0
    torch.testing.assert_close(got.ids, plain.ids, rtol=0, atol=0)
    torch.testing.assert_close(got.weights, plain.weights, rtol=0, atol=0)
    monkeypatch.setattr(kr, "force_exact_override", True)
    _, (redo, repaired, n) = _counted(logits, config, **kw)
    assert (redo, repaired, n) == (programs, 0, programs)


def test_fallback_counters_count_repairs(monkeypatch):
    """With the repair on, close sqrt-softplus rows are counted as repaired (and those the repair cannot keep
    as redone too); rows far apart as neither."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "approx_keys_override", True)
    monkeypatch.setattr(kr, "approx_repair_override", True)
    config = RouterConfig(64, 6, scoring="sqrtsoftplus", has_correction_bias=True)
    bias = torch.zeros(64, device=DEVICE)
    _, (redo, repaired, n) = _counted(tie_free_logits(20, 64, seed=5), config, bias=bias)
    assert (redo, repaired, n) == (0, 0, 20)
    close, _biases = _near_tie_sqrtsoftplus(64, seed=64)
    got, (redo, repaired, n) = _counted(close.to(DEVICE), config, bias=bias)
    assert n == close.shape[0] and repaired > 0 and redo <= n
    monkeypatch.setattr(kr, "force_exact_override", True)
    exact = route(close.to(DEVICE), config, backend="triton", bias=bias)
    torch.testing.assert_close(got.ids, exact.ids, rtol=0, atol=0)


def test_bench_prints_fallbacks(capsys, monkeypatch):
    """bench --fallbacks: each verified launch also prints its counters, from a launch with them on."""
    import moegate.bench as bench

    config = RouterConfig(64, 6, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    logits, bias = tie_free_logits(16, 64, seed=1), extras(config, 16)["bias"]
    fn = bench._Moegate(logits, config, bias, poisoned_out(16, 6))
    fn()
    monkeypatch.setattr(bench, "COUNT_FALLBACKS", True)
    assert fn.fallbacks() == (0, 0, 16)
    assert bench._verified(fn, "x") == 0
    assert "x: 0 of 16 programs redid their rows" in capsys.readouterr().out


# The MUFU approximations' worst errors as the error budgets beside KEY_ERR_* / SSP_KEY_ERR_* in router_kernel.py take
# them (PTX ISA): ex2.approx 2**-22.5 relative; rcp.approx 1 ulp; lg2.approx 2**-22 absolute on [0.5, 2], 2 ulp beyond;
# sqrt.approx 2**-22 relative.
_MUFU_ERR = {"ex2": 2.0 ** -22.5, "rcp": 2.0 ** -23, "lg2": 2.0 ** -22, "sqrt": 2.0 ** -22}


def _mufu(op, x32, sign):
    """op on fp32 x, computed in fp64, pushed by its worst error (sign +-1) and rounded to fp32; ex2 flushes
    subnormal results to 0 (.ftz)."""
    x = x32.double()
    if op == "ex2":
        y = torch.exp2(x) * (1 + sign * _MUFU_ERR[op])
        y = torch.where(y < 2.0 ** -126, torch.zeros_like(y), y)
    elif op == "rcp":
        y = (1 / x) * (1 + sign * _MUFU_ERR[op])
    elif op == "lg2":
        y = torch.log2(x)
        near_one = (x >= 0.5) & (x <= 2)
        y = torch.where(near_one, y + sign * _MUFU_ERR[op], y * (1 + sign * 2 * 2.0 ** -23))
    else:
        y = torch.sqrt(x) * (1 + sign * _MUFU_ERR[op])
    return y.float()


def test_fast_key_error_budgets_hold_the_mufu_worst_cases():
    """The fast keys' error bounds against the approximations' documented worst errors, on the CPU (where the
    kernels' "fast" keys run on exact primitives, so no other test reaches these bounds): _sigmoid_fast and
    _sqrtsoftplus_fast emulated op for op in fp32, every MUFU result pushed to either end of its error, against the
    exact keys as the reference computes them. The worst cases reach 0.23x (sigmoid) and 0.18x (sqrt-softplus) of
    the bounds (2026-12-06): a constant cut 5-fold fails here, and the check is not vacuous (each worst case above
    1/8 of its bound). The GPU test below checks the hardware's own results."""
    import itertools

    worst_seen = {"sigmoid": 0.0, "sqrtsoftplus": 0.0}

    x = torch.cat([torch.linspace(-110.0, 40.0, 1 << 16), torch.linspace(-4.0, -3.0, 1 << 12),
                   torch.linspace(19.9, 20.1, 1 << 10)])
    ln2, log2e = torch.tensor(0.6931471805599453), torch.tensor(1.4426950408889634)
    # sigmoid + bias: 1 / (1 + ex2(-x log2 e)) + b, against torch's fp32 sigmoid + b
    for b in (0.0, -0.75, 0.3, 2.0):
        exact = torch.sigmoid(x) + b
        bound = rk.KEY_ERR_ABS.value + exact.double().abs() * rk.KEY_ERR_REL.value
        for s_ex2, s_rcp in itertools.product((-1, 1), repeat=2):
            e = _mufu("ex2", x * -log2e.float(), s_ex2)
            fast = _mufu("rcp", 1.0 + e, s_rcp) + b
            worst = ((fast.double() - exact.double()).abs() / bound).max().item()
            assert worst <= 1.0, f"sigmoid key, bias {b}: {worst:.2f}x its bound ({s_ex2}, {s_rcp})"
            worst_seen["sigmoid"] = max(worst_seen["sigmoid"], worst)
    # sqrt-softplus: e = ex2(min(x, 20) log2 e); ln(1 + e) by lg2 or a three-term series below e = 2**-5; sqrt
    sp = torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20))))
    exact = torch.sqrt(sp)  # the reference's fp32 score
    bound = rk.SSP_KEY_ERR_ABS.value + exact.double() * rk.SSP_KEY_ERR_REL.value
    for s_ex2, s_lg2, s_sqrt in itertools.product((-1, 1), repeat=3):
        e = _mufu("ex2", torch.clamp(x, max=20.0) * log2e.float(), s_ex2)
        series = e * (1.0 + e * (-0.5 + e * torch.tensor(0.3333333432674408)))
        softplus = torch.where(e < 0.03125, series, _mufu("lg2", 1.0 + e, s_lg2) * ln2.float())
        fast = _mufu("sqrt", torch.maximum(softplus, x), s_sqrt)
        ratio = (fast.double() - exact.double()).abs() / bound
        worst = ratio.max().item()
        assert worst <= 1.0, (f"sqrt-softplus key: {worst:.2f}x its bound at x = {x[ratio.argmax()].item()} "
                              f"({s_ex2}, {s_lg2}, {s_sqrt})")
        worst_seen["sqrtsoftplus"] = max(worst_seen["sqrtsoftplus"], worst)
    assert min(worst_seen.values()) > 1 / 8, worst_seen


def test_fast_sqrtsoftplus_key_error_bound():
    """_sqrtsoftplus_fast against the exact score on a dense sweep of x: within SSP_KEY_ERR_ABS + s *
    SSP_KEY_ERR_REL, the bound its margin checks assume (on the GPU the MUFU approximations; under the
    interpreter the same series, branches and constants on exact primitives)."""
    n = (1 << 22) if FULL else (1 << 14)
    x = torch.cat([
        torch.linspace(-110.0, 40.0, n),  # every branch
        torch.linspace(-4.0, -3.0, n // 4),  # around the series / lg2 switch (e = 2**-5 at x = -3.47)
        torch.linspace(19.9, 20.1, n // 16),  # around the x > 20 switch
    ]).to(DEVICE)
    fast, exact = torch.empty_like(x), torch.empty_like(x)
    _ssp_keys_kernel[(triton.cdiv(x.numel(), 1024),)](x, fast, exact, x.numel(), BLOCK=1024, ACCURATE=not INTERPRET)
    # The exact score as the reference computes it, in float64, and the kernel's own exact score.
    x64 = x.double()
    true = torch.sqrt(torch.where(x64 > 20, x64, torch.log1p(torch.exp(x64.clamp(max=20)))))
    bound = rk.SSP_KEY_ERR_ABS.value + exact.double() * rk.SSP_KEY_ERR_REL.value
    err = (fast.double() - exact.double()).abs()
    worst = (err / bound).max().item()
    print(f"fast sqrt-softplus keys: worst error {worst:.3f}x the bound")
    assert worst <= 1.0, f"fast key error reaches {worst:.2f}x the bound at x = {x[(err / bound).argmax()].item()}"
    # (fp32 exp underflows below x = -87, and flushes to 0 on the GPU: scores under 1e-18 only absolutely close)
    assert ((exact.double() - true).abs() <= 4e-7 * true + 1e-18).all(), "the exact score itself is off"
    if FULL:  # the bound is not vacuous: the approximation's worst error is within a factor 16 of it
        assert worst > 1 / 16, f"fast key error at most {worst:.3f}x the bound: constants far too loose"


def _near_tie_softmax_rows(E, seed):
    """Softmax logits whose scores may round together: winners an ulp or a few apart, exact ties, -0.0
    next to +0.0, logits far below the row max, winners whose scores underflow, dead lanes (NaN, -inf)
    among the winners. Eight draws of each kind on the GPU, four under the interpreter."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(8 if FULL else 4, E, generator=g).argsort(dim=1)
    one = torch.tensor(1.0)
    ulps = (one.view(torch.int32) + order.to(torch.int32)).view(torch.float32)  # 1 ulp apart
    spread = order.float() / 16 - 1
    pairs = spread.clone()
    pairs[:, 1::2] = pairs[:, 0::2] - 3e-7  # a few ulps below the neighbour
    ties = torch.where(order % 4 == 0, 2.0, spread - 4)  # groups of equal winners
    zeros = torch.where(order < E // 2, -spread.abs() - 1, 0.0)
    zeros[:, 0::2] = torch.where(zeros[:, 0::2] == 0, -0.0, zeros[:, 0::2])  # -0.0 and +0.0 winners
    far = spread * 40  # past the 2**23-ulp word below the row max
    dead = spread.clone()
    dead[:, : E - 5] = float("-inf")  # five live lanes for K = 8
    dead[:, 3] = float("nan")
    big = (ulps - 1) * 2e4 + 1e4  # |x| ~ 1e4: the margin grows with |x|
    # Winners 20 apart near 1000 (one binade: the words do not clamp): from the sixth on, exp(x - m)
    # underflows to subnormals and 0, where the reference's scores tie and go by id.
    deep = 1000.0 - 20.0 * order.float()
    drop = torch.where(order == 0, 1000.0, 900.0 - 20.0 * order.float())  # every winner but the first deep
    # Winners k ulps apart (k = 1..E) at several magnitudes, so that the margin's edge falls inside.
    steps = []
    for base in (3e-3, 0.75, 6.0, -40.0, 300.0):
        b = torch.tensor(base, dtype=torch.float32).view(torch.int32)
        k = order[:2].to(torch.int32) * (1 + order[:2] % 7).to(torch.int32)
        steps.append((b + k).view(torch.float32))
    return torch.cat([ulps, spread, pairs, ties, zeros, far, dead, big, deep, drop, *steps, _equal_run_rows(E)])


def _equal_run_rows(E):
    """Runs of equal logits across the K-th winner with a lower-id logit a little below them whose score rounds to
    the same (exp(-2e-8) is 1.0 in fp32): the reference's scores tie, so the lower id wins. (A review found the
    logit keys' checks took equal neighbours for equal scores and missed the third, 2026-12-04.) For every K up to
    8: K + 1 copies of b at the top ids, b - 2e-8 at id 0 (or id 1, b at id 0); the same under 2**-30 (bf16)."""
    rows = []
    for b, gap in ((2.0**-10, 2e-8), (0.0, 2.0**-30), (-3.0, 1.5e-7)):
        for k in range(1, min(8, E - 2) + 1):
            for low in (0, 1):
                x = torch.full((E,), -5.0 + b)
                x[E - k - 1:] = b
                x[low] = b - gap
                if low:
                    x[0] = b
                rows.append(x)
    return torch.stack(rows)


def _run_rows_in_format(E, K, dtype):
    """Cases (label, near, rows) of one format (bf16, fp16): rows whose K-th logit b the first loser repeats, K - 1
    winners above, b at two ids, the rest below. Far from 0 (b = 1.0, 0.75, ... under winners 3.0, 2.5, ...; -1.5
    under winners near -0.5; a K-th logit of the other sign than the top lies too far below it for one row a
    program's words, its row always redone) no value of the format lies close below b, and the scores keep their
    order. Near 0 the next value down is close, and the rows place it at a lower id than b, where it scores like b
    or within rounding of it: b = 2**-17 under winners 2**-13 * (3.0, 2.5, ...); -2**-17; 0 over the smallest
    negative subnormal; the smallest subnormal over 0; +0.0 over -0.0. (Triton's interpreter loads bf16 subnormals
    as 0: on the CPU those bf16 rows are rows of zeros.)"""
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # the smallest subnormal
    small = 2.0 ** -17

    def down(v):  # the format's next value below v
        return float(torch.tensor(v, dtype=dtype).view(torch.int16).add(1 if v < 0 else -1).view(dtype))

    cases = [(f"far-{b}", False, b, None, 1.0, b - 1.0) for b in (1.0, 0.75, 0.25, 1.5, 2.0)]
    cases += [("far-negative", False, -1.5, None, -0.25, -2.5), ("near-2^-17", True, small, down(small), 2.0 ** -13,
              small / 4), ("near-minus-2^-17", True, -small, down(-small), 2.0 ** -13, -4 * small),
              ("near-zero", True, 0.0, -tiny, 1.0, -1.0), ("near-subnormal", True, tiny, 0.0, 1.0, -1.0),
              ("near-signed-zeros", True, 0.0, -0.0, 1.0, -1.0)]
    out = []
    for label, near, b, below, top, rest in cases:
        rows = []
        for lo in range(E - K - (below is not None)):
            x = torch.full((E,), rest - 0.0625 * abs(rest) * (lo % 3))
            x[E - K + 1:] = top * torch.tensor([3.0 - 0.5 * j for j in range(K - 1)])
            x[E - K] = b  # the first loser
            if below is None:
                x[lo] = b  # the K-th winner
            else:
                x[lo], x[lo + 1] = below, b  # the K-th winner is `below` (a tie by score) or b
            rows.append(x)
        out.append((label, near, torch.stack(rows).to(dtype)))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("path", ["one-row", "thread-rows", "split-rows"])
def test_logit_keys_equal_runs_in_bf16_and_fp16(path, dtype, monkeypatch):
    """The equal-run check on bf16 / fp16 logits (LOGIT_DROP): a K-th logit repeated by the first loser redoes the
    row only where the format has a value close below it (near 0), not everywhere as for fp32 logits (run 106: 5.9%
    of bf16 Qwen3 rows, 2x the time). Each case in its own launch (one program of one row a thread holds them all, so
    that no case's flag hides another's). Far rows: no program redone (every one with the check forced on every
    run), ids the reference's; near rows: every program redone, ids those of the exact path. (One row a program and
    split rows redo near-0 rows under winners near 1 for their clamped distances anyway: only one row a thread, which
    has no distance, shows the check alone there; a review found the x <= 0 branch untested before, 2026-12-04.)
    Each launch asserted to carry the format's LOGIT_DROP."""
    import moegate.kernels.router as kr

    E, K = {"one-row": (32, 4), "thread-rows": (8, 2), "split-rows": (32, 4)}[path]
    if path == "one-row":
        monkeypatch.setattr(kr, "launch_override", (1, 1))
    elif path == "thread-rows":
        monkeypatch.setattr(kr, "thread_rows_override", True)
    else:
        monkeypatch.setattr(kr, "split_rows_override", 4)
    config = RouterConfig(E, K, scoring="softmax", renormalize=True)
    seen = _spy_launches(monkeypatch)
    for label, near, logits in _run_rows_in_format(E, K, dtype):
        logits = logits.to(DEVICE)
        got, (redo, _, programs) = _counted(logits, config)
        assert seen[-1]["LOGIT_KEYS"] and seen[-1]["LOGIT_DROP"] == (16 if dtype == torch.bfloat16 else 13)
        assert redo == (programs if near else 0), (label, redo, programs)
        want = route(logits, config, backend="reference")
        # Near rows tie by score in the kernel's fp32 exp, or within an ulp (fp16's and -2**-17's gap of 2**-24),
        # where torch's exp may round the other way (as in every near-tie test): rows routed otherwise than the
        # reference must be such near-ties in fp64, and the kernel's exact path decides them.
        same = (got.ids == want.ids).all(dim=1)
        assert near or bool(same.all()), label
        _, key64 = scores_and_keys(logits, config, None, torch.float64)
        for r in (~same).nonzero().flatten().tolist():
            torch.testing.assert_close(key64[r, got.ids[r].long()], key64[r, want.ids[r].long()], rtol=1e-6, atol=0)
        torch.testing.assert_close(got.weights[same], want.weights[same], **TOLERANCES["default"])
        monkeypatch.setattr(kr, "force_exact_override", True)
        torch.testing.assert_close(got.ids, route(logits, config, backend="triton").ids, rtol=0, atol=0, msg=label)
        monkeypatch.setattr(kr, "force_exact_override", False)
        if not near:
            monkeypatch.setattr(kr, "logit_drop_override", False)
            every, (redo, _, programs) = _counted(logits, config)
            monkeypatch.setattr(kr, "logit_drop_override", None)
            assert seen[-1]["LOGIT_DROP"] == 0 and redo == programs, label
            torch.testing.assert_close(every.ids, want.ids, rtol=0, atol=0)


def test_truncated_logit_words_where_the_launcher_takes_them(monkeypatch):
    """TRUNC_LOGIT_WORDS: on by default (H100 run 134), off with the override; only truncated softmax words
    (softmax without renormalization or bias) of bf16 / fp16 logits with no scale or softcap, not with zero-filled
    groups, fp16 up to 4096 lanes (its shifted bits beside the lane bits in 31); never fp32."""
    import moegate.kernels.router as kr

    olmoe = RouterConfig(64, 8, scoring="softmax", renormalize=False)
    x = torch.empty(16, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(kr, "trunc_logit_words_override", False)
    off = _launch_kwargs(x, olmoe)
    assert off["TRUNCATE_WORDS"] and off["TRUNC_LOGIT_WORDS"] is False
    monkeypatch.setattr(kr, "trunc_logit_words_override", None)
    seen = _launch_kwargs(x, olmoe)
    assert seen["TRUNCATE_WORDS"] and seen["TRUNC_LOGIT_WORDS"] and seen["LOGIT_DROP"] == 16
    assert _launch_kwargs(x.half(), olmoe)["LOGIT_DROP"] == 13
    assert _launch_kwargs(x.float(), olmoe)["TRUNC_LOGIT_WORDS"] is False
    for cfg in (RouterConfig(64, 8, scoring="softmax", renormalize=False, logit_scale=2.0),
                RouterConfig(64, 8, scoring="softmax", renormalize=False, softcap=30.0),
                RouterConfig(64, 6, scoring="softmax", renormalize=False, n_group=8, topk_group=2,
                             group_score="max", group_fill="zero"),
                RouterConfig(64, 8, scoring="softmax", renormalize=True),  # logit keys instead
                RouterConfig(64, 8, scoring="sigmoid")):
        assert _launch_kwargs(x, cfg)["TRUNC_LOGIT_WORDS"] is False, cfg
    wide = RouterConfig(8192, 8, scoring="softmax", renormalize=False)
    assert _launch_kwargs(torch.empty(4, 8192, dtype=torch.bfloat16), wide)["TRUNC_LOGIT_WORDS"] is True
    assert _launch_kwargs(torch.empty(4, 8192, dtype=torch.float16), wide)["TRUNC_LOGIT_WORDS"] is False
    monkeypatch.setattr(kr, "logit_drop_override", False)
    assert _launch_kwargs(x, olmoe)["TRUNC_LOGIT_WORDS"] is False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("config", [RouterConfig(64, 8, scoring="softmax", renormalize=False),
                                    RouterConfig(60, 4, scoring="softmax", renormalize=False),
                                    RouterConfig(64, 6, scoring="softmax", renormalize=False, n_group=8,
                                                 topk_group=2, group_score="max", group_fill="exclude")],
                         ids=["64-top8", "60-top4", "64-groups-exclude"])
@pytest.mark.parametrize("launch", [(1, 1), (2, 1)], ids=["one-row", "two-rows"])
def test_truncated_softmax_on_logit_words(config, dtype, launch, monkeypatch):
    """Softmax without renormalization on bf16 / fp16 logits with TRUNC_LOGIT_WORDS: the words are the logits' own
    bits, so exact ties (equal logits, equal scores) stay on the fast path, ordered by id; near ties whose scores may
    round equal, a K-th logit repeated by the first loser near 0 (_run_rows_in_format's near rows), winners 75 below
    the max, dead lanes: flagged and redone. Ids the reference's and the forced exact path's; weights within 1e-6; on
    random rows far fewer programs redone than on the truncated score words (which flag every exact tie)."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", launch)
    seen = _spy_launches(monkeypatch)
    E, K = config.num_experts, config.top_k
    g = torch.Generator().manual_seed(E + K + launch[0])
    x = torch.randn(48, E, generator=g)
    x[0] = 0.0
    x[1, ::3] = float("-inf")
    x[2, 1::2] = float("nan")
    x[3] = torch.randint(-3, 4, (E,), generator=g) * 0.25  # ties everywhere
    x[4] = -0.0
    x[4, 5] = 2.0 ** -20
    x[5] = -200.0
    x[5, :3] = 0.0  # winners 200 below the max past the third
    x[6] = float("-inf")
    x[6, 7 : 7 + K + 2] = 1.5
    rows = [x.to(dtype)] + [r.to(dtype) for label, near, r in _run_rows_in_format(E, K, dtype) if near]
    logits = torch.cat(rows).to(DEVICE)
    want = route(logits, config, backend="reference")
    monkeypatch.setattr(kr, "force_exact_override", True)
    exact = route(logits, config, backend="triton")
    monkeypatch.setattr(kr, "force_exact_override", False)
    # The near rows tie by score in the kernel's fp32 exp or within an ulp, where torch's exp may round the other way
    # (as in test_logit_keys_equal_runs_in_bf16_and_fp16): there the kernel's exact path is the yardstick.
    torch.testing.assert_close(exact.ids[:48], want.ids[:48], rtol=0, atol=0)
    redo = {}
    for on in (True, False):
        monkeypatch.setattr(kr, "trunc_logit_words_override", on)
        got, (redo[on], _, programs) = _counted(logits, config)
        assert seen[-1]["TRUNCATE_WORDS"] and seen[-1]["TRUNC_LOGIT_WORDS"] is on
        assert seen[-1]["LOGIT_DROP"] == ((16 if dtype == torch.bfloat16 else 13) if on else 0)
        torch.testing.assert_close(got.ids, exact.ids, rtol=0, atol=0, msg=f"words of logits: {on}")
        same = (got.ids == want.ids).all(dim=1)
        assert bool(same[:48].all())
        torch.testing.assert_close(got.weights[same], want.weights[same], **TOLERANCES["default"])
    if dtype == torch.bfloat16:  # bf16 N(0, 1) rows tie often among the top K + 1; fp16 rarely
        assert redo[True] < redo[False], redo


def test_cached_rounds_where_the_launcher_takes_them(monkeypatch):
    """CACHE_DEPTH from _cache_depth (5 up to top-12; beyond, 7 below T = CACHE_DEEP_MAX_TOKENS = 16384 and 6 from
    it; none below CACHE_MIN_LANES = 512 lanes or CACHE_MIN_K) on one row a one-warp program only: never with several
    warps a row, rows a program, the kept groups' lanes or truncated softmax words; CACHE_VEC the lanes of the logits'
    16-byte loads (4 fp32, 8 bf16)."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "warp_rows_override", False)  # the router kernel's own choice (WARP_ROWS takes some)

    wide = RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True)
    # (config, depth at T = 1, 64 and 16383; depth at T = 16384 and 65536)
    for cfg, small, large in ((wide, 7, 6), (RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True), 7, 6),
                              (RouterConfig(512, 10, scoring="softmax", renormalize=True), 5, 5),
                              (RouterConfig(768, 12, scoring="softmax", renormalize=True), 5, 5),
                              (RouterConfig(768, 12, scoring="softmax", renormalize=False), 0, 0),  # truncated words
                              (RouterConfig(384, 8, scoring="sigmoid", has_correction_bias=True), 5, 5),
                              (RouterConfig(512, 4, scoring="softmax", renormalize=True), 0, 0),  # K < CACHE_MIN_K
                              (RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True), 0, 0)):  # < 512 lanes
        E = cfg.num_experts
        for T, depth in ((1, small), (64, small), (16383, small), (16384, large), (65536, large)):
            for dtype, vec in ((torch.float32, 4), (torch.bfloat16, 8)):
                seen = _launch_kwargs(torch.empty(T, E, dtype=dtype), cfg,
                                      **({"bias": torch.zeros(E)} if cfg.has_correction_bias else {}))
                assert seen["CACHE_DEPTH"] == depth and seen["CACHE_VEC"] == vec, (E, cfg.top_k, T, dtype)
    for override in ((1, 2), (2, 1)):  # several warps a row, several rows a program
        monkeypatch.setattr(kr, "launch_override", override)
        assert _launch_kwargs(torch.empty(64, 896), wide, bias=torch.zeros(896))["CACHE_DEPTH"] == 0, override
    monkeypatch.setattr(kr, "launch_override", None)
    monkeypatch.setattr(kr, "cache_rounds_override", 3)
    assert _launch_kwargs(torch.empty(64, 896), wide, bias=torch.zeros(896))["CACHE_DEPTH"] == 3
    monkeypatch.setattr(kr, "cache_rounds_override", 1)
    with pytest.raises(ValueError, match="cache_rounds_override"):
        _launch_kwargs(torch.empty(64, 896), wide, bias=torch.zeros(896))
    monkeypatch.setattr(kr, "cache_rounds_override", 3)
    plain = RouterConfig(512, 8, scoring="softmax", renormalize=False)  # truncated softmax words: no cache
    assert _launch_kwargs(torch.empty(64, 512), plain)["CACHE_DEPTH"] == 0


def test_logit_word_span_where_the_launcher_takes_it(monkeypatch):
    """fp32 logit keys' distance words span 2**LOGIT_SPAN_LOG2 binades at every width (DIST_SHIFT = lane bits - 8 +
    the span's log2, none below 0): two by default, one with logit_span_override 0 (the launcher before); bf16 logit
    keys take no shift (KEY_SHIFT); sigmoid keys keep their own rule; a span outside 0-2 is refused before launch."""
    import moegate.kernels.router as kr

    for span, shifts in ((None, {128: 0, 256: 1, 512: 2, 896: 3}), (0, {128: 0, 256: 0, 512: 1, 896: 2}),
                         (2, {128: 1, 256: 2, 512: 3, 896: 4})):
        monkeypatch.setattr(kr, "logit_span_override", span)
        for E, shift in shifts.items():
            config = RouterConfig(E, 8, scoring="softmax", renormalize=True)
            seen = _launch_kwargs(torch.empty(1, E), config)
            assert seen["LOGIT_KEYS"] and seen["DIST_SHIFT"] == shift, (span, E, seen["DIST_SHIFT"])
            assert _launch_kwargs(torch.empty(1, E, dtype=torch.bfloat16), config)["DIST_SHIFT"] == 0
        sig = RouterConfig(512, 8, scoring="sigmoid", has_correction_bias=True)  # Kimi-K2-like: exact distance
        assert _launch_kwargs(torch.empty(1, 512), sig, bias=torch.zeros(512))["DIST_SHIFT"] == 0
    monkeypatch.setattr(kr, "logit_span_override", 3)
    with pytest.raises(ValueError, match="logit_span_override"):
        _launch_kwargs(torch.empty(1, 512), RouterConfig(512, 8, scoring="softmax", renormalize=True))


@pytest.mark.parametrize("depth", [2, 4, 6, 7, 8])
@pytest.mark.parametrize("config", [RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True),
                                    RouterConfig(512, 10, scoring="softmax", renormalize=True),
                                    RouterConfig(384, 8, scoring="sqrtsoftplus", has_correction_bias=True),
                                    RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8,
                                                 topk_group=4)],
                         ids=["896-top16", "512-softmax-top10", "384-ssp-top8", "256-grouped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rounds_on_cached_group_words(config, depth, dtype, monkeypatch):
    """One row a program with CACHE_DEPTH: each of 32 lane groups' top words cached, the rounds on the groups'
    heads. Random rows route like the reference (ids exact, weights 1e-6); rows whose winners crowd one group
    (every lane 4g..4g+3 of each 128 raised) empty its cache before the last round and must take the exact path
    (counted: every such program redone) and still route like the reference. Poisoned outputs. bf16 logits: groups
    of 8 adjacent lanes a block of 256 (CACHE_VEC 8, a thread's own lanes there)."""
    import moegate.kernels.router as kr

    K = config.top_k
    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "cache_rounds_override", depth)
    monkeypatch.setattr(kr, "kept_only_override", False)
    seen = _spy_launches(monkeypatch)
    E = config.num_experts
    g = torch.Generator().manual_seed(E * 10 + depth)
    x = torch.randn(24, E, generator=g)
    crowded = list(range(12, 18))
    vec = 4 if dtype == torch.float32 else 8
    for r in crowded:
        lanes = [b * 32 * vec + vec * (r % 32) + v for b in range(-(-E // (32 * vec))) for v in range(vec)]
        x[r, [lane for lane in lanes if lane < E]] += 6.0
    x = x.to(dtype)
    bias = (torch.randn(E, generator=g) * 0.01).to(DEVICE) if config.has_correction_bias else None
    x = x.to(DEVICE)
    kw = {"bias": bias} if bias is not None else {}
    want = route(x, config, backend="reference", **kw)
    for rows in (list(range(12)), crowded):
        weights = torch.full((len(rows), config.top_k), float("nan"), device=DEVICE)
        ids = torch.full((len(rows), config.top_k), -7, dtype=torch.int32, device=DEVICE)
        got, (redo, _, programs) = _counted(x[rows], config, out=(weights, ids), **kw)
        assert seen[-1]["CACHE_DEPTH"] == depth and seen[-1]["CACHE_VEC"] == vec and seen[-1]["BLOCK_M"] == 1
        torch.testing.assert_close(ids, want.ids[rows], rtol=0, atol=0)
        torch.testing.assert_close(weights, want.weights[rows], **TOLERANCES["default"])
        launch = seen[-1]
        assert not launch["APPROX_REPAIR"]
        rounds = K + 1 if (launch["DIST_SHIFT"] or launch["APPROX_KEYS"] or launch["LOGIT_KEYS"]) else K
        if rows == crowded and rounds - 1 >= depth:  # the group's cache ran out (its lanes the winners it pops)
            assert redo == programs, (redo, programs)
        else:
            # Random rows (and crowded ones whose rounds pop fewer words than the cache holds): those where a group
            # holds `depth` of the words the rounds pop (all but the last round's) empty its cache and must redo;
            # beyond those, no more than the plain rounds redo (bf16 ties do).
            groups = (want.ids[rows, : rounds - 1].long() // vec) % 32
            emptied = sum(int(torch.bincount(g_row, minlength=32).max()) >= depth for g_row in groups.cpu())
            monkeypatch.setattr(kr, "cache_rounds_override", 0)
            _, (plain, _, _) = _counted(x[rows], config, **kw)
            monkeypatch.setattr(kr, "cache_rounds_override", depth)
            assert emptied <= redo <= plain + emptied, (redo, plain, emptied)


@pytest.mark.parametrize("config", [RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True),
                                    RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True)],
                         ids=["512-top22", "896-top16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pad", [0, 8], ids=["contiguous", "padded"])
def test_cache_smem_rounds_route_bit_for_bit_alike(config, dtype, pad, monkeypatch):
    """CACHE_SMEM (off by default; built without a GPU): the cached rounds with each group's cache in shared memory
    (one inline-PTX call a lane) route exactly as the registers' form: ids and weights bit for bit, the same programs
    redone, on random rows, rows whose winners crowd one group (its cache runs out and the row takes the exact path),
    rows with -inf and NaN lanes, at depths 6 and 7 and on the fast keys; contiguous rows and rows `pad` elements
    longer (a view of a wider buffer, 16-byte aligned: ROWS_16B gives them the layout the PTX assumes). The
    interpreter keeps the registers' form (PTX), so on the CPU this checks that the launch gets the flag and still
    routes like the reference; the asm's layout is checked offline by test_sass."""
    import moegate.kernels.router as kr

    E, K = config.num_experts, config.top_k
    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "kept_only_override", False)
    monkeypatch.setattr(kr, "scalar_checks_override", False)
    seen = _spy_launches(monkeypatch)
    g = torch.Generator().manual_seed(E + K)
    x = torch.randn(40, E, generator=g)
    vec = 4 if dtype == torch.float32 else 8
    for r in range(12, 18):  # every lane of group r % 32 raised: its cache runs out
        lanes = [b * 32 * vec + vec * (r % 32) + v for b in range(-(-E // (32 * vec))) for v in range(vec)]
        x[r, [lane for lane in lanes if lane < E]] += 6.0
    x[20, 5:300:7] = float("-inf")
    x[21, 17] = float("nan")
    x = torch.cat([x, torch.full((x.shape[0], pad), float("nan"))], dim=1).to(dtype).to(DEVICE)[:, :E]
    bias = (torch.randn(E, generator=g) * 0.01).to(DEVICE)
    want = route(x, config, backend="reference", bias=bias)
    for depth, approx in ((6, False), (7, False), (6, True)):
        monkeypatch.setattr(kr, "cache_rounds_override", depth)
        monkeypatch.setattr(kr, "approx_keys_override", approx)
        outs = {}
        for smem in (False, True):
            monkeypatch.setattr(kr, "cache_smem_override", smem)
            weights = torch.full((x.shape[0], K), float("nan"), device=DEVICE)
            ids = torch.full((x.shape[0], K), -7, dtype=torch.int32, device=DEVICE)
            _, counts = _counted(x, config, bias=bias, out=(weights, ids))
            launch = seen[-1]
            assert launch["CACHE_DEPTH"] == depth and launch["CACHE_SMEM"] is smem and launch["BLOCK_KC"] == 32
            assert launch["ROWS_16B"] and x.stride(0) == E + pad
            outs[smem] = (ids, weights, counts)
        torch.testing.assert_close(outs[True][0], want.ids, rtol=0, atol=0)
        torch.testing.assert_close(outs[True][1], want.weights, **TOLERANCES["default"])
        assert torch.equal(outs[True][0], outs[False][0]) and torch.equal(outs[True][1], outs[False][1])
        assert outs[True][2] == outs[False][2], (depth, approx, outs[True][2], outs[False][2])
        assert outs[True][2][0] >= 6, outs[True][2]  # the crowded rows at least went to the exact path


def test_cache_smem_where_it_applies(monkeypatch):
    """CACHE_SMEM reaches a launch by default from top-17 (CACHE_SMEM_MIN_K) and T = 16384 (CACHE_SMEM_MIN_TOKENS:
    H100 run 197 found it faster there only), always with the cached rounds on 32 word columns (one row a one-warp
    program) and without the rounds' scalar checks; cache_smem_override forces it off or on there only."""
    import moegate.kernels.router as kr

    sig = dict(scoring="sigmoid", has_correction_bias=True)
    assert kr.CACHE_SMEM is True
    for E, K, T, want in ((512, 22, 65536, True), (512, 22, 16384, True), (512, 17, 32768, True),
                          (512, 22, 4096, False), (896, 16, 65536, False), (512, 10, 65536, False),
                          (256, 8, 65536, False), (512, 22, 1, False)):
        seen = _launch_kwargs(torch.empty(T, E), RouterConfig(E, K, **sig), bias=torch.zeros(E))
        assert seen["CACHE_SMEM"] is want, (E, K, T, seen["CACHE_SMEM"], seen["CACHE_DEPTH"], seen["SCALAR_CHECKS"])
        assert not want or (seen["CACHE_DEPTH"] > 0 and seen["BLOCK_KC"] == 32 and not seen["SCALAR_CHECKS"])
    monkeypatch.setattr(kr, "cache_smem_override", True)  # forced: wherever the rounds and the layout allow
    for E, K, T, want in ((896, 16, 4096, True), (512, 22, 4096, True), (512, 10, 65536, False), (512, 22, 1, False)):
        seen = _launch_kwargs(torch.empty(T, E), RouterConfig(E, K, **sig), bias=torch.zeros(E))
        assert seen["CACHE_SMEM"] is want, (E, K, T, seen["CACHE_SMEM"])
    monkeypatch.setattr(kr, "cache_smem_override", None)
    # Its PTX takes a group a lane, the layout of 16-byte loads of contiguous, 16-byte aligned rows (ROWS_16B, which
    # the kernel states to the compiler: padded rows 520 elements apart take it too); strided or misaligned logits
    # keep the registers' rounds (test_sass.py checks the layouts).
    c512, b512 = RouterConfig(512, 22, **sig), torch.zeros(512)
    for x, aligned in ((torch.empty(65536, 1024)[:, ::2], False), (torch.empty(65536, 520)[:, :512], True),
                       (torch.empty(65536, 514)[:, :512], False),
                       (torch.empty(65536 * 512 + 1)[1:].view(65536, 512), False),
                       (torch.empty(512, 65536).t(), False)):
        seen = _launch_kwargs(x, c512, bias=b512)
        assert seen["CACHE_DEPTH"] > 0 and seen["CACHE_SMEM"] is seen["ROWS_16B"] is aligned, (x.stride(),
                                                                                              x.data_ptr() % 16)
    monkeypatch.setattr(kr, "cache_smem_override", False)
    assert _launch_kwargs(torch.empty(65536, 512), RouterConfig(512, 22, **sig), bias=torch.zeros(512))[
        "CACHE_SMEM"] is False
    monkeypatch.setattr(kr, "CACHE_SMEM", False)
    monkeypatch.setattr(kr, "cache_smem_override", True)
    assert _launch_kwargs(torch.empty(65536, 512), RouterConfig(512, 22, **sig), bias=torch.zeros(512))[
        "CACHE_SMEM"] is True
    assert _launch_kwargs(torch.empty(65536, 256), RouterConfig(256, 8, **sig), bias=torch.zeros(256))[
        "CACHE_SMEM"] is False


def test_shift_words_where_the_launcher_takes_them(monkeypatch):
    """SHIFT_WORDS on one row a program beyond top-16 (SHIFT_WORDS_MIN_K), at every T; off up to top-16 and on
    launches of several rows a program; shift_words_override forces it either way on one row a program only."""
    import moegate.kernels.router as kr

    sig = dict(scoring="sigmoid", has_correction_bias=True)
    for E, K, want in ((512, 22, True), (512, 17, True), (896, 16, False), (256, 8, False), (384, 32, True)):
        config = RouterConfig(E, K, **sig)
        for T in (1, 64, 4096, 65536):
            seen = _launch_kwargs(torch.empty(T, E), config, bias=torch.zeros(E))
            assert seen["BLOCK_M"] == 1 and seen["SHIFT_WORDS"] is want, (E, K, T, seen["SHIFT_WORDS"])
    monkeypatch.setattr(kr, "launch_override", (2, 2))
    assert _launch_kwargs(torch.empty(64, 512), RouterConfig(512, 22, **sig), bias=torch.zeros(512))[
        "SHIFT_WORDS"] is False
    monkeypatch.setattr(kr, "shift_words_override", True)
    assert _launch_kwargs(torch.empty(64, 512), RouterConfig(512, 22, **sig), bias=torch.zeros(512))[
        "SHIFT_WORDS"] is False
    monkeypatch.setattr(kr, "launch_override", None)
    assert _launch_kwargs(torch.empty(64, 256), RouterConfig(256, 8, **sig), bias=torch.zeros(256))["SHIFT_WORDS"]
    monkeypatch.setattr(kr, "shift_words_override", False)
    assert not _launch_kwargs(torch.empty(64, 512), RouterConfig(512, 22, **sig), bias=torch.zeros(512))[
        "SHIFT_WORDS"]


@pytest.mark.parametrize("case", ["grouped", "512-top22", "logit-keys", "K=E", "repair", "vector-checks"])
def test_shifted_round_words_route_like_selected(case, monkeypatch):
    """One row a program keeps round i's word at column i: selected into it (a compare a round) or, with SHIFT_WORDS,
    shifted a column a round and reversed after the rounds. Both ways on the launches that read those columns (the
    words' checks, the (K + 1)-th and repair rounds, the ids, every column at K = E): ids the reference's, weights
    within 1e-6 into poisoned outputs, the same rows redone on the exact path both ways (the checks read the columns
    too), and the constexpr as forced. Rows 0-4 tie-free; rows 5-8 hold exact ties across the top K (lower id wins)."""
    import moegate.kernels.router as kr

    kw_launch = {"launch_override": (1, 1), "split_rows_override": 0, "thread_rows_override": False}
    if case == "grouped":
        config = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    elif case == "512-top22":
        config = RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True)
    elif case == "logit-keys":
        config = RouterConfig(128, 8, scoring="softmax", renormalize=True)
    elif case == "K=E":
        config = RouterConfig(32, 32, scoring="sigmoid", renormalize=True)
    elif case == "repair":
        config = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True)
        kw_launch.update(approx_keys_override=True, approx_repair_override=True)
    else:
        config = RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True)
        kw_launch.update(scalar_checks_override=False)
    for name, value in kw_launch.items():
        monkeypatch.setattr(kr, name, value)
    seen = _spy_launches(monkeypatch)
    E, K = config.num_experts, config.top_k
    x = tie_free_logits(9, E, seed=E + K)
    g = torch.Generator().manual_seed(K)
    for r in range(5, 9):  # a run of equal logits over lanes spread across the row, from the top down
        lanes = torch.randperm(E, generator=g)[: min(E, K + 2)]
        x[r, lanes] = x[r].max() + 1.0
    x = x.to(DEVICE)
    kw = extras(config, 9, seed=K)
    want = route(x, config, backend="reference", **kw)
    counts = {}
    for shift in (False, True):
        monkeypatch.setattr(kr, "shift_words_override", shift)
        out = poisoned_out(9, K)
        got, counts[shift] = _counted(x, config, out=out, **kw)
        assert seen[-1]["SHIFT_WORDS"] is shift and seen[-1]["BLOCK_M"] == 1
        assert got.ids is out[1]
        torch.testing.assert_close(got.ids, want.ids, rtol=0, atol=0)
        torch.testing.assert_close(got.weights, want.weights, **TOLERANCES["default"])
    assert counts[True] == counts[False], counts
    if case == "repair":
        assert seen[-1]["APPROX_REPAIR"]
    if case == "vector-checks":
        assert not seen[-1]["SCALAR_CHECKS"]


@pytest.mark.parametrize("E,K", [(256, 8), (512, 10), (512, 16), (896, 16)],
                         ids=["256-top8", "512-top10", "512-top16", "896-top16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_logit_keys_of_one_row_a_program_span_wide_logits(E, K, dtype, monkeypatch):
    """One row a program on logit keys keeps wide rows on its fast path: bf16 / fp16 logits in words of their bits
    shifted right by LOGIT_DROP (KEY_SHIFT: every value of the format kept exactly, no clamped distance), fp32 logits
    in distance words that span two binades below the best (LOGIT_SPAN_LOG2: DIST_SHIFT 1 at 256 lanes, 2 at 512, 3 at
    1024). Logits of std 3 put the K-th winner past the unshifted words' span in ~40% of rows at 512 lanes, all of
    which the exact path took before (Qwen3-Next, fp32 N(0, 1): 29 of 64); half of the rows here hold their K-th
    winner between a quarter and half of the best (one binade of span sent every such row to the exact path: 2.6% of
    N(0, 1) rows at 256 lanes top-8, 1% at 512 top-10). Ids the reference's; weights within 1e-6. Then rows of few
    values (exact ties everywhere, equal words), -inf, NaN, signed zeros and negative winners across binades: ids the
    reference's and the exact path's, bit for bit."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    config = RouterConfig(E, K, scoring="softmax", renormalize=True)
    seen = _spy_launches(monkeypatch)
    g = torch.Generator().manual_seed(E + K)
    logits = torch.randn(24, E, generator=g) * 3.0
    # Rows 0, 2, ...: the best logit 6, the other K - 1 winners (and the next lane) in (1.6, 2.9): a quarter to half
    logits[::2] = logits[::2].clamp(max=1.5)
    lanes = torch.randperm(E, generator=g)[:K + 1]
    logits[::2, lanes[0]] = 6.0
    logits[::2, lanes[1:]] = 1.6 + 1.3 * torch.rand(12, K, generator=g)
    logits = logits.to(dtype).to(DEVICE)
    got, (redo, _, programs) = _counted(logits, config)
    launch = seen[-1]
    assert launch["LOGIT_KEYS"] and programs == 24
    # fp32: two binades of distance; bf16 / fp16 words of the format's own bits at every width
    assert launch["DIST_SHIFT"] == ({256: 1, 512: 2, 896: 3}[E] if dtype == torch.float32 else 0), launch["DIST_SHIFT"]
    assert launch["LOGIT_DROP"] == {torch.float32: 0, torch.bfloat16: 16, torch.float16: 13}[dtype]
    assert redo <= 2, redo  # (winners closer than the scores' rounding, ~1.5% of fp32 rows, redo their rows)
    want = route(logits, config, backend="reference")
    torch.testing.assert_close(got.ids, want.ids, rtol=0, atol=0)
    torch.testing.assert_close(got.weights, want.weights, **TOLERANCES["default"])
    if dtype == torch.float32:  # one binade of span (as before): the rows of a quarter to half all redone
        monkeypatch.setattr(kr, "logit_span_override", 0)
        got, (redo, _, _) = _counted(logits, config)
        assert seen[-1]["DIST_SHIFT"] == {256: 0, 512: 1, 896: 2}[E] and redo >= 12, redo
        torch.testing.assert_close(got.ids, want.ids, rtol=0, atol=0)
        monkeypatch.setattr(kr, "logit_span_override", None)

    ties = (torch.randint(-6, 7, (32, E), generator=g).to(torch.float32) * 0.5).to(dtype)
    ties[0, :] = 0.0
    ties[1, ::2] = -0.0  # signed zeros: equal logits, ties by id
    ties[2, : E // 2] = float("-inf")
    ties[3, 1::3] = float("nan")
    ties[4, :] = float("-inf")
    ties[4, 5 : 5 + K] = -3.0
    # Negative winners across binades (a wrong low part of their words would not cancel in the renormalization)
    ties[5, :] = -8.0
    ties[5, 3 : 3 + 7 * (K + 1) : 7] = (-0.3 * 1.6 ** torch.arange(K + 1.0)).to(dtype)
    ties = ties.to(DEVICE)
    got = route(ties, config, backend="triton")
    want = route(ties, config, backend="reference")
    torch.testing.assert_close(got.ids, want.ids, rtol=0, atol=0)
    torch.testing.assert_close(got.weights, want.weights, **TOLERANCES["default"])
    monkeypatch.setattr(kr, "force_exact_override", True)
    torch.testing.assert_close(got.ids, route(ties, config, backend="triton").ids, rtol=0, atol=0)


@pytest.mark.parametrize("E,K,split,pair", [(None, 1, 0, False), (None, 8, 0, False), (8, 2, 0, False),
                                            (8, 8, 0, False), (None, 8, 4, False), (8, 8, 2, False),
                                            (None, 8, 4, True), (8, 8, 2, True), (None, 1, 4, True)],
                         ids=["warp-top1", "warp-top8", "thread-top2", "thread-top8-of-8", "split-top8",
                              "split-top8-of-8", "split-top8-pairs", "split-top8-of-8-pairs", "split-top1-pairs"])
def test_softmax_logit_keys_route_like_exact_scores(E, K, split, pair, monkeypatch):
    """Renormalized softmax selects on the logits and checks the margins between winners: it must route
    exactly like the exact scores (every row forced down the exact path), also where rounding makes scores
    tie; and both like the reference on ordinary inputs. One row a warp (E None: 128 or 64 experts), one
    row a thread (8 experts, K < E and K = E) and rows split over 4 (8 on the GPU) or 2 threads, their close rows
    redone on the 64-bit rounds or (pairs) settled on exact scores first."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "split_pair_exact_override", pair)
    if split:
        if E is None:
            E, split = (128 if FULL else 32), _gpu_split(split)
        monkeypatch.setattr(kr, "split_rows_override", split)
    elif E is None:
        E = 128 if FULL else 64
        monkeypatch.setattr(kr, "launch_override", (1, 1))
    else:
        monkeypatch.setattr(kr, "thread_rows_override", True)
    config = RouterConfig(E, K, scoring="softmax", renormalize=True)
    logits = _near_tie_softmax_rows(E, seed=K).to(DEVICE)
    fast = route(logits, config, backend="triton")
    if split:
        # A program reselects all its rows when one is close: so that no row's check hides behind a
        # neighbour's, route every row again in a program of two (16 threads a row, one warp) whose other
        # row is never close (logits 1/E apart inside one binade), all in one launch, against the same
        # launch on the exact path. (Not against `fast`: 16 threads sum a row in another order than 4 or 2,
        # and some of these rows' scores tie or not by that last ulp.)
        easy = (1.0 + torch.arange(E, dtype=torch.float32, device=DEVICE) / E).to(logits.dtype)
        paired = torch.stack([logits, easy.expand_as(logits)], dim=1).reshape(-1, E)
        monkeypatch.setattr(kr, "split_rows_override", 16)
        monkeypatch.setattr(kr, "launch_override", (2, 1))
        alone = route(paired, config, backend="triton").ids
        monkeypatch.setattr(kr, "force_exact_override", True)
        torch.testing.assert_close(alone, route(paired, config, backend="triton").ids, rtol=0, atol=0)
        monkeypatch.setattr(kr, "force_exact_override", False)
        monkeypatch.setattr(kr, "split_rows_override", split)
        monkeypatch.setattr(kr, "launch_override", None)
    elif kr._use_thread_rows(config):
        # A program of 32 rows reselects all of them when one is close: route each row alone too, so that
        # no row's check hides behind a neighbour's.
        alone = [route(logits[r : r + 1], config, backend="triton") for r in range(logits.shape[0])]
        torch.testing.assert_close(torch.cat([a.ids for a in alone]), fast.ids, rtol=0, atol=0)
    monkeypatch.setattr(kr, "force_exact_override", True)
    exact = route(logits, config, backend="triton")
    monkeypatch.setattr(kr, "logit_keys_override", False)
    scored = route(logits, config, backend="triton")  # exact scores selected from the start
    torch.testing.assert_close(fast.ids, exact.ids, rtol=0, atol=0)
    torch.testing.assert_close(fast.ids, scored.ids, rtol=0, atol=0)
    # Weights exp(x - m) / sum against (exp(x - m) / S) / sum: a few ulps apart.
    torch.testing.assert_close(fast.weights, scored.weights, **TOLERANCES["default"])
    ref_weights = route_reference(logits, config)[0]
    torch.testing.assert_close(fast.weights.sum(-1), ref_weights.sum(-1), **TOLERANCES["default"])
    monkeypatch.setattr(kr, "logit_keys_override", None)
    for force in (False, True):
        monkeypatch.setattr(kr, "force_exact_override", force)
        run_both(tie_free_logits(37, E, seed=3), config)


def _check_cases():
    """(name, config, logits, kwargs, fast keys?, DIST_SHIFT_MIN_LANE_BITS or None) for one row a program: every
    check of the round words (decreasing winners, fewer allowed lanes than K, the clamp, shifted-distance ties, the
    fast keys' and logit keys' margins, the group margin) and every row flag (FMA band, dead lanes, raw bits)."""
    E = 64
    cases = []
    sig = _near_tie_sigmoid_rows(3, E, seed=3)
    dead = tie_free_logits(6, E, seed=4).cpu()
    dead[0, 5], dead[1, 9], dead[2, 17], dead[3] = float("nan"), float("-inf"), float("inf"), -90.0 - dead[3]
    dead[4, :60] = float("-inf")  # four live lanes for K = 8
    for keys in ("fma", "fast"):
        for config in (RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4),
                       RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True),
                       RouterConfig(E, 6, scoring="sigmoid", n_group=4, topk_group=2, group_fill="zero"),
                       RouterConfig(E, 1, scoring="sigmoid", has_correction_bias=True)):  # FMA keys: K rounds, K = 1
            bias = torch.zeros(E)
            bias[::3] = 1e-7
            for rows in (sig, dead):
                cases.append((f"sigmoid-{keys}", config, rows, {"bias": bias} if config.has_correction_bias else {},
                              keys == "fast", None))
    ssp, (_zero, tiny, lift, cancel) = _near_tie_sqrtsoftplus(E, seed=5)
    for keys in ("fma", "fast"):
        for bias in (tiny, lift, cancel):
            cases.append((f"ssp-{keys}", RouterConfig(E, 6, scoring="sqrtsoftplus", has_correction_bias=True),
                          ssp, {"bias": bias}, keys == "fast", None))
    soft = _near_tie_softmax_rows(E, seed=6)
    cases.append(("logit-keys", RouterConfig(E, 8), soft, {}, False, None))
    cases.append(("softmax-bias", RouterConfig(E, 8, has_correction_bias=True), soft.nan_to_num(0.0, 9.0, -9.0),
                  {"bias": torch.zeros(E)}, False, None))
    for W, shift in ((E, None), (300, 6)):
        # Exact distance words (the clamp), and shifted ones (DIST_SHIFT from 64 lanes: 512 lanes drop a bit).
        g = torch.Generator().manual_seed(8)
        order = torch.rand(8, W, generator=g).argsort(dim=1)
        ulps = (torch.tensor(1.0).view(torch.int32) + order.to(torch.int32)).view(torch.float32)
        for logits in (ulps, torch.where(order < W - 3, ulps, torch.tensor(4.0)), (order.float() - W / 2) / 4):
            cases.append((f"logits-selection-{W}", RouterConfig(W, 6, selection="logits", scoring="sigmoid",
                                                                renormalize=False), logits, {}, False, shift))
    return cases


@pytest.mark.parametrize("case", range(len(_check_cases())))
def test_scalar_and_vector_checks_agree(case, monkeypatch):
    """One row a program checks its round words either on each round's scalar as it comes (SCALAR_CHECKS, the
    launcher's choice at small T) or on their vector after the rounds: both must send exactly the same rows down
    the exact path (the fallback counter) and route bit for bit alike, on rows built to hit every check; and like
    every row forced down the exact path (these rows sit closer than the reference and the kernel's exact scores
    agree on)."""
    import moegate.kernels.router as kr

    name, config, logits, kw, fast, shift = _check_cases()[case]
    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "approx_keys_override", fast)
    monkeypatch.setattr(kr, "fma_keys_override", not fast)
    if shift is not None:
        monkeypatch.setattr(kr, "DIST_SHIFT_MIN_LANE_BITS", shift)
    logits = logits.to(DEVICE)
    kw = {k: v.to(DEVICE) for k, v in kw.items()}
    runs = {}
    for scalar in (True, False):
        monkeypatch.setattr(kr, "scalar_checks_override", scalar)
        runs[scalar] = _counted(logits, config, **kw)
    (a, stats_a), (b, stats_b) = runs[True], runs[False]
    assert stats_a == stats_b and stats_a[2] == logits.shape[0], (name, stats_a, stats_b)
    assert_identical(a, b)
    monkeypatch.setattr(kr, "force_exact_override", True)  # every row on exact keys and 64-bit words
    assert_identical(a, route(logits, config, backend="triton", **kw))


def _launch_kwargs(x, config, **kw):
    """The constexprs route_triton would launch the router kernel with (nothing runs)."""
    import moegate.kernels.router as kr

    seen = {}

    class Capture:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.update(kwargs)
            return launch

    kernel, warp_rows = kr.rk._route_kernel, kr.warp_rows_override
    kr.rk._route_kernel = Capture()
    kr.warp_rows_override = False  # the router kernel's launch (tests/test_warp_rows.py covers the other kernel's)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # route_triton takes CPU tensors
    try:
        kr._route_triton(x, config, ExpertLayout(), **kw)  # the launch as route() makes it (placeholder inputs)
    finally:
        kr.rk._route_kernel = kernel
        kr.warp_rows_override = warp_rows
        if old is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = old
    return seen


@pytest.mark.parametrize("T", [1, 16, 4096, 8192, 16384, 32768, 65536])
def test_fast_sigmoid_keys_where_the_launcher_takes_them(T, monkeypatch):
    """Fast sigmoid keys once a launch holds 2**24 lanes (APPROX_KEYS_MIN_LANE_ROWS): 1024-lane tiles at one row or
    T >= 16384, close rows redone whole; with the repair switched on (APPROX_REPAIR) at every T without groups, close
    rows repaired below T = 16384, and with groups as before. 512- and 256-lane tiles with exact distance words
    (Kimi-K2, DeepSeek-V3) from T = 32768 and 65536, under a cap of 64 registers; never 512 lanes top-22 (shifted
    words: its own cap of 64 from T = 16384), 64 lanes, or bf16 logits without a bias."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "warp_rows_override", False)  # the router kernel's own choice (WARP_ROWS takes some)

    config = RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True)
    grouped = RouterConfig(1024, 16, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    for repair in (False, True):
        monkeypatch.setattr(kr, "APPROX_REPAIR", repair)
        seen = _launch_kwargs(torch.empty(T, 896), config, bias=torch.zeros(896))
        assert seen["APPROX_KEYS"] is (repair or T == 1 or T >= 16384)
        assert seen["APPROX_REPAIR"] is (repair and T < 16384) and seen["BLOCK_KC"] >= 16 + 2
        seen = _launch_kwargs(torch.empty(T, 1024), grouped, bias=torch.zeros(1024))
        assert seen["APPROX_KEYS"] is (T == 1 or T >= 16384) and seen["APPROX_REPAIR"] is False
    monkeypatch.setattr(kr, "APPROX_REPAIR", False)
    large = T >= 65536
    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    for cfg, dtype, want in ((dsv3, torch.float32, large), (dsv3, torch.bfloat16, large),
                             (RouterConfig(384, 8, scoring="sigmoid", has_correction_bias=True), torch.float32,
                              T >= 32768),
                             (RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True), torch.float32, False),
                             (RouterConfig(64, 8, scoring="sigmoid", has_correction_bias=True), torch.float32, False)):
        seen = _launch_kwargs(torch.empty(T, cfg.num_experts, dtype=dtype), cfg, bias=torch.zeros(cfg.num_experts))
        assert seen["APPROX_KEYS"] is want, (cfg.num_experts, dtype, T)
        # (512 top-22 on its shifted words: 64 from T = 16384 on exact keys, MID_ONE_WARP_MAX_REGISTERS)
        capped = want or (cfg.top_k == 22 and T >= 16384)
        assert seen.get("maxnreg") == (64 if capped else None), (cfg.num_experts, dtype, T)
    plain = RouterConfig(256, 8, scoring="sigmoid", n_group=8, topk_group=4)
    assert _launch_kwargs(torch.empty(T, 256, dtype=torch.bfloat16), plain)["APPROX_KEYS"] is False
    assert _launch_kwargs(torch.empty(T, 256), plain)["APPROX_KEYS"] is large
    monkeypatch.setattr(kr, "approx_keys_override", False)  # the exact keys take no cap
    seen = _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))
    assert seen["APPROX_KEYS"] is False and "maxnreg" not in seen


@pytest.mark.parametrize("T", [1, 16383, 16384, 65536])
def test_prefetch_where_the_launcher_takes_it(T, monkeypatch):
    """PREFETCH_ROWS (the row that many programs ahead asked of the L2): from PREFETCH_MIN_TOKENS on one row a one-warp
    program whose row is at most 4 KB with unit column stride (PREFETCH_LINES 128-byte lines of it); never for one row
    a thread, split rows, several warps a row or a strided row; the override forces the distance."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "PREFETCH_ROWS", 4096)
    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    on = T >= 16384
    for dtype, lines in ((torch.float32, 8), (torch.bfloat16, 4)):
        seen = _launch_kwargs(torch.empty(T, 256, dtype=dtype), dsv3, bias=torch.zeros(256))
        assert (seen["PREFETCH_ROWS"], seen["PREFETCH_LINES"]) == ((4096, lines) if on else (0, 0)), (dtype, T)
    wide = RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True)  # 3584 bytes: 28 lines, one warp
    seen = _launch_kwargs(torch.empty(T, 896), wide, bias=torch.zeros(896))
    assert (seen["PREFETCH_ROWS"], seen["PREFETCH_LINES"], seen["num_warps"]) == ((4096, 28, 1) if on else (0, 0, 1))
    strided = torch.empty(256, T).t()  # column stride T
    assert _launch_kwargs(strided, dsv3, bias=torch.zeros(256))["PREFETCH_ROWS"] == 0
    for cfg in (RouterConfig(2048, 8, scoring="sigmoid"),  # 8 KB rows on several warps
                RouterConfig(8, 2),  # one row a thread
                RouterConfig(128, 8, renormalize=True)):  # split rows or rows packed on a warp at large T
        seen = _launch_kwargs(torch.empty(T, cfg.num_experts), cfg)
        assert seen["PREFETCH_ROWS"] == 0, (cfg.num_experts, T, seen["BLOCK_M"], seen["num_warps"])
    monkeypatch.setattr(kr, "prefetch_rows_override", 7)
    assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))["PREFETCH_ROWS"] == 7
    monkeypatch.setattr(kr, "prefetch_rows_override", 0)
    assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))["PREFETCH_ROWS"] == 0


@needs_cuda
@pytest.mark.parametrize("ahead", [1, 5, 4096])
def test_prefetch_routes_like_the_reference(ahead, monkeypatch):
    """Rows prefetched into the L2 ahead of their programs (PREFETCH_ROWS forced at every T, including distances past
    the last row): routing is the reference's on the fast-key, FMA-key and one-warp 1024-lane paths, fp32 and bf16."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "prefetch_rows_override", ahead)
    seen = _spy_launches(monkeypatch)
    configs = (RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4),
               RouterConfig(384, 8, scoring="sigmoid", has_correction_bias=True),
               RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True),
               RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True))
    for ci, config in enumerate(configs):
        for T in (1, 37, 4099, 65536):
            for dtype in (torch.float32, torch.bfloat16):
                logits = tie_free_logits(T, config.num_scored, dtype, seed=ci * 7 + T)
                seen.clear()
                run_both(logits, config, near_ties=dtype != torch.float32, **extras(config, T))
                # this launch, on the router kernel (an override keeps the rows-on-warps kernel out)
                assert len(seen) == 1 and seen[0]["PREFETCH_ROWS"] == ahead and seen[0]["PREFETCH_LINES"] > 0


@pytest.mark.parametrize("T", [1, 32, 33, 64, 4096, 8192, 32768, 65536])
def test_fma_keys_where_the_launcher_takes_them(T, monkeypatch):
    """FMA_KEYS (sigmoid / sqrt-softplus keys in their FMA forms): exact keys on rows on warps, not with the tile's
    weights, fast keys, one row a thread, logits selection or softmax (sqrt-softplus keys wherever their fast keys are
    off: T = 33-8191, run 79); one-warp rows with shifted distance words (512 top-22) at every T; the override wins."""
    import moegate.kernels.router as kr

    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    seen = _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))
    assert seen["FMA_KEYS"] is (not seen["APPROX_KEYS"]) and seen["APPROX_KEYS"] is (T >= 65536), T
    top22 = RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True)  # shifted words: FMA keys at every T
    seen = _launch_kwargs(torch.empty(T, 512), top22, bias=torch.zeros(512))
    assert seen["APPROX_KEYS"] is False and seen["FMA_KEYS"] is True, T
    dsv4 = RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True)
    seen = _launch_kwargs(torch.empty(T, 256), dsv4, bias=torch.zeros(256))
    assert seen["APPROX_KEYS"] is (T <= 32 or T >= 8192) and seen["FMA_KEYS"] is (32 < T < 8192), T
    narrow = _launch_kwargs(torch.empty(T, 16), RouterConfig(16, 2, scoring="sigmoid"))
    assert narrow["FMA_KEYS"] is True and narrow["TILE_WEIGHTS"] is False and narrow["THREAD_ROWS"] is False, T
    monkeypatch.setattr(kr, "thread_rows_override", False)  # 8 experts on warps: the tile's weights below T = 2048
    tiled = _launch_kwargs(torch.empty(T, 8), RouterConfig(8, 2, scoring="sigmoid"))
    assert tiled["TILE_WEIGHTS"] is (1 < T <= 2048) and tiled["FMA_KEYS"] is (not tiled["TILE_WEIGHTS"]), T
    monkeypatch.setattr(kr, "thread_rows_override", None)
    for cfg in (RouterConfig(8, 2, scoring="sigmoid"),  # one row a thread
                RouterConfig(64, 8, scoring="sigmoid", selection="logits"),
                RouterConfig(64, 8, scoring="softmax")):
        assert _launch_kwargs(torch.empty(T, cfg.num_experts), cfg)["FMA_KEYS"] is False, (cfg, T)
    monkeypatch.setattr(kr, "approx_keys_override", False)
    assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))["FMA_KEYS"] is True
    monkeypatch.setattr(kr, "fma_keys_override", True)  # past the launcher's cutoffs too
    assert _launch_kwargs(torch.empty(T, 256), dsv4, bias=torch.zeros(256))["FMA_KEYS"] is True
    monkeypatch.setattr(kr, "fma_keys_override", False)
    assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))["FMA_KEYS"] is False
    assert _launch_kwargs(torch.empty(T, 512), top22, bias=torch.zeros(512))["FMA_KEYS"] is False


@needs_cuda
def test_fma_keys_are_div_rn_and_sqrt_rn_for_every_input():
    """_recip_ge1(y) has tl.div_rn(1, y)'s bits for every float y in [1, 2**126), and _sqrt_fma(a) tl.sqrt_rn(a)'s
    for every float a in [2**-101, FLT_MAX]: the ranges FMA_KEYS feeds them."""

    @triton.jit
    def mismatches(count_ptr, first_ptr, lo, n, SQRT: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        a = tl.where(ok, (lo + i).to(tl.int32).to(tl.float32, bitcast=True), 1.0)
        if SQRT:
            got, want = rk._sqrt_fma(a, True), tl.sqrt_rn(a)
        else:
            got, want = rk._recip_ge1(a, True), tl.div_rn(tl.full(a.shape, 1.0, tl.float32), a)
        bad = ok & (got.to(tl.int32, bitcast=True) != want.to(tl.int32, bitcast=True))
        tl.atomic_add(count_ptr, tl.sum(bad.to(tl.int32), axis=0))
        tl.atomic_min(first_ptr, tl.min(tl.where(bad, (lo + i).to(tl.int32), 2147483647), axis=0))

    for sqrt, lo, hi in ((False, 0x3F800000, 0x7E800000),  # [1.0, 2**126)
                         (True, 0x0D000000, 0x7F800000)):  # [2**-101, inf)
        count = torch.zeros(1, dtype=torch.int32, device="cuda")
        first = torch.full((1,), 2147483647, dtype=torch.int32, device="cuda")
        mismatches[(triton.cdiv(hi - lo, 4096),)](count, first, lo, hi - lo, SQRT=sqrt, BLOCK=4096)
        assert int(count) == 0, f"sqrt={sqrt}: {int(count)} mismatches, first at bits {int(first):#x}"
    # The check can fail: the same kernel over a range where the FMA forms are not IEEE (subnormal quotients,
    # subnormal square roots' inputs) counts mismatches.
    for sqrt, lo, hi in ((False, 0x7E800001, 0x7F000000), (True, 0x00000001, 0x00800000)):
        count = torch.zeros(1, dtype=torch.int32, device="cuda")
        first = torch.full((1,), 2147483647, dtype=torch.int32, device="cuda")
        mismatches[(triton.cdiv(hi - lo, 4096),)](count, first, lo, hi - lo, SQRT=sqrt, BLOCK=4096)
        assert int(count) > 0, sqrt


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("T", [1, 37])
@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus"])
def test_fma_keys_rows_below_the_bound(scoring, grouped, T, monkeypatch):
    """Rows with finite logits below the FMA keys' bound redo their keys with div_rn / sqrt_rn. Sigmoid, below -87:
    1 + e reaches 2**126 (subnormal scores, or 1 + e overflows and the score is 0); a row whose every logit lies
    there (no bias, or a zero one) orders its experts by their subnormal scores, highest logit first, where the FMA
    reciprocal's flush to 0 would order them by id, and the distance words' clamp does not catch that (all keys lie
    within 2**23 ulps of the best). Sqrt-softplus, below -69 (softplus under 2**-101, where the FMA square root is
    not IEEE), and +inf logits (the FMA square root's NaN). The sigmoid rows fail with _fma_band's check removed; the
    sqrt-softplus rows fail with it and the NaN check both removed (subnormal and zero softplus values give NaN, which
    the NaN check catches alone; the band's remaining range, softplus in [2**-126, 2**-101), errs by at most an ulp
    or so on the GPU, which these rows cannot show)."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "fma_keys_override", True)  # the launcher takes sqrt-softplus FMA keys from T = 4096
    monkeypatch.setattr(kr, "approx_keys_override", False)  # ... and fast keys at T = 1

    E, K = 32, 4
    renorm = scoring == "sigmoid"  # sqrt-softplus rows hold a +inf key: weights inf, renormalized inf / inf
    if grouped:
        config = RouterConfig(E, K, scoring=scoring, has_correction_bias=True, n_group=4, topk_group=2,
                              renormalize=renorm)
    else:
        config = RouterConfig(E, K, scoring=scoring, renormalize=renorm)
    lo, hi = (-88.6, -87.4) if scoring == "sigmoid" else (-100.0, -69.5)  # sigmoid: 1 + e >= 2**126 throughout
    g = torch.Generator().manual_seed(7)
    x = torch.empty(T, E)
    for r in range(T):
        kind = r % 4
        if kind == 0:  # every logit in [lo, hi], rising with the id
            row = torch.linspace(lo, hi, E)
        elif kind == 1:  # ... shuffled, with some further down (-100, -1e30: exp(-x) overflows)
            row = torch.linspace(lo, hi, E)[torch.randperm(E, generator=g)]
            row[::3] = -100.0
            row[1::5] = -1e30
        elif kind == 2:  # two ordinary experts among them (the clamp sends this row to the exact path anyway)
            row = torch.linspace(lo, hi, E)
            row[torch.randperm(E, generator=g)[:2]] = torch.tensor([1.0, 0.5])
            if scoring == "sqrtsoftplus" and r % 8 == 2:
                row[3] = float("inf")  # key +inf, the row's best
        else:  # an ordinary row (no logit below the bound): the FMA keys themselves
            row = torch.randn(E, generator=g) * 4
        x[r] = row
    kw = {"bias": torch.zeros(E, device=DEVICE)} if grouped else {}
    x = x.to(DEVICE)
    got, want = run_both(x, config, **kw)
    if not grouped:  # the point of row 0: the exact order is not the order by id
        assert want.ids[0].tolist() == [E - 1, E - 2, E - 3, E - 4]
    seen = _launch_kwargs(x.cpu(), config, **{k: v.cpu() for k, v in kw.items()})
    assert seen["FMA_KEYS"] is True and seen["APPROX_KEYS"] is False
    monkeypatch.setattr(kr, "fma_keys_override", False)
    assert_identical(got, route(x, config, backend="triton", **kw))


@pytest.mark.parametrize("T", [1, 8])
def test_fma_keys_plus_inf_logits(T, monkeypatch):
    """Sqrt-softplus rows with a +inf logit and none below -69: the FMA square root of +inf is NaN, so the row's best
    key is NaN and the row redoes its keys with sqrt_rn (key +inf, the row's first expert). One row a program and
    packed rows, every row such a row. (The distance words' clamp sends these rows to the exact path as well, every
    other key being clamped below a NaN best: this test holds with the NaN check removed; it checks the routing.)"""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "fma_keys_override", True)
    monkeypatch.setattr(kr, "approx_keys_override", False)
    E = 32
    config = RouterConfig(E, 4, scoring="sqrtsoftplus", has_correction_bias=True, renormalize=False)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, E, generator=g) * 4
    x[torch.arange(T), torch.randint(0, E, (T,), generator=g)] = float("inf")
    x = x.to(DEVICE)
    bias = (torch.randn(E, generator=g) * 0.1).to(DEVICE)
    got, want = run_both(x, config, bias=bias)
    assert torch.isinf(got.weights[:, 0]).all()
    monkeypatch.setattr(kr, "fma_keys_override", False)
    assert_identical(got, route(x, config, backend="triton", bias=bias))


def test_fma_keys_match_exact_keys(monkeypatch):
    """On ordinary logits (none below the bound) the FMA keys' routing is div_rn's / sqrt_rn's, bit for bit, on one
    row a program and packed rows, with and without groups."""
    import moegate.kernels.router as kr

    E, K = (256, 8) if FULL else (32, 4)
    cfgs = (RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True, n_group=8 if FULL else 4,
                         topk_group=4 if FULL else 2, routed_scaling_factor=2.5),
            RouterConfig(E, K, scoring="sigmoid", renormalize=True),
            RouterConfig(E, 6 if FULL else 3, scoring="sqrtsoftplus", has_correction_bias=True, renormalize=True),
            RouterConfig(32, 4, scoring="sigmoid", has_correction_bias=True),  # packed rows on the GPU too
            RouterConfig(32, 4, scoring="sqrtsoftplus", has_correction_bias=True, renormalize=True))
    monkeypatch.setattr(kr, "approx_keys_override", False)  # FMA keys at every T, T = 1 included
    g = torch.Generator().manual_seed(11)
    for config in cfgs:
        W = config.num_experts
        for T in ((1, 37, 4096) if FULL else (1, 37)):
            x = (torch.randn(T, W, generator=g) * 6).to(DEVICE)
            kw = {"bias": (torch.randn(W, generator=g) * 0.1).to(DEVICE)} if config.has_correction_bias else {}
            monkeypatch.setattr(kr, "fma_keys_override", True)
            got = route(x, config, backend="triton", **kw)
            monkeypatch.setattr(kr, "fma_keys_override", False)
            assert_identical(got, route(x, config, backend="triton", **kw))


@pytest.mark.parametrize("T", [1, 256, 372, 373, 1024, 1025, 65536])
def test_scalar_checks_where_the_launcher_takes_them(T, monkeypatch):
    """SCALAR_CHECKS: one row a one-warp program while T * K <= 8192 (DeepSeek-V3 to T = 1024, 512 top-22 to
    T = 372, 896 top-16 to T = 512); never for logit keys (Qwen3), several warps a row (896 experts without the
    32-bit rounds), one row a thread or split rows; the
    override forces it wherever one row a program can take it."""
    import moegate.kernels.router as kr

    def scalar(config, **kw):
        return _launch_kwargs(torch.empty(T, config.num_scored), config, **kw)["SCALAR_CHECKS"]

    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    wide_k = RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True)
    qwen3 = RouterConfig(128, 8)
    k3 = RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True)
    mixtral = RouterConfig(8, 2)
    assert scalar(dsv3, bias=torch.zeros(256)) is (T <= 1024), T
    assert scalar(wide_k, bias=torch.zeros(512)) is (T <= 372), T
    monkeypatch.setattr(kr, "split_rows_override", 0)  # Qwen3 one row a warp at every T
    assert scalar(qwen3) is False
    assert scalar(k3, bias=torch.zeros(896)) is (T <= 512), T
    assert scalar(mixtral) is False
    with monkeypatch.context() as m:
        m.setattr(kr, "exact32_override", False)  # four warps a row
        assert scalar(k3, bias=torch.zeros(896)) is False
    monkeypatch.setattr(kr, "scalar_checks_override", True)
    assert scalar(qwen3) is (T < 32768)  # four rows a warp from T = 32768
    assert scalar(k3, bias=torch.zeros(896)) is True
    assert scalar(mixtral) is False  # one row a thread
    monkeypatch.setattr(kr, "scalar_checks_override", False)
    assert scalar(dsv3, bias=torch.zeros(256)) is False


@pytest.mark.parametrize("T", [1, 32, 33, 1024, 1025, 65536])
def test_bias_early_where_the_launcher_takes_it(T, monkeypatch):
    """BIAS_EARLY (the bias load pinned before the scoring): sqrt-softplus rows on warps with a bias on the fast keys
    up to T = 1024 (T <= 32: the exact keys' square roots cover the load); not sigmoid rows (ptxas loads their
    bias with the logits), rows without a bias, one row a thread or split rows; the override forces it on or off
    wherever a row on warps has a bias."""
    import moegate.kernels.router as kr

    dsv4 = RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True)
    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    assert _launch_kwargs(torch.empty(T, 256), dsv4, bias=torch.zeros(256))["BIAS_EARLY"] is (T <= 32), T
    monkeypatch.setattr(kr, "approx_keys_override", True)  # the fast keys up to T = 1024
    assert _launch_kwargs(torch.empty(T, 256), dsv4, bias=torch.zeros(256))["BIAS_EARLY"] is (T <= 1024), T
    monkeypatch.setattr(kr, "approx_keys_override", None)
    assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))["BIAS_EARLY"] is False
    plain = RouterConfig(256, 6, scoring="sqrtsoftplus")
    assert _launch_kwargs(torch.empty(T, 256), plain)["BIAS_EARLY"] is False
    monkeypatch.setattr(kr, "bias_early_override", True)
    assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=torch.zeros(256))["BIAS_EARLY"] is True
    assert _launch_kwargs(torch.empty(T, 256), plain)["BIAS_EARLY"] is False  # no bias to load
    thread = RouterConfig(8, 2, scoring="sqrtsoftplus", has_correction_bias=True)  # one row a thread
    assert _launch_kwargs(torch.empty(T, 8), thread, bias=torch.zeros(8))["BIAS_EARLY"] is False
    monkeypatch.setattr(kr, "split_rows_override", 8)
    split = _launch_kwargs(torch.empty(T, 256), dsv4, bias=torch.zeros(256))
    assert split["SPLIT_ROWS"] == 8 and split["BIAS_EARLY"] is False
    monkeypatch.setattr(kr, "split_rows_override", None)
    monkeypatch.setattr(kr, "bias_early_override", False)
    assert _launch_kwargs(torch.empty(T, 256), dsv4, bias=torch.zeros(256))["BIAS_EARLY"] is False


def test_bias_early_routes_bit_for_bit_like_without(monkeypatch):
    """The pinned bias load changes no value: forced on and off, the same routing bit for bit on sqrt-softplus and
    sigmoid rows, with groups, on packed rows, on the fast, exact and FMA keys, with padding rows past T."""
    import moegate.kernels.router as kr

    E, K = (256, 8) if FULL else (32, 4)
    cfgs = (RouterConfig(E, 6 if FULL else 3, scoring="sqrtsoftplus", has_correction_bias=True, renormalize=True,
                         routed_scaling_factor=1.5),
            RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True, n_group=8 if FULL else 4,
                         topk_group=4 if FULL else 2),
            RouterConfig(32, 4, scoring="sqrtsoftplus", has_correction_bias=True))  # packed rows on the GPU
    g = torch.Generator().manual_seed(12)
    seen = _spy_launches(monkeypatch)
    fast_keys = 0
    for config in cfgs:
        W = config.num_experts
        for T in ((1, 16, 37, 4096) if FULL else (1, 37)):  # T = 16: the launcher's fast sqrt-softplus keys
            x = (torch.randn(T, W, generator=g) * 3).to(DEVICE)
            bias = (torch.randn(W, generator=g) * 0.1).to(DEVICE)
            for keys in ({}, {"approx_keys_override": True}, {"approx_keys_override": False,
                                                              "fma_keys_override": True}):
                for name, value in keys.items():
                    monkeypatch.setattr(kr, name, value)
                seen.clear()
                monkeypatch.setattr(kr, "bias_early_override", True)
                got = route(x, config, backend="triton", bias=bias, num_valid_tokens=T - 1)
                monkeypatch.setattr(kr, "bias_early_override", False)
                again = route(x, config, backend="triton", bias=bias, num_valid_tokens=T - 1)
                assert [s["BIAS_EARLY"] for s in seen] == [True, False], (config, T, keys)
                # Fast keys only on one row a program: packed rows take the exact ones (the same launch as {}).
                assert seen[0]["APPROX_KEYS"] is (keys.get("approx_keys_override", seen[0]["APPROX_KEYS"])
                                                   and seen[0]["BLOCK_M"] == 1), (config, T, keys)
                fast_keys += seen[0]["APPROX_KEYS"]
                assert_identical(got, again)
                for name in keys:
                    monkeypatch.setattr(kr, name, None)
            monkeypatch.setattr(kr, "bias_early_override", True)
            run_both(x, config, bias=bias)
            monkeypatch.setattr(kr, "bias_early_override", None)
    assert fast_keys >= (6 if FULL else 3)


@pytest.mark.parametrize("kept_only", [True, False], ids=["kept-only", "all-lanes"])
def test_fast_keys_groups_an_ulp_apart_at_the_kept_boundary(kept_only, monkeypatch):
    """Fast keys rank the groups on 32-bit words whose low log2(BLOCK_G) bits hold the group (_group_keep's
    NEAR_WORDS): groups whose scores differ by less than 2**log2(BLOCK_G) ulps rank by id there. A row whose group
    ranked TOPK_GROUP-th is beaten by one ulp by a higher-id dropped one must go to the exact path (the kept /
    dropped margin) and keep the higher group, as the reference does. Logits 0 score exactly 0.5 on the fast keys
    (ex2 of 0 is 1, the reciprocal of 2 is 0.5), so the biases set the keys to the bit: group 1 sums 1.5 + 0.5 = 2,
    group 2 1.25 + (0.75 + 2**-22) = 2 + 2**-22, one ulp more; group 0 (1.625 + 1.375) is kept, group 3 dropped.
    The third row's group 2 scores below group 1 by far: it stays on the fast path."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "approx_keys_override", True)
    monkeypatch.setattr(kr, "kept_only_override", kept_only)
    config = RouterConfig(32, 4, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=2)
    keys = torch.full((32,), 0.125)
    keys[[0, 1]] = torch.tensor([1.625, 1.375])
    keys[[8, 9]] = torch.tensor([1.5, 0.5])
    keys[[16, 17]] = torch.tensor([1.25, 0.75 + 2.0 ** -22])
    keys[[24, 25]] = torch.tensor([0.375, 0.25])
    bias = (keys - 0.5).to(DEVICE)
    assert (bias + 0.5 == keys.to(DEVICE)).all()  # the keys exactly
    logits = torch.zeros(3, 32)
    logits[2, 16:18] = torch.tensor([-0.25, -0.125])  # group 2 sums ~1.91 here
    logits = logits.to(DEVICE)
    got, _ = run_both(logits, config, bias=bias)
    assert got.ids[0].tolist() == [0, 1, 16, 17]  # group 2 kept, not group 1
    _, (redo, repaired, n) = _counted(logits, config, bias=bias)
    assert (redo, repaired, n) == (2, 0, 3)


@pytest.mark.parametrize("keys", ["fma", "fast"])
def test_a_dead_lane_above_every_key_with_top_1(keys, monkeypatch):
    """Top-1 rows on FMA or fast keys whose NaN or +-inf logit leaves the NaN key above every other (NAN_DEAD): the
    NaN lane wins the only round, and with K = 1 on the FMA keys no other check sees it (no margin, and the winner's
    distance is not clamped), so the row flag alone must send the row to the exact path, which takes the best live
    expert as the reference does. Checked to fail without the flag."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "approx_keys_override", keys == "fast")
    monkeypatch.setattr(kr, "fma_keys_override", keys == "fma")
    for scoring in ("sigmoid", "sqrtsoftplus"):
        config = RouterConfig(64, 1, scoring=scoring, has_correction_bias=True)
        logits = tie_free_logits(4, 64, seed=3).cpu()
        logits[0, 9] = float("nan")
        logits[1, 40] = float("-inf")
        logits[2, 63] = float("nan")
        bias = torch.linspace(-0.2, 0.2, 64)
        got, _ = run_both(logits.to(DEVICE), config, bias=bias.to(DEVICE))
        assert got.ids[0, 0] != 9 and got.ids[2, 0] != 63


@pytest.mark.parametrize("kept_only", [True, False], ids=["kept-only", "all-lanes"])
@pytest.mark.parametrize("scalar", [True, False], ids=["scalar-checks", "vector-checks"])
def test_fast_keys_dead_lanes_in_every_form(kept_only, scalar, monkeypatch):
    """Dead lanes on the fast keys (NAN_DEAD: NaN keys from x * 0 + x) across grouped sigmoid / sqrt-softplus rows
    (top2_sum and max, 8 and 16 groups, padded groups), ungrouped rows, the rounds on the kept lanes or on all, and
    both forms of the checks: NaN, -inf and +inf logits, a row of NaN every fifth lane, an all-NaN row, a negative NaN
    (bits 0xFFC00000), dead lanes in more groups than topk_group keeps; every row against the reference. (A review of
    the change, 2026-12-04; on the GPU this also checks the sqrt-softplus keys' NaN-propagating min / max, which the
    interpreter's numpy min / max always are.)"""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "approx_keys_override", True)
    monkeypatch.setattr(kr, "kept_only_override", kept_only)
    monkeypatch.setattr(kr, "scalar_checks_override", scalar)
    g = torch.Generator().manual_seed(1)
    negative_nan = torch.tensor([-4194304], dtype=torch.int32).view(torch.float32)[0]  # 0xFFC00000
    for config in (
        RouterConfig(64, 4, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4),
        RouterConfig(64, 6, scoring="sqrtsoftplus", has_correction_bias=True, n_group=8, topk_group=3,
                      group_score="max"),
        RouterConfig(64, 4, scoring="sqrtsoftplus", has_correction_bias=True, n_group=16, topk_group=5),
        RouterConfig(48, 4, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=2),  # padded groups
        RouterConfig(40, 5, scoring="sqrtsoftplus", has_correction_bias=True),
    ):
        E = config.num_scored
        logits = torch.randn(8, E, generator=g) * 2
        bias = torch.randn(E, generator=g) * (0.3 if config.scoring == "sigmoid" else 1.5)
        logits[0, 3] = float("nan")
        logits[1, E - 1] = float("-inf")
        if config.scoring == "sigmoid":
            logits[2, 7] = float("inf")  # scores 1.0 (sqrt-softplus's inf makes the weights NaN: outside the domain)
        logits[3, ::5] = float("nan")
        logits[4] = float("nan")
        logits[5, 0] = negative_nan
        logits[6, [1, 17, 33]] = float("nan")  # three groups with a dead lane (topk_group keeps fewer for some)
        run_both(logits.to(DEVICE), config, bias=bias.to(DEVICE))


def test_fast_keys_sixteen_groups_apart_within_a_bucket(monkeypatch):
    """NEAR_WORDS with 16 groups (4 low bits of the group words hold the group): the third and the fourth group by
    score lie 7 ulps apart in one 16-ulp bucket, the lower-id one below; the higher one must be kept, as the
    reference keeps it (the margin sends the row to the exact path), and gives two of the six winners. Logits 0
    score exactly 0.5 on the fast keys. Checked to fail without the kept / dropped margin."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "launch_override", (1, 1))
    monkeypatch.setattr(kr, "approx_keys_override", True)
    config = RouterConfig(64, 6, scoring="sigmoid", has_correction_bias=True, n_group=16, topk_group=3)
    bucket = torch.tensor([2.0]).view(torch.int32)[0].item() & ~15

    def bits(b):
        return torch.tensor([b], dtype=torch.int32).view(torch.float32)[0].item()

    for kept_only in (True, False):
        monkeypatch.setattr(kr, "kept_only_override", kept_only)
        # Winners far apart (the fast path's own margins pass): only the groups' margin can send the row to the
        # exact path.
        keys = torch.full((64,), 0.0625)
        keys[[0, 1]] = torch.tensor([1.75, 1.25])  # group 0 first (3.0)
        keys[[4, 5]] = torch.tensor([1.5, 1.0])  # group 1 second (2.5)
        low, high = bits(bucket + 2), bits(bucket + 9)  # 7 ulps apart, one bucket
        keys[[8, 9]] = torch.tensor([1.3125, low - 1.3125])  # group 2
        keys[[36, 37]] = torch.tensor([1.375, high - 1.375])  # group 9: kept
        assert keys[8] + keys[9] == low and keys[36] + keys[37] == high
        logits = torch.zeros(2, 64)
        logits[1, 36:38] = -3.0  # group 9 far below: group 2 kept, on the fast path
        got, _ = run_both(logits.to(DEVICE), config, bias=(keys - 0.5).to(DEVICE))
        assert got.ids[0].tolist() == [0, 4, 36, 1, 5, 37]  # the third and the sixth from group 9, not group 2
        assert got.ids[1].tolist() == [0, 4, 8, 1, 5, 9]


def test_rows_in_range_only_for_one_row_a_program(monkeypatch):
    """ROWS_IN_RANGE (no row mask on the loads and stores) only where every program's rows are < T: one row a
    program with T >= 1. A launch of T = 0 runs one program whose row is past the end, and packed rows, one row a
    thread and split rows have programs that pass T."""
    import moegate.kernels.router as kr

    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    bias = torch.zeros(256)
    for T in (1, 7, 4096):
        assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=bias)["ROWS_IN_RANGE"] is True
    assert _launch_kwargs(torch.empty(0, 256), dsv3, bias=bias)["ROWS_IN_RANGE"] is False
    mixtral = RouterConfig(8, 2, renormalize=True)
    assert _launch_kwargs(torch.empty(64, 8), mixtral)["ROWS_IN_RANGE"] is False  # one row a thread
    assert _launch_kwargs(torch.empty(8192, 128), RouterConfig(128, 8, renormalize=True))["ROWS_IN_RANGE"] is False
    monkeypatch.setattr(kr, "launch_override", (2, 1))
    assert _launch_kwargs(torch.empty(64, 256), dsv3, bias=bias)["ROWS_IN_RANGE"] is False
    # T = 0 and an odd T with two rows a program route like the reference (nothing read past the end).
    for T in (0, 3):
        run_both(torch.randn(T, 256).to(DEVICE), dsv3, bias=bias.to(DEVICE))


def test_kept_only_where_the_launcher_takes_it(monkeypatch):
    """KEPT_ONLY (the rounds on the kept groups' lanes): one row a program with groups excluded in the words, kept by
    counting, groups as wide as their tile, on fast keys (FMA keys where forced); never zero fill, one group, padded
    groups, more than 16 groups, exact or softmax keys; kept_only_override wins where a launch can take it."""
    import moegate.kernels.router as kr

    for name in ("kept_only_override", "approx_keys_override", "fma_keys_override"):
        monkeypatch.setattr(kr, name, None)
    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    bias = torch.zeros(256)
    for T in (1, 64, 4096, 32768):  # FMA keys: not by default, but where forced
        assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=bias)["KEPT_ONLY"] is False
        monkeypatch.setattr(kr, "kept_only_override", True)
        assert _launch_kwargs(torch.empty(T, 256), dsv3, bias=bias)["KEPT_ONLY"] is True
        monkeypatch.setattr(kr, "kept_only_override", None)
    assert _launch_kwargs(torch.empty(65536, 256), dsv3, bias=bias)["KEPT_ONLY"] is True  # fast keys
    monkeypatch.setattr(kr, "approx_keys_override", True)
    three = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=3)
    assert _launch_kwargs(torch.empty(64, 256), three, bias=bias)["KEPT_ONLY"] is True
    monkeypatch.setattr(kr, "approx_keys_override", None)
    zero = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4,
                        group_fill="zero")
    flat = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True)
    padded = RouterConfig(240, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)  # 30 a group
    many = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=32, topk_group=4)
    soft = RouterConfig(256, 8, scoring="softmax", n_group=8, topk_group=4)
    monkeypatch.setattr(kr, "kept_only_override", True)
    for config in (zero, flat, padded, many, soft):
        E = config.num_experts
        assert _launch_kwargs(torch.empty(65536, E), config, bias=torch.zeros(E))["KEPT_ONLY"] is False, config
    monkeypatch.setattr(kr, "kept_only_override", None)
    monkeypatch.setattr(kr, "approx_keys_override", False)
    monkeypatch.setattr(kr, "fma_keys_override", False)  # exact keys through div_rn
    assert _launch_kwargs(torch.empty(64, 256), dsv3, bias=bias)["KEPT_ONLY"] is False
    monkeypatch.setattr(kr, "approx_keys_override", None)
    monkeypatch.setattr(kr, "fma_keys_override", None)
    monkeypatch.setattr(kr, "kept_only_override", False)
    assert _launch_kwargs(torch.empty(65536, 256), dsv3, bias=bias)["KEPT_ONLY"] is False


def test_kept_only_routes_bit_for_bit_like_all_lanes(monkeypatch):
    """The rounds on the kept groups' lanes change no value: forced on and off, the same routing bit for bit on
    fast and FMA keys, top2_sum and max group scores, a kept count that is not a power of two (padding slots),
    sigmoid and sqrt-softplus, a logit scale and softcap, fp32 and bf16 logits and bias, rows with ties, NaN and
    -inf, padding rows; and like the reference."""
    import moegate.kernels.router as kr

    E, G = (256, 8) if FULL else (64, 4)
    cfgs = (RouterConfig(E, 8 if FULL else 4, scoring="sigmoid", has_correction_bias=True, n_group=G,
                         topk_group=G // 2, routed_scaling_factor=2.5),
            RouterConfig(E, 8 if FULL else 6, scoring="sqrtsoftplus", has_correction_bias=True, n_group=G,
                         topk_group=3, group_score="max", renormalize=True, logit_scale=0.7, softcap=30.0),
            RouterConfig(E, 8 if FULL else 6, scoring="sigmoid", has_correction_bias=True, n_group=G, topk_group=3))
    g = torch.Generator().manual_seed(31)
    for config in cfgs:
        for T in ((1, 37, 4096) if FULL else (37,)):
            x = torch.randn(T, E, generator=g) * 3
            if T > 1:
                x[1, : E // 2] = 0.5  # ties across groups
                x[-1, 3] = float("nan")
                x[-1, 5] = float("-inf")
            for bias_dtype in (torch.float32, torch.bfloat16):  # bf16 logits with the bf16 bias
                x = x.to(bias_dtype).to(DEVICE)
                bias = (torch.randn(E, generator=g) * 0.1).to(bias_dtype).to(DEVICE)
                # FMA keys take KEPT_ONLY only where forced: on the GPU alone (the interpreter lane's time).
                for keys in ({"approx_keys_override": True},) + (({"approx_keys_override": False,
                                                                   "fma_keys_override": True},) if FULL else ()):
                    for name, value in keys.items():
                        monkeypatch.setattr(kr, name, value)
                    monkeypatch.setattr(kr, "kept_only_override", True)
                    assert _launch_kwargs(x, config, bias=bias)["KEPT_ONLY"] is True
                    got = route(x, config, backend="triton", bias=bias, num_valid_tokens=T - 1)
                    monkeypatch.setattr(kr, "kept_only_override", False)
                    assert_identical(got, route(x, config, backend="triton", bias=bias, num_valid_tokens=T - 1))
                    monkeypatch.setattr(kr, "kept_only_override", None)
                    if keys["approx_keys_override"]:  # the launcher's choice on fast keys: KEPT_ONLY
                        run_both(x[2:] if T > 2 else x, config, bias=bias)
                    for name in keys:
                        monkeypatch.setattr(kr, name, None)


def test_register_cap_where_the_launcher_sets_it(monkeypatch):
    """ptxas's register cap: for rows of 2048 lanes and more (one a program, several warps; 1024 lanes too where the
    32-bit rounds are off) 56 from T = 2049, 64 from T = 257, none below; 128 for one warp on a 1024-lane row (the
    launcher's choice) below T = 16384, 80 from there; 64 for one warp on a 512-lane row from T = 16384 (512 top-22,
    Qwen3-Next), for one-warp rows on fast
    sigmoid keys, for split rows on 8 threads in one-warp
    programs (Qwen3 at T = 8192-16383) and for two-warp split rows (from T = 16384: the exact path's softmax flush
    took them to 93 registers uncapped), none elsewhere; maxnreg_override wins (0: none)."""
    import moegate.kernels.router as kr

    wide = RouterConfig(896, 16, scoring="sigmoid", has_correction_bias=True)
    wider = RouterConfig(2048, 16, scoring="sigmoid", has_correction_bias=True)
    for T, cap in ((1, None), (256, None), (257, 64), (2048, 64), (2049, 56), (65536, 56)):
        seen = _launch_kwargs(torch.empty(T, 2048), wider, bias=torch.zeros(2048))
        assert seen["num_warps"] == 8 and seen["BLOCK_M"] == 1 and seen.get("maxnreg") == cap, T
        with monkeypatch.context() as m:  # 896 lanes without the 32-bit rounds: four warps
            m.setattr(kr, "exact32_override", False)
            seen = _launch_kwargs(torch.empty(T, 896), wide, bias=torch.zeros(896))
            assert seen["num_warps"] == 4 and seen["BLOCK_M"] == 1 and seen.get("maxnreg") == cap, T
    for T, cfg in ((65536, RouterConfig(8, 2, scoring="softmax", renormalize=True)),  # one row a thread
                   (65536, RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True)),  # 64 already
                   (4096, RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True))):
        seen = _launch_kwargs(torch.empty(T, cfg.num_experts), cfg,
                              **({"bias": torch.zeros(cfg.num_experts)} if cfg.has_correction_bias else {}))
        assert "maxnreg" not in seen, (T, cfg.num_experts)
    qwen3 = RouterConfig(128, 8, scoring="softmax", renormalize=True)
    for T, split, cap in ((4096, 16, None), (8191, 16, None), (8192, 8, 64), (16383, 8, 64), (16384, 8, 64),
                          (65536, 8, 64)):
        seen = _launch_kwargs(torch.empty(T, 128), qwen3)
        assert seen["SPLIT_ROWS"] == split and seen.get("maxnreg") == cap, T
        assert seen["num_warps"] == (1 if T < 16384 else 2), T
    for T, cap in ((1, 128), (256, 128), (4096, 128), (16383, 128), (16384, 80), (65536, 80)):
        # one warp on 1024 lanes: 128, then 80 from T = 16384, keys fast or not
        seen = _launch_kwargs(torch.empty(T, 896), wide, bias=torch.zeros(896))
        assert seen["num_warps"] == 1 and seen["BLOCK_M"] == 1 and seen["EXACT32"] and seen.get("maxnreg") == cap, T
    top22 = RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True)
    qwen3_next = RouterConfig(512, 10, scoring="softmax", renormalize=True)
    for T, cap in ((1, None), (4096, None), (16383, None), (16384, 64), (65536, 64)):  # one warp on 512 lanes
        for cfg in (top22, qwen3_next):
            seen = _launch_kwargs(torch.empty(T, 512), cfg,
                                  **({"bias": torch.zeros(512)} if cfg.has_correction_bias else {}))
            assert seen["num_warps"] == 1 and seen["BLOCK_M"] == 1 and seen.get("maxnreg") == cap, (T, cfg.top_k)
    monkeypatch.setattr(kr, "maxnreg_override", 0)
    assert "maxnreg" not in _launch_kwargs(torch.empty(4096, 896), wide, bias=torch.zeros(896))
    monkeypatch.setattr(kr, "maxnreg_override", 40)
    assert _launch_kwargs(torch.empty(64, 128), RouterConfig(128, 8))["maxnreg"] == 40


def test_pdl_where_the_launcher_asks_for_it(monkeypatch):
    """Programmatic dependent launch (on sm_90+): rows on warps up to T = 4096, one row a thread up to T = 16384,
    split rows on two-warp programs only (from T = 16384); use_pdl_override wins."""
    import moegate.kernels.router as kr

    # The launch as route_triton makes it, on a device that has PDL (CPU tensors here: the device check answers yes).
    monkeypatch.setattr(kr, "_use_pdl", lambda device, *args: kr._pdl_wanted(*args))

    def wanted(cfg, T):
        bias = {"bias": torch.zeros(cfg.num_experts)} if cfg.has_correction_bias else {}
        seen = _launch_kwargs(torch.empty(T, cfg.num_experts), cfg, **bias)
        return seen.get("launch_pdl", False)

    dsv3 = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    qwen3 = RouterConfig(128, 8, scoring="softmax", renormalize=True)
    mixtral = RouterConfig(8, 2, scoring="softmax", renormalize=True)
    for T, want in ((1, True), (4096, True), (8192, False), (65536, False)):
        assert wanted(dsv3, T) is want, T
    for T, want in ((1024, True), (4096, False), (8192, False), (16384, True), (65536, True)):
        assert wanted(qwen3, T) is want, T
    for T, want in ((4096, True), (8192, True), (16384, True), (32768, False)):
        assert wanted(mixtral, T) is want, T
    monkeypatch.setattr(kr, "use_pdl_override", True)
    assert wanted(dsv3, 65536) is True
    monkeypatch.setattr(kr, "use_pdl_override", False)
    assert wanted(mixtral, 16) is False


@pytest.mark.parametrize("T", [1, 16, 32, 33, 4096, 8192, 16384, 65536])
def test_fast_sqrtsoftplus_keys_at_one_row_or_large_T(T, monkeypatch):
    """DeepSeek-V4's fast keys up to T = 32 or from T = 8192, close rows redone whole; with the repair switched on
    at every T, close rows repaired below T = 16384. Never for bf16 logits without a bias (they tie often)."""
    import moegate.kernels.router as kr

    config = RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True)
    plain = RouterConfig(256, 6, scoring="sqrtsoftplus")
    for repair in (False, True):
        monkeypatch.setattr(kr, "APPROX_REPAIR", repair)
        want = repair or T <= 32 or T >= 8192
        seen = _launch_kwargs(torch.empty(T, 256), config, bias=torch.zeros(256))
        assert seen["APPROX_KEYS"] is want and seen["APPROX_REPAIR"] is (repair and T < 16384)
        assert seen["BLOCK_KC"] == 8
        assert _launch_kwargs(torch.empty(T, 256, dtype=torch.bfloat16), plain)["APPROX_KEYS"] is False
        assert _launch_kwargs(torch.empty(T, 256), plain)["APPROX_KEYS"] is want
    hashed = RouterConfig(256, 6, scoring="sqrtsoftplus", routing="hash")
    table = torch.arange(6, dtype=torch.int32).repeat(50, 1)  # a valid table: the fused op checks it
    assert _launch_kwargs(torch.empty(T, 256), hashed, token_ids=torch.zeros(T, dtype=torch.int64),
                          hash_table=table)["APPROX_KEYS"] is False


def test_pdl_trigger_after_the_selection_only_for_small_one_row_launches(monkeypatch):
    """PDL_TRIGGER: 1 (the next grid launches once the selection is done) for one row a program up to
    PDL_LATE_MAX_TOKENS, 0 (from the start) for larger launches and rows packed a thread; the override wins."""
    import moegate.kernels.router as kr

    config = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    bias = torch.zeros(256)
    for T, want in ((1, 1), (kr.PDL_LATE_MAX_TOKENS, 1), (kr.PDL_LATE_MAX_TOKENS + 1, 0), (4096, 0)):
        seen = _launch_kwargs(torch.randn(T, 256), config, bias=bias)
        assert seen["PDL_TRIGGER"] == want, T
    seen = _launch_kwargs(torch.randn(16, 8), RouterConfig(8, 2))
    assert seen["THREAD_ROWS"] and seen["PDL_TRIGGER"] == 0
    monkeypatch.setattr(kr, "pdl_trigger_override", 2)
    assert _launch_kwargs(torch.randn(1, 256), config, bias=bias)["PDL_TRIGGER"] == 2


def test_num_valid_read_only_with_padding():
    """HAS_PADDING (the kernel reads num_valid) only for an int num_valid_tokens below T; a device scalar is read
    through its pointer (VALID_FROM_PTR); without padding every row is live and num_valid is never read."""
    config = RouterConfig(256, 8)
    x = torch.randn(10, 256)
    for kw, pad, ptr in (({}, False, False), ({"num_valid_tokens": 10}, False, False),
                         ({"num_valid_tokens": 7}, True, False), ({"num_valid_tokens": 0}, True, False),
                         ({"num_valid_tokens": torch.tensor(7)}, False, True)):
        seen = _launch_kwargs(x, config, **kw)
        assert (seen["HAS_PADDING"], seen["VALID_FROM_PTR"]) == (pad, ptr), kw


def test_softmax_logit_keys_only_where_they_hold():
    """The launcher selects on logits only for renormalized softmax without bias, groups or hash routing,
    one row a program, and renorm_eps far below the weights' sum; every other softmax keeps its scores."""
    x = torch.randn(4, 64)
    hashed = {"token_ids": torch.arange(4), "hash_table": torch.arange(8, dtype=torch.int32).repeat(16, 1)}
    cases = [
        (RouterConfig(64, 8, scoring="softmax", renormalize=True), {}, True),
        (RouterConfig(64, 8, scoring="softmax", renormalize=False), {}, False),
        (RouterConfig(64, 8, scoring="softmax", renormalize=True, renorm_eps=1e-3), {}, False),
        (RouterConfig(64, 8, scoring="softmax", renormalize=True, renorm_p=2.0), {}, False),
        (RouterConfig(64, 8, scoring="softmax", renormalize=True, n_group=4, topk_group=2), {}, False),
        (RouterConfig(64, 8, scoring="softmax", renormalize=True, has_correction_bias=True),
         {"bias": torch.zeros(64)}, False),
        (RouterConfig(64, 8, scoring="sigmoid", renormalize=True), {}, False),
        (RouterConfig(64, 8, scoring="softmax", renormalize=True, routing="hash"), hashed, False),
    ]
    for config, kw, want in cases:
        seen = _launch_kwargs(x, config, **kw)
        assert seen["LOGIT_KEYS"] is want, config
        if want:
            assert not seen["TRUNCATE_WORDS"]
    # One row a thread (8 experts) too; rows packed on a warp (TRUNCATE_WORDS) keep the scores.
    seen = _launch_kwargs(x[:, :8], RouterConfig(8, 2, scoring="softmax", renormalize=True))
    assert seen["THREAD_ROWS"] and seen["LOGIT_KEYS"]
    seen = _launch_kwargs(torch.randn(5000, 32), RouterConfig(32, 4, scoring="softmax", renormalize=True))
    assert not seen["THREAD_ROWS"] and not seen["LOGIT_KEYS"] and seen["TRUNCATE_WORDS"]


@pytest.mark.parametrize("name,config,tol", [c for c in CONFIGS if c[1].routing != "hash"],
                         ids=[c[0] for c in CONFIGS if c[1].routing != "hash"])
def test_exact_path_for_every_row(name, config, tol, monkeypatch):
    """The exact 64-bit path, forced for every row, routes like the reference: at the heuristic's launch,
    and for rows up to 256 lanes also one row a program and four rows a program."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "force_exact_override", True)
    g, gs = kr._tile_shape(config)
    for launch in (None, (1, 1), (4, 1)) if g * gs <= 256 else (None,):
        monkeypatch.setattr(kr, "launch_override", launch)
        logits = tie_free_logits(5, config.num_scored, seed=3)
        run_both(logits, config, tol=tol, near_ties=config.has_correction_bias, **extras(config, 5))


def _thread_row_configs():
    """CONFIGS' ungrouped, unhashed knobs on 16 (or 13) experts: rows narrow enough for one a thread. The knobs
    are those of the grid's base configs (256 experts on a GPU, 32 under the interpreter), not of its wide ones;
    until 2026-12-03 the filter kept only rows of <= 64 experts, which left this list empty on a GPU."""
    cases = []
    for name, config, tol in CONFIGS:
        if config.n_group == 1 and config.routing != "hash" and config.num_experts <= (256 if FULL else 64):
            E = 13 if name == "top1-non-pow2" else 16
            cases.append((name, config.replace(num_experts=E, num_zero_experts=min(config.num_zero_experts, 5)),
                          tol))
    return cases


def _every_layout_padded(config, tol, tokens, n_layouts=5, only=None):
    """Route like the reference under the first ``n_layouts`` layouts (or those at the indices ``only``; fp32 and
    bf16 logits in turn) at each T in ``tokens``, the last three rows padding: rows from num_valid_tokens on get
    ids -1 and weights 0 (an int here, a device scalar in the CUDA-graph test). Zero experts take the default
    layout only: they route under it once for each dtype the chosen layouts would have used (until 2026-12-04 they
    skipped every other layout, and a call that chose none of the first routed nothing)."""
    runs = []
    for li, ((lname, layout, S), dtype) in enumerate(zip(_layouts(config.num_experts)[:n_layouts],
                                                         (torch.float32, torch.bfloat16) * 3, strict=False)):
        if only is not None and li not in only:
            continue
        if config.num_zero_experts:
            lname, layout, S = _layouts(config.num_experts)[0]
        if (lname, dtype) not in [(r[0], r[3]) for r in runs]:
            runs.append((lname, layout, S, dtype))
    assert runs, (only, n_layouts)
    for _lname, layout, S, dtype in runs:
        for seed, T in enumerate(tokens):
            logits = tie_free_logits(T, config.num_scored, dtype, seed)
            run_both(logits, config.replace(num_shared_experts=S), layout, tol=tol,
                     near_ties=config.has_correction_bias, home_rank=layout.ep_size - 1,
                     num_valid_tokens=max(T - 3, 0), **extras(config, T, seed))


# Each launch of the thread-row and split-row grids its own test: a config's launches x layouts x dtypes compile a
# kernel each, and as one test they were the GPU suite's tail (H200 run 110: 223-241 s a config on one worker of 16).
_THREAD_ROW_LAUNCHES = {"one-warp": (None, (0, 1, 2)), "one-warp-layouts": (None, (3, 4)),
                        "two-rows-a-thread": ((64, 1), (1, 2)), "two-warps": ((64, 2), (1, 2))}


@pytest.mark.parametrize("launch", list(_THREAD_ROW_LAUNCHES))
@pytest.mark.parametrize("name,config,tol", _thread_row_configs(), ids=[c[0] for c in _thread_row_configs()])
def test_thread_rows_match_reference(name, config, tol, launch, monkeypatch):
    """One row a thread (THREAD_ROWS), forced: every ungrouped knob, every layout, fp32 and bf16 logits, at
    one row a thread on one warp (the heuristic's launch; its five layouts in two tests), two rows a thread, and two
    warps. The other two launches take two layouts (global shared slots on bf16, per-rank replicas on fp32): the
    layouts only change the epilogue, which the launches share, and every layout x launch cost the CPU lane ~190 s
    (and a GPU's first run ~150 s of compiles a config)."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "thread_rows_override", True)
    override, only = _THREAD_ROW_LAUNCHES[launch]
    monkeypatch.setattr(kr, "launch_override", override)
    _every_layout_padded(config, tol, (0, 1, 70), only=only)


def _f32(bits):
    """The fp32 value of int32 bits."""
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


def _ulps_below(x, n):
    """x with its bits n lower (n ulps toward zero for x > 0)."""
    return _f32(torch.tensor([x], dtype=torch.float32).view(torch.int32).item() - n)


# Rows of 8 logits for one row a thread with logit keys (_thread_logit_rounds), and whether the row must leave the
# fast path. Bucket tops: 2.0, 1.5 and -1.25 (signed bits multiples of 16); 2.0 - 12 ulps shares 2.0's bucket.
_LOW = [-3.0, -3.25, -3.5, -3.75, -4.0, -4.25, -4.5, -4.75]
_EDGE_ROWS = [
    # a lower id 12 ulps below a higher one in the same bucket, as the 2nd and 3rd words: the boundary check
    ("bucket-boundary", {0: 5.0, 3: _ulps_below(2.0, 12), 6: 2.0}, True),
    # ... as the 1st and 2nd words: the pair check sees them out of order
    ("bucket-pair", {0: _ulps_below(2.0, 12), 6: 2.0}, True),
    # exact ties of bf16 values at the boundary: the K-th logit repeated by the first loser, whose run of equal logits
    # may go on to a lower-id logit a little below with the same score (_equal_run_rows): redone since 2026-12-04 (the
    # logits are fp32 here; see docs/kernel.md); at the top: ties by id, no fallback
    ("bf16-tie-boundary", {0: 3.0, 1: 1.5, 2: 1.5, 3: 0.25}, True),
    ("bf16-tie-negative", {0: -0.5, 1: -1.25, 2: -1.25}, True),
    ("bf16-tie-top", {0: 1.5, 1: 1.5, 2: 0.5}, False),
    ("signed-zeros", {1: -0.0, 3: 0.0}, False),
    # NaN payloads that sort below every word and above it, +inf, rows of nothing but -inf
    ("nan-payloads", {0: 1.0, 2: _f32(0x7FFFFFFF), 4: 0.5, 5: _f32(-1), 6: _f32(-0x7F7FFFFF)}, False),
    ("nan-canonical", {0: 1.0, 1: float("nan"), 4: 0.5}, True),
    ("plus-inf", {0: 1.0, 1: float("inf"), 4: 0.5}, True),
    ("two-plus-inf", {1: float("inf"), 4: float("inf"), 5: 1.0}, True),
    ("all-neg-inf", {j: float("-inf") for j in range(8)}, True),
    ("one-live", {**{j: float("-inf") for j in range(8)}, 4: 1.0}, True),
    # a 2nd score that underflows, subnormals on both sides of zero
    ("spread", {0: 80.0, 3: 0.0, 5: -80.0}, True),
    ("subnormals", {0: -1e-45, 2: 1e-45, 5: 0.0, **{j: -1e-45 * 0 - 1.0 - j for j in (1, 3, 4, 6, 7)}}, True),
]


@pytest.mark.parametrize("E,K,forced,regs", [(8, 2, False, True), (8, 2, False, False), (8, 1, False, True),
                                              (8, 8, True, True), (16, 4, True, True)],
                         ids=["mixtral", "mixtral-reloaded", "top1", "k-is-e", "16-top4"])
def test_thread_logit_rounds_edge_rows(E, K, forced, regs, monkeypatch):
    """One row a thread with logit keys (renormalized softmax): each edge row alone in a program of tie-free
    rows, against the reference (ids exact, weights within 1e-6); for Mixtral's shape, exactly the programs of
    the rows that the fast path cannot decide are redone on the exact path (ties among the winners, signed zeros and
    NaN payloads that no winner reads are decided; a misorder inside a word's bucket or a K-th logit repeated by the
    first loser never is). The winners' logits
    come from the thread's registers (the launcher's choice) or, for Mixtral once more, from a second read."""
    import moegate.kernels.router as kr

    if forced:
        monkeypatch.setattr(kr, "thread_rows_override", True)
    monkeypatch.setattr(kr, "winners_in_regs_override", regs)
    config = RouterConfig(E, K, renormalize=True)
    logits = tie_free_logits(32 * len(_EDGE_ROWS), E, seed=3).clone()
    for i, (_name, lanes, _redo) in enumerate(_EDGE_ROWS):
        row = torch.tensor([_LOW[j % 8] - 0.0625 * (j // 8) for j in range(E)])
        for j, v in lanes.items():
            row[j] = v
        logits[32 * i + 5] = row.to(DEVICE)
    got, (redo, _, programs) = _counted(logits, config)
    assert programs == len(_EDGE_ROWS)
    want = route(logits, config, backend="reference")
    # +inf logits are outside the contract's domain: K distinct valid ids, weights unspecified.
    inf_rows = torch.isposinf(logits).any(dim=1)
    ids = got.ids[inf_rows].long()
    assert ((ids >= 0) & (ids < E)).all() and (ids.sort(dim=1).values.diff(dim=1) > 0).all()
    keep = ~inf_rows
    assert_same_routing(type(got)(got.weights[keep], got.ids[keep]), type(want)(want.weights[keep], want.ids[keep]),
                        logits[keep], config, None)
    if (E, K) == (8, 2):
        assert redo == sum(r for _, _, r in _EDGE_ROWS)
        torch.testing.assert_close(got.ids[32 * 2 + 5], torch.tensor([0, 1], dtype=torch.int32, device=DEVICE))
        torch.testing.assert_close(got.ids[32 * 5 + 5], torch.tensor([1, 3], dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("E,K,regs", [(8, 2, True), (8, 2, False), (6, 2, True), (16, 4, True)],
                         ids=["8-top2", "8-top2-reloaded", "6-top2", "16-top4"])
def test_thread_logit_rounds_near_ties(E, K, regs, monkeypatch):
    """One row a thread with logit keys on rows drawn a few ulps apart (every word bucket crowded: ties, values
    inside one bucket, neighbouring buckets) around 2.0, -1.25, 0 and 1e-38, fp32, against the reference;
    scores within rounding of each other may go either way, as in every near-tie test. Winners' logits from
    registers (6 columns: the select tree's odd level) or read again."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "thread_rows_override", True)
    monkeypatch.setattr(kr, "winners_in_regs_override", regs)
    g = torch.Generator().manual_seed(9)
    T = 256
    base = torch.tensor([2.0, -1.25, 0.0, 1e-38])[torch.randint(0, 4, (T, 1), generator=g)]
    bits = base.view(torch.int32) + torch.randint(-40, 41, (T, E), generator=g, dtype=torch.int32)
    logits = bits.view(torch.float32)
    logits[::7, 3] = 0.5  # some rows decided by one far winner
    run_both(logits.to(DEVICE), RouterConfig(E, K, renormalize=True), near_ties=True)


@pytest.mark.parametrize("E,K", [(8, 2), (6, 2), (16, 4), (32, 3)])
def test_thread_winners_from_registers_keep_rows_on_the_fast_path(E, K, monkeypatch):
    """The winners' logits picked from registers are the logits the rows were loaded with: on tie-free rows no
    program leaves the fast path (the order checks run on the picked values, so a wrong pick would send rows to
    the exact path, which still routes them right) and the routing is the reference's."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "thread_rows_override", True)
    monkeypatch.setattr(kr, "winners_in_regs_override", True)
    config = RouterConfig(E, K, renormalize=True)
    logits = tie_free_logits(96, E, seed=E)
    got, (redo, _, programs) = _counted(logits, config)
    assert programs == 3 and redo == 0
    assert_same_routing(got, route(logits, config, backend="reference"), logits, config, None)


@pytest.mark.parametrize("q", [4, 8, 2], ids=["q4-one-warp", "q8-two-warps", "q2"])
@pytest.mark.parametrize("name,config,tol", _thread_row_configs(), ids=[c[0] for c in _thread_row_configs()])
def test_split_rows_match_reference(name, config, tol, q, monkeypatch):
    """Rows split over Q threads (SPLIT_ROWS), forced: every ungrouped knob, every layout, fp32 and bf16
    logits; 4 threads a row (16 or 13 experts: 4 columns a thread, the last thread's 13th-16th columns
    padding) on one warp, 8 threads a row on two warps, and 2 threads a row (8 columns a thread); each its own
    test (see _THREAD_ROW_LAUNCHES)."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "split_rows_override", q)
    monkeypatch.setattr(kr, "launch_override", (8, 2) if q == 8 else None)
    # The layouts act in the epilogue, which no Q changes: all five once, fp32 and bf16 on the others.
    _every_layout_padded(config, tol, (0, 1, 29), n_layouts=5 if q == 4 else 2)


@needs_cuda
@pytest.mark.parametrize("q", [None, 4, 8, 16], ids=["heuristic", "split-4", "split-8", "split-16"])
def test_split_rows_at_large_T_match_reference(q, monkeypatch):
    """Qwen3's rows where the launcher splits them (T >= 4096), as it launches them and forced to 4, 8 and 16
    threads a row, against the reference: tie-free rows (the words decide them) and normal draws (some rows
    close, their programs on the exact path), fp32 and bf16, the last rows padding. GPU only: the
    interpreter would take hours at these T."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "split_rows_override", q)
    config = RouterConfig(128, 8, renormalize=True)
    g = torch.Generator().manual_seed(5)
    for T, dtype in ((4096, torch.float32), (32768, torch.bfloat16), (65536, torch.float32)):
        if q == 4 and T != 65536:
            continue  # each launch shape and dtype one more ~2-minute compile of the 32-columns-a-thread kernel
        run_both(tie_free_logits(T, 128, dtype, seed=T), config, num_valid_tokens=T - 5)
        drawn = (torch.randn(T, 128, generator=g) * 2.0).to(dtype).to(DEVICE)
        run_both(drawn, config, near_ties=True, num_valid_tokens=T - 5)


def test_split_rows_only_where_they_apply(monkeypatch):
    """Split rows only for ungrouped, unhashed rows; a forced thread count must hold the row in at most 32
    columns a thread, and a forced launch must hold whole rows. By default only where they were measured
    faster: renormalized softmax selected on the logits, 65-128 experts, T >= 4096 (16 threads a row; 8 from
    T = SPLIT_WIDE_TOKENS, 8192)."""
    import moegate.kernels.router as kr

    qwen3 = RouterConfig(128, 8, scoring="softmax", renormalize=True)
    assert [kr._split_threads(qwen3, T) for T in (1, 1024, 4095, 4096, 8191, 8192, 65536)] == [0, 0, 0, 16, 16, 8, 8]
    monkeypatch.setattr(kr, "SPLIT_WIDE_TOKENS", None)
    assert [kr._split_threads(qwen3, T) for T in (4096, 32768, 65536)] == [16, 16, 16]
    monkeypatch.setattr(kr, "SPLIT_WIDE_TOKENS", 32768)
    for config in (RouterConfig(128, 8, scoring="sigmoid", renormalize=True), RouterConfig(256, 8, renormalize=True),
                   RouterConfig(64, 8, renormalize=True), RouterConfig(128, 8, renormalize=True, renorm_eps=1e-3),
                   RouterConfig(128, 8, renormalize=False), RouterConfig(8, 2, renormalize=True),
                   RouterConfig(128, 8, renormalize=True, n_group=8, topk_group=4)):
        assert kr._split_threads(config, 65536) == 0, config
    seen = _launch_kwargs(torch.randn(32768, 128), qwen3)
    assert seen["SPLIT_ROWS"] == 8 and seen["LOGIT_KEYS"] and seen["BLOCK_M"] * 8 == 32 * seen["num_warps"]
    assert not seen["THREAD_ROWS"] and not seen["TRUNCATE_WORDS"] and not seen["TILE_WEIGHTS"]
    assert _launch_kwargs(torch.randn(1024, 128), qwen3)["SPLIT_ROWS"] == 0
    monkeypatch.setattr(kr, "split_rows_override", 4)
    assert kr._split_threads(RouterConfig(128, 8), 64) == 4
    assert kr._split_threads(RouterConfig(128, 8, n_group=8, topk_group=4), 64) == 0
    assert kr._split_threads(RouterConfig(128, 8, routing="hash"), 64) == 0
    assert kr._launch_shape(64, 128, split=4) == (8, 1)
    monkeypatch.setattr(kr, "launch_override", (8, 2))
    with pytest.raises(ValueError, match="whole|rows per program"):
        kr._launch_shape(64, 128, split=4)
    monkeypatch.setattr(kr, "launch_override", None)
    monkeypatch.setattr(kr, "split_rows_override", 2)
    with pytest.raises(ValueError, match="at most 32"):
        kr._split_threads(RouterConfig(128, 8), 64)  # 64 columns a thread
    monkeypatch.setattr(kr, "split_rows_override", 3)
    with pytest.raises(ValueError, match="threads a row"):
        kr._split_threads(RouterConfig(12, 2), 64)
    out = poisoned_out(4, 8)
    with pytest.raises(ValueError, match="threads a row"):
        route(torch.zeros(4, 12, device=DEVICE), RouterConfig(12, 8), backend="triton", out=out)
    assert torch.isnan(out[0]).all() and (out[1] == -7).all()


@pytest.mark.parametrize("cap", [32, 48])
def test_register_cap_routes_like_reference(cap, monkeypatch):
    """maxnreg_override (the benchmark's maxnreg-N variants) makes ptxas spill: routing must not change, on the
    fast paths and on the exact ones (every program forced there). Under the interpreter the cap is ignored and
    this checks that the cap reaches the launch and that routing is unchanged."""
    import moegate.kernels.router as kr

    assert "maxnreg" not in _launch_kwargs(torch.zeros(3, 32), RouterConfig(32, 4))  # ptxas decides by default
    monkeypatch.setattr(kr, "maxnreg_override", cap)
    assert _launch_kwargs(torch.zeros(3, 32), RouterConfig(32, 4))["maxnreg"] == cap
    E = 256 if FULL else 32
    configs = [
        RouterConfig(E, 6, scoring="sqrtsoftplus", has_correction_bias=True, routed_scaling_factor=1.5),
        RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4),
        RouterConfig(E // 2, 8, scoring="softmax", renormalize=True),
    ]
    for force in (False, True):
        monkeypatch.setattr(kr, "force_exact_override", force)
        for i, config in enumerate(configs):
            run_both(tie_free_logits(37, config.num_scored, seed=i).to(DEVICE), config, **extras(config, 37, seed=i))
        monkeypatch.setattr(kr, "split_rows_override", _gpu_split(4))  # split rows under the cap, too
        run_both(tie_free_logits(37, E // 2, seed=5).to(DEVICE), configs[2])
        monkeypatch.setattr(kr, "split_rows_override", None)


@pytest.mark.parametrize("override", [("thread_rows_override", True), ("split_rows_override", 2),
                                      ("split_rows_override", 4), ("split_pair_exact_override", True)],
                         ids=["one-row-a-thread", "split-2", "split-4", "split-4-pairs"])
def test_thread_rows_ties_nan_and_neg_inf(override, monkeypatch):
    """One row a thread and rows split over 2 or 4 threads on the edge cases: equal keys go to the lower id,
    NaN and -inf are dead (key -inf, weight 0, still selected in id order when fewer than K experts live),
    -0.0 ties with +0.0. Split rows with logit keys settle close rows on exact scores by default (pairs);
    split-2 and split-4 take them straight to the 64-bit rounds."""
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, *override)
    if override[0] == "split_pair_exact_override":
        monkeypatch.setattr(kr, "split_rows_override", 4)
    elif override[0] == "split_rows_override":
        monkeypatch.setattr(kr, "split_pair_exact_override", False)
    g = torch.Generator().manual_seed(11)
    E, K = 12, 4
    for config in (
        RouterConfig(E, K),
        RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True, routed_scaling_factor=2.5),
        RouterConfig(E, K, scoring="sqrtsoftplus", softcap=5.0),
        RouterConfig(E, K, selection="logits", scoring="sigmoid", renormalize=False),
        RouterConfig(E, K, renorm_eps=0.0),
        RouterConfig(E, K, scoring="sigmoid", renorm_eps=0.0, renorm_eps_mode="clamp", renorm_p=2.0),
    ):
        logits = torch.randint(0, 3, (40, E), generator=g).float()
        logits[0] = 1.0  # all equal: ids 0..K-1
        logits[1, ::3] = float("nan")
        logits[2, 2:] = float("-inf")  # fewer than K live experts
        logits[3] = float("nan")
        logits[4] = float("-inf")
        logits[5] = 0.0
        logits[5, ::2] = -0.0
        logits[6, : E // 2] = float("nan")
        kw = extras(config, 40)
        if "bias" in kw:
            kw["bias"] = torch.zeros_like(kw["bias"])
        got, _ = run_both(logits.to(DEVICE), config, **kw)
        assert got.ids[0, :K].tolist() == list(range(K))
        assert got.ids[5, :K].tolist() == list(range(K))
        if config.softcap is None:
            assert (got.weights[3] == 0).all() and (got.weights[4] == 0).all()
        assert (got.weights >= 0).all()


def test_thread_rows_only_where_they_apply(monkeypatch):
    """The launcher takes one row a thread for narrow ungrouped rows only, and refuses a forced launch that
    does not hold a whole number of rows a thread."""
    import moegate.kernels.router as kr

    assert kr._use_thread_rows(RouterConfig(8, 2))  # Mixtral
    assert kr._use_thread_rows(RouterConfig(8, 2, scoring="sigmoid", has_correction_bias=True))
    assert not kr._use_thread_rows(RouterConfig(16, 2))  # measured slower at 16 lanes (run 14)
    assert not kr._use_thread_rows(RouterConfig(128, 8))  # Qwen3
    assert not kr._use_thread_rows(RouterConfig(8, 2, n_group=4, topk_group=2))
    assert not kr._use_thread_rows(RouterConfig(8, 2, routing="hash"))
    monkeypatch.setattr(kr, "thread_rows_override", False)
    assert not kr._use_thread_rows(RouterConfig(8, 2))
    monkeypatch.setattr(kr, "thread_rows_override", True)
    assert kr._use_thread_rows(RouterConfig(32, 8)) and not kr._use_thread_rows(RouterConfig(32, 8, n_group=8,
                                                                                            topk_group=4))
    assert not kr._use_thread_rows(RouterConfig(33, 8))  # past the kernel's 32-lane tree, even when forced
    assert kr._launch_shape(1, 8, thread_rows=True) == (32, 1)
    assert kr._launch_shape(65536, 8, thread_rows=True) == (64, 2)
    monkeypatch.setattr(kr, "launch_override", (16, 1))
    with pytest.raises(ValueError, match="multiple of 32"):
        route(tie_free_logits(2, 8), RouterConfig(8, 2), backend="triton")


def test_narrow_rows_on_warps_take_four_rows_a_program_from_4096_tokens():
    """Rows of 33-128 lanes that neither one row a thread nor split rows take (H100 runs 135-138): one row a one-warp
    program below T = 4096, four rows a one-warp program from there (64 lanes: two before; 128 lanes: from 32768)."""
    import moegate.kernels.router as kr

    for tile in (64, 128):
        for T, want in ((1, (1, 1)), (2048, (1, 1)), (4095, (1, 1)), (4096, (4, 1)), (65536, (4, 1))):
            assert kr._launch_shape(T, tile) == want, (tile, T)
    assert kr._launch_shape(65536, 32) == (16, 1) and kr._launch_shape(65536, 256) == (1, 1)  # unchanged
    olmoe = RouterConfig(64, 8, scoring="softmax", renormalize=False)
    sigmoid128 = RouterConfig(128, 8, scoring="sigmoid", has_correction_bias=True)
    for cfg, bias in ((olmoe, None), (sigmoid128, torch.zeros(128))):
        E = cfg.num_experts
        assert _launch_kwargs(torch.empty(2048, E, dtype=torch.bfloat16), cfg, bias=bias)["BLOCK_M"] == 1
        seen = _launch_kwargs(torch.empty(4096, E, dtype=torch.bfloat16), cfg, bias=bias)
        assert (seen["BLOCK_M"], seen["num_warps"]) == (4, 1), cfg
    qwen3 = RouterConfig(128, 8, scoring="softmax", renormalize=True)  # split rows, not this launch
    assert _launch_kwargs(torch.empty(4096, 128), qwen3)["SPLIT_ROWS"] > 0


@pytest.mark.parametrize("as_tensor", [False, True])
def test_padding_rows(as_tensor):
    config = RouterConfig(32, 4, scoring="sigmoid", has_correction_bias=True, num_shared_experts=2)
    layout = ExpertLayout(shared_slots="global")
    T = 37
    logits = tie_free_logits(T, 32)
    for n in (0, 1, 20, T):
        nv = torch.tensor([n], dtype=torch.int32, device=DEVICE) if as_tensor else n
        got, _ = run_both(logits, config, layout, near_ties=True, num_valid_tokens=nv, **extras(config, T))
        assert (got.ids[n:] == -1).all() and (got.weights[n:] == 0).all()


_LEAN_CASES = [
    # bias, groups, rsf in the weights, per-rank shared slots, replicas by home rank, padding, a recorder
    ("grouped-home-recorder", RouterConfig(32, 4, n_group=4, topk_group=2, scoring="sigmoid",
                                           has_correction_bias=True, routed_scaling_factor=2.5,
                                           num_shared_experts=1),
     ExpertLayout(ep_size=2, shared_slots="per_rank", replica_policy="home_rank",
                  placement=ExpertPlacement(tuple(range(32)) * 2, 32)), True),
    # logit scale, softcap, p-norm with a clamped eps, global shared slots
    ("softcap-pnorm", RouterConfig(16, 3, logit_scale=0.5, softcap=3.0, renorm_p=2.0, renorm_eps_mode="clamp",
                                   renorm_eps=1e-6, num_shared_experts=2), ExpertLayout(shared_slots="global"), False),
    ("expert-scale", RouterConfig(16, 2, scoring="sigmoid", has_expert_scale=True), ExpertLayout(), False),
    ("hash", RouterConfig(32, 4, scoring="sqrtsoftplus", routing="hash", routed_scaling_factor=1.5), ExpertLayout(),
     False),
    ("mixtral-thread-rows", RouterConfig(8, 2, renormalize=True), ExpertLayout(), False),
]


@pytest.mark.parametrize("name,config,layout,record", _LEAN_CASES, ids=[c[0] for c in _LEAN_CASES])
def test_lean_parameters_route_like_every_argument(name, config, layout, record, monkeypatch):
    """LEAN_PARAMS passes what the launch's constexprs turn off as None, so Triton drops those parameters: the
    routing (weights, ids, recorder) is bit for bit that of the launch with every argument, on configs that use
    the optional ones (a None that the kernel reads would not compile)."""
    import moegate.kernels.router as kr

    T = 37
    logits = tie_free_logits(T, config.num_scored, seed=5)
    width = config.top_k + layout.num_shared_columns(config.num_shared_experts)
    got = {}
    for lean in (True, False):
        monkeypatch.setattr(kr, "lean_params_override", lean)
        rec = RoutingRecorder(2, T, config.top_k, config.num_experts, device=DEVICE) if record else None
        out = poisoned_out(T, width)
        r = route(logits, config, layout, backend="triton", out=out, home_rank=layout.ep_size - 1, recorder=rec,
                  layer=1, num_valid_tokens=T - 4 if record else None, **extras(config, T, seed=5))
        got[lean] = (r.weights, r.ids, None if rec is None else rec.ids.clone())
    assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])
    if record:
        assert torch.equal(got[True][2], got[False][2]) and (got[True][2][1, : T - 4] >= 0).all()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16])
def test_recorder_matches_reference(dtype):
    config = RouterConfig(32, 4, n_group=4, topk_group=2, scoring="sigmoid")
    layout = ExpertLayout(ep_size=2, shared_slots="per_rank", placement=ExpertPlacement(tuple(range(32)) * 2, 32))
    for T in (0, 5, 37):
        logits = tie_free_logits(T, 32, seed=T)
        recs = [RoutingRecorder(2, 40, 4, 32, dtype=dtype, device=DEVICE) for _ in range(2)]
        for r in recs:
            r.ids.fill_(-7)
        for rec, backend in zip(recs, ("triton", "reference"), strict=True):
            route(logits, config, layout, backend=backend, recorder=rec, layer=1, num_valid_tokens=min(T, 3))
        assert torch.equal(recs[0].ids, recs[1].ids)
        assert torch.equal(recs[0].num_tokens, recs[1].num_tokens)
        assert int(recs[0].num_tokens[1]) == T


def test_hash_routing():
    for config in (
        RouterConfig(32, 4, scoring="sqrtsoftplus", routing="hash", routed_scaling_factor=1.5),
        RouterConfig(32, 4, scoring="softmax", routing="hash", num_shared_experts=1),
    ):
        layout = ExpertLayout(shared_slots="global") if config.num_shared_experts else ExpertLayout()
        for T in (1, 37):
            logits = tie_free_logits(T, 32, torch.bfloat16, seed=T)
            kw = extras(config, T, seed=T)
            run_both(logits, config, layout, num_valid_tokens=T - 1, **kw)


def test_hash_token_outside_the_table_makes_a_padded_row():
    """On a GPU route() cannot check token ids without a sync: the kernel must not read out of bounds and
    writes such a row as padding, like the reference (route() itself rejects them for CPU tensors, so the launch
    is made here as route() makes it after its checks)."""
    from moegate.kernels.router import _route_triton as route_triton
    from moegate.reference import route_reference

    config = RouterConfig(32, 4, routing="hash", num_shared_experts=1)
    layout = ExpertLayout(shared_slots="global")
    T = 6
    kw = extras(config, T)
    vocab = kw["hash_table"].shape[0]
    kw["token_ids"] = torch.tensor([0, vocab, 1, -1, 2, vocab + 5], device=DEVICE)
    args = dict(bias=None, num_valid_tokens=None, home_rank=0, expert_scale=None, recorder=None, layer=0, **kw)
    logits = tie_free_logits(T, 32)
    got = route_triton(logits, config, layout, out=poisoned_out(T, 5), **args)
    want = route_reference(logits, config, layout, out=None, **args)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert (got[1][[1, 3, 5]] == -1).all() and (got[0][[1, 3, 5]] == 0).all()
    assert (got[1][[0, 2, 4]] >= 0).all()


@pytest.mark.parametrize("E,K,split", [(64, 6, 0), (8, 3, 0), (64, 6, 4)],
                         ids=["rows-on-warps", "one-row-a-thread", "split-rows"])
def test_packed_output(E, K, split, monkeypatch):
    import moegate.kernels.router as kr

    monkeypatch.setattr(kr, "split_rows_override", split or None)
    config = RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True, num_shared_experts=1)
    layout = ExpertLayout(shared_slots="global")
    T = 37
    logits = tie_free_logits(T, E)
    kw = extras(config, T)
    packed = torch.full((T, K + 1), -7, dtype=torch.int32, device=DEVICE)
    from moegate.kernels.router import route_triton

    weights, ids = route_triton(logits, config, layout, num_valid_tokens=30, packed_out=packed, **kw)
    w_bits = weights.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    assert torch.equal(packed, (ids << 16) | w_bits)
    assert (packed[30:] == (-1 << 16)).all()


@pytest.mark.parametrize("split", [0, 4], ids=["groups", "split-rows"])
def test_strided_logits_and_allocating_path(split, monkeypatch):
    import moegate.kernels.router as kr

    if split:
        monkeypatch.setattr(kr, "split_rows_override", split)
        config = RouterConfig(32, 4, scoring="sigmoid", has_correction_bias=True)
    else:
        config = RouterConfig(32, 4, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=2)
    base = tie_free_logits(37, 64)
    for logits in (base[:, ::2], tie_free_logits(32, 37).t()):  # column stride 2; a transposed view
        kw = extras(config, logits.shape[0])
        got = route(logits, config, backend="triton", **kw)
        want = route(logits, config, backend="reference", **kw)
        assert_same_routing(got, want, logits, config, kw["bias"], near_ties=True)


@pytest.mark.parametrize("config", [
    RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4,
                 routed_scaling_factor=2.5),
    RouterConfig(128, 8, renormalize=True),
    RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True),
    RouterConfig(8, 2, renormalize=True),
], ids=["deepseek-v3", "qwen3", "512-top22", "mixtral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_padded_rows_route_like_the_reference(config, dtype, monkeypatch):
    """Logits a view of a wider buffer, rows 8 elements longer (16-byte aligned: the router kernel states it to the
    compiler, ROWS_16B, and the launch compiles as for contiguous rows), 12 longer (aligned for fp32, not for bf16)
    or 3 longer (not aligned: ROWS_16B off), route like the reference into poisoned outputs on the router kernel's
    launches at each T (Mixtral's one row a thread, Qwen3's split rows at T = 4096 on the GPU)."""
    seen = _spy_launches(monkeypatch)
    E = config.num_experts
    for pad in (8, 12, 3):
        for T in (1, 37, 4096) if FULL else (1, 37):
            wide = torch.cat([tie_free_logits(T, E, seed=T + pad), torch.full((T, pad), float("nan"))], dim=1)
            logits = wide.to(dtype).to(DEVICE)[:, :E]
            kw = extras(config, T)
            out = poisoned_out(T, config.top_k)
            seen.clear()
            got = route(logits, config, backend="triton", out=out, **kw)
            want = route(logits, config, backend="reference", **kw)
            assert_same_routing(got, want, logits, config, kw.get("bias"), near_ties=True)
            launches = [s for s in seen if "ROWS_16B" in s]
            aligned = (E + pad) * logits.element_size() % 16 == 0
            assert launches and all(s["ROWS_16B"] is aligned for s in launches), (pad, T, launches)


def test_unsupported_configs_raise_before_launch():
    from moegate.kernels.router import route_triton

    out = poisoned_out(4, 65)
    with pytest.raises(ValueError, match="top_k"):
        route(torch.zeros(4, 128, device=DEVICE), RouterConfig(128, 65), backend="triton", out=out)
    assert torch.isnan(out[0]).all() and (out[1] == -7).all()
    with pytest.raises(ValueError, match="zero experts"):
        config = RouterConfig(16, 2, has_expert_scale=True, num_zero_experts=4)
        route(torch.zeros(4, 20, device=DEVICE), config, backend="triton", expert_scale=torch.ones(16, device=DEVICE))
    placement = ExpertPlacement(tuple(i % 1000 for i in range(40000)), 1000)
    with pytest.raises(ValueError, match="packed_out"):
        route_triton(torch.zeros(2, 1000, device=DEVICE), RouterConfig(1000, 2), ExpertLayout(placement=placement),
                     packed_out=torch.zeros(2, 2, dtype=torch.int32, device=DEVICE))
    # route_triton, the packed words' entry, checks its arguments as route() does.
    out = poisoned_out(4, 2)
    for bad_out, match in (((out[0][:, :1], out[1][:, :1]), "shape"), (poisoned_out(4, 4), "shape")):
        with pytest.raises(ValueError, match=match):
            route_triton(torch.zeros(4, 8, device=DEVICE), RouterConfig(8, 2), ExpertLayout(), out=bad_out)
    wide = poisoned_out(4, 4)
    with pytest.raises(ValueError, match="contiguous"):
        route_triton(torch.zeros(4, 8, device=DEVICE), RouterConfig(8, 2), ExpertLayout(),
                     out=(wide[0][:, :2], wide[1][:, :2]))
    with pytest.raises(ValueError, match="num_valid_tokens"):
        route_triton(torch.zeros(4, 8, device=DEVICE), RouterConfig(8, 2), ExpertLayout(), num_valid_tokens=-3)
    assert torch.isnan(out[0]).all() and (out[1] == -7).all()
    out = poisoned_out(2, 2)
    for packed in (out[1], out[0].view(torch.int32)):  # packed words on the ids' or the weights' memory
        with pytest.raises(ValueError, match=r"out\[[01]\] \((weights|ids)\) overlaps packed_out"):
            route_triton(torch.zeros(2, 8, device=DEVICE), RouterConfig(8, 2), ExpertLayout(), out=out,
                         packed_out=packed)
    assert torch.isnan(out[0]).all() and (out[1] == -7).all()
    with pytest.raises(ValueError, match="replicas"):
        many = ExpertPlacement(tuple(i % 4 for i in range(400)), 4)
        route(torch.zeros(2, 4, device=DEVICE), RouterConfig(4, 2), ExpertLayout(placement=many), backend="triton")
    with pytest.raises(ValueError, match="lanes"):
        route(torch.zeros(1, 20000, device=DEVICE), RouterConfig(20000, 2), backend="triton")


def test_the_kernel_refuses_inputs_that_need_a_gradient_and_auto_takes_the_reference():
    """The fused op has no backward: with grad mode on and logits, bias or expert_scale requiring grad, its weights
    would come out detached (a trainer's router and a learned expert scale would get no gradient, silently).
    backend="triton" raises; "auto" takes the reference, whose weights carry the gradient; under no_grad (or for
    inputs that need none) the kernel runs as before."""
    from moegate.kernels.router import route_triton
    from moegate.router import resolve_backend

    config = RouterConfig(16, 2, scoring="sigmoid", has_correction_bias=True, has_expert_scale=True)
    x = torch.randn(5, 16, device=DEVICE)
    bias = torch.randn(16, device=DEVICE) * 0.1
    scale = torch.rand(16, device=DEVICE) + 0.5
    for grad_on in ("logits", "bias", "expert_scale"):
        args = {"logits": x.clone(), "bias": bias.clone(), "expert_scale": scale.clone()}
        args[grad_on].requires_grad_(True)
        out = poisoned_out(5, 2)
        with pytest.raises(ValueError, match=f"no backward: {grad_on} require"):
            route(args["logits"], config, bias=args["bias"], expert_scale=args["expert_scale"], backend="triton",
                  out=out)
        assert torch.isnan(out[0]).all() and (out[1] == -7).all()  # nothing launched
        with pytest.raises(ValueError, match="no backward"):
            route_triton(args["logits"], config, ExpertLayout(), bias=args["bias"], expert_scale=args["expert_scale"])
        with torch.no_grad():
            got = route(args["logits"], config, bias=args["bias"], expert_scale=args["expert_scale"], backend="triton")
        want = route(x, config, bias=bias, expert_scale=scale, backend="reference")
        assert torch.equal(got.ids, want.ids) and torch.allclose(got.weights, want.weights, rtol=1e-6, atol=0)
    assert resolve_backend("auto", torch.device("cuda"), config, None, needs_grad=True) == "reference"
    assert resolve_backend("auto", torch.device("cuda"), config, None, needs_grad=False) == "triton"
    if DEVICE == "cuda":
        xg = x.clone().requires_grad_(True)
        sg = scale.clone().requires_grad_(True)
        got = route(xg, config, bias=bias, expert_scale=sg)  # auto: the reference, differentiable
        assert got.weights.requires_grad
        got.weights.sum().backward()
        assert xg.grad is not None and sg.grad is not None and torch.isfinite(xg.grad).all()


def test_auto_backend_takes_the_reference_beyond_the_kernels_limits():
    """backend="auto" on CUDA tensors runs the kernel where one launch takes the config and layout, and the reference
    beyond docs/kernel.md's limits (where backend="triton" raises, above), never an error for a config route() accepts.
    resolve_backend reads no tensor: the CUDA device object is enough to check its choice on a CPU machine."""
    from moegate.router import resolve_backend

    cuda = torch.device("cuda")
    many = ExpertLayout(placement=ExpertPlacement(tuple(i % 4 for i in range(400)), 4))
    shared = ExpertLayout(shared_slots="global")
    for config, layout, want in (
        (RouterConfig(128, 8), None, "triton"),
        (RouterConfig(128, 64), None, "triton"),
        (RouterConfig(128, 65), None, "reference"),
        (RouterConfig(16384, 2), None, "triton"),
        (RouterConfig(16385, 2), None, "reference"),
        (RouterConfig(300, 2, n_group=3, topk_group=1), None, "triton"),  # 3 x 128 padded lanes
        (RouterConfig(4, 2), many, "reference"),  # 100 replicas of an expert
        (RouterConfig(8, 2, num_shared_experts=64), shared, "triton"),
        (RouterConfig(8, 2, num_shared_experts=65), shared, "reference"),
        (RouterConfig(8, 2, num_shared_experts=65), None, "triton"),  # no shared columns without shared slots
    ):
        assert resolve_backend("auto", cuda, config, layout) == want, (config, layout)
        assert resolve_backend("triton", cuda, config, layout) == "triton"  # explicit: route() raises instead
        assert resolve_backend("auto", torch.device("cpu"), config, layout) == "reference"
    assert resolve_backend("auto", cuda) == "triton"  # no config: the device and the install decide
    if DEVICE == "cuda":
        x = torch.randn(5, 128, device=DEVICE)
        got = route(x, RouterConfig(128, 65), backend="auto")
        want = route(x, RouterConfig(128, 65), backend="reference")
        assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)


@settings(max_examples=40 if FULL else 12, deadline=None, derandomize=True)
@given(
    E_per_group=st.integers(2, 12),
    n_group=st.integers(1, 5),
    data=st.data(),
)
def test_property_random_configs_match_reference(E_per_group, n_group, data):
    E = E_per_group * n_group
    topk_group = data.draw(st.integers(1, n_group))
    K = data.draw(st.integers(1, min(8, topk_group * E_per_group if n_group > 1 else E)))
    config = RouterConfig(
        E, K,
        scoring=data.draw(st.sampled_from(["softmax", "sigmoid", "sqrtsoftplus"])),
        selection=data.draw(st.sampled_from(["scores", "logits"])),
        logit_scale=data.draw(st.sampled_from([1.0, 0.75])),
        softcap=data.draw(st.sampled_from([None, 4.0])),
        has_correction_bias=data.draw(st.booleans()),
        n_group=n_group, topk_group=topk_group,
        group_score=data.draw(st.sampled_from(["top2_sum", "max"])),
        group_fill=data.draw(st.sampled_from(["exclude", "zero"])),
        renormalize=data.draw(st.booleans()),
        routed_scaling_factor=data.draw(st.sampled_from([1.0, 2.5])),
        num_shared_experts=data.draw(st.integers(0, 2)),
    )
    layout = ExpertLayout(
        shared_slots=data.draw(st.sampled_from(["none", "global", "per_rank"])),
        scale=data.draw(st.sampled_from(["in_weights", "on_output"])),
    )
    T = data.draw(st.sampled_from([1, 7, 33]))
    logits = tie_free_logits(T, E, data.draw(st.sampled_from(DTYPES)), seed=T + E)
    run_both(logits, config, layout, near_ties=config.has_correction_bias, **extras(config, T))


@needs_cuda
@pytest.mark.parametrize("E", [256, 8, 128], ids=["deepseek-v3-like", "mixtral-like-one-row-a-thread",
                                                  "qwen3-like-split-rows"])
def test_cuda_graph_replay_equals_eager(E, monkeypatch):
    import moegate.kernels.router as kr

    if E == 128:
        monkeypatch.setattr(kr, "split_rows_override", _gpu_split(4))
        config = RouterConfig(128, 8, renormalize=True, routed_scaling_factor=2.5, num_shared_experts=1)
    elif E == 256:
        config = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4,
                              routed_scaling_factor=2.5, num_shared_experts=1)
    else:
        config = RouterConfig(8, 2, scoring="sigmoid", has_correction_bias=True, routed_scaling_factor=2.5,
                              num_shared_experts=1)
    K = config.top_k
    placement = ExpertPlacement(tuple(range(E)) + tuple(range(0, E, 2)), E)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=4, placement=placement)
    T = 199
    logits = tie_free_logits(T, E)
    kw = extras(config, T)
    nv = torch.tensor([150], device=DEVICE)
    rec = RoutingRecorder(1, T, K, E, device=DEVICE)
    out = poisoned_out(T, K + 1)
    run = lambda: route(logits, config, layout, out=out, num_valid_tokens=nv, recorder=rec, home_rank=1,  # noqa: E731
                        backend="triton", **kw)
    run()  # warm-up: compile, build the placement tables
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for seed in range(3):
        logits.copy_(tie_free_logits(T, E, seed=seed + 10))
        nv.fill_(100 + seed)
        out[0].fill_(float("nan"))
        out[1].fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        replayed = (out[0].clone(), out[1].clone())
        eager = route(logits, config, layout, num_valid_tokens=nv, home_rank=1, backend="triton", **kw)
        assert torch.equal(replayed[1], eager.ids) and torch.equal(replayed[0], eager.weights)
        want = route(logits, config, layout, num_valid_tokens=nv, home_rank=1, backend="reference", **kw)
        assert_same_routing(replayed, want, logits, config, kw.get("bias"), near_ties=True)


def test_torch_compile_hash_routing():
    """Hash routing traced whole. The graph has no table contents to read: the fused op checks the table when the
    graph runs (once per table, a cache hit after an eager call), before its launch."""
    config = RouterConfig(64, 4, routing="hash", scoring="sigmoid")
    g = torch.Generator().manual_seed(4)
    table = torch.stack([torch.randperm(64, generator=g)[:4] for _ in range(32)]).to(DEVICE)
    T = 9
    logits = tie_free_logits(T, 64)
    tids = torch.randint(0, 32, (T,), generator=g).to(DEVICE)
    want = route(logits, config, token_ids=tids, hash_table=table, backend="triton")

    def f(x, t):
        return route(x, config, token_ids=t, hash_table=table, backend="triton").weights * 2

    torch._dynamo.reset()
    w = torch.compile(f, fullgraph=True, backend="inductor" if HAS_CUDA else "eager")(logits, tids)
    assert torch.equal(w / 2, want.weights) and torch.equal(want.ids.long(), table[tids].long())
    # A table first seen inside the compiled graph is still checked, when the graph runs, before the launch.
    bad = table.clone()
    bad[3, 1] = bad[3, 0]  # repeats an expert
    out = poisoned_out(T, 4)

    def h(x, t, tab):
        route(x, config, token_ids=t, hash_table=tab, out=out, backend="triton")
        return out[0] * 2

    torch._dynamo.reset()
    with pytest.raises(ValueError, match="repeats an expert"):
        torch.compile(h, fullgraph=True, backend="inductor" if HAS_CUDA else "eager")(logits, tids, bad)
    assert torch.isnan(out[0]).all() and (out[1] == -7).all()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_launch_on_the_logits_device():
    """Logits on cuda:1 while cuda:0 is current (a model spread over GPUs in one process): the launch goes to cuda:1
    and its current stream, as the reference's ops do."""
    config = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4)
    logits = tie_free_logits(37, 256).to("cuda:1")
    bias = torch.randn(256, generator=torch.Generator().manual_seed(1)).to("cuda:1") * 0.01
    with torch.cuda.device(0):
        got = route(logits, config, bias=bias, backend="triton")
    want = route(logits, config, bias=bias, backend="reference")
    assert got.ids.device == logits.device
    assert_same_routing(got, want, logits, config, bias, near_ties=True)


@needs_cuda
def test_cuda_graph_capture_with_hash_tables_and_placements():
    """A CUDA hash table is checked on the host once: a table route() has not seen yet cannot be captured (a clear
    ValueError, not a failed capture); its views (tables[layer]) are captured once each has been seen. A placement's
    device tables likewise."""
    config = RouterConfig(64, 4, routing="hash", scoring="sigmoid")
    g = torch.Generator().manual_seed(2)
    tables = torch.stack([torch.stack([torch.randperm(64, generator=g)[:4] for _ in range(32)])
                          for _ in range(3)]).to(DEVICE)
    T = 16
    logits = tie_free_logits(T, 64)
    tids = torch.randint(0, 32, (T,), generator=g).to(DEVICE)
    out = poisoned_out(T, 4)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="before capturing"):
        with torch.cuda.graph(graph):
            route(logits, config, token_ids=tids, hash_table=tables[0], out=out, backend="triton")
    for layer in range(3):
        route(logits, config, token_ids=tids, hash_table=tables[layer], out=out, backend="triton")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(3):
            route(logits, config, token_ids=tids, hash_table=tables[layer], out=out, backend="triton")
    out[1].fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[1].long(), tables[2][tids].long())
    # An EPLB placement's device tables are built on first use: likewise a clear error under capture, then captured.
    topk = RouterConfig(64, 4, scoring="sigmoid")
    layout = ExpertLayout(placement=ExpertPlacement(tuple(range(64)) + tuple(range(8)), 64))
    out = poisoned_out(T, 4)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="placement: .* before capturing"):
        with torch.cuda.graph(graph):
            route(logits, topk, layout, out=out, backend="triton")
    want = route(logits, topk, layout, backend="triton")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        route(logits, topk, layout, out=out, backend="triton")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[1], want.ids) and torch.equal(out[0], want.weights)


def test_torch_compile_fullgraph():
    config = RouterConfig(64, 6, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=2,
                          num_shared_experts=1)
    layout = ExpertLayout(shared_slots="global", scale="on_output")
    T = 37
    logits = tie_free_logits(T, 64)
    kw = extras(config, T)
    nv = torch.tensor([30], device=DEVICE)

    def f(x, bias, n):
        w, i = route(x, config, layout, bias=bias, num_valid_tokens=n, backend="triton")
        return w * 2, i

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="inductor" if HAS_CUDA else "eager")
    w, i = compiled(logits, kw["bias"], nv)
    want = route(logits, config, layout, num_valid_tokens=nv, backend="reference", **kw)
    assert_same_routing((w / 2, i), want, logits, config, kw["bias"], near_ties=True)

    # As engines call it: into preallocated outputs, with a recorder, and the packed words through route_triton
    # (the overlap checks read data pointers, which a traced graph has not: they run eagerly only).
    from moegate.kernels.router import route_triton

    rec = RoutingRecorder(2, T, 6, 64, device=DEVICE)
    out, packed = poisoned_out(T, 7), torch.full((T, 7), -7, dtype=torch.int32, device=DEVICE)

    def g(x, bias, n, w, i, p):
        route(x, config, layout, bias=bias, num_valid_tokens=n, out=(w, i), recorder=rec, layer=1, backend="triton")
        route_triton(x, config, layout, bias=bias, num_valid_tokens=n, out=(w, i), packed_out=p)
        return w.sum()

    torch._dynamo.reset()
    torch.compile(g, fullgraph=True, backend="inductor" if HAS_CUDA else "eager")(logits, kw["bias"], nv, *out, packed)
    assert_same_routing(out, want, logits, config, kw["bias"], near_ties=True)
    assert torch.equal(rec.layer_ids(1), want.ids[:, :6]) and (packed[:30] != -7).all()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_outputs_that_share_memory_with_an_input_are_refused(backend):
    """The kernel writes rows while other programs still read their inputs: an output buffer that holds the bias,
    expert_scale, token_ids, hash_table or num_valid_tokens (or a recorder's buffers holding an input) routed
    wrongly, silently (a review found live rows come back as padding). Refused before anything runs, on every
    backend."""
    T, E, K = 4, 8, 2
    x = torch.randn(T, E, device=DEVICE)

    def outs():
        return torch.zeros(T, K, device=DEVICE), torch.zeros(T, K, dtype=torch.int32, device=DEVICE)

    w, ids = outs()
    biased = RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True)
    with pytest.raises(ValueError, match=r"out\[0\] \(weights\) overlaps the bias"):
        route(x, biased, bias=w.view(-1), out=(w, ids), backend=backend)
    scaled = RouterConfig(E, K, scoring="sigmoid", has_expert_scale=True)
    with pytest.raises(ValueError, match="overlaps expert_scale"):
        route(x, scaled, expert_scale=w.view(-1), out=(w, ids), backend=backend)
    hashed = RouterConfig(E, K, routing="hash")
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    ids.view(-1)[:T] = torch.tensor([0, 1, 1, 0], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"out\[1\] \(ids\) overlaps token_ids"):
        route(x, hashed, token_ids=ids.view(-1)[:T], hash_table=table, out=(w, ids), backend=backend)
    w, ids = outs()
    ids.view(-1)[:4] = table.view(-1)
    with pytest.raises(ValueError, match="overlaps hash_table"):
        route(x, hashed, token_ids=torch.tensor([0, 1, 1, 0], device=DEVICE), hash_table=ids.view(-1)[:4].view(2, 2),
              out=(w, ids), backend=backend)
    w, ids = outs()
    ids[0, 0] = T
    with pytest.raises(ValueError, match="overlaps num_valid_tokens"):
        route(x, RouterConfig(E, K), num_valid_tokens=ids[0, :1], out=(w, ids), backend=backend)
    rec = RoutingRecorder(num_layers=1, max_tokens=T, top_k=K, num_experts=E, dtype=torch.int32, device=DEVICE)
    rec.ids.view(-1)[:T] = torch.tensor([0, 1, 1, 0], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="the recorder's ids overlaps token_ids"):
        route(x, hashed, token_ids=rec.ids.view(-1)[:T], hash_table=table, recorder=rec, backend=backend)
    w, ids = outs()  # apart from each other, all fine
    got = route(x, biased, bias=torch.zeros(E, device=DEVICE), out=(w, ids), backend=backend)
    assert got.ids is ids and (ids >= 0).all()
    if backend == "triton":  # and route_triton's packed_out, which the kernel writes too
        from moegate.kernels.router import route_triton

        packed = torch.zeros(T, K, dtype=torch.int32, device=DEVICE)
        with pytest.raises(ValueError, match="packed_out overlaps the bias"):  # through route()'s own check
            route_triton(x, biased, ExpertLayout(), bias=packed.view(torch.float32).view(-1), packed_out=packed)


def test_compiled_route_refuses_outputs_that_share_memory_with_an_input():
    """Traced by torch.compile, route() cannot compare data pointers (fake tensors have no memory), so the compiled
    call compares them in the fused op on the real tensors before its launch: out[0] holding the bias was launched
    and routed rows 1-3 on a bias the first programs had overwritten (a review, 2026-12-04)."""
    T, E, K = 4, 64, 2
    config = RouterConfig(E, K, scoring="sigmoid", has_correction_bias=True)
    x = tie_free_logits(T, E)
    buf = torch.zeros(E, device=DEVICE)

    def f(x, bias, w, i):
        route(x, config, bias=bias, out=(w, i), backend="triton")
        return i

    # The "eager" backend on every device: its graph hands the op the real, aliased tensors. Inductor refuses graph
    # inputs that alias a mutated one itself (torch 2.11 on the H200: an AssertionError in its AOT pass).
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    ids = torch.full((T, K), -7, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"out\[0\] \(weights\) overlaps the bias"):
        compiled(x, buf, buf[:T * K].view(T, K), ids)
    assert (ids == -7).all()  # nothing launched
    w = torch.zeros(T, K, device=DEVICE)
    compiled(x, buf, w, ids)  # apart: routes
    assert torch.equal(ids, route(x, config, bias=buf, backend="reference").ids)


def test_eager_calls_launch_directly_and_bump_the_outputs_versions(monkeypatch):
    """An eager call on plain tensors launches without the custom op (its dispatch cost more host time than the rest
    of route(): scripts/host_overhead.py) and bumps the version counters of what it writes, as the op does; under a
    dispatch mode (a user's, make_fx's, FakeTensorMode) the call goes through the op, which the mode then sees."""
    import inspect

    from torch.utils._python_dispatch import TorchDispatchMode

    import moegate.kernels.router as kr

    config = RouterConfig(64, 6, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=2)
    T = 5
    logits = tie_free_logits(T, 64)
    kw = extras(config, T)
    want = route(logits, config, backend="reference", **kw)
    launch, callers = kr._launch_on_device, []

    def launch_spy(*args):  # who launched: route_triton's eager path or the op's body
        callers.append(inspect.stack()[1].function)
        return launch(*args)

    monkeypatch.setattr(kr, "_launch_on_device", launch_spy)
    rec = RoutingRecorder(1, T, 6, 64, device=DEVICE)
    out, packed = poisoned_out(T, 6), torch.full((T, 6), -7, dtype=torch.int32, device=DEVICE)
    versions = [t._version for t in (*out, packed, rec.ids, rec.num_tokens)]
    kr.route_triton(logits, config, ExpertLayout(), out=out, packed_out=packed, recorder=rec, **kw)
    assert callers == ["_route_triton"]
    assert_same_routing(out, want, logits, config, kw["bias"], near_ties=True)
    assert torch.equal(rec.layer_ids(0), want.ids) and (packed != -7).all()
    assert all(t._version > v for t, v in zip((*out, packed, rec.ids, rec.num_tokens), versions, strict=True))
    with torch.inference_mode():  # inference tensors keep no version counter: written all the same
        out = poisoned_out(T, 6)
        route(logits, config, out=out, backend="triton", **kw)
    assert_same_routing(out, want, logits, config, kw["bias"], near_ties=True)

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    out = poisoned_out(T, 6)
    with Seen() as seen:
        route(logits, config, out=out, backend="triton", **kw)
    assert callers[-1] == "_route_op" and "moegate.route_fused.default" in seen.ops
    assert_same_routing(out, want, logits, config, kw["bias"], near_ties=True)
    assert kr._plain_eager(logits)
    with Seen():
        assert not kr._plain_eager(logits)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as fake:
        assert not kr._plain_eager(fake.from_tensor(logits))
    assert not kr._plain_eager(torch.nn.Parameter(logits))  # a subclass
    under_jit = []
    torch.jit.trace(lambda t: under_jit.append(kr._plain_eager(t)) or t * 1, logits, check_trace=False)
    assert under_jit == [False]
    # make_fx on fake tensors: the op in the graph, and no data pointer read where route() writes into no given buffer
    from torch.fx.experimental.proxy_tensor import make_fx

    plain = RouterConfig(64, 6, scoring="sigmoid")
    graph = make_fx(lambda t: route(t, plain, backend="triton").ids, tracing_mode="fake")(logits)
    assert "moegate.route_fused" in str(graph.code)


def test_pnorm_of_weights_whose_powers_are_subnormal():
    """Weights near 1e-20 (sigmoid of -45): their squares are subnormal and their cubes 0 in fp32; the GPU flushed
    the subnormal powers (H200 run 107: norms of 0, weights 7-9x too large) and the interpreter clamped the power's
    input at 1e-38. Both kernel and reference scale by the row's largest weight first: the routed weights' p-norm
    is 1, as in fp64, also where w ** p underflows. The same for weights near 1 and K = 1."""
    logits = torch.tensor([[-45.0, -50.0, -47.0, -60.0], [-44.0, -44.5, -90.0, -46.0], [-80.0, -79.5, -99.0, -85.0],
                           [0.5, -0.25, 3.0, 1.0]], device=DEVICE)
    for p in (2.0, 3.0, 0.5):
        for K in (1, 2, 3):
            config = RouterConfig(4, K, scoring="sigmoid", renorm_p=p, renorm_eps=0.0)
            got, want = run_both(logits, config, tol="pnorm")
            w64 = torch.sigmoid(logits.double().cpu()).gather(1, got.ids.long().cpu())
            exact = w64 / w64.pow(p).sum(dim=1, keepdim=True).pow(1.0 / p)
            torch.testing.assert_close(got.weights.double().cpu(), exact, rtol=1e-5, atol=0)
