"""How a policy key is declared, and how a mapping of the policy is read through its keys.

A ``Key`` says once what may be written under a name: its type (how the value is
checked and converted, and the words an admin reads when it is wrong), its default,
whether it is required, and a line of help. ``keys`` and ``settings`` declare every
key of the policy with them; from that one table come the parser's key checks
(``Reader``), its unknown-key errors, the ``GPUPolicy`` traits' help and the
reference's tables (``reference``). What relates keys to each other (a limit at least
its quota, a profile's flavor one the policy defines) is the section's parser's, in
``sections`` and ``parse``. Pure: no I/O.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyterhub_gpu.core.quantities import QuantityError

PREFIX = "hub.config.GPUPolicy"


class Errors:
    """Collects every problem instead of stopping at the first."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(
            f"{self.prefix}.{path}: {message}" if path else f"{self.prefix}: {message}"
        )

    def mapping(self, path: str, value: Any) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(path, f"expected a mapping, got {value!r}")
            return {}
        return value

    def keys(self, path: str, value: Mapping[str, Any], allowed: Collection[str]) -> None:
        for key in value:
            if key not in allowed:
                hint = ", ".join(sorted(allowed))
                self.add(f"{path}.{key}", f"unknown key (allowed here: {hint})")

    def convert(self, path: str, value: Any, parse) -> Any:
        try:
            return parse(value)
        except QuantityError as e:
            self.add(path, str(e))
            return None

    def string(self, path: str, value: Any, *, required: bool = False) -> str | None:
        if value is None:
            if required:
                self.add(path, "required")
            return None
        if not isinstance(value, str) or not value:
            self.add(path, f"expected a non-empty string, got {value!r}")
            return None
        return value

    def whole(self, path: str, value: Any, *, minimum: int = 0) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.add(path, f"expected a whole number >= {minimum}, got {value!r}")
            return None
        return value

    def string_map(self, path: str, value: Any) -> dict[str, str]:
        result = {}
        for k, v in self.mapping(path, value).items():
            if not isinstance(v, str | int | float) or isinstance(v, bool):
                self.add(f"{path}.{k}", f"expected a string, got {v!r}")
            else:
                result[str(k)] = str(v)
        return result


def unknown_settings(path: str, given: Iterable[Any], names: Iterable[str]) -> list[str]:
    """An error for each setting in ``given`` that is not one of ``names``, with the
    likeliest meant one (``hub.config.GPUPolicy.when_ful: unknown setting; did you mean
    when_full?``): traitlets only warns about them, and a misspelt setting silently
    left at its default is a policy nobody wrote."""
    known = sorted(names)
    errors = []
    for key in given:
        close = difflib.get_close_matches(str(key), known, n=1)
        if str(key) not in known:
            hint = f"did you mean {close[0]}? " if close else ""
            errors.append(f"{path}.{key}: unknown setting; {hint}(settings: {', '.join(known)})")
    return errors


# ---- what a key's value is --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KeyType:
    """What a key's value is: ``doc`` names it in the reference; ``read`` checks a value
    as written and returns it converted, or None (after an error) when it is wrong.

    This base reads the value as written: the section's parser checks it (a list of
    names of other parts of the policy, a nested mapping with keys of its own)."""

    doc: str
    #: what a key of this type reads as when it is not written and has no default
    unset: Any = None

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        return value

    def unwritten(self, e: Errors, path: str, key: Key) -> Any:
        """The value of ``key`` not written: its default, read as if written."""
        return self.read(e, path, key.default, key)


@dataclass(frozen=True, kw_only=True)
class Text(KeyType):
    """A non-empty string. Written null or wrong, it reads as its default."""

    doc: str = "text"

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        return e.string(path, value, required=key.required is True) or key.fallback

    def unwritten(self, e: Errors, path: str, key: Key) -> Any:
        return key.default  # "" too: a description not written is empty, not wrong


