"""What a login or a spawn is told when the directory fails it (the login page's
words), and the cause and the fix the hub log gets."""

from __future__ import annotations

from dataclasses import dataclass

from .ldap_directory import DirectoryBusy, TLSSettingsError

#: what the login page says when the directory cannot be read; the hub log has the why
DIRECTORY_DOWN = (
    "Cannot log in right now: the directory (LDAP) could not be reached or read, so "
    "no one's login or groups can be checked. Nothing was changed. Try again in a few "
    "minutes; if it keeps happening, tell the hub's administrators."
)
#: ... when it did not answer in time (or too many logins were waiting for it)
DIRECTORY_SLOW = (
    "Cannot log in right now: the directory (LDAP) did not answer in time, so your "
    "login and groups could not be checked. Nothing was changed. Try again in a few "
    "minutes; if it keeps happening, tell the hub's administrators."
)
#: ... when its TLS certificate is not one the hub trusts: the password was not sent
DIRECTORY_UNTRUSTED = (
    "Cannot log in right now: the directory (LDAP) could not prove who it is (its TLS "
    "certificate is not trusted by the hub), so your password was not sent to it. "
    "Tell the hub's administrators."
)
#: what a spawn says when the groups are too old and the hub cannot read them itself
STALE_GROUPS_AT_SPAWN = (
    "Cannot start a server yet: your groups were last read from the directory {when}, "
    "and the hub can read them again only when you log in. Log out, log in again, "
    "then start the server."
)
#: what a spawn says when the directory cannot confirm the user's groups
DIRECTORY_DOWN_AT_SPAWN = (
    "Cannot start a server right now: the directory (LDAP) could not be read to check "
    "your groups. Nothing was started. Try again in a few minutes; if it keeps "
    "happening, tell the hub's administrators."
)


@dataclass(frozen=True)
class DirectoryFailure:
    """One failure of the directory, as the refusal and the log word it."""

    #: the error itself, as the log shows it
    text: str
    #: what the directory did, after "the LDAP server <url>"
    cause: str
    #: what the user is told
    message: str
    #: what the administrator does about it
    fix: str


def directory_failure(
    error: Exception, connect_timeout: float, receive_timeout: float
) -> DirectoryFailure:
    """What ``error`` (raised talking to the directory) means, for the user and the log."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, TLSSettingsError):
        cause, message = "was not asked: the hub's own TLS settings are wrong", DIRECTORY_DOWN
        fix = "fix the setting named before"
    elif isinstance(error, DirectoryBusy) or "timed out" in text or "timeout" in text.lower():
        cause, message = (
            f"did not answer in time (connect_timeout {connect_timeout:g} s, "
            f"receive_timeout {receive_timeout:g} s)",
            DIRECTORY_SLOW,
        )
        fix = "check that the directory is up and answering, or raise the timeouts"
    elif "CERTIFICATE" in text.upper():
        # ldap3's words for a chain that does not verify (CERTIFICATE_VERIFY_FAILED)
        # and for a certificate that does not name the server ("certificate ...
        # doesn't match any name")
        cause, message = (
            "presented a TLS certificate the hub does not trust",
            (DIRECTORY_UNTRUSTED),
        )
        fix = (
            "set LDAPGroupsAuthenticator.tls_ca_file to the CA (PEM) that signed the "
            "directory's certificate (empty: the system's CAs), and check that "
            "server_address is a name the certificate lists"
        )
    else:
        cause, message = "could not be reached or read", DIRECTORY_DOWN
        fix = (
            "check that the server is up and reachable from the hub and the "
            "LDAPGroupsAuthenticator settings (server_address, server_port, "
            "tls_strategy, group_search_base)"
        )
    return DirectoryFailure(text=text, cause=cause, message=message, fix=fix)


def age_words(age: float | None) -> str:
    """When the groups were last read, in words."""
    if age is None:
        return "before the hub last started"
    minutes = int(age // 60)
    return f"{minutes} minutes ago" if minutes >= 2 else f"{int(age)} seconds ago"
