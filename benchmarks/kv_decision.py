"""The router's routing decision in-process: KV index + a KV policy, from 10 to 1,000 workers.

No servers: the router's own `KvIndex` and `kv_cache_aware` policy (or `--policy predicted_ttft`) in this
process. Each of N workers holds
`--conversations` conversations (default 4) that all open with the same `--system-tokens` system prompt
(default 2,048 tokens, held by every worker), each `prompt - 512` tokens long, as a tokenfront worker reports
them: "stored" events on `/kv_cache_events` (the system prompt once, then each conversation's own blocks on
top of it). Then, per case:

- hashing: `core.kv_blocks.block_hashes` of one prompt, the median of 50 runs;
- decisions: `--decisions` (default 200, after 20 not counted) prompts of `prompt` tokens, each one
  conversation picked at random plus 512 new tokens; a decision is what the router does per request: hash the prompt, `select` among all N
  workers (each with 0-2 requests in flight), `on_routed` on the chosen one. p50 / p99 over the decisions, in
  wall time and in the thread's CPU time (what the decision cost, however busy the shared machine was), and
  how many went to the worker holding the conversation (all of them should);
- events: a stream of `--event-batches` (default 200) `/kv_cache_events` answers going round 20 workers, each
  with 8 "stored" events of 16 new blocks and 8 "removed" events evicting what that worker's previous answer
  stored (a worker at its cache's limit): events (and blocks) applied per second;
- memory: how much the process's resident memory (RSS, after `gc.collect()` and `malloc_trim`) grew while
  the index was populated, less the conversations the benchmark keeps, over the (block, worker) pairs the
  index holds: bytes per held block. (RSS, not tracemalloc: the index reserves address space for its rows up
  front, which tracemalloc counts whole and the system commits only as rows are used.)

    python -m benchmarks.kv_decision [--workers 10,100,1000] [--prompt-tokens 8192,32768] [--decisions 200]
                                     [--conversations 4] [--system-tokens 2048] [--event-batches 200]
                                     [--policy kv_cache_aware|predicted_ttft] [--json]

It uses only the index's long-standing API (`KvIndex`, `apply_tokenfront_events`, `stats`, `build_policy`,
`core.kv_blocks.block_hashes`), so the same script measures an older tree: `git archive <commit> src | tar -x
-C /tmp/old` and `PYTHONPATH=/tmp/old/src python -m benchmarks.kv_decision ...` from this checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import random
import statistics
import sys
import time
from array import array
from dataclasses import asdict, dataclass
from typing import Any

from tokenfront.core.kv_blocks import KV_CACHE_HASH, block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies import RouteRequest, WorkerLoad, build_policy

TOKENS_PER_BLOCK = 16
NEW_TOKENS = 512  # what a decision's prompt adds to the conversation it extends
WARM_UP = 20  # decisions run first and not counted: the index's fresh rows are first written then
VOCAB = list(range(1000, 150_000))  # shared int objects: prompts cost a pointer per token, not an int each


@dataclass
class Case:
    workers: int
    prompt_tokens: int
    held_blocks: int
    hashing_ms: float
    decision_p50_ms: float
    decision_p99_ms: float
    decision_cpu_p50_ms: float  # the thread's CPU time: what the decision cost, however busy the machine was
    decision_cpu_p99_ms: float
    to_holder: int
    decisions: int
    events_per_s: float
    blocks_per_s: float
    index_mb: float
    bytes_per_held_block: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="10,100,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--prompt-tokens", default="8192,32768", help="prompt lengths, comma-separated")
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=4, help="per worker")
    parser.add_argument("--system-tokens", type=int, default=2048)
    parser.add_argument("--event-batches", type=int, default=200)
    parser.add_argument(
        "--policy",
        default="kv_cache_aware",
        help="the policy deciding: kv_cache_aware (default) or predicted_ttft",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    cases = [
        run_case(workers, prompt_tokens, args)
        for workers in _ints(args.workers)
        for prompt_tokens in _ints(args.prompt_tokens)
    ]
    machine = {
        "policy": args.policy,
        "kv_cache_hash": KV_CACHE_HASH,
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps({"machine": machine, "cases": [asdict(case) for case in cases]}, indent=2))
        return
    print(
        f"policy {args.policy}; kv_cache_hash {KV_CACHE_HASH}; load average {machine['load_average_1m']:.1f} on {machine['cpus']} CPUs"
    )
    print(
        f"{'workers':>7} {'prompt':>6} {'held blocks':>11} {'hash ms':>7} {'p50 ms':>6} {'p99 ms':>6} "
        f"{'cpu p50':>7} {'cpu p99':>7} {'to holder':>9} {'events/s':>9} {'blocks/s':>9} {'index MB':>8} "
        f"{'B/block':>7}"
    )
    for case in cases:
        print(
            f"{case.workers:>7} {case.prompt_tokens // 1024:>5}k {case.held_blocks:>11,} "
            f"{case.hashing_ms:>7.2f} {case.decision_p50_ms:>6.2f} {case.decision_p99_ms:>6.2f} "
            f"{case.decision_cpu_p50_ms:>7.2f} {case.decision_cpu_p99_ms:>7.2f} "
            f"{case.to_holder:>4}/{case.decisions:<4} {case.events_per_s:>9,.0f} {case.blocks_per_s:>9,.0f} "
            f"{case.index_mb:>8.1f} {case.bytes_per_held_block:>7.1f}"
        )


def run_case(n_workers: int, prompt_tokens: int, args: argparse.Namespace) -> Case:
    """One fleet size and prompt length: populate, then measure hashing, decisions, events and memory."""
    rng = random.Random(f"{n_workers}-{prompt_tokens}")
    urls = [f"http://worker-{i}:8000" for i in range(n_workers)]
    system = rng.choices(VOCAB, k=args.system_tokens)
    system_hashes = block_hashes(system, TOKENS_PER_BLOCK)
    conversation_tokens = prompt_tokens - NEW_TOKENS - args.system_tokens
    # The conversations the decisions extend, chosen up front so their ids are not part of the index's memory.
    targets = [(rng.randrange(n_workers), rng.randrange(args.conversations)) for _ in range(args.decisions)]
    kept = {target: None for target in targets}

    baseline = _resident_bytes()
    index = KvIndex()
    conversations: dict[tuple[int, int], list[int]] = {}
    for worker, url in enumerate(urls):
        events: list[dict[str, Any]] = [_stored(1, system_hashes, None)]
        for conversation in range(args.conversations):
            ids = system + _conversation_ids(worker, conversation, conversation_tokens)
            hashes = block_hashes(ids, TOKENS_PER_BLOCK)
            events.append(_stored(len(events) + 1, hashes[len(system_hashes) :], system_hashes[-1]))
            if (worker, conversation) in kept:
                conversations[(worker, conversation)] = ids
        index.apply_tokenfront_events(url, {"events": events, "last_seq": len(events), "log_id": url})
    del events, ids, hashes
    # The kept conversations' ids belong to the benchmark, not the index: take them out of the figure.
    kept_bytes = sum(sys.getsizeof(ids) for ids in conversations.values())
    index_bytes = _resident_bytes() - baseline - kept_bytes
    held = sum(view["blocks"] for view in index.stats()["workers"].values())

    prompt = list(array("I", system + _conversation_ids(0, 0, prompt_tokens - args.system_tokens)))
    hashing = statistics.median(_timed(lambda: block_hashes(prompt, TOKENS_PER_BLOCK)) for _ in range(50))

    policy = build_policy(args.policy, kv_index=index)
    loads = [WorkerLoad(url, rng.randrange(3), TOKENS_PER_BLOCK) for url in urls]
    times, cpu_times, to_holder = [], [], 0
    answered: list[tuple[RouteRequest, WorkerLoad]] = []  # the request being answered, as a router holds it
    # What is set up lives on: frozen, as `tokenfront` freezes what start-up loaded (cli._serve), so the
    # collector's full passes do not walk the benchmark's own data inside a decision.
    gc.collect()
    gc.freeze()
    for number, (worker, conversation) in enumerate([*targets[:WARM_UP], *targets]):
        # A fresh list of fresh ints, as a tokenizer returns it (the shared VOCAB ints would scatter in memory).
        ids = list(array("I", conversations[(worker, conversation)] + rng.choices(VOCAB, k=NEW_TOKENS)))
        start, cpu_start = time.perf_counter(), time.thread_time()
        request = RouteRequest(ids)
        chosen = policy.select(loads, request)
        policy.on_routed(chosen, request)
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
        # The policy lets go of the previous request inside `select`; freeing its 32k ints is the caller's
        # business (a router frees a request when it is answered), so it happens here, outside the timing.
        for done, done_on in answered:  # answered before the next one comes, outside the timing
            policy.on_complete(done_on, done, True)
        answered[:] = [(request, chosen)]
        if number >= WARM_UP:
            times.append(elapsed)
            cpu_times.append(cpu)
            to_holder += chosen.url == urls[worker]

    events_per_s, blocks_per_s = _apply_event_stream(index, urls, args, rng)
    gc.unfreeze()
    return Case(
        workers=n_workers,
        prompt_tokens=prompt_tokens,
        held_blocks=held,
        hashing_ms=hashing * 1e3,
        decision_p50_ms=_percentile(times, 50) * 1e3,
        decision_p99_ms=_percentile(times, 99) * 1e3,
        decision_cpu_p50_ms=_percentile(cpu_times, 50) * 1e3,
        decision_cpu_p99_ms=_percentile(cpu_times, 99) * 1e3,
        to_holder=to_holder,
        decisions=len(times),
        events_per_s=events_per_s,
        blocks_per_s=blocks_per_s,
        index_mb=index_bytes / 1e6,
        bytes_per_held_block=index_bytes / held,
    )


def _apply_event_stream(
    index: KvIndex, urls: list[str], args: argparse.Namespace, rng: random.Random
) -> tuple[float, float]:
    """Apply `--event-batches` event pages, each for one worker: 8 "stored" events of 16 new blocks, and 8
    "removed" events evicting the blocks that worker's previous page stored. Events and blocks per second."""
    streamed = urls[: min(len(urls), 20)]  # pages go round these workers, each one's previous page to evict
    next_seq = {url: index.tokenfront_cursor(url) + 1 for url in streamed}
    previous: dict[str, list[list[int]]] = {}
    pages = []
    for page in range(len(streamed) + args.event_batches):
        url = streamed[page % len(streamed)]
        events: list[dict[str, Any]] = []
        chains = [
            block_hashes(_conversation_ids(page, 1000 + turn, 16 * TOKENS_PER_BLOCK), TOKENS_PER_BLOCK)
            for turn in range(8)
        ]
        for old, new in zip(previous.get(url, [[]] * 8), chains, strict=True):
            if old:
                events.append({"seq": next_seq[url], "type": "removed", "block_hashes": old})
                next_seq[url] += 1
            events.append(_stored(next_seq[url], new, None))
            next_seq[url] += 1
        previous[url] = chains
        pages.append((url, {"events": events, "last_seq": next_seq[url] - 1, "log_id": url}))
    for url, first in pages[: len(streamed)]:  # the first round only stores: it is not timed
        index.apply_tokenfront_events(url, first)
    timed = pages[len(streamed) :]
    n_events = sum(len(page["events"]) for _, page in timed)
    start = time.perf_counter()
    for url, page in timed:
        index.apply_tokenfront_events(url, page)
    elapsed = time.perf_counter() - start
    return n_events / elapsed, n_events * 16 / elapsed


def _stored(seq: int, hashes: list[int], parent: int | None) -> dict[str, Any]:
    # token_ids are left out: the index names blocks by their hashes, and these would only cost memory here.
    return {
        "seq": seq,
        "type": "stored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "tokens_per_block": TOKENS_PER_BLOCK,
    }


def _conversation_ids(worker: int, conversation: int, n_tokens: int) -> list[int]:
    return random.Random(f"conversation-{worker}-{conversation}").choices(VOCAB, k=n_tokens)


def _resident_bytes() -> int:
    """The process's resident memory, after handing freed heap memory back to the system (so what was only
    scratch while populating does not count)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _percentile(values: list[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(percent / 100 * (len(ordered) - 1)))]


def _timed(function: Any) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    main()
