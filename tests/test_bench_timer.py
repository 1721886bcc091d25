"""The benchmark's graph timer (moegate.bench._time), on a simulated GPU clock: no CUDA needed.

A fake CUDA graph records how many launches its capture made; a replay advances the clock by a fixed cost of the
graph's own plus one launch's cost per captured launch; eager calls cost the host only. The timer must size its
graph from a graph (not from eager calls) and report the launch's cost plus only that overhead's share.
"""

import contextlib
import types

import pytest
import torch

from moegate import bench

LAUNCH_MS = 0.001  # 1 us a launch
GRAPH_MS = 0.008  # 8 us of the graph's own launch cost a replay


class _Clock:
    def __init__(self):
        self.now = 0.0
        self.capturing = None
        self.eager_calls = 0


class _Graph:
    def __init__(self):
        self.launches = 0

    def replay(self):
        _CLOCK.now += GRAPH_MS + self.launches * LAUNCH_MS


class _Event:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = _CLOCK.now

    def elapsed_time(self, other):
        return other.t - self.t


_CLOCK = _Clock()


@contextlib.contextmanager
def _graph_ctx(graph):
    _CLOCK.capturing = graph
    try:
        yield
    finally:
        _CLOCK.capturing = None


def _launch():
    if _CLOCK.capturing is not None:
        _CLOCK.capturing.launches += 1
    else:
        _CLOCK.eager_calls += 1
        _CLOCK.now += LAUNCH_MS  # the kernel runs; the host's share is not on this clock


@pytest.fixture
def fake_cuda(monkeypatch):
    global _CLOCK
    _CLOCK = _Clock()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _graph_ctx)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "TIMER", "graph")
    return _CLOCK


@pytest.mark.parametrize("rep,launches", [(20, 2000), (0.5, 357)])
def test_graph_timer_sizes_its_graph_from_a_graph(fake_cuda, rep, launches, monkeypatch):
    """rep / estimate launches a graph (the estimate from a graph of 20: 1.4 us a launch here), at most 2000; the
    figure is one launch plus the graph's cost shared over those launches, in us."""
    sizes = []
    original = _Graph.replay

    def replay(self):
        sizes.append(self.launches)
        original(self)

    monkeypatch.setattr(_Graph, "replay", replay)
    us = bench._time(_launch, rep)
    assert sizes == [20, 20] + [launches] * 10
    assert us == pytest.approx((LAUNCH_MS + GRAPH_MS / launches) * 1e3, rel=1e-9)
    assert fake_cuda.eager_calls == 1  # the warm-up call only: no eager estimate


def test_graph_timer_median_of_ten_replays(fake_cuda, monkeypatch):
    """The median of ten timed replays: one slow replay among them does not move the figure."""
    replays = []
    original = _Graph.replay

    def replay(self):
        original(self)
        replays.append(self.launches)
        if len(replays) == 5:  # the third timed replay (after the probe's two) takes 1 ms more
            _CLOCK.now += 1.0

    monkeypatch.setattr(_Graph, "replay", replay)
    us = bench._time(_launch, 20)
    n = bench.MAX_LAUNCHES
    assert replays.count(n) == 10 and replays.count(bench.ESTIMATE_LAUNCHES) == 2
    assert us == pytest.approx((LAUNCH_MS + GRAPH_MS / n) * 1e3, rel=1e-9)


def test_timed_moegate_outputs_are_poisoned_and_checked_at_both_ends(fake_cuda, monkeypatch):
    """_time poisons a moegate launch's outputs before timing it, so a variant (--ab, --sweep) that writes nothing
    fails verify() instead of passing on the previous variant's output; verify() checks the last VERIFY_ROWS rows too,
    where a launch that skipped its last programs would be wrong (a review, 2026-12-04)."""
    from moegate import RouterConfig

    monkeypatch.setattr(bench, "VERIFY_ROWS", 4)
    route = bench.route
    monkeypatch.setattr(bench, "route", lambda *a, **kw: route(*a, **{**kw, "backend": "reference"}))  # no kernel
    config = RouterConfig(8, 2, scoring="sigmoid", renormalize=True)
    logits = torch.arange(80, dtype=torch.float32).reshape(10, 8).remainder(7.0) / 8  # rows 0-3 and 6-9 checked
    out = (torch.empty(10, 2), torch.empty(10, 2, dtype=torch.int32))
    real = bench._Moegate(logits, config, None, out)
    real()
    assert real.verify() == 0

    class Lazy(bench._Moegate):
        def __call__(self):
            _launch()  # times like a launch, writes nothing

    bench._time(Lazy(logits, config, None, out), 0.5)
    assert real.verify() > 0 and torch.isnan(out[0]).all() and (out[1] == -7).all()
    real()
    out[1][9] = out[1][9].flip(0)  # the last row's columns out of key order
    assert real.verify() > 0
    out[1][9] = out[1][9].flip(0)
    out[0][5] = 0.0  # row 5 lies between the two windows: not compared with the reference
    assert real.verify() == 0


