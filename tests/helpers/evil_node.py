"""A malicious node for tests: the real binary with its SHARDCAST service subverted.

    python -m tests.helpers.evil_node start ...   (the same flags as ``intellect-node start``)

It joins, follows and downloads like an honest node (so it holds real shards and the
trainer's real manifests), then, in the modes named by ``EVIL`` (comma-separated):
- ``corrupt``: every shard it uploads has its first byte of each frame flipped;
- ``manifests``: ``POST /evil/notices`` makes it announce versions 50-53 and a garbage
  notice; asked for those versions it serves a manifest signed by its own key (50), one
  whose encoding is above the size limit (51), one whose files do not add up (52), and
  the trainer's genuine but old manifest of the newest version it holds (53: a replay).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import msgpack

from crypto.envelope import Envelope
from node.shardcast import service as svc
from protocol.shardcast import (
    MANIFEST_MAX,
    WEIGHTS_TOPIC,
    WeightFile,
    WeightManifest,
    WeightsHolding,
    WeightsNotice,
    encode_notice,
    manifest_id,
)
from protocol.wire import seal

MODES = set(filter(None, os.environ.get("EVIL", "").split(",")))
Honest = svc.WeightService


def _signed_payload(service: Any, payload: bytes) -> bytes:
    env = Envelope.seal(service.node.identity, WeightManifest.TYPE, payload)
    data: bytes = msgpack.packb(
        {"d": WeightManifest.TYPE, "p": payload, "k": env.signer, "s": env.signature},
        use_bin_type=True,
    )
    return data


def crafted(service: Any, version: int) -> bytes:
    genuine_version = max(service.store.complete)
    genuine = service.store.complete[genuine_version]
    m = genuine.manifest
    fields = {k: getattr(m, k) for k in m.specs()}
    fields.update(service.node.header(), version=version)
    if version == 50:  # forged: a well-formed manifest under the wrong key
        return seal(service.node.identity, WeightManifest(**fields))
    if version == 51:  # oversized: signed, but its encoding is above the limit
        obj = WeightManifest(**fields).to_obj()
        pad = MANIFEST_MAX
        while True:  # 20 bytes above the limit, so the envelope itself still fits
            obj["shard_hashes"] = b"\x00" * pad
            payload = msgpack.packb({"type": WeightManifest.TYPE, **obj}, use_bin_type=True)
            if len(payload) == MANIFEST_MAX + 20:
                return _signed_payload(service, payload)
            pad += MANIFEST_MAX + 20 - len(payload)
    if version == 52:  # does not add up: a file 1 byte longer than the shards cover
        obj = WeightManifest(**fields).to_obj()
        last = obj["files"][-1]
        obj["files"][-1] = WeightFile(
            name=last["name"], size=last["size"] + 1, offset=last["offset"]
        ).to_obj()
        payload = msgpack.packb({"type": WeightManifest.TYPE, **obj}, use_bin_type=True)
        return _signed_payload(service, payload)
    return genuine.envelope  # 53: the trainer's real manifest of an older version


class EvilService(Honest):  # type: ignore[misc, valid-type]
    def read_shard_bytes(self, src: Any, index: int, offset: int, n: int) -> bytes:
        data = super().read_shard_bytes(src, index, offset, n)
        if "corrupt" in MODES:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    async def _on_query(self, req: Any, r: Any) -> None:
        if "manifests" in MODES and 50 <= req.version <= 53:
            env = crafted(self, req.version)
            await r.send(
                WeightsHolding(**self.node.header(), version=req.version, manifest=env, have=b"")
            )
            return
        await super()._on_query(req, r)

    def admin_routes(self) -> dict[tuple[str, str], Any]:
        routes: dict[tuple[str, str], Any] = super().admin_routes()

        async def notices(_args: dict[str, Any]) -> Any:
            self.node.announce(WEIGHTS_TOPIC, b"\xc1 not a notice")
            for v in (50, 51, 52, 53):
                body = WeightsNotice(version=v, step=v, manifest=manifest_id(crafted(self, v)))
                self.node.announce(WEIGHTS_TOPIC, encode_notice(body))
            return {"announced": 5}

        routes[("POST", "/evil/notices")] = notices
        return routes


svc.WeightService = EvilService

if __name__ == "__main__":
    from node.cli import main

    sys.exit(main(sys.argv[1:]))
