"""Every bad input of docs/contract.md's list raises before anything runs, with a message naming the argument."""

import pytest
import torch

from moegate import ExpertLayout, ExpertPlacement, RouterConfig, RoutingRecorder, route

BAD_CONFIGS = [
    (dict(num_experts=8, top_k=9), "top_k"),
    (dict(num_experts=8, top_k=0), "top_k"),
    (dict(num_experts=0, top_k=1), "num_experts"),
    (dict(num_experts=10, top_k=2, n_group=4), "n_group"),
    (dict(num_experts=8, top_k=2, n_group=4, topk_group=5), "topk_group"),
    (dict(num_experts=16, top_k=9, n_group=4, topk_group=2), "topk_group"),
    (dict(num_experts=8, top_k=2, softcap=0.0), "softcap"),
    (dict(num_experts=8, top_k=2, softcap=-1.0), "softcap"),
    (dict(num_experts=8, top_k=2, routed_scaling_factor=0.0), "routed_scaling_factor"),
    (dict(num_experts=8, top_k=2, routed_scaling_factor=float("nan")), "routed_scaling_factor"),
    (dict(num_experts=8, top_k=2, n_group=8, topk_group=2), "top2_sum"),
    (dict(num_experts=8, top_k=2, scoring="relu"), "scoring"),
    (dict(num_experts=8, top_k=2, selection="bias"), "selection"),
    (dict(num_experts=8, top_k=2, group_fill="neg_inf"), "group_fill"),
    (dict(num_experts=8, top_k=2, renorm_eps=-1.0), "renorm_eps"),
    (dict(num_experts=8, top_k=2, logit_scale=0.0), "logit_scale"),
    (dict(num_experts=8, top_k=2, num_shared_experts=-1), "num_shared_experts"),
    (dict(num_experts=8, top_k=2, routing="random"), "routing"),
    (dict(num_experts=8, top_k=2, has_expert_scale=True, num_zero_experts=2), "num_zero_experts"),
    (dict(num_experts=8, top_k=2, routing="hash", num_zero_experts=2), "num_zero_experts"),
    # Factors outside fp32 (a review: the kernel wrote inf where the reference raised a bare RuntimeError).
    (dict(num_experts=8, top_k=2, routed_scaling_factor=1e39), "routed_scaling_factor"),
    (dict(num_experts=8, top_k=2, routed_scaling_factor=1e-39), "routed_scaling_factor"),
    (dict(num_experts=8, top_k=2, shared_expert_scale=1e39), "shared_expert_scale"),
    (dict(num_experts=8, top_k=2, shared_expert_scale=1e37, routed_scaling_factor=1e-2), "shared_expert_scale /"),
    (dict(num_experts=8, top_k=2, logit_scale=1e-40), "logit_scale"),
    (dict(num_experts=8, top_k=2, softcap=1e39), "softcap"),
    (dict(num_experts=8, top_k=2, renorm_eps=1e39), "renorm_eps"),
    # A review (2026-12-04): the shared weight's ratio below fp32's normal range (it came out 0); ints past the float
    # range (a bare OverflowError); E + Z named as such (the messages called it num_experts).
    (dict(num_experts=8, top_k=2, shared_expert_scale=1e-30, routed_scaling_factor=1e30), "shared_expert_scale /"),
    (dict(num_experts=8, top_k=2, routed_scaling_factor=10**400), "routed_scaling_factor"),
    (dict(num_experts=8, top_k=2, renorm_eps=10**400), "renorm_eps"),
    (dict(num_experts=4, num_zero_experts=2, top_k=7), r"num_experts \+ num_zero_experts \(4 \+ 2 = 6\)"),
    (dict(num_experts=4, num_zero_experts=2, top_k=1, n_group=4), r"num_experts \+ num_zero_experts"),
    (dict(num_experts=8, top_k=2, group_score="sum"), "group_score"),
    (dict(num_experts=8, top_k=2, renorm_eps_mode="mul"), "renorm_eps_mode"),
    (dict(num_experts=8, top_k=2, renorm_p=0.0), "renorm_p"),
    (dict(num_experts=8, top_k=2, renorm_p=float("nan")), "renorm_p"),
]

# A wrong type is a TypeError (README, docs/contract.md), naming the field.
BAD_CONFIG_TYPES = [
    (dict(num_experts=8.0, top_k=2), "num_experts"),
    (dict(num_experts="8", top_k=2), "num_experts"),
    (dict(num_experts=8, top_k=2, renormalize=1), "renormalize"),
    (dict(num_experts=8, top_k=2, weight_on_input=1), "weight_on_input"),
    (dict(num_experts=8, top_k=2, routed_scaling_factor="2.5"), "routed_scaling_factor"),
    (dict(num_experts=8, top_k=2, routed_scaling_factor=torch.tensor(2.5)), "routed_scaling_factor"),
    (dict(num_experts=8, top_k=2, scoring=["sigmoid"]), "scoring"),
    (dict(num_experts=8, top_k=2, group_fill=None), "group_fill"),
]


