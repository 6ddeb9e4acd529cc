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
- when kame delegates (one per user turn, or speculative) and what an append
  for a delegation does is the client-delegation answer source,
  :mod:`kame.session.delegation_rules`;
- :mod:`.commentary`: commentary text -> oracle token ids, as oracle answers are cut;
- :mod:`.usage`: usage reports and close reasons;
- :mod:`.protocol`: one session's Live protocol state over all of the above;
- :mod:`.wire`: the Live API's :class:`~kame.server.runtime.wire.Wire` over that state;
- :mod:`.responses_mode`: Responses delegation joined to the wire; the answer
  source itself (the back-end's conversation, the rounds with the client's
  function calls, the nested Responses events, the back-end binding) is
  :mod:`kame.session.responses`.
"""
