"""Test-wide set-up: Triton's interpreter (TRITON_INTERPRET=1, the CPU lane) without the work it repeats or throws away
(re-patching the language, tuple types nobody reads, its numpy dtype table, overflow checks it discards), each the
same result for less time; tests/test_kernel.py::test_interpreter_speedups_change_nothing holds them to that."""

import dataclasses
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


def _lazy_tuple_types() -> None:
    """Under the interpreter every tensor op builds a block type, whose shape is a ``tl.tuple``, whose type (a
    ``tuple_type`` of one ``constexpr_type`` a dimension, with its name string) ``tl.tuple.__init__`` computes at
    once, and which is almost never read: cProfile put a fifth of an interpreted thread-rows launch there. This
    computes it when first read instead: the same function of the same values (``_setitem``, the one mutation, sets
    the type again at once). Only for Triton 3.6, whose language this was read in."""
    core = sys.modules.get("triton.language.core")
    if core is None or os.environ.get("TRITON_INTERPRET") != "1":
        return
    if not getattr(sys.modules.get("triton"), "__version__", "").startswith("3.6."):
        return
    cls, tuple_type = getattr(core, "tuple", None), getattr(core, "tuple_type", None)
    type_of = getattr(core, "_type_for_tuple_values", None)
    if cls is None or tuple_type is None or type_of is None or getattr(core, "_moegate_lazy_tuples", False):
        return

    def __init__(self, args, type=None):
        self.values = [i for i in args]
        if isinstance(type, tuple_type):
            self._type = type
        elif type is not None:  # a list of types (ASTFunction.deserialize)
            self._type = tuple_type(type)
        else:
            self._type = None

    def get_type(self):
        t = self.__dict__.get("_type")
        if t is None:
            t = self._type = type_of(self.values)
        return t

    def set_type(self, t):
        self._type = t

    cls.__init__ = __init__
    cls.type = property(get_type, set_type)
    core._moegate_lazy_tuples = True


def _np_dtypes_once() -> None:
    """The interpreter's ``_get_np_dtype`` (Triton dtype -> numpy dtype, called on every op) builds its table of 17
    numpy dtypes anew on each call: a tenth of an interpreted launch (cProfile). This builds the table once, from
    the function's own answers, and keeps its branches for pointers and blocks. Only for Triton 3.6."""
    ti = sys.modules.get("triton.runtime.interpreter")
    if ti is None or os.environ.get("TRITON_INTERPRET") != "1":
        return
    if not getattr(sys.modules.get("triton"), "__version__", "").startswith("3.6."):
        return
    slow, tl = getattr(ti, "_get_np_dtype", None), sys.modules.get("triton.language")
    if slow is None or tl is None or getattr(ti, "_moegate_np_dtypes", False):
        return
    names = ("int1", "float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
             "uint64", "bfloat16", "float8e5", "float8e5b16", "float8e4nv", "float8e4b8", "float8e4b15")
    table = {getattr(tl, n): slow(getattr(tl, n)) for n in names if hasattr(tl, n)}
    pointer, block, u64 = tl.pointer_type, tl.block_type, ti.np.dtype(ti.np.uint64)

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, pointer):
            return u64
        if isinstance(tt_dtype, block):
            tt_dtype = tt_dtype.element_ty
            if isinstance(tt_dtype, pointer):
                return u64
        return table[tt_dtype]

    ti._get_np_dtype = np_dtype
    ti._moegate_slow_np_dtype = slow  # for the test that holds the two equal
    ti._moegate_np_dtypes = True


def _no_discarded_overflow_checks() -> None:
    """The interpreter's options ask for integer-overflow checks (``sanitize_overflow``): every 32-bit integer add,
    sub and mul is done again in int64 and compared with the int32 range, and the result goes to ``device_assert``,
    which drops it unless ``debug`` is on (it is off). A third of an interpreted thread-rows launch went there
    (cProfile). With debug off this turns the checks off; what every op computes is unchanged. Only for Triton 3.6."""
    ti = sys.modules.get("triton.runtime.interpreter")
    if ti is None or os.environ.get("TRITON_INTERPRET") != "1":
        return
    if not getattr(sys.modules.get("triton"), "__version__", "").startswith("3.6."):
        return
    builder = getattr(ti, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def pytest_collection_finish(session):
    # After collection: the kernel's test modules set TRITON_INTERPRET before they import Triton, which must not
    # be imported earlier (its language would be built for the compiler, not the interpreter).
    _patch_language_once_a_launch()
    _lazy_tuple_types()
    _np_dtypes_once()
    _no_discarded_overflow_checks()
    _apply_settings()


class _SettingsError:
    """The parser stand-in that moegate.bench._parse_settings reports to: a usage error of pytest's."""

    @staticmethod
    def error(message):
        import pytest

        raise pytest.UsageError(f"MOEGATE_SET: {message}")


def _apply_settings() -> None:
    """MOEGATE_SET="NAME=VALUE;NAME=VALUE": launcher settings of moegate.kernels.router (as ``moegate bench --set``)
    for the whole run, so that the GPU suite can run on a form that is not the default yet (scripts/gpu_check.sh).
    Applied after collection: the kernel's test modules choose Triton's interpreter before anything imports it."""
    items = [item for item in os.environ.get("MOEGATE_SET", "").split(";") if item.strip()]
    if not items:
        return
    import moegate.kernels.router as kr
    from moegate.bench import _parse_settings

    for name, value in _parse_settings(_SettingsError, items).items():
        setattr(kr, name, value)


def _shard():
    """MOEGATE_SHARD=i/n as (i, n), or None where unset; malformed or out of range: a usage error."""
    shard = os.environ.get("MOEGATE_SHARD", "").strip()
    if not shard:
        return None
    import pytest

    try:
        i, n = (int(v) for v in shard.split("/"))
    except ValueError:
        raise pytest.UsageError(f"MOEGATE_SHARD={shard!r}: expected i/n with integers 1 <= i <= n") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"MOEGATE_SHARD={shard!r}: expected i/n with 1 <= i <= n")
    return i, n


def pytest_configure(config):
    _shard()  # a bad shard stops the run before collection


def pytest_collection_modifyitems(config, items):
    """MOEGATE_SHARD=i/n keeps the collected tests i, i + n, i + 2n, ... (1-based), so that a suite longer than one
    device call runs in n calls (scripts/gpu_check.sh's SHARD). Every xdist worker collects the same items in the
    same order, so each keeps the same shard."""
    shard = _shard()
    if shard is None:
        return
    i, n = shard
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i - 1])
    items[:] = [item for k, item in enumerate(items) if k % n == i - 1]
