"""The reference text's examples (shared/reference/render-endpoints.txt) with their Qwen3 ids."""

from __future__ import annotations

from typing import Any

# The chat example. Its ChatML rendering: "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n"
# "Name three primary colors.<|im_end|>\n<|im_start|>assistant\n"
REFERENCE_CHAT: dict[str, Any] = {
    "model": "Qwen3-0.6B",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three primary colors."},
    ],
    "max_tokens": 24,
    "temperature": 0,
}
# fmt: off
REFERENCE_CHAT_IDS = [151644, 8948, 198, 2610, 525, 50537, 13, 151645, 198,
                      151644, 872, 198, 675, 2326, 6028, 7987, 13, 151645, 198,
                      151644, 77091, 198]
# fmt: on

# The completions example.
REFERENCE_COMPLETION: dict[str, Any] = {
    "model": "Qwen3-0.6B",
    "prompt": "The capital of France is",
    "max_tokens": 8,
    "temperature": 0,
}
FRANCE_IDS = [785, 6722, 315, 9625, 374]
