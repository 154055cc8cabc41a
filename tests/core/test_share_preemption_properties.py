"""Properties of preemption for and of slices and shares, with an inference headroom: after
any sequence of submissions of every class, cycles, evictions of preempted gangs, exits and
passing time, every rule of the sharing ledger holds (a soft-shared GPU never hosts two teams,
whatever preempted whom), the auditor finds nothing, and a scheduler restarted from the log
folds the very same ledger and decides the same."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core import SchedulingPolicy
from core.cycle import schedule
from tests.core.builders import History, JobBuilder
from tests.core.test_live_sharing_properties import check, clusters, jobs

CLASSES = ("best-effort", "research", "production", "inference-critical")

steps = st.one_of(
    st.tuples(st.just("submit"), st.tuples(jobs(), st.sampled_from(CLASSES))),
    st.tuples(st.just("cycle"), st.just(None)),
    st.tuples(st.just("evict"), st.integers(0, 50)),
    st.tuples(st.just("exit"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.sampled_from([1, 30, 61, 700])),
)


@settings(max_examples=60, deadline=None)
@given(clusters(), st.integers(0, 2), st.lists(steps, min_size=5, max_size=40))
def test_preemption_for_and_of_slices_and_shares_keeps_every_rule(
    cluster: str, headroom: int, sequence: list[tuple[str, object]]
) -> None:
    policy = SchedulingPolicy(inference_headroom_gpus=headroom, inference_max_victim_gpus=2)
    history = History(cluster=cluster, policy=policy)
    for action, argument in sequence:
        if action == "submit" and isinstance(argument, tuple):
            builder, priority = argument
            assert isinstance(builder, JobBuilder)
            history.submit(builder.priority(priority))
        elif action == "cycle":
            history.run(every_s=0)
        elif action in ("evict", "exit") and isinstance(argument, int):
            wanted = "preempting" if action == "evict" else "running"
            found = sorted(j.job_id for j in history.state.jobs() if j.state == wanted)
            if found:
                chosen = found[argument % len(found)]
                if action == "evict":
                    history.evict(chosen)
                else:
                    history.exit(chosen)
        elif isinstance(argument, int):
            history.advance(argument)
        check(history)
    history.run(every_s=0)
    check(history)
    replayed = history.replayed()
    live, again = history.state.sharing.ledger, replayed.sharing.ledger
    assert {h: s for h, (_, s) in live.holders.items()} == {
        h: s for h, (_, s) in again.holders.items()
    }
    assert live.held_mix == again.held_mix
    assert (
        schedule(replayed, history.now).decisions == schedule(history.state, history.now).decisions
    )
