"""`meshtrace generate`: simulate many daemons and their brokers on the sans-IO core and write the trace as Parquet.

Theory of operation. The daemons are grouped into meshes of ``mesh_size``; each mesh has its own broker node and is
simulated independently (its own seeded random source), so a trace depends on the parameters and the seed only,
never on how many worker processes ran it. Worker ``w`` simulates meshes ``w, w + W, ...`` one after the other, into
one sink (``_sim_trace``) and with one memoised core (``_sim_core``).

A mesh (``MeshSim``) is put together from its parts: its members and ids (``_sim_mesh``), the faults it meets
(``_sim_faults``), the calendar that orders and numbers its events (``_sim_calendar``), its daemons' outboxes
(``_sim_outbox``), its broker (``_sim_broker``), the story each send plays out (``_sim_stories``) and the injected
violations (``_sim_inject``). Each daemon starts sends at random intervals while it runs; a mesh stops after its share
of ``--events`` or of ``--keys``.

Injections (``--inject KIND``) replace one eligible story of a mesh by a hand-played happy path that breaks exactly
one invariant (see ``catalogue.INJECTIONS``); the manifest lists each one with the key a checker must report.
"""

from __future__ import annotations

import gc
import heapq
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._sim_broker import Broker
from ._sim_calendar import SLOT_SHIFT, Calendar
from ._sim_core import Core
from ._sim_faults import FaultRates
from ._sim_inject import Injection, Injector
from ._sim_mesh import T0_MS, Mesh
from ._sim_outbox import Outbox
from ._sim_stories import Stories
from ._sim_trace import AD, KIND_NAMES, Codes, Sink
from .catalogue import DEFAULT_REDELIVERY_GRACE_MS, INJECTIONS
from .format import DEFAULT_BUCKETS


@dataclass(frozen=True)
class Params:
    """What a generated trace depends on."""

    events: int
    daemons: int
    keys: int | None = None
    seed: int = 0
    fault_rate: float = 0.05
    inject: tuple[str, ...] = ()
    buckets: int = DEFAULT_BUCKETS
    mesh_size: int = 8
    send_interval_ms: int = 1_000
    hot_fraction: float = 0.002
    flush_events: int = 1_000_000
    redelivery_grace_ms: int = DEFAULT_REDELIVERY_GRACE_MS

    def __post_init__(self) -> None:
        problems = [f"{name} must be at least {low} (got {getattr(self, name)})"
                    for name, low in (("events", 1), ("daemons", 1), ("buckets", 1), ("mesh_size", 1),
                                      ("send_interval_ms", 1), ("flush_events", 1), ("redelivery_grace_ms", 0))
                    if getattr(self, name) < low]
        if self.keys is not None and self.keys < 1:
            problems.append(f"keys must be at least 1 (got {self.keys})")
        problems += [f"{name} must be between 0 and 1 (got {getattr(self, name)})"
                     for name in ("fault_rate", "hot_fraction") if not 0.0 <= getattr(self, name) <= 1.0]
        if problems:
            raise ValueError("; ".join(problems))

    def meshes(self) -> int:
        return max(1, math.ceil(self.daemons / self.mesh_size))

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "inject": list(self.inject)}


class MeshSim:
    """Simulates one mesh and streams its events into a ``Sink``."""

    def __init__(self, params: Params, index: int, daemon_count: int, budget: int, story_budget: int,
                 injections: Sequence[str], hot_posts: int, sink: Sink, core: Core):
        rates = FaultRates.at(params.fault_rate, params.send_interval_ms)
        self.params = params
        self.story_budget = story_budget
        self.mesh = mesh = Mesh(params, index, daemon_count, sink, rates)
        self.calendar = calendar = Calendar(sink, mesh.base_node, mesh.nodes, budget, params.flush_events)
        mesh.announce_link_drops(calendar.push)
        outbox = Outbox(mesh, calendar, core, sink.codes)
        broker = Broker(mesh, calendar, core, sink.codes, rates)
        self.injector = Injector(mesh, calendar, core, outbox, broker, list(injections))
        self.stories = Stories(mesh, calendar, core, rates, outbox, broker, self.injector, hot_posts, budget)

    @property
    def emitted(self) -> int:
        return self.calendar.emitted

    @property
    def injections(self) -> list[Injection]:
        return self.injector.injections

    def run(self) -> None:
        """Start each daemon's sends at random intervals (none while it is down) until the budget is spent."""
        mesh, calendar, stories = self.mesh, self.calendar, self.stories
        daemons = mesh.daemons
        rnd = mesh.rnd
        sends: list[tuple[int, int]] = []
        interval = self.params.send_interval_ms
        for d in daemons:
            heapq.heappush(sends, (T0_MS + int(rnd() * interval), d.index))
        spent = False
        expovariate = mesh.rng.expovariate
        while sends and stories.started < self.story_budget:
            t, d = heapq.heappop(sends)
            for other in daemons:  # outages (and their SSE events) are drawn before the calendar passes them
                other.outages.covering(t)
            if not calendar.advance(t >> SLOT_SHIFT):
                spent = True
                break
            daemon = daemons[d]
            up = daemon.outages.up(t)
            if up != t:
                heapq.heappush(sends, (up + int(rnd() * interval), d))
                continue
            stories.start_send(daemon, t)
            heapq.heappush(sends, (t + 1 + int(expovariate(1.0 / interval)), d))
        if not spent:
            calendar.advance(1 << 62)
        self.injector.finish()


