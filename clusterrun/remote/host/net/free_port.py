"""`free-port`: a TCP port that is free on this host (master: {port: auto} on a restart's new rank 0)."""

from ..wire import reply
from . import free_port


def cmd_free_port():
    reply({"port": free_port()})
    return 0
