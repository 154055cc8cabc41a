"""`make mutation`: mutmut over the scheduling core, against the core tests, within a time bound.

mutmut 3 (configured in pyproject's [tool.mutmut]) copies the code into mutants/, records which
core tests reach which function, and runs for each mutant only those tests (stopping at the
first failure); this wrapper narrows them to the mutated module's own tests (MODULE_TESTS,
COMMON_TESTS). It picks the modules, bounds the run's wall time, reports the CPU time, and
prints per module what was killed and what survived (mutants/survivors.txt; the test that
killed each mutant goes to mutants/kills.txt); its LAST line is

    mutation score: K killed of M (P%)

where M counts every mutant of the chosen modules that got a verdict (a mutant no test reaches
counts as survived; a timeout counts as killed, as mutmut's own summary does). Mutants left
unchecked when the time bound stops the run are reported on their own line, not in M.

Usage: python scripts/mutation.py [--modules ordering,quota,...] [--budget-s S]
       [--max-children N] [--fail-under P] [--resume]

--resume keeps mutants/ and checks only the mutants a run stopped by its time bound left
unchecked (mutmut lets every verdict it has stand), then reports on all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The policy modules of the core: who goes first, quotas, reservations, victims, shapes. They fit
# the 30-minute bound on this 2-core machine; placement.py, cycle.py and state.py (about 2,500
# mutants more) are run by name (--modules placement) when they change. audit.py is checked by
# its own tests; admission.py and topology.py are input validation and spec parsing.
DEFAULT_MODULES = ("ordering", "quota", "reservation", "preemption", "shape", "policy")
# The core tests run against each module's mutants: its rule tests and the scenario tests of
# the rules it serves, and for every module the whole-policy scenarios, the property tests and
# the lifecycle model (which reach every rule). mutmut runs, of these, the tests that reach the
# mutated function (a traced run maps them). The other core tests (cluster spec parsing, MIG
# geometries, sharing, pipelines, the auditor's own log tests, import purity) reach these
# modules only incidentally, by building a policy or running a cycle: a mutant that survives
# ran every selected test, so they would make each survivor cost about twice as much.
COMMON_TESTS = (
    "test_policy_rules",
    "test_properties",
    "test_lifecycle_model",
    "test_lifecycle",
    "test_explanations",
    "test_replay",
)
MODULE_TESTS: dict[str, tuple[str, ...]] = {
    "ordering": (
        "test_ordering_rules",
        "test_order_memo",
        "test_borrower_order",
        "test_learned_length_order",
        "test_ordering",
        "test_fifo",
        "test_fairness",
        "test_fairness_properties",
        "test_retry",
        "test_backfill",
        "test_backfill_head",
        "test_quota",
        "test_estimates",
        "test_host_quota",
        "test_preemption",
        "test_victim_rules",
        "test_slo",
        "test_host_resources",
        "test_live_sharing",
        "test_audit_rules",
        "test_kept_order",
        "test_state_index",
        "test_cycle_depth",
    ),
    "state_index": ("test_state_index", "test_order_memo", "test_timers"),
    "quota": (
        "test_quota_book",
        "test_host_ceiling_accounting",
        "test_quota",
        "test_victim_rules",
        "test_preemption",
        "test_ordering_rules",
        "test_audit_reclaim",
        "test_host_resources",
        "test_fairness",
        "test_host_quota",
        "test_share_preemption",
        "test_slo_fractions",
    ),
    "reservation": (
        "test_reservation_rules",
        "test_reservation_plans",
        "test_backfill",
        "test_backfill_head",
        "test_estimates",
        "test_runtime_estimate",
        "test_timers",
        "test_preemption",
        "test_host_resources",
        "test_host_quota",
        "test_state_indexes",
        "test_ordering",
        "test_quota",
        "test_victim_rules",
        "test_audit_rules",
        "test_checkpointing",
        "test_fairness",
        "test_slo",
        "test_gang_ends",
        "test_release_gang_gather",
        "test_reserved_reclaim",
    ),
    "preemption": (
        "test_victim_rules",
        "test_preemption",
        "test_quota",
        "test_fairness",
        "test_fairness_properties",
        "test_slo",
        "test_slo_properties",
        "test_backfill",
        "test_audit_reclaim",
        "test_host_resources",
        "test_estimates",
        "test_share_preemption",
        "test_share_preemption_properties",
        "test_host_quota",
        "test_slo_fractions",
        "test_audit_rules",
        "test_ordering",
        "test_live_sharing",
        "test_preemption_phase_order",
        "test_victim_search",
        "test_leaving_credit",
        "test_preemption_attempts",
        "test_victim_book",
        "test_preemption_bound",
        "test_reclaim_landing",
        "test_nvlink_placement",
        "test_reserved_reclaim",
    ),
    "shape": (
        "test_shape_rules",
        "test_gang",
        "test_topology_placement",
        "test_host_resources",
        "test_host_properties",
        "test_backfill",
        "test_victim_rules",
        "test_nvlink_placement",
    ),
    "policy": (
        "test_policy_config",
        "test_ordering_rules",
        "test_fifo",
        "test_fairness",
        "test_victim_rules",
        "test_preemption",
        "test_reservation_rules",
        "test_retry",
        "test_slo",
        "test_live_fgd",
        "test_slo_fractions",
        "test_host_quota",
        "test_checkpointing",
        "test_estimates",
        "test_backfill",
        "test_quota",
        "test_live_sharing",
        "test_regeometry",
        "test_share_preemption",
        "test_audit_rules",
        "test_cycle_depth",
    ),
}
# Plugins the core tests never use; loaded, their hooks run in every mutant's pytest session.
_NO_PLUGINS = ("-p", "no:schemathesis", "-p", "no:anyio")
KILLED = {1, 3, 24, -24, 36, 152, 255}
SURVIVED = {0, 5, 33}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default=",".join(DEFAULT_MODULES))
    parser.add_argument("--budget-s", type=float, default=28 * 60.0)
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--fail-under", type=float, default=90.0)
    parser.add_argument("--resume", action="store_true")
    return parser.parse_args()


# mutmut run, with its `only_mutate` setting narrowed to the chosen modules: mutmut otherwise
# wraps every function of core/ in its trampoline (a lookup of the mutant under test on every
# call), which made the tests of each mutant about twice as slow, and generates thousands of
# mutants that this run never checks. The setting has no command-line option, hence the
# bootstrap; it runs mutmut through this interpreter (a copied venv's console script may
# carry another interpreter's path).
_BOOTSTRAP = """
import json
import sys

