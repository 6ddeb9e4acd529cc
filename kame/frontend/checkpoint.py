"""Finding a checkpoint's files: a local directory or a Hub repo, in moshi's layout.

A checkpoint is a directory (or Hub repo) with ``config.json`` in the format
``moshi``'s ``CheckpointInfo`` reads (``moshi_name``, ``mimi_name``,
``mimi_config_name``, ``tokenizer_name``, ``model_type``, ``lm_gen_config``;
every other key is an ``LMModel`` keyword). Without ``config.json`` a
directory is read with moshi's default file names and the 7B config.
A local path always wins over a Hub id of the same spelling.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kame.errors import CheckpointError
from kame.frontend.personaplex import MODEL_TYPE, VOICES_ARCHIVE, VOICES_DIR, is_personaplex, personaplex_lm_kwargs

#: Keys of config.json that are not LMModel keywords (moshi pops the same ones).
NON_LM_KEYS = (
    "moshi_name",
    "mimi_name",
    "mimi_config_name",
    "tokenizer_name",
    "lora_name",
    "model_type",
    "lm_gen_config",
    "tts_config",
    "stt_config",
    "model_id",
    "personaplex",  # kame's: a PersonaPlex checkpoint's prompt tokens (kame.frontend.personaplex)
)


@dataclass(frozen=True)
class CheckpointFiles:
    """Resolved local paths and the parsed config of one checkpoint."""

    source: str
    lm_weights: Path
    mimi_weights: Path
    tokenizer: Path
    mimi_config_path: Path | None = None
    raw_config: dict[str, Any] | None = None
    lm_kwargs: dict[str, Any] | None = None  # None = moshi's 7B defaults
    lm_gen_config: dict[str, Any] = field(default_factory=dict)
    stt_config: dict[str, Any] = field(default_factory=dict)
    model_type: str = "moshi"
    #: the LoRA adapters named by config.json's ``lora_name`` (a fine-tune saved by moshi-finetune)
    lora_weights: Path | None = None
    #: A PersonaPlex checkpoint's voices: a ``voices/`` folder or ``voices.tgz`` (None: no voices).
    voices: Path | None = None
    personaplex: bool = False

    @property
    def mimi_config(self) -> dict[str, Any] | None:
        if self.mimi_config_path is None:
            return None
        return _read_json(self.mimi_config_path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint file {path}: cannot be read as JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint file {path}: expected a JSON object")
    return data


def _default_names() -> dict[str, str]:
    from moshi.models import loaders

    return {
        "moshi_name": loaders.MOSHI_NAME,
        "mimi_name": loaders.MIMI_NAME,
        "tokenizer_name": loaders.TEXT_TOKENIZER_NAME,
    }


def _split_config(raw: dict[str, Any] | None) -> tuple[dict[str, str | None], dict[str, Any] | None, dict[str, Any]]:
    names: dict[str, str | None] = dict(_default_names())
    names["mimi_config_name"] = None
    names["lora_name"] = None
    if raw is None:
        return names, None, {}
    lm_kwargs = {k: v for k, v in raw.items() if k not in NON_LM_KEYS}
    for key in ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "lora_name"):
        if raw.get(key):
            names[key] = raw[key]
    extra: dict[str, Any] = {k: raw[k] for k in ("model_type", "lm_gen_config", "stt_config") if k in raw}
    return names, lm_kwargs, extra


def _local_file(directory: Path, name: str, what: str) -> Path:
    path = Path(name) if os.path.isabs(name) else directory / name
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path}: missing ({what})")
    return path


def parse_hf_name(name: str) -> tuple[str, str] | None:
    """``hf://owner/repo/path/in/repo`` (moshi's ``hf_get`` names) -> (``owner/repo``, path); else None."""
    if not name.startswith("hf://"):
        return None
    parts = name.removeprefix("hf://").split("/")
    if len(parts) < 3 or not all(parts):
        raise CheckpointError(f"file name {name}: expected hf://OWNER/REPO/FILE")
    return "/".join(parts[:2]), "/".join(parts[2:])


def _local_or_hf(directory: Path, name: str, what: str) -> Path:
    """A file named in a local copy's config.json: a path inside the directory, or an ``hf://``
    name -- found in the copy (``FILE``, ``OWNER/REPO/FILE`` or its base name), else in the
    Hugging Face cache or the Hub, at that repo's default revision."""
    hf = parse_hf_name(name)
    if hf is None:
        return _local_file(directory, name, what)
    repo, inner = hf
    for candidate in (directory / inner, directory / repo / inner, directory / Path(inner).name):
        if candidate.is_file():
            return candidate
    got = _hub_file(repo, inner, None)
    assert got is not None
    return got


