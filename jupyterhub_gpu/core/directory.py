"""Which hub groups a user's directory groups make them a member of.

An identity provider (an LDAP directory, an OIDC groups claim) says which of
*its* groups a user is in; the policy says which of them count. A policy
group's ``directory_groups`` lists the directory groups (names, DNs, numeric or
object IDs, paths such as ``/research/nlp``) whose members are its members;
without it, the directory group of the same name. Every other directory group is
left out, so a site's thousands of mailing-list groups never appear in the hub,
unless the admin asks for them all (``all_groups``); even then a directory
group never joins a policy group merely by sharing its name when that policy
group lists other directory groups.

Matching is exact, because a near match is a way in: a group someone may create
or rename (`` HPC-Admins ``, or ``hpc-admin`` ending in U+017F, whose case folding is
``hpc-admins``) must never stand for the one the policy names.

- A name, an ID or a path matches only the identical string: no case folding, no
  trimming. ``case_insensitive`` (an opt-in for providers that change the case of
  names) folds the letters A-Z only.
- A DN (``cn=hpc-admins,ou=groups,dc=example,dc=edu``) matches the same DN as
  RFC 4514 reads it: attribute types without regard to case, spaces around the
  separators and escaping (``\\2C`` or ``\\,``) do not count, and the letters A-Z
  of the values without regard to case, as every directory compares the ``cn``,
  ``ou``, ``dc`` and ``o`` that name groups and their containers (two entries
  differing only so cannot both exist). Nothing else is folded.

Whether a group is known by its name at all is the authenticator's decision (an
LDAP group found outside the site's group search base is known by its DN only:
see ``DirectoryGroup.named``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .model import Policy

# only ASCII letters are folded: Unicode case folding maps characters such as
# U+017F (long s) and U+212A (Kelvin sign) onto ASCII letters
_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_HEX = set("0123456789abcdefABCDEF")

RDN = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DirectoryGroup:
    """A group the directory says a user is in: its name, and the other ways a policy
    may refer to it (its DN, a gidNumber, an object ID, a path).

    ``named``: whether the group may be matched by ``name`` at all. An LDAP group
    seen only through ``memberOf`` outside the site's group search base is not: its
    name is anyone's to choose, so only its full DN (an alias) can match."""

    name: str
    aliases: tuple[str, ...] = ()
    named: bool = True

    @property
    def identifiers(self) -> tuple[str, ...]:
        return (self.name, *self.aliases) if self.named else self.aliases


@dataclass(frozen=True)
class GroupMapping:
    """What a user's directory groups come to."""

    #: the user's hub groups: the policy's, in policy order, then (``all_groups``)
    #: the other directory groups by name, sorted
    groups: tuple[str, ...]
    #: names of the directory groups no policy group names (left out unless ``all_groups``)
    unnamed: tuple[str, ...]
    #: with ``all_groups``: unnamed directory groups that were not added because their
    #: name is a policy group's (or ``everyone``), which names other directory groups
    withheld: tuple[str, ...] = ()


def parse_dn(text: str) -> tuple[RDN, ...] | None:
    """A DN as RFC 4514 reads it: its RDNs, each a sorted tuple of (attribute type in
    lower case, value unescaped); ``None`` when ``text`` is not a DN."""
    rdns: list[RDN] = []
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        # attribute type, up to '='
        j = text.find("=", i)
        if j < 0:
            return None
        attribute = text[i:j].strip().lower()
        name_ok = attribute[:1].isalpha() and all(
            c.isascii() and (c.isalnum() or c == "-") for c in attribute
        )
        oid_ok = all(p.isdigit() for p in attribute.split("."))
        if not (name_ok or oid_ok):
            return None
        # value, up to an unescaped ',' or '+' or the end
        i = j + 1
        raw = bytearray()
        trailing = 0  # unescaped spaces at the end of what has been read
        leading = True
        while i < n and text[i] not in ",+":
            c = text[i]
            if c == "\\":
                pair = text[i + 1 : i + 3]
                if len(pair) == 2 and set(pair) <= _HEX:
                    raw.append(int(pair, 16))
                    i += 3
                elif i + 1 < n:
                    raw += text[i + 1].encode()
                    i += 2
                else:
                    return None
                trailing = 0
                leading = False
                continue
            if c == " " and leading:
                i += 1
                continue
            leading = False
            raw += c.encode()
            trailing = trailing + 1 if c == " " else 0
            i += 1
        try:
            value = bytes(raw[: len(raw) - trailing] if trailing else raw).decode()
        except UnicodeDecodeError:
            return None
        pairs.append((attribute, value))
        if i >= n or text[i] == ",":
            rdns.append(tuple(sorted(pairs)))
            pairs = []
        if i >= n:
            return tuple(rdns)
        i += 1


def _dn_key(rdns: tuple[RDN, ...]) -> tuple[RDN, ...]:
    return tuple(tuple((t, v.translate(_ASCII_FOLD)) for t, v in rdn) for rdn in rdns)


def dn_within(dn: str, base: str) -> bool:
    """Whether ``dn`` names an entry below ``base`` (compared as ``directory_key`` does)."""
    entry, container = parse_dn(dn), parse_dn(base)
    if not entry or not container or len(entry) <= len(container):
        return False
    return _dn_key(entry[-len(container) :]) == _dn_key(container)


def directory_key(identifier: str, *, case_insensitive: bool = False) -> object:
    """The form two identifiers are compared in: a DN as RFC 4514 reads it (types
    without case, values without the case of A-Z); anything else exactly as written
    (``case_insensitive``: without the case of A-Z)."""
    if "=" in identifier:
        rdns = parse_dn(identifier)
        if rdns:
            return ("dn", _dn_key(rdns))
    return ("name", identifier.translate(_ASCII_FOLD) if case_insensitive else identifier)


def _loose(name: str) -> str:
    # only to withhold: a group merely *resembling* a reserved name is withheld too
    return name.strip().casefold()


def hub_groups(
    policy: Policy,
    memberships: Iterable[DirectoryGroup],
    *,
    all_groups: bool = False,
    case_insensitive: bool = False,
) -> GroupMapping:
    """The hub groups of a user who is in the directory groups ``memberships``."""
    members_of: dict[object, list[str]] = {}  # directory key -> policy groups it makes a member of
    for group in policy.groups.values():
        for identifier in group.directory_groups or (group.name,):
            key = directory_key(identifier, case_insensitive=case_insensitive)
            members_of.setdefault(key, []).append(group.name)
    chosen: set[str] = set()
    unnamed: list[DirectoryGroup] = []
    for membership in memberships:
        named = {
            g
            for i in membership.identifiers
            for g in members_of.get(directory_key(i, case_insensitive=case_insensitive), ())
        }
        if named:
            chosen |= named
        elif membership not in unnamed:
            unnamed.append(membership)
    groups = sorted(chosen, key=policy.group_order.__getitem__)
    withheld: list[str] = []
    if all_groups:
        # a directory group called like a policy group that names other directory groups
        # must not grant that group's profiles and quota by its name alone
        reserved = {_loose(n) for n in [*policy.groups, "everyone"]}
        extra = set()
        for membership in unnamed:
            if not membership.named:
                continue  # known by its DN only: its name is not the directory's to vouch for
            if _loose(membership.name) in reserved:
                withheld.append(membership.name)
            else:
                extra.add(membership.name)
        groups += sorted(extra - chosen)
    return GroupMapping(
        groups=tuple(groups),
        unnamed=tuple(dict.fromkeys(m.name for m in unnamed)),
        withheld=tuple(withheld),
    )
