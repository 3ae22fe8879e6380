"""What the servers share (server/): JSON in and out, SSE framing, request ids, the model check."""

from __future__ import annotations

import os
import re

import pytest

from tokenfront.server.errors import APIError
from tokenfront.server.models import check_model, models_body
from tokenfront.server.request_ids import chat_request_id, completion_request_id, new_request_id
from tokenfront.server.responses import dumps, loads
from tokenfront.server.sse import SSE_DONE, sse_event


def test_sse_framing() -> None:
    assert sse_event({"a": "é", "b": [1, 2]}) == 'data: {"a":"é","b":[1,2]}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_json_keeps_integers_beyond_64_bits() -> None:
    # orjson refuses them both ways; JSON allows them, and a client may send one.
    big = 2**70
    assert loads(f'{{"n": {big}}}'.encode()) == {"n": big}
    assert dumps({"n": big, "s": "é"}) == f'{{"n":{big},"s":"é"}}'.encode()
    assert dumps({"a": [1, None, True]}) == b'{"a":[1,null,true]}'


def test_loads_says_why_a_body_is_not_json() -> None:
    with pytest.raises(ValueError, match="line 1"):
        loads(b'{"messages": [}')


def test_request_ids() -> None:
    ids = {chat_request_id() for _ in range(1000)}  # past several draws of the id pool
    assert len(ids) == 1000 and all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", i) for i in ids)
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", completion_request_id())
    assert re.fullmatch(r"[0-9a-f]{32}", new_request_id())


def test_a_forked_process_makes_other_request_ids() -> None:
    """A pre-forked server process (`--workers N`) must not give the ids its parent has drawn but not yet
    used."""
    new_request_id()  # the parent has ids drawn and waiting
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write, " ".join(new_request_id() for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        theirs = pipe.read().split()
    ours = [new_request_id() for _ in range(5)]
    assert len(theirs) == 5 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in theirs)
    assert not set(theirs) & set(ours)


def test_model_check() -> None:
    check_model(None, ("a", "b"))
    check_model("b", ("a", "b"))
    check_model("anything", ())  # a router that knows no names lets the worker decide
    with pytest.raises(APIError) as caught:
        check_model("c", ("a", "b"))
    assert caught.value.status_code == 404 and caught.value.code == "model_not_found"
    assert "a, b" in caught.value.message
    assert models_body(["a"], 7) == {
        "object": "list",
        "data": [{"id": "a", "object": "model", "created": 7, "owned_by": "tokenfront", "root": "a"}],
    }
