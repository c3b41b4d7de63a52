"""Shaped hosts on one machine: network namespaces behind a bridge.

Each host is a network namespace with one veth pair to a bridge in the
root namespace. Every veth end gets a `tbf` on its egress (both ways of
the host's link are shaped) and, for a latency, a `netem` delay of half
the one-way latency, so that host-to-host traffic crosses two shaped
ends: rate R and one-way latency L between any two hosts.

Everything created is named `tfgc-<run>-...` (the interface name limit is
15 characters) and recorded in a state file under `STATE_DIR` before it is
created, so that `cleanup_leftovers()` can remove what a killed run left.
Needs root or CAP_NET_ADMIN.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "tfgc-"
STATE_DIR = os.path.join(tempfile.gettempdir(), "tfgc-lab")
SUBNET = "10.213.0"
MAX_HOSTS = 99  # keeps `tfgc-XXXX-p99` within IFNAMSIZ - 1
#: tbf bucket per link, seconds of traffic at its rate (see `_shape`).
BURST_S = 10e-3
_CAP_NET_ADMIN = 12
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_rate(text: str) -> float:
    """'1gbit', '100mbit', '10gbit' -> bits per second."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", text.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"`rate` must look like 100mbit, 1gbit or 10gbit. Received: "
            f"rate={text!r}"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_time(text: str) -> float:
    """'0.2ms', '5ms', '0' -> seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|ms|us)?", text.strip().lower())
    if not match:
        raise ValueError(
            f"`latency` must look like 0, 0.2ms or 5ms. Received: "
            f"latency={text!r}"
        )
    return float(match.group(1)) * _TIME_UNITS[match.group(2) or "s"]


def have_net_admin() -> bool:
    """Whether this process may create namespaces, links and qdiscs."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check)


def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=30, check=False
    )
    if check and proc.returncode:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed ({proc.returncode}): "
            f"{proc.stderr.strip()}"
        )
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Host:
    """One host: its namespace, veth ends and address."""

    index: int
    namespace: str
    veth: str  # root-namespace end, on the bridge
    peer: str  # the host's own end, inside its namespace
    address: str

    def exec_prefix(self) -> list[str]:
        """Command prefix that runs a program inside this host."""
        return ["ip", "netns", "exec", self.namespace]


