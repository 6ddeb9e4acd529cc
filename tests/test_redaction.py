"""One ``redact``: logs, errors to clients and back-end error details mask the same credentials."""

from __future__ import annotations

import logging

from kame.backend.errors import MAX_DETAIL_CHARS, error_detail
from kame.redaction import redact
from kame.server.access import auth
from kame.server.telemetry.logs import RedactFilter

LINE = "GET /v1/realtime?model=x&token=tok-1 openai-insecure-api-key.sub-2 Authorization: Bearer bea.rer-3 key sk-4"


def test_every_credential_form_is_masked_in_every_path() -> None:
    for text in (redact(LINE, ["sk-4"]), error_detail(LINE, ["sk-4"])):
        assert not any(secret in text for secret in ("tok-1", "sub-2", "bea.rer-3", "sk-4")), text
        assert "model=x" in text and "token=***" in text and "Bearer ***" in text


def test_the_server_and_the_back_end_share_the_function() -> None:
    assert auth.redact is redact
    record = logging.LogRecord("uvicorn.access", logging.INFO, "f", 1, "%s", (LINE,), None)
    RedactFilter(["sk-4"]).filter(record)
    assert record.getMessage() == redact(LINE, ["sk-4"])


def test_the_detail_is_one_short_line_and_redact_keeps_lines() -> None:
    long = "Bearer abc\n" + "x " * 500
    detail = error_detail(long)
    assert "\n" not in detail and len(detail) <= MAX_DETAIL_CHARS and detail.startswith("Bearer ***")
    assert redact("a\nb  c") == "a\nb  c"
