"""Real separate SSH hosts on this one machine, for tests and benchmarks.

A `HostLab` starts one OpenSSH server per "host".  Where the machine allows it (root, `ip netns add`
works) each host lives in its own network namespace, joined to the root namespace by a veth pair into a
per-lab bridge, with an address in 198.18.0.0/15 (the benchmarking range): the bridge is 198.18.K.1/24
and host i is 198.18.K.(11+i)/24, as `eth0` inside namespace i.  Processes of one host bind that host's
address and reach the other hosts (and the root namespace, via 198.18.K.1) over the bridge, like real
machines on a LAN.  Otherwise every host gets its own loopback address (127.0.0.(11+i+20*lab)) instead.

Only the network namespace is separate: the file system, users, PIDs and the hostname are shared with
this machine, so `hostname` prints the same name on every host.

Usage::

    with HostLab(tmp_path, 3).start() as lab:
        h1 = lab.hosts[0]
        print(lab.run(h1, "ip -o -4 addr").stdout)

Everything is torn down by `close()` (also on `with` exit and at interpreter exit).  Leftovers of a
process that died without cleaning up (SIGKILL) are removed by the next lab's `start()`.

Stdlib only, Linux only; namespaces need root.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"  # sshd refuses to start unless exec'd by absolute path
PREFIX = "hostlab"  # namespace names, bridge aliases and the session marker all start with this
MARKER_ENV = "HOSTLAB_TAG"  # set on sshd and (via SetEnv) on every session, to find strays in close()
LOCK_FILE = Path("/tmp/hostlab.lock")  # serialises subnet/interface allocation between processes
START_TIMEOUT_S = 15.0

_counter = 0
_counter_lock = threading.Lock()


@dataclass
class LabHost:
    """One lab host: its sshd listens on address:port; its processes can bind address."""

    name: str
    address: str
    port: int
    netns: str | None = None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one `ip` command (text output captured)."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _ip_batch(lines: list[str], netns: str | None = None) -> None:
    """Run many `ip` commands in one process (about 2 ms each otherwise)."""
    argv = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}\n" + "\n".join(lines))


def _pid_alive(pid: int) -> bool:
    """True when a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(pid: int) -> bool:
    """True while pid exists and is not a zombie (a zombie no longer holds its namespace)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _kill(pids, sig=signal.SIGKILL) -> None:
    """Send sig to each pid, ignoring ones already gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _marked_pids(match) -> list[int]:
    """Pids whose environment carries HOSTLAB_TAG=<tag> with match(tag) true."""
    found = []
    needle = (MARKER_ENV + "=").encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(needle) and match(item[len(needle):].decode(errors="replace")):
                found.append(int(entry.name))
                break
    return found


def _netns_pids(ns: str) -> list[int]:
    """Pids of the processes inside network namespace ns."""
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _owner_pid(tag: str) -> int | None:
    """The pid that created lab <tag> ("hostlab-<pid>-<n>"), or None when tag isn't one of ours."""
    m = re.match(rf"{PREFIX}-(\d+)-\d+", tag)
    return int(m.group(1)) if m else None


