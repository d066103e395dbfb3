"""Calls with a deadline: give up on a call that may block far longer than the caller may wait.

A call over SSH to a node whose link is down blocks in the kernel until TCP
gives up (minutes); supervision, ``status``, ``logs`` and ``stop`` must not.
This module knows nothing about nodes: it runs any callable in a daemon thread
and stops waiting for it after ``timeout`` seconds.

Contract:

* :func:`bounded` ``(fn, timeout, name)`` -> ``fn()``'s value, or ``fn``'s own
  exception, or :class:`BoundedTimeout` when no answer came in time;
* :class:`BoundedTimeout`: the call did not return within its deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class BoundedTimeout(Exception):
    """A call did not return within its deadline."""


def bounded(fn: Callable[[], T], timeout: float, name: str = "bounded") -> T:
    """Run ``fn`` in a daemon thread and give up after ``timeout`` seconds.

    The abandoned thread ends by itself once its call finally fails (for SSH:
    when the connection does); being a daemon thread, it never holds up exit.
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise BoundedTimeout(f"no answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")  # type: ignore[return-value]
