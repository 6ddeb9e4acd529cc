"""The package layers, enforced: core <- session <- {server, client, eval} <- commands / cli.

Every import statement of every module under kame/, server/ and client/ (as installed:
server/ is ``kame.server``, client/ is ``kame.client``) is read with :mod:`ast`, including
imports inside functions and under ``TYPE_CHECKING``: a lazy import is still a dependency. A
module may import its own layer or a lower one, never a higher one; in the middle layer the
server, the client and the evaluation do not import each other, except the evaluation, which
drives a server through the client. Every module must belong to a layer, so a new top-level
module is placed on purpose.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Source folder -> the package it ships as (pyproject.toml's ``package-dir``).
FOLDERS = {"kame": "kame", "server": "kame.server", "client": "kame.client"}

#: Bottom to top. A name covers the module and everything under it ("kame" alone: only kame/__init__).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "core",
        frozenset(
            {
                "kame",
                "kame.errors",
                "kame.audio",
                "kame.stats",
                "kame.versions",
                "kame.vocab",
                "kame.events",
                "kame.redaction",
                "kame.frontend",
                "kame.asr",
                "kame.oracle",
                "kame.backend",
                "kame.config",
                "kame.config_docs",
                "kame.configs",
                "kame.data",
            }
        ),
    ),
    ("session", frozenset({"kame.session"})),
    ("apps", frozenset({"kame.server", "kame.client", "kame.eval"})),
    ("commands", frozenset({"kame.commands", "kame.cli"})),
)
#: Layers whose packages are independent: one imports another only where PEERS_ALLOWED says so (the
#: core's packages use each other freely: the front-end's ASR hook, the back-end's config, ...).
INDEPENDENT = frozenset({"apps"})
#: Imports allowed between packages of an independent layer (importer -> imported).
PEERS_ALLOWED = frozenset({("kame.eval", "kame.client")})


@dataclass(frozen=True)
class Import:
    module: str  #: the importing module, e.g. kame.oracle.loop
    target: str  #: the imported module, e.g. kame.session.events
    line: int


def _top(name: str) -> str:
    """The layer entry a module belongs to ("kame.session.events" -> "kame.session")."""
    parts = name.split(".")
    return name if len(parts) == 1 else ".".join(parts[:2])


def layer_of(name: str) -> int | None:
    entry = _top(name)
    for index, (_, members) in enumerate(LAYERS):
        if entry in members:
            return index
    return None


def imports_of(module: str, source: str, is_package: bool) -> list[Import]:
    """The kame modules one module's source imports (relative imports resolved)."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from kame import session`` imports the subpackage: count each name that is one.
            names = [f"{target}.{alias.name}" for alias in node.names]
            found += [Import(module, n, node.lineno) for n in names if _is_module(n)] or [Import(module, target, node.lineno)]
    return [i for i in found if i.target == "kame" or i.target.startswith("kame.")]


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    for folder, package in FOLDERS.items():
        pkg = package.split(".")
        if parts[: len(pkg)] == pkg and (folder != "kame" or len(parts) < 2 or parts[1] not in {"server", "client"}):
            rest = parts[len(pkg) :]
            path = ROOT / folder / Path(*rest) if rest else ROOT / folder
            for candidate in (path.with_suffix(".py"), path / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


def _is_module(name: str) -> bool:
    return _module_file(name) is not None


def all_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            modules[".".join((package, *rel))] = path
    return modules


def _peers_refused(importer: str, imported: str) -> bool:
    return importer != imported and (importer, imported) not in PEERS_ALLOWED


def violations(module: str, found: list[Import]) -> list[str]:
    """Why each backward or sideways import of ``module`` is refused (empty: all allowed)."""
    own = layer_of(module)
    out: list[str] = []
    for imp in found:
        theirs = layer_of(imp.target)
        if own is None or theirs is None:
            continue  # reported by test_every_module_has_a_layer
        if theirs > own:
            out.append(f"{module}:{imp.line} imports {imp.target}: {LAYERS[own][0]} may not import {LAYERS[theirs][0]}")
        elif theirs == own and LAYERS[own][0] in INDEPENDENT and _peers_refused(_top(module), _top(imp.target)):
            out.append(f"{module}:{imp.line} imports {imp.target}: {_top(module)} and {_top(imp.target)} are peers")
    return out


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in all_modules() if layer_of(m) is None)
    assert unplaced == [], f"modules in no layer of tests/test_layers.py LAYERS: {unplaced}"


