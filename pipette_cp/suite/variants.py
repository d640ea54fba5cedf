"""What-if variants of benchmark instances: another node count, model, batch or sequence.

``pipette-cp bench run X --nodes 16,32 --global-batch 512,1024`` sweeps the cross
product of the given values over each instance ``X``; each combination is an instance
of its own, :class:`Variant`, named ``X+nodes=16+global_batch=1024`` (the options in
the order of :data:`OPTIONS`; ``+`` and ``=`` are safe in file names).  A variant is
sent to the workers as its JSON (:meth:`Variant.to_json`, also the store's ``variant``
column) and rebuilt there (:meth:`Variant.build`); every problem is found by
:meth:`Variant.build` in the parent first, as a one-line :class:`SpecError` naming the
option and its value.

* ``nodes``: a generated cluster (``cluster: {generator: ...}``) is generated again
  with that many nodes (same kind, seed and parameters); any other cluster (a file or
  inline fields) keeps its node count, so only that count is accepted.
* ``model``: a bundled model name or a model file, as ``pipette-cp solve --model``
  takes it (a measured layer profile of the instance is dropped: it was of its model).
* ``global_batch``, ``seq_length``: the training's ``global_batch_size``, ``seq_length``.

A variant has no ``best_known`` (its instance file's entry is of another job).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipette_cp.errors import InputFileError, SpecError
from pipette_cp.io.files import read_mapping
from pipette_cp.io.instance_file import instance_from_mapping, instance_path
from pipette_cp.io.model_file import load_model
from pipette_cp.search.space import check_degrees, degrees
from pipette_cp.specs import Instance, TrainingSpec, validate_spec

#: Variant parameters and their ``bench run`` options, in the order names list them.
OPTIONS = {
    "nodes": "--nodes",
    "model": "--model",
    "global_batch": "--global-batch",
    "seq_length": "--seq-length",
}
_TRAINING = {"global_batch": "global_batch_size", "seq_length": "seq_length"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _label(text: str) -> str:
    """``text`` with every run of characters unsafe in a file name as one ``_``."""
    return _UNSAFE.sub("_", text).strip("_") or "_"


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.endswith((".yaml", ".yml", ".json"))


def model_label(model: str) -> str:
    """How a model appears in a variant's name: a bundled name (lower case), else the
    file's stem (a Hugging Face ``config.json``: its folder's name).

    >>> model_label("Llama-3-8B"), model_label("/m/llama-8b/config.json"), model_label("a/b.yaml")
    ('llama-3-8b', 'llama-8b', 'b')
    """
    if not _looks_like_path(model) and not Path(model).is_dir():
        return _label(model.lower())
    path = Path(model)
    if path.is_dir() or path.name == "config.json":
        return _label((path if path.is_dir() else path.parent).resolve().name)
    return _label(path.stem)


def base_label(instance: str) -> str:
    """How an instance appears in a variant's name: a bundled name as it is, a file by
    its stem."""
    return _label(Path(instance).stem) if _looks_like_path(instance) else _label(instance)


@dataclass(frozen=True)
class Variant:
    """Instance ``base`` (a bundled name or a file, as given) with the parts not
    ``None`` replaced (module doc); ``model`` is a bundled name or an absolute path."""

    base: str
    nodes: int | None = None
    model: str | None = None
    global_batch: int | None = None
    seq_length: int | None = None

    def params(self) -> dict[str, int | str]:
        """The replaced parts, in the order of :data:`OPTIONS`."""
        found = ((f.name, getattr(self, f.name)) for f in fields(self) if f.name in OPTIONS)
        return {k: v for k, v in found if v is not None}

    @property
    def name(self) -> str:
        """``<instance>+<param>=<value>...``, e.g. ``llama-3-70b-g2-512+nodes=128``."""
        parts = [base_label(self.base)]
        for key, value in self.params().items():
            shown = model_label(str(value)) if key == "model" else str(value)
            parts.append(f"{key}={shown}")
        return "+".join(parts)

    def to_json(self) -> str:
        """``{"instance": base, <param>: <value>...}``: what a worker rebuilds it from."""
        return json.dumps({"instance": self.base, **self.params()})

    @classmethod
    def from_json(cls, text: str) -> Variant:
        data = json.loads(text)
        return cls(base=data.pop("instance"), **data)

    def _blame(self, *order: str) -> tuple[str, Any]:
        """The option (and value) an error of the whole variant is put on: the first of
        ``order`` this variant sets."""
        params = self.params()
        key = next((k for k in order if k in params), next(iter(params)))
        return OPTIONS[key], params[key]

    def _error(self, key: str, problem: str) -> SpecError:
        return SpecError(OPTIONS[key], self.params()[key], f"{self.name}: {problem}")

    def build(self) -> Instance:
        """The variant's instance, checked: its layout space is not empty and uses its
        global batch; else a one-line :class:`SpecError` naming the option."""
        path = instance_path(self.base)
        data = read_mapping(path)
        data.update(name=self.name, best_known=None)
        cluster = data.get("cluster")
        recipe = cluster.get("generator") if isinstance(cluster, dict) else None
        generated = isinstance(recipe, dict)
        if self.nodes is not None and isinstance(cluster, dict) and isinstance(recipe, dict):
            regenerated = {k: v for k, v in recipe.items() if k != "gpus"} | {"nodes": self.nodes}
            data["cluster"] = {**cluster, "generator": regenerated}
        try:
            inst = instance_from_mapping(data, base_dir=path.parent, default_name=path.stem)
        except (SpecError, InputFileError) as exc:
            if self.nodes is None or not generated:
                raise
            raise self._error("nodes", str(exc)) from None
        own = inst.cluster.num_nodes
        if self.nodes is not None and not generated and own != self.nodes:
            raise self._error(
                "nodes",
                f"the cluster of {self.base} is not generated (a file or inline fields) and "
                f"has {own} node{'s' if own != 1 else ''}; only generator clusters are resized",
            )
        return self._checked(self._replaced(inst))

    def _replaced(self, inst: Instance) -> Instance:
        update: dict[str, Any] = {}
        if self.model is not None:
            try:
                update["model"] = load_model(self.model)
            except SpecError as exc:
                raise self._error("model", exc.expected) from None
            except InputFileError as exc:
                raise self._error("model", exc.problem) from None
            update["profile"] = None  # measured layer times of the instance's own model
        training = inst.training.model_dump()
        for key, field in _TRAINING.items():
            value = getattr(self, key)
            if value is None:
                continue
            training[field] = value
            try:
                update["training"] = validate_spec(TrainingSpec, training, "training")
            except SpecError as exc:
                raise self._error(key, exc.expected) from None
        if not update:
            return inst
        try:
            return validate_spec(Instance, {**dict(inst), **update}, "instance")
        except SpecError as exc:
            raise SpecError(*self._blame("model", "seq_length", "global_batch", "nodes"),
                            f"{self.name}: {exc}") from None  # fmt: skip

    def _checked(self, inst: Instance) -> Instance:
        space = inst.search_space
        try:
            check_degrees(inst, space)
        except SpecError as exc:
            knob = exc.field.removeprefix("search_space.")
            order = {"cp": "seq_length", "tp": "model", "pp": "model", "ep": "model",
                     "etp": "model"}.get(knob, "nodes")  # fmt: skip
            raise SpecError(*self._blame(order, "nodes", "model", "seq_length", "global_batch"),
                            f"{self.name}: {exc}") from None  # fmt: skip
        batch = inst.training.global_batch_size
        found = degrees(inst, space)
        if not any(batch % (d.dp * mb) == 0 for d in found for mb in space.micro_batch_size):
            dps = ", ".join(map(str, sorted({d.dp for d in found})))
            mbs = ", ".join(map(str, space.micro_batch_size))
            raise SpecError(
                *self._blame("global_batch", "nodes", "model", "seq_length"),
                f"{self.name}: no layout of the search space splits a global batch of "
                f"{batch} into dp x micro-batches (dp: {dps}; micro_batch_size: {mbs})",
            )
        return inst


@dataclass(frozen=True)
class Sweep:
    """The values of each variant option (empty: the instance's own)."""

    nodes: Sequence[int] = ()
    model: Sequence[str] = ()
    global_batch: Sequence[int] = ()
    seq_length: Sequence[int] = ()

    def __post_init__(self) -> None:
        for key in ("nodes", "global_batch", "seq_length"):
            for value in getattr(self, key):
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise SpecError(OPTIONS[key], value, "expected positive integers")
        for model in self.model:
            if not model.strip():
                raise SpecError("--model", model, "expected a bundled model name or a file")

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def variants(self, base: str) -> list[Variant]:
        """Every combination of the given values for instance ``base`` (none without any
        value), each value once, in the order given."""
        if not self:
            return []

        def once(values: Sequence[Any]) -> list[Any]:
            return list(dict.fromkeys(values)) or [None]

        found: dict[str, Variant] = {}
        for nodes, model, batch, seq in itertools.product(
            once(self.nodes), once([_resolved(m) for m in self.model]),
            once(self.global_batch), once(self.seq_length),
        ):  # fmt: skip
            variant = Variant(base, nodes, model, batch, seq)
            found.setdefault(variant.name, variant)  # the first of Llama-3-8B, llama-3-8b
        return list(found.values())


def _resolved(model: str) -> str:
    """A model file as an absolute path (workers may run elsewhere); a name as it is."""
    text = model.strip()
    if _looks_like_path(text) or Path(text).is_dir():
        return str(Path(text).resolve())
    return text
