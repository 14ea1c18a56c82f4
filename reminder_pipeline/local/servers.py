"""The embedded default servers, PostgreSQL 18 and the Tansu broker: the names callers use.

Each lives in its own module (:mod:`.postgres`, :mod:`.broker`); what they share is in
:mod:`.processes`.
"""

from .broker import EmbeddedBroker
from .postgres import EmbeddedPostgres
from .processes import ServiceError, free_port, port_in_use

__all__ = ["EmbeddedBroker", "EmbeddedPostgres", "ServiceError", "free_port", "port_in_use"]
