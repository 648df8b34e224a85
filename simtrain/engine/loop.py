"""The engine's event loop: ``simpy.Environment.run()`` with no ``until``, its ``step`` written in line.

The engine processes millions of events per run, and ``run`` calls ``step`` once per event (a method
call and a ``try`` each). This loop does what they do (simpy 4.1's ``Environment.step``): pop the next
event in (time, priority, id) order, set the clock, run its callbacks, and re-raise the failure of an
event nobody defused; so the events, their order and every time are the same as ``env.run()``'s.
"""

from __future__ import annotations

from heapq import heappop

import simpy


def drain(env: simpy.Environment) -> None:
    """Process ``env``'s events until none is left (``env.run()`` with no ``until``)."""
    queue = env._queue  # the heap of (time, priority, event id, event) step pops
    while queue:
        env._now, _, _, event = heappop(queue)
        callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):  # a failed event crashes the run
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc
