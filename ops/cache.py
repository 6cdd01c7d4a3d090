"""Where tinyzoo keeps what it makes (converted and synthetic models, file hashes, the CPU thread pool, captured JITs):
one cache directory, ~/.cache/tinyzoo unless TINYZOO_CACHE names another; and how a file is written whole or not at all."""
import os
import tempfile
from pathlib import Path

def cache_dir() -> Path:
  return Path(os.environ.get("TINYZOO_CACHE", Path.home() / ".cache" / "tinyzoo"))

def write_whole(path: Path, data: bytes | str) -> None:
  """Writes `data` to `path` through a temporary file beside it, renamed into place once on disk: a reader (another run
  at the same time too) finds the old file or the new one whole; an interrupted write leaves neither part nor temp."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as out:
      out.write(data.encode() if isinstance(data, str) else data)
      out.flush()
      os.fsync(out.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp): os.unlink(tmp)
