"""Wire protocols: small pure modules that turn one protocol's messages into typed commands and typed
session events back into that protocol's messages (no I/O of their own)."""
