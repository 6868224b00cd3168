"""For the tests that start a process group: a free TCP port on the loopback interface, and a
script that Lightning re-launches for its other ranks, run with a timeout."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest


def free_port() -> int:
    """A port the operating system has just handed out and released: free unless another process
    takes it before the test's process group binds it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(command: list[str], cwd: str | os.PathLike | None = None, timeout: float = 300) -> tuple[int, str]:
    """(exit status, output) of ``command``, a script whose Trainer(devices=2) re-launches it for
    rank 1; past ``timeout`` seconds every rank is killed (they share the script's session) and the
    test fails with the end of the output."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True, cwd=cwd) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"{command[1]} timed out:\n{output[-5000:]}")
    return process.returncode, output