# --- workers and the entry point --------------------------------------------------------------------------------

def _split(total: int, weights: Sequence[int]) -> list[int]:
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    for k in range(total - sum(shares)):
        shares[k % len(shares)] += 1
    return shares


def _plan(p: Params) -> list[dict[str, Any]]:
    meshes = p.meshes()
    sizes = [min(p.mesh_size, p.daemons - m * p.mesh_size) for m in range(meshes)]
    budgets = _split(p.events, sizes)
    stories = _split(p.keys if p.keys is not None else p.events, sizes)
    injections: list[list[str]] = [[] for _ in range(meshes)]
    for k, kind in enumerate(p.inject):
        injections[k % meshes].append(kind)
    hot = int(p.hot_fraction * p.events / 2)
    return [{"index": m, "daemons": sizes[m], "budget": budgets[m], "stories": stories[m],
             "injections": injections[m], "hot_posts": hot if m == 0 and hot >= 16 else 0} for m in range(meshes)]


def _run_worker(args: tuple[Params, str, int, list[dict[str, Any]]]) -> dict[str, Any]:
    params, root, worker, plans = args
    collecting = gc.isenabled()
    gc.disable()  # millions of live tuples and no reference cycles worth collecting: the scans only cost time
    try:
        return _simulate(params, root, worker, plans)
    finally:
        if collecting:
            gc.enable()


def _simulate(params: Params, root: str, worker: int, plans: list[dict[str, Any]]) -> dict[str, Any]:
    sink = Sink(Path(root), params.buckets, worker, Codes())
    core = Core()
    injections: list[dict[str, Any]] = []
    events = 0
    for plan in plans:
        sim = MeshSim(params, plan["index"], plan["daemons"], plan["budget"], plan["stories"], plan["injections"],
                      plan["hot_posts"], sink, core)
        sim.run()
        events += sim.emitted
        for injection in sim.injections:
            injections.append({"kind": injection.kind, "invariant": injection.invariant, "key": injection.key,
                               "realised": injection.realised, "mesh": plan["index"]})
    sink.close()
    return {"events": events, "by_kind": sink.by_kind, "injections": injections, "written": sink.written}


def generate(out: Path, params: Params, workers: int | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Generate a trace into ``out`` (``out/events/bucket=NN/*.parquet`` and ``out/manifest.json``)."""
    unknown = [k for k in params.inject if k not in INJECTIONS]
    if unknown:
        raise ValueError(f"unknown injection kind(s) {unknown}; known: {', '.join(INJECTIONS)}")
    started = time.monotonic()
    root = out / "events"
    if root.exists() and any(root.rglob("*.parquet")):
        raise FileExistsError(f"{root} already holds a trace")
    root.mkdir(parents=True, exist_ok=True)
    plans = _plan(params)
    workers = max(1, min(workers or os.cpu_count() or 1, len(plans)))
    jobs = [(params, str(root), w, [plan for plan in plans if plan["index"] % workers == w]) for w in range(workers)]
    if workers == 1:
        results = [_run_worker(jobs[0])]
    else:
        context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
        with context.Pool(workers) as pool:
            results = pool.map(_run_worker, jobs)
    by_kind = [sum(r["by_kind"][k] for r in results) for k in range(len(KIND_NAMES))]
    injections = sorted((i for r in results for i in r["injections"]), key=lambda i: (i["mesh"], i["kind"]))
    manifest = {
        "format": "meshtrace/1",
        "params": params.as_dict(),
        "workers": workers,
        "events": sum(r["events"] for r in results),
        "by_kind": dict(zip(KIND_NAMES, by_kind, strict=True)),
        "sources": sorted({"daemon"} | ({"broker"} if any(by_kind[AD:]) else set())),
        "meshes": len(plans),
        "buckets": params.buckets,
        "injections": [i for i in injections if i["realised"]],
        "dropped_injections": [i for i in injections if not i["realised"]],
        "seconds": round(time.monotonic() - started, 3),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if progress is not None:
        progress(f"{manifest['events']} events in {manifest['seconds']} s")
    return manifest
