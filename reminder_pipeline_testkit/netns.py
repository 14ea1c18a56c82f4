"""Real packet drops, which a user-space proxy cannot make (its kernel keeps ACKing).

``run_in_own_network`` runs a process tree under ``unshare -n``: a network namespace of its own
with only a loopback, so the ``iptables`` rules it sets (``drop_port``) touch nothing outside
it. That needs root (CI runs as root) and Debian's ``iptables`` (scripts/test installs it); a
test that needs them calls ``require_netns()``, which fails in CI rather than skipping.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping

# `unshare -n` starts with the loopback down; bring it up, then become the command.
_LO_UP_THEN_EXEC = 'ip link set lo up && exec "$@"'


@functools.cache
def netns_unavailable() -> str | None:
    """Why packet drops cannot be made here (one line), or None when they can."""
    if os.geteuid() != 0:
        return "needs root for unshare -n and iptables (CI runs as root)"
    for tool in ("unshare", "ip", "iptables"):
        if shutil.which(tool) is None:
            return f"needs {tool} on PATH (apt-get install iptables iproute2 util-linux)"
    try:
        # A rule listed inside a fresh namespace: unshare, the loopback and iptables all work.
        probe = subprocess.run(
            ["unshare", "-n", "sh", "-c", _LO_UP_THEN_EXEC, "sh", "iptables", "-S", "INPUT"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare -n with iptables does not work here: {exc}"
    if probe.returncode != 0:
        detail = " ".join((probe.stderr or probe.stdout).split())[:200]
        return f"unshare -n with iptables does not work here: {detail}"
    return None


def require_netns() -> None:
    """In a pytest test: fail in CI (CI=true), skip elsewhere, when packet drops cannot be made."""
    reason = netns_unavailable()
    if reason is None:
        return
    import pytest  # only tests call this; benchmarks need no pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"packet-drop test cannot run: {reason}")
    pytest.skip(f"packet-drop test: {reason}")


def run_in_own_network(
    argv: list[str], *, env: Mapping[str, str] | None = None, timeout: float, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a network namespace of its own (loopback up); output captured as text
    (``capture=False``: the caller's stdout and stderr, e.g. a long run's progress lines)."""
    reason = netns_unavailable()
    if reason is not None:
        raise RuntimeError(f"cannot run in a network namespace: {reason}")
    return subprocess.run(
        ["unshare", "-n", "sh", "-c", _LO_UP_THEN_EXEC, "sh", *argv],
        env=dict(env) if env is not None else None,
        capture_output=capture,
        text=True,
        timeout=timeout,
        check=False,
    )


def _iptables(action: str, port: int) -> None:
    for direction in ("--dport", "--sport"):
        subprocess.run(
            ["iptables", "-w", action, "INPUT", "-p", "tcp", direction, str(port), "-j", "DROP"],
            check=True,
            capture_output=True,
            timeout=20,
        )


def drop_port(port: int) -> None:
    """Inside such a namespace: drop every TCP packet to or from ``port``, both ways."""
    # INPUT sees every loopback packet once, so --dport catches the client's packets and --sport
    # the server's answers; nothing is rejected, so no peer learns of it (a black hole).
    _iptables("-I", port)


def undrop_port(port: int) -> None:
    """Inside such a namespace: let ``port``'s packets through again."""
    _iptables("-D", port)
