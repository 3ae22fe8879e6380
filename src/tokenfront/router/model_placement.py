"""Which of the router's models a worker serves (docs/operations.md, "Several models").

A router serves one model or several (`route --config`), each under its served names. A worker belongs to the
model whose served name its report names (`/server_info` served_model_names or model, else `GET /v1/models`);
a worker spec's `model=NAME` pins it to that model instead. `ModelPlacement.place` decides from the names
alone, so the pool (which reads the reports) and the app (which owns the models) share one rule:

- pinned: the model it is pinned to (a report naming none of that model's names is a mismatch note);
- one model: that model, whatever the worker says (as a single-model router always did: a worker naming
  another model still answers requests that name none);
- several models: the first model one of its names belongs to; a worker naming no model of the router's, or
  no name at all, belongs to none — it is listed with the reason and gets no requests.

A model's key is its first served name ("" for a router that was given no name: it serves what its workers
report).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ModelPlacement", "Placement"]


@dataclass(frozen=True)
class Placement:
    """Where a worker belongs: its model's key (None: no model of this router), and a note saying which of
    that model's names it does not serve, or why it belongs to none (None: nothing to say)."""

    model: str | None
    note: str | None = None


class ModelPlacement:
    """The router's models by served name, and the rule that places a worker in one of them."""

    def __init__(self, models: Sequence[Sequence[str]]) -> None:
        """`models`: each model's served names, in the router's order (at least one model; a model with no
        names is a router that serves whatever its workers report, and must be alone)."""
        if not models:
            raise ValueError("a router serves at least one model")
        self.models: tuple[tuple[str, ...], ...] = tuple(tuple(names) for names in models)
        self.keys: tuple[str, ...] = tuple(names[0] if names else "" for names in self.models)
        # Every served name -> its model's key: one dict lookup per name, whatever the number of models.
        self.key_of: dict[str, str] = {}
        for key, names in zip(self.keys, self.models, strict=True):
            for name in names:
                if name in self.key_of:
                    raise ValueError(f"the served model name {name!r} is given to two models")
                self.key_of[name] = key
        self._names_of = dict(zip(self.keys, self.models, strict=True))

    @property
    def several(self) -> bool:
        """Whether the router serves more than one model."""
        return len(self.models) > 1

    def names_of(self, key: str) -> tuple[str, ...]:
        """A model's served names."""
        return self._names_of[key]

    def all_names(self) -> list[str]:
        """Every served name of every model, in the router's order."""
        return [name for names in self.models for name in names]

    def place(self, pinned: str | None, reported: tuple[str, ...] | None) -> Placement:
        """Where a worker pinned to `pinned` (None: not pinned) whose report names `reported` (None: it names
        none) belongs."""
        if pinned is not None:
            key = self.key_of.get(pinned)
            if key is None:
                return Placement(
                    None,
                    f"it is pinned to model={pinned}, which this router does not serve (it serves "
                    f"{', '.join(self.all_names())}): it gets no requests",
                )
            return Placement(key, self._missing(key, reported))
        if not self.several:
            key = self.keys[0]
            return Placement(key, self._missing(key, reported))
        if reported is None:
            return Placement(
                None,
                "it names no model (neither its /server_info nor GET /v1/models lists one) and this router serves "
                "several: add it with model=NAME to say which; it gets no requests",
            )
        for name in reported:
            key = self.key_of.get(name)
            if key is not None:
                return Placement(key, self._missing(key, reported))
        return Placement(
            None,
            f"it serves {', '.join(reported)}, none of this router's models ({', '.join(self.all_names())}): "
            "it gets no requests (give the worker --served-model-name of one of them, or add that model to "
            "the router's --config)",
        )

    def _missing(self, key: str, reported: tuple[str, ...] | None) -> str | None:
        """The note for a worker of model `key` that does not serve all of that model's names."""
        missing = [name for name in self._names_of[key] if reported is not None and name not in reported]
        if not missing or reported is None:
            return None
        return (
            f"model names differ: it serves {', '.join(reported)}, not {', '.join(missing)} (it would answer "
            f"404 to those: give the worker --served-model-name {missing[0]}, or the router the worker's names)"
        )
