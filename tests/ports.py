"""A free TCP port on the loopback interface, for the tests that start a process group."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the operating system has just handed out and released: free unless another process
    takes it before the test's process group binds it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
