"""A session's pipeline (engine slot, ASR, oracle loop), its typed events, its settings and the root
that builds it, shared by the server, ``kame run`` and the benchmarks."""
