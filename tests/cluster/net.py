"""An emulated cluster on this machine: each rank in its own network namespace, its one link
shaped with ``tc``, so that a link rate, a rank count or a topology changes for real.

Layout (every interface and address lives inside namespaces this module makes; the machine's
own namespace is not touched):

- a fabric namespace ``chk-<tag>-fab`` holds the bridges: one per host (``hb<h>``) and, with
  more than one host, a spine (``spine``) that each host bridge reaches through its uplink (a
  veth pair ``u<h>h`` / ``u<h>s``);
- rank ``i`` runs in ``chk-<tag>-r<i>``, whose ``eth0`` (10.213.0.<i+1>/24) is a veth pair with
  ``r<i>`` on its host's bridge;
- every link is shaped both ways with ``tbf`` (this kernel has ``tbf`` and ``htb``, not
  ``netem``): a rank's link on ``eth0`` (what it sends) and on ``r<i>`` (what it receives), an
  uplink on ``u<h>h`` (what the host sends) and ``u<h>s`` (what it receives).

A ``Cluster`` is a context manager: leaving it (an exception included) deletes its namespaces,
which deletes every interface in them; namespaces left by a run that was killed (their tag is
a process id no longer alive) are deleted when the next cluster is made. Ranks of one emulated
host share a host name (a UTS namespace each rank process enters), so the traces say which
ranks share a host, as they would on a real cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "chk-"
SUBNET = "10.213.0"
PORT = 29500


class Unavailable(RuntimeError):
    """Namespaces cannot be made here (not root, or a tool missing: ``unavailable``)."""


def unavailable() -> str | None:
    """Why the cluster cannot be made on this machine, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "tc", "unshare", "sysctl", "hostname"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux, procps, hostname)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _run(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.stdout.strip()}")


def remove_stale() -> list[str]:
    """Delete the namespaces of clusters whose process is gone; returns their names."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    gone = []
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        tag = name[len(PREFIX):].split("-")[0]
        if tag.isdigit() and not Path(f"/proc/{tag}").exists():
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            gone.append(name)
    return gone


# tbf's bucket, bytes: the same at every rate, so that a transfer of S bytes takes (S - BURST) /
# rate and a rate twice as high halves it (a bucket of 5 ms at the rate saved 5 ms at each rate
# instead: 400 Mbit/s came out 2.2-2.5x as fast as 200). Above the 64 KiB of a segmentation
# offload packet: a smaller bucket split each one, and 200 Mbit/s ran 17 % under its rate.
BURST = 80_000


# How long a packet may wait in a link's queue. Short, as on a switch port: with 200 ms, a
# ring's data queued up to that long in front of the acknowledgements of the flow going the
# other way (this kernel has no fq_codel to keep them apart), connections' round trips jumped
# past their retransmission timeouts, and spurious timeouts stalled collectives 40-100 ms at
# random (a 256 KB all-reduce: 7 ms in one phase, 69 ms in the next).
QUEUE = os.environ.get("CHAKRA_TESTBED_QUEUE", "200ms")
WINDOW = int(os.environ.get("CHAKRA_TESTBED_WINDOW", str(256 * 1024)))


def _tbf(dev: str, ns: str, mbit: float) -> None:
    """Shape ``dev``'s egress to ``mbit``."""
    _run("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
         "burst", str(BURST), "latency", QUEUE, ns=ns)


