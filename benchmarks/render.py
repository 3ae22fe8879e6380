"""Render speed: tokenfront's pipeline against the in-process Hugging Face reference path, in one run.

Workloads (docs/contract.md §10): short chats, chats with tools, growing multi-turn conversations, cold long
prompts; and the four the comparison with vLLM's Rust renderer started from: one-line chats, a question with two
tools, an agent's growing session, cold mid-length prompts.
Every request is distinct (a counter is woven into the text), so no cache sees an exact repeat. Both paths
render the same requests in alternating rounds; the report gives requests/s and the ratio.

    python -m benchmarks.render [--checkpoint qwen3] [--requests 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from tokenfront import RenderOptions, RenderPipeline, fixtures
from tokenfront.core.messages import normalize_messages
from tokenfront.protocol import ChatCompletionRequest

_SYLLABLES = [
    "ka",
    "ri",
    "to",
    "ne",
    "sa",
    "mu",
    "lo",
    "ve",
    "di",
    "pra",
    "ste",
    "qua",
    "zon",
    "fel",
    "bri",
    "ght",
    "tion",
    "ing",
    "er",
    "an",
    "東",
    "京",
    "语",
    "言",
    "データ",
    "ö",
    "ü",
    "é",
]
_PUNCTUATION = ("", "", "", "", ",", ".", "?", "!", ":", ";")


def _vocabulary(rng: random.Random, size: int = 20000) -> list[str]:
    """Pseudo-words of 1-4 syllables: a vocabulary as wide as real text's, so no word cache makes it easy."""
    words = {"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(size)}
    return sorted(words)


WORDS = _vocabulary(random.Random(1234))

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
]


def _text(rng: random.Random, words: int, tag: int, vocabulary: list[str] = WORDS) -> str:
    parts = []
    for _ in range(words):
        word = rng.choice(vocabulary) if rng.random() > 0.05 else str(rng.randint(0, 10**6))
        parts.append(word + rng.choice(_PUNCTUATION))
    return f"[{tag}] " + " ".join(parts)


def short_chats(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": _text(rng, 20, i)},
            ]
        }
        for i in range(n)
    ]


def tool_chats(n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append(
            {
                "tools": TOOLS,
                "messages": [
                    {"role": "user", "content": _text(rng, 15, i)},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{i}",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": json.dumps({"city": rng.choice(WORDS)}),
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": f"call_{i}", "content": _text(rng, 10, i)},
                    {"role": "user", "content": _text(rng, 8, i)},
                ],
            }
        )
    return out


def growing_conversations(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return _conversations(n, rng, system_words=30, turns=8, user_words=25, assistant_words=40)


def _conversations(
    n: int, rng: random.Random, *, system_words: int, turns: int, user_words: int, assistant_words: int
) -> list[dict[str, Any]]:
    """Conversations of `turns` user turns, each turn's request the whole conversation so far, first to last."""
    out: list[dict[str, Any]] = []
    conversation = 0
    while len(out) < n:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _text(rng, system_words, conversation)}
        ]
        for turn in range(turns):
            messages.append({"role": "user", "content": _text(rng, user_words, conversation * 100 + turn)})
            out.append({"messages": list(messages)})
            messages.append({"role": "assistant", "content": _text(rng, assistant_words, turn)})
        conversation += 1
    return out[:n]


