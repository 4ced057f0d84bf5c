"""JAAS option lines as Kafka configures SASL with them (`sasl.jaas.config`, and a broker
listener's `<mechanism>.sasl.jaas.config`): one login module, its flag, key="value" options."""

from __future__ import annotations

import re

_JAAS = re.compile(r'^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*)$',
                   re.DOTALL)
_OPTION = re.compile(r'\s*(?P<key>[\w.-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;"]+))')


def parse_jaas(text: str) -> dict[str, str]:
    """The options of a one-module JAAS line, e.g. `...PlainLoginModule required
    username="admin" password="s" user_admin="s";` -> {"username": "admin", ...}. As Kafka's
    parser, the line must end with `;` and every quote must close: a line cut short (a
    password with a quote in it, a properties file's lost continuation) is refused, not read
    as something else."""
    match = _JAAS.match(text)
    if match is None:
        raise ValueError("expected '<LoginModule class> required key=\"value\" ...;'")
    options, pos, rest = {}, 0, match["options"]
    while True:
        option = _OPTION.match(rest, pos)
        if option is None:
            break
        quoted = option["quoted"]
        options[option["key"]] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else option["bare"]
        pos = option.end()
    tail = rest[pos:].strip()
    if tail != ";":
        if not tail:
            raise ValueError("the JAAS line must end with ';'")
        if '"' in tail:
            raise ValueError(f"a quote that does not close in the JAAS options at {tail[:30]!r}")
        raise ValueError(f"cannot read the JAAS options from {tail[:30]!r}")
    return options
