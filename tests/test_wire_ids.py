"""The one id scheme of the wires (server/wires/ids.py): OpenAI-like prefixes, never repeated in a session."""

from __future__ import annotations

import re

from kame.server.wires.ids import Ids
from kame.server.wires.live.events import LiveEncoder, SessionUpdated
from kame.server.wires.realtime.events import EventEncoder


def test_kinds_share_one_counter_and_keep_their_prefixes() -> None:
    ids = Ids("abcd1234")
    made = [ids.event(), ids.response(), ids.item(), ids.delegation(), ids.event()]
    assert made == ["event_abcd1234000001", "resp_abcd1234000002", "item_abcd1234000003", "dlg_abcd1234000004", "event_abcd1234000005"]
    assert len(set(made)) == len(made)
    assert re.fullmatch(r"[0-9a-f]{8}", Ids().prefix)


def test_both_encoders_stamp_event_ids_from_the_same_scheme() -> None:
    realtime = EventEncoder(Ids("r"))
    live = LiveEncoder(Ids("l"))
    assert '"event_id":"event_r000001"' in realtime.encode({"type": "session.updated"}).replace(" ", "")
    assert '"event_id":"event_l000001"' in live.encode(SessionUpdated({"id": "live_x"}, None)).replace(" ", "")
