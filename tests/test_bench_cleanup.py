"""A benchmark killed by `timeout` (SIGTERM) leaves no process behind.

Each bench script that starts processes runs under `timeout -s TERM` with a marker in its environment that every
descendant inherits (RLCTL_BENCH_MARK=<uuid4>; an rlctl supervisor passes its environment on to its processes).
Once the bench's children exist the test sends SIGTERM to `timeout`, which passes it on exactly as when its time
runs out (to the bench, and to the bench's process group unless --foreground); the long N is only a safety net.
After `timeout` returns, within 30 s no process on the machine may still carry the marker (the issue: four
collectors ran on for 15 minutes), and none may outlive the bench (the project's rule: every
process started ends with its parent: the bench waits for its children to be gone before it exits).

Scripts whose children used to share the bench's process group (`rlctl run` through subprocess.run, the CLI
invocations) run with `timeout --foreground`, so only the bench itself is signalled, as with `kill <pid>`:
otherwise timeout's signal to the group would stop those children without the bench's help and hide a bench that
leaves them behind.

bench/replay.py and bench/minatar_update.py are not here: they start no process.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, missing_extra

pytestmark = pytest.mark.slow  # end-to-end: real jobs run to their target, faults, or a lab of hosts

MARK = "RLCTL_BENCH_MARK"
GONE_WITHIN_S = 30.0  # no process of the bench may be left this long after it exited ...
OUTLIVE_S = 0.0  # ... nor outlive it at all: a bench waits until its children are gone before it exits
SAFETY_TIMEOUT_S = 90  # timeout's own N: children normally exist long before and the test signals it then


def ours(tag: str, tmp: str) -> dict[int, str]:
    """pid -> command line of every live process that has MARK=tag in its environment, or `tmp` (the bench's
    TMPDIR) in its command line: sshd rewrites its environment block (setproctitle), not its command line."""
    found = {}
    needle = f"{MARK}={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError):  # gone meanwhile, or unreadable
            continue
        if needle in env or tmp in cmd:
            found[int(entry)] = cmd
    return found


def handles_sigterm(pid: int) -> bool:
    """True once the process has its own SIGTERM handler (a role's StopFlag: past start-up, in its main loop)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def count(procs: dict[int, str], needle: str, handler: bool) -> int:
    return sum(needle in cmd and (not handler or handles_sigterm(pid)) for pid, cmd in procs.items())


def run_up(tmp: Path, pattern: str) -> bool:
    """True once an `rlctl run` under the bench's TMPDIR has every process running (its state.json says so)."""
    for path in tmp.glob(pattern):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        procs = state.get("processes", [])
        if state.get("status") == "running" and procs and all(p["state"] == "running" for p in procs):
            return True
    return False


def hostlab_strays(bench_pid: int) -> list[str]:
    """Processes and network namespaces of the bench's HostLab (tests/hostlab.py) still there."""
    prefix = f"hostlab-{bench_pid}-"
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if f"HOSTLAB_TAG={prefix}".encode() in env:
                out.append(f"pid {entry}")
    if shutil.which("ip"):
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        out += [f"netns {n}" for n in names if n.startswith(prefix)]
    return out


# script, its quickest arguments, foreground, the children to wait for: (command-line substring, how many, only once
# they handle SIGTERM themselves, i.e. are past start-up), or the glob (under the bench's TMPDIR) of an `rlctl run`'s
# state.json that has to say every process of the run is running
CASES = [
    # all 4 collectors started, one of them past start-up (the others may still be importing torch)
    ("weights.py", ["--quick", "--only", "small"], False,
     [("rlctl.roles.collector", 4, False), ("rlctl.roles.collector", 1, True)]),
    ("collector.py", ["--quick", "--envs", "8"], False, [("rlctl.roles.collector", 1, True)]),
    ("learner.py", ["--seconds", "1", "--warmup", "0.5", "--repeats", "1"], False,
     [("torch.distributed.run", 1, True), ("-u -m rlctl.roles.learner", 1, False)]),  # torchrun and its worker
    ("ingest.py", ["--quick", "--batches", "256"], False,
     [("rlctl.roles.replay", 1, True), ("--child-sender", 2, False)]),
    # an `rlctl run` supervisor whose processes all run (its state.json says so): its fork server (collectors,
    # replay shard and evaluator are forked from it) and the learner under rlctl.launch.torchrun
    ("solve_cartpole.py", ["--only", "apex", "--seeds", "1", "--cap", "60"], True,
     [("-m rlctl run", 1, True), ("rlctl.launch.forkserver", 5, False), ("rlctl.launch.torchrun", 1, False),
      "*/runs/*/state.json"]),
    ("scale_collectors.py", ["--algos", "apex", "--collectors", "2", "--seeds", "1", "--cap", "60"], True,
     [("-m rlctl run", 1, True), ("rlctl.launch.forkserver", 5, False), ("rlctl.launch.torchrun", 1, False),
      "*/runs/*/state.json"]),
    ("cli_latency.py", ["--quick", "--runs", "3"], True, [("rlctl --help", 1, False)]),  # an rlctl invocation
    # its first phase: one collector with local inference, past start-up
    ("inference.py", ["--collectors", "1", "--window", "60"], False, [("rlctl.roles.collector", 1, True)]),
    # the Pong job's supervisor with every process running: fork server and its two collectors, the learner
    ("atari.py", ["--seconds", "120", "--bare-seconds", "2"], True,
     [("-m rlctl run", 1, True), ("rlctl.launch.forkserver", 3, False), ("rlctl.launch.torchrun", 1, False),
      "*/runs/*/state.json"]),
    # the Breakout job's supervisor with every process running (its fork server and two collectors, the learner)
    ("minatar.py", ["--games", "breakout", "--seeds", "1", "--only", "rlctl", "--cap", "60"], True,
     [("-m rlctl run", 1, True), ("rlctl.launch.forkserver", 3, False), ("rlctl.launch.torchrun", 1, False),
      "*/runs/*/state.json"]),
    ("fuzz.py", ["--messages", "1000000", "--jobs", "apex"], False,
     [("-m rlctl run", 1, True), ("rlctl.launch.forkserver", 5, False), ("rlctl.launch.torchrun", 1, False),
      "*/runs-apex/*/state.json"]),
    # its `rlctl run` (attached, a child of the bench) with every process running
    ("faults.py", ["--rounds", "1"], False,
     [("-m rlctl run", 1, True), ("rlctl.launch.forkserver", 5, False), ("rlctl.launch.torchrun", 1, False),
      "*/runs/*/state.json"]),
    # its supervisor (the real loop, in a process of its own), the learner stand-in, a simulated host of 10
    # collectors and its relay, each past start-up
    ("control_plane.py", ["--quick", "--cells", "c10_h1"], False,
     [("--child-supervisor", 1, True), ("--child-learner", 1, True), ("--child-host", 1, True),
      ("--child-relay", 1, True)]),
    # 8 sshds; a local launch comes and goes, then the launch on one lab host: its supervisor and the ssh sessions
    # of its 8 processes (the processes on the lab host carry HOSTLAB_TAG, see hostlab_strays). Not "all running":
    # the bench stops each launch as soon as they are.
    ("launch.py", ["--repeats", "1"], True,
     [("sshd", 8, False), ("1_host-0/job.toml", 1, True), ("ConnectTimeout=", 8, False)]),
]


def _end_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@pytest.mark.parametrize("script,args,foreground,wait_for", CASES, ids=[c[0] for c in CASES])
def test_killed_bench_leaves_no_child(script, args, foreground, wait_for, tmp_path):
    if script == "minatar.py" and (reason := missing_extra("minatar", "minatar")):
        pytest.skip(f"bench/minatar.py {reason}")
    if script == "launch.py" and (os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd") or not shutil.which("ip")):
        pytest.skip("bench/launch.py needs root, openssh-server and iproute2 (tests/hostlab.py)")
    tag = str(uuid.uuid4())
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, MARK: tag, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}
    cmd = ["timeout", *(["--foreground"] if foreground else []), "-s", "TERM", str(SAFETY_TIMEOUT_S),
           sys.executable, str(REPO / "bench" / script), *args]
    log = tmp_path / "bench.log"
    t0 = time.monotonic()
    with open(log, "wb") as out:
        # If pytest itself is killed, `timeout` gets SIGTERM from the kernel and passes it on: the bench ends as
        # in the test, not 90 s later.
        timeout = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                   preexec_fn=_end_with_parent)
    def up(procs: dict[int, str], what) -> bool:
        if isinstance(what, str):
            return run_up(tmp, what)
        needle, n, handler = what
        return count(procs, needle, handler) >= n

    procs: dict[int, str] = {}
    try:
        deadline = t0 + SAFETY_TIMEOUT_S - 5
        ready = False
        while time.monotonic() < deadline and timeout.poll() is None:
            procs = ours(tag, str(tmp))
            if all(up(procs, what) for what in wait_for):
                ready = True
                break
            time.sleep(0.05)
        t_ready = time.monotonic()
        bench_pid = next((pid for pid, c in procs.items() if f"bench/{script}" in c and "timeout" not in c), None)
        assert ready, (f"{script}: children {wait_for} never all existed (timeout exit {timeout.poll()}); "
                       f"ours now: {procs}\n{log.read_text(errors='replace')[-3000:]}")
        timeout.send_signal(signal.SIGTERM)  # timeout passes it on as when N runs out
        timeout.wait(60)
    finally:
        if timeout.poll() is None:
            timeout.kill()
            timeout.wait()
    t_exit = time.monotonic()
    outlived = left = ours(tag, str(tmp))
    while left and time.monotonic() < t_exit + GONE_WITHIN_S:
        time.sleep(0.1)
        left = ours(tag, str(tmp))
        if time.monotonic() < t_exit + OUTLIVE_S:
            outlived = left
    t_gone = time.monotonic()
    strays = hostlab_strays(bench_pid) if script == "launch.py" and bench_pid else []
    print(f"{script}: {len(procs)} processes after {t_ready - t0:.1f} s; bench gone {t_exit - t_ready:.1f} s after "
          f"SIGTERM; {len(outlived)} outlived it, {len(left)} left {t_gone - t_exit:.1f} s later")
    for pid in left:  # leave the machine clean for the next test, then fail
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if strays:
        from hostlab import cleanup_stale  # the bench is gone: its lab is stale

        cleanup_stale()
    assert not left and not strays, (
        f"{script} killed by timeout left {len(left)} processes behind:\n"
        + "\n".join(f"  {pid}: {c[:200]}" for pid, c in left.items()) + "".join(f"\n  {s}" for s in strays)
        + f"\nbench output:\n{log.read_text(errors='replace')[-3000:]}")
    assert not outlived, (
        f"{script} killed by timeout exited before its children ({len(outlived)} still ran once it had exited, "
        f"all gone {t_gone - t_exit:.1f} s later): they did not end with it\n"
        + "\n".join(f"  {pid}: {c[:200]}" for pid, c in outlived.items()))


