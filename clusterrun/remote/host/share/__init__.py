"""Sharing a host with other people's runs: claims on its slots and GPUs (claims.py, and the `claims`
command that lists them; folder.py: the folder's files, read and locked against other users), the GPUs it has (gpus.py), the receiving end's side of claiming and queueing
(session.py), and the waiting of a `launch --detach --wait` with nobody at the controller (waiter.py)."""