@pytest.mark.parametrize("kwargs,name", BAD_CONFIGS)
def test_bad_config_raises_naming_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RouterConfig(**kwargs)


@pytest.mark.parametrize("kwargs,name", BAD_CONFIG_TYPES)
def test_config_of_a_wrong_type_raises_type_error_naming_the_field(kwargs, name):
    with pytest.raises(TypeError, match=name):
        RouterConfig(**kwargs)


def test_config_is_frozen():
    cfg = RouterConfig(num_experts=8, top_k=2)
    with pytest.raises(AttributeError):
        cfg.top_k = 3


def test_bad_layouts():
    with pytest.raises(ValueError, match="shared_slots"):
        ExpertLayout(shared_slots="local")
    with pytest.raises(ValueError, match="ep_size"):
        ExpertLayout(ep_size=0)
    with pytest.raises(ValueError, match="scale"):
        ExpertLayout(scale="twice")
    with pytest.raises(ValueError, match="divisible by ep_size"):
        ExpertLayout(ep_size=3, placement=ExpertPlacement(tuple(range(8)), 8))
    with pytest.raises(ValueError, match="missing"):
        ExpertPlacement((0, 1, 1), 3)
    with pytest.raises(ValueError, match=r"physical_to_logical\[1\]"):
        ExpertPlacement((0, 3), 3)
    with pytest.raises(ValueError, match=r"physical_to_logical\[3\]"):  # below 0 too (a review: only 3 was tried)
        ExpertPlacement((0, 1, 2, -1), 3)


CFG = RouterConfig(num_experts=8, top_k=2, num_shared_experts=1)
# Outputs that alias: both on one buffer, on overlapping halves of one, on the logits' memory.
_BUF = torch.zeros(4, 2)
_BUF2 = torch.zeros(12)
_BUF3 = torch.zeros(32)


def call(**kw):
    logits = kw.pop("logits", torch.randn(4, 8))
    config = kw.pop("config", CFG)
    layout = kw.pop("layout", None)
    kw.setdefault("backend", "reference")
    return route(logits, config, layout, **kw)