# --------------------------------------------------------------------------- bench/_children.py itself

TOY = r'''
import os, subprocess, sys, time
sys.path.insert(0, {bench!r})
import _children as children

children.install()
STUBBORN = "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
           "os.setsid() if len(sys.argv) > 1 else None; print('up', flush=True); time.sleep(300)"
how = {how!r}
if how == "stubborn":  # ignores SIGTERM, as does its own child in another session
    child = children.spawn([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                            + repr(STUBBORN) + ", 'setsid']); exec(" + repr(STUBBORN) + ")"], grace=1.0)
else:
    child = children.spawn([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)"])
print("ready", flush=True)
if how == "raise":
    time.sleep(1)
    raise RuntimeError("the bench fails")
time.sleep(300)
'''


@pytest.mark.parametrize("how", ["sigterm", "stubborn", "sigkill", "raise", "sigint"])
def test_children_end_with_the_bench(how, tmp_path):
    """SIGTERM/SIGINT stop the children (SIGKILL after the grace, descendants in other sessions too); an exception
    stops them at exit; a SIGKILLed bench's children get SIGTERM from PR_SET_PDEATHSIG."""
    tag = str(uuid.uuid4())
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    toy = tmp_path / "toy.py"
    toy.write_text(TOY.format(bench=str(REPO / "bench"), how=how))
    bench = subprocess.Popen([sys.executable, str(toy)], env={**os.environ, MARK: tag, "TMPDIR": str(tmp)},
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert bench.stdout.readline().strip() == "ready"
        want = 3 if how == "stubborn" else 2  # the bench, its child (and the child's own child)
        deadline = time.monotonic() + 30
        while len(ours(tag, str(tmp))) < want and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the stubborn ones ignore SIGTERM by now
        assert len(ours(tag, str(tmp))) == want, ours(tag, str(tmp))
        if how != "raise":
            bench.send_signal({"sigterm": signal.SIGTERM, "stubborn": signal.SIGTERM, "sigkill": signal.SIGKILL,
                               "sigint": signal.SIGINT}[how])
        bench.wait(30)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    left = ours(tag, str(tmp))
    deadline = time.monotonic() + 10
    while how == "sigkill" and left and time.monotonic() < deadline:  # PDEATHSIG: the child stops by itself
        time.sleep(0.05)
        left = ours(tag, str(tmp))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, left
    assert bench.returncode == {"sigterm": 143, "stubborn": 143, "sigkill": -9, "raise": 1, "sigint": -signal.SIGINT}[how]
