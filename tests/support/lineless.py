"""A failing test whose traceback holds a frame without a line number is reported as a failure.

Python 3.11 computes ``tb_lineno`` from the code object's location table and gives ``None`` where the
instruction at ``tb_lasti`` has no location. The compiler leaves some instructions without one, among them
loop back-edges (``JUMP_BACKWARD``), and a signal handler runs at a back-edge's check for pending work: an
exception it raises is recorded at that instruction. The case met here: pytest-timeout's SIGALRM handler
(``timeout = 300``) raising while ``subprocess.Popen._communicate`` (``subprocess.run`` reading espeak-ng's
output in ``kame eval duplex --generate``) sat at the end of its ``for key, events in ready:`` loop, an
instruction without a line. Code compiled without locations and frames made up by C extensions give the
same. pytest subtracts 1 from the ``None`` to format the entry, and the session ends in an INTERNALERROR
that hides the failure. :func:`fill_lines` gives such an entry the line of the nearest located
instruction before it (else the code's first line), and :func:`lineless_frames` names the frames it
mended, which the report adds as a section.
"""

from __future__ import annotations

import types


def _line_at(code: types.CodeType, lasti: int) -> int:
    line = code.co_firstlineno
    for start, _end, lineno in code.co_lines():
        if start > lasti:
            break
        if lineno is not None:
            line = lineno
    return line


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, its causes and contexts, and the members of exception groups, each once."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
        todo += list(getattr(e, "exceptions", ()) or ())
    return seen


def lineless_frames(exc: BaseException) -> list[str]:
    """``file:function (instruction N)`` of every traceback entry without a line number."""
    out = []
    for e in _chain(exc):
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_lineno is None:
                c = tb.tb_frame.f_code
                out.append(f"{c.co_filename}:{c.co_name} (instruction {tb.tb_lasti})")
            tb = tb.tb_next
    return out


def fill_lines(exc: BaseException) -> bool:
    """Rebuild the tracebacks of ``exc``'s chain with a line in every entry; True if one had none."""
    mended = False
    for e in _chain(exc):
        entries = []
        tb = e.__traceback__
        while tb is not None:
            entries.append(tb)
            tb = tb.tb_next
        if all(t.tb_lineno is not None for t in entries):
            continue
        mended = True
        new: types.TracebackType | None = None
        for t in reversed(entries):
            line = t.tb_lineno if t.tb_lineno is not None else _line_at(t.tb_frame.f_code, t.tb_lasti)
            new = types.TracebackType(new, t.tb_frame, t.tb_lasti, line)
        e.__traceback__ = new
    return mended


def without_locations(code: types.CodeType) -> types.CodeType:
    """``code`` whose every instruction has "no location" (the location table's code 15, in runs of at most
    8 code units), as compiler-made instructions and frames made up by C extensions have."""
    units, table = len(code.co_code) // 2, bytearray()
    while units > 0:
        n = min(8, units)
        table.append(0x80 | (15 << 3) | (n - 1))
        units -= n
    return code.replace(co_linetable=bytes(table))
