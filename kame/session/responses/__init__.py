"""What only Responses delegation needs: kame's back-end answers with the client's functions. No wire.

With a Live session's ``delegation.type: "responses"`` the server's own
back-end answers each delegation, offered the client's functions (the
client runs them) and the operator's MCP tools (kame runs them). Modules:

- :mod:`.settings`: what a Responses conversation runs with (functions, tool choice, back-end);
- :mod:`.config`: a client's config validated into those settings (what kame accepts, refuses, ignores);
- :mod:`.conversation`: the back-end's own conversation and prompt;
- :mod:`.stream`: one back-end round as a Responses API event stream;
- :mod:`.rounds`: the rounds of each delegation, the client's calls, how each ends;
- :mod:`.speculation`: kame's own requests on the growing transcript;
- :mod:`.source`: both joined to the oracle, reporting the session's events;
- :mod:`.backend`: the rounds bound to the registry, the MCP servers as server-side tools.

The session's answer source :class:`kame.session.delegated_answers.ResponsesDelegation` runs it; the
function tools and their limits are :mod:`kame.session.function_tools`'s. The Live wire
(``kame.server.wires.live``) hands the client's config to :mod:`.config`, decodes client commands
into session commands and encodes the events (a nested Responses event in its ``response.event``
envelope, a notice as ``info``, progress as ``kame.*``).
"""
