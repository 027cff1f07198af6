"""tally: count things from the command line."""
