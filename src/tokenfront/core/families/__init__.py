"""Model families: the little model-specific behaviour that is not in the chat template (docs/contract.md §9).

One module per family that needs more than its template, and one registry keyed by the config's
`model_type`. A family is a frozen record of small hooks; every model type without an entry gets the
generic family, whose hooks do nothing. The worker asks its family how to count usage; the router asks
whether ids rendered elsewhere may ever be forwarded to a worker of this family.

Two families are not rendered by a Jinja chat template at all: gpt-oss (`gpt_oss`, the Harmony format) and
Mistral checkpoints in `--tokenizer-mode mistral` (mistral-common's request encoder). Each provides a
`ChatFormat`; `chat_format_for` picks it, and the pipeline calls it in place of template + tokenizer.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenfront.core.families import gpt_oss, kimi_k3, mistral
from tokenfront.core.families.chat_format import ChatFormat, FormattedChat

if TYPE_CHECKING:
    from tokenfront.core.checkpoint import Checkpoint

__all__ = [
    "FAMILIES",
    "GENERIC",
    "ChatFormat",
    "FormattedChat",
    "ModelFamily",
    "chat_format_for",
    "family_for",
]

Decode = Callable[[Sequence[int]], str]


def _no_exclusion(prompt_text: str, token_ids: Sequence[int], decode: Decode) -> int:
    return 0


@dataclass(frozen=True)
class ModelFamily:
    """The hooks of one model family.

    `usage_excluded_prompt_tokens(prompt_text, token_ids, decode)`: how many trailing tokens of a prompt
    the worker rendered itself are left out of `usage.prompt_tokens`; `decode` turns ids back into text
    (special tokens kept). `never_forward_ids`: a router must let the worker render requests for this
    family itself, whatever the fingerprints say (docs/contract.md §8).
    """

    name: str
    usage_excluded_prompt_tokens: Callable[[str, Sequence[int], Decode], int] = _no_exclusion
    never_forward_ids: bool = False


GENERIC = ModelFamily(name="generic")

# model_type -> family. Read-only: adding a family is one module and one line here.
FAMILIES: Mapping[str, ModelFamily] = types.MappingProxyType(
    {
        kimi_k3.MODEL_TYPE: ModelFamily(
            name=kimi_k3.MODEL_TYPE,
            usage_excluded_prompt_tokens=kimi_k3.usage_excluded_prompt_tokens,
            never_forward_ids=True,
        ),
    }
)


def family_for(model_type: str | None) -> ModelFamily:
    """The family of a checkpoint's `model_type` (the generic family when it has no entry)."""
    return FAMILIES.get(model_type or "", GENERIC)


def chat_format_for(checkpoint: Checkpoint) -> ChatFormat | None:
    """The chat format of a loaded checkpoint, or None when its chat template renders chat."""
    if checkpoint.tokenizer_mode == "mistral":
        return mistral.MistralChatFormat(checkpoint)
    if checkpoint.model_type == gpt_oss.MODEL_TYPE:
        return gpt_oss.HarmonyChatFormat(checkpoint)
    return None
