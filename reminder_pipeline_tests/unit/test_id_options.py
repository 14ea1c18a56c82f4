"""Ids as people type them (the command line, the finder, the trace job's config): every
spelling of a UUID Python reads, the URN form in any case."""

from __future__ import annotations

import uuid

import pytest

from reminder_pipeline.cli.options import EVENT_ID_TYPE, REMINDER_ID_TYPE
from reminder_pipeline.cli.trace import _check_id
from reminder_pipeline.config import ConfigError
from reminder_pipeline.defs.trace import _id as trace_job_id
from reminder_pipeline.operator_jobs.finder import check_id

ID = uuid.UUID("0b6f5d0e-3c55-4d39-9a52-7e2d1f0c8a41")


@pytest.mark.parametrize(
    "spelled",
    [
        str(ID),
        str(ID).upper(),
        ID.hex,
        f"{{{ID}}}",
        f"urn:uuid:{ID}",
        f"URN:UUID:{ID}",  # refused before issue 35 (Python's parser takes lower case only)
        f"Urn:Uuid:{str(ID).upper()}",
        f"  URN:UUID:{ID}  ",
    ],
)
def test_every_spelling_of_an_id_is_the_same_id(spelled: str) -> None:
    assert REMINDER_ID_TYPE.convert(spelled, None, None) == ID
    assert EVENT_ID_TYPE.convert(spelled, None, None) == ID
    # Every other place a person types an id: `trace ID`, the finder's --owner/--client/...,
    # and the reminder_trace job's config.
    assert _check_id(spelled, "ID") == ID
    assert check_id(spelled, "--client") == ID
    assert trace_job_id(spelled) == str(ID)


@pytest.mark.parametrize("spelled", ["URN:UUID:", "urn:uuid:42", "URN:ISBN:0451450523", "x" * 36])
def test_what_is_not_an_id_is_one_line(spelled: str) -> None:
    with pytest.raises(ConfigError, match="is not a reminder id") as raised:
        REMINDER_ID_TYPE.convert(spelled, None, None)
    assert "\n" not in str(raised.value)
