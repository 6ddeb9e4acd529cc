"""The Live API wire (``/v1/live/sessions``, OpenAI's GPT-Live protocol) over the tandem. No I/O.

The contract is the official ``openai`` SDK: ``openai/resources/live/live.py``
and ``openai/types/live/*.py``. Modules:

- :mod:`.audio`: the session's audio format both ways (PCM16 at 24 or 16 kHz,
  G.711 mu-law / A-law at 8 kHz) <-> the engine's 24 kHz float32 frames;
- :mod:`.events`: typed server events and their JSON encoding;
- :mod:`.decode`: client JSON -> typed commands, or a :class:`~.events.LiveError`;
- :mod:`.config`: ``session.start`` / ``session.update`` -> the resolved
  configuration (accepted, ignored with an ``info``, refused with an ``error``);
- :mod:`.transcript`: append-only transcript deltas on the session timeline;
- who answers (client or Responses delegation: when kame delegates, what an
  append does, the back-end's rounds) is the session's answer source,
  :mod:`kame.session.delegated_answers`; this wire decodes the client's asks
  into session commands and encodes the events the source reports;
- :mod:`.commentary`: the contract's limit on one append;
- :mod:`.usage`: usage reports and close reasons;
- :mod:`.protocol`: one session's Live protocol state over all of the above;
- :mod:`.wire`: the Live API's :class:`~kame.server.runtime.wire.Wire` over that state.
"""
