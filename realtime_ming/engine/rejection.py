"""What happens to an engine command that cannot be applied (the engine is dead, or applying it raised): its caller
hears of it. A turn's Submit or InputsReady fails the turn; a Confirm, Cancel or Discard of a live turn still ends
it (a confirmed one's held events first, a discarded one silently); Stats and Capture answer (Capture with the
error); Stop stops the engine all the same."""

from __future__ import annotations

from .api import FailureCode, TurnFailed
from .commands import Cancel, Capture, Command, Confirm, Discard, InputsReady, Stats, Stop, Submit
from .speculation import Speculation
from .turn_table import TurnTable

__all__ = ["reject"]


def reject(cmd: Command, code: FailureCode, message: str, table: TurnTable, speculation: Speculation) -> bool:
    """Report a command that could not be applied to its caller (a terminal event, an error, a wake-up)
    -> whether it was a `Stop` (the engine stops all the same)."""
    match cmd:
        case Submit(request=request, sink=sink):
            cmd.prepared.cancel()
            turn = table.turns.get(request.turn_id)
            if turn is not None and turn.sink is sink:
                table.fail(request.turn_id, message, code)
            else:
                table.call_sink(sink, TurnFailed(request.turn_id, message, code))
        case InputsReady(turn_id=turn_id):
            turn = table.turns.get(turn_id)
            if turn is not None and turn.prepared is cmd.prepared:
                table.fail(turn_id, message, code)
        case Confirm(turn_id=turn_id) | Cancel(turn_id=turn_id) | Discard(turn_id=turn_id):
            parked = table.parked.pop(turn_id, None)
            if parked is not None and isinstance(cmd, Confirm):
                speculation.deliver_held(parked)
            turn = table.turns.get(turn_id)
            if turn is not None:  # a live turn whose command failed: it still ends, and its caller hears of it
                if isinstance(cmd, Discard):
                    turn.held = []  # silent, as a discard is
                elif isinstance(cmd, Confirm) and turn.held is not None:
                    speculation.deliver_held(turn)
                table.fail(turn_id, message, code)
                table.parked.pop(turn_id, None)
        case Stats():
            cmd.done.set()
        case Capture():
            cmd.errors.append(RuntimeError(message))
            cmd.done.set()
        case Stop():
            return True
    return False
