"""The run manifest between nodes (SPEC §2): served, collected and fetched.

``RunManifests`` serves ``/intellect/manifest/1.0.0`` (for any run: the asker may not know
its own yet) with the manifest envelope the node holds: the trainer its own, a node that
joined the one it joined by, and a bootstrap node of a derived run id the one it collects
from the trainers it hears of (it checks the terms against its own run id, so it trusts no
one). ``find_runs`` is the joining side: it asks the bootstrap peers, under a run id of
its own, until the run it wants (or any run) answers, and refuses, one line each, the
peers whose manifest fails a check. ``choose_run`` is the pure decision of which run a
node joins. The caller (``node/cli/manifest.py``) takes the settings from the manifest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from node.net.bans import PeerBans
from node.net.host import parse_addrs
from node.net.requests import Responder
from node.net.runtime import Node
from protocol import ids
from protocol.errors import WireError
from protocol.manifest import (
    ManifestQuery,
    ManifestReply,
    RunManifest,
    is_derived_run_id,
    open_run_manifest,
)

log = logging.getLogger("intellect.node")
JOINING_RUN = "joining"  # the run id a node asks under before it knows its run
ASK_EVERY = 2.0  # seconds between rounds of asking (joining, and a bootstrap collecting)


async def ask_manifest(node: Node, peer: str) -> bytes:
    """The manifest envelope ``peer`` holds (empty: none), within the read deadline;
    ``WireError`` if its reply does not verify."""
    with trio.fail_after(node.cfg.net.read_timeout):
        reply = await node.request(
            peer, ids.MANIFEST, ManifestQuery(**node.header()), ManifestReply
        )
    return reply.manifest


class RunManifests:
    """Serves the manifest envelope this node holds (``envelope``; None: none yet)."""

    def __init__(self, node: Node, envelope: bytes | None = None) -> None:
        self.node, self.envelope = node, envelope
        self.cfg = node.cfg

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.node.serve_requests(ids.MANIFEST, ManifestQuery, self._answer)
        self.node.add_status("manifest", self.status)
        task_status.started()
        if self.envelope is None and is_derived_run_id(self.cfg.run.id):
            await self._collect()

    def status(self) -> dict[str, object]:
        return {"held": self.envelope is not None, "run": self.cfg.run.id}

    async def _answer(self, request: ManifestQuery, responder: Responder) -> None:
        reply = ManifestReply(**self.node.header(), manifest=self.envelope or b"")
        await responder.send(reply)

    async def _collect(self) -> None:
        """Until it holds one: ask the trainers it hears of for the manifest of its run."""
        refused: set[str] = set()
        while self.envelope is None:
            trainers = [
                p
                for p, r in self.node.peers.peers.items()
                if r.role == "trainer" and p not in refused
            ]
            for peer in trainers:
                try:
                    envelope = await ask_manifest(self.node, peer)
                    if not envelope:
                        continue
                    open_run_manifest(envelope, run_id=self.cfg.run.id)
                except WireError as err:
                    refused.add(peer)
                    self.node.reject(ids.MANIFEST, peer, err)
                    continue
                except Exception as exc:  # a dial or a stream failed: ask again later
                    log.debug("asking %s for the manifest failed: %r", peer[-8:], exc)
                    continue
                self.envelope = envelope
                log.info("holding the run manifest of %s from %s", self.cfg.run.id, peer[-8:])
                break
            await trio.sleep(ASK_EVERY)


@dataclass
class Found:
    """What the bootstrap peers answered: verified manifests by run id (with their
    envelopes), one line per peer refused, and the peers that know no run."""

    runs: dict[str, tuple[RunManifest, bytes]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # peer -> the line
    empty: set[str] = field(default_factory=set)
    unreachable: dict[str, str] = field(default_factory=dict)


class JoinError(ValueError):
    """No run to join: the message is the one line the node stops with."""


def choose_run(found: Found, want: str | None) -> tuple[RunManifest, bytes]:
    """The run a node joins: ``want`` (its ``--run-id``) if a peer served it; without,
    the only run found. ``JoinError`` with one line otherwise."""
    problems = "; ".join(found.refused.values())
    if want is not None:
        if want in found.runs:
            return found.runs[want]
        others = ", ".join(sorted(found.runs)) or "none"
        line = f"no bootstrap peer serves the manifest of run {want} (runs found: {others})"
        raise JoinError(line + (f"; {problems}" if problems else ""))
    if len(found.runs) == 1:
        return next(iter(found.runs.values()))
    if found.runs:
        raise JoinError(
            f"several runs found: {', '.join(sorted(found.runs))}: pick one with --run-id RUN_ID"
        )
    if problems:
        raise JoinError(f"no run to join: {problems}")
    if found.empty:
        raise JoinError(
            "the bootstrap peers know no run (no trainer with a run manifest has joined them)"
        )
    reasons = "; ".join(f"{p[-8:]}: {why}" for p, why in found.unreachable.items())
    raise JoinError(f"no bootstrap peer could be reached ({reasons or 'none given'})")


KEPT_FILE = "run-manifest.bin"  # in the data dir: the manifest a node joined by, verified


def supersedes(new: RunManifest, old: RunManifest) -> bool:
    """Whether ``new`` ends ``old``'s run: the same trainer signed other terms (a run that
    changes is a new run), later than it signed ``old`` (an old manifest replayed does not
    end the run that replaced it)."""
    return new.terms.trainer == old.terms.trainer and new.run_id != old.run_id and new.seq > old.seq


def newest_successor(
    runs: dict[str, tuple[RunManifest, bytes]], old: RunManifest
) -> tuple[RunManifest, bytes] | None:
    """The latest-signed manifest among ``runs`` that ``supersedes`` ``old``, if any."""
    later = [r for r in runs.values() if supersedes(r[0], old)]
    return max(later, key=lambda r: r[0].seq) if later else None


@dataclass
class Choice:
    """The run a node joins, its envelope, and a line to print (None: nothing to say)."""

    manifest: RunManifest
    envelope: bytes
    note: str | None = None


def choose_with_kept(
    found: Found, want: str | None, kept: tuple[RunManifest, bytes] | None
) -> Choice:
    """``choose_run`` for a node that holds the manifest it joined by before (``kept``):
    without ``want`` that run is the one it wants, unless its trainer signed a newer run
    (which it joins, with a line); the kept manifest is used, with a line, when no peer
    serves that run now. A ``want`` of another run than the kept one is ``choose_run``'s."""
    if kept is None or (want is not None and want != kept[0].run_id):
        return Choice(*choose_run(found, want))
    old = kept[0]
    if want is None and (newer := newest_successor(found.runs, old)) is not None:
        line = (
            f"the trainer of run {old.run_id} signed a new run, {newer[0].run_id} (a run that "
            "changes is a new run): joining it"
        )
        return Choice(*newer, line)
    if old.run_id in found.runs:
        return Choice(*found.runs[old.run_id])
    others = sorted(set(found.runs) - {old.run_id})
    line = (
        f"no bootstrap peer serves run {old.run_id}'s manifest now: using the one this node "
        f"verified before ({KEPT_FILE})"
    )
    if others:
        line += f"; they serve {', '.join(others)} (--run-id RUN_ID joins another)"
    return Choice(*kept, line)


