"""What the tests share: fakes, server fixtures, prerequisite checks and sample data."""
