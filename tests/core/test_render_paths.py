"""The servers hand `render_chat` the parsed body with the validated model (to skip dumping the model); the
ids must be those of the model-only path, for every request of the parity corpus."""

from __future__ import annotations

import json
from pathlib import Path

import corpus
import pytest

from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest


@pytest.mark.parametrize("name", ["qwen3", "llama3", "deepseek_v3", "gemma3"])
def test_body_and_model_paths_render_the_same_ids(checkpoint: object, name: str) -> None:
    folder: Path = checkpoint(name)  # type: ignore[operator]
    pipeline = RenderPipeline.load(RenderOptions(model=str(folder)))
    compared = refused = 0
    for case in corpus.CHAT:
        parsed = json.loads(json.dumps(case.body))
        request = ChatCompletionRequest.model_validate(parsed)
        try:
            expected = pipeline.render_chat(request)
        except RenderError as exc:
            with pytest.raises(RenderError) as caught:
                pipeline.render_chat(request, body=parsed)
            assert caught.value.message == exc.message
            refused += 1
            continue
        got = pipeline.render_chat(request, body=parsed)
        assert (got.token_ids, got.prompt_text) == (expected.token_ids, expected.prompt_text), case.id
        compared += 1
    assert compared + refused == len(corpus.CHAT) and compared > len(corpus.CHAT) // 2, (compared, refused)
