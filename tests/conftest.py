"""Test-wide set-up: Triton's interpreter (TRITON_INTERPRET=1, the CPU lane) without its redundant re-patching."""

import os
import sys


def _patch_language_once_a_launch() -> None:
    """Under the interpreter, every call of a ``@triton.jit`` helper inside a kernel re-patches triton.language
    (``_patch_lang``: ``inspect.getmembers`` over ``tl``, ``tl.tensor`` and ``tl.math``), and the router calls
    helpers thousands of times a program: cProfile put a quarter of an interpreted launch there. A helper's
    patches are never restored (the interpreter drops their scope), and the launch's own are restored only when
    the launch ends, so once a module's language is patched in a launch, patching it again changes nothing: this
    does it once a module a launch. Only for Triton 3.6, whose interpreter this was read in."""
    ti = sys.modules.get("triton.runtime.interpreter")
    if ti is None or os.environ.get("TRITON_INTERPRET") != "1":
        return
    if not getattr(sys.modules.get("triton"), "__version__", "").startswith("3.6."):
        return
    grid_call = getattr(getattr(ti, "GridExecutor", None), "__call__", None)
    patch_lang, scope_type = getattr(ti, "_patch_lang", None), getattr(ti, "_LangPatchScope", None)
    if grid_call is None or patch_lang is None or scope_type is None or getattr(ti, "_moegate_patched", False):
        return
    done: set[int] = set()  # id() of the module dicts whose language is patched in the running launch

    def patch_once(fn):
        key = id(fn.__globals__)
        if key in done:
            return scope_type()  # nothing to restore
        done.add(key)
        return patch_lang(fn)

    def launch(self, *args, **kwargs):
        done.clear()
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            done.clear()

    ti._patch_lang = patch_once
    ti.GridExecutor.__call__ = launch
    ti._moegate_patched = True


def pytest_collection_finish(session):
    # After collection: the kernel's test modules set TRITON_INTERPRET before they import Triton, which must not
    # be imported earlier (its language would be built for the compiler, not the interpreter).
    _patch_language_once_a_launch()
