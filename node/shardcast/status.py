"""What SHARDCAST reports: ``GET /weights`` (everything) and the ``weights`` section of
the node's ``/status`` (the short form), assembled from each part's typed status. The
dicts' keys are read by ``intellect-node weights``, the devnet and the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.shardcast.pulling import DownloadsStatus
from node.shardcast.serving import UploadStatus
from node.shardcast.versions import VersionsStatus


@dataclass(frozen=True)
class WeightsStatus:
    versions: VersionsStatus
    downloads: DownloadsStatus
    uploads: UploadStatus

    def view(self) -> dict[str, Any]:
        """``GET /weights``."""
        v = self.versions
        return {
            "trainer": v.trainer,
            "current": v.current,
            "newest_known": v.newest_known,
            "keep": v.keep,
            "versions": [row.as_dict() for row in v.versions],
            "downloads": self.downloads.jobs,
            "uploads": {"active": self.uploads.active, "bytes": self.uploads.bytes},
        }

    def summary(self) -> dict[str, Any]:
        """The ``weights`` section of the node's ``/status``."""
        return {
            "current": self.versions.current,
            "newest_known": self.versions.newest_known,
            "held": self.versions.held,
            "downloading": self.downloads.progress,
            "uploads_active": self.uploads.active,
            "uploaded_bytes": self.uploads.bytes,
            "downloaded_bytes": self.downloads.fetched_bytes,
        }