def test_no_backward_or_sideways_import() -> None:
    modules = all_modules()
    assert len(modules) > 100  # the walk found the tree
    problems: list[str] = []
    for module, path in modules.items():
        problems += violations(module, imports_of(module, path.read_text(), path.name == "__init__.py"))
    assert problems == [], "\n".join(problems)


def test_the_check_refuses_a_backward_import() -> None:
    """The checker itself: the oracle importing the session (the cycle that was), the server
    importing the client, a relative import climbing into the session, a lazy import."""
    source = (
        "from kame.session.events import OracleText\n"
        "from kame.backend.tools import ToolSpec\n"
        "def later():\n"
        "    import kame.commands.serve\n"
    )
    found = imports_of("kame.oracle.loop", source, is_package=False)
    assert [i.target for i in found] == ["kame.session.events", "kame.backend.tools", "kame.commands.serve"]
    assert len(violations("kame.oracle.loop", found)) == 2
    assert violations("kame.server.host", imports_of("kame.server.host", "from kame.client import mic\n", False))
    relative = imports_of("kame.oracle.loop", "from ..session import settings\n", is_package=False)
    assert [i.target for i in relative] == ["kame.session.settings"]
    assert violations("kame.oracle.loop", relative)
    assert not violations("kame.eval.session", imports_of("kame.eval.session", "import kame.client.reconnect\n", False))
    assert not violations("kame.commands.serve", imports_of("kame.commands.serve", "from kame.server.config import AppConfig\n", False))