async def find_runs(
    node: Node,
    bootstrap: list[str],
    *,
    want: str | None,
    patience: float,
    bans: PeerBans | None = None,
) -> Found:
    """Ask every peer of ``bootstrap`` (multiaddrs) for its manifest, every ``ASK_EVERY``
    seconds, until ``want`` is among the runs found (without ``want``: until any run is),
    every peer was refused, or ``patience`` seconds have passed. ``node`` serves under a
    run id of its own, with no bootstrap peers of its own, so it greets no one. A peer
    ``bans`` holds is not asked; one that serves a manifest failing its check is banned
    there (and refused)."""
    found = Found()
    bans = bans if bans is not None else PeerBans()
    infos = [info_from_p2p_addr(a) for a in parse_addrs(bootstrap)]
    for info in infos:
        peer = info.peer_id.to_base58()
        ban = bans.banned(peer, time.time())
        if ban is not None:
            found.refused[peer] = f"peer {peer} is banned: {ban.reason}"
    with trio.move_on_after(patience):
        while True:
            for info in infos:
                peer = info.peer_id.to_base58()
                if peer in found.refused:
                    continue
                await _ask(node, info, found, bans)
            if (want in found.runs) if want is not None else bool(found.runs):
                break
            if all(i.peer_id.to_base58() in found.refused for i in infos):
                break  # every peer served a manifest that failed its check
            await trio.sleep(ASK_EVERY)
    return found


