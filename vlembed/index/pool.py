"""Several replicas of one service, used as one: failover with exponential backoff.

A distributed indexing job must outlive a replica: a killed or restarting ``vlembed serve``
(connection refused, 502/503/504) or a full one (429) costs a retry on another replica, not
the job. The policy lives here and not in :class:`vlembed.Client` (whose own retries are turned
off for the replicas): the client retries the same URL, the pool moves on to the next one.

- Calls rotate over the replicas, so the callers of one pool spread their requests evenly.
- A replica that failed is benched for an exponentially growing time (its consecutive failures),
  and after every failure the caller waits a little longer before the next attempt
  (``base_delay * 2**attempt``, capped), so a pool whose replicas are all down is not hammered.
- A refusal (any other 4xx) is raised at once: another replica would refuse the same input.
- A replica is connected lazily (its ``/v1/models`` is read on first use) and reconnected after
  a failure, so one that is down when the pool is made is no obstacle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from vlembed.client import Client, Item
from vlembed.errors import ServiceError

_T = TypeVar("_T")

__all__ = ["ServicePool", "retryable"]


def retryable(exc: ServiceError) -> bool:
    """Whether another attempt (on another replica) may succeed: no answer, full, or 5xx."""
    return exc.status is None or exc.status == 429 or exc.status >= 500


class ServicePool:
    """Replicas of one ``vlembed serve`` behind one :meth:`embed`.

    Args:
        urls: Service roots, one per replica (repeats allowed: a replica listed twice gets
            twice the share of calls).
        api_key: Bearer token of the services.
        max_attempts: Attempts of one call, over all replicas, before it fails.
        base_delay: First wait after a failed attempt, in seconds; doubles per attempt.
        max_delay: Upper bound on one wait and on a replica's time on the bench.
        timeout: Seconds per request.
        start: Index of the replica the first call goes to (callers spread their starts).
        sleep: Called with the seconds to wait (tests pass a recorder).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        api_key: str | None = None,
        max_attempts: int = 10,
        base_delay: float = 0.25,
        max_delay: float = 10.0,
        timeout: float = 300.0,
        start: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not urls:
            raise ValueError("a service pool needs at least one URL")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.urls = [u.rstrip("/") for u in urls]
        self.api_key = api_key
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.timeout = timeout
        self._sleep = sleep
        self._next = start % len(self.urls)
        self._clients: dict[str, Client] = {}
        self._failures = dict.fromkeys(self.urls, 0)
        self._benched_until = dict.fromkeys(self.urls, 0.0)
        self.failovers = 0  # failed attempts so far (what a dead replica cost)

    def _pick(self) -> str:
        """The next replica in rotation that is not benched (or the one back soonest)."""
        now = time.monotonic()
        n = len(self.urls)
        order = [self.urls[(self._next + i) % n] for i in range(n)]
        self._next = (self._next + 1) % n
        ready = [u for u in order if self._benched_until[u] <= now]
        return ready[0] if ready else min(order, key=self._benched_until.__getitem__)

    def client(self, url: str) -> Client:
        """The connected client of one replica (made on first use)."""
        client = self._clients.get(url)
        if client is None:
            client = Client(url, api_key=self.api_key, timeout=self.timeout, max_retries=0)
            self._clients[url] = client
        return client

    def _bench(self, url: str) -> None:
        self._failures[url] += 1
        wait = min(self.max_delay, self.base_delay * 2 ** self._failures[url])
        self._benched_until[url] = time.monotonic() + wait
        client = self._clients.pop(url, None)
        if client is not None:
            client.close()

    def embed(
        self, items: Sequence[Item], *, task: str, multivector: bool = False
    ) -> list[np.ndarray]:
        """:meth:`vlembed.Client.embed` on some replica, failing over as the module says."""
        return self._on_a_replica(lambda c: c.embed(items, task=task, multivector=multivector))

    def embed_both(
        self, items: Sequence[Item], *, task: str
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`vlembed.Client.embed_both` on some replica, failing over likewise."""
        return self._on_a_replica(lambda c: c.embed_both(items, task=task))

    def _on_a_replica(self, call: Callable[[Client], _T]) -> _T:
        """``call`` with the client of a replica that is not benched, failing over.

        Raises:
            ServiceError: A replica refused the input (4xx other than 429), or no replica
                answered in ``max_attempts`` attempts (the last error is chained).
        """
        last: ServiceError | None = None
        for attempt in range(self.max_attempts):
            url = self._pick()
            try:
                result = call(self.client(url))
            except ServiceError as exc:
                if not retryable(exc):
                    raise
                last = exc
                self.failovers += 1
                self._bench(url)
                if attempt + 1 < self.max_attempts:
                    self._sleep(min(self.max_delay, self.base_delay * 2**attempt))
                continue
            self._failures[url] = 0
            return result
        raise ServiceError(
            f"no replica of {', '.join(self.urls)} answered in {self.max_attempts} attempts; "
            f"last: {last}"
        ) from last

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
