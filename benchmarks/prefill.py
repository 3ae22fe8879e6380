"""Prefill time with and without a cached prefix, on the worker's transformers engine.

Each round uses its own `cache_salt`, so its first request finds nothing cached: a ~1000-token prompt is
prefilled in full ("cold"). The second request shares all but its last ~20 tokens with the first: the prefix
KV cache serves the shared full blocks and only the rest is computed ("warm"). Both requests generate one
token, so the time measured is the prefill (plus one sampling step). Reported per request: the engine's own
prefill time and the time to first token seen by the caller, medians over the rounds after a warm-up round.

    python -m benchmarks.prefill [--checkpoint smollm2] [--prompt-tokens 1000] [--tail 20] [--rounds 5] [--json]

The default checkpoint is `smollm2` (real weights); `tiny-random` is used when it cannot be had.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import checkpoint_or_tiny
from tokenfront.worker.engine import GenerationRequest, SamplingParams
from tokenfront.worker.engines.transformers import TransformersEngine

_WORDS = [
    "router",
    "worker",
    "cache",
    "block",
    "prefix",
    "token",
    "model",
    "prompt",
    "request",
    "batch",
    "stream",
    "event",
    "sequence",
    "layer",
    "key",
    "value",
    "attention",
    "decode",
    "prefill",
    "budget",
    "eviction",
    "parent",
    "hash",
    "salt",
    "chain",
    "shared",
    "latency",
    "throughput",
    "replica",
    "fleet",
]


def _prompts(folder: Path, length: int, tail: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """Two prompts of `length` ids that differ only in their last `tail` ids (real text when a tokenizer is there)."""
    text = " ".join(rng.choice(_WORDS) for _ in range(2 * length))
    tokenizer_file = folder / "tokenizer.json"
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(tokenizer_file)).encode(text).ids
    else:
        ids = [rng.randrange(3, 1000) for _ in range(2 * length)]
    shared = ids[: length - tail]
    return shared + ids[length : length + tail], shared + ids[length + tail : length + 2 * tail]


async def _prefill(
    engine: TransformersEngine, prompt: list[int], request_id: str, salt: str
) -> dict[str, float]:
    """Run one request for one token; its engine prefill time, time to first token and cached tokens."""
    before = engine.stats()["prefill_seconds"]
    started = time.perf_counter()
    stream = engine.submit(GenerationRequest(request_id, prompt, SamplingParams(1, 0.0), cache_salt=salt))
    async for _ in stream:
        pass
    return {
        "ttft_ms": (time.perf_counter() - started) * 1000,
        "prefill_ms": (engine.stats()["prefill_seconds"] - before) * 1000,
        "cached_tokens": float(stream.cached_tokens or 0),
    }


async def _run(engine: TransformersEngine, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    await engine.start()
    cold: list[dict[str, float]] = []
    warm: list[dict[str, float]] = []
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up torch and is not counted
            first, second = _prompts(folder, args.prompt_tokens, args.tail, random.Random(round_))
            salt = f"benchmark-round-{round_}"
            cold_result = await _prefill(engine, first, f"cold-{round_}", salt)
            warm_result = await _prefill(engine, second, f"warm-{round_}", salt)
            if round_:
                cold.append(cold_result)
                warm.append(warm_result)
    finally:
        await engine.stop()

    def median(results: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in results)

    return {
        "prompt_tokens": args.prompt_tokens,
        "shared_tokens": args.prompt_tokens - args.tail,
        "cached_tokens": median(warm, "cached_tokens"),
        "rounds": args.rounds,
        "cold_prefill_ms": median(cold, "prefill_ms"),
        "warm_prefill_ms": median(warm, "prefill_ms"),
        "prefill_speedup": median(cold, "prefill_ms") / median(warm, "prefill_ms"),
        "cold_ttft_ms": median(cold, "ttft_ms"),
        "warm_ttft_ms": median(warm, "ttft_ms"),
        "ttft_speedup": median(cold, "ttft_ms") / median(warm, "ttft_ms"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="smollm2", help="fixture checkpoint name (default: smollm2)")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument(
        "--tail", type=int, default=20, help="ids that differ at the end of the second prompt"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens-per-block", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    name, folder = checkpoint_or_tiny(args.checkpoint)
    engine = TransformersEngine(folder, tokens_per_block=args.tokens_per_block)
    results = {"checkpoint": name, "device": engine.info.device, **asyncio.run(_run(engine, folder, args))}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"checkpoint {name} on {results['device']} ({torch.get_num_threads()} threads), {args.prompt_tokens}-token prompts, the second sharing all but "
        f"the last {args.tail}; median of {args.rounds} rounds"
    )
    print(f"{'':<22} {'engine prefill ms':>18} {'time to 1st token ms':>21} {'cached tokens':>14}")
    print(
        f"{'cold (empty cache)':<22} {results['cold_prefill_ms']:>18.1f} {results['cold_ttft_ms']:>21.1f} {0:>14}"
    )
    print(
        f"{'warm (shared prefix)':<22} {results['warm_prefill_ms']:>18.1f} {results['warm_ttft_ms']:>21.1f} "
        f"{results['cached_tokens']:>14.0f}"
    )
    print(f"{'speed-up':<22} {results['prefill_speedup']:>17.1f}x {results['ttft_speedup']:>20.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
