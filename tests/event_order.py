"""The order of events in a log, for tests that check a mechanism by what happened in which order
rather than by how long it took: on a shared, loaded machine durations vary, orders do not."""
from __future__ import annotations

import re


def out_of_order(text: str, patterns: list[str]) -> str | None:
    """None when each regex matches a line of ``text`` below the line the previous one matched
    first; otherwise the first pattern not found there, with the lines it was looked for in."""
    lines, at = text.splitlines(), 0
    for pattern in patterns:
        found = next((i for i in range(at, len(lines)) if re.search(pattern, lines[i])), None)
        if found is None:
            searched = "\n".join(lines[at:])[-3000:]
            return f"no line matching {pattern!r} after the events before it; the lines searched:\n{searched}"
        at = found + 1
    return None


def rank_output(out: str, rank: int, stream: str = "stdout") -> str:
    """One rank's lines of a launcher's output, in the order that rank wrote them, without the tag the
    launcher puts in front: ``[0]<stdout>:`` (horovodrun with Gloo), ``[1,0]<stdout>:`` (mpirun's
    --tag-output, which horovodrun uses with MPI). Lines of different ranks or of a rank's stdout
    and stderr may interleave in any order; a rank's own lines of one stream do not."""
    tag = re.compile(rf"^\[(?:\d+,)?{rank}\]<{stream}>:(.*)$")
    return "\n".join(m.group(1) for m in map(tag.match, out.splitlines()) if m)
