"""The composition root of sessions: the shared parts every session's pipeline is built from.

Servers (:class:`~kame.server.host.ModelHost`), ``kame run`` and the
benchmarks build one :class:`SessionRoot` after loading their models and ask
it for a :class:`~kame.session.pipeline.Pipeline` per session; nothing else
builds a pipeline or touches an engine slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kame.asr.config import EchoGuardConfig
from kame.frontend.engine_thread import COMMAND_TIMEOUT_S
from kame.session.pipeline import MAX_QUEUED_FRAMES, Pipeline, Recognizer
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from kame.backend.registry import BackendRegistry
    from kame.frontend.engine_thread import EngineThread
    from kame.frontend.models import FrontendModels
    from kame.oracle.config import OracleConfig
    from kame.oracle.session_tools import ToolCatalog
    from kame.session.responses.backend import ResponsesOffer


@dataclass
class SessionRoot:
    """What sessions share: the engine thread, the oracle config, the back-ends, the recogniser and the
    front-end's tokenizer (``encode`` for answers, ``piece_of`` for the model's text)."""

    engine: EngineThread
    oracle_config: OracleConfig
    registry: BackendRegistry | None
    recognizer: Recognizer | None
    encode: Callable[[str], Sequence[int]]
    piece_of: Callable[[int], str] | None
    #: Which text ids carry text (the loaded LM's pad and end-of-padding ids).
    vocab: TextVocab = MOSHI_VOCAB
    #: Bound on an attach or reset of a slot; beyond it the session fails (the engine is stuck).
    command_timeout_s: float = COMMAND_TIMEOUT_S
    #: Function tools: the MCP servers and the tool loop's bounds (None: no tools).
    tools: ToolCatalog | None = None
    #: The echo guard's settings (``asr.echo_guard``; None: the defaults).
    echo_guard: EchoGuardConfig | None = None
    #: Responses delegation as the server offers it (its back-ends, MCP tools and limits; None: not offered).
    responses: ResponsesOffer | None = None

    @classmethod
    def for_models(
        cls,
        engine: EngineThread,
        models: FrontendModels,
        *,
        oracle_config: OracleConfig,
        registry: BackendRegistry | None,
        recognizer: Recognizer | None,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        tools: ToolCatalog | None = None,
        echo_guard: EchoGuardConfig | None = None,
        responses: ResponsesOffer | None = None,
    ) -> SessionRoot:
        """The root for loaded front-end models (their tokenizer and vocabulary): what the server and
        ``kame run`` both build, so that the two compose sessions the same way."""
        from kame.session.pipeline import piece_lookup

        return cls(
            engine=engine,
            oracle_config=oracle_config,
            registry=registry if registry is not None and registry.names else None,
            recognizer=recognizer,
            encode=models.encode_text,
            piece_of=piece_lookup(models.tokenizer),
            vocab=models.vocab,
            command_timeout_s=command_timeout_s,
            tools=tools,
            echo_guard=echo_guard,
            responses=responses,
        )

    def pipeline(self, settings: SessionSettings | None = None, *, max_queued_frames: int = MAX_QUEUED_FRAMES) -> Pipeline:
        """A new session's pipeline (enter it with ``async with`` to attach its slot)."""
        return Pipeline(
            engine=self.engine,
            oracle_config=self.oracle_config,
            registry=self.registry,
            recognizer=self.recognizer,
            encode=self.encode,
            piece_of=self.piece_of,
            settings=settings or SessionSettings(),
            vocab=self.vocab,
            timeout_s=self.command_timeout_s,
            max_queued_frames=max_queued_frames,
            tools=self.tools,
            echo_guard=self.echo_guard,
            responses=self.responses,
        )
