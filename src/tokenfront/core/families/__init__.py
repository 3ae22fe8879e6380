"""Model families: the little model-specific behaviour that is not in the chat template (SPEC §9).

One module per family that needs more than its template, and one registry keyed by the config's
`model_type`. A family is a frozen record of small hooks; every model type without an entry gets the
generic family, whose hooks do nothing. The worker asks its family how to count usage; the router asks
whether ids rendered elsewhere may ever be forwarded to a worker of this family.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tokenfront.core.families import kimi_k3

__all__ = ["FAMILIES", "GENERIC", "ModelFamily", "family_for"]

Decode = Callable[[Sequence[int]], str]


def _no_exclusion(prompt_text: str, token_ids: Sequence[int], decode: Decode) -> int:
    return 0


@dataclass(frozen=True)
class ModelFamily:
    """The hooks of one model family.

    `usage_excluded_prompt_tokens(prompt_text, token_ids, decode)`: how many trailing tokens of a prompt
    the worker rendered itself are left out of `usage.prompt_tokens`; `decode` turns ids back into text
    (special tokens kept). `never_forward_ids`: a router must let the worker render requests for this
    family itself, whatever the fingerprints say (SPEC §8).
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
