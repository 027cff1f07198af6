from tally.dates import is_leap_year, parse_date


def test_parse_date() -> None:
    assert parse_date("2024-02-29").day == 29


def test_leap_year() -> None:
    assert not is_leap_year(1900)
