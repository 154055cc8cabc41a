"""Reading a job trace (CSV) into job specs the scheduling core accepts.

Columns (DESIGN §5 "Simulator"): `submit_time` (ISO time or seconds), `num_gpus`, `duration_s`;
optional `job_id`, `tenant` (or `vc`), `priority`, `gpus_per_task`, `tp_size`,
`estimated_runtime_s`, `preemptible`, and for GPU sharing (DESIGN §8) `gpu_fraction` (a share
of one GPU per task, 0 < x < 1; 1 or empty: whole GPUs), `mig_profile` (one slice per task),
`cpus` and `memory_mb` (per task), `gpu_type` (alternatives joined by `|`: `V100M16|V100M32`)
and `qos` (a class mapped to a priority class, `QOS_PRIORITY`; `priority` wins). With a
fraction or a profile, `num_gpus` is the number of tasks; `num_gpus` 0 with `cpus` is a
CPU-only task. Other columns are ignored.

Every problem is a `TraceError` whose message is one line naming the file and line, so that the
CLI can print it and exit 2 instead of showing a traceback.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from pydantic import ValidationError

from schemas.jobs import NAME_PATTERN, CheckpointSpec, JobSpec, TopologySpec
from services.runtime.collector import gc_paused

REQUIRED_COLUMNS = ("submit_time", "num_gpus", "duration_s")
DEFAULT_TENANT = "default"
DEFAULT_PRIORITY = "research"
_NAME = re.compile(NAME_PATTERN)
_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f"}
# Quality-of-service classes of GPU-sharing traces (Alibaba's: LS latency-sensitive, BE best
# effort, Burstable, Guaranteed) and the priority classes they run at.
QOS_PRIORITY = {
    "lse": "inference-critical",
    "ls": "inference-critical",
    "guaranteed": "production",
    "burstable": "research",
    "be": "best-effort",
    "best-effort": "best-effort",
}

# A row's cell by column name ("" when the column is absent).
Cell = Callable[[str], str]


class TraceError(ValueError):
    """The trace (or a time bound) cannot be read; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One trace row, resolved into the spec submitted to the core.

    `submit_s` is seconds on the simulation clock: Unix seconds for ISO times, or the trace's own
    seconds when the trace gives plain numbers. `duration_s` is the work the job must do.
    """

    job_id: str
    submit_s: float
    duration_s: float
    num_gpus: int
    tenant: str
    priority: str
    spec: JobSpec
    # The GPU types the job may run on (the trace's `gpu_type`, alternatives split; the
    # spec names the first); empty: any.
    gpu_types: tuple[str, ...] = ()


def parse_time(text: str, *, end_of_day: bool = False) -> float:
    """Seconds for an ISO time (naive means UTC) or a plain number of seconds.

    With `end_of_day`, a bare date (`2017-11-30`) means the end of that day, so that
    `--end 2017-11-30` includes the jobs submitted on the 30th, as a user would expect.
    """
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise TraceError(f"{text!r} is neither an ISO time nor a number of seconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if end_of_day and _is_bare_date(value):
        moment += timedelta(days=1)
    return moment.timestamp()


def _is_bare_date(value: str) -> bool:
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


def gang_shape(num_gpus: int, node_gpus: int) -> tuple[int, int]:
    """(tasks, gpus_per_task) for a job of `num_gpus` on nodes of `node_gpus` GPUs.

    A job that fits one node is one task. A larger one is split into tasks of
    gcd(num_gpus, node_gpus) GPUs: the GPU count stays exact (12 → 3 x 4, 24 → 3 x 8) and the
    tasks tile a node evenly, so no task ever straddles or strands part of a node.
    """
    if num_gpus <= node_gpus:
        return 1, num_gpus
    per_task = math.gcd(num_gpus, node_gpus)
    return num_gpus // per_task, per_task


def read_trace(
    path: str | Path,
    *,
    node_gpus: int = 8,
    start_s: float | None = None,
    end_s: float | None = None,
    checkpoint_interval_s: float | None = None,
) -> list[TraceJob]:
    """The trace's jobs submitted in [start_s, end_s), sorted by submit time (stable)."""
    # Parsing makes no cyclic garbage, while the collector would scan every job parsed so far
    # again and again (tens of thousands of specs): it is paused while the trace is read.
    with gc_paused():
        return sorted(
            _read(Path(path), node_gpus, start_s, end_s, checkpoint_interval_s),
            key=lambda job: job.submit_s,
        )


