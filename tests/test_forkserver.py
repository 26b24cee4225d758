"""rlctl.launch.forkserver: role processes forked from one pre-imported interpreter behave like spawned ones."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rlctl.launch.forkserver import ForkServer

ROLE = '''
import gc, os, sys, time
print("role", os.environ.get("ROLE_SAYS"), os.environ.get("SERVER_ONLY"), os.getpid(), os.getpgid(0),
      gc.get_freeze_count(), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if os.environ.get("ROLE_SLEEP"):
    time.sleep(60)
sys.exit(int(os.environ.get("ROLE_EXIT", "0")))
'''


def _server(folder):
    (folder / "fake_role.py").write_text(ROLE)
    env = {**os.environ, "PYTHONPATH": str(folder), "SERVER_ONLY": "yes", "PYTHONUNBUFFERED": "1"}
    srv = ForkServer(sys.executable, env, str(folder / "forkserver.out"))
    yield srv, env
    srv.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server (3 s of imports) for the tests that leave it running."""
    yield from _server(tmp_path_factory.mktemp("forkserver"))


@pytest.fixture
def own_server(tmp_path):
    """A server for a test that kills it."""
    yield from _server(tmp_path)


def test_forked_process_gets_its_env_output_session_and_exit_code(server):
    srv, env = server
    child = srv.spawn("fake_role", {**env, "SERVER_ONLY": "no", "ROLE_SAYS": "hello", "ROLE_EXIT": "3"})
    assert child is not None and srv.ready
    out = child.stdout.read().decode()
    assert child.wait(timeout=10) == 3
    words = out.split()
    assert words[:3] == ["role", "hello", "no"], out  # the request's environment, not the server's
    assert int(words[3]) == child.pid and int(words[4]) == child.pid  # its own session and process group
    assert "to stderr" in out  # stderr goes down the same pipe as stdout
    assert int(words[5]) > 100_000  # the server's imports are frozen: its collections leave those pages shared


def test_signals_reach_the_forked_process_and_its_end_is_reported(server):
    srv, env = server
    child = srv.spawn("fake_role", {**env, "ROLE_SLEEP": "1"})
    assert child.stdout.readline().startswith(b"role")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL
    again = srv.spawn("fake_role", env)  # a restart comes from the same server
    assert again is not None and again.wait(timeout=10) == 0 and again.pid != child.pid


def test_children_outlive_the_server_and_a_dead_server_spawns_nothing(own_server):
    srv, env = own_server
    child = srv.spawn("fake_role", {**env, "ROLE_SLEEP": "1"})
    assert child.stdout.readline().startswith(b"role")
    srv.proc.kill()
    srv.proc.wait()
    deadline = time.time() + 10
    while not srv.dead and time.time() < deadline:
        child.poll()
        time.sleep(0.05)
    assert srv.dead and child.poll() is None  # still running, like a process the supervisor spawned itself
    assert srv.spawn("fake_role", env) is None  # the caller starts it itself instead
    os.killpg(child.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while child.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert child.returncode == -1  # ended, with the code lost along with the server
