"""A worker as configured: `--worker URL[,kv-events=...][,protocol=...][,verify=probe][,model=NAME]`, the admin
API's `POST /workers`, a worker file's lines and a DNS source's options all read into one `WorkerSpec`.

The spec says where the worker is (its URL, normalized by `server_address`), where a vLLM worker publishes its
KV events on ZMQ, how the router sends it ids (`protocol`), whether a render probe verifies it (`verify`) and
the router's model it is pinned to (`model`). `WorkerPool.add` turns a spec into a `Worker`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenfront.server_address import check_kv_endpoint, normalize_url, quoted

__all__ = ["PROTOCOLS", "VERIFY_MODES", "WorkerSpec", "option_problem"]

# How the router sends a worker its rendered ids: OpenAI bodies with `prompt_token_ids`, or vLLM's
# `POST /inference/v1/generate`.
PROTOCOLS = ("openai", "generate")
# How a worker that publishes no fingerprint may still be found to render like the router.
VERIFY_MODES = ("probe",)
_SPEC_SYNTAX = (
    "URL[,kv-events=tcp://HOST:PORT[,kv-replay=tcp://HOST:PORT]][,protocol=openai|generate][,verify=probe]"
    "[,model=NAME]"
)


@dataclass(frozen=True)
class WorkerSpec:
    """A worker as configured: its base URL, optionally a vLLM worker's ZMQ KV-event endpoints, the protocol
    its ids go by, whether it is verified by a render probe (`router.probe`), and the model it is pinned to
    (`model`, one of the router's served names; None: the names it reports place it, `router.model_placement`)."""

    url: str
    kv_events: str | None = None
    kv_replay: str | None = None
    protocol: str = "openai"
    verify: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.verify == "probe" and self.protocol != "generate":
            # Only tokenfront's OpenAI routes take prompt_token_ids, and tokenfront publishes a fingerprint:
            # a probed worker on its OpenAI route would render the request itself, whatever the probe said.
            raise ValueError(
                "verify=probe needs protocol=generate: a worker's OpenAI routes render the request themselves "
                "(vLLM's ignores prompt_token_ids), so only its /inference/v1/generate takes the router's ids"
            )

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        """Read `URL[,kv-events=E[,kv-replay=E]][,protocol=openai|generate][,verify=probe][,model=NAME]`
        (`--worker`).

        ValueError says what is wrong, in one line.
        """
        url, *options = text.split(",")
        found: dict[str, str] = {}
        for option in options:
            key, _, value = option.partition("=")
            key, value = key.strip().replace("_", "-"), value.strip()
            problem = option_problem(key, value)
            if problem is None and key in found:
                problem = f"{key} given twice"
            if problem is not None:
                raise ValueError(f"{quoted(text)}: {problem}; expected {_SPEC_SYNTAX}")
            found[key] = value
        if "kv-replay" in found and "kv-events" not in found:
            raise ValueError(f"{quoted(text)}: kv-replay needs kv-events too")
        base = normalize_url(url)
        try:
            return cls(
                base,
                found.get("kv-events"),
                found.get("kv-replay"),
                protocol=found.get("protocol", "openai"),
                verify=found.get("verify"),
                model=found.get("model"),
            )
        except ValueError as exc:
            raise ValueError(f"{quoted(text)}: {exc}") from None


def option_problem(key: str, value: str) -> str | None:
    """What is wrong with one `KEY=VALUE` of a worker spec (None: nothing); a DNS source's options follow the
    same rules (`router.worker_dns`)."""
    if key in ("kv-events", "kv-replay"):
        if not value:
            return f"{key} needs a value (a vLLM worker's ZMQ endpoint)"
        try:
            check_kv_endpoint(value, key)
        except ValueError as exc:
            return str(exc)
        return None
    if key == "protocol":
        return None if value in PROTOCOLS else f"protocol must be {' or '.join(PROTOCOLS)}, not {value!r}"
    if key == "verify":
        return None if value in VERIFY_MODES else f"verify must be {' or '.join(VERIFY_MODES)}, not {value!r}"
    if key == "model":
        return None if value else "model needs a value (one of the router's served model names)"
    return f"unknown option {key!r}"