def long_prompts(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return _cold_prompts(n, rng, vocabulary_size=3000, words=3000)


def _cold_prompts(n: int, rng: random.Random, *, vocabulary_size: int, words: int) -> list[dict[str, Any]]:
    # Cold: every prompt draws on a vocabulary of its own, so no word or segment was seen before.
    out = []
    for i in range(n):
        vocabulary = [word + rng.choice("bcdfgklmnprstvz") * 2 for word in _vocabulary(rng, vocabulary_size)]
        out.append({"messages": [{"role": "user", "content": _text(rng, words, i, vocabulary)}]})
    return out


# The four workloads the comparison with vLLM's Rust renderer (`vllm-rs render`) was first measured on: a
# one-line chat (~31 tokens with Qwen3's template), a question with two tools (~263), an agent's growing
# session (~2.8k on average) and a cold mid-length prompt of never-seen words (~4.5k).


def one_line_chats(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": _text(rng, 6, i)}]} for i in range(n)]


def tool_questions(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return [{"tools": TOOLS, "messages": [{"role": "user", "content": _text(rng, 8, i)}]} for i in range(n)]


def agent_sessions(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return _conversations(n, rng, system_words=60, turns=12, user_words=40, assistant_words=70)


def cold_mid_prompts(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return _cold_prompts(n, rng, vocabulary_size=1500, words=900)


WORKLOADS: dict[str, Callable[[int, random.Random], list[dict[str, Any]]]] = {
    "short_chats": short_chats,
    "tool_chats": tool_chats,
    "multi_turn": growing_conversations,
    "long_prompts": long_prompts,
    "one_line": one_line_chats,
    "tool_question": tool_questions,
    "agent_session": agent_sessions,
    "cold_mid": cold_mid_prompts,
}
# Workloads whose requests are a conversation's turns, first to last (sent in order, each after the last answer).
CONVERSATIONS = frozenset({"multi_turn", "agent_session"})


def reference_renderer(pipeline: RenderPipeline) -> Callable[[dict[str, Any]], list[int]]:
    """The in-process Hugging Face path: apply_chat_template(tokenize=False) then the tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(pipeline.checkpoint.tokenizer_path))
    template = pipeline.checkpoint.chat_templates.select(has_tools=False)  # type: ignore[union-attr]
    from tokenfront.core.templates import compile_template

    if template is None:
        raise SystemExit(f"{pipeline.checkpoint.tokenizer_path}: the checkpoint has no chat template")
    compiled = compile_template(template)

    def render(body: dict[str, Any]) -> list[int]:
        messages = normalize_messages(
            body["messages"],
            content_format=compiled.content_format,
            template_knows_developer=compiled.knows_developer_role,
        )
        text = tokenizer.apply_chat_template(
            messages, tools=body.get("tools"), tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return render


def tokenfront_renderer(pipeline: RenderPipeline) -> Callable[[dict[str, Any]], list[int]]:
    """tokenfront's path, including request validation, as the servers run it."""

    def render(body: dict[str, Any]) -> list[int]:
        return pipeline.render_chat(ChatCompletionRequest.model_validate(body)).token_ids

    return render


def _time(render: Callable[[dict[str, Any]], list[int]], requests: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    for body in requests:
        render(body)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="qwen3", help="fixture checkpoint name (default qwen3)")
    parser.add_argument("--requests", type=int, default=200, help="requests per workload and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)

    folder = str(fixtures.ensure_checkpoint(args.checkpoint))
    pipeline = RenderPipeline.load(RenderOptions(model=folder))
    plain = RenderPipeline.load(RenderOptions(model=folder, tokenizer_backend="tokenizers"))
    paths = {
        "reference": reference_renderer(pipeline),
        "tokenfront[tokenizers]": tokenfront_renderer(plain),
        "tokenfront": tokenfront_renderer(pipeline),
    }
    results = {}
    for name, make in WORKLOADS.items():
        count = args.requests if name not in ("long_prompts", "cold_mid") else max(10, args.requests // 10)
        times: dict[str, list[float]] = {path: [] for path in paths}
        for round_ in range(args.rounds):
            requests = make(count, random.Random(round_ * 7919 + len(name)))
            # Same requests, both paths; the parity check keeps the comparison honest.
            order = list(paths) if round_ % 2 == 0 else list(reversed(paths))
            for path in order:
                times[path].append(_time(paths[path], requests))
            # Checked after timing, so the check warms no cache the timed runs then hit.
            for body in requests[:5]:
                expected = paths["reference"](body)
                assert all(render(body) == expected for render in paths.values()), f"ids differ on {name}"
        best = {path: min(values) for path, values in times.items()}
        results[name] = {
            "requests": count,
            **{f"{path}_rps": count / best[path] for path in paths},
            "ratio_tokenizers_backend": best["reference"] / best["tokenfront[tokenizers]"],
            "ratio": best["reference"] / best["tokenfront"],
            "tokenfront_ms_median": statistics.median(times["tokenfront"]) / count * 1000,
        }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"checkpoint {args.checkpoint}, tokenizer backend {pipeline.backend.name}, best of {args.rounds} "
            "rounds, in-process, one core; ratio = tokenfront speed / reference speed"
        )
        print(
            f"{'workload':<14} {'requests':>8} {'reference req/s':>16} {'[tokenizers] req/s':>19} "
            f"{'ratio':>6} {'tokenfront req/s':>17} {'ratio':>6}"
        )
        for name, row in results.items():
            print(
                f"{name:<14} {row['requests']:>8} {row['reference_rps']:>16.1f} "
                f"{row['tokenfront[tokenizers]_rps']:>19.1f} {row['ratio_tokenizers_backend']:>5.2f}x "
                f"{row['tokenfront_rps']:>17.1f} {row['ratio']:>5.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
