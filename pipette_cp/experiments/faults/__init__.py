"""Measurements of how the commands behave under faults: stop signals, lost workers."""
