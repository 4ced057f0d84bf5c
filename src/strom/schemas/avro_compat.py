"""Whether an Avro reader schema reads what a writer schema wrote, by Avro Java's
SchemaCompatibility rules, each incompatibility described as Confluent describes it."""

from __future__ import annotations

from strom.schemas.avro_types import PRIMITIVES, deref, kind_of, split_name
from strom.schemas.parsed import MAX_DEPTH

_PROMOTIONS = {"long": {"int"}, "float": {"int", "long"}, "double": {"int", "long", "float"},
               "bytes": {"string"}, "string": {"bytes"}}
# Deeper than this the checker stops and reports (only chains of named types get so deep).
_MAX_CHECK_DEPTH = 6 * MAX_DEPTH  # location steps: three a level, 2 * MAX_DEPTH levels


class Checker:
    """Whether a reader reads what a writer wrote, by Avro Java's SchemaCompatibility rules;
    `found` lists (incompatibility, location, detail) in the order met."""

    def __init__(self, reader_defs: dict[str, dict], writer_defs: dict[str, dict]) -> None:
        self.rdefs = reader_defs
        self.wdefs = writer_defs
        self.found: list[tuple[str, str, str]] = []
        self.memo: dict[tuple[int, int], list[tuple[str, str, str]]] = {}

    def check(self, reader: object, writer: object, location: list[str]) -> bool:
        reader, writer = deref(reader, self.rdefs), deref(writer, self.wdefs)
        if isinstance(reader, str) or isinstance(writer, str):  # a primitive: nothing to recur
            before = len(self.found)
            self._compare(reader, writer, location)
            return len(self.found) == before
        key = (id(reader), id(writer))  # every other node is its own object
        if key in self.memo:  # done, or in progress (a recursive type): compatible so far
            self.found += self.memo[key]
            return not self.memo[key]
        self.memo[key] = []
        if len(location) > _MAX_CHECK_DEPTH:
            found = [("TYPE_MISMATCH", _path(location), "schemas nested too deep to compare")]
        else:
            outer, self.found = self.found, []
            self._compare(reader, writer, location)
            found, self.found = self.found, outer
        self.memo[key] = found
        self.found += found
        return not found

    def _report(self, kind: str, location: list[str], detail: str) -> None:
        self.found.append((kind, _path(location), detail))

    def _compare(self, reader: object, writer: object, location: list[str]) -> None:
        rkind, wkind = kind_of(reader, self.rdefs), kind_of(writer, self.wdefs)
        if rkind == wkind or {rkind, wkind} == {"record", "error"}:
            if rkind in PRIMITIVES:
                return
            if rkind in ("array", "map"):
                key = "items" if rkind == "array" else "values"
                self.check(reader[key], writer[key], [*location, key])
            elif rkind == "union":
                for i, branch in enumerate(writer):
                    if not self._quiet(reader, branch, location):
                        self._report("MISSING_UNION_BRANCH", [*location, str(i)],
                                     f"reader union lacking writer type: "
                                     f"{kind_of(branch, self.wdefs).upper()}")
            else:
                self._named(reader, writer, rkind, location)
            return
        if wkind == "union":
            for i, branch in enumerate(writer):
                self.check(reader, branch, [*location, str(i)])
        elif rkind == "union":
            if not any(self._quiet(branch, writer, location) for branch in reader):
                self._report("MISSING_UNION_BRANCH", location,
                             f"reader union lacking writer type: {wkind.upper()}")
        elif wkind not in _PROMOTIONS.get(rkind, ()):
            self._report("TYPE_MISMATCH", location, f"reader type: {rkind.upper()} not "
                         f"compatible with writer type: {wkind.upper()}")

    def _quiet(self, reader: object, writer: object, location: list[str]) -> bool:
        """Whether `writer` is readable by `reader`, without reporting why not."""
        outer = self.found
        self.found = []
        try:
            return self.check(reader, writer, location)
        finally:
            self.found = outer

    def _named(self, reader: dict, writer: dict, kind: str, location: list[str]) -> None:
        _, rsimple = split_name(reader["name"])
        _, wsimple = split_name(writer["name"])
        # Avro Java compares the names without their namespaces, or a reader alias
        if rsimple != wsimple and writer["name"] not in reader.get("aliases", ()):
            self._report("NAME_MISMATCH", [*location, "name"], f"expected: {writer['name']}")
        if kind == "fixed" and reader["size"] != writer["size"]:
            self._report("FIXED_SIZE_MISMATCH", [*location, "size"],
                         f"expected: {writer['size']}, found: {reader['size']}")
        elif kind == "enum":
            missing = sorted(set(writer["symbols"]) - set(reader["symbols"]))
            if missing and reader.get("default") not in reader["symbols"]:
                self._report("MISSING_ENUM_SYMBOLS", [*location, "symbols"],
                             "[" + ", ".join(missing) + "]")
        elif kind in ("record", "error"):
            by_name = {f["name"]: f for f in writer["fields"]}
            for i, field in enumerate(reader["fields"]):
                at = [*location, "fields", str(i)]
                written = next((by_name[n] for n in (field["name"], *field.get("aliases", ()))
                                if n in by_name), None)
                if written is not None:
                    self.check(field["type"], written["type"], [*at, "type"])
                elif "default" not in field:
                    self._report("READER_FIELD_MISSING_DEFAULT_VALUE", at, field["name"])


def _path(location: list[str]) -> str:
    return "/" + "/".join(location)


_DESCRIPTIONS = {
    "FIXED_SIZE_MISMATCH": "The size of FIXED type field at path '{path}' in the reader "
                           "schema does not match with the writer schema",
    "TYPE_MISMATCH": "The type (path '{path}') of a field in the reader schema does not match "
                     "with the writer schema",
    "NAME_MISMATCH": "The name of the schema has changed (path '{path}')",
    "MISSING_ENUM_SYMBOLS": "The reader schema is missing enum symbols '{info}' at path "
                            "'{path}' in the writer schema",
    "MISSING_UNION_BRANCH": "The reader schema is missing a type inside a union field at path "
                            "'{path}' in the writer schema",
    "READER_FIELD_MISSING_DEFAULT_VALUE": "The field '{info}' at path '{path}' in the reader "
                                          "schema has no default value and is missing in the "
                                          "writer schema",
}


def describe(kind: str, path: str, info: str) -> str:
    """One incompatibility in Confluent's form (reader: the schema reading, writer: the one
    that wrote; the registry's new and old schema, by the direction of the check)."""
    description = _DESCRIPTIONS[kind].format(path=path, info=info)
    return f"{{errorType:'{kind}', description:'{description}', additionalInfo:'{info}'}}"
