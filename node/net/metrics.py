"""Counters for the admin endpoint, rendered in the Prometheus text format."""

from __future__ import annotations

from collections import Counter


class Metrics:
    def __init__(self) -> None:
        self.counters: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        self.counters[(name, tuple(sorted(labels.items())))] += amount

    def get(self, name: str, **labels: str) -> int:
        return self.counters[(name, tuple(sorted(labels.items())))]

    def by_label(self, name: str, label: str) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (n, labels), v in self.counters.items():
            if n == name:
                out[dict(labels).get(label, "")] += v
        return dict(out)

    def render(self, gauges: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> str:
        """Prometheus text: every counter as ``intellect_<name>_total``, then the gauges."""
        lines: list[str] = []
        names = sorted({n for n, _ in self.counters})
        for name in names:
            lines.append(f"# TYPE intellect_{name}_total counter")
            for (n, labels), v in sorted(self.counters.items()):
                if n == name:
                    lines.append(f"intellect_{name}_total{_labels(labels)} {v}")
        for name, series in sorted(gauges.items()):
            lines.append(f"# TYPE intellect_{name} gauge")
            for labels, v in sorted(series.items()):
                lines.append(f"intellect_{name}{_labels(labels)} {v:g}")
        return "\n".join(lines) + "\n"


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