def test_rotation_cycles_every_copy_equally_and_checks_both_ends(fake_cuda, monkeypatch):
    """Inputs rotated past the L2: a provider with several copies calls them in turn, each timed graph holds a
    multiple of the copy count (each copy as often, every copy written by the last replay; at least one round when
    the estimate asks for fewer launches than copies), poison() reaches every copy's outputs and verify() checks the
    first and the last copy."""
    captured = []  # (graph, copy) of each call made under a capture

    class Copy:
        def __init__(self, i):
            self.i, self.poisoned, self.bad = i, False, 0

        def __call__(self):
            if _CLOCK.capturing is not None:
                captured.append((_CLOCK.capturing, self.i))
            _launch()

        def poison(self):
            self.poisoned = True

        def verify(self, rows=None):
            return self.bad

    copies = [Copy(i) for i in range(3)]
    fn = bench._Cycle(copies)

    def timed_graph():
        """The copies of the last graph captured, in capture order."""
        last = captured[-1][0]
        return [i for g, i in captured if g is last]

    for rep, launches in ((0.5, 357), (0.4, 285), (0.3, 213)):  # the estimate's 357, 285 and 214 launches
        bench._time(fn, rep)
        order = timed_graph()
        assert len(order) == launches and {order.count(i) for i in range(3)} == {launches // 3}
        assert all(order[k] == (order[0] + k) % 3 for k in range(len(order)))  # in turn
    assert all(c.poisoned for c in copies)
    many = bench._Cycle([Copy(i) for i in range(5)])
    monkeypatch.setattr(bench, "MAX_LAUNCHES", 2)  # fewer launches than copies: one round of them
    bench._time(many, 0.5)
    assert sorted(timed_graph()) == [0, 1, 2, 3, 4]
    assert fn.verify() == 0
    copies[1].bad = 5  # a middle copy is not checked
    assert fn.verify() == 0
    copies[2].bad, copies[0].bad = 2, 1
    assert fn.verify() == 3
    peers = bench._Cycle([types.SimpleNamespace(verify=lambda rows=None, r=r: r) for r in ((1, 1e-7), (0, 3e-6))])
    assert peers.verify() == (1, 3e-6)
    one = bench._Cycle([types.SimpleNamespace(verify=lambda rows=None: None)])
    assert one.verify() is None


def test_do_bench_timer_times_every_copy_once_a_call(monkeypatch):
    """--timer do_bench sizes its graph from eager calls, in no multiple of the copy count: it times a call of every
    copy in turn, and the figure is that over the copy count."""
    import triton.testing

    calls = []
    fn = bench._Cycle([lambda i=i: calls.append(i) for i in range(4)])

    def fake_do_bench(f, rep, return_mode):
        for _ in range(3):
            f()
        return 0.008  # ms for one call of f

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fake_do_bench)
    monkeypatch.setattr(bench, "TIMER", "do_bench")
    assert bench._time(fn, 20) == pytest.approx(2.0)  # us a launch
    assert calls == [0, 1, 2, 3] * 3
    calls.clear()
    assert bench._time(lambda: calls.append("one"), 20) == pytest.approx(8.0) and calls == ["one"] * 3


