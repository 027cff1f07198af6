import datetime


def parse_date(text):
    """Parse YYYY-MM-DD into a date."""
    year, month, day = (int(part) for part in text.split("-"))
    return datetime.date(year, month, day)


def is_leap_year(year):
    return year % 4 == 0
