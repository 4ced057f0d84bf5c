"""How Kafka's perf-test tools print numbers, dates and metrics, so that scripts parsing their
output read Strom's the same: Java's `%.Nf` (half-up rounding of the shortest decimal form,
`NaN`, `Infinity`), java.text.SimpleDateFormat patterns, and ToolsUtils.printMetrics' table.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_UP, Decimal


def java_fixed(x: float, places: int) -> str:
    """`String.format("%.{places}f", x)` as Java prints it: 0.125 -> "0.13" (Python: "0.12")."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    # Java rounds the shortest decimal that reads back as x (Python's repr), half up.
    return str(Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def ratio(numerator: float, denominator: float) -> float:
    """Java's double division: x/0 is Infinity (or NaN for 0/0), never an exception."""
    if denominator == 0:
        return math.nan if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / denominator


# --- SimpleDateFormat --------------------------------------------------------------------------
class DatePatternError(ValueError):
    """A pattern SimpleDateFormat refuses (Java's message)."""


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _offset(t: dt.datetime, colon: bool, z_for_utc: bool, hours_only: bool = False) -> str:
    seconds = int(t.utcoffset().total_seconds()) if t.utcoffset() else 0
    if z_for_utc and seconds == 0:
        return "Z"
    sign = "-" if seconds < 0 else "+"
    hours, minutes = divmod(abs(seconds) // 60, 60)
    if hours_only:
        return f"{sign}{hours:02d}"
    return f"{sign}{hours:02d}{':' if colon else ''}{minutes:02d}"


def _field(letter: str, count: int) -> Callable[[dt.datetime], str]:
    def number(get: Callable[[dt.datetime], int]) -> Callable[[dt.datetime], str]:
        return lambda t: str(get(t)).zfill(count)

    if letter == "y":
        return (lambda t: f"{t.year % 100:02d}") if count == 2 else number(lambda t: t.year)
    if letter in "ML":
        if count >= 4:
            return lambda t: _MONTHS[t.month - 1]
        if count == 3:
            return lambda t: _MONTHS[t.month - 1][:3]
        return number(lambda t: t.month)
    simple = {"d": lambda t: t.day, "D": lambda t: t.timetuple().tm_yday, "H": lambda t: t.hour,
              "k": lambda t: t.hour or 24, "K": lambda t: t.hour % 12, "h": lambda t: t.hour % 12 or 12,
              "m": lambda t: t.minute, "s": lambda t: t.second, "S": lambda t: t.microsecond // 1000,
              "u": lambda t: t.isoweekday()}
    if letter in simple:
        return number(simple[letter])
    if letter == "E":
        return (lambda t: _DAYS[t.weekday()]) if count >= 4 else (lambda t: _DAYS[t.weekday()][:3])
    if letter == "a":
        return lambda t: "AM" if t.hour < 12 else "PM"
    if letter == "Z":
        return lambda t: _offset(t, colon=False, z_for_utc=False)
    if letter == "X":
        if count > 3:
            raise DatePatternError("invalid ISO 8601 format: length=" + str(count))
        return lambda t: _offset(t, colon=count == 3, z_for_utc=True, hours_only=count == 1)
    if letter == "z":
        return lambda t: t.tzname() or ""
    raise DatePatternError(f"Illegal pattern character '{letter}'")


def java_date_format(pattern: str) -> Callable[[int], str]:
    """A formatter of epoch milliseconds (local time) for a SimpleDateFormat pattern such as
    Kafka's default `yyyy-MM-dd HH:mm:ss:SSS`; DatePatternError for what Java refuses."""
    parts: list[Callable[[dt.datetime], str]] = []
    for m in re.finditer(r"'((?:[^']|'')*)'|([A-Za-z])\2*|(.)", pattern, re.DOTALL):
        quoted, run, other = m.group(1), m.group(2), m.group(3)
        text = m.group(0)
        if quoted is not None:
            literal = quoted.replace("''", "'") if quoted else "'"
            parts.append(lambda t, s=literal: s)
        elif run is not None:
            parts.append(_field(run, len(text)))
        elif other == "'":
            raise DatePatternError(f"Unterminated quote in {pattern!r}")
        else:
            parts.append(lambda t, s=text: s)

    def format_ms(ms: int) -> str:
        t = dt.datetime.fromtimestamp(ms / 1000).astimezone()
        return "".join(part(t) for part in parts)

    return format_ms


# --- ToolsUtils.printMetrics -------------------------------------------------------------------
def metrics_table(metrics: Iterable[tuple[str, object]]) -> str:
    """A blank line, `Metric Name   Value`, then one `name : value` line per metric sorted by
    name, names padded to the longest; floats with three decimals, as Kafka prints them."""
    rows = sorted(metrics)
    if not rows:
        return ""
    width = max(len(name) for name, _ in rows)
    lines = ["", f"{'Metric Name':<{width}}   Value"]
    for name, value in rows:
        shown = java_fixed(value, 3) if isinstance(value, float) else str(value)
        lines.append(f"{name:<{width}} : {shown}")
    return "\n".join(lines)
