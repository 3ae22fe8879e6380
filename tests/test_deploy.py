"""The deployment files under deploy/ (docs/deployment.md), checked without a container engine or a cluster.

- Every Kubernetes manifest validates against the Kubernetes 1.30 schemas, strictly (an unknown field is an
  error), offline: `kubernetes-validate` ships the schemas.
- Every flag a container passes (the manifests' `command`/`args`, the Dockerfiles' `ENTRYPOINT`/`CMD`) exists in
  the `--help` of the tokenfront command it runs, read from real `tokenfront render|serve|route --help` calls;
  values of choice flags are among the choices, and required flags are given.
- The pieces fit: ports, probes and Services agree with `--port`; the routers find the workers by their headless
  Service and each other by theirs; the three tiers pass the same rendering options; keys come from the Secret through the variables the commands read.
- The Dockerfiles: the renderer's never installs the `worker` extra (no torch), the worker's pins the torch
  that pyproject.toml pins; and the package's own dependencies (the renderer image's) never reach torch.
- `test_manifests_run` (slow) starts the three commands with the manifests' own args and environment (only the
  model folder, the worker address, the replica-sync endpoints and the port changed) and sends a request through them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
MANIFESTS = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
# Image name (the last part of the reference, before the tag) -> the Dockerfile that builds it.
DOCKERFILES = {"tokenfront-renderer": "renderer.Dockerfile", "tokenfront-worker": "worker.Dockerfile"}
WORKLOAD_KINDS = ("Deployment", "StatefulSet")


# ---- `tokenfront <command> --help`, parsed ----


@dataclass(frozen=True)
class Option:
    """One long option as `--help` shows it."""

    name: str
    arity: str  # "0" (a switch), "1" (one value) or "+" (one or more values)
    choices: tuple[str, ...] | None
    section: str
    default: str | None


@dataclass(frozen=True)
class CommandHelp:
    """What `tokenfront COMMAND --help` says: its options, the required ones, the variables it reads."""

    command: str
    options: dict[str, Option]
    required: frozenset[str]
    environment: frozenset[str]


# `  --flag`, `  --flag VALUE`, `  --flag {a,b}`, `  --flag VALUE [VALUE ...]`, `  -h, --help`, each followed by
# two spaces and the help text, or by the end of the line (the text then starts on the next line).
OPTION_LINE = re.compile(r"^  (?:-\w, )?(--[a-z0-9][a-z0-9-]*)(?: (\S+(?: \[\S+ \.\.\.\])?))?(?: {2,}(.*)|$)")
SECTION_LINE = re.compile(r"^(\S.*):$")


def parse_help(command: str, text: str) -> CommandHelp:
    """Read the options (with arity, choices, section and default), the required ones and the variables."""
    usage, _, body = text.partition("\n\n")
    options: dict[str, Option] = {}
    texts: dict[str, list[str]] = {}
    metavars: dict[str, str | None] = {}
    sections: dict[str, str] = {}
    section = ""
    current: str | None = None
    for line in body.splitlines():
        if match := SECTION_LINE.match(line):
            section, current = match.group(1), None
        elif match := OPTION_LINE.match(line):
            current = match.group(1)
            metavars[current] = match.group(2)
            sections[current] = section
            texts[current] = [match.group(3) or ""]
        elif current is not None and line.startswith(" " * 8):
            texts[current].append(line.strip())
    for name, metavar in metavars.items():
        arity = "0" if metavar is None else "+" if metavar.endswith("...]") else "1"
        choices = tuple(metavar[1:-1].split(",")) if metavar and metavar.startswith("{") else None
        default = re.search(r"\(default: ([^)]*)\)", " ".join(texts[name]))
        options[name] = Option(name, arity, choices, sections[name], default.group(1) if default else None)
    # Required options are the ones outside every bracket of the usage line.
    depth, required = 0, set()
    for token in re.finditer(r"\[|\]|(?<![\w-])--[a-z][a-z0-9-]*", usage):
        if token.group() == "[":
            depth += 1
        elif token.group() == "]":
            depth -= 1
        elif depth == 0:
            required.add(token.group())
    environment = frozenset(re.findall(r"\bTOKENFRONT_[A-Z_]+\b", text))
    return CommandHelp(command, options, frozenset(required), environment)


@functools.cache
def command_help(command: str) -> CommandHelp:
    """`tokenfront COMMAND --help` from the installed console script (what the images' ENTRYPOINT runs)."""
    script = Path(sys.executable).parent / "tokenfront"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "tokenfront.cli"]
    result = subprocess.run(
        [*argv, command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
        check=True,
    )
    parsed = parse_help(command, result.stdout)
    assert "--port" in parsed.options and "--model" in parsed.options, result.stdout
    return parsed


# ---- checking one container's argv ----


class FlagError(AssertionError):
    """A flag the command does not have, a value it does not accept, or a required flag missing."""


@dataclass
class Invocation:
    """A parsed `tokenfront COMMAND ...` argv: every value given to each flag, in order."""

    command: str
    values: dict[str, list[list[str]]]
    flags_checked: int
    choices_checked: int

    def last(self, flag: str) -> str | None:
        """The flag's effective value (argparse: the last occurrence wins), or None when not given."""
        given = self.values.get(flag)
        return given[-1][0] if given else None

    def every(self, flag: str) -> list[str]:
        """Every value of a repeatable flag (--worker), in order."""
        return [value for values in self.values.get(flag, []) for value in values]


def check_argv(argv: list[str], where: str) -> Invocation:
    """Check `argv` (`tokenfront COMMAND ARGS...`) against the command's `--help`; raise FlagError if wrong."""
    if len(argv) < 2 or argv[0] != "tokenfront":
        raise FlagError(f"{where}: does not run `tokenfront COMMAND`: {argv}")
    spec = command_help(argv[1])
    values: dict[str, list[list[str]]] = {}
    flags = choices = 0
    rest = argv[2:]
    index = 0
    while index < len(rest):
        arg = rest[index]
        if not arg.startswith("--"):
            raise FlagError(
                f"{where}: `{arg}` is not a flag (tokenfront {spec.command} takes no positionals)"
            )
        name, equals, inline = arg.partition("=")
        option = spec.options.get(name)
        if option is None:
            raise FlagError(f"{where}: `tokenfront {spec.command} --help` has no {name}")
        index += 1
        if option.arity == "0":
            if equals:
                raise FlagError(f"{where}: {name} takes no value")
            given: list[str] = []
        elif equals:
            given = [inline]
        else:
            given = []
            while index < len(rest) and not rest[index].startswith("--"):
                given.append(rest[index])
                index += 1
                if option.arity == "1":
                    break
            if not given:
                raise FlagError(f"{where}: {name} needs a value")
        if option.choices is not None:
            for value in given:
                if value not in option.choices:
                    raise FlagError(f"{where}: {name} {value!r} is not one of {option.choices}")
                choices += 1
        values.setdefault(name, []).append(given)
        flags += 1
    missing = spec.required - values.keys()
    if missing:
        raise FlagError(f"{where}: tokenfront {spec.command} requires {sorted(missing)}")
    return Invocation(spec.command, values, flags, choices)


# ---- Dockerfiles ----


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str

    def exec_form(self) -> list[str]:
        """The JSON (exec) form's list; a shell form is a failure, as `tokenfront` would run under `sh -c`."""
        assert self.value.startswith("["), f"{self.keyword} is not in exec form: {self.value}"
        parsed = json.loads(self.value)
        assert isinstance(parsed, list) and all(isinstance(item, str) for item in parsed), self.value
        return parsed


def read_dockerfile(path: Path) -> list[Instruction]:
    """Instructions in order: comments dropped, `\\` continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        pending += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            keyword, _, value = pending.partition(" ")
            instructions.append(Instruction(keyword.upper(), value.strip()))
            pending = ""
    assert not pending, f"{path.name}: a continuation runs past the end"
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the last stage (the image that runs)."""
    starts = [index for index, instruction in enumerate(instructions) if instruction.keyword == "FROM"]
    return instructions[starts[-1] :]


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [instruction for instruction in stage if instruction.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, found {found}"
    return found[0]


@functools.cache
def image_argv(image: str) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of the image a manifest names, read from the Dockerfile that builds it."""
    stage = final_stage(read_dockerfile(DEPLOY / dockerfile_of(image)))
    return only(stage, "ENTRYPOINT").exec_form(), only(stage, "CMD").exec_form()


def dockerfile_of(image: str) -> str:
    name, _, tag = image.rpartition("/")[2].partition(":")
    assert name in DOCKERFILES, f"image {image}: no Dockerfile under deploy/ builds {name}"
    assert tag == importlib.metadata.version("tokenfront"), f"image {image}: tag is not the package version"
    return DOCKERFILES[name]


# ---- manifests ----


def manifest_files() -> list[Path]:
    return sorted(path for path in MANIFESTS.glob("*.yaml") if path.name != "kustomization.yaml")


@functools.cache
def documents() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file name, document) for every document of every manifest."""
    found = []
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                found.append((path.name, document))
    return tuple(found)


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in documents() if document["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    found = [document for document in of_kind(kind) if document["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Container:
    workload: dict[str, Any]
    spec: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']} container {self.spec['name']}"

    @property
    def pod(self) -> dict[str, Any]:
        return dict(self.workload["spec"]["template"]["spec"])

    def argv(self) -> list[str]:
        """What the container runs, as Kubernetes resolves it: `command` replaces ENTRYPOINT (and drops CMD);
        `args` replaces CMD."""
        entrypoint, cmd = image_argv(self.spec["image"])
        if "command" in self.spec:
            return [*self.spec["command"], *self.spec.get("args", [])]
        return [*entrypoint, *self.spec.get("args", cmd)]

    def invocation(self) -> Invocation:
        return check_argv(self.argv(), self.where)


def containers() -> list[Container]:
    found = []
    for kind in WORKLOAD_KINDS:
        for workload in of_kind(kind):
            for spec in workload["spec"]["template"]["spec"]["containers"]:
                found.append(Container(workload, spec))
    return found


def by_command() -> dict[str, Container]:
    found = {container.invocation().command: container for container in containers()}
    assert len(found) == len(containers()), "two containers run the same tokenfront command"
    return found


def resolve_port(port: int | str, container: dict[str, Any]) -> int:
    """A probe's or a Service's target port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    numbers = [entry["containerPort"] for entry in container.get("ports", []) if entry.get("name") == port]
    assert len(numbers) == 1, f"container {container['name']} has no port named {port}"
    return int(numbers[0])


# ---- the tests ----


def test_manifests_validate_against_kubernetes_schemas() -> None:
    validated = Counter()
    for file_name, document in documents():
        try:
            version = kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            pytest.fail(
                f"{file_name}: {document['kind']} {document['metadata']['name']}: {path}: {exc.message}"
            )
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{file_name}: {exc.message}")
        assert version == "1.30"
        validated[document["kind"]] += 1
    assert validated == {
        "Namespace": 1,
        "PersistentVolumeClaim": 1,
        "Deployment": 1,
        "StatefulSet": 2,
        "Service": 4,
        "HorizontalPodAutoscaler": 1,
    }
    assert sum(validated.values()) == 10


def test_the_guides_yaml_validates() -> None:
    """The Pod docs/deployment.md shows for filling the model volume is valid too."""
    guide = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", guide, flags=re.DOTALL)
    kinds = []
    for block in blocks:
        for document in yaml.safe_load_all(block):
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
            kinds.append(document["kind"])
            # It mounts the claim the workloads read.
            claims = [volume["persistentVolumeClaim"]["claimName"] for volume in document["spec"]["volumes"]]
            assert claims == [named("PersistentVolumeClaim", "tokenfront-models")["metadata"]["name"]]
    assert kinds == ["Pod"]


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The validation can fail: a misspelt probe field, a string where an integer belongs."""
    deployment = json.loads(json.dumps(named("Deployment", "tokenfront-renderer")))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    autoscaler = json.loads(json.dumps(named("HorizontalPodAutoscaler", "tokenfront-renderer")))
    autoscaler["spec"]["minReplicas"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError, match="not of type"):
        kubernetes_validate.validate(autoscaler, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text(encoding="utf-8"))
    assert sorted(kustomization["resources"]) == [path.name for path in manifest_files()]
    assert len(kustomization["resources"]) == 5
    assert kustomization["namespace"] == named("Namespace", "tokenfront")["metadata"]["name"]
    # Namespaced documents carry none of their own: the kustomization puts them all in one.
    assert all("namespace" not in document["metadata"] for _, document in documents())


def test_every_flag_exists_in_the_commands_help() -> None:
    invocations = {container.where: container.invocation() for container in containers()}
    commands = Counter(invocation.command for invocation in invocations.values())
    assert commands == {"render": 1, "route": 1, "serve": 1}
    flags = {where: invocation.flags_checked for where, invocation in invocations.items()}
    assert flags == {
        "Deployment/tokenfront-renderer container renderer": 7,
        "StatefulSet/tokenfront-router container router": 14,
        "StatefulSet/tokenfront-worker container worker": 10,
    }
    # --policy kv_cache_aware (route) and --device cpu (serve) are choice flags.
    assert sum(invocation.choices_checked for invocation in invocations.values()) == 2
    for where, invocation in invocations.items():
        # The command's default host (127.0.0.1) is unreachable from outside the pod.
        assert invocation.last("--host") == "0.0.0.0", where
        # Keys come from the Secret through the environment, never as a visible argument.
        assert "--api-key" not in invocation.values and "--worker-api-key" not in invocation.values, where


def test_dockerfile_commands_exist_in_the_commands_help() -> None:
    checked = {}
    for image, dockerfile in DOCKERFILES.items():
        entrypoint, cmd = image_argv(f"{image}:{importlib.metadata.version('tokenfront')}")
        invocation = check_argv([*entrypoint, *cmd], dockerfile)
        stage = final_stage(read_dockerfile(DEPLOY / dockerfile))
        assert only(stage, "EXPOSE").value == invocation.last("--port"), dockerfile
        assert invocation.last("--host") == "0.0.0.0", dockerfile
        checked[dockerfile] = (invocation.command, invocation.flags_checked)
    assert checked == {"renderer.Dockerfile": ("render", 3), "worker.Dockerfile": ("serve", 3)}


def test_a_wrong_flag_fails_loudly() -> None:
    """The checker itself: what it must refuse, it refuses, naming the flag."""
    good = ["tokenfront", "route", "--policy", "round_robin", "--worker", "http://a:1", "--port", "8080"]
    assert check_argv(good, "example").flags_checked == 3
    wrong = {
        "has no --no-such-flag": [*good, "--no-such-flag", "1"],
        "'fastest' is not one of": ["tokenfront", "route", "--policy", "fastest"],
        "--port needs a value": ["tokenfront", "route", "--port"],
        "--access-log takes no value": ["tokenfront", "route", "--access-log=yes"],
        "is not a flag": ["tokenfront", "route", "8080"],
        r"requires \['--model'\]": ["tokenfront", "render", "--port", "8100"],
        "has no --tokens-per-block": ["tokenfront", "render", "--model", "m", "--tokens-per-block", "16"],
    }
    for message, argv in wrong.items():
        with pytest.raises(FlagError, match=message):
            check_argv(argv, "example")
    with pytest.raises(subprocess.CalledProcessError):
        command_help("no-such-command")


def _listening_port(container: Container, port_name: str) -> int:
    """The port a command listens on for a named container port: `http` is `--port`; `replica-sync` is the
    port of the router's `--replica-sync-bind tcp://*:PORT`."""
    invocation = container.invocation()
    if port_name == "replica-sync":
        bind = invocation.last("--replica-sync-bind") or ""
        assert bind.startswith("tcp://*:"), f"{container.where}: --replica-sync-bind {bind!r}"
        return int(bind.rpartition(":")[2])
    assert port_name == "http", f"{container.where}: no rule for a port named {port_name}"
    return int(invocation.last("--port") or 0)


def test_ports_probes_and_services_agree_with_port() -> None:
    probes = services = 0
    for container in containers():
        port = _listening_port(container, "http")
        assert resolve_port("http", container.spec) == port, container.where
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            check = container.spec[probe]["httpGet"]
            assert check["path"] == "/health", container.where
            assert resolve_port(check["port"], container.spec) == port, f"{container.where} {probe}"
            probes += 1
        for entry in container.spec["ports"]:
            assert entry["containerPort"] == _listening_port(container, entry["name"]), container.where
    for service in of_kind("Service"):
        selector = service["spec"]["selector"]
        matching = [
            container
            for container in containers()
            if selector.items() <= container.workload["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, f"Service {service['metadata']['name']} selects {len(matching)} workloads"
        (target,) = matching
        assert selector == target.workload["spec"]["selector"]["matchLabels"]
        for entry in service["spec"]["ports"]:
            listening = _listening_port(target, entry["targetPort"])
            assert resolve_port(entry["targetPort"], target.spec) == listening, service["metadata"]["name"]
            services += 1
    assert (probes, services) == (9, 4)


def test_routers_find_the_workers_and_each_other_through_headless_services() -> None:
    """The routers follow the worker pods by DNS (the workers' headless Service: one A record per ready pod),
    and each replica names every router pod as a replica-sync peer (itself included: it ignores its own
    messages), through the routers' own headless Service."""
    workers = named("StatefulSet", "tokenfront-worker")
    headless = named("Service", workers["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert not headless["spec"].get("publishNotReadyAddresses", False)  # a worker joins when it is ready
    route = by_command()["route"]
    worker_port = by_command()["serve"].invocation().last("--port")
    invocation = route.invocation()
    assert invocation.every("--worker-dns") == [f"{headless['metadata']['name']}:{worker_port}"]
    assert invocation.every("--worker") == []

    routers = route.workload
    assert routers["kind"] == "StatefulSet"
    peers = named("Service", routers["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["publishNotReadyAddresses"] is True  # a starting replica is heard while it warms up
    sync_port = _listening_port(route, "replica-sync")
    expected = [
        f"tcp://{routers['metadata']['name']}-{ordinal}.{peers['metadata']['name']}:{sync_port}"
        for ordinal in range(routers["spec"]["replicas"])
    ]
    assert invocation.every("--replica-peer") == expected
    assert len(expected) == 3


def test_every_tier_passes_the_same_rendering_options() -> None:
    """A renderer, router and worker render alike only with the same rendering options (the fingerprint
    would say they differ, and the routers would stop forwarding ids)."""
    rendering = {
        name
        for name, option in command_help("render").options.items()
        if option.section.startswith("rendering")
    }
    assert {"--model", "--chat-template", "--reasoning-parser", "--tokenizer-mode"} <= rendering
    given = {}
    for command, container in by_command().items():
        # The section is the same on every command.
        section = {n for n, o in command_help(command).options.items() if o.section.startswith("rendering")}
        assert section == rendering, command
        given[command] = {
            flag: values for flag, values in container.invocation().values.items() if flag in rendering
        }
    assert given["render"] == given["route"] == given["serve"]
    assert sorted(given["render"]) == [
        "--model",
        "--reasoning-parser",
        "--served-model-name",
        "--tool-call-parser",
    ]


def test_the_model_comes_from_the_volume() -> None:
    claim = named("PersistentVolumeClaim", "tokenfront-models")
    for container in containers():
        model = container.invocation().last("--model") or ""
        mounts = {mount["name"]: mount for mount in container.spec["volumeMounts"]}
        volumes = {volume["name"]: volume for volume in container.pod["volumes"]}
        holding = [
            name for name, mount in mounts.items() if model.startswith(mount["mountPath"].rstrip("/") + "/")
        ]
        assert len(holding) == 1, f"{container.where}: --model {model} is on no mounted volume"
        assert mounts[holding[0]]["readOnly"] is True
        assert volumes[holding[0]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_keys_come_from_the_secret_through_variables_the_commands_read() -> None:
    secret_keys = set()
    for command, container in by_command().items():
        for variable in container.spec.get("env", []):
            if variable["name"].startswith("TOKENFRONT_"):
                assert variable["name"] in command_help(command).environment, (
                    f"{command} reads no {variable['name']}"
                )
            reference = variable.get("valueFrom", {}).get("secretKeyRef")
            if reference:
                secret_keys.add((reference["name"], reference["key"]))
    assert secret_keys == {("tokenfront-api-keys", "api-key"), ("tokenfront-api-keys", "worker-api-key")}
    # The guide's command creates that Secret with those keys.
    guide = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    assert "kubectl -n tokenfront create secret generic tokenfront-api-keys" in guide
    for _, key in secret_keys:
        assert f"--from-literal={key}=" in guide
    # What the routers send the workers is what the workers require.
    route_env = {
        v["name"]: v.get("valueFrom", {}).get("secretKeyRef", {}).get("key")
        for v in by_command()["route"].spec["env"]
    }
    serve_env = {
        v["name"]: v.get("valueFrom", {}).get("secretKeyRef", {}).get("key")
        for v in by_command()["serve"].spec["env"]
    }
    assert route_env["TOKENFRONT_WORKER_API_KEY"] == serve_env["TOKENFRONT_API_KEY"] == "worker-api-key"


def test_router_and_renderer_remember_fingerprints_on_a_volume() -> None:
    """A restarted container reads its fingerprint's tokenizer hashes back (core/fingerprint_cache.py)."""
    for command in ("render", "route"):
        container = by_command()[command]
        env = {v["name"]: v.get("value") for v in container.spec["env"]}
        mounts = {mount["mountPath"]: mount["name"] for mount in container.spec["volumeMounts"]}
        volumes = {volume["name"]: volume for volume in container.pod["volumes"]}
        assert env["TOKENFRONT_CACHE"] == "/cache", command
        assert "emptyDir" in volumes[mounts["/cache"]], command


def test_shutdown_fits_in_the_grace_period() -> None:
    for command, container in by_command().items():
        timeout = (
            container.invocation().last("--shutdown-timeout")
            or command_help(command).options["--shutdown-timeout"].default
        )
        pre_stop = container.spec.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        sleep = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
        grace = container.pod["terminationGracePeriodSeconds"]
        assert grace > sleep + int(timeout or 0) >= 30, f"{command}: {grace} s for {sleep} s + {timeout} s"


def test_the_autoscaler_scales_the_renderer_on_cpu() -> None:
    autoscaler = named("HorizontalPodAutoscaler", "tokenfront-renderer")
    target = autoscaler["spec"]["scaleTargetRef"]
    renderer = named(target["kind"], target["name"])
    assert by_command()["render"].workload is renderer
    # The autoscaler owns the replica count; an apply must not reset it.
    assert "replicas" not in renderer["spec"]
    (metric,) = autoscaler["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # Utilization is a share of the request: without one the autoscaler cannot compute it.
    assert by_command()["render"].spec["resources"]["requests"]["cpu"]
    assert 1 <= autoscaler["spec"]["minReplicas"] < autoscaler["spec"]["maxReplicas"]


def test_pods_run_as_the_images_user() -> None:
    users = {}
    for image, dockerfile in DOCKERFILES.items():
        users[image] = only(final_stage(read_dockerfile(DEPLOY / dockerfile)), "USER").value
        assert users[image].isdigit() and int(users[image]) != 0, dockerfile
    for container in containers():
        image = container.spec["image"].rpartition("/")[2].partition(":")[0]
        assert container.pod["securityContext"]["runAsNonRoot"] is True
        assert str(container.pod["securityContext"]["runAsUser"]) == users[image], container.where
        assert container.spec["securityContext"]["allowPrivilegeEscalation"] is False


def test_dockerfiles_build_what_they_say() -> None:
    pins = {
        Requirement(text).name: Requirement(text) for text in importlib.metadata.requires("tokenfront") or []
    }
    torch_pin = str(pins["torch"].specifier)
    for dockerfile in DOCKERFILES.values():
        instructions = read_dockerfile(DEPLOY / dockerfile)
        assert instructions[0].keyword == "FROM" and instructions[0].value.startswith("python:3.11-slim")
        assert [i.value.split()[-1] for i in instructions if i.keyword == "FROM"] == [
            "build",
            "python:3.11-slim",
        ]
        assert only(final_stage(instructions), "ENTRYPOINT").exec_form()[0] == "tokenfront"
        run_lines = [i.value for i in instructions if i.keyword == "RUN"]
        runs = " ".join(run_lines)
        arguments = {
            i.value.split("=")[0]: i.value.split("=", 1)[1] for i in instructions if i.keyword == "ARG"
        }
        if dockerfile == "renderer.Dockerfile":
            # The renderer and router image: the package alone, never the worker extra or torch.
            assert "torch" not in runs and "worker" not in runs and not arguments
            assert "/opt/venv/bin/pip install --no-cache-dir ." in run_lines
        else:
            assert 'pip install --no-cache-dir ".[worker]"' in runs
            assert '"torch==$TORCH_VERSION"' in runs and f"=={arguments['TORCH_VERSION']}" == torch_pin
            assert arguments["TORCH_INDEX_URL"].endswith("/whl/cpu")
        # What the build copies is in the build context (.dockerignore lets in only what is named).
        ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        for copy in (i for i in instructions if i.keyword == "COPY" and not i.value.startswith("--from")):
            for source in copy.value.split()[:-1]:
                assert (ROOT / source).exists() and f"!{source}" in ignore, f"{dockerfile}: COPY {source}"


def _requirement_closure(roots: list[Requirement]) -> set[str]:
    """Every installed distribution `roots` pull in (markers evaluated here, with no extra below the roots)."""
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        requirement = pending.pop()
        name = requirement.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here (a platform marker, or an optional import): nothing below it
        for text in requires:
            nested = Requirement(text)
            if nested.marker is None or nested.marker.evaluate({"extra": ""}):
                pending.append(nested)
    return seen


def test_the_renderer_images_dependencies_never_reach_torch() -> None:
    """`pip install .` (the renderer image) pulls no torch, however deep: walked over installed metadata."""
    requirements = [Requirement(text) for text in importlib.metadata.requires("tokenfront") or []]
    base = [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]
    worker = [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": "worker"})]
    without = _requirement_closure(base)
    assert "transformers" in without and "tokenizers" in without and len(without) > 40
    assert "torch" not in without, "a dependency of the renderer image pulls in torch"
    # The walk does find torch when it is there to find.
    assert "torch" in _requirement_closure(base + worker)


@pytest.mark.slow
def test_manifests_run(
    server_factory: Callable[..., Any],
    checkpoint: Callable[[str], Path],
    pick_port: Callable[[], int],
    tmp_path: Path,
) -> None:
    """The three commands started with the manifests' args and Secret-fed environment, on SmolLM2 (a model the
    machine has) instead of Qwen3-0.6B: the keys are wired right and the routers forward ids to the worker."""
    model = str(checkpoint("smollm2"))
    secret = {"api-key": "client-key-for-test", "worker-api-key": "worker-key-for-test"}
    containers_by_command = by_command()

    def start(command: str, replace: dict[str, list[str]]) -> Any:
        container = containers_by_command[command]
        argv = container.argv()[1:]
        for flag, values in {"--model": [model], **replace}.items():
            argv = _replace_flag(argv, flag, values)
        env = {}
        for variable in container.spec.get("env", []):
            reference = variable.get("valueFrom", {}).get("secretKeyRef")
            env[variable["name"]] = secret[reference["key"]] if reference else variable["value"]
        # server_factory appends --host 127.0.0.1 --port FREE; the last occurrence wins.
        return server_factory(*argv, env=env)

    worker = start("serve", {})
    renderer = start("render", {})
    # The manifests' DNS name and peer names resolve only in the cluster: the worker by its address, the
    # replica sync on a loopback port, the router its own only peer.
    sync = f"tcp://127.0.0.1:{pick_port()}"
    router = start(
        "route",
        {
            "--worker-dns": [],
            "--worker": [worker.url],
            "--replica-sync-bind": [sync],
            "--replica-peer": [sync],
        },
    )

    client = {"Authorization": f"Bearer {secret['api-key']}"}
    worker_key = {"Authorization": f"Bearer {secret['worker-api-key']}"}
    for server in (renderer, router, worker):
        assert httpx.get(f"{server.url}/health").status_code == 200  # the probes' path needs no key
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert (
        httpx.get(f"{worker.url}/v1/models", headers=client).status_code == 401
    )  # the clients' key is not it
    models = httpx.get(f"{renderer.url}/v1/models", headers=client).json()
    assert [entry["id"] for entry in models["data"]] == ["Qwen3-0.6B"]

    digests = {
        server.url: httpx.get(f"{server.url}/server_info", headers=headers).json()["render_fingerprint"][
            "digest"
        ]
        for server, headers in ((renderer, client), (router, client), (worker, worker_key))
    }
    assert len(set(digests.values())) == 1, digests
    for state in _poll_workers(router.url, client):
        if state["gate"]["forwarding"] and state["workers"][0]["state"] == "healthy":
            break
    body = {"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    answer = httpx.post(f"{router.url}/v1/chat/completions", json=body, headers=client, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-tokenfront-forwarded"] == "true"
    assert answer.headers["x-tokenfront-worker"] == worker.url
    rendered = httpx.post(f"{renderer.url}/v1/chat/completions/render", json=body, headers=client).json()
    assert answer.json()["usage"]["prompt_tokens"] == len(rendered["token_ids"]) > 0


def _replace_flag(argv: list[str], flag: str, values: list[str]) -> list[str]:
    """argv with every occurrence of `flag VALUE` dropped and `flag V` appended for each of `values`."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        else:
            kept.append(arg)
    for value in values:
        kept += [flag, value]
    return kept


def _poll_workers(url: str, headers: dict[str, str]) -> Iterator[dict[str, Any]]:
    """GET /workers until the caller stops asking; fails after 60 s of asking."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        yield httpx.get(f"{url}/workers", headers=headers).json()
        time.sleep(0.2)
    pytest.fail(
        f"the router never had its worker active and forwarding: {httpx.get(f'{url}/workers', headers=headers).text}"
    )
