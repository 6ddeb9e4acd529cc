"""The one gate every call into moshi passes: a process-wide lock and moshi's switches as the caller wants them.

moshi keeps its torch.compile and CUDA-graph switches in process globals
(``moshi.utils.compile``: ``_compile_disabled``, ``_disable_cuda_graph`` and
``_in_cuda_graph``, the last asserted false on entry to any graphed call).
Two threads inside moshi at once (the front-end engine and a Kyutai STT
thread) would see each other's switches, or trip that assertion. So every
model call of kame runs inside :func:`moshi_call`: it holds :data:`MOSHI_LOCK`
and sets both switches from the caller's :class:`MoshiMode` for the call's
duration, whatever another caller or the environment set.

moshi reads ``NO_TORCH_COMPILE`` once, when its modules are imported:
:func:`make_kernels_compilable` wraps its kernels with moshi's own lazy
compiler when a setting asks for compile. :func:`install_gate_check`
(tests; ``KAME_MOSHI_GATE_CHECK=1``) makes any call into moshi's models
without the gate raise :class:`GateNotHeld`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

#: Held by every call into moshi's models (re-entrant: an engine tick steps a shared STT inside its own call).
MOSHI_LOCK = threading.RLock()

CompileSetting = Literal["auto", "on", "off"]

#: moshi's functions decorated with ``torch_compile_lazy`` that inference reaches (module, name).
_KERNELS = (
    ("moshi.modules.transformer", "_rms_norm"),
    ("moshi.modules.gating", "gating_forward_kernel"),
    ("moshi.modules.rope", "apply_rope"),
)


@dataclass(frozen=True)
class MoshiMode:
    """How one model's calls run: compiled kernels or eager, CUDA graphs or not."""

    compile: bool = False
    cuda_graphs: bool = True


def resolve_compile(setting: CompileSetting, device_type: str) -> bool:
    """``frontend.compile`` as in effect: ``auto`` compiles on CUDA only (on CPU it costs start time, gains little)."""
    if setting == "auto":
        return device_type == "cuda"
    return setting == "on"


def make_kernels_compilable() -> int:
    """Wrap moshi's kernels that were imported as plain functions (``NO_TORCH_COMPILE`` set then) with moshi's
    own lazy compiler; returns how many were wrapped. Idempotent."""
    compile_mod = importlib.import_module("moshi.utils.compile")
    wrapped = 0
    with MOSHI_LOCK:
        for module_name, name in _KERNELS:
            module = importlib.import_module(module_name)
            fun = getattr(module, name)
            if hasattr(fun, "__wrapped__"):  # torch_compile_lazy's functools.wraps marks its wrapper
                continue
            if getattr(fun, "_kame_gate_checked", False):  # under install_gate_check: tests on CPU
                continue
            saved = os.environ.pop("NO_TORCH_COMPILE", None)
            try:
                setattr(module, name, compile_mod.torch_compile_lazy(fun))
            finally:
                if saved is not None:
                    os.environ["NO_TORCH_COMPILE"] = saved
            wrapped += 1
    return wrapped


@contextlib.contextmanager
def moshi_call(mode: MoshiMode) -> Iterator[None]:
    """Run the body alone in moshi, with ``mode``'s compile and CUDA-graph switches (restored after)."""
    from moshi.utils import compile as moshi_compile

    with MOSHI_LOCK:
        saved = (moshi_compile._compile_disabled, moshi_compile._disable_cuda_graph)
        moshi_compile._compile_disabled = not mode.compile
        moshi_compile._disable_cuda_graph = not mode.cuda_graphs
        try:
            yield
        finally:
            moshi_compile._compile_disabled, moshi_compile._disable_cuda_graph = saved


class GateNotHeld(AssertionError):
    """A call into moshi's models from a thread that does not hold :data:`MOSHI_LOCK`."""


#: What :func:`install_gate_check` wraps: moshi's graph wrapper, its model entry points, then its kernels.
_CHECKED_METHODS = (
    ("moshi.utils.compile", "CUDAGraphed", "__call__"),
    ("moshi.models.compression", "MimiModel", "encode"),
    ("moshi.models.compression", "MimiModel", "decode"),
    ("moshi.models.lm", "LMGen", "_step"),
)
_checks: list[tuple[Any, str, Any]] = []


def _gate_held() -> bool:
    return bool(MOSHI_LOCK._is_owned())  # type: ignore[attr-defined]  # RLock: held by this thread


def _checked(fun: Any, what: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        if not _gate_held():
            raise GateNotHeld(f"{what} called outside kame's moshi gate (thread {threading.current_thread().name})")
        return fun(*args, **kwargs)

    call._kame_gate_checked = True  # type: ignore[attr-defined]
    return call


def install_gate_check() -> bool:
    """Make every call of moshi's graph wrapper (``CUDAGraphed``), Mimi's encode and decode, the LM's step and
    moshi's compiled kernels raise :class:`GateNotHeld` outside :func:`moshi_call`; False if already installed.
    For tests on CPU (the check itself would be traced by torch.compile). :func:`remove_gate_check` undoes it."""
    if _checks:
        return False
    with MOSHI_LOCK:
        for module_name, cls_name, attr in _CHECKED_METHODS:
            cls = getattr(importlib.import_module(module_name), cls_name)
            fun = cls.__dict__[attr]
            _checks.append((cls, attr, fun))
            setattr(cls, attr, _checked(fun, f"moshi {cls_name}.{attr}"))
        for module_name, name in _KERNELS:
            module = importlib.import_module(module_name)
            fun = getattr(module, name)
            _checks.append((module, name, fun))
            setattr(module, name, _checked(fun, f"moshi kernel {name}"))
    return True


def remove_gate_check() -> None:
    with MOSHI_LOCK:
        while _checks:
            owner, name, fun = _checks.pop()
            setattr(owner, name, fun)


def gate_check_from_env(environ: Any = None) -> bool:
    """:func:`install_gate_check` when ``KAME_MOSHI_GATE_CHECK`` is 1 (the test suite's servers set it)."""
    env = os.environ if environ is None else environ
    return env.get("KAME_MOSHI_GATE_CHECK") == "1" and install_gate_check()


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process (dynamo's own counter; 0 when nothing compiled)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    return int(utils.counters["stats"].get("unique_graphs", 0))


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, short enough for one log line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    head = lines[0] if lines else ""
    if head.endswith(":") and len(lines) > 1:  # "backend='inductor' raised:" then the cause
        head = f"{head} {lines[1]}"
    return f"{type(exc).__name__}: {head[:300]}" if head else type(exc).__name__
