"""The pacing of connections to one sshd (transport/pacing.py Gate): never more in flight than the limit, and a
connection turned away lowers the limit below what was in flight then."""

import threading
import time

from clusterrun.transport.pacing import Gate, gate


def test_no_more_than_the_limit_are_in_flight_at_once():
    door = Gate(limit=3)
    peak, lock = [0], threading.Lock()

    def one():
        with door:
            with lock:
                peak[0] = max(peak[0], door.active)
            time.sleep(0.02)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert peak[0] == 3 and door.active == 0


def test_a_connection_turned_away_lowers_the_limit_below_what_was_in_flight():
    door = Gate(limit=8)
    for _ in range(5):
        door.__enter__()
    door.dropped()  # sshd let fewer than 5 in: 4 from now on
    assert door.limit == 4
    door.dropped()
    door.dropped()
    door.dropped()
    door.dropped()
    assert door.limit == 1  # never below one
    for _ in range(5):
        door.__exit__(None, None, None)
    assert door.active == 0


def test_one_gate_per_sshd_in_a_process():
    assert gate("198.18.0.1", 22) is gate("198.18.0.1", 22)
    assert gate("198.18.0.1", 22) is not gate("198.18.0.1", 2222)
