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


RANK = '''
import gc, os
if __name__ == "__main__":  # the agent imports the module; each rank runs it
    # one write(2) below PIPE_BUF, so the two ranks' lines cannot interleave on the shared pipe (print's pieces can)
    os.write(1, f"rank {os.environ['RANK']} {os.getpid()} {gc.get_freeze_count()}\\n".encode())
'''


@pytest.mark.slow  # torchrun's start (4 s); every run of the quick tier starts its learner through it too
def test_torchrun_forks_its_ranks_from_the_agent_with_the_imported_heap_frozen(tmp_path):
    """rlctl.launch.torchrun: a module run with `--start-method fork` is imported by the agent once; each rank is a
    fork of it whose full collections leave the agent's heap alone (frozen, as in the fork server)."""
    (tmp_path / "fake_rank.py").write_text(RANK)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-m", "rlctl.launch.torchrun", "--standalone", "--nproc-per-node", "2",
                          "--start-method", "fork", "-m", "fake_rank"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    ranks = sorted(line.split()[1:] for line in out.stdout.splitlines() if line.startswith("rank "))
    assert [r[0] for r in ranks] == ["0", "1"], out.stdout
    assert all(int(freeze) > 100_000 for _, _, freeze in ranks), ranks  # torch and the agent's imports