class Testbed:
    """`hosts` shaped namespaces; a context manager that removes them.

    Args:
        hosts: number of hosts, 1 to `MAX_HOSTS`.
        rate: link rate per host and direction ("1gbit"), or None for
            unshaped links.
        latency: one-way host-to-host latency ("0.2ms"), split evenly
            between the two veth ends a packet crosses.
    """

    def __init__(self, hosts: int, rate: str | None, latency: str = "0"):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(
                f"`hosts` must be in [1, {MAX_HOSTS}]. Received: hosts={hosts}"
            )
        self.rate_bits = None if rate is None else parse_rate(rate)
        self.latency_s = parse_time(latency)
        self._name(hosts, secrets.token_hex(2))

    def _name(self, hosts: int, run_id: str) -> None:
        """Names the bridge, namespaces, veths and state file after run_id."""
        self.run_id = run_id
        base = f"{PREFIX}{run_id}"
        self.bridge = f"{base}-br"
        self.hosts = [
            Host(
                h,
                f"{base}-h{h}",
                f"{base}-v{h}",
                f"{base}-p{h}",
                f"{SUBNET}.{h + 1}",
            )
            for h in range(hosts)
        ]
        self.state_file = os.path.join(STATE_DIR, f"{base}.json")

    # --- life cycle ------------------------------------------------------

    def __enter__(self) -> Testbed:
        if not have_net_admin():
            raise PermissionError(no_privilege_message())
        # Teardown deletes by name: never share one with another run.
        taken = {n.split("-")[1] for n in list_namespaces() + list_links()}
        while self.run_id in taken or os.path.exists(self.state_file):
            self._name(len(self.hosts), secrets.token_hex(2))
        self._record()
        try:
            self._create()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _record(self) -> None:
        # Written before anything exists, so a crash at any point leaves
        # a record that `cleanup_leftovers` can act on.
        os.makedirs(STATE_DIR, exist_ok=True)
        state = {
            "pid": os.getpid(),
            "namespaces": [h.namespace for h in self.hosts],
            "links": [self.bridge] + [h.veth for h in self.hosts],
        }
        with open(self.state_file, "w") as f:
            json.dump(state, f)

    def _create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            ns = host.namespace
            _ip("netns", "add", ns)
            _ip(
                "link", "add", host.veth, "type", "veth",
                "peer", "name", host.peer, "netns", ns,
            )  # fmt: skip
            _ip("link", "set", host.veth, "master", self.bridge, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", host.peer)
            _ip("-n", ns, "link", "set", host.peer, "up")
            self._shape([], host.veth)  # towards the host
            self._shape(["-n", ns], host.peer)  # from the host

    def _shape(self, netns: list[str], dev: str) -> None:
        if self.rate_bits is None and not self.latency_s:
            return
        tc = ["tc", *netns, "qdisc", "add", "dev", dev]
        parent = ["root"]
        if self.latency_s:
            # Half on each end: a packet between hosts crosses two.
            delay_us = max(1, round(self.latency_s / 2 * 1e6))
            proc = _run(
                tc + ["root", "handle", "1:", "netem", "delay",
                      f"{delay_us}us", "limit", "100000"],
                check=False,
            )  # fmt: skip
            if proc.returncode:
                raise RuntimeError(
                    "Cannot add a latency: `tc ... netem` failed "
                    f"({proc.stderr.strip()}). This kernel may lack "
                    "sch_netem; run with --latency 0 (rate shaping needs "
                    "only tbf)."
                )
            parent = ["parent", "1:1"]
        if self.rate_bits is not None:
            # A bucket of 10 ms of traffic. The qdisc's timer runs late
            # when the VM's cores are taken away (steal time); tokens
            # beyond a full bucket are lost, so with 2 ms a 1 Gbit/s link
            # carried 680-790 Mbit/s here, with 10 ms 880-950. Cloud
            # links are token buckets too, with larger buckets.
            burst = max(64 * 1024, int(self.rate_bits / 8 * BURST_S))
            _run(
                tc + parent + ["handle", "10:", "tbf", "rate",
                               f"{int(self.rate_bits)}bit", "burst",
                               str(burst), "latency", "50ms"]
            )  # fmt: skip

    def teardown(self) -> list[str]:
        """Removes everything this testbed created; safe to call twice."""
        removed = _remove(
            [h.namespace for h in self.hosts],
            [h.veth for h in self.hosts] + [self.bridge],
        )
        try:
            os.remove(self.state_file)
        except FileNotFoundError:
            pass
        return removed

    # --- reading ---------------------------------------------------------

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each host sent and received, from the bridge side.

        The root end's rx is what the host transmitted.
        """
        out = {}
        for host in self.hosts:
            stats = f"/sys/class/net/{host.veth}/statistics"
            with open(f"{stats}/rx_bytes") as f:
                sent = int(f.read())
            with open(f"{stats}/tx_bytes") as f:
                received = int(f.read())
            out[host.namespace] = {"tx_bytes": sent, "rx_bytes": received}
        return out

    def qdiscs(self) -> str:
        """`tc qdisc show` of every veth end (for the results)."""
        lines = []
        for host in self.hosts:
            for netns, dev in (
                ([], host.veth),
                (["-n", host.namespace], host.peer),
            ):
                shown = _run(["tc", *netns, "qdisc", "show", "dev", dev]).stdout
                lines.append(f"{dev}: {' | '.join(shown.strip().splitlines())}")
        return "\n".join(lines)


def _remove(namespaces: Sequence[str], links: Sequence[str]) -> list[str]:
    """Deletes namespaces (their veth ends go with them), then links."""
    removed = []
    for kind, names, existing in (
        ("netns", namespaces, list_namespaces),
        ("link", links, list_links),  # listed after the namespaces went
    ):
        present = set(existing())
        for name in names:
            if (
                name in present
                and not _ip(kind, "del", name, check=False).returncode
            ):
                removed.append(name)
    return removed


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Network namespaces whose names start with `prefix`."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def list_links(prefix: str = PREFIX) -> list[str]:
    """Links of the root namespace whose names start with `prefix`."""
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = [
        line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
    ]
    return [n for n in names if n.startswith(prefix)]


def cleanup_leftovers() -> list[str]:
    """Removes what runs that are no longer alive left behind.

    Recorded runs whose process still lives are left alone; anything else
    named with `PREFIX` is removed.
    """
    if not have_net_admin():
        raise PermissionError(no_privilege_message())
    keep_ns, keep_links = set(), set()
    removed = []
    if os.path.isdir(STATE_DIR):
        for name in sorted(os.listdir(STATE_DIR)):
            path = os.path.join(STATE_DIR, name)
            try:
                with open(path) as f:
                    state = json.load(f)
            except (OSError, ValueError):
                continue
            if _pid_alive(int(state.get("pid", -1))):
                keep_ns.update(state["namespaces"])
                keep_links.update(state["links"])
                continue
            removed += _remove(state["namespaces"], state["links"])
            os.remove(path)
    removed += _remove(
        [n for n in list_namespaces() if n not in keep_ns],
        # veth ends inside kept namespaces do not show in the root one.
        [n for n in list_links() if n not in keep_links],
    )
    return removed


def no_privilege_message() -> str:
    return (
        "The benchmark lab needs root or CAP_NET_ADMIN: it creates network "
        "namespaces, veth pairs, a bridge and tc qdiscs. Run it as root "
        "(e.g. `sudo .venv/bin/python -m benchmarks.run ...`), or pass "
        "--localhost for an unshaped run of the workers on loopback (step "
        "times without network limits and without bytes on the wire)."
    )
