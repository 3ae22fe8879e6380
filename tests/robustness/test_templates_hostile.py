"""Hostile chat templates (issue 10, item 1): with `--allow-request-chat-template` a client sends template code, and
each template below once took the process down or held it for minutes (`{{ 'x' * 10**10 }}` grew it to ~19 GB,
`{{ (10**(10**8)) % 7 }}` ran for minutes, 200 nested parentheses were a 500...). Each is now a 400 whose message
names the limit it hit (core/template_limits.py), answered quickly and within a bounded memory, and the server
keeps serving: `/health` answers right after, and while a long render runs.

Each template goes through the real pipeline in this process, and through a real `tokenfront render
--allow-request-chat-template` process on loopback (started with the root conftest's `start_server`, found by
path: a bare `from conftest import` would find whichever conftest pytest loaded last), whose RSS is read from
/proc after each. Times are measured and printed (`pytest -s`), never asserted.

Also: the sandbox still refuses escapes, template syntax inside message content renders as text, and the limits
leave real requests alone (the checkpoint's own template sent per request renders the same ids; a request
larger than the limits' floors still renders).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenfront import RenderOptions, RenderPipeline
from tokenfront.core import template_limits, templates
from tokenfront.core.errors import RenderError
from tokenfront.protocol import ChatCompletionRequest

CHAT_RENDER = "/v1/chat/completions/render"
HI = [{"role": "user", "content": "hi"}]
MAX_RSS_BYTES = 2 * 1024**3
MAX_RSS_GROWTH_BYTES = 512 * 1024**2

VALUE = "value size limit"
WORK = "render work limit"
STEPS = "render step limit"
SOURCE = f"limit of {template_limits.MAX_TEMPLATE_CHARS} characters for a chat template"
NESTING = "too deeply to compile"


@dataclass(frozen=True)
class Hostile:
    name: str
    source: str
    limit: str  # a phrase the 400's message must contain: the limit it names

    def __str__(self) -> str:
        return self.name


def _doubling(operator: str) -> str:
    return (
        "{% set ns = namespace(s='x') %}{% for i in range(100) %}"
        f"{{% set ns.s = ns.s {operator} ns.s %}}{{% endfor %}}{{{{ ns.s | length }}}}"
    )


def _shared(output: str) -> str:
    # Each list holds the previous one twice: 60 levels are 2**60 copies of the string when written out.
    return (
        "{% set ns = namespace(l=['x' * 1000]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}"
        "{% endfor %}{{ " + output + " }}"
    )


HOSTILE = [
    # The issue's own list.
    Hostile("repeat_1e10", "{{ 'x' * 10**10 }}", VALUE),
    Hostile("repeat_1e8", "{{ 'x' * 10**8 }}", VALUE),
    Hostile("huge_power", "{{ (10**(10**8)) % 7 }}", "integer size limit"),
    Hostile(
        "nested_ranges",
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        STEPS,
    ),
    Hostile("tojson_indent", "{{ messages | tojson(indent=10**7) }}", "tojson's indent"),
    Hostile("nested_parentheses", "{{ " + "(" * 200 + "1" + ")" * 200 + " }}", NESTING),
    Hostile("chained_filters_100k", "{{ 'x'" + " | trim" * 100_000 + " }}", SOURCE),
    Hostile("chained_filters_20k", "{{ 'x'" + "|e" * 20_000 + " }}", NESTING),
    Hostile(
        "nested_for_25",
        "".join(f"{{% for i{depth} in range(2) %}}" for depth in range(25)) + "x" + "{% endfor %}" * 25,
        NESTING,
    ),
    Hostile("half_megabyte", ("{{ messages[0].content }}\n" * 20_000)[: 512 * 1024], SOURCE),
    # The same ideas by other routes.
    Hostile(
        "nested_ranges_writing",
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}",
        WORK,  # each output counts its memory, so this stops before the step limit
    ),
    Hostile(
        "filtered_loops",
        "{% for a in range(100000) %}{% for b in range(100000) if false %}{% endfor %}{% endfor %}",
        STEPS,
    ),
    Hostile("doubling_tilde", _doubling("~"), VALUE),
    Hostile("doubling_plus", _doubling("+"), VALUE),
    Hostile("shared_lists_written", _shared("ns.l"), VALUE),
    Hostile("shared_lists_tojson", _shared("ns.l | tojson"), VALUE),
    Hostile("shared_lists_joined", _shared("ns.l | join"), VALUE),
    Hostile("center", "{{ 'x' | center(10**10) }}", VALUE),
    Hostile("ljust", "{{ 'x'.ljust(1000000000) }}", VALUE),
    Hostile("format_width", "{{ '{:>1000000000}'.format(1) }}", VALUE),
    Hostile("format_nested_width", "{{ '{:{}}'.format('x', 10**9) }}", VALUE),
    Hostile("percent_width", "{{ '%1000000000d' % 1 }}", VALUE),
    Hostile("join_separator", "{{ range(100000) | join('x' * 100000) }}", VALUE),
    Hostile("replace_empty", "{{ ('x' * 1000000).replace('', 'y' * 10000) }}", VALUE),
    Hostile("to_bytes", "{{ (1).to_bytes(10**9, 'big') }}", VALUE),
    Hostile("lipsum", "{{ lipsum(10**6) }}", VALUE),
    Hostile("fromkeys", "{{ dict.fromkeys(range(100000), 'x' * 1000000) | tojson }}", VALUE),
    Hostile(
        "encode_chain",
        "{% set ns = namespace(s='\\u00e9' * 1000) %}{% for i in range(40) %}"
        "{% set ns.s = ns.s.encode('utf-32').decode('latin-1') %}{% endfor %}{{ ns.s | length }}",
        VALUE,
    ),
    Hostile(
        "slices_kept",
        "{% set s = 'x' * 10000000 %}{% for i in range(1000) %}"
        "{% set l = [s[1:], s[2:], s[3:], s[4:], s[5:], s[6:], s[7:], s[8:]] %}{% endfor %}",
        WORK,
    ),
    Hostile("mapped_padding", "{{ range(100000) | map('center', 10000000) | list | length }}", WORK),
    Hostile(
        "mapped_defaults",
        "{{ range(100000) | map(attribute='nope') | map('default', 'x' * 1000000) | join }}",
        WORK,
    ),
    Hostile("big_integers", "{{ ('9' * 4000) | int * ('9' * 4000) | int }}", "integer size limit"),
    Hostile("sort_millions", "{{ ('ab' * 2500000) | list | sort | length }}", "list size limit"),
    Hostile("repeat_list", "{{ ([1] * 10**8) | length }}", "list size limit"),
    Hostile(
        "wordwrap_megabytes", "{{ ('word ' * 1600000) | wordwrap(10) | length }}", "characters for wordwrap"
    ),
    Hostile(  # Jinja computes autoescape expressions while compiling: these are computed when rendering
        "autoescape_folding",
        "{% autoescape ('x' | center(16000000)) is string %}y{% endautoescape %}" * 1000,
        WORK,
    ),
]

# Escapes the sandbox refuses: each is a 400, or renders nothing of the interpreter's internals.
ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ dict.__class__.__subclasses__() }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ ''.format.__globals__ }}",
    "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "{{ (1).__class__.__base__.__subclasses__() }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}{{ ns }}",
    "{{ messages.append(1) }}",
]
LEAKS = ("<class", "<function", "<module", "<built-in", "__builtins__", "uid=")

# Template syntax a user may type, which must reach the prompt as text.
LITERAL = "{{ 7 * 7 }} {% for x in range(3) %}X{% endfor %} {{ ''.__class__ }} {{ lipsum(10**9) }} {#c#}"


def _render(pipeline: RenderPipeline, source: str | None, messages: list[dict[str, Any]] = HI) -> Any:
    body: dict[str, Any] = {"messages": messages}
    if source is not None:
        body["chat_template"] = source
    return pipeline.render_chat(ChatCompletionRequest.model_validate(body))


def _rss(pid: int | str = "self") -> tuple[int, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


@pytest.fixture(scope="module")
def pipeline(qwen3: Path) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(qwen3), allow_request_chat_template=True))


@pytest.fixture(scope="module")
def server(
    launch: Callable[..., Any], qwen3: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    server = launch(
        ["render", "--model", str(qwen3), "--allow-request-chat-template"],
        log_dir=tmp_path_factory.mktemp("hostile-templates"),
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


# -- the real pipeline, in this process --------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE, ids=str)
def test_hostile_template_is_a_400_naming_its_limit(pipeline: RenderPipeline, hostile: Hostile) -> None:
    # This process holds whatever the test session loaded before (several GB in a full run): its growth is
    # what this render left behind. The server test below checks a real renderer's peak (VmHWM).
    before, _ = _rss()
    start = time.perf_counter()
    with pytest.raises(RenderError) as caught:
        _render(pipeline, hostile.source)
    elapsed = time.perf_counter() - start
    error = caught.value
    assert error.status_code == 400
    assert hostile.limit in error.message, error.message
    rss, _ = _rss()
    growth = rss - before
    print(
        f"\n[pipeline] {hostile.name}: 400 in {elapsed:.2f} s, RSS +{growth / 2**20:.0f} MB: {error.message[:120]}"
    )
    assert growth < MAX_RSS_GROWTH_BYTES


def test_a_failed_compile_is_remembered(pipeline: RenderPipeline) -> None:
    source = "{{ " + "(" * 300 + "1" + ")" * 300 + " }}"
    hits = templates.compile_cache_info().hits
    for _ in range(3):
        with pytest.raises(RenderError, match=NESTING):
            _render(pipeline, source)
    assert templates.compile_cache_info().hits == hits + 2


def test_any_compile_failure_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(templates.ENVIRONMENT, "compile", out_of_memory)
    with pytest.raises(RenderError, match="too large to compile") as caught:
        templates.ChatTemplate("{{ messages }}")
    assert caught.value.status_code == 400 and caught.value.param == "chat_template"


@pytest.mark.parametrize("source", ESCAPES)
def test_the_sandbox_still_refuses_escapes(pipeline: RenderPipeline, source: str) -> None:
    try:
        text = _render(pipeline, source).prompt_text
    except RenderError as error:
        assert error.status_code == 400
        return
    assert not any(leak in text for leak in LEAKS), text[:300]


def test_template_syntax_in_content_renders_as_text(pipeline: RenderPipeline) -> None:
    rendered = _render(pipeline, None, [{"role": "user", "content": LITERAL}])  # the checkpoint's template
    assert LITERAL in rendered.prompt_text and "49" not in rendered.prompt_text
    assert _render(
        pipeline, "{{ messages[0]['content'] }}", [{"role": "user", "content": LITERAL}]
    ).prompt_text == (LITERAL)


def test_a_request_larger_than_the_floors_still_renders() -> None:
    # Past VALUE_CHARS and near WORK_CHARS / 3: the limits grow with the request, so a large real request renders.
    content = "word " * (template_limits.VALUE_CHARS // 5 + 1_000_000)
    template = templates.ChatTemplate(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    )
    text = template.render(
        [{"role": "user", "content": content}],
        tools=None,
        documents=None,
        add_generation_prompt=False,
        continue_final_message=False,
        variables={},
    )
    assert text == f"<|im_start|>user\n{content}<|im_end|>\n"


# -- a real `tokenfront render --allow-request-chat-template` process ----------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE, ids=str)
def test_server_answers_a_hostile_template_with_a_400_and_keeps_serving(
    server: Any, client: httpx.Client, hostile: Hostile
) -> None:
    start = time.perf_counter()
    response = client.post(CHAT_RENDER, json={"messages": HI, "chat_template": hostile.source})
    elapsed = time.perf_counter() - start
    rss, peak = _rss(server.process.pid)
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert hostile.limit in error["message"], error
    assert client.get("/health").status_code == 200
    print(
        f"\n[server] {hostile.name}: {response.status_code} in {elapsed:.2f} s, "
        f"RSS {rss / 2**20:.0f} MB (peak {peak / 2**20:.0f} MB)"
    )
    assert rss < MAX_RSS_BYTES and peak < MAX_RSS_BYTES


RENDER_STARTS = "tokenfront_render_wait_seconds_count"


def test_server_answers_health_while_a_long_render_runs(server: Any, client: httpx.Client) -> None:
    # The filtered loops run to the step limit (seconds): /health is answered meanwhile, off the render thread.
    source = next(h for h in HOSTILE if h.name == "filtered_loops").source
    answer: dict[str, Any] = {}

    def render() -> None:
        with httpx.Client(base_url=server.url, timeout=120) as own:
            start = time.perf_counter()
            answer["status"] = own.post(
                CHAT_RENDER, json={"messages": HI, "chat_template": source}
            ).status_code
            answer["seconds"] = time.perf_counter() - start

    def renders_started() -> float:  # calls the render thread has started (its wait histogram's count)
        text = client.get("/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(RENDER_STARTS))

    before = renders_started()
    thread = threading.Thread(target=render)
    thread.start()
    deadline = time.monotonic() + 60
    while renders_started() == before:  # the render is under way on the render thread
        assert time.monotonic() < deadline and thread.is_alive(), "the render never started"
        time.sleep(0.01)
    health = []
    while thread.is_alive():
        start = time.perf_counter()
        status = client.get("/health").status_code
        health.append((status, time.perf_counter() - start))
        time.sleep(0.1)
    thread.join()
    assert answer["status"] == 400
    assert health and all(status == 200 for status, _ in health)
    slowest = max(seconds for _, seconds in health)
    print(
        f"\n[server] /health during a {answer['seconds']:.2f} s hostile render: {len(health)} answers, "
        f"all 200, slowest {slowest * 1000:.1f} ms"
    )


@pytest.mark.parametrize("source", ESCAPES)
def test_server_refuses_escapes(client: httpx.Client, source: str) -> None:
    response = client.post(CHAT_RENDER, json={"messages": HI, "chat_template": source})
    assert response.status_code in (200, 400), response.text[:300]
    if response.status_code == 200:
        assert client.post("/tokenize", json={"messages": HI, "chat_template": source}).status_code == 200
        text = client.post("/detokenize", json={"tokens": response.json()["token_ids"]}).json()["prompt"]
        assert not any(leak in text for leak in LEAKS), text[:300]


def test_server_renders_real_templates_as_before(client: httpx.Client, qwen3: Path) -> None:
    # The checkpoint's own template, sent per request, gives the ids the server's own rendering gives; template
    # syntax in content stays text.
    source = RenderPipeline.load(RenderOptions(model=str(qwen3))).checkpoint.chat_templates.select(
        has_tools=False
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": LITERAL}]
    own = client.post(CHAT_RENDER, json={"messages": messages})
    sent = client.post(CHAT_RENDER, json={"messages": messages, "chat_template": source})
    assert own.status_code == sent.status_code == 200
    assert own.json()["token_ids"] == sent.json()["token_ids"]
    text = client.post("/detokenize", json={"tokens": own.json()["token_ids"]}).json()["prompt"]
    assert LITERAL in text