@pytest.mark.parametrize(
    "kw,exc,name",
    [
        (dict(logits=torch.randn(4, 7)), ValueError, "logits"),
        (dict(logits=torch.randn(4, 9)), ValueError, "logits"),  # wider than E: a mutant took it and routed id 8
        (dict(logits=torch.randn(4, 8, 1)), ValueError, "logits"),
        (dict(logits=torch.randn(4, 8).double()), TypeError, "logits"),
        (dict(logits=torch.zeros(4, 8, dtype=torch.int32)), TypeError, "logits"),
        (dict(bias=torch.zeros(8)), ValueError, "bias"),
        (dict(config=CFG.replace(has_correction_bias=True)), ValueError, "bias"),
        (dict(config=CFG.replace(has_correction_bias=True), bias=torch.zeros(9)), ValueError, "bias"),
        (dict(config=CFG.replace(has_correction_bias=True), bias=torch.zeros(8).long()), TypeError, "bias"),
        (dict(config=CFG.replace(routing="hash")), ValueError, "token_ids"),
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.zeros(4, dtype=torch.long)), ValueError,
         "hash_table"),
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.zeros(4, dtype=torch.long),
              hash_table=torch.tensor([[0, 8]])), ValueError, "hash_table"),
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.zeros(4, dtype=torch.long),
              hash_table=torch.tensor([[3, 3]])), ValueError, "hash_table"),
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.zeros(4, dtype=torch.long),
              hash_table=torch.tensor([[3, 1, 2]])), ValueError, "hash_table"),
        (dict(token_ids=torch.zeros(4, dtype=torch.long)), ValueError, "token_ids"),
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.zeros(4, 2, dtype=torch.long),
              hash_table=torch.tensor([[3, 1]])), ValueError, r"token_ids must have shape \(4,\)"),  # [T] only
        (dict(layout=ExpertLayout(ep_size=3)), ValueError, "ep_size"),
        (dict(layout=ExpertLayout(ep_size=2), home_rank=2), ValueError, "home_rank"),
        (dict(home_rank=-1), ValueError, "home_rank"),
        (dict(num_valid_tokens=5), ValueError, "num_valid_tokens"),
        (dict(num_valid_tokens=-1), ValueError, "num_valid_tokens"),
        (dict(num_valid_tokens=torch.tensor([1, 2])), ValueError, "num_valid_tokens"),
        (dict(num_valid_tokens=torch.tensor([1.0])), TypeError, "num_valid_tokens"),  # a dtype: TypeError
        (dict(out=(torch.zeros(4, 3), torch.zeros(4, 3, dtype=torch.int32))), ValueError, "out"),
        (dict(out=(torch.zeros(2, 4).t(), torch.zeros(4, 2, dtype=torch.int32))), ValueError, "out"),
        (dict(out=(torch.zeros(4, 2).double(), torch.zeros(4, 2, dtype=torch.int32))), TypeError, "out"),
        (dict(out=(torch.zeros(4, 2), torch.zeros(4, 2, dtype=torch.int64))), TypeError, "out"),
        # One buffer on another device (both there: the aliasing check speaks first).
        (dict(out=(torch.zeros(4, 2, device="meta"), torch.zeros(4, 2, dtype=torch.int32))), ValueError,
         r"out\[0\] \(weights\) is on meta"),
        (dict(out=(torch.zeros(4, 2), torch.zeros(4, 2, dtype=torch.int32, device="meta"))), ValueError,
         r"out\[1\] \(ids\) is on meta"),
        (dict(layout=ExpertLayout(shared_slots="global"),
              out=(torch.zeros(4, 2), torch.zeros(4, 2, dtype=torch.int32))), ValueError, "out"),
        (dict(out=(_BUF, _BUF.view(torch.int32))), ValueError, r"out\[0\] \(weights\) overlaps out\[1\] \(ids\)"),
        (dict(out=(_BUF2[:8].view(4, 2), _BUF2[4:].view(torch.int32).view(4, 2))), ValueError, "overlap"),
        (dict(logits=_BUF3.view(4, 8), out=(_BUF3[8:16].view(4, 2), torch.zeros(4, 2, dtype=torch.int32))),
         ValueError, r"out\[0\] \(weights\) overlaps the logits"),
        (dict(recorder=RoutingRecorder(1, 3, 2, 8)), ValueError, "max_tokens"),
        (dict(recorder=RoutingRecorder(1, 8, 3, 8)), ValueError, "top_k"),
        (dict(recorder=RoutingRecorder(1, 8, 2, 8), layer=1), ValueError, "layer"),
        (dict(recorder=RoutingRecorder(1, 8, 2, 7)), ValueError, "num_experts=7"),
        (dict(recorder=object()), TypeError, "recorder"),
        (dict(layer=-1), ValueError, "layer"),
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.tensor([0, 2, 1, 0]),
              hash_table=torch.tensor([[3, 1], [2, 0]])), ValueError, "token_ids"),
        # Below 0 as well as past the end (a review: a live -1 token id passed as padding unnoticed by the tests).
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.tensor([0, -1, 1, 0]),
              hash_table=torch.tensor([[3, 1], [2, 0]])), ValueError, "token_ids"),
        (dict(config=CFG.replace(routing="hash"), token_ids=torch.zeros(4, dtype=torch.long),
              hash_table=torch.tensor([[-1, 0]])), ValueError, "hash_table"),
        (dict(config=CFG.replace(has_expert_scale=True)), ValueError, "expert_scale"),
        (dict(expert_scale=torch.ones(8)), ValueError, "expert_scale"),
        (dict(layout=ExpertLayout(placement=ExpertPlacement((0, 1, 2), 3))), ValueError, "placement"),
        (dict(backend="cuda"), ValueError, "backend"),
    ],
)
def test_bad_route_input_raises_naming_the_argument(kw, exc, name):
    with pytest.raises(exc, match=name):
        call(**kw)


def test_bad_input_leaves_out_and_recorder_untouched():
    out = (torch.full((4, 3), -5.0), torch.full((4, 3), -7, dtype=torch.int32))
    rec = RoutingRecorder(1, 4, 2, 8)
    with pytest.raises(ValueError):
        call(layout=ExpertLayout(shared_slots="global"), out=out, recorder=rec, num_valid_tokens=9)
    assert (out[0] == -5).all() and (out[1] == -7).all() and (rec.ids == -1).all()


def test_hash_table_is_checked_once_and_again_after_an_inplace_change(monkeypatch):
    """The cache of checked tables, which only CUDA tables take, forced for CPU tables here (a review: a CPU table
    is checked on every call, so without the patch the version comparison was never exercised)."""
    import moegate._checks as checks

    monkeypatch.setattr(checks, "_checks_once", lambda table: True)
    monkeypatch.setattr(checks, "_CHECKED_TABLES", {})
    cfg = RouterConfig(num_experts=8, top_k=2, routing="hash")
    table = torch.tensor([[0, 1], [2, 3]])
    tids = torch.tensor([0, 1, 1, 0])
    call(config=cfg, token_ids=tids, hash_table=table)
    table[1, 1] = 2  # now repeats within a row
    with pytest.raises(ValueError, match="repeats"):
        call(config=cfg, token_ids=tids, hash_table=table)


