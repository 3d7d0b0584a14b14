"""What a valid trace event is, stated once for every engine (spark_checks/README.md, "Input validity").

Two layers decide it, and every engine applies both in the same order:

1. **Line rules** (JSONL only). A file is split at ``\\n`` (a final ``\\n`` ends the last line and starts none; a
   ``\\r`` before it is JSON whitespace, so CRLF files are fine). Each physical line must be one event; the first rule
   of ``REASONS`` a line breaks is its reason. A last line without its ``\\n`` that is not JSON is ``torn_tail`` (what a
   writer killed mid-line leaves) instead of ``not_utf8``, ``lone_surrogate`` or ``not_json``.
2. **The schema**: ``spec/schemas/trace/event.json`` with the per-kind schemas and ``common/defs.json``. This module
   compiles it to an expression tree (``compile_event``) that ``render`` turns into Spark Columns or DuckDB SQL. The
   compiler understands the JSON Schema subset the trace schemas use and raises ``SchemaNotUnderstood`` for anything
   else, so a schema change can never silently weaken the check. The oracle does not use the tree: it validates with
   the ``jsonschema`` library (``spec.validator``), an independent derivation the tests hold the tree to.

The tree sees an event through an accessor (``Access``): whether a member is present, its JSON type (``string``,
``integer``, ``number``, ``boolean``, ``null``, ``object``, ``array``), its value, an object's member names. ``integer``
means an integer literal within int64 -- what every engine's parser keeps exact -- and anything else numeric is
``number``. Integer members (the paths any kind types ``integer``) must hold an ``integer``: ``5.0``, ``5e0`` and
``2**63`` are ``integer_literal``, decided before the schema, so the schema's ``integer`` (which includes ``5.0``) and
the tree's agree on every line that reaches them. A Parquet row is the JSON event ``format.row_to_event`` makes of it
plus every non-null column its kind does not have (an extra member), and its ``line`` must be a position (``layout``):
not null, not negative, and held by no other row of its node (every row of a shared (node, line) is ``layout``, so
the verdict does not depend on the order the rows are read in; a row with a null node holds no position, its schema
error is its reason). JSONL lines are numbered by the reader, one position per valid line, so they never share one.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from spec import load_table

#: The trace checks' limits (spec/tables/limits.yaml, ``applies_to: [trace_check]``, E-52).
TRACE_LIMITS = {name: entry["value"] for name, entry in load_table("limits")["limits"].items()
                if entry["applies_to"] == ["trace_check"]}
#: The most objects and arrays (``{`` and ``[`` outside strings) one line may open (``trace_line_containers_max``):
#: an event opens two; any nesting bomb (a member nested thousands deep, which one parser refuses, another's
#: recursion overflows on and a third accepts) opens more, and is ``nesting`` in every engine before any parser
#: sees it.
MAX_CONTAINERS = TRACE_LIMITS["trace_line_containers_max"]
#: A pattern exactly the strings of ``n`` lowercase hex digits match (``SqlDialect.matches``).
HEX_DIGITS = re.compile(r"\^\[0-9a-f\]\{(\d+)\}\\z")
#: The most digits a number may write in a row (``trace_line_digits_max``): parsers refuse long numbers at their own
#: limits (Python's int conversion at 4300 digits, Jackson at 1000 characters, yyjson never), so a longer run outside
#: strings is ``long_number`` in every engine before any parser sees it; no trace member needs more than 20.
MAX_DIGITS = TRACE_LIMITS["trace_line_digits_max"]
#: The most distinct nodes a trace's valid events may name (``trace_nodes_max``): past it every engine refuses the
#: trace as unusable input (``check_node_count``).
MAX_NODES = TRACE_LIMITS["trace_nodes_max"]
LONG_DIGITS_PATTERN = f"[0-9]{{{MAX_DIGITS + 1}}}"
#: Counting outside strings on any text, the same in Python, RE2 and Java and without recursion (Java's regex
#: engine recurses per repetition of an alternation and overflows its stack on a long string): every backslash and
#: the character after it become ``__`` (``[\s\S]``: a ``.`` stops at ``\r`` in Java only), then what is between two
#: quotes is a string, blanked to ``""``, and every character but ``[`` and ``{`` is dropped.
ESCAPE_PATTERN = r"\\[\s\S]"
PLAIN_STRING_PATTERN = r'"[^"]*"'
NOT_OPENING = r"[^\[{]"

#: Reasons an event is invalid, in the order they are decided (the first that applies is reported).
REASONS: dict[str, str] = {
    "not_utf8": "the line is not valid UTF-8",
    "blank": "the line is empty or white space only (a trace writer never writes one)",
    "bom": "the line starts with a byte order mark (U+FEFF)",
    "lone_surrogate": "a \\uD800-\\uDFFF escape that is not half of a surrogate pair",
    "nesting": f"more than {MAX_CONTAINERS} objects and arrays outside strings (an event has at most two)",
    "long_number": f"a number written with more than {MAX_DIGITS} digits in a row",
    "not_json": "not exactly one JSON text (RFC 8259)",
    "not_object": "a JSON text that is not an object",
    "duplicate_member": "a member name twice in the event or in one of its object members",
    "integer_literal": "an integer member written with a fraction or an exponent, or outside int64",
    "schema": "not valid against spec/schemas/trace/event.json",
    "layout": "a Parquet row whose line is null or negative, or held by another row of its node too",
}


#: What a ``layout`` row's line is: ``line: <n> <text>``, for a null or negative line and for a shared one.
NOT_A_POSITION = "is not a position in the node's stream"
SHARED_POSITION = "is held by more than one row of the node (a position in its stream holds one event)"


def layout_message(line: int | None) -> str:
    """The message of a ``layout`` row: its ``line`` is null or negative, or (any other line) another row of its
    node holds it too."""
    if line is None or line < 0:
        return f"line: {'null' if line is None else line} {NOT_A_POSITION}"
    return f"line: {line} {SHARED_POSITION}"


#: Reasons an unterminated last line gets ``torn_tail`` instead of.
TORN = ("not_utf8", "lone_surrogate", "not_json")
TORN_TAIL = "torn_tail"
TORN_MESSAGE = "the last line has no newline and is not JSON: a torn write"

INT64 = (-(1 << 63), (1 << 63) - 1)
#: JSON white space (RFC 8259) other than the line feed that ends a line.
BLANK_PATTERN = r"^[ \t\r]*$"
#: A JSON string (used on text that already parses, to look outside strings).
STRING_PATTERN = r'"(?:[^"\\]|\\.)*"'
#: After escaped backslashes (``\\\\``) are neutralised and surrogate pairs removed, a surrogate escape left is lone.
ESCAPED_BACKSLASH = r"\\\\"
SURROGATE_PAIR = r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
SURROGATE = r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
#: Outside strings: tokens a lax parser accepts and RFC 8259 does not (NaN, Infinity, a trailing comma).
LAX_TOKENS = r"[nN][aA][nN]|[iI][nN][fF]|,[ \t\r\n]*[\]}]"

ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "$comment", "examples", "default"})
KEYWORDS = frozenset({"$ref", "type", "const", "enum", "minLength", "maxLength", "pattern", "minimum", "maximum",
                      "required", "properties", "additionalProperties", "allOf", "anyOf", "oneOf", "not", "if",
                      "then", "else"})
TYPES = frozenset({"string", "integer", "boolean", "null", "object"})


class SchemaNotUnderstood(ValueError):
    """The trace schema uses a keyword, type or value this compiler does not translate."""


Path = tuple[str, ...]


# --- the tree ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One leaf: ``op`` is present, type, const, enum, min_length, max_length, pattern, minimum, maximum, only_keys."""

    op: str
    path: Path
    arg: Any = None


