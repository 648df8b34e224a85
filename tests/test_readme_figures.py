"""README.md and the example comments quote what the code computes (issue 31, part 5).

Each figure of ``benchmarks/readme_figures.py`` is a phrase of a document with placeholders filled
by running simtrain; a figure fails when the document says another number (or lost the phrase).
The figures that take seconds run in the default suite; the whole runs and searches (minutes on a
shared CPU) run with ``SIMTRAIN_VALIDATION=1``, as ``.ci/run`` does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import readme_figures as rf  # noqa: E402 - the repository root is on the path only from here

SLOW = os.environ.get("SIMTRAIN_VALIDATION") != "1"


#: the whole runs and searches carry the ``slow_figure`` marker: .ci/run's figures stage runs only those
#: (``-m slow_figure``), the seconds-long ones having run in its suite stage already
@pytest.mark.parametrize("figure", [pytest.param(f, marks=[pytest.mark.slow_figure] if f.slow else [])
                                    for f in rf.FIGURES], ids=[f"{f.doc}:{f.phrase[:40]}" for f in rf.FIGURES])
def test_quoted_figure_matches_the_code(figure: rf.Figure) -> None:
    if figure.slow and SLOW:
        pytest.skip("a whole run or search: set SIMTRAIN_VALIDATION=1 (.ci/run does)")
    c = rf.check(figure)
    assert c.quoted is not None, f"{figure.doc} no longer has the phrase {figure.phrase!r}"
    assert c.ok, (f"{figure.doc} quotes {c.quoted} where the code gives {c.computed} "
                                    f"({figure.phrase!r}); python benchmarks/readme_figures.py --fix")


def test_each_phrase_occurs_once() -> None:
    """A phrase found twice would let a stale copy pass unchecked."""
    for f in rf.FIGURES:
        text = (rf.ROOT / f.doc).read_text(encoding="utf-8")
        assert len(f.pattern().findall(text)) == 1, f.phrase


def test_phrase_pattern_spans_line_breaks_and_comment_markers() -> None:
    f = rf.Figure("x", "peaks at ~{gib:.0f} GiB of {cap:d} GiB", lambda: {"gib": 58.6, "cap": 80})
    assert f.pattern().search("the step\n# peaks at\n# ~59 GiB of 80 GiB").groups() == ("59", "80")
    assert f.pattern().search("peaks at ~1,234.5 GiB of 80 GiB").groups() == ("1,234.5", "80")
    assert f.render(f.compute()) == ["59", "80"]
    assert f.pattern().search("peaks at 59 GiB of 80 GiB") is None  # the "~" is part of the phrase


def test_tolerance_covers_only_the_rounding_of_stored_errors() -> None:
    f = rf.Figure("x", "median {m:.1f} %", lambda: {"m": 8.55}, tol=0.01)
    assert rf.Check(f, ["8.5"], ["8.6"], [], [8.55]).ok  # 8.55 from errors stored to 0.01 %
    assert not rf.Check(f, ["8.3"], ["8.6"], [], [8.55]).ok
    strict = rf.Figure("x", "median {m:.1f} %", lambda: {"m": 8.55})
    assert not rf.Check(strict, ["8.5"], ["8.6"], [], [8.55]).ok


def test_no_two_figures_quote_one_number() -> None:
    """Each quoted number belongs to one figure: two figures matching the same characters would both be
    checked against it, and ``--fix`` would write two edits into one span (it did, garbling a README number
    once); the fixer now refuses such edits."""
    assert rf.overlapping(list(rf.FIGURES)) == []
    assert rf.overlapping([rf.FIGURES[0], rf.FIGURES[0]])  # the check sees a number quoted twice
