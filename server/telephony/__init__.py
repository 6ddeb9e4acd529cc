"""Phones over SIP: a supervised PJSIP child process, OpenAI's webhook and call-control flow (docs/sip.md)."""
