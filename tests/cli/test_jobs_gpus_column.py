"""`gangway jobs` says what a job holds (a slice or a share is not a whole GPU) and how
many jobs it lists."""

from gangway.commands.jobs import gpus, table


def test_whole_gpus_are_counted() -> None:
    assert gpus({"gpus": 16, "spec": {"tasks": 2, "gpus_per_task": 8}}) == "16"


def test_slices_are_named_by_their_profile() -> None:
    # Shown as 3 before: three 1g.10gb slices hold 3/7 of one H100, not three GPUs.
    job = {"gpus": 3, "spec": {"tasks": 3, "gpus_per_task": 0, "mig_profile": "1g.10gb"}}
    assert gpus(job) == "3x1g.10gb"


def test_shares_are_named_by_their_fraction_and_tier() -> None:
    job = {"gpus": 1, "spec": {"tasks": 1, "gpu_fraction": 0.5, "sharing": "timeslice"}}
    assert gpus(job) == "1x0.5 timeslice"
    assert gpus({"gpus": 2, "spec": {"tasks": 2, "gpu_fraction": 0.25}}) == "2x0.25 mps"


def test_the_tables_caption_counts_jobs_in_words() -> None:
    assert table([], wide=False).caption == "0 jobs"
    job = {
        "id": "a1",
        "name": "train",
        "team": "nlp",
        "priority": "research",
        "state": "pending",
        "gpus": 8,
        "spec": {"tasks": 1, "gpus_per_task": 8},
        "submitted_at": "2026-11-24T22:00:00+00:00",
        "reason": None,
    }
    assert table([job], wide=False).caption == "1 job"
    assert table([job, {**job, "id": "a2"}], wide=False).caption == "2 jobs"
