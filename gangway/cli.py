"""The `gangway` command line: one table from subcommand to the module that implements it.

Each subcommand lives in its own module under `gangway/commands/` (see its package docstring
for the interface); add a row to COMMANDS to register one. Only the chosen command's module is
imported, so one command's dependencies never slow down or break another.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

# subcommand → (module, one-line help). Keep the help here too, so `gangway --help` can list
# every command without importing them all.
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("gangway.commands.simulate", "replay a job trace through the scheduling core"),
    "submit": ("gangway.commands.submit", "submit a job spec (YAML or JSON file)"),
    "jobs": ("gangway.commands.jobs", "list jobs: active ones newest first (--all: finished too)"),
    "job": ("gangway.commands.job", "show one job"),
    "why": ("gangway.commands.why", "explain a job's state: the reason and the estimated start"),
    "cancel": ("gangway.commands.cancel", "ask to cancel a job"),
    "suspend": ("gangway.commands.suspend", "ask to suspend a job"),
    "resume": ("gangway.commands.resume", "ask to resume a job"),
    "hold": ("gangway.commands.hold", "hold a waiting job (or array): never placed until released"),
    "release": ("gangway.commands.release", "release a held job (or array)"),
    "logs": ("gangway.commands.logs", "print a rank's output (-f follows it)"),
    "usage": ("gangway.commands.usage", "GPU-hours allocated and used per team (showback)"),
    "top": ("gangway.commands.top", "a live view of the cluster, the queue and the top teams"),
    "events": ("gangway.commands.events", "print the event log (--follow keeps printing)"),
    "nodes": ("gangway.commands.nodes", "list nodes: state, GPUs free and allocated"),
    "queues": ("gangway.commands.queues", "list queues: guarantee, ceiling, usage, borrowing"),
    "teams": ("gangway.commands.teams", "list teams (a team's token: its own): quota and usage"),
    "drain": ("gangway.commands.drain", "drain a node: no new work; its gangs are moved"),
    "undrain": ("gangway.commands.undrain", "return a drained node to service"),
    "replay": ("gangway.commands.replay", "replay the event log through the scheduling core"),
    "audit": ("gangway.commands.audit", "check the invariants over the whole event log"),
}


class Command(Protocol):
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(name: str) -> Command:
    module_name, _ = COMMANDS[name]
    return cast(Command, importlib.import_module(module_name))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gangway", description="Gangway: a gang scheduler for shared GPU clusters."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        if name == command:
            _load(name).add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    chosen = next((arg for arg in arguments if not arg.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args = parser.parse_args(arguments)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return _load(args.command).run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
