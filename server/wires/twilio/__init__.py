"""Twilio Media Streams (and Telnyx's, the same shape): phone calls as JSON over a websocket (docs/telephony.md)."""
