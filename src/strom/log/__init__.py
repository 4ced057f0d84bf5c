"""Storage engine: segments, indexes, logs, checkpoints and the log manager, in Kafka's formats."""

from strom.log.config import TOPIC_CONFIG_KEYS, LogConfig
from strom.log.log import AppendInfo, FetchSlice, Log
from strom.log.manager import LogManager
from strom.log.segment import LogSegment

__all__ = ["TOPIC_CONFIG_KEYS", "AppendInfo", "FetchSlice", "Log", "LogConfig", "LogManager", "LogSegment"]
