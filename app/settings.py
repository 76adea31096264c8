"""Service settings from the environment (COMMPLAN_*), read once at start-up. docs/hardening.md lists them
with how each default was measured."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Settings:
    max_body_bytes: int = 8 * 2**20  # 413 above this
    max_batch: int = 2000  # plan requests per POST /v1/plan/batch
    max_devices: int = 131_072  # devices in one cluster
    max_verify_elements: int = 1 << 24  # num_ranks x count for POST /v1/collectives/verify
    max_price_transfers: int = 1 << 22  # ranks x concurrent groups for POST /v1/collectives/price
    # cost budgets (app/limits.py: what a unit is and how the defaults were measured)
    max_work: int = 1 << 27  # estimated work units of one plan / price / explore request
    max_batch_work: int = 1 << 29  # estimated work units of one batch, all its plans together
    max_router_pairs: int = 1 << 16  # num_nodes^2 of a torus / dragonfly / hypercube (256 routers)
    max_response_bytes: int = 64 * 2**20  # a batch's JSON response
    max_search_layouts: int = 2_000_000  # layouts one POST /v1/search may enumerate (planner/search/engine.py)
    max_serve_candidates: int = 2000  # deployments one POST /v1/serve/search may plan (planner/serving/search.py)
    # time
    deadline_s: float = 15.0  # per request's work; past it the work is stopped and the answer is a 503
    queue_s: float = 10.0  # longest wait for a work slot before a 503 with Retry-After
    work_slots: int = max(os.cpu_count() or 1, 1)  # requests computing at once per worker process
    # thread mode: of the requests holding a work slot, how many run their thread at once (app/threads.py Gate);
    # the rest wait on the event loop, holding no GIL, under their deadline. A thread computing pure Python holds
    # the GIL against the event loop; with nine at once /healthz had a p99 of 0.34-0.55 s (docs/hardening.md)
    compute_threads: int = min(max(os.cpu_count() or 1, 1), 2)
    body_timeout_s: float = 10.0  # the whole body must arrive within this (408 otherwise)
    header_timeout_s: float = 10.0  # a connection's request line and headers must arrive within this
    keep_alive_s: float = 5.0  # idle keep-alive connections are closed after this
    max_connections: int = 512  # open connections + tasks per worker before uvicorn answers 503
    # where a heavy request computes (app/runner.py, docs/hardening.md): 0 a thread of the server's process, which
    # shares the GIL with the event loop (the library default: tests, an app embedded in-process); 1 a long-lived
    # worker process of a pool, the work sent by value (`commplan serve`'s default on Linux: app/cli.py); 2 a
    # process forked for each request (memory always given back; 40-100 ms more per request, caches lost)
    work_in_process: int = 0
    # process mode: how many requests compute at once, each in its own process (app/threads.py's gate; the pool
    # forks this many workers at start-up); the others wait on the event loop, under their deadline. More processes
    # than CPUs compute no faster and take CPU time from the event loop: 9 at once gave /healthz a p99 of 0.14-0.22
    # s at load 7-8 against ... with the gate (docs/hardening.md)
    worker_processes: int = max(os.cpu_count() or 1, 1)
    # a pool worker retires after this many requests, or once its resident size has grown this much since its fork
    worker_requests: int = 1000
    worker_growth_mib: int = 300
    # the GIL switch interval (CPython's sys.setswitchinterval; its default 5 ms). A thread waiting for the GIL
    # asks the holder to drop it after this long (Python/ceval_gil.c, take_gil), so the event loop waits up to
    # one interval per work thread at each await: with eight heavy plans in flight, 5 ms gave /healthz a p99
    # of 174-322 ms and 1 ms 48-59 ms, the plans' own times unchanged (docs/hardening.md)
    switch_interval_s: float = 0.001

    def __post_init__(self) -> None:
        if not 1e-5 <= self.switch_interval_s <= 0.1:  # sys.setswitchinterval needs > 0; 0.1 s would starve /healthz
            raise ValueError(f"COMMPLAN_SWITCH_INTERVAL_S {self.switch_interval_s} is outside 1e-05..0.1 seconds")
        if self.work_in_process not in (0, 1, 2):
            raise ValueError(f"COMMPLAN_WORK_IN_PROCESS {self.work_in_process} is not 0, 1 or 2")
        if min(self.worker_processes, self.worker_requests, self.worker_growth_mib) < 1:
            raise ValueError("COMMPLAN_WORKER_PROCESSES, _REQUESTS and _GROWTH_MIB must each be at least 1")
        if self.compute_threads < 1:
            raise ValueError(f"COMMPLAN_COMPUTE_THREADS {self.compute_threads} is under 1")

    @classmethod
    def from_env(cls) -> Settings:
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"COMMPLAN_{f.name.upper()}")
            if raw is not None:
                values[f.name] = float(raw) if f.type == "float" else int(raw)
        return cls(**values)
