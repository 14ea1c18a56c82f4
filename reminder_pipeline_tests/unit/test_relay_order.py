"""The relay's per-key rule, pure: a failed row holds back the later rows of its key, never other keys."""

from __future__ import annotations

from reminder_pipeline.domain.model import ClaimedMessage
from reminder_pipeline.messaging.kafka import DeliveryResult
from reminder_pipeline.messaging.relay import acknowledged_in_key_order


def msg(outbox_id: int, key: str) -> ClaimedMessage:
    return ClaimedMessage(outbox_id, "t", key, "{}", {})


def test_a_failure_holds_back_later_rows_of_the_same_key_only():
    messages = [msg(1, "a"), msg(2, "b"), msg(3, "a"), msg(4, "b"), msg(5, "a")]
    results = [
        DeliveryResult(1, None),
        DeliveryResult(2, None),
        DeliveryResult(3, "timed out"),
        DeliveryResult(4, None),
        DeliveryResult(5, None),  # acknowledged, but after a failed row of its key
    ]
    assert acknowledged_in_key_order(messages, results) == [1, 2, 4]


def test_a_row_without_a_delivery_report_counts_as_failed():
    messages = [msg(1, "a"), msg(2, "a"), msg(3, "b")]
    results = [DeliveryResult(2, None), DeliveryResult(3, None)]  # no report for row 1
    assert acknowledged_in_key_order(messages, results) == [3]


def test_everything_acknowledged_is_marked_in_id_order():
    messages = [msg(3, "a"), msg(1, "b"), msg(2, "a")]
    results = [DeliveryResult(i, None) for i in (1, 2, 3)]
    assert acknowledged_in_key_order(messages, results) == [1, 2, 3]
