"""The policy's knobs refuse what makes no sense, with a message an operator can act on."""

from __future__ import annotations

import pytest

from core import DEFAULT_PRIORITY_CLASSES, PriorityClass, SchedulingPolicy
from schemas.jobs import PreemptionRequested
from tests.core.builders import History, a_job


def test_an_unknown_policy_name_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^unknown policy 'lottery'$"):
        SchedulingPolicy(name="lottery")  # type: ignore[arg-type]


def test_a_policy_without_priority_classes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^at least one priority class is needed$"):
        SchedulingPolicy(priority_classes=())


def test_two_priority_classes_of_one_name_are_refused() -> None:
    twice = (*DEFAULT_PRIORITY_CLASSES, PriorityClass("research", 5, True, False))
    with pytest.raises(ValueError, match=r"^priority class names must be unique$"):
        SchedulingPolicy(priority_classes=twice)


@pytest.mark.parametrize(
    "thresholds", [(0.0, 3600.0), (-1.0,), (3600.0, 3600.0), (36_000.0, 3600.0), (1.0, 2.0, 2.0)]
)
def test_attained_service_levels_need_positive_increasing_thresholds(
    thresholds: tuple[float, ...],
) -> None:
    with pytest.raises(ValueError, match=r"^las_thresholds_gpu_s must be positive and increasing$"):
        SchedulingPolicy(las_thresholds_gpu_s=thresholds)


@pytest.mark.parametrize("thresholds", [(), (0.5,), (0.5, 1.0, 3600.0)])
def test_any_positive_increasing_thresholds_make_levels(thresholds: tuple[float, ...]) -> None:
    assert SchedulingPolicy(las_thresholds_gpu_s=thresholds).las_thresholds_gpu_s == thresholds


@pytest.mark.parametrize(
    "thresholds", [(0.0, 900.0), (-1.0, 900.0), (900.0, 900.0), (3600.0, 900.0), (1.0, 2.0, 2.0)]
)
def test_predicted_length_levels_need_positive_increasing_thresholds(
    thresholds: tuple[float, ...],
) -> None:
    with pytest.raises(
        ValueError, match=r"^predicted_length_thresholds_s must be positive and increasing$"
    ):
        SchedulingPolicy(predicted_length_thresholds_s=thresholds)


@pytest.mark.parametrize("thresholds", [(), (0.5,), (0.5, 1.0, 3600.0)])
def test_any_positive_increasing_thresholds_make_predicted_length_levels(
    thresholds: tuple[float, ...],
) -> None:
    policy = SchedulingPolicy(predicted_length_thresholds_s=thresholds)

    assert policy.predicted_length_thresholds_s == thresholds


def test_an_unknown_class_falls_back_to_the_default_class_else_the_lowest() -> None:
    assert SchedulingPolicy().priority_class("gold").name == "research"
    no_default = SchedulingPolicy(default_priority="gold")
    assert no_default.priority_class("silver").name == "best-effort"


def test_a_queue_never_configured_has_no_guarantee_so_its_gangs_are_borrowed() -> None:
    history = History("1x1:1:1")  # one GPU
    adhoc = history.submit(a_job().gpus(1).team("adhoc"))[0]  # no TeamCreated for adhoc
    history.run()
    urgent = history.submit(a_job().gpus(1).team("ops").priority("inference-critical"))[0]

    history.run()

    assert [(p.job_id, p.preemptor_job_id) for p in history.events(PreemptionRequested)] == [
        (adhoc, urgent)
    ]
