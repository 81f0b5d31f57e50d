"""Waiting for an observable signal instead of sleeping: poll a check until
it holds (bounded), then assert on what it returned."""

import time

# Generous: a loaded 2-core machine runs the suite; a check that holds
# returns at once, so only failures wait this long.
DEFAULT_TIMEOUT = 30


def wait_for(check, what, timeout=DEFAULT_TIMEOUT, interval=0.02):
    """Polls `check` until it returns a truthy value and returns that value;
    fails naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last saw {last!r}")
        time.sleep(interval)


def holds_for(check, what, seconds):
    """Asserts that `check` stays truthy for `seconds` (for negative
    assertions: something that must not happen, watched for a while after
    the signal that it would have happened by then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        assert value, f"{what} stopped holding (saw {value!r})"
        time.sleep(0.05)
