"""The one device-to-host copy of an engine tick.

Every copy from the GPU waits for the work queued before it: two or four
copies a tick (the LM's tokens, the decoded audio, a shared STT's tokens and
end-of-turn probabilities) are two or four waits. :class:`HostCopy` packs all
of a tick's outputs into one float32 buffer on the device (token ids are far
below 2**24, so exact), copies it once, non-blocking, into pinned memory, and
waits once. On the CPU nothing is copied, but the tick still goes through
:meth:`HostCopy.fetch`, so a test counts the copies a GPU would make.
"""

from __future__ import annotations

import torch


class HostCopy:
    """Gathers a tick's device outputs into one pinned host buffer; :attr:`copies` counts the transfers."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.copies = 0
        self._pinned: torch.Tensor | None = None

    def fetch(self, parts: list[torch.Tensor]) -> list[torch.Tensor]:
        """``parts`` on the host, each with its shape and dtype, after one copy of all of them together."""
        if not parts:
            return []
        flat = [p.reshape(-1).to(torch.float32) for p in parts]
        packed = flat[0].clone() if len(flat) == 1 else torch.cat(flat)
        n = packed.numel()
        if self.device.type == "cuda":
            if self._pinned is None or self._pinned.numel() < n:
                self._pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
            host = self._pinned[:n]
            host.copy_(packed, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
            host = host.clone()  # the pinned buffer is reused next tick; what a session keeps must not change
        else:
            host = packed
        self.copies += 1
        out: list[torch.Tensor] = []
        offset = 0
        for p in parts:
            k = p.numel()
            piece = host[offset : offset + k].view(p.shape)
            out.append(piece if p.dtype == torch.float32 else piece.to(p.dtype))
            offset += k
        return out
