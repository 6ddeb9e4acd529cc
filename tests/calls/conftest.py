"""The calls phase (scripts/test_calls.sh): long-running end-to-end tests of phone calls, long calls and
resumed calls, with real parts (SIP phones, SIPp, Redis, HAProxy). Their own timed phase, since each holds a
server for tens of seconds, which the main tests phase's budget cannot hold. The shared fixtures of
tests/conftest.py apply here too."""
