"""JAAS option lines as Kafka configures SASL with them (`sasl.jaas.config`, and a broker
listener's `<mechanism>.sasl.jaas.config`): one login module, its flag, key="value" options."""

from __future__ import annotations

import re

_JAAS = re.compile(r'^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)\s*(?P<options>.*?);?\s*$',
                   re.DOTALL)
_OPTION = re.compile(r'\s*(?P<key>[\w.-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;]+))')


def parse_jaas(text: str) -> dict[str, str]:
    """The options of a one-module JAAS line, e.g. `...PlainLoginModule required
    username="admin" password="s" user_admin="s";` -> {"username": "admin", ...}."""
    match = _JAAS.match(text)
    if match is None:
        raise ValueError("expected '<LoginModule class> required key=\"value\" ...;'")
    options, pos, rest = {}, 0, match["options"]
    while pos < len(rest.rstrip().rstrip(";")):
        option = _OPTION.match(rest, pos)
        if option is None:
            raise ValueError(f"cannot read the JAAS options from {rest[pos:pos + 30]!r}")
        quoted = option["quoted"]
        options[option["key"]] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else option["bare"]
        pos = option.end()
    return options
