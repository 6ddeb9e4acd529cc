"""Helpers shared by the tests (and the benches): no test file imports another test file.

- ``moshi_client``: ``ServerProcess`` (``kame serve`` in a subprocess on a free port; every start is
  counted, see tests/conftest.py) and the Moshi-protocol client re-exported from ``kame.client``.
- ``speech``: espeak-ng speech and silence at the model's rate.
- ``llm_server``: a scriptable OpenAI-compatible server on 127.0.0.1 (the real ``openai`` client talks to it).
- ``haproxy``: a real HAProxy in front of replicas.
- ``browser``: headless Chromium flags and page helpers.
- ``live_responses``, ``runtime_fakes``, ``live_pipecat``, ``environment``: pieces of several test files.

Benches import them as ``tests.support.X`` after putting the repository root (not tests/) on sys.path.
"""
