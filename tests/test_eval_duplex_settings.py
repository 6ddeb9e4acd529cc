"""The per-session "front-end alone" choice (``llm``) on both wires' parsers, and the CLI's variants."""

from __future__ import annotations

import argparse

import pytest

from kame.commands.eval_duplex import variants
from kame.eval.duplex.client import Target, chat_query
from kame.server.access.params import ParamError, parse_session_params
from kame.server.wires.realtime.events import ClientError
from kame.server.wires.realtime.settings import ServerInfo, parse_session_update, session_object
from kame.session.settings import ORACLE_POLICIES, SessionSettings


def test_chat_query_llm() -> None:
    assert parse_session_params({"llm": "0"}).settings.llm is False
    assert parse_session_params({"llm": "1"}).settings.llm is True
    assert parse_session_params({}).settings.llm is True
    assert "llm" not in parse_session_params({"llm": "0"}).ignored
    with pytest.raises(ParamError, match="llm"):
        parse_session_params({"llm": "maybe"})
    assert chat_query({"llm": False, "oracle_policy": "reset"}) == {"llm": "0", "oracle_policy": "reset"}


def test_realtime_kame_llm() -> None:
    info = ServerInfo(session_id="x", backends=("scripted",), default_backend="scripted")
    s, _ = parse_session_update({"kame": {"llm": False}}, SessionSettings(), info)
    assert s.llm is False and session_object(s, info)["kame"]["llm"] is False
    with pytest.raises(ClientError):
        parse_session_update({"kame": {"llm": "no"}}, SessionSettings(), info)


def test_variants_and_target() -> None:
    ns = argparse.Namespace(backend=None, compare="all", oracle="on", oracle_policy=None)
    vs = variants(ns, ORACLE_POLICIES)
    assert [v.name for v in vs] == ["oracle-off"] + [f"policy-{p}" for p in ORACLE_POLICIES]
    assert vs[0].settings == {"llm": False} and vs[1].settings["oracle_policy"] == ORACLE_POLICIES[0]
    ns = argparse.Namespace(backend="b", compare="none", oracle="off", oracle_policy=None)
    assert variants(ns, ORACLE_POLICIES)[0].settings == {"backend": "b", "llm": False}
    t = Target.parse("http://h:1/pre/api/chat", "realtime")
    assert t.ws_url() == "ws://h:1/pre/v1/realtime" and t.health_url() == "http://h:1/pre/health"
