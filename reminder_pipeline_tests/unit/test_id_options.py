"""The command line's id values: every spelling of a UUID Python reads, the URN form in any case."""

from __future__ import annotations

import uuid

import pytest

from reminder_pipeline.cli.options import EVENT_ID_TYPE, REMINDER_ID_TYPE
from reminder_pipeline.config import ConfigError

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


@pytest.mark.parametrize("spelled", ["URN:UUID:", "urn:uuid:42", "URN:ISBN:0451450523", "x" * 36])
def test_what_is_not_an_id_is_one_line(spelled: str) -> None:
    with pytest.raises(ConfigError, match="is not a reminder id") as raised:
        REMINDER_ID_TYPE.convert(spelled, None, None)
    assert "\n" not in str(raised.value)
