"""Keep judge credentials out of logs, failure reasons and errors.

A judge URL may carry user-info (``http://user:secret@judge:8000``). The client sends it
as HTTP Basic authentication and never shows it: every URL it logs goes through
:func:`redact_url`, and every text it logs or returns goes through :class:`Redactor`,
which also catches the secret when a library quotes it back in an exception message.
"""

from __future__ import annotations

import urllib.parse

REDACTED = "***"


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without user-info, and the (percent-decoded) user and password it held."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    clean = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return (
        clean,
        urllib.parse.unquote(user),
        urllib.parse.unquote(password) if sep else None,
    )


def redact_url(url: str) -> str:
    """``url`` with its user-info replaced by ``***`` (unchanged when it has none)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    hostport = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{REDACTED}@{hostport}"))


class Redactor:
    """Replaces the user-info and password of URLs (raw and decoded) in any text."""

    def __init__(self, *urls: str) -> None:
        secrets: set[str] = set()
        for url in urls:
            secrets |= _secrets_of(url)
        # Longest first, so the whole user-info goes before its parts.
        self._secrets = sorted(secrets, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


def _secrets_of(url: str) -> set[str]:
    netloc = urllib.parse.urlsplit(url).netloc
    secrets: set[str] = set()
    if "@" in netloc:
        userinfo = netloc.rpartition("@")[0]
        password = userinfo.partition(":")[2]
        # The user name alone is not a secret (and may be a common word).
        for raw in (userinfo, password):
            for form in (raw, urllib.parse.unquote(raw)):
                # Very short fragments would redact innocent text; a one- or
                # two-character secret is not worth protecting that way.
                if len(form) >= 3:
                    secrets.add(form)
    return secrets
