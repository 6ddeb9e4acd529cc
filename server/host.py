"""The model host: loads the front-end (and ASR) once, warms the engine up, and builds sessions' pipelines.

Loading runs in a thread so the server answers ``/health`` ("starting")
meanwhile. Order: resolve the checkpoint (``tiny:SEED`` = the tiny random
checkpoint for ``SEED``, created in ``cache_dir`` on first use), load Mimi +
LM + tokenizer, build the batched :class:`EngineCore` with one slot per
allowed session, tick every slot a few times with silence (on GPU this also
captures the CUDA graphs) and start the :class:`EngineThread`. Only then is
the host ``ready``.

:meth:`ModelHost.new_pipeline` hands out sessions' pipelines from the
host's :class:`~kame.session.root.SessionRoot` (the composition root).
Should the engine thread die, the host turns ``failed``: ``/health`` and
``/ready`` answer 503, new sessions are refused and live ones end (1011).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kame.asr.factory import create_recognizer
from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
from kame.backend.registry import BackendRegistry
from kame.errors import UserError
from kame.frontend.checkpoint import is_tiny, resolve_checkpoint, resolve_spec, tiny_seed
from kame.frontend.moshi_gate import MoshiMode, compiled_graphs, resolve_compile
from kame.oracle.session_tools import ToolCatalog
from kame.server.telemetry.metrics import CLIENT_FUNCTION_LABEL
from kame.session.responses.backend import ResponsesOffer, responses_offer

if TYPE_CHECKING:
    import torch

    from kame.config import KameConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.engine_thread import EngineThread
    from kame.frontend.models import FrontendModels
    from kame.server.config import AppConfig
    from kame.server.telemetry.metrics import ServerMetrics
    from kame.session.pipeline import Pipeline
    from kame.session.root import SessionRoot
    from kame.session.settings import SessionSettings

log = logging.getLogger("kame.server.host")

CPU_DEMO_HINT = "kame serve --config cpu-demo"

STARTING, READY, FAILED, STOPPED = "starting", "ok", "failed", "stopped"


def resolve_checkpoint_spec(checkpoint: str, cache_dir: Path) -> str:
    """``tiny:SEED`` -> the cached tiny checkpoint directory (made on first use); anything else as is."""
    return resolve_spec(checkpoint, cache_dir)


def choose_device(cfg: KameConfig) -> torch.device:
    """The device to serve on, or a one-line :class:`UserError` saying how to run the CPU demo."""
    # deferred: torch (seconds to import) only when a server picks its device, not when this module loads
    import torch

    from kame.frontend.loading import resolve_device

    if is_tiny(cfg.frontend.checkpoint):
        tiny_seed(cfg.frontend.checkpoint)  # validate early
    has_cuda = torch.cuda.is_available()
    wants_cuda = cfg.device.startswith("cuda")
    if not has_cuda and not is_tiny(cfg.frontend.checkpoint) and (cfg.device == "auto" or wants_cuda):
        raise UserError(
            f"no CUDA GPU found: the front-end checkpoint {cfg.frontend.checkpoint} needs one "
            f"(the real model is slower than real time on CPU); run the CPU demo instead: {CPU_DEMO_HINT}"
        )
    device = resolve_device(cfg.device)
    if device.type == "cpu" and not is_tiny(cfg.frontend.checkpoint):
        log.warning(
            "serving %s on the CPU: a real Moshi-sized model runs far slower than real time there",
            cfg.frontend.checkpoint,
        )
    return device


def engine_batch_size(cfg: AppConfig) -> int:
    """Slots of the server's engine = concurrent sessions: ``frontend.batch_size`` (the one setting;
    a deprecated ``server.max_sessions`` has been moved there while the config was loaded)."""
    return int(cfg.frontend.batch_size)


class ModelHost:
    """Models, engine and back-ends of one server; the session factory."""

    def __init__(
        self,
        cfg: AppConfig,
        device: torch.device | str,
        metrics: ServerMetrics,
        *,
        environ: Mapping[str, str] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = str(device)
        self.metrics = metrics
        self.environ = os.environ if environ is None else environ
        self.on_failure = on_failure
        self.max_sessions = engine_batch_size(cfg)
        self.state = STARTING
        self.error: str | None = None
        self.models: FrontendModels | None = None
        self.core: EngineCore | None = None
        self.engine: EngineThread | None = None
        self.recognizer: Any = None
        self.backends: BackendRegistry | None = None
        self.tools: ToolCatalog | None = None
        self._warming: asyncio.Task[None] | None = None
        self.checkpoint_path: str | None = None
        self.load_seconds: float | None = None
        self.root: SessionRoot | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        metrics.sessions_max.set(self.max_sessions)

    # ------------------------------------------------------------------ start / stop
    def open_backends(self) -> None:
        """Build the back-end registry (in the event loop: back-ends own async HTTP clients)."""

        self.backends = BackendRegistry.from_config(
            self.cfg, self.environ, observers=[self.metrics.on_backend_event]
        )
        if not self.backends.names:
            log.warning(
                "NO LLM BACK-END CONFIGURED: serving the Moshi front-end alone (no oracle answers). "
                "Set KAME_LLM_BASE_URL (and KAME_LLM_API_KEY) or add `backends:` to the config."
            )
        else:
            log.info("LLM back-ends: %s (default %s)", ", ".join(self.backends.names), self.backends.default_name)
        self.open_tools()

    def open_tools(self) -> None:
        """The MCP servers and tool settings (in the event loop); the servers sessions will use are
        connected in the background now, so the first session does not wait for them."""

        metrics = self.metrics

        def observe(event: Any, source: str) -> None:
            metrics.on_tool_call(event, tool=event.name if source == "mcp" else CLIENT_FUNCTION_LABEL)

        self.tools = ToolCatalog(self.cfg.tools, self.environ, observer=observe)
        if self.tools.mcp is not None:
            log.info("MCP servers: %s", ", ".join(self.tools.mcp_server_names))
            self._warming = asyncio.get_running_loop().create_task(
                self.tools.warm(dict(self.cfg.backends)), name="kame-mcp-warm"
            )

    def start_loading(self) -> None:
        self._thread = threading.Thread(target=self._load, name="kame-model-loader", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        t0 = time.monotonic()
        try:
            self._load_models()
        except Exception as exc:
            self.state = FAILED
            self.error = str(exc) if isinstance(exc, UserError) else f"{exc.__class__.__name__}: {exc}"
            if not isinstance(exc, UserError):
                log.exception("model loading failed")
            log.error("cannot serve: %s", self.error)
            if self.on_failure is not None:
                self.on_failure(self.error)
            return
        if self._stopping.is_set():
            return
        # Models, tokenizer and libraries are ~350k long-lived objects: a full garbage collection
        # walking them takes 0.2-0.6 s with the GIL held, a stall of every session's audio.
        # Session churn triggers such collections; frozen objects are skipped by them.
        gc.collect()
        gc.freeze()
        self.load_seconds = time.monotonic() - t0
        self.state = READY
        self.metrics.ready.set(1)
        log.info(
            "ready: %d sessions on %s, loaded and warmed up in %.1f s", self.max_sessions, self.device, self.load_seconds
        )

    def _load_models(self) -> None:
        # deferred: torch and the model code load in the loading thread (the app answers /health meanwhile)
        import torch

        from kame.frontend.engine import EngineCore
        from kame.frontend.engine_thread import EngineThread
        from kame.frontend.models import load_frontend

        fcfg = self.cfg.frontend
        device = torch.device(self.device)
        if is_tiny(fcfg.checkpoint):
            log.info("front-end: tiny random checkpoint %s (created in %s on first use)", fcfg.checkpoint, self.cfg.cache_dir)
        self.checkpoint_path = resolve_checkpoint_spec(fcfg.checkpoint, self.cfg.cache_dir)
        log.info("loading front-end %s on %s", fcfg.checkpoint, device)
        self.models = load_frontend(fcfg.model_copy(update={"checkpoint": self.checkpoint_path}), device)
        if self._stopping.is_set():
            return
        asr_cfg = self.cfg.asr
        if asr_cfg.kind == "kyutai" and asr_cfg.model and is_tiny(asr_cfg.model):
            asr_cfg = asr_cfg.model_copy(update={"model": resolve_spec(asr_cfg.model, self.cfg.cache_dir, stt=True)})
        stt = self._shared_stt(asr_cfg, device)
        if stt is None and asr_cfg.kind != "none":
            # deferred: loads torch: only once the models load
            from kame.frontend.loading import resolve_device

            log.info("loading ASR (%s)", asr_cfg.kind)
            asr_device = resolve_device(asr_cfg.device).type if asr_cfg.kind == "kyutai" else "cpu"
            mode = MoshiMode(compile=resolve_compile(fcfg.compile, asr_device), cuda_graphs=fcfg.cuda_graphs)
            self.recognizer = create_recognizer(
                asr_cfg, sessions=self.max_sessions, cache_dir=self.cfg.cache_dir, mode=mode,
                warmup_steps=self.cfg.server.warmup_steps,
            )
        core = EngineCore(self.models, fcfg, batch_size=self.max_sessions, stt=stt)
        if device.type == "cpu":
            log.info("engine: %d torch thread(s) on the CPU (frontend.cpu_threads)", torch.get_num_threads())
        self._warm_up(core)
        self.core = core
        if self._stopping.is_set():
            return
        self.engine = EngineThread(core, on_tick=self.metrics.on_tick, on_death=self._engine_died)
        self.root = self._session_root(self.engine)
        self.engine.start()

    def _engine_died(self, reason: str) -> None:
        """The engine thread's last words (called in it): the process cannot serve any more."""
        self.state = FAILED
        self.error = f"engine thread died: {reason}"
        self.metrics.ready.set(0)
        log.critical("cannot serve: %s", self.error)

    def _shared_stt(self, asr_cfg: Any, device: Any) -> Any:
        """Kyutai STT stepped by the front-end engine on its Mimi codes, when it can be shared."""
        if asr_cfg.kind != "kyutai" or not asr_cfg.share_engine:
            return None
        # deferred: Kyutai's STT loads torch and moshi: only when the server shares its engine
        from kame.asr.kyutai_core import SttCore
        from kame.asr.kyutai_recognizer import DEFAULT_MODEL
        from kame.asr.kyutai_shared import SharedKyutaiAsr, same_mimi
        from kame.frontend.loading import load_mimi, resolve_device

        assert self.models is not None
        files = resolve_checkpoint(asr_cfg.model or DEFAULT_MODEL)
        if resolve_device(asr_cfg.device) != device or not same_mimi(files.mimi_weights, self.models.files.mimi_weights):
            log.info("ASR: Kyutai STT runs its own engine (other device or other Mimi)")
            return None
        log.info("ASR: Kyutai STT %s shares the front-end engine (one Mimi encode per frame)", files.source)
        fcfg = self.cfg.frontend
        mode = MoshiMode(compile=resolve_compile(fcfg.compile, device.type), cuda_graphs=fcfg.cuda_graphs)
        stt = SttCore(files, device, self.max_sessions, dtype=fcfg.dtype, own_mimi=False, mode=mode)
        self.models.mimi = load_mimi(self.models.files, device, 32)
        self.recognizer = SharedKyutaiAsr(
            asr_cfg, stt.piece_of, delay_frames=stt.delay_frames, prefix_frames=stt.silence_prefix_frames
        )
        return stt

    def _warm_up(self, core: EngineCore) -> None:
        """Silent ticks of every slot (and a shared STT's) before the host is ready; see :func:`warm_up_engine`."""
        # deferred: loads torch: only once the engine is built
        from kame.frontend.warmup import warm_up_engine

        warm_up_engine(core, self.cfg.server.warmup_steps)

    async def aclose(self) -> None:
        self._stopping.set()
        self.state = STOPPED if self.state != FAILED else FAILED
        self.metrics.ready.set(0)
        if self.engine is not None:
            self.engine.stop(timeout=1.0)
        if self.recognizer is not None and hasattr(self.recognizer, "close"):
            try:
                self.recognizer.close()
            except Exception:
                log.exception("closing the ASR failed")
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
        if self.tools is not None:
            await self.tools.aclose()
        if self.backends is not None:
            await self.backends.aclose()

    # ------------------------------------------------------------------ state
    @property
    def ready(self) -> bool:
        self._check_hung()
        return self.state == READY and self.engine is not None and self.engine.alive

    @property
    def failed(self) -> bool:
        """The models failed to load, or the engine thread died or hangs: restart the process."""
        self._check_hung()
        return self.state == FAILED

    def _check_hung(self) -> None:
        """A hung engine thread never dies, so its ``on_death`` never runs: a step or command that has not
        returned for ``server.engine_stall_s`` is declared a death (checked whenever the health, readiness or
        admission asks, which the orchestrator's probes do every few seconds)."""
        engine = self.engine
        if self.state != READY or engine is None or not engine.alive:
            return
        stuck = engine.stuck_for()
        if stuck > self.cfg.server.engine_stall_s:
            engine.declare_dead(f"hung: a model step or command has not returned for {stuck:.1f} s")

    @property
    def free_slots(self) -> int:
        return self.engine.free_slots if self.engine is not None else 0

    @property
    def sample_rate(self) -> int:
        return self.models.sample_rate if self.models is not None else SAMPLE_RATE

    @property
    def frame_size(self) -> int:
        return self.models.frame_size if self.models is not None else FRAME_SIZE

    def backend_names(self) -> list[str]:
        return self.backends.names if self.backends is not None else []

    def describe_engine(self) -> dict[str, Any] | None:
        """For ``/health``: the engine as it runs (None until it is built): compile and CUDA graphs in effect."""
        core = self.core
        if core is None:
            return None
        # deferred: moshi loads torch: only once the engine is built
        from moshi.utils.compile import _is_cuda_graph_enabled

        graphs = core.device.type == "cuda" and core.mode.cuda_graphs and _is_cuda_graph_enabled()
        return {
            "device": str(core.device),
            "dtype": str(next(iter(core.models.lm.parameters())).dtype).removeprefix("torch."),
            "batch_size": core.batch_size,
            "compile": core.mode.compile,
            "cuda_graphs": bool(graphs),
            "compiled_graphs": compiled_graphs(),
        }

    def describe_models(self) -> dict[str, Any]:
        """For ``/health``: what is loaded (no filesystem paths, no URLs)."""
        fcfg = self.cfg.frontend
        out: dict[str, Any] = {
            "frontend": {
                "checkpoint": fcfg.checkpoint,
                "batch_size": self.max_sessions,
                "loaded": self.models is not None,
            },
            "asr": {"kind": self.cfg.asr.kind, "model": self.cfg.asr.model, "loaded": self.recognizer is not None},
        }
        if self.models is not None:
            out["frontend"].update(
                {
                    "has_oracle": self.models.has_oracle,
                    "oracle": "off" if self.models.oracle_off_reason else "on",
                    **({"oracle_off": self.models.oracle_off_reason} if self.models.oracle_off_reason else {}),
                    "weights": self.models.weights,
                    "dtype": str(next(iter(self.models.lm.parameters())).dtype).removeprefix("torch."),
                    "sample_rate": self.models.sample_rate,
                }
            )
        if self.load_seconds is not None:
            out["load_seconds"] = round(self.load_seconds, 2)
        if self.error is not None:
            out["error"] = self.error
        return out

    # ------------------------------------------------------------------ sessions
    def _session_root(self, engine: EngineThread) -> SessionRoot:
        """The shared parts every session's pipeline is built from (after the models loaded)."""
        # deferred: the pipeline's modules load torch: only once the models are loaded
        from kame.session.root import SessionRoot

        assert self.models is not None
        return SessionRoot.for_models(
            engine,
            self.models,
            oracle_config=self.cfg.oracle,
            registry=self.backends,
            recognizer=self.recognizer,
            command_timeout_s=self.cfg.server.engine_command_timeout_s,
            tools=self.tools,
            echo_guard=self.cfg.asr.echo_guard,
            responses=self.responses_offer(),
        )

    def responses_offer(self) -> ResponsesOffer | None:
        """Responses delegation as this server offers it: when it has an LLM back-end (docs/protocol.md section 5),
        on its back-ends and MCP servers, with its tool limits and metrics."""

        registry = self.backends
        if registry is None or not registry.names:
            return None
        toolbox = getattr(self.tools, "mcp", None)  # the server's MCP servers
        metrics = self.metrics

        def on_tool_call(event: Any, label: str) -> None:
            metrics.on_tool_call(event, tool=label)

        tools = self.cfg.tools
        return responses_offer(registry, toolbox, on_tool_call if hasattr(metrics, "on_tool_call") else None,
                               function_timeout_s=tools.client_call_timeout_s, max_rounds=tools.max_rounds + 1,
                               max_output_chars=tools.max_client_output_chars)

    def new_pipeline(self, settings: SessionSettings) -> Pipeline:
        """A session's pipeline (``async with`` it to attach its engine slot)."""
        assert self.root is not None, "host not ready"
        return self.root.pipeline(settings)
