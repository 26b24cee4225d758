"""Ways of reaching a host: one small class each, building an argv testable without a network.

A remote process runs inside `python -m rlctl.launch.remote run` (rlctl/launch/remote.py), which ties its process group to
the SSH session. Whatever the supervisor needs from it travels over that session: output on the session's
stdout, control messages through a Unix socket that `ssh -R` forwards to the supervisor's control port, and
secrets and the job file on the session's stdin, never on a command line.
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlctl.launch.remote import FileStreamError, keep_newer, read_file_stream, write_file_stream
from rlctl.job.spec import HostSpec

# Never placed on a command line: these reach remote processes through the SSH session's stdin.
SECRET_ENV = frozenset({"RLCTL_CURVE_KEYS"})
# rlctl's options for every session (a host's ssh_options may override them; BatchMode stays yes).
SSH_OPTIONS = {"BatchMode": "yes", "ConnectTimeout": "10", "ServerAliveInterval": "5", "ServerAliveCountMax": "3"}
# Replaced by the start count when a process is (re)started: each session forwards its own control socket.
ATTEMPT = "{attempt}"
PULL_ATTEMPTS = 3  # tries to fetch a host's checkpoints at the end of a run
PULL_RETRY_S = 1.0  # the wait before the second try (twice that before the third)


def private_dir(token: str) -> str:
    """The run's private folder (0700) on each remote host, made by the preflight check: the sockets its sessions
    forward live there, where no other user can plant or reach anything."""
    return f"/tmp/rlctl-{token}"


def control_socket(run_id: str, name: str, token: str = "") -> str:
    """The remote Unix socket a process's session forwards to the supervisor (short: sun_path is 108 bytes): in the
    run's private folder when the run has a token (`rlctl run` always draws one)."""
    if token:
        return f"{private_dir(token)}/{name}-{ATTEMPT}.sock"
    return f"/tmp/rlctl-{zlib.crc32(run_id.encode()):08x}-{name}-{ATTEMPT}.sock"


# Set for the processes of a host that has a relay: where they subscribe to weights instead of learner rank 0, and
# where their hellos and heartbeats go instead of the supervisor (the relay bundles them).
WEIGHTS_VIA_ENV = "RLCTL_WEIGHTS_VIA"
WEIGHTS_BULK_VIA_ENV = "RLCTL_WEIGHTS_BULK_VIA"  # a relay below another: the sealed versions' bulk socket above
CONTROL_VIA_ENV = "RLCTL_CONTROL_VIA"


def relay_socket(run_id: str, rank: int, token: str = "", channel: str = "") -> str:
    """A Unix socket relay `rank` binds for its host's processes (rlctl.roles.relay): weights, or with `channel`
    "control" their control messages; in the run's private folder, named by the relay (test hosts share one /tmp)."""
    name = f"relay-{rank}{'-' + channel if channel else ''}.sock"
    if token:
        return f"{private_dir(token)}/{name}"
    return f"/tmp/rlctl-{zlib.crc32(run_id.encode()):08x}-{name}"


class LocalLauncher:
    """Processes on the launching machine: the argv as is, environment passed by the OS."""

    remote = False

    def argv(self, host: HostSpec, argv: list[str], env: dict[str, str], control_port: int = 0,
             secret: frozenset = frozenset()) -> list[str]:
        """The command line to exec locally (the environment travels apart from it)."""
        return list(argv)


