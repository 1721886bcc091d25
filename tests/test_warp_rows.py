"""The rows-on-warps kernel (kernels/warp_rows_kernel.py: large launches of sigmoid / sqrt-softplus rows with a bias,
a row a warp) against the reference. On the CPU it runs under the interpreter (test_kernel.py sets it up), forced
onto small T with warp_rows_override; on a GPU also at the T where the launcher takes it by itself."""

import dataclasses

import pytest
import torch
from test_kernel import (
    DEVICE,
    FULL,
    HAS_CUDA,
    TOLERANCES,
    _counted,
    near_tied_group_logits,
    needs_cuda,
    run_both,
    tie_free_logits,
)

import moegate.kernels.router as kr
from moegate import ExpertLayout, ExpertPlacement, RouterConfig, RoutingRecorder, route

TOKENS = (1, 5, 37, 4097) if FULL else (1, 5, 37)


def _dsv3(**kw):
    args = dict(scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4, routed_scaling_factor=2.5)
    args.update(kw)
    return RouterConfig(256, kw.pop("top_k", 8), **{k: v for k, v in args.items() if k != "top_k"})


CONFIGS = {
    "deepseek-v3": _dsv3(),
    "group-max": _dsv3(group_score="max", topk_group=2, n_group=4, top_k=6),  # 64-lane groups: no KEPT
    "every-group-kept": _dsv3(topk_group=8),
    "groups-of-16": _dsv3(n_group=16, topk_group=8),  # 8 x 16 = 128 kept lanes: KEPT
    "sigmoid": RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, routed_scaling_factor=2.827),
    "deepseek-v4": RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True, routed_scaling_factor=1.5),
    "no-renormalize": RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True, renormalize=False),
    "eps-clamp": RouterConfig(128, 4, scoring="sqrtsoftplus", has_correction_bias=True, renorm_eps_mode="clamp",
                              renorm_eps=1e-3),
    "512-top22": RouterConfig(512, 22, scoring="sigmoid", has_correction_bias=True),
    "top-31": RouterConfig(128, 31, scoring="sigmoid", has_correction_bias=True, n_group=4, topk_group=4),
}


@pytest.fixture(params=[(8, (1, 2)), (32, 2)], ids=["t8", "t32"])
def forced(request, monkeypatch):
    """The rows-on-warps path at every T, a row on 8 threads (4 rows a warp; one warp a program without groups, two
    with) or on 32 (two warps a program); the launches recorded (still run)."""
    monkeypatch.setattr(kr, "warp_rows_override", True)
    monkeypatch.setattr(kr, "WARP_ROWS_THREADS", request.param[0])
    monkeypatch.setattr(kr, "WARP_ROWS_WARPS", request.param[1])
    seen = []
    monkeypatch.setattr(kr.wrk, "_warp_rows_kernel", kr._LaunchRecorder(kr.wrk._warp_rows_kernel, seen))
    monkeypatch.setattr(kr.rk, "_route_kernel", kr._LaunchRecorder(kr.rk._route_kernel, seen))
    return seen


def _rows_a_program(grouped):
    return kr._by_groups(kr.WARP_ROWS_WARPS, grouped) * 32 // kr.WARP_ROWS_THREADS


