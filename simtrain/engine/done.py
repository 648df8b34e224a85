"""Events of the engine: per-rank done events, made on first use and dropped once processed; ``either``.

An op another op waits for signals its end with a simpy event. Full mode runs every rank, so making
all of them up front holds one event per awaited op of every rank for the whole step (hundreds of
bytes each: gigabytes at a thousand ranks and a hundred micro-batches). Here an op's event exists only
from its first waiter or its end, whichever comes first, until simpy has processed it; after that a
shared stand-in that reads as processed takes its place (waiters only ask whether it was), so memory
holds the events in flight, not the step's history. The times are unchanged: an event is scheduled
when it is fired, not when it is made, so simpy orders it exactly as before.
"""

from __future__ import annotations

from typing import Any

import simpy


class _Processed:
    """Stands in for an event simpy has processed: its waiters go on at once."""

    __slots__ = ()
    triggered = True
    processed = True
    ok = True


PROCESSED: Any = _Processed()


class DoneEvents(dict[int, Any]):
    """Op index -> its done event (``simpy.Event``) or ``PROCESSED``; ``events[i]`` makes a missing one."""

    __slots__ = ("env",)

    def __init__(self, env: simpy.Environment):
        super().__init__()
        self.env = env

    def __missing__(self, idx: int) -> simpy.Event:
        ev = self[idx] = simpy.Event(self.env)
        return ev

    def fire(self, idx: int) -> None:
        """Op ``idx`` is done: trigger its event now; once processed (its waiters resumed), drop it."""
        ev = self[idx]
        ev.succeed()
        ev.callbacks.append(lambda _: self.__setitem__(idx, PROCESSED))


def either(env: simpy.Environment, a: simpy.Event, b: simpy.Event) -> simpy.Event:
    """An event that fires when ``a`` or ``b`` is processed: ``a | b`` (simpy's Condition) without its
    value bookkeeping, which costs more than the rest of a re-timed compute op. Triggered from the first
    one's callback, it is scheduled at the same point in the event order as the Condition would be."""
    wake = simpy.Event(env)

    def fire(_: simpy.Event) -> None:
        if not wake.triggered:
            wake.succeed()

    a.callbacks.append(fire)  # both pending: the caller yields them fresh or still queued
    b.callbacks.append(fire)
    return wake