class SSHLauncher:
    """Processes on another machine through the system's OpenSSH client."""

    remote = True

    def ssh_prefix(self, host: HostSpec) -> list[str]:
        """`ssh` with batch mode and the host's options, up to and including the destination."""
        cmd = ["ssh"]
        # The host's options may change rlctl's defaults, but a launcher must never wait for a password prompt.
        for key, value in {**SSH_OPTIONS, **host.ssh_options, "BatchMode": "yes"}.items():
            cmd += ["-o", f"{key}={value}"]
        if host.port:
            cmd += ["-p", str(host.port)]
        if host.identity_file:
            cmd += ["-i", host.identity_file, "-o", "IdentitiesOnly=yes"]
        if host.user:
            cmd += ["-l", host.user]
        return cmd + [host.destination]

    def shell_command(self, host: HostSpec, argv: list[str], env: dict[str, str] | None = None,
                      secret: frozenset = frozenset()) -> str:
        """The shell command run on the host: cd to its workdir, then exec argv. Secrets (the keys, the host's own
        env) are left out: a command line is readable in /proc by everyone; they go down the session's stdin."""
        hidden = SECRET_ENV | secret
        assignments = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items() if k not in hidden]
        body = "exec " + ("env " + " ".join(assignments) + " " if assignments else "") + shlex.join(argv)
        if host.workdir:
            body = f"cd {shlex.quote(host.workdir)} && {body}"
        return body

    def argv(self, host: HostSpec, argv: list[str], env: dict[str, str], control_port: int = 0,
             secret: frozenset = frozenset()) -> list[str]:
        """The local `ssh ...` command line that starts `argv` on the host, tethered to the session (`secret`: env
        keys kept off it)."""
        prefix = self.ssh_prefix(host)
        forward = []
        if control_port and "RLCTL_CONTROL" in env:
            sock = env["RLCTL_CONTROL"].removeprefix("ipc://")
            forward = ["-o", "ExitOnForwardFailure=yes", "-R", f"{sock}:127.0.0.1:{control_port}"]
        wrapped = [host.python, "-m", "rlctl.launch.remote", "run", "--", *argv]
        return prefix[:-1] + forward + [prefix[-1], "--", self.shell_command(host, wrapped, env, secret)]

    def helper_argv(self, host: HostSpec, *args: str) -> list[str]:
        """`ssh ...` running `python -m rlctl.launch.remote ARGS` on the host (check, sweep, pull)."""
        return self.ssh_prefix(host) + ["--", self.shell_command(host, [host.python, "-m", "rlctl.launch.remote", *args])]


class SlurmLauncher:
    """Processes on a node of the Slurm allocation the run is inside, each one a job step (`srun --overlap`): Slurm
    accounts for it and `scancel` ends it. Its environment travels with srun (never on a command line); the keys,
    as over SSH, on the step's stdin."""

    remote = True

    def step_prefix(self, host: HostSpec) -> list[str]:
        """`srun` for one task on the host's node, sharing the allocation's CPUs with the job's other steps."""
        cmd = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host.destination}",
               f"--jobid={host.slurm_job}", "--quiet"]
        if host.workdir:
            cmd.append(f"--chdir={host.workdir}")
        return cmd

    def argv(self, host: HostSpec, argv: list[str], env: dict[str, str], control_port: int = 0,
             secret: frozenset = frozenset()) -> list[str]:
        """The local `srun ...` command line that starts `argv` on the node, tethered to the step's stdin; the step is
        named after the process (`squeue -s` shows rlctl-collector-3)."""
        name = f"--job-name=rlctl-{env.get('RLCTL_ROLE', 'process')}-{env.get('RLCTL_RANK', '0')}"
        return self.step_prefix(host) + [name, host.python, "-m", "rlctl.launch.remote", "run", "--", *argv]

    def helper_argv(self, host: HostSpec, *args: str) -> list[str]:
        """`srun ...` running `python -m rlctl.launch.remote ARGS` on the node (check, sweep, pull)."""
        return self.step_prefix(host) + [host.python, "-m", "rlctl.launch.remote", *args]


LAUNCHERS = {"local": LocalLauncher(), "ssh": SSHLauncher(), "slurm": SlurmLauncher()}


def launcher_for(host: HostSpec) -> LocalLauncher | SSHLauncher | SlurmLauncher:
    """The launcher that reaches `host`."""
    return LAUNCHERS["local" if host.is_local else "slurm" if host.slurm_job is not None else "ssh"]


def ssh_hostnames(hosts: list[HostSpec]) -> dict[str, str]:
    """The host name ssh connects to for each host's destination (`~/.ssh/config` aliases resolved, by `ssh -G`,
    which reads the configuration only and contacts nobody); the destination itself where ssh cannot say."""
    ssh = SSHLauncher()

    def one(h: HostSpec) -> str:
        prefix = ssh.ssh_prefix(h)
        try:
            out = subprocess.run([prefix[0], "-G", *prefix[1:]], stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return h.destination
        return next((ln.split(None, 1)[1] for ln in out.splitlines() if ln.startswith("hostname ")), h.destination)

    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return dict(zip([h.name for h in hosts], pool.map(one, hosts)))


def on_hosts(hosts: list[HostSpec], args, timeout: float = 30.0) -> dict[str, subprocess.CompletedProcess]:
    """Run `python -m rlctl.launch.remote ARGS` on every host at once (over SSH, or as a Slurm step); host name -> finished
    ssh (or srun) process.

    `args` is a list of arguments for every host, or a function of the host giving its own.
    """
    def one(h: HostSpec) -> subprocess.CompletedProcess:
        argv = launcher_for(h).helper_argv(h, *(args(h) if callable(args) else args))
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, b"", f"no answer within {timeout:g}s".encode())

    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
        return dict(zip([h.name for h in hosts], pool.map(one, hosts)))


