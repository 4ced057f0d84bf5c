"""Java's Double.toString, as Kafka's tools print quotas and Jackson writes Confluent's schemas."""

import pytest

from strom.java_text import java_double


@pytest.mark.parametrize("value, text", [
    (1048576, "1048576.0"), (1024.0, "1024.0"), (0.5, "0.5"), (0.0, "0.0"), (1e-3, "0.001"),
    (9999999.0, "9999999.0"), (1e7, "1.0E7"), (10485760, "1.048576E7"), (1.5e20, "1.5E20"),
    (0.0001, "1.0E-4"), (-2.5e-5, "-2.5E-5"), (float("inf"), "Infinity"),
])
def test_java_double(value, text):
    assert java_double(value) == text
