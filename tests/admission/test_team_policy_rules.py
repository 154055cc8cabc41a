"""Admission re-checks the team's policy when it decides: the policy may have changed since the
API accepted the job, and a rejection keeps its typed reason."""

from __future__ import annotations

from typing import Any

import pytest

from core.admission import DEFAULT_TEAM_POLICY, AdmissionCatalog, admit
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