def resolve_local(directory: Path) -> CheckpointFiles:
    """Read a checkpoint directory; every missing file is one sentence naming it."""
    config_path = directory / "config.json"
    raw = _read_json(config_path) if config_path.is_file() else None
    names, lm_kwargs, extra = _split_config(raw)
    mimi_cfg = names["mimi_config_name"]
    voices = _local_voices(directory)
    personaplex = is_personaplex(raw, voices is not None)
    if personaplex:
        lm_kwargs = personaplex_lm_kwargs(lm_kwargs)
    return CheckpointFiles(
        source=str(directory),
        lm_weights=_local_or_hf(directory, str(names["moshi_name"]), "LM weights"),
        mimi_weights=_local_or_hf(directory, str(names["mimi_name"]), "Mimi weights"),
        tokenizer=_local_or_hf(directory, str(names["tokenizer_name"]), "SentencePiece tokenizer"),
        mimi_config_path=_local_or_hf(directory, mimi_cfg, "Mimi config") if mimi_cfg else None,
        raw_config=raw,
        lm_kwargs=lm_kwargs,
        lm_gen_config=dict(extra.get("lm_gen_config") or {}),
        stt_config=dict(extra.get("stt_config") or {}),
        model_type=str(extra.get("model_type", "moshi")),
        lora_weights=_local_or_hf(directory, str(names["lora_name"]), "LoRA weights") if names["lora_name"] else None,
        voices=voices,
        personaplex=personaplex,
    )


def _local_voices(directory: Path) -> Path | None:
    """A local checkpoint's voices: its ``voices/`` folder, else its ``voices.tgz``."""
    folder = directory / VOICES_DIR
    if folder.is_dir():
        return folder
    archive = directory / VOICES_ARCHIVE
    return archive if archive.is_file() else None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _missing_hint(repo: str) -> str:
    return (
        f"run `kame download --checkpoint {repo}` on a machine with network access "
        f"(or set frontend.checkpoint to a local directory)"
    )


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """One quick TCP connect to the Hub endpoint, so a machine without network
    fails at once instead of after huggingface_hub's retries with backoff."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def access_denied_message(repo: str, status: int | None, gated: bool) -> str:
    """The one sentence for a repo the Hub refuses (401/403: gated, private, or no such repo)."""
    from kame.frontend.catalog import KNOWN_CHECKPOINTS

    why = "is gated" if gated else "is private, gated or does not exist"
    code = f" (HTTP {status})" if status else ""
    known = KNOWN_CHECKPOINTS.get(repo)
    licence = f" (licence {known.licence})" if known is not None else ""
    return (
        f"model {repo} {why}{code}: accept its terms{licence} on https://huggingface.co/{repo} with an account "
        f"that has access, and set HF_TOKEN to a token of that account (or `huggingface-cli login`)"
    )


def _access_denied(repo: str, exc: BaseException) -> str | None:
    """The sentence for a 401/403 from the Hub, None for any other error."""
    from huggingface_hub.utils import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    # huggingface_hub wraps some HTTP errors of its HEAD call (a 403 without an error code) in
    # LocalEntryNotFoundError: look down the chain of causes.
    seen: BaseException | None = exc
    while seen is not None and not (
        isinstance(seen, HfHubHTTPError) and getattr(getattr(seen, "response", None), "status_code", None)
    ):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    exc = seen
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError):
        return access_denied_message(repo, status, gated=True)
    if isinstance(exc, RepositoryNotFoundError) or status in (401, 403):
        return access_denied_message(repo, status, gated=False)
    return None


def _hub_file(repo: str, filename: str, revision: str | None, *, required: bool = True) -> Path | None:
    """One file of a Hub repo: from the local cache, else downloaded (unless offline)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo, filename, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, EntryNotFoundError, FileNotFoundError, OSError):
        pass
    if hub_offline():
        if not required:
            return None
        raise CheckpointError(
            f"model {repo} ({filename}) is not in the local cache and HF_HUB_OFFLINE is set: {_missing_hint(repo)}"
        )
    if not hub_reachable():
        raise CheckpointError(
            f"model {repo} ({filename}) is not in the local cache and the Hub cannot be reached: {_missing_hint(repo)}"
        )
    try:
        return Path(hf_hub_download(repo, filename, revision=revision))
    except Exception as exc:  # network errors, unknown repo, gated repo...
        denied = _access_denied(repo, exc)
        if denied is not None:
            raise CheckpointError(denied) from None
        if exc.__class__.__name__ in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
            if not required:
                return None
            raise CheckpointError(f"checkpoint {repo}: the repo has no file {filename}") from None
        raise CheckpointError(
            f"model {repo} ({filename}) could not be downloaded ({exc.__class__.__name__}): {_missing_hint(repo)}"
        ) from None


