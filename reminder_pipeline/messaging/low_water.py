"""The relay's low-water mark: where its reads of unpublished outbox rows start (docs/design.md,
"A database it shares: where a scan starts")."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..store.outbox_repository import StatementSnapshot


@dataclass
class LowWater:
    """The relay's low-water mark: every outbox row with a smaller id is published or was never
    committed, so the relay's reads start here, not at the oldest end of the index of unpublished
    ids, where a long snapshot keeps the entry of every row published since it began
    (docs/design.md, "Where a scan starts").

    A read proves that the ids from the mark up to its first unpublished row were published, or
    invisible to it: a transaction in flight may commit one later (ids are drawn when a batch
    writes). So a read makes a *proposal*, which moves the mark once a later read's snapshot shows
    every transaction in flight at the first ended (its xmin passed the first one's xmax), and
    only as far as that read, from the mark, found nothing unpublished.
    """

    low: int = 0
    #: (id the rows below were seen clean up to, xmax of the snapshot that saw it), oldest first.
    pending: list[tuple[int, int]] = field(default_factory=list)

    def saw(self, snapshot: StatementSnapshot, clean_to: int) -> None:
        """A read from the mark on ``snapshot`` found nothing unpublished below ``clean_to``."""
        certified = [upto for upto, xmax in self.pending if xmax <= snapshot.xmin]
        if certified:
            self.low = max(self.low, min(max(certified), clean_to))
            self.pending = [(u, x) for u, x in self.pending if x > snapshot.xmin]
        self.propose(clean_to, snapshot.xmax)

    def propose(self, clean_to: int, xmax: int) -> None:
        """Rows below ``clean_to`` were published or in flight at a snapshot with this xmax."""
        if clean_to > self.low:
            self.pending.append((clean_to, xmax))
