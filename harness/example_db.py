"""Where a campaign keeps the failures it found, so that they replay: locally and shared between hosts.

Hypothesis's own databases do the work. The report folder's `examples/` is a
`DirectoryBasedExampleDatabase`; `--example-db DIR` adds another directory (a shared file system),
`--example-db redis://HOST:PORT[/DB]` a `RedisExampleDatabase` (the `redis` extra). Several are
combined with `MultiplexedDatabase`: a failure is saved into every one and read from any, so a
failure that one host found replays on every host that points at the same database (`--from-db`).

Hypothesis files examples under a key derived from the test function's source. Every campaign
shares that function, so the key is scoped here by what the stored choices mean: the target, the
mutant, the semantics and the device (the CPU draws a schedule, CUDA does not). Without the scope a
clean campaign would replay a mutant's failure, see it pass, and delete it for every host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence
from urllib.parse import urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, MultiplexedDatabase

from harness.errors import EnvironmentBroken, InvalidArgument

REDIS_SCHEME = "redis://"


def database_scope(*, target_spec: str, mutant: Optional[str], semantics: str, device: str) -> bytes:
    return f"target={target_spec};mutant={mutant or ''};semantics={semantics};device={device}".encode()


class ScopedDatabase(ExampleDatabase):
    """`db` with every key under `scope`: the campaigns that share one test function keep their failures
    apart through Hypothesis's public database interface, where a private attribute of the test function
    (`_hypothesis_internal_add_digest`) did it before. Every key Hypothesis derives (its secondary and
    pareto keys among them) is prefixed alike, so nothing stored leaks between scopes."""

    def __init__(self, db: ExampleDatabase, scope: bytes) -> None:
        super().__init__()
        self.db, self.scope = db, scope

    def __repr__(self) -> str:
        return f"ScopedDatabase({self.db!r}, {self.scope!r})"

    def save(self, key: bytes, value: bytes) -> None:
        self.db.save(self.scope + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.db.fetch(self.scope + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.db.delete(self.scope + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.db.move(self.scope + src, self.scope + dest, value)


def check_shared(spec: str, name: str) -> str:
    """A shared database spec, refused before any work when malformed, naming it as the caller knows it
    (`name`: the flag that gave it, --example-db on the command line)."""
    if spec.startswith(REDIS_SCHEME):
        parts = urlsplit(spec)
        try:
            port = parts.port
        except ValueError:
            port = None
        db = parts.path.strip("/")
        if not parts.hostname or port is None or (db and not db.isdigit()):
            raise InvalidArgument(f"{name}={spec!r}: redis://HOST:PORT or redis://HOST:PORT/DB (DB a number)")
        return spec
    if "://" in spec:
        raise InvalidArgument(f"{name}={spec!r}: a directory or redis://HOST:PORT; no other scheme is known")
    path = Path(spec)
    if path.exists() and not path.is_dir():
        raise InvalidArgument(f"{name}={spec!r}: exists and is not a directory")
    return spec


def _redis(spec: str) -> ExampleDatabase:
    try:  # the `redis` extra: only a run that names a redis server needs it
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as exc:
        raise EnvironmentBroken(f"--example-db={spec}: the redis client is not installed ({exc}); "
                                "pip install -e '.[redis]'") from None
    parts = urlsplit(spec)
    client = redis.Redis(host=parts.hostname, port=parts.port, db=int(parts.path.strip("/") or 0))
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise EnvironmentBroken(f"--example-db={spec}: the redis server does not answer ({exc})") from None
    return RedisExampleDatabase(client)


def open_database(local_dir: Optional[Path], shared: Sequence[str]) -> Optional[ExampleDatabase]:
    """The local directory's database combined with every shared one; None when there is none."""
    databases = [DirectoryBasedExampleDatabase(str(local_dir))] if local_dir is not None else []
    for spec in shared:
        databases.append(_redis(spec) if spec.startswith(REDIS_SCHEME) else DirectoryBasedExampleDatabase(spec))
    if not databases:
        return None
    return databases[0] if len(databases) == 1 else MultiplexedDatabase(*databases)