@dataclass
class Cluster:
    """``ranks`` ranks in hosts of ``per_host`` (all on one bridge when ``per_host`` is
    ``ranks``); each rank's link at ``rank_mbit``, each host's uplink at ``uplink_mbit``."""

    ranks: int
    rank_mbit: float
    per_host: int | None = None
    uplink_mbit: float | None = None
    tag: str = field(default_factory=lambda: str(os.getpid()))
    made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.per_host = self.per_host or self.ranks
        if self.ranks % self.per_host:
            raise ValueError(f"{self.ranks} ranks do not fill hosts of {self.per_host}")

    @property
    def hosts(self) -> int:
        return self.ranks // self.per_host

    @property
    def fabric(self) -> str:
        return f"{PREFIX}{self.tag}-fab"

    def namespace(self, rank: int) -> str:
        return f"{PREFIX}{self.tag}-r{rank}"

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def host_of(self, rank: int) -> int:
        return rank // self.per_host

    def __enter__(self) -> Cluster:
        why = unavailable()
        if why:
            raise Unavailable(why)
        remove_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.made.append(name)
        _run("ip", "link", "set", "lo", "up", ns=name)

    def _build(self) -> None:
        fab = self.fabric
        self._add_ns(fab)
        for h in range(self.hosts):
            _run("ip", "link", "add", f"hb{h}", "type", "bridge", ns=fab)
            _run("ip", "link", "set", f"hb{h}", "up", ns=fab)
        if self.hosts > 1:
            _run("ip", "link", "add", "spine", "type", "bridge", ns=fab)
            _run("ip", "link", "set", "spine", "up", ns=fab)
            for h in range(self.hosts):
                _run("ip", "link", "add", f"u{h}h", "type", "veth", "peer", "name", f"u{h}s",
                     ns=fab)
                _run("ip", "link", "set", f"u{h}h", "master", f"hb{h}", "up", ns=fab)
                _run("ip", "link", "set", f"u{h}s", "master", "spine", "up", ns=fab)
        for r in range(self.ranks):
            ns = self.namespace(r)
            self._add_ns(ns)
            _run("ip", "link", "add", f"r{r}", "type", "veth", "peer", "name", "eth0",
                 "netns", ns, ns=fab)
            _run("ip", "link", "set", f"r{r}", "master", f"hb{self.host_of(r)}", "up", ns=fab)
            # A connection idle between collectives keeps its congestion window (an RDMA or
            # NCCL link has none to lose): every collective at the link's rate, not each one
            # starting over from slow start.
            _run("sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0", ns=ns)
            _run("ip", "addr", "add", f"{self.address(r)}/24", "dev", "eth0", ns=ns)
            _run("ip", "link", "set", "eth0", "up", ns=ns)
            # A window of at most WINDOW advertised (the receive buffer left as it is: shrunk
            # to that, it overflowed and dropped), so that a connection has no more in flight
            # and a queue holds no more than its flows' windows: nothing dropped, round trips of
            # a few ms, no spurious timeouts; any window above the links' few KB of
            # bandwidth-delay product keeps them busy. Acknowledgements at once: a sender out of
            # window waited up to 40 ms for a delayed ack (a 33 ms all-reduce took 90 now and
            # then).
            _run("ip", "route", "replace", f"{SUBNET}.0/24", "dev", "eth0", "src",
                 self.address(r), "window", str(WINDOW), "quickack", "1", ns=ns)
        self.set_rank_rate(self.rank_mbit)
        if self.hosts > 1:
            self.set_uplink_rate(self.uplink_mbit or self.rank_mbit)

    def set_rank_rate(self, mbit: float) -> None:
        """Every rank's link, both ways, at ``mbit``."""
        for r in range(self.ranks):
            _tbf("eth0", self.namespace(r), mbit)
            _tbf(f"r{r}", self.fabric, mbit)
        self.rank_mbit = mbit

    def set_uplink_rate(self, mbit: float) -> None:
        """Every host's uplink to the spine, both ways, at ``mbit``."""
        if self.hosts < 2:
            raise ValueError("one host: there is no uplink")
        for h in range(self.hosts):
            _tbf(f"u{h}h", self.fabric, mbit)
            _tbf(f"u{h}s", self.fabric, mbit)
        self.uplink_mbit = mbit

    def tcp_counters(self) -> dict[int, dict[str, int]]:
        """Per rank, its namespace's TCP segments sent and retransmitted (nothing is dropped
        on these links; the few retransmissions seen are tail-loss probes and spurious
        timeouts while a queue is long)."""
        out = {}
        for r in range(self.ranks):
            text = subprocess.run(["ip", "netns", "exec", self.namespace(r), "cat",
                                   "/proc/net/snmp"], capture_output=True, text=True).stdout
            rows = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
            if len(rows) == 2:
                counts = dict(zip(rows[0][1:], rows[1][1:]))
                out[r] = {"sent": int(counts["OutSegs"]), "retransmitted": int(counts["RetransSegs"])}
            text = subprocess.run(["ip", "netns", "exec", self.namespace(r), "cat",
                                   "/proc/net/netstat"], capture_output=True, text=True).stdout
            rows = [line.split() for line in text.splitlines() if line.startswith("TcpExt:")]
            if len(rows) == 2 and r in out:
                ext = dict(zip(rows[0][1:], map(int, rows[1][1:])))
                out[r].update({k: ext.get(k, 0) for k in (
                    "TCPTimeouts", "TCPLossProbes", "TCPSpuriousRTOs", "PruneCalled",
                    "TCPRcvQDrop", "TCPBacklogDrop", "TCPOFOQueue", "TCPZeroWindowDrop")})
        return out

    def close(self) -> None:
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        self.made.clear()

    def launch(self, rank: int, argv: Sequence[str], env: dict[str, str],
               log: Path) -> subprocess.Popen:
        """Start ``argv`` as rank ``rank`` inside its namespace, with torch.distributed's
        variables set (gloo bound to ``eth0``) and its host's name, output to ``log``."""
        full = dict(os.environ, **env, RANK=str(rank), WORLD_SIZE=str(self.ranks),
                    MASTER_ADDR=self.address(0), MASTER_PORT=str(PORT),
                    GLOO_SOCKET_IFNAME="eth0")
        hostname = f"host{self.host_of(rank)}"
        cmd = ["ip", "netns", "exec", self.namespace(rank), "unshare", "--uts", "sh", "-c",
               f'hostname {hostname} && exec "$@"', "sh", *argv]
        handle = open(log, "wb")
        try:
            return subprocess.Popen(cmd, env=full, stdout=handle, stderr=subprocess.STDOUT)
        finally:
            handle.close()


