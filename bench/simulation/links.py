"""Simulated links: what each node's connection can do, and the link distributions the
predictions draw from (each with its source; docs/simulation.md gives the full list).

A node has an uplink and a downlink rate (bytes/s), an access RTT (its last mile, added to
every link it is on), a region (the RTT between regions is added too) and a NAT type:

- ``open``: reachable directly (public address or a forwarded port);
- ``cone``: behind a NAT that hole punching gets through (DCUtR);
- ``symmetric``: behind a NAT hole punching fails on: another NATed node reaches it only
  through a circuit relay (``relay_Bps`` a link, and the schedule's "direct first" rule).

A TCP flow over a lossy path moves at most ``1.22 × MSS / (RTT × √loss)`` (Mathis et al.,
"The macroscopic behavior of the TCP congestion avoidance algorithm", CCR 1997).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MB = 1e6
Mbit = 1e6 / 8
MSS = 1448  # bytes: a TCP segment on a 1500-byte MTU path with timestamps


@dataclass
class Link:
    """One node's connection."""

    up: float  # bytes/s
    down: float  # bytes/s
    rtt: float = 0.0  # seconds: its access network, added to every path it is on
    region: int = 0
    nat: str = "open"  # open, cone, symmetric
    start: float = 0.0  # seconds: when it learns of the version (the announcement reached it)


def relayed(a: Link, b: Link) -> bool:
    """Whether only a circuit relay joins ``a`` and ``b``: both behind NAT, and hole
    punching fails for one of them."""
    return a.nat != "open" and b.nat != "open" and "symmetric" in (a.nat, b.nat)


def mathis_cap(rtt: float, loss: float) -> float:
    """The most one TCP flow moves over a path with ``rtt`` seconds and ``loss`` (bytes/s)."""
    if loss <= 0 or rtt <= 0:
        return math.inf
    return 1.22 * MSS / (rtt * math.sqrt(loss))


# ---- the distributions the predictions use ---------------------------------------------
# Regions and RTTs between them (ms, round trip), medians of public inter-region pings:
# North America, Europe, Asia (WonderNetwork's global ping statistics; the same order as
# cloud providers' published inter-region latency tables).
REGIONS = ("na", "eu", "asia")
REGION_SHARE = (0.4, 0.35, 0.25)
REGION_RTT_MS = ((30, 90, 160), (90, 20, 200), (160, 200, 40))

# Home broadband, (down, up) in Mbit/s with the share of homes: asymmetric cable/DSL and
# symmetric fibre. Ookla's Speedtest Global Index (2024) puts the global median fixed
# broadband at ~90 Mbit/s down, ~40 up (the mean of a fibre-heavy mix); FCC's Measuring
# Broadband America (2023) lists cable tiers at 10:1 to 20:1 down:up (e.g. 300/20) and
# DSL at 25/3 or below.
HOME_TIERS = (
    (0.20, 25.0, 3.0),  # DSL, old cable
    (0.35, 300.0, 20.0),  # cable
    (0.25, 100.0, 100.0),  # fibre, symmetric
    (0.20, 1000.0, 500.0),  # fast fibre
)
HOME_ACCESS_RTT_MS = (10.0, 30.0)  # last mile, uniform (FCC MBA 2023: 10-30 ms idle latency)
# Datacenter: 10 Gbit/s NICs, the cloud egress most providers meter at 1-10 Gbit/s
DC_RATE = 1250 * MB  # 10 Gbit/s both ways
# NAT, of home nodes: hole punching succeeds for ~70 % of NATed pairs (Halkes & Pouwelse,
# "UDP NAT and firewall puncturing in the wild", 2011; libp2p's DCUtR measurement campaign,
# 2023: ~70 % success); about a fifth of homes are directly reachable (UPnP, IPv6).
NAT_SHARE = (("open", 0.2), ("cone", 0.6), ("symmetric", 0.2))
LOSS = 0.0005  # 0.05 % packet loss on a long-haul home path (M-Lab NDT medians are below 0.1 %)
RELAY_RATE = 1 * MB  # a circuit relay's per-link rate (a volunteer's relay, shared)
TRAINER_UP = 1250 * MB  # the trainer: a datacenter uplink, 10 Gbit/s


# Churn: a home worker's sessions online and its downtimes, Weibull (shape k, scale in
# seconds). Stutzbach & Rejaie, "Understanding Churn in Peer-to-Peer Networks", IMC 2006:
# BitTorrent (Debian tracker) session lengths fit a Weibull of k = 0.38, scale 42.4 min
# (median 16 min, mean 2.8 h; Red Hat k = 0.34, 21.3 min; FlatOut k = 0.59, 41.9 min).
# Downtimes are heavy-tailed there too; lacking its fit here, the session fit is used for
# them as well (an assumption). File sharers, not staked GPU workers: a pessimistic bound.
@dataclass(frozen=True)
class Churn:
    session_shape: float = 0.38
    session_scale: float = 42.4 * 60  # seconds; inf: nobody ever leaves
    down_shape: float = 0.38
    down_scale: float = 42.4 * 60

    def session(self, rng: random.Random) -> float:
        return rng.weibullvariate(self.session_scale, self.session_shape)

    def downtime(self, rng: random.Random) -> float:
        return rng.weibullvariate(self.down_scale, self.down_shape)


CHURN = Churn()


def home_link(rng: random.Random) -> Link:
    """One home worker drawn from the distributions above."""
    _, down, up = rng.choices(HOME_TIERS, [share for share, _, _ in HOME_TIERS])[0]
    region = rng.choices(range(len(REGIONS)), REGION_SHARE)[0]
    nat = rng.choices([n for n, _ in NAT_SHARE], [s for _, s in NAT_SHARE])[0]
    rtt = rng.uniform(*HOME_ACCESS_RTT_MS) / 1000
    return Link(up=up * Mbit, down=down * Mbit, rtt=rtt, region=region, nat=nat)


def trainer_link(up: float = TRAINER_UP) -> Link:
    return Link(up=up, down=DC_RATE, rtt=0.001, region=0, nat="open")


def path_rtt(a: Link, b: Link) -> float:
    return a.rtt + b.rtt + REGION_RTT_MS[a.region][b.region] / 1000
