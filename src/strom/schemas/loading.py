"""What Avro and JSON Schema both do before parsing: a schema's JSON text loaded with its
nesting bounded, and its references put in the order they can be parsed in."""

from __future__ import annotations

import json
from collections.abc import Sequence

from strom.schemas.parsed import MAX_DEPTH, MAX_REFERENCES, ResolvedReference, SchemaError


def load_json(text: str, what: str, kind: str, max_depth: int) -> object:
    """`text` as JSON, refusing nesting beyond `max_depth` (`kind`: the schema type, for the
    message when `text` is not a string)."""
    if not isinstance(text, str):
        raise SchemaError(f"{what}: {kind} is JSON text, not {type(text).__name__}")
    try:
        value = json.loads(text)
    except RecursionError:
        raise SchemaError(f"{what}: nested deeper than {max_depth} levels") from None
    except ValueError as e:
        raise SchemaError(f"{what}: invalid JSON: {e}") from None
    pending = [(value, 1)]  # iterative: a deep document must not exhaust the stack here
    while pending:
        node, depth = pending.pop()
        if depth > max_depth:
            raise SchemaError(f"{what}: nested deeper than {max_depth} levels")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value


def dependencies_first(references: Sequence[ResolvedReference]) -> list[ResolvedReference]:
    """The references and theirs, each after those it references, each name once."""
    ordered: dict[str, ResolvedReference] = {}
    # iterative post-order: (reference, depth, children done)
    pending = [(ref, 1, False) for ref in reversed(references)]
    while pending:
        ref, depth, expanded = pending.pop()
        if ref.name in ordered:
            continue
        if expanded:
            ordered[ref.name] = ref
            if len(ordered) > MAX_REFERENCES:
                raise SchemaError(f"more than {MAX_REFERENCES} referenced schemas")
            continue
        if depth > MAX_DEPTH:
            raise SchemaError(f"references nested deeper than {MAX_DEPTH}")
        pending.append((ref, depth, True))
        pending.extend((child, depth + 1, False) for child in reversed(ref.references))
    return list(ordered.values())