async def _ask(node: Node, info: PeerInfo, found: Found, bans: PeerBans) -> None:
    peer = info.peer_id.to_base58()
    try:
        if peer not in node.connected_peers():
            await node.connect(info)
        envelope = await ask_manifest(node, peer)
    except WireError as err:  # its reply did not verify
        found.refused[peer] = f"peer {peer} refused: {err}"
        return
    except Exception as exc:  # not reachable (yet), or it does not serve the protocol
        found.unreachable[peer] = " ".join(str(exc).split()) or type(exc).__name__
        return
    found.unreachable.pop(peer, None)
    if not envelope:
        found.empty.add(peer)
        return
    try:
        manifest = open_run_manifest(envelope)
    except WireError as err:
        line = f"peer {peer} served a manifest that fails its check: {err}"
        found.refused[peer] = line + " (banned)"
        bans.ban(peer, f"served a manifest that fails its check: {err}", time.time())
        node.reject(ids.MANIFEST, peer, err)
        return
    found.empty.discard(peer)
    found.runs[manifest.run_id] = (manifest, envelope)


WATCH_EVERY = 10.0  # seconds between a joined node's looks for a new run of its trainer


class RunWatch:
    """A joined node's watch for the end of its run (SPEC §2: a run that changes is a new
    run). Every ``every`` seconds it asks its run's trainer and its bootstrap peers
    (``bootstrap``: multiaddrs) for the manifest they serve; the first one that verifies
    and ``supersedes`` the manifest the node joined by (``held``) is handed to ``on_new``,
    once, and the watch ends. A peer the node has banned is not asked; one whose manifest
    fails its check is refused (counted, not banned: it may only be behind)."""

    def __init__(
        self,
        node: Node,
        held: RunManifest,
        bootstrap: list[str],
        on_new: Callable[[RunManifest, bytes], None],
        *,
        bans: PeerBans | None = None,
        every: float = WATCH_EVERY,
    ) -> None:
        self.node, self.held, self.on_new, self.every = node, held, on_new, every
        self.bans = bans if bans is not None else PeerBans()
        self.infos = [info_from_p2p_addr(a) for a in parse_addrs(bootstrap)]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.every)
            for peer, info in self._peers().items():
                if self.bans.banned(peer, time.time()) is not None:
                    continue
                new = await self._ask(peer, info)
                if new is not None:
                    self.on_new(*new)
                    return

    def _peers(self) -> dict[str, PeerInfo | None]:
        peers: dict[str, PeerInfo | None] = {i.peer_id.to_base58(): i for i in self.infos}
        peers.setdefault(self.held.terms.trainer, None)  # at the addresses it announced
        peers.pop(self.node.peer_id, None)
        return peers

    async def _ask(self, peer: str, info: PeerInfo | None) -> tuple[RunManifest, bytes] | None:
        try:
            if info is not None and peer not in self.node.connected_peers():
                await self.node.connect(info)
            envelope = await ask_manifest(self.node, peer)
            if not envelope:
                return None
            manifest = open_run_manifest(envelope)
        except WireError as err:
            self.node.reject(ids.MANIFEST, peer, err)
            return None
        except Exception as exc:  # not reachable now (a trainer restarting): next round
            log.debug("asking %s for its manifest failed: %r", peer[-8:], exc)
            return None
        return (manifest, envelope) if supersedes(manifest, self.held) else None


def new_run_line(old: RunManifest, new: RunManifest) -> str:
    """The one line a node of ``old``'s run says when its trainer signed ``new``."""
    return (
        f"the trainer of run {old.run_id} signed a new run, {new.run_id} (a run that changes "
        f"is a new run): this node takes no more of {old.run_id}'s work and stops; start it "
        "again (the same command) to join the new run"
    )
