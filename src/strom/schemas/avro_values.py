"""Avro payloads a hostile client could write: a schema whose values may nest without bound
(a recursive type) or hold items that take no bytes has its payloads scanned, iteratively and
with bounds, before fastavro (which recurses on the C stack) reads them."""

from __future__ import annotations

from collections.abc import Iterator

from strom.schemas.avro_types import NAMED, PRIMITIVES, deref, invalid, kind_of
from strom.schemas.parsed import MAX_DEPTH, SchemaError

# A value nested deeper than this (only a recursive type allows it) is refused: fastavro's
# compiled reader and writer recurse on the C stack, which a hostile payload could overflow.
MAX_VALUE_DEPTH = 500
# Items of an array or map that encode to no bytes at all cost a payload nothing, so their
# count is bounded apart from the payload's size.
MAX_EMPTY_ITEMS = 1_000_000


def guard(root: object, defs: dict[str, dict]) -> set[str] | None:
    """The records that encode to no bytes, if a payload could nest without bound (a
    recursive type) or hold items that take no bytes: then it is scanned (iteratively, with
    bounds) before fastavro reads it. None: no scan needed. Linear in the schema's size."""
    nodes = list(_walk(root, defs))
    named = {n["name"]: n for n in nodes if isinstance(n, dict) and n["type"] in NAMED}
    nesting = _nesting(root, named, defs)
    if nesting > 2 * MAX_DEPTH:
        raise invalid(f"types nested {nesting} deep through named types (at most "
                       f"{2 * MAX_DEPTH})")
    empty = _empty_records(named, defs)
    items = [n.get("items", n.get("values")) for n in nodes
             if isinstance(n, dict) and n["type"] in ("array", "map")]
    if _has_cycle(named, defs) or any(_takes_no_bytes(i, defs, empty) for i in items):
        return empty
    return None


def _walk(root: object, defs: dict[str, dict]) -> Iterator[object]:
    """Every type node reachable from `root`, each named type once."""
    seen: set[str] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            if node in PRIMITIVES or node in seen:
                continue
            seen.add(node)
            node = defs[node]
        elif isinstance(node, dict) and node["type"] in NAMED:
            if node["name"] in seen:
                continue
            seen.add(node["name"])
        yield node
        pending += _children(node)


def _children(node: object) -> list:
    if isinstance(node, list):
        return node
    if isinstance(node, dict):
        return [f["type"] for f in node.get("fields", ())] + [
            node[k] for k in ("items", "values") if k in node]
    return []


def _named_uses(node: dict) -> Iterator[str]:
    """The named types a named type's definition uses directly (down to the next name)."""
    pending = _children(node)
    while pending:
        child = pending.pop()
        if isinstance(child, str):
            if child not in PRIMITIVES:
                yield child
        elif isinstance(child, dict) and child["type"] in NAMED:
            yield child["name"]
        else:
            pending += _children(child)


def _has_cycle(named: dict[str, dict], defs: dict[str, dict]) -> bool:
    """Whether a named type contains itself (iterative depth-first search)."""
    done: set[str] = set()
    for start in named:
        if start in done:
            continue
        path = {start}
        stack = [(start, iter(_named_uses(defs[start])))]
        while stack:
            name, uses = stack[-1]
            used = next(uses, None)
            if used is None:
                stack.pop()
                path.discard(name)
                done.add(name)
            elif used in path:
                return True
            elif used not in done:
                path.add(used)
                stack.append((used, iter(_named_uses(defs[used]))))
    return False


def _inside_out(names: dict[str, dict], defs: dict[str, dict]) -> Iterator[str]:
    """`names` and the named types they use, each once and after those it uses (one met again
    inside itself comes out where it was first met). Iterative: a long chain of named types
    must not exhaust the stack."""
    done: set[str] = set()
    entered: set[str] = set()
    for start in names:
        stack = [(start, False)]
        while stack:
            name, inside_done = stack.pop()
            if name in done:
                continue
            if not inside_done:
                if name in entered:
                    continue
                entered.add(name)
                stack.append((name, True))
                stack += [(n, False) for n in _named_uses(defs[name]) if n not in done]
                continue
            done.add(name)
            yield name


def _nesting(root: object, named: dict[str, dict], defs: dict[str, dict]) -> int:
    """How deep a value of `root` nests, following named types (a recursive use counts as
    nothing: the scan bounds those), from the innermost named types out."""
    height: dict[str, int] = {}
    for name in _inside_out(named, defs):
        height[name] = _height(defs[name], height, own=True)
    return _height(root, height, own=False)


