"""The PostgreSQL wire protocol as the fault proxy reads it along: just enough for a cut.

A connection opens with untyped packets (an int32 length, an int32 code): SSLRequest or
GSSENCRequest, each answered by the server with one byte ('N', or 'S'/'G' and then encryption,
which ends the reading along), a CancelRequest, or the StartupMessage (protocol 3.x, then
``key\\0value\\0`` pairs, among them ``application_name``). From then on every message is a type
byte and an int32 length that counts itself. A simple Query ('Q') is its own group; the
extended protocol's Parse ('P', which names a statement's text), Bind ('B', which executes a
named statement), Describe, Execute end with a Sync ('S'). Each Query and each Sync is answered
by exactly one ReadyForQuery ('Z'): counting them on both sides tells where an answer starts.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_PROTOCOL_MAJOR_3 = 3
# A startup packet longer than this is not one (direct TLS, or not PostgreSQL at all).
_MAX_STARTUP_PACKET = 10_000


@dataclass
class Cut:
    """An armed cut: the statements it matches, what the server gets, how many are left."""

    pattern: re.Pattern[bytes]
    server_gets_it: bool
    remaining: int
    application_name: str | None


@dataclass
class ClientFeed:
    """What to do with a chunk from the client."""

    forward: bytes  # to the server, now
    cut: Cut | None = None  # a cut starts at this chunk


@dataclass
class ServerFeed:
    """What to do with a chunk from the server."""

    forward: bytes  # to the client, now
    answer_started: bool = False  # the cut statement's answer starts: close the client
    answer_done: bool = False  # the server has finished it (ReadyForQuery): close the upstream


class PgWire:
    """Both halves of one PostgreSQL connection, read along as the bytes pass."""

    def __init__(self) -> None:
        self.opaque = False  # encrypted, a cancel, or not understood: bytes pass untouched
        self.application_name: str | None = None
        self._startup = True
        self._buffer = bytearray()
        self._statements: dict[bytes, bytes] = {}
        self._answers_asked = 0  # Queries and Syncs sent on to the server
        self._singles_asked = 0  # SSL/GSS requests, each answered by one untyped byte
        self._header = bytearray()
        self._body_left = 0
        self._kind = 0
        self._ready_seen = 0  # ReadyForQuery messages from the server
        self._boundary: int | None = None  # the cut statement's answer follows this many
        self._swallowing = False

    def from_client(self, data: bytes, take: Callable[[bytes], Cut | None]) -> ClientFeed:
        """Read a client chunk; ``take(statement text)`` says whether a statement is cut."""
        if self.opaque:
            return ClientFeed(data)
        buf = self._buffer
        buf += data
        out = bytearray()
        while not self.opaque:
            if self._startup:
                if not self._startup_packet(out):
                    break
                continue
            if len(buf) < 5:
                break
            kind = buf[0]
            (length,) = struct.unpack("!i", buf[1:5])
            if length < 4:  # not the protocol read here: the rest passes as it comes
                self.opaque = True
                break
            if len(buf) < 1 + length:
                break
            cut = self._cut_for(kind, bytes(buf[5 : 1 + length]), take)
            if cut is not None and not cut.server_gets_it:
                buf.clear()  # nothing of the statement reaches the server
                return ClientFeed(bytes(out), cut)
            if cut is not None:
                self._boundary = self._answers_asked
            out += buf[: 1 + length]
            del buf[: 1 + length]
            if kind in (ord("Q"), ord("S")):
                self._answers_asked += 1
            if cut is not None:
                # The rest of the statement's group (up to its Sync) goes on untouched.
                out += buf
                buf.clear()
                self.opaque = True
                return ClientFeed(bytes(out), cut)
        if self.opaque:
            out += buf
            buf.clear()
        return ClientFeed(bytes(out))

    def _startup_packet(self, out: bytearray) -> bool:
        """Move one whole untyped packet to ``out``; False when it has not all arrived yet."""
        buf = self._buffer
        if len(buf) < 8:
            return False
        length, code = struct.unpack("!ii", buf[:8])
        if length < 8 or length > _MAX_STARTUP_PACKET:
            self.opaque = True
            return False
        if len(buf) < length:
            return False
        packet = bytes(buf[:length])
        del buf[:length]
        out += packet
        if code in (_SSL_REQUEST, _GSSENC_REQUEST):
            self._singles_asked += 1
        elif code >> 16 == _PROTOCOL_MAJOR_3:
            self._startup = False
            self.application_name = _startup_parameter(packet[8:], b"application_name")
        else:  # a CancelRequest, or a protocol not read here
            self.opaque = True
        return True

    def _cut_for(self, kind: int, body: bytes, take: Callable[[bytes], Cut | None]) -> Cut | None:
        """The cut this client message starts, if any (and remember prepared statements)."""
        if kind == ord("Q"):
            return take(body.rstrip(b"\0"))
        if kind == ord("P"):
            name, _, rest = body.partition(b"\0")
            self._statements[name] = rest.partition(b"\0")[0]
        elif kind == ord("B"):  # executes a statement: the named one, or the unnamed ""
            _portal, _, rest = body.partition(b"\0")
            text = self._statements.get(rest.partition(b"\0")[0])
            if text is not None:
                return take(text)
        return None

    def from_server(self, data: bytes) -> ServerFeed:
        """Read a server chunk: forward up to the cut statement's answer, then swallow it."""
        feed = ServerFeed(b"" if self._swallowing else data)
        if self.opaque and self._boundary is None:
            return feed
        i, n = 0, len(data)
        while i < n:
            if self._singles_asked > 0:  # the one-byte answer to an SSL or GSS request
                self._singles_asked -= 1
                if data[i] in (ord("S"), ord("G")):
                    self.opaque = True  # encrypted from here on: cannot read along
                    return feed
                i += 1
                continue
            if self._body_left > 0:
                take = min(self._body_left, n - i)
                i += take
                self._body_left -= take
                if self._body_left == 0 and self._message_done():
                    feed.answer_done = True
                    break
                continue
            starts = not self._header and self._boundary is not None and not self._swallowing
            if starts and self._ready_seen >= (self._boundary or 0):
                # The cut statement's answer starts here: the client never sees it.
                self._swallowing = feed.answer_started = True
                feed.forward = data[:i]
            take = min(5 - len(self._header), n - i)
            self._header += data[i : i + take]
            i += take
            if len(self._header) == 5:
                self._kind = self._header[0]
                self._body_left = max(0, struct.unpack("!i", self._header[1:5])[0] - 4)
                self._header.clear()
                if self._body_left == 0 and self._message_done():
                    feed.answer_done = True
                    break
        return feed

    def _message_done(self) -> bool:
        """Count a finished server message; True when it ends the cut statement's answer."""
        if self._kind != ord("Z"):
            return False
        self._ready_seen += 1
        if self._swallowing and self._boundary is not None and self._ready_seen > self._boundary:
            self._swallowing, self._boundary = False, None
            return True
        return False


def _startup_parameter(params: bytes, key: bytes) -> str | None:
    """One parameter of a StartupMessage's key\\0value\\0 list."""
    parts = params.split(b"\0")
    for k, v in zip(parts[::2], parts[1::2], strict=False):
        if k == key:
            return v.decode("utf-8", "replace")
    return None
