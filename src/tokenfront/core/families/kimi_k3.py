"""Kimi K3 (`model_type` kimi_k3): its usage count leaves out the generation channel's opener.

Kimi K3's chat template ends the generation prompt with the assistant message opener and then the opener
of the channel the model writes first: ``<|open|>think<|sep|>`` when thinking (the default) or
``<|open|>response<|sep|>`` otherwise. Moonshot's own server counts that channel opener as part of the
response, not of the prompt, so ``usage.prompt_tokens`` excludes its tokens when the worker renders the
prompt. A router never forwards ids for this family: the worker must see the prompt text to count it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MODEL_TYPE = "kimi_k3"

# What the template appends last when add_generation_prompt is true (see its `open_tag` macro).
CHANNEL_OPENERS = ("<|open|>think<|sep|>", "<|open|>response<|sep|>")


def generation_channel_opener(prompt_text: str) -> str | None:
    """The channel opener the rendered prompt ends with, or None (no generation prompt)."""
    return next((opener for opener in CHANNEL_OPENERS if prompt_text.endswith(opener)), None)


def usage_excluded_prompt_tokens(
    prompt_text: str, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]
) -> int:
    """How many trailing prompt tokens are the channel opener, and so not counted as prompt tokens.

    A token counts as the opener's only when its whole text lies inside the opener: with Kimi's own
    tokenizer the markers are single special tokens (3 tokens), while a tokenizer that spells them out in
    pieces may merge the opener's first characters with the text before it, and that shared token stays a
    prompt token. Read from the ids' tail by decoding (never re-encoding the whole prompt).
    """
    opener = generation_channel_opener(prompt_text)
    if opener is None:
        return 0
    excluded = 0
    # Each step decodes a few tokens only: the opener is short, so this ends within a handful of steps.
    while excluded < len(token_ids):
        piece = decode(token_ids[len(token_ids) - excluded - 1 :])
        if len(piece) > len(opener) or not opener.endswith(piece):
            break
        excluded += 1
    return excluded
