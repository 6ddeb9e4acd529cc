"""kame/session/function_tools.py: one set of limits for a client's function tools and outputs, whatever the wire.

``/v1/realtime``'s ``session.tools`` and the Live API's ``delegation.responses.tools`` go through the same
checks: what one accepts the other accepts (the larger of the limits each wire had), each refusing in its
own protocol's codes.
"""

from __future__ import annotations

from typing import Any

import pytest

from kame.server.wires.realtime.functions import FunctionProtocolError, decode_function_output, parse_tools
from kame.session.function_tools import MAX_DESCRIPTION_CHARS, MAX_OUTPUT_CHARS, MAX_SCHEMA_CHARS, MAX_TOOLS
from kame.session.responses.config import parse_responses_config
from kame.session.responses.settings import BackendCatalog, DelegationConfigError

CATALOG = BackendCatalog(backends=("fast",), default="fast", tools_allowed=frozenset({"fast"}))


def tool(**fields: Any) -> dict[str, Any]:
    return {"type": "function", "name": "get_weather", **fields}


def schema_of(chars: int) -> dict[str, Any]:
    """An object schema whose JSON is exactly ``chars`` characters."""
    base = {"type": "object", "description": ""}
    pad = chars - len('{"type": "object", "description": ""}')
    return {**base, "description": "x" * pad}


def both(tools: list[dict[str, Any]]) -> tuple[Exception | None, Exception | None]:
    """What each wire says of ``tools``: None (accepted) or its refusal."""
    realtime: Exception | None = None
    live: Exception | None = None
    try:
        parse_tools(tools)
    except FunctionProtocolError as exc:
        realtime = exc
    try:
        parse_responses_config({"model": "fast", "tools": tools}, CATALOG)
    except DelegationConfigError as exc:
        live = exc
    return realtime, live


def test_the_limits_are_the_larger_of_the_two_the_wires_had() -> None:
    assert (MAX_TOOLS, MAX_DESCRIPTION_CHARS, MAX_SCHEMA_CHARS, MAX_OUTPUT_CHARS) == (128, 4096, 32768, 32768)


@pytest.mark.parametrize("field,limit", [("description", MAX_DESCRIPTION_CHARS), ("parameters", MAX_SCHEMA_CHARS)])
def test_both_wires_take_a_tool_at_the_limit_and_refuse_one_beyond(field: str, limit: int) -> None:
    value: Any = "d" * limit if field == "description" else schema_of(limit)
    assert both([tool(**{field: value})]) == (None, None)  # Live refused these above 4,000 / 32,000 before
    over: Any = "d" * (limit + 1) if field == "description" else schema_of(limit + 1)
    realtime, live = both([tool(**{field: over})])
    assert isinstance(realtime, FunctionProtocolError) and realtime.code == "invalid_value"
    assert isinstance(live, DelegationConfigError) and live.code == "string_above_max_length"
    assert realtime.param is not None and realtime.param.endswith(f"[0].{field}")
    assert live.param is not None and live.param.endswith(f"[0].{field}")
    assert str(limit) in realtime.message and str(limit) in live.message


def test_both_wires_count_tools_alike() -> None:
    many = [tool(name=f"f{i}") for i in range(MAX_TOOLS)]
    assert both(many) == (None, None)
    realtime, live = both([*many, tool(name="one_more")])
    assert realtime is not None and realtime.code == "invalid_value"  # type: ignore[attr-defined]
    assert live is not None and live.code == "array_above_max_length"  # type: ignore[attr-defined]


def test_a_function_output_has_one_limit() -> None:
    item = {"type": "function_call_output", "call_id": "c", "output": "x" * MAX_OUTPUT_CHARS}
    assert decode_function_output({"item": item}).output == item["output"]
    with pytest.raises(FunctionProtocolError) as refused:
        decode_function_output({"item": {**item, "output": "x" * (MAX_OUTPUT_CHARS + 1)}})
    assert refused.value.code == "output_too_large" and refused.value.param == "item.output"