@dataclass(frozen=True, kw_only=True)
class Whole(KeyType):
    """A whole number of at least ``minimum``."""

    minimum: int = 0
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.doc:
            object.__setattr__(self, "doc", f"whole number ≥ {self.minimum}")

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        return e.whole(path, value, minimum=self.minimum)


@dataclass(frozen=True, kw_only=True)
class Quantity(KeyType):
    """A number, Kubernetes quantity or duration, converted by ``parse`` (a function of
    ``quantities``); ``wrong``: the words when it is not one (else ``parse``'s own)."""

    parse: Callable[[Any], Any]
    wrong: str = ""

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        if not self.wrong:
            return e.convert(path, value, self.parse)
        try:
            return self.parse(value)
        except QuantityError:
            e.add(path, f"expected {self.wrong}, got {value!r}")
            return None


@dataclass(frozen=True, kw_only=True)
class Flag(KeyType):
    """true or false. Written wrong, it reads as its default."""

    doc: str = "true or false"

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        if isinstance(value, bool):
            return value
        e.add(path, f"expected true or false, got {value!r}")
        return key.fallback


@dataclass(frozen=True, kw_only=True)
class Choice(KeyType):
    """One of ``values``. Written wrong, it reads as its default."""

    values: tuple[str, ...] = ()
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.doc:
            object.__setattr__(self, "doc", choice_words(self.values, "`"))

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        if value in self.values:
            return value
        e.add(path, f"expected {choice_words(self.values)}, got {value!r}")
        return key.fallback


def choice_words(values: Iterable[str], quote: str = "") -> str:
    """``a or b``; ``one of a, b, c`` for more than two."""
    named = [f"{quote}{v}{quote}" for v in values]
    if len(named) == 2:
        return " or ".join(named)
    return "one of " + ", ".join(named)


@dataclass(frozen=True, kw_only=True)
class Labels(KeyType):
    """A mapping of names to strings (numbers are written as strings)."""

    doc: str = "mapping of text"

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        return e.string_map(path, value)


@dataclass(frozen=True, kw_only=True)
class Checked(KeyType):
    """A value ``check(e, path, value)`` checks and converts: a list of CIDRs, a DN."""

    check: Callable[[Errors, str, Any], Any]

    def read(self, e: Errors, path: str, value: Any, key: Key) -> Any:
        return self.check(e, path, value)


# ---- a key, and a mapping read through its keys ------------------------------------


@dataclass(frozen=True)
class Derived:
    """A default worked out from the rest of the policy (the group's name, the
    scheduler's classes): the words say which; the section's parser works it out."""

    words: str


@dataclass(frozen=True)
class Key:
    """One key of the policy: ``name: <type>``, what it is (``help``, one line), and what
    holds when it is not written: ``default`` (read as if written: a quantity is
    converted, ``"1Gi"`` reads as bytes), ``Derived`` (the parser's), or with
    ``required`` an error: True checks the missing value as null (the type's own words,
    ``required`` for text), a string is the error's words. ``null_unset``: ``key: null``
    is the same as not writing it (else null is checked like any value).

    ``check``: what the type alone does not say, on the value read (None if the type
    found it wrong) and as written: ``check(e, path, value, written) -> value``.
    ``details``: more than a line, for a setting's help (``GPUPolicy.<name>``);
    ``default_words``: the default as the reference writes it, where the value would
    not read well there.
    """

    name: str
    type: KeyType
    help: str
    default: Any = None
    required: bool | str = False
    null_unset: bool = False
    check: Callable[[Errors, str, Any, Any], Any] | None = None
    details: str = ""
    default_words: str = ""
    #: the value when it is not written, where that is the same each time (worked out
    #: once: the parser reads thousands of groups at a hub's start)
    _unwritten: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unwritten = _EACH_TIME
        if not self.required:
            e = Errors(self.name)
            unwritten = self._unwritten_value(e, self.name)
            assert not e.items, f"the default of {self.name} is wrong: {e.items}"
            try:
                hash(unwritten)
            except TypeError:
                unwritten = _EACH_TIME  # a mapping or a list: each reading gets its own
        object.__setattr__(self, "_unwritten", unwritten)

    @property
    def fallback(self) -> Any:
        """What a wrong value reads as, for the types that fall back: the default, or
        None where it is derived (the section's parser works it out)."""
        return None if isinstance(self.default, Derived) else self.default

    def read(self, e: Errors, parent: str, written: Any) -> Any:
        """The value of this key in the mapping at ``parent``, given ``written``
        (``ABSENT`` when it is not)."""
        if written is None and self.null_unset:
            written = ABSENT
        if written is ABSENT and self._unwritten is not _EACH_TIME:
            return self._unwritten
        path = f"{parent}.{self.name}" if parent else self.name
        if written is ABSENT:
            return self._unwritten_value(e, path)
        return self._checked(e, path, written)

    def _unwritten_value(self, e: Errors, path: str) -> Any:
        if isinstance(self.required, str):
            e.add(path, self.required)
            return None
        if self.required:
            return self._checked(e, path, None)
        if self.default is None:
            return self.type.unset
        if isinstance(self.default, Derived):
            return None
        return self.type.unwritten(e, path, self)

    def _checked(self, e: Errors, path: str, written: Any) -> Any:
        value = self.type.read(e, path, written, self)
        if self.check is not None:
            value = self.check(e, path, value, written)
        return value


