"""The transformers reference path for render parity, exactly as docs/contract.md §3 defines it.

Chat: the request's messages after the request normalization (vLLM's rules, `normalize_messages`, with the
content format detected from the template), then `tokenizer.apply_chat_template(..., tokenize=False)` and
`tokenizer(text, add_special_tokens=...)["input_ids"]`. Completions: strings through the tokenizer (special
tokens added by default), id lists as given. The tokenizer is transformers' own `AutoTokenizer`, loaded here,
separately from tokenfront's.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tokenfront.core.messages import normalize_messages
from tokenfront.core.templates import compile_template


@dataclass(frozen=True)
class Reference:
    """What transformers makes of one request: ids and the text they came from, or the error it raised."""

    ids: list[int] | None
    text: str | None = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None


@cache
def load_tokenizer(folder: str) -> Any:
    """transformers' tokenizer for a checkpoint folder, one per folder."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # mistral_format=False: as hf mode (and vLLM's hf mode) loads a folder with only Mistral's tekken.json,
        # converted to a transformers tokenizer rather than mistral-common's (that is --tokenizer-mode mistral).
        return AutoTokenizer.from_pretrained(folder, mistral_format=False)


def template_source(tokenizer: Any, chat_template: str | None, tools: list[dict[str, Any]] | None) -> str:
    """The template transformers uses for this request (its own choice when `chat_template` is None)."""
    if chat_template is not None:
        return chat_template
    return str(tokenizer.get_chat_template(None, tools=tools))


def reference_chat(folder: Path | str, body: dict[str, Any], chat_template: str | None = None) -> Reference:
    """Render a chat request body the way the mainstream servers do with transformers."""
    tokenizer = load_tokenizer(str(folder))
    body = copy.deepcopy(body)
    tools = body.get("tools")
    try:
        source = template_source(tokenizer, chat_template, tools)
        template = compile_template(source)
        messages = normalize_messages(
            body["messages"],
            content_format=template.content_format,
            template_knows_developer=template.knows_developer_role,
        )
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            documents=body.get("documents"),
            chat_template=source,
            # OpenAI's default is true, transformers' is false: always pass the request's value.
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
            tokenize=False,
            **(body.get("chat_template_kwargs") or {}),
        )
    except Exception as exc:  # any failure of the reference means "does not render"
        return Reference(ids=None, error=exc)
    ids = _encode(
        tokenizer, text, bool(body.get("add_special_tokens", False)), body.get("truncate_prompt_tokens")
    )
    return Reference(ids=ids, text=text)


def reference_completion(folder: Path | str, body: dict[str, Any]) -> list[Reference]:
    """One reference per prompt of a completions request body (all four prompt shapes)."""
    tokenizer = load_tokenizer(str(folder))
    prompt = body["prompt"]
    add_special = body.get("add_special_tokens")
    add_special = True if add_special is None else add_special
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif all(isinstance(item, int) for item in prompt):
        items = [list(prompt)]
    else:
        items = list(prompt)
    keep = body.get("truncate_prompt_tokens")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(Reference(ids=_encode(tokenizer, item, add_special, keep), text=item))
        else:
            out.append(Reference(ids=_truncate(list(item), keep)))
    return out


def _encode(tokenizer: Any, text: str, add_special_tokens: bool, keep: int | None) -> list[int]:
    """transformers' ids, truncated by transformers itself as vLLM asks it to (from the left, the special
    tokens it adds counted in the budget and kept)."""
    if keep is None or keep == -1:
        return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
    side = tokenizer.truncation_side
    tokenizer.truncation_side = "left"
    try:
        encoded = tokenizer(text, add_special_tokens=add_special_tokens, truncation=True, max_length=keep)
    finally:
        tokenizer.truncation_side = side
    return list(encoded["input_ids"])


def _truncate(ids: list[int], keep: int | None) -> list[int]:
    if keep is None or keep == -1 or len(ids) <= keep:
        return ids
    return ids[-keep:]


# -- vLLM's template analysis, written out independently -------------------------------------------------------
# The request normalization depends on two facts about the template, which must be decided as vLLM decides
# them (vllm/entrypoints/chat_utils.py: `_detect_content_format`, `_detect_developer_role_support`). These are
# independent re-implementations, to check tokenfront's `ChatTemplate` against.


def vllm_content_format(source: str) -> str:
    """vLLM's content-format detection: "openai" when a loop iterates over a message variable's `content`."""
    import jinja2.nodes

    from tokenfront.core.templates import ENVIRONMENT

    nodes = jinja2.nodes

    def is_var(node: Any, name: str) -> bool:
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name

    def is_attr(node: Any, name: str, key: str) -> bool:
        if isinstance(node, nodes.Getitem):
            return is_var(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
        if isinstance(node, nodes.Getattr):
            return is_var(node.node, name) and node.attr == key
        return False

    def is_var_or_elems(node: Any, name: str, key: str | None = None) -> bool:
        if isinstance(node, nodes.Filter):
            return node.node is not None and is_var_or_elems(node.node, name, key)
        if isinstance(node, nodes.Test):
            return is_var_or_elems(node.node, name, key)
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            return is_var_or_elems(node.node, name, key)
        return is_attr(node, name, key) if key else is_var(node, name)

    def message_list_names(root: Any) -> list[str]:
        names, pending = ["messages"], ["messages"]
        while pending:
            current = pending.pop(0)
            for assign in root.find_all(nodes.Assign):
                if is_var_or_elems(assign.node, current):
                    assert isinstance(assign.target, nodes.Name)  # vLLM asserts; a failure means "string"
                    names.append(assign.target.name)
                    if assign.target.name != current:
                        pending.append(assign.target.name)
        return names

    def loop_targets(root: Any, iterables: list[str], key: str | None) -> list[str]:
        targets = []
        for loop in root.find_all(nodes.For):
            if any(is_var_or_elems(loop.iter, name, key) for name in iterables):
                assert isinstance(loop.target, nodes.Name)
                targets.append(loop.target.name)
        return targets

    try:
        root = ENVIRONMENT.parse(source)
        messages = loop_targets(root, message_list_names(root), None)
        return "openai" if loop_targets(root, messages, "content") else "string"
    except Exception:
        return "string"


def vllm_knows_developer_role(source: str) -> bool:
    """vLLM's test for a template that handles the developer role itself: it names the role as a string."""
    return '"developer"' in source or "'developer'" in source
