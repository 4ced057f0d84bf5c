"""Logger levels the way Kafka's log4j loggers are set: at start-up from a spec
(`--log-level`, `STROM_LOG_LEVEL`) and while running through DescribeConfigs and
IncrementalAlterConfigs on the BROKER_LOGGER resource (`kafka-configs --entity-type
broker-loggers`), which Kafka keeps in memory only, as here.

A spec is a comma list: a bare level sets the root of Strom's loggers, `name=LEVEL` one logger
and what is below it, e.g. `WARN,strom.request=DEBUG` (every request logged, one line each).
"""

from __future__ import annotations

import logging

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
