"""Shared machinery of the specs: a frozen base model, a read-only numpy
matrix field, and the conversion of pydantic errors into one-line SpecErrors."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
)

from pipette_cp.errors import SpecError


class FrozenSpec(BaseModel):
    """Immutable, strict-about-extras base of every spec.

    No float field of any spec holds NaN or an infinity (``allow_inf_nan=False``):
    ``.nan``, ``.inf``, ``1e400`` (read as inf) and numpy's ``np.float32("inf")`` are
    refused with ``Input should be a finite number``, in nested specs too (each spec
    inherits this configuration).
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False
    )


def _to_matrix(value: Any) -> np.ndarray:
    array = np.array(value, dtype=np.float64, copy=True)
    if array.ndim != 2 or array.shape[0] != array.shape[1]:
        raise ValueError(f"must be a square 2-D matrix, got shape {array.shape}")
    array.flags.writeable = False
    return array


#: A square float64 matrix, read-only once validated; JSON as nested lists.
Matrix = Annotated[
    np.ndarray,
    PlainValidator(_to_matrix),
    PlainSerializer(lambda a: a.tolist(), return_type=list),
    WithJsonSchema({"type": "array", "items": {"type": "array", "items": {"type": "number"}}}),
]

S = TypeVar("S", bound=BaseModel)


def validate_spec(cls: type[S], data: Any, where: str = "") -> S:
    """Build ``cls`` from ``data``; on failure raise a one-line :class:`SpecError`.

    ``where`` prefixes the field path (``"model"`` gives ``model.hidden_size``).
    Only the first pydantic error is reported: users fix one thing at a time.
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise SpecError(where or cls.__name__, data, f"expected a mapping of {cls.__name__} fields")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, where) from None


def spec_error_from(exc: ValidationError, where: str = "") -> SpecError:
    """The first error of a pydantic ValidationError as a SpecError."""
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"])
    field = ".".join(p for p in (where, loc) if p) or exc.title
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field (check its spelling and its unit suffix)"
    value = err.get("input", None)
    if isinstance(value, dict):
        value = "{...}"
    return SpecError(field, value, message)