def _height(node: object, height: dict[str, int], own: bool) -> int:
    """The levels below and including `node`, taking named types' heights from `height`."""
    deepest = 0
    pending = [(node, 1)]
    while pending:
        child, depth = pending.pop()
        name = child if isinstance(child, str) and child not in PRIMITIVES else (
            child["name"] if isinstance(child, dict) and child["type"] in NAMED else None)
        if name is not None and not (own and child is node):
            deepest = max(deepest, depth - 1 + height.get(name, 1))
            continue
        deepest = max(deepest, depth)
        pending += [(c, depth + 1) for c in _children(child)]
    return deepest


def _empty_records(named: dict[str, dict], defs: dict[str, dict]) -> set[str]:
    """The records whose every field encodes to no bytes (null, fixed of size 0, such a
    record), found from the inside out; a record inside itself is never empty."""
    empty: set[str] = set()
    for name in _inside_out(named, defs):
        node = defs[name]
        if node["type"] in ("record", "error") and all(
                _takes_no_bytes(f["type"], defs, empty) for f in node["fields"]):
            empty.add(name)
    return empty


def _takes_no_bytes(node: object, defs: dict[str, dict], empty: set[str]) -> bool:
    kind = kind_of(node, defs)
    node = deref(node, defs)
    return (kind == "null" or (kind == "fixed" and node["size"] == 0)
            or (kind in ("record", "error") and node["name"] in empty))


class Scanner:
    """Walks a payload by the schema without building values, on an explicit stack, refusing
    nesting beyond MAX_VALUE_DEPTH and more than MAX_EMPTY_ITEMS items that take no bytes."""

    def __init__(self, defs: dict[str, dict], empty: set[str], data: bytes) -> None:
        self.defs = defs
        self.empty = empty
        self.data = data
        self.pos = 0
        self.empty_items = 0

    def _fail(self, why: str) -> SchemaError:
        return SchemaError(f"payload does not match the Avro schema: {why}")

    def _long(self) -> int:
        shift = result = 0
        while True:
            if self.pos >= len(self.data):
                raise self._fail("ends inside a number")
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise self._fail("a number longer than 10 bytes")

    def _skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise self._fail(f"a length of {n} at byte {self.pos} runs past the end")
        self.pos += n

    def scan(self, root: object) -> None:
        # items: (type, depth) or ("block", container type, items left in block, depth)
        pending: list[tuple] = [(root, 1)]
        while pending:
            task = pending.pop()
            if task[0] == "block":
                self._block(task, pending)
                continue
            node, depth = task
            if depth > MAX_VALUE_DEPTH:
                raise self._fail(f"values nested deeper than {MAX_VALUE_DEPTH}")
            kind = kind_of(node, self.defs)
            node = deref(node, self.defs)
            if kind in ("null",):
                continue
            if kind == "boolean":
                self._skip(1)
            elif kind in ("int", "long", "enum"):
                self._long()
            elif kind == "float":
                self._skip(4)
            elif kind == "double":
                self._skip(8)
            elif kind in ("bytes", "string"):
                self._skip(self._long())
            elif kind == "fixed":
                self._skip(node["size"])
            elif kind == "union":
                index = self._long()
                if not 0 <= index < len(node):
                    raise self._fail(f"union index {index} out of range")
                pending.append((node[index], depth + 1))
            elif kind in ("record", "error"):
                pending += [(f["type"], depth + 1) for f in reversed(node["fields"])]
            else:  # array, map
                pending.append(("block", node, 0, depth))

    def _block(self, task: tuple, pending: list[tuple]) -> None:
        _, node, left, depth = task
        item = node.get("items", node.get("values"))
        if left == 0:
            count = self._long()
            if count == 0:
                return
            if count < 0:
                count = -count
                self._long()  # the block's size in bytes
            if _takes_no_bytes(item, self.defs, self.empty):
                self.empty_items += count
                if self.empty_items > MAX_EMPTY_ITEMS:
                    raise self._fail(f"more than {MAX_EMPTY_ITEMS} items that take no bytes")
            elif count > len(self.data) - self.pos:
                raise self._fail(f"{count} items in {len(self.data) - self.pos} bytes")
            left = count
        pending.append(("block", node, left - 1, depth))
        pending.append((item, depth + 1))
        if node["type"] == "map":
            pending.append(("string", depth + 1))


def check_value_depth(value: object) -> None:
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_VALUE_DEPTH:
            raise SchemaError(f"value nested deeper than {MAX_VALUE_DEPTH}")
        if isinstance(node, dict):
            pending += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list | tuple):
            pending += [(v, depth + 1) for v in node]
