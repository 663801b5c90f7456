"""The served model's Prometheus metrics, for ``GET /metrics`` on the HTTP port.

Written with ``prometheus_client``: a collector reads the service's counters
and its batcher's histograms when Prometheus scrapes, so that serving a step
costs nothing for them beyond the batcher's histograms, which it updates
once per batch. The families (every
name starts with ``fastln_serve_``):

==============================  =========  ==========================================
``model_info``                  info       the model: class, sizes, dtype, fingerprint
``streams``                     gauge      streams held
``capacity``                    gauge      streams held at most (``--capacity``)
``connections``                 gauge      WebSocket connections open
``steps_in_flight``             gauge      steps taken and not yet answered
``draining``                    gauge      1 while the server stops (SIGTERM)
``steps_total``                 counter    steps answered
``batches_total``               counter    batches run (one ``StreamTable.step`` each)
``rejections_total``            counter    refusals, by ``reason`` (errors.REASON_NAMES)
``evictions_total``             counter    streams the server ended, by ``reason``
``checkpoints_total``           counter    checkpoint writes, by ``result`` (ok, failed)
``checkpoint_streams_total``    counter    stream checkpoints written
``checkpoint_seconds_total``    counter    seconds in checkpoint writes that succeeded
``checkpoint_age_seconds``      gauge      since the last checkpoint write that succeeded
``store_up``                    gauge      1 while the checkpoint store answers
``takeovers_total``             counter    streams taken over from the store
``rewinds_total``               counter    reconnects that lost replies, rewound to a checkpoint
``batch_size``                  histogram  steps per batch
``queue_delay_seconds``         histogram  a step's wait from its arrival to its batch
``step_latency_seconds``        histogram  from a step's arrival to its batch's result
==============================  =========  ==========================================

and prometheus_client's ``process_*`` families (CPU seconds, memory, open
files) of the server's process.
"""
import time

from .extra import needs_extra

with needs_extra(__name__):
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        ProcessCollector,
        generate_latest,
    )
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
    )

PREFIX = "fastln_serve_"
CONTENT_TYPE = CONTENT_TYPE_LATEST


def _buckets(bounds, counts):
    """prometheus_client's buckets, [(le, cumulative count), ..., ("+Inf", total)],
    of the per-bucket counts of bounds (one more count, above the last bound)."""
    out, total = [], 0
    for le, n in zip([*map(str, bounds), "+Inf"], counts):
        total += n
        out.append((le, total))
    return out


def _histogram(name, doc, hist):
    """A histogram family of a StreamBatcher.metrics() histogram dict."""
    return HistogramMetricFamily(PREFIX + name, doc, buckets=_buckets(hist["le"], hist["counts"]),
                                 sum_value=hist["sum"])


def _batch_sizes(max_batch, sizes):
    """Bucket bounds 1, 2, 4, ... up to max_batch, and the per-bucket counts of
    the {size: batches} dict."""
    bounds = [1]
    while bounds[-1] < max_batch:
        bounds.append(min(2 * bounds[-1], max_batch))
    counts = [0] * (len(bounds) + 1)
    for size, n in sizes.items():
        counts[next((i for i, b in enumerate(bounds) if size <= b), len(bounds))] += n
    return bounds, counts


class ServiceCollector:
    """Yields the service's metric families (see the module's docstring) when
    the registry collects."""

    def __init__(self, service):
        self.service = service

    def collect(self):
        svc = self.service
        m = svc.batcher.metrics()
        info = InfoMetricFamily(PREFIX + "model", "The served model")
        info.add_metric([], {**{k: str(v) for k, v in svc.config.items()},
                             "fingerprint": svc.fingerprint})
        yield info
        for name, doc, value in (
                ("streams", "Streams held", len(svc.streams)),
                ("capacity", "Streams held at most (--capacity)", svc.table.capacity),
                ("connections", "WebSocket connections open", svc.connections),
                ("steps_in_flight", "Steps taken and not yet answered", svc.inflight),
                ("draining", "1 while the server stops", int(svc.draining))):
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        yield CounterMetricFamily(PREFIX + "steps", "Steps answered", value=svc.steps)
        yield CounterMetricFamily(PREFIX + "batches", "Batches run", value=m["batches"])
        for name, doc, counts in (
                ("rejections", "Refused connections, frames and requests, by reason",
                 svc.rejections),
                ("evictions", "Streams the server ended, by reason", svc.evictions)):
            family = CounterMetricFamily(PREFIX + name, doc, labels=["reason"])
            for reason, n in counts.items():
                family.add_metric([reason], n)
            yield family
        if svc.checkpointer is not None:
            yield from _checkpoint_families(svc.checkpointer)
        bounds, counts = _batch_sizes(svc.batcher.max_batch, m["batch_sizes"])
        yield HistogramMetricFamily(PREFIX + "batch_size", "Steps per batch",
                                    buckets=_buckets(bounds, counts), sum_value=m["steps"])
        yield _histogram("queue_delay_seconds", "A step's wait from its arrival to its batch",
                         m["queue_delay_histogram"])
        yield _histogram("step_latency_seconds", "From a step's arrival to its batch's result",
                         m["latency_histogram"])


def _checkpoint_families(ck):
    """The families of a server with a checkpoint store (fastln.serve.checkpoint)."""
    family = CounterMetricFamily(PREFIX + "checkpoints", "Checkpoint writes, by result",
                                 labels=["result"])
    for result, n in ck.count.items():
        family.add_metric([result], n)
    yield family
    yield CounterMetricFamily(PREFIX + "checkpoint_streams", "Stream checkpoints written",
                              value=ck.written)
    yield CounterMetricFamily(PREFIX + "checkpoint_seconds",
                              "Seconds spent in checkpoint writes that succeeded",
                              value=ck.seconds)
    age = float("nan") if ck.last_ok is None else time.monotonic() - ck.last_ok
    yield GaugeMetricFamily(PREFIX + "checkpoint_age_seconds",
                            "Seconds since the last checkpoint write that succeeded", value=age)
    yield GaugeMetricFamily(PREFIX + "store_up",
                            "1 while the checkpoint store answers (its last write succeeded)",
                            value=int(ck.error is None))
    yield CounterMetricFamily(PREFIX + "takeovers", "Streams taken over from the store",
                              value=ck.takeovers)
    yield CounterMetricFamily(PREFIX + "rewinds",
                              "Reconnects that lost replies, rewound to the stream's checkpoint",
                              value=ck.rewinds)


def registry_of(service):
    """A registry of the service's families and the process's."""
    registry = CollectorRegistry()
    registry.register(ServiceCollector(service))
    ProcessCollector(registry=registry)
    return registry


def exposition(registry):
    """The registry's metrics in Prometheus's text format (bytes)."""
    return generate_latest(registry)
