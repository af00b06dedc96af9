"""An emulated NIC on this host: a network namespace joined to the root one by a veth pair whose
both ends are shaped with tc's token bucket filter (``tbf``) to one rate.

    with EmulatedLink.create(rate_bps=600e6) as link:      # needs root, iproute2 and sch_tbf
        subprocess.run(link.exec_prefix() + ["python", "-m", "hetero", "serve", ...])
        ... connect to link.ns_ip from here ...

Everything it makes carries the prefix :data:`PREFIX` and the creating process's id
(``hnic-<pid>`` for the namespace, ``hnic<pid>h`` / ``hnic<pid>n`` for the veth ends), so
:func:`leftover_cleanup` can remove what a killed run left behind without touching a live run's.
The addresses are a /30 from :data:`CANDIDATE_POOLS` that overlaps no address or route this
host has, so nothing is sent beyond the two ends of the pair. :func:`unavailable` says why the
host cannot do this (not root, no ``ip`` or ``tc``, a kernel without namespaces or ``sch_tbf``).

The command lists are built by plain functions (no root needed), which the unit tests check.
"""
from __future__ import annotations

import atexit
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Iterable, Sequence

PREFIX = "hnic"
CANDIDATE_POOLS = ("10.213.0.0/16", "169.254.213.0/24")
ETH_HEADER = 14   # bytes tc counts per frame beyond the IP packet on a veth
IP_TCP_HEADERS = 52  # IPv4 (20) + TCP with timestamps (32): what a full frame carries besides payload
DEFAULT_LATENCY_MS = 100
COMMAND_TIMEOUT_S = 20.0


class LinkUnavailable(RuntimeError):
    """The host cannot make the emulated link; the message says why (for a skip)."""


def names(owner: int) -> tuple[str, str, str]:
    """(namespace, root-side veth, namespace-side veth) of the link made by process ``owner``.

    Interface names stay within the kernel's 15 characters for any pid (at most 7 digits)."""
    if not isinstance(owner, int) or owner < 0:
        raise ValueError(f"owner={owner!r} must be a process id (an int >= 0)")
    return f"{PREFIX}-{owner}", f"{PREFIX}{owner}h", f"{PREFIX}{owner}n"


def choose_subnet(used: Iterable[ipaddress.IPv4Network | str],
                  pools: Sequence[str] = CANDIDATE_POOLS) -> ipaddress.IPv4Network:
    """The first /30 of ``pools`` that overlaps none of the ``used`` networks.

    Raises:
        LinkUnavailable: every /30 of every pool overlaps one.
    """
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    taken = [t for t in taken if t.version == 4]
    for pool in pools:
        for net in ipaddress.ip_network(pool).subnets(new_prefix=30):
            if not any(net.overlaps(t) for t in taken):
                return net
    raise LinkUnavailable(f"no free /30 in {', '.join(pools)}: every one overlaps an address or route of this host")


def parse_used_networks(addr_output: str, route_output: str) -> list[ipaddress.IPv4Network]:
    """IPv4 networks of ``ip -o -4 addr show`` and ``ip -4 route show`` output (default routes
    are left out: they overlap everything)."""
    nets = [ipaddress.ip_network(m, strict=False) for m in re.findall(r"\binet (\d+\.\d+\.\d+\.\d+/\d+)", addr_output)]
    for line in route_output.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("default", "", "unreachable", "blackhole", "prohibit", "local", "broadcast", "multicast"):
            word = line.split()[1] if word in ("unreachable", "blackhole", "prohibit", "local", "broadcast",
                                               "multicast") and len(line.split()) > 1 else ""
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", word):
            nets.append(ipaddress.ip_network(word, strict=False))
    return nets


def scaled_rate_bps(per_core_images_s: float, cores: float, bytes_per_image: float, fraction: float) -> float:
    """A NIC rate (bits/s) that carries ``fraction`` of what ``cores`` build: so the NIC, not the
    cores, binds when ``fraction`` < 1.

    Raises:
        ValueError: a figure that is not positive, or ``fraction`` outside (0, 1].
    """
    for name, value in (("per_core_images_s", per_core_images_s), ("cores", cores),
                        ("bytes_per_image", bytes_per_image)):
        if not value > 0:
            raise ValueError(f"{name}={value!r} must be > 0")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r} must be in (0, 1]: the share of the cores' output the NIC carries")
    return per_core_images_s * cores * bytes_per_image * 8 * fraction


