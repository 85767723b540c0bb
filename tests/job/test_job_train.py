"""The example job as real processes: two gloo ranks on this machine's CPU."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import make_data  # noqa: E402  (conftest puts train_job/ on the path)
from convnet import ConvNet  # noqa: E402
from jobproc import RankRun, job_env, run_ranks, train_cmd  # noqa: E402
from support import free_port  # noqa: E402
from train import state_digest  # noqa: E402

pytestmark = pytest.mark.job

# 2,000 samples over 2 ranks at 64 per rank: 16 steps an epoch.
SHORT = ["--data-size", "2000", "--batch-size", "64", "--log-every", "5"]
_DIGEST = re.compile(r"^params sha256=([0-9a-f]{64})$", re.M)
_PROGRESS = re.compile(r"^\[rank (\d)\] epoch 1 step 5/16 loss \d+\.\d{4} acc [01]\.\d{3}$", re.M)


def _by_hand(workdir: Path, data: Path, url: str, *args: str) -> list[RankRun]:
    """Two ranks started the tutorials' way: --rank/--world-size/--dist-url, no launcher env."""
    return run_ranks([(train_cmd("--rank", str(rank), "--world-size", "2", "--dist-url", url,
                                 "--data-dir", str(data), "--out", "out", *args), job_env())
                      for rank in range(2)], workdir)


def _assert_ranks_agree(runs: list[RankRun], out: Path, world_size: int = 2) -> str:
    """Every rank exited 0 and ended with the same parameters; returns their digest."""
    for run in runs:
        assert run.returncode == 0, run.describe()
    printed = _DIGEST.findall("".join(run.stdout for run in runs))
    assert len(printed) == world_size, printed
    files = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world_size)]
    assert [f["rank"] for f in files] == list(range(world_size))
    assert {f["params_sha256"] for f in files} == set(printed)
    assert len(set(printed)) == 1, f"ranks ended with different parameters: {printed}"
    # The digest covers exactly what rank 0 saved.
    model = ConvNet()
    model.load_state_dict(torch.load(out / "checkpoint.pt", weights_only=True)["model"])
    assert state_digest(model) == printed[0]
    return printed[0]


def _trained(tmp_path_factory: pytest.TempPathFactory, digits: Path, sync: str) -> Path:
    workdir = tmp_path_factory.mktemp(f"tcp-{sync}")
    runs = _by_hand(workdir, digits, f"tcp://127.0.0.1:{free_port()}", "--epochs", "2",
                    "--sync", sync, *SHORT)
    _assert_ranks_agree(runs, workdir / "out")
    return workdir


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, digits: Path) -> Path:
    return _trained(tmp_path_factory, digits, "ddp")


@pytest.fixture(scope="module")
def allreduce_run(tmp_path_factory: pytest.TempPathFactory, digits: Path) -> Path:
    return _trained(tmp_path_factory, digits, "allreduce")


