"""A consumer's offset commit after a rebalance (found by the attack round, 2026-11-23: admission
killed and restarted under a burst of batch submissions, two members in its group). Offsets
are committed every `commit_interval_s`, so those kept for a partition that a rebalance has
since given to another member reached `AIOKafkaConsumer.commit`, which raised
IllegalStateError ("Partition ... is not assigned", or "No partitions assigned" mid-rebalance)
rather than CommitFailedError: the service died with a traceback, and its restart rebalanced
the group again. The new owner re-reads from the last commit; the inbox makes the repeats
no-ops, so such offsets are dropped, not committed."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

from services.runtime import Settings
from services.runtime.consumer import ConsumerLoop

KEPT = TopicPartition("gangway.jobs", 1)
MOVED = TopicPartition("gangway.jobs", 2)


class Consumer:
    """The part of AIOKafkaConsumer a commit uses, with aiokafka's checks."""

    def __init__(self, assigned: set[TopicPartition] | None) -> None:
        self.assigned = assigned
        self.committed: list[dict[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned or ())

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.assigned is None:
            raise IllegalStateError("No partitions assigned")
        for tp in offsets:
            if tp not in self.assigned:
                raise IllegalStateError(f"Partition {tp} is not assigned")
        self.committed.append(dict(offsets))


class Loop(ConsumerLoop):
    async def process(self, record: Any) -> Any:
        raise AssertionError("only commits here")


def loop() -> Loop:
    return Loop(Settings(_env_file=None), name="admission", topics=["gangway.jobs"])


async def test_offsets_of_a_partition_moved_to_another_member_are_dropped() -> None:
    consumer = Consumer({KEPT})
    await loop()._commit(consumer, {KEPT: 10, MOVED: 20})
    assert consumer.committed == [{KEPT: 10}]


async def test_a_commit_in_the_middle_of_a_rebalance_is_no_crash() -> None:
    consumer = Consumer(None)
    await loop()._commit(consumer, {KEPT: 10})
    assert consumer.committed == []