def runtime_imports_of(module: str, source: str, is_package: bool) -> list[Import]:
    """The kame modules ``module`` imports when it runs: :func:`imports_of` without ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    return imports_of(module, ast.unparse(tree), is_package)


#: Packages of the server that must not import each other when they run (imports for types may stay).
NO_RUNTIME_CYCLE = (("kame.server.webrtc", "kame.server.app"),)


def test_webrtc_never_imports_the_app_at_run_time() -> None:
    """``server/app`` mounts the WebRTC endpoints; what both need (a session's offers) lives below them."""
    problems = []
    for module, path in all_modules().items():
        for low, high in NO_RUNTIME_CYCLE:
            if module == low or module.startswith(low + "."):
                for imp in runtime_imports_of(module, path.read_text(), path.name == "__init__.py"):
                    if imp.target == high or imp.target.startswith(high + "."):
                        problems.append(f"{module}:{imp.line} imports {imp.target}")
    assert problems == [], "\n".join(problems)
    found = runtime_imports_of("kame.server.webrtc.live", "if TYPE_CHECKING:\n    from kame.server.app import x\n"
                               "def f():\n    from kame.server.app.websockets import y\n", False)
    assert [i.target for i in found] == ["kame.server.app.websockets"]  # the check sees lazy imports


#: The session's oracle stream: only the session (its pipeline and answer sources) writes it.
ORACLE_WRITES = frozenset({"oracle_reset", "oracle_push", "oracle_clear"})
#: What builds an answer source: the session does (the pipeline), never server/ (a wire, the runtime, the app):
#: the own LLM's loop, the Responses source, and the delegated answers a Live wire translates.
SOURCE_BUILDERS = frozenset({"OracleLoop", "ResponsesAnswerSource", "SourceHooks", "answer_source",
                             "DelegatedAnswers", "answers_with", "ClientDelegation", "ResponsesDelegation",
                             "LlmAnswers", "delegation_source"})


def calls_of(source: str) -> list[tuple[str, int]]:
    """Every called name (``f(...)``) or attribute (``x.f(...)``) with its line."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name is not None:
                out.append((name, node.lineno))
    return out


def answer_roads(module: str, source: str) -> list[str]:
    """Where a module of server/ writes the oracle or builds an answer source (empty: it does neither)."""
    if not module.startswith("kame.server."):
        return []
    problems = []
    for name, line in calls_of(source):
        if name in ORACLE_WRITES:
            problems.append(f"{module}:{line} writes the oracle ({name})")
        elif name in SOURCE_BUILDERS:
            problems.append(f"{module}:{line} builds an answer source ({name})")
    return problems


def test_only_the_session_writes_the_oracle_and_builds_answer_sources() -> None:
    """The roads an answer took around the session (the runtime resetting the oracle for a wire, a wire or
    the runtime building an answer source, the Live protocol building its delegated answers) stay closed:
    server/ passes session commands, and asks the session for its answers."""
    problems = []
    for module, path in all_modules().items():
        problems += answer_roads(module, path.read_text())
    assert problems == [], "\n".join(problems)
    assert calls_of("self.pipeline.oracle_reset(ids)\nOracleLoop(x=1)\n") == [("oracle_reset", 1), ("OracleLoop", 2)]
    # the road that was: the Live protocol building the session's delegated answers itself
    was = "self.answers = DelegatedAnswers(info.default_delegation, 3, encode=encode, oracle_config=oc, new_id=f)\n"
    assert answer_roads("kame.server.wires.live.protocol", was) == [
        "kame.server.wires.live.protocol:1 builds an answer source (DelegatedAnswers)"]
    assert answer_roads("kame.server.wires.live.protocol", "self.answers = answers_with(encode, oc)(mode, 3, f)\n")
    assert not answer_roads("kame.server.wires.live.protocol", "self.answers = self.open_answers(mode, 3, f)\n")
    assert not answer_roads("kame.session.pipeline", was)  # the session builds them


def _command_fields(source: str) -> list[tuple[str, int]]:
    """Class attributes annotated with a session command (``command: ConversationCommand``, ``x: SpeakAnswer``)."""
    from typing import get_args

    from kame.session.commands import ConversationCommand

    names = {"ConversationCommand", *(c.__name__ for c in get_args(ConversationCommand))}
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign):
                    used = {n.id for n in ast.walk(item.annotation) if isinstance(n, ast.Name)}
                    used |= {n.attr for n in ast.walk(item.annotation) if isinstance(n, ast.Attribute)}
                    if isinstance(item.annotation, ast.Constant) and isinstance(item.annotation.value, str):
                        used |= set(item.annotation.value.replace("|", " ").replace(".", " ").split())
                    if used & names:
                        out.append((f"{node.name}.{ast.unparse(item.target)}", item.lineno))
    return out


def test_a_client_message_is_typed_twice_at_most() -> None:
    """The wire's decoded event, then the session's command: the runtime takes the session's commands as they
    are (no third type wrapping them, as the runtime's ``ConversationIn`` did)."""
    from typing import get_args

    from kame.server.runtime.wire import Command
    from kame.session.commands import ConversationCommand

    assert set(get_args(ConversationCommand)) <= set(get_args(Command))
    problems = []
    for module, path in all_modules().items():
        if module.startswith("kame.server."):
            problems += [f"{module}:{line} wraps a session command ({field})" for field, line in _command_fields(path.read_text())]
    assert problems == [], "\n".join(problems)
    wrapper = "@dataclass(frozen=True)\nclass ConversationIn:\n    command: ConversationCommand\n"
    assert _command_fields(wrapper) == [("ConversationIn.command", 3)]  # the check sees the wrapper that was
    assert _command_fields("class A:\n    speak: 'sc.SpeakAnswer | None'\n") == [("A.speak", 2)]


#: The roads that went around the one answer-source interface (issue 57): the runtime lending a wire the session's
#: answer factories (``WireIO``, a wire's ``bind``) and the pipeline's two side doors (``use_responses``,
#: ``delegated_answers``). Who answers is the pipeline's :class:`~kame.session.answer_source.AnswerSource`.
GONE = frozenset({"WireIO", "bind", "use_responses", "delegated_answers", "OpenAnswers", "ResponsesPort"})


def side_doors(module: str, source: str) -> list[str]:
    """Where a module of the session or the server defines, names or calls one of :data:`GONE`."""
    if not (module.startswith("kame.server.") or module.startswith("kame.session")):
        return []
    problems = []
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value  # getattr(wire, "bind")
        elif isinstance(node, ast.alias):
            name = node.asname or node.name.rsplit(".", 1)[-1]
        if name in GONE:
            problems.append(f"{module}:{getattr(node, 'lineno', '?')} {name}")
    return problems


def test_answers_have_one_road_through_the_answer_source() -> None:
    """``WireIO``, ``bind``, ``Pipeline.use_responses`` and ``Pipeline.delegated_answers`` do not come back: a wire
    decodes client messages into session commands and encodes the session's events, nothing more."""
    problems = []
    for module, path in all_modules().items():
        problems += side_doors(module, path.read_text())
    assert problems == [], "\n".join(problems)
    was = ('bind = getattr(self.wire, "bind", None)\n'
           "bind(WireIO(send=self._queue, use_responses=pipeline.use_responses,\n"
           "            delegated_answers=pipeline.delegated_answers))\n")
    found = side_doors("kame.server.runtime.session", was)
    assert {p.split()[-1] for p in found} == {"bind", "WireIO", "use_responses", "delegated_answers"}
    assert side_doors("kame.session.pipeline", "class Pipeline:\n    def use_responses(self): ...\n")
    assert not side_doors("kame.asr.stream", "def bind_engine(self): ...\n")  # another layer, another word
    from kame.session.pipeline import Pipeline

    assert not {"use_responses", "delegated_answers"} & set(dir(Pipeline))


#: Where the app is assembled: an import inside a function there is a deliberate deferral (issue 57, point 3).
DEFERRAL_CHECKED = ("kame.server.app", "kame.server.webrtc", "kame.server.host")


def undeclared_deferrals(source: str) -> list[int]:
    """Lines of imports inside functions with no ``# deferred: why`` above their block (or on their line)."""
    lines = source.split("\n")
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            if not isinstance(inner, (ast.Import, ast.ImportFrom)):
                continue
            if "# deferred:" in lines[inner.lineno - 1]:
                continue
            i = inner.lineno - 2
            while i >= 0 and (not lines[i].strip() or lines[i].lstrip().startswith(("import ", "from "))):
                i -= 1
            if i < 0 or not lines[i].lstrip().startswith("# deferred:"):
                out.append(inner.lineno)
    return sorted(set(out))


def test_app_state_is_typed_without_a_circle_and_deferrals_say_why() -> None:
    """``AppState`` lives in ``kame.server.state`` (no route imports), so the routes, the WebRTC endpoints and
    the admission import it at their top; what still loads inside a function (torch, moshi, aiortc) says why."""
    problems = []
    for module, path in all_modules().items():
        source = path.read_text()
        for imp in imports_of(module, source, path.name == "__init__.py"):
            if imp.target == "kame.server.app.factory" and module != "kame.server.app.serving":
                problems.append(f"{module}:{imp.line} imports the app factory (AppState is kame.server.state's)")
        if module.startswith(DEFERRAL_CHECKED):
            problems += [f"{module}:{line} imports inside a function without '# deferred: why'"
                         for line in undeclared_deferrals(source)]
    assert problems == [], "\n".join(problems)
    assert undeclared_deferrals("def f():\n    from kame.server.app.websockets import WIRES\n") == [2]
    assert not undeclared_deferrals("def f():\n    # deferred: torch is slow\n    import torch\n\n    import av\n")
