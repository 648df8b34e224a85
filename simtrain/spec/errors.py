"""Errors a user can see.

``ConfigError`` is bad input: it carries *every* problem found, each with the dotted path of the
field, the value and what would be valid. ``InfeasibleLayout`` is a valid configuration that cannot
run as asked (too few micro-batches for a schedule, a feature not simulated yet).
``SimulationInvariantError`` is a simulator bug: a result that breaks an invariant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem with the input: where, what was given, and what would be valid."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SimtrainError(Exception):
    """Base of the errors simtrain raises on purpose."""


class ConfigError(SimtrainError):
    """Invalid configuration; ``problems`` lists every problem found, each with its dotted path."""

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1:
            return f"invalid configuration: {self.problems[0]}"
        lines = [f"invalid configuration ({len(self.problems)} problems):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class InfeasibleLayout(SimtrainError):
    """A valid layout that cannot be simulated or run as asked; the message has the numbers."""

    def __init__(self, reason: str, **numbers: Any):
        self.reason = reason
        self.numbers = numbers
        detail = ", ".join(f"{k}={v}" for k, v in numbers.items())
        super().__init__(f"{reason}" + (f" ({detail})" if detail else ""))


class SimulationInvariantError(SimtrainError):
    """A simulated result broke an invariant (``simtrain.engine.invariants``): a simulator bug, never an answer."""

    def __init__(self, config: str, violations: list[str]):
        self.config, self.violations = config, list(violations)
        super().__init__(f"internal error simulating {config!r}: " + "; ".join(self.violations))


def problem(path: str, value: Any, valid: str) -> Problem:
    """Build a Problem saying the value at ``path`` is not valid and what would be."""
    return Problem(path, f"{value!r} is not valid; {valid}")


def pydantic_problems(exc: ValidationError, prefix: str = "", rename: dict[str, str] | None = None) -> list[Problem]:
    """pydantic's errors as Problems: the dotted path after ``prefix`` (its first part renamed by
    ``rename``, e.g. a field to its file key), the value given, and pydantic's rule."""
    out = []
    for err in exc.errors():
        loc = [str(x) for x in err["loc"]]
        if rename and loc and loc[0] in rename:
            loc[0] = rename[loc[0]]
        where = ".".join(loc)
        where = f"{prefix}{where}" if where else prefix.rstrip(".: ")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not in the schema; check the spelling)"
        elif err["type"] != "missing" and "input" in err and loc:  # a whole-object check names its fields
            msg = f"{err['input']!r}: {msg}"
        out.append(Problem(where, msg))
    return out
