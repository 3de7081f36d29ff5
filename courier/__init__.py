"""wb: dispatch one bounded coding task to one coding-agent harness, here or over SSH."""

__version__ = "0.2.0"