def _spread(x, plain, grouped):
    """Rows laid out for programs of two rows (rows 2p and 2p + 1: program p) moved to programs of R rows (rows pR and
    pR + 1, the other R - 2 rows copies of x's row `plain`, one that takes the fast path), so that each program holds
    the same rows of x whatever the launch's R: (logits, where each row of x went)."""
    R, T = _rows_a_program(grouped), x.shape[0]
    where = [(i // 2) * R + i % 2 for i in range(T)]
    if R == 2:
        return x, where
    out = x[plain].repeat(-(-T // 2) * R, 1)
    out[where] = x
    return out, where


def _bias(E, dtype=torch.float32, seed=0, low=0.0):
    g = torch.Generator().manual_seed(seed)
    return (low + torch.randint(0, 16, (E,), generator=g) / 64).to(dtype).to(DEVICE)


def _logits(T, E, dtype=torch.float32, seed=0):
    """Random logits (keys of random rows: the fast path, with a rare close row sent to the exact path)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, E, generator=g) * 2).to(dtype).to(DEVICE)


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "forced-exact"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_routes_like_the_reference(name, exact, forced, monkeypatch):
    """Every config the path takes, fp32 logits, random and tie-free rows, into poisoned outputs; the fast path and
    the exact path (every row of every program forced down it) both route like the reference."""
    monkeypatch.setattr(kr, "force_exact_override", exact)
    config = CONFIGS[name]
    E = config.num_experts
    for T in TOKENS:
        for logits in (_logits(T, E, seed=T), tie_free_logits(T, E, seed=T) - 4):
            forced.clear()
            run_both(logits, config, bias=_bias(E, seed=T))
            assert forced and "R" in forced[0], f"{name} T={T}: the launch took the router kernel"
            kept = config.n_group > 1 and config.topk_group * config.group_size == 128
            assert forced[0]["KEPT"] is kept


VARIANT_CONFIGS = {
    "dsv3-top1": _dsv3(top_k=1), "dsv3-top3": _dsv3(top_k=3), "dsv3-top7": _dsv3(top_k=7),
    "deepseek-v3": CONFIGS["deepseek-v3"], "group-max": CONFIGS["group-max"], "groups-of-16": CONFIGS["groups-of-16"],
    "every-group-kept": CONFIGS["every-group-kept"],
    "sigmoid-top3": RouterConfig(256, 3, scoring="sigmoid", has_correction_bias=True, routed_scaling_factor=2.5),
}


@pytest.mark.parametrize("name", list(VARIANT_CONFIGS))
def test_fast_path_variants_route_alike(name, forced, monkeypatch):
    """The fast path's three forms of 2026-12-07 against the kernel before them, each alone and all, routing like
    the reference and like each other (the same ids; weights within the tolerance: on a GPU the renormalization's sum
    over a [KE, R] tile may round an ulp apart from the wider tile's): the epilogue on a [KE, R] tile of the K
    winners (WARP_ROWS_NARROW, KE the power of 2 >= K: 1, 4, 8 against the words' 8 or 16) and the kept groups by
    rounds of a max (WARP_ROWS_GROUP_ROUNDS, where they are at most half the groups: 4 of 8, 2 of 4, 8 of 16;
    counting for 8 of 8), the words past the first loser found only where _repair runs (WARP_ROWS_LAZY_EXTRA); rows
    beside them that take _repair (tied winners) or the exact path (tied keys, a NaN, near-tied groups) too."""
    config = VARIANT_CONFIGS[name]
    logits = _logits(37, 256, seed=len(name))
    logits[3, 32:40] = logits[3, 32:40].max() + 1  # eight tied winners: _repair orders them by id
    logits[9, ::16] = 9.0  # sixteen tied keys, across groups: more than _repair's candidates, the exact path
    logits[20, 5] = float("nan")  # a NaN logit: the exact path
    outs = []
    for narrow, rounds, lazy in ((False, False, False), (True, False, False), (False, True, False),
                                 (False, False, True), (True, True, True)):
        monkeypatch.setattr(kr, "WARP_ROWS_NARROW", narrow)
        monkeypatch.setattr(kr, "WARP_ROWS_GROUP_ROUNDS", rounds)
        monkeypatch.setattr(kr, "WARP_ROWS_LAZY_EXTRA", lazy)
        forced.clear()
        outs.append(run_both(logits, config, bias=torch.zeros(256, device=DEVICE))[0])
        launch = forced[0]
        assert "R" in launch and (launch["NARROW"], launch["GROUP_ROUNDS"], launch["LAZY_EXTRA"]) == (narrow, rounds,
                                                                                                      lazy)
        if config.n_group == 8 and config.topk_group == 4:
            # near-tied 4th and 5th groups: every program on the exact path (the group margin's flag), and the fast
            # launch against a forced exact one (the reference's exp differs on the CPU)
            tied, zero = near_tied_group_logits(8, 256, 8), torch.zeros(256, device=DEVICE)
            fast, (redone, _repaired, programs) = _counted(tied, config, bias=zero)
            assert redone == programs == -(-8 // _rows_a_program(True)), (narrow, rounds, redone, programs)
            monkeypatch.setattr(kr, "force_exact_override", True)
            exact = route(tied, config, bias=zero, backend="triton")
            monkeypatch.setattr(kr, "force_exact_override", False)
            torch.testing.assert_close(fast.ids, exact.ids, rtol=0, atol=0)
            torch.testing.assert_close(fast.weights, exact.weights, **TOLERANCES["default"])
    for other in outs[1:]:
        torch.testing.assert_close(other.ids, outs[0].ids, rtol=0, atol=0)
        torch.testing.assert_close(other.weights, outs[0].weights, **TOLERANCES["default"])


def _kept_by_dtype(logits_dtype, bias_dtype) -> bool:
    """Whether grouped rows whose kept lanes are 128 round on them (KEPT) with these dtypes: the bias through the
    logits' pointers where the two share a dtype, else through its own on 8 threads a row (WARP_ROWS_MIXED_KEPT)."""
    return logits_dtype == bias_dtype or (kr.WARP_ROWS_THREADS <= 8 and kr.WARP_ROWS_MIXED_KEPT)


@pytest.mark.parametrize("logits_dtype,bias_dtype", [
    (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
    (torch.float32, torch.bfloat16),
])
def test_half_logits_and_biases(logits_dtype, bias_dtype, forced):
    """bf16 / fp16 logits take 256-lane chunks; the kept groups' bias comes through the logits' pointers where the
    two share a dtype, through its own on 8 threads a row (KEPT), else the rounds run on the whole row."""
    config = CONFIGS["deepseek-v3"]
    for T in TOKENS:
        forced.clear()
        run_both(_logits(T, 256, logits_dtype, seed=T), config, bias=_bias(256, bias_dtype, seed=T))
        assert forced[0]["LT"] == kr.WARP_ROWS_THREADS * (4 if logits_dtype == torch.float32 else 8)
        assert forced[0]["KEPT"] is _kept_by_dtype(logits_dtype, bias_dtype)
        assert forced[0]["BIAS_BY_OFFSET"] is (forced[0]["KEPT"] and logits_dtype == bias_dtype)


@pytest.mark.parametrize("stride,logits_dtype,bias_dtype", [
    (260, torch.float32, torch.float32), (264, torch.float32, torch.float32), (264, torch.bfloat16, torch.bfloat16),
    (264, torch.bfloat16, torch.float32), (272, torch.bfloat16, torch.bfloat16), (288, torch.float32, torch.float32),
])
def test_padded_rows_route_like_the_reference(stride, logits_dtype, bias_dtype, forced, monkeypatch):
    """Logits whose rows lie `stride` elements apart (a view of a wider buffer: 16-byte aligned rows, the kernel takes
    them) route like the reference into poisoned outputs, the lean forms and the kept lanes through shared memory on.
    Triton proves 16-byte aligned rows by itself only for a stride that is a multiple of 16 elements; at others the
    loads took another layout, on which the packed round steps took the max across four rows (wrong ids on a GPU).
    The kernel now states the rows' alignment, so every stride here takes the layout, the packed steps and (bf16
    logits) the kept lanes through shared memory of contiguous rows (test_sass.py checks the layouts)."""
    monkeypatch.setattr(kr, "WARP_ROWS_LEAN", True)
    monkeypatch.setattr(kr, "WARP_ROWS_SMEM_KEPT", True)
    config = CONFIGS["deepseek-v3"]
    for T in TOKENS:
        base = _logits(T, stride, logits_dtype, seed=T + stride)
        logits = base[:, :256]
        assert logits.stride(0) == stride and logits.data_ptr() % 16 == 0
        forced.clear()
        run_both(logits, config, bias=_bias(256, bias_dtype, seed=T))
        assert forced and "R" in forced[0], "the launch took the router kernel"
        if forced[0]["LT"] == 64:  # bf16 on 8 threads a row
            assert forced[0]["SMEM_KEPT"] is forced[0]["KEPT"]


def _rows_beside_repair_and_exact(T, logits_dtype, bias_dtype, seed):
    """T rows of 256 logits (T > 32) and a bias, with rows on _repair and the exact path among plain ones: eight tied
    winners (row 3: _repair orders them by id), a NaN logit (20), -inf at the best lane (24: its group would be kept)
    and at the worst (28: its group would be dropped), +inf (32)."""
    logits = _logits(T, 256, seed=seed).float()
    logits[3, 32:40] = logits[3, 32:40].max() + 1
    logits[20, 5] = float("nan")
    logits[24, logits[24].argmax()] = float("-inf")
    logits[28, logits[28].argmin()] = float("-inf")
    logits[32, 100] = float("inf")
    return logits.to(logits_dtype), _bias(256, bias_dtype, seed=T)


@pytest.mark.parametrize("logits_dtype,bias_dtype", [
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
])
@pytest.mark.parametrize("name", ["deepseek-v3", "sigmoid-top3"])
def test_lean_forms_route_bit_for_bit_alike(name, logits_dtype, bias_dtype, forced, monkeypatch):
    """WARP_ROWS_LEAN (bf16 widened a 32-bit pair at a time, the kept lanes' distance words by one mad.lo and their
    rounds' steps four words at a time, their wider bias addressed from the logits' pointers, their keys without the
    finite check where the first pass flags the row) changes no bit of the outputs: both forms compute the same
    values. The interpreter runs the bias's addresses and the flags but the plain forms of the other three (the flag
    still reaches the launch); on a GPU this compares the PTX forms against the compiler's, with rows beside them on
    _repair (tied winners) and on the exact path (a NaN, -inf and +inf logits, in a group that would be kept and in
    one that would not). Each row with a NaN or an infinity is redone on the exact path either way."""
    config = VARIANT_CONFIGS[name]
    for T in (37, 200):
        logits, bias = _rows_beside_repair_and_exact(T, logits_dtype, bias_dtype, seed=T)
        outs = []
        for lean in (False, True):
            monkeypatch.setattr(kr, "WARP_ROWS_LEAN", lean)
            forced.clear()
            outs.append(run_both(logits, config, bias=bias)[0])
            assert "R" in forced[0] and forced[0]["LEAN"] is lean
            for r in (20, 24, 28, 32):  # each alone in a launch: its program redoes it
                _, (redone, _r, programs) = _counted(logits[r:r + 1], config, bias=bias)
                assert (redone, programs) == (1, 1), (r, lean)
        torch.testing.assert_close(outs[1].ids, outs[0].ids, rtol=0, atol=0)
        torch.testing.assert_close(outs[1].weights, outs[0].weights, rtol=0, atol=0)


@pytest.mark.parametrize("logits_dtype,bias_dtype", [
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
])
def test_smem_kept_routes_bit_for_bit_alike(logits_dtype, bias_dtype, forced, monkeypatch):
    """WARP_ROWS_SMEM_KEPT (off by default): DeepSeek-V3's kept lanes' keys taken from the first pass's through shared
    memory (inline PTX, GPU only) are the bits the second read computes (the same fast formula on the same logits and
    bias), so both give the same ids and weights, with rows beside them on _repair (tied winners) and on the exact
    path (NaN, -inf, +inf logits). The launch takes it for 16-bit logits only; the interpreter runs the second read
    either way (the flag still reaches the launch)."""
    config = VARIANT_CONFIGS["deepseek-v3"]
    for T in (37, 200):
        logits, bias = _rows_beside_repair_and_exact(T, logits_dtype, bias_dtype, seed=T + 7)
        outs = []
        for smem in (False, True):
            monkeypatch.setattr(kr, "WARP_ROWS_SMEM_KEPT", smem)
            forced.clear()
            outs.append(run_both(logits, config, bias=bias)[0])
            on = smem and logits_dtype != torch.float32 and forced[0].get("LT") == 64  # 8 threads a row
            assert "R" in forced[0] and forced[0]["SMEM_KEPT"] is on
        torch.testing.assert_close(outs[1].ids, outs[0].ids, rtol=0, atol=0)
        torch.testing.assert_close(outs[1].weights, outs[0].weights, rtol=0, atol=0)


def _edge_rows(E, scoring, group_size=0, group_max=False):
    """Rows the fast path must send to the exact path or to _repair (which route them like the reference), one a
    program at R = 2 beside a plain row: (logits, {row: why} of the exact path, {row: why} of _repair). Bias -0.5
    (sigmoid) / -0.8 (sqrt-softplus) with logits >= 1 keeps every key >= +0.2."""
    T = 16
    x = 1.0 + tie_free_logits(T, E, seed=E).abs().cpu() / 4
    why = {}
    x[0, 3] = float("nan")
    why[0] = "a NaN logit"
    x[2, 10] = float("-inf")
    why[2] = "a -inf logit"
    x[4] = float("nan")
    why[4] = "every logit NaN: weights 0"
    if scoring == "sigmoid":
        x[6, 20] = float("inf")  # scores 1.0 (sqrt-softplus's inf would make the weights NaN)
        why[6] = "a +inf logit"
    x[8] = -3.0 - x[8]
    why[8] = "every key negative"
    x[10, 5] = x[10, 40] = x[10].max() + 0.5
    repaired = {10: "the two best logits equal (a tie: to the lower id)"}
    x[12, :] = 1.5
    why[12] = "every logit equal"
    if not group_size:  # (with groups, the groups' scores tie first: straight to the exact path)
        repaired[12] = "every logit equal: _repair tries, its bound fails (more equal keys than candidates)"
    if group_size:
        x[14, group_size:2 * group_size] = -3.0 - x[14, group_size:2 * group_size]
        if group_max:
            why[14] = "a group's top key negative"
        else:
            x[14, group_size + 1] = 2.0
            why[14] = "a group's second key negative"
    return x.to(DEVICE), why, repaired


@pytest.mark.parametrize("config", [
    _dsv3(), _dsv3(group_score="max", topk_group=2, n_group=4),
    RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True),
    RouterConfig(256, 6, scoring="sqrtsoftplus", has_correction_bias=True),
], ids=["groups", "group-max", "sigmoid", "sqrtsoftplus"])
def test_edge_rows_take_the_exact_path(config, forced):
    """NaN / -inf / +inf logits, all-dead rows, negative keys, every key equal: their programs (and only theirs) redo
    their rows on the exact path; two equal best keys: _repair (both counted: a program whose repair fails takes the
    exact path too); every row routes like the reference."""
    E = config.num_experts
    logits, why, repaired = _edge_rows(E, config.scoring, config.group_size if config.n_group > 1 else 0,
                             config.group_score == "max")
    logits, where = _spread(logits, 1, config.n_group > 1)
    bias = torch.full((E,), -0.5 if config.scoring == "sigmoid" else -0.8, device=DEVICE)
    got, _ = run_both(logits, config, bias=bias)
    assert (got.weights[where[4]] == 0).all()
    assert "R" in forced[0] and forced[0]["R"] == _rows_a_program(config.n_group > 1)
    _, (redone, repairs, programs) = _counted(logits, config, bias=bias)
    assert programs == len(where) // 2
    assert redone == len({r // 2 for r in why}), (redone, why)
    assert repairs == len({r // 2 for r in repaired}), (repairs, repaired)


def test_a_close_row_is_redone_and_its_neighbours_are_not(forced):
    """Keys closer than the fast keys' error (an ulp of bias apart) send their program to the exact path; the
    others stay on the fast path."""
    config = RouterConfig(256, 8, scoring="sigmoid", has_correction_bias=True)
    logits = _logits(8, 256, seed=3)
    logits[5, :] = 0.25  # every score equal: the keys are the biases
    logits, _ = _spread(logits, 0, False)
    bias = _bias(256, seed=3)
    bias[::2] = 0.1
    bias[1::2] = torch.nextafter(torch.tensor(0.1), torch.tensor(1.0)).item()  # an ulp above
    run_both(logits, config, bias=bias)
    _, (redone, _r, programs) = _counted(logits, config, bias=bias)
    assert (redone, programs) == (1, 4)


@pytest.mark.parametrize("case", [
    "softmax", "no-bias", "softcap", "logit-scale", "logits-selection", "zero-fill", "p-norm", "384-experts",
    "strided-columns", "bias-strided", "top-32", "placement", "shared", "padding", "recorder", "packed",
    "expert-scale",
])
def test_what_it_cannot_take_goes_to_the_router_kernel(case, forced):
    """Each config or layout outside the path's reach launches the router kernel (still like the reference)."""
    E, T = 256, 6
    config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True)
    layout, kw = ExpertLayout(), {}
    logits = _logits(T, E)
    bias = _bias(E)
    if case == "softmax":
        config = RouterConfig(E, 8, has_correction_bias=True)
    elif case == "no-bias":
        config, bias = RouterConfig(E, 8, scoring="sigmoid"), None
    elif case == "softcap":
        config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, softcap=8.0)
    elif case == "logit-scale":
        config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, logit_scale=0.5)
    elif case == "logits-selection":
        config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, selection="logits")
    elif case == "zero-fill":
        config = _dsv3(group_fill="zero")
    elif case == "p-norm":
        config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, renorm_p=2.0)
    elif case == "384-experts":
        config = RouterConfig(384, 8, scoring="sigmoid", has_correction_bias=True)
        logits, bias = _logits(T, 384), _bias(384)
    elif case == "strided-columns":
        logits = _logits(T, 2 * E)[:, ::2]
    elif case == "bias-strided":
        bias = _bias(2 * E)[::2]
    elif case == "top-32":
        config = RouterConfig(E, 32, scoring="sigmoid", has_correction_bias=True)
    elif case == "placement":
        layout = ExpertLayout(ep_size=2, placement=ExpertPlacement(tuple(range(E)), E))
    elif case == "shared":
        config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, num_shared_experts=1)
        layout = ExpertLayout(shared_slots="global")
    elif case == "padding":
        kw["num_valid_tokens"] = T - 2
    elif case == "recorder":
        kw["recorder"] = RoutingRecorder(num_layers=1, max_tokens=T, top_k=8, num_experts=E, device=DEVICE)
    elif case == "packed":  # route_triton's own option
        packed = torch.full((T, 8), -7, dtype=torch.int32, device=DEVICE)
        weights, ids = kr.route_triton(logits, config, layout, bias=bias, packed_out=packed)
        want = route(logits, config, layout, bias=bias, backend="reference")
        torch.testing.assert_close(ids, want.ids, rtol=0, atol=0)
        torch.testing.assert_close(weights, want.weights, **TOLERANCES["default"])
        assert torch.equal(packed >> 16, ids)
        assert forced and all("R" not in launch for launch in forced)
        return
    elif case == "expert-scale":
        config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, has_expert_scale=True)
        kw["expert_scale"] = (0.5 + torch.rand(E)).to(DEVICE)
    run_both(logits, config, layout, **({"bias": bias} if bias is not None else {}), **kw)
    assert forced and all("R" not in launch for launch in forced), case


def test_where_the_launcher_takes_it(monkeypatch):
    """Without an override: from WARP_ROWS_MIN_TOKENS on, rows of WARP_ROWS_LANES lanes, with groups from
    WARP_ROWS_GROUPS[the logits' element size] (None or absent: never; nothing launched here)."""
    low, f32, b16, cases = kr.WARP_ROWS_MIN_TOKENS, torch.float32, torch.bfloat16, []
    for name, T, want in (("deepseek-v4", low - 1, False), ("deepseek-v4", low, True), ("sigmoid", 65536, True),
                          ("deepseek-v3", 65536, False), ("512-top22", 65536, False), ("eps-clamp", 65536, False)):
        cases += [(name, T, f32, want, {}), (name, T, b16, want, {4: None, 2: None})]
    cases += [("deepseek-v3", low, f32, True, {4: low}), ("deepseek-v3", low - 1, f32, False, {4: low}),
              ("deepseek-v3", 2 * low, f32, True, {4: 2 * low}), ("deepseek-v3", 2 * low - 1, f32, False, {4: 2 * low}),
              ("deepseek-v3", 2 * low, b16, False, {4: 2 * low}), ("deepseek-v3", 2 * low, f32, False, {2: low}),
              ("deepseek-v3", low, b16, True, {4: 2 * low, 2: low}), ("deepseek-v3", low - 1, b16, False, {2: low})]
    # the launcher's own thresholds: fp32 logits from 32768, bf16 / fp16 from 16384
    for T, dtype, want in ((32768, f32, True), (32767, f32, False), (16384, b16, True), (16383, b16, False),
                           (16384, torch.float16, True), (16384, f32, False)):
        cases.append(("deepseek-v3", T, dtype, want, kr.WARP_ROWS_GROUPS))
    for name, T, dtype, want, groups in cases:
        monkeypatch.setattr(kr, "WARP_ROWS_GROUPS", groups)
        config = CONFIGS[name]
        E = config.num_experts
        with kr.recorded_launches(run=False) as seen:
            route(torch.zeros(T, E, dtype=dtype, device=DEVICE), config, bias=_bias(E), backend="triton")
        assert ("R" in seen[0]) is want, (name, T, dtype, groups)
        if want:  # the launcher's shape: a row on 8 threads (16-byte loads), one warp, 64 registers, groups or not
            shape = (seen[0]["R"], seen[0]["LT"], seen[0]["num_warps"], seen[0].get("maxnreg"))
            assert shape == (4, 8 * 16 // dtype.itemsize, 1, 64), (name, dtype, shape)


@pytest.mark.parametrize("override,value", [("approx_keys_override", False), ("prefetch_rows_override", 3),
                                            ("launch_override", (1, 1)), ("use_pdl_override", False)])
def test_router_kernel_overrides_keep_it_out(override, value, monkeypatch):
    """A router-kernel override (an A/B variant, a test) sends a launch the rows-on-warps kernel would take to the
    router kernel, so that what the override names is what runs; warp_rows_override still forces it on."""
    config, T = CONFIGS["deepseek-v4"], kr.WARP_ROWS_MIN_TOKENS
    logits = torch.zeros(T, 256, device=DEVICE)
    for forced_on, want in ((None, False), (True, True)):
        monkeypatch.setattr(kr, override, value)
        monkeypatch.setattr(kr, "warp_rows_override", forced_on)
        with kr.recorded_launches(run=False) as seen:
            route(logits, config, bias=_bias(256), backend="triton")
        assert ("R" in seen[0]) is want, (override, forced_on)
    monkeypatch.setattr(kr, override, None)
    monkeypatch.setattr(kr, "warp_rows_override", None)
    with kr.recorded_launches(run=False) as seen:
        route(logits, config, bias=_bias(256), backend="triton")
    assert "R" in seen[0]


@needs_cuda
def test_cuda_graph_replay_and_compile_match_eager():
    """At T = WARP_ROWS_MIN_TOKENS (the launcher's own choice): a CUDA graph's replays equal eager on the logits the
    graph reads at each replay (new values copied in), into outputs poisoned before the capture and each replay; and
    torch.compile(fullgraph) equals eager."""
    config = CONFIGS["deepseek-v4"]
    T = kr.WARP_ROWS_MIN_TOKENS
    logits, bias = _logits(T, 256, seed=9), _bias(256, seed=9)
    with kr.recorded_launches(run=False) as seen:
        route(logits, config, bias=bias, backend="triton")
    assert "R" in seen[0]
    out = (torch.empty(T, config.top_k, device=DEVICE), torch.empty(T, config.top_k, dtype=torch.int32, device=DEVICE))

    def poison():
        out[0].fill_(float("nan"))
        out[1].fill_(-7)

    static = logits.clone()
    route(static, config, bias=bias, backend="triton", out=out)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    poison()
    with torch.cuda.graph(graph):
        route(static, config, bias=bias, backend="triton", out=out)
    for seed in (10, 11):
        static.copy_(_logits(T, 256, seed=seed))
        eager = route(static, config, bias=bias, backend="triton")
        poison()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out[1], eager.ids, rtol=0, atol=0)
        torch.testing.assert_close(out[0], eager.weights, rtol=0, atol=0)
    eager = route(logits, config, bias=bias, backend="triton")
    compiled = torch.compile(lambda x: route(x, config, bias=bias, backend="triton"), fullgraph=True)(logits)
    torch.testing.assert_close(compiled.ids, eager.ids, rtol=0, atol=0)
    torch.testing.assert_close(compiled.weights, eager.weights, rtol=0, atol=0)


@pytest.mark.skipif(not HAS_CUDA, reason="T = 65536 takes minutes under the interpreter")
@pytest.mark.parametrize("name,groups", [("deepseek-v3", False), ("deepseek-v3", True), ("deepseek-v4", False),
                                         ("512-top22", False)])
def test_large_launches_route_like_the_reference(name, groups, monkeypatch):
    """The benchmark's sizes, as the launcher picks the path (groups: fp32 logits' WARP_ROWS_GROUPS at 32768, so
    DeepSeek-V3 takes the rows-on-warps kernel at each T; else never): T = 32768 and 65536 (the last program full),
    65535."""
    monkeypatch.setattr(kr, "WARP_ROWS_GROUPS", {4: 32768} if groups else {})
    config = CONFIGS[name]
    E = config.num_experts
    for T in (32768, 65535, 65536):
        run_both(_logits(T, E, seed=T), config, bias=_bias(E, seed=T))


def test_near_tied_groups_take_the_exact_path(forced, monkeypatch):
    """Groups 3 and 4 with top2_sum scores a few ulps apart (their experts far apart), the fourth kept group and
    the first dropped one: only the group margin can send these rows to the exact path; the fast and the forced exact
    path must agree. (Not with the reference on the CPU: the two scores are an ulp apart, and numpy's exp and torch's
    round differently there; test_kernel.py's near-tied-groups test compares the same two paths.)"""
    E, G, T = 256, 8, 32
    config = RouterConfig(E, 8, scoring="sigmoid", has_correction_bias=True, n_group=G, topk_group=4,
                          renormalize=False)
    logits = near_tied_group_logits(T, E, G)
    bias = torch.zeros(E, device=DEVICE)
    fast, (redone, _r, programs) = _counted(logits, config, bias=bias)
    assert redone == programs == -(-T // _rows_a_program(True))
    monkeypatch.setattr(kr, "force_exact_override", True)
    exact = route(logits, config, bias=bias, backend="triton")
    torch.testing.assert_close(fast.ids, exact.ids, rtol=0, atol=0)
    torch.testing.assert_close(fast.weights, exact.weights, rtol=0, atol=0)



@pytest.mark.parametrize("extra", [1, 0])
@pytest.mark.parametrize("name,bias_dtype,mixed_kept", [
    ("deepseek-v3", torch.float32, True), ("deepseek-v3", torch.bfloat16, False), ("deepseek-v3", torch.bfloat16, True),
    ("group-max", torch.float32, True), ("sigmoid", torch.float32, True), ("deepseek-v4", torch.float32, True),
    ("512-top22", torch.float32, True),
], ids=["groups-kept", "groups-whole-row", "groups-kept-mixed", "group-max", "sigmoid", "sqrtsoftplus", "512-top22"])
def test_close_winners_are_repaired(name, bias_dtype, mixed_kept, extra, forced, monkeypatch):
    """Two winners' keys equal (row 1: the first two; row 3: the K-th and the first loser), the rest tie-free: the
    fast keys cannot order them; _repair reorders its K + 1 + EXTRA candidates on exact keys (counted) and no program
    takes the exact path, except at the boundary with EXTRA = 0 (the bound on the other lanes then needs the loser's
    fast key below the K-th exact one). Row 5: the K-th, the first and the second loser equal, more than the bound
    allows whatever EXTRA: repaired, then redone. A constant bias keeps the keys in the logits' order."""
    monkeypatch.setattr(kr, "WARP_ROWS_EXTRA", extra)
    monkeypatch.setattr(kr, "WARP_ROWS_MIXED_KEPT", mixed_kept)
    config = CONFIGS[name]
    E, K = config.num_experts, config.top_k
    logits = tie_free_logits(8, E, seed=21)
    bias = torch.zeros(E, dtype=bias_dtype, device=DEVICE)
    one_more = route(logits, dataclasses.replace(config, top_k=K + 1), bias=bias, backend="reference").ids.long()
    logits[1, one_more[1, 1]] = logits[1, one_more[1, 0]]
    logits[3, one_more[3, K]] = logits[3, one_more[3, K - 1]]
    two_more = route(logits, dataclasses.replace(config, top_k=K + 2), bias=bias, backend="reference").ids.long()
    logits[5, two_more[5, K:K + 2]] = logits[5, two_more[5, K - 1]].item()
    logits, where = _spread(logits, 0, config.n_group > 1)
    forced.clear()
    got, _ = run_both(logits, config, bias=bias)
    assert forced[0]["KEPT"] is (config.n_group > 1 and _kept_by_dtype(torch.float32, bias_dtype)
                                 and config.topk_group * config.group_size == 128)
    tie = one_more[3, K - 1:K + 1].tolist()
    assert set(got.ids[where[3]].tolist()) == set(one_more[3, :K - 1].tolist()) | {min(tie)}  # the tie to the lower id
    _, (redone, repairs, programs) = _counted(logits, config, bias=bias)
    assert (redone, repairs, programs) == ((1, 3, 4) if extra else (2, 3, 4))


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32], ids=["whole-row", "kept"])
def test_repair_leaves_dropped_groups_out(bias_dtype, forced, monkeypatch):
    """DeepSeek-V3 routing, rows whose two best keys tie (row 2: do not) and whose only lanes above the words' base
    (half the best key) are the 8 winners: the words past them lie at distance 0, where the dropped groups' lanes sit
    too when the rounds run on the whole row (bf16 bias, WARP_ROWS_MIXED_KEPT off: not KEPT). Group 0 is dropped
    though its lane 0 has the row's best key, and lane 0's word is the first at distance 0: _repair must not take it
    as a candidate (its exact key would win), so that row goes to the exact path. On KEPT rounds (fp32 bias) only
    kept lanes are in the words: repaired."""
    monkeypatch.setattr(kr, "WARP_ROWS_MIXED_KEPT", False)
    config = CONFIGS["deepseek-v3"]
    x = torch.full((4, 256), -2.0)  # keys 0.12, below the base
    for g, (a, b) in zip((1, 2, 3, 4), ((2.2, 2.2), (1.4, 1.3), (1.2, 1.1), (1.0, 0.9))):
        x[:, 32 * g], x[:, 32 * g + 1] = a, b  # groups 1-4 kept (scores 1.80, 1.59, 1.52, 1.44), the 8 winners
    x[:, 0] = 4.6  # key 0.99, group 0's score 1.11: dropped
    x[2, 33] = 2.0  # row 2: no tie, so not close
    x[3] = tie_free_logits(1, 256, seed=4).cpu()  # the second program (rows 2, 3): no fallback
    logits, where = _spread(x.to(DEVICE), 3, True)
    bias = torch.zeros(256, dtype=bias_dtype, device=DEVICE)
    forced.clear()
    got, _ = run_both(logits, config, bias=bias)
    assert forced[0]["KEPT"] is (bias_dtype == torch.float32)
    assert 0 not in got.ids[where[0]].tolist() and 0 not in got.ids[where[2]].tolist()
    _, (redone, repairs, programs) = _counted(logits, config, bias=bias)
    want = (0, 1, 2) if forced[0]["KEPT"] else (1, 1, 2)
    assert (redone, repairs, programs) == want


@pytest.mark.parametrize("name", ["deepseek-v3", "group-max", "every-group-kept", "sigmoid", "deepseek-v4",
                                  "eps-clamp", "512-top22", "top-31"])
def test_tie_heavy_rows_route_like_the_reference(name, forced):
    """fp32 and bf16 logits rounded to quarters (ties in every row: close rows, _repair and the exact path) with a
    bias of sixteenths: every row like the reference (ties to the lower id), into poisoned outputs."""
    config = CONFIGS[name]
    E = config.num_experts
    for dtype in (torch.float32, torch.bfloat16):
        logits = (_logits(37, E, seed=E) * 4).round() / 4
        forced.clear()
        run_both(logits.to(dtype), config, bias=_bias(E, dtype, seed=E))
        # a chunk: the row's threads' 16-byte loads (128 bf16 lanes are not one of 32 threads)
        assert ("R" in forced[0]) is (dtype == torch.float32 or E % (8 * kr.WARP_ROWS_THREADS) == 0)
