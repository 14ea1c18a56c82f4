"""IANA time zone names the contract accepts: the same answer on every host.

``zoneinfo`` resolves a name against the host's zone files first, so names that are files
there but not IANA zones (``localtime``, ``posixrules``, ``posix/…``, ``right/…``) would mean
whatever that host is configured with, and ``Factory`` is IANA's placeholder for "no zone".
A name is canonical when the ``tzdata`` package (shipped with us) lists it as a zone, links of
IANA's ``backward`` file (``Europe/Kiev``, ``US/Eastern``) included, ``Factory`` excluded.
"""

from __future__ import annotations

from datetime import tzinfo
from functools import cache
from importlib import resources
from zoneinfo import ZoneInfo

#: The zone used when an event's zone is not canonical (the contract's fail-safe choice).
FALLBACK_ZONE = "UTC"

_NOT_ZONES = frozenset({"Factory"})


@cache
def canonical_zones() -> frozenset[str]:
    """Every canonical IANA zone name of the bundled tzdata release."""
    names = resources.files("tzdata").joinpath("zones").read_text().split()
    return frozenset(names) - _NOT_ZONES


def is_canonical(name: object) -> bool:
    """Whether ``name`` is a canonical IANA zone name (exact spelling, as IANA lists it)."""
    return isinstance(name, str) and name in canonical_zones()


def zone(name: str) -> tzinfo:
    """The ``tzinfo`` of a canonical name; raises ``ValueError`` for any other name."""
    if not is_canonical(name):
        raise ValueError(f"{name!r} is not a canonical IANA time zone")
    return ZoneInfo(name)
