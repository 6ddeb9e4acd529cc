"""Who may open a session and with which options: the token and origin checks, query parameters,
and the admission every websocket passes first."""
