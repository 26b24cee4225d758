"""Which network interface carries an address: gloo and nccl want an interface name, a job file gives addresses."""

from __future__ import annotations

import fcntl
import os
import socket
import struct

SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_with_address(address: str) -> str | None:
    """The name of the local interface holding IPv4 `address` (a host name is resolved first), or None."""
    try:
        wanted = socket.gethostbyname(address)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(raw[20:24]) == wanted:
                return name
    return None


def pin_collective_interface(environ=os.environ) -> None:
    """Point gloo and nccl at the interface of this host's advertised address, unless the user already chose one.

    Without this gloo binds to whatever the host name resolves to, which on multi-homed hosts (and in network
    namespaces) may not be the network the other learner nodes are on.
    """
    address = environ.get("RLCTL_ADVERTISE")
    if not address or environ.get("GLOO_SOCKET_IFNAME"):
        return
    name = interface_with_address(address)
    if name:
        environ["GLOO_SOCKET_IFNAME"] = name
        environ.setdefault("NCCL_SOCKET_IFNAME", name)