def test_rotation_copy_count():
    """ROTATE_BYTES of logits and outputs, in at most MAX_COPIES copies; one copy when the rotation is off."""
    from moegate import RouterConfig

    dsv3 = bench.SHAPES["deepseek-v3-fp32"][0]
    per_copy = 65536 * 256 * 4 + 65536 * 8 * 8
    assert bench._copies(dsv3, torch.float32, 65536) == -(-bench.ROTATE_BYTES // per_copy) == 4
    assert bench._copies(dsv3, torch.bfloat16, 65536) == 8
    assert bench._copies(dsv3, torch.float32, 1) == bench.MAX_COPIES
    assert bench._copies(RouterConfig(8, 2), torch.float32, 0) == bench.MAX_COPIES  # no bytes: no division by 0
    old = bench.ROTATE_BYTES
    try:
        bench.ROTATE_BYTES = 0
        assert bench._copies(dsv3, torch.float32, 65536) == 1
    finally:
        bench.ROTATE_BYTES = old


def test_sglang_output_is_checked_with_rsf_applied_by_the_caller(monkeypatch):
    """SGLang's router leaves rsf to the caller: its weights times rsf are compared with the fp32 reference's (any
    column order); a wrong expert is a counted row, a weight off by 1% is the largest error; the summary says so."""
    monkeypatch.setattr(bench, "VERIFY_ROWS", 16)
    config = bench.SHAPES["deepseek-v3-fp32"][0]
    logits, bias = torch.randn(20, 256), torch.randn(256) * 0.1
    ref_w, ref_ids = bench.route_reference(logits, config, bias=bias)
    perm = torch.randperm(config.top_k)
    seen = []

    def fake_sglang(scores, b, topk, **kw):
        seen.append(kw)
        w, ids = ref_w[:, perm] / config.routed_scaling_factor, ref_ids[:, perm].clone()
        ids[3, 0] = next(e for e in range(256) if e not in ids[3].tolist())
        w[5, 1] *= 1.01
        ids[18, 0] = ids[18, 1]  # past VERIFY_ROWS: not compared
        return w, ids

    peer = bench._SGLang(fake_sglang, logits, config, bias)
    assert peer.verify() is not None and len(seen) == 1  # never called: verify() makes the call
    peer()
    wrong, rel = peer.verify()  # what the last call wrote, no further call
    assert len(seen) == 2 and wrong == 1 and rel == pytest.approx(0.01, rel=1e-3)
    assert seen[0] == seen[1]
    seen.pop()
    assert seen == [{"scoring_func": "sigmoid", "renormalize": True, "routed_scaling_factor": 2.5,
                     "num_expert_group": 8, "topk_group": 4}]
    rows = [{"shape": "x", "T": 64, "moegate": 1.0, "floor": 0.5, "sglang": 3.0, "sglang_check": (wrong, rel)}]
    assert any("sglang's routing against the fp32 reference" in line and "[('x', 64, 1)]" in line
               and "1.00e-02" in line for line in bench.summary(rows))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the providers live on a CUDA device")
def test_providers_rotate_distinct_copies_on_the_gpu(monkeypatch):
    """_providers: every provider cycles through the same copies of the inputs (distinct draws), each copy with its
    own outputs; moegate's copies each route right after one call apiece."""
    config, dtype = bench.SHAPES["deepseek-v3-fp32"]
    T = 16
    per_copy = T * 256 * 4 + T * 8 * 8
    monkeypatch.setattr(bench, "ROTATE_BYTES", 3 * per_copy)
    fns = bench._providers(config, dtype, T, None, {"reference"})
    assert {name: fn.copies for name, fn in fns.items()} == {"moegate": 3, "floor": 3, "floor0": 3, "reference": 3}
    mg = fns["moegate"]
    assert len({c.logits.data_ptr() for c in mg.fns}) == 3 and len({c.out[0].data_ptr() for c in mg.fns}) == 3
    for name in ("floor", "floor0", "reference"):  # each copy its own logits (no late-bound lambda)
        assert [f.__defaults__[0].data_ptr() for f in fns[name].fns] == [c.logits.data_ptr() for c in mg.fns]
    assert not torch.equal(mg.fns[0].logits, mg.fns[1].logits)
    mg.poison()
    for _ in range(3):
        mg()
    torch.cuda.synchronize()
    assert all(not c.out[0].isnan().any() for c in mg.fns) and mg.verify() == 0


def test_row_pad_counts_in_the_rotated_bytes(monkeypatch):
    """--row-pad: a copy's bytes count the rows' padding (the rotation sizes its copies by them)."""
    config, dtype = bench.SHAPES["deepseek-v3-bf16"]
    plain = bench._copy_bytes(config, dtype, 1024)
    monkeypatch.setattr(bench, "ROW_PAD", 8)
    assert bench._copy_bytes(config, dtype, 1024) - plain == 1024 * 8 * 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the providers live on a CUDA device")
def test_providers_pad_rows_on_the_gpu(monkeypatch):
    """--row-pad 8: every copy's logits are views of rows 8 elements wider (16-byte aligned for bf16), the floor and
    moegate read those views, and moegate's copies route right."""
    config, dtype = bench.SHAPES["deepseek-v3-bf16"]
    monkeypatch.setattr(bench, "ROW_PAD", 8)
    monkeypatch.setattr(bench, "ROTATE_BYTES", 2 * bench._copy_bytes(config, dtype, 40))
    fns = bench._providers(config, dtype, 40, None, set())
    mg = fns["moegate"]
    assert mg.copies == 2 and all(c.logits.stride() == (264, 1) for c in mg.fns)
    assert [f.__defaults__[0].stride(0) for f in fns["floor"].fns] == [264, 264]
    mg.poison()
    for _ in range(2):
        mg()
    torch.cuda.synchronize()
    assert mg.verify() == 0
