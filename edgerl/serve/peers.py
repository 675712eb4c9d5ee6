"""Who is at the other end of a connection to ``edgerl serve``: what its limits count against.

A connection from another machine counts against its address (an IPv6 host's /64). One from this
machine comes from 127.0.0.1 (or the machine's own address) whichever account opened it, so its
address tells the accounts apart no more than a shared office's NAT does; on Linux the kernel
knows which account owns the socket at that end, and is asked (``sock_diag``: one exact lookup,
no listing of sockets). Where it cannot tell, the address is what counts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: look the socket up by its addresses alone
ALL_STATES = 0xFFFFFFFF
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
DIAG_REQUEST = struct.Struct("=BBBBI")  # family, protocol, extensions, pad, states
SOCKET_ID = struct.Struct(">HH16s16s")  # its own port, the other's, its address, the other's
DIAG_MESSAGE = struct.Struct("=BBBB48sIIIII")  # family, state, timer, retrans, id, ..., uid
ANSWER_TIMEOUT_S = 0.5


def peer_key(peer: object) -> str:
    """What one connection from ``peer`` (a socket's peername) counts against, by address: its
    IPv4 address, or its IPv6 address's /64 (one host is given a /64 and may use any address in
    it)."""
    if not isinstance(peer, tuple) or not peer:
        return "?"
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return str(peer[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # IPv4 on a dual-stack socket
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def connection_key(peer: object, ours: object) -> str:
    """What a connection counts against: ``uid N`` for one from an account of this machine
    (``peer`` on loopback or at the address it reached, ``ours``) whose owner the kernel names,
    else :func:`peer_key`."""
    if isinstance(peer, tuple) and isinstance(ours, tuple) and len(peer) >= 2 and len(ours) >= 2:
        theirs, mine = _address(str(peer[0])), _address(str(ours[0]))
        if theirs is not None and (theirs.is_loopback or theirs == mine):
            uid = socket_owner((str(peer[0]), int(peer[1])), (str(ours[0]), int(ours[1])))
            if uid is not None:
                return f"uid {uid}"
    return peer_key(peer)


def socket_owner(end: tuple[str, int], other: tuple[str, int]) -> int | None:
    """The uid of the account owning this machine's TCP socket whose own end is ``end`` and
    whose other end is ``other`` (address, port): the account that opened a connection from
    this machine. None where there is no such socket or the kernel cannot be asked (not Linux,
    no netlink in a sandbox); never raises."""
    if not hasattr(socket, "AF_NETLINK"):
        return None
    for family, ends in _spellings(end, other):
        with contextlib.suppress(OSError, ValueError, struct.error):
            uid = _ask(family, *ends)
            if uid is not None:
                return uid
    return None


def _spellings(
    end: tuple[str, int], other: tuple[str, int]
) -> list[tuple[int, tuple[bytes, int, bytes, int]]]:
    """The (family, packed ends) the socket may have: IPv4 on a dual-stack listener shows as
    ``::ffff:a.b.c.d`` here while the client's socket may be an IPv4 one, or an IPv6 one."""
    found = []
    a, b = _address(end[0]), _address(other[0])
    if a is None or b is None or a.version != b.version:
        return []
    if a.version == 4:
        found.append((socket.AF_INET, (a.packed, end[1], b.packed, other[1])))
        mapped = [ipaddress.IPv6Address(f"::ffff:{x}").packed for x in (a, b)]
        found.append((socket.AF_INET6, (mapped[0], end[1], mapped[1], other[1])))
    else:
        found.append((socket.AF_INET6, (a.packed, end[1], b.packed, other[1])))
    return found


def _ask(family: int, src: bytes, sport: int, dst: bytes, dport: int) -> int | None:
    """One SOCK_DIAG_BY_FAMILY lookup of the TCP socket (src, sport) -> (dst, dport): its
    owner's uid, or None when the kernel has none (it answers ENOENT)."""
    wanted = SOCKET_ID.pack(sport, dport, src.ljust(16, b"\0"), dst.ljust(16, b"\0"))
    request = DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, ALL_STATES)
    request += wanted + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)  # any interface
    size = NLMSG_HEADER.size + len(request)
    header = NLMSG_HEADER.pack(size, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as netlink:
        netlink.settimeout(ANSWER_TIMEOUT_S)
        netlink.sendto(header + request, (0, 0))
        answer = netlink.recv(8192)
    _, kind, _, _, _ = NLMSG_HEADER.unpack_from(answer)
    if kind != SOCK_DIAG_BY_FAMILY:
        return None  # an error message: no such socket
    got_family, _, _, _, got_id, _, _, _, uid, _ = DIAG_MESSAGE.unpack_from(
        answer, NLMSG_HEADER.size
    )
    # The very socket asked for (a listener on that port would carry no other end)
    if got_family != family or got_id[: SOCKET_ID.size] != wanted:
        return None
    return int(uid)