def test_tcp_ranks_train_and_agree(ddp_run: Path) -> None:
    metrics = json.loads((ddp_run / "out" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["backend"] == "gloo"
    assert metrics["init_method"].startswith("tcp://127.0.0.1:")
    assert (metrics["sync"], metrics["batch_size_per_rank"], metrics["epochs"]) == ("ddp", 64, 2)
    assert metrics["data"]["train_samples"] == 2000 and metrics["data"]["test_samples"] == 1000
    assert metrics["data"]["source"].startswith("synthetic digits")
    assert len(metrics["epoch_wall_s"]) == 2 and metrics["samples_per_s"] > 0
    assert math.isfinite(metrics["final_train_loss"])
    stdout = "".join((ddp_run / "logs" / f"{r}.out").read_text() for r in range(2))
    assert sorted(_PROGRESS.findall(stdout)) == ["0", "1"]


def test_heldout_accuracy_far_above_chance(ddp_run: Path) -> None:
    """2 ranks, 2 epochs over 2,000 generated samples (32 steps), 1,000 held out: 0.965.

    Measured with torch 2.14.1 (torchvision reader) and 2.13.0 (IDX reader) alike. Chance is
    0.10; the bar of 0.90 leaves room for other builds' numerics.
    """
    metrics = json.loads((ddp_run / "out" / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.90, metrics
    ranks = [json.loads((ddp_run / "out" / f"rank-{r}.json").read_text()) for r in range(2)]
    # The sharded evaluation covers each of the 1,000 held-out samples once.
    assert sum(r["test_samples"] for r in ranks) == 1000
    assert sum(r["test_correct"] for r in ranks) / 1000 == metrics["test_accuracy"]


def test_ddp_and_allreduce_end_identical(ddp_run: Path, allreduce_run: Path) -> None:
    """Same seed, data and steps: DDP and the tutorials' average_gradients give equal bits.

    Tolerance: none (torch.equal). With two ranks both averages are exact: DDP divides each
    gradient by 2 before the sum and average_gradients after it, and halving only changes the
    exponent; a sum of two addends does not depend on order, however gloo buckets it; and one
    thread per rank keeps every CPU kernel deterministic. Rank 0's BatchNorm statistics are fed
    by its own batches alone in both modes, so buffers match too. For world sizes that are not
    powers of two, a tolerance of a few ulps per step would be needed instead.
    """
    ddp = torch.load(ddp_run / "out" / "checkpoint.pt", weights_only=True)
    allreduce = torch.load(allreduce_run / "out" / "checkpoint.pt", weights_only=True)
    assert ddp["model"].keys() == allreduce["model"].keys()
    for name, tensor in ddp["model"].items():
        assert torch.equal(tensor, allreduce["model"][name]), name
    assert ddp["params_sha256"] == allreduce["params_sha256"]


def test_file_init_with_data_generated_by_both_ranks(tmp_path: Path) -> None:
    """file:// rendezvous; --synthetic into one empty dir: one rank writes, the other waits."""
    init_file = tmp_path / "shared" / "rendezvous.init"
    init_file.parent.mkdir()
    runs = _by_hand(tmp_path, tmp_path / "data", init_file.as_uri(), "--synthetic",
                    "--epochs", "1", *SHORT)
    _assert_ranks_agree(runs, tmp_path / "out")
    generated = [run for run in runs if "generated synthetic digits" in run.stdout]
    assert len(generated) == 1
    raw = make_data.raw_dir(tmp_path / "data")
    images, labels = make_data.generate(make_data.DEFAULT_TRAIN, make_data.DEFAULT_SEED, 0)
    assert (raw / "train-images-idx3-ubyte").read_bytes() == make_data.idx_bytes(images)
    assert (raw / "train-labels-idx1-ubyte").read_bytes() == make_data.idx_bytes(labels)


def test_env_init_as_clusterrun_starts_it(tmp_path: Path, digits: Path) -> None:
    """clusterrun's contract: cwd is the job folder, --rank/--world-size plus its environment."""
    (tmp_path / "data").symlink_to(digits, target_is_directory=True)
    port = str(free_port())
    specs = []
    for rank in range(2):
        env = job_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE="2", GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port, CLUSTERRUN_RUN_ID="20261130-000000-test",
                      CLUSTERRUN_DIST_URL="env://", CLUSTERRUN_DIST_BACKEND="gloo",
                      CLUSTERRUN_TIMEOUT="60")
        specs.append((train_cmd("--rank", str(rank), "--world-size", "2", "--epochs", "1",
                                *SHORT), env))
    _assert_ranks_agree(run_ranks(specs, tmp_path), tmp_path / "out")
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (metrics["init_method"], metrics["backend"]) == ("env://", "gloo")


def test_torchrun_environment_alone(tmp_path: Path, digits: Path) -> None:
    argv = [train_cmd()[0], "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", str(free_port()), train_cmd()[1], "--data-dir", str(digits),
            "--epochs", "1", *SHORT]
    [run] = run_ranks([(argv, job_env())], tmp_path)
    _assert_ranks_agree([run], tmp_path / "out")
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["init_method"] == "env://"


def last_line(stderr: str) -> str:
    """The job's own last line: torch's C++ logging (`[W1202 00:50:16.127 socket.cpp:494] ...`) may still
    print from a destructor after it, at the interpreter's exit."""
    lines = [line for line in stderr.strip().splitlines() if not re.match(r"\[[IWE]\d{4} ", line)]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("scheme", ["tcp", "file"])
def test_world_size_mismatch_fails_within_timeout(tmp_path: Path, digits: Path,
                                                  scheme: str) -> None:
    """Two ranks of an announced three: both end at the 5 s timeout, saying why."""
    url = (f"tcp://127.0.0.1:{free_port()}" if scheme == "tcp"
           else (tmp_path / "rendezvous.init").as_uri())
    runs = run_ranks([(train_cmd("--rank", str(rank), "--world-size", "3", "--dist-url", url,
                                 "--timeout", "5", "--data-dir", str(digits), *SHORT), job_env())
                      for rank in range(2)], tmp_path, timeout=60)
    for run in runs:
        assert run.returncode == 3, run.describe()
        last = last_line(run.stderr)
        assert re.match(r"\[rank \d\] error: ", last), last
        assert "world size 3" in last and "5s timeout" in last, last
        assert "Traceback" not in run.stderr
        assert run.after_rendezvous_start_s is not None
        assert run.after_rendezvous_start_s < 5 + 1.5, run.describe()


def test_unreachable_master_names_it_within_timeout(tmp_path: Path, digits: Path) -> None:
    """A rank whose master never comes: torch alone would retry to about twice the timeout."""
    port = free_port()
    [run] = run_ranks([(train_cmd("--rank", "1", "--world-size", "2", "--timeout", "4",
                                  "--dist-url", f"tcp://127.0.0.1:{port}",
                                  "--data-dir", str(digits)), job_env())], tmp_path, timeout=60)
    assert run.returncode == 3, run.describe()
    last = last_line(run.stderr)
    assert last.startswith("[rank 1] error: cannot reach the master at "
                           f"127.0.0.1:{port} within the 4s timeout"), last
    assert "Traceback" not in run.stderr
    assert run.after_rendezvous_start_s is not None
    assert run.after_rendezvous_start_s < 4 + 1.5, run.describe()


def test_missing_data_dir_fails_before_rendezvous(tmp_path: Path) -> None:
    """No data: exit 2 at once (a rendezvous would wait the 10 min timeout for rank 1)."""
    missing = tmp_path / "no-such-data"
    [run] = run_ranks([(train_cmd("--rank", "0", "--world-size", "2", "--timeout", "10m",
                                  "--dist-url", f"tcp://127.0.0.1:{free_port()}",
                                  "--data-dir", str(missing)), job_env())],
                      tmp_path, timeout=30)
    assert run.returncode == 2, run.describe()
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"[rank 0] error: no MNIST data in {missing}/MNIST/raw "), line
    assert "train_job/make_data.py --out" in line and "--synthetic" in line
    assert run.after_rendezvous_start_s is None  # it never got as far
