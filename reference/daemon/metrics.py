"""Prometheus metrics (§10): the cm_daemon_* families, one registry per daemon."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from reference.core.outbox import STATES


class DaemonMetrics:
    """Counters the daemon bumps, plus gauges read from the stores at scrape time."""

    def __init__(self, outbox: Any = None, link: Any = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.counters = {
            "send_total": Counter("cm_daemon_send_total", "send frames dispatched to the broker", registry=r),
            "recv_total": Counter("cm_daemon_recv_total", "inbound messages received", registry=r),
            "reconnects_total": Counter("cm_daemon_reconnects_total", "broker reconnects", registry=r),
            "invalid_inbound_total": Counter("cm_daemon_invalid_inbound_total",
                                             "inbound frames quarantined (E-41)", registry=r),
            "link_restarts_total": Counter("cm_daemon_link_restarts_total",
                                           "broker-link failures the link was restarted after (E-41)", registry=r),
            "dedupe_history_pruned_total": Counter(
                "cm_daemon_dedupe_history_pruned_total", "200 duplicates whose history was pruned", registry=r),
        }
        self.dedupe = Counter("cm_daemon_dedupe_total", "deduplicated messages", ["direction"], registry=r)
        self.connected = Gauge("cm_daemon_connected", "1 while the broker link is open", registry=r)
        self.requests = Counter("cm_daemon_ipc_request_total", "IPC requests", ["endpoint", "status", "transport"],
                                registry=r)
        self.duration = Histogram("cm_daemon_ipc_duration_seconds", "IPC request duration", ["endpoint"], registry=r)
        self.hook_invocations = Counter("cm_daemon_hook_invocations_total", "hook runs finished, by their state",
                                        ["hook", "state"], registry=r)
        self.hook_duration = Histogram("cm_daemon_hook_duration_seconds", "how long a hook's process ran", ["hook"],
                                       buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 3600), registry=r)
        self.hook_unenforceable = Counter(
            "cm_daemon_hook_unenforceable_total", "hook runs whose network_policy deny could not be enforced",
            ["hook", "reason"], registry=r)
        self.hook_capability_calls = Counter(
            "cm_daemon_hook_capability_calls_total", "requests made with a hook's capability token, by the scope that "
            "granted each (none: refused)", ["hook", "scope"], registry=r)
        self._ipc_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.outbox = outbox
        self.link = link
        r.register(_StoreCollector(self))

    def record(self, name: str, value: float | None = None, **labels: str) -> None:
        """Bump a counter (or set the connected gauge)."""
        if name == "connected":
            self.connected.set(value or 0)
        elif name == "dedupe_total":
            self.dedupe.labels(**labels).inc()
        else:
            self.counters[name].inc(value or 1)

    def ipc(self, endpoint: str, status: str, transport: str, seconds: float) -> None:
        # Every request lands here: the labelled children are looked up once per label set, not on each call.
        key = (endpoint, status, transport)
        children = self._ipc_children.get(key)
        if children is None:
            children = self._ipc_children.setdefault(
                key, (self.requests.labels(endpoint, status, transport), self.duration.labels(endpoint)))
        children[0].inc()
        children[1].observe(seconds)

    def hook(self, hook: str, state: str, seconds: float | None) -> None:
        """A hook run finished (done, failed or timed_out); ``seconds`` is None when no process ran."""
        self.hook_invocations.labels(hook, state).inc()
        if seconds is not None:
            self.hook_duration.labels(hook).observe(seconds)

    def unenforceable(self, hook: str, reason: str) -> None:
        """A hook ran without the isolation its hooks.toml asks for (§6.3)."""
        self.hook_unenforceable.labels(hook, reason).inc()

    def capability_call(self, hook: str, scope: str) -> None:
        """A request made with a hook's capability token: granted by ``scope``, or refused (``none``, E-50)."""
        self.hook_capability_calls.labels(hook, scope).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StoreCollector:
    def __init__(self, metrics: DaemonMetrics):
        self.metrics = metrics

    def collect(self):
        depth = GaugeMetricFamily("cm_daemon_outbox_depth", "outbox rows by status", labels=["status"])
        if self.metrics.outbox is not None:
            counts = self.metrics.outbox.counts()
            for status in STATES:
                depth.add_metric([status], counts.get(status, 0))
        yield depth
        if self.metrics.link is not None and self.metrics.link.state.lag_ms is not None:
            lag = self.metrics.link.state.lag_ms
            yield GaugeMetricFamily("cm_daemon_lag_ms", "ack round trip of the last send", value=lag)
