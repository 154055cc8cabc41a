"""Admission re-checks the team's policy when it decides: the policy may have changed since the
API accepted the job, and a rejection keeps its typed reason."""

from __future__ import annotations

from typing import Any

import pytest

from core.admission import (
    DEFAULT_TEAM_POLICY,
    MAX_PREEMPTIBLE_MIN_RUNTIME_S,
    AdmissionCatalog,
    TeamPolicy,
    admit,
    policy_violation,
)
from schemas.jobs import JobAdmitted, JobRejected, JobSpec
from schemas.teams import TeamCreated, TeamPolicyConfigured
from tests.admission.test_admission_rules import CLASSES, SHA, node


@pytest.fixture
def catalog() -> AdmissionCatalog:
    catalog = AdmissionCatalog(default_policy=DEFAULT_TEAM_POLICY)
    for event in (TeamCreated(name="nlp", guaranteed_gpus=8, token_sha256=SHA), node("n0")):
        catalog.apply(event)
    return catalog


def job(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "serve", "team": "nlp", **fields})


def test_inference_critical_needs_the_admins_grant(catalog: AdmissionCatalog) -> None:
    result = admit("j1", job(priority="inference-critical"), catalog, CLASSES)
    assert isinstance(result, JobRejected)
    assert result.code == "priority_not_allowed"
    catalog.apply(TeamPolicyConfigured(team="nlp", allowed_priority_classes=["inference-critical"]))
    granted = admit("j2", job(priority="inference-critical"), catalog, CLASSES)
    assert isinstance(granted, JobAdmitted)


def test_a_grant_withdrawn_after_the_api_accepted_rejects_at_admission(
    catalog: AdmissionCatalog,
) -> None:
    catalog.apply(TeamPolicyConfigured(team="nlp", non_preemptible_allowed=True))
    accepted = job(preemptible=False)
    catalog.apply(TeamPolicyConfigured(team="nlp", non_preemptible_allowed=False))
    result = admit("j1", accepted, catalog, CLASSES)
    assert isinstance(result, JobRejected)
    assert (result.code, result.reason) == (
        "non_preemptible_not_allowed",
        "team 'nlp' may not submit non-preemptible jobs",
    )


def test_without_a_default_policy_no_team_policy_is_checked() -> None:
    # The simulator's catalogue: trace jobs of any class are judged on their shape only.
    catalog = AdmissionCatalog()
    for event in (TeamCreated(name="nlp", guaranteed_gpus=8, token_sha256=SHA), node("n0")):
        catalog.apply(event)
    result = admit("j1", job(priority="inference-critical"), catalog, CLASSES)
    assert isinstance(result, JobAdmitted)


@pytest.mark.parametrize("max_runtime_s", [None, 3e8])
def test_a_minimum_runtime_past_the_bound_is_a_non_preemptible_job(
    max_runtime_s: float | None,
) -> None:
    """min_runtime_s shields a running gang from preemption. Ten years of it (with or without a
    max_runtime_s as long) made a borrowing team's gangs unpreemptible: a lender's guarantee
    then waited for ever (found by the hostile-tenant run), without the admin's grant."""
    shielded = job(min_runtime_s=3e8, max_runtime_s=max_runtime_s)
    violation = policy_violation(shielded, DEFAULT_TEAM_POLICY)
    assert violation is not None
    assert violation[0] == "non_preemptible_not_allowed"
    assert "min_runtime_s" in violation[1]
    granted = TeamPolicyConfigured(team="nlp", non_preemptible_allowed=True)
    assert policy_violation(shielded, TeamPolicy.of(granted)) is None


def test_a_minimum_runtime_within_the_bound_needs_no_grant() -> None:
    assert (
        policy_violation(job(min_runtime_s=MAX_PREEMPTIBLE_MIN_RUNTIME_S), DEFAULT_TEAM_POLICY)
        is None
    )


def test_admission_rejects_a_shield_granted_no_longer(catalog: AdmissionCatalog) -> None:
    result = admit("j1", job(min_runtime_s=MAX_PREEMPTIBLE_MIN_RUNTIME_S + 1), catalog, CLASSES)
    assert isinstance(result, JobRejected)
    assert result.code == "non_preemptible_not_allowed"
