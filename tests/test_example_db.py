"""A shared example database: a failure one shard finds replays from it in another process.

The redis test starts a real `redis-server` (Debian's package; CI installs it) on a free port, never
a mock. Without the server or the client it skips locally and fails in CI (CI=true), so CI cannot
pass without running it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from harness.errors import InvalidArgument
from harness.example_db import ScopedDatabase, check_shared

MUTANT = ["run", "--device", "cpu", "--mutant", "scheduler_no_wait", "--profile", "dev", "--seed", "5",
          "--examples", "60", "-q"]
# Host A's shard: every seed case finds this mutant, and hypothesis stores no failure of an explicit
# example, so host A draws without the seeds (run_campaign's `seeds=False`) to store one.
FIND_AND_STORE = """
import json, sys
from harness.campaign import run_campaign
from harness.mutants.corpus import mutant_target
from harness.sharding import Shard
from harness.targets import TargetSpec
result = run_campaign(mutant_target("scheduler_no_wait"), target_spec=TargetSpec(mutant="scheduler_no_wait"), profile="dev",
                      seed=5, examples=60, seeds=False, shard=Shard(1, 2), shared_databases=[sys.argv[1]])
print(json.dumps(result.summary()))
"""


def harness(*args):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=600)


def find_and_store(database: str) -> dict:
    """Host A: a shard that finds the failure and stores it in `database`; its summary."""
    done = subprocess.run([sys.executable, "-c", FIND_AND_STORE, database], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["findings"], "host A found nothing to store"
    return summary


def _missing(what: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what}: CI must run the shared-database test (.ci/run installs it)", pytrace=False)
    pytest.skip(f"{what} (apt-get install -y redis-server; pip install -e '.[redis]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    server = shutil.which("redis-server")
    if server is None:
        _missing("no redis-server on PATH")
    try:
        import redis
    except ImportError:
        _missing("the redis client is not installed")
    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        for _ in range(100):  # the server accepts connections within moments of starting
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                assert proc.poll() is None, "redis-server exited at start"
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def replayed(folder: Path) -> dict:
    return json.loads((folder / "replay-summary.json").read_text())


def test_a_failure_found_by_one_shard_replays_from_redis_in_another_process(tmp_path, redis_url):
    first = find_and_store(redis_url)
    replay = harness(*MUTANT, "--shard", "2/2", "--from-db", "--example-db", redis_url, "--report-dir",
                     str(tmp_path / "host-b"))
    assert replay.returncode == 1, replay.stdout + replay.stderr
    again = replayed(tmp_path / "host-b")
    assert again["replayed_from_db"] == 1 and again["first_detection"]["examples"] == 1
    assert again["findings"][0]["case"] == first["findings"][0]["case"]


def test_a_shared_directory_database_replays_a_failure_in_another_process(tmp_path):
    shared = str(tmp_path / "shared-db")
    first = find_and_store(shared)
    replay = harness(*MUTANT, "--from-db", "--example-db", shared, "--report-dir", str(tmp_path / "b"))
    assert replay.returncode == 1, replay.stdout + replay.stderr
    again = replayed(tmp_path / "b")
    assert again["replayed_from_db"] == 1 and again["first_detection"]["examples"] == 1
    assert again["findings"][0]["case"] == first["findings"][0]["case"]


def test_another_campaign_does_not_replay_or_delete_the_failure(tmp_path):
    """The database keys are scoped by target, mutant, semantics and device."""
    shared = tmp_path / "shared-db"
    find_and_store(str(shared))
    stored = sorted(p.name for p in shared.rglob("*") if p.is_file())
    clean = harness("run", "--device", "cpu", "--profile", "dev", "--seed", "5", "--examples", "5", "-q", "--from-db",
                    "--example-db", str(shared), "--report-dir", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert replayed(tmp_path / "clean")["replayed_from_db"] == 0
    assert sorted(p.name for p in shared.rglob("*") if p.is_file()) == stored


@pytest.mark.parametrize("spec, needle", [
    ("redis://host", "redis://HOST:PORT"), ("redis://:6379", "redis://HOST:PORT"),
    ("redis://h:6379/x", "DB a number"), ("s3://bucket", "no other scheme"),
])
def test_a_malformed_database_is_refused(spec, needle):
    with pytest.raises(InvalidArgument, match=needle):
        check_shared(spec, "--example-db")


def test_the_ci_profile_keeps_no_database_so_example_db_is_refused(tmp_path, capsys):
    from harness.cli import main

    assert main(["run", "--device", "cpu", "--example-db", str(tmp_path), "--report-dir", str(tmp_path / "r")]) == 2
    assert "--example-db: the 'ci' profile is derandomized" in capsys.readouterr().err


def _failing_test(db, seen: list):
    """A hypothesis test that fails on any integer over 10, its database `db`."""
    @settings(database=db, max_examples=50, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 100))
    def test(n):
        seen.append(n)
        assert n <= 10

    return test


def test_a_scoped_database_keeps_each_scope_s_failures_apart(tmp_path):
    """The public replacement of `_hypothesis_internal_add_digest`: one test function, two scopes over one
    directory; the failure stored under one scope replays there first and is never seen by the other."""
    shared = DirectoryBasedExampleDatabase(str(tmp_path))
    with pytest.raises(AssertionError):
        _failing_test(ScopedDatabase(shared, b"mutant=a;"), [])()
    stored = {key.name for key in tmp_path.iterdir()}
    assert stored, "the failure was not stored"
    replayed: list = []
    with pytest.raises(AssertionError):
        _failing_test(ScopedDatabase(shared, b"mutant=a;"), replayed)()
    assert replayed[0] > 10  # the stored failure, replayed before any draw
    unscoped = InMemoryExampleDatabase()
    scoped = ScopedDatabase(unscoped, b"mutant=b;")
    scoped.save(b"key", b"value")
    scoped.move(b"key", b"other", b"value")
    assert list(unscoped.fetch(b"mutant=b;other")) == [b"value"] and not list(unscoped.fetch(b"other"))
    assert list(scoped.fetch(b"other")) == [b"value"] and not list(ScopedDatabase(unscoped, b"mutant=a;").fetch(b"other"))
    scoped.delete(b"other", b"value")
    assert not list(unscoped.fetch(b"mutant=b;other"))


def test_a_seed_under_settings_keeps_the_database(tmp_path):
    """The public replacement of `_hypothesis_internal_use_seed` (`campaign._seeded`): `@seed(n)` applied
    beneath `@settings(database=...)` fixes the stream and keeps the database, which `@seed` on top turns off."""
    def seeded(db, seen, *, fails=False):
        @settings(database=db, max_examples=20, suppress_health_check=list(HealthCheck))
        @seed(5)
        @given(st.integers(0, 10**6))
        def test(n):
            seen.append(n)
            assert not fails

        return test

    first, second = [], []
    seeded(DirectoryBasedExampleDatabase(str(tmp_path / "a")), first)()
    seeded(None, second)()
    assert first == second and len(first) == 20
    with pytest.raises(AssertionError):
        seeded(DirectoryBasedExampleDatabase(str(tmp_path / "b")), [], fails=True)()
    assert any((tmp_path / "b").iterdir()), "the seeded test stored no failure: the database was turned off"
