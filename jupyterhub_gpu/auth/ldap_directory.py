"""Talking to an LDAP directory for ``LDAPGroupsAuthenticator``: off the event loop
and bounded (``DirectoryCalls``), searches read page by page, group entries named
safely. ldap3's calls block; here they only ever run in worker threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

import ldap3
from ldap3.utils.dn import parse_dn

from ..core.directory import DirectoryGroup

T = TypeVar("T")
_PAGE_SIZE = 500  # below OpenLDAP's and Active Directory's default size limits


class DirectoryUnavailable(Exception):
    """The directory could not be reached or answered a search with an error."""


class TLSSettingsError(DirectoryUnavailable):
    """The hub's own TLS settings cannot work (a CA file that is not there)."""


class DirectoryBusy(DirectoryUnavailable):
    """Every directory call slot stayed taken for longer than the receive timeout."""


class DirectoryCalls:
    """At most ``limit`` directory calls at once, each in a worker thread of its own;
    a call that finds them all taken waits at most ``wait`` seconds for one."""

    def __init__(self, limit: int, wait: float) -> None:
        self.limit = limit
        self.wait = wait
        self._executor = concurrent.futures.ThreadPoolExecutor(
            limit, thread_name_prefix="ldap-directory"
        )
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    async def run(self, call: Callable[[], T]) -> T:
        """``call`` (blocking ldap3 work) in a worker thread; its result or its error."""
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.limit))
        try:
            await asyncio.wait_for(slots.acquire(), self.wait)
        except TimeoutError:
            raise DirectoryBusy(
                f"all {self.limit} directory calls (max_directory_calls) were "
                f"still waiting for the directory after {self.wait:g} s"
            ) from None
        try:
            # a fresh context per call: the worker threads are reused
            return await loop.run_in_executor(self._executor, contextvars.Context().run, call)
        finally:
            # released when the thread is done (every ldap3 call in it has a timeout),
            # so never more threads than slots talk to the directory
            slots.release()


def search_all(conn, base: str, search_filter: str, scope, attributes) -> list[dict]:
    """Every entry of a search, page by page; an error is raised, never an empty list."""
    entries: list[dict] = []
    cookie = None
    while True:
        conn.search(
            base,
            search_filter,
            scope,
            attributes=attributes,
            paged_size=_PAGE_SIZE if scope != ldap3.BASE else None,
            paged_cookie=cookie,
        )
        result = conn.result
        if result["result"] != 0:
            raise DirectoryUnavailable(
                f"searching {base!r} for {search_filter} answered "
                f"{result['description']} ({result['result']}) {result['message']}".rstrip()
            )
        entries += [r for r in conn.response if r.get("type") == "searchResEntry"]
        control = result.get("controls", {}).get("1.2.840.113556.1.4.319")
        cookie = control["value"]["cookie"] if control else None
        if not cookie:
            return entries


def directory_group(dn: str, attributes: dict, settings: Any, named: bool) -> DirectoryGroup:
    """A directory group: named by its DN's own name (``cn=research,...``:
    ``research``) when that is ``settings.group_name_attribute``, else by that
    attribute's one value (several: by its DN only, as any could be chosen); also
    known by its DN and its IDs (``settings.group_id_attribute``)."""
    rdn = parse_dn(dn)[0]
    values = attributes.get(settings.group_name_attribute)
    values = values if isinstance(values, list) else [values] if values else []
    if rdn[0].lower() == settings.group_name_attribute.lower():
        name = rdn[1]
    elif len(values) == 1:
        name = str(values[0])
    else:
        name, named = dn, False
    ids = attributes.get(settings.group_id_attribute, []) if settings.group_id_attribute else []
    ids = ids if isinstance(ids, list) else [ids]
    return DirectoryGroup(name=name, aliases=(dn, *(str(i) for i in ids)), named=named)


def run_to_end(coroutine: Any) -> Any:
    """The result of a coroutine that never waits on anything (ldapauthenticator's
    ``authenticate`` is all blocking ldap3 calls), run in the calling thread."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError(
        "LDAPGroupsAuthenticator: ldapauthenticator's authenticate waited on something; "
        "this ldapauthenticator version is not supported"
    )