def _set_pdeathsig() -> None:
    """In the sshd child: die with the parent, so a SIGKILLed test run leaves no sshd behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cleanup_stale() -> None:
    """Remove namespaces, bridges and processes of labs whose creating process is gone."""
    def stale(tag: str) -> bool:
        pid = _owner_pid(tag)
        return pid is not None and not _pid_alive(pid)

    if shutil.which("ip"):
        names = _ip("netns", "list", check=False).stdout.split()
        for ns in (n for n in names if n.startswith(PREFIX + "-")):
            if stale(ns.rsplit("-", 1)[0]):
                _kill(_netns_pids(ns))
                _ip("netns", "del", ns, check=False)
        for dev in Path("/sys/class/net").glob("hlbr*"):
            with contextlib.suppress(OSError):
                if stale((dev / "ifalias").read_text().strip()):
                    _ip("link", "del", dev.name, check=False)
    _kill(_marked_pids(stale))


class HostLab:
    """Real separate SSH hosts on this machine: one sshd per host, each in its own network namespace
    (ip netns + a veth into a bridge) where the machine allows it, else each on its own loopback address."""

    def __init__(self, root: Path, count: int, use_netns: bool = True, max_startups: str = "1000"):
        """Plan a lab of `count` hosts; files (keys, configs, logs) go under `root`. Nothing starts yet.

        `max_startups` is sshd's MaxStartups: the lab's default lets any number of logins run at once; a real
        sshd's "10:30:100" drops connections beyond 10 unauthenticated ones.
        """
        global _counter
        if count < 1:
            raise ValueError("count must be >= 1")
        with _counter_lock:
            self.index = _counter  # per-process lab number: unique names and loopback addresses
            _counter += 1
        self.tag = f"{PREFIX}-{os.getpid()}-{self.index}"
        self.root = Path(root).resolve() / f"lab{self.index}"
        self.count = count
        self.use_netns = use_netns
        self.max_startups = max_startups
        self.netns = False
        self.hosts: list[LabHost] = []
        self.identity_file = self.root / "id_lab"
        self.wrong_identity_file = self.root / "id_wrong"
        self.ssh_options: dict[str, str] = {"StrictHostKeyChecking": "no", "UserKnownHostsFile": "/dev/null",
                                            "LogLevel": "ERROR"}
        self.subnet: int | None = None  # K of 198.18.K.0/24 when netns is used
        self.bridge: str | None = None
        self.netns_error: str | None = None  # why namespaces weren't used (None when they are)
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        self._started = False

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> "HostLab":
        """Make keys, namespaces and sshds; wait until every sshd accepts an ssh login; return self."""
        if self._started:
            return self
        self._started = True
        atexit.register(self.close)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._make_keys()
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
            LOCK_FILE.touch(exist_ok=True)
            with open(LOCK_FILE) as lock:
                # held until the sshds listen: two labs starting at once must not pick the same subnet,
                # interface names or loopback address:port
                fcntl.flock(lock, fcntl.LOCK_EX)
                cleanup_stale()
                if not self.use_netns:
                    self.netns_error = "use_netns=False"
                elif os.geteuid() != 0 or not shutil.which("ip"):
                    self.netns_error = "needs root and iproute2"
                else:
                    try:
                        self._setup_netns()
                    except Exception as e:  # namespaces unavailable here: loopback hosts instead
                        self.netns_error = f"{type(e).__name__}: {e}"
                if not self.netns:
                    self._setup_loopback()
                for host in self.hosts:
                    self._start_sshd(host)
                self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every sshd and every process left in the lab; delete namespaces, veths and bridge. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.kill()
        doomed = [p.pid for p in self._procs]
        for host in self.hosts:
            if host.netns:
                doomed += _netns_pids(host.netns)
        # strays from sessions (loopback mode has no namespace to list them by)
        doomed += _marked_pids(lambda tag: tag == self.tag)
        _kill(doomed)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        # a namespace (and its veth) only goes away once its last process has exited
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(_running(p) for p in doomed):
            time.sleep(0.01)
        for host in self.hosts:
            if host.netns:
                # deleting the namespace also deletes the veth pair whose end lives in it
                _ip("netns", "del", host.netns, check=False)
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)

    def take_down(self, host: LabHost) -> None:
        """Lose a host as a crashed machine is lost: its sshd and everything running on it die at once (netns only)."""
        if not host.netns:
            raise RuntimeError("take_down needs network namespaces: a loopback host shares its processes")
        _kill(_netns_pids(host.netns))

    def bring_back(self, host: LabHost) -> None:
        """A host taken down boots again: its sshd starts (nothing else of what ran there); returns once it takes
        logins."""
        self._start_sshd(host)
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(self._ssh_argv(host, extra=["-o", "ConnectTimeout=5"]) + ["true"],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"hostlab: {host.name}'s sshd not back after {START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    def __enter__(self) -> "HostLab":
        """Start the lab (if not started yet) and return it."""
        return self.start()

    def __exit__(self, *exc) -> None:
        """Close the lab."""
        self.close()

    # ---- setup -------------------------------------------------------------------------------------------

    def _make_keys(self) -> None:
        """Throw-away client keys (no passphrase) and one host key per host, made in parallel."""
        jobs = [(self.identity_file, "hostlab"), (self.wrong_identity_file, "hostlab-wrong")]
        jobs += [(self.root / f"h{i + 1}" / "host_ed25519", f"h{i + 1}") for i in range(self.count)]
        for path, _ in jobs:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        procs = [subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for path, comment in jobs]
        for proc in procs:
            if proc.wait() != 0:
                raise RuntimeError(f"ssh-keygen failed: {proc.stderr.read().decode()}")
            proc.stderr.close()
        for path, _ in jobs:
            path.chmod(0o600)  # ssh ignores private keys readable by others

    def _setup_netns(self) -> None:
        """One namespace per host, veth into a fresh bridge; sets self.netns on success."""
        # caller holds LOCK_FILE
        used = set(re.findall(r"inet 198\.18\.(\d+)\.", _ip("-o", "-4", "addr", check=False).stdout))
        # a veth of a just-closed lab may outlive its namespace for a moment: skip its K too
        for dev in os.listdir("/sys/class/net"):
            if m := re.fullmatch(r"hl(?:br)?(\d+)(?:v\d+)?", dev):
                used.add(m.group(1))
        free = [k for k in range(1, 255) if str(k) not in used]
        if not free:
            raise RuntimeError("no free 198.18.K.0/24 subnet")
        k = free[0]
        self.subnet, self.bridge = k, f"hlbr{k}"  # interface names max 15 chars: K keeps them short
        nss = [f"{self.tag}-h{i + 1}" for i in range(self.count)]
        lines = [f"link add {self.bridge} type bridge forward_delay 0 stp_state 0",
                 f"link set {self.bridge} alias {self.tag}",  # lets cleanup_stale find its owner
                 f"addr add 198.18.{k}.1/24 dev {self.bridge}",
                 f"link set {self.bridge} up"]
        for i, ns in enumerate(nss):
            lines += [f"netns add {ns}",
                      f"link add hl{k}v{i} type veth peer name eth0 netns {ns}",
                      f"link set hl{k}v{i} master {self.bridge}",
                      f"link set hl{k}v{i} up"]
        try:
            _ip_batch(lines)
            for i, ns in enumerate(nss):
                _ip_batch(["link set lo up", f"addr add 198.18.{k}.{11 + i}/24 dev eth0", "link set eth0 up"], ns)
                self.hosts.append(LabHost(f"h{i + 1}", f"198.18.{k}.{11 + i}", 22, ns))
        except Exception:
            for ns in nss:
                _ip("netns", "del", ns, check=False)
            _ip("link", "del", self.bridge, check=False)
            self.hosts, self.subnet, self.bridge = [], None, None
            raise
        self.netns = True
        with contextlib.suppress(OSError):
            # br_netfilter passes bridged frames through iptables; harmless while no iptables table is loaded
            # (the case on this VM: bridge-nf-call-iptables=1, /proc/net/ip_tables_names empty)
            if (Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1"
                    and Path("/proc/net/ip_tables_names").read_text().strip()):
                warnings.warn("hostlab: br_netfilter is on and iptables tables are loaded; "
                              "iptables rules may filter traffic between lab hosts")

    def _setup_loopback(self) -> None:
        """Each host on its own 127.0.0.x address: port 22 if free, else any free port."""
        for i in range(self.count):
            n = 11 + i + 20 * self.index
            address = f"127.0.0.{n}" if n <= 254 else f"127.0.{n // 254}.{n % 254 + 1}"
            self.hosts.append(LabHost(f"h{i + 1}", address, _free_port(address, prefer=22), None))

    def _start_sshd(self, host: LabHost) -> None:
        """Write host's sshd config and start sshd in the foreground (in its namespace); no waiting."""
        d = self.root / host.name
        pub = Path(str(self.identity_file) + ".pub").read_text()
        (d / "authorized_keys").write_text(pub)
        config = f"""\
ListenAddress {host.address}:{host.port}
HostKey {d / 'host_ed25519'}
AuthorizedKeysFile {d / 'authorized_keys'}
PidFile {d / 'sshd.pid'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
UseDNS no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
X11Forwarding no
PrintMotd no
PrintLastLog no
# many ssh launches at once: the default 10:30:100 randomly drops connections beyond 10
MaxStartups {self.max_startups}
MaxSessions 1000
LoginGraceTime 30
SetEnv {MARKER_ENV}={self.tag}
# the default post-quantum kex (sntrup761) costs ~70 ms of CPU per login on a small VM; the client
# picks by its own preference order, so the server has to leave it out to get classic curve25519
KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256
Subsystem sftp internal-sftp
"""
        cfg = d / "sshd_config"
        cfg.write_text(config)
        argv = [SSHD, "-D", "-e", "-f", str(cfg)]
        if host.netns:
            argv = ["ip", "netns", "exec", host.netns, *argv]  # ip execs sshd: same pid, inside the namespace
        main_thread = threading.current_thread() is threading.main_thread()
        with open(d / "sshd.log", "ab") as log:
            self._procs.append(subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env={**os.environ, MARKER_ENV: self.tag},
                start_new_session=True,  # keep the terminal's Ctrl-C away; close() does the killing
                # PDEATHSIG fires when the *thread* that forked exits, so only use it from the main thread
                preexec_fn=_set_pdeathsig if main_thread else None))

    def _wait_ready(self) -> None:
        """Poll every host (in parallel) until `ssh ... true` succeeds; RuntimeError after START_TIMEOUT_S."""
        deadline = time.monotonic() + START_TIMEOUT_S

        def wait_one(i: int) -> str | None:
            host, proc = self.hosts[i], self._procs[i]
            last = ""
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return f"sshd exited with {proc.returncode}"
                try:  # cheap TCP probe first: an ssh attempt costs ~50 ms of CPU
                    with socket.create_connection((host.address, host.port), timeout=1):
                        pass
                except OSError as e:
                    last = f"connect: {e}"
                    time.sleep(0.02)
                    continue
                try:
                    r = subprocess.run(self._ssh_argv(host, extra=["-o", "ConnectTimeout=5"]) + ["true"],
                                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                       timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    last = "ssh timed out"
                    continue
                if r.returncode == 0:
                    return None
                last = f"ssh exit {r.returncode}: {r.stderr.strip()}"
                time.sleep(0.05)
            return f"not ready after {START_TIMEOUT_S:.0f} s ({last})"

        with ThreadPoolExecutor(max_workers=min(16, len(self.hosts))) as pool:
            errors = list(pool.map(wait_one, range(len(self.hosts))))
        failed = [(h, e) for h, e in zip(self.hosts, errors) if e]
        if failed:
            parts = []
            for host, err in failed:
                log = self.root / host.name / "sshd.log"
                tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                parts.append(f"{host.name} {host.address}:{host.port}: {err}\n  sshd log ({log}):\n    "
                             + "\n    ".join(tail))
            raise RuntimeError("hostlab: sshd not ready:\n" + "\n".join(parts))

    # ---- use ---------------------------------------------------------------------------------------------

    def _ssh_argv(self, host: LabHost, identity_file: Path | None = None, extra: list[str] = ()) -> list[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-p", str(host.port), "-i", str(identity_file or self.identity_file),
                "-o", "IdentitiesOnly=yes"]
        for key, value in self.ssh_options.items():
            argv += ["-o", f"{key}={value}"]
        return argv + list(extra) + ["-l", "root", host.address]

    def ssh_argv(self, host: LabHost, identity_file: Path | None = None) -> list[str]:
        """The ssh command line (without remote command) that logs into host as root with the lab key."""
        return self._ssh_argv(host, identity_file)

    def run(self, host: LabHost, command: str, timeout: float = 30,
            identity_file: Path | None = None) -> subprocess.CompletedProcess:
        """Run shell `command` on host over ssh; stdout/stderr captured as text; never raises on exit code."""
        return subprocess.run(self.ssh_argv(host, identity_file) + [command], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def unreachable_address(self) -> tuple[str, int]:
        """An (address, port) where nothing listens (connections are refused at once), reachable from every host."""
        # netns: the bridge address is in the root namespace, so every lab host can route to it
        address = f"198.18.{self.subnet}.1" if self.netns else "127.0.0.1"
        return address, _free_port(address)

    def host_toml(self, host: LabHost, python: str, workdir: str, **counts) -> str:
        """One `[[hosts]]` TOML block for a job file; **counts (and env=dict) are rendered as TOML values."""
        lines = ["[[hosts]]",
                 f"name = {_toml(host.name)}",
                 f"address = {_toml(host.address)}",
                 f"port = {host.port}",
                 'user = "root"',
                 f"identity_file = {_toml(str(self.identity_file))}",
                 f"ssh_options = {_toml(self.ssh_options)}",
                 f"advertise_address = {_toml(host.address)}",
                 f"python = {_toml(python)}",
                 f"workdir = {_toml(workdir)}"]
        lines += [f"{_toml_key(k)} = {_toml(v)}" for k, v in counts.items()]
        return "\n".join(lines) + "\n"


def _free_port(address: str, prefer: int | None = None) -> int:
    """A TCP port nothing listens on at address (prefer `prefer` when it can be bound)."""
    for port in ([prefer] if prefer else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port on {address}")


def _toml_key(key: str) -> str:
    """A bare TOML key when allowed, else a quoted one."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml(value) -> str:
    """Render a Python value as a TOML value (bool, int, float, str, list, dict as inline table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot render {type(value).__name__} as TOML")
