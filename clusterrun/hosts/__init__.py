"""The controller's side of the host program: the client (install, push, start, follow, stop), the wire
format, the push manifest, following a host's logs, and the one fan-out over hosts."""
