"""The tables BENCHMARKS.md quotes, printed from the rows."""

from __future__ import annotations

import math
from typing import Any

from bench.cost_at_scale.common import TUNERS, median_interval


def cell(values: list[float | None], digits: int = 1, percent: bool = False) -> str:
    """`median [low-high]` over the repetitions (None counts as infinite); `*`: the range (n < 6)."""
    numbers = [math.inf if v is None else v for v in values]
    if not numbers:
        return "-"
    median, low, high, exact = median_interval(numbers)

    def fmt(v: float) -> str:
        if math.isinf(v):
            return "never"
        return f"{100 * v:.{digits}f} %" if percent else f"{v:,.{digits}f}"

    return f"{fmt(median)} [{fmt(low)}-{fmt(high)}]{'' if exact else '*'}"


def grouped(rows: list[dict[str, Any]]) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """The repetitions by (slots, tuner), in table order."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["slots"], row["tuner"]), []).append(row)
    order = sorted(groups, key=lambda key: (key[0], TUNERS.index(key[1])))
    return [(slots, tuner, groups[(slots, tuner)]) for slots, tuner in order]


def verdicts(group: list[dict[str, Any]]) -> dict[str, int]:
    """How often each arm won (or 'none': no winner)."""
    counts: dict[str, int] = {}
    for row in group:
        key = (row["winner"] or "none").removeprefix("optimizer.name=")
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


FIGURES = ("first_hit_gpu_h", "first_hit_wall_h", "answer_gpu_h", "answer_wall_h", "idle_fraction", "cpu_s")


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (slots, tuner): n, hits, verdicts and every figure's median, low, high, exact (None: never, no hit)."""

    def figure(values: list[float | None]) -> dict[str, Any]:
        median, low, high, exact = median_interval([math.inf if v is None else v for v in values])
        finite = {k: None if math.isinf(v) else v for k, v in (("median", median), ("low", low), ("high", high))}
        return {**finite, "exact": exact}

    return [{"slots": slots, "tuner": tuner, "n": len(group), "trials": group[0]["trials"],
             "hits": sum(r["first_hit_wall_h"] is not None for r in group), "verdicts": verdicts(group),
             **{key: figure([r[key] for r in group]) for key in FIGURES}}
            for slots, tuner, group in grouped(rows)]  # fmt: skip


def print_cost_table(rows: list[dict[str, Any]]) -> None:
    print("| slots | tuner | n | trials | first hit: GPU-h | first hit: wall h | answer: GPU-h | answer: wall h | "
          "idle slot-time | verdict (of n) | CPU s / rep |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for slots, tuner, group in grouped(rows):
        hits = sum(r["first_hit_wall_h"] is not None for r in group)
        named = ", ".join(f"{k} {v}" for k, v in verdicts(group).items())
        print(f"| {slots:,} | {tuner} | {len(group)} | {group[0]['trials']:,} | "
              f"{cell([r['first_hit_gpu_h'] for r in group])} | {cell([r['first_hit_wall_h'] for r in group], 2)}"
              f"{'' if hits == len(group) else f' ({hits} hit)'} | {cell([r['answer_gpu_h'] for r in group])} | "
              f"{cell([r['answer_wall_h'] for r in group], 2)} | "
              f"{cell([r['idle_fraction'] for r in group], 1, True)} | {named} | "
              f"{cell([r['cpu_s'] for r in group])} |")  # fmt: skip


def print_cpu_table(rows: list[dict[str, Any]]) -> None:
    print("| tuner | trials | reached | slots | loop CPU ms / trial (without the runner) | tuner ask + tell CPU ms / "
          "decision (last tenth) | decisions / CPU s | CPU s | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("skipped"):
            print(f"| {r['tuner']} | {r['trials']:,} | not run: {r['skipped']} | | | | | | |")
            continue
        per = r["tuner_ms_per_decision_last_tenth"]
        rate = r["decisions_per_cpu_s"]
        reached = f"{r['asked']:,}" + (" (CPU limit)" if r["stopped"] else "")
        print(f"| {r['tuner']} | {r['trials']:,} | {reached} | {r['slots']:,} | {r['loop_ms_per_trial']:.1f} | "
              f"{'-' if per is None else f'{per:.1f}'} | {'-' if rate is None else f'{rate:,.1f}'} | "
              f"{r['cpu_s']:.1f} | {r['wall_s']:.1f} |")  # fmt: skip
    for r in rows:
        if not r.get("skipped") and (r["tuner_ms_per_decision_last_tenth"] or 0) >= 1:
            trend = ", ".join(f"{n:,}: {ms:,.0f}" for n, ms in r["trend_ms"])
            print(f"\n{r['tuner']}, {r['trials']:,} trials: tuner CPU ms per decision by trials asked: {trend}")


# ------------------------------------------------------------------------------------------------ main
