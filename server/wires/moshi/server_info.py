"""The server info a ``/api/chat`` session announces after its handshake (one 0x04 message).

Kept apart from the session runtime: it reads the host's resolved sampling
and checkpoint and the session's own text sampling, and the wire shape is
:func:`kame.server.wires.moshi.protocol.server_info`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kame.server.wires.moshi import protocol

if TYPE_CHECKING:
    from kame.server.host import ModelHost
    from kame.session.settings import SessionSettings

INSTANCE_NAME = "kame"


def session_server_info(host: ModelHost, settings: SessionSettings) -> protocol.ServerInfo:
    """Text sampling as this session gets it, audio sampling engine-wide, the checkpoint's name."""
    from kame import __version__

    sampling = dict(host.core.sampling) if host.core is not None else {}
    greedy = not sampling.get("use_sampling", True)
    temp_text = float(sampling.get("temp_text", 0.0))
    top_k_text = int(sampling.get("top_k_text", 0))
    if settings.text_temperature is not None:
        temp_text = float(settings.text_temperature)
    if settings.text_topk is not None:  # a session's top-k can only narrow the engine-wide one
        top_k_text = min(top_k_text, int(settings.text_topk)) if top_k_text else int(settings.text_topk)
    configured = host.cfg.frontend.checkpoint
    weights = host.models.files.lm_weights.name if host.models is not None else ""
    local = host.checkpoint_path is not None and Path(host.checkpoint_path).is_dir()
    return protocol.ServerInfo(
        text_temperature=0.0 if greedy else temp_text,
        text_topk=top_k_text,
        audio_temperature=0.0 if greedy else float(sampling.get("temp", 0.0)),
        audio_topk=int(sampling.get("top_k", 0)),
        lm_model_file=protocol.model_file_label(configured, weights, local=local),
        instance_name=INSTANCE_NAME,
        version=f"kame {__version__}",
    )
