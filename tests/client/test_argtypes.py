"""The CLI's positive-number converters."""

from __future__ import annotations

import argparse

import pytest

from services.client.argtypes import positive_float, positive_int


@pytest.mark.parametrize(("raw", "value"), [("1", 1.0), ("0.25", 0.25), (" 2e1 ", 20.0)])
def test_positive_float_takes_finite_positive_numbers(raw: str, value: float) -> None:
    assert positive_float(raw) == value


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "-inf", "1s", ""])
def test_positive_float_refuses_the_rest(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(raw)):
        positive_float(raw)


@pytest.mark.parametrize("raw", ["0", "-3", "1.5", "two", ""])
def test_positive_int_refuses_non_counts(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(raw)):
        positive_int(raw)
    assert positive_int("3") == 3
