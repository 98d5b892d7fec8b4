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

Identifiers are compared without regard to case, as LDAP compares names and DNs,
and a DN also without the spaces around its separators. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .model import Policy

# spaces around a DN's separators do not change which entry it names (RFC 4514)
_DN_SPACES = re.compile(r"\s*([,=+])\s*")


@dataclass(frozen=True)
class DirectoryGroup:
    """A group the directory says a user is in: its name, and the other ways a policy
    may refer to it (its DN, a gidNumber, an object ID, a path)."""

    name: str
    aliases: tuple[str, ...] = ()

    @property
    def identifiers(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


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


def directory_key(identifier: str) -> str:
    """The form two identifiers are compared in: case-folded, a DN without spaces
    around its separators, leading and trailing spaces dropped."""
    key = identifier.strip().casefold()
    return _DN_SPACES.sub(r"\1", key) if "=" in key else key


def hub_groups(
    policy: Policy, memberships: Iterable[DirectoryGroup], *, all_groups: bool = False
) -> GroupMapping:
    """The hub groups of a user who is in the directory groups ``memberships``."""
    members_of: dict[str, list[str]] = {}  # directory key -> policy groups it makes a member of
    for group in policy.groups.values():
        for identifier in group.directory_groups or (group.name,):
            members_of.setdefault(directory_key(identifier), []).append(group.name)
    chosen: set[str] = set()
    unnamed: list[str] = []
    for membership in memberships:
        named = {g for i in membership.identifiers for g in members_of.get(directory_key(i), ())}
        if named:
            chosen |= named
        elif membership.name not in unnamed:
            unnamed.append(membership.name)
    groups = sorted(chosen, key=policy.group_order.__getitem__)
    withheld: list[str] = []
    if all_groups:
        # a directory group called like a policy group that names other directory groups
        # must not grant that group's profiles and quota by its name alone
        reserved = {directory_key(n) for n in [*policy.groups, "everyone"]}
        extra = set()
        for name in unnamed:
            if directory_key(name) in reserved:
                withheld.append(name)
            else:
                extra.add(name)
        groups += sorted(extra - chosen)
    return GroupMapping(groups=tuple(groups), unnamed=tuple(unnamed), withheld=tuple(withheld))
