"""Logger levels the way Kafka's log4j loggers are set: at start-up from a spec
(`--log-level`, `STROM_LOG_LEVEL`) and while running through DescribeConfigs and
IncrementalAlterConfigs on the BROKER_LOGGER resource (`kafka-configs --entity-type
broker-loggers`), which Kafka keeps in memory only, as here.

A spec is a comma list: a bare level sets the root of Strom's loggers, `name=LEVEL` one logger
and what is below it, e.g. `WARN,strom.request=DEBUG` (every request logged, one line each).

`RateLimit` keeps warnings and errors to a few lines per cause, whatever clients repeat.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

TRACE = 5  # log4j's TRACE, below DEBUG
logging.addLevelName(TRACE, "TRACE")

# log4j's names (and Python's spellings of them) -> logging levels; OFF silences a logger.
LEVELS = {"TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
          "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL,
          "CRITICAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}
ROOT = "root"
# Kafka's names for the loggers operators reach for, so their commands work unchanged.
ALIASES = {"kafka.request.logger": "strom.request", "kafka": "strom"}


class LevelError(ValueError):
    pass


def level_of(text: str) -> int:
    level = LEVELS.get(text.strip().upper())
    if level is None:
        raise LevelError(f"{text.strip()!r} is not a log level (one of TRACE, DEBUG, INFO, WARN, ERROR, FATAL, OFF)")
    return level


def parse_spec(spec: str) -> dict[str, int]:
    """`"WARN,strom.request=DEBUG"` -> {"root": WARNING, "strom.request": DEBUG}."""
    levels: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, level = item.rpartition("=")
        if not sep:
            name, level = ROOT, item
        if not name.strip():
            raise LevelError(f"{item!r}: a logger name is missing before '='")
        levels[ALIASES.get(name.strip(), name.strip())] = level_of(level)
    return levels


def apply(levels: dict[str, int]) -> None:
    for name, level in levels.items():
        logging.getLogger(None if name == ROOT else name).setLevel(level)


def current_levels() -> dict[str, str]:
    """Every logger Strom has made, with its effective level (DescribeConfigs BROKER_LOGGER)."""
    names = sorted(n for n, obj in logging.root.manager.loggerDict.items()
                   if n.startswith("strom") and isinstance(obj, logging.Logger))
    out = {ROOT: _name(logging.getLogger().getEffectiveLevel())}
    out.update((n, _name(logging.getLogger(n).getEffectiveLevel())) for n in names)
    return out


def set_level(name: str, level: str | None) -> None:
    """Set one logger's level; None resets it to inherit its parent's (Kafka's DELETE)."""
    name = ALIASES.get(name, name)
    if name != ROOT and name not in logging.root.manager.loggerDict and not name.startswith("strom"):
        raise LevelError(f"Logger {name} does not exist!")
    logger = logging.getLogger(None if name == ROOT else name)
    if level is None:
        if name == ROOT:
            raise LevelError("Removing the log level of the root logger is not allowed")
        logger.setLevel(logging.NOTSET)
    else:
        logger.setLevel(level_of(level))


def _name(level: int) -> str:
    if level >= LEVELS["OFF"]:
        return "OFF"
    if level >= logging.CRITICAL:
        return "FATAL"
    if level >= logging.WARNING and level < logging.ERROR:
        return "WARN"
    return logging.getLevelName(level)


class RateLimit(logging.Filter):
    """Warnings and errors, limited per cause: a client that repeats a bad request must not
    fill the disk with the same line (200 malformed requests were 200 warnings).

    A cause is a line's logger, level and message template, with its arguments stripped of
    numbers (peers' ports, offsets, sizes), so "closing connection from 10.0.0.1:5123: frame of
    9 bytes" and the same from another port are one cause. Per `window_s`, each cause passes
    `per_cause` lines and each template `per_template` (arguments that differ in their letters,
    such as made-up topic names, still make distinct causes). What is held back is counted and
    said on the next line of the template that passes. Lines below WARNING are not limited
    (the request log at DEBUG is one line per request by design)."""

    _MAX_CAUSES = 10_000  # per window; beyond, only the template limit applies

    def __init__(self, window_s: float = 10.0, per_cause: int = 3, per_template: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.window_s = window_s
        self.per_cause = per_cause
        self.per_template = per_template
        self._lock = threading.Lock()
        self._window_start = -window_s
        self._causes: dict[tuple, int] = {}
        self._templates: dict[tuple, int] = {}
        self._held: dict[tuple, int] = {}  # per template: lines suppressed, not yet said

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        template = (record.name, record.levelno, str(record.msg))
        cause = (*template, _shape(record.args))
        now = self.clock()
        with self._lock:
            if now - self._window_start >= self.window_s:
                self._window_start = now
                self._causes.clear()
                self._templates.clear()
            seen = self._causes.get(cause, 0)
            of_template = self._templates.get(template, 0)
            if seen >= self.per_cause or of_template >= self.per_template:
                self._held[template] = self._held.get(template, 0) + 1
                return False
            if seen or len(self._causes) < self._MAX_CAUSES:
                self._causes[cause] = seen + 1
            self._templates[template] = of_template + 1
            held = self._held.pop(template, 0)
        if held:
            record.msg, record.args = f"{record.getMessage()} ({held} more like this were not logged)", None
        return True


_DIGITS = re.compile(r"\d+")


def _shape(args: object) -> tuple:
    """A line's arguments without their numbers, each cut short: what makes it a cause."""
    if not args:
        return ()
    values = args.values() if isinstance(args, dict) else args if isinstance(args, tuple) else (args,)
    return tuple(_DIGITS.sub("#", str(v)[:200])[:80] for v in values)