def test_hash_tables_made_under_inference_mode_route(monkeypatch):
    """Engines load and run models under torch.inference_mode(): a table made there has no version counter, and
    reading it raised RuntimeError. It is checked once (bad ids still raise) and routes. The cache that reads the
    counter takes CUDA tables only; the patch sends these CPU tables through it (a review: they never reached it)."""
    import moegate._checks as checks

    monkeypatch.setattr(checks, "_checks_once", lambda table: True)
    monkeypatch.setattr(checks, "_CHECKED_TABLES", {})
    cfg = RouterConfig(num_experts=8, top_k=2, routing="hash")
    tids = torch.tensor([0, 1, 1, 0])
    with torch.inference_mode():
        table = torch.tensor([[0, 1], [2, 3]])
        stacked = torch.stack([table, table.flip(1)])
        bad = torch.tensor([[0, 1], [3, 3]])
    w, ids = call(config=cfg, token_ids=tids, hash_table=table)
    assert ids.tolist() == table[tids].tolist()
    for _ in range(2):  # a view of an inference tensor, and the cache hit after it
        w, ids = call(config=cfg, token_ids=tids, hash_table=stacked[1])
        assert ids.tolist() == stacked[1][tids].tolist()
    with torch.inference_mode():
        w, ids = call(config=cfg, token_ids=tids, hash_table=table)
    assert ids.tolist() == table[tids].tolist()
    with pytest.raises(ValueError, match="repeats"):
        call(config=cfg, token_ids=tids, hash_table=bad)


def test_cpu_hash_tables_are_checked_on_every_call():
    """A CPU table is checked each call: writes that torch's version counter misses (shared numpy memory, .data,
    an inference tensor) still raise (SPEC: only CUDA tables are checked once)."""
    np = pytest.importorskip("numpy")
    cfg = RouterConfig(num_experts=8, top_k=2, routing="hash")
    tids = torch.tensor([0, 1, 1, 0])
    arr = np.array([[0, 1], [2, 3]])
    table = torch.from_numpy(arr)
    with torch.inference_mode():
        frozen = torch.tensor([[0, 1], [2, 3]])
    plain = torch.tensor([[0, 1], [2, 3]])
    for t in (table, frozen, plain):
        assert call(config=cfg, token_ids=tids, hash_table=t).ids.tolist() == [[0, 1], [2, 3], [2, 3], [0, 1]]
    arr[1] = [5, 5]
    with pytest.raises(ValueError, match="repeats"):
        call(config=cfg, token_ids=tids, hash_table=table)
    with torch.inference_mode():
        frozen[0, 1] = 0
    with pytest.raises(ValueError, match="repeats"):
        call(config=cfg, token_ids=tids, hash_table=frozen)
    plain.data[0, 0] = 8
    with pytest.raises(ValueError, match=r"hash_table\[0, 0\] = 8 is outside"):
        call(config=cfg, token_ids=tids, hash_table=plain)


def test_hash_table_views_are_checked_once_each(monkeypatch):
    """Engines pass tables[layer], a new view each call: each CUDA table is checked on the host once, not on
    every call (a device-to-host copy), and again only after a write into the stacked tables. The cache is
    exercised here on CPU tables, which by default are checked every call."""
    import moegate._checks as checks

    monkeypatch.setattr(checks, "_checks_once", lambda table: True)
    class Counting(dict):
        sets = 0

        def __setitem__(self, key, value):
            Counting.sets += 1
            super().__setitem__(key, value)

    monkeypatch.setattr(checks, "_CHECKED_TABLES", Counting())
    cfg = RouterConfig(num_experts=8, top_k=2, routing="hash")
    g = torch.Generator().manual_seed(0)
    tables = torch.stack([torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(16)]) for _ in range(4)])
    tids = torch.tensor([0, 5, 9, 15])
    for i in range(40):
        w, ids = call(config=cfg, token_ids=tids, hash_table=tables[i % 4])
        assert ids.tolist() == tables[i % 4][tids].tolist()
    assert Counting.sets == 4
    tables[2, 5] = torch.tensor([1, 1])  # through the base: every view's version moves
    call(config=cfg, token_ids=tids, hash_table=tables[1])
    assert Counting.sets == 5
    with pytest.raises(ValueError, match="repeats"):
        call(config=cfg, token_ids=tids, hash_table=tables[2])
    for _ in range(20):  # tables that die leave no entry behind
        call(config=cfg, token_ids=tids, hash_table=tables.clone()[0])
    assert len(checks._CHECKED_TABLES) <= 5


def test_outputs_side_by_side_in_one_workspace_are_fine():
    """Back-to-back slices of one buffer do not overlap (the end of one is the start of the next); one element
    shared is an overlap."""
    flat = torch.zeros(16)
    w, ids = route(torch.randn(4, 8), RouterConfig(8, 2), out=(flat[:8].view(4, 2), flat[8:].view(torch.int32)
                                                                .view(4, 2)), backend="reference")
    assert ids.shape == (4, 2) and (ids >= 0).all()
    with pytest.raises(ValueError, match="overlap"):
        route(torch.randn(4, 8), RouterConfig(8, 2), out=(flat[:8].view(4, 2), flat[7:15].view(torch.int32)
                                                          .view(4, 2)), backend="reference")


