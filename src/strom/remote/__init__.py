"""Remote storage for tiered topics (KIP-405): the stores behind log.remote's interface.

objects.py lays a segment out as objects (one per file, named as Kafka's stores name them)
over four primitives a store provides; directory.py keeps them in a directory (one machine,
or a shared filesystem), s3.py in an S3 bucket (configured with the `rsm.config.*` keys
Kafka operators use). `storage_from_config` picks one from a broker's config."""

from strom.remote.config import storage_from_config

__all__ = ["storage_from_config"]
