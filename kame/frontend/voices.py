"""The voices of a PersonaPlex checkpoint: a folder of ``NAME.pt`` (and operator-added ``NAME.wav``).

A ``.pt`` voice is what PersonaPlex's embedding-saving path writes: the
summed input embeddings of every voice-prompt frame but the first
(``embeddings``, ``[frames - 1, 1, 1, dim]``) and its LMGen token cache at
the end of the prompt (``cache``, ``[1, codebooks, 4]``, column = position
modulo 4). A ``.wav`` voice is stepped frame by frame instead, its Mimi
codes forced as the agent's audio (what PersonaPlex does for a wav; its
-24 LUFS loudness normalisation is not applied: give the wav at that level).

The released checkpoint ships them as ``voices.tgz`` with a ``voices/``
folder inside; it is unpacked once next to the archive (or into the cache
directory when that place is read-only).
"""

from __future__ import annotations

import logging
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kame.errors import CheckpointError
from kame.frontend.personaplex import PREFERRED_DEFAULT_VOICE, VOICES_DIR

log = logging.getLogger(__name__)

VOICE_SUFFIXES = (".pt", ".wav")


def voice_stem(name: str) -> str | None:
    """``NAME``, ``NAME.pt`` or ``NAME.wav`` -> ``NAME``; None for anything that could name a path."""
    stem = name.strip()
    for suffix in VOICE_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    if not stem or "/" in stem or "\\" in stem or stem.startswith("."):
        return None
    return stem


class UnknownVoice(ValueError):
    """A voice this checkpoint does not have; the message names the ones it has."""

    def __init__(self, name: str, available: list[str]) -> None:
        listed = ", ".join(available) if available else "none"
        super().__init__(f"unknown voice {name!r}: this checkpoint's voices are {listed}")
        self.name = name
        self.available = available


@dataclass(frozen=True)
class SavedVoice:
    """A ``.pt`` voice: embeddings ``[frames - 1, dim]`` and PersonaPlex's token cache ``[codebooks, columns]``."""

    name: str
    embeddings: Any  # torch.Tensor
    cache: Any  # torch.Tensor (long)

    @property
    def frames(self) -> int:
        """Voice-prompt frames (PersonaPlex saves no embedding for the first one)."""
        return int(self.embeddings.shape[0]) + 1


@dataclass(frozen=True)
class WavVoice:
    """A ``.wav`` voice: 24 kHz mono PCM, encoded by Mimi when first used."""

    name: str
    pcm: Any  # np.ndarray float32


Voice = SavedVoice | WavVoice


def unpack_voices(archive: Path, fallback_root: Path) -> Path:
    """``voices.tgz`` -> its ``voices/`` folder (unpacked once; only regular files and folders)."""
    for root in (archive.parent, fallback_root / "voices" / archive.parent.name):
        target = root / VOICES_DIR
        if target.is_dir():
            return target
        try:
            root.mkdir(parents=True, exist_ok=True)
            with tarfile.open(archive, "r:gz") as tar:
                members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
                tar.extractall(path=root, members=members, filter="data")
        except PermissionError:
            continue
        except (OSError, tarfile.TarError) as exc:
            raise CheckpointError(f"checkpoint file {archive}: not a readable voices archive ({exc})") from None
        if not target.is_dir():
            raise CheckpointError(f"checkpoint file {archive}: has no {VOICES_DIR}/ folder")
        return target
    raise CheckpointError(f"checkpoint file {archive}: no writable place to unpack it")


class VoiceCatalog:
    """The voice names of one folder, loaded on first use and kept (thread-safe)."""

    def __init__(self, directory: Path | None, default: str | None = None) -> None:
        self.directory = directory
        found: dict[str, Path] = {}
        if directory is not None and directory.is_dir():
            for path in sorted(directory.iterdir()):
                if path.suffix in VOICE_SUFFIXES and path.is_file():
                    # a .pt and a .wav of one name: the saved embeddings win (no Mimi pass needed)
                    if path.stem not in found or path.suffix == ".pt":
                        found[path.stem] = path
        self._paths = found
        self._loaded: dict[str, Voice] = {}
        self._lock = threading.Lock()
        if default is not None and default not in found:
            raise CheckpointError(f"frontend.voice {default!r}: not among this checkpoint's voices ({', '.join(self.names) or 'none'})")
        if default is None and found:
            default = PREFERRED_DEFAULT_VOICE if PREFERRED_DEFAULT_VOICE in found else self.names[0]
        self.default = default

    @property
    def names(self) -> list[str]:
        return sorted(self._paths)

    @property
    def wav_names(self) -> list[str]:
        """The voices that are wav files (their Mimi codes are computed once, at warm-up)."""
        return sorted(n for n, p in self._paths.items() if p.suffix == ".wav")

    def choose(self, requested: str | None) -> tuple[str | None, str | None]:
        """For wires that fall back instead of refusing (``/api/chat?voice_prompt=``): the voice to use and
        a one-line notice when the requested one is unknown (then the default is used)."""
        try:
            return self.resolve(requested), None
        except UnknownVoice as exc:
            return self.default, f"{exc}; using {self.default!r}"

    def resolve(self, name: str | None) -> str | None:
        """A requested name (``NAME``, ``NAME.pt`` or ``NAME.wav``; None = the default) -> a known name.

        Raises :class:`UnknownVoice`."""
        if name is None or not str(name).strip():
            return self.default
        stem = voice_stem(str(name))
        if stem is None or stem not in self._paths:
            raise UnknownVoice(str(name), self.names)
        return stem

    def load(self, name: str) -> Voice:
        with self._lock:
            got = self._loaded.get(name)
            if got is None:
                got = self._loaded[name] = self._read(name, self._paths[name])
            return got

    @staticmethod
    def _read(name: str, path: Path) -> Voice:
        if path.suffix == ".wav":
            from kame.audio.files import read_audio

            return WavVoice(name=name, pcm=read_audio(path))
        import torch

        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            embeddings = state["embeddings"]
            cache = state["cache"]
        except Exception as exc:  # noqa: BLE001 - a broken voice file is one clear error
            raise CheckpointError(f"voice file {path}: not a PersonaPlex voice ({exc.__class__.__name__}: {exc})") from None
        embeddings = embeddings.reshape(embeddings.shape[0], embeddings.shape[-1])
        cache = cache.reshape(cache.shape[-2], cache.shape[-1]).long()
        return SavedVoice(name=name, embeddings=embeddings, cache=cache)
