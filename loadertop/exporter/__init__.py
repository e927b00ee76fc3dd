"""`loadertop export`: every discovered source as Prometheus metrics (docs/contract.md §8), and as
TensorBoard scalars (§11).

A headless viewer — the same Subscriber and Model as the TUI — whose receive loop advances the
model once a second and publishes the immutable `Document`. `DocumentMetrics.walk` maps a document to
the series of docs/contract.md §8, once: into prometheus_client's metric families (`collector.py`), and
into the scrape's text, written by prometheus_client per series and kept (`exposition.py`);
the HTTP server (`server.py`) serves it on its own threads. Nothing is shared but that one
reference, so a slow scrape never holds up receiving, and a scrape never sees a half-advanced
model.

`--tensorboard DIR` (`tensorboard.py`) reads the same reference on a thread of its own and writes
each source's tracker keys (`client.tracker_keys`) as TensorBoard scalars, in TensorBoard's
event-file format written by hand (`event_file.py`).

No torch; `prometheus_client` is imported only by `loadertop export` (not by `loadertop --help`).
"""

DEFAULT_LISTEN = "127.0.0.1:9464"  # 9464: the port OpenTelemetry's Prometheus exporter uses too
