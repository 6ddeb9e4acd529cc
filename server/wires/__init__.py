"""Wire protocols: small pure modules that turn one protocol's messages into typed commands and typed
session events back into that protocol's messages (no I/O of their own), over the one session runtime
(:mod:`kame.server.runtime`). ``moshi``: ``/api/chat``; ``realtime``: ``/v1/realtime``; ``live``:
``/v1/live/sessions``."""
