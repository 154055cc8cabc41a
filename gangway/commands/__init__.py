"""One module per `gangway` subcommand, each registered in `gangway.cli.COMMANDS`.

A command module provides:
- `HELP`: a one-line summary;
- `add_arguments(parser: argparse.ArgumentParser) -> None`;
- `run(args: argparse.Namespace) -> int`: the exit status (2 for bad input, with a one-line
  message on stderr, never a traceback).
"""
