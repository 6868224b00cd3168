"""For the tests that run a process group: a free TCP port on the loopback interface, and the
ranks of a job forked from the test's process.

A forked rank starts with everything the test's process imported (torch, Lightning, TorchRec,
mlloss, the recipe): a fresh interpreter spends 3 to 9 s of CPU a rank importing them again, which
on the suite's 2 cores was most of each 2-process job."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import torch


def free_port() -> int:
    """A port the operating system has just handed out and released: free unless another process
    takes it before the test's process group binds it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ForkedRanks:
    """``target(rank, *args)`` in ``world_size`` processes forked from this one, their output
    appended to ``log``.

    With 2 ranks or more each gets the environment torchrun gives the processes it starts
    (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, ...): ``init_process_group`` reads it,
    and Lightning then starts no rank of its own. ``env`` adds to it (a value of None unsets the
    variable). Each rank runs one OpenMP thread: OpenMP's worker threads do not survive a fork, and
    a team of 2 hangs. A rank's exit status is 1 when ``target`` raises (its traceback in the log)."""

    def __init__(self, target, args: tuple = (), *, log: Path, world_size: int = 2,
                 env: dict[str, str | None] | None = None) -> None:
        self.log = Path(log)
        self.log.write_text("")
        port = free_port()
        self.processes = []
        for rank in range(world_size):
            torchrun = {} if world_size == 1 else dict(
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK="0", GROUP_RANK="0", RANK=str(rank),
                LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
            process = multiprocessing.get_context("fork").Process(
                target=_run_rank, args=(target, rank, args, self.log, {**torchrun, **(env or {})}))
            process.start()
            self.processes.append(process)

    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float = 300.0) -> list[int]:
        """Every rank's exit status, once all have exited or one has failed (the others, which
        may wait for it in a collective, are then killed: -9), or ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        try:
            running = {process.sentinel: process for process in self.processes}
            while running and time.monotonic() < deadline:
                for sentinel in multiprocessing.connection.wait(list(running), deadline - time.monotonic()):
                    process = running.pop(sentinel)
                    process.join()  # its sentinel closes just before it exits: exitcode may still be None
                    if process.exitcode != 0:
                        running.clear()
        finally:
            self.kill()
        return [process.exitcode for process in self.processes]

    def join(self, timeout: float = 300.0) -> str:
        """The output, once every rank exited with 0; else the test fails with its end."""
        codes = self.wait(timeout)
        if codes != [0] * len(codes):
            pytest.fail(f"ranks exited with {codes} (-9: killed, after another failed or at the {timeout:.0f} s "
                        f"timeout):\n{self.output()[-6000:]}")
        return self.output()

    def wait_until(self, ready, timeout: float = 300.0) -> None:
        """Return once ``ready()``, every rank still running; the test fails if one ends first or
        ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while not ready():
            assert all(p.is_alive() for p in self.processes), "a rank ended before the moment waited for:\n" + \
                self.output()[-6000:]
            assert time.monotonic() < deadline, "the run never reached the moment waited for:\n" + self.output()[-6000:]
            time.sleep(0.02)

    def kill_when(self, ready, timeout: float = 300.0) -> None:
        """SIGKILL every rank at once, as a lost machine would, once ``ready()``."""
        try:
            self.wait_until(ready, timeout)
        finally:
            self.kill()
        assert [process.exitcode for process in self.processes] == [-signal.SIGKILL] * len(self.processes)

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join()


def _run_rank(target, rank: int, args: tuple, log: Path, env: dict[str, str | None]) -> None:
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    for module in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
        if module in sys.modules:  # Lightning reads RANK when imported, here before the rank existed
            sys.modules[module].rank_zero_only.rank = rank
    descriptor = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
    try:
        target(rank, *args)
    finally:
        sys.stdout.flush()