def tcp_goodput(mtu: int = 1500) -> float:
    """Share of the shaped rate that is TCP payload: tbf counts each frame's Ethernet, IP and TCP
    headers (``mtu - 52`` payload bytes per ``mtu + 14`` counted)."""
    if mtu <= IP_TCP_HEADERS:
        raise ValueError(f"mtu={mtu} must exceed the {IP_TCP_HEADERS} bytes of IP and TCP headers")
    return (mtu - IP_TCP_HEADERS) / (mtu + ETH_HEADER)


def tbf_command(dev: str, rate_bps: float, netns: str | None = None,
                latency_ms: int = DEFAULT_LATENCY_MS) -> list[str]:
    """``tc qdisc replace`` of a token bucket at ``rate_bps`` on ``dev`` (in ``netns`` when given).

    The bucket holds at least 10 ms of the rate and 128 KiB (a GSO packet is cut to fit it), so
    the rate is met over any span longer than that."""
    if not rate_bps >= 8000:
        raise ValueError(f"rate_bps={rate_bps!r} must be >= 8000 bits/s")
    burst = max(128 * 1024, int(rate_bps / 8 / 100))
    cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(rate_bps)}bit",
           "burst", str(burst), "latency", f"{int(latency_ms)}ms"]
    return in_netns(netns, cmd) if netns else cmd


def in_netns(netns: str, cmd: list[str]) -> list[str]:
    """``cmd`` run inside namespace ``netns``."""
    return ["ip", "netns", "exec", netns, *cmd]


