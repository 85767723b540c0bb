"""A forwarded port on the terminal: its URL here, named for what usually listens there."""

from __future__ import annotations

# what usually listens on a port, for the line that names its URL
KNOWN = {6006: "TensorBoard", 8888: "Jupyter", 8889: "Jupyter", 8265: "Ray dashboard", 5000: "MLflow",
         8080: "a web UI"}


def banner(remote: int, local: int, host: str) -> str:
    """`TensorBoard? http://127.0.0.1:6006` for a port that is usually TensorBoard's, else the plain URL."""
    name = KNOWN.get(remote)
    url = f"http://127.0.0.1:{local}"
    where = f"(localhost:{remote} on {host})"
    return f"{name}? {url}  {where}" if name else f"{url}  {where}"
