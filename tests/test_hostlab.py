"""Quick tests of the SSH host lab harness itself (tests/hostlab.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ is not a package
from hostlab import MARKER_ENV, HostLab  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.path.exists("/usr/sbin/sshd") and shutil.which("ssh")
         and shutil.which("ssh-keygen")),
    reason="needs Linux with openssh-server and openssh-client")]

PY = "/usr/bin/python3"  # the system python: no pyenv shim start-up on every remote command

# Serves every connection on HOST:0 with "hello <peer ip>"; writes its port to PORTFILE, exits after 60 s.
SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(8); s.settimeout(60)
open(sys.argv[2] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[2] + ".tmp", sys.argv[2])
while True:
    c, peer = s.accept(); c.sendall(("hello " + peer[0]).encode()); c.close()
"""

CLIENT = "import socket,sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), 5).recv(100).decode())"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with HostLab(tmp_path_factory.mktemp("hostlab"), 3) as lab:
        yield lab


def _marked(tag: str) -> list[int]:
    """Pids of processes started by lab `tag`'s sshds (they carry HOSTLAB_TAG=tag)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"{MARKER_ENV}={tag}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _wait_file(path: Path, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


def test_lab_shape(lab):
    assert [h.name for h in lab.hosts] == ["h1", "h2", "h3"]
    assert len({(h.address, h.port) for h in lab.hosts}) == 3
    if os.geteuid() == 0 and lab.netns is False:
        print(f"namespaces unavailable: {lab.netns_error}")
    assert lab.ssh_argv(lab.hosts[0])[-3:] == ["-l", "root", lab.hosts[0].address]


def test_commands_run_on_each_host_in_its_own_namespace(lab):
    for host in lab.hosts:
        r = lab.run(host, "echo ok; ip -o -4 addr show")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("ok\n")
        if lab.netns:
            assert f"inet {host.address}/" in r.stdout
            for other in lab.hosts:
                if other is not host:
                    assert f"inet {other.address}/" not in r.stdout
            assert "inet 198.18." in r.stdout and r.stdout.count(" inet ") == 2  # lo and eth0 only


def test_tcp_server_on_h1_reachable_from_h2_and_root(lab, tmp_path):
    h1, h2 = lab.hosts[0], lab.hosts[1]
    portfile = tmp_path / "port"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    r = lab.run(h1, f"nohup {PY} {script} {h1.address} {portfile} >/dev/null 2>&1 </dev/null &")
    assert r.returncode == 0, r.stderr
    port = int(_wait_file(portfile))
    r = lab.run(h2, f"{PY} -c '{CLIENT}' {h1.address} {port}")
    assert r.returncode == 0, r.stderr
    if lab.netns:
        assert r.stdout.strip() == f"hello {h2.address}"  # came from h2's own address, over the bridge
    else:
        assert r.stdout.startswith("hello 127.")
    with socket.create_connection((h1.address, port), timeout=5) as s:  # from the root namespace
        assert s.recv(100).decode().startswith("hello ")


def test_wrong_identity_is_refused(lab):
    r = lab.run(lab.hosts[0], "true", identity_file=lab.wrong_identity_file)
    assert r.returncode == 255
    assert "Permission denied" in r.stderr


def test_unreachable_address_refuses(lab):
    address, port = lab.unreachable_address()
    with pytest.raises(OSError):
        socket.create_connection((address, port), timeout=3).close()
    if lab.netns:  # also refused from inside a host
        r = lab.run(lab.hosts[2], f"{PY} -c '{CLIENT}' {address} {port}")
        assert r.returncode != 0 and "ConnectionRefusedError" in r.stderr


def test_host_toml(lab):
    h = lab.hosts[1]
    text = lab.host_toml(h, "/usr/bin/python3", "/tmp/w d", learner=True, collectors=2, evaluator=False,
                         env={"PYTHONPATH": "/a b", "X_Y": 'q"uote'})
    assert text.startswith("[[hosts]]\n")
    assert "learner = true\n" in text and "collectors = 2\n" in text and "evaluator = false\n" in text
    (block,) = tomllib.loads(text)["hosts"]
    assert block == {
        "name": "h2", "address": h.address, "port": h.port, "user": "root",
        "identity_file": str(lab.identity_file), "ssh_options": lab.ssh_options,
        "advertise_address": h.address, "python": "/usr/bin/python3", "workdir": "/tmp/w d",
        "learner": True, "collectors": 2, "evaluator": False,
        "env": {"PYTHONPATH": "/a b", "X_Y": 'q"uote'},
    }


def test_close_leaves_nothing_behind(lab, tmp_path):
    other = HostLab(tmp_path, 2).start()
    try:
        if lab.netns:
            assert other.netns and other.subnet != lab.subnet  # two labs side by side
        assert not {h.address for h in other.hosts} & {h.address for h in lab.hosts}
        r = other.run(other.hosts[1], "nohup sleep 300 >/dev/null 2>&1 </dev/null & echo started")
        assert r.stdout.strip() == "started", r.stderr
        sshd_pids = [p.pid for p in other._procs]
        assert _marked(other.tag)  # the sshds and the sleep carry the lab's marker
    finally:
        other.close()
    other.close()  # idempotent
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert other.tag not in names
    if other.bridge:
        assert not Path("/sys/class/net", other.bridge).exists()
    assert not any(Path(f"/proc/{pid}").exists() for pid in sshd_pids)
    assert _marked(other.tag) == []
    # the module's lab is unaffected
    assert lab.run(lab.hosts[0], "true").returncode == 0


def test_loopback_fallback(tmp_path):
    with HostLab(tmp_path, 2, use_netns=False) as lo:
        assert lo.netns is False and all(h.netns is None for h in lo.hosts)
        assert all(h.address.startswith("127.") for h in lo.hosts)
        for h in lo.hosts:
            r = lo.run(h, "echo $HOSTLAB_TAG")
            assert r.returncode == 0 and r.stdout.strip() == lo.tag, r.stderr
    assert _marked(lo.tag) == []