@dataclass
class EmulatedLink:
    """A namespace ``ns`` reached at ``ns_ip`` from ``host_ip`` in the root namespace, over a veth
    pair shaped to ``rate_bps`` each way. Made by :meth:`create`; :meth:`remove` (or leaving the
    ``with`` block, or this process's exit) takes it all away."""

    owner: int
    subnet: ipaddress.IPv4Network
    rate_bps: float
    latency_ms: int = DEFAULT_LATENCY_MS
    mtu: int = 1500
    _made: list[list[str]] = field(default_factory=list, repr=False)

    @property
    def ns(self) -> str:
        return names(self.owner)[0]

    @property
    def host_if(self) -> str:
        return names(self.owner)[1]

    @property
    def ns_if(self) -> str:
        return names(self.owner)[2]

    @property
    def host_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def ns_ip(self) -> str:
        return str(self.subnet.network_address + 2)

    def setup_commands(self) -> list[list[str]]:
        """The commands that make the link, in order."""
        plen = self.subnet.prefixlen
        return [["ip", "netns", "add", self.ns],
                ["ip", "link", "add", self.host_if, "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", self.ns_if, "mtu", str(self.mtu), "netns", self.ns],
                ["ip", "addr", "add", f"{self.host_ip}/{plen}", "dev", self.host_if],
                ["ip", "link", "set", self.host_if, "up"],
                in_netns(self.ns, ["ip", "link", "set", "lo", "up"]),
                in_netns(self.ns, ["ip", "addr", "add", f"{self.ns_ip}/{plen}", "dev", self.ns_if]),
                in_netns(self.ns, ["ip", "link", "set", self.ns_if, "up"]),
                tbf_command(self.ns_if, self.rate_bps, self.ns, self.latency_ms),
                tbf_command(self.host_if, self.rate_bps, None, self.latency_ms)]

    def cleanup_commands(self) -> list[list[str]]:
        """The commands that remove the link (deleting one veth end deletes both)."""
        return cleanup_commands(self.owner)

    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it inside the namespace."""
        return ["ip", "netns", "exec", self.ns]

    def counters(self) -> dict:
        """The data direction's queueing counters: bytes and packets sent, packets dropped, times
        the bucket held a packet back (``tc -s qdisc`` on the namespace's end)."""
        out = _run(in_netns(self.ns, ["tc", "-s", "qdisc", "show", "dev", self.ns_if])).stdout
        return parse_tbf_counters(out)

    def set_rate(self, rate_bps: float) -> None:
        """Shape both ends to ``rate_bps`` from now on."""
        _run(tbf_command(self.ns_if, rate_bps, self.ns, self.latency_ms))
        _run(tbf_command(self.host_if, rate_bps, None, self.latency_ms))
        self.rate_bps = rate_bps

    @classmethod
    def create(cls, rate_bps: float, owner: int | None = None, latency_ms: int = DEFAULT_LATENCY_MS,
               mtu: int = 1500) -> "EmulatedLink":
        """Make the namespace, the veth pair, their addresses and the token buckets.

        Raises:
            LinkUnavailable: the host cannot (the reason says why); whatever was made is removed.
        """
        reason = unavailable()
        if reason:
            raise LinkUnavailable(reason)
        leftover_cleanup()
        owner = os.getpid() if owner is None else owner
        addr = _run(["ip", "-o", "-4", "addr", "show"]).stdout
        routes = _run(["ip", "-4", "route", "show", "table", "all"]).stdout
        link = cls(owner, choose_subnet(parse_used_networks(addr, routes)), rate_bps, latency_ms, mtu)
        atexit.register(link.remove)
        try:
            for cmd in link.setup_commands():
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
                if out.returncode != 0:
                    hint = " (a kernel without sch_tbf?)" if "tbf" in cmd else ""
                    raise LinkUnavailable(f"`{' '.join(cmd)}` failed{hint}: {(out.stderr or out.stdout).strip()}")
        except BaseException:
            link.remove()
            raise
        return link

    def remove(self) -> None:
        """Stop what still runs in the namespace, remove the veth pair and the namespace (quietly:
        parts already gone are fine)."""
        _remove(self.owner)

    def __enter__(self) -> "EmulatedLink":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def parse_tbf_counters(text: str) -> dict:
    """``sent``, ``packets``, ``dropped``, ``overlimits`` of ``tc -s qdisc show`` output (zeros when absent)."""
    m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", text)
    keys = ("sent", "packets", "dropped", "overlimits")
    return dict(zip(keys, map(int, m.groups()))) if m else dict.fromkeys(keys, 0)


def cleanup_commands(owner: int) -> list[list[str]]:
    """Commands removing what process ``owner`` made: its veth pair, then its namespace."""
    ns, host_if, _ = names(owner)
    return [["ip", "link", "del", host_if], ["ip", "netns", "del", ns]]


def namespace_pids_command(owner: int) -> list[str]:
    """The command listing the processes inside the namespace of ``owner``'s link."""
    return ["ip", "netns", "pids", names(owner)[0]]


def _remove(owner: int) -> None:
    # A process left in the namespace (a server of a killed run) would keep it alive after
    # ``ip netns del``: only this run's processes can be in it, so they go first.
    out = subprocess.run(namespace_pids_command(owner), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    for pid in (int(p) for p in out.stdout.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for cmd in cleanup_commands(owner):
        subprocess.run(cmd, capture_output=True, timeout=COMMAND_TIMEOUT_S)


def leftover_owners(netns_list: str, link_list: str, alive=None) -> list[int]:
    """Owners (pids) of namespaces and links with our prefix whose process is gone.

    Args:
        netns_list: ``ip netns list`` output; link_list: ``ip -o link show`` output.
        alive: pid -> still running (default: a signal-0 probe).
    """
    alive = alive or _pid_alive
    owners = {int(m) for m in re.findall(rf"^{PREFIX}-(\d+)\b", netns_list, re.M)}
    owners |= {int(m) for m in re.findall(rf"^\d+:\s+{PREFIX}(\d+)[hn]\b", link_list, re.M)}
    return sorted(o for o in owners if not alive(o))


def leftover_cleanup() -> list[int]:
    """Remove namespaces and links a killed run left behind (their owner pid is gone); returns
    those owners."""
    if shutil.which("ip") is None:
        return []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           timeout=COMMAND_TIMEOUT_S).stdout
    owners = leftover_owners(netns, links)
    for owner in owners:
        _remove(owner)
    return owners


def unavailable() -> str | None:
    """Why this host cannot make an emulated link (None: it can, as far as can be told without
    trying; :meth:`EmulatedLink.create` names the step that fails otherwise)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: install iproute2"
    if not os.path.exists("/proc/self/ns/net"):
        return "the kernel has no network namespaces"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if out.returncode != 0:
        raise LinkUnavailable(f"`{' '.join(cmd)}` failed: {(out.stderr or out.stdout).strip()}")
    return out
