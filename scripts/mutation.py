"""`make mutation`: mutmut over the scheduling core, against the core tests, within a time bound.

mutmut 3 (configured in pyproject's [tool.mutmut]) copies the code into mutants/, records which
core tests reach which function, and runs for each mutant only those tests (stopping at the
first failure). This wrapper picks the modules, bounds the run's wall time, and prints per module
what was killed and what survived; its LAST line is

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
import sys
from mutmut.configuration import config
config().only_mutate = sys.argv[1].split(",")
from mutmut.__main__ import cli
cli(["run", *sys.argv[2:]])
"""


def _run_mutmut(modules: list[str], budget_s: float, children: int, resume: bool) -> None:
    env = {**os.environ, "GANGWAY_HYPOTHESIS_PROFILE": "mutation"}
    # Named mutants are always run again; without names mutmut runs only those it has no
    # verdict for.
    names = [] if resume else [f"core.{module}.*" for module in modules]
    files = ",".join(f"core/{module}.py" for module in modules)
    command = [sys.executable, "-c", _BOOTSTRAP, files, "--max-children", str(children), *names]
    # mutmut draws a progress spinner: keep it off the log, which only wants the verdicts.
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, start_new_session=True
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
    print(f"mutmut ran {time.monotonic() - started:.0f} s with {args.max_children} children")
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
