"""ULIDs: minting, validation and the embedded timestamp."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlmstore.ulid import ALPHABET, is_valid_ulid, new_ulid, ulid_timestamp

VALID = "01J9ZK3M4N5P6Q7R8S9T0VWXYZ"


def test_a_new_ulid_is_26_valid_characters():
    value = new_ulid()
    assert len(value) == 26
    assert set(value) <= set(ALPHABET)
    assert is_valid_ulid(value)


def test_new_ulids_differ_within_one_millisecond():
    assert len({new_ulid(1_700_000_000.0) for _ in range(100)}) == 100


def test_ulids_sort_by_time():
    times = [0.0, 1.0, 1_000_000.5, 1_700_000_000.123, 2_000_000_000.0]
    values = [new_ulid(t) for t in times]
    assert sorted(values) == values


@given(st.integers(min_value=0, max_value=2**48 - 1))
def test_the_timestamp_round_trips_to_the_millisecond(millis):
    assert ulid_timestamp(new_ulid(millis / 1000)) == pytest.approx(millis / 1000, abs=1e-3)


def test_a_time_whose_product_with_1000_lands_just_below_an_integer_keeps_its_millisecond():
    # 16667.993 * 1000 == 16667992.999999998 in binary floating point.
    assert ulid_timestamp(new_ulid(16667.993)) == 16667.993


def test_the_timestamp_of_a_known_ulid():
    # The first 48 bits of this ULID are 0x01563e3ab5d3 milliseconds.
    assert ulid_timestamp("01ARZ3NDEKTSV4RRFFQ69G5FAV") == 1469922850.259


def test_a_timestamp_outside_48_bits_is_refused():
    with pytest.raises(ValueError, match="timestamp out of ULID range"):
        new_ulid(2**48 / 1000)
    with pytest.raises(ValueError, match="timestamp out of ULID range"):
        new_ulid(-1.0)


def test_the_largest_ulid_is_valid():
    assert is_valid_ulid("7" + "Z" * 25)


@pytest.mark.parametrize(
    "text",
    [
        VALID.replace("J", "I"),
        VALID.replace("K", "L"),
        VALID.replace("0", "O"),
        VALID.replace("V", "U"),
        VALID.lower(),
        VALID[:-1],
        VALID + "0",
        "",
        "8" + VALID[1:],
        "Z" + VALID[1:],
        None,
        12345,
    ],
    ids=["I", "L", "O", "U", "lowercase", "short", "long", "empty", "8-first", "Z-first", "None", "int"],
)
def test_is_valid_ulid_rejects(text):
    assert is_valid_ulid(VALID)
    assert not is_valid_ulid(text)
