"""Flags versus launcher environment, error wording, the model and the parameter digest."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import distsetup  # noqa: E402  (conftest puts train_job/ on the path)
from convnet import ConvNet  # noqa: E402
from distsetup import UsageError, parse_config, parse_duration  # noqa: E402
from train import state_digest  # noqa: E402

pytestmark = pytest.mark.job

CLUSTERRUN_ENV = {
    "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
    "CLUSTERRUN_DIST_URL": "tcp://10.0.0.1:29401", "CLUSTERRUN_DIST_BACKEND": "gloo",
    "CLUSTERRUN_TIMEOUT": "42", "CLUSTERRUN_RUN_ID": "20261130-142233-a1b2",
}


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("30m", 1800),
                                           ("1.5h", 5400), (" 2 m ", 120)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "ten", "5d", "m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_clusterrun_environment_fills_every_default() -> None:
    cfg = parse_config([], CLUSTERRUN_ENV)
    assert (cfg.rank, cfg.world_size, cfg.local_rank) == (3, 4, 1)
    assert (cfg.dist_url, cfg.master) == ("tcp://10.0.0.1:29401", "10.0.0.1:29401")
    assert (cfg.dist_backend, cfg.timeout_s) == ("gloo", 42)
    assert (cfg.data_dir, cfg.out, cfg.sync) == (Path("data"), Path("out"), "ddp")


def test_flags_win_over_the_environment() -> None:
    cfg = parse_config(["--rank", "0", "--world-size", "2", "--dist-url", "env://",
                        "--timeout", "5m", "--dist-backend", "gloo"], CLUSTERRUN_ENV)
    assert (cfg.rank, cfg.world_size, cfg.timeout_s) == (0, 2, 300)
    assert (cfg.dist_url, cfg.master) == ("env://", "10.0.0.1:29400")


def test_torchrun_environment_means_env_init() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    cfg = parse_config([], env)
    assert (cfg.rank, cfg.world_size, cfg.dist_url) == (1, 2, "env://")
    assert cfg.timeout_s == distsetup.DEFAULT_TIMEOUT_S


def test_by_hand_defaults() -> None:
    lone = parse_config([], {})
    assert (lone.rank, lone.world_size, lone.local_rank) == (0, 1, None)
    assert lone.dist_url.startswith("tcp://127.0.0.1:")  # a free port: nobody else must agree
    pair = parse_config(["--rank", "1", "--world-size", "2"], {})
    assert pair.dist_url == "tcp://127.0.0.1:29500"


@pytest.mark.parametrize("argv, env, says", [
    (["--rank", "2", "--world-size", "2"], {}, "outside world size 2"),
    (["--world-size", "0"], {}, "outside world size 0"),
    ([], {"RANK": "one"}, "$RANK is 'one'"),
    (["--dist-url", "env://"], {}, "$MASTER_ADDR and $MASTER_PORT"),
    (["--dist-url", "tcp://host"], {}, "needs HOST:PORT"),
    (["--dist-url", "http://host:80"], {}, "use tcp://HOST:PORT"),
    ([], {"CLUSTERRUN_DIST_BACKEND": "mpi"}, "backend 'mpi'"),
    ([], {"CLUSTERRUN_TIMEOUT": "soon"}, "$CLUSTERRUN_TIMEOUT"),
    (["--epochs", "0"], {}, "--epochs must be at least 1"),
])
def test_usage_errors(argv: list[str], env: dict[str, str], says: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_config(argv, env)
    assert says in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_nccl_without_cuda_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="nccl needs CUDA"):
        parse_config(["--dist-backend", "nccl"], {})


def _cfg(**changes) -> distsetup.JobConfig:
    base = parse_config(["--rank", "1", "--world-size", "3", "--timeout", "10",
                         "--dist-url", "tcp://10.1.2.3:2950"], {})
    return dataclasses.replace(base, **changes)


def test_rendezvous_messages_lead_with_the_likely_cause() -> None:
    refused = torch.distributed.DistNetworkError("The client socket has timed out after 10000ms")
    unreachable = distsetup.rendezvous_failure(_cfg(), "store", refused)
    assert unreachable.startswith("cannot reach the master at 10.1.2.3:2950 within the 10s")

    in_use = torch.distributed.DistNetworkError("address already in use")
    assert distsetup.rendezvous_failure(_cfg(rank=0), "store", in_use).startswith(
        "rank 0 cannot serve the rendezvous at 10.1.2.3:2950")

    for cfg, phase in ((_cfg(rank=0), "store"), (_cfg(), "group")):
        missing = distsetup.rendezvous_failure(cfg, phase, None)
        assert missing.startswith("not all ranks joined within the 10s timeout: "
                                  "expected world size 3 at tcp://10.1.2.3:2950")

    gone = RuntimeError("Failed to recv, got 0 bytes. Connection was likely closed.")
    assert "went away before all ranks joined (expected world size 3, 10s timeout)" in (
        distsetup.rendezvous_failure(_cfg(), "group", gone))
    file_cfg = _cfg(dist_url="file:///shared/x.init", master=None)
    assert distsetup.rendezvous_failure(file_cfg, "group", RuntimeError("Wait timeout")) == (
        "not all ranks joined within the 10s timeout: expected world size 3 at "
        "file:///shared/x.init; was every rank started, each with --world-size 3? "
        "[Wait timeout]")


def test_convnet_is_the_tutorials() -> None:
    model = ConvNet()
    assert model(torch.zeros(4, 1, 28, 28)).shape == (4, 10)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["layer1.0.weight"] == (16, 1, 5, 5)
    assert shapes["layer2.0.weight"] == (32, 16, 5, 5)
    assert shapes["fc.weight"] == (10, 7 * 7 * 32)
    assert sum(p.numel() for p in model.parameters()) == 29_034


def test_state_digest_covers_every_parameter_bit_and_buffer() -> None:
    torch.manual_seed(0)
    a = ConvNet()
    torch.manual_seed(0)
    b = ConvNet()
    assert state_digest(a) == state_digest(b)
    with torch.no_grad():
        b.fc.bias[3] = torch.nextafter(b.fc.bias[3], torch.tensor(1.0))
    assert state_digest(a) != state_digest(b)
    b.load_state_dict(a.state_dict())
    b.layer1[1].running_mean += 1e-3  # a buffer: part of what a checkpoint restores
    assert state_digest(a) != state_digest(b)
