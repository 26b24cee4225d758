"""Ways of reaching a host: one small class each, building an argv testable without a network."""

from __future__ import annotations

import shlex

from rlctl.spec import HostSpec

# Never placed on a command line: these reach remote processes through the SSH session's stdin.
SECRET_ENV = frozenset({"RLCTL_CURVE_KEYS"})


class LocalLauncher:
    """Processes on the launching machine: the argv as is, environment passed by the OS."""

    remote = False

    def argv(self, host: HostSpec, argv: list[str], env: dict[str, str]) -> list[str]:
        """The command line to exec locally."""
        return list(argv)


class SSHLauncher:
    """Processes on another machine through the system's OpenSSH client."""

    remote = True

    def ssh_prefix(self, host: HostSpec) -> list[str]:
        """`ssh` with batch mode and the host's options, up to and including the destination."""
        cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
        if host.port:
            cmd += ["-p", str(host.port)]
        if host.identity_file:
            cmd += ["-i", host.identity_file, "-o", "IdentitiesOnly=yes"]
        if host.user:
            cmd += ["-l", host.user]
        return cmd + [host.destination]

    def remote_command(self, host: HostSpec, argv: list[str], env: dict[str, str]) -> str:
        """The shell command run on the host (secrets excluded: they travel on stdin)."""
        assignments = [f"{k}={shlex.quote(v)}" for k, v in env.items() if k not in SECRET_ENV]
        body = "exec env " + " ".join(assignments + [shlex.quote(a) for a in argv])
        if host.workdir:
            body = f"cd {shlex.quote(host.workdir)} && {body}"
        return body

    def argv(self, host: HostSpec, argv: list[str], env: dict[str, str]) -> list[str]:
        """The local `ssh ...` command line that starts `argv` on the host."""
        return self.ssh_prefix(host) + ["--", self.remote_command(host, argv, env)]


LAUNCHERS = {"local": LocalLauncher(), "ssh": SSHLauncher()}


def launcher_for(host: HostSpec) -> LocalLauncher | SSHLauncher:
    """The launcher that reaches `host`."""
    return LAUNCHERS["local" if host.is_local else "ssh"]
