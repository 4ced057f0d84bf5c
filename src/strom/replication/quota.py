"""Replication throttles (Kafka's ReplicationQuotaManager, for reassignments).

A leader stops sending throttled replicas' data while its budget of
`leader.replication.throttled.rate` is spent, and a follower asks for no more than its
budget of `follower.replication.throttled.rate` allows. Only replicas named
in the topic's `*.replication.throttled.replicas` count, so client traffic is never throttled.
"""

from __future__ import annotations

from strom.throttle import TokenBucket


class ReplicationQuota(TokenBucket):
    """The leader's or the follower's budget of throttled replication bytes."""
