"""Routing: prefix-cache hit rate and time to first token, kv_cache_aware against round_robin, in one run.

Starts real processes on loopback: `--workers` workers (`tokenfront serve`, default 4) and, for each policy
in turn, a router (`tokenfront route --policy P`) in front of all of them. The workload is the same for
every policy: `--conversations` multi-turn conversations (default 16) that grow turn by turn (`--turns`,
default 6): a long distinct first message, then short follow-ups, each turn re-sending the conversation
with the model's own previous replies, `--concurrency` conversations at a time. Every request streams, so
the time to first token is the time until the first generated text arrives through the router; the hit
rate is `sum(cached_tokens) / sum(prompt_tokens)` from the workers' usage.

Each policy's run uses its own `cache_salt`, so it starts with cold caches whatever ran before it on the
same workers. Everything started is stopped by its pid at the end.

    python -m benchmarks.routing [--checkpoint smollm2] [--workers 4] [--conversations 16] [--turns 6]
                                 [--concurrency 8] [--max-tokens 16] [--json]

The default checkpoint is `smollm2` (real weights: prefill costs what a model's does); `tiny-random` is used
when it cannot be had, and is much faster but makes prefill nearly free, so TTFT barely differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks import checkpoint_or_tiny
from benchmarks.servers import Server, launch_tokenfront, stop_all, wait_healthy

POLICIES = ("kv_cache_aware", "round_robin")
_TOPICS = (
    "a lighthouse keeper",
    "a river delta",
    "an old violin",
    "a mountain railway",
    "a city library",
    "a desert observatory",
    "a fishing village",
    "a glass factory",
    "a winter market",
    "a forgotten garden",
    "a night train",
    "a clockmaker",
    "a paper mill",
    "an island ferry",
    "a salt marsh",
    "a copper mine",
)
_WORDS = (
    "harbor",
    "stone",
    "window",
    "morning",
    "letter",
    "bridge",
    "candle",
    "meadow",
    "ledger",
    "lantern",
    "signal",
    "quiet",
    "ember",
    "orchard",
    "compass",
    "anchor",
    "thread",
    "silver",
    "valley",
    "weather",
    "story",
    "ribbon",
    "timber",
    "engine",
    "basket",
    "courtyard",
)


# --- the workload ------------------------------------------------------------------------------------------


def _first_message(index: int, length: int) -> str:
    rng = random.Random(index)
    topic = _TOPICS[index % len(_TOPICS)]
    text = " ".join(rng.choice(_WORDS) for _ in range(length))
    return f"Here are my notes about {topic} (conversation {index}): {text}. Summarize them briefly."


def _follow_up(index: int, turn: int) -> str:
    rng = random.Random(1000 * index + turn)
    return f"Now say more about the {rng.choice(_WORDS)} and the {rng.choice(_WORDS)}, in one sentence."


@dataclass
class TurnResult:
    worker: str
    forwarded: bool
    ttft: float
    prompt_tokens: int
    cached_tokens: int


async def _turn(
    client: httpx.AsyncClient, messages: list[dict[str, str]], args: argparse.Namespace, salt: str
) -> tuple[TurnResult, str]:
    body = {
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": salt,
    }
    started = time.perf_counter()
    first_token: float | None = None
    text, usage = [], None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"router answered {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content")
                # The first chunk only opens the message (role, empty content): the first token is after it.
                if first_token is None and (piece or choice.get("finish_reason")):
                    first_token = time.perf_counter()
                text.append(delta.get("content") or "")
        worker = response.headers["x-tokenfront-worker"]
        forwarded = response.headers["x-tokenfront-forwarded"] == "true"
    if usage is None:
        raise RuntimeError("the stream carried no usage")
    result = TurnResult(
        worker=worker,
        forwarded=forwarded,
        ttft=(first_token or time.perf_counter()) - started,
        prompt_tokens=usage["prompt_tokens"],
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
    )
    return result, "".join(text)


async def _conversation(
    client: httpx.AsyncClient, index: int, args: argparse.Namespace, salt: str, gate: asyncio.Semaphore
) -> list[TurnResult]:
    messages = [{"role": "user", "content": _first_message(index, args.first_message_words)}]
    results = []
    async with gate:
        for turn in range(args.turns):
            result, reply = await _turn(client, messages, args, salt)
            results.append(result)
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": _follow_up(index, turn)},
            ]
    return results


async def _workload(router_url: str, args: argparse.Namespace, salt: str) -> tuple[list[TurnResult], float]:
    gate = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with httpx.AsyncClient(base_url=router_url, timeout=600.0, limits=limits) as client:
        started = time.perf_counter()
        conversations = await asyncio.gather(
            *(_conversation(client, index, args, salt, gate) for index in range(args.conversations))
        )
        wall = time.perf_counter() - started
    return [turn for conversation in conversations for turn in conversation], wall


def _summary(policy: str, turns: list[TurnResult], wall: float, workers: list[str]) -> dict[str, Any]:
    ttfts = sorted(turn.ttft * 1000 for turn in turns)
    prompt = sum(turn.prompt_tokens for turn in turns)
    cached = sum(turn.cached_tokens for turn in turns)
    served = Counter(turn.worker for turn in turns)
    return {
        "policy": policy,
        "requests": len(turns),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "mean_ttft_ms": statistics.fmean(ttfts),
        "p50_ttft_ms": ttfts[len(ttfts) // 2],
        "p90_ttft_ms": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.9))],
        "wall_s": wall,
        "forwarded": sum(turn.forwarded for turn in turns) / len(turns),
        "requests_per_worker": [served.get(url, 0) for url in workers],
    }


def _warm_up(workers: list[Server]) -> None:
    """One short request per worker, so no policy pays for torch's first-call costs."""
    for worker in workers:
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "cache_salt": "warm-up"}
        httpx.post(f"{worker.url}/v1/chat/completions", json=body, timeout=300.0).raise_for_status()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the workers, run the workload through a router per policy, and stop everything."""
    name, folder = checkpoint_or_tiny(args.checkpoint)
    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-routing-"))
    # Several workers share the machine's cores: one torch thread each keeps them from fighting over them.
    worker_env = {"OMP_NUM_THREADS": str(args.worker_threads)}
    started: list[Server] = []
    try:
        workers = [
            launch_tokenfront(["serve", "--model", str(folder)], log_dir=log_dir, env=worker_env)
            for _ in range(args.workers)
        ]
        started += workers
        wait_healthy(workers)
        _warm_up(workers)
        results = []
        for policy in POLICIES:
            command = ["route", "--model", str(folder), "--policy", policy]
            for worker in workers:
                command += ["--worker", worker.url]
            router = launch_tokenfront(command, log_dir=log_dir)
            started.append(router)
            wait_healthy([router])
            turns, wall = asyncio.run(_workload(router.url, args, salt=f"{policy}-{uuid.uuid4().hex}"))
            results.append(_summary(policy, turns, wall, [w.url for w in workers]))
            router.stop()
    finally:
        stop_all(started)
    return {
        "checkpoint": name,
        "workers": args.workers,
        "conversations": args.conversations,
        "turns": args.turns,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "logs": str(log_dir),
        "results": results,
    }


def _print_report(report: dict[str, Any]) -> None:
    print(
        f"{report['workers']} workers ({report['checkpoint']}), {report['conversations']} conversations x "
        f"{report['turns']} turns, {report['concurrency']} at a time, max_tokens {report['max_tokens']}, "
        "streaming"
    )
    header = (
        f"{'policy':<16} {'hit rate':>9} {'mean TTFT ms':>13} {'p50 ms':>8} {'p90 ms':>8} {'wall s':>7} "
        f"{'forwarded':>10}  requests per worker"
    )
    print(header)
    for row in report["results"]:
        print(
            f"{row['policy']:<16} {row['hit_rate']:>8.1%} {row['mean_ttft_ms']:>13.1f} "
            f"{row['p50_ttft_ms']:>8.1f} {row['p90_ttft_ms']:>8.1f} {row['wall_s']:>7.1f} "
            f"{row['forwarded']:>9.0%}  {row['requests_per_worker']}"
        )
    by_policy = {row["policy"]: row for row in report["results"]}
    aware, rr = by_policy["kv_cache_aware"], by_policy["round_robin"]
    print(
        f"kv_cache_aware vs round_robin: hit rate {aware['hit_rate']:.1%} vs {rr['hit_rate']:.1%}, "
        f"mean TTFT {rr['mean_ttft_ms'] / aware['mean_ttft_ms']:.2f}x faster"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="smollm2", help="fixture checkpoint name (default: smollm2)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8, help="conversations in flight at once")
    parser.add_argument("--max-tokens", type=int, default=16, help="generated tokens per turn")
    parser.add_argument(
        "--first-message-words", type=int, default=200, help="length of each conversation's first message"
    )
    parser.add_argument("--worker-threads", type=int, default=1, help="torch threads per worker (default: 1)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
