"""The relay's partitioner puts every key where aiokafka's default partitioner does: a stream's
events stay on one partition across relay restarts and versions."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from services.runtime.relay import StreamPartitioner


def test_every_key_lands_on_the_default_partitioners_partition() -> None:
    keys = [f"job-{index:012x}".encode() for index in range(2000)] + [b"", b"node-a", b"\xff"]
    for partitions in ([0], [0, 1, 2], list(range(12)), [3, 5, 7, 11]):
        remembering = StreamPartitioner()
        for _ in range(2):  # computed, then remembered
            for key in keys:
                expected = DefaultPartitioner()(key, partitions, partitions)
                assert remembering(key, partitions, partitions) == expected


def test_what_it_remembers_is_bounded_and_stays_exact_past_the_bound() -> None:
    partitioner = StreamPartitioner(remembered=10)
    partitions = list(range(6))
    for index in range(100):
        key = f"job-{index}".encode()
        assert partitioner(key, partitions, partitions) == DefaultPartitioner()(
            key, partitions, partitions
        )
        assert len(partitioner) <= 10


def test_a_message_without_key_goes_to_an_available_partition() -> None:
    assert StreamPartitioner()(None, [0, 1, 2], [2]) == 2
