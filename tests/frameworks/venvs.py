"""Virtual environments for the voice-agent frameworks, outside the checkout, keyed by their pins.

Their pins clash with kame's (openai-agents needs ``websockets<17``, livekit-agents ``openai<3``), so
each framework gets its own environment under ``$KAME_VENVS`` (default ``~/.cache/kame-venvs``),
named ``<name>-<hash of the pins and the Python version>``: a changed pin builds a new one, an
unchanged one is reused. An environment is complete only once its marker file is written, so an
interrupted build is redone. Standard library only: ``python tests/frameworks/venvs.py [NAME ...]``
builds the missing ones in parallel and prints each one's interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: What each framework's environment holds (exact versions of the frameworks the tests are written for).
PINS: dict[str, tuple[str, ...]] = {
    "openai-agents": ("openai-agents==0.24.0", "websockets>=15,<17"),
    "livekit": ("livekit-agents==1.8.9", "livekit-plugins-openai==1.8.9", "livekit-plugins-nvidia[personaplex]==1.8.9"),
    "pipecat": ("pipecat-ai[openai]==1.14.0",),
}
MARKER = ".kame-complete"


def root() -> Path:
    return Path(os.environ.get("KAME_VENVS") or Path.home() / ".cache" / "kame-venvs")


def key(name: str) -> str:
    spec = "\n".join((sys.version.split()[0], *PINS[name]))
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def venv_dir(name: str) -> Path:
    return root() / f"{name}-{key(name)}"


def python_of(name: str) -> Path:
    return venv_dir(name) / "bin" / "python"


def ready(name: str) -> bool:
    return (venv_dir(name) / MARKER).exists()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure(name: str, log: Path | None = None) -> Path:
    """The framework's interpreter, building its environment first if it is missing (safe to call concurrently)."""
    target = venv_dir(name)
    with _lock(target.with_suffix(".lock")):
        if ready(name):
            return python_of(name)
        if target.exists():
            shutil.rmtree(target)
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
        out = open(log, "w") if log is not None else subprocess.DEVNULL
        try:
            subprocess.run(
                [str(target / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", *PINS[name]],
                check=True, stdout=out, stderr=subprocess.STDOUT if log is not None else None,
            )
        finally:
            if log is not None:
                out.close()  # type: ignore[union-attr]
        (target / MARKER).write_text(f"{' '.join(PINS[name])}\nbuilt in {time.monotonic() - started:.0f} s\n")
    return python_of(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(PINS), help=f"frameworks ({', '.join(PINS)}; default: all)")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in PINS]
    if unknown:
        parser.error(f"unknown framework(s): {', '.join(unknown)}")
    started = time.monotonic()
    with ThreadPoolExecutor(len(args.names)) as pool:
        results = dict(zip(args.names, pool.map(lambda n: (ready(n), ensure(n, log=root() / f"{n}-pip.log")), args.names)))
    for name, (was_ready, python) in results.items():
        print(f"venvs: {name}: {'reused' if was_ready else 'built'} {python}")
    print(f"venvs: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
