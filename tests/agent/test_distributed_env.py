"""The variables PyTorch's launchers read: what each rank of a gang gets, and the MASTER_PORT
every agent derives alike and rank 0's agent holds for the attempt."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator

import pytest

from schemas.jobs import RankPlacement
from services.agent.ranks import (
    MASTER_PORT_COUNT,
    MASTER_PORT_FIRST,
    MasterPortBusy,
    MasterPorts,
    derived_master_port,
    distributed_env,
    infrastructure_ports,
    node_address,
    port_bindable,
)
from services.runtime.discovery import load_cluster_spec

# Two nodes, two ranks each, the ranks of a node not contiguous: numbering follows the ranks.
GANG = [
    RankPlacement(rank=0, node_id="n7", gpus=[0]),
    RankPlacement(rank=1, node_id="n3", gpus=[4]),
    RankPlacement(rank=2, node_id="n7", gpus=[1]),
    RankPlacement(rank=3, node_id="n3", gpus=[5]),
]


def test_every_rank_gets_torchruns_variables() -> None:
    envs = [distributed_env(GANG, rank, "10.0.0.7", 20123) for rank in range(4)]
    assert envs[3] == {
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "20123",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
    }
    assert [(e["NODE_RANK"], e["LOCAL_RANK"]) for e in envs] == [
        ("0", "0"),
        ("1", "0"),
        ("0", "1"),
        ("1", "1"),
    ]


def test_a_lone_rank_is_a_world_of_one() -> None:
    env = distributed_env([RankPlacement(rank=0, node_id="n0", gpus=[0])], 0, "h", 20000)
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == ("1", "1", "0")


def test_simulated_nodes_are_reached_over_loopback() -> None:
    [node] = load_cluster_spec("1x8")
    assert node_address(node) == "127.0.0.1"
    assert node_address(node.model_copy(update={"discovered_by": "nvml"})) == node.hostname


def test_the_derived_port_is_in_range_and_moves_with_the_attempt() -> None:
    ports = [derived_master_port("job-a", attempt) for attempt in range(1, 6)]
    assert all(MASTER_PORT_FIRST <= p < MASTER_PORT_FIRST + MASTER_PORT_COUNT for p in ports)
    assert len(set(ports)) == 5
    assert derived_master_port("job-a", 2) == derived_master_port("job-a", 2)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """Something else listening on the derived port of job-a's first attempt."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("0.0.0.0", derived_master_port("job-a", 1)))
    except OSError:
        server.close()
        pytest.skip("the derived port is taken on this host already")
    server.listen()
    yield server
    server.close()


def test_a_port_someone_listens_on_is_not_bindable(listener: socket.socket) -> None:
    assert not port_bindable(listener.getsockname()[1])


def test_an_agent_with_the_whole_gang_moves_past_a_busy_port(listener: socket.socket) -> None:
    busy = listener.getsockname()[1]
    port = MasterPorts().reserve("job-a", 1, whole_gang=True)
    assert port != busy
    assert port_bindable(port)


def test_a_gang_shared_with_other_agents_may_not_move_its_port(listener: socket.socket) -> None:
    with pytest.raises(MasterPortBusy, match="in use on rank 0's node"):
        MasterPorts().reserve("job-a", 1, whole_gang=False)


def test_two_live_attempts_never_share_a_port_and_a_released_one_is_free_again() -> None:
    # Two jobs whose derived ports collide (the range is finite): the second moves on.
    seen: dict[int, str] = {}
    for n in itertools.count():
        job = f"job-{n}"
        port = derived_master_port(job, 1)
        if port in seen:
            first, second = seen[port], job
            break
        seen[port] = job
    ports = MasterPorts(bindable=lambda port: True)
    a = ports.reserve(first, 1, whole_gang=True)
    assert ports.reserve(first, 1, whole_gang=True) == a  # the same for each of its ranks
    with pytest.raises(MasterPortBusy):
        ports.reserve(second, 1, whole_gang=False)
    b = ports.reserve(second, 1, whole_gang=True)
    assert b != a
    ports.release(first, 1)
    ports.release(second, 1)
    assert ports.reserve(second, 1, whole_gang=False) == a


def test_the_range_is_clear_of_the_local_stacks_default_ports() -> None:
    # A rank holding PostgreSQL's or Kafka's port while the server restarts keeps it down.
    stack = {25432, 29092, 29093}
    assert not any(MASTER_PORT_FIRST <= p < MASTER_PORT_FIRST + MASTER_PORT_COUNT for p in stack)


def test_the_installations_own_ports_are_found_in_its_addresses() -> None:
    assert infrastructure_ports(
        "postgresql://app:secret@db.example:15432/gangway",
        "k1.example:19092, k2.example:19093",
        "http://127.0.0.1:18080",
        "http://[::1]/no-port",
    ) == {15432, 19092, 19093, 18080}


def test_every_agent_derives_and_reserves_past_the_avoided_ports() -> None:
    derived = derived_master_port("job-a", 1)
    avoid = frozenset({derived, derived + 1})
    moved = derived_master_port("job-a", 1, avoid)
    assert moved not in avoid
    assert moved == derived_master_port("job-a", 1, avoid)  # the same on every agent
    ports = MasterPorts(bindable=lambda port: True, avoid=avoid)
    assert ports.reserve("job-a", 1, whole_gang=False) == moved
    whole = MasterPorts(bindable=lambda port: port != moved, avoid=avoid)
    assert whole.reserve("job-a", 1, whole_gang=True) not in avoid | {moved}