#: a key not written in its mapping
ABSENT: Any = object()
#: a key's value not written is worked out each time it is read
_EACH_TIME: Any = object()


@dataclass(frozen=True)
class Section:
    """The keys of one mapping of the policy (``groups.<name>``, a budget), in the order
    the reference lists them; ``path`` is where it is, as the reference writes it."""

    path: str
    keys: Mapping[str, Key]
    help: str = ""
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(self.keys))

    def __getitem__(self, name: str) -> Key:
        return self.keys[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __add__(self, other: Section) -> Section:
        """Both sections' keys (a flavor's common keys and its kind's)."""
        return Section(self.path, {**self.keys, **other.keys}, self.help)


def section(path: str, *keys: Key, help: str = "") -> Section:
    return Section(path, {k.name: k for k in keys}, help)


class Reader:
    """One mapping of the policy as written, read through its section's keys.

    Unknown keys are reported when it is made (against ``allowed``, by default every
    key of ``keys``); each key is checked when its value is first asked for, so the
    section's parser decides the order errors are reported in, and a key it never
    asks for (the section is wrong already) is not checked."""

    def __init__(
        self,
        e: Errors,
        path: str,
        raw: Any,
        keys: Section,
        *,
        allowed: Iterable[str] | None = None,
        check_unknown: bool = True,
    ) -> None:
        self.e = e
        self.path = path
        self.keys = keys
        self.spec = e.mapping(path, raw)
        self._values: dict[str, Any] = {}
        if check_unknown:
            e.keys(path, self.spec, keys.names if allowed is None else allowed)

    def check_unknown(self, keys: Section) -> None:
        """Report the keys written that are not ``keys``' (which are read from then on):
        for a mapping whose keys depend on one of them (a flavor's kind)."""
        self.keys = keys
        self.e.keys(self.path, self.spec, keys.names)

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` is written (null included)."""
        return name in self.spec

    def written(self, name: str) -> Any:
        """``name`` as written (None if it is not)."""
        return self.spec.get(name)

    def __getitem__(self, name: str) -> Any:
        """``name``'s value: checked and converted, its default where it is not written,
        None where it is wrong (after the error) or has no default."""
        value = self._values.get(name, ABSENT)
        if value is ABSENT:
            value = self.keys.keys[name].read(self.e, self.path, self.spec.get(name, ABSENT))
            self._values[name] = value
        return value

    def require(self, *names: str) -> None:
        """Report each of ``names`` that is not written, now (they are then None)."""
        for name in names:
            if name not in self.spec and name not in self._values:
                self._values[name] = self.keys[name].read(self.e, self.path, ABSENT)
