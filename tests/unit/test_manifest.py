"""What gets pushed: .gitignore-style excludes, symlinks that stay inside, cached content hashes."""

import hashlib
import os

import pytest

from clusterrun.errors import UsageError
from clusterrun.config.inventory import DEFAULT_EXCLUDES, Job
from clusterrun.hosts.manifest import Excludes, HashCache, build_manifest


@pytest.mark.parametrize("patterns, path, is_dir, excluded", [
    (["*.pyc"], "a/b/c.pyc", False, True),
    (["*.pyc"], "a/b/c.py", False, False),
    (["build/"], "build", True, True),
    (["build/"], "build", False, False),  # dir-only pattern leaves a file of that name
    (["build/"], "src/build", True, True),
    (["/build"], "src/build", True, False),  # anchored to the root
    (["/build"], "build", True, True),
    (["docs/*.md"], "docs/a.md", False, True),
    (["docs/*.md"], "docs/sub/a.md", False, False),  # * does not cross /
    (["docs/**/*.md"], "docs/sub/deep/a.md", False, True),
    (["**/cache"], "x/y/cache", True, True),
    (["logs/**"], "logs/a/b.txt", False, True),
    (["*.log", "!keep.log"], "keep.log", False, False),  # last match wins
    (["*.log", "!keep.log"], "other.log", False, True),
    (["data?.bin"], "data1.bin", False, True),
    (["data[0-2].bin"], "data3.bin", False, False),
    (["# comment", ""], "x", False, False),
])
def test_excludes_follow_gitignore(patterns, path, is_dir, excluded):
    assert Excludes(patterns).excluded(path, is_dir) is excluded


def job(root, script="train.py", sync=(), exclude=()):
    return Job(root=str(root), script=script, args=(), sync=tuple(sync), exclude=DEFAULT_EXCLUDES + tuple(exclude),
               init_method="env", backend="gloo", timeout_s=60, time_limit_s=None, shared_dir=None)


def test_manifest_walks_sync_paths_applies_excludes_and_hashes(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "big.ckpt").write_bytes(b"x" * 10)
    (tmp_path / "pkg" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "pkg" / "run.sh", 0o755)
    os.symlink("mod.py", tmp_path / "pkg" / "alias.py")
    m = build_manifest(job(tmp_path, sync=["pkg/"], exclude=["*.ckpt"]), HashCache(None))
    assert [f.rel for f in m.files] == ["pkg/mod.py", "pkg/run.sh", "train.py"]
    assert m.symlinks == (("pkg/alias.py", "mod.py"),)
    assert m.dirs == ("pkg",)
    mod = m.files[0]
    assert mod.sha == hashlib.sha256(b"x = 1\n").hexdigest() and mod.size == 6 and not mod.executable
    assert m.files[1].executable


def test_symlink_out_of_the_project_is_refused(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "pkg").mkdir()
    os.symlink("/etc/passwd", tmp_path / "pkg" / "passwd")
    with pytest.raises(UsageError, match="outside the job root"):
        build_manifest(job(tmp_path, sync=["pkg"]), HashCache(None))


def test_identical_content_is_one_object(tmp_path):
    (tmp_path / "train.py").write_text("same\n")
    (tmp_path / "copy.py").write_text("same\n")
    m = build_manifest(job(tmp_path, sync=["copy.py"]), HashCache(None))
    assert len(m.files) == 2 and len(m.objects()) == 1


def test_hash_cache_skips_rehashing_unchanged_files(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("v1\n")
    cache_file = tmp_path / "hashes.json"
    build_manifest(job(tmp_path), HashCache(str(cache_file)))
    assert oct(os.stat(cache_file).st_mode & 0o777) == "0o600"
    opened = []
    real_open = open

    def spy(path, *a, **kw):
        opened.append(str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", spy)
    cache = HashCache(str(cache_file))
    build_manifest(job(tmp_path), cache)
    assert str(tmp_path / "train.py") not in opened
    monkeypatch.undo()
    (tmp_path / "train.py").write_text("v2 changed\n")
    m = build_manifest(job(tmp_path), HashCache(str(cache_file)))
    assert m.files[0].sha == hashlib.sha256(b"v2 changed\n").hexdigest()
