"""``/v1/realtime``: OpenAI Realtime events. :mod:`.wire` is the wire; :mod:`.decode` (client events),
:mod:`.events` (server events), :mod:`.settings` (``session.update``), :mod:`.turns` (responses and user
items) and :mod:`.audio` (PCM16 input) are its pure parts."""
