"""Server-side assignors of KIP-848 consumer groups: "uniform" and "range".

An assignor maps the members' subscriptions onto the partitions of the subscribed topics. The
result is the group's target assignment; the coordinator then moves each member towards it
without ever giving a partition to two members at once.

- uniform: balanced and sticky. Every member keeps what it had as far as balance allows, and
  the rest goes, partition by partition, to the least loaded member that subscribes to the
  topic. With identical subscriptions every member ends with floor or ceil of the average.
- range: per topic, the subscribed members in member-id order take consecutive ranges, the
  first ones one partition more when the count does not divide; co-partitioned topics land
  on the same members, as with the classic RangeAssignor.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

Assignment = dict[uuid.UUID, set[int]]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic_id: uuid.UUID
    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    topics: frozenset[uuid.UUID]
    current: Mapping[uuid.UUID, set[int]]  # the member's current target, for stickiness


def assign_range(members: Mapping[str, MemberSubscription], topics: Mapping[uuid.UUID, TopicInfo]
                 ) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {m: {} for m in members}
    for topic_id, info in topics.items():
        subscribers = sorted(m for m, sub in members.items() if topic_id in sub.topics)
        if not subscribers:
            continue
        quota, extra = divmod(info.partitions, len(subscribers))
        start = 0
        for i, member_id in enumerate(subscribers):
            count = quota + (1 if i < extra else 0)
            if count:
                out[member_id][topic_id] = set(range(start, start + count))
            start += count
    return out


def assign_uniform(members: Mapping[str, MemberSubscription], topics: Mapping[uuid.UUID, TopicInfo]
                   ) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {m: {} for m in members}
    if not members:
        return out
    total = sum(info.partitions for tid, info in topics.items()
                if any(tid in sub.topics for sub in members.values()))
    # Balance targets: with identical subscriptions this is floor/ceil of the average; with
    # different ones a member can only take what it subscribes to, and the greedy fill below
    # still gives every partition to the least loaded eligible member.
    quota, extra = divmod(total, len(members))
    order = sorted(members)
    limits = {m: quota + (1 if i < extra else 0) for i, m in enumerate(order)}
    load = dict.fromkeys(members, 0)
    taken: set[tuple[uuid.UUID, int]] = set()
    # 1. Stickiness: keep current partitions that are still valid, up to the member's limit.
    for member_id in order:
        sub = members[member_id]
        for topic_id in sorted(sub.current, key=str):
            info = topics.get(topic_id)
            if info is None or topic_id not in sub.topics:
                continue
            for p in sorted(sub.current[topic_id]):
                if p < info.partitions and (topic_id, p) not in taken and load[member_id] < limits[member_id]:
                    out[member_id].setdefault(topic_id, set()).add(p)
                    taken.add((topic_id, p))
                    load[member_id] += 1
    # 2. Everything else to the least loaded subscriber (ties by member id, for determinism).
    for topic_id in sorted(topics, key=lambda t: topics[t].name):
        subscribers = [m for m in order if topic_id in members[m].topics]
        if not subscribers:
            continue
        for p in range(topics[topic_id].partitions):
            if (topic_id, p) in taken:
                continue
            member_id = min(subscribers, key=lambda m: (load[m] >= limits[m], load[m], m))
            out[member_id].setdefault(topic_id, set()).add(p)
            taken.add((topic_id, p))
            load[member_id] += 1
    return out


ASSIGNORS = {"uniform": assign_uniform, "range": assign_range}
