"""Values as Java writes them as text, where a Kafka or Confluent tool's output or a stored
schema must read the same as theirs."""

from __future__ import annotations

import json
from decimal import Decimal


def java_double(x: float) -> str:
    """A double as Java's Double.toString writes it (and Jackson, and Kafka's tools printing a
    quota): shortest digits, at least one after the point, scientific below 10^-3 and from 10^7
    (1048576.0, 1.048576E7)."""
    if x != x or x in (float("inf"), float("-inf")):
        return json.dumps(x)
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        return repr(float(x))
    sign, digits, exponent = Decimal(repr(float(x))).normalize().as_tuple()
    text = "".join(map(str, digits))
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{exponent + len(text) - 1}"
