"""The markup every report page shares: the page frame and its CSS, table cells tagged with their arm and field
(what tests and scripts read back), figures as data: URIs, and the formatting of the report's numbers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from hpo.report import figures
from hpo.report.data import (
    TrialRow,
)
from hpo.trials import objective_text

Link = Callable[[str], str]

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1240px;color:#1b1b1b;
padding:0 16px;line-height:1.4}
h1{margin-bottom:2px}h2{margin-top:34px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#555;margin-top:0}.verdict{font-size:1.25em;padding:12px 16px;border-left:6px solid #3b75af;
background:#f2f6fb;margin:16px 0}.verdict.none{border-color:#b40426;background:#fbf2f2}
.note{padding:8px 12px;background:#fff8e1;border-left:4px solid #e0a800;margin:8px 0}
table{border-collapse:collapse;margin:8px 0;font-size:0.92em}th,td{border:1px solid #ddd;padding:4px 8px;
text-align:right;vertical-align:top}th{background:#f5f5f5}td.l,th.l{text-align:left}
img{max-width:100%;height:auto;display:block;margin:8px 0}code,pre{background:#f5f5f5;padding:2px 5px}
pre{padding:8px;overflow-x:auto}.bar{background:#3b75af;height:10px;display:inline-block}
details summary{cursor:pointer;font-weight:600}.muted{color:#777}.wide{overflow-x:auto;max-width:100%}
"""


# --------------------------------------------------------------------------- formatting


def fmt_samples(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def fmt_objective(value: float | None) -> str:
    return "–" if value is None else objective_text(value)


def fmt_accuracy(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def fmt_noise(value: float | None) -> str:
    """Noise scales span orders of magnitude: whole numbers from 100 on, 3 significant digits below."""
    return "–" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fmt_trial_noise(t: TrialRow) -> str:
    """A trial's noise scale: the value, or `≥ value (lower bound: why)` where it is only a lower bound."""
    reason = t.noise_lower_bound
    return fmt_noise(t.noise_scale) if reason is None else f"≥ {fmt_noise(t.noise_scale)} (lower bound: {reason})"


def fmt_interval(low: float | None, high: float | None) -> str:
    return "–" if low is None or high is None else f"{low:,.0f} to {high:,.0f}"


def cell(text: str, field: str | None = None, arm: str | None = None, cls: str = "") -> str:
    attrs = (f' data-field="{escape(field)}"' if field else "") + (f' data-arm="{escape(arm)}"' if arm else "")
    shown = escape(text)
    if "=" in text:  # an arm's label (key=value,key=value): a line may break after each comma, so the table fits
        shown = shown.replace(",", ",<wbr>")
    return f"<td{attrs}{f' class={cls!r}' if cls else ''}>{shown}</td>"


def tagged(arm: str, label: str, fields: Sequence[tuple[str, str]]) -> str:
    """A row: the arm's label, then one cell per (field, text), each tagged with the arm and its field."""
    return cell(label, cls="l") + "".join(cell(text, field, arm) for field, text in fields)


def html_table(head: Sequence[str], rows: Sequence[str], left: int = 1) -> str:
    cells = "".join(f"<th{' class=l' if i < left else ''}>{escape(h)}</th>" for i, h in enumerate(head))
    rows_html = "".join(f"<tr>{r}</tr>" for r in rows)
    return f"<div class=wide><table><tr>{cells}</tr>{rows_html}</table></div>"  # a table wider than the page scrolls


def img(fig, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{figures.png(fig)}">' if fig is not None else ""


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{CSS}</style></head>"
            f"<body>{body}</body></html>")  # fmt: skip