import mutmut.__main__ as mutmut_main
from mutmut.configuration import config
from mutmut.state import state

only, tests, plugins, module_tests, *args = sys.argv[1:]
config().only_mutate = only.split(",")
config().pytest_add_cli_args_test_selection = tests.split(",")
config().pytest_add_cli_args += plugins.split(",")
allowed = json.loads(module_tests)
collect = mutmut_main.collect_source_file_mutation_data


def narrowed(*positional, **named):
    # After the traced run mapped tests to functions: each module's mutants keep its tests.
    for name, reaching in state().tests_by_mangled_function_name.items():
        parts = name.split(".")
        keep = allowed.get(parts[1]) if len(parts) > 2 and parts[0] == "core" else None
        if keep is not None:
            reaching.intersection_update(
                {test for test in reaching if test.split("::")[0].rsplit("/", 1)[-1][:-3] in keep}
            )
    return collect(*positional, **named)


mutmut_main.collect_source_file_mutation_data = narrowed
mutmut_main.cli(["run", *args])
"""


def _module_tests(modules: list[str]) -> dict[str, list[str]]:
    """The test modules (file stems) each mutated module is checked against."""
    return {m: [*COMMON_TESTS, *MODULE_TESTS.get(m, ())] for m in modules}


def _test_files(modules: list[str]) -> list[str]:
    """What mutmut's traced run runs: the tests of any of the modules (all core tests for a
    module without its own list)."""
    core = ROOT / "tests" / "core"
    if any(m not in MODULE_TESTS for m in modules):
        return [f"tests/core/{path.name}" for path in sorted(core.glob("test_*.py"))]
    stems = sorted({stem for tests in _module_tests(modules).values() for stem in tests})
    return [f"tests/core/{stem}.py" for stem in stems]


# Address space of mutmut and of each mutant's test run: a mutant that turns a loop endless
# while it appends (core/ordering.py's `at += 1` made `at = 1`) grew to 13 GiB of the machine's
# 24 before its timeout, beside PostgreSQL and Kafka. Capped, it fails with MemoryError: killed.
# Unmutated, the core tests' processes take about 0.4 GiB.
MUTANT_ADDRESS_SPACE = 4 * 1024**3


def _capped_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MUTANT_ADDRESS_SPACE, MUTANT_ADDRESS_SPACE))


def _run_mutmut(modules: list[str], budget_s: float, children: int, resume: bool) -> None:
    env = {
        **os.environ,
        "GANGWAY_HYPOTHESIS_PROFILE": "mutation",
        "GANGWAY_MUTATION_KILLS": str(ROOT / "mutants" / "kills.txt"),
    }
    # Named mutants are always run again; without names mutmut runs only those it has no
    # verdict for.
    names = [] if resume else [f"core.{module}.*" for module in modules]
    files = ",".join(f"core/{module}.py" for module in modules)
    allowed = {m: tests for m, tests in _module_tests(modules).items() if m in MODULE_TESTS}
    command = [
        sys.executable,
        "-c",
        _BOOTSTRAP,
        files,
        ",".join(_test_files(modules)),
        ",".join(_NO_PLUGINS),
        json.dumps(allowed),
        "--max-children",
        str(children),
        *names,
    ]
    # mutmut draws a progress spinner: keep it off the log, which only wants the verdicts.
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_capped_memory,
    ) as process:
        try:
            process.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            print(f"time bound of {budget_s:.0f} s reached: stopping mutmut", flush=True)
            os.killpg(process.pid, signal.SIGINT)  # mutmut saves its verdicts on interrupt
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _verdicts(module: str) -> dict[str, int | None]:
    meta = ROOT / "mutants" / "core" / f"{module}.py.meta"
    if not meta.exists():
        return {}
    data = json.loads(meta.read_text())
    codes: dict[str, int | None] = data.get("exit_code_by_key", {})
    return codes


def main() -> int:
    args = _arguments()
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    # A fresh run each time: mutmut's cached map of tests to functions and its old verdicts
    # would otherwise outlive changes to the tests.
    if not args.resume:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    started = time.monotonic()
    _run_mutmut(modules, args.budget_s, args.max_children, args.resume)
    # CPU time apart from wall time: on a shared machine the wall time says more about the load.
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"mutmut ran {time.monotonic() - started:.0f} s with {args.max_children} children, "
        f"{used.ru_utime + used.ru_stime:.0f} s of CPU"
    )
    killed = total = unchecked = 0
    survivors: list[str] = []
    for module in modules:
        verdicts = _verdicts(module)
        k = sum(1 for code in verdicts.values() if code in KILLED)
        lost = sorted(name for name, code in verdicts.items() if code in SURVIVED)
        other = len(verdicts) - k - len(lost)
        killed, total, unchecked = killed + k, total + k + len(lost), unchecked + other
        survivors += lost
        share = f"{100 * k / (k + len(lost)):.1f}%" if k + len(lost) else "-"
        print(f"core/{module}.py: {k} killed of {k + len(lost)} ({share}), {other} unchecked")
    report = ROOT / "mutants" / "survivors.txt"
    report.parent.mkdir(exist_ok=True)
    report.write_text("".join(f"{name}\n" for name in survivors))
    print(f"survivors listed in {report.relative_to(ROOT)} (mutmut show NAME shows each)")
    if unchecked:
        print(f"{unchecked} mutants unchecked (time bound or mutmut error): not in the score")
    score = 100 * killed / total if total else 0.0
    print(f"mutation score: {killed} killed of {total} ({score:.1f}%)")
    return 0 if total and score >= args.fail_under else 1


if __name__ == "__main__":
    sys.exit(main())
