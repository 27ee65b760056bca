"""Command line: typed config schemas, error reporting, and the run function of each entry script."""