@dataclass(frozen=True)
class All:
    items: tuple[Any, ...]


@dataclass(frozen=True)
class AnyOf:
    """Valid when any item is; ``one`` asks for exactly one. ``by`` names a member whose const picks the item."""

    items: tuple[Any, ...]
    one: bool = False
    by: tuple[Path, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class Not:
    item: Any


@dataclass(frozen=True)
class Cond:
    """if / then / else; ``Cond(guard, rule)`` applies ``rule`` only where ``guard`` holds."""

    when: Any
    then: Any
    otherwise: Any = All(())


TRUE = All(())


def member(path: Path) -> str:
    return ".".join(path) if path else "event"


def _string(schema_path: str, value: Any) -> Any:
    if isinstance(value, (float, dict, list)):
        raise SchemaNotUnderstood(f"{schema_path}: const/enum value {value!r} (only strings, integers, booleans, "
                                  "null)")
    return value


class _Compiler:
    def __init__(self, registry: Any, base: str):
        self.registry = registry
        self.base = base
        self.integer_paths: set[Path] = set()
        self.numeric_paths: dict[Path, str] = {}
        self.object_paths: set[Path] = set()

    def resolve(self, ref: str, base: str) -> tuple[dict[str, Any], str]:
        from urllib.parse import urljoin

        uri = urljoin(base, ref)
        document, _, pointer = uri.partition("#")
        resolved = self.registry.contents(document)
        for part in [p for p in pointer.split("/") if p]:
            resolved = resolved[part]
        return resolved, document

    def compile(self, schema: Any, path: Path, base: str, where: str) -> Any:
        if schema is True:
            return TRUE
        if not isinstance(schema, dict):
            raise SchemaNotUnderstood(f"{where}: a schema must be an object, not {schema!r}")
        unknown = set(schema) - KEYWORDS - ANNOTATIONS
        if unknown:
            raise SchemaNotUnderstood(f"{where}: keyword(s) {sorted(unknown)} not translated")
        parts: list[Any] = []
        if "$ref" in schema:
            target, document = self.resolve(schema["$ref"], base)
            parts.append(self.compile(target, path, document, f"{where}/$ref({schema['$ref']})"))
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not set(types) <= TYPES:
                raise SchemaNotUnderstood(f"{where}: type {sorted(set(types) - TYPES)} not translated")
            if "integer" in types:
                self.integer_paths.add(path)
            if "object" in types:
                self.object_paths.add(path)
            parts.append(Check("type", path, tuple(types)))
        if "const" in schema:
            parts.append(Check("const", path, _string(where, schema["const"])))
            self._numeric(path, [schema["const"]], where)
        if "enum" in schema:
            parts.append(Check("enum", path, tuple(_string(where, v) for v in schema["enum"])))
            self._numeric(path, schema["enum"], where)
        string = Check("type", path, ("string",))
        for keyword, op in (("minLength", "min_length"), ("maxLength", "max_length")):
            if keyword in schema:
                parts.append(Cond(string, Check(op, path, int(schema[keyword]))))
        if "pattern" in schema:
            parts.append(Cond(string, Check("pattern", path, check_pattern(schema["pattern"], where))))
        for keyword in ("minimum", "maximum"):
            if keyword in schema:
                if not isinstance(schema[keyword], int) or isinstance(schema[keyword], bool):
                    raise SchemaNotUnderstood(f"{where}: {keyword} must be an integer")
                self._numeric(path, [schema[keyword]], where)
                parts.append(Cond(Check("type", path, ("integer",)), Check(keyword, path, schema[keyword])))
        obj = Check("type", path, ("object",))
        if "required" in schema:
            parts.append(Cond(obj, All(tuple(Check("present", (*path, name)) for name in schema["required"]))))
        properties = schema.get("properties", {})
        for name, sub in properties.items():
            parts.append(Cond(Check("present", (*path, name)),
                              self.compile(sub, (*path, name), base, f"{where}/properties/{name}")))
        if "additionalProperties" in schema:
            if schema["additionalProperties"] is not False:
                raise SchemaNotUnderstood(f"{where}: additionalProperties other than false")
            parts.append(Cond(obj, Check("only_keys", path, tuple(properties))))
        if "allOf" in schema:
            parts.extend(self.compile(s, path, base, f"{where}/allOf/{k}") for k, s in enumerate(schema["allOf"]))
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                items = tuple(self.compile(s, path, base, f"{where}/{keyword}/{k}")
                              for k, s in enumerate(schema[keyword]))
                parts.append(AnyOf(items, keyword == "oneOf", self._discriminator(schema[keyword], path, base)))
        if "not" in schema:
            parts.append(Not(self.compile(schema["not"], path, base, f"{where}/not")))
        if "if" in schema:
            parts.append(Cond(self.compile(schema["if"], path, base, f"{where}/if"),
                              self.compile(schema.get("then", True), path, base, f"{where}/then"),
                              self.compile(schema.get("else", True), path, base, f"{where}/else")))
        elif "then" in schema or "else" in schema:
            raise SchemaNotUnderstood(f"{where}: then/else without if")
        return parts[0] if len(parts) == 1 else All(tuple(parts))

    def _numeric(self, path: Path, values: Iterable[Any], where: str) -> None:
        if any(isinstance(v, int) and not isinstance(v, bool) for v in values):
            self.numeric_paths.setdefault(path, where)

    def _discriminator(self, alternatives: list[Any], path: Path, base: str) -> tuple[Path, tuple[str, ...]] | None:
        """The member every alternative requires with a distinct string const (``kind`` in event.json), if any."""
        consts: list[dict[str, str]] = []
        for alternative in alternatives:
            schema = alternative
            document = base
            while isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
                schema, document = self.resolve(schema["$ref"], document)
            if not isinstance(schema, dict):
                return None
            consts.append({n: s["const"] for n, s in schema.get("properties", {}).items()
                           if isinstance(s, dict) and isinstance(s.get("const"), str)
                           and n in schema.get("required", ())})
        for name in consts[0] if consts else ():
            values = [c.get(name) for c in consts]
            if None not in values and len(set(values)) == len(values):
                return (*path, name), tuple(values)
        return None


def check_pattern(pattern: str, where: str = "pattern") -> str:
    """``pattern`` when every engine reads it alike: anchors, literals, escaped punctuation, classes, quantifiers."""
    token = re.compile(r"\^|\$|\[(?:\\.|[^\]\\])+\]|\\[^A-Za-z0-9]|[A-Za-z0-9_:~\-]|\{\d+(?:,\d*)?\}|[*+?]")
    position = 0
    while position < len(pattern):
        match = token.match(pattern, position)
        if match is None:
            raise SchemaNotUnderstood(f"{where}: pattern {pattern!r} has a construct not translated at {position}")
        text = match.group()
        if text.startswith("[") and re.search(r"\\[A-Za-z]", text):
            raise SchemaNotUnderstood(f"{where}: pattern {pattern!r}: class escapes are not translated")
        position = match.end()
    return pattern


def dialect_pattern(pattern: str) -> str:
    """The pattern for Java (Spark) and RE2 (DuckDB): ``$`` outside a class is the end of input (``\\z``)."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        in_class = True if char == "[" else False if char == "]" else in_class
        out.append(r"\z" if char == "$" and not in_class else char)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class Compiled:
    tree: Any
    integer_paths: tuple[Path, ...]
    object_paths: tuple[Path, ...]
    kinds: dict[str, tuple[str, ...]]  # kind -> its member names (schema order)
    object_members: dict[Path, dict[str, tuple[str, ...]]]  # object path -> kind -> member names


@cache
def compile_event() -> Compiled:
    """``spec/schemas/trace/event.json`` compiled; raises ``SchemaNotUnderstood`` on anything not translated."""
    from spec import SCHEMA_BASE, schema, schema_registry

    registry = schema_registry()
    base = SCHEMA_BASE + "trace/event.json"
    compiler = _Compiler(registry, base)
    tree = compiler.compile(schema("trace/event"), (), base, "trace/event.json")
    stray = {p: w for p, w in compiler.numeric_paths.items() if p not in compiler.integer_paths}
    if stray:
        raise SchemaNotUnderstood(f"numeric const/enum/bounds on members not typed integer: {stray}")
    kinds: dict[str, tuple[str, ...]] = {}
    nested: dict[Path, dict[str, tuple[str, ...]]] = {}
    for kind in schema("trace/event")["properties"]["kind"]["enum"]:
        document = schema(f"trace/{kind}")
        kinds[kind] = tuple(document["properties"])
        for name, sub in document["properties"].items():
            if isinstance(sub, dict) and "properties" in sub:
                nested.setdefault((name,), {})[kind] = tuple(sub["properties"])
    if set(nested) != {p for p in compiler.object_paths if p}:
        raise SchemaNotUnderstood("object members must be plain objects with properties")
    return Compiled(tree, tuple(sorted(compiler.integer_paths)), tuple(sorted(compiler.object_paths)), kinds, nested)


def leaf_paths(tree: Any) -> list[Path]:
    """Every member path a tree reads, in first-use order."""
    seen: dict[Path, None] = {}

    def walk(node: Any) -> None:
        if isinstance(node, Check):
            seen.setdefault(node.path, None)
            if node.op == "only_keys":
                for name in node.arg:
                    seen.setdefault((*node.path, name), None)
        elif isinstance(node, All | AnyOf):
            for item in node.items:
                walk(item)
        elif isinstance(node, Not):
            walk(node.item)
        elif isinstance(node, Cond):
            walk(node.when)
            walk(node.then)
            walk(node.otherwise)

    walk(tree)
    return [p for p in seen if p]


# --- rendering --------------------------------------------------------------------------------------------------

class Access:
    """How a dialect reads an event's members. Every method returns a dialect expression; booleans are never null."""

    def present(self, path: Path) -> Any:
        raise NotImplementedError

    def type_is(self, path: Path, types: tuple[str, ...]) -> Any:
        raise NotImplementedError

    def string(self, path: Path) -> Any:
        raise NotImplementedError

    def integer(self, path: Path) -> Any:
        raise NotImplementedError

    def boolean(self, path: Path) -> Any:
        raise NotImplementedError

    def unknown_member(self, path: Path, allowed: tuple[str, ...]) -> Any:
        """The first member name of the object at ``path`` not in ``allowed``, or null."""
        raise NotImplementedError

    def only_members(self, dialect: Dialect, path: Path, allowed: tuple[str, ...]) -> Any:
        """Whether the object at ``path`` has no member outside ``allowed``."""
        return dialect.is_null(self.unknown_member(path, allowed))

    def assume(self, path: Path, value: Any) -> Access:
        """This accessor where the member at ``path`` is known to equal ``value`` (a discriminator's branch)."""
        return self


class Dialect:
    """Expression builders; ``Spark`` and ``DuckDB`` implement them."""

    def lit(self, value: Any) -> Any:
        raise NotImplementedError

    def and_(self, items: list[Any]) -> Any:
        raise NotImplementedError

    def or_(self, items: list[Any]) -> Any:
        raise NotImplementedError

    def not_(self, item: Any) -> Any:
        raise NotImplementedError

    def when(self, branches: list[tuple[Any, Any]], otherwise: Any) -> Any:
        raise NotImplementedError

    def coalesce(self, items: list[Any]) -> Any:
        raise NotImplementedError

    def switch(self, branches: list[tuple[Any, Any]]) -> Any:
        """The result of the first branch whose condition holds, else false."""
        return self.when(branches, self.lit(False))

    def eq(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def cmp(self, a: Any, op: str, b: Any) -> Any:
        raise NotImplementedError

    def length(self, a: Any) -> Any:
        raise NotImplementedError

    def matches(self, a: Any, pattern: str) -> Any:
        raise NotImplementedError

    def concat(self, items: list[Any]) -> Any:
        raise NotImplementedError

    def is_null(self, a: Any) -> Any:
        raise NotImplementedError

    def true(self, a: Any) -> Any:
        """``a`` with null read as false."""
        return self.coalesce([a, self.lit(False)])

    def count_true(self, items: list[Any]) -> Any:
        raise NotImplementedError

    def col(self, name: str) -> Any:
        raise NotImplementedError

    def in_(self, a: Any, values: list[Any]) -> Any:
        """``a`` is one of ``values`` (false for null)."""
        raise NotImplementedError

    def hex_lower(self, a: Any) -> Any:
        raise NotImplementedError

    def cast_long(self, a: Any) -> Any:
        raise NotImplementedError


class SqlDialect(Dialect):
    """SQL text, the part Spark SQL and DuckDB share: a tree renders to one string, parsed by the engine once
    (building it as Spark ``Column`` objects took one py4j round trip per node, 160k for the event schema).

    The builders simplify as they go, on what they know of the texts they made (a text is context-free, so a fact
    about it holds wherever it appears): constants fold; ``NOT NOT x`` is ``x``; an AND's operands are flattened,
    and within them a ``CASE WHEN g THEN x ELSE true END`` whose guard ``g`` another operand asserts is ``x``, and a
    ``c IS NOT NULL`` another operand proves (a comparison read with null as false proves its columns) is dropped;
    an OR of equalities of one value with literals is an ``IN``. The schema's tree for a Parquet row shrank from
    73 KB to a fraction of it, and with it Spark's analysis, code generation and compilation of it.
    """

    #: the cast type names
    INT = "INTEGER"
    BIGINT = "BIGINT"
    STRING = "VARCHAR"

    def __init__(self) -> None:
        self._strict: dict[str, frozenset[str]] = {}  # a value -> the columns whose null makes it null
        self._proves: dict[str, frozenset[str]] = {}  # a boolean -> the columns it being true proves non-null
        self._not_null: dict[str, str] = {}  # ``(NOT (c IS NULL))`` -> c
        self._is_null: dict[str, str] = {}  # ``(c IS NULL)`` -> c
        self._negated: dict[str, str] = {}  # ``(NOT x)`` -> x
        self._equality: dict[str, tuple[str, str]] = {}  # ``coalesce((x = l), false)`` -> (x, l) for a literal l
        self._eq: dict[str, tuple[str, str]] = {}  # ``(x = l)`` -> (x, l)
        self._guarded: dict[str, tuple[str, str]] = {}  # ``CASE WHEN g THEN x ELSE true END`` -> (g, x)
        self._parts: dict[str, list[str]] = {}  # an AND -> its operands
        self._disjuncts: dict[str, list[str]] = {}  # an OR -> its operands
        self._literals: set[str] = set()
        self._hex_of: dict[str, str] = {}  # ``lower(hex(b))`` -> b

    def _derived(self, result: str, *operands: str) -> str:
        """``result`` is null when any of ``operands`` is."""
        strict = frozenset().union(*(self._strict.get(o, frozenset()) for o in operands))
        if strict:
            self._strict[result] = strict
        return result

    def lit(self, value: Any) -> str:
        if value is None:
            text = f"CAST(NULL AS {self.STRING})"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        else:
            text = self.text(str(value))
        self._literals.add(text)
        return text

    def text(self, value: str) -> str:
        """A string literal."""
        return "'" + value.replace("'", "''") + "'"

    @staticmethod
    def folded(items: list[str], unit: str, zero: str) -> list[str] | str:
        """The operands of an AND (``unit`` true, ``zero`` false) or an OR without the units, or the result."""
        if zero in items:
            return zero
        kept = [item for item in items if item != unit]
        return kept if len(kept) > 1 else kept[0] if kept else unit

    def _conjuncts(self, items: list[str]) -> list[str]:
        """An AND's operands simplified (the class docstring), in their order."""
        flat: list[str] = []
        for item in items:
            for part in self._parts.get(item, [item]):
                if part not in flat:
                    flat.append(part)

        def proven(operands: list[str], column: str, k: int) -> bool:
            """Whether an operand other than the ``k``-th (and than a bare non-null test) proves ``column``."""
            return any(column in self._proves.get(o, ()) for j, o in enumerate(operands)
                       if j != k and o not in self._not_null)

        def holds(condition: str, k: int) -> bool:
            """Whether the other operands assert ``condition``."""
            return any(condition == o for j, o in enumerate(flat) if j != k) or (
                condition in self._not_null and proven(flat, self._not_null[condition], k))

        flat = [self._guarded[item][1] if item in self._guarded and holds(self._guarded[item][0], k) else item
                for k, item in enumerate(flat)]
        result: list[str] = []
        for k, item in enumerate(flat):
            if item in self._not_null and proven(flat, self._not_null[item], k):
                continue
            if item in self._disjuncts and any(holds(d, k) for d in self._disjuncts[item]):
                continue
            if item not in result:
                result.append(item)
        return result

    def and_(self, items: list[str]) -> str:
        kept = self.folded(self._conjuncts(items), "true", "false")
        if isinstance(kept, str):
            return kept
        text = self._and_text(kept)
        self._parts[text] = kept
        self._proves[text] = frozenset().union(*(self._proves.get(k, frozenset()) for k in kept))
        return text

    def _and_text(self, items: list[str]) -> str:
        return "(" + " AND ".join(items) + ")"

    def or_(self, items: list[str]) -> str:
        merged: list[str] = []
        values: dict[str, list[str]] = {}
        for item in items:
            if item in self._equality:
                value, literal = self._equality[item]
                if value not in values:
                    values[value] = []
                    merged.append(value)  # the IN's place: where the first equality was
                values[value].append(literal)
            else:
                merged.append(item)
        operands = []
        for item in merged:
            if item in values and len(values[item]) == 1:
                item = self.true(self._eq_text(item, values[item][0]))
            elif item in values:
                value, item = item, f"coalesce({item} IN ({', '.join(values[item])}), false)"
                self._proves[item] = self._strict.get(value, frozenset())
            operands.append(item)
        if any(self._negated.get(item) in operands for item in operands):  # x OR NOT x
            return "true"
        kept = self.folded(operands, "false", "true")
        if isinstance(kept, str):
            return kept
        text = self._or_text(kept)
        self._disjuncts[text] = kept
        return text

    def _or_text(self, items: list[str]) -> str:
        return "(" + " OR ".join(items) + ")"

    def not_(self, item: str) -> str:
        if item in ("true", "false"):
            return {"true": "false", "false": "true"}[item]
        if item in self._negated:
            return self._negated[item]
        text = f"(NOT {item})"
        self._negated[text] = item
        if item in self._is_null:
            self._not_null[text] = self._is_null[item]
            self._proves[text] = frozenset([self._is_null[item]])
        return text

    def when(self, branches: list[tuple[str, str]], otherwise: str) -> str:
        kept = []
        for condition, result in branches:
            if condition == "true":
                otherwise = result
                break
            if condition != "false":
                kept.append((condition, result))
        if not kept:
            return otherwise
        text = "(CASE " + " ".join(f"WHEN {c} THEN {r}" for c, r in kept) + f" ELSE {otherwise} END)"
        if len(kept) == 1 and otherwise == "true":
            self._guarded[text] = kept[0]
        return text

    def coalesce(self, items: list[str]) -> str:
        if items[0] in ("true", "false"):
            return items[0]
        if len(items) == 1:
            return items[0]
        text = "coalesce(" + ", ".join(items) + ")"
        if items[1:] == ["false"]:  # a boolean read with null as false: true proves what its null depends on
            self._proves[text] = self._strict.get(items[0], frozenset())
            if items[0] in self._eq:
                self._equality[text] = self._eq[items[0]]
        return text

    def switch(self, branches: list[tuple[str, str]]) -> str:
        """``when(branches, false)`` with the conjuncts every branch's result shares taken out in front of it (each
        kind of event repeats the common members' checks)."""
        parts = [self._parts.get(result, [result]) for _, result in branches]
        common = [p for p in parts[0] if all(p in other for other in parts[1:])] if parts else []
        if not common:
            return self.when(branches, "false")
        rest = [(condition, self.and_([p for p in own if p not in common]))
                for (condition, _), own in zip(branches, parts, strict=True)]
        return self.and_([*common, self.when(rest, "false")])

    def _eq_text(self, a: str, b: str) -> str:
        text = self._derived(f"({a} = {b})", a, b)
        if b in self._literals:
            self._eq[text] = (a, b)
        return text

    def eq(self, a: str, b: str) -> str:
        return self._eq_text(a, b)

    def cmp(self, a: str, op: str, b: str) -> str:
        return self._derived(f"({a} {op} {b})", a, b)

    def length(self, a: str) -> str:
        return self._derived(f"length({a})", a)

    def concat(self, items: list[str]) -> str:
        return "concat(" + ", ".join(items) + ")"

    def is_null(self, a: str) -> str:
        text = f"({a} IS NULL)"
        if self._strict.get(a) == frozenset([a]):  # a column
            self._is_null[text] = a
        return text

    def count_true(self, items: list[str]) -> str:
        return "(" + " + ".join(f"CAST({i} AS {self.INT})" for i in items) + ")"

    def col(self, name: str) -> str:
        text = self.quote(name)
        self._strict[text] = frozenset([text])
        return text

    def quote(self, name: str) -> str:
        return name

    def in_(self, a: str, values: list[Any]) -> str:
        return f"coalesce({a} IN ({', '.join(self.lit(x) for x in values)}), false)"

    def hex_lower(self, a: str) -> str:
        text = self._derived(f"lower(hex({a}))", a)
        self._hex_of[text] = a
        return text

    def matches(self, a: str, pattern: str) -> str:
        r"""``a`` matches ``pattern``; on the lowercase hex of bytes (two characters a byte, each of ``[0-9a-f]``),
        ``^[0-9a-f]{2n}\z`` is ``octet_length(bytes) = n``, which costs no regular expression per row."""
        digits = HEX_DIGITS.fullmatch(pattern)
        if a in self._hex_of and digits and int(digits[1]) % 2 == 0:
            return self._derived(f"(octet_length({self._hex_of[a]}) = {int(digits[1]) // 2})", a)
        return self.regex(a, pattern)

    def regex(self, a: str, pattern: str) -> str:
        """``a`` matches the regular expression ``pattern`` (the engine's function)."""
        raise NotImplementedError

    def cast_long(self, a: str) -> str:
        return self._derived(f"CAST({a} AS {self.BIGINT})", a)


def _value_test(d: Dialect, a: Access, path: Path, value: Any) -> Any:
    if value is None:
        return a.type_is(path, ("null",))
    if isinstance(value, bool):
        return d.and_([a.type_is(path, ("boolean",)), d.true(d.eq(a.boolean(path), d.lit(value)))])
    if isinstance(value, int):
        return d.and_([a.type_is(path, ("integer",)), d.true(d.eq(a.integer(path), d.lit(value)))])
    return d.and_([a.type_is(path, ("string",)), d.true(d.eq(a.string(path), d.lit(value)))])


def _same(a: Any, b: Any) -> bool:
    """JSON equality of two const/enum values (``True`` is not ``1``)."""
    return type(a) is type(b) and a == b


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class Renderer:
    """Renders a tree as one dialect's ``valid`` (boolean) and ``explain`` (the first broken rule's message)."""

    def __init__(self, dialect: Dialect, access: Access, known: dict[Path, Any] | None = None):
        self.d = dialect
        self.a = access
        self.known = known or {}  # the members a discriminator's branch knows the value of

    def knowing(self, path: Path, value: Any) -> Renderer:
        """The renderer for a discriminator's branch: ``path`` holds ``value`` there (its presence, type, const and
        enum checks there are constants)."""
        return Renderer(self.d, self.a.assume(path, value), {**self.known, path: value})

    def valid(self, node: Any) -> Any:
        d, a = self.d, self.a
        if isinstance(node, Check):
            return self._leaf(node)
        if isinstance(node, All):
            return d.and_([self.valid(item) for item in node.items]) if node.items else d.lit(True)
        if isinstance(node, AnyOf):
            if node.by is not None:
                path, values = node.by
                return d.switch([(_value_test(d, a, path, v), self.knowing(path, v).valid(item))
                                 for v, item in zip(values, node.items, strict=True)])
            if node.one:
                return d.eq(d.count_true([self.valid(item) for item in node.items]), d.lit(1))
            return d.or_([self.valid(item) for item in node.items])
        if isinstance(node, Not):
            return d.not_(self.valid(node.item))
        if isinstance(node, Cond):
            return d.when([(self.valid(node.when), self.valid(node.then))], self.valid(node.otherwise))
        raise TypeError(node)

    def _leaf(self, node: Check) -> Any:
        d, a, path, arg = self.d, self.a, node.path, node.arg
        if path in self.known and node.op in ("present", "type", "const", "enum"):
            value = self.known[path]
            return d.lit(node.op == "present" or (json_type(value) in arg if node.op == "type" else
                                                   _same(value, arg) if node.op == "const" else
                                                   any(_same(value, x) for x in arg)))
        if node.op == "present":
            return a.present(path)
        if node.op == "type":
            return a.type_is(path, arg)
        if node.op == "const":
            return _value_test(d, a, path, arg)
        if node.op == "enum":
            return d.or_([_value_test(d, a, path, v) for v in arg])
        if node.op == "min_length":
            return d.true(d.cmp(d.length(a.string(path)), ">=", d.lit(arg)))
        if node.op == "max_length":
            return d.true(d.cmp(d.length(a.string(path)), "<=", d.lit(arg)))
        if node.op == "pattern":
            return d.true(d.matches(a.string(path), dialect_pattern(arg)))
        if node.op == "minimum":
            return d.true(d.cmp(a.integer(path), ">=", d.lit(arg)))
        if node.op == "maximum":
            return d.true(d.cmp(a.integer(path), "<=", d.lit(arg)))
        if node.op == "only_keys":
            return a.only_members(d, path, arg)
        raise TypeError(node.op)

    def explain(self, node: Any) -> Any:
        """The message of the first rule ``node`` breaks, or null when it holds."""
        d, a = self.d, self.a
        if isinstance(node, Check):
            message = self._message(node)
            return d.when([(self._leaf(node), d.lit(None))], message)
        if isinstance(node, All):
            return d.coalesce([self.explain(item) for item in node.items]) if node.items else d.lit(None)
        if isinstance(node, AnyOf):
            if node.by is not None:
                path, values = node.by
                return d.when([(_value_test(d, a, path, v), self.knowing(path, v).explain(item))
                               for v, item in zip(values, node.items, strict=True)],
                              d.lit(f"{member(path)}: must be one of {_show(list(values))}"))
            if node.one:
                count = d.count_true([self.valid(item) for item in node.items])
                return d.when([(d.eq(count, d.lit(1)), d.lit(None)), (d.eq(count, d.lit(0)), self._none_of(node))],
                              d.lit(f"{self._where(node)}: matches more than one oneOf alternative"))
            return d.when([(self.valid(node), d.lit(None))], self._none_of(node))
        if isinstance(node, Not):
            return d.when([(self.valid(node.item), d.lit(f"{self._where(node)}: must not be {self._what(node.item)}"))],
                          d.lit(None))
        if isinstance(node, Cond):
            return d.when([(self.valid(node.when), self.explain(node.then))], self.explain(node.otherwise))
        raise TypeError(node)

    def _none_of(self, node: AnyOf) -> Any:
        return self.d.lit(f"{self._where(node)}: must be {' or '.join(self._what(i) for i in node.items)}")

    def _where(self, node: Any) -> str:
        paths = leaf_paths(node) if not isinstance(node, Check) else [node.path]
        return member(paths[0]) if paths else "event"

    def _what(self, node: Any) -> str:
        if isinstance(node, Check):
            return {"const": lambda: _show(node.arg), "enum": lambda: f"one of {_show(list(node.arg))}",
                    "type": lambda: " or ".join(node.arg), "present": lambda: "present",
                    }.get(node.op, lambda: node.op)()
        if isinstance(node, All) and len(node.items) == 1:
            return self._what(node.items[0])
        if isinstance(node, Cond) and node.otherwise == TRUE:
            return self._what(node.then)
        return "its alternative"

    def _message(self, node: Check) -> Any:
        d, name, arg = self.d, member(node.path), node.arg
        if node.op == "only_keys":
            return d.concat([d.lit(f"{'' if not node.path else name + '.'}"), self.a.unknown_member(node.path, arg),
                             d.lit(": member not allowed (additionalProperties: false)")])
        if node.op == "present":
            text = f"{name}: required member missing"
        elif node.op == "type":
            text = f"{name}: must be {' or '.join(arg)} (type)"
        elif node.op == "const":
            text = f"{name}: must be {_show(arg)} (const)"
        elif node.op == "enum":
            text = f"{name}: must be one of {_show(list(arg))} (enum)"
        else:
            label = {"min_length": ("at least", "characters (minLength)"),
                     "max_length": ("at most", "characters (maxLength)"), "pattern": ("must match", "(pattern)"),
                     "minimum": ("must be at least", "(minimum)"), "maximum": ("must be at most", "(maximum)")}
            before, after = label[node.op]
            text = f"{name}: {before} {arg} {after}"
        return d.lit(text)


def member_columns() -> dict[Path, str]:
    """Each JSON member path's column in ``format.FLAT_SCHEMA``."""
    from . import format as fmt

    columns = {}
    for column in fmt.COLUMNS:
        if column == "line":
            continue
        if column.startswith("effects_"):
            columns[("effects", column.removeprefix("effects_"))] = column
        else:
            columns[({c: m for m, c in fmt.RENAMED.items()}.get(column, column),)] = column
    return columns


class ParquetAccess(Access):
    """A Parquet row's JSON view in any dialect: its kind's members (null columns as JSON null), plus every non-null
    column its kind does not have, as an extra member. The request fingerprint's string is its lowercase hex."""

    def __init__(self, dialect: Dialect):
        from . import format as fmt

        self.d = dialect
        self.kind: str | None = None  # the row's kind, when a branch knows it
        self.compiled = compile_event()
        self.columns = member_columns()
        self.own = {path: ("string" if str(fmt.FLAT_SCHEMA.field(c).type) in ("string", "fixed_size_binary[32]")
                           else "boolean" if str(fmt.FLAT_SCHEMA.field(c).type) == "bool" else "integer")
                    for path, c in self.columns.items()}
        self.kinds_having: dict[Path, list[str]] = {}
        for kind, names in self.compiled.kinds.items():
            for name in names:
                self.kinds_having.setdefault((name,), []).append(kind)
        for path, by_kind in self.compiled.object_members.items():
            for kind, names in by_kind.items():
                for name in names:
                    self.kinds_having.setdefault((*path, name), []).append(kind)

    def _below(self, path: Path) -> list[Path]:
        return [p for p in self.columns if p[:len(path)] == path and len(p) > len(path)]

    def assume(self, path: Path, value: Any) -> Access:
        if path != ("kind",):
            return self
        narrowed = copy.copy(self)
        narrowed.kind = value
        return narrowed

    def _of_kind(self, path: Path) -> Any:
        kinds = self.kinds_having.get(path, [])
        if self.kind is not None:
            return self.d.lit(self.kind in kinds)
        return self.d.in_(self.d.col("kind"), kinds) if kinds else self.d.lit(False)

    def _not_null(self, path: Path) -> Any:
        return self.d.not_(self.d.is_null(self.d.col(self.columns[path])))

    def present(self, path: Path) -> Any:
        d = self.d
        if not path:
            return d.lit(True)
        if path in self.compiled.object_members:
            return d.or_([self._of_kind(path), *(self._not_null(p) for p in self._below(path))])
        if path not in self.columns:
            return d.lit(False)
        return d.or_([self._not_null(path), self._of_kind(path)])

    def type_is(self, path: Path, types: tuple[str, ...]) -> Any:
        d = self.d
        if not path or path in self.compiled.object_members:
            return d.and_([self.present(path), d.lit("object" in types)])
        if path not in self.columns:
            return d.lit(False)
        parts = []
        if self.own[path] in types:
            parts.append(self._not_null(path))
        if "null" in types:
            parts.append(d.and_([d.is_null(d.col(self.columns[path])), self._of_kind(path)]))
        return d.or_(parts) if parts else d.lit(False)

    def string(self, path: Path) -> Any:
        column = self.d.col(self.columns[path])
        return self.d.hex_lower(column) if self.columns[path] == "request_fingerprint" else column

    def integer(self, path: Path) -> Any:
        return self.d.cast_long(self.d.col(self.columns[path]))

    def boolean(self, path: Path) -> Any:
        return self.d.col(self.columns[path])

    def _unknown_names(self, path: Path, allowed: tuple[str, ...]) -> list[str]:
        names: list[str] = []
        for p in self._below(path):
            if p[len(path)] not in names and p[len(path)] not in allowed:
                names.append(p[len(path)])
        return names

    def unknown_member(self, path: Path, allowed: tuple[str, ...]) -> Any:
        names = self._unknown_names(path, allowed)
        if not names:
            return self.d.lit(None)
        return self.d.when([(self.present((*path, n)), self.d.lit(n)) for n in names], self.d.lit(None))

    def only_members(self, dialect: Dialect, path: Path, allowed: tuple[str, ...]) -> Any:
        return dialect.and_([dialect.not_(self.present((*path, n))) for n in self._unknown_names(path, allowed)])


class PythonDialect(Dialect):
    """Plain Python values: ``Renderer(PythonDialect(), EventAccess(event)).explain(tree)`` is the message."""

    def lit(self, value: Any) -> Any:
        return value

    def and_(self, items: list[Any]) -> Any:
        return all(items)

    def or_(self, items: list[Any]) -> Any:
        return any(items)

    def not_(self, item: Any) -> Any:
        return not item

    def when(self, branches: list[tuple[Any, Any]], otherwise: Any) -> Any:
        return next((result for condition, result in branches if condition), otherwise)

    def coalesce(self, items: list[Any]) -> Any:
        return next((item for item in items if item is not None), None)

    def eq(self, a: Any, b: Any) -> Any:
        return None if a is None or b is None else a == b

    def cmp(self, a: Any, op: str, b: Any) -> Any:
        return None if a is None else (a >= b if op == ">=" else a <= b)

    def length(self, a: Any) -> Any:
        return None if a is None else len(a)

    def matches(self, a: Any, pattern: str) -> Any:
        from spec import ecma_pattern

        return None if a is None else ecma_pattern(pattern.replace(r"\z", "$")).search(a) is not None

    def concat(self, items: list[Any]) -> Any:
        return None if any(i is None for i in items) else "".join(items)

    def is_null(self, a: Any) -> Any:
        return a is None

    def count_true(self, items: list[Any]) -> Any:
        return sum(bool(i) for i in items)


class EventAccess(Access):
    """Members of a parsed JSON event (``json.loads(parse_float=FloatLiteral)``)."""

    def __init__(self, event: Any):
        self.event = event

    def _get(self, path: Path) -> tuple[bool, Any]:
        value = self.event
        for name in path:
            if not isinstance(value, dict) or name not in value:
                return False, None
            value = value[name]
        return True, value

    def present(self, path: Path) -> Any:
        return self._get(path)[0]

    def type_is(self, path: Path, types: tuple[str, ...]) -> Any:
        present, value = self._get(path)
        return present and json_type(value) in types

    def string(self, path: Path) -> Any:
        value = self._get(path)[1]
        return value if isinstance(value, str) else None

    def integer(self, path: Path) -> Any:
        value = self._get(path)[1]
        return value if json_type(value) == "integer" else None

    def boolean(self, path: Path) -> Any:
        value = self._get(path)[1]
        return value if isinstance(value, bool) else None

    def unknown_member(self, path: Path, allowed: tuple[str, ...]) -> Any:
        value = self._get(path)[1]
        return next((k for k in value if k not in allowed), None) if isinstance(value, dict) else None


def explain(event: Any) -> str | None:
    """The message ``Renderer.explain`` gives a parsed event, computed in Python (for the few invalid events a report
    lists), or None when the event is valid."""
    return Renderer(PythonDialect(), EventAccess(event)).explain(compile_event().tree)


# --- Python evaluation of the tree (tests hold it to jsonschema) -------------------------------------------------

def json_type(value: Any) -> str:
    """The tree's JSON type of a parsed value (``integer`` only for an int64 integer literal)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) and not isinstance(value, FloatLiteral):
        return "integer" if INT64[0] <= value <= INT64[1] else "number"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "array"


class FloatLiteral(float):
    """A JSON number written with a fraction or an exponent (``json.loads(parse_float=FloatLiteral)``)."""


def evaluate(node: Any, event: Any) -> bool:
    """Whether ``event`` (parsed JSON) satisfies ``node``."""

    def get(path: Path) -> tuple[bool, Any]:
        value = event
        for name in path:
            if not isinstance(value, dict) or name not in value:
                return False, None
            value = value[name]
        return True, value

    def leaf(check: Check) -> bool:
        present, value = get(check.path)
        if check.op == "present":
            return present
        if not present:
            return False
        kind = json_type(value)
        if check.op == "type":
            return kind in check.arg
        if check.op in ("const", "enum"):
            return any(json_type(v) == kind and v == value for v in
                       ([check.arg] if check.op == "const" else check.arg))
        if check.op == "min_length":
            return kind == "string" and len(value) >= check.arg
        if check.op == "max_length":
            return kind == "string" and len(value) <= check.arg
        if check.op == "pattern":
            from spec import ecma_pattern

            return kind == "string" and ecma_pattern(check.arg).search(value) is not None
        if check.op == "minimum":
            return kind == "integer" and value >= check.arg
        if check.op == "maximum":
            return kind == "integer" and value <= check.arg
        if check.op == "only_keys":
            return kind == "object" and set(value) <= set(check.arg)
        raise TypeError(check.op)

    def walk(n: Any) -> bool:
        if isinstance(n, Check):
            return leaf(n)
        if isinstance(n, All):
            return all(walk(i) for i in n.items)
        if isinstance(n, AnyOf):
            hits = sum(walk(i) for i in n.items)
            return hits == 1 if n.one else hits >= 1
        if isinstance(n, Not):
            return not walk(n.item)
        if isinstance(n, Cond):
            return walk(n.then) if walk(n.when) else walk(n.otherwise)
        raise TypeError(n)

    return walk(node)


# --- the line rules in Python (the oracle's reading) -------------------------------------------------------------

_LONE = (re.compile(ESCAPED_BACKSLASH), re.compile(SURROGATE_PAIR), re.compile(SURROGATE))
_BLANK = re.compile(BLANK_PATTERN)


class _Object(dict):
    duplicated: bool = False


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    obj.duplicated = len(obj) != len(pairs)
    return obj


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def blank_strings(text: str) -> str:
    """``text`` with every string blanked (``ESCAPE_PATTERN``, then ``PLAIN_STRING_PATTERN``)."""
    return re.sub(PLAIN_STRING_PATTERN, '""', re.sub(ESCAPE_PATTERN, "__", text))


def too_many_containers(text: str) -> bool:
    """More than ``MAX_CONTAINERS`` ``{``/``[`` outside strings (counted on any text, JSON or not)."""
    if text.count("[") + text.count("{") <= MAX_CONTAINERS:
        return False
    return len(re.sub(NOT_OPENING, "", blank_strings(text))) > MAX_CONTAINERS


def has_long_number(text: str) -> bool:
    """More than ``MAX_DIGITS`` digits in a row outside strings."""
    return re.search(LONG_DIGITS_PATTERN, text) is not None and \
        re.search(LONG_DIGITS_PATTERN, blank_strings(text)) is not None


def has_lone_surrogate(text: str) -> bool:
    neutral = _LONE[1].sub("__", _LONE[0].sub("__", text))
    return _LONE[2].search(neutral) is not None


def parse_line(raw: bytes, terminated: bool, check_schema: Callable[[dict[str, Any]], str | None]
               ) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """One JSONL line -> (event, None, None) or (None, reason, message); ``check_schema`` returns a message or None.

    The oracle's implementation of the line rules, with Python's own parser; Spark and DuckDB state the same rules
    with theirs (``spark_checks._spark_input``, ``spark_checks.duck``).
    """
    event, reason, message = _parse_line(raw, check_schema)
    if reason in TORN and not terminated:
        return None, TORN_TAIL, TORN_MESSAGE
    return event, reason, message


def _parse_line(raw: bytes, check_schema: Callable[[dict[str, Any]], str | None]
                ) -> tuple[dict[str, Any] | None, str | None, str | None]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, "not_utf8", f"byte {exc.start}: {REASONS['not_utf8']}"
    if _BLANK.match(text):
        return None, "blank", REASONS["blank"]
    if text.startswith("\ufeff"):
        return None, "bom", REASONS["bom"]
    if has_lone_surrogate(text):
        return None, "lone_surrogate", REASONS["lone_surrogate"]
    if too_many_containers(text):
        return None, "nesting", REASONS["nesting"]
    if has_long_number(text):
        return None, "long_number", REASONS["long_number"]
    try:
        event = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=FloatLiteral)
    except (ValueError, RecursionError) as exc:
        return None, "not_json", f"{REASONS['not_json']}: {exc}"
    if not isinstance(event, dict):
        return None, "not_object", f"{REASONS['not_object']} ({json_type(event)})"
    compiled = compile_event()
    for path in ((), *compiled.object_paths):
        value: Any = event
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        if isinstance(value, _Object) and value.duplicated:
            return None, "duplicate_member", f"{member(path)}: a member name appears twice"
    for path in compiled.integer_paths:
        value = event
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        if json_type(value) == "number":
            return None, "integer_literal", f"{member(path)}: {REASONS['integer_literal']}"
    problem = check_schema(event)
    if problem is not None:
        return None, "schema", problem
    return event, None, None


__all__ = ["REASONS", "TORN", "TORN_TAIL", "Access", "Compiled", "Dialect", "ParquetAccess", "Renderer",
           "SchemaNotUnderstood",
           "compile_event", "evaluate", "json_type", "parse_line"]
