"""Where a listener bench client's lateness comes from: the server's send trace (`bench.send_trace`) joined with the
client's receipt times (`bench.barge_in --listener --trace-sends`)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["drift", "read_sends"]


def read_sends(path: str) -> dict:
    """`bench.send_trace`'s records by response id: {"clock": [(t, ms)], "wrote": [t], "holds": [t]}."""
    out: dict = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        mine = out.setdefault(record["rid"], {"clock": [], "wrote": [], "holds": []})
        if "clock" in record:
            mine["clock"].append((record["clock"], record["ms"]))
        elif "hold" in record:
            mine["holds"].append(record["hold"])
        else:
            mine["wrote"].append(record["wrote"])
    return out


def drift(deltas: list[tuple[float, int]], sends: dict | None, wire_hz: int = 24000) -> dict | None:
    """How far behind the server's playback clock the client plays at the end of `deltas` (arrival, samples), and
    which side put it there (ms): `server`, the deltas written to the socket later than the session counted them as
    sent (a client reading on time still underruns); `client`, the rest, read later than written. `sends`: the
    response's `bench.send_trace` records ({"clock": [(t, ms)], "wrote": [t]}); None without them."""
    if not sends or len(sends["wrote"]) < len(deltas) or not deltas:
        return None
    clock_end = float("-inf")  # the server's clock over the audio of `deltas`
    need = sum(n for _, n in deltas) / wire_hz * 1000.0
    counted = 0.0
    for t, ms in sends["clock"]:
        if counted >= need - 1e-6:
            break
        clock_end = max(clock_end, t) + ms / 1000.0
        counted += ms
    wrote_end = client_end = float("-inf")
    for (at, n), wrote in zip(deltas, sends["wrote"]):
        wrote_end = max(wrote_end, wrote) + n / wire_hz
        client_end = max(client_end, at) + n / wire_hz
    return {"server": round((wrote_end - clock_end) * 1000.0, 1), "client": round((client_end - wrote_end) * 1000.0, 1)}