def resolve_hub(repo: str, revision: str | None = None) -> CheckpointFiles:
    config_path = _hub_file(repo, "config.json", revision, required=False)
    raw = _read_json(config_path) if config_path is not None else None
    names, lm_kwargs, extra = _split_config(raw)

    def get(name: str | None) -> Path:
        assert name is not None
        hf = parse_hf_name(name)
        if hf is None:
            got = _hub_file(repo, name, revision)
        else:  # another repo's file (moshi's hf:// names): the pinned revision is this checkpoint's only
            other, inner = hf
            got = _hub_file(other, inner, revision if other == repo else None)
        assert got is not None
        return got

    mimi_cfg = names["mimi_config_name"]
    # Only a repo that says it is PersonaPlex (config.json, or its name) is asked for voices: any other
    # one would cost a Hub request (or fail offline) for a file it does not have.
    voices = None
    if is_personaplex(raw, False) or MODEL_TYPE in repo.lower():
        voices = _hub_file(repo, VOICES_ARCHIVE, revision, required=False)
    personaplex = is_personaplex(raw, voices is not None)
    if personaplex:
        lm_kwargs = personaplex_lm_kwargs(lm_kwargs)
    return CheckpointFiles(
        source=repo,
        lm_weights=get(names["moshi_name"]),
        mimi_weights=get(names["mimi_name"]),
        tokenizer=get(names["tokenizer_name"]),
        mimi_config_path=get(mimi_cfg) if mimi_cfg else None,
        raw_config=raw,
        lm_kwargs=lm_kwargs,
        lm_gen_config=dict(extra.get("lm_gen_config") or {}),
        stt_config=dict(extra.get("stt_config") or {}),
        model_type=str(extra.get("model_type", "moshi")),
        lora_weights=get(names["lora_name"]) if names["lora_name"] else None,
        voices=voices,
        personaplex=personaplex,
    )


def resolve_lora_file(spec: str | Path) -> Path:
    """A LoRA file given by hand (``--lora-weight``): a local path, or ``hf://OWNER/REPO/FILE``."""
    text = str(spec)
    hf = parse_hf_name(text)
    if hf is not None:
        got = _hub_file(hf[0], hf[1], None)
        assert got is not None
        return got
    path = Path(os.path.expanduser(text.removeprefix("file://")))
    if not path.is_file():
        raise CheckpointError(f"LoRA weights {path}: no such file")
    return path


TINY_PREFIX = "tiny:"


def is_tiny(spec: str | Path) -> bool:
    return str(spec).startswith(TINY_PREFIX)


def tiny_seed(spec: str) -> int:
    raw = spec[len(TINY_PREFIX) :] or "0"
    try:
        return int(raw)
    except ValueError:
        raise CheckpointError(f"checkpoint {spec!r}: expected tiny:SEED with an integer seed") from None


def default_cache_dir() -> Path:
    """``$KAME_CACHE_DIR``, else ``~/.cache/kame`` (the config's ``cache_dir`` default)."""
    return Path(os.path.expanduser(os.environ.get("KAME_CACHE_DIR") or "~/.cache/kame"))


def resolve_spec(spec: str | Path, cache_dir: str | Path | None = None, *, stt: bool = False) -> str:
    """``tiny:SEED`` -> the cached tiny checkpoint directory (made on first use; an STT-shaped
    one with ``stt``); anything else unchanged."""
    text = str(spec)
    if not is_tiny(text):
        return text
    from kame.frontend.tiny import ensure_tiny_checkpoint

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return str(ensure_tiny_checkpoint(root, tiny_seed(text), stt=stt))


def resolve_checkpoint(
    spec: str | Path,
    revision: str | None = None,
    *,
    cache_dir: str | Path | None = None,
    stt: bool = False,
) -> CheckpointFiles:
    """``tiny:SEED``, a local directory if one exists at ``spec``, else a Hub repo id."""
    spec = resolve_spec(spec, cache_dir, stt=stt)
    path = Path(os.path.expanduser(str(spec)))
    if path.is_dir():
        return resolve_local(path)
    if path.exists():
        raise CheckpointError(f"checkpoint {path}: is a file, expected a directory or a Hub repo id")
    text = str(spec)
    if text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"checkpoint {text}: no such directory, and not a Hub repo id (owner/name)")
    return resolve_hub(text, revision)
