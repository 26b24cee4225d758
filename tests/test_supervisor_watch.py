"""A process whose supervisor dies says so in its log, however it learns of the death: its watch thread, or the
SIGTERM that the death causes (a learner rank's, from torchrun's agent tethered to the supervisor)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import platform

import pytest

from rlctl import events

CHILD = """
import os, sys, time
from rlctl.roles.context import StopFlag
from rlctl.roles.supervisor_watch import SupervisorWatch
from rlctl.tether import tether_to

stop = StopFlag()
if sys.argv[2] == "tether":
    tether_to(int(sys.argv[1]))
stop.watch = SupervisorWatch(int(sys.argv[1]), stop.orphan)
if sys.argv[2] == "thread":
    stop.watch.start()
print("ready", flush=True)
while not stop:
    time.sleep(0.001)
print(f"orphaned={stop.orphaned}", flush=True)
os._exit(0)  # at once, as role_main does: a watch thread still writing would be cut off
"""


def start_child(tmp_path, supervisor: subprocess.Popen, watch: str) -> tuple[subprocess.Popen, object]:
    log = tmp_path / "child.log"
    env = dict(os.environ, RLCTL_LOG_FILE=str(log))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(supervisor.pid), watch], stdout=subprocess.PIPE,
                             env=env, text=True)
    assert child.stdout.readline() == "ready\n"
    return child, log


def gone_lines(log) -> list:
    return [e for e in events.read(log) if e.name == "exit" and e["reason"] == events.EXIT_SUPERVISOR_GONE]


def test_a_sigterm_after_the_supervisor_died_is_noticed_as_its_death(tmp_path):
    supervisor = subprocess.Popen(["sleep", "60"])
    child, log = start_child(tmp_path, supervisor, watch="none")  # only the signal can tell it
    supervisor.kill()
    supervisor.wait()
    child.send_signal(signal.SIGTERM)
    assert child.wait(10) == 0
    assert child.stdout.read() == ""  # from the notice on, its output went to the log file
    assert len(gone_lines(log)) == 1
    assert "orphaned=True" in log.read_text()


def test_a_sigterm_with_the_supervisor_alive_is_a_plain_stop(tmp_path):
    supervisor = subprocess.Popen(["sleep", "60"])
    try:
        child, log = start_child(tmp_path, supervisor, watch="thread")
        child.send_signal(signal.SIGTERM)
        assert child.wait(10) == 0
        assert child.stdout.read() == "orphaned=False\n"
        assert not log.exists()
    finally:
        supervisor.kill()
        supervisor.wait()


@pytest.mark.parametrize("attempt", range(8))
def test_the_death_and_its_sigterm_at_once_leave_one_line_saying_why(tmp_path, attempt):
    """The watch thread and the signal race; whichever wins, the line is written once, before the process exits."""
    supervisor = subprocess.Popen(["sleep", "60"])
    child, log = start_child(tmp_path, supervisor, watch="thread")
    supervisor.kill()
    supervisor.wait()  # the SIGTERM is the death's echo: it never comes before the death
    child.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert child.wait(10) == 0
    assert time.monotonic() - started < 3.0  # by itself, long before the watch's grace
    assert len(gone_lines(log)) == 1
    assert "orphaned=True" in log.read_text()


# A supervisor whose main thread exits while another of its threads lives on (SYS_exit ends the calling thread only),
# as a SIGKILLed supervisor's did while a thread of it was still dying (inside an fsync, or waiting for a core).
DYING_SUPERVISOR = """
import ctypes, os, subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), "tether"], stdout=subprocess.PIPE,
                         text=True)
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
threading.Thread(target=lambda: (time.sleep(5), os._exit(0))).start()
ctypes.CDLL(None).syscall(int(sys.argv[2]), 0)
"""
SYS_EXIT = {"x86_64": 60, "aarch64": 93}


@pytest.mark.skipif(platform.machine() not in SYS_EXIT, reason="SYS_exit's number for this machine")
def test_the_kernels_sigterm_at_the_supervisors_main_thread_exit_is_noticed_as_its_death(tmp_path):
    """The tether's SIGTERM comes when the supervisor's main thread exits, before its pidfd is readable (that waits
    for its last thread): a learner rank and the evaluator took it for a plain stop and left no word in their logs."""
    log = tmp_path / "child.log"
    supervisor = subprocess.Popen([sys.executable, "-c", DYING_SUPERVISOR, CHILD, str(SYS_EXIT[platform.machine()])],
                                  stdout=subprocess.PIPE, text=True, env=dict(os.environ, RLCTL_LOG_FILE=str(log)))
    try:
        child = int(supervisor.stdout.readline())
        deadline = time.monotonic() + 3.0  # well before the supervisor's last thread ends (5 s)
        while not log.exists() or not gone_lines(log):
            assert time.monotonic() < deadline, "no line saying the supervisor is gone"
            time.sleep(0.01)
        assert supervisor.poll() is None  # still there: its second thread
        assert "orphaned=True" in log.read_text()
        while os.path.exists(f"/proc/{child}") and "Z" not in open(f"/proc/{child}/stat").read().rsplit(")", 1)[1][:3]:
            assert time.monotonic() < deadline, "the child did not stop"
            time.sleep(0.01)
    finally:
        supervisor.kill()
        supervisor.wait()
