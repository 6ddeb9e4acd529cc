"""The session runtime: one websocket session whatever its wire (tasks, send queue, pacing, watchdog,
end), the set of live sessions and their recordings."""
