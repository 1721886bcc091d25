"""Host time of one eager route(..., backend="triton") call: what a model that does not replay a CUDA graph pays on
the CPU for every router launch (the kernel's device time is moegate bench's).

    python scripts/host_overhead.py [--presets deepseek-v3,mixtral] [--tokens 64] [--calls 2000] [--repeats 5]

Microseconds a call, the best of --repeats rounds of --calls calls, each with and without `out=` (no allocation):
- `moegate`: route() up to the kernel's launch, with Triton's launch stubbed out (moegate's own checks, launch
  choices and dispatch). Runs anywhere, the CPU included (nothing is launched, so no interpreter runs; on the CPU the
  script sets TRITON_INTERPRET=1 only because route(backend="triton") takes CPU tensors under it alone). A bias on
  the CPU adds the check of its values, which a CUDA bias skips.
- `eager` (CUDA only): whole calls, Triton's launch included, timed on the host over --calls calls and one
  synchronize; for a small T the GPU finishes each kernel before the next call, so this is the host's time a call.
"""

import argparse
import os
import sys
import time

import torch

if not torch.cuda.is_available():  # route(backend="triton") takes CPU tensors under the interpreter only
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from moegate import preset, route  # noqa: E402
from moegate.kernels import router as kr  # noqa: E402


def best_us(call, calls: int, repeats: int, sync) -> float:
    for _ in range(min(calls, 200)):  # warm: caches, the kernel's compile
        call()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="deepseek-v3,kimi-k2,qwen3-moe,mixtral")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"torch {torch.__version__}, device {a.device}, T = {a.tokens}; microseconds a call, best of {a.repeats} "
          f"rounds of {a.calls}")
    print(f"{'preset':<14} {'moegate':>9} {'+out=':>9}" + (f" {'eager':>9} {'+out=':>9}" if cuda else ""))
    for name in a.presets.split(","):
        config = preset(name)
        g = torch.Generator(device=a.device).manual_seed(0)
        logits = torch.randn(a.tokens, config.num_scored, generator=g, device=a.device)
        kw = {"bias": torch.randn(config.num_scored, generator=g, device=a.device) * 0.1} \
            if config.has_correction_bias else {}
        out = route(logits, config, backend="reference", **kw)
        out = (torch.empty_like(out.weights), torch.empty_like(out.ids))
        plain = lambda: route(logits, config, backend="triton", **kw)  # noqa: E731
        into = lambda: route(logits, config, backend="triton", out=out, **kw)  # noqa: E731
        with kr.recorded_launches(run=False):  # Triton's launch stubbed out
            row = [best_us(plain, a.calls, a.repeats, sync), best_us(into, a.calls, a.repeats, sync)]
        if cuda:
            row += [best_us(plain, a.calls, a.repeats, sync), best_us(into, a.calls, a.repeats, sync)]
        print(f"{name:<14} " + " ".join(f"{v:9.1f}" for v in row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
