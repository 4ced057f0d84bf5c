"""What the log knows of remote storage (KIP-405): the interface of a remote store and the
metadata of the segments in it, as Kafka's storage API has them. Stores live in strom.remote;
nothing here imports one."""

from strom.log.remote.metadata import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from strom.log.remote.metadata_cache import RemoteLogMetadataCache, RemoteLogMetadataStateError
from strom.log.remote.records import (
    RemoteLogMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
)
from strom.log.remote.storage import (
    RemoteResourceNotFound,
    RemoteStorageError,
    RemoteStorageManager,
)

__all__ = [
    "IndexType", "LogSegmentData", "RemoteLogMetadata", "RemoteLogMetadataCache",
    "RemoteLogMetadataStateError", "RemoteLogSegmentId",
    "RemoteLogSegmentMetadata", "RemoteLogSegmentMetadataUpdate", "RemoteLogSegmentState",
    "RemotePartitionDeleteMetadata", "RemotePartitionDeleteState", "RemoteResourceNotFound",
    "RemoteStorageError", "RemoteStorageManager",
]
