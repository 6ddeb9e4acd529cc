"""What Kyutai's web client accepts as server info (0x04): checked on the wire and on the real server."""

from __future__ import annotations

#: Kyutai's web client's server-info schema (client/src/pages/Conversation/hooks/useServerInfo.ts, zod):
#: field -> JSON type; every field required.
KYUTAI_SERVER_INFO_SCHEMA: dict[str, str] = {
    "text_temperature": "number",
    "text_topk": "number",
    "audio_temperature": "number",
    "audio_topk": "number",
    "pad_mult": "number",
    "repetition_penalty_context": "number",
    "repetition_penalty": "number",
    "lm_model_file": "string",
    "instance_name": "string",
}
KYUTAI_BUILD_INFO_FIELDS = (
    "build_timestamp", "build_date", "git_branch", "git_timestamp", "git_date",
    "git_hash", "git_describe", "rustc_host_triple", "rustc_version", "cargo_target_triple",
)


def assert_kyutai_server_info(data: object) -> None:
    """What zod's ``ServersInfoSchema.safeParse`` accepts (numbers are finite non-bool numbers)."""
    import math

    assert isinstance(data, dict)
    for key, kind in KYUTAI_SERVER_INFO_SCHEMA.items():
        value = data[key]
        if kind == "number":
            assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), key
        else:
            assert isinstance(value, str), key
    build = data["build_info"]
    assert isinstance(build, dict)
    for key in KYUTAI_BUILD_INFO_FIELDS:
        assert isinstance(build[key], str), key
    assert set(data) == set(KYUTAI_SERVER_INFO_SCHEMA) | {"build_info"}
    assert set(build) == set(KYUTAI_BUILD_INFO_FIELDS)
