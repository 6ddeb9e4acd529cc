"""``/api/chat``: Moshi's binary protocol. :mod:`.protocol` holds its messages, :mod:`.wire` the wire,
:mod:`.server_info` the 0x04 announcement."""