def last_json_line(out: bytes) -> dict | None:
    """The last stdout line that parses as a JSON object (login banners and the like come before it)."""
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def ssh_failure(proc: subprocess.CompletedProcess) -> str:
    """What went wrong, in the words of ssh or the remote shell (their last line of stderr)."""
    lines = [ln.strip() for ln in proc.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


def sweep_hosts(hosts: list[HostSpec], run_id: str, kill: bool = True, placed: bool = False,
                timeout: float = 20.0) -> dict[str, dict]:
    """On every host at once: the run's processes left there (killed with kill; with `placed`, only those the plan
    placed on that host); host -> {left, killed} or {error}."""
    out = {}

    def args(h: HostSpec) -> list[str]:
        return ["sweep", run_id, *(["--kill"] if kill else []), *(["--host", h.name] if placed else [])]

    for name, proc in on_hosts(hosts, args, timeout=timeout).items():
        result = last_json_line(proc.stdout) if proc.returncode == 0 else None
        out[name] = result if result is not None else {"error": ssh_failure(proc)}
    return out


def pull_directory(hosts: list[HostSpec], remote_dir: str, local_dir: Path,
                   attempts: int = PULL_ATTEMPTS) -> dict[str, list[str] | str]:
    """Copy the files of `remote_dir` (relative to each host's workdir) into `local_dir`, where newer than the copy
    there; host -> the names that came, or an error. A host whose transfer failed or came incomplete is asked
    again, up to `attempts` times in all (a Slurm step can fail to start while the allocation changes; an SSH
    connection can drop)."""
    out: dict[str, list[str] | str] = {}
    left = list(hosts)
    for attempt in range(attempts):
        if attempt:
            time.sleep(PULL_RETRY_S * attempt)
        for name, proc in on_hosts(left, ["pull", remote_dir], timeout=120).items():
            try:
                out[name] = unpack_pulled(proc.stdout, local_dir) if proc.returncode == 0 else ssh_failure(proc)
            except FileStreamError as exc:
                out[name] = str(exc)
        left = [h for h in left if isinstance(out[h.name], str)]
        if not left:
            break
    return out


def pull_newer(host: HostSpec, remote_dir: str, local_dir: Path, since: float, suffix: str = "",
               timeout: float = 120.0) -> dict[str, float] | str:
    """One try at the files of `remote_dir` on `host` modified after `since` (the host's clock) and named ...`suffix`,
    each written into `local_dir` unless the copy there is as new: name -> modification time of what came, or an
    error."""
    proc = on_hosts([host], ["pull", remote_dir, "--since", repr(since), "--suffix", suffix],
                    timeout=timeout)[host.name]
    if proc.returncode != 0:
        return ssh_failure(proc)
    try:
        files = read_file_stream(proc.stdout)
    except FileStreamError as exc:
        return str(exc)
    keep_newer(files, local_dir)
    return {name: mtime for name, (_, mtime) in files.items()}


def unpack_pulled(data: bytes, local_dir: Path) -> list[str]:
    """Write the files of a `python -m rlctl.launch.remote pull` stream into `local_dir` (each unless the copy there
    is as new); the names that came. Every file its manifest lists must arrive whole, or nothing is written
    (FileStreamError)."""
    files = read_file_stream(data)
    keep_newer(files, local_dir)
    return sorted(files)


def push_directory(hosts: list[HostSpec], local_dir: Path, names: list[str], remote_dir: str,
                   timeout: float = 120.0) -> dict[str, list[str] | str]:
    """Send the files `names` of `local_dir` to `remote_dir` on every host at once, each written there unless the
    host's copy is as new; host -> the names written, or an error."""
    buffer = io.BytesIO()
    write_file_stream(buffer, [local_dir / name for name in names])
    stream = buffer.getvalue()

    def one(h: HostSpec) -> list[str] | str:
        argv = launcher_for(h).helper_argv(h, "push", remote_dir)
        try:
            proc = subprocess.run(argv, input=stream, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout:g}s"
        answer = last_json_line(proc.stdout) if proc.returncode == 0 else None
        written = answer.get("written") if answer else None
        if not isinstance(written, list):
            return ssh_failure(proc)
        return [str(n) for n in written]

    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
        return dict(zip([h.name for h in hosts], pool.map(one, hosts)))
