"""`tokenfront check`: its command line, and running the comparison."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING, Any

from tokenfront.arguments import check_api_key, positive_float
from tokenfront.core.errors import TokenfrontError

if TYPE_CHECKING:
    pass

log = logging.getLogger("tokenfront")

# The command's texts, here rather than in the package: building the CLI's parser (every command's start-up)
# then imports no HTTP client.
HELP = "before adding a worker: compare its rendering with the renderer's (fingerprints and a probe corpus)"

DESCRIPTION = """\
Compare every --worker with the --renderer: fetch each server's GET /server_info, compare the rendering
fingerprints component by component (chat template, tokenizer vocabulary, added tokens, model type, ...), and
render a built-in corpus of 7 requests (system prompt, multi-turn, tools, tool-call history, unicode, a text
completion, a continued assistant message; the router's verify=probe corpus) with POST /tokenize on every
server that has it, comparing the ids case by case. Prints a table, then one line per worker naming what
differs and the first differing case.

A worker agrees when nothing differs and something was shown:
  - both publish a complete fingerprint and they are equal (the corpus's ids, where compared, equal too);
    a plain `tokenfront serve` has no /tokenize (TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1 mounts it): it is
    compared by its fingerprint only, and the report says the ids were not compared;
  - it publishes no fingerprint (vLLM) but has POST /tokenize: agreement on the corpus only, said as such
    (a router forwards ids to such a worker only with verify=probe).
It differs when a fingerprint component differs, a fingerprint is incomplete (a server started with
--trust-remote-code), a case's ids differ, or it refuses a case the renderer rendered. A worker with neither a
fingerprint nor /tokenize is not shown to agree. A case the renderer refuses is skipped and not asked of the
workers."""

EPILOG = """\
A client of the servers' HTTP APIs: it loads no model and never imports torch.

exit codes:
  0  every worker agrees with the renderer
  1  some worker differs, or is not shown to agree (whatever the others are)
  2  no worker differs, but some server could not be checked (unreachable, timed out, a key refused, not a
     tokenfront or vLLM server), or a mistake on the command line"""


def add_check_command(commands: Any) -> None:
    """`tokenfront check`'s parser."""
    parser = commands.add_parser(
        "check",
        help=HELP,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--renderer",
        required=True,
        type=_server_url,
        metavar="URL",
        help="the reference: the base URL of the renderer (or any server) whose ids the workers must match",
    )
    parser.add_argument(
        "--worker",
        action="append",
        required=True,
        type=_server_url,
        metavar="URL",
        help="a worker's base URL, compared with the renderer (repeat for each)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("TOKENFRONT_API_KEY"),
        metavar="KEY",
        help="sent as `Authorization: Bearer KEY` to the renderer, and to the workers unless --worker-api-key "
        "is given (default: $TOKENFRONT_API_KEY)",
    )
    parser.add_argument(
        "--worker-api-key",
        default=os.environ.get("TOKENFRONT_WORKER_API_KEY"),
        metavar="KEY",
        help="sent to the workers instead of --api-key (default: $TOKENFRONT_WORKER_API_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="seconds each request may take; a server that takes longer could not be checked (default: 10)",
    )
    parser.add_argument(
        "--ca-certs",
        metavar="PATH",
        help="verify https:// servers against the CA certificates of this PEM bundle alone (default: the "
        "system's trust, certifi's bundle or $SSL_CERT_FILE)",
    )
    parser.add_argument(
        "--certfile",
        metavar="PATH",
        help="client certificate (PEM) shown to servers that ask for one (mutual TLS); with --keyfile unless "
        "the file holds the key too",
    )
    parser.add_argument("--keyfile", metavar="PATH", help="the client certificate's private key (PEM)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON document instead of the table (exit_code, result, corpus, renderer, "
        "workers: each with its verdict, summary, fingerprint_differences, components, cases)",
    )
    parser.set_defaults(handler=run_check)


def _server_url(text: str) -> str:
    """An argparse type: a server's base URL, validated as the router validates a worker's."""
    from tokenfront.server_address import normalize_url

    try:
        return normalize_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("worker ")) from exc


def run_check(args: argparse.Namespace) -> int:
    """Run `tokenfront check`: fetch, compare, report; its exit status says whether the worker is safe to add."""
    from tokenfront import check
    from tokenfront.server_address import worker_identity
    from tokenfront.tls import ClientTls

    check_api_key(args.api_key, "--api-key", "TOKENFRONT_API_KEY")
    check_api_key(args.worker_api_key, "--worker-api-key", "TOKENFRONT_WORKER_API_KEY")
    seen = {worker_identity(args.renderer): "--renderer"}
    for url in args.worker:
        identity = worker_identity(url)
        if identity in seen:
            raise TokenfrontError(f"--worker {url} is also given as {seen[identity]}: name each server once")
        seen[identity] = "--worker"
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would bury the report
    settings = check.CheckSettings(
        renderer=args.renderer,
        workers=tuple(args.worker),
        api_key=args.api_key,
        worker_api_key=args.worker_api_key,
        timeout=args.timeout,
        json=args.json,
        tls=ClientTls.from_flags(args.ca_certs, args.certfile, args.keyfile, prefix="--"),
    )
    return check.run_check(settings)