def _read(
    path: Path,
    node_gpus: int,
    start_s: float | None,
    end_s: float | None,
    checkpoint_interval_s: float | None,
) -> Iterator[TraceJob]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as error:
        raise TraceError(f"cannot read trace {path}: {error.strerror or error}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = [name.strip().lower() for name in next(reader)]
        except StopIteration:
            raise TraceError(f"{path}: the trace is empty (no header row)") from None
        except (csv.Error, UnicodeDecodeError) as error:
            raise TraceError(f"{path}: not a CSV file: {error}") from None
        missing = [name for name in REQUIRED_COLUMNS if name not in header]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        column = {name: index for index, name in reversed(list(enumerate(header)))}
        tenant_column = "tenant" if "tenant" in column else ("vc" if "vc" in column else None)
        seen: set[str] = set()
        try:
            for row_index, row in enumerate(reader):
                if not "".join(row).strip():  # a blank row (the join is fast per row)
                    continue
                where = f"{path} line {reader.line_num}"
                if len(row) < len(header):
                    raise TraceError(f"{where}: expected {len(header)} fields, got {len(row)}")

                def cell(name: str, row: list[str] = row) -> str:
                    index = column.get(name)
                    return "" if index is None else row[index].strip()

                try:
                    submit_s = parse_time(cell("submit_time"))
                except TraceError as error:
                    raise TraceError(f"{where}: submit_time {error}") from None
                if start_s is not None and submit_s < start_s:
                    continue
                if end_s is not None and submit_s >= end_s:
                    continue
                job = _job(
                    where,
                    cell,
                    default_id=str(row_index),
                    submit_s=submit_s,
                    tenant=cell(tenant_column) if tenant_column else "",
                    node_gpus=node_gpus,
                    checkpoint_interval_s=checkpoint_interval_s,
                )
                if job.job_id in seen:
                    raise TraceError(f"{where}: job_id {job.job_id!r} appears twice")
                seen.add(job.job_id)
                yield job
        except (csv.Error, UnicodeDecodeError) as error:
            raise TraceError(f"{path} line {reader.line_num}: not valid CSV: {error}") from None


def _job(
    where: str,
    cell: Cell,
    *,
    default_id: str,
    submit_s: float,
    tenant: str,
    node_gpus: int,
    checkpoint_interval_s: float | None,
) -> TraceJob:
    cpus_text, memory_text = cell("cpus"), cell("memory_mb")
    cpus = _number(where, "cpus", cpus_text, minimum=0.0) if cpus_text else None
    memory = _whole(where, "memory_mb", memory_text, minimum=1) if memory_text else None
    num_gpus = _whole(where, "num_gpus", cell("num_gpus"), minimum=0 if cpus else 1)
    duration_s = _number(where, "duration_s", cell("duration_s"), minimum=0.0)
    job_id = cell("job_id") or default_id
    tenant = tenant or DEFAULT_TENANT
    qos = cell("qos").lower()
    if qos and qos not in QOS_PRIORITY:
        raise TraceError(f"{where}: qos {cell('qos')!r} is not one of {', '.join(QOS_PRIORITY)}")
    priority = cell("priority") or (QOS_PRIORITY[qos] if qos else DEFAULT_PRIORITY)
    fraction_text, profile = cell("gpu_fraction"), cell("mig_profile") or None
    fraction = _number(where, "gpu_fraction", fraction_text, minimum=0.0) if fraction_text else None
    if fraction is not None and (fraction >= 1 or fraction == 0):
        fraction = None  # a whole GPU (or none asked): the whole-GPU columns say how many
    gpu_types = tuple(t.strip() for t in cell("gpu_type").split("|") if t.strip())
    for label, name in (("job_id", job_id), ("tenant", tenant), ("priority", priority)):
        if not _NAME.match(name):
            raise TraceError(f"{where}: {label} {name!r} is not a valid name")

    per_task_text = cell("gpus_per_task")
    if fraction is not None or profile is not None or num_gpus == 0:
        tasks, per_task = max(num_gpus, 1), 0
    elif per_task_text:
        per_task = _whole(where, "gpus_per_task", per_task_text, minimum=1)
        if num_gpus % per_task:
            raise TraceError(
                f"{where}: num_gpus {num_gpus} is not a multiple of gpus_per_task {per_task}"
            )
        tasks = num_gpus // per_task
    else:
        tasks, per_task = gang_shape(num_gpus, node_gpus)
    tp_text = cell("tp_size")
    tp_size = _whole(where, "tp_size", tp_text, minimum=1) if tp_text else None
    estimate_text = cell("estimated_runtime_s")
    # Without an estimate the trace's duration is the estimate (a perfect user); a zero-length
    # job still needs a positive estimate for the spec, so it gets one second.
    estimate = (
        _number(where, "estimated_runtime_s", estimate_text, minimum=0.0)
        if estimate_text
        else duration_s
    )
    preemptible = _flag(where, cell("preemptible"))
    try:
        spec = JobSpec(
            name=f"trace-{job_id}",
            team=tenant,
            queue=tenant,
            priority=priority,
            tasks=tasks,
            gpus_per_task=per_task,
            mig_profile=profile,
            gpu_fraction=None if fraction is None else round(fraction, 3),
            cpus_per_task=cpus,
            memory_mb_per_task=memory,
            gpu_type=gpu_types[0] if gpu_types else None,
            topology=TopologySpec(tp_size=tp_size),
            estimated_runtime_s=max(estimate, 1.0),
            preemptible=preemptible,
            checkpoint=CheckpointSpec(interval_s=checkpoint_interval_s),
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise TraceError(f"{where}: invalid job: {first['msg']}") from None
    return TraceJob(
        job_id=job_id,
        submit_s=submit_s,
        duration_s=duration_s,
        num_gpus=num_gpus,
        tenant=tenant,
        priority=priority,
        spec=spec,
        gpu_types=gpu_types,
    )


def _number(where: str, name: str, text: str, *, minimum: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {name} {text!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise TraceError(f"{where}: {name} {text!r} must be a finite number >= {minimum:g}")
    return value


def _whole(where: str, name: str, text: str, *, minimum: int) -> int:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {name} {text!r} is not a whole number") from None
    if not value.is_integer() or value < minimum:
        raise TraceError(f"{where}: {name} {text!r} must be a whole number >= {minimum}")
    return int(value)


def _flag(where: str, text: str) -> bool | None:
    lowered = text.lower()
    if not lowered:
        return None
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise TraceError(f"{where}: preemptible {text!r} is not true/false")
