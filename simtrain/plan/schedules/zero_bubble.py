"""ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, sec. 3.1 and Fig. 3;
sail-sg/zero-bubble-pipeline-parallelism): 1F1B's order and memory with the backward split into B and
W; stage ``s`` postpones its first ``s`` W passes into the drain, where they fill the bubble 1F1B
leaves there."""

from __future__ import annotations

from typing import ClassVar

from simtrain.plan.schedules.base import Action, Schedule
from simtrain.spec.schedule_names import ScheduleKind


def zb_h1(p: int, m: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2023 sec. 3.1, Fig. 3): 1F1B with the backward split into B and W.

    Stage ``s`` runs 1F1B's ``p - s - 1`` warm-up forwards and then F/B pairs in 1F1B's order, so
    the forwards in flight (and the activation peak) are 1F1B's; W passes follow their B, except that
    the first ``s`` of them are postponed: each stage's W lags its B by ``s`` steady steps and the
    last ``s`` W passes run after the last B, filling the drain bubble (the "later-starting W
    passes" of sec. 3.1; PyTorch ``torch.distributed.pipelining`` builds its zero-bubble ranks the
    same way). With ``W <= F`` and ``W <= B`` (B the input-gradient backward) the bubble is
    ``(p - 1)(F + B - W)``, against 1F1B's ``(p - 1)(F + B + W)``: a third of it when
    ``F = B = W`` (Qi et al.'s setting). DeepSeek-V3's Table 2 writes the same
    ``(PP - 1)(F + B - 2W)`` with B the full backward.
    """
    out = []
    for s in range(p):
        warm = min(p - s - 1, m)
        acts = [Action("F", i, 0) for i in range(warm)]
        lag = min(s, m)
        w_next = 0
        for b in range(m):
            if warm + b < m:
                acts.append(Action("F", warm + b, 0))
            acts.append(Action("B", b, 0))
            if b >= lag:
                acts.append(Action("W", w_next, 0))
                w_next += 1
        acts += [Action("W", i, 0) for i in range(w_next, m)]
        out.append(acts)
    return out


class ZBH1(Schedule):
    """ZB-H1: one chunk per stage, every backward split; timed by its action lists."""

    kind: ClassVar[str] = ScheduleKind.ZB_H1
    title: ClassVar[str] = "ZB-H1"
    splits_backward: ClassVar[bool] = True

    def actions(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        return zb_h1(p, m)