def test_an_empty_hash_table_is_refused_even_for_no_tokens():
    cfg = RouterConfig(num_experts=8, top_k=2, routing="hash")
    with pytest.raises(ValueError, match="vocab >= 1"):
        call(logits=torch.randn(0, 8), config=cfg, token_ids=torch.zeros(0, dtype=torch.long),
             hash_table=torch.zeros(0, 2, dtype=torch.long))


def test_padded_rows_may_hold_any_token_id():
    cfg = RouterConfig(num_experts=8, top_k=2, routing="hash")
    w, ids = call(config=cfg, token_ids=torch.tensor([0, 1, 99, -5]), hash_table=torch.tensor([[3, 1], [2, 0]]),
                  num_valid_tokens=2)
    assert ids[:2].tolist() == [[3, 1], [2, 0]] and (ids[2:] == -1).all()


@pytest.mark.parametrize("layout", [ExpertLayout(ep_size=2), ExpertLayout(shared_slots="global"),
                                    ExpertLayout(shared_slots="per_rank"),
                                    ExpertLayout(placement=ExpertPlacement(tuple(range(6)) + (0, 1), 6))])
def test_zero_experts_refuse_placement_ranks_and_shared_columns(layout):
    """Every part of the rule (a review: only ep_size > 1 was tried; without the shared-column check a shared
    column's id 6 was zero expert 6's)."""
    cfg = RouterConfig(num_experts=6, top_k=2, num_zero_experts=2, num_shared_experts=1)
    with pytest.raises(ValueError, match="num_zero_experts"):
        route(torch.randn(3, 8), cfg, layout, backend="reference")


