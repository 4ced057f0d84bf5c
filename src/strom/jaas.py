"""JAAS option lines as Kafka configures SASL with them (`sasl.jaas.config`, and a broker
listener's `<mechanism>.sasl.jaas.config`): one login module, its flag, key="value" options."""

from __future__ import annotations

import re

_JAAS = re.compile(r'^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*)$',
                   re.DOTALL)
_KEY = re.compile(r'\s*(?P<key>[\w.-]+)\s*=')
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
    options, pos, rest, last = {}, 0, match["options"], None
    while True:
        option = _OPTION.match(rest, pos)
        if option is None:
            break
        quoted, last = option["quoted"], option["key"]
        options[last] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else option["bare"]
        pos = option.end()
    tail = rest[pos:].strip()
    if tail != ";":
        if not tail:
            raise ValueError("the JAAS line must end with ';'")
        # Errors name the option, never any of the line's text: its values are passwords, and
        # the error goes to logs and terminals.
        key = _KEY.match(rest, pos)
        where = (f"option {key['key']!r}" if key else f"after option {last!r}" if last
                 else "the first option")
        if '"' in tail:
            raise ValueError(f"a quote that does not close in the JAAS options, at {where}")
        raise ValueError(f"cannot read the JAAS options at {where}")
    return options
