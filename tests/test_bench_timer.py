"""The benchmark's graph timer (moegate.bench._time), on a simulated GPU clock: no CUDA needed.

A fake CUDA graph records how many launches its capture made; a replay advances the clock by a fixed cost of the
graph's own plus one launch's cost per captured launch; eager calls cost the host only. The timer must size its
graph from a graph (not from eager calls) and report the launch's cost plus only that overhead's share.
"""

import contextlib

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
