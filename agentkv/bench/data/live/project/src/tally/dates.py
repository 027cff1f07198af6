import datetime


def parse_date(text: str) -> datetime.date:
    """Parse YYYY-MM-DD into a date."""
    year, month, day = (int(part) for part in text.split("-"))
    return datetime.date(year, month, day)


def is_leap_year(year: int) -> bool:
    return year % 4 == 0
