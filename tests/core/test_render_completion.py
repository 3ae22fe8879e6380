"""Completions prompts given as ids: an id outside the vocabulary is a 400 that points at it as the client
wrote the prompt (a flat list, or a list of lists even when it holds one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import CompletionRequest


@pytest.fixture(scope="module")
def pipeline(qwen3: Path) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(qwen3)))


@pytest.mark.parametrize(
    ("prompt", "named", "param"),
    [
        ([1, 2, 999999], "prompt[2]", "prompt"),
        ([[1, 2, 999999]], "prompt[0][2]", "prompt"),
        ([[1], [5, 999999]], "prompt[1][1]", "prompt[1]"),
    ],
)
def test_an_id_outside_the_vocabulary_is_named_where_it_was_sent(
    pipeline: RenderPipeline, prompt: Any, named: str, param: str
) -> None:
    with pytest.raises(RenderError) as caught:
        pipeline.render_completion(CompletionRequest.model_validate({"prompt": prompt}))
    assert caught.value.message.startswith(f"{named} = 999999 is not a token id of this model"), caught.value
    assert caught.value.param == param
    assert caught.value.code == "token_id_out_of_vocabulary"


def test_ids_inside_the_vocabulary_render_as_sent(pipeline: RenderPipeline) -> None:
    rendered = pipeline.render_completion(CompletionRequest.model_validate({"prompt": [[1, 2], [151642]]}))
    assert [item.token_ids for item in rendered] == [[1, 2], [151642]]
