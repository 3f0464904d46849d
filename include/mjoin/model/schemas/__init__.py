"""JSON Schemas shipped with the code: ``plan.schema.json``, ``statistics.schema.json``."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import jsonschema

HERE = Path(__file__).resolve().parent


class SchemaError(ValueError):
    """A document that does not match its JSON Schema; the message names the field."""


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    return json.loads((HERE / f"{name}.schema.json").read_text())


def validate_document(doc, name: str) -> None:
    """Raise :class:`SchemaError` naming the first offending field (by JSON path)."""
    validator = jsonschema.Draft202012Validator(load_schema(name))
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = errors[0]
        path = "/".join(str(p) for p in err.absolute_path) or "(document)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SchemaError(f"{name} document invalid at {path}: {err.message}{more}")