def test_interpreter_switched_on_after_import_is_a_value_error():
    """Triton fixes interpreted or compiled when it decorates the kernel, at import. TRITON_INTERPRET=1 set later
    passed the device check and the launch failed looking for a GPU driver (RuntimeError); now it is a ValueError
    before anything runs. In a subprocess: this process's kernel may be the interpreted one."""
    import os
    import subprocess
    import sys

    script = (
        "import os, torch\n"
        "from moegate import preset, route\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "try:\n"
        "    route(torch.randn(2, 8), preset('mixtral'), backend='triton')\n"
        "except ValueError as exc:\n"
        "    print('ValueError:', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # moegate's kernel imported before the variable is set, or only triton (moegate imports its kernel lazily)
    for first in ("import moegate.kernels.router\n", "import triton\n"):
        done = subprocess.run([sys.executable, "-c", first + script], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert "ValueError: backend='triton' on CPU tensors: TRITON_INTERPRET=1 was set after" in done.stdout
    # A stand-in for the kernel (the launch-choice tests on a GPU machine record its arguments this way) is
    # neither compiled nor interpreted: the check lets it through.
    stand_in = (
        "import os, torch\n"
        "import moegate.kernels.router as kr\n"
        "from moegate import ExpertLayout, preset\n"
        "seen = {}\n"
        "class Capture:\n"
        "    def __getitem__(self, grid):\n"
        "        return lambda *args, **kwargs: seen.update(kwargs)\n"
        "kr.rk._route_kernel = Capture()\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "kr._route_triton(torch.randn(4, 8), preset('mixtral'), ExpertLayout())\n"
        "print('launched', 'K' in seen)\n"
    )
    done = subprocess.run([sys.executable, "-c", stand_in], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "launched True" in done.stdout, done.stderr


def test_placement_takes_numpy_and_tensor_tables():
    """EPLB solvers return numpy arrays or tensors: ExpertPlacement takes their integers (stored as Python ints),
    and still refuses floats and bools."""
    import numpy as np

    want = ExpertPlacement(tuple(range(8)) + (3, 5), 8)
    for table in (np.array(want.physical_to_logical), torch.tensor(want.physical_to_logical, dtype=torch.int32),
                  [np.int64(e) for e in want.physical_to_logical]):
        got = ExpertPlacement(table, 8)
        assert got == want and all(type(e) is int for e in got.physical_to_logical)
    # A wrong type or dtype is a TypeError, a wrong shape a ValueError (docs/contract.md).
    for bad, error in ((np.arange(8, dtype=np.float64), TypeError), (torch.arange(8.0), TypeError),
                       ([0, 1, 2, 3, 4, 5, 6, 7.0], TypeError), ([True] + list(range(8)), TypeError),
                       (torch.arange(8).view(2, 4), ValueError), (np.arange(8).reshape(2, 4), ValueError),
                       (list(range(7)) + [np.array(7.0)], TypeError), (list(torch.arange(8.0)), TypeError),
                       (list(range(7)) + [np.True_], TypeError)):
        with pytest.raises(error, match="physical_to_logical"):
            ExpertPlacement(bad, 8)
        if isinstance(bad, torch.Tensor):  # from_tensor checks as the constructor does (it truncated 1.7 to 1)
            with pytest.raises(error, match="physical_to_logical"):
                ExpertPlacement.from_tensor(bad, 8)
    assert ExpertPlacement.from_tensor(torch.tensor(want.physical_to_logical), 8) == want
    with pytest.raises(TypeError, match="physical_to_logical"):
        ExpertPlacement.from_tensor(torch.tensor([0, 1.7, 2, 3, 4, 5, 6, 7, 1.2]), 8)
    with pytest.raises(TypeError, match="physical_to_logical"):
        ExpertPlacement.from_tensor(torch.tensor([True] * 8), 8)
    with pytest.raises(TypeError, match="placement"):
        ExpertLayout(placement=[0, 1, 2])


def test_check_routing_refuses_a_layout_that_is_not_one():
    """check_routing(layout=0 / [] / '') is a TypeError, as route() makes it: not a check against the default."""
    import moegate

    config = RouterConfig(num_experts=4, top_k=2, renormalize=False)
    w, ids = torch.zeros(1, 2), torch.tensor([[0, 1]], dtype=torch.int32)
    assert moegate.check_routing(w, ids, config, None) == []
    for bad in (0, "", [], (), False, 1):
        with pytest.raises(TypeError, match="layout must be an ExpertLayout"):
            moegate.check_routing(w, ids, config, bad)


def test_routing_check_error_is_public():
    import moegate

    assert issubclass(moegate.RoutingCheckError, ValueError)
    with pytest.raises(moegate.RoutingCheckError):
        moegate.check_routing(torch.zeros(1, 2), torch.tensor([[0, 0]], dtype=torch.int32),
                              RouterConfig(num_experts=4, top_k=2, renormalize=False), strict=True)


def test_cpu_num_valid_tokens_tensor_outside_the_batch_raises():
    """A CPU tensor costs nothing to read: outside [0, T] it is the same ValueError as the int (it was silently
    read as all rows live or none). check_routing takes the same range."""
    from moegate import check_routing

    cfg = RouterConfig(num_experts=8, top_k=2)
    x = torch.randn(6, 8)
    for bad in (torch.tensor(7), torch.tensor([-1], dtype=torch.int32)):
        with pytest.raises(ValueError, match="num_valid_tokens"):
            route(x, cfg, num_valid_tokens=bad)
    w, ids = route(x, cfg, num_valid_tokens=torch.tensor(4))
    assert check_routing(w, ids, cfg, logits=x, num_valid_tokens=torch.tensor(4)) == []
    for bad in (99, -1, torch.tensor(7), torch.tensor([1, 2])):
        with pytest.raises(ValueError, match="num_valid_tokens"):
            check_routing(w, ids, cfg, logits=x, num_valid_tokens=bad)


def test_cpu_bias_and_expert_scale_values_are_checked():
    """A NaN or +inf bias would win every row for its expert whatever its logit (torch sorts NaN first), and a
    negative or non-finite expert_scale gives weights that are not finite and >= 0, which check_routing rejects: on
    the CPU (free to read) both are ValueErrors before anything runs; device tensors are not read (no sync)."""
    c = RouterConfig(num_experts=8, top_k=2, scoring="sigmoid", has_correction_bias=True)
    for v in (float("nan"), float("inf"), float("-inf")):
        b = torch.zeros(8)
        b[7] = v
        with pytest.raises(ValueError, match=r"bias\[7\] = .*must be finite"):
            route(torch.randn(3, 8), c, bias=b)
    route(torch.randn(3, 8), c, bias=torch.full((8,), -3.0))  # negative biases are ordinary
    c = RouterConfig(num_experts=8, top_k=2, has_expert_scale=True)
    for v in (-0.5, float("nan"), float("inf")):
        es = torch.ones(8)
        es[2] = v
        with pytest.raises(ValueError, match=r"expert_scale\[2\] = .*finite and >= 0"):
            route(torch.randn(3, 8), c, expert_scale=es)
    w, _ = route(torch.randn(3, 8), c, expert_scale=torch.zeros(8))  # a zero scale is allowed: weights 0
    assert (w == 0).all()


def test_synthetic_inputs_refuse_seeds_dtypes_and_skews_they_cannot_honour():
    """A review (2026-12-04): torch's CPU generator keeps 32 bits of a seed (seed 2**32 repeated seed 0), an int
    dtype was accepted, and a skew past the dtype's range made +-inf logits (outside the contract's domain)."""
    from moegate.synthetic import SEED_MAX, synthetic_logits

    synthetic_logits(2, 4, seed=SEED_MAX)
    with pytest.raises(ValueError, match="seed"):
        synthetic_logits(2, 4, seed=SEED_MAX + 1)
    with pytest.raises(TypeError, match="dtype"):
        synthetic_logits(2, 4, dtype=torch.int32)
    for skew, dtype in ((1e39, torch.float32), (1e6, torch.float16), (10**400, torch.float32)):
        with pytest.raises(ValueError, match="skew"):
            synthetic_logits(8, 16, skew=skew, dtype=dtype)
    with pytest.raises(TypeError, match="skew"):
        synthetic_logits(2, 4, skew="1")
    assert torch.isfinite(synthetic_logits(8, 16, skew=1e3, dtype=torch.float16)).all()


def test_zero_experts_take_layouts_without_shared_columns():
    """Zero experts need no placement, one rank and no shared columns (docs/contract.md): shared_slots='global' or
    'per_rank' with num_shared_experts=0 adds no column and routes as the default layout (a review: refused)."""
    c = RouterConfig(num_experts=8, top_k=3, num_zero_experts=4)
    x = torch.randn(5, 12)
    want = route(x, c, backend="reference")
    for layout in (ExpertLayout(shared_slots="global"), ExpertLayout(shared_slots="per_rank", scale="on_output")):
        got = route(x, c, layout, backend="reference")
        assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)
    for layout, S in ((ExpertLayout(shared_slots="global"), 1), (ExpertLayout(ep_size=2), 0)):
        with pytest.raises(ValueError, match="num_zero_experts"):
            route(x, c.replace(num_shared_experts=S), layout, backend="reference")


def test_wrong_types_are_type_errors_across_the_api():
    """docs/contract.md: a wrong type or dtype is a TypeError, a wrong value or shape a ValueError (a review found
    RouterConfig, placements, home_rank, out, RoutingRecorder.record and check_routing's rtol raising ValueError)."""
    cfg = RouterConfig(num_experts=8, top_k=2)
    x = torch.randn(3, 8)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=2)
    for kw in (dict(home_rank=1.0), dict(home_rank=True), dict(out=torch.zeros(3, 2)), dict(num_valid_tokens=True)):
        with pytest.raises(TypeError, match=next(iter(kw))):
            route(x, cfg, layout, backend="reference", **kw)
    with pytest.raises(ValueError, match="out"):
        route(x, cfg, backend="reference", out=(torch.zeros(3, 2),))
    for field in ("num_experts", "top_k"):  # a bool is not a count (True would be 1)
        with pytest.raises(TypeError, match=f"{field} must be an int, got True"):
            RouterConfig(**{"num_experts": 8, "top_k": 2, field: True})
    with pytest.raises(ValueError, match="home_rank"):
        route(x, cfg, layout, backend="reference", home_rank=2)
    w, ids = route(x, cfg, backend="reference")
    from moegate import check_routing

    with pytest.raises(TypeError, match="rtol"):
        check_routing(w, ids, cfg, rtol="1e-5")
    with pytest.raises(ValueError, match="rtol"):
        check_routing(w, ids, cfg, rtol=-1.0)


def test_tie_order_check_fails_a_tie_to_the_higher_id():
    """moegate.check._tie_order_violation (which the kernel tests and the GPU fuzz run on the rows check_routing
    forgives as near ties): an exact tie (equal logits) routed to the higher id first, or the higher id picked instead
    of the lower, is reported, through a placement too; the reference's own order is not."""
    from moegate.check import _tie_order_violation

    config = RouterConfig(16, 2, scoring="sigmoid", has_correction_bias=True)
    bias = torch.zeros(16)
    logits = torch.linspace(-1.0, 1.0, 16).repeat(3, 1)
    logits[:, 3] = logits[:, 15]  # experts 3 and 15 tie at the top
    logits[2, 14] = logits[2, 15]  # row 2: 3, 14 and 15 tie; the reference takes 3 and 14
    rows = torch.arange(3)
    placed = ExpertLayout(placement=ExpertPlacement(tuple(range(15, -1, -1)), 16), replica_policy="first")
    for layout in (ExpertLayout(), placed):
        want = route(logits, config, layout, bias=bias, backend="reference").ids
        slot = (lambda e: 15 - e) if layout.placement is not None else (lambda e: e)
        assert want.tolist() == [[slot(3), slot(15)], [slot(3), slot(15)], [slot(3), slot(14)]]
        assert _tie_order_violation(want, logits, config, layout, bias, rows) is None
        swapped = want.clone()
        swapped[1] = torch.tensor([slot(15), slot(3)])
        assert "row 1: expert 15 in column 0 ahead of expert 3" in _tie_order_violation(
            swapped, logits, config, layout, bias, rows)
        instead = want.clone()
        instead[2] = torch.tensor([slot(3), slot(15)])
        assert "row 2: expert 15 in column 1 ahead of expert 14" in _tie_order_violation(
            instead, logits, config, layout, bias, rows)


def test_tie_order_check_follows_the_groups_step_4_leaves():
    """A review (2026-12-06): the tie check ranked raw keys on the groups the row picked from. With group_fill="zero"
    a dropped group's experts compete at 0.0: it reported a lower-id expert of a dropped group as tied with a kept
    one (a false alarm on the reference's own routing) and missed a tie among the 0.0 keys broken to the higher id.
    With near-tied group scores either group may be kept: a routing that keeps the rule under one choice passes."""
    from moegate.check import _tie_order_violation

    zero = RouterConfig(8, 4, scoring="sigmoid", has_correction_bias=True, n_group=2, topk_group=1, group_fill="zero")
    bias = torch.tensor([-5.0, -5, 0, -5, 0, 0, -5, -5])
    logits = torch.tensor([[0.0, -1, 2, -1, 2, 1.5, 0, 0]])
    rows = torch.arange(1)
    want = route(logits, zero, bias=bias, backend="reference").ids
    assert want.tolist() == [[4, 5, 0, 1]]  # experts 0 and 1 at 0.0 (dropped group), above 6 and 7 (keys < 0)
    assert _tie_order_violation(want, logits, zero, ExpertLayout(), bias, rows) is None
    bias = torch.tensor([-5.0] * 4 + [0, 0, -5, -5])
    logits = torch.tensor([[0.0, -1, -0.5, -2, 2, 1.5, 0, 0]])
    want = route(logits, zero, bias=bias, backend="reference").ids
    assert want.tolist() == [[4, 5, 0, 1]]
    assert _tie_order_violation(want, logits, zero, ExpertLayout(), bias, rows) is None
    wrong = torch.tensor([[4, 5, 3, 2]])  # 0.0 keys all, taken from the higher ids
    assert "expert 3 in column 2 ahead of expert 0" in _tie_order_violation(
        wrong, logits, zero, ExpertLayout(), bias, rows)
    # exclude, group scores a near tie apart: either group's top two pass, a tie broken upward in either does not.
    excl = RouterConfig(8, 2, scoring="sigmoid", has_correction_bias=True, n_group=2, topk_group=1)
    bias = torch.zeros(8)
    logits = torch.tensor([[1.0, 1.0, 0, 0, 1.0 + 1e-7, 1.0 + 1e-7, 1.0 + 1e-7, 0]])
    for ok in ([[0, 1]], [[4, 5]]):
        assert _tie_order_violation(torch.tensor(ok), logits, excl, ExpertLayout(), bias, rows) is None
    for bad in ([[1, 0]], [[4, 6]], [[5, 4]]):
        assert _tie_order_violation(torch.tensor(bad), logits, excl, ExpertLayout(), bias, rows) is not None


@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
def test_compiled_reference_checks_values_when_the_graph_runs(compiler):
    """A review (2026-12-06): traced by torch.compile, the reference backend skipped route()'s checks of the inputs'
    values (a traced graph has none to read) and routed a hash table that repeats an expert to [1, 1], a CPU
    num_valid_tokens past T as every row live, a token id past the table as padding. They now run with the graph,
    on the real tensors (moegate::reference_valid_rows), and raise what an eager call raises; good inputs route as
    eagerly, gradients flow."""
    torch._dynamo.reset()
    x = torch.randn(3, 8)
    hashed = RouterConfig(num_experts=8, top_k=2, routing="hash")
    plain = RouterConfig(num_experts=8, top_k=2)
    biased = RouterConfig(num_experts=8, top_k=2, scoring="sigmoid", has_correction_bias=True)

    def compiled(config, **kw):
        return torch.compile(lambda x, kw: route(x, config, backend="reference", **kw), fullgraph=True,
                             backend=compiler)(x, kw)

    tid = torch.tensor([0, 1, 0])
    for config, kw, match in ((hashed, dict(hash_table=torch.tensor([[1, 1], [2, 3]]), token_ids=tid), "repeats"),
                              (hashed, dict(hash_table=torch.tensor([[1, 9], [2, 3]]), token_ids=tid), "outside"),
                              (hashed, dict(hash_table=torch.tensor([[1, 2]]), token_ids=tid), "token_ids\\[1\\] = 1"),
                              (plain, dict(num_valid_tokens=torch.tensor([4])), "num_valid_tokens must be <= 3"),
                              (biased, dict(bias=torch.tensor([float("nan")] + [0.0] * 7)), "bias\\[0\\] = nan")):
        with pytest.raises(ValueError, match=match):
            compiled(config, **kw)
    for config, kw in ((hashed, dict(hash_table=torch.tensor([[1, 2], [5, 3]]), token_ids=tid)),
                       (plain, dict(num_valid_tokens=torch.tensor([2]))), (plain, dict(num_valid_tokens=1)),
                       (biased, dict(bias=torch.linspace(-0.1, 0.1, 8)))):
        got, want = compiled(config, **kw), route(x, config, backend="reference", **kw)
        assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights), kw
    xg, b = x.clone().requires_grad_(), torch.zeros(8)
    w = torch.compile(lambda x: route(x, biased, bias=b, backend="reference").weights, fullgraph=True,
                      backend=compiler)(xg)
    w.sum().backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()
